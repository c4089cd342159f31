//! Index settings: normalisation to flat `index.*` keys with string values (as Elasticsearch
//! stores them), validation of the settings this server knows, and the nested GET shape.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::error::{EsError, EsResult};
use crate::time::parse_time_value;

pub(crate) type Flat = BTreeMap<String, Value>;

fn scalar(v: &Value) -> Option<Value> {
    match v {
        Value::String(s) => Some(Value::String(s.clone())),
        Value::Number(n) => Some(Value::String(n.to_string())),
        Value::Bool(b) => Some(Value::String(b.to_string())),
        Value::Null => None,
        Value::Array(a) => Some(Value::Array(a.iter().filter_map(scalar).collect())),
        Value::Object(_) => None,
    }
}

fn flatten_into(prefix: &str, v: &Value, out: &mut Flat) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten_into(&key, v, out);
            }
        }
        other => {
            let key = if prefix.starts_with("index.") {
                prefix.to_string()
            } else {
                format!("index.{prefix}")
            };
            match scalar(other) {
                Some(s) => {
                    out.insert(key, s);
                }
                None => {
                    out.insert(key, Value::Null);
                }
            }
        }
    }
}

/// `{"index":{"refresh_interval":"1s"}}`, `{"index.refresh_interval":"1s"}` and
/// `{"refresh_interval":"1s"}` all become `{"index.refresh_interval":"1s"}`.
pub(crate) fn flatten(v: &Value) -> EsResult<Flat> {
    if !v.is_object() {
        return Err(EsError::bad_request("settings must be an object"));
    }
    let mut out = Flat::new();
    flatten_into("", v, &mut out);
    Ok(out)
}

const DYNAMIC: &[&str] = &[
    "index.number_of_replicas",
    "index.refresh_interval",
    "index.max_result_window",
    "index.max_inner_result_window",
    "index.max_refresh_listeners",
    "index.mapping.total_fields.limit",
    "index.mapping.depth.limit",
    "index.mapping.nested_fields.limit",
    "index.mapping.nested_objects.limit",
    "index.mapping.field_name_length.limit",
    "index.search.idle.after",
    "index.gc_deletes",
    "index.hidden",
    "index.auto_expand_replicas",
    "index.priority",
    "index.write.wait_for_active_shards",
    "index.query.default_field",
    "index.max_terms_count",
    "index.max_regex_length",
    "index.max_docvalue_fields_search",
    "index.max_script_fields",
    "index.max_ngram_diff",
    "index.max_shingle_diff",
    "index.highlight.max_analyzed_offset",
    "index.requests.cache.enable",
    "index.default_pipeline",
    "index.final_pipeline",
];

const STATIC: &[&str] = &[
    "index.number_of_shards",
    "index.number_of_routing_shards",
    "index.codec",
    "index.shard.check_on_startup",
    "index.load_fixed_bitset_filters_eagerly",
    "index.queries.cache.enabled",
];

const PREFIXES: &[&str] = &[
    "index.routing.",
    "index.translog.",
    "index.merge.",
    "index.unassigned.",
    "index.lifecycle.",
    "index.store.",
    "index.soft_deletes.",
    "index.analysis.",
];

fn known(key: &str) -> bool {
    DYNAMIC.contains(&key) || STATIC.contains(&key) || PREFIXES.iter().any(|p| key.starts_with(p))
}

fn num(key: &str, v: &Value, min: i64) -> EsResult<i64> {
    let s = v.as_str().unwrap_or_default();
    let n: i64 = s.parse().map_err(|_| {
        EsError::bad_request(format!("Failed to parse value [{s}] for setting [{key}]"))
    })?;
    if n < min {
        return Err(EsError::bad_request(format!(
            "Failed to parse value [{s}] for setting [{key}] must be >= {min}"
        )));
    }
    Ok(n)
}

pub(crate) fn time_setting(key: &str, v: &Value) -> EsResult<Option<Duration>> {
    let s = v.as_str().unwrap_or_default();
    if s == "-1" {
        return Ok(None);
    }
    if s == "0" {
        return Ok(Some(Duration::ZERO));
    }
    parse_time_value(s).map(Some).ok_or_else(|| {
        EsError::bad_request(format!(
            "failed to parse setting [{key}] with value [{s}] as a time value: unit is missing or unrecognized"
        ))
    })
}

/// Validates user-given settings. `update` is true for PUT _settings on an existing index.
pub(crate) fn validate(flat: &Flat, update: bool) -> EsResult<()> {
    for (k, v) in flat {
        if matches!(
            k.as_str(),
            "index.uuid" | "index.creation_date" | "index.provided_name" | "index.version.created"
        ) {
            return Err(EsError::bad_request(format!(
                "private index setting [{k}] can not be set explicitly"
            )));
        }
        if !known(k) {
            return Err(EsError::bad_request(format!(
                "unknown setting [{k}] please check that any required plugins are installed, or check the breaking changes documentation for removed settings"
            )));
        }
        if update && !DYNAMIC.contains(&k.as_str()) && !v.is_null() {
            return Err(EsError::bad_request(format!(
                "Can't update non dynamic settings [[{k}]] for open indices [[?]]"
            )));
        }
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "index.number_of_shards" => {
                let n = num(k, v, 1)?;
                if n > 1024 {
                    return Err(EsError::bad_request(format!(
                        "Failed to parse value [{n}] for setting [index.number_of_shards] must be <= 1024"
                    )));
                }
            }
            "index.number_of_replicas"
            | "index.max_result_window"
            | "index.mapping.total_fields.limit" => {
                num(
                    k,
                    v,
                    if k == "index.number_of_replicas" {
                        0
                    } else {
                        1
                    },
                )?;
            }
            "index.refresh_interval" | "index.search.idle.after" | "index.gc_deletes" => {
                time_setting(k, v)?;
            }
            "index.default_pipeline" | "index.final_pipeline" if v.as_str() != Some("_none") => {
                return Err(EsError::unsupported("ingest pipelines"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Nests flat keys for GET _settings: `{"index":{"refresh_interval":"1s"}}`.
pub(crate) fn nest(flat: &Flat) -> Value {
    let mut root = Map::new();
    for (k, v) in flat {
        if v.is_null() {
            continue;
        }
        let parts: Vec<&str> = k.split('.').collect();
        let mut cur = &mut root;
        for p in &parts[..parts.len() - 1] {
            let e = cur
                .entry(p.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !e.is_object() {
                *e = Value::Object(Map::new());
            }
            cur = e.as_object_mut().expect("object");
        }
        cur.insert(parts[parts.len() - 1].to_string(), v.clone());
    }
    Value::Object(root)
}

/// The nested `index.analysis` object (for building analyzers).
pub(crate) fn analysis_section(flat: &Flat) -> Option<Value> {
    let sub: Flat = flat
        .iter()
        .filter(|(k, _)| k.starts_with("index.analysis."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if sub.is_empty() {
        return None;
    }
    nest(&sub)
        .get("index")
        .and_then(|i| i.get("analysis"))
        .cloned()
}
