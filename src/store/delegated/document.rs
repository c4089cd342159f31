//! The tree's delegation document, `deleg/root` in the `locks` index:
//! `{type: "delegation", owner, since, recall}`. The protocol that takes
//! and recalls it is the lock session's (`crate::locks::delegation`); the
//! holder's side, looking for a recall and giving it back, is here.

use crate::store::{Idx, MetaStore, StoreError};

/// The delegation's document id in the `locks` index.
pub(crate) const DOC: &str = "deleg/root";

/// Whether the holder `owner` must give the delegation back: recalled, or
/// the document is no longer its own (broken: this mount was taken for
/// dead). An unanswered look is not a recall.
pub(crate) fn recalled(store: &dyn MetaStore, owner: &str) -> bool {
    match store.get(Idx::Locks, DOC) {
        Ok(Some(d)) => d.source["owner"] != owner || !d.source["recall"].is_null(),
        Ok(None) => true,
        Err(_) => false,
    }
}

/// Delete the delegation document if it is still `owner`'s.
pub(crate) fn give_back(store: &dyn MetaStore, owner: &str) -> crate::store::StoreResult<()> {
    if let Some(d) = store.get(Idx::Locks, DOC)?
        && d.source["owner"] == owner
    {
        match store.delete(Idx::Locks, DOC, Some(d.version)) {
            Ok(_) | Err(StoreError::Conflict(_)) | Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
