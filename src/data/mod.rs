//! File contents, keyed by a stable content key (never by path), so renames
//! never move data. The inode document's `size` is the truth for the length;
//! the data store only has to return what was written (holes read as zeros).

pub mod chunks;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Capacity figures for statfs, in bytes and file slots.
#[derive(Clone, Copy, Debug, Default)]
pub struct Capacity {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub avail_bytes: u64,
    pub free_files: u64,
}

pub trait DataStore: Send + Sync {
    /// Read up to `buf.len()` bytes at `off`; returns how many bytes the store
    /// holds there (fewer at its end; the caller zero-fills up to the size).
    fn read(&self, key: &str, off: u64, buf: &mut [u8]) -> io::Result<usize>;
    fn write(&self, key: &str, off: u64, data: &[u8]) -> io::Result<()>;
    /// Make buffered writes durable against a crash of this process and
    /// visible to other mounts (called on every close, before the size is
    /// published). Stores that write through need do nothing.
    fn flush(&self, _key: &str) -> io::Result<()> {
        Ok(())
    }
    /// Length and modification time (ns) of what the store holds for
    /// `key`, where it keeps them (crash recovery of sizes; see
    /// `fs::journal`). None: absent, or not known to this store.
    fn stat(&self, _key: &str) -> io::Result<Option<(u64, i64)>> {
        Ok(None)
    }
    /// Make what `stat` reports as the modification time exactly `ns` (so
    /// it can stand in for a file's mtime that was not persisted yet).
    fn set_mtime(&self, _key: &str, _ns: i64) -> io::Result<()> {
        Ok(())
    }
    /// Set the length (extending leaves a hole).
    fn truncate(&self, key: &str, size: u64) -> io::Result<()>;
    /// Make the contents durable, also against power loss (fsync).
    fn sync(&self, key: &str) -> io::Result<()>;
    fn remove(&self, key: &str) -> io::Result<()>;
    /// Hint: the key is no longer open; resources held for it can go.
    fn release(&self, key: &str);
    fn capacity(&self) -> io::Result<Capacity>;
    /// Every key held (for fsck's orphan check).
    fn keys(&self) -> io::Result<Vec<String>>;
}

/// Contents as one sparse file per key under a directory (two-level fan-out
/// so no directory grows huge). pread/pwrite on cached descriptors.
pub struct LocalDataStore {
    root: PathBuf,
    files: Mutex<HashMap<String, Arc<File>>>,
}

/// Descriptors kept open at most; beyond this the cache is cleared (open
/// files re-open on their next access, which is cheap).
const MAX_OPEN: usize = 4096;

/// Writes this large are a stream (a big file being copied in): the kernel
/// keeps its pages in the mount's page cache already, so this store's file
/// need not be cached a second time.
const STREAM_WRITE: usize = 128 << 10;
/// Window of the drop-behind: written back while the next one is written,
/// dropped from the page cache one window later.
const WINDOW: u64 = 16 << 20;

/// At each window boundary a write crosses: start writing back the window
/// just finished, then wait for the one before (started a window ago, so
/// normally done) and drop its pages. Memory stays bounded for any file
/// size and a stream's data is not cached twice (which, on a machine where
/// fresh pages are expensive, halves write speed). Best effort: errors
/// only leave pages cached; fsync still reports any write error.
fn drop_behind(f: &File, start: u64, end: u64) {
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    let mut b = (start / WINDOW + 1) * WINDOW;
    while b <= end {
        // SAFETY: plain syscalls on a descriptor we own, no pointers.
        unsafe {
            libc::sync_file_range(
                fd,
                (b - WINDOW) as i64,
                WINDOW as i64,
                libc::SYNC_FILE_RANGE_WRITE,
            );
            if b >= 2 * WINDOW {
                let old = (b - 2 * WINDOW) as i64;
                libc::sync_file_range(
                    fd,
                    old,
                    WINDOW as i64,
                    libc::SYNC_FILE_RANGE_WAIT_BEFORE
                        | libc::SYNC_FILE_RANGE_WRITE
                        | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                );
                libc::posix_fadvise(fd, old, WINDOW as i64, libc::POSIX_FADV_DONTNEED);
            }
        }
        b += WINDOW;
    }
}

impl LocalDataStore {
    pub fn open(root: &Path) -> io::Result<LocalDataStore> {
        std::fs::create_dir_all(root)?;
        Ok(LocalDataStore {
            root: root.to_path_buf(),
            files: Mutex::new(HashMap::new()),
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        // Keys are decimal file ids; fan out on the low digits.
        let b = key.as_bytes();
        let fan = if b.len() >= 2 {
            &key[key.len() - 2..]
        } else {
            "00"
        };
        self.root.join(fan).join(key)
    }

    /// The descriptor for `key`; `create` makes the file when absent.
    fn file(&self, key: &str, create: bool) -> io::Result<Option<Arc<File>>> {
        if let Some(f) = self.files.lock().get(key) {
            return Ok(Some(f.clone()));
        }
        let path = self.path(key);
        let opened = OpenOptions::new().read(true).write(true).open(&path);
        let file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !create {
                    return Ok(None);
                }
                std::fs::create_dir_all(path.parent().expect("fan-out dir"))?;
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)?
            }
            Err(e) => return Err(e),
        };
        let file = Arc::new(file);
        let mut files = self.files.lock();
        if files.len() >= MAX_OPEN {
            files.clear();
        }
        files.insert(key.to_string(), file.clone());
        Ok(Some(file))
    }
}

impl DataStore for LocalDataStore {
    fn read(&self, key: &str, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let Some(f) = self.file(key, false)? else {
            return Ok(0);
        };
        let mut done = 0;
        while done < buf.len() {
            match f.read_at(&mut buf[done..], off + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn write(&self, key: &str, off: u64, data: &[u8]) -> io::Result<()> {
        let f = self.file(key, true)?.expect("created");
        f.write_all_at(data, off)?;
        if data.len() >= STREAM_WRITE {
            drop_behind(&f, off, off + data.len() as u64);
        }
        Ok(())
    }

    fn truncate(&self, key: &str, size: u64) -> io::Result<()> {
        if size == 0 && self.file(key, false)?.is_none() {
            return Ok(());
        }
        self.file(key, true)?.expect("created").set_len(size)
    }

    fn stat(&self, key: &str) -> io::Result<Option<(u64, i64)>> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(self.path(key)) {
            Ok(m) => Ok(Some((m.len(), m.mtime() * 1_000_000_000 + m.mtime_nsec()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn set_mtime(&self, key: &str, ns: i64) -> io::Result<()> {
        match self.file(key, false)? {
            Some(f) => f.set_modified(crate::model::system_time(ns)),
            None => Ok(()),
        }
    }

    fn sync(&self, key: &str) -> io::Result<()> {
        match self.file(key, false)? {
            Some(f) => f.sync_data(),
            None => Ok(()),
        }
    }

    fn remove(&self, key: &str) -> io::Result<()> {
        self.files.lock().remove(key);
        match std::fs::remove_file(self.path(key)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn release(&self, key: &str) {
        self.files.lock().remove(key);
    }

    fn capacity(&self) -> io::Result<Capacity> {
        let c = std::ffi::CString::new(self.root.as_os_str().as_encoded_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid NUL-terminated path and a zeroed out-struct.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let frsize = st.f_frsize;
        Ok(Capacity {
            total_bytes: st.f_blocks * frsize,
            free_bytes: st.f_bfree * frsize,
            avail_bytes: st.f_bavail * frsize,
            free_files: st.f_ffree,
        })
    }

    fn keys(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for fan in std::fs::read_dir(&self.root)? {
            let fan = fan?;
            if !fan.file_type()?.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(fan.path())? {
                out.push(f?.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_write_truncate_remove() {
        let dir = tempfile::tempdir().unwrap();
        let ds = LocalDataStore::open(dir.path()).unwrap();
        let mut buf = [7u8; 8];
        assert_eq!(ds.read("42", 0, &mut buf).unwrap(), 0);
        ds.write("42", 1 << 20, b"tail").unwrap();
        assert_eq!(ds.read("42", 0, &mut buf).unwrap(), 8);
        assert_eq!(buf, [0; 8]);
        assert_eq!(ds.read("42", (1 << 20) + 2, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"il");
        ds.truncate("42", 3).unwrap();
        assert_eq!(ds.read("42", 0, &mut buf).unwrap(), 3);
        ds.sync("42").unwrap();
        assert_eq!(ds.keys().unwrap(), vec!["42".to_string()]);
        ds.remove("42").unwrap();
        assert!(ds.keys().unwrap().is_empty());
        assert!(ds.capacity().unwrap().total_bytes > 0);
    }
}
