#!/usr/bin/env bash
# Sequential write/read MB/s of esfs's block store (src/data/blocks) against SeaweedFS's S3 on
# this machine: starts the server with scripts/s3 (instance "bench"), runs the release build of
# examples/s3_blocks.rs, stops the server again if this script started it.
#
#   bench/s3-blocks.sh            256 MiB, 4 MiB blocks, 8 requests in flight
#   ESFS_BENCH_MIB=1024 ESFS_BENCH_BLOCK_MIB=8 ESFS_BENCH_CONCURRENCY=16 bench/s3-blocks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
started=0
if ! scripts/s3 url bench >/dev/null 2>&1; then
    scripts/s3 start bench >/dev/null
    started=1
fi
trap '((started)) && scripts/s3 stop bench' EXIT
cargo build --release -j2 --example s3_blocks
eval "$(scripts/s3 env bench)"
target/release/examples/s3_blocks
