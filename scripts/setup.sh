#!/usr/bin/env bash
# Installs the system packages bounce builds against (libzmq for the ZeroMQ
# control plane, libucx for the UCX engine, pkg-config and gcc for cgo,
# iproute2 for the two-host test in network namespaces, etcd-server for the
# test against a real etcd process and `make etcd`, Debian's python3 with
# numpy and pytest for the Python package's tests) and
# fetches the Go modules. Safe to run again: it skips what is already there.
set -euo pipefail
export PATH="/usr/local/go/bin:$PATH"
need=()
for pkg in libzmq3-dev libucx-dev pkg-config gcc g++ make iproute2 etcd-server python3 python3-numpy python3-pytest; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "setup: installing ${need[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
command -v go >/dev/null || { echo "setup: Go >= 1.26 is required (https://go.dev/dl/)" >&2; exit 1; }
go mod download
