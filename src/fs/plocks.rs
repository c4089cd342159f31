//! Advisory file locks (fcntl byte ranges, and flock as whole-file ranges)
//! that hold across every mount of the store: the document locks of
//! Elasticsearch: The Definitive Guide, chapter "Handling Relationships"
//! ("Document Locking") with an owner id. One document per locked inode, `plock/<ino>`, lists the
//! held ranges with their owner (mount session + the kernel's lock owner);
//! changes are write-if-version. Ranges of dead mounts are ignored and
//! dropped, so a crashed mount never leaves a file locked.

use crate::error::{FsError, FsResult};
use crate::locks::LockManager;
use crate::locks::manager::now_ms;
use crate::store::{Idx, MetaStore, StoreError, Version};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Range {
    /// Mount session holding it.
    pub mount: String,
    /// The kernel's lock owner (per process for fcntl, per open file for flock).
    pub owner: u64,
    pub pid: u32,
    pub start: u64,
    /// Inclusive end (u64::MAX: to the end of the file).
    pub end: u64,
    /// F_RDLCK or F_WRLCK.
    pub typ: i32,
}

/// How long F_SETLKW polls before answering EAGAIN (a FUSE thread cannot
/// wait forever; see docs/consistency.md, "Advisory locks").
const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn overlaps(a: &Range, start: u64, end: u64) -> bool {
    a.start <= end && start <= a.end
}

pub(super) struct Plocks {
    store: Arc<dyn MetaStore>,
    /// Whose ranges are alive; this mount's owner id.
    lm: Arc<LockManager>,
    /// Inodes on which this mount holds advisory locks.
    held: Mutex<HashSet<u64>>,
}

impl Plocks {
    pub(super) fn new(store: Arc<dyn MetaStore>, lm: Arc<LockManager>) -> Plocks {
        Plocks {
            store,
            lm,
            held: Mutex::new(HashSet::new()),
        }
    }

    fn plock_id(ino: u64) -> String {
        format!("plock/{ino}")
    }

    /// Ranges on `ino`, without those of dead mounts.
    fn ranges(&self, ino: u64) -> FsResult<(Vec<Range>, Option<Version>)> {
        let Some(doc) = self.store.get(Idx::Locks, &Self::plock_id(ino))? else {
            return Ok((vec![], None));
        };
        let all: Vec<Range> = serde_json::from_value(doc.source["ranges"].clone())?;
        let mut live = Vec::with_capacity(all.len());
        for r in all {
            if self.lm.alive(&r.mount)? {
                live.push(r);
            }
        }
        Ok((live, Some(doc.version)))
    }

    /// The first lock that would conflict with (owner, start..=end, typ).
    fn conflict(
        &self,
        ranges: &[Range],
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
    ) -> Option<Range> {
        ranges
            .iter()
            .find(|r| {
                !(r.mount == self.lm.owner() && r.owner == owner)
                    && overlaps(r, start, end)
                    && (typ == libc::F_WRLCK || r.typ == libc::F_WRLCK)
            })
            .cloned()
    }

    /// F_GETLK: the conflicting lock, or None if the range could be locked.
    pub(super) fn getlk(
        &self,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
    ) -> FsResult<Option<Range>> {
        let (ranges, _) = self.ranges(ino)?;
        Ok(self.conflict(&ranges, owner, start, end, typ))
    }

    /// F_SETLK / F_SETLKW (`wait`) and unlock (typ F_UNLCK) of `want`
    /// (its `mount` is ignored: it is always this mount).
    pub(super) fn setlk(&self, ino: u64, want: Range, wait: bool) -> FsResult<()> {
        let Range {
            owner,
            pid,
            start,
            end,
            typ,
            ..
        } = want;
        let deadline = std::time::Instant::now() + WAIT;
        let mut delay = std::time::Duration::from_millis(10);
        loop {
            let (mut ranges, ver) = self.ranges(ino)?;
            if typ != libc::F_UNLCK && self.conflict(&ranges, owner, start, end, typ).is_some() {
                if !wait || std::time::Instant::now() >= deadline {
                    return Err(FsError::Again);
                }
                std::thread::sleep(delay);
                delay = (delay * 2).min(std::time::Duration::from_millis(200));
                continue;
            }
            // Our own ranges over start..=end are replaced (split if needed).
            let me = |r: &Range| r.mount == self.lm.owner() && r.owner == owner;
            let mut next = Vec::with_capacity(ranges.len() + 2);
            for r in ranges.drain(..) {
                if !me(&r) || !overlaps(&r, start, end) {
                    next.push(r);
                    continue;
                }
                if r.start < start {
                    next.push(Range {
                        end: start - 1,
                        ..r.clone()
                    });
                }
                if r.end > end {
                    next.push(Range {
                        start: end + 1,
                        ..r
                    });
                }
            }
            if typ != libc::F_UNLCK {
                next.push(Range {
                    mount: self.lm.owner().to_string(),
                    owner,
                    pid,
                    start,
                    end,
                    typ,
                });
            }
            let id = Self::plock_id(ino);
            let r = match (next.is_empty(), ver) {
                (true, None) => return Ok(()),
                (true, Some(v)) => self.store.delete(Idx::Locks, &id, Some(v)).map(|_| ()),
                (false, v) => {
                    let doc =
                        json!({"type": "plock", "ino": ino, "since": now_ms(), "ranges": next});
                    match v {
                        Some(v) => self.store.put(Idx::Locks, &id, &doc, Some(v)).map(|_| ()),
                        None => self.store.create(Idx::Locks, &id, &doc).map(|_| ()),
                    }
                }
            };
            match r {
                Ok(()) => {
                    let mut held = self.held.lock();
                    if next.iter().any(|r| r.mount == self.lm.owner()) {
                        held.insert(ino);
                    } else {
                        held.remove(&ino);
                    }
                    return Ok(());
                }
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// close(2) drops the closing owner's locks on the file.
    pub(super) fn unlock_owner(&self, ino: u64, owner: u64) -> FsResult<()> {
        if !self.held.lock().contains(&ino) {
            return Ok(()); // the common case: no store access
        }
        let all = Range {
            mount: String::new(),
            owner,
            pid: 0,
            start: 0,
            end: u64::MAX,
            typ: libc::F_UNLCK,
        };
        self.setlk(ino, all, false)
    }
}
