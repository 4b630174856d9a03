//! The `postgres` sink: each writer subtask holds one connection and writes rows into one
//! table, `INSERT` or `INSERT ... ON CONFLICT (key) DO UPDATE` (upsert), a batch of rows per
//! statement.
//!
//! With exactly-once checkpoints the sink is a two-phase-commit participant, with PostgreSQL's
//! prepared transactions (Flink's JDBC exactly-once sink does the same with XA):
//!
//! - rows go into the subtask's open transaction (`BEGIN` before the first batch);
//! - at the barrier of checkpoint `n` the transaction is prepared as
//!   `PREPARE TRANSACTION 'weir:<pipeline>:<sink>:<target>:<subtask>:<n>'` (nothing is prepared
//!   when no row came since the last barrier); the snapshot lists every prepared transaction
//!   not committed yet, with its checkpoint;
//! - when checkpoint `n` completes, every listed transaction of a checkpoint `<= n` is
//!   committed (`COMMIT PREPARED`), on a second connection of the subtask: the first one has
//!   usually begun the next checkpoint's transaction by then, inside which `COMMIT PREPARED`
//!   cannot run;
//! - a restore commits the transactions its snapshot lists (a transaction already committed is
//!   fine: it is gone from `pg_prepared_xacts`), then rolls back every other prepared
//!   transaction of the names this subtask owns (those of checkpoints that did not complete:
//!   the sources replay their records); a fresh start rolls back all of them;
//! - at the end of a bounded input everything is committed at once.
//!
//! With `upsert`, a prepared transaction keeps the rows it wrote locked until it commits, and
//! only its own subtask commits it: so while one is not committed, rows are not sent at all (a
//! statement updating a locked row would wait for a commit that its own subtask, waiting on the
//! statement, could not make). They wait for the next barrier after the commit. A barrier that
//! comes while one is still not committed (its checkpoint's completion not heard yet, or the
//! checkpoint failed) prepares nothing: the snapshot *carries* the waiting rows, with the
//! statement that writes them, and they stay queued for a later barrier. A restore writes and
//! commits the rows its snapshot carries, right after committing its prepared transactions and
//! before any new input: they belong to the restored checkpoint. At the end of a bounded input
//! the prepared transactions are committed before the last rows are sent.
//!
//! The names this subtask owns are those of its own subtask number; after a rescale to
//! parallelism `p` (snapshots as list state, old subtask `j`'s to new subtask `j % p`), new
//! subtask `s` owns every subtask number `n` with `n % p == s`, as in the file sink. On a fresh
//! start subtask 0 also owns the numbers at or beyond the parallelism. Prepared transactions
//! live in one database: the sink looks only at those of the database it is connected to.
//!
//! Transaction names are unique in the whole server, not per database, and one server often
//! holds the same pipeline several times (staging and production, tests, a copy writing into
//! another table). So a name carries `<target>`, `t` and 16 hex digits of a fixed hash of the
//! database and the table: two sinks of the same pipeline and sink ids that write into
//! different tables or databases never take each other's names, and a fresh start never rolls
//! back the transactions of a copy writing elsewhere. (Names without `<target>`, from versions
//! before it, are still this sink's to commit and roll back; as before, every copy in their
//! database takes them for its own, so upgrade the copies that share a database together.) Two running copies of one pipeline
//! into one table are one sink twice: the second one's `PREPARE` is refused with a message that
//! says so.
//!
//! Without exactly-once (`at_least_once`, or no checkpoints) each batch commits on its own and
//! the barrier flushes the rows before it; a replay writes them again, which `upsert` absorbs.
//!
//! Values go to the server as quoted text literals in a simple-query statement
//! (`standard_conforming_strings` on), so PostgreSQL converts them to each column's type:
//! strings as they are, numbers and booleans as their text, maps and arrays as JSON, `()` or a
//! missing field as `NULL`.
//!
//! The client is `tokio-postgres`, driven on a runtime of its own (one thread for the whole
//! process, [`runtime`]): operators run synchronously inside the job's runtime, which must
//! never be blocked on from within, so each request is spawned onto that runtime and the
//! operator waits for its answer on a channel, with a timeout. A server that is down or stops
//! answering is an I/O error of the subtask, never a hang; the restart strategy takes over.
//!
//! This module touches only its own table and the prepared transactions whose names start with
//! its own `weir:<pipeline>:<sink>:`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rhai::Dynamic;
use serde::{Deserialize, Serialize};
use weir_schema::{PostgresSinkSpec, PostgresWriteMode};

use crate::base::error::{Result, RunError};
use crate::base::message::Batch;
use crate::element::{Operator, OperatorContext};
use crate::record::FieldPath;

/// Longest a request may take before the subtask fails (a dead or hung server).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Rows per statement unless `batch_size` says otherwise.
pub const DEFAULT_BATCH_SIZE: usize = 1000;
/// The longest transaction name PostgreSQL accepts (GIDSIZE - 1).
const MAX_GID: usize = 199;
/// SQLSTATE `undefined_object`: `COMMIT PREPARED` of a transaction that no longer exists.
const UNDEFINED_OBJECT: &str = "42704";
/// SQLSTATE `object_not_in_prerequisite_state`: `COMMIT PREPARED` or `ROLLBACK PREPARED` of
/// a transaction another session is finishing ("is busy").
const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
/// Longest a sink waits for another session to finish a prepared transaction it also wants to
/// finish; [`REQUEST_TIMEOUT`] bounds the whole request too.
const BUSY_WAIT: Duration = Duration::from_secs(10);
/// SQLSTATE `duplicate_object`: `PREPARE TRANSACTION` under a name already prepared.
const DUPLICATE_OBJECT: &str = "42710";

/// The process-wide runtime that drives every PostgreSQL connection: one worker thread.
///
/// # Errors
/// When the runtime cannot be started (no threads left).
fn runtime() -> std::result::Result<&'static tokio::runtime::Runtime, String> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("weir-postgres")
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the PostgreSQL client's runtime: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs `fut` on the client runtime and waits for it from synchronous code (any thread, also
/// one of another runtime), at most `limit`.
fn run_blocking<T: Send + 'static>(
    limit: Duration,
    fut: impl std::future::Future<Output = std::result::Result<T, String>> + Send + 'static,
) -> std::result::Result<T, String> {
    let rt = runtime()?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let out = match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "no answer within {} s (is the server up and reachable?)",
                limit.as_secs()
            )),
        };
        let _ = tx.send(out);
    });
    match rx.recv_timeout(limit + Duration::from_secs(5)) {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} s", limit.as_secs())),
    }
}

/// Appends the statement that writes `rows` (rendered tuples): `head`, the rows separated by
/// commas, `tail`.
fn push_statement(sql: &mut String, head: &str, rows: &[String], tail: &str) {
    sql.push_str(head);
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(r);
    }
    sql.push_str(tail);
}

/// Whether the server answered `e` with SQLSTATE `code`.
fn has_code(e: &tokio_postgres::Error, code: &str) -> bool {
    e.code().is_some_and(|c| c.code() == code)
}

/// A PostgreSQL error as one line: the server's message, SQLSTATE, detail and hint, or the
/// client's error with its causes.
fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
        if let Some(d) = db.detail() {
            let _ = write!(s, "; {d}");
        }
        if let Some(h) = db.hint() {
            let _ = write!(s, "; hint: {h}");
        }
        return s;
    }
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        let _ = write!(s, ": {inner}");
        source = inner.source();
    }
    s
}

/// Quotes an identifier (`"name"`, inner quotes doubled).
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a table name, `name` or `schema.name`.
fn quote_table(table: &str) -> String {
    table.split('.').map(quote_ident).collect::<Vec<_>>().join(".")
}

/// Quotes a text literal (`'text'`, inner quotes doubled; backslashes are plain with
/// `standard_conforming_strings`).
fn push_literal(out: &mut String, text: &str) {
    out.push('\'');
    for c in text.chars() {
        if c == '\'' {
            out.push('\'');
        }
        out.push(c);
    }
    out.push('\'');
}

/// The text a value is written as; `None` for SQL `NULL`.
fn value_text(v: &Dynamic) -> Option<String> {
    if v.is_unit() {
        return None;
    }
    if let Ok(s) = v.as_immutable_string_ref() {
        return Some(s.to_string());
    }
    if let Ok(i) = v.as_int() {
        return Some(i.to_string());
    }
    if let Ok(b) = v.as_bool() {
        return Some(b.to_string());
    }
    if let Ok(f) = v.as_float() {
        return Some(f.to_string());
    }
    if v.is_map() || v.is_array() {
        return Some(serde_json::to_string(v).unwrap_or_else(|_| v.to_string()));
    }
    Some(v.to_string())
}

/// The connection string and how the sink writes, resolved from a [`PostgresSinkSpec`] at
/// build time.
#[derive(Clone, Debug)]
pub struct PostgresConfig {
    /// The parsed connection string (never printed: it may hold a password).
    connection: tokio_postgres::Config,
    /// `host:port/dbname`, for messages.
    target: String,
    /// The quoted table name.
    table: String,
    /// Quoted column names with the field each is taken from.
    columns: Vec<(String, FieldPath)>,
    /// Indexes into `columns` of the upsert key (empty: insert).
    key: Vec<usize>,
    /// The `INSERT INTO t (cols) VALUES ` head and the `ON CONFLICT ...` tail.
    head: String,
    tail: String,
    batch_size: usize,
    two_phase: bool,
    /// `weir:<pipeline>:<sink>:`, the prefix of the transaction names of this pipeline's sink
    /// of this id, whatever it writes into.
    owner_prefix: String,
    /// `weir:<pipeline>:<sink>:<target>:`, the prefix of this sink's transaction names.
    gid_prefix: String,
}

impl PostgresConfig {
    /// Resolves `spec`: reads the connection string from its environment variable and builds
    /// the statements. `two_phase`: exactly-once checkpoints.
    ///
    /// # Errors
    /// A message for the user: the variable is not set or its string does not parse, or the
    /// names are too long for transaction names.
    pub fn from_spec(
        spec: &PostgresSinkSpec,
        pipeline: &str,
        two_phase: bool,
    ) -> std::result::Result<Self, String> {
        let var = &spec.connection_env;
        let text = std::env::var(var).map_err(|_| {
            format!(
                "the environment variable `{var}` (its `connection_env`) is not set; set it to \
                 the connection string, such as `postgres://user:password@host:5432/dbname`"
            )
        })?;
        Self::with_connection(spec, pipeline, two_phase, &text)
    }

    /// [`from_spec`](Self::from_spec) with the connection string given.
    ///
    /// # Errors
    /// As [`from_spec`](Self::from_spec).
    pub fn with_connection(
        spec: &PostgresSinkSpec,
        pipeline: &str,
        two_phase: bool,
        text: &str,
    ) -> std::result::Result<Self, String> {
        let var = &spec.connection_env;
        let mut connection: tokio_postgres::Config = text.parse().map_err(|e| {
            // The error never quotes the string, which may hold a password.
            format!("the connection string in `{var}` does not parse: {e}")
        })?;
        if connection.get_connect_timeout().is_none() {
            connection.connect_timeout(CONNECT_TIMEOUT);
        }
        connection.application_name("weir");
        let target = describe_target(&connection);
        let table = quote_table(&spec.table);
        let columns: Vec<(String, FieldPath)> = spec
            .columns
            .iter()
            .map(|(c, f)| (quote_ident(c), FieldPath::new(f)))
            .collect();
        let key: Vec<usize> = match spec.mode {
            PostgresWriteMode::Insert => Vec::new(),
            PostgresWriteMode::Upsert => spec
                .key
                .iter()
                .map(|k| {
                    spec.columns
                        .get_index_of(k)
                        .ok_or_else(|| format!("key column `{k}` is not one of `columns`"))
                })
                .collect::<std::result::Result<_, _>>()?,
        };
        if spec.mode == PostgresWriteMode::Upsert && key.is_empty() {
            return Err("`upsert` needs `key`".to_owned());
        }
        let names: Vec<&str> = columns.iter().map(|(c, _)| c.as_str()).collect();
        let head = format!("INSERT INTO {table} ({}) VALUES ", names.join(", "));
        let tail = if key.is_empty() {
            String::new()
        } else {
            let keys: Vec<&str> = key.iter().map(|&i| columns[i].0.as_str()).collect();
            let rest: Vec<String> = (0..columns.len())
                .filter(|i| !key.contains(i))
                .map(|i| format!("{0} = EXCLUDED.{0}", columns[i].0))
                .collect();
            if rest.is_empty() {
                format!(" ON CONFLICT ({}) DO NOTHING", keys.join(", "))
            } else {
                format!(
                    " ON CONFLICT ({}) DO UPDATE SET {}",
                    keys.join(", "),
                    rest.join(", ")
                )
            }
        };
        let owner_prefix = format!("weir:{pipeline}:{}:", spec.id);
        let database = connection
            .get_dbname()
            .or(connection.get_user())
            .unwrap_or("postgres");
        let gid_prefix = format!("{owner_prefix}{}:", target_tag(database, &table));
        // Room for `<subtask>:<checkpoint>`.
        if gid_prefix.len() + 32 > MAX_GID {
            return Err(format!(
                "the pipeline and sink ids are too long to name prepared transactions ({} bytes; \
                 at most {} together)",
                owner_prefix.len() - 7,
                MAX_GID - 32 - 7 - TARGET_TAG_LEN - 1
            ));
        }
        Ok(Self {
            connection,
            target,
            table,
            columns,
            key,
            head,
            tail,
            batch_size: spec
                .batch_size
                .map_or(DEFAULT_BATCH_SIZE, |b| b.max(1) as usize),
            two_phase,
            owner_prefix,
            gid_prefix,
        })
    }

    /// The name of the transaction subtask `subtask` prepares at checkpoint `checkpoint`.
    fn gid(&self, subtask: u32, checkpoint: u64) -> String {
        format!("{}{subtask}:{checkpoint}", self.gid_prefix)
    }

    /// The subtask number of one of this sink's transaction names: its own, or one without
    /// `<target>` (see the module docs).
    fn subtask_of(&self, gid: &str) -> Option<u32> {
        let rest = gid
            .strip_prefix(&self.gid_prefix)
            .or_else(|| gid.strip_prefix(&self.owner_prefix))?;
        let (subtask, checkpoint) = rest.split_once(':')?;
        checkpoint.parse::<u64>().ok()?;
        subtask.parse().ok()
    }

    /// Connects, with the session settings the sink relies on.
    fn connect(&self) -> std::result::Result<Client, String> {
        let config = self.connection.clone();
        let target = self.target.clone();
        let client = run_blocking(CONNECT_TIMEOUT + Duration::from_secs(5), async move {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|e| format!("cannot connect to {target}: {}", describe(&e)))?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %describe(&e), "A PostgreSQL connection ended.");
                }
            });
            Ok(client)
        })?;
        let client = Client(Arc::new(client));
        client
            .batch("SET standard_conforming_strings = on")
            .map_err(|e| format!("{}: {e}", self.target))?;
        Ok(client)
    }

    /// `max_prepared_transactions` of the server, which the exactly-once sink needs above 0.
    fn max_prepared_transactions(client: &Client) -> std::result::Result<i64, String> {
        let text = client.single_value("SHOW max_prepared_transactions")?;
        text.trim()
            .parse()
            .map_err(|_| format!("`SHOW max_prepared_transactions` answered `{text}`"))
    }

    /// The error when the server allows no prepared transactions.
    fn no_prepared_transactions(&self) -> String {
        format!(
            "PostgreSQL at {} has `max_prepared_transactions = 0`, so the exactly-once sink \
             cannot prepare its transactions (two-phase commit). Set `max_prepared_transactions` \
             to at least the number of sink subtasks (such as 64) in postgresql.conf and restart \
             the server, or choose `checkpoints: {{mode: at_least_once}}` with `mode: upsert`",
            self.target
        )
    }

    /// Checks before a run that the server allows prepared transactions, when it can be
    /// reached within a few seconds (otherwise each subtask checks when it connects).
    ///
    /// # Errors
    /// The server answers and allows none.
    pub fn preflight(&self) -> std::result::Result<(), String> {
        if !self.two_phase {
            return Ok(());
        }
        let client = match self.connect() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "Cannot reach PostgreSQL before the start; the sink's subtasks will try again.");
                return Ok(());
            }
        };
        match Self::max_prepared_transactions(&client) {
            Ok(0) => Err(self.no_prepared_transactions()),
            _ => Ok(()),
        }
    }
}

/// The length of [`target_tag`]'s answer.
const TARGET_TAG_LEN: usize = 17;

/// `t` and 16 hex digits naming a database and table in transaction names: FNV-1a (64 bits)
/// over the database name, a zero byte and the quoted table name, fixed so that the names of
/// one sink stay the same from version to version.
fn target_tag(database: &str, table: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in database.as_bytes().iter().chain(&[0]).chain(table.as_bytes()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("t{hash:016x}")
}

/// `host:port/dbname` of a connection configuration.
fn describe_target(c: &tokio_postgres::Config) -> String {
    let host = match c.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = c.get_ports().first().copied().unwrap_or(5432);
    let db = c.get_dbname().or(c.get_user()).unwrap_or("postgres");
    format!("{host}:{port}/{db}")
}

/// A connected client, shared with the requests in flight on the client runtime.
#[derive(Clone)]
struct Client(Arc<tokio_postgres::Client>);

impl Client {
    /// Runs statements (simple query protocol) and waits for them.
    fn batch(&self, sql: &str) -> std::result::Result<(), String> {
        self.batch_owned(sql.to_owned())
    }

    fn batch_owned(&self, sql: String) -> std::result::Result<(), String> {
        let client = Arc::clone(&self.0);
        run_blocking(REQUEST_TIMEOUT, async move {
            client.batch_execute(&sql).await.map_err(|e| describe(&e))
        })
    }

    /// Runs `COMMIT PREPARED` or `ROLLBACK PREPARED` (`sql`): `Ok(true)` when it finished the
    /// transaction, `Ok(false)` when the transaction no longer exists (finished before, or by
    /// another session since it was listed). While another session is finishing the same
    /// transaction (two copies rolling back a name without `<target>` at once, or the previous
    /// incarnation's committer still at work) the server calls it busy: the request is tried
    /// again, a little later each time, for up to [`BUSY_WAIT`], and usually finds it gone.
    fn finish_prepared(&self, sql: String) -> std::result::Result<bool, String> {
        let client = Arc::clone(&self.0);
        run_blocking(REQUEST_TIMEOUT, async move {
            let deadline = tokio::time::Instant::now() + BUSY_WAIT;
            let mut pause = Duration::from_millis(5);
            loop {
                match client.batch_execute(&sql).await {
                    Ok(()) => return Ok(true),
                    Err(e) if has_code(&e, UNDEFINED_OBJECT) => return Ok(false),
                    Err(e) if has_code(&e, OBJECT_NOT_IN_PREREQUISITE_STATE) => {
                        if tokio::time::Instant::now() + pause >= deadline {
                            return Err(format!(
                                "{}; another session has been finishing it for {} s",
                                describe(&e),
                                BUSY_WAIT.as_secs()
                            ));
                        }
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(250));
                    }
                    Err(e) => return Err(describe(&e)),
                }
            }
        })
    }

    /// The first column of every row a query returns, as text.
    fn column(&self, sql: String) -> std::result::Result<Vec<String>, String> {
        let client = Arc::clone(&self.0);
        run_blocking(REQUEST_TIMEOUT, async move {
            let messages = client.simple_query(&sql).await.map_err(|e| describe(&e))?;
            Ok(messages
                .into_iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => {
                        r.get(0).map(str::to_owned)
                    }
                    _ => None,
                })
                .collect())
        })
    }

    fn single_value(&self, sql: &str) -> std::result::Result<String, String> {
        self.column(sql.to_owned())?
            .into_iter()
            .next()
            .ok_or_else(|| format!("`{sql}` returned no row"))
    }
}

/// A prepared transaction awaiting the completion of `checkpoint`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Prepared {
    /// The checkpoint whose barrier prepared it.
    checkpoint: u64,
    /// Its name.
    gid: String,
}

/// The sink's snapshot, format version [`PostgresSinkState::VERSION`] (MessagePack).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct PostgresSinkState {
    /// Format version.
    version: u32,
    /// The subtask that took the snapshot.
    subtask: u32,
    /// Whether the sink committed in two phases.
    two_phase: bool,
    /// Prepared transactions not committed at the snapshot, oldest first.
    prepared: Vec<Prepared>,
    /// Rows of the checkpoint that the barrier did not send (see the module docs), in the
    /// order they are to be written. Absent before version 2.
    #[serde(default)]
    carried: Vec<Carried>,
}

impl PostgresSinkState {
    const VERSION: u32 = 2;
}

/// Rows a snapshot carries, with the statement around them: the one of the sink that took the
/// snapshot, which a restore into a changed pipeline (another table or columns) still writes
/// them with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Carried {
    /// The statement before the rows (`INSERT INTO ... VALUES `).
    head: String,
    /// The statement after them (`ON CONFLICT ...`).
    tail: String,
    /// Rendered `(v1, v2, ...)` tuples.
    rows: Vec<String>,
}

/// The `postgres` sink, one writer subtask.
pub struct PostgresSink {
    config: Arc<PostgresConfig>,
    subtask: u32,
    client: Option<Client>,
    /// The connection prepared transactions are committed on. Not `client`: by the time a
    /// checkpoint completes, `client` often has the next checkpoint's transaction open, and
    /// `COMMIT PREPARED` cannot run inside a transaction block.
    committer: Option<Client>,
    /// Rendered `(v1, v2, ...)` tuples not sent yet.
    rows: Vec<String>,
    /// Upsert: the index in `rows` of each key's tuple, so a batch holds one row per key (the
    /// last record wins, as it would row by row).
    by_key: HashMap<String, usize>,
    /// A transaction is open (two-phase: rows were sent since the last barrier).
    in_transaction: bool,
    /// Prepared transactions not committed yet, oldest first.
    prepared: Vec<Prepared>,
}

impl PostgresSink {
    /// A writer subtask.
    pub fn new(config: Arc<PostgresConfig>, subtask: u32) -> Self {
        Self {
            config,
            subtask,
            client: None,
            committer: None,
            rows: Vec::new(),
            by_key: HashMap::new(),
            in_transaction: false,
            prepared: Vec::new(),
        }
    }

    fn error(&self, ctx: &OperatorContext, message: impl Into<String>) -> RunError {
        RunError::External {
            pipeline: ctx.pipeline.to_string(),
            element: ctx.operator.to_string(),
            system: "PostgreSQL",
            message: message.into(),
        }
    }

    /// The connection, made on first use (a failed one is made again by the restart).
    fn client(&mut self, ctx: &OperatorContext) -> Result<Client> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let client = self.config.connect().map_err(|e| self.error(ctx, e))?;
        if self.config.two_phase {
            let max = PostgresConfig::max_prepared_transactions(&client)
                .map_err(|e| self.error(ctx, e))?;
            if max == 0 {
                return Err(RunError::Build {
                    pipeline: ctx.pipeline.to_string(),
                    element: ctx.operator.to_string(),
                    message: self.config.no_prepared_transactions(),
                });
            }
        }
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Runs `sql`; a failure drops the connection (its transaction is gone with it) and fails
    /// the subtask.
    fn execute(&mut self, sql: String, what: &str, ctx: &OperatorContext) -> Result<()> {
        let config = Arc::clone(&self.config);
        self.send(sql, ctx, |e| format!("{what} {}: {e}", config.table))
    }

    /// Runs `sql`; a failure drops the connection and fails the subtask with `explain`'s
    /// message for the server's error.
    fn send(
        &mut self,
        sql: String,
        ctx: &OperatorContext,
        explain: impl FnOnce(&str) -> String,
    ) -> Result<()> {
        let client = self.client(ctx)?;
        client.batch_owned(sql).map_err(|e| {
            self.client = None;
            self.error(ctx, explain(&e))
        })
    }

    /// Whether full batches wait for the barrier: two-phase `upsert` while a prepared
    /// transaction of this subtask is not committed. Its rows stay locked until it commits,
    /// which only this subtask does, when it hears that the checkpoint completed; a statement
    /// updating one of them would wait for that, and the subtask, waiting on the statement,
    /// would never hear it (until the request timeout failed it). Waiting rows are one per key.
    fn held_back(&self) -> bool {
        self.config.two_phase && !self.config.key.is_empty() && !self.prepared.is_empty()
    }

    /// Runs `PREPARE TRANSACTION` under `gid`; a name already prepared is explained.
    fn prepare(&mut self, sql: String, gid: &str, ctx: &OperatorContext) -> Result<()> {
        let config = Arc::clone(&self.config);
        let table = &config.table;
        self.send(sql, ctx, |e| {
            if e.contains(&format!("(SQLSTATE {DUPLICATE_OBJECT})")) {
                format!(
                    "cannot prepare the transaction of {table}: its name `{gid}` is taken by a \
                     prepared transaction of another run of this pipeline's sink writing into the \
                     same table ({e}); run one copy per table, or give the copies different \
                     pipeline or sink ids"
                )
            } else {
                format!("cannot prepare the transaction of {table}: {e}")
            }
        })
    }

    /// Renders a record as a `(v1, v2, ...)` tuple and queues it.
    fn push(&mut self, record: Dynamic, ctx: &mut OperatorContext) -> Result<()> {
        let mut tuple = String::with_capacity(16 * self.config.columns.len());
        let mut key = String::new();
        tuple.push('(');
        for (i, (_, field)) in self.config.columns.iter().enumerate() {
            if i > 0 {
                tuple.push_str(", ");
            }
            let start = tuple.len();
            match field.with(&record, value_text).flatten() {
                None => tuple.push_str("NULL"),
                Some(text) if text.contains('\0') => {
                    return ctx.record_failed(
                        record,
                        format!(
                            "field `{}` holds a NUL character, which PostgreSQL text cannot store",
                            field.as_str()
                        ),
                    );
                }
                Some(text) => push_literal(&mut tuple, &text),
            }
            if self.config.key.contains(&i) {
                key.push_str(&tuple[start..]);
                key.push('\u{1}');
            }
        }
        tuple.push(')');
        if self.config.key.is_empty() {
            self.rows.push(tuple);
        } else if let Some(&at) = self.by_key.get(&key) {
            self.rows[at] = tuple;
        } else {
            self.by_key.insert(key, self.rows.len());
            self.rows.push(tuple);
        }
        Ok(())
    }

    /// Sends the queued rows in one statement (opening the transaction first, two-phase).
    fn flush(&mut self, ctx: &OperatorContext) -> Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let size: usize = self.rows.iter().map(|r| r.len() + 2).sum();
        let mut sql = String::with_capacity(size + self.config.head.len() + 64);
        let begin = self.config.two_phase && !self.in_transaction;
        if begin {
            sql.push_str("BEGIN; ");
        }
        push_statement(&mut sql, &self.config.head, &self.rows, &self.config.tail);
        self.rows.clear();
        self.by_key.clear();
        self.execute(sql, "cannot write into", ctx)?;
        if begin {
            self.in_transaction = true;
        }
        Ok(())
    }

    /// Commits prepared transaction `gid`; `Ok(false)` when it no longer exists (committed
    /// before, by this subtask or the one it replaced).
    fn commit_prepared(&mut self, gid: &str, ctx: &OperatorContext) -> Result<bool> {
        let client = match &self.committer {
            Some(c) => c.clone(),
            None => {
                let c = self.config.connect().map_err(|e| self.error(ctx, e))?;
                self.committer = Some(c.clone());
                c
            }
        };
        let mut sql = String::from("COMMIT PREPARED ");
        push_literal(&mut sql, gid);
        client.finish_prepared(sql).map_err(|e| {
            self.committer = None;
            self.error(ctx, format!("cannot commit the prepared transaction `{gid}`: {e}"))
        })
    }

    /// Rolls back every prepared transaction of this sink whose subtask number `owns` says is
    /// this subtask's, except those in `keep`.
    fn roll_back_owned(&mut self, owns: impl Fn(u32) -> bool, ctx: &OperatorContext) -> Result<()> {
        let client = self.client(ctx)?;
        let mut query = String::from(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND left(gid, ",
        );
        let _ = write!(query, "{}) = ", self.config.owner_prefix.len());
        push_literal(&mut query, &self.config.owner_prefix);
        query.push_str(" ORDER BY gid");
        let gids = client.column(query).map_err(|e| {
            self.error(ctx, format!("cannot list the prepared transactions: {e}"))
        })?;
        for gid in gids {
            if !self.config.subtask_of(&gid).is_some_and(&owns) {
                continue;
            }
            let mut sql = String::from("ROLLBACK PREPARED ");
            push_literal(&mut sql, &gid);
            let client = self.client(ctx)?;
            let rolled_back = client.finish_prepared(sql).map_err(|e| {
                self.error(ctx, format!("cannot roll back the prepared transaction `{gid}`: {e}"))
            })?;
            if !rolled_back {
                // Gone since the listing: another subtask (or copy, for a name without
                // `<target>`) rolled it back first.
                continue;
            }
            tracing::info!(
                pipeline = %ctx.pipeline,
                sink = %ctx.operator,
                transaction = %gid,
                "Rolled back a prepared transaction of a checkpoint that did not complete."
            );
        }
        Ok(())
    }

    fn decode_state(bytes: &[u8], ctx: &OperatorContext) -> Result<PostgresSinkState> {
        let state: PostgresSinkState = crate::record::decode(bytes).map_err(|e| {
            RunError::StateCorrupt(format!(
                "sink `{}`: malformed postgres sink state: {e}",
                ctx.operator
            ))
        })?;
        if state.version == 0 || state.version > PostgresSinkState::VERSION {
            return Err(RunError::StateMismatch(format!(
                "sink `{}`: postgres sink state version {} is not supported (this build reads \
                 version {})",
                ctx.operator,
                state.version,
                PostgresSinkState::VERSION
            )));
        }
        Ok(state)
    }

    /// Commits what `states` list as prepared (their checkpoint completed: it is the one
    /// restored), then rolls back the other prepared transactions of the names this subtask
    /// owns, and starts over with nothing pending.
    fn reconcile(
        &mut self,
        states: &[PostgresSinkState],
        owns: impl Fn(u32) -> bool,
        ctx: &OperatorContext,
    ) -> Result<()> {
        self.rows.clear();
        self.by_key.clear();
        self.prepared.clear();
        if self.in_transaction {
            self.in_transaction = false;
            self.execute("ROLLBACK".to_owned(), "cannot roll back in", ctx)?;
        }
        for state in states {
            for p in &state.prepared {
                let committed = self.commit_prepared(&p.gid, ctx)?;
                tracing::info!(
                    pipeline = %ctx.pipeline,
                    sink = %ctx.operator,
                    transaction = %p.gid,
                    checkpoint = p.checkpoint,
                    already = !committed,
                    "Committed a prepared transaction of the restored checkpoint."
                );
            }
        }
        self.roll_back_owned(owns, ctx)?;
        for state in states {
            for carried in &state.carried {
                self.write_carried(carried, ctx)?;
            }
        }
        Ok(())
    }

    /// Writes and commits rows a restored snapshot carries, in one transaction, a batch per
    /// statement. Written again by a later restore from the same checkpoint, they leave the
    /// same rows: only `upsert` carries rows.
    fn write_carried(&mut self, carried: &Carried, ctx: &OperatorContext) -> Result<()> {
        if carried.rows.is_empty() {
            return Ok(());
        }
        let mut sql = String::from("BEGIN; ");
        for batch in carried.rows.chunks(self.config.batch_size.max(1)) {
            push_statement(&mut sql, &carried.head, batch, &carried.tail);
            sql.push_str("; ");
        }
        sql.push_str("COMMIT");
        self.send(sql, ctx, |e| {
            format!(
                "cannot write the {} rows the restored checkpoint carries (`{}...`): {e}",
                carried.rows.len(),
                carried.head.trim_end()
            )
        })?;
        tracing::info!(
            pipeline = %ctx.pipeline,
            sink = %ctx.operator,
            rows = carried.rows.len(),
            "Wrote the rows the restored checkpoint carried."
        );
        Ok(())
    }
}

impl Operator for PostgresSink {
    /// Connects; on a fresh start (`ctx.restored_from` is `None`) rolls back the prepared
    /// transactions an earlier run left under this subtask's names.
    fn open(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.client(ctx)?;
        if ctx.restored_from.is_none() {
            let (me, parallelism) = (self.subtask, ctx.parallelism.max(1));
            self.roll_back_owned(|n| n == me || (me == 0 && n >= parallelism), ctx)?;
        }
        Ok(())
    }

    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        for record in batch.records.drain(..) {
            self.push(record, ctx)?;
            if self.rows.len() >= self.config.batch_size && !self.held_back() {
                self.flush(ctx)?;
            }
        }
        batch.keys.clear();
        // Without two phases nothing else would send a slow stream's rows (no barriers without
        // checkpoints): each batch of the task goes out at once. Two-phase, rows wait for the
        // batch size or the barrier; they are invisible until the checkpoint completes anyway.
        if !self.config.two_phase {
            self.flush(ctx)?;
        }
        Ok(())
    }

    /// Sends the rows before the barrier. Two-phase: prepares the open transaction under the
    /// name of `checkpoint` and returns every prepared transaction not committed yet; otherwise
    /// the rows are committed already. Rows held back ([`held_back`](Self::held_back)) are not
    /// sent: the snapshot carries them, and they stay queued.
    fn snapshot(&mut self, checkpoint: u64, ctx: &mut OperatorContext) -> Result<Option<Vec<u8>>> {
        let held_back = self.held_back();
        if !held_back {
            self.flush(ctx)?;
        }
        if self.config.two_phase && self.in_transaction {
            let gid = self.config.gid(self.subtask, checkpoint);
            let mut sql = String::from("PREPARE TRANSACTION ");
            push_literal(&mut sql, &gid);
            self.in_transaction = false;
            self.prepare(sql, &gid, ctx)?;
            self.prepared.push(Prepared { checkpoint, gid });
        }
        let state = PostgresSinkState {
            version: PostgresSinkState::VERSION,
            subtask: self.subtask,
            two_phase: self.config.two_phase,
            prepared: self.prepared.clone(),
            carried: if held_back && !self.rows.is_empty() {
                vec![Carried {
                    head: self.config.head.clone(),
                    tail: self.config.tail.clone(),
                    rows: self.rows.clone(),
                }]
            } else {
                Vec::new()
            },
        };
        crate::record::encode(&state).map(Some).map_err(|e| {
            RunError::State(format!(
                "sink `{}`: cannot encode its state: {e}",
                ctx.operator
            ))
        })
    }

    /// Commits every prepared transaction of a checkpoint `<= checkpoint`.
    fn notify_checkpoint_complete(
        &mut self,
        checkpoint: u64,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        while let Some(i) = self.prepared.iter().position(|p| p.checkpoint <= checkpoint) {
            let p = self.prepared[i].clone();
            if !self.commit_prepared(&p.gid, ctx)? {
                tracing::warn!(
                    pipeline = %ctx.pipeline,
                    sink = %ctx.operator,
                    transaction = %p.gid,
                    "A prepared transaction to commit was gone (committed or rolled back by someone else)."
                );
            }
            self.prepared.remove(i);
        }
        Ok(())
    }

    /// Commits the snapshot's prepared transactions and rolls back this subtask's others (see
    /// the module docs). `None` (the sink is new since the checkpoint): a fresh start.
    fn restore(&mut self, snapshot: Option<&[u8]>, ctx: &mut OperatorContext) -> Result<()> {
        let me = self.subtask;
        let Some(bytes) = snapshot else {
            let parallelism = ctx.parallelism.max(1);
            return self.reconcile(&[], |n| n == me || (me == 0 && n >= parallelism), ctx);
        };
        let state = Self::decode_state(bytes, ctx)?;
        if state.subtask != me {
            return Err(RunError::StateCorrupt(format!(
                "pipeline `{}`, sink `{}`: subtask {me} was handed the snapshot of subtask {}; \
                 the checkpoint is inconsistent, restore from another one",
                ctx.pipeline, ctx.operator, state.subtask
            )));
        }
        self.reconcile(&[state], |n| n == me, ctx)
    }

    /// After a change of parallelism: commits the prepared transactions of every old subtask
    /// whose snapshot this one received, and rolls back the others of the subtask numbers it
    /// owns (`n % parallelism == subtask`).
    fn restore_rescaled(&mut self, snapshots: &[&[u8]], ctx: &mut OperatorContext) -> Result<()> {
        let parallelism = ctx.parallelism.max(1);
        let me = self.subtask;
        let mut states = Vec::with_capacity(snapshots.len());
        for bytes in snapshots {
            let state = Self::decode_state(bytes, ctx)?;
            if state.subtask % parallelism != me {
                return Err(RunError::State(format!(
                    "pipeline `{}`, sink `{}`: subtask {me} of {parallelism} was handed the \
                     snapshot of old subtask {}; the savepoint is inconsistent",
                    ctx.pipeline, ctx.operator, state.subtask
                )));
            }
            states.push(state);
        }
        self.reconcile(&states, |n| n % parallelism == me, ctx)
    }

    /// The whole input was processed: commits everything, the prepared transactions first
    /// (the last rows may update rows they hold locked), then the last rows.
    fn on_end(&mut self, _out: &mut Vec<Dynamic>, ctx: &mut OperatorContext) -> Result<()> {
        self.notify_checkpoint_complete(u64::MAX, ctx)?;
        self.flush(ctx)?;
        if self.in_transaction {
            self.in_transaction = false;
            self.execute("COMMIT".to_owned(), "cannot commit into", ctx)?;
        }
        Ok(())
    }

    /// Without two phases, sends the rows still queued (a stop without checkpoints); with
    /// them, the open transaction is left to roll back with the connection.
    fn close(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        if !self.config.two_phase && self.client.is_some() {
            self.flush(ctx)?;
        }
        self.client = None;
        self.committer = None;
        Ok(())
    }
}

/// The sink's snapshot as JSON, for `weir inspect`.
///
/// # Errors
/// A malformed snapshot.
pub fn describe_snapshot(bytes: &[u8]) -> Result<serde_json::Value> {
    let state: PostgresSinkState = crate::record::decode(bytes)
        .map_err(|e| RunError::StateCorrupt(format!("malformed postgres sink state: {e}")))?;
    Ok(serde_json::json!({
        "version": state.version,
        "subtask": state.subtask,
        "two_phase": state.two_phase,
        "prepared": state
            .prepared
            .iter()
            .map(|p| serde_json::json!({"checkpoint": p.checkpoint, "transaction": p.gid}))
            .collect::<Vec<_>>(),
        "carried_rows": state.carried.iter().map(|c| c.rows.len()).sum::<usize>(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mode: PostgresWriteMode, key: &[&str]) -> PostgresSinkSpec {
        PostgresSinkSpec {
            id: "out".into(),
            input: Some("in".into()),
            inputs: Vec::new(),
            connection_env: "WEIR_UNIT_TEST_PG_URL".into(),
            table: "public.Orders".into(),
            columns: [("id", "id"), ("total", "amount.total")]
                .into_iter()
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .collect(),
            mode,
            key: key.iter().map(|k| (*k).to_owned()).collect(),
            batch_size: None,
            parallelism: None,
            partitioning: None,
        }
    }

    #[test]
    fn statements_quote_names_and_upsert_updates_the_other_columns() {
        let url = "postgres://u@127.0.0.1:1/db";
        let c = PostgresConfig::with_connection(&spec(PostgresWriteMode::Insert, &[]), "p", true, url)
            .expect("config");
        assert_eq!(c.head, "INSERT INTO \"public\".\"Orders\" (\"id\", \"total\") VALUES ");
        assert_eq!(c.tail, "");
        assert_eq!(c.target, "127.0.0.1:1/db");
        let u = PostgresConfig::with_connection(&spec(PostgresWriteMode::Upsert, &["id"]), "p", true, url)
            .expect("config");
        assert_eq!(u.tail, " ON CONFLICT (\"id\") DO UPDATE SET \"total\" = EXCLUDED.\"total\"");
        let tag = target_tag("db", "\"public\".\"Orders\"");
        assert_eq!(u.gid(3, 17), format!("weir:p:out:{tag}:3:17"));
        assert_eq!(u.subtask_of(&u.gid(3, 17)), Some(3));
        assert_eq!(u.subtask_of("weir:p:out:3:17"), Some(3), "a name without the target");
        assert_eq!(u.subtask_of("weir:p:out2:3:17"), None);
        assert_eq!(u.subtask_of("weir:p:out:x:17"), None);
        // The same pipeline and sink writing into another database or table: not this sink's.
        let elsewhere = |url: &str, table: &str| {
            let mut other = spec(PostgresWriteMode::Insert, &[]);
            other.table = table.to_owned();
            PostgresConfig::with_connection(&other, "p", true, url)
                .expect("config")
                .gid(3, 17)
        };
        for name in [
            elsewhere("postgres://u@127.0.0.1:1/db2", "public.Orders"),
            elsewhere(url, "public.Refunds"),
        ] {
            assert_ne!(name, u.gid(3, 17));
            assert_eq!(u.subtask_of(&name), None, "{name}");
        }
        // The host and port do not name the target: the same database through another address.
        assert_eq!(elsewhere("postgres://u@10.0.0.9:5433/db", "public.Orders"), u.gid(3, 17));
        assert_eq!(tag.len(), TARGET_TAG_LEN);
        let bad = PostgresConfig::with_connection(&spec(PostgresWriteMode::Insert, &[]), "p", true, "host=x port=notaport");
        assert!(bad.is_err_and(|e| !e.contains("notaport") || e.contains("WEIR_UNIT_TEST_PG_URL")));
    }

    /// A snapshot of version 1 (before carried rows) reads as one that carries none; the
    /// inspected state counts carried rows.
    #[test]
    fn snapshots_of_version_1_carry_no_rows() {
        #[derive(Serialize)]
        struct V1 {
            version: u32,
            subtask: u32,
            two_phase: bool,
            prepared: Vec<Prepared>,
        }
        let prepared = vec![Prepared {
            checkpoint: 7,
            gid: "weir:p:out:0:7".into(),
        }];
        let old = V1 {
            version: 1,
            subtask: 0,
            two_phase: true,
            prepared: prepared.clone(),
        };
        let bytes = crate::record::encode(&old).expect("encode");
        let state: PostgresSinkState = crate::record::decode(&bytes).expect("decode");
        assert_eq!(state.prepared, prepared);
        assert!(state.carried.is_empty());
        assert_eq!(describe_snapshot(&bytes).expect("describe")["carried_rows"], 0);
        let new = PostgresSinkState {
            version: PostgresSinkState::VERSION,
            carried: vec![Carried {
                head: "INSERT INTO t (a) VALUES ".into(),
                tail: String::new(),
                rows: vec!["('1')".into(), "('2')".into()],
            }],
            ..state
        };
        let bytes = crate::record::encode(&new).expect("encode");
        assert_eq!(crate::record::decode::<PostgresSinkState>(&bytes).expect("decode"), new);
        assert_eq!(describe_snapshot(&bytes).expect("describe")["carried_rows"], 2);
    }

    #[test]
    fn values_are_text_literals_or_null() {
        let mut s = String::new();
        push_literal(&mut s, "it's \\ fine");
        assert_eq!(s, "'it''s \\ fine'");
        assert_eq!(value_text(&Dynamic::UNIT), None);
        assert_eq!(value_text(&Dynamic::from(42_i64)).as_deref(), Some("42"));
        assert_eq!(value_text(&Dynamic::from(true)).as_deref(), Some("true"));
        assert_eq!(value_text(&Dynamic::from("x")).as_deref(), Some("x"));
        let mut m = rhai::Map::new();
        m.insert("a".into(), Dynamic::from(1_i64));
        assert_eq!(value_text(&Dynamic::from_map(m)).as_deref(), Some("{\"a\":1}"));
    }
}
