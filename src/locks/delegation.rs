//! The tree's delegation, taken and recalled through the lock session: a lock
//! document, `deleg/root` in the `locks`
//! index: `{type: "delegation", owner, since, recall}`.
//!
//! - **Taken** ([`take`]) by a mount started with `--delegate`: a create of
//!   the document, then a search for other live sessions. A mount that
//!   registered its session before the create shows up in that search (the
//!   create made the index dirty, so the search refreshes first); one that
//!   registers after finds the document at its start ([`recall_others`]).
//!   Either way they never both go on.
//! - **Recalled** ([`recall_others`]) by every other mount and lock-taking
//!   command at its start: it sets `recall` and waits until the document is
//!   gone. The holder looks every 400 ms while busy, every 2 s when idle
//!   ((`recalled`)), flushes everything and deletes it ((`give_back`)).
//! - **Taken again** ([`keep_taking`]) by a mount that gave it back (or
//!   found another mount at its start) once it is alone again.
//! - A holder that died is handled as its locks are: once its session has
//!   lapsed (lease and grace), or at once if its process is gone from this
//!   machine, the waiting mount deletes the document; what
//!   the dead mount had not sent is in its op log, replayed by the next
//!   delegated mount on its machine (`crate::store::delegated::replay`).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use serde_json::json;

use super::LockManager;
use super::manager::{now_ms, session_live};
use crate::store::delegated::DelegatedStore;
use crate::store::delegated::document::{DOC, give_back};
use crate::store::{Doc, Idx, MetaStore, Query, SearchRequest, StoreError, StoreResult};

/// How long a starting mount waits for a live holder to give it back.
const RECALL_WAIT: Duration = Duration::from_secs(60);

/// How often a mount without the delegation looks whether it is alone
/// again ([`keep_taking`]): beside another mount, one search each time.
const RETAKE_EVERY: Duration = Duration::from_secs(5);

/// Take the tree's delegation for `lm`'s session if no other mount is
/// live; first replay what dead delegated mounts of this filesystem left in
/// their op logs here. Returns how many op logs were replayed: their
/// renames' intents are then for the caller to roll forward before it
/// serves (a rename decided in memory logs its end only with its paths;
/// a mount killed in between left its intent and tree locks, which a
/// lookup of either name would otherwise break before any roll-forward).
pub(crate) fn take(d: &DelegatedStore, lm: &LockManager) -> StoreResult<usize> {
    let raw = d.raw();
    let mut replayed = 0;
    for owner in d.logs_left() {
        if owner != lm.owner() && !lm.alive(&owner)? {
            d.replay_left(&owner)?;
            give_back(raw, &owner)?;
            replayed += 1;
        }
    }
    grab(d, lm, log::Level::Info)?;
    Ok(replayed)
}

/// While the mount lives without the tree's delegation (another mount was
/// live at its start, or recalled it since), look every [`RETAKE_EVERY`]
/// whether it is alone again, and take it then: a second mount or an
/// `esfs fsck` costs it the delegation only while they run.
pub(crate) fn keep_taking(d: Arc<DelegatedStore>, lm: Weak<LockManager>) {
    let spawned = std::thread::Builder::new()
        .name("esfs-retake".into())
        .spawn(move || {
            loop {
                std::thread::sleep(RETAKE_EVERY);
                let Some(lm) = lm.upgrade() else { return };
                if d.closing() {
                    return;
                }
                if !d.held()
                    && let Err(e) = retake(&d, &lm)
                {
                    log::warn!("delegation: taking it again: {e}");
                }
            }
        });
    if let Err(e) = spawned {
        log::warn!("delegation: not taken again once alone (no thread: {e})");
    }
}

/// Take the delegation again if no other mount is live. Writers wait
/// meanwhile (three requests): none may slip between reading the lock
/// documents and deciding from memory.
fn retake(d: &DelegatedStore, lm: &LockManager) -> StoreResult<()> {
    // A look first, without a refresh (the heartbeat's writes would ask
    // for one each round): beside a live mount a round costs one search;
    // `grab` looks again, soundly, after its create.
    if other_live_session(d.raw(), lm, false)?.is_some() {
        return Ok(());
    }
    let _quiet = d.quiesce();
    if d.held() || d.closing() {
        return Ok(());
    }
    if grab(d, lm, log::Level::Debug)? {
        log::info!("delegation: this mount is alone again and holds the tree once more");
    }
    Ok(())
}

/// Create the delegation document and hold it, unless another mount
/// holds it or is live (said at `level`).
fn grab(d: &DelegatedStore, lm: &LockManager, level: log::Level) -> StoreResult<bool> {
    let (raw, owner) = (d.raw(), lm.owner());
    let doc = json!({"type": "delegation", "owner": owner, "since": now_ms(), "recall": null});
    match raw.create(Idx::Locks, DOC, &doc) {
        Ok(_) => {}
        Err(StoreError::Conflict(_)) => {
            log::log!(
                level,
                "delegation: another mount holds the tree; this one sends every change"
            );
            return Ok(false);
        }
        Err(e) => return Err(e),
    }
    match hold(d, lm, level) {
        Ok(true) => Ok(true),
        // Someone else is live, or holding failed: the document goes back.
        r => {
            give_back(raw, owner)?;
            r
        }
    }
}

/// After the create of the delegation document: hold it, unless another
/// mount is live.
fn hold(d: &DelegatedStore, lm: &LockManager, level: log::Level) -> StoreResult<bool> {
    let (raw, owner) = (d.raw(), lm.owner());
    if let Some(other) = other_live_session(raw, lm, true)? {
        log::log!(
            level,
            "delegation: mount {other} is live; this one sends every change"
        );
        return Ok(false);
    }
    // From now on only this mount writes lock documents: the ones there are
    // (another's session aside) are all it will ever find.
    let locks = LockManager::list(raw)?
        .into_iter()
        .filter(|(id, _, _)| id != DOC && !id.starts_with("session/"))
        .map(|(id, version, source)| Doc {
            id,
            version,
            source: source.into(),
        })
        .collect();
    d.begin_holding(owner, locks)?;
    log::info!("delegation: this mount holds the tree (changes sent every 200 ms)");
    Ok(true)
}

/// Another session than `lm`'s that is alive; `current`: as of this
/// mount's last write to the locks index (a refresh first if needed: what
/// makes taking the delegation sound), else as the index last refreshed.
fn other_live_session(
    store: &dyn MetaStore,
    lm: &LockManager,
    current: bool,
) -> StoreResult<Option<String>> {
    let hits = store.search(&SearchRequest {
        index: Idx::Locks,
        query: Query::term("type", "session"),
        sort: vec![],
        search_after: None,
        size: 1000,
        past_own_writes: !current,
    })?;
    Ok(hits.into_iter().find_map(|h| {
        let owner = h.doc.source["owner"].as_str()?.to_string();
        (owner != lm.owner() && session_live(&h.doc.source)).then_some(owner)
    }))
}

/// At the start of any mount or command with a lock session: if another
/// mount holds the tree's delegation, recall it and wait until it is given
/// back (its changes are then in the cluster); a dead holder's is broken.
pub(crate) fn recall_others(store: &dyn MetaStore, lm: &LockManager) -> StoreResult<()> {
    let deadline = Instant::now() + RECALL_WAIT;
    let mut asked = false;
    loop {
        let Some(d) = store.get(Idx::Locks, DOC)? else {
            return Ok(());
        };
        let holder = d.source["owner"].as_str().unwrap_or("").to_string();
        if holder == lm.owner() {
            return Ok(());
        }
        if !lm.alive(&holder)? {
            log::warn!(
                "delegation: breaking the tree's delegation of mount {holder}, which died; \
                 what it had not sent waits in its op log on its machine"
            );
            let _ = store.delete(Idx::Locks, DOC, Some(d.version));
            continue;
        }
        if d.source["recall"].is_null() {
            let mut s = serde_json::Value::clone(&d.source);
            s["recall"] = json!({"by": lm.owner(), "at": now_ms()});
            let _ = store.put(Idx::Locks, DOC, &s, Some(d.version));
        }
        if !asked {
            log::info!("delegation: mount {holder} holds the tree; recalling it");
            asked = true;
        }
        if Instant::now() > deadline {
            return Err(StoreError::Unavailable(format!(
                "mount {holder} holds the tree's delegation and did not give it back within {}s",
                RECALL_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
