//! The [`FileWatcher`]: tells the job when the pipeline file, or a script file it references,
//! has new content. It owns the directory watches, the symlink resolution and a content hash
//! per file; it must not read the files as YAML or Rhai, nor decide anything about a reload.
//!
//! How it watches (each case below has a test in this module, on the real `notify` watcher):
//! - It watches the *directory* holding each file, non-recursively, never the file itself: an
//!   editor's atomic save (write a temporary file, rename it over the target), a vim-style save
//!   (rename the target to a backup, write a new file, delete the backup), an in-place
//!   truncate-and-write and a symlink swap all show up as events in that directory, whereas a
//!   watch on the file dies with the first rename.
//! - A file that is a symlink, or whose path goes through symlinks (a Kubernetes ConfigMap's
//!   `pipeline.yaml -> ..data/pipeline.yaml` with `..data -> ..2026_11_29_...`), is resolved
//!   component by component: the directory holding every link met on the way is watched (so a
//!   swap of `..data` is seen), and so is the directory the file finally resolves into (so an
//!   in-place edit of the target is seen). The resolution is redone after every event, and the
//!   watches follow it: after a swap the new target directory is watched and the old one let go.
//! - Events are debounced by `notify-debouncer-full`. After a burst touching a watched file, a
//!   link on its way, a watched directory or an editor temporary name (`*~`, `*.swp`, `*.tmp`,
//!   `.#*`, `4913`), every watched file is hashed again, and [`Changed`] is sent only when at
//!   least one hash differs: saves that leave the content as it was send nothing, and
//!   temporary files are never reported themselves. A file that disappears counts as changed
//!   (the reloader then reports it as invalid), and so does its reappearance.
//! - A watched directory that is removed is replaced by a watch on its nearest existing
//!   ancestor, so that its re-creation is an event; then the directory is watched again and
//!   the files re-hashed. A directory replaced by another (a new inode under the same name,
//!   e.g. removed and recreated within one debounce interval) is noticed at the next event and
//!   watched again. A watch that cannot be placed (permissions, inotify limits) is reported,
//!   and retried at every later event from any watched directory.
//!
//! Access events (opening and reading a file) are ignored: hashing the files reads them, and
//! must not trigger itself.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::hash::{DefaultHasher, Hasher};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use notify::{EventKind, RecommendedWatcher, RecursiveMode};
use notify_debouncer_full::{
    DebounceEventResult, DebouncedEvent, Debouncer, RecommendedCache, new_debouncer,
};
use tokio::sync::mpsc;
use weir_schema::FileSpec;
use weir_schema::registry::ScriptRef;

/// The shortest debounce interval accepted; shorter ones are raised to it (the debouncer's
/// thread wakes four times per interval).
const MIN_DEBOUNCE: Duration = Duration::from_millis(10);

/// Symlinks followed while resolving one path before giving up (as Linux's `ELOOP` limit).
const MAX_SYMLINK_HOPS: u32 = 40;

/// At least one watched file has new content (or disappeared, or reappeared).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changed {
    /// The files whose content changed, spelled as they were given to the watcher, in the
    /// order they were given.
    pub paths: Vec<PathBuf>,
}

/// Why the watcher could not start or watch a directory.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The platform's watcher (inotify on Linux) or the debouncer could not start.
    #[error("cannot start the file watcher: {source}{}", hint(source))]
    Start {
        /// The watcher's error.
        source: notify::Error,
    },
    /// A directory could not be watched. The watcher keeps running; the directory is tried
    /// again at the next event.
    #[error("cannot watch directory `{}`: {source}{}", dir.display(), hint(source))]
    Watch {
        /// The directory.
        dir: PathBuf,
        /// The watcher's error.
        source: notify::Error,
    },
    /// A relative path was given and the current directory is unknown.
    #[error("cannot resolve `{}`: the current directory is unknown: {source}", path.display())]
    CurrentDir {
        /// The relative path.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

/// A help sentence for the errors a user can act on.
fn hint(error: &notify::Error) -> &'static str {
    match error.kind {
        notify::ErrorKind::MaxFilesWatch => {
            " (the inotify watch limit is reached: raise `fs.inotify.max_user_watches` or \
             `fs.inotify.max_user_instances` with sysctl)"
        }
        _ => "",
    }
}

/// Watches files for content changes; see the module documentation for how. Changes arrive on
/// the receiver returned by [`FileWatcher::new`]. Dropping the watcher stops it and closes
/// that channel.
pub struct FileWatcher {
    shared: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for FileWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = lock(&self.shared);
        f.debug_struct("FileWatcher")
            .field(
                "files",
                &inner.files.iter().map(|f| &f.given).collect::<Vec<_>>(),
            )
            .field("watched_dirs", &inner.watched.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl FileWatcher {
    /// Starts watching `files` (relative paths resolve against the current directory, once,
    /// here). Each file's content is hashed now; after that, one [`Changed`] is sent per
    /// debounced burst of events in which at least one file's content changed. `debounce` is
    /// how long an event waits for later ones before it is handled (100–250 ms suits editors;
    /// at least 10 ms).
    ///
    /// Files or directories that do not exist yet are fine: the nearest existing ancestor
    /// directory is watched until they appear, and their appearance is a change.
    ///
    /// # Errors
    /// [`WatchError::Start`] when the platform watcher cannot start, [`WatchError::Watch`] when
    /// a directory cannot be watched, [`WatchError::CurrentDir`] for a relative path without a
    /// current directory.
    pub fn new(
        files: &[PathBuf],
        debounce: Duration,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Changed>), WatchError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Mutex::new(Inner {
            debouncer: None,
            files: Vec::new(),
            watched: BTreeMap::new(),
            interest: Interest::default(),
            tx,
        }));
        // The handler holds a weak reference: the watcher owns the debouncer, whose thread
        // owns the handler, and a strong one would keep everything alive forever.
        let weak = Arc::downgrade(&shared);
        let debouncer = new_debouncer(
            debounce.max(MIN_DEBOUNCE),
            None,
            move |result: DebounceEventResult| on_events(&weak, result),
        )
        .map_err(|source| WatchError::Start { source })?;
        {
            let mut inner = lock(&shared);
            inner.debouncer = Some(debouncer);
            inner.set_files(files)?;
        }
        Ok((Self { shared }, rx))
    }

    /// Replaces the watched files (after a reload the script files may differ). Directories
    /// no file needs any more are let go, new ones watched. Files already watched keep their
    /// last known hash, so a change that is still being debounced is reported as usual; new
    /// files are hashed now.
    ///
    /// # Errors
    /// As [`FileWatcher::new`]. On a [`WatchError::Watch`] the new set is in place anyway and
    /// the failed directory is tried again at the next event.
    pub fn set_files(&mut self, files: &[PathBuf]) -> Result<(), WatchError> {
        lock(&self.shared).set_files(files)
    }

    /// The files watched, as given.
    #[cfg(any(test, feature = "testkit"))]
    pub fn files(&self) -> Vec<PathBuf> {
        lock(&self.shared)
            .files
            .iter()
            .map(|f| f.given.clone())
            .collect()
    }

    /// The directories currently watched (canonical paths).
    #[cfg(any(test, feature = "testkit"))]
    pub fn watched_dirs(&self) -> Vec<PathBuf> {
        lock(&self.shared).watched.keys().cloned().collect()
    }
}

/// The pipeline file plus every `script_file` its operators reference, resolved as the
/// validator and the planner resolve them (relative to the pipeline file's directory), without
/// duplicates, the pipeline file first. Give the result to [`FileWatcher::new`] or
/// [`FileWatcher::set_files`].
pub fn referenced_files(spec_file: &Path, spec: &FileSpec) -> Vec<PathBuf> {
    let base_dir = spec_file
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let mut files = vec![spec_file.to_path_buf()];
    for pipeline in &spec.pipelines {
        for operator in &pipeline.operators {
            if let Some(ScriptRef::File(file)) = operator.script() {
                let path = base_dir.join(file);
                if !files.contains(&path) {
                    files.push(path);
                }
            }
        }
    }
    files
}

/// Locks, shrugging off poisoning: the state stays consistent between statements, and the
/// handler never panics.
fn lock(shared: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the watcher knows about a file's content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Content {
    /// The file does not exist.
    Missing,
    /// The file exists but cannot be read.
    Unreadable(io::ErrorKind),
    /// Length and hash of the bytes.
    Bytes(u64, u64),
}

impl Content {
    fn of(path: &Path) -> Self {
        match std::fs::read(path) {
            Ok(bytes) => {
                let mut hasher = DefaultHasher::new();
                hasher.write(&bytes);
                Self::Bytes(bytes.len() as u64, hasher.finish())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Self::Missing,
            Err(e) => Self::Unreadable(e.kind()),
        }
    }
}

/// One watched file.
struct WatchedFile {
    /// As given by the caller, for [`Changed`].
    given: PathBuf,
    /// Absolute, not resolved.
    absolute: PathBuf,
    /// The last content seen; `None` until first hashed.
    content: Option<Content>,
}

/// Which event paths are worth a re-hash.
#[derive(Default)]
struct Interest {
    /// Every watched file and every symlink on the way to it, resolved, plus the directories
    /// that should be watched.
    paths: HashSet<PathBuf>,
    /// The directories that should be watched (some may be missing and watched through an
    /// ancestor).
    dirs: BTreeSet<PathBuf>,
    /// File names of `paths` (a rename may spell the directory differently).
    names: HashSet<OsString>,
}

/// Identity of a directory (device and inode), to notice one replaced under the same name.
type DirId = Option<(u64, u64)>;

#[cfg(unix)]
fn dir_id(dir: &Path) -> DirId {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn dir_id(_dir: &Path) -> DirId {
    None
}

/// The state shared by the watcher and the debouncer's thread.
struct Inner {
    /// `None` only while the watcher is being built.
    debouncer: Option<Debouncer<RecommendedWatcher, RecommendedCache>>,
    files: Vec<WatchedFile>,
    /// Directories watched now, with their identity when the watch was placed.
    watched: BTreeMap<PathBuf, DirId>,
    interest: Interest,
    tx: mpsc::UnboundedSender<Changed>,
}

impl Inner {
    fn set_files(&mut self, files: &[PathBuf]) -> Result<(), WatchError> {
        let mut next: Vec<WatchedFile> = Vec::with_capacity(files.len());
        for given in files {
            // Absolute without resolving symlinks: resolution is redone at every event.
            let absolute = std::path::absolute(given).map_err(|source| WatchError::CurrentDir {
                path: given.clone(),
                source,
            })?;
            if next.iter().any(|f| f.absolute == absolute) {
                continue;
            }
            let content = self
                .files
                .iter()
                .find(|f| f.absolute == absolute)
                .and_then(|f| f.content);
            next.push(WatchedFile {
                given: given.clone(),
                absolute,
                content,
            });
        }
        self.files = next;
        // Watch first, hash second: a write in between is then an event, never lost.
        let watched = self.reconcile();
        for file in &mut self.files {
            if file.content.is_none() {
                file.content = Some(Content::of(&file.absolute));
            }
        }
        watched
    }

    /// Resolves every file again and moves the directory watches to match. Returns the first
    /// watch error (every directory is still tried).
    fn reconcile(&mut self) -> Result<(), WatchError> {
        let mut interest = Interest::default();
        for file in &self.files {
            let resolution = resolve(&file.absolute);
            interest.dirs.extend(resolution.dirs);
            interest.paths.extend(resolution.paths);
        }
        interest.names = interest
            .paths
            .iter()
            .filter_map(|p| p.file_name().map(OsStr::to_os_string))
            .collect();
        interest.paths.extend(interest.dirs.iter().cloned());

        // A missing directory is watched through its nearest existing ancestor, so that its
        // creation is an event.
        let targets: BTreeSet<PathBuf> = interest
            .dirs
            .iter()
            .filter_map(|d| d.ancestors().find(|a| a.is_dir()).map(Path::to_path_buf))
            .collect();
        self.interest = interest;

        let Some(debouncer) = self.debouncer.as_mut() else {
            return Ok(());
        };
        let stale: Vec<PathBuf> = self
            .watched
            .keys()
            .filter(|d| !targets.contains(*d))
            .cloned()
            .collect();
        for dir in stale {
            // The directory may be gone, and its watch with it: nothing to undo then.
            let _ = debouncer.unwatch(&dir);
            self.watched.remove(&dir);
            tracing::debug!(dir = %dir.display(), "Stopped watching a directory.");
        }
        let mut first_error = None;
        for dir in targets {
            let id = dir_id(&dir);
            match self.watched.get(&dir) {
                Some(known) if *known == id => continue,
                Some(_) => {
                    // Replaced under the same name: the old watch follows the old inode.
                    let _ = debouncer.unwatch(&dir);
                    self.watched.remove(&dir);
                }
                None => {}
            }
            match debouncer.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    tracing::debug!(dir = %dir.display(), "Watching a directory.");
                    self.watched.insert(dir, id);
                }
                Err(source) => {
                    let error = WatchError::Watch { dir, source };
                    tracing::warn!(error = %error, "Cannot watch a directory; retrying at the next event.");
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Drops the watches of watched directories that events say were removed or moved away.
    /// The platform watcher has already let go of a removed one, and a directory recreated
    /// under the same name may even get the same inode back, which [`dir_id`] cannot tell.
    fn forget_removed_dirs(&mut self, events: &[DebouncedEvent]) {
        for event in events {
            if !matches!(
                event.kind,
                EventKind::Remove(_) | EventKind::Modify(notify::event::ModifyKind::Name(_))
            ) {
                continue;
            }
            for path in &event.paths {
                if self.watched.remove(path).is_some()
                    && let Some(debouncer) = self.debouncer.as_mut()
                {
                    let _ = debouncer.unwatch(path);
                }
            }
        }
    }

    fn is_relevant(&self, event: &DebouncedEvent) -> bool {
        if matches!(event.kind, EventKind::Access(_)) {
            return false;
        }
        if event.need_rescan() || event.paths.is_empty() {
            return true;
        }
        event.paths.iter().any(|path| {
            self.interest.paths.contains(path)
                || self.interest.dirs.iter().any(|d| d.starts_with(path))
                || path
                    .file_name()
                    .is_some_and(|name| self.interest.names.contains(name) || is_editor_temp(name))
        })
    }

    /// Hashes every file again; returns those whose content changed, as given.
    fn rehash(&mut self) -> Vec<PathBuf> {
        let mut changed = Vec::new();
        for file in &mut self.files {
            let now = Content::of(&file.absolute);
            if file.content.is_some_and(|before| before != now) {
                changed.push(file.given.clone());
            }
            file.content = Some(now);
        }
        changed
    }
}

/// The debouncer's callback: on a relevant burst, follow the symlinks again, fix the watches,
/// re-hash, and report what changed.
fn on_events(shared: &Weak<Mutex<Inner>>, result: DebounceEventResult) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let mut inner = lock(&shared);
    let relevant = match &result {
        Ok(events) => events.iter().any(|e| inner.is_relevant(e)),
        Err(errors) => {
            for error in errors {
                tracing::warn!(error = %error, "The file watcher reported an error.");
            }
            // Whatever went wrong, looking again costs little.
            true
        }
    };
    if !relevant {
        return;
    }
    if let Ok(events) = &result {
        inner.forget_removed_dirs(events);
    }
    // Errors are logged in `reconcile` and retried at the next event.
    let _ = inner.reconcile();
    let paths = inner.rehash();
    if !paths.is_empty() {
        tracing::debug!(files = ?paths, "Watched files changed.");
        // A closed channel means nobody listens any more; nothing to do.
        let _ = inner.tx.send(Changed { paths });
    }
}

/// Names editors use for temporary and backup files: they never count as changes themselves,
/// only make the watcher look at the watched files again.
fn is_editor_temp(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.ends_with('~')
        || name.ends_with(".swp")
        || name.ends_with(".swo")
        || name.ends_with(".swx")
        || name.ends_with(".tmp")
        || name.starts_with(".#")
        || name == "4913"
}

/// Where a path leads, and what to watch for it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Resolution {
    /// The directory holding each symlink met, and the one the path finally resolves into
    /// (all with symlinks resolved).
    dirs: Vec<PathBuf>,
    /// Each symlink met, and the final path (all in resolved directories).
    paths: Vec<PathBuf>,
}

/// One step of [`resolve`], owned (link targets are spliced into the queue).
enum Step {
    /// Start again from this root (or prefix).
    Root(OsString),
    /// `..`
    Parent,
    /// A name.
    Name(OsString),
}

fn steps(path: &Path) -> impl DoubleEndedIterator<Item = Step> + '_ {
    path.components().filter_map(|c| match c {
        Component::Prefix(p) => Some(Step::Root(p.as_os_str().to_os_string())),
        Component::RootDir => Some(Step::Root(c.as_os_str().to_os_string())),
        Component::CurDir => None,
        Component::ParentDir => Some(Step::Parent),
        Component::Normal(name) => Some(Step::Name(name.to_os_string())),
    })
}

/// Resolves an absolute path like `realpath`, component by component, noting every symlink
/// met. Components that do not exist are kept as written.
fn resolve(absolute: &Path) -> Resolution {
    let mut out = Resolution::default();
    let mut resolved = PathBuf::new();
    let mut queue: VecDeque<Step> = steps(absolute).collect();
    let mut hops = 0;
    while let Some(step) = queue.pop_front() {
        match step {
            // Pushing a root onto a path replaces it; a prefix starts a new path.
            Step::Root(root) => resolved.push(root),
            Step::Parent => {
                resolved.pop();
            }
            Step::Name(name) => {
                let candidate = resolved.join(&name);
                let is_link =
                    std::fs::symlink_metadata(&candidate).is_ok_and(|m| m.file_type().is_symlink());
                let target = if is_link && hops < MAX_SYMLINK_HOPS {
                    std::fs::read_link(&candidate).ok()
                } else {
                    None
                };
                match target {
                    Some(target) => {
                        hops += 1;
                        out.dirs.push(resolved.clone());
                        out.paths.push(candidate);
                        for step in steps(&target).rev() {
                            queue.push_front(step);
                        }
                    }
                    None => resolved = candidate,
                }
            }
        }
    }
    if let Some(parent) = resolved.parent() {
        out.dirs.push(parent.to_path_buf());
    }
    out.paths.push(resolved);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Write;

    const DEBOUNCE: Duration = Duration::from_millis(200);
    /// How long an expected event may take on a loaded machine.
    const EXPECT: Duration = Duration::from_secs(10);
    /// How long to listen for an event that must not come.
    const QUIET: Duration = Duration::from_millis(1500);

    fn write(path: &Path, text: &str) {
        fs::write(path, text).expect("write");
    }

    /// Waits until a change of `path` arrives while the file reads `expected`.
    async fn expect_content(
        rx: &mut mpsc::UnboundedReceiver<Changed>,
        path: &Path,
        expected: &str,
    ) {
        let deadline = tokio::time::Instant::now() + EXPECT;
        loop {
            let changed = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .unwrap_or_else(|_| panic!("no change of {} within {EXPECT:?}", path.display()))
                .expect("the watcher is alive");
            if changed.paths.iter().any(|p| p == path)
                && fs::read_to_string(path).ok().as_deref() == Some(expected)
            {
                return;
            }
        }
    }

    /// Waits for the next change, whatever it is.
    async fn expect_change(rx: &mut mpsc::UnboundedReceiver<Changed>) -> Changed {
        tokio::time::timeout(EXPECT, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no change within {EXPECT:?}"))
            .expect("the watcher is alive")
    }

    async fn expect_quiet(rx: &mut mpsc::UnboundedReceiver<Changed>) {
        if let Ok(changed) = tokio::time::timeout(QUIET, rx.recv()).await {
            panic!("expected no change, got {changed:?}");
        }
    }

    fn atomic_save(path: &Path, text: &str) {
        let tmp = path.with_extension("yaml.tmp");
        let mut f = fs::File::create(&tmp).expect("create temp");
        f.write_all(text.as_bytes()).expect("write temp");
        f.sync_all().expect("fsync");
        drop(f);
        fs::rename(&tmp, path).expect("rename over");
    }

    fn vim_save(path: &Path, text: &str) {
        let dir = path.parent().expect("parent");
        // vim probes whether it may create files in the directory.
        fs::write(dir.join("4913"), "").expect("probe");
        fs::remove_file(dir.join("4913")).expect("remove probe");
        let mut backup = path.as_os_str().to_os_string();
        backup.push("~");
        fs::rename(path, &backup).expect("rename to backup");
        write(path, text);
        fs::remove_file(&backup).expect("remove backup");
    }

    fn in_place_save(path: &Path, text: &str) {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)
            .expect("open");
        f.write_all(text.as_bytes()).expect("write");
    }

    fn setup(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("pipeline.yaml");
        write(&file, text);
        (dir, file)
    }

    #[tokio::test]
    async fn atomic_rename_save_is_seen() {
        let (_dir, file) = setup("v1");
        let (_w, mut rx) = FileWatcher::new(std::slice::from_ref(&file), DEBOUNCE).expect("watch");
        atomic_save(&file, "v2");
        expect_content(&mut rx, &file, "v2").await;
        atomic_save(&file, "v3");
        expect_content(&mut rx, &file, "v3").await;
    }

    #[tokio::test]
    async fn vim_style_save_is_seen() {
        let (_dir, file) = setup("v1");
        let (_w, mut rx) = FileWatcher::new(std::slice::from_ref(&file), DEBOUNCE).expect("watch");
        vim_save(&file, "v2");
        expect_content(&mut rx, &file, "v2").await;
        vim_save(&file, "v3");
        expect_content(&mut rx, &file, "v3").await;
    }

    #[tokio::test]
    async fn in_place_save_is_seen() {
        let (_dir, file) = setup("v1");
        let (_w, mut rx) = FileWatcher::new(std::slice::from_ref(&file), DEBOUNCE).expect("watch");
        in_place_save(&file, "v2, longer");
        expect_content(&mut rx, &file, "v2, longer").await;
        in_place_save(&file, "v3");
        expect_content(&mut rx, &file, "v3").await;
    }

    #[tokio::test]
    async fn saves_with_identical_content_send_nothing() {
        let (_dir, file) = setup("same");
        let (_w, mut rx) = FileWatcher::new(std::slice::from_ref(&file), DEBOUNCE).expect("watch");
        atomic_save(&file, "same");
        in_place_save(&file, "same");
        // Reading the file (as the reloader does) is no change either.
        let _ = fs::read_to_string(&file).expect("read");
        expect_quiet(&mut rx).await;
    }

    #[tokio::test]
    async fn unrelated_and_temp_files_send_nothing() {
        let (dir, file) = setup("v1");
        let (_w, mut rx) = FileWatcher::new(std::slice::from_ref(&file), DEBOUNCE).expect("watch");
        write(&dir.path().join("other.yaml"), "x");
        write(&dir.path().join(".pipeline.yaml.swp"), "x");
        write(&dir.path().join("pipeline.yaml~"), "x");
        expect_quiet(&mut rx).await;
    }

    #[tokio::test]
    async fn quick_writes_give_one_event() {
        let (_dir, file) = setup("v0");
        let (_w, mut rx) =
            FileWatcher::new(std::slice::from_ref(&file), Duration::from_millis(500))
                .expect("watch");
        for i in 1..=5 {
            in_place_save(&file, &format!("v{i}"));
        }
        let changed = expect_change(&mut rx).await;
        assert_eq!(changed.paths, vec![file.clone()]);
        assert_eq!(fs::read_to_string(&file).expect("read"), "v5");
        expect_quiet(&mut rx).await;
    }

    #[tokio::test]
    async fn a_deleted_file_is_a_change_and_so_is_its_return() {
        let (_dir, file) = setup("v1");
        let (_w, mut rx) = FileWatcher::new(std::slice::from_ref(&file), DEBOUNCE).expect("watch");
        fs::remove_file(&file).expect("remove");
        let changed = expect_change(&mut rx).await;
        assert_eq!(changed.paths, vec![file.clone()]);
        write(&file, "v1");
        expect_content(&mut rx, &file, "v1").await;
    }

    /// A Kubernetes ConfigMap volume: `pipeline.yaml -> ..data/pipeline.yaml`,
    /// `..data -> ..<timestamp>`; an update writes a new timestamped directory and renames a
    /// new `..data` link over the old one.
    #[cfg(unix)]
    fn configmap(dir: &Path, version: &str, text: &str) {
        let data = dir.join(version);
        fs::create_dir(&data).expect("mkdir");
        write(&data.join("pipeline.yaml"), text);
        let tmp = dir.join("..data_tmp");
        std::os::unix::fs::symlink(version, &tmp).expect("symlink");
        let old = fs::read_link(dir.join("..data")).ok();
        fs::rename(&tmp, dir.join("..data")).expect("swap");
        if let Some(old) = old {
            fs::remove_dir_all(dir.join(old)).expect("remove old version");
        }
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn configmap_symlink_swaps_are_seen() {
        let dir = tempfile::tempdir().expect("tempdir");
        configmap(dir.path(), "..2026_11_29_10_00_00.1", "v1");
        let file = dir.path().join("pipeline.yaml");
        std::os::unix::fs::symlink("..data/pipeline.yaml", &file).expect("symlink");
        let (w, mut rx) = FileWatcher::new(std::slice::from_ref(&file), DEBOUNCE).expect("watch");
        let root = fs::canonicalize(dir.path()).expect("canonical");
        assert_eq!(
            w.watched_dirs(),
            vec![root.clone(), root.join("..2026_11_29_10_00_00.1")]
        );

        configmap(dir.path(), "..2026_11_29_10_05_00.2", "v2");
        expect_content(&mut rx, &file, "v2").await;
        configmap(dir.path(), "..2026_11_29_10_10_00.3", "v3");
        expect_content(&mut rx, &file, "v3").await;
        // The watch moved to the new target directory: an edit there, which touches no link,
        // is seen too.
        let target = dir.path().join("..2026_11_29_10_10_00.3/pipeline.yaml");
        in_place_save(&target, "v4");
        expect_content(&mut rx, &file, "v4").await;
        assert_eq!(
            w.watched_dirs(),
            vec![root.clone(), root.join("..2026_11_29_10_10_00.3")]
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_path_through_a_symlinked_directory_follows_swaps() {
        let dir = tempfile::tempdir().expect("tempdir");
        configmap(dir.path(), "..v1", "v1");
        // The file named through the `..data` directory link, not through a file link.
        let file = dir.path().join("..data").join("pipeline.yaml");
        let (_w, mut rx) = FileWatcher::new(std::slice::from_ref(&file), DEBOUNCE).expect("watch");
        configmap(dir.path(), "..v2", "v2");
        expect_content(&mut rx, &file, "v2").await;
    }

    #[tokio::test]
    async fn a_script_file_in_another_directory_is_watched() {
        let (dir, file) = setup("v1");
        let scripts = dir.path().join("elsewhere/scripts");
        fs::create_dir_all(&scripts).expect("mkdir");
        let script = scripts.join("m.rhai");
        write(&script, "fn map(r) { r }");
        let files = vec![file.clone(), script.clone()];
        let (_w, mut rx) = FileWatcher::new(&files, DEBOUNCE).expect("watch");
        atomic_save(&script, "fn map(r) { r.x = 1; r }");
        let changed = expect_change(&mut rx).await;
        assert_eq!(changed.paths, vec![script.clone()]);
    }

    #[tokio::test]
    async fn set_files_starts_and_stops_watching() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::create_dir(&a).expect("mkdir");
        fs::create_dir(&b).expect("mkdir");
        let (fa, fb) = (a.join("p.yaml"), b.join("s.rhai"));
        write(&fa, "a1");
        write(&fb, "b1");
        let (mut w, mut rx) = FileWatcher::new(std::slice::from_ref(&fa), DEBOUNCE).expect("watch");
        let a_dir = fs::canonicalize(&a).expect("canonical");
        let b_dir = fs::canonicalize(&b).expect("canonical");
        assert_eq!(w.watched_dirs(), vec![a_dir.clone()]);

        // Not watched yet.
        in_place_save(&fb, "b2");
        expect_quiet(&mut rx).await;

        w.set_files(std::slice::from_ref(&fb)).expect("set files");
        assert_eq!(w.watched_dirs(), vec![b_dir]);
        assert_eq!(w.files(), vec![fb.clone()]);
        in_place_save(&fa, "a2");
        expect_quiet(&mut rx).await;
        in_place_save(&fb, "b3");
        expect_content(&mut rx, &fb, "b3").await;

        // Both: `fb` keeps its hash, `fa` is hashed anew.
        w.set_files(&[fa.clone(), fb.clone()]).expect("set files");
        expect_quiet(&mut rx).await;
        in_place_save(&fa, "a3");
        expect_content(&mut rx, &fa, "a3").await;
    }

    #[tokio::test]
    async fn a_removed_and_recreated_directory_is_watched_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = dir.path().join("conf");
        fs::create_dir(&conf).expect("mkdir");
        let file = conf.join("pipeline.yaml");
        write(&file, "v1");
        let (w, mut rx) = FileWatcher::new(std::slice::from_ref(&file), DEBOUNCE).expect("watch");

        fs::remove_dir_all(&conf).expect("rm -r");
        let changed = expect_change(&mut rx).await;
        assert_eq!(changed.paths, vec![file.clone()]);
        // While it is gone, its parent is watched.
        let root = fs::canonicalize(dir.path()).expect("canonical");
        assert_eq!(w.watched_dirs(), vec![root.clone()]);

        fs::create_dir(&conf).expect("mkdir");
        write(&file, "v2");
        expect_content(&mut rx, &file, "v2").await;
        // The new directory itself is watched again: a plain edit is seen.
        in_place_save(&file, "v3");
        expect_content(&mut rx, &file, "v3").await;
        assert_eq!(w.watched_dirs(), vec![root.join("conf")]);
    }

    #[tokio::test]
    async fn a_file_that_does_not_exist_yet_is_reported_when_created() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("later/pipeline.yaml");
        let (_w, mut rx) = FileWatcher::new(std::slice::from_ref(&file), DEBOUNCE).expect("watch");
        fs::create_dir(dir.path().join("later")).expect("mkdir");
        write(&file, "v1");
        expect_content(&mut rx, &file, "v1").await;
    }

    #[tokio::test]
    async fn dropping_the_watcher_closes_the_channel() {
        fn send_and_sync<T: Send + Sync>(_: &T) {}
        let (_dir, file) = setup("v1");
        let (w, mut rx) = FileWatcher::new(std::slice::from_ref(&file), DEBOUNCE).expect("watch");
        send_and_sync(&w);
        drop(w);
        let closed = tokio::time::timeout(EXPECT, rx.recv()).await;
        assert_eq!(closed, Ok(None));
    }

    #[cfg(unix)]
    #[test]
    fn resolve_notes_every_link_on_the_way() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = fs::canonicalize(dir.path()).expect("canonical");
        fs::create_dir(root.join("..v1")).expect("mkdir");
        write(&root.join("..v1/p.yaml"), "x");
        std::os::unix::fs::symlink("..v1", root.join("..data")).expect("symlink");
        std::os::unix::fs::symlink("..data/p.yaml", root.join("p.yaml")).expect("symlink");

        let r = resolve(&root.join("./p.yaml"));
        assert_eq!(r.dirs, vec![root.clone(), root.clone(), root.join("..v1")]);
        assert_eq!(
            r.paths,
            vec![
                root.join("p.yaml"),
                root.join("..data"),
                root.join("..v1/p.yaml")
            ]
        );

        // A plain file: its directory only; `..` after a link is taken from the target.
        let plain = resolve(&root.join("..data/../..v1/p.yaml"));
        assert_eq!(plain.dirs, vec![root.clone(), root.join("..v1")]);
        assert_eq!(plain.paths.last(), Some(&root.join("..v1/p.yaml")));

        // Missing components are kept as written.
        let missing = resolve(&root.join("nope/p.yaml"));
        assert_eq!(missing.dirs, vec![root.join("nope")]);
    }

    #[test]
    fn editor_temp_names() {
        for name in ["p.yaml~", ".p.yaml.swp", "p.yaml.tmp", ".#p.yaml", "4913"] {
            assert!(is_editor_temp(OsStr::new(name)), "{name}");
        }
        for name in ["p.yaml", "s.rhai", "49130"] {
            assert!(!is_editor_temp(OsStr::new(name)), "{name}");
        }
    }

    #[test]
    fn referenced_files_lists_script_files_relative_to_the_pipeline_file() {
        let yaml = r#"
version: 1
pipelines:
  - id: p
    sources:
      - {id: gen, type: generator, count: 1, fields: {n: {kind: sequence}}}
    operators:
      - {id: m, type: map, input: gen, script_file: scripts/m.rhai}
      - {id: f, type: filter, input: m, script: "fn filter(r) { true }"}
      - {id: m2, type: map, input: f, script_file: scripts/m.rhai}
      - {id: m3, type: map, input: m2, script_file: /abs/x.rhai}
    sinks:
      - {id: out, type: stdout, input: m3}
"#;
        let loaded = weir_schema::load_str("p.yaml", yaml);
        let spec = loaded.spec.expect("spec loads");
        assert_eq!(
            referenced_files(Path::new("conf/p.yaml"), &spec),
            vec![
                PathBuf::from("conf/p.yaml"),
                PathBuf::from("conf/scripts/m.rhai"),
                PathBuf::from("/abs/x.rhai"),
            ]
        );
        assert_eq!(
            referenced_files(Path::new("p.yaml"), &spec)[1],
            PathBuf::from("scripts/m.rhai")
        );
    }
}
