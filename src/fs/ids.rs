//! The id allocator: inode numbers and readdir cookies, one sequence kept
//! in the store's `meta/ids` document and reserved in batches (one store
//! write per batch, shared safely by every mount of the store).

use super::docs::MAX_RETRIES;
use crate::error::{FsError, FsResult};
use crate::store::{Idx, MetaStore, StoreError};
use parking_lot::Mutex;
use serde_json::json;
use std::sync::Arc;

/// Ids are reserved from the store in batches (one store write per batch).
const ID_BATCH: u64 = 1024;

pub(super) struct Ids {
    store: Arc<dyn MetaStore>,
    /// The reserved range not yet handed out: next, end.
    range: Arc<Mutex<(u64, u64)>>,
}

impl Ids {
    pub(super) fn new(store: Arc<dyn MetaStore>) -> Ids {
        Ids {
            store,
            range: Arc::default(),
        }
    }

    /// This allocator through another caller's handle (one range for all).
    pub(super) fn over(&self, store: Arc<dyn MetaStore>) -> Ids {
        Ids {
            store,
            range: self.range.clone(),
        }
    }

    /// A fresh id (inode numbers and readdir cookies share the sequence).
    pub(super) fn alloc(&self) -> FsResult<u64> {
        let mut ids = self.range.lock();
        if ids.0 >= ids.1 {
            for _ in 0..MAX_RETRIES {
                let doc = self
                    .store
                    .get(Idx::Meta, "ids")?
                    .ok_or_else(|| FsError::Io("id allocator missing".into()))?;
                let next = doc.source["next"].as_u64().unwrap_or(16);
                let end = next + ID_BATCH;
                // `by` makes the document this reservation's alone: when a
                // write is refused as a conflict after its answer was lost,
                // the store tells its own landed write from another's by
                // comparing documents, and two mounts reserving the same
                // range would otherwise write the same one (and both take
                // the range: duplicate inode numbers).
                let mine = json!({ "next": end, "by": rand::random::<u64>() });
                match self.store.put(Idx::Meta, "ids", &mine, Some(doc.version)) {
                    Ok(_) => {
                        *ids = (next, end);
                        break;
                    }
                    Err(StoreError::Conflict(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            if ids.0 >= ids.1 {
                return Err(FsError::Again);
            }
        }
        ids.0 += 1;
        Ok(ids.0 - 1)
    }
}
