//! The embedded store's redo log: what lets a mount commit SQLite once a
//! second instead of once per filesystem call, and still lose nothing it
//! acknowledged when its process dies.
//!
//! A commit writes every page the transaction dirtied to SQLite's WAL (two
//! `pwrite`s per page) and takes and drops the WAL's file locks: ~11 pages
//! and ~30 system calls for one rename, most of the daemon's CPU beyond the
//! FUSE round trip. Deferred, a second's worth of creates in one directory
//! dirties the same few leaf pages over and over and commits them once.
//! Meanwhile each acknowledged call costs one `write(2)` here: the rows it
//! changed, as they are after the change (`Put`: id, seq_no and source;
//! `Delete`: id; `Rebase`: a directory rename's one statement, replayed as
//! such). Like the WAL with `synchronous=NORMAL`, the file survives the
//! death of the process, not of the machine; `sync` commits and checkpoints.
//!
//! Generations make replay exact: the file starts with a header naming its
//! generation G; a commit records "everything up to G is in" (`_seq` row 1)
//! in the same transaction, then empties the file and starts G+1. So the
//! file's records are either all in the database or none of them are, and
//! replay (on the next open) applies them in order to the state they were
//! made on. Each record is one request's writes (a whole bulk, for
//! instance), length-prefixed and CRC-checked: a record torn by the crash
//! was never acknowledged and is dropped with everything after it.
//!
//! The owner holds an `flock` on the file for its lifetime, so another
//! process opening the store (`esfs search`, `esfs fsck`) replays only a
//! dead owner's log, never a live one's.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::store::Idx;

const MAGIC: &[u8; 8] = b"esfsredo";
/// Magic, generation (u64 LE).
pub(super) const HEADER: u64 = 16;
/// Length (u32 LE) and CRC-32 (u32 LE) of each record's payload.
const FRAME: usize = 8;

const PUT: u8 = 1;
/// Written by versions that did not log a delete's seq_no (still read).
const DELETE: u8 = 2;
const REBASE: u8 = 3;
const DELETE_AT: u8 = 4;

/// One logged change, as replay applies it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Op {
    /// `src` as the table stores it (without `Text` fields); `texts`: the
    /// `Text` fields the write set (absent = removed), the others unchanged.
    Put {
        idx: Idx,
        id: String,
        seq: i64,
        src: Vec<u8>,
        texts: Vec<(String, Option<String>)>,
    },
    /// `seq`: the delete's own seq_no (absent in logs of older versions).
    Delete {
        idx: Idx,
        id: String,
        seq: Option<i64>,
    },
    /// [`super::MetaStore::rebase_paths`]: rows get seq_nos `base + 1 ..`.
    Rebase {
        idx: Idx,
        base: i64,
        old: String,
        new: String,
    },
}

/// The log of the store's current generation, owned (flocked) by this
/// process.
pub(super) struct RedoLog {
    path: PathBuf,
    file: File,
    generation: u64,
    /// Complete records not yet written to the file.
    buf: Vec<u8>,
    /// Start in `buf` of the record being built by the current request.
    open: Option<usize>,
    /// Bytes in the file (header included).
    len: u64,
}

/// Try to take the log's lock without waiting: `None` if a live process
/// holds it (or the file cannot be opened: then nobody can have logged).
pub(super) fn try_lock(path: &Path) -> io::Result<Option<File>> {
    let file = crate::private::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(file))
}

/// A locked log file's generation and the records a crash left in it
/// (none when the file is empty or has no valid header).
pub(super) fn read(file: &mut File) -> io::Result<(u64, Vec<Vec<Op>>)> {
    let mut data = Vec::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_end(&mut data)?;
    if data.len() < HEADER as usize || &data[..8] != MAGIC {
        return Ok((0, Vec::new()));
    }
    let generation = u64::from_le_bytes(data[8..16].try_into().expect("8 bytes"));
    let mut records = Vec::new();
    let mut at = HEADER as usize;
    while let Some(frame) = data.get(at..at + FRAME) {
        let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(frame[4..].try_into().expect("4 bytes"));
        let Some(payload) = data.get(at + FRAME..at + FRAME + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        match decode(payload) {
            Some(ops) => records.push(ops),
            None => break,
        }
        at += FRAME + len;
    }
    Ok((generation, records))
}

impl RedoLog {
    /// Start generation `generation` in a file this process has locked
    /// (`try_lock`), discarding what it held.
    pub(super) fn start(path: &Path, file: File, generation: u64) -> io::Result<RedoLog> {
        let mut log = RedoLog {
            path: path.to_path_buf(),
            file,
            generation,
            buf: Vec::with_capacity(64 << 10),
            open: None,
            len: 0,
        };
        log.reset(generation)?;
        Ok(log)
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// Bytes logged since the last commit (written or buffered).
    pub(super) fn size(&self) -> u64 {
        self.len + self.buf.len() as u64
    }

    /// The log now starts generation `generation`: empty but for its header.
    pub(super) fn reset(&mut self, generation: u64) -> io::Result<()> {
        self.buf.clear();
        self.open = None;
        self.file.set_len(0)?;
        let mut h = Vec::with_capacity(HEADER as usize);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&generation.to_le_bytes());
        write_all_at(&self.file, &h, 0)?;
        self.generation = generation;
        self.len = HEADER;
        Ok(())
    }

    /// A request starts: its changes form one record.
    pub(super) fn begin(&mut self) {
        debug_assert!(self.open.is_none());
        self.open = Some(self.buf.len());
        self.buf.extend_from_slice(&[0; FRAME]);
    }

    /// The request succeeded: its record is complete (dropped if empty).
    pub(super) fn end(&mut self) {
        let Some(start) = self.open.take() else {
            return;
        };
        let payload = &self.buf[start + FRAME..];
        if payload.is_empty() {
            self.buf.truncate(start);
            return;
        }
        let len = (payload.len() as u32).to_le_bytes();
        let crc = crc32fast::hash(payload).to_le_bytes();
        self.buf[start..start + 4].copy_from_slice(&len);
        self.buf[start + 4..start + FRAME].copy_from_slice(&crc);
    }

    /// The request failed (SQLite undid it): forget its changes.
    pub(super) fn abort(&mut self) {
        if let Some(start) = self.open.take() {
            self.buf.truncate(start);
        }
    }

    pub(super) fn put(
        &mut self,
        idx: Idx,
        id: &str,
        seq: i64,
        src: &[u8],
        texts: &[(&str, Option<&str>)],
    ) {
        debug_assert!(self.open.is_some());
        self.buf.push(PUT);
        self.buf.push(idx as u8);
        push_bytes(&mut self.buf, id.as_bytes());
        self.buf.extend_from_slice(&seq.to_le_bytes());
        push_bytes(&mut self.buf, src);
        self.buf.push(texts.len() as u8);
        for (name, text) in texts {
            push_bytes(&mut self.buf, name.as_bytes());
            self.buf.push(text.is_some() as u8);
            push_bytes(&mut self.buf, text.unwrap_or("").as_bytes());
        }
    }

    pub(super) fn delete(&mut self, idx: Idx, id: &str, seq: i64) {
        debug_assert!(self.open.is_some());
        self.buf.push(DELETE_AT);
        self.buf.push(idx as u8);
        push_bytes(&mut self.buf, id.as_bytes());
        self.buf.extend_from_slice(&seq.to_le_bytes());
    }

    pub(super) fn rebase(&mut self, idx: Idx, base: i64, old: &str, new: &str) {
        debug_assert!(self.open.is_some());
        self.buf.push(REBASE);
        self.buf.push(idx as u8);
        self.buf.extend_from_slice(&base.to_le_bytes());
        push_bytes(&mut self.buf, old.as_bytes());
        push_bytes(&mut self.buf, new.as_bytes());
    }

    /// Write the complete records to the file (one `write(2)`): from now on
    /// they survive this process.
    pub(super) fn flush(&mut self) -> io::Result<()> {
        debug_assert!(self.open.is_none());
        if self.buf.is_empty() {
            return Ok(());
        }
        if let Err(e) = write_all_at(&self.file, &self.buf, self.len) {
            // Whatever part landed is ignored by replay (bad CRC or short),
            // and the next flush overwrites it.
            return Err(io::Error::new(
                e.kind(),
                format!("{}: {e}", self.path.display()),
            ));
        }
        self.len += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// The records in the file (after a `flush`, all complete ones).
    pub(super) fn read_back(&mut self) -> io::Result<(u64, Vec<Vec<Op>>)> {
        read(&mut self.file)
    }

    #[cfg(test)]
    pub(crate) fn file_mut(&mut self) -> &mut File {
        &mut self.file
    }
}

fn write_all_at(f: &File, mut data: &[u8], mut at: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    while !data.is_empty() {
        let n = f.write_at(data, at)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        data = &data[n..];
        at += n as u64;
    }
    Ok(())
}

fn push_bytes(buf: &mut Vec<u8>, b: &[u8]) {
    buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
    buf.extend_from_slice(b);
}

fn decode(mut p: &[u8]) -> Option<Vec<Op>> {
    fn take<'a>(p: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (a, b) = (p.get(..n)?, p.get(n..)?);
        *p = b;
        Some(a)
    }
    fn bytes<'a>(p: &mut &'a [u8]) -> Option<&'a [u8]> {
        let n = u32::from_le_bytes(take(p, 4)?.try_into().ok()?) as usize;
        take(p, n)
    }
    fn string(p: &mut &[u8]) -> Option<String> {
        String::from_utf8(bytes(p)?.to_vec()).ok()
    }
    fn int(p: &mut &[u8]) -> Option<i64> {
        Some(i64::from_le_bytes(take(p, 8)?.try_into().ok()?))
    }
    let mut ops = Vec::new();
    while let Some((&tag, rest)) = p.split_first() {
        p = rest;
        let i = *take(&mut p, 1)?.first()?;
        let idx = *Idx::ALL.iter().find(|x| **x as u8 == i)?;
        ops.push(match tag {
            PUT => Op::Put {
                idx,
                id: string(&mut p)?,
                seq: int(&mut p)?,
                src: bytes(&mut p)?.to_vec(),
                texts: {
                    let n = *take(&mut p, 1)?.first()?;
                    (0..n)
                        .map(|_| {
                            let name = string(&mut p)?;
                            let has = *take(&mut p, 1)?.first()? == 1;
                            let text = string(&mut p)?;
                            Some((name, has.then_some(text)))
                        })
                        .collect::<Option<Vec<_>>>()?
                },
            },
            DELETE => Op::Delete {
                idx,
                id: string(&mut p)?,
                seq: None,
            },
            DELETE_AT => Op::Delete {
                idx,
                id: string(&mut p)?,
                seq: Some(int(&mut p)?),
            },
            REBASE => Op::Rebase {
                idx,
                base: int(&mut p)?,
                old: string(&mut p)?,
                new: string(&mut p)?,
            },
            _ => return None,
        });
    }
    Some(ops)
}

impl Drop for RedoLog {
    fn drop(&mut self) {
        let _ = self.file.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("redo");
        let f = try_lock(&path).unwrap().unwrap();
        // A second lock on the same file (another open file description)
        // is refused while the first is held.
        assert!(try_lock(&path).unwrap().is_none());
        let mut log = RedoLog::start(&path, f, 7).unwrap();
        log.begin();
        log.put(
            Idx::Inodes,
            "5",
            42,
            b"{\"a\":1}",
            &[("t", Some("x y")), ("u", None)],
        );
        log.delete(Idx::Entries, "1/x", 43);
        log.end();
        log.begin();
        log.end(); // empty: no record
        log.begin();
        log.put(Idx::Inodes, "6", 43, b"{}", &[]);
        log.abort();
        log.begin();
        log.rebase(Idx::Inodes, 99, "/a", "/b");
        log.end();
        log.flush().unwrap();
        let (g, recs) = read(log.file_mut()).unwrap();
        assert_eq!(g, 7);
        assert_eq!(
            recs,
            vec![
                vec![
                    Op::Put {
                        idx: Idx::Inodes,
                        id: "5".into(),
                        seq: 42,
                        src: b"{\"a\":1}".to_vec(),
                        texts: vec![("t".into(), Some("x y".into())), ("u".into(), None)]
                    },
                    Op::Delete {
                        idx: Idx::Entries,
                        id: "1/x".into(),
                        seq: Some(43)
                    }
                ],
                vec![Op::Rebase {
                    idx: Idx::Inodes,
                    base: 99,
                    old: "/a".into(),
                    new: "/b".into()
                }]
            ]
        );
        // Tear the last record: only the first survives.
        let len = log.file_mut().metadata().unwrap().len();
        log.file_mut().set_len(len - 3).unwrap();
        assert_eq!(read(log.file_mut()).unwrap().1.len(), 1);
        // Corrupt the first: nothing survives.
        write_all_at(log.file_mut(), b"X", HEADER + FRAME as u64 + 2).unwrap();
        assert_eq!(read(log.file_mut()).unwrap().1.len(), 0);
        log.reset(8).unwrap();
        assert_eq!(read(log.file_mut()).unwrap(), (8, vec![]));
        assert_eq!(log.size(), HEADER, "a reset log holds its header alone");
    }
}
