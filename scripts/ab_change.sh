#!/usr/bin/env bash
# A change to the GPU side measured in one device call: the GPU tests of this tree, then scripts/ab.sh of this
# tree against the same tree with the change taken out, alternated, drafts compared byte for byte. The change
# is PATCH, a unified diff (`git diff -- kernels > change.patch`) that this tree already holds: the base is a
# copy of this tree with PATCH reversed, built beside it (in the background, while the tests run).
#
# Usage: scripts/ab_change.sh PATCH [BUILD_DIR]   (default build-gpu)
# Environment: OUT (default out/ab_change): gpu_test/ and ab/ below it, each script's logs; AB_CHANGE_BASE
#   (default /tmp/ab_change_base) the base tree; AB_CHANGE_TESTS: `full` (scripts/gpu_test.sh, the
#   default), `quick` (scripts/gpu_test_quick.sh: for a change outside the GEMV when device time is short)
#   or `none`; AB_CHANGE_DRY=1 only makes the base tree
#   (a check that PATCH reverses cleanly; no GPU needed); AB_PRESETS, AB_STREAMS, AB_ROUNDS, AB_ITERS,
#   AB_STEPS as for scripts/ab.sh. The last lines: the tests' verdict and ab.sh's table.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/build_lib.sh
. scripts/build_lib.sh
[ $# -ge 1 ] || { echo "usage: scripts/ab_change.sh PATCH [BUILD_DIR]" >&2; exit 2; }
patch_file=$(realpath "$1")
build=${2:-build-gpu}
out=${OUT:-out/ab_change}
base=${AB_CHANGE_BASE:-/tmp/ab_change_base}
tests=${AB_CHANGE_TESTS:-full}
[[ "$tests" =~ ^(full|quick|none)$ ]] || { echo "ab_change.sh: AB_CHANGE_TESTS is full, quick or none" >&2; exit 2; }
[ -s "$patch_file" ] || { echo "ab_change.sh: $1 is missing or empty" >&2; exit 2; }
mkdir -p "$out"

# The base: this tree less build folders and outputs, PATCH reversed (checked first, so a patch that does
# not match this tree changes nothing and says where).
rm -rf "$base" && mkdir -p "$base" || exit 1
copy_tree "$base" || exit 1
if ! scripts/apply_patch.sh "$base" "$patch_file" --reverse >"$out/patch.log" 2>&1; then
  echo "ab_change.sh: $1 does not reverse cleanly in this tree:"
  cat "$out/patch.log"
  exit 1
fi
echo "== base: $base (this tree with the change to $(grep -c '^+++ ' "$patch_file") files taken out)"
[ -n "${AB_CHANGE_DRY:-}" ] && exit 0

jobs=$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))
(configure_build "$base" "$base/$build" &&
   cmake --build "$base/$build" -j "$jobs" --target tfe-bench tfe-plan) >"$out/base_build.log" 2>&1 &
base_pid=$!

verdict="tests: none"
tests_ok=1
case $tests in
  full)
    OUT="$out/gpu_test" scripts/gpu_test.sh "$build" >"$out/gpu_test.txt" 2>&1 || tests_ok=0
    verdict="tests (scripts/gpu_test.sh): $(tail -1 "$out/gpu_test.txt")";;
  quick)
    verdict=$(OUT="$out/gpu_test" GPU_TEST_JOBS=$jobs scripts/gpu_test_quick.sh "$build" | tail -1) || tests_ok=0;;
esac

if ! wait "$base_pid"; then
  echo "ab_change.sh: the base did not build:"
  tail -30 "$out/base_build.log"
  echo "$verdict"
  exit 1
fi
OUT="$out/ab" scripts/ab.sh "$build" base@"$base/$build"='' change='' >"$out/ab.txt" 2>&1
ab=$?
echo "$verdict"
grep -v '^!!' "$out/ab.txt" | tail -40
[ "$ab" -eq 0 ] && [ "$tests_ok" -eq 1 ]
