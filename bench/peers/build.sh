#!/usr/bin/env bash
# Builds the allreduce peer programs into build/peers/ with plain g++/mpicxx.
# Not part of the CMake build (CI does not need the peers). Idempotent: a program
# is rebuilt only when its source or peer_common.h is newer than the binary
# (or always with FORCE=1).
#
#   bench/peers/build.sh            # from the repo root (or anywhere)
#
# Needs the Debian packages libgloo-dev, openmpi-bin, libopenmpi-dev,
# python3-torch (for torch_gloo_allreduce.py), and g++:
#   apt-get install -y libgloo-dev openmpi-bin libopenmpi-dev python3-torch g++
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${PEERS_OUT:-$root/build/peers}"
CXX="${CXX:-g++}"
CXXFLAGS="${CXXFLAGS:--O3 -march=native -std=c++17 -Wall -Wextra -Wno-unused-parameter}"

missing=()
need_pkg() {  # package, file that proves it is installed
  if [ ! -e "$2" ] && ! dpkg -s "$1" >/dev/null 2>&1; then missing+=("$1"); fi
}
need_pkg libgloo-dev /usr/include/gloo/allreduce_ring.h
need_pkg libopenmpi-dev /usr/include/x86_64-linux-gnu/openmpi/mpi.h
need_pkg openmpi-bin /usr/bin/mpirun
command -v "$CXX" >/dev/null 2>&1 || missing+=("g++")
command -v mpicxx >/dev/null 2>&1 || missing+=("libopenmpi-dev (mpicxx)")
[ -e /usr/include/gloo/allreduce_ring.h ] || missing+=("libgloo-dev (/usr/include/gloo)")
compgen -G "/usr/lib/libgloo.so" >/dev/null || compgen -G "/usr/lib/*/libgloo.so" >/dev/null ||
  missing+=("libgloo-dev (libgloo.so)")
if ! /usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1; then
  echo "build.sh: warning: /usr/bin/python3 cannot import torch.distributed;" \
       "torch_gloo_allreduce.py will not run (apt-get install -y python3-torch)" >&2
fi
if [ ${#missing[@]} -gt 0 ]; then
  # de-duplicate for the message
  msg="$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')"
  echo "build.sh: missing: $msg" >&2
  echo "build.sh: install with: apt-get install -y libgloo-dev openmpi-bin libopenmpi-dev python3-torch g++" >&2
  exit 1
fi

mkdir -p "$out"

build() {  # name, compiler, extra flags...
  local name="$1" cxx="$2"; shift 2
  local src="$here/$name.cc" bin="$out/$name"
  if [ "${FORCE:-0}" != 1 ] && [ -x "$bin" ] && [ "$bin" -nt "$src" ] &&
     [ "$bin" -nt "$here/peer_common.h" ] && [ "$bin" -nt "$here/build.sh" ]; then
    echo "build.sh: $bin is up to date"
    return
  fi
  echo "build.sh: $cxx $name.cc -> $bin"
  # shellcheck disable=SC2086
  "$cxx" $CXXFLAGS -I"$here" -o "$bin.tmp" "$src" "$@"
  mv -f "$bin.tmp" "$bin"
}

build gloo_allreduce "$CXX" -lgloo -pthread
OMPI_CXX="$CXX" build mpi_allreduce mpicxx
build membw "$CXX" -fopenmp
echo "build.sh: peers in $out"
