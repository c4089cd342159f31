//! A node lost mid-work: two mounts of one index on a three-node
//! Elasticsearch cluster (`scripts/engine start elasticsearch --nodes 3`,
//! one replica per index) copy a source tree, rename directories and files
//! and append with fsync while nodes in turn, the elected master first,
//! are killed with `kill -9` and brought back, then while the others
//! restart one by one (each node is lost once a round). Nothing
//! acknowledged may be lost (a close, an fsync, a completed rename), no
//! operation may fail, and fsck is clean after.
//!
//! It needs the cluster: `ESFS_TEST_CLUSTER=elasticsearch` (the engine name
//! `scripts/engine` knows it by) with `ESFS_TEST_ES_URL` listing every node.
//! `scripts/test` starts one and runs this; elsewhere the test says it was
//! skipped. `ESFS_TEST_CLUSTER_KILLS` is how many nodes are killed before the
//! rolling restart: 1 in CI (the elected master), 3 for every node;
//! `ESFS_TEST_CLUSTER_ROUNDS` repeats the whole sequence (the longer run in
//! docs/testing.md). The mounts outlive the default test watchdog: run it
//! with `ESFS_TEST_WATCHDOG_SECS=3600`.

mod common;

use common::*;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

fn engine(args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/engine");
    let out = Command::new(script).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "scripts/engine {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A node's number (1-based, as scripts/engine counts) from its name.
fn node_number(name: &str) -> usize {
    name.rsplit('-').next().unwrap().parse().unwrap()
}

fn master(url: &str) -> usize {
    let body: serde_json::Value = ureq::get(format!("{url}/_cat/master?format=json"))
        .call()
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    node_number(body[0]["node"].as_str().unwrap())
}

/// Wait until the cluster has all three nodes and every shard copy again.
fn wait_green(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        let health = ureq::get(format!(
            "{url}/_cluster/health?wait_for_status=green&wait_for_nodes=3&timeout=5s"
        ))
        .call();
        if let Ok(mut r) = health {
            let v: serde_json::Value = r.body_mut().read_json().unwrap();
            if v["status"] == "green" && v["timed_out"] == false {
                return;
            }
        }
        thread::sleep(Duration::from_millis(500));
    }
    panic!("the cluster did not turn green again within 300 s");
}

/// One mount's work until told to stop: rounds of (copy a source tree,
/// rename a file and the copy's directory, append a line with fsync).
/// Returns what was acknowledged: the lines appended, the directories that
/// completed their rename, and the slowest single step.
struct Acked {
    lines: Vec<String>,
    dirs: Vec<PathBuf>,
    /// The slowest round, and the slowest append + fsync alone.
    slowest: Duration,
    slowest_fsync: Duration,
}

fn work(mnt: PathBuf, me: &'static str, src: PathBuf, stop: Arc<AtomicBool>) -> Acked {
    let mut acked = Acked {
        lines: Vec::new(),
        dirs: Vec::new(),
        slowest: Duration::ZERO,
        slowest_fsync: Duration::ZERO,
    };
    let log = mnt.join(format!("log-{me}"));
    let mut round = 0;
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let copy = mnt.join(format!("{me}-copy-{round}"));
        sh_ok(&mnt, &format!("cp -a {} {}", src.display(), copy.display()));
        fs::write(copy.join("note"), format!("{me} {round}")).unwrap();
        fs::rename(copy.join("note"), copy.join("note-moved")).unwrap();
        let done = mnt.join(format!("{me}-done-{round}"));
        fs::rename(&copy, &done).unwrap();
        acked.dirs.push(done);
        let line = format!("{me} line {round}");
        let t_fsync = Instant::now();
        let mut f = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o644)
            .open(&log)
            .unwrap();
        writeln!(f, "{line}").unwrap();
        f.sync_all().unwrap();
        acked.slowest_fsync = acked.slowest_fsync.max(t_fsync.elapsed());
        acked.lines.push(line);
        acked.slowest = acked.slowest.max(t.elapsed());
        round += 1;
    }
    acked
}

#[test]
fn nothing_acknowledged_is_lost_when_nodes_die_and_restart() {
    let (Ok(name), Ok(urls)) = (
        std::env::var("ESFS_TEST_CLUSTER"),
        std::env::var("ESFS_TEST_ES_URL"),
    ) else {
        eprintln!(
            "skipped: needs a three-node cluster (ESFS_TEST_CLUSTER=elasticsearch and \
             ESFS_TEST_ES_URL=every node's URL; scripts/test starts one)"
        );
        return;
    };
    let first = urls.split(',').next().unwrap().to_string();
    let index = format!("esfs-cluster{}", std::process::id());
    // A master election on a loaded 2-core machine can take tens of seconds:
    // the retry budget rides through it instead of failing the syscall.
    let args = ["--es", &urls, "--index", &index, "--es-timeout", "120"];
    let a = Mount::with_backend(&args);
    let b = Mount::with_backend(&args);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = [(a.path().to_path_buf(), "a"), (b.path().to_path_buf(), "b")]
        .into_iter()
        .map(|(mnt, me)| {
            let (src, stop) = (src.clone(), stop.clone());
            thread::spawn(move || work(mnt, me, src, stop))
        })
        .collect();

    let setting = |var: &str, default: usize| -> usize {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (kills, rounds) = (
        setting("ESFS_TEST_CLUSTER_KILLS", 1).min(3),
        setting("ESFS_TEST_CLUSTER_ROUNDS", 1),
    );
    for _ in 0..rounds {
        // Nodes in turn, the elected master first.
        let m = master(&first);
        let order: Vec<usize> = std::iter::once(m)
            .chain((1..=3).filter(|&n| n != m))
            .take(kills)
            .collect();
        for &n in &order {
            thread::sleep(Duration::from_secs(3));
            let t = Instant::now();
            engine(&["kill", &name, &n.to_string()]);
            thread::sleep(Duration::from_secs(5));
            engine(&["start-node", &name, &n.to_string()]);
            wait_green(&urls_without(&urls, n));
            eprintln!("node {n} (killed with -9) back, green in {:?}", t.elapsed());
        }
        // A rolling restart of the others: each node is lost once a round
        // (a node's restart under two busy mounts takes ~45 s on 2 cores;
        // one more of a node just killed would test nothing new).
        for n in (1..=3).filter(|n| !order.contains(n)) {
            let t = Instant::now();
            engine(&["stop-node", &name, &n.to_string()]);
            engine(&["start-node", &name, &n.to_string()]);
            wait_green(&urls_without(&urls, n));
            eprintln!("node {n} restarted, green in {:?}", t.elapsed());
        }
    }
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<Acked> = workers.into_iter().map(|w| w.join().unwrap()).collect();

    // Read everything back through the other mount (a's work through b, b's
    // through a): what one acknowledged is in the cluster, not in its cache.
    for (acked, (me, reader)) in acked.iter().zip([("a", &b), ("b", &a)]) {
        eprintln!(
            "mount {me}: {} rounds acknowledged; slowest round {:?}, slowest append + fsync {:?}",
            acked.lines.len(),
            acked.slowest,
            acked.slowest_fsync
        );
        assert!(acked.lines.len() >= 3, "mount {me} made almost no progress");
        let log = fs::read_to_string(reader.p(format!("log-{me}"))).unwrap();
        for line in &acked.lines {
            assert!(log.lines().any(|l| l == line), "acknowledged {line:?} lost");
        }
        for dir in &acked.dirs {
            let there = reader.p(dir.file_name().unwrap());
            let diff = sh(
                reader.path(),
                &format!("diff -r {} {}", src.display(), there.display()),
            );
            // the copy plus the one file the round added and renamed
            assert!(
                diff.2.is_empty() && diff.1.lines().all(|l| l.starts_with("Only in ")),
                "{} differs from the source:\n{}{}",
                there.display(),
                diff.1,
                diff.2
            );
            assert!(
                there.join("note-moved").exists(),
                "{}: rename lost",
                there.display()
            );
        }
    }
    drop(a);
    drop(b);
    let out = Command::new(env!("CARGO_BIN_EXE_esfs"))
        .args(["fsck", "--es", &urls, "--index", &index])
        .output()
        .unwrap();
    let report =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fsck after the outages:\n{report}");
    assert!(
        report.contains("0 problem(s)"),
        "fsck after the outages:\n{report}"
    );
}

/// The URLs minus node n's (asked while it may still be starting).
fn urls_without(urls: &str, n: usize) -> String {
    let rest: Vec<&str> = urls
        .split(',')
        .enumerate()
        .filter(|(i, _)| i + 1 != n)
        .map(|(_, u)| u)
        .collect();
    rest[0].to_string()
}
