//! FUSE glue: translate fuser callbacks into `Fs` calls and results into
//! replies. No filesystem logic lives here.
//!
//! Kernel caching: entry and attribute replies carry `ttl`. With the
//! embedded store this mount is the only writer, so every change passes
//! through the kernel, which keeps its caches right itself: long TTLs (60 s
//! by default), negative lookups cached, file pages kept across opens and
//! writes (no-open mode, no AUTO_INVAL_DATA) and directory listings cached
//! (FOPEN_CACHE_DIR) from a directory's second listing on. With
//! a shared store (Elasticsearch) other mounts change things behind the
//! kernel: 1 s TTLs (as JuiceFS) and none of the rest.

use crate::error::FsError;
use crate::fs::{Ctx, Fs, SetAttr, TimeSpec};
use crate::model::{Inode, Kind, ns_of, system_time};
use fuser::*;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub(crate) struct FuseFs {
    fs: Arc<Fs>,
    ttl: Duration,
    /// The store is this mount's alone (`Capabilities::single_writer`): the
    /// kernel may keep pages, skip OPEN/RELEASE and trust negative lookups,
    /// since nothing changes behind it.
    exclusive: bool,
    /// `-o writeback_cache`: the kernel's writeback-cache mode.
    writeback: bool,
    /// Directories opened once already (bounded: cleared when full).
    listed: Mutex<HashSet<u64>>,
}

/// Bound on `listed`: forgetting it only delays a directory's kernel cache.
const LISTED_MAX: usize = 1 << 16;

impl FuseFs {
    pub(crate) fn new(fs: Arc<Fs>, ttl: Duration, writeback: bool) -> FuseFs {
        FuseFs {
            exclusive: fs.capabilities().single_writer,
            fs,
            ttl,
            writeback,
            listed: Mutex::new(HashSet::new()),
        }
    }

    /// Whether `ino` was opened as a directory before (and remember it).
    fn listed_before(&self, ino: u64) -> bool {
        let mut l = self.listed.lock();
        if l.contains(&ino) {
            return true;
        }
        if l.len() >= LISTED_MAX {
            l.clear();
        }
        l.insert(ino);
        false
    }
}

fn errno(e: FsError) -> Errno {
    match &e {
        FsError::Io(msg) => log::error!("I/O error: {msg}"),
        FsError::Unavailable(msg) => log::warn!("store unavailable: {msg}"),
        _ => {}
    }
    Errno::from_i32(e.errno())
}

fn ctx(req: &Request) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::Char => FileType::CharDevice,
        Kind::Block => FileType::BlockDevice,
    }
}

pub(crate) fn attr(i: &Inode) -> FileAttr {
    FileAttr {
        ino: INodeNo(i.ino),
        size: i.size,
        blocks: i.blocks(),
        atime: system_time(i.atime_ns),
        mtime: system_time(i.mtime_ns),
        ctime: system_time(i.ctime_ns),
        crtime: system_time(i.btime_ns),
        kind: file_type(i.kind),
        perm: (i.mode & 0o7777) as u16,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: i.rdev,
        blksize: crate::fs::BLOCK_SIZE as u32,
        flags: 0,
    }
}

fn time(t: TimeOrNow) -> TimeSpec {
    match t {
        TimeOrNow::Now => TimeSpec::Now,
        TimeOrNow::SpecificTime(t) => TimeSpec::At(ns_of(t)),
    }
}

impl FuseFs {
    /// Reply with an entry; the kernel then holds a lookup reference.
    fn entry(&self, r: Result<Inode, FsError>, reply: ReplyEntry) {
        match r {
            Ok(i) => {
                self.fs.remember(i.ino);
                reply.entry(&self.ttl, &attr(&i), Generation(0))
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn empty(r: Result<(), FsError>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn xattr_reply(r: Result<Vec<u8>, FsError>, size: u32, reply: ReplyXattr) {
        match r {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Ask for what helps; a kernel without some of it still mounts.
        let mut caps = vec![
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_ASYNC_READ,
            InitFlags::FUSE_BIG_WRITES,
            InitFlags::FUSE_CACHE_SYMLINKS,
        ];
        if self.writeback {
            // (Only on exclusive mounts: every change passes through this
            // kernel.) The kernel owns file sizes and times and keeps
            // written pages: a read after a write needs no GETATTR, and
            // small writes reach us batched, at close or fsync at the
            // latest. But it also sends a SETATTR with the new ctime after
            // every rename, link and unlink of a file, hence opt-in.
            caps.push(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        if !self.exclusive {
            caps.extend([
                // Another mount may change a file behind the kernel: drop
                // its pages when its mtime moves. (With one mount every
                // change passes through the kernel, whose pages stay right:
                // a file just written is read back from them.)
                InitFlags::FUSE_AUTO_INVAL_DATA,
                // Locks go through us, so they hold across mounts. (With one
                // mount the kernel's own lock tables are exact, and needed:
                // in no-open mode no RELEASE would end a flock.)
                InitFlags::FUSE_POSIX_LOCKS,
                InitFlags::FUSE_FLOCK_LOCKS,
                // open(2) with O_TRUNC comes to us as one OPEN (not an
                // OPEN then a SETATTR without the handle), so the truncate
                // can wait for the close with the writes (see `Fs::open`).
                // Not in no-open mode, where no OPEN would carry it.
                InitFlags::FUSE_ATOMIC_O_TRUNC,
            ]);
        }
        for cap in caps {
            match config.add_capabilities(cap) {
                Ok(()) if cap == InitFlags::FUSE_WRITEBACK_CACHE => self.fs.kernel_keeps_times(),
                Ok(()) => {}
                Err(missing) => log::debug!("kernel lacks {missing:?}"),
            }
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(parent.0, name.as_bytes()) {
            Err(FsError::NotFound) if self.exclusive => {
                // Negative entry: ino 0 with a TTL lets the kernel cache "absent".
                reply.entry(&self.ttl, &attr(&placeholder()), Generation(0));
            }
            r => self.entry(r, reply),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if let Err(e) = self.fs.batch(|fs| {
            fs.forget(ino.0, nlookup);
            Ok(())
        }) {
            log::error!("forget {}: {e}", ino.0);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(i) => reply.attr(&self.ttl, &attr(&i)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time),
            mtime: mtime.map(time),
            ctime: ctime.map(ns_of),
            handle: fh.map(|h| h.0),
        };
        match self.fs.batch(|fs| fs.setattr(ctx(req), ino.0, set)) {
            Ok(i) => reply.attr(&self.ttl, &attr(&i)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        use crate::fs::NewNode;
        let node = match Kind::from_mode(mode) {
            Some(Kind::File) => NewNode::File,
            Some(Kind::Dir) | None => return reply.error(Errno::EINVAL),
            Some(Kind::Symlink) => return reply.error(Errno::EINVAL),
            Some(k) => NewNode::Special(k, rdev),
        };
        let r = self
            .fs
            .batch(|fs| fs.make_node(ctx(req), parent.0, name.as_bytes(), node, mode, umask));
        self.entry(r, reply)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.fs.batch(|fs| {
            fs.make_node(
                ctx(req),
                parent.0,
                name.as_bytes(),
                crate::fs::NewNode::Dir,
                mode,
                umask,
            )
        });
        self.entry(r, reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(
            self.fs.batch(|fs| fs.unlink(parent.0, name.as_bytes())),
            reply,
        )
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(
            self.fs.batch(|fs| fs.rmdir(parent.0, name.as_bytes())),
            reply,
        )
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let target = target.as_os_str().as_bytes();
        let r = self.fs.batch(|fs| {
            fs.make_node(
                ctx(req),
                parent.0,
                link_name.as_bytes(),
                crate::fs::NewNode::Symlink(target),
                0o777,
                0,
            )
        });
        self.entry(r, reply)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self.fs.batch(|fs| {
            fs.rename(
                parent.0,
                name.as_bytes(),
                newparent.0,
                newname.as_bytes(),
                flags.bits(),
            )
        });
        Self::empty(r, reply)
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self
            .fs
            .batch(|fs| fs.link(ino.0, newparent.0, newname.as_bytes()));
        self.entry(r, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.exclusive {
            // The kernel's no-open mode (ENOSYS here, once): from now on no
            // OPEN or RELEASE round trips, handle 0 on reads and writes, and
            // pages kept across opens. Close still sends FLUSH.
            return reply.error(Errno::ENOSYS);
        }
        match self.fs.batch(|fs| fs.open(ctx(req), ino.0, flags.0)) {
            Ok(fh) => reply.opened(FileHandle(fh), self.open_flags()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(ino.0, fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write(ino.0, fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        if self.fs.lazy_close() {
            // The kernel stops sending FLUSH (close(2) without a round
            // trip); written sizes and times are written back in batches
            // and journaled against a crash (see fs::journal).
            return reply.error(Errno::ENOSYS);
        }
        let r = self.fs.batch(|fs| {
            self.fs
                .unlock_owner(ino.0, lock_owner.0)
                .and_then(|()| fs.flush(ino.0, fh.0))
        });
        Self::empty(r, reply)
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        match self.fs.getlk(ino.0, lock_owner.0, start, end, typ) {
            Ok(Some(r)) => reply.locked(r.start, r.end, r.typ, r.pid),
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let want = crate::fs::plocks::Range {
            mount: String::new(),
            owner: lock_owner.0,
            pid,
            start,
            end,
            typ,
        };
        Self::empty(self.fs.batch(|fs| fs.setlk(ino.0, want, sleep)), reply)
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.fs.batch(|fs| {
            // flock locks belong to the open file and end with its release.
            if let Some(o) = lock_owner {
                fs.unlock_owner(ino.0, o.0)?;
            }
            fs.release(ino.0, fh.0)
        });
        Self::empty(r, reply)
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(self.fs.batch(|fs| fs.fsync(ino.0, fh.0)), reply)
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = self
            .fs
            .batch(|fs| fs.fallocate(ino.0, fh.0, offset, length, mode));
        Self::empty(r, reply)
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The kernel has checked the ranges (no overlap within a file,
        // both files on this mount) and passes no flags.
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let r = self.fs.batch(|fs| {
            fs.copy_file_range(
                ino_in.0, fh_in.0, offset_in, ino_out.0, fh_out.0, offset_out, len,
            )
        });
        match r {
            Ok(n) => {
                log::debug!(
                    "copy_file_range: {n} bytes of inode {} copied to inode {} in the data store",
                    ino_in.0,
                    ino_out.0
                );
                reply.written(n as u32)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    // Normal events on any filesystem that does not implement them, quiet
    // (fuser's defaults log a WARN for each: thousands on a desktop).

    /// No ioctls: ENOTTY, what an ioctl a file does not know gets (the
    /// kernel asks every time: isatty(3) on a file, lsattr, file managers).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        log::debug!("ioctl {cmd:#x}: ENOTTY");
        reply.error(Errno::ENOTTY)
    }

    /// Only SEEK_DATA/SEEK_HOLE reach here; ENOSYS makes the kernel use its
    /// generic lseek from then on (the whole file is data, holes read as
    /// zeros: correct, and what sparse-aware tools fall back to).
    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        log::debug!("lseek whence {whence}: ENOSYS, the kernel's generic lseek from now on");
        reply.error(Errno::ENOSYS)
    }

    /// ENOSYS: the kernel stops asking and reports regular files always
    /// ready, as for any file without a poll method.
    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        log::debug!("poll: ENOSYS, files always ready from now on");
        reply.error(Errno::ENOSYS)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.opendir(ino.0) {
            // One mount, one writer: the kernel may keep listings in its
            // page cache (it drops them itself when it changes the directory).
            // Filling that cache costs ~0.2 us a name and pays only when the
            // directory is listed again, so a one-pass walk (find, rm -rf,
            // rsync, a first ls) skips it; the second listing fills it.
            Ok(fh) if self.exclusive => {
                let cache = if self.listed_before(ino.0) {
                    FopenFlags::FOPEN_CACHE_DIR
                } else {
                    FopenFlags::empty()
                };
                reply.opened(FileHandle(fh), cache | FopenFlags::FOPEN_KEEP_CACHE)
            }
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.fs.readdir(ino.0, fh.0, offset, false, |it| {
            reply.add(
                INodeNo(it.ino),
                it.offset,
                file_type(it.kind),
                OsStr::from_bytes(it.name),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.fs.readdir(ino.0, fh.0, offset, true, |it| {
            let Some(a) = it.attr else { return false };
            let full = reply.add(
                INodeNo(it.ino),
                it.offset,
                OsStr::from_bytes(it.name),
                &self.ttl,
                &attr(a),
                Generation(0),
            );
            // Every entry but "." and ".." counts as a lookup.
            if !full && it.name != b"." && it.name != b".." {
                self.fs.remember(it.ino);
            }
            full
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
        reply.ok()
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(self.fs.fsyncdir(ino.0), reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        if position != 0 {
            return reply.error(Errno::EINVAL); // macOS resource forks only
        }
        let r = self
            .fs
            .batch(|fs| fs.setxattr(ino.0, name.as_bytes(), value, flags));
        Self::empty(r, reply)
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        Self::xattr_reply(self.fs.getxattr(ino.0, name.as_bytes()), size, reply)
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        Self::xattr_reply(self.fs.listxattr(ino.0), size, reply)
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(
            self.fs.batch(|fs| fs.removexattr(ino.0, name.as_bytes())),
            reply,
        )
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        Self::empty(self.fs.access(ctx(req), ino.0, mask.bits()), reply)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        if self.exclusive {
            // The kernel falls back to MKNOD and then opens in no-open
            // mode: no handle, so no RELEASE round trip at close.
            return reply.error(Errno::ENOSYS);
        }
        match self
            .fs
            .batch(|fs| fs.create(ctx(req), parent.0, name.as_bytes(), mode, umask))
        {
            Ok((i, fh)) => {
                self.fs.remember(i.ino);
                reply.created(
                    &self.ttl,
                    &attr(&i),
                    Generation(0),
                    FileHandle(fh),
                    self.open_flags(),
                )
            }
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl FuseFs {
    fn open_flags(&self) -> FopenFlags {
        if self.exclusive {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }
}

/// A throwaway inode for the negative-lookup reply (only its ino, 0, matters).
fn placeholder() -> Inode {
    Inode {
        ino: 0,
        kind: Kind::File,
        mode: 0,
        uid: 0,
        gid: 0,
        size: 0,
        nlink: 0,
        rdev: 0,
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        btime_ns: 0,
        target: None,
        xattrs: Default::default(),
        content: None,
        links: vec![],
        orphan: false,
        stored: None,
        map: None,
    }
}
