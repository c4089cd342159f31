//! One conformance suite for the `MetaStore` trait, run against every
//! backend: the embedded SQLite store, the Elasticsearch backend talking to
//! the wire-protocol test double, and a real cluster when `ESFS_TEST_ES_URL` is
//! set. The filesystem relies on exactly these behaviours.

use es_test_server::EsTestServer;
use esfs::store::embedded::EmbeddedStore;
use esfs::store::es::{EsConfig, EsStore};
use esfs::store::{BulkOp, Idx, MetaStore, Query, SearchRequest, Sort, StoreError, scan};
use serde_json::json;
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
/// the others (the file text above all) stay; versions are checked.
fn partial_updates(s: &dyn MetaStore) {
    let mut doc = entry(77, "u", "/old/u", 7001);
    doc["contents"] = json!("needle in the text");
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
    assert_eq!(got.source["contents"], json!("needle in the text"));
    // Stale version: nothing changes.
    let r = s.bulk(vec![update(Some(v), "77/u")]).unwrap();
    assert!(matches!(r[0], Err(StoreError::Conflict(_))), "{:?}", r[0]);
    s.refresh(Idx::Entries).unwrap();
    // Indexed fields follow the update; the text is still searchable.
    let ids = |q: Query| -> Vec<String> {
        s.search_brief(&SearchRequest {
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
    assert_eq!(
        ids(Query::Text {
            field: "contents".into(),
            text: "needle".into()
        }),
        ["77/u"]
    );
    s.delete(Idx::Entries, "77/u", None).unwrap();
}

/// `rebase_paths` (a directory rename done inside the store), where a
/// backend offers it: exactly the documents strictly below the old path
/// move, each with a new version; everything else about them stays.
fn rebased_paths(s: &dyn MetaStore) {
    let put = |id: &str, path: &str, dir: &str| {
        let mut d = entry(88, id, path, 8000 + id.len() as u64);
        d["dir"] = json!(dir);
        d["contents"] = json!(format!("text of {id}"));
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
    let Some(n) = s
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
    assert_eq!(f.source["contents"], json!("text of 88/f"));
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
        s.count(
            Idx::Entries,
            &Query::Text {
                field: "contents".into(),
                text: "text of 88/f".into()
            }
        )
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
}

/// One batch's writes are visible to reads inside it and to other threads,
/// and are committed (seen by another connection) once it ends.
#[test]
fn embedded_batches_commit_at_their_end() {
    let dir = tempfile::tempdir().unwrap();
    let s = EmbeddedStore::open(dir.path()).unwrap();
    // Another connection to the same database: sees committed data only.
    let other = EmbeddedStore::open(dir.path()).unwrap();
    s.begin_batch();
    s.create(Idx::Meta, "a", &json!({"n": 1})).unwrap();
    s.put(Idx::Meta, "b", &json!({"n": 2}), None).unwrap();
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
    s.end_batch().unwrap();
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
}

#[test]
fn elasticsearch_backend_conforms_against_a_real_cluster_if_given() {
    let Ok(url) = std::env::var("ESFS_TEST_ES_URL") else {
        eprintln!("ESFS_TEST_ES_URL not set: no real cluster to test against");
        return;
    };
    let store = EsStore::connect(&EsConfig::new(&url, &prefix())).unwrap();
    conformance(&store);
}
