//! Command-line options shared by the commands that open a store
//! (`mount`, `fsck`, `locks`, `search`).

use crate::open::{Backend, default_data, default_home};
use crate::store::es::EsConfig;
use std::path::PathBuf;
use std::time::Duration;

/// Where the filesystem's metadata and contents live.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct StoreArgs {
    /// Directory of the embedded metadata store [default: $XDG_DATA_HOME/esfs/store,
    /// else ~/.local/share/esfs/store].
    #[arg(long, value_name = "DIR", env = "ESFS_STORE", conflicts_with = "es")]
    pub store: Option<PathBuf>,
    /// Directory holding file contents [default with the embedded store:
    /// STORE/data; with --es: chunk documents in the cluster]. It is bound
    /// to its filesystem: another store's is refused.
    #[arg(long, value_name = "DIR", env = "ESFS_DATA")]
    pub data: Option<PathBuf>,
    #[command(flatten)]
    pub es: EsArgs,
}

/// Elasticsearch connection (metadata, and contents unless --data is given).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct EsArgs {
    /// Keep metadata in the Elasticsearch cluster at URL instead of the
    /// embedded store (e.g. http://127.0.0.1:9200).
    #[arg(long = "es", value_name = "URL", env = "ESFS_ES_URL")]
    pub es: Option<String>,
    /// Prefix of the index names (<NAME>-entries, <NAME>-inodes, ...).
    #[arg(
        long,
        value_name = "NAME",
        env = "ESFS_ES_INDEX",
        default_value = "esfs"
    )]
    pub index: String,
    #[command(flatten)]
    pub auth: EsAuth,
    /// How long one filesystem operation keeps retrying an unreachable or
    /// overloaded cluster before failing with ETIMEDOUT, in seconds.
    #[arg(
        long,
        value_name = "SECS",
        env = "ESFS_ES_TIMEOUT",
        default_value_t = 15.0
    )]
    pub es_timeout: f64,
    /// Replicas of each index esfs creates [default: 1 when the cluster has
    /// two or more data nodes, else 0]. Read only when the indices are
    /// created; change it later with the index settings API.
    #[arg(long, value_name = "N", env = "ESFS_ES_REPLICAS")]
    pub es_replicas: Option<u32>,
}

/// Credentials and trust for an Elasticsearch cluster (shared with
/// `esfs search`, whose `--es`/`--index` differ: no environment default, so
/// that searching through a mount stays the default).
#[derive(clap::Args, Clone, Debug)]
pub struct EsAuth {
    /// User for basic authentication.
    #[arg(long, value_name = "USER", env = "ESFS_ES_USER")]
    pub es_user: Option<String>,
    /// Password for basic authentication (prefer the environment variable:
    /// command lines are visible to every user in `ps`).
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "ESFS_ES_PASSWORD",
        hide_env_values = true
    )]
    pub es_password: Option<String>,
    /// API key (base64 "id:key" as Elasticsearch issues it).
    #[arg(
        long,
        value_name = "KEY",
        env = "ESFS_ES_API_KEY",
        hide_env_values = true
    )]
    pub es_api_key: Option<String>,
    /// PEM file of a certificate authority to trust for https.
    #[arg(long, value_name = "FILE", env = "ESFS_ES_CA")]
    pub es_ca: Option<PathBuf>,
}

impl EsAuth {
    pub fn apply(&self, c: &mut EsConfig) {
        c.user = self.es_user.clone();
        c.password = self.es_password.clone();
        c.api_key = self.es_api_key.clone();
        c.ca = self.es_ca.clone();
    }
}

impl EsArgs {
    pub(crate) fn config(&self) -> Option<EsConfig> {
        let url = self.es.as_ref()?;
        let mut c = EsConfig::new(url, &self.index);
        self.auth.apply(&mut c);
        c.replicas = self.es_replicas;
        let budget = Duration::from_secs_f64(self.es_timeout.clamp(0.1, 3600.0));
        c.retry_budget = budget;
        // One request never waits longer than the whole budget.
        c.timeout = c.timeout.min(budget);
        Some(c)
    }
}

impl StoreArgs {
    /// The backend, the contents directory (None: chunks in the cluster),
    /// and the directory for logs. Paths are made absolute.
    pub(crate) fn resolve(&self) -> (Backend, Option<PathBuf>, PathBuf) {
        let home = default_home();
        let abs = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
        match self.es.config() {
            Some(mut es) => {
                es.ca = es.ca.map(abs);
                (Backend::Elasticsearch(es), self.data.clone().map(abs), home)
            }
            None => {
                let store = abs(self.store.clone().unwrap_or_else(|| home.join("store")));
                let data = match self.data.clone() {
                    Some(d) => abs(d),
                    None => default_data(&store),
                };
                (Backend::Embedded(store.clone()), Some(data), store)
            }
        }
    }
}
