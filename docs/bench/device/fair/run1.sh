#!/bin/bash
# fair (#18 part 4, #15 tail) device run 1: c128 burst and closed loop, main vs new,
# one request main vs new, and a CPU profile of the in-process tcp pipeline bench.
START=$SECONDS; G=/tmp/fairrun; mkdir -p $G && tar xzf .gpu/fair/bin.tgz -C $G
export LD_LIBRARY_PATH=$G/lib UCX_MODULE_DIR=$G/lib/ucx
N=$G/bin/bounce-new; M=$G/bin/bounce-main
R=$OUT/r; mkdir -p $R
W=llama70b-tp8-b16,gptoss120b-tp8-b16
LIMIT=${LIMIT:-200}
t() { local name=$1 tmo=$2; shift 2; local left=$((LIMIT - (SECONDS - START)))
  if [ $left -lt 8 ]; then echo "$name skipped (budget)" >> $R/log.txt; return; fi
  [ $tmo -gt $left ] && tmo=$left
  echo "\$ $* (load $(cut -d' ' -f1 /proc/loadavg))" > $R/$name.txt
  timeout $tmo "$@" --json $R/$name.json >> $R/$name.txt 2>&1; echo "$name rc=$? at $((SECONDS-START))s" >> $R/log.txt; }
nproc > $R/log.txt; uptime >> $R/log.txt
t burst-main 25 $M bench --workload llama70b-tp8-b16 --count 4096 --concurrency 128 --routes bounce,bulk --repeat 3
t burst-new 25 $N bench --workload llama70b-tp8-b16 --count 4096 --concurrency 128 --routes bounce,bulk --repeat 3
t loop-new 45 $N bench --workload llama70b-tp8-b16 --count 4096 --concurrency 128 --generations 3 --routes bounce,bulk --repeat 2 --max-bytes 7GiB
t loop-main 45 $M bench --workload llama70b-tp8-b16 --count 4096 --concurrency 128 --generations 3 --routes bounce,bulk --repeat 2 --max-bytes 7GiB
t c1-new 20 $N bench --workload $W --concurrency 1 --routes bounce,direct,bulk --repeat 3
t c1-main 20 $M bench --workload $W --concurrency 1 --routes bounce,direct,bulk --repeat 3
left=$((LIMIT - (SECONDS - START)))
if [ $left -gt 10 ]; then
  timeout $((left-2)) $G/bin/pipeline.test -test.run '^$' -test.bench 'BenchmarkEngineMatrix/tcp/81920x4KiB' -test.benchtime 6x \
    -test.cpuprofile $R/cpu-tcp81920.prof > $R/profile.txt 2>&1; echo "profile rc=$? at $((SECONDS-START))s" >> $R/log.txt
fi
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
