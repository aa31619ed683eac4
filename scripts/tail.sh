#!/usr/bin/env bash
# The tail targets as the issue states them: `cumulus dev --replicas 2`,
# rank200 through the gRPC front, closed loop at concurrency 4, ROUNDS
# alternating rounds (default 5) of REQUESTS requests (default 20000) in
# each of four setups, a fresh dev process each:
#
#   no fault, hedged        cumulus dev --replicas 2
#   no fault, unhedged      cumulus dev --replicas 2 --hedge=false
#   straggler, unhedged     ... --fault FAULT --hedge=false
#   straggler, hedged       ... --fault FAULT
#
# FAULT defaults to 'delay=50ms,fraction=0.01' (on shard-0). It prints
# every run, then each setup's median QPS, p99 and p99.9 and the ratios
# the targets are stated in. The load generator is a separate process.
#
#   scripts/tail.sh WORKDIR
# CUMULUS names the binary (default: cumulus on PATH).
set -euo pipefail
work=$1
C=${CUMULUS:-cumulus}
rounds=${ROUNDS:-5}
requests=${REQUESTS:-20000}
fault=${FAULT:-delay=50ms,fraction=0.01}
repo=$work/models
mkdir -p "$work"
if [ ! -d "$repo/bench" ]; then
  "$C" model gen --name bench --type lr --params 1000000 --repo "$repo" > /dev/null
fi
export CUMULUS_ADMIN_TOKEN=tail
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null' EXIT
run() { # name, dev flags...
  local name=$1; shift
  "$C" dev --repo "$repo" --replicas 2 "$@" --http-addr 127.0.0.1:29010 --grpc-addr 127.0.0.1:29011 \
    --admin-addr 127.0.0.1:29012 > "$work/dev.out" 2> "$work/dev.err" &
  pid=$!
  until grep -q '^ready' "$work/dev.out"; do kill -0 $pid; sleep 0.2; done
  "$C" bench --addr 127.0.0.1:29011 --repo "$repo" --model bench --workload rank200 --log-level warn \
    --concurrency 4 --requests "$requests" --duration 10m |
    awk -v name="$name" '/^rank200 .*requests=/ {
      for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      printf "%-22s %s %s %s %s %s\n", name, f["qps"], f["p50"], f["p99"], f["p999"], f["errors"] }' | tee -a "$work/runs.txt"
  kill -INT $pid; wait $pid || true; pid=
}
: > "$work/runs.txt"
echo "setup                  qps p50 p99 p99.9 errors"
for _ in $(seq "$rounds"); do
  run no-fault-hedged
  run no-fault-unhedged --hedge=false
  run straggler-unhedged --hedge=false --fault "$fault"
  run straggler-hedged --fault "$fault"
done
# Medians per setup; durations are printed by Go (µs, ms or s).
awk "$(cat "$(dirname "$0")/median.awk")"'
{ runs++; setup[runs] = $1; val[runs, "qps"] = $2; val[runs, "p99"] = ms($4); val[runs, "p999"] = ms($5) }
END {
  split("no-fault-hedged no-fault-unhedged straggler-unhedged straggler-hedged", names, " ")
  printf "\nmedian of %d rounds     qps      p99     p99.9\n", runs / 4
  for (k = 1; k <= 4; k++) printf "%-22s %5.0f %7.2fms %7.2fms\n", names[k], median(names[k], "qps"), median(names[k], "p99"), median(names[k], "p999")
  nf = median("no-fault-hedged", "p999")
  printf "\nstraggler p99.9 / no-fault p99.9: hedged %.2fx, unhedged %.2fx\n", median("straggler-hedged", "p999") / nf, median("straggler-unhedged", "p999") / nf
  printf "no fault, hedging on / off: qps %.3fx, p99 %.3fx\n", median("no-fault-hedged", "qps") / median("no-fault-unhedged", "qps"), median("no-fault-hedged", "p99") / median("no-fault-unhedged", "p99")
}' "$work/runs.txt"
