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

# PIDs of esfs servers for a mountpoint (from their command lines).
server_pids() {
    local mnt=$1 p
    for p in /proc/[0-9]*; do
        { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF "esfs mount $mnt --foreground" && echo "${p#/proc/}"
    done
    return 0
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
    mnt="$(realpath -m "$2")"
    mounted "$mnt" || { echo "esfs: $mnt is not mounted" >&2; exit 1; }
    pids="$(server_pids "$mnt")"
    # A clean unmount; if the server died (kill -9), the mount is dead and
    # busy users may hold it: detach it lazily instead.
    fusermount3 -u "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null ||
        fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt"
    # Wait for the server to finish its final sync.
    for pid in $pids; do
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    echo "esfs: unmounted $mnt"
    exit 0
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
mkdir -p "$mnt"
mnt="$(realpath "$mnt")"
if mounted "$mnt"; then
    # A dead mount left by a killed server: clear it before mounting again.
    if ! stat "$mnt" >/dev/null 2>&1; then
        fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt"
    else
        echo "esfs: $mnt is already mounted" >&2; exit 1
    fi
fi
exec "$bin" mount "$mnt" "$@"
