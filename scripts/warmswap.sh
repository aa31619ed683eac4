#!/usr/bin/env bash
# Storage III's swap: the tail while a new full version of a model served
# from disk replaces the live one. A generated LR model (PARAMS features,
# default 30,000,000, in PARTITIONS partitions, default 16) and its next
# full version (the same features, other values: --value-seed) are served
# by a fresh `cumulus dev` of SHARDS shards (default 4), each shard's
# --memory-budget 1/RATIO (default 4) of the bytes it is assigned. Load is
# rank200 (Zipf ids) from a separate `cumulus bench`, closed loop at
# concurrency 4: WARM requests first (default 6,000: the caches learn),
# then a WINDOW (default 30s) of steady load, then the same WINDOW from
# the moment version 2 is published (staged, warmed, committed within
# it). Prints both windows (qps p50 p99 errors), when version 2 went
# live, and swap p99 / steady p99.
#
#   scripts/warmswap.sh WORKDIR
# CUMULUS names the binary (default: cumulus on PATH).
set -euo pipefail
work=$1
C=${CUMULUS:-cumulus}
params=${PARAMS:-30000000}
partitions=${PARTITIONS:-16}
shards=${SHARDS:-4}
ratio=${RATIO:-4}
warm=${WARM:-6000}
window=${WINDOW:-30s}
repo=$work/repo
mkdir -p "$work"
if [ ! -d "$work/v2-held" ]; then
  rm -rf "$repo"
  "$C" model gen --name bench --type lr --params "$params" --partitions "$partitions" --repo "$repo" > /dev/null 2>&1
  "$C" model gen --name bench --type lr --params "$params" --partitions "$partitions" --value-seed 2 --repo "$repo" > /dev/null 2>&1
  mv "$repo/bench/2" "$work/v2-held"
fi
[ -d "$repo/bench/2" ] && mv "$repo/bench/2" "$work/v2-held"
model=$(du -sb "$repo/bench/1" | cut -f1)
budget=$((model / shards / ratio))
echo "model: $params LR features, $partitions partitions, $((model >> 20)) MiB a version; $shards shards, each budget $((budget >> 20)) MiB (1/$ratio of its share)"
export CUMULUS_ADMIN_TOKEN=warmswap
: > "$work/dev.out" # before it starts: the wait for ready must not read the last run's
"$C" dev --repo "$repo" --shards "$shards" --memory-budget "$budget" --http-addr 127.0.0.1:29230 --grpc-addr 127.0.0.1:29231 \
  --admin-addr 127.0.0.1:29232 ${DEV_FLAGS:-} > "$work/dev.out" 2> "$work/dev.err" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; [ -d "$repo/bench/2" ] && mv "$repo/bench/2" "$work/v2-held"' EXIT
until grep -q '^ready' "$work/dev.out"; do kill -0 $pid; sleep 0.2; done
load() {
  "$C" bench --addr 127.0.0.1:29231 --repo "$repo" --model bench --workload rank200 --log-level warn --concurrency 4 "$@" |
    awk '/^rank200 .*requests=/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      printf "qps=%s p50=%s p99=%s errors=%s", f["qps"], f["p50"], f["p99"], f["errors"] }'
}
live() { "$C" admin --addr 127.0.0.1:29232 --json models | python3 -c 'import json,sys; print(json.load(sys.stdin)["models"][0]["live"])'; }
# wait_live PID waits (while PID runs) until the manager logs version 2
# live. It reads the log, not the admin API: a new cumulus and python3
# process ten times a second took a third of this 2-core machine's CPU
# from the load it measures.
wait_live() {
  until grep -q 'msg="manager: version live" model=bench version=2' "$work/dev.err"; do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
}
load --requests "$warm" --duration 10m > /dev/null
steady=$(load --duration "$window")
# SLICES=N: also N back-to-back 2s loads from publication, each one's p99
# printed, to see when the tail rises and falls.
if [ "${SLICES:-0}" -gt 0 ]; then
  (for i in $(seq "$SLICES"); do echo "slice $i $(date +%s.%N) $(load --duration 2s)"; done) > "$work/slices.out" &
  slicer=$!
fi
mv "$work/v2-held" "$repo/bench/2" # publish version 2
t0=$(date +%s.%N)
if [ "${SLICES:-0}" -gt 0 ]; then
  "$C" admin --addr 127.0.0.1:29232 rescan > /dev/null
  wait_live $slicer
  t1=$(date +%s.%N)
  wait $slicer
  awk -v t0="$t0" -v t1="$t1" '{ printf "  %5.1fs %s\n", $3 - t0, $0 }' "$work/slices.out" | cut -c1-90
  echo "version 2 live $(python3 -c "print(round($t1-$t0,1))") s after publication; steady: $steady"
  exit 0
fi
load --duration "$window" > "$work/during.out" &
loader=$!
"$C" admin --addr 127.0.0.1:29232 rescan > /dev/null
wait_live $loader
t1=$(date +%s.%N)
wait $loader
echo "steady: $steady"
echo "swap:   $(cat "$work/during.out")"
echo "version 2 live $(python3 -c "print(round($t1-$t0,1))") s after publication (window $window); live now: $(live)"
grep -h 'warmed the value caches' "$work/dev.err" "$work/dev.out" | sed 's/^/  /' | head -8 || true
python3 -c "
import re
def p99(s): v = re.search(r'p99=([0-9.]+)(µs|ms|s)', s); return float(v.group(1)) * {'µs': 1e-3, 'ms': 1, 's': 1e3}[v.group(2)]
print(f'swap p99 / steady p99: {p99(open(\"$work/during.out\").read()) / p99(\"$steady\"):.2f}x')"
