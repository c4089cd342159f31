//! Documents to rows: a JSON value to its column value ([`Col`]), a
//! source to the columns and side-table values written for it ([`Encoded`]),
//! and the writes of the side tables (`Keywords` rows, FTS5 text).

use std::borrow::Cow;

use rusqlite::types::{ToSqlOutput, Value as SqlValue, ValueRef};
use rusqlite::{Connection, OptionalExtension, ToSql};
use serde_json::Value;

use super::tables::{TableSql, columns, dead_table, side_fields, side_table, text_table};
use super::{invalid, sql_err};
use crate::store::schema::{Field, FieldType};
use crate::store::{Idx, StoreResult};

/// A field's column value, borrowing from the document where it can.
#[derive(Debug)]
pub(super) enum Col<'a> {
    Null,
    Int(i64),
    Text(Cow<'a, str>),
}

impl ToSql for Col<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Col::Null => ValueRef::Null,
            Col::Int(i) => ValueRef::Integer(*i),
            Col::Text(s) => ValueRef::Text(s.as_bytes()),
        }))
    }
}

impl From<Col<'_>> for SqlValue {
    fn from(c: Col<'_>) -> SqlValue {
        match c {
            Col::Null => SqlValue::Null,
            Col::Int(i) => SqlValue::Integer(i),
            Col::Text(s) => SqlValue::Text(s.into_owned()),
        }
    }
}

/// Converts a JSON value to the column type of `f`, coercing like an
/// Elasticsearch mapping does (numbers to keyword strings, numeric strings to
/// longs, "true"/"false" to booleans). Arrays and objects are rejected for
/// now: Elasticsearch would index an array as a multi-valued field, which a
/// single column can't represent.
pub(super) fn field_value<'a>(f: &Field, v: &'a Value) -> Result<Col<'a>, String> {
    use FieldType::*;
    let bad = || Err(format!("field {:?} ({:?}) cannot hold {v}", f.name, f.ty));
    match (f.ty, v) {
        (_, Value::Null) => Ok(Col::Null),
        (_, Value::Array(_) | Value::Object(_)) => bad(),
        (Text, Value::String(s)) => Ok(Col::Text(Cow::Borrowed(s))),
        (Keyword | KeywordText | Path | Keywords, Value::String(s)) => {
            Ok(Col::Text(Cow::Borrowed(s)))
        }
        (Keyword | KeywordText | Path | Keywords, Value::Number(n)) => {
            Ok(Col::Text(Cow::Owned(n.to_string())))
        }
        (Keyword | KeywordText | Path | Keywords, Value::Bool(b)) => {
            Ok(Col::Text(Cow::Owned(b.to_string())))
        }
        (Long | Date, Value::Number(n)) => match n.as_i64() {
            Some(i) => Ok(Col::Int(i)),
            // Integral floats only; no silent truncation.
            None => match n.as_f64() {
                Some(x) if x.fract() == 0.0 && x >= i64::MIN as f64 && x < i64::MAX as f64 => {
                    Ok(Col::Int(x as i64))
                }
                _ => bad(),
            },
        },
        (Long | Date, Value::String(s)) => s.parse().map(Col::Int).or_else(|_| bad()),
        (Bool, Value::Bool(b)) => Ok(Col::Int(*b as i64)),
        (Bool, Value::String(s)) if s == "true" || s == "false" => {
            Ok(Col::Int((s == "true") as i64))
        }
        _ => bad(),
    }
}

/// A query value for `f` (never null).
pub(super) fn param(f: &Field, v: &Value) -> StoreResult<SqlValue> {
    if v.is_null() {
        return Err(invalid(format!("null value for field {:?}", f.name)));
    }
    field_value(f, v).map(SqlValue::from).map_err(invalid)
}

/// A column value back as JSON (sort values).
pub(super) fn json_of(f: &Field, v: ValueRef<'_>) -> rusqlite::Result<Value> {
    Ok(match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) if f.ty == FieldType::Bool => Value::Bool(i != 0),
        ValueRef::Integer(i) => Value::from(i),
        ValueRef::Text(_) => Value::String(v.as_str()?.to_owned()),
        ValueRef::Real(x) => Value::from(x),
        ValueRef::Blob(_) => {
            return Err(rusqlite::Error::InvalidColumnType(
                0,
                f.name.into(),
                v.data_type(),
            ));
        }
    })
}

/// A validated document ready to be written: the source without its `Text`
/// fields, the column values, and the side-table values (in
/// `side_fields` order).
pub(super) struct Encoded<'a> {
    pub(super) src: Vec<u8>,
    pub(super) cols: Vec<Col<'a>>,
    pub(super) side: Vec<Side<'a>>,
}

pub(super) enum Side<'a> {
    Text(Option<&'a str>),
    Keywords(Vec<String>),
}

/// The values of a `Keywords` field: a scalar or an array of scalars.
pub(super) fn keywords_of(f: &Field, v: &Value) -> Result<Vec<String>, String> {
    let one = |v: &Value| -> Result<Option<String>, String> {
        Ok(match field_value(f, v)? {
            Col::Text(s) => Some(s.into_owned()),
            Col::Null => None,
            Col::Int(i) => Some(i.to_string()),
        })
    };
    match v {
        Value::Array(items) => Ok(items
            .iter()
            .map(one)
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect()),
        v => Ok(one(v)?.into_iter().collect()),
    }
}

pub(super) fn encode<'a>(idx: Idx, source: &'a Value) -> StoreResult<Encoded<'a>> {
    let Value::Object(map) = source else {
        return Err(invalid("document source must be a JSON object"));
    };
    let cols = columns(idx)
        .map(|f| map.get(f.name).map_or(Ok(Col::Null), |v| field_value(f, v)))
        .collect::<Result<_, _>>()
        .map_err(invalid)?;
    let mut side = Vec::new();
    let mut texts = Vec::new();
    for f in side_fields(idx) {
        let v = map.get(f.name).unwrap_or(&Value::Null);
        side.push(if f.ty == FieldType::Text {
            texts.push(f.name);
            match v {
                Value::Null => Side::Text(None),
                Value::String(s) => Side::Text(Some(s)),
                _ => return Err(invalid(format!("text field {:?} cannot hold {v}", f.name))),
            }
        } else {
            Side::Keywords(keywords_of(f, v).map_err(invalid)?)
        });
    }
    let src = if texts.iter().any(|t| map.contains_key(*t)) {
        let rest: serde_json::Map<String, Value> = map
            .iter()
            .filter(|(k, _)| !texts.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        serde_json::to_vec(&rest)
    } else {
        serde_json::to_vec(source)
    }
    .map_err(|e| invalid(e.to_string()))?;
    Ok(Encoded { src, cols, side })
}

pub(super) fn write_keywords(
    conn: &Connection,
    table: &str,
    rid: i64,
    vals: &[String],
) -> rusqlite::Result<()> {
    conn.prepare_cached(&format!("DELETE FROM \"{table}\" WHERE rid = ?1"))?
        .execute([rid])?;
    let mut ins = conn.prepare_cached(&format!(
        "INSERT OR IGNORE INTO \"{table}\" (v, rid) VALUES (?1, ?2)"
    ))?;
    for v in vals {
        ins.execute(rusqlite::params![v, rid])?;
    }
    Ok(())
}

/// Rewrites the side-table rows of the document in row `rid` (just
/// written; `fresh`: just inserted, so it has none yet). Unchanged values
/// (an attribute refresh) are left alone: no FTS re-tokenizing, no pages.
/// With `only`, fields not in it are left alone too (a partial update).
pub(super) fn write_side(
    conn: &Connection,
    t: &TableSql,
    rid: i64,
    side: &[Side<'_>],
    fresh: bool,
    only: Option<&serde_json::Map<String, Value>>,
) -> rusqlite::Result<()> {
    for (f, v) in side_fields(t.idx).zip(side) {
        if only.is_some_and(|m| !m.contains_key(f.name)) {
            continue;
        }
        let st = side_table(t.idx, f);
        match v {
            Side::Keywords(vals) => {
                if !fresh {
                    let mut old: Vec<String> = conn
                        .prepare_cached(&format!("SELECT v FROM \"{st}\" WHERE rid = ?1"))?
                        .query_map([rid], |r| r.get(0))?
                        .collect::<rusqlite::Result<_>>()?;
                    old.sort();
                    let mut new = vals.clone();
                    new.sort();
                    new.dedup();
                    if old == new {
                        continue;
                    }
                } else if vals.is_empty() {
                    continue;
                }
                write_keywords(conn, &st, rid, vals)?
            }
            Side::Text(new) => {
                let tt = text_table(&st);
                let old: Option<String> = if fresh {
                    None
                } else {
                    conn.prepare_cached(&format!("SELECT v FROM \"{tt}\" WHERE rid = ?1"))?
                        .query_row([rid], |r| r.get(0))
                        .optional()?
                };
                if old.as_deref() == *new {
                    continue;
                }
                if old.is_some() {
                    conn.prepare_cached(&format!("DELETE FROM \"{st}\" WHERE rowid = ?1"))?
                        .execute([rid])?;
                    conn.prepare_cached(&format!("DELETE FROM \"{tt}\" WHERE rid = ?1"))?
                        .execute([rid])?;
                }
                if let Some(text) = new {
                    // A reused rid whose old index row is still queued for
                    // purging: purge it first, or the two texts would mix.
                    let queued = conn
                        .prepare_cached(&format!(
                            "DELETE FROM \"{}\" WHERE rid = ?1",
                            dead_table(&st)
                        ))?
                        .execute([rid])?;
                    if queued > 0 {
                        conn.prepare_cached(&format!("DELETE FROM \"{st}\" WHERE rowid = ?1"))?
                            .execute([rid])?;
                    }
                    conn.prepare_cached(&format!(
                        "INSERT INTO \"{st}\" (rowid, v) VALUES (?1, ?2)"
                    ))?
                    .execute(rusqlite::params![rid, text])?;
                    conn.prepare_cached(&format!("INSERT INTO \"{tt}\" (rid, v) VALUES (?1, ?2)"))?
                        .execute(rusqlite::params![rid, text])?;
                }
            }
        }
    }
    Ok(())
}

/// Puts the `Text` fields of the document with row `rid` back into its source.
pub(super) fn attach_text(
    conn: &Connection,
    idx: Idx,
    rid: i64,
    source: &mut Value,
) -> StoreResult<()> {
    for f in side_fields(idx).filter(|f| f.ty == FieldType::Text) {
        let tt = text_table(&side_table(idx, f));
        let text: Option<String> = conn
            .prepare_cached(&format!("SELECT v FROM \"{tt}\" WHERE rid = ?1"))
            .and_then(|mut s| s.query_row([rid], |r| r.get(0)).optional())
            .map_err(sql_err)?;
        if let (Some(text), Value::Object(map)) = (text, &mut *source) {
            map.insert(f.name.to_string(), Value::String(text));
        }
    }
    Ok(())
}
