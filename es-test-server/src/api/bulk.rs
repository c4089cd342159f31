//! The `_bulk` endpoint: parsing the NDJSON body and running each item.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value, json};

use crate::Shared;
use crate::error::{EsError, EsResult};
use crate::store::{Cluster, UpdateReq, WriteOk, random_id};

use super::docs::{doc_parse_error, parse_update_body};
use super::{Outcome, Refresh, Req, Resp, cas_checks, check_params, refresh_param, write_json};

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

pub(super) fn bulk(sh: &Shared, req: &Req, default: Option<&str>) -> EsResult<Outcome> {
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
