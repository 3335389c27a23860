#!/usr/bin/env bash
# The main job on a built-in default head: set-up, build, make the head, plan and compile it; then
# with a GPU run the engine loop (examples/draft_loop) on it, without one run the CPU reference.
# Usage: scripts/run.sh [--preset NAME] [--fp8]      (default preset: llama3-8b-eagle3)
set -euo pipefail
cd "$(dirname "$0")/.."
preset=llama3-8b-eagle3
fp8=()
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset=$2; shift 2 ;;
    --fp8) fp8=(--fp8); shift ;;
    *) echo "usage: scripts/run.sh [--preset NAME] [--fp8]" >&2; exit 2 ;;
  esac
done

scripts/setup.sh build
cmake --build build -j "$(nproc)"

work=out/$preset${fp8:+-fp8}
mkdir -p "$work"
head=$work/head.tfe
if [ ! -f "$head" ]; then
  echo "== tfe-plan random --preset $preset ${fp8[*]}" >&2
  build/tfe-plan random --preset "$preset" --seed 1 "${fp8[@]}" -o "$head"
fi
echo "== tfe-plan inspect" >&2
build/tfe-plan inspect "$head"
echo "== tfe-plan compile (deploy artifact)" >&2
build/tfe-plan compile "$head" -o "$work/artifact"

if [ -x build/examples/draft_loop ] && build/examples/draft_loop --probe >/dev/null 2>&1; then
  echo "== draft_loop on the GPU" >&2
  build/examples/draft_loop --head "$head" --artifact "$work/artifact"
else
  echo "== no GPU: CPU reference (tfe-plan reference)" >&2
  build/tfe-plan reference "$head" --streams 2 --rows 16 --steps 4 --seed 7 -o "$work/vectors.safetensors"
fi
