// The Rust side of the services convention: what `scripts/services/<name>.sh ensure` prints
// on stdout is one `KEY=VALUE` line per setting (how to reach the service). This one parser
// of it is included (with `include!`) by every Rust user of the scripts: the engine's S3
// test helpers (`engine/src/checkpoint/s3.rs`) and the CLI tests' kit
// (`tests/common/services.rs`), which cannot share a crate.

/// The settings a service script printed on stdout: every `KEY=VALUE` line, key and value
/// trimmed; lines without `=` are ignored.
pub fn parse_service_settings(stdout: &[u8]) -> std::collections::BTreeMap<String, String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}
