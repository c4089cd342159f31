//! Search execution over snapshots: matching, sorting, `search_after`, paging and
//! aggregations (what a hit is and how it is rendered is `hits`).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::error::{EsError, EsResult};
use crate::hits::{HitOpts, Match, SourceFilter, as_usize, hit_json};
use crate::query::{Ctx, Q, json_token};
use crate::sort::{SV, SortSpec, after_value, cmp_keys, compile_sort, field_sv, sort_values_json};
use crate::store::Doc;
use crate::target::Target;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum TrackTotal {
    Off,
    Upto(u64),
    Exact,
}

#[derive(Debug, Clone)]
pub(crate) struct SearchReq {
    pub query: Option<Value>,
    pub post_filter: Option<Value>,
    pub size: usize,
    pub from: usize,
    pub sort: Option<Value>,
    pub search_after: Option<Vec<Value>>,
    pub source: SourceFilter,
    pub track_total: TrackTotal,
    pub seq_no_primary_term: bool,
    pub version: bool,
    pub aggs: Option<Value>,
    pub track_scores: bool,
    pub min_score: Option<f32>,
    pub pit: Option<(String, Option<String>)>,
    pub total_as_int: bool,
    /// `stored_fields`: the stored fields returned as `fields`; `_none_` leaves out `_id` too.
    pub stored_fields: Option<Vec<String>>,
    /// `docvalue_fields`: each field's name and `format`, returned in `fields`.
    pub docvalue_fields: Vec<(String, Option<String>)>,
}

/// An integer URL parameter, refused as Elasticsearch refuses it.
pub(crate) fn int_param(key: &str, v: &str) -> EsResult<i64> {
    v.parse::<i32>().map(i64::from).map_err(|_| {
        EsError::bad_request(format!(
            "Failed to parse int parameter [{key}] with value [{v}]"
        ))
        .caused_by(json!({"type": "number_format_exception", "reason": format!("For input string: \"{v}\"")}))
    })
}

/// `terminate_after`: 0 (the default) is accepted; a negative value is refused with
/// Elasticsearch's message (before the indices are resolved, as there); stopping early is
/// not implemented.
pub(crate) fn check_terminate_after(n: i64) -> EsResult<()> {
    match n {
        0 => Ok(()),
        n if n < 0 => Err(EsError::bad_request("terminateAfter must be > 0")),
        _ => Err(EsError::unsupported("terminate_after")),
    }
}

/// `stored_fields` in a search body: one name or a list of names.
fn stored_fields_json(v: &Value) -> EsResult<Vec<String>> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(a) => Ok(a
            .iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
            .collect()),
        other => Err(EsError::parsing(format!(
            "Expected [VALUE_STRING] or [START_ARRAY] in [stored_fields] but found [{}]",
            json_token(other)
        ))),
    }
}

/// `docvalue_fields` in a search body: names, or `{"field", "format"}` objects. Patterns
/// (`*`) are not implemented.
fn docvalue_fields_json(v: &Value) -> EsResult<Vec<(String, Option<String>)>> {
    let items = v.as_array().ok_or_else(|| {
        EsError::parsing(format!(
            "[search_source] docvalue_fields doesn't support values of type: {}",
            json_token(v)
        ))
    })?;
    let mut out = Vec::new();
    for item in items {
        let (name, format) = match item {
            Value::String(n) => (n.clone(), None),
            Value::Object(o) => match o.get("field").and_then(Value::as_str) {
                Some(n) => (
                    n.to_string(),
                    o.get("format").and_then(Value::as_str).map(str::to_string),
                ),
                None => return Err(EsError::parsing("[field_and_format] required [field]")),
            },
            other => {
                return Err(EsError::parsing(format!(
                    "[search_source] docvalue_fields doesn't support values of type: {}",
                    json_token(other)
                )));
            }
        };
        if name.contains('*') {
            return Err(EsError::unsupported("patterns in [docvalue_fields]"));
        }
        out.push((name, format));
    }
    Ok(out)
}

impl SearchReq {
    /// With `stored_fields`, `_source` comes back only when asked for (explicitly, or as the
    /// name `_source`), and `_none_` stands alone, as in Elasticsearch.
    fn apply_stored_fields(&mut self, source_explicit: bool) -> EsResult<()> {
        let Some(names) = &self.stored_fields else {
            return Ok(());
        };
        if names.iter().any(|n| n == "_none_") {
            if names.len() > 1 {
                return Err(EsError::bad_request(
                    "cannot combine _none_ with other fields",
                ));
            }
            if source_explicit && self.source.fetch {
                return Err(EsError::validation(&[
                    "[stored_fields] cannot be disabled if [_source] is requested".into(),
                ]));
            }
        }
        if !source_explicit && !names.iter().any(|n| n == "_source") {
            self.source.fetch = false;
        }
        Ok(())
    }

    pub(crate) fn parse(
        body: Option<&Value>,
        params: &HashMap<String, String>,
    ) -> EsResult<SearchReq> {
        let mut r = SearchReq {
            query: None,
            post_filter: None,
            size: 10,
            from: 0,
            sort: None,
            search_after: None,
            source: SourceFilter::all(),
            track_total: TrackTotal::Upto(10_000),
            seq_no_primary_term: false,
            version: false,
            aggs: None,
            track_scores: false,
            min_score: None,
            pit: None,
            total_as_int: false,
            stored_fields: None,
            docvalue_fields: Vec::new(),
        };
        let mut source_explicit = false;
        if let Some(body) = body {
            let obj = body.as_object().ok_or_else(|| {
                EsError::parsing("Expected [START_OBJECT] but found [START_ARRAY]")
            })?;
            for (k, v) in obj {
                r.body_key(k, v, &mut source_explicit)?;
            }
        }
        r.url_params(params, &mut source_explicit)?;
        r.apply_stored_fields(source_explicit)?;
        if r.search_after.is_some() && r.from > 0 {
            return Err(EsError::validation(&[
                "`from` parameter must be set to 0 when `search_after` is used.".into(),
            ]));
        }
        Ok(r)
    }

    /// One key of the request body.
    fn body_key(&mut self, k: &str, v: &Value, source_explicit: &mut bool) -> EsResult<()> {
        match k {
            "query" => self.query = Some(v.clone()),
            "post_filter" => self.post_filter = Some(v.clone()),
            "size" => self.size = as_usize("size", v)?,
            "from" => self.from = as_usize("from", v)?,
            "sort" => self.sort = Some(v.clone()),
            "search_after" => {
                self.search_after = Some(match v {
                    Value::Array(a) => a.clone(),
                    other => vec![other.clone()],
                })
            }
            "_source" => {
                self.source = SourceFilter::from_json(v)?;
                *source_explicit = true;
            }
            "stored_fields" => self.stored_fields = Some(stored_fields_json(v)?),
            "docvalue_fields" => self.docvalue_fields = docvalue_fields_json(v)?,
            "track_total_hits" => self.track_total = track_total_json(v)?,
            "seq_no_primary_term" => self.seq_no_primary_term = v.as_bool().unwrap_or(false),
            "version" => self.version = v.as_bool().unwrap_or(false),
            "aggs" | "aggregations" => self.aggs = Some(v.clone()),
            "track_scores" => self.track_scores = v.as_bool().unwrap_or(false),
            "min_score" => self.min_score = v.as_f64().map(|f| f as f32),
            "pit" => {
                let id = v
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| EsError::parsing("[pit] failed to parse field [id]"))?;
                let ka = v
                    .get("keep_alive")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                self.pit = Some((id.to_string(), ka));
            }
            "timeout" | "stats" | "explain" | "profile" | "terminate_after" => {
                if k == "profile" && v.as_bool() == Some(true) {
                    return Err(EsError::unsupported("search profiling"));
                }
                if k == "explain" && v.as_bool() == Some(true) {
                    return Err(EsError::unsupported("explain"));
                }
                if k == "terminate_after" {
                    check_terminate_after(v.as_i64().unwrap_or(0))?;
                }
            }
            "highlight" | "collapse" | "rescore" | "suggest" | "knn" | "script_fields"
            | "fields" | "runtime_mappings" | "slice" | "indices_boost" | "rank" | "retriever"
            | "ext" => {
                return Err(EsError::unsupported(&format!("[{k}] in search requests")));
            }
            other => {
                return Err(EsError::parsing(format!(
                    "Unknown key for a {} in [{other}].",
                    json_token(v)
                ))
                .with("line", 1)
                .with("col", 1));
            }
        }
        Ok(())
    }

    /// The URL parameters, which win over the body.
    fn url_params(
        &mut self,
        params: &HashMap<String, String>,
        source_explicit: &mut bool,
    ) -> EsResult<()> {
        if let Some(s) = params.get("size") {
            self.size = as_usize("size", &Value::String(s.clone()))?;
        }
        if let Some(s) = params.get("from") {
            self.from = as_usize("from", &Value::String(s.clone()))?;
        }
        if let Some(t) = params.get("terminate_after") {
            check_terminate_after(int_param("terminate_after", t)?)?;
        }
        if let Some(s) = params.get("sort") {
            let specs: Vec<Value> = s
                .split(',')
                .filter(|x| !x.is_empty())
                .map(|x| match x.split_once(':') {
                    Some((f, o)) => json!({f: o}),
                    None => json!(x),
                })
                .collect();
            self.sort = Some(Value::Array(specs));
        }
        if let Some(f) = SourceFilter::from_params(
            params.get("_source").map(String::as_str),
            params.get("_source_includes").map(String::as_str),
            params.get("_source_excludes").map(String::as_str),
        ) {
            self.source = f;
            *source_explicit = true;
        }
        if let Some(v) = params.get("stored_fields") {
            self.stored_fields = Some(
                v.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            );
        }
        if params.contains_key("docvalue_fields") {
            return Err(EsError::unsupported("[docvalue_fields] in search requests"));
        }
        if let Some(t) = params.get("track_total_hits") {
            self.track_total = match t.as_str() {
                "true" | "" => TrackTotal::Exact,
                "false" => TrackTotal::Off,
                n => TrackTotal::Upto(n.parse().map_err(|_| {
                    EsError::bad_request(format!(
                        "Failed to parse int parameter [track_total_hits] with value [{n}]"
                    ))
                })?),
            };
        }
        if let Some(v) = params.get("seq_no_primary_term") {
            self.seq_no_primary_term = v == "true" || v.is_empty();
        }
        if let Some(v) = params.get("version") {
            self.version = v == "true" || v.is_empty();
        }
        if params.contains_key("q") {
            return Err(EsError::unsupported("the [q] (query string) parameter"));
        }
        if params
            .get("rest_total_hits_as_int")
            .is_some_and(|v| v == "true" || v.is_empty())
        {
            self.total_as_int = true;
            if self.track_total == TrackTotal::Upto(10_000) {
                self.track_total = TrackTotal::Exact;
            }
        }
        Ok(())
    }
}

/// `track_total_hits` in a body: a boolean or a number.
fn track_total_json(v: &Value) -> EsResult<TrackTotal> {
    Ok(match v {
        Value::Bool(true) => TrackTotal::Exact,
        Value::Bool(false) => TrackTotal::Off,
        Value::Number(n) => match n.as_i64() {
            Some(i) if i == i32::MAX as i64 => TrackTotal::Exact,
            Some(i) if i >= 0 => TrackTotal::Upto(i as u64),
            Some(-1) => TrackTotal::Off,
            _ => {
                return Err(EsError::bad_request(format!(
                    "[track_total_hits] parameter must be positive or equals to -1, got {n}"
                )));
            }
        },
        other => {
            return Err(EsError::parsing(format!(
                "Unknown key for a {} in [track_total_hits].",
                json_token(other)
            )));
        }
    })
}

// ---------------------------------------------------------------------------------------
// Matching

/// Parses the query for each target; parse errors are returned as they are, field-level
/// failures are wrapped as shard failures.
fn compile_queries(q: Option<&Value>, targets: &[Target]) -> EsResult<Vec<Q>> {
    let mut out = Vec::new();
    for t in targets {
        let ctx = Ctx {
            mapping: &t.mapping,
        };
        match q {
            None => out.push(Q::All(1.0)),
            Some(v) => match ctx.parse(v) {
                Ok(q) => out.push(q),
                Err(e)
                    if e.kind == "parsing_exception"
                        || e.kind == "illegal_argument_exception"
                            && e.reason.starts_with("es-test-server") =>
                {
                    return Err(e);
                }
                Err(mut e) => {
                    // Shard-level query failures name their index, as in Elasticsearch.
                    if e.kind == "query_shard_exception" && !e.extra.contains_key("index") {
                        e = e
                            .with("index_uuid", t.uuid.clone())
                            .with("index", t.name.clone());
                    }
                    return Err(EsError::search_phase(e, Some(&t.name)));
                }
            },
        }
    }
    Ok(out)
}

pub(crate) fn find_matches<'a>(
    targets: &'a [Target],
    query: Option<&Value>,
    min_score: Option<f32>,
) -> EsResult<Vec<Match<'a>>> {
    let qs = compile_queries(query, targets)?;
    let mut out = Vec::new();
    for (ti, t) in targets.iter().enumerate() {
        let q = &qs[ti];
        if q.is_none() {
            continue;
        }
        let mut check = |d: &'a Arc<Doc>| {
            if let Some(s) = q.eval(d, &t.name)
                && min_score.is_none_or(|m| s >= m)
            {
                out.push(Match {
                    ti,
                    doc: d,
                    score: s,
                });
            }
        };
        match q.candidates(&t.snap) {
            Some(positions) => positions
                .iter()
                .for_each(|&p| check(&t.snap.docs[p as usize])),
            None => t.snap.docs.iter().for_each(check),
        }
    }
    Ok(out)
}

pub(crate) fn shards_json(targets: &[Target]) -> Value {
    let n: u32 = targets.iter().map(|t| t.shards).sum();
    json!({"total": n, "successful": n, "skipped": 0, "failed": 0})
}

pub(crate) struct SearchOut {
    pub body: String,
}

fn total_json(n: usize, tt: TrackTotal, as_int: bool) -> Option<String> {
    match tt {
        TrackTotal::Off => None,
        TrackTotal::Exact => Some(if as_int {
            n.to_string()
        } else {
            format!("{{\"value\":{n},\"relation\":\"eq\"}}")
        }),
        TrackTotal::Upto(k) => {
            let (v, rel) = if n as u64 > k {
                (k as usize, "gte")
            } else {
                (n, "eq")
            };
            Some(if as_int {
                v.to_string()
            } else {
                format!("{{\"value\":{v},\"relation\":\"{rel}\"}}")
            })
        }
    }
}

/// A failure inside the search, wrapped as a shard failure unless it is a request error.
fn shard_failure(e: EsError, index: Option<&str>) -> EsError {
    if e.kind == "search_phase_execution_exception"
        || e.reason.starts_with("es-test-server")
        || e.kind == "parsing_exception"
        || e.kind == "x_content_parse_exception"
    {
        e
    } else {
        EsError::search_phase(e, index)
    }
}

fn check_window(targets: &[Target], req: &SearchReq) -> EsResult<()> {
    for t in targets {
        if req.from + req.size > t.max_result_window {
            return Err(EsError::search_phase(
                EsError::bad_request(format!(
                    "Result window is too large, from + size must be less than or equal to: [{}] but was [{}]. See the scroll api for a more efficient way to request large data sets. This limit can be set by changing the [index.max_result_window] index level setting.",
                    t.max_result_window,
                    req.from + req.size
                )),
                Some(&t.name),
            ));
        }
    }
    Ok(())
}

/// How a search orders its hits.
struct SortPlan {
    /// The order applied (`_score` desc for a search without `sort`).
    effective: Vec<SortSpec>,
    /// Whether the search has a sort: only then do hits carry sort values.
    sorted: bool,
    /// Whether `_score` is part of the sort.
    by_score: bool,
    after: Option<Vec<SV<'static>>>,
}

/// Compiles the sort and `search_after`. A sorted point-in-time search gets the implicit
/// `_shard_doc` asc tiebreaker unless it has one. A search without `sort` gets none, with or
/// without a point in time: its hits carry no sort values and it cannot page with
/// search_after (Elasticsearch 9.5.3).
fn plan_sort(req: &SearchReq, targets: &[Target], pit: bool) -> EsResult<SortPlan> {
    let index = targets.first().map(|t| t.name.as_str());
    let wrap = |e| shard_failure(e, index);
    let mut specs = match &req.sort {
        Some(s) => compile_sort(s, targets, pit).map_err(wrap)?,
        None => vec![],
    };
    let mut implicit_tiebreaker = false;
    if pit && !specs.is_empty() && !specs.iter().any(|s| matches!(s, SortSpec::ShardDoc { .. })) {
        specs.push(SortSpec::ShardDoc { desc: false });
        implicit_tiebreaker = true;
    }
    if req.search_after.is_some() && specs.is_empty() {
        return Err(wrap(EsError::bad_request(
            "Sort must contain at least one field.",
        )));
    }
    let sorted = !specs.is_empty();
    let by_score = specs.iter().any(|s| matches!(s, SortSpec::Score { .. }));
    let effective = if sorted {
        specs
    } else {
        vec![SortSpec::Score { desc: true }]
    };
    let after = match &req.search_after {
        None => None,
        Some(vals) => {
            // Elasticsearch accepts a search_after without the implicit tiebreaker (backward
            // compatibility): it continues after every document with those values, as if the
            // tiebreaker were the largest one.
            let omitted = implicit_tiebreaker && vals.len() + 1 == effective.len();
            if vals.len() != effective.len() && !omitted {
                return Err(wrap(EsError::bad_request(format!(
                    "search_after has {} value(s) but sort has {}.",
                    vals.len(),
                    effective.len()
                ))));
            }
            let mut a: Vec<SV> = effective
                .iter()
                .zip(vals)
                .map(|(s, v)| after_value(s, v))
                .collect::<EsResult<_>>()
                .map_err(wrap)?;
            if omitted {
                a.push(SV::I(i64::MAX));
            }
            Some(a)
        }
    };
    Ok(SortPlan {
        effective,
        sorted,
        by_score,
        after,
    })
}

/// The sort keys of every match, flat: match i owns `keys[i * k..(i + 1) * k]`.
fn sort_keys<'a>(matches: &[&'a Match], effective: &[SortSpec]) -> Vec<SV<'a>> {
    let mut keys = Vec::with_capacity(matches.len() * effective.len());
    for m in matches {
        for s in effective {
            keys.push(match s {
                SortSpec::Score { .. } => SV::Score(m.score),
                SortSpec::Doc { .. } => SV::I(m.doc.seq_no),
                SortSpec::ShardDoc { .. } => {
                    SV::I(((m.ti as i64) << 32) | (m.doc.seq_no & 0xffff_ffff))
                }
                SortSpec::Field(f) => field_sv(f, m.ti, m.doc),
            });
        }
    }
    keys
}

/// The first `want` matches after `search_after`, in order (ties broken by index order).
fn top_matches(matches: &[&Match], keys: &[SV], plan: &SortPlan, want: usize) -> Vec<usize> {
    let k = plan.effective.len();
    let key = |i: usize| &keys[i * k..(i + 1) * k];
    let mut hits: Vec<usize> = (0..matches.len())
        .filter(|&i| {
            plan.after
                .as_ref()
                .is_none_or(|a| cmp_keys(&plan.effective, key(i), a) == Ordering::Greater)
        })
        .collect();
    let cmp = |a: &usize, b: &usize| {
        let (ma, mb) = (matches[*a], matches[*b]);
        cmp_keys(&plan.effective, key(*a), key(*b))
            .then(ma.ti.cmp(&mb.ti))
            .then(ma.doc.seq_no.cmp(&mb.doc.seq_no))
    };
    if want < hits.len() && want > 0 {
        hits.select_nth_unstable_by(want - 1, cmp);
        hits.truncate(want);
    }
    if want == 0 {
        hits.clear();
    }
    hits.sort_by(cmp);
    hits
}

/// Runs a search. `pit` says a point in time is used (it adds the `_shard_doc` tiebreaker to
/// a sorted search).
pub(crate) fn execute(
    targets: &[Target],
    req: &SearchReq,
    pit: bool,
    took_start: std::time::Instant,
    pit_id: Option<&str>,
) -> EsResult<SearchOut> {
    check_window(targets, req)?;
    let plan = plan_sort(req, targets, pit)?;
    let index = targets.first().map(|t| t.name.as_str());
    for t in targets {
        for (name, _) in &req.docvalue_fields {
            t.mapping
                .check_docvalue_field(&t.name, name)
                .map_err(|e| shard_failure(e, index))?;
        }
    }
    let all = find_matches(targets, req.query.as_ref(), req.min_score)?;
    let aggs = match &req.aggs {
        Some(a) => Some(crate::aggs::run(a, targets, &all).map_err(|e| shard_failure(e, index))?),
        None => None,
    };
    let matches: Vec<&Match> = match &req.post_filter {
        None => all.iter().collect(),
        Some(pf) => {
            let qs = compile_queries(Some(pf), targets)?;
            all.iter()
                .filter(|m| qs[m.ti].eval(m.doc, &targets[m.ti].name).is_some())
                .collect()
        }
    };
    let scoring = !plan.sorted || req.track_scores || plan.by_score;
    let max_score = if scoring && req.size > 0 {
        matches.iter().map(|m| m.score).reduce(f32::max)
    } else {
        None
    };
    let keys = sort_keys(&matches, &plan.effective);
    let k = plan.effective.len();
    let opts = HitOpts {
        src: &req.source,
        seqno: req.seq_no_primary_term,
        version: req.version,
        stored: req.stored_fields.as_deref(),
        docvalues: &req.docvalue_fields,
    };
    let hits: Vec<String> = top_matches(&matches, &keys, &plan, req.from + req.size)
        .into_iter()
        .skip(req.from)
        .map(|i| {
            let m = matches[i];
            let sort = plan
                .sorted
                .then(|| sort_values_json(&plan.effective, m.ti, &keys[i * k..(i + 1) * k]));
            hit_json(&targets[m.ti], m, sort, scoring.then_some(m.score), &opts)
        })
        .collect();
    let mut body = String::with_capacity(256 + hits.iter().map(String::len).sum::<usize>());
    body.push('{');
    if let Some(id) = pit_id {
        body.push_str(&format!(
            "\"pit_id\":{},",
            serde_json::to_string(id).unwrap_or_default()
        ));
    }
    body.push_str(&format!(
        "\"took\":{},\"timed_out\":false,\"_shards\":{},\"hits\":{{",
        took_start.elapsed().as_millis(),
        shards_json(targets)
    ));
    if let Some(t) = total_json(matches.len(), req.track_total, req.total_as_int) {
        body.push_str(&format!("\"total\":{t},"));
    }
    body.push_str(&format!(
        "\"max_score\":{},\"hits\":[{}]}}",
        max_score
            .map(|s| serde_json::to_string(&s).unwrap_or_else(|_| "null".into()))
            .unwrap_or_else(|| "null".into()),
        hits.join(",")
    ));
    if let Some(a) = aggs {
        body.push_str(&format!(",\"aggregations\":{a}"));
    }
    body.push('}');
    Ok(SearchOut { body })
}
