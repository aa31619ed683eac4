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
# offered rate (default: twice the measured capacity). SERVER_CPUS and
# CLIENT_CPUS (taskset lists, e.g. 1 and 0) put the server and the load
# generator on cores of their own, so that the load generator's work at
# twice the rate does not come out of the server's capacity.
set -euo pipefail
work=$1; shift
C=${CUMULUS:-cumulus}
repo=$work/models
mkdir -p "$work"
if [ ! -d "$repo/bench" ]; then
  "$C" model gen --name bench --type lr --params 1000000 --repo "$repo" > /dev/null
fi
export CUMULUS_ADMIN_TOKEN=overload
server=(); client=()
[ -n "${SERVER_CPUS:-}" ] && server=(taskset -c "$SERVER_CPUS")
[ -n "${CLIENT_CPUS:-}" ] && client=(taskset -c "$CLIENT_CPUS")
: > "$work/dev.out" # before it starts: the wait for ready must not read the last run's
"${server[@]}" "$C" dev --repo "$repo" --request-timeout 2s "$@" --http-addr 127.0.0.1:29000 --grpc-addr 127.0.0.1:29001 \
  --admin-addr 127.0.0.1:29002 > "$work/dev.out" 2> "$work/dev.err" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
until grep -q ready "$work/dev.out"; do kill -0 $pid; sleep 0.2; done
common=(--addr 127.0.0.1:29001 --repo "$repo" --model bench --workload rank200 --log-level warn --connections 4)
"${client[@]}" "$C" bench "${common[@]}" --concurrency 8 --duration 15s | tee "$work/capacity.out"
# Capacity counts answered requests only: at concurrency 8 a router
# admitting fewer refuses some.
qps=$(awk '/^rank200 .*requests=/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] } print int((f["requests"] - f["errors"]) / 15) }' "$work/capacity.out")
rate=${RATE:-$((2 * qps))}
echo "capacity ${qps}/s answered; offering ${rate}/s"
"${client[@]}" "$C" bench "${common[@]}" --rate "$rate" --timeout 2s --duration 15s --pid "$pid" --settle 10s
# The server's own time to refuse (the client's figures above add the
# transport and the client's queueing on a machine it shares).
curl -s 127.0.0.1:29000/metrics | awk '
  /^cumulus_admission_refusal_seconds_bucket\{le="0.00064"\}/ { le640 = $2 }
  /^cumulus_admission_refusal_seconds_bucket\{le="0.00128"\}/ { le1280 = $2 }
  /^cumulus_admission_refusal_seconds_count/ { n = $2 }
  END { if (n > 0) printf "server: %d refusals, %.1f%% within 0.64 ms, %.1f%% within 1.28 ms of their admission check\n", n, 100 * le640 / n, 100 * le1280 / n }'
