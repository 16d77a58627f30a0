#!/bin/bash
# issue #26: the receiver checks' cost (the per-run DATA check and the
# revocation fence) on a quiet machine: BenchmarkReceiverChecks moves
# 81,920 x 4 KiB and 36,864 x 2 KiB fragmented transfers over the bounce
# path between two authenticated tcp + zmq agents, checks on and off in
# adjacent transfers of one binary (goal: checked/unchecked >= 0.97 in
# throughput, i.e. <= 1.03 in time). Host CPU only; no GPU is used.
#
# Build first on the development box (docs/bench/device/issue26/build.sh),
# then run from the checkout's root with .gpu/issue26 carried. Every step
# has its own timeout and the whole run a budget (LIMIT seconds); each
# writes $OUT/<step>.txt, the step log $OUT/log.txt.
START=$SECONDS; F=.gpu/issue26; L=$OUT/log.txt
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-$PWD/$F/lib}
T=${T:-$PWD/$F/pipeline.test} # or another build of the same commit (T=...)
LIMIT=${LIMIT:-560}
{ date -u; cat $F/COMMIT; nproc; uptime; lscpu | grep -E 'Model name|^CPU\(s\)'; } > $L 2>&1
step() { local f=$1 tmo=$2; shift 2; local left=$((LIMIT - (SECONDS - START)))
  if [ $left -lt 10 ]; then echo "skipped (budget): $*" >> $OUT/$f.txt; echo "$f skipped (budget): $*" >> $L; return; fi
  [ $tmo -gt $left ] && tmo=$left
  echo "\$ $*" >> $OUT/$f.txt
  timeout -k 5 $tmo "$@" >> $OUT/$f.txt 2>&1; local rc=$?
  echo "rc=$rc at $((SECONDS - START))s" >> $OUT/$f.txt; echo "$f rc=$rc at $((SECONDS - START))s: $*" >> $L; }
# The pipeline package's tests run from its directory (testdata).
cd pipeline 2>/dev/null || true
# 1. the check alone: ns per run, allocations
step datacheck 30 $T -test.run '^$' -test.bench '^BenchmarkDataCheck$' -test.benchmem -test.count 3
# 2. checks on/off, 100 adjacent pairs per size (BENCHTIME), three times (COUNT) (each line
#    reports checked-MB/s, unchecked-MB/s, checked/unchecked and the median
#    of the pairs' ratios)
step receiver-checks 480 $T -test.run '^$' -test.bench '^BenchmarkReceiverChecks$' -test.benchtime ${BENCHTIME:-100x} -test.count ${COUNT:-3} -test.timeout 470s
uptime >> $L
echo "done at $((SECONDS - START))s" >> $L
