//! Tests of `Text` and `Keywords` fields: FTS5 side tables, grouping, the
//! in-place move of a renamed file's text, the purge of deleted texts.

use super::query::field_of;
use super::tables::{dead_table, side_table, text_table};
use super::*;
use crate::store::Sort;
use rusqlite::OptionalExtension;
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

fn ids(s: &EmbeddedStore, q: Query) -> Vec<String> {
    let hits = s
        .search_brief(&SearchRequest {
            past_own_writes: false,
            index: Idx::Entries,
            query: q,
            sort: vec![Sort::asc("path")],
            search_after: None,
            size: 100,
        })
        .unwrap();
    hits.into_iter().map(|h| h.doc.id).collect()
}

fn doc(path: &str, dir: &str, contents: Option<&str>, xattrs: &[&str]) -> Value {
    let mut d = json!({"path": path, "dir": dir, "kind": "file", "uid": 1});
    if let Some(c) = contents {
        d["contents"] = json!(c);
    }
    if !xattrs.is_empty() {
        d["xattrs"] = json!(xattrs);
    }
    d
}

#[test]
fn text_fields_are_substring_searchable_and_kept_apart() {
    let (_d, s) = open();
    s.create(
        Idx::Entries,
        "a",
        &doc("/a", "/", Some("Hello World\nfoo"), &[]),
    )
    .unwrap();
    s.create(
        Idx::Entries,
        "b",
        &doc("/d/b", "/d", Some("yellow \"quoted\""), &[]),
    )
    .unwrap();
    s.create(Idx::Entries, "c", &doc("/d/c", "/d", None, &[]))
        .unwrap();
    assert_eq!(ids(&s, text("ello")), ["a", "b"]);
    assert_eq!(ids(&s, text("WORLD")), ["a"]);
    assert_eq!(ids(&s, text("o W")), ["a"]);
    assert_eq!(ids(&s, text("\"quoted\"")), ["b"]);
    assert!(ids(&s, text("nothing")).is_empty());
    assert!(matches!(
        s.count(Idx::Entries, &text("ab")),
        Err(StoreError::Invalid(_))
    ));
    // Full reads carry the text, brief ones do not.
    let full = s.get(Idx::Entries, "a").unwrap().unwrap();
    assert_eq!(full.source["contents"], "Hello World\nfoo");
    let brief = s.get_brief(Idx::Entries, "a").unwrap().unwrap();
    assert!(brief.source.get("contents").is_none());
    assert_eq!(brief.version, full.version);
    let hits = s
        .search(&SearchRequest {
            past_own_writes: false,
            index: Idx::Entries,
            query: text("yellow"),
            sort: vec![],
            search_after: None,
            size: 10,
        })
        .unwrap();
    assert_eq!(hits[0].doc.source["contents"], "yellow \"quoted\"");
    // Rewriting without the text drops it from the index; deleting too.
    s.put(Idx::Entries, "a", &doc("/a", "/", None, &[]), None)
        .unwrap();
    assert!(ids(&s, text("ello")) == ["b"]);
    assert!(
        s.get(Idx::Entries, "a")
            .unwrap()
            .unwrap()
            .source
            .get("contents")
            .is_none()
    );
    s.delete(Idx::Entries, "b", None).unwrap();
    assert!(ids(&s, text("ello")).is_empty());
    assert_eq!(
        s.count(
            Idx::Entries,
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
            index: Idx::Entries,
            id: "e".into(),
            source: doc("/e", "/", Some("needle in a haystack"), &[]),
            if_version: None,
        }])
        .unwrap();
    assert!(r[0].is_ok());
    let q = Query::Bool {
        must: vec![Query::term("kind", "file")],
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
    assert_eq!(ids(&s, q), ["a", "c", "e"]);
    // Not a string: invalid.
    assert!(matches!(
        s.create(Idx::Entries, "x", &json!({"contents": 5})),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn keywords_fields_hold_several_values() {
    let (_d, s) = open();
    s.create(
        Idx::Entries,
        "a",
        &doc("/a", "/", None, &["user.tag=x", "user.tag"]),
    )
    .unwrap();
    s.create(Idx::Entries, "b", &doc("/b", "/", None, &["user.tag=y"]))
        .unwrap();
    s.create(Idx::Entries, "c", &doc("/c", "/", None, &[]))
        .unwrap();
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
    s.put(
        Idx::Entries,
        "a",
        &doc("/a", "/", None, &["user.tag=z"]),
        None,
    )
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
    s.create(Idx::Entries, "1", &doc("/x/1", "/x", Some("foo bar"), &[]))
        .unwrap();
    s.create(
        Idx::Entries,
        "2",
        &doc("/y/2", "/y", Some("foo foo foo foo"), &[]),
    )
    .unwrap();
    s.create(
        Idx::Entries,
        "3",
        &doc(
            "/y/3",
            "/y",
            Some("foo, then a long tail of other words"),
            &[],
        ),
    )
    .unwrap();
    s.create(Idx::Entries, "4", &doc("/z/4", "/z", Some("nothing"), &[]))
        .unwrap();
    let g = s
        .group(&GroupRequest {
            index: Idx::Entries,
            query: text("foo"),
            score: Some(text("foo")),
            field: "dir".into(),
            buckets: 10,
            per_bucket: 1,
        })
        .unwrap();
    let keys: Vec<_> = g.iter().map(|b| b.key.clone()).collect();
    assert_eq!(keys, [json!("/y"), json!("/x")]);
    assert_eq!(g[0].doc_count, 2);
    assert_eq!(g[0].hits.len(), 1);
    assert_eq!(g[0].hits[0].0.id, "2");
    assert!(g[0].top_score >= g[1].top_score && g[0].top_score > 0.0);
    // Without a score: key order, every score 0.
    let g = s
        .group(&GroupRequest {
            index: Idx::Entries,
            query: Query::MatchAll,
            score: None,
            field: "dir".into(),
            buckets: 2,
            per_bucket: 5,
        })
        .unwrap();
    let keys: Vec<_> = g.iter().map(|b| b.key.clone()).collect();
    assert_eq!(keys, [json!("/x"), json!("/y")]);
    assert_eq!(g[1].hits.len(), 2);
    assert_eq!(g[1].top_score, 0.0);
}

#[test]
fn a_rename_bulk_moves_the_text_with_the_document() {
    let (_d, s) = open();
    let text_rows = |s: &EmbeddedStore| -> i64 {
        let st = side_table(Idx::Entries, field_of(Idx::Entries, "contents").unwrap());
        s.read(false, |c| {
            c.query_row(&format!("SELECT count(*) FROM \"{st}_text\""), [], |r| {
                r.get(0)
            })
            .map_err(sql_err)
        })
        .unwrap()
    };
    let rid_of = |s: &EmbeddedStore, id: &str| -> Option<i64> {
        s.read(false, |c| {
            c.query_row("SELECT rid FROM entries WHERE id = ?1", [id], |r| r.get(0))
                .optional()
                .map_err(sql_err)
        })
        .unwrap()
    };
    let vx = s
        .create(
            Idx::Entries,
            "x",
            &doc("/x", "/", Some("moving needle"), &[]),
        )
        .unwrap();
    let rid_x = rid_of(&s, "x");
    let vz = s
        .create(
            Idx::Entries,
            "z",
            &doc("/z", "/", Some("replaced hay"), &[]),
        )
        .unwrap();
    // [create y, delete x] carrying x's text: x's row becomes y's.
    let r = s
        .bulk(vec![
            BulkOp::Create {
                index: Idx::Entries,
                id: "y".into(),
                source: doc("/y", "/", Some("moving needle"), &["user.k=v"]),
            },
            BulkOp::Delete {
                index: Idx::Entries,
                id: "x".into(),
                if_version: Some(vx),
            },
        ])
        .unwrap();
    let (vy, vdel) = (*r[0].as_ref().unwrap(), *r[1].as_ref().unwrap());
    assert!(vy.seq_no > vz.seq_no && vdel.seq_no == vy.seq_no + 1);
    assert!(s.get(Idx::Entries, "x").unwrap().is_none());
    assert_eq!(rid_of(&s, "y"), rid_x, "moved in place, text rows kept");
    let y = s.get(Idx::Entries, "y").unwrap().unwrap();
    assert_eq!(y.version, vy);
    assert_eq!(y.source["path"], "/y");
    assert_eq!(y.source["contents"], "moving needle");
    assert_eq!(ids(&s, text("NEEDLE")), ["y"]);
    assert_eq!(ids(&s, Query::term("xattrs", "user.k=v")), ["y"]);
    assert_eq!(ids(&s, Query::term("path", "/y")), ["y"]);
    // Over an existing document (rename over a file): its text goes.
    let r = s
        .bulk(vec![
            BulkOp::Index {
                index: Idx::Entries,
                id: "z".into(),
                source: doc("/z", "/", Some("moving needle"), &[]),
                if_version: Some(vz),
            },
            BulkOp::Delete {
                index: Idx::Entries,
                id: "y".into(),
                if_version: Some(vy),
            },
        ])
        .unwrap();
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    assert_eq!(ids(&s, text("needle")), ["z"]);
    assert!(ids(&s, text("hay")).is_empty());
    assert!(ids(&s, Query::term("xattrs", "user.k=v")).is_empty());
    assert_eq!(text_rows(&s), 1);
    // Stale versions fail item by item as usual, changing nothing.
    let r = s
        .bulk(vec![
            BulkOp::Create {
                index: Idx::Entries,
                id: "w".into(),
                source: doc("/w", "/", Some("moving needle"), &[]),
            },
            BulkOp::Delete {
                index: Idx::Entries,
                id: "z".into(),
                if_version: Some(vz),
            },
        ])
        .unwrap();
    assert!(r[0].is_ok() && matches!(r[1], Err(StoreError::Conflict(_))));
    assert_eq!(ids(&s, text("needle")), ["w", "z"]);
    assert_eq!(text_rows(&s), 2);
}

#[test]
fn an_atomic_bulk_applies_all_or_nothing() {
    let (_d, s) = open();
    let rid_of = |id: &str| {
        s.read(false, |c| {
            c.query_row("SELECT rid FROM entries WHERE id = ?1", [id], |r| {
                r.get::<_, i64>(0)
            })
            .optional()
            .map_err(sql_err)
        })
        .unwrap()
    };
    let va = s
        .create(
            Idx::Entries,
            "a",
            &doc("/a", "/", Some("alpha needle"), &[]),
        )
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
                index: Idx::Entries,
                id: "b".into(),
                source: doc("/b", "/", Some("beta"), &[]),
            },
            BulkOp::Delete {
                index: Idx::Entries,
                id: "a".into(),
                if_version: Some(stale),
            },
        ])
        .unwrap()
        .unwrap();
    assert!(matches!(r[1], Err(StoreError::Conflict(_))) && all_failed(r));
    assert!(s.get(Idx::Entries, "b").unwrap().is_none());
    assert!(ids(&s, text("beta")).is_empty());
    // A rename with its inode: the text row moves in place.
    let rid_a = rid_of("a");
    let r = s
        .bulk_atomic(vec![
            BulkOp::Create {
                index: Idx::Entries,
                id: "y".into(),
                source: doc("/y", "/", Some("alpha needle"), &[]),
            },
            BulkOp::Delete {
                index: Idx::Entries,
                id: "a".into(),
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
    assert_eq!(rid_of("y"), rid_a);
    let vy = *r[0].as_ref().unwrap();
    let vi = *r[2].as_ref().unwrap();
    // The in-place move done, then the inode's stale version fails:
    // the move is undone too.
    let r = s
        .bulk_atomic(vec![
            BulkOp::Create {
                index: Idx::Entries,
                id: "z".into(),
                source: doc("/z", "/", Some("alpha needle"), &[]),
            },
            BulkOp::Delete {
                index: Idx::Entries,
                id: "y".into(),
                if_version: Some(vy),
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
    assert!(s.get(Idx::Entries, "z").unwrap().is_none());
    let y = s.get(Idx::Entries, "y").unwrap().unwrap();
    assert_eq!((y.version, rid_of("y")), (vy, rid_a));
    assert_eq!(s.get(Idx::Inodes, "i1").unwrap().unwrap().version, vi);
    assert_eq!(ids(&s, text("needle")), ["y"]);
    // Versions keep rising after a refusal.
    let v = s
        .create(Idx::Entries, "c", &doc("/c", "/", None, &[]))
        .unwrap();
    assert!(v.seq_no > vi.seq_no);
}

#[test]
fn deleted_texts_are_purged_at_commit_and_never_reach_a_reused_row() {
    let (_d, s) = open();
    let st = side_table(Idx::Entries, field_of(Idx::Entries, "contents").unwrap());
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
    let rid_of = |s: &EmbeddedStore, id: &str| {
        count(s, &format!("SELECT rid FROM entries WHERE id = '{id}'"))
    };
    let b = s.batch_handle().unwrap();
    for (id, t) in [
        ("a", "alpha one"),
        ("d", "dropped two"),
        ("b", "bravo three"),
    ] {
        b.create(Idx::Entries, id, &doc(&format!("/{id}"), "/", Some(t), &[]))
            .unwrap();
    }
    let rid_d = rid_of(&s, "d");
    b.delete(Idx::Entries, "d", None).unwrap();
    b.delete(Idx::Entries, "b", None).unwrap();
    // Queued, not yet purged: the index still has the rows, searches
    // do not return them.
    assert_eq!(queued(&s), 2);
    assert_eq!((indexed(&s, "dropped"), indexed(&s, "bravo")), (1, 1));
    assert!(ids(&s, text("dropped")).is_empty());
    assert!(ids(&s, text("bravo")).is_empty());
    // A new row takes the lowest free rid above the highest live one,
    // d's: d's old index row goes before the new text is indexed.
    b.create(
        Idx::Entries,
        "c",
        &doc("/c", "/", Some("charlie four"), &[]),
    )
    .unwrap();
    assert_eq!(rid_of(&s, "c"), rid_d, "the test needs a reused rid");
    assert_eq!((queued(&s), indexed(&s, "dropped")), (1, 0));
    assert!(ids(&s, text("dropped")).is_empty());
    assert_eq!(ids(&s, text("charlie")), ["c"]);
    b.end_batch().unwrap();
    // The commit purged the rest.
    assert_eq!((queued(&s), indexed(&s, "bravo")), (0, 0));
    assert_eq!(ids(&s, text("alpha")), ["a"]);
    assert_eq!(ids(&s, text("charlie")), ["c"]);
}

#[test]
fn a_store_that_deleted_index_rows_at_once_queues_them_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let st = side_table(Idx::Entries, field_of(Idx::Entries, "contents").unwrap());
    {
        let s = EmbeddedStore::open(dir.path()).unwrap();
        s.create(Idx::Entries, "a", &doc("/a", "/", Some("old needle"), &[]))
            .unwrap();
        s.sync().unwrap();
        // The trigger of the previous version.
        let c = Connection::open(dir.path().join("meta.sqlite")).unwrap();
        let tt = text_table(&st);
        c.execute_batch(&format!(
            "DROP TRIGGER \"{st}_ad\";
             CREATE TRIGGER \"{st}_ad\" AFTER DELETE ON entries
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
    s.delete(Idx::Entries, "a", None).unwrap();
    assert!(ids(&s, text("needle")).is_empty());
}

#[test]
fn texts_of_a_store_from_before_contentless_indexing_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let st = side_table(Idx::Entries, field_of(Idx::Entries, "contents").unwrap());
    {
        let s = EmbeddedStore::open(dir.path()).unwrap();
        s.create(Idx::Entries, "a", &doc("/a", "/", Some("old needle"), &[]))
            .unwrap();
        s.create(Idx::Entries, "b", &doc("/b", "/", Some("other hay"), &[]))
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
             CREATE TRIGGER \"{st}_ad\" AFTER DELETE ON entries
             BEGIN DELETE FROM \"{st}\" WHERE rowid = old.rid; END;"
        ))
        .unwrap();
    }
    let s = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(ids(&s, text("NEEDLE")), ["a"]);
    assert_eq!(
        s.get(Idx::Entries, "b").unwrap().unwrap().source["contents"],
        "other hay"
    );
    s.delete(Idx::Entries, "a", None).unwrap();
    s.put(
        Idx::Entries,
        "b",
        &doc("/b", "/", Some("new needle"), &[]),
        None,
    )
    .unwrap();
    assert_eq!(ids(&s, text("needle")), ["b"]);
    assert!(ids(&s, text("hay")).is_empty());
}
