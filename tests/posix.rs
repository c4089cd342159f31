//! POSIX / Linux semantics checked through std::fs and raw syscalls.

mod common;

use common::*;
use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use libc::{EEXIST, EINVAL, EISDIR, ENAMETOOLONG, ENOENT, ENOTDIR, ENOTEMPTY, EPERM};

// ---------------------------------------------------------------- helpers

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let (f, t) = (cstr(from), cstr(to));
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn ino(p: impl AsRef<Path>) -> u64 {
    fs::symlink_metadata(p).unwrap().ino()
}

fn nlink(p: impl AsRef<Path>) -> u64 {
    fs::symlink_metadata(p).unwrap().nlink()
}

fn mode(p: impl AsRef<Path>) -> u32 {
    fs::symlink_metadata(p).unwrap().mode()
}

fn chmod(p: impl AsRef<Path>, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

fn chown(p: impl AsRef<Path>, uid: u32, gid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
}

fn names(dir: impl AsRef<Path>) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn umask() -> u32 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(line.split_whitespace().nth(1).unwrap(), 8).unwrap()
}

fn utimensat(p: &Path, times: [libc::timespec; 2], flags: libc::c_int) -> io::Result<()> {
    let c = cstr(p);
    check(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), flags) }).map(drop)
}

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

// ---------------------------------------------------------------- errno checks

#[test]
fn enoent_for_missing_paths() {
    let m = Mount::new();
    assert_eq!(errno(File::open(m.p("missing"))), ENOENT);
    assert_eq!(errno(fs::remove_file(m.p("missing"))), ENOENT);
    assert_eq!(errno(fs::remove_dir(m.p("missing"))), ENOENT);
    assert_eq!(errno(fs::symlink_metadata(m.p("missing"))), ENOENT);
    assert_eq!(errno(fs::rename(m.p("missing"), m.p("x"))), ENOENT);
    assert_eq!(errno(File::create(m.p("nodir/f"))), ENOENT);
    assert_eq!(errno(fs::create_dir(m.p("nodir/d"))), ENOENT);
    assert_eq!(errno(fs::hard_link(m.p("missing"), m.p("x"))), ENOENT);
    // A failed lookup must not be remembered once the name is created.
    File::create(m.p("missing")).unwrap();
    assert!(m.p("missing").is_file());
}

#[test]
fn eexist_for_existing_targets() {
    let m = Mount::new();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("f"), b"x").unwrap();
    symlink("nowhere", m.p("dangling")).unwrap();
    assert_eq!(errno(fs::create_dir(m.p("d"))), EEXIST);
    assert_eq!(errno(fs::create_dir(m.p("f"))), EEXIST);
    let excl = |p| OpenOptions::new().write(true).create_new(true).open(p);
    assert_eq!(errno(excl(m.p("f"))), EEXIST);
    assert_eq!(errno(excl(m.p("d"))), EEXIST);
    // O_EXCL does not follow symlinks, even dangling ones.
    assert_eq!(errno(excl(m.p("dangling"))), EEXIST);
    assert!(!m.p("nowhere").exists());
    assert_eq!(errno(fs::hard_link(m.p("f"), m.p("d"))), EEXIST);
    assert_eq!(errno(fs::hard_link(m.p("f"), m.p("f"))), EEXIST);
    assert_eq!(errno(symlink("t", m.p("f"))), EEXIST);
    assert_eq!(errno(symlink("t", m.p("d"))), EEXIST);
    assert_eq!(fs::read(m.p("f")).unwrap(), b"x");
}

#[test]
fn open_creat_through_dangling_symlink_creates_target() {
    let m = Mount::new();
    symlink("created_via_link", m.p("dangling")).unwrap();
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("dangling"))
        .unwrap()
        .write_all(b"hi")
        .unwrap();
    assert_eq!(fs::read(m.p("created_via_link")).unwrap(), b"hi");
    assert!(
        fs::symlink_metadata(m.p("dangling"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn enotdir_for_paths_through_files() {
    let m = Mount::new();
    fs::write(m.p("f"), b"x").unwrap();
    assert_eq!(errno(File::open(m.p("f/x"))), ENOTDIR);
    assert_eq!(errno(File::create(m.p("f/x"))), ENOTDIR);
    assert_eq!(errno(fs::create_dir(m.p("f/x"))), ENOTDIR);
    assert_eq!(errno(fs::symlink_metadata(m.p("f/"))), ENOTDIR);
    assert_eq!(errno(fs::remove_dir(m.p("f"))), ENOTDIR);
    assert_eq!(errno(fs::read_dir(m.p("f"))), ENOTDIR);
    let dir_flag = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(m.p("f"));
    assert_eq!(errno(dir_flag), ENOTDIR);
}

#[test]
fn eisdir_for_file_operations_on_dirs() {
    let m = Mount::new();
    fs::create_dir(m.p("d")).unwrap();
    assert_eq!(errno(OpenOptions::new().write(true).open(m.p("d"))), EISDIR);
    assert_eq!(
        errno(OpenOptions::new().read(true).write(true).open(m.p("d"))),
        EISDIR
    );
    assert_eq!(errno(File::create(m.p("d"))), EISDIR);
    // Linux returns EISDIR (not POSIX's EPERM) for unlink of a directory.
    assert_eq!(errno(fs::remove_file(m.p("d"))), EISDIR);
    // Reading a directory fd with read(2).
    let mut f = File::open(m.p("d")).unwrap();
    assert_eq!(errno(f.read(&mut [0u8; 16])), EISDIR);
    assert!(m.p("d").is_dir());
}

#[test]
fn enotempty_for_rmdir_and_rename_onto_nonempty_dir() {
    let m = Mount::new();
    fs::create_dir_all(m.p("full/sub")).unwrap();
    fs::create_dir(m.p("withfile")).unwrap();
    fs::write(m.p("withfile/f"), b"x").unwrap();
    fs::create_dir(m.p("src")).unwrap();
    assert_eq!(errno(fs::remove_dir(m.p("full"))), ENOTEMPTY);
    assert_eq!(errno(fs::remove_dir(m.p("withfile"))), ENOTEMPTY);
    assert_eq!(errno(fs::rename(m.p("src"), m.p("full"))), ENOTEMPTY);
    assert_eq!(errno(fs::rename(m.p("src"), m.p("withfile"))), ENOTEMPTY);
    // Nothing moved.
    assert!(m.p("src").is_dir() && m.p("full/sub").is_dir() && m.p("withfile/f").is_file());
    // Once emptied, rmdir works.
    fs::remove_file(m.p("withfile/f")).unwrap();
    fs::remove_dir(m.p("withfile")).unwrap();
}

#[test]
fn enametoolong_for_create_mkdir_rename() {
    let m = Mount::new();
    let long = m.p("n".repeat(256));
    fs::write(m.p("f"), b"x").unwrap();
    assert_eq!(errno(File::create(&long)), ENAMETOOLONG);
    assert_eq!(errno(fs::create_dir(&long)), ENAMETOOLONG);
    assert_eq!(errno(fs::rename(m.p("f"), &long)), ENAMETOOLONG);
    // Even a lookup of an over-long name fails this way, not with ENOENT.
    assert_eq!(errno(fs::symlink_metadata(&long)), ENAMETOOLONG);
    assert_eq!(names(m.path()), ["f"]);
}

#[test]
fn einval_renaming_dir_into_its_own_subtree() {
    let m = Mount::new();
    fs::create_dir_all(m.p("a/b/c")).unwrap();
    assert_eq!(errno(fs::rename(m.p("a"), m.p("a/x"))), EINVAL);
    assert_eq!(errno(fs::rename(m.p("a"), m.p("a/b/c/x"))), EINVAL);
    assert_eq!(errno(fs::rename(m.p("a/b"), m.p("a/b/c/x"))), EINVAL);
    assert!(m.p("a/b/c").is_dir());
    assert_eq!(names(m.p("a/b/c")), Vec::<String>::new());
}

#[test]
fn eperm_hard_link_to_directory() {
    let m = Mount::new();
    fs::create_dir(m.p("d")).unwrap();
    assert_eq!(errno(fs::hard_link(m.p("d"), m.p("d2"))), EPERM);
}

// ---------------------------------------------------------------- rename

#[test]
fn rename_file_onto_file_replaces() {
    let m = Mount::new();
    fs::write(m.p("a"), b"new").unwrap();
    fs::write(m.p("b"), b"old contents").unwrap();
    let a_ino = ino(m.p("a"));
    // Keep the victim open: its data must survive until closed.
    let mut victim = File::open(m.p("b")).unwrap();
    fs::rename(m.p("a"), m.p("b")).unwrap();
    assert_eq!(fs::read(m.p("b")).unwrap(), b"new");
    assert_eq!(ino(m.p("b")), a_ino);
    assert!(!m.p("a").exists());
    let mut s = String::new();
    victim.read_to_string(&mut s).unwrap();
    assert_eq!(s, "old contents");
    assert_eq!(victim.metadata().unwrap().nlink(), 0);
    assert_eq!(names(m.path()), ["b"]);
}

#[test]
fn rename_over_file_never_exposes_missing_target() {
    let m = Mount::new();
    let target = m.p("target");
    fs::write(&target, b"v0").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, target) = (stop.clone(), target.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let data = fs::read(&target).expect("target vanished during rename");
                assert!(data.starts_with(b"v"), "torn content {data:?}");
                reads += 1;
            }
            reads
        })
    };
    for i in 1..=300 {
        let tmp = m.p(format!("tmp{i}"));
        fs::write(&tmp, format!("v{i}")).unwrap();
        fs::rename(&tmp, &target).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().unwrap();
    assert!(reads > 0);
    assert_eq!(fs::read(&target).unwrap(), b"v300");
    assert_eq!(names(m.path()), ["target"]);
}

#[test]
fn rename_dir_onto_empty_dir_replaces() {
    let m = Mount::new();
    fs::create_dir_all(m.p("a/sub")).unwrap();
    fs::write(m.p("a/f"), b"x").unwrap();
    fs::create_dir(m.p("b")).unwrap();
    fs::rename(m.p("a"), m.p("b")).unwrap();
    assert!(!m.p("a").exists());
    assert_eq!(names(m.p("b")), ["f", "sub"]);
    assert_eq!(fs::read(m.p("b/f")).unwrap(), b"x");
    assert_eq!(nlink(m.path()), 3, "root: ., .., b");
}

#[test]
fn rename_between_file_and_dir_fails() {
    let m = Mount::new();
    fs::write(m.p("f"), b"x").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    assert_eq!(errno(fs::rename(m.p("f"), m.p("d"))), EISDIR);
    assert_eq!(errno(fs::rename(m.p("d"), m.p("f"))), ENOTDIR);
    assert!(m.p("f").is_file() && m.p("d").is_dir());
}

#[test]
fn rename_hard_link_onto_itself_is_a_noop() {
    let m = Mount::new();
    fs::write(m.p("a"), b"x").unwrap();
    fs::hard_link(m.p("a"), m.p("b")).unwrap();
    // POSIX: if both names refer to the same file, rename does nothing.
    fs::rename(m.p("a"), m.p("b")).unwrap();
    assert_eq!(names(m.path()), ["a", "b"]);
    assert_eq!(nlink(m.p("a")), 2);
    // Renaming a name onto itself too.
    fs::rename(m.p("a"), m.p("a")).unwrap();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"x");
}

#[test]
fn renameat2_noreplace() {
    let m = Mount::new();
    fs::write(m.p("a"), b"A").unwrap();
    fs::write(m.p("b"), b"B").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    assert_eq!(
        errno(renameat2(&m.p("a"), &m.p("b"), libc::RENAME_NOREPLACE)),
        EEXIST
    );
    assert_eq!(
        errno(renameat2(&m.p("d"), &m.p("b"), libc::RENAME_NOREPLACE)),
        EEXIST
    );
    assert_eq!(fs::read(m.p("a")).unwrap(), b"A");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"B");
    renameat2(&m.p("a"), &m.p("c"), libc::RENAME_NOREPLACE).unwrap();
    renameat2(&m.p("d"), &m.p("e"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(names(m.path()), ["b", "c", "e"]);
    assert_eq!(fs::read(m.p("c")).unwrap(), b"A");
}

#[test]
fn renameat2_exchange_files() {
    let m = Mount::new();
    fs::write(m.p("a"), b"AAA").unwrap();
    fs::write(m.p("b"), b"B").unwrap();
    let (ia, ib) = (ino(m.p("a")), ino(m.p("b")));
    renameat2(&m.p("a"), &m.p("b"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"B");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"AAA");
    assert_eq!((ino(m.p("a")), ino(m.p("b"))), (ib, ia));
    assert_eq!(
        errno(renameat2(&m.p("a"), &m.p("missing"), libc::RENAME_EXCHANGE)),
        ENOENT
    );
    assert_eq!(
        errno(renameat2(
            &m.p("a"),
            &m.p("b"),
            libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE
        )),
        EINVAL
    );
}

#[test]
fn renameat2_exchange_dirs_with_contents() {
    let m = Mount::new();
    fs::create_dir_all(m.p("p1/x/deep")).unwrap();
    fs::write(m.p("p1/x/one"), b"1").unwrap();
    fs::create_dir_all(m.p("p2/y")).unwrap();
    fs::write(m.p("p2/y/two"), b"2").unwrap();
    fs::write(m.p("p2/y/three"), b"3").unwrap();
    renameat2(&m.p("p1/x"), &m.p("p2/y"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(names(m.p("p1/x")), ["three", "two"]);
    assert_eq!(names(m.p("p2/y")), ["deep", "one"]);
    assert_eq!(fs::read(m.p("p2/y/one")).unwrap(), b"1");
    assert_eq!(fs::read(m.p("p1/x/two")).unwrap(), b"2");
    // ".." of each swapped directory follows it to its new parent.
    assert_eq!(ino(m.p("p1/x/..")), ino(m.p("p1")));
    assert_eq!(ino(m.p("p2/y/..")), ino(m.p("p2")));
    assert_eq!((nlink(m.p("p1")), nlink(m.p("p2"))), (3, 3));
}

#[test]
fn renameat2_exchange_file_with_dir_updates_parent_links() {
    let m = Mount::new();
    fs::create_dir_all(m.p("p1")).unwrap();
    fs::write(m.p("p1/f"), b"file").unwrap();
    fs::create_dir_all(m.p("p2/d/inner")).unwrap();
    assert_eq!((nlink(m.p("p1")), nlink(m.p("p2"))), (2, 3));
    renameat2(&m.p("p1/f"), &m.p("p2/d"), libc::RENAME_EXCHANGE).unwrap();
    assert!(m.p("p1/f").is_dir() && m.p("p1/f/inner").is_dir());
    assert_eq!(fs::read(m.p("p2/d")).unwrap(), b"file");
    // The directory moved from p2 to p1, taking its ".." link along.
    assert_eq!((nlink(m.p("p1")), nlink(m.p("p2"))), (3, 2));
    assert_eq!(ino(m.p("p1/f/..")), ino(m.p("p1")));
}

// ---------------------------------------------------------------- link counts

#[test]
fn directory_nlink_tracks_subdirectories() {
    let m = Mount::new();
    fs::create_dir(m.p("d")).unwrap();
    fs::create_dir(m.p("e")).unwrap();
    assert_eq!(nlink(m.p("d")), 2);
    fs::create_dir(m.p("d/c")).unwrap();
    assert_eq!(nlink(m.p("d")), 3);
    fs::create_dir(m.p("d/c2")).unwrap();
    fs::write(m.p("d/file"), b"").unwrap();
    assert_eq!(nlink(m.p("d")), 4, "files do not count");
    // Moving a subdirectory out and in updates both parents.
    fs::rename(m.p("d/c"), m.p("e/c")).unwrap();
    assert_eq!((nlink(m.p("d")), nlink(m.p("e"))), (3, 3));
    assert_eq!(ino(m.p("e/c/..")), ino(m.p("e")));
    fs::rename(m.p("e/c"), m.p("d/back")).unwrap();
    assert_eq!((nlink(m.p("d")), nlink(m.p("e"))), (4, 2));
    fs::remove_dir(m.p("d/c2")).unwrap();
    assert_eq!(nlink(m.p("d")), 3);
    // Renaming a file between directories changes no directory link count.
    fs::rename(m.p("d/file"), m.p("e/file")).unwrap();
    assert_eq!((nlink(m.p("d")), nlink(m.p("e"))), (3, 2));
}

#[test]
fn hard_link_counts_through_link_rename_unlink() {
    let m = Mount::new();
    fs::write(m.p("a"), b"shared").unwrap();
    fs::hard_link(m.p("a"), m.p("b")).unwrap();
    assert_eq!((nlink(m.p("a")), nlink(m.p("b"))), (2, 2));
    fs::hard_link(m.p("b"), m.p("c")).unwrap();
    assert_eq!(nlink(m.p("a")), 3);
    fs::rename(m.p("b"), m.p("renamed")).unwrap();
    assert_eq!(nlink(m.p("renamed")), 3);
    fs::remove_file(m.p("a")).unwrap();
    assert_eq!((nlink(m.p("c")), nlink(m.p("renamed"))), (2, 2));
    // Renaming over an unrelated file drops that file, not our count.
    fs::write(m.p("other"), b"o").unwrap();
    fs::rename(m.p("c"), m.p("other")).unwrap();
    assert_eq!(nlink(m.p("other")), 2);
    fs::remove_file(m.p("renamed")).unwrap();
    assert_eq!(nlink(m.p("other")), 1);
    assert_eq!(fs::read(m.p("other")).unwrap(), b"shared");
}

#[test]
fn link_and_unlink_change_ctime() {
    let m = Mount::new();
    fs::write(m.p("a"), b"x").unwrap();
    let c0 = ctime_ns(&stat(m.p("a")));
    let m0 = mtime_ns(&stat(m.p("a")));
    tick();
    fs::hard_link(m.p("a"), m.p("b")).unwrap();
    let c1 = ctime_ns(&stat(m.p("a")));
    assert_ne!(c1, c0, "link must change ctime");
    tick();
    fs::remove_file(m.p("b")).unwrap();
    let st = stat(m.p("a"));
    assert_ne!(ctime_ns(&st), c1, "unlink must change ctime");
    assert_eq!(mtime_ns(&st), m0, "link/unlink leave mtime alone");
    assert_eq!(st.st_nlink, 1);
}

#[test]
fn directory_timestamps_change_with_entries() {
    let m = Mount::new();
    fs::create_dir(m.p("d")).unwrap();
    fs::create_dir(m.p("e")).unwrap();
    let times = |p: &str| {
        let st = stat(m.p(p));
        (mtime_ns(&st), ctime_ns(&st))
    };
    type Step<'a> = (&'static str, Box<dyn Fn() + 'a>);
    let steps: Vec<Step> = vec![
        ("create", Box::new(|| fs::write(m.p("d/f"), b"x").unwrap())),
        ("mkdir", Box::new(|| fs::create_dir(m.p("d/sub")).unwrap())),
        ("symlink", Box::new(|| symlink("t", m.p("d/l")).unwrap())),
        (
            "link",
            Box::new(|| fs::hard_link(m.p("d/f"), m.p("d/f2")).unwrap()),
        ),
        (
            "rename within",
            Box::new(|| fs::rename(m.p("d/f2"), m.p("d/f3")).unwrap()),
        ),
        ("unlink", Box::new(|| fs::remove_file(m.p("d/f3")).unwrap())),
        ("rmdir", Box::new(|| fs::remove_dir(m.p("d/sub")).unwrap())),
    ];
    for (what, op) in steps {
        let before = times("d");
        tick();
        op();
        let after = times("d");
        assert_ne!(after.0, before.0, "{what}: dir mtime unchanged");
        assert_ne!(after.1, before.1, "{what}: dir ctime unchanged");
    }
    // Cross-directory rename touches both parents.
    let (d0, e0) = (times("d"), times("e"));
    tick();
    fs::rename(m.p("d/f"), m.p("e/f")).unwrap();
    assert_ne!(times("d").0, d0.0);
    assert_ne!(times("e").0, e0.0);
    // A time set explicitly wins over the one a new name just moved.
    fs::write(m.p("d/g"), b"x").unwrap();
    let c = cstr(m.p("d"));
    let t = [libc::timespec {
        tv_sec: 1_234_567_890,
        tv_nsec: 0,
    }; 2];
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), 0) },
        0
    );
    assert_eq!(stat(m.p("d")).st_mtime, 1_234_567_890);
    let after_set = times("d");
    tick();
    fs::remove_file(m.p("d/g")).unwrap();
    assert!(times("d").0 > after_set.0, "unlink after an explicit time");
}

#[test]
fn open_unlinked_file_stays_usable() {
    let m = Mount::new();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("f"))
        .unwrap();
    f.write_all(b"hello").unwrap();
    fs::remove_file(m.p("f")).unwrap();
    assert!(!m.p("f").exists());
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.write_all(b" world").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello world");
    f.set_len(3).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 3);
    // No placeholder name (like .fuse_hidden*) may show up in the directory.
    assert_eq!(names(m.path()), Vec::<String>::new());
    // The name is free for a new, unrelated file.
    fs::write(m.p("f"), b"new").unwrap();
    assert_eq!(f.read_at(&mut [0u8; 8], 0).unwrap(), 3);
    assert_eq!(fs::read(m.p("f")).unwrap(), b"new");
}

/// The tmpfile pattern: unlinked right after its open, before any write
/// reached esfs (in no-open mode esfs sees no OPEN, and with the writeback
/// cache a write waits in the kernel's page cache), the file stays usable
/// and its contents reach esfs and come back from it.
#[test]
fn file_unlinked_before_its_first_write_stays_usable() {
    let m = Mount::new();
    check_tmpfile_pattern(&m, 7);
    assert_eq!(names(m.path()), Vec::<String>::new());
}

/// On the embedded store the kernel opens files without asking esfs (its
/// no-open mode: no OPEN/RELEASE round trips). Files opened that way, by two
/// descriptors, written through one and read through the other, unlinked
/// while open: usable until the last close, and their contents reclaimed
/// once the kernel lets go of the inode.
#[test]
fn reopened_file_unlinked_while_open_then_reclaimed() {
    skip_in_plain_mode!("reopened_file_unlinked_while_open_then_reclaimed");
    // It counts the local data directory's files (no-open mode is the
    // embedded store's).
    embedded_only!("reopened_file_unlinked_while_open_then_reclaimed");
    local_data_only!("reopened_file_unlinked_while_open_then_reclaimed");
    let m = Mount::new();
    let data_files = || {
        use esfs::data::DataStore;
        let ds = esfs::data::LocalDataStore::open(&m.data_dir()).unwrap();
        ds.keys().unwrap().len()
    };
    fs::write(m.p("keep"), b"other").unwrap();
    fs::write(m.p("f"), b"hello").unwrap();
    assert_eq!(data_files(), 2);
    let mut a = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("f"))
        .unwrap();
    let mut b = File::open(m.p("f")).unwrap();
    fs::remove_file(m.p("f")).unwrap();
    assert!(!m.p("f").exists());
    a.seek(SeekFrom::End(0)).unwrap();
    a.write_all(b" world").unwrap();
    let mut s = String::new();
    b.read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello world");
    drop(a); // close: size and times persisted
    assert_eq!(b.metadata().unwrap().len(), 11);
    assert_eq!(b.metadata().unwrap().nlink(), 0);
    assert_eq!(b.read_at(&mut [0u8; 16], 6).unwrap(), 5);
    assert_eq!(data_files(), 2, "contents kept while a descriptor is open");
    drop(b);
    // The kernel forgets the inode soon after its last close.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while data_files() != 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(data_files(), 1, "contents of the unlinked file reclaimed");
    assert_eq!(fs::read(m.p("keep")).unwrap(), b"other");
}

// ---------------------------------------------------------------- timestamps

#[test]
fn write_and_truncate_update_mtime_and_ctime_chmod_only_ctime() {
    let m = Mount::new();
    let p = m.p("f");
    fs::write(&p, b"abc").unwrap();
    let s0 = stat(&p);
    tick();
    OpenOptions::new()
        .append(true)
        .open(&p)
        .unwrap()
        .write_all(b"def")
        .unwrap();
    let s1 = stat(&p);
    assert_ne!(mtime_ns(&s1), mtime_ns(&s0), "write: mtime");
    assert_ne!(ctime_ns(&s1), ctime_ns(&s0), "write: ctime");
    assert!(mtime_ns(&s1) > mtime_ns(&s0));
    tick();
    OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(1)
        .unwrap();
    let s2 = stat(&p);
    assert_ne!(mtime_ns(&s2), mtime_ns(&s1), "truncate: mtime");
    assert_ne!(ctime_ns(&s2), ctime_ns(&s1), "truncate: ctime");
    tick();
    chmod(&p, 0o600);
    let s3 = stat(&p);
    assert_eq!(mtime_ns(&s3), mtime_ns(&s2), "chmod must not change mtime");
    assert_ne!(ctime_ns(&s3), ctime_ns(&s2), "chmod: ctime");
    tick();
    // Reading changes neither.
    fs::read(&p).unwrap();
    let s4 = stat(&p);
    assert_eq!(
        (mtime_ns(&s4), ctime_ns(&s4)),
        (mtime_ns(&s3), ctime_ns(&s3))
    );
}

#[test]
fn utimensat_explicit_now_and_omit() {
    let m = Mount::new();
    let p = m.p("f");
    fs::write(&p, b"x").unwrap();
    let now_secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };

    // Explicit values are stored with full nanosecond precision.
    utimensat(
        &p,
        [
            ts(1_000_000_000, 111_111_111),
            ts(1_200_000_000, 987_654_321),
        ],
        0,
    )
    .unwrap();
    let st = stat(&p);
    assert_eq!(
        (st.st_atime, st.st_atime_nsec),
        (1_000_000_000, 111_111_111)
    );
    assert_eq!(mtime_ns(&st), (1_200_000_000, 987_654_321));
    // ctime is set to "now" by any attribute change.
    assert!(
        (st.st_ctime - now_secs()).abs() < 60,
        "ctime {}",
        st.st_ctime
    );

    // UTIME_OMIT leaves atime; explicit mtime applied.
    utimensat(&p, [ts(0, libc::UTIME_OMIT), ts(1_300_000_000, 5)], 0).unwrap();
    let st = stat(&p);
    assert_eq!(
        (st.st_atime, st.st_atime_nsec),
        (1_000_000_000, 111_111_111)
    );
    assert_eq!(mtime_ns(&st), (1_300_000_000, 5));

    // UTIME_NOW for mtime, UTIME_OMIT for atime.
    utimensat(&p, [ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_NOW)], 0).unwrap();
    let st = stat(&p);
    assert_eq!(
        (st.st_atime, st.st_atime_nsec),
        (1_000_000_000, 111_111_111)
    );
    assert!(
        (st.st_mtime - now_secs()).abs() < 60,
        "UTIME_NOW mtime {}",
        st.st_mtime
    );

    // Both OMIT: nothing changes, not even ctime.
    let before = stat(&p);
    tick();
    utimensat(&p, [ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_OMIT)], 0).unwrap();
    let after = stat(&p);
    assert_eq!(mtime_ns(&after), mtime_ns(&before));
    assert_eq!(
        (after.st_atime, after.st_atime_nsec),
        (before.st_atime, before.st_atime_nsec)
    );

    // UTIME_NOW for atime only.
    utimensat(&p, [ts(0, libc::UTIME_NOW), ts(0, libc::UTIME_OMIT)], 0).unwrap();
    let st = stat(&p);
    assert!((st.st_atime - now_secs()).abs() < 60);
    assert_eq!(mtime_ns(&st), mtime_ns(&after));
}

/// relatime: a read after a write moves atime; it shows at once, reaches
/// the store lazily (at the latest at unmount), and never overrides an
/// atime set explicitly afterwards.
#[test]
fn read_moves_atime_lazily_but_durably() {
    skip_in_plain_mode!("read_moves_atime_lazily_but_durably");
    let mut m = Mount::new();
    let p = m.p("f");
    let atime = |p: &Path| {
        let st = stat(p);
        (st.st_atime, st.st_atime_nsec)
    };
    fs::write(&p, b"abc").unwrap();
    let written = mtime_ns(&stat(&p));
    tick();
    // The kernel keeps the pages it wrote (writeback cache) and reads of
    // cached pages never reach esfs: drop them, so this one does.
    drop_cached_pages(&File::open(&p).unwrap());
    assert_eq!(fs::read(&p).unwrap(), b"abc");
    let read_at = atime(&p);
    assert!(
        read_at > written,
        "atime {read_at:?} after the read, mtime {written:?}"
    );
    // An explicit atime after the read wins over the pending one.
    utimensat(&p, [ts(1_000_000_000, 7), ts(0, libc::UTIME_OMIT)], 0).unwrap();
    assert_eq!(atime(&p), (1_000_000_000, 7));
    m.remount();
    let p = m.p("f");
    assert_eq!(atime(&p), (1_000_000_000, 7), "explicit atime kept");
    // Older than mtime now: the next read moves it, and a clean unmount
    // writes that back.
    let _ = fs::read(&p).unwrap();
    let moved = atime(&p);
    assert!(moved > written, "{moved:?}");
    m.remount();
    assert_eq!(
        atime(&m.p("f")),
        moved,
        "read's atime written back at unmount"
    );
    // A read's atime waits in memory (lazytime) until fsync writes it: it
    // survives a kill -9 after that.
    let p = m.p("f");
    utimensat(&p, [ts(1_000_000_000, 9), ts(0, libc::UTIME_OMIT)], 0).unwrap();
    let f = File::open(&p).unwrap();
    drop_cached_pages(&f);
    assert_eq!(fs::read(&p).unwrap(), b"abc");
    let read_at = atime(&p);
    assert!(read_at > written, "{read_at:?}");
    f.sync_all().unwrap();
    drop(f);
    m.kill9();
    m.start_again();
    assert_eq!(atime(&m.p("f")), read_at, "fsync wrote the read's atime");
}

#[test]
fn utimensat_nofollow_sets_symlink_times() {
    let m = Mount::new();
    fs::write(m.p("target"), b"x").unwrap();
    utimensat(
        &m.p("target"),
        [ts(1_000_000_000, 0), ts(1_000_000_000, 0)],
        0,
    )
    .unwrap();
    symlink("target", m.p("l")).unwrap();
    utimensat(
        &m.p("l"),
        [ts(1_100_000_000, 7), ts(1_100_000_000, 8)],
        libc::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    let l = lstat(m.p("l")).unwrap();
    assert_eq!(mtime_ns(&l), (1_100_000_000, 8));
    assert_eq!(mtime_ns(&stat(m.p("target"))), (1_000_000_000, 0));
}

// ---------------------------------------------------------------- creation modes

#[test]
fn create_and_mkdir_apply_mode_and_umask() {
    let m = Mount::new();
    let mask = umask();
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o777)
        .open(m.p("f"))
        .unwrap();
    assert_eq!(mode(m.p("f")) & 0o7777, 0o777 & !mask);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .open(m.p("g"))
        .unwrap();
    assert_eq!(mode(m.p("g")) & 0o7777, 0o640 & !mask);
    std::os::unix::fs::DirBuilderExt::mode(&mut fs::DirBuilder::new(), 0o751)
        .create(m.p("d"))
        .unwrap();
    assert_eq!(mode(m.p("d")) & 0o7777, 0o751 & !mask);
    assert_eq!(mode(m.p("f")) & libc::S_IFMT, libc::S_IFREG);
    assert_eq!(mode(m.p("d")) & libc::S_IFMT, libc::S_IFDIR);
    // Files and dirs created by root belong to root.
    let md = fs::metadata(m.p("f")).unwrap();
    assert_eq!((md.uid(), md.gid()), (0, 0));
}

// ---------------------------------------------------------------- permissions (as nobody)

/// A world-writable scratch directory that `nobody` can use.
fn public_dir(m: &Mount, name: &str) -> std::path::PathBuf {
    let d = m.p(name);
    fs::create_dir(&d).unwrap();
    chmod(&d, 0o777);
    d
}

#[test]
fn nobody_cannot_chmod_or_chown_others_files() {
    let m = Mount::new();
    let d = public_dir(&m, "pub");
    fs::write(d.join("rootfile"), b"x").unwrap();
    chmod(d.join("rootfile"), 0o666);

    let r = sh_nobody(&d, "chmod 777 rootfile");
    assert_failure_with("chmod 777 rootfile", &r, "Operation not permitted");
    let r = sh_nobody(&d, "chown 65534 rootfile");
    assert_failure_with("chown 65534 rootfile", &r, "Operation not permitted");
    assert_eq!(mode(d.join("rootfile")) & 0o7777, 0o666);

    // nobody's own file: owned by nobody, chmod allowed, giving it away is not.
    let r = sh_nobody(&d, "touch mine && chmod 600 mine");
    assert_success("touch mine && chmod 600 mine", &r);
    let md = fs::metadata(d.join("mine")).unwrap();
    assert_eq!(
        (md.uid(), md.gid(), md.mode() & 0o7777),
        (65534, 65534, 0o600)
    );
    let r = sh_nobody(&d, "chown 0 mine");
    assert_failure_with("chown 0 mine", &r, "Operation not permitted");
    let r = sh_nobody(&d, "chgrp 0 mine");
    assert_failure_with("chgrp 0 mine", &r, "Operation not permitted");
    // Setting the group to one's own group is allowed.
    assert_success("chgrp 65534 mine", &sh_nobody(&d, "chgrp 65534 mine"));
    let md = fs::metadata(d.join("mine")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
    // Root may give files away.
    chown(d.join("mine"), 0, 0);
    let md = fs::metadata(d.join("mine")).unwrap();
    assert_eq!((md.uid(), md.gid()), (0, 0));
}

#[test]
fn nobody_gets_eacces_from_mode_bits() {
    let m = Mount::new();
    // A root-owned 0755 directory with a 0600 and a 0644 file.
    let d = m.p("rootdir");
    fs::create_dir(&d).unwrap();
    chmod(&d, 0o755);
    fs::write(d.join("secret"), b"s").unwrap();
    chmod(d.join("secret"), 0o600);
    fs::write(d.join("public"), b"p").unwrap();
    chmod(d.join("public"), 0o644);

    for cmd in [
        "cat secret",
        "echo x >> public",
        "touch new",
        "mkdir newdir",
        "rm -f public",
        "mv public moved",
    ] {
        let r = sh_nobody(&d, cmd);
        assert_failure_with(cmd, &r, "Permission denied");
    }
    assert_eq!(sh_nobody(&d, "cat public").1, "p");
    assert_eq!(names(&d), ["public", "secret"]);
    assert_eq!(fs::read(d.join("public")).unwrap(), b"p");

    // 0700: no listing, no traversal. 0711: traversal but no listing.
    let closed = m.p("closed");
    fs::create_dir(&closed).unwrap();
    fs::write(closed.join("f"), b"c").unwrap();
    chmod(&closed, 0o700);
    let r = sh_nobody(m.path(), "ls closed");
    assert_failure_with("ls closed", &r, "Permission denied");
    let r = sh_nobody(m.path(), "cat closed/f");
    assert_failure_with("cat closed/f", &r, "Permission denied");
    chmod(&closed, 0o711);
    let r = sh_nobody(m.path(), "ls closed");
    assert_failure_with("ls closed (0711)", &r, "Permission denied");
    assert_eq!(sh_nobody(m.path(), "cat closed/f").1, "c");
}

#[test]
fn sticky_directory_protects_others_files() {
    let m = Mount::new();
    let d = m.p("tmp");
    fs::create_dir(&d).unwrap();
    chmod(&d, 0o1777);
    assert_eq!(mode(&d) & 0o7777, 0o1777);
    fs::write(d.join("rootf"), b"root").unwrap();
    chmod(d.join("rootf"), 0o666);

    for cmd in ["rm -f rootf", "mv rootf x", "touch own && mv own rootf"] {
        let r = sh_nobody(&d, cmd);
        assert_failure_with(cmd, &r, "Operation not permitted");
    }
    assert_eq!(fs::read(d.join("rootf")).unwrap(), b"root");
    // nobody's own files can be renamed and deleted.
    assert_success(
        "own file",
        &sh_nobody(&d, "touch own2 && mv own2 own3 && rm own3 && rm own"),
    );
    assert_eq!(names(&d), ["rootf"]);
    // Root can delete anyone's file in a sticky dir.
    assert_success("touch n", &sh_nobody(&d, "touch n"));
    fs::remove_file(d.join("n")).unwrap();
}

#[test]
fn chown_clears_setuid_and_setgid_even_for_root() {
    let m = Mount::new();
    let f = m.p("prog");
    fs::write(&f, b"#!/bin/sh\n").unwrap();
    chmod(&f, 0o6755);
    assert_eq!(mode(&f) & 0o7777, 0o6755);
    chown(&f, 65534, 65534);
    assert_eq!(
        mode(&f) & 0o7777,
        0o0755,
        "chown of a non-directory drops S_ISUID/S_ISGID"
    );

    // setgid without group-execute is not a privilege bit, so it stays.
    let g = m.p("lockish");
    fs::write(&g, b"").unwrap();
    chmod(&g, 0o2644);
    chown(&g, 65534, 65534);
    assert_eq!(mode(&g) & 0o7777, 0o2644);

    // Directories keep their setgid bit across chown.
    let d = m.p("dir");
    fs::create_dir(&d).unwrap();
    chmod(&d, 0o2755);
    chown(&d, 65534, 65534);
    assert_eq!(mode(&d) & 0o7777, 0o2755);
}

#[test]
fn write_by_non_root_clears_setuid() {
    let m = Mount::new();
    let d = public_dir(&m, "pub");
    let f = d.join("suid");
    fs::write(&f, b"x").unwrap();
    chmod(&f, 0o4777);
    // Root writing keeps the bit (CAP_FSETID).
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(b"y")
        .unwrap();
    assert_eq!(mode(&f) & 0o7777, 0o4777);
    assert_success("append", &sh_nobody(&d, "echo z >> suid"));
    assert_eq!(mode(&f) & 0o7777, 0o0777);
    assert_eq!(fs::read(&f).unwrap(), b"xyz\n");
}

#[test]
fn chmod_setgid_by_non_member_is_dropped() {
    let m = Mount::new();
    let d = public_dir(&m, "pub");
    assert_success("touch f", &sh_nobody(&d, "touch f"));
    // File owned by nobody but in group root, which nobody is not a member of.
    chown(d.join("f"), 65534, 0);
    assert_success("chmod 2755 f", &sh_nobody(&d, "chmod 2755 f"));
    assert_eq!(mode(d.join("f")) & 0o7777, 0o0755);
    // In its own group the bit sticks.
    chown(d.join("f"), 65534, 65534);
    assert_success("chmod 2755 f", &sh_nobody(&d, "chmod 2755 f"));
    assert_eq!(mode(d.join("f")) & 0o7777, 0o2755);
}

#[test]
fn setgid_directory_inheritance() {
    let m = Mount::new();
    let d = m.p("sg");
    fs::create_dir(&d).unwrap();
    chown(&d, 0, 65534);
    chmod(&d, 0o2775);
    fs::write(d.join("f"), b"").unwrap();
    fs::create_dir(d.join("sub")).unwrap();
    fs::write(d.join("sub/g"), b"").unwrap();
    symlink("f", d.join("l")).unwrap();

    let md = |p: &str| fs::symlink_metadata(d.join(p)).unwrap();
    assert_eq!(md("f").gid(), 65534, "file takes the directory's group");
    assert_eq!(md("l").gid(), 65534, "symlink takes the directory's group");
    assert_eq!(md("sub").gid(), 65534, "subdir takes the directory's group");
    assert_ne!(
        md("sub").mode() & libc::S_ISGID,
        0,
        "subdir inherits setgid"
    );
    assert_eq!(
        md("f").mode() & libc::S_ISGID,
        0,
        "plain file does not get setgid"
    );
    assert_eq!(md("sub/g").gid(), 65534);
    // Outside the setgid directory root's files stay in group root.
    fs::write(m.p("outside"), b"").unwrap();
    assert_eq!(fs::metadata(m.p("outside")).unwrap().gid(), 0);
    // A different user creating inside also gets the directory's group.
    chmod(&d, 0o2777);
    assert_success("touch byn", &sh_nobody(&d, "touch byn"));
    assert_eq!((md("byn").uid(), md("byn").gid()), (65534, 65534));
}

// ---------------------------------------------------------------- data

#[test]
fn truncate_up_reads_zeros_and_down_discards() {
    let m = Mount::new();
    let p = m.p("f");
    fs::write(&p, b"hello").unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    f.set_len(1 << 20).unwrap();
    let data = fs::read(&p).unwrap();
    assert_eq!(data.len(), 1 << 20);
    assert_eq!(&data[..5], b"hello");
    assert!(data[5..].iter().all(|&b| b == 0));
    f.set_len(3).unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"hel");
    // Growing again must not resurrect the discarded bytes.
    f.set_len(10).unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"hel\0\0\0\0\0\0\0");
    f.set_len(0).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
    // O_TRUNC on open also empties the file.
    fs::write(&p, b"again").unwrap();
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"");
}

#[test]
fn truncate_down_then_extend_within_a_block() {
    // Classic bug: stale bytes left past EOF in the last block reappear on extension.
    let m = Mount::new();
    let p = m.p("f");
    let data = pattern(10_000, 9);
    fs::write(&p, &data).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    f.set_len(5000).unwrap();
    f.write_at(b"Z", 7000).unwrap();
    let got = fs::read(&p).unwrap();
    assert_eq!(got.len(), 7001);
    assert_eq!(&got[..5000], &data[..5000]);
    assert!(got[5000..7000].iter().all(|&b| b == 0));
    assert_eq!(got[7000], b'Z');
}

#[test]
fn pwrite_beyond_eof_leaves_zero_hole() {
    let m = Mount::new();
    let p = m.p("f");
    fs::write(&p, b"abc").unwrap();
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    let off = 3 + (1 << 20);
    f.write_at(b"xyz", off).unwrap();
    drop(f);
    assert_eq!(fs::metadata(&p).unwrap().len(), off + 3);
    let data = fs::read(&p).unwrap();
    assert_eq!(&data[..3], b"abc");
    assert!(data[3..off as usize].iter().all(|&b| b == 0));
    assert_eq!(&data[off as usize..], b"xyz");
    // A read straddling the end of the hole.
    let mut buf = [1u8; 6];
    File::open(&p)
        .unwrap()
        .read_exact_at(&mut buf, off - 3)
        .unwrap();
    assert_eq!(&buf, b"\0\0\0xyz");
}

#[test]
fn large_file_roundtrip_and_overwrite() {
    let m = Mount::new();
    let p = m.p("big");
    let data = pattern(5 * (1 << 20) + 123, 7);
    {
        let mut f = File::create(&p).unwrap();
        // Odd chunk sizes so writes straddle block boundaries.
        for chunk in data.chunks(100_003) {
            f.write_all(chunk).unwrap();
        }
    }
    assert_eq!(fs::metadata(&p).unwrap().len(), data.len() as u64);
    assert!(
        fs::read(&p).unwrap() == data,
        "content mismatch after write"
    );

    let patch = pattern(10_000, 8);
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    f.write_at(&patch, 1_000_001).unwrap();
    let mut expect = data.clone();
    expect[1_000_001..1_010_001].copy_from_slice(&patch);
    for off in [0u64, 4095, 999_999, 1_005_000, 4 << 20] {
        let mut buf = vec![0u8; 20_000];
        f.read_exact_at(&mut buf, off).unwrap();
        assert!(
            buf == expect[off as usize..off as usize + 20_000],
            "mismatch at {off}"
        );
    }
    drop(f);
    assert!(
        fs::read(&p).unwrap() == expect,
        "content mismatch after overwrite"
    );
}

#[test]
fn append_mode_writes_at_end() {
    let m = Mount::new();
    let p = m.p("log");
    fs::write(&p, b"start\n").unwrap();
    let mut a = OpenOptions::new().append(true).open(&p).unwrap();
    let mut b = OpenOptions::new().append(true).open(&p).unwrap();
    a.write_all(b"a1\n").unwrap();
    b.write_all(b"b1\n").unwrap();
    a.write_all(b"a2\n").unwrap();
    assert_eq!(fs::read_to_string(&p).unwrap(), "start\na1\nb1\na2\n");
}

#[test]
fn fsync_and_fdatasync_succeed() {
    let m = Mount::new();
    let mut f = File::create(m.p("f")).unwrap();
    f.write_all(b"durable").unwrap();
    f.sync_all().unwrap();
    f.write_all(b"!").unwrap();
    f.sync_data().unwrap();
    fs::create_dir(m.p("d")).unwrap();
    File::open(m.p("d")).unwrap().sync_all().unwrap();
    File::open(m.path()).unwrap().sync_all().unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"durable!");
}

// ---------------------------------------------------------------- statfs, symlinks, readdir

#[test]
fn statvfs_reports_sane_values() {
    let m = Mount::new();
    let c = cstr(m.path());
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }).unwrap();
    assert!(sv.f_blocks > 0, "f_blocks");
    assert!(sv.f_bsize > 0 && sv.f_frsize > 0, "block size");
    assert!(sv.f_bavail <= sv.f_bfree && sv.f_bfree <= sv.f_blocks);
    assert_eq!(sv.f_namemax, 255);
    let out = sh_ok(m.path(), "df -P .");
    assert_eq!(out.lines().count(), 2, "{out}");
}

#[test]
fn symlink_targets_roundtrip() {
    let m = Mount::new();
    let long4000 = "abc/".repeat(1000);
    let max = "x".repeat(4095);
    let targets: Vec<&str> = vec![
        "a",
        "../up/and/over",
        "/absolute/path",
        "with space",
        "dots/./../x",
        &long4000,
        &max,
    ];
    for (i, t) in targets.iter().enumerate() {
        let l = m.p(format!("l{i}"));
        symlink(t, &l).unwrap();
        assert_eq!(fs::read_link(&l).unwrap().as_os_str(), *t);
        assert_eq!(
            fs::symlink_metadata(&l).unwrap().len(),
            t.len() as u64,
            "lstat size is target length"
        );
    }
    // PATH_MAX (4096) including the NUL caps the target length.
    assert_eq!(
        errno(symlink("y".repeat(4096), m.p("too_long"))),
        ENAMETOOLONG
    );
    assert_eq!(errno(fs::read_link(m.p("missing"))), ENOENT);
    fs::write(m.p("file"), b"").unwrap();
    assert_eq!(errno(fs::read_link(m.p("file"))), EINVAL);
}

#[test]
fn readdir_during_mutation_lists_stable_entries_once() {
    let m = Mount::new();
    let d = m.p("d");
    fs::create_dir(&d).unwrap();
    // Long names so the listing spans many getdents calls.
    let pad = "p".repeat(40);
    let keep: Vec<OsString> = (0..2000)
        .map(|i| format!("keep_{i:05}_{pad}").into())
        .collect();
    let mut victims: Vec<OsString> = (0..500)
        .map(|i| format!("victim_{i:05}_{pad}").into())
        .collect();
    // Interleave creation so victims sit among the kept entries whatever
    // order the filesystem lists in (hash, name or insertion order).
    for (i, k) in keep.iter().enumerate() {
        File::create(d.join(k)).unwrap();
        if i % 4 == 0 {
            File::create(d.join(&victims[i / 4])).unwrap();
        }
    }
    // Victims are deleted from both ends, i.e. both behind and ahead of the cursor.
    let mut seen: HashMap<OsString, usize> = HashMap::new();
    let mut created = 0;
    for (n, entry) in fs::read_dir(&d).unwrap().enumerate() {
        *seen.entry(entry.unwrap().file_name()).or_default() += 1;
        if n % 20 == 0 {
            if let Some(v) = victims.pop() {
                fs::remove_file(d.join(v)).unwrap();
            }
            if let Some(v) = victims.first().cloned() {
                victims.remove(0);
                fs::remove_file(d.join(v)).unwrap();
            }
            File::create(d.join(format!("new_{created:05}_{pad}"))).unwrap();
            created += 1;
        }
    }
    for k in &keep {
        assert_eq!(
            seen.get(k).copied(),
            Some(1),
            "{k:?} seen {:?} times",
            seen.get(k)
        );
    }
    let dups: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(dups.is_empty(), "duplicates: {dups:?}");
    assert!(created > 50);
    // Afterwards the listing is exactly the current set.
    let now: Vec<_> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(now.len(), keep.len() + victims.len() + created);
}

#[test]
fn fallocate_extends_keeps_size_and_refuses_punching() {
    use std::os::fd::AsRawFd;
    let m = Mount::new();
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.p("fa"))
        .unwrap();
    f.write_all_at(b"abc", 0).unwrap();
    let fd = f.as_raw_fd();
    // SAFETY: a valid descriptor and plain integer arguments.
    assert_eq!(unsafe { libc::fallocate(fd, 0, 0, 8192) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 8192);
    assert_eq!(
        unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20) },
        0
    );
    assert_eq!(f.metadata().unwrap().len(), 8192);
    let mut buf = [9u8; 8];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"abc\0\0\0\0\0");
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    if !m.is_plain() {
        assert_eq!(unsafe { libc::fallocate(fd, punch, 0, 4096) }, -1);
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
    }
}
