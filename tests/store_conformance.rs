//! One conformance suite for the `MetaStore` trait, run against every
//! backend: the embedded SQLite store, the Elasticsearch backend talking to
//! the wire-protocol test double, and a real cluster when `ESFS_TEST_ES_URL` is
//! set. The filesystem relies on exactly these behaviours. `conformance` walks
//! one store through them; the contract tests after it (`CONTRACT`) each run
//! on a fresh store of every engine.

use es_test_server::EsTestServer;
use esfs::store::embedded::EmbeddedStore;
use esfs::store::es::{EsConfig, EsStore};
use esfs::store::{
    BulkOp, Hit, Idx, MAX_ID_BYTES, MetaStore, Query, Rebased, SearchRequest, Sort, StoreError,
    StoreResult, Version, scan,
};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh index prefix per test, so tests never share documents.
fn prefix() -> String {
    format!(
        "conf{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

fn entry(parent: u64, name: &str, path: &str, cookie: u64) -> serde_json::Value {
    json!({"parent": parent, "name": name, "path": path, "dir": "/", "ino": cookie,
           "kind": "file", "cookie": cookie, "size": cookie * 10, "mtime": 0,
           "mode": 0o644, "uid": 0, "gid": 0})
}

fn conformance(s: &dyn MetaStore) {
    // Realtime get, create conflicts, versions.
    assert_eq!(s.get(Idx::Inodes, "1").unwrap(), None);
    let v1 = s
        .create(Idx::Inodes, "1", &json!({"kind": "file"}))
        .unwrap();
    assert!(matches!(
        s.create(Idx::Inodes, "1", &json!({"kind": "dir"})),
        Err(StoreError::Conflict(_))
    ));
    let doc = s.get(Idx::Inodes, "1").unwrap().unwrap();
    assert_eq!(
        (doc.version, doc.source["kind"].clone()),
        (v1, json!("file"))
    );
    let v2 = s
        .put(Idx::Inodes, "1", &json!({"kind": "dir"}), Some(v1))
        .unwrap();
    assert_ne!(v1, v2);
    assert!(matches!(
        s.put(Idx::Inodes, "1", &json!({"kind": "x"}), Some(v1)),
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        s.put(Idx::Inodes, "missing", &json!({}), Some(v1)),
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        s.delete(Idx::Inodes, "1", Some(v1)),
        Err(StoreError::Conflict(_))
    ));
    assert!(s.delete(Idx::Inodes, "1", Some(v2)).unwrap());
    assert!(!s.delete(Idx::Inodes, "1", None).unwrap());
    // Ids: '/' and non-ASCII are fine; over 512 bytes is refused.
    s.create(Idx::Inodes, "7/é x", &json!({"kind": "file"}))
        .unwrap();
    assert!(s.get(Idx::Inodes, "7/é x").unwrap().is_some());
    assert!(s.create(Idx::Inodes, &"x".repeat(513), &json!({})).is_err());

    // mget keeps order and reports misses.
    let got = s
        .mget(Idx::Inodes, &["7/é x".into(), "nope".into()])
        .unwrap();
    assert!(got[0].is_some() && got[1].is_none());

    // Bulk: per-item results in order; a failure does not stop the rest.
    let res = s
        .bulk(vec![
            BulkOp::Create {
                index: Idx::Entries,
                id: "1/a".into(),
                source: entry(1, "a", "/a", 101),
            },
            BulkOp::Create {
                index: Idx::Entries,
                id: "1/a".into(),
                source: entry(1, "a", "/a", 101),
            },
            BulkOp::Create {
                index: Idx::Entries,
                id: "1/ab".into(),
                source: entry(1, "ab", "/ab", 102),
            },
            BulkOp::Delete {
                index: Idx::Entries,
                id: "1/none".into(),
                if_version: None,
            },
            BulkOp::Create {
                index: Idx::Entries,
                id: "5/c".into(),
                source: entry(5, "c", "/a/c", 103),
            },
            BulkOp::Create {
                index: Idx::Entries,
                id: "6/d".into(),
                source: entry(6, "d", "/a/c/d", 104),
            },
        ])
        .unwrap();
    assert!(res[0].is_ok());
    assert!(matches!(res[1], Err(StoreError::Conflict(_))));
    assert!(res[2].is_ok());
    assert!(matches!(res[3], Err(StoreError::NotFound(_))));
    assert!(res[4].is_ok() && res[5].is_ok());

    // Search sees this client's own writes (refresh as needed), path.tree
    // selects exactly a subtree, sorting and search_after page exactly.
    let paths = |q: Query| -> Vec<String> {
        let mut out = Vec::new();
        scan(s, Idx::Entries, q, vec![Sort::asc("path")], 2, |hits| {
            out.extend(
                hits.iter()
                    .map(|h| h.doc.source["path"].as_str().unwrap().to_string()),
            );
            Ok(true)
        })
        .unwrap();
        out
    };
    assert_eq!(paths(Query::tree("path", "/a")), ["/a", "/a/c", "/a/c/d"]);
    assert_eq!(paths(Query::term("parent", 1)), ["/a", "/ab"]);
    assert_eq!(
        paths(Query::Range {
            field: "size".into(),
            gte: Some(1025.into()),
            gt: None,
            lte: None,
            lt: Some(1041.into())
        }),
        ["/a/c", "/a/c/d"]
    );
    assert_eq!(
        paths(Query::Bool {
            must: vec![Query::tree("path", "/a")],
            must_not: vec![Query::term("path", "/a")],
            should: vec![],
        }),
        ["/a/c", "/a/c/d"]
    );
    assert_eq!(s.count(Idx::Entries, &Query::tree("path", "/")).unwrap(), 4);
    // Sort by a numeric field, resuming from a value alone (readdir does).
    let page = s
        .search(&SearchRequest {
            past_own_writes: false,
            index: Idx::Entries,
            query: Query::MatchAll,
            sort: vec![Sort::asc("cookie")],
            search_after: Some(vec![json!(102)]),
            size: 10,
        })
        .unwrap();
    let cookies: Vec<u64> = page
        .iter()
        .map(|h| h.doc.source["cookie"].as_u64().unwrap())
        .collect();
    assert_eq!(cookies, [103, 104]);
    // Hits carry versions usable for conditional writes.
    let h = &page[0];
    s.put(Idx::Entries, &h.doc.id, &h.doc.source, Some(h.doc.version))
        .unwrap();

    // More than the 10k result window, paged completely.
    let n = 10_500u64;
    let ops = (0..n)
        .map(|i| BulkOp::Create {
            index: Idx::Entries,
            id: format!("9/f{i}"),
            source: entry(9, &format!("f{i}"), &format!("/big/f{i:05}"), 1000 + i),
        })
        .collect();
    assert!(s.bulk(ops).unwrap().iter().all(|r| r.is_ok()));
    partial_updates(s);
    text_search(s);
    rebased_paths(s);
    let mut seen = 0u64;
    let mut last = 0u64;
    scan(
        s,
        Idx::Entries,
        Query::term("parent", 9),
        vec![Sort::asc("cookie")],
        1000,
        |hits| {
            for h in hits {
                let c = h.doc.source["cookie"].as_u64().unwrap();
                assert!(c > last);
                last = c;
                seen += 1;
            }
            Ok(true)
        },
    )
    .unwrap();
    assert_eq!(seen, n);
}

/// `BulkOp::Update` (a subtree rename's path rewrite): named fields change,
/// the others stay; versions are checked.
fn partial_updates(s: &dyn MetaStore) {
    let mut doc = entry(77, "u", "/old/u", 7001);
    doc["size"] = json!(4321);
    let v = s.create(Idx::Entries, "77/u", &doc).unwrap();
    let update = |if_version, id: &str| BulkOp::Update {
        index: Idx::Entries,
        id: id.to_string(),
        doc: json!({"path": "/new/u", "dir": "/new"}),
        if_version,
    };
    let r = s
        .bulk(vec![update(Some(v), "77/u"), update(None, "77/absent")])
        .unwrap();
    let v2 = *r[0].as_ref().unwrap();
    assert_ne!(v, v2);
    assert!(matches!(r[1], Err(StoreError::NotFound(_))), "{:?}", r[1]);
    let got = s.get(Idx::Entries, "77/u").unwrap().unwrap();
    assert_eq!(got.version, v2);
    assert_eq!(got.source["path"], json!("/new/u"));
    assert_eq!(got.source["dir"], json!("/new"));
    assert_eq!(got.source["name"], json!("u"));
    assert_eq!(got.source["size"], json!(4321));
    // Stale version: nothing changes.
    let r = s.bulk(vec![update(Some(v), "77/u")]).unwrap();
    assert!(matches!(r[0], Err(StoreError::Conflict(_))), "{:?}", r[0]);
    s.refresh(Idx::Entries).unwrap();
    // Indexed fields follow the update; the others still match.
    let ids = |q: Query| -> Vec<String> {
        s.search_brief(&SearchRequest {
            past_own_writes: false,
            index: Idx::Entries,
            query: q,
            sort: vec![Sort::asc("cookie")],
            search_after: None,
            size: 10,
        })
        .unwrap()
        .into_iter()
        .map(|h| h.doc.id)
        .collect()
    };
    assert_eq!(ids(Query::tree("path", "/new")), ["77/u"]);
    assert!(ids(Query::tree("path", "/old")).is_empty());
    assert_eq!(ids(Query::term("size", 4321)), ["77/u"]);
    s.delete(Idx::Entries, "77/u", None).unwrap();
}

/// `Text` fields (a file's text in `texts`): any substring of three or
/// more characters matches, case-folded; brief reads leave the text out,
/// full ones carry it; a partial update keeps it.
fn text_search(s: &dyn MetaStore) {
    let v = s
        .create(
            Idx::Texts,
            "9001",
            &json!({"ino": 9001, "mtime_ns": 1, "contents": "A Needle in the text"}),
        )
        .unwrap();
    s.create(
        Idx::Texts,
        "9002",
        &json!({"ino": 9002, "mtime_ns": 1, "contents": "hay only"}),
    )
    .unwrap();
    let r = s
        .bulk(vec![BulkOp::Update {
            index: Idx::Texts,
            id: "9001".into(),
            doc: json!({"mtime_ns": 2}),
            if_version: Some(v),
        }])
        .unwrap();
    assert!(r[0].is_ok(), "{:?}", r[0]);
    s.refresh(Idx::Texts).unwrap();
    let text = |t: &str| Query::Text {
        field: "contents".into(),
        text: t.into(),
    };
    assert_eq!(matching(s, Idx::Texts, text("needle")), ["9001"]);
    assert_eq!(matching(s, Idx::Texts, text("EDLE IN")), ["9001"]);
    assert!(matching(s, Idx::Texts, text("needles")).is_empty());
    let full = s.get(Idx::Texts, "9001").unwrap().unwrap();
    assert_eq!(full.source["contents"], json!("A Needle in the text"));
    assert_eq!(full.source["mtime_ns"], json!(2));
    let brief = s.get_brief(Idx::Texts, "9001").unwrap().unwrap();
    assert!(brief.source.get("contents").is_none(), "{:?}", brief.source);
    for id in ["9001", "9002"] {
        s.delete(Idx::Texts, id, None).unwrap();
    }
}

/// A size told apart per id (for `rebased_paths`: a field the rebase keeps).
fn size_of(id: &str) -> u64 {
    id.bytes().map(u64::from).sum()
}

/// `rebase_paths` (a directory rename done inside the store), where a
/// backend offers it: exactly the documents strictly below the old path
/// move, each with a new version; everything else about them stays.
fn rebased_paths(s: &dyn MetaStore) {
    let put = |id: &str, path: &str, dir: &str| {
        let mut d = entry(88, id, path, 8000 + id.len() as u64);
        d["dir"] = json!(dir);
        d["size"] = json!(size_of(id));
        s.create(Idx::Entries, id, &d).unwrap()
    };
    let top = put("88/a", "/rb/a", "/rb");
    let x = put("88/x", "/rb/a/x", "/rb/a");
    put("88/f", "/rb/a/x/\u{e9}t\u{e9}", "/rb/a/x");
    put("88/sib", "/rb/a-b", "/rb");
    put("88/sib2", "/rb/ab/c", "/rb/ab");
    // Cached copies (a cache in front must drop them).
    for id in ["88/a", "88/x", "88/f", "88/sib"] {
        s.get(Idx::Entries, id).unwrap().unwrap();
    }
    let Some(Rebased { count: n, .. }) = s
        .rebase_paths(Idx::Entries, "/rb/a", "/rb/n\u{e9}w")
        .unwrap()
    else {
        eprintln!(
            "{}: no store-side rebase; renames scan and bulk-update",
            s.describe()
        );
        for id in ["88/a", "88/x", "88/f", "88/sib", "88/sib2"] {
            s.delete(Idx::Entries, id, None).unwrap();
        }
        return;
    };
    assert_eq!(n, 2);
    let get = |id: &str| s.get(Idx::Entries, id).unwrap().unwrap();
    let (a, xd, f) = (get("88/a"), get("88/x"), get("88/f"));
    assert_eq!(a.version, top, "the renamed path itself is not below it");
    assert_eq!(a.source["path"], json!("/rb/a"));
    assert_ne!(xd.version, x);
    assert_eq!(xd.source["path"], json!("/rb/n\u{e9}w/x"));
    assert_eq!(xd.source["dir"], json!("/rb/n\u{e9}w"));
    assert_eq!(f.source["path"], json!("/rb/n\u{e9}w/x/\u{e9}t\u{e9}"));
    assert_eq!(f.source["dir"], json!("/rb/n\u{e9}w/x"));
    assert_eq!(f.source["size"], json!(size_of("88/f")));
    assert_eq!(f.source["name"], json!("88/f"));
    assert_ne!(xd.version, f.version, "every document its own version");
    assert_eq!(get("88/sib").source["path"], json!("/rb/a-b"));
    assert_eq!(get("88/sib2").source["path"], json!("/rb/ab/c"));
    // The old version is stale now.
    let r = s
        .bulk(vec![BulkOp::Delete {
            index: Idx::Entries,
            id: "88/x".into(),
            if_version: Some(x),
        }])
        .unwrap();
    assert!(matches!(r[0], Err(StoreError::Conflict(_))), "{:?}", r[0]);
    s.refresh(Idx::Entries).unwrap();
    let paths = |p: &str| -> Vec<String> {
        let mut v: Vec<String> = s
            .search_brief(&SearchRequest {
                past_own_writes: false,
                index: Idx::Entries,
                query: Query::tree("path", p),
                sort: vec![Sort::asc("path")],
                search_after: None,
                size: 10,
            })
            .unwrap()
            .into_iter()
            .map(|h| h.doc.source["path"].as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(paths("/rb/a"), ["/rb/a"]);
    assert_eq!(
        paths("/rb/n\u{e9}w"),
        ["/rb/n\u{e9}w/x", "/rb/n\u{e9}w/x/\u{e9}t\u{e9}"]
    );
    assert_eq!(
        s.count(Idx::Entries, &Query::term("size", size_of("88/f")))
            .unwrap(),
        1
    );
    for id in ["88/a", "88/x", "88/f", "88/sib", "88/sib2"] {
        s.delete(Idx::Entries, id, None).unwrap();
    }
}

#[test]
fn embedded_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    conformance(&EmbeddedStore::open(dir.path()).unwrap());
    run_contract("embedded", fresh_embedded);
}

/// The document cache in front of the embedded store (every mount of it)
/// must not change any behaviour.
#[test]
fn cached_embedded_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let inner = std::sync::Arc::new(EmbeddedStore::open(dir.path()).unwrap());
    conformance(&esfs::store::cache::CachedStore::new(
        inner,
        1 << 20,
        1 << 20,
    ));
    run_contract("cached embedded", fresh_cached_embedded);
}

/// One batch's writes are visible to reads inside it and to other threads,
/// and are committed (seen by another connection) once it ends.
#[test]
fn embedded_batches_commit_at_their_end() {
    let dir = tempfile::tempdir().unwrap();
    let s = EmbeddedStore::open(dir.path()).unwrap();
    // Another connection to the same database: sees committed data only.
    let other = EmbeddedStore::open(dir.path()).unwrap();
    let b = s.begin_batch().unwrap();
    b.create(Idx::Meta, "a", &json!({"n": 1})).unwrap();
    b.put(Idx::Meta, "b", &json!({"n": 2}), None).unwrap();
    assert!(s.get(Idx::Meta, "a").unwrap().is_some());
    std::thread::scope(|sc| {
        sc.spawn(|| assert!(s.get(Idx::Meta, "b").unwrap().is_some()));
    });
    assert!(
        other.get(Idx::Meta, "a").unwrap().is_none(),
        "not committed yet"
    );
    // Opening the store (`esfs fsck`, `esfs search` beside a busy mount)
    // needs no write lock: it does not wait for the open transaction.
    let third = EmbeddedStore::open(dir.path()).unwrap();
    assert!(third.get(Idx::Meta, "a").unwrap().is_none());
    b.end_batch().unwrap();
    assert!(other.get(Idx::Meta, "a").unwrap().is_some());
    assert!(other.get(Idx::Meta, "b").unwrap().is_some());
    // Outside a batch every write commits at once.
    s.create(Idx::Meta, "c", &json!({})).unwrap();
    assert!(other.get(Idx::Meta, "c").unwrap().is_some());
}

#[test]
fn elasticsearch_backend_conforms_against_the_test_server() {
    let server = EsTestServer::start("127.0.0.1:0").unwrap();
    let store = EsStore::connect(&EsConfig::new(&server.url(), &prefix())).unwrap();
    conformance(&store);
    run_contract("test double", || fresh_es(&server.url()));
}

#[test]
fn elasticsearch_backend_conforms_against_a_real_cluster_if_given() {
    let Ok(url) = std::env::var("ESFS_TEST_ES_URL") else {
        eprintln!("ESFS_TEST_ES_URL not set: no real cluster to test against");
        return;
    };
    let store = EsStore::connect(&EsConfig::new(&url, &prefix())).unwrap();
    conformance(&store);
    run_contract(&url, || fresh_es(&url));
}

// ---------------------------------------------------------------------------
// The store contract, test by test: each runs on a fresh, empty store of
// every engine (see `run_contract`). Moved here from the embedded store's
// unit tests, which ran them on SQLite only.

type Contract = (&'static str, fn(&dyn MetaStore));

const CONTRACT: &[Contract] = &[
    ("get_and_mget_are_realtime", get_and_mget_are_realtime),
    (
        "create_conflicts_on_existing_id",
        create_conflicts_on_existing_id,
    ),
    ("put_with_if_version", put_with_if_version),
    ("delete_semantics", delete_semantics),
    (
        "ids_are_validated_like_elasticsearch",
        ids_are_validated_like_elasticsearch,
    ),
    (
        "sources_and_fields_are_validated",
        sources_and_fields_are_validated,
    ),
    (
        "bulk_items_fail_independently_in_order",
        bulk_items_fail_independently_in_order,
    ),
    ("tree_query", tree_query),
    ("prefix_query", prefix_query),
    ("term_and_terms_queries", term_and_terms_queries),
    ("range_and_exists_queries", range_and_exists_queries),
    ("bool_query", bool_query),
    ("count_matches_queries", count_matches_queries),
    (
        "paging_visits_every_doc_once_in_order",
        paging_visits_every_doc_once_in_order,
    ),
    (
        "search_after_without_id_is_strict_like_elasticsearch",
        search_after_without_id_is_strict_like_elasticsearch,
    ),
    (
        "missing_values_sort_last_with_multi_key_paging",
        missing_values_sort_last_with_multi_key_paging,
    ),
    ("nul_characters_round_trip", nul_characters_round_trip),
];

/// Runs every contract test on a fresh store from `fresh` (the store, then
/// whatever must outlive it), and fails naming every test that failed.
fn run_contract(engine: &str, fresh: impl Fn() -> (Box<dyn MetaStore>, Option<tempfile::TempDir>)) {
    let mut failed = Vec::new();
    for (name, test) in CONTRACT {
        let (store, _dir) = fresh();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&*store)));
        if r.is_err() {
            eprintln!("{engine}: {name} FAILED");
            failed.push(*name);
        }
    }
    assert!(
        failed.is_empty(),
        "{engine}: contract tests failed: {failed:?}"
    );
}

fn fresh_embedded() -> (Box<dyn MetaStore>, Option<tempfile::TempDir>) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("store")).unwrap();
    (Box::new(store), Some(dir))
}

fn fresh_cached_embedded() -> (Box<dyn MetaStore>, Option<tempfile::TempDir>) {
    let dir = tempfile::tempdir().unwrap();
    let inner = std::sync::Arc::new(EmbeddedStore::open(&dir.path().join("store")).unwrap());
    let store = esfs::store::cache::CachedStore::new(inner, 1 << 20, 1 << 20);
    (Box::new(store), Some(dir))
}

fn fresh_es(url: &str) -> (Box<dyn MetaStore>, Option<tempfile::TempDir>) {
    let store = EsStore::connect(&EsConfig::new(url, &prefix())).unwrap();
    (Box::new(store), None)
}

fn doc(parent: u64, name: &str, cookie: i64) -> Value {
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

/// Ids matching `q`, in id order; the count agrees.
fn matching(s: &dyn MetaStore, index: Idx, q: Query) -> Vec<String> {
    let hits = s.search(&req(index, q.clone(), vec![], 10_000)).unwrap();
    assert_eq!(s.count(index, &q).unwrap(), hits.len() as u64, "{q:?}");
    let mut ids = ids(&hits);
    ids.sort();
    ids
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

fn prefix_q(field: &str, value: &str) -> Query {
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
fn scan_all(s: &dyn MetaStore, index: Idx, q: Query, sort: Vec<Sort>, page: usize) -> Vec<Hit> {
    let mut all = Vec::new();
    scan(s, index, q, sort, page, |hits| {
        assert!(hits.len() <= page);
        all.extend(hits);
        Ok(true)
    })
    .unwrap();
    all
}

fn get_and_mget_are_realtime(s: &dyn MetaStore) {
    assert_eq!(s.get(Idx::Entries, "1/a").unwrap(), None);
    let v1 = s.create(Idx::Entries, "1/a", &doc(1, "a", 1)).unwrap();
    assert_eq!(v1.primary_term, 1);
    let got = s.get(Idx::Entries, "1/a").unwrap().unwrap();
    assert_eq!(got.id, "1/a");
    assert_eq!(got.version, v1);
    assert_eq!(*got.source, doc(1, "a", 1));

    s.create(Idx::Entries, "1/b", &doc(1, "b", 2)).unwrap();
    let v2 = s.put(Idx::Entries, "1/a", &doc(1, "a", 3), None).unwrap();
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
    // An id too long to exist is simply absent; an empty one is an error
    // (`Invalid` on the embedded store; the Elasticsearch backend passes it
    // on and the engine's HTTP 405 comes back as `Other`).
    assert_eq!(s.get(Idx::Entries, &"x".repeat(600)).unwrap(), None);
    let r = s.get(Idx::Entries, "");
    assert!(r.is_err(), "{r:?}");
    assert!(s.mget(Idx::Entries, &[]).unwrap().is_empty());
    // Across indices in one call, in order.
    let vi = s.create(Idx::Inodes, "7", &json!({"x": 1})).unwrap();
    let keys = [
        (Idx::Inodes, "7".to_string()),
        (Idx::Entries, "1/b".to_string()),
        (Idx::Inodes, "1/a".to_string()),
        (Idx::Entries, "1/a".to_string()),
    ];
    let got = s.mget_docs(&keys, false).unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(got[0].as_ref().unwrap().version, vi);
    assert_eq!(got[1].as_ref().unwrap().source["name"], "b");
    assert!(got[2].is_none());
    assert_eq!(got[3].as_ref().unwrap().version, v2);
}

fn create_conflicts_on_existing_id(s: &dyn MetaStore) {
    let v = s.create(Idx::Inodes, "7", &json!({"kind": "dir"})).unwrap();
    assert!(conflict(s.create(
        Idx::Inodes,
        "7",
        &json!({"kind": "file"})
    )));
    let got = s.get(Idx::Inodes, "7").unwrap().unwrap();
    assert_eq!(got.version, v);
    assert_eq!(got.source["kind"], "dir");
}

fn put_with_if_version(s: &dyn MetaStore) {
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
        primary_term: v2.primary_term + 1,
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

fn delete_semantics(s: &dyn MetaStore) {
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

fn ids_are_validated_like_elasticsearch(s: &dyn MetaStore) {
    let max = "é".repeat(MAX_ID_BYTES / 2);
    assert_eq!(max.len(), MAX_ID_BYTES);
    s.create(Idx::Meta, &max, &json!({})).unwrap();
    assert!(s.get(Idx::Meta, &max).unwrap().is_some());
    let long = format!("{max}x");
    assert!(is_invalid(s.create(Idx::Meta, &long, &json!({}))));
    assert!(is_invalid(s.put(Idx::Meta, &long, &json!({}), None)));
    // Elasticsearch refuses to delete it; OpenSearch answers "not found".
    let r = s.delete(Idx::Meta, &long, None);
    assert!(is_invalid(r.clone()) || r == Ok(false), "{r:?}");
    // An empty id: refused (see `get_and_mget_are_realtime` on the error).
    let r = s.create(Idx::Meta, "", &json!({}));
    assert!(r.is_err(), "{r:?}");
    // (Not `put` with an empty id: the Elasticsearch backend sends it as
    // `POST /<index>/_doc/`, which creates a document under a generated id.)
    let r = s.delete(Idx::Meta, "", None);
    assert!(r.is_err(), "{r:?}");
    assert_eq!(
        s.count(Idx::Meta, &Query::MatchAll).unwrap(),
        1,
        "nothing else written"
    );
    // In a bulk: that item fails (embedded store), or the whole request
    // (Elasticsearch validates every item before running any).
    let r = s.bulk(vec![BulkOp::Create {
        index: Idx::Meta,
        id: long,
        source: json!({}),
    }]);
    match r {
        Ok(items) => assert!(is_invalid(items[0].clone()), "{items:?}"),
        Err(e) => assert!(matches!(e, StoreError::Invalid(_)), "{e:?}"),
    }
}

fn sources_and_fields_are_validated(s: &dyn MetaStore) {
    for bad in [json!([1]), json!("x"), json!(3), Value::Null] {
        assert!(is_invalid(s.create(Idx::Meta, "a", &bad)), "{bad}");
        assert!(is_invalid(s.put(Idx::Meta, "a", &bad, None)), "{bad}");
    }
    for bad in [
        (Idx::Entries, json!({"size": {"a": 1}})),
        (Idx::Entries, json!({"size": "big"})),
        (Idx::Inodes, json!({"orphan": 1})),
        (Idx::Entries, json!({"size": u64::MAX})),
    ] {
        assert!(is_invalid(s.create(bad.0, "a", &bad.1)), "{}", bad.1);
    }
    assert_eq!(s.get(Idx::Entries, "a").unwrap(), None);
    // Undeclared keys may hold anything; declared ones coerce like ES.
    s.create(
        Idx::Entries,
        "a",
        &json!({"extra": {"k": [1, 2]}, "size": "42", "mtime": 7.0, "kind": 5, "name": null}),
    )
    .unwrap();
    assert_eq!(
        matching(s, Idx::Entries, Query::term("size", 42)),
        strs(&["a"])
    );
    assert_eq!(
        matching(s, Idx::Entries, Query::term("mtime", 7)),
        strs(&["a"])
    );
    assert_eq!(
        matching(s, Idx::Entries, Query::term("kind", "5")),
        strs(&["a"])
    );
    assert!(matching(s, Idx::Entries, exists("name")).is_empty());
    s.create(Idx::Inodes, "b", &json!({"orphan": "true"}))
        .unwrap();
    assert_eq!(
        matching(s, Idx::Inodes, Query::term("orphan", true)),
        strs(&["b"])
    );
}

fn bulk_items_fail_independently_in_order(s: &dyn MetaStore) {
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
                primary_term: v.primary_term,
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
            source: doc(1, "x", 1),
        },
    ];
    let r = s.bulk(ops).unwrap();
    assert_eq!(r.len(), 8);
    assert!(r[0].is_ok());
    assert!(conflict(r[1].clone()), "{:?}", r[1]);
    assert!(conflict(r[2].clone()), "{:?}", r[2]);
    assert!(matches!(r[3], Err(StoreError::NotFound(_))), "{:?}", r[3]);
    assert!(is_invalid(r[4].clone()), "{:?}", r[4]);
    // Within an index, in order (seq_nos are per index in Elasticsearch).
    let oks: Vec<u64> = [0, 5, 6]
        .iter()
        .map(|&i| r[i].clone().unwrap().seq_no)
        .collect();
    assert!(oks.windows(2).all(|w| w[0] < w[1]));
    assert!(r[7].is_ok());
    let one = s.get(Idx::Inodes, "1").unwrap().unwrap();
    assert_eq!(one.source["kind"], "fifo");
    assert_eq!(one.version, r[5].clone().unwrap());
    assert_eq!(s.get(Idx::Inodes, "2").unwrap(), None);
    assert_eq!(s.get(Idx::Inodes, "3").unwrap(), None);
    assert!(s.get(Idx::Entries, "1/x").unwrap().is_some());
    assert!(s.bulk(vec![]).unwrap().is_empty());
}

fn path_store(s: &dyn MetaStore) {
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
}

fn tree_query(s: &dyn MetaStore) {
    path_store(s);
    let tree = |p: &str| matching(s, Idx::Entries, Query::tree("path", p));
    assert_eq!(tree("/a/b"), strs(&["/a/b", "/a/b/c", "/a/b/c/d"]));
    assert_eq!(tree("/a/b/c/d"), strs(&["/a/b/c/d"]));
    assert_eq!(
        tree("/a"),
        strs(&[
            "/a", "/a/b", "/a/b-x", "/a/b.x", "/a/b/c", "/a/b/c/d", "/a/bc"
        ])
    );
    // Every absolute path. (A relative one, which the filesystem never
    // stores, is outside the contract: Elasticsearch's `exists` includes
    // it, the embedded store's path range does not.)
    let mut root = tree("/");
    root.retain(|p| p.starts_with('/'));
    assert_eq!(
        root,
        strs(&[
            "/a", "/a/b", "/a/b-x", "/a/b.x", "/a/b/c", "/a/b/c/d", "/a/bc", "/ab", "/b"
        ])
    );
    assert!(tree("/zz").is_empty());
    assert_eq!(tree("rel"), strs(&["rel/x"]));
}

fn prefix_query(s: &dyn MetaStore) {
    path_store(s);
    let pre = |p: &str| matching(s, Idx::Entries, prefix_q("path", p));
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
                prefix_q("kind", p),
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
    assert!(is_invalid(s.count(Idx::Entries, &prefix_q("size", "1"))));
}

fn numbers_store(s: &dyn MetaStore) {
    for i in 0..10i64 {
        let mut doc = json!({"ino": i, "kind": if i % 2 == 0 { "file" } else { "dir" }});
        if i % 3 != 0 {
            doc["size"] = json!(i * 100 - 500);
        }
        s.create(Idx::Entries, &format!("e{i}"), &doc).unwrap();
    }
}

fn term_and_terms_queries(s: &dyn MetaStore) {
    numbers_store(s);
    assert_eq!(
        matching(s, Idx::Entries, Query::term("ino", 4)),
        strs(&["e4"])
    );
    assert_eq!(
        matching(s, Idx::Entries, Query::term("size", -300)),
        strs(&["e2"])
    );
    assert_eq!(
        matching(s, Idx::Entries, Query::term("kind", "dir")),
        strs(&["e1", "e3", "e5", "e7", "e9"])
    );
    assert!(matching(s, Idx::Entries, Query::term("kind", "DIR")).is_empty());
    let terms = |field: &str, values: Vec<Value>| {
        matching(
            s,
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
        matching(s, Idx::Inodes, Query::term("orphan", true)),
        strs(&["1"])
    );
    assert_eq!(
        matching(s, Idx::Inodes, Query::term("orphan", false)),
        strs(&["2"])
    );
    assert_eq!(
        matching(s, Idx::Inodes, Query::MatchAll),
        strs(&["1", "2", "3"])
    );
}

fn range_and_exists_queries(s: &dyn MetaStore) {
    numbers_store(s);
    // sizes: e1 -400, e2 -300, e4 -100, e5 0, e7 200, e8 300
    let r = |gte, gt, lte, lt| matching(s, Idx::Entries, range("size", gte, gt, lte, lt));
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
    assert_eq!(matching(s, Idx::Entries, exists("size")).len(), 6);
    assert!(matching(s, Idx::Entries, exists("mtime")).is_empty());
    // Ranges on keywords compare bytes.
    let kinds = matching(
        s,
        Idx::Entries,
        range("kind", None, Some(json!("dir")), None, None),
    );
    assert_eq!(kinds.len(), 5);
}

fn bool_query(s: &dyn MetaStore) {
    numbers_store(s);
    let b = |must: Vec<Query>, must_not: Vec<Query>, should: Vec<Query>| {
        matching(
            s,
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

fn count_matches_queries(s: &dyn MetaStore) {
    numbers_store(s);
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

fn paging_visits_every_doc_once_in_order(s: &dyn MetaStore) {
    let n = 2500i64;
    // Cookies are a permutation of 0..n, not in id order.
    let ops = (0..n)
        .map(|i| BulkOp::Create {
            index: Idx::Entries,
            id: format!("1/f{i:05}"),
            source: doc(1, &format!("f{i:05}"), (i * 7919) % n),
        })
        .collect();
    assert!(s.bulk(ops).unwrap().iter().all(|r| r.is_ok()));
    s.create(Idx::Entries, "2/other", &doc(2, "other", 5))
        .unwrap();
    let q = || Query::term("parent", 1);
    let cookies = |hits: &[Hit]| -> Vec<i64> {
        hits.iter()
            .map(|h| h.doc.source["cookie"].as_i64().unwrap())
            .collect()
    };

    let asc = scan_all(s, Idx::Entries, q(), vec![Sort::asc("cookie")], 1000);
    assert_eq!(cookies(&asc), (0..n).collect::<Vec<_>>());
    assert_eq!(asc[0].sort[0], json!(0));

    let desc_hits = scan_all(s, Idx::Entries, q(), vec![desc("cookie")], 1000);
    assert_eq!(cookies(&desc_hits), (0..n).rev().collect::<Vec<_>>());

    // search_after from the middle.
    let mut r = req(Idx::Entries, q(), vec![Sort::asc("cookie")], 3);
    r.search_after = Some(asc[1499].sort.clone());
    assert_eq!(cookies(&s.search(&r).unwrap()), vec![1500, 1501, 1502]);
}

fn search_after_without_id_is_strict_like_elasticsearch(s: &dyn MetaStore) {
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
    // Ties among the hits (a and c) come in either order.
    let sorted = |mut v: Vec<String>, from: usize, to: usize| {
        v[from..to].sort();
        v
    };
    assert_eq!(
        sorted(page(json!(0), false), 2, 4),
        strs(&["b", "d", "a", "c", "e"])
    );
    assert_eq!(
        sorted(page(json!(1), false), 1, 3),
        strs(&["d", "a", "c", "e"])
    );
    // Ties with the after values are skipped: there is no id to split them.
    assert_eq!(page(json!(3), false), strs(&["e"]));
    assert_eq!(page(json!(3), true), strs(&["d", "b", "e"]));
    // (A null after value is not in the contract: the embedded store treats
    // it as "missing", so nothing follows; the engines refuse it.)
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

/// Reference order on the sort values: missing values last in both
/// directions.
fn reference_cmp(a: &Hit, b: &Hit, sort: &[Sort]) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let value = |h: &Hit, f: &str| h.doc.source.get(f).cloned().unwrap_or_default();
    for s in sort {
        let (x, y) = (value(a, &s.field), value(b, &s.field));
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
    Ordering::Equal
}

fn missing_values_sort_last_with_multi_key_paging(s: &dyn MetaStore) {
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
                let hits = scan_all(s, Idx::Entries, Query::MatchAll, sort.to_vec(), page);
                let mut seen = ids(&hits);
                seen.sort();
                seen.dedup();
                assert_eq!(seen.len(), 300, "{sort:?} page {page}");
                for w in hits.windows(2) {
                    assert_ne!(
                        reference_cmp(&w[0], &w[1], sort),
                        std::cmp::Ordering::Greater,
                        "{sort:?} page {page}: {} then {}",
                        w[0].doc.source,
                        w[1].doc.source
                    );
                }
            }
        }
    }
}

fn nul_characters_round_trip(s: &dyn MetaStore) {
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
        find(prefix_q("path", "/a\u{0}")),
        strs(&["/a\u{0}", "/a\u{0}b", "/a\u{0}b/c", "/a\u{0}bc"])
    );
    // Byte order, NUL sorting right after the shorter string.
    let all = scan_all(s, Idx::Entries, Query::MatchAll, vec![Sort::asc("path")], 2);
    assert_eq!(paths_of(all.clone()), strs(&paths));
    assert_eq!(all[1].sort[0], json!("/a\u{0}"));
    let mut r = req(Idx::Entries, Query::MatchAll, vec![Sort::asc("path")], 1);
    r.search_after = Some(all[2].sort.clone());
    assert_eq!(paths_of(s.search(&r).unwrap()), strs(&["/a\u{0}b/c"]));
}
