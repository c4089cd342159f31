//! Talking to the server: one request, the retry loop with its backoff and
//! budget, and answers and errors in store terms (documents, versions,
//! `Conflict`/`NotFound`/`Unavailable`); URLs redacted for messages.

use super::EsStore;
use crate::store::*;
use elasticsearch::http::Url;
use elasticsearch::http::response::Response;
use elasticsearch::*;
use serde_json::Value;
use std::future::Future;
use std::time::{Duration, Instant};

/// The URL with any user:password removed, for logs and errors.
pub fn redact(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string().trim_end_matches('/').to_string()
        }
        Err(_) => url.to_string(),
    }
}

pub(super) fn version_of(v: &Value) -> Option<Version> {
    Some(Version {
        seq_no: v["_seq_no"].as_u64()?,
        primary_term: v["_primary_term"].as_u64()?,
    })
}

/// The document a get, an `_mget` item or a hit holds, its source taken
/// out of `v` (not copied: a page of answers holds thousands).
pub(super) fn doc_of(v: &mut Value) -> StoreResult<Doc> {
    let version =
        version_of(v).ok_or_else(|| StoreError::Other(format!("response without _seq_no: {v}")))?;
    let id = match v["_id"].take() {
        Value::String(s) => s,
        _ => String::new(),
    };
    Ok(Doc {
        id,
        version,
        source: v["_source"].take().into(),
    })
}

/// The error type and reason of an Elasticsearch error body; of a body
/// that was not JSON (a proxy's page), its title or first line.
pub(super) fn reason(body: &Value) -> String {
    let e = &body["error"];
    match (e["type"].as_str(), e["reason"].as_str(), body.as_str()) {
        (Some(t), Some(r), _) => format!("{t}: {r}"),
        (_, _, Some(text)) => {
            let title = text
                .split_once("<title>")
                .and_then(|(_, r)| r.split_once("</title>"))
                .map(|(t, _)| t);
            let line = title.unwrap_or(text).trim().lines().next().unwrap_or("");
            line.chars().take(200).collect()
        }
        _ => body.to_string(),
    }
}

/// A per-item or per-request failure in store terms.
pub(super) fn error_of(status: u16, body: &Value, id: &str) -> StoreError {
    match status {
        409 => StoreError::Conflict(id.to_string()),
        404 => StoreError::NotFound(format!("{id}: {}", reason(body))),
        400 | 413 => StoreError::Invalid(reason(body)),
        429 | 502 | 503 | 504 => {
            StoreError::Unavailable(format!("HTTP {status}: {}", reason(body)))
        }
        _ => StoreError::Other(format!("HTTP {status}: {}", reason(body))),
    }
}

impl EsStore {
    /// A message with every URL as given (credentials and all) replaced by
    /// its redacted form.
    pub(super) fn scrub(&self, msg: String) -> String {
        self.raw_urls
            .iter()
            .fold(msg, |m, (raw, shown)| m.replace(raw, shown))
    }
}

pub(super) fn retryable(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

/// Why one request failed.
pub(super) enum Failure {
    /// Refused for a cause the user must fix (whole message, naming the URL;
    /// see [`Who`](super::refusal::Who)): retrying cannot help.
    Refused(String),
    /// No answer (the cause, worth retrying).
    Unreachable(String),
}

impl EsStore {
    /// One request, no retries: (status, body; a body that is not JSON is
    /// its text), or why it failed, refusals worded by [`Who`](super::refusal::Who).
    pub(super) fn once<F, Fut>(&self, f: F) -> Result<(u16, Value), Failure>
    where
        F: Fn(Elasticsearch) -> Fut,
        Fut: Future<Output = Result<Response, elasticsearch::Error>>,
    {
        let client = self.clients[self.caller as usize].clone();
        self.rt.block_on(async {
            let resp = f(client).await.map_err(|e| {
                if let Some(m) = self.who.transport(&e) {
                    return Failure::Refused(m);
                }
                let m = self
                    .who
                    .hint(&e)
                    .unwrap_or_else(|| self.scrub(crate::causes::error_chain(&e)));
                if let Some(node) = self.pool.failed_here() {
                    log::warn!(
                        "Elasticsearch node {} failed ({m}): trying the others",
                        redact(node.as_str())
                    );
                }
                Failure::Unreachable(m)
            })?;
            self.pool.answered_here();
            let status = resp.status_code().as_u16();
            let bytes = resp.bytes().await.unwrap_or_default();
            let body = match serde_json::from_slice(&bytes) {
                Ok(v) => v,
                Err(_) if bytes.is_empty() => Value::Null,
                Err(_) => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
            };
            match self.who.answer(status, &body) {
                Some(m) => Err(Failure::Refused(m)),
                None => Ok((status, body)),
            }
        })
    }

    /// A request with bounded retries on overload and transport failures:
    /// (status, body) of the final answer, `Unavailable`, or at once
    /// `Refused`.
    pub(super) fn call<F, Fut>(&self, f: F) -> StoreResult<(u16, Value)>
    where
        F: Fn(Elasticsearch) -> Fut,
        Fut: Future<Output = Result<Response, elasticsearch::Error>>,
    {
        self.call_tracked(f).map(|(status, body, _)| (status, body))
    }

    /// [`EsStore::call`], also telling whether an earlier attempt may have
    /// been applied though its answer was lost (the connection failed, or a
    /// proxy gave up waiting): a write's 409 may then be its own earlier
    /// attempt, which the caller checks ([`EsStore::landed`]).
    pub(super) fn call_tracked<F, Fut>(&self, f: F) -> StoreResult<(u16, Value, bool)>
    where
        F: Fn(Elasticsearch) -> Fut,
        Fut: Future<Output = Result<Response, elasticsearch::Error>>,
    {
        let start = Instant::now();
        let mut delay = Duration::from_millis(50);
        let mut ambiguous = false;
        loop {
            let last = match self.once(&f) {
                Ok((status, body)) if !retryable(status) => return Ok((status, body, ambiguous)),
                Ok((status, body)) => {
                    // 429 and 503 are refusals before anything was applied
                    ambiguous |= matches!(status, 502 | 504);
                    format!("HTTP {status}: {}", reason(&body))
                }
                Err(Failure::Unreachable(e)) => {
                    ambiguous = true;
                    e
                }
                Err(Failure::Refused(m)) => return Err(StoreError::Refused(m)),
            };
            if start.elapsed() + delay > self.retry_budget {
                log::warn!("Elasticsearch at {} unavailable: {last}", self.url);
                return Err(StoreError::Unavailable(format!(
                    "Elasticsearch at {} unavailable: {last}",
                    self.url
                )));
            }
            log::debug!("retrying in {delay:?} after: {last}");
            std::thread::sleep(jitter(delay));
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }
}

pub(super) fn jitter(d: Duration) -> Duration {
    // Cheap jitter from the clock: spreads retries of concurrent callers.
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    d + d * (n % 1000) / 2000
}
