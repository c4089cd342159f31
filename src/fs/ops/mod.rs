//! The filesystem calls, one file per family: each is an `impl Fs` block
//! that does the call with the parts of [`crate::fs`], imported by name.
//! No op file calls into another but through `Fs`'s public calls (create
//! opens what it made, fallocate extends by setattr).

mod attr;
mod create;
mod io;
mod link;
mod plock;
mod readdir;
mod remove;
mod rename;
mod xattr;
