#!/usr/bin/env bash
# Overload, measured as the issue states it: capacity is the closed-loop
# rank200 QPS at concurrency 8; then an open loop offers twice that for
# 15 s with 2 s deadlines, and reports goodput, refusals (and how fast they
# were answered), errors by code, and the server's memory before, at peak
# and after. The router runs in its own `cumulus dev` process (etcd,
# manager and shards with it); the load generator is a separate process.
#
#   scripts/overload.sh WORKDIR [cumulus dev flags...]
#   e.g. scripts/overload.sh /tmp/overload
#        scripts/overload.sh /tmp/overload --max-inflight 100000   # admission off, to compare
#
# CUMULUS names the binary (default: cumulus on PATH); RATE overrides the
# offered rate (default: twice the measured capacity).
set -euo pipefail
work=$1; shift
C=${CUMULUS:-cumulus}
repo=$work/models
mkdir -p "$work"
if [ ! -d "$repo/bench" ]; then
  "$C" model gen --name bench --type lr --params 1000000 --repo "$repo" > /dev/null
fi
export CUMULUS_ADMIN_TOKEN=overload
"$C" dev --repo "$repo" --request-timeout 2s "$@" --http-addr 127.0.0.1:29000 --grpc-addr 127.0.0.1:29001 \
  --admin-addr 127.0.0.1:29002 > "$work/dev.out" 2> "$work/dev.err" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
until grep -q ready "$work/dev.out"; do kill -0 $pid; sleep 0.2; done
common=(--addr 127.0.0.1:29001 --repo "$repo" --model bench --workload rank200 --log-level warn)
"$C" bench "${common[@]}" --concurrency 8 --duration 15s | tee "$work/capacity.out"
qps=$(awk '/^rank200 .*qps=/ { for (i = 1; i <= NF; i++) if ($i ~ /^qps=/) { sub("qps=", "", $i); print int($i) } }' "$work/capacity.out")
rate=${RATE:-$((2 * qps))}
echo "capacity ${qps}/s; offering ${rate}/s"
"$C" bench "${common[@]}" --rate "$rate" --timeout 2s --duration 15s --pid "$pid" --settle 10s
