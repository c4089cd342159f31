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
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::left::Left;
use super::oplog::{Base, Encoded, Record, write_op};
use super::slot::{Slot, State, merge_fields};
use crate::store::cache::approx_size;
use crate::store::{BulkItemResult, BulkOp, Doc, Idx, StoreError, StoreResult, Version};

/// Whether the overlay may keep a document read from the cluster: not
/// another mount's session, which it renews behind this mount's back, nor
/// file contents or texts (the cluster serves those reads; memory stays
/// small).
fn kept(index: Idx, id: &str) -> bool {
    match index {
        Idx::Locks => !id.starts_with("session/"),
        Idx::Chunks | Idx::Texts => false,
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
        State::Packed { json, path, .. } => json.len() + path.as_ref().map_or(0, |p| p.len()),
        State::Gone => 0,
    };
    let path = Overlay::path_of(key, slot).map_or(0, |(p, id)| 64 + p.len() + id.len());
    FIXED + 2 * key.1.len() + doc + path
}

/// Whether a slot holds a file's text, which leaves before any slot leaves
/// whole ([`Overlay::trim_contents`]): any of its index's text fields (a
/// brief one holds none). (Not a small file's chunk: with chunks leaving
/// first, `du` of 100 000 small files was 3x faster but their `rm -rf`
/// 2.4x slower, 149-156 s against 63-74; the cause is not found.)
fn has_contents(key: &Key, slot: &Slot) -> bool {
    match &slot.state {
        State::Doc(d) => !slot.brief && key.0.text_fields().any(|f| d.get(f).is_some()),
        // (Packed only once its text left.)
        State::Packed { .. } | State::Gone => false,
    }
}

/// A slot's state changed in place: its weight, and the bytes `held`, follow.
fn reweigh(held: &mut usize, key: &Key, slot: &mut Slot) {
    *held -= slot.weight;
    slot.weight = slot_weight(key, slot);
    *held += slot.weight;
}

pub(crate) use crate::model::entry_parent as parent_of;

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
    /// The clean slots of [`Budget::queue`] that hold a file's text
    /// ([`has_contents`]), in the same order: the text leaves before any
    /// slot leaves or is packed ([`Overlay::trim_contents`]).
    contents: VecDeque<Queued>,
    stamps: u64,
    /// The origin of [`Budget::tick`].
    epoch: Instant,
}

/// A place in the eviction queue.
#[derive(Clone)]
struct Queued {
    stamp: u64,
    /// When it was queued ([`Budget::tick`]).
    at: u32,
    key: Key,
}

/// The budget of a delegated mount that does not set one
/// (`--delegate-memory`): enough for the names and inodes of a source tree
/// of about 40 000 files (2.2 KB a file as [`slot_weight`] counts them),
/// and of about four times as many packed ([`State::Packed`]: 4.3 KB to
/// 1.0 KB for a file's entry and inode as `bench/scale` makes them), so a
/// walk of a tree the mount works in is answered from memory. With 64 MiB
/// four copies of a 10 000-file tree did not fit: each cold `find` read
/// every directory from the cluster again (13 s against 2.3 s held).
pub const DEFAULT_BUDGET: usize = 256 << 20;
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
            contents: VecDeque::new(),
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
    /// A document in a bulk passing to the cluster ([`Overlay::begin_pass`]):
    /// decide once it is answered.
    Wait,
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
    /// Directories made under the delegation, or read whole since
    /// ([`Overlay::learn_whole`]): every name in them has a slot, so a
    /// name without one is absent (no read to tell).
    complete: HashSet<u64>,
    /// Directories that were [`Overlay::complete`] until names left for
    /// the budget, with those names: a name in neither a slot nor here is
    /// absent ([`Left`]).
    left: Left,
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
    /// Documents a bulk is writing straight to the cluster
    /// ([`Overlay::begin_pass`]): no write decides on them, no read from
    /// the cluster is kept, until it is answered.
    passing: HashSet<Key>,
    /// A directory rename decided here whose subtree is not rewritten yet,
    /// as (old path, new path): [`Overlay::rebase`] decides, and
    /// [`Overlay::settle`] rewrites, after the rename has answered.
    moved: Option<(String, String)>,
    /// The records of lock documents decided while `moved` waits (the
    /// rename's own release of its locks and intent above all): logged
    /// after the rewrite's, so the op log never holds a rename's end
    /// without its paths ([`Overlay::hold_back`]).
    held_back: Vec<Record>,
}

/// Past this many waiting documents, or bytes of them, the flusher is woken
/// to send them now rather than at its next round: bulks stay of a size
/// the cluster takes in well under a second.
const SEND_DIRTY: usize = 4096;
const SEND_DIRTY_BYTES: usize = 16 << 20;
/// Past this many, a writer flushes before going on: memory stays bounded
/// while the cluster is slower than the writers (file contents kept in the
/// cluster are documents too). Four times the above, so writers go on
/// while one bulk is in flight and the next fills (with one limit, every
/// writer waited for every bulk past it: 0.4-2.3 s stalls, file creation
/// of mdtest's 8 writers at half the rate on three nodes).
const MAX_DIRTY: usize = 4 * SEND_DIRTY;
const MAX_DIRTY_BYTES: usize = 4 * SEND_DIRTY_BYTES;
/// How much waits to be sent ([`Overlay::backlog`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Backlog {
    /// The flusher's next round will do.
    None,
    /// Wake the flusher.
    Send,
    /// Flush before going on.
    Wait,
}

/// File contents are dropped once the cluster holds them, but a small
/// file's (a chunk of at most this many bytes) is kept, within the
/// budget as any clean slot: a lookup of a small file asks for its inode
/// and its bytes in one read (the open and read that usually follow then
/// cost nothing), and with the bytes gone that read went to the cluster
/// for every `stat` of a file this mount wrote (`du`, mdtest's stat phase).
const KEEP_CHUNK_MAX: usize = 16 << 10;

/// An entry of a directory held whole ([`Overlay::children`]).
#[derive(Debug)]
pub(crate) struct Child<'a> {
    pub id: &'a str,
    pub version: Version,
    state: &'a State,
}

impl Child<'_> {
    /// Its document (shared with the slot, or decoded from a packed one).
    pub(crate) fn to_doc(&self) -> Doc {
        Doc {
            id: self.id.to_string(),
            version: self.version,
            source: self.state.doc().expect("a child exists"),
        }
    }

    /// A numeric field (a listing's sort key), a packed entry's `cookie`
    /// without decoding it.
    pub(crate) fn number(&self, field: &str) -> Option<i64> {
        match self.state {
            State::Doc(d) => d[field].as_i64(),
            State::Packed {
                cookie: Some(c), ..
            } if field == "cookie" => Some(*c),
            s => s.doc()?[field].as_i64(),
        }
    }
}

/// One flush: the ops, and for each the key and the local version sent.
pub(crate) struct Outgoing {
    /// Taken by the flush to send (a copy of every document sent was a
    /// second deep copy of the flush, file contents included).
    pub ops: Vec<BulkOp>,
    pub keys: Vec<(Key, Option<Version>)>,
    /// For each op, whether it is a delete and then whether unconditional
    /// (what [`Overlay::answered`] needs of it).
    deletes: Vec<Option<bool>>,
}

impl Overlay {
    fn fresh(&mut self, base: Base) -> Version {
        next_local(&mut self.next, base)
    }

    /// The path an entry's slot holds, if it is an entry that exists.
    fn path_of<'a>(key: &'a Key, slot: &'a Slot) -> Option<(&'a str, &'a str)> {
        match (key.0, &slot.state) {
            (Idx::Entries, State::Doc(d)) => Some((d["path"].as_str()?, &key.1)),
            (Idx::Entries, State::Packed { path, .. }) => Some((path.as_deref()?, &key.1)),
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
    /// [`Overlay::discard`]), nor knows which are absent.
    fn incomplete(&mut self, key: &Key) {
        if key.0 == Idx::Entries
            && let Some(p) = parent_of(&key.1)
        {
            self.complete.remove(&p);
            self.left.forget(p);
        }
    }

    /// A clean slot leaves for the budget (the cluster holds what it
    /// says). An entry of a directory whose every name is known stays
    /// known: it is recorded in [`Overlay::left`], so the names the
    /// directory does not have are still known absent; its listing goes to
    /// the cluster from now on. Anything else as [`Overlay::discard`].
    fn leave(&mut self, key: &Key) {
        let dir = match key.0 {
            Idx::Entries => parent_of(&key.1),
            _ => None,
        };
        let Some(p) = dir.filter(|p| self.complete.contains(p) || self.left.tracks(*p)) else {
            return self.discard(key);
        };
        let Some(old) = self.drop_slot(key) else {
            return;
        };
        if matches!(old.state, State::Gone) && old.base == Base::Absent {
            return; // (no name: nothing to know)
        }
        self.complete.remove(&p);
        self.left.left(p, &key.1);
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
        let queued = Queued {
            stamp: slot.stamp,
            at,
            key: key.clone(),
        };
        if has_contents(key, slot) {
            self.budget.contents.push_back(queued.clone());
        }
        self.budget.queue.push_back(queued);
        // Entries of slots written again since pile up: drop them once
        // they are half the queue (amortized O(1) a push).
        let slots = &self.slots;
        let live = |q: &Queued| slots.get(&q.key).is_some_and(|s| s.stamp == q.stamp);
        if self.budget.queue.len() > 2 * slots.len() + 1024 {
            self.budget.queue.retain(live);
        }
        if self.budget.contents.len() > 2 * slots.len() + 1024 {
            self.budget.contents.retain(live);
        }
    }

    /// Past the budget, a file's text leaves first: from the clean slots
    /// holding one, oldest first, before any slot leaves whole. The text is
    /// most of a source file's entry (with 64 MiB, one copy of a source tree
    /// pushed the names of the others out of memory, and each cold `find`
    /// read them from the cluster again), and only a rename or a copy of
    /// that file asks for it again, where a name that leaves costs its
    /// directory a read from the cluster. Grace as in [`Overlay::trim`].
    fn trim_contents(&mut self, now: u32, grace: u32) {
        self.drain(
            |b| &mut b.contents,
            now,
            grace,
            |o, q, _| {
                o.leave_text(&q.key);
            },
            |o, q, now| o.budget.contents.push_back(Queued { at: now, ..q }),
        );
    }

    /// The walk [`Overlay::trim`] and [`Overlay::trim_contents`] share, over
    /// `queue` (of [`Budget`]): while the slots hold more than the budget,
    /// its oldest entry is popped (skipped if stale, or if its slot is
    /// dirty); a slot untouched for the grace goes to `leave`, one touched
    /// within it to `keep` (the back of a queue), and one queued within it
    /// ends the round (all behind it were queued later).
    fn drain(
        &mut self,
        queue: fn(&mut Budget) -> &mut VecDeque<Queued>,
        now: u32,
        grace: u32,
        leave: fn(&mut Overlay, Queued, u32),
        keep: fn(&mut Overlay, Queued, u32),
    ) {
        while self.budget.held + self.left.bytes() > self.budget.bytes {
            let Some(q) = queue(&mut self.budget).pop_front() else {
                break;
            };
            let Some(slot) = self.slots.get(&q.key) else {
                continue;
            };
            if slot.stamp != q.stamp || slot.dirty {
                continue;
            }
            if now.wrapping_sub(slot.touched) >= grace {
                leave(self, q, now);
            } else if now.wrapping_sub(q.at) < grace {
                queue(&mut self.budget).push_front(q);
                break;
            } else {
                keep(self, q, now);
            }
        }
    }

    /// Let clean slots go, oldest first, while the slots hold more than the
    /// budget. One touched within the grace ([`Budget::grace`]) goes to the
    /// back of the queue instead; one queued within it ends the round (all
    /// behind it were queued later). Returns the slots and bytes left.
    pub(crate) fn trim(&mut self) -> (usize, usize) {
        self.assert_settled();
        let now = self.budget.tick();
        let grace = self.budget.grace_ticks();
        self.trim_contents(now, grace);
        self.drain(
            |b| &mut b.queue,
            now,
            grace,
            // The text first (the cluster has it), then the document
            // packed, and the rest next time round.
            |o, q, now| match o.leave_text(&q.key) || o.pack(&q.key) {
                true => o.requeue(q.key, now),
                false => o.leave(&q.key),
            },
            |o, q, now| o.requeue(q.key, now),
        );
        (self.slots.len(), self.budget.held)
    }

    /// Put a clean slot at the back of the eviction queue.
    fn requeue(&mut self, key: Key, now: u32) {
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        self.budget.stamps += 1;
        slot.stamp = self.budget.stamps;
        let queued = Queued {
            stamp: slot.stamp,
            at: now,
            key,
        };
        // (Its place in the text queue went with its old stamp.)
        if has_contents(&queued.key, slot) {
            self.budget.contents.push_back(queued.clone());
        }
        self.budget.queue.push_back(queued);
    }

    /// Hold a clean slot's document as its JSON text ([`State::Packed`]);
    /// whether it was not yet. Past the budget a slot is packed before it
    /// leaves: a walk of a tree larger than the budget then finds about
    /// four times as many of its names and inodes in memory.
    fn pack(&mut self, key: &Key) -> bool {
        let Some(slot) = self.slots.get_mut(key) else {
            return false;
        };
        let State::Doc(d) = &slot.state else {
            return false;
        };
        let (path, cookie) = match key.0 {
            Idx::Entries => (d["path"].as_str().map(Box::from), d["cookie"].as_i64()),
            _ => (None, None),
        };
        let json = serde_json::to_vec(&**d).expect("a value encodes");
        slot.state = State::Packed {
            json: json.into_boxed_slice(),
            path,
            cookie,
        };
        reweigh(&mut self.budget.held, key, slot);
        true
    }

    /// Hold `key`'s document decoded again, for a write to change it.
    fn unpack(&mut self, key: &Key) {
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        if let State::Packed { .. } = slot.state {
            slot.state = State::Doc(slot.state.doc().expect("packed"));
            reweigh(&mut self.budget.held, key, slot);
        }
    }

    /// Drop a clean slot's text fields (see [`Slot::brief`]); whether it
    /// had any.
    fn leave_text(&mut self, key: &Key) -> bool {
        let Some(slot) = self.slots.get_mut(key) else {
            return false;
        };
        let State::Doc(d) = &mut slot.state else {
            return false;
        };
        if !key.0.text_fields().any(|f| d.get(f).is_some()) {
            return false;
        }
        // (A copy only if a reader still holds this state.)
        let Value::Object(doc) = Arc::make_mut(d) else {
            return false;
        };
        let mut left = false;
        for f in key.0.text_fields() {
            left |= doc.remove(f).is_some();
        }
        if left {
            slot.brief = true;
            reweigh(&mut self.budget.held, key, slot);
        }
        left
    }

    /// Give a brief slot its text back from `full`, the cluster's document
    /// (which holds the slot's text: only this mount writes, and a brief
    /// slot's writes leave the text as it is).
    fn take_text(&mut self, key: &Key, full: &Value) {
        self.unpack(key);
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        let State::Doc(d) = &mut slot.state else {
            return;
        };
        let Value::Object(doc) = Arc::make_mut(d) else {
            return;
        };
        for f in key.0.text_fields() {
            if let Some(t) = full.get(f) {
                doc.insert(f.to_string(), t.clone());
            }
        }
        slot.brief = false;
        reweigh(&mut self.budget.held, key, slot);
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
        let len = match self.slots.get(key).and_then(|s| s.state.doc()) {
            Some(d) => d["len"].as_u64().map(|l| l as usize),
            None => None,
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

    /// Whether so much waits that it should be sent now, or even before a
    /// writer goes on.
    pub(crate) fn backlog(&self) -> Backlog {
        let (n, bytes) = (self.dirty.len(), self.dirty_bytes);
        if n >= MAX_DIRTY || bytes >= MAX_DIRTY_BYTES {
            Backlog::Wait
        } else if n >= SEND_DIRTY || bytes >= SEND_DIRTY_BYTES {
            Backlog::Send
        } else {
            Backlog::None
        }
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
    /// delegation (or read whole) whose names all have slots or left for
    /// the budget and are in [`Overlay::left`], or to a create a new inode
    /// (its number comes fresh from the id allocator's range this mount
    /// reserved; any other inode may exist, its slot gone for the budget).
    fn known_absent(&self, index: Idx, id: &str, create: bool) -> bool {
        match index {
            Idx::Inodes => create,
            Idx::Entries => {
                parent_of(id).is_some_and(|p| self.complete.contains(&p) || self.left.absent(p, id))
            }
            Idx::Locks => self.locks_whole && kept(index, id),
            _ => false,
        }
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

    /// Whether a read of `(index, id)` is answered here ([`Overlay::get`]
    /// answers it from a slot), without touching the slot.
    pub(crate) fn answers(&self, index: Idx, id: &str, brief: bool) -> bool {
        self.slots
            .get(&(index, id.to_string()))
            .is_some_and(|s| matches!(s.state, State::Gone) || s.would_answer(brief))
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
        self.assert_settled();
        self.complete.extend(dirs);
        for d in dirs {
            self.left.forget(*d);
        }
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
        self.assert_settled();
        if !self.complete.contains(&parent) {
            return None;
        }
        let from = (Idx::Entries, format!("{parent}/"));
        let to = (Idx::Entries, format!("{parent}0")); // '0' follows '/'
        let mut docs = Vec::new();
        for ((_, id), s) in self.slots.range(from..to) {
            let (true, Some(v)) = (s.state.exists(), s.local) else {
                continue;
            };
            // (A packed one is decoded only for terms beyond the parent.)
            if !terms.is_empty() {
                let d = s.state.doc().expect("exists");
                if !terms.iter().all(|(f, val)| &&d[*f] == val) {
                    continue;
                }
            }
            // A full listing of a directory whose text left memory goes
            // the cluster's way.
            if !s.would_answer(brief) {
                return None;
            }
            docs.push(Child {
                id,
                version: v,
                state: &s.state,
            });
        }
        Some(docs)
    }

    /// The overlay's answer for a read (`brief`: one that needs no text
    /// fields): `Some(None)` absent, `Some(doc)`, or `None`: ask the
    /// cluster. A slot read is touched (it stays past the budget for
    /// [`Budget::grace`]).
    pub(crate) fn get(&mut self, index: Idx, id: &str, brief: bool) -> Option<Option<Doc>> {
        if index != Idx::Locks {
            self.assert_settled();
        }
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
        // (Shared with the slot, not copied: a writer copies on write. A
        // packed one stays packed: decoded for this read only.)
        let source = slot.answers(brief)?;
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
            if !self.passing.is_empty() && self.passing.contains(&(index, id.to_string())) {
                return Need::Wait;
            }
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
        self.assert_settled();
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
        self.assert_settled();
        let mut answers = Vec::with_capacity(docs.len());
        for (key, doc) in keys.into_iter().zip(docs) {
            if self.passing.contains(&key) {
                // Read before or after the bulk landed: not known which
                // (nor, for a directory read whole, all its names here).
                self.incomplete(&key);
                answers.push(doc);
                continue;
            }
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
        if ops.iter().any(|op| op.index() != Idx::Locks) {
            self.assert_settled();
        }
        let mut results = Vec::with_capacity(ops.len());
        let mut records = Vec::new();
        for op in ops {
            let key = (op.index(), op.id().to_string());
            let r = self.apply_one(&key, op);
            if r.is_ok() {
                let slot = &self.slots[&key];
                let state = slot.state.doc().map(|s| Value::clone(&s));
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
        self.unpack(key);
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
                (State::Doc(source.into()), base)
            }
            BulkOp::Index {
                source, if_version, ..
            } => match (slot, if_version) {
                (Some(s), Some(v)) if !exists || !s.matches(v) => return conflict(),
                (Some(s), _) => (State::Doc(source.into()), s.base),
                (None, Some(v)) if is_local(v) => return conflict(),
                // Trusted: no one else writes while the delegation holds.
                (None, Some(v)) => (State::Doc(source.into()), Base::At(v)),
                (None, None) => (State::Doc(source.into()), Base::Unknown),
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
                    merge_fields(&mut cur, &doc);
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
        self.assert_settled();
        let mut out = Outgoing {
            ops: Vec::new(),
            keys: Vec::new(),
            deletes: Vec::new(),
        };
        self.dirty_bytes = 0;
        let mut nothing_to_send = Vec::new();
        for key in std::mem::take(&mut self.dirty) {
            let Some(slot) = self.slots.get_mut(&key) else {
                continue;
            };
            slot.dirty = false;
            // (A dirty slot is never packed: this shares its document.)
            let doc = slot.state.doc();
            let state = doc.as_deref();
            // Made and removed between two flushes: nothing to send (the
            // cluster agrees already).
            let Some(op) = write_op(key.0, &key.1, state, slot.base, slot.brief) else {
                nothing_to_send.push(key);
                continue;
            };
            out.deletes.push(match &op {
                BulkOp::Delete { if_version, .. } => Some(if_version.is_none()),
                _ => None,
            });
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
        self.assert_settled();
        let mut lost = Vec::new();
        let mut acks = Vec::new();
        for ((key, _), (delete, r)) in sent.keys.iter().zip(sent.deletes.iter().zip(results)) {
            let held = match (delete, r) {
                (Some(unconditional), r)
                    if r.is_ok()
                        || (*unconditional && matches!(r, Err(StoreError::NotFound(_)))) =>
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
                patch: false,
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

    /// [`Overlay::translate`] of `op`'s condition, for a write that goes
    /// straight to the cluster.
    pub(crate) fn translate_op(&self, op: &mut BulkOp) {
        let key = (op.index(), op.id().to_string());
        if let BulkOp::Index { if_version, .. }
        | BulkOp::Update { if_version, .. }
        | BulkOp::Delete { if_version, .. } = op
            && let Some(v) = if_version
        {
            *v = self.translate(&key, *v);
        }
    }

    /// Whether a write to `key` may pass straight to the cluster
    /// ([`Overlay::begin_pass`]): the overlay holds no change of it that
    /// waits to be sent.
    pub(crate) fn may_pass(&self, key: &Key) -> bool {
        self.slots.get(key).is_none_or(|s| !s.dirty)
    }

    /// `ops` (writes [`Overlay::may_pass`] let through) go to the cluster
    /// as they are, by a caller holding the flush lock (so the cluster
    /// holds what every clean slot says, at its base version): their
    /// conditions are mapped to the cluster's versions, and their
    /// documents are passing until [`Overlay::passed`].
    pub(crate) fn begin_pass(&mut self, ops: &mut [BulkOp]) {
        self.assert_settled();
        for op in ops {
            self.translate_op(op);
            self.passing.insert((op.index(), op.id().to_string()));
        }
    }

    /// The cluster's answers to the bulk [`Overlay::begin_pass`] let
    /// through (an error: it failed as a whole, each write done or not).
    /// A slot of a write the cluster applied takes it (a partial update
    /// merged, a whole document as it is), at the
    /// cluster's version and a new local one (what the caller is given,
    /// as the overlay's answers are); any other slot of it is dropped
    /// (the cluster's state stands, which the overlay does not know).
    /// Other documents get no slot: memory stays as it was.
    pub(crate) fn passed(
        &mut self,
        ops: &[BulkOp],
        answers: StoreResult<Vec<BulkItemResult>>,
    ) -> StoreResult<Vec<BulkItemResult>> {
        self.assert_settled();
        let (mut answers, failed) = match answers {
            Ok(a) => (Some(a.into_iter()), None),
            Err(e) => (None, Some(e)),
        };
        let mut given = Vec::with_capacity(ops.len());
        for op in ops {
            let key = (op.index(), op.id().to_string());
            self.passing.remove(&key);
            let answer = answers.as_mut().and_then(Iterator::next);
            if key.0 == Idx::Entries
                && let Some(p) = parent_of(&key.1)
            {
                self.unrefreshed.insert(p);
            }
            self.unpack(&key);
            let slot = self
                .slots
                .get(&key)
                .map(|s| matches!(s.state, State::Doc(_)));
            let merged = match (op, &answer, slot) {
                (BulkOp::Update { doc, .. }, Some(Ok(v)), Some(true)) => Some((doc, false, *v)),
                (BulkOp::Index { source, .. }, Some(Ok(v)), Some(true)) => Some((source, true, *v)),
                _ => None,
            };
            let Some((fields, whole, v)) = merged else {
                if slot.is_some() {
                    self.discard(&key);
                }
                given.extend(answer);
                continue;
            };
            let old = self.drop_slot(&key).expect("matched above");
            let State::Doc(mut cur) = old.state else {
                unreachable!("matched above")
            };
            if whole {
                cur = std::sync::Arc::new(fields.clone());
            } else {
                merge_fields(&mut cur, fields);
            }
            let base = Base::At(v);
            let local = self.fresh(base);
            self.put(
                key.clone(),
                Slot {
                    brief: old.brief,
                    ..Slot::new(State::Doc(cur), Some(local), base, false)
                },
            );
            self.evictable(&key);
            given.push(Ok(local));
        }
        self.trim();
        failed.map_or(Ok(given), Err)
    }

    /// A write went to the cluster directly: the slot no longer tells its
    /// version.
    pub(crate) fn forget(&mut self, key: &Key) {
        self.drop_slot(key);
    }

    /// The documents kept since the delegation was given back (to map the
    /// local versions callers still hold: [`Overlay::translate`]).
    pub(crate) fn kept(&self) -> Vec<Key> {
        self.slots.keys().cloned().collect()
    }

    /// The delegation is taken again and `now` is what the cluster holds
    /// of `keys` ([`Overlay::kept`]): a kept slot still tells its document
    /// only if nobody wrote it since it was sent; the others go (a caller's
    /// local version of one then conflicts, as any stale version does).
    pub(crate) fn keep_unchanged(&mut self, keys: &[Key], now: &[Option<Doc>]) {
        self.assert_settled();
        for (key, doc) in keys.iter().zip(now) {
            let unchanged = match (self.slots.get(key), doc) {
                (Some(s), Some(d)) => !s.dirty && s.state.exists() && s.base == Base::At(d.version),
                _ => false,
            };
            if !unchanged {
                self.drop_slot(key);
            }
        }
    }

    /// The delegation ended: nothing is known absent any more.
    pub(crate) fn released(&mut self) {
        self.assert_settled();
        self.complete.clear();
        self.left.clear();
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

#[path = "overlay_rebase.rs"]
mod rebase;

#[cfg(test)]
#[path = "overlay_tests.rs"]
mod tests;
