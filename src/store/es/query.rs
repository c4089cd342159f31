//! Searches: a [`Query`] and sort to the query DSL, search bodies and hits,
//! brief reads' source filtering, and field collapsing (grouping).

use super::EsStore;
use super::client::{doc_of, error_of, version_of};
use crate::store::schema::{FieldType, Idx};
use crate::store::*;
use elasticsearch::*;
use serde_json::{Value, json};

/// The Elasticsearch query DSL for a [`Query`].
pub fn query_json(q: &Query) -> Value {
    match q {
        Query::MatchAll => json!({"match_all": {}}),
        Query::Term { field, value } => json!({"term": {field: value}}),
        Query::Terms { field, values } => json!({"terms": {field: values}}),
        Query::Prefix { field, value } => json!({"prefix": {field: value}}),
        // path_hierarchy emits no "/" token: the root's subtree is every path.
        Query::Tree { field, path } if path == "/" => json!({"exists": {"field": field}}),
        Query::Tree { field, path } => json!({"term": {format!("{field}.tree"): path}}),
        // Every trigram of the text (the field's analyzer), in any order.
        Query::Text { field, text } => {
            json!({"match": {field: {"query": text, "operator": "and"}}})
        }
        Query::Range {
            field,
            gte,
            gt,
            lte,
            lt,
        } => {
            let mut r = serde_json::Map::new();
            for (k, v) in [("gte", gte), ("gt", gt), ("lte", lte), ("lt", lt)] {
                if let Some(v) = v {
                    r.insert(k.into(), v.clone());
                }
            }
            json!({"range": {field: r}})
        }
        Query::Exists { field } => json!({"exists": {"field": field}}),
        Query::Bool {
            must,
            must_not,
            should,
        } => {
            let list = |qs: &Vec<Query>| qs.iter().map(query_json).collect::<Vec<_>>();
            let mut b = serde_json::Map::new();
            b.insert("filter".into(), json!(list(must)));
            b.insert("must_not".into(), json!(list(must_not)));
            if !should.is_empty() {
                b.insert("should".into(), json!(list(should)));
                b.insert("minimum_should_match".into(), json!(1));
            }
            json!({"bool": b})
        }
    }
}

/// Sorts with `missing: _last` spelled out on document fields (the
/// default): OpenSearch 2.x skips segments under `search_after` using the
/// field's min/max and loses documents without the field unless `missing`
/// is given (opensearch-project/OpenSearch#14824; #8391 turned the
/// shortcut off for an explicit `missing`). `_doc`, `_score`, ... take none.
pub(super) fn sort_json(sort: &[Sort]) -> Value {
    json!(
        sort.iter()
            .map(|s| {
                let order = if s.descending { "desc" } else { "asc" };
                match s.field.starts_with('_') {
                    true => json!({&s.field: {"order": order}}),
                    false => json!({&s.field: {"order": order, "missing": "_last"}}),
                }
            })
            .collect::<Vec<_>>()
    )
}

/// The fields left out of brief reads (`get_brief`, `search_brief`).
pub(super) fn text_fields(idx: Idx) -> Vec<&'static str> {
    idx.fields()
        .iter()
        .filter(|f| f.ty == FieldType::Text)
        .map(|f| f.name)
        .collect()
}

impl EsStore {
    /// `fields`: only these source fields; else `brief`: all but the text.
    pub(super) fn search_impl(
        &self,
        req: &SearchRequest,
        brief: bool,
        fields: Option<&[&str]>,
    ) -> StoreResult<Vec<Hit>> {
        if !req.past_own_writes {
            self.refresh_if_dirty(req.index)?;
        }
        let name = &self.index_name(req.index);
        let name = name.as_str();
        let mut body = self.search_body(req);
        if let Some(f) = fields {
            body["_source"] = json!({ "includes": f });
        } else if brief && !text_fields(req.index).is_empty() {
            body["_source"] = json!({"excludes": text_fields(req.index)});
        }
        let body = &body;
        let (status, resp) = self.call(|c| async move {
            c.search(SearchParts::Index(&[name]))
                .body(body.clone())
                .send()
                .await
        })?;
        if status != 200 {
            return Err(error_of(status, &resp, "_search"));
        }
        Self::hits_of(&resp, 0)
    }

    /// Field collapsing (Elasticsearch: The Definitive Guide, chapter "Handling
    /// Relationships", "Field Collapsing"): a terms aggregation on the field,
    /// ordered by each bucket's best score (`max` of `_score`), with
    /// `top_hits` inside; `size: 0` skips the plain hits.
    pub(super) fn group_impl(&self, req: &GroupRequest) -> StoreResult<Vec<Bucket>> {
        self.refresh_if_dirty(req.index)?;
        let name = &self.index_name(req.index);
        let name = name.as_str();
        let mut q = json!({"bool": {"filter": [query_json(&req.query)]}});
        if let Some(sq) = &req.score {
            q["bool"]["should"] = json!([query_json(sq)]);
            q["bool"]["minimum_should_match"] = json!(0);
        }
        let body = &json!({
            "size": 0,
            "query": q,
            "aggs": {"groups": {
                "terms": {
                    "field": req.field,
                    "size": req.buckets,
                    "order": [{"top_score": "desc"}, {"_key": "asc"}]
                },
                "aggs": {
                    "top_score": {"max": {"script": "_score"}},
                    "top": {"top_hits": {
                        "size": req.per_bucket,
                        "seq_no_primary_term": true,
                        "sort": [{"_score": "desc"}, {"path": "asc"}],
                        "_source": {"excludes": text_fields(req.index)}
                    }}
                }
            }}
        });
        let (status, resp) = self.call(|c| async move {
            c.search(SearchParts::Index(&[name]))
                .body(body.clone())
                .send()
                .await
        })?;
        if status != 200 {
            return Err(error_of(status, &resp, "_search"));
        }
        let mut out = Vec::new();
        for b in resp["aggregations"]["groups"]["buckets"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let mut hits = Vec::new();
            for h in b["top"]["hits"]["hits"].as_array().into_iter().flatten() {
                // Without seq_no in top_hits (older servers) the version is
                // irrelevant here: these sources are brief, never written back.
                let doc = Doc {
                    id: h["_id"].as_str().unwrap_or_default().to_string(),
                    version: version_of(h).unwrap_or(Version {
                        seq_no: 0,
                        primary_term: 0,
                    }),
                    source: h["_source"].clone(),
                };
                hits.push((doc, h["_score"].as_f64().unwrap_or(0.0)));
            }
            out.push(Bucket {
                key: b["key"].clone(),
                doc_count: b["doc_count"].as_u64().unwrap_or(0),
                top_score: b["top_score"]["value"].as_f64().unwrap_or(0.0),
                hits,
            });
        }
        Ok(out)
    }

    pub(super) fn search_body(&self, req: &SearchRequest) -> Value {
        let mut body = json!({
            "query": query_json(&req.query),
            "size": req.size,
            "seq_no_primary_term": true,
            "track_total_hits": false,
        });
        if !req.sort.is_empty() {
            body["sort"] = sort_json(&req.sort);
        }
        if let Some(after) = &req.search_after {
            body["search_after"] = json!(after);
        }
        body
    }

    pub(super) fn hits_of(resp: &Value, strip: usize) -> StoreResult<Vec<Hit>> {
        let mut out = Vec::new();
        for h in resp["hits"]["hits"].as_array().into_iter().flatten() {
            let mut sort: Vec<Value> = h["sort"].as_array().cloned().unwrap_or_default();
            sort.truncate(sort.len().saturating_sub(strip));
            out.push(Hit {
                doc: doc_of(h)?,
                sort,
            });
        }
        Ok(out)
    }
}
