//! Where the blocks live and how to reach them: `s3://BUCKET/PREFIX`, the
//! endpoint, the region and the credentials, found as the AWS tools find
//! them (environment first, then the shared files of `AWS_PROFILE`).

use object_store::aws::AmazonS3Builder;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `s3://BUCKET/PREFIX` (PREFIX may be empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    /// Without leading or trailing slashes.
    pub prefix: String,
}

/// Whether `--data` names object storage rather than a directory.
pub fn is_object_url(s: &str) -> bool {
    s.starts_with("s3://")
}

impl S3Location {
    pub fn parse(url: &str) -> Result<S3Location, String> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| format!("{url:?} is not an s3://BUCKET/PREFIX URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        // S3's bucket naming rules (3-63 of a-z 0-9 . -, alphanumeric ends).
        let ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
            && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
            && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !ok {
            return Err(format!(
                "{url:?}: bad bucket name {bucket:?} (3-63 characters of a-z, 0-9, '.', '-')"
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|p| p == "." || p == "..")
            || prefix.contains("//")
            || prefix.chars().any(|c| c.is_control())
        {
            return Err(format!("{url:?}: bad prefix {prefix:?}"));
        }
        Ok(S3Location {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }
}

impl std::fmt::Display for S3Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

/// Everything a [`super::BlockStore`] is opened with.
#[derive(Clone, Debug)]
pub struct BlockConfig {
    pub location: S3Location,
    /// `--s3-endpoint`, for S3-compatible servers; else AWS_ENDPOINT_URL,
    /// the profile's `endpoint_url`, or AWS itself.
    pub endpoint: Option<String>,
    /// Else AWS_REGION / AWS_DEFAULT_REGION, the profile's, or us-east-1.
    pub region: Option<String>,
    /// (access key id, secret): over the environment's and the profile's
    /// (for callers that hold them, such as tests of a server they run).
    pub credentials: Option<(String, String)>,
    /// Local block cache (`--cache-dir`); None: no cache.
    pub cache_dir: Option<PathBuf>,
    /// `--cache-size` in bytes; 0: no cache.
    pub cache_size: u64,
    /// Largest block a write is cut into.
    pub block_size: usize,
    /// Requests in flight at once (uploads and downloads each).
    pub concurrency: usize,
    /// How long one operation keeps retrying an unreachable or failing
    /// store before failing with ETIMEDOUT.
    pub retry_budget: Duration,
    /// One request's limit (a 4 MiB block on a slow link needs a while).
    pub request_timeout: Duration,
}

impl BlockConfig {
    pub const DEFAULT_BLOCK_SIZE: usize = 4 << 20;

    pub fn new(location: S3Location) -> BlockConfig {
        BlockConfig {
            location,
            endpoint: None,
            region: None,
            credentials: None,
            cache_dir: None,
            cache_size: 0,
            block_size: Self::DEFAULT_BLOCK_SIZE,
            concurrency: 16,
            retry_budget: Duration::from_secs(15),
            request_timeout: Duration::from_secs(60),
        }
    }
}

/// The settings of one profile of the AWS shared files.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Profile {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
}

/// `AWS_PROFILE`'s settings (default "default") from
/// `AWS_SHARED_CREDENTIALS_FILE` (default ~/.aws/credentials, sections
/// `[NAME]`) over `AWS_CONFIG_FILE` (default ~/.aws/config, sections
/// `[profile NAME]`, or `[default]`). Static keys only: SSO, roles and
/// `credential_process` are the AWS CLI's business (export its
/// `aws configure export-credentials` into the environment instead).
pub fn shared_profile(env: &dyn Fn(&str) -> Option<String>) -> Profile {
    let home = env("HOME").map(PathBuf::from);
    let file = |var: &str, rel: &str| {
        env(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(rel)))
    };
    let name = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let mut settings = HashMap::new();
    if let Some(p) = file("AWS_CONFIG_FILE", ".aws/config") {
        let section = if name == "default" {
            "default".to_string()
        } else {
            format!("profile {name}")
        };
        settings.extend(ini_section(&p, &section));
    }
    if let Some(p) = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials") {
        settings.extend(ini_section(&p, &name));
    }
    let mut take = |k: &str| settings.remove(k).filter(|v| !v.is_empty());
    Profile {
        access_key_id: take("aws_access_key_id"),
        secret_access_key: take("aws_secret_access_key"),
        session_token: take("aws_session_token"),
        region: take("region"),
        endpoint_url: take("endpoint_url"),
    }
}

/// The top-level `key = value` pairs of `[section]` in an AWS shared file
/// (indented lines belong to a nested block, e.g. `s3 =`, and are skipped;
/// `#`/`;` start comments). A missing file has none.
fn ini_section(path: &Path, section: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Ok(text) = std::fs::read_to_string(path) else {
        return out;
    };
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let l = line.trim();
        if l.is_empty() || l.starts_with(['#', ';']) {
            continue;
        }
        if let Some(h) = l.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            inside = h.split_whitespace().collect::<Vec<_>>().join(" ") == section;
            continue;
        }
        if let (true, Some((k, v))) = (inside, l.split_once('=')) {
            out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

/// The object_store builder for `cfg`: the environment's AWS_* settings
/// (object_store's own reading, which also covers container and web
/// identity credentials), then what the environment lacks from the shared
/// profile, then the command line over both. Also the endpoint URL, for
/// messages (plain http is to be allowed when it is http://).
pub(super) fn builder(cfg: &BlockConfig) -> Result<(AmazonS3Builder, String), String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let profile = shared_profile(&env);
    let mut b = AmazonS3Builder::from_env().with_bucket_name(&cfg.location.bucket);
    if env("AWS_ACCESS_KEY_ID").is_none()
        && let (Some(id), Some(secret)) = (&profile.access_key_id, &profile.secret_access_key)
    {
        b = b.with_access_key_id(id).with_secret_access_key(secret);
        if let Some(t) = &profile.session_token {
            b = b.with_token(t);
        }
    }
    if let Some((id, secret)) = &cfg.credentials {
        b = b.with_access_key_id(id).with_secret_access_key(secret);
    }
    let region = cfg
        .region
        .clone()
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .or(profile.region)
        .unwrap_or_else(|| "us-east-1".into());
    b = b.with_region(&region);
    let endpoint = cfg
        .endpoint
        .clone()
        .or_else(|| env("AWS_ENDPOINT_URL_S3"))
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .or(profile.endpoint_url);
    let shown = match &endpoint {
        Some(e) => {
            let url = url_of(e)?;
            // An S3-compatible server: path-style requests (no bucket
            // subdomains to resolve), plain http allowed when asked for.
            b = b
                .with_endpoint(url.trim_end_matches('/'))
                .with_virtual_hosted_style_request(false);
            url.trim_end_matches('/').to_string()
        }
        None => format!("https://s3.{region}.amazonaws.com"),
    };
    Ok((b, shown))
}

fn url_of(e: &str) -> Result<String, String> {
    let ok = (e.starts_with("http://") || e.starts_with("https://"))
        && e.split("://").nth(1).is_some_and(|h| !h.is_empty());
    if ok {
        Ok(e.to_string())
    } else {
        Err(format!(
            "S3 endpoint {e:?} is not an http:// or https:// URL"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_locations() {
        let l = S3Location::parse("s3://my-bucket/a/b/").unwrap();
        assert_eq!((l.bucket.as_str(), l.prefix.as_str()), ("my-bucket", "a/b"));
        assert_eq!(S3Location::parse("s3://bkt").unwrap().prefix, "");
        for bad in [
            "s3://",
            "s3://B/x",
            "s3://ab/x",
            "s3://b_k/x",
            "/dir",
            "s3://bkt/a/../b",
            "s3://bkt/a//b",
        ] {
            assert!(S3Location::parse(bad).is_err(), "{bad}");
        }
        assert!(is_object_url("s3://x/y") && !is_object_url("/s3://x"));
    }

    #[test]
    fn reads_the_profile_of_the_shared_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".aws")).unwrap();
        std::fs::write(
            dir.path().join(".aws/config"),
            "[default]\nregion = eu-west-1\n[profile work]\nregion=us-west-2\nendpoint_url = http://127.0.0.1:1\ns3 =\n  addressing_style = path\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join(".aws/credentials"),
            "# keys\n[default]\naws_access_key_id = AKD\naws_secret_access_key = SD\n\n[work]\naws_access_key_id=AKW\naws_secret_access_key=SW\naws_session_token = T\n",
        )
        .unwrap();
        let home = dir.path().to_str().unwrap().to_string();
        let vars = |profile: Option<&'static str>| {
            let home = home.clone();
            move |k: &str| match k {
                "HOME" => Some(home.clone()),
                "AWS_PROFILE" => profile.map(String::from),
                _ => None,
            }
        };
        let d = shared_profile(&vars(None));
        assert_eq!(d.access_key_id.as_deref(), Some("AKD"));
        assert_eq!(d.region.as_deref(), Some("eu-west-1"));
        assert_eq!(d.session_token, None);
        let w = shared_profile(&vars(Some("work")));
        assert_eq!(
            w,
            Profile {
                access_key_id: Some("AKW".into()),
                secret_access_key: Some("SW".into()),
                session_token: Some("T".into()),
                region: Some("us-west-2".into()),
                endpoint_url: Some("http://127.0.0.1:1".into()),
            }
        );
        assert_eq!(shared_profile(&vars(Some("none"))), Profile::default());
    }
}
