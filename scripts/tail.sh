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
# FAULT defaults to 'delay=50ms,fraction=0.01' (on shard-0). LOAD says
# what sends the load, a separate process: cumulus (default: cumulus
# bench, requests drawn afresh) or ghz (a stock gRPC load tool, sending
# one rank200 request, 'cumulus bench request', after 300 warm-up calls;
# go install github.com/bojand/ghz/cmd/ghz@v0.120.0). It prints every
# run with the router's extra shard calls (hedges and retries, as a share
# of the first calls, from dev's /metrics), each round's straggler p99.9
# over its no-fault p99.9, then each setup's median QPS, p99 and p99.9
# and the ratios the targets are stated in.
#
#   scripts/tail.sh WORKDIR
# CUMULUS names the binary (default: cumulus on PATH).
set -euo pipefail
work=$1
C=${CUMULUS:-cumulus}
rounds=${ROUNDS:-5}
requests=${REQUESTS:-20000}
fault=${FAULT:-delay=50ms,fraction=0.01}
load=${LOAD:-cumulus}
repo=$work/models
mkdir -p "$work"
if [ ! -d "$repo/bench" ]; then
  "$C" model gen --name bench --type lr --params 1000000 --repo "$repo" > /dev/null
fi
case $load in
  cumulus) ;;
  ghz)
    command -v ghz > /dev/null || { echo "tail: ghz is not installed (go install github.com/bojand/ghz/cmd/ghz@v0.120.0)" >&2; exit 2; }
    "$C" bench request --repo "$repo" --model bench --workload rank200 > "$work/rank200.bin"
    ;;
  *) echo "tail: LOAD=$load: use cumulus or ghz" >&2; exit 2 ;;
esac
export CUMULUS_ADMIN_TOKEN=tail
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null' EXIT
# calls: the router's shard calls so far, "first extra", from dev's metrics.
calls() {
  curl -sf http://127.0.0.1:29010/metrics | awk '
    /^cumulus_router_shard_call_seconds_count/ { all += $2 }
    /^cumulus_router_hedges_total\{outcome="sent"\}/ { extra += $2 }
    /^cumulus_router_retries_total\{kind="replica"\}/ { extra += $2 }
    END { printf "%d %d\n", all - extra, extra }'
}
ghzrun() { # calls, then ghz's flags
  local n=$1; shift
  ghz --insecure --call inference.GRPCInferenceService/ModelInfer --binary-file "$work/rank200.bin" \
    --disable-template-functions --disable-template-data -c 4 -n "$n" "$@" 127.0.0.1:29011
}
run() { # name, dev flags...
  local name=$1; shift
  : > "$work/dev.out" # before it starts: the wait for ready must not read the last run's
  "$C" dev --repo "$repo" --replicas 2 "$@" --http-addr 127.0.0.1:29010 --grpc-addr 127.0.0.1:29011 \
    --admin-addr 127.0.0.1:29012 > "$work/dev.out" 2> "$work/dev.err" &
  pid=$!
  until grep -q '^ready' "$work/dev.out"; do kill -0 $pid; sleep 0.2; done
  if [ "$load" = ghz ]; then
    ghzrun 300 > /dev/null
    read -r f0 e0 < <(calls)
    ghzrun "$requests" -O json > "$work/ghz.json"
    read -r f1 e1 < <(calls)
    python3 - "$work/ghz.json" "$name" $((f1 - f0)) $((e1 - e0)) << 'PY' | tee -a "$work/runs.txt"
import json, math, sys
d = json.load(open(sys.argv[1]))
name, first, extra = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ok = sorted(x["latency"] for x in d["details"] if x.get("status") == "OK")
errors = sum(1 for x in d["details"] if x.get("status") != "OK")
q = lambda p: ok[max(0, math.ceil(p * len(ok)) - 1)] / 1e6
print("%-22s %.0f %.2fms %.2fms %.2fms %d %.2f%%" % (name, d["rps"], q(0.5), q(0.99), q(0.999), errors, 100 * extra / max(first, 1)))
PY
  else
    read -r f0 e0 < <(calls)
    "$C" bench --addr 127.0.0.1:29011 --repo "$repo" --model bench --workload rank200 --log-level warn \
      --concurrency 4 --requests "$requests" --duration 10m > "$work/bench.out"
    read -r f1 e1 < <(calls)
    awk -v name="$name" -v first=$((f1 - f0)) -v extra=$((e1 - e0)) '/^rank200 .*requests=/ {
      for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      printf "%-22s %s %s %s %s %s %.2f%%\n", name, f["qps"], f["p50"], f["p99"], f["p999"], f["errors"], 100 * extra / (first > 0 ? first : 1) }' \
      "$work/bench.out" | tee -a "$work/runs.txt"
  fi
  kill -INT $pid; wait $pid || true; pid=
}
: > "$work/runs.txt"
echo "setup                  qps p50 p99 p99.9 errors extra-calls"
for _ in $(seq "$rounds"); do
  run no-fault-hedged
  run no-fault-unhedged --hedge=false
  run straggler-unhedged --hedge=false --fault "$fault"
  run straggler-hedged --fault "$fault"
done
# Medians per setup; durations are printed by Go (µs, ms or s).
awk "$(cat "$(dirname "$0")/median.awk")"'
{ runs++; setup[runs] = $1; val[runs, "qps"] = $2; val[runs, "p99"] = ms($4); val[runs, "p999"] = ms($5); val[runs, "extra"] = $7 + 0 }
END {
  printf "\nround  straggler-hedged p99.9 / no-fault-hedged p99.9   extra calls (straggler, hedged)\n"
  for (r = 0; r < runs / 4; r++) printf "%5d  %.2fx %28s %.2f%%\n", r + 1, val[4 * r + 4, "p999"] / val[4 * r + 1, "p999"], "", val[4 * r + 4, "extra"]
  split("no-fault-hedged no-fault-unhedged straggler-unhedged straggler-hedged", names, " ")
  printf "\nmedian of %d rounds     qps      p99     p99.9\n", runs / 4
  for (k = 1; k <= 4; k++) printf "%-22s %5.0f %7.2fms %7.2fms\n", names[k], median(names[k], "qps"), median(names[k], "p99"), median(names[k], "p999")
  nf = median("no-fault-hedged", "p999")
  printf "\nstraggler p99.9 / no-fault p99.9: hedged %.2fx, unhedged %.2fx\n", median("straggler-hedged", "p999") / nf, median("straggler-unhedged", "p999") / nf
  printf "no fault, hedging on / off: qps %.3fx, p99 %.3fx\n", median("no-fault-hedged", "qps") / median("no-fault-unhedged", "qps"), median("no-fault-hedged", "p99") / median("no-fault-unhedged", "p99")
}' "$work/runs.txt"
