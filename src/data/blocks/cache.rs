//! A bounded cache of whole blocks on local disk (`--cache-dir`,
//! `--cache-size`), least recently used evicted first, by bytes.
//!
//! Blocks are immutable, so an entry never needs invalidating: a name is
//! one content forever. Crash safety: an entry is written to `tmp/` and
//! renamed into place, so a crash leaves a whole entry or a temporary file
//! (removed at the next open), never half an entry under its name. Each
//! entry ends with a trailer (magic, length, CRC-32) checked the first time
//! this process reads it, so a torn or bit-rotten file is dropped and
//! fetched again instead of served.
//!
//! Several processes may share a directory: each accounts for what it
//! wrote or found at open; a file another one evicted is a miss.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: &[u8; 8] = b"esfsblk1";
/// magic, length (u64 LE), CRC-32 (u32 LE).
const TRAILER: u64 = 20;

struct Entry {
    size: u64,
    tick: u64,
    /// Its trailer was checked by this process.
    verified: bool,
}

#[derive(Default)]
struct Lru {
    entries: HashMap<String, Entry>,
    /// tick -> name, oldest first.
    order: BTreeMap<u64, String>,
    /// Bytes of the entries (data, not trailers).
    total: u64,
    tick: u64,
}

impl Lru {
    fn touch(&mut self, name: &str) {
        self.tick += 1;
        if let Some(e) = self.entries.get_mut(name) {
            self.order.remove(&e.tick);
            e.tick = self.tick;
            self.order.insert(self.tick, name.to_string());
        }
    }

    fn add(&mut self, name: &str, size: u64, verified: bool) {
        self.remove(name);
        self.tick += 1;
        self.entries.insert(
            name.to_string(),
            Entry {
                size,
                tick: self.tick,
                verified,
            },
        );
        self.order.insert(self.tick, name.to_string());
        self.total += size;
    }

    fn remove(&mut self, name: &str) -> bool {
        match self.entries.remove(name) {
            Some(e) => {
                self.order.remove(&e.tick);
                self.total -= e.size;
                true
            }
            None => false,
        }
    }

    /// Names to evict so that the entries fit in `cap` bytes.
    fn evict(&mut self, cap: u64) -> Vec<String> {
        let mut out = Vec::new();
        while self.total > cap {
            let Some((_, name)) = self.order.pop_first() else {
                break;
            };
            let e = self.entries.remove(&name).expect("ordered entry");
            self.total -= e.size;
            out.push(name);
        }
        out
    }
}

pub struct BlockCache {
    dir: PathBuf,
    capacity: u64,
    lru: Mutex<Lru>,
    seq: AtomicU64,
}

/// Figures for logs and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheUsage {
    pub entries: usize,
    pub bytes: u64,
}

impl BlockCache {
    /// Open (creating) the cache in `dir`, holding at most `capacity` bytes
    /// of blocks. Entries found there count as used in their files'
    /// modification order; temporary files of a crashed writer go.
    pub fn open(dir: &Path, capacity: u64) -> io::Result<BlockCache> {
        crate::private::dir_all(&dir.join("tmp"))?;
        for f in std::fs::read_dir(dir.join("tmp"))? {
            let _ = std::fs::remove_file(f?.path());
        }
        let mut found = Vec::new();
        for fan in std::fs::read_dir(dir)? {
            let fan = fan?;
            let n = fan.file_name();
            if n == "tmp" || !fan.file_type()?.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(fan.path())? {
                let f = f?;
                let m = f.metadata()?;
                let Some(name) = f.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                if m.len() < TRAILER {
                    let _ = std::fs::remove_file(f.path());
                    continue;
                }
                found.push((m.modified().ok(), name, m.len() - TRAILER));
            }
        }
        found.sort();
        let cache = BlockCache {
            dir: dir.to_path_buf(),
            capacity,
            lru: Mutex::new(Lru::default()),
            seq: AtomicU64::new(0),
        };
        let victims = {
            let mut lru = cache.lru.lock();
            for (_, name, size) in &found {
                lru.add(name, *size, false);
            }
            lru.evict(capacity)
        };
        cache.unlink(victims);
        Ok(cache)
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn path(&self, name: &str) -> PathBuf {
        let fan = &name[name.len().saturating_sub(2)..];
        self.dir.join(fan).join(name)
    }

    fn unlink(&self, names: Vec<String>) {
        for n in names {
            let _ = std::fs::remove_file(self.path(&n));
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.lru.lock().entries.contains_key(name)
    }

    pub fn usage(&self) -> CacheUsage {
        let lru = self.lru.lock();
        CacheUsage {
            entries: lru.entries.len(),
            bytes: lru.total,
        }
    }

    /// Keep `data` as `name` (evicting the least recently used entries to
    /// make room). A block larger than the whole cache is not kept.
    pub fn insert(&self, name: &str, data: &[u8]) -> io::Result<()> {
        let size = data.len() as u64;
        if size > self.capacity {
            return Ok(());
        }
        let tmp = self.dir.join("tmp").join(format!(
            "{}.{}.{}",
            name,
            std::process::id(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut f = crate::private::options()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(data)?;
            let mut trailer = Vec::with_capacity(TRAILER as usize);
            trailer.extend_from_slice(MAGIC);
            trailer.extend_from_slice(&size.to_le_bytes());
            trailer.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
            f.write_all(&trailer)?;
            let path = self.path(name);
            crate::private::dir_all(path.parent().expect("fan-out dir"))?;
            std::fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let victims = {
            let mut lru = self.lru.lock();
            lru.add(name, size, true);
            lru.evict(self.capacity)
        };
        self.unlink(victims);
        Ok(())
    }

    /// Read `buf.len()` bytes of entry `name` at `off`: Some(n) (n short
    /// only at the block's end), None on a miss. An entry that fails its
    /// check is removed and reported as a miss.
    pub fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let verified = {
            let mut lru = self.lru.lock();
            let Some(e) = lru.entries.get(name) else {
                return Ok(None);
            };
            let v = e.verified;
            lru.touch(name);
            v
        };
        let f = match File::open(self.path(name)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.lru.lock().remove(name);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let size = match self.verify(&f, verified) {
            Ok(size) => size,
            Err(why) => {
                log::warn!("block cache: dropping {name}: {why}");
                self.lru.lock().remove(name);
                let _ = std::fs::remove_file(self.path(name));
                return Ok(None);
            }
        };
        if !verified && let Some(e) = self.lru.lock().entries.get_mut(name) {
            e.verified = true;
        }
        if off >= size {
            return Ok(Some(0));
        }
        let n = buf.len().min((size - off) as usize);
        f.read_exact_at(&mut buf[..n], off)?;
        Ok(Some(n))
    }

    /// A whole entry, or None on a miss.
    pub fn get(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let size = match self.lru.lock().entries.get(name) {
            Some(e) => e.size,
            None => return Ok(None),
        };
        let mut buf = vec![0; size as usize];
        match self.read_at(name, 0, &mut buf)? {
            Some(n) if n as u64 == size => Ok(Some(buf)),
            Some(_) | None => Ok(None),
        }
    }

    /// The data length of an entry file, checking its trailer (and, unless
    /// `verified`, its checksum).
    fn verify(&self, f: &File, verified: bool) -> Result<u64, String> {
        let len = f.metadata().map_err(|e| e.to_string())?.len();
        if len < TRAILER {
            return Err(format!("{len} bytes, shorter than its trailer"));
        }
        let size = len - TRAILER;
        let mut t = [0u8; TRAILER as usize];
        f.read_exact_at(&mut t, size).map_err(|e| e.to_string())?;
        let stored = u64::from_le_bytes(t[8..16].try_into().expect("8 bytes"));
        if &t[..8] != MAGIC || stored != size {
            return Err(format!("bad trailer ({size} data bytes, says {stored})"));
        }
        if !verified {
            let mut data = vec![0; size as usize];
            f.read_exact_at(&mut data, 0).map_err(|e| e.to_string())?;
            let crc = u32::from_le_bytes(t[16..20].try_into().expect("4 bytes"));
            if crc32fast::hash(&data) != crc {
                return Err("checksum mismatch".into());
            }
        }
        Ok(size)
    }

    pub fn remove(&self, name: &str) {
        if self.lru.lock().remove(name) {
            let _ = std::fs::remove_file(self.path(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let c = BlockCache::open(dir.path(), 250).unwrap();
        c.insert("a1", &[1; 100]).unwrap();
        c.insert("b2", &[2; 100]).unwrap();
        let mut buf = [0u8; 10];
        // a1 is used, so b2 is the oldest when c3 needs room.
        assert_eq!(c.read_at("a1", 95, &mut buf).unwrap(), Some(5));
        c.insert("c3", &[3; 100]).unwrap();
        assert!(c.contains("a1") && c.contains("c3") && !c.contains("b2"));
        assert_eq!(
            c.usage(),
            CacheUsage {
                entries: 2,
                bytes: 200
            }
        );
        assert_eq!(c.read_at("b2", 0, &mut buf).unwrap(), None);
        // Too big for the cache: not kept, nothing evicted.
        c.insert("d4", &[4; 300]).unwrap();
        assert_eq!(c.usage().entries, 2);
        // Reopened: the entries are found again, and verified on first read.
        drop(c);
        let c = BlockCache::open(dir.path(), 250).unwrap();
        assert_eq!(
            c.usage(),
            CacheUsage {
                entries: 2,
                bytes: 200
            }
        );
        assert_eq!(c.get("c3").unwrap().unwrap(), vec![3; 100]);
        // Reopened smaller: the oldest go.
        drop(c);
        let c = BlockCache::open(dir.path(), 150).unwrap();
        assert_eq!(c.usage().entries, 1);
    }

    #[test]
    fn a_damaged_or_torn_entry_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let c = BlockCache::open(dir.path(), 1 << 20).unwrap();
        c.insert("x1", &[7; 1000]).unwrap();
        c.insert("y2", &[8; 1000]).unwrap();
        c.insert("z3", &[9; 1000]).unwrap();
        drop(c);
        // A flipped byte, a torn tail, and a leftover temporary file.
        let p = dir.path().join("x1/x1");
        let mut d = std::fs::read(&p).unwrap();
        d[10] ^= 1;
        std::fs::write(&p, d).unwrap();
        let p = dir.path().join("y2/y2");
        let d = std::fs::read(&p).unwrap();
        std::fs::write(&p, &d[..900]).unwrap();
        std::fs::write(dir.path().join("tmp/z3.1.1"), b"partial").unwrap();
        let c = BlockCache::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
            0
        );
        let mut buf = [0u8; 4];
        assert_eq!(c.read_at("x1", 0, &mut buf).unwrap(), None);
        assert_eq!(c.read_at("y2", 0, &mut buf).unwrap(), None);
        assert!(!dir.path().join("x1/x1").exists());
        assert_eq!(c.read_at("z3", 998, &mut buf).unwrap(), Some(2));
        assert_eq!(&buf[..2], &[9, 9]);
        assert_eq!(c.usage().entries, 1);
    }
}
