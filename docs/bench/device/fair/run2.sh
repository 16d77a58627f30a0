#!/bin/bash
# fair device run 2: one-request configuration sweep (new binary, bounce vs bulk side by side in each run),
# a second c128 burst sample main vs new, and #15's device-KV closed loop main vs new.
START=$SECONDS; G=/tmp/fairrun; mkdir -p $G && tar xzf .gpu/fair/bin.tgz -C $G
export LD_LIBRARY_PATH=$G/lib UCX_MODULE_DIR=$G/lib/ucx
N=$G/bin/bounce-new; M=$G/bin/bounce-main
R=$OUT/r; mkdir -p $R
W=llama70b-tp8-b16,gptoss120b-tp8-b16
LIMIT=${LIMIT:-150}
t() { local name=$1 tmo=$2; shift 2; local left=$((LIMIT - (SECONDS - START)))
  if [ $left -lt 8 ]; then echo "$name skipped (budget)" >> $R/log.txt; return; fi
  [ $tmo -gt $left ] && tmo=$left
  echo "\$ $* (load $(cut -d' ' -f1 /proc/loadavg))" > $R/$name.txt
  timeout $tmo "$@" --json $R/$name.json >> $R/$name.txt 2>&1; echo "$name rc=$? at $((SECONDS-START))s" >> $R/log.txt; }
nproc > $R/log.txt; uptime >> $R/log.txt
C1="bench --workload $W --concurrency 1 --routes bounce,bulk --repeat 5"
t s-default 15 $N $C1
t s-w16 15 $N $C1 --bounce.max-inflight 16
t s-conn8 15 $N $C1 --engine.connections 8
t s-scat8 15 $N $C1 --bounce.scatter-workers 8
t s-copy16 15 $N $C1 --bounce.copy-workers 16
t s-c4w16 15 $N $C1 --bounce.max-chunk 4MiB --bounce.max-inflight 16
t s-min2w16 15 $N $C1 --bounce.min-chunk 2MiB --bounce.max-inflight 16
t s-default2 15 $N $C1
t dev-loop-new 25 $N bench --memory device --workload llama70b-tp8-b16 --count 4096 --concurrency 128 --generations 3 --routes bounce --repeat 2 --max-bytes 7GiB
t dev-loop-main 25 $M bench --memory device --workload llama70b-tp8-b16 --count 4096 --concurrency 128 --generations 3 --routes bounce --repeat 2 --max-bytes 7GiB
t burst2-new 18 $N bench --workload llama70b-tp8-b16 --count 4096 --concurrency 128 --routes bounce,bulk --repeat 3
t burst2-main 18 $M bench --workload llama70b-tp8-b16 --count 4096 --concurrency 128 --routes bounce,bulk --repeat 3
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
