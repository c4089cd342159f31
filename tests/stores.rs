//! Where a filesystem keeps its metadata and contents, as users meet it
//! through the `esfs` command: commands that only read create nothing.

mod common;

use es_test_server::EsTestServer;
use std::fs;
use std::path::Path;
use std::process::Command;

/// `esfs ARGS` with HOME and XDG_DATA_HOME in `home`: (exit code, stdout, stderr).
fn esfs_in(home: &Path, args: &[&str]) -> (i32, String, String) {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_esfs"));
    // The usual umask, whatever the test runner's.
    // SAFETY: umask is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    let out = cmd
        .args(args)
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("xdg"))
        .env_remove("ESFS_STORE")
        .env_remove("ESFS_DATA")
        .env_remove("ESFS_ES_URL")
        .env_remove("ESFS_ES_INDEX")
        .output()
        .expect("run esfs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every path under `dir` (sorted), to see that nothing was created.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn read_only_commands_on_a_missing_store_create_nothing() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let missing = h.join("no/such/dir");
    let empty = h.join("empty");
    fs::create_dir(&empty).unwrap();
    let before = tree(h);
    for dir in [&missing, &empty] {
        let d = dir.to_str().unwrap();
        for args in [
            vec!["fsck", "--store", d],
            vec!["locks", "--store", d],
            vec!["search", "--store", d, "needle", "/"],
            vec!["search", "--store", d, "--find", "/"],
        ] {
            let (code, out, err) = esfs_in(h, &args);
            assert_ne!(code, 0, "{args:?}: {out}{err}");
            // "esfs: ..." or "esfs search: ...", one line.
            let want = format!(": no esfs filesystem at {d}");
            assert!(
                err.trim().ends_with(&want) && err.trim().lines().count() == 1,
                "{args:?}: {err} (stdout {out:?})"
            );
            assert_eq!(tree(h), before, "{args:?} created something");
        }
    }
    // The default store too.
    let (code, _, err) = esfs_in(h, &["fsck"]);
    assert_ne!(code, 0);
    assert!(err.contains("no esfs filesystem at "), "{err}");
    assert_eq!(
        tree(h),
        before,
        "fsck of the default store created something"
    );
}

/// HTTP status of a HEAD request.
fn head(url: &str) -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    agent.head(url).call().unwrap().status().as_u16()
}

#[test]
fn read_only_commands_on_a_missing_index_create_nothing() {
    let server = EsTestServer::start("127.0.0.1:0").unwrap();
    let url = server.url();
    let home = tempfile::tempdir().unwrap();
    for args in [
        vec!["search", "--es", &url, "--index", "typo", "needle", "/"],
        vec!["search", "--es", &url, "--index", "typo", "--find", "/"],
        vec!["fsck", "--es", &url, "--index", "typo"],
        vec!["locks", "--es", &url, "--index", "typo"],
    ] {
        let (code, out, err) = esfs_in(home.path(), &args);
        assert_ne!(code, 0, "{args:?}: {out}{err}");
        let want = format!(": no esfs filesystem at {url} (no index typo-entries)");
        assert!(
            err.trim().ends_with(&want) && err.trim().lines().count() == 1,
            "{args:?}: {err}"
        );
        for idx in ["entries", "inodes", "locks", "meta", "chunks"] {
            assert_eq!(
                head(&format!("{url}/typo-{idx}")),
                404,
                "{args:?} made typo-{idx}"
            );
        }
    }
}

/// A background mount started with `esfs mount` as users do; unmounted
/// (waiting for its server to exit) by `umount` or on drop.
struct Bg {
    home: std::path::PathBuf,
    mnt: std::path::PathBuf,
    pid: Option<u32>,
}

impl Bg {
    /// `esfs mount MNT ARGS...`; panics with esfs's message if it fails.
    fn mount(home: &Path, mnt: &Path, args: &[&str]) -> Bg {
        let (code, out, err) = try_mount(home, mnt, args);
        assert_eq!(code, 0, "esfs mount {args:?}: {out}{err}");
        let pid = out
            .split("(pid ")
            .nth(1)
            .and_then(|r| r.split(')').next())
            .and_then(|p| p.parse().ok());
        assert!(pid.is_some(), "no pid in {out:?}");
        Bg {
            home: home.to_path_buf(),
            mnt: mnt.to_path_buf(),
            pid,
        }
    }

    fn umount(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(pid) = self.pid.take() else { return };
        let _ = &self.home;
        let ok = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mnt)
                .status();
        }
        let t = std::time::Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() {
            assert!(t.elapsed().as_secs() < 30, "server {pid} did not exit");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `esfs mount MNT ARGS...` expected to be refused: its stderr. A mount
/// that succeeds is unmounted before the test fails.
fn refused(home: &Path, mnt: &Path, args: &[&str]) -> String {
    let (code, out, err) = try_mount(home, mnt, args);
    if code == 0 {
        esfs_in(home, &["umount", s(mnt)]);
        panic!("esfs mount {args:?} was not refused: {out}{err}");
    }
    err
}

fn try_mount(home: &Path, mnt: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["mount", mnt.to_str().unwrap()];
    all.extend_from_slice(args);
    esfs_in(home, &all)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The scenario: two stores mounted in turn on one mountpoint with
/// the default data directory no longer share contents.
#[test]
fn two_stores_with_default_data_keep_their_own_contents() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let (a, b, mnt) = (h.join("A"), h.join("B"), h.join("mnt"));
    fs::create_dir(&mnt).unwrap();
    let m = Bg::mount(h, &mnt, &["--store", s(&a)]);
    fs::write(mnt.join("f"), b"A's bytes\n").unwrap();
    m.umount();
    let m = Bg::mount(h, &mnt, &["--store", s(&b)]);
    fs::write(mnt.join("f"), b"B's\n").unwrap();
    m.umount();
    let m = Bg::mount(h, &mnt, &["--store", s(&a)]);
    let got = Command::new("cat")
        .arg(mnt.join("f"))
        .output()
        .unwrap()
        .stdout;
    assert_eq!(String::from_utf8_lossy(&got), "A's bytes\n");
    m.umount();
    let m = Bg::mount(h, &mnt, &["--store", s(&b)]);
    let got = Command::new("cat")
        .arg(mnt.join("f"))
        .output()
        .unwrap()
        .stdout;
    assert_eq!(String::from_utf8_lossy(&got), "B's\n");
    m.umount();
    for st in [&a, &b] {
        let (code, out, err) = esfs_in(h, &["fsck", "--store", s(st)]);
        assert_eq!(code, 0, "fsck {st:?}: {out}{err}");
    }
}

/// A data directory given to the wrong store is refused, by mount and fsck,
/// in one line naming both and their ids.
#[test]
fn a_data_directory_of_another_filesystem_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let (a, b, d, mnt) = (h.join("A"), h.join("B"), h.join("D"), h.join("mnt"));
    fs::create_dir(&mnt).unwrap();
    let m = Bg::mount(h, &mnt, &["--store", s(&a), "--data", s(&d)]);
    fs::write(mnt.join("f"), b"A's\n").unwrap();
    m.umount();
    let stamp = fs::read_to_string(d.join("esfs-fsid")).unwrap();
    let id_a = serde_json::from_str::<serde_json::Value>(&stamp).unwrap()["fs_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(id_a.len(), 32, "{stamp}");
    // B is new: refused before anything is made in D.
    let before = tree(&d);
    let err = refused(h, &mnt, &["--store", s(&b), "--data", s(&d)]);
    let line = err.trim();
    assert_eq!(line.lines().count(), 1, "{err}");
    for needle in [s(&b), s(&d), &id_a] {
        assert!(line.contains(needle), "{needle} not in {line}");
    }
    assert!(!common::is_esfs_mounted(&mnt));
    assert_eq!(tree(&d), before);
    // (Only the log of the refused server is there.)
    assert_eq!(tree(&b), ["esfs.log"], "a refused mount made its store");
    // B made with its own data, then pointed at A's.
    let m = Bg::mount(h, &mnt, &["--store", s(&b)]);
    m.umount();
    let err = refused(h, &mnt, &["--store", s(&b), "--data", s(&d)]);
    let id_b = serde_json::from_str::<serde_json::Value>(
        &fs::read_to_string(b.join("data/esfs-fsid")).unwrap(),
    )
    .unwrap()["fs_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(id_a, id_b);
    for needle in [s(&b), s(&d), &id_a, &id_b] {
        assert!(err.contains(needle), "{needle} not in {err}");
    }
    // fsck reports it the same way.
    let (code, out, err) = esfs_in(h, &["fsck", "--store", s(&b), "--data", s(&d)]);
    assert_ne!(code, 0, "{out}{err}");
    for needle in [s(&b), s(&d), &id_a, &id_b] {
        assert!(err.contains(needle), "fsck: {needle} not in {err}");
    }
    let (code, out, err) = esfs_in(h, &["fsck", "--store", s(&a), "--data", s(&d)]);
    assert_eq!(code, 0, "{out}{err}");
    // An unstamped directory with contents is not taken either.
    fs::remove_file(d.join("esfs-fsid")).unwrap();
    let err = refused(h, &mnt, &["--store", s(&b), "--data", s(&d)]);
    assert!(err.contains("unknown filesystem"), "{err}");
}

/// A data directory that only ever got an empty small-contents database
/// (older esfs made one just by opening it, e.g. for a read-only command)
/// holds no file's contents: a new store takes it and stamps it. One row in
/// that database is contents, and refused as another filesystem's.
#[test]
fn an_unstamped_directory_with_an_empty_database_is_taken() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let (a, d, mnt) = (h.join("A"), h.join("D"), h.join("mnt"));
    fs::create_dir(&mnt).unwrap();
    {
        use esfs::data::DataStore;
        let ds = esfs::data::LocalDataStore::open(&d).unwrap();
        assert!(ds.keys().unwrap().is_empty());
    }
    assert!(d.join("small.db").exists());
    let m = Bg::mount(h, &mnt, &["--store", s(&a), "--data", s(&d)]);
    m.umount();
    assert!(d.join("esfs-fsid").exists(), "{:?}", tree(&d));
    // The same with a row in it: contents of an unknown filesystem.
    let (b, e) = (h.join("B"), h.join("E"));
    {
        use esfs::data::DataStore;
        let ds = esfs::data::LocalDataStore::open(&e).unwrap();
        ds.write("7", 0, b"someone's bytes").unwrap();
        ds.flush("7").unwrap();
    }
    let err = refused(h, &mnt, &["--store", s(&b), "--data", s(&e)]);
    assert!(err.contains("unknown filesystem"), "{err}");
}

/// Drop a store's filesystem id and its data directory's stamp: a
/// filesystem as an esfs from before ids left it.
fn make_pre_id(store: &Path, data: &Path) {
    use esfs::store::{Idx, MetaStore};
    let st = esfs::store::embedded::EmbeddedStore::open(store).unwrap();
    assert!(st.delete(Idx::Meta, "fsid", None).unwrap());
    st.sync().unwrap();
    drop(st);
    fs::remove_file(data.join("esfs-fsid")).unwrap();
}

/// Upgrade: a store from before ids adopts its unstamped data directory
/// (the default store keeps the old default one); a store that would get a
/// new, empty directory instead is refused with a hint.
#[test]
fn stores_from_before_ids_adopt_their_data_directory() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let mnt = h.join("mnt");
    fs::create_dir(&mnt).unwrap();
    // The default store with the old default data directory.
    let esfs_home = h.join("xdg/esfs");
    let (store, legacy) = (esfs_home.join("store"), esfs_home.join("data"));
    let m = Bg::mount(h, &mnt, &["--store", s(&store), "--data", s(&legacy)]);
    fs::write(mnt.join("f"), b"old\n").unwrap();
    m.umount();
    make_pre_id(&store, &legacy);
    let m = Bg::mount(h, &mnt, &[]);
    let got = Command::new("cat")
        .arg(mnt.join("f"))
        .output()
        .unwrap()
        .stdout;
    assert_eq!(String::from_utf8_lossy(&got), "old\n");
    m.umount();
    assert!(legacy.join("esfs-fsid").exists(), "not adopted");
    assert!(!store.join("data").exists());
    // Another old store whose contents were there too: refused, with a hint.
    let x = h.join("X");
    let xd = h.join("XD");
    let m = Bg::mount(h, &mnt, &["--store", s(&x), "--data", s(&xd)]);
    fs::write(mnt.join("g"), b"x\n").unwrap();
    m.umount();
    make_pre_id(&x, &xd);
    let err = refused(h, &mnt, &["--store", s(&x)]);
    assert!(
        err.contains("older esfs") && err.contains(s(&legacy)),
        "{err}"
    );
    assert!(!x.join("data").exists());
    // Given its directory, it adopts it.
    let m = Bg::mount(h, &mnt, &["--store", s(&x), "--data", s(&xd)]);
    let got = Command::new("cat")
        .arg(mnt.join("g"))
        .output()
        .unwrap()
        .stdout;
    assert_eq!(String::from_utf8_lossy(&got), "x\n");
    m.umount();
}

/// On Elasticsearch the contents in --data are bound to the index set.
#[test]
fn elasticsearch_data_directory_is_bound_to_its_index() {
    let server = EsTestServer::start("127.0.0.1:0").unwrap();
    let url = server.url();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let (d, mnt) = (h.join("D"), h.join("mnt"));
    fs::create_dir(&mnt).unwrap();
    let m = Bg::mount(h, &mnt, &["--es", &url, "--index", "one", "--data", s(&d)]);
    fs::write(mnt.join("f"), b"one\n").unwrap();
    m.umount();
    let err = refused(h, &mnt, &["--es", &url, "--index", "two", "--data", s(&d)]);
    assert!(
        err.contains("belongs to filesystem") && err.contains(s(&d)),
        "{err}"
    );
    assert_eq!(
        head(&format!("{url}/two-entries")),
        404,
        "a refused mount made indices"
    );
    // Index set "two" with its contents in the cluster, checked with D.
    let m = Bg::mount(h, &mnt, &["--es", &url, "--index", "two"]);
    m.umount();
    let (code, out, err) = esfs_in(
        h,
        &["fsck", "--es", &url, "--index", "two", "--data", s(&d)],
    );
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("belongs to filesystem"), "{err}");
    // The right index still mounts it, twice at once.
    let mnt2 = h.join("mnt2");
    fs::create_dir(&mnt2).unwrap();
    let m = Bg::mount(h, &mnt, &["--es", &url, "--index", "one", "--data", s(&d)]);
    let m2 = Bg::mount(h, &mnt2, &["--es", &url, "--index", "one", "--data", s(&d)]);
    assert_eq!(fs::read(mnt2.join("f")).unwrap(), b"one\n");
    m2.umount();
    m.umount();
}

/// Every path under `dir` (itself included) that group or others may access.
fn loose(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for rel in std::iter::once(String::new()).chain(tree(dir)) {
        let p = dir.join(&rel);
        let md = fs::symlink_metadata(&p).unwrap();
        if md.mode() & 0o077 != 0 {
            out.push(format!("{} {:o}", p.display(), md.mode() & 0o7777));
        }
    }
    out
}

/// Store and data files are 0600 and directories 0700 whatever the umask
/// (022 here): a file made 0600 in the mount cannot be read from the
/// store's files by another local user.
#[test]
fn store_and_data_are_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    fs::set_permissions(h, fs::Permissions::from_mode(0o755)).unwrap();
    let (a, mnt) = (h.join("A"), h.join("mnt"));
    fs::create_dir(&mnt).unwrap();
    fs::set_permissions(&mnt, fs::Permissions::from_mode(0o755)).unwrap();
    let m = Bg::mount(h, &mnt, &["--store", s(&a), "-o", "allow_other"]);
    let w = Command::new("sh")
        .arg("-c")
        .arg("umask 077 && echo secret-words > f && head -c 300000 /dev/zero > big && echo small > g")
        .current_dir(&mnt)
        .status()
        .unwrap();
    assert!(w.success());
    let files = tree(&a);
    for f in [
        "meta.sqlite",
        "meta.sqlite-wal",
        "data/small.db",
        "data/esfs-fsid",
        "esfs.log",
        "mount.lock",
    ] {
        assert!(files.contains(&f.to_string()), "{f} not in {files:?}");
    }
    assert_eq!(loose(&a), Vec::<String>::new(), "while mounted");
    // Another user finds nothing, neither beside the mount nor through it.
    let (st, out, _) = common::sh_nobody(h, "grep -rhao secret-words A; cat mnt/f");
    assert!(!st.success() && !out.contains("secret"), "{out}");
    m.umount();
    assert_eq!(loose(&a), Vec::<String>::new(), "after unmount");
}

/// A store or data directory other users can read (made by an older esfs,
/// or by hand) is warned about at mount, on stderr and in the log.
#[test]
fn loose_existing_store_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let (a, mnt) = (h.join("A"), h.join("mnt"));
    fs::create_dir(&mnt).unwrap();
    let m = Bg::mount(h, &mnt, &["--store", s(&a)]);
    m.umount();
    let (_, out, err) = esfs_in(h, &["mount", s(&mnt), "--store", s(&a)]);
    assert!(!err.contains("warning"), "{out}{err}");
    Bg {
        home: h.to_path_buf(),
        mnt: mnt.clone(),
        pid: out
            .split("(pid ")
            .nth(1)
            .and_then(|r| r.split(')').next()?.parse().ok()),
    }
    .umount();
    fs::set_permissions(&a, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(a.join("meta.sqlite"), fs::Permissions::from_mode(0o644)).unwrap();
    let (code, out, err) = esfs_in(h, &["mount", s(&mnt), "--store", s(&a)]);
    let pid = out
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next()?.parse().ok());
    let m = Bg {
        home: h.to_path_buf(),
        mnt: mnt.clone(),
        pid,
    };
    assert_eq!(code, 0, "{out}{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("esfs: warning: ") && l.contains(s(&a)))
        .unwrap_or_else(|| panic!("no warning: {err}"));
    assert!(line.contains("0755") && line.contains("chmod"), "{line}");
    m.umount();
    let log = fs::read_to_string(a.join("esfs.log")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(s(&a)) && l.contains("0755")),
        "{log}"
    );
}
