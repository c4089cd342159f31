//! Aggregations: `terms` (with sub-aggregations and ordering), `max`, `min`, `sum`, `avg`,
//! `value_count`, `cardinality`, `filter` and `top_hits`.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};

use serde_json::{Map, Value, json};

use crate::error::{EsError, EsResult};
use crate::hits::{Match, top_hits};
use crate::mapping::{FType, FV};
use crate::query::Ctx;
use crate::sort::fielddata_err;
use crate::target::Target;
use crate::time::format_millis;

pub(crate) fn run(aggs: &Value, targets: &[Target], all: &[Match]) -> EsResult<Value> {
    let refs: Vec<&Match> = all.iter().collect();
    run_level(aggs, targets, &refs)
}

fn run_level(aggs: &Value, targets: &[Target], ms: &[&Match]) -> EsResult<Value> {
    let obj = aggs
        .as_object()
        .ok_or_else(|| EsError::parsing("Expected [START_OBJECT] under [aggregations]"))?;
    let mut out = Map::new();
    for (name, def) in obj {
        out.insert(name.clone(), run_one(name, def, targets, ms)?);
    }
    Ok(Value::Object(out))
}

fn split_def<'a>(name: &str, def: &'a Value) -> EsResult<(&'a str, &'a Value, Option<&'a Value>)> {
    let o = def.as_object().ok_or_else(|| {
        EsError::parsing(format!(
            "Expected [START_OBJECT] under [{name}], but got a different token"
        ))
    })?;
    let mut kind = None;
    let mut sub = None;
    for (k, v) in o {
        match k.as_str() {
            "aggs" | "aggregations" => sub = Some(v),
            "meta" => {}
            _ => {
                if kind.is_some() {
                    return Err(EsError::parsing(format!(
                        "Found two aggregation type definitions in [{name}]: [{}] and [{k}]",
                        kind.map(|(k, _)| k).unwrap_or("")
                    )));
                }
                kind = Some((k.as_str(), v));
            }
        }
    }
    let (k, v) = kind
        .ok_or_else(|| EsError::parsing(format!("Missing definition for aggregation [{name}]")))?;
    Ok((k, v, sub))
}

/// A typed value of a field for aggregation purposes.
#[derive(Debug, Clone, PartialEq, PartialOrd)]
enum Key {
    N(f64),
    S(String),
}

fn values(targets: &[Target], field: &str, m: &Match) -> EsResult<(Option<FType>, Vec<Key>)> {
    let t = &targets[m.ti];
    let Some(f) = t.mapping.field(field) else {
        return Ok((None, vec![]));
    };
    if f.ty == FType::Text {
        return Err(fielddata_err(field, &t.name));
    }
    let vals = match m.doc.indexed.get(f.id) {
        Some(FV::Long(v)) => v.iter().map(|x| Key::N(*x as f64)).collect(),
        Some(FV::Double(v)) => v.iter().map(|x| Key::N(*x)).collect(),
        Some(FV::Kw(v)) => v.iter().map(|x| Key::S(x.to_string())).collect(),
        _ => vec![],
    };
    Ok((Some(f.ty), vals))
}

fn field_type(targets: &[Target], field: &str) -> Option<FType> {
    targets
        .iter()
        .find_map(|t| t.mapping.field(field).map(|f| f.ty))
}

fn key_json(k: &Key, ty: Option<FType>) -> (Value, Option<String>) {
    match k {
        Key::S(s) => (json!(s), None),
        Key::N(n) => match ty {
            Some(FType::Date) => (json!(*n as i64), Some(format_millis(*n as i64))),
            Some(FType::DateNanos) => (
                json!(*n as i64),
                Some(format_millis((*n as i64) / 1_000_000)),
            ),
            Some(FType::Boolean) => (
                json!(*n as i64),
                Some(if *n != 0.0 { "true" } else { "false" }.to_string()),
            ),
            Some(t) if t.is_float() => (json!(n), None),
            _ => (json!(*n as i64), None),
        },
    }
}

fn is_score_script(v: &Value) -> bool {
    match v {
        Value::String(s) => s.trim() == "_score",
        Value::Object(o) => o
            .get("source")
            .and_then(Value::as_str)
            .map(|s| s.trim() == "_score")
            .unwrap_or(false),
        _ => false,
    }
}

/// The numbers a metric aggregation reads: a field's values or `_score`.
fn metric_inputs(
    kind: &str,
    spec: &Value,
    targets: &[Target],
    ms: &[&Match],
) -> EsResult<(Vec<Vec<Key>>, Option<FType>)> {
    let o = spec
        .as_object()
        .ok_or_else(|| EsError::parsing(format!("[{kind}] malformed")))?;
    if let Some(s) = o.get("script") {
        if !is_score_script(s) {
            return Err(EsError::unsupported(
                "scripts (only \"_score\" is understood in metric aggregations)",
            ));
        }
        return Ok((
            ms.iter().map(|m| vec![Key::N(m.score as f64)]).collect(),
            None,
        ));
    }
    let field = o.get("field").and_then(Value::as_str).ok_or_else(|| {
        EsError::bad_request(
            "Required one of fields [field, script], but none were specified.".to_string(),
        )
    })?;
    let mut out = Vec::new();
    for m in ms {
        let (_, mut v) = values(targets, field, m)?;
        if v.is_empty()
            && let Some(miss) = o.get("missing")
        {
            v.push(match miss {
                Value::String(s) => Key::S(s.clone()),
                other => Key::N(other.as_f64().unwrap_or(0.0)),
            });
        }
        out.push(v);
    }
    Ok((out, field_type(targets, field)))
}

fn num_value(v: Option<f64>, ty: Option<FType>) -> Value {
    match v {
        None => json!({"value": null}),
        Some(x) => match ty {
            Some(FType::Date) => json!({"value": x, "value_as_string": format_millis(x as i64)}),
            _ => json!({"value": x}),
        },
    }
}

fn run_one(name: &str, def: &Value, targets: &[Target], ms: &[&Match]) -> EsResult<Value> {
    let (kind, spec, sub) = split_def(name, def)?;
    let result = match kind {
        "max" | "min" | "sum" | "avg" | "value_count" | "cardinality" => {
            let (vals, ty) = metric_inputs(kind, spec, targets, ms)?;
            let nums: Vec<f64> = vals
                .iter()
                .flatten()
                .filter_map(|k| if let Key::N(n) = k { Some(*n) } else { None })
                .collect();
            match kind {
                "max" => num_value(nums.iter().copied().reduce(f64::max), ty),
                "min" => num_value(nums.iter().copied().reduce(f64::min), ty),
                "sum" => json!({"value": nums.iter().sum::<f64>()}),
                "avg" => num_value(
                    (!nums.is_empty()).then(|| nums.iter().sum::<f64>() / nums.len() as f64),
                    None,
                ),
                "value_count" => json!({"value": vals.iter().map(Vec::len).sum::<usize>()}),
                _ => {
                    let mut seen = HashSet::new();
                    for k in vals.iter().flatten() {
                        seen.insert(match k {
                            Key::N(n) => format!("n{n}"),
                            Key::S(s) => format!("s{s}"),
                        });
                    }
                    json!({"value": seen.len()})
                }
            }
        }
        "top_hits" => {
            let o = spec
                .as_object()
                .ok_or_else(|| EsError::parsing("[top_hits] malformed"))?;
            top_hits(targets, ms, o)?
        }
        "filter" => {
            let mut kept = Vec::new();
            let qs: Vec<_> = targets
                .iter()
                .map(|t| {
                    Ctx {
                        mapping: &t.mapping,
                    }
                    .parse(spec)
                })
                .collect::<EsResult<_>>()?;
            for m in ms {
                if qs[m.ti].eval(m.doc, &targets[m.ti].name).is_some() {
                    kept.push(*m);
                }
            }
            let mut o = Map::new();
            o.insert("doc_count".into(), json!(kept.len()));
            if let Some(s) = sub
                && let Value::Object(subs) = run_level(s, targets, &kept)?
            {
                o.extend(subs);
            }
            return Ok(Value::Object(o));
        }
        "terms" => return terms(spec, sub, targets, ms),
        other => return Err(EsError::unsupported(&format!("the [{other}] aggregation"))),
    };
    if sub.is_some() {
        return Err(EsError::new(
            400,
            "aggregation_initialization_exception",
            format!("Aggregator [{name}] of type [{kind}] cannot accept sub-aggregations"),
        ));
    }
    Ok(result)
}

enum OrderBy {
    Count(bool),
    Key(bool),
    Sub(String, Option<String>, bool),
}

fn parse_orders(v: Option<&Value>) -> EsResult<Vec<OrderBy>> {
    let items: Vec<&Value> = match v {
        None => return Ok(vec![OrderBy::Count(true), OrderBy::Key(false)]),
        Some(Value::Array(a)) => a.iter().collect(),
        Some(other) => vec![other],
    };
    let mut out = Vec::new();
    for it in items {
        let o = it
            .as_object()
            .ok_or_else(|| EsError::parsing("[order] must be an object"))?;
        for (k, d) in o {
            let desc = match d.as_str() {
                Some("desc") => true,
                Some("asc") => false,
                _ => {
                    return Err(EsError::parsing(format!(
                        "Unknown terms order direction [{d}]"
                    )));
                }
            };
            out.push(match k.as_str() {
                "_count" => OrderBy::Count(desc),
                "_key" | "_term" => OrderBy::Key(desc),
                path => {
                    let (agg, metric) = match path.split_once('.') {
                        Some((a, m)) => (a.to_string(), Some(m.to_string())),
                        None => (path.to_string(), None),
                    };
                    OrderBy::Sub(agg, metric, desc)
                }
            });
        }
    }
    // Elasticsearch breaks remaining ties by key ascending.
    if !out.iter().any(|o| matches!(o, OrderBy::Key(_))) {
        out.push(OrderBy::Key(false));
    }
    Ok(out)
}

fn terms(spec: &Value, sub: Option<&Value>, targets: &[Target], ms: &[&Match]) -> EsResult<Value> {
    let o = spec
        .as_object()
        .ok_or_else(|| EsError::parsing("[terms] malformed"))?;
    let t = TermsSpec::parse(o)?;
    let ty = field_type(targets, t.field);
    let orders = parse_orders(o.get("order"))?;
    let mut rendered = Vec::new();
    for (_, (key, docs)) in t.bucket(targets, ms)? {
        if docs.len() < t.min_doc_count {
            continue;
        }
        let subs = match sub {
            Some(s) => run_level(s, targets, &docs)?,
            None => Value::Object(Map::new()),
        };
        rendered.push((key, docs.len(), subs));
    }
    sort_buckets(&mut rendered, &orders)?;
    let other: usize = rendered.iter().skip(t.size).map(|r| r.1).sum();
    let buckets: Vec<Value> = rendered
        .into_iter()
        .take(t.size)
        .map(|(k, n, subs)| {
            let mut b = Map::new();
            let (kj, ks) = key_json(&k, ty);
            b.insert("key".into(), kj);
            if let Some(s) = ks {
                b.insert("key_as_string".into(), json!(s));
            }
            b.insert("doc_count".into(), json!(n));
            if let Value::Object(s) = subs {
                b.extend(s);
            }
            Value::Object(b)
        })
        .collect();
    Ok(json!({"doc_count_error_upper_bound": 0, "sum_other_doc_count": other, "buckets": buckets}))
}

/// A terms aggregation's parameters.
struct TermsSpec<'a> {
    field: &'a str,
    size: usize,
    min_doc_count: usize,
    missing: Option<Value>,
}

/// A bucket of a terms aggregation: its key, and its size and rendered
/// sub-aggregations.
type TermsBucket = (Key, usize, Value);

impl<'a> TermsSpec<'a> {
    fn parse(o: &'a Map<String, Value>) -> EsResult<TermsSpec<'a>> {
        let mut field = None;
        let mut size = 10usize;
        let mut min_doc_count = 1usize;
        let mut missing = None;
        for (k, v) in o {
            match k.as_str() {
                "field" => field = v.as_str(),
                "size" => {
                    size = v
                        .as_u64()
                        .ok_or_else(|| EsError::parsing("[size] must be a number"))?
                        as usize
                }
                "min_doc_count" => min_doc_count = v.as_u64().unwrap_or(1) as usize,
                "missing" => missing = Some(v.clone()),
                "order"
                | "shard_size"
                | "show_term_doc_count_error"
                | "execution_hint"
                | "collect_mode"
                | "value_type"
                | "format" => {}
                "script" => return Err(EsError::unsupported("scripts in terms aggregations")),
                "include" | "exclude" => {
                    return Err(EsError::unsupported(
                        "include/exclude in terms aggregations",
                    ));
                }
                other => return Err(EsError::parsing(format!("[terms] unknown field [{other}]"))),
            }
        }
        if size == 0 {
            return Err(EsError::bad_request(
                "[size] must be greater than 0. Found [0] in [terms]",
            ));
        }
        let field = field.ok_or_else(|| {
            EsError::bad_request("Required one of fields [field, script], but none were specified.")
        })?;
        Ok(TermsSpec {
            field,
            size,
            min_doc_count,
            missing,
        })
    }

    /// The matches by the values of the field (each match once per bucket).
    fn bucket<'m>(
        &self,
        targets: &[Target],
        ms: &[&'m Match<'m>],
    ) -> EsResult<BTreeMap<String, (Key, Vec<&'m Match<'m>>)>> {
        let mut buckets: BTreeMap<String, (Key, Vec<&Match>)> = BTreeMap::new();
        for m in ms {
            let (_, mut vals) = values(targets, self.field, m)?;
            if vals.is_empty()
                && let Some(mv) = &self.missing
            {
                vals.push(match mv {
                    Value::String(s) => Key::S(s.clone()),
                    other => Key::N(other.as_f64().unwrap_or(0.0)),
                });
            }
            let mut seen = HashSet::new();
            for k in vals {
                let id = match &k {
                    Key::N(n) => format!("n{n:?}"),
                    Key::S(s) => format!("s{s}"),
                };
                if seen.insert(id.clone()) {
                    buckets.entry(id).or_insert_with(|| (k, vec![])).1.push(*m);
                }
            }
        }
        Ok(buckets)
    }
}

/// The value a bucket is ordered by on a sub-aggregation's metric.
fn metric_of(subs: &Value, agg: &str, metric: &Option<String>) -> EsResult<f64> {
    let a = subs.get(agg).ok_or_else(|| {
        EsError::new(
            400,
            "aggregation_execution_exception",
            format!("Invalid aggregation order path [{agg}]. The provided aggregation [{agg}] either does not exist, or is a pipeline aggregation and cannot be used to sort the buckets."),
        )
    })?;
    let v = match metric {
        Some(m) => a.get(m),
        None => a.get("value").or_else(|| a.get("doc_count")),
    };
    Ok(v.and_then(Value::as_f64).unwrap_or(f64::NEG_INFINITY))
}

/// Orders the buckets by `orders`, the first deciding.
fn sort_buckets(rendered: &mut [TermsBucket], orders: &[OrderBy]) -> EsResult<()> {
    // Validate sub-aggregation order paths up front.
    for ob in orders {
        if let OrderBy::Sub(agg, metric, _) = ob
            && let Some((_, _, subs)) = rendered.first()
        {
            metric_of(subs, agg, metric)?;
        }
    }
    let mut err = None;
    rendered.sort_by(|a, b| {
        for ob in orders {
            let o = match ob {
                OrderBy::Count(desc) => {
                    let o = a.1.cmp(&b.1);
                    if *desc { o.reverse() } else { o }
                }
                OrderBy::Key(desc) => {
                    let o = a.0.partial_cmp(&b.0).unwrap_or(Ordering::Equal);
                    if *desc { o.reverse() } else { o }
                }
                OrderBy::Sub(agg, metric, desc) => {
                    let (x, y) = match (metric_of(&a.2, agg, metric), metric_of(&b.2, agg, metric))
                    {
                        (Ok(x), Ok(y)) => (x, y),
                        (Err(e), _) | (_, Err(e)) => {
                            err = Some(e);
                            (0.0, 0.0)
                        }
                    };
                    let o = x.partial_cmp(&y).unwrap_or(Ordering::Equal);
                    if *desc { o.reverse() } else { o }
                }
            };
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    });
    match err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
