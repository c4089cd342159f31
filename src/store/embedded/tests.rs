//! Tests of the embedded store's own behaviour: SQLite internals (schema,
//! backfill, indexes, reader pool), store-wide seq_nos across reopen, the
//! id tiebreaker, where it is stricter than Elasticsearch. The store
//! contract every engine meets is tested in `tests/store_conformance.rs`.

use super::query::{Sql, compile, parse_after, prefix_end, search_sql, sort_keys};
use super::*;
use crate::store::{Sort, scan};
use rusqlite::types::Value as SqlValue;
use serde_json::json;
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
        past_own_writes: false,
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

fn exists(field: &str) -> Query {
    Query::Exists {
        field: field.into(),
    }
}

fn is_invalid<T: std::fmt::Debug>(r: StoreResult<T>) -> bool {
    matches!(r, Err(StoreError::Invalid(_)))
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

/// The embedded store is stricter than Elasticsearch: a declared field holds
/// one value (no arrays, which Elasticsearch would index as several) and a
/// long an integral one (Elasticsearch truncates 1.5); an empty id is
/// `Invalid` for every request, and a too-long one for a delete (which
/// OpenSearch answers "not found"); a null `search_after` value is
/// "missing", so nothing follows it (the engines refuse it).
#[test]
fn stricter_than_elasticsearch() {
    let (_d, s) = open();
    for bad in [json!({"name": ["x", "y"]}), json!({"size": 1.5})] {
        assert!(is_invalid(s.create(Idx::Entries, "a", &bad)), "{bad}");
    }
    assert!(is_invalid(s.get(Idx::Entries, "")));
    assert!(is_invalid(s.put(Idx::Meta, "", &json!({}), None)));
    let long = "x".repeat(MAX_ID_BYTES + 1);
    assert!(is_invalid(s.delete(Idx::Meta, &long, None)));
    let r = s
        .bulk(vec![BulkOp::Create {
            index: Idx::Meta,
            id: long,
            source: json!({}),
        }])
        .unwrap();
    assert!(is_invalid(r[0].clone()));
    assert_eq!(s.count(Idx::Meta, &Query::MatchAll).unwrap(), 0);
    s.create(Idx::Entries, "e", &json!({"parent": 1})).unwrap();
    s.create(Idx::Entries, "f", &json!({"parent": 1, "cookie": 1}))
        .unwrap();
    let mut r = req(Idx::Entries, Query::MatchAll, vec![Sort::asc("cookie")], 10);
    r.search_after = Some(vec![Value::Null]);
    assert!(s.search(&r).unwrap().is_empty());
}

#[test]
fn prefix_end_bumps_the_last_char_that_can_be() {
    assert_eq!(prefix_end("ab"), Some("ac".into()));
    assert_eq!(prefix_end("a\u{10FFFF}"), Some("b".into()));
    assert_eq!(prefix_end("\u{10FFFF}"), None);
    assert_eq!(prefix_end("\u{D7FF}"), Some("\u{E000}".into()));
}

/// Hits end their sort values with the id, which also orders a search
/// without a sort (and breaks ties: `duplicate_sort_values_tie_break_on_id`).
#[test]
fn hits_sort_by_id_by_default_and_end_with_it() {
    let (_d, s) = open();
    for (i, name) in ["c", "a", "b"].iter().enumerate() {
        s.create(
            Idx::Entries,
            &format!("1/{name}"),
            &entry(1, name, i as i64),
        )
        .unwrap();
    }
    let by_id = scan_all(&s, Idx::Entries, Query::MatchAll, vec![], 2);
    assert_eq!(ids(&by_id), strs(&["1/a", "1/b", "1/c"]));
    assert_eq!(by_id[0].sort, vec![json!("1/a")]);
    let by_cookie = scan_all(
        &s,
        Idx::Entries,
        Query::MatchAll,
        vec![Sort::asc("cookie")],
        2,
    );
    assert_eq!(by_cookie[0].sort, vec![json!(0), json!("1/c")]);
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
