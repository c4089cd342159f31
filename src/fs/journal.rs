//! The unflushed-files journal: which files were written since their size
//! and times last reached the store.
//!
//! On a mount that is its store's only user, close(2) sends nothing to esfs
//! (no FLUSH), and the size/times writes left in memory reach the store in
//! batches a moment later (`WriteBack::write_back`). Contents never wait: every
//! write(2) is in the data store before it returns. So after a `kill -9`
//! only sizes and mtimes can lag their data, and only for the files named
//! here; the next mount takes them from the data store (`WriteBack::replay`).
//!
//! The journal is a small file of inode numbers next to the store: a file
//! is appended once (8 bytes) when it first turns dirty, and the file is
//! rewritten without the files whose state reached the store. Like the
//! store's WAL it survives the death of the process, not of the machine;
//! fsync is what survives a power cut, and it persists directly.
//!
//! A directory is also marked when a name made or removed in it moves its
//! times in memory (see `Pending::wait_dir_time`); the next mount then moves them to
//! its start. Once a write of the directory's inode that took those times
//! along is acknowledged (a `touch -d`, `cp -a` setting the directory's
//! times), an *unmark* record follows its mark: recovery must not replace
//! a time set after the mark. The last record of an inode decides.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

/// Set in a record that unmarks the inode in its low bits (inode numbers
/// never come near it).
const UNMARK: u64 = 1 << 63;

pub(crate) struct Journal {
    path: PathBuf,
    inner: Mutex<Inner>,
}

struct Inner {
    file: File,
    marked: HashSet<u64>,
}

impl Journal {
    /// Open (creating) the journal; also returns the inodes a previous life
    /// of the mount left marked, to be replayed before serving.
    pub(super) fn open(path: &Path) -> io::Result<(Journal, Vec<u64>)> {
        let left = Self::read(path)?;
        let file = Self::append_to(path)?;
        let marked = left.iter().copied().collect();
        let j = Journal {
            path: path.to_path_buf(),
            inner: Mutex::new(Inner { file, marked }),
        };
        Ok((j, left))
    }

    /// The inodes a journal names (none if it does not exist), without
    /// opening it for writing: `esfs fsck` reads a dead mount's journal.
    pub(crate) fn read(path: &Path) -> io::Result<Vec<u64>> {
        let mut left = Vec::new();
        match File::open(path) {
            Ok(mut f) => {
                let mut buf = Vec::new();
                f.read_to_end(&mut buf)?;
                // A torn last record (a crash inside the append) is dropped:
                // its write(2) had not returned. In order: an unmark only
                // cancels the marks before it.
                let mut set = std::collections::BTreeSet::new();
                for c in buf.chunks_exact(8) {
                    let r = u64::from_le_bytes(c.try_into().expect("8 bytes"));
                    if r & UNMARK != 0 {
                        set.remove(&(r & !UNMARK));
                    } else {
                        set.insert(r);
                    }
                }
                left.extend(set);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(left)
    }

    fn append_to(path: &Path) -> io::Result<File> {
        crate::private::options()
            .create(true)
            .append(true)
            .open(path)
    }

    /// `ino` has writes not in the store yet. One append per dirty period;
    /// afterwards a set lookup.
    pub(super) fn mark(&self, ino: u64) -> io::Result<()> {
        let mut g = self.inner.lock();
        if g.marked.contains(&ino) {
            return Ok(());
        }
        g.file.write_all(&ino.to_le_bytes())?;
        g.marked.insert(ino);
        Ok(())
    }

    /// Unmark those of `inos` that are marked and not `pending` (checked
    /// under the journal's lock, so a mark made concurrently is either
    /// seen pending or appended after the unmark): one append for all.
    pub(super) fn unmark(&self, inos: &[u64], pending: impl Fn(u64) -> bool) -> io::Result<()> {
        let mut g = self.inner.lock();
        let mut buf = Vec::new();
        for &ino in inos {
            if g.marked.contains(&ino) && !pending(ino) {
                g.marked.remove(&ino);
                buf.extend_from_slice(&(ino | UNMARK).to_le_bytes());
            }
        }
        if !buf.is_empty() {
            g.file.write_all(&buf)?;
        }
        Ok(())
    }

    /// Forget the marked files for which `clean` holds (their state is in
    /// the store), rewriting the file atomically (a new file renamed over
    /// the old, so a crash leaves one or the other, never fewer marks).
    pub(super) fn settle(&self, clean: impl Fn(u64) -> bool) -> io::Result<()> {
        let mut g = self.inner.lock();
        let before = g.marked.len();
        g.marked.retain(|&ino| !clean(ino));
        if g.marked.len() == before {
            return Ok(());
        }
        let tmp = self.path.with_extension("new");
        let mut buf = Vec::with_capacity(g.marked.len() * 8);
        for ino in &g.marked {
            buf.extend_from_slice(&ino.to_le_bytes());
        }
        crate::private::write(&tmp, &buf)?;
        std::fs::rename(&tmp, &self.path)?;
        g.file = Self::append_to(&self.path)?;
        Ok(())
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.inner.lock().marked.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_survive_reopen_until_settled() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("unflushed");
        let (j, left) = Journal::open(&p).unwrap();
        assert!(left.is_empty());
        for ino in [5, 7, 5, 9] {
            j.mark(ino).unwrap();
        }
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 24, "one record each");
        drop(j);
        let (j, left) = Journal::open(&p).unwrap();
        assert_eq!(left, vec![5, 7, 9]);
        j.settle(|ino| ino != 7).unwrap();
        j.mark(11).unwrap();
        drop(j);
        let (j, left) = Journal::open(&p).unwrap();
        assert_eq!(left, vec![7, 11]);
        j.settle(|_| true).unwrap();
        assert!(j.is_empty());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
    }

    #[test]
    fn an_unmark_cancels_the_marks_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("unflushed");
        let (j, _) = Journal::open(&p).unwrap();
        j.mark(5).unwrap();
        j.mark(7).unwrap();
        j.unmark(&[5, 7, 9], |ino| ino == 7).unwrap();
        assert!(!j.is_empty());
        j.mark(3).unwrap();
        drop(j);
        let (j, left) = Journal::open(&p).unwrap();
        assert_eq!(left, vec![3, 7]);
        j.unmark(&[3], |_| false).unwrap();
        j.mark(3).unwrap();
        drop(j);
        assert_eq!(Journal::read(&p).unwrap(), vec![3, 7], "marked again");
    }

    #[test]
    fn torn_record_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("unflushed");
        let mut bytes = 3u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&p, bytes).unwrap();
        let (_, left) = Journal::open(&p).unwrap();
        assert_eq!(left, vec![3]);
    }
}
