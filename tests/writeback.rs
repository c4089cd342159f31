//! `-o writeback_cache`: the kernel owns files' sizes and times and keeps
//! written pages, sending writes at close, fsync or writeback. What must
//! still hold: contents and times as the kernel showed them, after a clean
//! unmount and after a `kill -9` (for closed files), the tmpfile pattern,
//! and the privilege bits a write by another user drops.

mod common;

use common::*;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn wb() -> Mount {
    Mount::with_options(&["writeback_cache"])
}

/// (size, mtime, ctime, nlink, mode) as `stat` shows them.
fn attrs(p: &Path) -> (i64, (i64, i64), (i64, i64), u64, u32) {
    let st = stat(p);
    (
        st.st_size,
        mtime_ns(&st),
        ctime_ns(&st),
        st.st_nlink,
        st.st_mode,
    )
}

/// Files written with real tools, then renamed, linked and chmod'ed: the
/// bytes and every time `stat` showed come back after `kill -9` and after a
/// clean remount.
#[test]
fn closed_files_keep_bytes_and_times_across_kill9_and_remount() {
    embedded_only!("closed_files_keep_bytes_and_times_across_kill9_and_remount"); // -o writeback_cache is refused elsewhere
    let mut m = wb();
    let big = pattern((1 << 20) + 77, 3);
    fs::write(m.p("big"), &big).unwrap();
    sh_ok(
        m.path(),
        "printf small > s && seq 1 20000 > nums && cp -a nums copy && \
         printf more >> s && mv copy moved && ln moved hard && chmod 600 s && \
         dd if=/dev/zero of=nums bs=1 count=3 seek=5 conv=notrunc status=none",
    );
    // Renames and links move ctime in the kernel after esfs stamped its
    // own: many, so some cross a clock tick in between.
    sh_ok(
        m.path(),
        "mkdir many && cd many && for i in $(seq 300); do echo $i > f$i; mv f$i g$i; ln g$i h$i; done",
    );
    let mut names: Vec<String> = ["big", "s", "nums", "moved", "hard"]
        .map(String::from)
        .to_vec();
    names.extend((1..=300).flat_map(|i| [format!("many/g{i}"), format!("many/h{i}")]));
    let before: Vec<_> = names.iter().map(|n| attrs(&m.p(n))).collect();
    let bytes: Vec<_> = names.iter().map(|n| fs::read(m.p(n)).unwrap()).collect();
    assert_eq!(bytes[0], big);
    assert_eq!(bytes[1], b"smallmore");
    assert_eq!(&bytes[2][..8], b"1\n2\n3\0\0\0");

    m.kill9();
    m.start_again();
    for (i, n) in names.iter().enumerate() {
        assert_eq!(fs::read(m.p(n)).unwrap(), bytes[i], "{n} after kill -9");
        assert_eq!(attrs(&m.p(n)), before[i], "{n}: stat after kill -9");
    }
    m.remount();
    for (i, n) in names.iter().enumerate() {
        assert_eq!(attrs(&m.p(n)), before[i], "{n}: stat after remount");
    }
}

/// A later write moves mtime forward, and a reader sees the new bytes and
/// size at once, also through another descriptor.
#[test]
fn writes_move_times_and_show_at_once() {
    embedded_only!("writes_move_times_and_show_at_once"); // -o writeback_cache is refused elsewhere
    let m = wb();
    let p = m.p("f");
    fs::write(&p, b"one").unwrap();
    let first = attrs(&p);
    tick();
    let mut f = OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(b" two").unwrap();
    // Not closed yet: the pages are the kernel's, and so are size and times.
    assert_eq!(fs::read(&p).unwrap(), b"one two");
    let open = attrs(&p);
    assert_eq!(open.0, 7);
    assert!(open.1 > first.1, "mtime moved: {first:?} -> {open:?}");
    drop(f);
    assert_eq!(attrs(&p), open);
    assert_eq!(sh_ok(m.path(), "cat f; wc -c < f"), "one two7\n");
}

/// The tmpfile pattern: unlinked before its first write reached esfs.
#[test]
fn file_unlinked_before_its_first_write_stays_usable() {
    embedded_only!("file_unlinked_before_its_first_write_stays_usable"); // -o writeback_cache is refused elsewhere
    let m = wb();
    let f = check_tmpfile_pattern(&m, 100_000);
    f.set_len(10).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 10);
    assert_eq!(f.metadata().unwrap().nlink(), 0);
}

/// A write by a user without CAP_FSETID drops setuid (the kernel asks for
/// it with a SETATTR of the mode before its write).
#[test]
fn write_by_non_root_clears_setuid() {
    embedded_only!("write_by_non_root_clears_setuid"); // -o writeback_cache is refused elsewhere
    let m = wb();
    let d = m.p("pub");
    fs::create_dir(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
    let f = d.join("suid");
    fs::write(&f, b"x").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o4777)).unwrap();
    assert_success("append", &sh_nobody(&d, "echo z >> suid"));
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o0777);
    assert_eq!(fs::read(&f).unwrap(), b"xz\n");
}

/// The kernel would own sizes and times another mount changes: refused.
#[test]
fn writeback_cache_is_refused_on_elasticsearch() {
    let mnt = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_esfs"))
        .arg("mount")
        .arg(mnt.path())
        .args(["--es", "http://127.0.0.1:9"])
        .args(["--foreground", "-o", "writeback_cache"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("writeback_cache needs the embedded store"),
        "{err}"
    );
}
