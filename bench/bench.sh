#!/usr/bin/env bash
# Benchmarks on a machine with a CUDA device, in one run of a few minutes:
#   build tfe-bench and tfe-plan; make random heads of llama3-8b-eagle3 and tfe-two-stage (each one file
#   with bf16 and FP8 forms); per head and dtype (bf16: --fp8 off, fp8: --fp8 auto) compile a deploy
#   artifact, run tfe-bench (bandwidth, open, capture, draft per streams x steps vs the floor, eager,
#   extend, drafts) and bench/torch_head.py (the same head in PyTorch, eager and CUDA graph, with the
#   agreement of its drafts with tfe's); then bench/bench_plot.py joins them into one JSON, one PNG and a
#   final table.
#
# Usage: bench/bench.sh [BUILD_DIR]   (default build-gpu; configured with .deps/ like scripts/gpu_test.sh)
# Environment: OUT (default out/bench) receives bench.log, build.log, bench.json, bench.png;
#   BENCH_WORK (default /tmp/tfe-bench) holds heads, artifacts and per-run files;
#   BENCH_BUDGET_S (default 420): later phases shrink their iterations or are skipped to stay inside it;
#   BENCH_PRESETS (default "llama3-8b-eagle3 tfe-two-stage"); BENCH_ITERS (default 50).
# A failing phase is reported and the rest still runs. Each phase line starts with the seconds elapsed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/build_lib.sh
. scripts/build_lib.sh
build=${1:-build-gpu}
out=${OUT:-out/bench}
work=${BENCH_WORK:-/tmp/tfe-bench}
budget=${BENCH_BUDGET_S:-420}
presets=${BENCH_PRESETS:-"llama3-8b-eagle3 tfe-two-stage"}
iters=${BENCH_ITERS:-50}
mkdir -p "$out" "$work"
start=$SECONDS
failures=()

phase() { echo "== [$((SECONDS - start)) s] $*"; }
left() { echo $((budget - (SECONDS - start))); }
# A command's time limit: what the budget leaves, less a reserve for the phases after it, within [20, cap].
limit() {
  local cap=$1 reserve=$2 l
  l=$(($(left) - reserve))
  [ "$l" -gt "$cap" ] && l=$cap
  [ "$l" -lt 20 ] && l=20
  echo "$l"
}
failed() { failures+=("$1"); echo "!! $1"; }

main() {
  phase "device"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv,noheader || failed "nvidia-smi"

  phase "configure and build ($build)"
  if ! configure_build . "$build" >"$out/build.log" 2>&1 ||
     ! cmake --build "$build" -j "$(nproc)" --target tfe-bench tfe-plan >>"$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    failed "build"
    phase "done: build failed"
    return 1
  fi
  export TFE_CACHE_DIR="$PWD/$build/kernel-cache"
  plan="$build/tfe-plan"
  bench="$build/bench/tfe-bench"

  phase "python"
  have_torch=0
  if python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"; then
    have_torch=1
  else
    failed "python3 with torch (the PyTorch columns stay empty)"
  fi
  python3 -c "import safetensors; print('safetensors', safetensors.__version__)" 2>/dev/null || echo "no safetensors package: torch_head.py reads the files itself"
  python3 -c "import matplotlib; print('matplotlib', matplotlib.__version__)" 2>/dev/null || echo "no matplotlib: no plot"

  # One file per preset holds both forms: --fp8 off runs its bf16 linears, --fp8 auto its FP8 forms.
  for preset in $presets; do
    head="$work/$preset.tfe"
    if [ -s "$head" ]; then
      phase "head $preset: reusing $head"
    else
      phase "head $preset: tfe-plan random --fp8"
      "$plan" random --preset "$preset" --seed 1 --fp8 -o "$head" || failed "random head $preset"
    fi
  done

  pairs=()
  configs=0
  for preset in $presets; do for dtype in bf16 fp8; do configs=$((configs + 1)); done; done
  done_configs=0

  # tfe first for every configuration (the numbers this script exists for), PyTorch after.
  for preset in $presets; do
    head="$work/$preset.tfe"
    [ -s "$head" ] || continue
    for dtype in bf16 fp8; do
      mode=$([ "$dtype" = fp8 ] && echo auto || echo off)
      tag="$preset-$dtype"
      remaining=$((configs - done_configs))
      done_configs=$((done_configs + 1))
      rm -f "$work/tfe-$tag.json" "$work/tfe-$tag.csv" "$work/drafts-$tag.safetensors"  # no stale results
      if [ "$(left)" -lt 45 ]; then
        failed "tfe-bench $tag skipped: budget spent"
        continue
      fi
      # Fewer iterations when the budget left is short of ~70 s per configuration still to run.
      n=$iters
      [ "$(left)" -lt $((remaining * 70)) ] && n=$((iters / 2 > 10 ? iters / 2 : 10))
      phase "artifact $tag: tfe-plan compile --fp8 $mode"
      artifact=()
      if "$plan" compile "$head" --fp8 "$mode" -o "$work/$tag.artifact" 2>&1 | tail -3; then
        artifact=(--artifact "$work/$tag.artifact")
      else
        failed "compile $tag (tfe-bench compiles at open instead)"
      fi
      phase "tfe-bench $tag (iters $n)"
      timeout -k 10 "$(limit 120 $((remaining * 40)))" "$bench" --head "$head" "${artifact[@]}" --fp8 "$mode" \
        --streams 1,2,4,8,16 --steps 1..8 --iters "$n" --json "$work/tfe-$tag.json" --csv "$work/tfe-$tag.csv" \
        --drafts-out "$work/drafts-$tag.safetensors"
      rc=$?
      [ $rc -eq 0 ] || failed "tfe-bench $tag (rc $rc)"
    done
  done

  # The PyTorch baseline is timed as a user would write it: F.linear in bf16 (cuBLAS's own fast path), logits
  # upcast to fp32. Its residual adds round twice, so a few drafts differ from tfe at near-ties; BENCH_TORCH_MATMUL=mm
  # times the exact-numerics variant (torch.mm with fp32 output) instead.
  torch_matmul=${BENCH_TORCH_MATMUL:-bf16}
  for preset in $presets; do
    for dtype in bf16 fp8; do
      tag="$preset-$dtype"
      [ -s "$work/$preset.tfe" ] || continue
      pairs+=(--pair "$work/tfe-$tag.json" "$work/torch-$tag.json")
      rm -f "$work/torch-$tag.json"
      [ "$have_torch" = 1 ] || continue
      if [ "$(left)" -lt 30 ]; then
        failed "torch_head $tag skipped: budget spent"
        continue
      fi
      drafts=()
      [ -s "$work/drafts-$tag.safetensors" ] && drafts=(--drafts "$work/drafts-$tag.safetensors")
      mode=$([ "$dtype" = fp8 ] && echo auto || echo off)
      n=$iters
      [ "$(left)" -lt 200 ] && n=$((iters / 2 > 10 ? iters / 2 : 10))
      phase "torch_head $tag (iters $n)"
      timeout -k 10 "$(limit 150 20)" python3 bench/torch_head.py --head "$work/$preset.tfe" "${drafts[@]}" \
        --fp8 "$mode" --matmul "$torch_matmul" --streams 1,2,4,8,16 --steps 1,8 --iters "$n" \
        --json "$work/torch-$tag.json"
      rc=$?
      [ $rc -eq 0 ] || failed "torch_head $tag (rc $rc)"
    done
  done

  phase "join, plot, table"
  if ! python3 bench/bench_plot.py "${pairs[@]}" --out-json "$out/bench.json" --png "$out/bench.png" --steps 8; then
    failed "bench_plot"
    # Keep the raw results in one file, whatever failed.
    for f in "$work"/tfe-*.json "$work"/torch-*.json; do
      [ -f "$f" ] && { echo "### $f"; cat "$f"; }
    done >"$out/raw_results.txt"
  fi
  for f in "$work"/tfe-*.csv; do [ -f "$f" ] && cat "$f"; done | awk 'NR == 1 || !/^preset,/' >"$out/draft_rows.csv"

  phase "done: ${#failures[@]} failures"
  for f in "${failures[@]}"; do echo "  $f"; done
  [ ${#failures[@]} -eq 0 ]
}

# Everything printed also goes to bench.log (the pipe ends only when main has, so the log is whole).
main 2>&1 | tee "$out/bench.log"
exit "${PIPESTATUS[0]}"
