//! Sequential write and read throughput of the block store against an S3
//! server: `bench/s3-blocks.sh` starts SeaweedFS and runs this.
//!
//! Environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
//! ESFS_S3_BUCKET (as `scripts/s3 env` prints them); ESFS_BENCH_MIB (256),
//! ESFS_BENCH_BLOCK_MIB (4), ESFS_BENCH_CONCURRENCY (8).
//!
//! Rows (MB = 10^6 bytes): write = `put` of the whole file in blocks,
//! uploaded in parallel (as a flush of a big buffered write would); read
//! cold = 128 KiB sequential reads from a fresh store, without a cache
//! (one whole-block GET at a time) and with one (prefetching ahead); read
//! warm = the same reads again, served by the cache.

use bytes::Bytes;
use esfs::data::blocks::{BlockConfig, BlockMap, BlockStore, ReadAhead, S3Location};
use std::time::Instant;

fn var(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mib = var("ESFS_BENCH_MIB", 256);
    let len = mib << 20;
    let bucket = std::env::var("ESFS_S3_BUCKET").unwrap_or_else(|_| "esfs".into());
    let prefix = format!("bench-{}", esfs::model::now_ns());
    let mut cfg = BlockConfig::new(S3Location::parse(&format!("s3://{bucket}/{prefix}"))?);
    cfg.block_size = var("ESFS_BENCH_BLOCK_MIB", 4) << 20;
    cfg.concurrency = var("ESFS_BENCH_CONCURRENCY", 8);
    let cache = tempfile::tempdir()?;

    // Incompressible bytes, made before the clock starts.
    let mut v = Vec::with_capacity(len);
    let mut x = 0x9E3779B97F4A7C15u64;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    let data = Bytes::from(v);
    let want = crc32fast::hash(&data);
    let mbps = |secs: f64| len as f64 / 1e6 / secs;

    let store = BlockStore::open(&cfg)?;
    store.check()?;
    println!(
        "{} MiB, {} MiB blocks, {} requests in flight, {}",
        mib,
        cfg.block_size >> 20,
        cfg.concurrency,
        store.describe()
    );
    let t = Instant::now();
    let map = BlockMap::default().write(&store.put("1", 0, data.clone())?);
    let w = t.elapsed().as_secs_f64();
    println!("write               {:7.1} MB/s  ({w:.2} s)", mbps(w));
    drop(store);

    let read = |store: &BlockStore, label: &str| -> Result<(), Box<dyn std::error::Error>> {
        let mut ra = ReadAhead::new(64 << 20);
        let mut buf = vec![0u8; 128 << 10];
        let mut crc = crc32fast::Hasher::new();
        let t = Instant::now();
        let mut off = 0u64;
        while off < len as u64 {
            let n = store.read("1", &map, off, &mut buf, &mut ra)?;
            crc.update(&buf[..n]);
            off += n as u64;
        }
        let s = t.elapsed().as_secs_f64();
        assert_eq!(crc.finalize(), want, "{label}: bytes differ");
        println!("{label:<19} {:7.1} MB/s  ({s:.2} s)", mbps(s));
        Ok(())
    };
    read(&BlockStore::open(&cfg)?, "read cold, no cache")?;
    let mut cached = cfg.clone();
    cached.cache_dir = Some(cache.path().into());
    cached.cache_size = 2 * len as u64;
    let store = BlockStore::open(&cached)?;
    read(&store, "read cold, cache")?;
    store.settle();
    read(&store, "read warm (cache)")?;
    store.delete_file("1")?;
    Ok(())
}
