#!/usr/bin/env bash
# Installs the Debian packages cohort needs. Idempotent: packages already present are
# skipped by apt-get; `apt-get update` runs only when a package is missing.
#   install-deps.sh          everything cohort builds, tests and benchmarks with
#   install-deps.sh --main   only what the main job needs (tools/run-main-job.sh): the
#                            toolchain, the libraries cohort links, libtorch, the data set
#   install-deps.sh --image  only what tools/image-test.sh builds and runs the image with
set -euo pipefail

MAIN_PACKAGES=(
  build-essential cmake ninja-build pkg-config ca-certificates procps
  libasio-dev libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libfmt-dev libspdlog-dev
  libsqlite3-dev libcpp-httplib-dev zlib1g-dev libcurl4-openssl-dev libssl-dev
  libisal-dev protobuf-compiler libprotobuf-dev libpq-dev libcsv-dev
  libtorch-dev python3-torch python3-dev pybind11-dev dataset-fashion-mnist
)
TEST_PACKAGES=(
  clang git curl iproute2 psmisc openssl util-linux universal-ctags
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-numpy python3-pytest
  etcd-server etcd-client
  openmpi-bin libopenmpi-dev libgloo-dev
  slurmctld slurmd slurm-client munge
  postgresql sqlite3
  chromium chromium-driver python3-selenium
)
IMAGE_PACKAGES=(podman runc uidmap debootstrap)
mode=${1:-all}
case "$mode" in
  --main) PACKAGES=("${MAIN_PACKAGES[@]}") ;;
  --image) PACKAGES=("${IMAGE_PACKAGES[@]}") ;;
  *) mode=all; PACKAGES=("${MAIN_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# Node.js and npm validate Kubernetes manifests in the tests; keep an existing install.
if [ "$mode" = all ] && ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # force-unsafe-io: dpkg skips its fsync per unpacked file (as Debian's container images
  # do); a crash mid-install is repaired by running this script again.
  apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-unsafe-io \
    "${missing[@]}"
fi

# npm packages of the tests (manifest validation); idempotent.
if [ "$mode" = all ] && [ -x "$(dirname "$0")/install-npm-deps.sh" ]; then
  "$(dirname "$0")/install-npm-deps.sh"
fi
