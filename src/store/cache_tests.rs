//! The shared mode of the document cache: two handles on one store stand
//! for two mounts (one cached, one writing behind its back).

use super::*;
use crate::store::embedded::EmbeddedStore;
use serde_json::json;

fn two_mounts(ttl: Duration) -> (tempfile::TempDir, CachedStore, EmbeddedStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let ours = Arc::new(EmbeddedStore::open(&path).unwrap());
    let theirs = EmbeddedStore::open(&path).unwrap();
    (
        dir,
        CachedStore::shared(ours, 1 << 20, 1 << 20, ttl),
        theirs,
    )
}

fn n(store: &dyn MetaStore) -> Option<u64> {
    store
        .get(Idx::Inodes, "1")
        .unwrap()
        .map(|d| d.source["n"].as_u64().unwrap())
}

#[test]
fn another_mounts_change_is_seen_within_the_ttl() {
    let (_d, a, b) = two_mounts(Duration::from_millis(300));
    b.create(Idx::Inodes, "1", &json!({"n": 1})).unwrap();
    assert_eq!(n(&a), Some(1));
    b.put(Idx::Inodes, "1", &json!({"n": 2}), None).unwrap();
    assert_eq!(n(&a), Some(1), "trusted for the ttl");
    let fresh = a.get_fresh(Idx::Inodes, "1").unwrap().unwrap();
    assert_eq!(fresh.source["n"], 2, "get_fresh reads the store");
    assert_eq!(n(&a), Some(2), "and refills the cache");
    b.put(Idx::Inodes, "1", &json!({"n": 3}), None).unwrap();
    std::thread::sleep(Duration::from_millis(350));
    assert_eq!(n(&a), Some(3), "read again once the ttl is over");
}

#[test]
fn a_write_from_a_stale_version_conflicts_and_evicts() {
    let (_d, a, b) = two_mounts(Duration::from_secs(60));
    b.create(Idx::Inodes, "1", &json!({"n": 1})).unwrap();
    let seen = a.get(Idx::Inodes, "1").unwrap().unwrap();
    b.put(Idx::Inodes, "1", &json!({"n": 2}), None).unwrap();
    let r = a.put(Idx::Inodes, "1", &json!({"n": 9}), Some(seen.version));
    assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    assert_eq!(n(&a), Some(2), "the conflict evicted the stale copy");
    // An absent name another mount created: the put-if-absent conflicts.
    assert!(a.get(Idx::Entries, "1:x").unwrap().is_none());
    b.create(Idx::Entries, "1:x", &json!({"ino": 5})).unwrap();
    assert!(
        a.get(Idx::Entries, "1:x").unwrap().is_none(),
        "cached absent"
    );
    let r = a.create(Idx::Entries, "1:x", &json!({"ino": 6}));
    assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    assert_eq!(
        a.get(Idx::Entries, "1:x").unwrap().unwrap().source["ino"],
        5
    );
    // Another mount's delete: the conditional write says so and evicts.
    let seen = a.get(Idx::Entries, "1:x").unwrap().unwrap();
    b.delete(Idx::Entries, "1:x", None).unwrap();
    let r = a.put(Idx::Entries, "1:x", &json!({"ino": 7}), Some(seen.version));
    assert!(r.is_err());
    assert!(a.get(Idx::Entries, "1:x").unwrap().is_none());
}

/// Writers and readers racing in one process: whatever order their
/// answers arrive in, the cache never goes back before a finished write,
/// and ends with the store's last word.
#[test]
fn racing_writes_and_fills_leave_the_newest_version() {
    let (_d, a, _b) = two_mounts(Duration::from_secs(60));
    a.create(Idx::Inodes, "1", &json!({"n": 0})).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    a.get_fresh(Idx::Inodes, "1").unwrap();
                }
            });
        }
        let writers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    for _ in 0..200 {
                        loop {
                            let d = a.get(Idx::Inodes, "1").unwrap().unwrap();
                            let next = json!({"n": d.source["n"].as_u64().unwrap() + 1});
                            match a.put(Idx::Inodes, "1", &next, Some(d.version)) {
                                Ok(_) => {
                                    // Never older than a write that is done.
                                    let cached = n(&a).unwrap();
                                    assert!(cached >= next["n"].as_u64().unwrap(), "{cached}");
                                    break;
                                }
                                Err(StoreError::Conflict(_)) => continue,
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    assert_eq!(n(&*a.inner), Some(800), "no increment lost");
    assert_eq!(n(&a), Some(800), "the cache holds the last write");
    a.delete(Idx::Inodes, "1", None).unwrap();
    assert_eq!(n(&a), None);
}
