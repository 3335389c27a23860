#!/usr/bin/env bash
# Builds every libFuzzer target (tests/fuzz/fuzz_*.cpp) with clang++, ASan and UBSan in build-fuzz, seeds
# each corpus, and runs each target for SECONDS (default 30). Fails on the first finding; its input is
# left in build-fuzz/findings/<target>/ (replay: build-fuzz/tests/fuzz/<target> <that file>).
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
build="build-fuzz"

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (scripts/setup.sh --test installs it)" >&2; exit 1; }
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DTFE_FUZZ=ON \
    "${launcher[@]}" >/dev/null
fi
cmake --build "$build" --target fuzz_all

for source in tests/fuzz/fuzz_*.cpp; do
  target=$(basename "$source" .cpp)
  corpus="$build/corpus/$target"
  findings="$build/findings/$target"
  mkdir -p "$corpus" "$findings"
  if [ -x "$build/tests/fuzz/${target}_seeds" ]; then "$build/tests/fuzz/${target}_seeds" "$corpus"; fi
  if [ -d "tests/fuzz/corpus/$target" ]; then cp -n "tests/fuzz/corpus/$target"/* "$corpus"/ 2>/dev/null || true; fi
  echo "fuzz.sh: $target for ${seconds}s ($(find "$corpus" -type f | wc -l) inputs in the corpus)"
  # A seed head is a few hundred kB; 1 MiB leaves room to grow it.
  "$build/tests/fuzz/$target" "$corpus" -max_total_time="$seconds" -max_len=1048576 -timeout=10 \
    -rss_limit_mb=4096 -artifact_prefix="$findings/" -print_final_stats=1 2>"$build/$target.log" || {
    tail -n 60 "$build/$target.log" >&2
    echo "fuzz.sh: $target found a failure; input in $findings/" >&2
    exit 1
  }
  grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$build/$target.log" | sed "s/^/  $target /"
done
