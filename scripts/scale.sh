#!/usr/bin/env bash
# Serving while the cluster scales: `cumulus dev --replicas 1` (4 shards,
# each of a 2 GB budget, the weight a 5th shard of the same budget shares)
# serving an LR model of PARAMS features (default 20,000,000) in 64
# partitions, rank200 through the gRPC front, closed loop at concurrency
# 4, from a separate bench process of DURATION (default 8s) per run. Each
# of ROUNDS rounds (default 3), on a fresh dev process:
#
#   steady     no change
#   scale-out  a 5th shard (a separate `cumulus shard` process) joins 1s in
#   scale-in   it is cordoned 1s in, and killed (SIGKILL) once empty
#
# MAX_MOVES sets the dev manager's --max-moves (default: its default, 4),
# LOAD_RATE the shards' --load-rate (default: theirs). RATE makes the load
# open loop at that many requests a second (the latency of a request then
# counts from when it was due, and errors counts every request not
# answered OK).
#
# It prints every run (QPS, p50, p99, errors, and the time from the change
# to a balanced placement: `cumulus admin plan` empty, the new shard
# holding its share, or the cordoned shard empty), then the medians and
# the p99 ratios to steady.
#
#   scripts/scale.sh WORKDIR
# CUMULUS names the binary (default: cumulus on PATH).
set -euo pipefail
work=$1
C=${CUMULUS:-cumulus}
rounds=${ROUNDS:-3}
duration=${DURATION:-8s}
params=${PARAMS:-20000000}
moves=()
[ -n "${MAX_MOVES:-}" ] && moves=(--max-moves "$MAX_MOVES")
rate=()
[ -n "${LOAD_RATE:-}" ] && rate=(--load-rate "$LOAD_RATE")
repo=$work/models
mkdir -p "$work"
if [ ! -d "$repo/bench" ]; then
  "$C" model gen --name bench --type lr --params "$params" --partitions 64 --repo "$repo" > /dev/null
fi
export CUMULUS_ADMIN_TOKEN=scale
admin=(--addr 127.0.0.1:29032)
dev= shard=
trap '[ -n "$shard" ] && kill -9 $shard 2>/dev/null; [ -n "$dev" ] && kill $dev 2>/dev/null; wait 2>/dev/null' EXIT
now() { date +%s.%N; }
load=(--concurrency 4 --requests 100000000)
[ -n "${RATE:-}" ] && load=(--rate "$RATE")
bench() { # name; runs the load for $duration and prints a line
  "$C" bench --addr 127.0.0.1:29031 --repo "$repo" --model bench --workload rank200 --log-level warn \
    "${load[@]}" --duration "$duration" | tee -a "$work/raw.txt" |
    awk -v name="$1" -v bal="${2:--}" '/^rank200 .*(requests|offered)=/ {
      for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      if ("offered" in f) { f["qps"] = f["goodput"]; sub("/s", "", f["qps"]); f["errors"] = f["offered"] - f["ok"] }
      printf "%-10s %s %s %s %s %s\n", name, f["qps"], f["p50"], f["p99"], f["errors"], bal }'
}
balanced_out() { # the new shard holds all it is assigned, and nothing waits to move
  # (shards first: a plan read before the shard joined is empty too)
  "$C" admin shards "${admin[@]}" | awk '$1 == "shard-x" && $6 > 0 && $NF == $6 { ok = 1 } END { exit !ok }' &&
    "$C" admin plan "${admin[@]}" | grep -q '^nothing to move'
}
empty_in() { "$C" admin shards "${admin[@]}" | awk '$1 == "shard-x" && $5 == "empty" { ok = 1 } END { exit !ok }'; }
: > "$work/runs.txt"
: > "$work/raw.txt"
echo "run        qps p50 p99 errors balance-seconds"
for _ in $(seq "$rounds"); do
  : > "$work/dev.out" # before it starts: the wait for ready must not read the last run's
  "$C" dev --repo "$repo" --replicas 1 --shards 4 --memory-budget 2GB --http-addr 127.0.0.1:29030 --grpc-addr 127.0.0.1:29031 \
    --admin-addr 127.0.0.1:29032 "${moves[@]}" "${rate[@]}" --log-level warn > "$work/dev.out" 2> "$work/dev.err" &
  dev=$!
  until grep -q '^ready' "$work/dev.out"; do kill -0 $dev; sleep 0.2; done
  etcd=$(awk '/^etcd: / { print $2 }' "$work/dev.out")
  bench steady | tee -a "$work/runs.txt"

  bench scale-out > "$work/out.txt" &
  b=$!
  sleep 1
  t0=$(now)
  "$C" shard --id shard-x --etcd "$etcd" --repo "$repo" --memory-budget 2GB "${rate[@]}" --addr 127.0.0.1:0 --data-dir "$work/shard-x" --log-level warn > "$work/shard.out" 2>&1 &
  shard=$!
  until balanced_out; do sleep 0.05; done
  t=$(awk -v a="$(now)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')
  wait $b
  awk -v t="$t" '{ $6 = t; print }' "$work/out.txt" | tee -a "$work/runs.txt"

  bench scale-in > "$work/in.txt" &
  b=$!
  sleep 1
  t0=$(now)
  "$C" admin cordon shard-x "${admin[@]}" > /dev/null
  until empty_in; do sleep 0.05; done
  t=$(awk -v a="$(now)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')
  kill -9 $shard; wait $shard 2>/dev/null || true; shard=
  wait $b
  awk -v t="$t" '{ $6 = t; print }' "$work/in.txt" | tee -a "$work/runs.txt"
  rm -rf "$work/shard-x"
  kill -INT $dev; wait $dev || true; dev=
done
awk "$(cat "$(dirname "$0")/median.awk")"'
{ runs++; setup[runs] = $1; val[runs, "qps"] = $2; val[runs, "p99"] = ms($4); val[runs, "err"] = $5; val[runs, "bal"] = $6 }
END {
  split("steady scale-out scale-in", names, " ")
  printf "\nmedian of %d rounds  qps      p99    errors  balance\n", runs / 3
  for (k = 1; k <= 3; k++) printf "%-10s %9.0f %7.2fms %6d %8.2fs\n", names[k], median(names[k], "qps"), median(names[k], "p99"), median(names[k], "err"), median(names[k], "bal")
  s = median("steady", "p99")
  printf "\np99 during scale-out / steady: %.2fx; during scale-in / steady: %.2fx\n", median("scale-out", "p99") / s, median("scale-in", "p99") / s
}' "$work/runs.txt"
