//! The server process's dealings with the kernel: whether a mount is live
//! (mountinfo), unmounting (umount(2) or fusermount3, retried while busy;
//! lazily for a dead mount), finding a mount's server, and the signal
//! thread's mask. The libc of process management, in one place.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Why `esfs umount` failed.
#[derive(Debug, thiserror::Error)]
pub enum UmountError {
    #[error("{0} is not an esfs mount")]
    NotMounted(PathBuf),
    #[error("cannot unmount {mnt}: {source}")]
    Unmount {
        mnt: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unmounted {mnt}, but its server (pid {pid}) is still writing back")]
    StillWriting { mnt: PathBuf, pid: u32 },
}

pub(crate) const FSTYPE: &str = "fuse.esfs";

/// Whether the kernel lists `mnt` as an esfs mount (reads /proc/self/mountinfo).
pub(crate) fn is_mounted(mnt: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = mnt.as_os_str().as_encoded_bytes();
    info.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            return false;
        };
        fields.get(4).is_some_and(|p| unescape_mountinfo(p) == want)
            && fields.get(sep + 1) == Some(&FSTYPE)
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = |c: u8| (b'0'..=b'7').contains(&c).then(|| c - b'0');
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let (Some(x), Some(y), Some(z)) = (oct(b[i + 1]), oct(b[i + 2]), oct(b[i + 3]))
        {
            out.push(x << 6 | y << 3 | z);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// `esfs umount MNT`: unmount cleanly, then wait for the server's final
/// sync (its exit). The dead mount of a killed server is cleared (detached
/// lazily if something still uses it); a live, busy mount is refused.
pub(crate) fn umount(mnt: &Path) -> Result<(), UmountError> {
    // Not canonicalize: a dead mount's root cannot be stat'ed.
    let abs = std::path::absolute(mnt).map_err(|source| UmountError::Unmount {
        mnt: mnt.to_path_buf(),
        source,
    })?;
    let mnt = match (abs.parent(), abs.file_name()) {
        (Some(p), Some(n)) => std::fs::canonicalize(p).unwrap_or(p.to_path_buf()).join(n),
        _ => abs.clone(),
    };
    if !is_mounted(&mnt) {
        return Err(UmountError::NotMounted(mnt));
    }
    let servers = server_pids(&mnt);
    let dead = servers.is_empty()
        || std::fs::metadata(&mnt).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN));
    let failed = |source| UmountError::Unmount {
        mnt: mnt.clone(),
        source,
    };
    if let Err(e) = unmount_retrying(&mnt) {
        if !dead {
            return Err(failed(e));
        }
        detach(&mnt).map_err(failed)?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    for pid in servers {
        while Path::new(&format!("/proc/{pid}")).exists() {
            if Instant::now() > deadline {
                return Err(UmountError::StillWriting { mnt, pid });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// PIDs of the esfs servers of `mnt`: `esfs mount MNT --foreground`
/// processes, from their command lines.
fn server_pids(mnt: &Path) -> Vec<u32> {
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| {
            let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let argv: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
            let exe = argv
                .first()
                .map(|a| Path::new(std::ffi::OsStr::from_bytes(a)));
            if exe.and_then(|p| p.file_name()) != Some(std::ffi::OsStr::new("esfs"))
                || argv.get(1) != Some(&&b"mount"[..])
                || !argv.iter().any(|a| *a == b"--foreground" || *a == b"-f")
            {
                return false;
            }
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
            argv[2..]
                .iter()
                .filter(|a| !a.starts_with(b"-"))
                .any(|a| cwd.join(std::ffi::OsStr::from_bytes(a)) == mnt)
        })
        .collect()
}

/// Detach a dead mount that is still in use (umount -l).
fn detach(mnt: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(mnt.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mnt)
        .output()?;
    match out.status.success() {
        true => Ok(()),
        false => Err(std::io::Error::other(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )),
    }
}

/// Unmount `mnt` as its user would (umount(2) as root, else `fusermount3
/// -u`), retrying for a few seconds while it is busy: a reference on its
/// way out (a file manager's last look) should not keep the mount up. Not
/// fuser's unmounter: it gives up its mount after one try.
pub(crate) fn unmount_retrying(mnt: &Path) -> std::io::Result<()> {
    let busy = |e: &std::io::Error| e.raw_os_error() == Some(libc::EBUSY);
    let mut tries = 0;
    loop {
        match unmount_once(mnt) {
            Err(e) if busy(&e) && tries < 30 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

fn unmount_once(mnt: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(mnt.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EPERM) {
        return Err(e);
    }
    let out = Command::new("fusermount3").arg("-u").arg(mnt).output()?;
    let msg = String::from_utf8_lossy(&out.stderr);
    match out.status.success() {
        true => Ok(()),
        false if msg.contains("busy") => Err(std::io::Error::from_raw_os_error(libc::EBUSY)),
        false => Err(std::io::Error::other(msg.trim().to_string())),
    }
}

pub(crate) fn block_signals() -> libc::sigset_t {
    // SAFETY: building and installing a signal mask for this thread (and
    // the threads it spawns afterwards).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

pub(crate) fn wait_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: waits for one of the blocked signals.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}
