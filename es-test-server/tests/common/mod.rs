//! A plain HTTP client (ureq) against a server started in-process.
#![allow(dead_code)]

use es_test_server::EsTestServer;
use serde_json::Value;

pub struct Es {
    pub server: EsTestServer,
    agent: ureq::Agent,
}

pub fn start() -> Es {
    let server = EsTestServer::start("127.0.0.1:0").expect("start server");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(60)))
        .build()
        .into();
    Es { server, agent }
}

impl Es {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.server.url(), path)
    }

    /// Sends a request; returns the status and the parsed body (Null when empty).
    pub fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        content_type: &str,
    ) -> Result<(u16, String), ureq::Error> {
        let b = ureq::http::Request::builder()
            .method(method)
            .uri(self.url(path));
        let mut resp = match body {
            Some(s) => self.agent.run(
                b.header("content-type", content_type)
                    .body(s.to_string())
                    .unwrap(),
            )?,
            None => self.agent.run(b.body(()).unwrap())?,
        };
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string()?;
        Ok((status, text))
    }

    pub fn req(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (s, t) = self
            .raw(method, path, body, "application/json")
            .expect("request");
        let v = if t.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&t).unwrap_or_else(|e| panic!("bad json {e}: {t}"))
        };
        (s, v)
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        self.req("GET", path, None)
    }
    pub fn put(&self, path: &str, body: &str) -> (u16, Value) {
        self.req("PUT", path, Some(body))
    }
    pub fn post(&self, path: &str, body: &str) -> (u16, Value) {
        self.req("POST", path, Some(body))
    }
    pub fn delete(&self, path: &str) -> (u16, Value) {
        self.req("DELETE", path, None)
    }

    pub fn bulk(&self, path: &str, body: &str) -> (u16, Value) {
        let (s, t) = self
            .raw("POST", path, Some(body), "application/x-ndjson")
            .expect("request");
        (
            s,
            serde_json::from_str(&t).unwrap_or_else(|e| panic!("bad json {e}: {t}")),
        )
    }

    /// Asserts an Elasticsearch error: status, top-level type, and that the reason contains `reason`.
    pub fn expect_err(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        status: u16,
        ty: &str,
        reason: &str,
    ) -> Value {
        let (s, v) = self.req(method, path, body);
        assert_eq!(s, status, "{method} {path}: {v}");
        assert_eq!(v["status"], status as u64, "{v}");
        assert_eq!(v["error"]["type"], ty, "{v}");
        let r = v["error"]["reason"].as_str().unwrap_or_default();
        assert!(r.contains(reason), "reason {r:?} lacks {reason:?}: {v}");
        assert!(v["error"]["root_cause"].is_array(), "{v}");
        v
    }

    pub fn refresh(&self, index: &str) {
        let (s, v) = self.post(&format!("/{index}/_refresh"), "");
        assert_eq!(s, 200, "{v}");
    }

    pub fn ids(&self, index_or_empty: &str, body: &str) -> Vec<String> {
        let (s, v) = self.post(&format!("{index_or_empty}/_search"), body);
        assert_eq!(s, 200, "{v}");
        v["hits"]["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["_id"].as_str().unwrap().to_string())
            .collect()
    }
}

/// The esfs-like index used by several tests.
pub const FS_INDEX: &str = r#"{
  "settings": {
    "index": {"refresh_interval": "-1"},
    "analysis": {
      "analyzer": {"path_tree": {"type": "custom", "tokenizer": "path_tok"}},
      "tokenizer": {"path_tok": {"type": "path_hierarchy", "delimiter": "/"}}
    }
  },
  "mappings": {
    "dynamic": "strict",
    "properties": {
      "parent": {"type": "long"},
      "name": {"type": "keyword", "fields": {"text": {"type": "text"}}},
      "path": {"type": "keyword", "fields": {"tree": {"type": "text", "analyzer": "path_tree", "search_analyzer": "keyword"}}},
      "dir": {"type": "keyword"},
      "kind": {"type": "keyword"},
      "cookie": {"type": "long"},
      "size": {"type": "long"},
      "mtime": {"type": "date", "format": "epoch_millis"},
      "orphan": {"type": "boolean"},
      "blob": {"type": "binary"},
      "meta": {"type": "object", "enabled": false}
    }
  }
}"#;
