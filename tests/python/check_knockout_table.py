"""scripts/knockout.sh's tables from a run's results, without a GPU: writes tfe-bench JSON as ab.sh names it
(SETTING.PRESET.DTYPE.ROUND.json) with known step times, runs knockout.sh with KNOCKOUT_TABLE_ONLY=1, and
checks every figure of the Markdown table: a node's cost is the base step less the step without it (the
mean of rounds), "all" the base less the step with every node left out, the ratio that step over the
floor; the columns in the pass's order (PRESET.nodes), and only the longest call's rows. Exit 1 on a
difference, naming it.

Usage: python3 check_knockout_table.py SOURCE_DIR"""
import json
import os
import subprocess
import sys
import tempfile

source = sys.argv[1]
# Step times (us) per setting at 8 steps and 1 / 8 streams; round 2 is 1 us slower, so means end in .5.
steps = {"base": (200.0, 210.0), "top1": (197.0, 207.0), "attention": (192.0, 199.0),
         "all_small": (185.0, 190.0)}
floor = {1: 178.0, 8: 180.0}
expected = [
    "| dtype | streams | step | floor | attention | top1 | all | without | ratio |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    # base 200.5 / 210.5; attention 192.5 / 199.5; top1 197.5 / 207.5; all 185.5 / 190.5
    "| bf16 | 1 | 200.5 | 178.0 | 8.0 | 3.0 | 15.0 | 185.5 | 1.04 |",
    "| bf16 | 8 | 210.5 | 180.0 | 11.0 | 3.0 | 20.0 | 190.5 | 1.06 |",
]
with tempfile.TemporaryDirectory() as out:
    os.makedirs(os.path.join(out, "P"))
    for name, (one, eight) in steps.items():
        for rnd in (1, 2):
            draft = [{"steps": 8, "streams": s, "graph_us_per_step": t + rnd - 1, "floor_us_per_step": floor[s]}
                     for s, t in ((1, one), (8, eight))]
            draft.append({"steps": 1, "streams": 1, "graph_us_per_step": 999.0, "floor_us_per_step": 1.0})
            with open(os.path.join(out, "P", f"{name}.P.bf16.{rnd}.json"), "w") as f:
                json.dump({"draft": draft}, f)
    with open(os.path.join(out, "P.nodes"), "w") as f:
        f.write("attention\ntop1\n")  # the pass's order, not the files' alphabetical one
    env = dict(os.environ, OUT=out, KNOCKOUT_PRESETS="P", KNOCKOUT_TABLE_ONLY="1")
    run = subprocess.run(["bash", os.path.join(source, "scripts", "knockout.sh")], env=env, capture_output=True,
                         text=True)
    if run.returncode != 0:
        sys.exit(f"knockout.sh exited {run.returncode}: {run.stdout}{run.stderr}")
    got = open(os.path.join(out, "knockout.md")).read().splitlines()
table = [line for line in got if line.startswith("|")]
if table != expected:
    print("knockout.md's table differs; expected:", *expected, "got:", *table, sep="\n")
    sys.exit(1)
print("knockout.sh's table: every figure as expected")
