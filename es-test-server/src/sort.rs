//! Sorting: sort specifications, the sort values of a document, their order, `search_after`
//! values and how sort values are rendered (`format`, `numeric_type`).

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::{Value, json};

use crate::error::{EsError, EsResult};
use crate::mapping::{FType, FV};
use crate::store::Doc;
use crate::target::Target;
use crate::time::{self, FormatError};

#[derive(Debug, Clone)]
pub(crate) enum SortSpec {
    Field(Box<FieldSort>),
    Score { desc: bool },
    Doc { desc: bool },
    ShardDoc { desc: bool },
}

/// A sort on a field, resolved against every target of the search.
#[derive(Debug, Clone)]
pub(crate) struct FieldSort {
    name: String,
    /// Per target: the field's id there (None: unmapped).
    fids: Vec<Option<u16>>,
    /// Per target: the field is a `date_nanos` there (its values are nanoseconds).
    nanos: Vec<bool>,
    ty: FType,
    desc: bool,
    missing_last: bool,
    missing: Option<Value>,
    max_mode: bool,
    /// `numeric_type: date` (false) or `date_nanos` (true): date values of every target are
    /// converted to that resolution, so that date and date_nanos indices sort together.
    numeric_nanos: Option<bool>,
    /// `format`: date sort values are rendered as strings with it (missing ones as null).
    format: Option<String>,
    /// How `search_after` strings are read: the sort's format, else the field's own.
    parse_format: String,
}

impl FieldSort {
    fn is_date(&self) -> bool {
        matches!(self.ty, FType::Date | FType::DateNanos)
    }

    /// Whether the values of target `ti` are nanoseconds once converted.
    fn nanos_at(&self, ti: usize) -> bool {
        self.numeric_nanos.unwrap_or(self.nanos[ti])
    }

    /// The resolution `search_after` values are read in: the converted one, else the first
    /// target that maps the field.
    fn after_nanos(&self) -> bool {
        let first = self.fids.iter().position(Option::is_some).unwrap_or(0);
        self.numeric_nanos
            .unwrap_or_else(|| self.nanos.get(first).copied().unwrap_or(false))
    }
}

/// A sort value. Keyword values borrow from the document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SV<'a> {
    I(i64),
    F(f64),
    /// A `_score`: a float, rendered as `_score` is (0.3, not 0.30000001192092896) and
    /// compared as a float so that a value sent back as `search_after` keeps its ties.
    Score(f32),
    S(Option<Cow<'a, str>>),
}

fn sv_json(v: &SV) -> Value {
    match v {
        SV::I(i) => json!(i),
        SV::F(f) => json!(f),
        // The shortest decimal that reads back as this f32, as `_score` itself is rendered.
        SV::Score(f) => json!(f.to_string().parse::<f64>().unwrap_or(*f as f64)),
        SV::S(Some(s)) => json!(&**s),
        SV::S(None) => Value::Null,
    }
}

/// The `sort` array of a hit of target `ti`. With a `format`, date values are strings in that
/// format and missing ones null (Elasticsearch 9); without, they are numbers (epoch
/// milliseconds, or nanoseconds for `date_nanos`) and missing ones `Long.MAX/MIN_VALUE`.
pub(crate) fn sort_values_json(specs: &[SortSpec], ti: usize, key: &[SV]) -> Value {
    let values = specs.iter().zip(key).map(|(spec, v)| match (spec, v) {
        (SortSpec::Field(f), SV::I(i)) if f.is_date() && f.format.is_some() => {
            if *i == i64::MAX || *i == i64::MIN {
                return Value::Null;
            }
            let unit = if f.nanos_at(ti) { 1 } else { 1_000_000 };
            let fmt = f.format.as_deref().unwrap_or_default();
            json!(time::format_nanos(*i as i128 * unit, fmt))
        }
        _ => sv_json(v),
    });
    Value::Array(values.collect())
}

fn parse_order(v: &Value) -> EsResult<bool> {
    match v.as_str() {
        Some("asc") | Some("ASC") => Ok(false),
        Some("desc") | Some("DESC") => Ok(true),
        _ => Err(EsError::bad_request(format!(
            "Unknown SortOrder [{}]",
            v.as_str().unwrap_or(&v.to_string())
        ))),
    }
}

pub(crate) fn fielddata_err(name: &str, index: &str) -> EsError {
    EsError::bad_request(format!(
        "Fielddata is disabled on [{name}] in [{index}]. Text fields are not optimised for operations that require per-document field data like aggregations and sorting, so these operations are disabled by default. Please use a keyword field instead. Alternatively, set fielddata=true on [{name}] in order to load field data by uninverting the inverted index. Note that this can use significant memory."
    ))
}

fn id_fielddata_err() -> EsError {
    EsError::bad_request(
        "Fielddata access on the _id field is disallowed, you can re-enable it by updating the dynamic cluster setting: indices.id_field_data.enabled",
    )
}

/// The options of one field sort (`{"f": {"order": ..., ...}}`).
#[derive(Default)]
struct SortOpts {
    desc: Option<bool>,
    missing: Option<Value>,
    unmapped_type: Option<String>,
    mode: Option<String>,
    numeric_type: Option<String>,
    format: Option<String>,
}

fn parse_opts(opts: Option<&Value>) -> EsResult<SortOpts> {
    let mut o = SortOpts::default();
    match opts {
        None => {}
        Some(v @ Value::String(_)) => o.desc = Some(parse_order(v)?),
        Some(Value::Object(m)) => {
            for (k, v) in m {
                match k.as_str() {
                    "order" => o.desc = Some(parse_order(v)?),
                    "missing" => o.missing = Some(v.clone()),
                    "unmapped_type" => o.unmapped_type = v.as_str().map(str::to_string),
                    "mode" => o.mode = v.as_str().map(str::to_string),
                    "numeric_type" => o.numeric_type = Some(numeric_type(v)?),
                    "format" => o.format = v.as_str().map(str::to_string),
                    "nested" | "script" => {
                        return Err(EsError::unsupported(&format!("[{k}] in sort")));
                    }
                    other => {
                        return Err(EsError::parsing(format!(
                            "[field_sort] unknown field [{other}]"
                        )));
                    }
                }
            }
        }
        Some(_) => return Err(EsError::parsing("malformed sort format")),
    }
    Ok(o)
}

fn numeric_type(v: &Value) -> EsResult<String> {
    let t = v
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string());
    if ["long", "double", "date", "date_nanos"].contains(&t.as_str()) {
        return Ok(t);
    }
    Err(EsError::new(
        400,
        "x_content_parse_exception",
        "[field_sort] failed to parse field [numeric_type]",
    )
    .caused_by(json!({
        "type": "illegal_argument_exception",
        "reason": format!("invalid value for [numeric_type], must be [long, double, date, date_nanos], got {t}"),
    })))
}

/// Compiles `sort` (a string, an object or an array of them) against the targets.
pub(crate) fn compile_sort(sort: &Value, targets: &[Target], pit: bool) -> EsResult<Vec<SortSpec>> {
    let items: Vec<Value> = match sort {
        Value::Array(a) => a.clone(),
        other => vec![other.clone()],
    };
    let mut out = Vec::new();
    for it in items {
        let (field, opts): (String, Option<&Value>) = match &it {
            Value::String(s) => (s.clone(), None),
            Value::Object(m) if m.len() == 1 => {
                let (k, v) = m.iter().next().expect("one");
                (k.clone(), Some(v))
            }
            _ => {
                return Err(EsError::parsing(
                    "malformed sort format, within the sort array, an object, or an actual string are allowed",
                ));
            }
        };
        let o = parse_opts(opts)?;
        out.push(match field.as_str() {
            "_score" => SortSpec::Score {
                desc: o.desc.unwrap_or(true),
            },
            "_doc" => SortSpec::Doc {
                desc: o.desc.unwrap_or(false),
            },
            "_shard_doc" if !pit => {
                return Err(EsError::bad_request(
                    "[_shard_doc] sort field cannot be used without [point in time]",
                ));
            }
            "_shard_doc" => SortSpec::ShardDoc {
                desc: o.desc.unwrap_or(false),
            },
            "_id" => return Err(id_fielddata_err()),
            _ => SortSpec::Field(Box::new(field_sort(field, o, targets)?)),
        });
    }
    Ok(out)
}

/// Resolves a field sort: the field's id and type in every target, checked as Elasticsearch
/// checks it (text fields, doc values, unmapped fields, formats).
fn field_sort(field: String, o: SortOpts, targets: &[Target]) -> EsResult<FieldSort> {
    let mut fids = Vec::new();
    let mut nanos = Vec::new();
    let mut ty = None;
    let mut field_format = None;
    for t in targets {
        let Some(f) = t.mapping.field(&field) else {
            fids.push(None);
            nanos.push(false);
            continue;
        };
        if f.ty == FType::Text {
            return Err(fielddata_err(&field, &t.name));
        }
        if f.ty == FType::Binary || !f.doc_values {
            return Err(EsError::bad_request(format!(
                "Can't load fielddata on [{field}] because fielddata is unsupported on fields of type [{}]. Use doc values instead.",
                f.ty.name()
            )));
        }
        ty.get_or_insert(f.ty);
        field_format.get_or_insert_with(|| f.format.clone());
        fids.push(Some(f.id));
        nanos.push(f.ty == FType::DateNanos);
    }
    let ty = match ty {
        Some(t) => t,
        None => unmapped_type(&field, o.unmapped_type.as_deref(), targets)?,
    };
    let is_date = matches!(ty, FType::Date | FType::DateNanos);
    if let Some(f) = &o.format {
        check_sort_format(&field, ty, f)?;
    }
    let numeric_nanos = match o.numeric_type.as_deref() {
        Some("date") if is_date => Some(false),
        Some("date_nanos") if is_date => Some(true),
        Some("long") if !ty.is_float() => None,
        Some("double") if ty.is_float() => None,
        Some(n) => {
            return Err(EsError::unsupported(&format!(
                "numeric_type [{n}] on a field of type [{}]",
                ty.name()
            )));
        }
        None => None,
    };
    let desc = o.desc.unwrap_or(false);
    let max_mode = match o.mode.as_deref() {
        Some("max") => true,
        Some("min") => false,
        Some("avg") | Some("sum") | Some("median") => {
            return Err(EsError::unsupported("sort modes other than min/max"));
        }
        _ => desc,
    };
    let missing_last = !matches!(o.missing.as_ref().and_then(Value::as_str), Some("_first"));
    let missing = o
        .missing
        .filter(|m| m.as_str() != Some("_first") && m.as_str() != Some("_last"));
    Ok(FieldSort {
        parse_format: o
            .format
            .clone()
            .or(field_format)
            .unwrap_or_else(|| "strict_date_optional_time||epoch_millis".into()),
        name: field,
        fids,
        nanos,
        ty,
        desc,
        missing_last,
        missing,
        max_mode,
        numeric_nanos,
        format: o.format.filter(|_| is_date),
    })
}

/// The type a field mapped in no target sorts as (`unmapped_type`), or Elasticsearch's error.
fn unmapped_type(field: &str, unmapped: Option<&str>, targets: &[Target]) -> EsResult<FType> {
    Ok(match unmapped {
        Some("keyword") | Some("text") => FType::Keyword,
        Some("double") | Some("float") => FType::Double,
        Some("date") => FType::Date,
        Some("date_nanos") => FType::DateNanos,
        Some("boolean") => FType::Boolean,
        Some(_) => FType::Long,
        None => {
            return Err(EsError::new(
                400,
                "query_shard_exception",
                format!("No mapping found for [{field}] in order to sort on"),
            )
            .with("index_uuid", "_na_")
            .with(
                "index",
                targets.first().map(|t| t.name.clone()).unwrap_or_default(),
            ));
        }
    })
}

/// A sort `format` is for dates; Elasticsearch refuses it on other fields (with these
/// messages) and refuses unknown pattern letters.
fn check_sort_format(field: &str, ty: FType, format: &str) -> EsResult<()> {
    match ty {
        FType::Date | FType::DateNanos => match time::check_format(format) {
            Ok(()) => Ok(()),
            Err(FormatError::UnknownLetter(c)) => Err(EsError::bad_request(format!(
                "Invalid format: [{format}]: Unknown pattern letter: {c}"
            ))
            .caused_by(json!({
                "type": "illegal_argument_exception",
                "reason": format!("Unknown pattern letter: {c}"),
            }))),
            Err(FormatError::Unsupported(what)) => Err(EsError::unsupported(&what)),
        },
        t if t.is_float()
            || matches!(t, FType::Long | FType::Integer | FType::Short | FType::Byte) =>
        {
            Err(EsError::bad_request(
                "require a date_time formatter; got [decimal]",
            ))
        }
        t => Err(EsError::bad_request(format!(
            "Field [{field}] of type [{}] does not support custom formats",
            t.name()
        ))),
    }
}

/// The sort value of a document of target `ti` for a field sort.
pub(crate) fn field_sv<'a>(f: &FieldSort, ti: usize, doc: &'a Doc) -> SV<'a> {
    let fv = f.fids[ti].and_then(|id| doc.indexed.get(id));
    let present = match fv {
        Some(FV::Long(v)) if !v.is_empty() => {
            let x = if f.max_mode {
                *v.iter().max().expect("ne")
            } else {
                *v.iter().min().expect("ne")
            };
            Some(SV::I(match (f.numeric_nanos, f.nanos[ti]) {
                (Some(true), false) => x.saturating_mul(1_000_000),
                (Some(false), true) => x.div_euclid(1_000_000),
                _ => x,
            }))
        }
        Some(FV::Double(v)) if !v.is_empty() => {
            let it = v.iter().copied();
            Some(SV::F(if f.max_mode {
                it.fold(f64::MIN, f64::max)
            } else {
                it.fold(f64::MAX, f64::min)
            }))
        }
        Some(FV::Kw(v)) if !v.is_empty() => {
            let it = v.iter();
            Some(SV::S(Some(Cow::Borrowed(if f.max_mode {
                &**it.max().expect("ne")
            } else {
                &**it.min().expect("ne")
            }))))
        }
        _ => None,
    };
    present.unwrap_or_else(|| missing_sv(f))
}

/// The sort value of a document without the field: `missing`, else the end it sorts to.
fn missing_sv(f: &FieldSort) -> SV<'static> {
    let last = f.missing_last != f.desc;
    match f.ty {
        FType::Keyword | FType::Text => SV::S(f.missing.as_ref().map(|m| {
            Cow::Owned(
                m.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| m.to_string()),
            )
        })),
        t if t.is_float() => match f.missing.as_ref().and_then(Value::as_f64) {
            Some(x) => SV::F(x),
            None => SV::F(if last { f64::MAX } else { f64::MIN }),
        },
        _ => match f.missing.as_ref().and_then(|m| {
            m.as_i64()
                .or_else(|| m.as_str().and_then(|s| s.parse().ok()))
        }) {
            Some(i) => SV::I(i),
            None => SV::I(if last { i64::MAX } else { i64::MIN }),
        },
    }
}

fn cmp_one(spec: &SortSpec, a: &SV, b: &SV) -> Ordering {
    let (desc, missing_last) = match spec {
        SortSpec::Field(f) => (f.desc, f.missing_last),
        SortSpec::Score { desc } | SortSpec::Doc { desc } | SortSpec::ShardDoc { desc } => {
            (*desc, true)
        }
    };
    let natural = match (a, b) {
        (SV::I(x), SV::I(y)) => x.cmp(y),
        (SV::F(x), SV::F(y)) => x.partial_cmp(y).unwrap_or(Ordering::Equal),
        (SV::Score(x), SV::Score(y)) => x.partial_cmp(y).unwrap_or(Ordering::Equal),
        (SV::I(x), SV::F(y)) => (*x as f64).partial_cmp(y).unwrap_or(Ordering::Equal),
        (SV::F(x), SV::I(y)) => x.partial_cmp(&(*y as f64)).unwrap_or(Ordering::Equal),
        (SV::S(None), SV::S(None)) => Ordering::Equal,
        (SV::S(None), SV::S(Some(_))) => {
            return if missing_last {
                Ordering::Greater
            } else {
                Ordering::Less
            };
        }
        (SV::S(Some(_)), SV::S(None)) => {
            return if missing_last {
                Ordering::Less
            } else {
                Ordering::Greater
            };
        }
        (SV::S(Some(x)), SV::S(Some(y))) => x.as_bytes().cmp(y.as_bytes()),
        _ => Ordering::Equal,
    };
    if desc { natural.reverse() } else { natural }
}

pub(crate) fn cmp_keys(specs: &[SortSpec], a: &[SV], b: &[SV]) -> Ordering {
    for (i, s) in specs.iter().enumerate() {
        let o = cmp_one(s, &a[i], &b[i]);
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

fn after_fail(name: &str, v: &Value) -> EsError {
    let e = EsError::bad_request(format!(
        "Failed to parse search_after value for field [{name}]."
    ));
    match v {
        Value::String(_) | Value::Bool(_) => e.caused_by(json!({
            "type": "number_format_exception",
            "reason": format!("For input string: \"{}\"", v.as_str().map_or_else(|| v.to_string(), str::to_string)),
        })),
        _ => e,
    }
}

/// Reads one `search_after` value for its sort.
pub(crate) fn after_value(spec: &SortSpec, v: &Value) -> EsResult<SV<'static>> {
    let num = |v: &Value| {
        v.as_f64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    };
    Ok(match spec {
        SortSpec::Score { .. } => SV::Score(num(v).ok_or_else(|| after_fail("_score", v))? as f32),
        SortSpec::Doc { .. } | SortSpec::ShardDoc { .. } => SV::I(
            v.as_i64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .ok_or_else(|| after_fail("_doc", v))?,
        ),
        SortSpec::Field(f) => match f.ty {
            FType::Keyword | FType::Text => match v {
                Value::Null => SV::S(None),
                Value::String(s) => SV::S(Some(Cow::Owned(s.clone()))),
                other => SV::S(Some(Cow::Owned(other.to_string()))),
            },
            t if t.is_float() => SV::F(num(v).ok_or_else(|| after_fail(&f.name, v))?),
            FType::Boolean => SV::I(match v {
                Value::Bool(b) => *b as i64,
                Value::String(s) if s == "true" => 1,
                Value::String(s) if s == "false" => 0,
                other => other.as_i64().ok_or_else(|| after_fail(&f.name, v))?,
            }),
            FType::Date | FType::DateNanos if !v.is_number() => SV::I(after_date(f, v)?),
            _ => SV::I(
                v.as_i64()
                    .or_else(|| v.as_f64().map(|x| x as i64))
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                    .ok_or_else(|| after_fail(&f.name, v))?,
            ),
        },
    })
}

/// A `search_after` date given as text: read with the sort's `format`, else the field's
/// (numbers are taken as they are: epoch milliseconds, or nanoseconds for `date_nanos`).
fn after_date(f: &FieldSort, v: &Value) -> EsResult<i64> {
    let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
    let fmt = &f.parse_format;
    let unit = if f.after_nanos() { 1 } else { 1_000_000 };
    time::parse_date_nanos(&text, fmt)
        .and_then(|ns| i64::try_from(ns.div_euclid(unit)).ok())
        .ok_or_else(|| {
            let why = format!("failed to parse date field [{text}] with format [{fmt}]");
            EsError::new(400, "parse_exception", format!("{why}: [{why}]"))
                .caused_by(json!({"type": "illegal_argument_exception", "reason": why}))
        })
}
