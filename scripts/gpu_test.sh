#!/usr/bin/env bash
# The GPU side on a machine with a CUDA device: build there, run every GPU test, run the compute-sanitizer
# tools (memcheck, racecheck, initcheck, synccheck) over a reduced set, a short draft_loop, then the Python
# package (installed into the machine's python3, no downloads) with its GPU tests and the round cost of
# Python against C++ (bench/round_cost.py on a llama3-8b-eagle3-shaped random head). Logs go to $OUT (else
# out/gpu_test). The last line sums everything: "N passed, N failed". GPU_TEST_PYTHON=0 leaves Python out,
# GPU_TEST_CPP=0 the C++ tests, sanitizers, draft_loop and broadcast (for a second call on a warm machine).
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

# After a crash (a signal's exit status), the same command again under gdb, where the machine has it: the
# native frames go to $out/crash.log.
native_backtrace() {  # exit status, command...
  local rc=$1
  shift
  [ "$rc" -gt 128 ] || return 0
  # The GPU machines have cuda-gdb but no gdb; cuda-gdb debugs host code the same way.
  local gdb
  gdb=$(command -v gdb || command -v cuda-gdb)
  if [ -n "$gdb" ]; then
    "$gdb" -batch -ex run -ex "bt 40" -ex "info sharedlibrary" --args "$@" >>"$out/crash.log" 2>&1
    echo "crash (exit $rc): native backtrace in $out/crash.log"
    grep -E "^#" "$out/crash.log" | head -15
  else
    echo "crash (exit $rc): no gdb or cuda-gdb here for a native backtrace"
  fi
}

echo "== configure and build ($build)"
if ! configure_build . "$build" >"$out/build.log" 2>&1 ||
   ! cmake --build "$build" -j "$(nproc)" --target tfe_gpu_tests tfe_soak draft_loop tfe-plan round_cost \
     tfe_broadcast_ranks >>"$out/build.log" 2>&1; then
  tail -30 "$out/build.log"
  record build 0 1
  finish
fi
record build 1 0
export TFE_CACHE_DIR="$PWD/$build/kernel-cache"
tests="$build/tests/tfe_gpu_tests"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/device.txt" 2>&1 || true
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)

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

if [ "${GPU_TEST_CPP:-1}" = 1 ]; then
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
  reduced=(--test-case="graphs: cache*,graphs: lazy*,draft: matches*tiny dense bf16,draft: matches*two_stage FP8,draft: first ranks*bf16,refusals: bad*")
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
       >>"$out/draft_loop.log" 2>&1 &&
     "$build/examples/draft_loop" --head "$head" --slots 4 --steps 5 --rounds 100 --report-every 50 --device-rows \
       >>"$out/draft_loop.log" 2>&1; then
    tail -2 "$out/draft_loop.log"
    record draft_loop 1 0
  else
    tail -5 "$out/draft_loop.log"
    record draft_loop 0 1
  fi

  echo "== drafts to every rank (NCCL)"
  for mode in "--ranks 1 --capture" "--ranks 2" "--ranks 2 --capture" "--ranks 2 --kill-rank 1 --kill-after 5 --timeout-ms 5000"; do
    # shellcheck disable=SC2086 # the mode is its words
    "$build/tests/tfe_broadcast_ranks" $mode >>"$out/broadcast.log" 2>&1
    rc=$?
    tail -1 "$out/broadcast.log"
    if [ "$rc" -eq 0 ]; then
      record "broadcast $mode" 1 0
    elif [ "$rc" -eq 77 ] && [ "$gpus" -lt 2 ]; then
      table+=("$(printf '%-28s skipped: %s GPU(s)' "broadcast $mode" "$gpus")")
    else
      record "broadcast $mode" 0 1
    fi
  done
  if [ "$gpus" -ge 2 ]; then
    # The broadcast's cost inside a round, against the draft's own time (1, 4, 16 slots).
    "$build/tests/tfe_broadcast_ranks" --ranks 2 --measure --slots 16 --steps 4 --rounds 200 2>&1 | tee -a "$out/broadcast.log"
  fi
fi

if [ "${GPU_TEST_PYTHON:-1}" = 1 ]; then
  echo "== python package: install, GPU tests, round cost"
  if CMAKE_PREFIX_PATH="$PWD/.deps" python3 -m pip install --no-build-isolation --no-deps --quiet . \
       >"$out/python_install.log" 2>&1; then
    python3 -X faulthandler -m pytest -q -rs tests/python >"$out/python_tests.log" 2>&1
    rc=$?
    tail -3 "$out/python_tests.log"
    native_backtrace "$rc" python3 -m pytest -q -x tests/python
    # A GPU test skipped on a GPU machine means the device or torch was not seen.
    if [ "$rc" -eq 0 ] && ! grep -qE "skipped.*(no CUDA|needs a GPU|torch)" "$out/python_tests.log"; then
      record python_tests 1 0
    else
      record python_tests 0 1
    fi
    if [ "$gpus" -ge 2 ]; then
      if torchrun --nproc-per-node 2 tests/distributed/torch_ranks.py >"$out/torch_ranks.log" 2>&1; then
        record "torch.distributed ranks" 1 0
      else
        record "torch.distributed ranks" 0 1
      fi
      tail -2 "$out/torch_ranks.log"
    fi
    big="$build/round_cost_llama3.tfe"
    if "$build/tfe-plan" random --preset llama3-8b-eagle3 --seed 1 -o "$big" >"$out/round_cost.log" 2>&1 &&
       python3 -X faulthandler bench/round_cost.py --head "$big" --round-cost "$build/bench/round_cost" >>"$out/round_cost.log" 2>&1; then
      tail -5 "$out/round_cost.log"
      record round_cost 1 0
    else
      rc=$?
      tail -5 "$out/round_cost.log"
      native_backtrace "$rc" python3 bench/round_cost.py --head "$big" --round-cost "$build/bench/round_cost"
      record round_cost 0 1
    fi
  else
    tail -5 "$out/python_install.log"
    record python_install 0 1
  fi
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
