//! Index administration: create, get, head and delete indices, mappings, settings and refresh.

use serde_json::{Map, Value, json};

use crate::Shared;
use crate::error::{EsError, EsResult};
use crate::settings;
use crate::store::{Index, validate_index_name};

use super::{Outcome, Req, Resp, check_params, flag, parse_body, require_body};

pub(super) fn create_index(sh: &Shared, req: &Req, name: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &["wait_for_active_shards", "timeout", "master_timeout"],
    )?;
    validate_index_name(name)?;
    let body = parse_body(req)?.unwrap_or_else(|| json!({}));
    let obj = body
        .as_object()
        .ok_or_else(|| EsError::new(400, "parse_exception", "Failed to parse content to map"))?;
    let mut settings_v = None;
    let mut mappings = None;
    for (k, v) in obj {
        match k.as_str() {
            "settings" => settings_v = Some(v),
            "mappings" => mappings = Some(v),
            "aliases" => {
                if v.as_object().is_some_and(|a| !a.is_empty()) {
                    return Err(EsError::unsupported("aliases"));
                }
            }
            other => {
                return Err(EsError::new(
                    400,
                    "parse_exception",
                    format!("unknown key [{other}] for create index"),
                ));
            }
        }
    }
    let flat = match settings_v {
        Some(s) => settings::flatten(s)?,
        None => settings::Flat::new(),
    };
    let mut st = sh.state.lock();
    if let Some(ix) = st.indices.get(name) {
        return Err(EsError::new(
            400,
            "resource_already_exists_exception",
            format!("index [{name}/{}] already exists", ix.uuid),
        )
        .with("index_uuid", ix.uuid.clone())
        .with("index", name));
    }
    let ix = Index::new(name, flat, mappings)?;
    st.indices.insert(name.to_string(), ix);
    Ok(Resp::ok(json!({"acknowledged": true, "shards_acknowledged": true, "index": name})).into())
}

pub(super) fn get_index(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "include_defaults",
            "flat_settings",
            "local",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "master_timeout",
            "features",
        ],
    )?;
    let st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    let mut out = Map::new();
    for n in names {
        let ix = &st.indices[&n];
        out.insert(n.clone(), json!({"aliases": {}, "mappings": ix.mapping.to_json(), "settings": settings_out(ix, req)}));
    }
    Ok(Resp::ok(Value::Object(out)).into())
}

fn settings_out(ix: &Index, req: &Req) -> Value {
    if flag(req, "flat_settings") {
        Value::Object(
            ix.settings
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    } else {
        ix.settings_json()
    }
}

pub(super) fn head_index(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "include_defaults",
            "flat_settings",
            "local",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "master_timeout",
        ],
    )?;
    let st = sh.state.lock();
    let ok = match st.resolve(expr, false, false) {
        Ok(v) => !v.is_empty(),
        Err(_) => false,
    };
    Ok(Resp::empty(if ok { 200 } else { 404 }).into())
}

pub(super) fn delete_index(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "timeout",
            "master_timeout",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
        ],
    )?;
    if expr == "_all" || expr.contains('*') {
        return Err(EsError::bad_request(
            "Wildcard expressions or all indices are not allowed",
        ));
    }
    let mut st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    for n in names {
        if let Some(ix) = st.indices.remove(&n) {
            let uuid = ix.uuid.clone();
            st.pits
                .retain(|_, p| !p.indices.iter().any(|pi| pi.uuid == uuid));
        }
    }
    Ok(Resp::ok(json!({"acknowledged": true})).into())
}

pub(super) fn get_mapping(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "local",
            "master_timeout",
        ],
    )?;
    let st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    let mut out = Map::new();
    for n in names {
        out.insert(
            n.clone(),
            json!({"mappings": st.indices[&n].mapping.to_json()}),
        );
    }
    Ok(Resp::ok(Value::Object(out)).into())
}

pub(super) fn put_mapping(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "timeout",
            "master_timeout",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "write_index_only",
        ],
    )?;
    let body = require_body(req)?;
    let mut st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    for n in &names {
        st.index_mut(n)?.put_mapping(&body)?;
    }
    Ok(Resp::ok(json!({"acknowledged": true})).into())
}

pub(super) fn get_settings(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "flat_settings",
            "include_defaults",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "local",
            "master_timeout",
        ],
    )?;
    let st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    let mut out = Map::new();
    for n in names {
        out.insert(
            n.clone(),
            json!({"settings": settings_out(&st.indices[&n], req)}),
        );
    }
    Ok(Resp::ok(Value::Object(out)).into())
}

pub(super) fn put_settings(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &[
            "timeout",
            "master_timeout",
            "preserve_existing",
            "flat_settings",
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "reopen",
        ],
    )?;
    let mut body = require_body(req)?;
    if let Some(inner) = body.get("settings").cloned()
        && body.as_object().is_some_and(|o| o.len() == 1)
    {
        body = inner;
    }
    let flat = settings::flatten(&body)?;
    let mut st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    for n in &names {
        st.index_mut(n)?.update_settings(flat.clone())?;
    }
    Ok(Resp::ok(json!({"acknowledged": true})).into())
}

pub(super) fn refresh(sh: &Shared, req: &Req, expr: &str) -> EsResult<Outcome> {
    check_params(
        req,
        &["ignore_unavailable", "allow_no_indices", "expand_wildcards"],
    )?;
    let mut st = sh.state.lock();
    let names = st.resolve(expr, flag(req, "ignore_unavailable"), true)?;
    let (mut total, mut ok) = (0, 0);
    for n in names {
        let ix = st.index_mut(&n)?;
        ix.refresh();
        total += ix.shards * (1 + ix.replicas);
        ok += ix.shards;
    }
    Ok(Resp::ok(json!({"_shards": {"total": total, "successful": ok, "failed": 0}})).into())
}
