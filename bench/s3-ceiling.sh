#!/usr/bin/env bash
# What the S3 server on this machine can do at most, without esfs or JuiceFS in the way: N
# objects of 4 MiB of incompressible bytes PUT with P requests in flight (curl, signed, one
# process per request), then GET back to /dev/null the same way. Both filesystems' sequential
# rows in bench/run --s3 are bounded by this; the --data DIR column is not.
#
#   bench/s3-ceiling.sh [--mib 1024] [--parallel 16] [--instance bench-run]
#
# Uses a running scripts/s3 instance if there is one of that name, else starts one and stops
# it at the end. Prints one Markdown row per direction; MB = 10^6 bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
mib=1024 par=16 inst=bench-run
while [ $# -gt 0 ]; do
    case $1 in
        --mib) mib=$2; shift 2 ;;
        --parallel) par=$2; shift 2 ;;
        --instance) inst=$2; shift 2 ;;
        *) echo "usage: $0 [--mib N] [--parallel P] [--instance NAME]" >&2; exit 2 ;;
    esac
done
started=0
if ! scripts/s3 url "$inst" >/dev/null 2>&1; then
    scripts/s3 start "$inst" >/dev/null
    started=1
fi
work=$(mktemp -d)
trap '((started)) && scripts/s3 stop "$inst"; rm -rf "$work"' EXIT
eval "$(scripts/s3 env "$inst")"
n=$((mib / 4))
head -c $((4 << 20)) /dev/urandom >"$work/block"
prefix="ceiling-$(date +%s%N)"
url="$AWS_ENDPOINT_URL/$ESFS_S3_BUCKET/$prefix"
# One signed request; $1 is the object's number, the rest curl's own arguments.
export url
sign=(--aws-sigv4 "aws:amz:${AWS_REGION:-us-east-1}:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY"
      -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -sSf)
put() { seq 0 $((n - 1)) | xargs -P "$par" -I{} curl "${sign[@]}" -X PUT --data-binary "@$work/block" "$url/{}" -o /dev/null; }
get() { seq 0 $((n - 1)) | xargs -P "$par" -I{} curl "${sign[@]}" "$url/{}" -o /dev/null; }
rate() { python3 -c "import sys; print('%.0f' % ($n * 4 * 1048576 / 1e6 / float(sys.argv[1])))" "$1"; }
t0=$(date +%s.%N); put; t1=$(date +%s.%N); get; t2=$(date +%s.%N)
w=$(python3 -c "print($t1 - $t0)"); r=$(python3 -c "print($t2 - $t1)")
echo "| direction | objects | in flight | seconds | MB/s |"
echo "|---|---|---|---|---|"
printf '| PUT | %d x 4 MiB | %d | %.2f | %s |\n' "$n" "$par" "$w" "$(rate "$w")"
printf '| GET | %d x 4 MiB | %d | %.2f | %s |\n' "$n" "$par" "$r" "$(rate "$r")"
# The objects go: a DELETE each (the instance may be shared with a run).
seq 0 $((n - 1)) | xargs -P "$par" -I{} curl "${sign[@]}" -X DELETE "$url/{}" -o /dev/null || true
