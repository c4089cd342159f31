//! The document model: what an inode and a name look like as documents, how
//! byte names become index-safe strings, and how document ids are derived.
//!
//! Names are bytes. The index needs UTF-8, so a name that is not valid UTF-8
//! is stored with each invalid byte written as NUL followed by two hex digits
//! (`b"caf\xe9"` -> `"caf\0E9"`). Linux names never contain NUL or `/`, so the
//! mapping is injective (no two names collide), keeps `/` as the only path
//! separator (subtree queries stay exact), and valid UTF-8 names are stored
//! exactly as they are.
//!
//! A larger file's contents in object storage are its [`block_map`], held in
//! its inode document.

pub mod block_map;

use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

pub const ROOT_INO: u64 = 1;
/// NAME_MAX: longer names are ENAMETOOLONG.
pub const NAME_MAX: usize = 255;

/// Store a byte name (or symlink target) as an index-safe string, losslessly.
pub fn encode_bytes(bytes: &[u8]) -> String {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return s.to_string();
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push('\0');
            out.push_str(&format!("{b:02X}"));
        }
    }
    out
}

/// [`decode_bytes`], borrowing when there is nothing to decode.
pub fn decode_cow(s: &str) -> std::borrow::Cow<'_, [u8]> {
    if s.contains('\0') {
        decode_bytes(s).into()
    } else {
        s.as_bytes().into()
    }
}

/// [`decode_bytes`] of an owned string: no copy for the usual name.
pub fn decode_string(s: String) -> Vec<u8> {
    if s.contains('\0') {
        decode_bytes(&s)
    } else {
        s.into_bytes()
    }
}

/// Inverse of [`encode_bytes`].
pub fn decode_bytes(s: &str) -> Vec<u8> {
    if !s.contains('\0') {
        return s.as_bytes().to_vec();
    }
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == 0
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// `_id` of the entry document for `name` in directory `parent`: readable
/// when the name is UTF-8, base64url otherwise (`//` cannot occur in the
/// first form since names are never empty). At most 362 bytes < 512.
pub fn entry_id(parent: u64, name: &[u8]) -> String {
    match std::str::from_utf8(name) {
        Ok(s) => format!("{parent}/{s}"),
        Err(_) => format!(
            "{parent}//{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(name)
        ),
    }
}

/// The directory an entry id ([`entry_id`]) is in. An entry's id never
/// changes and names its parent, so neither does its parent: a rename
/// writes a new entry and deletes the old one.
pub fn entry_parent(id: &str) -> Option<u64> {
    id.split_once('/').and_then(|(p, _)| p.parse().ok())
}

pub fn inode_id(ino: u64) -> String {
    ino.to_string()
}

/// Full path of `name` inside the directory whose path is `dir`.
pub fn join_path(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    Char,
    Block,
}

impl Kind {
    /// From its serialized name ([`crate::store::listing`] keeps only
    /// these); anything else reads as a regular file.
    pub fn from_name(s: &str) -> Kind {
        match s {
            "dir" => Kind::Dir,
            "symlink" => Kind::Symlink,
            "fifo" => Kind::Fifo,
            "socket" => Kind::Socket,
            "char" => Kind::Char,
            "block" => Kind::Block,
            _ => Kind::File,
        }
    }

    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::Char,
            libc::S_IFBLK => Kind::Block,
            0 => Kind::File, // mknod(2) treats a zero type as a regular file
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Fifo => "fifo",
            Kind::Socket => "socket",
            Kind::Char => "char",
            Kind::Block => "block",
        }
    }
}

/// One name of an inode: (parent directory inode, encoded name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub p: u64,
    pub n: String,
}

/// The inode document: the truth for attributes (JuiceFS-style split, so
/// hard links share one set of attributes and one content key).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Inode {
    pub ino: u64,
    pub kind: Kind,
    /// Permission bits plus setuid/setgid/sticky (07777); the type is `kind`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    #[serde(default)]
    pub rdev: u32,
    /// Times in nanoseconds since the epoch.
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub btime_ns: i64,
    /// Symlink target, encoded like names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// xattr name (encoded) -> base64 value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
    /// Key of the contents in the data store (regular files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Back-links to the names of this inode (one for directories).
    #[serde(default)]
    pub links: Vec<Link>,
    /// nlink reached 0 while the file was open: delete on last close (or at
    /// the next mount, if this one dies first).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub orphan: bool,
    /// Bytes the data store holds for the contents (what `st_blocks`
    /// counts: a sparse file's holes are not stored), taken when they are
    /// written back. Absent in documents from before: the size stands in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<u64>,
    /// The block map of contents in object storage (`--data s3://`):
    /// committed here, with the size, in one versioned write of this
    /// document, so a reader gets a length and a map of one version (see
    /// `crate::data::objects`). Not indexed (the mappings are
    /// `dynamic: false` and declare no `map`); about 55 bytes per 4 MiB
    /// block. None: the file never had blocks (inline, or no S3 store),
    /// or an older esfs keeps its map in a `<key>:map` document; Some of
    /// an empty map: it had blocks and was cut to nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<block_map::BlockMap>,
}

impl Inode {
    /// Directory inodes know their (single) parent.
    pub fn parent(&self) -> Option<u64> {
        self.links.first().map(|l| l.p)
    }

    /// 512-byte blocks, as `st_blocks` counts them.
    pub fn blocks(&self) -> u64 {
        self.stored.unwrap_or(self.size).div_ceil(512)
    }
}

/// The entry document: one per name in the tree; what search sees.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub parent: u64,
    pub name: String,
    /// Full path of this name (`path.tree` selects the subtree).
    pub path: String,
    /// Path of the parent directory.
    pub dir: String,
    pub ino: u64,
    pub kind: Kind,
    /// Stable readdir position, unique within the filesystem.
    pub cookie: u64,
    // Copies of the inode's searchable attributes, refreshed on close/setattr.
    pub size: u64,
    /// Milliseconds since the epoch.
    pub mtime: i64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// What the indexer made of the contents (see `crate::search::indexer`):
    /// [`INDEXED_TEXT`] (the text is the inode's document in `texts`),
    /// [`INDEXED_BINARY`] or [`INDEXED_TOO_LARGE`]; absent = not indexed
    /// (yet), which search treats like binary: the file is always scanned.
    /// Valid for the `size`/`mtime` above, cleared when they change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_state: Option<String>,
    /// The inode's mtime (ns) when `text_state` was decided: any other
    /// mtime means it is stale (see [`Entry::refresh_attrs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_mtime_ns: Option<i64>,
    /// The inode's xattrs as keywords (see [`xattr_keywords`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xattrs: Vec<String>,
}

/// The fields every entry has (the rest are optional: `text_state`,
/// `text_mtime_ns`, `xattrs`).
pub const ENTRY_ALWAYS: [&str; 12] = [
    "parent", "name", "path", "dir", "ino", "kind", "cookie", "size", "mtime", "mode", "uid", "gid",
];

/// Whether `source`, an entry's brief source rebuilt from the index's
/// columns (Elasticsearch's doc values), holds everything its stored
/// source would: a keyword longer than the index keeps (a path of more than
/// 8191 characters) has no column, and an entry indexed before
/// `text_mtime_ns` became a column lacks it.
pub fn entry_columns_whole(source: &serde_json::Value) -> bool {
    ENTRY_ALWAYS.iter().all(|k| source.get(k).is_some())
        && (source.get("text_state").is_none() || source.get("text_mtime_ns").is_some())
}

/// The id of the entry whose (rebuilt) source is `source`.
pub fn entry_id_of(source: &serde_json::Value) -> Option<String> {
    let parent = source.get("parent")?.as_u64()?;
    let name = source.get("name")?.as_str()?;
    Some(entry_id(parent, &decode_cow(name)))
}

/// A regular file's text, for content search: the document `texts/<ino>`,
/// written by the content indexer only (see `crate::search::indexer`).
/// Entries point to it with [`Entry::text_state`] = [`INDEXED_TEXT`] at
/// the same `mtime_ns`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileText {
    pub ino: u64,
    pub contents: String,
    /// The inode's mtime (ns) the text was read at.
    pub mtime_ns: i64,
}

/// The id of an inode's document in `texts`.
pub fn text_id(ino: u64) -> String {
    ino.to_string()
}

pub const INDEXED_TEXT: &str = "text";
pub const INDEXED_BINARY: &str = "binary";
pub const INDEXED_TOO_LARGE: &str = "too_large";

impl Entry {
    /// The entry naming `inode` `ename` in directory `parent` (at `dir`),
    /// with its copies of the inode's attributes.
    pub fn new(parent: u64, ename: &str, dir: String, inode: &Inode, cookie: u64) -> Entry {
        let mut entry = Entry {
            parent,
            name: ename.to_string(),
            path: join_path(&dir, ename),
            dir,
            ino: inode.ino,
            kind: inode.kind,
            cookie,
            size: 0,
            mtime: 0,
            mode: 0,
            uid: 0,
            gid: 0,
            text_state: None,
            text_mtime_ns: None,
            xattrs: vec![],
        };
        entry.refresh_attrs(inode);
        entry
    }

    /// Copy the inode's searchable attributes; true when anything changed.
    /// A changed size or mtime means other contents: the text state is
    /// dropped (search then scans the file, whatever `texts` holds) until
    /// the indexer redoes it.
    pub fn refresh_attrs(&mut self, inode: &Inode) -> bool {
        let before = (self.size, self.mtime, self.mode, self.uid, self.gid);
        self.size = inode.size;
        self.mtime = inode.mtime_ns.div_euclid(1_000_000);
        self.mode = inode.mode;
        self.uid = inode.uid;
        self.gid = inode.gid;
        let mut changed = before != (self.size, self.mtime, self.mode, self.uid, self.gid);
        if self.text_state.is_some()
            && ((before.0, before.1) != (self.size, self.mtime)
                || self.text_mtime_ns != Some(inode.mtime_ns))
        {
            self.text_state = None;
            self.text_mtime_ns = None;
            changed = true;
        }
        let x = xattr_keywords(inode);
        if x != self.xattrs {
            self.xattrs = x;
            changed = true;
        }
        changed
    }

    /// The inode-derived fields of `from` (for RENAME_EXCHANGE, where a
    /// position keeps its name and takes the other inode).
    pub fn take_inode_fields(&mut self, from: &Entry) {
        self.ino = from.ino;
        self.kind = from.kind;
        self.size = from.size;
        self.mtime = from.mtime;
        self.mode = from.mode;
        self.uid = from.uid;
        self.gid = from.gid;
        self.text_state = from.text_state.clone();
        self.text_mtime_ns = from.text_mtime_ns;
        self.xattrs = from.xattrs.clone();
    }
}

/// An inode's xattrs as search keywords: for every xattr whose name is UTF-8,
/// `name` alone, and when its value is UTF-8 (a trailing NUL dropped),
/// `name=value`, plus `name=item` for each comma-separated item (file
/// managers keep tags as `user.xdg.tags=work,personal`). Sorted, unique.
pub fn xattr_keywords(inode: &Inode) -> Vec<String> {
    use base64::Engine;
    let mut out = Vec::new();
    for (k, v) in &inode.xattrs {
        if k.contains('\0') {
            continue; // not UTF-8 (encoded bytes)
        }
        out.push(k.clone());
        let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(v) else {
            continue;
        };
        let raw = raw.strip_suffix(b"\0").unwrap_or(&raw);
        let Ok(val) = std::str::from_utf8(raw) else {
            continue;
        };
        if val.contains('\0') || val.len() > 4096 {
            continue;
        }
        out.push(format!("{k}={val}"));
        if val.contains(',') {
            for item in val.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                out.push(format!("{k}={item}"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Whether timestamps come from the kernel's clock (see `use_kernel_clock`).
static KERNEL_CLOCK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Stamp times with the clock the kernel stamps file times with (the coarse
/// realtime clock, one tick behind at most): once the kernel owns files'
/// mtime and ctime (writeback-cache mode), times esfs stamps (a create, a
/// rename) must not be later than a write the kernel stamps after them,
/// or make would see a file written after its prerequisite was made as
/// older than it. A create and a write in the same tick then also leave
/// the kernel no new time to send.
pub fn use_kernel_clock() {
    KERNEL_CLOCK.store(true, std::sync::atomic::Ordering::Relaxed);
}

pub fn now_ns() -> i64 {
    if KERNEL_CLOCK.load(std::sync::atomic::Ordering::Relaxed) {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer; CLOCK_REALTIME_COARSE always exists on Linux.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
            return ts.tv_sec * 1_000_000_000 + ts.tv_nsec;
        }
    }
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    d.as_nanos() as i64
}

pub fn system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + std::time::Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - std::time::Duration::from_nanos(ns.unsigned_abs())
    }
}

pub fn ns_of(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry rebuilt from columns names its id as the stored one does
    /// (a name that is not UTF-8 included), and is whole only with every
    /// field an entry always has, and the text's mtime when it was indexed.
    #[test]
    fn entries_rebuilt_from_columns() {
        let raw = b"caf\xe9";
        let name = encode_bytes(raw);
        let mut v = serde_json::json!({
            "parent": 3, "name": name, "path": join_path("/d", &name), "dir": "/d",
            "ino": 7, "kind": "file", "cookie": 9, "size": 0, "mtime": 0, "mode": 420,
            "uid": 0, "gid": 0,
        });
        serde_json::from_value::<Entry>(v.clone()).expect("an entry");
        assert_eq!(entry_id_of(&v), Some(entry_id(3, raw)));
        assert!(entry_columns_whole(&v));
        v["text_state"] = INDEXED_TEXT.into();
        assert!(
            !entry_columns_whole(&v),
            "indexed, without the text's mtime"
        );
        v["text_mtime_ns"] = 5.into();
        assert!(entry_columns_whole(&v));
        v.as_object_mut().unwrap().remove("path");
        assert!(!entry_columns_whole(&v), "a path too long for its column");
        v.as_object_mut().unwrap().remove("parent");
        assert_eq!(entry_id_of(&v), None);
    }

    #[test]
    fn names_round_trip() {
        for name in [
            &b"plain"[..],
            b"caf\xe9",
            b"\xff\xfe",
            b"a\\b%c",
            "héllo wörld".as_bytes(),
            b"x\xe9y\xc3",
        ] {
            assert_eq!(decode_bytes(&encode_bytes(name)), name, "{name:?}");
        }
        assert_eq!(encode_bytes(b"caf\xe9"), "caf\0E9");
        assert_eq!(encode_bytes("é".as_bytes()), "é");
    }

    #[test]
    fn encoding_is_injective_for_lookalikes() {
        // A UTF-8 name spelling the escape can never equal an escaped name:
        // real names cannot contain NUL.
        assert_ne!(encode_bytes(b"\xe9"), encode_bytes(b"E9"));
    }

    #[test]
    fn entry_ids_fit_elasticsearch() {
        let long = vec![0xffu8; 255];
        assert!(entry_id(u64::MAX, &long).len() <= 512);
        let long = "é".repeat(127);
        assert!(entry_id(u64::MAX, long.as_bytes()).len() <= 512);
        assert_eq!(entry_id(1, b"a"), "1/a");
        assert_ne!(entry_id(1, b"\xff"), entry_id(1, b"_w"));
    }
}
