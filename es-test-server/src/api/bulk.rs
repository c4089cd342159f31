//! The `_bulk` endpoint: parsing the NDJSON body and running each item.
//!
//! Parsing follows Elasticsearch's `BulkRequestParser`: an action line, then (except for
//! `delete`) a source line. Malformed action lines and request-level validation errors fail
//! the whole request; everything else fails per item.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::{Map, Value, json};

use crate::Shared;
use crate::error::{EsError, EsResult};
use crate::query::json_token;
use crate::store::{Cluster, UpdateReq, WriteOk, random_id};

use super::docs::{doc_parse_error, parse_update_body};
use super::{Outcome, Refresh, Req, Resp, cas_checks, check_params, refresh_param, write_json};

const BULK_PARAMS: &[&str] = &[
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
];

#[derive(Clone, Copy, PartialEq)]
enum Action {
    Index,
    Create,
    Delete,
    Update,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Index => "index",
            Action::Create => "create",
            Action::Delete => "delete",
            Action::Update => "update",
        }
    }
}

enum BulkOp {
    Index {
        create: bool,
        source: Result<(Arc<str>, Value), EsError>,
    },
    Delete,
    Update(Result<UpdateReq, EsError>),
}

struct BulkItem {
    action: Action,
    index: String,
    id: Option<String>,
    cas: Option<(i64, i64)>,
    op: BulkOp,
}

/// The metadata of one action line (`{"index": {"_index": ..., "_id": ..., ...}}`).
struct ActionMeta {
    index: Option<String>,
    id: Option<String>,
    seq: Option<i64>,
    term: Option<i64>,
    version: Option<String>,
    version_type: Option<String>,
    retry: i64,
}

pub(super) fn bulk(sh: &Shared, req: &Req, default: Option<&str>) -> EsResult<Outcome> {
    check_params(req, BULK_PARAMS)?;
    if req.params.get("pipeline").is_some_and(|p| p != "_none") {
        return Err(EsError::unsupported("ingest pipelines"));
    }
    let refresh = refresh_param(req)?;
    let start = Instant::now();
    let items = parse_body(&req.body, default)?;
    let mut st = sh.state.lock();
    // Per index, the highest sequence number written (what refresh=wait_for waits for).
    let mut touched: HashMap<String, i64> = HashMap::new();
    let mut errors = false;
    // A primary that died after replicating: Elasticsearch runs the items again on the
    // promoted copy and answers that second run (see `EsTestServer::replay_next_bulks`).
    let replay = sh
        .replay_bulks
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok();
    // Overtaken writes are a batch's (see `EsTestServer::overtake_next_items`).
    let batch = items.iter().filter(|it| it.cas.is_some()).count() >= 2;
    let out: Vec<Value> = items
        .iter()
        .map(|it| {
            if replay {
                let _ = run_item(&mut st, it);
            }
            if batch && it.cas.is_some() {
                overtake(sh, req, &mut st, it);
            }
            let (id, r) = run_item(&mut st, it);
            if let Ok(w) = &r
                && w.result != "noop"
            {
                let e = touched.entry(it.index.clone()).or_insert(-1);
                *e = (*e).max(w.seq_no);
            }
            errors |= r.is_err();
            item_answer(&st, it, id, &r, refresh)
        })
        .collect();
    let resp = Resp::ok(
        json!({"errors": errors, "took": start.elapsed().as_millis() as u64, "items": out}),
    );
    Ok(finish(&mut st, refresh, &touched, resp))
}

/// Splits the body into items; request-level validation messages are gathered and reported
/// together as Elasticsearch does (`Validation Failed: 1: ...;`).
fn parse_body(body: &[u8], default: Option<&str>) -> EsResult<Vec<BulkItem>> {
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
        let (action, meta) = parse_action_line(line, line_no)?;
        let meta = parse_meta(&meta, line_no, default)?;
        let source = if action == Action::Delete {
            None
        } else if i < lines.len() {
            i += 1;
            Some(lines[i - 1].trim_end_matches('\r'))
        } else {
            // An action line without its source line at the very end is dropped, as
            // Elasticsearch's parser stops there.
            break;
        };
        items.push(parse_item(action, meta, source, &mut msgs)?);
    }
    if items.is_empty() {
        msgs.push("no requests added".into());
    }
    if !msgs.is_empty() {
        return Err(EsError::validation(&msgs));
    }
    Ok(items)
}

fn malformed(line_no: usize, what: impl std::fmt::Display) -> EsError {
    EsError::bad_request(format!(
        "Malformed action/metadata line [{line_no}], {what}"
    ))
}

/// `{"<action>": {<metadata>}}`: exactly one field naming the action, whose value is an object.
fn parse_action_line(line: &str, line_no: usize) -> EsResult<(Action, Map<String, Value>)> {
    let action: Value = serde_json::from_str(line).map_err(|e| {
        let found = if line.trim_start().starts_with('{') {
            e.to_string()
        } else {
            "VALUE_STRING".into()
        };
        malformed(
            line_no,
            format!("expected START_OBJECT or END_OBJECT but found [{found}]"),
        )
    })?;
    let obj = match action {
        Value::Object(o) => o,
        other => {
            return Err(malformed(
                line_no,
                format!("expected START_OBJECT but found [{}]", json_token(&other)),
            ));
        }
    };
    let mut fields = obj.into_iter();
    let (name, meta) = match (fields.next(), fields.next()) {
        (None, _) => {
            return Err(malformed(
                line_no,
                "expected FIELD_NAME but found [END_OBJECT]",
            ));
        }
        (Some(_), Some(_)) => {
            return Err(malformed(
                line_no,
                "expected END_OBJECT but found [FIELD_NAME]",
            ));
        }
        (Some(f), None) => f,
    };
    let action = match name.as_str() {
        "index" => Action::Index,
        "create" => Action::Create,
        "delete" => Action::Delete,
        "update" => Action::Update,
        other => {
            return Err(malformed(
                line_no,
                format!(
                    "expected field [create], [delete], [index] or [update] but found [{other}]"
                ),
            ));
        }
    };
    match meta {
        Value::Object(m) => Ok((action, m)),
        other => Err(malformed(
            line_no,
            format!(
                "expected START_OBJECT or END_OBJECT but found [{}]",
                json_token(&other)
            ),
        )),
    }
}

fn parse_meta(
    meta: &Map<String, Value>,
    line_no: usize,
    default: Option<&str>,
) -> EsResult<ActionMeta> {
    let as_i64 = |v: &Value| {
        v.as_i64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    };
    let mut m = ActionMeta {
        index: default.map(str::to_string),
        id: None,
        seq: None,
        term: None,
        version: None,
        version_type: None,
        retry: 0,
    };
    for (k, v) in meta {
        match k.as_str() {
            "_index" => m.index = v.as_str().map(str::to_string),
            "_id" => {
                m.id = Some(
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string()),
                )
            }
            "if_seq_no" => m.seq = as_i64(v),
            "if_primary_term" => m.term = as_i64(v),
            "version" => m.version = Some(v.to_string()),
            "version_type" => m.version_type = v.as_str().map(str::to_string),
            "retry_on_conflict" => m.retry = as_i64(v).unwrap_or(0),
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
    Ok(m)
}

/// Validates one item and parses its source line. Validation messages go to `msgs`; a
/// source that does not parse fails only this item (when it runs).
fn parse_item(
    action: Action,
    meta: ActionMeta,
    source: Option<&str>,
    msgs: &mut Vec<String>,
) -> EsResult<BulkItem> {
    let cas = cas_checks(
        meta.id.as_deref(),
        meta.seq,
        meta.term,
        meta.version.as_deref(),
        meta.version_type.as_deref(),
        action == Action::Create,
        msgs,
    )?;
    if meta.index.is_none() {
        msgs.push("index is missing".into());
    }
    // An empty id fails an index or create item alone (in index_item); delete and update
    // need an id, so for them it is missing.
    let no_id = meta.id.as_deref().is_none_or(str::is_empty);
    if matches!(action, Action::Delete | Action::Update) && no_id {
        msgs.push("id is missing".into());
    }
    let src = source.unwrap_or_default();
    let op = match action {
        Action::Delete => BulkOp::Delete,
        Action::Update => BulkOp::Update(match serde_json::from_str::<Value>(src) {
            Ok(v) => Ok(parse_update_body(&v, cas, meta.retry, msgs)?),
            Err(e) => Err(EsError::json_parse(&e)),
        }),
        Action::Index | Action::Create => BulkOp::Index {
            create: action == Action::Create,
            source: if src.trim().is_empty() {
                Err(EsError::new(
                    400,
                    "document_parsing_exception",
                    "[0:0] failed to parse, document is empty",
                ))
            } else {
                serde_json::from_str::<Value>(src)
                    .map(|v| (Arc::from(src.trim()), v))
                    .map_err(|e| doc_parse_error(&e))
            },
        },
    };
    Ok(BulkItem {
        action,
        index: meta.index.unwrap_or_default(),
        id: meta.id,
        cas,
        op,
    })
}

/// Runs one item. The id is returned with the outcome: an item without `_id` gets its
/// generated id once its index is resolved, so later failures name it, as in Elasticsearch.
/// Another writer's write of `it`'s document, just before `it` runs, if one is still
/// asked for (see `EsTestServer::overtake_next_items`): the document as it stands,
/// written again (a new sequence number, the same source).
fn overtake(sh: &Shared, req: &Req, st: &mut Cluster, it: &BulkItem) {
    let Some(id) = it.id.as_deref() else { return };
    let (index, of) = &*sh.overtake_of.lock();
    if *index != it.index
        || of
            .as_ref()
            .is_some_and(|of| req.opaque_id.as_ref() != Some(of))
    {
        return;
    }
    let Ok(ix) = st.index_mut(&it.index) else {
        return;
    };
    let Some(doc) = ix.live.get(id).cloned() else {
        return;
    };
    if sh
        .overtake_items
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_err()
    {
        return;
    }
    let src: Value = serde_json::from_str(&doc.source).expect("stored sources are JSON");
    let _ = ix.put(id, doc.source.clone(), &src, false, None);
}

fn run_item(st: &mut Cluster, it: &BulkItem) -> (Option<String>, EsResult<WriteOk>) {
    match &it.op {
        BulkOp::Delete => delete_item(st, it),
        BulkOp::Index { create, source } => index_item(st, it, *create, source),
        BulkOp::Update(u) => update_item(st, it, u),
    }
}

fn delete_item(st: &mut Cluster, it: &BulkItem) -> (Option<String>, EsResult<WriteOk>) {
    let id = it.id.clone().unwrap_or_default();
    let r = st
        .index_mut(&it.index)
        .and_then(|ix| ix.delete(&id, it.cas));
    (Some(id), r)
}

fn index_item(
    st: &mut Cluster,
    it: &BulkItem,
    create: bool,
    source: &Result<(Arc<str>, Value), EsError>,
) -> (Option<String>, EsResult<WriteOk>) {
    // The index is auto-created before the item is looked at, as in Elasticsearch.
    let ix = match st.index_for_write(&it.index) {
        Ok(ix) => ix,
        Err(e) => return (it.id.clone(), Err(e)),
    };
    if it.id.as_deref() == Some("") {
        let e = EsError::bad_request("if _id is specified it must not be empty");
        return (it.id.clone(), Err(e));
    }
    let id = it.id.clone().unwrap_or_else(|| random_id(20));
    let r = source
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|(raw, v)| ix.put(&id, raw.clone(), v, create, it.cas));
    (Some(id), r)
}

fn update_item(
    st: &mut Cluster,
    it: &BulkItem,
    u: &Result<UpdateReq, EsError>,
) -> (Option<String>, EsResult<WriteOk>) {
    let id = it.id.clone().unwrap_or_default();
    let r = u.as_ref().map_err(Clone::clone).and_then(|u| {
        let ix = st.index_for_write(&it.index)?;
        ix.update(&id, u)
    });
    (Some(id), r)
}

/// One entry of `items`: the write's answer with its status, or the item's error.
fn item_answer(
    st: &Cluster,
    it: &BulkItem,
    id: Option<String>,
    r: &EsResult<WriteOk>,
    refresh: Refresh,
) -> Value {
    let v = match r {
        Ok(w) => {
            let ix = &st.indices[&it.index];
            let id = id.as_deref().unwrap_or_default();
            let mut v = write_json(ix, id, w, refresh == Refresh::Now);
            v.as_object_mut()
                .expect("obj")
                .insert("status".into(), json!(w.status));
            v
        }
        Err(e) => json!({
            "_index": it.index,
            "_id": id,
            "status": e.status,
            "error": e.flat(),
        }),
    };
    let mut entry = Map::new();
    entry.insert(it.action.name().into(), v);
    Value::Object(entry)
}

/// Applies the request's `refresh`: now, or an answer that waits for the next refresh of
/// every index written.
fn finish(
    st: &mut Cluster,
    refresh: Refresh,
    touched: &HashMap<String, i64>,
    resp: Resp,
) -> Outcome {
    match refresh {
        Refresh::Now => {
            for n in touched.keys() {
                if let Some(ix) = st.indices.get_mut(n) {
                    ix.refresh();
                }
            }
            resp.into()
        }
        Refresh::WaitFor => {
            let waits = touched
                .iter()
                .filter_map(|(n, seq)| st.indices.get(n).map(|ix| (ix.refreshed.subscribe(), *seq)))
                .collect();
            Outcome::WaitFor(waits, resp)
        }
        Refresh::No => resp.into(),
    }
}
