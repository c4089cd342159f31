//! A file's block map: which immutable block holds which byte range. It is
//! what a file's inode document holds (serde), so a commit of a new map
//! with the document's version check is the one step that makes a write
//! visible; blocks are never modified, only superseded and collected.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the epoch by the wall clock: a block's name carries
/// its upload time, by which an unreferenced block's age is judged on any
/// machine.
pub(crate) fn wall_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// A block's name, fresh for every block ever written (by any mount): the
/// upload time in milliseconds (48 bits, so its age is known without
/// asking the store) and 80 random bits. Written as 32 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(pub u128);

impl BlockId {
    pub fn fresh() -> BlockId {
        let ms = wall_ns().max(0) as u128 / 1_000_000;
        let random: u128 = rand::random::<u128>() & ((1u128 << 80) - 1);
        BlockId(((ms & ((1 << 48) - 1)) << 80) | random)
    }

    /// When the block was named (its upload started), in ns since the epoch.
    pub fn created_ns(&self) -> i64 {
        ((self.0 >> 80) as i64).saturating_mul(1_000_000)
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockId({self})")
    }
}

impl FromStr for BlockId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("bad block id {s:?} (want 32 hex digits)"));
        }
        u128::from_str_radix(s, 16)
            .map(BlockId)
            .map_err(|e| format!("bad block id {s:?}: {e}"))
    }
}

impl Serialize for BlockId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BlockId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Bytes `off..off+len` of the file are bytes `at..at+len` of `block`.
/// Serialized as `[off, len, "block", at]` (a big file's map has hundreds).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(from = "(u64, u64, BlockId, u64)", into = "(u64, u64, BlockId, u64)")]
pub struct Extent {
    pub off: u64,
    pub len: u64,
    pub block: BlockId,
    pub at: u64,
}

impl From<(u64, u64, BlockId, u64)> for Extent {
    fn from((off, len, block, at): (u64, u64, BlockId, u64)) -> Self {
        Extent {
            off,
            len,
            block,
            at,
        }
    }
}

impl From<Extent> for (u64, u64, BlockId, u64) {
    fn from(e: Extent) -> Self {
        (e.off, e.len, e.block, e.at)
    }
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.off + self.len
    }

    /// The part of this extent inside `lo..hi` (None if it misses it).
    fn clip(&self, lo: u64, hi: u64) -> Option<Extent> {
        let (s, e) = (self.off.max(lo), self.end().min(hi));
        (s < e).then(|| Extent {
            off: s,
            len: e - s,
            block: self.block,
            at: self.at + (s - self.off),
        })
    }
}

/// A piece of a read: `len` bytes at file offset `off`, from a block or a
/// hole (zeros).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Piece {
    pub off: u64,
    pub len: u64,
    /// (block, offset in it); None: a hole.
    pub source: Option<(BlockId, u64)>,
}

/// Extents sorted by offset, not overlapping, none empty. Gaps are holes.
/// The map's end may fall short of the file's size (a hole at the end:
/// the inode's size is the truth for the length).
#[derive(Clone, Default, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BlockMap {
    extents: Vec<Extent>,
}

impl BlockMap {
    /// A map read from a document, checked (a corrupt one must not serve
    /// reads: EIO with this message instead).
    pub fn from_extents(extents: Vec<Extent>) -> Result<BlockMap, String> {
        let m = BlockMap { extents };
        m.check()?;
        Ok(m)
    }

    pub fn check(&self) -> Result<(), String> {
        let mut end = 0;
        for e in &self.extents {
            if e.len == 0 {
                return Err(format!("empty extent at {}", e.off));
            }
            if e.off < end {
                return Err(format!("extent at {} overlaps the one before", e.off));
            }
            end = e.off.checked_add(e.len).ok_or("extent past 2^64")?;
        }
        Ok(())
    }

    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }

    /// Where the last extent ends.
    pub fn end(&self) -> u64 {
        self.extents.last().map_or(0, Extent::end)
    }

    /// Bytes held in blocks (st_blocks: holes are not stored).
    pub fn stored_bytes(&self) -> u64 {
        self.extents.iter().map(|e| e.len).sum()
    }

    /// Every block the map refers to.
    pub fn blocks(&self) -> BTreeSet<BlockId> {
        self.extents.iter().map(|e| e.block).collect()
    }

    /// The map after writing `new` (extents of freshly uploaded blocks,
    /// sorted, not overlapping each other) over this one: they replace
    /// whatever covered their ranges.
    pub fn write(&self, new: &[Extent]) -> BlockMap {
        let mut out: Vec<Extent> = Vec::with_capacity(self.extents.len() + new.len() + 1);
        let mut next = new.iter().peekable();
        let mut cut_from = 0; // old bytes below this were replaced already
        for old in &self.extents {
            let mut rest = old.clip(cut_from, u64::MAX);
            while let Some(r) = rest {
                match next.peek() {
                    Some(n) if n.off < r.end() => {
                        out.extend(r.clip(0, n.off));
                        out.push(**n);
                        cut_from = n.end();
                        rest = r.clip(n.end(), u64::MAX);
                        next.next();
                    }
                    _ => {
                        out.push(r);
                        rest = None;
                    }
                }
            }
        }
        out.extend(next.copied());
        // Adjacent pieces of one block (a write that cut nothing between
        // them) merge back.
        let mut merged: Vec<Extent> = Vec::with_capacity(out.len());
        for e in out {
            match merged.last_mut() {
                Some(l) if l.block == e.block && l.end() == e.off && l.at + l.len == e.at => {
                    l.len += e.len
                }
                _ => merged.push(e),
            }
        }
        BlockMap { extents: merged }
    }

    /// The map after truncating the file to `size` (extending leaves a
    /// hole: nothing to store).
    pub fn truncate(&self, size: u64) -> BlockMap {
        BlockMap {
            extents: self
                .extents
                .iter()
                .filter_map(|e| e.clip(0, size))
                .collect(),
        }
    }

    /// Blocks of `self` that `new` no longer refers to: to be collected
    /// once no reader can hold `self` any more (the grace period).
    pub fn superseded_by(&self, new: &BlockMap) -> Vec<BlockId> {
        let keep = new.blocks();
        self.blocks()
            .into_iter()
            .filter(|b| !keep.contains(b))
            .collect()
    }

    /// What to read for `off..off+len`, holes included, up to the map's
    /// end (the caller zero-fills from there up to the file's size).
    pub fn pieces(&self, off: u64, len: u64) -> Vec<Piece> {
        let hi = off.saturating_add(len).min(self.end());
        let mut out = Vec::new();
        let mut at = off;
        let first = self.extents.partition_point(|e| e.end() <= off);
        for e in &self.extents[first..] {
            if at >= hi {
                break;
            }
            if e.off > at {
                let to = e.off.min(hi);
                out.push(Piece {
                    off: at,
                    len: to - at,
                    source: None,
                });
                at = to;
            }
            if let Some(c) = e.clip(at, hi) {
                out.push(Piece {
                    off: c.off,
                    len: c.len,
                    source: Some((c.block, c.at)),
                });
                at = c.end();
            }
        }
        out
    }

    /// Blocks holding `off..off+len`, in file order, without repeats: the
    /// ones a sequential reader wants next.
    pub fn blocks_in(&self, off: u64, len: u64) -> Vec<BlockId> {
        let mut seen = BTreeSet::new();
        self.pieces(off, len)
            .into_iter()
            .filter_map(|p| p.source.map(|(b, _)| b))
            .filter(|b| seen.insert(*b))
            .collect()
    }
}
