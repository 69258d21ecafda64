#!/usr/bin/env bash
# The container image, tested as a Kubernetes user's pods would run it (root, Debian 12,
# podman; no image registry needed): makes the Debian packages with CPack from a built tree
# (default build/dev), a Debian 12 base image from Debian's archive (debootstrap minbase,
# podman import; kept as localhost/debian:bookworm), builds packaging/Containerfile as
# localhost/cohort:<version>, renders a 2-node PyTorchJob with
# `cohort submit --backend kubernetes --dry-run`, and runs its two worker pods as two
# containers on one podman network: the command line and the environment the manifest
# gives the container (the token from its Secret), the pods' names resolving to their
# addresses. Passes when both containers exit 0 and print one job of 2 ranks with equal sums.
# Containers and network are removed at the end; the images are kept (a rerun reuses them).
# podman runs with runc and lowered rlimits (this sandbox refuses crun and the defaults).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=$(realpath "${1:-build/dev}")
out=$(mktemp -d /tmp/cohort-image-test.XXXXXX)
step() { echo "== $*"; }
bash tools/install-deps.sh --image  # podman, runc, uidmap, debootstrap
PODMAN=(podman --runtime /usr/sbin/runc)
LIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1000:1000)

step "the packages (cpack)"
bash tools/make-debs.sh "$build" "$out/ctx"
rm -f "$out/ctx/cpack.log"  # the build context: the two packages only

if ! podman image exists localhost/debian:bookworm; then
  step "a Debian 12 base image from Debian's archive (debootstrap minbase)"
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null ||
           true)
  debootstrap --variant=minbase bookworm "$out/base" "${mirror:-http://deb.debian.org/debian}" \
    >"$out/debootstrap.log" 2>&1 || { tail -20 "$out/debootstrap.log"; exit 1; }
  tar -C "$out/base" -c . | podman import - localhost/debian:bookworm >/dev/null
  rm -rf "$out/base"
fi

version=$(dpkg-deb -f "$out"/ctx/cohort_*.deb Version)
image=localhost/cohort:$version
step "building $image from packaging/Containerfile"
"${PODMAN[@]}" build --network host "${LIMITS[@]}" --build-arg BASE=localhost/debian:bookworm \
  -f "$repo/packaging/Containerfile" -t "$image" "$out/ctx" >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }

step "rendering a 2-node PyTorchJob (cohort submit --backend kubernetes --dry-run)"
name=imgtest$$
mkdir -p "$out/job"
cat >"$out/job/allreduce.py" <<'PY'
import torch
import torch.distributed as dist
import cohort_torch  # noqa: F401 - the "cohort" backend
dist.init_process_group("cohort")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("rank %d of %d sum %g" % (dist.get_rank(), dist.get_world_size(), t.item()), flush=True)
dist.destroy_process_group()
PY
cat >"$out/job.yaml" <<YAML
name: $name
image: $image
nnodes: 2
nproc_per_node: 1
entrypoint: /usr/bin/python3
args: ["/opt/job/allreduce.py"]
YAML
"$build/cohort/cli/cohort" submit --backend kubernetes --dry-run "$out/job.yaml" >"$out/manifests.yaml"
# The worker container's command, its literal environment and the Secret's token.
/usr/bin/python3 - "$out/manifests.yaml" "$out" <<'PY'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
secret = next(d for d in docs if d["kind"] == "Secret")
job = next(d for d in docs if d["kind"] == "PyTorchJob")
spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]
c = spec["template"]["spec"]["containers"][0]
env = {}
for e in c.get("env", []):
    if "value" in e:
        env[e["name"]] = e["value"]
    elif e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == secret["metadata"]["name"]:
        env[e["name"]] = secret["stringData"][e["valueFrom"]["secretKeyRef"]["key"]]
json.dump({"command": c["command"] + c.get("args", []), "env": env,
           "replicas": spec["replicas"], "image": c["image"]}, open(sys.argv[2] + "/pod.json", "w"))
PY
cat "$out/pod.json"; echo

step "running the two worker pods as containers"
net=cohort-imgtest-$$
subnet="10.89.$(( ($$ % 200) + 20 )).0/24"
prefix=${subnet%.0/24}
cleanup() {
  for i in 0 1; do podman rm -f "$name-worker-$i" >/dev/null 2>&1 || true; done
  podman network rm -f "$net" >/dev/null 2>&1 || true
}
trap cleanup EXIT
podman network create --subnet "$subnet" "$net" >/dev/null
mapfile -t command < <(/usr/bin/python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["command"]))' "$out/pod.json")
envs=()
while IFS= read -r kv; do envs+=(-e "$kv"); done < <(/usr/bin/python3 -c 'import json,sys; [print("%s=%s" % kv) for kv in json.load(open(sys.argv[1]))["env"].items()]' "$out/pod.json")
hosts=(--add-host "$name-worker-0:$prefix.10" --add-host "$name-worker-1:$prefix.11")
for i in 0 1; do
  "${PODMAN[@]}" run -d "${LIMITS[@]}" --network "$net" --ip "$prefix.1$i" \
    --hostname "$name-worker-$i" --name "$name-worker-$i" "${hosts[@]}" --shm-size 256m \
    "${envs[@]}" -v "$out/job:/opt/job:ro" "$image" "${command[@]}" >/dev/null
done
rcs=$(timeout 300 podman wait "$name-worker-0" "$name-worker-1" | tr '\n' ' ')
for i in 0 1; do podman logs "$name-worker-$i" >"$out/worker-$i.log" 2>&1; done
echo "exit codes: $rcs"
cat "$out"/worker-*.log | grep -E "rank [01] of 2 sum" || true
n=$(cat "$out"/worker-*.log | grep -cE "rank [01] of 2 sum 3$" || true)
if [ "$rcs" != "0 0 " ] || [ "$n" != 2 ]; then
  echo "expected both pods to exit 0 as one job of 2 ranks with sum 3"; tail -20 "$out"/worker-*.log
  exit 1
fi
echo "image test passed: $image, one job of 2 ranks from the rendered PyTorchJob (logs in $out)"
