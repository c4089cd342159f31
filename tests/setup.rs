//! The README's setup on a fresh machine: its test command installs what
//! the tests need, and its commands work as written.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A PATH holding only bash, dirname, env and the given stubs (shell
/// scripts): a machine where none of the test tools is installed.
fn bare_path(dir: &Path, stubs: &[(&str, &str)]) -> PathBuf {
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    for tool in ["bash", "dirname", "env"] {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap();
        std::os::unix::fs::symlink(real, bin.join(tool)).unwrap();
    }
    for (name, body) in stubs {
        let p = bin.join(name);
        fs::write(&p, format!("#!/bin/bash\n{body}\n")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin
}

fn run_test_script(bin: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(repo().join("scripts/test"))
        .args(args)
        .env_clear()
        .env("PATH", bin)
        .output()
        .expect("run scripts/test");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Each stub appends its name and arguments to `calls`.
fn recorder(calls: &Path) -> String {
    format!("echo \"$(basename \"$0\") $*\" >> {}", calls.display())
}

#[test]
fn test_script_installs_missing_packages_as_root_then_runs_cargo_test() {
    let tmp = tempfile::tempdir().unwrap();
    let calls = tmp.path().join("calls");
    let rec = recorder(&calls);
    let bin = bare_path(
        tmp.path(),
        &[
            ("id", "echo 0"),
            ("basename", "echo ${1##*/}"),
            ("apt-get", &rec),
            ("cargo", &rec),
        ],
    );
    let (code, err) = run_test_script(&bin, &["--test", "mount", "some_test"]);
    assert_eq!(code, 0, "stderr: {err}");
    let calls = fs::read_to_string(&calls).unwrap();
    let lines: Vec<&str> = calls.lines().collect();
    assert_eq!(lines[0], "apt-get update -qq", "{calls}");
    assert!(
        lines[1].starts_with("apt-get install -y -qq --no-install-recommends fuse3 rsync attr git libglib2.0-bin dbus-daemon"),
        "{calls}"
    );
    assert_eq!(lines[2], "cargo test --test mount some_test", "{calls}");
    assert_eq!(lines.len(), 3, "{calls}");
}

#[test]
fn test_script_uses_sudo_when_not_root() {
    let tmp = tempfile::tempdir().unwrap();
    let calls = tmp.path().join("calls");
    let rec = recorder(&calls);
    let bin = bare_path(
        tmp.path(),
        &[
            ("id", "echo 1000"),
            ("basename", "echo ${1##*/}"),
            ("sudo", &format!("{rec}; exec \"$@\"")),
            ("apt-get", &rec),
            ("cargo", &rec),
        ],
    );
    // With no arguments the script goes on to the real-engine phases.
    let (code, err) = run_test_script(&bin, &["--test", "mount"]);
    assert_eq!(code, 0, "stderr: {err}");
    let calls = fs::read_to_string(&calls).unwrap();
    let lines: Vec<&str> = calls.lines().collect();
    assert!(
        lines[0].starts_with("sudo env DEBIAN_FRONTEND=noninteractive apt-get update"),
        "{calls}"
    );
    assert_eq!(lines[1], "apt-get update -qq", "{calls}");
    assert!(lines[2].starts_with("sudo "), "{calls}");
    assert!(lines[3].starts_with("apt-get install"), "{calls}");
    assert_eq!(lines[4], "cargo test --test mount", "{calls}");
}

#[test]
fn test_script_without_root_or_sudo_names_the_packages_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let calls = tmp.path().join("calls");
    let rec = recorder(&calls);
    let bin = bare_path(
        tmp.path(),
        &[
            ("id", "echo 1000"),
            ("basename", "echo ${1##*/}"),
            ("apt-get", &rec),
            ("cargo", &rec),
        ],
    );
    let (code, err) = run_test_script(&bin, &[]);
    assert_eq!(code, 1, "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("missing packages fuse3 rsync attr git libglib2.0-bin dbus-daemon"),
        "{err}"
    );
    assert!(
        !calls.exists(),
        "nothing may run: {:?}",
        fs::read_to_string(&calls)
    );
}

/// The README's test command is that script, and CI runs exactly it.
#[test]
fn readme_and_ci_run_the_test_script() {
    let readme = fs::read_to_string(repo().join("README.md")).unwrap();
    let section = &readme[readme.find("**Run the tests**").expect("test section")..];
    let block = section
        .split("```sh\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    assert_eq!(block, "scripts/test\n");
    let ci = fs::read_to_string(repo().join(".ci/run")).unwrap();
    let cmds: Vec<&str> = ci
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .collect();
    assert!(cmds.contains(&"scripts/test"), "{ci}");
    assert!(
        !cmds
            .iter()
            .any(|l| l.contains("cargo test") || l.contains("apt-get")),
        "{ci}"
    );
}

/// The README's setup on a fresh account: `./mount.sh MNT` (rustup's
/// ~/.cargo/bin and ~/.profile, no esfs anywhere on PATH), then in a new
/// login shell the README's `esfs search`, `esfs fsck` and `./mount.sh -u`
/// work as written.
#[test]
fn after_mount_sh_esfs_is_on_path_in_a_new_login_shell() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // A checkout whose release binary is built (this test's binary).
    let checkout = t.join("esfs");
    fs::create_dir_all(checkout.join("src")).unwrap();
    fs::create_dir_all(checkout.join("target/release")).unwrap();
    fs::write(checkout.join("Cargo.toml"), "").unwrap();
    fs::copy(repo().join("mount.sh"), checkout.join("mount.sh")).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_esfs"),
        checkout.join("target/release/esfs"),
    )
    .unwrap();
    // A home as rustup leaves it.
    let home = t.join("home");
    fs::create_dir_all(home.join(".cargo/bin")).unwrap();
    fs::write(
        home.join(".cargo/env"),
        "case \":$PATH:\" in *:\"$HOME/.cargo/bin\":*) ;; *) export PATH=\"$HOME/.cargo/bin:$PATH\" ;; esac\n",
    )
    .unwrap();
    fs::write(home.join(".profile"), ". \"$HOME/.cargo/env\"\n").unwrap();
    let shell = |login: bool, script: &str| {
        let out = Command::new("env")
            .args(["-i", &format!("HOME={}", home.display())])
            .arg("PATH=/usr/local/bin:/usr/bin:/bin")
            .arg("RUST_LOG=warn")
            .arg("bash")
            .args(if login {
                &["-l", "-c"][..]
            } else {
                &["-c"][..]
            })
            .arg(script)
            .current_dir(t)
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, out) = shell(false, "command -v esfs");
    assert!(!ok, "esfs already on PATH: {out}");
    let (ok, out) = shell(false, "./esfs/mount.sh ~/mnt");
    assert!(ok, "{out}");
    let (ok, out) = shell(
        true,
        "set -e; command -v esfs; cd ~/mnt && echo needle > f && esfs search needle; cd && esfs fsck",
    );
    let (ok_u, out_u) = shell(true, "./esfs/mount.sh -u ~/mnt");
    assert!(ok, "{out}");
    assert!(ok_u, "{out_u}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some(home.join(".cargo/bin/esfs").to_str().unwrap())
    );
    assert_eq!(lines.next(), Some("f:needle"), "{out}");
    assert!(
        out.contains("esfs fsck: ") && out.contains("0 problem(s)"),
        "{out}"
    );
}
