//! The one place a filesystem's stores are opened (above `store` and
//! `data`, which know nothing of each other's opening): which backend (`Backend`), the
//! metadata store (claimed by a mount, or read beside one), the contents
//! store bound to it by a filesystem id, and the mount description that
//! `esfs search` reads back. Mount, fsck, locks and search all open stores here.

use crate::data::blocks::{BlockConfig, BlockStore, S3Location, is_object_url};
use crate::data::chunks::ChunkStore;
use crate::data::objects::ObjectStore;
use crate::data::{DataStore, LocalDataStore};
use crate::store::cache::CachedStore;
use crate::store::delegated::DelegatedStore;
use crate::store::embedded::EmbeddedStore;
use crate::store::es::{EsConfig, EsStore, redact};
use crate::store::{Idx, MetaStore, StoreError};
use serde_json::{Value, json};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Memory bound of a mount's document cache (as `approx_size` counts:
/// about 2.5x that in heap).
const DOC_CACHE_BYTES: u64 = 64 << 20;
/// The same in front of a delegated store, whose overlay already holds
/// what the mount wrote and read, within `--delegate-memory`: a cache as
/// large would hold a second copy of the same documents (at 100k files,
/// 186 MiB of a 729 MiB heap peak, heaptrack, docs/cluster.md).
const DELEGATED_DOC_CACHE_BYTES: u64 = 8 << 20;
/// Memory bound of its directory listings (about 400k names).
const LISTING_BYTES: usize = 64 << 20;

/// Why a store could not be opened: each a one-line message naming what.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Nothing to open (the maintenance commands create nothing).
    #[error("no esfs filesystem at {0}")]
    NoFilesystem(String),
    /// Another live mount holds an embedded store.
    #[error("store {store} is in use by another esfs mount ({holder})")]
    InUse { store: String, holder: String },
    /// The data directory belongs to another filesystem, or cannot be
    /// bound to this one (the message says which and what to do).
    #[error("{0}")]
    DataBinding(String),
    /// The engine refused or could not be reached (its message names it).
    #[error(transparent)]
    Engine(StoreError),
    #[error("{what}: {source}")]
    Store {
        what: String,
        #[source]
        source: StoreError,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A mount description that does not say where its store is.
    #[error("bad mount description: {0}")]
    Description(String),
}

impl OpenError {
    fn store(what: impl std::fmt::Display) -> impl FnOnce(StoreError) -> OpenError {
        let what = what.to_string();
        move |source| OpenError::Store { what, source }
    }
    fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> OpenError {
        let what = what.to_string();
        move |source| OpenError::Io { what, source }
    }
}

/// Where the metadata lives.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    /// The embedded SQLite store in this directory.
    Embedded(PathBuf),
    Elasticsearch(EsConfig),
}

impl Backend {
    /// For messages: the store directory, or the cluster (no credentials).
    pub(crate) fn describe(&self) -> String {
        match self {
            Backend::Embedded(dir) => dir.display().to_string(),
            Backend::Elasticsearch(es) => {
                format!("{} (indices {}-*)", redact(&es.url), es.index)
            }
        }
    }

    /// The mount description (the root's `crate::hook::DESCRIBE_XATTR`
    /// reply carries it): `{"backend": "embedded", "store": DIR, "data":
    /// DIR}` or `{"backend": "elasticsearch", "url": URL (no credentials),
    /// "index": NAME, "data": DIR|null, "ca": FILE|null}`.
    pub(crate) fn description(&self, data: Option<&Path>) -> Value {
        match self {
            Backend::Embedded(dir) => json!({"backend": "embedded", "store": dir, "data": data}),
            Backend::Elasticsearch(es) => json!({
                "backend": "elasticsearch",
                "url": redact(&es.url),
                "index": es.index,
                "data": data,
                "ca": es.ca,
            }),
        }
    }

    /// The backend a mount description names. `es` makes the cluster's
    /// configuration (credentials are the reader's own) from the URL and
    /// index the description gives.
    pub(crate) fn from_description(
        v: &Value,
        es: impl FnOnce(&str, &str) -> EsConfig,
    ) -> Result<Backend, OpenError> {
        let field = |k: &str| {
            v[k].as_str()
                .ok_or_else(|| OpenError::Description(format!("no {k} in {v}")))
        };
        match v["backend"].as_str() {
            Some("embedded") => Ok(Backend::Embedded(PathBuf::from(field("store")?))),
            Some("elasticsearch") => {
                let mut cfg = es(field("url")?, v["index"].as_str().unwrap_or("esfs"));
                if cfg.ca.is_none() {
                    cfg.ca = v["ca"].as_str().map(PathBuf::from);
                }
                Ok(Backend::Elasticsearch(cfg))
            }
            other => Err(OpenError::Description(format!("unknown backend {other:?}"))),
        }
    }
}

/// `$XDG_DATA_HOME/esfs`, else `~/.local/share/esfs`.
pub(crate) fn default_home() -> PathBuf {
    match std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x).join("esfs"),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
            PathBuf::from(home).join(".local/share/esfs")
        }
    }
}

/// Where an embedded store's mount keeps its unflushed-files journal.
pub(crate) fn unflushed_journal(store_dir: &Path) -> PathBuf {
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
pub(crate) fn lock_store(dir: &Path) -> Result<File, OpenError> {
    let path = dir.join("mount.lock");
    let f = crate::private::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(OpenError::io(path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        return Err(OpenError::InUse {
            store: dir.display().to_string(),
            holder: holder.trim().to_string(),
        });
    }
    let _ = f.set_len(0);
    let _ = std::os::unix::fs::FileExt::write_at(
        &f,
        format!("pid {}", std::process::id()).as_bytes(),
        0,
    );
    Ok(f)
}

/// The stores a mount (or a maintenance command) works on.
pub(crate) struct Stores {
    pub meta: Arc<dyn MetaStore>,
    pub data: Arc<dyn DataStore>,
    /// `--delegate`: the layer `meta` is (both stores write through it).
    pub delegated: Option<Arc<DelegatedStore>>,
    /// Holds an embedded store's mount lock while alive (never read).
    pub _lock: Option<File>,
}

/// The metadata store alone. A mount (`mount`) claims an embedded store
/// for this process (the returned lock) and creates what is missing; a
/// reader (fsck, locks, search) creates nothing and gets
/// [`OpenError::NoFilesystem`] where there is none.
pub(crate) fn open_meta(
    backend: &Backend,
    mount: bool,
) -> Result<(Arc<dyn MetaStore>, Option<File>), OpenError> {
    open_meta_for(backend, mount, None)
}

/// [`open_meta`]; a mount that creates a new store first checks that the
/// data directory `data` holds no other filesystem's contents.
fn open_meta_for(
    backend: &Backend,
    mount: bool,
    data: Option<&Path>,
) -> Result<(Arc<dyn MetaStore>, Option<File>), OpenError> {
    let check_new = || match data {
        Some(d) => check_data(&Ident::default(), backend, d, true).map(drop),
        None => Ok(()),
    };
    let cannot_open = |dir: &Path| OpenError::store(format!("cannot open store {}", dir.display()));
    let (store, guard): (Arc<dyn MetaStore>, _) = match backend {
        Backend::Embedded(dir) => {
            if !EmbeddedStore::exists(dir) {
                if !mount {
                    return Err(OpenError::NoFilesystem(dir.display().to_string()));
                }
                check_new()?;
            }
            if mount {
                crate::private::dir_all(dir)
                    .map_err(OpenError::io(format!("store {}", dir.display())))?;
            }
            let guard = if mount { Some(lock_store(dir)?) } else { None };
            let s = Arc::new(EmbeddedStore::open(dir).map_err(cannot_open(dir))?);
            // With the lock held this process is the store's only writer,
            // which is what makes deferring commits (and the mount's
            // document cache, `cache_for_mount`) safe.
            if guard.is_some() {
                s.defer_commits().map_err(cannot_open(dir))?;
            }
            (s, guard)
        }
        Backend::Elasticsearch(cfg) => {
            let s = match EsStore::connect_existing(cfg) {
                Err(StoreError::NotFound(_)) if mount => {
                    check_new()?;
                    EsStore::connect(cfg)
                }
                r => r,
            };
            let s = s.map_err(|e| match e {
                // Its message names the missing index.
                StoreError::NotFound(m) => OpenError::NoFilesystem(
                    m.strip_prefix("no esfs filesystem at ")
                        .unwrap_or(&m)
                        .to_string(),
                ),
                e => OpenError::Engine(e),
            })?;
            log::info!("connected: {}", s.describe());
            (Arc::new(s), None)
        }
    };
    // A command's requests are named as its (a mount's handle serves its
    // filesystem calls; its other components take their own, by name).
    let store = if mount {
        store
    } else {
        crate::store::for_caller(&store, crate::store::Caller::Command)
    };
    // (An embedded store's database file is its filesystem: beside a live
    // mount a fresh superblock may not be committed yet, and Fs::new checks.)
    if !mount
        && matches!(backend, Backend::Elasticsearch(_))
        && store
            .get(Idx::Meta, "fs")
            .map_err(OpenError::store(backend.describe()))?
            .is_none()
    {
        return Err(OpenError::NoFilesystem(backend.describe()));
    }
    Ok((store, guard))
}

/// A mount's document cache in front of its store. The only writer's
/// (an embedded store claimed by the mount) is exact; in front of a store
/// other mounts write too (Elasticsearch) a document is trusted for `ttl`,
/// the mount's attribute TTL, so another mount's change is seen within it.
/// `delegated`: the store is a [`DelegatedStore`], which holds documents
/// itself (a small cache then).
pub(crate) fn cache_for_mount(
    meta: Arc<dyn MetaStore>,
    ttl: std::time::Duration,
    delegated: bool,
) -> Arc<CachedStore> {
    let docs = match delegated {
        true => DELEGATED_DOC_CACHE_BYTES,
        false => DOC_CACHE_BYTES,
    };
    Arc::new(if meta.capabilities().single_writer {
        CachedStore::new(meta, docs, LISTING_BYTES)
    } else {
        CachedStore::shared(meta, docs, LISTING_BYTES, ttl)
    })
}

/// Open the metadata store ([`open_meta`]) and the contents store bound to
/// it: the data directory `data`, or chunk documents in the cluster. A
/// mount given `delegate` (the op logs' state directory) puts the
/// delegated store in front of the metadata store, for both to write
/// through ([`DelegatedStore`]).
pub(crate) fn open_stores(
    backend: &Backend,
    data: Option<&Path>,
    blocks: Option<&BlockConfig>,
    mount: bool,
    delegate: Option<&Path>,
) -> Result<Stores, OpenError> {
    let url = data.and_then(|d| d.to_str()).filter(|u| is_object_url(u));
    if let Some(url) = url {
        let cfg = match blocks {
            Some(c) => c.clone(),
            None => BlockConfig::new(S3Location::parse(url).map_err(OpenError::DataBinding)?),
        };
        return open_objects(backend, &cfg, mount, delegate);
    }
    let (store, guard) = open_meta_for(backend, mount, data)?;
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
                        backend.describe()
                    );
                }
                stamp_data(dir, &fsid, &backend.describe())
                    .map_err(OpenError::io(format!("data directory {}", dir.display())))?;
            }
        }
    }
    let (store, delegated) = delegated(store, delegate)?;
    let data: Arc<dyn DataStore> = match data {
        Some(dir) if !mount && !dir.is_dir() => {
            return Err(OpenError::DataBinding(format!(
                "data directory {} does not exist (give the mount's --data)",
                dir.display()
            )));
        }
        Some(dir) => Arc::new(LocalDataStore::open(dir).map_err(OpenError::io(format!(
            "cannot open data directory {}",
            dir.display()
        )))?),
        None => Arc::new(ChunkStore::new(store.clone())),
    };
    Ok(Stores {
        meta: store,
        data,
        delegated,
        _lock: guard,
    })
}

/// `store` behind the delegated store when `delegate` names the op logs'
/// state directory (a subdirectory per filesystem id in it: a log is only
/// ever replayed into the filesystem it was written for).
/// A store as the filesystem sees it, and the delegated layer it is, if.
type Layered = (Arc<dyn MetaStore>, Option<Arc<DelegatedStore>>);

fn delegated(store: Arc<dyn MetaStore>, delegate: Option<&Path>) -> Result<Layered, OpenError> {
    let Some(dir) = delegate else {
        return Ok((store, None));
    };
    let fsid = ident_of_store(&*store)?;
    let d = DelegatedStore::new(store, dir.join(fsid));
    Ok((d.clone(), Some(d)))
}

/// [`open_stores`] with contents in object storage: the metadata store
/// as for chunks in the cluster, the bucket checked with one request (a
/// mount fails fast, with one line naming the URL and the cause), and a
/// mount's collector of superseded blocks started.
fn open_objects(
    backend: &Backend,
    cfg: &BlockConfig,
    mount: bool,
    delegate: Option<&Path>,
) -> Result<Stores, OpenError> {
    let (store, guard) = open_meta_for(backend, mount, None)?;
    let blocks = BlockStore::open(cfg).map_err(|e| OpenError::DataBinding(e.to_string()))?;
    blocks
        .check()
        .map_err(|e| OpenError::DataBinding(e.to_string()))?;
    let id = ident(&*store)?;
    let fsid = match mount {
        true => Some(ensure_fsid(&*store, &id)?),
        false => id.id.clone(),
    };
    if let Some(fsid) = fsid {
        check_prefix(&blocks, &fsid, backend, mount)?;
    }
    let (store, delegated) = delegated(store, delegate)?;
    let objects = ObjectStore::new(store.clone(), Arc::new(blocks), gc_grace());
    if mount {
        crate::data::objects::spawn_collector(objects.clone(), GC_EVERY.min(gc_grace()));
    }
    Ok(Stores {
        meta: store,
        data: objects,
        delegated,
        _lock: guard,
    })
}

/// Whether the prefix's blocks belong to filesystem `fsid` (its stamp
/// object, as a data directory's `esfs-fsid` file): a mount stamps a
/// prefix that has none.
fn check_prefix(
    blocks: &BlockStore,
    fsid: &str,
    backend: &Backend,
    mount: bool,
) -> Result<(), OpenError> {
    let bad = |e: crate::data::blocks::BlockError| OpenError::DataBinding(e.to_string());
    match blocks.stamp().map_err(bad)? {
        Some(b) => {
            let v: Value = serde_json::from_slice(&b).unwrap_or_default();
            match v["fs_id"].as_str() {
                Some(id) if id == fsid => Ok(()),
                other => Err(OpenError::DataBinding(format!(
                    "{} belongs to filesystem {}, not to store {} (filesystem {fsid}): give each \
                     filesystem its own prefix",
                    blocks.describe(),
                    other.unwrap_or("(an unreadable esfs-fsid)"),
                    backend.describe()
                ))),
            }
        }
        None if mount => {
            let text = json!({"fs_id": fsid, "store": backend.describe()}).to_string();
            blocks.set_stamp(text.into()).map_err(bad)
        }
        None => Ok(()),
    }
}

/// How often a mount collects superseded blocks.
const GC_EVERY: Duration = Duration::from_secs(60);

/// How long superseded and deleted blocks are kept (an open reader on
/// another mount keeps reading its version meanwhile): 1 hour, or
/// `ESFS_GC_GRACE` seconds (tests).
fn gc_grace() -> Duration {
    std::env::var("ESFS_GC_GRACE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(Duration::from_secs(3600), Duration::from_secs_f64)
}

/// The metadata document holding the filesystem's id.
const FSID_DOC: &str = "fsid";
/// The file in a data directory naming the filesystem its contents belong to.
pub(crate) const FSID_FILE: &str = "esfs-fsid";

/// The data directory of a store given without --data: inside the store
/// directory, so that two stores never share one. The default store keeps
/// `$XDG_DATA_HOME/esfs/data`, which older esfs used for every store, when
/// that exists and `STORE/data` does not.
pub(crate) fn default_data(store: &Path) -> PathBuf {
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
pub(crate) fn data_fsid(dir: &Path) -> Result<Option<String>, OpenError> {
    let path = dir.join(FSID_FILE);
    let not_stamp =
        |why: String| OpenError::DataBinding(format!("{}: not an esfs stamp{why}", path.display()));
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let v: Value = serde_json::from_str(&text).map_err(|e| not_stamp(format!(": {e}")))?;
            match v["fs_id"].as_str() {
                Some(id) => Ok(Some(id.to_string())),
                None => Err(not_stamp(" (no fs_id)".into())),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(OpenError::io(path.display())(e)),
    }
}

fn new_fsid() -> Result<String, OpenError> {
    let mut b = [0u8; 16];
    // SAFETY: fills the buffer we own, of the length given.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(OpenError::io("no random bytes for a filesystem id")(
            std::io::Error::last_os_error(),
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

fn ident(store: &dyn MetaStore) -> Result<Ident, OpenError> {
    let get = |id| {
        store
            .get(Idx::Meta, id)
            .map_err(OpenError::store("the filesystem id"))
    };
    Ok(Ident {
        id: get(FSID_DOC)?.and_then(|d| d.source["id"].as_str().map(String::from)),
        formatted: get("fs")?.is_some(),
    })
}

/// The store's filesystem id, made now if it has none (its first mount).
fn ensure_fsid(store: &dyn MetaStore, ident: &Ident) -> Result<String, OpenError> {
    if let Some(id) = &ident.id {
        return Ok(id.clone());
    }
    let id = new_fsid()?;
    match store.create(Idx::Meta, FSID_DOC, &serde_json::json!({ "id": id })) {
        Ok(_) => Ok(id),
        // Another mount of a shared store made it first.
        Err(StoreError::Conflict(_)) => ident_of_store(store),
        Err(e) => Err(OpenError::store("the filesystem id")(e)),
    }
}

fn ident_of_store(store: &dyn MetaStore) -> Result<String, OpenError> {
    ident(store)?.id.ok_or_else(|| {
        OpenError::Description("the filesystem id vanished while it was made".into())
    })
}

/// Whether the data directory `dir` may serve the filesystem of the store
/// described by `ident`: contents are keyed by inode number, so another
/// filesystem's directory would serve (and overwrite) the wrong bytes. The
/// store holds a random id (made by its first mount) and the directory a
/// stamp with it; a mismatch is refused, naming both. Ok(true): a mount
/// should stamp it (a new or empty directory, or the unstamped directory of
/// a store from before ids, which adopts it).
fn check_data(
    ident: &Ident,
    backend: &Backend,
    dir: &Path,
    mount: bool,
) -> Result<bool, OpenError> {
    let stamp = data_fsid(dir)?;
    let holds_contents = crate::data::holds_contents(dir, FSID_FILE);
    let (sdesc, ddesc) = (backend.describe(), dir.display());
    let (old, new) = (
        ident.formatted && ident.id.is_none(),
        !ident.formatted && ident.id.is_none(),
    );
    match (&ident.id, &stamp) {
        (Some(a), Some(b)) if a == b => Ok(false),
        (Some(a), Some(b)) => Err(OpenError::DataBinding(format!(
            "data directory {ddesc} belongs to filesystem {b}, not to store {sdesc} \
             (filesystem {a}): give each store its own --data"
        ))),
        (None, Some(b)) => Err(OpenError::DataBinding(format!(
            "data directory {ddesc} belongs to filesystem {b}, not to store {sdesc} ({}): \
             give each store its own --data",
            if old {
                "made by an older esfs, without a filesystem id"
            } else {
                "a new filesystem"
            }
        ))),
        (Some(a), None) if holds_contents => Err(OpenError::DataBinding(format!(
            "data directory {ddesc} holds contents of an unknown filesystem (no {FSID_FILE}), \
             not of store {sdesc} (filesystem {a}): give each store its own --data"
        ))),
        (None, None) if holds_contents && new => Err(OpenError::DataBinding(format!(
            "data directory {ddesc} holds contents of an unknown filesystem (no {FSID_FILE}) \
             and store {sdesc} is new: give it an empty or new --data"
        ))),
        (None, None) if old && mount && !dir.exists() => Err(OpenError::DataBinding(format!(
            "store {sdesc} was made by an older esfs (no filesystem id) and data directory \
             {ddesc} does not exist: give --data with the directory holding its contents \
             (older esfs used {} for every store), or create {ddesc} if it had none",
            default_home().join("data").display()
        ))),
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
