//! Peak resident memory from `/proc` (`VmHWM`), of this test process or of a `weir` it
//! started. `None` where `/proc` does not tell.

/// The peak RSS in KiB of the process `pid`.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    vm_hwm_kib(&format!("/proc/{pid}/status"))
}

/// The peak RSS in KiB of this test process.
pub fn own_peak_rss_kib() -> Option<u64> {
    vm_hwm_kib("/proc/self/status")
}

fn vm_hwm_kib(status_file: &str) -> Option<u64> {
    let status = std::fs::read_to_string(status_file).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
