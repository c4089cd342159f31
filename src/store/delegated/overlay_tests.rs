//! The overlay's rules, one document and one flush at a time: what is
//! decided without a read, what a flush sends, what leaves past the budget.

use super::*;
use serde_json::json;

fn create(index: Idx, id: &str, source: Value) -> BulkOp {
    BulkOp::Create {
        index,
        id: id.into(),
        source,
    }
}

#[test]
fn a_tree_made_under_the_delegation_is_decided_without_reads() {
    let mut o = Overlay::default();
    // The directory's inode and its entry in the root, whose names are
    // not known: the entry needs a read, the inode (a fresh number) not.
    let ops = vec![
        create(Idx::Inodes, "20", json!({"kind": "dir"})),
        create(Idx::Entries, "1/d", json!({"ino": 20})),
    ];
    let Need::Fetch(keys) = o.needs(&ops) else {
        panic!("the root's names are not known")
    };
    o.learn(keys, vec![None], false);
    let (r, recs) = o.apply(ops);
    assert!(r.iter().all(|r| r.is_ok()));
    assert_eq!(recs.len(), 2);
    // Inside the new directory nothing needs a read, and a name taken
    // twice conflicts.
    let inside = vec![create(Idx::Entries, "20/f", json!({"ino": 21}))];
    assert!(matches!(o.needs(&inside), Need::Nothing));
    assert!(o.apply(inside.clone()).0[0].is_ok());
    assert!(matches!(o.apply(inside).0[0], Err(StoreError::Conflict(_))));
    assert_eq!(o.get(Idx::Entries, "20/nothing", false), Some(None));
    // A conditional write needs the version handed out.
    let v = o.get(Idx::Entries, "20/f", false).unwrap().unwrap().version;
    assert!(is_local(v));
    let stale = Version {
        seq_no: v.seq_no - 1,
        ..v
    };
    let put = |v| BulkOp::Index {
        index: Idx::Entries,
        id: "20/f".into(),
        source: json!({"ino": 22}),
        if_version: Some(v),
    };
    assert!(matches!(
        o.apply(vec![put(stale)]).0[0],
        Err(StoreError::Conflict(_))
    ));
    assert!(o.apply(vec![put(v)]).0[0].is_ok());
    // One flush: creates of what the cluster lacks, in order.
    let out = o.outgoing();
    assert_eq!(out.ops.len(), 3);
    assert!(out.ops.iter().all(|op| matches!(op, BulkOp::Create { .. })));
    assert_eq!(o.dirty_len(), 0);
}

#[test]
fn made_and_removed_between_flushes_sends_nothing_and_answers_set_bases() {
    let mut o = Overlay::default();
    o.complete.insert(5);
    let v = o.apply(vec![create(Idx::Entries, "5/x", json!({}))]).0[0]
        .clone()
        .unwrap();
    let del = BulkOp::Delete {
        index: Idx::Entries,
        id: "5/x".into(),
        if_version: Some(v),
    };
    assert!(o.apply(vec![del]).0[0].is_ok());
    assert!(o.outgoing().ops.is_empty());
    // A flush answered: the local version now maps to the cluster's.
    let w = o.apply(vec![create(Idx::Entries, "5/y", json!({}))]).0[0]
        .clone()
        .unwrap();
    let out = o.outgoing();
    let real = Version {
        seq_no: 3,
        primary_term: 1,
    };
    assert!(o.answered(&out, vec![Ok(real)]).1.is_empty());
    let key = (Idx::Entries, "5/y".to_string());
    assert_eq!(o.translate(&key, w), real);
    // A failed flush puts its items back first.
    let _ = o.apply(vec![create(Idx::Entries, "5/z", json!({}))]);
    let out = o.outgoing();
    let _ = o.apply(vec![create(Idx::Entries, "5/w", json!({}))]);
    o.unsent(out);
    let again = o.outgoing();
    let ids: Vec<&str> = again.ops.iter().map(|op| op.id()).collect();
    assert_eq!(ids, vec!["5/z", "5/w"]);
}

/// A directory rename decided ([`Overlay::rebase`]) and carried out
/// ([`Overlay::settle`]): the keys rewritten.
fn rebased(o: &mut Overlay, old: &str, new: &str) -> Option<Vec<Key>> {
    let ids = o.rebase(old, new)?;
    let keys = o.settle().map(|(keys, _)| keys).unwrap_or_default();
    assert_eq!(
        keys.iter().map(|(_, id)| id).collect::<Vec<_>>(),
        ids.iter().collect::<Vec<_>>()
    );
    Some(keys)
}

#[test]
fn a_rebase_moves_exactly_the_subtree_and_follows_every_change() {
    let mut o = Overlay::default();
    o.complete.insert(1);
    let entry = |path: &str, dir: &str, kind: &str, ino: u64| json!({"path": path, "dir": dir, "kind": kind, "ino": ino});
    let made = o.apply(vec![
        create(Idx::Inodes, "20", json!({"kind": "dir"})),
        create(Idx::Entries, "1/d", entry("/d", "/", "dir", 20)),
        create(Idx::Entries, "20/a", entry("/d/a", "/d", "file", 21)),
        create(Idx::Entries, "20/b", entry("/d/b", "/d", "file", 22)),
        // Beside the subtree, sorting right after or before it.
        create(Idx::Entries, "1/d-x", entry("/d-x", "/", "file", 23)),
        create(Idx::Entries, "1/c", entry("/c", "/", "file", 24)),
        create(Idx::Entries, "1/d0", entry("/d0", "/", "file", 25)),
    ]);
    assert!(made.0.iter().all(|r| r.is_ok()));
    let ids = |keys: Option<Vec<Key>>| -> Option<Vec<String>> {
        Some(keys?.into_iter().map(|(_, id)| id).collect())
    };
    let at = |o: &mut Overlay, id: &str| o.get(Idx::Entries, id, false).unwrap().unwrap();
    // Not moved yet: nothing is at the new path.
    assert_eq!(rebased(&mut o, "/d", "/e"), None);
    // The rename's entry step, then its paths.
    let v = at(&mut o, "1/d").version;
    let moved = o.apply(vec![
        BulkOp::Delete {
            index: Idx::Entries,
            id: "1/d".into(),
            if_version: Some(v),
        },
        create(Idx::Entries, "1/e", entry("/e", "/", "dir", 20)),
    ]);
    assert!(moved.0.iter().all(|r| r.is_ok()));
    let before = at(&mut o, "20/b").version;
    let flushed = o.outgoing();
    assert!(o.clean());
    let keys = rebased(&mut o, "/d", "/e").unwrap();
    assert_eq!(ids(Some(keys.clone())).unwrap(), vec!["20/a", "20/b"]);
    let b = at(&mut o, "20/b");
    assert_eq!(b.source, entry("/e/b", "/e", "file", 22).into());
    assert!(b.version.seq_no > before.seq_no, "a new local version");
    assert_eq!(
        at(&mut o, "1/d-x").source["path"],
        "/d-x",
        "beside: untouched"
    );
    // Logged as their new paths, and sent by the next flush.
    let changes = serde_json::to_value(o.moved_paths(&keys)).unwrap();
    assert_eq!(changes[1]["s"], json!({"path": "/e/b", "dir": "/e"}));
    assert_eq!(changes[1]["p"], true);
    drop(flushed);
    assert_eq!(o.outgoing().ops.len(), 2);
    assert_eq!(ids(rebased(&mut o, "/d", "/e")), Some(vec![]), "none left");
    // A removal leaves the index; a directory below not made here
    // (its names unknown) keeps the rebase out of memory.
    let v = at(&mut o, "20/b").version;
    let gone = BulkOp::Delete {
        index: Idx::Entries,
        id: "20/b".into(),
        if_version: Some(v),
    };
    assert!(o.apply(vec![gone]).0[0].is_ok());
    assert_eq!(ids(rebased(&mut o, "/e", "/e")), Some(vec!["20/a".into()]));
    let sub = create(Idx::Entries, "20/s", entry("/e/s", "/e", "dir", 30));
    assert!(o.apply(vec![sub]).0[0].is_ok());
    assert_eq!(rebased(&mut o, "/e", "/e"), None);
    // Given back: only what this mount wrote stays, indexed the same.
    o.released();
    o.complete.insert(20);
    o.complete.insert(30);
    assert_eq!(
        ids(rebased(&mut o, "/e", "/e")).unwrap(),
        vec!["20/a", "20/s"]
    );
}

/// A rename is decided on the syscall path and carried out after: until
/// then nothing below moved, and the lock records decided meanwhile (the
/// rename's releases) come back from the settle, to be logged after the
/// rewrite's records.
#[test]
fn a_rebase_is_decided_at_once_and_rewritten_when_settled() {
    let mut o = Overlay::default();
    o.complete.extend([1, 20]);
    o.locks_whole = true;
    let entry = |path: &str, dir: &str, kind: &str, ino: u64| json!({"path": path, "dir": dir, "kind": kind, "ino": ino});
    let made = o.apply(vec![
        create(Idx::Entries, "1/e", entry("/e", "/", "dir", 20)),
        create(Idx::Entries, "20/a", entry("/d/a", "/d", "file", 21)),
    ]);
    assert!(made.0.iter().all(|r| r.is_ok()));
    flush_all(&mut o);
    assert_eq!(o.rebase("/d", "/e"), Some(vec!["20/a".to_string()]));
    assert!(o.unsettled());
    let a = &o.slots[&(Idx::Entries, "20/a".to_string())];
    assert!(!a.dirty, "not rewritten yet");
    let (_, released) = o.apply(vec![create(Idx::Locks, "tree/e", json!({"n": 0}))]);
    o.hold_back(released.clone());
    let (keys, held) = o.settle().unwrap();
    assert_eq!(keys, vec![(Idx::Entries, "20/a".to_string())]);
    assert_eq!(held, released);
    let a = o.get(Idx::Entries, "20/a", false).unwrap().unwrap();
    assert_eq!(a.source, entry("/e/a", "/e", "file", 21).into());
    assert!(!o.unsettled() && o.settle().is_none());
    assert_eq!(o.outgoing().ops.len(), 2, "the entry and the lock");
}

#[test]
fn small_files_contents_stay_after_the_flush_and_large_ones_go() {
    let mut o = Overlay::default();
    let chunk = |id: &str, len: usize| BulkOp::Index {
        index: Idx::Chunks,
        id: id.into(),
        source: json!({"file": "21", "n": 0, "len": len, "data": "eA"}),
        if_version: None,
    };
    let r = o.apply(vec![chunk("21:0", 1), chunk("22:0", KEEP_CHUNK_MAX + 1)]);
    assert!(r.0.iter().all(|r| r.is_ok()));
    let out = o.outgoing();
    let real = Version {
        seq_no: 1,
        primary_term: 1,
    };
    assert!(o.answered(&out, vec![Ok(real), Ok(real)]).1.is_empty());
    // The small one answers a read from memory; the large one is the
    // cluster's to answer.
    assert!(matches!(o.get(Idx::Chunks, "21:0", false), Some(Some(_))));
    assert_eq!(o.get(Idx::Chunks, "22:0", false), None);
    let kept = o.budget.held;
    assert_eq!(kept, o.slots.values().map(|s| s.weight).sum::<usize>());
    // Deleted, it is a removal waiting to be sent.
    let del = BulkOp::Delete {
        index: Idx::Chunks,
        id: "21:0".into(),
        if_version: None,
    };
    assert!(o.apply(vec![del]).0[0].is_ok());
    assert!(o.budget.held < kept);
    assert_eq!(o.get(Idx::Chunks, "21:0", false), Some(None));
}

/// An overlay whose clean slots leave as soon as they are past `bytes`.
fn budgeted(bytes: usize) -> Overlay {
    let mut o = Overlay::default();
    o.budget.grace = Duration::ZERO;
    o.set_budget(bytes);
    o
}

/// Send what waits and have the cluster take all of it.
fn flush_all(o: &mut Overlay) {
    let out = o.outgoing();
    let real = Version {
        seq_no: 7,
        primary_term: 1,
    };
    let ok = out.ops.iter().map(|_| Ok(real)).collect();
    assert!(o.answered(&out, ok).1.is_empty());
}

fn entry_doc(name: &str) -> Value {
    json!({"path": format!("/d/{name}"), "dir": "/d", "kind": "file", "ino": 40})
}

/// The text document of inode `ino` (`texts`), without its text.
fn text_doc(ino: u64) -> Value {
    json!({"ino": ino, "mtime_ns": 1})
}

#[test]
fn past_the_budget_a_files_text_leaves_before_the_rest_and_comes_back_from_a_full_read() {
    let text = "x".repeat(4000);
    let with_text = |ino: u64| {
        let mut d = text_doc(ino);
        d["contents"] = json!(text);
        d
    };
    let key = |ino: u64| (Idx::Texts, ino.to_string());
    let mut o = budgeted(usize::MAX);
    // Read absent first (a text is made where none is known absent).
    o.learn((40..44).map(key).collect(), vec![None; 4], false);
    let ops = (40..44)
        .map(|i| create(Idx::Texts, &i.to_string(), with_text(i)))
        .collect();
    assert!(o.apply(ops).0.iter().all(|r| r.is_ok()));
    flush_all(&mut o);
    let full = o.budget.held;
    // Just under what the four hold: one round of the queue takes the
    // text of the oldest only, and every slot stays.
    o.set_budget(full - 1);
    assert_eq!(o.slots.len(), 4);
    assert!(o.budget.held <= full - text.len());
    let brief: Vec<bool> = (40..44).map(|i| o.slots[&key(i)].brief).collect();
    assert_eq!(brief, [true, false, false, false]);
    // A brief slot answers brief reads; a full read is the cluster's.
    assert!(
        o.get(Idx::Texts, "40", true)
            .unwrap()
            .unwrap()
            .source
            .get("contents")
            .is_none()
    );
    assert_eq!(o.get(Idx::Texts, "40", false), None);
    // Changed brief: sent as a partial update, which leaves the text
    // as the cluster holds it.
    o.set_budget(usize::MAX);
    let local = o.get(Idx::Texts, "40", true).unwrap().unwrap().version;
    let up = BulkOp::Update {
        index: Idx::Texts,
        id: "40".into(),
        doc: json!({"mtime_ns": 2}),
        if_version: Some(local),
    };
    assert!(o.apply(vec![up]).0[0].is_ok());
    let out = o.outgoing();
    assert!(matches!(&out.ops[0], BulkOp::Update { doc, .. }
        if doc.get("contents").is_none() && doc["ino"] == 40 && doc["mtime_ns"] == 2));
    let ok = out
        .ops
        .iter()
        .map(|_| {
            Ok(Version {
                seq_no: 9,
                primary_term: 1,
            })
        })
        .collect();
    assert!(o.answered(&out, ok).1.is_empty());
    // The cluster's full document, read to decide a write, gives the slot
    // its text back; the answer carries the slot's local version, which
    // callers hold.
    let local = o.get(Idx::Texts, "40", true).unwrap().unwrap().version;
    let mut cluster = with_text(40);
    cluster["mtime_ns"] = json!(2);
    let read = Doc {
        id: "40".into(),
        version: Version {
            seq_no: 9,
            primary_term: 1,
        },
        source: cluster.clone().into(),
    };
    let answer = o.learn(vec![key(40)], vec![Some(read)], false);
    let answer = answer[0].clone().unwrap();
    assert_eq!((answer.version, &*answer.source), (local, &cluster));
    assert_eq!(
        o.get(Idx::Texts, "40", false).unwrap().unwrap().source,
        cluster.into()
    );
    // A whole source replaces the text: no longer brief.
    o.leave_text(&key(40));
    let put = BulkOp::Index {
        index: Idx::Texts,
        id: "40".into(),
        source: text_doc(40),
        if_version: Some(local),
    };
    assert!(o.apply(vec![put]).0[0].is_ok());
    assert!(!o.slots[&key(40)].brief);
    assert!(matches!(&o.outgoing().ops[0], BulkOp::Index { .. }));
}

#[test]
fn past_the_budget_every_files_text_leaves_before_any_name() {
    let text = "x".repeat(4000);
    let mut o = budgeted(usize::MAX);
    o.complete.insert(5);
    // Older names without text, then newer ones with it (a tree copied
    // after another: its text indexed last).
    let plain = (0..4).map(|i| {
        create(
            Idx::Entries,
            &format!("5/a{i}"),
            entry_doc(&format!("a{i}")),
        )
    });
    o.learn(
        (0..4).map(|i| (Idx::Texts, i.to_string())).collect(),
        vec![None; 4],
        false,
    );
    let texts = (0..4).map(|i| {
        let mut d = text_doc(i);
        d["contents"] = json!(text);
        create(Idx::Texts, &i.to_string(), d)
    });
    assert!(
        o.apply(plain.chain(texts).collect())
            .0
            .iter()
            .all(|r| r.is_ok())
    );
    flush_all(&mut o);
    // A text weighs about twice its length: the budget needs all four gone.
    let full = o.budget.held;
    o.set_budget(full - 7 * text.len());
    assert_eq!(o.slots.len(), 8, "no name left while a text could");
    assert_eq!(o.slots.values().filter(|s| s.brief).count(), 4);
    assert!(o.whole(5), "the directory is still answered from memory");
    // Past that, names are packed, oldest first, and still answered.
    o.set_budget(o.budget.held - 1);
    assert!(matches!(
        o.slots[&(Idx::Entries, "5/a0".into())].state,
        State::Packed { .. }
    ));
    assert!(o.whole(5));
    assert_eq!(o.children(5, &[], true).unwrap().len(), 4);
    // Once all are packed, they leave, oldest first (a0 had its second
    // chance: packed, it went to the back of the queue).
    let keys: Vec<Key> = o.slots.keys().cloned().collect();
    for k in &keys {
        o.pack(k);
    }
    o.set_budget(o.budget.held - 1);
    assert!(!o.slots.contains_key(&(Idx::Entries, "5/a1".into())));
    assert!(o.slots.contains_key(&(Idx::Entries, "5/a0".into())));
    assert!(o.slots.contains_key(&(Idx::Texts, "3".into())));
    assert!(!o.whole(5));
}

#[test]
fn past_the_budget_clean_slots_leave_their_directory_lists_from_the_cluster_and_still_knows_its_absent_names()
 {
    let mut o = budgeted(0);
    o.complete.insert(5);
    let names: Vec<String> = (0..20).map(|i| format!("f{i:02}")).collect();
    let ops = names
        .iter()
        .map(|n| create(Idx::Entries, &format!("5/{n}"), entry_doc(n)))
        .collect();
    assert!(o.apply(ops).0.iter().all(|r| r.is_ok()));
    // Dirty: nothing leaves, whatever the budget.
    o.trim();
    assert_eq!(o.slots.len(), 20);
    assert_eq!(o.children(5, &[], false).unwrap().len(), 20);
    // In a flush not answered yet: still nothing (the cluster may not
    // hold them).
    let out = o.outgoing();
    o.trim();
    assert_eq!(o.slots.len(), 20);
    assert_eq!(
        o.get(Idx::Entries, "5/absent", false),
        Some(None),
        "complete"
    );
    let real = Version {
        seq_no: 7,
        primary_term: 1,
    };
    let ok = out.ops.iter().map(|_| Ok(real)).collect();
    assert!(o.answered(&out, ok).1.is_empty());
    // Acknowledged: gone, and with them the directory's completeness: its
    // listing and the names that left are the cluster's to tell. Which
    // names left is remembered (by hash), so any other is still absent.
    assert!(o.slots.is_empty());
    assert!(o.paths.is_empty());
    assert_eq!(o.budget.held, 0);
    assert!(!o.complete.contains(&5));
    assert_eq!(
        o.left.bytes(),
        20 * 16,
        "what they weigh against the budget"
    );
    assert!(o.children(5, &[], false).is_none());
    assert_eq!(o.get(Idx::Entries, "5/f00", false), None);
    assert_eq!(o.get(Idx::Entries, "5/absent", false), Some(None));
    // A create of a name that left asks the cluster whether it is free; of
    // a new name, nobody.
    let again = vec![create(Idx::Entries, "5/f00", entry_doc("f00"))];
    assert!(matches!(o.needs(&again), Need::Fetch(k) if k.len() == 1));
    let new = vec![create(Idx::Entries, "5/g00", entry_doc("g00"))];
    assert!(matches!(o.needs(&new), Need::Nothing));
    // Read whole again, the directory is complete once more.
    o.learn_whole(&[5], Vec::new(), Vec::new());
    assert!(o.complete.contains(&5) && !o.left.tracks(5));
    assert_eq!(o.left.bytes(), 0);
    // An evicted removal's slot costs the directory nothing.
    let mut o = budgeted(usize::MAX);
    o.complete.insert(6);
    assert!(o.apply(vec![create(Idx::Entries, "6/x", json!({}))]).0[0].is_ok());
    flush_all(&mut o);
    let del = BulkOp::Delete {
        index: Idx::Entries,
        id: "6/x".into(),
        if_version: Some(o.get(Idx::Entries, "6/x", false).unwrap().unwrap().version),
    };
    assert!(o.apply(vec![del]).0[0].is_ok());
    flush_all(&mut o);
    o.set_budget(0);
    assert!(o.slots.is_empty());
    assert!(o.complete.contains(&6));
    assert_eq!(o.get(Idx::Entries, "6/x", false), Some(None));
}

#[test]
fn the_budget_keeps_the_newest_clean_slots_and_every_dirty_one() {
    let mut o = budgeted(usize::MAX);
    let inode = |i: u64| {
        create(
            Idx::Inodes,
            &i.to_string(),
            json!({"kind": "file", "size": i}),
        )
    };
    assert!(
        o.apply((100..200).map(inode).collect())
            .0
            .iter()
            .all(|r| r.is_ok())
    );
    flush_all(&mut o);
    let one = o.budget.held / 100;
    // Written again after the flush: dirty, it stays.
    let v = o.get(Idx::Inodes, "100", false).unwrap().unwrap().version;
    let put = BulkOp::Index {
        index: Idx::Inodes,
        id: "100".into(),
        source: json!({"kind": "file", "size": 1}),
        if_version: Some(v),
    };
    assert!(o.apply(vec![put]).0[0].is_ok());
    o.set_budget(30 * one);
    assert!(o.budget.held <= 30 * one);
    assert_eq!(
        o.budget.held,
        o.slots.values().map(|s| s.weight).sum::<usize>()
    );
    assert!(o.slots.contains_key(&(Idx::Inodes, "100".into())), "dirty");
    assert!(o.slots.contains_key(&(Idx::Inodes, "199".into())), "newest");
    assert!(
        !o.slots.contains_key(&(Idx::Inodes, "101".into())),
        "oldest"
    );
    // Packed before they leave: more than 30 fit.
    let kept = o.slots.len();
    assert!((31..100).contains(&kept), "{kept} slots kept");
    let mut clean = o.slots.iter().filter(|(k, _)| k.1 != "100");
    assert!(clean.all(|(_, s)| matches!(s.state, State::Packed { .. })));
    let newest = o.get(Idx::Inodes, "199", false).unwrap().unwrap();
    assert_eq!(newest.source["size"], 199, "read as it was");
    // Slots touched within the grace stay past the budget.
    let mut o = Overlay::default();
    assert!(
        o.apply((100..110).map(inode).collect())
            .0
            .iter()
            .all(|r| r.is_ok())
    );
    flush_all(&mut o);
    o.set_budget(0);
    assert_eq!(o.slots.len(), 10);
    // Lock documents never leave: every one without a slot is absent.
    let mut o = budgeted(0);
    let lock = Doc {
        id: "tree/1".into(),
        version: Version {
            seq_no: 1,
            primary_term: 1,
        },
        source: json!({"owner": "a"}).into(),
    };
    o.know_locks(vec![lock]);
    o.trim();
    assert!(matches!(o.get(Idx::Locks, "tree/1", false), Some(Some(_))));
    assert_eq!(o.get(Idx::Locks, "tree/2", false), Some(None));
}

#[test]
fn an_inode_whose_slot_left_is_read_again_not_taken_for_absent() {
    let mut o = budgeted(0);
    let made = o.apply(vec![create(
        Idx::Inodes,
        "30",
        json!({"kind": "file", "mode": 1}),
    )]);
    assert!(made.0[0].is_ok());
    flush_all(&mut o);
    assert!(o.slots.is_empty());
    // A new inode's create needs no read; an update of this one does
    // (before, it was answered NotFound).
    assert!(matches!(
        o.needs(&[create(Idx::Inodes, "31", json!({}))]),
        Need::Nothing
    ));
    let update = BulkOp::Update {
        index: Idx::Inodes,
        id: "30".into(),
        doc: json!({"mode": 2}),
        if_version: None,
    };
    let Need::Fetch(keys) = o.needs(std::slice::from_ref(&update)) else {
        panic!("an evicted inode must be read")
    };
    assert_eq!(
        o.get(Idx::Inodes, "30", false),
        None,
        "the cluster's to answer"
    );
    let real = Version {
        seq_no: 7,
        primary_term: 1,
    };
    let cluster = Doc {
        id: "30".into(),
        version: real,
        source: json!({"kind": "file", "mode": 1}).into(),
    };
    o.budget.grace = EVICT_GRACE;
    o.learn(keys, vec![Some(cluster)], false);
    assert!(o.apply(vec![update]).0[0].is_ok());
    assert_eq!(
        o.get(Idx::Inodes, "30", false).unwrap().unwrap().source["mode"],
        2
    );
    // A caller still holding the local version handed out before the
    // slot left gets a conflict (and retries from a new read), as
    // after another writer's change.
    let mut o = budgeted(0);
    let v = o.apply(vec![create(Idx::Inodes, "32", json!({}))]).0[0]
        .clone()
        .unwrap();
    flush_all(&mut o);
    let put = |v| BulkOp::Index {
        index: Idx::Inodes,
        id: "32".into(),
        source: json!({"mode": 3}),
        if_version: Some(v),
    };
    assert!(matches!(
        o.apply(vec![put(v)]).0[0],
        Err(StoreError::Conflict(_))
    ));
    assert!(
        o.apply(vec![put(real)]).0[0].is_ok(),
        "the cluster's version"
    );
    // A delete of an inode without a slot is taken as done and sent.
    let del = BulkOp::Delete {
        index: Idx::Inodes,
        id: "33".into(),
        if_version: None,
    };
    assert!(o.apply(vec![del]).0[0].is_ok());
    assert_eq!(o.outgoing().ops.len(), 2);
}

#[test]
fn reads_kept_past_the_budget_leave_oldest_first() {
    let mut o = budgeted(usize::MAX);
    let doc = |i: u64| Doc {
        id: format!("{i}"),
        version: Version {
            seq_no: i,
            primary_term: 1,
        },
        source: json!({"kind": "file", "size": i}).into(),
    };
    for i in 0..50 {
        o.remember(
            vec![(Idx::Inodes, i.to_string())],
            vec![Some(doc(i))],
            false,
        );
    }
    let one = o.budget.held / 50;
    o.set_budget(10 * one);
    // (Packed before they leave: more than 10 fit.)
    assert!((11..50).contains(&o.slots.len()), "{} kept", o.slots.len());
    assert!(!o.slots.contains_key(&(Idx::Inodes, "0".into())));
    assert!(o.slots.contains_key(&(Idx::Inodes, "49".into())));
    // Kept reads are read from memory, with the cluster's version.
    assert_eq!(
        o.get(Idx::Inodes, "45", false)
            .unwrap()
            .unwrap()
            .version
            .seq_no,
        45
    );
    assert_eq!(o.get(Idx::Inodes, "1", false), None);
}

#[test]
fn a_bulk_passing_to_the_cluster_holds_off_writes_and_reads_and_updates_clean_slots() {
    let mut o = Overlay::default();
    o.complete.insert(5);
    for name in ["a", "b"] {
        let e = json!({"path": format!("/d/{name}"), "dir": "/d", "kind": "file", "ino": 40});
        o.apply(vec![create(Idx::Entries, &format!("5/{name}"), e)]);
    }
    flush_all(&mut o); // both clean, at the cluster's version 7
    let cluster = Version {
        seq_no: 7,
        primary_term: 1,
    };
    // "5/b" changed again: not sent yet, it cannot pass.
    let b = o.get(Idx::Entries, "5/b", true).unwrap().unwrap().version;
    let touch = BulkOp::Update {
        index: Idx::Entries,
        id: "5/b".into(),
        doc: json!({"size": 3}),
        if_version: Some(b),
    };
    assert!(o.apply(vec![touch]).0[0].is_ok());
    assert!(!o.may_pass(&(Idx::Entries, "5/b".into())));
    let a = (Idx::Entries, "5/a".to_string());
    let unheld = (Idx::Entries, "9/z".to_string());
    assert!(o.may_pass(&a) && o.may_pass(&unheld));
    // "5/a" (held clean, its local version mapped to the cluster's) and
    // "9/z" (not held) pass.
    let local = o.get(Idx::Entries, "5/a", true).unwrap().unwrap().version;
    let moved = |id: &str, v| BulkOp::Update {
        index: Idx::Entries,
        id: id.into(),
        doc: json!({"path": "/e/a", "dir": "/e"}),
        if_version: Some(v),
    };
    let mut sent = vec![moved("5/a", local), moved("9/z", cluster)];
    o.begin_pass(&mut sent);
    let BulkOp::Update { if_version, .. } = &sent[0] else {
        unreachable!()
    };
    assert_eq!(*if_version, Some(cluster), "conditions are the cluster's");
    // Meanwhile a write to either waits, and a read from the cluster is
    // given but not kept (its directory no longer answered from memory).
    assert!(matches!(o.needs(&[moved("9/z", cluster)]), Need::Wait));
    assert!(matches!(o.needs(&[moved("5/a", local)]), Need::Wait));
    let read = Doc {
        id: "9/z".into(),
        version: cluster,
        source: json!({"path": "/x"}).into(),
    };
    o.learn(vec![unheld.clone()], vec![Some(read)], true);
    assert!(!o.has(&unheld));
    // Answered: the held slot takes the update at a new local version
    // (clean: nothing to send), the other stays out of memory.
    let after = Version {
        seq_no: 8,
        primary_term: 1,
    };
    let given = o.passed(&sent, Ok(vec![Ok(after), Ok(after)])).unwrap();
    assert!(is_local(given[0].clone().unwrap()) && given[1] == Ok(after));
    let now = o.get(Idx::Entries, "5/a", true).unwrap().unwrap();
    assert_eq!(now.source["path"], "/e/a");
    assert_eq!(Ok(now.version), given[0]);
    assert!(!o.has(&unheld));
    assert!(matches!(
        o.needs(&[moved("5/a", now.version)]),
        Need::Nothing
    ));
    assert_eq!(o.outgoing().ops.len(), 1, "only 5/b's change is sent");
    // A bulk that failed as a whole leaves its documents to the cluster.
    let mut again = vec![moved("5/a", now.version)];
    o.begin_pass(&mut again);
    let down = StoreError::Other("unreachable".into());
    assert!(o.passed(&again, Err(down)).is_err());
    assert!(!o.has(&a) && !o.whole(5));
}

#[test]
fn much_waiting_wakes_the_flusher_and_only_four_times_as_much_holds_writers() {
    let mut o = Overlay::default();
    o.complete.insert(5);
    let mut made = 0;
    let mut make = |o: &mut Overlay, n: usize| {
        let ops = (made..made + n)
            .map(|k| create(Idx::Entries, &format!("5/f{k}"), json!({})))
            .collect();
        made += n;
        assert!(o.apply(ops).0.iter().all(|r| r.is_ok()));
    };
    make(&mut o, SEND_DIRTY - 1);
    assert_eq!(o.backlog(), Backlog::None);
    make(&mut o, 1);
    assert_eq!(o.backlog(), Backlog::Send);
    make(&mut o, MAX_DIRTY - SEND_DIRTY - 1);
    assert_eq!(o.backlog(), Backlog::Send);
    make(&mut o, 1);
    assert_eq!(o.backlog(), Backlog::Wait);
    // Bytes count too (as the op log counts what it wrote).
    o.outgoing();
    assert_eq!(o.backlog(), Backlog::None);
    o.logged(SEND_DIRTY_BYTES);
    assert_eq!(o.backlog(), Backlog::Send);
    o.logged(MAX_DIRTY_BYTES - SEND_DIRTY_BYTES);
    assert_eq!(o.backlog(), Backlog::Wait);
}

#[test]
fn past_the_budget_slots_are_packed_and_still_answer() {
    let mut o = budgeted(usize::MAX);
    o.complete.insert(1);
    let entry = |path: &str, dir: &str, kind: &str, ino: u64| json!({"path": path, "dir": dir, "kind": kind, "ino": ino, "cookie": ino});
    let chunk = json!({"file": "21", "n": 0, "len": 1, "data": "eA"});
    let made = o.apply(vec![
        create(Idx::Inodes, "20", json!({"kind": "dir"})),
        create(Idx::Entries, "1/d", entry("/d", "/", "dir", 20)),
        create(Idx::Entries, "20/a", entry("/d/a", "/d", "file", 21)),
        create(Idx::Inodes, "21", json!({"kind": "file", "size": 1})),
        BulkOp::Index {
            index: Idx::Chunks,
            id: "21:0".into(),
            source: chunk,
            if_version: None,
        },
    ]);
    assert!(made.0.iter().all(|r| r.is_ok()));
    flush_all(&mut o);
    assert_eq!(o.slots.len(), 5);
    // Names, inodes and small files' bytes are packed before any leaves.
    let whole = o.budget.held;
    let keys: Vec<Key> = o.slots.keys().cloned().collect();
    for k in &keys {
        assert!(o.pack(k));
    }
    assert!(o.budget.held < whole);
    assert_eq!(
        o.budget.held,
        o.slots.values().map(|s| s.weight).sum::<usize>()
    );
    // Reads answer as before, and leave them packed.
    let a = o.get(Idx::Entries, "20/a", false).unwrap().unwrap();
    assert_eq!(a.source, entry("/d/a", "/d", "file", 21).into());
    let listed = o.children(20, &[], false).unwrap();
    assert_eq!(listed[0].to_doc().source, a.source);
    assert_eq!(listed[0].number("cookie"), Some(21), "(kept apart)");
    assert!(matches!(
        o.slots[&(Idx::Entries, "20/a".into())].state,
        State::Packed { .. }
    ));
    // A write unpacks it.
    let touch = BulkOp::Update {
        index: Idx::Inodes,
        id: "21".into(),
        doc: json!({"size": 2}),
        if_version: Some(o.get(Idx::Inodes, "21", false).unwrap().unwrap().version),
    };
    assert!(o.apply(vec![touch]).0[0].is_ok());
    let inode = o.get(Idx::Inodes, "21", false).unwrap().unwrap();
    assert_eq!(inode.source, json!({"kind": "file", "size": 2}).into());
    // The rename's entry step: the directory's entry `from` becomes `to`.
    let move_dir = |o: &mut Overlay, from: &str, to: &str, path: &str| {
        let v = o.get(Idx::Entries, from, false).unwrap().unwrap().version;
        let moved = o.apply(vec![
            BulkOp::Delete {
                index: Idx::Entries,
                id: from.into(),
                if_version: Some(v),
            },
            create(Idx::Entries, to, entry(path, "/", "dir", 20)),
        ]);
        assert!(moved.0.iter().all(|r| r.is_ok()));
    };
    // A rename of the directory (its entries packed) is done in memory.
    move_dir(&mut o, "1/d", "1/e", "/e");
    let keys = rebased(&mut o, "/d", "/e").unwrap();
    assert_eq!(keys, vec![(Idx::Entries, "20/a".to_string())]);
    let a = o.get(Idx::Entries, "20/a", false).unwrap().unwrap();
    assert_eq!(a.source, entry("/e/a", "/e", "file", 21).into());
    assert_eq!(
        o.budget.held,
        o.slots.values().map(|s| s.weight).sum::<usize>()
    );
    // Unpacked for a rename only within the budget: else the cluster's way.
    flush_all(&mut o);
    move_dir(&mut o, "1/e", "1/f", "/f");
    assert!(o.pack(&(Idx::Entries, "20/a".into())));
    o.budget.bytes = o.budget.held + 1;
    assert_eq!(rebased(&mut o, "/e", "/f"), None);
    o.budget.bytes = usize::MAX;
    assert!(rebased(&mut o, "/e", "/f").is_some());
}
