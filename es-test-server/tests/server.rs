//! The server itself: restart on the same port, failure injection, latency, admin endpoints,
//! request size limit.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::start;
use serde_json::json;

#[test]
fn stop_and_restart_keep_state_and_port() {
    let mut es = start();
    let url = es.server.url();
    es.put("/keep/_doc/1?refresh=true", r#"{"v":1}"#);
    es.put("/keep/_doc/2", r#"{"v":2}"#); // acknowledged, not refreshed
    es.server.stop();
    assert!(
        es.raw("GET", "/", None, "application/json").is_err(),
        "still answering after stop"
    );
    assert!(
        std::net::TcpStream::connect(es.server.addr()).is_err(),
        "still listening after stop"
    );
    es.server.restart().unwrap();
    assert_eq!(es.server.url(), url);
    assert_eq!(es.get("/keep/_doc/1").1["_source"], json!({"v":1}));
    assert_eq!(es.get("/keep/_doc/2").1["_source"], json!({"v":2}));
    // seq_no continues.
    assert_eq!(es.put("/keep/_doc/3", "{}").1["_seq_no"], 2);
    // Restart while running is fine too.
    es.server.restart().unwrap();
    assert_eq!(es.get("/keep/_doc/3").0, 200);
}

#[test]
fn an_open_connection_is_closed_by_stop() {
    let mut es = start();
    let mut s = std::net::TcpStream::connect(es.server.addr()).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    assert!(
        std::str::from_utf8(&buf[..n])
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    es.server.stop();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let r = s.read(&mut buf);
    assert!(matches!(r, Ok(0) | Err(_)), "connection still open: {r:?}");
}

#[test]
fn fail_next_injects_real_looking_errors() {
    let es = start();
    es.server.fail_next(2, 429);
    for _ in 0..2 {
        let v = es.expect_err(
            "GET",
            "/",
            None,
            429,
            "es_rejected_execution_exception",
            "rejected execution",
        );
        assert_eq!(
            v["error"]["root_cause"][0]["type"],
            "es_rejected_execution_exception"
        );
    }
    assert_eq!(es.get("/").0, 200);
    es.server.fail_next(1, 503);
    es.expect_err(
        "PUT",
        "/x/_doc/1",
        Some("{}"),
        503,
        "cluster_block_exception",
        "",
    );
    // The failed write did nothing.
    es.expect_err(
        "GET",
        "/x/_doc/1",
        None,
        404,
        "index_not_found_exception",
        "",
    );
    // Through the admin API (process mode); admin calls are never failed themselves.
    let (s, v) = es.post("/_test/fail?status=500&count=1", "");
    assert_eq!((s, v["count"].as_u64()), (200, Some(1)));
    assert_eq!(es.get("/_test/stats").0, 200);
    assert_eq!(es.get("/").0, 500);
    assert_eq!(es.get("/").0, 200);
    es.post("/_test/fail?status=429&count=5", "");
    es.post("/_test/reset", "");
    assert_eq!(es.get("/").0, 200);
}

#[test]
fn latency_and_outage() {
    let es = start();
    es.server.set_latency(Duration::from_millis(150));
    let t = Instant::now();
    es.get("/");
    assert!(t.elapsed() >= Duration::from_millis(150));
    es.server.set_latency(Duration::ZERO);
    es.post("/_test/latency?ms=100", "");
    let t = Instant::now();
    es.get("/");
    assert!(t.elapsed() >= Duration::from_millis(100));
    es.post("/_test/reset", "");
    // Outage: refused for a while, then back with the same state.
    es.put("/o/_doc/1", "{}");
    es.post("/_test/outage?ms=400", "");
    std::thread::sleep(Duration::from_millis(150));
    assert!(es.raw("GET", "/", None, "application/json").is_err());
    let t = Instant::now();
    loop {
        if let Ok((200, _)) = es.raw("GET", "/o/_doc/1", None, "application/json") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "never came back");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, v) = es.get("/_test/stats");
    assert_eq!(v["indices"]["o"]["docs"], 1);
}

#[test]
fn oversized_bodies_get_413() {
    let es = start();
    let mut s = std::net::TcpStream::connect(es.server.addr()).unwrap();
    s.write_all(b"POST /_bulk HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nContent-Length: 104857601\r\n\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).unwrap();
    let head = std::str::from_utf8(&buf[..n]).unwrap();
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("x-elastic-product: elasticsearch"),
        "{head}"
    );
}

#[test]
fn many_concurrent_clients() {
    let es = std::sync::Arc::new(start());
    es.put("/c", r#"{"mappings":{"properties":{"n":{"type":"long"}}}}"#);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let es = es.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let (s, _) = es.put(&format!("/c/_create/{t}-{i}"), &format!(r#"{{"n":{i}}}"#));
                    assert_eq!(s, 201);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    es.refresh("c");
    assert_eq!(es.post("/c/_count", "{}").1["count"], 400);
    // Each seq_no was handed out exactly once.
    let (_, v) = es.post(
        "/c/_search",
        r#"{"size":400,"seq_no_primary_term":true,"sort":["_doc"]}"#,
    );
    let seqs: Vec<i64> = v["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["_seq_no"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, (0..400).collect::<Vec<_>>());
}

#[test]
fn usable_from_inside_a_callers_tokio_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut s = es_test_server::EsTestServer::start("127.0.0.1:0").unwrap();
        s.stop();
        s.restart().unwrap();
        let addr = s.addr();
        let ok = tokio::task::spawn_blocking(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            out.starts_with("HTTP/1.1 200")
        })
        .await
        .unwrap();
        assert!(ok);
        drop(s);
    });
}
