//! Holders that die: a mount killed in the middle of a large directory
//! rename, renames left at a given step by a dead mount and rolled forward,
//! and `esfs fsck` finding and repairing damaged documents.

mod common;

use common::*;
use esfs::fs::intent::{Intent, MoveIntent};
use esfs::model::{Entry, ROOT_INO, entry_id};
use esfs::store::embedded::EmbeddedStore;
use esfs::store::{Idx, MetaStore, Query, Version};
use serde_json::json;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::Duration;

fn esfs(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_esfs"))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Intent documents in the store (a read racing the mount's writer may be
/// refused as busy: count that as "not seen yet").
fn count_intents(store: &dyn MetaStore) -> u64 {
    store.refresh(Idx::Locks).ok();
    store
        .count(Idx::Locks, &Query::term("type", "intent"))
        .unwrap_or(0)
}

/// `/clinton/projects` holding a README and `n` more files, then
/// `mv clinton bill` started in the background.
fn start_big_rename(m: &mut Mount, store: &dyn MetaStore, n: u64) -> std::thread::JoinHandle<()> {
    fs::create_dir_all(m.p("clinton/projects")).unwrap();
    fs::write(m.p("clinton/projects/README.txt"), b"keep me").unwrap();
    let dino = fs::metadata(m.p("clinton/projects")).unwrap().ino();
    m.unmount();
    bulk_files(store, dino, "/clinton/projects", n);
    m.start_again();
    let mnt = m.path().to_path_buf();
    std::thread::spawn(move || {
        let _ = Command::new("mv")
            .arg(mnt.join("clinton"))
            .arg(mnt.join("bill"))
            .output();
    })
}

/// After the restart: the tree is whole under `want` (and gone from the
/// other name), in the namespace and in the index; fsck finds nothing.
/// `fsck`: its arguments, to run it too (fsck checks every inode with a
/// search, which the test double answers by scanning: too slow at this size).
fn assert_whole_tree(
    m: &mut Mount,
    store: &dyn MetaStore,
    want: &str,
    n: u64,
    fsck: Option<&[&str]>,
) {
    let other = if want == "bill" { "clinton" } else { "bill" };
    assert!(!m.p(other).exists(), "{other} still exists");
    assert_eq!(
        fs::read(m.p(format!("{want}/projects/README.txt"))).unwrap(),
        b"keep me"
    );
    assert_eq!(
        fs::read_dir(m.p(format!("{want}/projects")))
            .unwrap()
            .count() as u64,
        n + 1
    );
    m.unmount();
    assert_eq!(count_intents(store), 0);
    if let Some(fsck) = fsck {
        let (code, out) = esfs(&[&["fsck"], fsck].concat());
        assert_eq!(code, 0, "fsck after recovery:\n{out}");
    }
    store.refresh(Idx::Entries).unwrap();
    let tree = |p: &str| store.count(Idx::Entries, &Query::tree("path", p)).unwrap();
    assert_eq!(tree(&format!("/{other}")), 0);
    assert_eq!(tree(&format!("/{want}")), n + 3);
}

/// On Elasticsearch a large directory rename is many bulk requests: a
/// mount killed half-way leaves a half-moved subtree and its intent, and
/// the next mount rolls the rename forward.
#[test]
fn kill9_during_a_large_directory_rename_is_rolled_forward() {
    // A fresh index on the real engine (ESFS_TEST_ES_URL) or the test double.
    let es = es_backend_args();
    let (url, index) = (es[1].clone(), es[3].clone());
    let es: Vec<&str> = es.iter().map(String::as_str).collect();
    let mut m = Mount::with_backend(&es);
    let store =
        esfs::store::es::EsStore::connect(&esfs::store::es::EsConfig::new(&url, &index)).unwrap();
    let n = 20_000;
    let mv = start_big_rename(&mut m, &store, n);
    // Kill the server once the rename's intent is recorded and some, but
    // not all, of the subtree has moved.
    let mut caught = false;
    for _ in 0..2000 {
        std::thread::sleep(Duration::from_millis(5));
        store.refresh(Idx::Entries).ok();
        if count_intents(&store) > 0
            && store
                .count(Idx::Entries, &Query::tree("path", "/bill"))
                .unwrap_or(0)
                > 100
        {
            caught = true;
            break;
        }
    }
    m.kill9();
    let _ = mv.join();
    assert!(
        caught,
        "the rename finished before it could be interrupted; make it larger"
    );
    assert!(
        count_intents(&store) > 0,
        "killed with the rename's intent recorded"
    );
    // Another mount finds the dead mount's intent and, once the dead
    // mount's lease has run out, rolls it forward.
    m.start_again();
    let t = std::time::Instant::now();
    while count_intents(&store) > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "intent never rolled forward:\n{}",
            m.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_whole_tree(&mut m, &store, "bill", n, None);
}

/// On the embedded store a directory rename is one transaction (the path
/// rewrite is one SQL statement): killed at any moment, the tree is whole
/// under the old name or the new one, never split.
#[test]
fn kill9_during_a_large_directory_rename_on_the_embedded_store_is_all_or_nothing() {
    let mut m = Mount::new();
    skip_in_plain_mode!(
        "kill9_during_a_large_directory_rename_on_the_embedded_store_is_all_or_nothing"
    );
    embedded_only!("kill9_during_a_large_directory_rename_on_the_embedded_store_is_all_or_nothing");
    let store_dir = m.store_dir();
    let n = 60_000;
    let mv = {
        let store = EmbeddedStore::open(&store_dir).unwrap();
        start_big_rename(&mut m, &store, n)
    };
    std::thread::sleep(Duration::from_millis(150));
    m.kill9();
    let _ = mv.join();
    m.start_again();
    let want = if m.p("bill").exists() {
        "bill"
    } else {
        "clinton"
    };
    eprintln!("killed mid-rename: the tree is whole under {want}");
    let data_dir = m.data_dir();
    let store = EmbeddedStore::open(&store_dir).unwrap();
    assert_whole_tree(
        &mut m,
        &store,
        want,
        n,
        Some(&[
            "--store",
            store_dir.to_str().unwrap(),
            "--data",
            data_dir.to_str().unwrap(),
        ]),
    );
}

#[test]
fn fsck_finds_and_repairs_damage() {
    let mut m = Mount::new();
    skip_in_plain_mode!("fsck_finds_and_repairs_damage");
    embedded_only!("fsck_finds_and_repairs_damage");
    fs::create_dir_all(m.p("a/b")).unwrap();
    fs::write(m.p("a/b/f"), b"x").unwrap();
    fs::write(m.p("a/g"), b"y").unwrap();
    let b_ino = fs::metadata(m.p("a/b")).unwrap().ino();
    m.unmount();
    let (store_dir, data_dir) = (m.store_dir(), m.data_dir());
    let (sa, da) = (store_dir.to_str().unwrap(), data_dir.to_str().unwrap());
    assert_eq!(
        esfs(&["fsck", "--store", sa, "--data", da]).0,
        0,
        "clean to begin with"
    );
    {
        let s = EmbeddedStore::open(&store_dir).unwrap();
        // A stale path (as a crashed rename would leave).
        let id = entry_id(b_ino, b"f");
        let mut e = s.get(Idx::Entries, &id).unwrap().unwrap();
        std::sync::Arc::make_mut(&mut e.source)["path"] = json!("/old/b/f");
        s.put(Idx::Entries, &id, &e.source, Some(e.version))
            .unwrap();
        // A wrong link count.
        let mut r = s.get(Idx::Inodes, &ROOT_INO.to_string()).unwrap().unwrap();
        std::sync::Arc::make_mut(&mut r.source)["nlink"] = json!(9);
        s.put(Idx::Inodes, "1", &r.source, Some(r.version)).unwrap();
        // An inode nobody names, and contents nobody owns.
        s.create(Idx::Inodes, "999999", &json!({"ino": 999999, "kind": "file", "mode": 0o644, "uid": 0, "gid": 0,
            "size": 0, "nlink": 1, "atime_ns": 0, "mtime_ns": 0, "ctime_ns": 0, "btime_ns": 0, "links": []})).unwrap();
        // A lock and an intent-free session of a mount that died.
        s.create(
            Idx::Locks,
            "tree//a",
            &json!({"type": "exclusive", "path": "/a", "owner": "ghost", "since": 1}),
        )
        .unwrap();
        s.create(
            Idx::Locks,
            "session/ghost",
            &json!({"type": "session", "owner": "ghost", "since": 1, "expires": 1}),
        )
        .unwrap();
    }
    fs::create_dir_all(data_dir.join("77")).unwrap();
    fs::write(data_dir.join("77/12377"), b"orphan").unwrap();

    let (code, out) = esfs(&["fsck", "--store", sa, "--data", da]);
    assert_eq!(code, 4, "{out}");
    for want in [
        "should be \"/a/b/f\"",
        "root: nlink 9",
        "inode 999999 has no name",
        "contents 12377",
        "stale exclusive lock",
        "stale session ghost",
    ] {
        assert!(out.contains(want), "fsck should report {want:?}:\n{out}");
    }
    let (code, out) = esfs(&["fsck", "--store", sa, "--data", da, "--repair"]);
    assert_eq!(code, 1, "{out}");
    let (code, out) = esfs(&["fsck", "--store", sa, "--data", da]);
    assert_eq!(code, 0, "clean after repair:\n{out}");
    m.start_again();
    assert_eq!(fs::read(m.p("a/b/f")).unwrap(), b"x");
}

#[test]
fn locks_lists_sessions_and_breaks_a_lock() {
    let m = Mount::new();
    skip_in_plain_mode!("locks_lists_sessions_and_breaks_a_lock");
    embedded_only!("locks_lists_sessions_and_breaks_a_lock");
    let sa = m.store_dir();
    let (code, out) = esfs(&["locks", "--store", sa.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    // The live mount's session is listed with its mountpoint, alive.
    let line = out
        .lines()
        .find(|l| l.contains("session"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("yes") && line.contains(m.path().to_str().unwrap()),
        "{out}"
    );
    let id = line.split_whitespace().next().unwrap();
    let (code, out) = esfs(&["locks", "--store", sa.to_str().unwrap(), "--break", id]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("broke"), "{out}");
}

/// A mount killed right after closing written files leaves their sizes
/// and mtimes in its unflushed journal only: `esfs fsck` reports them,
/// `--repair` catches them up with the contents (what the next mount would
/// do), and the next mount then finds nothing left to recover.
#[test]
fn fsck_catches_up_sizes_a_killed_mount_left_behind() {
    let mut m = Mount::new();
    skip_in_plain_mode!("fsck_catches_up_sizes_a_killed_mount_left_behind");
    embedded_only!("fsck_catches_up_sizes_a_killed_mount_left_behind");
    // close(2) sends nothing; the write-back would come a second later.
    m.kill9_right_after("head -c 70000 /dev/zero > big; printf hello > small");
    let (store_dir, data_dir) = (m.store_dir(), m.data_dir());
    let (sa, da) = (store_dir.to_str().unwrap(), data_dir.to_str().unwrap());
    let (code, out) = esfs(&["fsck", "--store", sa, "--data", da]);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains("(70000 bytes)"),
        "fsck should report big:\n{out}"
    );
    assert!(
        out.contains("(5 bytes)"),
        "fsck should report small:\n{out}"
    );
    let (code, out) = esfs(&["fsck", "--store", sa, "--data", da, "--repair"]);
    assert_eq!(code, 1, "{out}");
    let (code, out) = esfs(&["fsck", "--store", sa, "--data", da]);
    assert_eq!(code, 0, "clean after repair:\n{out}");
    m.start_again();
    assert_eq!(fs::metadata(m.p("big")).unwrap().len(), 70_000);
    assert_eq!(fs::read(m.p("small")).unwrap(), b"hello");
    assert!(
        !m.log().contains("recovered from their data"),
        "fsck left sizes for the mount to recover:\n{}",
        m.log()
    );
}

/// fsck beside a live mount leaves the mount's pending sizes alone (they
/// are not stale, just not written back yet) and says so.
#[test]
fn fsck_beside_a_live_mount_skips_its_pending_sizes() {
    let m = Mount::new();
    skip_in_plain_mode!("fsck_beside_a_live_mount_skips_its_pending_sizes");
    embedded_only!("fsck_beside_a_live_mount_skips_its_pending_sizes");
    fs::write(m.p("f"), b"pending").unwrap();
    let (sa, da) = (m.store_dir(), m.data_dir());
    let (code, out) = esfs(&[
        "fsck",
        "--store",
        sa.to_str().unwrap(),
        "--data",
        da.to_str().unwrap(),
    ]);
    assert!(out.contains("pending file sizes are not checked"), "{out}");
    assert_eq!(code, 0, "{out}");
    assert_eq!(fs::read(m.p("f")).unwrap(), b"pending");
}

/// The store of a mount that is not running, whichever backend it is on.
fn open_store(m: &Mount) -> Box<dyn MetaStore> {
    let args = m.store_args();
    if args[0] == "--es" {
        let cfg = esfs::store::es::EsConfig::new(&args[1], &args[3]);
        Box::new(esfs::store::es::EsStore::connect(&cfg).unwrap())
    } else {
        Box::new(EmbeddedStore::open(&m.store_dir()).unwrap())
    }
}

fn get_entry(store: &dyn MetaStore, parent: u64, name: &[u8]) -> (Entry, Version) {
    let doc = store
        .get(Idx::Entries, &entry_id(parent, name))
        .unwrap()
        .unwrap_or_else(|| panic!("no entry {name:?} in {parent}"));
    (doc.parse().unwrap(), doc.version)
}

fn put_entry(store: &dyn MetaStore, e: &Entry, ver: Option<Version>) {
    let id = entry_id(e.parent, e.name.as_bytes());
    store
        .put(Idx::Entries, &id, &serde_json::to_value(e).unwrap(), ver)
        .unwrap();
}

/// The intent document a mount that died (its session gone) left behind.
fn leave_dead_intent(store: &dyn MetaStore, intent: &Intent) {
    store
        .create(
            Idx::Locks,
            "intent/ghost-1",
            &json!({"type": "intent", "owner": "ghost", "since": 1, "op": intent}),
        )
        .unwrap();
}

fn ino_of(m: &Mount, p: &str) -> u64 {
    fs::metadata(m.p(p)).unwrap().ino()
}

/// After the roll-forward: no intent left, and fsck finds nothing (paths,
/// back-links, link counts, unnamed inodes, unowned contents).
fn assert_rolled_forward(m: &mut Mount) {
    m.unmount();
    assert_eq!(count_intents(&*open_store(m)), 0, "intent left");
    let args = m.store_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out) = esfs(&[&["fsck"], &args[..]].concat());
    assert_eq!(code, 0, "fsck after the roll-forward:\n{out}");
}

/// RENAME_EXCHANGE of two directories, its mount dead after the entries
/// swapped and the first of the three path rewrites (one subtree parked
/// under the temporary path), its inodes' back-links not moved yet: a
/// prefix cannot describe that state, so the next mount recomputes the
/// paths from the parent chain, moves the links and recounts the parents.
#[test]
fn an_exchange_of_directories_left_half_done_is_rolled_forward() {
    let mut m = Mount::new();
    skip_in_plain_mode!("an_exchange_of_directories_left_half_done_is_rolled_forward");
    fs::create_dir_all(m.p("p/a/sub")).unwrap();
    fs::create_dir_all(m.p("q/b")).unwrap();
    fs::write(m.p("p/a/f"), b"from a").unwrap();
    fs::write(m.p("p/a/sub/g"), b"deep in a").unwrap();
    fs::write(m.p("q/b/h"), b"from b").unwrap();
    let (p, q, a, sub) = (
        ino_of(&m, "p"),
        ino_of(&m, "q"),
        ino_of(&m, "p/a"),
        ino_of(&m, "p/a/sub"),
    );
    m.unmount();
    {
        let store = open_store(&m);
        let store = &*store;
        let (ea, va) = get_entry(store, p, b"a");
        let (eb, vb) = get_entry(store, q, b"b");
        leave_dead_intent(
            store,
            &Intent::Exchange {
                a: ea.clone(),
                b: eb.clone(),
            },
        );
        // The live rename's one bulk: each name takes the other's inode.
        for (pos, other, ver) in [(&ea, &eb, va), (&eb, &ea, vb)] {
            let mut e = pos.clone();
            e.take_inode_fields(other);
            put_entry(store, &e, Some(ver));
        }
        // Then the first rewrite: a's subtree under the temporary path.
        for (parent, name) in [(a, &b"f"[..]), (a, b"sub"), (sub, b"g")] {
            let (mut e, ver) = get_entry(store, parent, name);
            e.path = e.path.replacen("/p/a", "/\0swap1", 1);
            e.dir = e.dir.replacen("/p/a", "/\0swap1", 1);
            put_entry(store, &e, Some(ver));
        }
    }
    m.start_again();
    assert_eq!(fs::read(m.p("q/b/f")).unwrap(), b"from a");
    assert_eq!(fs::read(m.p("q/b/sub/g")).unwrap(), b"deep in a");
    assert_eq!(fs::read(m.p("p/a/h")).unwrap(), b"from b");
    assert!(!m.p("p/a/f").exists());
    assert_eq!(ino_of(&m, "q/b"), a);
    assert_rolled_forward(&mut m);
}

/// A rename over an existing file, its mount dead right after the new
/// name was written: both names point at the moved file, whose back-link
/// still names the old one, and the replaced file still has its link. The
/// next mount deletes the old name, moves the back-link and drops the
/// replaced file, which nothing names any more (its contents too).
#[test]
fn a_rename_over_a_file_left_after_its_first_step_is_rolled_forward() {
    let mut m = Mount::new();
    skip_in_plain_mode!("a_rename_over_a_file_left_after_its_first_step_is_rolled_forward");
    fs::create_dir_all(m.p("d1")).unwrap();
    fs::create_dir_all(m.p("d2")).unwrap();
    fs::write(m.p("d1/x"), b"moved").unwrap();
    fs::write(m.p("d2/y"), b"replaced").unwrap();
    let (d1, d2, x, y) = (
        ino_of(&m, "d1"),
        ino_of(&m, "d2"),
        ino_of(&m, "d1/x"),
        ino_of(&m, "d2/y"),
    );
    m.unmount();
    {
        let store = open_store(&m);
        let store = &*store;
        let (ex, _) = get_entry(store, d1, b"x");
        let (ey, vy) = get_entry(store, d2, b"y");
        let moved = Entry {
            parent: d2,
            name: ey.name.clone(),
            path: ey.path.clone(),
            dir: ey.dir.clone(),
            cookie: ey.cookie,
            ..ex.clone()
        };
        leave_dead_intent(
            store,
            &Intent::Move(MoveIntent {
                src_parent: d1,
                src_name: ex.name.clone(),
                old_path: ex.path.clone(),
                entry: moved.clone(),
                replaced: Some(y),
            }),
        );
        // Step 1: the new name points at the moved file.
        put_entry(store, &moved, Some(vy));
    }
    m.start_again();
    assert!(!m.p("d1/x").exists());
    assert_eq!(fs::read(m.p("d2/y")).unwrap(), b"moved");
    assert_eq!(ino_of(&m, "d2/y"), x);
    assert_rolled_forward(&mut m);
}

/// A dead mount's intent to move `d/x` to `name`, planned from names read
/// before it took its locks (the new name free), as a file's rename writes
/// it with its locks; `tweak` changes the plan's copy of the entry.
fn leave_early_move(m: &mut Mount, d: u64, name: &str, tweak: impl FnOnce(&mut Entry)) {
    m.unmount();
    let store = open_store(m);
    let store = &*store;
    let (ex, _) = get_entry(store, d, b"x");
    let mut planned = Entry {
        name: name.into(),
        path: format!("/d/{name}"),
        cookie: ex.cookie + 1000,
        ..ex.clone()
    };
    tweak(&mut planned);
    leave_dead_intent(
        store,
        &Intent::Move(MoveIntent {
            src_parent: d,
            src_name: ex.name.clone(),
            old_path: ex.path.clone(),
            entry: planned,
            replaced: None,
        }),
    );
}

/// The intent of a file's rename is written with its locks, planned from
/// names read before them. A mount that died before confirming the plan
/// against the names may leave one that another mount made stale: here
/// the plan moves `x` to the free name `z`, which another mount then
/// created. The roll-forward checks the plan against the names and drops
/// it: `z` keeps its file, `x` stays where it is.
#[test]
fn a_rename_planned_from_a_stale_read_is_not_carried_out() {
    let mut m = Mount::new();
    skip_in_plain_mode!("a_rename_planned_from_a_stale_read_is_not_carried_out");
    fs::create_dir_all(m.p("d")).unwrap();
    fs::write(m.p("d/x"), b"stays").unwrap();
    fs::write(m.p("d/z"), b"made after the plan").unwrap();
    let (d, x, z) = (ino_of(&m, "d"), ino_of(&m, "d/x"), ino_of(&m, "d/z"));
    leave_early_move(&mut m, d, "z", |_| {});
    m.start_again();
    assert_eq!(fs::read(m.p("d/x")).unwrap(), b"stays");
    assert_eq!(fs::read(m.p("d/z")).unwrap(), b"made after the plan");
    assert_eq!((ino_of(&m, "d/x"), ino_of(&m, "d/z")), (x, z));
    assert_rolled_forward(&mut m);
}

/// The same early intent, its plan still true to the names (nothing of it
/// done): the roll-forward carries it out, from the old entry as it is now.
#[test]
fn a_rename_planned_and_not_started_is_carried_out() {
    let mut m = Mount::new();
    skip_in_plain_mode!("a_rename_planned_and_not_started_is_carried_out");
    fs::create_dir_all(m.p("d")).unwrap();
    fs::write(m.p("d/x"), b"moves").unwrap();
    let (d, x) = (ino_of(&m, "d"), ino_of(&m, "d/x"));
    // The plan's copy of the attributes is older than the file.
    leave_early_move(&mut m, d, "w", |e| e.size = 0);
    m.start_again();
    assert!(!m.p("d/x").exists());
    assert_eq!(fs::read(m.p("d/w")).unwrap(), b"moves");
    assert_eq!(ino_of(&m, "d/w"), x);
    assert_rolled_forward(&mut m);
}
