"""One engine round on device-resident data from Python, against the same round from C++ (round_cost).

A round, as an engine runs it once the target has verified: extend every slot by the accepted rows (taps
and tokens already CUDA tensors, as the target's forward left them), then enqueue the next draft (slot ids
a CUDA tensor). Per configuration, medians over --rounds rounds:
  call_us   host time inside the two calls;
  round_us  from the first call to the stream's completion of the draft.
Then the C++ binary runs the same rounds on the same head in the same process tree, and a table gives
the Python door's cost per call: (python call_us - c++ call_us) / 2 calls.

Usage: python bench/round_cost.py --head HEAD.tfe --round-cost build/bench/round_cost [--slots 1 4 16]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

import tfe


def python_rounds(args):
    rt = tfe.Runtime(args.head, stream=torch.cuda.current_stream(), max_slots=max(16, max(args.slots)),
                     max_steps=max(8, args.steps))
    h = rt.header
    width = len(h["taps"]) * h["target_hidden"]
    most = max(args.slots)
    gen = torch.Generator(device="cuda").manual_seed(1)
    taps = (torch.rand((most * args.rows, width), device="cuda", generator=gen) * 0.01).to(torch.bfloat16)
    tokens = torch.randint(0, h["vocab"], (most * args.rows,), device="cuda", dtype=torch.int32, generator=gen)
    ids = torch.arange(most, device="cuda", dtype=torch.int32)
    results = []
    for n in args.slots:
        for s in range(most):
            rt.reset(s)
        nxt = [0] * n
        slices = [(taps[s * args.rows:(s + 1) * args.rows], tokens[s * args.rows:(s + 1) * args.rows])
                  for s in range(n)]
        slot_ids = ids[:n]

        def round_():
            requests = [(s, nxt[s], slices[s][0], slices[s][1]) for s in range(n)]
            for s in range(n):
                nxt[s] += args.rows
            t0 = time.perf_counter()
            rt.extend(requests)
            rt.draft_async(slot_ids, args.steps)
            t1 = time.perf_counter()
            torch.cuda.current_stream().synchronize()
            t2 = time.perf_counter()
            return (t1 - t0) * 1e6, (t2 - t0) * 1e6

        for _ in range(20):
            round_()
        timed = [round_() for _ in range(args.rounds)]
        results.append({"side": "python", "slots": n, "rows": args.rows, "steps": args.steps,
                        "rounds": args.rounds, "call_us": statistics.median(t[0] for t in timed),
                        "round_us": statistics.median(t[1] for t in timed)})
        print(json.dumps(results[-1]), flush=True)
    rt.close()
    return results


def cpp_rounds(args):
    cmd = [args.round_cost, "--head", args.head, "--rows", str(args.rows), "--steps", str(args.steps),
           "--rounds", str(args.rounds), "--slots", *map(str, args.slots)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for r in results:
        print(json.dumps(r), flush=True)
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head", required=True, help="head file (.tfe)")
    p.add_argument("--round-cost", required=True, help="the C++ round_cost binary (build/bench/round_cost)")
    p.add_argument("--slots", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--rows", type=int, default=3, help="accepted rows a slot extends by each round")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=500)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("round_cost.py: needs a CUDA device")
    py = {r["slots"]: r for r in python_rounds(args)}
    cpp = {r["slots"]: r for r in cpp_rounds(args)}
    print(f"\nOne round: extend {args.rows} device rows per slot + draft_async of {args.steps} steps; "
          f"medians of {args.rounds} rounds")
    print(f"{'slots':>5} {'C++ call us':>12} {'Py call us':>11} {'door us/call':>13} "
          f"{'C++ round us':>13} {'Py round us':>12} {'Py/C++':>7}")
    for n in args.slots:
        c, q = cpp[n], py[n]
        door = (q["call_us"] - c["call_us"]) / 2
        print(f"{n:>5} {c['call_us']:>12.1f} {q['call_us']:>11.1f} {door:>13.1f} "
              f"{c['round_us']:>13.1f} {q['round_us']:>12.1f} {q['round_us'] / c['round_us']:>7.2f}")


if __name__ == "__main__":
    main()
