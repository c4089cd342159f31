//! Single-document endpoints: get, mget, index/create, delete and update.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::Shared;
use crate::error::{EsError, EsResult};
use crate::hits::SourceFilter;
use crate::store::{Index, PRIMARY_TERM, UpdateReq, random_id};

use super::{
    Outcome, Refresh, Req, Resp, cas_checks, check_params, finish_write, flag, long_param,
    refresh_param, require_body, write_json,
};

/// What get and mget return of a document: its `_source` (filtered) and the stored fields
/// named by `stored_fields`.
#[derive(Clone)]
struct Fetch {
    src: SourceFilter,
    stored: Option<Vec<String>>,
}

impl Fetch {
    /// `explicit` is the `_source` filter the request gave, if any. With `stored_fields` and
    /// no explicit filter, the source comes back only if `_source` is one of the names (as
    /// in Elasticsearch: `stored_fields=count` alone returns `fields` without `_source`).
    fn new(explicit: Option<SourceFilter>, stored: Option<Vec<String>>) -> Fetch {
        let src = match (explicit, &stored) {
            (Some(f), _) => f,
            (None, Some(names)) if !names.iter().any(|n| n == "_source") => SourceFilter {
                fetch: false,
                ..SourceFilter::all()
            },
            (None, _) => SourceFilter::all(),
        };
        Fetch { src, stored }
    }
}

/// `stored_fields` in a URL: a comma list.
fn stored_param(req: &Req) -> Option<Vec<String>> {
    req.params.get("stored_fields").map(|v| {
        v.split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    })
}

fn doc_json(ix: &Index, d: &crate::store::Doc, fetch: &Fetch) -> EsResult<Value> {
    let mut m = Map::new();
    m.insert("_index".into(), json!(ix.name));
    m.insert("_id".into(), json!(&*d.id));
    m.insert("_version".into(), json!(d.version));
    m.insert("_seq_no".into(), json!(d.seq_no));
    m.insert("_primary_term".into(), json!(PRIMARY_TERM));
    m.insert("found".into(), json!(true));
    if let Some(s) = fetch.src.apply(&d.source) {
        m.insert("_source".into(), s);
    }
    if let Some(names) = &fetch.stored {
        for n in names {
            ix.mapping.check_stored_field(n)?;
        }
        let source: Value = serde_json::from_str(&d.source).unwrap_or(Value::Null);
        let fields = ix.mapping.stored_fields(&source, names);
        if !fields.is_empty() {
            m.insert("fields".into(), Value::Object(fields));
        }
    }
    Ok(Value::Object(m))
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
    const GET_PARAMS: &[&str] = &[
        "realtime",
        "refresh",
        "routing",
        "preference",
        "_source",
        "_source_includes",
        "_source_excludes",
        "version",
        "version_type",
        "stored_fields",
    ];
    // `GET _source` has no stored fields.
    let n = GET_PARAMS.len() - usize::from(source_only);
    check_params(req, &GET_PARAMS[..n])?;
    let realtime = req.params.get("realtime").is_none_or(|v| v != "false");
    let fetch = Fetch::new(source_params(req), stored_param(req));
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
            Some(d) => Ok(Resp::ok(fetch.src.apply(&d.source).unwrap_or(Value::Null)).into()),
            None => Err(EsError::new(
                404,
                "resource_not_found_exception",
                format!("Document not found [{ixn}]/[{id}]"),
            )),
        };
    }
    Ok(match doc {
        Some(d) => Resp::ok(doc_json(ix, &d, &fetch)?),
        None => Resp::json(404, json!({"_index": ix.name, "_id": id, "found": false})),
    }
    .into())
}

/// The `_source` filter of the URL's `_source`, `_source_includes`, `_source_excludes`.
fn source_params(req: &Req) -> Option<SourceFilter> {
    SourceFilter::from_params(
        req.params.get("_source").map(String::as_str),
        req.params.get("_source_includes").map(String::as_str),
        req.params.get("_source_excludes").map(String::as_str),
    )
}

/// One document of an mget.
struct MgetItem {
    index: Option<String>,
    id: String,
    fetch: Fetch,
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
    let items = mget_items(req, &body, default)?;
    let mut st = sh.state.lock();
    if flag(req, "refresh") {
        for it in &items {
            if let Some(ix) = it.index.as_ref().and_then(|n| st.indices.get_mut(n)) {
                ix.refresh();
            }
        }
    }
    let docs: Vec<Value> = items
        .iter()
        .map(|it| {
            let (ixn, id) = (it.index.as_deref().unwrap_or_default(), &it.id);
            let Some(ix) = st.indices.get(ixn) else {
                return json!({"_index": ixn, "_id": id, "error": EsError::index_not_found(ixn).error_object()});
            };
            match lookup(ix, id, realtime).map(|d| doc_json(ix, &d, &it.fetch)) {
                Some(Ok(v)) => v,
                Some(Err(e)) => json!({"_index": ix.name, "_id": id, "error": e.error_object()}),
                None => json!({"_index": ix.name, "_id": id, "found": false}),
            }
        })
        .collect();
    Ok(Resp::ok(json!({"docs": docs})).into())
}

/// The documents an mget body names (`docs` or `ids`), validated as Elasticsearch does.
fn mget_items(req: &Req, body: &Value, default: Option<&str>) -> EsResult<Vec<MgetItem>> {
    let defaults = Fetch::new(source_params(req), stored_param(req));
    let mut items: Vec<MgetItem> = Vec::new();
    let obj = body
        .as_object()
        .ok_or_else(|| EsError::parsing("Unexpected token"))?;
    for (k, v) in obj {
        match k.as_str() {
            "docs" => {
                for d in v.as_array().ok_or_else(|| {
                    EsError::parsing("docs array element should include an object")
                })? {
                    items.push(mget_doc(d, default, req, &defaults)?);
                }
            }
            "ids" => {
                for i in v
                    .as_array()
                    .ok_or_else(|| EsError::parsing("ids array element should only contain ids"))?
                {
                    let id = i.as_str().map_or_else(|| i.to_string(), str::to_string);
                    let index = default.map(str::to_string);
                    items.push(MgetItem {
                        index,
                        id,
                        fetch: defaults.clone(),
                    });
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
    for (i, it) in items.iter().enumerate() {
        if it.index.is_none() {
            msgs.push(format!("index is missing for doc {i}"));
        }
        if it.id.is_empty() {
            msgs.push(format!("id is missing for doc {i}"));
        }
    }
    if !msgs.is_empty() {
        return Err(EsError::validation(&msgs));
    }
    Ok(items)
}

/// One element of `docs`: its own `_index`, `_source` and `stored_fields` override the URL's.
fn mget_doc(d: &Value, default: Option<&str>, req: &Req, defaults: &Fetch) -> EsResult<MgetItem> {
    let o = d
        .as_object()
        .ok_or_else(|| EsError::parsing("docs array element should include an object"))?;
    let mut src = source_params(req);
    let mut stored = defaults.stored.clone();
    let mut index = default.map(str::to_string);
    let mut id = String::new();
    for (dk, dv) in o {
        match dk.as_str() {
            "_index" => index = dv.as_str().map(str::to_string),
            "_id" => id = dv.as_str().map_or_else(|| dv.to_string(), str::to_string),
            "_source" => src = Some(SourceFilter::from_json(dv)?),
            // A string is one name (not a comma list), as in Elasticsearch.
            "stored_fields" => {
                stored = Some(match dv {
                    Value::Array(a) => a
                        .iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect(),
                    other => vec![
                        other
                            .as_str()
                            .map_or_else(|| other.to_string(), str::to_string),
                    ],
                })
            }
            "routing" | "version" | "version_type" => {}
            other => {
                return Err(EsError::parsing(format!(
                    "Unknown key for a {} in [{other}].",
                    crate::query::json_token(dv)
                )));
            }
        }
    }
    Ok(MgetItem {
        index,
        id,
        fetch: Fetch::new(src, stored),
    })
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
