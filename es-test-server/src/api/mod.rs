//! REST endpoints: request and response types, routing, parameter checks and the helpers the
//! handlers share. The handlers live in the submodules, one per group of endpoints.

mod bulk;
mod docs;
mod filter_path;
mod indices;
mod msearch;
mod search_endpoints;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::Shared;
use crate::error::{EsError, EsResult};
use crate::store::{Index, PRIMARY_TERM, WriteOk};

use self::bulk::bulk;
use self::docs::{delete_doc, get_doc, index_doc, mget, update_doc};
pub(crate) use self::filter_path::filter_path;
use self::indices::{
    create_index, delete_index, get_index, get_mapping, get_settings, head_index, put_mapping,
    put_settings, refresh,
};
use self::msearch::msearch;
use self::search_endpoints::{close_pit, count, open_pit, search};

pub(crate) struct Req {
    pub method: String,
    pub path: String,
    pub segs: Vec<String>,
    pub params: HashMap<String, String>,
    pub body: bytes::Bytes,
    /// The `X-Opaque-Id` header: who sent it (fault injection may pick requests by it).
    pub opaque_id: Option<String>,
}

pub(crate) enum Body {
    Json(Value),
    Text(String),
    Empty,
}

pub(crate) struct Resp {
    pub status: u16,
    pub body: Body,
}

impl Resp {
    pub(crate) fn json(status: u16, v: Value) -> Resp {
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

pub(crate) enum Outcome {
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

pub(crate) fn dispatch(sh: &Shared, req: &Req) -> EsResult<Outcome> {
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
        ["_msearch"] => {
            methods!("GET" => msearch(sh, req, None), "POST" => msearch(sh, req, None))
        }
        ["_refresh"] => {
            methods!("GET" => refresh(sh, req, "_all"), "POST" => refresh(sh, req, "_all"))
        }
        ["_pit"] => methods!("DELETE" => close_pit(sh, req)),
        ["_mapping"] => methods!("GET" => get_mapping(sh, req, "_all")),
        ["_settings"] => methods!("GET" => get_settings(sh, req, "_all")),
        // Aliases are not implemented: say so rather than "no handler".
        ["_aliases" | "_alias"]
        | ["_alias", _]
        | [_, "_alias" | "_aliases"]
        | [_, "_alias" | "_aliases", _] => Err(EsError::unsupported("aliases")),
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
        [ix, "_msearch"] => {
            methods!("GET" => msearch(sh, req, Some(ix)), "POST" => msearch(sh, req, Some(ix)))
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
