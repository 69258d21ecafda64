#!/usr/bin/env bash
# Builds unit tests of the layers below libtorch with AddressSanitizer+UBSan (preset asan)
# and ThreadSanitizer (preset tsan) and runs them; any sanitizer report fails.
# The CI subset (about 5 min to build from nothing on 2 cores, seconds to run): under asan
# the code that parses outside input (base, net, the job store and the torch store
# servers); under tsan the threaded parts (the store servers, the rendezvous). Line tables
# only (-g1): reports keep file:line, the build is cheaper. `--all` adds, under asan, the
# rendezvous, the agent, its console merger and job view, launch specs and pipeline, and
# under tsan base, net and the agent.
# Not covered here: comm's collective matrix and the trainer (run them with the presets by
# hand: `cmake --preset asan && cmake --build --preset asan && ctest --preset asan`).
# Run by ctest in two parts: `sanitizers_build` (--build-only --jobs 1: one core, beside the
# pytest suites, which leave one idle much of their time) and then `sanitizers` (--run-only,
# alone: the tests under TSan are timing-sensitive). Without those flags it does both.
# Idempotent (incremental builds in build/asan, build/tsan).
#   bash tools/sanitizer-tests.sh [--all] [--build-only | --run-only] [--jobs N]
set -euo pipefail
cd "$(dirname "$0")/.."
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# die_after_fork=0: Spawn starts workers with clone(CLONE_VM|CLONE_VFORK) + exec, as
# posix_spawn does, which is safe from a multi-threaded process (the agent has its torch
# store's thread then); TSan counts it as a fork and would kill the next thread creation.
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:die_after_fork=0
declare -A TESTS=(
  [asan]="cohort/base/base_test cohort/base/worker_env_test cohort/net/net_test
          cohort/store/store_test cohort/store/torch_store_server_test"
  [tsan]="cohort/store/store_test cohort/store/torch_store_server_test
          cohort/rendezvous/rendezvous_test"
)
all=0 build=1 run=1 jobs=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --all) all=1 ;;
    --build-only) run=0 ;;
    --run-only) build=0 ;;
    --jobs) jobs=$2; shift ;;
    *) echo "sanitizer-tests.sh: unknown argument '$1' (--all, --build-only, --run-only, --jobs N)" >&2
       exit 2 ;;
  esac
  shift
done
if [ "$all" = 1 ]; then
  TESTS[asan]+=" cohort/rendezvous/rendezvous_test cohort/agent/agent_test
                 cohort/agent/console_merger_test cohort/agent/job_view_test
                 cohort/launch/job_spec_test cohort/pipeline/pipeline_test"
  TESTS[tsan]+=" cohort/base/base_test cohort/net/net_test cohort/agent/agent_test"
fi
failed=0
for preset in asan tsan; do
  if [ "$build" = 1 ]; then
    cmake --preset "$preset" -DCOHORT_BUILD_TRAIN=OFF "-DCMAKE_CXX_FLAGS_DEBUG=-g1" >/dev/null
    targets=()
    for t in ${TESTS[$preset]}; do targets+=("$(basename "$t")"); done
    cmake --build "build/$preset" -j "$jobs" --target "${targets[@]}" >/dev/null
    echo "$preset: built ${targets[*]}"
  fi
  [ "$run" = 1 ] || continue
  for t in ${TESTS[$preset]}; do
    if "build/$preset/$t" --gtest_brief=1 >"build/$preset/$(basename "$t").log" 2>&1; then
      echo "$preset $(basename "$t"): passed"
    else
      echo "$preset $(basename "$t"): FAILED"; tail -40 "build/$preset/$(basename "$t").log"
      failed=1
    fi
  done
done
exit $failed
