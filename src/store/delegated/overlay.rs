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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde_json::Value;

use super::oplog::{Base, Encoded, Record, write_op};
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
}

impl Slot {
    /// A caller's `if_version` matches: the version it was given, or the
    /// cluster's for a document not changed since it was read.
    fn matches(&self, v: Version) -> bool {
        self.local == Some(v) || (!self.dirty && self.base == Base::At(v))
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
    /// Documents kept from reads.
    learned: usize,
    /// Every lock document this mount does not hold a slot for is absent
    /// ([`Overlay::know_locks`]).
    locks_whole: bool,
    /// Bytes logged since the last flush began.
    dirty_bytes: usize,
    /// When a write was last decided here.
    last_write: Option<std::time::Instant>,
    /// Small file contents kept after the cluster acknowledged them, with
    /// their sizes ([`KEEP_CHUNK_MAX`], [`KEPT_CHUNK_BYTES`]).
    kept_chunks: HashMap<Key, usize>,
    kept_chunk_bytes: usize,
}

/// How many documents read from the cluster the overlay keeps.
const MAX_LEARNED: usize = 100_000;
/// Past this many waiting documents, or bytes of them, a writer flushes
/// before going on: memory stays bounded while the cluster is slower than
/// the writers (file contents kept in the cluster are documents too).
const MAX_DIRTY: usize = 4096;
const MAX_DIRTY_BYTES: usize = 32 << 20;
/// File contents are dropped once the cluster holds them, but a small
/// file's (a chunk of at most this many bytes) is kept, within
/// [`KEPT_CHUNK_BYTES`] in all: a lookup of a small file asks for its inode
/// and its bytes in one read (the open and read that usually follow then
/// cost nothing), and with the bytes gone that read went to the cluster
/// for every `stat` of a file this mount wrote (`du`, mdtest's stat phase).
const KEEP_CHUNK_MAX: usize = 16 << 10;
const KEPT_CHUNK_BYTES: usize = 64 << 20;

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

    /// Set a slot, keeping the path index in step.
    fn put(&mut self, key: Key, slot: Slot) {
        self.unkeep(&key);
        if let Some((path, id)) = Self::path_of(&key, &slot) {
            self.paths.insert((path.to_string(), id.to_string()));
        }
        if let Some(old) = self.slots.insert(key.clone(), slot) {
            let same = Self::path_of(&key, &old) == Self::path_of(&key, &self.slots[&key]);
            if !same {
                self.unindex(&key, &old);
            }
        }
    }

    /// Drop a slot, keeping the path index in step.
    fn drop_slot(&mut self, key: &Key) -> Option<Slot> {
        self.unkeep(key);
        let old = self.slots.remove(key)?;
        self.unindex(key, &old);
        Some(old)
    }

    /// A chunk acknowledged by the cluster: kept if small and within the
    /// budget (see [`KEEP_CHUNK_MAX`]), else dropped (reads go there).
    fn keep_or_drop_chunk(&mut self, key: &Key) {
        self.unkeep(key);
        let len = match self.slots.get(key).map(|s| &s.state) {
            Some(State::Doc(d)) => d["len"].as_u64().map(|l| l as usize),
            _ => None,
        };
        match len {
            Some(len)
                if len <= KEEP_CHUNK_MAX && self.kept_chunk_bytes + len <= KEPT_CHUNK_BYTES =>
            {
                self.kept_chunks.insert(key.clone(), len);
                self.kept_chunk_bytes += len;
            }
            _ => {
                self.drop_slot(key);
            }
        }
    }

    /// Stop counting a kept chunk (rewritten or dropped).
    fn unkeep(&mut self, key: &Key) {
        if let Some(len) = self.kept_chunks.remove(key) {
            self.kept_chunk_bytes -= len;
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

    /// Whether a document absent from the slots is known absent: an entry
    /// of a directory made under the delegation, or a new inode (its number
    /// comes fresh from the id allocator's range this mount reserved).
    fn known_absent(&self, index: Idx, id: &str) -> bool {
        match index {
            Idx::Inodes => true,
            Idx::Entries => id
                .split_once('/')
                .and_then(|(p, _)| p.parse::<u64>().ok())
                .is_some_and(|p| self.complete.contains(&p)),
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
                Some(Encoded::change(key.0, &key.1, state, slot.base))
            })
            .collect()
    }

    /// The lock documents in the cluster when the delegation was taken:
    /// from then on only this mount writes them, so the rest are absent.
    pub(crate) fn know_locks(&mut self, docs: Vec<Doc>) {
        let keys = docs.iter().map(|d| (Idx::Locks, d.id.clone())).collect();
        self.learn(keys, docs.into_iter().map(Some).collect());
        self.locks_whole = true;
    }

    /// The entries of directory `parent` that have `terms` (field, value),
    /// when every name in it is known here (a directory made under the
    /// delegation).
    pub(crate) fn children(&self, parent: u64, terms: &[(&str, &Value)]) -> Option<Vec<Doc>> {
        if !self.complete.contains(&parent) {
            return None;
        }
        let from = (Idx::Entries, format!("{parent}/"));
        let to = (Idx::Entries, format!("{parent}0")); // '0' follows '/'
        let docs = self
            .slots
            .range(from..to)
            .filter_map(|((_, id), s)| match (&s.state, s.local) {
                (State::Doc(d), Some(v)) if terms.iter().all(|(f, val)| &&d[*f] == val) => {
                    Some(Doc {
                        id: id.clone(),
                        version: v,
                        source: d.clone(),
                    })
                }
                _ => None,
            })
            .collect();
        Some(docs)
    }

    /// The overlay's answer for a read: `Some(None)` absent, `Some(doc)`,
    /// or `None`: ask the cluster.
    pub(crate) fn get(&self, index: Idx, id: &str) -> Option<Option<Doc>> {
        match self.slots.get(&(index, id.to_string())) {
            Some(Slot {
                state: State::Doc(s),
                local: Some(v),
                ..
            }) => Some(Some(Doc {
                id: id.to_string(),
                version: *v,
                source: s.clone(),
            })),
            Some(Slot {
                state: State::Gone, ..
            }) => Some(None),
            Some(_) => None,
            // (An inode not written here exists or not: only names in
            // directories made here, and lock documents, are known absent
            // to a read.)
            None if index != Idx::Inodes && self.known_absent(index, id) => Some(None),
            None => None,
        }
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
            if needed
                && !self.slots.contains_key(&key)
                && !self.known_absent(index, id)
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

    /// Documents read from the cluster for a read (kept unless a write made
    /// a slot meanwhile): while the delegation holds they stay true, so a write
    /// deciding on them needs no second read. Past [`MAX_LEARNED`] reads
    /// are no longer kept (the document cache above keeps the hot ones).
    pub(crate) fn remember(&mut self, keys: Vec<Key>, docs: Vec<Option<Doc>>) {
        if self.learned >= MAX_LEARNED {
            return;
        }
        self.learned += keys.len();
        let (keys, docs) = keys
            .into_iter()
            .zip(docs)
            .filter(|((i, id), _)| kept(*i, id))
            .unzip();
        self.learn(keys, docs);
    }

    /// Documents read to decide a write ([`Overlay::needs`]): always kept.
    pub(crate) fn learn(&mut self, keys: Vec<Key>, docs: Vec<Option<Doc>>) {
        for (key, doc) in keys.into_iter().zip(docs) {
            if self.slots.contains_key(&key) {
                continue;
            }
            let slot = match doc {
                Some(d) => Slot {
                    state: State::Doc(d.source),
                    local: Some(d.version),
                    base: Base::At(d.version),
                    dirty: false,
                },
                None => Slot {
                    state: State::Gone,
                    local: None,
                    base: Base::Absent,
                    dirty: false,
                },
            };
            self.put(key, slot);
        }
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
                records.push(Record::change(key.0, &key.1, state, slot.base));
            }
            results.push(r);
        }
        (results, records)
    }

    fn apply_one(&mut self, key: &Key, op: BulkOp) -> BulkItemResult {
        let conflict = || Err(StoreError::Conflict(key.1.clone()));
        let known_absent = self.known_absent(key.0, &key.1);
        let slot = self.slots.get(key);
        let was_dirty = slot.is_some_and(|s| s.dirty);
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
                state,
                local: Some(v),
                base,
                dirty: true,
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
        for key in std::mem::take(&mut self.dirty) {
            let Some(slot) = self.slots.get_mut(&key) else {
                continue;
            };
            slot.dirty = false;
            let state = match &slot.state {
                State::Doc(s) => Some(s),
                State::Gone => None,
            };
            // Made and removed between two flushes: nothing to send.
            let Some(op) = write_op(key.0, &key.1, state, slot.base) else {
                continue;
            };
            out.ops.push(op);
            out.keys.push((key, slot.local));
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
                    self.drop_slot(key);
                    lost.push((key.clone(), e));
                }
                continue;
            };
            acks.push(Record {
                index: key.0,
                id: key.1.clone(),
                state: None,
                base,
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
            }
        }
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
        let slots = &self.slots;
        self.kept_chunks.retain(|k, _| slots.contains_key(k));
        self.kept_chunk_bytes = self.kept_chunks.values().sum();
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
        o.learn(keys, vec![None]);
        let (r, recs) = o.apply(ops);
        assert!(r.iter().all(|r| r.is_ok()));
        assert_eq!(recs.len(), 2);
        // Inside the new directory nothing needs a read, and a name taken
        // twice conflicts.
        let inside = vec![create(Idx::Entries, "20/f", json!({"ino": 21}))];
        assert!(matches!(o.needs(&inside), Need::Nothing));
        assert!(o.apply(inside.clone()).0[0].is_ok());
        assert!(matches!(o.apply(inside).0[0], Err(StoreError::Conflict(_))));
        assert_eq!(o.get(Idx::Entries, "20/nothing"), Some(None));
        // A conditional write needs the version handed out.
        let v = o.get(Idx::Entries, "20/f").unwrap().unwrap().version;
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
        let at = |o: &Overlay, id: &str| o.get(Idx::Entries, id).unwrap().unwrap();
        // Not moved yet: nothing is at the new path.
        assert_eq!(o.rebase("/d", "/e"), None);
        // The rename's entry step, then its paths.
        let v = at(&o, "1/d").version;
        let moved = o.apply(vec![
            BulkOp::Delete {
                index: Idx::Entries,
                id: "1/d".into(),
                if_version: Some(v),
            },
            create(Idx::Entries, "1/e", entry("/e", "/", "dir", 20)),
        ]);
        assert!(moved.0.iter().all(|r| r.is_ok()));
        let before = at(&o, "20/b").version;
        let flushed = o.outgoing();
        assert!(o.clean());
        let keys = o.rebase("/d", "/e").unwrap();
        assert_eq!(ids(Some(keys.clone())).unwrap(), vec!["20/a", "20/b"]);
        let b = at(&o, "20/b");
        assert_eq!(b.source, entry("/e/b", "/e", "file", 22));
        assert!(b.version.seq_no > before.seq_no, "a new local version");
        assert_eq!(at(&o, "1/d-x").source["path"], "/d-x", "beside: untouched");
        // Logged as their new states, and sent by the next flush.
        let changes = serde_json::to_value(o.changes(&keys)).unwrap();
        assert_eq!(changes[1]["s"]["path"], "/e/b");
        drop(flushed);
        assert_eq!(o.outgoing().ops.len(), 2);
        assert_eq!(ids(o.rebase("/d", "/e")), Some(vec![]), "none left");
        // A removal leaves the index; a directory below not made here
        // (its names unknown) keeps the rebase out of memory.
        let v = at(&o, "20/b").version;
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
        assert!(matches!(o.get(Idx::Chunks, "21:0"), Some(Some(_))));
        assert_eq!(o.get(Idx::Chunks, "22:0"), None);
        assert_eq!(o.kept_chunk_bytes, 1);
        // Rewritten or deleted, it is no longer counted as kept.
        let del = BulkOp::Delete {
            index: Idx::Chunks,
            id: "21:0".into(),
            if_version: None,
        };
        assert!(o.apply(vec![del]).0[0].is_ok());
        assert_eq!(o.kept_chunk_bytes, 0);
        assert_eq!(o.get(Idx::Chunks, "21:0"), Some(None));
    }
}
