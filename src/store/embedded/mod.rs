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
//! Batches ([`MetaStore::begin_batch`], a handle whose writes are one
//! batch): the writes of one filesystem call share one SQLite transaction,
//! committed when the call ends (a commit writes every page it dirtied to
//! the WAL, so several commits per call were most of the cost of a create).
//! Writes through any other handle commit at once.
//! Concurrent batches share the open transaction; whichever ends first
//! commits the others' writes so far too, which is what committing each
//! write at once did before.
//!
//! Deferred commits ([`EmbeddedStore::defer_commits`], a mount that owns
//! its store): the transaction stays open for up to a second and each
//! acknowledged call is instead one append to the redo log ([`redo`]),
//! replayed after a crash.
//!
//! Layout: this file holds the store, its connections and transaction
//! (batches, commits, the committer thread, the redo log's recovery) and the
//! [`MetaStore`] implementation; `tables` the database's layout, `encode`
//! documents to rows, `write` the writes, `read` the reader pool and gets,
//! `query` the query compiler and searches, `redo` the redo log.

mod encode;
mod query;
mod read;
mod redo;
mod setup;
mod tables;
mod write;

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rusqlite::{Connection, ErrorCode};
use serde_json::Value;

use crate::store::schema::Field;
use crate::store::{
    Bucket, BulkItemResult, BulkOp, Doc, GroupRequest, Hit, Idx, MAX_ID_BYTES, MetaStore, Query,
    Rebased, SearchRequest, StoreError, StoreResult, Version,
};
use encode::json_of;
use read::{Pool, Readers, check_get_id, get_doc};
use redo::RedoLog;
use setup::init_schema;
use tables::{TableSql, columnar, configure, has_text, purge_dead_text};
use write::{SeqState, Write, Writer, apply, bulk_tx, rebase_tx, replay};

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
    /// A batch's handle ([`MetaStore::begin_batch`]): its writes wait for
    /// `end_batch`; the store's aborts when it began.
    batch: Option<u64>,
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
    /// A handle whose writes are one batch (see [`MetaStore::begin_batch`]);
    /// None on a batch's handle (batches do not nest).
    pub fn batch_handle(&self) -> Option<EmbeddedStore> {
        self.batch.is_none().then(|| EmbeddedStore {
            core: self.core.clone(),
            committer: Mutex::new(None),
            batch: Some(self.aborts.load(Ordering::Acquire)),
        })
    }

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
            batch: None,
        })
    }

    /// This process owns the store (a mount, under its lock): from now on a
    /// write is acknowledged once it is in the redo log, and the transaction
    /// is committed when writes pause, after a second, or on `sync`/`refresh`
    /// (see [`redo`]). Other processes then read state up to a second old.
    pub fn defer_commits(&self) -> StoreResult<()> {
        self.core.start_redo()?;
        self.core.claimed.store(true, Ordering::Release);
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
    /// Claimed by a mount ([`EmbeddedStore::defer_commits`], under its lock).
    claimed: AtomicBool,
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
            claimed: AtomicBool::new(false),
            aborts: AtomicU64::new(0),
            open_tx: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
        };
        store.recover_redo()?;
        Ok(store)
    }

    /// Runs one write request inside the open transaction (starting one);
    /// acknowledges at once unless `batched` (a batch's handle wrote it).
    fn write<T>(
        &self,
        batched: bool,
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
        if !batched {
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

    /// Runs `f` on a connection that sees every acknowledged write and every
    /// batch's so far: the writer's if free (or holding uncommitted writes),
    /// else a pooled reader. With `snapshot`, all of `f` reads one
    /// consistent state.
    fn read<T>(
        &self,
        snapshot: bool,
        f: impl FnOnce(&Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        // A pooled reader sees only committed data: fine when the writer is
        // merely busy with a statement, not when it holds uncommitted writes
        // (a batch in progress), which every read must see.
        let w = if self.open_tx.load(Ordering::Acquire) {
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

    fn write_one(&self, batched: bool, idx: Idx, id: &str, op: Write<'_>) -> StoreResult<Version> {
        let t = self.table(idx);
        self.write(batched, |conn, seq| {
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

impl MetaStore for EmbeddedStore {
    fn capabilities(&self) -> crate::store::Capabilities {
        crate::store::Capabilities {
            // Claimed by a mount (`defer_commits`, under its lock).
            single_writer: self.claimed.load(Ordering::Acquire),
            atomic_bulk: true,
            rebase_paths: true,
            batches: true,
            realtime_search: true,
        }
    }

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
        self.core
            .write_one(self.batch.is_some(), index, id, Write::Create(source))
    }

    fn put(
        &self,
        index: Idx,
        id: &str,
        source: &Value,
        if_version: Option<Version>,
    ) -> StoreResult<Version> {
        self.core.write_one(
            self.batch.is_some(),
            index,
            id,
            Write::Put(source, if_version),
        )
    }

    fn delete(&self, index: Idx, id: &str, if_version: Option<Version>) -> StoreResult<bool> {
        match self
            .core
            .write_one(self.batch.is_some(), index, id, Write::Delete(if_version))
        {
            Ok(_) => Ok(true),
            Err(StoreError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn bulk(&self, ops: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        self.core.write(self.batch.is_some(), |conn, seq| {
            bulk_tx(conn, seq, &self.tables, &ops, None).inspect_err(|_| {
                // The reservation may have been rolled back: re-reserve next time.
                seq.reserved = seq.next;
            })
        })
    }

    fn bulk_atomic(&self, ops: Vec<BulkOp>) -> StoreResult<Option<Vec<BulkItemResult>>> {
        let mut refused = None;
        let r = self.core.write(self.batch.is_some(), |conn, seq| {
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
    fn rebase_paths(&self, index: Idx, old: &str, new: &str) -> StoreResult<Option<Rebased>> {
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
        self.core
            .write(self.batch.is_some(), |conn, seq| {
                rebase_tx(conn, seq, index, old, new).inspect_err(|_| {
                    // The reservation may have been rolled back: re-reserve next time.
                    seq.reserved = seq.next;
                })
            })
            .map(|count| Some(Rebased { count, ids: None }))
    }

    fn begin_batch(&self) -> Option<Arc<dyn MetaStore>> {
        self.batch_handle()
            .map(|b| Arc::new(b) as Arc<dyn MetaStore>)
    }

    fn end_batch(&self) -> StoreResult<()> {
        let Some(aborts_at_begin) = self.batch else {
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
}

#[cfg(test)]
mod redo_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod text_tests;
