//! Open files' calls: open, read, write, copy_file_range, flush, fsync and
//! release (the states they act on are [`crate::fs::files`]'s), and
//! fsyncdir.

use crate::error::{FsError, FsResult};
use crate::fs::docs::stale;
use crate::fs::files::NO_HANDLE;
use crate::fs::{Ctx, Fs, SetAttr, TimeSpec};
use crate::model::Kind;
use crate::store::MetaStore;

impl Fs {
    /// open(2) of an existing inode. With O_TRUNC (the kernel leaves it to
    /// us on a shared store: FUSE_ATOMIC_O_TRUNC) the file is truncated
    /// through the new handle, which lets the data store keep the cut in
    /// memory until the close (see `Fs::truncate_in_memory`).
    pub fn open(&self, ctx: Ctx, ino: u64, flags: i32) -> FsResult<u64> {
        let (inode, version) = self.docs.inode(ino).map_err(stale)?;
        if inode.kind == Kind::Dir && flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(FsError::IsDir);
        }
        let fh = self.files.register(&inode, Some(version))?;
        if flags & libc::O_TRUNC != 0 && inode.kind == Kind::File {
            let set = SetAttr {
                size: Some(0),
                mtime: Some(TimeSpec::Now),
                // What the kernel's own truncate at open would drop (see
                // should_remove_suid): set-user-ID, and set-group-ID on a
                // group-executable file, unless the caller is root.
                mode: kill_suid(ctx, inode.mode),
                handle: Some(fh),
                ..Default::default()
            };
            if let Err(e) = self.setattr(ctx, ino, set) {
                let _ = self.files.release(ino, fh);
                return Err(e);
            }
        }
        Ok(fh)
    }

    pub fn read(&self, ino: u64, fh: u64, off: u64, size: u32) -> FsResult<Vec<u8>> {
        let (key, fsize) = self.files.open_file(ino, fh)?;
        if off >= fsize {
            return Ok(Vec::new());
        }
        let n = (fsize - off).min(size as u64) as usize;
        let mut buf = vec![0u8; n];
        // Bytes past what the store holds are a hole: they stay zero.
        self.data.read(&key, off, &mut buf)?;
        self.files.accessed(ino)?;
        Ok(buf)
    }

    pub fn write(&self, ino: u64, fh: u64, off: u64, data: &[u8]) -> FsResult<u32> {
        let (key, _) = self.files.open_file(ino, fh)?;
        let end = off.checked_add(data.len() as u64).ok_or(FsError::TooBig)?;
        self.files.write_range(ino, end, |ns| match ns {
            Some(ns) => self.data.write_stamped(&key, off, data, ns),
            None => self.data.write(&key, off, data),
        })?;
        Ok(data.len() as u32)
    }

    /// copy_file_range(2) within this filesystem: up to `len` bytes of
    /// `ino_in` from `off_in` (fewer at its end) to `ino_out` at `off_out`,
    /// copied inside the data store, never through the kernel. The
    /// destination changes as by a write (size, times, lazy-close state
    /// and journal); the kernel clears setuid/setgid first, as it does
    /// before a write. Returns the bytes copied.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        ino_in: u64,
        fh_in: u64,
        off_in: u64,
        ino_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        let (src, size) = self.files.open_file(ino_in, fh_in)?;
        let (dst, _) = self.files.open_file(ino_out, fh_out)?;
        if off_in >= size || len == 0 {
            return Ok(0);
        }
        // The reply counts bytes in 32 bits: a larger request is answered
        // in part, and the caller asks again for the rest.
        let n = len.min(size - off_in).min(u32::MAX as u64 & !0xfff);
        let end = off_out.checked_add(n).ok_or(FsError::TooBig)?;
        self.files.write_range(ino_out, end, |ns| {
            self.data.copy_range(&src, off_in, &dst, off_out, n, ns)
        })?;
        self.files.accessed(ino_in)?;
        Ok(n)
    }

    /// close(2) of one descriptor: make size and times visible in the store.
    pub fn flush(&self, ino: u64, fh: u64) -> FsResult<()> {
        self.files.check_handle(ino, fh)?;
        self.files.persist(ino)?;
        if fh == NO_HANDLE {
            // Made again on the next read or write (from the inode just
            // persisted): no state outlives its use.
            self.files.drop_state(ino)?;
        }
        Ok(())
    }

    pub fn fsync(&self, ino: u64, fh: u64) -> FsResult<()> {
        self.files.check_handle(ino, fh)?;
        if let Some(key) = self.files.content_key(ino)? {
            self.data.sync(&key)?;
        }
        self.files.persist(ino)?;
        // fsync writes a pending atime too, as under `lazytime`.
        if let Some(a) = self.pending.take_atime(ino) {
            match self.docs.update(ino, |i| {
                i.atime_ns = i.atime_ns.max(a);
                Ok(())
            }) {
                Ok(_) | Err(FsError::NotFound) => {}
                Err(e) => {
                    self.pending.restore_atime(ino, a);
                    return Err(e);
                }
            }
        }
        self.store.sync()?;
        Ok(())
    }

    /// fsync of a directory: its times waiting in memory are written first.
    pub fn fsyncdir(&self, ino: u64) -> FsResult<()> {
        if self.pending.dir_time_waits(ino) {
            self.batch(|fs| fs.docs.update(ino, |_| Ok(())).map(|_| ()))?;
        }
        self.store.sync()?;
        Ok(())
    }

    /// Last close of a handle; the last handle of an unlinked file deletes it.
    pub fn release(&self, ino: u64, fh: u64) -> FsResult<()> {
        self.files.release(ino, fh)
    }
}

/// The mode a truncate by `ctx` leaves a file of `mode` with, if it
/// drops set-user-ID or set-group-ID bits (as Linux's truncate does).
fn kill_suid(ctx: Ctx, mode: u32) -> Option<u32> {
    let sgid = libc::S_ISGID | libc::S_IXGRP;
    let mut kill = mode & libc::S_ISUID;
    if mode & sgid == sgid {
        kill |= libc::S_ISGID;
    }
    (kill != 0 && ctx.uid != 0).then_some(mode & 0o7777 & !kill)
}

#[cfg(test)]
mod tests {
    use crate::data::LocalDataStore;
    use crate::error::FsError;
    use crate::fs::{Ctx, Fs, FsConfig};
    use crate::model::{ROOT_INO, inode_id};
    use crate::store::cache::CachedStore;
    use crate::store::gated::Gated;
    use crate::store::{Idx, MetaStore};
    use std::sync::Arc;

    /// An `Fs` over a store whose requests a test can stop (`Gated`: a
    /// shared store, like Elasticsearch), contents in a local directory.
    fn gated_fs(dir: &std::path::Path, cfg: FsConfig) -> (Arc<Gated>, Arc<Fs>) {
        let store = Arc::new(Gated::open(&dir.join("store")));
        let data = Arc::new(LocalDataStore::open(&dir.join("data")).unwrap());
        let meta = Arc::new(CachedStore::off(store.clone()));
        (store, Arc::new(Fs::new(meta, data, cfg).unwrap()))
    }

    /// A getattr that read the inode just before a close persisted the
    /// file's size (and the overlay stopped) answered the older size; the
    /// kernel shrank the file to it, and the next O_APPEND write landed
    /// on earlier lines. It must read the inode again.
    #[test]
    fn getattr_across_a_persist_sees_the_persisted_size() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = FsConfig {
            label: "test".into(),
            ..Default::default()
        };
        let (store, fs) = gated_fs(dir.path(), cfg);
        let (inode, fh) = fs.create(Ctx::ROOT, ROOT_INO, b"log", 0o644, 0).unwrap();
        let ino = inode.ino;
        fs.write(ino, fh, 0, b"line\n").unwrap();
        let (stopped, go) = store.arm("get", Some(&inode_id(ino)));
        let stat = std::thread::spawn({
            let fs = fs.clone();
            move || fs.getattr(ino).unwrap().size
        });
        stopped.recv().unwrap(); // it read the inode of size 0
        fs.flush(ino, fh).unwrap();
        go.send(()).unwrap();
        assert_eq!(stat.join().unwrap(), 5);
        fs.release(ino, fh).unwrap();
    }

    /// An open(2) that read the inode before a rename over its name deleted
    /// it, and registered after, served the deleted contents as zeros (a
    /// shared store: nothing keeps an inode only the kernel names). It must
    /// answer ESTALE, so the kernel looks the name up again.
    #[test]
    fn open_across_a_deletion_of_its_inode_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let (store, fs) = gated_fs(dir.path(), FsConfig::default());
        assert!(!store.capabilities().single_writer);
        let (old, fh) = fs.create(Ctx::ROOT, ROOT_INO, b"target", 0o644, 0).unwrap();
        fs.write(old.ino, fh, 0, b"v0").unwrap();
        fs.release(old.ino, fh).unwrap();
        let (new, fh) = fs.create(Ctx::ROOT, ROOT_INO, b"tmp", 0o644, 0).unwrap();
        fs.write(new.ino, fh, 0, b"v1").unwrap();
        fs.release(new.ino, fh).unwrap();
        let (stopped, go) = store.arm("get", Some(&inode_id(old.ino)));
        let open = std::thread::spawn({
            let fs = fs.clone();
            move || fs.open(Ctx::ROOT, old.ino, libc::O_RDONLY)
        });
        stopped.recv().unwrap(); // it read the old inode
        fs.rename(ROOT_INO, b"tmp", ROOT_INO, b"target", 0).unwrap();
        go.send(()).unwrap();
        assert!(matches!(open.join().unwrap(), Err(FsError::Stale)));
    }

    /// A rename over a name whose inode the kernel holds (a path walk found
    /// it) keeps that inode until the kernel forgets it, on a shared store
    /// too: an open(2) of it racing the rename reads the old contents
    /// rather than failing with ESTALE (whose one retry by the kernel can
    /// race the next rename over the same name).
    #[test]
    fn a_renamed_over_inode_the_kernel_holds_opens_until_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let (store, fs) = gated_fs(dir.path(), FsConfig::default());
        let (old, fh) = fs.create(Ctx::ROOT, ROOT_INO, b"target", 0o644, 0).unwrap();
        fs.write(old.ino, fh, 0, b"v0").unwrap();
        fs.release(old.ino, fh).unwrap();
        fs.remember(old.ino);
        let (new, fh) = fs.create(Ctx::ROOT, ROOT_INO, b"tmp", 0o644, 0).unwrap();
        fs.write(new.ino, fh, 0, b"v1").unwrap();
        fs.release(new.ino, fh).unwrap();
        fs.rename(ROOT_INO, b"tmp", ROOT_INO, b"target", 0).unwrap();
        let fh = fs.open(Ctx::ROOT, old.ino, libc::O_RDONLY).unwrap();
        assert_eq!(fs.read(old.ino, fh, 0, 10).unwrap(), b"v0");
        fs.release(old.ino, fh).unwrap();
        assert!(
            store
                .get(Idx::Inodes, &inode_id(old.ino))
                .unwrap()
                .is_some()
        );
        fs.forget(old.ino, 1);
        fs.write_back.pass(&*fs); // which deletes forgotten orphans
        assert!(
            store
                .get(Idx::Inodes, &inode_id(old.ino))
                .unwrap()
                .is_none()
        );
    }
}
