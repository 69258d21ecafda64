#!/usr/bin/env bash
# Allreduce over TCP between two network-namespace hosts, against the TCP stream
# throughput measured between the same two hosts. Needs root (ip netns). Creates two
# namespaces joined by a veth pair (addresses exist only inside them), runs
#   tcp_stream (one direction, the reference)
#   cohort run --nnodes 2 ... cohort bench allreduce   (one agent per namespace)
# and prints the table with cohort's busbw as a share of the stream throughput.
# Usage: bench/netns_tcp_bench.sh [-b 1M] [-e 256M] [-n 10]
set -euo pipefail
cd "$(dirname "$0")/.."
MINB=1M MAXB=256M ITERS=10
while getopts "b:e:n:" o; do
  case $o in b) MINB=$OPTARG ;; e) MAXB=$OPTARG ;; n) ITERS=$OPTARG ;; *) exit 2 ;; esac
done
BIN=build/dev/cohort/cli
[ -x "$BIN/cohort" ] && [ -x build/dev/bench/tcp_stream ] || { echo "build first: bash tools/build.sh" >&2; exit 1; }
TAG="cb$$"
H1="${TAG}h1" H2="${TAG}h2"
A1=10.201.0.1 A2=10.201.0.2
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$H1" 2>/dev/null || true
  ip netns del "$H2" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$H1"
ip netns add "$H2"
ip link add "${TAG}a" type veth peer name "${TAG}b"
ip link set "${TAG}a" netns "$H1"
ip link set "${TAG}b" netns "$H2"
ip -n "$H1" addr add "$A1/24" dev "${TAG}a"
ip -n "$H2" addr add "$A2/24" dev "${TAG}b"
for h in "$H1" "$H2"; do ip -n "$h" link set lo up; done
ip -n "$H1" link set "${TAG}a" up
ip -n "$H2" link set "${TAG}b" up

echo "# TCP stream $A2 -> $A1 (1 GiB, median of 3)"
streams=()
for rep in 1 2 3; do
  out=$(mktemp)
  ip netns exec "$H1" build/dev/bench/tcp_stream server 5201 > "$out" &
  pids+=($!)
  for _ in $(seq 100); do grep -q listening "$out" && break; sleep 0.05; done
  ip netns exec "$H2" build/dev/bench/tcp_stream client "$A1" 5201 1073741824 >/dev/null
  wait "${pids[-1]}"
  streams+=("$(awk '/GB\/s/ {print $(NF-1)}' "$out")")
  rm -f "$out"
done
STREAM=$(printf '%s\n' "${streams[@]}" | sort -g | sed -n 2p)
echo "# stream: ${streams[*]} GB/s -> median $STREAM GB/s"

echo "# TCP streams both ways at once (what a ring needs: every rank sends and receives)"
out1=$(mktemp) out2=$(mktemp)
ip netns exec "$H1" build/dev/bench/tcp_stream server 5202 > "$out1" &
pids+=($!)
ip netns exec "$H2" build/dev/bench/tcp_stream server 5203 > "$out2" &
pids+=($!)
for _ in $(seq 100); do grep -q listening "$out1" && grep -q listening "$out2" && break; sleep 0.05; done
ip netns exec "$H2" build/dev/bench/tcp_stream client "$A1" 5202 1073741824 >/dev/null &
c1=$!
ip netns exec "$H1" build/dev/bench/tcp_stream client "$A2" 5203 1073741824 >/dev/null
wait "$c1"
wait "${pids[-1]}" "${pids[-2]}"
BIDIR=$(cat "$out1" "$out2" | awk '/GB\/s/ {print $(NF-1)}' | sort -g | head -1)
echo "# both ways: $(cat "$out1" "$out2" | awk '/GB\/s/ {printf "%s ", $(NF-1)}')GB/s per direction (slower: $BIDIR)"
rm -f "$out1" "$out2"

export COHORT_TOKEN="$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
common=(--nnodes 2 --nproc-per-node 1 --rdzv-endpoint "$A1:29500" --rdzv-id "$TAG"
        --rdzv-conf join_timeout=60)
bench=("$BIN/cohort" bench allreduce -b "$MINB" -e "$MAXB" -f 4 -n "$ITERS" -w 2 -c 1)
log1=$(mktemp) log2=$(mktemp)
COHORT_HOST_ID=h1 ip netns exec "$H1" "$BIN/cohort" run "${common[@]}" --local-addr "$A1" \
  -- "${bench[@]}" > "$log1" 2>&1 &
pids+=($!)
COHORT_HOST_ID=h2 ip netns exec "$H2" "$BIN/cohort" run "${common[@]}" --local-addr "$A2" \
  -- "${bench[@]}" > "$log2" 2>&1
wait "${pids[-1]}" || true
echo "# cohort allreduce over TCP between $H1 and $H2 (2 ranks, busbw = algbw)"
# Rank 0 may be on either host (ranks follow join order, not the store host).
grep -hE '^\[rank0\]: ' "$log1" "$log2" | sed 's/^\[rank0\]: //'
echo
printf '%12s %10s %10s %8s %12s %8s\n' "size(B)" "busbw" "stream" "share" "both-ways" "share"
grep -hE '^\[rank0\]: +[0-9]' "$log1" "$log2" | awk -v s="$STREAM" -v b="$BIDIR" '{printf "%12s %10s %10s %7.0f%% %12s %7.0f%%\n", $2, $9, s, 100*$9/s, b, 100*$9/b}'
echo "# target: busbw >= 80% of the stream throughput"
echo "# node logs: $log1 $log2"
