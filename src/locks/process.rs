//! A session's process, so a mount that died on this machine is known dead
//! at once rather than when its lease lapses.
//!
//! A lease is the only proof of life across machines, and it is slow: a
//! mount killed with `kill -9` and mounted again on the same machine waited
//! lease and grace (25 s) before it could break the dead mount's delegation
//! and locks. On the machine it ran on, the kernel knows better. A session
//! document records where its process runs (host name, boot id, PID
//! namespace) and which process it is (pid, start time); a reader in the
//! same boot and PID namespace of the same host takes the session for dead
//! when that process is gone, a zombie, or another process under a reused
//! pid. Anything it cannot tell (another machine, another namespace, a
//! process it may not look at) leaves the decision to the lease.

use serde_json::{Value, json};
use std::sync::OnceLock;

/// Where this process runs and which process it is, as a session
/// document's fields.
pub(crate) fn here() -> Value {
    let me = local();
    json!({
        "host": me.host, "boot": me.boot, "pidns": me.pidns,
        "pid": std::process::id(), "start": me.start,
    })
}

/// Whether the session `doc` describes a process of this machine's boot and
/// PID namespace that is no longer running.
pub(crate) fn died_here(doc: &Value) -> bool {
    let me = local();
    let same_place = me.boot.is_some()
        && me.pidns.is_some()
        && doc["host"] == me.host.as_str()
        && doc["boot"].as_str() == me.boot.as_deref()
        && doc["pidns"].as_str() == me.pidns.as_deref();
    let (Some(pid), Some(start)) = (doc["pid"].as_i64(), doc["start"].as_u64()) else {
        return false;
    };
    if !same_place || pid <= 0 || pid > i32::MAX as i64 {
        return false;
    }
    // kill(pid, 0) tells whether the pid exists even where /proc hides
    // other users' processes (hidepid): EPERM means it does.
    // SAFETY: signal 0 sends nothing; it only checks the pid.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return true;
    }
    match stat(pid as u32) {
        Some((state, started)) => state == 'Z' || state == 'X' || started != start,
        None => false,
    }
}

/// This process's place and start, read once.
struct Local {
    host: String,
    boot: Option<String>,
    pidns: Option<String>,
    start: Option<u64>,
}

fn local() -> &'static Local {
    static LOCAL: OnceLock<Local> = OnceLock::new();
    LOCAL.get_or_init(|| Local {
        host: read_trimmed("/proc/sys/kernel/hostname").unwrap_or_default(),
        boot: read_trimmed("/proc/sys/kernel/random/boot_id"),
        pidns: std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .map(|p| p.to_string_lossy().into_owned()),
        start: stat(std::process::id()).map(|(_, s)| s),
    })
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// A process's state letter and start time (clock ticks after boot), from
/// `/proc/PID/stat`; None if it cannot be read.
fn stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything:
    // the fields after its last ')' start at field 3, the state.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?; // field 22
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_not_dead_and_a_finished_child_is() {
        let me = here();
        assert!(!died_here(&me), "{me}");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut doc = here();
        doc["pid"] = json!(pid);
        doc["start"] = json!(stat(pid).unwrap().1);
        assert!(!died_here(&doc), "{doc}");
        child.kill().unwrap();
        // A zombie until reaped.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(died_here(&doc), "{doc}");
        child.wait().unwrap();
        // (Reaped: gone, unless its pid was reused already, by another
        // process with another start time.)
        assert!(died_here(&doc), "{doc}");
        // Another start time under a live pid: a reused pid.
        let mut reused = here();
        reused["start"] = json!(me["start"].as_u64().unwrap() + 1);
        assert!(died_here(&reused));
        // Elsewhere: the lease decides.
        let mut elsewhere = reused.clone();
        elsewhere["boot"] = json!("another boot");
        assert!(!died_here(&elsewhere));
        let mut old = reused;
        old.as_object_mut().unwrap().remove("start");
        assert!(
            !died_here(&old),
            "a session from before start times were recorded"
        );
    }
}
