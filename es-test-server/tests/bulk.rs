//! The bulk API.

mod common;

use common::{FS_INDEX, start};
use serde_json::json;

#[test]
fn mixed_items_fail_individually_in_order() {
    let es = start();
    es.put("/fs", FS_INDEX);
    es.put("/fs/_doc/existing", r#"{"name":"e"}"#);
    let body = concat!(
        "{\"create\":{\"_index\":\"fs\",\"_id\":\"existing\"}}\n{\"name\":\"dup\"}\n",
        "{\"index\":{\"_index\":\"fs\",\"_id\":\"new\"}}\n{\"name\":\"n\",\"size\":1}\n",
        "{\"delete\":{\"_index\":\"fs\",\"_id\":\"ghost\"}}\n",
        "{\"update\":{\"_index\":\"fs\",\"_id\":\"ghost\"}}\n{\"doc\":{\"size\":2}}\n",
        "{\"index\":{\"_index\":\"fs\",\"_id\":\"typed\"}}\n{\"size\":\"not a number\"}\n",
        "{\"index\":{\"_id\":\"strict\"}}\n{\"bogus\":1}\n",
        "{\"update\":{\"_id\":\"new\",\"if_seq_no\":0,\"if_primary_term\":1}}\n{\"doc\":{\"size\":3}}\n",
        "{\"update\":{\"_id\":\"new\",\"if_seq_no\":1,\"if_primary_term\":1}}\n{\"doc\":{\"size\":3}}\n",
        "{\"delete\":{\"_index\":\"nope\",\"_id\":\"1\"}}\n",
        "{\"delete\":{\"_id\":\"existing\"}}\n",
        "{\"index\":{\"_id\":\"broken\"}}\n{\"name\":\n",
    );
    let (s, v) = es.bulk("/fs/_bulk", body);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["errors"], true);
    assert!(v["took"].is_u64());
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 11);
    let uuid = es.get("/fs/_settings").1["fs"]["settings"]["index"]["uuid"].clone();
    assert_eq!(
        items[0],
        json!({"create":{"_index":"fs","_id":"existing","status":409,"error":{
        "type":"version_conflict_engine_exception",
        "reason":"[existing]: version conflict, document already exists (current version [1])",
        "index_uuid":uuid,"shard":"0","index":"fs"}}})
    );
    assert_eq!(
        items[1],
        json!({"index":{"_index":"fs","_id":"new","_version":1,"result":"created",
        "_shards":{"total":2,"successful":1,"failed":0},"_seq_no":1,"_primary_term":1,"status":201}})
    );
    assert_eq!(items[2]["delete"]["status"], 404);
    assert_eq!(items[2]["delete"]["result"], "not_found");
    assert!(items[2]["delete"].get("error").is_none());
    assert_eq!(items[3]["update"]["status"], 404);
    assert_eq!(
        items[3]["update"]["error"]["type"],
        "document_missing_exception"
    );
    assert_eq!(
        items[3]["update"]["error"]["reason"],
        "[ghost]: document missing"
    );
    assert_eq!(items[4]["index"]["status"], 400);
    assert_eq!(
        items[4]["index"]["error"]["type"],
        "document_parsing_exception"
    );
    assert_eq!(items[5]["index"]["status"], 400);
    assert_eq!(
        items[5]["index"]["error"]["type"],
        "strict_dynamic_mapping_exception"
    );
    assert_eq!(items[6]["update"]["status"], 409);
    assert_eq!(
        items[6]["update"]["error"]["reason"],
        "[new]: version conflict, required seqNo [0], primary term [1]. current document has seqNo [1] and primary term [1]"
    );
    assert_eq!(items[7]["update"]["status"], 200);
    assert_eq!(items[7]["update"]["result"], "updated");
    assert_eq!(items[8]["delete"]["status"], 404);
    assert_eq!(
        items[8]["delete"]["error"]["type"],
        "index_not_found_exception"
    );
    assert_eq!(items[9]["delete"]["status"], 200);
    assert_eq!(items[9]["delete"]["result"], "deleted");
    assert_eq!(items[10]["index"]["status"], 400);
    assert_eq!(
        items[10]["index"]["error"]["type"],
        "document_parsing_exception"
    );
    // Effects are realtime-visible.
    assert_eq!(
        es.get("/fs/_doc/new").1["_source"],
        json!({"name":"n","size":3})
    );
    assert_eq!(es.get("/fs/_doc/existing").0, 404);
    assert_eq!(es.get("/fs/_doc/typed").0, 404);
}

#[test]
fn request_level_errors() {
    let es = start();
    es.put("/fs", FS_INDEX);
    let (s, v) = es.bulk(
        "/_bulk",
        "{\"index\":{\"_index\":\"fs\",\"_id\":\"1\"}}\n{\"name\":\"x\"}",
    );
    assert_eq!(s, 400);
    assert_eq!(v["error"]["type"], "illegal_argument_exception");
    assert_eq!(
        v["error"]["reason"],
        "The bulk request must be terminated by a newline [\\n]"
    );
    let (s, v) = es.bulk("/_bulk", "{\"index\":{\"_id\":\"1\"}}\n{}\n");
    assert_eq!(s, 400);
    assert_eq!(
        v["error"]["reason"],
        "Validation Failed: 1: index is missing;"
    );
    let (s, v) = es.bulk("/_bulk", "{\"frob\":{\"_index\":\"fs\"}}\n");
    assert_eq!(s, 400);
    assert!(
        v["error"]["reason"]
            .as_str()
            .unwrap()
            .contains("expected field [create], [delete], [index] or [update] but found [frob]")
    );
    let (s, v) = es.bulk(
        "/_bulk",
        "{\"index\":{\"_index\":\"fs\",\"_id\":\"1\",\"bogus\":1}}\n{}\n",
    );
    assert_eq!(s, 400);
    assert_eq!(
        v["error"]["reason"],
        "Action/metadata line [1] contains an unknown parameter [bogus]"
    );
    let (s, v) = es.bulk(
        "/_bulk",
        "{\"index\":{\"_index\":\"fs\",\"_id\":\"1\",\"if_seq_no\":1}}\n{}\n",
    );
    assert_eq!(s, 400);
    assert_eq!(
        v["error"]["reason"],
        "Validation Failed: 1: ifSeqNo is set, but primary term is [0];"
    );
    let long = "x".repeat(513);
    let (s, v) = es.bulk(
        "/_bulk",
        &format!("{{\"delete\":{{\"_index\":\"fs\",\"_id\":\"{long}\"}}}}\n"),
    );
    assert_eq!(s, 400);
    assert!(
        v["error"]["reason"]
            .as_str()
            .unwrap()
            .contains("is too long, must be no longer than 512 bytes but was: 513")
    );
    let (s, v) = es.bulk(
        "/_bulk",
        "{\"update\":{\"_index\":\"fs\",\"_id\":\"1\"}}\n{\"script\":\"ctx._source.x=1\"}\n",
    );
    assert_eq!(s, 400);
    assert!(
        v["error"]["reason"]
            .as_str()
            .unwrap()
            .contains("does not implement scripts")
    );
    // Nothing of the failed requests was applied.
    assert_eq!(es.get("/fs/_doc/1").0, 404);
}

#[test]
fn refresh_and_auto_create() {
    let es = start();
    es.put("/fs", FS_INDEX);
    let (s, v) = es.bulk("/_bulk?refresh=true", "{\"index\":{\"_index\":\"fs\",\"_id\":\"a\"}}\n{\"name\":\"a\"}\n{\"index\":{\"_index\":\"other\",\"_id\":\"b\"}}\n{\"v\":1}\n");
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["errors"], false);
    assert_eq!(v["items"][0]["index"]["forced_refresh"], true);
    assert_eq!(es.ids("/fs", "{}"), vec!["a"]);
    assert_eq!(es.ids("/other", "{}"), vec!["b"]);
    // wait_for on an index that never refreshes by itself would block: use one that does.
    es.put("/w", r#"{"settings":{"refresh_interval":"200ms"}}"#);
    let (s, _) = es.bulk(
        "/w/_bulk?refresh=wait_for",
        "{\"index\":{\"_id\":\"1\"}}\n{\"v\":1}\n{\"create\":{\"_id\":\"2\"}}\n{\"v\":2}\n",
    );
    assert_eq!(s, 200);
    assert_eq!(es.post("/w/_count", "{}").1["count"], 2);
    // Blank lines and CRLF are tolerated.
    let (s, v) = es.bulk(
        "/w/_bulk",
        "\r\n{\"index\":{\"_id\":\"3\"}}\r\n{\"v\":3}\r\n\n",
    );
    assert_eq!((s, v["errors"].as_bool()), (200, Some(false)), "{v}");
}

#[test]
fn bulk_seq_nos_are_per_index_and_monotonic() {
    let es = start();
    let mut body = String::new();
    for i in 0..100 {
        body.push_str(&format!(
            "{{\"index\":{{\"_index\":\"s{}\",\"_id\":\"{i}\"}}}}\n{{\"i\":{i}}}\n",
            i % 2
        ));
    }
    let (_, v) = es.bulk("/_bulk", &body);
    let mut last = [-1i64, -1];
    for (i, it) in v["items"].as_array().unwrap().iter().enumerate() {
        let seq = it["index"]["_seq_no"].as_i64().unwrap();
        assert_eq!(seq, last[i % 2] + 1);
        last[i % 2] = seq;
    }
}

/// An index or create item with `"_id": ""` fails alone (400 `illegal_argument_exception`);
/// the others are applied.
#[test]
fn empty_id_fails_only_that_item() {
    let es = start();
    es.put("/fs", FS_INDEX);
    let body = concat!(
        "{\"index\":{\"_id\":\"a\"}}\n{\"name\":\"a\"}\n",
        "{\"index\":{\"_id\":\"\"}}\n{\"name\":\"empty\"}\n",
        "{\"create\":{\"_id\":\"\"}}\n{\"name\":\"empty\"}\n",
        "{\"index\":{\"_id\":\"\"}}\n{\"name\":\n",
        "{\"create\":{\"_id\":\"b\"}}\n{\"name\":\"b\"}\n",
    );
    let (s, v) = es.bulk("/fs/_bulk", body);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["errors"], true);
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 5);
    let err = json!({"type":"illegal_argument_exception","reason":"if _id is specified it must not be empty"});
    for (i, action) in [(1, "index"), (2, "create"), (3, "index")] {
        assert_eq!(
            items[i],
            json!({action: {"_index":"fs","_id":"","status":400,"error":err}}),
            "{i}"
        );
    }
    assert_eq!(items[0]["index"]["status"], 201);
    assert_eq!(items[4]["create"]["status"], 201);
    assert_eq!(es.get("/fs/_doc/a").0, 200);
    assert_eq!(es.get("/fs/_doc/b").0, 200);
    // Delete and update need an id: an empty one fails the whole request.
    for body in [
        "{\"index\":{\"_id\":\"c\"}}\n{}\n{\"delete\":{\"_id\":\"\"}}\n",
        "{\"index\":{\"_id\":\"c\"}}\n{}\n{\"update\":{\"_id\":\"\"}}\n{\"doc\":{}}\n",
    ] {
        let (s, v) = es.bulk("/fs/_bulk", body);
        assert_eq!(s, 400, "{v}");
        assert_eq!(v["error"]["type"], "action_request_validation_exception");
        assert_eq!(v["error"]["reason"], "Validation Failed: 1: id is missing;");
    }
    assert_eq!(es.get("/fs/_doc/c").0, 404);
    // The index of a failed item is still auto-created.
    let (s, v) = es.bulk(
        "/_bulk",
        "{\"index\":{\"_index\":\"fresh\",\"_id\":\"\"}}\n{}\n",
    );
    assert_eq!((s, v["errors"].as_bool()), (200, Some(true)), "{v}");
    assert_eq!(es.req("HEAD", "/fresh", None).0, 200);
}

/// Action lines as Elasticsearch 9.5.3 reads them (answers recorded from a real node; the
/// first case is rest-api-spec's bulk/10_basic.yml "empty action").
#[test]
fn malformed_action_lines_answer_like_elasticsearch() {
    let es = start();
    let cases = [
        (
            "{\"index\":{\"_index\":\"t\",\"_id\":\"1\"}}\n{\"f1\":\"v1\",\"f2\":42}\n{}\n",
            "Malformed action/metadata line [3], expected FIELD_NAME but found [END_OBJECT]",
        ),
        (
            "{\"index\":\"x\"}\n",
            "Malformed action/metadata line [1], expected START_OBJECT or END_OBJECT but found [VALUE_STRING]",
        ),
        (
            "{\"index\":5}\n{}\n",
            "Malformed action/metadata line [1], expected START_OBJECT or END_OBJECT but found [VALUE_NUMBER]",
        ),
        (
            "{\"index\":{\"_index\":\"t\"},\"delete\":{}}\n{}\n",
            "Malformed action/metadata line [1], expected END_OBJECT but found [FIELD_NAME]",
        ),
        (
            "{\"index\":{\"_index\":\"t\"}}\n{}\n[]\n",
            "Malformed action/metadata line [3], expected START_OBJECT but found [START_ARRAY]",
        ),
    ];
    for (body, reason) in cases {
        let (s, v) = es.bulk("/_bulk", body);
        assert_eq!(s, 400, "{body}: {v}");
        let err = json!({"type": "illegal_argument_exception", "reason": reason});
        assert_eq!(v["error"]["root_cause"], json!([err]), "{body}");
        assert_eq!(v["error"]["type"], "illegal_argument_exception");
        assert_eq!(v["error"]["reason"], reason);
    }
    // The failed request wrote nothing, not even the valid first item.
    assert_eq!(es.get("/t/_doc/1").0, 404);
}

/// The end of the body and empty sources, as Elasticsearch 9.5.3 answers them: an action
/// line without its source at the very end is dropped; an empty source line fails its item
/// (which has its generated id by then, while an index-level failure has none).
#[test]
fn trailing_action_and_empty_source() {
    let es = start();
    let (s, v) = es.bulk(
        "/_bulk",
        "{\"index\":{\"_index\":\"t\",\"_id\":\"1\"}}\n{\"f\":1}\n{\"update\":{\"_index\":\"t\",\"_id\":\"1\"}}\n",
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["items"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["items"][0]["index"]["status"], 201);
    let (s, v) = es.bulk("/_bulk", "{\"index\":{\"_index\":\"t\",\"_id\":\"2\"}}\n");
    assert_eq!(s, 400, "{v}");
    assert_eq!(
        v["error"]["reason"],
        "Validation Failed: 1: no requests added;"
    );
    let (s, v) = es.bulk(
        "/_bulk",
        "{\"index\":{\"_index\":\"T\"}}\n{\"a\":1}\n{\"create\":{\"_index\":\"t\"}}\n\n",
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["errors"], true);
    let bad_name = &v["items"][0]["index"];
    assert_eq!(bad_name["_id"], json!(null), "{v}");
    assert_eq!(bad_name["error"]["type"], "invalid_index_name_exception");
    let empty = &v["items"][1]["create"];
    assert_eq!(empty["status"], 400);
    assert_eq!(empty["_id"].as_str().map(str::len), Some(20), "{v}");
    assert_eq!(
        empty["error"],
        json!({"type": "document_parsing_exception", "reason": "[0:0] failed to parse, document is empty"})
    );
}
