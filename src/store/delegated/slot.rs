//! One document as a delegated mount's overlay holds it ([`Slot`]): its
//! state (a decoded document, the same packed as JSON text past the
//! budget, or gone), the version callers were given and the one the
//! cluster holds.

use std::sync::Arc;

use serde_json::Value;

use super::oplog::Base;
use crate::store::Version;

#[derive(Clone, Debug)]
pub(super) enum State {
    Doc(Arc<Value>),
    /// A clean document past the budget, held as its JSON text (a fifth to
    /// a quarter of the heap a `serde_json` map of it takes: every key and
    /// string an allocation, every value 32 bytes, B-tree nodes half
    /// empty), before it leaves whole ([`Overlay::pack`](super::overlay::Overlay::pack)). Reads decode it
    /// (a microsecond or two) and leave it packed; a write unpacks it.
    Packed {
        json: Box<[u8]>,
        /// An entry's `path`, for the path index ([`Overlay::path_of`](super::overlay::Overlay::path_of)).
        path: Option<Box<str>>,
        /// An entry's `cookie`, a listing's sort key: a page of a directory
        /// held in memory sorts all its names, and decoding each for it
        /// made `ls -l` of 50 000 names 2.5x slower ([`Child::number`](super::overlay::Child::number)).
        cookie: Option<i64>,
    },
    Gone,
}

impl State {
    /// The document, decoded if packed (`None`: gone).
    pub(super) fn doc(&self) -> Option<Arc<Value>> {
        match self {
            State::Doc(d) => Some(Arc::clone(d)),
            State::Packed { json, .. } => Some(Arc::new(
                serde_json::from_slice(json).expect("packed from a value"),
            )),
            State::Gone => None,
        }
    }

    /// Whether a document (packed or not).
    pub(super) fn exists(&self) -> bool {
        !matches!(self, State::Gone)
    }
}

#[derive(Debug)]
pub(super) struct Slot {
    pub(super) state: State,
    /// The version this mount's callers were last given.
    pub(super) local: Option<Version>,
    /// What the cluster holds.
    pub(super) base: Base,
    /// Not sent since it changed.
    pub(super) dirty: bool,
    /// Its bytes as the budget counts them ([`slot_weight`](super::overlay::slot_weight); set by
    /// [`Overlay::put`](super::overlay::Overlay::put)).
    pub(super) weight: usize,
    /// Its place in the eviction queue, `0` when it has none: changed
    /// since the cluster acknowledged it, in a flush not yet answered, or
    /// a lock document ([`Overlay::evictable`](super::overlay::Overlay::evictable)).
    pub(super) stamp: u64,
    /// When it was last written or read here ([`Budget::tick`](super::overlay::Budget::tick)).
    pub(super) touched: u32,
    /// Its state leaves out the index's text fields (a file's text, by far
    /// the bulk of a source file's entry), which stay as the cluster holds
    /// them: dropped past the budget before the slot itself, or never read
    /// (a brief read, a directory read whole). It answers brief reads; a
    /// full read asks the cluster for the text ([`Overlay::learn`](super::overlay::Overlay::learn) puts it
    /// back); written again it stays brief, and is sent as a partial update.
    pub(super) brief: bool,
}

impl Slot {
    pub(super) fn new(state: State, local: Option<Version>, base: Base, dirty: bool) -> Slot {
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
    pub(super) fn answers(&self, brief: bool) -> Option<Arc<Value>> {
        self.would_answer(brief).then(|| self.state.doc())?
    }

    /// Whether [`Slot::answers`] gives a document.
    pub(super) fn would_answer(&self, brief: bool) -> bool {
        self.state.exists() && self.local.is_some() && (brief || !self.brief)
    }

    /// A caller's `if_version` matches: the version it was given, or the
    /// cluster's for a document not changed since it was read.
    pub(super) fn matches(&self, v: Version) -> bool {
        self.local == Some(v) || (!self.dirty && self.base == Base::At(v))
    }
}

/// A partial update's `fields` merged into a slot's document (copied only
/// if a reader shares it).
pub(super) fn merge_fields(cur: &mut Arc<Value>, fields: &Value) {
    if let (Some(cur), Some(fields)) = (Arc::make_mut(cur).as_object_mut(), fields.as_object()) {
        for (k, v) in fields {
            cur.insert(k.clone(), v.clone());
        }
    }
}
