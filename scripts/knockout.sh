#!/usr/bin/env bash
# What each small kernel of a draft step costs inside the graph, on a machine with a CUDA device: per preset,
# `scripts/ab.sh` runs tfe-bench with each node that is not a GEMV left out of every pass alone
# (`--knock-out NAME`), then all of them at once, against the full pass, the settings alternated; a node's
# cost is the step with it less the step without it. Prints one table per preset and dtype: the step, the
# floor, each node's cost, all of them, and the step without them as a ratio to the floor; the same tables
# as Markdown in $OUT/knockout.md.
# (BENCHMARKS.md, "Inside the graph: what each small kernel costs".) The drafts of a knock-out are wrong:
# ab.sh runs with AB_DRAFTS=report, so it lists them as differing without failing; a failed run fails.
#
# Usage: scripts/knockout.sh [BUILD_DIR]   (default build-gpu)
# Environment: OUT (default out/knockout; one folder per preset below it), KNOCKOUT_PRESETS (default
#   "llama3-8b-eagle3 tfe-two-stage"), AB_STREAMS (default here 1,8,16), AB_ROUNDS, AB_ITERS as for ab.sh;
#   KNOCKOUT_TABLE_ONLY=1 runs nothing and prints the tables of the results already in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/build_lib.sh
. scripts/build_lib.sh
build=${1:-build-gpu}
out=${OUT:-out/knockout}
presets=${KNOCKOUT_PRESETS:-"llama3-8b-eagle3 tfe-two-stage"}
export AB_STREAMS=${AB_STREAMS:-1,8,16}
mkdir -p "$out"

status=0
run_presets=$presets
[ -n "${KNOCKOUT_TABLE_ONLY:-}" ] && run_presets=""  # only the tables, of an earlier run's $OUT
for preset in $run_presets; do
  # The first run of ab.sh below builds tfe-plan; the node list needs it before that.
  if [ ! -x "$build/tfe-plan" ]; then
    if ! configure_build . "$build" >"$out/build.log" 2>&1 ||
       ! cmake --build "$build" -j "$(nproc)" --target tfe-plan >>"$out/build.log" 2>&1; then
      tail -30 "$out/build.log"
      exit 1
    fi
  fi
  # Step 1's nodes with their kernels: every node but the GEMVs and the two a pass cannot run without.
  plan="$out/$preset.plan.yaml"
  "$build/tfe-plan" dump --preset "$preset" --buckets 1 --max-steps 1 -o "$plan" >/dev/null || exit 1
  mapfile -t small < <(awk '
    /^      - name: s1\./ { name = substr($3, 4) }
    /^        spec: / && name != "" {
      kernel = $2; sub(/__.*/, "", kernel)
      if (kernel !~ /^gemv/ && name != "load_tables" && name != "store_outputs") print name
      name = ""
    }' "$plan")
  [ "${#small[@]}" -gt 0 ] || { echo "knockout.sh: no small node found in $plan" >&2; exit 1; }
  all=$(IFS=,; echo "${small[*]}")
  settings=(base='')
  for n in "${small[@]}"; do settings+=("$n=--knock-out $n"); done
  settings+=("all_small=--knock-out $all")
  echo "== $preset: ${small[*]}"
  printf '%s\n' "${small[@]}" >"$out/$preset.nodes"  # the table's columns, in the pass's order
  AB_DRAFTS=report AB_PRESETS=$preset OUT="$out/$preset" \
    scripts/ab.sh "$build" "${settings[@]}" >"$out/$preset.ab.txt" 2>&1 || status=1
done

# shellcheck disable=SC2086  # the presets are words on purpose
python3 - "$out" $presets <<'EOF'
import glob, json, os, sys
out, presets = sys.argv[1], sys.argv[2:]
markdown = []  # the same tables for BENCHMARKS.md, written to knockout.md rather than copied by hand
for preset in presets:
    cells, floor, names = {}, {}, []
    for path in sorted(glob.glob(os.path.join(out, preset, "*.json"))):
        name, _, dtype, _ = os.path.basename(path)[:-5].split(".")
        j = json.load(open(path))
        top = max((d["steps"] for d in j.get("draft", [])), default=0)
        if name not in names:
            names.append(name)
        for d in j.get("draft", []):
            if d["steps"] == top:
                cells.setdefault((dtype, d["streams"], name), []).append(d["graph_us_per_step"])
                floor[(dtype, d["streams"])] = d["floor_us_per_step"]
    if not floor:
        print(f"{preset}: no results (see {out}/{preset}.ab.txt)")
        continue
    order_file = os.path.join(out, preset + ".nodes")
    order = open(order_file).read().split() if os.path.exists(order_file) else []
    nodes = [n for n in order if n in names] + sorted(n for n in names if n not in order + ["base", "all_small"])
    mean = lambda key: sum(cells[key]) / len(cells[key]) if key in cells else float("nan")
    print(f"{preset}: us a step at the longest call (graph replay, mean of rounds); a node's column: the step "
          f"less the step without it")
    head = f"{'dtype':5} {'streams':>7} {'step':>7} {'floor':>7} " + " ".join(f"{n:>12}" for n in nodes)
    print(head + f" {'all small':>10} {'without':>8} {'ratio':>6}")
    for dtype, streams in sorted(floor):
        base = mean((dtype, streams, "base"))
        costs = " ".join(f"{base - mean((dtype, streams, n)):12.1f}" for n in nodes)
        rest = mean((dtype, streams, "all_small"))
        f = floor[(dtype, streams)]
        print(f"{dtype:5} {streams:7} {base:7.1f} {f:7.1f} {costs} {base - rest:10.1f} {rest:8.1f} {rest / f:6.2f}")
    markdown += ["", f"{preset}, us a step (a node's column: the step less the step without it)", "",
                 "| dtype | streams | step | floor | " + " | ".join(nodes) + " | all | without | ratio |",
                 "| --- " * (len(nodes) + 7) + "|"]
    for dtype, streams in sorted(floor):
        base, rest, f = mean((dtype, streams, "base")), mean((dtype, streams, "all_small")), floor[(dtype, streams)]
        costs = " | ".join(f"{base - mean((dtype, streams, n)):.1f}" for n in nodes)
        markdown.append(f"| {dtype} | {streams} | {base:.1f} | {f:.1f} | {costs} | {base - rest:.1f} | {rest:.1f} | "
                        f"{rest / f:.2f} |")
if markdown:
    with open(os.path.join(out, "knockout.md"), "w") as md:
        md.write("\n".join(markdown[1:]) + "\n")
    print(f"as Markdown: {os.path.join(out, 'knockout.md')}")
EOF
exit $status
