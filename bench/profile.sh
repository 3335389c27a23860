#!/usr/bin/env bash
# Where one draft step's time goes, kernel by kernel, on a machine with a CUDA device: build tfe-bench and
# tfe-plan, make the random heads bench/bench.sh uses, and for each preset x dtype run
#   ncu --profile-from-start off --clock-control none --cache-control none  tfe-bench --profile
# which profiles exactly the kernels of one graph replay of (streams, 1 step) for each streams value. Each
# kernel node is replayed alone by ncu, so the sum of kernel times leaves out the gaps between nodes; the
# same run times the step as a whole (tfe-bench, graphs) so the difference is shown too.
# bench/profile_table.py prints the per-kernel table (time, DRAM bytes, GB/s, share of the copy rate).
#
# Usage: bench/profile.sh [BUILD_DIR]   (default build-gpu)
# Environment: OUT (default out/profile) receives profile.log and the ncu CSVs; PROFILE_PRESETS (default
#   "llama3-8b-eagle3 tfe-two-stage"); PROFILE_STREAMS (default "1,16"); PROFILE_DTYPES (default "bf16 fp8").
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/build_lib.sh
. scripts/build_lib.sh
build=${1:-build-gpu}
out=${OUT:-out/profile}
work=${BENCH_WORK:-/tmp/tfe-bench}
presets=${PROFILE_PRESETS:-"llama3-8b-eagle3 tfe-two-stage"}
streams=${PROFILE_STREAMS:-1,16}
dtypes=${PROFILE_DTYPES:-"bf16 fp8"}
mkdir -p "$out" "$work"

main() {
  echo "== configure and build ($build)"
  if ! configure_build . "$build" >"$out/build.log" 2>&1 ||
     ! cmake --build "$build" -j "$(nproc)" --target tfe-bench tfe-plan >>"$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    return 1
  fi
  export TFE_CACHE_DIR="$PWD/$build/kernel-cache"
  local plan="$build/tfe-plan" bench="$build/bench/tfe-bench"
  local metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size
  metrics+=,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
  # What a latency-bound kernel waits on: instructions, and cycles per issued instruction by stall reason.
  metrics+=,smsp__inst_executed.sum,'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'

  local csvs=()
  for preset in $presets; do
    local head="$work/$preset.tfe"
    [ -s "$head" ] || "$plan" random --preset "$preset" --seed 1 --fp8 -o "$head" || return 1
    for dtype in $dtypes; do
      local mode tag
      mode=$([ "$dtype" = fp8 ] && echo auto || echo off)
      tag="$preset-$dtype"
      echo "== $tag: step time (graphs)"
      "$bench" --head "$head" --fp8 "$mode" --streams "$streams" --steps 1,8 --iters 30 --no-eager --extend-iters 1 \
        --copy-gib 1 --json "$work/time-$tag.json" >"$out/time-$tag.log" 2>&1 || { tail -5 "$out/time-$tag.log"; }
      for b in ${streams//,/ }; do
        echo "== $tag: ncu, $b streams"
        ncu --profile-from-start off --clock-control none --cache-control none --metrics "$metrics" --csv --page raw \
          "$bench" --head "$head" --fp8 "$mode" --streams "$b" --profile >"$out/ncu-$tag-$b.csv" 2>"$out/ncu-$tag-$b.err" ||
          { tail -5 "$out/ncu-$tag-$b.err"; }
        csvs+=(--ncu "$tag" "$b" "$out/ncu-$tag-$b.csv" "$work/time-$tag.json")
      done
    done
  done
  python3 bench/profile_table.py "${csvs[@]}" --json "$out/profile.json"
}

main 2>&1 | tee "$out/profile.log"
exit "${PIPESTATUS[0]}"
