//! Test harness shared by the integration tests.
//!
//! `Mount::new()` mounts a fresh esfs instance (foreground child process) on a
//! temporary directory. With `ESFS_TEST_PLAIN_DIR=1` it hands out a plain
//! directory on the local disk instead, so that every expectation in the suite
//! can be checked against the kernel's own filesystems.
//!
//! The backend switch: with `ESFS_TEST_BACKEND=es`, `Mount::new()` mounts a
//! fresh index on Elasticsearch instead of the embedded store: the cluster at
//! `ESFS_TEST_ES_URL` (a real engine), else one test double per test process.
//! Tests about the embedded store itself say so with `embedded_only!`.
//!
//! The contents switch: with `ESFS_TEST_DATA=s3`, mounts keep file contents
//! in object storage (`--data s3://esfs/<fresh prefix>`) on SeaweedFS:
//! `ESFS_TEST_S3_URL` (its credentials in the AWS_* variables), else the
//! instance "tests" of scripts/s3, started on first use. Tests about the
//! local data directory say so with `local_data_only!`.

#![allow(dead_code)]

use std::ffi::{CString, OsStr};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// A first mount on a real engine creates its indices, each waiting for its
/// shards to start: seconds on a 2-core machine busy with the suite itself.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// A hung daemon would block the test (and CI) forever; after this long the
/// watchdog SIGKILLs it so pending syscalls fail with ENOTCONN instead.
const DEFAULT_WATCHDOG_SECS: u64 = 300;

/// True when the suite runs against a plain local directory instead of esfs.
pub fn plain_mode() -> bool {
    std::env::var_os("ESFS_TEST_PLAIN_DIR").is_some_and(|v| v == "1")
}

/// The backend `Mount::new()` mounts: "embedded" (default) or "es".
pub fn test_backend() -> &'static str {
    match std::env::var("ESFS_TEST_BACKEND").as_deref() {
        Ok("es") | Ok("elasticsearch") => "es",
        _ => "embedded",
    }
}

/// `esfs mount` arguments for a fresh index on the Elasticsearch backend:
/// `ESFS_TEST_ES_URL`, else a test double shared by the test process.
pub fn es_backend_args() -> Vec<String> {
    static DOUBLE: std::sync::OnceLock<es_test_server::EsTestServer> = std::sync::OnceLock::new();
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let url = std::env::var("ESFS_TEST_ES_URL").unwrap_or_else(|_| {
        DOUBLE
            .get_or_init(|| {
                es_test_server::EsTestServer::start("127.0.0.1:0").expect("start test double")
            })
            .url()
    });
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let index = format!("esfs-m{}-{n}", std::process::id());
    vec!["--es".into(), url, "--index".into(), index]
}

/// Mounts on Elasticsearch hold the tree's delegation by default while
/// they are their index's only mount (see tests/delegations.rs). The suites
/// choose: `ESFS_TEST_DELEGATE=1` mounts with it (op logs in this process's
/// own state directory), anything else with `--no-delegate`, so what each
/// test counts and times is the mode its run names. A test that gives
/// `--delegate`, `--no-delegate` or `--state-dir` itself keeps its choice
/// (with `--state-dir` alone: esfs's default, the delegation).
fn delegate_args(backend: &[String]) -> Vec<String> {
    let es = backend.iter().any(|a| a == "--es");
    let chosen = backend
        .iter()
        .any(|a| ["--delegate", "--no-delegate", "--state-dir"].contains(&a.as_str()));
    if !es || chosen {
        return Vec::new();
    }
    if std::env::var_os("ESFS_TEST_DELEGATE").is_none_or(|v| v != "1") {
        return vec!["--no-delegate".into()];
    }
    vec![
        "--delegate".into(),
        "--state-dir".into(),
        test_state_dir().display().to_string(),
    ]
}

/// The op-log directory every delegated mount of this test process shares:
/// one per process, since a test that kills a mount remounts its index and
/// replays the log the killed one left. Removed when the process exits (the
/// harness ends with `exit`, which runs `atexit` handlers), so runs do not
/// leave one behind in /tmp per test binary.
fn test_state_dir() -> PathBuf {
    fn path() -> PathBuf {
        std::env::temp_dir().join(format!("esfs-test-state-{}", std::process::id()))
    }
    extern "C" fn remove() {
        let _ = std::fs::remove_dir_all(path());
    }
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    // SAFETY: `remove` is a plain function that touches no state torn down
    // before atexit handlers run.
    REGISTERED.call_once(|| unsafe {
        libc::atexit(remove);
    });
    path()
}

/// Whether mounts keep contents in object storage (`ESFS_TEST_DATA=s3`).
pub fn s3_data() -> bool {
    std::env::var("ESFS_TEST_DATA").is_ok_and(|v| v == "s3")
}

/// The S3 server for `ESFS_TEST_DATA=s3`: its endpoint (the test process's
/// AWS_* variables name its credentials, for every esfs command it runs).
pub fn s3_endpoint() -> String {
    static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("ESFS_TEST_S3_URL") {
            return url;
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/s3");
        let run = |cmd: &str| {
            let out = Command::new(&script)
                .args([cmd, "tests"])
                .env("ESFS_S3_PORT", "19730")
                .output()
                .expect("run scripts/s3");
            assert!(
                out.status.success(),
                "scripts/s3 {cmd} tests: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        };
        let url = run("start").lines().last().unwrap().to_string();
        for line in run("env").lines() {
            if let Some((k, v)) = line.strip_prefix("export ").and_then(|l| l.split_once('='))
                && k.starts_with("AWS_")
            {
                // SAFETY: once, before any mount or command this test
                // process starts reads them.
                unsafe { std::env::set_var(k, v) };
            }
        }
        url
    })
    .clone()
}

/// `--data s3://esfs/PREFIX --s3-endpoint URL --cache-dir DIR` for a fresh
/// prefix (one per mount made, so tests never see each other's blocks).
pub fn s3_data_args(cache: &Path) -> Vec<String> {
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let url = s3_endpoint();
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let prefix = format!(
        "t{}-{}-{n}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    vec![
        "--data".into(),
        format!("s3://esfs/{prefix}"),
        "--s3-endpoint".into(),
        url,
        "--cache-dir".into(),
        cache.to_string_lossy().into_owned(),
    ]
}

/// Early-return from a test about the local data directory (its files)
/// when contents are in object storage.
#[macro_export]
macro_rules! local_data_only {
    ($name:expr) => {
        if $crate::common::s3_data() {
            eprintln!(
                "{}: local data directory only; skipped with ESFS_TEST_DATA=s3",
                $name
            );
            return;
        }
    };
}

/// Early-return from a test about the embedded store itself (its files,
/// its options) when the suite runs on another backend.
#[macro_export]
macro_rules! embedded_only {
    ($name:expr) => {
        if $crate::common::test_backend() != "embedded" {
            eprintln!(
                "{}: embedded store only; skipped on {}",
                $name,
                $crate::common::test_backend()
            );
            return;
        }
    };
}

/// Early-return from a test that only makes sense on esfs.
#[macro_export]
macro_rules! skip_in_plain_mode {
    ($name:expr) => {
        if $crate::common::plain_mode() {
            eprintln!("{}: skipped in plain mode (ESFS_TEST_PLAIN_DIR=1)", $name);
            return;
        }
    };
}

pub struct Mount {
    tmp: tempfile::TempDir,
    mnt: PathBuf,
    child: Option<Child>,
    /// Dropping this sender disarms the watchdog of the current child.
    watchdog: Option<mpsc::Sender<()>>,
    plain: bool,
    /// Where metadata and contents live: `--store/--data` in the tempdir by
    /// default, or e.g. `--es URL --index NAME`.
    backend: Option<Vec<String>>,
    /// Extra `-o` options.
    options: Vec<String>,
    /// `--data s3://... --s3-endpoint ...` with ESFS_TEST_DATA=s3.
    s3: Option<Vec<String>>,
    /// The daemon's RUST_LOG (from its next start on: see `set_log_filter`).
    log_filter: String,
    /// Mount-only options of the suites' backend (see `delegate_args`).
    mount_args: Vec<String>,
}

impl Mount {
    pub fn new() -> Mount {
        Mount::build(None, true, &[])
    }

    /// The embedded store with extra mount options. Never plain.
    pub fn with_options(options: &[&str]) -> Mount {
        Mount::build(None, false, options)
    }

    /// A mount on another backend, given as `esfs mount` arguments (e.g.
    /// `["--es", url, "--index", name]`). Never plain: these test esfs itself.
    pub fn with_backend(args: &[&str]) -> Mount {
        Mount::build(
            Some(args.iter().map(|a| a.to_string()).collect()),
            false,
            &[],
        )
    }

    fn build(backend: Option<Vec<String>>, allow_plain: bool, options: &[&str]) -> Mount {
        let s3 = (backend.is_none() && s3_data()).then_some(());
        let suites_es = backend.is_none() && test_backend() == "es";
        let backend = backend.or_else(|| suites_es.then(es_backend_args));
        let mount_args = backend.as_deref().map(delegate_args).unwrap_or_default();
        let allow_plain = allow_plain && test_backend() == "embedded" && s3.is_none();
        let tmp = tempfile::Builder::new()
            .prefix("esfs-test-")
            .tempdir()
            .expect("create tempdir");
        // Tests run commands as `nobody`, who must be able to reach the mount.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let root = tmp.path().canonicalize().unwrap();
        for d in ["store", "data", "mnt"] {
            fs::create_dir(root.join(d)).unwrap();
        }
        // As esfs makes them (a looser store or data directory is warned about).
        for d in ["store", "data"] {
            fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o700)).unwrap();
        }
        let mnt = root.join("mnt");
        let s3 = s3.map(|_| s3_data_args(&root.join("cache")));
        let mut m = Mount {
            tmp,
            mnt,
            child: None,
            watchdog: None,
            plain: allow_plain && plain_mode(),
            backend,
            options: options.iter().map(|o| o.to_string()).collect(),
            s3,
            log_filter: std::env::var("ESFS_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            mount_args,
        };
        if !m.plain {
            m.start();
        }
        m
    }

    /// The directory the tests work in (the mountpoint, or the plain dir).
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// Path of a name inside the mount.
    pub fn p(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn is_plain(&self) -> bool {
        self.plain
    }

    /// A scratch directory on the local disk, outside the mount.
    pub fn scratch(&self) -> PathBuf {
        let d = self.tmp.path().canonicalize().unwrap().join("scratch");
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// The `esfs` options naming this mount's store (for fsck, locks,
    /// search): `--store DIR --data DIR`, or `--es URL --index NAME`.
    pub fn store_args(&self) -> Vec<String> {
        let arg = |d: &str| self.tmp.path().join(d).to_string_lossy().into_owned();
        match (&self.backend, &self.s3) {
            (Some(b), None) => b.clone(),
            (Some(b), Some(s3)) => [b.clone(), s3.clone()].concat(),
            (None, Some(s3)) => [vec!["--store".into(), arg("store")], s3.clone()].concat(),
            (None, None) => vec!["--store".into(), arg("store"), "--data".into(), arg("data")],
        }
    }

    /// RUST_LOG of the daemon from its next start (e.g. after `remount`).
    pub fn set_log_filter(&mut self, filter: &str) {
        self.log_filter = filter.to_string();
    }

    /// The --store directory (metadata).
    pub fn store_dir(&self) -> PathBuf {
        self.tmp.path().join("store")
    }

    /// The --data directory (file contents).
    pub fn data_dir(&self) -> PathBuf {
        self.tmp.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.tmp.path().join("esfs.log")
    }

    pub fn log(&self) -> String {
        String::from_utf8_lossy(&fs::read(self.log_path()).unwrap_or_default()).into_owned()
    }

    fn start(&mut self) {
        assert!(self.child.is_none(), "already mounted");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let backend = self.store_args();
        let child = Command::new(env!("CARGO_BIN_EXE_esfs"))
            .arg("mount")
            .arg(&self.mnt)
            .args(&backend)
            .args(&self.mount_args)
            .arg("--foreground")
            .arg("-o")
            .arg("allow_other")
            .args(self.options.iter().flat_map(|o| ["-o", o.as_str()]))
            .env("RUST_LOG", &self.log_filter)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn esfs");
        self.arm_watchdog(child.id());
        self.child = Some(child);

        let deadline = Instant::now() + MOUNT_TIMEOUT;
        loop {
            if is_esfs_mounted(&self.mnt) {
                return;
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!(
                    "esfs exited early ({st}) before mounting; log:\n{}",
                    self.log()
                );
            }
            if Instant::now() > deadline {
                self.force_cleanup();
                panic!(
                    "esfs did not mount within {MOUNT_TIMEOUT:?}; log:\n{}",
                    self.log()
                );
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn arm_watchdog(&mut self, pid: u32) {
        let secs = std::env::var("ESFS_TEST_WATCHDOG_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_WATCHDOG_SECS);
        let (tx, rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(secs))
            {
                eprintln!("watchdog: esfs (pid {pid}) still mounted after {secs}s; killing it");
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        });
        self.watchdog = Some(tx);
    }

    /// Clean unmount: `fusermount3 -u`, then wait (bounded) for the daemon to exit.
    /// A no-op in plain mode.
    pub fn unmount(&mut self) {
        if self.plain {
            return;
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        self.watchdog = None;
        // The kernel may still hold the mount busy for a moment after a test's
        // last child process exited; retry briefly.
        let mut last_err = String::new();
        let mut ok = false;
        for _ in 0..50 {
            let out = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .output()
                .unwrap();
            if out.status.success() {
                ok = true;
                break;
            }
            last_err = String::from_utf8_lossy(&out.stderr).into_owned();
            sleep(Duration::from_millis(100));
        }
        if !ok {
            let _ = child.kill();
            let _ = child.wait();
            lazy_unmount(&self.mnt);
            panic!("fusermount3 -u failed: {last_err}; log:\n{}", self.log());
        }
        match wait_timeout(&mut child, EXIT_TIMEOUT) {
            Some(st) if st.success() => {}
            Some(st) => panic!("esfs exited with {st} after unmount; log:\n{}", self.log()),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "esfs did not exit within {EXIT_TIMEOUT:?} of unmount; log:\n{}",
                    self.log()
                );
            }
        }
        assert!(!is_esfs_mounted(&self.mnt), "still mounted after unmount");
    }

    /// Unmount cleanly and mount again on the same store and data directories.
    /// A no-op in plain mode (the directory simply stays as it is).
    pub fn remount(&mut self) {
        if self.plain {
            eprintln!("plain mode: remount is a no-op (persistence not tested)");
            return;
        }
        self.unmount();
        self.start();
    }

    /// Simulate a crash: SIGKILL the daemon and lazily detach the dead mount.
    /// Follow with `start_again()` to mount on the same store. A no-op in plain mode.
    pub fn kill9(&mut self) {
        if self.plain {
            eprintln!("plain mode: kill9 is a no-op (crash recovery not tested)");
            return;
        }
        let mut child = self.child.take().expect("not mounted");
        self.watchdog = None;
        child.kill().expect("SIGKILL esfs");
        let _ = child.wait();
        lazy_unmount(&self.mnt);
    }

    /// Run the shell `script` in the mount and SIGKILL the daemon from the
    /// same shell the moment it ends (no pause in which the mount could
    /// commit what it acknowledged); then as `kill9`. Plain mode: just runs it.
    pub fn kill9_right_after(&mut self, script: &str) {
        let kill = match &self.child {
            Some(c) if !self.plain => format!("\nkill -9 {}", c.id()),
            _ => String::new(),
        };
        let out = Command::new("sh")
            .arg("-ec")
            .arg(format!("{script}{kill}"))
            .current_dir(&self.mnt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "script failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if self.plain {
            return;
        }
        let mut child = self.child.take().expect("not mounted");
        self.watchdog = None;
        let _ = child.wait();
        lazy_unmount(&self.mnt);
    }

    /// Send `sig` to the running daemon without waiting for anything.
    pub fn signal(&self, sig: libc::c_int) {
        let child = self.child.as_ref().expect("not mounted");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    }

    /// Stop the daemon with `sig` (SIGTERM, SIGINT, SIGHUP): it must unmount
    /// cleanly and exit 0. A no-op in plain mode.
    pub fn stop_with(&mut self, sig: libc::c_int) {
        if self.plain {
            return;
        }
        let mut child = self.child.take().expect("not mounted");
        self.watchdog = None;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        match wait_timeout(&mut child, EXIT_TIMEOUT) {
            Some(st) if st.success() => {}
            Some(st) => {
                lazy_unmount(&self.mnt);
                panic!(
                    "esfs exited with {st} on signal {sig}; log:\n{}",
                    self.log()
                )
            }
            None => {
                let _ = child.kill();
                let _ = child.wait();
                lazy_unmount(&self.mnt);
                panic!("esfs did not exit on signal {sig}; log:\n{}", self.log());
            }
        }
        assert!(
            !is_esfs_mounted(&self.mnt),
            "still mounted after signal {sig}"
        );
    }

    /// Mount again on the same store/data after `kill9()` or `unmount()`.
    pub fn start_again(&mut self) {
        if self.plain {
            return;
        }
        self.start();
    }

    /// Best-effort teardown that never panics.
    fn force_cleanup(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        self.watchdog = None;
        let clean = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !clean || wait_timeout(&mut child, EXIT_TIMEOUT).is_none() {
            let _ = child.kill();
            let _ = child.wait();
            lazy_unmount(&self.mnt);
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.plain {
            let log = self.log();
            if !log.trim().is_empty() {
                let tail: String = log
                    .chars()
                    .rev()
                    .take(8000)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                eprintln!("---- esfs log (tail) ----\n{tail}\n-------------------------");
            }
        }
        self.force_cleanup();
        // Never let TempDir's recursive delete wander into a still-mounted fs.
        if is_esfs_mounted(&self.mnt) {
            lazy_unmount(&self.mnt);
        }
    }
}

fn lazy_unmount(mnt: &Path) {
    let _ = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mnt)
        .stderr(Stdio::null())
        .status();
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() > deadline {
            return None;
        }
        sleep(Duration::from_millis(20));
    }
}

/// Filesystem type of the mount whose mountpoint is exactly `path`, per
/// /proc/self/mountinfo (the last matching entry is the visible one).
pub fn mount_fstype(path: &Path) -> Option<String> {
    let info = fs::read("/proc/self/mountinfo").unwrap();
    let want = path.as_os_str().as_bytes();
    let mut found = None;
    for line in info.split(|&c| c == b'\n') {
        let fields: Vec<&[u8]> = line.split(|&c| c == b' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == b"-") else {
            continue;
        };
        if fields.len() < 5 || sep + 1 >= fields.len() {
            continue;
        }
        if unescape_mountinfo(fields[4]) == want {
            found = Some(String::from_utf8_lossy(fields[sep + 1]).into_owned());
        }
    }
    found
}

pub fn is_esfs_mounted(path: &Path) -> bool {
    mount_fstype(path).as_deref() == Some("fuse.esfs")
}

/// mountinfo escapes space, tab, newline and backslash as \ooo (octal).
fn unescape_mountinfo(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------- shell helpers

pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Run `bash -c cmd` in `dir`; returns (status, stdout, stderr).
pub fn sh(dir: impl AsRef<Path>, cmd: &str) -> (ExitStatus, String, String) {
    let o = run(Command::new("bash").arg("-c").arg(cmd).current_dir(dir));
    (o.status, o.stdout, o.stderr)
}

/// Run `bash -c cmd` in `dir` as uid/gid 65534 (nobody) with no supplementary groups.
pub fn sh_nobody(dir: impl AsRef<Path>, cmd: &str) -> (ExitStatus, String, String) {
    let o = run(Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "bash",
            "-c",
            cmd,
        ])
        .env("HOME", "/tmp")
        .current_dir(dir));
    (o.status, o.stdout, o.stderr)
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.stdin(Stdio::null()).output().expect("spawn command");
    Output {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Run a shell command that must succeed; returns its stdout.
#[track_caller]
pub fn sh_ok(dir: impl AsRef<Path>, cmd: &str) -> String {
    let r = sh(dir, cmd);
    assert_success(cmd, &r);
    r.1
}

/// Assert a `sh` result succeeded, printing the command's output otherwise.
#[track_caller]
pub fn assert_success(cmd: &str, r: &(ExitStatus, String, String)) {
    assert!(
        r.0.success(),
        "command failed ({}): {cmd}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        r.0,
        r.1,
        r.2
    );
}

/// Assert a `sh` result failed and its stderr mentions `needle`.
#[track_caller]
pub fn assert_failure_with(cmd: &str, r: &(ExitStatus, String, String), needle: &str) {
    assert!(
        !r.0.success() && r.2.contains(needle),
        "expected failure containing {needle:?} ({}): {cmd}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        r.0,
        r.1,
        r.2
    );
}

// ---------------------------------------------------------------- syscall helpers

pub fn cstr(p: impl AsRef<OsStr>) -> CString {
    CString::new(p.as_ref().as_bytes()).unwrap()
}

/// The errno of a failed io::Result; panics (with context) if it succeeded.
#[track_caller]
pub fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("not an OS error: {e}")),
    }
}

/// Turn a libc return value (-1 = error) into an io::Result.
pub fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn lstat(p: impl AsRef<Path>) -> io::Result<libc::stat> {
    let c = cstr(p.as_ref());
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::lstat(c.as_ptr(), &mut st) })?;
    Ok(st)
}

pub fn stat(p: impl AsRef<Path>) -> libc::stat {
    let c = cstr(p.as_ref());
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::stat(c.as_ptr(), &mut st) })
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.as_ref().display()));
    st
}

pub fn mtime_ns(st: &libc::stat) -> (i64, i64) {
    (st.st_mtime, st.st_mtime_nsec)
}

pub fn ctime_ns(st: &libc::stat) -> (i64, i64) {
    (st.st_ctime, st.st_ctime_nsec)
}

/// Pause long enough that a coarse (jiffy-granular) clock has certainly ticked,
/// so "changed timestamp" checks do not depend on fine-grained clocks.
pub fn tick() {
    sleep(Duration::from_millis(15));
}

/// Deterministic pseudo-random bytes (xorshift), so content checks catch
/// misplaced blocks rather than comparing runs of identical bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

// ---------------------------------------------------------------- fixture tree

/// Build a fixed source tree under `dir` (which must not exist): text files
/// for grep, awkward sizes around block boundaries, nested and empty
/// directories, varied modes, and relative/dangling symlinks. If the crate's
/// own src/ is present a snapshot of it is included too (snapshotted first,
/// since it may be edited while the tests run).
pub fn make_tree(dir: &Path) {
    use std::os::unix::fs::symlink;
    let w = |rel: &str, data: &[u8]| {
        let p = dir.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, data).unwrap();
    };
    let mode = |rel: &str, m: u32| {
        fs::set_permissions(dir.join(rel), fs::Permissions::from_mode(m)).unwrap()
    };

    fs::create_dir(dir).unwrap();
    w("gen/README.txt", b"hello world\nthe needle is here\n");
    w("gen/empty.txt", b"");
    w("gen/one.bin", b"x");
    w("gen/sizes/4095.bin", &pattern(4095, 1));
    w("gen/sizes/4096.bin", &pattern(4096, 2));
    w("gen/sizes/4097.bin", &pattern(4097, 3));
    w("gen/sizes/64k7.bin", &pattern(65536 + 7, 4));
    w("gen/sizes/1m3.bin", &pattern((1 << 20) + 3, 5));
    w("gen/a/b/c/deep.txt", b"deep needle\n");
    w("gen/a/b/notes.txt", b"no match in this one\n");
    w(
        "gen/a/b/code.rs",
        b"fn main() {\n    println!(\"needle\");\n}\n",
    );
    w("gen/name with spaces.txt", b"spaced needle\n");
    w("gen/exec.sh", b"#!/bin/sh\necho ok\n");
    w("gen/secret.txt", b"private\n");
    w("gen/private/inner.txt", b"inner needle\n");
    fs::create_dir_all(dir.join("gen/empty_dir")).unwrap();
    fs::create_dir_all(dir.join("gen/a/empty_leaf")).unwrap();
    mode("gen/exec.sh", 0o755);
    mode("gen/secret.txt", 0o600);
    mode("gen/private", 0o700);
    mode("gen/sizes/4096.bin", 0o444);
    symlink("README.txt", dir.join("gen/link_to_readme")).unwrap();
    symlink("../../README.txt", dir.join("gen/a/b/up_link")).unwrap();
    symlink("does/not/exist", dir.join("gen/dangling")).unwrap();

    let crate_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    if crate_src.is_dir() {
        let r = sh(dir, &format!("cp -a '{}' crate-src", crate_src.display()));
        assert_success("snapshot crate src", &r);
    }
}

/// Writes, in bulk straight into a store, the documents `n` creates of empty
/// files `f000000`.. in directory `dir` (inode `dino`) would write: how the
/// tests make directories too big to fill through the mount in time.
pub fn bulk_files(store: &dyn esfs::store::MetaStore, dino: u64, dir: &str, n: u64) {
    use esfs::model::{entry_id, join_path};
    use esfs::store::{BulkOp, Idx};
    use serde_json::json;
    for start in (0..n).step_by(5000) {
        let mut ops = Vec::new();
        for i in start..n.min(start + 5000) {
            let (ino, name) = (50_000_000 + i, format!("f{i:06}"));
            ops.push(BulkOp::Create {
                index: Idx::Inodes,
                id: ino.to_string(),
                source: json!({"ino": ino, "kind": "file", "mode": 0o644, "uid": 0, "gid": 0,
                    "size": 0, "nlink": 1, "atime_ns": 0, "mtime_ns": 0, "ctime_ns": 0, "btime_ns": 0,
                    "content": ino.to_string(), "links": [{"p": dino, "n": name}]}),
            });
            ops.push(BulkOp::Create {
                index: Idx::Entries,
                id: entry_id(dino, name.as_bytes()),
                source: json!({"parent": dino, "name": name, "path": join_path(dir, &name),
                    "dir": dir, "ino": ino, "kind": "file", "cookie": ino, "size": 0,
                    "mtime": 0, "mode": 0o644, "uid": 0, "gid": 0}),
            });
        }
        assert!(store.bulk(ops).unwrap().iter().all(|r| r.is_ok()));
    }
    store.refresh(Idx::Entries).unwrap();
}

/// Drop a file's cached pages, so its next read reaches the filesystem.
pub fn drop_cached_pages(f: &fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a descriptor the caller owns.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// The tmpfile pattern: a file unlinked right after its open, before any
/// write reached the filesystem, stays usable, and its `len` bytes reach
/// the filesystem and come back from it. Returns the open file.
pub fn check_tmpfile_pattern(m: &Mount, len: usize) -> fs::File {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("tmpfile"))
        .unwrap();
    fs::remove_file(m.p("tmpfile")).unwrap();
    f.write_all(&pattern(len, 9)).unwrap();
    f.sync_all().unwrap();
    drop_cached_pages(&f);
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, pattern(len, 9));
    assert_eq!(f.metadata().unwrap().len(), len as u64);
    assert!(!m.p("tmpfile").exists());
    f
}

/// `cp` of files within the mount goes through COPY_FILE_RANGE, copied
/// inside the data store (the daemon logs each at debug level), with the
/// bytes, offsets, end of file, size, setuid clearing and a `kill -9` right
/// after as a write would have them; and nothing is logged at WARN (the
/// fallback used to log `[Not Implemented] copy_file_range`, and ioctl,
/// lseek and poll one line per call).
pub fn check_copy_file_range(m: &mut Mount) {
    // (fuser's unmount warning is filtered as the default filter does.)
    m.set_log_filter("warn,fuser::session=error,esfs::fuse=debug");
    m.remount();
    let logged_before = m.log().len();
    let big = pattern((5 << 20) + 123, 21);
    let small = pattern(1000, 22);
    fs::write(m.p("big"), &big).unwrap();
    fs::write(m.p("small"), &small).unwrap();
    fs::write(m.p("mid"), pattern(100 << 10, 23)).unwrap();
    // The source reads back whole first (a failure here is not the copy's).
    let back = fs::read(m.p("big")).unwrap();
    let zeros = back.iter().filter(|&&b| b == 0).count();
    assert!(
        back == big,
        "the 5 MiB source reads back wrong ({zeros} zero bytes)"
    );
    sh_ok(
        m.path(),
        "cp big big.copy && cp small small.copy && cp mid mid.copy",
    );
    let got = fs::read(m.p("big.copy")).unwrap();
    let diff = got.iter().zip(&big).position(|(a, b)| a != b);
    assert!(
        got == big,
        "big.copy: {} bytes, first difference at {diff:?}",
        got.len()
    );
    assert_eq!(fs::read(m.p("small.copy")).unwrap(), small);
    assert!(fs::read(m.p("mid.copy")).unwrap() == pattern(100 << 10, 23));
    // Offsets, one call for 3 MiB, the end of the source, past it, and
    // ranges of one file (overlapping ones the kernel refuses).
    let py = r#"
import errno, os
fi = os.open("big", os.O_RDONLY)
fo = os.open("dst", os.O_WRONLY | os.O_CREAT, 0o644)
print(os.copy_file_range(fi, fo, 3 << 20, 1000, 5000))
print(os.copy_file_range(fi, fo, 1 << 30, (5 << 20) + 100, 10))
print(os.copy_file_range(fi, fo, 10, (5 << 20) + 123, 0))
fs = os.open("same", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fs, b"0123456789" * 10000)
print(os.copy_file_range(fs, fs, 30000, 0, 50000))
try:
    os.copy_file_range(fs, fs, 100, 0, 50)
except OSError as e:
    print(errno.errorcode[e.errno])
fm = os.open("small", os.O_RDWR)
print(os.copy_file_range(fi, fm, 600, 7, 900))
"#;
    let out = sh_ok(m.path(), &format!("python3 -c '{py}'"));
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["3145728", "23", "0", "30000", "EINVAL", "600"]
    );
    let dst = fs::read(m.p("dst")).unwrap();
    assert_eq!(dst.len(), 5000 + (3 << 20));
    assert!(dst[..10].iter().all(|&b| b == 0));
    assert!(dst[5000..] == big[1000..1000 + (3 << 20)]);
    let dst = fs::read(m.p("small")).unwrap();
    assert_eq!(dst.len(), 1500);
    assert_eq!(&dst[..900], &small[..900]);
    assert_eq!(&dst[900..], &big[7..607]);
    let same = fs::read(m.p("same")).unwrap();
    let orig: Vec<u8> = b"0123456789".repeat(10000);
    assert_eq!(&same[50000..80000], &orig[..30000]);
    assert_eq!(&same[..50000], &orig[..50000]);
    // The kernel clears setuid before a non-root caller's copy, as before
    // its write.
    sh_ok(
        m.path(),
        "cp small suid && chown 65534 suid && chmod 4755 suid",
    );
    let r = sh_nobody(
        m.path(),
        "python3 -c 'import os; print(os.copy_file_range(os.open(\"big\", 0), os.open(\"suid\", os.O_WRONLY), 10))'",
    );
    assert_success("copy into a setuid file as nobody", &r);
    assert_eq!(r.1.trim(), "10");
    assert_eq!(
        fs::metadata(m.p("suid")).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    // ioctl, poll and SEEK_DATA/SEEK_HOLE: the right answers, quietly.
    let py = r#"
import errno, fcntl, os, select, termios
fd = os.open("mid", os.O_RDONLY)
for _ in range(3):
    try:
        fcntl.ioctl(fd, termios.TCGETS, bytes(64))
    except OSError as e:
        print(errno.errorcode[e.errno])
    print(os.isatty(fd))
    p = select.poll(); p.register(fd, select.POLLIN); print(len(p.poll(0)))
    print(os.lseek(fd, 10, os.SEEK_DATA), os.lseek(fd, 10, os.SEEK_HOLE))
"#;
    let out = sh_ok(m.path(), &format!("python3 -c '{py}'"));
    assert_eq!(out, "ENOTTY\nFalse\n1\n10 102400\n".repeat(3));
    // A kill -9 right after: bytes and size as copied.
    m.kill9_right_after("cp big big.again && cp small small.again");
    let log = m.log()[logged_before..].to_string();
    m.start_again();
    assert!(fs::read(m.p("big.again")).unwrap() == big);
    assert_eq!(
        fs::metadata(m.p("big.again")).unwrap().len(),
        big.len() as u64
    );
    assert_eq!(
        fs::read(m.p("small.again")).unwrap(),
        fs::read(m.p("small")).unwrap()
    );
    let copies = log.matches("copy_file_range: ").count();
    assert!(
        copies >= 8,
        "{copies} copies went through COPY_FILE_RANGE; log:\n{log}"
    );
    let warns: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ")).collect();
    assert!(warns.is_empty(), "warnings logged:\n{}", warns.join("\n"));
}

/// `st_blocks` counts what is stored: a 1 TiB sparse file takes nothing
/// until written in, then what was written; a dense file its size; before
/// and after a remount. `du` must not say 1.1T for an empty sparse file.
pub fn check_sparse_blocks(m: &mut Mount) {
    let du = |m: &Mount, rel: &str| -> u64 {
        let out = sh_ok(m.path(), &format!("du -k {rel}"));
        out.split_whitespace().next().unwrap().parse().unwrap()
    };
    sh_ok(m.path(), "truncate -s 1T sparse");
    assert_eq!(du(m, "sparse"), 0, "an empty sparse file");
    sh_ok(
        m.path(),
        "dd if=/dev/urandom of=sparse bs=1M count=2 seek=500000 conv=notrunc status=none
         dd if=/dev/urandom of=dense bs=1M count=3 status=none
         head -c 1000 /dev/urandom > small",
    );
    let check = |m: &Mount, when: &str| {
        // Allocation may add a few blocks of the data file's own metadata.
        let (s, d) = (du(m, "sparse"), du(m, "dense"));
        assert!(
            (2048..2048 + 64).contains(&s),
            "{when}: du of the sparse file {s}K"
        );
        assert!(
            (3072..3072 + 64).contains(&d),
            "{when}: du of the dense file {d}K"
        );
        assert_eq!(fs::metadata(m.p("sparse")).unwrap().len(), 1 << 40);
        let b = sh_ok(m.path(), "stat -c %b small");
        assert_eq!(b.trim(), "2", "{when}: blocks of a 1000-byte file");
    };
    // Cut back to a hole: its blocks go.
    sh_ok(
        m.path(),
        "truncate -s 1T cut
         dd if=/dev/urandom of=cut bs=1M count=1 seek=1000 conv=notrunc status=none
         truncate -s 1M cut",
    );
    assert_eq!(du(m, "cut"), 0, "cut back to its hole");
    check(m, "written");
    m.remount();
    check(m, "after remount");
    assert_eq!(du(m, "cut"), 0, "cut back to its hole, after remount");
}
