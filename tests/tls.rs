//! esfs as users run it against Elasticsearch: behind TLS and credentials.
//!
//! nginx (Debian's nginx-light) terminates TLS with certificates this test
//! makes at run time, checks basic auth on one port and an `Authorization:
//! ApiKey` header on another, and proxies to the backend: the in-process
//! test double, or the engine at `ESFS_TEST_ES_URL`. Through it, both kinds
//! of credentials mount and work; every refusal (wrong password or key,
//! untrusted, expired or wrong-host certificate, http/https mixed up) fails
//! `esfs mount`, `esfs search` and `esfs fsck` within seconds with one line
//! naming the URL and the cause; and no secret reaches `ps`, the log or an
//! error.

mod common;

use common::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, date_time_ymd,
};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

const USER: &str = "esfs-tester";

/// Random hex, for secrets nothing else on the machine could contain.
fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    let f = fs::File::open("/dev/urandom").unwrap();
    std::io::Read::read_exact(&mut &f, &mut b).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The certificates: one CA the clients are given, and server certificates
/// good, expired, for another host, and from a CA nobody trusts.
fn make_pki(dir: &Path) {
    let ca = |name: &str| {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
    };
    let (trusted, stranger) = (ca("esfs test CA"), ca("esfs stranger CA"));
    fs::write(dir.join("ca.pem"), trusted.pem()).unwrap();
    let here = || vec!["127.0.0.1".to_string(), "localhost".to_string()];
    let elsewhere = vec!["elsewhere.example".to_string()];
    let leaves = [
        ("good", here(), None, &trusted),
        ("expired", here(), Some((2020, 2021)), &trusted),
        ("wronghost", elsewhere, None, &trusted),
        ("unknown", here(), None, &stranger),
    ];
    for (name, sans, years, issuer) in leaves {
        let mut p = CertificateParams::new(sans).unwrap();
        if let Some((from, to)) = years {
            p.not_before = date_time_ymd(from, 1, 1);
            p.not_after = date_time_ymd(to, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, issuer).unwrap();
        fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

/// The server blocks of the terminator, each on its own port.
#[derive(Clone, Copy, Debug)]
enum Block {
    Basic,
    ApiKey,
    Expired,
    WrongHost,
    Unknown,
    /// Plain HTTP, closing every connection without a word: what
    /// Elasticsearch does to plain HTTP on its TLS port.
    Silent,
}
use Block::*;
const BLOCKS: [Block; 6] = [Basic, ApiKey, Expired, WrongHost, Unknown, Silent];

/// nginx in front of the backend, with its own directory and secrets;
/// stopped (by pid) when dropped.
struct Terminator {
    dir: tempfile::TempDir,
    nginx: Child,
    ports: Vec<u16>,
    backend: String,
    password: String,
    api_key: String,
    _double: Option<es_test_server::EsTestServer>,
}

impl Terminator {
    fn start() -> Terminator {
        let dir = tempfile::Builder::new().prefix("esfs-tls-").tempdir();
        let dir = dir.unwrap();
        let d = dir.path().to_path_buf();
        make_pki(&d);
        let (_double, backend) = match std::env::var("ESFS_TEST_ES_URL") {
            Ok(url) => (None, url.trim_end_matches('/').to_string()),
            Err(_) => {
                let s = es_test_server::EsTestServer::start("127.0.0.1:0").unwrap();
                let url = s.url();
                (Some(s), url)
            }
        };
        let password = random_hex(12);
        let api_key = base64_id_key(&random_hex(8), &random_hex(16));
        fs::write(d.join("htpasswd"), format!("{USER}:{{PLAIN}}{password}\n")).unwrap();
        // Free ports from the kernel (bound and released just before nginx
        // takes them): tests and suites running beside this one never clash.
        let ports: Vec<u16> = BLOCKS.iter().map(|_| free_port()).collect();
        let server = |b: Block, port: u16| {
            let cert = match b {
                Silent => {
                    return format!("server {{ listen 127.0.0.1:{port}; return 444; }}\n");
                }
                Basic | ApiKey => "good",
                Expired => "expired",
                WrongHost => "wronghost",
                Unknown => "unknown",
            };
            let check = match b {
                Basic => "auth_basic esfs; auth_basic_user_file htpasswd;",
                ApiKey => "if ($api_key_ok = 0) { return 401; }",
                _ => "",
            };
            format!(
                "server {{ listen 127.0.0.1:{port} ssl; ssl_certificate {cert}.crt; \
                 ssl_certificate_key {cert}.key; location / {{ {check} proxy_pass {backend}; }} }}\n"
            )
        };
        let servers = BLOCKS.iter().zip(&ports);
        let servers: String = servers.map(|(b, p)| server(*b, *p)).collect();
        let conf = format!(
            "daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  # esfs's bulk requests reach 8 MiB; its own timeouts bound the waits.
  client_max_body_size 0; proxy_read_timeout 60s;
  proxy_http_version 1.1; proxy_set_header Connection \"\";
  # nginx checked the credentials; the backend needs none.
  proxy_set_header Authorization \"\";
  map_hash_bucket_size 128;
  map $http_authorization $api_key_ok {{ \"ApiKey {api_key}\" 1; default 0; }}
{servers}}}
",
            d = d.display()
        );
        fs::write(d.join("nginx.conf"), conf).unwrap();
        let nginx = Command::new("nginx")
            .args(["-p", s(&d), "-e", "error.log", "-c", "nginx.conf"])
            .stderr(fs::File::create(d.join("stderr")).unwrap())
            .spawn()
            .expect("nginx (Debian: apt-get install nginx-light)");
        #[rustfmt::skip]
        let mut t = Terminator { dir, nginx, ports, backend, password, api_key, _double };
        t.wait_listening();
        t
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let up = |p: &u16| std::net::TcpStream::connect(("127.0.0.1", *p)).is_ok();
        while !self.ports.iter().all(up) {
            let log = fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default();
            let exited = self.nginx.try_wait().unwrap().is_some();
            let late = Instant::now() > deadline;
            assert!(!exited && !late, "nginx did not start:\n{log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn port(&self, b: Block) -> u16 {
        self.ports[b as usize]
    }

    fn url(&self, b: Block) -> String {
        format!("https://127.0.0.1:{}", self.port(b))
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
}

impl Drop for Terminator {
    fn drop(&mut self) {
        // SIGTERM: nginx's fast shutdown takes its worker along.
        unsafe { libc::kill(self.nginx.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.nginx.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// An API key as Elasticsearch issues it: base64 of "id:key".
fn base64_id_key(id: &str, key: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{id}:{key}"))
}

fn index_name() -> String {
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("esfs-tls{}-{n}", std::process::id())
}

/// How a command authenticates: its options and environment.
#[derive(Clone, Default)]
struct Creds {
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
}

fn basic(password: &str) -> Creds {
    let (args, env) = (
        vec!["--es-user".into(), USER.into()],
        vec![("ESFS_ES_PASSWORD", password.into())],
    );
    Creds { args, env }
}

fn api_key(key: &str) -> Creds {
    let env = vec![("ESFS_ES_API_KEY", key.into())];
    Creds { args: vec![], env }
}

/// `esfs ARGS` with the credentials (and nothing inherited that names a
/// cluster or sets the log level), in `dir`.
fn esfs(dir: &Path, args: &[&str], creds: &Creds) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_esfs"));
    for var in ["URL", "USER", "PASSWORD", "API_KEY", "CA"] {
        cmd.env_remove(format!("ESFS_ES_{var}"));
    }
    cmd.env_remove("RUST_LOG").args(args).args(&creds.args);
    cmd.envs(creds.env.iter().map(|(k, v)| (k, v)));
    cmd.current_dir(dir).output().unwrap()
}

/// `--es URL --index NAME [--es-ca FILE]`
fn es_opts<'a>(url: &'a str, index: &'a str, ca: Option<&'a Path>) -> Vec<&'a str> {
    let mut v = vec!["--es", url, "--index", index];
    v.extend(ca.map(|c| ["--es-ca", s(c)]).into_iter().flatten());
    v
}

/// Asserts no process's command line holds `secret`.
fn assert_not_in_ps(secret: &str) {
    for p in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(!cmdline.contains(secret), "a secret in ps: {cmdline}");
    }
}

/// A background mount, unmounted (and its server killed) when dropped.
struct BgMount {
    mnt: PathBuf,
    pid: libc::pid_t,
}

impl Drop for BgMount {
    fn drop(&mut self) {
        // Only a mount still there has a server still ours to kill.
        if is_esfs_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mnt)
                .status();
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

/// Mount through the terminator as a user would (in the background), work
/// in it, search it, unmount; no secret in ps, the log or any output.
fn mount_and_work(t: &Terminator, block: Block, creds: &Creds, secret: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (mnt, log) = (tmp.path().join("mnt"), tmp.path().join("esfs.log"));
    fs::create_dir(&mnt).unwrap();
    let (url, index, ca) = (t.url(block), index_name(), t.ca());
    let es = es_opts(&url, &index, Some(&ca));
    // The server logs at debug level: what it logs holds no secret either.
    let mut debug = creds.clone();
    debug.env.push(("RUST_LOG", "debug".into()));
    let mount = [&["mount", s(&mnt), "--log", s(&log)][..], &es].concat();
    let out = esfs(tmp.path(), &mount, &debug);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    let log_text = read(&log);
    assert!(
        out.status.success(),
        "mount via {url}: {stderr}\nlog:\n{log_text}"
    );
    let pid = stdout
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next());
    let pid = pid.unwrap().parse().unwrap();
    let _bg = BgMount {
        mnt: mnt.clone(),
        pid,
    };
    assert_not_in_ps(secret);

    let listing = sh_ok(
        &mnt,
        "mkdir docs && printf 'a needle in a haystack\\n' > docs/a.txt && cat docs/a.txt \
         && mv docs/a.txt docs/b.txt && echo more >> docs/b.txt && ls docs",
    );
    assert_eq!(listing, "a needle in a haystack\nb.txt\n");
    let b = read(&mnt.join("docs/b.txt"));
    assert_eq!(b, "a needle in a haystack\nmore\n");
    // Through the mount (which says where its cluster and CA are) and
    // straight from the cluster.
    let found = esfs(&mnt, &["search", "needle", "docs"], creds);
    let (out, err) = (text(&found.stdout), text(&found.stderr));
    assert_eq!(out, "docs/b.txt:a needle in a haystack\n", "{err}");
    let found = esfs(
        tmp.path(),
        &[&["search", "-l", "more"][..], &es].concat(),
        creds,
    );
    let (out, err) = (text(&found.stdout), text(&found.stderr));
    assert_eq!(out, "/docs/b.txt\n", "{err}");

    let out = esfs(tmp.path(), &["umount", s(&mnt)], &Creds::default());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let deadline = Instant::now() + Duration::from_secs(10);
    while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = read(&log);
    assert!(
        log.contains("DEBUG"),
        "the server logged at debug level:\n{log}"
    );
    for (what, s) in [
        ("mount's output", &stdout),
        ("mount's errors", &stderr),
        ("log", &log),
    ] {
        assert!(!s.contains(secret), "the secret is in the {what}:\n{s}");
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn read(p: &Path) -> String {
    String::from_utf8_lossy(&fs::read(p).unwrap_or_default()).into_owned()
}

#[test]
fn basic_auth_mounts_and_works() {
    let t = Terminator::start();
    mount_and_work(&t, Basic, &basic(&t.password), &t.password);
}

#[test]
fn api_key_mounts_and_works() {
    let t = Terminator::start();
    mount_and_work(&t, ApiKey, &api_key(&t.api_key), &t.api_key);
}

/// Each refusal, from `esfs mount`, `esfs search` and `esfs fsck`: a failure
/// within seconds, one line naming the URL and the cause, no secret.
#[test]
fn refusals_are_one_clear_line() {
    let t = Terminator::start();
    let wrong_password = random_hex(12);
    let wrong_key = base64_id_key("nobody", &random_hex(16));
    let plain = t.backend.replace("http://", "https://");
    let to_tls = format!("http://127.0.0.1:{}", t.port(Basic));
    let silent = format!("http://127.0.0.1:{}", t.port(Silent));
    let (good, none) = (basic(&t.password), Creds::default());
    let (wrong, wrong_api) = (basic(&wrong_password), api_key(&wrong_key));
    let ca = t.ca();
    let other_ca = format!("not signed by the CA in {}: give its CA", s(&ca));
    let https = |u: &str| format!("use {}", u.replace("http:", "https:"));
    let u = |b| t.url(b);
    // (URL, credentials, --es-ca given, the cause the line must name)
    #[rustfmt::skip]
    let cases: Vec<(String, &Creds, bool, String)> = vec![
        (u(Basic), &wrong, true, format!("authentication failed for user {USER}")),
        (u(Basic), &none, true, "needs credentials: give --es-user".into()),
        (u(Basic), &good, false, "not trusted (signed by an unknown CA): give its CA".into()),
        (u(ApiKey), &wrong_api, true, "the API key was refused".into()),
        (u(Unknown), &good, true, other_ca),
        (u(Expired), &good, true, "its certificate expired".into()),
        (u(WrongHost), &good, true, "not valid for 127.0.0.1 (only for elsewhere".into()),
        (to_tls.clone(), &good, true, format!("the server speaks TLS: {}", https(&to_tls))),
        (plain.clone(), &good, true, format!("does not speak TLS: use {}", t.backend)),
        (silent.clone(), &good, true, format!("8 and later do by default), {}", https(&silent))),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let (mnt, log) = (tmp.path().join("mnt"), tmp.path().join("esfs.log"));
    fs::create_dir(&mnt).unwrap();
    let mut failures = Vec::new();
    for (url, creds, with_ca, cause) in &cases {
        let index = index_name();
        let es = es_opts(url, &index, with_ca.then_some(&ca));
        let commands: [Vec<&str>; 3] = [
            [&["mount", s(&mnt), "--log", s(&log)][..], &es].concat(),
            [&["search", "needle"][..], &es].concat(),
            [&["fsck"][..], &es].concat(),
        ];
        for args in commands {
            let start = Instant::now();
            let out = esfs(tmp.path(), &args, creds);
            let took = start.elapsed();
            let err = text(&out.stderr);
            eprintln!("{:6} {err}", args[0]);
            let secrets = [&t.password, &t.api_key, &wrong_password, &wrong_key];
            let ok = !out.status.success()
                && took < Duration::from_secs(15)
                && err.trim().lines().count() == 1
                && err.contains(url.trim_end_matches('/'))
                && err.contains(cause.as_str())
                && !secrets.iter().any(|x| err.contains(x.as_str()));
            if !ok {
                let cmd = args[0];
                failures.push(format!(
                    "{cmd} {url} ({took:?}): want {cause:?}, got: {err}"
                ));
            }
        }
    }
    assert!(!is_esfs_mounted(&mnt));
    let log = read(&log);
    for x in [&t.password, &t.api_key, &wrong_password, &wrong_key] {
        assert!(!log.contains(x.as_str()), "a secret in the log:\n{log}");
    }
    let failures = failures.join("\n");
    assert!(failures.is_empty(), "unclear refusals:\n{failures}");
}
