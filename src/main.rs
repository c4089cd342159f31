//! The `esfs` command line.

use clap::{Parser, Subcommand};
use esfs::cli::StoreArgs;
use esfs::fs::{Fs, FsConfig};
use esfs::locks::LockManager;
use esfs::mount::{self, MountArgs};
use std::path::PathBuf;
use std::time::Duration;

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
    Mount(MountCmd),
    /// Unmount an esfs mount and wait for its server's final sync.
    ///
    /// Also clears the dead mount of a killed server (lazily, if something
    /// still uses it). A live mount that is busy is refused.
    Umount(UmountCmd),
    /// Check the filesystem's documents and, with --repair, restore them.
    ///
    /// Safe while mounts are live. Exit status: 0 clean, 1 problems found
    /// and repaired, 4 problems left (run again with --repair), 8 error.
    Fsck(FsckCmd),
    /// List the lock, intent and session documents, or break one.
    Locks(LocksCmd),
    /// grep -r through the index: `esfs search [OPTIONS] PATTERN [PATH...]`.
    ///
    /// Same output and exit status as `grep -r` (0 found, 1 none, 2 error);
    /// the index picks the files to read. See esfs::search.
    #[command(disable_help_flag = true)]
    Search(esfs::search::cli::SearchArgs),
}

#[derive(clap::Args)]
struct MountCmd {
    /// Directory to mount on (must exist).
    mountpoint: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
    /// Stay in the foreground and serve until unmounted (logs to stderr).
    #[arg(short, long)]
    foreground: bool,
    /// FUSE mount options, comma-separated: allow_other, allow_root, ro, rw,
    /// noatime, nodev, nosuid, noexec, dev, suid, exec, sync, dirsync,
    /// auto_unmount, fsname=NAME, nonempty (mount over a non-empty
    /// directory), writeback_cache (embedded store only; see the README).
    /// default_permissions is always on.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// How long the kernel may cache names and attributes, in seconds
    /// [default: 60 on the embedded store, whose only writer is this mount,
    /// so the kernel sees every change; 1 with --es, where other mounts
    /// change things behind it].
    #[arg(long, value_name = "SECS")]
    attr_ttl: Option<f64>,
    /// Threads serving FUSE requests.
    #[arg(long, value_name = "N", default_value_t = 4)]
    threads: usize,
    /// Log file of the background server [default: <store>/esfs.log, or
    /// $XDG_DATA_HOME/esfs/esfs.log with --es].
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
}

#[derive(clap::Args)]
struct UmountCmd {
    /// The mountpoint.
    mountpoint: PathBuf,
}

#[derive(clap::Args)]
struct FsckCmd {
    #[command(flatten)]
    store: StoreArgs,
    /// Repair what is wrong: roll forward unfinished renames of dead mounts,
    /// break their locks, fix paths, link counts, unreferenced inodes and
    /// contents.
    #[arg(long)]
    repair: bool,
}

#[derive(clap::Args)]
struct LocksCmd {
    #[command(flatten)]
    store: StoreArgs,
    /// Delete the lock document with this id (as listed), whoever holds it.
    #[arg(long = "break", value_name = "ID")]
    break_id: Option<String>,
}

fn main() {
    // Whatever esfs creates outside the mount (stores, data, logs, SQLite's
    // own files) is its owner's alone; see esfs::private.
    // SAFETY: umask only sets the process's file mode mask.
    unsafe { libc::umask(0o077) };
    // fuser's one session warning is its unmount at the session's end
    // failing after the user unmounted (mount.rs reports a real failure).
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("info,fuser::session=error"),
    )
    .format_timestamp_millis()
    .init();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Mount(m) => run_mount(m),
        Cmd::Umount(u) => mount::umount(&u.mountpoint)
            .map(|()| {
                println!("esfs: unmounted {}", u.mountpoint.display());
                0
            })
            .map_err(|e| {
                eprintln!("esfs: {e}");
                std::process::exit(1)
            }),
        Cmd::Fsck(f) => run_fsck(f),
        Cmd::Locks(l) => run_locks(l),
        Cmd::Search(s) => Ok(esfs::search::cli::run(s)),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("esfs: {e}");
            std::process::exit(8);
        }
    }
}

fn run_mount(m: MountCmd) -> Result<i32, String> {
    let (backend, data, log_dir) = m.store.resolve();
    let ttl = m.attr_ttl.unwrap_or(match backend {
        mount::Backend::Embedded(_) => 60.0,
        mount::Backend::Elasticsearch(_) => 1.0,
    });
    if !(ttl.is_finite() && (0.0..=1e9).contains(&ttl)) {
        return Err("--attr-ttl must be a non-negative number of seconds".into());
    }
    let abs = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    mount::run(MountArgs {
        mountpoint: m.mountpoint,
        backend,
        data,
        foreground: m.foreground,
        options: m.options,
        attr_ttl: Duration::from_secs_f64(ttl),
        threads: m.threads,
        log: abs(m.log.unwrap_or_else(|| log_dir.join("esfs.log"))),
    })
    .map(|()| 0)
    .map_err(|e| {
        // Mount failures exit 1, as mount(8) helpers do.
        eprintln!("esfs: {e}");
        std::process::exit(1)
    })
}

/// An Fs for a maintenance command: no formatting or recovery on open.
/// Without `contents` the data directory is not opened (nor checked).
fn open_fs(store: &StoreArgs, contents: bool) -> Result<(Fs, mount::Stores), String> {
    let (backend, data, _) = store.resolve();
    let data = data.filter(|_| contents);
    let stores = mount::open_stores(&backend, data.as_deref(), false)?;
    let fs = Fs::new(
        stores.meta.clone(),
        stores.data.clone(),
        FsConfig {
            label: "esfs maintenance".into(),
            maintenance: true,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    Ok((fs, stores))
}

fn run_fsck(f: FsckCmd) -> Result<i32, String> {
    let (fs, stores) = open_fs(&f.store, true)?;
    // A dead mount's unflushed journal is checked (and, with --repair,
    // applied); a live mount's is its own business. Holding the mount lock
    // also keeps a mount from starting halfway through.
    let sole = match f.store.resolve().0 {
        mount::Backend::Embedded(dir) => match mount::lock_store(&dir) {
            Ok(lock) => Some((lock, mount::unflushed_journal(&dir))),
            Err(e) => {
                eprintln!("esfs fsck: {e}: its pending file sizes are not checked");
                None
            }
        },
        mount::Backend::Elasticsearch(_) => None,
    };
    let report = esfs::fsck::fsck(
        &fs,
        &stores.meta,
        &stores.data,
        f.repair,
        sole.as_ref().map(|(_, journal)| journal.as_path()),
    )
    .map_err(|e| e.to_string())?;
    for p in &report.problems {
        println!("{p}");
    }
    println!(
        "esfs fsck: {} entries, {} inodes, {} problem(s){}",
        report.entries,
        report.inodes,
        report.problems.len(),
        if f.repair {
            format!(", {} repair(s)", report.repaired)
        } else {
            String::new()
        }
    );
    Ok(report.exit_code(f.repair))
}

fn run_locks(l: LocksCmd) -> Result<i32, String> {
    let (fs, stores) = open_fs(&l.store, false)?;
    let lm = fs.lock_manager();
    if let Some(id) = l.break_id {
        let gone = stores
            .meta
            .delete(esfs::store::Idx::Locks, &id, None)
            .map_err(|e| e.to_string())?;
        println!(
            "{}",
            if gone {
                format!("broke {id}")
            } else {
                format!("no lock {id}")
            }
        );
        return Ok(if gone { 0 } else { 1 });
    }
    let now = esfs::locks::manager::now_ms();
    println!(
        "{:<48} {:<10} {:>8} {:<6} OWNER",
        "ID", "TYPE", "AGE", "ALIVE"
    );
    for (id, _, doc) in LockManager::list(&*stores.meta).map_err(|e| e.to_string())? {
        let ty = doc["type"].as_str().unwrap_or("?");
        let owners: Vec<(String, String)> = match doc["holders"].as_object() {
            Some(h) => h
                .iter()
                .map(|(o, n)| (o.clone(), format!("{o} ({n})")))
                .collect(),
            None => {
                let o = doc["owner"].as_str().unwrap_or("").to_string();
                vec![(o.clone(), o)]
            }
        };
        // Our own maintenance session is not worth listing.
        if ty == "session" && doc["owner"] == lm.owner() {
            continue;
        }
        let alive = owners.iter().all(|(o, _)| lm.alive(o).unwrap_or(false));
        let shown: Vec<&str> = owners.iter().map(|(_, s)| s.as_str()).collect();
        let age = (now - doc["since"].as_i64().unwrap_or(now)) as f64 / 1000.0;
        let extra = match ty {
            "session" => format!(
                " {} pid {} {}",
                doc["host"].as_str().unwrap_or(""),
                doc["pid"],
                doc["mount"].as_str().unwrap_or("")
            ),
            "intent" => format!(" {}", doc["op"]["kind"].as_str().unwrap_or("")),
            _ => doc["pending"]
                .as_str()
                .map(|p| format!(" (pending exclusive: {p})"))
                .unwrap_or_default(),
        };
        println!(
            "{id:<48} {ty:<10} {age:>7.1}s {:<6} {}{extra}",
            if alive { "yes" } else { "NO" },
            shown.join(", ")
        );
    }
    Ok(0)
}
