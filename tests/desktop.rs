//! Desktop file managers on the mount: GIO (what GNOME Files and pcmanfm
//! use), the freedesktop trash, Dolphin-style lock-file churn during
//! listings, statfs/df, and the fstab mount helper.
//!
//! Needs `gio` (libglib2.0-bin), `gvfs` and `dbus-run-session` (dbus) — `.ci/run`
//! installs them. GIO runs with HOME in a scratch directory, and the commands
//! that need gvfs (metadata::, `gio trash --empty`) under a private session
//! bus (`dbus-run-session`), which also takes gvfsd down when it exits.

mod common;

use common::*;
use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Run `cmd` in `dir` with HOME (and the XDG dirs) in a scratch directory,
/// so gio/gvfs never touch the real home.
fn gio_sh(m: &Mount, dir: &Path, cmd: &str) -> (std::process::ExitStatus, String, String) {
    let home = m.scratch().join("home");
    fs::create_dir_all(&home).unwrap();
    let cmd = format!(
        "export HOME='{h}' XDG_DATA_HOME='{h}/.local/share' XDG_CACHE_HOME='{h}/.cache' \
         XDG_CONFIG_HOME='{h}/.config' GIO_USE_VFS=local; {cmd}",
        h = home.display()
    );
    sh(dir, &cmd)
}

#[track_caller]
fn gio_ok(m: &Mount, dir: &Path, cmd: &str) -> String {
    let r = gio_sh(m, dir, cmd);
    assert_success(cmd, &r);
    r.1
}

/// The same under a private session bus with gvfs (the bus and the gvfs
/// daemons it activates exit with the command).
#[track_caller]
fn gio_bus_ok(m: &Mount, dir: &Path, script: &str) -> String {
    let home = m.scratch().join("home");
    fs::create_dir_all(&home).unwrap();
    let script_path = m.scratch().join("bus-script.sh");
    fs::write(&script_path, format!("set -e\n{script}\n")).unwrap();
    let cmd = format!(
        "export HOME='{h}' XDG_DATA_HOME='{h}/.local/share' XDG_CACHE_HOME='{h}/.cache' \
         XDG_CONFIG_HOME='{h}/.config'; unset DBUS_SESSION_BUS_ADDRESS; \
         timeout 60 dbus-run-session -- bash '{s}'",
        h = home.display(),
        s = script_path.display()
    );
    let r = sh(dir, &cmd);
    assert_success(script, &r);
    r.1
}

#[test]
fn gio_list_info_copy_move_rename_set_mkdir_remove() {
    let m = Mount::new();
    let dir = m.path();
    sh_ok(
        dir,
        "mkdir docs && for i in $(seq -w 1 300); do echo \"text $i\" > docs/file$i.txt; done \
         && printf '%s' '<html><body>x</body></html>' > docs/page.html",
    );

    // gio list -a 'standard::*' reads every file (content-type sniffing).
    let t = Instant::now();
    let out = gio_ok(&m, dir, "gio list -a 'standard::*' docs");
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 301, "{out}");
    assert!(
        rows.iter()
            .any(|r| r.starts_with("file001.txt\t")
                && r.contains("standard::content-type=text/plain")),
        "{out}"
    );
    assert!(
        rows.iter()
            .any(|r| r.starts_with("page.html\t") && r.contains("content-type=text/html")),
        "{out}"
    );
    eprintln!("gio list -a standard::* of 301 files: {:?}", t.elapsed());
    // Every attribute: adds listxattr, access and statfs probes per file.
    let all = gio_ok(&m, dir, "gio list -a '*' docs");
    assert_eq!(all.lines().count(), 301, "{all}");
    assert!(all.contains("unix::inode="), "{all}");

    // gio info: the mount is recognised as fuse.esfs and trash is possible.
    let info = gio_ok(&m, dir, "gio info docs/file001.txt");
    assert!(info.contains("standard::size: 9"), "{info}");
    assert!(info.contains("access::can-write: TRUE"), "{info}");
    if !m.is_plain() {
        assert!(info.contains("fuse.esfs"), "{info}");
        assert!(info.contains("access::can-trash: TRUE"), "{info}");
    }

    // copy, move, rename
    gio_ok(&m, dir, "gio mkdir out && gio copy docs/file001.txt out/");
    assert_eq!(
        fs::read_to_string(m.p("out/file001.txt")).unwrap(),
        "text 001\n"
    );
    gio_ok(&m, dir, "gio copy -p docs/file002.txt out/copy2.txt");
    assert_eq!(
        fs::read_to_string(m.p("out/copy2.txt")).unwrap(),
        "text 002\n"
    );
    let a = fs::metadata(m.p("docs/file002.txt")).unwrap();
    let b = fs::metadata(m.p("out/copy2.txt")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(a.mtime(), b.mtime(), "gio copy -p keeps the mtime");
    gio_ok(&m, dir, "gio move docs/file003.txt out/moved.txt");
    assert!(!m.p("docs/file003.txt").exists());
    assert_eq!(
        fs::read_to_string(m.p("out/moved.txt")).unwrap(),
        "text 003\n"
    );
    gio_ok(&m, dir, "gio move out docs/");
    assert!(m.p("docs/out/moved.txt").is_file());
    let r = gio_ok(&m, dir, "gio rename docs/file004.txt renamed.txt");
    assert!(r.contains("Rename successful"), "{r}");
    assert!(m.p("docs/renamed.txt").is_file() && !m.p("docs/file004.txt").exists());

    // gio set xattr::NAME writes the xattr user.NAME.
    gio_ok(
        &m,
        dir,
        "gio set -t string docs/renamed.txt xattr::xdg.tags work,urgent",
    );
    let x = gio_ok(&m, dir, "gio info -a 'xattr::*' docs/renamed.txt");
    assert!(x.contains("xattr::xdg.tags: work,urgent"), "{x}");
    let g = sh_ok(
        dir,
        "getfattr --only-values -n user.xdg.tags docs/renamed.txt",
    );
    assert_eq!(g, "work,urgent");
    // times through gio set (what "touch" in a file manager does)
    gio_ok(
        &m,
        dir,
        "gio set -t uint64 docs/renamed.txt time::modified 1000000000",
    );
    assert_eq!(
        fs::metadata(m.p("docs/renamed.txt")).unwrap().mtime(),
        1_000_000_000
    );

    // mkdir -p and remove (files, and an empty directory)
    gio_ok(&m, dir, "gio mkdir -p a/b/c");
    assert!(m.p("a/b/c").is_dir());
    gio_ok(&m, dir, "gio remove a/b/c a/b");
    assert!(!m.p("a/b").exists() && m.p("a").is_dir());
    gio_ok(&m, dir, "gio remove docs/file005.txt");
    assert!(!m.p("docs/file005.txt").exists());
    let r = gio_sh(&m, dir, "gio remove docs");
    assert!(!r.0.success(), "removing a non-empty directory must fail");
    // gio remove -f of something missing succeeds quietly
    gio_ok(&m, dir, "gio remove -f docs/nothing-here");
}

#[test]
fn gio_trash_uses_top_level_trash_dir_and_empty_empties_it() {
    skip_in_plain_mode!("gio trash");
    let m = Mount::new();
    let dir = m.path();
    let uid = unsafe { libc::getuid() };
    sh_ok(
        dir,
        "mkdir -p docs/sub && echo one > docs/one.txt && echo two > docs/sub/two.txt",
    );

    gio_ok(&m, dir, "gio trash docs/one.txt docs/sub");
    let trash = m.p(format!(".Trash-{uid}"));
    let meta = fs::symlink_metadata(&trash).expect("top-level .Trash-$UID created");
    assert!(meta.is_dir());
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o700,
        "safe permissions"
    );
    for d in ["files", "info"] {
        let md = fs::metadata(trash.join(d)).unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, 0o700, "{d}");
    }
    assert_eq!(
        fs::read_to_string(trash.join("files/one.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(
        fs::read_to_string(trash.join("files/sub/two.txt")).unwrap(),
        "two\n"
    );
    assert!(!m.p("docs/one.txt").exists() && !m.p("docs/sub").exists());
    let info = fs::read_to_string(trash.join("info/one.txt.trashinfo")).unwrap();
    assert!(info.starts_with("[Trash Info]\n"), "{info}");
    // Path is relative to the top directory for a top-level trash.
    assert!(info.contains("\nPath=docs/one.txt\n"), "{info}");
    assert!(info.contains("\nDeletionDate="), "{info}");
    assert!(trash.join("info/sub.trashinfo").is_file());

    // Same name again: the second one gets a distinct name.
    sh_ok(dir, "echo again > docs/one.txt");
    gio_ok(&m, dir, "gio trash docs/one.txt");
    let n = fs::read_dir(trash.join("files")).unwrap().count();
    assert_eq!(n, 3);

    // With gvfs on a session bus: metadata::, list, restore, empty.
    let out = gio_bus_ok(
        &m,
        dir,
        "gio trash --list | sort\n\
         echo ---\n\
         gio set -t string docs metadata::file-manager-view list\n\
         gio info -a metadata::file-manager-view docs\n\
         echo ---\n\
         gio trash --restore \"$(gio trash --list | awk -F'\\t' '$2 ~ /docs\\/sub$/ {print $1}')\"\n\
         gio trash --empty\n\
         gio trash --list | wc -l",
    );
    let parts: Vec<&str> = out.split("---\n").collect();
    assert_eq!(parts.len(), 3, "{out}");
    assert_eq!(parts[0].lines().count(), 3, "{out}");
    assert!(
        parts[0].contains(&format!("{}/docs/one.txt", dir.display())),
        "{out}"
    );
    assert!(
        parts[1].contains("metadata::file-manager-view: list"),
        "{out}"
    );
    assert_eq!(parts[2].trim(), "0", "{out}");
    assert_eq!(
        fs::read_to_string(m.p("docs/sub/two.txt")).unwrap(),
        "two\n"
    );
    assert_eq!(fs::read_dir(trash.join("files")).unwrap().count(), 0);
    assert_eq!(fs::read_dir(trash.join("info")).unwrap().count(), 0);
}

/// The spec's shared trash: an admin-made `$topdir/.Trash` with the sticky
/// bit is used as `.Trash/$uid`.
#[test]
fn gio_trash_uses_sticky_shared_trash_when_present() {
    skip_in_plain_mode!("gio trash (.Trash)");
    let m = Mount::new();
    let dir = m.path();
    let uid = unsafe { libc::getuid() };
    sh_ok(dir, "mkdir .Trash && chmod 1777 .Trash && echo x > f.txt");
    gio_ok(&m, dir, "gio trash f.txt");
    let per_user = m.p(format!(".Trash/{uid}"));
    assert_eq!(
        fs::read_to_string(per_user.join("files/f.txt")).unwrap(),
        "x\n"
    );
    assert!(per_user.join("info/f.txt.trashinfo").is_file());
    assert!(!m.p(format!(".Trash-{uid}")).exists());
}

/// Dolphin-style churn: lock files and `.directory` rewrites (QLockFile and
/// QSaveFile) created, renamed and deleted rapidly while other threads list
/// the directory and stat every entry. Listings must never fail, never
/// repeat a name, and always contain every permanent file.
#[test]
fn lock_file_churn_while_listing() {
    let m = Mount::new();
    let d = m.p("photos");
    fs::create_dir(&d).unwrap();
    let permanent: HashSet<String> = (0..500).map(|i| format!("img{i:04}.jpg")).collect();
    for n in &permanent {
        fs::write(d.join(n), b"jpeg").unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..2 {
        let d = d.clone();
        let (stop, done) = (stop.clone(), done.clone());
        writers.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let lck = d.join(format!(".directory.lock{w}"));
                // QLockFile: create exclusively, write pid, remove
                let f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&lck);
                if let Ok(mut f) = f {
                    use std::io::Write;
                    writeln!(f, "{}\nesfs-test\n", std::process::id()).unwrap();
                }
                // QSaveFile: write a temp, rename over .directory
                let tmp = d.join(format!(".directory.{w}{i}.new"));
                fs::write(&tmp, format!("[Dolphin]\nVersion={i}\n")).unwrap();
                fs::rename(&tmp, d.join(format!(".directory{w}"))).unwrap();
                fs::remove_file(&lck).unwrap();
                i += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            i
        }));
    }
    // 6 s, longer where a round costs network round trips (a real engine),
    // until the writers have done enough rounds to race the listings.
    let start = Instant::now();
    let mut listings = 0;
    while start.elapsed() < Duration::from_secs(6)
        || (done.load(Ordering::Relaxed) < 50 && start.elapsed() < Duration::from_secs(90))
    {
        let mut seen = HashSet::new();
        for e in fs::read_dir(&d).expect("opendir") {
            let e = e.expect("readdir entry");
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(
                seen.insert(name.clone()),
                "duplicate name {name} in one listing"
            );
            // stat each entry as a file manager does; churned names may vanish
            match fs::symlink_metadata(e.path()) {
                Ok(_) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    assert!(name.starts_with(".directory"), "{name} vanished")
                }
                Err(err) => panic!("stat {name}: {err}"),
            }
        }
        let missing: Vec<_> = permanent.difference(&seen).collect();
        assert!(missing.is_empty(), "listing lost {missing:?}");
        listings += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let rounds: u64 = writers.into_iter().map(|h| h.join().unwrap()).sum();
    eprintln!("{listings} listings during {rounds} lock/save rounds");
    assert!(
        listings >= 3 && rounds >= 50,
        "{listings} listings, {rounds} rounds"
    );
    let left: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !permanent.contains(n))
        .collect();
    let mut left = left;
    left.sort();
    assert_eq!(left, [".directory0", ".directory1"]);
}

/// statfs: real capacity (that of the disk holding the data) and exact file
/// counts; `df` shows the type fuse.esfs.
#[test]
fn statfs_and_df_are_sensible() {
    skip_in_plain_mode!("statfs");
    // Contents in the cluster have no local disk to report.
    embedded_only!("statfs");
    let m = Mount::new();
    let dir = m.path();
    let df = sh_ok(dir, "df -T -B1 . | tail -1");
    let f: Vec<&str> = df.split_whitespace().collect();
    assert_eq!(f[0], "esfs", "{df}");
    assert_eq!(f[1], "fuse.esfs", "{df}");
    let size: u64 = f[2].parse().unwrap();
    let avail: u64 = f[4].parse().unwrap();
    // The data directory's disk.
    let ddf = sh_ok(m.data_dir(), "df -B1 . | tail -1");
    let d: Vec<&str> = ddf.split_whitespace().collect();
    let dsize: u64 = d[1].parse().unwrap();
    assert_eq!(size, dsize, "{df} vs {ddf}");
    assert!(avail > 0 && avail <= size, "{df}");
    let h = sh_ok(dir, "df -h .");
    assert!(h.contains("esfs"), "{h}");

    // Inode counts: used = total - free is exactly the number of inodes.
    let used = || {
        let s = sh_ok(dir, "stat -f -c '%c %d %S %l' .");
        let v: Vec<u64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert!(v[0] > v[1] && v[1] > 0, "{s}");
        assert_eq!(v[2], 4096, "{s}");
        assert_eq!(v[3], 255, "{s}");
        v[0] - v[1]
    };
    let before = used();
    assert_eq!(before, 1, "only the root inode");
    sh_ok(
        dir,
        "mkdir d && for i in $(seq 1 50); do : > d/f$i; done && ln d/f1 d/hard && ln -s f1 d/sym",
    );
    assert_eq!(
        used(),
        before + 52,
        "50 files, 1 dir, 1 symlink; a hard link is no inode"
    );
    sh_ok(dir, "rm -r d");
    // The kernel's FORGETs of the unlinked inodes reach the mount
    // asynchronously (deleting then waits for them): poll, bounded.
    let settled = |want: u64| {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while used() != want && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        used()
    };
    assert_eq!(settled(before), before);
    let dfi = sh_ok(dir, "df -i . | tail -1");
    assert!(dfi.split_whitespace().nth(2) == Some("1"), "{dfi}");

    // A removed file's space is free within moments (its contents are
    // deleted by the write-back once the kernel forgets the inode; statfs
    // does not wait for it). Margins: other tests write to the same disk
    // meanwhile.
    let avail = || -> u64 { sh_ok(dir, "stat -f -c '%a' .").trim().parse().unwrap() };
    sh_ok(dir, "head -c 256M /dev/zero > big && sync big");
    let full = avail();
    sh_ok(dir, "rm big");
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut freed = 0;
    while std::time::Instant::now() < end {
        freed = avail().saturating_sub(full) * 4096;
        if freed >= 128 << 20 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(freed >= 128 << 20, "rm of 256 MiB freed {freed} bytes");
    assert_eq!(settled(before), before);
}

/// The fstab helper translates mount(8)'s call into `esfs mount`.
#[test]
fn fstab_helper_mount_fuse_esfs() {
    skip_in_plain_mode!("mount.fuse.esfs");
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/mount.fuse.esfs");
    let bin = env!("CARGO_BIN_EXE_esfs");
    let m = Mount::new(); // only for its scratch space
    let s = m.scratch();
    for d in ["store", "data", "mnt"] {
        fs::create_dir_all(s.join(d)).unwrap();
    }
    // -f (fake): print the command mount(8) would run.
    let fake = sh_ok(
        &s,
        &format!(
            "ESFS_BIN={bin} {h} {s}/store {s}/mnt -f -o rw,defaults,noauto,user,_netdev,nofail,\
             x-systemd.automount,relatime,allow_other,noatime,data={s}/data,threads=4",
            h = helper.display(),
            s = s.display()
        ),
    );
    assert_eq!(
        fake.trim(),
        format!(
            "{bin} mount {s}/mnt --data {s}/data --threads 4 --store {s}/store -o rw,allow_other,noatime",
            s = s.display()
        )
    );
    let es = sh_ok(
        &s,
        &format!(
            "ESFS_BIN=esfs {} https://es.example:9200 /mnt/x -f -n -o index=files,ro",
            helper.display()
        ),
    );
    assert_eq!(
        es.trim(),
        "esfs mount /mnt/x --index files --es https://es.example:9200 -o ro"
    );

    // A real mount through the helper, as mount(8) would call it.
    let out = sh_ok(
        &s,
        &format!(
            "ESFS_BIN={bin} {h} {s}/store {s}/mnt -o defaults,_netdev,nofail,relatime,data={s}/data,log={s}/esfs.log",
            h = helper.display(),
            s = s.display()
        ),
    );
    let mnt = s.join("mnt");
    let mounted = is_esfs_mounted(&mnt);
    let r = std::panic::catch_unwind(|| {
        assert!(mounted, "{out}");
        assert!(out.contains("unmount:"), "{out}");
        assert!(out.contains(&format!("{}/store", s.display())), "{out}");
        fs::write(mnt.join("hello"), b"hi").unwrap();
    });
    // The server runs in the background: unmount, then wait for it to exit.
    let mut ok = false;
    for _ in 0..50 {
        if sh(&s, "fusermount3 -u mnt").0.success() {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = out
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse::<u32>().ok());
    if let Some(pid) = pid {
        for _ in 0..100 {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    r.unwrap();
    assert!(ok, "fusermount3 -u failed");
    assert!(
        s.join("data").read_dir().unwrap().next().is_some(),
        "contents in data=DIR"
    );
}
