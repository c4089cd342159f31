//! Aggregations.

mod common;

use common::start;
use serde_json::json;

#[test]
fn terms_with_max_score_order_and_top_hits() {
    let es = start();
    es.put("/docs", r#"{"mappings":{"properties":{"dir":{"type":"keyword"},"title":{"type":"text"},"size":{"type":"long"},"t":{"type":"date"}}}}"#);
    let rows = [
        ("1", "/a", "rust fuse filesystem", 5),
        ("2", "/a", "rust", 7),
        ("3", "/b", "rust rust rust", 1),
        ("4", "/b", "python", 2),
        ("5", "/c", "fuse", 3),
        ("6", "/c", "nothing here", 9),
    ];
    let mut body = String::new();
    for (id, dir, title, size) in rows {
        body.push_str(&format!("{{\"index\":{{\"_id\":\"{id}\"}}}}\n"));
        body.push_str(
            &json!({"dir": dir, "title": title, "size": size, "t": 1_700_000_000_000i64 + size})
                .to_string(),
        );
        body.push('\n');
    }
    es.bulk("/docs/_bulk?refresh=true", &body);
    // Plain terms: count desc, then key asc.
    let (s, v) = es.post(
        "/docs/_search",
        r#"{"size":0,"aggs":{"dirs":{"terms":{"field":"dir","size":2}}}}"#,
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["hits"]["hits"], json!([]));
    assert_eq!(v["hits"]["total"]["value"], 6);
    assert_eq!(
        v["aggregations"]["dirs"],
        json!({"doc_count_error_upper_bound":0,"sum_other_doc_count":2,"buckets":[
        {"key":"/a","doc_count":2},{"key":"/b","doc_count":2}]})
    );
    // The "best directory per query" shape: terms ordered by a max(_score) sub-aggregation with top hits.
    let q = json!({
        "size": 0,
        "query": {"match": {"title": "rust fuse"}},
        "aggs": {"dirs": {
            "terms": {"field": "dir", "size": 10, "order": {"top_score": "desc"}},
            "aggs": {
                "top_score": {"max": {"script": "_score"}},
                "top": {"top_hits": {"size": 1, "_source": {"includes": ["title"]}}}
            }
        }}
    });
    let (s, v) = es.post("/docs/_search", &q.to_string());
    assert_eq!(s, 200, "{v}");
    let b = v["aggregations"]["dirs"]["buckets"].as_array().unwrap();
    assert_eq!(b.len(), 3);
    let scores: Vec<f64> = b
        .iter()
        .map(|x| x["top_score"]["value"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    for bucket in b {
        let top = &bucket["top"]["hits"];
        assert_eq!(top["total"]["value"], bucket["doc_count"]);
        let hit = &top["hits"][0];
        // _score is a float, the max aggregation a double (as in Elasticsearch).
        assert!(
            (hit["_score"].as_f64().unwrap() - bucket["top_score"]["value"].as_f64().unwrap())
                .abs()
                < 1e-6
        );
        assert_eq!(
            hit["_source"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            vec!["title"]
        );
        assert!(hit["_index"] == "docs" && hit["_id"].is_string());
    }
    // Order by key, numeric terms, metrics on fields, date max with value_as_string.
    let (_, v) = es.post(
        "/docs/_search",
        r#"{"size":0,"aggs":{"d":{"terms":{"field":"dir","order":{"_key":"desc"}},"aggs":{"biggest":{"max":{"field":"size"}},"total":{"sum":{"field":"size"}}}},"s":{"terms":{"field":"size","size":1,"order":{"_key":"asc"}}},"latest":{"max":{"field":"t"}},"n":{"value_count":{"field":"size"}},"avg":{"avg":{"field":"size"}},"min":{"min":{"field":"size"}},"card":{"cardinality":{"field":"dir"}}}}"#,
    );
    let a = &v["aggregations"];
    assert_eq!(a["d"]["buckets"][0]["key"], "/c");
    assert_eq!(a["d"]["buckets"][0]["biggest"]["value"], 9.0);
    assert_eq!(a["d"]["buckets"][0]["total"]["value"], 12.0);
    assert_eq!(a["s"]["buckets"], json!([{"key":1,"doc_count":1}]));
    assert_eq!(a["s"]["sum_other_doc_count"], 5);
    assert_eq!(a["latest"]["value"], 1_700_000_000_009_f64);
    assert_eq!(a["latest"]["value_as_string"], "2023-11-14T22:13:20.009Z");
    assert_eq!(a["n"]["value"], 6);
    assert_eq!(a["avg"]["value"], 4.5);
    assert_eq!(a["min"]["value"], 1.0);
    assert_eq!(a["card"]["value"], 3);
    // Top hits sorted by a field.
    let (_, v) = es.post("/docs/_search", r#"{"size":0,"aggs":{"d":{"terms":{"field":"dir"},"aggs":{"small":{"top_hits":{"size":1,"sort":[{"size":"asc"}],"_source":false}}}}}}"#);
    let first = &v["aggregations"]["d"]["buckets"][0]["small"]["hits"]["hits"][0];
    assert_eq!(
        (
            first["_id"].as_str(),
            first["sort"][0].as_i64(),
            first["_score"].clone()
        ),
        (Some("1"), Some(5), serde_json::Value::Null)
    );
    // Aggregations see every match, whatever size/search_after say; post_filter only trims hits.
    let (_, v) = es.post(
        "/docs/_search",
        r#"{"size":1,"post_filter":{"term":{"dir":"/a"}},"aggs":{"d":{"terms":{"field":"dir"}}}}"#,
    );
    assert_eq!(v["hits"]["total"]["value"], 2);
    assert_eq!(
        v["aggregations"]["d"]["buckets"].as_array().unwrap().len(),
        3
    );
    // Errors.
    es.expect_err(
        "POST",
        "/docs/_search",
        Some(r#"{"aggs":{"x":{"terms":{"field":"title"}}}}"#),
        400,
        "search_phase_execution_exception",
        "all shards failed",
    );
    es.expect_err(
        "POST",
        "/docs/_search",
        Some(r#"{"aggs":{"x":{"histogram":{"field":"size","interval":1}}}}"#),
        400,
        "illegal_argument_exception",
        "does not implement the [histogram] aggregation",
    );
    es.expect_err(
        "POST",
        "/docs/_search",
        Some(r#"{"aggs":{"x":{"max":{"script":"doc['size'].value * 2"}}}}"#),
        400,
        "illegal_argument_exception",
        "does not implement scripts",
    );
}
