//! The op log of a delegated mount: what it acknowledged and the cluster
//! does not hold yet, one file per mount in its state directory.
//!
//! Each write call a delegated mount acknowledges appends one record (one
//! `write(2)`): the documents it changed, each with its new state (a source,
//! or gone) and the version in the cluster that state replaces. A flush
//! starts a new generation (a new file), and once the flush is acknowledged
//! the older generations are deleted, so the files hold exactly what the
//! cluster may lack. Like the embedded store's journal it survives the
//! death of the process, not of the machine: `fsync(2)` is what survives a
//! power cut, and it flushes to the cluster.
//!
//! Framing: `len u32 LE, crc32 u32 LE, JSON`; a torn last record (the
//! process died inside its `write`) ends the file, as it was never
//! acknowledged.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};

use crate::store::{BulkOp, Idx, Version};

/// What the cluster holds of a document, as far as the mount knows: what a
/// flush's write is conditional on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Base {
    /// Not in the cluster: the flush creates it.
    Absent,
    /// This version is in the cluster.
    At(Version),
    /// Unknown (an unconditional write): the flush overwrites.
    Unknown,
}

/// One document's new state, as logged; or (`sent`) what the cluster
/// holds of it after a flush of it was acknowledged.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Record {
    pub index: Idx,
    pub id: String,
    /// `None`: deleted (ignored in a `sent` record).
    pub state: Option<Value>,
    pub base: Base,
    /// The state leaves out the text fields, which stay as the cluster
    /// holds them at `base` (see `Overlay`'s brief slots): written as a
    /// partial update.
    pub brief: bool,
    /// A flush's acknowledgement: records written while that flush was in
    /// flight carry the base from before it, and this one, after them,
    /// corrects it for the replay.
    pub sent: bool,
    /// The state is only the fields that changed (a directory rename's
    /// `path` and `dir`), over the document's previous state in the log,
    /// or over what the cluster holds at `base` if the log has none.
    pub patch: bool,
}

impl Record {
    /// A document's new state (`None`: deleted) over what the cluster holds.
    pub(crate) fn change(index: Idx, id: &str, state: Option<Value>, base: Base) -> Record {
        Record {
            index,
            id: id.to_string(),
            state,
            base,
            brief: false,
            sent: false,
            patch: false,
        }
    }

    /// [`Record::change`] of a state without its text fields.
    pub(crate) fn brief(self, brief: bool) -> Record {
        Record { brief, ..self }
    }
}

/// One mount's log files: `<owner>.<generation>.log` in `dir`.
pub(crate) struct OpLog {
    dir: PathBuf,
    owner: String,
    generation: u64,
    file: File,
}

impl OpLog {
    /// A new log for `owner` (a mount's session id) in `dir`.
    pub(crate) fn create(dir: &Path, owner: &str) -> io::Result<OpLog> {
        crate::private::dir_all(dir)?;
        let file = Self::open_generation(dir, owner, 1)?;
        Ok(OpLog {
            dir: dir.to_path_buf(),
            owner: owner.to_string(),
            generation: 1,
            file,
        })
    }

    fn path_of(dir: &Path, owner: &str, generation: u64) -> PathBuf {
        dir.join(format!("{owner}.{generation}.log"))
    }

    fn open_generation(dir: &Path, owner: &str, generation: u64) -> io::Result<File> {
        crate::private::options()
            .create(true)
            .append(true)
            .open(Self::path_of(dir, owner, generation))
    }

    /// Append one acknowledged call's documents, in one `write(2)`; returns
    /// the bytes written.
    pub(crate) fn append(&mut self, records: &[Record]) -> io::Result<usize> {
        let encoded: Vec<Encoded> = records.iter().map(Encoded::of).collect();
        self.append_encoded(&encoded)
    }

    /// [`OpLog::append`] of records borrowed from where they live.
    pub(crate) fn append_encoded(&mut self, records: &[Encoded]) -> io::Result<usize> {
        if records.is_empty() {
            return Ok(0);
        }
        let body = serde_json::to_vec(records)?;
        let mut frame = Vec::with_capacity(body.len() + 8);
        frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        frame.extend_from_slice(&body);
        self.file.write_all(&frame)?;
        Ok(frame.len())
    }

    /// Start a new generation (a flush begins); returns the last one of
    /// what the flush covers.
    pub(crate) fn rotate(&mut self) -> io::Result<u64> {
        let old = self.generation;
        self.file = Self::open_generation(&self.dir, &self.owner, old + 1)?;
        self.generation = old + 1;
        Ok(old)
    }

    /// The flush covering generations up to `generation` was acknowledged.
    pub(crate) fn forget_through(&self, generation: u64) {
        for (g, path) in generations(&self.dir, &self.owner) {
            if g <= generation {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// The mount ends with everything flushed.
    pub(crate) fn remove(self) {
        self.forget_through(u64::MAX);
    }
}

/// The write that makes the cluster hold `state` (`None`: gone) where it
/// holds `base`; `None` when there is nothing to do (made and removed
/// before it was ever sent). A `brief` state (without its text fields) is
/// a partial update: the cluster keeps the text it holds at `base`.
pub(crate) fn write_op(
    index: Idx,
    id: &str,
    state: Option<&Value>,
    base: Base,
    brief: bool,
) -> Option<BulkOp> {
    let id = id.to_string();
    Some(match (state, base) {
        (Some(s), Base::At(v)) if brief => BulkOp::Update {
            index,
            id,
            doc: s.clone(),
            if_version: Some(v),
        },
        (Some(s), Base::Absent) => BulkOp::Create {
            index,
            id,
            source: s.clone(),
        },
        (Some(s), Base::At(v)) => BulkOp::Index {
            index,
            id,
            source: s.clone(),
            if_version: Some(v),
        },
        (Some(s), Base::Unknown) => BulkOp::Index {
            index,
            id,
            source: s.clone(),
            if_version: None,
        },
        (None, Base::Absent) => return None,
        (None, Base::At(v)) => BulkOp::Delete {
            index,
            id,
            if_version: Some(v),
        },
        (None, Base::Unknown) => BulkOp::Delete {
            index,
            id,
            if_version: None,
        },
    })
}

/// The owners with log files in `dir`.
pub(crate) fn owners(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stem = name.strip_suffix(".log")?;
            let (owner, g) = stem.rsplit_once('.')?;
            g.parse::<u64>().ok().map(|_| owner.to_string())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `owner`'s log files in `dir`, oldest generation first.
pub(crate) fn generations(dir: &Path, owner: &str) -> Vec<(u64, PathBuf)> {
    let prefix = format!("{owner}.");
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let g = name.strip_prefix(&prefix)?.strip_suffix(".log")?;
            Some((g.parse().ok()?, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// Every record of `owner`'s log in `dir`, in order (each generation up to
/// its first torn or corrupt record).
pub(crate) fn read(dir: &Path, owner: &str) -> io::Result<Vec<Record>> {
    let mut out = Vec::new();
    for (_, path) in generations(dir, owner) {
        let mut bytes = Vec::new();
        File::open(&path)?.read_to_end(&mut bytes)?;
        let mut at = 0;
        while at + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap());
            let Some(body) = bytes.get(at + 8..at + 8 + len) else {
                break;
            };
            if crc32fast::hash(body) != crc {
                log::warn!("{}: a corrupt record ends the log", path.display());
                break;
            }
            let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(body) else {
                break;
            };
            out.extend(items.iter().filter_map(decode));
            at += 8 + len;
        }
    }
    Ok(out)
}

/// A record as logged, borrowing its state: a directory rename logs every
/// document it moves, and a copy of each source per record would cost more
/// than the rename's decision itself.
#[derive(Serialize)]
pub(crate) struct Encoded<'a> {
    i: &'static str,
    d: &'a str,
    /// Absent in a `sent` record; `null`: deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<State<'a>>,
    b: Value,
    /// The state leaves the text to the cluster ([`Record::brief`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    t: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    sent: bool,
    /// The state is a patch ([`Record::patch`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    p: bool,
}

/// A logged state: a document (`null`: deleted), or a rename's new paths.
#[derive(Serialize)]
#[serde(untagged)]
enum State<'a> {
    Doc(Option<&'a Value>),
    Paths { path: &'a str, dir: &'a str },
}

impl<'a> Encoded<'a> {
    fn of(r: &'a Record) -> Encoded<'a> {
        if r.sent {
            Encoded {
                s: None,
                sent: true,
                ..Encoded::change(r.index, &r.id, None, r.base)
            }
        } else {
            Encoded {
                t: r.brief,
                p: r.patch,
                ..Encoded::change(r.index, &r.id, r.state.as_ref(), r.base)
            }
        }
    }

    /// [`Record::change`], borrowed.
    pub(crate) fn change(index: Idx, id: &'a str, state: Option<&'a Value>, base: Base) -> Self {
        Encoded {
            i: index.name(),
            d: id,
            s: Some(State::Doc(state)),
            b: match base {
                Base::Absent => json!("absent"),
                Base::At(v) => json!([v.seq_no, v.primary_term]),
                Base::Unknown => Value::Null,
            },
            t: false,
            sent: false,
            p: false,
        }
    }

    /// The patch of an entry a directory rename moved: its new `path` and
    /// `dir` ([`Record::patch`]).
    pub(crate) fn paths(index: Idx, id: &'a str, path: &'a str, dir: &'a str, base: Base) -> Self {
        Encoded {
            s: Some(State::Paths { path, dir }),
            p: true,
            ..Encoded::change(index, id, None, base)
        }
    }
}

fn decode(v: &Value) -> Option<Record> {
    let index = Idx::ALL.into_iter().find(|i| v["i"] == i.name())?;
    let base = match &v["b"] {
        Value::Null => Base::Unknown,
        Value::String(s) if s == "absent" => Base::Absent,
        Value::Array(a) => Base::At(Version {
            seq_no: a.first()?.as_u64()?,
            primary_term: a.get(1)?.as_u64()?,
        }),
        _ => return None,
    };
    Some(Record {
        index,
        id: v["d"].as_str()?.to_string(),
        state: (!v["s"].is_null()).then(|| v["s"].clone()),
        base,
        brief: v["t"] == true,
        sent: v["sent"] == true,
        patch: v["p"] == true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, state: Option<Value>, base: Base) -> Record {
        Record::change(Idx::Entries, id, state, base)
    }

    #[test]
    fn records_survive_and_a_torn_tail_is_dropped() {
        let dir = std::env::temp_dir().join(format!("esfs-oplog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut log = OpLog::create(&dir, "m1").unwrap();
        let v = Version {
            seq_no: 7,
            primary_term: 2,
        };
        log.append(&[rec("1/a", Some(json!({"x": 1})), Base::Absent)])
            .unwrap();
        let g = log.rotate().unwrap();
        let ack = Record {
            sent: true,
            ..rec("1/a", None, Base::At(v))
        };
        log.append(&[
            rec("1/b", None, Base::At(v)),
            rec("1/c", Some(json!({})), Base::Unknown),
            ack.clone(),
        ])
        .unwrap();
        // A record cut short by a crash inside its write.
        let path = OpLog::path_of(&dir, "m1", 2);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(&[9, 0, 0, 0, 1, 2]).unwrap();
        let got = read(&dir, "m1").unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], rec("1/a", Some(json!({"x": 1})), Base::Absent));
        assert_eq!(got[1], rec("1/b", None, Base::At(v)));
        assert_eq!(got[2].base, Base::Unknown);
        assert_eq!(got[2].state, Some(json!({})));
        assert_eq!(got[3], ack);
        assert_eq!(owners(&dir), vec!["m1".to_string()]);
        log.forget_through(g);
        assert_eq!(read(&dir, "m1").unwrap().len(), 3);
        log.remove();
        assert!(owners(&dir).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_brief_record_reads_back_brief() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = OpLog::create(dir.path(), "m2").unwrap();
        let v = Version {
            seq_no: 3,
            primary_term: 1,
        };
        let brief = rec("1/a", Some(json!({"path": "/a"})), Base::At(v)).brief(true);
        log.append(&[brief.clone(), rec("1/b", None, Base::At(v))])
            .unwrap();
        let got = read(dir.path(), "m2").unwrap();
        assert_eq!(got, vec![brief, rec("1/b", None, Base::At(v))]);
        assert!(!got[1].brief);
    }

    #[test]
    fn a_path_patch_reads_back_as_a_patch() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = OpLog::create(dir.path(), "m3").unwrap();
        let v = Version {
            seq_no: 4,
            primary_term: 1,
        };
        log.append_encoded(&[Encoded::paths(
            Idx::Entries,
            "2/a",
            "/e/a",
            "/e",
            Base::At(v),
        )])
        .unwrap();
        let got = read(dir.path(), "m3").unwrap();
        let want = Record {
            patch: true,
            ..rec(
                "2/a",
                Some(json!({"path": "/e/a", "dir": "/e"})),
                Base::At(v),
            )
        };
        assert_eq!(got, vec![want]);
    }
}
