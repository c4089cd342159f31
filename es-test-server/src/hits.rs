//! What a search hit is made of and how it is rendered: a matching document
//! ([`Match`]), `_source` filtering, a hit's JSON, and the `top_hits`
//! aggregation's hits (shared by `search` and `aggs`, which sit above this).

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::error::{EsError, EsResult};
use crate::query::json_token;
use crate::sort::{SV, SortSpec, cmp_keys, compile_sort, field_sv, sort_values_json};
use crate::store::{Doc, PRIMARY_TERM};
use crate::target::Target;

#[derive(Debug, Clone, Default)]
pub(crate) struct SourceFilter {
    pub fetch: bool,
    pub includes: Vec<String>,
    pub excludes: Vec<String>,
}

impl SourceFilter {
    pub(crate) fn all() -> SourceFilter {
        SourceFilter {
            fetch: true,
            includes: vec![],
            excludes: vec![],
        }
    }

    fn list(v: &Value) -> EsResult<Vec<String>> {
        Ok(match v {
            Value::String(s) => vec![s.clone()],
            Value::Array(a) => a
                .iter()
                .map(|x| x.as_str().map(str::to_string).unwrap_or_default())
                .collect(),
            Value::Null => vec![],
            other => {
                return Err(EsError::parsing(format!(
                    "Unknown key for a {} in [_source].",
                    json_token(other)
                )));
            }
        })
    }

    pub(crate) fn from_json(v: &Value) -> EsResult<SourceFilter> {
        Ok(match v {
            Value::Bool(b) => SourceFilter {
                fetch: *b,
                ..Default::default()
            },
            Value::String(_) | Value::Array(_) => SourceFilter {
                fetch: true,
                includes: Self::list(v)?,
                excludes: vec![],
            },
            Value::Object(m) => {
                let mut f = SourceFilter::all();
                for (k, v) in m {
                    match k.as_str() {
                        "includes" | "include" => f.includes = Self::list(v)?,
                        "excludes" | "exclude" => f.excludes = Self::list(v)?,
                        other => {
                            return Err(EsError::parsing(format!(
                                "Unknown key for a {} in [{other}].",
                                json_token(v)
                            )));
                        }
                    }
                }
                f
            }
            other => {
                return Err(EsError::parsing(format!(
                    "Unknown key for a {} in [_source].",
                    json_token(other)
                )));
            }
        })
    }

    /// From URL parameters `_source`, `_source_includes`, `_source_excludes`.
    pub(crate) fn from_params(
        source: Option<&str>,
        inc: Option<&str>,
        exc: Option<&str>,
    ) -> Option<SourceFilter> {
        if source.is_none() && inc.is_none() && exc.is_none() {
            return None;
        }
        let split = |s: &str| {
            s.split(',')
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty())
                .collect::<Vec<_>>()
        };
        let mut f = SourceFilter::all();
        match source {
            Some("false") => f.fetch = false,
            Some("true") | Some("") | None => {}
            Some(list) => f.includes = split(list),
        }
        if let Some(i) = inc {
            f.includes = split(i);
            f.fetch = true;
        }
        if let Some(e) = exc {
            f.excludes = split(e);
            f.fetch = true;
        }
        Some(f)
    }

    pub(crate) fn is_identity(&self) -> bool {
        self.fetch && self.includes.is_empty() && self.excludes.is_empty()
    }

    /// The filtered source, or None when `_source` is not fetched.
    pub(crate) fn apply(&self, raw: &str) -> Option<Value> {
        if !self.fetch {
            return None;
        }
        let v: Value = serde_json::from_str(raw).unwrap_or(Value::Null);
        if self.is_identity() {
            return Some(v);
        }
        Some(filter_value(
            &v,
            "",
            &self.includes,
            &self.excludes,
            self.includes.is_empty(),
        ))
    }
}

fn glob(p: &str, s: &str) -> bool {
    crate::wildcard::wildcard_match(p.as_bytes(), s.as_bytes(), false)
}

fn could_match_below(pattern: &str, path: &str) -> bool {
    let lit = pattern.split('*').next().unwrap_or("");
    let with_dot = format!("{path}.");
    if pattern.contains('*') {
        with_dot.starts_with(lit) || lit.starts_with(&with_dot)
    } else {
        pattern.starts_with(&with_dot)
    }
}

fn filter_value(v: &Value, prefix: &str, inc: &[String], exc: &[String], included: bool) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, x) in m {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if exc.iter().any(|p| glob(p, &path)) {
                    continue;
                }
                let inc_here = included || inc.iter().any(|p| glob(p, &path));
                if inc_here {
                    out.insert(k.clone(), filter_value(x, &path, inc, exc, true));
                } else if inc.iter().any(|p| could_match_below(p, &path)) {
                    match x {
                        Value::Object(_) | Value::Array(_) => {
                            let f = filter_value(x, &path, inc, exc, false);
                            let empty = match &f {
                                Value::Object(o) => o.is_empty(),
                                Value::Array(a) => a.is_empty(),
                                _ => false,
                            };
                            if !empty {
                                out.insert(k.clone(), f);
                            }
                        }
                        _ => {}
                    }
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => {
            let items: Vec<Value> = a
                .iter()
                .filter_map(|x| match x {
                    Value::Object(_) | Value::Array(_) => {
                        let f = filter_value(x, prefix, inc, exc, included);
                        let empty = matches!(&f, Value::Object(o) if o.is_empty());
                        (!empty || included).then_some(f)
                    }
                    other => included.then(|| other.clone()),
                })
                .collect();
            Value::Array(items)
        }
        other => other.clone(),
    }
}

pub(crate) fn as_usize(key: &str, v: &Value) -> EsResult<usize> {
    match v {
        Value::Number(n) => match n.as_i64() {
            Some(i) if i < 0 => Err(EsError::bad_request(format!(
                "[{key}] parameter cannot be negative, found [{i}]"
            ))),
            Some(i) => Ok(i as usize),
            None => Err(EsError::parsing(format!("[{key}] must be an integer"))),
        },
        Value::String(s) => as_usize(
            key,
            &Value::Number(
                s.parse::<i64>()
                    .map_err(|_| {
                        EsError::bad_request(format!(
                            "Failed to parse int parameter [{key}] with value [{s}]"
                        ))
                    })?
                    .into(),
            ),
        ),
        other => Err(EsError::parsing(format!(
            "[{key}] must be a number, found {}",
            json_token(other)
        ))),
    }
}

pub(crate) struct Match<'a> {
    pub ti: usize,
    pub doc: &'a Arc<Doc>,
    pub score: f32,
}

/// What a hit shows besides its id, index and score.
pub(crate) struct HitOpts<'a> {
    pub src: &'a SourceFilter,
    pub seqno: bool,
    pub version: bool,
    /// `stored_fields`: rendered as `fields`; `_none_` also leaves out `_id`.
    pub stored: Option<&'a [String]>,
    /// `docvalue_fields` (name, format): rendered in `fields` too.
    pub docvalues: &'a [(String, Option<String>)],
}

pub(crate) fn hit_json(
    t: &Target,
    h: &Match,
    sort: Option<Value>,
    score: Option<f32>,
    o: &HitOpts,
) -> String {
    let mut s = String::with_capacity(128 + h.doc.source.len());
    s.push_str("{\"_index\":");
    s.push_str(&serde_json::to_string(&t.name).unwrap_or_default());
    if o.stored.is_none_or(|n| n != ["_none_"]) {
        s.push_str(",\"_id\":");
        s.push_str(&serde_json::to_string(&*h.doc.id).unwrap_or_default());
    }
    if o.version {
        s.push_str(&format!(",\"_version\":{}", h.doc.version));
    }
    if o.seqno {
        s.push_str(&format!(
            ",\"_seq_no\":{},\"_primary_term\":{}",
            h.doc.seq_no, PRIMARY_TERM
        ));
    }
    s.push_str(",\"_score\":");
    match score {
        Some(x) => s.push_str(&serde_json::to_string(&x).unwrap_or_else(|_| "null".into())),
        None => s.push_str("null"),
    }
    if o.src.fetch {
        s.push_str(",\"_source\":");
        if o.src.is_identity() {
            s.push_str(&h.doc.source);
        } else if let Some(v) = o.src.apply(&h.doc.source) {
            s.push_str(&v.to_string());
        }
    }
    let mut fields = Map::new();
    if let Some(names) = o.stored {
        let source: Value = serde_json::from_str(&h.doc.source).unwrap_or(Value::Null);
        fields = t.mapping.stored_fields(&source, names);
    }
    fields.extend(t.mapping.docvalue_fields(&h.doc.indexed, o.docvalues));
    if !fields.is_empty() {
        s.push_str(",\"fields\":");
        s.push_str(&Value::Object(fields).to_string());
    }
    if let Some(k) = sort {
        s.push_str(",\"sort\":");
        s.push_str(&k.to_string());
    }
    s.push('}');
    s
}

/// Renders top hits for the `top_hits` aggregation.
pub(crate) fn top_hits(
    targets: &[Target],
    ms: &[&Match],
    spec: &Map<String, Value>,
) -> EsResult<Value> {
    let mut size = 3usize;
    let mut from = 0usize;
    let mut src = SourceFilter::all();
    let mut sort = None;
    let mut seqno = false;
    let mut version = false;
    let mut track_scores = false;
    for (k, v) in spec {
        match k.as_str() {
            "size" => size = as_usize("size", v)?,
            "from" => from = as_usize("from", v)?,
            "_source" => src = SourceFilter::from_json(v)?,
            "sort" => sort = Some(v.clone()),
            "seq_no_primary_term" => seqno = v.as_bool().unwrap_or(false),
            "version" => version = v.as_bool().unwrap_or(false),
            "track_scores" => track_scores = v.as_bool().unwrap_or(false),
            "explain" => {}
            other => return Err(EsError::unsupported(&format!("[{other}] in top_hits"))),
        }
    }
    if from + size > 100 {
        return Err(EsError::bad_request(format!(
            "Top hits result window is too large, the top hits aggregator [top_hits]'s from + size must be less than or equal to: [100] but was [{}]. This limit can be set by changing the [index.max_inner_result_window] index level setting.",
            from + size
        )));
    }
    let specs = match &sort {
        Some(s) => compile_sort(s, targets, false)?,
        None => vec![],
    };
    let explicit = !specs.is_empty();
    // Scores are tracked unless a sort without _score is given (as in Elasticsearch).
    let scoring =
        !explicit || track_scores || specs.iter().any(|s| matches!(s, SortSpec::Score { .. }));
    let effective = if explicit {
        specs
    } else {
        vec![SortSpec::Score { desc: true }]
    };
    let mut hs: Vec<(Vec<SV>, &Match)> = ms
        .iter()
        .map(|m| {
            let key = effective
                .iter()
                .map(|s| match s {
                    SortSpec::Score { .. } => SV::Score(m.score),
                    SortSpec::Doc { .. } | SortSpec::ShardDoc { .. } => SV::I(m.doc.seq_no),
                    SortSpec::Field(f) => field_sv(f, m.ti, m.doc),
                })
                .collect();
            (key, *m)
        })
        .collect();
    hs.sort_by(|a, b| {
        cmp_keys(&effective, &a.0, &b.0)
            .then(a.1.ti.cmp(&b.1.ti))
            .then(a.1.doc.seq_no.cmp(&b.1.doc.seq_no))
    });
    let max_score = if scoring {
        ms.iter().map(|m| m.score).reduce(f32::max)
    } else {
        None
    };
    let hits: Vec<Value> = hs
        .iter()
        .skip(from)
        .take(size)
        .map(|(k, m)| {
            let s = hit_json(
                &targets[m.ti],
                m,
                explicit.then(|| sort_values_json(&effective, m.ti, k)),
                scoring.then_some(m.score),
                &HitOpts {
                    src: &src,
                    seqno,
                    version,
                    stored: None,
                    docvalues: &[],
                },
            );
            serde_json::from_str(&s).unwrap_or(Value::Null)
        })
        .collect();
    Ok(
        json!({"hits": {"total": {"value": ms.len(), "relation": "eq"}, "max_score": max_score, "hits": hits}}),
    )
}
