#!/usr/bin/env bash
# A real file manager on the mount: pcmanfm under Xvfb opens a directory of
# N files (default 10000) on a fresh release esfs mount (cold kernel caches),
# the time until the window shows the complete, stable listing is measured,
# and a cropped screenshot is saved as bench/desktop-pcmanfm.png. Fails if
# pcmanfm prints anything beyond the known-harmless messages, or the esfs
# log has warnings or errors.
#
#   bench/desktop-screenshot.sh [N]
#
# Needs (Debian): xvfb pcmanfm x11-apps netpbm gvfs dbus
#   apt-get install -y --no-install-recommends xvfb pcmanfm x11-apps netpbm gvfs
# Everything runs with HOME in a scratch directory; every process started
# here is stopped by PID at the end. Not run in CI.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
n=${1:-10000}
out_png="$here/bench/desktop-pcmanfm.png"
bin="$here/target/release/esfs"
for c in Xvfb pcmanfm xwd xwdtopnm pnmtopng pamcut pnmquant ppmtopgm pamsumm dbus-run-session fusermount3; do
    command -v "$c" >/dev/null || { echo "missing $c (see the header of $0)" >&2; exit 1; }
done
if [ ! -x "$bin" ] || [ -n "$(find "$here/src" -newer "$bin" -print -quit)" ]; then
    (cd "$here" && cargo build --release --quiet)
fi

tmp=$(mktemp -d /tmp/esfs-desktop.XXXXXX)
mkdir -p "$tmp"/{store,data,mnt,home}
xvfb_pid= dbus_pid=
cleanup() {
    if [ -n "$dbus_pid" ]; then
        for p in $(pgrep -P "$dbus_pid" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
        kill "$dbus_pid" 2>/dev/null || true
        wait "$dbus_pid" 2>/dev/null || true
    fi
    [ -z "$xvfb_pid" ] || { kill "$xvfb_pid" 2>/dev/null || true; wait "$xvfb_pid" 2>/dev/null || true; }
    if mountpoint -q "$tmp/mnt"; then
        for _ in 1 2 3 4 5; do fusermount3 -u "$tmp/mnt" 2>/dev/null && break; sleep 0.5; done
    fi
    sleep 0.5
    if [ -n "${KEEP:-}" ]; then echo "kept $tmp"; else mountpoint -q "$tmp/mnt" || rm -rf "$tmp"; fi
}
trap cleanup EXIT

mnt_opts=(--store "$tmp/store" --data "$tmp/data")
if [ -n "${PLAIN:-}" ]; then
    # For comparison: the same listing from a plain directory on local disk.
    what="a local directory"
    out_png="$tmp/plain.png"
    mkdir "$tmp/mnt/files"
else
    what="a fresh esfs mount"
    "$bin" mount "$tmp/mnt" "${mnt_opts[@]}" >/dev/null
    mkdir "$tmp/mnt/files"
fi
echo "creating $n files..."
(cd "$tmp/mnt/files" && seq -f 'document-%05g.txt' 1 "$n" | xargs touch)
for i in $(seq 1 20); do echo "note $i" > "$tmp/mnt/files/note-$i.md"; done
mkdir "$tmp/mnt/files/subdir"
total=$((n + 21))
if [ -z "${PLAIN:-}" ]; then
    # Remount so the file manager starts cold.
    fusermount3 -u "$tmp/mnt"
    sleep 1
    log_from=$(stat -c %s "$tmp/store/esfs.log")
    "$bin" mount "$tmp/mnt" "${mnt_opts[@]}" >/dev/null
fi
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true

disp=:$((90 + RANDOM % 9))
Xvfb "$disp" -screen 0 1280x800x24 -nolisten tcp 2>"$tmp/xvfb.err" &
xvfb_pid=$!
for _ in $(seq 50); do DISPLAY=$disp xwininfo -root >/dev/null 2>&1 && break; sleep 0.1; done

export HOME="$tmp/home" XDG_CONFIG_HOME="$tmp/home/.config" XDG_CACHE_HOME="$tmp/home/.cache" \
    XDG_DATA_HOME="$tmp/home/.local/share"
unset DBUS_SESSION_BUS_ADDRESS
# A detailed list view, in a larger window (pcmanfm's own settings file).
mkdir -p "$XDG_CONFIG_HOME/pcmanfm/default"
cat >"$XDG_CONFIG_HOME/pcmanfm/default/pcmanfm.conf" <<EOF
[ui]
win_width=1000
win_height=700
view_mode=list
show_statusbar=1
EOF

shot() { DISPLAY=$disp xwd -root -silent; }
t0=$(date +%s.%N)
DISPLAY=$disp dbus-run-session -- pcmanfm "$tmp/mnt/files" 2>"$tmp/pcmanfm.err" &
dbus_pid=$!

# Poll the screen: the listing is complete when the file view and the
# status bar show something (dark pixels: text and icons) and the image has
# stopped changing for 3 s; its time is that of the first frame equal to
# the last.
has_text() { # region of the screen in $1 (xwd file): LEFT TOP WIDTH HEIGHT
    local min
    min=$(xwdtopnm "$1" 2>/dev/null | pamcut -left "$2" -top "$3" -width "$4" -height "$5" |
        ppmtopgm | pamsumm -min -brief 2>/dev/null)
    [ "${min%.*}" -lt 100 ]
}
last= last_change=$t0
while :; do
    # The frame's time is taken after the capture: an upper bound on when
    # the screen looked like this (xwd itself takes ~0.1 s, more under load).
    shot >"$tmp/shot.xwd"
    now=$(date +%s.%N)
    sum=$(md5sum <"$tmp/shot.xwd" | cut -c1-32)
    if [ "$sum" != "$last" ]; then
        last=$sum last_change=$now
    elif awk -v a="$now" -v b="$last_change" 'BEGIN { exit !(a - b > 3) }' &&
        has_text "$tmp/shot.xwd" 170 80 800 580 && has_text "$tmp/shot.xwd" 2 682 600 16; then
        break
    fi
    awk -v a="$now" -v b="$t0" 'BEGIN { exit !(a - b > 120) }' && { echo "no stable listing after 120 s" >&2; exit 1; }
    sleep 0.05
done
ready=$(awk -v a="$last_change" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')
DISPLAY=$disp xwininfo -root -tree | grep -q '"files"' || { echo "no pcmanfm window titled files" >&2; exit 1; }

shot | xwdtopnm 2>/dev/null | pamcut -left 0 -top 0 -width 1000 -height 700 |
    pnmquant 16 2>/dev/null | pnmtopng >"$out_png" # 16 colours: ~12 KB
echo "pcmanfm listed $total entries of $what in ${ready} s (screen stable 3 s after that)"
echo "screenshot: $out_png ($(stat -c %s "$out_png") bytes)"

# pcmanfm's messages, minus the known-harmless ones (../shared/notes/desktop.md).
harmless='x-terminal-emulator has very limited support|Templates. doesn.t exist|modules directory is not accessible|icons too large|RemoteVolumeMonitor|UDisks2VolumeMonitor|dbus-daemon|Activating service|Successfully activated|Failed to set fd limit|connection to the bus|^\s*$'
if grep -Evi "$harmless" "$tmp/pcmanfm.err"; then
    echo "pcmanfm printed the messages above" >&2
    exit 1
fi
if [ -z "${PLAIN:-}" ] && tail -c +$((log_from + 1)) "$tmp/store/esfs.log" | grep -E ' (WARN|ERROR) '; then
    echo "esfs logged the warnings above" >&2
    exit 1
fi
echo "no errors in pcmanfm's stderr or the esfs log"
