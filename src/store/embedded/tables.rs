//! The database's layout: per-connection pragmas, the names of each
//! index's table, columns and side tables of `Text` and `Keywords` fields,
//! and each table's prepared statements ([`TableSql`]). Creating them (and
//! backfilling what a newer esfs adds) is `setup`'s.

use rusqlite::Connection;

use super::{BUSY_TIMEOUT, STATEMENT_CACHE};
use crate::store::Idx;
use crate::store::schema::{Field, FieldType};

/// Sets the per-connection pragmas. `synchronous=NORMAL` in WAL mode: a
/// process crash (even kill -9) loses nothing committed, only an OS crash or
/// power loss can lose the last commits; `sync` makes everything durable.
pub(super) fn configure(conn: &Connection, reader: bool) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Plans must not depend on bound values: otherwise a cached statement
    // whose `LIMIT ?` changes (listing pages of 1024, then 256 with
    // attributes) is prepared again on its next step.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    if reader {
        conn.execute_batch(
            "PRAGMA query_only = ON; PRAGMA cache_size = -8192; PRAGMA temp_store = MEMORY;",
        )?;
        return Ok(());
    }
    // Checkpoints fsync, and a small write puts one page per index in the
    // WAL, so the default autocheckpoint (1000 pages) would run every few
    // dozen writes: checkpoint at about 64 MiB of WAL instead. (Checkpointing
    // on a background thread was tried: the WAL then never restarts under a
    // steady write load and grows without bound.) journal_size_limit trims
    // the WAL file back after a large bulk.
    conn.execute_batch(
        "PRAGMA synchronous = NORMAL;
         PRAGMA foreign_keys = OFF;
         PRAGMA cache_size = -65536;
         PRAGMA temp_store = MEMORY;
         PRAGMA wal_autocheckpoint = 32768;
         PRAGMA journal_size_limit = 67108864;",
    )
}

pub(super) fn column(f: &Field) -> String {
    format!("f_{}", f.name)
}

/// Whether a field is a column of its table. `Text` fields live in a
/// (rid, value) table `<table>__<field>_text` indexed by the FTS5 table
/// `<table>__<field>` (trigram tokenizer), and `Keywords` in a (value, rid)
/// table `<table>__<field>`, all keyed by the document's rid.
pub(super) fn columnar(f: &Field) -> bool {
    !matches!(f.ty, FieldType::Text | FieldType::Keywords)
}

pub(super) fn columns(idx: Idx) -> impl Iterator<Item = &'static Field> {
    idx.fields().iter().filter(|f| columnar(f))
}

pub(super) fn side_fields(idx: Idx) -> impl Iterator<Item = &'static Field> {
    idx.fields().iter().filter(|f| !columnar(f))
}

pub(super) fn side_table(idx: Idx, f: &Field) -> String {
    format!("{}__{}", idx.name(), f.name)
}

/// Where a `Text` field's values are kept (its FTS5 table only indexes them).
pub(super) fn text_table(side_table: &str) -> String {
    format!("{side_table}_text")
}

/// The rids of deleted documents whose rows in a `Text` field's FTS5 table
/// are still to be purged (see `purge_dead_text`).
pub(super) fn dead_table(side_table: &str) -> String {
    format!("{side_table}_dead")
}

/// Purge the FTS5 rows of deleted documents queued since the last commit,
/// in one statement per table (one flush of FTS5's changes, not one per
/// delete). Runs before each commit.
pub(super) fn purge_dead_text(conn: &Connection) -> rusqlite::Result<()> {
    for idx in Idx::ALL.into_iter().filter(|i| has_text(*i)) {
        for f in side_fields(idx).filter(|f| f.ty == FieldType::Text) {
            let st = side_table(idx, f);
            let dt = dead_table(&st);
            let queued = conn
                .prepare_cached(&format!("SELECT 1 FROM \"{dt}\" LIMIT 1"))?
                .exists([])?;
            if queued {
                conn.prepare_cached(&format!(
                    "DELETE FROM \"{st}\" WHERE rowid IN (SELECT rid FROM \"{dt}\")"
                ))?
                .execute([])?;
                conn.prepare_cached(&format!("DELETE FROM \"{dt}\""))?
                    .execute([])?;
            }
        }
    }
    Ok(())
}

pub(super) fn sql_type(ty: FieldType) -> &'static str {
    match ty {
        FieldType::Keyword
        | FieldType::KeywordText
        | FieldType::Path
        | FieldType::Text
        | FieldType::Keywords => "TEXT",
        FieldType::Long | FieldType::Date | FieldType::Bool => "INTEGER",
    }
}

pub(super) fn has_text(idx: Idx) -> bool {
    side_fields(idx).any(|f| f.ty == FieldType::Text)
}

/// Statements of one table, built once. `create` binds ?1 id, ?2 seq,
/// ?3 src, then one parameter per column; `current` reads a row's rid, seq,
/// src and columns (to update only the columns that changed).
pub(super) struct TableSql {
    pub(super) idx: Idx,
    pub(super) get: String,
    pub(super) create: String,
    pub(super) current: String,
    pub(super) delete: String,
    pub(super) delete_if: String,
    /// Column names, in `Encoded::cols` order.
    pub(super) cols: Vec<String>,
    /// Has `Text`/`Keywords` fields (side tables to keep in step).
    pub(super) side: bool,
}

impl TableSql {
    pub(super) fn new(idx: Idx) -> TableSql {
        let t = idx.name();
        let cols: Vec<String> = columns(idx).map(column).collect();
        let all: Vec<String> = ["id", "seq", "src"]
            .iter()
            .map(|c| c.to_string())
            .chain(cols.iter().cloned())
            .collect();
        let placeholders: Vec<String> = (1..=all.len()).map(|i| format!("?{i}")).collect();
        let current: String = ["rid", "seq", "src"]
            .iter()
            .map(|c| c.to_string())
            .chain(cols.iter().cloned())
            .collect::<Vec<_>>()
            .join(", ");
        TableSql {
            idx,
            get: format!("SELECT seq, src, rid FROM \"{t}\" WHERE id = ?1"),
            create: format!(
                "INSERT INTO \"{t}\" ({}) VALUES ({}) ON CONFLICT(id) DO NOTHING",
                all.join(", "),
                placeholders.join(", ")
            ),
            current: format!("SELECT {current} FROM \"{t}\" WHERE id = ?1"),
            delete: format!("DELETE FROM \"{t}\" WHERE id = ?1"),
            delete_if: format!("DELETE FROM \"{t}\" WHERE id = ?1 AND seq = ?2"),
            cols,
            side: side_fields(idx).next().is_some(),
        }
    }

    /// An UPDATE of seq, src and the columns `changed` (indexes into
    /// `cols`), by rid. Parameters: ?1 seq, ?2 src, the columns, then rid.
    pub(super) fn update(&self, changed: &[usize]) -> String {
        let mut sql = format!("UPDATE \"{}\" SET seq = ?1, src = ?2", self.idx.name());
        for (k, &i) in changed.iter().enumerate() {
            sql.push_str(&format!(", {} = ?{}", self.cols[i], k + 3));
        }
        sql.push_str(&format!(" WHERE rid = ?{}", changed.len() + 3));
        sql
    }
}
