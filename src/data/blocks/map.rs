//! A file's block map: which immutable block holds which byte range. It is
//! what a file's inode document holds (serde), so a commit of a new map
//! with the document's version check is the one step that makes a write
//! visible; blocks are never modified, only superseded and collected.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the epoch by the wall clock: a block's name carries
/// its upload time, by which an unreferenced block's age is judged on any
/// machine.
fn wall_ns() -> i64 {
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

/// One object in the store, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockMeta {
    /// The file's content key.
    pub file: String,
    pub block: BlockId,
    pub size: u64,
}

/// What fsck finds comparing the store's listing with the block maps.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Audit {
    /// Listed, referenced by no map and by no pending collection, and named
    /// longer than the grace period ago: safe to delete.
    pub orphans: Vec<BlockMeta>,
    /// Unreferenced but younger than the grace period: maybe an upload
    /// whose commit is still to come. Left alone.
    pub young: usize,
    /// Referenced by a map but not in the store: (file, block). Data loss.
    pub missing: Vec<(String, BlockId)>,
}

/// Compare `listed` (every block in the store) with `referenced` (per
/// file: the blocks of its committed map, and those superseded but still
/// waiting for their collection). `now_ns`, `grace_ns`: the orphan age.
pub fn audit(
    listed: &[BlockMeta],
    referenced: &HashMap<String, BTreeSet<BlockId>>,
    now_ns: i64,
    grace_ns: i64,
) -> Audit {
    let mut audit = Audit::default();
    let mut present: HashMap<&str, BTreeSet<BlockId>> = HashMap::new();
    for m in listed {
        present.entry(&m.file).or_default().insert(m.block);
        if referenced
            .get(&m.file)
            .is_some_and(|r| r.contains(&m.block))
        {
            continue;
        }
        if now_ns.saturating_sub(m.block.created_ns()) > grace_ns {
            audit.orphans.push(m.clone());
        } else {
            audit.young += 1;
        }
    }
    for (file, blocks) in referenced {
        for b in blocks {
            if !present.get(file.as_str()).is_some_and(|p| p.contains(b)) {
                audit.missing.push((file.clone(), *b));
            }
        }
    }
    audit.missing.sort();
    audit
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> BlockId {
        BlockId(n)
    }

    fn ext(off: u64, len: u64, b: u128, at: u64) -> Extent {
        Extent {
            off,
            len,
            block: id(b),
            at,
        }
    }

    /// The map as a byte-by-byte model: (block, offset) per file byte.
    fn model(m: &BlockMap, size: u64) -> Vec<Option<(u128, u64)>> {
        let mut v = vec![None; size as usize];
        for p in m.pieces(0, size) {
            for i in 0..p.len {
                v[(p.off + i) as usize] = p.source.map(|(b, at)| (b.0, at + i));
            }
        }
        v
    }

    #[test]
    fn block_ids_are_fresh_ordered_by_time_and_round_trip() {
        let a = BlockId::fresh();
        let b = BlockId::fresh();
        assert_ne!(a, b);
        let now = wall_ns();
        assert!((now - a.created_ns()).abs() < 5_000_000_000, "{a}");
        assert_eq!(a.to_string().parse::<BlockId>().unwrap(), a);
        assert!("xyz".parse::<BlockId>().is_err());
        let m = BlockMap::from_extents(vec![ext(0, 5, 0xabc, 3)]).unwrap();
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"[[0,5,"00000000000000000000000000000abc",3]]"#);
        assert_eq!(serde_json::from_str::<BlockMap>(&json).unwrap(), m);
    }

    #[test]
    fn writes_replace_what_they_cover_and_nothing_else() {
        let m = BlockMap::default().write(&[ext(0, 100, 1, 0)]);
        assert_eq!(m.extents(), &[ext(0, 100, 1, 0)]);
        // Overwrite the middle: the old block is split around it.
        let m2 = m.write(&[ext(40, 10, 2, 0)]);
        assert_eq!(
            m2.extents(),
            &[ext(0, 40, 1, 0), ext(40, 10, 2, 0), ext(50, 50, 1, 50)]
        );
        assert!(m.superseded_by(&m2).is_empty());
        // Past the end, leaving a hole.
        let m3 = m2.write(&[ext(200, 10, 3, 5)]);
        assert_eq!(m3.end(), 210);
        assert_eq!(m3.stored_bytes(), 110);
        let p = m3.pieces(95, 200);
        assert_eq!(
            p[0],
            Piece {
                off: 95,
                len: 5,
                source: Some((id(1), 95))
            }
        );
        assert_eq!(
            p[1],
            Piece {
                off: 100,
                len: 100,
                source: None
            }
        );
        assert_eq!(
            p[2],
            Piece {
                off: 200,
                len: 10,
                source: Some((id(3), 5))
            }
        );
        assert_eq!(p.len(), 3);
        // Covering all of block 1 supersedes it.
        let m4 = m3.write(&[ext(0, 40, 4, 0), ext(50, 60, 5, 0)]);
        assert_eq!(m3.superseded_by(&m4), vec![id(1)]);
        assert_eq!(m4.blocks_in(0, 1000), vec![id(4), id(2), id(5), id(3)]);
        // Truncation clips and drops.
        let t = m4.truncate(45);
        assert_eq!(t.extents(), &[ext(0, 40, 4, 0), ext(40, 5, 2, 0)]);
        assert_eq!(m4.superseded_by(&t), vec![id(3), id(5)]);
        assert!(BlockMap::from_extents(vec![ext(0, 5, 1, 0), ext(4, 5, 2, 0)]).is_err());
    }

    /// Random writes and truncates against a byte model.
    #[test]
    fn maps_follow_a_byte_model() {
        let size = 300u64;
        let mut m = BlockMap::default();
        let mut bytes: Vec<Option<(u128, u64)>> = vec![None; size as usize];
        let mut seed = 12345u64;
        let mut rnd = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for step in 1..500u128 {
            if rnd(10) == 0 {
                let s = rnd(size);
                m = m.truncate(s);
                for b in &mut bytes[s as usize..] {
                    *b = None;
                }
            } else {
                // One or two new extents from one block.
                let off = rnd(size - 1);
                let len = 1 + rnd((size - off).min(60));
                let at = rnd(7);
                let mut new = vec![ext(off, len, step, at)];
                let gap = rnd(20);
                if off + len + gap + 5 <= size && rnd(2) == 0 {
                    new.push(ext(off + len + gap, 5, step, at + len + gap));
                }
                m = m.write(&new);
                for e in &new {
                    for i in 0..e.len {
                        bytes[(e.off + i) as usize] = Some((step, e.at + i));
                    }
                }
            }
            m.check().unwrap();
            assert_eq!(model(&m, size), bytes, "step {step}");
            // No two adjacent extents that could be one.
            for w in m.extents().windows(2) {
                assert!(
                    !(w[0].block == w[1].block
                        && w[0].end() == w[1].off
                        && w[0].at + w[0].len == w[1].at)
                );
            }
        }
    }

    #[test]
    fn audit_finds_orphans_and_missing_blocks() {
        let hour = 3_600_000_000_000i64;
        let old = BlockId(1 << 80); // named at 1 ms after the epoch
        let now = wall_ns();
        let young = BlockId::fresh();
        let kept = BlockId(2 << 80);
        let meta = |f: &str, b| BlockMeta {
            file: f.into(),
            block: b,
            size: 1,
        };
        let listed = vec![meta("7", old), meta("7", young), meta("7", kept)];
        let mut refs = HashMap::new();
        refs.insert("7".to_string(), BTreeSet::from([kept, BlockId(3 << 80)]));
        refs.insert("8".to_string(), BTreeSet::from([BlockId(4 << 80)]));
        let a = audit(&listed, &refs, now, hour);
        assert_eq!(a.orphans, vec![meta("7", old)]);
        assert_eq!(a.young, 1);
        assert_eq!(
            a.missing,
            vec![
                ("7".into(), BlockId(3 << 80)),
                ("8".into(), BlockId(4 << 80))
            ]
        );
    }
}
