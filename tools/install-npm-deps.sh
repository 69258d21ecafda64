#!/usr/bin/env bash
# Installs the npm packages the tests use (tests/k8s: ajv, js-yaml and kubernetes-models, to
# validate rendered Kubernetes manifests offline) at the exact versions of
# tests/k8s/package-lock.json. Idempotent: `npm ci` runs only when tests/k8s/node_modules is
# missing or was installed from another package-lock.json.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=tests/k8s
stamp="$dir/node_modules/.cohort-lock.sha256"
if ! command -v npm >/dev/null 2>&1; then
  echo "install-npm-deps: npm is not installed (tools/install-deps.sh installs nodejs and npm)" >&2
  exit 1
fi
want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "install-npm-deps: $dir/node_modules is up to date"
  exit 0
fi
echo "install-npm-deps: npm ci in $dir"
npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
echo "$want" >"$stamp"
