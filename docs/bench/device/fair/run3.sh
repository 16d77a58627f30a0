#!/bin/bash
# fair device run 3: 4 MiB chunks with W=16 vs the defaults, one request (alternated) and at c128 (new binary).
START=$SECONDS; G=/tmp/fairrun; mkdir -p $G && tar xzf .gpu/fair/bin.tgz -C $G
export LD_LIBRARY_PATH=$G/lib UCX_MODULE_DIR=$G/lib/ucx
N=$G/bin/bounce-new
R=$OUT/r; mkdir -p $R
W=llama70b-tp8-b16,gptoss120b-tp8-b16
LIMIT=${LIMIT:-90}
t() { local name=$1 tmo=$2; shift 2; local left=$((LIMIT - (SECONDS - START)))
  if [ $left -lt 8 ]; then echo "$name skipped (budget)" >> $R/log.txt; return; fi
  [ $tmo -gt $left ] && tmo=$left
  echo "\$ $* (load $(cut -d' ' -f1 /proc/loadavg))" > $R/$name.txt
  timeout $tmo "$@" --json $R/$name.json >> $R/$name.txt 2>&1; echo "$name rc=$? at $((SECONDS-START))s" >> $R/log.txt; }
nproc > $R/log.txt; uptime >> $R/log.txt
C1="bench --workload $W --concurrency 1 --routes bounce,bulk --repeat 5"
X="--bounce.max-chunk 4MiB --bounce.max-inflight 16"
t a-c4w16 12 $N $C1 $X
t a-default 12 $N $C1
t b-c4w16 12 $N $C1 $X
t b-default 12 $N $C1
t a-c4w8 12 $N $C1 --bounce.max-chunk 4MiB
t burst-c4w16 18 $N bench --workload llama70b-tp8-b16 --count 4096 --concurrency 128 --routes bounce,bulk --repeat 3 $X
t loop-c4w16 30 $N bench --workload llama70b-tp8-b16 --count 4096 --concurrency 128 --generations 3 --routes bounce,bulk --repeat 2 --max-bytes 7GiB $X
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
