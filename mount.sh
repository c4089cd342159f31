#!/usr/bin/env bash
# Build esfs (release) if needed and mount it in the background; returns once
# the mount is live, or prints why not and exits non-zero.
#   ./mount.sh MOUNTPOINT [esfs mount args...]     e.g. ./mount.sh ~/esfs
#   ./mount.sh -u MOUNTPOINT                        unmount cleanly
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$here/target/release/esfs"

usage() {
    echo "usage: $0 MOUNTPOINT [esfs mount options...]" >&2
    echo "       $0 -u MOUNTPOINT" >&2
    exit 2
}

# Whether MOUNTPOINT is a FUSE mount (mountinfo: the fstype follows the "-"
# after a variable number of optional fields).
mounted() {
    awk -v m="$1" '$5 == m { for (i = 7; i < NF; i++) if ($i == "-" && $(i+1) ~ /^fuse/) found = 1 }
                   END { exit !found }' /proc/self/mountinfo
}

[ $# -ge 1 ] || usage
if [ "$1" = "-u" ]; then
    [ $# -eq 2 ] || usage
    # Clean unmount (or clearing a killed server's dead mount), then waits
    # for the server's final sync.
    [ -x "$bin" ] || bin=esfs
    exec "$bin" umount "$2"
fi

mnt="$1"; shift
[ -e /dev/fuse ] || { echo "esfs: /dev/fuse is missing (load the fuse module: modprobe fuse)" >&2; exit 1; }
if [ "$(id -u)" != 0 ] && ! command -v fusermount3 >/dev/null; then
    echo "esfs: fusermount3 not found; install fuse3 (apt-get install fuse3)" >&2; exit 1
fi
if [ ! -x "$bin" ] || [ -n "$(find "$here/src" "$here/Cargo.toml" -newer "$bin" -print -quit)" ]; then
    echo "esfs: building release binary..." >&2
    (cd "$here" && cargo build --release --quiet)
fi
# `esfs` on PATH, for the README's `esfs search`, `esfs fsck`, `esfs umount`:
# a link in ~/.cargo/bin (on PATH where rustup installed Rust), else in
# ~/.local/bin (on PATH in Debian's and Ubuntu's ~/.profile). An esfs
# installed there otherwise (not a link) is left alone.
if [ -d "$HOME/.cargo/bin" ]; then bindir="$HOME/.cargo/bin"; else bindir="$HOME/.local/bin"; fi
if [ ! -e "$bindir/esfs" ] || [ -L "$bindir/esfs" ]; then
    if [ "$(readlink "$bindir/esfs" 2>/dev/null)" != "$bin" ]; then
        mkdir -p "$bindir" && ln -sfn "$bin" "$bindir/esfs"
        echo "esfs: linked $bindir/esfs -> $bin (a new shell finds it on PATH)" >&2
    fi
fi
mkdir -p "$mnt"
mnt="$(realpath "$mnt")"
if mounted "$mnt"; then
    # A dead mount left by a killed server: clear it before mounting again.
    if ! stat "$mnt" >/dev/null 2>&1; then
        "$bin" umount "$mnt" >/dev/null
    else
        echo "esfs: $mnt is already mounted" >&2; exit 1
    fi
fi
exec "$bin" mount "$mnt" "$@"
