#!/usr/bin/env python3
"""Per-kernel table of one draft step from ncu CSVs written by bench/profile.sh.

Each --ncu TAG STREAMS CSV TIME_JSON names one profile: the ncu raw-page CSV of one graph replay of
(STREAMS, 1 step) and the tfe-bench JSON of the same head and dtype, which gives the measured step time
(the per-step slope of the draft call over steps 1 and 8) and the copy bandwidth. Per kernel: time, DRAM
bytes read, the rate it read them at, and its share of the copy bandwidth; then the sum of kernel times
against the measured step and the floor. ncu replays each node alone, so a kernel's time there includes
its own launch and ramp; in a graph replay those overlap, and the step can take less than the sum.
Where the CSV has them (profile.sh asks for them), also each kernel's instructions a warp, the cycles a
warp waits per instruction it issues, and the two largest stall reasons in those cycles (ncu's
smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio): what a latency-bound kernel waits on.
"""
import argparse
import csv
import json
import re
import sys


def short_name(name):
    """'void tfe::kernels::gemv<tfe::kernels::cfg_...>(tfe::kernels::GemvParams)' -> 'gemv<cfg_...>'."""
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*\)$", "", name)
    return name.replace("tfe::kernels::", "")


def read_ncu(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own lines before the CSV
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        return []
    header, units, data = rows[0], rows[1], rows[2:]
    col = {n: i for i, n in enumerate(header)}
    stall_cols = {m.group(1): i for i, n in enumerate(header)
                  if (m := re.fullmatch(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio", n))}
    out = []
    for r in data:
        def num(metric):
            v = r[col[metric]].replace(",", "")
            return float(v) if v not in ("", "n/a") else 0.0
        scale_t = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[units[col["gpu__time_duration.sum"]]]
        scale_b = {"byte": 1, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9, "B": 1}[units[col["dram__bytes_read.sum"]]]
        stalls = {}
        for reason, i in stall_cols.items():
            v = r[i].replace(",", "")
            stalls[reason] = float(v) if v not in ("", "n/a") else 0.0
        warps = num("launch__grid_size") * num("launch__block_size") / 32
        out.append({
            "name": short_name(r[col["Kernel Name"]]),
            "inst_per_warp": num("smsp__inst_executed.sum") / warps if "smsp__inst_executed.sum" in col and warps else None,
            "stalls": stalls,
            "us": num("gpu__time_duration.sum") * scale_t,
            "read": num("dram__bytes_read.sum") * scale_b,
            "grid": int(num("launch__grid_size")),
            "block": int(num("launch__block_size")),
            "regs": int(num("launch__registers_per_thread")),
            "occ": num("sm__warps_active.avg.pct_of_peak_sustained_active"),
        })
    return out


def stall_text(k):
    """' inst/warp 2232, 6.7 cyc/inst: wait 1.3, long_scoreboard 1.0' (empty without the metrics)."""
    if not k.get("stalls") or not k.get("inst_per_warp"):
        return ""
    cycles = sum(k["stalls"].values())  # every reason, 'selected' (the issue cycle itself) included
    top = sorted(((v, n) for n, v in k["stalls"].items() if n != "selected"), reverse=True)[:2]
    return (f"  inst/warp {k['inst_per_warp']:.0f}, {cycles:.1f} cyc/inst: "
            + ", ".join(f"{n} {v:.1f}" for v, n in top))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ncu", nargs=4, action="append", metavar=("TAG", "STREAMS", "CSV", "TIME_JSON"), required=True)
    ap.add_argument("--json", help="write the parsed kernels and sums as JSON")
    a = ap.parse_args()
    report = []
    for tag, streams, path, time_json in a.ncu:
        kernels = read_ncu(path)
        step_us = floor_us = gbps = None
        try:
            t = json.load(open(time_json))
            gbps = t.get("copy_bandwidth", {}).get("gbps")
            for l in t.get("per_streams", []):
                if l["streams"] == int(streams):
                    step_us, floor_us = l.get("graph_step_us"), l.get("floor_us")
        except (OSError, ValueError):
            pass
        print(f"\n{tag}, {streams} streams: one step, kernel by kernel (ncu, each node alone)")
        if not kernels:
            print("  no kernels profiled")
            continue
        print(f"  {'kernel':<58} {'grid':>6} {'blk':>4} {'regs':>4} {'occ%':>5} {'us':>8} {'MB read':>8} {'GB/s':>7} {'%copy':>6}")
        for k in kernels:
            rate = k["read"] / (k["us"] * 1e-6) / 1e9 if k["us"] > 0 else 0.0
            share = f"{100 * rate / gbps:6.1f}" if gbps else "     -"
            print(f"  {k['name'][:58]:<58} {k['grid']:>6} {k['block']:>4} {k['regs']:>4} {k['occ']:>5.1f} {k['us']:>8.2f} "
                  f"{k['read'] / 1e6:>8.2f} {rate:>7.0f} {share}{stall_text(k)}")
        total = sum(k["us"] for k in kernels)
        read = sum(k["read"] for k in kernels)
        line = f"  {len(kernels)} kernels: {total:.1f} us, {read / 1e6:.1f} MB read"
        if step_us:
            d = step_us - total
            how = "gaps between nodes" if d >= 0 else "less than the sum: ncu times each node with its own launch"
            line += f"; step measured {step_us:.1f} us ({d:+.1f} us, {how})"
        if floor_us:
            line += f"; floor {floor_us:.1f} us"
        print(line)
        report.append({"tag": tag, "streams": int(streams), "kernels": kernels, "kernel_us": total,
                       "step_us": step_us, "floor_us": floor_us})
    if a.json:
        json.dump(report, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
