//! Indexing a document: turning a `_source` into the indexed values of each field, dynamic
//! mapping of unmapped fields (detection, then [`Mapping::add_dynamic`]).

use std::collections::{BTreeMap, HashSet};

use serde_json::{Map, Value, json};

use crate::analysis::apply_filters;
use crate::error::{EsError, EsResult};
use crate::time;

use super::{Dynamic, FType, FieldDef, FieldInfo, Mapping, Node, ObjectDef};

/// Indexed values of one field in one document.
#[derive(Debug, Clone)]
pub(crate) enum FV {
    /// Keyword terms (after normalizer), in source order.
    Kw(Vec<Box<str>>),
    /// Text tokens: the distinct terms (sorted) with their positions (values of a
    /// multi-valued field are separated by a position gap of 100).
    Text(TextField),
    /// Integers, dates (millis, or nanos for date_nanos) and booleans (0/1).
    Long(Vec<i64>),
    Double(Vec<f64>),
}

#[derive(Debug, Clone, Default)]
pub(crate) struct TextField {
    pub terms: Vec<(Box<str>, Vec<u32>)>,
    /// Number of tokens.
    pub len: u32,
}

impl TextField {
    fn build(mut occ: Vec<(Box<str>, u32)>) -> TextField {
        let len = occ.len() as u32;
        occ.sort_unstable();
        let mut terms: Vec<(Box<str>, Vec<u32>)> = Vec::new();
        for (t, p) in occ {
            match terms.last_mut() {
                Some((last, ps)) if *last == t => ps.push(p),
                _ => terms.push((t, vec![p])),
            }
        }
        terms.shrink_to_fit();
        TextField { terms, len }
    }

    pub(crate) fn positions(&self, term: &str) -> Option<&[u32]> {
        self.terms
            .binary_search_by(|(t, _)| (**t).cmp(term))
            .ok()
            .map(|i| &self.terms[i].1[..])
    }
}

/// The indexed form of a document: values per field id, sorted by id.
#[derive(Debug, Clone, Default)]
pub(crate) struct Indexed {
    pub fields: Vec<(u16, FV)>,
}

impl Indexed {
    pub(crate) fn get(&self, id: u16) -> Option<&FV> {
        self.fields
            .binary_search_by_key(&id, |(i, _)| *i)
            .ok()
            .map(|i| &self.fields[i].1)
    }
}

pub(super) enum Pending {
    Kw(Vec<Box<str>>),
    Text(Vec<(Box<str>, u32)>, u32),
    Long(Vec<i64>),
    Double(Vec<f64>),
}

/// What indexing needs besides the mapping.
pub(crate) struct DocCtx<'a> {
    pub id: &'a str,
}

pub(crate) enum IndexOutcome {
    Done(Indexed),
    /// New dynamic fields to add (paths and definitions), then index again.
    NeedMapping(Vec<(Vec<String>, Value)>),
}

fn preview(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(m) => {
            let parts: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{k}={}", preview(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(preview).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

fn parse_failure(info: &FieldInfo, v: &Value, doc_id: &str, cause: EsError) -> EsError {
    EsError::new(
        400,
        "document_parsing_exception",
        format!(
            "failed to parse field [{}] of type [{}] in document with id '{}'. Preview of field's value: '{}'",
            info.name,
            info.ty.name(),
            doc_id,
            preview(v)
        ),
    )
    .caused_by(cause.flat())
}

const MAX_TERM_BYTES: usize = 32766;

fn immense(field: &str, term: &str) -> EsError {
    let prefix: Vec<String> = term
        .as_bytes()
        .iter()
        .take(30)
        .map(|b| b.to_string())
        .collect();
    EsError::new(
        400,
        "illegal_argument_exception",
        format!(
            "Document contains at least one immense term in field=\"{field}\" (whose UTF8 encoding is longer than the max length {MAX_TERM_BYTES}), all of which were skipped.  Please correct the analyzer to not produce such terms.  The prefix of the first immense term is: '[{}]...', original message: bytes can be at most {MAX_TERM_BYTES} in length; got {}",
            prefix.join(", "),
            term.len()
        ),
    )
    .caused_by(json!({
        "type": "max_bytes_length_exceeded_exception",
        "reason": format!("bytes can be at most {MAX_TERM_BYTES} in length; got {}", term.len())
    }))
}

pub(super) fn number_as_i64(v: &Value, info: &FieldInfo) -> Result<i64, EsError> {
    let (lo, hi): (i128, i128) = match info.ty {
        FType::Integer => (i32::MIN as i128, i32::MAX as i128),
        FType::Short => (i16::MIN as i128, i16::MAX as i128),
        FType::Byte => (i8::MIN as i128, i8::MAX as i128),
        _ => (i64::MIN as i128, i64::MAX as i128),
    };
    let tyname = match info.ty {
        FType::Integer => "an integer",
        FType::Short => "a short",
        FType::Byte => "a byte",
        _ => "a long",
    };
    let text = match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) if info.coerce => s.trim().to_string(),
        _ => {
            return Err(EsError::bad_request(format!(
                "Current token ({}) not numeric, can not use numeric value accessors",
                token_name(v)
            )));
        }
    };
    let val: i128 = if let Ok(i) = text.parse::<i128>() {
        i
    } else if let Ok(f) = text.parse::<f64>() {
        if !f.is_finite() {
            return Err(EsError::bad_request(format!(
                "[{}] supports only finite values, but got [{f}]",
                info.ty.name()
            )));
        }
        if f.fract() != 0.0 && !info.coerce {
            return Err(EsError::bad_request(format!(
                "Value [{text}] has a decimal part"
            )));
        }
        f.trunc() as i128
    } else {
        return Err(EsError::new(
            400,
            "number_format_exception",
            format!("For input string: \"{text}\""),
        ));
    };
    if val < lo || val > hi {
        return Err(EsError::bad_request(format!(
            "Value [{text}] is out of range for {tyname}"
        )));
    }
    Ok(val as i64)
}

fn token_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "VALUE_STRING",
        Value::Bool(true) => "VALUE_TRUE",
        Value::Bool(false) => "VALUE_FALSE",
        Value::Null => "VALUE_NULL",
        Value::Number(_) => "VALUE_NUMBER",
        Value::Object(_) => "START_OBJECT",
        Value::Array(_) => "START_ARRAY",
    }
}

/// Converts one scalar value of a leaf field to indexable terms/numbers.
pub(super) fn convert_leaf(
    info: &FieldInfo,
    v: &Value,
    doc_id: &str,
    out: &mut Vec<Pending>,
) -> EsResult<()> {
    let fail = |cause: EsError| parse_failure(info, v, doc_id, cause);
    let pending = match info.ty {
        FType::Keyword => keyword(info, v, &fail)?,
        FType::Text => text(info, v, &fail)?,
        t if t.is_integer() => match number_as_i64(v, info) {
            Ok(n) => Some(Pending::Long(vec![n])),
            Err(e) if !info.ignore_malformed => return Err(fail(e)),
            Err(_) => None,
        },
        t if t.is_float() => float(info, t, v, &fail)?,
        FType::Date | FType::DateNanos => date(info, v, &fail)?,
        FType::Boolean => boolean(info, v, &fail)?,
        FType::Binary => {
            binary(v, &fail)?;
            None
        }
        _ => unreachable!(),
    };
    out.extend(pending);
    Ok(())
}

/// Turns the cause of a value's rejection into the document's parse failure.
type Fail<'a> = dyn Fn(EsError) -> EsError + 'a;

/// The text of a scalar value (strings, numbers and booleans have one).
fn text_of(v: &Value, fail: &Fail) -> EsResult<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(fail(EsError::bad_request(format!(
            "Can't get text on a {} at 1:1",
            token_name(v)
        )))),
    }
}

/// A keyword's term, normalized (none above `ignore_above`).
fn keyword(info: &FieldInfo, v: &Value, fail: &Fail) -> EsResult<Option<Pending>> {
    let s = text_of(v, fail)?;
    if let Some(limit) = info.ignore_above
        && s.chars().count() > limit
    {
        return Ok(None);
    }
    let s = match &info.normalizer {
        Some(f) => apply_filters(f, &s),
        None => s,
    };
    if s.len() > MAX_TERM_BYTES && (info.index || info.doc_values) {
        return Err(immense(&info.name, &s));
    }
    Ok(Some(Pending::Kw(vec![s.into_boxed_str()])))
}

/// A text's tokens with their positions, and their number.
fn text(info: &FieldInfo, v: &Value, fail: &Fail) -> EsResult<Option<Pending>> {
    let s = text_of(v, fail)?;
    let toks = info.analyzer.analyze(&s);
    if let Some(t) = toks.iter().find(|t| t.len() > MAX_TERM_BYTES) {
        return Err(immense(&info.name, t));
    }
    let n = toks.len() as u32;
    Ok(Some(Pending::Text(
        toks.into_iter()
            .enumerate()
            .map(|(i, t)| (t.into_boxed_str(), i as u32))
            .collect(),
        n,
    )))
}

/// A float, half float, scaled float or double (of type `t`).
fn float(info: &FieldInfo, t: FType, v: &Value, fail: &Fail) -> EsResult<Option<Pending>> {
    let r = match v {
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| EsError::bad_request("not a number")),
        Value::String(s) if info.coerce => s.trim().parse::<f64>().map_err(|_| {
            EsError::new(
                400,
                "number_format_exception",
                format!("For input string: \"{s}\""),
            )
        }),
        _ => Err(EsError::bad_request(format!(
            "Current token ({}) not numeric",
            token_name(v)
        ))),
    };
    match r {
        Ok(f) if f.is_finite() => {
            let f = if t == FType::Float {
                f as f32 as f64
            } else {
                f
            };
            Ok(Some(Pending::Double(vec![f])))
        }
        Ok(f) if !info.ignore_malformed => Err(fail(EsError::bad_request(format!(
            "[{}] supports only finite values, but got [{f}]",
            t.name()
        )))),
        Err(e) if !info.ignore_malformed => Err(fail(e)),
        _ => Ok(None),
    }
}

/// A date (millis) or date_nanos (nanos, never before the epoch).
fn date(info: &FieldInfo, v: &Value, fail: &Fail) -> EsResult<Option<Pending>> {
    // A number is read as its text with the field's formats, as Elasticsearch does:
    // with the default format, 2024 is a year and 1700000000000 epoch milliseconds.
    let nanos = match v {
        Value::Number(n) => time::parse_date_nanos(&n.to_string(), &info.format),
        Value::String(s) => time::parse_date_nanos(s, &info.format),
        _ => None,
    };
    let Some(ns) = nanos else {
        if info.ignore_malformed {
            return Ok(None);
        }
        return Err(fail(EsError::bad_request(format!(
            "failed to parse date field [{}] with format [{}]",
            preview(v),
            info.format
        ))));
    };
    let val = if info.ty == FType::DateNanos {
        if ns < 0 {
            if info.ignore_malformed {
                return Ok(None);
            }
            return Err(fail(EsError::bad_request(format!(
                "date[{}] is before the epoch in 1970 and cannot be stored in nanosecond resolution",
                preview(v)
            ))));
        }
        ns as i64
    } else {
        ns.div_euclid(1_000_000) as i64
    };
    Ok(Some(Pending::Long(vec![val])))
}

/// A boolean, as 0 or 1.
fn boolean(info: &FieldInfo, v: &Value, fail: &Fail) -> EsResult<Option<Pending>> {
    let b = match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) if s == "true" => Some(true),
        Value::String(s) if s == "false" || s.is_empty() => Some(false),
        _ => None,
    };
    match b {
        Some(b) => Ok(Some(Pending::Long(vec![b as i64]))),
        None if info.ignore_malformed => Ok(None),
        None => Err(fail(EsError::bad_request(format!(
            "Failed to parse value [{}] as only [true] or [false] are allowed.",
            preview(v)
        )))),
    }
}

/// A binary value must be base64 (it is stored, never indexed).
fn binary(v: &Value, fail: &Fail) -> EsResult<()> {
    let Value::String(s) = v else {
        return Err(fail(EsError::bad_request(format!(
            "Current token ({}) not binary",
            token_name(v)
        ))));
    };
    use base64::Engine;
    if base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .is_err()
    {
        return Err(fail(EsError::bad_request(
            "Failed to decode VALUE_STRING as base64",
        )));
    }
    Ok(())
}

struct Indexer<'a> {
    m: &'a Mapping,
    doc_id: &'a str,
    acc: BTreeMap<u16, Pending>,
    new: Vec<(Vec<String>, Value)>,
}

impl Indexer<'_> {
    fn add(&mut self, id: u16, p: Pending) {
        match (self.acc.get_mut(&id), p) {
            (None, p) => {
                self.acc.insert(id, p);
            }
            (Some(Pending::Kw(a)), Pending::Kw(b)) => a.extend(b),
            (Some(Pending::Long(a)), Pending::Long(b)) => a.extend(b),
            (Some(Pending::Double(a)), Pending::Double(b)) => a.extend(b),
            (Some(Pending::Text(a, next)), Pending::Text(b, n)) => {
                let base = *next + 100;
                a.extend(b.into_iter().map(|(t, p)| (t, p + base)));
                *next = base + n;
            }
            _ => {}
        }
    }

    fn leaf(&mut self, fd: &FieldDef, v: &Value) -> EsResult<()> {
        let info = &self.m.fields[fd.id as usize];
        match v {
            Value::Array(a) => {
                for x in a {
                    self.leaf(fd, x)?;
                }
                return Ok(());
            }
            Value::Null => {
                if let Some(nv) = info.null_value.clone()
                    && !nv.is_null()
                {
                    return self.leaf(fd, &nv);
                }
                return Ok(());
            }
            _ => {}
        }
        let mut out = Vec::new();
        convert_leaf(info, v, self.doc_id, &mut out)?;
        for p in out {
            self.add(fd.id, p);
        }
        for sfd in fd.subfields.values() {
            let sinfo = &self.m.fields[sfd.id as usize];
            let mut out = Vec::new();
            match convert_leaf(sinfo, v, self.doc_id, &mut out) {
                Ok(()) => {}
                Err(e) if e.kind == "illegal_argument_exception" => return Err(e),
                Err(e) => return Err(e),
            }
            for p in out {
                self.add(sfd.id, p);
            }
        }
        Ok(())
    }

    fn object(
        &mut self,
        od: &ObjectDef,
        path: &[String],
        obj: &Map<String, Value>,
        dynamic: Dynamic,
    ) -> EsResult<()> {
        let dynamic = od.dynamic.unwrap_or(dynamic);
        for (key, v) in obj {
            if key.is_empty() {
                return Err(EsError::new(
                    400,
                    "document_parsing_exception",
                    "field name cannot be an empty string".to_string(),
                ));
            }
            let parts: Vec<&str> = key.split('.').collect();
            if parts.iter().any(|p| p.is_empty()) {
                return Err(EsError::new(
                    400,
                    "document_parsing_exception",
                    format!("field name cannot contain only whitespace or dots: ['{key}']"),
                ));
            }
            self.entry(od, path, &parts, v, dynamic)?;
        }
        Ok(())
    }

    fn entry(
        &mut self,
        od: &ObjectDef,
        path: &[String],
        parts: &[&str],
        v: &Value,
        dynamic: Dynamic,
    ) -> EsResult<()> {
        let name = parts[0];
        let mut full_path: Vec<String> = path.to_vec();
        full_path.push(name.to_string());
        let full = full_path.join(".");
        match od.props.get(name) {
            Some(Node::Object(child)) => {
                if !child.enabled {
                    return Ok(());
                }
                if parts.len() > 1 {
                    return self.entry(
                        child,
                        &full_path,
                        &parts[1..],
                        v,
                        child.dynamic.unwrap_or(dynamic),
                    );
                }
                self.object_value(child, &full_path, &full, v, dynamic)
            }
            Some(Node::Field(fd)) => {
                if parts.len() > 1 {
                    // `a.b` where `a` is a leaf: Elasticsearch rejects it.
                    return Err(EsError::new(
                        400,
                        "document_parsing_exception",
                        format!(
                            "Could not dynamically add mapping for field [{}]. Existing mapping for [{full}] must be of type object but found [{}].",
                            parts.join("."),
                            fd.ty.name()
                        ),
                    ));
                }
                if let Value::Object(_) = v {
                    let info = &self.m.fields[fd.id as usize];
                    return Err(parse_failure(
                        info,
                        v,
                        self.doc_id,
                        EsError::bad_request("Can't get text on a START_OBJECT at 1:1".to_string()),
                    ));
                }
                self.leaf(fd, v)
            }
            None => match dynamic {
                Dynamic::False => Ok(()),
                Dynamic::Strict => {
                    let within = if path.is_empty() {
                        "_doc".to_string()
                    } else {
                        path.join(".")
                    };
                    Err(EsError::new(
                        400,
                        "strict_dynamic_mapping_exception",
                        format!(
                            "[1:2] mapping set to strict, dynamic introduction of [{name}] within [{within}] is not allowed"
                        ),
                    ))
                }
                Dynamic::True => {
                    if parts.len() > 1 {
                        self.new.push((full_path, json!({"properties": {}})));
                        return Ok(());
                    }
                    if let Some(def) = self.infer(v) {
                        self.new.push((full_path, def));
                    }
                    Ok(())
                }
            },
        }
    }

    fn object_value(
        &mut self,
        od: &ObjectDef,
        path: &[String],
        full: &str,
        v: &Value,
        dynamic: Dynamic,
    ) -> EsResult<()> {
        match v {
            Value::Object(o) => self.object(od, path, o, dynamic),
            Value::Array(a) => {
                for x in a {
                    self.object_value(od, path, full, x, dynamic)?;
                }
                Ok(())
            }
            Value::Null => Ok(()),
            other => Err(EsError::new(
                400,
                "document_parsing_exception",
                format!(
                    "object mapping for [{full}] tried to parse field [{}] as object, but found a concrete value",
                    path.last().map(String::as_str).unwrap_or(full)
                ),
            )
            .with("preview", preview(other))),
        }
    }

    /// The dynamic mapping for a new field's value (None for null / empty arrays).
    fn infer(&self, v: &Value) -> Option<Value> {
        Some(match v {
            Value::Null => return None,
            Value::Array(a) => return a.iter().find_map(|x| self.infer(x)),
            Value::Bool(_) => json!({"type": "boolean"}),
            Value::Number(n) => {
                if n.is_i64() || n.is_u64() {
                    json!({"type": "long"})
                } else {
                    json!({"type": "float"})
                }
            }
            Value::Object(_) => json!({"properties": {}}),
            Value::String(s) => {
                if self.m.date_detection && looks_like_date(s) {
                    json!({"type": "date"})
                } else if self.m.numeric_detection && s.trim().parse::<i64>().is_ok() {
                    json!({"type": "long"})
                } else if self.m.numeric_detection && s.trim().parse::<f64>().is_ok() {
                    json!({"type": "float"})
                } else {
                    json!({"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}})
                }
            }
        })
    }
}

fn looks_like_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b[..4].iter().all(u8::is_ascii_digit)
        && time::parse_iso_nanos(s).is_some()
        || time::parse_date_nanos(s, "yyyy/MM/dd HH:mm:ss||yyyy/MM/dd").is_some()
}

impl Mapping {
    /// Indexes a parsed source. New dynamic fields are reported (not added): the caller
    /// adds them with [`Mapping::add_dynamic`] and indexes again.
    pub(crate) fn index_doc(&self, source: &Value, ctx: &DocCtx) -> EsResult<IndexOutcome> {
        let Value::Object(obj) = source else {
            return Err(EsError::new(
                400,
                "document_parsing_exception",
                "[1:1] failed to parse: Root value must be an object",
            ));
        };
        let mut ix = Indexer {
            m: self,
            doc_id: ctx.id,
            acc: BTreeMap::new(),
            new: vec![],
        };
        ix.object(&self.root, &[], obj, self.root_dynamic())?;
        if !ix.new.is_empty() {
            let mut seen = HashSet::new();
            let new: Vec<_> = ix
                .new
                .into_iter()
                .filter(|(p, _)| seen.insert(p.clone()))
                .collect();
            return Ok(IndexOutcome::NeedMapping(new));
        }
        let fields = ix
            .acc
            .into_iter()
            .map(|(id, p)| {
                (
                    id,
                    match p {
                        Pending::Kw(v) => FV::Kw(v),
                        Pending::Text(v, _) => FV::Text(TextField::build(v)),
                        Pending::Long(v) => FV::Long(v),
                        Pending::Double(v) => FV::Double(v),
                    },
                )
            })
            .collect();
        Ok(IndexOutcome::Done(Indexed { fields }))
    }

    /// Adds dynamically detected fields (full paths) to the mapping.
    pub(crate) fn add_dynamic(
        &mut self,
        new: &[(Vec<String>, Value)],
        limit: usize,
    ) -> EsResult<()> {
        for (path, def) in new {
            // Rebuild the nesting correctly from the innermost definition outwards.
            let mut node = def.clone();
            for seg in path[1..].iter().rev() {
                let mut p = Map::new();
                p.insert(seg.clone(), node);
                node = json!({"properties": Value::Object(p)});
            }
            let mut props = Map::new();
            props.insert(path[0].clone(), node);
            let mut root = std::mem::take(&mut self.root.props);
            let r = self.merge_props(&mut root, &props, "");
            self.root.props = root;
            r?;
        }
        self.rebuild()?;
        if self.total_fields() > limit {
            return Err(EsError::bad_request(format!(
                "Limit of total fields [{limit}] has been exceeded"
            )));
        }
        Ok(())
    }
}
