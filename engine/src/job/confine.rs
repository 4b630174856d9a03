//! What a control request may name on disk. The API is reachable by any local process (and,
//! without a token, by anything that can open a loopback connection), so a request never
//! chooses a path freely:
//!
//! - a reload compares only the running file, or a `.yaml`/`.yml` file under its directory
//!   ([`reload_file`]); any other path is refused before a byte of it is read, with the same
//!   answer whether it exists or not (no probing the disk through the API);
//! - a savepoint goes under the pipeline's savepoint root, `savepoints.dir`
//!   ([`savepoint_dir`]): a relative directory is relative to the root, an absolute one must
//!   lie inside it, `..` is refused and symlinks are resolved before the check; `weir run
//!   --allow-any-savepoint-dir` lifts the confinement. The same holds for a root on S3
//!   (`s3://bucket/prefix`): a relative directory goes below it, an `s3://` URL must lie
//!   under it (same bucket, below its prefix).
//!
//! Both return the resolved path, which is what the job then uses: the path checked is the
//! path written or read.

use std::io;
use std::path::{Component, Path, PathBuf};

use crate::checkpoint::s3::S3Location;
use crate::checkpoint::storage::validate_path;
use crate::control::ControlError;
use crate::plan::PipelinePlan;

/// The savepoint root of `plan`: its `savepoints.dir` (default `.weir/savepoints`) resolved
/// against the pipeline file's directory, absolute (resolved when the plan was compiled).
pub(crate) fn savepoint_root(plan: &PipelinePlan) -> PathBuf {
    plan.paths.savepoints.clone()
}

/// The directory a savepoint request for pipeline `pipeline` may write to: `requested`
/// resolved against `root` (symlinks resolved), and inside it unless `allow_any`.
///
/// # Errors
/// [`ControlError::Forbidden`] for a directory outside the root (or spelled with `..`),
/// [`ControlError::Invalid`] for one that cannot be resolved (a dangling symlink, a NUL byte).
pub(crate) fn savepoint_dir(
    pipeline: &str,
    root: &Path,
    requested: &Path,
    allow_any: bool,
) -> Result<PathBuf, ControlError> {
    let forbidden = |why: &str| {
        ControlError::Forbidden(format!(
            "savepoint directory `{}` {why}: requests may only write savepoints under \
             pipeline `{pipeline}`'s savepoint root `{}` (`savepoints.dir`; a relative \
             directory is relative to it). Name a directory inside it, change \
             `savepoints.dir`, or start `weir run` with --allow-any-savepoint-dir",
            requested.display(),
            root.display()
        ))
    };
    let remote_root = S3Location::parse(&root.to_string_lossy());
    let remote_requested = S3Location::parse(&requested.to_string_lossy());
    if remote_root.is_some() || remote_requested.is_some() {
        let invalid = |reason: String| {
            ControlError::Invalid(format!(
                "savepoint directory `{}`: {reason}",
                requested.display()
            ))
        };
        let root = remote_root.transpose().map_err(invalid)?;
        let wanted = match (remote_requested.transpose().map_err(invalid)?, &root) {
            (Some(location), _) => location,
            (None, Some(root)) if requested.is_relative() => {
                let text = requested.to_string_lossy();
                let text = text.trim_end_matches('/');
                validate_path(text)
                    .map_err(|_| forbidden("has an empty, `.` or `..` component"))?;
                root.join(text)
            }
            (None, _) if allow_any => return Ok(requested.to_path_buf()),
            (None, _) => return Err(forbidden("is outside the savepoint root")),
        };
        let inside = root.as_ref().is_some_and(|root| {
            wanted.bucket == root.bucket
                && (root.prefix.is_empty()
                    || wanted.prefix == root.prefix
                    || wanted
                        .prefix
                        .strip_prefix(root.prefix.as_str())
                        .is_some_and(|rest| rest.starts_with('/')))
        });
        return if inside || allow_any {
            Ok(PathBuf::from(wanted.to_string()))
        } else {
            Err(forbidden("is outside the savepoint root"))
        };
    }
    if !allow_any
        && requested
            .components()
            .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(forbidden("contains `..`"));
    }
    let wanted = root.join(requested);
    let resolved = resolve(&wanted).map_err(|e| {
        ControlError::Invalid(format!(
            "savepoint directory `{}` cannot be resolved: {e}",
            requested.display()
        ))
    })?;
    if allow_any {
        return Ok(resolved);
    }
    let root_resolved = resolve(root).map_err(|e| {
        ControlError::Failed(format!(
            "the savepoint root `{}` of pipeline `{pipeline}` cannot be resolved: {e}",
            root.display()
        ))
    })?;
    if resolved.starts_with(&root_resolved) {
        Ok(resolved)
    } else if wanted.starts_with(root) {
        Err(forbidden(&format!(
            "leads outside the root through a symlink (to `{}`)",
            resolved.display()
        )))
    } else {
        Err(forbidden("is outside the savepoint root"))
    }
}

/// The file a plan-only reload may compare with the running version: `requested` (relative
/// to the running file's directory) when it is the running file itself, or a `.yaml`/`.yml`
/// file under that directory (symlinks resolved). Returns its canonical path.
///
/// # Errors
/// [`ControlError::Forbidden`] for any other path, existing or not;
/// [`ControlError::Invalid`] for a file inside the directory that does not exist.
pub(crate) fn reload_file(running: &Path, requested: &Path) -> Result<PathBuf, ControlError> {
    let dir = running.parent().unwrap_or_else(|| Path::new("."));
    let wanted = dir.join(requested);
    let forbidden = || {
        ControlError::Forbidden(format!(
            "`{}` is not a file this job may read: a reload compares only the running file \
             `{}` or a `.yaml`/`.yml` file under its directory `{}`",
            requested.display(),
            running.display(),
            dir.display()
        ))
    };
    let canonical = match std::fs::canonicalize(&wanted) {
        Ok(c) => c,
        Err(e)
            if e.kind() == io::ErrorKind::NotFound
                && wanted.starts_with(dir)
                && !wanted
                    .components()
                    .any(|c| matches!(c, Component::ParentDir)) =>
        {
            return Err(ControlError::Invalid(format!(
                "no file `{}` to compare with the running version",
                wanted.display()
            )));
        }
        Err(_) => return Err(forbidden()),
    };
    let running_canonical = std::fs::canonicalize(running).ok();
    if running_canonical.as_deref() == Some(canonical.as_path()) {
        return Ok(canonical);
    }
    let dir_canonical = std::fs::canonicalize(dir).map_err(|_| forbidden())?;
    let yaml = canonical
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
    if yaml && canonical.starts_with(&dir_canonical) && canonical.is_file() {
        Ok(canonical)
    } else {
        Err(forbidden())
    }
}

/// `path` with every symlink resolved: its longest existing ancestor canonicalized, the
/// missing rest appended as written. An existing component that cannot be resolved (a
/// dangling symlink) is an error, so nothing is later created through it.
fn resolve(path: &Path) -> io::Result<PathBuf> {
    let path = std::path::absolute(path)?;
    for ancestor in path.ancestors() {
        if std::fs::symlink_metadata(ancestor).is_err() {
            continue;
        }
        let base = std::fs::canonicalize(ancestor)?;
        let rest = path.strip_prefix(ancestor).map_err(io::Error::other)?;
        return Ok(base.join(rest));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden<T: std::fmt::Debug>(r: Result<T, ControlError>) -> String {
        match r {
            Err(ControlError::Forbidden(m)) => m,
            other => panic!("expected forbidden, got {other:?}"),
        }
    }

    #[test]
    fn savepoint_dirs_stay_under_the_root() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonical");
        let root = base.join(".weir/savepoints");
        // Relative: under the root (which need not exist yet).
        assert_eq!(
            savepoint_dir("p", &root, Path::new("nightly/1"), false).expect("inside"),
            root.join("nightly/1")
        );
        assert_eq!(
            savepoint_dir("p", &root, &root.join("x"), false).expect("inside"),
            root.join("x")
        );
        assert_eq!(
            savepoint_dir("p", &root, &root, false).expect("the root"),
            root
        );
        // `..`, absolute paths elsewhere, and the root's sibling with the same prefix.
        let m = forbidden(savepoint_dir("p", &root, Path::new("../../etc"), false));
        assert!(
            m.contains("contains `..`") && m.contains("--allow-any-savepoint-dir"),
            "{m}"
        );
        forbidden(savepoint_dir("p", &root, Path::new("a/../b"), false));
        let m = forbidden(savepoint_dir("p", &root, Path::new("/etc/cron.d"), false));
        assert!(m.contains("outside the savepoint root"), "{m}");
        forbidden(savepoint_dir(
            "p",
            &root,
            &base.join(".weir/savepoints-evil"),
            false,
        ));
        // With the flag, anything goes, resolved.
        assert_eq!(
            savepoint_dir("p", &root, Path::new("/elsewhere/sp"), true).expect("allowed"),
            PathBuf::from("/elsewhere/sp")
        );
    }

    #[test]
    fn savepoint_dirs_on_s3_stay_under_an_s3_root() {
        let root = Path::new("s3://bucket/sp");
        let ok = |requested: &str, allow_any: bool| {
            savepoint_dir("p", root, Path::new(requested), allow_any)
                .expect("allowed")
                .to_string_lossy()
                .into_owned()
        };
        assert_eq!(ok("nightly/1", false), "s3://bucket/sp/nightly/1");
        assert_eq!(ok("s3://bucket/sp/x/", false), "s3://bucket/sp/x");
        assert_eq!(ok("s3://bucket/sp", false), "s3://bucket/sp");
        for outside in ["s3://bucket/spx", "s3://other/sp/x", "/tmp/sp", "a/../b"] {
            forbidden(savepoint_dir("p", root, Path::new(outside), false));
        }
        assert_eq!(ok("s3://other/x", true), "s3://other/x");
        assert_eq!(ok("/tmp/sp", true), "/tmp/sp");
        // An S3 URL under a local root only with the flag; a malformed one never.
        let local = Path::new("/jobs/.weir/savepoints");
        forbidden(savepoint_dir("p", local, Path::new("s3://bucket/x"), false));
        assert!(matches!(
            savepoint_dir("p", local, Path::new("s3:///x"), true),
            Err(ControlError::Invalid(_))
        ));
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_are_resolved_before_the_check() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonical");
        let root = base.join("sp");
        let outside = base.join("outside");
        std::fs::create_dir_all(&root).expect("root");
        std::fs::create_dir_all(&outside).expect("outside");
        std::os::unix::fs::symlink(&outside, root.join("escape")).expect("symlink");
        let m = forbidden(savepoint_dir("p", &root, Path::new("escape/x"), false));
        assert!(m.contains("through a symlink"), "{m}");
        // A dangling symlink is not created through.
        std::os::unix::fs::symlink(base.join("nowhere"), root.join("dangling")).expect("symlink");
        assert!(matches!(
            savepoint_dir("p", &root, Path::new("dangling/x"), false),
            Err(ControlError::Invalid(_))
        ));
        // A root that is itself a symlink is followed: its target is the root.
        let linked_root = base.join("linked");
        std::os::unix::fs::symlink(&root, &linked_root).expect("symlink");
        assert_eq!(
            savepoint_dir("p", &linked_root, Path::new("n"), false).expect("inside"),
            root.join("n")
        );
    }

    #[test]
    fn reloads_read_only_the_running_file_or_yaml_beside_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonical");
        let dir = base.join("job");
        std::fs::create_dir_all(dir.join("next")).expect("dirs");
        let running = dir.join("pipeline.conf");
        for f in [&running, &dir.join("next/v2.yaml"), &dir.join("secret.txt")] {
            std::fs::write(f, "version: 1\n").expect("write");
        }
        std::fs::write(base.join("other.yaml"), "x").expect("write");
        assert_eq!(reload_file(&running, &running).expect("itself"), running);
        assert_eq!(
            reload_file(&running, Path::new("pipeline.conf")).expect("itself, relative"),
            running
        );
        assert_eq!(
            reload_file(&running, Path::new("next/v2.yaml")).expect("yaml below"),
            dir.join("next/v2.yaml")
        );
        assert_eq!(
            reload_file(&running, &dir.join("next/v2.yaml")).expect("absolute"),
            dir.join("next/v2.yaml")
        );
        for outside in [
            PathBuf::from("/etc/passwd"),
            PathBuf::from("../other.yaml"),
            base.join("other.yaml"),
            PathBuf::from("secret.txt"),
            PathBuf::from("next"),
            PathBuf::from("/nonexistent/x.yaml"),
            PathBuf::from("../missing.yaml"),
        ] {
            let m = forbidden(reload_file(&running, &outside));
            assert!(m.contains("compares only the running file"), "{m}");
        }
        assert!(matches!(
            reload_file(&running, Path::new("next/v3.yaml")),
            Err(ControlError::Invalid(m)) if m.contains("no file")
        ));
    }

    #[cfg(unix)]
    #[test]
    fn a_yaml_symlink_out_of_the_directory_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonical");
        let dir = base.join("job");
        std::fs::create_dir_all(&dir).expect("dir");
        let running = dir.join("p.yaml");
        std::fs::write(&running, "version: 1\n").expect("write");
        std::os::unix::fs::symlink("/etc/passwd", dir.join("passwd.yaml")).expect("symlink");
        forbidden(reload_file(&running, Path::new("passwd.yaml")));
    }
}
