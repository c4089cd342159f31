//! Writes in the open transaction: seq_no reservation and the redo log
//! ([`SeqState`]), insert/update/delete of one document with its version
//! checks, bulks, the store-side
//! path rebase, and the replay of a redo log.

use std::time::Instant;

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, Statement};
use serde_json::Value;

use super::encode::{Col, Encoded, Side, encode, write_side};
use super::read::parse_source;
use super::redo::{self, RedoLog};
use super::tables::{TableSql, side_fields};
use super::{SEQ_BLOCK, SEQ_KEY, check_id, expected_seq, invalid, sql_err, version};
use crate::store::schema::FieldType;
use crate::store::{BulkItemResult, BulkOp, Idx, StoreError, StoreResult, Version};

pub(super) struct Writer {
    pub(super) conn: Connection,
    pub(super) seq: SeqState,
    /// When the open transaction began, and the last write in it.
    pub(super) opened: Instant,
    pub(super) last_write: Instant,
}

/// `next` is the next seq_no to hand out; every seq_no below `reserved` is
/// covered by the value persisted in `_seq`, which always exceeds every
/// committed seq_no (so reopening never reuses one, even after deletes).
/// Also the redo log (deferred commits), which every write appends to.
pub(super) struct SeqState {
    pub(super) next: u64,
    pub(super) reserved: u64,
    pub(super) redo: Option<RedoLog>,
}

impl SeqState {
    /// Makes sure `n` more seq_nos are reserved on disk (in the current
    /// transaction if there is one).
    pub(super) fn reserve(&mut self, conn: &Connection, n: u64) -> rusqlite::Result<()> {
        if self.next + n <= self.reserved {
            return Ok(());
        }
        let upto = self.next + n + SEQ_BLOCK;
        conn.prepare_cached("UPDATE _seq SET v = ?1 WHERE k = ?2")?
            .execute([upto as i64, SEQ_KEY])?;
        self.reserved = upto;
        Ok(())
    }

    /// `only`: a partial update's fields (its other `Text` fields kept).
    pub(super) fn log_put(
        &mut self,
        changed: usize,
        t: &TableSql,
        id: &str,
        seq: i64,
        doc: &Encoded<'_>,
        only: Option<&serde_json::Map<String, Value>>,
    ) {
        let Some(log) = self.redo.as_mut().filter(|_| changed > 0) else {
            return;
        };
        let texts: Vec<(&str, Option<&str>)> = side_fields(t.idx)
            .zip(&doc.side)
            .filter_map(|(f, v)| match v {
                Side::Text(text) if only.is_none_or(|m| m.contains_key(f.name)) => {
                    Some((f.name, *text))
                }
                _ => None,
            })
            .collect();
        log.put(t.idx, id, seq, &doc.src, &texts);
    }

    /// `seq`: the delete's own seq_no (its version in the reply), which
    /// replay must not hand out again.
    pub(super) fn log_delete(&mut self, changed: usize, idx: Idx, id: &str, seq: i64) {
        if let (Some(log), true) = (self.redo.as_mut(), changed > 0) {
            log.delete(idx, id, seq);
        }
    }
}

/// Inserts a new row (the id must be absent: 0 rows otherwise).
pub(super) fn insert_row(
    conn: &Connection,
    t: &TableSql,
    id: &str,
    seq: i64,
    doc: &Encoded<'_>,
) -> rusqlite::Result<usize> {
    let mut stmt = conn.prepare_cached(&t.create)?;
    bind_doc(&mut stmt, id, seq, doc)?;
    let n = stmt.raw_execute()?;
    if n > 0 && t.side {
        write_side(conn, t, conn.last_insert_rowid(), &doc.side, true, None)?;
    }
    Ok(n)
}

#[derive(Clone, Copy)]
pub(super) enum Write<'a> {
    Create(&'a Value),
    Put(&'a Value, Option<Version>),
    Update(&'a Value, Option<Version>),
    Delete(Option<Version>),
}

/// A row as it is: rid, seq, source and column values.
pub(super) type Current = (i64, i64, Vec<u8>, Vec<SqlValue>);

pub(super) fn current(
    conn: &Connection,
    t: &TableSql,
    id: &str,
) -> rusqlite::Result<Option<Current>> {
    conn.prepare_cached(&t.current)?
        .query_row([id], |r| {
            let cols = (0..t.cols.len())
                .map(|i| r.get::<_, SqlValue>(i + 3))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, cols))
        })
        .optional()
}

/// Rewrites row `rid` with `doc`. Only changed columns are set: an index
/// whose column is not in the SET list is not touched (no page written).
/// `side_only`: rewrite just these side fields (a partial update).
pub(super) fn update_row(
    conn: &Connection,
    t: &TableSql,
    rid: i64,
    seq: i64,
    doc: &Encoded<'_>,
    old: &[SqlValue],
    side_only: Option<&serde_json::Map<String, Value>>,
) -> rusqlite::Result<usize> {
    let changed: Vec<usize> = doc
        .cols
        .iter()
        .zip(old)
        .enumerate()
        .filter(|(_, (new, old))| !same(new, old))
        .map(|(i, _)| i)
        .collect();
    let mut stmt = conn.prepare_cached(&t.update(&changed))?;
    stmt.raw_bind_parameter(1, seq)?;
    stmt.raw_bind_parameter(2, &doc.src[..])?;
    for (k, &i) in changed.iter().enumerate() {
        stmt.raw_bind_parameter(k + 3, &doc.cols[i])?;
    }
    stmt.raw_bind_parameter(changed.len() + 3, rid)?;
    let n = stmt.raw_execute()?;
    if t.side {
        write_side(conn, t, rid, &doc.side, false, side_only)?;
    }
    Ok(n)
}

/// Applies one write. The outer error fails the whole request (SQLite); the
/// inner one is the item's own (conflict, not found, invalid). A delete of an
/// absent document is `NotFound`.
pub(super) fn apply(
    conn: &Connection,
    seq: &mut SeqState,
    t: &TableSql,
    id: &str,
    op: Write<'_>,
) -> rusqlite::Result<StoreResult<Version>> {
    if let Err(e) = check_id(id) {
        return Ok(Err(e));
    }
    let new_seq = seq.next as i64;
    let conflict = || Ok(Err(StoreError::Conflict(id.to_string())));
    let changed = match op {
        Write::Update(partial, if_version) => {
            let Value::Object(fields) = partial else {
                return Ok(Err(invalid("partial document must be a JSON object")));
            };
            let Some((rid, cur_seq, src, old)) = current(conn, t, id)? else {
                return Ok(Err(StoreError::NotFound(id.to_string())));
            };
            if let Some(v) = if_version
                && expected_seq(v) != Some(cur_seq)
            {
                return conflict();
            }
            let mut merged = match parse_source(&src) {
                Ok(Value::Object(m)) => m,
                Ok(_) => return Ok(Err(invalid("stored source is not an object"))),
                Err(e) => return Ok(Err(e)),
            };
            for (k, v) in fields {
                merged.insert(k.clone(), v.clone());
            }
            let merged = Value::Object(merged);
            let doc = match encode(t.idx, &merged) {
                Ok(d) => d,
                Err(e) => return Ok(Err(e)),
            };
            let n = update_row(conn, t, rid, new_seq, &doc, &old, Some(fields))?;
            seq.log_put(n, t, id, new_seq, &doc, Some(fields));
            n
        }
        Write::Create(source) | Write::Put(source, _) => {
            let doc = match encode(t.idx, source) {
                Ok(d) => d,
                Err(e) => return Ok(Err(e)),
            };
            let current = match op {
                Write::Create(_) => None,
                _ => current(conn, t, id)?,
            };
            let n = match (op, current) {
                // ES answers 409 to a conditional write of a missing document.
                (Write::Put(_, Some(_)), None) => return conflict(),
                (_, None) => insert_row(conn, t, id, new_seq, &doc)?,
                (_, Some((rid, cur_seq, _, old))) => {
                    if let Write::Put(_, Some(v)) = op
                        && expected_seq(v) != Some(cur_seq)
                    {
                        return conflict();
                    }
                    update_row(conn, t, rid, new_seq, &doc, &old, None)?
                }
            };
            seq.log_put(n, t, id, new_seq, &doc, None);
            n
        }
        Write::Delete(None) => {
            let n = conn.prepare_cached(&t.delete)?.execute([id])?;
            if n == 0 {
                return Ok(Err(StoreError::NotFound(id.to_string())));
            }
            seq.log_delete(n, t.idx, id, new_seq);
            n
        }
        Write::Delete(Some(v)) => {
            let n = match expected_seq(v) {
                Some(s) => conn
                    .prepare_cached(&t.delete_if)?
                    .execute(rusqlite::params![id, s])?,
                None => 0,
            };
            seq.log_delete(n, t.idx, id, new_seq);
            n
        }
    };
    if changed == 0 {
        // create: the id exists; if_version: stale or absent (ES answers 409).
        return conflict();
    }
    seq.next += 1;
    Ok(Ok(version(new_seq)))
}

/// Runs a bulk as one savepoint: a crash or an SQLite error never leaves
/// half of it applied. With `refused`, all or nothing: if an item fails,
/// the savepoint is rolled back and `refused` gets the results.
pub(super) fn bulk_tx(
    conn: &mut Connection,
    seq: &mut SeqState,
    tables: &[TableSql],
    ops: &[BulkOp],
    refused: Option<&mut Option<Vec<BulkItemResult>>>,
) -> rusqlite::Result<Vec<BulkItemResult>> {
    savepoint(conn, |tx| {
        seq.reserve(tx, ops.len() as u64)?;
        let results: Vec<BulkItemResult> = ops
            .iter()
            .map(|op| apply_op(tx, seq, tables, op))
            .collect::<rusqlite::Result<_>>()?;
        if let Some(refused) = refused
            && results.iter().any(|r| r.is_err())
        {
            *refused = Some(
                results
                    .into_iter()
                    .map(|r| {
                        r.and(Err(StoreError::Conflict(
                            "not applied: another item of the bulk failed".into(),
                        )))
                    })
                    .collect(),
            );
            // Rolls the savepoint back; the caller reports `refused`.
            return Err(rusqlite::Error::ToSqlConversionFailure(
                "bulk refused".into(),
            ));
        }
        Ok(results)
    })
}

/// One bulk item.
pub(super) fn apply_op(
    tx: &Connection,
    seq: &mut SeqState,
    tables: &[TableSql],
    op: &BulkOp,
) -> rusqlite::Result<BulkItemResult> {
    let (idx, id, write) = match op {
        BulkOp::Create { index, id, source } => (*index, id, Write::Create(source)),
        BulkOp::Index {
            index,
            id,
            source,
            if_version,
        } => (*index, id, Write::Put(source, *if_version)),
        BulkOp::Update {
            index,
            id,
            doc,
            if_version,
        } => (*index, id, Write::Update(doc, *if_version)),
        BulkOp::Delete {
            index,
            id,
            if_version,
        } => (*index, id, Write::Delete(*if_version)),
    };
    let table = &tables[idx as usize];
    debug_assert_eq!(table.idx, idx);
    apply(tx, seq, table, id, write)
}

/// Runs `f` in a savepoint (rolled back if it fails), through cached
/// statements: rusqlite's `Connection::savepoint` parses its SQL on every
/// call, a measurable share of a one-bulk rename.
pub(super) fn savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached("SAVEPOINT bulk")?.execute([])?;
    let r = f(conn);
    if r.is_err() {
        // Fails harmlessly if SQLite already rolled the transaction back.
        let _ = conn
            .prepare_cached("ROLLBACK TO bulk")
            .and_then(|mut s| s.execute([]));
    }
    let released = conn
        .prepare_cached("RELEASE bulk")
        .and_then(|mut s| s.execute([]));
    match (r, released) {
        (Ok(v), Ok(_)) => Ok(v),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}

/// [`EmbeddedStore::rebase_paths`]'s statement in a savepoint; rows get
/// seq_nos `seq.next ..` in the order SQLite visits them.
pub(super) fn rebase_tx(
    conn: &mut Connection,
    seq: &mut SeqState,
    idx: Idx,
    old: &str,
    new: &str,
) -> rusqlite::Result<u64> {
    let base = seq.next as i64 - 1;
    let n = savepoint(conn, |tx| {
        let n = tx
            .prepare_cached(&rebase_sql(idx))?
            .execute(rusqlite::params![base, old, new])? as u64;
        seq.next += n;
        seq.reserve(tx, 0)?;
        Ok(n)
    })?;
    if let (Some(log), true) = (seq.redo.as_mut(), n > 0) {
        log.rebase(idx, base, old, new);
    }
    Ok(n)
}

/// [`MetaStore::rebase_paths`]'s statement for `idx`: parameters ?1 the
/// seq_no before the first row's, ?2 the old path, ?3 the new one.
/// SET expressions see the row's old values; substr/length count
/// characters, consistently, as paths are valid UTF-8.
pub(super) fn rebase_sql(idx: Idx) -> String {
    let t = idx.name();
    format!(
        "UPDATE \"{t}\" SET seq = ?1 + s.rn,
             f_path = ?3 || substr(f_path, length(?2) + 1),
             f_dir = ?3 || substr(f_dir, length(?2) + 1),
             src = CAST(json_set(CAST(src AS TEXT),
                 '$.path', ?3 || substr(f_path, length(?2) + 1),
                 '$.dir', ?3 || substr(f_dir, length(?2) + 1)) AS BLOB)
         FROM (SELECT rid, row_number() OVER () AS rn FROM \"{t}\"
               WHERE f_path >= (?2 || '/') AND f_path < (?2 || '0')) AS s
         WHERE \"{t}\".rid = s.rid"
    )
}

/// Applies a redo log's records (see [`redo`]) in the open transaction:
/// each row as it was after the logged write.
pub(super) fn replay(
    conn: &mut Connection,
    seq: &mut SeqState,
    tables: &[TableSql],
    records: Vec<Vec<redo::Op>>,
) -> StoreResult<()> {
    let mut last = seq.next as i64 - 1;
    for op in records.into_iter().flatten() {
        match op {
            redo::Op::Put {
                idx,
                id,
                seq: s,
                src,
                texts,
            } => {
                let t = &tables[idx as usize];
                let mut source = parse_source(&src)?;
                // Side fields to rewrite: the keywords (in the source) and
                // the texts the write set.
                let mut only = serde_json::Map::new();
                for f in side_fields(idx).filter(|f| f.ty != FieldType::Text) {
                    only.insert(f.name.to_string(), Value::Null);
                }
                for (name, text) in texts {
                    if let (Some(text), Value::Object(m)) = (text, &mut source) {
                        m.insert(name.clone(), Value::String(text));
                    }
                    only.insert(name, Value::Null);
                }
                let doc = encode(idx, &source)?;
                let n = match current(conn, t, &id).map_err(sql_err)? {
                    Some((rid, _, _, old)) => update_row(conn, t, rid, s, &doc, &old, Some(&only)),
                    None => insert_row(conn, t, &id, s, &doc),
                }
                .map_err(sql_err)?;
                if n != 1 {
                    return Err(invalid(format!("redo: put {id} changed {n} rows")));
                }
                last = last.max(s);
            }
            redo::Op::Delete { idx, id, seq: s } => {
                conn.prepare_cached(&tables[idx as usize].delete)
                    .and_then(|mut st| st.execute([&id]))
                    .map_err(sql_err)?;
                if let Some(s) = s {
                    last = last.max(s);
                }
            }
            redo::Op::Rebase {
                idx,
                base,
                old,
                new,
            } => {
                let n = conn
                    .prepare_cached(&rebase_sql(idx))
                    .and_then(|mut st| st.execute(rusqlite::params![base, old, new]))
                    .map_err(sql_err)?;
                last = last.max(base + n as i64);
            }
        }
    }
    seq.next = seq.next.max(last as u64 + 1);
    seq.reserve(conn, 0).map_err(sql_err)
}

/// Whether a column value equals what the row holds.
pub(super) fn same(new: &Col<'_>, old: &SqlValue) -> bool {
    match (new, old) {
        (Col::Null, SqlValue::Null) => true,
        (Col::Int(a), SqlValue::Integer(b)) => a == b,
        (Col::Text(a), SqlValue::Text(b)) => a == b,
        _ => false,
    }
}

pub(super) fn bind_doc(
    stmt: &mut Statement<'_>,
    id: &str,
    seq: i64,
    doc: &Encoded<'_>,
) -> rusqlite::Result<()> {
    stmt.raw_bind_parameter(1, id)?;
    stmt.raw_bind_parameter(2, seq)?;
    stmt.raw_bind_parameter(3, &doc.src[..])?;
    for (i, c) in doc.cols.iter().enumerate() {
        stmt.raw_bind_parameter(i + 4, c)?;
    }
    Ok(())
}
