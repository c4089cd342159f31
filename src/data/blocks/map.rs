//! What fsck compares: the blocks an object store lists against the block
//! maps that name them (the map itself is the document model's:
//! [`crate::model::block_map`]).

pub use crate::model::block_map::{BlockId, BlockMap, Extent, Piece};
use std::collections::{BTreeSet, HashMap};

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
        let now = crate::model::block_map::wall_ns();
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
        let now = crate::model::block_map::wall_ns();
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
