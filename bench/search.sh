#!/usr/bin/env bash
# Benchmark: `grep -r` through an esfs mount vs `esfs search`, on generated
# trees of N files (default: 10000 and 100000), release build.
#
#   bench/search.sh [--es URL] [--cold] [N...]     e.g. bench/search.sh 10000 100000
#
# Each tree: N text files of 1-4 KiB in directories of 100, words drawn from
# a small vocabulary; a rare marker ("quokka-<k>") in 10 files and a common
# word ("lorem") in about 1% of them. For each pattern it checks that both
# tools give the identical sorted result set, then times 3 runs of each
# (median), and prints one markdown table row per tree and pattern.
#   --es URL  metadata and contents in that Elasticsearch cluster (a fresh
#             index, deleted at the end), not the embedded store
#   --cold    before each timed run: unmount, drop the kernel's caches
#             (/proc/sys/vm/drop_caches, root), mount again (not timed)
set -euo pipefail
cd "$(dirname "$0")/.."
es=""
cold=0
sizes=()
while [ $# -gt 0 ]; do
    case "$1" in
        --es) es=$2; shift 2 ;;
        --cold) cold=1; shift ;;
        *) sizes+=("$1"); shift ;;
    esac
done
[ ${#sizes[@]} -gt 0 ] || sizes=(10000 100000)
index=bench-search-$$

cargo build --release -j2 -q
ESFS=$PWD/target/release/esfs
work=$(mktemp -d /tmp/esfs-bench.XXXXXX)
mnt=$work/mnt
cleanup() {
    fusermount3 -u "$mnt" 2>/dev/null || true
    rm -rf "$work"
    drop_index
}
# The cluster's indices of this run's filesystem (it refuses wildcard deletes).
drop_index() {
    [ -n "$es" ] || return 0
    for x in entries inodes texts locks meta chunks; do
        curl -s -XDELETE "$es/$index-$x" >/dev/null || true
    done
}
mount_it() {
    if [ -n "$es" ]; then
        "$ESFS" mount "$mnt" --es "$es" --index "$index" --state-dir "$work/state" \
            --log "$work/log" >/dev/null
    else
        "$ESFS" mount "$mnt" --store "$work/store" --data "$work/data" --log "$work/log" >/dev/null
    fi
}
# Unmount, drop the kernel's caches, mount again (--cold); nothing otherwise.
chill() {
    [ "$cold" = 1 ] || return 0
    # esfs umount waits for the server's exit: on a cluster, the next mount
    # then finds the tree's delegation free and takes it.
    "$ESFS" umount "$mnt" >/dev/null
    sync
    echo 3 >/proc/sys/vm/drop_caches
    mount_it
}
# The median of 3 runs of a command, each after chill.
time3() {
    for _ in 1 2 3; do
        chill
        timeit "$@"
    done | median
}
trap cleanup EXIT

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# Seconds of wall time of a command (output discarded).
timeit() {
    local s e
    s=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || true
    e=$(date +%s.%N)
    echo "$e - $s" | bc -l
}

gen_tree() { # DIR N
    python3 - "$1" "$2" <<'EOF'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rnd = random.Random(42)
words = ("alpha beta gamma delta epsilon zeta theta iota kappa lambda omicron sigma "
         "upsilon omega river mountain forest ocean desert valley harbor bridge tower "
         "castle garden meadow orchard vineyard quarry canyon glacier tundra savanna "
         "function return struct impl trait module crate buffer vector string").split()
rare = set(rnd.sample(range(n), 10))
for i in range(n):
    d = os.path.join(root, "d%03d" % (i // 10000), "s%03d" % ((i // 100) % 100))
    os.makedirs(d, exist_ok=True)
    lines = []
    for _ in range(rnd.randint(15, 60)):
        lines.append(" ".join(rnd.choice(words) for _ in range(rnd.randint(5, 12))))
    if i in rare:
        lines.insert(rnd.randrange(len(lines)), "a quokka-%d was seen here" % i)
    if rnd.random() < 0.01:
        lines.insert(rnd.randrange(len(lines)), "lorem ipsum dolor")
    with open(os.path.join(d, "f%06d.txt" % i), "w") as f:
        f.write("\n".join(lines) + "\n")
EOF
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(date -u +%Y-%m-%d)"
if [ -n "$es" ]; then
    echo "metadata and contents: Elasticsearch $(curl -s "$es" | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"]["number"])') at $es"
else
    echo "metadata: the embedded store; contents: a local directory"
fi
[ "$cold" = 1 ] && echo "each run cold: a fresh mount after drop_caches"
echo
echo "| files | pattern | matches | grep -r (s) | esfs search (s) | speed-up |"
echo "|---:|---|---:|---:|---:|---:|"
for n in "${sizes[@]}"; do
    rm -rf "$work/src" "$work/store" "$work/data" "$work/state"
    drop_index
    mkdir -p "$mnt" "$work/src"
    gen_tree "$work/src" "$n"
    mount_it
    cp -r "$work/src" "$mnt/tree"
    # Wait until the mount has indexed everything.
    for _ in $(seq 1 3600); do
        getfattr --only-values -n user.esfs.flush "$mnt" 2>/dev/null | grep -q '"pending":0' && break
        sleep 1
    done
    for pat in "-l quokka-" "-n lorem ipsum"; do
        # shellcheck disable=SC2086
        set -- $pat
        flag=$1; shift; p="$*"
        g=$(grep -r "$flag" "$p" "$mnt/tree" | sort)
        e=$("$ESFS" search -r "$flag" "$p" "$mnt/tree" | sort)
        if [ "$g" != "$e" ]; then
            echo "MISMATCH for $flag $p on $n files" >&2
            diff <(echo "$g") <(echo "$e") | head >&2
            exit 1
        fi
        matches=$(echo "$g" | grep -c . || true)
        tg=$(time3 grep -r "$flag" "$p" "$mnt/tree")
        te=$(time3 "$ESFS" search -r "$flag" "$p" "$mnt/tree")
        printf '| %s | `%s %s` | %s | %.2f | %.3f | %.0fx |\n' "$n" "$flag" "$p" "$matches" "$tg" "$te" "$(echo "$tg / $te" | bc -l)"
    done
    "$ESFS" umount "$mnt" >/dev/null
    sleep 1
done
