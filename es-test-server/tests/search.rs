//! Search: queries, sorting, search_after, result window, point in time.

mod common;

use common::{Es, FS_INDEX, start};
use serde_json::{Value, json};

fn load_tree(es: &Es) {
    es.put("/fs", FS_INDEX);
    let docs = [
        ("1", "/", "", "dir", 0),
        ("2", "/a", "/", "dir", 10),
        ("3", "/a/b", "/a", "dir", 20),
        ("4", "/a/b/file.txt", "/a/b", "file", 30),
        ("5", "/a/bc", "/a", "dir", 40),
        ("6", "/a/bc/x", "/a/bc", "file", 50),
        ("7", "/z", "/", "file", 60),
    ];
    let mut body = String::new();
    for (id, path, dir, kind, size) in docs {
        let name = path.rsplit('/').next().unwrap();
        body.push_str(&format!("{{\"index\":{{\"_id\":\"{id}\"}}}}\n"));
        body.push_str(&json!({"path": path, "dir": dir, "kind": kind, "size": size, "name": name, "mtime": 1_700_000_000_000i64 + size}).to_string());
        body.push('\n');
    }
    let (s, v) = es.bulk("/fs/_bulk?refresh=true", &body);
    assert_eq!((s, v["errors"].as_bool()), (200, Some(false)), "{v}");
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn path_hierarchy_selects_whole_subtrees() {
    let es = start();
    load_tree(&es);
    let q = |p: &str| {
        sorted(es.ids(
            "/fs",
            &json!({"query":{"term":{"path.tree": p}},"size":100}).to_string(),
        ))
    };
    assert_eq!(q("/a"), vec!["2", "3", "4", "5", "6"]);
    assert_eq!(q("/a/b"), vec!["3", "4"]); // never /a/bc
    assert_eq!(q("/a/bc"), vec!["5", "6"]);
    assert_eq!(q("/a/b/file.txt"), vec!["4"]);
    assert_eq!(q("/"), vec!["1"]);
    assert!(q("/a/").is_empty());
    assert!(q("a").is_empty());
    // The sub-field does not change the keyword field.
    assert_eq!(
        sorted(es.ids("/fs", r#"{"query":{"term":{"path":"/a/b"}}}"#)),
        vec!["3"]
    );
    // A subtree minus its root, as a rename would select.
    assert_eq!(
        sorted(es.ids("/fs", r#"{"query":{"bool":{"filter":[{"term":{"path.tree":"/a"}}],"must_not":[{"term":{"path":"/a"}}]}},"size":100}"#)),
        vec!["3", "4", "5", "6"]
    );
}

#[test]
fn query_types() {
    let es = start();
    load_tree(&es);
    let ids = |q: Value| sorted(es.ids("/fs", &json!({"query": q, "size": 100}).to_string()));
    assert_eq!(ids(json!({"terms":{"kind":["file"]}})), vec!["4", "6", "7"]);
    assert_eq!(ids(json!({"terms":{"size":[10, 30, 99]}})), vec!["2", "4"]);
    assert_eq!(ids(json!({"term":{"size":"20"}})), vec!["3"]);
    assert_eq!(
        ids(json!({"prefix":{"path":"/a/b"}})),
        vec!["3", "4", "5", "6"]
    );
    assert_eq!(
        ids(json!({"range":{"size":{"gt":10,"lte":40}}})),
        vec!["3", "4", "5"]
    );
    assert_eq!(
        ids(json!({"range":{"size":{"gte":10.5,"lt":30}}})),
        vec!["3"]
    );
    assert_eq!(
        ids(json!({"range":{"mtime":{"gte":1_700_000_000_050i64}}})),
        vec!["6", "7"]
    );
    assert_eq!(
        ids(json!({"range":{"path":{"gte":"/a/b","lt":"/a/c"}}})),
        vec!["3", "4", "5", "6"]
    );
    assert_eq!(
        ids(json!({"exists":{"field":"dir"}})),
        vec!["1", "2", "3", "4", "5", "6", "7"]
    );
    assert_eq!(
        ids(json!({"exists":{"field":"orphan"}})),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(json!({"ids":{"values":["2","7","99"]}})),
        vec!["2", "7"]
    );
    assert_eq!(ids(json!({"wildcard":{"name":"*.t?t"}})), vec!["4"]);
    assert_eq!(
        ids(json!({"wildcard":{"name":{"value":"FILE*","case_insensitive":true}}})),
        vec!["4"]
    );
    assert_eq!(
        ids(json!({"wildcard":{"name":{"value":"FILE*"}}})),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(json!({"term":{"kind":{"value":"FILE","case_insensitive":true}}})),
        vec!["4", "6", "7"]
    );
    // Standard analyzer: "file.txt" is one token, as in Lucene.
    assert_eq!(ids(json!({"match":{"name.text":"FILE.TXT"}})), vec!["4"]);
    assert_eq!(
        ids(json!({"match":{"name.text":"txt"}})),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(json!({"match":{"name.text":{"query":"x z","operator":"or"}}})),
        vec!["6", "7"]
    );
    assert_eq!(
        ids(json!({"match":{"name.text":{"query":"x z","operator":"and"}}})),
        Vec::<String>::new()
    );
    // Term on an unmapped field matches nothing; match_none; bool semantics.
    assert_eq!(ids(json!({"term":{"nope":"x"}})), Vec::<String>::new());
    assert_eq!(ids(json!({"match_none":{}})), Vec::<String>::new());
    assert_eq!(
        ids(json!({"bool":{"should":[{"term":{"kind":"file"}},{"term":{"size":10}}]}})),
        vec!["2", "4", "6", "7"]
    );
    assert_eq!(
        ids(json!({"bool":{"filter":{"term":{"kind":"dir"}},"should":[{"term":{"size":10}}]}})),
        vec!["1", "2", "3", "5"],
        "should is optional next to a filter"
    );
    assert_eq!(
        ids(
            json!({"bool":{"filter":{"term":{"kind":"dir"}},"should":[{"term":{"size":10}}],"minimum_should_match":1}})
        ),
        vec!["2"]
    );
    assert_eq!(
        ids(json!({"bool":{"must_not":{"term":{"kind":"dir"}}}})),
        vec!["4", "6", "7"]
    );
    assert_eq!(
        ids(
            json!({"bool":{"should":[{"term":{"kind":"dir"}},{"prefix":{"path":"/a"}},{"term":{"size":60}}],"minimum_should_match":2}})
        ),
        vec!["2", "3", "5"]
    );
    assert_eq!(
        ids(json!({"constant_score":{"filter":{"term":{"kind":"file"}},"boost":2}})),
        vec!["4", "6", "7"]
    );
    // Errors.
    es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"query":{"frobnicate":{}}}"#),
        400,
        "parsing_exception",
        "unknown query [frobnicate]",
    );
    es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"query":{"term":{"a":1,"b":2}}}"#),
        400,
        "parsing_exception",
        "[term] query doesn't support multiple fields, found [a] and [b]",
    );
    es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"query":{"bool":{"must":[],"should":[],"bogus":[]}}}"#),
        400,
        "parsing_exception",
        "[bool] query does not support [bogus]",
    );
    es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"query":{"regexp":{"name":"a.*"}}}"#),
        400,
        "illegal_argument_exception",
        "does not implement the [regexp] query",
    );
    es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"bogus":1}"#),
        400,
        "parsing_exception",
        "Unknown key for a VALUE_NUMBER in [bogus].",
    );
    es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"query":{"term":{"size":"abc"}}}"#),
        400,
        "search_phase_execution_exception",
        "all shards failed",
    );
}

#[test]
fn scores_and_sorting() {
    let es = start();
    load_tree(&es);
    let (_, v) = es.post("/fs/_search", r#"{"query":{"match":{"name.text":"x"}}}"#);
    assert!(v["hits"]["max_score"].as_f64().unwrap() > 0.0);
    assert!(v["hits"]["hits"][0]["_score"].as_f64().unwrap() > 0.0);
    assert!(v["hits"]["hits"][0].get("sort").is_none());
    // Filter context scores 0.
    let (_, v) = es.post(
        "/fs/_search",
        r#"{"query":{"bool":{"filter":{"term":{"kind":"file"}}}}}"#,
    );
    assert_eq!(v["hits"]["hits"][0]["_score"], 0.0);
    // Sorted: no scores, sort values per field type.
    let (_, v) = es.post("/fs/_search", r#"{"sort":[{"kind":"asc"},{"size":{"order":"desc"}},{"mtime":"asc"}],"size":3,"seq_no_primary_term":true}"#);
    assert_eq!(v["hits"]["max_score"], Value::Null);
    let h = &v["hits"]["hits"];
    assert_eq!(h[0]["_score"], Value::Null);
    assert_eq!(h[0]["sort"], json!(["dir", 40, 1_700_000_000_040i64]));
    assert_eq!(h[0]["_id"], "5");
    assert_eq!(h[0]["_seq_no"], 4);
    assert_eq!(h[0]["_primary_term"], 1);
    assert_eq!(v["hits"]["total"], json!({"value":7,"relation":"eq"}));
    // Missing values sort last (in both directions), keyword missing is null.
    es.put("/fs/_doc/8?refresh=true", r#"{"name":"nosize"}"#);
    let (_, v) = es.post("/fs/_search", r#"{"sort":[{"size":"asc"}],"size":100}"#);
    let last = v["hits"]["hits"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["_id"], "8");
    assert_eq!(last["sort"], json!([i64::MAX]));
    let (_, v) = es.post("/fs/_search", r#"{"sort":[{"size":"desc"}],"size":100}"#);
    let last = v["hits"]["hits"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (last["_id"].as_str(), last["sort"][0].as_i64()),
        (Some("8"), Some(i64::MIN))
    );
    let (_, v) = es.post(
        "/fs/_search",
        r#"{"sort":[{"size":{"order":"asc","missing":"_first"}}],"size":1}"#,
    );
    assert_eq!(v["hits"]["hits"][0]["_id"], "8");
    let (_, v) = es.post("/fs/_search", r#"{"sort":[{"dir":"asc"}],"size":100}"#);
    let last = v["hits"]["hits"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["sort"], json!([null]));
    // Sort errors.
    es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"sort":["name.text"]}"#),
        400,
        "search_phase_execution_exception",
        "all shards failed",
    );
    let v = es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"sort":["_id"]}"#),
        400,
        "search_phase_execution_exception",
        "",
    );
    assert!(
        v["error"]["root_cause"][0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("Fielddata access on the _id field is disallowed")
    );
    let v = es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"sort":["name.text"]}"#),
        400,
        "search_phase_execution_exception",
        "",
    );
    assert!(
        v["error"]["root_cause"][0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("Fielddata is disabled on [name.text] in [fs]")
    );
    let v = es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"sort":["unmapped"]}"#),
        400,
        "search_phase_execution_exception",
        "",
    );
    assert_eq!(
        v["error"]["root_cause"][0]["reason"],
        "No mapping found for [unmapped] in order to sort on"
    );
    assert_eq!(
        es.post(
            "/fs/_search",
            r#"{"sort":[{"unmapped":{"unmapped_type":"long"}}]}"#
        )
        .0,
        200
    );
    // _source filtering and track_total_hits.
    let (_, v) = es.post(
        "/fs/_search",
        r#"{"query":{"ids":{"values":["4"]}},"_source":["name","k*"],"track_total_hits":false}"#,
    );
    assert_eq!(
        v["hits"]["hits"][0]["_source"],
        json!({"name":"file.txt","kind":"file"})
    );
    assert!(v["hits"].get("total").is_none());
    let (_, v) = es.post("/fs/_search", r#"{"_source":false,"size":1}"#);
    assert!(v["hits"]["hits"][0].get("_source").is_none());
    let (_, v) = es.post("/fs/_search", r#"{"track_total_hits":3,"size":0}"#);
    assert_eq!(v["hits"]["total"], json!({"value":3,"relation":"gte"}));
    assert_eq!(v["hits"]["hits"], json!([]));
    // from/size.
    let (_, v) = es.post("/fs/_search", r#"{"sort":["size"],"from":2,"size":2}"#);
    assert_eq!(v["hits"]["hits"][0]["sort"], json!([20]));
}

#[test]
fn search_after_pages_25k_docs_exactly_once() {
    let es = start();
    es.put("/big", r#"{"settings":{"refresh_interval":"-1"},"mappings":{"properties":{"n":{"type":"long"},"g":{"type":"keyword"}}}}"#);
    const N: usize = 25_000;
    for chunk in 0..5 {
        let mut body = String::new();
        for i in chunk * 5000..(chunk + 1) * 5000 {
            // Values are unique but inserted out of order; some duplicate groups for the secondary key.
            let n = (i * 7919) % N;
            body.push_str(&format!(
                "{{\"index\":{{\"_id\":\"d{i}\"}}}}\n{{\"n\":{n},\"g\":\"g{}\"}}\n",
                i % 10
            ));
        }
        let (s, v) = es.bulk("/big/_bulk", &body);
        assert_eq!((s, v["errors"].as_bool()), (200, Some(false)));
    }
    es.refresh("big");
    let mut seen = vec![false; N];
    let mut after: Option<Value> = None;
    let mut pages = 0;
    let mut prev = -1i64;
    loop {
        let mut body = json!({"size": 1000, "sort": [{"n": "asc"}], "_source": false, "query": {"match_all": {}}});
        if let Some(a) = &after {
            body["search_after"] = a.clone();
        }
        let (s, v) = es.post("/big/_search", &body.to_string());
        assert_eq!(s, 200, "{v}");
        let hits = v["hits"]["hits"].as_array().unwrap();
        if hits.is_empty() {
            break;
        }
        pages += 1;
        for h in hits {
            let n = h["sort"][0].as_i64().unwrap();
            assert!(n > prev, "out of order: {n} after {prev}");
            prev = n;
            assert!(!seen[n as usize], "{n} seen twice");
            seen[n as usize] = true;
        }
        after = Some(hits.last().unwrap()["sort"].clone());
        assert_eq!(v["hits"]["total"], json!({"value":10000,"relation":"gte"}));
    }
    assert_eq!(pages, 25);
    assert!(seen.iter().all(|s| *s));
    // Two sort keys with ties on the first, paged with a small page size.
    let mut count = 0;
    let mut after: Option<Value> = None;
    let mut prev: Option<(String, i64)> = None;
    loop {
        let mut body = json!({"size": 3333, "sort": [{"g": "desc"}, {"n": "asc"}], "_source": false, "track_total_hits": true});
        if let Some(a) = &after {
            body["search_after"] = a.clone();
        }
        let (_, v) = es.post("/big/_search", &body.to_string());
        assert_eq!(v["hits"]["total"]["value"], N as u64);
        let hits = v["hits"]["hits"].as_array().unwrap();
        if hits.is_empty() {
            break;
        }
        for h in hits {
            let k = (
                h["sort"][0].as_str().unwrap().to_string(),
                h["sort"][1].as_i64().unwrap(),
            );
            if let Some(p) = &prev {
                assert!(k.0 < p.0 || (k.0 == p.0 && k.1 > p.1), "{k:?} after {p:?}");
            }
            prev = Some(k);
            count += 1;
        }
        after = Some(hits.last().unwrap()["sort"].clone());
    }
    assert_eq!(count, N);
    // Result window.
    let v = es.expect_err(
        "POST",
        "/big/_search",
        Some(r#"{"from":9995,"size":10}"#),
        400,
        "search_phase_execution_exception",
        "all shards failed",
    );
    assert_eq!(
        v["error"]["root_cause"][0]["type"],
        "illegal_argument_exception"
    );
    assert_eq!(
        v["error"]["root_cause"][0]["reason"],
        "Result window is too large, from + size must be less than or equal to: [10000] but was [10005]. See the scroll api for a more efficient way to request large data sets. This limit can be set by changing the [index.max_result_window] index level setting."
    );
    assert_eq!(
        es.post("/big/_search", r#"{"from":9990,"size":10,"_source":false}"#)
            .0,
        200
    );
    es.expect_err(
        "POST",
        "/big/_search?size=10001",
        None,
        400,
        "search_phase_execution_exception",
        "all shards failed",
    );
    // search_after arity.
    let v = es.expect_err(
        "POST",
        "/big/_search",
        Some(r#"{"sort":[{"n":"asc"}],"search_after":[1,2]}"#),
        400,
        "search_phase_execution_exception",
        "",
    );
    assert_eq!(
        v["error"]["root_cause"][0]["reason"],
        "search_after has 2 value(s) but sort has 1."
    );
    es.expect_err(
        "POST",
        "/big/_search",
        Some(r#"{"sort":[{"n":"asc"}],"search_after":[1],"from":5}"#),
        400,
        "action_request_validation_exception",
        "`from` parameter must be set to 0 when `search_after` is used.",
    );
}

#[test]
fn point_in_time_is_a_frozen_snapshot() {
    let es = start();
    load_tree(&es);
    let (s, v) = es.post("/fs/_pit?keep_alive=1m", "");
    assert_eq!(s, 200, "{v}");
    let pit = v["id"].as_str().unwrap().to_string();
    assert_eq!(v["_shards"]["successful"], 1);
    // Changes after the PIT are invisible to it, visible to normal search.
    es.put("/fs/_doc/new?refresh=true", r#"{"name":"new","size":5}"#);
    es.delete("/fs/_doc/7?refresh=true");
    es.put("/fs/_doc/2?refresh=true", r#"{"name":"changed","size":10}"#);
    let body = |after: Option<Value>| {
        let mut b =
            json!({"size": 3, "pit": {"id": pit, "keep_alive": "1m"}, "sort": [{"size": "asc"}]});
        if let Some(a) = after {
            b["search_after"] = a;
        }
        b.to_string()
    };
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let (s, v) = es.post("/_search", &body(after.clone()));
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["pit_id"], pit.as_str());
        let hits = v["hits"]["hits"].as_array().unwrap().clone();
        if hits.is_empty() {
            break;
        }
        for h in &hits {
            // The implicit _shard_doc tiebreaker is appended.
            assert_eq!(h["sort"].as_array().unwrap().len(), 2, "{h}");
            all.push((
                h["_id"].as_str().unwrap().to_string(),
                h["_source"]["name"].clone(),
            ));
        }
        after = Some(hits.last().unwrap()["sort"].clone());
    }
    let ids: Vec<&str> = all.iter().map(|(i, _)| i.as_str()).collect();
    assert_eq!(ids, vec!["1", "2", "3", "4", "5", "6", "7"]);
    assert_eq!(all[1].1, "a");
    let now = sorted(es.ids("/fs", r#"{"size":100}"#));
    assert_eq!(now, vec!["1", "2", "3", "4", "5", "6", "new"]);
    // Ties on the sort value are broken by _shard_doc consistently.
    let (_, v) = es.post(
        "/_search",
        &json!({"size": 100, "pit": {"id": pit}, "sort": [{"kind": "asc"}]}).to_string(),
    );
    let sd: Vec<i64> = v["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["sort"][1].as_i64().unwrap())
        .collect();
    let kinds: Vec<&str> = v["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["sort"][0].as_str().unwrap())
        .collect();
    for i in 1..sd.len() {
        assert!(
            kinds[i - 1] < kinds[i] || sd[i - 1] < sd[i],
            "{kinds:?} {sd:?}"
        );
    }
    // An explicit _shard_doc sort is not duplicated.
    let (_, v) = es.post(
        "/_search",
        &json!({"size": 1, "pit": {"id": pit}, "sort": [{"_shard_doc": "desc"}]}).to_string(),
    );
    assert_eq!(v["hits"]["hits"][0]["sort"].as_array().unwrap().len(), 1);
    // Errors.
    let v = es.expect_err(
        "POST",
        "/fs/_search",
        Some(&json!({"pit": {"id": pit}}).to_string()),
        400,
        "action_request_validation_exception",
        "[indices] cannot be used with point in time",
    );
    assert!(
        v["error"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("Validation Failed: 1: ")
    );
    es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"sort":["_shard_doc"]}"#),
        400,
        "search_phase_execution_exception",
        "",
    );
    es.expect_err(
        "POST",
        "/fs/_pit",
        None,
        400,
        "action_request_validation_exception",
        "[keep_alive] is not specified",
    );
    // Close, then it is gone (Elasticsearch 9.5.3: one context freed per shard, and a
    // point in time already gone is a 404 that did not succeed).
    let (s, v) = es.req("DELETE", "/_pit", Some(&json!({"id": pit}).to_string()));
    assert_eq!((s, v), (200, json!({"succeeded":true,"num_freed":1})));
    let (s, v) = es.req("DELETE", "/_pit", Some(&json!({"id": pit}).to_string()));
    assert_eq!((s, v), (404, json!({"succeeded":false,"num_freed":0})));
    let v = es.expect_err(
        "POST",
        "/_search",
        Some(&json!({"pit": {"id": pit}}).to_string()),
        404,
        "search_phase_execution_exception",
        "all shards failed",
    );
    assert_eq!(
        v["error"]["root_cause"][0]["type"],
        "search_context_missing_exception"
    );
}

#[test]
fn point_in_time_keep_alive_expires() {
    let es = start();
    load_tree(&es);
    let (_, v) = es.post("/fs/_pit?keep_alive=300ms", "");
    let pit = v["id"].as_str().unwrap().to_string();
    // Each search extends the keep alive.
    for _ in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(150));
        let (s, _) = es.post(
            "/_search",
            &json!({"pit": {"id": pit, "keep_alive": "300ms"}}).to_string(),
        );
        assert_eq!(s, 200);
    }
    std::thread::sleep(std::time::Duration::from_millis(450));
    let v = es.expect_err(
        "POST",
        "/_search",
        Some(&json!({"pit": {"id": pit}}).to_string()),
        404,
        "search_phase_execution_exception",
        "",
    );
    assert_eq!(
        v["error"]["root_cause"][0]["type"],
        "search_context_missing_exception"
    );
    es.expect_err(
        "POST",
        "/fs/_pit?keep_alive=2d",
        None,
        400,
        "illegal_argument_exception",
        "Keep alive for request (2d) is too large",
    );
    es.expect_err(
        "POST",
        "/_search",
        Some(r#"{"pit":{"id":"garbage"}}"#),
        400,
        "illegal_argument_exception",
        "invalid id",
    );
}

#[test]
fn multi_index_search_and_count() {
    let es = start();
    es.put("/a1/_doc/1?refresh=true", r#"{"v":1}"#);
    es.put("/a2/_doc/1?refresh=true", r#"{"v":2}"#);
    es.put("/b1/_doc/1?refresh=true", r#"{"v":3}"#);
    let (_, v) = es.post("/a1,a2/_search", r#"{"sort":["v"]}"#);
    let idx: Vec<&str> = v["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["_index"].as_str().unwrap())
        .collect();
    assert_eq!(idx, vec!["a1", "a2"]);
    assert_eq!(v["_shards"]["total"], 2);
    assert_eq!(
        es.post("/a*/_count", "{}").1,
        json!({"count":2,"_shards":{"total":2,"successful":2,"skipped":0,"failed":0}})
    );
    assert_eq!(es.post("/_count", "{}").1["count"], 3);
    assert_eq!(
        es.post("/_search", r#"{"query":{"term":{"_index":"b1"}}}"#)
            .1["hits"]["total"]["value"],
        1
    );
    assert_eq!(es.post("/zz*/_search", "{}").1["hits"]["total"]["value"], 0);
    es.expect_err(
        "POST",
        "/a1,zz/_search",
        Some("{}"),
        404,
        "index_not_found_exception",
        "no such index [zz]",
    );
    assert_eq!(
        es.post("/a1,zz/_search?ignore_unavailable=true", "{}").0,
        200
    );
    assert_eq!(
        es.post("/_refresh", "").1["_shards"],
        json!({"total":6,"successful":3,"failed":0})
    );
    es.expect_err(
        "POST",
        "/a1/_count",
        Some(r#"{"size":1}"#),
        400,
        "parsing_exception",
        "request does not support [size]",
    );
}

#[test]
fn trigram_substring_search() {
    let es = start();
    let body = r#"{
      "settings": {
        "index": {"number_of_shards": 1, "refresh_interval": "1s", "max_result_window": 10000},
        "analysis": {
          "tokenizer": {"tri": {"type": "ngram", "min_gram": 3, "max_gram": 3}},
          "analyzer": {"tri": {"type": "custom", "tokenizer": "tri", "filter": ["lowercase"]}}
        }
      },
      "mappings": {"dynamic": false, "_meta": {"format": 2}, "properties": {"contents": {"type": "text", "analyzer": "tri"}}}
    }"#;
    let (s, v) = es.put("/t", body);
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        es.get("/t/_mapping").1["t"]["mappings"]["_meta"]["format"],
        2
    );
    es.put("/t/_doc/1", r#"{"contents":"The Quick Brown Fox"}"#);
    es.put(
        "/t/_doc/2?refresh=true",
        r#"{"contents":"quickly, brownish"}"#,
    );
    let m = |q: &str| {
        sorted(es.ids(
            "/t",
            &json!({"query":{"match":{"contents":{"query":q,"operator":"and"}}}}).to_string(),
        ))
    };
    assert_eq!(m("QUICK"), vec!["1", "2"]);
    assert_eq!(m("k brown"), vec!["1"]);
    assert_eq!(m("brownish"), vec!["2"]);
    assert_eq!(m("fox"), vec!["1"]);
    assert!(m("xyz").is_empty());
    // Shorter than a gram: no tokens, no match (zero_terms_query none).
    assert!(m("ab").is_empty());
    es.expect_err("PUT", "/t2", Some(r#"{"settings":{"analysis":{"tokenizer":{"g":{"type":"ngram","min_gram":2,"max_gram":4}},"analyzer":{"a":{"tokenizer":"g"}}}}}"#),
        400, "illegal_argument_exception", "The difference between max_gram and min_gram in NGram Tokenizer must be less than or equal to: [1] but was [2]");
    assert_eq!(es.put("/t3", r#"{"settings":{"index":{"max_ngram_diff":2},"analysis":{"tokenizer":{"g":{"type":"ngram","min_gram":2,"max_gram":4}},"analyzer":{"a":{"tokenizer":"g"}}}}}"#).0, 200);
}

#[test]
fn term_index_stays_exact_across_refreshes_and_pits() {
    let es = start();
    es.put("/t", r#"{"settings":{"refresh_interval":"-1"},"mappings":{"properties":{"k":{"type":"keyword"},"n":{"type":"long"}}}}"#);
    let mut body = String::new();
    for i in 0..3000 {
        body.push_str(&format!(
            "{{\"index\":{{\"_id\":\"{i}\"}}}}\n{{\"k\":\"g{}\",\"n\":{}}}\n",
            i % 3,
            i % 5
        ));
    }
    es.bulk("/t/_bulk?refresh=true", &body);
    let count = |q: Value| {
        es.post("/t/_count", &json!({ "query": q }).to_string()).1["count"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(count(json!({"term":{"k":"g0"}})), 1000);
    assert_eq!(count(json!({"terms":{"n":[0, 1]}})), 1200);
    let (_, v) = es.post("/t/_pit?keep_alive=1m", "");
    let pit = v["id"].as_str().unwrap().to_string();
    // Move docs between terms, delete some, add some; small and large deltas.
    for round in 0..3 {
        let mut body = String::new();
        let n = if round == 2 { 2000 } else { 10 };
        for i in 0..n {
            body.push_str(&format!(
                "{{\"index\":{{\"_id\":\"{i}\"}}}}\n{{\"k\":\"g1\",\"n\":7}}\n"
            ));
        }
        body.push_str(&format!(
            "{{\"delete\":{{\"_id\":\"{}\"}}}}\n",
            2999 - round
        ));
        body.push_str(&format!(
            "{{\"index\":{{\"_id\":\"new{round}\"}}}}\n{{\"k\":\"g0\",\"n\":0}}\n"
        ));
        es.bulk("/t/_bulk?refresh=true", &body);
        let mut expect_g0 = 0;
        let mut expect_n0 = 0;
        let changed = if round == 2 { 2000 } else { 10 };
        for i in 0..3000 {
            if i >= 3000 - (round + 1) as usize {
                continue;
            }
            if i < changed {
                continue;
            }
            if i % 3 == 0 {
                expect_g0 += 1;
            }
            if i % 5 == 0 {
                expect_n0 += 1;
            }
        }
        assert_eq!(
            count(json!({"term":{"k":"g0"}})),
            expect_g0 + round as u64 + 1,
            "round {round}"
        );
        assert_eq!(
            count(json!({"term":{"n":0}})),
            expect_n0 + round as u64 + 1,
            "round {round}"
        );
        assert_eq!(count(json!({"term":{"n":7}})), changed as u64);
    }
    // The point in time still sees the old terms.
    let (_, v) = es.post(
        "/_search",
        &json!({"pit":{"id":pit},"size":0,"query":{"term":{"k":"g0"}},"track_total_hits":true})
            .to_string(),
    );
    assert_eq!(v["hits"]["total"]["value"], 1000);
    let (_, v) = es.post(
        "/_search",
        &json!({"pit":{"id":pit},"size":0,"query":{"term":{"n":7}}}).to_string(),
    );
    assert_eq!(v["hits"]["total"]["value"], 0);
}

/// Elasticsearch accepts a point-in-time `search_after` without the implicit `_shard_doc`
/// tiebreaker (backward compatibility): the page starts strictly after every document whose
/// other sort values equal the given ones.
#[test]
fn pit_search_after_may_omit_the_implicit_tiebreaker() {
    let es = start();
    es.put(
        "/t",
        r#"{"mappings":{"properties":{"n":{"type":"long"},"k":{"type":"keyword"}}}}"#,
    );
    let mut body = String::new();
    for (id, n) in [("a", 1), ("b", 2), ("c", 2), ("d", 2), ("e", 3), ("f", 1)] {
        body.push_str(&format!(
            "{{\"index\":{{\"_id\":\"{id}\"}}}}\n{{\"n\":{n}}}\n"
        ));
    }
    let (s, v) = es.bulk("/t/_bulk?refresh=true", &body);
    assert_eq!((s, v["errors"].as_bool()), (200, Some(false)), "{v}");
    let (_, v) = es.post("/t/_pit?keep_alive=1m", "");
    let pit = v["id"].as_str().unwrap().to_string();
    let search = |sort: Value, after: Value| {
        es.post(
            "/_search",
            &json!({"pit": {"id": pit}, "sort": sort, "search_after": after}).to_string(),
        )
    };
    // One value for a one-field sort: everything with n == 2 is skipped.
    let (s, v) = search(json!([{"n": "asc"}]), json!([2]));
    assert_eq!(s, 200, "{v}");
    let ids: Vec<&str> = v["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["e"]);
    // The hits still carry the tiebreaker.
    assert_eq!(v["hits"]["hits"][0]["sort"].as_array().unwrap().len(), 2);
    let (_, v) = search(json!([{"n": "desc"}]), json!([2]));
    let ids: Vec<&str> = v["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["a", "f"]);
    // Two fields, both given: only the (implicit) tiebreaker is missing.
    let (s, v) = search(json!([{"n": "asc"}, "_score"]), json!([1, 1.0]));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["hits"]["hits"].as_array().unwrap().len(), 4);
    // Fewer values than that, or more than the sort plus the tiebreaker, are refused.
    es.expect_err(
        "POST",
        "/_search",
        Some(
            &json!({"pit": {"id": pit}, "sort": [{"n": "asc"}, "_score"], "search_after": [1]})
                .to_string(),
        ),
        400,
        "search_phase_execution_exception",
        "",
    );
    let (s, v) = search(json!([{"n": "asc"}]), json!([1, 2, 3]));
    assert_eq!(s, 400);
    assert_eq!(
        v["error"]["root_cause"][0]["reason"],
        "search_after has 3 value(s) but sort has 2."
    );
    // An explicit _shard_doc is not implicit: its value cannot be left out.
    let (s, v) = search(json!([{"n": "asc"}, "_shard_doc"]), json!([2]));
    assert_eq!(s, 400);
    assert_eq!(
        v["error"]["root_cause"][0]["reason"],
        "search_after has 1 value(s) but sort has 2."
    );
}

/// A `_score` sort value is a float, rendered like `_score` (0.3, not 0.30000001192092896),
/// and taken back as `search_after` without losing ties.
#[test]
fn score_sort_values_render_like_score() {
    let es = start();
    let mut body = String::new();
    for i in 0..4 {
        body.push_str(&format!(
            "{{\"index\":{{\"_id\":\"d{i}\"}}}}\n{{\"k\":\"x\"}}\n"
        ));
    }
    let (s, v) = es.bulk("/t/_bulk?refresh=true", &body);
    assert_eq!((s, v["errors"].as_bool()), (200, Some(false)), "{v}");
    let q = json!({"term": {"k": {"value": "x", "boost": 0.3}}});
    let (_, v) = es.post(
        "/t/_search",
        &json!({"query": q, "sort": ["_score", "_doc"], "size": 2}).to_string(),
    );
    let hits = v["hits"]["hits"].as_array().unwrap();
    for h in hits {
        assert_eq!(h["sort"][0], h["_score"], "{h}");
    }
    assert_eq!(hits[0]["_score"].as_f64(), Some(0.3), "{v}");
    let (_, v) = es.post(
        "/t/_search",
        &json!({"query": q, "sort": ["_score", "_doc"], "search_after": hits[1]["sort"]})
            .to_string(),
    );
    let ids: Vec<&str> = v["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["d2", "d3"]);
}

/// A point-in-time search sorted by `_score` gets the `_shard_doc` tiebreaker: it returns both
/// as `sort` and pages with them. Without `sort` there is no tiebreaker and no sort values,
/// and `search_after` is refused (as Elasticsearch 9.5.3 answers).
#[test]
fn pit_search_by_score_pages_with_shard_doc() {
    let es = start();
    es.put("/t", r#"{"mappings":{"properties":{"n":{"type":"long"},"k":{"type":"keyword"},"x":{"type":"text"}}}}"#);
    const N: usize = 2500;
    let mut body = String::new();
    for i in 0..N {
        let text = if i % 3 == 0 { "apple apple" } else { "apple" };
        body.push_str(&format!(
            "{{\"index\":{{\"_id\":\"d{i}\"}}}}\n{{\"n\":{i},\"x\":\"{text}\"}}\n"
        ));
    }
    let (s, v) = es.bulk("/t/_bulk?refresh=true", &body);
    assert_eq!((s, v["errors"].as_bool()), (200, Some(false)));
    let (_, v) = es.post("/t/_pit?keep_alive=1m", "");
    let pit = v["id"].as_str().unwrap().to_string();
    // A boost that is not exact in binary: `sort` renders the score as `_score` does (a
    // float) and takes it back without losing the tie.
    for query in [
        json!({"match_all": {}}),
        json!({"match": {"x": "apple"}}),
        json!({"match": {"x": {"query": "apple", "boost": 0.3}}}),
    ] {
        let mut seen = std::collections::HashSet::new();
        let mut after: Option<Value> = None;
        let mut prev: Option<(f64, i64)> = None;
        let mut pages = 0;
        loop {
            let mut b = json!({"size": 1000, "pit": {"id": pit, "keep_alive": "1m"}, "query": query, "_source": false, "sort": ["_score"]});
            if let Some(a) = &after {
                b["search_after"] = a.clone();
            }
            let (s, v) = es.post("/_search", &b.to_string());
            assert_eq!(s, 200, "{v}");
            let hits = v["hits"]["hits"].as_array().unwrap();
            if hits.is_empty() {
                break;
            }
            pages += 1;
            assert!(pages <= 3, "paging does not advance");
            for h in hits {
                let sort = h["sort"]
                    .as_array()
                    .unwrap_or_else(|| panic!("no sort: {h}"));
                assert_eq!(sort.len(), 2, "{h}");
                let score = sort[0].as_f64().unwrap();
                assert_eq!(score, h["_score"].as_f64().unwrap());
                let k = (score, sort[1].as_i64().unwrap());
                if let Some(p) = prev {
                    assert!(k.0 < p.0 || (k.0 == p.0 && k.1 > p.1), "{k:?} after {p:?}");
                }
                prev = Some(k);
                assert!(seen.insert(h["_id"].as_str().unwrap().to_string()));
            }
            after = Some(hits.last().unwrap()["sort"].clone());
        }
        assert_eq!((pages, seen.len()), (3, N), "{query}");
    }
    // The score alone (tiebreaker omitted) is accepted too.
    let (s, v) = es.post(
        "/_search",
        &json!({"pit": {"id": pit}, "query": {"match": {"x": "apple"}}, "search_after": [f64::MAX], "size": 1, "sort": ["_score"]}).to_string(),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["hits"]["hits"].as_array().unwrap().len(), 1);
    // Without sort, with or without a point in time: no sort values, no search_after.
    for (path, pit) in [
        ("/_search", json!({"id": pit})),
        ("/t/_search", Value::Null),
    ] {
        let mut b = json!({"size": 1});
        if !pit.is_null() {
            b["pit"] = pit;
        }
        let (s, v) = es.post(path, &b.to_string());
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["hits"]["hits"][0]["_score"], 1.0);
        assert!(v["hits"]["hits"][0].get("sort").is_none(), "{v}");
        b["search_after"] = json!([1.0]);
        let (s, v) = es.post(path, &b.to_string());
        assert_eq!(s, 400, "{v}");
        assert_eq!(v["error"]["type"], "search_phase_execution_exception");
        let err = json!({"type": "illegal_argument_exception", "reason": "Sort must contain at least one field."});
        assert_eq!(v["error"]["root_cause"], json!([err]));
    }
}

/// `terminate_after`, as Elasticsearch 9.5.3 answers it (rest-api-spec count/10_basic.yml
/// "test negative terminate_after throws IAE"): a negative value is refused before the
/// indices are looked at, so even a missing index gets the 400; 0 is the default.
#[test]
fn negative_terminate_after_is_refused_before_index_resolution() {
    let es = start();
    es.put("/t", "{}");
    for (method, path, body) in [
        ("GET", "/index1/_count?terminate_after=-1", None),
        ("GET", "/t/_count?terminate_after=-1", None),
        ("GET", "/t/_search?terminate_after=-1", None),
        ("GET", "/missing/_search?terminate_after=-1", None),
        ("POST", "/t/_search", Some(r#"{"terminate_after": -1}"#)),
        (
            "POST",
            "/missing/_search",
            Some(r#"{"terminate_after": -1}"#),
        ),
    ] {
        let (s, v) = es.req(method, path, body);
        assert_eq!(s, 400, "{path}: {v}");
        let err =
            json!({"type": "illegal_argument_exception", "reason": "terminateAfter must be > 0"});
        assert_eq!(
            v,
            json!({"error": {"root_cause": [err.clone()], "type": err["type"], "reason": err["reason"]}, "status": 400}),
            "{path}"
        );
    }
    assert_eq!(
        es.get("/t/_count?terminate_after=0"),
        (
            200,
            json!({"count": 0, "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0}})
        )
    );
    assert_eq!(es.get("/t/_search?terminate_after=0").0, 200);
    let v = es.expect_err(
        "GET",
        "/t/_count?terminate_after=x",
        None,
        400,
        "illegal_argument_exception",
        "Failed to parse int parameter [terminate_after] with value [x]",
    );
    assert_eq!(
        v["error"]["caused_by"],
        json!({"type": "number_format_exception", "reason": "For input string: \"x\""})
    );
    // A negative size in the URL is reported first, as in Elasticsearch.
    es.expect_err(
        "GET",
        "/t/_search?terminate_after=-5&size=-1",
        None,
        400,
        "illegal_argument_exception",
        "[size] parameter cannot be negative, found [-1]",
    );
}

/// The hits' `_id` and `sort` values of a search.
fn ids_and_sorts(es: &Es, path: &str, body: Value) -> Vec<(String, Value)> {
    let (s, v) = es.post(path, &body.to_string());
    assert_eq!(s, 200, "{body}: {v}");
    v["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["_id"].as_str().unwrap().to_string(), h["sort"].clone()))
        .collect()
}

fn one(id: &str, sort: Value) -> Vec<(String, Value)> {
    vec![(id.to_string(), sort)]
}

/// `search_after` on `date` and `date_nanos` fields with a custom format, as Elasticsearch
/// 9.5.3 answers rest-api-spec search/90_search_after.yml "date" and "date_nanos": sort
/// values are epoch milliseconds (nanoseconds), and `search_after` takes them as numbers or
/// as text in the field's format.
#[test]
fn search_after_on_date_and_date_nanos() {
    let es = start();
    for (index, ty, fmt, early, late) in [
        (
            "date",
            "date",
            "yyyy-MM-dd HH:mm:ss.SSS",
            "2019-10-21 00:30:04.828",
            "2019-10-21 08:30:04.828",
        ),
        (
            "nanos",
            "date_nanos",
            "yyyy-MM-dd HH:mm:ss.SSSSSS",
            "2019-10-21 00:30:04.828740",
            "2019-10-21 08:30:04.828733",
        ),
    ] {
        es.put(
            &format!("/{index}"),
            &json!({"mappings": {"properties": {"timestamp": {"type": ty, "format": fmt}}}})
                .to_string(),
        );
        let body = format!(
            "{{\"index\":{{\"_id\":\"early\"}}}}\n{{\"timestamp\":\"{early}\"}}\n{{\"index\":{{\"_id\":\"late\"}}}}\n{{\"timestamp\":\"{late}\"}}\n"
        );
        let (s, v) = es.bulk(&format!("/{index}/_bulk?refresh=true"), &body);
        assert_eq!((s, v["errors"].as_bool()), (200, Some(false)), "{v}");
    }
    let search = |index: &str, after: Option<Value>| {
        let mut body = json!({"size": 1, "sort": [{"timestamp": "desc"}]});
        if let Some(a) = after {
            body["search_after"] = a;
        }
        ids_and_sorts(&es, &format!("/{index}/_search"), body)
    };
    assert_eq!(search("date", None), one("late", json!([1571646604828i64])));
    let next = one("early", json!([1571617804828i64]));
    assert_eq!(search("date", Some(json!([1571646604828i64]))), next);
    assert_eq!(
        search("date", Some(json!(["2019-10-21 08:30:04.828"]))),
        next
    );
    assert_eq!(
        search("nanos", None),
        one("late", json!([1571646604828733000i64]))
    );
    let next = one("early", json!([1571617804828740000i64]));
    assert_eq!(search("nanos", Some(json!([1571646604828733000i64]))), next);
    assert_eq!(
        search("nanos", Some(json!(["2019-10-21 08:30:04.828733"]))),
        next
    );
    // Text the format does not read is refused as Elasticsearch refuses it.
    let (s, v) = es.post(
        "/date/_search",
        r#"{"sort": [{"timestamp": "asc"}], "search_after": ["nonsense"]}"#,
    );
    assert_eq!(s, 400, "{v}");
    let why = "failed to parse date field [nonsense] with format [yyyy-MM-dd HH:mm:ss.SSS]";
    assert_eq!(v["error"]["type"], "search_phase_execution_exception");
    assert_eq!(
        v["error"]["root_cause"],
        json!([{"type": "parse_exception", "reason": format!("{why}: [{why}]")}])
    );
    assert_eq!(
        v["error"]["failed_shards"][0]["reason"]["caused_by"],
        json!({"type": "illegal_argument_exception", "reason": why})
    );
    assert!(v["error"].get("caused_by").is_none(), "{v}");
    // Epoch milliseconds as text are not in that format either.
    let (s, v) = es.post(
        "/date/_search",
        r#"{"sort": [{"timestamp": "asc"}], "search_after": ["1613032204828"]}"#,
    );
    assert_eq!(
        (s, &v["error"]["root_cause"][0]["type"]),
        (400, &json!("parse_exception")),
        "{v}"
    );
}

/// Sort `format`, as Elasticsearch 9.5.3 answers rest-api-spec search/90_search_after.yml
/// "Format sort values" and search/630_format_sort_missing_dates.yml: date sort values become
/// strings in the sort's format (missing ones null), `search_after` is read in that format,
/// and `numeric_type` sorts `date` and `date_nanos` indices together.
#[test]
fn sort_format_and_numeric_type() {
    let es = start();
    es.put("/test", r#"{"mappings": {"properties": {"timestamp": {"type": "date", "format": "yyyy-MM-dd HH:mm:ss.SSS"}, "n": {"type": "long"}, "k": {"type": "keyword"}}}}"#);
    es.put("/test_nanos", r#"{"mappings": {"properties": {"timestamp": {"type": "date_nanos", "format": "dd/MM/yyyy HH:mm:ss.SSS"}, "t2": {"type": "date_nanos", "format": "yyyy-MM-dd HH:mm:ss.SSSSSS"}}}}"#);
    let body = concat!(
        "{\"index\":{\"_id\":\"a\"}}\n{\"timestamp\":\"2021-10-13 00:30:04.828\"}\n",
        "{\"index\":{\"_id\":\"b\"}}\n{\"timestamp\":\"2021-06-11 04:30:04.828\"}\n",
        "{\"index\":{\"_id\":\"c\"}}\n{\"timestamp\":\"2021-02-11 08:30:04.828\"}\n",
        "{\"index\":{\"_id\":\"m\"}}\n{\"n\":1}\n",
    );
    assert_eq!(es.bulk("/test/_bulk?refresh=true", body).0, 200);
    let body = concat!(
        "{\"index\":{\"_id\":\"na\"}}\n{\"timestamp\":\"21/08/2021 03:30:04.732\",\"t2\":\"2021-10-13 00:30:04.828123\"}\n",
        "{\"index\":{\"_id\":\"nb\"}}\n{\"timestamp\":\"20/05/2021 05:30:04.832\",\"t2\":\"2021-06-11 04:30:04.000456\"}\n",
        "{\"index\":{\"_id\":\"nc\"}}\n{\"timestamp\":\"15/04/2021 06:30:04.821\"}\n",
    );
    assert_eq!(es.bulk("/test_nanos/_bulk?refresh=true", body).0, 200);
    let sort = |fmt: &str, order: &str| json!([{"timestamp": {"order": order, "format": fmt}}]);
    let iso = "strict_date_optional_time_nanos";
    let pairs = |v: &[(&str, Value)]| -> Vec<(String, Value)> {
        v.iter().map(|(i, s)| (i.to_string(), json!([s]))).collect()
    };
    assert_eq!(
        ids_and_sorts(
            &es,
            "/test/_search",
            json!({"size": 4, "sort": sort(iso, "asc")})
        ),
        pairs(&[
            ("c", json!("2021-02-11T08:30:04.828Z")),
            ("b", json!("2021-06-11T04:30:04.828Z")),
            ("a", json!("2021-10-13T00:30:04.828Z")),
            ("m", json!(null)),
        ])
    );
    assert_eq!(
        ids_and_sorts(
            &es,
            "/test/_search",
            json!({"size": 1, "sort": sort(iso, "asc"), "search_after": ["2021-02-11T08:30:04.828Z"]})
        ),
        one("b", json!(["2021-06-11T04:30:04.828Z"]))
    );
    let custom = "yyyy-MM-dd | HH:mm:ss.SSS";
    assert_eq!(
        ids_and_sorts(
            &es,
            "/test/_search",
            json!({"size": 1, "sort": sort(custom, "asc"), "search_after": ["2021-02-11 | 08:30:04.828"]})
        ),
        one("b", json!(["2021-06-11 | 04:30:04.828"]))
    );
    let desc_first =
        json!([{"timestamp": {"order": "desc", "format": "epoch_millis", "missing": "_first"}}]);
    assert_eq!(
        ids_and_sorts(&es, "/test/_search", json!({"size": 2, "sort": desc_first})),
        pairs(&[("m", json!(null)), ("a", json!("1634085004828"))])
    );
    // Nanoseconds keep their digits in the nanos format and in epoch_millis' fraction.
    let t2 = |fmt: &str| json!({"size": 1, "sort": [{"t2": {"format": fmt}}]});
    assert_eq!(
        ids_and_sorts(&es, "/test_nanos/_search", t2(iso)),
        one("nb", json!(["2021-06-11T04:30:04.000456Z"]))
    );
    assert_eq!(
        ids_and_sorts(&es, "/test_nanos/_search", t2("strict_date_optional_time")),
        one("nb", json!(["2021-06-11T04:30:04.000Z"]))
    );
    assert_eq!(
        ids_and_sorts(&es, "/test_nanos/_search", t2("epoch_millis")),
        one("nb", json!(["1623385804000.456"]))
    );
    // Mixed date and date_nanos indices, converted by numeric_type.
    let mixed = |numeric: &str, after: Option<&str>| {
        let mut b = json!({"size": 2, "sort": [{"timestamp": {"order": "asc", "format": iso, "numeric_type": numeric}}]});
        if let Some(a) = after {
            b["search_after"] = json!([a]);
        }
        ids_and_sorts(&es, "/tes*/_search", b)
    };
    assert_eq!(
        mixed("date_nanos", None),
        pairs(&[
            ("c", json!("2021-02-11T08:30:04.828Z")),
            ("nc", json!("2021-04-15T06:30:04.821Z"))
        ])
    );
    assert_eq!(
        mixed("date", Some("2021-04-15T06:30:04.821Z")),
        pairs(&[
            ("nb", json!("2021-05-20T05:30:04.832Z")),
            ("b", json!("2021-06-11T04:30:04.828Z"))
        ])
    );
    let raw =
        json!({"size": 2, "sort": [{"timestamp": {"order": "asc", "numeric_type": "date_nanos"}}]});
    assert_eq!(
        ids_and_sorts(&es, "/tes*/_search", raw),
        pairs(&[
            ("c", json!(1613032204828000000i64)),
            ("nc", json!(1618468204821000000i64))
        ])
    );
    // A text search_after in another format than the sort's is refused.
    for fmt in ["yyyy-MM-dd HH:mm:ss.SSS", "epoch_millis"] {
        let b = json!({"sort": sort(fmt, "asc"), "search_after": ["2021-02-11T08:30:04.828Z"]});
        let (s, v) = es.post("/test/_search", &b.to_string());
        let why =
            format!("failed to parse date field [2021-02-11T08:30:04.828Z] with format [{fmt}]");
        assert_eq!(s, 400, "{v}");
        assert_eq!(
            v["error"]["root_cause"][0]["reason"],
            format!("{why}: [{why}]")
        );
    }
    // Formats on other fields, unknown pattern letters and unknown numeric types.
    for (sort, reason) in [
        (
            json!({"n": {"format": "#.0"}}),
            "require a date_time formatter; got [decimal]",
        ),
        (
            json!({"k": {"format": "x"}}),
            "Field [k] of type [keyword] does not support custom formats",
        ),
        (
            json!({"timestamp": {"format": "bogus_format_name"}}),
            "Invalid format: [bogus_format_name]: Unknown pattern letter: b",
        ),
    ] {
        let (s, v) = es.post("/test/_search", &json!({"sort": [sort]}).to_string());
        assert_eq!(s, 400, "{v}");
        assert_eq!(v["error"]["type"], "search_phase_execution_exception");
        assert_eq!(
            v["error"]["root_cause"],
            json!([{"type": "illegal_argument_exception", "reason": reason}])
        );
        assert_eq!(v["error"]["caused_by"]["reason"], reason);
    }
    let (s, v) = es.post(
        "/test/_search",
        r#"{"sort": [{"timestamp": {"numeric_type": "bogus"}}]}"#,
    );
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["type"], "x_content_parse_exception");
    assert_eq!(
        v["error"]["caused_by"]["reason"],
        "invalid value for [numeric_type], must be [long, double, date, date_nanos], got bogus"
    );
}

/// `_msearch`, as Elasticsearch 9.5.3 answers rest-api-spec search/350_point_in_time.yml
/// "msearch" and its neighbours: searches under one point in time over two indices, each
/// answer with its `status`; failures of one search are its answer; a body that does not
/// parse, or a point in time next to an index, fails the whole request.
#[test]
fn msearch_with_a_point_in_time() {
    let es = start();
    for (index, id, age) in [
        ("test", "1", 18),
        ("test", "42", 18),
        ("test", "172", 24),
        ("test2", "45", 19),
    ] {
        let doc = json!({"id": id.parse::<i64>().unwrap(), "foo": "bar", "age": age});
        assert_eq!(
            es.put(&format!("/{index}/_doc/{id}"), &doc.to_string()).0,
            201
        );
    }
    es.refresh("test*");
    let (_, v) = es.post("/t*/_pit?keep_alive=5m", "");
    let pit = v["id"].as_str().unwrap().to_string();
    let body = format!(
        "{{}}\n{}\n{{}}\n{}\n",
        json!({"query": {"match": {"_index": "test"}}, "pit": {"id": pit}}),
        json!({"query": {"match_all": {}}, "pit": {"id": pit}}),
    );
    let (s, v) = es.bulk("/_msearch", &body);
    assert_eq!(s, 200, "{v}");
    assert!(v["took"].is_u64());
    let r = &v["responses"];
    assert_eq!(r.as_array().unwrap().len(), 2);
    assert_eq!(r[0]["hits"]["total"], json!({"value": 3, "relation": "eq"}));
    assert_eq!(r[1]["hits"]["total"], json!({"value": 4, "relation": "eq"}));
    for i in 0..2 {
        assert_eq!(r[i]["status"], 200);
        assert_eq!(r[i]["pit_id"], json!(pit));
        assert_eq!(r[i]["_shards"]["total"], 2);
    }
    // A point in time with an index: the whole request fails, one message per search.
    let body = format!(
        "{{\"index\":\"index\"}}\n{}\n{{\"index\":\"index2\"}}\n{}\n",
        json!({"query": {"match": {"foo": "bar"}}, "pit": {"id": pit}}),
        json!({"query": {"match_all": {}}, "pit": {"id": pit}}),
    );
    let (s, v) = es.bulk("/_msearch", &body);
    assert_eq!(s, 400, "{v}");
    let msg =
        "[indices] cannot be used with point in time. Do not specify any index with point in time.";
    assert_eq!(v["error"]["type"], "action_request_validation_exception");
    assert_eq!(
        v["error"]["reason"],
        format!("Validation Failed: 1: {msg};2: {msg};")
    );
    // Closing it frees one context per shard: two indices of one shard each.
    let (s, v) = es.req("DELETE", "/_pit", Some(&json!({"id": pit}).to_string()));
    assert_eq!((s, v), (200, json!({"succeeded": true, "num_freed": 2})));
    // Each search fails alone: a shard failure, a missing index.
    let body = concat!(
        "{\"index\":\"test\"}\n{\"query\":{\"term\":{\"age\":{\"value\":\"x\"}}}}\n",
        "{\"index\":\"nope\"}\n{}\n",
        "{\"index\":[\"test\"]}\n{\"size\":0}\n",
    );
    let (s, v) = es.bulk("/_msearch", body);
    assert_eq!(s, 200, "{v}");
    let r = &v["responses"];
    assert_eq!(r[0]["status"], 400);
    assert_eq!(r[0]["error"]["type"], "search_phase_execution_exception");
    let uuid = es.get("/test/_settings").1["test"]["settings"]["index"]["uuid"].clone();
    assert_eq!(
        r[0]["error"]["root_cause"],
        json!([{"type": "query_shard_exception", "reason": "failed to create query: For input string: \"x\"", "index_uuid": uuid, "index": "test"}])
    );
    assert_eq!(
        r[0]["error"]["failed_shards"][0]["reason"]["caused_by"],
        json!({"type": "number_format_exception", "reason": "For input string: \"x\""})
    );
    assert_eq!(r[1]["status"], 404);
    assert_eq!(r[1]["error"]["type"], "index_not_found_exception");
    assert_eq!(r[2]["status"], 200);
    assert_eq!(r[2]["hits"]["total"]["value"], 3);
    // Whole-request failures.
    for (body, status, ty, reason) in [
        (
            "{\"bogus\":1}\n{}\n",
            400,
            "illegal_argument_exception",
            "key [bogus] is not supported in the metadata section",
        ),
        (
            "{\"index\":\"test\"}\n{\"size\":-1}\n",
            400,
            "illegal_argument_exception",
            "[size] parameter cannot be negative, found [-1]",
        ),
        (
            "{\"index\":\"test\"}\n{\"query\":{\"bogus\":{}}}\n",
            400,
            "parsing_exception",
            "unknown query [bogus]",
        ),
        (
            "{\"index\":\"test\"}\n{\"terminate_after\":-1}\n",
            400,
            "illegal_argument_exception",
            "terminateAfter must be > 0",
        ),
        (
            "{\"index\":\"test\"}\n",
            400,
            "action_request_validation_exception",
            "Validation Failed: 1: no requests added;",
        ),
        (
            "{\"index\":\"test\"}\n{}",
            400,
            "illegal_argument_exception",
            "The msearch request must be terminated by a newline [\n]",
        ),
    ] {
        let (s, v) = es.bulk("/_msearch", body);
        assert_eq!(s, status, "{body}: {v}");
        assert_eq!(v["error"]["type"], ty, "{body}");
        assert_eq!(v["error"]["reason"], reason, "{body}");
    }
}

/// `stored_fields` in searches, as Elasticsearch 9.5.3 answers rest-api-spec
/// search/100_stored_fields.yml and search/10_source_filtering.yml "fields in body": `[]`
/// drops `_source`, `_none_` drops `_id` too, stored fields come back as `fields`.
#[test]
fn search_with_stored_fields() {
    let es = start();
    es.put("/sf", r#"{"mappings": {"properties": {"i": {"type": "integer", "store": true}, "o": {"properties": {"x": {"type": "long", "store": true}}}}}}"#);
    assert_eq!(
        es.put(
            "/sf/_doc/1?refresh=true",
            r#"{"i": 1, "o": {"x": 2}, "include": {"field2": "v2"}}"#
        )
        .0,
        201
    );
    let hit = |body: &str| {
        let (s, v) = es.post("/sf/_search", body);
        assert_eq!(s, 200, "{body}: {v}");
        v["hits"]["hits"][0].clone()
    };
    let bare = json!({"_index": "sf", "_id": "1", "_score": 1.0});
    assert_eq!(hit(r#"{"stored_fields": []}"#), bare);
    assert_eq!(hit(r#"{"stored_fields": ["o"]}"#), bare);
    assert_eq!(hit(r#"{"stored_fields": "i,o.x"}"#), bare);
    for none in [
        r#"{"stored_fields": "_none_"}"#,
        r#"{"stored_fields": ["_none_"]}"#,
    ] {
        assert_eq!(hit(none), json!({"_index": "sf", "_score": 1.0}));
    }
    assert_eq!(hit(r#"{"stored_fields": ["include.field2"]}"#), bare);
    let h = hit(r#"{"stored_fields": ["include.field2", "_source"]}"#);
    assert_eq!(h["_source"]["include"]["field2"], "v2");
    assert_eq!(
        hit(r#"{"stored_fields": ["i", "o.x"], "_source": {"includes": ["o"]}, "version": true}"#),
        json!({"_index": "sf", "_id": "1", "_version": 1, "_score": 1.0, "_source": {"o": {"x": 2}}, "fields": {"i": [1], "o.x": [2]}})
    );
    // The URL's stored_fields wins over the body's.
    let (_, v) = es.post(
        "/sf/_search?stored_fields=i",
        r#"{"stored_fields": ["o.x"]}"#,
    );
    assert_eq!(v["hits"]["hits"][0]["fields"], json!({"i": [1]}));
    es.expect_err(
        "POST",
        "/sf/_search",
        Some(r#"{"stored_fields": ["_none_", "i"]}"#),
        400,
        "illegal_argument_exception",
        "cannot combine _none_ with other fields",
    );
    es.expect_err(
        "POST",
        "/sf/_search?stored_fields=_none_",
        Some(r#"{"_source": true}"#),
        400,
        "action_request_validation_exception",
        "Validation Failed: 1: [stored_fields] cannot be disabled if [_source] is requested;",
    );
    es.expect_err(
        "POST",
        "/sf/_search",
        Some(r#"{"stored_fields": 5}"#),
        400,
        "parsing_exception",
        "Expected [VALUE_STRING] or [START_ARRAY] in [stored_fields] but found [VALUE_NUMBER]",
    );
}

/// A JSON number in a date field is read as text with the field's formats, as in
/// Elasticsearch 9.5.3: with the default format a 4-digit number is a year, a longer one
/// epoch milliseconds; a format without epoch_millis refuses numbers.
#[test]
fn date_numbers_are_read_with_the_field_format() {
    let es = start();
    es.put("/n", r#"{"mappings": {"properties": {"c": {"type": "date", "format": "yyyy-MM-dd HH:mm:ss.SSS"}, "d": {"type": "date"}}}}"#);
    let (s, v) = es.post("/n/_doc", r#"{"c": 1000}"#);
    assert_eq!(
        (s, &v["error"]["type"]),
        (400, &json!("document_parsing_exception")),
        "{v}"
    );
    for (id, d) in [
        ("year", "1000"),
        ("ms5", "99999"),
        ("ms", "1500000000000"),
        ("neg", "-5"),
    ] {
        let (s, v) = es.put(&format!("/n/_doc/{id}"), &format!("{{\"d\": {d}}}"));
        assert_eq!(s, 201, "{v}");
    }
    es.refresh("n");
    let got = ids_and_sorts(
        &es,
        "/n/_search",
        json!({"sort": [{"d": {"format": "strict_date_optional_time"}}]}),
    );
    assert_eq!(
        got,
        vec![
            ("year".to_string(), json!(["1000-01-01T00:00:00.000Z"])),
            ("neg".to_string(), json!(["1969-12-31T23:59:59.995Z"])),
            ("ms5".to_string(), json!(["1970-01-01T00:01:39.999Z"])),
            ("ms".to_string(), json!(["2017-07-14T02:40:00.000Z"])),
        ]
    );
}

/// `docvalue_fields`, as Elasticsearch 9.5.3 answers them (asked of it with this very
/// mapping and document): keywords sorted and unique (none over `ignore_above`), numbers
/// sorted with duplicates, dates in the requested format (else the field's; a field asked
/// twice takes the last format), with `stored_fields: _none_` no `_id`; a text field or one
/// without doc values fails the search.
#[test]
fn search_with_docvalue_fields() {
    let es = start();
    es.put(
        "/dv",
        r#"{"mappings":{"properties":{"k":{"type":"keyword","ignore_above":5},"n":{"type":"long"},"d":{"type":"date","format":"epoch_millis"},"e":{"type":"date"},"b":{"type":"boolean"},"t":{"type":"text"},"x":{"type":"keyword","doc_values":false}}}}"#,
    );
    let doc = r#"{"k":["b","a","b","toolong"],"n":[3,1,3],"d":1795855523467,"e":"2024-01-02T03:04:05.006Z","b":true,"t":"hello","x":"y"}"#;
    assert_eq!(es.put("/dv/_doc/1?refresh=true", doc).0, 201);
    let (s, v) = es.post(
        "/dv/_search",
        r#"{"_source":false,"stored_fields":"_none_","seq_no_primary_term":true,"docvalue_fields":["k","n","d","e","b","missing",{"field":"d","format":"epoch_second"},{"field":"e","format":"epoch_millis"}]}"#,
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["hits"]["hits"][0],
        json!({"_index":"dv","_seq_no":0,"_primary_term":1,"_score":1.0,"fields":{"b":[true],"d":["1795855523.467"],"e":["1704164645006"],"k":["a","b"],"n":[1,3,3]}})
    );
    let (_, v) = es.post(
        "/dv/_search",
        r#"{"_source":false,"docvalue_fields":["d","e"]}"#,
    );
    assert_eq!(
        v["hits"]["hits"][0]["fields"],
        json!({"d":["1795855523467"],"e":["2024-01-02T03:04:05.006Z"]})
    );
    let text = "Fielddata is disabled on [t] in [dv]. Text fields are not optimised for operations that require per-document field data like aggregations and sorting, so these operations are disabled by default. Please use a keyword field instead. Alternatively, set fielddata=true on [t] in order to load field data by uninverting the inverted index. Note that this can use significant memory.";
    let (s, v) = es.post("/dv/_search", r#"{"docvalue_fields":["t"]}"#);
    assert_eq!(
        (s, &v["error"]["root_cause"][0]["reason"]),
        (400, &json!(text))
    );
    let (s, v) = es.post("/dv/_search", r#"{"docvalue_fields":["x"]}"#);
    assert_eq!(
        (s, &v["error"]["root_cause"][0]["reason"]),
        (
            400,
            &json!(
                "Can't load fielddata on [x] because fielddata is unsupported on fields of type [keyword]. Use doc values instead."
            )
        )
    );
}
