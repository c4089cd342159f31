//! Tests only: an embedded store whose next `get` (after reading) or
//! `bulk` (before writing) stops until the test lets it go, so a race is
//! made to happen instead of timed.

use super::embedded::EmbeddedStore;
use super::*;
use parking_lot::Mutex;
use std::sync::mpsc::{Receiver, Sender, channel};

type Gate = (&'static str, Option<String>, Sender<()>, Receiver<()>);

pub(crate) struct Gated {
    pub inner: EmbeddedStore,
    /// Shared with its batches' handles.
    gate: Arc<Mutex<Option<Gate>>>,
}

impl Gated {
    pub(crate) fn open(dir: &std::path::Path) -> Gated {
        Gated {
            inner: EmbeddedStore::open(dir).unwrap(),
            gate: Arc::default(),
        }
    }

    /// Stop the next `op` ("get" or "bulk"; a get of `id` if given):
    /// returns (it stopped, let it go).
    pub(crate) fn arm(&self, op: &'static str, id: Option<&str>) -> (Receiver<()>, Sender<()>) {
        let (reached_tx, reached) = channel();
        let (go, go_rx) = channel();
        *self.gate.lock() = Some((op, id.map(str::to_string), reached_tx, go_rx));
        (reached, go)
    }

    fn stop_if(&self, op: &str, id: Option<&str>) {
        let mut g = self.gate.lock();
        let hit = g
            .as_ref()
            .is_some_and(|(o, want, _, _)| *o == op && (want.is_none() || want.as_deref() == id));
        if hit {
            let (_, _, reached, go) = g.take().unwrap();
            drop(g);
            reached.send(()).unwrap();
            go.recv().unwrap();
        }
    }
}

impl MetaStore for Gated {
    fn capabilities(&self) -> super::Capabilities {
        self.inner.capabilities()
    }

    fn get(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        let r = self.inner.get(index, id);
        self.stop_if("get", Some(id));
        r
    }
    fn mget(&self, index: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>> {
        self.inner.mget(index, ids)
    }
    fn create(&self, index: Idx, id: &str, source: &Value) -> StoreResult<Version> {
        self.inner.create(index, id, source)
    }
    fn put(
        &self,
        index: Idx,
        id: &str,
        source: &Value,
        if_version: Option<Version>,
    ) -> StoreResult<Version> {
        self.inner.put(index, id, source, if_version)
    }
    fn delete(&self, index: Idx, id: &str, if_version: Option<Version>) -> StoreResult<bool> {
        self.inner.delete(index, id, if_version)
    }
    fn bulk(&self, ops: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>> {
        self.stop_if("bulk", None);
        self.inner.bulk(ops)
    }
    fn bulk_atomic(&self, ops: Vec<BulkOp>) -> StoreResult<Option<Vec<BulkItemResult>>> {
        self.inner.bulk_atomic(ops)
    }
    fn search(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>> {
        self.inner.search(req)
    }
    fn search_fields(&self, req: &SearchRequest, fields: &[&str]) -> StoreResult<Vec<Vec<Value>>> {
        self.inner.search_fields(req, fields)
    }
    fn group(&self, req: &GroupRequest) -> StoreResult<Vec<Bucket>> {
        self.inner.group(req)
    }
    fn count(&self, index: Idx, query: &Query) -> StoreResult<u64> {
        self.inner.count(index, query)
    }
    fn refresh(&self, index: Idx) -> StoreResult<()> {
        self.inner.refresh(index)
    }
    fn publish(&self, index: Idx) -> StoreResult<()> {
        self.inner.publish(index)
    }
    fn expose(&self, index: Idx) -> StoreResult<()> {
        self.inner.expose(index)
    }
    fn sync(&self) -> StoreResult<()> {
        self.inner.sync()
    }
    fn describe(&self) -> String {
        "gated".into()
    }
    fn begin_batch(&self) -> Option<Arc<dyn MetaStore>> {
        Some(Arc::new(Gated {
            inner: self.inner.batch_handle()?,
            gate: self.gate.clone(),
        }))
    }
    fn end_batch(&self) -> StoreResult<()> {
        self.inner.end_batch()
    }
}
