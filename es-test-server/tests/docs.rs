//! Document APIs: realtime get vs near-real-time search, optimistic concurrency, ids, errors.

mod common;

use std::time::{Duration, Instant};

use common::{FS_INDEX, start};
use serde_json::{Value, json};

#[test]
fn realtime_get_but_near_real_time_search() {
    let es = start();
    assert_eq!(es.put("/fs", FS_INDEX).0, 200);
    let (s, v) = es.put("/fs/_doc/a", r#"{"name":"a","size":1}"#);
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["result"], "created");
    assert_eq!(v["_seq_no"], 0);
    assert_eq!(v["_version"], 1);
    assert_eq!(v["_primary_term"], 1);
    assert_eq!(
        v["_shards"],
        json!({"total": 2, "successful": 1, "failed": 0})
    );
    // Realtime get sees it at once.
    let (s, v) = es.get("/fs/_doc/a");
    assert_eq!(s, 200);
    assert_eq!(
        v,
        json!({"_index":"fs","_id":"a","_version":1,"_seq_no":0,"_primary_term":1,"found":true,"_source":{"name":"a","size":1}})
    );
    // Search and count do not (refresh_interval is -1 in this index).
    assert!(es.ids("/fs", r#"{"query":{"match_all":{}}}"#).is_empty());
    assert_eq!(es.post("/fs/_count", "{}").1["count"], 0);
    // realtime=false reads the searchable snapshot too.
    assert_eq!(es.get("/fs/_doc/a?realtime=false").0, 404);
    es.refresh("fs");
    assert_eq!(es.ids("/fs", "{}"), vec!["a"]);
    assert_eq!(
        es.post("/fs/_count", r#"{"query":{"term":{"name":"a"}}}"#)
            .1["count"],
        1
    );
    // A delete is realtime for get, NRT for search.
    assert_eq!(es.delete("/fs/_doc/a").0, 200);
    assert_eq!(es.get("/fs/_doc/a").0, 404);
    assert_eq!(es.ids("/fs", "{}"), vec!["a"]);
    es.refresh("fs");
    assert!(es.ids("/fs", "{}").is_empty());
}

#[test]
fn periodic_refresh_and_refresh_parameter() {
    let es = start();
    assert_eq!(
        es.put("/p", r#"{"settings":{"refresh_interval":"300ms"}}"#)
            .0,
        200
    );
    es.put("/p/_doc/1", r#"{"x":1}"#);
    assert_eq!(es.post("/p/_count", "{}").1["count"], 0);
    let t = Instant::now();
    loop {
        if es.post("/p/_count", "{}").1["count"] == 1 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "periodic refresh never happened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Default interval (1s) on an auto-created index.
    es.put("/auto/_doc/1", r#"{"x":1}"#);
    assert_eq!(es.post("/auto/_count", "{}").1["count"], 0);
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(es.post("/auto/_count", "{}").1["count"], 1);
    // refresh=true: visible immediately, with forced_refresh.
    let (_, v) = es.put("/auto/_doc/2?refresh=true", r#"{"x":2}"#);
    assert_eq!(v["forced_refresh"], true);
    assert_eq!(es.post("/auto/_count", "{}").1["count"], 2);
    // refresh=wait_for: blocks until the next periodic refresh, then visible.
    let t = Instant::now();
    let (s, v) = es.put("/p/_doc/3?refresh=wait_for", r#"{"x":3}"#);
    assert_eq!(s, 201);
    assert!(v.get("forced_refresh").is_none(), "{v}");
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(es.post("/p/_count", "{}").1["count"], 2);
    es.expect_err(
        "PUT",
        "/p/_doc/4?refresh=maybe",
        Some("{}"),
        400,
        "illegal_argument_exception",
        "Unknown value for refresh: [maybe].",
    );
    // Updating refresh_interval to -1 stops periodic refreshes.
    assert_eq!(
        es.put("/p/_settings", r#"{"index":{"refresh_interval":"-1"}}"#)
            .0,
        200
    );
    assert_eq!(
        es.get("/p/_settings").1["p"]["settings"]["index"]["refresh_interval"],
        "-1"
    );
    es.put("/p/_doc/5", r#"{"x":5}"#);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(es.post("/p/_count", "{}").1["count"], 2);
}

#[test]
fn create_conflict_has_the_real_body() {
    let es = start();
    es.put("/fs", FS_INDEX);
    assert_eq!(es.put("/fs/_create/x", r#"{"name":"x"}"#).0, 201);
    let (s, v) = es.put("/fs/_create/x", r#"{"name":"y"}"#);
    assert_eq!(s, 409);
    let uuid = es.get("/fs/_settings").1["fs"]["settings"]["index"]["uuid"].clone();
    let reason = "[x]: version conflict, document already exists (current version [1])";
    let cause = json!({"type":"version_conflict_engine_exception","reason":reason,"index_uuid":uuid,"shard":"0","index":"fs"});
    let mut top = cause.clone();
    top["root_cause"] = json!([cause]);
    assert_eq!(v, json!({"error": top, "status": 409}));
    // op_type=create on _doc is the same operation; POST _create too.
    es.expect_err(
        "PUT",
        "/fs/_doc/x?op_type=create",
        Some("{}"),
        409,
        "version_conflict_engine_exception",
        "document already exists",
    );
    es.expect_err(
        "POST",
        "/fs/_create/x",
        Some("{}"),
        409,
        "version_conflict_engine_exception",
        "document already exists",
    );
    // The source is untouched.
    assert_eq!(es.get("/fs/_doc/x").1["_source"]["name"], "x");
    es.expect_err(
        "PUT",
        "/fs/_doc/z?op_type=bogus",
        Some("{}"),
        400,
        "illegal_argument_exception",
        "opType must be 'create' or 'index', found: [bogus]",
    );
    es.expect_err(
        "PUT",
        "/fs/_create/z?if_seq_no=1&if_primary_term=1",
        Some("{}"),
        400,
        "action_request_validation_exception",
        "create operations do not support compare and set. use index instead",
    );
}

#[test]
fn versions_and_if_seq_no() {
    let es = start();
    es.put("/fs", FS_INDEX);
    let (_, v) = es.put("/fs/_doc/d", r#"{"size":1}"#);
    assert_eq!(
        (v["_seq_no"].as_i64(), v["_version"].as_i64()),
        (Some(0), Some(1))
    );
    let (s, v) = es.put("/fs/_doc/d?if_seq_no=0&if_primary_term=1", r#"{"size":2}"#);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["result"], "updated");
    assert_eq!(
        (v["_seq_no"].as_i64(), v["_version"].as_i64()),
        (Some(1), Some(2))
    );
    // Stale seq_no.
    let v = es.expect_err("PUT", "/fs/_doc/d?if_seq_no=0&if_primary_term=1", Some(r#"{"size":3}"#), 409, "version_conflict_engine_exception",
        "[d]: version conflict, required seqNo [0], primary term [1]. current document has seqNo [1] and primary term [1]");
    assert_eq!(v["error"]["shard"], "0");
    assert_eq!(v["error"]["index"], "fs");
    // Wrong primary term.
    es.expect_err(
        "PUT",
        "/fs/_doc/d?if_seq_no=1&if_primary_term=2",
        Some("{}"),
        409,
        "version_conflict_engine_exception",
        "required seqNo [1], primary term [2]. current document has seqNo [1] and primary term [1]",
    );
    // Missing document with if_seq_no.
    es.expect_err(
        "PUT",
        "/fs/_doc/nope?if_seq_no=3&if_primary_term=1",
        Some("{}"),
        409,
        "version_conflict_engine_exception",
        "[nope]: version conflict, required seqNo [3], primary term [1]. but no document was found",
    );
    // Half of the pair, legacy version.
    es.expect_err(
        "PUT",
        "/fs/_doc/d?if_seq_no=1",
        Some("{}"),
        400,
        "action_request_validation_exception",
        "Validation Failed: 1: ifSeqNo is set, but primary term is [0];",
    );
    es.expect_err(
        "PUT",
        "/fs/_doc/d?if_primary_term=1",
        Some("{}"),
        400,
        "action_request_validation_exception",
        "ifSeqNo is unassigned, but primary term is [1]",
    );
    es.expect_err("PUT", "/fs/_doc/d?version=2", Some("{}"), 400, "action_request_validation_exception",
        "internal versioning can not be used for optimistic concurrency control. Please use `if_seq_no` and `if_primary_term` instead");
    // Conditional delete.
    es.expect_err(
        "DELETE",
        "/fs/_doc/d?if_seq_no=0&if_primary_term=1",
        None,
        409,
        "version_conflict_engine_exception",
        "current document has seqNo [1]",
    );
    let (s, v) = es.delete("/fs/_doc/d?if_seq_no=1&if_primary_term=1");
    assert_eq!(s, 200);
    assert_eq!(v["result"], "deleted");
    assert_eq!(
        (v["_seq_no"].as_i64(), v["_version"].as_i64()),
        (Some(2), Some(3))
    );
    // Recreating continues the version (delete tombstone), seq_no keeps increasing.
    let (_, v) = es.put("/fs/_doc/d", "{}");
    assert_eq!(
        (
            v["_seq_no"].as_i64(),
            v["_version"].as_i64(),
            v["result"].as_str()
        ),
        (Some(3), Some(4), Some("created"))
    );
}

#[test]
fn delete_missing_is_a_404_with_a_result() {
    let es = start();
    es.put("/fs", FS_INDEX);
    let (s, v) = es.delete("/fs/_doc/ghost");
    assert_eq!(s, 404);
    assert_eq!(v["result"], "not_found");
    assert_eq!(v["_index"], "fs");
    assert_eq!(v["_id"], "ghost");
    assert_eq!(v["_version"], 1);
    assert_eq!(v["_seq_no"], 0);
    assert_eq!(v["_primary_term"], 1);
    assert!(v.get("error").is_none());
    // The same for get.
    let (s, v) = es.get("/fs/_doc/ghost");
    assert_eq!(
        (s, v),
        (404, json!({"_index":"fs","_id":"ghost","found":false}))
    );
    assert_eq!(es.req("HEAD", "/fs/_doc/ghost", None).0, 404);
    // Missing index: an error, not a result.
    es.expect_err(
        "DELETE",
        "/nope/_doc/1",
        None,
        404,
        "index_not_found_exception",
        "no such index [nope]",
    );
    let v = es.expect_err(
        "GET",
        "/nope/_doc/1",
        None,
        404,
        "index_not_found_exception",
        "no such index [nope]",
    );
    assert_eq!(v["error"]["index"], "nope");
    assert_eq!(v["error"]["resource.id"], "nope");
    es.expect_err(
        "POST",
        "/nope/_search",
        Some("{}"),
        404,
        "index_not_found_exception",
        "no such index [nope]",
    );
    es.expect_err(
        "POST",
        "/nope/_count",
        Some("{}"),
        404,
        "index_not_found_exception",
        "no such index [nope]",
    );
    es.expect_err(
        "POST",
        "/nope/_update/1",
        Some(r#"{"doc":{}}"#),
        404,
        "document_missing_exception",
        "[1]: document missing",
    );
}

#[test]
fn ids_are_utf8_percent_decoded_and_limited() {
    let es = start();
    es.put("/fs", FS_INDEX);
    // The client encodes '/' and everything but alphanumerics and _-.,*
    let (s, v) = es.put("/fs/_doc/42%2Fcaf%C3%A9%20%2B%3F", r#"{"name":"x"}"#);
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["_id"], "42/café +?");
    assert_eq!(
        es.get("/fs/_doc/42%2Fcaf%C3%A9%20%2B%3F").1["_id"],
        "42/café +?"
    );
    // 512 bytes is fine, 513 is not (bytes, not characters).
    let ok = "é".repeat(256);
    assert_eq!(es.put(&format!("/fs/_doc/{}", enc(&ok)), "{}").0, 201);
    let long = format!("{ok}x");
    es.expect_err("PUT", &format!("/fs/_doc/{}", enc(&long)), Some("{}"), 400, "action_request_validation_exception",
        &format!("Validation Failed: 1: id [{long}] is too long, must be no longer than 512 bytes but was: 513;"));
    es.expect_err(
        "POST",
        &format!("/fs/_create/{}", enc(&long)),
        Some("{}"),
        400,
        "action_request_validation_exception",
        "is too long",
    );
    // Empty id in bulk: that item fails (more in tests/bulk.rs).
    let (s, v) = es.bulk(
        "/_bulk",
        "{\"index\":{\"_index\":\"fs\",\"_id\":\"\"}}\n{}\n",
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["items"][0]["index"]["error"]["reason"],
        "if _id is specified it must not be empty"
    );
    // Auto-generated ids.
    let (s, v) = es.post("/fs/_doc", r#"{"name":"auto"}"#);
    assert_eq!(s, 201);
    assert_eq!(v["_id"].as_str().unwrap().len(), 20);
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"_-.,*".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn bad_bodies_and_mapping_errors() {
    let es = start();
    es.put("/fs", FS_INDEX);
    es.expect_err(
        "PUT",
        "/fs/_doc/1",
        Some(r#"{"name": "x""#),
        400,
        "document_parsing_exception",
        "failed to parse",
    );
    es.expect_err(
        "POST",
        "/fs/_search",
        Some("{nope"),
        400,
        "x_content_parse_exception",
        "",
    );
    es.expect_err(
        "PUT",
        "/fs/_doc/1",
        Some(r#"["not","an","object"]"#),
        400,
        "document_parsing_exception",
        "",
    );
    // Strict mapping.
    es.expect_err(
        "PUT",
        "/fs/_doc/1",
        Some(r#"{"unknown":1}"#),
        400,
        "strict_dynamic_mapping_exception",
        "mapping set to strict, dynamic introduction of [unknown] within [_doc] is not allowed",
    );
    // Type errors; numeric strings are coerced.
    es.expect_err("PUT", "/fs/_doc/1", Some(r#"{"size":"big"}"#), 400, "document_parsing_exception",
        "failed to parse field [size] of type [long] in document with id '1'. Preview of field's value: 'big'");
    assert_eq!(es.put("/fs/_doc/1", r#"{"size":"12"}"#).0, 201);
    es.expect_err(
        "PUT",
        "/fs/_doc/1",
        Some(r#"{"mtime":"yesterday"}"#),
        400,
        "document_parsing_exception",
        "failed to parse field [mtime] of type [date]",
    );
    es.expect_err(
        "PUT",
        "/fs/_doc/1",
        Some(r#"{"orphan":"maybe"}"#),
        400,
        "document_parsing_exception",
        "failed to parse field [orphan] of type [boolean]",
    );
    // Immense keyword terms are rejected; ignore_above ones are kept in _source only.
    let big = "x".repeat(32767);
    es.expect_err(
        "PUT",
        "/fs/_doc/2",
        Some(&format!(r#"{{"dir":"{big}"}}"#)),
        400,
        "illegal_argument_exception",
        "Document contains at least one immense term in field=\"dir\"",
    );
    es.put(
        "/dyn",
        r#"{"mappings":{"properties":{"k":{"type":"keyword","ignore_above":5}}}}"#,
    );
    assert_eq!(
        es.put("/dyn/_doc/1?refresh=true", r#"{"k":"abcdefgh"}"#).0,
        201
    );
    assert_eq!(es.get("/dyn/_doc/1").1["_source"]["k"], "abcdefgh");
    assert!(
        es.ids("/dyn", r#"{"query":{"term":{"k":"abcdefgh"}}}"#)
            .is_empty()
    );
    assert!(
        es.ids("/dyn", r#"{"query":{"exists":{"field":"k"}}}"#)
            .is_empty()
    );
    // Binary: stored, not searchable; disabled objects: stored, not indexed.
    assert_eq!(
        es.put(
            "/fs/_doc/3?refresh=true",
            r#"{"blob":"aGVsbG8=","meta":{"anything":[1,{"x":"y"}]}}"#
        )
        .0,
        201
    );
    assert_eq!(
        es.get("/fs/_doc/3").1["_source"]["meta"]["anything"][1]["x"],
        "y"
    );
    es.expect_err(
        "POST",
        "/fs/_search",
        Some(r#"{"query":{"term":{"blob":"aGVsbG8="}}}"#),
        400,
        "search_phase_execution_exception",
        "all shards failed",
    );
    assert!(
        es.ids("/fs", r#"{"query":{"term":{"meta.anything":1}}}"#)
            .is_empty()
    );
    es.expect_err(
        "PUT",
        "/fs/_doc/4",
        Some(r#"{"blob":"!!!"}"#),
        400,
        "document_parsing_exception",
        "failed to parse field [blob] of type [binary]",
    );
    // Content types.
    let (s, t) = es
        .raw("PUT", "/fs/_doc/5", Some("{}"), "text/plain")
        .unwrap();
    assert_eq!(s, 406, "{t}");
    assert_eq!(
        serde_json::from_str::<Value>(&t).unwrap(),
        json!({"error":"Content-Type header [text/plain] is not supported","status":406})
    );
}

#[test]
fn dynamic_mapping_and_auto_create() {
    let es = start();
    let (s, v) = es.put("/logs/_doc/1", r#"{"msg":"Hello World","n":5,"f":1.5,"ok":true,"when":"2024-01-02T03:04:05Z","obj":{"a":"b"},"dotted.key":1}"#);
    assert_eq!(s, 201, "{v}");
    let m = &es.get("/logs/_mapping").1["logs"]["mappings"]["properties"];
    assert_eq!(
        m["msg"],
        json!({"type":"text","fields":{"keyword":{"type":"keyword","ignore_above":256}}})
    );
    assert_eq!(m["n"], json!({"type":"long"}));
    assert_eq!(m["f"], json!({"type":"float"}));
    assert_eq!(m["ok"], json!({"type":"boolean"}));
    assert_eq!(m["when"], json!({"type":"date"}));
    assert_eq!(
        m["obj"],
        json!({"properties":{"a":{"type":"text","fields":{"keyword":{"type":"keyword","ignore_above":256}}}}})
    );
    assert_eq!(m["dotted"]["properties"]["key"], json!({"type":"long"}));
    es.refresh("logs");
    assert_eq!(
        es.ids("/logs", r#"{"query":{"match":{"msg":"world"}}}"#),
        vec!["1"]
    );
    assert_eq!(
        es.ids(
            "/logs",
            r#"{"query":{"term":{"msg.keyword":"Hello World"}}}"#
        ),
        vec!["1"]
    );
    assert_eq!(
        es.ids(
            "/logs",
            r#"{"query":{"range":{"when":{"gte":"2024-01-01","lt":"2024-01-03"}}}}"#
        ),
        vec!["1"]
    );
    assert_eq!(
        es.ids("/logs", r#"{"query":{"term":{"dotted.key":1}}}"#),
        vec!["1"]
    );
    // dynamic:false keeps unknown fields in _source without mapping them.
    es.put(
        "/loose",
        r#"{"mappings":{"dynamic":false,"properties":{"a":{"type":"keyword"}}}}"#,
    );
    es.put("/loose/_doc/1?refresh=true", r#"{"a":"x","b":"y"}"#);
    assert_eq!(es.get("/loose/_doc/1").1["_source"]["b"], "y");
    assert!(
        es.get("/loose/_mapping").1["loose"]["mappings"]["properties"]
            .get("b")
            .is_none()
    );
    assert!(
        es.ids("/loose", r#"{"query":{"term":{"b":"y"}}}"#)
            .is_empty()
    );
    // Invalid auto-created index names are refused.
    es.expect_err(
        "PUT",
        "/BAD/_doc/1",
        Some("{}"),
        400,
        "invalid_index_name_exception",
        "must be lowercase",
    );
}

#[test]
fn updates_merge_and_detect_noops() {
    let es = start();
    es.put("/u", r#"{"mappings":{"properties":{"a":{"type":"long"}}}}"#);
    es.put("/u/_doc/1", r#"{"a":1,"o":{"x":1,"y":2}}"#);
    let (s, v) = es.post("/u/_update/1", r#"{"doc":{"o":{"y":3},"b":"new"}}"#);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["result"], "updated");
    assert_eq!(v["_version"], 2);
    assert_eq!(
        es.get("/u/_doc/1").1["_source"],
        json!({"a":1,"b":"new","o":{"x":1,"y":3}})
    );
    // Same content: noop, nothing written.
    let (s, v) = es.post("/u/_update/1", r#"{"doc":{"a":1}}"#);
    assert_eq!(s, 200);
    assert_eq!(v["result"], "noop");
    assert_eq!(v["_version"], 2);
    assert_eq!(v["_seq_no"], 1);
    assert_eq!(v["_shards"], json!({"total":0,"successful":0,"failed":0}));
    // Conditional update.
    es.expect_err(
        "POST",
        "/u/_update/1?if_seq_no=0&if_primary_term=1",
        Some(r#"{"doc":{"a":5}}"#),
        409,
        "version_conflict_engine_exception",
        "required seqNo [0], primary term [1]. current document has seqNo [1] and primary term [1]",
    );
    assert_eq!(
        es.post(
            "/u/_update/1?if_seq_no=1&if_primary_term=1",
            r#"{"doc":{"a":5}}"#
        )
        .0,
        200
    );
    // Missing document, upserts.
    es.expect_err(
        "POST",
        "/u/_update/2",
        Some(r#"{"doc":{"a":1}}"#),
        404,
        "document_missing_exception",
        "[2]: document missing",
    );
    let (s, v) = es.post("/u/_update/2", r#"{"doc":{"a":7},"doc_as_upsert":true}"#);
    assert_eq!((s, v["result"].as_str()), (201, Some("created")));
    let (s, _) = es.post("/u/_update/3", r#"{"doc":{"a":7},"upsert":{"a":0}}"#);
    assert_eq!(s, 201);
    assert_eq!(es.get("/u/_doc/3").1["_source"], json!({"a":0}));
    // Scripts are not implemented, and say so.
    es.expect_err(
        "POST",
        "/u/_update/1",
        Some(r#"{"script":{"source":"ctx._source.a++"}}"#),
        400,
        "illegal_argument_exception",
        "does not implement scripts",
    );
    es.expect_err(
        "POST",
        "/u/_update/1",
        Some(r#"{}"#),
        400,
        "action_request_validation_exception",
        "script or doc is missing",
    );
    // A type error in the merged document fails the update and leaves the document alone.
    es.expect_err(
        "POST",
        "/u/_update/1",
        Some(r#"{"doc":{"a":"x"}}"#),
        400,
        "document_parsing_exception",
        "failed to parse field [a] of type [long]",
    );
    assert_eq!(es.get("/u/_doc/1").1["_source"]["a"], 5);
}

#[test]
fn mget_and_source_filtering() {
    let es = start();
    es.put("/fs", FS_INDEX);
    es.put("/fs/_doc/a", r#"{"name":"a","size":1,"kind":"file"}"#);
    es.put("/fs/_doc/b", r#"{"name":"b","size":2,"kind":"dir"}"#);
    let (s, v) = es.post("/_mget", r#"{"docs":[{"_index":"fs","_id":"a"},{"_index":"fs","_id":"zz"},{"_index":"nope","_id":"a"},{"_index":"fs","_id":"b","_source":["size"]}]}"#);
    assert_eq!(s, 200);
    let d = v["docs"].as_array().unwrap();
    assert_eq!(d[0]["found"], true);
    assert_eq!(d[0]["_seq_no"], 0);
    assert_eq!(d[1], json!({"_index":"fs","_id":"zz","found":false}));
    assert_eq!(d[2]["error"]["type"], "index_not_found_exception");
    assert_eq!(d[3]["_source"], json!({"size":2}));
    let (_, v) = es.post("/fs/_mget?_source=false", r#"{"ids":["b","a"]}"#);
    assert_eq!(v["docs"][0]["_id"], "b");
    assert!(v["docs"][0].get("_source").is_none());
    es.expect_err(
        "POST",
        "/_mget",
        Some(r#"{"ids":["a"]}"#),
        400,
        "action_request_validation_exception",
        "index is missing for doc 0",
    );
    assert_eq!(
        es.get("/fs/_doc/a?_source_includes=name,kind").1["_source"],
        json!({"name":"a","kind":"file"})
    );
    assert_eq!(
        es.get("/fs/_doc/a?_source_excludes=name").1["_source"],
        json!({"size":1,"kind":"file"})
    );
    assert!(
        es.get("/fs/_doc/a?_source=false")
            .1
            .get("_source")
            .is_none()
    );
    assert_eq!(
        es.get("/fs/_source/a").1,
        json!({"name":"a","size":1,"kind":"file"})
    );
}

const STORED_INDEX: &str = r#"{"mappings": {"properties": {
  "count": {"type": "integer", "store": true},
  "k": {"type": "keyword", "store": true, "ignore_above": 3, "fields": {"raw": {"type": "keyword", "store": true}}},
  "t": {"type": "text", "store": true},
  "d": {"type": "date", "store": true},
  "b": {"type": "boolean", "store": true},
  "f": {"type": "float", "store": true},
  "dn": {"type": "date_nanos", "store": true},
  "o": {"properties": {"x": {"type": "long", "store": true}}},
  "nv": {"type": "keyword", "store": true, "null_value": "NULL"},
  "plain": {"type": "long"}
}}}"#;

const STORED_DOC: &str = r#"{"include": {"field1": "v1", "field2": "v2"}, "count": 1, "k": ["ab", "abcdef"], "t": "Hello World", "d": "2021-01-01", "b": "true", "f": 1.1, "dn": "2021-01-01T00:00:00.123456789Z", "o": [{"x": 1}, {"x": "2"}], "o.x": 3, "nv": null, "plain": 3}"#;

/// `stored_fields` on get, as Elasticsearch 9.5.3 answers rest-api-spec
/// get/70_source_filtering.yml (`stored_fields: count` with `_source: true`) and its
/// neighbours: stored fields come back as `fields`, converted as stored; `_source` only when
/// asked for.
#[test]
fn get_with_stored_fields() {
    let es = start();
    es.put("/sf", STORED_INDEX);
    assert_eq!(es.put("/sf/_doc/1", STORED_DOC).0, 201);
    let head = json!({"_index": "sf", "_id": "1", "_version": 1, "_seq_no": 0, "_primary_term": 1, "found": true});
    let with = |extra: Value| {
        let mut v = head.clone();
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    let source: Value = serde_json::from_str(STORED_DOC).unwrap();
    let count = json!({"count": [1]});
    assert_eq!(
        es.get("/sf/_doc/1?stored_fields=count&_source=true"),
        (200, with(json!({"_source": source, "fields": count})))
    );
    assert_eq!(
        es.get("/sf/_doc/1?stored_fields=count"),
        (200, with(json!({"fields": count})))
    );
    assert_eq!(
        es.get("/sf/_doc/1?stored_fields=count&_source_includes=include.field1"),
        (
            200,
            with(json!({"_source": {"include": {"field1": "v1"}}, "fields": count}))
        )
    );
    assert_eq!(
        es.get("/sf/_doc/1?stored_fields=count&_source=false"),
        (200, with(json!({"fields": count})))
    );
    assert_eq!(
        es.get("/sf/_doc/1?stored_fields=count,k,k.raw,t,d,b,f,dn,o.x,nv,plain,nope,_id"),
        (
            200,
            with(json!({"fields": {
                "count": [1], "k": ["ab"], "k.raw": ["ab", "abcdef"], "t": ["Hello World"],
                "d": ["2021-01-01T00:00:00.000Z"], "b": [true], "f": [1.1],
                "dn": ["2021-01-01T00:00:00.123456789Z"], "o.x": [1, 2, 3], "nv": ["NULL"]
            }}))
        )
    );
    for q in ["_none_", "", "plain"] {
        assert_eq!(
            es.get(&format!("/sf/_doc/1?stored_fields={q}")),
            (200, head.clone()),
            "{q}"
        );
    }
    for q in ["_source", "_none_&_source=true"] {
        assert_eq!(
            es.get(&format!("/sf/_doc/1?stored_fields={q}")),
            (200, with(json!({"_source": source}))),
            "{q}"
        );
    }
    es.expect_err(
        "GET",
        "/sf/_doc/1?stored_fields=o",
        None,
        400,
        "illegal_argument_exception",
        "field [o] isn't a leaf field",
    );
    es.expect_err(
        "GET",
        "/sf/_source/1?stored_fields=count",
        None,
        400,
        "illegal_argument_exception",
        "request [/sf/_source/1] contains unrecognized parameter: [stored_fields]",
    );
    // mget: per document, or for all from the URL; a string is one name.
    let (s, v) = es.post(
        "/sf/_mget",
        r#"{"docs": [{"_id": "1", "stored_fields": ["count", "b"]}, {"_id": "1", "stored_fields": "count", "_source": true}, {"_id": "1", "stored_fields": ["o"]}, {"_id": "1", "stored_fields": "count,b"}]}"#,
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["docs"][0],
        with(json!({"fields": {"count": [1], "b": [true]}}))
    );
    assert_eq!(
        v["docs"][1],
        with(json!({"_source": source, "fields": count}))
    );
    assert_eq!(
        v["docs"][2],
        json!({"_index": "sf", "_id": "1", "error": {"root_cause": [{"type": "illegal_argument_exception", "reason": "field [o] isn't a leaf field"}], "type": "illegal_argument_exception", "reason": "field [o] isn't a leaf field"}})
    );
    assert_eq!(v["docs"][3], head);
    let (s, v) = es.post("/sf/_mget?stored_fields=count", r#"{"ids": ["1", "2"]}"#);
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["docs"],
        json!([with(json!({"fields": count})), {"_index": "sf", "_id": "2", "found": false}])
    );
}
