//! The `_msearch` endpoint: header and body line pairs, each run as a search.
//!
//! As in Elasticsearch 9.5.3: a body that does not parse (unknown query, negative size, an
//! unknown header key) or a point in time next to an index fails the whole request; any
//! other failure (a missing index, a shard failure, an expired point in time) is that
//! search's answer, with its status, in `responses`.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::{Map, Value};

use crate::Shared;
use crate::error::{EsError, EsResult};
use crate::search::{self, SearchReq};

use super::search_endpoints::{PIT_WITH_INDICES, pit_targets, resolve_targets};
use super::{Body, Outcome, Req, Resp, check_params, flag};

const MSEARCH_PARAMS: &[&str] = &[
    "rest_total_hits_as_int",
    "typed_keys",
    "search_type",
    "max_concurrent_searches",
    "max_concurrent_shard_requests",
    "pre_filter_shard_size",
    "ccs_minimize_roundtrips",
    "ignore_unavailable",
    "allow_no_indices",
    "expand_wildcards",
    "ignore_throttled",
    "routing",
    "include_named_queries_score",
];

/// Header keys Elasticsearch accepts; only the index options change anything here.
const HEADER_KEYS: &[&str] = &[
    "index",
    "indices",
    "search_type",
    "preference",
    "routing",
    "request_cache",
    "allow_no_indices",
    "ignore_unavailable",
    "expand_wildcards",
    "allow_partial_search_results",
    "ccs_minimize_roundtrips",
    "ignore_throttled",
];

/// One search of the request.
struct Item {
    index: Option<String>,
    ignore_unavailable: bool,
    allow_no_indices: bool,
    req: SearchReq,
}

pub(super) fn msearch(sh: &Shared, req: &Req, default: Option<&str>) -> EsResult<Outcome> {
    check_params(req, MSEARCH_PARAMS)?;
    if flag(req, "typed_keys") {
        return Err(EsError::unsupported("typed_keys"));
    }
    let start = Instant::now();
    let items = parse_body(req, default)?;
    let responses: Vec<String> = items
        .iter()
        .map(|it| run(sh, it))
        .collect::<EsResult<_>>()?;
    let body = format!(
        "{{\"took\":{},\"responses\":[{}]}}",
        start.elapsed().as_millis(),
        responses.join(",")
    );
    Ok(Resp {
        status: 200,
        body: Body::Text(body),
    }
    .into())
}

fn parse_body(req: &Req, default: Option<&str>) -> EsResult<Vec<Item>> {
    if req.body.is_empty() {
        return Err(EsError::new(
            400,
            "parse_exception",
            "request body or source parameter is required",
        ));
    }
    if !req.body.ends_with(b"\n") {
        return Err(EsError::bad_request(
            "The msearch request must be terminated by a newline [\n]",
        ));
    }
    let text = std::str::from_utf8(&req.body)
        .map_err(|_| EsError::bad_request("msearch body is not valid UTF-8"))?;
    let lines: Vec<&str> = text.split('\n').map(|l| l.trim_end_matches('\r')).collect();
    // Pairs of lines; a header without its body at the end is dropped, as in Elasticsearch.
    let mut items = Vec::new();
    for pair in lines[..lines.len() - 1].chunks_exact(2) {
        items.push(parse_item(req, default, pair[0], pair[1])?);
    }
    let mut msgs = Vec::new();
    if items.is_empty() {
        msgs.push("no requests added".to_string());
    }
    for it in &items {
        if it.req.pit.is_some() && it.index.is_some() {
            msgs.push(PIT_WITH_INDICES.into());
        }
    }
    if !msgs.is_empty() {
        return Err(EsError::validation(&msgs));
    }
    Ok(items)
}

fn parse_item(req: &Req, default: Option<&str>, header: &str, body: &str) -> EsResult<Item> {
    let header: Map<String, Value> = if header.trim().is_empty() {
        Map::new()
    } else {
        serde_json::from_str(header).map_err(|e| EsError::json_parse(&e))?
    };
    let mut it = Item {
        index: default.map(str::to_string),
        ignore_unavailable: flag(req, "ignore_unavailable"),
        allow_no_indices: req
            .params
            .get("allow_no_indices")
            .is_none_or(|v| v != "false"),
        req: SearchReq::parse(None, &HashMap::new())?,
    };
    for (k, v) in &header {
        let text = || match v {
            Value::Array(a) => a
                .iter()
                .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(","),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        match k.as_str() {
            "index" | "indices" => it.index = Some(text()),
            "ignore_unavailable" => it.ignore_unavailable = text() == "true",
            "allow_no_indices" => it.allow_no_indices = text() != "false",
            k if HEADER_KEYS.contains(&k) => {}
            other => {
                return Err(EsError::bad_request(format!(
                    "key [{other}] is not supported in the metadata section"
                )));
            }
        }
    }
    let body: Option<Value> = if body.trim().is_empty() {
        None
    } else {
        Some(serde_json::from_str(body).map_err(|e| EsError::json_parse(&e))?)
    };
    it.req = SearchReq::parse(body.as_ref(), &req.params)?;
    Ok(it)
}

/// Runs one search; its answer (or error) with `status`, as one entry of `responses`. A
/// query that does not parse fails the whole request (Elasticsearch parses every body first).
fn run(sh: &Shared, it: &Item) -> EsResult<String> {
    let start = Instant::now();
    let targets = {
        let mut st = sh.state.lock();
        match &it.req.pit {
            Some((id, ka)) => pit_targets(&mut st, id, ka.as_deref()),
            None => resolve_targets(
                &mut st,
                it.index.as_deref(),
                it.ignore_unavailable,
                it.allow_no_indices,
            ),
        }
    };
    let pit_id = it.req.pit.as_ref().map(|(id, _)| id.as_str());
    let out = targets.and_then(|t| search::execute(&t, &it.req, pit_id.is_some(), start, pit_id));
    match out {
        Ok(o) => {
            let body = o.body.strip_suffix('}').unwrap_or(&o.body);
            Ok(format!("{body},\"status\":200}}"))
        }
        Err(e) if e.kind == "parsing_exception" || e.kind == "x_content_parse_exception" => Err(e),
        Err(e) => Ok(e.to_body().to_string()),
    }
}
