#!/usr/bin/env bash
# The GPU tests less their four long GEMV cases, and racecheck over one tiny draft: for a change outside the
# GEMV when device time is short (scripts/gpu_test.sh runs everything, the four sanitizers and draft_loop).
# Builds tfe_gpu_tests in BUILD_DIR first. Logs go to $OUT (default out/gpu_test_quick); the last line is
# the verdict, and the exit status is 0 only when the tests and racecheck both pass.
#
# Usage: scripts/gpu_test_quick.sh [BUILD_DIR]   (default build-gpu)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/build_lib.sh
. scripts/build_lib.sh
build=${1:-build-gpu}
out=${OUT:-out/gpu_test_quick}
mkdir -p "$out"
jobs=${GPU_TEST_JOBS:-$(nproc)}
if ! configure_build . "$build" >"$out/build.log" 2>&1 ||
   ! cmake --build "$build" -j "$jobs" --target tfe_gpu_tests >>"$out/build.log" 2>&1; then
  tail -30 "$out/build.log"
  echo "tests (quick): the build failed ($out/build.log)"
  exit 1
fi
export TFE_CACHE_DIR="$PWD/$build/kernel-cache"
long="gemv: COLS*,*gemv_rope_kv*,*gemv_cluster*,*two-stage shapes*"
"$build/runtime/tfe_gpu_tests" --duration=true --test-case-exclude="$long" >"$out/gpu_tests.log" 2>&1
rc=$?
compute-sanitizer --tool racecheck --error-exitcode 99 "$build/runtime/tfe_gpu_tests" \
  --test-case="draft: matches*tiny dense bf16" >"$out/racecheck.log" 2>&1
race=$?
echo "tests (quick): $(grep -E '^\[doctest\] test cases:' "$out/gpu_tests.log" | tail -1) (rc $rc); racecheck rc $race"
[ "$rc" -eq 0 ] && [ "$race" -eq 0 ]
