//! `esfs search` on real mounts (embedded store and the Elasticsearch test
//! double): after writes, renames, truncates, overwrites and deletes made
//! with the real tools, its output equals `grep -r`'s (sorted), for many
//! patterns and flags; plus the index-only features (filters, --find,
//! --group-by, --xattr, --json) and grep's exit statuses.

mod common;

use common::*;
use esfs::store::{Idx, MetaStore, Query, SearchRequest};
use std::path::Path;
use std::process::Command;

/// Run `esfs search ARGS` in `dir`: (exit code, stdout, stderr).
fn search(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_esfs"))
        .arg("search")
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run esfs search");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Run `grep ARGS` in `dir`: (exit code, stdout, stderr).
fn grep(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let o = Command::new("grep")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run grep");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The index really narrows: once the indexer has caught up (a quiet second
/// after the last change) the text files are indexed, and a text query
/// finds exactly the files holding it.
fn assert_narrowing(m: &Mount, store: &dyn MetaStore) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let indexed = || {
        // A search makes the mount's writes visible to this reader.
        search(m.path(), &["-q", "anything"]);
        store.refresh(Idx::Entries).unwrap();
        store
            .count(Idx::Entries, &Query::term("text_state", "text"))
            .unwrap()
    };
    let mut text = indexed();
    while text <= 200 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        text = indexed();
    }
    assert!(text > 200, "only {text} files indexed as text");
    let too_large = store
        .count(Idx::Entries, &Query::term("text_state", "too_large"))
        .unwrap();
    assert!(too_large >= 2, "{too_large} too_large");
    let q = Query::Text {
        field: "contents".into(),
        text: "zzzz-moved".into(),
    };
    // The moved file's text (its hard link shares the inode), and both
    // its names pointing at it.
    store.refresh(Idx::Texts).unwrap();
    let inos: Vec<u64> = store
        .search_brief(&SearchRequest {
            index: Idx::Texts,
            query: q,
            sort: vec![],
            search_after: None,
            size: 10,
            past_own_writes: false,
        })
        .unwrap()
        .into_iter()
        .filter_map(|h| h.doc.source["ino"].as_u64())
        .collect();
    assert_eq!(inos.len(), 1, "{inos:?}");
    let names = Query::and(vec![
        Query::term("ino", inos[0]),
        Query::term("text_state", "text"),
    ]);
    assert_eq!(store.count(Idx::Entries, &names).unwrap(), 2);
}

fn sorted(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s.lines().map(String::from).collect();
    v.sort();
    v
}

/// `esfs search ARGS` and `grep -r ARGS` agree: same sorted output (and
/// the same sorted messages), same exit status.
#[track_caller]
fn same_as_grep(dir: &Path, args: &[&str]) -> usize {
    let mut gargs = vec!["-r"];
    gargs.extend_from_slice(args);
    let g = grep(dir, &gargs);
    let e = search(dir, args);
    assert_eq!(
        (e.0, sorted(&e.1)),
        (g.0, sorted(&g.1)),
        "esfs search {args:?} differs from grep -r (stderr: esfs {:?}, grep {:?})",
        e.2,
        g.2
    );
    assert_eq!(sorted(&e.2), sorted(&g.2), "messages of {args:?}");
    g.1.lines().count()
}

/// Patterns and flags compared with grep on the tree at `dir/t`.
fn compare_many(dir: &Path) {
    let cases: &[&[&str]] = &[
        &["-l", "needle", "t"],
        &["-n", "needle", "t"],
        &["-c", "needle", "t"],
        &["-il", "NEEDLE", "t"],
        &["-in", "Hello", "t"],
        &["-wn", "needle", "t"],
        &["-xn", "deep needle", "t"],
        &["-Fl", "a.b*c", "t"],
        &["-Fn", "println!(\"needle\")", "t"],
        &["-El", "needle|spaced", "t"],
        &["-n", "needle\\|private", "t"],
        &["-n", "fn \\(main\\|new\\)", "t"],
        &["-El", "impl [A-Z][a-z]+ for", "t"],
        &["-l", "ee", "t"],
        &["-n", "^use std", "t"],
        &["-wl", "Fs", "t"],
        &["-l", "no such text anywhere", "t"],
        &["-l", "zzzz-moved", "t"],
        &["-n", "renamed content", "t"],
        &["-l", "truncated away", "t"],
        &["-n", "TAIL-MARKER", "t"],
        &["-l", "hello", "t/gen", "t/crate-src"],
        &["-n", "needle", "t/gen/README.txt"],
        &["-l", "needle", "t/gen/"],
        &["-c", "x", "t/gen/one.bin"],
        &["-ic", "STRUCT", "t/crate-src"],
        &["-l", "", "t/gen"],
        &["-h", "needle", "t"],
        &["-H", "needle", "t/gen/a/bee/c/deep.txt"],
    ];
    let mut lines = 0;
    for args in cases {
        lines += same_as_grep(dir, args);
    }
    assert!(
        lines > 100,
        "the comparisons found too little ({lines} lines)"
    );
    // No operand: the current directory, paths printed without "./".
    same_as_grep(&dir.join("t/gen"), &["-n", "needle"]);
    same_as_grep(&dir.join("t"), &["-l", "struct"]);
}

/// The series of changes both backends go through before the comparison.
fn churn(m: &Mount) {
    make_tree(&m.p("t"));
    let t = m.p("t");
    sh_ok(
        &t,
        "set -e
         # generated files
         mkdir -p gen/many
         for i in $(seq 1 200); do printf 'file %s\\nneedle %s\\n' $i $((i % 7)) > gen/many/f$i.txt; done
         # overwrite, append, truncate
         echo 'overwritten, no needle now' > gen/README.txt
         echo 'appended needle line' >> gen/a/b/notes.txt
         printf 'truncated away\\n' > gen/cut.txt; truncate -s 3 gen/cut.txt
         printf 'keep me\\nand truncated away\\n' > gen/cut2.txt; truncate -s 8 gen/cut2.txt
         # renames: a file, a directory (subtree), across directories
         echo 'zzzz-moved needle' > gen/tomove.txt && mv gen/tomove.txt gen/a/moved.txt
         echo 'renamed content' > gen/a/b/c/r.txt
         mv gen/a/b gen/a/bee
         mv gen/many gen/a/bee/many
         # deletes
         rm gen/many 2>/dev/null || true
         rm gen/a/bee/many/f13.txt gen/a/bee/many/f14.txt
         rm -r gen/private
         # hard link and symlink (grep -r does not follow symlinks)
         ln gen/a/moved.txt gen/hardlink.txt
         ln -s a/moved.txt gen/symlink.txt
         # a text file above the index limit, with a match at its end
         head -c 1200000 /dev/zero | tr '\\0' 'x' > gen/big.txt && echo TAIL-MARKER >> gen/big.txt
         # binary with a match
         printf 'bin\\0needle\\n' > gen/bin.dat
         # sed -i (a new file renamed over the old one)
         sed -i 's/deep needle/deep needle edited/' gen/a/bee/c/deep.txt
         # dd in place (same size, no truncate)
         printf 'needle in place\\n' > gen/inplace.txt
         printf 'NEEDLE' | dd of=gen/inplace.txt bs=1 seek=0 conv=notrunc status=none
         # many writes on one open descriptor
         exec 3>gen/fd.txt; for i in 1 2 3; do echo \"line $i needle\" >&3; done; exec 3>&-
         # empty file and directory
         : > gen/empty2.txt; mkdir -p gen/void",
    );
}

#[test]
fn search_equals_grep_on_the_embedded_store() {
    skip_in_plain_mode!("search_equals_grep_on_the_embedded_store");
    let m = Mount::new();
    churn(&m);
    compare_many(m.path());
    let store = esfs::store::embedded::EmbeddedStore::open(&m.store_dir()).unwrap();
    assert_narrowing(&m, &store);
    drop(store);
    // And after a remount (the index persisted, nothing pending).
    let mut m = m;
    m.remount();
    compare_many(m.path());
}

#[test]
fn index_follows_changes_immediately() {
    skip_in_plain_mode!("index_follows_changes_immediately");
    let m = Mount::new();
    let d = m.path();
    let (code, out, _) = search(d, &["-l", "quartz"]);
    assert_eq!((code, out.as_str()), (1, ""));
    std::fs::write(m.p("f.txt"), "rose quartz\n").unwrap();
    assert_eq!(search(d, &["-l", "quartz"]).1, "f.txt\n");
    // Overwrite: the old text no longer matches.
    std::fs::write(m.p("f.txt"), "granite\n").unwrap();
    assert_eq!(search(d, &["-l", "quartz"]).0, 1);
    assert_eq!(search(d, &["-l", "granite"]).1, "f.txt\n");
    // Rename, into a new directory.
    std::fs::create_dir(m.p("dir")).unwrap();
    std::fs::rename(m.p("f.txt"), m.p("dir/g.txt")).unwrap();
    assert_eq!(search(d, &["-l", "granite"]).1, "dir/g.txt\n");
    std::fs::rename(m.p("dir"), m.p("dir2")).unwrap();
    assert_eq!(search(d, &["-ln", "granite"]).1, "dir2/g.txt\n");
    assert_eq!(
        search(d, &["-n", "granite", "dir2"]).1,
        "dir2/g.txt:1:granite\n"
    );
    // Truncate through setattr.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("dir2/g.txt"))
        .unwrap();
    f.set_len(3).unwrap();
    drop(f);
    assert_eq!(search(d, &["-l", "granite"]).0, 1);
    assert_eq!(search(d, &["-l", "gra"]).1, "dir2/g.txt\n");
    // A file open for writing is read even before its close.
    use std::io::Write;
    let mut w = std::fs::File::create(m.p("open.txt")).unwrap();
    w.write_all(b"still open obsidian\n").unwrap();
    w.flush().unwrap();
    let mut w2 = std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("dir2/g.txt"))
        .unwrap();
    w2.write_all(b"obsidian appended\n").unwrap();
    let got = search(d, &["-l", "obsidian"]);
    assert_eq!(sorted(&got.1), ["dir2/g.txt", "open.txt"], "{got:?}");
    drop((w, w2));
    // Delete.
    std::fs::remove_file(m.p("open.txt")).unwrap();
    assert_eq!(search(d, &["-l", "obsidian"]).1, "dir2/g.txt\n");
    // RENAME_EXCHANGE keeps each name with its own text.
    std::fs::write(m.p("x1"), "alpha-text\n").unwrap();
    std::fs::write(m.p("x2"), "omega-text\n").unwrap();
    let (a, b) = (cstr(m.p("x1")), cstr(m.p("x2")));
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(r, 0);
    assert_eq!(search(d, &["-l", "alpha-text"]).1, "x2\n");
    assert_eq!(search(d, &["-l", "omega-text"]).1, "x1\n");
}

#[test]
fn filters_grouping_tags_json_and_statuses() {
    skip_in_plain_mode!("filters_grouping_tags_json_and_statuses");
    let m = Mount::new();
    let d = m.path();
    sh_ok(
        d,
        "set -e
         mkdir -p p/src p/doc q
         printf 'needle\\nneedle\\nneedle\\n' > p/src/a.rs
         printf 'one needle\\n' > p/src/b.rs
         printf 'needle here\\n' > p/doc/readme.md
         printf 'no match\\n' > p/doc/other.md
         head -c 5000 /dev/zero | tr '\\0' 'n' > q/big.txt; echo needle >> q/big.txt
         ln -s src p/link
         setfattr -n user.xdg.tags -v work,urgent p/src/b.rs
         setfattr -n user.xdg.tags -v home p/doc/readme.md
         touch -d '2001-01-01' p/src/a.rs",
    );
    let lines = |args: &[&str]| {
        let (code, out, err) = search(d, args);
        assert!(code == 0 || code == 1, "{args:?}: {code} {err}");
        sorted(&out)
    };
    assert_eq!(
        lines(&["-l", "needle", "--name", "*.rs"]),
        ["p/src/a.rs", "p/src/b.rs"]
    );
    assert_eq!(
        lines(&["-l", "needle", "--name", "readme.md"]),
        ["p/doc/readme.md"]
    );
    assert_eq!(lines(&["-l", "needle", "--size", "+1k"]), ["q/big.txt"]);
    assert_eq!(
        lines(&["-l", "needle", "--size", "-100"]),
        ["p/doc/readme.md", "p/src/a.rs", "p/src/b.rs"]
    );
    assert_eq!(
        lines(&["-l", "needle", "--newer", "2010-01-01", "p"]),
        ["p/doc/readme.md", "p/src/b.rs"]
    );
    assert_eq!(
        lines(&["-l", "needle", "--newer", "p/src/a.rs", "p/src"]),
        ["p/src/b.rs"]
    );
    assert_eq!(
        lines(&["--find", "--type", "d", "p"]),
        ["p", "p/doc", "p/src"]
    );
    assert_eq!(lines(&["--find", "--type", "l"]), ["p/link"]);
    assert_eq!(
        lines(&["--find", "--name", "*.md", "p"]),
        ["p/doc/other.md", "p/doc/readme.md"]
    );
    assert_eq!(
        lines(&["--find", "--xattr", "user.xdg.tags=work"]),
        ["p/src/b.rs"]
    );
    assert_eq!(
        lines(&["--find", "--xattr", "user.xdg.tags=urgent"]),
        ["p/src/b.rs"]
    );
    assert_eq!(
        lines(&["--find", "--xattr", "user.xdg.tags=work,urgent"]),
        ["p/src/b.rs"]
    );
    assert_eq!(
        lines(&["--find", "--xattr", "user.xdg.tags"]),
        ["p/doc/readme.md", "p/src/b.rs"]
    );
    assert_eq!(
        lines(&["-l", "needle", "--xattr", "user.xdg.tags=home"]),
        ["p/doc/readme.md"]
    );
    // Tags follow the file through a rename and go when removed.
    sh_ok(
        d,
        "mv p/src/b.rs p/b2.rs && setfattr -x user.xdg.tags p/doc/readme.md",
    );
    assert_eq!(
        lines(&["--find", "--xattr", "user.xdg.tags=work"]),
        ["p/b2.rs"]
    );
    assert!(lines(&["--find", "--xattr", "user.xdg.tags=home"]).is_empty());
    // --limit
    assert_eq!(lines(&["-l", "needle", "--limit", "2", "p"]).len(), 2);
    assert_eq!(lines(&["-c", "needle", "--limit", "1", "p/src"]).len(), 1);
    // --json
    let (_, out, _) = search(d, &["--json", "needle", "p/src"]);
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(v["path"], "p/src/a.rs");
    assert_eq!(v["lines"].as_array().unwrap().len(), 3);
    assert_eq!(v["lines"][1]["line"], 2);
    assert_eq!(v["lines"][1]["text"], "needle");
    let (_, out, _) = search(d, &["--json", "-c", "needle", "p"]);
    assert_eq!(out.lines().count(), 3);
    // --group-by dir: one bucket per directory, best first, --top hits.
    let (code, out, err) = search(d, &["--group-by", "dir", "--json", "--top", "1", "needle"]);
    assert_eq!(code, 0, "{err}");
    let groups: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let keys: Vec<&str> = groups
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    let mut sorted_keys = keys.clone();
    sorted_keys.sort();
    assert_eq!(sorted_keys, ["p", "p/doc", "p/src", "q"]);
    for g in &groups {
        assert_eq!(g["hits"].as_array().unwrap().len(), 1);
    }
    let scores: Vec<f64> = groups
        .iter()
        .map(|g| g["score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let (code, out, _) = search(d, &["--group-by", "owner", "needle"]);
    assert_eq!(code, 0);
    let uid = unsafe { libc::getuid() };
    assert!(out.starts_with(&format!("{uid} ")), "{out}");
    assert!(out.lines().next().unwrap().ends_with("(4 files)"), "{out}");
    assert_eq!(out.lines().count(), 4, "{out}");
    // Exit statuses like grep: 1 nothing, 2 bad pattern or missing path.
    assert_eq!(search(d, &["-l", "absent-text"]).0, 1);
    assert_eq!(search(d, &["-q", "needle"]).0, 0);
    assert_eq!(search(d, &["-q", "needle"]).1, "");
    let bad = search(d, &["a\\{1", "p"]);
    assert_eq!(bad.0, 2);
    assert_eq!(bad.0, grep(d, &["-r", "a\\{1", "p"]).0);
    let missing = search(d, &["needle", "nope"]);
    assert_eq!(missing.0, 2);
    assert!(missing.2.contains("nope"), "{missing:?}");
    // A path outside any esfs mount is plain grep -r.
    let outside = m.scratch();
    std::fs::write(outside.join("o.txt"), "needle outside\n").unwrap();
    let o = outside.to_str().unwrap();
    same_as_grep(d, &["-n", "needle", o]);
    // Direct store access (no mount involved in the search).
    let store = m.store_dir();
    let (code, out, err) = search(
        d,
        &[
            "-n",
            "--store",
            store.to_str().unwrap(),
            "--data",
            m.data_dir().to_str().unwrap(),
            "needle",
            "/p/doc",
        ],
    );
    assert_eq!(
        (code, out.as_str()),
        (0, "/p/doc/readme.md:1:needle here\n"),
        "{err}"
    );
}

/// A search issued right after a large `cp -a` answers at once, exactly as
/// `grep -r`: files the indexer has not reached yet are scanned, the search
/// does not wait for the backlog (it used to wait 25-36 s after 8785 files).
fn search_right_after_a_large_copy(m: &Mount) {
    sh_ok(m.path(), "cp -a /usr/include/linux inc");
    let o = Command::new(env!("CARGO_BIN_EXE_esfs"))
        .args([
            "search",
            "-rn",
            "SPDX-License-Identifier: GPL-2.0 WITH",
            "inc",
        ])
        .current_dir(m.path())
        .env("RUST_LOG", "debug")
        .output()
        .expect("run esfs search");
    let log = String::from_utf8_lossy(&o.stderr);
    let got = String::from_utf8_lossy(&o.stdout);
    let want = grep(
        m.path(),
        &["-rn", "SPDX-License-Identifier: GPL-2.0 WITH", "inc"],
    )
    .1;
    assert!(!want.is_empty());
    assert_eq!(sorted(&got), sorted(&want));
    // It did not wait: the mount still had files queued for indexing when
    // the search read its description.
    let pending: u64 = log
        .lines()
        .find_map(|l| l.split_once(" changes still being indexed"))
        .and_then(|(before, _)| before.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(pending > 0, "the search waited for the indexer:\n{log}");
}

#[test]
fn search_right_after_a_large_copy_does_not_wait_for_the_indexer() {
    skip_in_plain_mode!("search_right_after_a_large_copy_does_not_wait_for_the_indexer");
    search_right_after_a_large_copy(&Mount::new());
}

// ---------------------------------------------------------------- Elasticsearch

#[test]
fn search_equals_grep_on_elasticsearch() {
    let server = match std::env::var("ESFS_TEST_ES_URL") {
        Ok(_) => None,
        Err(_) => {
            Some(es_test_server::EsTestServer::start("127.0.0.1:0").expect("start test server"))
        }
    };
    let url = std::env::var("ESFS_TEST_ES_URL").unwrap_or_else(|_| server.as_ref().unwrap().url());
    let index = format!("esfs-search-{}", std::process::id());
    let m = Mount::with_backend(&["--es", &url, "--index", &index]);
    churn(&m);
    compare_many(m.path());
    let store =
        esfs::store::es::EsStore::connect(&esfs::store::es::EsConfig::new(&url, &index)).unwrap();
    assert_narrowing(&m, &store);
    // Grouping uses terms + top_hits there.
    let (code, out, err) = search(
        m.path(),
        &["--group-by", "dir", "--top", "2", "needle", "t/gen"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().any(|l| l.starts_with("t/gen/a/bee/many (")),
        "{out}"
    );
    drop(m);
    drop(server);
}

#[test]
fn search_right_after_a_large_copy_on_elasticsearch_does_not_wait() {
    let server = match std::env::var("ESFS_TEST_ES_URL") {
        Ok(_) => None,
        Err(_) => {
            Some(es_test_server::EsTestServer::start("127.0.0.1:0").expect("start test server"))
        }
    };
    let url = std::env::var("ESFS_TEST_ES_URL").unwrap_or_else(|_| server.as_ref().unwrap().url());
    let index = format!("esfs-search-copy-{}", std::process::id());
    let m = Mount::with_backend(&["--es", &url, "--index", &index]);
    search_right_after_a_large_copy(&m);
    drop(m);
    drop(server);
}

/// On a cold Elasticsearch mount the search announces each grep batch to
/// the mount (`user.esfs.read-ahead` on its root), which reads the batch's
/// entries, inodes and small contents in one request: grep's lookups, opens
/// and reads of 40 candidates in 4 directories cost a handful of the mount's
/// requests, not two or more per file. Output as grep's (in path order).
#[test]
fn search_on_a_cold_elasticsearch_mount_reads_ahead() {
    let server = es_test_server::EsTestServer::start("127.0.0.1:0").expect("start test server");
    let index = format!("esfs-search-ra-{}", std::process::id());
    let mut m = Mount::with_backend(&["--es", &server.url(), "--index", &index]);
    sh_ok(
        m.path(),
        "for d in 0 1 2 3; do mkdir -p t/d$d; for f in $(seq 0 99); do \
           if [ $((f % 10)) = 3 ]; then w=needle; else w=hay; fi; \
           printf 'line one\\nthe %s %s %s\\n' $w $d $f > t/d$d/f$f; done; done",
    );
    // Until every file is indexed: then the candidates are the 40 files.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !sh_ok(m.path(), "getfattr --only-values -n user.esfs.flush .").contains("\"pending\":0")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the indexer never caught up"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    m.remount();
    server.set_journaling(true);
    server.take_journal();
    let (code, got, err) = search(m.path(), &["-rn", "needle", "t"]);
    // Document reads: the mount's (the search's own are its store's
    // description and its queries).
    let reads = server
        .take_journal()
        .iter()
        .filter(|r| r.path.contains("/_doc/") || r.path.ends_with("/_mget"))
        .filter(|r| !r.path.contains("-meta/"))
        .count();
    assert_eq!(code, 0, "{err}");
    let want = grep(m.path(), &["-rn", "needle", "t"]).1;
    assert_eq!(got.lines().count(), 40, "{got}");
    assert_eq!(sorted(&got), sorted(&want));
    // Without the hint: an entry, an inode and a piece read per file (120
    // and more). With it: one request for the batch, plus the lookups of
    // the directories on the way (an entry and an inode each).
    assert!(
        reads <= 16,
        "the mount read documents {reads} times for grep's reads of 40 files"
    );
    // The hint stores nothing and is the root's only.
    assert_failure_with(
        "getfattr",
        &sh(m.path(), "getfattr -n user.esfs.read-ahead ."),
        "No such attribute",
    );
    assert_failure_with(
        "setfattr",
        &sh(m.path(), "setfattr -n user.esfs.read-ahead -v '[]' t"),
        "Operation not permitted",
    );
    assert_failure_with(
        "setfattr",
        &sh(m.path(), "setfattr -n user.esfs.read-ahead -v 'not json' ."),
        "Invalid argument",
    );
    drop(m);
    drop(server);
}
