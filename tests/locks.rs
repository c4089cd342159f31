//! The lock scenarios of Elasticsearch: The Definitive Guide, chapter
//! "Handling Relationships" ("Solving Concurrency Issues"), replayed against
//! the lock manager on every backend (the embedded store and the
//! Elasticsearch test double). Several managers with distinct owners stand for
//! several mounts.

use es_test_server::EsTestServer;
use esfs::locks::LockError;
use esfs::locks::manager::{LockManager, tree_id};
use esfs::store::embedded::EmbeddedStore;
use esfs::store::es::{EsConfig, EsStore};
use esfs::store::{Idx, MetaStore};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn paths(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

const README: &str = "/clinton/projects/elasticsearch/README.txt";

fn mgr(store: &Arc<dyn MetaStore>, owner: &str) -> Arc<LockManager> {
    let m = LockManager::new(store.clone(), owner, "test").unwrap();
    m.set_wait(Duration::from_millis(300));
    m
}

fn shared_count(store: &Arc<dyn MetaStore>, path: &str) -> Option<u64> {
    store
        .get(Idx::Locks, &tree_id(path))
        .unwrap()
        .map(|d| d.source["count"].as_u64().unwrap_or(0))
}

fn scenarios(store: Arc<dyn MetaStore>) {
    let (a, b, c) = (mgr(&store, "a"), mgr(&store, "b"), mgr(&store, "c"));

    // Global lock: create-if-absent; a second owner fails until released.
    a.lock_global().unwrap();
    assert!(matches!(b.lock_global(), Err(LockError::Held(_, o)) if o == "a"));
    a.unlock_global().unwrap();
    b.lock_global().unwrap();
    b.unlock_global().unwrap();

    // Document locks: the same owner re-locking is a no-op, another fails.
    a.lock_doc("1").unwrap();
    a.lock_doc("1").unwrap();
    assert!(matches!(b.lock_doc("1"), Err(LockError::Held(..))));
    a.unlock_doc("1").unwrap();
    b.lock_doc("1").unwrap();
    b.unlock_doc("1").unwrap();

    // Tree locks: renaming README.txt shares every ancestor and holds the
    // file exclusively.
    let dirs = paths(&[
        "/clinton",
        "/clinton/projects",
        "/clinton/projects/elasticsearch",
    ]);
    let ga = a.lock_tree(&dirs, &paths(&[README])).unwrap();
    assert_eq!(shared_count(&store, "/clinton"), Some(1));
    // A second renamer elsewhere under /clinton shares the ancestors: counts go up.
    let gb = b
        .lock_tree(&dirs[..2], &paths(&["/clinton/projects/other"]))
        .unwrap();
    assert_eq!(shared_count(&store, "/clinton"), Some(2));
    assert_eq!(
        shared_count(&store, "/clinton/projects/elasticsearch"),
        Some(1)
    );
    // The same file cannot be renamed twice at once.
    assert!(matches!(
        b.lock_tree(&dirs, &paths(&[README])),
        Err(LockError::Timeout(..))
    ));
    // Renaming /clinton itself needs it exclusively: fails while shared.
    assert!(matches!(
        c.lock_tree(&[], &paths(&["/clinton"])),
        Err(LockError::Timeout(..))
    ));
    // Release (longest path first); shared counts go down, and the lock
    // documents go away at zero.
    a.release(ga);
    a.release_idle(Duration::ZERO);
    // b's failed attempt left its unused shares cached: let them go too.
    b.release_idle(Duration::ZERO);
    assert_eq!(shared_count(&store, "/clinton"), Some(1));
    assert_eq!(
        shared_count(&store, "/clinton/projects/elasticsearch"),
        None
    );
    assert!(store.get(Idx::Locks, &tree_id(README)).unwrap().is_none());
    b.release(gb);
    b.release_idle(Duration::ZERO);
    assert_eq!(shared_count(&store, "/clinton"), None);
    // Now the rename of /clinton gets it, and excludes shared holders.
    let gc = c.lock_tree(&[], &paths(&["/clinton"])).unwrap();
    assert!(matches!(
        a.lock_tree(&dirs, &paths(&[README])),
        Err(LockError::Timeout(..))
    ));
    c.release(gc);
    let ga = a.lock_tree(&dirs, &paths(&[README])).unwrap();
    a.release(ga);
    a.release_idle(Duration::ZERO);

    // A waiting exclusive locker marks the lock pending: new shared lockers
    // back off (renames cannot starve), and it gets the lock once the
    // current holder lets go.
    let ga = a.lock_tree(&paths(&["/p"]), &[]).unwrap();
    c.set_wait(Duration::from_secs(10));
    let waiter = {
        let c = c.clone();
        std::thread::spawn(move || c.lock_tree(&[], &paths(&["/p"])).map(|g| c.release(g)))
    };
    let marked = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        store
            .get(Idx::Locks, &tree_id("/p"))
            .unwrap()
            .is_some_and(|d| d.source["pending"] == json!("c"))
    });
    assert!(
        marked,
        "the waiting exclusive locker marks the lock pending"
    );
    assert!(
        b.lock_tree(&paths(&["/p"]), &[]).is_err(),
        "a new sharer waits behind the pending exclusive"
    );
    a.release(ga);
    a.release_idle(Duration::ZERO);
    waiter
        .join()
        .unwrap()
        .expect("the exclusive locker gets /p once a lets go");
    c.set_wait(Duration::from_millis(300));

    // A share this mount alone holds becomes its exclusive lock in place
    // (one conditional write, as `mkdir d; ...; mv d e` needs), and is gone
    // with it at release ...
    let ga = a.lock_tree(&paths(&["/s"]), &[]).unwrap();
    a.release(ga); // the share stays cached
    assert_eq!(shared_count(&store, "/s"), Some(1));
    let ga = a.lock_tree(&[], &paths(&["/s"])).unwrap();
    let doc = store.get(Idx::Locks, &tree_id("/s")).unwrap().unwrap();
    assert_eq!(doc.source["type"], json!("exclusive"));
    assert!(
        b.lock_tree(&paths(&["/s"]), &[]).is_err(),
        "excludes sharers"
    );
    a.release(ga);
    assert!(store.get(Idx::Locks, &tree_id("/s")).unwrap().is_none());
    // ... but not one another mount joined after it: that share waits.
    let ga = a.lock_tree(&paths(&["/s"]), &[]).unwrap();
    a.release(ga);
    let gb = b.lock_tree(&paths(&["/s"]), &[]).unwrap();
    assert!(matches!(
        a.lock_tree(&[], &paths(&["/s"])),
        Err(LockError::Timeout(..))
    ));
    assert_eq!(
        store
            .get(Idx::Locks, &tree_id("/s"))
            .unwrap()
            .unwrap()
            .source["holders"],
        json!({"b": 1}),
        "a's share went back, b's stays"
    );
    b.release(gb);
    b.release_idle(Duration::ZERO);
    let ga = a.lock_tree(&[], &paths(&["/s"])).unwrap();
    a.release(ga);

    // A holder that dies: its session lease lapses and its locks can be broken.
    let d = mgr(&store, "dead");
    let gd = d.lock_tree(&paths(&["/q"]), &paths(&["/q/x"])).unwrap();
    std::mem::forget(gd); // it never releases
    assert!(
        b.lock_tree(&[], &paths(&["/q/x"])).is_err(),
        "alive: not breakable"
    );
    // Simulate death: the session stops being renewed and expires.
    let sid = "session/dead";
    let mut s = store.get(Idx::Locks, sid).unwrap().unwrap();
    std::sync::Arc::make_mut(&mut s.source)["expires"] = json!(0);
    store
        .put(Idx::Locks, sid, &s.source, Some(s.version))
        .unwrap();
    let gb = b.lock_tree(&[], &paths(&["/q/x", "/q"])).unwrap();
    b.release(gb);
}

#[test]
fn guide_lock_scenarios_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    scenarios(Arc::new(EmbeddedStore::open(dir.path()).unwrap()));
}

#[test]
fn guide_lock_scenarios_on_elasticsearch() {
    let server;
    let url = match std::env::var("ESFS_TEST_ES_URL") {
        Ok(u) => u,
        Err(_) => {
            server = EsTestServer::start("127.0.0.1:0").unwrap();
            server.url()
        }
    };
    let index = format!("locks{}", std::process::id());
    scenarios(Arc::new(
        EsStore::connect(&EsConfig::new(&url, &index)).unwrap(),
    ));
}
