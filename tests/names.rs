//! File names are arbitrary bytes (except '/' and NUL), at most 255 of them.

mod common;

use common::*;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use libc::ENAMETOOLONG;

fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// Sorted raw names in a directory.
fn listing(dir: &Path) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_vec())
        .collect();
    v.sort();
    v
}

fn sorted(names: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = names.iter().map(|n| n.to_vec()).collect();
    v.sort();
    v
}

#[test]
fn non_utf8_names_roundtrip() {
    let m = Mount::new();
    let names: [&[u8]; 4] = [
        b"caf\xe9",
        b"\xff\xfe",
        b"mixed-\xc3\xa9-\x80",
        b"\x01ctl\x7f",
    ];
    for n in names {
        fs::write(m.p(os(n)), n).unwrap();
    }
    assert_eq!(listing(m.path()), sorted(&names));
    for n in names {
        assert_eq!(fs::read(m.p(os(n))).unwrap(), n);
    }
    // The UTF-8 spelling of "café" is a different name.
    assert!(!m.p("café").exists());

    fs::rename(m.p(os(b"caf\xe9")), m.p(os(b"\x80\x81"))).unwrap();
    fs::create_dir(m.p(os(b"dir\xfe"))).unwrap();
    fs::rename(m.p(os(b"\xff\xfe")), m.p(os(b"dir\xfe/in\xff"))).unwrap();
    assert_eq!(
        listing(m.path()),
        sorted(&[
            b"\x80\x81",
            b"dir\xfe",
            b"mixed-\xc3\xa9-\x80",
            b"\x01ctl\x7f"
        ])
    );
    assert_eq!(listing(&m.p(os(b"dir\xfe"))), sorted(&[b"in\xff"]));
    assert_eq!(fs::read(m.p(os(b"\x80\x81"))).unwrap(), b"caf\xe9");

    symlink(os(b"target\xe9"), m.p(os(b"link\xe9"))).unwrap();
    assert_eq!(
        fs::read_link(m.p(os(b"link\xe9")))
            .unwrap()
            .as_os_str()
            .as_bytes(),
        b"target\xe9"
    );

    for n in [
        &b"\x80\x81"[..],
        b"mixed-\xc3\xa9-\x80",
        b"\x01ctl\x7f",
        b"link\xe9",
        b"dir\xfe/in\xff",
    ] {
        fs::remove_file(m.p(os(n))).unwrap();
    }
    fs::remove_dir(m.p(os(b"dir\xfe"))).unwrap();
    assert!(listing(m.path()).is_empty());
}

#[test]
fn awkward_but_valid_names() {
    let m = Mount::new();
    let names: Vec<&str> = vec![
        "back\\slash",
        "100%",
        "%2F",
        "%00",
        "a b  c ",
        " leading space",
        "new\nline",
        "tab\there",
        "-dash",
        ".hidden",
        "...",
        "..x",
        "quote\"'`",
        "glob*?[a]",
        "colon:semi;",
        "#hash~",
        "日本語",
        "emoji😀",
        "NFD-cafe\u{301}",
    ];
    for n in &names {
        fs::write(m.p(n), n.as_bytes()).unwrap();
    }
    let bytes: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
    assert_eq!(listing(m.path()), sorted(&bytes));
    for n in &names {
        assert_eq!(fs::read(m.p(n)).unwrap(), n.as_bytes(), "{n:?}");
        let renamed = format!("{n}.r");
        fs::rename(m.p(n), m.p(&renamed)).unwrap();
        assert!(m.p(&renamed).is_file(), "{renamed:?}");
    }
    // Same names as directories, reached through the shell.
    fs::create_dir(m.p("dirs")).unwrap();
    for n in &names {
        fs::create_dir(m.p("dirs").join(n)).unwrap();
    }
    // One "x" per directory: names may contain newlines.
    let out = sh_ok(m.p("dirs"), "find . -mindepth 1 -type d -printf x | wc -c");
    assert_eq!(out.trim(), names.len().to_string());
    sh_ok(m.path(), "find . -mindepth 1 -delete");
    assert!(listing(m.path()).is_empty());
}

#[test]
fn names_of_255_bytes_work() {
    let m = Mount::new();
    let ascii = "a".repeat(255);
    let cjk = "日".repeat(85); // 3 bytes each
    let mixed = format!("{}x", "é".repeat(127)); // 2 bytes each + 1
    for n in [&ascii, &cjk, &mixed] {
        assert_eq!(n.len(), 255);
    }
    fs::write(m.p(&ascii), b"file").unwrap();
    fs::create_dir(m.p(&cjk)).unwrap();
    symlink(&ascii, m.p(&mixed)).unwrap();
    fs::write(m.p(&cjk).join(&ascii), b"nested").unwrap();
    assert_eq!(
        listing(m.path()),
        sorted(&[ascii.as_bytes(), cjk.as_bytes(), mixed.as_bytes()])
    );
    assert_eq!(fs::read(m.p(&mixed)).unwrap(), b"file");
    assert_eq!(fs::read(m.p(&cjk).join(&ascii)).unwrap(), b"nested");
    fs::hard_link(m.p(&ascii), m.p(&cjk).join(&cjk)).unwrap();
    fs::rename(m.p(&cjk).join(&ascii), m.p(&cjk).join(&mixed)).unwrap();
    assert_eq!(
        listing(&m.p(&cjk)),
        sorted(&[cjk.as_bytes(), mixed.as_bytes()])
    );
}

#[test]
fn names_of_256_bytes_are_enametoolong() {
    let m = Mount::new();
    fs::write(m.p("f"), b"x").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    for long in ["b".repeat(256), "日".repeat(86), "c".repeat(1000)] {
        let p = m.p(&long);
        assert_eq!(errno(File::create(&p)), ENAMETOOLONG);
        assert_eq!(errno(fs::create_dir(&p)), ENAMETOOLONG);
        assert_eq!(errno(symlink("f", &p)), ENAMETOOLONG);
        assert_eq!(errno(fs::hard_link(m.p("f"), &p)), ENAMETOOLONG);
        assert_eq!(errno(fs::rename(m.p("f"), &p)), ENAMETOOLONG);
        assert_eq!(
            errno(fs::rename(m.p("d"), m.p("d").join(&long))),
            ENAMETOOLONG
        );
        assert_eq!(errno(fs::symlink_metadata(&p)), ENAMETOOLONG);
        assert_eq!(errno(fs::remove_file(&p)), ENAMETOOLONG);
    }
    assert_eq!(listing(m.path()), sorted(&[b"d", b"f"]));
    // A long name is fine as a symlink *target*, which is just data.
    symlink("t".repeat(300), m.p("l")).unwrap();
    assert_eq!(fs::read_link(m.p("l")).unwrap().as_os_str().len(), 300);
}

// ---------------------------------------------------------------- deep paths

fn mkdirat(dir: &OwnedFd, name: &str) -> io::Result<()> {
    let c = cstr(name);
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) }).map(drop)
}

fn openat(dir: &OwnedFd, name: &str, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = cstr(name);
    let fd = check(unsafe {
        libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC, 0o644)
    })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn write_fd(fd: &OwnedFd, data: &[u8]) {
    let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
    assert_eq!(n, data.len() as isize);
}

#[test]
fn deep_paths_near_and_beyond_path_max() {
    let m = Mount::new();
    // 100-byte components, created one relative step at a time.
    let comp = |i: usize| format!("{i:03}{}", "d".repeat(97));
    let mut fd: OwnedFd = File::open(m.path()).unwrap().into();
    let mut rel = PathBuf::new();
    let mut depth = 0;
    // Stay just under PATH_MAX (4096 including NUL) for the absolute path.
    while m
        .path()
        .join(&rel)
        .join(comp(depth))
        .join("leaf")
        .as_os_str()
        .len()
        < 4095
    {
        mkdirat(&fd, &comp(depth)).unwrap();
        fd = openat(&fd, &comp(depth), libc::O_DIRECTORY).unwrap();
        rel.push(comp(depth));
        depth += 1;
    }
    let near = openat(&fd, "leaf", libc::O_CREAT | libc::O_WRONLY).unwrap();
    write_fd(&near, b"near");
    let abs = m.path().join(&rel).join("leaf");
    assert!(abs.as_os_str().len() > 3900 && abs.as_os_str().len() < 4095);
    assert_eq!(
        fs::read(&abs).unwrap(),
        b"near",
        "absolute path of {} bytes",
        abs.as_os_str().len()
    );

    // Beyond PATH_MAX only relative steps work.
    for _ in 0..3 {
        mkdirat(&fd, &comp(depth)).unwrap();
        fd = openat(&fd, &comp(depth), libc::O_DIRECTORY).unwrap();
        rel.push(comp(depth));
        depth += 1;
    }
    let deep = openat(&fd, "leaf2", libc::O_CREAT | libc::O_WRONLY).unwrap();
    write_fd(&deep, b"deep");
    let too_long = m.path().join(&rel).join("leaf2");
    assert_eq!(errno(fs::read(&too_long)), ENAMETOOLONG);

    // Tools walk it with relative steps too.
    let found = sh_ok(m.path(), "find . -name leaf2 | wc -l");
    assert_eq!(found.trim(), "1");
    sh_ok(m.path(), &format!("rm -rf {}", comp(0)));
    assert!(listing(m.path()).is_empty());
}
