//! The query DSL subset: parsing against a mapping and evaluation against indexed documents.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use crate::error::{EsError, EsResult};
use crate::mapping::{FType, FV, FieldInfo, Mapping, TextField};
use crate::store::{Doc, Snapshot, TermKey};
use crate::time;
use crate::wildcard::wildcard_match;

#[derive(Debug, Clone)]
pub(crate) enum TV {
    Str(String),
    Long(i64),
    Dbl(f64),
}

#[derive(Debug, Clone)]
pub(crate) enum Range {
    Long(i64, i64),
    Dbl(Option<(f64, bool)>, Option<(f64, bool)>),
    Str(Option<(String, bool)>, Option<(String, bool)>),
}

#[derive(Debug, Clone)]
pub(crate) enum Q {
    All(f32),
    None,
    Ids(HashSet<String>, f32),
    IdPrefix(String, f32),
    IndexName(Vec<String>, f32),
    Term {
        fid: u16,
        vals: Vec<TV>,
        ci: bool,
        boost: f32,
    },
    Prefix {
        fid: u16,
        prefix: String,
        ci: bool,
        boost: f32,
    },
    Wildcard {
        fid: u16,
        pat: String,
        ci: bool,
        boost: f32,
    },
    Range {
        fid: u16,
        range: Range,
        boost: f32,
    },
    Exists(Vec<u16>),
    Match {
        fid: u16,
        toks: Vec<String>,
        min: usize,
        boost: f32,
    },
    Phrase {
        fid: u16,
        toks: Vec<String>,
        slop: u32,
        boost: f32,
    },
    Bool {
        must: Vec<Q>,
        filter: Vec<Q>,
        should: Vec<Q>,
        must_not: Vec<Q>,
        msm: usize,
        boost: f32,
    },
    Const(Box<Q>, f32),
}

fn pe(reason: impl Into<String>) -> EsError {
    EsError::parsing(reason)
}

fn qse(reason: impl Into<String>) -> EsError {
    EsError::new(400, "query_shard_exception", reason)
}

/// A value that is not a number where one is needed, as Java's parser reports it.
fn number_format(text: &str) -> EsError {
    let why = format!("For input string: \"{text}\"");
    qse(format!("failed to create query: {why}"))
        .caused_by(json!({"type": "number_format_exception", "reason": why}))
}

pub(crate) fn json_token(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "VALUE_STRING",
        Value::Number(_) => "VALUE_NUMBER",
        Value::Bool(_) => "VALUE_BOOLEAN",
        Value::Null => "VALUE_NULL",
        Value::Object(_) => "START_OBJECT",
        Value::Array(_) => "START_ARRAY",
    }
}

const UNIMPLEMENTED: &[&str] = &[
    "regexp",
    "fuzzy",
    "query_string",
    "simple_query_string",
    "multi_match",
    "nested",
    "has_child",
    "has_parent",
    "parent_id",
    "function_score",
    "script",
    "script_score",
    "geo_bounding_box",
    "geo_distance",
    "geo_polygon",
    "geo_shape",
    "shape",
    "more_like_this",
    "dis_max",
    "boosting",
    "span_term",
    "span_first",
    "span_near",
    "span_or",
    "span_not",
    "span_containing",
    "span_within",
    "span_multi",
    "field_masking_span",
    "intervals",
    "match_bool_prefix",
    "match_phrase_prefix",
    "combined_fields",
    "knn",
    "terms_set",
    "distance_feature",
    "pinned",
    "rank_feature",
    "wrapper",
    "percolate",
    "sparse_vector",
    "text_expansion",
    "weighted_tokens",
    "semantic",
    "rule",
];

fn boost_of(m: &Map<String, Value>) -> f32 {
    m.get("boost").and_then(Value::as_f64).unwrap_or(1.0) as f32
}

/// Splits `{"field": value}` or `{"field": {...}, "boost": ..}` single-field queries.
fn single_field<'a>(qname: &str, body: &'a Value) -> EsResult<(&'a str, &'a Value)> {
    let obj = body.as_object().ok_or_else(|| {
        pe(format!(
            "[{qname}] query malformed, no start_object after query name"
        ))
    })?;
    let fields: Vec<(&String, &Value)> = obj
        .iter()
        .filter(|(k, _)| k.as_str() != "boost" && k.as_str() != "_name")
        .collect();
    match fields.len() {
        0 => Err(pe(format!(
            "[{qname}] query doesn't support multiple fields, found none"
        ))
        .with("line", 1)
        .with("col", 1)),
        1 => Ok((fields[0].0.as_str(), fields[0].1)),
        _ => Err(pe(format!(
            "[{qname}] query doesn't support multiple fields, found [{}] and [{}]",
            fields[0].0, fields[1].0
        ))),
    }
}

pub(crate) struct Ctx<'a> {
    pub mapping: &'a Mapping,
}

impl Ctx<'_> {
    fn field(&self, name: &str) -> Option<&FieldInfo> {
        self.mapping.field(name)
    }

    fn searchable(&self, f: &FieldInfo) -> EsResult<()> {
        if f.ty == FType::Binary {
            return Err(qse(
                "failed to create query: Binary fields do not support searching".to_string(),
            ));
        }
        if !f.index && !f.doc_values {
            return Err(qse(format!(
                "failed to create query: Cannot search on field [{}] since it is not indexed.",
                f.name
            )));
        }
        Ok(())
    }

    /// Converts a query value to the field's term type.
    fn term_value(&self, f: &FieldInfo, v: &Value) -> EsResult<Option<TV>> {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => return Err(pe("[term] query value cannot be null")),
            other => {
                return Err(pe(format!(
                    "[term] query does not support [{}]",
                    json_token(other)
                )));
            }
        };
        Ok(Some(match f.ty {
            FType::Keyword => TV::Str(match &f.normalizer {
                Some(n) => crate::analysis::apply_filters(n, &text),
                None => text,
            }),
            FType::Text => TV::Str(text),
            t if t.is_integer() => {
                if let Ok(i) = text.parse::<i64>() {
                    TV::Long(i)
                } else if let Ok(fv) = text.parse::<f64>() {
                    if fv.fract() != 0.0 {
                        return Ok(None);
                    }
                    TV::Long(fv as i64)
                } else {
                    return Err(number_format(&text));
                }
            }
            t if t.is_float() => TV::Dbl(text.parse::<f64>().map_err(|_| number_format(&text))?),
            FType::Date | FType::DateNanos => {
                let ns = match v {
                    Value::Number(n) => n.as_i64().map(|i| i as i128 * 1_000_000),
                    _ => time::parse_date_math_nanos(&text, &f.format, false),
                }
                .ok_or_else(|| {
                    qse(format!("failed to create query: failed to parse date field [{text}] with format [{}]", f.format))
                })?;
                TV::Long(if f.ty == FType::DateNanos {
                    ns as i64
                } else {
                    ns.div_euclid(1_000_000) as i64
                })
            }
            FType::Boolean => match text.as_str() {
                "true" => TV::Long(1),
                "false" | "" => TV::Long(0),
                _ => {
                    return Err(qse(format!(
                        "failed to create query: Can't parse boolean value [{text}], expected [true] or [false]"
                    )));
                }
            },
            _ => return Ok(None),
        }))
    }

    pub(crate) fn parse(&self, q: &Value) -> EsResult<Q> {
        let obj = q
            .as_object()
            .ok_or_else(|| pe("[_na] query malformed, must start with start_object".to_string()))?;
        if obj.is_empty() {
            return Err(pe("query malformed, empty clause found at [1:1]"));
        }
        if obj.len() > 1 {
            let mut keys = obj.keys();
            let first = keys.next().cloned().unwrap_or_default();
            return Err(pe(format!(
                "[{first}] malformed query, expected [END_OBJECT] but found [FIELD_NAME]"
            )));
        }
        let (name, body) = obj.iter().next().expect("one key");
        match name.as_str() {
            "match_all" => Ok(Q::All(body.as_object().map(boost_of).unwrap_or(1.0))),
            "match_none" => Ok(Q::None),
            "term" => self.parse_term(body),
            "terms" => self.parse_terms(body),
            "ids" => {
                let m = body
                    .as_object()
                    .ok_or_else(|| pe("[ids] query malformed"))?;
                let vals = m
                    .get("values")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let ids = vals
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string())
                    })
                    .collect();
                Ok(Q::Ids(ids, boost_of(m)))
            }
            "exists" => {
                let f = body
                    .get("field")
                    .and_then(Value::as_str)
                    .ok_or_else(|| pe("[exists] must be provided with a [field]"))?;
                Ok(self.exists(f))
            }
            "prefix" | "wildcard" => self.parse_prefix_wildcard(name, body),
            "range" => self.parse_range(body),
            "match" | "match_phrase" => self.parse_match(name, body),
            "bool" => self.parse_bool(body),
            "constant_score" => {
                let m = body
                    .as_object()
                    .ok_or_else(|| pe("[constant_score] query malformed"))?;
                let f = m
                    .get("filter")
                    .ok_or_else(|| pe("[constant_score] requires a 'filter' element"))?;
                Ok(Q::Const(Box::new(self.parse(f)?), boost_of(m)))
            }
            n if UNIMPLEMENTED.contains(&n) => {
                Err(EsError::unsupported(&format!("the [{n}] query")))
            }
            n => Err(pe(format!("unknown query [{n}]"))
                .with("line", 1)
                .with("col", 1)
                .caused_by(serde_json::json!({
                    "type": "named_object_not_found_exception",
                    "reason": format!("[1:1] unknown field [{n}]")
                }))),
        }
    }

    fn exists(&self, f: &str) -> Q {
        if f == "_id" || f == "_index" || f == "_source" {
            return Q::All(1.0);
        }
        if let Some(fi) = self.field(f) {
            return Q::Exists(vec![fi.id]);
        }
        let prefix = format!("{f}.");
        let ids: Vec<u16> = self
            .mapping
            .by_name
            .iter()
            .filter(|(n, _)| {
                n.starts_with(&prefix)
                    || (f.contains('*') && wildcard_match(f.as_bytes(), n.as_bytes(), false))
            })
            .map(|(_, id)| *id)
            .collect();
        if ids.is_empty() {
            Q::None
        } else {
            Q::Exists(ids)
        }
    }

    fn parse_term(&self, body: &Value) -> EsResult<Q> {
        let (field, spec) = single_field("term", body)?;
        let (value, boost, ci) = match spec {
            Value::Object(m) => {
                for k in m.keys() {
                    if !matches!(k.as_str(), "value" | "boost" | "case_insensitive" | "_name") {
                        return Err(pe(format!("[term] query does not support [{k}]")));
                    }
                }
                let v = m.get("value").ok_or_else(|| pe("value cannot be null"))?;
                (
                    v,
                    boost_of(m),
                    m.get("case_insensitive")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                )
            }
            v => (v, 1.0, false),
        };
        self.term_query(field, std::slice::from_ref(value), boost, ci)
    }

    fn term_query(&self, field: &str, values: &[Value], boost: f32, ci: bool) -> EsResult<Q> {
        let as_strings = || {
            values.iter().map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string())
            })
        };
        match field {
            "_id" => return Ok(Q::Ids(as_strings().collect(), boost)),
            "_index" => return Ok(Q::IndexName(as_strings().collect(), boost)),
            _ => {}
        }
        let Some(f) = self.field(field) else {
            return Ok(Q::None);
        };
        self.searchable(f)?;
        let mut vals = Vec::new();
        for v in values {
            if let Some(tv) = self.term_value(f, v)? {
                vals.push(match (tv, ci) {
                    (TV::Str(s), true) => TV::Str(s.to_lowercase()),
                    (tv, _) => tv,
                });
            }
        }
        Ok(Q::Term {
            fid: f.id,
            vals,
            ci,
            boost,
        })
    }

    fn parse_terms(&self, body: &Value) -> EsResult<Q> {
        let obj = body
            .as_object()
            .ok_or_else(|| pe("[terms] query malformed"))?;
        let mut field = None;
        for (k, v) in obj {
            if k == "boost" || k == "_name" {
                continue;
            }
            if field.is_some() {
                return Err(pe("[terms] query does not support multiple fields"));
            }
            field = Some((k, v));
        }
        let (field, vals) = field.ok_or_else(|| pe("[terms] query requires a field"))?;
        let vals = match vals {
            Value::Array(a) => a,
            Value::Object(_) => return Err(EsError::unsupported("terms lookup")),
            _ => return Err(pe(format!("[terms] query does not support [{field}]"))),
        };
        if vals.len() > 65536 {
            return Err(EsError::bad_request(
                "The number of terms [..] used in the Terms Query request has exceeded the allowed maximum of [65536].",
            ));
        }
        self.term_query(field, vals, boost_of(obj), false)
    }

    fn parse_prefix_wildcard(&self, qname: &str, body: &Value) -> EsResult<Q> {
        let (field, spec) = single_field(qname, body)?;
        let (value, boost, ci) = match spec {
            Value::Object(m) => {
                let v = m
                    .get("value")
                    .or_else(|| m.get("wildcard"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| pe(format!("[{qname}] query malformed, no value")))?;
                if m.contains_key("rewrite") && qname == "prefix" {
                    // accepted, no effect
                }
                (
                    v.to_string(),
                    boost_of(m),
                    m.get("case_insensitive")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                )
            }
            Value::String(s) => (s.clone(), 1.0, false),
            other => (other.to_string(), 1.0, false),
        };
        if field == "_id" && qname == "prefix" {
            return Ok(Q::IdPrefix(value, boost));
        }
        let Some(f) = self.field(field) else {
            return Ok(Q::None);
        };
        self.searchable(f)?;
        if !matches!(f.ty, FType::Keyword | FType::Text) {
            return Err(qse(format!(
                "failed to create query: Can only use {qname} queries on keyword and text fields - not on [{}] which is of type [{}]",
                f.name,
                f.ty.name()
            )));
        }
        let value = match (&f.normalizer, f.ty) {
            (Some(n), FType::Keyword) => crate::analysis::apply_filters(n, &value),
            _ => value,
        };
        let value = if ci { value.to_lowercase() } else { value };
        Ok(if qname == "prefix" {
            Q::Prefix {
                fid: f.id,
                prefix: value,
                ci,
                boost,
            }
        } else {
            Q::Wildcard {
                fid: f.id,
                pat: value,
                ci,
                boost,
            }
        })
    }

    fn parse_range(&self, body: &Value) -> EsResult<Q> {
        let (field, spec) = single_field("range", body)?;
        let m = spec.as_object().ok_or_else(|| {
            pe("[range] query malformed, no start_object after query name".to_string())
        })?;
        let mut gt = None;
        let mut gte = None;
        let mut lt = None;
        let mut lte = None;
        let mut format = None;
        for (k, v) in m {
            match k.as_str() {
                "gt" => gt = Some(v),
                "gte" | "from" => gte = Some(v),
                "lt" => lt = Some(v),
                "lte" | "to" => lte = Some(v),
                "format" => format = v.as_str(),
                "boost" | "_name" | "relation" | "time_zone" | "include_lower"
                | "include_upper" => {}
                other => return Err(pe(format!("[range] query does not support [{other}]"))),
            }
        }
        let boost = boost_of(m);
        let Some(f) = self.field(field) else {
            return Ok(Q::None);
        };
        self.searchable(f)?;
        let lo = gt
            .map(|v| (v, false))
            .or(gte.map(|v| (v, true)))
            .filter(|(v, _)| !v.is_null());
        let hi = lt
            .map(|v| (v, false))
            .or(lte.map(|v| (v, true)))
            .filter(|(v, _)| !v.is_null());
        let range = match f.ty {
            FType::Keyword | FType::Text => Range::Str(
                lo.map(|(v, i)| (bound_text(v), i)),
                hi.map(|(v, i)| (bound_text(v), i)),
            ),
            t if t.is_integer() || t == FType::Boolean => integer_range(t, lo, hi)?,
            t if t.is_float() => Range::Dbl(
                lo.map(|(v, i)| number_bound(v).map(|x| (x, i)))
                    .transpose()?,
                hi.map(|(v, i)| number_bound(v).map(|x| (x, i)))
                    .transpose()?,
            ),
            FType::Date | FType::DateNanos => date_range(f, format, lo, hi)?,
            _ => return Ok(Q::None),
        };
        Ok(Q::Range {
            fid: f.id,
            range,
            boost,
        })
    }

    fn parse_match(&self, qname: &str, body: &Value) -> EsResult<Q> {
        let (field, spec) = single_field(qname, body)?;
        let mut operator_and = false;
        let mut msm: Option<Value> = None;
        let mut analyzer = None;
        let mut slop = 0u32;
        let (query, boost) = match spec {
            Value::Object(m) => {
                for (k, v) in m {
                    match k.as_str() {
                        "query"
                        | "boost"
                        | "_name"
                        | "lenient"
                        | "auto_generate_synonyms_phrase_query"
                        | "zero_terms_query" => {}
                        "operator" => {
                            operator_and = v
                                .as_str()
                                .map(|s| s.eq_ignore_ascii_case("and"))
                                .unwrap_or(false)
                        }
                        "minimum_should_match" => msm = Some(v.clone()),
                        "analyzer" => analyzer = v.as_str().map(str::to_string),
                        "slop" => slop = v.as_u64().unwrap_or(0) as u32,
                        "fuzziness"
                        | "prefix_length"
                        | "max_expansions"
                        | "fuzzy_transpositions"
                        | "fuzzy_rewrite" => {
                            return Err(EsError::unsupported(&format!(
                                "[{k}] in [{qname}] queries"
                            )));
                        }
                        other => {
                            return Err(pe(format!("[{qname}] query does not support [{other}]")));
                        }
                    }
                }
                (
                    m.get("query")
                        .cloned()
                        .ok_or_else(|| pe("No text specified for text query".to_string()))?,
                    boost_of(m),
                )
            }
            v => (v.clone(), 1.0),
        };
        let text = match &query {
            Value::String(s) => s.clone(),
            Value::Null => return Err(pe("No text specified for text query")),
            other => other.to_string(),
        };
        if field == "_id" || field == "_index" {
            return self.term_query(field, &[Value::String(text)], boost, false);
        }
        let Some(f) = self.field(field) else {
            return Ok(Q::None);
        };
        self.searchable(f)?;
        if f.ty != FType::Text {
            return self.term_query(field, &[query], boost, false);
        }
        let an = match analyzer {
            Some(n) => self.mapping.analysis.analyzer(&n).ok_or_else(|| {
                qse(format!(
                    "failed to create query: [match] analyzer [{n}] not found"
                ))
            })?,
            None => f.search_analyzer.clone(),
        };
        let toks = an.analyze(&text);
        if toks.is_empty() {
            return Ok(Q::None);
        }
        if qname == "match_phrase" {
            return Ok(Q::Phrase {
                fid: f.id,
                toks,
                slop,
                boost,
            });
        }
        let mut uniq: Vec<String> = Vec::new();
        for t in toks {
            if !uniq.contains(&t) {
                uniq.push(t);
            }
        }
        let n = uniq.len();
        let min = if operator_and {
            n
        } else {
            match &msm {
                Some(v) => min_should_match(v, n)?,
                None => 1,
            }
        };
        Ok(Q::Match {
            fid: f.id,
            toks: uniq,
            min: min.max(1).min(n),
            boost,
        })
    }

    fn parse_bool(&self, body: &Value) -> EsResult<Q> {
        let obj = body
            .as_object()
            .ok_or_else(|| pe("[bool] query malformed, no start_object after query name"))?;
        let mut must = vec![];
        let mut filter = vec![];
        let mut should = vec![];
        let mut must_not = vec![];
        let mut msm = None;
        for (k, v) in obj {
            let target = match k.as_str() {
                "must" => &mut must,
                "filter" => &mut filter,
                "should" => &mut should,
                "must_not" | "mustNot" => &mut must_not,
                "minimum_should_match" => {
                    msm = Some(v.clone());
                    continue;
                }
                "boost" | "_name" | "adjust_pure_negative" => continue,
                other => return Err(pe(format!("[bool] query does not support [{other}]"))),
            };
            match v {
                Value::Array(a) => {
                    for c in a {
                        target.push(self.parse(c)?);
                    }
                }
                Value::Object(_) => target.push(self.parse(v)?),
                other => {
                    return Err(pe(format!(
                        "[bool] query does not support [{}]",
                        json_token(other)
                    )));
                }
            }
        }
        let n = should.len();
        let msm = match msm {
            Some(v) => min_should_match(&v, n)?,
            None => usize::from(n > 0 && must.is_empty() && filter.is_empty()),
        };
        Ok(Q::Bool {
            must,
            filter,
            should,
            must_not,
            msm,
            boost: boost_of(obj),
        })
    }
}

/// `minimum_should_match`: `2`, `-1`, `75%`, `-25%`.
fn min_should_match(v: &Value, n: usize) -> EsResult<usize> {
    let s = match v {
        Value::Number(x) => x.to_string(),
        Value::String(s) => s.trim().to_string(),
        _ => return Err(pe("[minimum_should_match] must be a number or a string")),
    };
    let n_i = n as i64;
    let r = if let Some(p) = s.strip_suffix('%') {
        let p: i64 = p
            .parse()
            .map_err(|_| pe(format!("Invalid minimum_should_match [{s}]")))?;
        if p < 0 {
            n_i + (n_i * p) / 100
        } else {
            (n_i * p) / 100
        }
    } else {
        let k: i64 = s
            .parse()
            .map_err(|_| pe(format!("Invalid minimum_should_match [{s}]")))?;
        if k < 0 { n_i + k } else { k }
    };
    Ok(r.clamp(0, n_i.max(0)) as usize)
}

/// A range bound: its value, and whether it is inclusive.
type Bound<'a> = Option<(&'a Value, bool)>;

/// A bound's text (a string as it is, anything else as JSON).
fn bound_text(v: &Value) -> String {
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// A numeric bound.
fn number_bound(v: &Value) -> EsResult<f64> {
    bound_text(v)
        .parse::<f64>()
        .map_err(|_| number_format(&bound_text(v)))
}

/// A range on an integer or boolean field (of type `t`): inclusive integer
/// bounds.
fn integer_range(t: FType, lo: Bound, hi: Bound) -> EsResult<Range> {
    let conv = |v: &Value| -> EsResult<f64> {
        if t == FType::Boolean {
            return match bound_text(v).as_str() {
                "true" => Ok(1.0),
                "false" => Ok(0.0),
                s => Err(qse(format!(
                    "failed to create query: Can't parse boolean value [{s}], expected [true] or [false]"
                ))),
            };
        }
        number_bound(v)
    };
    let lo_v = match lo {
        None => i64::MIN,
        Some((v, incl)) => {
            let x = conv(v)?;
            if incl {
                x.ceil() as i64
            } else {
                x.floor() as i64 + 1
            }
        }
    };
    let hi_v = match hi {
        None => i64::MAX,
        Some((v, incl)) => {
            let x = conv(v)?;
            if incl {
                x.floor() as i64
            } else {
                x.ceil() as i64 - 1
            }
        }
    };
    Ok(Range::Long(lo_v, hi_v))
}

/// A range on a date field: inclusive bounds in its unit (millis, or nanos
/// for date_nanos), date math rounded as Elasticsearch rounds it.
fn date_range(f: &FieldInfo, format: Option<&str>, lo: Bound, hi: Bound) -> EsResult<Range> {
    let fmt = format
        .map(str::to_string)
        .unwrap_or_else(|| f.format.clone());
    let conv = |v: &Value, round_up: bool| -> EsResult<i64> {
        let ns = match v {
            Value::Number(n) if format.is_none() || fmt.contains("epoch_millis") => {
                n.as_f64().map(|x| (x * 1e6) as i128)
            }
            _ => time::parse_date_math_nanos(&bound_text(v), &fmt, round_up),
        }
        .ok_or_else(|| {
            EsError::new(
                400,
                "parse_exception",
                format!(
                    "failed to parse date field [{}] with format [{fmt}]",
                    bound_text(v)
                ),
            )
        })?;
        Ok(if f.ty == FType::DateNanos {
            ns.max(0) as i64
        } else {
            ns.div_euclid(1_000_000) as i64
        })
    };
    let lo_v = match lo {
        None => i64::MIN,
        Some((v, incl)) => {
            let x = conv(v, !incl)?;
            if incl { x } else { x.saturating_add(1) }
        }
    };
    let hi_v = match hi {
        None => i64::MAX,
        Some((v, incl)) => {
            let x = conv(v, incl)?;
            if incl { x } else { x.saturating_sub(1) }
        }
    };
    Ok(Range::Long(lo_v, hi_v))
}

fn str_values(fv: &FV) -> Box<dyn Iterator<Item = &str> + '_> {
    match fv {
        FV::Kw(v) => Box::new(v.iter().map(|s| &**s)),
        FV::Text(v) => Box::new(v.terms.iter().map(|(s, _)| &**s)),
        _ => Box::new(std::iter::empty()),
    }
}

fn tf_score(tf: usize, len: usize) -> f32 {
    (tf as f32).sqrt() / ((len.max(1)) as f32).sqrt()
}

fn intersect(a: &[u32], b: &[u32]) -> Vec<u32> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::with_capacity(a.len().min(b.len()));
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                out.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    out
}

impl Q {
    /// Positions in the snapshot that may match (a sorted superset, from the inverted
    /// index), or None when every document has to be checked.
    pub(crate) fn candidates(&self, snap: &Snapshot) -> Option<Vec<u32>> {
        match self {
            Q::None => Some(vec![]),
            Q::Term {
                fid,
                vals,
                ci: false,
                ..
            } => {
                let mut keys = Vec::with_capacity(vals.len());
                for v in vals {
                    match v {
                        TV::Str(s) => keys.push(TermKey::S(s.clone().into_boxed_str())),
                        TV::Long(i) => {
                            keys.push(TermKey::I(*i));
                            keys.push(TermKey::f(*i as f64));
                        }
                        TV::Dbl(d) => keys.push(TermKey::f(*d)),
                    }
                }
                snap.term_positions(*fid, &keys)
            }
            Q::Ids(ids, _) => {
                let mut v: Vec<u32> = ids.iter().filter_map(|i| snap.position(i)).collect();
                v.sort_unstable();
                Some(v)
            }
            Q::Const(q, _) => q.candidates(snap),
            Q::Bool {
                must,
                filter,
                should,
                msm,
                ..
            } => {
                let mut acc: Option<Vec<u32>> = None;
                for q in must.iter().chain(filter) {
                    if let Some(c) = q.candidates(snap) {
                        acc = Some(match acc {
                            None => c,
                            Some(a) => intersect(&a, &c),
                        });
                    }
                }
                if *msm >= 1 && !should.is_empty() {
                    let mut u = Vec::new();
                    let mut all = true;
                    for q in should {
                        match q.candidates(snap) {
                            Some(c) => u.extend(c),
                            None => {
                                all = false;
                                break;
                            }
                        }
                    }
                    if all {
                        u.sort_unstable();
                        u.dedup();
                        acc = Some(match acc {
                            None => u,
                            Some(a) => intersect(&a, &u),
                        });
                    }
                }
                acc
            }
            _ => None,
        }
    }

    pub(crate) fn is_none(&self) -> bool {
        matches!(self, Q::None)
    }

    /// The score if the document matches.
    pub(crate) fn eval(&self, doc: &Doc, index: &str) -> Option<f32> {
        match self {
            Q::All(b) => Some(*b),
            Q::None => None,
            Q::Ids(ids, b) => ids.contains(&*doc.id).then_some(*b),
            Q::IdPrefix(p, b) => doc.id.starts_with(p.as_str()).then_some(*b),
            Q::IndexName(names, b) => names
                .iter()
                .any(|n| wildcard_match(n.as_bytes(), index.as_bytes(), false))
                .then_some(*b),
            Q::Exists(ids) => ids
                .iter()
                .any(|id| doc.indexed.get(*id).is_some())
                .then_some(1.0),
            Q::Term {
                fid,
                vals,
                ci,
                boost,
            } => term_hit(doc.indexed.get(*fid)?, vals, *ci).then_some(*boost),
            Q::Prefix {
                fid,
                prefix,
                ci,
                boost,
            } => str_values(doc.indexed.get(*fid)?)
                .any(|x| {
                    if *ci {
                        x.to_lowercase().starts_with(prefix.as_str())
                    } else {
                        x.starts_with(prefix.as_str())
                    }
                })
                .then_some(*boost),
            Q::Wildcard {
                fid,
                pat,
                ci,
                boost,
            } => str_values(doc.indexed.get(*fid)?)
                .any(|x| {
                    if *ci {
                        wildcard_match(pat.as_bytes(), x.to_lowercase().as_bytes(), false)
                    } else {
                        wildcard_match(pat.as_bytes(), x.as_bytes(), false)
                    }
                })
                .then_some(*boost),
            Q::Range { fid, range, boost } => {
                range_hit(range, doc.indexed.get(*fid)?).then_some(*boost)
            }
            Q::Match {
                fid,
                toks,
                min,
                boost,
            } => {
                let Some(FV::Text(v)) = doc.indexed.get(*fid) else {
                    return None;
                };
                match_score(v, toks, *min).map(|s| s * boost)
            }
            Q::Phrase {
                fid,
                toks,
                slop,
                boost,
            } => {
                let Some(FV::Text(v)) = doc.indexed.get(*fid) else {
                    return None;
                };
                phrase_score(v, toks, *slop).map(|s| s * boost)
            }
            Q::Bool {
                must,
                filter,
                should,
                must_not,
                msm,
                boost,
            } => {
                let b = BoolQ {
                    must,
                    filter,
                    should,
                    must_not,
                    msm: *msm,
                    boost: *boost,
                };
                b.eval(doc, index)
            }
            Q::Const(q, b) => q.eval(doc, index).map(|_| *b),
        }
    }
}

/// Whether a field value holds any of the terms (`ci`: case-insensitively).
fn term_hit(fv: &FV, vals: &[TV], ci: bool) -> bool {
    vals.iter().any(|tv| match (tv, fv) {
        (TV::Str(s), FV::Text(t)) if !ci => t.positions(s).is_some(),
        (TV::Str(s), fv @ (FV::Kw(_) | FV::Text(_))) => {
            str_values(fv).any(|x| if ci { x.to_lowercase() == *s } else { x == s })
        }
        (TV::Long(n), FV::Long(v)) => v.contains(n),
        (TV::Dbl(d), FV::Double(v)) => v.contains(d),
        (TV::Long(n), FV::Double(v)) => v.contains(&(*n as f64)),
        _ => false,
    })
}

/// Whether any value of a field falls in the range.
fn range_hit(range: &Range, fv: &FV) -> bool {
    match (range, fv) {
        (Range::Long(lo, hi), FV::Long(v)) => v.iter().any(|x| x >= lo && x <= hi),
        (Range::Dbl(lo, hi), FV::Double(v)) => v.iter().any(|x| {
            lo.is_none_or(|(l, incl)| if incl { *x >= l } else { *x > l })
                && hi.is_none_or(|(h, incl)| if incl { *x <= h } else { *x < h })
        }),
        (Range::Str(lo, hi), fv) => str_values(fv).any(|x| {
            lo.as_ref().is_none_or(|(l, incl)| {
                if *incl {
                    x >= l.as_str()
                } else {
                    x > l.as_str()
                }
            }) && hi.as_ref().is_none_or(|(h, incl)| {
                if *incl {
                    x <= h.as_str()
                } else {
                    x < h.as_str()
                }
            })
        }),
        _ => false,
    }
}

/// A match query's score on a text field (before the boost), if at least
/// `min` of the tokens occur.
fn match_score(v: &TextField, toks: &[String], min: usize) -> Option<f32> {
    let mut matched = 0;
    let mut score = 0.0;
    for t in toks {
        if let Some(ps) = v.positions(t) {
            matched += 1;
            score += tf_score(ps.len(), v.len as usize);
        }
    }
    (matched >= min).then_some(score)
}

/// A phrase query's score on a text field (before the boost), if the
/// tokens occur in order with at most `slop` positions between them.
fn phrase_score(v: &TextField, toks: &[String], slop: u32) -> Option<f32> {
    let mut lists: Vec<&[u32]> = Vec::with_capacity(toks.len());
    for t in toks {
        lists.push(v.positions(t)?);
    }
    let mut count = 0;
    for &start in lists[0] {
        let mut prev = start;
        let mut budget = slop;
        let mut ok = true;
        for l in lists[1..].iter() {
            match l
                .iter()
                .filter(|&&p| p > prev && p - prev - 1 <= budget)
                .min()
            {
                Some(&p) => {
                    budget -= p - prev - 1;
                    prev = p;
                }
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            count += 1;
        }
    }
    (count > 0).then(|| tf_score(count, v.len as usize) * toks.len() as f32)
}

/// The clauses of a bool query, borrowed for evaluation.
struct BoolQ<'a> {
    must: &'a [Q],
    filter: &'a [Q],
    should: &'a [Q],
    must_not: &'a [Q],
    msm: usize,
    boost: f32,
}

impl BoolQ<'_> {
    fn eval(&self, doc: &Doc, index: &str) -> Option<f32> {
        let mut score = 0.0;
        for q in self.must {
            score += q.eval(doc, index)?;
        }
        for q in self.filter {
            q.eval(doc, index)?;
        }
        for q in self.must_not {
            if q.eval(doc, index).is_some() {
                return None;
            }
        }
        let mut matched = 0;
        for q in self.should {
            if let Some(s) = q.eval(doc, index) {
                matched += 1;
                score += s;
            }
        }
        if matched < self.msm {
            return None;
        }
        if self.must.is_empty() && self.should.is_empty() && !self.filter.is_empty() {
            return Some(0.0);
        }
        if self.must.is_empty() && self.should.is_empty() && self.filter.is_empty() {
            // Only must_not (or nothing): a match_all base.
            return Some(self.boost);
        }
        Some(score * self.boost)
    }
}
