#!/bin/bash
# issue #29 (pull) device run: binaries from build.sh (.gpu/issue29/bin.txz:
# bin/bounce, bin/node.test, bin/pipeline.test, lib/, lib/ucx), run from the
# checkout's root with .gpu/issue29 carried. Pull against push, same
# workload, same engine, measured side by side (bench --routes bounce,pull:
# the pull/bounce ratio; goal >= 0.95): tcp and ucx on host memory, device
# KV over tcp; then the GPU pull tests (device memory byte-exact: cudacopy
# and device KV over tcp) and the pull conformance rules on cudacopy. Every
# step has its own timeout and the run a budget (LIMIT seconds); each writes
# $OUT/<step>.txt, the bench JSON comes back in $OUT/json.tgz, the step log
# in $OUT/log.txt. Pull by READ against pull by write (issue #29's READ
# part): step 7 runs BenchmarkPullReadVsWrite (push, pull by write, pull by
# read side by side, tcp on host memory), step 8 the bench CLI's pull row
# with bounce.pull_read off (step 1's pull row reads: auto is the default),
# step 9 the same for device KV over tcp (beside step 3).
# STEPS="pull-read-bench pull-write" runs only the steps named (all when
# unset), e.g. to fit them in one device command after the others.
START=$SECONDS; F=.gpu/issue29; G=/tmp/issue29; mkdir -p $G/json
tar xJf $F/bin.txz -C $G || { echo "unpack failed" > $OUT/log.txt; exit 1; }
export LD_LIBRARY_PATH=$G/lib UCX_MODULE_DIR=$G/lib/ucx BOUNCETEST_CLI=$G/bin/bounce
B=$G/bin/bounce; N=$G/bin/node.test; P=$G/bin/pipeline.test; J=$G/json; L=$OUT/log.txt
W=llama70b-tp8-b16,gptoss120b-tp8-b16
LIMIT=${LIMIT:-560}
{ date -u; cat $F/COMMIT; nvidia-smi -L; nproc; uptime; } > $L 2>&1
step() { local f=$1 tmo=$2; shift 2; local left=$((LIMIT - (SECONDS - START)))
  if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $f "* ]]; then return; fi
  if [ $left -lt 10 ]; then echo "skipped (budget): $*" >> $OUT/$f.txt; echo "$f skipped (budget): $*" >> $L; return; fi
  [ $tmo -gt $left ] && tmo=$left
  echo "\$ $*" >> $OUT/$f.txt
  timeout -k 5 $tmo "$@" >> $OUT/$f.txt 2>&1; local rc=$?
  echo "rc=$rc at $((SECONDS - START))s" >> $OUT/$f.txt; echo "$f rc=$rc at $((SECONDS - START))s: $*" >> $L; RC=$rc; }
# forms: a bench step with --form blocks,descs; if it fails, once more in the descriptor form alone
forms() { local f=$1 tmo=$2; shift 2; RC=0; step $f $tmo "$@" --form blocks,descs; [ $RC -ne 0 ] && step $f $tmo "$@"; }
# 1. host KV over tcp: pull beside push, one request and 8 concurrent
forms host-tcp 110 $B bench --workload $W --concurrency 1,8 --routes bounce,pull --repeat ${REPEAT:-5} --json $J/host-tcp.json
# 2. host KV over ucx
forms host-ucx 170 $B bench --engine.kind ucx --workload $W --concurrency 1,8 --routes bounce,pull --repeat ${REPEAT:-5} --json $J/host-ucx.json
# 3. device KV over tcp (two processes, pinned-host arenas, cuda stages)
forms devkv-tcp 120 $B bench --memory device --workload $W --concurrency 1 --routes bounce,pull --repeat ${REPEAT:-5} --json $J/devkv-tcp.json
# 4. device memory byte-exact: pulls over cudacopy (device arenas) and device KV over tcp
step gpu-tests 90 $N -test.run 'TestGPUPullByteExact' -test.v -test.timeout 85s
# 5. the pipeline's pull tests on the 16-CPU host (host memory, inproc and tcp+zmq)
step pull-tests 60 $P -test.run 'TestPull' -test.timeout 55s
# 6. the pull conformance rules on cudacopy (they run on host memory: two agents over the engines)
step conformance 60 $B conformance engine --builtin cudacopy --memory host
# 7. pull by read vs pull by write vs push, one run, same workload (tcp, host memory): read/write and read/push ratios
step pull-read-bench 120 $P -test.run '^$' -test.bench 'BenchmarkPullReadVsWrite' -test.benchtime 10x -test.count 3 -test.timeout 115s
# 8. the bench CLI's pull row written, not read (bounce.pull_read off at the puller), to set beside step 1's
forms pull-write 110 $B bench --bounce.pull-read off --workload $W --concurrency 1,8 --routes bounce,pull --repeat ${REPEAT:-5} --json $J/host-tcp-pullwrite.json
# 9. device KV over tcp with bounce.pull_read off (the holder writes), to set beside step 3's reads
forms devkv-pullwrite 120 $B bench --memory device --bounce.pull-read off --workload $W --concurrency 1 --routes bounce,pull --repeat ${REPEAT:-5} --json $J/devkv-tcp-pullwrite.json
tar czf $OUT/json.tgz -C $G json
echo "done at $((SECONDS - START))s" >> $L
