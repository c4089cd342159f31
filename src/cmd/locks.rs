//! `esfs locks`: list the lock, intent and session documents, or break one.

use super::args::StoreArgs;
use super::{CmdError, open_fs};
use crate::locks::LockManager;
use crate::store::Idx;

/// `esfs locks`: its command line.
#[derive(clap::Args)]
pub struct LocksCmd {
    #[command(flatten)]
    store: StoreArgs,
    /// Delete the lock document with this id (as listed), whoever holds it.
    #[arg(long = "break", value_name = "ID")]
    break_id: Option<String>,
}

/// Lists locks, intents and sessions; exit status 1 when --break finds no such lock.
pub fn run(l: LocksCmd) -> Result<i32, CmdError> {
    let (fs, stores) = open_fs(&l.store, false)?;
    let lm = fs.lock_manager();
    if let Some(id) = l.break_id {
        let gone = stores.meta.delete(Idx::Locks, &id, None)?;
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
    let now = crate::locks::manager::now_ms();
    println!(
        "{:<48} {:<10} {:>8} {:<6} OWNER",
        "ID", "TYPE", "AGE", "ALIVE"
    );
    for (id, _, doc) in LockManager::list(&*stores.meta)? {
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
