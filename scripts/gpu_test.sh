#!/usr/bin/env bash
# The GPU side on a machine with a CUDA device: build there, run every GPU test, run the compute-sanitizer
# tools (memcheck, racecheck, initcheck, synccheck) over a reduced set, and a short draft_loop. Logs go to
# $OUT (else out/gpu_test; 8 files at most). The last line sums everything: "N passed, N failed".
#
# Usage: scripts/gpu_test.sh [BUILD_DIR]   (default build-gpu)
# TFE_SOAK_ROUNDS=N adds the soak run (tests/gpu/soak.cpp: N extend/draft rounds with resets, host and
# device memory and the CPU reference sampled every TFE_SOAK_EVERY rounds, default N / 10); 1000000 is
# the issue's figure (its table goes to $OUT/soak.log).
# nlohmann-json and CLI11 may be missing there: run scripts/stage_deps.sh on a machine that has them and
# carry .deps/ along; this script then configures with -DCMAKE_PREFIX_PATH=.deps.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/build_lib.sh
. scripts/build_lib.sh
build=${1:-build-gpu}
out=${OUT:-out/gpu_test}
mkdir -p "$out"
passed=0
failed=0
table=()
record() {  # name, passed count, failed count
  passed=$((passed + $2))
  failed=$((failed + $3))
  table+=("$(printf '%-28s %4d passed %4d failed' "$1" "$2" "$3")")
}
finish() {
  echo "== summary (logs in $out)"
  for line in "${table[@]}"; do echo "$line"; done
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

echo "== configure and build ($build)"
if ! configure_build . "$build" >"$out/build.log" 2>&1 ||
   ! cmake --build "$build" -j "$(nproc)" --target tfe_gpu_tests tfe_soak draft_loop tfe-plan >>"$out/build.log" 2>&1; then
  tail -30 "$out/build.log"
  record build 0 1
  finish
fi
record build 1 0
export TFE_CACHE_DIR="$PWD/$build/kernel-cache"
tests="$build/tests/tfe_gpu_tests"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/device.txt" 2>&1 || true

# doctest's summary line: "[doctest] test cases: N | P passed | F failed | S skipped"
count_cases() {
  local line
  line=$(grep -E '^\[doctest\] test cases:' "$1" | tail -1)
  local p f s
  p=$(sed -E 's/.*\| *([0-9]+) passed.*/\1/' <<<"$line")
  f=$(sed -E 's/.*\| *([0-9]+) failed.*/\1/' <<<"$line")
  s=$(sed -E 's/.*\| *([0-9]+) skipped.*/\1/' <<<"$line")
  echo "${p:-0} ${f:-0} ${s:-0}"
}

echo "== GPU tests"
"$tests" --duration=true >"$out/gpu_tests.log" 2>&1
rc=$?
read -r p f s < <(count_cases "$out/gpu_tests.log")
if [ "$s" -gt 0 ]; then f=$((f + s)); fi  # a skip on a GPU machine is a failure: the device was not seen
if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
grep -E "FAILED|ERROR|skipped: no CUDA" "$out/gpu_tests.log" | head -20
record gpu_tests "$p" "$f"

# The sanitizers run the tiny heads' cases only (they slow kernels by 10-100x).
# (doctest splits filters at commas, so names are matched by patterns without them.)
reduced=(--test-case="graphs: cache*,graphs: lazy*,draft: matches*tiny dense bf16,draft: matches*two_stage FP8,refusals: bad*")
for tool in memcheck racecheck initcheck synccheck; do
  echo "== compute-sanitizer --tool $tool"
  log="$out/sanitizer_$tool.log"
  compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 50 "$tests" "${reduced[@]}" >"$log" 2>&1
  rc=$?
  # memcheck, initcheck and synccheck end with "ERROR SUMMARY: 0 errors"; racecheck with
  # "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)".
  if [ "$rc" -eq 0 ] && grep -qE "(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards displayed \(0 errors)" "$log"; then
    record "sanitizer $tool" 1 0
  else
    grep -E "ERROR SUMMARY|Error|error" "$log" | head -10
    record "sanitizer $tool (rc $rc)" 0 1
  fi
done

echo "== draft_loop on a tiny head"
head="$build/draft_loop_tiny.tfe"
if "$build/tfe-plan" random --preset tiny --seed 3 -o "$head" >"$out/draft_loop.log" 2>&1 &&
   "$build/examples/draft_loop" --head "$head" --slots 4 --steps 5 --rounds 100 --report-every 50 \
     >>"$out/draft_loop.log" 2>&1; then
  tail -2 "$out/draft_loop.log"
  record draft_loop 1 0
else
  tail -5 "$out/draft_loop.log"
  record draft_loop 0 1
fi
if [ -n "${TFE_SOAK_ROUNDS:-}" ]; then
  echo "== soak: $TFE_SOAK_ROUNDS rounds"
  every=${TFE_SOAK_EVERY:-$(((TFE_SOAK_ROUNDS + 9) / 10))}
  if "$build/tests/tfe_soak" --rounds "$TFE_SOAK_ROUNDS" --every "$every" >"$out/soak.log" 2>&1; then
    record soak 1 0
  else
    record soak 0 1
  fi
  cat "$out/soak.log"
fi
finish
