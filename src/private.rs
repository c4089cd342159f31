//! What esfs makes for itself (store and data directories, SQLite files,
//! redo log, journal, lock files, logs) is private to its owner whatever the
//! umask: directories 0700, files 0600. File contents and metadata are only
//! as private as the filesystem's own modes say through the mount.

use std::fs::{DirBuilder, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// `create_dir_all` with mode 0700 for what it creates.
pub(crate) fn dir_all(path: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(path)
}

/// `OpenOptions` creating files with mode 0600.
pub(crate) fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(0o600);
    o
}

/// `std::fs::write` creating the file with mode 0600.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?
        .write_all(bytes)
}

/// Create an empty file with mode 0600 unless it exists (SQLite then takes
/// it as a new database, and gives its -wal and -shm files its mode).
pub(crate) fn touch(path: &Path) -> io::Result<()> {
    match options().write(true).create_new(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// `dir` itself and what is directly in it that other users may access
/// (group or other permission bits): (path, mode) of each.
pub(crate) fn loose(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut check = |p: PathBuf| {
        if let Ok(md) = std::fs::symlink_metadata(&p)
            && !md.file_type().is_symlink()
            && md.mode() & 0o077 != 0
        {
            out.push((p, md.mode() & 0o7777));
        }
    };
    check(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            check(e.path());
        }
    }
    out
}

/// One line per directory with loose entries, for a warning.
pub(crate) fn loose_warnings(dirs: &[&Path]) -> Vec<String> {
    dirs.iter()
        .filter_map(|dir| {
            let l = loose(dir);
            let (first, mode) = l.first()?;
            Some(format!(
                "{} is open to other local users ({} with group/other permissions, e.g. {} mode {mode:04o}): chmod -R go= {}",
                dir.display(),
                l.len(),
                first.display(),
                dir.display()
            ))
        })
        .collect()
}
