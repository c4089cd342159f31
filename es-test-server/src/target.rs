//! The indices a search runs over, each as one snapshot with its mapping
//! (below `sort`, `hits`, `aggs` and `search`, which all read them).

use std::sync::Arc;

use crate::mapping::Mapping;
use crate::store::Snapshot;

/// One index (or PIT member) a search runs over.
pub(crate) struct Target {
    pub name: String,
    pub uuid: String,
    pub snap: Arc<Snapshot>,
    pub mapping: Arc<Mapping>,
    pub max_result_window: usize,
    pub shards: u32,
}
