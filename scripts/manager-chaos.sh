#!/usr/bin/env bash
# Kill -9 drill for the managers' raft group, on loopback: etcd (Debian's
# etcd-server), three managers in a raft group, two shards (replicas 2),
# a router under open-loop load (rank200, RATE a second, default 100).
# Each of CYCLES cycles (default 100): SIGKILL a manager chosen at random,
# ask the group for a change (cordon chaos-N) until one member
# acknowledges it, start the killed manager again from its directory,
# and wait until it is back in the group. At the end it checks that every
# acknowledged change is in the state, and prints the predict calls
# answered, failed and refused, and each cycle's time from the kill to
# the acknowledged change (leader failover when the leader was killed).
#
#   scripts/manager-chaos.sh WORKDIR
# CUMULUS names the binary (default: cumulus on PATH). Ports 33100-33199.
set -euo pipefail
work=$(realpath -m "$1")
C=$(command -v "${CUMULUS:-cumulus}")
cycles=${CYCLES:-100}
rate=${RATE:-100}
command -v etcd > /dev/null || { echo "manager-chaos: etcd is not installed (Debian: etcd-server)" >&2; exit 2; }
pids=()
cleanup() { kill -9 "${pids[@]}" ${mpid[@]+"${mpid[@]}"} 2> /dev/null || true; }
trap cleanup EXIT
trap 'exit 143' TERM INT
rm -rf "$work" && mkdir -p "$work/logs"
etcd --data-dir "$work/etcd" --listen-client-urls http://127.0.0.1:33100 --advertise-client-urls http://127.0.0.1:33100 \
  --listen-peer-urls http://127.0.0.1:33101 --initial-advertise-peer-urls http://127.0.0.1:33101 \
  --initial-cluster default=http://127.0.0.1:33101 > "$work/logs/etcd.log" 2>&1 &
pids+=($!)
E=http://127.0.0.1:33100
until curl -sf $E/health > /dev/null; do sleep 0.1; done
"$C" model gen --name ctr --params 200000 --partitions 8 --repo "$work/repo" > /dev/null 2>&1
for s in 0 1; do
  "$C" shard --id "s$s" --repo "$work/repo" --etcd $E --addr "127.0.0.1:3312$s" --data-dir "$work/s$s" > "$work/logs/s$s.log" 2>&1 &
  pids+=($!)
done
peers="m0=127.0.0.1:33110,m1=127.0.0.1:33111,m2=127.0.0.1:33112"
declare -a mpid
start_manager() {
  "$C" manager --repo "$work/repo" --replicas 2 --etcd $E --admin-token t --admin-addr "127.0.0.1:3313$1" \
    --raft-id "m$1" --raft-addr "127.0.0.1:3311$1" --raft-dir "$work/m$1" --raft-peers "$peers" >> "$work/logs/m$1.log" 2>&1 &
  mpid[$1]=$!
}
for i in 0 1 2; do start_manager $i; done
admin() { local i=$1; shift; "$C" admin "$@" --addr "127.0.0.1:3313$i" --admin-token t; }
"$C" router --etcd $E --grpc-addr 127.0.0.1:33140 --http-addr 127.0.0.1:33141 > "$work/logs/router.log" 2>&1 &
pids+=($!)
until curl -sf http://127.0.0.1:33141/v2/health/ready > /dev/null; do sleep 0.2; done
# members NAME: whether every manager lists all three with a leader.
whole() { admin "$1" managers 2> /dev/null | awk 'NR > 1 && $4 != "(no" { n++ } $4 == "leader" { l++ } END { exit !(n == 3 && l == 1) }'; }
until whole 0; do sleep 0.2; done

# The load: 5-second open-loop runs back to back until the cycles end.
(
  while [ ! -e "$work/stop" ]; do
    "$C" bench --addr 127.0.0.1:33140 --repo "$work/repo" --model ctr --workload rank200 --rate "$rate" --duration 5s \
      --timeout 1s --log-level warn >> "$work/logs/bench.out" 2>> "$work/logs/bench.err"
  done
) &
bench=$!
pids+=($bench)
sleep 2
: > "$work/acked"
: > "$work/cycles"
for n in $(seq "$cycles"); do
  victim=$((RANDOM % 3))
  role=$(admin "$victim" managers | awk -v id="m$victim" '$1 == id { print $4 }')
  t0=$(date +%s%N)
  kill -9 "${mpid[$victim]}"
  wait "${mpid[$victim]}" 2> /dev/null || true
  # Ask the others until one acknowledges (the leader; a follower answers 503).
  acked=
  while [ -z "$acked" ]; do
    for i in 0 1 2; do
      [ "$i" = "$victim" ] && continue
      if admin "$i" cordon "chaos-$n" > /dev/null 2>&1; then acked=$i; break; fi
    done
    [ -n "$acked" ] || sleep 0.05
  done
  t1=$(date +%s%N)
  echo "chaos-$n" >> "$work/acked"
  start_manager "$victim"
  until whole "$victim"; do sleep 0.1; done
  echo "$n m$victim $role $(((t1 - t0) / 1000000))" >> "$work/cycles"
  printf '\rcycle %d/%d: killed m%d (%s), change acknowledged by m%d %d ms after ' "$n" "$cycles" "$victim" "$role" "$acked" $(((t1 - t0) / 1000000))
done
echo
# Every acknowledged change is in the state, as each member shows it.
for i in 0 1 2; do
  admin "$i" shards > "$work/shards-m$i"
  while read -r c; do
    grep -q "^$c " "$work/shards-m$i" || { echo "manager-chaos: m$i lost the acknowledged cordon $c" >&2; exit 1; }
  done < "$work/acked"
done
echo "every acknowledged change ($(wc -l < "$work/acked")) is held by every member"
touch "$work/stop"
wait "$bench" || true
for r in leader follower; do
  awk -v r=$r '$3 == r { print $4 }' "$work/cycles" | sort -n | awk -v r=$r '{ v[NR] = $1 } END { if (NR)
    printf "%s killed: kill to acknowledged change median %d ms, p90 %d ms, max %d ms (%d cycles)\n", r, v[int((NR + 1) / 2)], v[int(NR * 0.9 + 0.5)], v[NR], NR }'
done
awk '/^rank200 .*offered=/ {
  for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
  offered += f["offered"]; fail += f["offered"] - f["ok"] - f["refused"]; refused += f["refused"]; runs++
  p = f["p99"]; ms = p + 0; if (p ~ /µs$/) ms /= 1000; else if (p ~ /[^m]s$/) ms *= 1000
  if (ms > worst) { worst = ms; worstp = p } }
END {
  printf "predict: %d offered in %d runs of 5 s, %d failed, %d refused (overload); the worst run'"'"'s p99 %s\n", offered, runs, fail, refused, worstp
  exit fail > 0 || runs == 0 }' "$work/logs/bench.out"
