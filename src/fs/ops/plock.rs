//! Advisory file locks (fcntl byte ranges, and flock as whole-file ranges):
//! the calls, answered by the store-wide locks of [`crate::fs::plocks`].

use crate::error::FsResult;
use crate::fs::Fs;
use crate::fs::plocks::Range;

impl Fs {
    /// F_GETLK: the conflicting lock, or None if the range could be locked.
    pub fn getlk(
        &self,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
    ) -> FsResult<Option<Range>> {
        self.plocks.getlk(ino, owner, start, end, typ)
    }

    /// F_SETLK / F_SETLKW (`wait`) and unlock (typ F_UNLCK) of `want`
    /// (its `mount` is ignored: it is always this mount).
    pub fn setlk(&self, ino: u64, want: Range, wait: bool) -> FsResult<()> {
        self.plocks.setlk(ino, want, wait)
    }

    /// close(2) drops the closing owner's locks on the file.
    pub fn unlock_owner(&self, ino: u64, owner: u64) -> FsResult<()> {
        self.plocks.unlock_owner(ino, owner)
    }
}
