//! The `esfs` command line: parse, dispatch to `esfs::cmd`, exit.
// No function over 120 lines (clippy.toml) outside the integration tests.
#![warn(clippy::too_many_lines)]

use clap::{Parser, Subcommand};
use esfs::cmd;

/// esfs: a FUSE filesystem whose metadata is a search index.
///
/// Every file and directory is a document (path, name, size, times, ...),
/// so a subtree is one query. Metadata lives in an embedded store by
/// default, or in an Elasticsearch cluster (--es); file contents live in a
/// data directory keyed by file id, or in the cluster.
#[derive(Parser)]
#[command(name = "esfs", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount an esfs filesystem at MOUNTPOINT.
    ///
    /// Returns once the mount is live (the server keeps running in the
    /// background and logs to --log), unless --foreground is given.
    /// Unmount with `esfs umount MOUNTPOINT`. A non-empty MOUNTPOINT is
    /// refused unless `-o nonempty` is given (its files would be hidden).
    Mount(cmd::mount::MountCmd),
    /// Unmount an esfs mount and wait for its server's final sync.
    ///
    /// Also clears the dead mount of a killed server (lazily, if something
    /// still uses it). A live mount that is busy is refused.
    Umount(cmd::mount::UmountCmd),
    /// Check the filesystem's documents and, with --repair, restore them.
    ///
    /// Safe while mounts are live. Exit status: 0 clean, 1 problems found
    /// and repaired, 4 problems left (run again with --repair), 8 error.
    Fsck(cmd::fsck::FsckCmd),
    /// List the lock, intent and session documents, or break one.
    Locks(cmd::locks::LocksCmd),
    /// grep -r through the index: `esfs search [OPTIONS] PATTERN [PATH...]`.
    ///
    /// Same output and exit status as `grep -r` (0 found, 1 none, 2 error);
    /// the index picks the files to read. See esfs::search.
    #[command(disable_help_flag = true)]
    Search(cmd::search::SearchArgs),
}

/// The allocator: mimalloc rather than glibc's malloc. A mount allocates
/// and frees documents on every thread (FUSE, flusher, indexer, the HTTP
/// runtime) and frees on one what another allocated; walking a million
/// files, glibc's malloc and free were half the mount's CPU (`_int_malloc`,
/// `unlink_chunk`, `malloc_consolidate` in a perf profile of `find`). At
/// 100 000 files on three nodes every step of `bench/scale` was 1.2-2.5x
/// faster with mimalloc, the RSS peak 878 MiB against 696 (docs/cluster.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Whatever esfs creates outside the mount (stores, data, logs, SQLite's
    // own files) is its owner's alone; see esfs::private.
    // SAFETY: umask only sets the process's file mode mask.
    unsafe { libc::umask(0o077) };
    let cli = Cli::parse();
    // fuser's one session warning is its unmount at the session's end
    // failing after the user unmounted (mount.rs reports a real failure).
    // Search answers as grep does: its stderr is for errors and warnings,
    // not for which cluster it reached.
    let default = match cli.cmd {
        Cmd::Search(_) => "warn",
        _ => "info,fuser::session=error",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format_timestamp_millis()
        .init();
    // Mount failures exit 1, as mount(8) helpers do; fsck and locks 8;
    // search answers like grep (2 on errors) and prints its own.
    let (result, failed) = match cli.cmd {
        Cmd::Mount(m) => (cmd::mount::run(m), 1),
        Cmd::Umount(u) => (cmd::mount::run_umount(u), 1),
        Cmd::Fsck(f) => (cmd::fsck::run(f), 8),
        Cmd::Locks(l) => (cmd::locks::run(l), 8),
        Cmd::Search(s) => (Ok(cmd::search::run(s)), 2),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("esfs: {e}");
            std::process::exit(failed);
        }
    }
}
