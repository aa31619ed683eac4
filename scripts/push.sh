#!/usr/bin/env bash
# Online updates with separate processes: a manager serving its push API,
# SHARDS shards and two routers, on loopback. An LR model of PARAMS
# features in PARTITIONS partitions; meanwhile ghz sends rank200 (one
# request, 'cumulus bench request', concurrency 2) to the first router.
# Two runs of 'cumulus bench push' (probes checked on both routers):
#   freshness:  RATE batches/s of KEYS keys (default 10 × 1,000), DURATION
#   throughput: 4 producers × 5 batches/s × 50,000 keys, DURATION
# then ghz's failed calls. ghz: go install github.com/bojand/ghz/cmd/ghz@v0.120.0
#
#   scripts/push.sh WORKDIR [PARAMS [PARTITIONS [SHARDS]]]
#   e.g. scripts/push.sh /tmp/push 10000000 1024 4
#
# CUMULUS names the binary (default: cumulus on PATH); MANAGER_FLAGS,
# SHARD_FLAGS and ROUTER_FLAGS more flags for those processes (SHARD_FLAGS
# and ROUTER_FLAGS may hold %i, the process's number); DURATION each run's seconds (default 60); RUNS which
# runs (default "freshness throughput"). ghz runs for all of them and 10
# seconds more, and ends on its own (a call cut short would count as
# failed). Logs go to WORKDIR/*.log.
set -euo pipefail
work=$(realpath -m "$1"); params=${2:-10000000}; partitions=${3:-1024}; shards=${4:-4}
C=${CUMULUS:-cumulus}
port=${PORT:-28200} # routers' gRPC on PORT+1 and PORT+11, HTTP on PORT and PORT+10; admin PORT+2; push PORT+3
duration=${DURATION:-60}
runs=${RUNS:-freshness throughput}
shard_flags=${SHARD_FLAGS:-}; router_flags=${ROUTER_FLAGS:-}
command -v ghz > /dev/null || { echo "push: ghz is not installed (go install github.com/bojand/ghz/cmd/ghz@v0.120.0)" >&2; exit 2; }
rm -rf "$work"; mkdir -p "$work/models" "$work/empty"
"$C" model gen --name bench --type lr --params "$params" --partitions "$partitions" --repo "$work/models" > /dev/null 2>&1
"$C" bench request --repo "$work/models" --model bench --workload rank200 > "$work/rank200.bin"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
start() { local log=$1; shift; "$C" "$@" > "$work/$log.log" 2>&1 & pids+=($!); }
export CUMULUS_ADMIN_TOKEN=push-admin CUMULUS_PUSH_TOKEN=push-bench
start etcd dev --repo "$work/empty" --shards 1 --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 --push-addr ""
until grep -q '^etcd: ' "$work/etcd.log"; do sleep 0.1; done
etcd=$(sed -n 's/^etcd: //p' "$work/etcd.log")
common=(--etcd "$etcd" --cluster push --log-level warn)
# shellcheck disable=SC2086
start manager manager --repo "$work/models" --admin-addr 127.0.0.1:$((port + 2)) --push-addr 127.0.0.1:$((port + 3)) "${common[@]}" ${MANAGER_FLAGS:-}
for i in $(seq 0 $((shards - 1))); do
  # shellcheck disable=SC2086
  start "shard-$i" shard --id "shard-$i" --repo "$work/models" --data-dir "$work/data-$i" "${common[@]}" ${shard_flags//%i/$i}
done
for i in 0 1; do
  # shellcheck disable=SC2086
  start "router-$i" router --grpc-addr 127.0.0.1:$((port + 10 * i + 1)) --http-addr 127.0.0.1:$((port + 10 * i)) "${common[@]}" ${router_flags//%i/$i}
done
for p in $port $((port + 10)); do
  until curl -sf "http://127.0.0.1:$p/v2/health/ready" > /dev/null; do sleep 0.2; done
done
echo "cluster ready: manager, $shards shards, 2 routers (separate processes); model bench, $params features in $partitions partitions"
ghz --insecure --call inference.GRPCInferenceService/ModelInfer --binary-file "$work/rank200.bin" \
  --disable-template-functions --disable-template-data -c 2 -z "$((duration * $(wc -w <<< "$runs") + 10))s" -O json 127.0.0.1:$((port + 1)) > "$work/ghz.json" 2> "$work/ghz.log" &
ghzpid=$!
routers=127.0.0.1:$((port + 1)),127.0.0.1:$((port + 11))
for run in $runs; do
  echo "== $run"
  case $run in
    freshness) "$C" bench push --push-addr 127.0.0.1:$((port + 3)) --routers "$routers" --model bench --key-space "$params" \
      --rate "${RATE:-10}" --keys "${KEYS:-1000}" --duration "${duration}s" ;;
    throughput) "$C" bench push --push-addr 127.0.0.1:$((port + 3)) --routers "$routers" --model bench --key-space "$params" \
      --producers 4 --rate 5 --keys 50000 --duration "${duration}s" ;;
  esac
done
wait $ghzpid || true
python3 - "$work/ghz.json" << 'PY'
import json, sys
d = json.load(open(sys.argv[1]))
codes = d.get("statusCodeDistribution", {})
ok = codes.get("OK", 0)
errs = d.get("errorDistribution") or {}
# ghz closes its connections when its time is up: the calls then under
# way fail on the client's side, not the server's.
cut = sum(n for e, n in errs.items() if "use of closed network connection" in e)
failed = sum(errs.values()) - cut
p99 = next((x["latency"] for x in d.get("latencyDistribution") or [] if x["percentage"] == 99), 0) / 1e6
print(f"rank200 meanwhile (ghz, concurrency 2): {d['count']} calls, {ok} OK, {failed} failed, {cut} cut by ghz's own stop; p99 {p99:.1f} ms")
for e, n in errs.items():
    if "use of closed network connection" not in e:
        print(f"  {n} × {e}")
PY
"$C" admin --addr 127.0.0.1:$((port + 2)) models
grep -h "level=ERROR" "$work"/*.log | head -5 || true
