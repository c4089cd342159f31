//! Single-document endpoints: get, mget, index/create, delete and update.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::Shared;
use crate::error::{EsError, EsResult};
use crate::search::SourceFilter;
use crate::store::{Index, PRIMARY_TERM, UpdateReq, random_id};

use super::{
    Outcome, Refresh, Req, Resp, cas_checks, check_params, finish_write, flag, long_param,
    refresh_param, require_body, write_json,
};

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

pub(super) fn get_doc(
    sh: &Shared,
    req: &Req,
    ixn: &str,
    id: &str,
    source_only: bool,
) -> EsResult<Outcome> {
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

pub(super) fn mget(sh: &Shared, req: &Req, default: Option<&str>) -> EsResult<Outcome> {
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

pub(super) fn index_doc(
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

pub(super) fn doc_parse_error(e: &serde_json::Error) -> EsError {
    let reason = format!("[{}:{}] failed to parse: {e}", e.line(), e.column());
    EsError::new(400, "document_parsing_exception", reason)
        .caused_by(json!({"type": "json_parse_exception", "reason": e.to_string()}))
}

pub(super) fn delete_doc(sh: &Shared, req: &Req, ixn: &str, id: &str) -> EsResult<Outcome> {
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

pub(super) fn parse_update_body(
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

pub(super) fn update_doc(sh: &Shared, req: &Req, ixn: &str, id: &str) -> EsResult<Outcome> {
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
