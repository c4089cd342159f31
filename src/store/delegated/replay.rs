//! Replaying what a delegated mount that died had acknowledged and not
//! sent: its op log, found by the next delegated mount of the same
//! filesystem on the same machine (the logs live in a directory per
//! filesystem id) once the dead mount's session has lapsed.
//!
//! The last state of each document is sent, conditional on the version
//! the log says the cluster held. A conflict is checked, not trusted: the
//! document may already hold that state (the flush landed before the
//! crash), or one of the mount's earlier states (an earlier flush landed:
//! the last state is sent again on the version found); anything else is
//! another mount's change after the delegation was broken, which stands,
//! and the replay says so.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::oplog::{self, Base, Record};
use crate::store::{BulkOp, Idx, MetaStore, StoreError, StoreResult};

/// Replay and remove the op log `owner`, a mount that is not alive, left
/// in `dir`.
pub(crate) fn replay_left(raw: &dyn MetaStore, dir: &Path, owner: &str) -> StoreResult<()> {
    let records = oplog::read(dir, owner)
        .map_err(|e| StoreError::Other(format!("op log of {owner} in {}: {e}", dir.display())))?;
    let (sent, skipped) = replay(raw, &records)?;
    log::warn!(
        "delegation: replayed {sent} change(s) mount {owner} had acknowledged before it died"
    );
    for id in &skipped {
        log::error!(
            "delegation: {id} was changed by another mount after {owner} died; \
             that change stands, {owner}'s is dropped"
        );
    }
    for (_, path) in oplog::generations(dir, owner) {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

type Key = (Idx, String);

/// Send the last state of each document `records` name. Returns how many
/// were sent and the ids skipped (changed by someone else).
pub(crate) fn replay(raw: &dyn MetaStore, records: &[Record]) -> StoreResult<(usize, Vec<String>)> {
    let records = folded(records);
    let mut order: Vec<Key> = Vec::new();
    // Per document: its last state, and the latest word on what the
    // cluster holds (a change's base, or a later flush's acknowledgement).
    let mut last: HashMap<Key, (&Record, Base)> = HashMap::new();
    let mut states: HashMap<Key, Vec<&Record>> = HashMap::new();
    for r in &records {
        let key = (r.index, r.id.clone());
        if r.sent {
            if let Some(l) = last.get_mut(&key) {
                l.1 = r.base;
            }
            continue;
        }
        if last.insert(key.clone(), (r, r.base)).is_none() {
            order.push(key.clone());
        }
        states.entry(key).or_default().push(r);
    }
    let (keys, ops): (Vec<&Key>, Vec<BulkOp>) = order
        .iter()
        .filter_map(|k| {
            let (r, base) = last[k];
            write_of(k, r, base).map(|op| (k, op))
        })
        .unzip();
    let sent = ops.len();
    let results = if ops.is_empty() {
        Vec::new()
    } else {
        raw.bulk(ops)?
    };
    let mut skipped = Vec::new();
    for (key, r) in keys.into_iter().zip(results) {
        if r.is_ok() {
            continue;
        }
        let want = last[key].0;
        let cur = raw.get(key.0, &key.1)?;
        let now = cur.as_ref().map(|d| &*d.source);
        if holds(now, want) || (want.state.is_none() && matches!(r, Err(StoreError::NotFound(_)))) {
            continue; // landed before the crash
        }
        let ours = states[key].iter().any(|s| holds(now, s));
        let again = cur.as_ref().map_or(Base::Absent, |d| Base::At(d.version));
        let resent = ours
            && write_of(key, want, again)
                .map(|op| raw.bulk(vec![op]))
                .transpose()?
                .is_none_or(|r| r.iter().all(|r| r.is_ok()));
        if !resent {
            skipped.push(format!("{}/{}", key.0.name(), key.1));
        }
    }
    Ok((sent, skipped))
}

/// The write that makes the cluster hold `r`'s state where it holds
/// `base`: a patch is a partial update (none over an absent document: the
/// state it patched was never logged, so there is nothing to send).
fn write_of(key: &Key, r: &Record, base: Base) -> Option<BulkOp> {
    if !r.patch {
        return oplog::write_op(key.0, &key.1, r.state.as_ref(), base, r.brief);
    }
    let if_version = match base {
        Base::At(v) => Some(v),
        Base::Unknown => None,
        Base::Absent => return None,
    };
    Some(BulkOp::Update {
        index: key.0,
        id: key.1.clone(),
        doc: r.state.clone()?,
        if_version,
    })
}

/// `records` with each patch ([`Record::patch`]) applied to the state
/// logged before it for its document, so it replays as that whole state;
/// a patch with no state before it (that one was flushed, its generation
/// gone) stays a patch, sent as a partial update at its base.
fn folded(records: &[Record]) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::with_capacity(records.len());
    let mut at: HashMap<Key, usize> = HashMap::new();
    for r in records {
        let key = (r.index, r.id.clone());
        let before = at.get(&key).map(|&i| &out[i]);
        let r = match (r.patch, before, &r.state) {
            (true, Some(b), Some(Value::Object(fields))) if b.state.is_some() => {
                let mut state = b.state.clone();
                if let Some(Value::Object(s)) = state.as_mut() {
                    s.extend(fields.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                Record {
                    state,
                    brief: b.brief,
                    patch: b.patch,
                    ..r.clone()
                }
            }
            _ => r.clone(),
        };
        if !r.sent {
            at.insert(key, out.len());
        }
        out.push(r);
    }
    out
}

/// Whether the cluster's source `now` is the state `r` logged: equal, or
/// for a brief state (its text left to the cluster) equal in every field
/// but the text, or for a patch equal in the patch's fields.
fn holds(now: Option<&Value>, r: &Record) -> bool {
    match (now, &r.state) {
        (Some(Value::Object(now)), Some(Value::Object(want))) if r.patch => {
            want.iter().all(|(k, v)| now.get(k) == Some(v))
        }
        (Some(Value::Object(now)), Some(Value::Object(want))) if r.brief => {
            let text: Vec<&str> = r.index.text_fields().collect();
            now.iter()
                .filter(|(k, _)| !text.contains(&k.as_str()))
                .count()
                == want.len()
                && want.iter().all(|(k, v)| now.get(k) == Some(v))
        }
        (now, want) => now == want.as_ref(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use serde_json::json;

    fn rec(id: &str, state: Option<Value>, base: Base) -> Record {
        Record::change(Idx::Entries, id, state, base)
    }

    /// The entry `id`'s source in `store` (None: absent).
    fn source(store: &EmbeddedStore, id: &str) -> Option<Value> {
        store
            .get(Idx::Entries, id)
            .unwrap()
            .map(|d| Value::clone(&d.source))
    }

    #[test]
    fn a_replay_sends_last_states_and_keeps_what_another_mount_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        store
            .create(Idx::Entries, "1/landed", &json!({"v": 2}))
            .unwrap();
        let v1 = store
            .create(Idx::Entries, "1/earlier", &json!({"v": 1}))
            .unwrap();
        // Our flush of {"v": 2} landed before the crash (the ack was lost):
        // the document is at a later version than the log's base.
        store
            .put(Idx::Entries, "1/earlier", &json!({"v": 2}), Some(v1))
            .unwrap();
        let theirs = store
            .create(Idx::Entries, "1/theirs", &json!({"v": 1}))
            .unwrap();
        store
            .put(
                Idx::Entries,
                "1/theirs",
                &json!({"other": true}),
                Some(theirs),
            )
            .unwrap();
        let records = vec![
            rec("1/new", Some(json!({"v": 1})), Base::Absent),
            rec("1/new", Some(json!({"v": 3})), Base::Absent),
            rec("1/landed", Some(json!({"v": 2})), Base::Absent),
            rec("1/earlier", Some(json!({"v": 2})), Base::At(v1)),
            rec("1/earlier", Some(json!({"v": 3})), Base::At(v1)),
            rec("1/theirs", Some(json!({"v": 5})), Base::At(theirs)),
            rec("1/gone", Some(json!({})), Base::Absent),
            rec("1/gone", None, Base::Absent),
        ];
        let (sent, skipped) = replay(&store, &records).unwrap();
        assert_eq!(sent, 4, "one write per document that has one to make");
        let get = |id: &str| source(&store, id);
        assert_eq!(get("1/new"), Some(json!({"v": 3})), "the last state");
        assert_eq!(get("1/landed"), Some(json!({"v": 2})), "already there");
        assert_eq!(
            get("1/earlier"),
            Some(json!({"v": 3})),
            "sent again on the version found"
        );
        assert_eq!(
            get("1/theirs"),
            Some(json!({"other": true})),
            "another's change stands"
        );
        assert_eq!(skipped, vec!["entries/1/theirs".to_string()]);
        assert_eq!(get("1/gone"), None);
    }

    #[test]
    fn a_brief_state_is_replayed_as_a_partial_update_that_keeps_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let text = json!({"ino": 1, "mtime_ns": 1, "contents": "the text"});
        let v = store.create(Idx::Texts, "1", &text).unwrap();
        let landed = store.create(Idx::Texts, "2", &text).unwrap();
        store
            .bulk(vec![BulkOp::Update {
                index: Idx::Texts,
                id: "2".into(),
                doc: json!({"mtime_ns": 3}),
                if_version: Some(landed),
            }])
            .unwrap();
        let brief = |id: &str, state: Value, base: crate::store::Version| {
            Record::change(Idx::Texts, id, Some(state), Base::At(base)).brief(true)
        };
        let records = vec![
            brief("1", json!({"ino": 1, "mtime_ns": 2}), v),
            brief("2", json!({"ino": 1, "mtime_ns": 3}), landed),
        ];
        let (sent, skipped) = replay(&store, &records).unwrap();
        assert_eq!(sent, 2);
        assert!(skipped.is_empty(), "2 landed before the crash: {skipped:?}");
        let get = |id: &str| {
            store
                .get(Idx::Texts, id)
                .unwrap()
                .map(|d| Value::clone(&d.source))
        };
        assert_eq!(
            get("1"),
            Some(json!({"ino": 1, "mtime_ns": 2, "contents": "the text"}))
        );
        assert_eq!(
            get("2"),
            Some(json!({"ino": 1, "mtime_ns": 3, "contents": "the text"}))
        );
    }

    #[test]
    fn a_renames_path_patch_folds_into_the_state_before_it_or_updates_the_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let patch = |id: &str, path: &str, dir: &str, base: Base| Record {
            patch: true,
            ..rec(id, Some(json!({"path": path, "dir": dir})), base)
        };
        // Flushed before the rename: the cluster holds it, the log only
        // the patch.
        let flushed = json!({"path": "/d/f", "dir": "/d", "size": 7, "mode": 420});
        let v = store.create(Idx::Entries, "2/f", &flushed).unwrap();
        // The patch landed before the crash (the ack was lost).
        store
            .create(Idx::Entries, "2/l", &json!({"path": "/e/l", "dir": "/e"}))
            .unwrap();
        // Another mount renamed it again after the delegation was broken.
        let t = store
            .create(Idx::Entries, "2/t", &json!({"path": "/d/t", "dir": "/d"}))
            .unwrap();
        store
            .put(
                Idx::Entries,
                "2/t",
                &json!({"path": "/x/t", "dir": "/x"}),
                Some(t),
            )
            .unwrap();
        let records = vec![
            // Made under the delegation, then moved twice: one whole state.
            rec(
                "2/n",
                Some(json!({"path": "/d/n", "dir": "/d", "size": 1})),
                Base::Absent,
            ),
            patch("2/n", "/e/n", "/e", Base::Absent),
            patch("2/n", "/g/n", "/g", Base::Absent),
            patch("2/f", "/e/f", "/e", Base::At(v)),
            patch("2/l", "/e/l", "/e", Base::At(t)),
            patch("2/t", "/e/t", "/e", Base::At(t)),
        ];
        let (sent, skipped) = replay(&store, &records).unwrap();
        assert_eq!(sent, 4);
        let get = |id: &str| source(&store, id);
        assert_eq!(
            get("2/n"),
            Some(json!({"path": "/g/n", "dir": "/g", "size": 1})),
            "created whole at its last path"
        );
        assert_eq!(
            get("2/f"),
            Some(json!({"path": "/e/f", "dir": "/e", "size": 7, "mode": 420})),
            "a partial update: the rest as the cluster held it"
        );
        assert_eq!(get("2/l"), Some(json!({"path": "/e/l", "dir": "/e"})));
        assert_eq!(
            get("2/t"),
            Some(json!({"path": "/x/t", "dir": "/x"})),
            "another's change stands"
        );
        assert_eq!(skipped, vec!["entries/2/t".to_string()]);
    }
}
