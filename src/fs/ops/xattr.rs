//! Extended attributes, stored in the inode document (name encoded like file
//! names, value base64). `system.*` (POSIX ACLs) is refused with EOPNOTSUPP:
//! storing ACLs the kernel would not enforce would pretend a protection that
//! does not exist. So is `security.selinux`: SELinux labels a FUSE mount
//! from its policy (genfscon), not from stored labels, and an unsupported
//! answer lets `ls -l` stop asking for every file (it remembers EOPNOTSUPP
//! per device; ENODATA costs a round trip per name).

use crate::error::{FsError, FsResult};
use crate::fs::Fs;
use crate::model::{ROOT_INO, decode_bytes, encode_bytes, now_ns};
use crate::store::{Idx, MetaStore};
use base64::Engine;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
/// Linux's XATTR_NAME_MAX and XATTR_SIZE_MAX.
const NAME_MAX_X: usize = 255;
const VALUE_MAX: usize = 65536;

fn xattr_key(name: &[u8]) -> FsResult<String> {
    if name.is_empty() || name.len() > NAME_MAX_X {
        return Err(FsError::Range);
    }
    if name == crate::hook::DESCRIBE_XATTR.as_bytes()
        || name == crate::hook::READ_AHEAD_XATTR.as_bytes()
    {
        return Err(FsError::NotPermitted); // reserved: see getxattr, setxattr
    }
    if name.starts_with(b"system.") || name == b"security.selinux" {
        return Err(FsError::NotSupported);
    }
    Ok(encode_bytes(name))
}

impl Fs {
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> FsResult<()> {
        if ino == ROOT_INO && name == crate::hook::READ_AHEAD_XATTR.as_bytes() {
            return self.read_ahead(value);
        }
        let key = xattr_key(name)?;
        if value.len() > VALUE_MAX {
            return Err(FsError::TooBig);
        }
        let now = now_ns();
        let encoded = B64.encode(value);
        let inode = self.docs.update(ino, |i| {
            let exists = i.xattrs.contains_key(&key);
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(FsError::Exists);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(FsError::NoXattr);
            }
            i.xattrs.insert(key.clone(), encoded.clone());
            i.ctime_ns = now;
            Ok(())
        })?;
        // Entries carry the xattrs as search keywords.
        self.docs.sync_entries(&inode)
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        // `esfs search` asks the mount's root where its store is and which
        // files it must scan (see crate::hook); nothing waits for indexing.
        if ino == ROOT_INO
            && name == crate::hook::DESCRIBE_XATTR.as_bytes()
            && let Some(h) = self.hook.get()
        {
            // Sizes and times of closed files first, so the index agrees
            // with stat (lazy close leaves them in memory for a moment).
            if self.pending.lazy() {
                self.write_back.write_back(self)?;
            }
            let reply = h.describe(self.files.dirty());
            // The search reads the store from its own process, which sees
            // only committed state (the embedded store defers commits).
            // A mount holding the delegation sends what it acknowledged
            // from memory (the store's sync; a no-op otherwise).
            if self.caps.single_writer {
                self.store.refresh(Idx::Inodes)?;
            } else {
                self.store.sync()?;
            }
            return Ok(reply);
        }
        if name == crate::hook::DESCRIBE_XATTR.as_bytes()
            || name == crate::hook::READ_AHEAD_XATTR.as_bytes()
        {
            return Err(FsError::NoXattr);
        }
        let key = xattr_key(name)?;
        let (inode, _) = self.docs.inode(ino)?;
        let v = inode.xattrs.get(&key).ok_or(FsError::NoXattr)?;
        B64.decode(v)
            .map_err(|e| FsError::Io(format!("corrupt xattr {key:?} on inode {ino}: {e}")))
    }

    /// NUL-terminated names, as listxattr(2) returns them.
    pub fn listxattr(&self, ino: u64) -> FsResult<Vec<u8>> {
        let (inode, _) = self.docs.inode(ino)?;
        let mut out = Vec::new();
        for k in inode.xattrs.keys() {
            out.extend_from_slice(&decode_bytes(k));
            out.push(0);
        }
        Ok(out)
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        let key = xattr_key(name)?;
        let now = now_ns();
        let inode = self.docs.update(ino, |i| {
            i.xattrs.remove(&key).ok_or(FsError::NoXattr)?;
            i.ctime_ns = now;
            Ok(())
        })?;
        self.docs.sync_entries(&inode)
    }
}
