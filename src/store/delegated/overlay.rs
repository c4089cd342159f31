//! What a delegated mount acknowledged and the cluster may not hold yet:
//! one slot per document it wrote (or looked at to decide a write), with
//! the state it gave it and the version of it the cluster holds.
//!
//! Writes are decided here by the rules Elasticsearch applies (a create
//! conflicts with an existing document, a conditional write with a stale
//! version), against the overlay's state: while the mount holds the
//! delegation no other mount writes, so what it wrote or read is what the
//! cluster will hold. Answers carry *local* versions, newer than any
//! version the cluster gave (see [`is_local`]), which the flush maps to
//! the cluster's.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::oplog::{Base, Encoded, Record, write_op};
use crate::store::cache::approx_size;
use crate::store::{BulkItemResult, BulkOp, Doc, Idx, StoreError, Version};

/// Whether the overlay may keep a document read from the cluster: not
/// another mount's session, which it renews behind this mount's back, nor
/// file contents (the cluster serves those reads; memory stays small).
fn kept(index: Idx, id: &str) -> bool {
    match index {
        Idx::Locks => !id.starts_with("session/"),
        Idx::Chunks => false,
        _ => true,
    }
}

/// Local versions: a primary term no cluster reaches, so they sort after
/// the cluster's (the document cache keeps the newer of two answers) and
/// are told apart from them.
const LOCAL_TERM: u64 = 1 << 40;

pub(crate) fn is_local(v: Version) -> bool {
    v.primary_term >= LOCAL_TERM
}

pub(crate) type Key = (Idx, String);

/// The next local version (`next` counts them) of a document whose
/// cluster version is `base`.
fn next_local(next: &mut u64, base: Base) -> Version {
    *next += 1;
    let term = match base {
        Base::At(v) if !is_local(v) => v.primary_term,
        _ => 1,
    };
    Version {
        seq_no: *next,
        primary_term: LOCAL_TERM + term,
    }
}

#[derive(Clone, Debug)]
enum State {
    Doc(Value),
    Gone,
}

#[derive(Debug)]
struct Slot {
    state: State,
    /// The version this mount's callers were last given.
    local: Option<Version>,
    /// What the cluster holds.
    base: Base,
    /// Not sent since it changed.
    dirty: bool,
    /// Its bytes as the budget counts them ([`slot_weight`]; set by
    /// [`Overlay::put`]).
    weight: usize,
    /// Its place in the eviction queue, `0` when it has none: changed
    /// since the cluster acknowledged it, in a flush not yet answered, or
    /// a lock document ([`Overlay::evictable`]).
    stamp: u64,
    /// When it was last written or read here ([`Budget::tick`]).
    touched: u32,
    /// Its state leaves out the index's text fields (a file's text, by far
    /// the bulk of a source file's entry), which stay as the cluster holds
    /// them: dropped past the budget before the slot itself, or never read
    /// (a brief read, a directory read whole). It answers brief reads; a
    /// full read asks the cluster for the text ([`Overlay::learn`] puts it
    /// back); written again it stays brief, and is sent as a partial update.
    brief: bool,
}

impl Slot {
    fn new(state: State, local: Option<Version>, base: Base, dirty: bool) -> Slot {
        Slot {
            state,
            local,
            base,
            dirty,
            weight: 0,
            stamp: 0,
            touched: 0,
            brief: false,
        }
    }

    /// Its state, for a read: brief ones only answer `brief` reads.
    fn answers(&self, brief: bool) -> Option<&Value> {
        match (&self.state, self.local) {
            (State::Doc(d), Some(_)) if brief || !self.brief => Some(d),
            _ => None,
        }
    }

    /// A caller's `if_version` matches: the version it was given, or the
    /// cluster's for a document not changed since it was read.
    fn matches(&self, v: Version) -> bool {
        self.local == Some(v) || (!self.dirty && self.base == Base::At(v))
    }
}

/// Bytes a slot holds, roughly: its document, its key (twice: the slot's
/// and its place in the eviction queue), and an entry's place in the path
/// index. A document held as a `serde_json` value takes about twice what
/// the document cache's [`approx_size`] counts (a map of 11 fields or more
/// is two B-tree nodes of 11 key and value slots, and each key is an
/// allocation of its own): so the budget is near the heap it costs.
fn slot_weight(key: &Key, slot: &Slot) -> usize {
    /// The slot, the map's share of a node, the queue's entry.
    const FIXED: usize = 192;
    let doc = match &slot.state {
        State::Doc(d) => 2 * approx_size(d) as usize,
        State::Gone => 0,
    };
    let path = Overlay::path_of(key, slot).map_or(0, |(p, id)| 64 + p.len() + id.len());
    FIXED + 2 * key.1.len() + doc + path
}

/// The directory an entry id (`<parent>/<name>`) is in.
pub(crate) fn parent_of(id: &str) -> Option<u64> {
    id.split_once('/').and_then(|(p, _)| p.parse().ok())
}

/// How much the overlay keeps of what the cluster already holds: slots
/// acknowledged by a flush, or read from the cluster, leave oldest first
/// past [`Budget::bytes`] (what the mount held grew with every file it
/// wrote: 2.2 GiB at 100 000 files). What waits to be sent never leaves.
struct Budget {
    /// Bytes of slots ([`slot_weight`]) past which clean ones leave.
    bytes: usize,
    /// A slot written or read more recently than this stays past the
    /// budget: its version may be in a caller's hands, about to be written
    /// with (a write with a version the overlay no longer knows conflicts,
    /// and the filesystem retries it from a new read; this makes that
    /// rare). Longer than the attribute TTL on Elasticsearch (1 s), for
    /// which the document cache above trusts what it read here.
    grace: Duration,
    /// Bytes of all slots now.
    held: usize,
    /// Clean slots, in the order they became clean (stale entries, whose
    /// stamp is no longer their slot's, are skipped).
    queue: VecDeque<Queued>,
    stamps: u64,
    /// The origin of [`Budget::tick`].
    epoch: Instant,
}

/// A place in the eviction queue.
struct Queued {
    stamp: u64,
    /// When it was queued ([`Budget::tick`]).
    at: u32,
    key: Key,
}

/// The budget of a delegated mount that does not set one
/// (`--delegate-memory`).
pub const DEFAULT_BUDGET: usize = 64 << 20;
/// See [`Budget::grace`].
const EVICT_GRACE: Duration = Duration::from_secs(2);
/// The resolution of [`Budget::tick`].
const TICK: Duration = Duration::from_millis(10);

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            bytes: DEFAULT_BUDGET,
            grace: EVICT_GRACE,
            held: 0,
            queue: VecDeque::new(),
            stamps: 0,
            epoch: Instant::now(),
        }
    }
}

impl Budget {
    /// Now, in [`TICK`]s since the overlay began (a `u32` in each slot).
    fn tick(&self) -> u32 {
        (self.epoch.elapsed().as_millis() / TICK.as_millis()) as u32
    }

    fn grace_ticks(&self) -> u32 {
        (self.grace.as_millis() / TICK.as_millis()) as u32
    }
}

/// What a bulk needs read from the cluster before it can be decided here.
pub(crate) enum Need {
    Nothing,
    Fetch(Vec<Key>),
}

#[derive(Default)]
pub(crate) struct Overlay {
    /// Ordered, so a directory's entries (ids `<parent>/<name>`) are a range.
    /// Changed only through [`Overlay::put`] and [`Overlay::drop_slot`],
    /// which keep `paths` in step.
    slots: BTreeMap<Key, Slot>,
    /// The entries held, as (path, id): a subtree is a range of it (every
    /// path below `/a` starts with `/a/`), so a directory rename touches
    /// only what it moves, not every document held.
    paths: BTreeSet<(String, String)>,
    /// Dirty keys in the order they turned dirty (a flush sends them so).
    dirty: Vec<Key>,
    /// Directories made under the delegation: every name in them has a
    /// slot, so a name without one is absent (no read to tell).
    complete: HashSet<u64>,
    next: u64,
    /// What bounds the slots' memory.
    budget: Budget,
    /// Every lock document this mount does not hold a slot for is absent
    /// ([`Overlay::know_locks`]).
    locks_whole: bool,
    /// Bytes logged since the last flush began.
    dirty_bytes: usize,
    /// When a write was last decided here.
    last_write: Option<std::time::Instant>,
    /// Directories with entries a flush wrote since the cluster's last
    /// refresh this mount knows of ([`Overlay::seen_by_search`]): a search
    /// of their entries must refresh first, or it may miss what the flush
    /// wrote (and the overlay may have let those slots go since).
    unrefreshed: HashSet<u64>,
    /// Whether [`Overlay::unrefreshed`] tells everything: not before the
    /// first refresh under the delegation (writes from before it).
    refreshed_once: bool,
}

/// Past this many waiting documents, or bytes of them, a writer flushes
/// before going on: memory stays bounded while the cluster is slower than
/// the writers (file contents kept in the cluster are documents too).
const MAX_DIRTY: usize = 4096;
const MAX_DIRTY_BYTES: usize = 32 << 20;
/// File contents are dropped once the cluster holds them, but a small
/// file's (a chunk of at most this many bytes) is kept, within the
/// budget as any clean slot: a lookup of a small file asks for its inode
/// and its bytes in one read (the open and read that usually follow then
/// cost nothing), and with the bytes gone that read went to the cluster
/// for every `stat` of a file this mount wrote (`du`, mdtest's stat phase).
const KEEP_CHUNK_MAX: usize = 16 << 10;

/// An entry of a directory held whole ([`Overlay::children`]).
#[derive(Debug, PartialEq)]
pub(crate) struct Child<'a> {
    pub id: &'a str,
    pub version: Version,
    pub source: &'a Value,
}

impl Child<'_> {
    pub(crate) fn to_doc(&self) -> Doc {
        Doc {
            id: self.id.to_string(),
            version: self.version,
            source: self.source.clone(),
        }
    }
}

/// One flush: the ops, and for each the key and the local version sent.
pub(crate) struct Outgoing {
    pub ops: Vec<BulkOp>,
    pub keys: Vec<(Key, Option<Version>)>,
}

impl Overlay {
    fn fresh(&mut self, base: Base) -> Version {
        next_local(&mut self.next, base)
    }

    /// The path an entry's slot holds, if it is an entry that exists.
    fn path_of<'a>(key: &'a Key, slot: &'a Slot) -> Option<(&'a str, &'a str)> {
        match (key.0, &slot.state) {
            (Idx::Entries, State::Doc(d)) => Some((d["path"].as_str()?, &key.1)),
            _ => None,
        }
    }

    fn unindex(&mut self, key: &Key, slot: &Slot) {
        if let Some((path, id)) = Self::path_of(key, slot) {
            self.paths.remove(&(path.to_string(), id.to_string()));
        }
    }

    /// Set a slot, keeping the path index and the bytes held in step.
    fn put(&mut self, key: Key, mut slot: Slot) {
        slot.weight = slot_weight(&key, &slot);
        slot.touched = self.budget.tick();
        self.budget.held += slot.weight;
        if let Some((path, id)) = Self::path_of(&key, &slot) {
            self.paths.insert((path.to_string(), id.to_string()));
        }
        if let Some(old) = self.slots.insert(key.clone(), slot) {
            self.budget.held -= old.weight;
            let same = Self::path_of(&key, &old) == Self::path_of(&key, &self.slots[&key]);
            if !same {
                self.unindex(&key, &old);
            }
        }
    }

    /// Drop a slot, keeping the path index and the bytes held in step.
    fn drop_slot(&mut self, key: &Key) -> Option<Slot> {
        let old = self.slots.remove(key)?;
        self.budget.held -= old.weight;
        self.unindex(key, &old);
        Some(old)
    }

    /// A slot dropped whose document the overlay no longer knows: an
    /// entry's directory then no longer has every name here, so it stops
    /// being answered from memory (its listing, its absent names, a rename
    /// of a subtree holding it go to the cluster). A removed entry's slot
    /// is no loss there (no slot says as much).
    fn discard(&mut self, key: &Key) {
        let Some(old) = self.drop_slot(key) else {
            return;
        };
        let absent = matches!(old.state, State::Gone) && old.base == Base::Absent;
        if !absent {
            self.incomplete(key);
        }
    }

    /// An entry's directory no longer has every name here (see
    /// [`Overlay::discard`]).
    fn incomplete(&mut self, key: &Key) {
        if key.0 == Idx::Entries
            && let Some(p) = parent_of(&key.1)
        {
            self.complete.remove(&p);
        }
    }

    /// `key`'s slot is clean and the cluster holds what it says: it may
    /// leave past the budget. Never a lock document (every one without a
    /// slot is absent, [`Overlay::know_locks`]).
    fn evictable(&mut self, key: &Key) {
        if key.0 == Idx::Locks {
            return;
        }
        let at = self.budget.tick();
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        if slot.dirty {
            return;
        }
        self.budget.stamps += 1;
        slot.stamp = self.budget.stamps;
        self.budget.queue.push_back(Queued {
            stamp: slot.stamp,
            at,
            key: key.clone(),
        });
        // Entries of slots written again since pile up: drop them once
        // they are half the queue (amortized O(1) a push).
        if self.budget.queue.len() > 2 * self.slots.len() + 1024 {
            let slots = &self.slots;
            self.budget
                .queue
                .retain(|q| slots.get(&q.key).is_some_and(|s| s.stamp == q.stamp));
        }
    }

    /// Let clean slots go, oldest first, while the slots hold more than the
    /// budget. One touched within the grace ([`Budget::grace`]) goes to the
    /// back of the queue instead; one queued within it ends the round (all
    /// behind it were queued later). Returns the slots and bytes left.
    pub(crate) fn trim(&mut self) -> (usize, usize) {
        let now = self.budget.tick();
        let grace = self.budget.grace_ticks();
        while self.budget.held > self.budget.bytes {
            let Some(q) = self.budget.queue.pop_front() else {
                break;
            };
            let Some(slot) = self.slots.get_mut(&q.key) else {
                continue;
            };
            if slot.stamp != q.stamp || slot.dirty {
                continue;
            }
            if now.wrapping_sub(slot.touched) >= grace {
                // The text first (the cluster has it), the rest next time
                // round.
                if self.leave_text(&q.key) {
                    self.requeue(q.key, now);
                } else {
                    self.discard(&q.key);
                }
            } else if now.wrapping_sub(q.at) < grace {
                self.budget.queue.push_front(q);
                break;
            } else {
                self.requeue(q.key, now);
            }
        }
        (self.slots.len(), self.budget.held)
    }

    /// Put a clean slot at the back of the eviction queue.
    fn requeue(&mut self, key: Key, now: u32) {
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        self.budget.stamps += 1;
        slot.stamp = self.budget.stamps;
        self.budget.queue.push_back(Queued {
            stamp: slot.stamp,
            at: now,
            key,
        });
    }

    /// Drop a clean slot's text fields (see [`Slot::brief`]); whether it
    /// had any.
    fn leave_text(&mut self, key: &Key) -> bool {
        let Some(slot) = self.slots.get_mut(key) else {
            return false;
        };
        let State::Doc(Value::Object(doc)) = &mut slot.state else {
            return false;
        };
        let mut left = false;
        for f in key.0.text_fields() {
            left |= doc.remove(f).is_some();
        }
        if left {
            slot.brief = true;
            self.budget.held -= slot.weight;
            slot.weight = slot_weight(key, slot);
            self.budget.held += slot.weight;
        }
        left
    }

    /// Give a brief slot its text back from `full`, the cluster's document
    /// (which holds the slot's text: only this mount writes, and a brief
    /// slot's writes leave the text as it is).
    fn take_text(&mut self, key: &Key, full: &Value) {
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        let State::Doc(Value::Object(doc)) = &mut slot.state else {
            return;
        };
        for f in key.0.text_fields() {
            if let Some(t) = full.get(f) {
                doc.insert(f.to_string(), t.clone());
            }
        }
        slot.brief = false;
        self.budget.held -= slot.weight;
        slot.weight = slot_weight(key, slot);
        self.budget.held += slot.weight;
    }

    /// The overlay's budget in bytes ([`DEFAULT_BUDGET`] unless set).
    pub(crate) fn set_budget(&mut self, bytes: usize) {
        self.budget.bytes = bytes;
        self.trim();
    }

    /// A chunk acknowledged by the cluster: kept if small (see
    /// [`KEEP_CHUNK_MAX`]; within the budget as any clean slot), else
    /// dropped (reads go there).
    fn keep_or_drop_chunk(&mut self, key: &Key) {
        let len = match self.slots.get(key).map(|s| &s.state) {
            Some(State::Doc(d)) => d["len"].as_u64().map(|l| l as usize),
            _ => None,
        };
        match len {
            Some(len) if len <= KEEP_CHUNK_MAX => self.evictable(key),
            _ => {
                self.drop_slot(key);
            }
        }
    }

    /// Nothing waits to be sent.
    pub(crate) fn clean(&self) -> bool {
        self.dirty.is_empty()
    }

    /// Whether so much waits that a writer should flush before going on.
    pub(crate) fn backlog(&self) -> bool {
        self.dirty.len() >= MAX_DIRTY || self.dirty_bytes >= MAX_DIRTY_BYTES
    }

    /// `n` more bytes of documents wait (as the op log counted them).
    pub(crate) fn logged(&mut self, n: usize) {
        self.dirty_bytes += n;
        self.last_write = Some(std::time::Instant::now());
    }

    /// Whether writes came in the last 2 s.
    pub(crate) fn busy(&self) -> bool {
        self.last_write
            .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(2))
    }

    #[cfg(test)]
    fn dirty_len(&self) -> usize {
        self.dirty.len()
    }

    /// Whether a document absent from the slots is known absent to a
    /// `create` or another write: an entry of a directory made under the
    /// delegation whose names all have slots, or to a create a new inode
    /// (its number comes fresh from the id allocator's range this mount
    /// reserved; any other inode may exist, its slot gone for the budget).
    fn known_absent(&self, index: Idx, id: &str, create: bool) -> bool {
        match index {
            Idx::Inodes => create,
            Idx::Entries => parent_of(id).is_some_and(|p| self.complete.contains(&p)),
            Idx::Locks => self.locks_whole && kept(index, id),
            _ => false,
        }
    }

    /// A directory rename's path rewrite (see `MetaStore::rebase_paths`),
    /// done in place when the moved directory (its entry already at `new`)
    /// and every directory below it were made under the delegation: then
    /// every document below `old` has a slot. Each entry below gets its
    /// `path` and `dir` rewritten, a new local version and a place in the
    /// next flush, as a partial update would; returns their keys (to log
    /// with [`Overlay::changes`]). `None`, nothing changed, otherwise.
    ///
    /// O(subtree): the entries below `old` are a range of the path index
    /// (`old/` up to `old0`, '0' following '/').
    pub(crate) fn rebase(&mut self, old: &str, new: &str) -> Option<Vec<Key>> {
        let below = self.rebase_check(old, new)?;
        let moved = |p: &str| format!("{new}{}", &p[old.len()..]);
        let mut keys = Vec::with_capacity(below.len());
        for (path, id) in below {
            let at = (path, id);
            self.paths.remove(&at);
            let (path, id) = at;
            let key = (Idx::Entries, id);
            let slot = self.slots.get_mut(&key).expect("checked");
            let State::Doc(d) = &mut slot.state else {
                unreachable!("checked")
            };
            let dir = moved(d["dir"].as_str().expect("checked"));
            let path = moved(&path);
            d["dir"] = Value::String(dir);
            d["path"] = Value::String(path.clone());
            self.paths.insert((path, key.1.clone()));
            self.budget.held -= slot.weight;
            slot.weight = slot_weight(&key, slot);
            self.budget.held += slot.weight;
            slot.stamp = 0;
            slot.local = Some(next_local(&mut self.next, slot.base));
            if !slot.dirty {
                slot.dirty = true;
                self.dirty.push(key.clone());
            }
            keys.push(key);
        }
        Some(keys)
    }

    /// [`Overlay::rebase`]'s preconditions, checked before anything
    /// changes: the (path, id) of every entry below `old`.
    fn rebase_check(&self, old: &str, new: &str) -> Option<Vec<(String, String)>> {
        let entry = |id: &str| match self.slots.get(&(Idx::Entries, id.to_string())) {
            Some(Slot {
                state: State::Doc(d),
                local: Some(_),
                ..
            }) => Some(d),
            _ => None,
        };
        let complete = |d: &Value| {
            d["ino"]
                .as_u64()
                .is_some_and(|i| self.complete.contains(&i))
        };
        // The moved directory: its entry, already at `new`.
        let moved = self
            .paths
            .range((new.to_string(), String::new())..)
            .take_while(|(p, _)| p == new)
            .filter_map(|(_, id)| entry(id))
            .any(|d| d["kind"] == "dir" && complete(d));
        if !moved {
            return None;
        }
        let lo = (format!("{old}/"), String::new());
        let hi = (format!("{old}0"), String::new());
        let mut below = Vec::new();
        for (path, id) in self.paths.range(lo..hi) {
            let d = entry(id)?;
            let dir_ok = d["dir"].as_str().is_some_and(|p| p.starts_with(old));
            if !dir_ok || (d["kind"] == "dir" && !complete(d)) {
                return None;
            }
            below.push((path.clone(), id.clone()));
        }
        Some(below)
    }

    /// The log records of `keys`' current states, borrowed from the slots.
    pub(crate) fn changes<'a>(&'a self, keys: &'a [Key]) -> Vec<Encoded<'a>> {
        keys.iter()
            .filter_map(|key| {
                let slot = self.slots.get(key)?;
                let state = match &slot.state {
                    State::Doc(s) => Some(s),
                    State::Gone => None,
                };
                Some(Encoded::change(key.0, &key.1, state, slot.base).brief(slot.brief))
            })
            .collect()
    }

    /// Whether every name of directory `parent` is here.
    pub(crate) fn whole(&self, parent: u64) -> bool {
        self.complete.contains(&parent)
    }

    /// Whether a search of directory `parent`'s entries must refresh first
    /// to see every write this mount made there ([`Overlay::unrefreshed`]).
    pub(crate) fn search_needs_refresh(&self, parent: u64) -> bool {
        !self.refreshed_once || self.unrefreshed.contains(&parent)
    }

    /// A search refreshed after every flush answered so far: it sees all
    /// they wrote.
    pub(crate) fn seen_by_search(&mut self) {
        self.unrefreshed.clear();
        self.refreshed_once = true;
    }

    /// Whether `key` has a slot.
    pub(crate) fn has(&self, key: &Key) -> bool {
        self.slots.contains_key(key)
    }

    /// Directories `dirs` read whole: their `entries` as the cluster holds
    /// them (brief), and their `inodes` (read for those without a slot).
    /// Every name of them has a slot then, unless one leaves for the budget
    /// before the end, which takes its directory out again (the grace
    /// keeps what was just read).
    pub(crate) fn learn_whole(
        &mut self,
        dirs: &[u64],
        entries: Vec<(Key, Doc)>,
        inodes: Vec<(Key, Option<Doc>)>,
    ) {
        self.complete.extend(dirs);
        let (keys, docs): (Vec<Key>, Vec<Option<Doc>>) =
            entries.into_iter().map(|(k, d)| (k, Some(d))).unzip();
        self.learn(keys, docs, true);
        let (keys, docs) = inodes.into_iter().unzip();
        self.learn(keys, docs, true);
    }

    /// The lock documents in the cluster when the delegation was taken:
    /// from then on only this mount writes them, so the rest are absent.
    pub(crate) fn know_locks(&mut self, docs: Vec<Doc>) {
        let keys = docs.iter().map(|d| (Idx::Locks, d.id.clone())).collect();
        self.learn(keys, docs.into_iter().map(Some).collect(), false);
        self.locks_whole = true;
    }

    /// The entries of directory `parent` that have `terms` (field, value),
    /// when every name in it is known here (a directory made under the
    /// delegation, or read whole); `brief`: without their text fields.
    /// Borrowed: a listing clones only the page it returns, and a count
    /// nothing.
    pub(crate) fn children(
        &self,
        parent: u64,
        terms: &[(&str, &Value)],
        brief: bool,
    ) -> Option<Vec<Child<'_>>> {
        if !self.complete.contains(&parent) {
            return None;
        }
        let from = (Idx::Entries, format!("{parent}/"));
        let to = (Idx::Entries, format!("{parent}0")); // '0' follows '/'
        let mut docs = Vec::new();
        for ((_, id), s) in self.slots.range(from..to) {
            let (State::Doc(d), Some(v)) = (&s.state, s.local) else {
                continue;
            };
            if !terms.iter().all(|(f, val)| &&d[*f] == val) {
                continue;
            }
            // A full listing of a directory whose text left memory goes
            // the cluster's way.
            docs.push(Child {
                id,
                version: v,
                source: s.answers(brief)?,
            });
        }
        Some(docs)
    }

    /// The overlay's answer for a read (`brief`: one that needs no text
    /// fields): `Some(None)` absent, `Some(doc)`, or `None`: ask the
    /// cluster. A slot read is touched (it stays past the budget for
    /// [`Budget::grace`]).
    pub(crate) fn get(&mut self, index: Idx, id: &str, brief: bool) -> Option<Option<Doc>> {
        let now = self.budget.tick();
        let Some(slot) = self.slots.get_mut(&(index, id.to_string())) else {
            // (An inode not written here exists or not: only names in
            // directories made here, and lock documents, are known absent
            // to a read.)
            return self.known_absent(index, id, false).then_some(None);
        };
        slot.touched = now;
        if let State::Gone = slot.state {
            return Some(None);
        }
        let source = slot.answers(brief)?.clone();
        Some(Some(Doc {
            id: id.to_string(),
            version: slot.local?,
            source,
        }))
    }

    /// The documents `ops` must read from the cluster to be decided.
    pub(crate) fn needs(&self, ops: &[BulkOp]) -> Need {
        let mut keys: Vec<Key> = Vec::new();
        for op in ops {
            let (index, id) = (op.index(), op.id());
            let needed = match op {
                BulkOp::Create { .. } => true,
                BulkOp::Update { .. } => true,
                // A delete of a document not known here is taken as done
                // (the flush's delete of an absent one counts as done too):
                // what it answers is not worth a read.
                BulkOp::Delete { .. } | BulkOp::Index { .. } => false,
            };
            let key = (index, id.to_string());
            let create = matches!(op, BulkOp::Create { .. });
            if needed
                && !self.slots.contains_key(&key)
                && !self.known_absent(index, id, create)
                && !keys.contains(&key)
            {
                keys.push(key);
            }
        }
        if keys.is_empty() {
            Need::Nothing
        } else {
            Need::Fetch(keys)
        }
    }

    /// Documents read from the cluster for a read (`brief`: without their
    /// text fields), kept unless a write made a slot meanwhile: while the
    /// delegation holds they stay true, so a write deciding on them needs
    /// no second read. Within the budget, as every clean slot. Returns the
    /// answers to give (see [`Overlay::learn`]).
    pub(crate) fn remember(
        &mut self,
        keys: Vec<Key>,
        docs: Vec<Option<Doc>>,
        brief: bool,
    ) -> Vec<Option<Doc>> {
        let mut answers = Vec::with_capacity(docs.len());
        let (mut learned_keys, mut learned_docs) = (Vec::new(), Vec::new());
        for (key, doc) in keys.into_iter().zip(docs) {
            if kept(key.0, &key.1) {
                learned_keys.push(key);
                learned_docs.push(doc);
                answers.push(None);
            } else {
                answers.push(Some(doc));
            }
        }
        let mut learned = self.learn(learned_keys, learned_docs, brief).into_iter();
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| learned.next().flatten()))
            .collect()
    }

    /// Documents read to decide a write ([`Overlay::needs`]) or for a read
    /// (`brief`: without their text fields): kept (a write that follows
    /// finds them: they are fresh, within the grace). Returns the answers
    /// to give: as read, but where a brief slot gets its text back from a
    /// full read, the slot's own state and local version (the cluster's
    /// version is older than the one callers hold).
    pub(crate) fn learn(
        &mut self,
        keys: Vec<Key>,
        docs: Vec<Option<Doc>>,
        brief: bool,
    ) -> Vec<Option<Doc>> {
        let mut answers = Vec::with_capacity(docs.len());
        for (key, doc) in keys.into_iter().zip(docs) {
            if let Some(slot) = self.slots.get(&key) {
                let answer = match (&doc, slot.brief && !brief) {
                    (Some(full), true) => {
                        self.take_text(&key, &full.source);
                        self.get(key.0, &key.1, false).flatten()
                    }
                    _ => doc,
                };
                answers.push(answer);
                continue;
            }
            let slot = match &doc {
                Some(d) => Slot {
                    brief: brief && key.0.has_text(),
                    ..Slot::new(
                        State::Doc(d.source.clone()),
                        Some(d.version),
                        Base::At(d.version),
                        false,
                    )
                },
                None => Slot::new(State::Gone, None, Base::Absent, false),
            };
            self.put(key.clone(), slot);
            self.evictable(&key);
            answers.push(doc);
        }
        self.trim();
        answers
    }

    /// Decide `ops` (after [`Overlay::needs`] was satisfied): the results,
    /// and the records to log for those that changed something.
    pub(crate) fn apply(&mut self, ops: Vec<BulkOp>) -> (Vec<BulkItemResult>, Vec<Record>) {
        let mut results = Vec::with_capacity(ops.len());
        let mut records = Vec::new();
        for op in ops {
            let key = (op.index(), op.id().to_string());
            let r = self.apply_one(&key, op);
            if r.is_ok() {
                let slot = &self.slots[&key];
                let state = match &slot.state {
                    State::Doc(s) => Some(s.clone()),
                    State::Gone => None,
                };
                records.push(Record::change(key.0, &key.1, state, slot.base).brief(slot.brief));
            }
            results.push(r);
        }
        (results, records)
    }

    fn apply_one(&mut self, key: &Key, op: BulkOp) -> BulkItemResult {
        let conflict = || Err(StoreError::Conflict(key.1.clone()));
        let create = matches!(op, BulkOp::Create { .. });
        let known_absent = self.known_absent(key.0, &key.1, create);
        let slot = self.slots.get(key);
        let was_dirty = slot.is_some_and(|s| s.dirty);
        // Only a partial update keeps a state without its text brief; a
        // whole source replaces the text too.
        let mut brief = false;
        let exists = matches!(
            slot,
            Some(Slot {
                state: State::Doc(_),
                ..
            })
        );
        let (state, base) = match op {
            BulkOp::Create { source, .. } => {
                if exists {
                    return conflict();
                }
                if key.0 == Idx::Inodes
                    && source["kind"] == "dir"
                    && let Ok(ino) = key.1.parse::<u64>()
                {
                    self.complete.insert(ino);
                }
                let base = slot.map_or(Base::Absent, |s| s.base);
                debug_assert!(slot.is_some() || known_absent);
                (State::Doc(source), base)
            }
            BulkOp::Index {
                source, if_version, ..
            } => match (slot, if_version) {
                (Some(s), Some(v)) if !exists || !s.matches(v) => return conflict(),
                (Some(s), _) => (State::Doc(source), s.base),
                (None, Some(v)) if is_local(v) => return conflict(),
                // Trusted: no one else writes while the delegation holds.
                (None, Some(v)) => (State::Doc(source), Base::At(v)),
                (None, None) => (State::Doc(source), Base::Unknown),
            },
            BulkOp::Update {
                doc, if_version, ..
            } => match slot {
                Some(s) if exists => {
                    if if_version.is_some_and(|v| !s.matches(v)) {
                        return conflict();
                    }
                    let base = s.base;
                    brief = s.brief && key.0.text_fields().any(|f| doc.get(f).is_none());
                    // Taken out and merged in place: a directory rename
                    // updates every document below it, and a copy of
                    // each would cost more than the update.
                    let taken = self.drop_slot(key).map(|s| s.state);
                    let Some(State::Doc(mut cur)) = taken else {
                        unreachable!("exists")
                    };
                    if let (Some(cur), Some(fields)) = (cur.as_object_mut(), doc.as_object()) {
                        for (k, v) in fields {
                            cur.insert(k.clone(), v.clone());
                        }
                    }
                    (State::Doc(cur), base)
                }
                _ => return Err(StoreError::NotFound(key.1.clone())),
            },
            BulkOp::Delete { if_version, .. } => match (slot, if_version) {
                (Some(s), Some(v)) if !exists || !s.matches(v) => return conflict(),
                (Some(_), None) if !exists => return Err(StoreError::NotFound(key.1.clone())),
                (Some(s), _) => (State::Gone, s.base),
                (None, Some(v)) if is_local(v) => return conflict(),
                (None, Some(v)) => (State::Gone, Base::At(v)),
                (None, None) if known_absent => return Err(StoreError::NotFound(key.1.clone())),
                (None, None) => (State::Gone, Base::Unknown),
            },
        };
        let v = self.fresh(base);
        self.put(
            key.clone(),
            Slot {
                brief,
                ..Slot::new(state, Some(v), base, true)
            },
        );
        if !was_dirty {
            self.dirty.push(key.clone());
        }
        Ok(v)
    }

    /// The dirty documents as one flush: each a write conditional on what
    /// the cluster holds. They are clean from now on unless written again.
    pub(crate) fn outgoing(&mut self) -> Outgoing {
        let mut out = Outgoing {
            ops: Vec::new(),
            keys: Vec::new(),
        };
        self.dirty_bytes = 0;
        let mut nothing_to_send = Vec::new();
        for key in std::mem::take(&mut self.dirty) {
            let Some(slot) = self.slots.get_mut(&key) else {
                continue;
            };
            slot.dirty = false;
            let state = match &slot.state {
                State::Doc(s) => Some(s),
                State::Gone => None,
            };
            // Made and removed between two flushes: nothing to send (the
            // cluster agrees already).
            let Some(op) = write_op(key.0, &key.1, state, slot.base, slot.brief) else {
                nothing_to_send.push(key);
                continue;
            };
            out.ops.push(op);
            out.keys.push((key, slot.local));
        }
        for key in nothing_to_send {
            self.evictable(&key);
        }
        out
    }

    /// A flush was answered: the cluster's versions become the bases. An
    /// item refused means the cluster changed behind the delegation (it was
    /// broken, the mount taken for dead): the cluster's state stands, the
    /// slot is dropped, and the loss is returned to be reported.
    pub(crate) fn answered(
        &mut self,
        sent: &Outgoing,
        results: Vec<BulkItemResult>,
    ) -> (Vec<Record>, Vec<(Key, StoreError)>) {
        let mut lost = Vec::new();
        let mut acks = Vec::new();
        for ((key, _), (op, r)) in sent.keys.iter().zip(sent.ops.iter().zip(results)) {
            let held = match (op, r) {
                (BulkOp::Delete { if_version, .. }, r)
                    if r.is_ok()
                        || (if_version.is_none() && matches!(r, Err(StoreError::NotFound(_)))) =>
                {
                    Ok(Base::Absent)
                }
                (_, Ok(v)) => Ok(Base::At(v)),
                (_, Err(e)) => Err(e),
            };
            let Ok(base) = held else {
                if let Some(e) = held.err() {
                    // The cluster's state stands, which the overlay does
                    // not know.
                    self.drop_slot(key);
                    self.incomplete(key);
                    lost.push((key.clone(), e));
                }
                continue;
            };
            if key.0 == Idx::Entries
                && let Some(p) = parent_of(&key.1)
            {
                self.unrefreshed.insert(p);
            }
            acks.push(Record {
                index: key.0,
                id: key.1.clone(),
                state: None,
                base,
                brief: false,
                sent: true,
            });
            let Some(slot) = self.slots.get_mut(key) else {
                continue;
            };
            slot.base = base;
            if key.0 == Idx::Chunks && !slot.dirty {
                // File contents (written unconditionally): once the
                // cluster holds them, only small files' stay here.
                self.keep_or_drop_chunk(key);
            } else {
                self.evictable(key);
            }
        }
        self.trim();
        (acks, lost)
    }

    /// A flush failed as a whole (the cluster unreachable): what it carried
    /// is dirty again, ahead of what was written since.
    pub(crate) fn unsent(&mut self, sent: Outgoing) {
        let mut again: Vec<Key> = Vec::new();
        for (key, _) in sent.keys {
            if let Some(slot) = self.slots.get_mut(&key)
                && !slot.dirty
            {
                slot.dirty = true;
                again.push(key);
            }
        }
        again.append(&mut self.dirty);
        self.dirty = again;
    }

    /// For a write that goes straight to the cluster once the delegation is
    /// given back: the cluster's version for a local one this mount handed
    /// out as the document's latest (an older local version stays, and
    /// conflicts, as it should).
    pub(crate) fn translate(&self, key: &Key, v: Version) -> Version {
        match self.slots.get(key) {
            Some(s) if is_local(v) && s.local == Some(v) => match s.base {
                Base::At(real) => real,
                _ => v,
            },
            _ => v,
        }
    }

    /// A write went to the cluster directly: the slot no longer tells its
    /// version.
    pub(crate) fn forget(&mut self, key: &Key) {
        self.drop_slot(key);
    }

    /// The delegation ended: nothing is known absent any more.
    pub(crate) fn released(&mut self) {
        self.complete.clear();
        self.locks_whole = false;
        self.slots
            .retain(|_, s| matches!(s.local, Some(v) if is_local(v)));
        self.budget.held = self.slots.values().map(|s| s.weight).sum();
        let paths = self
            .slots
            .iter()
            .filter_map(|(k, s)| Self::path_of(k, s))
            .map(|(p, id)| (p.to_string(), id.to_string()))
            .collect();
        self.paths = paths;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn create(index: Idx, id: &str, source: Value) -> BulkOp {
        BulkOp::Create {
            index,
            id: id.into(),
            source,
        }
    }

    #[test]
    fn a_tree_made_under_the_delegation_is_decided_without_reads() {
        let mut o = Overlay::default();
        // The directory's inode and its entry in the root, whose names are
        // not known: the entry needs a read, the inode (a fresh number) not.
        let ops = vec![
            create(Idx::Inodes, "20", json!({"kind": "dir"})),
            create(Idx::Entries, "1/d", json!({"ino": 20})),
        ];
        let Need::Fetch(keys) = o.needs(&ops) else {
            panic!("the root's names are not known")
        };
        o.learn(keys, vec![None], false);
        let (r, recs) = o.apply(ops);
        assert!(r.iter().all(|r| r.is_ok()));
        assert_eq!(recs.len(), 2);
        // Inside the new directory nothing needs a read, and a name taken
        // twice conflicts.
        let inside = vec![create(Idx::Entries, "20/f", json!({"ino": 21}))];
        assert!(matches!(o.needs(&inside), Need::Nothing));
        assert!(o.apply(inside.clone()).0[0].is_ok());
        assert!(matches!(o.apply(inside).0[0], Err(StoreError::Conflict(_))));
        assert_eq!(o.get(Idx::Entries, "20/nothing", false), Some(None));
        // A conditional write needs the version handed out.
        let v = o.get(Idx::Entries, "20/f", false).unwrap().unwrap().version;
        assert!(is_local(v));
        let stale = Version {
            seq_no: v.seq_no - 1,
            ..v
        };
        let put = |v| BulkOp::Index {
            index: Idx::Entries,
            id: "20/f".into(),
            source: json!({"ino": 22}),
            if_version: Some(v),
        };
        assert!(matches!(
            o.apply(vec![put(stale)]).0[0],
            Err(StoreError::Conflict(_))
        ));
        assert!(o.apply(vec![put(v)]).0[0].is_ok());
        // One flush: creates of what the cluster lacks, in order.
        let out = o.outgoing();
        assert_eq!(out.ops.len(), 3);
        assert!(out.ops.iter().all(|op| matches!(op, BulkOp::Create { .. })));
        assert_eq!(o.dirty_len(), 0);
    }

    #[test]
    fn made_and_removed_between_flushes_sends_nothing_and_answers_set_bases() {
        let mut o = Overlay::default();
        o.complete.insert(5);
        let v = o.apply(vec![create(Idx::Entries, "5/x", json!({}))]).0[0]
            .clone()
            .unwrap();
        let del = BulkOp::Delete {
            index: Idx::Entries,
            id: "5/x".into(),
            if_version: Some(v),
        };
        assert!(o.apply(vec![del]).0[0].is_ok());
        assert!(o.outgoing().ops.is_empty());
        // A flush answered: the local version now maps to the cluster's.
        let w = o.apply(vec![create(Idx::Entries, "5/y", json!({}))]).0[0]
            .clone()
            .unwrap();
        let out = o.outgoing();
        let real = Version {
            seq_no: 3,
            primary_term: 1,
        };
        assert!(o.answered(&out, vec![Ok(real)]).1.is_empty());
        let key = (Idx::Entries, "5/y".to_string());
        assert_eq!(o.translate(&key, w), real);
        // A failed flush puts its items back first.
        let _ = o.apply(vec![create(Idx::Entries, "5/z", json!({}))]);
        let out = o.outgoing();
        let _ = o.apply(vec![create(Idx::Entries, "5/w", json!({}))]);
        o.unsent(out);
        let again = o.outgoing();
        let ids: Vec<&str> = again.ops.iter().map(|op| op.id()).collect();
        assert_eq!(ids, vec!["5/z", "5/w"]);
    }

    #[test]
    fn a_rebase_moves_exactly_the_subtree_and_follows_every_change() {
        let mut o = Overlay::default();
        o.complete.insert(1);
        let entry = |path: &str, dir: &str, kind: &str, ino: u64| json!({"path": path, "dir": dir, "kind": kind, "ino": ino});
        let made = o.apply(vec![
            create(Idx::Inodes, "20", json!({"kind": "dir"})),
            create(Idx::Entries, "1/d", entry("/d", "/", "dir", 20)),
            create(Idx::Entries, "20/a", entry("/d/a", "/d", "file", 21)),
            create(Idx::Entries, "20/b", entry("/d/b", "/d", "file", 22)),
            // Beside the subtree, sorting right after or before it.
            create(Idx::Entries, "1/d-x", entry("/d-x", "/", "file", 23)),
            create(Idx::Entries, "1/c", entry("/c", "/", "file", 24)),
            create(Idx::Entries, "1/d0", entry("/d0", "/", "file", 25)),
        ]);
        assert!(made.0.iter().all(|r| r.is_ok()));
        let ids = |keys: Option<Vec<Key>>| -> Option<Vec<String>> {
            Some(keys?.into_iter().map(|(_, id)| id).collect())
        };
        let at = |o: &mut Overlay, id: &str| o.get(Idx::Entries, id, false).unwrap().unwrap();
        // Not moved yet: nothing is at the new path.
        assert_eq!(o.rebase("/d", "/e"), None);
        // The rename's entry step, then its paths.
        let v = at(&mut o, "1/d").version;
        let moved = o.apply(vec![
            BulkOp::Delete {
                index: Idx::Entries,
                id: "1/d".into(),
                if_version: Some(v),
            },
            create(Idx::Entries, "1/e", entry("/e", "/", "dir", 20)),
        ]);
        assert!(moved.0.iter().all(|r| r.is_ok()));
        let before = at(&mut o, "20/b").version;
        let flushed = o.outgoing();
        assert!(o.clean());
        let keys = o.rebase("/d", "/e").unwrap();
        assert_eq!(ids(Some(keys.clone())).unwrap(), vec!["20/a", "20/b"]);
        let b = at(&mut o, "20/b");
        assert_eq!(b.source, entry("/e/b", "/e", "file", 22));
        assert!(b.version.seq_no > before.seq_no, "a new local version");
        assert_eq!(
            at(&mut o, "1/d-x").source["path"],
            "/d-x",
            "beside: untouched"
        );
        // Logged as their new states, and sent by the next flush.
        let changes = serde_json::to_value(o.changes(&keys)).unwrap();
        assert_eq!(changes[1]["s"]["path"], "/e/b");
        drop(flushed);
        assert_eq!(o.outgoing().ops.len(), 2);
        assert_eq!(ids(o.rebase("/d", "/e")), Some(vec![]), "none left");
        // A removal leaves the index; a directory below not made here
        // (its names unknown) keeps the rebase out of memory.
        let v = at(&mut o, "20/b").version;
        let gone = BulkOp::Delete {
            index: Idx::Entries,
            id: "20/b".into(),
            if_version: Some(v),
        };
        assert!(o.apply(vec![gone]).0[0].is_ok());
        assert_eq!(ids(o.rebase("/e", "/e")), Some(vec!["20/a".into()]));
        let sub = create(Idx::Entries, "20/s", entry("/e/s", "/e", "dir", 30));
        assert!(o.apply(vec![sub]).0[0].is_ok());
        assert_eq!(o.rebase("/e", "/e"), None);
        // Given back: only what this mount wrote stays, indexed the same.
        o.released();
        o.complete.insert(20);
        o.complete.insert(30);
        assert_eq!(ids(o.rebase("/e", "/e")).unwrap(), vec!["20/a", "20/s"]);
    }

    #[test]
    fn small_files_contents_stay_after_the_flush_and_large_ones_go() {
        let mut o = Overlay::default();
        let chunk = |id: &str, len: usize| BulkOp::Index {
            index: Idx::Chunks,
            id: id.into(),
            source: json!({"file": "21", "n": 0, "len": len, "data": "eA"}),
            if_version: None,
        };
        let r = o.apply(vec![chunk("21:0", 1), chunk("22:0", KEEP_CHUNK_MAX + 1)]);
        assert!(r.0.iter().all(|r| r.is_ok()));
        let out = o.outgoing();
        let real = Version {
            seq_no: 1,
            primary_term: 1,
        };
        assert!(o.answered(&out, vec![Ok(real), Ok(real)]).1.is_empty());
        // The small one answers a read from memory; the large one is the
        // cluster's to answer.
        assert!(matches!(o.get(Idx::Chunks, "21:0", false), Some(Some(_))));
        assert_eq!(o.get(Idx::Chunks, "22:0", false), None);
        let kept = o.budget.held;
        assert_eq!(kept, o.slots.values().map(|s| s.weight).sum::<usize>());
        // Deleted, it is a removal waiting to be sent.
        let del = BulkOp::Delete {
            index: Idx::Chunks,
            id: "21:0".into(),
            if_version: None,
        };
        assert!(o.apply(vec![del]).0[0].is_ok());
        assert!(o.budget.held < kept);
        assert_eq!(o.get(Idx::Chunks, "21:0", false), Some(None));
    }

    /// An overlay whose clean slots leave as soon as they are past `bytes`.
    fn budgeted(bytes: usize) -> Overlay {
        let mut o = Overlay::default();
        o.budget.grace = Duration::ZERO;
        o.set_budget(bytes);
        o
    }

    /// Send what waits and have the cluster take all of it.
    fn flush_all(o: &mut Overlay) {
        let out = o.outgoing();
        let real = Version {
            seq_no: 7,
            primary_term: 1,
        };
        let ok = out.ops.iter().map(|_| Ok(real)).collect();
        assert!(o.answered(&out, ok).1.is_empty());
    }

    fn entry_doc(name: &str) -> Value {
        json!({"path": format!("/d/{name}"), "dir": "/d", "kind": "file", "ino": 40})
    }

    #[test]
    fn past_the_budget_a_files_text_leaves_before_its_entry_and_comes_back_from_a_full_read() {
        let text = "x".repeat(4000);
        let with_text = |name: &str| {
            let mut d = entry_doc(name);
            d["contents"] = json!(text);
            d
        };
        let mut o = budgeted(usize::MAX);
        assert!(
            o.search_needs_refresh(5),
            "before the first refresh: writes from before"
        );
        o.seen_by_search();
        o.complete.insert(5);
        let ops = (0..4)
            .map(|i| {
                create(
                    Idx::Entries,
                    &format!("5/f{i}"),
                    with_text(&format!("f{i}")),
                )
            })
            .collect();
        assert!(o.apply(ops).0.iter().all(|r| r.is_ok()));
        assert!(!o.search_needs_refresh(5));
        flush_all(&mut o);
        // What the flush wrote in 5 is not in a search before a refresh.
        assert!(o.search_needs_refresh(5) && !o.search_needs_refresh(6));
        o.seen_by_search();
        assert!(!o.search_needs_refresh(5));
        let full = o.budget.held;
        // Just under what the four hold: one round of the queue takes the
        // text of the oldest only, and every slot stays.
        o.set_budget(full - 1);
        assert_eq!(o.slots.len(), 4);
        assert!(o.budget.held <= full - text.len());
        let brief: Vec<bool> = (0..4)
            .map(|i| o.slots[&(Idx::Entries, format!("5/f{i}"))].brief)
            .collect();
        assert_eq!(brief, [true, false, false, false]);
        // A brief slot answers brief reads and listings; a full read, or a
        // full listing of its directory, is the cluster's.
        assert!(
            o.get(Idx::Entries, "5/f0", true)
                .unwrap()
                .unwrap()
                .source
                .get("contents")
                .is_none()
        );
        assert_eq!(o.get(Idx::Entries, "5/f0", false), None);
        assert_eq!(o.children(5, &[], true).unwrap().len(), 4);
        assert_eq!(o.children(5, &[], false), None);
        // Renamed brief: sent as a partial update, which leaves the text
        // as the cluster holds it.
        o.set_budget(usize::MAX);
        let local = o.get(Idx::Entries, "5/f0", true).unwrap().unwrap().version;
        let up = BulkOp::Update {
            index: Idx::Entries,
            id: "5/f0".into(),
            doc: json!({"mode": 0o600}),
            if_version: Some(local),
        };
        assert!(o.apply(vec![up]).0[0].is_ok());
        let out = o.outgoing();
        assert!(matches!(&out.ops[0], BulkOp::Update { doc, .. }
            if doc.get("contents").is_none() && doc["path"] == "/d/f0" && doc["mode"] == 0o600));
        let ok = out
            .ops
            .iter()
            .map(|_| {
                Ok(Version {
                    seq_no: 9,
                    primary_term: 1,
                })
            })
            .collect();
        assert!(o.answered(&out, ok).1.is_empty());
        // The cluster's full document gives the slot its text back; the
        // answer carries the slot's local version, which callers hold.
        let local = o.get(Idx::Entries, "5/f0", true).unwrap().unwrap().version;
        let mut cluster = with_text("f0");
        cluster["mode"] = json!(0o600);
        let read = Doc {
            id: "5/f0".into(),
            version: Version {
                seq_no: 9,
                primary_term: 1,
            },
            source: cluster.clone(),
        };
        let answer = o.remember(vec![(Idx::Entries, "5/f0".into())], vec![Some(read)], false);
        let answer = answer[0].clone().unwrap();
        assert_eq!((answer.version, &answer.source), (local, &cluster));
        assert_eq!(
            o.get(Idx::Entries, "5/f0", false).unwrap().unwrap().source,
            cluster
        );
        // A whole source replaces the text: no longer brief.
        o.leave_text(&(Idx::Entries, "5/f0".to_string()));
        let put = BulkOp::Index {
            index: Idx::Entries,
            id: "5/f0".into(),
            source: entry_doc("f0"),
            if_version: Some(local),
        };
        assert!(o.apply(vec![put]).0[0].is_ok());
        assert!(!o.slots[&(Idx::Entries, "5/f0".to_string())].brief);
        assert!(matches!(&o.outgoing().ops[0], BulkOp::Index { .. }));
    }

    #[test]
    fn past_the_budget_clean_slots_leave_and_their_directory_is_no_longer_answered_from_memory() {
        let mut o = budgeted(0);
        o.complete.insert(5);
        let names: Vec<String> = (0..20).map(|i| format!("f{i:02}")).collect();
        let ops = names
            .iter()
            .map(|n| create(Idx::Entries, &format!("5/{n}"), entry_doc(n)))
            .collect();
        assert!(o.apply(ops).0.iter().all(|r| r.is_ok()));
        // Dirty: nothing leaves, whatever the budget.
        o.trim();
        assert_eq!(o.slots.len(), 20);
        assert_eq!(o.children(5, &[], false).unwrap().len(), 20);
        // In a flush not answered yet: still nothing (the cluster may not
        // hold them).
        let out = o.outgoing();
        o.trim();
        assert_eq!(o.slots.len(), 20);
        assert_eq!(
            o.get(Idx::Entries, "5/absent", false),
            Some(None),
            "complete"
        );
        let real = Version {
            seq_no: 7,
            primary_term: 1,
        };
        let ok = out.ops.iter().map(|_| Ok(real)).collect();
        assert!(o.answered(&out, ok).1.is_empty());
        // Acknowledged: gone, and with them the directory's completeness:
        // its listing and its absent names are the cluster's to tell.
        assert!(o.slots.is_empty());
        assert!(o.paths.is_empty());
        assert_eq!(o.budget.held, 0);
        assert!(!o.complete.contains(&5));
        assert_eq!(o.children(5, &[], false), None);
        assert_eq!(o.get(Idx::Entries, "5/f00", false), None);
        assert_eq!(o.get(Idx::Entries, "5/absent", false), None);
        // A create there asks the cluster whether the name is free.
        let again = vec![create(Idx::Entries, "5/f00", entry_doc("f00"))];
        assert!(matches!(o.needs(&again), Need::Fetch(k) if k.len() == 1));
        // An evicted removal's slot costs the directory nothing.
        let mut o = budgeted(usize::MAX);
        o.complete.insert(6);
        assert!(o.apply(vec![create(Idx::Entries, "6/x", json!({}))]).0[0].is_ok());
        flush_all(&mut o);
        let del = BulkOp::Delete {
            index: Idx::Entries,
            id: "6/x".into(),
            if_version: Some(o.get(Idx::Entries, "6/x", false).unwrap().unwrap().version),
        };
        assert!(o.apply(vec![del]).0[0].is_ok());
        flush_all(&mut o);
        o.set_budget(0);
        assert!(o.slots.is_empty());
        assert!(o.complete.contains(&6));
        assert_eq!(o.get(Idx::Entries, "6/x", false), Some(None));
    }

    #[test]
    fn the_budget_keeps_the_newest_clean_slots_and_every_dirty_one() {
        let mut o = budgeted(usize::MAX);
        let inode = |i: u64| {
            create(
                Idx::Inodes,
                &i.to_string(),
                json!({"kind": "file", "size": i}),
            )
        };
        assert!(
            o.apply((100..200).map(inode).collect())
                .0
                .iter()
                .all(|r| r.is_ok())
        );
        flush_all(&mut o);
        let one = o.budget.held / 100;
        // Written again after the flush: dirty, it stays.
        let v = o.get(Idx::Inodes, "100", false).unwrap().unwrap().version;
        let put = BulkOp::Index {
            index: Idx::Inodes,
            id: "100".into(),
            source: json!({"kind": "file", "size": 1}),
            if_version: Some(v),
        };
        assert!(o.apply(vec![put]).0[0].is_ok());
        o.set_budget(30 * one);
        assert!(o.budget.held <= 30 * one);
        assert_eq!(
            o.budget.held,
            o.slots.values().map(|s| s.weight).sum::<usize>()
        );
        assert!(o.slots.contains_key(&(Idx::Inodes, "100".into())), "dirty");
        assert!(o.slots.contains_key(&(Idx::Inodes, "199".into())), "newest");
        assert!(
            !o.slots.contains_key(&(Idx::Inodes, "101".into())),
            "oldest"
        );
        let kept = o.slots.len();
        assert!((25..=30).contains(&kept), "{kept} slots kept");
        // Slots touched within the grace stay past the budget.
        let mut o = Overlay::default();
        assert!(
            o.apply((100..110).map(inode).collect())
                .0
                .iter()
                .all(|r| r.is_ok())
        );
        flush_all(&mut o);
        o.set_budget(0);
        assert_eq!(o.slots.len(), 10);
        // Lock documents never leave: every one without a slot is absent.
        let mut o = budgeted(0);
        let lock = Doc {
            id: "tree/1".into(),
            version: Version {
                seq_no: 1,
                primary_term: 1,
            },
            source: json!({"owner": "a"}),
        };
        o.know_locks(vec![lock]);
        o.trim();
        assert!(matches!(o.get(Idx::Locks, "tree/1", false), Some(Some(_))));
        assert_eq!(o.get(Idx::Locks, "tree/2", false), Some(None));
    }

    #[test]
    fn an_inode_whose_slot_left_is_read_again_not_taken_for_absent() {
        let mut o = budgeted(0);
        let made = o.apply(vec![create(
            Idx::Inodes,
            "30",
            json!({"kind": "file", "mode": 1}),
        )]);
        assert!(made.0[0].is_ok());
        flush_all(&mut o);
        assert!(o.slots.is_empty());
        // A new inode's create needs no read; an update of this one does
        // (before, it was answered NotFound).
        assert!(matches!(
            o.needs(&[create(Idx::Inodes, "31", json!({}))]),
            Need::Nothing
        ));
        let update = BulkOp::Update {
            index: Idx::Inodes,
            id: "30".into(),
            doc: json!({"mode": 2}),
            if_version: None,
        };
        let Need::Fetch(keys) = o.needs(std::slice::from_ref(&update)) else {
            panic!("an evicted inode must be read")
        };
        assert_eq!(
            o.get(Idx::Inodes, "30", false),
            None,
            "the cluster's to answer"
        );
        let real = Version {
            seq_no: 7,
            primary_term: 1,
        };
        let cluster = Doc {
            id: "30".into(),
            version: real,
            source: json!({"kind": "file", "mode": 1}),
        };
        o.budget.grace = EVICT_GRACE;
        o.learn(keys, vec![Some(cluster)], false);
        assert!(o.apply(vec![update]).0[0].is_ok());
        assert_eq!(
            o.get(Idx::Inodes, "30", false).unwrap().unwrap().source["mode"],
            2
        );
        // A caller still holding the local version handed out before the
        // slot left gets a conflict (and retries from a new read), as
        // after another writer's change.
        let mut o = budgeted(0);
        let v = o.apply(vec![create(Idx::Inodes, "32", json!({}))]).0[0]
            .clone()
            .unwrap();
        flush_all(&mut o);
        let put = |v| BulkOp::Index {
            index: Idx::Inodes,
            id: "32".into(),
            source: json!({"mode": 3}),
            if_version: Some(v),
        };
        assert!(matches!(
            o.apply(vec![put(v)]).0[0],
            Err(StoreError::Conflict(_))
        ));
        assert!(
            o.apply(vec![put(real)]).0[0].is_ok(),
            "the cluster's version"
        );
        // A delete of an inode without a slot is taken as done and sent.
        let del = BulkOp::Delete {
            index: Idx::Inodes,
            id: "33".into(),
            if_version: None,
        };
        assert!(o.apply(vec![del]).0[0].is_ok());
        assert_eq!(o.outgoing().ops.len(), 2);
    }

    #[test]
    fn reads_kept_past_the_budget_leave_oldest_first() {
        let mut o = budgeted(usize::MAX);
        let doc = |i: u64| Doc {
            id: format!("{i}"),
            version: Version {
                seq_no: i,
                primary_term: 1,
            },
            source: json!({"kind": "file", "size": i}),
        };
        for i in 0..50 {
            o.remember(
                vec![(Idx::Inodes, i.to_string())],
                vec![Some(doc(i))],
                false,
            );
        }
        let one = o.budget.held / 50;
        o.set_budget(10 * one);
        assert!((9..=10).contains(&o.slots.len()), "{} kept", o.slots.len());
        assert!(o.slots.contains_key(&(Idx::Inodes, "49".into())));
        // Kept reads are read from memory, with the cluster's version.
        assert_eq!(
            o.get(Idx::Inodes, "45", false)
                .unwrap()
                .unwrap()
                .version
                .seq_no,
            45
        );
        assert_eq!(o.get(Idx::Inodes, "1", false), None);
    }
}
