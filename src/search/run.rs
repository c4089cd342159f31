//! One search, from its options to its output and exit status: the
//! operands' stores are asked for the candidates, grep gives the exact
//! answer, and it is printed as asked (grep's own output, `--json`, `-c`,
//! `--group-by`, or `--find`'s list of entries).
//!
//! Exit status as grep's: 0 something found, 1 nothing, 2 an error.

use super::SearchError;
use super::grep::{FileResult, Grep, Mode, Status};
use super::operand::{
    self, EsConfigOf, Operand, Root, Target, display_dir, display_path, read_contents,
};
use super::output::{self, GroupHit, lossy};
use super::pattern::{self, Req, Syntax};
use super::query::{self, Filters};
use crate::model::{Entry, decode_bytes, entry_id};
use crate::open::Backend;
use crate::store::{GroupRequest, Idx, Query};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a search looks for, where, and how it prints what it finds.
pub(crate) struct Options {
    /// The PATHs; none means the current directory (or the store's root).
    pub operands: Vec<OsString>,
    /// List the entries passing the filters, without reading contents.
    pub find: bool,
    /// grep's patterns (any may match) and their syntax.
    pub patterns: Vec<String>,
    pub syntax: Syntax,
    pub matching: Matching,
    pub filters: Filters,
    pub output: Output,
    pub place: Place,
}

/// grep's flags that change which lines match.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Matching {
    /// -i
    pub ignore_case: bool,
    /// -w
    pub word: bool,
    /// -x
    pub line: bool,
    /// -a
    pub text: bool,
}

/// How the results are printed.
#[derive(Clone, Debug, Default)]
pub(crate) struct Output {
    /// -l: only the names of files with matches.
    pub files: bool,
    /// -c: the number of matching lines per file.
    pub count: bool,
    /// -n
    pub line_number: bool,
    /// -q: nothing; the exit status only.
    pub quiet: bool,
    /// -s: no messages about unreadable files.
    pub no_messages: bool,
    /// Print file names (-H: Some(true); -h: Some(false)); by default when
    /// there are several operands or a directory, as grep does.
    pub names: Option<bool>,
    /// At most this many files (or groups).
    pub limit: Option<usize>,
    /// One JSON object per file (or group, or entry) per line.
    pub json: bool,
    pub group_by: Option<GroupBy>,
    /// Hits shown per group.
    pub top: usize,
}

/// What `--group-by` groups by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GroupBy {
    Dir,
    Owner,
}

/// Where the operands are.
pub(crate) enum Place {
    /// Paths on the esfs mounts they are on (plain `grep -r` elsewhere);
    /// `es` configures an Elasticsearch mount's cluster from its URL and
    /// index name.
    Mounts { es: Box<EsConfigOf> },
    /// Paths inside this store, with its contents in `data`.
    Store {
        backend: Backend,
        data: Option<PathBuf>,
    },
}

/// Runs the search; returns grep's exit status.
pub(crate) fn search(o: Options) -> Result<i32, SearchError> {
    Search::new(o).run()
}

/// One file or entry to report.
#[derive(Clone)]
struct Item {
    entry: Entry,
    display: Vec<u8>,
}

struct Search {
    o: Options,
    req: Req,
    grep: Grep,
    status: Status,
    /// Files (or entries) printed so far, for --limit.
    printed: usize,
    out: std::io::BufWriter<std::io::Stdout>,
}

impl Search {
    fn new(o: Options) -> Search {
        let req = if o.find {
            Req::All
        } else {
            pattern::required(&o.patterns, o.syntax).for_index(o.matching.ignore_case)
        };
        let grep = grep_of(&o);
        Search {
            o,
            req,
            grep,
            status: Status::default(),
            printed: 0,
            out: std::io::BufWriter::new(std::io::stdout()),
        }
    }

    fn direct(&self) -> bool {
        matches!(self.o.place, Place::Store { .. })
    }

    fn limit_reached(&self) -> bool {
        self.o.output.limit.is_some_and(|l| self.printed >= l)
    }

    fn run(&mut self) -> Result<i32, SearchError> {
        if !self.o.find && !self.grep.validate() {
            return Ok(2); // grep said why
        }
        let operands = self.o.operands.clone();
        let (targets, ops) = match &self.o.place {
            Place::Store { backend, data } => {
                operand::in_store(backend, data.as_deref(), &operands)?
            }
            Place::Mounts { es } => operand::on_mounts(&operands, es.as_ref())?,
        };
        // grep names files when there are several operands or a directory.
        let names = match operands.as_slice() {
            [] => true,
            [one] => self.direct() || Path::new(one).is_dir(),
            _ => true,
        };
        self.grep.with_names = self.o.output.names.unwrap_or(names);
        for op in ops {
            if self.limit_reached() && self.o.output.group_by.is_none() {
                break;
            }
            match op {
                Operand::Failed(msg) => {
                    // grep's own words, so messages match `grep -r`'s too.
                    if !self.o.output.no_messages {
                        eprintln!("grep: {msg}");
                    }
                    self.status.error = true;
                }
                Operand::Plain(p) => self.plain_grep(&p)?,
                Operand::Indexed(i, root) => self.search_root(&targets[i], &root)?,
            }
        }
        self.out.flush()?;
        Ok(
            if self.status.error && !(self.o.output.quiet && self.status.found) {
                2
            } else if self.status.found {
                0
            } else {
                1
            },
        )
    }

    /// An operand outside any esfs mount: plain `grep -r`.
    fn plain_grep(&mut self, op: &OsString) -> Result<(), SearchError> {
        let f = &self.o.filters;
        let out = &self.o.output;
        if f.name.is_some()
            || f.size.is_some()
            || f.newer_ns.is_some()
            || !f.xattrs.is_empty()
            || self.o.find
            || out.group_by.is_some()
            || out.json
            || out.limit.is_some()
        {
            eprintln!(
                "esfs search: {}: not on an esfs mount (only plain grep options work there)",
                Path::new(op).display()
            );
            self.status.error = true;
            return Ok(());
        }
        self.out.flush()?;
        let code = self
            .grep
            .recursive(op, out.quiet)
            .map_err(|e| format!("grep: {e}"))?;
        self.status.add(code);
        Ok(())
    }

    /// The entries of `q` under `root` that pass every filter, with their output paths.
    fn items(&self, t: &Target, root: &Root, q: &Query) -> Result<Vec<Item>, SearchError> {
        let mut items = Vec::new();
        for entry in t.list(q)? {
            let name = decode_bytes(&entry.name);
            if !query::name_matches(&self.o.filters, &name) {
                continue;
            }
            let display = display_path(root, &entry.path);
            if let Some(ns) = self.o.filters.newer_ns
                && t.mtime_ns(&entry, &display) <= ns
            {
                continue;
            }
            items.push(Item { entry, display });
        }
        Ok(items)
    }

    fn search_root(&mut self, t: &Target, root: &Root) -> Result<(), SearchError> {
        let scope = query::scope(&root.tree, &self.o.filters);
        if self.o.find {
            let items = self.items(t, root, &scope)?;
            return self.print_entries(items);
        }
        let text = query::text_query(&self.req);
        let cands = match &text {
            Some(q) => self.text_candidates(t, root, &scope, q)?,
            None => self.items(t, root, &scope)?,
        };
        let out = &self.o.output;
        if out.quiet {
            let (st, _) = self.verify(t, &cands, Mode::Files, Some(1))?;
            self.status.merge(st);
            Ok(())
        } else if let Some(by) = out.group_by {
            let (st, res) = self.verify(t, &cands, Mode::Counts, None)?;
            self.status.merge(st);
            self.print_groups(t, root, &cands, res, text, by)
        } else if out.json {
            self.print_json(t, &cands)
        } else if out.count && !out.files {
            // grep -c prints every file, matching or not: the ones the index
            // ruled out have 0 without being read.
            let all = self.items(t, root, &scope)?;
            self.print_counts(t, &cands, all)
        } else {
            self.print_grep(t, &cands)
        }
    }

    /// The candidates of a search whose text part is `text`: the files in
    /// `scope` whose indexed text it matches, the files not indexed, and the
    /// open ones. The texts are read before the entries, so a file the
    /// indexer finishes in between (its entry then says "indexed", its text
    /// was not there yet) is in neither read: the texts are read again once
    /// the entries are listed, and the files that read newly matches are
    /// listed too. (The indexer makes a text searchable before the entries
    /// that point at it, so an entry listed as indexed has its text in the
    /// second read.) At a million files the listing takes seconds while the
    /// indexer runs: the likely loss of 1-8 of 1000 files seen there.
    fn text_candidates(
        &self,
        t: &Target,
        root: &Root,
        scope: &Query,
        text: &Query,
    ) -> Result<Vec<Item>, SearchError> {
        let matched = super::text_inos(&*t.store, text)?;
        let q = query::candidates(scope.clone(), Some(&matched), &t.open);
        let mut cands = self.items(t, root, &q)?;
        let before: HashSet<u64> = matched.into_iter().collect();
        let late: Vec<u64> = super::text_inos(&*t.store, text)?
            .into_iter()
            .filter(|i| !before.contains(i))
            .collect();
        if late.is_empty() {
            return Ok(cands);
        }
        let listed: HashSet<(u64, String)> = cands
            .iter()
            .map(|c| (c.entry.parent, c.entry.name.clone()))
            .collect();
        for it in self.items(t, root, &query::of_inos(scope.clone(), &late))? {
            if !listed.contains(&(it.entry.parent, it.entry.name.clone())) {
                cands.push(it);
            }
        }
        // In the listing's order (path, then cookie), as grep -r reads them.
        cands.sort_by(|a, b| {
            (a.entry.path.as_str(), a.entry.cookie).cmp(&(b.entry.path.as_str(), b.entry.cookie))
        });
        Ok(cands)
    }

    /// `--find`: the entries themselves.
    fn print_entries(&mut self, items: Vec<Item>) -> Result<(), SearchError> {
        for it in items {
            if self.limit_reached() {
                break;
            }
            self.status.found = true;
            self.printed += 1;
            if self.o.output.quiet {
                break;
            }
            if self.o.output.json {
                writeln!(self.out, "{}", output::entry_json(&it.display, &it.entry))?;
            } else {
                self.out.write_all(&it.display)?;
                self.out.write_all(b"\n")?;
            }
        }
        Ok(())
    }

    /// `--json`: a JSON line per matching file.
    fn print_json(&mut self, t: &Target, cands: &[Item]) -> Result<(), SearchError> {
        let left = self.left();
        let out = &self.o.output;
        let mode = if out.files {
            Mode::Files
        } else if out.count {
            Mode::Counts
        } else {
            Mode::Lines
        };
        let (st, res) = self.verify(t, cands, mode, left)?;
        self.status.merge(st);
        for r in in_order(cands, res) {
            let Some(j) = output::file_json(&r, mode) else {
                continue;
            };
            self.printed += 1;
            writeln!(self.out, "{j}")?;
        }
        Ok(())
    }

    /// `-c`: a count for every file in scope (`all`); only the candidates are read.
    fn print_counts(
        &mut self,
        t: &Target,
        cands: &[Item],
        all: Vec<Item>,
    ) -> Result<(), SearchError> {
        let (st, res) = self.verify(t, cands, Mode::Counts, None)?;
        self.status.merge(st);
        let counts: HashMap<Vec<u8>, u64> = res
            .into_iter()
            .map(|r| (r.path, r.count.unwrap_or(0)))
            .collect();
        for it in all {
            if self.limit_reached() {
                break;
            }
            let n = counts.get(&it.display).copied().unwrap_or(0);
            output::write_count(&mut self.out, &it.display, n, self.grep.with_names)?;
            self.printed += 1;
        }
        Ok(())
    }

    /// grep's own output. With --limit, first find which files match.
    fn print_grep(&mut self, t: &Target, cands: &[Item]) -> Result<(), SearchError> {
        let files: Vec<Item> = match self.left() {
            Some(n) => {
                let (st, res) = self.verify(t, cands, Mode::Files, Some(n))?;
                if st.error {
                    self.status.error = true;
                }
                let keep: HashSet<Vec<u8>> = res.into_iter().map(|r| r.path).collect();
                cands
                    .iter()
                    .filter(|c| keep.contains(&c.display))
                    .cloned()
                    .collect()
            }
            None => cands.to_vec(),
        };
        self.printed += files.len();
        let (st, _) = self.verify(t, &files, Mode::Passthrough, None)?;
        self.status.merge(st);
        Ok(())
    }

    /// How many more files --limit lets through.
    fn left(&self) -> Option<usize> {
        self.o.output.limit.map(|l| l.saturating_sub(self.printed))
    }

    /// grep over the items: through the mount, or from the data store.
    fn verify(
        &mut self,
        t: &Target,
        items: &[Item],
        mode: Mode,
        stop_after: Option<usize>,
    ) -> Result<(Status, Vec<FileResult>), SearchError> {
        self.out.flush()?;
        let Some(data) = &t.data else {
            let files: Vec<Vec<u8>> = items.iter().map(|i| i.display.clone()).collect();
            let Some(root) = &t.read_ahead else {
                return self
                    .grep
                    .run(&files, mode, stop_after)
                    .map_err(|e| format!("grep: {e}").into());
            };
            let mut hints = ReadAhead::new(root);
            return self
                .grep
                .run_announced(&files, mode, stop_after, READ_AHEAD_FILES, &mut |r| {
                    hints.announce(&items[r])
                })
                .map_err(|e| format!("grep: {e}").into());
        };
        let mut status = Status::default();
        let mut out = Vec::new();
        for it in items {
            if stop_after.is_some_and(|n| out.len() >= n) {
                break;
            }
            let contents = read_contents(&*t.store, &**data, it.entry.ino)
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

    /// `--group-by`: the verified matches in groups (by directory or owner),
    /// each ordered by its best file's score, its files by theirs. The
    /// scores are the text part's relevance in `texts`, one bucket per
    /// inode (terms + top_hits on Elasticsearch, window functions on
    /// SQLite); files without indexed text score 0.
    fn print_groups(
        &mut self,
        t: &Target,
        root: &Root,
        cands: &[Item],
        res: Vec<FileResult>,
        text: Option<Query>,
        by: GroupBy,
    ) -> Result<(), SearchError> {
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
        let scores = match text {
            Some(q) => text_scores(t, &matched, q)?,
            None => HashMap::new(),
        };
        let groups = groups_of(&matched, &scores, by);
        let limit = self.o.output.limit.unwrap_or(10_000).max(1);
        for (key, files) in groups.into_iter().take(limit) {
            let label = match by {
                GroupBy::Owner => output::owner_label(key.as_u64().unwrap_or(u64::MAX)),
                GroupBy::Dir => lossy(&display_dir(root, key.as_str().unwrap_or_default())),
            };
            let head = output::GroupHead {
                label: &label,
                key: &key,
                files: files.len() as u64,
                score: files.first().map_or(0.0, |f| f.1),
            };
            let hits: Vec<GroupHit> = files
                .iter()
                .take(self.o.output.top.max(1))
                .map(|(it, score)| (it.display.clone(), *score, counts[&it.display]))
                .collect();
            self.printed += 1;
            if self.o.output.json {
                writeln!(self.out, "{}", output::group_json(&head, &hits))?;
            } else {
                output::write_group(&mut self.out, &head, &hits)?;
            }
        }
        Ok(())
    }
}

/// Files per grep batch on a mount that takes read-ahead hints: as many
/// as one hint may name (`Fs::read_ahead`).
const READ_AHEAD_FILES: usize = 128;
/// A hint's value at most: Linux caps an xattr value at 64 KiB.
const READ_AHEAD_BYTES: usize = 60 << 10;

/// Tells a mount which files grep reads next (see
/// [`crate::hook::READ_AHEAD_XATTR`]), so it reads their metadata and
/// small contents in one request instead of a few per file. Only a hint:
/// once the mount refuses one (no write permission on its root, an older
/// esfs), the rest of the search reads without.
struct ReadAhead<'a> {
    root: &'a Path,
    on: bool,
}

impl<'a> ReadAhead<'a> {
    fn new(root: &'a Path) -> Self {
        ReadAhead { root, on: true }
    }

    fn announce(&mut self, items: &[Item]) {
        let mut value = Vec::new();
        for it in items {
            let e = &it.entry;
            let item = json!([entry_id(e.parent, &decode_bytes(&e.name)), e.ino, e.size]);
            let item = item.to_string();
            if !value.is_empty() && value.len() + item.len() + 2 > READ_AHEAD_BYTES {
                self.send(&mut value);
            }
            value.push(if value.is_empty() { b'[' } else { b',' });
            value.extend_from_slice(item.as_bytes());
        }
        self.send(&mut value);
    }

    fn send(&mut self, value: &mut Vec<u8>) {
        if value.is_empty() || !self.on {
            value.clear();
            return;
        }
        value.push(b']');
        if let Err(e) = operand::set_xattr(self.root, crate::hook::READ_AHEAD_XATTR, value) {
            log::debug!("{}: no read-ahead ({e})", self.root.display());
            self.on = false;
        }
        value.clear();
    }
}

/// The relevance of `text` for each of `items`' inodes that has indexed
/// text: a request per 10 000 inodes (a bucket each; Elasticsearch's
/// `search.max_buckets` is 65 536).
fn text_scores(t: &Target, items: &[&Item], text: Query) -> Result<HashMap<u64, f64>, SearchError> {
    let inos: Vec<u64> = items
        .iter()
        .map(|i| i.entry.ino)
        .collect::<HashSet<u64>>()
        .into_iter()
        .collect();
    let mut scores = HashMap::new();
    for chunk in inos.chunks(10_000) {
        let buckets = t.store.group(&GroupRequest {
            index: Idx::Texts,
            query: Query::Terms {
                field: "ino".into(),
                values: chunk.iter().map(|&i| json!(i)).collect(),
            },
            score: Some(text.clone()),
            field: "ino".into(),
            buckets: chunk.len(),
            per_bucket: 1,
        })?;
        scores.extend(
            buckets
                .into_iter()
                .filter_map(|b| Some((b.key.as_u64()?, b.top_score))),
        );
    }
    Ok(scores)
}

/// A group's key (a directory or an owner) and its files with their scores.
type Group<'a> = (serde_json::Value, Vec<(&'a Item, f64)>);

/// `items` in groups by `by`, each group's files by score (then path), the
/// groups by their best score (then key), as the guide's field collapsing
/// orders them.
fn groups_of<'a>(items: &[&'a Item], scores: &HashMap<u64, f64>, by: GroupBy) -> Vec<Group<'a>> {
    let mut groups: HashMap<String, Group> = HashMap::new();
    for it in items {
        let key = match by {
            GroupBy::Owner => json!(it.entry.uid),
            GroupBy::Dir => json!(it.entry.dir),
        };
        let score = scores.get(&it.entry.ino).copied().unwrap_or(0.0);
        groups
            .entry(key.to_string())
            .or_insert_with(|| (key, Vec::new()))
            .1
            .push((*it, score));
    }
    let by_score = |a: f64, b: f64| b.total_cmp(&a);
    let mut out: Vec<_> = groups.into_values().collect();
    for (_, files) in &mut out {
        files.sort_by(|a, b| by_score(a.1, b.1).then_with(|| a.0.entry.path.cmp(&b.0.entry.path)));
    }
    out.sort_by(|a, b| {
        by_score(a.1[0].1, b.1[0].1).then_with(|| key_order(&a.0).cmp(&key_order(&b.0)))
    });
    out
}

/// A group key's order: owners by number, directories by path.
fn key_order(k: &serde_json::Value) -> (u64, String) {
    (
        k.as_u64().unwrap_or(0),
        k.as_str().unwrap_or_default().to_string(),
    )
}

/// The grep invocation of a search: the user's matching and output flags.
fn grep_of(o: &Options) -> Grep {
    let m = o.matching;
    let mut match_flags = vec![];
    for (on, f) in [
        (m.ignore_case, "-i"),
        (m.word, "-w"),
        (m.line, "-x"),
        (o.syntax == Syntax::Fixed, "-F"),
        (o.syntax == Syntax::Extended, "-E"),
        (o.output.no_messages, "-s"),
        (m.text, "-a"),
    ] {
        if on {
            match_flags.push(f);
        }
    }
    let mut output_flags = vec![];
    if o.output.files {
        output_flags.push("-l");
    } else if o.output.count {
        output_flags.push("-c");
    }
    if o.output.line_number {
        output_flags.push("-n");
    }
    Grep {
        match_flags,
        output_flags,
        patterns: o.patterns.clone(),
        with_names: true,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FileText, INDEXED_TEXT, Kind, text_id};
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{BulkItemResult, BulkOp, Capabilities, Doc, Hit, MetaStore, SearchRequest};
    use crate::store::{StoreResult, Version};
    use parking_lot::Mutex;
    use std::sync::Arc;

    /// An embedded store whose first listing of entries is preceded by
    /// `before_listing`: the indexer finishing a file between a search's
    /// read of the texts and its listing of the entries.
    struct IndexedMeanwhile {
        inner: EmbeddedStore,
        before_listing: Mutex<Option<Vec<BulkOp>>>,
    }

    impl MetaStore for IndexedMeanwhile {
        fn capabilities(&self) -> Capabilities {
            self.inner.capabilities()
        }
        fn get(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
            self.inner.get(index, id)
        }
        fn mget(&self, index: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>> {
            self.inner.mget(index, ids)
        }
        fn bulk(&self, ops: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>> {
            self.inner.bulk(ops)
        }
        fn search(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>> {
            if req.index == Idx::Entries
                && let Some(ops) = self.before_listing.lock().take()
            {
                for r in self.inner.bulk(ops)? {
                    r?;
                }
            }
            self.inner.search(req)
        }
        fn count(&self, index: Idx, query: &Query) -> StoreResult<u64> {
            self.inner.count(index, query)
        }
        fn refresh(&self, index: Idx) -> StoreResult<()> {
            self.inner.refresh(index)
        }
        fn sync(&self) -> StoreResult<()> {
            self.inner.sync()
        }
        fn describe(&self) -> String {
            self.inner.describe()
        }
    }

    fn entry(ino: u64, name: &str, text_state: Option<&str>) -> Entry {
        Entry {
            parent: 1,
            name: name.into(),
            path: format!("/{name}"),
            dir: "/".into(),
            ino,
            kind: Kind::File,
            cookie: ino,
            size: 5,
            mtime: 0,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            text_state: text_state.map(str::to_string),
            text_mtime_ns: text_state.map(|_| 0),
            xattrs: vec![],
        }
    }

    fn put(index: Idx, id: String, source: impl serde::Serialize, v: Option<Version>) -> BulkOp {
        BulkOp::Index {
            index,
            id,
            source: serde_json::to_value(source).unwrap(),
            if_version: v,
        }
    }

    fn text(ino: u64, contents: &str) -> BulkOp {
        let t = FileText {
            ino,
            contents: contents.into(),
            mtime_ns: 0,
        };
        put(Idx::Texts, text_id(ino), t, None)
    }

    fn options() -> Options {
        Options {
            operands: vec![],
            find: false,
            patterns: vec!["needle".into()],
            syntax: Syntax::Fixed,
            matching: Matching::default(),
            filters: Filters::default(),
            output: Output::default(),
            place: Place::Mounts {
                es: Box::new(|_, _| unreachable!("no cluster here")),
            },
        }
    }

    #[test]
    fn a_file_indexed_between_the_texts_and_the_entries_is_a_candidate() {
        let dir = tempfile::tempdir().unwrap();
        let inner = EmbeddedStore::open(dir.path()).unwrap();
        let id = |e: &Entry| entry_id(e.parent, e.name.as_bytes());
        let (late, other) = (
            entry(10, "late", None),
            entry(11, "other", Some(INDEXED_TEXT)),
        );
        let mut ops = vec![text(11, "no match in here")];
        ops.push(put(Idx::Entries, id(&late), &late, None));
        ops.push(put(Idx::Entries, id(&other), &other, None));
        for r in inner.bulk(ops).unwrap() {
            r.unwrap();
        }
        let version = inner
            .get(Idx::Entries, &id(&late))
            .unwrap()
            .unwrap()
            .version;
        // What the indexer does for `late`: its text, then its entry's claim.
        let mut claimed = late.clone();
        claimed.text_state = Some(INDEXED_TEXT.into());
        claimed.text_mtime_ns = Some(0);
        let meanwhile = vec![
            text(10, "the needle is here"),
            put(Idx::Entries, id(&late), &claimed, Some(version)),
        ];
        let store = IndexedMeanwhile {
            inner,
            before_listing: Mutex::new(Some(meanwhile)),
        };
        let t = Target {
            store: Arc::new(store),
            data: None,
            open: vec![],
            read_ahead: None,
        };
        let root = Root {
            display: b"/mnt".to_vec(),
            tree: "/".into(),
        };
        let s = Search::new(options());
        let scope = query::scope("/", &s.o.filters);
        let q = query::text_query(&s.req).unwrap();
        let cands = s.text_candidates(&t, &root, &scope, &q).unwrap();
        let paths: Vec<&str> = cands.iter().map(|c| c.entry.path.as_str()).collect();
        assert_eq!(paths, ["/late"], "the file indexed meanwhile is scanned");
    }
}
