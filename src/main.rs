//! The `esfs` command line.

use clap::{Parser, Subcommand};
use esfs::mount::{self, Backend, MountArgs};
use esfs::store::es::EsConfig;
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
    #[arg(long, value_name = "DIR", env = "ESFS_STORE", conflicts_with = "es")]
    store: Option<PathBuf>,
    /// Directory holding file contents [default with the embedded store:
    /// $XDG_DATA_HOME/esfs/data; with --es: chunk documents in the cluster].
    #[arg(long, value_name = "DIR", env = "ESFS_DATA")]
    data: Option<PathBuf>,
    #[command(flatten)]
    es: EsArgs,
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
    /// Log file of the background server [default: <store>/esfs.log, or
    /// $XDG_DATA_HOME/esfs/esfs.log with --es].
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
}

/// Elasticsearch connection (metadata, and contents unless --data is given).
#[derive(clap::Args)]
struct EsArgs {
    /// Keep metadata in the Elasticsearch cluster at URL instead of the
    /// embedded store (e.g. http://127.0.0.1:9200).
    #[arg(long = "es", value_name = "URL", env = "ESFS_ES_URL")]
    es: Option<String>,
    /// Prefix of the index names (<NAME>-entries, <NAME>-inodes, ...).
    #[arg(
        long,
        value_name = "NAME",
        env = "ESFS_ES_INDEX",
        default_value = "esfs"
    )]
    index: String,
    /// User for basic authentication.
    #[arg(long, value_name = "USER", env = "ESFS_ES_USER")]
    es_user: Option<String>,
    /// Password for basic authentication (prefer the environment variable:
    /// command lines are visible to every user in `ps`).
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "ESFS_ES_PASSWORD",
        hide_env_values = true
    )]
    es_password: Option<String>,
    /// API key (base64 "id:key" as Elasticsearch issues it).
    #[arg(
        long,
        value_name = "KEY",
        env = "ESFS_ES_API_KEY",
        hide_env_values = true
    )]
    es_api_key: Option<String>,
    /// PEM file of a certificate authority to trust for https.
    #[arg(long, value_name = "FILE", env = "ESFS_ES_CA")]
    es_ca: Option<PathBuf>,
}

impl EsArgs {
    fn config(&self) -> Option<EsConfig> {
        let url = self.es.as_ref()?;
        let mut c = EsConfig::new(url, &self.index);
        c.user = self.es_user.clone();
        c.password = self.es_password.clone();
        c.api_key = self.es_api_key.clone();
        c.ca = self.es_ca.clone();
        Some(c)
    }
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
            let (backend, data, log_dir) = match m.es.config() {
                Some(mut es) => {
                    es.ca = es.ca.map(abs);
                    (Backend::Elasticsearch(es), m.data.map(abs), home.clone())
                }
                None => {
                    let store = abs(m.store.unwrap_or_else(|| home.join("store")));
                    let data = abs(m.data.unwrap_or_else(|| home.join("data")));
                    (Backend::Embedded(store.clone()), Some(data), store)
                }
            };
            let log = abs(m.log.unwrap_or_else(|| log_dir.join("esfs.log")));
            if !(m.attr_ttl.is_finite() && m.attr_ttl >= 0.0) {
                eprintln!("esfs: --attr-ttl must be a non-negative number of seconds");
                std::process::exit(2);
            }
            mount::run(MountArgs {
                mountpoint: m.mountpoint,
                backend,
                data,
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
