//! The `esfs` command line.

use clap::{Parser, Subcommand};
use esfs::mount::{self, MountArgs};
use std::path::PathBuf;
use std::time::Duration;

/// esfs: a FUSE filesystem whose metadata is a search index.
///
/// Every file and directory is a document (path, name, size, times, ...),
/// so a subtree is one query. Metadata lives in an embedded store by
/// default; file contents live in a data directory keyed by file id.
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
    /// Unmount with `fusermount3 -u MOUNTPOINT` (or `umount` as root).
    Mount(MountCmd),
}

#[derive(clap::Args)]
struct MountCmd {
    /// Directory to mount on (must exist).
    mountpoint: PathBuf,
    /// Directory of the embedded metadata store [default: $XDG_DATA_HOME/esfs/store,
    /// else ~/.local/share/esfs/store].
    #[arg(long, value_name = "DIR", env = "ESFS_STORE")]
    store: Option<PathBuf>,
    /// Directory holding file contents [default: $XDG_DATA_HOME/esfs/data,
    /// else ~/.local/share/esfs/data].
    #[arg(long, value_name = "DIR", env = "ESFS_DATA")]
    data: Option<PathBuf>,
    /// Stay in the foreground and serve until unmounted (logs to stderr).
    #[arg(short, long)]
    foreground: bool,
    /// FUSE mount options, comma-separated: allow_other, allow_root, ro, rw,
    /// noatime, nodev, nosuid, noexec, dev, suid, exec, sync, dirsync,
    /// auto_unmount, fsname=NAME. default_permissions is always on.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// How long the kernel may cache names and attributes, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    attr_ttl: f64,
    /// Threads serving FUSE requests.
    #[arg(long, value_name = "N", default_value_t = 4)]
    threads: usize,
    /// Log file of the background server [default: <store>/esfs.log].
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Mount(m) => {
            let home = mount::default_home();
            // Absolute, so messages and the background server agree on them.
            let abs = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
            let store = abs(m.store.unwrap_or_else(|| home.join("store")));
            let log = abs(m.log.unwrap_or_else(|| store.join("esfs.log")));
            if !(m.attr_ttl.is_finite() && m.attr_ttl >= 0.0) {
                eprintln!("esfs: --attr-ttl must be a non-negative number of seconds");
                std::process::exit(2);
            }
            mount::run(MountArgs {
                mountpoint: m.mountpoint,
                data: abs(m.data.unwrap_or_else(|| home.join("data"))),
                store,
                foreground: m.foreground,
                options: m.options,
                attr_ttl: Duration::from_secs_f64(m.attr_ttl),
                threads: m.threads,
                log,
            })
        }
    };
    if let Err(e) = result {
        eprintln!("esfs: {e}");
        std::process::exit(1);
    }
}
