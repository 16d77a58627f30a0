#!/bin/bash
# issue #28, layout conversion (branch layout, with layoutgpu's kernels once
# merged): binaries built on the development box by build.sh into
# .gpu/issue28 (carried), run from the checkout's root on the GPU machine.
# Every step has its own timeout and the whole run a budget (LIMIT seconds);
# each step writes $OUT/<step>.txt, the step log is $OUT/log.txt.
#
#   run(command="bash docs/bench/device/issue28/run.sh", carry=[".gpu/issue28"], timeout_s=600)
START=$SECONDS; F=.gpu/issue28; G=/tmp/issue28
mkdir -p $G
tar xJf $F/bin.txz -C $G || { echo "unpack failed" > $OUT/log.txt; exit 1; }
export LD_LIBRARY_PATH=$G/lib UCX_MODULE_DIR=$G/lib/ucx BOUNCETEST_CLI=$G/bin/bounce
B=$G/bin/bounce; L=$OUT/log.txt
LIMIT=${LIMIT:-560}
P="llama70b-tp8-tp4 llama70b-b16-b32 llama70b-nhd-hnd"
{ date -u; cat $F/COMMIT; nvidia-smi -L; nproc; uptime; } > $L 2>&1
step() { local f=$1 tmo=$2; shift 2; local left=$((LIMIT - (SECONDS - START)))
  if [ $left -lt 10 ]; then echo "skipped (budget): $*" >> $OUT/$f.txt; echo "$f skipped (budget): $*" >> $L; return; fi
  [ $tmo -gt $left ] && tmo=$left
  echo "\$ $*" >> $OUT/$f.txt
  timeout -k 5 $tmo "$@" >> $OUT/$f.txt 2>&1; local rc=$?
  echo "rc=$rc at $((SECONDS - START))s" >> $OUT/$f.txt; echo "$f rc=$rc at $((SECONDS - START))s: $*" >> $L; }
# The GPU classes first (what the development box cannot run), then the
# host ones. 1. the GPU stages' shaped copies
step gpu-tests 90 $G/bin/gpucopy.test -test.run 'Shaped' -test.v -test.count 1 -test.timeout 85s
# 2. device KV over tcp (two processes, pinned-host arenas, the cuda
#    stages with their shaped kernels): converted vs unconverted
for p in $P; do step devkv-tcp 80 $B run --memory device --layouts $p --repeat 3; done
# 3. one GPU: cudacopy engine + cuda stages on device arenas
for p in $P; do step cudacopy 60 $B run --memory device --engine.kind cudacopy --control-plane.kind inproc \
  --stages.gather cuda --stages.scatter cuda --layouts $p --repeat 3; done
# 4. host memory on the 16-CPU host, two processes over tcp: each preset
#    converted next to the same bytes unconverted (ratio printed), every
#    element verified; one request, then 8 concurrent.
for p in $P; do step host-tcp 90 $B run --layouts $p --repeat 5; done
for p in $P; do step host-tcp 90 $B run --layouts $p --requests 8 --repeat 3; done
# 5. the host conversion tests (every class byte-exact, merges with
#    concurrent senders) and the planner's properties, on 16 CPUs
step host-tests 90 $G/bin/pipeline.test -test.run 'TestConverted|TestPullBetweenLayouts' -test.count 1 -test.timeout 85s
step host-tests 30 $G/bin/convert.test -test.count 1 -rapid.checks 2000
step host-tests 60 $G/bin/hostcopy.test -test.run 'Shaped' -test.count 1 -rapid.checks 500
# the host scatter alone: TP=8 into TP=4 NHD blocks against the same bytes
# as whole blocks ("converted/whole" is the ratio)
step host-tests 40 $G/bin/hostcopy.test -test.run '^$' -test.bench ShapedScatter -test.benchtime 200x -test.count 3
echo "done at $((SECONDS - START))s" >> $L
