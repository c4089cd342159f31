//! REST endpoints: routing, parameter checks and the handlers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::Shared;
use crate::error::{EsError, EsResult};
use crate::search::{self, SearchReq, SourceFilter, Target};
use crate::settings;
use crate::store::{
    Cluster, Index, PRIMARY_TERM, Pit, PitIndex, UpdateReq, WriteOk, random_id, validate_index_name,
};

pub struct Req {
    pub method: String,
    pub path: String,
    pub segs: Vec<String>,
    pub params: HashMap<String, String>,
    pub body: bytes::Bytes,
}

pub enum Body {
    Json(Value),
    Text(String),
    Empty,
}

pub struct Resp {
    pub status: u16,
    pub body: Body,
}

impl Resp {
    pub fn json(status: u16, v: Value) -> Resp {
        Resp {
            status,
            body: Body::Json(v),
        }
    }
    fn ok(v: Value) -> Resp {
        Resp::json(200, v)
    }
    fn empty(status: u16) -> Resp {
        Resp {
            status,
            body: Body::Empty,
        }
    }
}

pub enum Outcome {
    Done(Resp),
    /// Respond once every receiver has seen at least the given sequence number
    /// (`refresh=wait_for`).
    WaitFor(Vec<(watch::Receiver<i64>, i64)>, Resp),
    /// Respond after a delay (cluster health waiting for a status it cannot reach).
    Delay(Duration, Resp),
}

impl From<Resp> for Outcome {
    fn from(r: Resp) -> Outcome {
        Outcome::Done(r)
    }
}

const COMMON: &[&str] = &["pretty", "human", "error_trace", "filter_path", "format"];

fn check_params(req: &Req, allowed: &[&str]) -> EsResult<()> {
    let mut bad: Vec<&str> = req
        .params
        .keys()
        .map(String::as_str)
        .filter(|k| !COMMON.contains(k) && !allowed.contains(k))
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    bad.sort();
    let list = bad
        .iter()
        .map(|b| format!("[{b}]"))
        .collect::<Vec<_>>()
        .join(", ");
    let noun = if bad.len() == 1 {
        "parameter"
    } else {
        "parameters"
    };
    Err(EsError::bad_request(format!(
        "request [{}] contains unrecognized {noun}: {list}",
        req.path
    )))
}

fn no_handler(req: &Req) -> EsError {
    EsError::bad_request(format!(
        "no handler found for uri [{}] and method [{}]",
        req.path, req.method
    ))
}

fn bad_method(req: &Req, allowed: &[&str]) -> EsError {
    EsError::raw(
        405,
        json!({
            "error": format!("Incorrect HTTP method for uri [{}] and method [{}], allowed: [{}]", req.path, req.method, allowed.join(", ")),
            "status": 405
        }),
    )
}

fn parse_body(req: &Req) -> EsResult<Option<Value>> {
    if req.body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(None);
    }
    serde_json::from_slice(&req.body)
        .map(Some)
        .map_err(|e| EsError::json_parse(&e))
}

fn require_body(req: &Req) -> EsResult<Value> {
    parse_body(req)?.ok_or_else(|| EsError::new(400, "parse_exception", "request body is required"))
}

fn flag(req: &Req, k: &str) -> bool {
    req.params
        .get(k)
        .is_some_and(|v| v.is_empty() || v == "true")
}

#[derive(Clone, Copy, PartialEq)]
enum Refresh {
    No,
    Now,
    WaitFor,
}

fn refresh_param(req: &Req) -> EsResult<Refresh> {
    match req.params.get("refresh").map(String::as_str) {
        None | Some("false") => Ok(Refresh::No),
        Some("") | Some("true") => Ok(Refresh::Now),
        Some("wait_for") => Ok(Refresh::WaitFor),
        Some(other) => Err(EsError::bad_request(format!(
            "Unknown value for refresh: [{other}]."
        ))),
    }
}

fn long_param(req: &Req, k: &str) -> EsResult<Option<i64>> {
    match req.params.get(k) {
        None => Ok(None),
        Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
            EsError::bad_request(format!(
                "Failed to parse long parameter [{k}] with value [{v}]"
            ))
        }),
    }
}

/// Validation shared by index, create, delete and update (DocWriteRequest).
fn cas_checks(
    id: Option<&str>,
    seq: Option<i64>,
    term: Option<i64>,
    version: Option<&str>,
    version_type: Option<&str>,
    create: bool,
    msgs: &mut Vec<String>,
) -> EsResult<Option<(i64, i64)>> {
    if let Some(s) = seq
        && s < 0
    {
        return Err(EsError::bad_request(format!(
            "sequence numbers must be non negative. got [{s}]."
        )));
    }
    if let Some(t) = term
        && t < 0
    {
        return Err(EsError::bad_request(format!(
            "primary term must be non negative. got [{t}]"
        )));
    }
    let term = term.filter(|t| *t != 0);
    if let Some(vt) = version_type
        && vt != "internal"
    {
        return Err(EsError::unsupported(&format!("version_type [{vt}]")));
    }
    if create && (seq.is_some() || term.is_some()) {
        msgs.push("create operations do not support compare and set. use index instead".into());
        return Ok(None);
    }
    if create && version.is_some() {
        msgs.push("create operations do not support explicit versions. use index instead".into());
        return Ok(None);
    }
    if let Some(v) = version {
        if v.parse::<i64>().is_err() {
            return Err(EsError::bad_request(format!(
                "Failed to parse long parameter [version] with value [{v}]"
            )));
        }
        msgs.push("internal versioning can not be used for optimistic concurrency control. Please use `if_seq_no` and `if_primary_term` instead".into());
        if seq.is_some() {
            msgs.push("compare and write operations can not use versioning".into());
        }
    }
    match (seq, term) {
        (Some(_), None) => msgs.push("ifSeqNo is set, but primary term is [0]".into()),
        (None, Some(t)) => msgs.push(format!("ifSeqNo is unassigned, but primary term is [{t}]")),
        _ => {}
    }
    if let Some(id) = id
        && id.len() > 512
    {
        msgs.push(format!(
            "id [{id}] is too long, must be no longer than 512 bytes but was: {}",
            id.len()
        ));
    }
    Ok(match (seq, term) {
        (Some(s), Some(t)) => Some((s, t)),
        _ => None,
    })
}

fn write_json(ix: &Index, id: &str, w: &WriteOk, forced: bool) -> Value {
    let mut m = Map::new();
    m.insert("_index".into(), json!(ix.name));
    m.insert("_id".into(), json!(id));
    m.insert("_version".into(), json!(w.version));
    m.insert("result".into(), json!(w.result));
    if forced && w.result != "noop" {
        m.insert("forced_refresh".into(), json!(true));
    }
    if w.result == "noop" {
        m.insert(
            "_shards".into(),
            json!({"total": 0, "successful": 0, "failed": 0}),
        );
    } else {
        m.insert("_shards".into(), ix.shards_header());
    }
    m.insert("_seq_no".into(), json!(w.seq_no));
    m.insert("_primary_term".into(), json!(PRIMARY_TERM));
    Value::Object(m)
}

fn finish_write(ix: &mut Index, refresh: Refresh, w: &WriteOk, resp: Resp) -> Outcome {
    match refresh {
        Refresh::Now => {
            ix.refresh();
            Outcome::Done(resp)
        }
        Refresh::WaitFor if w.result != "noop" => {
            Outcome::WaitFor(vec![(ix.refreshed.subscribe(), w.seq_no)], resp)
        }
        _ => Outcome::Done(resp),
    }
}

// ---------------------------------------------------------------------------------------

pub fn dispatch(sh: &Shared, req: &Req) -> EsResult<Outcome> {
    let segs: Vec<&str> = req.segs.iter().map(String::as_str).collect();
    let m = req.method.as_str();
    macro_rules! methods {
        ($($name:literal => $e:expr),+ $(,)?) => {{
            match m {
                $($name => $e,)+
                _ => Err(bad_method(req, &[$($name),+])),
            }
        }};
    }
    match segs.as_slice() {
        [] => methods!("GET" => root(sh, req), "HEAD" => root(sh, req)),
        ["_bulk"] => methods!("POST" => bulk(sh, req, None), "PUT" => bulk(sh, req, None)),
        ["_mget"] => methods!("GET" => mget(sh, req, None), "POST" => mget(sh, req, None)),
        ["_search"] => methods!("GET" => search(sh, req, None), "POST" => search(sh, req, None)),
        ["_count"] => methods!("GET" => count(sh, req, None), "POST" => count(sh, req, None)),
        ["_refresh"] => {
            methods!("GET" => refresh(sh, req, "_all"), "POST" => refresh(sh, req, "_all"))
        }
        ["_pit"] => methods!("DELETE" => close_pit(sh, req)),
        ["_mapping"] => methods!("GET" => get_mapping(sh, req, "_all")),
        ["_settings"] => methods!("GET" => get_settings(sh, req, "_all")),
        ["_cluster", "health"] => methods!("GET" => health(sh, req)),
        ["_cluster", "health", ix] => methods!("GET" => { let _ = ix; health(sh, req) }),
        [ix] if !ix.starts_with('_') || m == "PUT" => methods!(
            "PUT" => create_index(sh, req, ix),
            "GET" => get_index(sh, req, ix),
            "HEAD" => head_index(sh, req, ix),
            "DELETE" => delete_index(sh, req, ix),
        ),
        [ix, "_doc"] => methods!("POST" => index_doc(sh, req, ix, None, false)),
        [ix, "_doc", id] => methods!(
            "GET" => get_doc(sh, req, ix, id, false),
            "HEAD" => get_doc(sh, req, ix, id, false),
            "PUT" => index_doc(sh, req, ix, Some(id), false),
            "POST" => index_doc(sh, req, ix, Some(id), false),
            "DELETE" => delete_doc(sh, req, ix, id),
        ),
        [ix, "_create", id] => {
            methods!("PUT" => index_doc(sh, req, ix, Some(id), true), "POST" => index_doc(sh, req, ix, Some(id), true))
        }
        [ix, "_update", id] => methods!("POST" => update_doc(sh, req, ix, id)),
        [ix, "_source", id] => {
            methods!("GET" => get_doc(sh, req, ix, id, true), "HEAD" => get_doc(sh, req, ix, id, true))
        }
        [ix, "_bulk"] => {
            methods!("POST" => bulk(sh, req, Some(ix)), "PUT" => bulk(sh, req, Some(ix)))
        }
        [ix, "_mget"] => {
            methods!("GET" => mget(sh, req, Some(ix)), "POST" => mget(sh, req, Some(ix)))
        }
        [ix, "_search"] => {
            methods!("GET" => search(sh, req, Some(ix)), "POST" => search(sh, req, Some(ix)))
        }
        [ix, "_count"] => {
            methods!("GET" => count(sh, req, Some(ix)), "POST" => count(sh, req, Some(ix)))
        }
        [ix, "_refresh"] => methods!("GET" => refresh(sh, req, ix), "POST" => refresh(sh, req, ix)),
        [ix, "_pit"] => methods!("POST" => open_pit(sh, req, ix)),
        [ix, "_mapping"] => {
            methods!("GET" => get_mapping(sh, req, ix), "PUT" => put_mapping(sh, req, ix), "POST" => put_mapping(sh, req, ix))
        }
        [ix, "_settings"] => {
            methods!("GET" => get_settings(sh, req, ix), "PUT" => put_settings(sh, req, ix))
        }
        _ => Err(no_handler(req)),
    }
}

fn root(sh: &Shared, req: &Req) -> EsResult<Outcome> {
    check_params(req, &[])?;
    if req.method == "HEAD" {
        return Ok(Resp::empty(200).into());
    }
    let uuid = sh.state.lock().cluster_uuid.clone();
    Ok(Resp::ok(json!({
        "name": "es-test-server",
        "cluster_name": "es-test-server",
        "cluster_uuid": uuid,
        "version": {
            "number": crate::VERSION,
            "build_flavor": "default",
            "build_type": "es-test-server",
            "build_hash": "0000000000000000000000000000000000000000",
            "build_date": "2025-07-17T00:00:00.000000000Z",
            "build_snapshot": false,
            "lucene_version": "10.2.2",
            "minimum_wire_compatibility_version": "8.19.0",
            "minimum_index_compatibility_version": "8.0.0"
        },
        "tagline": "You Know, for Search"
    }))
    .into())
}

fn health(sh: &Shared, req: &Req) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "wait_for_status",
            "timeout",
            "level",
            "local",
            "master_timeout",
            "wait_for_nodes",
            "wait_for_active_shards",
            "wait_for_events",
            "wait_for_no_relocating_shards",
            "wait_for_no_initializing_shards",
        ],
    )?;
    let st = sh.state.lock();
    let primaries: u32 = st.indices.values().map(|i| i.shards).sum();
    let unassigned: u32 = st.indices.values().map(|i| i.shards * i.replicas).sum();
    let status = if unassigned > 0 { "yellow" } else { "green" };
    let total = primaries + unassigned;
    let pct = if total == 0 {
        100.0
    } else {
        primaries as f64 * 100.0 / total as f64
    };
    let body = |timed_out: bool| {
        json!({
            "cluster_name": "es-test-server", "status": status, "timed_out": timed_out,
            "number_of_nodes": 1, "number_of_data_nodes": 1,
            "active_primary_shards": primaries, "active_shards": primaries, "relocating_shards": 0,
            "initializing_shards": 0, "unassigned_shards": unassigned, "unassigned_primary_shards": 0,
            "delayed_unassigned_shards": 0, "number_of_pending_tasks": 0, "number_of_in_flight_fetch": 0,
            "task_max_waiting_in_queue_millis": 0, "active_shards_percent_as_number": pct
        })
    };
    if req.params.get("wait_for_status").map(String::as_str) == Some("green") && status != "green" {
        let t = req
            .params
            .get("timeout")
            .and_then(|t| crate::time::parse_time_value(t))
            .unwrap_or(Duration::from_secs(30));
        return Ok(Outcome::Delay(t, Resp::json(408, body(true))));
    }
    Ok(Resp::ok(body(false)).into())
}

// ---------------------------------------------------------------------------------------
// Indices

fn create_index(sh: &Shared, req: &Req, name: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &["wait_for_active_shards", "timeout", "master_timeout"],
    )?;
    validate_index_name(name)?;
    let body = parse_body(req)?.unwrap_or_else(|| json!({}));
    let obj = body
        .as_object()
        .ok_or_else(|| EsError::new(400, "parse_exception", "Failed to parse content to map"))?;
    let mut settings_v = None;
    let mut mappings = None;
    for (k, v) in obj {
        match k.as_str() {
            "settings" => settings_v = Some(v),
            "mappings" => mappings = Some(v),
            "aliases" => {
                if v.as_object().is_some_and(|a| !a.is_empty()) {
                    return Err(EsError::unsupported("aliases"));
                }
            }
            other => {
                return Err(EsError::new(
                    400,
                    "parse_exception",
                    format!("unknown key [{other}] for create index"),
                ));
            }
        }
    }
    let flat = match settings_v {
        Some(s) => settings::flatten(s)?,
        None => settings::Flat::new(),
    };
    let mut st = sh.state.lock();
    if let Some(ix) = st.indices.get(name) {
        return Err(EsError::new(
            400,
            "resource_already_exists_exception",
            format!("index [{name}/{}] already exists", ix.uuid),
        )
        .with("index_uuid", ix.uuid.clone())
        .with("index", name));
    }
    let ix = Index::new(name, flat, mappings)?;
    st.indices.insert(name.to_string(), ix);
    Ok(Resp::ok(json!({"acknowledged": true, "shards_acknowledged": true, "index": name})).into())
}

fn get_index(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "include_defaults",
            "flat_settings",
            "local",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "master_timeout",
            "features",
        ],
    )?;
    let st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    let mut out = Map::new();
    for n in names {
        let ix = &st.indices[&n];
        out.insert(n.clone(), json!({"aliases": {}, "mappings": ix.mapping.to_json(), "settings": settings_out(ix, req)}));
    }
    Ok(Resp::ok(Value::Object(out)).into())
}

fn settings_out(ix: &Index, req: &Req) -> Value {
    if flag(req, "flat_settings") {
        Value::Object(
            ix.settings
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    } else {
        ix.settings_json()
    }
}

fn head_index(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "include_defaults",
            "flat_settings",
            "local",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "master_timeout",
        ],
    )?;
    let st = sh.state.lock();
    let ok = match st.resolve(expr, false, false) {
        Ok(v) => !v.is_empty(),
        Err(_) => false,
    };
    Ok(Resp::empty(if ok { 200 } else { 404 }).into())
}

fn delete_index(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "timeout",
            "master_timeout",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
        ],
    )?;
    if expr == "_all" || expr.contains('*') {
        return Err(EsError::bad_request(
            "Wildcard expressions or all indices are not allowed",
        ));
    }
    let mut st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    for n in names {
        if let Some(ix) = st.indices.remove(&n) {
            let uuid = ix.uuid.clone();
            st.pits
                .retain(|_, p| !p.indices.iter().any(|pi| pi.uuid == uuid));
        }
    }
    Ok(Resp::ok(json!({"acknowledged": true})).into())
}

fn get_mapping(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "local",
            "master_timeout",
        ],
    )?;
    let st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    let mut out = Map::new();
    for n in names {
        out.insert(
            n.clone(),
            json!({"mappings": st.indices[&n].mapping.to_json()}),
        );
    }
    Ok(Resp::ok(Value::Object(out)).into())
}

fn put_mapping(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "timeout",
            "master_timeout",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "write_index_only",
        ],
    )?;
    let body = require_body(req)?;
    let mut st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    for n in &names {
        st.index_mut(n)?.put_mapping(&body)?;
    }
    Ok(Resp::ok(json!({"acknowledged": true})).into())
}

fn get_settings(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "flat_settings",
            "include_defaults",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "local",
            "master_timeout",
        ],
    )?;
    let st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    let mut out = Map::new();
    for n in names {
        out.insert(
            n.clone(),
            json!({"settings": settings_out(&st.indices[&n], req)}),
        );
    }
    Ok(Resp::ok(Value::Object(out)).into())
}

fn put_settings(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "timeout",
            "master_timeout",
            "preserve_existing",
            "flat_settings",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "reopen",
        ],
    )?;
    let mut body = require_body(req)?;
    if let Some(inner) = body.get("settings").cloned()
        && body.as_object().is_some_and(|o| o.len() == 1)
    {
        body = inner;
    }
    let flat = settings::flatten(&body)?;
    let mut st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    for n in &names {
        st.index_mut(n)?.update_settings(flat.clone())?;
    }
    Ok(Resp::ok(json!({"acknowledged": true})).into())
}

fn refresh(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &["ignore_unavailable", "allow_no_indices", "expand_wildcards"],
    )?;
    let mut st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    let (mut total, mut ok) = (0, 0);
    for n in names {
        let ix = st.index_mut(&n)?;
        ix.refresh();
        total += ix.shards * (1 + ix.replicas);
        ok += ix.shards;
    }
    Ok(Resp::ok(json!({"_shards": {"total": total, "successful": ok, "failed": 0}})).into())
}

// ---------------------------------------------------------------------------------------
// Documents

fn doc_json(ix_name: &str, d: &crate::store::Doc, src: &SourceFilter) -> Value {
    let mut m = Map::new();
    m.insert("_index".into(), json!(ix_name));
    m.insert("_id".into(), json!(&*d.id));
    m.insert("_version".into(), json!(d.version));
    m.insert("_seq_no".into(), json!(d.seq_no));
    m.insert("_primary_term".into(), json!(PRIMARY_TERM));
    m.insert("found".into(), json!(true));
    if let Some(s) = src.apply(&d.source) {
        m.insert("_source".into(), s);
    }
    Value::Object(m)
}

fn lookup(ix: &Index, id: &str, realtime: bool) -> Option<Arc<crate::store::Doc>> {
    if realtime {
        ix.live.get(id).cloned()
    } else {
        ix.snapshot
            .position(id)
            .map(|p| ix.snapshot.docs[p as usize].clone())
    }
}

fn get_doc(sh: &Shared, req: &Req, ixn: &str, id: &str, source_only: bool) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "realtime",
            "refresh",
            "routing",
            "preference",
            "stored_fields",
            "_source",
            "_source_includes",
            "_source_excludes",
            "version",
            "version_type",
        ],
    )?;
    let realtime = req.params.get("realtime").is_none_or(|v| v != "false");
    let src = SourceFilter::from_params(
        req.params.get("_source").map(String::as_str),
        req.params.get("_source_includes").map(String::as_str),
        req.params.get("_source_excludes").map(String::as_str),
    )
    .unwrap_or_else(SourceFilter::all);
    let head = req.method == "HEAD";
    let mut st = sh.state.lock();
    let ix = match st.index_mut(ixn) {
        Ok(ix) => ix,
        Err(e) if head => return Ok(Resp::empty(e.status).into()),
        Err(e) => return Err(e),
    };
    if flag(req, "refresh") {
        ix.refresh();
    }
    let doc = lookup(ix, id, realtime);
    if let (Some(d), Some(v)) = (&doc, long_param(req, "version")?)
        && d.version != v
    {
        return Err(EsError::new(
            409,
            "version_conflict_engine_exception",
            format!("[{id}]: version conflict, current version [{}] is different than the one provided [{v}]", d.version),
        )
        .with("index_uuid", ix.uuid.clone())
        .with("shard", "0")
        .with("index", ix.name.clone()));
    }
    if head {
        return Ok(Resp::empty(if doc.is_some() { 200 } else { 404 }).into());
    }
    if source_only {
        return match doc {
            Some(d) => Ok(Resp::ok(src.apply(&d.source).unwrap_or(Value::Null)).into()),
            None => Err(EsError::new(
                404,
                "resource_not_found_exception",
                format!("Document not found [{ixn}]/[{id}]"),
            )),
        };
    }
    Ok(match doc {
        Some(d) => Resp::ok(doc_json(&ix.name, &d, &src)),
        None => Resp::json(404, json!({"_index": ix.name, "_id": id, "found": false})),
    }
    .into())
}

fn mget(sh: &Shared, req: &Req, default: Option<&str>) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "realtime",
            "refresh",
            "routing",
            "preference",
            "stored_fields",
            "_source",
            "_source_includes",
            "_source_excludes",
        ],
    )?;
    let body = require_body(req)?;
    let realtime = req.params.get("realtime").is_none_or(|v| v != "false");
    let default_src = SourceFilter::from_params(
        req.params.get("_source").map(String::as_str),
        req.params.get("_source_includes").map(String::as_str),
        req.params.get("_source_excludes").map(String::as_str),
    )
    .unwrap_or_else(SourceFilter::all);
    let mut items: Vec<(Option<String>, String, SourceFilter)> = Vec::new();
    let obj = body
        .as_object()
        .ok_or_else(|| EsError::parsing("Unexpected token"))?;
    for (k, v) in obj {
        match k.as_str() {
            "docs" => {
                for d in v.as_array().ok_or_else(|| {
                    EsError::parsing("docs array element should include an object")
                })? {
                    let o = d.as_object().ok_or_else(|| {
                        EsError::parsing("docs array element should include an object")
                    })?;
                    let mut src = default_src.clone();
                    let mut ix = default.map(str::to_string);
                    let mut id = None;
                    for (dk, dv) in o {
                        match dk.as_str() {
                            "_index" => ix = dv.as_str().map(str::to_string),
                            "_id" => {
                                id = Some(
                                    dv.as_str()
                                        .map(str::to_string)
                                        .unwrap_or_else(|| dv.to_string()),
                                )
                            }
                            "_source" => src = SourceFilter::from_json(dv)?,
                            "routing" | "stored_fields" | "version" | "version_type" => {}
                            other => {
                                return Err(EsError::parsing(format!(
                                    "Unknown key for a {} in [{other}].",
                                    crate::query::json_token(dv)
                                )));
                            }
                        }
                    }
                    items.push((ix, id.unwrap_or_default(), src));
                }
            }
            "ids" => {
                for i in v
                    .as_array()
                    .ok_or_else(|| EsError::parsing("ids array element should only contain ids"))?
                {
                    let id = i
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| i.to_string());
                    items.push((default.map(str::to_string), id, default_src.clone()));
                }
            }
            other => {
                return Err(EsError::parsing(format!(
                    "unknown parameter [{other}] in request body or parameter is of the wrong type[{}] ",
                    crate::query::json_token(v)
                )));
            }
        }
    }
    let mut msgs = Vec::new();
    if items.is_empty() {
        msgs.push("no documents to get".to_string());
    }
    for (i, (ix, id, _)) in items.iter().enumerate() {
        if ix.is_none() {
            msgs.push(format!("index is missing for doc {i}"));
        }
        if id.is_empty() {
            msgs.push(format!("id is missing for doc {i}"));
        }
    }
    if !msgs.is_empty() {
        return Err(EsError::validation(&msgs));
    }
    let mut st = sh.state.lock();
    if flag(req, "refresh") {
        for (ix, _, _) in &items {
            if let Some(ix) = ix.as_ref().and_then(|n| st.indices.get_mut(n)) {
                ix.refresh();
            }
        }
    }
    let docs: Vec<Value> = items
        .iter()
        .map(|(ixn, id, src)| {
            let ixn = ixn.as_deref().unwrap_or_default();
            match st.indices.get(ixn) {
                None => json!({"_index": ixn, "_id": id, "error": EsError::index_not_found(ixn).error_object()}),
                Some(ix) => match lookup(ix, id, realtime) {
                    Some(d) => doc_json(&ix.name, &d, src),
                    None => json!({"_index": ix.name, "_id": id, "found": false}),
                },
            }
        })
        .collect();
    Ok(Resp::ok(json!({"docs": docs})).into())
}

const WRITE_PARAMS: &[&str] = &[
    "op_type",
    "refresh",
    "routing",
    "timeout",
    "version",
    "version_type",
    "if_seq_no",
    "if_primary_term",
    "pipeline",
    "require_alias",
    "wait_for_active_shards",
    "require_data_stream",
    "include_source_on_error",
    "list_executed_pipelines",
];

fn index_doc(
    sh: &Shared,
    req: &Req,
    ixn: &str,
    id: Option<&str>,
    create_endpoint: bool,
) -> EsResult<Outcome> {
    check_params(req, WRITE_PARAMS)?;
    let refresh = refresh_param(req)?;
    let op = req.params.get("op_type").map(String::as_str);
    let create = match (create_endpoint, op) {
        (true, None) | (true, Some("create")) => true,
        (true, Some(o)) => {
            return Err(EsError::bad_request(format!(
                "opType must be 'create', found: [{o}]"
            )));
        }
        (false, None) | (false, Some("index")) => false,
        (false, Some("create")) => true,
        (false, Some(o)) => {
            return Err(EsError::bad_request(format!(
                "opType must be 'create' or 'index', found: [{o}]"
            )));
        }
    };
    if req.params.get("pipeline").is_some_and(|p| p != "_none") {
        return Err(EsError::unsupported("ingest pipelines"));
    }
    let mut msgs = Vec::new();
    let cas = cas_checks(
        id,
        long_param(req, "if_seq_no")?,
        long_param(req, "if_primary_term")?,
        req.params.get("version").map(String::as_str),
        req.params.get("version_type").map(String::as_str),
        create,
        &mut msgs,
    )?;
    if !msgs.is_empty() {
        return Err(EsError::validation(&msgs));
    }
    let raw = std::str::from_utf8(&req.body)
        .map_err(|_| EsError::new(400, "parse_exception", "invalid UTF-8 in body"))?;
    if raw.trim().is_empty() {
        return Err(EsError::validation(&[
            "source is missing".into(),
            "content type is missing".into(),
        ]));
    }
    let src: Value = serde_json::from_str(raw).map_err(|e| doc_parse_error(&e))?;
    let raw: Arc<str> = Arc::from(raw.trim());
    let id = id.map(str::to_string).unwrap_or_else(|| random_id(20));
    let mut st = sh.state.lock();
    let ix = st.index_for_write(ixn)?;
    let w = ix.put(&id, raw, &src, create, cas)?;
    let body = write_json(ix, &id, &w, refresh == Refresh::Now);
    let resp = Resp::json(w.status, body);
    Ok(finish_write(ix, refresh, &w, resp))
}

fn doc_parse_error(e: &serde_json::Error) -> EsError {
    let reason = format!("[{}:{}] failed to parse: {e}", e.line(), e.column());
    EsError::new(400, "document_parsing_exception", reason)
        .caused_by(json!({"type": "json_parse_exception", "reason": e.to_string()}))
}

fn delete_doc(sh: &Shared, req: &Req, ixn: &str, id: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "refresh",
            "routing",
            "timeout",
            "version",
            "version_type",
            "if_seq_no",
            "if_primary_term",
            "wait_for_active_shards",
        ],
    )?;
    let refresh = refresh_param(req)?;
    let mut msgs = Vec::new();
    let cas = cas_checks(
        Some(id),
        long_param(req, "if_seq_no")?,
        long_param(req, "if_primary_term")?,
        req.params.get("version").map(String::as_str),
        req.params.get("version_type").map(String::as_str),
        false,
        &mut msgs,
    )?;
    if !msgs.is_empty() {
        return Err(EsError::validation(&msgs));
    }
    let mut st = sh.state.lock();
    let ix = st.index_mut(ixn)?;
    let w = ix.delete(id, cas)?;
    let body = write_json(ix, id, &w, refresh == Refresh::Now);
    let resp = Resp::json(w.status, body);
    Ok(finish_write(ix, refresh, &w, resp))
}

fn parse_update_body(
    body: &Value,
    cas: Option<(i64, i64)>,
    retry: i64,
    msgs: &mut Vec<String>,
) -> EsResult<UpdateReq> {
    let obj = body
        .as_object()
        .ok_or_else(|| EsError::parsing("Unexpected token"))?;
    let mut u = UpdateReq {
        doc: None,
        upsert: None,
        doc_as_upsert: false,
        detect_noop: true,
        cas,
    };
    for (k, v) in obj {
        match k.as_str() {
            "doc" => u.doc = Some(v.clone()),
            "upsert" => u.upsert = Some(v.clone()),
            "doc_as_upsert" => u.doc_as_upsert = v.as_bool().unwrap_or(false),
            "detect_noop" => u.detect_noop = v.as_bool().unwrap_or(true),
            "script" | "scripted_upsert" => {
                return Err(EsError::unsupported(
                    "scripts (use a partial \"doc\" update, or index the whole document with if_seq_no/if_primary_term)",
                ));
            }
            "_source" | "lang" => {}
            other => {
                return Err(EsError::new(
                    400,
                    "x_content_parse_exception",
                    format!("[1:2] [UpdateRequest] unknown field [{other}]"),
                ));
            }
        }
    }
    if cas.is_some() {
        if retry > 0 {
            msgs.push("compare and write operations can not be retried".into());
        }
        if u.doc_as_upsert {
            msgs.push("compare and write operations can not be used with upsert".into());
        }
        if u.upsert.is_some() {
            msgs.push("upsert requests don't support `if_seq_no` and `if_primary_term`".into());
        }
    }
    if u.doc.is_none() {
        if u.doc_as_upsert {
            msgs.push("doc must be specified if doc_as_upsert is enabled".into());
        }
        msgs.push("script or doc is missing".into());
    }
    Ok(u)
}

fn update_doc(sh: &Shared, req: &Req, ixn: &str, id: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "refresh",
            "routing",
            "timeout",
            "if_seq_no",
            "if_primary_term",
            "retry_on_conflict",
            "_source",
            "_source_includes",
            "_source_excludes",
            "lang",
            "require_alias",
            "wait_for_active_shards",
            "include_source_on_error",
        ],
    )?;
    let refresh = refresh_param(req)?;
    let body = require_body(req)?;
    let mut msgs = Vec::new();
    let cas = cas_checks(
        Some(id),
        long_param(req, "if_seq_no")?,
        long_param(req, "if_primary_term")?,
        None,
        None,
        false,
        &mut msgs,
    )?;
    let u = parse_update_body(
        &body,
        cas,
        long_param(req, "retry_on_conflict")?.unwrap_or(0),
        &mut msgs,
    )?;
    if !msgs.is_empty() {
        return Err(EsError::validation(&msgs));
    }
    let mut st = sh.state.lock();
    let ix = st.index_for_write(ixn)?;
    let w = ix.update(id, &u)?;
    let body = write_json(ix, id, &w, refresh == Refresh::Now);
    let resp = Resp::json(w.status, body);
    Ok(finish_write(ix, refresh, &w, resp))
}

// ---------------------------------------------------------------------------------------
// Bulk

enum BulkOp {
    Index {
        create: bool,
        source: Result<(Arc<str>, Value), EsError>,
    },
    Delete,
    Update(Result<UpdateReq, EsError>),
}

struct BulkItem {
    action: &'static str,
    index: String,
    id: Option<String>,
    cas: Option<(i64, i64)>,
    op: BulkOp,
}

fn bulk(sh: &Shared, req: &Req, default: Option<&str>) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "refresh",
            "routing",
            "timeout",
            "pipeline",
            "require_alias",
            "wait_for_active_shards",
            "_source",
            "_source_includes",
            "_source_excludes",
            "require_data_stream",
            "list_executed_pipelines",
            "include_source_on_error",
        ],
    )?;
    if req.params.get("pipeline").is_some_and(|p| p != "_none") {
        return Err(EsError::unsupported("ingest pipelines"));
    }
    let refresh = refresh_param(req)?;
    let start = Instant::now();
    let body = &req.body;
    if body.is_empty() {
        return Err(EsError::new(
            400,
            "parse_exception",
            "request body is required",
        ));
    }
    if !body.ends_with(b"\n") {
        return Err(EsError::bad_request(
            "The bulk request must be terminated by a newline [\\n]",
        ));
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| EsError::bad_request("bulk body is not valid UTF-8"))?;
    let lines: Vec<&str> = text.split('\n').collect();
    let lines = &lines[..lines.len() - 1];
    let mut items = Vec::new();
    let mut msgs = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_end_matches('\r');
        let line_no = i + 1;
        i += 1;
        if line.trim().is_empty() {
            continue;
        }
        let action: Value = serde_json::from_str(line).map_err(|e| {
            EsError::bad_request(format!(
                "Malformed action/metadata line [{line_no}], expected START_OBJECT or END_OBJECT but found [{}]",
                if line.trim_start().starts_with('{') { e.to_string() } else { "VALUE_STRING".into() }
            ))
        })?;
        let obj = action.as_object().ok_or_else(|| {
            EsError::bad_request(format!(
                "Malformed action/metadata line [{line_no}], expected START_OBJECT but found [{}]",
                crate::query::json_token(&action)
            ))
        })?;
        if obj.len() != 1 {
            return Err(EsError::bad_request(format!(
                "Malformed action/metadata line [{line_no}], expected END_OBJECT but found [FIELD_NAME]"
            )));
        }
        let (name, meta) = obj.iter().next().expect("one");
        let action_name: &'static str = match name.as_str() {
            "index" => "index",
            "create" => "create",
            "delete" => "delete",
            "update" => "update",
            other => {
                return Err(EsError::bad_request(format!(
                    "Malformed action/metadata line [{line_no}], expected field [create], [delete], [index] or [update] but found [{other}]"
                )));
            }
        };
        let meta = meta.as_object().ok_or_else(|| {
            EsError::bad_request(format!(
                "Malformed action/metadata line [{line_no}], expected START_OBJECT but found [{}]",
                crate::query::json_token(meta)
            ))
        })?;
        let mut index = default.map(str::to_string);
        let mut id = None;
        let (mut seq, mut term, mut version, mut version_type, mut retry) =
            (None, None, None, None, 0i64);
        for (k, v) in meta {
            let as_i64 = |v: &Value| {
                v.as_i64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            };
            match k.as_str() {
                "_index" => index = v.as_str().map(str::to_string),
                "_id" => {
                    id = Some(
                        v.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string()),
                    )
                }
                "if_seq_no" => seq = as_i64(v),
                "if_primary_term" => term = as_i64(v),
                "version" => version = Some(v.to_string()),
                "version_type" => version_type = v.as_str().map(str::to_string),
                "retry_on_conflict" => retry = as_i64(v).unwrap_or(0),
                "routing"
                | "require_alias"
                | "dynamic_templates"
                | "require_data_stream"
                | "list_executed_pipelines"
                | "_source" => {}
                "pipeline" => {
                    if v.as_str() != Some("_none") {
                        return Err(EsError::unsupported("ingest pipelines"));
                    }
                }
                other => {
                    return Err(EsError::bad_request(format!(
                        "Action/metadata line [{line_no}] contains an unknown parameter [{other}]"
                    )));
                }
            }
        }
        let create = action_name == "create";
        let cas = cas_checks(
            id.as_deref(),
            seq,
            term,
            version.as_deref(),
            version_type.as_deref(),
            create,
            &mut msgs,
        )?;
        if index.is_none() {
            msgs.push("index is missing".into());
        }
        // An empty id fails an index or create item alone (in run_bulk_item); delete and
        // update need an id, so for them it is missing.
        let no_id = id.as_deref().is_none_or(str::is_empty);
        let op = match action_name {
            "delete" => {
                if no_id {
                    msgs.push("id is missing".into());
                }
                BulkOp::Delete
            }
            _ => {
                if i >= lines.len() {
                    return Err(EsError::bad_request(
                        "The bulk request must be terminated by a newline [\\n]".to_string(),
                    ));
                }
                let src_line = lines[i].trim_end_matches('\r');
                i += 1;
                if action_name == "update" {
                    if no_id {
                        msgs.push("id is missing".into());
                    }
                    let parsed: Result<Value, _> = serde_json::from_str(src_line);
                    BulkOp::Update(match parsed {
                        Ok(v) => Ok(parse_update_body(&v, cas, retry, &mut msgs)?),
                        Err(e) => Err(EsError::json_parse(&e)),
                    })
                } else {
                    let source = serde_json::from_str::<Value>(src_line)
                        .map(|v| (Arc::from(src_line.trim()), v))
                        .map_err(|e| doc_parse_error(&e));
                    BulkOp::Index { create, source }
                }
            }
        };
        items.push(BulkItem {
            action: action_name,
            index: index.unwrap_or_default(),
            id,
            cas,
            op,
        });
    }
    if items.is_empty() {
        msgs.push("no requests added".into());
    }
    if !msgs.is_empty() {
        return Err(EsError::validation(&msgs));
    }
    let mut st = sh.state.lock();
    let mut touched: HashMap<String, i64> = HashMap::new();
    let mut out = Vec::with_capacity(items.len());
    let mut errors = false;
    for it in items {
        let r = run_bulk_item(&mut st, &it);
        let id = it.id.clone();
        let mut entry = Map::new();
        match r {
            Ok((id, w)) => {
                let ix = &st.indices[&it.index];
                let mut v = write_json(ix, &id, &w, refresh == Refresh::Now);
                v.as_object_mut()
                    .expect("obj")
                    .insert("status".into(), json!(w.status));
                if w.result != "noop" {
                    let e = touched.entry(it.index.clone()).or_insert(-1);
                    *e = (*e).max(w.seq_no);
                }
                entry.insert(it.action.into(), v);
            }
            Err(e) => {
                errors = true;
                let mut v = Map::new();
                v.insert("_index".into(), json!(it.index));
                v.insert("_id".into(), json!(id));
                v.insert("status".into(), json!(e.status));
                v.insert("error".into(), e.flat());
                entry.insert(it.action.into(), Value::Object(v));
            }
        }
        out.push(Value::Object(entry));
    }
    let resp = Resp::ok(
        json!({"errors": errors, "took": start.elapsed().as_millis() as u64, "items": out}),
    );
    match refresh {
        Refresh::Now => {
            for n in touched.keys() {
                if let Some(ix) = st.indices.get_mut(n) {
                    ix.refresh();
                }
            }
            Ok(resp.into())
        }
        Refresh::WaitFor => {
            let waits = touched
                .iter()
                .filter_map(|(n, seq)| st.indices.get(n).map(|ix| (ix.refreshed.subscribe(), *seq)))
                .collect();
            Ok(Outcome::WaitFor(waits, resp))
        }
        Refresh::No => Ok(resp.into()),
    }
}

fn run_bulk_item(st: &mut Cluster, it: &BulkItem) -> EsResult<(String, WriteOk)> {
    match &it.op {
        BulkOp::Delete => {
            let id = it.id.clone().unwrap_or_default();
            let ix = st.index_mut(&it.index)?;
            Ok((id.clone(), ix.delete(&id, it.cas)?))
        }
        BulkOp::Index { create, source } => {
            // The index is auto-created before the item is looked at, as in Elasticsearch.
            let ix = st.index_for_write(&it.index)?;
            if it.id.as_deref() == Some("") {
                return Err(EsError::new(
                    400,
                    "illegal_argument_exception",
                    "if _id is specified it must not be empty",
                ));
            }
            let (raw, v) = source.as_ref().map_err(Clone::clone)?;
            let id = it.id.clone().unwrap_or_else(|| random_id(20));
            Ok((id.clone(), ix.put(&id, raw.clone(), v, *create, it.cas)?))
        }
        BulkOp::Update(u) => {
            let u = u.as_ref().map_err(Clone::clone)?;
            let id = it.id.clone().unwrap_or_default();
            let ix = st.index_for_write(&it.index)?;
            Ok((id.clone(), ix.update(&id, u)?))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Search, count, point in time

const SEARCH_PARAMS: &[&str] = &[
    "size",
    "from",
    "sort",
    "_source",
    "_source_includes",
    "_source_excludes",
    "track_total_hits",
    "seq_no_primary_term",
    "version",
    "q",
    "rest_total_hits_as_int",
    "ignore_unavailable",
    "allow_no_indices",
    "expand_wildcards",
    "typed_keys",
    "search_type",
    "request_cache",
    "preference",
    "routing",
    "timeout",
    "batched_reduce_size",
    "ccs_minimize_roundtrips",
    "pre_filter_shard_size",
    "max_concurrent_shard_requests",
    "allow_partial_search_results",
    "track_scores",
    "explain",
    "stored_fields",
    "docvalue_fields",
    "terminate_after",
    "analyzer",
    "default_operator",
    "df",
    "lenient",
    "analyze_wildcard",
    "scroll",
    "ignore_throttled",
    "include_named_queries_score",
    "force_synthetic_source",
    "suggest_field",
    "suggest_mode",
    "suggest_size",
    "suggest_text",
    "stats",
];

fn decode_pit(id: &str) -> EsResult<()> {
    use base64::Engine;
    let ok = base64::engine::general_purpose::STANDARD
        .decode(id)
        .ok()
        .is_some_and(|b| b.starts_with(b"es-test-server-pit:"));
    if ok {
        Ok(())
    } else {
        Err(EsError::bad_request(format!("invalid id: [{id}]")))
    }
}

fn context_missing(id: &str) -> EsError {
    let inner = EsError::new(
        404,
        "search_context_missing_exception",
        format!("No search context found for id [{id}]"),
    );
    let mut e = EsError::search_phase(inner, None);
    e.status = 404;
    e
}

fn keep_alive(v: &str) -> EsResult<Duration> {
    let d = crate::time::parse_time_value(v).ok_or_else(|| {
        EsError::bad_request(format!("failed to parse setting [keep_alive] with value [{v}] as a time value: unit is missing or unrecognized"))
    })?;
    if d > Duration::from_secs(86400) {
        return Err(EsError::bad_request(format!(
            "Keep alive for request ({v}) is too large. It must be less than (1d). This limit can be set by changing the [search.max_keep_alive] cluster level setting."
        )));
    }
    Ok(d)
}

fn targets_for(st: &mut Cluster, req: &Req, expr: Option<&str>) -> EsResult<Vec<Target>> {
    let names = st.resolve(
        expr.unwrap_or("_all"),
        flag(req, "ignore_unavailable"),
        req.params
            .get("allow_no_indices")
            .is_none_or(|v| v != "false"),
    )?;
    let mut out = Vec::new();
    for n in names {
        let ix = st.index_mut(&n)?;
        ix.on_search();
        out.push(Target {
            name: ix.name.clone(),
            snap: ix.snapshot.clone(),
            mapping: ix.mapping.clone(),
            max_result_window: ix.max_result_window,
            shards: ix.shards,
        });
    }
    Ok(out)
}

fn pit_targets(st: &mut Cluster, id: &str, ka: Option<&str>) -> EsResult<Vec<Target>> {
    decode_pit(id)?;
    let ka = ka.map(keep_alive).transpose()?;
    let now = Instant::now();
    let Some(p) = st.pits.get_mut(id) else {
        return Err(context_missing(id));
    };
    if p.expires <= now {
        st.pits.remove(id);
        return Err(context_missing(id));
    }
    if let Some(ka) = ka {
        p.expires = now + ka;
    }
    Ok(p.indices
        .iter()
        .map(|pi| Target {
            name: pi.name.clone(),
            snap: pi.snap.clone(),
            mapping: pi.snap.mapping.clone(),
            max_result_window: pi.max_result_window,
            shards: pi.shards,
        })
        .collect())
}

fn search(sh: &Shared, req: &Req, expr: Option<&str>) -> EsResult<Outcome> {
    check_params(req, SEARCH_PARAMS)?;
    if req.params.contains_key("scroll") {
        return Err(EsError::unsupported(
            "scroll searches (use a point in time with search_after)",
        ));
    }
    if flag(req, "typed_keys") {
        return Err(EsError::unsupported("typed_keys"));
    }
    let start = Instant::now();
    let body = parse_body(req)?;
    let sreq = SearchReq::parse(body.as_ref(), &req.params)?;
    let targets = {
        let mut st = sh.state.lock();
        match &sreq.pit {
            Some((id, ka)) => {
                if expr.is_some() {
                    return Err(EsError::validation(&[
                        "[indices] cannot be used with point in time. Do not specify any index with point in time.".into(),
                    ]));
                }
                pit_targets(&mut st, id, ka.as_deref())?
            }
            None => targets_for(&mut st, req, expr)?,
        }
    };
    let pit_id = sreq.pit.as_ref().map(|(id, _)| id.clone());
    let out = search::execute(&targets, &sreq, pit_id.is_some(), start, pit_id.as_deref())?;
    Ok(Resp {
        status: 200,
        body: Body::Text(out.body),
    }
    .into())
}

fn count(sh: &Shared, req: &Req, expr: Option<&str>) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "q",
            "routing",
            "preference",
            "min_score",
            "terminate_after",
            "analyzer",
            "df",
            "default_operator",
            "lenient",
            "analyze_wildcard",
            "ignore_throttled",
        ],
    )?;
    if req.params.contains_key("q") {
        return Err(EsError::unsupported("the [q] (query string) parameter"));
    }
    let body = parse_body(req)?;
    let mut query = None;
    if let Some(b) = &body {
        let o = b
            .as_object()
            .ok_or_else(|| EsError::parsing("request body must be an object"))?;
        for (k, v) in o {
            match k.as_str() {
                "query" => query = Some(v.clone()),
                other => {
                    return Err(EsError::parsing(format!(
                        "request does not support [{other}]"
                    )));
                }
            }
        }
    }
    let targets = {
        let mut st = sh.state.lock();
        targets_for(&mut st, req, expr)?
    };
    let min_score = req
        .params
        .get("min_score")
        .and_then(|v| v.parse::<f32>().ok());
    let n = search::find_matches(&targets, query.as_ref(), min_score)?.len();
    Ok(Resp::ok(json!({"count": n, "_shards": search::shards_json(&targets)})).into())
}

fn open_pit(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "keep_alive",
            "routing",
            "preference",
            "ignore_unavailable",
            "expand_wildcards",
            "allow_partial_search_results",
            "max_concurrent_shard_requests",
            "index_filter",
        ],
    )?;
    let ka = match req.params.get("keep_alive") {
        Some(v) => keep_alive(v)?,
        None => {
            return Err(EsError::validation(&[
                "[keep_alive] is not specified".into()
            ]));
        }
    };
    if parse_body(req)?.is_some_and(|b| b.get("index_filter").is_some()) {
        return Err(EsError::unsupported("index_filter on point in time"));
    }
    let mut st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    let mut pis = Vec::new();
    let mut shards = 0;
    for n in &names {
        let ix = st.index_mut(n)?;
        ix.on_search();
        shards += ix.shards;
        pis.push(Arc::new(PitIndex {
            name: ix.name.clone(),
            uuid: ix.uuid.clone(),
            snap: ix.snapshot.clone(),
            max_result_window: ix.max_result_window,
            shards: ix.shards,
        }));
    }
    st.pit_counter += 1;
    let id = {
        use base64::Engine;
        let raw = format!("es-test-server-pit:{}:{}", st.pit_counter, random_id(16));
        base64::engine::general_purpose::STANDARD.encode(raw)
    };
    st.pits.insert(
        id.clone(),
        Pit {
            indices: pis,
            expires: Instant::now() + ka,
        },
    );
    Ok(Resp::ok(json!({"id": id, "_shards": {"total": shards, "successful": shards, "skipped": 0, "failed": 0}})).into())
}

fn close_pit(sh: &Shared, req: &Req) -> EsResult<Outcome> {
    check_params(req, &[])?;
    let body = require_body(req)?;
    let id = body
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| EsError::validation(&["no pit id specified".into()]))?;
    decode_pit(id)?;
    let mut st = sh.state.lock();
    let now = Instant::now();
    let freed = match st.pits.remove(id) {
        Some(p) => p.expires > now,
        None => false,
    };
    Ok(if freed {
        Resp::ok(json!({"succeeded": true, "num_freed": 1}))
    } else {
        Resp::json(404, json!({"succeeded": true, "num_freed": 0}))
    }
    .into())
}

// ---------------------------------------------------------------------------------------
// filter_path

fn fp_glob(p: &str, k: &str) -> bool {
    crate::query::wildcard_match(p.as_bytes(), k.as_bytes(), false)
}

fn fp_include(v: &Value, pats: &[Vec<String>]) -> Option<Value> {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, x) in m {
                let mut full = false;
                let mut next: Vec<Vec<String>> = Vec::new();
                for p in pats {
                    if p.is_empty() {
                        continue;
                    }
                    if p[0] == "**" {
                        next.push(p.clone());
                        if p.len() == 1 {
                            full = true;
                        } else if fp_glob(&p[1], k) {
                            if p.len() == 2 {
                                full = true;
                            } else {
                                next.push(p[2..].to_vec());
                            }
                        }
                    } else if fp_glob(&p[0], k) {
                        if p.len() == 1 {
                            full = true;
                        } else {
                            next.push(p[1..].to_vec());
                        }
                    }
                }
                if full {
                    out.insert(k.clone(), x.clone());
                } else if !next.is_empty()
                    && let Some(f) = fp_include(x, &next)
                {
                    out.insert(k.clone(), f);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        Value::Array(a) => {
            let items: Vec<Value> = a.iter().filter_map(|x| fp_include(x, pats)).collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        _ => None,
    }
}

fn fp_exclude(v: &mut Value, pat: &[String]) {
    match v {
        Value::Object(m) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                if fp_glob(&pat[0], &k) {
                    if pat.len() == 1 {
                        m.remove(&k);
                    } else if let Some(x) = m.get_mut(&k) {
                        fp_exclude(x, &pat[1..]);
                    }
                }
            }
        }
        Value::Array(a) => {
            for x in a {
                fp_exclude(x, pat);
            }
        }
        _ => {}
    }
}

pub fn filter_path(v: Value, spec: &str) -> Value {
    let mut inc = Vec::new();
    let mut exc = Vec::new();
    for p in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match p.strip_prefix('-') {
            Some(e) => exc.push(e.split('.').map(str::to_string).collect::<Vec<_>>()),
            None => inc.push(p.split('.').map(str::to_string).collect::<Vec<_>>()),
        }
    }
    let mut v = if inc.is_empty() {
        v
    } else {
        fp_include(&v, &inc).unwrap_or_else(|| json!({}))
    };
    for e in &exc {
        fp_exclude(&mut v, e);
    }
    v
}
