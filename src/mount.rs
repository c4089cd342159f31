//! `esfs mount`: open the stores, mount, serve until unmounted.
//!
//! Without `--foreground` the command starts itself again in the background
//! (a fresh process, so no threads are forked) and returns only once the
//! kernel lists the mount, or prints why the server could not start.

use crate::data::chunks::ChunkStore;
use crate::data::{DataStore, LocalDataStore};
use crate::fs::{Fs, FsConfig};
use crate::fuse::FuseFs;
use crate::store::cache::CachedStore;
use crate::store::embedded::EmbeddedStore;
use crate::store::es::{EsConfig, EsStore, redact};
use crate::store::{Idx, MetaStore, StoreError};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Memory bound of the document cache of an embedded-store mount.
const DOC_CACHE_BYTES: u64 = 64 << 20;
/// Memory bound of its directory listings (about 400k names).
const LISTING_BYTES: usize = 64 << 20;

pub const FSTYPE: &str = "fuse.esfs";

/// Where the metadata lives.
#[derive(Clone, Debug)]
pub enum Backend {
    /// The embedded SQLite store in this directory.
    Embedded(PathBuf),
    Elasticsearch(EsConfig),
}

#[derive(Clone, Debug)]
pub struct MountArgs {
    pub mountpoint: PathBuf,
    pub backend: Backend,
    /// Contents directory; `None` on Elasticsearch keeps contents in the cluster.
    pub data: Option<PathBuf>,
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
        ));
    }
    let args = MountArgs {
        mountpoint: mnt,
        ..args
    };
    fuse_config(&args)?; // bad options fail here, not in the background server
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

fn background(args: &MountArgs) -> Result<(), String> {
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
        }
    }
    if let Some(data) = &args.data {
        cmd.arg("--data").arg(data);
    }
    cmd.arg("--attr-ttl")
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
                "esfs: mounted {} (pid {})\n  metadata: {}\n  data:     {}\n  log:      {}\n  unmount:  esfs umount {}",
                args.mountpoint.display(),
                child.id(),
                describe_backend(&args.backend),
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

/// Where an embedded store's mount keeps its unflushed-files journal.
pub fn unflushed_journal(store_dir: &Path) -> PathBuf {
    store_dir.join("unflushed")
}

/// Whether a live mount serves this embedded store.
fn in_use_beside(backend: &Backend) -> bool {
    matches!(backend, Backend::Embedded(dir) if store_in_use(dir))
}

/// Whether a live mount holds the embedded store in `dir` (a probe that
/// neither takes nor changes its lock file).
fn store_in_use(dir: &Path) -> bool {
    let Ok(f) = File::open(dir.join("mount.lock")) else {
        return false;
    };
    // SAFETY: flock on a descriptor we own; released when it closes.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
}

/// Exclusive claim on an embedded store: one mount serves it at a time.
pub fn lock_store(dir: &Path) -> Result<File, String> {
    let path = dir.join("mount.lock");
    let f = crate::private::options()
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

fn describe_backend(b: &Backend) -> String {
    match b {
        Backend::Embedded(dir) => dir.display().to_string(),
        Backend::Elasticsearch(es) => format!("{} (indices {}-*)", redact(&es.url), es.index),
    }
}

fn describe_data(args: &MountArgs) -> String {
    match (&args.data, &args.backend) {
        (Some(d), _) => d.display().to_string(),
        (None, Backend::Elasticsearch(es)) => format!("{}-chunks index", es.index),
        (None, Backend::Embedded(_)) => "?".into(),
    }
}

/// The stores a mount (or a maintenance command) works on.
pub struct Stores {
    pub meta: Arc<dyn MetaStore>,
    pub data: Arc<dyn DataStore>,
    /// Holds an embedded store's mount lock while alive.
    pub lock: Option<File>,
}

/// Open the metadata store and the content store. A mount (`mount`) claims
/// an embedded store for this process and creates what is missing; the
/// maintenance commands (fsck, locks, search) create nothing and fail with
/// "no esfs filesystem at ..." where there is none.
pub fn open_stores(backend: &Backend, data: Option<&Path>, mount: bool) -> Result<Stores, String> {
    let (store, guard): (Arc<dyn MetaStore>, _) = match backend {
        Backend::Embedded(dir) => {
            if !EmbeddedStore::exists(dir) {
                if !mount {
                    return Err(format!("no esfs filesystem at {}", dir.display()));
                }
                // A new store: refuse another filesystem's contents before
                // making anything.
                if let Some(d) = data {
                    check_data(&Ident::default(), backend, d, true)?;
                }
            }
            if mount {
                crate::private::dir_all(dir)
                    .map_err(|e| format!("store {}: {e}", dir.display()))?;
            }
            let guard = if mount { Some(lock_store(dir)?) } else { None };
            let s = Arc::new(
                EmbeddedStore::open(dir)
                    .map_err(|e| format!("cannot open store {}: {e}", dir.display()))?,
            );
            // With the lock held this process is the store's only writer,
            // which is what makes caching documents and deferring commits
            // safe.
            let s: Arc<dyn MetaStore> = match guard {
                Some(_) => {
                    s.defer_commits()
                        .map_err(|e| format!("cannot open store {}: {e}", dir.display()))?;
                    Arc::new(CachedStore::new(s, DOC_CACHE_BYTES, LISTING_BYTES))
                }
                None => s,
            };
            (s, guard)
        }
        Backend::Elasticsearch(cfg) => {
            let s = match EsStore::connect_existing(cfg) {
                Err(StoreError::NotFound(_)) if mount => {
                    // A new index set: as a new embedded store above.
                    if let Some(d) = data {
                        check_data(&Ident::default(), backend, d, true)?;
                    }
                    EsStore::connect(cfg)
                }
                r => r,
            };
            let s = s.map_err(|e| match e {
                StoreError::NotFound(m) => m,
                e => e.to_string(),
            })?;
            log::info!("connected: {}", s.describe());
            (Arc::new(s), None)
        }
    };
    // (An embedded store's database file is its filesystem: beside a live
    // mount a fresh superblock may not be committed yet, and Fs::new checks.)
    if !mount
        && matches!(backend, Backend::Elasticsearch(_))
        && store
            .get(Idx::Meta, "fs")
            .map_err(|e| e.to_string())?
            .is_none()
    {
        return Err(format!(
            "no esfs filesystem at {}",
            describe_backend(backend)
        ));
    }
    // The filesystem id, and the data directory bound to it.
    if mount || data.is_some() {
        let id = ident(&*store)?;
        let stamp = match data {
            Some(dir) if mount || id.id.is_some() || !in_use_beside(backend) => {
                check_data(&id, backend, dir, mount)?
            }
            // Beside a live mount whose id is not committed yet: it checked.
            _ => false,
        };
        if mount {
            let fsid = ensure_fsid(&*store, &id)?;
            if let Some(dir) = data.filter(|_| stamp) {
                if id.formatted && id.id.is_none() {
                    log::info!(
                        "data directory {} adopted by store {} (filesystem {fsid})",
                        dir.display(),
                        describe_backend(backend)
                    );
                }
                stamp_data(dir, &fsid, &describe_backend(backend))
                    .map_err(|e| format!("data directory {}: {e}", dir.display()))?;
            }
        }
    }
    let data: Arc<dyn DataStore> = match data {
        Some(dir) if !mount && !dir.is_dir() => {
            return Err(format!(
                "data directory {} does not exist (give the mount's --data)",
                dir.display()
            ));
        }
        Some(dir) => Arc::new(
            LocalDataStore::open(dir)
                .map_err(|e| format!("cannot open data directory {}: {e}", dir.display()))?,
        ),
        None => Arc::new(ChunkStore::new(store.clone())),
    };
    Ok(Stores {
        meta: store,
        data,
        lock: guard,
    })
}

/// The metadata document holding the filesystem's id.
const FSID_DOC: &str = "fsid";
/// The file in a data directory naming the filesystem its contents belong to.
pub const FSID_FILE: &str = "esfs-fsid";

/// The data directory of a store given without --data: inside the store
/// directory, so that two stores never share one. The default store keeps
/// `$XDG_DATA_HOME/esfs/data`, which older esfs used for every store, when
/// that exists and `STORE/data` does not.
pub fn default_data(store: &Path) -> PathBuf {
    let own = store.join("data");
    let home = std::path::absolute(default_home()).unwrap_or_else(|_| default_home());
    let legacy = home.join("data");
    if !own.exists() && store == home.join("store") && legacy.is_dir() {
        legacy
    } else {
        own
    }
}

/// The filesystem id a data directory is stamped with (None: no stamp).
pub fn data_fsid(dir: &Path) -> Result<Option<String>, String> {
    let path = dir.join(FSID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| format!("{}: not an esfs stamp: {e}", path.display()))?;
            match v["fs_id"].as_str() {
                Some(id) => Ok(Some(id.to_string())),
                None => Err(format!("{}: not an esfs stamp (no fs_id)", path.display())),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn new_fsid() -> Result<String, String> {
    let mut b = [0u8; 16];
    // SAFETY: fills the buffer we own, of the length given.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(format!(
            "no random bytes for a filesystem id: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// A store's identity: its filesystem id (None: a new store, or one made
/// before ids) and whether it holds a filesystem (a superblock).
#[derive(Default)]
struct Ident {
    id: Option<String>,
    formatted: bool,
}

fn ident(store: &dyn MetaStore) -> Result<Ident, String> {
    let get = |id| store.get(Idx::Meta, id).map_err(|e| e.to_string());
    Ok(Ident {
        id: get(FSID_DOC)?.and_then(|d| d.source["id"].as_str().map(String::from)),
        formatted: get("fs")?.is_some(),
    })
}

/// The store's filesystem id, made now if it has none (its first mount).
fn ensure_fsid(store: &dyn MetaStore, ident: &Ident) -> Result<String, String> {
    if let Some(id) = &ident.id {
        return Ok(id.clone());
    }
    let id = new_fsid()?;
    match store.create(Idx::Meta, FSID_DOC, &serde_json::json!({ "id": id })) {
        Ok(_) => Ok(id),
        // Another mount of a shared store made it first.
        Err(StoreError::Conflict(_)) => ident_of_store(store),
        Err(e) => Err(e.to_string()),
    }
}

fn ident_of_store(store: &dyn MetaStore) -> Result<String, String> {
    ident(store)?
        .id
        .ok_or_else(|| "the filesystem id vanished while it was made".to_string())
}

/// Whether the data directory `dir` may serve the filesystem of the store
/// described by `ident`: contents are keyed by inode number, so another
/// filesystem's directory would serve (and overwrite) the wrong bytes. The
/// store holds a random id (made by its first mount) and the directory a
/// stamp with it; a mismatch is refused, naming both. Ok(true): a mount
/// should stamp it (a new or empty directory, or the unstamped directory of
/// a store from before ids, which adopts it).
fn check_data(ident: &Ident, backend: &Backend, dir: &Path, mount: bool) -> Result<bool, String> {
    let stamp = data_fsid(dir)?;
    let holds_contents = crate::data::holds_contents(dir, FSID_FILE);
    let (sdesc, ddesc) = (describe_backend(backend), dir.display());
    let (old, new) = (
        ident.formatted && ident.id.is_none(),
        !ident.formatted && ident.id.is_none(),
    );
    match (&ident.id, &stamp) {
        (Some(a), Some(b)) if a == b => Ok(false),
        (Some(a), Some(b)) => Err(format!(
            "data directory {ddesc} belongs to filesystem {b}, not to store {sdesc} \
             (filesystem {a}): give each store its own --data"
        )),
        (None, Some(b)) => Err(format!(
            "data directory {ddesc} belongs to filesystem {b}, not to store {sdesc} ({}): \
             give each store its own --data",
            if old {
                "made by an older esfs, without a filesystem id"
            } else {
                "a new filesystem"
            }
        )),
        (Some(a), None) if holds_contents => Err(format!(
            "data directory {ddesc} holds contents of an unknown filesystem (no {FSID_FILE}), \
             not of store {sdesc} (filesystem {a}): give each store its own --data"
        )),
        (None, None) if holds_contents && new => Err(format!(
            "data directory {ddesc} holds contents of an unknown filesystem (no {FSID_FILE}) \
             and store {sdesc} is new: give it an empty or new --data"
        )),
        (None, None) if old && mount && !dir.exists() => Err(format!(
            "store {sdesc} was made by an older esfs (no filesystem id) and data directory \
             {ddesc} does not exist: give --data with the directory holding its contents \
             (older esfs used {} for every store), or create {ddesc} if it had none",
            default_home().join("data").display()
        )),
        (_, None) => Ok(true),
    }
}

/// Write the stamp (a whole new file renamed into place).
fn stamp_data(dir: &Path, id: &str, store: &str) -> std::io::Result<()> {
    use std::io::Write;
    crate::private::dir_all(dir)?;
    let tmp = dir.join(format!("{FSID_FILE}.{}", std::process::id()));
    let mut f = crate::private::options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    let text = serde_json::json!({ "fs_id": id, "store": store }).to_string();
    f.write_all(format!("{text}\n").as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(FSID_FILE))?;
    File::open(dir)?.sync_all()
}

fn serve(args: &MountArgs) -> Result<(), String> {
    // Signals are handled by one thread (blocked everywhere else, so first,
    // before any thread is spawned) that unmounts cleanly: `kill` never
    // leaves a dead mount behind.
    let signals = block_signals();
    let cfg = fuse_config(args)?;
    // The embedded store has exactly one mount; Elasticsearch may have many.
    let exclusive = matches!(args.backend, Backend::Embedded(_));
    let writeback = args
        .options
        .iter()
        .flat_map(|o| o.split(','))
        .any(|o| o == "writeback_cache");
    if writeback && !exclusive {
        // The kernel would own sizes and times that other mounts change.
        return Err(
            "-o writeback_cache needs the embedded store (a mount that is its store's only user)"
                .into(),
        );
    }
    for w in loose_permissions(args) {
        log::warn!("{w}");
    }
    let stores = open_stores(&args.backend, args.data.as_deref(), true)?;

    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let fs = Fs::new(
        stores.meta.clone(),
        stores.data.clone(),
        FsConfig {
            exclusive,
            root_uid: uid,
            root_gid: gid,
            label: args.mountpoint.display().to_string(),
            maintenance: false,
            no_tree_locks: std::env::var_os("ESFS_BENCH_NO_TREE_LOCKS").is_some_and(|v| v == "1"),
            // Lazy close needs contents written through on every write(2)
            // (the local data store, which embedded mounts always have).
            journal: match (&args.backend, &args.data) {
                (Backend::Embedded(dir), Some(_)) => Some(unflushed_journal(dir)),
                _ => None,
            },
        },
    )
    .map_err(|e| format!("cannot start filesystem: {e}"))?;
    // Content indexing for `esfs search` (a background thread).
    crate::search::attach(&fs, &args.backend, args.data.as_deref());
    let fs = Arc::new(fs);
    fs.spawn_janitor();
    fs.spawn_write_back();

    let session = fuser::Session::new(
        FuseFs::new(fs.clone(), args.attr_ttl, exclusive, writeback),
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
    r.map_err(|e| format!("session ended with error: {e}"))
}

/// `esfs umount MNT`: unmount cleanly, then wait for the server's final
/// sync (its exit). The dead mount of a killed server is cleared (detached
/// lazily if something still uses it); a live, busy mount is refused.
pub fn umount(mnt: &Path) -> Result<(), String> {
    // Not canonicalize: a dead mount's root cannot be stat'ed.
    let abs = std::path::absolute(mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
    let mnt = match (abs.parent(), abs.file_name()) {
        (Some(p), Some(n)) => std::fs::canonicalize(p).unwrap_or(p.to_path_buf()).join(n),
        _ => abs.clone(),
    };
    if !is_mounted(&mnt) {
        return Err(format!("{} is not an esfs mount", mnt.display()));
    }
    let servers = server_pids(&mnt);
    let dead = servers.is_empty()
        || std::fs::metadata(&mnt).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN));
    if let Err(e) = unmount_retrying(&mnt) {
        if !dead {
            return Err(format!("cannot unmount {}: {e}", mnt.display()));
        }
        detach(&mnt).map_err(|e| format!("cannot unmount {}: {e}", mnt.display()))?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    for pid in servers {
        while Path::new(&format!("/proc/{pid}")).exists() {
            if Instant::now() > deadline {
                return Err(format!(
                    "unmounted {}, but its server (pid {pid}) is still writing back",
                    mnt.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// PIDs of the esfs servers of `mnt`: `esfs mount MNT --foreground`
/// processes, from their command lines.
fn server_pids(mnt: &Path) -> Vec<u32> {
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| {
            let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let argv: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
            let exe = argv
                .first()
                .map(|a| Path::new(std::ffi::OsStr::from_bytes(a)));
            if exe.and_then(|p| p.file_name()) != Some(std::ffi::OsStr::new("esfs"))
                || argv.get(1) != Some(&&b"mount"[..])
                || !argv.iter().any(|a| *a == b"--foreground" || *a == b"-f")
            {
                return false;
            }
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
            argv[2..]
                .iter()
                .filter(|a| !a.starts_with(b"-"))
                .any(|a| cwd.join(std::ffi::OsStr::from_bytes(a)) == mnt)
        })
        .collect()
}

/// Detach a dead mount that is still in use (umount -l).
fn detach(mnt: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(mnt.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mnt)
        .output()?;
    match out.status.success() {
        true => Ok(()),
        false => Err(std::io::Error::other(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )),
    }
}

/// Unmount `mnt` as its user would (umount(2) as root, else `fusermount3
/// -u`), retrying for a few seconds while it is busy: a reference on its
/// way out (a file manager's last look) should not keep the mount up. Not
/// fuser's unmounter: it gives up its mount after one try.
fn unmount_retrying(mnt: &Path) -> std::io::Result<()> {
    let busy = |e: &std::io::Error| e.raw_os_error() == Some(libc::EBUSY);
    let mut tries = 0;
    loop {
        match unmount_once(mnt) {
            Err(e) if busy(&e) && tries < 30 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

fn unmount_once(mnt: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(mnt.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EPERM) {
        return Err(e);
    }
    let out = Command::new("fusermount3").arg("-u").arg(mnt).output()?;
    let msg = String::from_utf8_lossy(&out.stderr);
    match out.status.success() {
        true => Ok(()),
        false if msg.contains("busy") => Err(std::io::Error::from_raw_os_error(libc::EBUSY)),
        false => Err(std::io::Error::other(msg.trim().to_string())),
    }
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
