#!/bin/bash
# perf (#18) device run: tcp one request new vs main, 128 concurrent, route auto matrix (tcp, ucx), NIXL.
START=$SECONDS; G=/tmp/perfrun; mkdir -p $G && tar xzf .gpu/perf/bin.tgz -C $G
export LD_LIBRARY_PATH=$G/lib UCX_MODULE_DIR=$G/lib/ucx NIXL_PLUGIN_DIR=$G/lib/plugins
N=$G/bin/bounce-new; M=$G/bin/bounce-main; X=$G/bin/bounce-nixl
W=llama70b-tp8-b16,gptoss120b-tp8-b16
P8=llama70b-tp8-b16,llama70b-tp8-b32,llama70b-tp8-b64,gptoss120b-tp8-b16,gptoss120b-tp8-b32,gptoss120b-tp8-b64
LIMIT=${LIMIT:-170}
t() { local name=$1 tmo=$2; shift 2; local left=$((LIMIT - (SECONDS - START)))
  if [ $left -lt 8 ]; then echo "$name skipped (budget)" >> $OUT/log.txt; return; fi
  [ $tmo -gt $left ] && tmo=$left
  echo "\$ $*" > $OUT/$name.txt
  timeout $tmo "$@" --json $OUT/$name.json >> $OUT/$name.txt 2>&1; echo "$name rc=$? at $((SECONDS-START))s" >> $OUT/log.txt; }
nproc > $OUT/log.txt; uptime >> $OUT/log.txt
t c1-new 30 $N bench --workload $W --concurrency 1 --routes bounce,direct,bulk --repeat 5
t c1-main 30 $M bench --workload $W --concurrency 1 --routes bounce,direct,bulk --repeat 5
t c1-new-min2m 30 $N bench --workload $W --concurrency 1 --routes bounce,direct,bulk --repeat 5 --bounce.min-chunk 2MiB
t c128-burst 30 $N bench --workload $W --count 4096 --concurrency 128 --routes bounce,direct,bulk --repeat 3
t c128-loop 40 $N bench --workload llama70b-tp8-b16 --count 4096 --concurrency 128 --generations 3 --routes bounce,bulk --repeat 2 --max-bytes 7GiB
t route-tcp 30 $N bench --workload $P8 --concurrency 1 --routes bounce,direct,auto --repeat 3 --bounce.cost-model=true
t route-ucx 40 $N bench --engine.kind ucx --workload $P8 --concurrency 1 --routes bounce,direct,auto --repeat 3 --bounce.cost-model=true
t route-tcp-main 30 $M bench --workload $P8 --concurrency 1 --routes bounce,direct,auto --repeat 3 --bounce.cost-model=true
t nixl-zmq 30 $X bench --engine.kind nixl --control-plane.kind zmq --workload $W --concurrency 1 --routes bounce,direct,bulk --repeat 3
t nixl-notif 30 $X bench --engine.kind nixl --control-plane.kind nixlnotif --workload $W --concurrency 1 --routes bounce,direct,bulk --repeat 3
