//! The filesystem's one outward dependency: a hook told about content
//! changes. The search indexer implements it (`crate::search`), so the
//! filesystem never imports the search code and `fs -> search -> fs` is no
//! cycle.

/// The reserved xattr of a mount's root: reading it writes back pending
/// sizes and times and returns the mount's description (JSON, see
/// [`ContentHook::describe`]); it never waits for the indexer. `user.`
/// because the kernel passes only known namespaces to FUSE; setting it is
/// EPERM, and it is never listed.
pub(crate) const DESCRIBE_XATTR: &str = "user.esfs.flush";

/// The reserved xattr `esfs search` sets on a mount's root before grep
/// reads a batch of candidate files through the mount: the value is a JSON
/// array of `[entry id, inode, size]`, and the mount reads their entries,
/// inodes and small files' bytes in one request (see `Fs::read_ahead`).
/// A hint: setting it stores nothing, reading it is ENODATA, and where the
/// caller may not set xattrs on the root (write permission) the search
/// reads without it.
pub(crate) const READ_AHEAD_XATTR: &str = "user.esfs.read-ahead";

/// What the filesystem tells whoever indexes file contents.
pub trait ContentHook: Send + Sync {
    /// The contents of `ino` may have changed (a close that wrote, an fsync,
    /// a truncate).
    fn changed(&self, ino: u64);
    /// The mount is busy (its namespace changed, or a directory was
    /// listed): background work should keep out of its way.
    fn activity(&self);
    /// A subtree's documents are being rewritten (a directory rename, from
    /// its first read to its end) when `on`, and no longer when not: background writes to
    /// those documents would compete with it for the engine and conflict
    /// with its pages, so they hold off until it is done. Calls nest.
    fn rewriting(&self, on: bool);
    /// The answer to a read of [`DESCRIBE_XATTR`]; `open` lists files with
    /// writes not yet persisted (a reader must scan them).
    fn describe(&self, open: Vec<u64>) -> Vec<u8>;
    /// The mount is closing: stop background work.
    fn stop(&self);
}

/// Where a mount's hook goes once indexing starts (after the mount is
/// made); until then, and on a mount that indexes nothing, telling it
/// anything does nothing.
#[derive(Default)]
pub(crate) struct HookSlot(std::sync::OnceLock<Box<dyn ContentHook>>);

impl HookSlot {
    /// Set the hook; a second one is ignored.
    pub(crate) fn set(&self, hook: Box<dyn ContentHook>) {
        let _ = self.0.set(hook);
    }

    pub(crate) fn get(&self) -> Option<&dyn ContentHook> {
        self.0.get().map(|h| &**h)
    }

    /// [`ContentHook::changed`], if a hook is set.
    pub(crate) fn changed(&self, ino: u64) {
        if let Some(h) = self.get() {
            h.changed(ino);
        }
    }

    /// [`ContentHook::activity`], if a hook is set.
    pub(crate) fn activity(&self) {
        if let Some(h) = self.get() {
            h.activity();
        }
    }

    /// [`ContentHook::rewriting`] for as long as the guard lives; its end
    /// counts as activity (background work waits for quiet after it).
    pub(crate) fn rewriting(&self) -> Rewriting<'_> {
        if let Some(h) = self.get() {
            h.rewriting(true);
        }
        Rewriting(self)
    }
}

/// See [`HookSlot::rewriting`].
pub(crate) struct Rewriting<'a>(&'a HookSlot);

impl Drop for Rewriting<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.0.get() {
            h.rewriting(false);
            h.activity();
        }
    }
}
