#!/usr/bin/env bash
# What mutual TLS costs: `cumulus dev` (4 shards, replicas 1) serving an
# LR model of 1,000,000 features, rank200 through the gRPC front, closed
# loop at concurrency 4 for REQUESTS requests (default 20000) from a
# separate bench process, in two setups a fresh dev process each,
# alternating for ROUNDS rounds (default 3):
#
#   plaintext   cumulus dev
#   tls         cumulus dev --tls: router and shards mutual TLS, the front
#               over TLS, the bench a TLS client
#
# It prints every run, the medians and the ratios tls / plaintext.
#
#   scripts/tls.sh WORKDIR
# CUMULUS names the binary (default: cumulus on PATH).
set -euo pipefail
work=$1
C=${CUMULUS:-cumulus}
rounds=${ROUNDS:-3}
requests=${REQUESTS:-20000}
repo=$work/models
mkdir -p "$work"
if [ ! -d "$repo/bench" ]; then
  "$C" model gen --name bench --type lr --params 1000000 --repo "$repo" > /dev/null
fi
export CUMULUS_ADMIN_TOKEN=tls
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null' EXIT
run() { # name, dev flags...
  local name=$1; shift
  : > "$work/dev.out" # before it starts: the wait for ready must not read the last run's
  "$C" dev --repo "$repo" "$@" --http-addr 127.0.0.1:29050 --grpc-addr 127.0.0.1:29051 \
    --admin-addr 127.0.0.1:29052 --log-level warn > "$work/dev.out" 2> "$work/dev.err" &
  pid=$!
  until grep -q '^ready' "$work/dev.out"; do kill -0 $pid; sleep 0.2; done
  # dev --tls prints the client's flags on its "tls:" line.
  local tls
  tls=$(awk '/^tls: / { sub(/^tls: /, ""); print }' "$work/dev.out")
  # shellcheck disable=SC2086
  "$C" bench --addr 127.0.0.1:29051 --repo "$repo" --model bench --workload rank200 --log-level warn \
    --concurrency 4 --requests "$requests" --duration 10m $tls |
    awk -v name="$name" '/^rank200 .*requests=/ {
      for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      printf "%-10s %s %s %s %s %s\n", name, f["qps"], f["p50"], f["p99"], f["p999"], f["errors"] }' | tee -a "$work/runs.txt"
  kill -INT $pid; wait $pid || true; pid=
}
: > "$work/runs.txt"
echo "setup      qps p50 p99 p99.9 errors"
for _ in $(seq "$rounds"); do
  run plaintext
  run tls --tls
done
awk "$(cat "$(dirname "$0")/median.awk")"'
{ runs++; setup[runs] = $1; val[runs, "qps"] = $2; val[runs, "p50"] = ms($3); val[runs, "p99"] = ms($4) }
END {
  printf "\nmedian of %d rounds  qps      p50      p99\n", runs / 2
  split("plaintext tls", names, " ")
  for (k = 1; k <= 2; k++) printf "%-10s %9.0f %7.2fms %7.2fms\n", names[k], median(names[k], "qps"), median(names[k], "p50"), median(names[k], "p99")
  printf "\ntls / plaintext: qps %.3fx, p50 %.3fx, p99 %.3fx\n", median("tls", "qps") / median("plaintext", "qps"), median("tls", "p50") / median("plaintext", "p50"), median("tls", "p99") / median("plaintext", "p99")
}' "$work/runs.txt"
