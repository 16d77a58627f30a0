#!/usr/bin/env bash
# Installs the system packages bounce builds against (libzmq for the ZeroMQ
# control plane, libucx for the UCX engine, pkg-config for cgo) and fetches the
# Go modules. Safe to run again: it skips what is already present.
set -euo pipefail
need=()
for pkg in libzmq3-dev libucx-dev pkg-config gcc make; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"
go mod download
