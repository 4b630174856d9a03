//! Checkpoint storage on S3-compatible object storage: [`S3Store`], a [`CheckpointStore`]
//! over the `object_store` crate for `storage: s3://bucket/prefix`, and [`S3Location`], the
//! parsed URL.
//!
//! Objects keep the local layout (see [`super::storage`]) under
//! `<prefix>/<pipeline-id>/`: `chk-<n>/...`, `shared/...`. Credentials, region and endpoint
//! come from the usual `AWS_*` environment variables (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP` for a plain-HTTP endpoint such as a local test server).
//!
//! Every call blocks its caller until the request is done, as the trait requires. The
//! requests run on one small tokio runtime of their own (threads `weir-s3`), never on the
//! caller's: operators and the supervisor call stores from inside the engine's runtime,
//! where `block_on` would panic and a blocked worker could starve the request it waits for.
//! A request that cannot reach the service fails after bounded retries and timeouts with
//! [`CheckpointError::Unavailable`] naming the object and the endpoint; a restore never takes
//! it for a damaged checkpoint, and the restart strategy takes it from there.
//!
//! This module owns only the mapping of the store's operations onto object requests; what
//! to write and when stays with the checkpoint protocol.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use futures_util::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{
    ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
};

use super::metadata::{SHARED_DIR, parse_checkpoint_dir};
use super::storage::{CheckpointStore, validate_path};
use super::{CheckpointId, Result};
use crate::base::error::CheckpointError;

/// The URL scheme of S3 checkpoint storage.
pub const S3_SCHEME: &str = "s3://";

/// How long one request may take before it is abandoned (retries included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries of a failed request (connection refused, 5xx, timeouts), and their total time.
const MAX_RETRIES: usize = 3;
const RETRY_TIMEOUT: Duration = Duration::from_secs(20);
/// Upper bound on one whole store operation (a listing or a directory delete may take
/// several requests); beyond it the operation fails rather than hang a task.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(120);

/// A parsed `s3://bucket/prefix` location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Location {
    /// The bucket.
    pub bucket: String,
    /// The key prefix inside the bucket, without leading or trailing `/` (may be empty).
    pub prefix: String,
}

impl S3Location {
    /// Parses `s3://bucket[/prefix]`; `None` when `url` is not an `s3://` URL.
    ///
    /// # Errors
    /// A message when the URL has the scheme but no bucket, or a prefix with empty, `.` or
    /// `..` components.
    pub fn parse(url: &str) -> Option<std::result::Result<Self, String>> {
        let rest = url.trim().strip_prefix(S3_SCHEME)?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Some(Err(format!("`{url}` names no bucket (expected s3://bucket/prefix)")));
        }
        let prefix = prefix.trim_end_matches('/');
        if !prefix.is_empty() && validate_path(prefix).is_err() {
            return Some(Err(format!(
                "`{url}` has an empty, `.` or `..` component in its prefix"
            )));
        }
        Some(Ok(Self {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
        }))
    }

    /// The location `name` below this one (`s3://bucket/prefix/name`).
    pub fn join(&self, name: &str) -> Self {
        let prefix = if self.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.prefix)
        };
        Self {
            bucket: self.bucket.clone(),
            prefix,
        }
    }
}

impl fmt::Display for S3Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "{S3_SCHEME}{}", self.bucket)
        } else {
            write!(f, "{S3_SCHEME}{}/{}", self.bucket, self.prefix)
        }
    }
}

/// The runtime every S3 request runs on (created on first use, lives for the process).
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("weir-s3")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| CheckpointError::Io {
            what: "cannot start the S3 client runtime for",
            path: PathBuf::from(S3_SCHEME),
            source: std::io::Error::other(e.clone()),
        })
}

/// A pipeline's checkpoint storage under `s3://bucket/prefix/<pipeline>/`.
#[derive(Clone)]
pub struct S3Store {
    store: Arc<dyn ObjectStore>,
    /// The pipeline's root (`s3://bucket/prefix/<pipeline>`), for messages and keys.
    root: S3Location,
    /// The endpoint named in messages (`AWS_ENDPOINT_URL`, or AWS's own).
    endpoint: String,
}

impl fmt::Debug for S3Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Store")
            .field("root", &self.root.to_string())
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl S3Store {
    /// The store of pipeline `pipeline` under `location`. Nothing is requested until the
    /// first operation.
    ///
    /// # Errors
    /// [`CheckpointError::InvalidPath`] when `pipeline` is not one path component;
    /// [`CheckpointError::Io`] when the client cannot be configured from the environment.
    pub fn new(location: &S3Location, pipeline: &str) -> Result<Self> {
        validate_path(pipeline)?;
        if pipeline.contains('/') {
            return Err(CheckpointError::InvalidPath {
                path: pipeline.to_owned(),
                reason: "a pipeline id must be one path component",
            });
        }
        Self::at(location.join(pipeline))
    }

    /// A store rooted at `root` itself (a savepoint or checkpoint directory's parent).
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the client cannot be configured from the environment.
    pub fn at(root: S3Location) -> Result<Self> {
        Self::configured(root, &[])
    }

    /// A store rooted at `root`, configured from the environment and then `settings`
    /// (`AWS_*` names and values, which override the environment's).
    fn configured(root: S3Location, settings: &[(String, String)]) -> Result<Self> {
        let setting = |name: &str| {
            settings
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var(name).ok())
        };
        let endpoint = setting("AWS_ENDPOINT_URL")
            .or_else(|| setting("AWS_ENDPOINT"))
            .unwrap_or_else(|| "the AWS S3 endpoint".to_owned());
        // Client options first: setting them replaces every client option, including those
        // the environment sets (`AWS_ALLOW_HTTP`).
        let mut builder = AmazonS3Builder::new()
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(CONNECT_TIMEOUT),
            )
            .with_retry(RetryConfig {
                max_retries: MAX_RETRIES,
                retry_timeout: RETRY_TIMEOUT,
                ..RetryConfig::default()
            });
        let env = std::env::vars().filter(|(k, _)| k.starts_with("AWS_"));
        for (name, value) in env.chain(settings.iter().cloned()) {
            if let Ok(key) = name.to_ascii_lowercase().parse() {
                builder = builder.with_config(key, value);
            }
        }
        let store = builder
            .with_bucket_name(&root.bucket)
            .build()
            .map_err(|e| CheckpointError::Io {
                what: "cannot configure the S3 client (check the AWS_* environment variables) for",
                path: PathBuf::from(root.to_string()),
                source: std::io::Error::other(e),
            })?;
        Ok(Self {
            store: Arc::new(store),
            root,
            endpoint,
        })
    }

    /// The object key of a store-relative path.
    fn key(&self, path: &str) -> Result<ObjectPath> {
        validate_path(path)?;
        Ok(self.key_unchecked(path))
    }

    fn key_unchecked(&self, path: &str) -> ObjectPath {
        if self.root.prefix.is_empty() {
            ObjectPath::from(path)
        } else {
            ObjectPath::from(format!("{}/{path}", self.root.prefix))
        }
    }

    /// The store-relative path of an object key under the root.
    fn relative(&self, key: &ObjectPath) -> Option<String> {
        let key = key.as_ref();
        if self.root.prefix.is_empty() {
            Some(key.to_owned())
        } else {
            key.strip_prefix(self.root.prefix.as_str())?
                .strip_prefix('/')
                .map(str::to_owned)
        }
    }

    /// The `s3://` URL of a store-relative path, for messages.
    fn url(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("{}/{path}", self.root))
    }

    /// Maps an object-store error on `path` to a checkpoint error.
    fn error(&self, what: &'static str, path: &str, e: object_store::Error) -> CheckpointError {
        match e {
            object_store::Error::NotFound { .. } => CheckpointError::NotFound {
                path: path.to_owned(),
            },
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
                CheckpointError::Io {
                    what: "refusing to overwrite",
                    path: self.url(path),
                    source: std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "it already exists: another process writes checkpoints of the same \
                         pipeline to the same storage",
                    ),
                }
            }
            e => CheckpointError::Unavailable {
                what,
                url: self.url(path).display().to_string(),
                message: format!(
                    "{e} (endpoint: {}; check that it runs and that the AWS_* settings are right)",
                    self.endpoint
                ),
            },
        }
    }

    /// Runs `fut` on the S3 runtime and waits for it, at most [`OPERATION_TIMEOUT`].
    fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        path: &str,
        fut: impl Future<Output = std::result::Result<T, object_store::Error>> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        runtime()?.spawn(async move {
            let out = tokio::time::timeout(OPERATION_TIMEOUT, fut).await;
            let _ = tx.send(out);
        });
        match rx.recv() {
            Ok(Ok(out)) => out.map_err(|e| self.error(what, path, e)),
            Ok(Err(_elapsed)) => Err(CheckpointError::Unavailable {
                what,
                url: self.url(path).display().to_string(),
                message: format!(
                    "no answer within {}s (endpoint: {})",
                    OPERATION_TIMEOUT.as_secs(),
                    self.endpoint
                ),
            }),
            Err(_) => Err(CheckpointError::Unavailable {
                what,
                url: self.url(path).display().to_string(),
                message: "the S3 client runtime stopped".to_owned(),
            }),
        }
    }

    /// Every object key under `dir` (a store-relative directory, or the root for `None`).
    fn list_keys(&self, dir: Option<&str>) -> Result<Vec<ObjectPath>> {
        let prefix = match dir {
            Some(d) => Some(self.key(d)?),
            None if self.root.prefix.is_empty() => None,
            None => Some(ObjectPath::from(self.root.prefix.as_str())),
        };
        let store = Arc::clone(&self.store);
        self.run("cannot list", dir.unwrap_or(""), async move {
            let mut stream = store.list(prefix.as_ref());
            let mut keys = Vec::new();
            while let Some(meta) = stream.next().await {
                keys.push(meta?.location);
            }
            Ok(keys)
        })
    }

    fn put_with(&self, path: &str, bytes: &[u8], mode: PutMode) -> Result<()> {
        let key = self.key(path)?;
        let store = Arc::clone(&self.store);
        let payload = PutPayload::from(bytes.to_vec());
        let opts = PutOptions {
            mode,
            ..PutOptions::default()
        };
        self.run("cannot write", path, async move {
            store.put_opts(&key, payload, opts).await.map(|_| ())
        })
    }
}

impl CheckpointStore for S3Store {
    fn put(&self, path: &str, bytes: &[u8]) -> Result<()> {
        self.put_with(path, bytes, PutMode::Overwrite)
    }

    /// A conditional put (`If-None-Match: *`): the object store refuses when the object
    /// exists, so two processes can never both complete the same checkpoint.
    fn put_new(&self, path: &str, bytes: &[u8]) -> Result<()> {
        self.put_with(path, bytes, PutMode::Create)
    }

    fn get(&self, path: &str) -> Result<Vec<u8>> {
        let key = self.key(path)?;
        let store = Arc::clone(&self.store);
        self.run("cannot read", path, async move {
            let got = store.get(&key).await?;
            Ok(got.bytes().await?.to_vec())
        })
    }

    fn size(&self, path: &str) -> Result<u64> {
        let key = self.key(path)?;
        let store = Arc::clone(&self.store);
        self.run("cannot stat", path, async move {
            Ok(store.head(&key).await?.size)
        })
    }

    fn list_checkpoints(&self) -> Result<Vec<CheckpointId>> {
        let mut ids: Vec<CheckpointId> = self
            .list_dirs()?
            .iter()
            .filter_map(|name| parse_checkpoint_dir(name))
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    fn list_shared(&self) -> Result<Vec<String>> {
        let mut out: Vec<String> = self
            .list_keys(Some(SHARED_DIR))?
            .iter()
            .filter_map(|k| self.relative(k))
            .collect();
        out.sort();
        Ok(out)
    }

    fn delete(&self, path: &str) -> Result<()> {
        let key = self.key(path)?;
        let store = Arc::clone(&self.store);
        match self.run("cannot delete", path, async move { store.delete(&key).await }) {
            Err(CheckpointError::NotFound { .. }) => Ok(()),
            other => other,
        }
    }

    fn delete_dir(&self, path: &str) -> Result<()> {
        validate_path(path)?;
        self.delete_keys(self.list_keys(Some(path))?)
    }
}

impl S3Store {
    /// The names of the directories directly under the store's root (the common prefixes of
    /// one delimited listing), unsorted.
    ///
    /// # Errors
    /// [`CheckpointError::Unavailable`] when S3 does not answer.
    pub fn list_dirs(&self) -> Result<Vec<String>> {
        let prefix =
            (!self.root.prefix.is_empty()).then(|| ObjectPath::from(self.root.prefix.as_str()));
        let store = Arc::clone(&self.store);
        let dirs = self.run("cannot list", "", async move {
            store.list_with_delimiter(prefix.as_ref()).await
        })?;
        Ok(dirs
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_owned))
            .collect())
    }

    /// Deletes every object under the store's root (a savepoint that is removed).
    ///
    /// # Errors
    /// [`CheckpointError::Unavailable`] when S3 does not answer.
    pub fn delete_all(&self) -> Result<()> {
        self.delete_keys(self.list_keys(None)?)
    }

    fn delete_keys(&self, keys: Vec<ObjectPath>) -> Result<()> {
        for key in keys {
            let store = Arc::clone(&self.store);
            let rel = self.relative(&key).unwrap_or_else(|| key.to_string());
            match self.run("cannot delete", &rel, async move { store.delete(&key).await }) {
                Ok(()) | Err(CheckpointError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Test helpers: the local S3 server of `scripts/services/s3.sh` and stores on fresh
/// buckets of it.
#[cfg(test)]
pub(crate) mod testing {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// The server's `AWS_*` settings (installs and starts it on first use).
    fn settings() -> &'static Vec<(String, String)> {
        static SETTINGS: OnceLock<Vec<(String, String)>> = OnceLock::new();
        SETTINGS.get_or_init(|| {
            let script =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/services/s3.sh");
            let out = std::process::Command::new("bash")
                .arg(&script)
                .arg("ensure")
                .output()
                .expect("run scripts/services/s3.sh");
            assert!(
                out.status.success(),
                "s3.sh ensure failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            parse_service_settings(&out.stdout).into_iter().collect()
        })
    }

    include!("../../../scripts/services/settings.rs");

    /// Creates bucket `name` on the local server (moto accepts unsigned requests).
    pub(crate) fn create_bucket(name: &str) {
        let endpoint = settings()
            .iter()
            .find(|(k, _)| k == "AWS_ENDPOINT_URL")
            .map(|(_, v)| v.clone())
            .expect("endpoint");
        let host = endpoint.trim_start_matches("http://");
        let mut conn = std::net::TcpStream::connect(host).expect("connect to the S3 server");
        write!(
            conn,
            "PUT /{name} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        let mut answer = String::new();
        conn.read_to_string(&mut answer).expect("answer");
        assert!(
            answer.starts_with("HTTP/1.1 200") || answer.contains("BucketAlreadyOwnedByYou"),
            "cannot create bucket {name}: {answer}"
        );
    }

    /// A store on a bucket of its own, under a prefix, for pipeline `p`.
    pub(crate) fn fresh_store() -> S3Store {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let bucket = format!(
            "weir-unit-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        create_bucket(&bucket);
        let location = S3Location {
            bucket,
            prefix: "some/prefix".to_owned(),
        };
        S3Store::configured(location.join("p"), settings()).expect("store")
    }

    /// A store whose endpoint answers nothing (a closed port).
    pub(crate) fn unreachable_store() -> S3Store {
        let mut settings = settings().clone();
        for (k, v) in &mut settings {
            if k == "AWS_ENDPOINT_URL" {
                *v = "http://127.0.0.1:9".to_owned();
            }
        }
        let location = S3Location {
            bucket: "nowhere".to_owned(),
            prefix: String::new(),
        };
        S3Store::configured(location.join("p"), &settings).expect("store")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_written_once_only() {
        let store = testing::fresh_store();
        store.put_new("chk-1/_metadata", b"one").expect("first");
        let e = store.put_new("chk-1/_metadata", b"two").expect_err("second");
        assert!(e.to_string().contains("another process"), "{e}");
        assert_eq!(store.get("chk-1/_metadata").expect("get"), b"one");
        // Plain puts overwrite.
        store.put("chk-1/_metadata", b"three").expect("overwrite");
        assert_eq!(store.get("chk-1/_metadata").expect("get"), b"three");
    }

    #[test]
    fn keys_keep_the_layout_under_the_prefix() {
        let store = testing::fresh_store();
        store.put("chk-3/a-0.snap", b"x").expect("put");
        store.put("shared/op/1.sst", b"y").expect("put");
        let keys: Vec<String> = store
            .list_keys(None)
            .expect("list")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            keys.len(),
            2,
            "{keys:?}"
        );
        assert!(keys.contains(&"some/prefix/p/chk-3/a-0.snap".to_owned()), "{keys:?}");
        assert!(keys.contains(&"some/prefix/p/shared/op/1.sst".to_owned()), "{keys:?}");
    }

    #[test]
    fn an_unreachable_endpoint_fails_with_a_clear_error() {
        let store = testing::unreachable_store();
        let e = store.get("chk-1/_metadata").expect_err("no server");
        let text = e.to_string();
        assert!(
            text.contains("s3://nowhere/p/chk-1/_metadata") && text.contains("127.0.0.1:9"),
            "{text}"
        );
        assert!(matches!(e, CheckpointError::Unavailable { .. }), "{e:?}");
        assert_eq!(e.class(), crate::base::error::ErrorClass::Io);
    }

    #[test]
    fn locations_parse_and_print() {
        let l = S3Location::parse("s3://b/a/b/").expect("s3").expect("valid");
        assert_eq!(l.bucket, "b");
        assert_eq!(l.prefix, "a/b");
        assert_eq!(l.to_string(), "s3://b/a/b");
        assert_eq!(l.join("p").to_string(), "s3://b/a/b/p");
        let l = S3Location::parse("s3://b").expect("s3").expect("valid");
        assert_eq!(l.prefix, "");
        assert_eq!(l.join("p").to_string(), "s3://b/p");
        assert!(S3Location::parse("/tmp/x").is_none());
        assert!(S3Location::parse("s3:///x").expect("s3").is_err());
        assert!(S3Location::parse("s3://b/a/../c").expect("s3").is_err());
        assert!(S3Location::parse("s3://b//c").expect("s3").is_err());
    }
}
