//! What differs between Elasticsearch and OpenSearch ([`Engine`], read from
//! `GET /`): the supported versions and the point-in-time endpoints.

use super::EsStore;
use super::client::error_of;
use crate::store::*;
use elasticsearch::*;
use serde_json::{Value, json};

/// Which server speaks the API (from `GET /`): the places they differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Engine {
    Elasticsearch,
    OpenSearch,
}

impl Engine {
    /// From `GET /`'s answer: the engine, or why it is not supported.
    pub(super) fn of(info: &Value, shown: &str) -> StoreResult<(Engine, String)> {
        let version = info["version"]["number"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        let major: u32 = version
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        let (engine, name, supported) = match info["version"]["distribution"].as_str() {
            Some("opensearch") => (Engine::OpenSearch, "OpenSearch", 2..=3),
            _ => (Engine::Elasticsearch, "Elasticsearch", 8..=9),
        };
        if !supported.contains(&major) {
            return Err(StoreError::Invalid(format!(
                "{name} at {shown} is version {version}; esfs supports {name} {}.x to {}.x",
                supported.start(),
                supported.end()
            )));
        }
        Ok((engine, format!("{name} {version}")))
    }
}

impl EsStore {
    /// Open a point in time on one index: its id.
    pub(super) fn open_pit(&self, name: &str) -> StoreResult<String> {
        let (status, resp) = match self.engine {
            Engine::Elasticsearch => self.call(|c| async move {
                c.open_point_in_time(OpenPointInTimeParts::Index(&[name]))
                    .keep_alive("2m")
                    .send()
                    .await
            })?,
            Engine::OpenSearch => {
                let path = &format!("/{name}/_search/point_in_time");
                self.call(|c| async move {
                    c.send(
                        elasticsearch::http::Method::Post,
                        path,
                        Default::default(),
                        Some(&[("keep_alive", "2m")]),
                        None::<()>,
                        None,
                    )
                    .await
                })?
            }
        };
        let id = match self.engine {
            Engine::Elasticsearch => &resp["id"],
            Engine::OpenSearch => &resp["pit_id"],
        };
        match (status, id.as_str()) {
            (200, Some(id)) => Ok(id.to_string()),
            _ => Err(error_of(status, &resp, "open point in time")),
        }
    }

    pub(super) fn close_pit(&self, id: &str) -> StoreResult<()> {
        let (status, resp) = match self.engine {
            Engine::Elasticsearch => {
                let close = &json!({ "id": id });
                self.call(
                    |c| async move { c.close_point_in_time().body(close.clone()).send().await },
                )?
            }
            Engine::OpenSearch => {
                let close = &json!({ "pit_id": [id] }).to_string();
                self.call(|c| async move {
                    c.send(
                        elasticsearch::http::Method::Delete,
                        "/_search/point_in_time",
                        Default::default(),
                        None::<&()>,
                        Some(close.as_str()),
                        None,
                    )
                    .await
                })?
            }
        };
        match status {
            200 | 404 => Ok(()),
            _ => Err(error_of(status, &resp, "close point in time")),
        }
    }
}
