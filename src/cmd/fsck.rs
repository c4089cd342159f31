//! `esfs fsck`: check the filesystem's documents and, with --repair,
//! restore them (the checks themselves are `crate::fsck`).

use super::args::StoreArgs;
use super::{CmdError, open_fs};
use crate::open::{Backend, lock_store, unflushed_journal};

/// `esfs fsck`: its command line.
#[derive(clap::Args)]
pub struct FsckCmd {
    #[command(flatten)]
    store: StoreArgs,
    /// Repair what is wrong: roll forward unfinished renames of dead mounts,
    /// break their locks, fix paths, link counts, unreferenced inodes and
    /// contents.
    #[arg(long)]
    repair: bool,
}

/// Exit status: 0 clean, 1 problems found and repaired, 4 problems left.
pub fn run(f: FsckCmd) -> Result<i32, CmdError> {
    let (fs, stores) = open_fs(&f.store, true)?;
    // A dead mount's unflushed journal is checked (and, with --repair,
    // applied); a live mount's is its own business. Holding the mount lock
    // also keeps a mount from starting halfway through.
    let sole = match f.store.resolve()?.0 {
        Backend::Embedded(dir) => match lock_store(&dir) {
            Ok(lock) => Some((lock, unflushed_journal(&dir))),
            Err(e) => {
                eprintln!("esfs fsck: {e}: its pending file sizes are not checked");
                None
            }
        },
        Backend::Elasticsearch(_) => None,
    };
    let report = crate::fsck::fsck(
        &fs,
        &stores.meta,
        &stores.data,
        f.repair,
        sole.as_ref().map(|(_, journal)| journal.as_path()),
    )?;
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
