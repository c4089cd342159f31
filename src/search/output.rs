//! What a search prints beyond grep's own output: `--json` lines for
//! entries, files and groups, the text form of a group, `-c` count lines.

use super::grep::{FileResult, Mode};
use crate::model::Entry;
use serde_json::{Value, json};
use std::io::Write;

/// `--find --json`: one entry.
pub(crate) fn entry_json(display: &[u8], e: &Entry) -> Value {
    json!({"path": lossy(display), "kind": e.kind.as_str(),
        "size": e.size, "mtime": e.mtime, "uid": e.uid, "gid": e.gid,
        "mode": format!("{:o}", e.mode)})
}

/// `--json`: one file's result in `mode` (None: a file without matches,
/// which `-c` alone lists).
pub(crate) fn file_json(r: &FileResult, mode: Mode) -> Option<Value> {
    if mode == Mode::Counts && r.count == Some(0) {
        return None;
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
    Some(j)
}

/// `-c`: one file's count line, `NAME:N` or `N`.
pub(crate) fn write_count(
    out: &mut impl Write,
    display: &[u8],
    n: u64,
    with_names: bool,
) -> std::io::Result<()> {
    if with_names {
        out.write_all(display)?;
        write!(out, ":{n}")?;
    } else {
        write!(out, "{n}")?;
    }
    out.write_all(b"\n")
}

/// One hit of a group: its output path, score and number of matching lines.
pub(crate) type GroupHit = (Vec<u8>, f64, u64);

/// A group of `--group-by`: its label, key, number of matching files and
/// best score.
pub(crate) struct GroupHead<'a> {
    pub label: &'a str,
    pub key: &'a Value,
    pub files: u64,
    pub score: f64,
}

/// `--group-by --json`: one group.
pub(crate) fn group_json(g: &GroupHead, hits: &[GroupHit]) -> Value {
    json!({
        "group": g.label,
        "key": g.key,
        "files": g.files,
        "score": g.score,
        "hits": hits.iter().map(|(p, s, c)| json!({"path": lossy(p), "score": s, "count": c})).collect::<Vec<_>>(),
    })
}

/// `--group-by`: one group as text, its label and file count, then its
/// hits indented, `PATH:COUNT`.
pub(crate) fn write_group(
    out: &mut impl Write,
    g: &GroupHead,
    hits: &[GroupHit],
) -> std::io::Result<()> {
    writeln!(
        out,
        "{} ({} file{})",
        g.label,
        g.files,
        if g.files == 1 { "" } else { "s" }
    )?;
    for (p, _, c) in hits {
        out.write_all(b"  ")?;
        out.write_all(p)?;
        writeln!(out, ":{c}")?;
    }
    Ok(())
}

/// A group's owner label: the uid, and its user name when /etc/passwd has one.
pub(crate) fn owner_label(uid: u64) -> String {
    match user_name(uid as u32) {
        Some(n) => format!("{uid} ({n})"),
        None => uid.to_string(),
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

pub(crate) fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
