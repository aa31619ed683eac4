#!/usr/bin/env bash
# The model types side by side: one generated model of each type (PARAMS
# features, default 1,000,000: LR; FM dim 8; FFM 20 fields of dim 4; DNN
# 20 fields of dim 16, hidden layers 256,128), each served by a fresh
# `cumulus dev`, loaded through its gRPC front by a separate `cumulus
# bench` process: rank200, closed loop at concurrency 4, REQUESTS requests
# (default 5000), ROUNDS alternating rounds (default 3). It prints every
# run, then each type's median QPS, p50, p99 and server CPU per request
# (utime+stime of the dev process), and the CPU ratio to LR's.
# --encoding stores the factors (FM, FFM, DNN embeddings) as fp32
# (default), fp16 or int8; LR has none to store.
#
#   scripts/types.sh [--encoding fp32|fp16|int8] WORKDIR
# CUMULUS names the binary (default: cumulus on PATH).
set -euo pipefail
enc=fp32
if [ "${1:-}" = --encoding ]; then
  enc=$2
  shift 2
fi
case $enc in fp32 | fp16 | int8) ;; *) echo "types.sh: --encoding $enc: want fp32, fp16 or int8" >&2; exit 2 ;; esac
work=$1/$enc
C=${CUMULUS:-cumulus}
rounds=${ROUNDS:-3}
requests=${REQUESTS:-5000}
params=${PARAMS:-1000000}
mkdir -p "$work"
declare -A shape=(
  [lr]="--type lr"
  [fm]="--type fm --dim 8"
  [ffm]="--type ffm --fields 20 --dim 4"
  [dnn]="--type dnn --fields 20 --dim 16 --layers 256,128"
)
types="lr fm ffm dnn"
for t in $types; do
  if [ ! -d "$work/$t/bench" ]; then
    # shellcheck disable=SC2086
    "$C" model gen --name bench ${shape[$t]} --encoding "$enc" --params "$params" --repo "$work/$t" > /dev/null 2>&1
  fi
done
. "$(dirname "$0")/devbench.sh"
: > "$work/runs.txt"
echo "type qps p50 p99 cpu/request errors"
for _ in $(seq "$rounds"); do
  for t in $types; do devbench "$t" "$work/$t" 29020; done
done
# Medians per type; durations are printed by Go (µs, ms or s).
awk -v enc="$enc" "$(cat "$(dirname "$0")/median.awk")"'
{ runs++; setup[runs] = $1; val[runs, "qps"] = $2; val[runs, "p50"] = ms($3); val[runs, "p99"] = ms($4); val[runs, "cpu"] = ms($5) }
END {
  split("lr fm ffm dnn", names, " ")
  printf "\n%s factors, median of %d rounds  qps      p50      p99   cpu/request  x LR\n", enc, runs / 4
  lr = median("lr", "cpu")
  for (k = 1; k <= 4; k++) printf "%-4s %14.0f %6.2fms %6.2fms %9.3fms %6.2f\n", names[k], median(names[k], "qps"), median(names[k], "p50"), median(names[k], "p99"), median(names[k], "cpu"), median(names[k], "cpu") / lr
}' "$work/runs.txt"
