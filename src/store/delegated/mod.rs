//! The delegated store: a mount that holds the tree's delegation answers
//! its writes from memory and sends them to the cluster in batches.
//!
//! Every namespace change on Elasticsearch otherwise waits for a request
//! (a bulk costs the engine's service time, 1-2.5 ms here, even with no
//! network between). Distributed filesystems avoid that with a capability
//! the server grants one client (NFSv4 delegations, CephFS capabilities):
//! while a client holds it, it is the only writer, so it decides locally,
//! acknowledges, and writes back later; another client that needs the
//! object recalls it first. esfs grants it with a lock document,
//! `deleg/root` in the `locks` index ([`document`]; the protocol is
//! `crate::locks::delegation`), taken by a mount
//! started with `--delegate` that finds itself the only mount, and
//! recalled by any other mount (or command with a lock session) at its
//! start. This is the whole tree's delegation, the coarsest form; see
//! docs/delegations.md for the per-directory plan.
//!
//! While it holds the delegation, this layer (below the document cache, so
//! the filesystem above does not change):
//! - decides each write against its [`overlay`] (what it wrote, and what it
//!   read to decide), acknowledges it with a local version, and appends it
//!   to its [`oplog`] (one `write(2)`), so `kill -9` loses nothing: the
//!   next delegated mount on this machine replays the log ([`replay`]);
//! - answers reads of what it wrote from the overlay, and names in
//!   directories it made as absent, without a request;
//! - flushes every 200 ms (at once past 4096 documents or 16 MiB; writers
//!   wait for it only past four times that), in one bulk of
//!   writes conditional on the cluster's versions; before any search (a
//!   listing, a count), so searches see every acknowledged write; and on
//!   `sync` (`fsync(2)`: after it the change is in the cluster).
//!
//! Recalled, it flushes everything with writers held off, deletes the
//! delegation, and from then on passes every call through, mapping the
//! local versions its callers hold to the cluster's.

mod ahead;
pub(crate) mod document;
mod left;
pub(crate) mod oplog;
mod overlay;
pub(crate) mod replay;
mod slot;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockWriteGuard};
use serde_json::Value;

use self::oplog::{OpLog, Record};
pub use self::overlay::DEFAULT_BUDGET;
use self::overlay::{Backlog, Child, Need, Overlay};
use super::{
    Bucket, BulkItemResult, BulkOp, Caller, Capabilities, Doc, GroupRequest, Hit, Idx, MetaStore,
    Query, Rebased, SearchRequest, Sort, StoreError, StoreResult,
};

/// How often the flusher sends what waits.
const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// A directory of at most this many names is read whole into the overlay
/// on its first miss ([`DelegatedStore::read_whole`]); a larger one is
/// read name by name.
const WHOLE_MAX: usize = 2048;
/// A directory found too large is not tried again for this long; one read
/// whole, whose names have left memory since, not for [`REREAD_AFTER`].
const TOO_LARGE_FOR: Duration = Duration::from_secs(30);
const REREAD_AFTER: Duration = Duration::from_secs(5);
/// A directory read whole is read with everything below it when that is
/// at most this many names ([`DelegatedStore::read_below`]).
const SUBTREE_MAX: u64 = 4096;

/// A bulk of at least this many conditional writes of entries passes
/// straight to the cluster ([`DelegatedStore::bulk_passing`]): a directory
/// rename's page of paths (thousands). A smaller one (a file's
/// attributes) is decided from memory.
const PASS_MIN: usize = 256;

/// Whether `ops` from `caller` go straight to the cluster: a rename's page
/// of conditional writes of entries ([`PASS_MIN`]), and the
/// indexer's writes, always (its texts, and its entries as partial
/// updates: [`text_update`]). Text is
/// derived data (a file not indexed is scanned; a mount's backfill redoes
/// what a dead one did not send), and through the overlay it was most of
/// what a copy waited for: every file's text in the op log and in the bulks
/// a writer's backlog and an `fsync` wait for (the source-tree run's `git
/// clone` and `cp -a`, 10k files, on one Elasticsearch 9.5.3 node: 35 s
/// each with text, 17 and 14 s with none).
fn passes(caller: Caller, ops: &[BulkOp]) -> bool {
    let entry_update = |op: &BulkOp| {
        matches!(
            op,
            BulkOp::Update {
                index: Idx::Entries,
                if_version: Some(_),
                ..
            }
        )
    };
    match caller {
        Caller::Indexer => {
            !ops.is_empty()
                && ops
                    .iter()
                    .all(|op| entry_update(op) || op.index() == Idx::Texts)
        }
        _ => {
            let entry_write = |op: &BulkOp| {
                entry_update(op)
                    || matches!(
                        op,
                        BulkOp::Index {
                            index: Idx::Entries,
                            if_version: Some(_),
                            ..
                        }
                    )
            };
            ops.len() >= PASS_MIN && ops.iter().all(entry_write)
        }
    }
}

/// The indexer's write of a whole entry as a partial update of what it
/// owns: the text's state and the inode's attribute copies, never the
/// entry's place (`parent`, `name`, `path`, `dir`: a rename's, which a whole
/// document read before it would undo), and a state or xattrs it no longer
/// has as `null` or `[]` (a partial update keeps absent fields; so is the
/// text an entry held itself before the `texts` index, `contents` and
/// `indexed`). Passing, a partial update also keeps the overlay's copy of
/// the entry (merged).
fn text_update(op: BulkOp) -> BulkOp {
    let BulkOp::Index {
        index: Idx::Entries,
        id,
        source,
        if_version: Some(v),
    } = op
    else {
        return op;
    };
    let mut doc = source;
    if let Some(m) = doc.as_object_mut() {
        for place in ["parent", "name", "path", "dir", "ino", "kind", "cookie"] {
            m.remove(place);
        }
        for text in ["text_state", "text_mtime_ns", "contents", "indexed"] {
            m.entry(text).or_insert(Value::Null);
        }
        m.entry("xattrs").or_insert(Value::Array(Vec::new()));
    }
    BulkOp::Update {
        index: Idx::Entries,
        id,
        doc,
        if_version: Some(v),
    }
}

/// A handle on the delegated store: one per caller, sharing the rest.
pub struct DelegatedStore {
    inner: Arc<dyn MetaStore>,
    /// Whose calls these are: only the syscall path reads directories
    /// whole (the janitor's reads skip the refresh a directory read relies
    /// on, and the indexer's and write-back's are of names in hand).
    caller: Caller,
    shared: Arc<Shared>,
}

/// What every handle shares.
pub(crate) struct Shared {
    /// The flusher's and the delegation protocol's handle on the cluster.
    raw: Arc<dyn MetaStore>,
    /// Writers decide under it shared; giving the delegation back takes it
    /// exclusively, so no write slips between the last flush and the
    /// switch to passing through.
    gate: RwLock<()>,
    held: AtomicBool,
    /// The mount is ending: the delegation is not taken again.
    closing: AtomicBool,
    overlay: Mutex<Overlay>,
    log: Mutex<Option<OpLog>>,
    /// One flush at a time (a document's writes stay in order).
    flushing: Mutex<()>,
    /// Set (and `kicked` signalled) when so much waits that the flusher
    /// should not wait for its next round ([`Backlog::Send`]).
    kick: Mutex<bool>,
    kicked: Condvar,
    /// Signalled when a bulk passing to the cluster is answered
    /// ([`DelegatedStore::bulk_passing`]): writes to its documents wait.
    passed: Condvar,
    /// Where the op logs live (one directory per filesystem).
    state_dir: PathBuf,
    /// Run once the delegation is given back (the mount drops its cached
    /// documents, whose versions were local).
    on_release: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
    /// Directories lately read whole, or found too large to be: when, and
    /// whether too large ([`DelegatedStore::read_whole`]).
    tried: Mutex<HashMap<u64, (Instant, bool)>>,
    /// Directories being walked name by name ([`DelegatedStore::read_ahead`]).
    walks: Mutex<ahead::Walks>,
}

impl DelegatedStore {
    /// A store passing every call to `inner` until the lock session's
    /// `crate::locks::delegation::take` gets it
    /// the delegation; op logs in `state_dir`.
    pub fn new(inner: Arc<dyn MetaStore>, state_dir: PathBuf) -> Arc<DelegatedStore> {
        Arc::new(DelegatedStore {
            shared: Arc::new(Shared {
                raw: super::for_caller(&inner, Caller::WriteBack),
                gate: RwLock::new(()),
                held: AtomicBool::new(false),
                closing: AtomicBool::new(false),
                overlay: Mutex::new(Overlay::default()),
                log: Mutex::new(None),
                flushing: Mutex::new(()),
                kick: Mutex::new(false),
                kicked: Condvar::new(),
                passed: Condvar::new(),
                state_dir,
                on_release: Mutex::new(None),
                tried: Mutex::new(HashMap::new()),
                walks: Mutex::default(),
            }),
            inner,
            caller: Caller::Fs,
        })
    }

    /// The handle the delegation protocol and the flusher use.
    pub(crate) fn raw(&self) -> &dyn MetaStore {
        &*self.shared.raw
    }

    /// Start holding the delegation as `owner`: `locks` are every lock
    /// document there is (only this mount writes them from now on), a
    /// fresh op log, and the flusher.
    pub(crate) fn begin_holding(&self, owner: &str, locks: Vec<Doc>) -> StoreResult<()> {
        let shared = &self.shared;
        // Taken again: what was kept since it was given back is checked
        // against the cluster, where other mounts wrote meanwhile.
        let kept = shared.settled()?.kept();
        if !kept.is_empty() {
            let now = shared.raw.mget_docs(&kept, false)?;
            shared.settled()?.keep_unchanged(&kept, &now);
        }
        shared.unsettled().know_locks(locks);
        let log = OpLog::create(&shared.state_dir, owner).map_err(|e| {
            StoreError::Other(format!("op log in {}: {e}", shared.state_dir.display()))
        })?;
        *shared.log.lock() = Some(log);
        shared.held.store(true, Ordering::Release);
        shared.spawn_flusher(owner.to_string());
        Ok(())
    }

    /// Give the delegation back for good: the mount is ending.
    pub(crate) fn close(&self, owner: &str) -> StoreResult<()> {
        // Set before the release takes the gate: a take under way finishes
        // first and is given back here; a later one sees it and stops.
        self.shared.closing.store(true, Ordering::Release);
        self.shared.release(owner)
    }

    /// Whether the mount is ending ([`DelegatedStore::close`]).
    pub(crate) fn closing(&self) -> bool {
        self.shared.closing.load(Ordering::Acquire)
    }

    /// Hold writers off (until the guard drops): taking the delegation
    /// while the mount serves must not let a write slip between reading
    /// the lock documents and deciding from memory.
    pub(crate) fn quiesce(&self) -> RwLockWriteGuard<'_, ()> {
        self.shared.gate.write()
    }

    /// Run `f` once the delegation is given back.
    pub(crate) fn on_release(&self, f: Box<dyn Fn() + Send + Sync>) {
        self.shared.on_release(f)
    }

    /// The mounts whose op logs are in this filesystem's state directory.
    pub(crate) fn logs_left(&self) -> Vec<String> {
        oplog::owners(&self.shared.state_dir)
    }

    /// Replay and remove the op log of `owner`, a mount that died.
    pub(crate) fn replay_left(&self, owner: &str) -> StoreResult<()> {
        replay::replay_left(self.raw(), &self.shared.state_dir, owner)?;
        // Its names were made under locks it can no longer publish, and
        // its intents are for a search to find and roll forward.
        self.raw().publish(Idx::Entries)?;
        self.raw().publish(Idx::Locks)
    }

    /// Bound the memory of what the cluster already holds to `bytes` (see
    /// `overlay::Budget`).
    pub fn set_budget(&self, bytes: usize) {
        match self.shared.settled() {
            Ok(mut overlay) => overlay.set_budget(bytes),
            Err(e) => log::warn!("delegation: budget not set: {e}"),
        }
    }

    /// Whether this mount holds the delegation now.
    pub fn held(&self) -> bool {
        self.shared.held.load(Ordering::Acquire)
    }

    /// A read while the delegation holds (`brief`: without the text
    /// fields): from the overlay, else from the cluster, remembered.
    fn read_one(&self, index: Idx, id: &str, brief: bool) -> StoreResult<Option<Doc>> {
        if let Some(answer) = self.shared.settled()?.get(index, id, brief) {
            return Ok(answer);
        }
        if index == Idx::Entries
            && let Some(parent) = overlay::parent_of(id)
            && self.read_whole(parent)?
            && let Some(answer) = self.shared.settled()?.get(index, id, brief)
        {
            return Ok(answer);
        }
        let key = vec![(index, id.to_string())];
        let doc = match brief {
            true => self.inner.get_brief(index, id)?,
            false => self.inner.get(index, id)?,
        };
        let answer = self.shared.settled()?.remember(key, vec![doc], brief);
        let answer = answer.into_iter().next().flatten();
        if index == Idx::Entries
            && let Some(entry) = &answer
            && let Err(e) = self.read_ahead(entry)
        {
            // Best effort: the lookup has its answer.
            log::warn!("delegation: reading ahead of {id}: {e}");
        }
        Ok(answer)
    }

    /// Entry `missed` was just read from the cluster: if its directory is
    /// being walked name by name ([`ahead`]), read the names that follow
    /// it in listing order, with their inodes, into the overlay (two
    /// requests for up to [`ahead::WINDOW_MAX`] lookups). As
    /// [`DelegatedStore::read_whole`] does, holding `flushing` until they
    /// are learned, after a refresh where the search needs one.
    fn read_ahead(&self, missed: &Doc) -> StoreResult<()> {
        if self.caller != Caller::Fs {
            return Ok(());
        }
        let (Some(parent), Some(cookie)) = (
            overlay::parent_of(&missed.id),
            missed.source["cookie"].as_i64(),
        ) else {
            return Ok(());
        };
        let held = |id: &str| {
            let key = (Idx::Entries, id.to_string());
            self.shared.unsettled().has(&key)
        };
        let Some(window) = self.shared.walks.lock().missed(parent, cookie, held) else {
            return Ok(());
        };
        let one = self.shared.flushing.lock();
        let after = Query::Range {
            field: "cookie".into(),
            gte: None,
            gt: Some(cookie.into()),
            lte: None,
            lt: None,
        };
        let query = Query::and(vec![Query::term("parent", parent), after]);
        // One name past the window, not learned: where the walk's next
        // miss must be to stay in step.
        let mut entries = self.search_dir(&one, parent, query, window + 1)?;
        if entries.len() > window
            && let Some(next) = entries.pop()
            && let Some(cookie) = next.doc.source["cookie"].as_i64()
        {
            self.shared
                .walks
                .lock()
                .read_up_to(parent, cookie, &next.doc.id);
        }
        self.learn_with_inodes(&one, &[], entries)?;
        Ok(())
    }

    /// Read directory `parent` whole into the overlay, so its names, its
    /// listing and its children's inodes are answered from memory (a
    /// directory made elsewhere, or one whose names left memory for the
    /// budget; `find`, `du`, `diff -r`, `rm -rf` of it otherwise cost a
    /// request or two a name): two requests, a brief search of its entries
    /// and one `_mget` of their inodes. Not for one of more than
    /// [`WHOLE_MAX`] names, nor again soon ([`Shared::tried`]). Returns
    /// whether it is whole in memory now.
    ///
    /// Done holding `flushing`: no slot turns clean (so none can leave)
    /// until what was read is learned; a slot written meanwhile is newer
    /// than what the search saw and stays as it is.
    fn read_whole(&self, parent: u64) -> StoreResult<bool> {
        if !self.held() || self.shared.unsettled().whole(parent) {
            return Ok(self.held());
        }
        if self.caller != Caller::Fs || !self.shared.try_whole(parent) {
            return Ok(false);
        }
        let one = self.shared.flushing.lock();
        let entries =
            self.search_dir(&one, parent, Query::term("parent", parent), WHOLE_MAX + 1)?;
        if entries.len() > WHOLE_MAX {
            self.shared
                .tried
                .lock()
                .insert(parent, (Instant::now(), true));
            return Ok(false);
        }
        let (below, mut dirs) = self.read_below(parent, &entries)?;
        dirs.push(parent);
        let entries: Vec<Hit> = entries.into_iter().chain(below).collect();
        Ok(self.learn_with_inodes(&one, &dirs, entries)? && self.shared.unsettled().whole(parent))
    }

    /// A search of directory `parent`'s entries (`query` names it; at most
    /// `size`, in listing order), brief, for the overlay to learn: done
    /// holding `flushing` (`one`), so no slot turns clean (and none can
    /// leave) until what it found is learned.
    ///
    /// The search needs the cluster to have refreshed after what the
    /// flusher wrote in this directory (a slot acknowledged and let go
    /// since is known only there). Elsewhere it need not wait: what
    /// waits to be sent, or was sent and not let go, has its slot,
    /// which wins over what the search says. A refresh per directory
    /// read (`rm -rf` reads one, removes it, reads the next) cost the
    /// node more CPU than the removal.
    fn search_dir(
        &self,
        one: &MutexGuard<'_, ()>,
        parent: u64,
        query: Query,
        size: usize,
    ) -> StoreResult<Vec<Hit>> {
        let refresh = self.shared.unsettled().search_needs_refresh(parent);
        if refresh {
            self.shared.flush_holding(one)?;
        }
        let entries = self.inner.search_brief(&SearchRequest {
            index: Idx::Entries,
            query,
            sort: vec![Sort::asc("cookie")],
            search_after: None,
            size,
            past_own_writes: !refresh,
        })?;
        if refresh {
            // Everything answered so far was flushed before this search,
            // which refreshed first (`flushing` is held: nothing else
            // was answered meanwhile).
            self.shared.unsettled().seen_by_search();
        }
        Ok(entries)
    }

    /// Learn `entries` as found by [`DelegatedStore::search_dir`] with their
    /// inodes (one `_mget` of those without a slot), and directories
    /// `whole` as held whole; still holding `flushing` (`one`). Whether
    /// the delegation still holds (given back meanwhile, nothing is learned).
    fn learn_with_inodes(
        &self,
        _one: &MutexGuard<'_, ()>,
        whole: &[u64],
        entries: Vec<Hit>,
    ) -> StoreResult<bool> {
        let inodes: Vec<(Idx, String)> = {
            let overlay = self.shared.settled()?;
            entries
                .iter()
                .filter_map(|h| h.doc.source["ino"].as_u64())
                .map(|i| (Idx::Inodes, crate::model::inode_id(i)))
                .filter(|k| !overlay.has(k))
                .collect()
        };
        let found = match inodes.is_empty() {
            true => Vec::new(),
            false => self.inner.mget_docs(&inodes, true)?,
        };
        let entries = entries
            .into_iter()
            .map(|h| ((Idx::Entries, h.doc.id.clone()), h.doc))
            .collect();
        let mut overlay = self.shared.settled()?;
        // (Given back meanwhile: the overlay no longer tells anything.)
        if !self.held() {
            return Ok(false);
        }
        overlay.learn_whole(whole, entries, inodes.into_iter().zip(found).collect());
        Ok(true)
    }

    /// What is below the subdirectories of `parent`, whose `children` were
    /// just read, when it is at most [`SUBTREE_MAX`] names: one `path.tree`
    /// term (Elasticsearch: The Definitive Guide's query for "everything
    /// under /a/b"), after a `_count` of it. A walk of a source tree then
    /// costs a few requests a subtree, not two a directory. Returns the
    /// entries below the children, and the subdirectories (every level)
    /// now read whole; none if it is too large. Called holding `flushing`.
    fn read_below(&self, parent: u64, children: &[Hit]) -> StoreResult<(Vec<Hit>, Vec<u64>)> {
        let is_dir = |h: &Hit| h.doc.source["kind"] == "dir";
        let Some(path) = children
            .iter()
            .find(|h| is_dir(h))
            .and_then(|h| h.doc.source["dir"].as_str())
        else {
            return Ok((Vec::new(), Vec::new()));
        };
        let below = Query::Bool {
            must: vec![Query::tree("path", path)],
            must_not: vec![Query::term("path", path)],
            should: vec![],
        };
        // A count refreshes the cluster first if this mount wrote since its
        // last refresh; nothing is answered meanwhile (`flushing` is held):
        // the search below sees every flushed write.
        let n = self.inner.count(Idx::Entries, &below)?;
        self.shared.unsettled().seen_by_search();
        if n > SUBTREE_MAX {
            return Ok((Vec::new(), Vec::new()));
        }
        let deeper = match n as usize > children.len() {
            true => self.inner.search_brief(&SearchRequest {
                index: Idx::Entries,
                query: Query::Bool {
                    must: vec![below],
                    must_not: vec![Query::term("parent", parent)],
                    should: vec![],
                },
                sort: vec![Sort::asc("path")],
                search_after: None,
                size: n as usize + 1,
                past_own_writes: true,
            })?,
            false => Vec::new(),
        };
        if deeper.len() + children.len() != n as usize {
            return Ok((Vec::new(), Vec::new())); // changed meanwhile
        }
        let dirs = children
            .iter()
            .chain(&deeper)
            .filter(|h| is_dir(h))
            .filter_map(|h| h.doc.source["ino"].as_u64())
            .collect();
        Ok((deeper, dirs))
    }

    /// [`DelegatedStore::read_whole`] of the directory of each entry
    /// `keys` names that the overlay cannot answer.
    fn read_parents_whole(&self, keys: &[(Idx, String)], brief: bool) -> StoreResult<()> {
        let parents: Vec<u64> = {
            let mut overlay = self.shared.settled()?;
            let mut p: Vec<u64> = keys
                .iter()
                .filter(|(i, _)| *i == Idx::Entries)
                .filter(|(i, id)| overlay.get(*i, id, brief).is_none())
                .filter_map(|(_, id)| overlay::parent_of(id))
                .collect();
            p.dedup();
            p
        };
        for p in parents {
            self.read_whole(p)?;
        }
        Ok(())
    }

    /// Send what waits, and wait for it to be acknowledged.
    fn flush_first(&self) -> StoreResult<()> {
        if self.held() {
            self.shared.flush()
        } else {
            Ok(())
        }
    }

    /// A page of a directory's listing, from the overlay (see
    /// [`children_page`]; `brief`: without the text fields), read whole
    /// first if need be.
    fn listed(&self, req: &SearchRequest, brief: bool) -> StoreResult<Option<Vec<Hit>>> {
        if !self.held() {
            return Ok(None);
        }
        if let Some(hits) = children_page(&*self.shared.settled()?, req, brief) {
            return Ok(Some(hits));
        }
        match listed_dir(req) {
            Some(parent) if self.read_whole(parent)? => {
                Ok(children_page(&*self.shared.settled()?, req, brief))
            }
            _ => Ok(None),
        }
    }

    /// A bulk decided here, under the delegation. One of lock documents
    /// only (a rename's release of its locks and intent) does not wait
    /// for the rewrite of a rename decided before it, and its records are
    /// held back until that is logged ([`Overlay::hold_back`]).
    fn bulk_held(&self, ops: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>> {
        let locks_only = ops.iter().all(|op| op.index() == Idx::Locks);
        let overlay = || match locks_only {
            true => Ok(self.shared.unsettled()),
            false => self.shared.settled(),
        };
        // Documents the decision needs, read first, outside the lock;
        // without their text (a create needs to know what exists, and a
        // partial update of a brief slot leaves the text to the cluster).
        let need = overlay()?.needs(&ops);
        match need {
            Need::Nothing => {}
            Need::Fetch(keys) => {
                let docs = self.inner.mget_docs(&keys, true)?;
                self.shared.settled()?.learn(keys, docs, true);
            }
            Need::Wait => {
                let mut overlay = overlay()?;
                while let Need::Wait = overlay.needs(&ops) {
                    self.shared.passed.wait(&mut overlay);
                }
            }
        }
        let mut overlay = overlay()?;
        // A read made after `needs` may be missing if a write took a slot
        // meanwhile and the flush dropped it: decide again from scratch.
        if !matches!(overlay.needs(&ops), Need::Nothing) {
            drop(overlay);
            return self.bulk_held(ops);
        }
        let (results, records) = overlay.apply(ops);
        if overlay.unsettled() {
            overlay.hold_back(records);
            return Ok(results);
        }
        self.log_decided(overlay, &records)?;
        Ok(results)
    }

    /// A large bulk of conditional partial updates of entries (a directory
    /// rename's page of paths: see [`passes`]) decided by the cluster, not
    /// here. Decided here, each document the overlay does not hold costs
    /// a read, each a record in the op log, and the flush sends the same
    /// updates again: a 100 000-file rename on three nodes took 37-58 s,
    /// the mount's CPU (17-22 s of it) and an `_mget` per page most of it.
    /// The cluster applies them in the one request, against the same
    /// conditions: while the delegation holds no other mount writes, so
    /// what the overlay holds clean is what the cluster holds.
    ///
    /// Chosen holding `flushing`, so no flush is in flight (a clean slot's
    /// base is the cluster's version), and passing until answered: a write
    /// to one of them waits ([`Need::Wait`]; no flush can carry one), a
    /// read of one from the cluster is not kept. Several may pass at once
    /// (a rename sends pages side by side). The writes of documents with
    /// changes not sent yet are decided here, after.
    fn bulk_passing(&self, ops: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>> {
        let (order, mut sent): (Vec<usize>, Vec<BulkOp>);
        let held: Vec<(usize, BulkOp)>;
        {
            let _one = self.shared.flushing.lock();
            let mut overlay = self.shared.settled()?;
            let pass: Vec<(usize, BulkOp)>;
            (pass, held) = ops
                .into_iter()
                .enumerate()
                .partition(|(_, op)| overlay.may_pass(&(op.index(), op.id().to_string())));
            (order, sent) = pass.into_iter().unzip();
            overlay.begin_pass(&mut sent);
        }
        let answers = self.inner.bulk(sent.clone());
        let given = self.shared.settled()?.passed(&sent, answers);
        self.shared.passed.notify_all();
        let given = given?;
        let mut results: Vec<Option<BulkItemResult>> =
            (0..order.len() + held.len()).map(|_| None).collect();
        for (i, r) in order.into_iter().zip(given) {
            results[i] = Some(r);
        }
        if !held.is_empty() {
            let (at, ops): (Vec<usize>, Vec<BulkOp>) = held.into_iter().unzip();
            for (i, r) in at.into_iter().zip(self.bulk_held(ops)?) {
                results[i] = Some(r);
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every item answered"))
            .collect())
    }

    /// Log what `overlay` just decided (`records`), then have what waits
    /// sent now if it is much, and before going on if too much.
    fn log_decided(
        &self,
        mut overlay: MutexGuard<'_, Overlay>,
        records: &[Record],
    ) -> StoreResult<()> {
        if let Some(log) = self.shared.log.lock().as_mut() {
            let n = log
                .append(records)
                .map_err(|e| StoreError::Other(format!("op log: {e}")))?;
            overlay.logged(n);
        }
        let backlog = overlay.backlog();
        drop(overlay);
        match backlog {
            Backlog::None => Ok(()),
            Backlog::Send => {
                self.shared.kick();
                Ok(())
            }
            Backlog::Wait => self.shared.flush(),
        }
    }

    /// A bulk straight to the cluster, local versions mapped to its own.
    fn bulk_through(&self, mut ops: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>> {
        {
            let mut overlay = self.shared.settled()?;
            for op in &mut ops {
                overlay.translate_op(op);
                overlay.forget(&(op.index(), op.id().to_string()));
            }
        }
        self.inner.bulk(ops)
    }
}

impl Shared {
    /// The overlay, once the rewrite of a directory rename decided before
    /// ([`Overlay::rebase`]) is carried out and logged, with the lock
    /// records held back meanwhile after it: every read of an entry and
    /// every write but a lock document's goes through here. An error is
    /// the op log's: the rewrite is done in memory either way.
    fn settled(&self) -> StoreResult<MutexGuard<'_, Overlay>> {
        let mut overlay = self.unsettled();
        if let Some((keys, held)) = overlay.settle()
            && let Some(log) = self.log.lock().as_mut()
        {
            let logged = log
                .append_encoded(&overlay.moved_paths(&keys))
                .and_then(|n| Ok(n + log.append(&held)?))
                .map_err(|e| StoreError::Other(format!("op log: {e}")))?;
            overlay.logged(logged);
        }
        Ok(overlay)
    }

    /// The overlay as it is, a directory rename decided before it maybe
    /// not rewritten yet: for what reads no entry's path (whether a
    /// document or a directory is held, the backlog) and for a decision
    /// of lock documents only (`DelegatedStore::bulk_held`). Anything
    /// else takes [`Shared::settled`].
    fn unsettled(&self) -> MutexGuard<'_, Overlay> {
        self.overlay.lock()
    }

    /// Send every dirty document in one bulk and apply the answers.
    pub(crate) fn flush(&self) -> StoreResult<()> {
        let one = self.flushing.lock();
        self.flush_holding(&one)
    }

    /// [`Shared::flush`] by the holder of `flushing`.
    fn flush_holding(&self, _one: &MutexGuard<'_, ()>) -> StoreResult<()> {
        let (mut out, generation) = {
            let mut overlay = self.settled()?;
            if overlay.clean() {
                return Ok(());
            }
            // A new generation first: if that fails, nothing changed.
            let generation = match self.log.lock().as_mut() {
                Some(log) => Some(
                    log.rotate()
                        .map_err(|e| StoreError::Other(format!("op log: {e}")))?,
                ),
                None => None,
            };
            (overlay.outgoing(), generation)
        };
        if !out.ops.is_empty() {
            match self.raw.bulk(std::mem::take(&mut out.ops)) {
                Ok(results) => {
                    let lost = {
                        // The bulk's answers are applied whatever the op
                        // log says (a failed write of the rewrite's records
                        // is reported; the rewrite is done either way).
                        let mut overlay = self.settled().unwrap_or_else(|e| {
                            log::error!("delegation: {e}");
                            self.unsettled()
                        });
                        let (acks, lost) = overlay.answered(&out, results);
                        // Before the older generations go: the records
                        // written while this flush was in flight name the
                        // cluster's version from before it.
                        if let Some(log) = self.log.lock().as_mut() {
                            log.append(&acks)
                                .map_err(|e| StoreError::Other(format!("op log: {e}")))?;
                        }
                        lost
                    };
                    for ((idx, id), e) in lost {
                        log::error!(
                            "delegation: {}/{id} was changed by another mount while this one held \
                             the tree; its change stands, this mount's is dropped ({e})",
                            idx.name()
                        );
                    }
                }
                Err(e) => {
                    let mut overlay = self.settled().unwrap_or_else(|e| {
                        log::error!("delegation: {e}");
                        self.unsettled()
                    });
                    overlay.unsent(out);
                    return Err(e);
                }
            }
        }
        if let (Some(g), Some(log)) = (generation, self.log.lock().as_ref()) {
            log.forget_through(g);
        }
        Ok(())
    }

    /// Wake the flusher now ([`Backlog::Send`]).
    fn kick(&self) {
        let mut kick = self.kick.lock();
        if !*kick {
            *kick = true;
            self.kicked.notify_one();
        }
    }

    /// Until the flusher's next round: [`FLUSH_EVERY`], or at once if a
    /// writer found much waiting (during the last flush, or since).
    fn next_round(&self) {
        let mut kick = self.kick.lock();
        if !*kick && self.unsettled().backlog() == Backlog::None {
            self.kicked.wait_for(&mut kick, FLUSH_EVERY);
        }
        *kick = false;
    }

    /// The flusher: every [`FLUSH_EVERY`] while the delegation holds (at
    /// once when much waits), and a look for a recall now and then.
    pub(crate) fn spawn_flusher(self: &Arc<Self>, owner: String) {
        let me = self.clone();
        std::thread::Builder::new()
            .name("esfs-delegation".into())
            .spawn(move || {
                let mut round = 0u64;
                let mut looked = Instant::now();
                while me.held.load(Ordering::Acquire) {
                    me.next_round();
                    let busy = me.unsettled().busy();
                    if let Err(e) = me.flush() {
                        log::warn!("delegation: flush failed, retrying: {e}");
                        std::thread::sleep(FLUSH_EVERY);
                    }
                    // What the grace kept past the budget, once idle.
                    let (slots, bytes) = match me.settled() {
                        Ok(mut overlay) => overlay.trim(),
                        Err(e) => {
                            log::warn!("delegation: {e}");
                            continue;
                        }
                    };
                    if round.is_multiple_of(10) {
                        log::debug!("delegation: {slots} documents in memory, {bytes} bytes");
                    }
                    round += 1;
                    // A look every 400 ms while writes come, every 2 s when
                    // idle: an idle mount costs half a request a second,
                    // and a starting mount waits at most that long.
                    let every = FLUSH_EVERY * if busy { 2 } else { 10 };
                    if looked.elapsed() < every {
                        continue;
                    }
                    looked = Instant::now();
                    if document::recalled(&*me.raw, &owner) {
                        log::info!("delegation recalled by another mount: giving it back");
                        if let Err(e) = me.release(&owner) {
                            log::warn!("delegation: could not give it back yet: {e}");
                        }
                    }
                }
            })
            .expect("spawn the delegation flusher");
    }

    /// Give the delegation back: flush everything with writers held off,
    /// then pass every call through.
    pub(crate) fn release(&self, owner: &str) -> StoreResult<()> {
        let _gate = self.gate.write();
        if !self.held.load(Ordering::Acquire) {
            return Ok(());
        }
        self.flush()?;
        // What the flushes sent is searchable before another mount takes
        // a lock the delegation decided (see `MetaStore::publish`).
        self.raw.publish(Idx::Entries)?;
        self.held.store(false, Ordering::Release);
        self.settled()?.released();
        if let Some(log) = self.log.lock().take() {
            log.remove();
        }
        document::give_back(&*self.raw, owner)?;
        if let Some(f) = self.on_release.lock().as_ref() {
            f();
        }
        Ok(())
    }

    /// Run `f` once the delegation is given back.
    pub(crate) fn on_release(&self, f: Box<dyn Fn() + Send + Sync>) {
        *self.on_release.lock() = Some(f);
    }

    /// Whether directory `parent` may be read whole now: not found too
    /// large lately, nor read whole lately (its names left memory since:
    /// the budget is too small for what is being walked, and a name by
    /// name read costs less than reading it all again).
    fn try_whole(&self, parent: u64) -> bool {
        let mut tried = self.tried.lock();
        let now = Instant::now();
        if tried.len() > 4096 {
            tried.retain(|_, (t, _)| now.duration_since(*t) < TOO_LARGE_FOR);
        }
        match tried.get(&parent) {
            Some((t, true)) if now.duration_since(*t) < TOO_LARGE_FOR => false,
            Some((t, false)) if now.duration_since(*t) < REREAD_AFTER => false,
            _ => {
                tried.insert(parent, (now, false));
                true
            }
        }
    }
}

/// [`Overlay::children`] for a query of terms naming a `parent`.
fn children_count(overlay: &Overlay, query: &Query) -> Option<u64> {
    children_of(overlay, query, true).map(|docs| docs.len() as u64)
}

/// A listing's page (terms naming a `parent`, sorted by one numeric field
/// ascending, after a value) answered from the overlay, when it knows the
/// directory whole.
fn children_page(overlay: &Overlay, req: &SearchRequest, brief: bool) -> Option<Vec<Hit>> {
    let [sort] = req.sort.as_slice() else {
        return None;
    };
    if req.index != Idx::Entries || sort.descending {
        return None;
    }
    let key = |c: &Child| c.number(&sort.field);
    let after = match &req.search_after {
        None => None,
        Some(v) => Some(v.first()?.as_i64()?),
    };
    let mut docs: Vec<(i64, Child)> = children_of(overlay, &req.query, brief)?
        .into_iter()
        .map(|c| Some((key(&c)?, c)))
        .collect::<Option<_>>()?;
    docs.retain(|(k, _)| after.is_none_or(|a| *k > a));
    docs.sort_unstable_by_key(|(k, _)| *k);
    Some(
        docs.into_iter()
            .take(req.size)
            .map(|(k, c)| Hit {
                doc: c.to_doc(),
                sort: vec![k.into()],
            })
            .collect(),
    )
}

/// The directory a listing's page is of (see [`children_page`]).
fn listed_dir(req: &SearchRequest) -> Option<u64> {
    let [sort] = req.sort.as_slice() else {
        return None;
    };
    if req.index != Idx::Entries || sort.descending {
        return None;
    }
    req.query.parent_term()
}

fn children_of<'a>(overlay: &'a Overlay, query: &Query, brief: bool) -> Option<Vec<Child<'a>>> {
    let mut parent = None;
    let mut rest = Vec::new();
    for t in query.clauses()? {
        let Query::Term { field, value } = t else {
            return None;
        };
        match field.as_str() {
            "parent" => parent = value.as_u64(),
            f => rest.push((f, value)),
        }
    }
    overlay.children(parent?, &rest, brief)
}

impl MetaStore for DelegatedStore {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn as_caller(&self, caller: Caller) -> Option<Arc<dyn MetaStore>> {
        let inner = super::for_caller(&self.inner, caller);
        // The session's renewals are the cluster's business alone.
        if caller == Caller::Heartbeat {
            return Some(inner);
        }
        Some(Arc::new(DelegatedStore {
            inner,
            caller,
            shared: self.shared.clone(),
        }))
    }

    fn get(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        if !self.held() {
            return self.inner.get(index, id);
        }
        self.read_one(index, id, false)
    }

    fn mget(&self, index: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>> {
        let keys: Vec<(Idx, String)> = ids.iter().map(|id| (index, id.clone())).collect();
        self.mget_docs(&keys, false)
    }

    fn mget_docs(&self, keys: &[(Idx, String)], brief: bool) -> StoreResult<Vec<Option<Doc>>> {
        if !self.held() {
            return self.inner.mget_docs(keys, brief);
        }
        self.read_parents_whole(keys, brief)?;
        let known: Vec<Option<Option<Doc>>> = {
            let mut overlay = self.shared.settled()?;
            keys.iter()
                .map(|(i, id)| overlay.get(*i, id, brief))
                .collect()
        };
        let ask: Vec<(Idx, String)> = keys
            .iter()
            .zip(&known)
            .filter(|(_, k)| k.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        let mut asked = if ask.is_empty() {
            Vec::new()
        } else {
            let docs = self.inner.mget_docs(&ask, brief)?;
            self.shared.settled()?.remember(ask, docs, brief)
        }
        .into_iter();
        Ok(known
            .into_iter()
            .map(|k| k.unwrap_or_else(|| asked.next().flatten()))
            .collect())
    }

    fn get_brief(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        if self.held() {
            return self.read_one(index, id, true);
        }
        self.inner.get_brief(index, id)
    }

    fn in_memory(&self, index: Idx, id: &str, brief: bool) -> bool {
        self.held() && self.shared.unsettled().answers(index, id, brief)
    }

    fn bulk(&self, ops: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>> {
        let _gate = self.shared.gate.read();
        let ops = match self.held() && self.caller == Caller::Indexer {
            true => ops.into_iter().map(text_update).collect(),
            false => ops,
        };
        if self.held() && passes(self.caller, &ops) {
            self.bulk_passing(ops)
        } else if self.held() {
            self.bulk_held(ops)
        } else {
            self.bulk_through(ops)
        }
    }

    fn search(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>> {
        if let Some(hits) = self.listed(req, false)? {
            return Ok(hits);
        }
        self.flush_first()?;
        self.inner.search(req)
    }

    fn search_brief(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>> {
        if let Some(hits) = self.listed(req, true)? {
            return Ok(hits);
        }
        self.flush_first()?;
        self.inner.search_brief(req)
    }

    fn search_fields(&self, req: &SearchRequest, fields: &[&str]) -> StoreResult<Vec<Vec<Value>>> {
        let brief = req.index.text_fields().all(|t| !fields.contains(&t));
        if let Some(hits) = self.listed(req, brief)? {
            return Ok(super::field_values(hits, fields));
        }
        self.flush_first()?;
        self.inner.search_fields(req, fields)
    }

    fn scan_pages(
        &self,
        index: Idx,
        query: &Query,
        sort: &[Sort],
        page: usize,
        f: &mut dyn FnMut(Vec<Hit>) -> StoreResult<bool>,
    ) -> StoreResult<()> {
        self.flush_first()?;
        self.inner.scan_pages(index, query, sort, page, f)
    }

    fn group(&self, req: &GroupRequest) -> StoreResult<Vec<Bucket>> {
        self.flush_first()?;
        self.inner.group(req)
    }

    /// A directory's children (`rmdir`'s emptiness check, a link count)
    /// are counted here when every name in it is known: no flush, no search.
    fn count(&self, index: Idx, query: &Query) -> StoreResult<u64> {
        if self.held() && index == Idx::Entries {
            if let Some(n) = children_count(&*self.shared.settled()?, query) {
                return Ok(n);
            }
            if let Some(parent) = query.parent_term()
                && self.read_whole(parent)?
                && let Some(n) = children_count(&*self.shared.settled()?, query)
            {
                return Ok(n);
            }
        }
        self.flush_first()?;
        self.inner.count(index, query)
    }

    /// Held, nothing: no other mount writes, and this mount's own writes
    /// reach every search anyway (it flushes first, and the cluster store
    /// refreshes what it wrote before searching).
    fn refresh(&self, index: Idx) -> StoreResult<()> {
        if self.held() {
            return Ok(());
        }
        self.inner.refresh(index)
    }

    /// Held, nothing: no other mount searches until the delegation is
    /// given back, and giving it back publishes what the flush sent.
    fn publish(&self, index: Idx) -> StoreResult<()> {
        if self.held() {
            return Ok(());
        }
        self.inner.publish(index)
    }

    /// Held, what the overlay holds is sent first: `esfs search` reads the
    /// cluster from its own process.
    fn expose(&self, index: Idx) -> StoreResult<()> {
        self.flush_first()?;
        self.inner.expose(index)
    }

    /// `fsync(2)`: after it, the change is in the cluster.
    fn sync(&self) -> StoreResult<()> {
        self.flush_first()?;
        self.inner.sync()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    /// A subtree made under the delegation is moved here, in memory (its
    /// documents are all in the overlay); any other goes the cluster's way.
    /// In memory the rename is decided here and its documents rewritten
    /// after it answers ([`Overlay::settle`]): by the flusher's next round
    /// or by whatever reaches the overlay first (the flusher woken at once
    /// took the overlay from the rename's own release of its locks).
    fn rebase_paths(&self, index: Idx, old: &str, new: &str) -> StoreResult<Option<Rebased>> {
        if index == Idx::Entries {
            let _gate = self.shared.gate.read();
            let mut overlay = self.shared.settled()?;
            if let Some(ids) = self.held().then(|| overlay.rebase(old, new)).flatten() {
                return Ok(Some(Rebased {
                    count: ids.len() as u64,
                    ids: Some(ids),
                }));
            }
        }
        self.flush_first()?;
        self.inner.rebase_paths(index, old, new)
    }
}
