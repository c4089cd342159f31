//! The tree's delegation (`esfs mount --delegate`, docs/delegations.md): a
//! mount that is its filesystem's only one acknowledges changes from memory
//! and its op log and sends them in batches; another mount's start recalls
//! it; `kill -9` loses nothing acknowledged (the next delegated mount on the
//! machine replays the log). On the test double, whose request journal
//! tells the syscall path (`esfs/fs`) from the flusher (`esfs/writeback`).

mod common;

use common::*;
use es_test_server::EsTestServer;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

struct Setup {
    server: EsTestServer,
    index: String,
    state: tempfile::TempDir,
    /// Contents in a directory: the delegation is about metadata (chunk
    /// documents in the cluster are written by the data store directly).
    data: tempfile::TempDir,
}

impl Setup {
    fn new(name: &str) -> Setup {
        Setup {
            server: EsTestServer::start("127.0.0.1:0").unwrap(),
            index: format!("dg{name}{}", std::process::id()),
            state: tempfile::tempdir().unwrap(),
            data: tempfile::tempdir().unwrap(),
        }
    }

    fn args(&self, delegate: bool) -> Vec<String> {
        let data = self.data.path().display().to_string();
        let mut a: Vec<String> = [
            "--es",
            &self.server.url(),
            "--index",
            &self.index,
            "--data",
            &data,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if delegate {
            a.push("--delegate".into());
            a.push("--state-dir".into());
            a.push(self.state.path().display().to_string());
        } else {
            a.push("--no-delegate".into());
        }
        a
    }

    fn mount(&self, delegate: bool) -> Mount {
        let args = self.args(delegate);
        Mount::with_backend(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    }

    /// A mount holding the delegation with `--delegate-memory MIB`.
    fn mount_with_memory(&self, mib: u32) -> Mount {
        let mut args = self.args(true);
        args.extend(["--delegate-memory".to_string(), mib.to_string()]);
        Mount::with_backend(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    }

    /// What mount `m` acknowledged is in the cluster (an fsync of its
    /// root sends everything pending), and past what exceeds its memory
    /// budget has left: three times the grace that keeps what was just
    /// touched (a slot holding text leaves in two steps, a grace apart).
    fn sent_and_left(&self, m: &Mount) {
        sh_ok(m.path(), "sync .");
        std::thread::sleep(Duration::from_secs(6));
    }

    /// Requests of each component since the last call: (syscall path, flusher).
    fn requests(&self) -> (usize, usize) {
        let j = self.server.take_journal();
        if std::env::var_os("ESFS_TEST_SHOW").is_some() {
            for r in j
                .iter()
                .filter(|r| r.opaque_id.as_deref() == Some("esfs/fs"))
            {
                eprintln!("  fs: {} {}", r.method, r.path);
            }
        }
        let of = |who: &str| {
            j.iter()
                .filter(|r| r.opaque_id.as_deref() == Some(who))
                .count()
        };
        (of("esfs/fs"), of("esfs/writeback"))
    }

    /// The cluster's answer (after a refresh) to a search for the entries
    /// at `path`.
    fn search_path(&self, path: &str) -> serde_json::Value {
        let base = format!("{}/{}-entries", self.server.url(), self.index);
        ureq::post(format!("{base}/_refresh")).send_empty().unwrap();
        ureq::post(format!("{base}/_search"))
            .send_json(serde_json::json!({"query": {"term": {"path": path}}}))
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap()
    }

    /// How many entries in the cluster have `path`.
    fn paths(&self, path: &str) -> u64 {
        self.search_path(path)["hits"]["total"]["value"]
            .as_u64()
            .unwrap()
    }

    /// The indexed text of the file at `path` (its entry says "text", and
    /// its inode's document in `texts` holds it); `None` if it has none.
    fn text(&self, path: &str) -> Option<String> {
        let body = self.search_path(path);
        let hit = &body["hits"]["hits"][0]["_source"];
        assert!(hit.is_object(), "no entry at {path}: {body}");
        if hit["text_state"] != "text" {
            return None;
        }
        let ino = hit["ino"].as_u64().unwrap();
        let url = format!("{}/{}-texts/_doc/{ino}", self.server.url(), self.index);
        let doc: serde_json::Value = ureq::get(url).call().ok()?.body_mut().read_json().unwrap();
        doc["_source"]["contents"].as_str().map(str::to_string)
    }

    /// The op log files left in the state directory.
    fn logs(&self) -> usize {
        walk(self.state.path())
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .count()
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn source() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/fs")
}

fn same_tree(a: &Path, b: &Path) {
    let out = std::process::Command::new("diff")
        .arg("-r")
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} differs from {}:\n{}",
        b.display(),
        a.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_delegated_mount_writes_without_waiting_and_a_second_mount_recalls_it() {
    let s = Setup::new("r");
    let a = s.mount(true);
    s.server.set_journaling(true);
    let src = source();
    let files = walk(&src).len();
    s.requests();
    sh_ok(a.path(), &format!("cp -a {} tree", src.display()));
    // The flusher's next round (every 200 ms) sends it.
    std::thread::sleep(Duration::from_millis(1000));
    let (fs_path, flushed) = s.requests();
    eprintln!(
        "cp -a of {files} files: {fs_path} requests on the syscall path, {flushed} by the flusher"
    );
    // Only reads: whether the copy's name is free in the root (which
    // existed before), the id allocator, and a first look at each
    // directory's lock document; every name below is decided from memory.
    // Without the delegation every file costs at least one request.
    assert!(
        fs_path <= 6,
        "{fs_path} requests on the syscall path for {files} files; log:\n{}",
        a.log()
    );
    assert!(flushed >= 1, "nothing reached the cluster");
    assert_eq!(s.logs(), 1, "the delegated mount keeps one op log");

    // A second mount's start recalls the delegation: everything is there.
    let b = s.mount(false);
    same_tree(&src, &b.p("tree"));
    // Both mounts now write to the cluster, and see each other's changes
    // within the attribute TTL.
    fs::write(b.p("tree/from-b"), "b\n").unwrap();
    fs::write(a.p("tree/from-a"), "a\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = fs::read_to_string(a.p("tree/from-b")).ok() == Some("b\n".into())
            && fs::read_to_string(b.p("tree/from-a")).ok() == Some("a\n".into());
        if seen {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the mounts do not see each other's files"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (fs_path, _) = s.requests();
    assert!(fs_path > 0, "after the recall the syscall path sends");
    assert_eq!(
        s.logs(),
        0,
        "a mount that gave the delegation back keeps no log"
    );
}

#[test]
fn kill_9_of_a_delegated_mount_loses_nothing_it_acknowledged() {
    let s = Setup::new("k");
    let mut a = s.mount(true);
    let src = source();
    // Killed the moment the copy and a rename are acknowledged: some of it
    // is only in the op log.
    a.kill9_right_after(&format!(
        "cp -a {} tree\nmv tree/mod.rs tree/renamed.rs\necho last > tree/marker",
        src.display()
    ));
    // (Two generations when the kill fell inside a flush: the new one is
    // begun before the acknowledged flush deletes the old.)
    assert!(
        (1..=2).contains(&s.logs()),
        "the op log outlives the mount: {} logs",
        s.logs()
    );
    // The next delegated mount on this machine waits out the dead mount's
    // session, then replays its log before serving.
    a.start_again();
    assert_eq!(
        fs::read_to_string(a.p("tree/marker")).unwrap(),
        "last\n",
        "the last change before the kill"
    );
    assert!(!a.p("tree/mod.rs").exists());
    fs::rename(a.p("tree/renamed.rs"), a.p("tree/mod.rs")).unwrap();
    fs::remove_file(a.p("tree/marker")).unwrap();
    same_tree(&src, &a.p("tree"));
    // And another mount sees the same.
    let b = s.mount(false);
    same_tree(&src, &b.p("tree"));
}

#[test]
fn a_subtree_renamed_in_memory_replays_to_its_new_paths_after_kill_9() {
    let s = Setup::new("m");
    let mut a = s.mount(true);
    let src = source();
    // Both renames are decided in the overlay (every directory below was
    // made under the delegation), the outer one after part of the copy
    // was flushed, the inner one just before the kill: the log holds the
    // outer one's path rewrites, and of the inner one, whose rewrite is
    // logged with its end after it answered, nearly always only its
    // intent and tree locks, rolled forward at the next start.
    a.kill9_right_after(&format!(
        "cp -a {} tree\nmv tree moved\nmv moved/ops moved/ops2",
        src.display()
    ));
    assert!((1..=2).contains(&s.logs()), "the op log outlives the mount");
    a.start_again();
    assert!(!a.p("tree").exists());
    assert!(!a.p("moved/ops").exists());
    fs::rename(a.p("moved/ops2"), a.p("moved/ops")).unwrap();
    same_tree(&src, &a.p("moved"));
    // The cluster holds the rewritten paths: another mount renames the
    // tree again, which finds its documents by path.
    let b = s.mount(false);
    fs::rename(b.p("moved"), b.p("again")).unwrap();
    same_tree(&src, &b.p("again"));
    assert_eq!(s.paths("/again/ops/rename.rs"), 1);
    assert_eq!(
        s.paths("/tree/ops/rename.rs") + s.paths("/moved/ops2/rename.rs"),
        0
    );
}

/// A mount that gave the delegation back (another mount started) takes it
/// again once it is alone: it sees what the other mount did meanwhile,
/// decides from memory once more (a new op log; creates in a directory it
/// made send nothing), and `kill -9` then loses nothing it acknowledged.
#[test]
fn a_mount_alone_again_takes_the_delegation_back() {
    let s = Setup::new("t");
    let mut a = s.mount(true);
    fs::create_dir(a.p("d")).unwrap();
    fs::write(a.p("d/before"), "a\n").unwrap();
    assert_eq!(s.logs(), 1);
    {
        // Its start recalls the delegation; what it writes goes straight
        // to the cluster, and so does the first mount's.
        let b = s.mount(false);
        assert_eq!(s.logs(), 0, "given back");
        fs::write(b.p("d/from-b"), "b\n").unwrap();
        fs::rename(b.p("d/before"), b.p("d/renamed-by-b")).unwrap();
    }
    // Alone again: taken within a few rounds of 5 s (its op log is back).
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.logs() == 0 {
        assert!(
            Instant::now() < deadline,
            "not taken again; log:\n{}",
            a.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(fs::read_to_string(a.p("d/from-b")).unwrap(), "b\n");
    assert_eq!(fs::read_to_string(a.p("d/renamed-by-b")).unwrap(), "a\n");
    assert!(!a.p("d/before").exists());
    // Decided from memory again: names in a directory made since.
    fs::create_dir(a.p("n")).unwrap();
    s.server.set_journaling(true);
    s.requests();
    for i in 0..20 {
        fs::write(a.p(format!("n/f{i}")), "x").unwrap();
    }
    let (fs_path, _) = s.requests();
    assert_eq!(fs_path, 0, "20 creates sent requests; log:\n{}", a.log());
    // Killed right after: the new op log holds what was not sent.
    a.kill9_right_after("mv n/f0 n/moved && echo last > n/marker");
    a.start_again();
    assert_eq!(fs::read_to_string(a.p("n/marker")).unwrap(), "last\n");
    assert!(a.p("n/moved").exists() && !a.p("n/f0").exists());
    assert_eq!(fs::read_dir(a.p("n")).unwrap().count(), 21);
    assert_eq!(fs::read_to_string(a.p("d/from-b")).unwrap(), "b\n");
}

/// The delegation is the default on Elasticsearch: a mount given neither
/// `--delegate` nor `--no-delegate` holds it (a create in a directory it
/// made sends nothing; its op log exists), and `esfs search` on it sees a
/// file written the moment before (the search asks the mount to flush).
#[test]
fn a_mount_on_elasticsearch_holds_the_delegation_by_default() {
    let s = Setup::new("default");
    let data = s.data.path().display().to_string();
    let state = s.state.path().display().to_string();
    let url = s.server.url();
    // Naming the state directory, not the mode (the test helpers leave the
    // mode to esfs then).
    let a = Mount::with_backend(&[
        "--es",
        &url,
        "--index",
        &s.index,
        "--data",
        &data,
        "--state-dir",
        &state,
    ]);
    fs::create_dir(a.p("d")).unwrap();
    s.server.set_journaling(true);
    s.requests();
    fs::write(a.p("d/f.txt"), "zebra crossing\n").unwrap();
    let (fs_path, _) = s.requests();
    assert_eq!(
        fs_path, 0,
        "a create in a directory the mount made sends nothing"
    );
    assert!(s.logs() >= 1, "an op log in the state directory");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_esfs"))
        .args(["search", "-l", "zebra"])
        .current_dir(a.path())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "d/f.txt\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn fsync_sends_what_the_delegated_mount_acknowledged() {
    let s = Setup::new("f");
    let a = s.mount(true);
    s.server.set_journaling(true);
    fs::create_dir(a.p("d")).unwrap();
    fs::write(a.p("d/first"), "").unwrap();
    s.requests();
    let f = fs::File::create(a.p("d/synced")).unwrap();
    let (before, _) = s.requests();
    f.sync_all().unwrap();
    let (_, flushed) = s.requests();
    assert_eq!(
        before, 0,
        "a create in a directory the mount made sends nothing"
    );
    assert!(flushed >= 1, "fsync flushes");
    // In the cluster now: a search through the double's own API finds it.
    let url = format!("{}/{}-entries/_search", s.server.url(), s.index);
    ureq::post(format!("{}/{}-entries/_refresh", s.server.url(), s.index))
        .send_empty()
        .unwrap();
    let body: serde_json::Value = ureq::post(&url)
        .send_json(serde_json::json!({"query": {"term": {"name": "synced"}}}))
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    assert_eq!(
        body["hits"]["total"]["value"], 1,
        "the file is in the cluster after fsync: {body}"
    );
}

#[test]
fn namespace_changes_in_a_directory_the_mount_made_send_nothing() {
    let s = Setup::new("n");
    let a = s.mount(true);
    s.server.set_journaling(true);
    fs::create_dir(a.p("d")).unwrap();
    fs::write(a.p("d/warm"), "").unwrap();
    s.requests();
    // The design's table (docs/delegations.md): each of these is decided
    // from memory; the flusher sends them later.
    fs::create_dir_all(a.p("d/t/x")).unwrap();
    fs::write(a.p("d/t/x/y"), "y\n").unwrap();
    s.requests();
    let steps: [(&str, &dyn Fn()); 10] = [
        ("create", &|| fs::write(a.p("d/f"), "").unwrap()),
        ("100-byte write + close", &|| {
            fs::write(a.p("d/f"), [b'x'; 100]).unwrap()
        }),
        ("chmod", &|| {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(a.p("d/f"), fs::Permissions::from_mode(0o600)).unwrap()
        }),
        ("file rename", &|| {
            fs::rename(a.p("d/f"), a.p("d/g")).unwrap()
        }),
        ("mkdir", &|| fs::create_dir(a.p("d/sub")).unwrap()),
        ("rmdir", &|| fs::remove_dir(a.p("d/sub")).unwrap()),
        ("unlink", &|| fs::remove_file(a.p("d/g")).unwrap()),
        ("stat of an absent name", &|| {
            assert!(!a.p("d/none").exists())
        }),
        ("ls -l", &|| {
            let out = sh_ok(a.path(), "ls -l d");
            assert!(out.contains("warm"), "{out}");
        }),
        ("directory rename", &|| {
            fs::rename(a.p("d/t"), a.p("d/u")).unwrap()
        }),
    ];
    let mut sent = Vec::new();
    for (what, step) in steps {
        step();
        let (fs_path, _) = s.requests();
        if fs_path > 0 {
            sent.push(format!("{what}: {fs_path}"));
        }
    }
    assert!(sent.is_empty(), "requests on the syscall path: {sent:?}");
    // What the cluster got is right: another mount (recalling the
    // delegation) renames the moved directory again, which finds its
    // documents by their paths.
    let b = s.mount(false);
    fs::rename(b.p("d/u"), b.p("d/v")).unwrap();
    assert_eq!(fs::read_to_string(b.p("d/v/x/y")).unwrap(), "y\n");
    assert_eq!(fs::read_to_string(a.p("d/v/x/y")).unwrap(), "y\n");
    assert_eq!(
        s.paths("/d/v/x/y"),
        1,
        "the file's path was rewritten twice"
    );
    assert_eq!(s.paths("/d/u/x/y") + s.paths("/d/t/x/y"), 0);
}

#[test]
fn past_its_memory_budget_a_delegated_mount_reads_the_cluster_and_loses_nothing() {
    let s = Setup::new("b");
    // 1 MiB: about a thousand files' documents, packed; the test makes 3200.
    let a = s.mount_with_memory(1);
    s.server.set_journaling(true);
    sh_ok(
        a.path(),
        "mkdir -p d/sub/deep && for i in $(seq -w 1 3000); do echo \"f$i\" > d/f$i; done \
         && for i in $(seq -w 1 200); do echo \"s$i\" > d/sub/s$i; done && echo x > d/sub/deep/x",
    );
    // Past the grace (2 s) the flusher lets the acknowledged documents go:
    // `d` is no longer listed from memory (it was, with nothing sent). The
    // content indexer's writes touch the entries it indexes (their text
    // state passes through the overlay), which restarts their grace: first
    // until it has indexed them all.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sh_ok(a.path(), "getfattr --only-values -n user.esfs.flush .").contains("\"pending\":0")
    {
        assert!(Instant::now() < deadline, "the indexer never caught up");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    s.requests();
    let ls = sh_ok(a.path(), "ls -l d | grep -c '^-'");
    assert_eq!(ls.trim(), "3000");
    let (fs_path, _) = s.requests();
    assert!(fs_path > 0, "d was listed from memory: nothing left it");
    // Every file is there, with its contents, to stat and to read.
    assert_eq!(sh_ok(a.path(), "find d -type f | wc -l").trim(), "3201");
    assert_eq!(sh_ok(a.path(), "cat d/f0007 d/sub/s150"), "f0007\ns150\n");
    // Changes of files whose documents left: a chmod, an append, renames
    // of a file and of a directory, removals.
    sh_ok(
        a.path(),
        "chmod 600 d/f0001 && echo more >> d/f0002 && mv d/f0003 d/g0003 \
         && mv d/sub d/moved && rm d/f0004 && rm -rf d/moved/deep",
    );
    let check = |root: &Path| {
        let sh = |c: &str| sh_ok(root, c);
        assert_eq!(sh("stat -c %a d/f0001").trim(), "600");
        assert_eq!(sh("cat d/f0002"), "f0002\nmore\n");
        assert_eq!(sh("cat d/g0003"), "f0003\n");
        assert!(!root.join("d/f0003").exists() && !root.join("d/f0004").exists());
        assert!(!root.join("d/sub").exists() && !root.join("d/moved/deep").exists());
        assert_eq!(sh("ls d/moved | wc -l").trim(), "200");
        assert_eq!(sh("cat d/moved/s200"), "s200\n");
        assert_eq!(sh("ls d | grep -c '^[fg]'").trim(), "2999");
        assert_eq!(sh("find d | wc -l").trim(), "3201");
    };
    check(a.path());
    // What the cluster got is the same: another mount (recalling the
    // delegation) sees it, and removes it all.
    let b = s.mount(false);
    check(b.path());
    sh_ok(b.path(), "rm -rf d");
    // Another mount's change shows within the refresh interval (the
    // listing bound of docs/consistency.md).
    let deadline = Instant::now() + Duration::from_secs(5);
    while sh_ok(a.path(), "ls -A | wc -l").trim() != "0" {
        assert!(Instant::now() < deadline, "b's rm -rf never showed on a");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(s.paths("/d/moved/s001") + s.paths("/d/f0005"), 0);
}

#[test]
fn a_directory_made_elsewhere_is_read_whole_on_its_first_miss_and_its_text_stays_in_the_cluster() {
    let s = Setup::new("w");
    // Another mount makes the tree (and indexes its text): to a delegated
    // mount starting after it, none of it is in memory.
    {
        let b = s.mount(false);
        sh_ok(
            b.path(),
            "mkdir -p d/a d/b/c && for i in $(seq -w 1 300); do echo \"alpha $i\" > d/a/f$i; done \
             && for i in $(seq -w 1 100); do echo \"beta $i\" > d/b/g$i; done && echo deep > d/b/c/x",
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while s.text("/d/b/g100").is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(
            s.text("/d/b/g100").is_some(),
            "the other mount indexed its text"
        );
    }
    let a = s.mount(true);
    s.server.set_journaling(true);
    s.requests();
    // `ls -l` of 300 names: the directories on the way are read whole (a
    // search of their entries, an `_mget` of their inodes), `d` with
    // everything below it (a `_count` and a search of its subtree), not
    // name by name (before: a request or two per name).
    let ls = sh_ok(a.path(), "ls -l d/a | grep -c '^-'");
    assert_eq!(ls.trim(), "300");
    let (fs_path, _) = s.requests();
    eprintln!("ls -l of 300 names: {fs_path} requests");
    assert!(fs_path <= 6, "ls -l of 300 names: {fs_path} requests");
    // Then the rest of the tree, walked and read by the tools: held whole
    // already.
    assert_eq!(sh_ok(a.path(), "find d -type f | wc -l").trim(), "401");
    sh_ok(a.path(), "du -s d && cat d/b/c/x");
    let (fs_path, _) = s.requests();
    eprintln!("find and du of 401 files: {fs_path} requests");
    assert!(fs_path <= 3, "find and du of 401 files: {fs_path} requests");
    // Changes there, decided from memory: a rename of a file (its text
    // is read back from the cluster to move with it), and of a directory
    // of indexed files (in memory: their text stays in the cluster, the
    // flush sends only their new paths).
    sh_ok(
        a.path(),
        "mv d/a/f001 d/a/h001 && mv d/b d/e && rm d/a/f002",
    );
    let (fs_path, _) = s.requests();
    eprintln!("two renames and a removal: {fs_path} requests");
    assert!(
        fs_path <= 3,
        "two renames and a removal: {fs_path} requests"
    );
    // What the cluster holds once the flusher sent it (every 200 ms):
    // the new paths, and every file's text.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        s.paths("/d/b/g050") + s.paths("/d/a/f001") + s.paths("/d/a/f002"),
        0
    );
    for (path, word) in [
        ("/d/a/h001", "alpha"),
        ("/d/e/g050", "beta"),
        ("/d/e/g100", "beta"),
        ("/d/e/c/x", "deep"),
    ] {
        let text = s.text(path);
        assert!(
            text.as_deref().is_some_and(|t| t.contains(word)),
            "{path} lost its text: {text:?}"
        );
    }
    // Removing 299 files read whole: from memory too.
    s.requests();
    sh_ok(a.path(), "rm -rf d/a");
    let (fs_path, _) = s.requests();
    eprintln!("rm -rf of 299 files: {fs_path} requests");
    assert!(fs_path <= 4, "rm -rf of 299 files: {fs_path} requests");
    // Another mount (recalling the delegation) sees all of it.
    let b = s.mount(false);
    assert_eq!(sh_ok(b.path(), "cat d/e/g050 d/e/c/x"), "beta 050\ndeep\n");
    assert_eq!(sh_ok(b.path(), "find d -type f | wc -l").trim(), "101");
    assert!(!b.p("d/a").exists());
}

#[test]
fn a_directory_read_whole_again_sees_what_the_flusher_wrote_there_before_any_refresh() {
    let s = Setup::new("r");
    {
        let b = s.mount(false);
        sh_ok(
            b.path(),
            "mkdir d && for i in $(seq 1 50); do echo $i > d/f$i; done",
        );
    }
    // 1 MiB: what the mount reads of `d` and writes there leaves memory
    // once it writes 1500 files elsewhere.
    let mut args = s.args(true);
    // No kernel or document cache past the moment: what the overlay
    // holds, or the cluster, answers.
    args.extend(["--delegate-memory", "1", "--attr-ttl", "0"].map(String::from));
    let a = Mount::with_backend(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    assert_eq!(sh_ok(a.path(), "ls d | wc -l").trim(), "50");
    // From now on only an explicit refresh makes a write searchable.
    let settings = format!("{}/{}-entries/_settings", s.server.url(), s.index);
    ureq::put(&settings)
        .send_json(serde_json::json!({"index": {"refresh_interval": "-1"}}))
        .unwrap();
    // Made in memory (d is held whole), sent by the flusher, not
    // searchable yet; then its slots leave for the budget.
    sh_ok(a.path(), "echo new > d/new && rm d/f1");
    // Past the grace (2 s) that keeps a slot just used: d's slots are the
    // first to leave when the writes below push past the budget.
    std::thread::sleep(Duration::from_secs(3));
    sh_ok(
        a.path(),
        "mkdir e && for i in $(seq 1 1500); do : > e/g$i; done",
    );
    // Past the pause before a directory is read whole again (5 s).
    std::thread::sleep(Duration::from_secs(4));
    s.server.set_journaling(true);
    s.requests();
    // Read whole again: the search must refresh first, or `new` is missing
    // and `f1` back.
    let ls = sh_ok(a.path(), "ls d");
    let (fs_path, _) = s.requests();
    assert!(
        fs_path > 0,
        "d was still held whole: nothing was let go\n{}",
        a.log()
    );
    assert!(ls.lines().any(|l| l == "new"), "{ls}");
    assert!(!ls.lines().any(|l| l == "f1"), "{ls}");
    assert_eq!(ls.lines().count(), 50);
    assert_eq!(sh_ok(a.path(), "cat d/new"), "new\n");
}

/// A directory too large to be read whole (more than 2048 names), walked
/// name by name as `ls -l`, `du` and `rm -rf` do: after the second miss
/// the names that follow are read ahead with their inodes, in windows that
/// double, instead of two requests a name; and the walk sees what this
/// mount changed there, not what the cluster held before. Scattered
/// lookups are not a walk.
#[test]
fn a_walk_of_a_directory_too_large_to_read_whole_reads_ahead() {
    let s = Setup::new("k");
    {
        let b = s.mount(true);
        sh_ok(
            b.path(),
            "mkdir big && cd big && for i in $(seq -w 1 4500); do : > f$i; done && echo hi > f0042",
        );
    }
    // A new mount: none of it in memory, and not read with the root (a
    // subtree of more than 4096 names is not).
    let a = s.mount(true);
    s.server.set_journaling(true);
    sh_ok(a.path(), "mv big/f0007 big/g0007 && rm big/f0008");
    let (fs_path, _) = s.requests();
    eprintln!("mv and rm: {fs_path} requests");
    // Every name looked up in listing order (here the order they were
    // made), none of them in memory: what `du` and `ls -l` do once a
    // directory's names have left the mount's caches.
    let n = sh_ok(
        a.path(),
        "cd big && seq -w 1 4500 | grep -v -x -e 0007 -e 0008 | sed s/^/f/ | xargs stat -c %s | wc -l",
    );
    assert_eq!(n.trim(), "4498");
    let (fs_path, _) = s.requests();
    eprintln!("4498 names looked up: {fs_path} requests");
    // Without reading ahead: 780 requests here.
    assert!(fs_path <= 40, "4498 names looked up: {fs_path} requests");
    let ls = sh_ok(a.path(), "ls -l big");
    let names: Vec<&str> = ls
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    assert_eq!(names.len(), 4499);
    assert!(names.contains(&"g0007") && names.contains(&"f4500"));
    assert!(!names.contains(&"f0007") && !names.contains(&"f0008"));
    assert_eq!(sh_ok(a.path(), "cat big/f0042"), "hi\n");
    assert_eq!(sh_ok(a.path(), "stat -c %s big/g0007").trim(), "0");
    let cmd = "stat big/f0008";
    assert_failure_with(cmd, &sh(a.path(), cmd), "No such file");
    drop(a);
    let c = s.mount(true);
    s.server.take_journal();
    // Lookups scattered over it (as `esfs search` checks its hits), on a
    // mount that holds none of it, here every 50th name from the last: no
    // walk is in step with a window, so at most every other miss reads one
    // (the first, before it is known to be out of step), never a doubled
    // one. Before, every miss but the first read a window, doubling up to
    // 4096 names with their inodes: 90 searches, and as many `_mget`s.
    let scattered = sh_ok(
        c.path(),
        "cd big && for i in $(seq -w 4450 -50 50); do stat -c %s f$i; done | wc -l",
    );
    assert_eq!(scattered.trim(), "89");
    let searches = s
        .server
        .take_journal()
        .iter()
        .filter(|r| r.opaque_id.as_deref() == Some("esfs/fs") && r.path.ends_with("/_search"))
        .count();
    eprintln!("89 scattered lookups: {searches} searches");
    // (44 windows, and the root read whole with its subtree.)
    assert!(searches <= 48, "89 scattered lookups: {searches} searches");
}

/// A directory larger than the delegation's memory still knows which names
/// it does not have (those that left memory are remembered by a hash): new
/// names are made there, and absent ones looked up, without asking the
/// cluster. (Each create's lookup was a GET before: a third of the mount's
/// time while `bench/scale` built a 500 000-file directory.)
#[test]
fn new_names_in_a_directory_larger_than_memory_ask_the_cluster_nothing() {
    let s = Setup::new("l");
    // 1 MiB: most of the 3000 files' documents leave memory once sent.
    let a = s.mount_with_memory(1);
    sh_ok(
        a.path(),
        "mkdir d && for i in $(seq -w 1 3000); do echo \"f$i\" > d/f$i; done",
    );
    s.sent_and_left(&a);
    // (The root's name `d` left memory too: its lookup reads the root.)
    sh_ok(a.path(), "stat d >/dev/null");
    s.server.set_journaling(true);
    s.server.take_journal();
    sh_ok(
        a.path(),
        "for i in $(seq -w 1 200); do echo \"g$i\" > d/g$i; done && test ! -e d/absent",
    );
    // Reads of names: an entry's GET, an `_mget` of entries and inodes,
    // a search of the directory (an inode range for new files may be
    // reserved meanwhile).
    let reads: Vec<String> = s
        .server
        .take_journal()
        .into_iter()
        .filter(|r| r.opaque_id.as_deref() == Some("esfs/fs") && !r.path.contains("-meta/"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        reads,
        Vec::<String>::new(),
        "requests on the syscall path for new names"
    );
    // The directory's listing is the cluster's to tell now (names left
    // memory: without the hashes each create above asked for its name),
    // and so are the names that left: there, and not free.
    assert_eq!(sh_ok(a.path(), "ls d | wc -l").trim(), "3200");
    assert!(s.requests().0 > 0, "the listing came from memory");
    assert_eq!(sh_ok(a.path(), "cat d/f0001 d/g200"), "f0001\ng200\n");
    assert!(
        !sh(a.path(), "set -C; echo x > d/f0002").0.success(),
        "a create over a name that left memory"
    );
    assert_eq!(sh_ok(a.path(), "cat d/f0002"), "f0002\n");
    // Another mount (recalling the delegation) sees them all.
    let b = s.mount(false);
    assert_eq!(sh_ok(b.path(), "ls d | wc -l").trim(), "3200");
    assert_eq!(sh_ok(b.path(), "cat d/g001 d/f3000"), "g001\nf3000\n");
}

#[test]
fn a_large_directory_rename_passes_its_pages_straight_to_the_cluster() {
    let s = Setup::new("p");
    // 1 MiB: most of the 3300 files' documents leave memory once sent.
    let a = s.mount_with_memory(1);
    sh_ok(
        a.path(),
        "mkdir -p d/sub && for i in $(seq -w 1 3000); do echo \"f$i\" > d/f$i; done \
         && for i in $(seq -w 1 300); do echo \"s$i\" > d/sub/s$i; done",
    );
    s.sent_and_left(&a);
    // Changes waiting to be sent when the rename starts, and names held in
    // memory (just read) beside names that left it.
    sh_ok(
        a.path(),
        "cat d/f3000 d/sub/s300 >/dev/null && chmod 600 d/f0001 && echo more >> d/sub/s001 \
         && mv d/f0002 d/g0002",
    );
    s.server.set_journaling(true);
    s.server.take_journal();
    sh_ok(a.path(), "mv d e");
    let j = s.server.take_journal();
    let fs: Vec<&str> = j
        .iter()
        .filter(|r| r.opaque_id.as_deref() == Some("esfs/fs"))
        .map(|r| r.path.rsplit('/').next().unwrap_or(""))
        .collect();
    eprintln!("mv, the syscall path: {fs:?}");
    // The page of 3300 paths went to the cluster from the syscall path in
    // one bulk, right after the search that found it: none of its
    // documents was read to decide it (the overlay's way, before: an
    // `_mget` of those not in memory, the flusher's bulk after).
    let page = fs
        .iter()
        .position(|api| *api == "_search")
        .expect("the page's search");
    assert_eq!(
        fs.get(page + 1),
        Some(&"_bulk"),
        "the page did not pass: {fs:?}"
    );
    let check = |root: &Path| {
        let sh = |c: &str| sh_ok(root, c);
        assert_eq!(sh("find e -type f | wc -l").trim(), "3300");
        assert_eq!(sh("stat -c %a e/f0001").trim(), "600");
        assert_eq!(
            sh("cat e/g0002 e/f3000 e/sub/s001"),
            "f0002\nf3000\ns001\nmore\n"
        );
        assert!(!root.join("d").exists() && !root.join("e/f0002").exists());
    };
    check(a.path());
    // Moved documents change again, held or not, and move back.
    sh_ok(
        a.path(),
        "echo again >> e/f3000 && chmod 640 e/f0003 && mv e/sub e/sub2 && mv e d",
    );
    assert_eq!(sh_ok(a.path(), "cat d/f3000").trim(), "f3000\nagain");
    assert_eq!(sh_ok(a.path(), "stat -c %a d/f0003").trim(), "640");
    // Another mount (recalling the delegation: everything is sent) reads
    // the same, and the cluster holds the paths a subtree search asks for.
    let b = s.mount(false);
    assert_eq!(sh_ok(b.path(), "find d -type f | wc -l").trim(), "3300");
    assert_eq!(sh_ok(b.path(), "cat d/sub2/s001"), "s001\nmore\n");
    assert_eq!(s.paths("/d/sub2/s150") + s.paths("/d/f2700"), 2);
    assert_eq!(s.paths("/e/f2700") + s.paths("/d/sub/s150"), 0);
}
