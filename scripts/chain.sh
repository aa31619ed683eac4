#!/usr/bin/env bash
# A long chain against one full version (Storage II's chain-length
# target): the same generated LR model (PARAMS features, default
# 10,000,000, in 8 partitions) served by a fresh `cumulus dev` once as
# its full version and once with DELTAS deltas (default 200) of KEYS
# features (default 1,000) on it, nothing compacted (--compact-after 0).
# Load comes from a separate `cumulus bench` process: rank200, closed
# loop at concurrency 4, REQUESTS requests (default 6,000), ROUNDS
# rounds (default 5), the setups' order reversed each round. It prints
# every run, then each setup's median QPS, p50, p99 and server CPU per
# request (utime+stime of the dev process) and the ratio of the chain's
# CPU to the full version's.
#
#   scripts/chain.sh WORKDIR
# CUMULUS names the binary (default: cumulus on PATH); DEV, if set, the
# one that serves (to compare builds, another than the one that loads);
# SETUPS the setups run, default "full chain".
set -euo pipefail
work=$1
C=${CUMULUS:-cumulus}
D=${DEV:-$C}
rounds=${ROUNDS:-5}
requests=${REQUESTS:-6000}
params=${PARAMS:-10000000}
deltas=${DELTAS:-200}
keys=${KEYS:-1000}
mkdir -p "$work"
[ -d "$work/full/bench" ] || "$C" model gen --name bench --type lr --params "$params" --repo "$work/full" > /dev/null 2>&1
[ -d "$work/chain/bench" ] || "$C" model gen --name bench --type lr --params "$params" --repo "$work/chain" \
  --deltas "$deltas" --delta-keys "$keys" > /dev/null 2>&1
. "$(dirname "$0")/devbench.sh"
: > "$work/runs.txt"
echo "setup qps p50 p99 cpu/request errors"
# The order alternates from round to round: this machine drifts, and
# whichever setup always ran second would pay for it.
order=${SETUPS:-full chain}
for _ in $(seq "$rounds"); do
  for s in $order; do devbench "$s" "$work/$s" 29030 --compact-after 0; done
  order=$(echo $order | awk '{ for (i = NF; i > 0; i--) printf "%s%s", $i, (i > 1 ? " " : "") }')
done
awk "$(cat "$(dirname "$0")/median.awk")"'
{ runs++; setup[runs] = $1; val[runs, "qps"] = $2; val[runs, "p50"] = ms($3); val[runs, "p99"] = ms($4); val[runs, "cpu"] = ms($5) }
END {
  printf "\nmedian of %d rounds  qps      p50      p99   cpu/request  x full\n", '"$rounds"'
  full = median("full", "cpu")
  n = split("'"${SETUPS:-full chain}"'", names, " ")
  for (k = 1; k <= n; k++) printf "%-5s %14.0f %6.2fms %6.2fms %9.3fms %6.3f\n", names[k], median(names[k], "qps"), median(names[k], "p50"), median(names[k], "p99"), median(names[k], "cpu"), median(names[k], "cpu") / full
}' "$work/runs.txt"
