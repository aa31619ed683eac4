#!/usr/bin/env bash
# Publication → served with separate processes: a manager, SHARDS shards
# and two routers (default flags), each its own process, on loopback;
# `cumulus bench freshness` publishes DELTAS deltas of KEYS keys into the
# repository and times each until both routers answer from it.
#
#   scripts/freshness.sh WORKDIR [DELTAS [KEYS [PARAMS [SHARDS]]]]
#   e.g. scripts/freshness.sh /tmp/fresh 20 1000000 10000000 4
#
# The etcd is a `cumulus dev` with an empty repository (its own cluster
# name, so it never sees these processes). CUMULUS names the binary
# (default: cumulus on PATH); PARTITIONS the model's partitions (default
# 8); MANAGER_FLAGS more manager flags (e.g. "--auto-prune 5");
# CONCURRENCY the rank200 callers meanwhile (default 2). Logs go
# to WORKDIR/*.log. At the end it prints the sizes of what etcd holds for
# the model (the manager's state and the serving map record) and the
# repository's version count, and rolls back once through the admin API.
set -euo pipefail
work=$(realpath -m "$1"); deltas=${2:-20}; keys=${3:-1000000}; params=${4:-10000000}; shards=${5:-4}
C=${CUMULUS:-cumulus}
port=${PORT:-28100} # routers on PORT+1 and PORT+11 (gRPC), PORT and PORT+10 (HTTP); the manager's admin API on PORT+2
rm -rf "$work"; mkdir -p "$work/models" "$work/empty"
"$C" model gen --name bench --type lr --params "$params" --partitions "${PARTITIONS:-8}" --repo "$work/models" > /dev/null
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
start() { local log=$1; shift; "$C" "$@" > "$work/$log.log" 2>&1 & pids+=($!); }
export CUMULUS_ADMIN_TOKEN=freshness
start etcd dev --repo "$work/empty" --shards 1 --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0
until grep -q '^etcd: ' "$work/etcd.log"; do sleep 0.1; done
etcd=$(sed -n 's/^etcd: //p' "$work/etcd.log")
common=(--etcd "$etcd" --cluster fresh --log-level warn)
# shellcheck disable=SC2086
start manager manager --repo "$work/models" --admin-addr 127.0.0.1:$((port + 2)) "${common[@]}" ${MANAGER_FLAGS:-}
for i in $(seq 0 $((shards - 1))); do
  start "shard-$i" shard --id "shard-$i" --repo "$work/models" --data-dir "$work/data-$i" "${common[@]}"
done
start router-0 router --grpc-addr 127.0.0.1:$((port + 1)) --http-addr 127.0.0.1:$port "${common[@]}"
start router-1 router --grpc-addr 127.0.0.1:$((port + 11)) --http-addr 127.0.0.1:$((port + 10)) "${common[@]}"
for p in $port $((port + 10)); do
  until curl -sf "http://127.0.0.1:$p/v2/health/ready" > /dev/null; do sleep 0.2; done
done
echo "cluster ready: manager, $shards shards, 2 routers (separate processes); model bench, $params features"
(cd "$(dirname "$0")/.." && go build -o "$work/etcdget" ./scripts/etcdget)
revision() { "$work/etcdget" -rev "$etcd" /cumulus/fresh/models/bench | sed -n 's/.* revision \([0-9]*\),.*/\1/p'; }
rev0=$(revision)
"$C" bench freshness --addr 127.0.0.1:$((port + 1)),127.0.0.1:$((port + 11)) --repo "$work/models" --model bench \
  --deltas "$deltas" --keys "$keys" --concurrency "${CONCURRENCY:-2}" 2>/dev/null | tee "$work/fresh.out" | grep -v '^version [0-9]*: ' || true
rev1=$(revision)
echo "etcd: $(( (rev1 - rev0) / deltas )) revisions (writes) per delta; what the manager keeps for the model:"
"$work/etcdget" "$etcd" /cumulus/fresh/manager/models/bench /cumulus/fresh/models/bench
echo "repository: $(ls "$work/models/bench" | grep -c '^[0-9]*$') version directories"
"$C" admin --addr 127.0.0.1:$((port + 2)) models
"$C" admin --addr 127.0.0.1:$((port + 2)) rollback bench
