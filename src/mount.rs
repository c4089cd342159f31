//! `esfs mount`: open the stores, mount, serve until unmounted.
//!
//! Without `--foreground` the command starts itself again in the background
//! (a fresh process, so no threads are forked) and returns only once the
//! kernel lists the mount, or prints why the server could not start.

use crate::data::LocalDataStore;
use crate::fs::{Fs, FsConfig};
use crate::fuse::FuseFs;
use crate::store::embedded::EmbeddedStore;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const FSTYPE: &str = "fuse.esfs";

#[derive(Clone, Debug)]
pub struct MountArgs {
    pub mountpoint: PathBuf,
    pub store: PathBuf,
    pub data: PathBuf,
    pub foreground: bool,
    pub options: Vec<String>,
    pub attr_ttl: Duration,
    pub threads: usize,
    pub log: PathBuf,
}

/// `$XDG_DATA_HOME/esfs`, else `~/.local/share/esfs`.
pub fn default_home() -> PathBuf {
    match std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x).join("esfs"),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
            PathBuf::from(home).join(".local/share/esfs")
        }
    }
}

pub fn run(args: MountArgs) -> Result<(), String> {
    let mnt = std::fs::canonicalize(&args.mountpoint)
        .map_err(|e| format!("mountpoint {}: {e}", args.mountpoint.display()))?;
    if !mnt.is_dir() {
        return Err(format!("mountpoint {} is not a directory", mnt.display()));
    }
    if is_mounted(&mnt) {
        return Err(format!("{} is already an esfs mount", mnt.display()));
    }
    let args = MountArgs {
        mountpoint: mnt,
        ..args
    };
    fuse_config(&args)?; // bad options fail here, not in the background server
    if args.foreground {
        serve(&args)
    } else {
        background(&args)
    }
}

fn background(args: &MountArgs) -> Result<(), String> {
    if let Some(dir) = args.log.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("log dir {}: {e}", dir.display()))?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)
        .map_err(|e| format!("log {}: {e}", args.log.display()))?;
    let start_len = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(&args.mountpoint)
        .arg("--foreground")
        .arg("--store")
        .arg(&args.store)
        .arg("--data")
        .arg(&args.data)
        .arg("--attr-ttl")
        .arg(args.attr_ttl.as_secs_f64().to_string())
        .arg("--threads")
        .arg(args.threads.to_string())
        .arg("--log")
        .arg(&args.log);
    for o in &args.options {
        cmd.arg("-o").arg(o);
    }
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; detaches from our terminal session.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start server: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if is_mounted(&args.mountpoint) {
            println!(
                "esfs: mounted {} (pid {})\n  metadata: {}\n  data:     {}\n  log:      {}\n  unmount:  fusermount3 -u {}",
                args.mountpoint.display(),
                child.id(),
                args.store.display(),
                args.data.display(),
                args.log.display(),
                args.mountpoint.display()
            );
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read(&args.log).unwrap_or_default();
            let tail = String::from_utf8_lossy(&text[(start_len as usize).min(text.len())..]);
            return Err(format!(
                "server exited ({status}) before mounting:\n{}",
                tail.trim_end()
            ));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(format!(
                "mount did not appear within 30 s; see {}",
                args.log.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the kernel lists `mnt` as an esfs mount (reads /proc/self/mountinfo).
pub fn is_mounted(mnt: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = mnt.as_os_str().as_encoded_bytes();
    info.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            return false;
        };
        fields.get(4).is_some_and(|p| unescape_mountinfo(p) == want)
            && fields.get(sep + 1) == Some(&FSTYPE)
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = |c: u8| (b'0'..=b'7').contains(&c).then(|| c - b'0');
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let (Some(x), Some(y), Some(z)) = (oct(b[i + 1]), oct(b[i + 2]), oct(b[i + 3]))
        {
            out.push(x << 6 | y << 3 | z);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Exclusive claim on an embedded store: one mount serves it at a time.
fn lock_store(dir: &Path) -> Result<File, String> {
    let path = dir.join("mount.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        return Err(format!(
            "store {} is in use by another esfs mount ({})",
            dir.display(),
            holder.trim()
        ));
    }
    let _ = f.set_len(0);
    let _ = std::os::unix::fs::FileExt::write_at(
        &f,
        format!("pid {}", std::process::id()).as_bytes(),
        0,
    );
    Ok(f)
}

fn fuse_config(args: &MountArgs) -> Result<fuser::Config, String> {
    use fuser::{MountOption as M, SessionACL};
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        M::FSName("esfs".into()),
        // The kernel parses subtype= itself; fuser's Subtype only reaches
        // fusermount, so a direct (root) mount would show plain "fuse".
        M::CUSTOM("subtype=esfs".into()),
        M::DefaultPermissions,
    ];
    for opt in args
        .options
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        let m = match opt {
            "allow_other" => {
                cfg.acl = SessionACL::All;
                continue;
            }
            "allow_root" => {
                cfg.acl = SessionACL::RootAndOwner;
                continue;
            }
            "default_permissions" => continue,
            "auto_unmount" => M::AutoUnmount,
            "ro" => M::RO,
            "rw" => M::RW,
            "dev" => M::Dev,
            "nodev" => M::NoDev,
            "suid" => M::Suid,
            "nosuid" => M::NoSuid,
            "exec" => M::Exec,
            "noexec" => M::NoExec,
            "atime" => M::Atime,
            "noatime" => M::NoAtime,
            "dirsync" => M::DirSync,
            "sync" => M::Sync,
            "async" => M::Async,
            o if o.starts_with("fsname=") => M::FSName(o[7..].into()),
            other => return Err(format!("unknown mount option {other:?}")),
        };
        cfg.mount_options
            .retain(|x| !matches!((x, &m), (M::FSName(_), M::FSName(_))));
        cfg.mount_options.push(m);
    }
    cfg.n_threads = Some(args.threads.max(1));
    cfg.clone_fd = true;
    Ok(cfg)
}

fn serve(args: &MountArgs) -> Result<(), String> {
    let cfg = fuse_config(args)?;
    std::fs::create_dir_all(&args.store)
        .map_err(|e| format!("store {}: {e}", args.store.display()))?;
    let _lock = lock_store(&args.store)?;
    let store = EmbeddedStore::open(&args.store)
        .map_err(|e| format!("cannot open store {}: {e}", args.store.display()))?;
    let data = LocalDataStore::open(&args.data)
        .map_err(|e| format!("cannot open data directory {}: {e}", args.data.display()))?;
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let fs = Fs::new(
        Arc::new(store),
        Arc::new(data),
        FsConfig {
            exclusive: true,
            root_uid: uid,
            root_gid: gid,
        },
    )
    .map_err(|e| format!("cannot start filesystem: {e}"))?;
    let fs = Arc::new(fs);

    // Signals are handled by one thread (blocked everywhere else) that
    // unmounts cleanly, so `kill` never leaves a dead mount behind.
    let signals = block_signals();
    let mut session = fuser::Session::new(
        FuseFs::new(fs.clone(), args.attr_ttl, true),
        &args.mountpoint,
        &cfg,
    )
    .map_err(|e| format!("cannot mount {}: {e}", args.mountpoint.display()))?;
    let mut unmounter = session.unmount_callable();
    let mnt = args.mountpoint.clone();
    std::thread::spawn(move || {
        let sig = wait_signal(&signals);
        log::info!("signal {sig}: unmounting {}", mnt.display());
        if let Err(e) = unmounter.unmount() {
            log::error!("unmount {}: {e}", mnt.display());
        }
    });
    log::info!(
        "serving {} from {}",
        args.mountpoint.display(),
        fs.store().describe()
    );
    let r = session.run();
    fs.store().sync().map_err(|e| format!("final sync: {e}"))?;
    r.map_err(|e| format!("session ended with error: {e}"))
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: building and installing a signal mask for this thread (and
    // the threads it spawns afterwards).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: waits for one of the blocked signals.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}
