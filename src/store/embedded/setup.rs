//! Creating the database's tables, indexes and side tables (see
//! `tables` for their names), and backfilling from the stored sources the
//! columns and keyword tables of fields declared since the database was
//! created.

use rusqlite::{Connection, OptionalExtension};
use serde_json::Value;

use super::encode::{Col, field_value, keywords_of, write_keywords};
use super::tables::{column, columns, dead_table, side_fields, side_table, sql_type, text_table};
use crate::store::Idx;
use crate::store::schema::{Field, FieldType};

/// Creates the tables and indexes; adds (and backfills from the sources) the
/// columns of fields declared since the database was created.
pub(super) fn init_schema(conn: &Connection) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    // Opening a store that is set up writes nothing (so `esfs fsck` and
    // `esfs search` never wait for the write lock of a busy mount): every
    // statement below is a no-op then.
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS _seq (k INTEGER PRIMARY KEY, v INTEGER NOT NULL)",
    )?;
    let has_seq: bool = tx.query_row("SELECT count(*) FROM _seq WHERE k = 0", [], |r| {
        Ok(r.get::<_, i64>(0)? > 0)
    })?;
    if !has_seq {
        tx.execute_batch("INSERT INTO _seq (k, v) VALUES (0, 0)")?;
    }
    for idx in Idx::ALL {
        let t = idx.name();
        for f in idx.fields() {
            // Names are spliced into SQL; keep them plain identifiers.
            assert!(
                f.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_'),
                "bad field name {:?}",
                f.name
            );
        }
        let fields: Vec<&Field> = columns(idx).collect();
        let cols: String = fields
            .iter()
            .map(|f| format!(", {} {}", column(f), sql_type(f.ty)))
            .collect();
        // A rowid table: entry rows (source plus columns) are too big for
        // WITHOUT ROWID to pay off, and secondary indexes stay small.
        tx.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS \"{t}\" (
                 rid INTEGER PRIMARY KEY,
                 id TEXT NOT NULL UNIQUE,
                 seq INTEGER NOT NULL,
                 src BLOB NOT NULL{cols})"
        ))?;
        let existing: Vec<String> = tx
            .prepare(&format!("SELECT name FROM pragma_table_info('{t}')"))?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let missing: Vec<&Field> = fields
            .iter()
            .copied()
            .filter(|f| !existing.contains(&column(f)))
            .collect();
        for f in &missing {
            tx.execute_batch(&format!(
                "ALTER TABLE \"{t}\" ADD COLUMN {} {}",
                column(f),
                sql_type(f.ty)
            ))?;
        }
        if !missing.is_empty() {
            backfill(&tx, idx, &missing)?;
        }
        init_side_tables(&tx, idx)?;
        for f in &fields {
            let c = column(f);
            let sql = match index_def(idx, f.name) {
                Some(def) => format!("CREATE INDEX IF NOT EXISTS \"{t}_{c}\" ON \"{t}\" ({def})"),
                // Stores made by earlier versions indexed every field.
                None => format!("DROP INDEX IF EXISTS \"{t}_{c}\""),
            };
            tx.execute_batch(&sql)?;
        }
    }
    drop_retired(&tx)?;
    tx.commit()
}

/// `Text` fields no longer declared: the text entries held before it moved
/// to `texts` (`Idx::Texts`).
const RETIRED_TEXT: &[(Idx, &str)] = &[(Idx::Entries, "contents")];

/// Drops the side tables of [`RETIRED_TEXT`] (whose trigger would go on
/// queueing deleted entries for a purge that no longer runs); a no-op once
/// they are gone.
fn drop_retired(conn: &Connection) -> rusqlite::Result<()> {
    for (idx, name) in RETIRED_TEXT {
        let st = format!("{}__{name}", idx.name());
        conn.execute_batch(&format!(
            "DROP TRIGGER IF EXISTS \"{st}_ad\";
             DROP TABLE IF EXISTS \"{st}\";
             DROP TABLE IF EXISTS \"{}\";
             DROP TABLE IF EXISTS \"{}\";",
            text_table(&st),
            dead_table(&st)
        ))?;
    }
    Ok(())
}

/// The columns of a field's b-tree index, for the fields that have one.
/// Every index costs a page written per document write (most of a small
/// write's commit), so only the fields the filesystem itself queries are
/// indexed; a search on another field filters rows found through an indexed
/// condition (`path.tree`, `parent`) or scans.
pub(super) fn index_def(idx: Idx, field: &str) -> Option<&'static str> {
    Some(match (idx, field) {
        // Directory listing: children of a parent in cookie order, paged by
        // (cookie, id) straight from the index; emptiness checks.
        (Idx::Entries, "parent") => "f_parent, f_cookie, id",
        // Subtree queries (renames, searches) sorted by path.
        (Idx::Entries, "path") => "f_path, id",
        (Idx::Inodes, "orphan") => "f_orphan",
        // Not the lock documents' fields: only live locks and rename
        // intents are kept, a few rows to scan, while two indexes were two
        // of the pages every rename writes (its intent is created and
        // deleted).
        (Idx::Chunks, "file") => "f_file, f_n",
        _ => return None,
    })
}

/// The side tables of `Text` and `Keywords` fields, each emptied by a
/// trigger when its document is deleted; a `Keywords` table created for an
/// existing table is filled from the stored sources.
pub(super) fn init_side_tables(conn: &Connection, idx: Idx) -> rusqlite::Result<()> {
    let t = idx.name();
    for f in side_fields(idx) {
        let st = side_table(idx, f);
        let exists: bool = conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = ?1",
            [&st],
            |r| Ok(r.get::<_, i64>(0)? > 0),
        )?;
        if f.ty == FieldType::Text {
            // The text is kept in a plain table and indexed by a contentless
            // FTS5 table (trigram tokenizer, which folds case) with cheap
            // deletes (SQLite >= 3.43): an FTS5 table that keeps its content
            // re-tokenizes the old text to delete it, ~1 ms for a 7 KB file,
            // which made `rm -rf` of an indexed tree 8x slower. The trigger
            // only fires for documents that have the field.
            let tt = text_table(&st);
            let old_layout = exists
                && !conn
                    .query_row(
                        "SELECT sql FROM sqlite_master WHERE name = ?1",
                        [&st],
                        |r| r.get::<_, String>(0),
                    )?
                    .contains("contentless_delete");
            if old_layout {
                // A store from before: keep its texts, rebuild the index.
                conn.execute_batch(&format!(
                    "CREATE TABLE \"{tt}\" (rid INTEGER PRIMARY KEY, v TEXT NOT NULL);
                     INSERT INTO \"{tt}\" (rid, v) SELECT rowid, v FROM \"{st}\";
                     DROP TRIGGER IF EXISTS \"{st}_ad\";
                     DROP TABLE \"{st}\";"
                ))?;
            }
            // A deleted document's index row is only queued (in
            // `<st>_dead`) and purged at commit (`purge_dead_text`), many
            // per statement: an FTS5 change inside the statement savepoint
            // of every delete made FTS5 flush to disk each time (~90 us of
            // each unlink in an indexed tree). Until then the row is
            // harmless: queries keep only rids of live documents, and a
            // reused rid is purged before it is indexed again.
            let dt = dead_table(&st);
            let deferred = conn
                .query_row(
                    "SELECT sql FROM sqlite_master WHERE name = ?1",
                    [format!("{st}_ad")],
                    |r| r.get::<_, String>(0),
                )
                .optional()?
                .is_some_and(|sql| sql.contains(&dt));
            if !deferred {
                conn.execute_batch(&format!("DROP TRIGGER IF EXISTS \"{st}_ad\""))?;
            }
            conn.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS \"{tt}\" (rid INTEGER PRIMARY KEY, v TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS \"{dt}\" (rid INTEGER PRIMARY KEY);
                 CREATE VIRTUAL TABLE IF NOT EXISTS \"{st}\" USING fts5(v, tokenize = 'trigram',
                     content = '', contentless_delete = 1);
                 CREATE TRIGGER IF NOT EXISTS \"{st}_ad\" AFTER DELETE ON \"{t}\"
                 WHEN EXISTS (SELECT 1 FROM \"{tt}\" WHERE rid = old.rid)
                 BEGIN
                     INSERT OR IGNORE INTO \"{dt}\" (rid) VALUES (old.rid);
                     DELETE FROM \"{tt}\" WHERE rid = old.rid;
                 END;"
            ))?;
            // A segment is rewritten to purge deleted rows once half of them
            // are (FTS5's default, a tenth, rewrote the index over and over
            // during an `rm -rf`: ~2 rows rewritten per delete instead of
            // ~10; the dead half bounds the space kept). Set at creation
            // only: opening must not write (fsck opens beside a live mount).
            if !exists || old_layout {
                conn.execute_batch(&format!(
                    "INSERT INTO \"{st}\" (\"{st}\", rank) VALUES ('deletemerge', 50)"
                ))?;
            }
            if old_layout {
                conn.execute_batch(&format!(
                    "INSERT INTO \"{st}\" (rowid, v) SELECT rid, v FROM \"{tt}\""
                ))?;
            }
        } else {
            conn.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS \"{st}\" (
                     v TEXT NOT NULL, rid INTEGER NOT NULL, PRIMARY KEY (v, rid)) WITHOUT ROWID;
                 CREATE INDEX IF NOT EXISTS \"{st}_rid\" ON \"{st}\" (rid);
                 CREATE TRIGGER IF NOT EXISTS \"{st}_ad\" AFTER DELETE ON \"{t}\"
                 BEGIN DELETE FROM \"{st}\" WHERE rid = old.rid; END;"
            ))?;
            if !exists {
                let mut select = conn.prepare(&format!("SELECT rid, src FROM \"{t}\""))?;
                let mut rows = select.query([])?;
                while let Some(row) = rows.next()? {
                    let rid: i64 = row.get(0)?;
                    let src: Value = serde_json::from_slice(row.get_ref(1)?.as_bytes()?)
                        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
                    let vals = src.get(f.name).map_or(Ok(vec![]), |v| keywords_of(f, v));
                    match vals {
                        Ok(vals) => write_keywords(conn, &st, rid, &vals)?,
                        Err(e) => log::warn!("{t}: cannot index {} of row {rid}: {e}", f.name),
                    }
                }
            }
        }
    }
    Ok(())
}

/// Fills newly added columns from the stored sources.
pub(super) fn backfill(conn: &Connection, idx: Idx, fields: &[&Field]) -> rusqlite::Result<()> {
    let t = idx.name();
    let sets: Vec<String> = fields
        .iter()
        .enumerate()
        .map(|(i, f)| format!("{} = ?{}", column(f), i + 2))
        .collect();
    let mut update = conn.prepare(&format!(
        "UPDATE \"{t}\" SET {} WHERE rid = ?1",
        sets.join(", ")
    ))?;
    let mut select = conn.prepare(&format!("SELECT rid, src FROM \"{t}\""))?;
    let mut rows = select.query([])?;
    while let Some(row) = rows.next()? {
        let rid: i64 = row.get(0)?;
        let src: Value = serde_json::from_slice(row.get_ref(1)?.as_bytes()?)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        update.raw_bind_parameter(1, rid)?;
        for (i, f) in fields.iter().enumerate() {
            let col = src
                .get(f.name)
                .map_or(Ok(Col::Null), |v| field_value(f, v))
                .unwrap_or_else(|e| {
                    log::warn!("{t}: cannot index {} of row {rid}: {e}", f.name);
                    Col::Null
                });
            update.raw_bind_parameter(i + 2, &col)?;
        }
        update.raw_execute()?;
    }
    Ok(())
}
