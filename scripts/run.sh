#!/usr/bin/env bash
# Usage: scripts/run.sh [--preset NAME] [--fp8]
#   --preset NAME   the head's shape (default llama3-8b-eagle3): PRESETS
#   --fp8           add the FP8 e4m3 form of every linear in use
#
# The main job on a built-in head of random weights: installs what building needs (scripts/setup.sh),
# builds tfe-plan and examples/draft_loop in build-run/ (no tests, so no test-only packages), makes the
# head, inspects it and compiles its deploy artifact; then, with a GPU, runs the engine loop
# (examples/draft_loop) on it, without one the CPU reference (tfe-plan reference). All it makes goes to
# out/PRESET/ (out/PRESET-fp8/ with --fp8); a second run reuses the head and the compiled kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
build="build-run"

# The presets as head/presets.cpp lists them, so that a misspelt name is refused before a build of minutes.
presets=$(sed -n 's/.*preset_names() *{ *return *{\(.*\)}; *}.*/\1/p' head/presets.cpp | tr -d '" ' | tr ',' ' ')
usage() { sed -n "2,${1:-10}p" "$0" | sed 's/^# \{0,1\}//' | sed "s/PRESETS/${presets// /, }/"; }

preset=llama3-8b-eagle3
fp8=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --preset)
      if [ $# -lt 2 ] || [[ $2 == -* ]]; then
        echo "run.sh: --preset needs a name: ${presets// /, }" >&2
        exit 2
      fi
      preset=$2; shift 2 ;;
    --preset=*) preset=${1#--preset=}; shift ;;
    --fp8) fp8=(--fp8); shift ;;
    *) echo "run.sh: unknown argument '$1'" >&2; usage 4 >&2; exit 2 ;;
  esac
done
if [ -n "$presets" ] && [[ " $presets " != *" $preset "* ]]; then
  echo "run.sh: unknown preset '$preset'; the presets are ${presets// /, }" >&2
  exit 2
fi

scripts/setup.sh
# shellcheck source=scripts/build_lib.sh
. scripts/build_lib.sh
if [ ! -f "$build/build.ninja" ]; then
  configure_build . "$build" -DTFE_TESTS=OFF >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target tfe-plan draft_loop
plan=$build/tfe-plan

work=out/$preset${fp8:+-fp8}
mkdir -p "$work"
head=$work/head.tfe
# A head from an older build may not open with this one (a newer head format): it is made again.
if [ -f "$head" ] && ! "$plan" inspect "$head" >/dev/null 2>&1; then
  echo "== $head does not open with this build; making it again" >&2
  rm -f "$head"
fi
if [ ! -f "$head" ]; then
  echo "== tfe-plan random --preset $preset ${fp8[*]}" >&2
  "$plan" random --preset "$preset" --seed 1 "${fp8[@]}" -o "$head"
fi
echo "== tfe-plan inspect $head" >&2
"$plan" inspect "$head"
echo "== tfe-plan compile $head (deploy artifact)" >&2
"$plan" compile "$head" -o "$work/artifact"

row() { printf '  %-24s %6s  %s\n' "$1" "$(du -sh "$2" | cut -f1)" "$2"; }
if "$build/examples/draft_loop" --probe >/dev/null 2>&1; then
  echo "== draft_loop on the GPU" >&2
  "$build/examples/draft_loop" --head "$head" --artifact "$work/artifact"
  ran="the engine loop on the GPU (examples/draft_loop)"
  made=()
  what_next="a longer loop"
  next="$build/examples/draft_loop --head $head --artifact $work/artifact --slots 16 --steps 8 --rounds 1000"
else
  echo "== no GPU: the CPU reference (tfe-plan reference)" >&2
  "$plan" reference "$head" --streams 2 --rows 16 --steps 4 --seed 7 -o "$work/vectors.safetensors"
  ran="test vectors from the CPU reference (no GPU here)"
  made=("reference vectors" "$work/vectors.safetensors")
  what_next="more vectors"
  next="$plan reference $head --streams 4 --rows 64 --steps 8 --seed 1 -o $work/more.safetensors"
fi

echo
echo "done: a random $preset head${fp8:+ with FP8 forms}, its deploy artifact, and $ran"
row "head file" "$head"
row "deploy artifact" "$work/artifact"
[ ${#made[@]} -eq 0 ] || row "${made[@]}"
echo "next:"
printf '  %-13s %s\n' "$what_next" "$next" \
  "the plan" "$plan dump $head -o $work/plan.yaml" \
  "every tool" "$plan --help" \
  "the tests" "scripts/test.sh"
