//! The filesystem calls, one file per family; each is an `impl Fs` block
//! over the shared helpers of [`crate::fs`].

pub(in crate::fs) mod attr;
pub(in crate::fs) mod create;
pub(in crate::fs) mod io;
pub(in crate::fs) mod link;
pub mod plock;
pub(in crate::fs) mod readdir;
pub(in crate::fs) mod remove;
pub(in crate::fs) mod rename;
pub(in crate::fs) mod xattr;
