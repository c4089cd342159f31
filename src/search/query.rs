//! The store queries of a search: the scope (the PATH subtrees and the
//! metadata filters) and the candidates within it.

use super::glob;
use super::pattern::Req;
use crate::model::{INDEXED_TEXT, Kind, encode_bytes};
use crate::store::Query;
use serde_json::{Value, json};

/// `--size`: `+N` more than N bytes, `-N` fewer, `N` exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SizeCmp {
    Above(u64),
    Below(u64),
    Exactly(u64),
}

impl SizeCmp {
    /// `[+-]N[c|k|K|M|G|T]` (c = bytes, the default; the others powers of 1024).
    pub(crate) fn parse(s: &str) -> Result<SizeCmp, String> {
        let (sign, rest) = match s.as_bytes().first() {
            Some(b'+') => (1, &s[1..]),
            Some(b'-') => (-1, &s[1..]),
            _ => (0, s),
        };
        let (num, mult) = match rest.char_indices().last() {
            Some((i, c)) if c.is_ascii_alphabetic() => {
                let m: u64 = match c {
                    'c' => 1,
                    'k' | 'K' => 1 << 10,
                    'M' => 1 << 20,
                    'G' => 1 << 30,
                    'T' => 1 << 40,
                    _ => return Err(format!("bad --size unit in {s:?} (c, k, M, G, T)")),
                };
                (&rest[..i], m)
            }
            _ => (rest, 1),
        };
        let n: u64 = num
            .parse()
            .map_err(|_| format!("bad --size {s:?}: expected [+-]N[ckMGT]"))?;
        let n = n
            .checked_mul(mult)
            .ok_or_else(|| format!("--size {s:?} is too large"))?;
        Ok(match sign {
            1 => SizeCmp::Above(n),
            -1 => SizeCmp::Below(n),
            _ => SizeCmp::Exactly(n),
        })
    }
}

/// The metadata filters of a search.
#[derive(Clone, Debug, Default)]
pub(crate) struct Filters {
    /// Entry kind; `None` = any (only with --find).
    pub kind: Option<Kind>,
    pub name: Option<Vec<u8>>,
    pub size: Option<SizeCmp>,
    /// mtime strictly after this (ns since the epoch).
    pub newer_ns: Option<i64>,
    /// `name` or `name=value` keywords of `Entry::xattrs`, all required.
    pub xattrs: Vec<String>,
}

/// Everything in the subtree `tree` (an encoded in-filesystem path) that
/// passes the filters the store can check (the rest: see [`post_filter`]).
pub(crate) fn scope(tree: &str, f: &Filters) -> Query {
    let mut must = Vec::new();
    if tree != "/" {
        must.push(Query::tree("path", tree));
    }
    if let Some(k) = f.kind {
        must.push(Query::term("kind", k.as_str()));
    }
    if let Some(pat) = &f.name {
        if glob::is_literal(pat) {
            must.push(Query::term("name", encode_bytes(pat)));
        } else {
            let prefix = glob::literal_prefix(pat);
            if !prefix.is_empty()
                && let Ok(p) = String::from_utf8(prefix)
            {
                must.push(Query::Prefix {
                    field: "name".into(),
                    value: p,
                });
            }
        }
    }
    if let Some(s) = f.size {
        let n = |v: u64| Some(json!(v));
        let (gt, lt) = match s {
            SizeCmp::Above(v) => (n(v), None),
            SizeCmp::Below(v) => (None, n(v)),
            SizeCmp::Exactly(v) => {
                must.push(Query::term("size", v));
                (None, None)
            }
        };
        if gt.is_some() || lt.is_some() {
            must.push(Query::Range {
                field: "size".into(),
                gte: None,
                gt,
                lte: None,
                lt,
            });
        }
    }
    if let Some(ns) = f.newer_ns {
        // Entries keep milliseconds: a superset, made exact by post_filter.
        must.push(Query::Range {
            field: "mtime".into(),
            gte: Some(json!(ns.div_euclid(1_000_000))),
            gt: None,
            lte: None,
            lt: None,
        });
    }
    for x in &f.xattrs {
        must.push(Query::term("xattrs", x.as_str()));
    }
    Query::and(must)
}

/// Whether an entry (its decoded name) passes the filters the store could
/// only approximate: the glob itself.
pub(crate) fn name_matches(f: &Filters, name: &[u8]) -> bool {
    f.name.as_ref().is_none_or(|p| glob::matches(p, name))
}

/// The text part of a search as a query of `texts` (None: no constraint).
pub(crate) fn text_query(r: &Req) -> Option<Query> {
    match r {
        Req::All => None,
        Req::Lit(s) => Some(Query::Text {
            field: "contents".into(),
            text: s.clone(),
        }),
        Req::And(v) => Some(Query::and(v.iter().filter_map(text_query).collect())),
        Req::Or(v) => {
            let parts: Vec<Query> = v.iter().map(text_query).collect::<Option<_>>()?;
            Some(Query::Bool {
                must: vec![],
                must_not: vec![],
                should: parts,
            })
        }
    }
}

/// Values per `terms` clause: Elasticsearch's default `index.max_terms_count`.
const MAX_TERMS: usize = 65_536;

/// The entries within `scope` of the inodes `inos`.
pub(crate) fn of_inos(scope: Query, inos: &[u64]) -> Query {
    Query::Bool {
        must: vec![scope],
        must_not: vec![],
        should: inos.chunks(MAX_TERMS).map(terms_of).collect(),
    }
}

/// `ino` is one of `inos`.
fn terms_of(inos: &[u64]) -> Query {
    Query::Terms {
        field: "ino".into(),
        values: inos.iter().map(|&i| Value::from(i)).collect(),
    }
}

/// The candidates within `scope` of a search whose text part `texts` found
/// in the inodes `matched` (None: no text part): those files, every file
/// whose text is not indexed (binary, too large, not indexed yet), and the
/// files open with unpersisted writes (`open`).
pub(crate) fn candidates(scope: Query, matched: Option<&[u64]>, open: &[u64]) -> Query {
    let Some(matched) = matched else {
        return scope;
    };
    let mut should = vec![Query::Bool {
        must: vec![],
        must_not: vec![Query::term("text_state", INDEXED_TEXT)],
        should: vec![],
    }];
    should.extend(matched.chunks(MAX_TERMS).map(terms_of));
    if !open.is_empty() {
        should.push(terms_of(open));
    }
    Query::Bool {
        must: vec![scope],
        must_not: vec![],
        should,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(SizeCmp::parse("+10k").unwrap(), SizeCmp::Above(10240));
        assert_eq!(SizeCmp::parse("-3").unwrap(), SizeCmp::Below(3));
        assert_eq!(SizeCmp::parse("7c").unwrap(), SizeCmp::Exactly(7));
        assert_eq!(SizeCmp::parse("1M").unwrap(), SizeCmp::Exactly(1 << 20));
        assert!(SizeCmp::parse("x").is_err());
        assert!(SizeCmp::parse("5q").is_err());
    }

    #[test]
    fn text_queries() {
        let l = |s: &str| Req::Lit(s.into());
        assert_eq!(text_query(&Req::All), None);
        let q = text_query(&Req::Or(vec![l("abc"), l("def")])).unwrap();
        assert!(matches!(q, Query::Bool { should, .. } if should.len() == 2));
    }
}
