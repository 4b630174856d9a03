//! Who listens on a local TCP port, for the "address in use" error of `weir run`: the
//! listening socket's inode from `/proc/net/tcp` and `/proc/net/tcp6`, then the process that
//! holds that socket among `/proc/<pid>/fd`. Linux only; elsewhere, or when the owner is
//! another user's process (its descriptors are unreadable), nothing is found and the caller
//! says how to look by hand.
//!
//! It only reads `/proc`, never connects to the port: talking to whatever holds it is exactly
//! what must not happen.

use std::path::Path;

/// A process listening on a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortOwner {
    /// Its process id.
    pub pid: u32,
    /// Its command line (or, when unreadable, its command name), shortened.
    pub command: String,
}

/// The longest command line shown.
const COMMAND_CHARS: usize = 120;

/// The process listening on TCP `port` (any local address), when `/proc` tells.
pub fn listening_owner(port: u16) -> Option<PortOwner> {
    owner_in(Path::new("/proc"), port)
}

/// A human description of who listens on `port`: `process 1234 (weir run p.yaml)`, or how
/// to find out.
pub fn describe(port: u16) -> String {
    match listening_owner(port) {
        Some(o) => format!("process {} (`{}`)", o.pid, o.command),
        None => format!(
            "another process (see which with `ss -ltnp 'sport = :{port}'` or `lsof -nP \
             -iTCP:{port} -sTCP:LISTEN`)"
        ),
    }
}

fn owner_in(proc_root: &Path, port: u16) -> Option<PortOwner> {
    let mut inodes = Vec::new();
    for table in ["net/tcp", "net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(proc_root.join(table)) {
            inodes.extend(listening_inodes(&text, port));
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir(proc_root).ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .ok()
                .and_then(|t| t.to_str().map(|t| wanted.iter().any(|w| w == t)))
                .unwrap_or(false)
        });
        if holds {
            return Some(PortOwner {
                pid,
                command: command_of(&entry.path()),
            });
        }
    }
    None
}

/// The inodes of the sockets listening on `port` in one `/proc/net/tcp*` table.
fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = fields.get(1)?;
            let state = fields.get(3)?;
            let inode = fields.get(9)?.parse::<u64>().ok()?;
            let (_, hex_port) = local.rsplit_once(':')?;
            let p = u16::from_str_radix(hex_port, 16).ok()?;
            (p == port && *state == LISTEN && inode != 0).then_some(inode)
        })
        .collect()
}

fn command_of(process: &Path) -> String {
    let cmdline = std::fs::read(process.join("cmdline")).unwrap_or_default();
    let mut text: String = cmdline
        .split(|b| *b == 0)
        .filter(|part| !part.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    if text.is_empty() {
        text = std::fs::read_to_string(process.join("comm"))
            .map(|c| c.trim().to_owned())
            .unwrap_or_else(|_| "unknown command".to_owned());
    }
    // One line, whatever the arguments hold.
    text = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().count() > COMMAND_CHARS {
        text = text.chars().take(COMMAND_CHARS).collect::<String>() + "…";
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:21C2 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:21C2 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0000000000000000 20 4 30 10 -1
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 17 1 0000000000000000 100 0 0 10 0
garbage line
";

    #[test]
    fn only_listening_sockets_on_the_port_count() {
        assert_eq!(listening_inodes(TABLE, 8642), vec![4242]);
        assert_eq!(listening_inodes(TABLE, 22), vec![17]);
        assert!(listening_inodes(TABLE, 40000).is_empty());
        assert!(listening_inodes("", 8642).is_empty());
    }

    #[test]
    fn finds_this_process_listening() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        if !Path::new("/proc/net/tcp").exists() {
            return; // not Linux: nothing to find, and `describe` says how to look
        }
        let owner = listening_owner(port).expect("this process listens on the port");
        assert_eq!(owner.pid, std::process::id());
        assert!(!owner.command.is_empty());
        assert!(describe(port).starts_with(&format!("process {} (`", std::process::id())));
        drop(listener);
        assert!(describe(port).contains(&format!("ss -ltnp 'sport = :{port}'")));
    }
}
