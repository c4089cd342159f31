//! Tests of `Text` and `Keywords` fields: FTS5 side tables, grouping, the
//! purge of deleted texts. (`Text` fields are the `texts` index's, a file's
//! text per inode; `Keywords` the entries' xattrs.)

use super::query::field_of;
use super::tables::{dead_table, side_table, text_table};
use super::*;
use crate::store::Sort;
use serde_json::json;

fn open() -> (tempfile::TempDir, EmbeddedStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("store")).unwrap();
    (dir, store)
}

fn text(t: &str) -> Query {
    Query::Text {
        field: "contents".into(),
        text: t.into(),
    }
}

/// The ids of `index`'s documents matching `q`, sorted by `sort`.
fn ids_in(s: &EmbeddedStore, index: Idx, sort: &str, q: Query) -> Vec<String> {
    let hits = s
        .search_brief(&SearchRequest {
            past_own_writes: false,
            index,
            query: q,
            sort: vec![Sort::asc(sort)],
            search_after: None,
            size: 100,
        })
        .unwrap();
    hits.into_iter().map(|h| h.doc.id).collect()
}

/// Entries matching `q`, by path.
fn ids(s: &EmbeddedStore, q: Query) -> Vec<String> {
    ids_in(s, Idx::Entries, "path", q)
}

/// Texts matching `q`, by inode.
fn text_ids(s: &EmbeddedStore, q: Query) -> Vec<String> {
    ids_in(s, Idx::Texts, "ino", q)
}

fn doc(path: &str, xattrs: &[&str]) -> Value {
    let mut d = json!({"path": path, "dir": "/", "kind": "file", "uid": 1});
    if !xattrs.is_empty() {
        d["xattrs"] = json!(xattrs);
    }
    d
}

/// The text document of inode `ino` (`mtime_ns` = `group`, which the
/// grouping test groups by).
fn tdoc(ino: u64, group: i64, contents: Option<&str>) -> Value {
    let mut d = json!({"ino": ino, "mtime_ns": group});
    if let Some(c) = contents {
        d["contents"] = json!(c);
    }
    d
}

#[test]
fn text_fields_are_substring_searchable_and_kept_apart() {
    let (_d, s) = open();
    s.create(Idx::Texts, "1", &tdoc(1, 0, Some("Hello World\nfoo")))
        .unwrap();
    s.create(Idx::Texts, "2", &tdoc(2, 0, Some("yellow \"quoted\"")))
        .unwrap();
    s.create(Idx::Texts, "3", &tdoc(3, 0, None)).unwrap();
    assert_eq!(text_ids(&s, text("ello")), ["1", "2"]);
    assert_eq!(text_ids(&s, text("WORLD")), ["1"]);
    assert_eq!(text_ids(&s, text("o W")), ["1"]);
    assert_eq!(text_ids(&s, text("\"quoted\"")), ["2"]);
    assert!(text_ids(&s, text("nothing")).is_empty());
    assert!(matches!(
        s.count(Idx::Texts, &text("ab")),
        Err(StoreError::Invalid(_))
    ));
    // Full reads carry the text, brief ones do not.
    let full = s.get(Idx::Texts, "1").unwrap().unwrap();
    assert_eq!(full.source["contents"], "Hello World\nfoo");
    let brief = s.get_brief(Idx::Texts, "1").unwrap().unwrap();
    assert!(brief.source.get("contents").is_none());
    assert_eq!(brief.version, full.version);
    let hits = s
        .search(&SearchRequest {
            past_own_writes: false,
            index: Idx::Texts,
            query: text("yellow"),
            sort: vec![],
            search_after: None,
            size: 10,
        })
        .unwrap();
    assert_eq!(hits[0].doc.source["contents"], "yellow \"quoted\"");
    // Rewriting without the text drops it from the index; deleting too.
    s.put(Idx::Texts, "1", &tdoc(1, 0, None), None).unwrap();
    assert!(text_ids(&s, text("ello")) == ["2"]);
    assert!(
        s.get(Idx::Texts, "1")
            .unwrap()
            .unwrap()
            .source
            .get("contents")
            .is_none()
    );
    s.delete(Idx::Texts, "2", None).unwrap();
    assert!(text_ids(&s, text("ello")).is_empty());
    assert_eq!(
        s.count(
            Idx::Texts,
            &Query::Exists {
                field: "contents".into()
            }
        )
        .unwrap(),
        0
    );
    // Bulk writes and text in must_not / should.
    let r = s
        .bulk(vec![BulkOp::Index {
            index: Idx::Texts,
            id: "5".into(),
            source: tdoc(5, 0, Some("needle in a haystack")),
            if_version: None,
        }])
        .unwrap();
    assert!(r[0].is_ok());
    let q = Query::Bool {
        must: vec![Query::Exists {
            field: "ino".into(),
        }],
        must_not: vec![],
        should: vec![
            text("needle"),
            Query::Bool {
                must: vec![],
                must_not: vec![Query::Exists {
                    field: "contents".into(),
                }],
                should: vec![],
            },
        ],
    };
    assert_eq!(text_ids(&s, q), ["1", "3", "5"]);
    // Not a string: invalid.
    assert!(matches!(
        s.create(Idx::Texts, "x", &json!({"contents": 5})),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn keywords_fields_hold_several_values() {
    let (_d, s) = open();
    s.create(Idx::Entries, "a", &doc("/a", &["user.tag=x", "user.tag"]))
        .unwrap();
    s.create(Idx::Entries, "b", &doc("/b", &["user.tag=y"]))
        .unwrap();
    s.create(Idx::Entries, "c", &doc("/c", &[])).unwrap();
    assert_eq!(ids(&s, Query::term("xattrs", "user.tag=x")), ["a"]);
    assert_eq!(ids(&s, Query::term("xattrs", "user.tag")), ["a"]);
    assert_eq!(
        ids(
            &s,
            Query::Terms {
                field: "xattrs".into(),
                values: vec![json!("user.tag=x"), json!("user.tag=y")]
            }
        ),
        ["a", "b"]
    );
    assert_eq!(
        ids(
            &s,
            Query::Prefix {
                field: "xattrs".into(),
                value: "user.tag=".into()
            }
        ),
        ["a", "b"]
    );
    assert_eq!(
        ids(
            &s,
            Query::Exists {
                field: "xattrs".into()
            }
        ),
        ["a", "b"]
    );
    let none = Query::Bool {
        must: vec![],
        must_not: vec![Query::Exists {
            field: "xattrs".into(),
        }],
        should: vec![],
    };
    assert_eq!(ids(&s, none), ["c"]);
    s.put(Idx::Entries, "a", &doc("/a", &["user.tag=z"]), None)
        .unwrap();
    assert!(ids(&s, Query::term("xattrs", "user.tag=x")).is_empty());
    assert_eq!(ids(&s, Query::term("xattrs", "user.tag=z")), ["a"]);
    // A single string is one value.
    s.put(
        Idx::Entries,
        "c",
        &json!({"path": "/c", "xattrs": "one"}),
        None,
    )
    .unwrap();
    assert_eq!(ids(&s, Query::term("xattrs", "one")), ["c"]);
    s.delete(Idx::Entries, "c", None).unwrap();
    assert!(ids(&s, Query::term("xattrs", "one")).is_empty());
    assert!(matches!(
        s.search(&SearchRequest {
            past_own_writes: false,
            index: Idx::Entries,
            query: Query::MatchAll,
            sort: vec![Sort::asc("xattrs")],
            search_after: None,
            size: 1
        }),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn grouping_orders_buckets_by_best_hit() {
    let (_d, s) = open();
    for (id, group, t) in [
        (1, 10, "foo bar"),
        (2, 20, "foo foo foo foo"),
        (3, 20, "foo, then a long tail of other words"),
        (4, 30, "nothing"),
    ] {
        s.create(Idx::Texts, &id.to_string(), &tdoc(id, group, Some(t)))
            .unwrap();
    }
    let g = s
        .group(&GroupRequest {
            index: Idx::Texts,
            query: text("foo"),
            score: Some(text("foo")),
            field: "mtime_ns".into(),
            buckets: 10,
            per_bucket: 1,
        })
        .unwrap();
    let keys: Vec<_> = g.iter().map(|b| b.key.clone()).collect();
    assert_eq!(keys, [json!(20), json!(10)]);
    assert_eq!(g[0].doc_count, 2);
    assert_eq!(g[0].hits.len(), 1);
    assert_eq!(g[0].hits[0].0.id, "2");
    assert!(g[0].top_score >= g[1].top_score && g[0].top_score > 0.0);
    // Without a score: key order, every score 0.
    let g = s
        .group(&GroupRequest {
            index: Idx::Texts,
            query: Query::MatchAll,
            score: None,
            field: "mtime_ns".into(),
            buckets: 2,
            per_bucket: 5,
        })
        .unwrap();
    let keys: Vec<_> = g.iter().map(|b| b.key.clone()).collect();
    assert_eq!(keys, [json!(10), json!(20)]);
    assert_eq!(g[1].hits.len(), 2);
    assert_eq!(g[1].top_score, 0.0);
}

#[test]
fn an_atomic_bulk_applies_all_or_nothing() {
    let (_d, s) = open();
    let va = s
        .create(Idx::Texts, "1", &tdoc(1, 0, Some("alpha needle")))
        .unwrap();
    let stale = Version {
        seq_no: va.seq_no + 100,
        ..va
    };
    let all_failed = |r: Vec<BulkItemResult>| r.iter().all(|r| r.is_err());
    // The second item fails: the first is not applied either.
    let r = s
        .bulk_atomic(vec![
            BulkOp::Create {
                index: Idx::Texts,
                id: "2".into(),
                source: tdoc(2, 0, Some("beta")),
            },
            BulkOp::Delete {
                index: Idx::Texts,
                id: "1".into(),
                if_version: Some(stale),
            },
        ])
        .unwrap()
        .unwrap();
    assert!(matches!(r[1], Err(StoreError::Conflict(_))) && all_failed(r));
    assert!(s.get(Idx::Texts, "2").unwrap().is_none());
    assert!(text_ids(&s, text("beta")).is_empty());
    // Applied whole: a text replaced by another, with an inode.
    let r = s
        .bulk_atomic(vec![
            BulkOp::Create {
                index: Idx::Texts,
                id: "3".into(),
                source: tdoc(3, 0, Some("alpha needle")),
            },
            BulkOp::Delete {
                index: Idx::Texts,
                id: "1".into(),
                if_version: Some(va),
            },
            BulkOp::Index {
                index: Idx::Inodes,
                id: "i1".into(),
                source: serde_json::json!({"ino": 1, "kind": "file"}),
                if_version: None,
            },
        ])
        .unwrap()
        .unwrap();
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    let v3 = *r[0].as_ref().unwrap();
    let vi = *r[2].as_ref().unwrap();
    // Two items done, then the inode's stale version fails: both undone.
    let r = s
        .bulk_atomic(vec![
            BulkOp::Create {
                index: Idx::Texts,
                id: "4".into(),
                source: tdoc(4, 0, Some("alpha needle")),
            },
            BulkOp::Delete {
                index: Idx::Texts,
                id: "3".into(),
                if_version: Some(v3),
            },
            BulkOp::Index {
                index: Idx::Inodes,
                id: "i1".into(),
                source: serde_json::json!({"ino": 1, "kind": "file", "n": 2}),
                if_version: Some(va),
            },
        ])
        .unwrap()
        .unwrap();
    assert!(matches!(r[2], Err(StoreError::Conflict(_))) && all_failed(r));
    assert!(s.get(Idx::Texts, "4").unwrap().is_none());
    assert_eq!(s.get(Idx::Texts, "3").unwrap().unwrap().version, v3);
    assert_eq!(s.get(Idx::Inodes, "i1").unwrap().unwrap().version, vi);
    assert_eq!(text_ids(&s, text("needle")), ["3"]);
    // Versions keep rising after a refusal.
    let v = s.create(Idx::Texts, "5", &tdoc(5, 0, None)).unwrap();
    assert!(v.seq_no > vi.seq_no);
}

#[test]
fn deleted_texts_are_purged_at_commit_and_never_reach_a_reused_row() {
    let (_d, s) = open();
    let st = side_table(Idx::Texts, field_of(Idx::Texts, "contents").unwrap());
    let count = |s: &EmbeddedStore, sql: &str| -> i64 {
        s.read(false, |c| {
            c.query_row(sql, [], |r| r.get(0)).map_err(sql_err)
        })
        .unwrap()
    };
    let indexed = |s: &EmbeddedStore, t: &str| {
        count(
            s,
            &format!("SELECT count(*) FROM \"{st}\" WHERE \"{st}\" MATCH '\"{t}\"'"),
        )
    };
    let queued = |s: &EmbeddedStore| count(s, &format!("SELECT count(*) FROM \"{st}_dead\""));
    let rid_of =
        |s: &EmbeddedStore, id: &str| count(s, &format!("SELECT rid FROM texts WHERE id = '{id}'"));
    let b = s.batch_handle().unwrap();
    for (id, t) in [(1, "alpha one"), (2, "dropped two"), (3, "bravo three")] {
        b.create(Idx::Texts, &id.to_string(), &tdoc(id, 0, Some(t)))
            .unwrap();
    }
    let rid_d = rid_of(&s, "2");
    b.delete(Idx::Texts, "2", None).unwrap();
    b.delete(Idx::Texts, "3", None).unwrap();
    // Queued, not yet purged: the index still has the rows, searches
    // do not return them.
    assert_eq!(queued(&s), 2);
    assert_eq!((indexed(&s, "dropped"), indexed(&s, "bravo")), (1, 1));
    assert!(text_ids(&s, text("dropped")).is_empty());
    assert!(text_ids(&s, text("bravo")).is_empty());
    // A new row takes the lowest free rid above the highest live one,
    // d's: d's old index row goes before the new text is indexed.
    b.create(Idx::Texts, "4", &tdoc(4, 0, Some("charlie four")))
        .unwrap();
    assert_eq!(rid_of(&s, "4"), rid_d, "the test needs a reused rid");
    assert_eq!((queued(&s), indexed(&s, "dropped")), (1, 0));
    assert!(text_ids(&s, text("dropped")).is_empty());
    assert_eq!(text_ids(&s, text("charlie")), ["4"]);
    b.end_batch().unwrap();
    // The commit purged the rest.
    assert_eq!((queued(&s), indexed(&s, "bravo")), (0, 0));
    assert_eq!(text_ids(&s, text("alpha")), ["1"]);
    assert_eq!(text_ids(&s, text("charlie")), ["4"]);
}

#[test]
fn a_store_that_deleted_index_rows_at_once_queues_them_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let st = side_table(Idx::Texts, field_of(Idx::Texts, "contents").unwrap());
    {
        let s = EmbeddedStore::open(dir.path()).unwrap();
        s.create(Idx::Texts, "1", &tdoc(1, 0, Some("old needle")))
            .unwrap();
        s.sync().unwrap();
        // The trigger of the previous version.
        let c = Connection::open(dir.path().join("meta.sqlite")).unwrap();
        let tt = text_table(&st);
        c.execute_batch(&format!(
            "DROP TRIGGER \"{st}_ad\";
             CREATE TRIGGER \"{st}_ad\" AFTER DELETE ON texts
             WHEN EXISTS (SELECT 1 FROM \"{tt}\" WHERE rid = old.rid)
             BEGIN
                 DELETE FROM \"{st}\" WHERE rowid = old.rid;
                 DELETE FROM \"{tt}\" WHERE rid = old.rid;
             END;"
        ))
        .unwrap();
    }
    let s = EmbeddedStore::open(dir.path()).unwrap();
    let trigger: String = s
        .read(false, |c| {
            c.query_row(
                "SELECT sql FROM sqlite_master WHERE name = ?1",
                [format!("{st}_ad")],
                |r| r.get(0),
            )
            .map_err(sql_err)
        })
        .unwrap();
    assert!(trigger.contains(&dead_table(&st)), "{trigger}");
    s.delete(Idx::Texts, "1", None).unwrap();
    assert!(text_ids(&s, text("needle")).is_empty());
}

#[test]
fn texts_of_a_store_from_before_contentless_indexing_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let st = side_table(Idx::Texts, field_of(Idx::Texts, "contents").unwrap());
    {
        let s = EmbeddedStore::open(dir.path()).unwrap();
        s.create(Idx::Texts, "1", &tdoc(1, 0, Some("old needle")))
            .unwrap();
        s.create(Idx::Texts, "2", &tdoc(2, 0, Some("other hay")))
            .unwrap();
        s.sync().unwrap();
    }
    {
        // Back to the earlier layout: an FTS5 table keeping its content.
        let c = Connection::open(dir.path().join("meta.sqlite")).unwrap();
        let tt = text_table(&st);
        c.execute_batch(&format!(
            "DROP TRIGGER \"{st}_ad\"; DROP TABLE \"{st}\";
             CREATE VIRTUAL TABLE \"{st}\" USING fts5(v, tokenize = 'trigram');
             INSERT INTO \"{st}\" (rowid, v) SELECT rid, v FROM \"{tt}\";
             DROP TABLE \"{tt}\";
             CREATE TRIGGER \"{st}_ad\" AFTER DELETE ON texts
             BEGIN DELETE FROM \"{st}\" WHERE rowid = old.rid; END;"
        ))
        .unwrap();
    }
    let s = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(text_ids(&s, text("NEEDLE")), ["1"]);
    assert_eq!(
        s.get(Idx::Texts, "2").unwrap().unwrap().source["contents"],
        "other hay"
    );
    s.delete(Idx::Texts, "1", None).unwrap();
    s.put(Idx::Texts, "2", &tdoc(2, 0, Some("new needle")), None)
        .unwrap();
    assert_eq!(text_ids(&s, text("needle")), ["2"]);
    assert!(text_ids(&s, text("hay")).is_empty());
}
