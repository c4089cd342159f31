//! Contents in object storage (`--data s3://BUCKET/PREFIX`), through real
//! FUSE mounts, on a real S3 server (SeaweedFS, scripts/s3): two mounts of
//! one index on one bucket, kill -9 mid-write and mid-truncate, the object
//! store down for 20 s and back, fsck finding and repairing orphans.

mod common;

use common::*;
use esfs::data::blocks::{BlockConfig, BlockStore, S3Location};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// `args` with the `--cache-dir` replaced by `dir` (one cache per mount).
fn with_cache(args: &[String], dir: &Path) -> Vec<String> {
    let mut out = args.to_vec();
    let i = out.iter().position(|a| a == "--cache-dir").unwrap();
    out[i + 1] = dir.to_string_lossy().into_owned();
    out
}

/// `esfs ARGS`, with ESFS_GC_GRACE=`grace` seconds when given: (exit
/// code, stdout + stderr).
fn esfs(args: &[String], grace: Option<&str>) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_esfs"));
    c.args(args);
    if let Some(g) = grace {
        c.env("ESFS_GC_GRACE", g);
    }
    let out = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn fsck(store: &[String], repair: bool, grace: Option<&str>) -> (i32, String) {
    let mut args = vec!["fsck".to_string()];
    args.extend(store.iter().cloned());
    if repair {
        args.push("--repair".into());
    }
    esfs(&args, grace)
}

/// The block store a mount with `args` uses (for looking behind its back).
fn blocks_of(args: &[String]) -> BlockStore {
    let at = |k: &str| args[args.iter().position(|a| a == k).unwrap() + 1].clone();
    let mut c = BlockConfig::new(S3Location::parse(&at("--data")).unwrap());
    c.endpoint = Some(at("--s3-endpoint"));
    BlockStore::open(&c).unwrap()
}

/// An embedded store in `dir` with contents on the S3 server at `url`.
fn embedded_args(dir: &Path, url: &str) -> Vec<String> {
    let _ = s3_endpoint(); // the credentials
    let mut a = vec![
        "--store".to_string(),
        dir.join("store").to_string_lossy().into_owned(),
    ];
    let mut data = s3_data_args(&dir.join("cache"));
    let i = data.iter().position(|a| a == "--s3-endpoint").unwrap();
    data[i + 1] = url.to_string();
    a.extend(data);
    a
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(|s| s.as_str()).collect()
}

/// Read `path` until it equals `want` (another mount sees a change within
/// its attribute TTL); every read must be the bytes of one committed
/// version: `want` or one of `olds`, never a mix. (The length is the
/// inode's, committed after the map: for a moment, and for up to the
/// attribute TTL on another mount, the new bytes are read at the old
/// length.)
fn read_until(path: &Path, want: &[u8], olds: &[&[u8]]) {
    let t = Instant::now();
    loop {
        let got = fs::read(path).unwrap_or_default();
        if got == want {
            return;
        }
        let one_version = |v: &[u8]| v.get(..got.len()).is_some_and(|p| p == got.as_slice());
        assert!(
            one_version(want) || olds.iter().any(|o| one_version(o)),
            "{}: {} bytes that are neither the old nor the new version",
            path.display(),
            got.len()
        );
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{} never showed the new version",
            path.display()
        );
        sleep(Duration::from_millis(200));
    }
}

#[test]
fn two_mounts_of_one_index_on_one_bucket_share_contents() {
    let _ = s3_endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let mut args = es_backend_args();
    args.extend(s3_data_args(&tmp.path().join("cache-a")));
    let args_b = with_cache(&args, &tmp.path().join("cache-b"));
    let a = Mount::with_backend(&strs(&args));
    let b = Mount::with_backend(&strs(&args_b));

    let big = pattern(21 * MIB + 12345, 1);
    fs::write(a.p("big"), &big).unwrap();
    fs::write(a.p("small"), b"hello from a").unwrap();
    read_until(&b.p("big"), &big, &[]);
    read_until(&b.p("small"), b"hello from a", &[]);

    // An overwrite in the middle, across block boundaries: the other mount
    // sees the old contents or the new, whole.
    let patch = pattern(3 * MIB + 7, 2);
    let f = fs::OpenOptions::new().write(true).open(a.p("big")).unwrap();
    f.write_all_at(&patch, 5 * MIB as u64 - 3).unwrap();
    drop(f);
    let mut new = big.clone();
    new[5 * MIB - 3..5 * MIB - 3 + patch.len()].copy_from_slice(&patch);
    read_until(&b.p("big"), &new, &[&big]);
    // And back the other way, a small file growing past the inline limit.
    let grown = pattern(300_000, 3);
    fs::write(b.p("small"), &grown).unwrap();
    read_until(&a.p("small"), &grown, &[b"hello from a"]);
    assert_eq!(fs::read(a.p("big")).unwrap(), new);
}

/// The block map is committed in the inode document with the length, in
/// one write: while one mount writes a big file (its first 64 MiB already
/// uploaded in the background, the file still open), a reader on another
/// mount reads the version committed before, whole; after the close, the
/// new one. (With the map in a document of its own, the background
/// write-out committed it while the inode kept the old length: the reader
/// got the new bytes at the old length.)
#[test]
fn a_reader_on_another_mount_reads_one_committed_length_and_map() {
    let _ = s3_endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let mut args = es_backend_args();
    args.extend(s3_data_args(&tmp.path().join("cache-a")));
    let args_b = with_cache(&args, &tmp.path().join("cache-b"));
    let a = Mount::with_backend(&strs(&args));
    let b = Mount::with_backend(&strs(&args_b));
    let old = pattern(5 * MIB + 3, 20);
    fs::write(a.p("f"), &old).unwrap();
    let f = fs::OpenOptions::new().write(true).open(a.p("f")).unwrap();
    let new = pattern(70 * MIB, 21);
    uploaded_while_open(&args, &f, &new);
    let got = fs::read(b.p("f")).unwrap();
    assert!(
        got == old || got == new,
        "not one committed version: {} bytes, {}",
        got.len(),
        if got[..] == new[..got.len()] {
            "the new bytes"
        } else {
            "other bytes"
        }
    );
    if got == new {
        eprintln!("{}", SYNCED);
    }
    drop(f);
    read_until(&b.p("f"), &new, &[&old]);
}

/// What a test of an uploaded, uncommitted write says when a commit came
/// first after all: a sync(2) anywhere on the machine makes the kernel
/// write the file's times (its writeback cache keeps them), and that
/// setattr commits what was uploaded with the size: the new version, whole.
const SYNCED: &str = "the kernel's setattr (a sync elsewhere) committed the new version first";

/// Write `data` at 0 through `f` (kept open), hand every page to the mount
/// (sync_file_range: no flush, fsync or setattr, which would commit), and
/// wait until its first 64 MiB are uploaded (a write-out starts past 64 MiB
/// unwritten bytes), and then some: the time a commit right after the
/// upload would take.
fn uploaded_while_open(args: &[String], f: &fs::File, data: &[u8]) {
    use std::os::fd::AsRawFd;
    let store = blocks_of(args);
    let before = store.list().unwrap().len();
    for (i, piece) in data.chunks(MIB).enumerate() {
        f.write_all_at(piece, (i * MIB) as u64).unwrap();
    }
    let all = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a plain syscall on a descriptor we hold.
    assert_eq!(
        unsafe { libc::sync_file_range(f.as_raw_fd(), 0, 0, all) },
        0
    );
    let want = before + 16;
    let t = Instant::now();
    while store.list().unwrap().len() < want {
        assert!(t.elapsed() < Duration::from_secs(60), "no upload seen");
        sleep(Duration::from_millis(100));
    }
    sleep(Duration::from_secs(2));
}

/// A big file's block map comes in its inode document: another mount's
/// lookup, open and read of it send no request to the `chunks` index
/// (where the map was a document of its own, read at the first read).
#[test]
fn a_big_files_map_comes_with_its_inode() {
    let _ = s3_endpoint();
    let server = es_test_server::EsTestServer::start("127.0.0.1:0").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let index = format!("s3rq{}", std::process::id());
    let mut args = vec!["--es".to_string(), server.url(), "--index".into(), index];
    args.extend(s3_data_args(&tmp.path().join("cache-a")));
    let a = Mount::with_backend(&strs(&args));
    let big = pattern(9 * MIB + 1, 40);
    fs::write(a.p("big"), &big).unwrap();
    let b = Mount::with_backend(&strs(&with_cache(&args, &tmp.path().join("cache-b"))));
    server.set_journaling(true);
    assert_eq!(fs::read(b.p("big")).unwrap(), big);
    let reqs = server.take_journal();
    let chunks: Vec<_> = reqs.iter().filter(|r| r.path.contains("-chunks")).collect();
    assert!(
        chunks.is_empty(),
        "requests to the chunks index: {chunks:?}"
    );
    eprintln!("reading it on the other mount: {} requests", reqs.len());
}

/// A filesystem from an esfs that kept each block map in a `<key>:map`
/// document of the chunks index: its files read through those, fsck counts
/// their blocks, and the next commit of a file moves its map into the
/// inode and deletes the document.
#[test]
fn legacy_map_documents_are_read_then_moved_into_the_inode() {
    use serde_json::{Value, json};
    use std::os::unix::fs::MetadataExt;
    let _ = s3_endpoint();
    let server = es_test_server::EsTestServer::start("127.0.0.1:0").unwrap();
    let url = server.url();
    let tmp = tempfile::tempdir().unwrap();
    let index = format!("s3lg{}", std::process::id());
    let mut args = vec![
        "--es".to_string(),
        url.clone(),
        "--index".into(),
        index.clone(),
    ];
    args.extend(s3_data_args(&tmp.path().join("cache")));
    let mut m = Mount::with_backend(&strs(&args));
    let v1 = pattern(9 * MIB + 7, 50);
    fs::write(m.p("f"), &v1).unwrap();
    let ino = fs::metadata(m.p("f")).unwrap().ino();
    m.unmount();
    // Made the older layout: the map out of the inode, into its document.
    let inode_url = format!("{url}/{index}-inodes/_doc/{ino}");
    let legacy_url = format!("{url}/{index}-chunks/_doc/{ino}:map");
    let inode = || -> Value {
        let mut doc: Value = ureq::get(&inode_url)
            .call()
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap();
        doc["_source"].take()
    };
    let mut source = inode();
    let map = source.as_object_mut().unwrap().remove("map").unwrap();
    assert!(map.as_array().is_some_and(|m| !m.is_empty()), "{map}");
    ureq::put(&inode_url).send_json(&source).unwrap();
    ureq::put(&legacy_url)
        .send_json(json!({"file": ino.to_string(), "n": -1, "map": map}))
        .unwrap();
    let (code, out) = fsck(&args, false, Some("0"));
    assert_eq!(code, 0, "{out}");
    m.start_again();
    assert_eq!(fs::read(m.p("f")).unwrap(), v1);
    let patch = pattern(MIB, 51);
    let f = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
    f.write_all_at(&patch, 3 * MIB as u64).unwrap();
    drop(f);
    let mut v2 = v1.clone();
    v2[3 * MIB..4 * MIB].copy_from_slice(&patch);
    assert_eq!(fs::read(m.p("f")).unwrap(), v2);
    m.unmount();
    assert!(inode()["map"].as_array().is_some_and(|m| !m.is_empty()));
    assert!(
        ureq::get(&legacy_url).call().is_err(),
        "the legacy document is gone"
    );
    let (code, out) = fsck(&args, true, Some("0"));
    assert!(code <= 1 && !out.contains("missing"), "{out}");
    let (code, out) = fsck(&args, false, Some("0"));
    assert_eq!(code, 0, "{out}");
    m.start_again();
    assert_eq!(fs::read(m.p("f")).unwrap(), v2);
}

/// kill -9 after the blocks of a write were uploaded and before any close
/// committed them: the file reads its previous committed version, whole,
/// and the uploads are orphans fsck reports and deletes. (With the map
/// committed apart from the size, the write-outs of a big write committed
/// their map: the old length read the new bytes.)
#[test]
fn kill9_between_upload_and_commit_reads_the_previous_version() {
    let _ = s3_endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let mut args = es_backend_args();
    args.extend(s3_data_args(&tmp.path().join("cache")));
    let mut m = Mount::with_backend(&strs(&args));
    let old = pattern(5 * MIB + 3, 30);
    fs::write(m.p("f"), &old).unwrap();
    let store = blocks_of(&args);
    let committed = store.list().unwrap().len();
    let f = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
    let new = pattern(70 * MIB, 31);
    uploaded_while_open(&args, &f, &new);
    // Killed with the file open here (a close would commit).
    m.kill9();
    drop(f);
    m.start_again();
    let got = fs::read(m.p("f")).unwrap();
    if got == new {
        eprintln!("{}", SYNCED);
        return;
    }
    assert_eq!(got, old, "not one committed version");
    m.unmount();
    let (code, out) = fsck(&args, false, Some("0"));
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("orphan block(s)"), "{out}");
    assert!(!out.contains("missing"), "{out}");
    let (code, out) = fsck(&args, true, Some("0"));
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        store.list().unwrap().len(),
        committed,
        "only the committed blocks are left"
    );
    let (code, out) = fsck(&args, false, Some("0"));
    assert_eq!(code, 0, "{out}");
    m.start_again();
    assert_eq!(fs::read(m.p("f")).unwrap(), old);
}

#[test]
fn kill9_mid_write_loses_only_uncommitted_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let args = embedded_args(tmp.path(), &s3_endpoint());
    let mut m = Mount::with_backend(&strs(&args));
    let keep = pattern(9 * MIB + 5, 4);
    fs::write(m.p("keep"), &keep).unwrap();
    fs::write(m.p("note"), b"small and acknowledged").unwrap();
    // A big write in flight (each 64 MiB uploaded while the next is
    // written), killed mid-way.
    let mut dd = Command::new("dd")
        .args(["if=/dev/urandom", "bs=1M", "count=400"])
        .arg(format!("of={}", m.p("big").display()))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    sleep(Duration::from_millis(2500));
    m.kill9();
    let _ = dd.wait();
    m.start_again();
    assert_eq!(fs::read(m.p("keep")).unwrap(), keep);
    assert_eq!(fs::read(m.p("note")).unwrap(), b"small and acknowledged");
    // What the file holds now reads without error (a committed version).
    let n = fs::read(m.p("big")).unwrap().len();
    eprintln!("after the kill, big holds {n} bytes");
    m.unmount();
    // Uploads the kill cut off are young orphans: left alone by default,
    // found and repaired without a grace period; nothing is missing.
    let (code, out) = fsck(&args, false, None);
    assert_eq!(code, 0, "{out}");
    let (code, out) = fsck(&args, true, Some("0"));
    assert!(code <= 1, "{out}");
    assert!(!out.contains("missing"), "{out}");
    let (code, out) = fsck(&args, false, Some("0"));
    assert_eq!(code, 0, "{out}");
    m.start_again();
    assert_eq!(fs::read(m.p("keep")).unwrap(), keep);
}

#[test]
fn kill9_mid_truncate_keeps_one_committed_version() {
    let tmp = tempfile::tempdir().unwrap();
    let args = embedded_args(tmp.path(), &s3_endpoint());
    let mut m = Mount::with_backend(&strs(&args));
    let orig = pattern(40 * MIB, 5);
    fs::write(m.p("f"), &orig).unwrap();
    fs::write(m.p("g"), &orig).unwrap();
    // Acknowledged: kept.
    m.kill9_right_after("truncate -s 1000000 f");
    m.start_again();
    assert_eq!(fs::read(m.p("f")).unwrap(), &orig[..1_000_000]);
    // Killed while truncating: the old length or the new, either whole.
    m.kill9_right_after("truncate -s 5000 g & sleep 0.005");
    m.start_again();
    let g = fs::read(m.p("g")).unwrap();
    assert!(
        g.len() == 5000 || g.len() == orig.len(),
        "g is {} bytes",
        g.len()
    );
    assert_eq!(g, &orig[..g.len()]);
    // Growing it again reads zeros past the cut, not the old bytes.
    let f = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
    f.set_len(3_000_000).unwrap();
    drop(f);
    let f = fs::read(m.p("f")).unwrap();
    assert_eq!(&f[..1_000_000], &orig[..1_000_000]);
    assert!(f[1_000_000..].iter().all(|&b| b == 0));
    m.unmount();
    let (code, out) = fsck(&args, true, Some("0"));
    assert!(code <= 1 && !out.contains("missing"), "{out}");
    let (code, out) = fsck(&args, false, Some("0"));
    assert_eq!(code, 0, "{out}");
}

#[test]
fn fsck_finds_and_repairs_orphans_collects_superseded_and_reports_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let args = embedded_args(tmp.path(), &s3_endpoint());
    let mut m = Mount::with_backend(&strs(&args));
    fs::write(m.p("a"), pattern(9 * MIB, 6)).unwrap();
    fs::write(m.p("b"), pattern(9 * MIB, 7)).unwrap();
    m.unmount();
    let store = blocks_of(&args);
    let count = || store.list().unwrap().len();
    let before = count();
    assert_eq!(before, 6, "two files of 9 MiB in 4 MiB blocks");

    // A stray upload (a crashed mount's): an orphan once old enough.
    store
        .put("999999", 0, bytes::Bytes::from(vec![1u8; 1000]))
        .unwrap();
    let (code, out) = fsck(&args, false, None);
    assert_eq!(code, 0, "young: not an orphan yet\n{out}");
    let (code, out) = fsck(&args, false, Some("0"));
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("1 orphan block(s) (1000 bytes)"), "{out}");
    let (code, out) = fsck(&args, true, Some("0"));
    assert_eq!(code, 1, "{out}");
    assert_eq!(count(), before);

    // An overwrite supersedes a's blocks: kept (grace period) until
    // collected, by fsck --repair here.
    m.start_again();
    fs::write(m.p("a"), pattern(9 * MIB, 8)).unwrap();
    fs::remove_file(m.p("b")).unwrap();
    m.unmount();
    assert_eq!(count(), before + 3);
    let (code, out) = fsck(&args, false, None);
    assert_eq!(code, 0, "{out}");
    let (code, out) = fsck(&args, true, Some("0"));
    assert!(code <= 1, "{out}");
    assert_eq!(count(), 3, "only a's new blocks are left");

    // A block a map names, deleted behind esfs's back: reported, and the
    // read fails with EIO instead of returning wrong bytes.
    let victim = store.list().unwrap().remove(1);
    store.delete(&victim.file, &[victim.block]).unwrap();
    let (code, out) = fsck(&args, false, None);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains(&format!("block {} of its map is missing", victim.block)),
        "{out}"
    );
    fs::remove_dir_all(tmp.path().join("cache")).unwrap();
    m.start_again();
    let e = fs::read(m.p("a")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
}

/// An instance of its own, stopped for 20 s under a writing mount.
#[test]
fn object_store_down_20s_then_back() {
    let port = "19740";
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/s3");
    let s3 = |cmd: &[&str]| {
        let out = Command::new(&script)
            .args(cmd)
            .env("ESFS_S3_PORT", port)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/s3 {cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let _ = s3_endpoint(); // the credentials (the same defaults for every instance)
    let url = s3(&["start", "mount-outage"])
        .lines()
        .last()
        .unwrap()
        .to_string();
    let tmp = tempfile::tempdir().unwrap();
    let args = embedded_args(tmp.path(), &url);
    let m = Mount::with_backend(&strs(&args));
    let before = pattern(6 * MIB, 9);
    fs::write(m.p("before"), &before).unwrap();

    s3(&["stop", "mount-outage"]);
    let down = Instant::now();
    // A big file's close waits out the retry budget, then fails: not
    // acknowledged.
    let t = Instant::now();
    // (fs::write ignores close's error: fsync reports it.)
    let mut f = fs::File::create(m.p("during")).unwrap();
    std::io::Write::write_all(&mut f, &pattern(6 * MIB, 10)).unwrap();
    let e = f.sync_all().unwrap_err();
    drop(f);
    assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
    assert!(t.elapsed() >= Duration::from_secs(10), "{:?}", t.elapsed());
    // Small files are inline in the metadata store: unaffected. Cached
    // blocks still read.
    fs::write(m.p("small"), b"written while the object store was down").unwrap();
    assert_eq!(fs::read(m.p("before")).unwrap(), before);
    if let Some(rest) = Duration::from_secs(20).checked_sub(down.elapsed()) {
        sleep(rest);
    }
    s3(&["start", "mount-outage", "--keep"]);

    // Back: the same mount writes again, and the file whose close failed
    // is written out by its next close.
    let after = pattern(6 * MIB, 11);
    fs::write(m.p("after"), &after).unwrap();
    fs::write(m.p("during"), pattern(6 * MIB, 10)).unwrap();
    assert_eq!(fs::read(m.p("after")).unwrap(), after);
    assert_eq!(fs::read(m.p("during")).unwrap(), pattern(6 * MIB, 10));
    assert_eq!(
        fs::read(m.p("small")).unwrap(),
        b"written while the object store was down"
    );
    let log = m.log();
    // One line per failed operation, naming the store and the cause.
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("unavailable")).collect();
    assert!(!lines.is_empty(), "{log}");
    for l in &lines {
        assert!(l.contains(&url) && l.contains("retry budget"), "{log}");
    }
    assert!(log.contains("answers again"), "{log}");
    drop(m);
    s3(&["stop", "mount-outage"]);
}

/// A prefix is stamped with its filesystem's id at first mount: another
/// filesystem's mount there is refused, naming both.
#[test]
fn a_prefix_belongs_to_one_filesystem() {
    let tmp = tempfile::tempdir().unwrap();
    let args = embedded_args(tmp.path(), &s3_endpoint());
    let mut m = Mount::with_backend(&strs(&args));
    fs::write(m.p("f"), pattern(5 * MIB, 12)).unwrap();
    m.unmount();
    let other = tempfile::tempdir().unwrap();
    let mut args2 = args.clone();
    args2[1] = other.path().join("store").to_string_lossy().into_owned();
    let mnt = other.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let mut cmd = vec!["mount".to_string(), mnt.to_string_lossy().into_owned()];
    cmd.extend(args2);
    let (code, out) = esfs(&cmd, None);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("belongs to filesystem") && out.contains("its own prefix"),
        "{out}"
    );
    assert!(!is_esfs_mounted(&mnt));
    // Its own filesystem mounts there again.
    m.start_again();
    assert_eq!(fs::read(m.p("f")).unwrap(), pattern(5 * MIB, 12));
}
