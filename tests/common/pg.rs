//! PostgreSQL for the connector tests (`scripts/services/postgres.sh`): a server reached
//! through `psql`, databases of a test's own, prepared transactions left behind, and a run
//! stopped with SIGTERM once what it wrote is complete.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::common::binary::signal;
use crate::common::kill::{log_excerpt, read_log, wait_bounded};

/// Longest wait for a run to commit everything.
pub const SETTLE: Duration = Duration::from_secs(180);

/// A PostgreSQL server reached through `psql`.
pub struct Pg {
    /// `postgres://user@host:port`, without a database.
    pub base: String,
    psql: PathBuf,
}

impl Pg {
    /// The shared test server.
    pub fn shared() -> Self {
        Self::from_settings(&crate::common::services::ensure("postgres"))
    }

    /// The server `postgres.sh ensure` printed `s` for.
    pub fn from_settings(s: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| {
            s.get(k)
                .unwrap_or_else(|| panic!("postgres.sh printed no {k}: {s:?}"))
                .clone()
        };
        Self {
            base: format!(
                "postgres://{}@{}:{}",
                get("WEIR_TEST_POSTGRES_USER"),
                get("WEIR_TEST_POSTGRES_HOST"),
                get("WEIR_TEST_POSTGRES_PORT")
            ),
            psql: Path::new(&get("WEIR_TEST_POSTGRES_BIN")).join("psql"),
        }
    }

    pub fn url(&self, db: &str) -> String {
        format!("{}/{db}", self.base)
    }

    /// Runs `sql` in database `db`; returns the rows, one line each, columns joined by `|`.
    pub fn sql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(&self.psql)
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.url(db))
            .arg("-c")
            .arg(sql)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql {db}: {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The rows `query` returns in `db`, as sorted lines.
    pub fn sorted_rows(&self, db: &str, query: &str) -> Vec<String> {
        let mut rows: Vec<String> = self.sql(db, query).lines().map(str::to_owned).collect();
        rows.sort();
        rows
    }

    /// Makes an empty database `name` (dropping an old one and its prepared transactions)
    /// holding the tables `ddl` creates.
    pub fn fresh_db(&self, name: &str, ddl: &str) {
        for gid in self
            .sql(
                "postgres",
                &format!("SELECT gid FROM pg_prepared_xacts WHERE database = '{name}'"),
            )
            .lines()
        {
            // ROLLBACK PREPARED must run in the transaction's database.
            self.sql(name, &format!("ROLLBACK PREPARED '{gid}'"));
        }
        self.sql("postgres", &format!("DROP DATABASE IF EXISTS {name}"));
        self.sql("postgres", &format!("CREATE DATABASE {name}"));
        self.sql(name, ddl);
    }

    /// The prepared transactions of `db` (none should outlive a stopped run).
    pub fn prepared(&self, db: &str) -> Vec<String> {
        self.sql(
            "postgres",
            &format!("SELECT gid FROM pg_prepared_xacts WHERE database = '{db}'"),
        )
        .lines()
        .map(str::to_owned)
        .collect()
    }
    /// The exactly-once verdict of a crash test: `got` (the table after the final run) equals
    /// `expected` (the failure-free run), and no prepared transaction is left in `db`.
    /// `after` says what happened to the runs ("after 21 SIGKILLs at ..."); the run's `log` is
    /// quoted when the table differs.
    pub fn assert_exactly_once(
        &self,
        db: &str,
        got: &[String],
        expected: &[String],
        after: &str,
        log: &Path,
    ) {
        let missing: Vec<&String> = expected
            .iter()
            .filter(|r| !got.contains(r))
            .take(5)
            .collect();
        assert!(
            got == expected,
            "{after}: {} rows committed, {} expected; first missing: {missing:?}\n{}",
            got.len(),
            expected.len(),
            log_excerpt(log)
        );
        assert_eq!(
            self.prepared(db),
            Vec::<String>::new(),
            "prepared transactions left behind"
        );
    }
}

/// A database name unique to this test process.
pub fn db_name(test: &str) -> String {
    format!("weir_{test}_{}", std::process::id())
}

/// Waits until the run started and `done()` holds (checked every 50 ms), at most [`SETTLE`];
/// then stops the run with SIGTERM (a final checkpoint, committed) and returns its exit status.
pub fn settle_and_stop(
    child: &mut Child,
    log: &Path,
    what: &str,
    done: impl Fn() -> bool,
) -> ExitStatus {
    let until = Instant::now() + SETTLE;
    // SIGTERM stops a run gracefully only once it handles signals: wait for its start (the
    // table may be complete already, committed by earlier runs).
    while !done() || !read_log(log).contains("Pipeline started.") {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "{what}: the run ended with {status} before settling\n{}",
                log_excerpt(log)
            );
        }
        assert!(
            Instant::now() < until,
            "{what}: not settled within {SETTLE:?}\n{}",
            log_excerpt(log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(signal(child.id(), "TERM"));
    wait_bounded(child, SETTLE, log)
}
