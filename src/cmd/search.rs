//! `esfs search PATTERN [PATH...]`: grep -r through the index. The command
//! parses its arguments into [`crate::search::run::Options`] and prints the
//! failure, if any; the search itself is [`crate::search`].
//!
//! Exit status as grep's: 0 something found, 1 nothing, 2 an error.

use super::CmdError;
use crate::model::Kind;
use crate::open::{Backend, default_data};
use crate::search::pattern::Syntax;
use crate::search::query::{Filters, SizeCmp};
use crate::search::run::{self, GroupBy, Matching, Options, Output, Place};
use crate::store::es::EsConfig;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

/// grep through the index: `esfs search [OPTIONS] PATTERN [PATH...]`.
///
/// Like `grep -r PATTERN PATH...` (always recursive; -r is accepted), with
/// the same output and exit status (0 found, 1 none, 2 error), but the
/// index picks the files to read, so it takes milliseconds instead of a
/// walk of the tree. PATH defaults to the current directory.
#[derive(clap::Args, Debug)]
pub struct SearchArgs {
    /// PATTERN then PATHs (only PATHs with -e or --find).
    #[arg(value_name = "PATTERN/PATH", allow_hyphen_values = false)]
    pub args: Vec<OsString>,
    /// Use PATTERN (repeatable; any of them may match).
    #[arg(short = 'e', long = "regexp", value_name = "PATTERN")]
    pub regexp: Vec<String>,
    /// Accepted for grep compatibility: search is always recursive.
    #[arg(short = 'r', long = "recursive")]
    pub recursive: bool,
    #[arg(short = 'R', long = "dereference-recursive", hide = true)]
    pub recursive2: bool,
    /// Print only the names of files with matches.
    #[arg(short = 'l', long = "files-with-matches")]
    pub files: bool,
    /// Print the number of matching lines per file.
    #[arg(short = 'c', long = "count")]
    pub count: bool,
    /// Prefix matching lines with their line number.
    #[arg(short = 'n', long = "line-number")]
    pub line_number: bool,
    /// Ignore case.
    #[arg(short = 'i', long = "ignore-case")]
    pub ignore_case: bool,
    /// Match whole words only.
    #[arg(short = 'w', long = "word-regexp")]
    pub word: bool,
    /// Match whole lines only.
    #[arg(short = 'x', long = "line-regexp")]
    pub line: bool,
    /// PATTERN is a fixed string.
    #[arg(short = 'F', long = "fixed-strings")]
    pub fixed: bool,
    /// PATTERN is an extended regular expression.
    #[arg(short = 'E', long = "extended-regexp")]
    pub extended: bool,
    /// PATTERN is a basic regular expression (the default).
    #[arg(short = 'G', long = "basic-regexp")]
    pub basic: bool,
    /// Always print file names.
    #[arg(short = 'H', long = "with-filename")]
    pub with_filename: bool,
    /// Never print file names.
    #[arg(short = 'h', long = "no-filename")]
    pub no_filename: bool,
    /// Print nothing; exit status only.
    #[arg(short = 'q', long = "quiet", visible_alias = "silent")]
    pub quiet: bool,
    /// Suppress messages about unreadable files.
    #[arg(short = 's', long = "no-messages")]
    pub no_messages: bool,
    /// Treat binary files as text.
    #[arg(short = 'a', long = "text")]
    pub text: bool,
    /// Only files whose name matches GLOB (as find -name).
    #[arg(long, value_name = "GLOB")]
    pub name: Option<OsString>,
    /// Entry type: f (regular file, the default), d (directory), l (symlink).
    /// d and l need --find (only files have contents).
    #[arg(long = "type", value_name = "f|d|l")]
    pub kind: Option<String>,
    /// Size: +N more than N, -N less than N, N exactly; bytes, or with a
    /// k/M/G/T suffix (powers of 1024).
    #[arg(long, value_name = "[+-]N", allow_hyphen_values = true)]
    pub size: Option<String>,
    /// Modified after TIME: a file (its mtime), or a date `date -d` reads
    /// ("2024-05-01", "yesterday", "@1714521600").
    #[arg(long, value_name = "TIME")]
    pub newer: Option<OsString>,
    /// With an xattr NAME, or NAME=VALUE (a comma-separated value such as
    /// user.xdg.tags=work,home also matches each item). Repeatable: all must hold.
    #[arg(long = "xattr", value_name = "NAME[=VALUE]")]
    pub xattr: Vec<String>,
    /// List the entries passing the filters, without reading contents
    /// (like find); no PATTERN.
    #[arg(long)]
    pub find: bool,
    /// At most N files (or, with --group-by, N groups).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// One JSON object per file (or group) per line.
    #[arg(long)]
    pub json: bool,
    /// One group per directory (dir) or owner (owner), ordered by its best
    /// hit, with its best --top hits (the index's relevance score).
    #[arg(long = "group-by", value_name = "dir|owner")]
    pub group_by: Option<String>,
    /// Hits shown per group.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub top: usize,
    /// Search this embedded store directly (PATHs are paths inside it).
    #[arg(long, value_name = "DIR", conflicts_with = "es")]
    pub store: Option<PathBuf>,
    /// Contents directory of a directly searched store [default: the
    /// store's sibling `data`, or chunks in the cluster with --es].
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Search this Elasticsearch cluster directly (with --index).
    #[arg(long = "es", value_name = "URL")]
    pub es: Option<String>,
    /// Index name prefix with --es (or when the mount's cluster is reached).
    #[arg(long, value_name = "NAME")]
    pub index: Option<String>,
    #[command(flatten)]
    pub auth: super::args::EsAuth,
    /// Accepted for older scripts: search never waits for the mount's
    /// pending indexing (files not indexed yet are read).
    #[arg(long, hide = true)]
    pub no_flush: bool,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
}

/// Run the command; returns the exit status.
pub fn run(a: SearchArgs) -> i32 {
    match options(a).and_then(|o| Ok(run::search(o)?)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("esfs search: {e}");
            2
        }
    }
}

/// The search the arguments ask for.
fn options(mut a: SearchArgs) -> Result<Options, CmdError> {
    let mut operands = std::mem::take(&mut a.args);
    let mut patterns = a.regexp.clone();
    if a.find && !patterns.is_empty() {
        return Err("--find lists entries: it takes no PATTERN".into());
    }
    if !a.find && patterns.is_empty() {
        if operands.is_empty() {
            return Err("no PATTERN (usage: esfs search [OPTIONS] PATTERN [PATH...])".into());
        }
        let p = operands.remove(0);
        patterns.push(
            p.into_string()
                .map_err(|p| format!("PATTERN {p:?} is not UTF-8"))?,
        );
    }
    let syntax = if a.fixed {
        Syntax::Fixed
    } else if a.extended {
        Syntax::Extended
    } else {
        Syntax::Basic
    };
    let kind = match a.kind.as_deref() {
        None | Some("f") => Kind::File,
        Some("d") => Kind::Dir,
        Some("l") => Kind::Symlink,
        Some(k) => return Err(format!("--type {k:?}: expected f, d or l").into()),
    };
    if kind != Kind::File && !a.find {
        return Err("--type d and l list entries: use them with --find".into());
    }
    let kind = (!a.find || a.kind.is_some()).then_some(kind);
    let group_by = match a.group_by.as_deref() {
        None => None,
        Some("dir") => Some(GroupBy::Dir),
        Some("owner") => Some(GroupBy::Owner),
        Some(_) => return Err("--group-by: expected dir or owner".into()),
    };
    if group_by.is_some() && a.find {
        return Err("--group-by groups content matches: not with --find".into());
    }
    let filters = Filters {
        kind,
        name: a.name.clone().map(|n| n.into_vec()),
        size: a.size.as_deref().map(SizeCmp::parse).transpose()?,
        newer_ns: a.newer.as_ref().map(|t| parse_time(t)).transpose()?,
        xattrs: a.xattr.clone(),
    };
    let names = if a.no_filename {
        Some(false)
    } else {
        a.with_filename.then_some(true)
    };
    Ok(Options {
        operands,
        find: a.find,
        patterns,
        syntax,
        matching: Matching {
            ignore_case: a.ignore_case,
            word: a.word,
            line: a.line,
            text: a.text,
        },
        filters,
        output: Output {
            files: a.files,
            count: a.count,
            line_number: a.line_number,
            quiet: a.quiet,
            no_messages: a.no_messages,
            names,
            limit: a.limit,
            json: a.json,
            group_by,
            top: a.top,
        },
        place: place(a),
    })
}

/// Where the operands are: in the store --store or --es names, else on
/// their mounts.
fn place(a: SearchArgs) -> Place {
    let es_config = move |url: &str, index: &str| {
        let mut c = EsConfig::new(url, index);
        a.auth.apply(&mut c);
        c
    };
    if let Some(dir) = &a.store {
        let data = a.data.clone().unwrap_or_else(|| default_data(dir));
        Place::Store {
            backend: Backend::Embedded(dir.clone()),
            data: Some(data),
        }
    } else if let Some(url) = &a.es {
        let index = a.index.clone().unwrap_or_else(|| "esfs".into());
        Place::Store {
            backend: Backend::Elasticsearch(es_config(url, &index)),
            data: a.data.clone(),
        }
    } else {
        // The mount's own index name, unless --index names another.
        let index = a.index.clone();
        Place::Mounts {
            es: Box::new(move |url, mount_index| {
                es_config(url, index.as_deref().unwrap_or(mount_index))
            }),
        }
    }
}

/// `--newer`: a file's mtime, else whatever `date -d` reads.
fn parse_time(t: &std::ffi::OsStr) -> Result<i64, String> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::metadata(t) {
        return Ok(m.mtime() * 1_000_000_000 + m.mtime_nsec());
    }
    let o = std::process::Command::new("date")
        .arg("-d")
        .arg(t)
        .arg("+%s%N")
        .output()
        .map_err(|e| format!("date: {e}"))?;
    let s = String::from_utf8_lossy(&o.stdout);
    match s.trim().parse::<i64>() {
        Ok(ns) if o.status.success() => Ok(ns),
        _ => Err(format!(
            "--newer {:?}: neither a file nor a date",
            t.to_string_lossy()
        )),
    }
}
