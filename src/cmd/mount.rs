//! `esfs mount`: open the stores, mount, serve until unmounted.
//!
//! Without `--foreground` the command starts itself again in the background
//! (a fresh process, so no threads are forked) and returns only once the
//! kernel lists the mount, or prints why the server could not start.

use super::CmdError;
use super::args::StoreArgs;
use crate::daemon::{block_signals, is_mounted, unmount_retrying, wait_signal};
use crate::data::blocks::BlockConfig;
use crate::fs::{Fs, FsConfig};
use crate::fuse::FuseFs;
use crate::locks::delegation;
use crate::open::{Backend, cache_for_mount, open_stores, unflushed_journal};
use crate::store::delegated::DEFAULT_BUDGET;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `esfs mount`: its command line.
#[derive(clap::Args)]
pub struct MountCmd {
    /// Directory to mount on (must exist).
    mountpoint: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
    /// Stay in the foreground and serve until unmounted (logs to stderr).
    #[arg(short, long)]
    foreground: bool,
    /// FUSE mount options, comma-separated: allow_other, allow_root, ro, rw,
    /// noatime, nodev, nosuid, noexec, dev, suid, exec, sync, dirsync,
    /// auto_unmount, fsname=NAME, nonempty (mount over a non-empty
    /// directory), writeback_cache (embedded store only; see docs/consistency.md).
    /// default_permissions is always on.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// How long the kernel may cache names and attributes, in seconds
    /// [default: 60 on the embedded store, whose only writer is this mount,
    /// so the kernel sees every change; 1 with --es, where other mounts
    /// change things behind it].
    #[arg(long, value_name = "SECS")]
    attr_ttl: Option<f64>,
    /// Threads serving FUSE requests.
    #[arg(long, value_name = "N", default_value_t = 4)]
    threads: usize,
    /// Do not take the tree's delegation (Elasticsearch). By default a
    /// mount that finds itself the filesystem's only one holds it: changes
    /// are acknowledged from memory and a local op log, and reach the
    /// cluster every 200 ms, on fsync, and when another mount starts (it
    /// recalls the delegation). With this, every change waits for the
    /// cluster. See docs/delegations.md.
    #[arg(long)]
    no_delegate: bool,
    /// The default with --es (accepted for older scripts).
    #[arg(long, hide = true, conflicts_with = "no_delegate")]
    delegate: bool,
    /// While the mount holds the delegation: how much memory, in MiB, it
    /// keeps of what the cluster already holds (documents it wrote or
    /// read); past it the oldest leave and are read from the cluster again,
    /// and a directory they leave is listed by the cluster. What waits to
    /// be sent is not counted (at most 4096 documents or 32 MiB).
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_BUDGET >> 20)]
    delegate_memory: usize,
    /// Where a delegated mount keeps its op log [default:
    /// $XDG_STATE_HOME/esfs, ~/.local/state/esfs, or /var/lib/esfs without a home].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Log file of the background server [default: <store>/esfs.log, or
    /// $XDG_DATA_HOME/esfs/esfs.log with --es].
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
}

/// `esfs umount`: its command line.
#[derive(clap::Args)]
pub struct UmountCmd {
    /// The mountpoint.
    mountpoint: PathBuf,
}

/// `esfs mount`: exit status 0 once the mount is live.
pub fn run(m: MountCmd) -> Result<i32, CmdError> {
    let (backend, data, log_dir) = m.store.resolve()?;
    let blocks = m.store.block_config()?;
    let ttl = m.attr_ttl.unwrap_or(match backend {
        Backend::Embedded(_) => 60.0,
        Backend::Elasticsearch(_) => 1.0,
    });
    if !(ttl.is_finite() && (0.0..=1e9).contains(&ttl)) {
        return Err("--attr-ttl must be a non-negative number of seconds".into());
    }
    let on_es = matches!(backend, Backend::Elasticsearch(_));
    if m.delegate && !on_es {
        return Err("--delegate needs --es: an embedded store is its mount's alone already".into());
    }
    let abs = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    mount(MountArgs {
        mountpoint: m.mountpoint,
        backend,
        data,
        blocks,
        foreground: m.foreground,
        options: m.options,
        attr_ttl: Duration::from_secs_f64(ttl),
        threads: m.threads,
        log: abs(m.log.unwrap_or_else(|| log_dir.join("esfs.log"))),
        delegate: (on_es && !m.no_delegate)
            .then(|| abs(m.state_dir.unwrap_or_else(default_state_dir))),
        delegate_memory: m.delegate_memory,
    })?;
    Ok(0)
}

/// `esfs umount`.
pub fn run_umount(u: UmountCmd) -> Result<i32, CmdError> {
    crate::daemon::umount(&u.mountpoint)?;
    println!("esfs: unmounted {}", u.mountpoint.display());
    Ok(0)
}

#[derive(Clone, Debug)]
struct MountArgs {
    pub mountpoint: PathBuf,
    pub backend: Backend,
    /// Contents directory; `None` on Elasticsearch keeps contents in the cluster.
    pub data: Option<PathBuf>,
    /// Contents in object storage (`data` is then its s3:// URL).
    pub blocks: Option<BlockConfig>,
    pub foreground: bool,
    pub options: Vec<String>,
    pub attr_ttl: Duration,
    pub threads: usize,
    pub log: PathBuf,
    /// `--delegate`: the state directory of its op logs.
    pub delegate: Option<PathBuf>,
    /// `--delegate-memory`, in MiB.
    pub delegate_memory: usize,
}

/// `$XDG_STATE_HOME/esfs`, or `~/.local/state/esfs`, or without a home
/// (a mount from fstab at boot) `/var/lib/esfs`: never /tmp, which a
/// reboot empties, and the op log must outlive a crash.
fn default_state_dir() -> PathBuf {
    let set = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = set("XDG_STATE_HOME") {
        return PathBuf::from(d).join("esfs");
    }
    match set("HOME") {
        Some(home) => PathBuf::from(home).join(".local/state/esfs"),
        None => PathBuf::from("/var/lib/esfs"),
    }
}

fn mount(args: MountArgs) -> Result<(), CmdError> {
    let mnt = std::fs::canonicalize(&args.mountpoint)
        .map_err(|e| format!("mountpoint {}: {e}", args.mountpoint.display()))?;
    if !mnt.is_dir() {
        return Err(format!("mountpoint {} is not a directory", mnt.display()).into());
    }
    if is_mounted(&mnt) {
        return Err(format!("{} is already an esfs mount", mnt.display()).into());
    }
    let nonempty = args
        .options
        .iter()
        .flat_map(|o| o.split(','))
        .any(|o| o == "nonempty");
    let in_it = std::fs::read_dir(&mnt)
        .map_err(|e| format!("mountpoint {}: {e}", mnt.display()))?
        .next()
        .is_some();
    if in_it && !nonempty {
        return Err(format!(
            "mountpoint {} is not empty: the mount would hide its files (-o nonempty mounts over them)",
            mnt.display()
        ).into());
    }
    let args = MountArgs {
        mountpoint: mnt,
        ..args
    };
    fuse_config(&args)?; // bad options fail here, not in the background server
    if writeback_cache(&args) && matches!(args.backend, Backend::Elasticsearch(_)) {
        // Known before connecting: an index is shared by design (the server
        // checks the store's capabilities again once it is open).
        return Err(WRITEBACK_NEEDS_SOLE.into());
    }
    if !args.foreground {
        // (The server logs them too; in the foreground its log is stderr.)
        for w in loose_permissions(&args) {
            eprintln!("esfs: warning: {w}");
        }
    }
    if args.foreground {
        serve(&args)
    } else {
        background(&args)
    }
}

fn background(args: &MountArgs) -> Result<(), CmdError> {
    if let Some(dir) = args.log.parent() {
        crate::private::dir_all(dir).map_err(|e| format!("log dir {}: {e}", dir.display()))?;
    }
    let log = crate::private::options()
        .create(true)
        .append(true)
        .open(&args.log)
        .map_err(|e| format!("log {}: {e}", args.log.display()))?;
    let start_len = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg(&args.mountpoint).arg("--foreground");
    match &args.backend {
        Backend::Embedded(dir) => {
            cmd.arg("--store").arg(dir);
        }
        Backend::Elasticsearch(es) => {
            // Secrets travel in the environment, never on a command line.
            cmd.env("ESFS_ES_URL", &es.url)
                .arg("--index")
                .arg(&es.index);
            for (var, val) in [
                ("ESFS_ES_USER", &es.user),
                ("ESFS_ES_PASSWORD", &es.password),
                ("ESFS_ES_API_KEY", &es.api_key),
            ] {
                match val {
                    Some(v) => cmd.env(var, v),
                    None => cmd.env_remove(var),
                };
            }
            if let Some(ca) = &es.ca {
                cmd.arg("--es-ca").arg(ca);
            }
            cmd.arg("--es-timeout")
                .arg(es.retry_budget.as_secs_f64().to_string());
            if let Some(n) = es.replicas {
                cmd.arg("--es-replicas").arg(n.to_string());
            }
        }
    }
    if let Some(data) = &args.data {
        cmd.arg("--data").arg(data);
    }
    if let Some(b) = &args.blocks {
        if let Some(e) = &b.endpoint {
            cmd.arg("--s3-endpoint").arg(e);
        }
        if let Some(d) = &b.cache_dir {
            cmd.arg("--cache-dir").arg(d);
        }
        cmd.arg("--cache-size").arg(b.cache_size.to_string());
    }
    cmd.arg("--attr-ttl")
        .arg(args.attr_ttl.as_secs_f64().to_string())
        .arg("--threads")
        .arg(args.threads.to_string())
        .arg("--log")
        .arg(&args.log);
    match &args.delegate {
        Some(dir) => cmd
            .arg("--state-dir")
            .arg(dir)
            .arg("--delegate-memory")
            .arg(args.delegate_memory.to_string()),
        None => cmd.arg("--no-delegate"),
    };
    for o in &args.options {
        cmd.arg("-o").arg(o);
    }
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
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
                "esfs: mounted {} (pid {})\n  metadata: {}\n  data:     {}\n  log:      {}\n  unmount:  esfs umount {}",
                args.mountpoint.display(),
                child.id(),
                args.backend.describe(),
                describe_data(args),
                args.log.display(),
                args.mountpoint.display()
            );
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            // The server's own one-line error is its last line.
            let text = std::fs::read(&args.log).unwrap_or_default();
            let tail = String::from_utf8_lossy(&text[(start_len as usize).min(text.len())..]);
            let last = tail
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            let last = last.strip_prefix("esfs: ").unwrap_or(last);
            return Err(format!(
                "{last} (server exited: {status}; log: {})",
                args.log.display()
            )
            .into());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(format!(
                "mount did not appear within 30 s; see {}",
                args.log.display()
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Warnings about the store, data directory and log when other local users
/// may read them (made by an older esfs, or by hand).
fn loose_permissions(args: &MountArgs) -> Vec<String> {
    let mut dirs: Vec<&Path> = Vec::new();
    if let Backend::Embedded(dir) = &args.backend {
        dirs.push(dir);
    }
    dirs.extend(args.data.as_deref());
    dirs.push(&args.log);
    crate::private::loose_warnings(&dirs)
}

fn fuse_config(args: &MountArgs) -> Result<fuser::Config, CmdError> {
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
            // Checked by `run`: the kernel mounts over anything.
            "nonempty" => continue,
            // Not a kernel option: asked for in FUSE's INIT (see `FuseFs`).
            "writeback_cache" => continue,
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
            other => return Err(format!("unknown mount option {other:?}").into()),
        };
        cfg.mount_options
            .retain(|x| !matches!((x, &m), (M::FSName(_), M::FSName(_))));
        cfg.mount_options.push(m);
    }
    cfg.n_threads = Some(args.threads.max(1));
    cfg.clone_fd = true;
    Ok(cfg)
}

fn describe_data(args: &MountArgs) -> String {
    match (&args.data, &args.backend) {
        (Some(d), _) if args.blocks.is_some() => {
            format!("{} (small files inline in the store)", d.display())
        }
        (Some(d), _) => d.display().to_string(),
        (None, Backend::Elasticsearch(es)) => format!("{}-chunks index", es.index),
        (None, Backend::Embedded(_)) => "?".into(),
    }
}

/// The kernel would own sizes and times that other mounts change.
const WRITEBACK_NEEDS_SOLE: &str =
    "-o writeback_cache needs the embedded store (a mount that is its store's only user)";

fn writeback_cache(args: &MountArgs) -> bool {
    args.options
        .iter()
        .flat_map(|o| o.split(','))
        .any(|o| o == "writeback_cache")
}

fn serve(args: &MountArgs) -> Result<(), CmdError> {
    // Signals are handled by one thread (blocked everywhere else, so first,
    // before any thread is spawned) that unmounts cleanly: `kill` never
    // leaves a dead mount behind.
    let signals = block_signals();
    let cfg = fuse_config(args)?;
    let writeback = writeback_cache(args);
    for w in loose_permissions(args) {
        log::warn!("{w}");
    }
    let stores = open_stores(
        &args.backend,
        args.data.as_deref(),
        args.blocks.as_ref(),
        true,
        args.delegate.as_deref(),
    )?;
    if writeback && !stores.meta.capabilities().single_writer {
        return Err(WRITEBACK_NEEDS_SOLE.into());
    }
    // --delegate: the metadata store answers writes from memory while this
    // mount holds the tree's delegation (taken once the lock session exists).
    let delegated = stores.delegated.clone();
    if let Some(d) = &delegated {
        d.set_budget(args.delegate_memory << 20);
    }
    let cached = cache_for_mount(stores.meta.clone(), args.attr_ttl, delegated.is_some());

    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let fs = Fs::new(
        cached.clone(),
        stores.data.clone(),
        FsConfig {
            root_uid: uid,
            root_gid: gid,
            label: args.mountpoint.display().to_string(),
            maintenance: false,
            no_tree_locks: std::env::var_os("ESFS_BENCH_NO_TREE_LOCKS").is_some_and(|v| v == "1"),
            // Lazy close needs contents written through on every write(2)
            // (the local data store, which embedded mounts always have).
            journal: match (&args.backend, &args.data) {
                (Backend::Embedded(dir), Some(_)) if args.blocks.is_none() => {
                    Some(unflushed_journal(dir))
                }
                _ => None,
            },
        },
    )
    .map_err(|e| format!("cannot start filesystem: {e}"))?;
    if let Some(d) = &delegated {
        // Once given back, cached documents carry local versions.
        let cache = Arc::downgrade(&cached);
        d.on_release(Box::new(move || {
            if let Some(c) = cache.upgrade() {
                c.clear();
            }
        }));
        let replayed = delegation::take(d, fs.lock_manager())
            .map_err(|e| format!("cannot take the tree's delegation: {e}"))?;
        if replayed > 0 {
            fs.recover_intents()
                .map_err(|e| format!("cannot roll forward what a dead mount left: {e}"))?;
        }
        delegation::keep_taking(d.clone(), Arc::downgrade(fs.lock_manager()));
    }
    // Content indexing for `esfs search` (a background thread).
    crate::search::attach(&fs, args.backend.description(args.data.as_deref()));
    let fs = Arc::new(fs);
    fs.spawn_janitor();
    fs.spawn_write_back();

    let session = fuser::Session::new(
        FuseFs::new(fs.clone(), args.attr_ttl, writeback),
        &args.mountpoint,
        &cfg,
    )
    .map_err(|e| format!("cannot mount {}: {e}", args.mountpoint.display()))?;
    let mnt = args.mountpoint.clone();
    std::thread::spawn(move || {
        loop {
            let sig = wait_signal(&signals);
            log::info!("signal {sig}: unmounting {}", mnt.display());
            match unmount_retrying(&mnt) {
                // The session ends; fuser's own unmount then finds it done.
                Ok(()) => return,
                Err(e) => log::error!(
                    "unmount {}: {e}; still serving: close what uses it and signal again",
                    mnt.display()
                ),
            }
        }
    });
    log::info!(
        "serving {} from {}",
        args.mountpoint.display(),
        fs.store().describe()
    );
    let r = session.run();
    // fuser unmounts as its session ends; its warning when the user already
    // did (`fusermount3 -u`: "Invalid argument") is filtered out in main,
    // so a mount that really stayed is reported here.
    if is_mounted(&args.mountpoint) {
        log::error!(
            "{} is still mounted: unmount it with esfs umount",
            args.mountpoint.display()
        );
    }
    fs.shutdown()
        .map_err(|e| format!("final write-back and sync: {e}"))?;
    if let Some(d) = &delegated {
        d.close(fs.lock_manager().owner())
            .map_err(|e| format!("giving back the tree's delegation: {e}"))?;
    }
    r.map_err(|e| format!("session ended with error: {e}").into())
}
