//! Searches: a [`Query`] and sort to the query DSL, search bodies and hits,
//! brief reads' source filtering, and field collapsing (grouping).

use super::EsStore;
use super::client::{doc_of, error_of, version_of};
use crate::store::schema::{Field, FieldType, Idx};
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

/// The columns (doc values) a read of `idx` takes instead of `_source`:
/// for entries and texts, a brief read, or one of a few fields that all
/// are columns. Elasticsearch keeps `_id` and `_source` together in
/// compressed blocks of stored fields, so any hit that names its `_id` or
/// filters its `_source` inflates the block its document is in: on
/// Elasticsearch 9.5.3, 10 000 entries of a source tree took 635 ms with
/// their text (then in the entries) excluded from `_source` and 36 ms from
/// doc values, and `find` of a 45k-name tree spent its node's CPU there.
/// Texts are all text; entries are read in listings of thousands. Other
/// indices' documents are small and read by id.
fn columns(idx: Idx, brief: bool, fields: Option<&[&str]>) -> Option<Vec<&'static Field>> {
    if !matches!(idx, Idx::Entries | Idx::Texts) {
        return None;
    }
    let columnar = |f: &&Field| f.ty != FieldType::Text;
    match fields {
        None if brief => Some(idx.fields().iter().filter(columnar).collect()),
        None => None,
        // With the fields that make the document's id.
        Some(names) => id_fields(idx)
            .iter()
            .chain(names.iter().filter(|n| !id_fields(idx).contains(n)))
            .map(|n| idx.field(n).filter(columnar))
            .collect::<Option<Vec<_>>>(),
    }
}

/// The fields a document read from columns is named by: an entry's parent
/// and name, a text's inode.
fn id_fields(idx: Idx) -> &'static [&'static str] {
    match idx {
        Idx::Texts => &["ino"],
        _ => &["parent", "name"],
    }
}

/// A field of `idx` unique per document, to sort ties by (`_id` is not
/// sortable on recent Elasticsearch).
fn unique_field(idx: Idx) -> &'static str {
    match idx {
        Idx::Texts => "ino",
        _ => "path",
    }
}

/// The id of the document of `idx` whose (rebuilt) source is `source`.
fn id_of_columns(idx: Idx, source: &Value) -> Option<String> {
    match idx {
        Idx::Texts => source.get("ino")?.as_u64().map(crate::model::text_id),
        _ => crate::model::entry_id_of(source),
    }
}

/// `docvalue_fields` for `cols`: a date as the number it was written as.
fn docvalue_spec(cols: &[&Field]) -> Value {
    json!(
        cols.iter()
            .map(|f| match f.ty {
                FieldType::Date => json!({"field": f.name, "format": "epoch_millis"}),
                _ => json!(f.name),
            })
            .collect::<Vec<_>>()
    )
}

/// A hit's source rebuilt from its doc values (`fields`): a single value
/// as the value, a `Keywords` field as its (sorted, unique) array, a date
/// (`epoch_millis`, which comes back as a string) as its number.
fn source_of_columns(fields: &Value, cols: &[&Field]) -> Value {
    let mut out = serde_json::Map::new();
    for f in cols {
        let Some(vals) = fields[f.name].as_array().filter(|v| !v.is_empty()) else {
            continue;
        };
        let v = match f.ty {
            FieldType::Keywords => Value::Array(vals.clone()),
            FieldType::Date => match &vals[0] {
                Value::String(s) => s.parse::<i64>().map_or(Value::Null, Value::from),
                other => other.clone(),
            },
            _ => vals[0].clone(),
        };
        out.insert(f.name.to_string(), v);
    }
    Value::Object(out)
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
            self.refresh_if_dirty(req.index, &req.query)?;
        }
        let name = &self.index_name(req.index);
        let name = name.as_str();
        let mut body = self.search_body(req);
        let cols = columns(req.index, brief, fields);
        if let Some(cols) = &cols {
            body["_source"] = json!(false);
            body["stored_fields"] = json!("_none_");
            body["docvalue_fields"] = docvalue_spec(cols);
        } else if let Some(f) = fields {
            body["_source"] = json!({ "includes": f });
        } else if brief && !text_fields(req.index).is_empty() {
            body["_source"] = json!({"excludes": text_fields(req.index)});
        }
        let body = &body;
        let (status, mut resp) = self.call(|c| async move {
            c.search(SearchParts::Index(&[name]))
                .body(body.clone())
                .send()
                .await
        })?;
        if status != 200 {
            return Err(error_of(status, &resp, "_search"));
        }
        match cols {
            Some(cols) => self.hits_of_columns(req.index, &resp, &cols, fields),
            None => Self::hits_of(&mut resp, 0),
        }
    }

    /// The hits of a search that read `cols` (see [`columns`]), with their
    /// ids derived ([`id_of_columns`]). A hit whose columns do not hold all
    /// a brief source would (or the `fields` asked for) is read again by
    /// id, as before: a path too long for its column, an entry written
    /// before one of its fields was a column.
    fn hits_of_columns(
        &self,
        idx: Idx,
        resp: &Value,
        cols: &[&Field],
        fields: Option<&[&str]>,
    ) -> StoreResult<Vec<Hit>> {
        let mut out = Vec::new();
        let mut again = Vec::new();
        for h in resp["hits"]["hits"].as_array().into_iter().flatten() {
            let source = source_of_columns(&h["fields"], cols);
            let id = id_of_columns(idx, &source).ok_or_else(|| {
                StoreError::Other(format!("a document without {:?}: {h}", id_fields(idx)))
            })?;
            let whole = match (idx, fields) {
                (Idx::Texts, _) => true,
                (_, None) => crate::model::entry_columns_whole(&source),
                (_, Some(names)) => names
                    .iter()
                    .all(|n| source.get(*n).is_some() || !crate::model::ENTRY_ALWAYS.contains(n)),
            };
            if !whole {
                again.push(out.len());
            }
            let version = version_of(h)
                .ok_or_else(|| StoreError::Other(format!("response without _seq_no: {h}")))?;
            out.push(Hit {
                doc: Doc {
                    id,
                    version,
                    source: source.into(),
                },
                sort: h["sort"].as_array().cloned().unwrap_or_default(),
            });
        }
        if again.is_empty() {
            return Ok(out);
        }
        let keys: Vec<(Idx, String)> = again
            .iter()
            .map(|&i| (idx, out[i].doc.id.clone()))
            .collect();
        let docs = self.mget_docs(&keys, true)?;
        let mut gone = Vec::new();
        for (&i, doc) in again.iter().zip(docs) {
            match doc {
                Some(d) => out[i].doc = d,
                None => gone.push(i), // deleted since the search
            }
        }
        for i in gone.into_iter().rev() {
            out.remove(i);
        }
        Ok(out)
    }

    /// Field collapsing (Elasticsearch: The Definitive Guide, chapter "Handling
    /// Relationships", "Field Collapsing"): a terms aggregation on the field,
    /// ordered by each bucket's best score (`max` of `_score`), with
    /// `top_hits` inside; `size: 0` skips the plain hits.
    pub(super) fn group_impl(&self, req: &GroupRequest) -> StoreResult<Vec<Bucket>> {
        self.refresh_if_dirty(req.index, &req.query)?;
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
                        "sort": [{"_score": "desc"}, {unique_field(req.index): "asc"}],
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
                    source: h["_source"].clone().into(),
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

    /// The hits of a search answer, taken out of it.
    pub(super) fn hits_of(resp: &mut Value, strip: usize) -> StoreResult<Vec<Hit>> {
        let mut out = Vec::new();
        for h in resp["hits"]["hits"].as_array_mut().into_iter().flatten() {
            let mut sort = match h["sort"].take() {
                Value::Array(s) => s,
                _ => Vec::new(),
            };
            sort.truncate(sort.len().saturating_sub(strip));
            out.push(Hit {
                doc: doc_of(h)?,
                sort,
            });
        }
        Ok(out)
    }
}
