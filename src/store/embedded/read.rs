//! Reads: the pool of reader connections used when the writer is busy, and
//! a document by id (its source parsed, its file text attached).

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;

use parking_lot::{Condvar, Mutex};
use rusqlite::{Connection, OpenFlags};
use serde_json::Value;

use super::encode::attach_text;
use super::tables::{TableSql, configure, has_text};
use super::{MAX_READERS, invalid, sql_err, version};
use crate::store::{Doc, MAX_ID_BYTES, StoreError, StoreResult};

pub(super) struct Readers {
    pub(super) path: PathBuf,
    pub(super) pool: Mutex<Pool>,
    pub(super) freed: Condvar,
}

pub(super) struct Pool {
    pub(super) idle: Vec<Connection>,
    /// Connections in existence (idle or checked out).
    pub(super) open: usize,
}

impl Readers {
    pub(super) fn get(&self) -> StoreResult<Reader<'_>> {
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

    pub(super) fn connect(&self) -> rusqlite::Result<Connection> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        configure(&conn, true)?;
        Ok(conn)
    }
}

/// A checked-out reader connection, returned to the pool on drop.
pub(super) struct Reader<'a> {
    pub(super) readers: &'a Readers,
    pub(super) conn: Option<Connection>,
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

pub(super) fn get_doc(
    conn: &Connection,
    t: &TableSql,
    id: &str,
    brief: bool,
) -> StoreResult<Option<Doc>> {
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
                source: source.into(),
            }))
        }
    }
}

pub(super) fn parse_source(src: &[u8]) -> StoreResult<Value> {
    serde_json::from_slice(src)
        .map_err(|e| StoreError::Other(format!("corrupt document source: {e}")))
}

/// Reads are by id only; an id too long to have been written can't exist
/// (Elasticsearch's GET answers 404 there too).
pub(super) fn check_get_id(id: &str) -> StoreResult<bool> {
    if id.is_empty() {
        return Err(invalid("empty document id"));
    }
    Ok(id.len() <= MAX_ID_BYTES)
}
