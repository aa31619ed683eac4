#!/usr/bin/env bash
# Slow senders, measured as the issue states them: a `cumulus dev` with
# default flags in its own process, and for each case a good client
# (rank200 over gRPC, closed loop, concurrency 1) alone and then beside
# the slow senders from 127.0.0.2; `cumulus bench hostile --slow` prints
# the good client's QPS, p99 and refusals and the dev process's peak RSS
# against the targets.
#
#   scripts/slow-senders.sh WORKDIR [CASE ...]
#   a CASE is PROTOCOL:STREAMS[:ANNOUNCE], e.g. grpc:8 http:300 http:10:40000000
#   (default: grpc:8 grpc:64 grpc:300 http:8 http:64 http:300 http:10:40000000)
#
# CUMULUS names the binary that runs bench (default: cumulus on PATH);
# SERVER the one that runs dev (default: CUMULUS), so that an older build
# can be measured with the same load generator. DURATION sets each run's
# length (default 10s), ROUNDS the rounds of alone then beside each case
# runs, whose median ratios are read against the targets (default 3).
set -euo pipefail
work=$1; shift
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(grpc:8 grpc:64 grpc:300 http:8 http:64 http:300 http:10:40000000)
C=${CUMULUS:-cumulus}
S=${SERVER:-$C}
repo=$work/models
mkdir -p "$work"
if [ ! -d "$repo/bench" ]; then
  "$C" model gen --name bench --type lr --params 1000000 --repo "$repo" > /dev/null
fi
export CUMULUS_ADMIN_TOKEN=slow
: > "$work/dev.out" # before it starts: the wait for ready must not read the last run's
"$S" dev --repo "$repo" --http-addr 127.0.0.1:29100 --grpc-addr 127.0.0.1:29101 \
  --admin-addr 127.0.0.1:29102 > "$work/dev.out" 2> "$work/dev.err" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
until grep -q ready "$work/dev.out"; do kill -0 $pid; sleep 0.2; done
until curl -sf 127.0.0.1:29100/v2/models/bench/ready > /dev/null; do kill -0 $pid; sleep 0.2; done
for c in "${cases[@]}"; do
  IFS=: read -r proto streams announce <<< "$c"
  echo "== $proto, $streams slow requests, announcing ${announce:-1000} bytes"
  "$C" bench hostile --addr 127.0.0.1:29101 --http-addr 127.0.0.1:29100 --pid "$pid" --repo "$repo" --model bench \
    --slow "$proto" --streams "$streams" --announce "${announce:-1000}" --concurrency 1 --duration "${DURATION:-10s}" --rounds "${ROUNDS:-3}" --log-level warn
done
