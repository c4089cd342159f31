//! The mount itself: type, lifecycle, CLI modes, access by other users.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::process::Command;

const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

#[test]
fn mounted_as_fuse_esfs() {
    skip_in_plain_mode!("mounted_as_fuse_esfs");
    let m = Mount::new();
    assert_eq!(mount_fstype(m.path()).as_deref(), Some("fuse.esfs"));
    let c = cstr(m.path());
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statfs(c.as_ptr(), &mut sf) }).unwrap();
    assert_eq!(sf.f_type as i64, FUSE_SUPER_MAGIC);
    // The mount shows up for other tools too.
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        mounts
            .lines()
            .any(|l| l.split(' ').nth(1) == m.path().to_str()
                && l.split(' ').nth(2) == Some("fuse.esfs")),
        "not in /proc/mounts"
    );
}

#[test]
fn fresh_mount_root_is_empty_accessible_dir() {
    let m = Mount::new();
    assert_eq!(fs::read_dir(m.path()).unwrap().count(), 0);
    let md = fs::metadata(m.path()).unwrap();
    assert!(md.is_dir());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(md.nlink(), 2);
    // allow_other: another user can list the root and read a public file.
    fs::write(m.p("public"), b"hello").unwrap();
    let r = sh_nobody(m.path(), "ls && cat public");
    assert_success("ls && cat public (as nobody)", &r);
    assert_eq!(r.1, "public\nhello");
}

#[test]
fn unmount_and_remount_cycle() {
    skip_in_plain_mode!("unmount_and_remount_cycle");
    let mut m = Mount::new();
    fs::write(m.p("f"), b"persist").unwrap();
    m.unmount();
    assert!(mount_fstype(m.path()).is_none() || !is_esfs_mounted(m.path()));
    assert_eq!(
        fs::read_dir(m.path()).unwrap().count(),
        0,
        "data leaked into the bare mountpoint"
    );
    for round in 0..3 {
        m.start_again();
        assert_eq!(fs::read(m.p("f")).unwrap(), b"persist", "round {round}");
        m.unmount();
    }
    m.start_again();
}

#[test]
fn signals_unmount_cleanly_and_keep_what_was_written() {
    skip_in_plain_mode!("signals_unmount_cleanly_and_keep_what_was_written");
    let mut m = Mount::new();
    for (round, sig) in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP]
        .into_iter()
        .enumerate()
    {
        // Closed a moment before the signal: its size and mtime are still
        // waiting for the write-back, which the unmount must run.
        let name = format!("f{round}");
        fs::write(m.p(&name), pattern(5000 + round, round as u64)).unwrap();
        let before = stat(m.p(&name));
        m.stop_with(sig);
        m.start_again();
        assert_eq!(
            fs::read(m.p(&name)).unwrap(),
            pattern(5000 + round, round as u64),
            "signal {sig}"
        );
        let after = stat(m.p(&name));
        assert_eq!(mtime_ns(&after), mtime_ns(&before), "signal {sig}");
    }
}

#[test]
fn a_busy_mount_keeps_serving_until_signalled_again() {
    skip_in_plain_mode!("a_busy_mount_keeps_serving_until_signalled_again");
    let mut m = Mount::new();
    fs::write(m.p("f"), b"kept").unwrap();
    // An open descriptor makes the unmount EBUSY for as long as it is held.
    let held = fs::File::open(m.p("f")).unwrap();
    m.signal(libc::SIGTERM);
    // Longer than the daemon retries a busy unmount.
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert!(is_esfs_mounted(m.path()), "gave up the mount while busy");
    assert_eq!(fs::read(m.p("f")).unwrap(), b"kept");
    assert!(m.log().contains("still serving"), "log:\n{}", m.log());
    drop(held);
    // The signal thread waits for the next signal: this one unmounts.
    m.stop_with(libc::SIGTERM);
}

#[test]
fn background_mode_returns_once_mounted() {
    skip_in_plain_mode!("background_mode_returns_once_mounted");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    for d in ["store", "data", "mnt"] {
        fs::create_dir(root.join(d)).unwrap();
    }
    let mnt = root.join("mnt");
    // Make sure a failing assertion still leaves no mount behind.
    struct Guard<'a>(&'a Path);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            if is_esfs_mounted(self.0) {
                let _ = Command::new("fusermount3")
                    .arg("-u")
                    .arg("-z")
                    .arg(self.0)
                    .status();
            }
        }
    }
    let _guard = Guard(&mnt);
    let out = Command::new(env!("CARGO_BIN_EXE_esfs"))
        .arg("mount")
        .arg(&mnt)
        .arg("--store")
        .arg(root.join("store"))
        .arg("--data")
        .arg(root.join("data"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "esfs mount failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // No polling: the mount must already be live when the command returns.
    assert!(
        is_esfs_mounted(&mnt),
        "esfs returned before the mount was live"
    );
    fs::write(mnt.join("f"), b"bg").unwrap();
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"bg");
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(!is_esfs_mounted(&mnt));
}
