//! Command-line options shared by the commands that open a store
//! (`mount`, `fsck`, `locks`, `search`).

use crate::data::blocks::{BlockConfig, S3Location, is_object_url};
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
    /// Where file contents go: a directory, or s3://BUCKET/PREFIX for an
    /// S3-compatible object store (credentials from the AWS environment and
    /// files) [default with the embedded store: STORE/data; with --es: chunk
    /// documents in the cluster]. Bound to its filesystem: another
    /// filesystem's is refused.
    #[arg(long, value_name = "DIR", env = "ESFS_DATA")]
    pub data: Option<PathBuf>,
    #[command(flatten)]
    pub es: EsArgs,
    #[command(flatten)]
    pub s3: S3Args,
}

/// Contents in S3-compatible object storage (`--data s3://BUCKET/PREFIX`);
/// credentials and region come from the AWS environment variables and
/// shared files.
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct S3Args {
    /// Endpoint URL of an S3-compatible server (e.g. http://127.0.0.1:8333)
    /// [default: AWS_ENDPOINT_URL, the AWS profile's endpoint_url, or AWS].
    #[arg(long, value_name = "URL", env = "ESFS_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// Directory of the local block cache [default:
    /// $XDG_CACHE_HOME/esfs, else ~/.cache/esfs].
    #[arg(long, value_name = "DIR", env = "ESFS_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Bytes the block cache may hold, with a K/M/G/T suffix (binary); 0
    /// turns it off [default: 1G].
    #[arg(long, value_name = "SIZE", env = "ESFS_CACHE_SIZE")]
    pub cache_size: Option<String>,
}

impl S3Args {
    fn given(&self) -> bool {
        self.s3_endpoint.is_some() || self.cache_dir.is_some() || self.cache_size.is_some()
    }
}

/// "1G", "512M", "4096": bytes (binary multiples).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("bad size {s:?} (a number with K, M, G or T)")),
            };
            (&t[..i], 1u64 << shift)
        }
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("bad size {s:?} (a number with K, M, G or T)"))
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
    /// The object-storage configuration `--data s3://BUCKET/PREFIX` and
    /// the S3 options describe; None for contents elsewhere (where the S3
    /// options are refused: they would do nothing).
    pub(crate) fn block_config(&self) -> Result<Option<BlockConfig>, String> {
        let url = self.data.as_deref().and_then(|d| d.to_str());
        let Some(url) = url.filter(|u| is_object_url(u)) else {
            if self.s3.given() {
                return Err(
                    "--s3-endpoint, --cache-dir and --cache-size apply to --data s3://BUCKET/PREFIX only"
                        .into(),
                );
            }
            return Ok(None);
        };
        let mut c = BlockConfig::new(S3Location::parse(url)?);
        c.endpoint = self.s3.s3_endpoint.clone();
        c.cache_size = match &self.s3.cache_size {
            Some(s) => parse_size(s).map_err(|e| format!("--cache-size: {e}"))?,
            None => 1 << 30,
        };
        let abs = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
        c.cache_dir = Some(abs(self.s3.cache_dir.clone().unwrap_or_else(default_cache)));
        Ok(Some(c))
    }

    /// The backend, the contents directory (None: chunks in the cluster;
    /// an `s3://` URL as given: object storage, see `block_config`), and
    /// the directory for logs. Paths are made absolute.
    pub(crate) fn resolve(&self) -> Result<(Backend, Option<PathBuf>, PathBuf), String> {
        let objects = self.block_config()?.is_some();
        let home = default_home();
        let abs = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
        let abs_data = |p: PathBuf| if objects { p } else { abs(p) };
        match self.es.config() {
            Some(mut es) => {
                es.ca = es.ca.map(abs);
                Ok((
                    Backend::Elasticsearch(es),
                    self.data.clone().map(abs_data),
                    home,
                ))
            }
            None => {
                let store = abs(self.store.clone().unwrap_or_else(|| home.join("store")));
                let data = match self.data.clone() {
                    Some(d) => abs_data(d),
                    None => default_data(&store),
                };
                Ok((Backend::Embedded(store.clone()), Some(data), store))
            }
        }
    }
}

/// The block cache's default directory: $XDG_CACHE_HOME/esfs, else
/// ~/.cache/esfs.
fn default_cache() -> PathBuf {
    let var = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    match var("XDG_CACHE_HOME") {
        Some(d) => d.join("esfs"),
        None => var("HOME")
            .unwrap_or_else(|| PathBuf::from("/tmp"))
            .join(".cache/esfs"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        store: StoreArgs,
    }

    fn args(a: &[&str]) -> StoreArgs {
        Cli::try_parse_from(std::iter::once("esfs").chain(a.iter().copied()))
            .unwrap()
            .store
    }

    #[test]
    fn object_storage_options_are_checked() {
        let a = args(&[
            "--data",
            "s3://bkt/fs1",
            "--s3-endpoint",
            "http://127.0.0.1:9",
            "--cache-size",
            "2G",
        ]);
        let c = a.block_config().unwrap().unwrap();
        assert_eq!(c.location.to_string(), "s3://bkt/fs1");
        assert_eq!(c.cache_size, 2 << 30);
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(a.resolve().unwrap().1, Some(PathBuf::from("s3://bkt/fs1")));
        let bad = args(&["--data", "s3://B/x"]);
        assert!(bad.resolve().unwrap_err().contains("bad bucket name"));
        let size = args(&["--data", "s3://bkt/x", "--cache-size", "lots"]);
        assert!(
            size.resolve()
                .unwrap_err()
                .starts_with("--cache-size: bad size")
        );
        let stray = args(&["--data", "/tmp/d", "--cache-dir", "/tmp/c"]);
        assert!(
            stray
                .resolve()
                .unwrap_err()
                .contains("apply to --data s3://")
        );
        assert!(args(&["--data", "/tmp/d"]).resolve().is_ok());
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("0").unwrap(), 0);
        assert!(parse_size("5X").is_err() && parse_size("").is_err());
    }
}
