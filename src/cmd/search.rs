//! `esfs search PATTERN [PATH...]`: grep -r through the index.
//!
//! PATHs on an esfs mount are searched through the mount's store: the
//! command finds the mount in /proc/self/mountinfo, reads the reserved
//! xattr [`FLUSH_XATTR`](crate::hook::DESCRIBE_XATTR) of its root (which writes back
//! pending sizes and times, without waiting for the indexer, and says where
//! the store is), opens that store read-only beside the mount, asks it for the
//! candidate files and runs grep over them through the mount. PATHs
//! elsewhere are handed to `grep -r` as they are. With `--store DIR` or
//! `--es URL` it works on a store directly (PATHs are then paths inside
//! the filesystem, and contents come from the data store).
//!
//! Exit status as grep's: 0 something found, 1 nothing, 2 an error.

use super::CmdError;
use crate::data::DataStore;
use crate::model::{Entry, Kind, decode_bytes, encode_bytes};
use crate::open::{Backend, default_data, open_meta, open_stores};
use crate::search::grep::{FileResult, Grep, Mode, Status};
use crate::search::pattern::{self, Req, Syntax};
use crate::search::query::{self, Filters, SizeCmp};
use crate::store::{GroupRequest, Idx, MetaStore, Query, SearchRequest, Sort};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    crate::store::Caller::Command.set_for_thread();
    match Search::new(a).and_then(|mut s| s.run()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("esfs search: {e}");
            2
        }
    }
}

/// Where one PATH operand is searched.
struct Root {
    /// The operand as given (output paths start with it); empty for "no
    /// operand" (grep then prints paths relative to the current directory).
    display: Vec<u8>,
    /// Encoded in-filesystem path of the operand.
    tree: String,
}

/// A store searched for one or more operands.
struct Ctx {
    store: Arc<dyn MetaStore>,
    /// Direct mode: contents come from here (no mount holds the files).
    data: Option<Arc<dyn DataStore>>,
    /// Files open with unpersisted writes (from the mount).
    open: Vec<u64>,
}

/// One operand: handed to grep -r as it is, or searched in a store.
enum Op {
    Plain(OsString),
    Indexed(usize, Root),
    Failed(String),
}

/// One file or entry to report.
struct Item {
    entry: Entry,
    display: Vec<u8>,
}

struct Search {
    a: SearchArgs,
    filters: Filters,
    req: Req,
    grep: Grep,
    status: Status,
    /// Files (or entries) printed so far, for --limit.
    printed: usize,
    out: std::io::BufWriter<std::io::Stdout>,
}

impl Search {
    fn new(mut a: SearchArgs) -> Result<Search, CmdError> {
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
        a.args = operands;
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
        if a.group_by
            .as_deref()
            .is_some_and(|g| g != "dir" && g != "owner")
        {
            return Err("--group-by: expected dir or owner".into());
        }
        if a.group_by.is_some() && a.find {
            return Err("--group-by groups content matches: not with --find".into());
        }
        let filters = Filters {
            kind,
            name: a.name.clone().map(|n| n.into_vec()),
            size: a.size.as_deref().map(SizeCmp::parse).transpose()?,
            newer_ns: a.newer.as_ref().map(|t| parse_time(t)).transpose()?,
            xattrs: a.xattr.clone(),
        };
        let req = if a.find {
            Req::All
        } else {
            pattern::required(&patterns, syntax).for_index(a.ignore_case)
        };
        let mut match_flags = vec![];
        for (on, f) in [
            (a.ignore_case, "-i"),
            (a.word, "-w"),
            (a.line, "-x"),
            (a.fixed, "-F"),
            (a.extended && !a.fixed, "-E"),
            (a.no_messages, "-s"),
            (a.text, "-a"),
        ] {
            if on {
                match_flags.push(f);
            }
        }
        let mut output_flags = vec![];
        if a.files {
            output_flags.push("-l");
        } else if a.count {
            output_flags.push("-c");
        }
        if a.line_number {
            output_flags.push("-n");
        }
        Ok(Search {
            grep: Grep {
                match_flags,
                output_flags,
                patterns,
                with_names: true,
            },
            a,
            filters,
            req,
            status: Status::default(),
            printed: 0,
            out: std::io::BufWriter::new(std::io::stdout()),
        })
    }

    fn direct(&self) -> bool {
        self.a.store.is_some() || self.a.es.is_some()
    }

    fn run(&mut self) -> Result<i32, CmdError> {
        if !self.a.find && !self.grep.validate() {
            return Ok(2); // grep said why
        }
        let operands = self.a.args.clone();
        let (ctxs, ops) = if self.direct() {
            self.direct_ops(&operands)?
        } else {
            self.mount_ops(&operands)?
        };
        // grep names files when there are several operands or a directory.
        let names = match operands.as_slice() {
            [] => true,
            [one] => self.direct() || Path::new(one).is_dir(),
            _ => true,
        };
        self.grep.with_names = !self.a.no_filename && (self.a.with_filename || names);
        for op in ops {
            if self.a.limit.is_some_and(|l| self.printed >= l) && self.a.group_by.is_none() {
                break;
            }
            match op {
                Op::Failed(msg) => {
                    // grep's own words, so messages match `grep -r`'s too.
                    if !self.a.no_messages {
                        eprintln!("grep: {msg}");
                    }
                    self.status.error = true;
                }
                Op::Plain(p) => self.plain_grep(&p)?,
                Op::Indexed(i, root) => self.search_root(&ctxs[i], &root)?,
            }
        }
        self.out.flush()?;
        Ok(
            if self.status.error && !(self.a.quiet && self.status.found) {
                2
            } else if self.status.found {
                0
            } else {
                1
            },
        )
    }

    /// Operands found through their mounts.
    fn mount_ops(&self, operands: &[OsString]) -> Result<(Vec<Ctx>, Vec<Op>), CmdError> {
        let implicit = operands.is_empty();
        let operands: Vec<OsString> = if implicit {
            vec![".".into()]
        } else {
            operands.to_vec()
        };
        let mounts = esfs_mounts();
        let mut ctxs: Vec<Ctx> = Vec::new();
        let mut by_mount: HashMap<PathBuf, usize> = HashMap::new();
        let mut ops = Vec::new();
        for op in operands {
            let canon = match std::fs::canonicalize(&op) {
                Ok(c) => c,
                Err(e) => {
                    ops.push(Op::Failed(format!(
                        "{}: {}",
                        Path::new(&op).display(),
                        io_msg(&e)
                    )));
                    continue;
                }
            };
            let Some(mnt) = mounts
                .iter()
                .filter(|m| canon.starts_with(m))
                .max_by_key(|m| m.as_os_str().len())
            else {
                ops.push(Op::Plain(op));
                continue;
            };
            let i = match by_mount.get(mnt) {
                Some(&i) => i,
                None => {
                    let ctx = self.open_mount(mnt)?;
                    ctxs.push(ctx);
                    by_mount.insert(mnt.clone(), ctxs.len() - 1);
                    ctxs.len() - 1
                }
            };
            let rel = canon.strip_prefix(mnt).expect("under the mount");
            let mut tree = String::from("/");
            tree.push_str(&encode_bytes(rel.as_os_str().as_bytes()));
            let display = if implicit { Vec::new() } else { op.into_vec() };
            ops.push(Op::Indexed(i, Root { display, tree }));
        }
        Ok((ctxs, ops))
    }

    /// Ask the mount to flush its indexing and say where its store is, then open it.
    fn open_mount(&self, mnt: &Path) -> Result<Ctx, CmdError> {
        let raw = get_xattr(mnt, crate::hook::DESCRIBE_XATTR).map_err(|e| {
            format!(
                "{}: the mount does not answer {} ({e}); is it an older esfs?",
                mnt.display(),
                crate::hook::DESCRIBE_XATTR
            )
        })?;
        let v: Value = serde_json::from_slice(&raw)
            .map_err(|e| format!("{}: bad mount description: {e}", mnt.display()))?;
        let pending = v["pending"].as_u64().unwrap_or(0);
        if pending > 0 {
            log::debug!("{pending} changes still being indexed: those files are read");
        }
        let open: Vec<u64> = v["open"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let backend = Backend::from_description(&v["mount"], |url, index| {
            let index = self.a.index.as_deref().unwrap_or(index);
            self.es_config(url, index)
        })?;
        let (store, _) = open_meta(&backend, false)?;
        // The mount's writes become searchable at its next refresh: make
        // them visible now.
        store.refresh(Idx::Entries)?;
        Ok(Ctx {
            store,
            data: None,
            open,
        })
    }

    fn es_config(&self, url: &str, index: &str) -> crate::store::es::EsConfig {
        let mut c = crate::store::es::EsConfig::new(url, index);
        self.a.auth.apply(&mut c);
        c
    }

    /// Operands inside a store given with --store/--es.
    fn direct_ops(&self, operands: &[OsString]) -> Result<(Vec<Ctx>, Vec<Op>), CmdError> {
        let (backend, data) = if let Some(dir) = &self.a.store {
            let data = self.a.data.clone().unwrap_or_else(|| default_data(dir));
            (Backend::Embedded(dir.clone()), Some(data))
        } else {
            let url = self.a.es.as_deref().expect("direct mode");
            let index = self.a.index.clone().unwrap_or_else(|| "esfs".into());
            (
                Backend::Elasticsearch(self.es_config(url, &index)),
                self.a.data.clone(),
            )
        };
        let stores = open_stores(&backend, data.as_deref(), false)?;
        let ctx = Ctx {
            store: stores.meta,
            data: Some(stores.data),
            open: vec![],
        };
        let operands: Vec<OsString> = if operands.is_empty() {
            vec!["/".into()]
        } else {
            operands.to_vec()
        };
        let ops = operands
            .into_iter()
            .map(|op| {
                let b = op.as_bytes();
                if !b.starts_with(b"/") {
                    return Op::Failed(format!(
                        "{}: paths inside a store are absolute (/dir/...)",
                        op.to_string_lossy()
                    ));
                }
                let trimmed = match b.len() {
                    1 => b,
                    _ => b.strip_suffix(b"/").unwrap_or(b),
                };
                Op::Indexed(
                    0,
                    Root {
                        display: b.to_vec(),
                        tree: encode_bytes(trimmed),
                    },
                )
            })
            .collect();
        Ok((vec![ctx], ops))
    }

    /// An operand outside any esfs mount: plain `grep -r`.
    fn plain_grep(&mut self, op: &OsString) -> Result<(), CmdError> {
        let f = &self.filters;
        if f.name.is_some()
            || f.size.is_some()
            || f.newer_ns.is_some()
            || !f.xattrs.is_empty()
            || self.a.find
            || self.a.group_by.is_some()
            || self.a.json
            || self.a.limit.is_some()
        {
            eprintln!(
                "esfs search: {}: not on an esfs mount (only plain grep options work there)",
                Path::new(op).display()
            );
            self.status.error = true;
            return Ok(());
        }
        self.out.flush()?;
        let mut c = std::process::Command::new("grep");
        c.arg("-r").args(&self.grep.match_flags);
        if self.a.quiet {
            c.arg("-q");
        } else {
            c.args(&self.grep.output_flags);
            c.arg(if self.grep.with_names { "-H" } else { "-h" });
        }
        for p in &self.grep.patterns {
            c.arg("-e").arg(p);
        }
        c.arg("--").arg(op);
        let st = c.status().map_err(|e| format!("grep: {e}"))?;
        self.status.add(st.code());
        Ok(())
    }

    /// Every entry matching `q`, in path order (sources without text).
    fn list(store: &dyn MetaStore, q: &Query) -> Result<Vec<Entry>, CmdError> {
        const PAGE: usize = 2000;
        let mut out = Vec::new();
        let mut after: Option<Vec<Value>> = None;
        loop {
            let hits = store.search_brief(&SearchRequest {
                index: Idx::Entries,
                query: q.clone(),
                sort: vec![Sort::asc("path"), Sort::asc("cookie")],
                search_after: after.clone(),
                size: PAGE,
            })?;
            let n = hits.len();
            if let Some(last) = hits.last() {
                after = Some(last.sort.clone());
            }
            for h in hits {
                out.push(serde_json::from_value(h.doc.source)?);
            }
            if n < PAGE {
                return Ok(out);
            }
        }
    }

    /// The entries of `q` under `root` that pass every filter, with their output paths.
    fn items(&self, ctx: &Ctx, root: &Root, q: &Query) -> Result<Vec<Item>, CmdError> {
        let mut items = Vec::new();
        for entry in Self::list(&*ctx.store, q)? {
            let name = decode_bytes(&entry.name);
            if !query::name_matches(&self.filters, &name) {
                continue;
            }
            let display = display_path(root, &entry.path);
            if let Some(t) = self.filters.newer_ns
                && mtime_ns(ctx, &entry, &display) <= t
            {
                continue;
            }
            items.push(Item { entry, display });
        }
        Ok(items)
    }

    fn search_root(&mut self, ctx: &Ctx, root: &Root) -> Result<(), CmdError> {
        let scope = query::scope(&root.tree, &self.filters);
        if self.a.find {
            let items = self.items(ctx, root, &scope)?;
            for it in items {
                if self.a.limit.is_some_and(|l| self.printed >= l) {
                    break;
                }
                self.status.found = true;
                self.printed += 1;
                if self.a.quiet {
                    break;
                }
                if self.a.json {
                    let e = &it.entry;
                    let j = json!({"path": lossy(&it.display), "kind": e.kind.as_str(),
                        "size": e.size, "mtime": e.mtime, "uid": e.uid, "gid": e.gid,
                        "mode": format!("{:o}", e.mode)});
                    writeln!(self.out, "{j}")?;
                } else {
                    self.out.write_all(&it.display)?;
                    self.out.write_all(b"\n")?;
                }
            }
            return Ok(());
        }
        let text = query::text_query(&self.req);
        let cands_q = query::candidates(scope.clone(), text.clone(), &ctx.open);
        let cands = self.items(ctx, root, &cands_q)?;
        let left = self.a.limit.map(|l| l.saturating_sub(self.printed));
        if self.a.quiet {
            let (st, _) = self.verify(ctx, &cands, Mode::Files, Some(1))?;
            self.status.merge(st);
            return Ok(());
        }
        if let Some(by) = self.a.group_by.clone() {
            let (st, res) = self.verify(ctx, &cands, Mode::Counts, None)?;
            self.status.merge(st);
            return self.print_groups(ctx, root, &cands, res, text, &by);
        }
        if self.a.json {
            let mode = if self.a.files {
                Mode::Files
            } else if self.a.count {
                Mode::Counts
            } else {
                Mode::Lines
            };
            let (st, res) = self.verify(ctx, &cands, mode, left)?;
            self.status.merge(st);
            let res = in_order(&cands, res);
            for r in res {
                if mode == Mode::Counts && r.count == Some(0) {
                    continue;
                }
                let mut j = json!({"path": lossy(&r.path)});
                match mode {
                    Mode::Counts => j["count"] = json!(r.count.unwrap_or(0)),
                    Mode::Lines => {
                        if r.binary {
                            j["binary"] = json!(true);
                        }
                        j["lines"] = r
                            .lines
                            .iter()
                            .map(|(n, t)| json!({"line": n, "text": lossy(t)}))
                            .collect();
                    }
                    _ => {}
                }
                self.printed += 1;
                writeln!(self.out, "{j}")?;
            }
            return Ok(());
        }
        if self.a.count && !self.a.files {
            // grep -c prints every file, matching or not: the ones the index
            // ruled out have 0 without being read.
            let all = self.items(ctx, root, &scope)?;
            let (st, res) = self.verify(ctx, &cands, Mode::Counts, None)?;
            self.status.merge(st);
            let counts: HashMap<Vec<u8>, u64> = res
                .into_iter()
                .map(|r| (r.path, r.count.unwrap_or(0)))
                .collect();
            for it in all {
                if self.a.limit.is_some_and(|l| self.printed >= l) {
                    break;
                }
                let n = counts.get(&it.display).copied().unwrap_or(0);
                if self.grep.with_names {
                    self.out.write_all(&it.display)?;
                    write!(self.out, ":{n}")?;
                } else {
                    write!(self.out, "{n}")?;
                }
                self.out.write_all(b"\n")?;
                self.printed += 1;
            }
            return Ok(());
        }
        // grep's own output. With --limit, first find which files match.
        let files: Vec<&Item> = match left {
            Some(n) => {
                let (st, res) = self.verify(ctx, &cands, Mode::Files, Some(n))?;
                if st.error {
                    self.status.error = true;
                }
                let keep: std::collections::HashSet<Vec<u8>> =
                    res.into_iter().map(|r| r.path).collect();
                cands.iter().filter(|c| keep.contains(&c.display)).collect()
            }
            None => cands.iter().collect(),
        };
        let files: Vec<Item> = files
            .into_iter()
            .map(|i| Item {
                entry: i.entry.clone(),
                display: i.display.clone(),
            })
            .collect();
        self.printed += files.len();
        let (st, _) = self.verify(ctx, &files, Mode::Passthrough, None)?;
        self.status.merge(st);
        Ok(())
    }

    /// grep over the items: through the mount, or from the data store.
    fn verify(
        &mut self,
        ctx: &Ctx,
        items: &[Item],
        mode: Mode,
        stop_after: Option<usize>,
    ) -> Result<(Status, Vec<FileResult>), CmdError> {
        self.out.flush()?;
        let Some(data) = &ctx.data else {
            let files: Vec<Vec<u8>> = items.iter().map(|i| i.display.clone()).collect();
            return self
                .grep
                .run(&files, mode, stop_after)
                .map_err(|e| format!("grep: {e}").into());
        };
        let mut status = Status::default();
        let mut out = Vec::new();
        for it in items {
            if stop_after.is_some_and(|n| out.len() >= n) {
                break;
            }
            let contents = read_contents(&*ctx.store, &**data, it.entry.ino)
                .map_err(|e| format!("{}: {e}", lossy(&it.display)))?;
            let (st, res) = self
                .grep
                .run_stdin(&it.display, &contents, mode)
                .map_err(|e| format!("grep: {e}"))?;
            status.merge(st);
            out.extend(res);
        }
        Ok((status, out))
    }

    /// `--group-by`: the verified matches, grouped by the store (terms +
    /// top_hits on Elasticsearch, window functions on SQLite).
    fn print_groups(
        &mut self,
        ctx: &Ctx,
        root: &Root,
        cands: &[Item],
        res: Vec<FileResult>,
        text: Option<Query>,
        by: &str,
    ) -> Result<(), CmdError> {
        let counts: HashMap<Vec<u8>, u64> = res
            .into_iter()
            .filter(|r| r.count.unwrap_or(0) > 0)
            .map(|r| (r.path, r.count.unwrap_or(0)))
            .collect();
        let matched: Vec<&Item> = cands
            .iter()
            .filter(|c| counts.contains_key(&c.display))
            .collect();
        if matched.is_empty() {
            return Ok(());
        }
        let field = if by == "owner" { "uid" } else { "dir" };
        let by_path: HashMap<&str, &Item> = matched
            .iter()
            .map(|i| (i.entry.path.as_str(), *i))
            .collect();
        let buckets = ctx.store.group(&GroupRequest {
            index: Idx::Entries,
            query: Query::Terms {
                field: "path".into(),
                values: matched.iter().map(|i| json!(i.entry.path)).collect(),
            },
            score: text,
            field: field.into(),
            buckets: self.a.limit.unwrap_or(10_000).max(1),
            per_bucket: self.a.top.max(1),
        })?;
        for b in buckets {
            let label = match field {
                "uid" => {
                    let uid = b.key.as_u64().unwrap_or(u64::MAX);
                    match user_name(uid as u32) {
                        Some(n) => format!("{uid} ({n})"),
                        None => uid.to_string(),
                    }
                }
                _ => {
                    let dir = b.key.as_str().unwrap_or_default();
                    lossy(&display_dir(root, dir))
                }
            };
            let hits: Vec<(Vec<u8>, f64, u64)> = b
                .hits
                .iter()
                .filter_map(|(doc, score)| {
                    let p = doc.source["path"].as_str()?;
                    let it = by_path.get(p)?;
                    Some((it.display.clone(), *score, counts[&it.display]))
                })
                .collect();
            self.printed += 1;
            if self.a.json {
                let j = json!({
                    "group": label,
                    "key": b.key,
                    "files": b.doc_count,
                    "score": b.top_score,
                    "hits": hits.iter().map(|(p, s, c)| json!({"path": lossy(p), "score": s, "count": c})).collect::<Vec<_>>(),
                });
                writeln!(self.out, "{j}")?;
            } else {
                writeln!(
                    self.out,
                    "{label} ({} file{})",
                    b.doc_count,
                    if b.doc_count == 1 { "" } else { "s" }
                )?;
                for (p, _, c) in hits {
                    self.out.write_all(b"  ")?;
                    self.out.write_all(&p)?;
                    writeln!(self.out, ":{c}")?;
                }
            }
        }
        Ok(())
    }
}

/// Captured results in the order of the items (grep may report binary
/// matches after the lines of a batch).
fn in_order(items: &[Item], res: Vec<FileResult>) -> Vec<FileResult> {
    let pos: HashMap<&[u8], usize> = items
        .iter()
        .enumerate()
        .map(|(i, it)| (it.display.as_slice(), i))
        .collect();
    let mut res = res;
    res.sort_by_key(|r| pos.get(r.path.as_slice()).copied().unwrap_or(usize::MAX));
    res
}

/// The output path of the entry at (encoded) `path` under `root`.
fn display_path(root: &Root, path: &str) -> Vec<u8> {
    let f = decode_bytes(path);
    let r = decode_bytes(&root.tree);
    let rel: &[u8] = if f == r {
        return if root.display.is_empty() {
            b".".to_vec()
        } else {
            root.display.clone()
        };
    } else if r == b"/" {
        &f[1..]
    } else {
        f.get(r.len() + 1..).unwrap_or_default()
    };
    join(&root.display, rel)
}

fn join(prefix: &[u8], rel: &[u8]) -> Vec<u8> {
    let mut out = prefix.to_vec();
    if !out.is_empty() && !out.ends_with(b"/") {
        out.push(b'/');
    }
    out.extend_from_slice(rel);
    out
}

/// The output form of a directory (a group key) under `root`.
fn display_dir(root: &Root, dir: &str) -> Vec<u8> {
    let d = decode_bytes(dir);
    let r = decode_bytes(&root.tree);
    let under = d == r || r == b"/" || (d.starts_with(&r) && d.get(r.len()) == Some(&b'/'));
    if under {
        let p = display_path(root, dir);
        if p.is_empty() { b".".to_vec() } else { p }
    } else {
        // The operand is a file: its directory.
        let p = Path::new(std::ffi::OsStr::from_bytes(&root.display));
        let parent = p.parent().map(|p| p.as_os_str().as_bytes().to_vec());
        match parent {
            Some(p) if !p.is_empty() => p,
            _ => b".".to_vec(),
        }
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn io_msg(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "No such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "Permission denied".into(),
        _ => e.to_string(),
    }
}

/// The exact mtime of an entry: from the file (mount) or its inode (store).
fn mtime_ns(ctx: &Ctx, entry: &Entry, display: &[u8]) -> i64 {
    if ctx.data.is_none() {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::symlink_metadata(std::ffi::OsStr::from_bytes(display)) {
            return m.mtime() * 1_000_000_000 + m.mtime_nsec();
        }
    } else if let Ok(Some(doc)) = ctx
        .store
        .get(Idx::Inodes, &crate::model::inode_id(entry.ino))
        && let Some(ns) = doc.source["mtime_ns"].as_i64()
    {
        return ns;
    }
    entry.mtime * 1_000_000
}

/// A file's contents from the data store (direct mode).
fn read_contents(
    store: &dyn MetaStore,
    data: &dyn DataStore,
    ino: u64,
) -> Result<Vec<u8>, CmdError> {
    let doc = store
        .get(Idx::Inodes, &crate::model::inode_id(ino))?
        .ok_or("inode gone")?;
    let inode: crate::model::Inode = serde_json::from_value(doc.source)?;
    let mut buf = vec![0u8; inode.size as usize];
    if let Some(key) = &inode.content {
        data.read(key, 0, &mut buf)?;
    }
    Ok(buf)
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

/// Mountpoints of esfs mounts (from /proc/self/mountinfo).
fn esfs_mounts() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else {
        return vec![];
    };
    let mut out = Vec::new();
    for line in info.split(|&b| b == b'\n') {
        let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == b"-") else {
            continue;
        };
        if fields.get(sep + 1) == Some(&crate::daemon::FSTYPE.as_bytes())
            && let Some(p) = fields.get(4)
        {
            out.push(PathBuf::from(std::ffi::OsString::from_vec(unescape(p))));
        }
    }
    out
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') << 6 | (b[i + 2] - b'0') << 3 | (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn get_xattr(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let p = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let n = std::ffi::CString::new(name)?;
    loop {
        // SAFETY: valid C strings; a null buffer asks for the size.
        let size = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut buf = vec![0u8; size as usize + 1024];
        // SAFETY: the buffer is writable for its length.
        let got =
            unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
}

fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let _ = f.next();
        (f.next()?.parse::<u32>().ok()? == uid).then(|| name.to_string())
    })
}
