#!/usr/bin/env bash
# A/B of tfe-bench settings on whole draft steps, in one run on a machine with a CUDA device. Each named
# setting (NAME='tfe-bench options') runs for every preset and dtype, the settings alternated AB_ROUNDS
# times so that drift hits them alike. Prints us per step at 8 steps (graph replay) per (preset, dtype,
# streams), one column per setting with every round's figure, and checks that every setting's drafts
# equal the first setting's byte for byte (a setting may change speed, never tokens).
#
# Usage: bench/ab.sh [BUILD_DIR] NAME='OPTIONS' [NAME='OPTIONS' ...]
#   e.g. bench/ab.sh build-gpu off='--dependent-launch off' all='--dependent-launch all'
# NAME@DIR='OPTIONS' runs the tfe-bench of DIR, a build already made (of another source tree, say), instead
# of BUILD_DIR's: kernel changes are measured that way, the older tree's build against this one's. Where
# two builds differ in arithmetic their drafts may differ at near-ties, and the check below says so.
# Environment: OUT (default out/ab) receives build.log, per-run JSON and logs, and ab.txt (the table);
#   BENCH_WORK (default /tmp/tfe-bench, shared with bench.sh) holds the random heads; AB_PRESETS (default
#   "llama3-8b-eagle3 tfe-two-stage"); AB_STREAMS (default 1,2,4,8,16); AB_ITERS (default 30); AB_ROUNDS
#   (default 2); AB_STEPS (default 8): with several step counts (e.g. 1,2,4,8) a second table gives each
#   setting's call as a line over steps, its fixed term a call and its slope a step (a per-call change
#   shows in the first, a per-step one in the second); AB_DRAFTS (default `equal`): `report` lists the
#   settings whose drafts differ without failing the run, for settings that change the drafts on purpose
#   (`--knock-out`); a failed or missing run still fails it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/build_lib.sh
. scripts/build_lib.sh
build="build-gpu"
if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then build=$1; shift; fi
[ $# -ge 1 ] || { echo "usage: bench/ab.sh [BUILD_DIR] NAME='OPTIONS' ..." >&2; exit 2; }
out=${OUT:-out/ab}
work=${BENCH_WORK:-/tmp/tfe-bench}
presets=${AB_PRESETS:-"llama3-8b-eagle3 tfe-two-stage"}
mkdir -p "$out" "$work"
names=()
declare -A options builds
for arg in "$@"; do
  name=${arg%%=*}
  dir=$build
  if [[ "$name" == *@* ]]; then
    dir=${name#*@}
    name=${name%%@*}
  fi
  [[ "$name" =~ ^[A-Za-z0-9_]+$ && "$arg" == *=* ]] || { echo "ab.sh: '$arg' is not NAME[@DIR]='OPTIONS'" >&2; exit 2; }
  names+=("$name")
  options[$name]=${arg#*=}
  builds[$name]=$dir
done

if ! configure_build . "$build" >"$out/build.log" 2>&1 ||
   ! cmake --build "$build" -j "$(nproc)" --target tfe-bench tfe-plan >>"$out/build.log" 2>&1; then
  tail -30 "$out/build.log"
  exit 1
fi
export TFE_CACHE_DIR="$PWD/$build/kernel-cache"
for preset in $presets; do
  [ -s "$work/$preset.tfe" ] || "$build/tfe-plan" random --preset "$preset" --seed 1 --fp8 -o "$work/$preset.tfe" >/dev/null
done

# This run's files only: a setting's results from an earlier run in the same OUT would join its rows.
for name in "${names[@]}"; do rm -f "$out/$name".*; done

status=0
for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  for name in "${names[@]}"; do
    for preset in $presets; do
      for dtype in bf16 fp8; do
        mode=$([ "$dtype" = fp8 ] && echo auto || echo off)
        run="$out/$name.$preset.$dtype.$round"
        # shellcheck disable=SC2086  # the setting's options are words on purpose
        if ! "${builds[$name]}/bench/tfe-bench" --head "$work/$preset.tfe" --fp8 "$mode" --streams "${AB_STREAMS:-1,2,4,8,16}" \
            --steps "${AB_STEPS:-8}" --iters "${AB_ITERS:-30}" --no-eager --json "$run.json" \
            --drafts-out "$run.drafts" \
            ${options[$name]} >"$run.log" 2>&1; then
          echo "!! tfe-bench $name $preset $dtype round $round failed (log: $run.log)"
          status=1
        fi
      done
    done
  done
done

python3 - "$out" "${names[@]}" <<'EOF' | tee "$out/ab.txt"
import filecmp, glob, json, os, sys
out, names = sys.argv[1], sys.argv[2:]
cells, floor, lines, most = {}, {}, {}, 0
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    name, preset, dtype, rnd = os.path.basename(path)[:-5].split(".")
    if name not in names:
        continue
    j = json.load(open(path))
    top = max((d["steps"] for d in j.get("draft", [])), default=0)  # this run's longest call
    most = max(most, top)
    for d in j.get("draft", []):
        if d["steps"] != top:
            continue
        key = (preset, dtype, d["streams"])
        cells.setdefault(key, {}).setdefault(name, []).append(d["graph_us_per_step"])
        floor[key] = d["floor_us_per_step"]
    for l in j.get("per_streams", []):
        key = (preset, dtype, l["streams"])
        lines.setdefault(key, {}).setdefault(name, []).append((l["graph_call_fixed_us"], l["graph_step_us"]))
if not cells:
    print(f"no results in {out}: every tfe-bench run failed or wrote no JSON")
    sys.exit(1)
print(f"us per step at {most} steps (graph replay), every round; floor = bytes / copy bandwidth")
print(f"{'preset':18} {'dtype':5} {'streams':>7} " + " ".join(f"{n:>16}" for n in names) + f" {'floor':>7}")
for key in sorted(cells):
    row = " ".join(f"{' / '.join(f'{x:.1f}' for x in cells[key].get(n, [])) or '-':>16}" for n in names)
    print(f"{key[0]:18} {key[1]:5} {key[2]:7} {row} {floor[key]:7.1f}")
if lines:
    print("a call as a line over steps: fixed us a call + us a step, every round")
    print(f"{'preset':18} {'dtype':5} {'streams':>7} " + " ".join(f"{n:>26}" for n in names))
    for key in sorted(lines):
        row = " ".join(f"{' / '.join(f'{a:.1f}+{b:.1f}' for a, b in lines[key].get(n, [])) or '-':>26}" for n in names)
        print(f"{key[0]:18} {key[1]:5} {key[2]:7} {row}")
# Every other setting's drafts against the first's, run by run; a missing file (a failed run) is a failure.
differ, missing, compared = [], [], 0
for path in sorted(glob.glob(os.path.join(out, names[0] + ".*.json"))):
    base = path[:-5].replace(os.path.join(out, names[0] + "."), "", 1)
    for n in names:
        if not os.path.exists(os.path.join(out, f"{n}.{base}.drafts")):
            missing.append(f"{n}.{base}.drafts")
    first = os.path.join(out, f"{names[0]}.{base}.drafts")
    for n in names[1:]:
        other = os.path.join(out, f"{n}.{base}.drafts")
        if os.path.exists(first) and os.path.exists(other):
            compared += 1
            if not filecmp.cmp(first, other, shallow=False):
                differ.append(os.path.basename(other))
if differ:
    print("drafts DIFFER: " + ", ".join(differ))
if missing:
    print("drafts missing: " + ", ".join(sorted(set(missing))))
if not differ and not missing:
    print(f"drafts: every setting equals {names[0]} ({compared} runs compared)")
sys.exit(1 if missing or (differ and os.environ.get("AB_DRAFTS", "equal") != "report") else 0)
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
