//! Directory listings kept in memory by the write-through cache
//! ([`super::cache`]): for each directory this process knows completely,
//! its children in cookie order, so a listing is a walk over a B-tree
//! instead of an SQL query plus a JSON value per field per row.
//!
//! A listing starts empty when a directory inode document is created
//! (inode numbers are never reused, so a directory being created has no
//! entries yet) and then follows every entry write the cache passes on,
//! applied from the write's result in the store's order, so it stays exact.
//! Anything uncertain (a failed entry write, an update that touches the
//! listed fields) drops that directory's listing; a rolled-back batch drops
//! them all. Directories not known completely (those from before this
//! mount, or evicted) are listed by the store's search, as before.
//!
//! A listing is also filled from a search that read a directory whole
//! ([`Listings::fill`]), if no write under that directory was applied while
//! the search ran (a per-directory epoch, striped). Writes in flight when
//! the search began apply after the fill, on top of it; two writes under
//! one directory in flight at once (possible only on a shared store, whose
//! writes are not serialized) could apply out of order, so the second drops
//! the listing instead.
//!
//! Where other mounts write too (Elasticsearch), a listing is trusted for
//! the attribute TTL after it was filled or the directory created, as a
//! cached document is: another mount's names show within that bound (and
//! the index's refresh interval). Sole writer: trusted until evicted.
//!
//! Bounded by an approximate byte count: whole directories are evicted,
//! least recently used first.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use compact_str::CompactString;
use serde_json::Value;

/// One child as listed: borrowed from the cache.
#[derive(Debug, Clone, Copy)]
pub struct Child<'a> {
    /// The `name` field (names that are not UTF-8 are escaped there).
    pub name: &'a str,
    pub ino: u64,
    /// The `kind` field.
    pub kind: &'static str,
    pub cookie: u64,
}

/// The entry fields a listing holds; an update of any of them (or of
/// `parent`) drops the listing.
const LISTED: [&str; 5] = ["parent", "name", "ino", "kind", "cookie"];

/// The fields of `src` a listing (or the decision to adopt a new
/// directory: `kind`) reads; the rest of a source need not be copied.
pub(crate) fn listed_fields(src: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for f in LISTED {
        if let Some(v) = src.get(f) {
            out.insert(f.to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// Bytes charged per child on top of its strings (two map slots, a row).
const ROW_OVERHEAD: usize = 128;
/// Bytes charged per directory (its maps and slot), so that many empty
/// directories count too.
const DIR_OVERHEAD: usize = 256;

struct Row {
    /// The entry id's part after `<parent>/`.
    key: Arc<str>,
    /// Inline up to 24 bytes: a listing reads every name, and a name in its
    /// own allocation cost a cache miss per entry (a third of a listing).
    name: CompactString,
    ino: u64,
    kind: &'static str,
}

struct Listing {
    rows: BTreeMap<u64, Row>,
    /// Id key -> cookie, to apply deletes (which carry only the id).
    by_key: HashMap<Arc<str>, u64>,
    bytes: usize,
    used: u64,
    /// When the store last answered for the whole directory.
    since: Instant,
}

impl Listing {
    fn new() -> Listing {
        Listing {
            rows: BTreeMap::new(),
            by_key: HashMap::new(),
            bytes: DIR_OVERHEAD,
            used: 0,
            since: Instant::now(),
        }
    }
}

/// Stripes of directories for the fill epochs and in-flight writes.
const STRIPES: usize = 256;

/// Taken before the search (or the first of the searches) that reads a
/// directory whole, for [`Listings::fill`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Token {
    epoch: u64,
    /// The listing is trusted from here (not from when the last page came).
    at: Instant,
}

/// One child of a directory read whole by a search, for [`Listings::fill`].
pub(crate) struct Listed {
    pub name: String,
    pub ino: u64,
    pub kind: &'static str,
    pub cookie: u64,
}

pub(crate) struct Listings {
    dirs: HashMap<u64, Listing>,
    bytes: usize,
    budget: usize,
    tick: u64,
    /// `None`: this process is the only writer, a listing stays exact.
    ttl: Option<Duration>,
    /// Per stripe: bumped whenever a write under one of its directories
    /// is applied (a fill that read before it may lack it).
    epochs: [u64; STRIPES],
    /// Per stripe: writes under its directories sent and not yet applied.
    in_flight: [u32; STRIPES],
}

fn stripe(dir: u64) -> usize {
    (dir % STRIPES as u64) as usize
}

/// An entry id's parent and the rest: `<parent>/<name>` or
/// `<parent>//<base64url(name)>`.
pub(crate) fn split_id(id: &str) -> Option<(u64, &str)> {
    let (p, key) = id.split_once('/')?;
    Some((p.parse().ok()?, key))
}

/// The id key (see [`split_id`]) of the entry named `name` (the `name`
/// field's form) in `dir`.
fn entry_key(dir: u64, name: &str) -> String {
    let id = crate::model::entry_id(dir, &crate::model::decode_cow(name));
    let prefix = id.find('/').map_or(0, |i| i + 1);
    id[prefix..].to_string()
}

/// The `kind` values the filesystem writes, interned.
pub(crate) fn kind_of(v: &Value) -> Option<&'static str> {
    Some(match v.as_str()? {
        "file" => "file",
        "dir" => "dir",
        "symlink" => "symlink",
        "fifo" => "fifo",
        "socket" => "socket",
        "char" => "char",
        "block" => "block",
        _ => return None,
    })
}

impl Listings {
    /// `ttl`: how long a listing is trusted (`None`: the sole writer's,
    /// until evicted).
    pub(crate) fn new(budget: usize, ttl: Option<Duration>) -> Listings {
        Listings {
            dirs: HashMap::new(),
            bytes: 0,
            budget,
            tick: 0,
            ttl,
            epochs: [0; STRIPES],
            in_flight: [0; STRIPES],
        }
    }

    /// A directory inode was just created: it has no children.
    pub(crate) fn adopt_empty(&mut self, dir: u64) {
        self.install(dir, Listing::new());
    }

    fn install(&mut self, dir: u64, mut l: Listing) {
        self.drop_dir(dir);
        self.tick += 1;
        l.used = self.tick;
        self.bytes += l.bytes;
        self.dirs.insert(dir, l);
        if self.bytes > self.budget {
            self.evict();
        }
    }

    /// Taken before the searches that read `dir` whole, for
    /// [`Listings::fill`]. `None`: no listing would be kept.
    pub(crate) fn token(&self, dir: u64) -> Option<Token> {
        // (A zero TTL, `--attr-ttl 0`, would never use one.)
        let useless = self.budget == 0 || self.ttl == Some(Duration::ZERO);
        (!useless).then(|| Token {
            epoch: self.epochs[stripe(dir)],
            at: Instant::now(),
        })
    }

    /// `children` are all of `dir`'s, in cookie order, from searches begun
    /// after `token` was taken: kept unless a write under `dir` was
    /// applied since.
    pub(crate) fn fill(&mut self, dir: u64, token: Token, children: Vec<Listed>) {
        if self.epochs[stripe(dir)] != token.epoch {
            return;
        }
        let mut l = Listing::new();
        l.since = token.at;
        for c in children {
            let key: Arc<str> = Arc::from(entry_key(dir, &c.name));
            l.bytes += ROW_OVERHEAD + key.len() + c.name.len();
            l.by_key.insert(key.clone(), c.cookie);
            let row = Row {
                key,
                name: CompactString::new(&c.name),
                ino: c.ino,
                kind: c.kind,
            };
            if l.rows.insert(c.cookie, row).is_some() {
                return; // two names with one cookie: not a listing to trust
            }
        }
        if l.bytes * 4 <= self.budget {
            self.install(dir, l);
        }
    }

    /// One write's directories' stripes, each once.
    fn stripes(dirs: &[u64]) -> Vec<usize> {
        let mut s: Vec<usize> = dirs.iter().map(|&d| stripe(d)).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// A write under `dirs` is about to be sent.
    pub(crate) fn sending(&mut self, dirs: &[u64]) {
        for s in Self::stripes(dirs) {
            self.in_flight[s] += 1;
        }
    }

    /// The write under `dirs` announced by [`Listings::sending`] was
    /// applied (or abandoned).
    pub(crate) fn sent(&mut self, dirs: &[u64]) {
        for s in Self::stripes(dirs) {
            let n = &mut self.in_flight[s];
            *n = n.saturating_sub(1);
        }
    }

    /// Before applying a write under `dir`: whether to apply it. Bumps the
    /// epoch; with another write under the stripe in flight (whose answer
    /// may come in either order with this one), drops the listing.
    fn applying(&mut self, dir: u64) -> bool {
        let s = stripe(dir);
        self.epochs[s] += 1;
        if self.in_flight[s] > 1 {
            self.drop_dir(dir);
            return false;
        }
        true
    }

    pub(crate) fn drop_dir(&mut self, dir: u64) {
        if let Some(l) = self.dirs.remove(&dir) {
            self.bytes -= l.bytes;
        }
    }

    pub(crate) fn clear(&mut self) {
        self.dirs.clear();
        self.bytes = 0;
    }

    /// The entry document `id` was written with `src` (created or replaced).
    pub(crate) fn put(&mut self, id: &str, src: &Value) {
        let Some((dir, key)) = split_id(id) else {
            return;
        };
        if !self.applying(dir) {
            return;
        }
        let Some(l) = self.dirs.get_mut(&dir) else {
            return;
        };
        let fields = (
            src["parent"].as_u64(),
            src["name"].as_str(),
            src["ino"].as_u64(),
            kind_of(&src["kind"]),
            src["cookie"].as_u64(),
        );
        let (Some(parent), Some(name), Some(ino), Some(kind), Some(cookie)) = fields else {
            return self.drop_dir(dir);
        };
        if parent != dir || l.rows.get(&cookie).is_some_and(|r| &*r.key != key) {
            return self.drop_dir(dir);
        }
        self.tick += 1;
        l.used = self.tick;
        let before = l.bytes;
        if let Some(old) = l.by_key.remove(key)
            && let Some(r) = l.rows.remove(&old)
        {
            l.bytes -= ROW_OVERHEAD + r.key.len() + r.name.len();
        }
        let key: Arc<str> = Arc::from(key);
        l.bytes += ROW_OVERHEAD + key.len() + name.len();
        l.by_key.insert(key.clone(), cookie);
        l.rows.insert(
            cookie,
            Row {
                key,
                name: CompactString::new(name),
                ino,
                kind,
            },
        );
        self.bytes = self.bytes + l.bytes - before;
        if self.bytes > self.budget {
            self.evict();
        }
    }

    /// The entry document `id` is gone.
    pub(crate) fn delete(&mut self, id: &str) {
        let Some((dir, key)) = split_id(id) else {
            return;
        };
        if !self.applying(dir) {
            return;
        }
        let Some(l) = self.dirs.get_mut(&dir) else {
            return;
        };
        if let Some(c) = l.by_key.remove(key)
            && let Some(r) = l.rows.remove(&c)
        {
            let n = ROW_OVERHEAD + r.key.len() + r.name.len();
            l.bytes -= n;
            self.bytes -= n;
        }
    }

    /// The entry document `id` may have changed in ways not known here.
    pub(crate) fn invalidate(&mut self, id: &str) {
        if let Some((dir, _)) = split_id(id) {
            self.epochs[stripe(dir)] += 1;
            self.drop_dir(dir);
        }
    }

    /// A partial update of `id` with `doc`: harmless unless it sets a
    /// listed field.
    pub(crate) fn update(&mut self, id: &str, doc: &Value) {
        if LISTED.iter().any(|f| doc.get(f).is_some()) {
            self.invalidate(id);
        }
    }

    /// Passes the children of `dir` with a cookie above `after` to `f`, in
    /// cookie order, until it returns true. `None`: `dir` is not known (or
    /// no longer trusted).
    pub(crate) fn visit(
        &mut self,
        dir: u64,
        after: u64,
        f: &mut dyn FnMut(Child<'_>) -> bool,
    ) -> Option<()> {
        self.tick += 1;
        let l = self.dirs.get_mut(&dir)?;
        if self.ttl.is_some_and(|t| l.since.elapsed() >= t) {
            self.drop_dir(dir);
            return None;
        }
        l.used = self.tick;
        for (&cookie, r) in l.rows.range(after.saturating_add(1)..) {
            let stop = f(Child {
                name: &r.name,
                ino: r.ino,
                kind: r.kind,
                cookie,
            });
            if stop {
                break;
            }
        }
        Some(())
    }

    /// Evicts least recently used directories down to 3/4 of the budget
    /// (so evictions, each a sort, stay rare).
    fn evict(&mut self) {
        let mut by_age: Vec<(u64, u64)> = self.dirs.iter().map(|(d, l)| (l.used, *d)).collect();
        by_age.sort_unstable();
        for (_, d) in by_age {
            if self.bytes <= self.budget / 4 * 3 {
                break;
            }
            self.drop_dir(d);
        }
    }
}

/// A directory being read whole, page after page from offset 0: what the
/// searches returned so far, offered to the store as its listing once a
/// short page ends it (so a directory of any size, up to `GATHER_MAX`
/// names, is listed from memory next time).
pub struct Gather {
    token: Token,
    /// The highest cookie gathered.
    upto: u64,
    rows: Vec<Listed>,
}

/// Names gathered at most: about what a quarter of the listings' memory
/// budget (the most one directory may take) holds.
const GATHER_MAX: usize = 100_000;

impl Gather {
    /// Gathering from the start (the dots are offsets 1 and 2), under the
    /// store's `token`.
    pub(crate) fn start(token: Token) -> Gather {
        Gather {
            token,
            upto: 2,
            rows: Vec::new(),
        }
    }

    /// The highest cookie gathered.
    pub fn upto(&self) -> u64 {
        self.upto
    }

    /// An entry read (`kind` as stored); those up to `upto` are in already.
    /// False: it cannot be gathered (too many names, an unknown kind).
    pub fn add(&mut self, name: &str, ino: u64, kind: &Value, cookie: u64) -> bool {
        if cookie <= self.upto {
            return true;
        }
        match kind_of(kind) {
            Some(k) if self.rows.len() < GATHER_MAX => {
                self.rows.push(Listed {
                    name: name.to_string(),
                    ino,
                    kind: k,
                    cookie,
                });
                self.upto = cookie;
                true
            }
            _ => false,
        }
    }

    /// The token and the directory's rows, for the store.
    pub(crate) fn into_listing(self) -> (Token, Vec<Listed>) {
        (self.token, self.rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(parent: u64, name: &str, ino: u64, cookie: u64) -> Value {
        json!({"parent": parent, "name": name, "ino": ino, "kind": "file", "cookie": cookie, "path": "/x"})
    }

    fn names(l: &mut Listings, dir: u64, after: u64) -> Option<Vec<String>> {
        let mut out = Vec::new();
        l.visit(dir, after, &mut |c| {
            out.push(format!("{}:{}", c.name, c.cookie));
            false
        })?;
        Some(out)
    }

    #[test]
    fn follows_creates_renames_and_deletes_in_cookie_order() {
        let mut l = Listings::new(1 << 20, None);
        assert_eq!(names(&mut l, 5, 0), None, "unknown directory");
        l.put("5/a", &entry(5, "a", 10, 30));
        assert_eq!(names(&mut l, 5, 0), None, "a put does not make it known");
        l.adopt_empty(5);
        assert_eq!(names(&mut l, 5, 0), Some(vec![]));
        l.put("5/b", &entry(5, "b", 11, 20));
        l.put("5/a", &entry(5, "a", 10, 30));
        assert_eq!(names(&mut l, 5, 2).unwrap(), ["b:20", "a:30"]);
        assert_eq!(names(&mut l, 5, 20).unwrap(), ["a:30"]);
        // Replacing a name (a rename over it) takes the new cookie.
        l.put("5/b", &entry(5, "b", 12, 40));
        assert_eq!(names(&mut l, 5, 0).unwrap(), ["a:30", "b:40"]);
        l.delete("5/a");
        l.delete("5/zz");
        assert_eq!(names(&mut l, 5, 0).unwrap(), ["b:40"]);
        // Other directories' writes do not touch it.
        l.put("6/c", &entry(6, "c", 13, 50));
        assert_eq!(names(&mut l, 5, 0).unwrap(), ["b:40"]);
    }

    #[test]
    fn anything_uncertain_forgets_the_directory() {
        let mut l = Listings::new(1 << 20, None);
        l.adopt_empty(5);
        l.update("5/a", &json!({"path": "/y", "dir": "/"}));
        assert!(names(&mut l, 5, 0).is_some(), "path updates are harmless");
        l.update("5/a", &json!({"cookie": 7}));
        assert!(names(&mut l, 5, 0).is_none());
        l.adopt_empty(5);
        l.put("5/a", &json!({"parent": 5, "name": "a"}));
        assert!(names(&mut l, 5, 0).is_none(), "a source without fields");
        l.adopt_empty(5);
        l.put("5/a", &entry(6, "a", 1, 9));
        assert!(names(&mut l, 5, 0).is_none(), "parent and id disagree");
        l.adopt_empty(5);
        l.invalidate("5/q");
        assert!(names(&mut l, 5, 0).is_none());
    }

    fn child(name: &str, ino: u64, cookie: u64) -> Listed {
        Listed {
            name: name.into(),
            ino,
            kind: "file",
            cookie,
        }
    }

    #[test]
    fn a_search_fills_unless_a_write_under_the_directory_landed_meanwhile() {
        let mut l = Listings::new(1 << 20, None);
        let t = l.token(5).unwrap();
        l.fill(5, t, vec![child("b", 11, 20), child("a", 10, 30)]);
        assert_eq!(names(&mut l, 5, 0).unwrap(), ["b:20", "a:30"]);
        // Deletes find filled names by id, non-UTF-8 ones too.
        let odd = crate::model::encode_bytes(b"x\xff");
        let t = l.token(6).unwrap();
        l.fill(6, t, vec![child(&odd, 12, 40)]);
        l.delete(&crate::model::entry_id(6, b"x\xff"));
        assert_eq!(names(&mut l, 6, 0).unwrap(), Vec::<String>::new());

        // A write applied between the token and the fill: not kept.
        let t = l.token(7).unwrap();
        l.sending(&[7]);
        l.put("7/c", &entry(7, "c", 13, 50));
        l.sent(&[7]);
        l.fill(7, t, vec![child("a", 10, 30)]);
        assert_eq!(names(&mut l, 7, 0), None, "the search may lack c");
        // A write in flight at the token, applied after the fill: on top.
        let t = l.token(7).unwrap();
        l.sending(&[7]);
        l.fill(7, t, vec![child("a", 10, 30)]);
        l.delete("7/a");
        l.sent(&[7]);
        assert_eq!(names(&mut l, 7, 0).unwrap(), Vec::<String>::new());
        // Two writes under one directory in flight at once may apply in
        // either order: the first to apply drops the listing.
        l.sending(&[7]);
        l.sending(&[7]);
        l.put("7/d", &entry(7, "d", 14, 60));
        assert_eq!(names(&mut l, 7, 0), None);
        l.sent(&[7]);
        l.delete("7/d");
        l.sent(&[7]);
        assert_eq!(names(&mut l, 7, 0), None);
        // One write under two directories of one stripe is one write.
        l.adopt_empty(3);
        l.sending(&[3, 3 + STRIPES as u64]);
        l.put("3/a", &entry(3, "a", 15, 70));
        l.sent(&[3, 3 + STRIPES as u64]);
        assert_eq!(names(&mut l, 3, 0).unwrap(), ["a:70"]);
        // A conflict or failure forgets it too, and a fill racing that.
        let t = l.token(8).unwrap();
        l.invalidate("8/x");
        l.fill(8, t, vec![]);
        assert_eq!(names(&mut l, 8, 0), None);
        // Two names with one cookie are not a listing.
        let t = l.token(8).unwrap();
        l.fill(8, t, vec![child("a", 1, 3), child("b", 2, 3)]);
        assert_eq!(names(&mut l, 8, 0), None);
    }

    #[test]
    fn shared_listings_are_trusted_for_the_ttl() {
        let mut l = Listings::new(1 << 20, Some(Duration::from_millis(200)));
        let t = l.token(5).unwrap();
        l.fill(5, t, vec![child("a", 10, 30)]);
        l.adopt_empty(6);
        // Own writes keep it exact, and do not extend the trust.
        std::thread::sleep(Duration::from_millis(120));
        l.sending(&[5]);
        l.put("5/b", &entry(5, "b", 11, 40));
        l.sent(&[5]);
        assert_eq!(names(&mut l, 5, 0).unwrap(), ["a:30", "b:40"]);
        assert!(names(&mut l, 6, 0).is_some());
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(
            names(&mut l, 5, 0),
            None,
            "another mount may have changed it"
        );
        assert_eq!(names(&mut l, 6, 0), None);
        assert_eq!(l.bytes, 0);
        // Trusted from the token, taken before the searches, not from the
        // fill after them.
        let t = l.token(5).unwrap();
        std::thread::sleep(Duration::from_millis(220));
        l.fill(5, t, vec![child("a", 10, 30)]);
        assert_eq!(names(&mut l, 5, 0), None);
        // A zero TTL keeps nothing.
        assert!(
            Listings::new(1 << 20, Some(Duration::ZERO))
                .token(5)
                .is_none()
        );
    }

    #[test]
    fn bounded_by_bytes_evicting_the_least_recently_used() {
        let mut l = Listings::new(100 * (ROW_OVERHEAD + 8), None);
        for d in 1..=3 {
            l.adopt_empty(d);
        }
        for i in 0..40 {
            l.put(
                &format!("1/n{i:02}"),
                &entry(1, &format!("n{i:02}"), 100 + i, 100 + i),
            );
        }
        names(&mut l, 1, 0).unwrap(); // 1 is now the most recent
        for i in 0..40 {
            l.put(
                &format!("2/n{i:02}"),
                &entry(2, &format!("n{i:02}"), 200 + i, 200 + i),
            );
            l.put(
                &format!("3/n{i:02}"),
                &entry(3, &format!("n{i:02}"), 300 + i, 300 + i),
            );
        }
        assert!(l.bytes <= l.budget);
        assert_eq!(l.bytes, l.dirs.values().map(|d| d.bytes).sum::<usize>());
        assert!(l.dirs.len() < 3, "something was evicted");
        // Empty directories count too.
        for d in 10..10_000 {
            l.adopt_empty(d);
        }
        assert!(
            l.bytes <= l.budget && l.dirs.len() < 100,
            "{}",
            l.dirs.len()
        );
        // What is kept is still exact.
        for (d, list) in &l.dirs {
            assert_eq!(list.rows.len(), list.by_key.len(), "dir {d}");
        }
    }
}
