#!/usr/bin/env bash
# Installs every Debian package cohort builds, tests and benchmarks with. Idempotent:
# packages already present are skipped by apt-get; `apt-get update` runs only when a
# package is missing.
set -euo pipefail

PACKAGES=(
  build-essential clang cmake ninja-build pkg-config git curl ca-certificates procps iproute2 psmisc
  openssl util-linux
  libgtest-dev libgmock-dev libbenchmark-dev
  libasio-dev libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libfmt-dev libspdlog-dev
  libsqlite3-dev libcpp-httplib-dev zlib1g-dev libcurl4-openssl-dev
  libisal-dev protobuf-compiler libprotobuf-dev
  libtorch-dev python3-torch python3-dev pybind11-dev python3-numpy python3-pytest dataset-fashion-mnist
  etcd-server etcd-client
  openmpi-bin libopenmpi-dev libgloo-dev
  slurmctld slurmd slurm-client munge
  libpq-dev postgresql sqlite3 libcsv-dev
  chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# Node.js and npm validate Kubernetes manifests in the tests; keep an existing install.
if ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm packages of the tests (manifest validation); idempotent.
if [ -x "$(dirname "$0")/install-npm-deps.sh" ]; then
  "$(dirname "$0")/install-npm-deps.sh"
fi
