//! The three locking schemes of Elasticsearch: The Definitive Guide, chapter
//! "Handling Relationships" ("Solving Concurrency Issues": global, document
//! and tree locking) as documents in the `locks` index,
//! written once over [`MetaStore`] (so they hold across every mount of one
//! store), plus what the Definitive Guide leaves open: holders that die.
//!
//! Documents (ids):
//! - `session/<owner>`: one per mount, `{host, boot, pidns, pid, start, mount,
//!   since, expires}`, renewed by a heartbeat. A lock whose owner's session
//!   is missing or expired (plus a grace for clock skew), or whose process
//!   is gone from this machine ([`super::process`]), may be broken by anyone.
//! - `global`: the global lock (create-if-absent; delete to release).
//! - `doc/<id>`: a document lock; the same owner re-locking is a no-op.
//! - `tree/<path>`: a tree lock on a path, `{type: shared, count, holders:
//!   {owner: n}, pending}` or `{type: exclusive, owner}`. Shared counts go up
//!   and down with write-if-version (no server-side scripts), the document
//!   is deleted when the count reaches zero. `pending` is set by a would-be
//!   exclusive holder: new shared holders back off, so renames cannot starve.
//!   A holder makes what it wrote searchable before it gives up its share
//!   ([`MetaStore::publish`]; a dead holder's are, by whoever drops it), so
//!   the next exclusive holder of a directory counts its names without a
//!   refresh: every name made or removed in a directory is made under a
//!   share of it.
//! - `intent/<id>`: a multi-document change in progress (see `fs::intent`).
//!
//! Deadlock freedom: a tree lock takes its shared locks top-down and its
//! exclusive locks in sorted order, each with try-and-back-off; if the whole
//! set is not held by the deadline it releases everything (longest path
//! first) and the operation fails with EBUSY rather than hanging.
//!
//! Round trips: the exclusive locks of one tree lock are created in one
//! bulk, and released in one bulk of deletes conditional on the versions
//! their creation returned (no read first). The `locks` index has one
//! shard, so a bulk's items are applied in order: a caller may put its own
//! lock-index items (a finished intent's delete) before the releases.

use super::process;
use crate::store::{
    BulkItemResult, BulkOp, Caller, Idx, MetaStore, Query, StoreError, StoreResult, Version, scan,
};
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a session lives without a heartbeat. Long enough that an idle
/// mount costs little (one conditional write per heartbeat, one janitor
/// search per lease), short enough that a dead mount's locks are broken
/// within a minute (lease + grace + one janitor period).
pub const LEASE: Duration = Duration::from_secs(20);
/// Extra time before a lapsed lease may be broken (tolerates clock skew).
pub const GRACE: Duration = Duration::from_secs(5);
/// Renewal period: one renewal may fail (a slow or lost request) and the
/// next still lands within the lease.
const HEARTBEAT: Duration = Duration::from_secs(8);
/// A cached shared lock is re-checked for a pending exclusive this often.
const RECHECK: Duration = Duration::from_millis(500);
/// Unused cached shared locks are released after this long.
const IDLE: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("lock {0} is held by {1}")]
    Held(String, String),
    #[error("could not take lock {0} within {1:?}")]
    Timeout(String, Duration),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether the mount of session document `doc` is alive: its lease, plus
/// grace, not lapsed, and its process still running if it ran on this
/// machine (a mount killed here is dead at once: see [`process`]).
pub(crate) fn session_live(doc: &Value) -> bool {
    doc["expires"].as_i64().unwrap_or(0) + GRACE.as_millis() as i64 > now_ms()
        && !process::died_here(doc)
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Lock document ids must stay under Elasticsearch's 512 bytes: long paths
/// are replaced by a stable 128-bit FNV-1a hash (a collision can only make
/// two paths wait for each other, never let two holders in).
pub fn tree_id(path: &str) -> String {
    if path.len() <= 400 {
        return format!("tree/{path}");
    }
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for b in path.as_bytes() {
        h ^= *b as u128;
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    format!("tree#{h:032x}")
}

/// The directory paths a change inside `dir` must hold shared: every
/// ancestor from the top, including `dir` itself, excluding the root.
pub fn ancestors(dir: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, c) in dir.char_indices() {
        if c == '/' && i > 0 {
            out.push(dir[..i].to_string());
        }
    }
    if dir != "/" {
        out.push(dir.to_string());
    }
    out
}

struct Cached {
    users: u32,
    checked: Instant,
    last_used: Instant,
    draining: bool,
    /// The lock document's version when this mount last wrote or read it
    /// as its only holder: an exclusive lock on the same path may then
    /// replace it in one conditional write (see `drain_own_share`).
    sole: Option<Version>,
}

/// One mount's lock session, through one store handle: every handle
/// ([`LockManager::for_caller`]) shares the session and the locks held
/// ([`Session`]) and names its requests for its caller.
pub struct LockManager {
    store: Arc<dyn MetaStore>,
    /// The session's renewals go out under their own name (see `Caller`).
    beats: Arc<dyn MetaStore>,
    session: Arc<Session>,
}

impl std::ops::Deref for LockManager {
    type Target = Session;
    fn deref(&self) -> &Session {
        &self.session
    }
}

/// What the handles of one lock session share.
pub struct Session {
    owner: String,
    /// How long a tree lock may wait before giving up, in milliseconds.
    wait_ms: AtomicU64,
    cache: Mutex<HashMap<String, Cached>>,
    stop: AtomicBool,
    /// This mount is the store's only one (embedded store, held by its
    /// mount lock): every other owner is dead, whatever its lease says.
    sole: AtomicBool,
    /// The session document as last written, and its version: only this
    /// mount writes it, so a renewal is one conditional write.
    doc: Mutex<(Value, Option<Version>)>,
    /// Versions of the global and document locks this mount holds: a
    /// release is one conditional delete, without reading the lock first.
    owned: Mutex<HashMap<String, Version>>,
    /// Tokens of the exclusive lock documents calls of this mount are
    /// taking or hold. A lock document of ours whose token is not here was
    /// left behind (its release failed while the cluster was away) and is
    /// removed rather than waited for: this mount would otherwise wait for
    /// itself until it is unmounted.
    live: Mutex<HashSet<u64>>,
    next_token: AtomicU64,
}

/// What [`LockManager::reap_dead`] found (and, repairing, removed).
#[derive(Debug, Default)]
pub struct Reaped {
    pub problems: Vec<String>,
    pub repaired: u64,
    /// Sessions of other mounts still alive.
    pub live_sessions: usize,
}

/// A held tree lock; release with [`LockManager::release`].
#[must_use]
#[derive(Debug, Default)]
pub struct TreeGuard {
    shared: Vec<String>,
    /// Paths and the versions we wrote them at (released conditionally).
    exclusive: Vec<(String, Version)>,
    /// The tokens this attempt registered in `Session::live`.
    tokens: Vec<u64>,
    /// Some shared lock was newly taken from the store (not the cache): the
    /// caller must re-validate the paths it computed before locking.
    pub fresh: bool,
    /// The `with` writes of [`LockManager::lock_tree_with`] landed.
    pub with_landed: bool,
}

fn jitter(d: Duration) -> Duration {
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    d + d * (n % 1000) / 1000
}

impl LockManager {
    /// Register a session for `owner` (unique per mount) and return the manager.
    pub fn new(
        store: Arc<dyn MetaStore>,
        owner: &str,
        mount: &str,
    ) -> StoreResult<Arc<LockManager>> {
        let m = Arc::new(LockManager {
            beats: crate::store::for_caller(&store, Caller::Heartbeat),
            store,
            session: Arc::new(Session {
                owner: owner.to_string(),
                wait_ms: AtomicU64::new(10_000),
                cache: Mutex::new(HashMap::new()),
                stop: AtomicBool::new(false),
                sole: AtomicBool::new(false),
                doc: Mutex::new((Value::Null, None)),
                owned: Mutex::new(HashMap::new()),
                live: Mutex::new(HashSet::new()),
                next_token: AtomicU64::new(1),
            }),
        });
        let mut doc = json!({
            "type": "session", "owner": owner,
            "mount": mount, "since": now_ms(), "expires": now_ms() + LEASE.as_millis() as i64,
        });
        if let (Some(d), Value::Object(at)) = (doc.as_object_mut(), process::here()) {
            d.extend(at);
        }
        let v = m
            .store
            .put(Idx::Locks, &format!("session/{owner}"), &doc, None)?;
        *m.doc.lock() = (doc, Some(v));
        Ok(m)
    }

    /// Another handle on this session, for `caller`.
    pub fn for_caller(&self, caller: Caller) -> Arc<LockManager> {
        Arc::new(LockManager {
            store: crate::store::for_caller(&self.store, caller),
            beats: self.beats.clone(),
            session: self.session.clone(),
        })
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn wait(&self) -> Duration {
        Duration::from_millis(self.wait_ms.load(Ordering::Relaxed))
    }

    /// How long `lock_tree` waits before failing (EBUSY above).
    pub fn set_wait(&self, d: Duration) {
        self.wait_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }

    /// Keep the session alive and let idle cached locks go, until `shutdown`.
    pub fn spawn_heartbeat(self: &Arc<Self>) {
        let m = self.clone();
        let release = crate::store::for_caller(&self.store, Caller::LockRelease);
        std::thread::Builder::new()
            .name("esfs-locks".into())
            .spawn(move || {
                let mut last_beat = Instant::now();
                while !m.stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(250));
                    if last_beat.elapsed() >= HEARTBEAT {
                        if let Err(e) = m.heartbeat() {
                            log::warn!("lock session heartbeat: {e}");
                        }
                        last_beat = Instant::now();
                    }
                    m.release_idle_on(&*release, IDLE);
                }
            })
            .expect("spawn lock heartbeat");
    }

    /// Renew the session's lease: one write, conditional on the version
    /// this mount wrote last (a conflict re-reads once: someone else wrote
    /// it, e.g. fsck). A session deleted by others (this mount was taken for
    /// dead) is an error: its locks may have been broken.
    pub fn heartbeat(&self) -> StoreResult<()> {
        let id = format!("session/{}", self.owner);
        let mut session = self.doc.lock();
        for _ in 0..20 {
            let (doc, version) = &mut *session;
            if version.is_none() {
                let Some(d) = self.beats.get(Idx::Locks, &id)? else {
                    return Err(StoreError::NotFound(id));
                };
                *doc = Arc::unwrap_or_clone(d.source);
                *version = Some(d.version);
            }
            doc["expires"] = json!(now_ms() + LEASE.as_millis() as i64);
            match self.beats.put(Idx::Locks, &id, doc, *version) {
                Ok(v) => {
                    *version = Some(v);
                    return Ok(());
                }
                Err(StoreError::Conflict(_)) => *version = None,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// End the session: release cached locks and delete the session document.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        self.release_idle(Duration::ZERO);
        let _ = self
            .store
            .delete(Idx::Locks, &format!("session/{}", self.owner), None);
    }

    /// Declare this mount the store's only one: drop every lock and session
    /// of earlier lives (their intents stay, for recovery to roll forward).
    pub fn become_sole_owner(&self) -> StoreResult<()> {
        self.sole.store(true, Ordering::Release);
        for (id, ver, doc) in Self::list(&*self.store)? {
            if doc["type"] != "intent" && doc["owner"] != self.owner.as_str() {
                match self.store.delete(Idx::Locks, &id, Some(ver)) {
                    Ok(_) | Err(StoreError::Conflict(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Whether `owner`'s session is alive (its lease, plus grace, not lapsed).
    pub fn alive(&self, owner: &str) -> StoreResult<bool> {
        if owner == self.owner {
            return Ok(true);
        }
        if self.sole.load(Ordering::Acquire) {
            return Ok(false);
        }
        Ok(
            match self.store.get(Idx::Locks, &format!("session/{owner}"))? {
                Some(d) => session_live(&d.source),
                None => false,
            },
        )
    }

    // ---- the Definitive Guide's global lock ("Global Locking") ----

    pub fn lock_global(&self) -> Result<(), LockError> {
        self.lock_owned("global", "global")
    }

    pub fn unlock_global(&self) -> StoreResult<()> {
        self.unlock_owned("global")
    }

    // ---- the Definitive Guide's document locks ("Document Locking") ----

    /// Lock document `id` for this owner; re-locking by the same owner is a
    /// no-op, another (live) owner's lock fails.
    pub fn lock_doc(&self, id: &str) -> Result<(), LockError> {
        self.lock_owned(&format!("doc/{id}"), "doc")
    }

    pub fn unlock_doc(&self, id: &str) -> StoreResult<()> {
        self.unlock_owned(&format!("doc/{id}"))
    }

    /// Upsert-or-noop on an owned lock document; breaks a dead owner's lock.
    fn lock_owned(&self, id: &str, ty: &str) -> Result<(), LockError> {
        let doc = json!({"type": ty, "owner": self.owner, "since": now_ms()});
        for _ in 0..20 {
            match self.store.create(Idx::Locks, id, &doc) {
                Ok(v) => {
                    self.owned.lock().insert(id.to_string(), v);
                    return Ok(());
                }
                Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e.into()),
            }
            let Some(cur) = self.store.get(Idx::Locks, id)? else {
                continue;
            };
            let holder = cur.source["owner"].as_str().unwrap_or("").to_string();
            if holder == self.owner {
                // The Definitive Guide's noop for the same owner ("Document Locking").
                self.owned.lock().insert(id.to_string(), cur.version);
                return Ok(());
            }
            if self.alive(&holder)? {
                return Err(LockError::Held(id.to_string(), holder));
            }
            log::warn!("breaking lock {id} of dead owner {holder}");
            let _ = self.store.delete(Idx::Locks, id, Some(cur.version));
        }
        Err(LockError::Held(id.to_string(), "contention".into()))
    }

    fn unlock_owned(&self, id: &str) -> StoreResult<()> {
        let known = self.owned.lock().remove(id);
        let version = match known {
            Some(v) => v,
            // Not taken by this manager: delete it only if it is ours.
            None => match self.store.get(Idx::Locks, id)? {
                Some(cur) if cur.source["owner"] == self.owner.as_str() => cur.version,
                _ => return Ok(()),
            },
        };
        match self.store.delete(Idx::Locks, id, Some(version)) {
            Ok(_) => Ok(()),
            // Broken meanwhile (we were taken for dead): not ours to delete.
            Err(StoreError::Conflict(_)) | Err(StoreError::NotFound(_)) => {
                log::warn!("lock {id} was broken while this mount held it");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    // ---- the Definitive Guide's tree locks ("Tree Locking") ----

    /// Shared locks on `shared` (directory paths, top-down) and exclusive
    /// locks on `exclusive` (the paths being changed).
    pub fn lock_tree(
        &self,
        shared: &[String],
        exclusive: &[String],
    ) -> Result<TreeGuard, LockError> {
        self.lock_tree_with(shared, exclusive, &[])
    }

    /// [`LockManager::lock_tree`], with writes that go in the request that
    /// creates the exclusive locks (a rename's intent): each attempt sends
    /// them again, so they must be idempotent (puts). Whether they landed
    /// is in the guard.
    pub fn lock_tree_with(
        &self,
        shared: &[String],
        exclusive: &[String],
        with: &[BulkOp],
    ) -> Result<TreeGuard, LockError> {
        let deadline = Instant::now() + self.wait();
        let mut excl: Vec<String> = exclusive.to_vec();
        excl.sort();
        excl.dedup();
        let shared: Vec<String> = shared
            .iter()
            .filter(|s| !excl.contains(s))
            .cloned()
            .collect();
        let mut delay = Duration::from_millis(5);
        loop {
            let mut g = TreeGuard::default();
            match self.try_tree(&shared, &excl, with, &mut g, deadline) {
                Ok(()) => return Ok(g),
                Err(LockError::Store(e)) => {
                    self.release(g);
                    return Err(e.into());
                }
                Err(e) => {
                    self.release(g);
                    if Instant::now() + delay >= deadline {
                        self.clear_pending(&excl);
                        return Err(match e {
                            LockError::Held(p, _) => LockError::Timeout(p, self.wait()),
                            e => e,
                        });
                    }
                    std::thread::sleep(jitter(delay));
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    fn try_tree(
        &self,
        shared: &[String],
        excl: &[String],
        with: &[BulkOp],
        g: &mut TreeGuard,
        deadline: Instant,
    ) -> Result<(), LockError> {
        for p in shared {
            g.fresh |= self.acquire_shared(p, deadline)?;
            g.shared.push(p.clone());
        }
        if excl.is_empty() {
            return Ok(());
        }
        // The exclusive locks in one bulk of creates; those taken already
        // (live or dead holders, shared counts) the per-lock way. All are
        // try-locks, backed off from as a whole: the order cannot deadlock.
        let owned: Vec<Option<Version>> = excl.iter().map(|p| self.drain_own_share(p)).collect();
        let tokens: Vec<u64> = excl.iter().map(|_| self.new_token()).collect();
        g.tokens.extend(&tokens);
        let mut ops: Vec<BulkOp> = excl
            .iter()
            .zip(&owned)
            .zip(&tokens)
            .map(|((p, own), &token)| match own {
                // Our share becomes the exclusive lock in place.
                Some(v) => BulkOp::Index {
                    index: Idx::Locks,
                    id: tree_id(p),
                    source: self.exclusive_doc(p, token),
                    if_version: Some(*v),
                },
                None => BulkOp::Create {
                    index: Idx::Locks,
                    id: tree_id(p),
                    source: self.exclusive_doc(p, token),
                },
            })
            .collect();
        ops.extend(with.iter().cloned());
        let mut results = match self.store.bulk(ops) {
            Ok(r) => r,
            Err(e) => {
                // Our shares that were to become exclusive: given back if
                // they still are shares.
                for (p, _) in excl.iter().zip(&owned).filter(|(_, o)| o.is_some()) {
                    self.store_release_shared(&*self.store, &tree_id(p));
                }
                return Err(e.into());
            }
        };
        let with_results = results.split_off(excl.len());
        g.with_landed = with_results.iter().all(|r| r.is_ok());
        let mut taken = Vec::new();
        let mut failed = None;
        for (((p, r), own), &token) in excl.iter().zip(results).zip(&owned).zip(&tokens) {
            match r {
                Ok(v) => g.exclusive.push((p.clone(), v)),
                Err(StoreError::Conflict(_)) => {
                    if own.is_some() {
                        // Changed since we held it alone: ours goes back.
                        self.store_release_shared(&*self.store, &tree_id(p));
                    }
                    taken.push((p, token))
                }
                // Keep what was created (in the guard, to be released).
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            return Err(e.into());
        }
        for (p, token) in taken {
            let v = self.try_exclusive(p, token)?;
            g.exclusive.push((p.clone(), v));
        }
        Ok(())
    }

    /// Withdraw our `pending` marks after giving up on exclusive locks, so
    /// shared lockers are not held back by a waiter that left.
    fn clear_pending(&self, paths: &[String]) {
        for p in paths {
            let id = tree_id(p);
            for _ in 0..20 {
                let Ok(Some(cur)) = self.store.get(Idx::Locks, &id) else {
                    break;
                };
                let mut s = Arc::unwrap_or_clone(cur.source);
                if s["pending"] != self.owner.as_str() {
                    break;
                }
                s.as_object_mut().map(|o| o.remove("pending"));
                let r = if s["type"] == "shared" && s["count"].as_u64() == Some(0) {
                    self.store
                        .delete(Idx::Locks, &id, Some(cur.version))
                        .map(|_| ())
                } else {
                    self.store
                        .put(Idx::Locks, &id, &s, Some(cur.version))
                        .map(|_| ())
                };
                if !matches!(r, Err(StoreError::Conflict(_))) {
                    break;
                }
            }
        }
    }

    /// Release in reverse order, longest path first (the Definitive Guide's order,
    /// "Tree Locking").
    pub fn release(&self, g: TreeGuard) {
        if let Err(e) = self.release_with(g, Vec::new()) {
            log::warn!("releasing exclusive locks: {e}");
        }
    }

    /// [`LockManager::release`], the exclusive locks in one bulk of deletes
    /// conditional on our versions, after `first`. Items of `first` on the
    /// `locks` index are applied before the releases (one shard applies a
    /// bulk in order); items on other indices ride in the same request but
    /// may land after the releases, so only writes that need no lock go
    /// there (a parent's times). Returns `first`'s results. A release that
    /// finds its lock changed or gone leaves it: it was broken, this mount
    /// taken for dead.
    pub fn release_with(
        &self,
        mut g: TreeGuard,
        first: Vec<BulkOp>,
    ) -> StoreResult<Vec<BulkItemResult>> {
        let n = first.len();
        g.exclusive.sort_by(|a, b| b.0.cmp(&a.0)); // reverse sorted: children first
        let mut ops = first;
        ops.extend(g.exclusive.iter().map(|(p, v)| BulkOp::Delete {
            index: Idx::Locks,
            id: tree_id(p),
            if_version: Some(*v),
        }));
        let res = if ops.is_empty() {
            Ok(Vec::new())
        } else {
            self.store.bulk(ops)
        };
        while let Some(p) = g.shared.pop() {
            self.release_shared(&p);
        }
        // Released or not, no call holds them now (see `Session::live`).
        let mut live = self.live.lock();
        for t in &g.tokens {
            live.remove(t);
        }
        drop(live);
        let mut res = res?;
        for ((p, _), r) in g.exclusive.iter().zip(res.drain(n..)) {
            match r {
                Ok(_) => {}
                Err(StoreError::Conflict(_)) | Err(StoreError::NotFound(_)) => {
                    log::warn!("exclusive lock {p} was broken while this mount held it")
                }
                Err(e) => log::warn!("releasing exclusive lock {p}: {e}"),
            }
        }
        Ok(res)
    }

    /// A shared lock on `path`, from this mount's cache when possible.
    /// Returns whether it was newly taken from the store.
    fn acquire_shared(&self, path: &str, deadline: Instant) -> Result<bool, LockError> {
        loop {
            {
                let mut cache = self.cache.lock();
                if let Some(c) = cache.get_mut(path)
                    && !c.draining
                    && c.checked.elapsed() < RECHECK
                {
                    c.users += 1;
                    c.last_used = Instant::now();
                    return Ok(false);
                }
            }
            let id = tree_id(path);
            let cached = self.cache.lock().contains_key(path);
            if cached {
                // Re-check for a waiting exclusive holder.
                let (pending, sole) = match self.store.get(Idx::Locks, &id)? {
                    Some(d) => (
                        d.source["pending"].as_str().map(String::from),
                        self.sole_version(&d.source, d.version),
                    ),
                    None => (None, None),
                };
                let mut cache = self.cache.lock();
                if let Some(c) = cache.get_mut(path) {
                    match pending {
                        Some(o) if o != self.owner && self.alive(&o)? => c.draining = true,
                        _ => {
                            if !c.draining {
                                c.sole = sole;
                                c.checked = Instant::now();
                                c.users += 1;
                                c.last_used = Instant::now();
                                return Ok(false);
                            }
                        }
                    }
                    if c.users == 0 {
                        cache.remove(path);
                        drop(cache);
                        self.store_release_shared(&*self.store, &id);
                    }
                }
                if Instant::now() >= deadline {
                    return Err(LockError::Timeout(path.into(), self.wait()));
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let sole = self.store_acquire_shared(path, &id)?;
            let mut cache = self.cache.lock();
            match cache.get_mut(path) {
                // Another thread of ours cached it meanwhile: give ours back.
                Some(c) => {
                    c.users += 1;
                    drop(cache);
                    self.store_release_shared(&*self.store, &id);
                }
                None => {
                    cache.insert(
                        path.to_string(),
                        Cached {
                            users: 1,
                            checked: Instant::now(),
                            last_used: Instant::now(),
                            draining: false,
                            sole,
                        },
                    );
                }
            }
            return Ok(true);
        }
    }

    fn release_shared(&self, path: &str) {
        let mut cache = self.cache.lock();
        let Some(c) = cache.get_mut(path) else {
            return;
        };
        c.users = c.users.saturating_sub(1);
        c.last_used = Instant::now();
        if c.users == 0 && c.draining {
            cache.remove(path);
            drop(cache);
            self.store_release_shared(&*self.store, &tree_id(path));
        }
    }

    /// Give back cached shared locks unused for `idle`.
    pub fn release_idle(&self, idle: Duration) {
        self.release_idle_on(&*self.store, idle)
    }

    /// [`LockManager::release_idle`] through `store` (the background
    /// release's handle).
    fn release_idle_on(&self, store: &dyn MetaStore, idle: Duration) {
        let doomed: Vec<String> = {
            let mut cache = self.cache.lock();
            let ids: Vec<String> = cache
                .iter()
                .filter(|(_, c)| c.users == 0 && c.last_used.elapsed() >= idle)
                .map(|(p, _)| p.clone())
                .collect();
            for p in &ids {
                cache.remove(p);
            }
            ids
        };
        for p in doomed {
            self.store_release_shared(store, &tree_id(&p));
        }
    }

    /// `version` if lock document `s` is a share this mount alone holds.
    fn sole_version(&self, s: &Value, version: Version) -> Option<Version> {
        let holders = s["holders"].as_object()?;
        let only_us = s["type"] == "shared"
            && s["pending"].is_null()
            && holders.len() == 1
            && holders.contains_key(&self.owner);
        only_us.then_some(version)
    }

    /// One attempt at the store-level shared lock: Held if an exclusive
    /// holder or a pending exclusive waiter (alive) is in the way. Returns
    /// the version written if this mount is now the only holder.
    fn store_acquire_shared(&self, path: &str, id: &str) -> Result<Option<Version>, LockError> {
        for _ in 0..50 {
            let Some(cur) = self.store.get(Idx::Locks, id)? else {
                let doc = json!({"type": "shared", "path": path, "count": 1, "holders": {&self.owner: 1}, "since": now_ms()});
                match self.store.create(Idx::Locks, id, &doc) {
                    Ok(v) => return Ok(Some(v)),
                    Err(StoreError::Conflict(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            };
            let mut s = Arc::unwrap_or_clone(cur.source);
            if s["type"] == "exclusive" {
                let holder = s["owner"].as_str().unwrap_or("").to_string();
                if self.alive(&holder)? {
                    return Err(LockError::Held(path.into(), holder));
                }
                log::warn!("breaking exclusive lock {path} of dead owner {holder}");
                let _ = self.store.delete(Idx::Locks, id, Some(cur.version));
                continue;
            }
            if let Some(p) = s["pending"].as_str()
                && p != self.owner
                && self.alive(p)?
            {
                return Err(LockError::Held(
                    path.into(),
                    format!("{p} (waiting for exclusive)"),
                ));
            }
            let n = s["holders"][&self.owner].as_u64().unwrap_or(0) + 1;
            s["holders"][&self.owner] = json!(n);
            s["count"] = json!(s["count"].as_u64().unwrap_or(0) + 1);
            match self.store.put(Idx::Locks, id, &s, Some(cur.version)) {
                Ok(v) => return Ok(self.sole_version(&s, v)),
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(LockError::Held(path.into(), "contention".into()))
    }

    /// Decrement our share; delete the document at zero. What this mount
    /// wrote under the share is made searchable first (see
    /// [`MetaStore::publish`]): whoever locks the directory exclusively
    /// next (an rmdir) then counts its names without a refresh.
    fn store_release_shared(&self, store: &dyn MetaStore, id: &str) {
        if let Err(e) = store.publish(Idx::Entries) {
            // The engine's own refresh shows the names within its interval.
            log::warn!("publishing writes before releasing shared lock {id}: {e}");
        }
        for _ in 0..50 {
            let cur = match store.get(Idx::Locks, id) {
                Ok(Some(c)) => c,
                Ok(None) => return,
                Err(e) => {
                    log::warn!("releasing shared lock {id}: {e}");
                    return;
                }
            };
            let mut s = Arc::unwrap_or_clone(cur.source);
            let mine = s["holders"][&self.owner].as_u64().unwrap_or(0);
            if mine == 0 || s["type"] != "shared" {
                return;
            }
            if mine == 1 {
                s["holders"].as_object_mut().map(|h| h.remove(&self.owner));
            } else {
                s["holders"][&self.owner] = json!(mine - 1);
            }
            let count = s["count"].as_u64().unwrap_or(1).saturating_sub(1);
            s["count"] = json!(count);
            let r = if count == 0 && s["pending"].is_null() {
                store.delete(Idx::Locks, id, Some(cur.version)).map(|_| ())
            } else {
                store.put(Idx::Locks, id, &s, Some(cur.version)).map(|_| ())
            };
            match r {
                Ok(()) => return,
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => {
                    log::warn!("releasing shared lock {id}: {e}");
                    return;
                }
            }
        }
    }

    /// An exclusive lock document; `token` tells this mount's calls apart
    /// (see `Session::live`).
    fn exclusive_doc(&self, path: &str, token: u64) -> Value {
        json!({"type": "exclusive", "path": path, "owner": self.owner, "token": token, "since": now_ms()})
    }

    /// A token for one exclusive lock document, registered as live.
    fn new_token(&self) -> u64 {
        let t = self.next_token.fetch_add(1, Ordering::Relaxed);
        self.live.lock().insert(t);
        t
    }

    /// Give back this mount's cached share of `path` before taking it
    /// exclusively. A share no call of ours is using and that this mount
    /// alone held as of a version is not given back: its version is
    /// returned, for the exclusive lock to replace that document in one
    /// conditional write (if anyone joined or marked it pending since, the
    /// write conflicts and `try_tree` gives the share back first).
    fn drain_own_share(&self, path: &str) -> Option<Version> {
        let mut cache = self.cache.lock();
        let c = cache.get_mut(path)?;
        c.draining = true;
        if c.users > 0 {
            return None;
        }
        let sole = c.sole;
        cache.remove(path);
        drop(cache);
        if sole.is_none() {
            self.store_release_shared(&*self.store, &tree_id(path));
        }
        sole
    }

    /// One attempt at an exclusive lock on `path` whose create (of the
    /// document with `token`) conflicted, returning the version written. A
    /// dead holder's lock is broken, and so is one this mount left behind;
    /// shared holders that are dead are dropped, live ones make us mark the
    /// lock `pending` and wait.
    fn try_exclusive(&self, path: &str, token: u64) -> Result<Version, LockError> {
        let id = tree_id(path);
        let doc = self.exclusive_doc(path, token);
        let mut create = false;
        for _ in 0..50 {
            if create {
                match self.store.create(Idx::Locks, &id, &doc) {
                    Ok(v) => return Ok(v),
                    Err(StoreError::Conflict(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            create = true;
            let Some(cur) = self.store.get(Idx::Locks, &id)? else {
                continue;
            };
            let mut s = Value::clone(&cur.source);
            if s["type"] == "exclusive" {
                let holder = s["owner"].as_str().unwrap_or("").to_string();
                if holder == self.owner {
                    match s["token"].as_u64() {
                        // Our create landed though its answer was a
                        // conflict: a primary that failed over mid-request
                        // and the coordinating node sent it again.
                        Some(t) if t == token => return Ok(cur.version),
                        Some(t) if self.live.lock().contains(&t) => {
                            return Err(LockError::Held(path.into(), holder));
                        }
                        _ => {
                            log::warn!(
                                "removing exclusive lock {path} this mount failed to release"
                            );
                            let _ = self.store.delete(Idx::Locks, &id, Some(cur.version));
                            continue;
                        }
                    }
                }
                if self.alive(&holder)? {
                    return Err(LockError::Held(path.into(), holder));
                }
                log::warn!("breaking exclusive lock {path} of dead owner {holder}");
                let _ = self.store.delete(Idx::Locks, &id, Some(cur.version));
                continue;
            }
            // Shared: drop dead holders, take over an empty lock, else wait.
            let mut live = serde_json::Map::new();
            let mut count = 0;
            for (o, n) in s["holders"].as_object().cloned().unwrap_or_default() {
                if self.alive(&o)? {
                    count += n.as_u64().unwrap_or(0);
                    live.insert(o, n);
                }
            }
            if live.len() != s["holders"].as_object().map_or(0, |h| h.len()) {
                // A dead holder gave nothing up, so published nothing: what
                // it wrote is made searchable here, before anyone counts.
                self.store.refresh(Idx::Entries)?;
            }
            if count == 0 {
                match self.store.put(Idx::Locks, &id, &doc, Some(cur.version)) {
                    Ok(v) => return Ok(v),
                    Err(StoreError::Conflict(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            let pending = s["pending"].as_str().map(String::from);
            let mark = match &pending {
                None => true,
                Some(p) => p != &self.owner && !self.alive(p)?,
            };
            if mark || live.len() != s["holders"].as_object().map_or(0, |h| h.len()) {
                if mark {
                    s["pending"] = json!(self.owner);
                }
                s["holders"] = Value::Object(live);
                s["count"] = json!(count);
                let _ = self.store.put(Idx::Locks, &id, &s, Some(cur.version));
            }
            let who = s["holders"]
                .as_object()
                .map(|h| h.keys().cloned().collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            return Err(LockError::Held(path.into(), format!("shared by {who}")));
        }
        Err(LockError::Held(path.into(), "contention".into()))
    }

    /// Whether `owner` is alive according to a listing of the lock
    /// documents (its session there, lease plus grace not lapsed): a
    /// listing already holds every session, so no read per owner.
    pub fn alive_in(&self, owner: &str, docs: &[(String, Version, Value)]) -> bool {
        if owner == self.owner {
            return true;
        }
        if self.sole.load(Ordering::Acquire) {
            return false;
        }
        let id = format!("session/{owner}");
        docs.iter().any(|(i, _, d)| *i == id && session_live(d))
    }

    /// What dead mounts left in a listing of the lock documents: expired
    /// sessions, their shared counts and their exclusive, global and
    /// document locks. With `repair` they are removed (write-if-version, so
    /// a lock changed since the listing is left for the next pass); locks of
    /// an owner with an unfinished intent stay until the intent is rolled
    /// forward, so nobody enters the half-renamed tree meanwhile.
    pub fn reap_dead(
        &self,
        docs: &[(String, Version, Value)],
        repair: bool,
    ) -> StoreResult<Reaped> {
        let mut r = Reaped::default();
        let with_intent: Vec<&str> = docs
            .iter()
            .filter(|(_, _, d)| d["type"] == "intent")
            .filter_map(|(_, _, d)| d["owner"].as_str())
            .collect();
        let dead = |o: &str| !self.alive_in(o, docs) && !with_intent.contains(&o);
        let mut dead_shares = false;
        for (id, ver, doc) in docs {
            let owner = doc["owner"].as_str().unwrap_or("");
            let gone = |r: StoreResult<bool>| match r {
                Ok(_) | Err(StoreError::Conflict(_)) | Err(StoreError::NotFound(_)) => Ok(()),
                Err(e) => Err(e),
            };
            match doc["type"].as_str().unwrap_or("") {
                "session" if self.alive_in(owner, docs) && owner != self.owner => {
                    r.live_sessions += 1;
                }
                "session" if owner == self.owner => {}
                "session" => {
                    r.problems.push(format!("stale session {owner}"));
                    if repair {
                        gone(self.store.delete(Idx::Locks, id, Some(*ver)))?;
                        r.repaired += 1;
                    }
                }
                "intent" if !self.alive_in(owner, docs) => {
                    r.problems
                        .push(format!("unfinished change {id} of dead mount {owner}"));
                }
                "shared" => {
                    let holders = doc["holders"].as_object();
                    let gone_holders: Vec<&String> = holders
                        .map(|h| h.keys().filter(|o| dead(o)).collect())
                        .unwrap_or_default();
                    if gone_holders.is_empty() {
                        continue;
                    }
                    let names: Vec<&str> = gone_holders.iter().map(|o| o.as_str()).collect();
                    r.problems.push(format!(
                        "stale shared lock {id} held by dead {}",
                        names.join(",")
                    ));
                    if repair {
                        let mut s = doc.clone();
                        let mut count = s["count"].as_u64().unwrap_or(0);
                        for o in &gone_holders {
                            count = count
                                .saturating_sub(doc["holders"][o.as_str()].as_u64().unwrap_or(0));
                            s["holders"].as_object_mut().map(|h| h.remove(o.as_str()));
                        }
                        s["count"] = json!(count);
                        if count == 0 {
                            gone(self.store.delete(Idx::Locks, id, Some(*ver)))?;
                        } else {
                            gone(self.store.put(Idx::Locks, id, &s, Some(*ver)).map(|_| true))?;
                        }
                        r.repaired += 1;
                        dead_shares = true;
                    }
                }
                ty @ ("exclusive" | "global" | "doc") if dead(owner) => {
                    r.problems
                        .push(format!("stale {ty} lock {id} of dead {owner}"));
                    if repair {
                        gone(self.store.delete(Idx::Locks, id, Some(*ver)))?;
                        r.repaired += 1;
                    }
                }
                _ => {}
            }
        }
        if dead_shares {
            // Dead holders published nothing (see `store_release_shared`).
            self.store.refresh(Idx::Entries)?;
        }
        Ok(r)
    }

    /// Every lock and session document, for `esfs locks`, fsck and the
    /// janitor: one search while they fit a page (a point-in-time scan costs
    /// two more requests on Elasticsearch), a scan past that.
    pub fn list(store: &dyn MetaStore) -> StoreResult<Vec<(String, Version, Value)>> {
        const PAGE: usize = 1000;
        let sort = vec![crate::store::Sort::asc("since")];
        let hits = store.search(&crate::store::SearchRequest {
            past_own_writes: false,
            index: Idx::Locks,
            query: Query::MatchAll,
            sort: sort.clone(),
            search_after: None,
            size: PAGE,
        })?;
        if hits.len() < PAGE {
            return Ok(hits
                .into_iter()
                .map(|h| (h.doc.id, h.doc.version, Arc::unwrap_or_clone(h.doc.source)))
                .collect());
        }
        let mut out = Vec::new();
        scan(store, Idx::Locks, Query::MatchAll, sort, 500, |hits| {
            out.extend(
                hits.into_iter()
                    .map(|h| (h.doc.id, h.doc.version, Arc::unwrap_or_clone(h.doc.source))),
            );
            Ok(true)
        })?;
        Ok(out)
    }
}
