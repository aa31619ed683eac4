#!/usr/bin/env bash
# Peak memory of a model swap: the resident memory (VmRSS) of a
# `cumulus dev` process while version 2 of a 100M-parameter LR model
# replaces version 1. Prints steady memory before, the peak while v2 loads
# and commits (sampled every 100 ms), and steady memory after.
#
#   scripts/swap-memory.sh WORKDIR KEEP [cumulus dev flags...]
#   e.g. scripts/swap-memory.sh /tmp/swap 2 --memory-budget 1.4GB --shards 1
#
# The first run generates both versions in WORKDIR (about 2.5 GB, ~1.5
# minutes); CUMULUS names the binary (default: cumulus on PATH). With
# LOAD=1 it also runs rank200 closed-loop load (cumulus bench, 8 s) once
# before the swap and once from the moment version 2 is published, and
# prints both p99s.
set -euo pipefail
work=$1; keep=$2; shift 2
C=${CUMULUS:-cumulus}
repo=$work/models
if [ ! -d "$work/v2-held" ]; then
  mkdir -p "$repo"
  "$C" model gen --name big --type lr --params 100000000 --repo "$repo" > /dev/null
  "$C" model gen --name big --type lr --params 100000000 --seed 2 --repo "$repo" > /dev/null
  mv "$repo/big/2" "$work/v2-held"
fi
export CUMULUS_ADMIN_TOKEN=swap-memory
: > "$work/dev.out" # before it starts: the wait for ready must not read the last run's
"$C" dev --repo "$repo" --keep-versions "$keep" "$@" --http-addr 127.0.0.1:28000 --grpc-addr 127.0.0.1:28001 \
  --admin-addr 127.0.0.1:28002 > "$work/dev.out" 2> "$work/dev.err" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; [ -d "$repo/big/2" ] && mv "$repo/big/2" "$work/v2-held"' EXIT
until grep -q ready "$work/dev.out"; do kill -0 $pid; sleep 0.2; done
rss() { awk '/VmRSS/ {print $2}' /proc/$pid/status; }
live() { "$C" admin --addr 127.0.0.1:28002 --json models | python3 -c 'import json,sys; print(json.load(sys.stdin)["models"][0]["live"])'; }
sleep 3
before=$(rss)
load() { "$C" bench --addr 127.0.0.1:28001 --repo "$repo" --model big --workload rank200 --duration 8s 2>/dev/null | grep '^rank200'; }
if [ "${LOAD:-}" = 1 ]; then steady=$(load); fi
mv "$work/v2-held" "$repo/big/2"   # publish version 2
if [ "${LOAD:-}" = 1 ]; then load > "$work/during.out" & loader=$!; fi
"$C" admin --addr 127.0.0.1:28002 rescan > /dev/null
peak=0
t0=$(date +%s.%N)
until [ "$(live)" = 2 ]; do r=$(rss); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.1; done
t1=$(date +%s.%N)
for _ in $(seq 50); do r=$(rss); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.1; done
after=$(rss)
if [ "${LOAD:-}" = 1 ]; then wait $loader; echo "steady: $steady"; echo "swap:   $(cat "$work/during.out")"; fi
echo "$(grep 'memory budget' "$work/dev.out" || echo 'no memory budget'); keep-versions $keep"
echo "before ${before} kB, peak ${peak} kB, after ${after} kB; v2 live after $(python3 -c "print(round($t1-$t0,1))") s"
python3 -c "print(f'peak / before = {$peak/$before:.2f}x, after / before = {$after/$before:.2f}x')"
