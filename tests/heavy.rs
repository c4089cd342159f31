//! Heavy everyday use: git, cargo, rsync --delete, tar with hard links and
//! symlinks, cp -a of thousands of files, and a `tail -f` style reader
//! following a writer.

mod common;

use common::*;
use std::fs;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const GIT: &str = "git -c user.name=t -c user.email=t@example.com -c init.defaultBranch=main \
                   -c advice.detachedHead=false -c gc.auto=0";

#[test]
fn git_clone_status_checkout_gc() {
    let m = Mount::new();
    let origin = m.scratch().join("origin");
    fs::create_dir(&origin).unwrap();
    sh_ok(
        &origin,
        &format!(
            "{GIT} init -q . && mkdir -p src docs && for i in $(seq 1 40); do echo \"line $i\" > src/f$i.txt; done \
             && echo '#!/bin/sh' > run.sh && chmod +x run.sh && ln -s src/f1.txt link \
             && {GIT} add -A && {GIT} commit -qm one \
             && {GIT} checkout -qb other && echo changed > src/f1.txt && git rm -q src/f2.txt \
             && echo new > docs/only-on-other.txt && {GIT} add -A && {GIT} commit -qm two \
             && {GIT} checkout -q main && for i in $(seq 1 20); do echo $i >> src/f3.txt; {GIT} commit -qam c$i; done"
        ),
    );
    let t = Instant::now();
    sh_ok(
        m.path(),
        &format!("{GIT} clone -q --no-local {} repo", origin.display()),
    );
    let repo = m.p("repo");
    assert_eq!(sh_ok(&repo, "git status --porcelain"), "");
    assert!(sh_ok(&repo, "git status").contains("nothing to commit, working tree clean"));
    assert_eq!(
        fs::read_link(repo.join("link")).unwrap().to_str(),
        Some("src/f1.txt")
    );
    assert_eq!(sh_ok(&repo, "stat -c %a run.sh").trim(), "755");

    sh_ok(&repo, &format!("{GIT} checkout -q other"));
    assert_eq!(
        fs::read_to_string(repo.join("src/f1.txt")).unwrap(),
        "changed\n"
    );
    assert!(!repo.join("src/f2.txt").exists());
    assert!(repo.join("docs/only-on-other.txt").is_file());
    assert_eq!(sh_ok(&repo, "git status --porcelain"), "");

    // A local change, a commit, then gc (packs, prunes, rewrites refs).
    sh_ok(
        &repo,
        &format!("echo edit >> src/f5.txt && {GIT} commit -qam edit"),
    );
    sh_ok(&repo, &format!("{GIT} checkout -q main"));
    sh_ok(&repo, &format!("{GIT} gc -q --prune=now --aggressive"));
    assert_eq!(
        sh_ok(&repo, "ls .git/objects/pack/*.pack | wc -l").trim(),
        "1"
    );
    sh_ok(&repo, "git fsck --strict --no-progress");
    assert_eq!(sh_ok(&repo, "git status --porcelain"), "");
    assert_eq!(sh_ok(&repo, "git log --oneline | wc -l").trim(), "21");
    assert_eq!(
        sh_ok(&repo, "git log --oneline other | wc -l").trim(),
        "3",
        "the branch survived gc"
    );
    eprintln!("git clone/status/checkout/gc: {:?}", t.elapsed());
    // Everything is still there after a remount.
    let mut m = m;
    m.remount();
    sh_ok(
        m.p("repo"),
        "git fsck --strict --no-progress && git status --porcelain",
    );
}

#[test]
fn cargo_build_of_a_small_crate() {
    let m = Mount::new();
    let c = m.p("hello");
    fs::create_dir_all(c.join("src")).unwrap();
    fs::write(
        c.join("Cargo.toml"),
        "[package]\nname = \"hello\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n",
    )
    .unwrap();
    fs::write(
        c.join("src/main.rs"),
        "mod util;\nfn main() { println!(\"hello {}\", util::answer()); }\n",
    )
    .unwrap();
    fs::write(c.join("src/util.rs"), "pub fn answer() -> u32 { 42 }\n").unwrap();
    let t = Instant::now();
    // target/ inside the mount too: rustc writes, renames and links there.
    let cmd =
        "unset CARGO_TARGET_DIR RUSTFLAGS; cargo build -q --offline -j2 && ./target/debug/hello";
    assert_eq!(sh_ok(&c, cmd), "hello 42\n");
    // An incremental rebuild after a change.
    fs::write(c.join("src/util.rs"), "pub fn answer() -> u32 { 43 }\n").unwrap();
    assert_eq!(sh_ok(&c, cmd), "hello 43\n");
    eprintln!("cargo build (twice): {:?}", t.elapsed());
}

#[test]
fn rsync_delete_twice_transfers_nothing_the_second_time() {
    let m = Mount::new();
    let src = m.scratch().join("tree");
    make_tree(&src);
    let dst = m.p("copy");
    let rs = |extra: &str| {
        sh_ok(
            m.path(),
            &format!(
                "rsync -a --delete --stats {extra} {}/ {}/",
                src.display(),
                dst.display()
            ),
        )
    };
    fs::create_dir(&dst).unwrap();
    fs::write(dst.join("stale.txt"), b"to be deleted").unwrap();
    fs::create_dir_all(dst.join("stale_dir/x")).unwrap();
    let first = rs("");
    assert!(!dst.join("stale.txt").exists() && !dst.join("stale_dir").exists());
    assert!(
        !first.contains("Number of regular files transferred: 0\n"),
        "{first}"
    );
    let r = sh(
        m.path(),
        &format!(
            "diff -r --no-dereference {} {}",
            src.display(),
            dst.display()
        ),
    );
    assert_success("diff -r", &r);

    let second = rs("--itemize-changes");
    assert!(
        second.contains("Number of regular files transferred: 0\n"),
        "{second}"
    );
    assert!(second.contains("Number of deleted files: 0\n"), "{second}");
    // With -i, any file or attribute update would print a line before the stats.
    let changes: Vec<&str> = second
        .lines()
        .take_while(|l| !l.is_empty())
        .filter(|l| !l.starts_with("Number of") && !l.trim().is_empty())
        .collect();
    assert!(changes.is_empty(), "second run changed {changes:?}");

    // A deletion on the source is mirrored.
    sh_ok(&src, "rm -r gen/a/b && rm gen/one.bin");
    let third = rs("");
    assert!(third.contains("Number of deleted files: "), "{third}");
    assert!(!dst.join("gen/a/b").exists() && !dst.join("gen/one.bin").exists());
    assert!(dst.join("gen/a/empty_leaf").is_dir());
}

/// tar out of a local tree into the mount and back out again: modes, times
/// (to the second — tar's default format), symlinks and hard links survive.
#[test]
fn tar_round_trip_with_hard_links_symlinks_times() {
    let m = Mount::new();
    let src = m.scratch().join("tree");
    make_tree(&src);
    sh_ok(
        &src,
        "ln gen/README.txt gen/hard1 && ln gen/README.txt gen/a/hard2 && ln -s /etc/hostname abs_link \
         && chmod 4755 gen/exec.sh && chmod 1777 gen/empty_dir && touch -h -d '2001-02-03 04:05:06' gen/link_to_readme \
         && touch -d '1999-12-31 23:59:59' gen/a/b/notes.txt gen/a",
    );
    let listing = "find . -printf '%y %m %n %s %Ts %p -> %l\\n' | sed 's/^d \\([0-9]*\\) [0-9]* [0-9]*/d \\1/' | LC_ALL=C sort";
    let want = sh_ok(&src, listing);
    let tarball = m.scratch().join("t.tar");
    sh_ok(&src, &format!("tar -cf {} .", tarball.display()));
    let inmnt = m.p("x");
    fs::create_dir(&inmnt).unwrap();
    sh_ok(&inmnt, &format!("tar -xpf {}", tarball.display()));
    let got = sh_ok(&inmnt, listing);
    // tar stores whole seconds (the listing uses %Ts).
    assert_eq!(got, want);
    assert_eq!(
        sh_ok(
            &inmnt,
            "stat -c %i gen/README.txt gen/hard1 gen/a/hard2 | sort -u | wc -l"
        )
        .trim(),
        "1",
        "hard links share one inode"
    );
    // And back out: tar from the mount, extract locally, compare.
    let back = m.scratch().join("back");
    fs::create_dir(&back).unwrap();
    sh_ok(
        m.path(),
        &format!("tar -C x -cf - . | tar -C {} -xpf -", back.display()),
    );
    assert_eq!(sh_ok(&back, listing), want);
    let r = sh(
        m.path(),
        &format!(
            "diff -r --no-dereference {} {}",
            src.display(),
            back.display()
        ),
    );
    assert_success("diff -r", &r);
}

#[test]
fn cp_a_of_thousands_of_files() {
    let m = Mount::new();
    let src = m.scratch().join("many");
    fs::create_dir(&src).unwrap();
    for d in 0..30 {
        let dir = src.join(format!("d{d:02}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..100 {
            fs::write(
                dir.join(format!("f{f:03}.txt")),
                format!("{d} {f}\n").repeat(f + 1),
            )
            .unwrap();
        }
    }
    sh_ok(
        &src,
        "chmod 600 d00/* && chmod 750 d01 && ln -s d00/f000.txt top_link && touch -d '2010-01-01' d05/*",
    );
    let t = Instant::now();
    sh_ok(m.path(), &format!("cp -a {} copy", src.display()));
    let took = t.elapsed();
    let listing = "find . -printf '%y %m %s %T@ %p -> %l\\n' | sed 's/^d \\([0-9]*\\) [0-9]*/d \\1/' | LC_ALL=C sort";
    assert_eq!(sh_ok(m.p("copy"), listing), sh_ok(&src, listing));
    let r = sh(
        m.path(),
        &format!("diff -r --no-dereference {} copy", src.display()),
    );
    assert_success("diff -r", &r);
    eprintln!("cp -a of 3000 files: {took:?}");
    if !m.is_plain() {
        // fsck on the live store: a start line with the counts on stderr,
        // then the verdict.
        let r = sh(
            m.path(),
            &format!(
                "{} fsck {}",
                env!("CARGO_BIN_EXE_esfs"),
                m.store_args().join(" ")
            ),
        );
        assert_success("esfs fsck", &r);
        // root + copy + 30 dirs + 3000 files + 1 symlink
        assert!(
            r.2.contains("fsck: checking 3033 inodes and 3032 entries..."),
            "{}",
            r.2
        );
        assert!(r.1.contains("0 problem(s)"), "{}", r.1);
    }
}

/// One writer appending lines with pauses; a `tail -f` process and several
/// readers holding their own descriptors follow it. Everyone sees every byte.
#[test]
fn tail_f_follows_a_writer_and_concurrent_readers_agree() {
    let m = Mount::new();
    let path = m.p("app.log");
    fs::write(&path, b"").unwrap();
    let out = m.scratch().join("tail.out");
    let mut tail = std::process::Command::new("tail")
        .args(["-n", "+1", "-F", "-s", "0.1"])
        .arg(&path)
        .stdout(fs::File::create(&out).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = 200;
    let expect: String = (0..lines)
        .map(|i| format!("line {i:04} {}\n", "x".repeat(i % 50)))
        .collect();
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let path = path.clone();
            let total = expect.len();
            std::thread::spawn(move || {
                let mut f = fs::File::open(&path).unwrap();
                let mut got = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut buf = [0u8; 4096];
                while got.len() < total && Instant::now() < deadline {
                    match f.read(&mut buf).unwrap() {
                        0 => std::thread::sleep(Duration::from_millis(5)),
                        n => got.extend_from_slice(&buf[..n]),
                    }
                }
                got
            })
        })
        .collect();
    {
        let mut w = fs::OpenOptions::new().append(true).open(&path).unwrap();
        for (i, l) in expect.split_inclusive('\n').enumerate() {
            w.write_all(l.as_bytes()).unwrap();
            if i % 20 == 0 {
                w.sync_data().unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    for r in readers {
        let got = r.join().unwrap();
        assert_eq!(String::from_utf8(got).unwrap(), expect);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while fs::read(&out).unwrap().len() < expect.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = tail.kill();
    let _ = tail.wait();
    assert_eq!(fs::read_to_string(&out).unwrap(), expect, "tail -F output");
    assert_eq!(fs::read_to_string(&path).unwrap(), expect);
}

/// An appending writer while other descriptors of the file open and close
/// in a loop (what `tail -F` does every poll) and a reader follows: each
/// close persists and lets go of the file's in-memory size while writes
/// are in flight. No write may be lost or land at a wrong offset.
#[test]
fn appends_survive_concurrent_opens_and_closes() {
    let m = Mount::new();
    let path = m.p("churn.log");
    fs::write(&path, b"").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churners: Vec<_> = (0..2)
        .map(|_| {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut f = fs::File::open(&path).unwrap();
                    let mut b = [0u8; 64];
                    let _ = f.read(&mut b).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let expect: String = (0..4000)
        .map(|i| format!("{i:05} {}\n", "y".repeat(i % 37)))
        .collect();
    {
        let mut w = fs::OpenOptions::new().append(true).open(&path).unwrap();
        for l in expect.split_inclusive('\n') {
            w.write_all(l.as_bytes()).unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opens: u64 = churners.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(opens > 10, "the churners ran ({opens} opens)");
    assert_eq!(fs::read_to_string(&path).unwrap(), expect);
    assert_eq!(fs::metadata(&path).unwrap().len(), expect.len() as u64);
}
