//! The Elasticsearch backend: [`MetaStore`] over the official `elasticsearch`
//! crate. One index per logical index (`<name>-entries`, `<name>-inodes`, ...),
//! created on first mount with explicit mappings built from `schema`.
//!
//! How it respects Elasticsearch's behaviour:
//! - lookups are realtime GET/mget; only listings and subtree queries search.
//! - search is near-real-time, so this client remembers what it wrote
//!   since an index's last refresh (for `entries`, in which directories:
//!   [`unrefreshed`]) and refreshes before a search that could match it: a
//!   mount reads its own writes immediately, and other mounts' writes
//!   become visible within `refresh_interval` (1 s); each index is also
//!   refreshed before this client's first search of it, so a fresh mount
//!   sees everything written before it started. Nothing else refreshes when
//!   nothing was written.
//! - bulk answers 200 with per-item results: every item is checked, and items
//!   rejected with 429 are retried.
//! - 429/502/503/504 and transport failures are retried with jittered
//!   exponential backoff for at most `retry_budget`, then reported as
//!   `Unavailable` (ETIMEDOUT above), so a lost server never hangs a syscall.
//! - 409 `version_conflict_engine_exception` is `Conflict`; a GET miss is a
//!   404 `{"found": false}`, not an error.
//! - long iterations use a point in time with `search_after`, so a 100k-entry
//!   subtree is read completely and consistently past the 10k window.
//!
//! Elasticsearch 8/9 and OpenSearch 2/3 both serve it; the distribution is
//! read from `GET /` at connect, and this module alone knows the difference
//! ([`Engine`]): the point-in-time endpoints (`_pit` / `_search/point_in_time`)
//! and their id field, and the implicit `_shard_doc` tiebreaker that only
//! Elasticsearch adds to point-in-time searches (so every scan sorts by
//! `_doc` last itself: unique, the indices having one shard).
//!
//! Layout: this file holds the configuration, the connection and the
//! [`MetaStore`] implementation; `client` the requests and their retries and
//! errors, `refusal` the failures a user must fix (credentials, privileges,
//! TLS trust, http/https mixed up) in words, `engine` the
//! Elasticsearch/OpenSearch differences, `query` the query DSL and searches,
//! `mapping` the indices' mappings.

mod client;
mod engine;
mod mapping;
mod pool;
mod query;
mod refusal;
mod unrefreshed;

pub use client::redact;
pub use mapping::{MAPPING_FORMAT, index_body};
pub use query::query_json;

use super::schema::Idx;
use super::*;
use client::{Failure, doc_of, error_of, jitter, reason, retryable, version_of};
use elasticsearch::auth::Credentials;
use elasticsearch::cert::{Certificate, CertificateValidation};
use elasticsearch::http::Url;
use elasticsearch::http::headers::{HeaderName, HeaderValue};
use elasticsearch::http::transport::TransportBuilder;
use elasticsearch::indices::IndicesRefreshParts;
use elasticsearch::*;
use engine::Engine;
use mapping::check_index_name;
use query::{sort_json, text_fields};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unrefreshed::Unrefreshed;

/// Bulk requests are cut at about this many bytes.
const BULK_BYTES: usize = 8 << 20;

#[derive(Clone, Debug)]
pub struct EsConfig {
    pub url: String,
    /// Prefix of the index names.
    pub index: String,
    pub user: Option<String>,
    pub password: Option<String>,
    pub api_key: Option<String>,
    /// PEM file of a CA to trust (self-signed clusters).
    pub ca: Option<std::path::PathBuf>,
    /// Timeout of one request.
    pub timeout: Duration,
    /// How long one operation may keep retrying before it fails.
    pub retry_budget: Duration,
    /// Replicas of the indices this store creates (None: one when the
    /// cluster has two or more data nodes, else none).
    pub replicas: Option<u32>,
}

impl EsConfig {
    pub fn new(url: &str, index: &str) -> EsConfig {
        EsConfig {
            url: url.to_string(),
            index: index.to_string(),
            user: None,
            password: None,
            api_key: None,
            ca: None,
            timeout: Duration::from_secs(10),
            retry_budget: Duration::from_secs(15),
            replicas: None,
        }
    }
}

/// A handle on one Elasticsearch connection, naming its requests for one
/// [`Caller`] (`X-Opaque-Id`) and reading as that caller reads
/// ([`Caller::reads_only_old_documents`]). [`MetaStore::as_caller`] makes
/// another handle on the same connection; what the handles share (nodes,
/// runtime, read-your-writes state) is [`EsShared`].
pub struct EsStore {
    conn: Arc<EsShared>,
    caller: Caller,
}

impl std::ops::Deref for EsStore {
    type Target = EsShared;
    fn deref(&self) -> &EsShared {
        &self.conn
    }
}

/// What every handle of one Elasticsearch store shares.
pub struct EsShared {
    /// One per [`Caller`], in `Caller::ALL` order.
    clients: Vec<Elasticsearch>,
    rt: tokio::runtime::Runtime,
    prefix: String,
    /// The URLs without credentials, for messages.
    url: String,
    /// Each URL as given, whose credentials must never reach a message,
    /// with what a message shows instead.
    raw_urls: Vec<(String, String)>,
    /// The nodes requests go to (shared by the clients).
    pool: pool::NodePool,
    retry_budget: Duration,
    /// Per index: the writes this client's searches may not see: its own
    /// since its last refresh (by directory, for `entries`), and at first
    /// those made before it connected (a mount's first listing after
    /// another mount, or its own killed previous life, wrote must not miss
    /// them).
    unrefreshed: [parking_lot::Mutex<Unrefreshed>; Idx::ALL.len()],
    /// Held around a read-your-writes refresh: a search that finds the
    /// index just marked clean by another thread's refresh waits for that
    /// refresh to finish instead of searching before it.
    refreshing: [parking_lot::Mutex<()>; Idx::ALL.len()],
    /// The server's version string, as reported at connect time.
    pub server_version: String,
    engine: Engine,
    /// What refusals name.
    who: refusal::Who,
}

impl EsStore {
    /// Connect, check the server, and create or verify the indices. Fails
    /// within about `timeout` with one line naming the URL and the cause.
    pub fn connect(cfg: &EsConfig) -> StoreResult<EsStore> {
        Self::open(cfg, true)
    }

    /// Connect to an existing filesystem, creating nothing: for commands
    /// that only read (fsck, locks, search). A missing index is
    /// `NotFound("no esfs filesystem at URL ...")`.
    pub fn connect_existing(cfg: &EsConfig) -> StoreResult<EsStore> {
        Self::open(cfg, false)
    }

    fn open(cfg: &EsConfig, create: bool) -> StoreResult<EsStore> {
        check_index_name(&cfg.index)?;
        let given = pool::split_urls(&cfg.url);
        let shown = given
            .iter()
            .map(|u| redact(u))
            .collect::<Vec<_>>()
            .join(",");
        let urls = given
            .iter()
            .map(|u| {
                Url::parse(u).map_err(|e| {
                    StoreError::Invalid(format!("bad Elasticsearch URL {:?}: {e}", redact(u)))
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        let Some(url) = urls.first() else {
            return Err(StoreError::Invalid("no Elasticsearch URL given".into()));
        };
        let nodes = pool::NodePool::new(&urls);
        let pem = match &cfg.ca {
            Some(ca) => Some(
                std::fs::read(ca)
                    .map_err(|e| StoreError::Invalid(format!("CA file {}: {e}", ca.display())))?,
            ),
            None => None,
        };
        let url_user = Some(url.username()).filter(|u| !u.is_empty());
        let who = refusal::Who {
            url: shown.clone(),
            // An API key wins over a user.
            user: (cfg.api_key.is_none())
                .then(|| cfg.user.as_deref().or(url_user).map(str::to_string))
                .flatten(),
            api_key: cfg.api_key.is_some(),
            ca: cfg.ca.clone(),
            prefix: cfg.index.clone(),
        };
        // One client per caller, each naming it in X-Opaque-Id (a client is
        // a connection pool; idle ones cost nothing).
        let client = |caller: Caller| -> StoreResult<Elasticsearch> {
            let mut tb = TransportBuilder::new(nodes.clone())
                .disable_proxy()
                .timeout(cfg.timeout)
                .header(
                    HeaderName::from_static("x-opaque-id"),
                    HeaderValue::from_static(caller.opaque_id()),
                );
            if let Some(key) = &cfg.api_key {
                tb = tb.auth(Credentials::EncodedApiKey(key.clone()));
            } else if let Some(user) = &who.user {
                let pass = cfg.password.as_deref().or(url.password()).unwrap_or("");
                tb = tb.auth(Credentials::Basic(user.clone(), pass.to_string()));
            }
            if let (Some(pem), Some(ca)) = (&pem, &cfg.ca) {
                let cert = Certificate::from_pem(pem)
                    .map_err(|e| StoreError::Invalid(format!("CA file {}: {e}", ca.display())))?;
                tb = tb.cert_validation(CertificateValidation::Full(cert));
            }
            let transport = tb.build().map_err(|e| {
                StoreError::Invalid(format!("Elasticsearch client for {shown}: {e}"))
            })?;
            Ok(Elasticsearch::new(transport))
        };
        let clients = Caller::ALL
            .iter()
            .map(|c| client(*c))
            .collect::<StoreResult<Vec<_>>>()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("esfs-es")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Other(format!("tokio runtime: {e}")))?;
        let conn = EsShared {
            clients,
            rt,
            prefix: cfg.index.clone(),
            url: shown.clone(),
            raw_urls: given
                .iter()
                .map(|u| (u.trim_end_matches('/').to_string(), redact(u)))
                .collect(),
            pool: nodes,
            retry_budget: cfg.retry_budget,
            unrefreshed: std::array::from_fn(|_| parking_lot::Mutex::new(Unrefreshed::All)),
            refreshing: std::array::from_fn(|_| parking_lot::Mutex::new(())),
            server_version: String::new(),
            engine: Engine::Elasticsearch,
            who,
        };
        let mut store = EsStore {
            conn: Arc::new(conn),
            caller: Caller::Fs,
        };
        // At connect time fail fast: one attempt per node (a node that
        // fails is skipped by the next), no retry budget.
        let mut info = Err(Failure::Unreachable(String::new()));
        for _ in 0..urls.len() {
            info = store.once(|c| async move { c.info().send().await });
            if !matches!(info, Err(Failure::Unreachable(_))) {
                break;
            }
        }
        let info = info.map_err(|e| match e {
            Failure::Refused(m) => StoreError::Refused(m),
            Failure::Unreachable(e) => {
                StoreError::Unavailable(format!("cannot reach Elasticsearch at {shown}: {e}"))
            }
        })?;
        if info.0 != 200 {
            return Err(StoreError::Unavailable(format!(
                "Elasticsearch at {shown} answered HTTP {}: {}",
                info.0,
                reason(&info.1)
            )));
        }
        let conn = Arc::get_mut(&mut store.conn).expect("not shared yet");
        (conn.engine, conn.server_version) = Engine::of(&info.1, &shown)?;
        store.ensure_indices(create, cfg.replicas)?;
        Ok(store)
    }

    pub fn index_name(&self, idx: Idx) -> String {
        format!("{}-{}", self.prefix, idx.name())
    }

    /// [`MetaStore::bulk`]'s requests: cut to a bounded size, items the
    /// cluster rejected as overloaded sent again with backoff.
    fn bulk_requests(&self, ops: &[BulkOp]) -> StoreResult<Vec<BulkItemResult>> {
        let mut results: Vec<Option<BulkItemResult>> = vec![None; ops.len()];
        let mut pending: Vec<usize> = (0..ops.len()).collect();
        let start = Instant::now();
        let mut delay = Duration::from_millis(50);
        let mut conflicted = Vec::new();
        while !pending.is_empty() {
            let mut retry = Vec::new();
            // Cut into requests of bounded size.
            let mut i = 0;
            while i < pending.len() {
                let mut lines = Vec::new();
                let mut bytes = 0;
                let mut batch = Vec::new();
                while i < pending.len() && (batch.is_empty() || bytes < BULK_BYTES) {
                    let op = &ops[pending[i]];
                    let before = lines.len();
                    bulk_lines(op, &self.index_name(op.index()), &mut lines);
                    bytes += lines[before..].iter().map(|l| l.len() + 1).sum::<usize>();
                    batch.push(pending[i]);
                    i += 1;
                }
                let lines = &lines;
                let (status, mut resp, ambiguous) = self.call_tracked(|c| async move {
                    c.bulk(BulkParts::None).body(lines.clone()).send().await
                })?;
                if status != 200 {
                    return Err(error_of(status, &resp, "_bulk"));
                }
                // Taken, not copied: a rename's page answers 5000 items.
                let items = match resp.get_mut("items").map(Value::take) {
                    Some(Value::Array(items)) => items,
                    _ => Vec::new(),
                };
                if items.len() != batch.len() {
                    return Err(StoreError::Other(format!(
                        "bulk answered {} items for {} actions",
                        items.len(),
                        batch.len()
                    )));
                }
                for (&k, item) in batch.iter().zip(items) {
                    // Each item is {"<action>": {...}}.
                    let r = match item {
                        Value::Object(o) => o.into_iter().next().map(|(_, r)| r),
                        _ => None,
                    }
                    .unwrap_or_default();
                    let status = r["status"].as_u64().unwrap_or(500) as u16;
                    let id = ops[k].id();
                    results[k] = Some(match status {
                        200 | 201 => version_of(&r).ok_or_else(|| StoreError::Other(r.to_string())),
                        // An update of a missing document (document_missing_exception).
                        404 if matches!(ops[k], BulkOp::Update { .. }) => {
                            Err(StoreError::NotFound(id.to_string()))
                        }
                        404 if r["result"] == "not_found" => match &ops[k] {
                            BulkOp::Delete {
                                if_version: None, ..
                            } => Err(StoreError::NotFound(id.to_string())),
                            _ => Err(StoreError::Conflict(id.to_string())),
                        },
                        s if retryable(s) => {
                            retry.push(k);
                            continue;
                        }
                        409 if ambiguous || own_write_checkable(&ops[k]) => {
                            conflicted.push(k);
                            Err(error_of(409, &r, id))
                        }
                        s => Err(error_of(s, &r, id)),
                    });
                }
            }
            self.own_conflicts(ops, &conflicted, &mut results);
            conflicted.clear();
            if !retry.is_empty() {
                if start.elapsed() + delay > self.retry_budget {
                    for k in retry {
                        results[k] = Some(Err(StoreError::Unavailable(format!(
                            "Elasticsearch at {} kept rejecting bulk items",
                            self.url
                        ))));
                    }
                    break;
                }
                std::thread::sleep(jitter(delay));
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            pending = retry_pending(&results);
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every item answered"))
            .collect())
    }

    /// The bulk items answered 409 (`conflicted`, indices into `ops`) that
    /// were this very write: their documents, read in real time in one
    /// `_mget`, hold what they sent, and their results become the versions
    /// found. Two retries make such conflicts: this client's, of a request
    /// whose answer was lost on the way ([`EsStore::call_tracked`]: every
    /// item but a delete is checked), and the cluster's own: Elasticsearch
    /// resends a shard's bulk to the replica it promotes when a primary
    /// dies after replicating it, and the new primary refuses the
    /// conditional writes it has just applied (since 6.x it no longer
    /// special-cases that conflict: elastic/elasticsearch #38901), which
    /// the client cannot tell from another writer's: the items of
    /// [`own_write_checkable`] are checked on every conflict. Taken for
    /// another writer's, a directory's link count went up twice (the touch
    /// redone on a fresh read), seen as fsck's "nlink 6, should be 5" after
    /// a node was killed under two mounts. A request per bulk that met such
    /// a conflict, none otherwise.
    fn own_conflicts(
        &self,
        ops: &[BulkOp],
        conflicted: &[usize],
        results: &mut [Option<BulkItemResult>],
    ) {
        let sent = |k: usize| match &ops[k] {
            BulkOp::Create { index, id, source }
            | BulkOp::Index {
                index, id, source, ..
            } => Some((*index, id, source, false)),
            BulkOp::Update { index, id, doc, .. } => Some((*index, id, doc, true)),
            BulkOp::Delete { .. } => None,
        };
        let checked: Vec<(usize, _)> = conflicted
            .iter()
            .filter_map(|&k| Some((k, sent(k)?)))
            .collect();
        let keys: Vec<(Idx, String)> = checked
            .iter()
            .map(|(_, (index, id, ..))| (*index, id.to_string()))
            .collect();
        let Ok(docs) = self.mget_docs(&keys, false) else {
            return; // the conflicts stand: the callers read again anyway
        };
        for ((k, (_, id, source, fields)), doc) in checked.into_iter().zip(docs) {
            if let Some(v) = doc.and_then(|d| holds(&d, source, fields)) {
                log::warn!("{id}: a write answered as a conflict had landed (a retry of it)");
                results[k] = Some(Ok(v));
            }
        }
    }

    /// A refresh covering every write this client made before it (the
    /// caller holds `refreshing`): the index is clean for read-your-writes
    /// until the next write (a write racing the refresh marks it again).
    fn refresh_now(&self, index: Idx) -> StoreResult<()> {
        *self.unrefreshed[index as usize].lock() = Unrefreshed::Clean;
        let name = &self.index_name(index);
        let name = name.as_str();
        let r = self.call(|c| async move {
            c.indices()
                .refresh(IndicesRefreshParts::Index(&[name]))
                .send()
                .await
        });
        match r {
            Ok((200, _)) => Ok(()),
            Ok((status, resp)) => {
                self.refresh_failed(index);
                Err(error_of(status, &resp, "_refresh"))
            }
            Err(e) => {
                self.refresh_failed(index);
                Err(e)
            }
        }
    }

    /// Whether a write refused as a conflict had in fact landed (a retry of
    /// it, by this client or the cluster: [`EsStore::own_conflicts`]): the
    /// document, read in real time, holds what the write sent (`fields`:
    /// only those top-level fields, for a partial update). Then its version
    /// is the write's answer. A node dying mid-request made `cp` see EEXIST
    /// for a file its own first attempt had just created.
    fn landed(&self, index: Idx, id: &str, sent: &Value, fields: bool) -> Option<Version> {
        let doc = self
            .mget_docs(&[(index, id.to_string())], false)
            .ok()?
            .pop()??;
        let landed = holds(&doc, sent, fields);
        if landed.is_some() {
            log::warn!("{id}: a retried write had landed before its answer was lost");
        }
        landed
    }

    /// Document `id` of `idx` was written, or may have been (a bulk whose
    /// answer was an error): called once the write's answer is in, so a
    /// refresh between cannot miss it.
    fn wrote(&self, idx: Idx, id: &str) {
        self.unrefreshed[idx as usize].lock().wrote(idx, id);
    }

    /// Document `id` of `idx` was deleted (acknowledged).
    fn deleted(&self, idx: Idx, id: &str) {
        self.unrefreshed[idx as usize].lock().deleted(idx, id);
    }

    /// What the refresh cleared may not be visible after all.
    fn refresh_failed(&self, idx: Idx) {
        *self.unrefreshed[idx as usize].lock() = Unrefreshed::All;
    }

    /// Read-your-writes for a search of `idx` for `query`: refresh first
    /// when this client wrote what it may match since the last refresh
    /// (unless the caller reads only old documents).
    fn refresh_if_dirty(&self, idx: Idx, query: &Query) -> StoreResult<()> {
        if self.caller.reads_only_old_documents() {
            return Ok(());
        }
        let _r = self.refreshing[idx as usize].lock();
        if self.unrefreshed[idx as usize].lock().hides_from(query) {
            self.refresh_now(idx)?;
        }
        Ok(())
    }

    fn get_impl(&self, index: Idx, id: &str, brief: bool) -> StoreResult<Option<Doc>> {
        let name = &self.index_name(index);
        let name = name.as_str();
        let excludes = if brief { text_fields(index) } else { vec![] };
        let excludes = &excludes;
        let (status, mut body) = self.call(|c| async move {
            let mut req = c.get(GetParts::IndexId(name, id));
            if !excludes.is_empty() {
                req = req._source_excludes(excludes);
            }
            req.send().await
        })?;
        match status {
            200 => Ok(Some(doc_of(&mut body)?)),
            404 if body["found"] == false => Ok(None),
            _ => Err(error_of(status, &body, id)),
        }
    }

    fn mget_impl(&self, index: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let name = &self.index_name(index);
        self.mget_body(Some(name), &json!({ "ids": ids }), ids.len())
    }

    /// `_mget` of `body` (on `index`, or naming an index per document).
    fn mget_body(
        &self,
        index: Option<&str>,
        body: &Value,
        n: usize,
    ) -> StoreResult<Vec<Option<Doc>>> {
        let (status, mut resp) = self.call(|c| async move {
            let parts = match index {
                Some(name) => MgetParts::Index(name),
                None => MgetParts::None,
            };
            c.mget(parts).body(body.clone()).send().await
        })?;
        if status != 200 {
            return Err(error_of(status, &resp, "_mget"));
        }
        let docs = match resp["docs"].take() {
            Value::Array(docs) => docs,
            _ => Vec::new(),
        };
        if docs.len() != n {
            return Err(StoreError::Other(format!(
                "mget answered {} docs for {n} ids",
                docs.len(),
            )));
        }
        docs.into_iter()
            .map(|mut d| {
                if d["found"] == true {
                    doc_of(&mut d).map(Some)
                } else if d.get("error").is_some() {
                    Err(StoreError::Other(reason(&d)))
                } else {
                    Ok(None)
                }
            })
            .collect()
    }
}

/// One NDJSON action line (+ source) of a bulk request.
fn bulk_lines(op: &BulkOp, index: &str, out: &mut Vec<String>) {
    let meta = |id: &str, v: Option<Version>| {
        let mut m = json!({"_index": index, "_id": id});
        if let Some(v) = v {
            m["if_seq_no"] = json!(v.seq_no);
            m["if_primary_term"] = json!(v.primary_term);
        }
        m
    };
    match op {
        BulkOp::Create { id, source, .. } => {
            out.push(json!({"create": meta(id, None)}).to_string());
            out.push(source.to_string());
        }
        BulkOp::Index {
            id,
            source,
            if_version,
            ..
        } => {
            out.push(json!({"index": meta(id, *if_version)}).to_string());
            out.push(source.to_string());
        }
        BulkOp::Update {
            id,
            doc,
            if_version,
            ..
        } => {
            out.push(json!({"update": meta(id, *if_version)}).to_string());
            out.push(json!({ "doc": doc }).to_string());
        }
        BulkOp::Delete { id, if_version, .. } => {
            out.push(json!({"delete": meta(id, *if_version)}).to_string());
        }
    }
}

impl MetaStore for EsStore {
    /// Other mounts write the same indices; every write is its own request
    /// (or bulk item) and searches are near-real-time.
    fn capabilities(&self) -> crate::store::Capabilities {
        crate::store::Capabilities::default()
    }

    fn as_caller(&self, caller: Caller) -> Option<Arc<dyn MetaStore>> {
        Some(Arc::new(EsStore {
            conn: self.conn.clone(),
            caller,
        }))
    }

    fn get(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        self.get_impl(index, id, false)
    }

    fn get_brief(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        self.get_impl(index, id, true)
    }

    fn search_brief(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>> {
        self.search_impl(req, true, None)
    }

    fn search_fields(&self, req: &SearchRequest, fields: &[&str]) -> StoreResult<Vec<Vec<Value>>> {
        Ok(super::field_values(
            self.search_impl(req, true, Some(fields))?,
            fields,
        ))
    }

    fn group(&self, req: &GroupRequest) -> StoreResult<Vec<Bucket>> {
        self.group_impl(req)
    }

    fn mget(&self, index: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>> {
        self.mget_impl(index, ids)
    }

    fn mget_docs(&self, keys: &[(Idx, String)], brief: bool) -> StoreResult<Vec<Option<Doc>>> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let docs: Vec<Value> = keys
            .iter()
            .map(|(idx, id)| {
                let mut d = json!({"_index": self.index_name(*idx), "_id": id});
                if brief && idx.has_text() {
                    d["_source"] = json!({"excludes": text_fields(*idx)});
                }
                d
            })
            .collect();
        self.mget_body(None, &json!({ "docs": docs }), keys.len())
    }

    fn search(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>> {
        self.search_impl(req, false, None)
    }

    fn create(&self, index: Idx, id: &str, source: &Value) -> StoreResult<Version> {
        let name = &self.index_name(index);
        let name = name.as_str();
        let (status, body, ambiguous) = self.call_tracked(|c| async move {
            c.create(CreateParts::IndexId(name, id))
                .body(source.clone())
                .send()
                .await
        })?;
        self.wrote(index, id);
        match status {
            200 | 201 => version_of(&body).ok_or_else(|| StoreError::Other(body.to_string())),
            409 if ambiguous => self
                .landed(index, id, source, false)
                .ok_or_else(|| error_of(status, &body, id)),
            _ => Err(error_of(status, &body, id)),
        }
    }

    fn put(
        &self,
        index: Idx,
        id: &str,
        source: &Value,
        if_version: Option<Version>,
    ) -> StoreResult<Version> {
        let name = &self.index_name(index);
        let name = name.as_str();
        let (status, body, ambiguous) = self.call_tracked(|c| async move {
            let mut req = c.index(IndexParts::IndexId(name, id)).body(source.clone());
            if let Some(v) = if_version {
                req = req
                    .if_seq_no(v.seq_no as i64)
                    .if_primary_term(v.primary_term as i64);
            }
            req.send().await
        })?;
        self.wrote(index, id);
        match status {
            200 | 201 => version_of(&body).ok_or_else(|| StoreError::Other(body.to_string())),
            // Maybe this very write, retried (`own_write_checkable`).
            409 if ambiguous || if_version.is_some() => self
                .landed(index, id, source, false)
                .ok_or_else(|| error_of(status, &body, id)),
            // A conditional write on a missing document is a conflict too.
            404 if if_version.is_some() => Err(StoreError::Conflict(id.to_string())),
            _ => Err(error_of(status, &body, id)),
        }
    }

    fn delete(&self, index: Idx, id: &str, if_version: Option<Version>) -> StoreResult<bool> {
        let name = &self.index_name(index);
        let name = name.as_str();
        let (status, body) = self.call(|c| async move {
            let mut req = c.delete(DeleteParts::IndexId(name, id));
            if let Some(v) = if_version {
                req = req
                    .if_seq_no(v.seq_no as i64)
                    .if_primary_term(v.primary_term as i64);
            }
            req.send().await
        })?;
        match status {
            200 => self.deleted(index, id),
            _ => self.wrote(index, id),
        }
        match status {
            200 => Ok(true),
            404 if body["result"] == "not_found" && if_version.is_none() => Ok(false),
            404 if body["result"] == "not_found" => Err(StoreError::Conflict(id.to_string())),
            _ => Err(error_of(status, &body, id)),
        }
    }

    fn bulk(&self, ops: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>> {
        let r = self.bulk_requests(&ops);
        // After the writes landed (a refresh between would miss them), and
        // whatever the answer (some may have landed).
        let answers = r.as_ref().map_or(&[][..], |r| r.as_slice());
        for (i, op) in ops.iter().enumerate() {
            let gone = matches!(op, BulkOp::Delete { .. }) && matches!(answers.get(i), Some(Ok(_)));
            match gone {
                true => self.deleted(op.index(), op.id()),
                false => self.wrote(op.index(), op.id()),
            }
        }
        r
    }

    /// Without a refresh where this client wrote nothing the count may
    /// match, or only removed names of the directory counted: those are
    /// left out by id (`Unrefreshed::unseen_deletes`; an rmdir after the
    /// unlinks of `rm -rf`).
    fn count(&self, index: Idx, query: &Query) -> StoreResult<u64> {
        // Under `refreshing`: a refresh another thread is sending marked
        // the index clean before it lands.
        let unseen = {
            let _r = self.refreshing[index as usize].lock();
            let u = self.unrefreshed[index as usize].lock();
            u.unseen_deletes(query)
        };
        let query = match unseen {
            Some(ids) if ids.is_empty() => query_json(query),
            Some(ids) => json!({"bool": {
                "filter": [query_json(query)],
                "must_not": [{"ids": {"values": ids}}]
            }}),
            None => {
                self.refresh_if_dirty(index, query)?;
                query_json(query)
            }
        };
        let name = &self.index_name(index);
        let name = name.as_str();
        let body = &json!({ "query": query });
        let (status, resp) = self.call(|c| async move {
            c.count(CountParts::Index(&[name]))
                .body(body.clone())
                .send()
                .await
        })?;
        if status != 200 {
            return Err(error_of(status, &resp, "_count"));
        }
        resp["count"]
            .as_u64()
            .ok_or_else(|| StoreError::Other(format!("count answer without count: {resp}")))
    }

    /// Covers every write this client made before it: the index is clean
    /// for read-your-writes until the next one (a write racing the refresh
    /// marks it again).
    fn refresh(&self, index: Idx) -> StoreResult<()> {
        let _r = self.refreshing[index as usize].lock();
        self.refresh_now(index)
    }

    /// A refresh only if this client wrote `index` since its last one.
    fn publish(&self, index: Idx) -> StoreResult<()> {
        let _r = self.refreshing[index as usize].lock();
        if *self.unrefreshed[index as usize].lock() == Unrefreshed::Clean {
            return Ok(());
        }
        self.refresh_now(index)
    }

    /// Elasticsearch acknowledges a write only after its translog is fsync'd
    /// (`index.translog.durability: request`, the default): nothing to do.
    fn sync(&self) -> StoreResult<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "elasticsearch:{} (index {}-*, server {})",
            self.url, self.prefix, self.server_version
        )
    }

    /// Point-in-time paging: one consistent snapshot for the whole iteration.
    fn scan_pages(
        &self,
        index: Idx,
        query: &Query,
        sort: &[Sort],
        page: usize,
        f: &mut dyn FnMut(Vec<Hit>) -> StoreResult<bool>,
    ) -> StoreResult<()> {
        self.refresh_if_dirty(index, query)?;
        let mut pit = self.open_pit(&self.index_name(index))?;
        // `_doc` last: a unique order within the snapshot on every engine
        // (OpenSearch adds no tiebreaker and has no `_shard_doc`), so a
        // sort-less scan pages too.
        let mut body = self.search_body(&SearchRequest {
            past_own_writes: false,
            index,
            query: query.clone(),
            sort: sort.to_vec(),
            search_after: None,
            size: page,
        });
        let mut order = sort_json(sort);
        if let Some(a) = order.as_array_mut() {
            a.push(json!("_doc"));
        }
        body["sort"] = order;
        let result = (|| {
            let mut after: Option<Vec<Value>> = None;
            loop {
                body["pit"] = json!({"id": pit, "keep_alive": "2m"});
                // Every sort value comes back, the engine's own tiebreaker
                // too: all go into search_after, the caller sees its own.
                if let Some(a) = &after {
                    body["search_after"] = json!(a);
                }
                let b = &body;
                let (status, mut resp) = self.call(|c| async move {
                    c.search(SearchParts::None).body(b.clone()).send().await
                })?;
                if status != 200 {
                    return Err(error_of(status, &resp, "_search"));
                }
                if let Some(id) = resp["pit_id"].as_str() {
                    pit = id.to_string();
                }
                let mut hits = Self::hits_of(&mut resp, 0)?;
                let n = hits.len();
                if n == 0 {
                    return Ok(());
                }
                let next = Some(hits[n - 1].sort.clone());
                for h in &mut hits {
                    h.sort.truncate(sort.len());
                }
                if !f(hits)? || n < page {
                    return Ok(());
                }
                // A full page must move the cursor on: a server that returns
                // no sort values (or the same ones) would hand out the same
                // page forever.
                after = Some(advanced(after.as_deref(), next, &self.url)?);
            }
        })();
        if let Err(e) = self.close_pit(&pit) {
            log::warn!("closing point in time: {e}");
        }
        result
    }
}

/// The next `search_after` cursor, or an error when paging would not advance.
fn advanced(
    prev: Option<&[Value]>,
    next: Option<Vec<Value>>,
    url: &str,
) -> StoreResult<Vec<Value>> {
    match next {
        Some(n) if !n.is_empty() && prev != Some(n.as_slice()) => Ok(n),
        other => Err(StoreError::Other(format!(
            "{}: point-in-time paging did not advance (last hit's sort values {:?}): refusing to loop",
            redact(url),
            other.unwrap_or_default()
        ))),
    }
}

fn retry_pending(results: &[Option<BulkItemResult>]) -> Vec<usize> {
    results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_none())
        .map(|(k, _)| k)
        .collect()
}

/// Whether a 409 for `op` is checked for being the write itself even when
/// this client saw no lost answer (the cluster's own retry after a failover,
/// [`EsStore::own_conflicts`]): a whole document written on a version read,
/// whose every field (its times in nanoseconds included) nobody else would
/// write alike. Not a create: a document someone else created the same is
/// a true conflict (two creates of one lock, one entry), and the
/// filesystem's creates tell their own copies by their fresh inode number;
/// nor a partial update, whose few fields another writer may well set the
/// same.
fn own_write_checkable(op: &BulkOp) -> bool {
    matches!(
        op,
        BulkOp::Index {
            if_version: Some(_),
            ..
        }
    )
}

/// `doc`'s version if it holds what a write `sent` (`fields`: only those
/// top-level fields, for a partial update).
fn holds(doc: &Doc, sent: &Value, fields: bool) -> Option<Version> {
    let same = match (fields, sent.as_object()) {
        (true, Some(sent)) => sent.iter().all(|(k, v)| doc.source.get(k) == Some(v)),
        _ => *doc.source == *sent,
    };
    same.then_some(doc.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        assert_eq!(redact("http://u:secret@h:9200/"), "http://h:9200");
        assert_eq!(redact("https://h:9200"), "https://h:9200");
    }

    #[test]
    fn index_names_are_checked() {
        assert!(check_index_name("esfs").is_ok());
        assert!(check_index_name("Esfs").is_err());
        assert!(check_index_name("_x").is_err());
        assert!(check_index_name("a b").is_err());
    }

    #[test]
    fn tree_queries_use_the_path_hierarchy_subfield() {
        let q = Query::and(vec![
            Query::tree("path", "/a/b"),
            Query::term("kind", "dir"),
        ]);
        assert_eq!(
            query_json(&q),
            json!({"bool": {"filter": [{"term": {"path.tree": "/a/b"}}, {"term": {"kind": "dir"}}], "must_not": []}})
        );
    }

    #[test]
    fn mappings_declare_every_field() {
        let b = index_body(Idx::Entries, 0);
        assert_eq!(
            b["mappings"]["properties"]["path"]["fields"]["tree"]["analyzer"],
            "esfs_path"
        );
        assert_eq!(b["mappings"]["dynamic"], false);
        assert_eq!(b["settings"]["index"]["refresh_interval"], "1s");
    }

    #[test]
    fn contents_are_trigram_text() {
        let b = index_body(Idx::Texts, 0);
        assert_eq!(
            b["mappings"]["properties"]["contents"]["analyzer"],
            "esfs_trigram"
        );
        let t = &b["settings"]["analysis"]["tokenizer"]["esfs_trigram"];
        assert_eq!(
            (
                t["type"].as_str(),
                t["min_gram"].as_u64(),
                t["max_gram"].as_u64()
            ),
            (Some("ngram"), Some(3), Some(3))
        );
        assert_eq!(
            b["settings"]["analysis"]["analyzer"]["esfs_trigram"]["filter"],
            json!(["lowercase"])
        );
        let e = index_body(Idx::Entries, 0);
        assert_eq!(e["mappings"]["properties"]["xattrs"]["type"], "keyword");
        assert!(e["mappings"]["properties"].get("contents").is_none());
        let q = Query::Text {
            field: "contents".into(),
            text: "Hello".into(),
        };
        assert_eq!(
            query_json(&q),
            json!({"match": {"contents": {"query": "Hello", "operator": "and"}}})
        );
        assert_eq!(text_fields(Idx::Texts), ["contents"]);
        assert!(text_fields(Idx::Entries).is_empty());
        assert!(text_fields(Idx::Inodes).is_empty());
    }
}
