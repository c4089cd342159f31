//! Search endpoints: `_search`, `_count` and point in time (open and close).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Shared;
use crate::error::{EsError, EsResult};
use crate::search::{self, SearchReq};
use crate::store::{Cluster, Pit, PitIndex, random_id};
use crate::target::Target;

use super::{Body, Outcome, Req, Resp, check_params, flag, parse_body, require_body};

pub(super) const PIT_WITH_INDICES: &str =
    "[indices] cannot be used with point in time. Do not specify any index with point in time.";

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
    let allow_no_indices = req
        .params
        .get("allow_no_indices")
        .is_none_or(|v| v != "false");
    resolve_targets(st, expr, flag(req, "ignore_unavailable"), allow_no_indices)
}

/// The indices an expression names (all without one), each as its last refresh left it.
pub(super) fn resolve_targets(
    st: &mut Cluster,
    expr: Option<&str>,
    ignore_unavailable: bool,
    allow_no_indices: bool,
) -> EsResult<Vec<Target>> {
    let names = st.resolve(expr.unwrap_or("_all"), ignore_unavailable, allow_no_indices)?;
    let mut out = Vec::new();
    for n in names {
        let ix = st.index_mut(&n)?;
        ix.on_search();
        out.push(Target {
            name: ix.name.clone(),
            uuid: ix.uuid.clone(),
            snap: ix.snapshot.clone(),
            mapping: ix.mapping.clone(),
            max_result_window: ix.max_result_window,
            shards: ix.shards,
        });
    }
    Ok(out)
}

pub(super) fn pit_targets(st: &mut Cluster, id: &str, ka: Option<&str>) -> EsResult<Vec<Target>> {
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
            uuid: pi.uuid.clone(),
            snap: pi.snap.clone(),
            mapping: pi.snap.mapping.clone(),
            max_result_window: pi.max_result_window,
            shards: pi.shards,
        })
        .collect())
}

pub(super) fn search(sh: &Shared, req: &Req, expr: Option<&str>) -> EsResult<Outcome> {
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
                    return Err(EsError::validation(&[PIT_WITH_INDICES.into()]));
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

pub(super) fn count(sh: &Shared, req: &Req, expr: Option<&str>) -> EsResult<Outcome> {
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
    if let Some(t) = req.params.get("terminate_after") {
        search::check_terminate_after(search::int_param("terminate_after", t)?)?;
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

pub(super) fn open_pit(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
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

pub(super) fn close_pit(sh: &Shared, req: &Req) -> EsResult<Outcome> {
    check_params(req, &[])?;
    let body = require_body(req)?;
    let id = body
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| EsError::validation(&["no pit id specified".into()]))?;
    decode_pit(id)?;
    let mut st = sh.state.lock();
    let now = Instant::now();
    // Elasticsearch frees one search context per shard of the point in time.
    let freed: u32 = match st.pits.remove(id) {
        Some(p) if p.expires > now => p.indices.iter().map(|pi| pi.shards).sum(),
        _ => 0,
    };
    Ok(if freed > 0 {
        Resp::ok(json!({"succeeded": true, "num_freed": freed}))
    } else {
        Resp::json(404, json!({"succeeded": false, "num_freed": 0}))
    }
    .into())
}
