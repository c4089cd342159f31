//! Tests of the embedded store's own behaviour: SQLite internals (schema,
//! backfill, indexes, reader pool), seq_nos across reopen, batches.

use super::query::{Sql, compile, parse_after, prefix_end, search_sql, sort_keys};
use super::*;
use crate::store::{Sort, scan};
use rusqlite::types::Value as SqlValue;
use serde_json::json;
use std::cmp::Ordering;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};

fn open() -> (tempfile::TempDir, EmbeddedStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("store")).unwrap();
    (dir, store)
}

fn entry(parent: u64, name: &str, cookie: i64) -> Value {
    json!({
        "parent": parent,
        "name": name,
        "path": format!("/{parent}/{name}"),
        "cookie": cookie,
        "kind": "file",
    })
}

fn req(index: Idx, query: Query, sort: Vec<Sort>, size: usize) -> SearchRequest {
    SearchRequest {
        index,
        query,
        sort,
        search_after: None,
        size,
    }
}

fn desc(field: &str) -> Sort {
    Sort {
        field: field.to_string(),
        descending: true,
    }
}

fn ids(hits: &[Hit]) -> Vec<String> {
    hits.iter().map(|h| h.doc.id.clone()).collect()
}

/// Ids matching `q`, in id order.
fn matching(s: &EmbeddedStore, index: Idx, q: Query) -> Vec<String> {
    let hits = s.search(&req(index, q.clone(), vec![], 10_000)).unwrap();
    assert_eq!(s.count(index, &q).unwrap(), hits.len() as u64);
    ids(&hits)
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn range(
    field: &str,
    gte: Option<Value>,
    gt: Option<Value>,
    lte: Option<Value>,
    lt: Option<Value>,
) -> Query {
    Query::Range {
        field: field.into(),
        gte,
        gt,
        lte,
        lt,
    }
}

fn prefix(field: &str, value: &str) -> Query {
    Query::Prefix {
        field: field.into(),
        value: value.into(),
    }
}

fn exists(field: &str) -> Query {
    Query::Exists {
        field: field.into(),
    }
}

fn is_invalid<T: std::fmt::Debug>(r: StoreResult<T>) -> bool {
    matches!(r, Err(StoreError::Invalid(_)))
}

fn conflict<T: std::fmt::Debug>(r: StoreResult<T>) -> bool {
    matches!(r, Err(StoreError::Conflict(_)))
}

/// Collects every hit of a paged search.
fn scan_all(s: &EmbeddedStore, index: Idx, q: Query, sort: Vec<Sort>, page: usize) -> Vec<Hit> {
    let mut all = Vec::new();
    scan(s, index, q, sort, page, |hits| {
        assert!(hits.len() <= page);
        all.extend(hits);
        Ok(true)
    })
    .unwrap();
    all
}

#[test]
fn get_and_mget_are_realtime() {
    let (_d, s) = open();
    assert_eq!(s.get(Idx::Entries, "1/a").unwrap(), None);
    let v1 = s.create(Idx::Entries, "1/a", &entry(1, "a", 1)).unwrap();
    assert_eq!(v1.primary_term, 1);
    let doc = s.get(Idx::Entries, "1/a").unwrap().unwrap();
    assert_eq!(doc.id, "1/a");
    assert_eq!(doc.version, v1);
    assert_eq!(doc.source, entry(1, "a", 1));

    s.create(Idx::Entries, "1/b", &entry(1, "b", 2)).unwrap();
    let v2 = s.put(Idx::Entries, "1/a", &entry(1, "a", 3), None).unwrap();
    assert!(v2.seq_no > v1.seq_no);
    let got = s
        .mget(Idx::Entries, &strs(&["1/b", "nope", "1/a"]))
        .unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].as_ref().unwrap().source["name"], "b");
    assert!(got[1].is_none());
    assert_eq!(got[2].as_ref().unwrap().version, v2);
    assert_eq!(got[2].as_ref().unwrap().source["cookie"], 3);
    // Indices are separate namespaces.
    assert_eq!(s.get(Idx::Inodes, "1/a").unwrap(), None);
    // An id too long to exist is simply absent; an empty one is invalid.
    assert_eq!(s.get(Idx::Entries, &"x".repeat(600)).unwrap(), None);
    assert!(is_invalid(s.get(Idx::Entries, "")));
    assert!(s.mget(Idx::Entries, &[]).unwrap().is_empty());
}

#[test]
fn create_conflicts_on_existing_id() {
    let (_d, s) = open();
    let v = s.create(Idx::Inodes, "7", &json!({"kind": "dir"})).unwrap();
    assert!(conflict(s.create(
        Idx::Inodes,
        "7",
        &json!({"kind": "file"})
    )));
    let doc = s.get(Idx::Inodes, "7").unwrap().unwrap();
    assert_eq!(doc.version, v);
    assert_eq!(doc.source["kind"], "dir");
}

#[test]
fn put_with_if_version() {
    let (_d, s) = open();
    let v1 = s.create(Idx::Inodes, "1", &json!({"n": 1})).unwrap();
    let v2 = s.put(Idx::Inodes, "1", &json!({"n": 2}), Some(v1)).unwrap();
    assert!(v2.seq_no > v1.seq_no);
    // Stale.
    assert!(conflict(s.put(
        Idx::Inodes,
        "1",
        &json!({"n": 3}),
        Some(v1)
    )));
    // Another primary term never matches.
    let other_term = Version {
        seq_no: v2.seq_no,
        primary_term: 2,
    };
    assert!(conflict(s.put(
        Idx::Inodes,
        "1",
        &json!({"n": 3}),
        Some(other_term)
    )));
    assert_eq!(s.get(Idx::Inodes, "1").unwrap().unwrap().source["n"], 2);
    // Absent document: 409 as in Elasticsearch, and nothing is created.
    assert!(conflict(s.put(Idx::Inodes, "2", &json!({}), Some(v2))));
    assert_eq!(s.get(Idx::Inodes, "2").unwrap(), None);
    // Unconditional put creates and overwrites.
    let v3 = s.put(Idx::Inodes, "2", &json!({"n": 1}), None).unwrap();
    let v4 = s.put(Idx::Inodes, "2", &json!({"n": 5}), None).unwrap();
    assert!(v4.seq_no > v3.seq_no);
    assert_eq!(s.get(Idx::Inodes, "2").unwrap().unwrap().version, v4);
}

#[test]
fn delete_semantics() {
    let (_d, s) = open();
    assert!(!s.delete(Idx::Locks, "l", None).unwrap());
    let v1 = s.create(Idx::Locks, "l", &json!({"owner": "a"})).unwrap();
    let v2 = s
        .put(Idx::Locks, "l", &json!({"owner": "b"}), None)
        .unwrap();
    assert!(conflict(s.delete(Idx::Locks, "l", Some(v1))));
    assert!(s.get(Idx::Locks, "l").unwrap().is_some());
    assert!(s.delete(Idx::Locks, "l", Some(v2)).unwrap());
    assert_eq!(s.get(Idx::Locks, "l").unwrap(), None);
    assert!(conflict(s.delete(Idx::Locks, "l", Some(v2))));
    s.create(Idx::Locks, "m", &json!({})).unwrap();
    assert!(s.delete(Idx::Locks, "m", None).unwrap());
    assert!(!s.delete(Idx::Locks, "m", None).unwrap());
}

#[test]
fn ids_are_validated_like_elasticsearch() {
    let (_d, s) = open();
    let max = "é".repeat(MAX_ID_BYTES / 2);
    assert_eq!(max.len(), MAX_ID_BYTES);
    s.create(Idx::Meta, &max, &json!({})).unwrap();
    assert!(s.get(Idx::Meta, &max).unwrap().is_some());
    let long = format!("{max}x");
    assert!(is_invalid(s.create(Idx::Meta, &long, &json!({}))));
    assert!(is_invalid(s.put(Idx::Meta, &long, &json!({}), None)));
    assert!(is_invalid(s.delete(Idx::Meta, &long, None)));
    assert!(is_invalid(s.create(Idx::Meta, "", &json!({}))));
    assert!(is_invalid(s.put(Idx::Meta, "", &json!({}), None)));
    assert!(is_invalid(s.delete(Idx::Meta, "", None)));
    let r = s
        .bulk(vec![BulkOp::Create {
            index: Idx::Meta,
            id: long,
            source: json!({}),
        }])
        .unwrap();
    assert!(is_invalid(r[0].clone()));
}

#[test]
fn sources_and_fields_are_validated() {
    let (_d, s) = open();
    for bad in [json!([1]), json!("x"), json!(3), Value::Null] {
        assert!(is_invalid(s.create(Idx::Meta, "a", &bad)));
        assert!(is_invalid(s.put(Idx::Meta, "a", &bad, None)));
    }
    // Multi-valued (array/object) declared fields are not supported.
    assert!(is_invalid(s.create(
        Idx::Entries,
        "a",
        &json!({"name": ["x", "y"]})
    )));
    assert!(is_invalid(s.create(
        Idx::Entries,
        "a",
        &json!({"size": {"a": 1}})
    )));
    assert!(is_invalid(s.create(
        Idx::Entries,
        "a",
        &json!({"size": "big"})
    )));
    assert!(is_invalid(s.create(
        Idx::Entries,
        "a",
        &json!({"size": 1.5})
    )));
    assert!(is_invalid(s.create(
        Idx::Inodes,
        "a",
        &json!({"orphan": 1})
    )));
    assert!(is_invalid(s.create(
        Idx::Entries,
        "a",
        &json!({"size": u64::MAX})
    )));
    assert_eq!(s.get(Idx::Entries, "a").unwrap(), None);
    // Undeclared keys may hold anything; declared ones coerce like ES.
    s.create(
        Idx::Entries,
        "a",
        &json!({"extra": {"k": [1, 2]}, "size": "42", "mtime": 7.0, "kind": 5, "name": null}),
    )
    .unwrap();
    assert_eq!(
        matching(&s, Idx::Entries, Query::term("size", 42)),
        strs(&["a"])
    );
    assert_eq!(
        matching(&s, Idx::Entries, Query::term("mtime", 7)),
        strs(&["a"])
    );
    assert_eq!(
        matching(&s, Idx::Entries, Query::term("kind", "5")),
        strs(&["a"])
    );
    assert!(matching(&s, Idx::Entries, exists("name")).is_empty());
    s.create(Idx::Inodes, "b", &json!({"orphan": "true"}))
        .unwrap();
    assert_eq!(
        matching(&s, Idx::Inodes, Query::term("orphan", true)),
        strs(&["b"])
    );
}

#[test]
fn seq_nos_are_store_wide_monotonic_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let last = {
        let s = EmbeddedStore::open(dir.path()).unwrap();
        let a = s.create(Idx::Entries, "a", &json!({})).unwrap();
        let b = s.create(Idx::Inodes, "a", &json!({})).unwrap();
        let c = s.put(Idx::Locks, "a", &json!({}), None).unwrap();
        assert!(a.seq_no < b.seq_no && b.seq_no < c.seq_no);
        // The highest seq_no ever handed out is gone after this delete.
        let d = s.bulk(vec![BulkOp::Delete {
            index: Idx::Locks,
            id: "a".into(),
            if_version: None,
        }]);
        d.unwrap()[0].clone().unwrap()
    };
    let s = EmbeddedStore::open(dir.path()).unwrap();
    let e = s.create(Idx::Locks, "a", &json!({})).unwrap();
    assert!(e.seq_no > last.seq_no);
    // Enough writes to cross several reservation blocks.
    let ops = (0..SEQ_BLOCK * 2 + 5)
        .map(|i| BulkOp::Index {
            index: Idx::Meta,
            id: format!("m{}", i % 3),
            source: json!({}),
            if_version: None,
        })
        .collect();
    let vs: Vec<u64> = s
        .bulk(ops)
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().seq_no)
        .collect();
    assert!(vs.windows(2).all(|w| w[0] < w[1]));
    let top = *vs.last().unwrap();
    drop(s);
    let s = EmbeddedStore::open(dir.path()).unwrap();
    assert!(s.create(Idx::Meta, "z", &json!({})).unwrap().seq_no > top);
}

#[test]
fn bulk_items_fail_independently_in_order() {
    let (_d, s) = open();
    let v = s
        .create(Idx::Inodes, "1", &json!({"kind": "file"}))
        .unwrap();
    let ops = vec![
        BulkOp::Create {
            index: Idx::Inodes,
            id: "2".into(),
            source: json!({"kind": "dir"}),
        },
        BulkOp::Create {
            index: Idx::Inodes,
            id: "1".into(),
            source: json!({}),
        },
        BulkOp::Index {
            index: Idx::Inodes,
            id: "1".into(),
            source: json!({"kind": "symlink"}),
            if_version: Some(Version {
                seq_no: v.seq_no + 100,
                primary_term: 1,
            }),
        },
        BulkOp::Delete {
            index: Idx::Inodes,
            id: "absent".into(),
            if_version: None,
        },
        BulkOp::Index {
            index: Idx::Inodes,
            id: "3".into(),
            source: json!([]),
            if_version: None,
        },
        BulkOp::Index {
            index: Idx::Inodes,
            id: "1".into(),
            source: json!({"kind": "fifo"}),
            if_version: Some(v),
        },
        BulkOp::Delete {
            index: Idx::Inodes,
            id: "2".into(),
            if_version: None,
        },
        BulkOp::Create {
            index: Idx::Entries,
            id: "1/x".into(),
            source: entry(1, "x", 1),
        },
    ];
    let r = s.bulk(ops).unwrap();
    assert_eq!(r.len(), 8);
    assert!(r[0].is_ok());
    assert_eq!(r[1], Err(StoreError::Conflict("1".into())));
    assert_eq!(r[2], Err(StoreError::Conflict("1".into())));
    assert_eq!(r[3], Err(StoreError::NotFound("absent".into())));
    assert!(is_invalid(r[4].clone()));
    let oks: Vec<u64> = [0, 5, 6, 7]
        .iter()
        .map(|&i| r[i].clone().unwrap().seq_no)
        .collect();
    assert!(oks.windows(2).all(|w| w[0] < w[1]));
    let one = s.get(Idx::Inodes, "1").unwrap().unwrap();
    assert_eq!(one.source["kind"], "fifo");
    assert_eq!(one.version, r[5].clone().unwrap());
    assert_eq!(s.get(Idx::Inodes, "2").unwrap(), None);
    assert_eq!(s.get(Idx::Inodes, "3").unwrap(), None);
    assert!(s.get(Idx::Entries, "1/x").unwrap().is_some());
    assert!(s.bulk(vec![]).unwrap().is_empty());
}

fn path_store() -> (tempfile::TempDir, EmbeddedStore) {
    let (d, s) = open();
    let paths = [
        "/a", "/a/b", "/a/b/c", "/a/b/c/d", "/a/bc", "/a/b-x", "/a/b.x", "/ab", "/b", "rel/x",
    ];
    let ops = paths
        .iter()
        .map(|p| BulkOp::Create {
            index: Idx::Entries,
            id: p.to_string(),
            source: json!({"path": p}),
        })
        .collect();
    assert!(s.bulk(ops).unwrap().iter().all(|r| r.is_ok()));
    s.create(Idx::Entries, "nopath", &json!({"name": "x"}))
        .unwrap();
    (d, s)
}

#[test]
fn tree_query() {
    let (_d, s) = path_store();
    let tree = |p: &str| matching(&s, Idx::Entries, Query::tree("path", p));
    assert_eq!(tree("/a/b"), strs(&["/a/b", "/a/b/c", "/a/b/c/d"]));
    assert_eq!(tree("/a/b/c/d"), strs(&["/a/b/c/d"]));
    assert_eq!(
        tree("/a"),
        strs(&[
            "/a", "/a/b", "/a/b-x", "/a/b.x", "/a/b/c", "/a/b/c/d", "/a/bc"
        ])
    );
    assert_eq!(
        tree("/"),
        strs(&[
            "/a", "/a/b", "/a/b-x", "/a/b.x", "/a/b/c", "/a/b/c/d", "/a/bc", "/ab", "/b"
        ])
    );
    assert!(tree("/zz").is_empty());
    assert_eq!(tree("rel"), strs(&["rel/x"]));
}

#[test]
fn prefix_query() {
    let (_d, s) = path_store();
    let pre = |p: &str| matching(&s, Idx::Entries, prefix("path", p));
    assert_eq!(
        pre("/a/b"),
        strs(&["/a/b", "/a/b-x", "/a/b.x", "/a/b/c", "/a/b/c/d", "/a/bc"])
    );
    assert_eq!(pre("/a/b/"), strs(&["/a/b/c", "/a/b/c/d"]));
    assert_eq!(pre("/A").len(), 0, "case-sensitive");
    assert_eq!(pre("").len(), 10, "empty prefix: every doc with the field");

    let names = [
        "e",
        "é",
        "éa",
        "é\u{10FFFF}",
        "ê",
        "\u{D7FF}x",
        "\u{E000}",
        "a%b",
        "axb",
        "a_c",
        "a\u{10FFFF}",
        "a\u{10FFFF}\u{10FFFF}",
        "b",
    ];
    for (i, n) in names.iter().enumerate() {
        s.create(Idx::Inodes, &format!("{i}"), &json!({"kind": n}))
            .unwrap();
    }
    let pre = |p: &str| -> Vec<&str> {
        let hits = s
            .search(&req(
                Idx::Inodes,
                prefix("kind", p),
                vec![Sort::asc("kind")],
                100,
            ))
            .unwrap();
        hits.iter()
            .map(|h| names[h.doc.id.parse::<usize>().unwrap()])
            .collect()
    };
    assert_eq!(pre("é"), ["é", "éa", "é\u{10FFFF}"]);
    assert_eq!(pre("\u{D7FF}"), ["\u{D7FF}x"]);
    assert_eq!(pre("a%"), ["a%b"], "% is literal");
    assert_eq!(pre("a_"), ["a_c"], "_ is literal");
    assert_eq!(pre("a\u{10FFFF}"), ["a\u{10FFFF}", "a\u{10FFFF}\u{10FFFF}"]);
    assert_eq!(pre("\u{10FFFF}"), Vec::<&str>::new());
    assert_eq!(prefix_end("a\u{10FFFF}"), Some("b".into()));
    assert_eq!(prefix_end("\u{10FFFF}"), None);
    assert_eq!(prefix_end("\u{D7FF}"), Some("\u{E000}".into()));
    assert!(is_invalid(s.count(Idx::Entries, &prefix("size", "1"))));
}

fn numbers_store() -> (tempfile::TempDir, EmbeddedStore) {
    let (d, s) = open();
    for i in 0..10i64 {
        let mut doc = json!({"ino": i, "kind": if i % 2 == 0 { "file" } else { "dir" }});
        if i % 3 != 0 {
            doc["size"] = json!(i * 100 - 500);
        }
        s.create(Idx::Entries, &format!("e{i}"), &doc).unwrap();
    }
    (d, s)
}

#[test]
fn term_and_terms_queries() {
    let (_d, s) = numbers_store();
    assert_eq!(
        matching(&s, Idx::Entries, Query::term("ino", 4)),
        strs(&["e4"])
    );
    assert_eq!(
        matching(&s, Idx::Entries, Query::term("size", -300)),
        strs(&["e2"])
    );
    assert_eq!(
        matching(&s, Idx::Entries, Query::term("kind", "dir")),
        strs(&["e1", "e3", "e5", "e7", "e9"])
    );
    assert!(matching(&s, Idx::Entries, Query::term("kind", "DIR")).is_empty());
    let terms = |field: &str, values: Vec<Value>| {
        matching(
            &s,
            Idx::Entries,
            Query::Terms {
                field: field.into(),
                values,
            },
        )
    };
    assert_eq!(
        terms("ino", vec![json!(1), json!(8), json!(99)]),
        strs(&["e1", "e8"])
    );
    assert!(terms("ino", vec![]).is_empty());
    assert!(is_invalid(
        s.count(Idx::Entries, &Query::term("ino", Value::Null))
    ));
    assert!(is_invalid(s.count(Idx::Entries, &Query::term("ino", "x"))));

    s.create(Idx::Inodes, "1", &json!({"orphan": true}))
        .unwrap();
    s.create(Idx::Inodes, "2", &json!({"orphan": false}))
        .unwrap();
    s.create(Idx::Inodes, "3", &json!({})).unwrap();
    assert_eq!(
        matching(&s, Idx::Inodes, Query::term("orphan", true)),
        strs(&["1"])
    );
    assert_eq!(
        matching(&s, Idx::Inodes, Query::term("orphan", false)),
        strs(&["2"])
    );
    assert_eq!(
        matching(&s, Idx::Inodes, Query::MatchAll),
        strs(&["1", "2", "3"])
    );
}

#[test]
fn range_and_exists_queries() {
    let (_d, s) = numbers_store();
    // sizes: e1 -400, e2 -300, e4 -100, e5 0, e7 200, e8 300
    let r = |gte, gt, lte, lt| matching(&s, Idx::Entries, range("size", gte, gt, lte, lt));
    assert_eq!(
        r(Some(json!(0)), None, None, None),
        strs(&["e5", "e7", "e8"])
    );
    assert_eq!(r(None, Some(json!(0)), None, None), strs(&["e7", "e8"]));
    assert_eq!(r(None, None, Some(json!(-300)), None), strs(&["e1", "e2"]));
    assert_eq!(r(None, None, None, Some(json!(-300))), strs(&["e1"]));
    assert_eq!(
        r(Some(json!(-300)), None, None, Some(json!(200))),
        strs(&["e2", "e4", "e5"])
    );
    assert_eq!(
        r(Some(Value::Null), None, None, Some(json!(-300))),
        strs(&["e1"])
    );
    assert_eq!(
        r(None, None, None, None),
        strs(&["e1", "e2", "e4", "e5", "e7", "e8"])
    );
    assert_eq!(matching(&s, Idx::Entries, exists("size")).len(), 6);
    assert!(matching(&s, Idx::Entries, exists("mtime")).is_empty());
    // Ranges on keywords compare bytes.
    let kinds = matching(
        &s,
        Idx::Entries,
        range("kind", None, Some(json!("dir")), None, None),
    );
    assert_eq!(kinds.len(), 5);
}

#[test]
fn bool_query() {
    let (_d, s) = numbers_store();
    let b = |must: Vec<Query>, must_not: Vec<Query>, should: Vec<Query>| {
        matching(
            &s,
            Idx::Entries,
            Query::Bool {
                must,
                must_not,
                should,
            },
        )
    };
    let ge0 = || range("size", Some(json!(0)), None, None, None);
    assert_eq!(b(vec![], vec![], vec![]).len(), 10);
    assert_eq!(
        b(vec![Query::term("kind", "file"), ge0()], vec![], vec![]),
        strs(&["e8"])
    );
    // must_not keeps documents missing the field (ES semantics).
    assert_eq!(
        b(vec![], vec![ge0()], vec![]),
        strs(&["e0", "e1", "e2", "e3", "e4", "e6", "e9"])
    );
    assert_eq!(
        b(vec![], vec![ge0(), Query::term("kind", "dir")], vec![]),
        strs(&["e0", "e2", "e4", "e6"])
    );
    assert_eq!(
        b(
            vec![],
            vec![],
            vec![Query::term("ino", 1), Query::term("ino", 2)]
        ),
        strs(&["e1", "e2"])
    );
    // should is required to match (at least one) when non-empty.
    assert_eq!(
        b(
            vec![Query::term("kind", "dir")],
            vec![],
            vec![Query::term("ino", 1), Query::term("ino", 2)]
        ),
        strs(&["e1"])
    );
    // Nested: not (dir and has size).
    let inner = Query::and(vec![Query::term("kind", "dir"), exists("size")]);
    assert_eq!(
        b(vec![], vec![inner], vec![]),
        strs(&["e0", "e2", "e3", "e4", "e6", "e8", "e9"])
    );
    // A negated negation.
    let not_dir = Query::Bool {
        must: vec![],
        must_not: vec![Query::term("kind", "dir")],
        should: vec![],
    };
    assert_eq!(b(vec![], vec![not_dir], vec![]).len(), 5);
    assert_eq!(
        b(vec![Query::MatchAll], vec![Query::MatchAll], vec![]).len(),
        0
    );
}

#[test]
fn undeclared_fields_are_invalid() {
    let (_d, s) = numbers_store();
    let search = |q: Query, sort: Vec<Sort>| s.search(&req(Idx::Entries, q, sort, 10));
    assert!(is_invalid(search(Query::term("nope", 1), vec![])));
    assert!(is_invalid(search(Query::term("path.tree", "/a"), vec![])));
    assert!(is_invalid(search(Query::term("name.text", "a"), vec![])));
    assert!(is_invalid(search(Query::tree("path.tree", "/a"), vec![])));
    assert!(is_invalid(search(Query::tree("dir", "/a"), vec![])));
    assert!(is_invalid(search(exists("src"), vec![])));
    assert!(is_invalid(search(Query::MatchAll, vec![Sort::asc("nope")])));
    assert!(is_invalid(search(Query::MatchAll, vec![Sort::asc("_id")])));
    let nested = Query::and(vec![Query::MatchAll, Query::term("id", "e1")]);
    assert!(is_invalid(search(nested.clone(), vec![])));
    assert!(is_invalid(s.count(Idx::Entries, &nested)));
    assert!(is_invalid(s.count(Idx::Meta, &exists("kind"))));
    assert_eq!(s.count(Idx::Meta, &Query::MatchAll).unwrap(), 0);
    // Bad search_after: wrong arity, non-string id, wrong type.
    for after in [
        vec![],
        vec![json!(1), json!("e1"), json!("e2")],
        vec![json!(1), json!(2)],
        vec![json!("x"), json!("e1")],
    ] {
        let mut r = req(Idx::Entries, Query::MatchAll, vec![Sort::asc("ino")], 10);
        r.search_after = Some(after);
        assert!(is_invalid(s.search(&r)));
    }
    let mut r = req(Idx::Entries, Query::MatchAll, vec![], 10);
    r.search_after = Some(vec![]);
    assert!(is_invalid(s.search(&r)));
    // Validation happens even for empty pages.
    assert!(is_invalid(s.search(&req(
        Idx::Entries,
        Query::term("nope", 1),
        vec![],
        0
    ))));
}

#[test]
fn count_matches_queries() {
    let (_d, s) = numbers_store();
    assert_eq!(s.count(Idx::Entries, &Query::MatchAll).unwrap(), 10);
    assert_eq!(
        s.count(Idx::Entries, &Query::term("kind", "file")).unwrap(),
        5
    );
    assert_eq!(s.count(Idx::Entries, &exists("size")).unwrap(), 6);
    assert_eq!(s.count(Idx::Inodes, &Query::MatchAll).unwrap(), 0);
    s.delete(Idx::Entries, "e0", None).unwrap();
    assert_eq!(
        s.count(Idx::Entries, &Query::term("kind", "file")).unwrap(),
        4
    );
}

#[test]
fn paging_visits_every_doc_once_in_order() {
    let (_d, s) = open();
    let n = 2500i64;
    // Cookies are a permutation of 0..n, not in id order.
    let ops = (0..n)
        .map(|i| BulkOp::Create {
            index: Idx::Entries,
            id: format!("1/f{i:05}"),
            source: entry(1, &format!("f{i:05}"), (i * 7919) % n),
        })
        .collect();
    assert!(s.bulk(ops).unwrap().iter().all(|r| r.is_ok()));
    s.create(Idx::Entries, "2/other", &entry(2, "other", 5))
        .unwrap();
    let q = || Query::term("parent", 1);
    let cookies = |hits: &[Hit]| -> Vec<i64> {
        hits.iter()
            .map(|h| h.doc.source["cookie"].as_i64().unwrap())
            .collect()
    };

    let asc = scan_all(&s, Idx::Entries, q(), vec![Sort::asc("cookie")], 1000);
    assert_eq!(cookies(&asc), (0..n).collect::<Vec<_>>());
    assert_eq!(asc[0].sort, vec![json!(0), json!(asc[0].doc.id)]);

    let desc_hits = scan_all(&s, Idx::Entries, q(), vec![desc("cookie")], 1000);
    assert_eq!(cookies(&desc_hits), (0..n).rev().collect::<Vec<_>>());

    let by_id = scan_all(&s, Idx::Entries, q(), vec![], 1000);
    let expect: Vec<String> = (0..n).map(|i| format!("1/f{i:05}")).collect();
    assert_eq!(ids(&by_id), expect);
    assert_eq!(by_id[0].sort, vec![json!("1/f00000")]);

    // search_after from the middle.
    let mut r = req(Idx::Entries, q(), vec![Sort::asc("cookie")], 3);
    r.search_after = Some(asc[1499].sort.clone());
    assert_eq!(cookies(&s.search(&r).unwrap()), vec![1500, 1501, 1502]);
}

#[test]
fn duplicate_sort_values_tie_break_on_id() {
    let (_d, s) = open();
    for (i, name) in ["e", "b", "d", "a", "c", "f"].iter().enumerate() {
        let cookie = if i < 4 { 7 } else { 3 };
        s.create(Idx::Entries, name, &entry(1, name, cookie))
            .unwrap();
    }
    let asc = scan_all(
        &s,
        Idx::Entries,
        Query::MatchAll,
        vec![Sort::asc("cookie")],
        2,
    );
    assert_eq!(ids(&asc), strs(&["c", "f", "a", "b", "d", "e"]));
    let dsc = scan_all(&s, Idx::Entries, Query::MatchAll, vec![desc("cookie")], 2);
    assert_eq!(ids(&dsc), strs(&["a", "b", "d", "e", "c", "f"]));
    assert_eq!(dsc[0].sort, vec![json!(7), json!("a")]);
}

#[test]
fn search_after_without_id_is_strict_like_elasticsearch() {
    let (_d, s) = open();
    for (id, cookie) in [
        ("a", Some(3)),
        ("b", Some(1)),
        ("c", Some(3)),
        ("d", Some(2)),
        ("e", None),
    ] {
        let mut doc = json!({"parent": 1});
        if let Some(c) = cookie {
            doc["cookie"] = json!(c);
        }
        s.create(Idx::Entries, id, &doc).unwrap();
    }
    let page = |after: Value, descending: bool| {
        let mut r = req(
            Idx::Entries,
            Query::term("parent", 1),
            vec![Sort {
                field: "cookie".into(),
                descending,
            }],
            10,
        );
        r.search_after = Some(vec![after]);
        ids(&s.search(&r).unwrap())
    };
    assert_eq!(page(json!(0), false), strs(&["b", "d", "a", "c", "e"]));
    assert_eq!(page(json!(1), false), strs(&["d", "a", "c", "e"]));
    // Ties with the after values are skipped: there is no id to split them.
    assert_eq!(page(json!(3), false), strs(&["e"]));
    assert_eq!(page(json!(3), true), strs(&["d", "b", "e"]));
    assert!(page(Value::Null, false).is_empty());
    // Directory-listing style paging on a unique sort value.
    let mut seen = vec![];
    let mut after = json!(0);
    loop {
        let mut r = req(Idx::Entries, exists("cookie"), vec![Sort::asc("cookie")], 1);
        r.search_after = Some(vec![after]);
        let hits = s.search(&r).unwrap();
        let Some(h) = hits.last() else { break };
        after = h.sort[0].clone();
        seen.push(h.doc.id.clone());
    }
    assert_eq!(seen, strs(&["b", "d", "a"]));
}

/// Reference order: missing values last in both directions, then the id.
fn reference_cmp(a: &Hit, b: &Hit, sort: &[Sort]) -> Ordering {
    for (i, s) in sort.iter().enumerate() {
        let (x, y) = (&a.sort[i], &b.sort[i]);
        let o = match (x.is_null(), y.is_null()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            _ => {
                let o = match (x.as_i64(), y.as_i64()) {
                    (Some(x), Some(y)) => x.cmp(&y),
                    _ => x.as_str().unwrap().cmp(y.as_str().unwrap()),
                };
                if s.descending { o.reverse() } else { o }
            }
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    a.doc.id.cmp(&b.doc.id)
}

#[test]
fn missing_values_sort_last_with_multi_key_paging() {
    let (_d, s) = open();
    let mut x: u64 = 12345;
    let mut rnd = |m: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % m
    };
    let ops = (0..300)
        .map(|i| {
            let mut doc = json!({});
            if rnd(4) != 0 {
                doc["uid"] = json!(rnd(3));
            }
            if rnd(3) != 0 {
                doc["name"] = json!(["a", "b", "é", "\u{0}"][rnd(4) as usize]);
            }
            if rnd(5) != 0 {
                doc["size"] = json!(rnd(4) as i64 - 2);
            }
            BulkOp::Create {
                index: Idx::Entries,
                id: format!("d{i}"),
                source: doc,
            }
        })
        .collect();
    assert!(s.bulk(ops).unwrap().iter().all(|r| r.is_ok()));
    for dirs in 0..8 {
        let sort: Vec<Sort> = ["uid", "name", "size"]
            .iter()
            .enumerate()
            .map(|(i, f)| Sort {
                field: f.to_string(),
                descending: dirs & (1 << i) != 0,
            })
            .collect();
        for keys in 1..=3 {
            let sort = &sort[..keys];
            for page in [1, 7, 1000] {
                let hits = scan_all(&s, Idx::Entries, Query::MatchAll, sort.to_vec(), page);
                assert_eq!(hits.len(), 300, "{sort:?} page {page}");
                for w in hits.windows(2) {
                    assert_eq!(
                        reference_cmp(&w[0], &w[1], sort),
                        Ordering::Less,
                        "{sort:?} page {page}: {:?} then {:?}",
                        w[0].sort,
                        w[1].sort
                    );
                }
            }
        }
    }
}

#[test]
fn nul_characters_round_trip() {
    let (_d, s) = open();
    let paths = [
        "/a",
        "/a\u{0}",
        "/a\u{0}b",
        "/a\u{0}b/c",
        "/a\u{0}bc",
        "/a\u{1}",
    ];
    for p in paths {
        let id = format!("1/{p}");
        s.create(Idx::Entries, &id, &json!({"path": p, "name": p}))
            .unwrap();
        let doc = s.get(Idx::Entries, &id).unwrap().unwrap();
        assert_eq!(doc.source["path"], p);
        assert_eq!(doc.id, id);
    }
    let paths_of = |hits: Vec<Hit>| -> Vec<String> {
        hits.iter()
            .map(|h| h.doc.source["path"].as_str().unwrap().to_string())
            .collect()
    };
    let find = |q: Query| {
        paths_of(
            s.search(&req(Idx::Entries, q, vec![Sort::asc("path")], 100))
                .unwrap(),
        )
    };
    assert_eq!(find(Query::term("path", "/a\u{0}b")), strs(&["/a\u{0}b"]));
    assert_eq!(find(Query::term("name", "/a\u{0}")), strs(&["/a\u{0}"]));
    assert_eq!(
        find(Query::tree("path", "/a\u{0}b")),
        strs(&["/a\u{0}b", "/a\u{0}b/c"])
    );
    assert_eq!(
        find(prefix("path", "/a\u{0}")),
        strs(&["/a\u{0}", "/a\u{0}b", "/a\u{0}b/c", "/a\u{0}bc"])
    );
    // Byte order, NUL sorting right after the shorter string.
    let all = scan_all(
        &s,
        Idx::Entries,
        Query::MatchAll,
        vec![Sort::asc("path")],
        2,
    );
    assert_eq!(paths_of(all.clone()), strs(&paths));
    assert_eq!(all[1].sort[0], json!("/a\u{0}"));
    let mut r = req(Idx::Entries, Query::MatchAll, vec![Sort::asc("path")], 1);
    r.search_after = Some(all[2].sort.clone());
    assert_eq!(paths_of(s.search(&r).unwrap()), strs(&["/a\u{0}b/c"]));
}

#[test]
fn reopen_sees_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let (v, path) = {
        let s = EmbeddedStore::open(dir.path()).unwrap();
        let v = s.create(Idx::Entries, "1/a", &entry(1, "a", 9)).unwrap();
        s.sync().unwrap();
        s.create(Idx::Entries, "1/b", &entry(1, "b", 10)).unwrap();
        (v, dir.path().join("meta.sqlite"))
    };
    assert!(path.exists());
    let s = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(s.get(Idx::Entries, "1/a").unwrap().unwrap().version, v);
    assert_eq!(
        matching(&s, Idx::Entries, Query::term("cookie", 10)),
        strs(&["1/b"])
    );
    assert_eq!(s.describe(), format!("sqlite:{}", path.display()));
    s.refresh(Idx::Entries).unwrap();
}

#[test]
fn new_fields_are_backfilled_on_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = EmbeddedStore::open(dir.path()).unwrap();
        s.create(Idx::Entries, "a", &json!({"mode": 0o755, "uid": 1}))
            .unwrap();
        s.create(Idx::Entries, "b", &json!({"mode": [1]}))
            .unwrap_err();
    }
    {
        // Simulate a database created before `mode` was declared, holding a
        // document whose `mode` was not indexable then.
        let c = Connection::open(dir.path().join("meta.sqlite")).unwrap();
        c.execute_batch(
            "DROP INDEX IF EXISTS entries_f_mode; ALTER TABLE entries DROP COLUMN f_mode;
             INSERT INTO entries (id, seq, src) VALUES ('b', 99, '{\"mode\":[1]}');",
        )
        .unwrap();
    }
    let s = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(
        matching(&s, Idx::Entries, Query::term("mode", 0o755)),
        strs(&["a"])
    );
    assert_eq!(matching(&s, Idx::Entries, exists("mode")), strs(&["a"]));
    assert_eq!(
        matching(&s, Idx::Entries, Query::term("uid", 1)),
        strs(&["a"])
    );
}

#[test]
fn readers_run_during_a_large_bulk() {
    let (_d, s) = open();
    let s = Arc::new(s);
    s.create(Idx::Entries, "seed", &entry(0, "seed", 0))
        .unwrap();
    let n = 30_000;
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|t| {
            let (s, done) = (s.clone(), done.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                loop {
                    let finished = done.load(AtomicOrdering::SeqCst);
                    assert!(s.get(Idx::Entries, "seed").unwrap().is_some());
                    // The bulk is atomic: all of it or none.
                    let c = s.count(Idx::Entries, &Query::term("parent", 1)).unwrap();
                    assert!(c == 0 || c == n, "partial bulk visible: {c}");
                    let hits = s
                        .search(&req(
                            Idx::Entries,
                            Query::MatchAll,
                            vec![Sort::asc("cookie")],
                            50,
                        ))
                        .unwrap();
                    assert!(!hits.is_empty());
                    if t == 0 {
                        s.mget(Idx::Entries, &strs(&["seed", "1/f1"])).unwrap();
                    }
                    reads += 1;
                    if finished {
                        return reads;
                    }
                }
            })
        })
        .collect();
    let ops = (0..n)
        .map(|i| BulkOp::Create {
            index: Idx::Entries,
            id: format!("1/f{i}"),
            source: entry(1, &format!("f{i}"), i as i64 + 1),
        })
        .collect();
    let r = s.bulk(ops).unwrap();
    done.store(true, AtomicOrdering::SeqCst);
    assert!(r.iter().all(|r| r.is_ok()));
    for h in readers {
        assert!(h.join().unwrap() > 0);
    }
    assert_eq!(s.count(Idx::Entries, &Query::term("parent", 1)).unwrap(), n);
}

#[test]
fn more_threads_than_reader_connections() {
    let (_d, s) = open();
    s.create(Idx::Meta, "x", &json!({})).unwrap();
    std::thread::scope(|sc| {
        for i in 0..MAX_READERS * 3 {
            let s = &s;
            sc.spawn(move || {
                for j in 0..50 {
                    assert!(s.get(Idx::Meta, "x").unwrap().is_some());
                    if j % 10 == 0 {
                        s.put(Idx::Meta, &format!("t{i}"), &json!({"j": j}), None)
                            .unwrap();
                    }
                }
            });
        }
    });
    assert_eq!(
        s.count(Idx::Meta, &Query::MatchAll).unwrap(),
        1 + MAX_READERS as u64 * 3
    );
    assert!(s.readers.pool.lock().open <= MAX_READERS);
}

#[test]
fn hot_queries_use_indexes() {
    let (_d, s) = open();
    let plan = |idx: Idx, q: Query, sort: Vec<Sort>, after: Option<Vec<Value>>| -> Vec<String> {
        let mut filter = Sql::default();
        compile(idx, &q, &mut filter).unwrap();
        let keys = sort_keys(idx, &sort).unwrap();
        let after = after.map(|a| parse_after(&keys, &a).unwrap());
        let sql = &search_sql(idx.name(), &filter, &keys, after.as_ref(), &[], true)[0];
        let conn = s.readers.get().unwrap();
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", sql.text))
            .unwrap();
        let params = sql.params.iter().cloned().chain([SqlValue::Integer(10)]);
        stmt.query_map(rusqlite::params_from_iter(params), |r| {
            r.get::<_, String>(3)
        })
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
    };
    let no_sort = |p: &[String]| {
        p.iter()
            .all(|l| !l.contains("TEMP B-TREE") && !l.starts_with("SCAN"))
    };
    // Directory listing, first and later pages.
    let listing = || (Query::term("parent", 1), vec![Sort::asc("cookie")]);
    let (q, sort) = listing();
    let p = plan(Idx::Entries, q, sort, None);
    assert!(
        no_sort(&p) && p.iter().any(|l| l.contains("entries_f_parent")),
        "{p:?}"
    );
    let (q, sort) = listing();
    let p = plan(Idx::Entries, q, sort, Some(vec![json!(5), json!("1/x")]));
    assert!(
        no_sort(&p) && p.iter().any(|l| l.contains("entries_f_parent")),
        "{p:?}"
    );
    // The same, Elasticsearch-style (`search_after` without the id).
    let (q, sort) = listing();
    let p = plan(Idx::Entries, q, sort, Some(vec![json!(5)]));
    assert!(
        no_sort(&p) && p.iter().any(|l| l.contains("entries_f_parent")),
        "{p:?}"
    );
    // Subtree scan in path order.
    let p = plan(
        Idx::Entries,
        Query::tree("path", "/a"),
        vec![Sort::asc("path")],
        Some(vec![json!("/a/b"), json!("x")]),
    );
    assert!(
        no_sort(&p) && p.iter().any(|l| l.contains("entries_f_path")),
        "{p:?}"
    );
    // Id paging.
    let p = plan(Idx::Inodes, Query::MatchAll, vec![], Some(vec![json!("5")]));
    assert!(!p.iter().any(|l| l.contains("TEMP B-TREE")), "{p:?}");
    // fsck's full scan in (parent, cookie) order.
    let p = plan(
        Idx::Entries,
        Query::MatchAll,
        vec![Sort::asc("parent"), Sort::asc("cookie")],
        Some(vec![json!(1), json!(5), json!("1/x")]),
    );
    assert!(
        p.iter().any(|l| l.contains("entries_f_parent"))
            && !p.iter().any(|l| l.starts_with("SCAN")),
        "{p:?}"
    );
}

/// Rough write throughput: `cargo test --release -- --ignored --nocapture`.
#[test]
#[ignore]
fn write_throughput() {
    let (_d, s) = open();
    let n = 20_000;
    let t = std::time::Instant::now();
    for i in 0..n {
        let v = s
            .create(
                Idx::Entries,
                &format!("1/f{i}"),
                &entry(1, &format!("f{i}"), i),
            )
            .unwrap();
        s.put(
            Idx::Inodes,
            &format!("{i}"),
            &json!({"kind": "file", "nlink": 1}),
            None,
        )
        .unwrap();
        if i % 2 == 0 {
            s.put(
                Idx::Entries,
                &format!("1/f{i}"),
                &entry(1, &format!("f{i}"), i),
                Some(v),
            )
            .unwrap();
        }
    }
    let e = t.elapsed();
    println!(
        "{} single writes in {e:?}: {:.0}/s",
        n * 5 / 2,
        (n * 5 / 2) as f64 / e.as_secs_f64()
    );
    let t = std::time::Instant::now();
    for i in 0..n {
        s.get(Idx::Entries, &format!("1/f{i}")).unwrap().unwrap();
    }
    println!("{n} gets in {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let hits = scan_all(
        &s,
        Idx::Entries,
        Query::term("parent", 1),
        vec![Sort::asc("cookie")],
        1000,
    );
    assert_eq!(hits.len(), n as usize);
    println!("listing {n} in {:?}", t.elapsed());
}
