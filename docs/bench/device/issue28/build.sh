#!/bin/bash
# issue #28 (layout conversion): builds, on the development box, what
# run.sh runs on the GPU machine into the ignored folder .gpu/issue28/:
# bin.txz holding bin/bounce and the test binaries, lib/ with the shared
# libraries ldd names beyond libc (libzmq, libucx and their deps) and
# lib/ucx (UCX's transport modules), and COMMIT. Run from the checkout's root.
set -euo pipefail
F=.gpu/issue28; S=$(mktemp -d); mkdir -p $F $S/bin $S/lib
flags=(-trimpath -ldflags='-s -w')
go build "${flags[@]}" -o $S/bin/bounce ./cmd/bounce
go test -c "${flags[@]}" -o $S/bin/pipeline.test ./pipeline
go test -c "${flags[@]}" -o $S/bin/convert.test ./pipeline/convert
go test -c "${flags[@]}" -o $S/bin/hostcopy.test ./stages/hostcopy
# The GPU stages' shaped kernels (branch layoutgpu) once merged:
go test -c "${flags[@]}" -o $S/bin/gpucopy.test ./stages/gpucopy
for b in $S/bin/*; do
  ldd "$b" 2>/dev/null | awk '/=> \// {print $3}' | grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux)[.-]' | while read -r l; do cp -Ln "$l" $S/lib/ 2>/dev/null || true; done || true
done
ucx=$(ldconfig -p | awk '/libucp.so / {print $NF; exit}')
if [ -n "$ucx" ] && [ -d "$(dirname "$ucx")/ucx" ]; then cp -rL "$(dirname "$ucx")/ucx" $S/lib/ucx; fi
git rev-parse HEAD > $F/COMMIT
tar cJf $F/bin.txz -C $S bin lib
rm -rf $S
ls -l $F
