//! The one place where failures become errnos.

use crate::store::StoreError;

/// A filesystem-level failure. Each variant is one errno; `Io` carries the
/// cause for the log and becomes EIO.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    /// An inode the kernel still names is gone: another mount, or a rename
    /// over it, deleted it between the kernel's lookup and this call. The
    /// kernel answers ESTALE by looking the path up again (as over NFS).
    #[error("stale file handle")]
    Stale,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name too long")]
    NameTooLong,
    #[error("invalid argument")]
    Invalid,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("permission denied")]
    Access,
    #[error("no such attribute")]
    NoXattr,
    #[error("result too large")]
    Range,
    #[error("file too large")]
    TooBig,
    #[error("too many links")]
    TooManyLinks,
    #[error("bad file handle")]
    BadHandle,
    #[error("resource busy")]
    Busy,
    #[error("try again")]
    Again,
    #[error("operation not supported")]
    NotSupported,
    #[error("no space left")]
    NoSpace,
    /// The metadata store cannot be reached (or stays overloaded) within
    /// its retry budget: ETIMEDOUT, as an NFS `softerr` mount answers, so
    /// a caller can tell "try again later" from a failed disk. The mount
    /// recovers when the store does.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("I/O error: {0}")]
    Io(String),
}

pub(crate) type FsResult<T> = Result<T, FsError>;

impl FsError {
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Stale => libc::ESTALE,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::Invalid => libc::EINVAL,
            FsError::NotPermitted => libc::EPERM,
            FsError::Access => libc::EACCES,
            FsError::NoXattr => libc::ENODATA,
            FsError::Range => libc::ERANGE,
            FsError::TooBig => libc::EFBIG,
            FsError::TooManyLinks => libc::EMLINK,
            FsError::BadHandle => libc::EBADF,
            FsError::Busy => libc::EBUSY,
            FsError::Again => libc::EAGAIN,
            FsError::NotSupported => libc::EOPNOTSUPP,
            FsError::NoSpace => libc::ENOSPC,
            FsError::Unavailable(_) => libc::ETIMEDOUT,
            FsError::Io(_) => libc::EIO,
        }
    }
}

/// Store errors that reach the filesystem unhandled are I/O errors, except
/// an unreachable store: the namespace layer interprets `Conflict`/`NotFound`
/// itself where they mean something (EEXIST, a retry, ...), so anything
/// else left over is unexpected.
impl From<StoreError> for FsError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(m) => FsError::Unavailable(m),
            e => FsError::Io(e.to_string()),
        }
    }
}

/// Object storage of contents: an unreachable store is ETIMEDOUT as for
/// the metadata store; anything else (a missing or short block, refused
/// credentials) is EIO with its message for the log.
impl From<crate::data::blocks::BlockError> for FsError {
    fn from(e: crate::data::blocks::BlockError) -> Self {
        use crate::data::blocks::BlockError;
        match e {
            BlockError::Unavailable(m) => FsError::Unavailable(m),
            e => FsError::Io(e.to_string()),
        }
    }
}

impl From<std::io::Error> for FsError {
    fn from(e: std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => FsError::NoSpace,
            Some(libc::EFBIG) => FsError::TooBig,
            // A store reached through an io::Result that gave up within its
            // retry budget (`BlockError::Unavailable` made into io::Error).
            None if e.kind() == std::io::ErrorKind::TimedOut => FsError::Unavailable(e.to_string()),
            _ => FsError::Io(e.to_string()),
        }
    }
}

impl From<serde_json::Error> for FsError {
    fn from(e: serde_json::Error) -> Self {
        FsError::Io(format!("corrupt document: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_store_failures_have_errnos() {
        use crate::data::blocks::BlockError;
        let errno = |e: BlockError| FsError::from(e).errno();
        assert_eq!(errno(BlockError::Unavailable("x".into())), libc::ETIMEDOUT);
        assert_eq!(errno(BlockError::Missing("x".into())), libc::EIO);
        assert_eq!(errno(BlockError::Corrupt("x".into())), libc::EIO);
        // Through a data store's io::Error, as the filesystem sees them.
        let io: std::io::Error = BlockError::Unavailable("down".into()).into();
        assert_eq!(FsError::from(io).errno(), libc::ETIMEDOUT);
    }
}
