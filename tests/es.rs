//! esfs on the Elasticsearch backend, mounted for real. The server is the
//! in-process wire-protocol test double (`es-test-server`): no Elasticsearch
//! can be installed here. Every test also runs against a real cluster when
//! `ESFS_TEST_ES_URL` points at one.

mod common;

use common::*;
use es_test_server::EsTestServer;
use esfs::store::es::{EsConfig, EsStore};
use serde_json::json;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// The cluster under test: the given real one, or a fresh test double.
struct Cluster {
    _server: Option<EsTestServer>,
    url: String,
}

impl Cluster {
    fn new() -> Cluster {
        match std::env::var("ESFS_TEST_ES_URL") {
            Ok(url) => Cluster { _server: None, url },
            Err(_) => {
                let s = EsTestServer::start("127.0.0.1:0").expect("start test server");
                Cluster {
                    url: s.url(),
                    _server: Some(s),
                }
            }
        }
    }

    fn index(&self) -> String {
        format!(
            "esfs-t{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn mount(&self, index: &str, extra: &[&str]) -> Mount {
        let mut args = vec!["--es", &self.url, "--index", index];
        args.extend_from_slice(extra);
        Mount::with_backend(&args)
    }
}

#[test]
fn everyday_tools_work_on_an_elasticsearch_mount() {
    let c = Cluster::new();
    let m = c.mount(&c.index(), &[]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let d = m.path().display();
    sh_ok(
        m.path(),
        "mkdir -p a/b/c && echo hello > a/b/c/f && cat a/b/c/f",
    );
    sh_ok(
        m.path(),
        &format!(
            "cp -a {} tree && diff -r {} tree",
            src.display(),
            src.display()
        ),
    );
    // grep -r through the mount finds what it finds in the original.
    let (_, here, _) = sh(m.path(), "grep -rl 'fn ' tree | sed 's|^tree/||' | sort");
    let (_, there, _) = sh(&src, "grep -rl 'fn ' . | sed 's|^\\./||' | sort");
    assert_eq!(here, there);
    sh_ok(
        m.path(),
        "mv tree moved && test ! -e tree && diff -r moved ../mnt/moved",
    );
    assert!(fs::read_dir(m.p("moved/store")).unwrap().count() > 2);
    sh_ok(
        m.path(),
        "ln a/b/c/f hard && ln -s a/b/c/f soft && test \"$(cat soft)\" = hello",
    );
    assert_eq!(sh_ok(m.path(), "stat -c %h hard").trim(), "2");
    // A name that is not UTF-8 round-trips through the index.
    let raw = Path::new(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    fs::write(m.p(raw), b"x").unwrap();
    let names: Vec<Vec<u8>> = fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    assert!(names.contains(&b"caf\xe9".to_vec()));
    sh_ok(
        m.path(),
        "git init -q g && cd g && echo x > x && git add x && \
         git -c user.name=t -c user.email=t@t commit -qm init && test -z \"$(git status --porcelain)\"",
    );
    sh_ok(
        m.path(),
        &format!(
            "rsync -a {}/ r/ && rsync -a --itemize-changes {}/ r/ > changes",
            src.display(),
            src.display()
        ),
    );
    assert_eq!(fs::read_to_string(m.p("changes")).unwrap(), "");
    sh_ok(m.path(), "rm -rf moved r g && ls");
    assert!(!m.p("moved").exists(), "in {d}");
}

#[test]
fn two_mounts_of_one_index_share_names_and_contents() {
    let c = Cluster::new();
    let index = c.index();
    let a = c.mount(&index, &[]);
    let b = c.mount(&index, &["--attr-ttl", "0"]);
    // 3 MiB + a bit: several content chunks.
    let big: Vec<u8> = (0..(3 << 20) + 12345)
        .map(|i: u32| (i % 253) as u8)
        .collect();
    fs::write(a.p("big"), &big).unwrap();
    fs::create_dir(a.p("dir")).unwrap();
    fs::write(a.p("dir/small"), b"from a").unwrap();
    assert_eq!(fs::read(b.p("big")).unwrap(), big);
    assert_eq!(fs::read(b.p("dir/small")).unwrap(), b"from a");
    // Changes made through b are seen by a (after its 1 s caches expire).
    fs::rename(b.p("dir"), b.p("renamed")).unwrap();
    fs::write(b.p("renamed/small"), b"from b, longer").unwrap();
    let saw = wait_for(|| fs::read(a.p("renamed/small")).ok() == Some(b"from b, longer".to_vec()));
    assert!(saw, "mount a never saw b's rename and write");
}

#[test]
fn two_mounts_with_a_shared_data_directory() {
    let c = Cluster::new();
    let index = c.index();
    let data = tempfile::tempdir().unwrap();
    let dd = data.path().to_str().unwrap();
    let a = c.mount(&index, &["--data", dd]);
    let b = c.mount(&index, &["--data", dd, "--attr-ttl", "0"]);
    fs::write(a.p("f"), b"shared bytes").unwrap();
    assert_eq!(fs::read(b.p("f")).unwrap(), b"shared bytes");
    assert!(
        fs::read_dir(data.path()).unwrap().count() > 0,
        "contents went to --data"
    );
}

#[test]
fn listings_show_own_writes_at_once_and_other_mounts_writes_soon() {
    let c = Cluster::new();
    let index = c.index();
    let a = c.mount(&index, &[]);
    let b = c.mount(&index, &["--attr-ttl", "0"]);
    for i in 0..50 {
        fs::write(a.p(format!("f{i}")), b"").unwrap();
        // Read-your-writes: the new name is listed immediately.
        let n = fs::read_dir(a.path()).unwrap().count();
        assert_eq!(n, i + 1);
    }
    assert!(wait_for(|| fs::read_dir(b.path()).unwrap().count() == 50));
}

/// `index.refresh_interval` of the filesystem's entries index.
fn set_entries_refresh(url: &str, index: &str, interval: &str) {
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "-f",
            "-X",
            "PUT",
            "-H",
            "content-type: application/json",
        ])
        .arg(format!("{url}/{index}-entries/_settings"))
        .arg("-d")
        .arg(json!({"index": {"refresh_interval": interval}}).to_string())
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// rmdir counts a directory's names without refreshing the index first
/// (issue 34): a mount gives up its shared lock on a directory only once
/// what it wrote there is searchable. With the entries index not
/// refreshing on its own, a name another mount made a moment ago must
/// still keep rmdir out, and one it removed must not.
#[test]
fn rmdir_sees_names_another_mount_just_made_or_removed() {
    let c = Cluster::new();
    let index = c.index();
    let a = c.mount(&index, &[]);
    let b = c.mount(&index, &[]);
    // A mount's first count refreshes (for writes made before it started).
    fs::create_dir(a.p("warm")).unwrap();
    fs::remove_dir(a.p("warm")).unwrap();
    fs::create_dir(a.p("d")).unwrap();
    set_entries_refresh(&c.url, &index, "-1");
    fs::write(b.p("d/x"), b"").unwrap();
    let e = fs::remove_dir(a.p("d")).expect_err("d holds x");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    fs::remove_file(b.p("d/x")).unwrap();
    fs::remove_dir(a.p("d")).unwrap();
    assert!(!b.p("d").exists() || wait_for(|| !b.p("d").exists()));
    set_entries_refresh(&c.url, &index, "1s");
}

/// `POST {url}/{index}-{what}/{endpoint}` with `body` after a refresh of
/// that index: the answer.
fn refreshed(url: &str, index: &str, what: &str, endpoint: &str, body: &str) -> serde_json::Value {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "curl -sS -f -X POST '{url}/{index}-{what}/_refresh' >/dev/null && \
             curl -sS -f -H 'content-type: application/json' '{url}/{index}-{what}/{endpoint}' \
             -d '{body}'"
        ))
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Inode documents kept as orphans (unlinked while in use), searched after
/// a refresh.
fn orphans(url: &str, index: &str) -> u64 {
    let q = json!({"query": {"term": {"orphan": true}}}).to_string();
    refreshed(url, index, "inodes", "_count", &q)["count"]
        .as_u64()
        .unwrap()
}

/// A removed directory's inode stays while the kernel uses it (a shell's
/// working directory: `stat .` still answers), and goes once it is
/// forgotten: removed directories' inodes are deleted together by the
/// write-back, not one request per rmdir.
#[test]
fn a_removed_directory_lives_while_used_and_goes_once_forgotten() {
    let c = Cluster::new();
    let index = c.index();
    let a = c.mount(&index, &[]);
    for i in 0..20 {
        fs::create_dir(a.p(format!("d{i}"))).unwrap();
    }
    let out = sh_ok(
        a.path(),
        "cd d0 && rmdir ../d0 && stat -c %h . && ls -a . | wc -l",
    );
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["0", "0"],
        "{out}"
    );
    for i in 1..20 {
        fs::remove_dir(a.p(format!("d{i}"))).unwrap();
    }
    assert!(wait_for(|| orphans(&c.url, &index) == 0), "orphans left");
    assert_eq!(fs::read_dir(a.path()).unwrap().count(), 0);
}

#[test]
fn a_directory_of_30k_entries_lists_completely() {
    let c = Cluster::new();
    let index = c.index();
    // Not holding the delegation: the documents are written behind the
    // mount's back (no lock session recalls it), and a directory the mount
    // made is listed from its memory while it holds it.
    let m = c.mount(&index, &["--no-delegate"]);
    fs::create_dir(m.p("big")).unwrap();
    let dir_ino = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(m.p("big")).unwrap().ino()
    };
    // Write the documents 30k creates would write, in bulk (fast), then
    // list through the mount: three times the 10k search window.
    let store = EsStore::connect(&EsConfig::new(&c.url, &index)).unwrap();
    let n = 30_000u64;
    bulk_files(&store, dir_ino, "/big", n);
    let out = sh_ok(m.p("big"), "ls -f | wc -l");
    assert_eq!(out.trim(), (n + 2).to_string());
    let out = sh_ok(m.p("big"), "ls -l | tail -n +2 | wc -l");
    assert_eq!(out.trim(), n.to_string());
}

/// fsck (and every other scan) pages through more than one page of inodes:
/// it used to send the same point-in-time search forever once an index held
/// more than 1000 inodes (the page size).
#[test]
fn fsck_pages_through_more_than_a_thousand_inodes() {
    let c = Cluster::new();
    let index = c.index();
    let mut m = c.mount(&index, &[]);
    let n = 1100;
    fs::create_dir(m.p("d")).unwrap();
    let dir_ino = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(m.p("d")).unwrap().ino()
    };
    m.unmount();
    // The documents 1100 creates would write, in bulk (through the mount,
    // on the suite's debug build, they took half a minute).
    let store = EsStore::connect(&EsConfig::new(&c.url, &index)).unwrap();
    bulk_files(&store, dir_ino, "/d", n);
    esfs::store::MetaStore::refresh(&store, esfs::store::Idx::Inodes).unwrap();
    let out = std::process::Command::new("timeout")
        .arg("120")
        .arg(env!("CARGO_BIN_EXE_esfs"))
        .args(["fsck", "--es", &c.url, "--index", &index])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "fsck:\n{text}");
    // The files, their directory and the root: each inode read once.
    let want = format!("{} entries, {} inodes, 0 problem(s)", n + 1, n + 2);
    assert!(text.contains(&want), "want {want:?}:\n{text}");
}

/// A mount killed while it holds tree locks (Elasticsearch: The Definitive
/// Guide, chapter "Handling Relationships", "Tree Locking"; shared counts on
/// the ancestors of what it just renamed) leaves lock documents behind;
/// another mount's janitor removes them, and the dead session, once the
/// session is dead: its process gone from this machine (on another machine,
/// once its lease lapsed). They used to stay until someone ran fsck --repair.
#[test]
fn a_killed_mounts_locks_are_reaped_once_its_session_is_dead() {
    use esfs::locks::manager::LockManager;
    let c = Cluster::new();
    let index = c.index();
    let mut a = c.mount(&index, &[]);
    let b = c.mount(&index, &[]);
    let store = EsStore::connect(&EsConfig::new(&c.url, &index)).unwrap();
    let owner_of = |mnt: &Path| -> String {
        let docs = LockManager::list(&store).unwrap();
        docs.iter()
            .find(|(_, _, d)| d["type"] == "session" && d["mount"] == mnt.to_str().unwrap())
            .and_then(|(_, _, d)| d["owner"].as_str().map(String::from))
            .unwrap_or_else(|| panic!("no session for {}: {docs:?}", mnt.display()))
    };
    let dead = owner_of(a.path());
    let mentions = |owner: &str| -> Vec<String> {
        LockManager::list(&store)
            .unwrap()
            .into_iter()
            .filter(|(_, _, d)| d["owner"] == owner || d["holders"].get(owner).is_some())
            .map(|(id, _, _)| id)
            .collect()
    };
    a.kill9_right_after("mkdir -p x/y/z && touch x/y/z/f && mv x/y/z/f x/y/z/g");
    esfs::store::MetaStore::refresh(&store, esfs::store::Idx::Locks).unwrap();
    let left = mentions(&dead);
    assert!(
        left.iter().any(|id| id.starts_with("tree/")),
        "the killed mount held tree locks: {left:?}"
    );
    // Its process is gone: one janitor period (20 s), with margin.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !mentions(&dead).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        mentions(&dead),
        Vec::<String>::new(),
        "still there after 60 s"
    );
    // The survivor can take those locks (rename inside the same tree).
    sh_ok(b.path(), "mv x/y/z/g x/y/z/h && test -e x/y/z/h");
}

#[test]
fn a_lost_server_gives_etimedout_then_the_mount_recovers() {
    if std::env::var("ESFS_TEST_ES_URL").is_ok() {
        eprintln!("needs the test double to stop the server; skipped against a real cluster");
        return;
    }
    let mut server = EsTestServer::start("127.0.0.1:0").unwrap();
    let url = server.url();
    let m = Mount::with_backend(&[
        "--es",
        &url,
        "--index",
        "lost",
        "--es-timeout",
        "2",
        "--attr-ttl",
        "0",
        // The synchronous path: a delegated mount acknowledges a create in
        // a directory it holds whole from memory and its op log, and
        // sends it once the server is back.
        "--no-delegate",
    ]);
    fs::write(m.p("kept"), b"acknowledged").unwrap();
    server.stop();
    let t = Instant::now();
    let err = fs::write(m.p("new"), b"x").unwrap_err();
    // ETIMEDOUT, not EIO: the store is away, no data is damaged.
    assert_eq!(err.raw_os_error(), Some(libc::ETIMEDOUT), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "failed, but only after {:?}",
        t.elapsed()
    );
    assert!(
        m.log().contains("unavailable"),
        "log says why:\n{}",
        m.log()
    );
    server.restart().unwrap();
    // The same mount works again, and nothing acknowledged was lost.
    assert!(wait_for(|| fs::write(m.p("after"), b"y").is_ok()));
    assert_eq!(fs::read(m.p("kept")).unwrap(), b"acknowledged");
    assert_eq!(fs::read(m.p("after")).unwrap(), b"y");
}

#[test]
fn a_write_applied_but_unanswered_is_not_refused_when_retried() {
    if std::env::var("ESFS_TEST_ES_URL").is_ok() {
        eprintln!("needs the test double to lose answers; skipped against a real cluster");
        return;
    }
    let server = EsTestServer::start("127.0.0.1:0").unwrap();
    // Each write's own request (the delegation would batch them).
    let m = Mount::with_backend(&[
        "--es",
        &server.url(),
        "--index",
        "lost-answers",
        "--no-delegate",
    ]);
    fs::create_dir(m.p("d")).unwrap();
    // A node that dies right after applying a request: the retry of a create
    // finds the document its first attempt made and must not see EEXIST.
    for i in 0..6 {
        server.lose_next_answers(1);
        let name = format!("d/f{i}");
        fs::write(m.p(&name), format!("body {i}")).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    server.lose_next_answers(1);
    fs::rename(m.p("d/f0"), m.p("d/g0")).unwrap();
    server.lose_next_answers(1);
    sh_ok(m.path(), "mkdir -p e/f && cp -a d e/f/");
    for i in 1..6 {
        assert_eq!(
            fs::read_to_string(m.p(format!("e/f/d/f{i}"))).unwrap(),
            format!("body {i}")
        );
    }
    assert_eq!(fs::read_to_string(m.p("d/g0")).unwrap(), "body 0");
    assert!(
        m.log().contains("had landed"),
        "the retries met their own writes:\n{}",
        m.log()
    );
}

#[test]
fn a_bulk_elasticsearch_replayed_after_a_primary_died_is_not_refused() {
    if std::env::var("ESFS_TEST_ES_URL").is_ok() {
        eprintln!("needs the test double to replay bulks; skipped against a real cluster");
        return;
    }
    let server = EsTestServer::start("127.0.0.1:0").unwrap();
    // Each write's own bulk (the delegation would batch them).
    let mut m = Mount::with_backend(&[
        "--es",
        &server.url(),
        "--index",
        "replayed-bulks",
        "--no-delegate",
    ]);
    fs::create_dir(m.p("d")).unwrap();
    // Each bulk below is applied, then applied again and answered from the
    // second run: its creates and conditional writes come back 409 for the
    // documents they just wrote, in a clean 200 (tests/cluster.rs saw `cp -a`
    // fail with EEXIST that way when a node was killed).
    for i in 0..4 {
        server.replay_next_bulks(1);
        let name = format!("d/f{i}");
        fs::write(m.p(&name), format!("body {i}")).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            server.replays_pending(),
            0,
            "the create's bulk was replayed"
        );
    }
    server.replay_next_bulks(1);
    fs::create_dir(m.p("d/sub")).unwrap();
    assert_eq!(server.replays_pending(), 0);
    // The parent's link count went up once: its conditional write came
    // back 409 from the replay and was taken for another writer's, then
    // done again on a fresh read (tests/cluster.rs's fsck: "nlink 6,
    // should be 5").
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(m.p("d")).unwrap().nlink(),
        3,
        "d holds one directory"
    );
    // (Renames and removals under a replay are not covered: their lock and
    // conditional writes carry no fresh id to tell their own copy by, which
    // needs a write id per logical write; creates do: the new inode number.)
    fs::rename(m.p("d/f0"), m.p("d/g0")).unwrap();
    fs::remove_file(m.p("d/f1")).unwrap();
    server.replay_next_bulks(3);
    sh_ok(m.path(), "cp -a d e");
    assert_eq!(server.replays_pending(), 0);
    for i in 2..4 {
        assert_eq!(
            fs::read_to_string(m.p(format!("e/f{i}"))).unwrap(),
            format!("body {i}")
        );
    }
    assert_eq!(fs::read_to_string(m.p("d/g0")).unwrap(), "body 0");
    assert!(!m.p("d/f1").exists());
    assert!(m.p("e/sub").is_dir());
    assert_eq!(
        fs::metadata(m.p("e")).unwrap().nlink(),
        3,
        "e holds one directory"
    );
    m.unmount();
    let out = std::process::Command::new("timeout")
        .arg("120")
        .arg(env!("CARGO_BIN_EXE_esfs"))
        .args(["fsck", "--es", &server.url(), "--index", "replayed-bulks"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains(" 0 problem(s)"),
        "fsck after the replays:\n{text}"
    );
}

/// Entries of `index` below `dir` (`path.tree`) whose text is indexed.
fn indexed_below(url: &str, index: &str, dir: &str) -> u64 {
    let q = json!({"query": {"bool": {"must": [{"term": {"path.tree": dir}},
                                               {"term": {"text_state": "text"}}]}}})
    .to_string();
    refreshed(url, index, "entries", "_count", &q)["count"]
        .as_u64()
        .unwrap()
}

/// Single-document reads of `index`'s entries or inodes by `caller` in `log`.
fn doc_reads(log: &[es_test_server::Logged], index: &str, caller: &str) -> usize {
    log.iter()
        .filter(|r| r.method == "GET" && r.opaque_id.as_deref() == Some(caller))
        .filter(|r| {
            [
                format!("/{index}-entries/_doc/"),
                format!("/{index}-inodes/_doc/"),
            ]
            .iter()
            .any(|p| r.path.starts_with(p.as_str()))
        })
        .count()
}

/// What another writer does between a read and a write (here the test
/// double overtaking the conditional writes of one caller: the document
/// written again just before each) is redone in rounds, not one document
/// at a time: the content indexer's claims on the entries of a batch of
/// files, and a directory rename's page of paths. Both met this together
/// on three Elasticsearch nodes (bench/scale: a rename of 100k files
/// crossing an indexer batch), each conflict a read and a bulk of its own.
#[test]
fn conditional_writes_overtaken_are_redone_in_rounds() {
    if std::env::var("ESFS_TEST_ES_URL").is_ok() {
        eprintln!("needs the test double to overtake writes; skipped against a real cluster");
        return;
    }
    let server = EsTestServer::start("127.0.0.1:0").unwrap();
    let (url, index) = (server.url(), "overtaken");
    // Each write its own bulk, and the rename the cluster's way (pages).
    let m = Mount::with_backend(&["--es", &url, "--index", index, "--no-delegate"]);
    let n = 300;
    server.set_journaling(true);
    // Every claim the indexer sends is overtaken once.
    let entries = format!("{index}-entries");
    server.overtake_next_items(n, &entries, Some("esfs/indexer"));
    sh_ok(
        m.path(),
        &format!("mkdir d && for i in $(seq {n}); do echo needle $i > d/f$i; done"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while indexed_below(&url, index, "/d") < n as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(indexed_below(&url, index, "/d"), n as u64);
    assert_eq!(
        server.overtakes_pending(),
        0,
        "the claims were not overtaken"
    );
    let reads = doc_reads(&server.take_journal(), index, "esfs/indexer");
    assert!(
        reads <= 10,
        "{reads} single reads redoing {n} overtaken claims"
    );
    // The rename's page of 300 entries is overtaken: every entry is redone
    // after the page.
    server.overtake_next_items(n, &entries, Some("esfs/fs"));
    sh_ok(m.path(), "mv d e");
    assert_eq!(
        server.overtakes_pending(),
        0,
        "the rename was not overtaken"
    );
    let log = server.take_journal();
    let reads = doc_reads(&log, index, "esfs/fs");
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for r in &log {
        let p: Vec<&str> = r.path.splitn(4, '/').collect();
        *kinds
            .entry(format!(
                "{} {:?} {}/{}",
                r.method,
                r.opaque_id,
                p.get(1).unwrap_or(&""),
                p.get(2).unwrap_or(&"")
            ))
            .or_default() += 1;
    }
    assert!(
        reads <= 30,
        "{reads} single reads redoing an overtaken rename of {n}: {kinds:#?}"
    );
    assert_eq!(
        sh_ok(m.path(), "find e -type f | wc -l").trim(),
        n.to_string()
    );
    assert_eq!(indexed_below(&url, index, "/e"), n as u64);
    let q = json!({"query": {"term": {"path.tree": "/d"}}}).to_string();
    assert_eq!(refreshed(&url, index, "entries", "_count", &q)["count"], 0);
}

#[test]
fn a_backlog_of_contents_is_read_with_its_names_not_file_by_file() {
    // Files the mount did not just write out (here a mount killed before
    // its indexer ran; at scale, a backlog past what the data store keeps
    // of the closes): their bytes come with the batch's names, one request,
    // not a GET of each file's chunk.
    if std::env::var("ESFS_TEST_ES_URL").is_ok() {
        eprintln!("counts requests on the test double; skipped against a real cluster");
        return;
    }
    let server = EsTestServer::start("127.0.0.1:0").unwrap();
    let (url, index) = (server.url(), "backlog");
    let mut m = Mount::with_backend(&["--es", &url, "--index", index, "--no-delegate"]);
    let n = 300;
    m.kill9_right_after(&format!(
        "mkdir d && for i in $(seq {n}); do echo needle $i > d/f$i; done && sync"
    ));
    assert_eq!(
        indexed_below(&url, index, "/d"),
        0,
        "indexed before the kill"
    );
    server.set_journaling(true);
    m.start_again();
    let deadline = Instant::now() + Duration::from_secs(60);
    while indexed_below(&url, index, "/d") < n as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(indexed_below(&url, index, "/d"), n as u64);
    let chunk = format!("/{index}-chunks/_doc/");
    let gets = server
        .take_journal()
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with(&chunk))
        .count();
    assert!(gets <= 10, "{gets} chunk reads indexing {n} files");
    let esfs = env!("CARGO_BIN_EXE_esfs");
    let hits = sh_ok(m.path(), &format!("{esfs} search -l needle d | wc -l"));
    assert_eq!(hits.trim(), n.to_string());
}

#[test]
fn a_directory_rename_holds_the_content_indexer_off() {
    // The indexer's batches and a rename's pages write the same entries and
    // share the engine: while a subtree is rewritten, no batch starts.
    if std::env::var("ESFS_TEST_ES_URL").is_ok() {
        eprintln!("needs the test double's latency; skipped against a real cluster");
        return;
    }
    let server = EsTestServer::start("127.0.0.1:0").unwrap();
    let (url, index) = (server.url(), "held-off");
    let m = Mount::with_backend(&["--es", &url, "--index", index, "--no-delegate"]);
    let n = 200;
    sh_ok(
        m.path(),
        &format!("mkdir d && for i in $(seq {n}); do echo needle $i > d/f$i; done"),
    );
    // Within the indexer's quiet second after the writes, a rename slowed
    // past it (every request 300 ms): the quiet second ends inside the
    // rename, and a batch would start there.
    server.set_latency(Duration::from_millis(300));
    server.set_journaling(true);
    let t = Instant::now();
    sh_ok(m.path(), "mv d e");
    let took = t.elapsed();
    let log = server.take_journal();
    server.set_journaling(false);
    server.set_latency(Duration::ZERO);
    assert!(
        took > Duration::from_secs(2),
        "the rename took only {took:?}"
    );
    let indexer = log
        .iter()
        .filter(|r| r.opaque_id.as_deref() == Some("esfs/indexer"))
        .count();
    let seq: Vec<String> = log
        .iter()
        .map(|r| format!("{} {:?} {}", r.method, r.opaque_id, r.path))
        .collect();
    assert_eq!(
        indexer, 0,
        "indexer requests during the rename ({took:?}): {seq:#?}"
    );
    // And it indexes the files afterwards, at their new paths.
    let deadline = Instant::now() + Duration::from_secs(60);
    while indexed_below(&url, index, "/e") < n as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(indexed_below(&url, index, "/e"), n as u64);
}

#[test]
fn overload_answers_are_retried() {
    if std::env::var("ESFS_TEST_ES_URL").is_ok() {
        return;
    }
    let server = EsTestServer::start("127.0.0.1:0").unwrap();
    let m = Mount::with_backend(&["--es", &server.url(), "--index", "busy"]);
    server.fail_next(3, 429);
    fs::write(m.p("f"), b"after 429s").unwrap();
    server.fail_next(2, 503);
    assert_eq!(fs::read(m.p("f")).unwrap(), b"after 429s");
}

#[test]
fn an_unreachable_server_fails_the_mount_fast_with_one_line() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let mnt = tempfile::tempdir().unwrap();
    // Its log goes here, not into the real home (whose old log may draw a
    // warning line).
    let home = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_esfs"))
        .args(["mount", mnt.path().to_str().unwrap(), "--es", &url])
        .env("XDG_DATA_HOME", home.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(t.elapsed() < Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&url) && err.contains("Connection refused"),
        "{err}"
    );
}

#[test]
fn indices_of_another_format_are_refused() {
    let c = Cluster::new();
    let index = c.index();
    // Someone else's index under our name.
    let other = format!("{index}-entries");
    let agent = ureq::agent();
    agent
        .put(&format!("{}/{other}", c.url))
        .send_json(json!({"mappings": {"properties": {"x": {"type": "keyword"}}}}))
        .unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_esfs"))
        .args([
            "mount",
            mnt.path().to_str().unwrap(),
            "--es",
            &c.url,
            "--index",
            &index,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&other) && err.contains("not created by this esfs"),
        "{err}"
    );
}

/// Poll for up to 5 s (other mounts see changes within refresh_interval +
/// the kernel TTL, about 2 s).
fn wait_for(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// `cp` within an Elasticsearch mount copies inside the chunk store
/// (COPY_FILE_RANGE), quietly: see `check_copy_file_range`.
#[test]
fn cp_within_an_elasticsearch_mount_copies_in_the_data_store() {
    let c = Cluster::new();
    let mut m = c.mount(&c.index(), &[]);
    check_copy_file_range(&mut m);
}

/// `du` of a sparse file on Elasticsearch counts the chunks stored: see
/// `check_sparse_blocks`.
#[test]
fn du_counts_the_chunks_a_sparse_file_stores() {
    let c = Cluster::new();
    let mut m = c.mount(&c.index(), &[]);
    check_sparse_blocks(&mut m);
}

/// A brief read of many entries (a listing, a rename's scan, a directory
/// read whole) takes their fields from the index's columns (doc values),
/// and a keyword longer than a column keeps (8191 characters) has none:
/// an entry whose path is longer is read again from its source. A
/// directory renamed above such paths rebases them all.
#[test]
fn a_rename_rebases_paths_longer_than_the_index_keeps_in_columns() {
    let c = Cluster::new();
    let index = c.index();
    let m = c.mount(&index, &[]);
    // 40 levels of 250-character names: the deepest paths pass 10 000
    // characters (relative steps: one syscall's path stops at 4096 bytes).
    sh_ok(
        m.path(),
        "mkdir top && cd top && d=$(printf 'd%.0s' $(seq 250)) && \
         for i in $(seq 40); do mkdir $d && cd $d; done && echo deep > deepfile",
    );
    sh_ok(m.path(), "mv top moved");
    let (_, found, _) = sh(m.path(), "find moved -name deepfile | wc -l");
    assert_eq!(found.trim(), "1");
    let agent = ureq::agent();
    agent
        .post(&format!("{}/{index}-entries/_refresh", c.url))
        .send_empty()
        .unwrap();
    let v: serde_json::Value = agent
        .post(&format!("{}/{index}-entries/_search", c.url))
        .send_json(json!({"query": {"term": {"name": "deepfile"}}}))
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    let path = v["hits"]["hits"][0]["_source"]["path"].as_str().unwrap();
    assert!(path.len() > 10_000, "{}", path.len());
    assert!(path.starts_with("/moved/d") && path.ends_with("/deepfile"));
}

/// An index made before a field was declared gains it at the next mount
/// (a mapping only grows, so mounts of the earlier version go on using it).
#[test]
fn a_mount_maps_the_fields_declared_since_the_index_was_made() {
    let c = Cluster::new();
    let index = c.index();
    let mut body = esfs::store::es::index_body(esfs::store::Idx::Entries, 0);
    let props = body["mappings"]["properties"].as_object_mut().unwrap();
    assert!(props.remove("text_mtime_ns").is_some());
    let agent = ureq::agent();
    let entries = format!("{}/{index}-entries", c.url);
    agent.put(&entries).send_json(&body).unwrap();
    let m = c.mount(&index, &[]);
    sh_ok(m.path(), "echo x > f && ls -l f");
    let v: serde_json::Value = agent
        .get(&format!("{entries}/_mapping"))
        .call()
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    let props = &v[format!("{index}-entries")]["mappings"]["properties"];
    assert_eq!(props["text_mtime_ns"], json!({"type": "long"}));
    assert_eq!(props["name"]["type"], "keyword");
}

/// The texts in the cluster (`texts` refreshed first): (inode, seq_no) by
/// inode.
fn texts(url: &str, index: &str) -> Vec<(u64, u64)> {
    let q = json!({"size": 100, "seq_no_primary_term": true, "sort": [{"ino": "asc"}],
                   "_source": ["ino"]})
    .to_string();
    refreshed(url, index, "texts", "_search", &q)["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["_source"]["ino"].as_u64().unwrap(),
                h["_seq_no"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// A file's text for search is a document of its own (`texts`, one per
/// inode), written by the indexer only: a directory rename rewrites the
/// entries below it and leaves their texts as they are (on Elasticsearch a
/// partial update indexes the whole document again, so text in the
/// entries made renames of text files 1.7-3x slower); the search finds the
/// files at their new paths; a removed file's text goes with its inode,
/// and fsck finds nothing left over.
#[test]
fn texts_stay_apart_from_the_entries_a_rename_rewrites() {
    let c = Cluster::new();
    let index = c.index();
    let mut m = c.mount(&index, &[]);
    sh_ok(
        m.path(),
        "mkdir -p d/e && for i in 1 2 3; do echo \"needle $i\" > d/e/f$i; done && echo other > d/g",
    );
    // Indexed once the mount has been quiet for a second.
    let deadline = Instant::now() + Duration::from_secs(60);
    while texts(&c.url, &index).len() < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let before = texts(&c.url, &index);
    assert_eq!(before.len(), 4, "{before:?}");
    let esfs = env!("CARGO_BIN_EXE_esfs");
    sh_ok(m.path(), "mv d top");
    let found = sh_ok(m.path(), &format!("{esfs} search -l needle top | sort"));
    assert_eq!(found, "top/e/f1\ntop/e/f2\ntop/e/f3\n");
    assert_eq!(texts(&c.url, &index), before, "the rename rewrote texts");
    sh_ok(m.path(), "rm top/e/f1 && cat top/e/f2");
    let deadline = Instant::now() + Duration::from_secs(30);
    while texts(&c.url, &index).len() != 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        texts(&c.url, &index).len(),
        3,
        "the removed file's text stayed"
    );
    let found = sh_ok(m.path(), &format!("{esfs} search -l needle top | sort"));
    assert_eq!(found, "top/e/f2\ntop/e/f3\n");
    m.unmount();
    let fsck = |extra: &[&str]| {
        let out = std::process::Command::new("timeout")
            .arg("120")
            .arg(esfs)
            .args(["fsck", "--es", &c.url, "--index", &index])
            .args(extra)
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let report = fsck(&[]);
    assert!(report.contains(" 0 problem(s)"), "fsck:\n{report}");
    // A text whose file is gone (its mount died between the two writes):
    // found, and removed by --repair.
    sh_ok(
        m.path().parent().unwrap(),
        &format!(
            "curl -sS -f -X PUT -H 'content-type: application/json' \
             '{}/{index}-texts/_doc/999999?refresh=true' \
             -d '{{\"ino\": 999999, \"mtime_ns\": 1, \"contents\": \"left over\"}}'",
            c.url
        ),
    );
    let report = fsck(&[]);
    assert!(
        report.contains("text of inode 999999 belongs to no file"),
        "fsck:\n{report}"
    );
    let report = fsck(&["--repair"]);
    assert!(report.contains("1 repair(s)"), "fsck --repair:\n{report}");
    assert_eq!(texts(&c.url, &index).len(), 3);
}
