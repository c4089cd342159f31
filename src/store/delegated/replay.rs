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
    let mut order: Vec<Key> = Vec::new();
    // Per document: its last state, and the latest word on what the
    // cluster holds (a change's base, or a later flush's acknowledgement).
    let mut last: HashMap<Key, (&Record, Base)> = HashMap::new();
    let mut states: HashMap<Key, Vec<&Record>> = HashMap::new();
    for r in records {
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
            oplog::write_op(k.0, &k.1, r.state.as_ref(), base, r.brief).map(|op| (k, op))
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
            && oplog::write_op(key.0, &key.1, want.state.as_ref(), again, want.brief)
                .map(|op| raw.bulk(vec![op]))
                .transpose()?
                .is_none_or(|r| r.iter().all(|r| r.is_ok()));
        if !resent {
            skipped.push(format!("{}/{}", key.0.name(), key.1));
        }
    }
    Ok((sent, skipped))
}

/// Whether the cluster's source `now` is the state `r` logged: equal, or
/// for a brief state (its text left to the cluster) equal in every field
/// but the text.
fn holds(now: Option<&Value>, r: &Record) -> bool {
    match (now, &r.state) {
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
        let get = |id: &str| {
            store
                .get(Idx::Entries, id)
                .unwrap()
                .map(|d| Value::clone(&d.source))
        };
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
        let text = json!({"path": "/a", "contents": "the text"});
        let v = store.create(Idx::Entries, "1/a", &text).unwrap();
        let landed = store.create(Idx::Entries, "1/b", &text).unwrap();
        store
            .bulk(vec![BulkOp::Update {
                index: Idx::Entries,
                id: "1/b".into(),
                doc: json!({"path": "/c"}),
                if_version: Some(landed),
            }])
            .unwrap();
        let records = vec![
            rec("1/a", Some(json!({"path": "/z"})), Base::At(v)).brief(true),
            rec("1/b", Some(json!({"path": "/c"})), Base::At(landed)).brief(true),
        ];
        let (sent, skipped) = replay(&store, &records).unwrap();
        assert_eq!(sent, 2);
        assert!(
            skipped.is_empty(),
            "1/b landed before the crash: {skipped:?}"
        );
        let get = |id: &str| {
            store
                .get(Idx::Entries, id)
                .unwrap()
                .map(|d| Value::clone(&d.source))
        };
        assert_eq!(
            get("1/a"),
            Some(json!({"path": "/z", "contents": "the text"}))
        );
        assert_eq!(
            get("1/b"),
            Some(json!({"path": "/c", "contents": "the text"}))
        );
    }
}
