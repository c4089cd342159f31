//! Where a filesystem keeps its metadata and contents, as users meet it
//! through the `esfs` command: commands that only read create nothing.

mod common;

use es_test_server::EsTestServer;
use std::fs;
use std::path::Path;
use std::process::Command;

/// `esfs ARGS` with HOME and XDG_DATA_HOME in `home`: (exit code, stdout, stderr).
fn esfs_in(home: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_esfs"))
        .args(args)
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("xdg"))
        .env_remove("ESFS_STORE")
        .env_remove("ESFS_DATA")
        .env_remove("ESFS_ES_URL")
        .env_remove("ESFS_ES_INDEX")
        .output()
        .expect("run esfs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every path under `dir` (sorted), to see that nothing was created.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn read_only_commands_on_a_missing_store_create_nothing() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let missing = h.join("no/such/dir");
    let empty = h.join("empty");
    fs::create_dir(&empty).unwrap();
    let before = tree(h);
    for dir in [&missing, &empty] {
        let d = dir.to_str().unwrap();
        for args in [
            vec!["fsck", "--store", d],
            vec!["locks", "--store", d],
            vec!["search", "--store", d, "needle", "/"],
            vec!["search", "--store", d, "--find", "/"],
        ] {
            let (code, out, err) = esfs_in(h, &args);
            assert_ne!(code, 0, "{args:?}: {out}{err}");
            // "esfs: ..." or "esfs search: ...", one line.
            let want = format!(": no esfs filesystem at {d}");
            assert!(
                err.trim().ends_with(&want) && err.trim().lines().count() == 1,
                "{args:?}: {err} (stdout {out:?})"
            );
            assert_eq!(tree(h), before, "{args:?} created something");
        }
    }
    // The default store too.
    let (code, _, err) = esfs_in(h, &["fsck"]);
    assert_ne!(code, 0);
    assert!(err.contains("no esfs filesystem at "), "{err}");
    assert_eq!(
        tree(h),
        before,
        "fsck of the default store created something"
    );
}

/// HTTP status of a HEAD request.
fn head(url: &str) -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    agent.head(url).call().unwrap().status().as_u16()
}

#[test]
fn read_only_commands_on_a_missing_index_create_nothing() {
    let server = EsTestServer::start("127.0.0.1:0").unwrap();
    let url = server.url();
    let home = tempfile::tempdir().unwrap();
    for args in [
        vec!["search", "--es", &url, "--index", "typo", "needle", "/"],
        vec!["search", "--es", &url, "--index", "typo", "--find", "/"],
        vec!["fsck", "--es", &url, "--index", "typo"],
        vec!["locks", "--es", &url, "--index", "typo"],
    ] {
        let (code, out, err) = esfs_in(home.path(), &args);
        assert_ne!(code, 0, "{args:?}: {out}{err}");
        let want = format!(": no esfs filesystem at {url} (no index typo-entries)");
        assert!(
            err.trim().ends_with(&want) && err.trim().lines().count() == 1,
            "{args:?}: {err}"
        );
        for idx in ["entries", "inodes", "locks", "meta", "chunks"] {
            assert_eq!(
                head(&format!("{url}/typo-{idx}")),
                404,
                "{args:?} made typo-{idx}"
            );
        }
    }
}
