//! Randomized crash tests of deferred commits: the redo log replayed after
//! a crash loses nothing acknowledged.

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
        "cookie": r.below(1000), "kind": "file", "xattrs": [format!("k={}", r.below(3))],
    })
}

fn random_op(r: &mut Rng) -> BulkOp {
    let id = format!("e{}", r.below(40));
    match r.below(8) {
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
        5 => BulkOp::Index {
            index: Idx::Texts,
            id: format!("t{}", r.below(20)),
            source: json!({"ino": r.below(20), "contents": format!("w{} w{}", r.below(9), r.below(9))}),
            if_version: None,
        },
        6 => BulkOp::Delete {
            index: Idx::Texts,
            id: format!("t{}", r.below(20)),
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
        (Idx::Texts, (0..20).map(|i| format!("t{i}")).collect()),
    ] {
        let src = |s: &EmbeddedStore| -> Vec<Option<Value>> {
            s.mget(idx, &ids)
                .unwrap()
                .into_iter()
                .map(|d| d.map(|d| Value::clone(&d.source)))
                .collect()
        };
        assert_eq!(src(a), src(b), "{idx:?} documents differ");
    }
    // The indexed columns and side tables follow the sources.
    for (index, q) in [
        (Idx::Entries, Query::tree("path", "/a")),
        (Idx::Entries, Query::term("dir", json!("/d/e"))),
        (Idx::Entries, Query::term("xattrs", json!("k=1"))),
        (
            Idx::Texts,
            Query::Text {
                field: "contents".into(),
                text: "w3 w".into(),
            },
        ),
    ] {
        let ids = |s: &EmbeddedStore| {
            let mut v: Vec<String> = s
                .search(&SearchRequest {
                    past_own_writes: false,
                    index,
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
            let batch = (r.below(3) == 0).then(|| s.batch_handle().unwrap());
            both(batch.as_ref().unwrap_or(&s), &plain, &mut r, &mut max_seq);
            if let Some(b) = batch {
                b.end_batch().unwrap();
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
