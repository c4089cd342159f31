//! The indices: their settings and mappings built from the schema, the
//! mapping format version, index-name rules, and creating or verifying the
//! indices at connect.

use super::EsStore;
use super::client::reason;
use crate::store::schema::{Field, FieldType, Idx};
use crate::store::*;
use elasticsearch::cluster::ClusterHealthParts;
use elasticsearch::indices::{
    IndicesCreateParts, IndicesExistsParts, IndicesGetMappingParts, IndicesPutMappingParts,
};
use serde_json::{Value, json};

/// Version of the index layout; a mount refuses indices with another one.
/// 2: entries gained `contents` (trigram-analysed text), `indexed`, `xattrs`.
pub const MAPPING_FORMAT: u64 = 2;
/// Indices added to the layout since filesystems were first made: a
/// filesystem from before gets them when it is next opened.
const ADDED: [Idx; 1] = [Idx::Texts];
/// keyword terms above this many characters are not indexed (Lucene's term
/// limit is 32766 bytes; 4 bytes per character at most).
pub(super) const IGNORE_ABOVE: u64 = 8191;

/// Index names must be lowercase and free of a few characters.
pub(super) fn check_index_name(name: &str) -> StoreResult<()> {
    let bad = name.is_empty()
        || name.starts_with(['_', '-', '+'])
        || name.chars().any(|c| {
            c.is_uppercase()
                || matches!(
                    c,
                    '\\' | '/' | '*' | '?' | '"' | '<' | '>' | '|' | ' ' | ',' | '#' | ':'
                )
        });
    if bad {
        return Err(StoreError::Invalid(format!(
            "index name {name:?} must be lowercase, without spaces or any of \\/*?\"<>|,#:, and not start with _ - +"
        )));
    }
    Ok(())
}

pub(super) fn field_mapping(f: &Field) -> Value {
    match f.ty {
        FieldType::Keyword => json!({"type": "keyword", "ignore_above": IGNORE_ABOVE}),
        FieldType::KeywordText => json!({
            "type": "keyword", "ignore_above": IGNORE_ABOVE,
            "fields": {"text": {"type": "text"}}
        }),
        FieldType::Path => json!({
            "type": "keyword", "ignore_above": IGNORE_ABOVE,
            "fields": {"tree": {"type": "text", "analyzer": "esfs_path", "search_analyzer": "keyword"}}
        }),
        FieldType::Long => json!({"type": "long"}),
        FieldType::Date => json!({"type": "date", "format": "epoch_millis"}),
        FieldType::Bool => json!({"type": "boolean"}),
        // Substring search: every 3-character window, lowercased. Without
        // positions: esfs asks for every trigram of the text in any order
        // (a `match` with operator and; grep decides the rest), and the
        // positions of every trigram of every file were most of what the
        // engine spent indexing text (6816 source files, 233 MB, on ES
        // 9.5.3: 13.0 -> 8.1 s of the node's CPU). Scores keep the
        // frequencies. A phrase query on `contents` needs an index made
        // before this (docs/search.md).
        FieldType::Text => {
            json!({"type": "text", "analyzer": "esfs_trigram", "index_options": "freqs"})
        }
        FieldType::Keywords => json!({"type": "keyword", "ignore_above": IGNORE_ABOVE}),
    }
}

/// Settings and mappings of one index: only declared fields are indexed
/// (`dynamic: false`); everything else stays in `_source`. One shard: every
/// access path (a realtime get by id, a listing, a `path.tree` subtree, a
/// rename's scan and bulk) then asks one shard copy, and a write is one
/// primary plus its replicas.
pub fn index_body(idx: Idx, replicas: u32) -> Value {
    let mut props = serde_json::Map::new();
    for f in idx.fields() {
        props.insert(f.name.to_string(), field_mapping(f));
    }
    if idx == Idx::Chunks {
        props.insert("data".into(), json!({"type": "binary"}));
    }
    json!({
        "settings": {
            "index": {
                "number_of_shards": 1,
                "number_of_replicas": replicas,
                "refresh_interval": "1s",
                "max_result_window": 10000
            },
            "analysis": {
                "tokenizer": {
                    "esfs_path": {"type": "path_hierarchy", "delimiter": "/"},
                    "esfs_trigram": {"type": "ngram", "min_gram": 3, "max_gram": 3}
                },
                "analyzer": {
                    "esfs_path": {"type": "custom", "tokenizer": "esfs_path"},
                    "esfs_trigram": {"type": "custom", "tokenizer": "esfs_trigram", "filter": ["lowercase"]}
                }
            }
        },
        "mappings": {
            "dynamic": false,
            "_meta": {"esfs_format": MAPPING_FORMAT, "esfs_index": idx.name()},
            "properties": props
        }
    })
}

impl EsStore {
    /// Create missing indices (unless `!create`: then a missing one is
    /// `NotFound`); refuse ones made by an incompatible esfs. The indices are
    /// checked and created at once, one thread each: creating one waits for
    /// its shards to start (1-2 s on a busy node), and a first mount creates five.
    pub(super) fn ensure_indices(&self, create: bool, replicas: Option<u32>) -> StoreResult<()> {
        let decided = std::sync::OnceLock::new();
        let replicas = || match replicas {
            Some(n) => Ok(n),
            None => decided.get_or_init(|| self.default_replicas()).clone(),
        };
        let replicas = &replicas;
        std::thread::scope(|s| {
            let each: Vec<_> = Idx::ALL
                .iter()
                .filter(|idx| create || !ADDED.contains(idx))
                .map(|&idx| s.spawn(move || self.ensure_index(idx, create, replicas)))
                .collect();
            // the first error in index order, so the message does not depend on timing
            each.into_iter()
                .map(|h| h.join().expect("index check panicked"))
                .collect::<StoreResult<Vec<()>>>()
        })?;
        // The filesystem exists: what it lacks of a newer layout is made
        // even by a command that creates nothing (`esfs fsck`, `esfs search`).
        if !create {
            for idx in ADDED {
                self.ensure_index(idx, true, replicas)?;
            }
        }
        Ok(())
    }

    /// One replica when the cluster has a second data node to hold it, else
    /// none (a replica that can never be assigned keeps the index yellow and
    /// makes `wait_for_active_shards=all` wait forever).
    fn default_replicas(&self) -> StoreResult<u32> {
        let (status, resp) = self
            .call(|c| async move { c.cluster().health(ClusterHealthParts::None).send().await })?;
        if status != 200 {
            return Err(StoreError::Other(format!(
                "cluster health: {}",
                reason(&resp)
            )));
        }
        let data_nodes = resp["number_of_data_nodes"].as_u64().unwrap_or(1);
        Ok(u32::from(data_nodes > 1))
    }

    fn ensure_index(
        &self,
        idx: Idx,
        create: bool,
        replicas: &dyn Fn() -> StoreResult<u32>,
    ) -> StoreResult<()> {
        let name = &self.index_name(idx);
        let name = name.as_str();
        let (status, _) = self.call(|c| async move {
            c.indices()
                .exists(IndicesExistsParts::Index(&[name]))
                .send()
                .await
        })?;
        if status == 404 && !create {
            return Err(StoreError::NotFound(format!(
                "no esfs filesystem at {} (no index {name})",
                self.url
            )));
        }
        if status == 404 {
            let body = index_body(idx, replicas()?);
            let body = &body;
            let (status, resp) = self.call(|c| async move {
                c.indices()
                    .create(IndicesCreateParts::Index(name))
                    .body(body.clone())
                    .send()
                    .await
            })?;
            let raced = resp["error"]["type"] == "resource_already_exists_exception";
            if status != 200 && !raced {
                return Err(StoreError::Other(format!(
                    "creating index {name}: {}",
                    reason(&resp)
                )));
            }
            if !raced {
                return Ok(());
            }
        }
        let (status, resp) = self.call(|c| async move {
            c.indices()
                .get_mapping(IndicesGetMappingParts::Index(&[name]))
                .send()
                .await
        })?;
        if status != 200 {
            return Err(StoreError::Other(format!(
                "mapping of {name}: {}",
                reason(&resp)
            )));
        }
        let format = resp[&name]["mappings"]["_meta"]["esfs_format"].as_u64();
        if format != Some(MAPPING_FORMAT) {
            return Err(StoreError::Invalid(format!(
                "index {name} was not created by this esfs (mapping format {}, expected {MAPPING_FORMAT}); \
                 use another --index or delete it",
                format.map_or("none".to_string(), |f| f.to_string())
            )));
        }
        self.add_missing_fields(idx, name, &resp[name]["mappings"]["properties"])
    }

    /// Map the fields declared since the index was made (a mapping only
    /// grows, so mounts of earlier versions go on using it). Its documents
    /// have them once written again; until then a read that needs one reads
    /// the document's source instead (see `query::columns`).
    fn add_missing_fields(&self, idx: Idx, name: &str, props: &Value) -> StoreResult<()> {
        let missing: serde_json::Map<String, Value> = idx
            .fields()
            .iter()
            .filter(|f| props.get(f.name).is_none())
            .map(|f| (f.name.to_string(), field_mapping(f)))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let body = &json!({ "properties": missing });
        let (status, resp) = self.call(|c| async move {
            c.indices()
                .put_mapping(IndicesPutMappingParts::Index(&[name]))
                .body(body.clone())
                .send()
                .await
        })?;
        if status != 200 {
            return Err(StoreError::Other(format!(
                "adding fields {:?} to the mapping of {name}: {}",
                missing.keys().collect::<Vec<_>>(),
                reason(&resp)
            )));
        }
        Ok(())
    }
}
