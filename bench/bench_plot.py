#!/usr/bin/env python3
"""Joins tfe-bench and torch_head.py results, prints one compact table and draws one PNG.

  bench_plot.py --pair TFE.json TORCH.json [--pair ...] [--from COMBINED.json]
                [--out-json COMBINED.json] [--png PLOT.png] [--steps 8]

Each --pair is one configuration (a head and its dtype): tfe-bench's --json and torch_head.py's --json on
the same head. --from reads the configurations of an earlier --out-json. A missing or unreadable file
leaves its side of the configuration empty (its cells print as "-") and is noted in the output.

The table and the plot compare per-step times (one draft call / steps, at --steps steps):
  tfe graph    the runtime's draft() with its captured graph replayed
  floor        step_bytes / device-to-device copy bandwidth (tfe-bench)
  ratio        tfe graph / floor
  tfe eager    the same passes launched node by node (graphs off)
  torch eager  the same head in plain PyTorch, op by op
  torch graph  that PyTorch pass captured in one torch.cuda.CUDAGraph and replayed
  speedup      torch graph / tfe graph
  agree        tfe's and PyTorch's drafts for the same inputs, tokens equal (%)
The plot has one panel per (preset, dtype): per-step time against streams for the five series.
"""
import argparse
import json
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f), None
    except Exception as e:
        return None, f"{path}: {type(e).__name__}: {e}"


def config_of(tfe, torch_json, notes):
    src = tfe or torch_json or {}
    return {"preset": src.get("preset", "?"), "dtype": src.get("dtype", "?"), "tfe": tfe, "torch": torch_json,
            "notes": notes}


def series(config, steps):
    """{streams: {series name: us per step}} at `steps` steps."""
    rows = {}
    tfe, th = config.get("tfe") or {}, config.get("torch") or {}
    for r in tfe.get("draft", []):
        if r.get("steps") != steps:
            continue
        cell = rows.setdefault(r["streams"], {})
        if "graph_us_per_step" in r:
            cell["tfe graph"] = r["graph_us_per_step"]
        if "eager_us_per_step" in r:
            cell["tfe eager"] = r["eager_us_per_step"]
        if r.get("floor_us_per_step"):
            cell["floor"] = r["floor_us_per_step"]
    for r in th.get("timing", []):
        if r.get("steps") != steps:
            continue
        cell = rows.setdefault(r["streams"], {})
        if "eager_us_per_step" in r:
            cell["torch eager"] = r["eager_us_per_step"]
        if "graph_us_per_step" in r:
            cell["torch graph"] = r["graph_us_per_step"]
    return dict(sorted(rows.items()))


def fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def table(configs, steps):
    head = (f"{'preset':<18} {'dtype':<5} {'streams':>7} {'tfe graph':>10} {'floor':>8} {'ratio':>6} {'tfe eager':>10} "
            f"{'torch eager':>11} {'torch graph':>11} {'speedup':>8} {'agree %':>8}")
    lines = [f"per-step times in us at {steps} steps (one draft call / steps)", head, "-" * len(head)]
    for c in configs:
        th = c.get("torch") or {}
        agree = (th.get("agreement") or {}).get("tokens_equal_pct")
        for streams, cell in series(c, steps).items():
            g, fl, tg = cell.get("tfe graph"), cell.get("floor"), cell.get("torch graph")
            lines.append(f"{c['preset']:<18} {c['dtype']:<5} {streams:>7} {fmt(g):>10} {fmt(fl):>8} "
                         f"{fmt(g / fl if g and fl else None, '.2f'):>6} {fmt(cell.get('tfe eager')):>10} "
                         f"{fmt(cell.get('torch eager')):>11} {fmt(tg):>11} "
                         f"{fmt(tg / g if g and tg else None, '.2f'):>8} {fmt(agree):>8}")
        for n in c.get("notes", []):
            lines.append(f"  note: {n}")
        for side in ("tfe", "torch"):
            for part, err in ((c.get(side) or {}).get("errors") or {}).items():
                lines.append(f"  {side} {part} failed: {err}")
        a = th.get("agreement")
        if a:
            ties = a.get("first_disagreements_near_ties", 0)
            n = len(a.get("first_disagreements", []))
            kinds = a.get("first_disagreements_by_kind")
            why = (f"logit {kinds.get('logit', 0)}, cand_k boundary {kinds.get('boundary', 0)}" if kinds
                   else "top-2 margin")
            lines.append(f"  {c['preset']} {c['dtype']}: drafts {a['slots']}x{a['steps']}, {a['tokens_equal_pct']:.1f}% "
                         f"tokens equal, {a['slots_identical']} slots identical; {n} first disagreements, {ties} "
                         f"of them near-ties (gap < {a.get('near_tie_margin')}: {why})")
    return "\n".join(lines)


STYLE = {"tfe graph": ("tab:blue", "-", "o"), "tfe eager": ("tab:blue", "--", "s"),
         "torch graph": ("tab:orange", "-", "o"), "torch eager": ("tab:orange", "--", "s"),
         "floor": ("black", ":", None)}


def plot(configs, steps, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(configs)
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.5 * rows), squeeze=False)
    for ax, c in zip(axes.flat, configs):
        data = series(c, steps)
        streams = list(data)
        for name, (color, ls, marker) in STYLE.items():
            xs = [s for s in streams if name in data[s]]
            if xs:
                ax.plot(xs, [data[s][name] for s in xs], color=color, linestyle=ls, marker=marker, label=name)
        dev = ((c.get("tfe") or {}).get("device") or {}).get("name") or (c.get("torch") or {}).get("device", "")
        ax.set_title(f"{c['preset']} ({c['dtype']}){', ' + dev if dev else ''}", fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        if streams:
            ax.set_xticks(streams)
            ax.set_xticklabels([str(s) for s in streams])
        ax.set_xlabel("streams (slots per draft call)")
        ax.set_ylabel(f"us per draft step ({steps}-step call)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("TFE_JSON", "TORCH_JSON"))
    ap.add_argument("--from", dest="combined_in", help="configurations of an earlier --out-json")
    ap.add_argument("--out-json", help="write all configurations to one JSON file")
    ap.add_argument("--png", help="draw the plot here")
    ap.add_argument("--steps", type=int, default=8, help="steps of the calls compared")
    args = ap.parse_args()

    configs = []
    if args.combined_in:
        data, err = load(args.combined_in)
        if err:
            print(f"bench_plot: {err}", file=sys.stderr)
        else:
            configs.extend(data.get("configs", []))
    for tfe_path, torch_path in args.pair:
        tfe, e1 = load(tfe_path)
        th, e2 = load(torch_path)
        configs.append(config_of(tfe, th, [e for e in (e1, e2) if e]))
    if not configs:
        print("bench_plot: no configurations (give --pair or --from)", file=sys.stderr)
        return 2

    status = 0
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump({"steps_compared": args.steps, "configs": configs}, f, indent=1)
    print(table(configs, args.steps))
    if args.png:
        try:
            plot(configs, args.steps, args.png)
            print(f"plot: {args.png}")
        except Exception as e:
            print(f"bench_plot: no plot ({type(e).__name__}: {e})", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
