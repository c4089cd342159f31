//! Where each PATH operand of a search is searched, and the output path of
//! what is found under it.
//!
//! A PATH on an esfs mount is searched through the mount's store: the mount
//! is found in /proc/self/mountinfo, its root's reserved xattr
//! [`DESCRIBE_XATTR`](crate::hook::DESCRIBE_XATTR) writes back pending sizes
//! and times (without waiting for the indexer) and says where the store is,
//! and that store is opened read-only beside the mount; grep then reads the
//! files through the mount. A PATH elsewhere is handed to `grep -r` as it
//! is. A store named directly (`--store`, `--es`) holds PATHs that are paths
//! inside the filesystem, and its contents come from its data store.

use super::SearchError;
use crate::data::DataStore;
use crate::model::{Entry, decode_bytes, encode_bytes};
use crate::open::{Backend, open_meta, open_stores};
use crate::store::es::EsConfig;
use crate::store::{Idx, MetaStore, Query, SearchRequest, Sort};
use serde_json::Value;
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where one PATH operand is searched.
pub(crate) struct Root {
    /// The operand as given (output paths start with it); empty for "no
    /// operand" (grep then prints paths relative to the current directory).
    pub display: Vec<u8>,
    /// Encoded in-filesystem path of the operand.
    pub tree: String,
}

/// A store searched for one or more operands.
pub(crate) struct Target {
    pub store: Arc<dyn MetaStore>,
    /// Direct mode: contents come from here (no mount holds the files).
    pub data: Option<Arc<dyn DataStore>>,
    /// Files open with unpersisted writes (from the mount).
    pub open: Vec<u64>,
    /// The mount's root, where grep's batches are announced (see
    /// [`crate::hook::READ_AHEAD_XATTR`]): an Elasticsearch mount, whose
    /// cold reads cost requests; None elsewhere.
    pub read_ahead: Option<PathBuf>,
}

/// An Elasticsearch cluster's configuration from its URL and index name.
pub(crate) type EsConfigOf = dyn Fn(&str, &str) -> EsConfig;

/// One operand: handed to grep -r as it is, or searched in a store (the
/// index of its [`Target`]).
pub(crate) enum Operand {
    Plain(OsString),
    Indexed(usize, Root),
    /// Not searchable: grep's own message, without the `grep: `.
    Failed(String),
}

/// The targets and operands of a search through mounts. `es` gives the
/// configuration of an Elasticsearch mount's cluster from its URL and index.
pub(crate) fn on_mounts(
    operands: &[OsString],
    es: &EsConfigOf,
) -> Result<(Vec<Target>, Vec<Operand>), SearchError> {
    let implicit = operands.is_empty();
    let operands: Vec<OsString> = if implicit {
        vec![".".into()]
    } else {
        operands.to_vec()
    };
    let mounts = esfs_mounts();
    let mut targets: Vec<Target> = Vec::new();
    let mut by_mount: HashMap<PathBuf, usize> = HashMap::new();
    let mut ops = Vec::new();
    for op in operands {
        let canon = match std::fs::canonicalize(&op) {
            Ok(c) => c,
            Err(e) => {
                ops.push(Operand::Failed(format!(
                    "{}: {}",
                    Path::new(&op).display(),
                    io_msg(&e)
                )));
                continue;
            }
        };
        let Some(mnt) = mounts
            .iter()
            .filter(|m| canon.starts_with(m))
            .max_by_key(|m| m.as_os_str().len())
        else {
            ops.push(Operand::Plain(op));
            continue;
        };
        let i = match by_mount.get(mnt) {
            Some(&i) => i,
            None => {
                targets.push(open_mount(mnt, es)?);
                by_mount.insert(mnt.clone(), targets.len() - 1);
                targets.len() - 1
            }
        };
        let rel = canon.strip_prefix(mnt).expect("under the mount");
        let mut tree = String::from("/");
        tree.push_str(&encode_bytes(rel.as_os_str().as_bytes()));
        let display = if implicit { Vec::new() } else { op.into_vec() };
        ops.push(Operand::Indexed(i, Root { display, tree }));
    }
    Ok((targets, ops))
}

/// Ask the mount to flush its indexing and say where its store is, then open it.
fn open_mount(mnt: &Path, es: &EsConfigOf) -> Result<Target, SearchError> {
    let raw = get_xattr(mnt, crate::hook::DESCRIBE_XATTR).map_err(|e| {
        format!(
            "{}: the mount does not answer {} ({e}); is it an older esfs?",
            mnt.display(),
            crate::hook::DESCRIBE_XATTR
        )
    })?;
    let v: Value = serde_json::from_slice(&raw)
        .map_err(|e| format!("{}: bad mount description: {e}", mnt.display()))?;
    let pending = v["pending"].as_u64().unwrap_or(0);
    if pending > 0 {
        log::debug!("{pending} changes still being indexed: those files are read");
    }
    let open: Vec<u64> = v["open"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let backend = Backend::from_description(&v["mount"], es)?;
    let read_ahead = matches!(backend, Backend::Elasticsearch(_)).then(|| mnt.to_path_buf());
    let (store, _) = open_meta(&backend, false)?;
    // The mount's writes become searchable at its next refresh: make
    // them visible now.
    store.refresh(Idx::Entries)?;
    Ok(Target {
        store,
        data: None,
        open,
        read_ahead,
    })
}

/// The target and operands of a search in a store named directly, with
/// its contents in `data`.
pub(crate) fn in_store(
    backend: &Backend,
    data: Option<&Path>,
    operands: &[OsString],
) -> Result<(Vec<Target>, Vec<Operand>), SearchError> {
    let stores = open_stores(backend, data, None, false, None)?;
    let target = Target {
        store: stores.meta,
        data: Some(stores.data),
        open: vec![],
        read_ahead: None,
    };
    let operands: Vec<OsString> = if operands.is_empty() {
        vec!["/".into()]
    } else {
        operands.to_vec()
    };
    let ops = operands
        .into_iter()
        .map(|op| {
            let b = op.as_bytes();
            if !b.starts_with(b"/") {
                return Operand::Failed(format!(
                    "{}: paths inside a store are absolute (/dir/...)",
                    op.to_string_lossy()
                ));
            }
            let trimmed = match b.len() {
                1 => b,
                _ => b.strip_suffix(b"/").unwrap_or(b),
            };
            Operand::Indexed(
                0,
                Root {
                    display: b.to_vec(),
                    tree: encode_bytes(trimmed),
                },
            )
        })
        .collect();
    Ok((vec![target], ops))
}

impl Target {
    /// Every entry matching `q`, in path order (sources without text).
    pub(crate) fn list(&self, q: &Query) -> Result<Vec<Entry>, SearchError> {
        const PAGE: usize = 2000;
        let mut out = Vec::new();
        let mut after: Option<Vec<Value>> = None;
        loop {
            let hits = self.store.search_brief(&SearchRequest {
                past_own_writes: false,
                index: Idx::Entries,
                query: q.clone(),
                sort: vec![Sort::asc("path"), Sort::asc("cookie")],
                search_after: after.clone(),
                size: PAGE,
            })?;
            let n = hits.len();
            if let Some(last) = hits.last() {
                after = Some(last.sort.clone());
            }
            for h in hits {
                out.push(h.doc.parse()?);
            }
            if n < PAGE {
                return Ok(out);
            }
        }
    }

    /// The exact mtime of an entry: from the file (mount) or its inode (store).
    pub(crate) fn mtime_ns(&self, entry: &Entry, display: &[u8]) -> i64 {
        if self.data.is_none() {
            use std::os::unix::fs::MetadataExt;
            if let Ok(m) = std::fs::symlink_metadata(std::ffi::OsStr::from_bytes(display)) {
                return m.mtime() * 1_000_000_000 + m.mtime_nsec();
            }
        } else if let Ok(Some(doc)) = self
            .store
            .get(Idx::Inodes, &crate::model::inode_id(entry.ino))
            && let Some(ns) = doc.source["mtime_ns"].as_i64()
        {
            return ns;
        }
        entry.mtime * 1_000_000
    }
}

/// A file's contents from the data store (direct mode).
pub(crate) fn read_contents(
    store: &dyn MetaStore,
    data: &dyn DataStore,
    ino: u64,
) -> Result<Vec<u8>, SearchError> {
    let doc = store
        .get(Idx::Inodes, &crate::model::inode_id(ino))?
        .ok_or("inode gone")?;
    let inode: crate::model::Inode = doc.parse()?;
    let mut buf = vec![0u8; inode.size as usize];
    if let Some(key) = &inode.content {
        data.read(key, 0, &mut buf)?;
    }
    Ok(buf)
}

/// The output path of the entry at (encoded) `path` under `root`.
pub(crate) fn display_path(root: &Root, path: &str) -> Vec<u8> {
    let f = decode_bytes(path);
    let r = decode_bytes(&root.tree);
    let rel: &[u8] = if f == r {
        return if root.display.is_empty() {
            b".".to_vec()
        } else {
            root.display.clone()
        };
    } else if r == b"/" {
        &f[1..]
    } else {
        f.get(r.len() + 1..).unwrap_or_default()
    };
    join(&root.display, rel)
}

fn join(prefix: &[u8], rel: &[u8]) -> Vec<u8> {
    let mut out = prefix.to_vec();
    if !out.is_empty() && !out.ends_with(b"/") {
        out.push(b'/');
    }
    out.extend_from_slice(rel);
    out
}

/// The output form of a directory (a group key) under `root`.
pub(crate) fn display_dir(root: &Root, dir: &str) -> Vec<u8> {
    let d = decode_bytes(dir);
    let r = decode_bytes(&root.tree);
    let under = d == r || r == b"/" || (d.starts_with(&r) && d.get(r.len()) == Some(&b'/'));
    if under {
        let p = display_path(root, dir);
        if p.is_empty() { b".".to_vec() } else { p }
    } else {
        // The operand is a file: its directory.
        let p = Path::new(std::ffi::OsStr::from_bytes(&root.display));
        let parent = p.parent().map(|p| p.as_os_str().as_bytes().to_vec());
        match parent {
            Some(p) if !p.is_empty() => p,
            _ => b".".to_vec(),
        }
    }
}

/// An I/O error in grep's words.
fn io_msg(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "No such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "Permission denied".into(),
        _ => e.to_string(),
    }
}

/// Mountpoints of esfs mounts (from /proc/self/mountinfo).
fn esfs_mounts() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else {
        return vec![];
    };
    let mut out = Vec::new();
    for line in info.split(|&b| b == b'\n') {
        let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == b"-") else {
            continue;
        };
        if fields.get(sep + 1) == Some(&crate::daemon::FSTYPE.as_bytes())
            && let Some(p) = fields.get(4)
        {
            out.push(PathBuf::from(std::ffi::OsString::from_vec(unescape(p))));
        }
    }
    out
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') << 6 | (b[i + 2] - b'0') << 3 | (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Set xattr `name` of `path` to `value`.
pub(crate) fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let p = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let n = std::ffi::CString::new(name)?;
    // SAFETY: valid C strings; the value is readable for its length.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn get_xattr(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let p = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let n = std::ffi::CString::new(name)?;
    loop {
        // SAFETY: valid C strings; a null buffer asks for the size.
        let size = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut buf = vec![0u8; size as usize + 1024];
        // SAFETY: the buffer is writable for its length.
        let got =
            unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
}
