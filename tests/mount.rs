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

/// `esfs ARGS`: (exit code, stdout, stderr).
fn esfs_cmd(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_esfs"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A scratch root with store, data and mnt; lazily unmounts mnt on drop.
struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new() -> Scratch {
        Scratch(tempfile::tempdir().unwrap())
    }
    fn p(&self, rel: &str) -> std::path::PathBuf {
        self.0.path().join(rel)
    }
    /// `esfs mount mnt --store store --data data [EXTRA]` in the background:
    /// (exit code, stdout, stderr, server pid).
    fn mount(&self, extra: &[&str]) -> (i32, String, String, Option<u32>) {
        fs::create_dir_all(self.p("mnt")).unwrap();
        let mut args: Vec<&std::ffi::OsStr> = vec!["mount".as_ref()];
        let (mnt, store, data) = (self.p("mnt"), self.p("store"), self.p("data"));
        args.extend([mnt.as_os_str(), "--store".as_ref(), store.as_os_str()]);
        args.extend(["--data".as_ref(), data.as_os_str()]);
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        let (code, out, err) = esfs_cmd(&args);
        let pid = out
            .split("(pid ")
            .nth(1)
            .and_then(|r| r.split(')').next()?.parse().ok());
        (code, out, err, pid)
    }
    fn umount(&self) -> (i32, String, String) {
        esfs_cmd(&["umount".as_ref(), self.p("mnt").as_os_str()])
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if is_esfs_mounted(&self.p("mnt")) {
            let _ = Command::new("umount").arg("-l").arg(self.p("mnt")).status();
        }
    }
}

/// Mounting over files would hide them: refused unless `-o nonempty`.
#[test]
fn a_non_empty_mountpoint_is_refused_without_nonempty() {
    let s = Scratch::new();
    fs::create_dir_all(s.p("mnt")).unwrap();
    fs::write(s.p("mnt/keep"), b"mine").unwrap();
    let (code, out, err, _) = s.mount(&[]);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("is not empty") && err.contains("-o nonempty"),
        "{err}"
    );
    assert!(!is_esfs_mounted(&s.p("mnt")));
    let (code, out, err, _) = s.mount(&["-o", "nonempty"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(is_esfs_mounted(&s.p("mnt")));
    assert!(!s.p("mnt/keep").exists(), "hidden while mounted");
    let (code, out, err) = s.umount();
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(fs::read(s.p("mnt/keep")).unwrap(), b"mine");
}

/// `esfs umount` unmounts and returns once the server has finished (its
/// final sync), so the next mount of the store is never refused as busy.
#[test]
fn esfs_umount_waits_for_the_server() {
    let s = Scratch::new();
    for round in 0..3 {
        let (code, out, err, pid) = s.mount(&[]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains("esfs umount"), "{out}");
        let pid = pid.expect("pid");
        let body = format!("round {round}");
        // Written just before: its size and mtime wait for the write-back.
        fs::write(s.p(&format!("mnt/f{round}")), &body).unwrap();
        let (code, out, err) = s.umount();
        assert_eq!(code, 0, "{out}{err}");
        assert_eq!(
            out.trim(),
            format!("esfs: unmounted {}", s.p("mnt").display())
        );
        assert!(!is_esfs_mounted(&s.p("mnt")));
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "server {pid} still running when umount returned"
        );
    }
    let (code, out, err, _) = s.mount(&[]);
    assert_eq!(code, 0, "{out}{err}");
    for round in 0..3 {
        assert_eq!(
            fs::read_to_string(s.p(&format!("mnt/f{round}"))).unwrap(),
            format!("round {round}")
        );
    }
    let (code, _, err) = s.umount();
    assert_eq!(code, 0, "{err}");
    // Not a mount: one line, exit 1.
    let (code, _, err) = s.umount();
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        format!("esfs: {} is not an esfs mount", s.p("mnt").display())
    );
}

/// The dead mount of a killed server is cleared, even while a process still
/// has its working directory in it.
#[test]
fn esfs_umount_clears_a_killed_servers_mount() {
    let s = Scratch::new();
    let (code, out, err, pid) = s.mount(&[]);
    assert_eq!(code, 0, "{out}{err}");
    let mut user = Command::new("sleep")
        .arg("60")
        .current_dir(s.p("mnt"))
        .spawn()
        .unwrap();
    unsafe { libc::kill(pid.unwrap() as i32, libc::SIGKILL) };
    while Path::new(&format!("/proc/{}", pid.unwrap())).exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(is_esfs_mounted(&s.p("mnt")), "dead mount still listed");
    let (code, out, err) = s.umount();
    let _ = user.kill();
    let _ = user.wait();
    assert_eq!(code, 0, "{out}{err}");
    assert!(!is_esfs_mounted(&s.p("mnt")));
    let (code, out, err, _) = s.mount(&[]);
    assert_eq!(code, 0, "remount: {out}{err}");
    assert_eq!(s.umount().0, 0);
}
