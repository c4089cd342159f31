//! The query compiler: a [`Query`] to an SQL WHERE expression, sort keys and
//! `search_after` to ORDER BY and range seeks, the statements of a search
//! page, and searches, counts and grouping (FTS5 scoring) run on them.

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, Row, ToSql};
use serde_json::Value;

use super::encode::{attach_text, json_of, param};
use super::read::parse_source;
use super::tables::{columnar, has_text, side_table, text_table};
use super::{Core, invalid, sql_err, version};
use crate::store::schema::{Field, FieldType};
use crate::store::{Bucket, Doc, GroupRequest, Hit, Idx, Query, SearchRequest, Sort, StoreResult};

/// SQL text with its positional parameters.
#[derive(Default, Debug)]
pub(super) struct Sql {
    pub(super) text: String,
    pub(super) params: Vec<SqlValue>,
}

impl Sql {
    pub(super) fn push(&mut self, s: &str) -> &mut Self {
        self.text.push_str(s);
        self
    }
    pub(super) fn col(&mut self, f: &Field) -> &mut Self {
        self.text.push_str("f_");
        self.text.push_str(f.name);
        self
    }
    pub(super) fn bind(&mut self, v: SqlValue) -> &mut Self {
        self.text.push('?');
        self.params.push(v);
        self
    }
    pub(super) fn append(&mut self, other: &Sql) -> &mut Self {
        self.text.push_str(&other.text);
        self.params.extend(other.params.iter().cloned());
        self
    }
}

pub(super) fn field_of(idx: Idx, name: &str) -> StoreResult<&'static Field> {
    idx.field(name).ok_or_else(|| {
        invalid(format!(
            "index {:?} has no searchable field {name:?}",
            idx.name()
        ))
    })
}

pub(super) fn is_text(f: &Field) -> bool {
    matches!(
        f.ty,
        FieldType::Keyword | FieldType::KeywordText | FieldType::Path
    )
}

/// The least string above every string that starts with `prefix` (None when
/// there is none). UTF-8 byte order is code point order, so bumping the last
/// char that can be bumped and dropping what follows is exact.
pub(super) fn prefix_end(prefix: &str) -> Option<String> {
    let mut s = prefix.to_string();
    while let Some(c) = s.pop() {
        let next = if c == '\u{D7FF}' {
            Some('\u{E000}')
        } else {
            char::from_u32(c as u32 + 1)
        };
        if let Some(n) = next {
            s.push(n);
            return Some(s);
        }
    }
    None
}

/// Translates `q` to a WHERE expression. Leaves may evaluate to NULL on a
/// missing column (treated as false by WHERE); negations use `IS NOT TRUE`
/// so that a missing field does satisfy `must_not`, as in Elasticsearch.
pub(super) fn compile(idx: Idx, q: &Query, s: &mut Sql) -> StoreResult<()> {
    // Fields kept in a side table (keyword lists, full text) are queried
    // there, whatever the query kind.
    if let Some(f) = side_field(idx, q)? {
        return compile_side(idx, f, q, s);
    }
    match q {
        Query::MatchAll => {
            s.push("1");
            Ok(())
        }
        Query::Text { field, text } => compile_text(idx, field_of(idx, field)?, text, s),
        Query::Term { field, value } => {
            let f = field_of(idx, field)?;
            let v = param(f, value)?;
            s.col(f).push(" = ").bind(v);
            Ok(())
        }
        Query::Terms { field, values } => compile_terms(field_of(idx, field)?, values, s),
        Query::Prefix { field, value } => compile_prefix(field_of(idx, field)?, value, s),
        Query::Tree { field, path } => compile_tree(field_of(idx, field)?, path, s),
        Query::Range {
            field,
            gte,
            gt,
            lte,
            lt,
        } => compile_range(field_of(idx, field)?, [gte, gt, lte, lt], s),
        Query::Exists { field } => {
            s.col(field_of(idx, field)?).push(" IS NOT NULL");
            Ok(())
        }
        Query::Bool {
            must,
            must_not,
            should,
        } => compile_bool(idx, must, must_not, should, s),
    }
}

/// A full-text query: a trigram phrase, the folded text as a substring.
fn compile_text(idx: Idx, f: &Field, text: &str, s: &mut Sql) -> StoreResult<()> {
    if f.ty != FieldType::Text {
        return Err(invalid(format!(
            "text query on non-text field {:?}",
            f.name
        )));
    }
    if text.chars().count() < 3 {
        return Err(invalid(format!(
            "text query {text:?} has fewer than 3 characters"
        )));
    }
    let st = side_table(idx, f);
    s.push(&format!(
        "rid IN (SELECT rowid FROM \"{st}\" WHERE \"{st}\" MATCH "
    ))
    .bind(SqlValue::Text(fts_phrase(text)))
    .push(")");
    Ok(())
}

/// A term, terms, prefix or exists query on a field kept in a side table:
/// the rows that have a matching value there.
fn compile_side(idx: Idx, f: &Field, q: &Query, s: &mut Sql) -> StoreResult<()> {
    let st = side_table(idx, f);
    if f.ty == FieldType::Text {
        let Query::Exists { .. } = q else {
            return Err(invalid(format!(
                "field {:?} is full text: use a text query",
                f.name
            )));
        };
        s.push(&format!("rid IN (SELECT rid FROM \"{}\")", text_table(&st)));
        return Ok(());
    }
    s.push(&format!("rid IN (SELECT rid FROM \"{st}\" WHERE "));
    match q {
        Query::Term { value, .. } => {
            s.push("v = ").bind(param(f, value)?);
        }
        Query::Terms { values, .. } => {
            s.push("v IN (");
            bind_each(f, values, s)?;
            if values.is_empty() {
                s.push("NULL");
            }
            s.push(")");
        }
        Query::Prefix { value, .. } => {
            s.push("v >= ").bind(SqlValue::Text(value.clone()));
            if let Some(end) = prefix_end(value) {
                s.push(" AND v < ").bind(SqlValue::Text(end));
            }
        }
        _ => {
            s.push("1");
        }
    }
    s.push(")");
    Ok(())
}

/// `values` bound as `f`'s type, separated by commas.
fn bind_each(f: &Field, values: &[Value], s: &mut Sql) -> StoreResult<()> {
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            s.push(", ");
        }
        s.bind(param(f, v)?);
    }
    Ok(())
}

fn compile_terms(f: &Field, values: &[Value], s: &mut Sql) -> StoreResult<()> {
    if values.is_empty() {
        s.push("0");
        return Ok(());
    }
    s.col(f).push(" IN (");
    bind_each(f, values, s)?;
    s.push(")");
    Ok(())
}

fn compile_prefix(f: &Field, value: &str, s: &mut Sql) -> StoreResult<()> {
    if !is_text(f) {
        return Err(invalid(format!(
            "prefix query on non-keyword field {:?}",
            f.name
        )));
    }
    // A byte range, not LIKE (case-insensitive, `%`/`_` wildcards).
    s.push("(")
        .col(f)
        .push(" >= ")
        .bind(SqlValue::Text(value.to_string()));
    if let Some(end) = prefix_end(value) {
        s.push(" AND ").col(f).push(" < ").bind(SqlValue::Text(end));
    }
    s.push(")");
    Ok(())
}

fn compile_tree(f: &Field, path: &str, s: &mut Sql) -> StoreResult<()> {
    if f.ty != FieldType::Path {
        return Err(invalid(format!(
            "tree query on non-path field {:?}",
            f.name
        )));
    }
    let text = |s: &str| SqlValue::Text(s.to_string());
    if path == "/" {
        // Every absolute path; '0' is the byte after '/'.
        s.push("(").col(f).push(" >= ").bind(text("/"));
        s.push(" AND ").col(f).push(" < ").bind(text("0")).push(")");
    } else {
        // One index range [path, path + "0") holding the path and its
        // subtree, minus siblings such as `path-x` or `path.x`.
        s.push("(").col(f).push(" >= ").bind(text(path));
        s.push(" AND ")
            .col(f)
            .push(" < ")
            .bind(text(&format!("{path}0")));
        s.push(" AND (").col(f).push(" = ").bind(text(path));
        s.push(" OR ")
            .col(f)
            .push(" >= ")
            .bind(text(&format!("{path}/")));
        s.push("))");
    }
    Ok(())
}

/// A range; `bounds` are gte, gt, lte and lt.
fn compile_range(f: &Field, bounds: [&Option<Value>; 4], s: &mut Sql) -> StoreResult<()> {
    if !columnar(f) {
        return Err(invalid(format!("range query on field {:?}", f.name)));
    }
    let mut any = false;
    s.push("(");
    for (op, bound) in [" >= ", " > ", " <= ", " < "].into_iter().zip(bounds) {
        // A null bound is unbounded, as in Elasticsearch.
        let Some(v) = bound.as_ref().filter(|v| !v.is_null()) else {
            continue;
        };
        if any {
            s.push(" AND ");
        }
        any = true;
        let v = param(f, v)?;
        s.col(f).push(op).bind(v);
    }
    if !any {
        s.col(f).push(" IS NOT NULL");
    }
    s.push(")");
    Ok(())
}

fn compile_bool(
    idx: Idx,
    must: &[Query],
    must_not: &[Query],
    should: &[Query],
    s: &mut Sql,
) -> StoreResult<()> {
    let mut first = true;
    let mut sep = |s: &mut Sql| {
        if !std::mem::take(&mut first) {
            s.push(" AND ");
        }
    };
    s.push("(");
    for q in must {
        sep(s);
        s.push("(");
        compile(idx, q, s)?;
        s.push(")");
    }
    for q in must_not {
        sep(s);
        s.push("(");
        compile(idx, q, s)?;
        s.push(") IS NOT TRUE");
    }
    if !should.is_empty() {
        sep(s);
        s.push("(");
        for (i, q) in should.iter().enumerate() {
            if i > 0 {
                s.push(" OR ");
            }
            s.push("(");
            compile(idx, q, s)?;
            s.push(")");
        }
        s.push(")");
    }
    if first {
        s.push("1");
    }
    s.push(")");
    Ok(())
}

/// The `Keywords`/`Text` field a term, terms, prefix or exists query is on.
pub(super) fn side_field(idx: Idx, q: &Query) -> StoreResult<Option<&'static Field>> {
    let field = match q {
        Query::Term { field, .. }
        | Query::Terms { field, .. }
        | Query::Prefix { field, .. }
        | Query::Exists { field } => field,
        _ => return Ok(None),
    };
    let f = field_of(idx, field)?;
    Ok((!columnar(f)).then_some(f))
}

/// An FTS5 phrase matching `text` exactly (quotes doubled).
pub(super) fn fts_phrase(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "\"\""))
}

#[derive(Clone, Copy)]
pub(super) struct SortKey {
    pub(super) field: &'static Field,
    pub(super) desc: bool,
}

/// A parsed `search_after`: one value per sort key (None = missing), then
/// the id when given (Elasticsearch-style callers may pass only the sort
/// values; rows tying on all of them are then skipped, as in ES).
pub(super) struct After {
    pub(super) vals: Vec<Option<SqlValue>>,
    pub(super) id: Option<String>,
}

pub(super) fn sort_keys(idx: Idx, sort: &[Sort]) -> StoreResult<Vec<SortKey>> {
    sort.iter()
        .map(|s| {
            let field = field_of(idx, &s.field)?;
            if !columnar(field) {
                return Err(invalid(format!("cannot sort on field {:?}", s.field)));
            }
            Ok(SortKey {
                field,
                desc: s.descending,
            })
        })
        .collect()
}

pub(super) fn parse_after(keys: &[SortKey], after: &[Value]) -> StoreResult<After> {
    let with_id = after.len() == keys.len() + 1;
    if !with_id && (after.len() != keys.len() || keys.is_empty()) {
        return Err(invalid(format!(
            "search_after has {} values, expected {} (the sort values, then the id)",
            after.len(),
            keys.len() + 1
        )));
    }
    let vals = keys
        .iter()
        .zip(after)
        .map(|(k, v)| {
            if v.is_null() {
                Ok(None)
            } else {
                param(k.field, v).map(Some)
            }
        })
        .collect::<StoreResult<_>>()?;
    let id = match after.get(keys.len()) {
        None => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => {
            return Err(invalid(
                "the last search_after value must be the id (a string)",
            ));
        }
    };
    Ok(After { vals, id })
}

/// "The row sorts after `after`" over `keys` then the id, missing values last
/// in both directions.
pub(super) fn after_cond(
    s: &mut Sql,
    keys: &[SortKey],
    vals: &[Option<SqlValue>],
    id: Option<&str>,
) {
    let Some((k, rest)) = keys.split_first() else {
        match id {
            Some(id) => s.push("id > ").bind(SqlValue::Text(id.to_string())),
            None => s.push("0"),
        };
        return;
    };
    match &vals[0] {
        Some(v) => {
            let op = if k.desc { " < " } else { " > " };
            s.push("(").col(k.field).push(op).bind(v.clone());
            s.push(" OR ").col(k.field).push(" IS NULL");
            s.push(" OR (")
                .col(k.field)
                .push(" = ")
                .bind(v.clone())
                .push(" AND ");
            after_cond(s, rest, &vals[1..], id);
            s.push("))");
        }
        // Only other missing values can follow a missing one.
        None => {
            s.push("(").col(k.field).push(" IS NULL AND ");
            after_cond(s, rest, &vals[1..], id);
            s.push(")");
        }
    }
}

/// ORDER BY `first` (known present), `keys`, then the id. SQLite sorts NULL
/// lowest, so DESC already puts missing values last and ASC needs NULLS LAST
/// (which an index can't serve, hence the plain order for `first`).
pub(super) fn order_by(s: &mut Sql, first: Option<&SortKey>, keys: &[SortKey]) {
    s.push(" ORDER BY ");
    if let Some(k) = first {
        s.col(k.field)
            .push(if k.desc { " DESC, " } else { " ASC, " });
    }
    for k in keys {
        s.col(k.field).push(if k.desc {
            " DESC, "
        } else {
            " ASC NULLS LAST, "
        });
    }
    s.push("id");
}

/// The statements of one search page, to run in order until `size` hits.
///
/// Missing sort values come last for both directions, as in Elasticsearch.
/// To let an index serve the order and the `search_after` position as a range
/// seek, a sort is split on its first key: first the rows where it is present
/// (`col >= after` can then seek), then those where it is missing. The final
/// parameter of each statement is the LIMIT, bound by the caller.
/// `extra`: more columns to select, after the sort keys.
pub(super) fn search_sql(
    table: &str,
    filter: &Sql,
    keys: &[SortKey],
    after: Option<&After>,
    extra: &[&Field],
    src: bool,
) -> Vec<Sql> {
    // `seek`, if any, is written before the filter: given two lower bounds on
    // one indexed column (a subtree range and the search_after cursor),
    // SQLite seeks on the first it meets, and seeking from the subtree's
    // start made every page rescan all rows before the cursor.
    let with_seek = |seek: Option<&dyn Fn(&mut Sql)>| {
        let mut s = Sql::default();
        s.push(if src {
            "SELECT id, seq, src, rid"
        } else {
            "SELECT id, seq, NULL, rid"
        });
        for k in keys {
            s.push(", ").col(k.field);
        }
        for f in extra {
            s.push(", ").col(f);
        }
        s.push(" FROM \"").push(table).push("\" WHERE ");
        if let Some(seek) = seek {
            seek(&mut s);
            s.push(" AND ");
        }
        s.push("(").append(filter).push(")");
        s
    };
    let base = || with_seek(None);
    let Some((first, rest)) = keys.split_first() else {
        let mut s = base();
        if let Some(a) = after {
            s.push(" AND ");
            after_cond(&mut s, &[], &[], a.id.as_deref());
        }
        s.push(" ORDER BY id LIMIT ?");
        return vec![s];
    };
    let f = first.field;
    let mut out = Vec::with_capacity(2);
    // Rows where the first key is present...
    let present = |mut s: Sql| {
        order_by(&mut s, Some(first), rest);
        s.push(" LIMIT ?");
        s
    };
    match after.map(|a| (a, &a.vals[0])) {
        None => {
            let mut s = base();
            s.push(" AND ").col(f).push(" IS NOT NULL");
            out.push(present(s));
        }
        Some((a, Some(v))) => {
            let op = if first.desc { " <= " } else { " >= " };
            let seek = |s: &mut Sql| {
                s.col(f).push(op).bind(v.clone()).push(" AND ");
                after_cond(s, keys, &a.vals, a.id.as_deref());
            };
            out.push(present(with_seek(Some(&seek))));
        }
        // The page starts among the rows missing it.
        Some((_, None)) => {}
    }
    // ...then those missing it.
    let mut s = base();
    s.push(" AND ").col(f).push(" IS NULL");
    if let Some(a) = after.filter(|a| a.vals[0].is_none()) {
        s.push(" AND ");
        after_cond(&mut s, rest, &a.vals[1..], a.id.as_deref());
    }
    order_by(&mut s, None, rest);
    s.push(" LIMIT ?");
    out.push(s);
    out
}

pub(super) fn hit_of(row: &Row<'_>, keys: &[SortKey]) -> StoreResult<Hit> {
    let id: String = row.get(0).map_err(sql_err)?;
    let seq: i64 = row.get(1).map_err(sql_err)?;
    let source = parse_source(
        row.get_ref(2)
            .and_then(|v| Ok(v.as_bytes()?))
            .map_err(sql_err)?,
    )?;
    let mut sort = Vec::with_capacity(keys.len() + 1);
    for (i, k) in keys.iter().enumerate() {
        let v = row
            .get_ref(4 + i)
            .and_then(|v| json_of(k.field, v))
            .map_err(sql_err)?;
        sort.push(v);
    }
    sort.push(Value::String(id.clone()));
    Ok(Hit {
        doc: Doc {
            id,
            version: version(seq),
            source: source.into(),
        },
        sort,
    })
}

impl Core {
    /// Hits with their parsed sources (and file text unless `brief`).
    pub(super) fn search_impl(&self, req: &SearchRequest, brief: bool) -> StoreResult<Vec<Hit>> {
        let keys = sort_keys(req.index, &req.sort)?;
        self.search_phases(req, &[], true, |tx, row| {
            let mut hit = hit_of(row, &keys)?;
            if !brief && has_text(req.index) {
                let rid: i64 = row.get(3).map_err(sql_err)?;
                attach_text(
                    tx,
                    req.index,
                    rid,
                    std::sync::Arc::make_mut(&mut hit.doc.source),
                )?;
            }
            Ok(hit)
        })
    }

    /// A search whose hits are `f` of rows ending in the columns `cols`
    /// (the source is not read).
    pub(super) fn search_rows<T>(
        &self,
        req: &SearchRequest,
        cols: &[&'static Field],
        f: impl Fn(&Row<'_>) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>> {
        self.search_phases(req, cols, false, |_, row| f(row))
    }

    /// Runs a search's SQL phases on one snapshot; rows are `id, seq, src
    /// (NULL without `src`), rid`, the sort keys, then `extra`.
    pub(super) fn search_phases<T>(
        &self,
        req: &SearchRequest,
        extra: &[&'static Field],
        src: bool,
        mut f: impl FnMut(&Connection, &Row<'_>) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>> {
        let mut filter = Sql::default();
        compile(req.index, &req.query, &mut filter)?;
        let keys = sort_keys(req.index, &req.sort)?;
        let after = req
            .search_after
            .as_deref()
            .map(|a| parse_after(&keys, a))
            .transpose()?;
        if req.size == 0 {
            return Ok(Vec::new());
        }
        let phases = search_sql(req.index.name(), &filter, &keys, after.as_ref(), extra, src);
        // Both phases read the same snapshot.
        self.read(true, |tx| {
            let mut hits = Vec::with_capacity(req.size.min(1024));
            for sql in phases {
                let limit = req.size - hits.len();
                if limit == 0 {
                    break;
                }
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                let mut stmt = tx.prepare_cached(&sql.text).map_err(sql_err)?;
                let params = sql
                    .params
                    .iter()
                    .map(|p| p as &dyn ToSql)
                    .chain(std::iter::once(&limit as &dyn ToSql));
                let mut rows = stmt
                    .query(rusqlite::params_from_iter(params))
                    .map_err(sql_err)?;
                while let Some(row) = rows.next().map_err(sql_err)? {
                    hits.push(f(tx, row)?);
                }
            }
            Ok(hits)
        })
    }

    pub(super) fn count_impl(&self, index: Idx, query: &Query) -> StoreResult<u64> {
        let mut s = Sql::default();
        s.push("SELECT count(*) FROM \"")
            .push(index.name())
            .push("\" WHERE ");
        compile(index, query, &mut s)?;
        self.read(false, |conn| {
            let mut stmt = conn.prepare_cached(&s.text).map_err(sql_err)?;
            let n: i64 = stmt
                .query_row(rusqlite::params_from_iter(&s.params), |r| r.get(0))
                .map_err(sql_err)?;
            Ok(n as u64)
        })
    }

    /// Field collapsing in one statement: the matching rows with their
    /// score (FTS5's bm25, negated so higher is better; 0 without a score
    /// query or a text match), numbered within their bucket by score, each
    /// bucket carrying its best score and size.
    pub(super) fn group_impl(&self, req: &GroupRequest) -> StoreResult<Vec<Bucket>> {
        let idx = req.index;
        let kf = field_of(idx, &req.field)?;
        if !columnar(kf) {
            return Err(invalid(format!("cannot group on field {:?}", req.field)));
        }
        if req.buckets == 0 {
            return Ok(vec![]);
        }
        let t = idx.name();
        let mut s = Sql::default();
        s.push("WITH h AS (SELECT rid, id, seq, src, ").col(kf);
        s.push(&format!(" AS k FROM \"{t}\" WHERE "));
        compile(idx, &req.query, &mut s)?;
        s.push("), sc AS (");
        match &req.score {
            Some(q) => {
                let (st, expr) = fts_score_expr(idx, q)?;
                s.push(&format!(
                    "SELECT rowid AS srid, -bm25(\"{st}\") AS score FROM \"{st}\" WHERE \"{st}\" MATCH "
                ))
                .bind(SqlValue::Text(expr));
            }
            None => {
                s.push("SELECT NULL AS srid, 0.0 AS score WHERE 0");
            }
        }
        s.push(
            "), j AS (SELECT h.*, COALESCE(sc.score, 0.0) AS score FROM h LEFT JOIN sc ON sc.srid = h.rid \
             WHERE h.k IS NOT NULL), \
             r AS (SELECT *, row_number() OVER (PARTITION BY k ORDER BY score DESC, id) AS rn, \
             max(score) OVER (PARTITION BY k) AS best, count(*) OVER (PARTITION BY k) AS n FROM j) \
             SELECT id, seq, src, k, score, best, n FROM r WHERE rn <= ",
        )
        .bind(SqlValue::Integer(req.per_bucket as i64))
        .push(" ORDER BY best DESC, k, rn");
        self.read(false, |conn| {
            let mut stmt = conn.prepare_cached(&s.text).map_err(sql_err)?;
            let mut rows = stmt
                .query(rusqlite::params_from_iter(&s.params))
                .map_err(sql_err)?;
            let mut out: Vec<Bucket> = Vec::new();
            while let Some(row) = rows.next().map_err(sql_err)? {
                let key = row
                    .get_ref(3)
                    .and_then(|v| json_of(kf, v))
                    .map_err(sql_err)?;
                if out.last().is_none_or(|b| b.key != key) {
                    if out.len() == req.buckets {
                        break;
                    }
                    out.push(Bucket {
                        key,
                        doc_count: row.get::<_, i64>(6).map_err(sql_err)? as u64,
                        top_score: row.get(5).map_err(sql_err)?,
                        hits: vec![],
                    });
                }
                let id: String = row.get(0).map_err(sql_err)?;
                let seq: i64 = row.get(1).map_err(sql_err)?;
                let src = row
                    .get_ref(2)
                    .and_then(|v| Ok(v.as_bytes()?))
                    .map_err(sql_err)?;
                let doc = Doc {
                    id,
                    version: version(seq),
                    source: parse_source(src)?.into(),
                };
                let score: f64 = row.get(4).map_err(sql_err)?;
                out.last_mut().expect("bucket").hits.push((doc, score));
            }
            Ok(out)
        })
    }
}

/// The FTS5 table and MATCH expression of a score query made of text
/// queries on one field (alone, or combined by `bool` must/should).
pub(super) fn fts_score_expr(idx: Idx, q: &Query) -> StoreResult<(String, String)> {
    fn walk(idx: Idx, q: &Query, table: &mut Option<String>) -> StoreResult<String> {
        match q {
            Query::Text { field, text } => {
                let f = field_of(idx, field)?;
                if f.ty != FieldType::Text {
                    return Err(invalid(format!("text query on non-text field {field:?}")));
                }
                let st = side_table(idx, f);
                if table.get_or_insert_with(|| st.clone()) != &st {
                    return Err(invalid("score query spans several text fields"));
                }
                Ok(fts_phrase(text))
            }
            Query::Bool {
                must,
                must_not,
                should,
            } if must_not.is_empty() && (must.is_empty() || should.is_empty()) => {
                let (list, op) = if must.is_empty() {
                    (should, " OR ")
                } else {
                    (must, " AND ")
                };
                let parts = list
                    .iter()
                    .map(|q| walk(idx, q, table))
                    .collect::<StoreResult<Vec<_>>>()?;
                if parts.is_empty() {
                    return Err(invalid("empty score query"));
                }
                Ok(format!("({})", parts.join(op)))
            }
            _ => Err(invalid(format!(
                "score queries are text queries (alone or in bool must/should), not {q:?}"
            ))),
        }
    }
    let mut table = None;
    let expr = walk(idx, q, &mut table)?;
    Ok((table.expect("a text query"), expr))
}
