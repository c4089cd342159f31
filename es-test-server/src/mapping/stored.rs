//! Stored fields (`store: true`): the `fields` that get, mget and search return for
//! `stored_fields`, read back from `_source` as Elasticsearch stores them at index time.

use serde_json::{Map, Value, json};

use super::document::{FV, Indexed, number_as_i64};
use super::{FType, FieldInfo, Mapping};
use crate::error::{EsError, EsResult};
use crate::time;

impl Mapping {
    /// Checks a requested stored field name: an object is refused as in Elasticsearch.
    pub(crate) fn check_stored_field(&self, name: &str) -> EsResult<()> {
        if self.objects.contains(name) {
            return Err(EsError::bad_request(format!(
                "field [{name}] isn't a leaf field"
            )));
        }
        Ok(())
    }

    /// The `fields` object for the requested names: the values of each stored field in
    /// source order, converted as the field type stores them. Unknown, unstored, metadata
    /// and empty fields are left out.
    pub(crate) fn stored_fields(&self, source: &Value, names: &[String]) -> Map<String, Value> {
        let mut out = Map::new();
        for name in names {
            let Some(info) = self.field(name).filter(|f| f.store) else {
                continue;
            };
            // A multi-field (`k.raw`) stores the values of its parent's source path.
            let path = match name.rsplit_once('.') {
                Some((parent, _)) if self.field(parent).is_some() => parent,
                _ => name.as_str(),
            };
            let mut raw = Vec::new();
            collect(source, path, &mut raw);
            let values: Vec<Value> = raw
                .into_iter()
                .filter_map(|v| stored_value(info, v))
                .collect();
            if !values.is_empty() {
                out.insert(name.clone(), Value::Array(values));
            }
        }
        out
    }

    /// Checks a `docvalue_fields` entry as Elasticsearch does: a text field has no doc
    /// values (unless `fielddata`), nor a field mapped with `doc_values: false`. An unmapped
    /// field is no error (it has no values).
    pub(crate) fn check_docvalue_field(&self, index: &str, name: &str) -> EsResult<()> {
        let Some(info) = self.field(name) else {
            return Ok(());
        };
        if info.ty == FType::Text && !info.fielddata {
            return Err(EsError::bad_request(format!(
                "Fielddata is disabled on [{name}] in [{index}]. Text fields are not optimised \
                 for operations that require per-document field \
                 data like aggregations and sorting, so these operations are disabled by default. \
                 Please use a keyword field instead. Alternatively, set fielddata=true on \
                 [{name}] in order to load field data by uninverting the inverted index. Note \
                 that this can use significant memory."
            )));
        }
        if !info.doc_values || info.ty == FType::Binary {
            return Err(EsError::bad_request(format!(
                "Can't load fielddata on [{name}] because fielddata is unsupported on fields of \
                 type [{}]. Use doc values instead.",
                info.ty.name()
            )));
        }
        Ok(())
    }

    /// The `fields` object for `docvalue_fields` (each a name and an optional `format`): the
    /// values as the columns keep them. Keywords sorted and unique, numbers sorted, dates
    /// printed with the requested format (else the field's), booleans as booleans; fields
    /// without values left out. Names were checked by `check_docvalue_field`.
    pub(crate) fn docvalue_fields(
        &self,
        indexed: &Indexed,
        req: &[(String, Option<String>)],
    ) -> Map<String, Value> {
        let mut out = Map::new();
        for (name, format) in req {
            let Some(info) = self.field(name) else {
                continue;
            };
            let values: Vec<Value> = match indexed.get(info.id) {
                Some(FV::Kw(v)) => {
                    let mut v: Vec<&str> = v.iter().map(|s| &**s).collect();
                    v.sort_unstable();
                    v.dedup();
                    v.into_iter().map(|s| json!(s)).collect()
                }
                Some(FV::Long(v)) => {
                    let mut v = v.clone();
                    v.sort_unstable();
                    let unit = if info.ty == FType::Date { 1_000_000 } else { 1 };
                    let fmt = format.as_deref().unwrap_or(&info.format);
                    v.into_iter()
                        .map(|x| match info.ty {
                            FType::Boolean => json!(x != 0),
                            FType::Date | FType::DateNanos => {
                                json!(time::format_nanos(x as i128 * unit, fmt))
                            }
                            _ => json!(x),
                        })
                        .collect()
                }
                Some(FV::Double(v)) => {
                    let mut v = v.clone();
                    v.sort_unstable_by(f64::total_cmp);
                    v.into_iter().map(|x| json!(x)).collect()
                }
                _ => Vec::new(),
            };
            if !values.is_empty() {
                out.insert(name.clone(), Value::Array(values));
            }
        }
        out
    }
}

/// The leaf values at a dotted path, whether the source nests objects, uses dotted keys, or
/// both; arrays are flattened.
fn collect<'a>(v: &'a Value, path: &str, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|x| collect(x, path, out)),
        Value::Object(m) => {
            for (k, x) in m {
                if k == path {
                    leaves(x, out);
                } else if let Some(rest) = path
                    .strip_prefix(k.as_str())
                    .and_then(|r| r.strip_prefix('.'))
                {
                    collect(x, rest, out);
                }
            }
        }
        _ => {}
    }
}

fn leaves<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|x| leaves(x, out)),
        other => out.push(other),
    }
}

/// One source value as the field stores it (None: not stored, e.g. over `ignore_above` or
/// malformed).
fn stored_value(info: &FieldInfo, v: &Value) -> Option<Value> {
    if v.is_null() {
        return info
            .null_value
            .as_ref()
            .filter(|n| !n.is_null())
            .and_then(|n| stored_value(info, n));
    }
    let text = || v.as_str().map_or_else(|| v.to_string(), str::to_string);
    match info.ty {
        FType::Keyword => {
            let s = text();
            let over = info.ignore_above.is_some_and(|n| s.chars().count() > n);
            (!over).then(|| json!(s))
        }
        FType::Text | FType::Binary => Some(json!(text())),
        t if t.is_integer() => number_as_i64(v, info).ok().map(|n| json!(n)),
        t if t.is_float() => v
            .as_f64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .map(|f| json!(f)),
        FType::Boolean => match text().as_str() {
            "true" => Some(json!(true)),
            "false" => Some(json!(false)),
            _ => None,
        },
        FType::Date | FType::DateNanos => {
            let ns = time::parse_date_nanos(&text(), &info.format)?;
            let ns = if info.ty == FType::Date {
                ns.div_euclid(1_000_000) * 1_000_000
            } else {
                ns
            };
            Some(json!(time::format_nanos(ns, &info.format)))
        }
        _ => None,
    }
}
