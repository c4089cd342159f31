//! Small contents as rows of one SQLite database in the data directory.
//!
//! Making a file is the dearest thing a local filesystem does for a small
//! file: here ext4 spends ~600 us of kernel CPU per create, against tens of
//! microseconds for a row. So a content starts as a row (`small(key, data, mtime)`) and
//! becomes a file of its own only when it grows past [`INLINE_MAX`], like
//! Haystack/SeaweedFS pack small blobs into volumes and ext4 keeps tiny
//! files inline.
//!
//! The rule that keeps the two tiers consistent: while a key has a row, the
//! row is its content, whatever file may exist under that key (a promotion
//! writes the file, then deletes the row in the same transaction that read
//! it; a crash in between leaves a stale file that the next promotion
//! overwrites). Every change is a transaction of its own in WAL mode, so it
//! is in the WAL before the write(2) returns (it survives a killed process,
//! as the files' page cache does) and `sync` fsyncs the WAL. Transactions
//! are IMMEDIATE: mounts sharing a data directory serialize their
//! read-modify-writes.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Contents up to this size stay rows.
pub(super) const INLINE_MAX: u64 = 64 << 10;

const DB: &str = "small.db";

pub(super) struct SmallFiles {
    conn: Connection,
    wal: PathBuf,
}

fn io_err(e: rusqlite::Error) -> io::Error {
    io::Error::other(e)
}

/// A row's bytes as the result of writing `data` at `off` (a gap before it
/// reads as zeros).
pub(super) fn splice(blob: &mut Vec<u8>, off: u64, data: &[u8]) {
    let (off, end) = (off as usize, off as usize + data.len());
    if blob.len() < end {
        blob.resize(end, 0);
    }
    blob[off..end].copy_from_slice(data);
}

/// What a read at `off` gets from a row: the bytes copied into `buf`.
pub(super) fn read_from(blob: &[u8], off: u64, buf: &mut [u8]) -> usize {
    let Some(rest) = blob.get(off as usize..) else {
        return 0;
    };
    let n = rest.len().min(buf.len());
    buf[..n].copy_from_slice(&rest[..n]);
    n
}

/// A transaction over the rows; `commit` makes its changes one WAL commit.
pub(super) struct Tx<'c>(rusqlite::Transaction<'c>);

impl SmallFiles {
    pub(super) fn open(root: &Path) -> io::Result<SmallFiles> {
        let path = root.join(DB);
        crate::private::touch(&path)?;
        let conn = Connection::open(&path).map_err(io_err)?;
        conn.busy_timeout(Duration::from_secs(30)).map_err(io_err)?;
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .map_err(io_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(io::Error::other(format!(
                "{}: SQLite refused WAL mode ({mode})",
                path.display()
            )));
        }
        // NORMAL in WAL mode: a commit is written, not fsynced; checkpoints
        // fsync. `sync` fsyncs the WAL for the files that ask.
        conn.execute_batch(
            "PRAGMA synchronous = NORMAL;
             CREATE TABLE IF NOT EXISTS small (
                 key TEXT PRIMARY KEY, data BLOB NOT NULL, mtime INTEGER NOT NULL);",
        )
        .map_err(io_err)?;
        let mut wal = path.into_os_string();
        wal.push("-wal");
        Ok(SmallFiles {
            conn,
            wal: wal.into(),
        })
    }

    /// Whether the database in `root` holds any row, read without creating
    /// or changing anything (no database, or no table: false). A non-empty
    /// write-ahead log counts as rows: it is not read (that would make its
    /// shared-memory file), the database file alone is, as immutable.
    pub(super) fn has_rows(root: &Path) -> io::Result<bool> {
        let path = root.join(DB);
        if !path.exists() {
            return Ok(false);
        }
        let wal = root.join(format!("{DB}-wal"));
        if std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0) {
            return Ok(true);
        }
        let shown = path.to_string_lossy();
        if shown.contains(['?', '#', '%']) {
            return Ok(true); // not expressible as a plain URI: assume rows
        }
        let uri = format!("file:{shown}?immutable=1");
        let conn = Connection::open_with_flags(
            &uri,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(io_err)?;
        let table: bool = conn
            .query_row(
                "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'small')",
                [],
                |r| r.get(0),
            )
            .map_err(io_err)?;
        if !table {
            return Ok(false);
        }
        conn.query_row("SELECT EXISTS(SELECT 1 FROM small)", [], |r| r.get(0))
            .map_err(io_err)
    }

    pub(super) fn begin(&mut self) -> io::Result<Tx<'_>> {
        self.conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map(Tx)
            .map_err(io_err)
    }

    /// A row's bytes and mtime, outside any transaction (one SELECT is
    /// atomic on its own).
    pub(super) fn get(&self, key: &str) -> io::Result<Option<(Vec<u8>, i64)>> {
        get(&self.conn, key)
    }

    /// Returns whether `key` has a row.
    pub(super) fn set_mtime(&self, key: &str, ns: i64) -> io::Result<bool> {
        let n = self
            .conn
            .prepare_cached("UPDATE small SET mtime = ?2 WHERE key = ?1")
            .and_then(|mut st| st.execute(params![key, ns]))
            .map_err(io_err)?;
        Ok(n > 0)
    }

    pub(super) fn remove(&self, key: &str) -> io::Result<()> {
        delete(&self.conn, key)
    }

    pub(super) fn keys(&self) -> io::Result<Vec<String>> {
        let mut st = self.conn.prepare("SELECT key FROM small").map_err(io_err)?;
        let rows = st.query_map([], |r| r.get(0)).map_err(io_err)?;
        rows.collect::<Result<_, _>>().map_err(io_err)
    }

    /// Every committed row durable against power loss: commits are in the
    /// WAL (checkpoints fsync the database before they reuse it).
    pub(super) fn sync(&self) -> io::Result<()> {
        match std::fs::File::open(&self.wal) {
            Ok(f) => f.sync_data(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn get(c: &Connection, key: &str) -> io::Result<Option<(Vec<u8>, i64)>> {
    c.prepare_cached("SELECT data, mtime FROM small WHERE key = ?1")
        .and_then(|mut st| {
            st.query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(io_err)
}

fn delete(c: &Connection, key: &str) -> io::Result<()> {
    c.prepare_cached("DELETE FROM small WHERE key = ?1")
        .and_then(|mut st| st.execute([key]))
        .map_err(io_err)?;
    Ok(())
}

impl Tx<'_> {
    pub(super) fn get(&self, key: &str) -> io::Result<Option<(Vec<u8>, i64)>> {
        get(&self.0, key)
    }

    pub(super) fn put(&self, key: &str, data: &[u8], mtime: i64) -> io::Result<()> {
        self.0
            .prepare_cached("INSERT OR REPLACE INTO small (key, data, mtime) VALUES (?1, ?2, ?3)")
            .and_then(|mut st| st.execute(params![key, data, mtime]))
            .map_err(io_err)?;
        Ok(())
    }

    pub(super) fn delete(&self, key: &str) -> io::Result<()> {
        delete(&self.0, key)
    }

    pub(super) fn commit(self) -> io::Result<()> {
        self.0.commit().map_err(io_err)
    }
}
