//! Elasticsearch-shaped errors: `{"error":{"root_cause":[..],"type","reason",..},"status":N}`.

use serde_json::{Map, Value, json};

/// An error as Elasticsearch reports it. `extra` fields (index, index_uuid, shard, ...)
/// appear both in the root cause and at the top level, as in real responses.
#[derive(Debug, Clone)]
pub(crate) struct EsError {
    pub status: u16,
    pub kind: String,
    pub reason: String,
    pub extra: Map<String, Value>,
    /// Overrides the root cause list (defaults to a copy of this error without `caused_by`).
    pub root_cause: Option<Vec<Value>>,
    pub caused_by: Option<Value>,
    /// A body sent as-is instead of the structured one (405, 406 and friends).
    pub raw: Option<Value>,
}

pub(crate) type EsResult<T> = Result<T, EsError>;

impl EsError {
    pub(crate) fn new(status: u16, kind: &str, reason: impl Into<String>) -> EsError {
        EsError {
            status,
            kind: kind.to_string(),
            reason: reason.into(),
            extra: Map::new(),
            root_cause: None,
            caused_by: None,
            raw: None,
        }
    }

    pub(crate) fn raw(status: u16, body: Value) -> EsError {
        let mut e = EsError::new(status, "raw", "");
        e.raw = Some(body);
        e
    }

    pub(crate) fn with(mut self, key: &str, value: impl Into<Value>) -> EsError {
        self.extra.insert(key.to_string(), value.into());
        self
    }

    pub(crate) fn caused_by(mut self, cause: Value) -> EsError {
        self.caused_by = Some(cause);
        self
    }

    pub(crate) fn bad_request(reason: impl Into<String>) -> EsError {
        EsError::new(400, "illegal_argument_exception", reason)
    }

    pub(crate) fn parsing(reason: impl Into<String>) -> EsError {
        EsError::new(400, "parsing_exception", reason)
    }

    /// `x_content_parse_exception` for a body that is not valid JSON.
    pub(crate) fn json_parse(err: &serde_json::Error) -> EsError {
        let reason = format!("[{}:{}] {}", err.line(), err.column(), err);
        EsError::new(400, "x_content_parse_exception", reason.clone())
            .caused_by(json!({"type": "json_parse_exception", "reason": reason}))
    }

    /// `Validation Failed: 1: a;2: b;`
    pub(crate) fn validation(msgs: &[String]) -> EsError {
        let mut reason = String::from("Validation Failed: ");
        for (i, m) in msgs.iter().enumerate() {
            reason.push_str(&format!("{}: {};", i + 1, m));
        }
        EsError::new(400, "action_request_validation_exception", reason)
    }

    pub(crate) fn index_not_found(index: &str) -> EsError {
        EsError::new(
            404,
            "index_not_found_exception",
            format!("no such index [{index}]"),
        )
        .with("resource.type", "index_or_alias")
        .with("resource.id", index)
        .with("index_uuid", "_na_")
        .with("index", index)
    }

    pub(crate) fn invalid_index_name(index: &str, why: &str) -> EsError {
        EsError::new(
            400,
            "invalid_index_name_exception",
            format!("Invalid index name [{index}], {why}"),
        )
        .with("index_uuid", "_na_")
        .with("index", index)
    }

    /// A feature of Elasticsearch this test double does not implement.
    pub(crate) fn unsupported(what: &str) -> EsError {
        EsError::new(
            400,
            "illegal_argument_exception",
            format!("es-test-server (a test double, not Elasticsearch) does not implement {what}"),
        )
    }

    /// A failure inside the shard-level search phase, wrapped like Elasticsearch does
    /// (`search_phase_execution_exception`, "all shards failed"). As in Elasticsearch 9.5.3,
    /// the root cause leaves out the failure's own cause, and a `caused_by` at the top
    /// appears only for failures that are plain Java exceptions (here
    /// `illegal_argument_exception`), not for Elasticsearch's own (`query_shard_exception`,
    /// `parse_exception`, ...).
    pub(crate) fn search_phase(inner: EsError, index: Option<&str>) -> EsError {
        let cause = inner.flat();
        let mut e = EsError::new(
            inner.status,
            "search_phase_execution_exception",
            "all shards failed",
        );
        let mut root = cause.clone();
        if let Value::Object(m) = &mut root {
            m.remove("caused_by");
        }
        e.root_cause = Some(vec![root]);
        e.extra.insert("phase".into(), json!("query"));
        e.extra.insert("grouped".into(), json!(true));
        e.extra.insert(
            "failed_shards".into(),
            json!([{"shard": 0, "index": index, "node": crate::NODE_ID, "reason": cause.clone()}]),
        );
        if inner.kind == "illegal_argument_exception" {
            e.caused_by =
                Some(json!({"type": inner.kind, "reason": inner.reason, "caused_by": cause}));
        }
        e
    }

    /// The error object without `root_cause` (as in bulk items and `caused_by`).
    pub(crate) fn flat(&self) -> Value {
        let mut m = Map::new();
        m.insert("type".into(), json!(self.kind));
        m.insert("reason".into(), json!(self.reason));
        for (k, v) in &self.extra {
            m.insert(k.clone(), v.clone());
        }
        if let Some(c) = &self.caused_by {
            m.insert("caused_by".into(), c.clone());
        }
        Value::Object(m)
    }

    pub(crate) fn error_object(&self) -> Value {
        let root = match &self.root_cause {
            Some(r) => r.clone(),
            None => {
                let mut r = Map::new();
                r.insert("type".into(), json!(self.kind));
                r.insert("reason".into(), json!(self.reason));
                for (k, v) in &self.extra {
                    if k != "phase" && k != "grouped" && k != "failed_shards" {
                        r.insert(k.clone(), v.clone());
                    }
                }
                vec![Value::Object(r)]
            }
        };
        let mut m = Map::new();
        m.insert("root_cause".into(), Value::Array(root));
        if let Value::Object(flat) = self.flat() {
            m.extend(flat);
        }
        Value::Object(m)
    }

    pub(crate) fn to_body(&self) -> Value {
        if let Some(raw) = &self.raw {
            return raw.clone();
        }
        json!({"error": self.error_object(), "status": self.status})
    }
}

/// Errors that failure injection produces, with bodies like the real ones.
pub(crate) fn injected(status: u16) -> EsError {
    match status {
        429 => EsError::new(
            429,
            "es_rejected_execution_exception",
            "rejected execution of coordinating operation [coordinating_and_primary_bytes=0, \
             replica_bytes=0, all_bytes=0, coordinating_operation_bytes=1, \
             max_coordinating_and_primary_bytes=107374182] (injected by es-test-server)",
        ),
        503 => EsError::new(
            503,
            "cluster_block_exception",
            "blocked by: [SERVICE_UNAVAILABLE/2/no master]; (injected by es-test-server)",
        ),
        500 => EsError::new(500, "exception", "injected failure (es-test-server)"),
        404 => EsError::new(
            404,
            "resource_not_found_exception",
            "injected failure (es-test-server)",
        ),
        s => EsError::new(
            s,
            "es_test_server_injected_failure",
            format!("injected HTTP {s} (es-test-server)"),
        ),
    }
}
