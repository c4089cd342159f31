//! The embedded [`MetaStore`]: one SQLite database (`<dir>/meta.sqlite`), one
//! table per index.
//!
//! Each table keeps the document source as JSON plus one typed, indexed column
//! per declared field (`f_<name>`), extracted at every write, so every query is
//! plain SQL over indexed columns with bound parameters. Versions come from a
//! single store-wide sequence; the primary term is always 1.
//!
//! Concurrency: one writer connection behind a mutex, which also serves reads
//! whenever it is free (its page cache stays warm: a second connection would
//! have to re-read every page the writer changed), and a small pool of reader
//! connections for reads that find it busy. In WAL mode those readers never
//! wait for the writer, so a long bulk does not stall gets and searches.
//! Every read sees all acknowledged writes (the store is realtime; `refresh`
//! is a no-op).
//!
//! Batches ([`MetaStore::begin_batch`]): the writes of one filesystem call
//! share one SQLite transaction, committed when the call ends (a commit
//! writes every page it dirtied to the WAL, so several commits per call were
//! most of the cost of a create). Writes outside a batch commit at once.
//! Concurrent batches share the open transaction; whichever ends first
//! commits the others' writes so far too, which is what committing each
//! write at once did before.
//!
//! Deferred commits ([`EmbeddedStore::defer_commits`], a mount that owns
//! its store): the transaction stays open for up to a second and each
//! acknowledged call is instead one append to the redo log ([`redo`]),
//! replayed after a crash.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rusqlite::types::{ToSqlOutput, Value as SqlValue, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, Row, Statement, ToSql};
use serde_json::Value;

use super::redo::{self, RedoLog};
use super::schema::{Field, FieldType};
use super::{
    Bucket, BulkItemResult, BulkOp, Doc, GroupRequest, Hit, Idx, MAX_ID_BYTES, MetaStore, Query,
    SearchRequest, Sort, StoreError, StoreResult, Version,
};

const PRIMARY_TERM: u64 = 1;
/// Sequence numbers are reserved on disk in blocks, so a write does not also
/// have to persist the counter and reopening needs no scan for the maximum.
const SEQ_BLOCK: u64 = 4096;
/// Reader connections kept open at most; more concurrent readers wait.
const MAX_READERS: usize = 8;
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
const STATEMENT_CACHE: usize = 128;
/// Deferred commits: how often the committer looks, the idle time after
/// which it commits (so a quiet mount's store is current for other
/// processes), the longest a transaction stays open, and the most it logs.
const COMMIT_TICK: Duration = Duration::from_millis(50);
const COMMIT_IDLE: Duration = Duration::from_millis(100);
const COMMIT_AGE: Duration = Duration::from_secs(1);
const COMMIT_LOG_BYTES: u64 = 32 << 20;
/// `_seq` rows: the seq_no reservation, and the last redo generation whose
/// records are all committed.
const SEQ_KEY: i64 = 0;
const GENERATION_KEY: i64 = 1;

/// SQLite-backed metadata store: a handle on the [`Core`], which its
/// committer thread (deferred commits) shares. Dropping the handle stops
/// and joins that thread, so the final commit has happened (and the redo
/// log's lock is released) when the drop returns: the store can be opened
/// again at once, by this process or another.
pub struct EmbeddedStore {
    core: Arc<Core>,
    committer: Mutex<Option<(std::thread::JoinHandle<()>, Arc<Stop>)>>,
}

/// Tells the committer thread to stop.
#[derive(Default)]
struct Stop {
    asked: Mutex<bool>,
    cv: Condvar,
}

impl Deref for EmbeddedStore {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.core
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        if let Some((thread, stop)) = self.committer.get_mut().take() {
            *stop.asked.lock() = true;
            stop.cv.notify_all();
            let _ = thread.join();
        }
        // The last reference to the core goes with this handle's field.
    }
}

impl EmbeddedStore {
    /// Whether `dir` holds a store (its database file), without creating
    /// anything.
    pub fn exists(dir: &Path) -> bool {
        dir.join(DB_FILE).is_file()
    }

    /// Opens (creating if needed) the store in `dir`, in `dir/meta.sqlite`.
    pub fn open(dir: &Path) -> StoreResult<EmbeddedStore> {
        Ok(EmbeddedStore {
            core: Arc::new(Core::open(dir)?),
            committer: Mutex::new(None),
        })
    }

    /// This process owns the store (a mount, under its lock): from now on a
    /// write is acknowledged once it is in the redo log, and the transaction
    /// is committed when writes pause, after a second, or on `sync`/`refresh`
    /// (see [`redo`]). Other processes then read state up to a second old.
    pub fn defer_commits(&self) -> StoreResult<()> {
        self.core.start_redo()?;
        let (core, stop) = (self.core.clone(), Arc::new(Stop::default()));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("esfs-commit".into())
            .spawn(move || committer(&core, &stop2))
            .map_err(|e| StoreError::Unavailable(format!("committer thread: {e}")))?;
        *self.committer.lock() = Some((thread, stop));
        Ok(())
    }
}

/// The database file in a store directory.
const DB_FILE: &str = "meta.sqlite";

/// The store itself (see [`EmbeddedStore`]).
pub struct Core {
    path: PathBuf,
    /// Indexed by `Idx as usize`.
    tables: Vec<TableSql>,
    // Readers are dropped first so that the writer, closing last, runs the
    // final checkpoint.
    readers: Readers,
    writer: Mutex<Writer>,
    /// Tells this store's batches apart in the thread-local registry.
    id: u64,
    /// The writer connection holds an open transaction (uncommitted writes).
    open_tx: AtomicBool,
    /// Times SQLite threw away the open transaction (a failed commit, or an
    /// error that rolls back the whole transaction): batches that were
    /// writing then report their writes lost.
    aborts: AtomicU64,
    /// Deferred commits only: a rolled-back transaction could not be
    /// redone from the log, so writes are refused (the next open replays).
    poisoned: AtomicBool,
}

thread_local! {
    /// This thread's open batches: (store id, depth, store's aborts at begin).
    static BATCHES: RefCell<Vec<(u64, u32, u64)>> = const { RefCell::new(Vec::new()) };
}
static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(1);

impl Core {
    fn open(dir: &Path) -> StoreResult<Core> {
        crate::private::dir_all(dir)
            .map_err(|e| StoreError::Unavailable(format!("{}: {e}", dir.display())))?;
        let path = dir.join(DB_FILE);
        crate::private::touch(&path)
            .map_err(|e| StoreError::Unavailable(format!("{}: {e}", path.display())))?;
        let conn = Connection::open(&path).map_err(sql_err)?;
        // First, so that even the pragmas below wait for a busy mount.
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_err)?;
        // Only takes effect when the database is created. Each small write
        // dirties one page per index and every dirty page goes to the WAL,
        // so smaller pages write markedly faster (~1.5x over 4 KiB here);
        // 2 KiB keeps reads and long index keys (paths) reasonable.
        conn.execute_batch("PRAGMA page_size = 2048")
            .map_err(sql_err)?;
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .map_err(sql_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unavailable(format!(
                "{}: cannot enable WAL mode (got {mode})",
                path.display()
            )));
        }
        configure(&conn, false).map_err(sql_err)?;
        init_schema(&conn).map_err(sql_err)?;
        let next: i64 = conn
            .query_row("SELECT v FROM _seq WHERE k = ?1", [SEQ_KEY], |r| r.get(0))
            .map_err(sql_err)?;
        let next = next as u64;
        let mut tables: Vec<TableSql> = Idx::ALL.iter().map(|&idx| TableSql::new(idx)).collect();
        tables.sort_by_key(|t| t.idx as usize);
        let store = Core {
            tables,
            writer: Mutex::new(Writer {
                conn,
                seq: SeqState {
                    next,
                    reserved: next,
                    redo: None,
                },
                opened: Instant::now(),
                last_write: Instant::now(),
            }),
            readers: Readers {
                path: path.clone(),
                pool: Mutex::new(Pool {
                    idle: Vec::new(),
                    open: 0,
                }),
                freed: Condvar::new(),
            },
            path,
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            aborts: AtomicU64::new(0),
            open_tx: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
        };
        store.recover_redo()?;
        Ok(store)
    }

    fn in_batch(&self) -> bool {
        BATCHES.with(|b| b.borrow().iter().any(|m| m.0 == self.id))
    }

    /// Runs one write request inside the open transaction (starting one);
    /// commits at once unless this thread is in a batch.
    fn write<T>(
        &self,
        f: impl FnOnce(&mut Connection, &mut SeqState) -> rusqlite::Result<T>,
    ) -> StoreResult<T> {
        let mut w = self.writer.lock();
        if self.poisoned.load(Ordering::Acquire) {
            return Err(StoreError::Unavailable(format!(
                "{}: a rolled-back transaction could not be redone from the redo log; \
                 writes are refused until the store is reopened (which replays it)",
                self.path.display()
            )));
        }
        if w.conn.is_autocommit() {
            w.conn.execute_batch("BEGIN IMMEDIATE").map_err(sql_err)?;
            self.open_tx.store(true, Ordering::Release);
            w.opened = Instant::now();
        }
        w.last_write = Instant::now();
        let Writer { conn, seq, .. } = &mut *w;
        if let Some(log) = seq.redo.as_mut() {
            log.begin();
        }
        let r = f(conn, seq);
        if let Some(log) = seq.redo.as_mut() {
            match r {
                Ok(_) => log.end(),
                Err(_) => log.abort(),
            }
        }
        if w.conn.is_autocommit() {
            // SQLite rolled the whole transaction back.
            self.lost(&mut w);
        }
        let r = r.map_err(sql_err)?;
        if !self.in_batch() {
            self.acknowledge(&mut w)?;
        }
        Ok(r)
    }

    /// Make this thread's writes so far survive the process: append them to
    /// the redo log, or (no log, or it failed) commit.
    fn acknowledge(&self, w: &mut Writer) -> StoreResult<()> {
        if let Some(log) = w.seq.redo.as_mut() {
            match log.flush() {
                Ok(()) => return Ok(()),
                Err(e) => log::warn!("redo log: {e}; committing instead"),
            }
        }
        self.commit(w)
    }

    /// Commit the open transaction. With a redo log, the commit also
    /// records that the log's generation is in, and the log starts the next.
    fn commit(&self, w: &mut Writer) -> StoreResult<()> {
        if w.conn.is_autocommit() {
            return Ok(());
        }
        let mut r = purge_dead_text(&w.conn).map(|()| 0);
        if r.is_ok()
            && let Some(log) = &w.seq.redo
        {
            r = w
                .conn
                .prepare_cached("INSERT OR REPLACE INTO _seq (k, v) VALUES (?1, ?2)")
                .and_then(|mut s| s.execute([GENERATION_KEY, log.generation() as i64]));
        }
        if let Err(e) = r.and_then(|_| w.conn.execute_batch("COMMIT")) {
            let _ = w.conn.execute_batch("ROLLBACK");
            self.lost(w);
            return Err(sql_err(e));
        }
        self.open_tx.store(false, Ordering::Release);
        if let Some(log) = w.seq.redo.as_mut()
            && let Err(e) = log.reset(log.generation() + 1)
        {
            // Records appended to a generation already marked committed
            // would be skipped by replay: commit every call from now on.
            log::error!("redo log: {e}; deferred commits off");
            w.seq.redo = None;
        }
        Ok(())
    }

    /// The open transaction is gone: so are the seq_no reservations in it.
    /// With a redo log, what it held is redone from the log at once; only
    /// if that fails are the batches' writes lost.
    fn lost(&self, w: &mut Writer) {
        w.seq.reserved = w.seq.next;
        self.open_tx.store(false, Ordering::Release);
        if w.seq.redo.is_some() {
            match self.redo_lost(w) {
                Ok(n) => {
                    log::warn!(
                        "{}: transaction rolled back; redid {n} logged requests",
                        self.path.display()
                    );
                    return;
                }
                Err(e) => {
                    log::error!(
                        "{}: transaction rolled back and not redone: {e}",
                        self.path.display()
                    );
                    self.poisoned.store(true, Ordering::Release);
                }
            }
        }
        self.aborts.fetch_add(1, Ordering::AcqRel);
    }

    fn redo_lost(&self, w: &mut Writer) -> StoreResult<usize> {
        let log = w.seq.redo.as_mut().expect("redo log");
        log.abort();
        log.flush()
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let (_, records) = log
            .read_back()
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        w.conn.execute_batch("BEGIN IMMEDIATE").map_err(sql_err)?;
        self.open_tx.store(true, Ordering::Release);
        let n = records.len();
        let Writer { conn, seq, .. } = &mut *w;
        replay(conn, seq, &self.tables, records)?;
        Ok(n)
    }

    /// Runs `f` on a connection that sees every acknowledged write and this
    /// thread's own batch: the writer's if free (or if this thread is in a
    /// batch), else a pooled reader. With `snapshot`, all of `f` reads one
    /// consistent state.
    fn read<T>(
        &self,
        snapshot: bool,
        f: impl FnOnce(&Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        // A pooled reader sees only committed data: fine when the writer is
        // merely busy with a statement, not when it holds uncommitted writes
        // (a batch in progress), which every read must see.
        let w = if self.in_batch() || self.open_tx.load(Ordering::Acquire) {
            Some(self.writer.lock())
        } else {
            self.writer.try_lock()
        };
        let reader;
        let conn: &Connection = match &w {
            Some(w) => &w.conn,
            None => {
                reader = self.readers.get()?;
                &reader
            }
        };
        if snapshot && conn.is_autocommit() {
            let tx = conn.unchecked_transaction().map_err(sql_err)?;
            return f(&tx);
        }
        f(conn)
    }

    fn table(&self, idx: Idx) -> &TableSql {
        let t = &self.tables[idx as usize];
        debug_assert_eq!(t.idx, idx);
        t
    }

    fn write_one(&self, idx: Idx, id: &str, op: Write<'_>) -> StoreResult<Version> {
        let t = self.table(idx);
        self.write(|conn, seq| {
            seq.reserve(conn, 1)?;
            apply(conn, seq, t, id, op)
        })?
    }
}

impl Drop for Core {
    /// A batch left open (a panicking caller) still commits.
    fn drop(&mut self) {
        let mut w = self.writer.lock();
        if self.poisoned.load(Ordering::Acquire) {
            // Half redone: the next open replays the log onto the last commit.
            let _ = w.conn.execute_batch("ROLLBACK");
            return;
        }
        if let Err(e) = self.commit(&mut w) {
            log::error!("{}: final commit failed: {e}", self.path.display());
        }
    }
}

impl Core {
    /// Deferred commits from now on (see `EmbeddedStore::defer_commits`):
    /// replay what a dead owner left, then log this process's writes.
    fn start_redo(&self) -> StoreResult<()> {
        let path = self.redo_path();
        let mut file = redo::try_lock(&path)
            .map_err(|e| StoreError::Unavailable(format!("{}: {e}", path.display())))?
            .ok_or_else(|| {
                StoreError::Unavailable(format!("{}: in use by another process", path.display()))
            })?;
        let mut w = self.writer.lock();
        self.commit(&mut w)?;
        let done = self.replay_file(&mut w, &mut file)?;
        w.seq.redo = Some(
            RedoLog::start(&path, file, done + 1)
                .map_err(|e| StoreError::Unavailable(format!("{}: {e}", path.display())))?,
        );
        Ok(())
    }

    fn redo_path(&self) -> PathBuf {
        self.path.with_file_name("meta.redo")
    }

    /// At open: a dead owner's redo log is replayed (a live owner's, which
    /// it keeps locked, is left alone: its writes are its to commit).
    fn recover_redo(&self) -> StoreResult<()> {
        let path = self.redo_path();
        if !path.exists() {
            return Ok(());
        }
        let locked = redo::try_lock(&path)
            .map_err(|e| StoreError::Unavailable(format!("{}: {e}", path.display())))?;
        if let Some(mut file) = locked {
            self.replay_file(&mut self.writer.lock(), &mut file)?;
        }
        Ok(())
    }

    /// Replays the records of a locked log file unless its generation is
    /// already committed; returns the last committed generation.
    fn replay_file(&self, w: &mut Writer, file: &mut std::fs::File) -> StoreResult<u64> {
        let done: i64 = w
            .conn
            .query_row(
                "SELECT coalesce(max(v), 0) FROM _seq WHERE k = ?1",
                [GENERATION_KEY],
                |r| r.get(0),
            )
            .map_err(sql_err)?;
        let done = done as u64;
        let (generation, records) =
            redo::read(file).map_err(|e| StoreError::Unavailable(format!("redo log: {e}")))?;
        if generation <= done || records.is_empty() {
            return Ok(done);
        }
        let n = records.len();
        w.conn.execute_batch("BEGIN IMMEDIATE").map_err(sql_err)?;
        let Writer { conn, seq, .. } = &mut *w;
        let r = replay(conn, seq, &self.tables, records).and_then(|()| {
            conn.execute(
                "INSERT OR REPLACE INTO _seq (k, v) VALUES (?1, ?2)",
                [GENERATION_KEY, generation as i64],
            )
            .and_then(|_| conn.execute_batch("COMMIT"))
            .map_err(sql_err)
        });
        if let Err(e) = r {
            let _ = w.conn.execute_batch("ROLLBACK");
            w.seq.reserved = w.seq.next;
            return Err(e);
        }
        log::info!(
            "{}: replayed {n} requests from the redo log",
            self.path.display()
        );
        Ok(generation)
    }

    /// The committer's look: commit if writes paused, the transaction is a
    /// second old, or the log is large.
    fn commit_if_due(&self) {
        let mut w = self.writer.lock();
        let due = match &w.seq.redo {
            Some(log) if !w.conn.is_autocommit() => {
                w.last_write.elapsed() >= COMMIT_IDLE
                    || w.opened.elapsed() >= COMMIT_AGE
                    || log.size() >= COMMIT_LOG_BYTES
            }
            _ => false,
        };
        if due && let Err(e) = self.commit(&mut w) {
            log::warn!("{}: commit: {e}", self.path.display());
        }
    }

    /// Test hook: die like a killed process, the open transaction never
    /// committed (the redo log is what survives).
    #[doc(hidden)]
    pub fn crash(&self) {
        let mut w = self.writer.lock();
        let _ = w.conn.execute_batch("ROLLBACK");
        self.open_tx.store(false, Ordering::Release);
        self.poisoned.store(true, Ordering::Release);
        // Closing the log releases its lock, as the process's death would.
        w.seq.redo = None;
    }
}

fn committer(core: &Core, stop: &Stop) {
    let mut asked = stop.asked.lock();
    loop {
        stop.cv.wait_for(&mut asked, COMMIT_TICK);
        if *asked {
            return;
        }
        core.commit_if_due();
    }
}

/// Sets the per-connection pragmas. `synchronous=NORMAL` in WAL mode: a
/// process crash (even kill -9) loses nothing committed, only an OS crash or
/// power loss can lose the last commits; `sync` makes everything durable.
fn configure(conn: &Connection, reader: bool) -> rusqlite::Result<()> {
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

fn column(f: &Field) -> String {
    format!("f_{}", f.name)
}

/// Whether a field is a column of its table. `Text` fields live in a
/// (rid, value) table `<table>__<field>_text` indexed by the FTS5 table
/// `<table>__<field>` (trigram tokenizer), and `Keywords` in a (value, rid)
/// table `<table>__<field>`, all keyed by the document's rid.
fn columnar(f: &Field) -> bool {
    !matches!(f.ty, FieldType::Text | FieldType::Keywords)
}

fn columns(idx: Idx) -> impl Iterator<Item = &'static Field> {
    idx.fields().iter().filter(|f| columnar(f))
}

fn side_fields(idx: Idx) -> impl Iterator<Item = &'static Field> {
    idx.fields().iter().filter(|f| !columnar(f))
}

fn side_table(idx: Idx, f: &Field) -> String {
    format!("{}__{}", idx.name(), f.name)
}

/// Where a `Text` field's values are kept (its FTS5 table only indexes them).
fn text_table(side_table: &str) -> String {
    format!("{side_table}_text")
}

/// The rids of deleted documents whose rows in a `Text` field's FTS5 table
/// are still to be purged (see `purge_dead_text`).
fn dead_table(side_table: &str) -> String {
    format!("{side_table}_dead")
}

/// Purge the FTS5 rows of deleted documents queued since the last commit,
/// in one statement per table (one flush of FTS5's changes, not one per
/// delete). Runs before each commit.
fn purge_dead_text(conn: &Connection) -> rusqlite::Result<()> {
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

fn sql_type(ty: FieldType) -> &'static str {
    match ty {
        FieldType::Keyword
        | FieldType::KeywordText
        | FieldType::Path
        | FieldType::Text
        | FieldType::Keywords => "TEXT",
        FieldType::Long | FieldType::Date | FieldType::Bool => "INTEGER",
    }
}

/// Creates the tables and indexes; adds (and backfills from the sources) the
/// columns of fields declared since the database was created.
fn init_schema(conn: &Connection) -> rusqlite::Result<()> {
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
    tx.commit()
}

/// The columns of a field's b-tree index, for the fields that have one.
/// Every index costs a page written per document write (most of a small
/// write's commit), so only the fields the filesystem itself queries are
/// indexed; a search on another field filters rows found through an indexed
/// condition (`path.tree`, `parent`) or scans.
fn index_def(idx: Idx, field: &str) -> Option<&'static str> {
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
fn init_side_tables(conn: &Connection, idx: Idx) -> rusqlite::Result<()> {
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
fn backfill(conn: &Connection, idx: Idx, fields: &[&Field]) -> rusqlite::Result<()> {
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

fn sql_err(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Other(e.to_string()),
    }
}

fn invalid(msg: impl Into<String>) -> StoreError {
    StoreError::Invalid(msg.into())
}

fn version(seq: i64) -> Version {
    Version {
        seq_no: seq as u64,
        primary_term: PRIMARY_TERM,
    }
}

/// The stored `seq` an `if_version` must match, or `None` when it can't.
fn expected_seq(v: Version) -> Option<i64> {
    if v.primary_term != PRIMARY_TERM {
        return None;
    }
    i64::try_from(v.seq_no).ok()
}

/// Elasticsearch's `_id` rule for writes.
fn check_id(id: &str) -> StoreResult<()> {
    if id.is_empty() {
        return Err(invalid("empty document id"));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(invalid(format!(
            "id is too long, must be no longer than {MAX_ID_BYTES} bytes but was: {}",
            id.len()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Field values

/// A field's column value, borrowing from the document where it can.
#[derive(Debug)]
enum Col<'a> {
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
fn field_value<'a>(f: &Field, v: &'a Value) -> Result<Col<'a>, String> {
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
fn param(f: &Field, v: &Value) -> StoreResult<SqlValue> {
    if v.is_null() {
        return Err(invalid(format!("null value for field {:?}", f.name)));
    }
    field_value(f, v).map(SqlValue::from).map_err(invalid)
}

/// A column value back as JSON (sort values).
fn json_of(f: &Field, v: ValueRef<'_>) -> rusqlite::Result<Value> {
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
struct Encoded<'a> {
    src: Vec<u8>,
    cols: Vec<Col<'a>>,
    side: Vec<Side<'a>>,
}

enum Side<'a> {
    Text(Option<&'a str>),
    Keywords(Vec<String>),
}

/// The values of a `Keywords` field: a scalar or an array of scalars.
fn keywords_of(f: &Field, v: &Value) -> Result<Vec<String>, String> {
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

fn encode<'a>(idx: Idx, source: &'a Value) -> StoreResult<Encoded<'a>> {
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

fn write_keywords(
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
fn write_side(
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
fn attach_text(conn: &Connection, idx: Idx, rid: i64, source: &mut Value) -> StoreResult<()> {
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

fn has_text(idx: Idx) -> bool {
    side_fields(idx).any(|f| f.ty == FieldType::Text)
}

// ---------------------------------------------------------------------------
// Writes

/// Statements of one table, built once. `create` binds ?1 id, ?2 seq,
/// ?3 src, then one parameter per column; `current` reads a row's rid, seq,
/// src and columns (to update only the columns that changed).
struct TableSql {
    idx: Idx,
    get: String,
    create: String,
    current: String,
    delete: String,
    delete_if: String,
    /// Column names, in `Encoded::cols` order.
    cols: Vec<String>,
    /// Has `Text`/`Keywords` fields (side tables to keep in step).
    side: bool,
}

impl TableSql {
    fn new(idx: Idx) -> TableSql {
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
    fn update(&self, changed: &[usize]) -> String {
        let mut sql = format!("UPDATE \"{}\" SET seq = ?1, src = ?2", self.idx.name());
        for (k, &i) in changed.iter().enumerate() {
            sql.push_str(&format!(", {} = ?{}", self.cols[i], k + 3));
        }
        sql.push_str(&format!(" WHERE rid = ?{}", changed.len() + 3));
        sql
    }
}

struct Writer {
    conn: Connection,
    seq: SeqState,
    /// When the open transaction began, and the last write in it.
    opened: Instant,
    last_write: Instant,
}

/// `next` is the next seq_no to hand out; every seq_no below `reserved` is
/// covered by the value persisted in `_seq`, which always exceeds every
/// committed seq_no (so reopening never reuses one, even after deletes).
/// Also the redo log (deferred commits), which every write appends to.
struct SeqState {
    next: u64,
    reserved: u64,
    redo: Option<RedoLog>,
}

impl SeqState {
    /// Makes sure `n` more seq_nos are reserved on disk (in the current
    /// transaction if there is one).
    fn reserve(&mut self, conn: &Connection, n: u64) -> rusqlite::Result<()> {
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
    fn log_put(
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
    fn log_delete(&mut self, changed: usize, idx: Idx, id: &str, seq: i64) {
        if let (Some(log), true) = (self.redo.as_mut(), changed > 0) {
            log.delete(idx, id, seq);
        }
    }
}

/// Inserts a new row (the id must be absent: 0 rows otherwise).
fn insert_row(
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
enum Write<'a> {
    Create(&'a Value),
    Put(&'a Value, Option<Version>),
    Update(&'a Value, Option<Version>),
    Delete(Option<Version>),
}

/// A row as it is: rid, seq, source and column values.
type Current = (i64, i64, Vec<u8>, Vec<SqlValue>);

fn current(conn: &Connection, t: &TableSql, id: &str) -> rusqlite::Result<Option<Current>> {
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
fn update_row(
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
fn apply(
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
fn bulk_tx(
    conn: &mut Connection,
    seq: &mut SeqState,
    tables: &[TableSql],
    ops: &[BulkOp],
    refused: Option<&mut Option<Vec<BulkItemResult>>>,
) -> rusqlite::Result<Vec<BulkItemResult>> {
    savepoint(conn, |tx| {
        seq.reserve(tx, ops.len() as u64)?;
        let results = match move_in_place(tx, seq, tables, ops)? {
            Some(results) => results,
            None => ops
                .iter()
                .map(|op| apply_op(tx, seq, tables, op))
                .collect::<rusqlite::Result<_>>()?,
        };
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
fn apply_op(
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

/// A file rename's bulk, `[create or index Y, delete X, ...]`, where Y
/// carries X's full text: done op by op, Y's row would be a new row whose
/// text is tokenized again (~1 ms for 7 KB of text) while X's index rows are
/// deleted. Instead X's row becomes Y's in place, its text rows untouched;
/// the results, seq_nos and redo log are those of the two ops. Any further
/// ops (the renamed inode) then run as usual. `None`: not that case, or a
/// precondition fails (the ops then run one by one and report it).
fn move_in_place(
    conn: &Connection,
    seq: &mut SeqState,
    tables: &[TableSql],
    ops: &[BulkOp],
) -> rusqlite::Result<Option<Vec<BulkItemResult>>> {
    let [
        put,
        BulkOp::Delete {
            index,
            id: x,
            if_version: del_if,
        },
        rest @ ..,
    ] = ops
    else {
        return Ok(None);
    };
    let (y, source, create, put_if) = match put {
        BulkOp::Create {
            index: i,
            id,
            source,
        } if i == index => (id, source, true, None),
        BulkOp::Index {
            index: i,
            id,
            source,
            if_version,
        } if i == index => (id, source, false, *if_version),
        _ => return Ok(None),
    };
    let t = &tables[*index as usize];
    if !has_text(t.idx) || x == y || check_id(x).is_err() || check_id(y).is_err() {
        return Ok(None);
    }
    let Ok(doc) = encode(t.idx, source) else {
        return Ok(None);
    };
    if !doc.side.iter().any(|v| matches!(v, Side::Text(Some(_)))) {
        return Ok(None); // no text: nothing to save
    }
    let Some((rid, x_seq, _, old)) = current(conn, t, x)? else {
        return Ok(None);
    };
    if del_if.is_some_and(|v| expected_seq(v) != Some(x_seq)) {
        return Ok(None);
    }
    for (f, v) in side_fields(t.idx).zip(&doc.side) {
        if let Side::Text(new) = v {
            let tt = text_table(&side_table(t.idx, f));
            let text: Option<String> = conn
                .prepare_cached(&format!("SELECT v FROM \"{tt}\" WHERE rid = ?1"))?
                .query_row([rid], |r| r.get(0))
                .optional()?;
            if text.as_deref() != *new {
                return Ok(None);
            }
        }
    }
    match (current(conn, t, y)?, create, put_if) {
        (Some(_), true, _) | (None, false, Some(_)) => return Ok(None),
        (Some((_, y_seq, _, _)), false, Some(v)) if expected_seq(v) != Some(y_seq) => {
            return Ok(None);
        }
        // The replaced document goes, its own text with it.
        (Some(_), false, _) => {
            conn.prepare_cached(&t.delete)?.execute([y])?;
        }
        (None, _, _) => {}
    }
    conn.prepare_cached(&format!(
        "UPDATE \"{}\" SET id = ?1 WHERE rid = ?2",
        t.idx.name()
    ))?
    .execute(rusqlite::params![y, rid])?;
    let put_seq = seq.next as i64;
    let n = update_row(conn, t, rid, put_seq, &doc, &old, None)?;
    seq.log_put(n, t, y, put_seq, &doc, None);
    seq.log_delete(1, t.idx, x, put_seq + 1);
    seq.next += 2;
    let mut results = vec![Ok(version(put_seq)), Ok(version(put_seq + 1))];
    for op in rest {
        results.push(apply_op(conn, seq, tables, op)?);
    }
    Ok(Some(results))
}

/// Runs `f` in a savepoint (rolled back if it fails), through cached
/// statements: rusqlite's `Connection::savepoint` parses its SQL on every
/// call, a measurable share of a one-bulk rename.
fn savepoint<T>(
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
fn rebase_tx(
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
fn rebase_sql(idx: Idx) -> String {
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
fn replay(
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
fn same(new: &Col<'_>, old: &SqlValue) -> bool {
    match (new, old) {
        (Col::Null, SqlValue::Null) => true,
        (Col::Int(a), SqlValue::Integer(b)) => a == b,
        (Col::Text(a), SqlValue::Text(b)) => a == b,
        _ => false,
    }
}

fn bind_doc(
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

// ---------------------------------------------------------------------------
// Readers

struct Readers {
    path: PathBuf,
    pool: Mutex<Pool>,
    freed: Condvar,
}

struct Pool {
    idle: Vec<Connection>,
    /// Connections in existence (idle or checked out).
    open: usize,
}

impl Readers {
    fn get(&self) -> StoreResult<Reader<'_>> {
        let mut pool = self.pool.lock();
        loop {
            if let Some(conn) = pool.idle.pop() {
                return Ok(Reader {
                    readers: self,
                    conn: Some(conn),
                });
            }
            if pool.open < MAX_READERS {
                pool.open += 1;
                drop(pool);
                return match self.connect() {
                    Ok(conn) => Ok(Reader {
                        readers: self,
                        conn: Some(conn),
                    }),
                    Err(e) => {
                        self.pool.lock().open -= 1;
                        self.freed.notify_one();
                        Err(sql_err(e))
                    }
                };
            }
            self.freed.wait(&mut pool);
        }
    }

    fn connect(&self) -> rusqlite::Result<Connection> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        configure(&conn, true)?;
        Ok(conn)
    }
}

/// A checked-out reader connection, returned to the pool on drop.
struct Reader<'a> {
    readers: &'a Readers,
    conn: Option<Connection>,
}

impl Deref for Reader<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn.as_ref().expect("reader connection")
    }
}

impl DerefMut for Reader<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn.as_mut().expect("reader connection")
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.readers.pool.lock().idle.push(conn);
            self.readers.freed.notify_one();
        }
    }
}

fn get_doc(conn: &Connection, t: &TableSql, id: &str, brief: bool) -> StoreResult<Option<Doc>> {
    let mut stmt = conn.prepare_cached(&t.get).map_err(sql_err)?;
    let mut rows = stmt.query([id]).map_err(sql_err)?;
    match rows.next().map_err(sql_err)? {
        None => Ok(None),
        Some(row) => {
            let seq: i64 = row.get(0).map_err(sql_err)?;
            let src = row
                .get_ref(1)
                .and_then(|v| Ok(v.as_bytes()?))
                .map_err(sql_err)?;
            let mut source = parse_source(src)?;
            if !brief && has_text(t.idx) {
                let rid: i64 = row.get(2).map_err(sql_err)?;
                attach_text(conn, t.idx, rid, &mut source)?;
            }
            Ok(Some(Doc {
                id: id.to_string(),
                version: version(seq),
                source,
            }))
        }
    }
}

fn parse_source(src: &[u8]) -> StoreResult<Value> {
    serde_json::from_slice(src)
        .map_err(|e| StoreError::Other(format!("corrupt document source: {e}")))
}

/// Reads are by id only; an id too long to have been written can't exist
/// (Elasticsearch's GET answers 404 there too).
fn check_get_id(id: &str) -> StoreResult<bool> {
    if id.is_empty() {
        return Err(invalid("empty document id"));
    }
    Ok(id.len() <= MAX_ID_BYTES)
}

// ---------------------------------------------------------------------------
// Queries

/// SQL text with its positional parameters.
#[derive(Default, Debug)]
struct Sql {
    text: String,
    params: Vec<SqlValue>,
}

impl Sql {
    fn push(&mut self, s: &str) -> &mut Self {
        self.text.push_str(s);
        self
    }
    fn col(&mut self, f: &Field) -> &mut Self {
        self.text.push_str("f_");
        self.text.push_str(f.name);
        self
    }
    fn bind(&mut self, v: SqlValue) -> &mut Self {
        self.text.push('?');
        self.params.push(v);
        self
    }
    fn append(&mut self, other: &Sql) -> &mut Self {
        self.text.push_str(&other.text);
        self.params.extend(other.params.iter().cloned());
        self
    }
}

fn field_of(idx: Idx, name: &str) -> StoreResult<&'static Field> {
    idx.field(name).ok_or_else(|| {
        invalid(format!(
            "index {:?} has no searchable field {name:?}",
            idx.name()
        ))
    })
}

fn is_text(f: &Field) -> bool {
    matches!(
        f.ty,
        FieldType::Keyword | FieldType::KeywordText | FieldType::Path
    )
}

/// The least string above every string that starts with `prefix` (None when
/// there is none). UTF-8 byte order is code point order, so bumping the last
/// char that can be bumped and dropping what follows is exact.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut s = prefix.to_string();
    while let Some(c) = s.pop() {
        let next = if c == '\u{D7FF}' {
            Some('\u{E000}')
        } else {
            char::from_u32(c as u32 + 1)
        };
        if let Some(n) = next {
            s.push(n);
            return Some(s);
        }
    }
    None
}

/// Translates `q` to a WHERE expression. Leaves may evaluate to NULL on a
/// missing column (treated as false by WHERE); negations use `IS NOT TRUE`
/// so that a missing field does satisfy `must_not`, as in Elasticsearch.
fn compile(idx: Idx, q: &Query, s: &mut Sql) -> StoreResult<()> {
    match q {
        Query::MatchAll => {
            s.push("1");
        }
        Query::Text { field, text } => {
            let f = field_of(idx, field)?;
            if f.ty != FieldType::Text {
                return Err(invalid(format!("text query on non-text field {field:?}")));
            }
            if text.chars().count() < 3 {
                return Err(invalid(format!(
                    "text query {text:?} has fewer than 3 characters"
                )));
            }
            // A trigram phrase: the folded text as a substring.
            let st = side_table(idx, f);
            s.push(&format!(
                "rid IN (SELECT rowid FROM \"{st}\" WHERE \"{st}\" MATCH "
            ))
            .bind(SqlValue::Text(fts_phrase(text)))
            .push(")");
        }
        Query::Term { .. } | Query::Terms { .. } | Query::Prefix { .. } | Query::Exists { .. }
            if side_field(idx, q)?.is_some() =>
        {
            let f = side_field(idx, q)?.expect("side field");
            let st = side_table(idx, f);
            if f.ty == FieldType::Text {
                let Query::Exists { .. } = q else {
                    return Err(invalid(format!(
                        "field {:?} is full text: use a text query",
                        f.name
                    )));
                };
                s.push(&format!("rid IN (SELECT rid FROM \"{}\")", text_table(&st)));
                return Ok(());
            }
            s.push(&format!("rid IN (SELECT rid FROM \"{st}\" WHERE "));
            match q {
                Query::Term { value, .. } => {
                    s.push("v = ").bind(param(f, value)?);
                }
                Query::Terms { values, .. } => {
                    s.push("v IN (");
                    for (i, v) in values.iter().enumerate() {
                        if i > 0 {
                            s.push(", ");
                        }
                        s.bind(param(f, v)?);
                    }
                    if values.is_empty() {
                        s.push("NULL");
                    }
                    s.push(")");
                }
                Query::Prefix { value, .. } => {
                    s.push("v >= ").bind(SqlValue::Text(value.clone()));
                    if let Some(end) = prefix_end(value) {
                        s.push(" AND v < ").bind(SqlValue::Text(end));
                    }
                }
                _ => {
                    s.push("1");
                }
            }
            s.push(")");
        }
        Query::Term { field, value } => {
            let f = field_of(idx, field)?;
            let v = param(f, value)?;
            s.col(f).push(" = ").bind(v);
        }
        Query::Terms { field, values } => {
            let f = field_of(idx, field)?;
            if values.is_empty() {
                s.push("0");
                return Ok(());
            }
            s.col(f).push(" IN (");
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    s.push(", ");
                }
                let v = param(f, v)?;
                s.bind(v);
            }
            s.push(")");
        }
        Query::Prefix { field, value } => {
            let f = field_of(idx, field)?;
            if !is_text(f) {
                return Err(invalid(format!(
                    "prefix query on non-keyword field {field:?}"
                )));
            }
            // A byte range, not LIKE (case-insensitive, `%`/`_` wildcards).
            s.push("(")
                .col(f)
                .push(" >= ")
                .bind(SqlValue::Text(value.clone()));
            if let Some(end) = prefix_end(value) {
                s.push(" AND ").col(f).push(" < ").bind(SqlValue::Text(end));
            }
            s.push(")");
        }
        Query::Tree { field, path } => {
            let f = field_of(idx, field)?;
            if f.ty != FieldType::Path {
                return Err(invalid(format!("tree query on non-path field {field:?}")));
            }
            let text = |s: &str| SqlValue::Text(s.to_string());
            if path == "/" {
                // Every absolute path; '0' is the byte after '/'.
                s.push("(").col(f).push(" >= ").bind(text("/"));
                s.push(" AND ").col(f).push(" < ").bind(text("0")).push(")");
            } else {
                // One index range [path, path + "0") holding the path and its
                // subtree, minus siblings such as `path-x` or `path.x`.
                s.push("(").col(f).push(" >= ").bind(text(path));
                s.push(" AND ")
                    .col(f)
                    .push(" < ")
                    .bind(text(&format!("{path}0")));
                s.push(" AND (").col(f).push(" = ").bind(text(path));
                s.push(" OR ")
                    .col(f)
                    .push(" >= ")
                    .bind(text(&format!("{path}/")));
                s.push("))");
            }
        }
        Query::Range {
            field,
            gte,
            gt,
            lte,
            lt,
        } => {
            let f = field_of(idx, field)?;
            if !columnar(f) {
                return Err(invalid(format!("range query on field {field:?}")));
            }
            let mut any = false;
            s.push("(");
            for (op, bound) in [(" >= ", gte), (" > ", gt), (" <= ", lte), (" < ", lt)] {
                // A null bound is unbounded, as in Elasticsearch.
                let Some(v) = bound.as_ref().filter(|v| !v.is_null()) else {
                    continue;
                };
                if any {
                    s.push(" AND ");
                }
                any = true;
                let v = param(f, v)?;
                s.col(f).push(op).bind(v);
            }
            if !any {
                s.col(f).push(" IS NOT NULL");
            }
            s.push(")");
        }
        Query::Exists { field } => {
            let f = field_of(idx, field)?;
            s.col(f).push(" IS NOT NULL");
        }
        Query::Bool {
            must,
            must_not,
            should,
        } => {
            let mut first = true;
            let mut sep = |s: &mut Sql| {
                if !std::mem::take(&mut first) {
                    s.push(" AND ");
                }
            };
            s.push("(");
            for q in must {
                sep(s);
                s.push("(");
                compile(idx, q, s)?;
                s.push(")");
            }
            for q in must_not {
                sep(s);
                s.push("(");
                compile(idx, q, s)?;
                s.push(") IS NOT TRUE");
            }
            if !should.is_empty() {
                sep(s);
                s.push("(");
                for (i, q) in should.iter().enumerate() {
                    if i > 0 {
                        s.push(" OR ");
                    }
                    s.push("(");
                    compile(idx, q, s)?;
                    s.push(")");
                }
                s.push(")");
            }
            if first {
                s.push("1");
            }
            s.push(")");
        }
    }
    Ok(())
}

/// The `Keywords`/`Text` field a term, terms, prefix or exists query is on.
fn side_field(idx: Idx, q: &Query) -> StoreResult<Option<&'static Field>> {
    let field = match q {
        Query::Term { field, .. }
        | Query::Terms { field, .. }
        | Query::Prefix { field, .. }
        | Query::Exists { field } => field,
        _ => return Ok(None),
    };
    let f = field_of(idx, field)?;
    Ok((!columnar(f)).then_some(f))
}

/// An FTS5 phrase matching `text` exactly (quotes doubled).
fn fts_phrase(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "\"\""))
}

#[derive(Clone, Copy)]
struct SortKey {
    field: &'static Field,
    desc: bool,
}

/// A parsed `search_after`: one value per sort key (None = missing), then
/// the id when given (Elasticsearch-style callers may pass only the sort
/// values; rows tying on all of them are then skipped, as in ES).
struct After {
    vals: Vec<Option<SqlValue>>,
    id: Option<String>,
}

fn sort_keys(idx: Idx, sort: &[Sort]) -> StoreResult<Vec<SortKey>> {
    sort.iter()
        .map(|s| {
            let field = field_of(idx, &s.field)?;
            if !columnar(field) {
                return Err(invalid(format!("cannot sort on field {:?}", s.field)));
            }
            Ok(SortKey {
                field,
                desc: s.descending,
            })
        })
        .collect()
}

fn parse_after(keys: &[SortKey], after: &[Value]) -> StoreResult<After> {
    let with_id = after.len() == keys.len() + 1;
    if !with_id && (after.len() != keys.len() || keys.is_empty()) {
        return Err(invalid(format!(
            "search_after has {} values, expected {} (the sort values, then the id)",
            after.len(),
            keys.len() + 1
        )));
    }
    let vals = keys
        .iter()
        .zip(after)
        .map(|(k, v)| {
            if v.is_null() {
                Ok(None)
            } else {
                param(k.field, v).map(Some)
            }
        })
        .collect::<StoreResult<_>>()?;
    let id = match after.get(keys.len()) {
        None => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => {
            return Err(invalid(
                "the last search_after value must be the id (a string)",
            ));
        }
    };
    Ok(After { vals, id })
}

/// "The row sorts after `after`" over `keys` then the id, missing values last
/// in both directions.
fn after_cond(s: &mut Sql, keys: &[SortKey], vals: &[Option<SqlValue>], id: Option<&str>) {
    let Some((k, rest)) = keys.split_first() else {
        match id {
            Some(id) => s.push("id > ").bind(SqlValue::Text(id.to_string())),
            None => s.push("0"),
        };
        return;
    };
    match &vals[0] {
        Some(v) => {
            let op = if k.desc { " < " } else { " > " };
            s.push("(").col(k.field).push(op).bind(v.clone());
            s.push(" OR ").col(k.field).push(" IS NULL");
            s.push(" OR (")
                .col(k.field)
                .push(" = ")
                .bind(v.clone())
                .push(" AND ");
            after_cond(s, rest, &vals[1..], id);
            s.push("))");
        }
        // Only other missing values can follow a missing one.
        None => {
            s.push("(").col(k.field).push(" IS NULL AND ");
            after_cond(s, rest, &vals[1..], id);
            s.push(")");
        }
    }
}

/// ORDER BY `first` (known present), `keys`, then the id. SQLite sorts NULL
/// lowest, so DESC already puts missing values last and ASC needs NULLS LAST
/// (which an index can't serve, hence the plain order for `first`).
fn order_by(s: &mut Sql, first: Option<&SortKey>, keys: &[SortKey]) {
    s.push(" ORDER BY ");
    if let Some(k) = first {
        s.col(k.field)
            .push(if k.desc { " DESC, " } else { " ASC, " });
    }
    for k in keys {
        s.col(k.field).push(if k.desc {
            " DESC, "
        } else {
            " ASC NULLS LAST, "
        });
    }
    s.push("id");
}

/// The statements of one search page, to run in order until `size` hits.
///
/// Missing sort values come last for both directions, as in Elasticsearch.
/// To let an index serve the order and the `search_after` position as a range
/// seek, a sort is split on its first key: first the rows where it is present
/// (`col >= after` can then seek), then those where it is missing. The final
/// parameter of each statement is the LIMIT, bound by the caller.
/// `extra`: more columns to select, after the sort keys.
fn search_sql(
    table: &str,
    filter: &Sql,
    keys: &[SortKey],
    after: Option<&After>,
    extra: &[&Field],
    src: bool,
) -> Vec<Sql> {
    // `seek`, if any, is written before the filter: given two lower bounds on
    // one indexed column (a subtree range and the search_after cursor),
    // SQLite seeks on the first it meets, and seeking from the subtree's
    // start made every page rescan all rows before the cursor.
    let with_seek = |seek: Option<&dyn Fn(&mut Sql)>| {
        let mut s = Sql::default();
        s.push(if src {
            "SELECT id, seq, src, rid"
        } else {
            "SELECT id, seq, NULL, rid"
        });
        for k in keys {
            s.push(", ").col(k.field);
        }
        for f in extra {
            s.push(", ").col(f);
        }
        s.push(" FROM \"").push(table).push("\" WHERE ");
        if let Some(seek) = seek {
            seek(&mut s);
            s.push(" AND ");
        }
        s.push("(").append(filter).push(")");
        s
    };
    let base = || with_seek(None);
    let Some((first, rest)) = keys.split_first() else {
        let mut s = base();
        if let Some(a) = after {
            s.push(" AND ");
            after_cond(&mut s, &[], &[], a.id.as_deref());
        }
        s.push(" ORDER BY id LIMIT ?");
        return vec![s];
    };
    let f = first.field;
    let mut out = Vec::with_capacity(2);
    // Rows where the first key is present...
    let present = |mut s: Sql| {
        order_by(&mut s, Some(first), rest);
        s.push(" LIMIT ?");
        s
    };
    match after.map(|a| (a, &a.vals[0])) {
        None => {
            let mut s = base();
            s.push(" AND ").col(f).push(" IS NOT NULL");
            out.push(present(s));
        }
        Some((a, Some(v))) => {
            let op = if first.desc { " <= " } else { " >= " };
            let seek = |s: &mut Sql| {
                s.col(f).push(op).bind(v.clone()).push(" AND ");
                after_cond(s, keys, &a.vals, a.id.as_deref());
            };
            out.push(present(with_seek(Some(&seek))));
        }
        // The page starts among the rows missing it.
        Some((_, None)) => {}
    }
    // ...then those missing it.
    let mut s = base();
    s.push(" AND ").col(f).push(" IS NULL");
    if let Some(a) = after.filter(|a| a.vals[0].is_none()) {
        s.push(" AND ");
        after_cond(&mut s, rest, &a.vals[1..], a.id.as_deref());
    }
    order_by(&mut s, None, rest);
    s.push(" LIMIT ?");
    out.push(s);
    out
}

fn hit_of(row: &Row<'_>, keys: &[SortKey]) -> StoreResult<Hit> {
    let id: String = row.get(0).map_err(sql_err)?;
    let seq: i64 = row.get(1).map_err(sql_err)?;
    let source = parse_source(
        row.get_ref(2)
            .and_then(|v| Ok(v.as_bytes()?))
            .map_err(sql_err)?,
    )?;
    let mut sort = Vec::with_capacity(keys.len() + 1);
    for (i, k) in keys.iter().enumerate() {
        let v = row
            .get_ref(4 + i)
            .and_then(|v| json_of(k.field, v))
            .map_err(sql_err)?;
        sort.push(v);
    }
    sort.push(Value::String(id.clone()));
    Ok(Hit {
        doc: Doc {
            id,
            version: version(seq),
            source,
        },
        sort,
    })
}

// ---------------------------------------------------------------------------

impl MetaStore for EmbeddedStore {
    fn get(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        if !check_get_id(id)? {
            return Ok(None);
        }
        let t = self.table(index);
        self.read(has_text(index), |c| get_doc(c, t, id, false))
    }

    fn mget(&self, index: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>> {
        let t = self.table(index);
        // One snapshot for the whole request.
        self.read(true, |c| {
            ids.iter()
                .map(|id| {
                    if check_get_id(id)? {
                        get_doc(c, t, id, false)
                    } else {
                        Ok(None)
                    }
                })
                .collect()
        })
    }

    fn create(&self, index: Idx, id: &str, source: &Value) -> StoreResult<Version> {
        self.write_one(index, id, Write::Create(source))
    }

    fn put(
        &self,
        index: Idx,
        id: &str,
        source: &Value,
        if_version: Option<Version>,
    ) -> StoreResult<Version> {
        self.write_one(index, id, Write::Put(source, if_version))
    }

    fn delete(&self, index: Idx, id: &str, if_version: Option<Version>) -> StoreResult<bool> {
        match self.write_one(index, id, Write::Delete(if_version)) {
            Ok(_) => Ok(true),
            Err(StoreError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn bulk(&self, ops: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        self.write(|conn, seq| {
            bulk_tx(conn, seq, &self.tables, &ops, None).inspect_err(|_| {
                // The reservation may have been rolled back: re-reserve next time.
                seq.reserved = seq.next;
            })
        })
    }

    fn bulk_atomic(&self, ops: Vec<BulkOp>) -> StoreResult<Option<Vec<BulkItemResult>>> {
        let mut refused = None;
        let r = self.write(|conn, seq| {
            bulk_tx(conn, seq, &self.tables, &ops, Some(&mut refused)).inspect_err(|_| {
                // The reservation may have been rolled back: re-reserve next time.
                seq.reserved = seq.next;
            })
        });
        match refused {
            Some(results) => Ok(Some(results)),
            None => r.map(Some),
        }
    }

    fn search(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>> {
        self.search_impl(req, false)
    }

    fn get_brief(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        if !check_get_id(id)? {
            return Ok(None);
        }
        let t = self.table(index);
        self.read(false, |c| get_doc(c, t, id, true))
    }

    fn search_brief(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>> {
        self.search_impl(req, true)
    }

    /// Fields that have columns are read from them: no source to parse.
    fn search_fields(&self, req: &SearchRequest, fields: &[&str]) -> StoreResult<Vec<Vec<Value>>> {
        let cols: Option<Vec<&'static Field>> = fields
            .iter()
            .map(|f| req.index.field(f).filter(|f| columnar(f)))
            .collect();
        match cols {
            // Straight from the columns: no source read, no object built.
            Some(cols) => self.search_rows(req, &cols, |row| {
                let at = row.as_ref().column_count() - cols.len();
                cols.iter()
                    .enumerate()
                    .map(|(j, f)| row.get_ref(at + j).and_then(|v| json_of(f, v)))
                    .collect::<rusqlite::Result<Vec<Value>>>()
                    .map_err(sql_err)
            }),
            None => Ok(super::field_values(self.search_impl(req, true)?, fields)),
        }
    }

    fn group(&self, req: &GroupRequest) -> StoreResult<Vec<Bucket>> {
        self.group_impl(req)
    }

    fn count(&self, index: Idx, query: &Query) -> StoreResult<u64> {
        self.count_impl(index, query)
    }

    /// No-op: searches run on committed data directly (realtime).
    /// Searches in this process are realtime; other processes read what is
    /// committed, so with deferred commits this commits now.
    fn refresh(&self, _index: Idx) -> StoreResult<()> {
        let mut w = self.writer.lock();
        if w.seq.redo.is_some() {
            self.commit(&mut w)?;
        }
        Ok(())
    }

    /// A FULL checkpoint fsyncs the WAL, copies it into the database and
    /// fsyncs that; it waits (busy timeout) for readers of older snapshots.
    fn sync(&self) -> StoreResult<()> {
        self.sync_impl()
    }

    fn describe(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }

    /// One statement: the subtree is a range of the path index, the new
    /// `path`/`dir` are spliced into columns and source in SQLite (no row
    /// leaves it, no JSON parsed in Rust), and each row gets its own seq_no.
    fn rebase_paths(&self, index: Idx, old: &str, new: &str) -> StoreResult<Option<u64>> {
        let has = |f: &str| index.field(f).is_some_and(columnar);
        if !(has("path") && has("dir")) {
            return Err(invalid(format!(
                "{} has no path and dir columns",
                index.name()
            )));
        }
        if old == "/" || old.is_empty() || old.ends_with('/') {
            return Err(invalid(format!("cannot rebase the subtree of {old:?}")));
        }
        // SQLite's text functions stop at a NUL (the temporary path of a
        // directory exchange has one): leave those to the caller's bulk.
        if old.contains('\0') || new.contains('\0') {
            return Ok(None);
        }
        self.write(|conn, seq| {
            rebase_tx(conn, seq, index, old, new).inspect_err(|_| {
                // The reservation may have been rolled back: re-reserve next time.
                seq.reserved = seq.next;
            })
        })
        .map(Some)
    }

    fn begin_batch(&self) {
        let aborts = self.aborts.load(Ordering::Acquire);
        BATCHES.with(|b| {
            let mut b = b.borrow_mut();
            match b.iter_mut().find(|m| m.0 == self.id) {
                Some(m) => m.1 += 1,
                None => b.push((self.id, 1, aborts)),
            }
        });
    }

    fn end_batch(&self) -> StoreResult<()> {
        let outer = BATCHES.with(|b| {
            let mut b = b.borrow_mut();
            let pos = b.iter().position(|m| m.0 == self.id)?;
            b[pos].1 -= 1;
            if b[pos].1 > 0 {
                return None;
            }
            Some(b.swap_remove(pos).2)
        });
        let Some(aborts_at_begin) = outer else {
            return Ok(());
        };
        self.acknowledge(&mut self.writer.lock())?;
        if self.aborts.load(Ordering::Acquire) != aborts_at_begin {
            return Err(StoreError::Unavailable(format!(
                "{}: a transaction was rolled back; recent changes may be lost",
                self.path.display()
            )));
        }
        Ok(())
    }
}

impl Core {
    /// Hits with their parsed sources (and file text unless `brief`).
    fn search_impl(&self, req: &SearchRequest, brief: bool) -> StoreResult<Vec<Hit>> {
        let keys = sort_keys(req.index, &req.sort)?;
        self.search_phases(req, &[], true, |tx, row| {
            let mut hit = hit_of(row, &keys)?;
            if !brief && has_text(req.index) {
                let rid: i64 = row.get(3).map_err(sql_err)?;
                attach_text(tx, req.index, rid, &mut hit.doc.source)?;
            }
            Ok(hit)
        })
    }

    /// A search whose hits are `f` of rows ending in the columns `cols`
    /// (the source is not read).
    fn search_rows<T>(
        &self,
        req: &SearchRequest,
        cols: &[&'static Field],
        f: impl Fn(&Row<'_>) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>> {
        self.search_phases(req, cols, false, |_, row| f(row))
    }

    /// Runs a search's SQL phases on one snapshot; rows are `id, seq, src
    /// (NULL without `src`), rid`, the sort keys, then `extra`.
    fn search_phases<T>(
        &self,
        req: &SearchRequest,
        extra: &[&'static Field],
        src: bool,
        mut f: impl FnMut(&Connection, &Row<'_>) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>> {
        let mut filter = Sql::default();
        compile(req.index, &req.query, &mut filter)?;
        let keys = sort_keys(req.index, &req.sort)?;
        let after = req
            .search_after
            .as_deref()
            .map(|a| parse_after(&keys, a))
            .transpose()?;
        if req.size == 0 {
            return Ok(Vec::new());
        }
        let phases = search_sql(req.index.name(), &filter, &keys, after.as_ref(), extra, src);
        // Both phases read the same snapshot.
        self.read(true, |tx| {
            let mut hits = Vec::with_capacity(req.size.min(1024));
            for sql in phases {
                let limit = req.size - hits.len();
                if limit == 0 {
                    break;
                }
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                let mut stmt = tx.prepare_cached(&sql.text).map_err(sql_err)?;
                let params = sql
                    .params
                    .iter()
                    .map(|p| p as &dyn ToSql)
                    .chain(std::iter::once(&limit as &dyn ToSql));
                let mut rows = stmt
                    .query(rusqlite::params_from_iter(params))
                    .map_err(sql_err)?;
                while let Some(row) = rows.next().map_err(sql_err)? {
                    hits.push(f(tx, row)?);
                }
            }
            Ok(hits)
        })
    }

    fn count_impl(&self, index: Idx, query: &Query) -> StoreResult<u64> {
        let mut s = Sql::default();
        s.push("SELECT count(*) FROM \"")
            .push(index.name())
            .push("\" WHERE ");
        compile(index, query, &mut s)?;
        self.read(false, |conn| {
            let mut stmt = conn.prepare_cached(&s.text).map_err(sql_err)?;
            let n: i64 = stmt
                .query_row(rusqlite::params_from_iter(&s.params), |r| r.get(0))
                .map_err(sql_err)?;
            Ok(n as u64)
        })
    }

    fn sync_impl(&self) -> StoreResult<()> {
        let mut w = self.writer.lock();
        // Durability covers batches in progress too.
        self.commit(&mut w)?;
        let (busy, _log, _done): (i64, i64, i64) = w
            .conn
            .query_row("PRAGMA wal_checkpoint(FULL)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .map_err(sql_err)?;
        if busy != 0 {
            return Err(StoreError::Unavailable(
                "checkpoint blocked by readers".into(),
            ));
        }
        Ok(())
    }

    /// Field collapsing in one statement: the matching rows with their
    /// score (FTS5's bm25, negated so higher is better; 0 without a score
    /// query or a text match), numbered within their bucket by score, each
    /// bucket carrying its best score and size.
    fn group_impl(&self, req: &GroupRequest) -> StoreResult<Vec<Bucket>> {
        let idx = req.index;
        let kf = field_of(idx, &req.field)?;
        if !columnar(kf) {
            return Err(invalid(format!("cannot group on field {:?}", req.field)));
        }
        if req.buckets == 0 {
            return Ok(vec![]);
        }
        let t = idx.name();
        let mut s = Sql::default();
        s.push("WITH h AS (SELECT rid, id, seq, src, ").col(kf);
        s.push(&format!(" AS k FROM \"{t}\" WHERE "));
        compile(idx, &req.query, &mut s)?;
        s.push("), sc AS (");
        match &req.score {
            Some(q) => {
                let (st, expr) = fts_score_expr(idx, q)?;
                s.push(&format!(
                    "SELECT rowid AS srid, -bm25(\"{st}\") AS score FROM \"{st}\" WHERE \"{st}\" MATCH "
                ))
                .bind(SqlValue::Text(expr));
            }
            None => {
                s.push("SELECT NULL AS srid, 0.0 AS score WHERE 0");
            }
        }
        s.push(
            "), j AS (SELECT h.*, COALESCE(sc.score, 0.0) AS score FROM h LEFT JOIN sc ON sc.srid = h.rid \
             WHERE h.k IS NOT NULL), \
             r AS (SELECT *, row_number() OVER (PARTITION BY k ORDER BY score DESC, id) AS rn, \
             max(score) OVER (PARTITION BY k) AS best, count(*) OVER (PARTITION BY k) AS n FROM j) \
             SELECT id, seq, src, k, score, best, n FROM r WHERE rn <= ",
        )
        .bind(SqlValue::Integer(req.per_bucket as i64))
        .push(" ORDER BY best DESC, k, rn");
        self.read(false, |conn| {
            let mut stmt = conn.prepare_cached(&s.text).map_err(sql_err)?;
            let mut rows = stmt
                .query(rusqlite::params_from_iter(&s.params))
                .map_err(sql_err)?;
            let mut out: Vec<Bucket> = Vec::new();
            while let Some(row) = rows.next().map_err(sql_err)? {
                let key = row
                    .get_ref(3)
                    .and_then(|v| json_of(kf, v))
                    .map_err(sql_err)?;
                if out.last().is_none_or(|b| b.key != key) {
                    if out.len() == req.buckets {
                        break;
                    }
                    out.push(Bucket {
                        key,
                        doc_count: row.get::<_, i64>(6).map_err(sql_err)? as u64,
                        top_score: row.get(5).map_err(sql_err)?,
                        hits: vec![],
                    });
                }
                let id: String = row.get(0).map_err(sql_err)?;
                let seq: i64 = row.get(1).map_err(sql_err)?;
                let src = row
                    .get_ref(2)
                    .and_then(|v| Ok(v.as_bytes()?))
                    .map_err(sql_err)?;
                let doc = Doc {
                    id,
                    version: version(seq),
                    source: parse_source(src)?,
                };
                let score: f64 = row.get(4).map_err(sql_err)?;
                out.last_mut().expect("bucket").hits.push((doc, score));
            }
            Ok(out)
        })
    }
}

/// The FTS5 table and MATCH expression of a score query made of text
/// queries on one field (alone, or combined by `bool` must/should).
fn fts_score_expr(idx: Idx, q: &Query) -> StoreResult<(String, String)> {
    fn walk(idx: Idx, q: &Query, table: &mut Option<String>) -> StoreResult<String> {
        match q {
            Query::Text { field, text } => {
                let f = field_of(idx, field)?;
                if f.ty != FieldType::Text {
                    return Err(invalid(format!("text query on non-text field {field:?}")));
                }
                let st = side_table(idx, f);
                if table.get_or_insert_with(|| st.clone()) != &st {
                    return Err(invalid("score query spans several text fields"));
                }
                Ok(fts_phrase(text))
            }
            Query::Bool {
                must,
                must_not,
                should,
            } if must_not.is_empty() && (must.is_empty() || should.is_empty()) => {
                let (list, op) = if must.is_empty() {
                    (should, " OR ")
                } else {
                    (must, " AND ")
                };
                let parts = list
                    .iter()
                    .map(|q| walk(idx, q, table))
                    .collect::<StoreResult<Vec<_>>>()?;
                if parts.is_empty() {
                    return Err(invalid("empty score query"));
                }
                Ok(format!("({})", parts.join(op)))
            }
            _ => Err(invalid(format!(
                "score queries are text queries (alone or in bool must/should), not {q:?}"
            ))),
        }
    }
    let mut table = None;
    let expr = walk(idx, q, &mut table)?;
    Ok((table.expect("a text query"), expr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scan;
    use serde_json::json;
    use std::cmp::Ordering;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};

    fn open() -> (tempfile::TempDir, EmbeddedStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("store")).unwrap();
        (dir, store)
    }

    fn entry(parent: u64, name: &str, cookie: i64) -> Value {
        json!({
            "parent": parent,
            "name": name,
            "path": format!("/{parent}/{name}"),
            "cookie": cookie,
            "kind": "file",
        })
    }

    fn req(index: Idx, query: Query, sort: Vec<Sort>, size: usize) -> SearchRequest {
        SearchRequest {
            index,
            query,
            sort,
            search_after: None,
            size,
        }
    }

    fn desc(field: &str) -> Sort {
        Sort {
            field: field.to_string(),
            descending: true,
        }
    }

    fn ids(hits: &[Hit]) -> Vec<String> {
        hits.iter().map(|h| h.doc.id.clone()).collect()
    }

    /// Ids matching `q`, in id order.
    fn matching(s: &EmbeddedStore, index: Idx, q: Query) -> Vec<String> {
        let hits = s.search(&req(index, q.clone(), vec![], 10_000)).unwrap();
        assert_eq!(s.count(index, &q).unwrap(), hits.len() as u64);
        ids(&hits)
    }

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn range(
        field: &str,
        gte: Option<Value>,
        gt: Option<Value>,
        lte: Option<Value>,
        lt: Option<Value>,
    ) -> Query {
        Query::Range {
            field: field.into(),
            gte,
            gt,
            lte,
            lt,
        }
    }

    fn prefix(field: &str, value: &str) -> Query {
        Query::Prefix {
            field: field.into(),
            value: value.into(),
        }
    }

    fn exists(field: &str) -> Query {
        Query::Exists {
            field: field.into(),
        }
    }

    fn is_invalid<T: std::fmt::Debug>(r: StoreResult<T>) -> bool {
        matches!(r, Err(StoreError::Invalid(_)))
    }

    fn conflict<T: std::fmt::Debug>(r: StoreResult<T>) -> bool {
        matches!(r, Err(StoreError::Conflict(_)))
    }

    /// Collects every hit of a paged search.
    fn scan_all(s: &EmbeddedStore, index: Idx, q: Query, sort: Vec<Sort>, page: usize) -> Vec<Hit> {
        let mut all = Vec::new();
        scan(s, index, q, sort, page, |hits| {
            assert!(hits.len() <= page);
            all.extend(hits);
            Ok(true)
        })
        .unwrap();
        all
    }

    #[test]
    fn get_and_mget_are_realtime() {
        let (_d, s) = open();
        assert_eq!(s.get(Idx::Entries, "1/a").unwrap(), None);
        let v1 = s.create(Idx::Entries, "1/a", &entry(1, "a", 1)).unwrap();
        assert_eq!(v1.primary_term, 1);
        let doc = s.get(Idx::Entries, "1/a").unwrap().unwrap();
        assert_eq!(doc.id, "1/a");
        assert_eq!(doc.version, v1);
        assert_eq!(doc.source, entry(1, "a", 1));

        s.create(Idx::Entries, "1/b", &entry(1, "b", 2)).unwrap();
        let v2 = s.put(Idx::Entries, "1/a", &entry(1, "a", 3), None).unwrap();
        assert!(v2.seq_no > v1.seq_no);
        let got = s
            .mget(Idx::Entries, &strs(&["1/b", "nope", "1/a"]))
            .unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].as_ref().unwrap().source["name"], "b");
        assert!(got[1].is_none());
        assert_eq!(got[2].as_ref().unwrap().version, v2);
        assert_eq!(got[2].as_ref().unwrap().source["cookie"], 3);
        // Indices are separate namespaces.
        assert_eq!(s.get(Idx::Inodes, "1/a").unwrap(), None);
        // An id too long to exist is simply absent; an empty one is invalid.
        assert_eq!(s.get(Idx::Entries, &"x".repeat(600)).unwrap(), None);
        assert!(is_invalid(s.get(Idx::Entries, "")));
        assert!(s.mget(Idx::Entries, &[]).unwrap().is_empty());
    }

    #[test]
    fn create_conflicts_on_existing_id() {
        let (_d, s) = open();
        let v = s.create(Idx::Inodes, "7", &json!({"kind": "dir"})).unwrap();
        assert!(conflict(s.create(
            Idx::Inodes,
            "7",
            &json!({"kind": "file"})
        )));
        let doc = s.get(Idx::Inodes, "7").unwrap().unwrap();
        assert_eq!(doc.version, v);
        assert_eq!(doc.source["kind"], "dir");
    }

    #[test]
    fn put_with_if_version() {
        let (_d, s) = open();
        let v1 = s.create(Idx::Inodes, "1", &json!({"n": 1})).unwrap();
        let v2 = s.put(Idx::Inodes, "1", &json!({"n": 2}), Some(v1)).unwrap();
        assert!(v2.seq_no > v1.seq_no);
        // Stale.
        assert!(conflict(s.put(
            Idx::Inodes,
            "1",
            &json!({"n": 3}),
            Some(v1)
        )));
        // Another primary term never matches.
        let other_term = Version {
            seq_no: v2.seq_no,
            primary_term: 2,
        };
        assert!(conflict(s.put(
            Idx::Inodes,
            "1",
            &json!({"n": 3}),
            Some(other_term)
        )));
        assert_eq!(s.get(Idx::Inodes, "1").unwrap().unwrap().source["n"], 2);
        // Absent document: 409 as in Elasticsearch, and nothing is created.
        assert!(conflict(s.put(Idx::Inodes, "2", &json!({}), Some(v2))));
        assert_eq!(s.get(Idx::Inodes, "2").unwrap(), None);
        // Unconditional put creates and overwrites.
        let v3 = s.put(Idx::Inodes, "2", &json!({"n": 1}), None).unwrap();
        let v4 = s.put(Idx::Inodes, "2", &json!({"n": 5}), None).unwrap();
        assert!(v4.seq_no > v3.seq_no);
        assert_eq!(s.get(Idx::Inodes, "2").unwrap().unwrap().version, v4);
    }

    #[test]
    fn delete_semantics() {
        let (_d, s) = open();
        assert!(!s.delete(Idx::Locks, "l", None).unwrap());
        let v1 = s.create(Idx::Locks, "l", &json!({"owner": "a"})).unwrap();
        let v2 = s
            .put(Idx::Locks, "l", &json!({"owner": "b"}), None)
            .unwrap();
        assert!(conflict(s.delete(Idx::Locks, "l", Some(v1))));
        assert!(s.get(Idx::Locks, "l").unwrap().is_some());
        assert!(s.delete(Idx::Locks, "l", Some(v2)).unwrap());
        assert_eq!(s.get(Idx::Locks, "l").unwrap(), None);
        assert!(conflict(s.delete(Idx::Locks, "l", Some(v2))));
        s.create(Idx::Locks, "m", &json!({})).unwrap();
        assert!(s.delete(Idx::Locks, "m", None).unwrap());
        assert!(!s.delete(Idx::Locks, "m", None).unwrap());
    }

    #[test]
    fn ids_are_validated_like_elasticsearch() {
        let (_d, s) = open();
        let max = "é".repeat(MAX_ID_BYTES / 2);
        assert_eq!(max.len(), MAX_ID_BYTES);
        s.create(Idx::Meta, &max, &json!({})).unwrap();
        assert!(s.get(Idx::Meta, &max).unwrap().is_some());
        let long = format!("{max}x");
        assert!(is_invalid(s.create(Idx::Meta, &long, &json!({}))));
        assert!(is_invalid(s.put(Idx::Meta, &long, &json!({}), None)));
        assert!(is_invalid(s.delete(Idx::Meta, &long, None)));
        assert!(is_invalid(s.create(Idx::Meta, "", &json!({}))));
        assert!(is_invalid(s.put(Idx::Meta, "", &json!({}), None)));
        assert!(is_invalid(s.delete(Idx::Meta, "", None)));
        let r = s
            .bulk(vec![BulkOp::Create {
                index: Idx::Meta,
                id: long,
                source: json!({}),
            }])
            .unwrap();
        assert!(is_invalid(r[0].clone()));
    }

    #[test]
    fn sources_and_fields_are_validated() {
        let (_d, s) = open();
        for bad in [json!([1]), json!("x"), json!(3), Value::Null] {
            assert!(is_invalid(s.create(Idx::Meta, "a", &bad)));
            assert!(is_invalid(s.put(Idx::Meta, "a", &bad, None)));
        }
        // Multi-valued (array/object) declared fields are not supported.
        assert!(is_invalid(s.create(
            Idx::Entries,
            "a",
            &json!({"name": ["x", "y"]})
        )));
        assert!(is_invalid(s.create(
            Idx::Entries,
            "a",
            &json!({"size": {"a": 1}})
        )));
        assert!(is_invalid(s.create(
            Idx::Entries,
            "a",
            &json!({"size": "big"})
        )));
        assert!(is_invalid(s.create(
            Idx::Entries,
            "a",
            &json!({"size": 1.5})
        )));
        assert!(is_invalid(s.create(
            Idx::Inodes,
            "a",
            &json!({"orphan": 1})
        )));
        assert!(is_invalid(s.create(
            Idx::Entries,
            "a",
            &json!({"size": u64::MAX})
        )));
        assert_eq!(s.get(Idx::Entries, "a").unwrap(), None);
        // Undeclared keys may hold anything; declared ones coerce like ES.
        s.create(
            Idx::Entries,
            "a",
            &json!({"extra": {"k": [1, 2]}, "size": "42", "mtime": 7.0, "kind": 5, "name": null}),
        )
        .unwrap();
        assert_eq!(
            matching(&s, Idx::Entries, Query::term("size", 42)),
            strs(&["a"])
        );
        assert_eq!(
            matching(&s, Idx::Entries, Query::term("mtime", 7)),
            strs(&["a"])
        );
        assert_eq!(
            matching(&s, Idx::Entries, Query::term("kind", "5")),
            strs(&["a"])
        );
        assert!(matching(&s, Idx::Entries, exists("name")).is_empty());
        s.create(Idx::Inodes, "b", &json!({"orphan": "true"}))
            .unwrap();
        assert_eq!(
            matching(&s, Idx::Inodes, Query::term("orphan", true)),
            strs(&["b"])
        );
    }

    #[test]
    fn seq_nos_are_store_wide_monotonic_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let last = {
            let s = EmbeddedStore::open(dir.path()).unwrap();
            let a = s.create(Idx::Entries, "a", &json!({})).unwrap();
            let b = s.create(Idx::Inodes, "a", &json!({})).unwrap();
            let c = s.put(Idx::Locks, "a", &json!({}), None).unwrap();
            assert!(a.seq_no < b.seq_no && b.seq_no < c.seq_no);
            // The highest seq_no ever handed out is gone after this delete.
            let d = s.bulk(vec![BulkOp::Delete {
                index: Idx::Locks,
                id: "a".into(),
                if_version: None,
            }]);
            d.unwrap()[0].clone().unwrap()
        };
        let s = EmbeddedStore::open(dir.path()).unwrap();
        let e = s.create(Idx::Locks, "a", &json!({})).unwrap();
        assert!(e.seq_no > last.seq_no);
        // Enough writes to cross several reservation blocks.
        let ops = (0..SEQ_BLOCK * 2 + 5)
            .map(|i| BulkOp::Index {
                index: Idx::Meta,
                id: format!("m{}", i % 3),
                source: json!({}),
                if_version: None,
            })
            .collect();
        let vs: Vec<u64> = s
            .bulk(ops)
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap().seq_no)
            .collect();
        assert!(vs.windows(2).all(|w| w[0] < w[1]));
        let top = *vs.last().unwrap();
        drop(s);
        let s = EmbeddedStore::open(dir.path()).unwrap();
        assert!(s.create(Idx::Meta, "z", &json!({})).unwrap().seq_no > top);
    }

    #[test]
    fn bulk_items_fail_independently_in_order() {
        let (_d, s) = open();
        let v = s
            .create(Idx::Inodes, "1", &json!({"kind": "file"}))
            .unwrap();
        let ops = vec![
            BulkOp::Create {
                index: Idx::Inodes,
                id: "2".into(),
                source: json!({"kind": "dir"}),
            },
            BulkOp::Create {
                index: Idx::Inodes,
                id: "1".into(),
                source: json!({}),
            },
            BulkOp::Index {
                index: Idx::Inodes,
                id: "1".into(),
                source: json!({"kind": "symlink"}),
                if_version: Some(Version {
                    seq_no: v.seq_no + 100,
                    primary_term: 1,
                }),
            },
            BulkOp::Delete {
                index: Idx::Inodes,
                id: "absent".into(),
                if_version: None,
            },
            BulkOp::Index {
                index: Idx::Inodes,
                id: "3".into(),
                source: json!([]),
                if_version: None,
            },
            BulkOp::Index {
                index: Idx::Inodes,
                id: "1".into(),
                source: json!({"kind": "fifo"}),
                if_version: Some(v),
            },
            BulkOp::Delete {
                index: Idx::Inodes,
                id: "2".into(),
                if_version: None,
            },
            BulkOp::Create {
                index: Idx::Entries,
                id: "1/x".into(),
                source: entry(1, "x", 1),
            },
        ];
        let r = s.bulk(ops).unwrap();
        assert_eq!(r.len(), 8);
        assert!(r[0].is_ok());
        assert_eq!(r[1], Err(StoreError::Conflict("1".into())));
        assert_eq!(r[2], Err(StoreError::Conflict("1".into())));
        assert_eq!(r[3], Err(StoreError::NotFound("absent".into())));
        assert!(is_invalid(r[4].clone()));
        let oks: Vec<u64> = [0, 5, 6, 7]
            .iter()
            .map(|&i| r[i].clone().unwrap().seq_no)
            .collect();
        assert!(oks.windows(2).all(|w| w[0] < w[1]));
        let one = s.get(Idx::Inodes, "1").unwrap().unwrap();
        assert_eq!(one.source["kind"], "fifo");
        assert_eq!(one.version, r[5].clone().unwrap());
        assert_eq!(s.get(Idx::Inodes, "2").unwrap(), None);
        assert_eq!(s.get(Idx::Inodes, "3").unwrap(), None);
        assert!(s.get(Idx::Entries, "1/x").unwrap().is_some());
        assert!(s.bulk(vec![]).unwrap().is_empty());
    }

    fn path_store() -> (tempfile::TempDir, EmbeddedStore) {
        let (d, s) = open();
        let paths = [
            "/a", "/a/b", "/a/b/c", "/a/b/c/d", "/a/bc", "/a/b-x", "/a/b.x", "/ab", "/b", "rel/x",
        ];
        let ops = paths
            .iter()
            .map(|p| BulkOp::Create {
                index: Idx::Entries,
                id: p.to_string(),
                source: json!({"path": p}),
            })
            .collect();
        assert!(s.bulk(ops).unwrap().iter().all(|r| r.is_ok()));
        s.create(Idx::Entries, "nopath", &json!({"name": "x"}))
            .unwrap();
        (d, s)
    }

    #[test]
    fn tree_query() {
        let (_d, s) = path_store();
        let tree = |p: &str| matching(&s, Idx::Entries, Query::tree("path", p));
        assert_eq!(tree("/a/b"), strs(&["/a/b", "/a/b/c", "/a/b/c/d"]));
        assert_eq!(tree("/a/b/c/d"), strs(&["/a/b/c/d"]));
        assert_eq!(
            tree("/a"),
            strs(&[
                "/a", "/a/b", "/a/b-x", "/a/b.x", "/a/b/c", "/a/b/c/d", "/a/bc"
            ])
        );
        assert_eq!(
            tree("/"),
            strs(&[
                "/a", "/a/b", "/a/b-x", "/a/b.x", "/a/b/c", "/a/b/c/d", "/a/bc", "/ab", "/b"
            ])
        );
        assert!(tree("/zz").is_empty());
        assert_eq!(tree("rel"), strs(&["rel/x"]));
    }

    #[test]
    fn prefix_query() {
        let (_d, s) = path_store();
        let pre = |p: &str| matching(&s, Idx::Entries, prefix("path", p));
        assert_eq!(
            pre("/a/b"),
            strs(&["/a/b", "/a/b-x", "/a/b.x", "/a/b/c", "/a/b/c/d", "/a/bc"])
        );
        assert_eq!(pre("/a/b/"), strs(&["/a/b/c", "/a/b/c/d"]));
        assert_eq!(pre("/A").len(), 0, "case-sensitive");
        assert_eq!(pre("").len(), 10, "empty prefix: every doc with the field");

        let names = [
            "e",
            "é",
            "éa",
            "é\u{10FFFF}",
            "ê",
            "\u{D7FF}x",
            "\u{E000}",
            "a%b",
            "axb",
            "a_c",
            "a\u{10FFFF}",
            "a\u{10FFFF}\u{10FFFF}",
            "b",
        ];
        for (i, n) in names.iter().enumerate() {
            s.create(Idx::Inodes, &format!("{i}"), &json!({"kind": n}))
                .unwrap();
        }
        let pre = |p: &str| -> Vec<&str> {
            let hits = s
                .search(&req(
                    Idx::Inodes,
                    prefix("kind", p),
                    vec![Sort::asc("kind")],
                    100,
                ))
                .unwrap();
            hits.iter()
                .map(|h| names[h.doc.id.parse::<usize>().unwrap()])
                .collect()
        };
        assert_eq!(pre("é"), ["é", "éa", "é\u{10FFFF}"]);
        assert_eq!(pre("\u{D7FF}"), ["\u{D7FF}x"]);
        assert_eq!(pre("a%"), ["a%b"], "% is literal");
        assert_eq!(pre("a_"), ["a_c"], "_ is literal");
        assert_eq!(pre("a\u{10FFFF}"), ["a\u{10FFFF}", "a\u{10FFFF}\u{10FFFF}"]);
        assert_eq!(pre("\u{10FFFF}"), Vec::<&str>::new());
        assert_eq!(prefix_end("a\u{10FFFF}"), Some("b".into()));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        assert_eq!(prefix_end("\u{D7FF}"), Some("\u{E000}".into()));
        assert!(is_invalid(s.count(Idx::Entries, &prefix("size", "1"))));
    }

    fn numbers_store() -> (tempfile::TempDir, EmbeddedStore) {
        let (d, s) = open();
        for i in 0..10i64 {
            let mut doc = json!({"ino": i, "kind": if i % 2 == 0 { "file" } else { "dir" }});
            if i % 3 != 0 {
                doc["size"] = json!(i * 100 - 500);
            }
            s.create(Idx::Entries, &format!("e{i}"), &doc).unwrap();
        }
        (d, s)
    }

    #[test]
    fn term_and_terms_queries() {
        let (_d, s) = numbers_store();
        assert_eq!(
            matching(&s, Idx::Entries, Query::term("ino", 4)),
            strs(&["e4"])
        );
        assert_eq!(
            matching(&s, Idx::Entries, Query::term("size", -300)),
            strs(&["e2"])
        );
        assert_eq!(
            matching(&s, Idx::Entries, Query::term("kind", "dir")),
            strs(&["e1", "e3", "e5", "e7", "e9"])
        );
        assert!(matching(&s, Idx::Entries, Query::term("kind", "DIR")).is_empty());
        let terms = |field: &str, values: Vec<Value>| {
            matching(
                &s,
                Idx::Entries,
                Query::Terms {
                    field: field.into(),
                    values,
                },
            )
        };
        assert_eq!(
            terms("ino", vec![json!(1), json!(8), json!(99)]),
            strs(&["e1", "e8"])
        );
        assert!(terms("ino", vec![]).is_empty());
        assert!(is_invalid(
            s.count(Idx::Entries, &Query::term("ino", Value::Null))
        ));
        assert!(is_invalid(s.count(Idx::Entries, &Query::term("ino", "x"))));

        s.create(Idx::Inodes, "1", &json!({"orphan": true}))
            .unwrap();
        s.create(Idx::Inodes, "2", &json!({"orphan": false}))
            .unwrap();
        s.create(Idx::Inodes, "3", &json!({})).unwrap();
        assert_eq!(
            matching(&s, Idx::Inodes, Query::term("orphan", true)),
            strs(&["1"])
        );
        assert_eq!(
            matching(&s, Idx::Inodes, Query::term("orphan", false)),
            strs(&["2"])
        );
        assert_eq!(
            matching(&s, Idx::Inodes, Query::MatchAll),
            strs(&["1", "2", "3"])
        );
    }

    #[test]
    fn range_and_exists_queries() {
        let (_d, s) = numbers_store();
        // sizes: e1 -400, e2 -300, e4 -100, e5 0, e7 200, e8 300
        let r = |gte, gt, lte, lt| matching(&s, Idx::Entries, range("size", gte, gt, lte, lt));
        assert_eq!(
            r(Some(json!(0)), None, None, None),
            strs(&["e5", "e7", "e8"])
        );
        assert_eq!(r(None, Some(json!(0)), None, None), strs(&["e7", "e8"]));
        assert_eq!(r(None, None, Some(json!(-300)), None), strs(&["e1", "e2"]));
        assert_eq!(r(None, None, None, Some(json!(-300))), strs(&["e1"]));
        assert_eq!(
            r(Some(json!(-300)), None, None, Some(json!(200))),
            strs(&["e2", "e4", "e5"])
        );
        assert_eq!(
            r(Some(Value::Null), None, None, Some(json!(-300))),
            strs(&["e1"])
        );
        assert_eq!(
            r(None, None, None, None),
            strs(&["e1", "e2", "e4", "e5", "e7", "e8"])
        );
        assert_eq!(matching(&s, Idx::Entries, exists("size")).len(), 6);
        assert!(matching(&s, Idx::Entries, exists("mtime")).is_empty());
        // Ranges on keywords compare bytes.
        let kinds = matching(
            &s,
            Idx::Entries,
            range("kind", None, Some(json!("dir")), None, None),
        );
        assert_eq!(kinds.len(), 5);
    }

    #[test]
    fn bool_query() {
        let (_d, s) = numbers_store();
        let b = |must: Vec<Query>, must_not: Vec<Query>, should: Vec<Query>| {
            matching(
                &s,
                Idx::Entries,
                Query::Bool {
                    must,
                    must_not,
                    should,
                },
            )
        };
        let ge0 = || range("size", Some(json!(0)), None, None, None);
        assert_eq!(b(vec![], vec![], vec![]).len(), 10);
        assert_eq!(
            b(vec![Query::term("kind", "file"), ge0()], vec![], vec![]),
            strs(&["e8"])
        );
        // must_not keeps documents missing the field (ES semantics).
        assert_eq!(
            b(vec![], vec![ge0()], vec![]),
            strs(&["e0", "e1", "e2", "e3", "e4", "e6", "e9"])
        );
        assert_eq!(
            b(vec![], vec![ge0(), Query::term("kind", "dir")], vec![]),
            strs(&["e0", "e2", "e4", "e6"])
        );
        assert_eq!(
            b(
                vec![],
                vec![],
                vec![Query::term("ino", 1), Query::term("ino", 2)]
            ),
            strs(&["e1", "e2"])
        );
        // should is required to match (at least one) when non-empty.
        assert_eq!(
            b(
                vec![Query::term("kind", "dir")],
                vec![],
                vec![Query::term("ino", 1), Query::term("ino", 2)]
            ),
            strs(&["e1"])
        );
        // Nested: not (dir and has size).
        let inner = Query::and(vec![Query::term("kind", "dir"), exists("size")]);
        assert_eq!(
            b(vec![], vec![inner], vec![]),
            strs(&["e0", "e2", "e3", "e4", "e6", "e8", "e9"])
        );
        // A negated negation.
        let not_dir = Query::Bool {
            must: vec![],
            must_not: vec![Query::term("kind", "dir")],
            should: vec![],
        };
        assert_eq!(b(vec![], vec![not_dir], vec![]).len(), 5);
        assert_eq!(
            b(vec![Query::MatchAll], vec![Query::MatchAll], vec![]).len(),
            0
        );
    }

    #[test]
    fn undeclared_fields_are_invalid() {
        let (_d, s) = numbers_store();
        let search = |q: Query, sort: Vec<Sort>| s.search(&req(Idx::Entries, q, sort, 10));
        assert!(is_invalid(search(Query::term("nope", 1), vec![])));
        assert!(is_invalid(search(Query::term("path.tree", "/a"), vec![])));
        assert!(is_invalid(search(Query::term("name.text", "a"), vec![])));
        assert!(is_invalid(search(Query::tree("path.tree", "/a"), vec![])));
        assert!(is_invalid(search(Query::tree("dir", "/a"), vec![])));
        assert!(is_invalid(search(exists("src"), vec![])));
        assert!(is_invalid(search(Query::MatchAll, vec![Sort::asc("nope")])));
        assert!(is_invalid(search(Query::MatchAll, vec![Sort::asc("_id")])));
        let nested = Query::and(vec![Query::MatchAll, Query::term("id", "e1")]);
        assert!(is_invalid(search(nested.clone(), vec![])));
        assert!(is_invalid(s.count(Idx::Entries, &nested)));
        assert!(is_invalid(s.count(Idx::Meta, &exists("kind"))));
        assert_eq!(s.count(Idx::Meta, &Query::MatchAll).unwrap(), 0);
        // Bad search_after: wrong arity, non-string id, wrong type.
        for after in [
            vec![],
            vec![json!(1), json!("e1"), json!("e2")],
            vec![json!(1), json!(2)],
            vec![json!("x"), json!("e1")],
        ] {
            let mut r = req(Idx::Entries, Query::MatchAll, vec![Sort::asc("ino")], 10);
            r.search_after = Some(after);
            assert!(is_invalid(s.search(&r)));
        }
        let mut r = req(Idx::Entries, Query::MatchAll, vec![], 10);
        r.search_after = Some(vec![]);
        assert!(is_invalid(s.search(&r)));
        // Validation happens even for empty pages.
        assert!(is_invalid(s.search(&req(
            Idx::Entries,
            Query::term("nope", 1),
            vec![],
            0
        ))));
    }

    #[test]
    fn count_matches_queries() {
        let (_d, s) = numbers_store();
        assert_eq!(s.count(Idx::Entries, &Query::MatchAll).unwrap(), 10);
        assert_eq!(
            s.count(Idx::Entries, &Query::term("kind", "file")).unwrap(),
            5
        );
        assert_eq!(s.count(Idx::Entries, &exists("size")).unwrap(), 6);
        assert_eq!(s.count(Idx::Inodes, &Query::MatchAll).unwrap(), 0);
        s.delete(Idx::Entries, "e0", None).unwrap();
        assert_eq!(
            s.count(Idx::Entries, &Query::term("kind", "file")).unwrap(),
            4
        );
    }

    #[test]
    fn paging_visits_every_doc_once_in_order() {
        let (_d, s) = open();
        let n = 2500i64;
        // Cookies are a permutation of 0..n, not in id order.
        let ops = (0..n)
            .map(|i| BulkOp::Create {
                index: Idx::Entries,
                id: format!("1/f{i:05}"),
                source: entry(1, &format!("f{i:05}"), (i * 7919) % n),
            })
            .collect();
        assert!(s.bulk(ops).unwrap().iter().all(|r| r.is_ok()));
        s.create(Idx::Entries, "2/other", &entry(2, "other", 5))
            .unwrap();
        let q = || Query::term("parent", 1);
        let cookies = |hits: &[Hit]| -> Vec<i64> {
            hits.iter()
                .map(|h| h.doc.source["cookie"].as_i64().unwrap())
                .collect()
        };

        let asc = scan_all(&s, Idx::Entries, q(), vec![Sort::asc("cookie")], 1000);
        assert_eq!(cookies(&asc), (0..n).collect::<Vec<_>>());
        assert_eq!(asc[0].sort, vec![json!(0), json!(asc[0].doc.id)]);

        let desc_hits = scan_all(&s, Idx::Entries, q(), vec![desc("cookie")], 1000);
        assert_eq!(cookies(&desc_hits), (0..n).rev().collect::<Vec<_>>());

        let by_id = scan_all(&s, Idx::Entries, q(), vec![], 1000);
        let expect: Vec<String> = (0..n).map(|i| format!("1/f{i:05}")).collect();
        assert_eq!(ids(&by_id), expect);
        assert_eq!(by_id[0].sort, vec![json!("1/f00000")]);

        // search_after from the middle.
        let mut r = req(Idx::Entries, q(), vec![Sort::asc("cookie")], 3);
        r.search_after = Some(asc[1499].sort.clone());
        assert_eq!(cookies(&s.search(&r).unwrap()), vec![1500, 1501, 1502]);
    }

    #[test]
    fn duplicate_sort_values_tie_break_on_id() {
        let (_d, s) = open();
        for (i, name) in ["e", "b", "d", "a", "c", "f"].iter().enumerate() {
            let cookie = if i < 4 { 7 } else { 3 };
            s.create(Idx::Entries, name, &entry(1, name, cookie))
                .unwrap();
        }
        let asc = scan_all(
            &s,
            Idx::Entries,
            Query::MatchAll,
            vec![Sort::asc("cookie")],
            2,
        );
        assert_eq!(ids(&asc), strs(&["c", "f", "a", "b", "d", "e"]));
        let dsc = scan_all(&s, Idx::Entries, Query::MatchAll, vec![desc("cookie")], 2);
        assert_eq!(ids(&dsc), strs(&["a", "b", "d", "e", "c", "f"]));
        assert_eq!(dsc[0].sort, vec![json!(7), json!("a")]);
    }

    #[test]
    fn search_after_without_id_is_strict_like_elasticsearch() {
        let (_d, s) = open();
        for (id, cookie) in [
            ("a", Some(3)),
            ("b", Some(1)),
            ("c", Some(3)),
            ("d", Some(2)),
            ("e", None),
        ] {
            let mut doc = json!({"parent": 1});
            if let Some(c) = cookie {
                doc["cookie"] = json!(c);
            }
            s.create(Idx::Entries, id, &doc).unwrap();
        }
        let page = |after: Value, descending: bool| {
            let mut r = req(
                Idx::Entries,
                Query::term("parent", 1),
                vec![Sort {
                    field: "cookie".into(),
                    descending,
                }],
                10,
            );
            r.search_after = Some(vec![after]);
            ids(&s.search(&r).unwrap())
        };
        assert_eq!(page(json!(0), false), strs(&["b", "d", "a", "c", "e"]));
        assert_eq!(page(json!(1), false), strs(&["d", "a", "c", "e"]));
        // Ties with the after values are skipped: there is no id to split them.
        assert_eq!(page(json!(3), false), strs(&["e"]));
        assert_eq!(page(json!(3), true), strs(&["d", "b", "e"]));
        assert!(page(Value::Null, false).is_empty());
        // Directory-listing style paging on a unique sort value.
        let mut seen = vec![];
        let mut after = json!(0);
        loop {
            let mut r = req(Idx::Entries, exists("cookie"), vec![Sort::asc("cookie")], 1);
            r.search_after = Some(vec![after]);
            let hits = s.search(&r).unwrap();
            let Some(h) = hits.last() else { break };
            after = h.sort[0].clone();
            seen.push(h.doc.id.clone());
        }
        assert_eq!(seen, strs(&["b", "d", "a"]));
    }

    /// Reference order: missing values last in both directions, then the id.
    fn reference_cmp(a: &Hit, b: &Hit, sort: &[Sort]) -> Ordering {
        for (i, s) in sort.iter().enumerate() {
            let (x, y) = (&a.sort[i], &b.sort[i]);
            let o = match (x.is_null(), y.is_null()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                _ => {
                    let o = match (x.as_i64(), y.as_i64()) {
                        (Some(x), Some(y)) => x.cmp(&y),
                        _ => x.as_str().unwrap().cmp(y.as_str().unwrap()),
                    };
                    if s.descending { o.reverse() } else { o }
                }
            };
            if o != Ordering::Equal {
                return o;
            }
        }
        a.doc.id.cmp(&b.doc.id)
    }

    #[test]
    fn missing_values_sort_last_with_multi_key_paging() {
        let (_d, s) = open();
        let mut x: u64 = 12345;
        let mut rnd = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        let ops = (0..300)
            .map(|i| {
                let mut doc = json!({});
                if rnd(4) != 0 {
                    doc["uid"] = json!(rnd(3));
                }
                if rnd(3) != 0 {
                    doc["name"] = json!(["a", "b", "é", "\u{0}"][rnd(4) as usize]);
                }
                if rnd(5) != 0 {
                    doc["size"] = json!(rnd(4) as i64 - 2);
                }
                BulkOp::Create {
                    index: Idx::Entries,
                    id: format!("d{i}"),
                    source: doc,
                }
            })
            .collect();
        assert!(s.bulk(ops).unwrap().iter().all(|r| r.is_ok()));
        for dirs in 0..8 {
            let sort: Vec<Sort> = ["uid", "name", "size"]
                .iter()
                .enumerate()
                .map(|(i, f)| Sort {
                    field: f.to_string(),
                    descending: dirs & (1 << i) != 0,
                })
                .collect();
            for keys in 1..=3 {
                let sort = &sort[..keys];
                for page in [1, 7, 1000] {
                    let hits = scan_all(&s, Idx::Entries, Query::MatchAll, sort.to_vec(), page);
                    assert_eq!(hits.len(), 300, "{sort:?} page {page}");
                    for w in hits.windows(2) {
                        assert_eq!(
                            reference_cmp(&w[0], &w[1], sort),
                            Ordering::Less,
                            "{sort:?} page {page}: {:?} then {:?}",
                            w[0].sort,
                            w[1].sort
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn nul_characters_round_trip() {
        let (_d, s) = open();
        let paths = [
            "/a",
            "/a\u{0}",
            "/a\u{0}b",
            "/a\u{0}b/c",
            "/a\u{0}bc",
            "/a\u{1}",
        ];
        for p in paths {
            let id = format!("1/{p}");
            s.create(Idx::Entries, &id, &json!({"path": p, "name": p}))
                .unwrap();
            let doc = s.get(Idx::Entries, &id).unwrap().unwrap();
            assert_eq!(doc.source["path"], p);
            assert_eq!(doc.id, id);
        }
        let paths_of = |hits: Vec<Hit>| -> Vec<String> {
            hits.iter()
                .map(|h| h.doc.source["path"].as_str().unwrap().to_string())
                .collect()
        };
        let find = |q: Query| {
            paths_of(
                s.search(&req(Idx::Entries, q, vec![Sort::asc("path")], 100))
                    .unwrap(),
            )
        };
        assert_eq!(find(Query::term("path", "/a\u{0}b")), strs(&["/a\u{0}b"]));
        assert_eq!(find(Query::term("name", "/a\u{0}")), strs(&["/a\u{0}"]));
        assert_eq!(
            find(Query::tree("path", "/a\u{0}b")),
            strs(&["/a\u{0}b", "/a\u{0}b/c"])
        );
        assert_eq!(
            find(prefix("path", "/a\u{0}")),
            strs(&["/a\u{0}", "/a\u{0}b", "/a\u{0}b/c", "/a\u{0}bc"])
        );
        // Byte order, NUL sorting right after the shorter string.
        let all = scan_all(
            &s,
            Idx::Entries,
            Query::MatchAll,
            vec![Sort::asc("path")],
            2,
        );
        assert_eq!(paths_of(all.clone()), strs(&paths));
        assert_eq!(all[1].sort[0], json!("/a\u{0}"));
        let mut r = req(Idx::Entries, Query::MatchAll, vec![Sort::asc("path")], 1);
        r.search_after = Some(all[2].sort.clone());
        assert_eq!(paths_of(s.search(&r).unwrap()), strs(&["/a\u{0}b/c"]));
    }

    #[test]
    fn reopen_sees_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let (v, path) = {
            let s = EmbeddedStore::open(dir.path()).unwrap();
            let v = s.create(Idx::Entries, "1/a", &entry(1, "a", 9)).unwrap();
            s.sync().unwrap();
            s.create(Idx::Entries, "1/b", &entry(1, "b", 10)).unwrap();
            (v, dir.path().join("meta.sqlite"))
        };
        assert!(path.exists());
        let s = EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(s.get(Idx::Entries, "1/a").unwrap().unwrap().version, v);
        assert_eq!(
            matching(&s, Idx::Entries, Query::term("cookie", 10)),
            strs(&["1/b"])
        );
        assert_eq!(s.describe(), format!("sqlite:{}", path.display()));
        s.refresh(Idx::Entries).unwrap();
    }

    #[test]
    fn new_fields_are_backfilled_on_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = EmbeddedStore::open(dir.path()).unwrap();
            s.create(Idx::Entries, "a", &json!({"mode": 0o755, "uid": 1}))
                .unwrap();
            s.create(Idx::Entries, "b", &json!({"mode": [1]}))
                .unwrap_err();
        }
        {
            // Simulate a database created before `mode` was declared, holding a
            // document whose `mode` was not indexable then.
            let c = Connection::open(dir.path().join("meta.sqlite")).unwrap();
            c.execute_batch(
                "DROP INDEX IF EXISTS entries_f_mode; ALTER TABLE entries DROP COLUMN f_mode;
                 INSERT INTO entries (id, seq, src) VALUES ('b', 99, '{\"mode\":[1]}');",
            )
            .unwrap();
        }
        let s = EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(
            matching(&s, Idx::Entries, Query::term("mode", 0o755)),
            strs(&["a"])
        );
        assert_eq!(matching(&s, Idx::Entries, exists("mode")), strs(&["a"]));
        assert_eq!(
            matching(&s, Idx::Entries, Query::term("uid", 1)),
            strs(&["a"])
        );
    }

    #[test]
    fn readers_run_during_a_large_bulk() {
        let (_d, s) = open();
        let s = Arc::new(s);
        s.create(Idx::Entries, "seed", &entry(0, "seed", 0))
            .unwrap();
        let n = 30_000;
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..4)
            .map(|t| {
                let (s, done) = (s.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut reads = 0;
                    loop {
                        let finished = done.load(AtomicOrdering::SeqCst);
                        assert!(s.get(Idx::Entries, "seed").unwrap().is_some());
                        // The bulk is atomic: all of it or none.
                        let c = s.count(Idx::Entries, &Query::term("parent", 1)).unwrap();
                        assert!(c == 0 || c == n, "partial bulk visible: {c}");
                        let hits = s
                            .search(&req(
                                Idx::Entries,
                                Query::MatchAll,
                                vec![Sort::asc("cookie")],
                                50,
                            ))
                            .unwrap();
                        assert!(!hits.is_empty());
                        if t == 0 {
                            s.mget(Idx::Entries, &strs(&["seed", "1/f1"])).unwrap();
                        }
                        reads += 1;
                        if finished {
                            return reads;
                        }
                    }
                })
            })
            .collect();
        let ops = (0..n)
            .map(|i| BulkOp::Create {
                index: Idx::Entries,
                id: format!("1/f{i}"),
                source: entry(1, &format!("f{i}"), i as i64 + 1),
            })
            .collect();
        let r = s.bulk(ops).unwrap();
        done.store(true, AtomicOrdering::SeqCst);
        assert!(r.iter().all(|r| r.is_ok()));
        for h in readers {
            assert!(h.join().unwrap() > 0);
        }
        assert_eq!(s.count(Idx::Entries, &Query::term("parent", 1)).unwrap(), n);
    }

    #[test]
    fn more_threads_than_reader_connections() {
        let (_d, s) = open();
        s.create(Idx::Meta, "x", &json!({})).unwrap();
        std::thread::scope(|sc| {
            for i in 0..MAX_READERS * 3 {
                let s = &s;
                sc.spawn(move || {
                    for j in 0..50 {
                        assert!(s.get(Idx::Meta, "x").unwrap().is_some());
                        if j % 10 == 0 {
                            s.put(Idx::Meta, &format!("t{i}"), &json!({"j": j}), None)
                                .unwrap();
                        }
                    }
                });
            }
        });
        assert_eq!(
            s.count(Idx::Meta, &Query::MatchAll).unwrap(),
            1 + MAX_READERS as u64 * 3
        );
        assert!(s.readers.pool.lock().open <= MAX_READERS);
    }

    #[test]
    fn hot_queries_use_indexes() {
        let (_d, s) = open();
        let plan =
            |idx: Idx, q: Query, sort: Vec<Sort>, after: Option<Vec<Value>>| -> Vec<String> {
                let mut filter = Sql::default();
                compile(idx, &q, &mut filter).unwrap();
                let keys = sort_keys(idx, &sort).unwrap();
                let after = after.map(|a| parse_after(&keys, &a).unwrap());
                let sql = &search_sql(idx.name(), &filter, &keys, after.as_ref(), &[], true)[0];
                let conn = s.readers.get().unwrap();
                let mut stmt = conn
                    .prepare(&format!("EXPLAIN QUERY PLAN {}", sql.text))
                    .unwrap();
                let params = sql.params.iter().cloned().chain([SqlValue::Integer(10)]);
                stmt.query_map(rusqlite::params_from_iter(params), |r| {
                    r.get::<_, String>(3)
                })
                .unwrap()
                .map(|r| r.unwrap())
                .collect()
            };
        let no_sort = |p: &[String]| {
            p.iter()
                .all(|l| !l.contains("TEMP B-TREE") && !l.starts_with("SCAN"))
        };
        // Directory listing, first and later pages.
        let listing = || (Query::term("parent", 1), vec![Sort::asc("cookie")]);
        let (q, sort) = listing();
        let p = plan(Idx::Entries, q, sort, None);
        assert!(
            no_sort(&p) && p.iter().any(|l| l.contains("entries_f_parent")),
            "{p:?}"
        );
        let (q, sort) = listing();
        let p = plan(Idx::Entries, q, sort, Some(vec![json!(5), json!("1/x")]));
        assert!(
            no_sort(&p) && p.iter().any(|l| l.contains("entries_f_parent")),
            "{p:?}"
        );
        // The same, Elasticsearch-style (`search_after` without the id).
        let (q, sort) = listing();
        let p = plan(Idx::Entries, q, sort, Some(vec![json!(5)]));
        assert!(
            no_sort(&p) && p.iter().any(|l| l.contains("entries_f_parent")),
            "{p:?}"
        );
        // Subtree scan in path order.
        let p = plan(
            Idx::Entries,
            Query::tree("path", "/a"),
            vec![Sort::asc("path")],
            Some(vec![json!("/a/b"), json!("x")]),
        );
        assert!(
            no_sort(&p) && p.iter().any(|l| l.contains("entries_f_path")),
            "{p:?}"
        );
        // Id paging.
        let p = plan(Idx::Inodes, Query::MatchAll, vec![], Some(vec![json!("5")]));
        assert!(!p.iter().any(|l| l.contains("TEMP B-TREE")), "{p:?}");
        // fsck's full scan in (parent, cookie) order.
        let p = plan(
            Idx::Entries,
            Query::MatchAll,
            vec![Sort::asc("parent"), Sort::asc("cookie")],
            Some(vec![json!(1), json!(5), json!("1/x")]),
        );
        assert!(
            p.iter().any(|l| l.contains("entries_f_parent"))
                && !p.iter().any(|l| l.starts_with("SCAN")),
            "{p:?}"
        );
    }

    /// Rough write throughput: `cargo test --release -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn write_throughput() {
        let (_d, s) = open();
        let n = 20_000;
        let t = std::time::Instant::now();
        for i in 0..n {
            let v = s
                .create(
                    Idx::Entries,
                    &format!("1/f{i}"),
                    &entry(1, &format!("f{i}"), i),
                )
                .unwrap();
            s.put(
                Idx::Inodes,
                &format!("{i}"),
                &json!({"kind": "file", "nlink": 1}),
                None,
            )
            .unwrap();
            if i % 2 == 0 {
                s.put(
                    Idx::Entries,
                    &format!("1/f{i}"),
                    &entry(1, &format!("f{i}"), i),
                    Some(v),
                )
                .unwrap();
            }
        }
        let e = t.elapsed();
        println!(
            "{} single writes in {e:?}: {:.0}/s",
            n * 5 / 2,
            (n * 5 / 2) as f64 / e.as_secs_f64()
        );
        let t = std::time::Instant::now();
        for i in 0..n {
            s.get(Idx::Entries, &format!("1/f{i}")).unwrap().unwrap();
        }
        println!("{n} gets in {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let hits = scan_all(
            &s,
            Idx::Entries,
            Query::term("parent", 1),
            vec![Sort::asc("cookie")],
            1000,
        );
        assert_eq!(hits.len(), n as usize);
        println!("listing {n} in {:?}", t.elapsed());
    }
}

#[cfg(test)]
mod text_tests {
    use super::*;
    use serde_json::json;

    fn open() -> (tempfile::TempDir, EmbeddedStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("store")).unwrap();
        (dir, store)
    }

    fn text(t: &str) -> Query {
        Query::Text {
            field: "contents".into(),
            text: t.into(),
        }
    }

    fn ids(s: &EmbeddedStore, q: Query) -> Vec<String> {
        let hits = s
            .search_brief(&SearchRequest {
                index: Idx::Entries,
                query: q,
                sort: vec![Sort::asc("path")],
                search_after: None,
                size: 100,
            })
            .unwrap();
        hits.into_iter().map(|h| h.doc.id).collect()
    }

    fn doc(path: &str, dir: &str, contents: Option<&str>, xattrs: &[&str]) -> Value {
        let mut d = json!({"path": path, "dir": dir, "kind": "file", "uid": 1});
        if let Some(c) = contents {
            d["contents"] = json!(c);
        }
        if !xattrs.is_empty() {
            d["xattrs"] = json!(xattrs);
        }
        d
    }

    #[test]
    fn text_fields_are_substring_searchable_and_kept_apart() {
        let (_d, s) = open();
        s.create(
            Idx::Entries,
            "a",
            &doc("/a", "/", Some("Hello World\nfoo"), &[]),
        )
        .unwrap();
        s.create(
            Idx::Entries,
            "b",
            &doc("/d/b", "/d", Some("yellow \"quoted\""), &[]),
        )
        .unwrap();
        s.create(Idx::Entries, "c", &doc("/d/c", "/d", None, &[]))
            .unwrap();
        assert_eq!(ids(&s, text("ello")), ["a", "b"]);
        assert_eq!(ids(&s, text("WORLD")), ["a"]);
        assert_eq!(ids(&s, text("o W")), ["a"]);
        assert_eq!(ids(&s, text("\"quoted\"")), ["b"]);
        assert!(ids(&s, text("nothing")).is_empty());
        assert!(matches!(
            s.count(Idx::Entries, &text("ab")),
            Err(StoreError::Invalid(_))
        ));
        // Full reads carry the text, brief ones do not.
        let full = s.get(Idx::Entries, "a").unwrap().unwrap();
        assert_eq!(full.source["contents"], "Hello World\nfoo");
        let brief = s.get_brief(Idx::Entries, "a").unwrap().unwrap();
        assert!(brief.source.get("contents").is_none());
        assert_eq!(brief.version, full.version);
        let hits = s
            .search(&SearchRequest {
                index: Idx::Entries,
                query: text("yellow"),
                sort: vec![],
                search_after: None,
                size: 10,
            })
            .unwrap();
        assert_eq!(hits[0].doc.source["contents"], "yellow \"quoted\"");
        // Rewriting without the text drops it from the index; deleting too.
        s.put(Idx::Entries, "a", &doc("/a", "/", None, &[]), None)
            .unwrap();
        assert!(ids(&s, text("ello")) == ["b"]);
        assert!(
            s.get(Idx::Entries, "a")
                .unwrap()
                .unwrap()
                .source
                .get("contents")
                .is_none()
        );
        s.delete(Idx::Entries, "b", None).unwrap();
        assert!(ids(&s, text("ello")).is_empty());
        assert_eq!(
            s.count(
                Idx::Entries,
                &Query::Exists {
                    field: "contents".into()
                }
            )
            .unwrap(),
            0
        );
        // Bulk writes and text in must_not / should.
        let r = s
            .bulk(vec![BulkOp::Index {
                index: Idx::Entries,
                id: "e".into(),
                source: doc("/e", "/", Some("needle in a haystack"), &[]),
                if_version: None,
            }])
            .unwrap();
        assert!(r[0].is_ok());
        let q = Query::Bool {
            must: vec![Query::term("kind", "file")],
            must_not: vec![],
            should: vec![
                text("needle"),
                Query::Bool {
                    must: vec![],
                    must_not: vec![Query::Exists {
                        field: "contents".into(),
                    }],
                    should: vec![],
                },
            ],
        };
        assert_eq!(ids(&s, q), ["a", "c", "e"]);
        // Not a string: invalid.
        assert!(matches!(
            s.create(Idx::Entries, "x", &json!({"contents": 5})),
            Err(StoreError::Invalid(_))
        ));
    }

    #[test]
    fn keywords_fields_hold_several_values() {
        let (_d, s) = open();
        s.create(
            Idx::Entries,
            "a",
            &doc("/a", "/", None, &["user.tag=x", "user.tag"]),
        )
        .unwrap();
        s.create(Idx::Entries, "b", &doc("/b", "/", None, &["user.tag=y"]))
            .unwrap();
        s.create(Idx::Entries, "c", &doc("/c", "/", None, &[]))
            .unwrap();
        assert_eq!(ids(&s, Query::term("xattrs", "user.tag=x")), ["a"]);
        assert_eq!(ids(&s, Query::term("xattrs", "user.tag")), ["a"]);
        assert_eq!(
            ids(
                &s,
                Query::Terms {
                    field: "xattrs".into(),
                    values: vec![json!("user.tag=x"), json!("user.tag=y")]
                }
            ),
            ["a", "b"]
        );
        assert_eq!(
            ids(
                &s,
                Query::Prefix {
                    field: "xattrs".into(),
                    value: "user.tag=".into()
                }
            ),
            ["a", "b"]
        );
        assert_eq!(
            ids(
                &s,
                Query::Exists {
                    field: "xattrs".into()
                }
            ),
            ["a", "b"]
        );
        let none = Query::Bool {
            must: vec![],
            must_not: vec![Query::Exists {
                field: "xattrs".into(),
            }],
            should: vec![],
        };
        assert_eq!(ids(&s, none), ["c"]);
        s.put(
            Idx::Entries,
            "a",
            &doc("/a", "/", None, &["user.tag=z"]),
            None,
        )
        .unwrap();
        assert!(ids(&s, Query::term("xattrs", "user.tag=x")).is_empty());
        assert_eq!(ids(&s, Query::term("xattrs", "user.tag=z")), ["a"]);
        // A single string is one value.
        s.put(
            Idx::Entries,
            "c",
            &json!({"path": "/c", "xattrs": "one"}),
            None,
        )
        .unwrap();
        assert_eq!(ids(&s, Query::term("xattrs", "one")), ["c"]);
        s.delete(Idx::Entries, "c", None).unwrap();
        assert!(ids(&s, Query::term("xattrs", "one")).is_empty());
        assert!(matches!(
            s.search(&SearchRequest {
                index: Idx::Entries,
                query: Query::MatchAll,
                sort: vec![Sort::asc("xattrs")],
                search_after: None,
                size: 1
            }),
            Err(StoreError::Invalid(_))
        ));
    }

    #[test]
    fn grouping_orders_buckets_by_best_hit() {
        let (_d, s) = open();
        s.create(Idx::Entries, "1", &doc("/x/1", "/x", Some("foo bar"), &[]))
            .unwrap();
        s.create(
            Idx::Entries,
            "2",
            &doc("/y/2", "/y", Some("foo foo foo foo"), &[]),
        )
        .unwrap();
        s.create(
            Idx::Entries,
            "3",
            &doc(
                "/y/3",
                "/y",
                Some("foo, then a long tail of other words"),
                &[],
            ),
        )
        .unwrap();
        s.create(Idx::Entries, "4", &doc("/z/4", "/z", Some("nothing"), &[]))
            .unwrap();
        let g = s
            .group(&GroupRequest {
                index: Idx::Entries,
                query: text("foo"),
                score: Some(text("foo")),
                field: "dir".into(),
                buckets: 10,
                per_bucket: 1,
            })
            .unwrap();
        let keys: Vec<_> = g.iter().map(|b| b.key.clone()).collect();
        assert_eq!(keys, [json!("/y"), json!("/x")]);
        assert_eq!(g[0].doc_count, 2);
        assert_eq!(g[0].hits.len(), 1);
        assert_eq!(g[0].hits[0].0.id, "2");
        assert!(g[0].top_score >= g[1].top_score && g[0].top_score > 0.0);
        // Without a score: key order, every score 0.
        let g = s
            .group(&GroupRequest {
                index: Idx::Entries,
                query: Query::MatchAll,
                score: None,
                field: "dir".into(),
                buckets: 2,
                per_bucket: 5,
            })
            .unwrap();
        let keys: Vec<_> = g.iter().map(|b| b.key.clone()).collect();
        assert_eq!(keys, [json!("/x"), json!("/y")]);
        assert_eq!(g[1].hits.len(), 2);
        assert_eq!(g[1].top_score, 0.0);
    }

    #[test]
    fn a_rename_bulk_moves_the_text_with_the_document() {
        let (_d, s) = open();
        let text_rows = |s: &EmbeddedStore| -> i64 {
            let st = side_table(Idx::Entries, field_of(Idx::Entries, "contents").unwrap());
            s.read(false, |c| {
                c.query_row(&format!("SELECT count(*) FROM \"{st}_text\""), [], |r| {
                    r.get(0)
                })
                .map_err(sql_err)
            })
            .unwrap()
        };
        let rid_of = |s: &EmbeddedStore, id: &str| -> Option<i64> {
            s.read(false, |c| {
                c.query_row("SELECT rid FROM entries WHERE id = ?1", [id], |r| r.get(0))
                    .optional()
                    .map_err(sql_err)
            })
            .unwrap()
        };
        let vx = s
            .create(
                Idx::Entries,
                "x",
                &doc("/x", "/", Some("moving needle"), &[]),
            )
            .unwrap();
        let rid_x = rid_of(&s, "x");
        let vz = s
            .create(
                Idx::Entries,
                "z",
                &doc("/z", "/", Some("replaced hay"), &[]),
            )
            .unwrap();
        // [create y, delete x] carrying x's text: x's row becomes y's.
        let r = s
            .bulk(vec![
                BulkOp::Create {
                    index: Idx::Entries,
                    id: "y".into(),
                    source: doc("/y", "/", Some("moving needle"), &["user.k=v"]),
                },
                BulkOp::Delete {
                    index: Idx::Entries,
                    id: "x".into(),
                    if_version: Some(vx),
                },
            ])
            .unwrap();
        let (vy, vdel) = (*r[0].as_ref().unwrap(), *r[1].as_ref().unwrap());
        assert!(vy.seq_no > vz.seq_no && vdel.seq_no == vy.seq_no + 1);
        assert!(s.get(Idx::Entries, "x").unwrap().is_none());
        assert_eq!(rid_of(&s, "y"), rid_x, "moved in place, text rows kept");
        let y = s.get(Idx::Entries, "y").unwrap().unwrap();
        assert_eq!(y.version, vy);
        assert_eq!(y.source["path"], "/y");
        assert_eq!(y.source["contents"], "moving needle");
        assert_eq!(ids(&s, text("NEEDLE")), ["y"]);
        assert_eq!(ids(&s, Query::term("xattrs", "user.k=v")), ["y"]);
        assert_eq!(ids(&s, Query::term("path", "/y")), ["y"]);
        // Over an existing document (rename over a file): its text goes.
        let r = s
            .bulk(vec![
                BulkOp::Index {
                    index: Idx::Entries,
                    id: "z".into(),
                    source: doc("/z", "/", Some("moving needle"), &[]),
                    if_version: Some(vz),
                },
                BulkOp::Delete {
                    index: Idx::Entries,
                    id: "y".into(),
                    if_version: Some(vy),
                },
            ])
            .unwrap();
        assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
        assert_eq!(ids(&s, text("needle")), ["z"]);
        assert!(ids(&s, text("hay")).is_empty());
        assert!(ids(&s, Query::term("xattrs", "user.k=v")).is_empty());
        assert_eq!(text_rows(&s), 1);
        // Stale versions fail item by item as usual, changing nothing.
        let r = s
            .bulk(vec![
                BulkOp::Create {
                    index: Idx::Entries,
                    id: "w".into(),
                    source: doc("/w", "/", Some("moving needle"), &[]),
                },
                BulkOp::Delete {
                    index: Idx::Entries,
                    id: "z".into(),
                    if_version: Some(vz),
                },
            ])
            .unwrap();
        assert!(r[0].is_ok() && matches!(r[1], Err(StoreError::Conflict(_))));
        assert_eq!(ids(&s, text("needle")), ["w", "z"]);
        assert_eq!(text_rows(&s), 2);
    }

    #[test]
    fn an_atomic_bulk_applies_all_or_nothing() {
        let (_d, s) = open();
        let rid_of = |id: &str| {
            s.read(false, |c| {
                c.query_row("SELECT rid FROM entries WHERE id = ?1", [id], |r| {
                    r.get::<_, i64>(0)
                })
                .optional()
                .map_err(sql_err)
            })
            .unwrap()
        };
        let va = s
            .create(
                Idx::Entries,
                "a",
                &doc("/a", "/", Some("alpha needle"), &[]),
            )
            .unwrap();
        let stale = Version {
            seq_no: va.seq_no + 100,
            ..va
        };
        let all_failed = |r: Vec<BulkItemResult>| r.iter().all(|r| r.is_err());
        // The second item fails: the first is not applied either.
        let r = s
            .bulk_atomic(vec![
                BulkOp::Create {
                    index: Idx::Entries,
                    id: "b".into(),
                    source: doc("/b", "/", Some("beta"), &[]),
                },
                BulkOp::Delete {
                    index: Idx::Entries,
                    id: "a".into(),
                    if_version: Some(stale),
                },
            ])
            .unwrap()
            .unwrap();
        assert!(matches!(r[1], Err(StoreError::Conflict(_))) && all_failed(r));
        assert!(s.get(Idx::Entries, "b").unwrap().is_none());
        assert!(ids(&s, text("beta")).is_empty());
        // A rename with its inode: the text row moves in place.
        let rid_a = rid_of("a");
        let r = s
            .bulk_atomic(vec![
                BulkOp::Create {
                    index: Idx::Entries,
                    id: "y".into(),
                    source: doc("/y", "/", Some("alpha needle"), &[]),
                },
                BulkOp::Delete {
                    index: Idx::Entries,
                    id: "a".into(),
                    if_version: Some(va),
                },
                BulkOp::Index {
                    index: Idx::Inodes,
                    id: "i1".into(),
                    source: serde_json::json!({"ino": 1, "kind": "file"}),
                    if_version: None,
                },
            ])
            .unwrap()
            .unwrap();
        assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
        assert_eq!(rid_of("y"), rid_a);
        let vy = *r[0].as_ref().unwrap();
        let vi = *r[2].as_ref().unwrap();
        // The in-place move done, then the inode's stale version fails:
        // the move is undone too.
        let r = s
            .bulk_atomic(vec![
                BulkOp::Create {
                    index: Idx::Entries,
                    id: "z".into(),
                    source: doc("/z", "/", Some("alpha needle"), &[]),
                },
                BulkOp::Delete {
                    index: Idx::Entries,
                    id: "y".into(),
                    if_version: Some(vy),
                },
                BulkOp::Index {
                    index: Idx::Inodes,
                    id: "i1".into(),
                    source: serde_json::json!({"ino": 1, "kind": "file", "n": 2}),
                    if_version: Some(va),
                },
            ])
            .unwrap()
            .unwrap();
        assert!(matches!(r[2], Err(StoreError::Conflict(_))) && all_failed(r));
        assert!(s.get(Idx::Entries, "z").unwrap().is_none());
        let y = s.get(Idx::Entries, "y").unwrap().unwrap();
        assert_eq!((y.version, rid_of("y")), (vy, rid_a));
        assert_eq!(s.get(Idx::Inodes, "i1").unwrap().unwrap().version, vi);
        assert_eq!(ids(&s, text("needle")), ["y"]);
        // Versions keep rising after a refusal.
        let v = s
            .create(Idx::Entries, "c", &doc("/c", "/", None, &[]))
            .unwrap();
        assert!(v.seq_no > vi.seq_no);
    }

    #[test]
    fn deleted_texts_are_purged_at_commit_and_never_reach_a_reused_row() {
        let (_d, s) = open();
        let st = side_table(Idx::Entries, field_of(Idx::Entries, "contents").unwrap());
        let count = |s: &EmbeddedStore, sql: &str| -> i64 {
            s.read(false, |c| {
                c.query_row(sql, [], |r| r.get(0)).map_err(sql_err)
            })
            .unwrap()
        };
        let indexed = |s: &EmbeddedStore, t: &str| {
            count(
                s,
                &format!("SELECT count(*) FROM \"{st}\" WHERE \"{st}\" MATCH '\"{t}\"'"),
            )
        };
        let queued = |s: &EmbeddedStore| count(s, &format!("SELECT count(*) FROM \"{st}_dead\""));
        let rid_of = |s: &EmbeddedStore, id: &str| {
            count(s, &format!("SELECT rid FROM entries WHERE id = '{id}'"))
        };
        s.begin_batch();
        for (id, t) in [
            ("a", "alpha one"),
            ("d", "dropped two"),
            ("b", "bravo three"),
        ] {
            s.create(Idx::Entries, id, &doc(&format!("/{id}"), "/", Some(t), &[]))
                .unwrap();
        }
        let rid_d = rid_of(&s, "d");
        s.delete(Idx::Entries, "d", None).unwrap();
        s.delete(Idx::Entries, "b", None).unwrap();
        // Queued, not yet purged: the index still has the rows, searches
        // do not return them.
        assert_eq!(queued(&s), 2);
        assert_eq!((indexed(&s, "dropped"), indexed(&s, "bravo")), (1, 1));
        assert!(ids(&s, text("dropped")).is_empty());
        assert!(ids(&s, text("bravo")).is_empty());
        // A new row takes the lowest free rid above the highest live one,
        // d's: d's old index row goes before the new text is indexed.
        s.create(
            Idx::Entries,
            "c",
            &doc("/c", "/", Some("charlie four"), &[]),
        )
        .unwrap();
        assert_eq!(rid_of(&s, "c"), rid_d, "the test needs a reused rid");
        assert_eq!((queued(&s), indexed(&s, "dropped")), (1, 0));
        assert!(ids(&s, text("dropped")).is_empty());
        assert_eq!(ids(&s, text("charlie")), ["c"]);
        s.end_batch().unwrap();
        // The commit purged the rest.
        assert_eq!((queued(&s), indexed(&s, "bravo")), (0, 0));
        assert_eq!(ids(&s, text("alpha")), ["a"]);
        assert_eq!(ids(&s, text("charlie")), ["c"]);
    }

    #[test]
    fn a_store_that_deleted_index_rows_at_once_queues_them_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let st = side_table(Idx::Entries, field_of(Idx::Entries, "contents").unwrap());
        {
            let s = EmbeddedStore::open(dir.path()).unwrap();
            s.create(Idx::Entries, "a", &doc("/a", "/", Some("old needle"), &[]))
                .unwrap();
            s.sync().unwrap();
            // The trigger of the previous version.
            let c = Connection::open(dir.path().join("meta.sqlite")).unwrap();
            let tt = text_table(&st);
            c.execute_batch(&format!(
                "DROP TRIGGER \"{st}_ad\";
                 CREATE TRIGGER \"{st}_ad\" AFTER DELETE ON entries
                 WHEN EXISTS (SELECT 1 FROM \"{tt}\" WHERE rid = old.rid)
                 BEGIN
                     DELETE FROM \"{st}\" WHERE rowid = old.rid;
                     DELETE FROM \"{tt}\" WHERE rid = old.rid;
                 END;"
            ))
            .unwrap();
        }
        let s = EmbeddedStore::open(dir.path()).unwrap();
        let trigger: String = s
            .read(false, |c| {
                c.query_row(
                    "SELECT sql FROM sqlite_master WHERE name = ?1",
                    [format!("{st}_ad")],
                    |r| r.get(0),
                )
                .map_err(sql_err)
            })
            .unwrap();
        assert!(trigger.contains(&dead_table(&st)), "{trigger}");
        s.delete(Idx::Entries, "a", None).unwrap();
        assert!(ids(&s, text("needle")).is_empty());
    }

    #[test]
    fn texts_of_a_store_from_before_contentless_indexing_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let st = side_table(Idx::Entries, field_of(Idx::Entries, "contents").unwrap());
        {
            let s = EmbeddedStore::open(dir.path()).unwrap();
            s.create(Idx::Entries, "a", &doc("/a", "/", Some("old needle"), &[]))
                .unwrap();
            s.create(Idx::Entries, "b", &doc("/b", "/", Some("other hay"), &[]))
                .unwrap();
            s.sync().unwrap();
        }
        {
            // Back to the earlier layout: an FTS5 table keeping its content.
            let c = Connection::open(dir.path().join("meta.sqlite")).unwrap();
            let tt = text_table(&st);
            c.execute_batch(&format!(
                "DROP TRIGGER \"{st}_ad\"; DROP TABLE \"{st}\";
                 CREATE VIRTUAL TABLE \"{st}\" USING fts5(v, tokenize = 'trigram');
                 INSERT INTO \"{st}\" (rowid, v) SELECT rid, v FROM \"{tt}\";
                 DROP TABLE \"{tt}\";
                 CREATE TRIGGER \"{st}_ad\" AFTER DELETE ON entries
                 BEGIN DELETE FROM \"{st}\" WHERE rowid = old.rid; END;"
            ))
            .unwrap();
        }
        let s = EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(ids(&s, text("NEEDLE")), ["a"]);
        assert_eq!(
            s.get(Idx::Entries, "b").unwrap().unwrap().source["contents"],
            "other hay"
        );
        s.delete(Idx::Entries, "a", None).unwrap();
        s.put(
            Idx::Entries,
            "b",
            &doc("/b", "/", Some("new needle"), &[]),
            None,
        )
        .unwrap();
        assert_eq!(ids(&s, text("needle")), ["b"]);
        assert!(ids(&s, text("hay")).is_empty());
    }
}

#[cfg(test)]
mod redo_tests {
    use super::*;
    use serde_json::json;

    /// A small deterministic generator (no test-only dependency).
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    fn path(r: &mut Rng) -> String {
        let dirs = ["/a", "/a/b", "/a/b/c", "/d", "/d/e", "/f"];
        dirs[r.below(dirs.len() as u64) as usize].to_string()
    }

    fn entry(r: &mut Rng, id: &str) -> Value {
        let dir = path(r);
        json!({
            "parent": r.below(5), "name": id, "path": format!("{dir}/{id}"), "dir": dir,
            "cookie": r.below(1000), "kind": "file", "contents": format!("w{} w{}", r.below(9), r.below(9)),
            "xattrs": [format!("k={}", r.below(3))],
        })
    }

    fn random_op(r: &mut Rng) -> BulkOp {
        let id = format!("e{}", r.below(40));
        match r.below(6) {
            0 | 1 => BulkOp::Create {
                index: Idx::Entries,
                source: entry(r, &id),
                id,
            },
            2 => BulkOp::Index {
                index: Idx::Entries,
                source: entry(r, &id),
                id,
                if_version: None,
            },
            3 => BulkOp::Update {
                index: Idx::Entries,
                id,
                doc: json!({"size": r.below(100), "xattrs": [format!("k={}", r.below(3))]}),
                if_version: None,
            },
            4 => BulkOp::Delete {
                index: Idx::Entries,
                id,
                if_version: None,
            },
            _ => BulkOp::Create {
                index: Idx::Inodes,
                id: format!("i{}", r.below(20)),
                source: json!({"kind": "file", "orphan": r.below(2) == 1}),
            },
        }
    }

    /// Same request on both stores; their outcomes must agree (versions
    /// differ: the two stores number their writes independently).
    fn both(a: &EmbeddedStore, b: &EmbeddedStore, r: &mut Rng, max_seq: &mut u64) {
        let ok = |x: &StoreResult<Version>| x.as_ref().map(|_| ()).map_err(|e| e.to_string());
        match r.below(5) {
            0 => {
                let ops: Vec<BulkOp> = (0..1 + r.below(6)).map(|_| random_op(r)).collect();
                // Some all or nothing: a refused one leaves no trace, in
                // the tables or in the redo log.
                let (x, y) = if r.below(2) == 0 {
                    let x = a.bulk_atomic(ops.clone()).unwrap().expect("offered");
                    let y = b.bulk_atomic(ops).unwrap().expect("offered");
                    if x.iter().any(|r| r.is_err()) {
                        assert!(x.iter().all(|r| r.is_err()), "{x:?}");
                    }
                    (x, y)
                } else {
                    (a.bulk(ops.clone()).unwrap(), b.bulk(ops).unwrap())
                };
                for v in x.iter().flatten() {
                    *max_seq = (*max_seq).max(v.seq_no);
                }
                let x: Vec<_> = x.iter().map(ok).collect();
                let y: Vec<_> = y.iter().map(ok).collect();
                assert_eq!(x, y);
            }
            1 => {
                let (old, new) = (path(r), path(r));
                if !new.starts_with(&format!("{old}/")) && new != old {
                    let x = a.rebase_paths(Idx::Entries, &old, &new).unwrap();
                    assert_eq!(x, b.rebase_paths(Idx::Entries, &old, &new).unwrap());
                }
            }
            _ => {
                let op = random_op(r);
                let x = a.bulk(vec![op.clone()]).unwrap().remove(0);
                let y = b.bulk(vec![op]).unwrap().remove(0);
                if let Ok(v) = &x {
                    *max_seq = (*max_seq).max(v.seq_no);
                }
                assert_eq!(ok(&x), ok(&y));
            }
        }
    }

    fn assert_same(a: &EmbeddedStore, b: &EmbeddedStore) {
        for (idx, ids) in [
            (
                Idx::Entries,
                (0..40).map(|i| format!("e{i}")).collect::<Vec<_>>(),
            ),
            (Idx::Inodes, (0..20).map(|i| format!("i{i}")).collect()),
        ] {
            let src = |s: &EmbeddedStore| -> Vec<Option<Value>> {
                s.mget(idx, &ids)
                    .unwrap()
                    .into_iter()
                    .map(|d| d.map(|d| d.source))
                    .collect()
            };
            assert_eq!(src(a), src(b), "{idx:?} documents differ");
        }
        // The indexed columns and side tables follow the sources.
        for q in [
            Query::tree("path", "/a"),
            Query::term("dir", json!("/d/e")),
            Query::term("xattrs", json!("k=1")),
            Query::Text {
                field: "contents".into(),
                text: "w3 w".into(),
            },
        ] {
            let ids = |s: &EmbeddedStore| {
                let mut v: Vec<String> = s
                    .search(&SearchRequest {
                        index: Idx::Entries,
                        query: q.clone(),
                        sort: vec![],
                        size: 1000,
                        search_after: None,
                    })
                    .unwrap()
                    .into_iter()
                    .map(|h| h.doc.id)
                    .collect();
                v.sort();
                v
            };
            assert_eq!(ids(a), ids(b), "{q:?}");
        }
    }

    /// Writes acknowledged under deferred commits survive a crash at any
    /// point (the redo log replays them on the next open), as do commits,
    /// rebases and bulks; the store then equals one that committed every
    /// write, and seq_nos keep rising.
    #[test]
    fn deferred_commits_lose_nothing_acknowledged_across_crashes() {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, plain_dir) = (tmp.path().join("s"), tmp.path().join("plain"));
        let plain = EmbeddedStore::open(&plain_dir).unwrap();
        let mut r = Rng(7);
        let mut max_seq = 0;
        for round in 0..12 {
            let s = Arc::new(EmbeddedStore::open(&dir).unwrap());
            assert_same(&s, &plain);
            s.defer_commits().unwrap();
            let v = s
                .create(Idx::Meta, &format!("m{round}"), &json!({}))
                .unwrap();
            assert!(
                round == 0 || v.seq_no > max_seq,
                "seq_no {} reused (max {max_seq})",
                v.seq_no
            );
            max_seq = max_seq.max(v.seq_no);
            plain
                .create(Idx::Meta, &format!("m{round}"), &json!({}))
                .unwrap();
            for i in 0..150 {
                // Some requests in batches, as filesystem calls make them.
                let batch = r.below(3) == 0;
                if batch {
                    s.begin_batch();
                }
                both(&s, &plain, &mut r, &mut max_seq);
                if batch {
                    s.end_batch().unwrap();
                }
                if round % 4 == 1 && i == 70 {
                    // A commit in the middle: replay starts after it.
                    s.refresh(Idx::Entries).unwrap();
                }
            }
            assert_same(&s, &plain);
            match round % 3 {
                0 | 1 => s.crash(),
                _ => {} // a clean close commits
            }
            drop(s);
        }
    }
}
