//! Several mounts hammering one tree at once: the case of Elasticsearch: The
//! Definitive Guide, chapter "Handling Relationships" ("Solving Concurrency
//! Issues": one renames
//! /clinton with everything below it while another renames
//! /clinton/projects/elasticsearch/README.txt), plus creates, unlinks and
//! mkdir/rmdir, from three mount processes of one Elasticsearch index (the
//! test double). Afterwards fsck must be clean and every mount must list the
//! same tree.

mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TOPS: [&str; 2] = ["clinton", "bill"];

/// Whichever of the two names the big directory has right now.
fn top(m: &Path) -> Option<PathBuf> {
    TOPS.iter().map(|t| m.join(t)).find(|p| p.exists())
}

fn listing(m: &Path) -> String {
    sh_ok(m, "find . -printf '%y %p %s\\n' | sort")
}

#[test]
fn concurrent_renames_creates_and_unlinks_from_three_mounts() {
    // A fresh index on the real engine (ESFS_TEST_ES_URL) or the test double.
    let mut args = es_backend_args();
    args.extend(["--attr-ttl".to_string(), "0".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mounts: Vec<Mount> = (0..3).map(|_| Mount::with_backend(&args)).collect();
    let a = mounts[0].path().to_path_buf();
    sh_ok(
        &a,
        "mkdir -p clinton/projects/elasticsearch clinton/docs && \
               echo readme > clinton/projects/elasticsearch/README.txt && \
               for i in $(seq 200); do echo $i > clinton/docs/f$i; done",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    let mut spawn = |m: PathBuf, work: fn(&Path, u64)| {
        let (stop, done) = (stop.clone(), done.clone());
        workers.push(std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                work(&m, i);
                i += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    };
    // Mount 0 renames the whole tree back and forth.
    spawn(mounts[0].path().into(), |m, _| {
        if let Some(t) = top(m) {
            let other = if t.ends_with("clinton") {
                "bill"
            } else {
                "clinton"
            };
            let _ = fs::rename(&t, m.join(other));
        }
    });
    // Mount 1 renames the README inside it, the Definitive Guide's second user.
    spawn(mounts[1].path().into(), |m, _| {
        if let Some(t) = top(m) {
            let d = t.join("projects/elasticsearch");
            let (x, y) = (d.join("README.txt"), d.join("README.asciidoc"));
            let _ = fs::rename(&x, &y).or_else(|_| fs::rename(&y, &x));
        }
    });
    // Mount 2 creates and unlinks files, and makes and removes directories.
    spawn(mounts[2].path().into(), |m, i| {
        if let Some(t) = top(m) {
            let f = t.join(format!("docs/new{}", i % 20));
            if fs::write(&f, b"x").is_ok() && i % 3 == 0 {
                let _ = fs::remove_file(&f);
            }
            let d = t.join(format!("projects/d{}", i % 5));
            let _ = fs::create_dir(&d).or_else(|_| fs::remove_dir(&d));
        }
    });
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(8));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let ops = done.load(Ordering::Relaxed);
    eprintln!("{ops} operations in {:?}", start.elapsed());
    assert!(ops > 20, "the mounts made progress ({ops} ops)");

    // Other mounts' changes show within refresh interval + TTL.
    std::thread::sleep(Duration::from_secs(3));
    let want = listing(mounts[0].path());
    for m in &mounts[1..] {
        assert_eq!(listing(m.path()), want, "every mount lists the same tree");
    }
    let t = top(&a).expect("the tree still exists under one of its names");
    assert_eq!(
        fs::read_dir(t.join("docs"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('f')
            })
            .count(),
        200,
        "no original file lost or duplicated"
    );
    let readme = ["README.txt", "README.asciidoc"]
        .iter()
        .filter(|n| t.join("projects/elasticsearch").join(n).exists())
        .count();
    assert_eq!(readme, 1, "the README exists under exactly one name");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_esfs"))
        .arg("fsck")
        .args(&args[..4]) // --es URL --index NAME
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "fsck clean while mounts are live:\n{text}"
    );
}
