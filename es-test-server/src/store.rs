//! The cluster state: indices, their live documents (what realtime GET sees), their
//! searchable snapshots (what search sees, replaced at each refresh) and points in time.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::analysis::Analysis;
use crate::error::{EsError, EsResult};
use crate::mapping::{DocCtx, FV, IndexOutcome, Indexed, Mapping};
use crate::settings::{self, Flat};

pub(crate) const PRIMARY_TERM: i64 = 1;

static RNG_COUNTER: AtomicU64 = AtomicU64::new(0);

pub(crate) fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(RNG_COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

pub(crate) fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        v.extend_from_slice(&random_u64().to_le_bytes());
    }
    v.truncate(n);
    v
}

/// A base64url id like Elasticsearch's uuids (22 chars) or auto ids (20 chars).
pub(crate) fn random_id(len: usize) -> String {
    use base64::Engine;
    let s = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes(len));
    s[..len].to_string()
}

#[derive(Debug)]
pub(crate) struct Doc {
    pub id: Arc<str>,
    /// The `_source` exactly as it was sent (valid JSON text).
    pub source: Arc<str>,
    pub seq_no: i64,
    pub version: i64,
    pub indexed: Indexed,
}

/// What a search sees: the documents as of one refresh, in index order (= `_seq_no` order).
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub docs: Vec<Arc<Doc>>,
    /// `docs[i].seq_no`, for binary searches.
    seqs: Vec<i64>,
    /// Every write up to this sequence number is visible in this snapshot.
    max_seq: i64,
    pub mapping: Arc<Mapping>,
    /// Inverted indexes shared by every snapshot of the index (see [`Snapshot::term_positions`]).
    postings: PostingsCache,
    ids: OnceLock<HashMap<Arc<str>, u32>>,
}

/// An exact term of a field, as the inverted index keys it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum TermKey {
    S(Box<str>),
    I(i64),
    /// A double, by its bits (-0.0 folded into 0.0).
    F(u64),
}

impl TermKey {
    pub(crate) fn f(x: f64) -> TermKey {
        TermKey::F(if x == 0.0 {
            0.0f64.to_bits()
        } else {
            x.to_bits()
        })
    }
}

/// Term -> `_seq_no`s (ascending) of one field, as of a snapshot whose writes end at `max_seq`.
#[derive(Debug)]
pub(crate) struct FieldPostings {
    max_seq: i64,
    map: HashMap<TermKey, Vec<i64>>,
}

pub(crate) type PostingsCache = Arc<Mutex<HashMap<u16, Arc<FieldPostings>>>>;

impl Snapshot {
    pub(crate) fn new(
        docs: Vec<Arc<Doc>>,
        max_seq: i64,
        mapping: Arc<Mapping>,
        postings: PostingsCache,
    ) -> Snapshot {
        let seqs = docs.iter().map(|d| d.seq_no).collect();
        Snapshot {
            docs,
            seqs,
            max_seq,
            mapping,
            postings,
            ids: OnceLock::new(),
        }
    }

    fn build_postings(&self, fid: u16) -> FieldPostings {
        let mut map: HashMap<TermKey, Vec<i64>> = HashMap::new();
        for d in &self.docs {
            let seq = d.seq_no;
            let mut add = |k: TermKey| {
                let v = map.entry(k).or_default();
                if v.last() != Some(&seq) {
                    v.push(seq);
                }
            };
            match d.indexed.get(fid) {
                Some(FV::Kw(v)) => v.iter().for_each(|s| add(TermKey::S(s.clone()))),
                Some(FV::Text(v)) => v.terms.iter().for_each(|(s, _)| add(TermKey::S(s.clone()))),
                Some(FV::Long(v)) => v.iter().for_each(|i| add(TermKey::I(*i))),
                Some(FV::Double(v)) => v.iter().for_each(|x| add(TermKey::f(*x))),
                None => {}
            }
        }
        FieldPostings {
            max_seq: self.max_seq,
            map,
        }
    }

    /// Positions (sorted) of the documents that may hold one of `keys` in field `fid`: a
    /// superset, to be checked by evaluating the query. None means "scan everything".
    ///
    /// The inverted index of a field is built from one snapshot and reused by the later
    /// ones: documents written after it (the tail of `docs`, which is in `_seq_no` order)
    /// are always candidates, and entries of documents that are gone are dropped by
    /// looking their `_seq_no` up. It is rebuilt when the tail grows large.
    pub(crate) fn term_positions(&self, fid: u16, keys: &[TermKey]) -> Option<Vec<u32>> {
        let cached = self.postings.lock().get(&fid).cloned();
        let base = match cached {
            // Built from a later snapshot (an old point in time): not usable here.
            Some(b) if b.max_seq > self.max_seq => return None,
            Some(b)
                if self.docs.len() - self.seqs.partition_point(|&s| s <= b.max_seq)
                    <= (self.docs.len() / 8).max(1024) =>
            {
                b
            }
            _ => {
                let b = Arc::new(self.build_postings(fid));
                let mut c = self.postings.lock();
                if c.get(&fid).is_none_or(|old| old.max_seq < b.max_seq) {
                    c.insert(fid, b.clone());
                }
                b
            }
        };
        let tail = self.seqs.partition_point(|&s| s <= base.max_seq);
        let mut out: Vec<u32> = Vec::new();
        for k in keys {
            if let Some(list) = base.map.get(k) {
                out.extend(
                    list.iter()
                        .filter_map(|s| self.seqs[..tail].binary_search(s).ok().map(|p| p as u32)),
                );
            }
        }
        out.extend(tail as u32..self.docs.len() as u32);
        out.sort_unstable();
        out.dedup();
        Some(out)
    }

    /// Position of a document by id.
    pub(crate) fn position(&self, id: &str) -> Option<u32> {
        self.ids
            .get_or_init(|| {
                self.docs
                    .iter()
                    .enumerate()
                    .map(|(i, d)| (d.id.clone(), i as u32))
                    .collect()
            })
            .get(id)
            .copied()
    }
}

pub(crate) struct Index {
    pub name: String,
    pub uuid: String,
    pub settings: Flat,
    pub mapping: Arc<Mapping>,
    pub live: HashMap<Arc<str>, Arc<Doc>>,
    order: BTreeMap<i64, Arc<Doc>>,
    tombstones: HashMap<Arc<str>, (i64, Instant)>,
    pub next_seq: i64,
    pub snapshot: Arc<Snapshot>,
    pub dirty: bool,
    pub refreshed: watch::Sender<i64>,
    pub last_refresh: Instant,
    pub last_search: Instant,
    pub refresh_interval: Option<Duration>,
    pub refresh_explicit: bool,
    pub max_result_window: usize,
    pub total_fields_limit: usize,
    pub search_idle_after: Duration,
    pub gc_deletes: Duration,
    pub shards: u32,
    pub replicas: u32,
}

pub(crate) struct WriteOk {
    pub result: &'static str,
    pub status: u16,
    pub version: i64,
    pub seq_no: i64,
}

pub(crate) struct UpdateReq {
    pub doc: Option<Value>,
    pub upsert: Option<Value>,
    pub doc_as_upsert: bool,
    pub detect_noop: bool,
    pub cas: Option<(i64, i64)>,
}

impl Index {
    pub(crate) fn new(
        name: &str,
        user_settings: Flat,
        mappings: Option<&Value>,
    ) -> EsResult<Index> {
        settings::validate(&user_settings, false)?;
        let analysis = Analysis::from_settings(
            settings::analysis_section(&user_settings).as_ref(),
            user_settings
                .get("index.max_ngram_diff")
                .and_then(Value::as_str)
                .and_then(|v| v.parse().ok())
                .unwrap_or(1),
        )?;
        let mut mapping = Mapping::empty(analysis);
        if let Some(m) = mappings {
            mapping.merge_json(m)?;
        }
        let uuid = random_id(22);
        let created_ms = crate::time::now_millis();
        let mut s = Flat::new();
        s.insert("index.number_of_shards".into(), json!("1"));
        s.insert("index.number_of_replicas".into(), json!("1"));
        s.insert(
            "index.routing.allocation.include._tier_preference".into(),
            json!("data_content"),
        );
        for (k, v) in user_settings {
            if !v.is_null() {
                s.insert(k, v);
            }
        }
        s.insert("index.uuid".into(), json!(uuid));
        s.insert("index.creation_date".into(), json!(created_ms.to_string()));
        s.insert("index.provided_name".into(), json!(name));
        s.insert(
            "index.version.created".into(),
            json!(crate::INDEX_VERSION_CREATED),
        );
        let (tx, _rx) = watch::channel(-1i64);
        let mapping = Arc::new(mapping);
        let now = Instant::now();
        let mut ix = Index {
            name: name.to_string(),
            uuid,
            settings: s,
            mapping: mapping.clone(),
            live: HashMap::new(),
            order: BTreeMap::new(),
            tombstones: HashMap::new(),
            next_seq: 0,
            snapshot: Arc::new(Snapshot::new(vec![], -1, mapping, PostingsCache::default())),
            dirty: false,
            refreshed: tx,
            last_refresh: now,
            last_search: now,
            refresh_interval: Some(Duration::from_secs(1)),
            refresh_explicit: false,
            max_result_window: 10_000,
            total_fields_limit: 1000,
            search_idle_after: Duration::from_secs(30),
            gc_deletes: Duration::from_secs(60),
            shards: 1,
            replicas: 1,
        };
        ix.apply_settings()?;
        if ix.mapping.total_fields() > ix.total_fields_limit {
            return Err(EsError::bad_request(format!(
                "Limit of total fields [{}] has been exceeded",
                ix.total_fields_limit
            )));
        }
        Ok(ix)
    }

    fn setting(&self, k: &str) -> Option<&Value> {
        self.settings.get(k)
    }

    fn apply_settings(&mut self) -> EsResult<()> {
        let int = |s: &Index, k: &str, d: u64| -> u64 {
            s.setting(k)
                .and_then(Value::as_str)
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        self.shards = int(self, "index.number_of_shards", 1) as u32;
        self.replicas = int(self, "index.number_of_replicas", 1) as u32;
        self.max_result_window = int(self, "index.max_result_window", 10_000) as usize;
        self.total_fields_limit = int(self, "index.mapping.total_fields.limit", 1000) as usize;
        match self.setting("index.refresh_interval").cloned() {
            Some(v) => {
                self.refresh_interval = settings::time_setting("index.refresh_interval", &v)?;
                self.refresh_explicit = true;
            }
            None => {
                self.refresh_interval = Some(Duration::from_secs(1));
                self.refresh_explicit = false;
            }
        }
        if let Some(v) = self.setting("index.search.idle.after").cloned() {
            self.search_idle_after =
                settings::time_setting("index.search.idle.after", &v)?.unwrap_or(Duration::MAX);
        }
        if let Some(v) = self.setting("index.gc_deletes").cloned() {
            self.gc_deletes =
                settings::time_setting("index.gc_deletes", &v)?.unwrap_or(Duration::ZERO);
        }
        Ok(())
    }

    pub(crate) fn update_settings(&mut self, flat: Flat) -> EsResult<()> {
        settings::validate(&flat, true)?;
        let backup = self.settings.clone();
        for (k, v) in flat {
            if v.is_null() {
                self.settings.remove(&k);
            } else {
                self.settings.insert(k, v);
            }
        }
        if let Err(e) = self.apply_settings() {
            self.settings = backup;
            let _ = self.apply_settings();
            return Err(e);
        }
        Ok(())
    }

    pub(crate) fn settings_json(&self) -> Value {
        settings::nest(&self.settings)
    }

    pub(crate) fn put_mapping(&mut self, body: &Value) -> EsResult<()> {
        let mut m = (*self.mapping).clone();
        m.merge_json(body)?;
        if m.total_fields() > self.total_fields_limit {
            return Err(EsError::bad_request(format!(
                "Limit of total fields [{}] has been exceeded",
                self.total_fields_limit
            )));
        }
        self.mapping = Arc::new(m);
        Ok(())
    }

    pub(crate) fn shards_header(&self) -> Value {
        json!({"total": 1 + self.replicas, "successful": 1, "failed": 0})
    }

    fn conflict(&self, id: &str, what: String) -> EsError {
        EsError::new(
            409,
            "version_conflict_engine_exception",
            format!("[{id}]: version conflict, {what}"),
        )
        .with("index_uuid", self.uuid.clone())
        .with("shard", "0")
        .with("index", self.name.clone())
    }

    fn check_cas(&self, id: &str, cas: Option<(i64, i64)>) -> EsResult<()> {
        if let Some((s, t)) = cas {
            match self.live.get(id) {
                None => {
                    return Err(self.conflict(
                        id,
                        format!(
                            "required seqNo [{s}], primary term [{t}]. but no document was found"
                        ),
                    ));
                }
                Some(d) if d.seq_no != s || PRIMARY_TERM != t => {
                    return Err(self.conflict(
                        id,
                        format!(
                            "required seqNo [{s}], primary term [{t}]. current document has seqNo [{}] and primary term [{PRIMARY_TERM}]",
                            d.seq_no
                        ),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Parses a source against the mapping, extending it with dynamic fields when allowed.
    /// Returns the indexed form and the new mapping to commit (if it changed).
    fn parse_source(&self, id: &str, src: &Value) -> EsResult<(Indexed, Option<Mapping>)> {
        let mut working: Option<Mapping> = None;
        for _ in 0..64 {
            let m = working.as_ref().unwrap_or(&self.mapping);
            match m.index_doc(src, &DocCtx { id })? {
                IndexOutcome::Done(ix) => return Ok((ix, working)),
                IndexOutcome::NeedMapping(new) => {
                    let mut w = working.take().unwrap_or_else(|| (*self.mapping).clone());
                    w.add_dynamic(&new, self.total_fields_limit)?;
                    working = Some(w);
                }
            }
        }
        Err(EsError::bad_request("mapping depth limit exceeded"))
    }

    fn prior_version(&mut self, id: &str) -> i64 {
        if let Some(d) = self.live.get(id) {
            return d.version;
        }
        match self.tombstones.get(id) {
            Some((v, at)) if at.elapsed() < self.gc_deletes => *v,
            _ => 0,
        }
    }

    fn install(&mut self, doc: Doc) {
        let doc = Arc::new(doc);
        if let Some(old) = self.live.insert(doc.id.clone(), doc.clone()) {
            self.order.remove(&old.seq_no);
        }
        self.tombstones.remove(&doc.id);
        self.order.insert(doc.seq_no, doc);
        self.dirty = true;
    }

    /// Index (or create, when `create`) a document.
    pub(crate) fn put(
        &mut self,
        id: &str,
        raw: Arc<str>,
        src: &Value,
        create: bool,
        cas: Option<(i64, i64)>,
    ) -> EsResult<WriteOk> {
        let (indexed, new_mapping) = self.parse_source(id, src)?;
        if create && let Some(d) = self.live.get(id) {
            return Err(self.conflict(
                id,
                format!("document already exists (current version [{}])", d.version),
            ));
        }
        self.check_cas(id, cas)?;
        if let Some(m) = new_mapping {
            self.mapping = Arc::new(m);
        }
        let existed = self.live.contains_key(id);
        let version = self.prior_version(id) + 1;
        let seq_no = self.next_seq;
        self.next_seq += 1;
        self.install(Doc {
            id: Arc::from(id),
            source: raw,
            seq_no,
            version,
            indexed,
        });
        Ok(WriteOk {
            result: if existed { "updated" } else { "created" },
            status: if existed { 200 } else { 201 },
            version,
            seq_no,
        })
    }

    pub(crate) fn delete(&mut self, id: &str, cas: Option<(i64, i64)>) -> EsResult<WriteOk> {
        self.check_cas(id, cas)?;
        let version = self.prior_version(id) + 1;
        let seq_no = self.next_seq;
        self.next_seq += 1;
        let key: Arc<str> = Arc::from(id);
        let found = match self.live.remove(id) {
            Some(old) => {
                self.order.remove(&old.seq_no);
                self.dirty = true;
                true
            }
            None => false,
        };
        self.tombstones.insert(key, (version, Instant::now()));
        Ok(WriteOk {
            result: if found { "deleted" } else { "not_found" },
            status: if found { 200 } else { 404 },
            version,
            seq_no,
        })
    }

    pub(crate) fn update(&mut self, id: &str, req: &UpdateReq) -> EsResult<WriteOk> {
        let existing = self.live.get(id).cloned();
        let Some(existing) = existing else {
            let body = if req.doc_as_upsert {
                req.doc.clone()
            } else {
                req.upsert.clone()
            };
            let Some(body) = body else {
                return Err(EsError::new(
                    404,
                    "document_missing_exception",
                    format!("[{id}]: document missing"),
                )
                .with("index_uuid", self.uuid.clone())
                .with("shard", "0")
                .with("index", self.name.clone()));
            };
            let raw: Arc<str> = Arc::from(serde_json::to_string(&body).unwrap_or_default());
            return self.put(id, raw, &body, true, None);
        };
        if let Some((s, t)) = req.cas
            && (existing.seq_no != s || t != PRIMARY_TERM)
        {
            return Err(self.conflict(
                id,
                format!(
                    "required seqNo [{s}], primary term [{t}]. current document has seqNo [{}] and primary term [{PRIMARY_TERM}]",
                    existing.seq_no
                ),
            ));
        }
        let old: Value =
            serde_json::from_str(&existing.source).unwrap_or(Value::Object(Map::new()));
        let mut merged = old.clone();
        if let Some(doc) = &req.doc {
            deep_merge(&mut merged, doc);
        }
        if req.detect_noop && merged == old {
            return Ok(WriteOk {
                result: "noop",
                status: 200,
                version: existing.version,
                seq_no: existing.seq_no,
            });
        }
        let raw: Arc<str> = Arc::from(serde_json::to_string(&merged).unwrap_or_default());
        let r = self.put(
            id,
            raw,
            &merged,
            false,
            Some((existing.seq_no, PRIMARY_TERM)),
        )?;
        Ok(WriteOk {
            result: "updated",
            status: 200,
            ..r
        })
    }

    /// Makes every acknowledged write visible to search.
    pub(crate) fn refresh(&mut self) {
        if self.dirty || !Arc::ptr_eq(&self.snapshot.mapping, &self.mapping) {
            let docs: Vec<Arc<Doc>> = self.order.values().cloned().collect();
            self.snapshot = Arc::new(Snapshot::new(
                docs,
                self.next_seq - 1,
                self.mapping.clone(),
                self.snapshot.postings.clone(),
            ));
            self.dirty = false;
        }
        self.last_refresh = Instant::now();
        let max = self.next_seq - 1;
        self.refreshed.send_if_modified(|v| {
            if *v != max {
                *v = max;
                true
            } else {
                false
            }
        });
    }

    /// True when the index has had no search for `index.search.idle.after` and no explicit
    /// refresh interval: Elasticsearch then skips scheduled refreshes and refreshes on the
    /// next search instead.
    pub(crate) fn search_idle(&self) -> bool {
        !self.refresh_explicit && self.last_search.elapsed() >= self.search_idle_after
    }

    /// Called before every search: records the access and refreshes an idle shard.
    pub(crate) fn on_search(&mut self) {
        if self.search_idle() && (self.dirty || self.has_waiters()) {
            self.refresh();
        }
        self.last_search = Instant::now();
    }

    pub(crate) fn has_waiters(&self) -> bool {
        self.refreshed.receiver_count() > 0 && *self.refreshed.borrow() < self.next_seq - 1
    }

    /// The periodic refresh (the caller checks every ~50 ms).
    pub(crate) fn tick(&mut self, now: Instant) {
        let Some(iv) = self.refresh_interval else {
            return;
        };
        if now.duration_since(self.last_refresh) < iv {
            return;
        }
        if self.search_idle() && !self.has_waiters() {
            return;
        }
        if self.dirty || self.has_waiters() {
            self.refresh();
        } else {
            self.last_refresh = now;
        }
        let gc = self.gc_deletes;
        if self.tombstones.len() > 1024 {
            self.tombstones.retain(|_, (_, at)| at.elapsed() < gc);
        }
    }
}

pub(crate) fn deep_merge(into: &mut Value, changes: &Value) {
    match (into, changes) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(old) if old.is_object() && v.is_object() => deep_merge(old, v),
                    _ => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

pub(crate) struct PitIndex {
    pub name: String,
    pub uuid: String,
    pub snap: Arc<Snapshot>,
    pub max_result_window: usize,
    pub shards: u32,
}

pub(crate) struct Pit {
    pub indices: Vec<Arc<PitIndex>>,
    pub expires: Instant,
}

pub(crate) struct Cluster {
    pub indices: BTreeMap<String, Index>,
    pub pits: HashMap<String, Pit>,
    pub pit_counter: u64,
    pub cluster_uuid: String,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            indices: BTreeMap::new(),
            pits: HashMap::new(),
            pit_counter: 0,
            cluster_uuid: random_id(22),
        }
    }
}

/// Index names as Elasticsearch validates them (MetadataCreateIndexService).
pub(crate) fn validate_index_name(name: &str) -> EsResult<()> {
    const BAD: [char; 10] = ['\\', '/', '*', '?', '"', '<', '>', '|', ' ', ','];
    if name.chars().any(|c| BAD.contains(&c)) {
        return Err(EsError::invalid_index_name(
            name,
            "must not contain the following characters [ , \", *, \\, <, |, ,, >, /, ?]",
        ));
    }
    if name.is_empty() {
        return Err(EsError::invalid_index_name(name, "must not be empty"));
    }
    if name.contains('#') {
        return Err(EsError::invalid_index_name(name, "must not contain '#'"));
    }
    if name.contains(':') {
        return Err(EsError::invalid_index_name(name, "must not contain ':'"));
    }
    if name.starts_with('_') || name.starts_with('-') || name.starts_with('+') {
        return Err(EsError::invalid_index_name(
            name,
            "must not start with '_', '-', or '+'",
        ));
    }
    if name.len() > 255 {
        return Err(EsError::invalid_index_name(
            name,
            &format!("index name is too long, ({} > 255)", name.len()),
        ));
    }
    if name == "." || name == ".." {
        return Err(EsError::invalid_index_name(name, "must not be '.' or '..'"));
    }
    if name.to_lowercase() != name {
        return Err(EsError::invalid_index_name(name, "must be lowercase"));
    }
    Ok(())
}

fn glob(pat: &str, s: &str) -> bool {
    crate::wildcard::wildcard_match(pat.as_bytes(), s.as_bytes(), false)
}

impl Cluster {
    pub(crate) fn index_mut(&mut self, name: &str) -> EsResult<&mut Index> {
        self.indices
            .get_mut(name)
            .ok_or_else(|| EsError::index_not_found(name))
    }

    /// The index for a write, created with dynamic mappings when missing (auto-create).
    pub(crate) fn index_for_write(&mut self, name: &str) -> EsResult<&mut Index> {
        if !self.indices.contains_key(name) {
            validate_index_name(name)?;
            let ix = Index::new(name, Flat::new(), None)?;
            self.indices.insert(name.to_string(), ix);
        }
        Ok(self.indices.get_mut(name).expect("just created"))
    }

    /// Resolves an index expression (`a,b`, `logs-*`, `_all`, `-excluded`).
    pub(crate) fn resolve(
        &self,
        expr: &str,
        ignore_unavailable: bool,
        allow_no_indices: bool,
    ) -> EsResult<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        let mut any_wildcard = false;
        for part in expr.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if let Some(ex) = part.strip_prefix('-')
                && !out.is_empty()
            {
                out.retain(|n| !glob(ex, n));
                continue;
            }
            if part == "_all" || part.contains('*') {
                any_wildcard = true;
                let pat = if part == "_all" { "*" } else { part };
                for n in self.indices.keys() {
                    let hidden = n.starts_with('.')
                        || self.indices[n]
                            .settings
                            .get("index.hidden")
                            .and_then(Value::as_str)
                            == Some("true");
                    if glob(pat, n) && (!hidden || pat.starts_with('.')) && !out.contains(n) {
                        out.push(n.clone());
                    }
                }
                continue;
            }
            if self.indices.contains_key(part) {
                if !out.iter().any(|n| n == part) {
                    out.push(part.to_string());
                }
            } else if !ignore_unavailable {
                return Err(EsError::index_not_found(part));
            }
        }
        if out.is_empty() && !allow_no_indices && any_wildcard {
            return Err(EsError::index_not_found(expr));
        }
        Ok(out)
    }
}
