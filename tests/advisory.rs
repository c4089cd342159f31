//! Advisory locks through FUSE: flock(2) and fcntl(2) byte ranges, between
//! processes on one mount and across mounts of one Elasticsearch index.

mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

/// Hold a lock on `file` for `secs` in a child process (`how` is `flock`
/// or `fcntl`); returns once the lock is held.
fn hold(file: &Path, how: &str, secs: u32) -> Child {
    let ready = file.with_extension("ready");
    let script = format!(
        "import fcntl, os, sys, time\n\
         f = open({file:?}, 'a')\n\
         if {how:?} == 'flock': fcntl.flock(f, fcntl.LOCK_EX)\n\
         else: fcntl.lockf(f, fcntl.LOCK_EX, 10, 0)\n\
         open({ready:?}, 'w').close()\n\
         time.sleep({secs})\n"
    );
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if ready.exists() {
            return child;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("lock holder did not start");
}

/// Whether a non-blocking lock attempt on `file` succeeds.
fn try_lock(file: &Path, how: &str) -> bool {
    let script = format!(
        "import fcntl, sys\n\
         f = open({file:?}, 'a')\n\
         try:\n\
         \x20   if {how:?} == 'flock': fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n\
         \x20   else: fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)\n\
         except OSError: sys.exit(1)\n"
    );
    Command::new("python3")
        .arg("-c")
        .arg(script)
        .status()
        .unwrap()
        .success()
}

#[test]
fn flock_and_fcntl_exclude_other_processes() {
    let m = Mount::new();
    for how in ["flock", "fcntl"] {
        let f = m.p(format!("{how}.lock"));
        std::fs::write(&f, b"").unwrap();
        let mut holder = hold(&f, how, 2);
        assert!(
            !try_lock(&f, how),
            "{how}: a second process must not get the lock"
        );
        holder.wait().unwrap();
        assert!(
            try_lock(&f, how),
            "{how}: free again after the holder exits"
        );
    }
}

/// On the embedded store (one mount) the kernel keeps the lock tables, as
/// Linux does for local filesystems: flock and fcntl locks are independent.
#[test]
fn flock_and_fcntl_are_independent_on_one_mount() {
    // On Elasticsearch both kinds live in the store's one lock table (they
    // must hold across mounts), as NFS emulates flock with fcntl locks.
    embedded_only!("flock_and_fcntl_are_independent_on_one_mount");
    let m = Mount::new();
    let f = m.p("both.lock");
    std::fs::write(&f, b"").unwrap();
    let mut holder = hold(&f, "flock", 2);
    assert!(!try_lock(&f, "flock"), "flock held");
    assert!(
        try_lock(&f, "fcntl"),
        "an fcntl lock is not blocked by a flock"
    );
    holder.wait().unwrap();
}

#[test]
fn locks_hold_across_two_mounts_of_one_index() {
    // A fresh index on the real engine (ESFS_TEST_ES_URL) or the test double.
    let es = es_backend_args();
    let es: Vec<&str> = es.iter().map(String::as_str).collect();
    let a = Mount::with_backend(&es);
    let b = Mount::with_backend(&[&es[..], &["--attr-ttl", "0"]].concat());
    for how in ["flock", "fcntl"] {
        let name = format!("{how}.lock");
        std::fs::write(a.p(&name), b"").unwrap();
        let mut holder = hold(&a.p(&name), how, 3);
        assert!(
            !try_lock(&b.p(&name), how),
            "{how}: held through mount a, refused through b"
        );
        holder.wait().unwrap();
        assert!(
            try_lock(&b.p(&name), how),
            "{how}: released on close, free through b"
        );
    }
}
