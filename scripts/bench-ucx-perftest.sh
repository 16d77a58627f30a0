#!/usr/bin/env bash
# Bounce over the ucx engine vs ucx_perftest's put_bw at the same descriptor
# size and on the same UCX transport, alternated in one run so each pair is
# a side-by-side ratio. Needs ucx-utils (ucx_perftest) and bin/bounce.
# Usage: scripts/bench-ucx-perftest.sh [pairs] [desc-size-bytes]
set -euo pipefail
pairs=${1:-3}
size=${2:-4096}
export UCX_TLS=${UCX_TLS:-tcp}
port=$((20000 + RANDOM % 20000))
for i in $(seq 1 "$pairs"); do
  ucx_perftest -t ucp_put_bw -s "$size" -n 20000 -p "$port" >/dev/null 2>&1 &
  srv=$!
  sleep 1
  perf=$(ucx_perftest 127.0.0.1 -t ucp_put_bw -s "$size" -n 20000 -p "$port" 2>/dev/null | awk '/Final:/ {print $(NF-2)}')
  wait "$srv" || true
  port=$((port + 1))
  # bounce moves one 81,920-descriptor request of the same descriptor size.
  line=$(bin/bounce run --engine.kind ucx --compare=false --desc-size "$size" 2>/dev/null | awk '$1 == "bounce" && $2 != "run:" {print $6, $7}')
  mbs=$(echo "$line" | awk '{v=$1; if ($2=="GB/s") v*=1000; print v}')
  echo "pair $i: ucx_perftest put_bw ${perf} MB/s, bounce ${mbs} MB/s, ratio $(awk -v a="$mbs" -v b="$perf" 'BEGIN {printf "%.2f", a/b}')"
done
