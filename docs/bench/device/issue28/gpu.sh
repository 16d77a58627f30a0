#!/bin/bash
# issue #28, the GPU side of layout conversion (branch layoutgpu): the
# shaped gather/scatter kernels byte-exact and benchmarked against the
# whole-block kernels. Run from the checkout's root with .gpu/layoutgpu
# carried, holding stripped test binaries built on the development box:
#   mkdir -p .gpu/layoutgpu && for p in stages/gpucopy cuda/kernels stages/gather/cuda stages/scatter/cuda; do
#     go test -c -ldflags "-s -w" -o .gpu/layoutgpu/$(echo $p | tr / -).test ./$p; done
# With COMPILE=1 (and nvcc on the machine) it first compiles copy.cu as
# `make ptx` does into $OUT/ptx and runs everything on that module
# (BOUNCE_TEST_PTX); else on the embedded one. Each step writes
# $OUT/<step>.txt under its own timeout; the whole run keeps to LIMIT
# seconds.
START=$SECONDS; B=.gpu/layoutgpu; L=$OUT/log.txt; LIMIT=${LIMIT:-540}
{ date -u; git log -1 --format=%H 2>/dev/null; nvidia-smi -L; nvcc --version | tail -2; } > $L 2>&1
step() { local f=$1 tmo=$2; shift 2; local left=$((LIMIT - (SECONDS - START)))
  if [ $left -lt 10 ]; then echo "$f skipped (budget): $*" >> $L; return; fi
  [ $tmo -gt $left ] && tmo=$left
  echo "\$ $*" >> $OUT/$f.txt
  timeout -k 5 $tmo "$@" >> $OUT/$f.txt 2>&1; local rc=$?
  echo "rc=$rc at $((SECONDS - START))s" >> $OUT/$f.txt; echo "$f rc=$rc at $((SECONDS - START))s: $*" >> $L; }
if [ "${COMPILE:-0}" = 1 ]; then
  mkdir -p $OUT/ptx
  step nvcc 120 nvcc -ptx -arch=compute_80 -O3 -o $OUT/ptx/copy.ptx cuda/kernels/copy.cu
  step nvcc 120 nvcc -ptx -arch=compute_90 -O3 -o $OUT/ptx/copy_sm90.ptx cuda/kernels/copy.cu
  [ -s $OUT/ptx/copy_sm90.ptx ] || { echo "no PTX" >> $L; exit 1; }
  export BOUNCE_TEST_PTX=$OUT/ptx/copy_sm90.ptx
fi
PTX90=${BOUNCE_TEST_PTX:-cuda/kernels/copy_sm90.ptx}; PTX80=${PTX90%_sm90.ptx}.ptx
K=docs/bench/device/issue28/kernel
# 0. the kernels alone through the driver API (python3 + libcuda, no Go):
#    byte-exact on random shapes (both modules), then shaped vs whole-block
step kernel-test 60 python3 $K/t.py $PTX90 1 250
step kernel-test 60 python3 $K/t.py $PTX80 2 250
step kernel-bench 90 python3 $K/b.py $PTX90
# 1. byte-exact: the shaped form (conversion shapes, random shapes), the block form it shares kernels with, the stages' capabilities
step gpucopy-test 150 $B/stages-gpucopy.test -test.run 'Shaped|Blocks' -test.v -test.timeout 140s
step kernels-test 60 $B/cuda-kernels.test -test.run 'Block|Compact|Kernel|Without|Encode|Uniform' -test.timeout 55s
step stages-test 40 $B/stages-gather-cuda.test -test.v -test.timeout 35s
step stages-test 40 $B/stages-scatter-cuda.test -test.v -test.timeout 35s
# 2. the compute_80 module on the same device (shaped tests only)
step gpucopy-test-sm80 60 env BOUNCE_TEST_PTX=$PTX80 $B/stages-gpucopy.test -test.run 'ShapedConversions|ShapedRandom' -test.timeout 55s
# 3. shaped against whole-block kernels, same bytes, side by side
step bench 150 $B/stages-gpucopy.test -test.run '^$' -test.bench 'ShapedVsWhole' -test.benchtime 20x -test.timeout 145s
echo "done at $((SECONDS - START))s" >> $L
