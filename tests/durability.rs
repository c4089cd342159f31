//! Persistence across clean remounts and crashes (SIGKILL of the daemon).
//!
//! In plain mode remount/kill9 are no-ops, so these tests still check that the
//! fixture and the snapshot comparison agree with a real kernel filesystem.

mod common;

use common::*;
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

// ---------------------------------------------------------------- snapshots

/// Everything about one entry that must survive a remount (atime excluded:
/// reading it to take the snapshot may update it).
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    kind: char,
    mode: u32,
    uid: u32,
    gid: u32,
    /// None for directories: their size is implementation-defined.
    size: Option<u64>,
    nlink: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// FNV-1a of the content for regular files, symlink target otherwise.
    content: Option<u64>,
    target: Option<Vec<u8>>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn xattrs_of(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c = cstr(p);
    let len = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    assert!(
        len >= 0,
        "llistxattr {}: {}",
        p.display(),
        io::Error::last_os_error()
    );
    let mut buf = vec![0u8; len as usize];
    let len = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(len >= 0);
    buf.truncate(len as usize);
    let mut out = Vec::new();
    for name in buf.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let n = cstr(std::ffi::OsStr::from_bytes(name));
        let vlen = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
        assert!(vlen >= 0, "lgetxattr: {}", io::Error::last_os_error());
        let mut v = vec![0u8; vlen as usize];
        let vlen =
            unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(vlen >= 0);
        v.truncate(vlen as usize);
        out.push((name.to_vec(), v));
    }
    out.sort();
    out
}

fn entry(p: &Path) -> Entry {
    let md = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    let ft = md.file_type();
    let kind = if ft.is_dir() {
        'd'
    } else if ft.is_symlink() {
        'l'
    } else if ft.is_file() {
        'f'
    } else {
        '?'
    };
    Entry {
        kind,
        mode: md.mode(),
        uid: md.uid(),
        gid: md.gid(),
        size: (kind != 'd').then_some(md.size()),
        nlink: md.nlink(),
        mtime: (md.mtime(), md.mtime_nsec()),
        ctime: (md.ctime(), md.ctime_nsec()),
        content: (kind == 'f').then(|| fnv(&fs::read(p).unwrap())),
        target: (kind == 'l').then(|| fs::read_link(p).unwrap().as_os_str().as_bytes().to_vec()),
        xattrs: xattrs_of(p),
    }
}

type Snapshot = BTreeMap<Vec<u8>, Entry>;

/// Every entry under `root` (root itself under the empty name), keyed by relative path.
fn snapshot(root: &Path) -> Snapshot {
    fn walk(root: &Path, rel: &Path, out: &mut Snapshot) {
        let p = root.join(rel);
        let e = entry(&p);
        let is_dir = e.kind == 'd';
        out.insert(rel.as_os_str().as_bytes().to_vec(), e);
        if is_dir {
            for child in fs::read_dir(&p).unwrap() {
                walk(root, &rel.join(child.unwrap().file_name()), out);
            }
        }
    }
    let mut out = Snapshot::new();
    walk(root, Path::new(""), &mut out);
    out
}

fn inodes(root: &Path) -> BTreeMap<Vec<u8>, u64> {
    snapshot(root)
        .keys()
        .map(|k| {
            (
                k.clone(),
                fs::symlink_metadata(root.join(std::ffi::OsStr::from_bytes(k)))
                    .unwrap()
                    .ino(),
            )
        })
        .collect()
}

/// Compare snapshots and list every difference, rather than dumping both maps.
#[track_caller]
fn assert_same(before: &Snapshot, after: &Snapshot) {
    let mut diffs = Vec::new();
    for (k, b) in before {
        let name = String::from_utf8_lossy(k);
        match after.get(k) {
            None => diffs.push(format!("missing: {name:?}")),
            Some(a) if a != b => diffs.push(format!(
                "changed: {name:?}\n   before {b:?}\n   after  {a:?}"
            )),
            Some(_) => {}
        }
    }
    for k in after.keys().filter(|k| !before.contains_key(*k)) {
        diffs.push(format!("unexpected: {:?}", String::from_utf8_lossy(k)));
    }
    assert!(
        diffs.is_empty(),
        "{} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

/// After a crash: as `assert_same`, except that a directory's mtime and
/// ctime may have moved forward. They follow the names made and removed in
/// it, which wait in memory for the write-back like a closed file's size;
/// the journal names such directories and the next mount moves their times
/// to its own start: later than what was lost, never earlier.
#[track_caller]
fn assert_same_after_crash(before: &Snapshot, after: &Snapshot) {
    let mut after = after.clone();
    for (k, b) in before {
        if let Some(a) = after.get_mut(k)
            && a.kind == 'd'
            && b.kind == 'd'
        {
            assert!(
                a.mtime >= b.mtime && a.ctime >= b.ctime,
                "{:?}: directory times went back: {b:?} -> {a:?}",
                String::from_utf8_lossy(k)
            );
            (a.mtime, a.ctime) = (b.mtime, b.ctime);
        }
    }
    assert_same(before, &after);
}

fn without(mut s: Snapshot, skip: impl Fn(&[u8]) -> bool) -> Snapshot {
    s.retain(|k, _| !skip(k));
    s
}

// ---------------------------------------------------------------- fixture

fn chmod(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

fn set_mtime(p: &Path, sec: i64, nsec: i64, nofollow: bool) {
    let c = cstr(p);
    let t = [
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
    ];
    let flags = if nofollow {
        libc::AT_SYMLINK_NOFOLLOW
    } else {
        0
    };
    check(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), flags) }).unwrap();
}

fn setx(p: &Path, name: &str, val: &[u8]) {
    let (c, n) = (cstr(p), cstr(name));
    check(unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), val.as_ptr().cast(), val.len(), 0) })
        .unwrap();
}

/// A tree exercising every kind of state the filesystem keeps. Files are
/// closed (some fsync'd) by the time this returns.
fn populate(root: &Path) {
    let p = |rel: &str| root.join(rel);
    fs::write(p("hello.txt"), b"hello\n").unwrap();
    fs::write(p("empty"), b"").unwrap();
    let mut f = File::create(p("synced.bin")).unwrap();
    f.write_all(&pattern(300_000, 1)).unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::write(p("large.bin"), pattern((3 << 20) + 17, 2)).unwrap();
    let f = File::create(p("sparse")).unwrap();
    f.write_at(b"middle", 5 << 20).unwrap();
    f.set_len(10 << 20).unwrap();
    f.sync_data().unwrap();
    drop(f);
    fs::write(p("shrunk"), pattern(100_000, 3)).unwrap();
    fs::write(p("shrunk"), b"short").unwrap();

    fs::write(p("mode640"), b"m").unwrap();
    chmod(&p("mode640"), 0o640);
    set_mtime(&p("mode640"), 1_234_567_890, 123_456_789, false);
    fs::write(p("setuid_exec"), b"#!/bin/sh\n").unwrap();
    chmod(&p("setuid_exec"), 0o4755);
    fs::write(p("owned"), b"o").unwrap();
    std::os::unix::fs::chown(p("owned"), Some(65534), Some(65534)).unwrap();

    fs::create_dir_all(p("a/b/c")).unwrap();
    fs::write(p("a/b/c/deep.txt"), b"deep").unwrap();
    fs::create_dir(p("private")).unwrap();
    chmod(&p("private"), 0o700);
    fs::create_dir(p("sgid")).unwrap();
    std::os::unix::fs::chown(p("sgid"), Some(0), Some(65534)).unwrap();
    chmod(&p("sgid"), 0o2775);
    fs::write(p("sgid/inherits"), b"g").unwrap();

    setx(&p("hello.txt"), "user.k", b"v");
    setx(&p("hello.txt"), "user.bin", &[0, 255, 1, 0]);
    setx(&p("a"), "user.dir", b"d");

    symlink("hello.txt", p("link")).unwrap();
    symlink("no/where", p("dangling")).unwrap();
    symlink("x/".repeat(500), p("longlink")).unwrap();
    set_mtime(&p("link"), 1_111_111_111, 1, true);

    fs::write(p("h1"), b"linked").unwrap();
    fs::hard_link(p("h1"), p("h2")).unwrap();
    fs::hard_link(p("h1"), p("a/b/h3")).unwrap();

    fs::write(
        root.join(std::ffi::OsStr::from_bytes(b"caf\xe9")),
        b"latin1",
    )
    .unwrap();

    fs::write(p("before_rename"), b"r").unwrap();
    fs::rename(p("before_rename"), p("after_rename")).unwrap();
    fs::write(p("deleted"), b"gone").unwrap();
    fs::remove_file(p("deleted")).unwrap();
    fs::create_dir_all(p("olddir/sub")).unwrap();
    fs::write(p("olddir/sub/f"), b"moved").unwrap();
    fs::rename(p("olddir"), p("a/newdir")).unwrap();

    fs::create_dir(p("many")).unwrap();
    for i in 0..200 {
        fs::write(p(&format!("many/file{i:03}")), format!("{i}")).unwrap();
    }
}

/// Spot checks with literal expectations, so a snapshot bug cannot hide a loss.
fn check_fixture(root: &Path) {
    let p = |rel: &str| root.join(rel);
    assert_eq!(fs::read(p("hello.txt")).unwrap(), b"hello\n");
    assert!(fs::read(p("synced.bin")).unwrap() == pattern(300_000, 1));
    assert!(fs::read(p("large.bin")).unwrap() == pattern((3 << 20) + 17, 2));
    let sparse = fs::read(p("sparse")).unwrap();
    assert_eq!(sparse.len(), 10 << 20);
    assert_eq!(&sparse[5 << 20..(5 << 20) + 6], b"middle");
    assert!(sparse[..5 << 20].iter().all(|&b| b == 0));
    assert_eq!(fs::read(p("shrunk")).unwrap(), b"short");
    let md = fs::metadata(p("mode640")).unwrap();
    assert_eq!(
        (md.mode() & 0o7777, md.mtime(), md.mtime_nsec()),
        (0o640, 1_234_567_890, 123_456_789)
    );
    assert_eq!(
        fs::metadata(p("setuid_exec")).unwrap().mode() & 0o7777,
        0o4755
    );
    assert_eq!(fs::metadata(p("owned")).unwrap().uid(), 65534);
    assert_eq!(fs::metadata(p("sgid/inherits")).unwrap().gid(), 65534);
    assert_eq!(fs::read_link(p("link")).unwrap(), Path::new("hello.txt"));
    assert_eq!(fs::read(p("link")).unwrap(), b"hello\n");
    assert_eq!(fs::metadata(p("a/b/h3")).unwrap().nlink(), 3);
    assert_eq!(
        fs::metadata(p("h2")).unwrap().ino(),
        fs::metadata(p("h1")).unwrap().ino()
    );
    assert_eq!(fs::read(p("a/newdir/sub/f")).unwrap(), b"moved");
    assert!(!p("olddir").exists() && !p("deleted").exists() && !p("before_rename").exists());
    assert_eq!(fs::read_dir(p("many")).unwrap().count(), 200);
    assert_eq!(fs::read(p("many/file123")).unwrap(), b"123");
    assert!(xattrs_of(&p("hello.txt")).contains(&(b"user.bin".to_vec(), vec![0, 255, 1, 0])));
}

/// The filesystem accepts and reverses ordinary changes.
fn exercise(root: &Path) {
    let d = root.join("alive");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("f"), b"still works").unwrap();
    fs::rename(d.join("f"), d.join("g")).unwrap();
    assert_eq!(fs::read(d.join("g")).unwrap(), b"still works");
    symlink("g", d.join("l")).unwrap();
    fs::hard_link(d.join("g"), d.join("h")).unwrap();
    for n in ["g", "h", "l"] {
        fs::remove_file(d.join(n)).unwrap();
    }
    fs::remove_dir(&d).unwrap();
    fs::write(root.join("alive.txt"), b"alive").unwrap();
}

// ---------------------------------------------------------------- clean remount

#[test]
fn remount_preserves_files_and_metadata() {
    let mut m = Mount::new();
    populate(m.path());
    let before = snapshot(m.path());
    m.remount();
    check_fixture(m.path());
    assert_same(&before, &snapshot(m.path()));
    exercise(m.path());
}

#[test]
fn inode_numbers_stable_across_remount() {
    let mut m = Mount::new();
    populate(m.path());
    let before = inodes(m.path());
    m.remount();
    assert_eq!(inodes(m.path()), before);
}

#[test]
fn new_files_after_remount_do_not_collide() {
    let mut m = Mount::new();
    populate(m.path());
    let before = snapshot(m.path());
    m.remount();
    // New objects must get fresh inode numbers and must not disturb old ones.
    fs::create_dir(m.p("fresh")).unwrap();
    for i in 0..50 {
        fs::write(m.p(format!("fresh/n{i}")), pattern(5000, 100 + i)).unwrap();
    }
    fs::create_dir_all(m.p("fresh/d1/d2")).unwrap();
    symlink("n1", m.p("fresh/sl")).unwrap();
    let is_new = |k: &[u8]| k.is_empty() || k.starts_with(b"fresh");
    assert_same(
        &without(before, is_new),
        &without(snapshot(m.path()), is_new),
    );

    let mut by_ino: HashMap<u64, Vec<Vec<u8>>> = HashMap::new();
    for (k, ino) in inodes(m.path()) {
        by_ino.entry(ino).or_default().push(k);
    }
    for (ino, paths) in &by_ino {
        if paths.len() > 1 {
            let nl = fs::symlink_metadata(m.p(std::ffi::OsStr::from_bytes(&paths[0])))
                .unwrap()
                .nlink();
            assert_eq!(
                nl as usize,
                paths.len(),
                "inode {ino} shared by unrelated entries: {paths:?}"
            );
        }
    }
    // And everything, old and new, survives a second remount.
    let before2 = snapshot(m.path());
    m.remount();
    assert_same(&before2, &snapshot(m.path()));
    for i in 0..50 {
        assert!(fs::read(m.p(format!("fresh/n{i}"))).unwrap() == pattern(5000, 100 + i));
    }
}

#[test]
fn git_repo_survives_remount() {
    let mut m = Mount::new();
    let git = "env GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null git -c user.name=T -c user.email=t@example.com";
    sh_ok(
        m.path(),
        &format!(
            "{git} init -q repo && cd repo && seq 1 1000 > nums && mkdir d && echo x > d/x && {git} add -A && {git} commit -q -m one"
        ),
    );
    m.remount();
    let repo = m.p("repo");
    assert_eq!(sh_ok(&repo, &format!("{git} status --porcelain")), "");
    assert_eq!(
        sh_ok(&repo, &format!("{git} log --oneline | wc -l")).trim(),
        "1"
    );
    sh_ok(&repo, &format!("{git} fsck --strict --no-progress"));
}

// ---------------------------------------------------------------- crashes

#[test]
fn kill9_keeps_closed_and_fsynced_data() {
    let mut m = Mount::new();
    populate(m.path());
    // A file still open at crash time: the fsync'd prefix must survive.
    let mut inflight = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("inflight"))
        .unwrap();
    inflight.write_all(&[b'A'; 65536]).unwrap();
    inflight.sync_all().unwrap();
    inflight.write_all(&[b'B'; 65536]).unwrap();
    let is_inflight = |k: &[u8]| k.is_empty() || k == b"inflight";
    let before = without(snapshot(m.path()), is_inflight);

    m.kill9();
    drop(inflight);
    m.start_again();

    check_fixture(m.path());
    assert_same_after_crash(&before, &without(snapshot(m.path()), is_inflight));
    let data = fs::read(m.p("inflight")).unwrap();
    assert!(
        data.len() >= 65536 && data[..65536].iter().all(|&b| b == b'A'),
        "fsync'd prefix lost"
    );
    exercise(m.path());
    // A clean remount after crash recovery keeps the new state too.
    let after_recovery = snapshot(m.path());
    m.remount();
    assert_same(&after_recovery, &snapshot(m.path()));
}

#[test]
fn kill9_right_after_close_keeps_sizes_and_times() {
    embedded_only!("kill9_right_after_close_keeps_sizes_and_times");
    let mut m = Mount::new();
    // Closed files whose sizes and times were not written back yet (close
    // sends nothing to esfs; the write-back runs every second).
    fs::write(m.p("new"), pattern(70_000, 1)).unwrap();
    fs::write(m.p("grown"), b"v1").unwrap();
    fs::write(m.p("overwritten"), pattern(9000, 2)).unwrap();
    m.remount(); // "grown" and "overwritten" now persisted as they were
    tick();
    let mut f = OpenOptions::new().append(true).open(m.p("grown")).unwrap();
    f.write_all(&pattern(100_000, 3)).unwrap();
    drop(f);
    // Same size, new bytes: only the mtime tells.
    let f = OpenOptions::new()
        .write(true)
        .open(m.p("overwritten"))
        .unwrap();
    f.write_all_at(b"XYZ", 100).unwrap();
    drop(f);
    // Written, then an explicit mtime (tar x, cp -a, rsync): the explicit
    // one wins, not the time of the write.
    fs::write(m.p("stamped"), pattern(5000, 4)).unwrap();
    set_mtime(&m.p("stamped"), 1_000_000_000, 123_456_789, false);
    // Written, then cut short.
    fs::write(m.p("cut"), pattern(50_000, 5)).unwrap();
    OpenOptions::new()
        .write(true)
        .open(m.p("cut"))
        .unwrap()
        .set_len(1234)
        .unwrap();
    let before = snapshot(m.path());
    m.kill9();
    m.start_again();
    assert_same_after_crash(&before, &snapshot(m.path()));
    let mut grown = b"v1".to_vec();
    grown.extend(pattern(100_000, 3));
    assert_eq!(fs::read(m.p("grown")).unwrap(), grown);
    assert_eq!(stat(m.p("stamped")).st_mtime, 1_000_000_000);
    assert_eq!(fs::read(m.p("cut")).unwrap(), pattern(50_000, 5)[..1234]);
    if !m.is_plain() {
        // The point of the test: the sizes came back from the journal.
        assert!(
            m.log().contains("recovered from their data"),
            "no size was left to recover; log:\n{}",
            m.log()
        );
    }
    exercise(m.path());
}

#[test]
fn kill9_during_writes_keeps_completed_files() {
    let mut m = Mount::new();
    let dir = m.p("w");
    fs::create_dir(&dir).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Writer: write tmp, fsync, rename into place; count only completed renames.
    let writer = {
        let (dir, done, stop) = (dir.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || -> io::Result<()> {
            for i in 0..100_000u64 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let tmp = dir.join(format!("tmp{i}"));
                let mut f = File::create(&tmp)?;
                f.write_all(&pattern(10_000 + i as usize, i))?;
                f.sync_all()?;
                drop(f);
                fs::rename(&tmp, dir.join(format!("done{i}")))?;
                done.store(i as usize + 1, Ordering::SeqCst);
            }
            Ok(())
        })
    };
    while done.load(Ordering::SeqCst) < 100 {
        assert!(
            !writer.is_finished(),
            "writer stopped early: {:?}",
            writer.join()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    m.kill9();
    let completed = done.load(Ordering::SeqCst);
    stop.store(true, Ordering::Relaxed);
    // On esfs the writer dies with ENOTCONN/ECONNABORTED; that is expected.
    let _ = writer.join().unwrap();
    m.start_again();

    let mut found_done = 0;
    for e in fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        let path = dir.join(&name);
        // Every surviving entry is readable, whatever state it is in.
        let data = fs::read(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(i) = name.strip_prefix("done") {
            let i: u64 = i.parse().unwrap();
            assert!(
                data == pattern(10_000 + i as usize, i),
                "{name} has wrong content"
            );
            found_done += 1;
        } else {
            assert!(name.starts_with("tmp"), "unexpected {name}");
        }
    }
    for i in 0..completed {
        assert!(
            dir.join(format!("done{i}")).is_file(),
            "completed done{i} lost (completed={completed})"
        );
    }
    assert!(found_done >= completed);
    exercise(m.path());
}

#[test]
fn store_and_data_dirs_are_used() {
    embedded_only!("store_and_data_dirs_are_used");
    skip_in_plain_mode!("store_and_data_dirs_are_used");
    let mut m = Mount::new();
    fs::write(m.p("f"), pattern(1 << 20, 1)).unwrap();
    m.unmount();
    let non_empty = |d: PathBuf| fs::read_dir(&d).unwrap().next().is_some();
    assert!(
        non_empty(m.store_dir()),
        "--store dir is empty after unmount"
    );
    assert!(non_empty(m.data_dir()), "--data dir is empty after unmount");
    assert_eq!(
        fs::read_dir(m.path()).unwrap().count(),
        0,
        "mountpoint not empty after unmount"
    );
    m.start_again();
    assert!(fs::read(m.p("f")).unwrap() == pattern(1 << 20, 1));
}

/// Namespace changes acknowledged just before a `kill -9` survive it: on
/// the embedded store they are then only in the redo log (the mount commits
/// when writes pause, and the kill comes from the same shell the moment the
/// last change returns), which the next mount replays.
#[test]
fn kill9_right_after_namespace_changes_keeps_them() {
    embedded_only!("kill9_right_after_namespace_changes_keeps_them");
    let mut m = Mount::new();
    populate(m.path());
    let before = snapshot(m.path());
    m.kill9_right_after(
        "mkdir -p new/a/b/c
         for i in $(seq 1 150); do echo \"file $i\" > new/a/f$i; done
         for i in $(seq 1 50); do mv new/a/f$i new/a/b/g$i; done
         for i in $(seq 51 80); do rm new/a/f$i; done
         mv new/a/b new/moved
         ln -s moved/g1 new/link
         chmod 600 new/a/f100
         touch -d @1234567890 new/a/f101
         mv new renamed",
    );
    let redo = m.store_dir().join("meta.redo");
    if !m.is_plain() {
        // The scenario this test is about: acknowledged, not committed.
        let len = fs::metadata(&redo).map(|md| md.len()).unwrap_or(0);
        assert!(len > 16, "nothing was left in the redo log ({len} bytes)");
    }
    m.start_again();

    let r = m.p("renamed");
    assert!(!m.p("new").exists());
    for i in 1..=50 {
        assert_eq!(
            fs::read_to_string(r.join(format!("moved/g{i}"))).unwrap(),
            format!("file {i}\n")
        );
        assert!(!r.join(format!("a/f{i}")).exists());
    }
    for i in 51..=80 {
        assert!(!r.join(format!("a/f{i}")).exists(), "f{i} came back");
    }
    for i in 81..=150 {
        assert_eq!(
            fs::read_to_string(r.join(format!("a/f{i}"))).unwrap(),
            format!("file {i}\n")
        );
    }
    assert!(r.join("moved/c").is_dir());
    assert_eq!(
        fs::read_link(r.join("link")).unwrap(),
        Path::new("moved/g1")
    );
    assert_eq!(fs::read_to_string(r.join("link")).unwrap(), "file 1\n");
    let md = fs::metadata(r.join("a/f100")).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o600);
    let md = fs::metadata(r.join("a/f101")).unwrap();
    assert_eq!(md.mtime(), 1234567890);
    // Everything from before is untouched (but the root, which gained a name).
    let old = |k: &[u8]| k.is_empty() || k.starts_with(b"renamed");
    assert_same_after_crash(&without(before, old), &without(snapshot(m.path()), old));
    exercise(m.path());
}

/// A directory's times moved by a name made or removed in it wait in
/// memory like a closed file's size (lazy close). A `kill -9` before they
/// are written back must still leave them no older than the change: the
/// journal names the directory and the next mount moves its times to now.
#[test]
fn kill9_right_after_names_change_keeps_directory_times_moving() {
    let mut m = Mount::new();
    for d in ["made", "removed", "renamed"] {
        fs::create_dir(m.p(d)).unwrap();
    }
    fs::write(m.p("removed/f"), b"x").unwrap();
    fs::write(m.p("renamed/f"), b"x").unwrap();
    for d in ["made", "removed", "renamed"] {
        set_mtime(&m.p(d), 1_000_000_000, 0, false);
    }
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    m.kill9_right_after("touch made/new; rm removed/f; mv renamed/f renamed/g");
    m.start_again();
    for d in ["made", "removed", "renamed"] {
        let md = fs::metadata(m.p(d)).unwrap();
        assert!(
            md.mtime() >= t0 && md.ctime() >= t0,
            "{d}: mtime {} ctime {}, the change was at {t0}",
            md.mtime(),
            md.ctime()
        );
    }
    assert!(m.p("made/new").exists() && m.p("renamed/g").exists());
    assert!(!m.p("removed/f").exists() && !m.p("renamed/f").exists());
}

/// A clean unmount commits everything the mount wrote, its own last writes
/// (the end of its lock session) included: the redo log is left empty, so
/// the next mount has nothing to replay. A record left there would be
/// replayed as if the mount had crashed.
#[test]
fn clean_unmount_leaves_the_redo_log_empty() {
    skip_in_plain_mode!("clean_unmount_leaves_the_redo_log_empty");
    embedded_only!("clean_unmount_leaves_the_redo_log_empty"); // the redo log is the embedded store's
    let mut m = Mount::new();
    sh_ok(
        m.path(),
        "mkdir -p d/e && echo hi > d/f && cp -a d d2 && touch -d @1000000000 d2/f",
    );
    // The background write-back and indexer get going, then more writes.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    sh_ok(m.path(), "echo more >> d/f && mv d2 d3 && mkdir d/g");
    m.unmount();
    let redo = m.store_dir().join("meta.redo");
    let len = fs::metadata(&redo).unwrap().len();
    assert_eq!(len, 16, "a clean unmount left records in the redo log");
    m.start_again();
    assert_eq!(fs::read(m.p("d/f")).unwrap(), b"hi\nmore\n");
    assert_eq!(fs::metadata(m.p("d3/f")).unwrap().mtime(), 1000000000);
    assert!(m.p("d/g").is_dir());
}

/// Times set explicitly on directories (utimensat: `touch -d`, `cp -a`,
/// `tar x`) survive a `kill -9` right after. Names made in those
/// directories just before moved their times in memory only and put them
/// in the unflushed journal, whose recovery must not then replace the time
/// set afterwards (and acknowledged) with the mount's start.
#[test]
fn kill9_right_after_directory_times_set_keeps_them() {
    let mut m = Mount::new();
    let src = m.scratch().join("tree");
    sh_ok(
        m.scratch(),
        "mkdir tree
         for i in $(seq 1 20); do
             mkdir -p tree/d$i/sub
             echo $i > tree/d$i/f; echo $i > tree/d$i/sub/g
             touch -d @$((1000000000 + i)) tree/d$i/sub tree/d$i
         done
         touch -d @999999999 tree",
    );
    m.kill9_right_after(&format!(
        "cp -a '{}' copy
         mkdir t; touch t/f; touch -d @946684800 t",
        src.display()
    ));
    m.start_again();
    let mtime = |rel: &str| fs::metadata(m.p(rel)).unwrap().mtime();
    for i in 1..=20 {
        assert_eq!(mtime(&format!("copy/d{i}")), 1000000000 + i, "copy/d{i}");
        assert_eq!(mtime(&format!("copy/d{i}/sub")), 1000000000 + i);
        assert_eq!(
            fs::read(m.p(format!("copy/d{i}/sub/g"))).unwrap(),
            format!("{i}\n").as_bytes()
        );
    }
    assert_eq!(mtime("copy"), 999999999);
    assert_eq!(mtime("t"), 946684800);
    assert!(m.p("t/f").exists());
}
