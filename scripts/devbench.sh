# Shared by chain.sh and types.sh (sourced, not run): devbench serves one
# model repository with a fresh `cumulus dev` (binary $D, default $C),
# loads it from a separate `cumulus bench` process (rank200, closed loop
# at concurrency 4, $requests requests), appends one line to
# $work/runs.txt — NAME qps p50 p99 cpu/request errors peak-RSS, the CPU
# being the dev process's utime+stime per request and the peak its
# VmHWM — and stops the dev process. With $warm set, that many requests
# go first, unmeasured (caches learn the traffic).
#
#   devbench NAME REPO PORT [dev flags...]
# PORT is the first of three loopback ports (HTTP, gRPC, admin).
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null' EXIT
devbench() {
  local name=$1 repo=$2 port=$3
  shift 3
  : > "$work/dev.out" # before it starts: the wait for ready must not read the last run's
  "${D:-$C}" dev --repo "$repo" --http-addr 127.0.0.1:$port --grpc-addr 127.0.0.1:$((port + 1)) \
    --admin-addr 127.0.0.1:$((port + 2)) "$@" > "$work/dev.out" 2> "$work/dev.err" &
  pid=$!
  until grep -q '^ready' "$work/dev.out"; do kill -0 $pid; sleep 0.2; done
  if [ "${warm:-0}" -gt 0 ]; then
    "$C" bench --addr 127.0.0.1:$((port + 1)) --repo "$repo" --model bench --workload rank200 --log-level warn \
      --concurrency 4 --requests "$warm" --duration 10m > /dev/null
  fi
  local line
  line=$("$C" bench --addr 127.0.0.1:$((port + 1)) --repo "$repo" --model bench --workload rank200 --log-level warn \
    --concurrency 4 --requests "$requests" --duration 10m --pid $pid --settle 0 |
    awk -v name="$name" '
      /^rank200 .*requests=/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] } }
      /^rank200 .*cpu of pid/ { for (i = 1; i <= NF; i++) if ($i ~ /ms$/ && $(i+1) == "per") cpu = $i }
      END { printf "%-5s %s %s %s %s %s", name, f["qps"], f["p50"], f["p99"], cpu, f["errors"] }')
  echo "$line $(awk '/^VmHWM/ { printf "%.0fMiB", $2 / 1024 }' /proc/$pid/status)" | tee -a "$work/runs.txt"
  kill -INT $pid; wait $pid || true; pid=
}
