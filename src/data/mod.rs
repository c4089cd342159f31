//! File contents, keyed by a stable content key (never by path), so renames
//! never move data. The inode document's `size` is the truth for the length;
//! the data store only has to return what was written (holes read as zeros).

pub mod blocks;
pub(crate) mod chunks;
pub(crate) mod objects;
mod small;

use small::{INLINE_MAX, SmallFiles};

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::model::now_ns;
use crate::store::{BulkOp, Doc, Idx, Version};
use blocks::{BlockMap, Extent};

/// Where a file's first bytes are stored, named by [`DataStore::first_piece`].
#[derive(Clone, Debug)]
pub struct Piece {
    pub index: Idx,
    pub id: String,
    /// The store's state when named (what was written meanwhile wins).
    pub mark: u64,
}

/// A change of a file's block map whose blocks are uploaded but that is
/// not committed yet: what [`DataStore::stage`] hands the filesystem, which
/// applies it to the map in the inode document (`Inode::map`) in the same
/// versioned write as the size and times, re-applying it to the map it
/// re-reads on a conflict (last writer wins per byte range), then tells
/// the store with [`DataStore::committed`]. One write makes the length
/// and the map visible together, so no reader pairs one version's length
/// with another's map.
#[derive(Clone, Debug)]
pub struct MapChange {
    pub(crate) ops: Vec<MapOp>,
    /// The map to change when the inode document holds none: an older
    /// esfs's `<key>:map` document, moved into the inode by this commit.
    pub(crate) legacy: Option<Arc<BlockMap>>,
    /// The file was inline (chunk documents) until this change: its
    /// chunks go once it is committed.
    pub(crate) from_inline: bool,
    /// The store's sequence number of the last op included.
    pub(crate) upto: u64,
}

#[derive(Clone, Debug)]
pub(crate) enum MapOp {
    /// Fresh blocks written over what the map had there.
    Write(Vec<Extent>),
    Truncate(u64),
}

impl MapOp {
    pub(crate) fn apply(&self, m: &BlockMap) -> BlockMap {
        match self {
            MapOp::Write(extents) => m.write(extents),
            MapOp::Truncate(size) => m.truncate(*size),
        }
    }
}

impl MapChange {
    /// Apply the change to an inode document's `map` field: returns the
    /// map before (the inode's, else the legacy document's, else empty) and
    /// after. A file that had a map keeps the field, even empty: then no
    /// legacy document is ever consulted again for it.
    pub fn apply(&self, field: &mut Option<BlockMap>) -> (BlockMap, BlockMap) {
        let old = match (&*field, &self.legacy) {
            (Some(m), _) => m.clone(),
            (None, Some(l)) => (**l).clone(),
            (None, None) => BlockMap::default(),
        };
        let new = self.ops.iter().fold(old.clone(), |m, op| op.apply(&m));
        if field.is_some() || self.legacy.is_some() || !new.is_empty() {
            *field = Some(new.clone());
        }
        (old, new)
    }
}

/// What [`DataStore::audit`] found (one line per problem) and repaired.
#[derive(Default, Debug)]
pub struct StoreAudit {
    pub problems: Vec<String>,
    pub repaired: u64,
}

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
    /// [`DataStore::flush`] for a store whose contents are named by a map
    /// committed in the inode document: upload what is buffered and return
    /// the map change for the caller to commit with the size (then
    /// [`DataStore::committed`]). None: nothing to commit in the inode.
    fn stage(&self, key: &str) -> io::Result<Option<MapChange>> {
        self.flush(key).map(|()| None)
    }
    /// After `stage`: what it left for the caller to send in the bulk that
    /// persists the file's size (a truncate in memory with nothing written
    /// after it: the deletes of what it cut, which need not cost a request
    /// of their own), then [`DataStore::sent_with_size`] whatever came of
    /// it. Writes of the key wait until then.
    fn ride_with_size(&self, _key: &str) -> Vec<BulkOp> {
        Vec::new()
    }
    /// Whether what `ride_with_size` gave landed (if not, it goes again
    /// with the key's next write-out).
    fn sent_with_size(&self, _key: &str, _landed: bool) {}
    /// The inode document now holds `new`, made by `change` from `old`
    /// (what `MapChange::apply` returned on the write that landed): what
    /// `new` no longer names can be collected.
    fn committed(&self, _key: &str, _change: &MapChange, _old: &BlockMap, _new: &BlockMap) {}
    /// The inode document naming `key` with this map is deleted: its
    /// blocks can be collected (a crash before leaves them to fsck).
    fn removed(&self, _key: &str, _map: Option<&BlockMap>) {}
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
    /// `write`, then `set_mtime(ns)`: one step where the store can.
    fn write_stamped(&self, key: &str, off: u64, data: &[u8], ns: i64) -> io::Result<()> {
        self.write(key, off, data)?;
        self.set_mtime(key, ns)
    }
    /// Copy `len` bytes of `src` at `src_off` to `dst` at `dst_off` inside
    /// the store (copy_file_range), as `write` (`write_stamped` with `ns`)
    /// would. Past what `src` holds is a hole: zeros. Overlapping ranges
    /// of one key copy as memmove does. By default through a buffer (see
    /// [`copy_buffered`]); stores override it where they can do better.
    fn copy_range(
        &self,
        src: &str,
        src_off: u64,
        dst: &str,
        dst_off: u64,
        len: u64,
        ns: Option<i64>,
    ) -> io::Result<()> {
        copy_buffered(self, src, src_off, dst, dst_off, len, ns)
    }
    /// Bytes stored for `key` (st_blocks; holes are not stored), where
    /// this store knows it without a round trip: `known` is the figure in
    /// the inode document (as of the last write-back). None: unknown.
    fn stored_bytes(&self, _key: &str, known: Option<u64>) -> io::Result<Option<u64>> {
        Ok(known)
    }
    /// Set the length (extending leaves a hole).
    fn truncate(&self, key: &str, size: u64) -> io::Result<()>;
    /// `truncate` of a file open here (between `opening` and `release`),
    /// taken in memory like a buffered write: reads see it at once, and
    /// the store has it after the next `flush`/`stage` or `sync` (the
    /// caller persists the size then, as after a write). False: not taken
    /// (the caller truncates now).
    fn truncate_open(&self, _key: &str, _size: u64) -> io::Result<bool> {
        Ok(false)
    }
    /// Make the contents durable, also against power loss (fsync).
    fn sync(&self, key: &str) -> io::Result<()>;
    fn remove(&self, key: &str) -> io::Result<()>;
    /// `remove`, knowing the file held at most `size` bytes: a store that
    /// would search for a file's pieces may address them instead.
    fn remove_sized(&self, key: &str, size: u64) -> io::Result<()> {
        let _ = size;
        self.remove(key)
    }
    /// The metadata-store writes that delete `key`'s contents of `size`
    /// bytes, for a caller to send in the bulk that deletes its inode:
    /// None where the contents live elsewhere or are too many to address
    /// (then `remove_sized`). What this mount buffers of `key` is dropped.
    fn removal_ops(&self, _key: &str, _size: u64) -> Option<Vec<BulkOp>> {
        None
    }
    /// Hint: the key is no longer open; resources held for it can go.
    fn release(&self, key: &str);
    /// Hint, when a file is opened: nothing is stored for `key` at or past
    /// `size` (its length as this mount knows it), until `release`. A
    /// store that would read before writing a piece there (the chunk
    /// store's read-modify-write of a chunk) need not. `version`: the
    /// inode document's, when known; a piece `offer`ed with the same one
    /// serves this open's reads.
    /// `map`: the inode document's block map (`Inode::map`), read with
    /// the size, so a store keeping its map there needs no other read.
    fn opening(&self, _key: &str, _size: u64, _version: Option<Version>, _map: Option<&BlockMap>) {}
    /// The metadata-store document holding `key`'s first bytes, when the
    /// contents live in the metadata store and this store holds none of
    /// them in memory: a lookup of a small file reads it along with the
    /// inode, in one round trip, and hands it to `offer`.
    fn first_piece(&self, _key: &str) -> Option<Piece> {
        None
    }
    /// What the read of `first_piece`'s document answered, beside the inode
    /// (at `version`, `size` bytes long) read with it. Kept (briefly, bounded)
    /// for an `opening` of that inode version; dropped when it does not hold
    /// exactly `size` bytes (the read straddled another mount's write-out).
    fn offer(&self, _key: &str, _piece: Piece, _doc: Option<&Doc>, _size: u64, _version: Version) {}
    /// `read` for the content indexer, which reads a file soon after its
    /// last close: a store may answer from what that close wrote out.
    fn read_written(&self, key: &str, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.read(key, off, buf)
    }
    /// The metadata-store document holding all of `key`'s `size` bytes,
    /// when `read_written` would fetch it alone: the indexer reads it with
    /// its batch's entries (one request for the batch) and hands it to
    /// `offer_written`. None: nothing to read along (the contents live
    /// elsewhere, span pieces, or are held here).
    fn written_piece(&self, _key: &str, _size: u64) -> Option<Piece> {
        None
    }
    /// What the read of `written_piece`'s document answered: kept for the
    /// next `read_written` of `key` unless it does not hold exactly `size`
    /// bytes or this mount changed the contents since it was named.
    fn offer_written(&self, _key: &str, _piece: Piece, _doc: Option<&Doc>, _size: u64) {}
    fn capacity(&self) -> io::Result<Capacity>;
    /// Every key held (for fsck's orphan check).
    fn keys(&self) -> io::Result<Vec<String>>;
    /// fsck's check of what the store keeps beyond keys (object storage:
    /// blocks no map names, blocks a map names that are gone); with
    /// `repair`, what can be repaired is.
    fn audit(&self, _repair: bool) -> io::Result<StoreAudit> {
        Ok(StoreAudit::default())
    }
}

/// [`DataStore::copy_range`] a piece at a time through a buffer: the
/// bytes stay in this process (no round trip through the kernel).
pub fn copy_buffered<S: DataStore + ?Sized>(
    store: &S,
    src: &str,
    src_off: u64,
    dst: &str,
    dst_off: u64,
    len: u64,
    ns: Option<i64>,
) -> io::Result<()> {
    const PIECE: u64 = 1 << 20;
    // Destination after source within one key: copy from the end, so no
    // piece overwrites bytes still to be read.
    let backwards = src == dst && dst_off > src_off && dst_off < src_off + len;
    let mut buf = vec![0u8; PIECE.min(len) as usize];
    let mut done = 0;
    while done < len {
        let k = PIECE.min(len - done);
        let at = if backwards { len - done - k } else { done };
        let b = &mut buf[..k as usize];
        b.fill(0);
        store.read(src, src_off + at, b)?;
        match ns {
            Some(ns) => store.write_stamped(dst, dst_off + at, b, ns)?,
            None => store.write(dst, dst_off + at, b)?,
        }
        done += k;
    }
    Ok(())
}

/// Contents under a directory: small ones as rows of one SQLite database
/// (see `small`), the rest as one sparse file per key (two-level fan-out so
/// no directory grows huge), pread/pwrite on cached descriptors. A cached
/// descriptor means the key has no row (rows are only made for keys with
/// no file, and a file outlives its row), so reads and writes of big files
/// never touch the database.
pub struct LocalDataStore {
    root: PathBuf,
    files: Mutex<HashMap<String, Arc<File>>>,
    small: Mutex<SmallFiles>,
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
        crate::private::dir_all(root)?;
        Ok(LocalDataStore {
            root: root.to_path_buf(),
            files: Mutex::new(HashMap::new()),
            small: Mutex::new(SmallFiles::open(root)?),
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

    fn cached(&self, key: &str) -> Option<Arc<File>> {
        self.files.lock().get(key).cloned()
    }

    /// The descriptor of `key`'s file, for a key without a row (the caller
    /// checked, or holds the rows' lock); `create` makes the file when
    /// absent.
    fn file(&self, key: &str, create: bool) -> io::Result<Option<Arc<File>>> {
        if let Some(f) = self.cached(key) {
            return Ok(Some(f));
        }
        let path = self.path(key);
        let opened = OpenOptions::new().read(true).write(true).open(&path);
        let file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !create {
                    return Ok(None);
                }
                crate::private::dir_all(path.parent().expect("fan-out dir"))?;
                crate::private::options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)?
            }
            Err(e) => return Err(e),
        };
        Ok(Some(self.keep(key, file)))
    }

    fn keep(&self, key: &str, file: File) -> Arc<File> {
        let file = Arc::new(file);
        let mut files = self.files.lock();
        if files.len() >= MAX_OPEN {
            files.clear();
        }
        files.insert(key.to_string(), file.clone());
        file
    }

    /// A row outgrew [`INLINE_MAX`]: its bytes go to the key's file (any
    /// stale file from a crashed promotion is overwritten), `then` runs on
    /// the file, and the row goes last, in the transaction that read it.
    fn promote(
        &self,
        tx: small::Tx<'_>,
        key: &str,
        blob: &[u8],
        then: impl FnOnce(&File) -> io::Result<()>,
    ) -> io::Result<()> {
        self.files.lock().remove(key);
        let path = self.path(key);
        crate::private::dir_all(path.parent().expect("fan-out dir"))?;
        let f = crate::private::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        f.write_all_at(blob, 0)?;
        then(&f)?;
        tx.delete(key)?;
        tx.commit()?;
        self.keep(key, f);
        Ok(())
    }

    /// A write, its content's mtime set to `ns` when given (rows stamp
    /// the time of the write otherwise).
    fn write_at(&self, key: &str, off: u64, data: &[u8], ns: Option<i64>) -> io::Result<()> {
        if let Some(f) = self.cached(key) {
            return Self::write_file(&f, off, data, ns);
        }
        if data.is_empty() {
            // Nothing to store, and a row must not grow to `off`.
            return Ok(());
        }
        let end = off + data.len() as u64;
        let mut small = self.small.lock();
        let tx = small.begin()?;
        if let Some((mut blob, _)) = tx.get(key)? {
            if end <= INLINE_MAX {
                small::splice(&mut blob, off, data);
                tx.put(key, &blob, ns.unwrap_or_else(now_ns))?;
                return tx.commit();
            }
            return self.promote(tx, key, &blob, |f| Self::write_file(f, off, data, ns));
        }
        if end <= INLINE_MAX && self.file(key, false)?.is_none() {
            let mut blob = Vec::new();
            small::splice(&mut blob, off, data);
            tx.put(key, &blob, ns.unwrap_or_else(now_ns))?;
            return tx.commit();
        }
        // Made while the rows are locked, so no row appears beside it.
        let f = self.file(key, true)?.expect("created");
        drop(tx);
        drop(small);
        Self::write_file(&f, off, data, ns)
    }

    fn write_file(f: &File, off: u64, data: &[u8], ns: Option<i64>) -> io::Result<()> {
        f.write_all_at(data, off)?;
        if data.len() >= STREAM_WRITE {
            drop_behind(f, off, off + data.len() as u64);
        }
        match ns {
            Some(ns) => f.set_modified(crate::model::system_time(ns)),
            None => Ok(()),
        }
    }

    /// The files of a copy from `src` to `dst` ending at `end`, when both
    /// are (or `dst` is to become) files; None when a row is involved or
    /// `src` holds nothing (the buffered copy handles those).
    fn copy_files(
        &self,
        src: &str,
        dst: &str,
        end: u64,
    ) -> io::Result<Option<(Arc<File>, Arc<File>)>> {
        let from = match self.cached(src) {
            Some(f) => f,
            None if self.small.lock().get(src)?.is_some() => return Ok(None),
            None => match self.file(src, false)? {
                Some(f) => f,
                None => return Ok(None),
            },
        };
        if let Some(to) = self.cached(dst) {
            return Ok(Some((from, to)));
        }
        // As in `write_at`: the rows' lock keeps a row from appearing.
        let small = self.small.lock();
        if small.get(dst)?.is_some() {
            return Ok(None);
        }
        let to = match self.file(dst, false)? {
            Some(f) => f,
            None if end > INLINE_MAX => self.file(dst, true)?.expect("created"),
            None => return Ok(None),
        };
        drop(small);
        Ok(Some((from, to)))
    }

    /// copy_file_range(2) between two data files: the kernel copies (or
    /// shares) the blocks without them passing through this process. Past
    /// the end of `from` (a hole at the end of the file) `to` reads zeros.
    fn copy_file(from: &File, off_in: u64, to: &File, off_out: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let mut done = 0u64;
        while done < len {
            let (mut i, mut o) = ((off_in + done) as i64, (off_out + done) as i64);
            let want = (len - done).min(1 << 30) as usize;
            // SAFETY: valid descriptors and offsets owned by this call.
            let n = unsafe {
                libc::copy_file_range(from.as_raw_fd(), &mut i, to.as_raw_fd(), &mut o, want, 0)
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                break;
            }
            done += n as u64;
        }
        if done < len {
            // The source ended: the rest is a hole. Zeros over whatever
            // `to` holds there, a hole past its end.
            let (start, end) = (off_out + done, off_out + len);
            let held = to.metadata()?.len();
            let mut at = start;
            let zeros = vec![0u8; (1 << 20).min(len - done) as usize];
            while at < end.min(held) {
                let k = (end.min(held) - at).min(zeros.len() as u64) as usize;
                to.write_all_at(&zeros[..k], at)?;
                at += k as u64;
            }
            if held < end {
                to.set_len(end)?;
            }
        }
        Ok(())
    }

    fn read_file(f: &File, off: u64, buf: &mut [u8]) -> io::Result<usize> {
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
}

impl DataStore for LocalDataStore {
    fn read(&self, key: &str, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(f) = self.cached(key) {
            return Self::read_file(&f, off, buf);
        }
        if let Some((blob, _)) = self.small.lock().get(key)? {
            return Ok(small::read_from(&blob, off, buf));
        }
        match self.file(key, false)? {
            Some(f) => Self::read_file(&f, off, buf),
            None => Ok(0),
        }
    }

    fn write(&self, key: &str, off: u64, data: &[u8]) -> io::Result<()> {
        self.write_at(key, off, data, None)
    }

    fn write_stamped(&self, key: &str, off: u64, data: &[u8], ns: i64) -> io::Result<()> {
        self.write_at(key, off, data, Some(ns))
    }

    fn copy_range(
        &self,
        src: &str,
        src_off: u64,
        dst: &str,
        dst_off: u64,
        len: u64,
        ns: Option<i64>,
    ) -> io::Result<()> {
        // The kernel refuses overlapping ranges of one file.
        let overlap = src == dst && src_off < dst_off + len && dst_off < src_off + len;
        let end = dst_off + len;
        match self.copy_files(src, dst, end)? {
            Some((from, to)) if !overlap && len > 0 => {
                Self::copy_file(&from, src_off, &to, dst_off, len)?;
                match ns {
                    Some(ns) => to.set_modified(crate::model::system_time(ns)),
                    None => Ok(()),
                }
            }
            // Rows, a source holding nothing, or overlap.
            _ => copy_buffered(self, src, src_off, dst, dst_off, len, ns),
        }
    }

    fn truncate(&self, key: &str, size: u64) -> io::Result<()> {
        if let Some(f) = self.cached(key) {
            return f.set_len(size);
        }
        let mut small = self.small.lock();
        let tx = small.begin()?;
        if let Some((mut blob, _)) = tx.get(key)? {
            if size <= INLINE_MAX {
                blob.resize(size as usize, 0);
                tx.put(key, &blob, now_ns())?;
                return tx.commit();
            }
            return self.promote(tx, key, &blob, |f| f.set_len(size));
        }
        match self.file(key, false)? {
            Some(f) => f.set_len(size),
            None if size == 0 => Ok(()),
            None if size <= INLINE_MAX => {
                tx.put(key, &vec![0; size as usize], now_ns())?;
                tx.commit()
            }
            None => self.file(key, true)?.expect("created").set_len(size),
        }
    }

    /// A file's allocated blocks, a row's length: local calls only.
    fn stored_bytes(&self, key: &str, _known: Option<u64>) -> io::Result<Option<u64>> {
        use std::os::unix::fs::MetadataExt;
        if let Some(f) = self.cached(key) {
            return Ok(Some(f.metadata()?.blocks() * 512));
        }
        if let Some((blob, _)) = self.small.lock().get(key)? {
            return Ok(Some(blob.len() as u64));
        }
        match std::fs::metadata(self.path(key)) {
            Ok(m) => Ok(Some(m.blocks() * 512)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Some(0)),
            Err(e) => Err(e),
        }
    }

    fn stat(&self, key: &str) -> io::Result<Option<(u64, i64)>> {
        use std::os::unix::fs::MetadataExt;
        if self.cached(key).is_none()
            && let Some((blob, mtime)) = self.small.lock().get(key)?
        {
            return Ok(Some((blob.len() as u64, mtime)));
        }
        match std::fs::metadata(self.path(key)) {
            Ok(m) => Ok(Some((m.len(), m.mtime() * 1_000_000_000 + m.mtime_nsec()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn set_mtime(&self, key: &str, ns: i64) -> io::Result<()> {
        if self.cached(key).is_none() && self.small.lock().set_mtime(key, ns)? {
            return Ok(());
        }
        match self.file(key, false)? {
            Some(f) => f.set_modified(crate::model::system_time(ns)),
            None => Ok(()),
        }
    }

    fn sync(&self, key: &str) -> io::Result<()> {
        if self.cached(key).is_none() {
            let small = self.small.lock();
            if small.get(key)?.is_some() {
                return small.sync();
            }
        }
        match self.file(key, false)? {
            Some(f) => f.sync_data(),
            None => Ok(()),
        }
    }

    fn remove(&self, key: &str) -> io::Result<()> {
        self.files.lock().remove(key);
        // The file first: a crash in between leaves a row, which is the
        // content either way (an orphan for fsck), never a stale file
        // standing in for it.
        match std::fs::remove_file(self.path(key)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        self.small.lock().remove(key)
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
        let mut out = self.small.lock().keys()?;
        for fan in std::fs::read_dir(&self.root)? {
            let fan = fan?;
            if !fan.file_type()?.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(fan.path())? {
                out.push(f?.file_name().to_string_lossy().into_owned());
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// Whether the local data directory `dir` holds any file's contents (a
/// data file, or a row of the small-contents database), read without
/// creating anything. `stamp` names a file that is not contents. An empty
/// database (made by merely opening the directory, as older esfs did for
/// read-only commands) holds nothing; one that cannot be read counts.
pub fn holds_contents(dir: &Path, stamp: &str) -> bool {
    let db = ["small.db", "small.db-wal", "small.db-shm"];
    let files = std::fs::read_dir(dir).is_ok_and(|mut d| {
        d.any(|e| {
            e.is_ok_and(|e| {
                let n = e.file_name();
                n != stamp && !db.iter().any(|s| n == *s)
            })
        })
    });
    files || small::SmallFiles::has_rows(dir).unwrap_or(true)
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

    fn files_under(root: &Path) -> usize {
        std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .map(|d| std::fs::read_dir(d).unwrap().count())
            .sum()
    }

    fn read_all(ds: &LocalDataStore, key: &str) -> Vec<u8> {
        let mut buf = vec![0u8; 4 * INLINE_MAX as usize];
        let n = ds.read(key, 0, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn small_contents_are_rows_until_they_outgrow_them() {
        let dir = tempfile::tempdir().unwrap();
        let ds = LocalDataStore::open(dir.path()).unwrap();
        ds.write("7", 0, b"hello").unwrap();
        ds.write("7", 8, b"world").unwrap();
        assert_eq!(read_all(&ds, "7"), b"hello\0\0\0world");
        assert_eq!(files_under(dir.path()), 0, "a small content makes no file");
        ds.set_mtime("7", 1234).unwrap();
        assert_eq!(ds.stat("7").unwrap(), Some((13, 1234)));
        ds.write_stamped("7", 0, b"H", 5678).unwrap();
        assert_eq!(ds.stat("7").unwrap(), Some((13, 5678)));
        ds.write_stamped("7", 0, b"h", 1234).unwrap();
        ds.truncate("7", 4).unwrap();
        assert_eq!(read_all(&ds, "7"), b"hell");
        ds.truncate("8", 3).unwrap();
        assert_eq!(read_all(&ds, "8"), [0, 0, 0]);
        ds.sync("7").unwrap();
        assert_eq!(ds.keys().unwrap(), ["7", "8"]);

        // Growing past the limit moves the bytes to a file; the row goes.
        let big = vec![9u8; INLINE_MAX as usize];
        ds.write("7", 2, &big).unwrap();
        assert_eq!(files_under(dir.path()), 1);
        let got = read_all(&ds, "7");
        assert_eq!(&got[..2], b"he");
        assert_eq!(&got[2..], &big[..]);
        assert!(ds.small.lock().get("7").unwrap().is_none());
        // A file never turns back into a row, even when cut down, and a
        // fresh store (no cached descriptor) finds it.
        ds.truncate("7", 1).unwrap();
        ds.write_stamped("7", 0, b"h", 4321).unwrap();
        assert_eq!(ds.stat("7").unwrap(), Some((1, 4321)));
        drop(ds);
        let ds = LocalDataStore::open(dir.path()).unwrap();
        ds.write("7", 1, b"i").unwrap();
        assert_eq!(read_all(&ds, "7"), b"hi");
        assert_eq!(files_under(dir.path()), 1);
        assert_eq!(ds.keys().unwrap(), ["7", "8"]);
        // A truncate can promote too.
        ds.truncate("8", INLINE_MAX + 1).unwrap();
        assert_eq!(read_all(&ds, "8").len() as u64, INLINE_MAX + 1);
        for k in ["7", "8"] {
            ds.remove(k).unwrap();
        }
        assert!(ds.keys().unwrap().is_empty());
        assert_eq!(files_under(dir.path()), 0);
    }

    /// A promotion that died between writing the file and deleting the row
    /// leaves both: the row is the content, and the next promotion
    /// overwrites the stale file.
    #[test]
    fn a_row_wins_over_a_stale_file_of_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let ds = LocalDataStore::open(dir.path()).unwrap();
        ds.write("15", 0, b"row").unwrap();
        std::fs::create_dir_all(dir.path().join("15")).unwrap();
        std::fs::write(dir.path().join("15/15"), vec![1u8; 100_000]).unwrap();
        assert_eq!(read_all(&ds, "15"), b"row");
        assert_eq!(ds.stat("15").unwrap().unwrap().0, 3);
        ds.write("15", 3, b"!").unwrap();
        assert_eq!(read_all(&ds, "15"), b"row!");
        ds.write("15", INLINE_MAX, b"end").unwrap();
        let got = read_all(&ds, "15");
        assert_eq!(got.len() as u64, INLINE_MAX + 3);
        assert_eq!(&got[..4], b"row!");
        assert!(got[4..INLINE_MAX as usize].iter().all(|&b| b == 0));
        assert_eq!(ds.keys().unwrap(), ["15"]);
    }

    /// Mounts sharing a data directory see each other's rows.
    #[test]
    fn two_stores_on_one_directory_share_rows() {
        let dir = tempfile::tempdir().unwrap();
        let a = LocalDataStore::open(dir.path()).unwrap();
        let b = LocalDataStore::open(dir.path()).unwrap();
        a.write("3", 0, b"from a").unwrap();
        assert_eq!(read_all(&b, "3"), b"from a");
        b.write("3", 5, b"b, then a").unwrap();
        assert_eq!(read_all(&a, "3"), b"from b, then a");
        b.write("3", 0, &vec![5u8; INLINE_MAX as usize + 1])
            .unwrap();
        assert_eq!(read_all(&a, "3").len() as u64, INLINE_MAX + 1);
    }
}
