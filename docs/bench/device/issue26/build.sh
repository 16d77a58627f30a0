#!/bin/bash
# issue #26: build, on the development box from the checkout's root, what
# run.sh needs on the GPU machine's host: the pipeline package's test binary
# (stripped) and the shared libraries it links beyond libc (libzmq and its
# dependencies), into the ignored folder .gpu/issue26/.
set -euo pipefail
F=.gpu/issue26
rm -rf $F && mkdir -p $F/lib
go test -c -trimpath -ldflags='-s -w' -o $F/pipeline.test ./pipeline
ldd $F/pipeline.test | awk '/=> \//{print $3}' | grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*)\.so' | xargs -r -I{} cp -L {} $F/lib/
git log -1 --format='%H %s' > $F/COMMIT
ls -l $F $F/lib
