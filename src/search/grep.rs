//! The exact answer: the real `grep` over the candidate files.
//!
//! Why the real binary rather than a Rust reimplementation: the result must
//! equal `grep -r`'s, and grep's semantics have many corners (POSIX BRE/ERE
//! with GNU extensions, `-w`'s retry rule, locale-dependent case folding,
//! binary-file detection and messages, encoding errors). Running grep itself
//! on the candidates, with the user's flags, makes every matched line and
//! every message grep's own; the index only decides which files it reads.
//! Candidates are passed in batches (like `xargs`), in path order.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Stdio};

/// What grep is asked to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// grep's own output, straight to our stdout (plain `-n`, `-c`, `-l`,
    /// or the lines): the user's output flags are passed as given.
    Passthrough,
    /// Matching file names (`-l -Z`), captured.
    Files,
    /// Counts per file (`-c -Z`), captured.
    Counts,
    /// Matching lines with numbers (`-n -Z`), captured; binary files that
    /// match are reported (from grep's message) without lines.
    Lines,
}

/// grep's verdict over everything run so far, as its exit status would be.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Status {
    pub found: bool,
    pub error: bool,
}

impl Status {
    pub(crate) fn add(&mut self, code: Option<i32>) {
        match code {
            Some(0) => self.found = true,
            Some(1) => {}
            _ => self.error = true,
        }
    }
    pub(crate) fn merge(&mut self, o: Status) {
        self.found |= o.found;
        self.error |= o.error;
    }
}

/// One file's captured result.
#[derive(Clone, Debug, Default)]
pub(crate) struct FileResult {
    pub path: Vec<u8>,
    pub count: Option<u64>,
    /// (line number, text without the newline).
    pub lines: Vec<(u64, Vec<u8>)>,
    /// grep said "binary file matches" (no lines printed).
    pub binary: bool,
}

/// The grep invocation: matching flags and patterns.
#[derive(Clone, Debug)]
pub(crate) struct Grep {
    /// Flags that change what matches: -i -w -x and -E/-F/-G, -s, -a.
    pub match_flags: Vec<&'static str>,
    /// Output flags of the user's command, for [`Mode::Passthrough`].
    pub output_flags: Vec<&'static str>,
    pub patterns: Vec<String>,
    /// Whether to prefix file names (-H) or not (-h).
    pub with_names: bool,
}

/// Batches stay well below ARG_MAX.
const BATCH_FILES: usize = 1000;
const BATCH_BYTES: usize = 96 * 1024;

impl Grep {
    fn command(&self, mode: Mode) -> Command {
        let mut c = Command::new("grep");
        c.args(&self.match_flags);
        match mode {
            Mode::Passthrough => {
                c.args(&self.output_flags);
                c.arg(if self.with_names { "-H" } else { "-h" });
            }
            Mode::Files => {
                c.args(["-l", "-Z"]);
            }
            Mode::Counts => {
                c.args(["-c", "-Z", "-H"]);
            }
            Mode::Lines => {
                c.args(["-n", "-Z", "-H"]);
                // Parsed below: grep's own words, not a translation.
                c.env("LC_MESSAGES", "C");
            }
        }
        for p in &self.patterns {
            c.arg("-e").arg(p);
        }
        c.arg("--");
        c
    }

    /// `grep -r` over `path` (a PATH off any esfs mount), printing straight
    /// to our stdout; its exit code.
    pub(crate) fn recursive(&self, path: &OsStr, quiet: bool) -> std::io::Result<Option<i32>> {
        let mut c = Command::new("grep");
        c.arg("-r").args(&self.match_flags);
        if quiet {
            c.arg("-q");
        } else {
            c.args(&self.output_flags);
            c.arg(if self.with_names { "-H" } else { "-h" });
        }
        for p in &self.patterns {
            c.arg("-e").arg(p);
        }
        c.arg("--").arg(path);
        Ok(c.status()?.code())
    }

    /// Whether grep accepts the pattern (it prints its own error if not).
    pub(crate) fn validate(&self) -> bool {
        let mut c = self.command(Mode::Files);
        c.arg("/dev/null")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        matches!(c.status().map(|s| s.code()), Ok(Some(0 | 1)))
    }

    /// Run over `files` (in order, in batches). Captured modes return the
    /// per-file results; `stop_after` ends early once that many files matched.
    pub(crate) fn run(
        &self,
        files: &[Vec<u8>],
        mode: Mode,
        stop_after: Option<usize>,
    ) -> std::io::Result<(Status, Vec<FileResult>)> {
        self.run_announced(files, mode, stop_after, BATCH_FILES, &mut |_| {})
    }

    /// [`Grep::run`] in batches of at most `batch_files`, calling `announce`
    /// with each batch's range of `files` before grep reads it.
    pub(crate) fn run_announced(
        &self,
        files: &[Vec<u8>],
        mode: Mode,
        stop_after: Option<usize>,
        batch_files: usize,
        announce: &mut dyn FnMut(std::ops::Range<usize>),
    ) -> std::io::Result<(Status, Vec<FileResult>)> {
        let mut status = Status::default();
        let mut out = Vec::new();
        let mut i = 0;
        let batch_files = batch_files.clamp(1, BATCH_FILES);
        while i < files.len() {
            let mut bytes = 0;
            let start = i;
            while i < files.len() && i - start < batch_files && (i == start || bytes < BATCH_BYTES)
            {
                bytes += files[i].len() + 1;
                i += 1;
            }
            announce(start..i);
            let batch = &files[start..i];
            let mut c = self.command(mode);
            c.args(batch.iter().map(|f| OsStr::from_bytes(f)));
            c.stdin(Stdio::null());
            if mode == Mode::Passthrough {
                std::io::stdout().flush()?;
                status.add(c.status()?.code());
            } else {
                c.stdout(Stdio::piped());
                if mode == Mode::Lines {
                    c.stderr(Stdio::piped());
                }
                let o = c.output()?;
                status.add(o.status.code());
                parse(mode, &o.stdout, &o.stderr, &mut out);
            }
            if stop_after.is_some_and(|n| out.len() >= n) {
                out.truncate(stop_after.unwrap_or(0));
                break;
            }
        }
        Ok((status, out))
    }

    /// Run over one file's contents given on stdin, named `label` (the
    /// direct-store mode, where no mount holds the files).
    pub(crate) fn run_stdin(
        &self,
        label: &[u8],
        contents: &[u8],
        mode: Mode,
    ) -> std::io::Result<(Status, Vec<FileResult>)> {
        let mut c = self.command(mode);
        c.arg("-");
        let mut l = OsString::from("--label=");
        l.push(OsStr::from_bytes(label));
        // --label must come before `--`: rebuild with it first.
        let args: Vec<OsString> = c.get_args().map(|a| a.to_os_string()).collect();
        let mut c2 = Command::new("grep");
        c2.arg(l).args(args);
        for (k, v) in c.get_envs() {
            if let Some(v) = v {
                c2.env(k, v);
            }
        }
        c2.stdin(Stdio::piped());
        if mode == Mode::Passthrough {
            std::io::stdout().flush()?;
        } else {
            c2.stdout(Stdio::piped());
            if mode == Mode::Lines {
                c2.stderr(Stdio::piped());
            }
        }
        let mut child = c2.spawn()?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let data = contents.to_vec();
        let writer = std::thread::spawn(move || {
            // grep may stop reading early (-l, -q): a broken pipe is fine.
            let _ = stdin.write_all(&data);
        });
        let o = child.wait_with_output()?;
        let _ = writer.join();
        let mut status = Status::default();
        status.add(o.status.code());
        let mut out = Vec::new();
        if mode != Mode::Passthrough {
            parse(mode, &o.stdout, &o.stderr, &mut out);
        }
        Ok((status, out))
    }
}

/// Parse captured `-Z` output into per-file results (appending).
fn parse(mode: Mode, stdout: &[u8], stderr: &[u8], out: &mut Vec<FileResult>) {
    match mode {
        Mode::Passthrough => {}
        Mode::Files => {
            for name in stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
                out.push(FileResult {
                    path: name.to_vec(),
                    ..Default::default()
                });
            }
        }
        Mode::Counts => {
            // "name\0count\n"
            let mut rest = stdout;
            while let Some(z) = rest.iter().position(|&b| b == 0) {
                let name = &rest[..z];
                let after = &rest[z + 1..];
                let nl = after
                    .iter()
                    .position(|&b| b == b'\n')
                    .unwrap_or(after.len());
                let count = std::str::from_utf8(&after[..nl])
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                out.push(FileResult {
                    path: name.to_vec(),
                    count: Some(count),
                    ..Default::default()
                });
                rest = &after[(nl + 1).min(after.len())..];
            }
        }
        Mode::Lines => {
            // "name\0N:text\n"; a file's lines are consecutive.
            let mut rest = stdout;
            while let Some(z) = rest.iter().position(|&b| b == 0) {
                let name = &rest[..z];
                let after = &rest[z + 1..];
                let nl = after
                    .iter()
                    .position(|&b| b == b'\n')
                    .unwrap_or(after.len());
                let line = &after[..nl];
                let colon = line.iter().position(|&b| b == b':').unwrap_or(0);
                let n = std::str::from_utf8(&line[..colon])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let text = line.get(colon + 1..).unwrap_or_default().to_vec();
                match out.last_mut() {
                    Some(f) if f.path == name => f.lines.push((n, text)),
                    _ => out.push(FileResult {
                        path: name.to_vec(),
                        lines: vec![(n, text)],
                        ..Default::default()
                    }),
                }
                rest = &after[(nl + 1).min(after.len())..];
            }
            // "grep: NAME: binary file matches"; other messages pass through.
            let mut other = Vec::new();
            for msg in stderr.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                match msg
                    .strip_prefix(b"grep: ")
                    .and_then(|m| m.strip_suffix(b": binary file matches"))
                {
                    Some(name) => out.push(FileResult {
                        path: name.to_vec(),
                        binary: true,
                        ..Default::default()
                    }),
                    None => {
                        other.extend_from_slice(msg);
                        other.push(b'\n');
                    }
                }
            }
            let _ = std::io::stderr().write_all(&other);
        }
    }
}
