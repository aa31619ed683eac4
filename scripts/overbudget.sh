#!/usr/bin/env bash
# Storage III end to end: a generated LR model (PARAMS features, default
# 30,000,000, in PARTITIONS partitions, default 16) served by a fresh
# `cumulus dev` of SHARDS shards (default 4), once resident (no budget)
# and from disk, each shard's --memory-budget 1/RATIO (default 4) of
# the bytes it is assigned: "disk" reading through io_uring (the
# default), "pread" with --disk-reads pread. Load comes from a separate `cumulus bench`
# process: rank200 (Zipf ids), closed loop at concurrency 4, WARM
# requests unmeasured (default 2,000: the value caches learn), then
# REQUESTS measured (default 3,000); ROUNDS rounds (default 3), the
# setups' order reversed each round. It prints every run (setup qps p50
# p99 cpu/request errors peak-RSS), each setup's medians and the disk
# run's p99 over the resident one's.
#
#   scripts/overbudget.sh WORKDIR
# CUMULUS names the binary (default: cumulus on PATH).
set -euo pipefail
work=$1
C=${CUMULUS:-cumulus}
rounds=${ROUNDS:-3}
requests=${REQUESTS:-3000}
warm=${WARM:-2000}
params=${PARAMS:-30000000}
partitions=${PARTITIONS:-16}
shards=${SHARDS:-4}
ratio=${RATIO:-4}
mkdir -p "$work"
[ -d "$work/repo/bench" ] || "$C" model gen --name bench --type lr --params "$params" --partitions "$partitions" --repo "$work/repo" > /dev/null 2>&1
model=$(du -sb "$work/repo/bench" | cut -f1)
budget=$((model / shards / ratio))
echo "model: $params LR features, $partitions partitions, $((model >> 20)) MiB; $shards shards, each budget $((budget >> 20)) MiB (1/$ratio of its share)"
. "$(dirname "$0")/devbench.sh"
: > "$work/runs.txt"
echo "setup qps p50 p99 cpu/request errors peak-RSS"
order="resident disk pread"
for _ in $(seq "$rounds"); do
  for s in $order; do
    case $s in
      resident) devbench resident "$work/repo" 29130 --shards "$shards" --memory-budget 0 ;;
      disk) devbench disk "$work/repo" 29130 --shards "$shards" --memory-budget "$budget" ;;
      pread) devbench pread "$work/repo" 29130 --shards "$shards" --memory-budget "$budget" --disk-reads pread ;;
    esac
  done
  order=$(echo $order | awk '{ for (i = NF; i > 0; i--) printf "%s%s", $i, (i > 1 ? " " : "") }')
done
awk "$(cat "$(dirname "$0")/median.awk")"'
{ runs++; setup[runs] = $1; val[runs, "qps"] = $2; val[runs, "p50"] = ms($3); val[runs, "p99"] = ms($4); val[runs, "cpu"] = ms($5); val[runs, "err"] = $6; val[runs, "rss"] = $7 + 0 }
END {
  printf "\nmedian of %d rounds  qps      p50      p99   cpu/request  peak RSS\n", '"$rounds"'
  n = split("resident disk pread", names, " ")
  for (k = 1; k <= n; k++) printf "%-9s %10.0f %6.2fms %6.2fms %9.3fms %7dMiB\n", names[k], median(names[k], "qps"), median(names[k], "p50"), median(names[k], "p99"), median(names[k], "cpu"), median(names[k], "rss")
  printf "disk p99 / resident p99: %.2f× (io_uring), %.2f× (pread); budgets %d MiB in all\n", median("disk", "p99") / median("resident", "p99"), median("pread", "p99") / median("resident", "p99"), '"$((budget * shards >> 20))"'
}' "$work/runs.txt"
