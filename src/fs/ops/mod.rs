//! The filesystem calls, one file per family: each is an `impl Fs` block
//! that does the call with the parts of [`crate::fs`], imported by name.
//! No op file calls into another.

mod attr;
mod create;
mod io;
mod link;
mod plock;
mod readdir;
mod remove;
mod rename;
mod xattr;
