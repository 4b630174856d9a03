//! Preparing a scenario's files: copying a folder of pipelines without run output,
//! replacing a pipeline file the way editors save it, and appending to a growing input.

use std::path::Path;

/// Copies a folder recursively, leaving out run output (`out/`, `.weir/`).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name == "out" || name == ".weir" {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(&name));
        } else {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// Replaces `path` the way most editors save: write a temporary file, rename it over.
pub fn write_by_rename(path: &Path, text: &str) {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.swp"));
    std::fs::write(&tmp, text).expect("write the temporary file");
    std::fs::rename(&tmp, path).expect("rename over the pipeline file");
}

/// Appends `text` to `path`, creating the file and its directory when missing (an input that
/// grows while a run follows it).
pub fn append(path: &Path, text: &str) {
    use std::io::Write as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create the input directory");
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open an input file");
    f.write_all(text.as_bytes())
        .expect("append to an input file");
}
