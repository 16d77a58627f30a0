#!/bin/bash
# issue #29 (pull): build the device run's binaries on the development box
# into the ignored folder .gpu/issue29 (bin.txz: bin/bounce, bin/node.test,
# bin/pipeline.test, lib/ with the .so files ldd names beyond libc, lib/ucx).
# Run from the checkout's root; then run.sh on the GPU machine with
# .gpu/issue29 carried.
set -euo pipefail
F=.gpu/issue29; S=$(mktemp -d); mkdir -p $F $S/bin $S/lib
go build -trimpath -ldflags '-s -w' -o $S/bin/bounce ./cmd/bounce
go test -c -trimpath -ldflags '-s -w' -o $S/bin/node.test ./node
go test -c -trimpath -ldflags '-s -w' -o $S/bin/pipeline.test ./pipeline
for b in $S/bin/*; do
  ldd $b | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux)[.-]' | xargs -r -I{} cp -L {} $S/lib/
done
[ -d /usr/lib/x86_64-linux-gnu/ucx ] && cp -rL /usr/lib/x86_64-linux-gnu/ucx $S/lib/ucx
git rev-parse HEAD > $F/COMMIT
tar cJf $F/bin.txz -C $S bin lib
rm -rf $S
ls -la $F
