#!/bin/bash
# issue #24, single-GPU pipeline on the block form (branch gpu2): binaries
# built on the development box (bin.txz: bin/bounce, bin/node.test, lib/ with
# the .so files ldd names beyond libc, lib/ucx), run from the checkout's root
# with .gpu/final carried. Every step has its own timeout and the whole run a
# budget (LIMIT seconds); each writes $OUT/<step>.txt, bench JSON comes back in
# $OUT/json.tgz, the step log in $OUT/log.txt.
START=$SECONDS; F=.gpu/final; G=/tmp/final; mkdir -p $G/json
tar xJf $F/bin.txz -C $G || { echo "unpack failed" > $OUT/log.txt; exit 1; }
export LD_LIBRARY_PATH=$G/lib UCX_MODULE_DIR=$G/lib/ucx BOUNCETEST_CLI=$G/bin/bounce
B=$G/bin/bounce; T=$G/bin/node.test; J=$G/json; L=$OUT/log.txt
W=llama70b-tp8-b16,gptoss120b-tp8-b16
LIMIT=${LIMIT:-530}
{ date -u; cat $F/COMMIT; nvidia-smi -L; nproc; uptime; } > $L 2>&1
step() { local f=$1 tmo=$2; shift 2; local left=$((LIMIT - (SECONDS - START)))
  if [ $left -lt 10 ]; then echo "skipped (budget): $*" >> $OUT/$f.txt; echo "$f skipped (budget): $*" >> $L; return; fi
  [ $tmo -gt $left ] && tmo=$left
  echo "\$ $*" >> $OUT/$f.txt
  timeout -k 5 $tmo "$@" >> $OUT/$f.txt 2>&1; local rc=$?
  echo "rc=$rc at $((SECONDS - START))s" >> $OUT/$f.txt; echo "$f rc=$rc at $((SECONDS - START))s: $*" >> $L; RC=$rc; }
# forms: a bench step with --form blocks,descs; if it fails, once more in the descriptor form alone
forms() { local f=$1 tmo=$2; shift 2; RC=0; step $f $tmo "$@" --form blocks,descs; [ $RC -ne 0 ] && step $f $tmo "$@"; }
# 1. the single-GPU pipeline, both forms, against one copy and the per-descriptor direct path
step bench-gpu 110 $T -test.run '^$' -test.bench 'GPUBlockForm' -test.benchtime 20x -test.timeout 105s
# 2. GPU tests: block and descriptor forms byte-exact over cudacopy + cuda stages; device KV in both forms
step gpu-tests 90 $T -test.run 'TestGPUBlocksByteExact|TestGPUPipelineByteExact|TestGPUStagesOnHostBuffers' -test.v -test.timeout 85s
step gpu-tests 45 $B run --memory device --workload gptoss120b-tp8-b16 --count 4608 --requests 2 --form blocks,descs --compare=false --engine.kind tcp
step gpu-tests 45 $B run --memory device --workload gptoss120b-tp8-b16 --count 4608 --requests 2 --form blocks,descs --compare=false \
  --engine.kind cudacopy --control-plane.kind inproc --stages.gather cuda --stages.scatter cuda
# 3. device KV over tcp (two processes), both forms, against host bulk
forms devkv-tcp 120 $B bench --memory device --workload $W --concurrency 1 --routes bounce,direct,bulk --repeat 3 --json $J/devkv-tcp.json
# 4. CUDA IPC between two processes: bounce against the per-descriptor direct path
forms ipc 80 $B bench --memory device --engine.kind cudacopy --engine.options ipc=true --workload $W --concurrency 1 --routes bounce,direct --repeat 3 --json $J/ipc.json
# 5. host KV over tcp on the 16-CPU host: bounce against one bulk write
forms host-tcp 70 $B bench --workload $W --concurrency 1 --routes bounce,bulk --repeat 3 --json $J/host-tcp.json
# 5b. the same request through the Python package and the Go API (16-CPU host)
step host-tcp 150 bash -c "cd capi && BOUNCE_LIBRARY=$G/lib/libbounce.so BOUNCE_PYTHON=python3 $G/bin/capi.test -test.run '^$' -test.bench PythonVsGo -test.benchtime 1x -test.count 3"
# 6. conformance of cudacopy and the cuda stages (block rules included)
step conformance 40 $B conformance engine --builtin cudacopy
step conformance 30 $B conformance gather --builtin cuda
step conformance 30 $B conformance scatter --builtin cuda
tar czf $OUT/json.tgz -C $G json
echo "done at $((SECONDS - START))s" >> $L
