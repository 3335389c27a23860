"""One engine round on device-resident data from Python, against the same round from C++ (round_cost).

A round, as an engine runs it once the target has verified: extend every slot by the accepted rows (taps
and tokens already CUDA tensors, as the target's forward left them), then enqueue the next draft (slot ids
a CUDA tensor). Python's extend comes in two forms:
  list   extend([(slot, first_pos, taps_i, tokens_i), ...]): one tensor pair a slot;
  batch  extend_batch(slots, first_pos, counts, taps, tokens, starts=...): one pair for every slot, rows
         read where the verify left them.
Per configuration, medians over --rounds rounds:
  call_us   host time inside the two calls (extend_us and draft_us apart);
  door_us   of that, the time outside the library, per call: the Python door (argument checks, DLPack
            imports, the GIL), from the library's own clock (stats()["library_ns"]) in the same calls;
  round_us  from the first call to the stream's completion of the draft.
Then the C++ binary runs the same rounds on the same head: its call_us and round_us. (The difference of
call_us is not the door: a call's host time includes waits on the device, e.g. for a staging buffer, and
those differ with the caller's speed.) Last, what torch's own __dlpack__ costs a CUDA tensor, the floor of
every tensor that crosses into any extension.

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
    # The verify's rows: steps + 1 a slot, of which the first `rows` are kept.
    per_slot = args.steps + 1
    taps = (torch.rand((most * per_slot, width), device="cuda", generator=gen) * 0.01).to(torch.bfloat16)
    tokens = torch.randint(0, h["vocab"], (most * per_slot,), device="cuda", dtype=torch.int32, generator=gen)
    ids = torch.arange(most, device="cuda", dtype=torch.int32)
    results = []
    for form in ("list", "batch"):
        for n in args.slots:
            for s in range(most):
                rt.reset(s)
            nxt = [0] * n
            slices = [(taps[s * per_slot:s * per_slot + args.rows], tokens[s * per_slot:s * per_slot + args.rows])
                      for s in range(n)]
            slots, counts, starts = list(range(n)), [args.rows] * n, [s * per_slot for s in range(n)]
            slot_ids = ids[:n]

            def round_():
                lib0 = rt.stats()["library_ns"]
                if form == "list":
                    requests = [(s, nxt[s], slices[s][0], slices[s][1]) for s in range(n)]
                    t0 = time.perf_counter()
                    rt.extend(requests)
                else:
                    first = list(nxt)
                    t0 = time.perf_counter()
                    rt.extend_batch(slots, first, counts, taps, tokens, starts=starts)
                t1 = time.perf_counter()
                rt.draft_async(slot_ids, args.steps)
                t2 = time.perf_counter()
                torch.cuda.current_stream().synchronize()
                t3 = time.perf_counter()
                for s in range(n):
                    nxt[s] += args.rows
                door = ((t2 - t0) * 1e9 - (rt.stats()["library_ns"] - lib0)) / 2e3
                return (t2 - t0) * 1e6, (t3 - t0) * 1e6, (t1 - t0) * 1e6, (t2 - t1) * 1e6, door

            for _ in range(20):
                round_()
            timed = [round_() for _ in range(args.rounds)]
            med = [statistics.median(t[i] for t in timed) for i in range(5)]
            results.append({"side": "python", "form": form, "slots": n, "rows": args.rows, "steps": args.steps,
                            "rounds": args.rounds, "call_us": med[0], "round_us": med[1], "extend_us": med[2],
                            "draft_us": med[3], "door_us": med[4]})
            print(json.dumps(results[-1]), flush=True)
    rt.close()
    return results


def dlpack_us():
    """Median host time of torch's __dlpack__ on a CUDA tensor (what any extension's import starts with)."""
    t = torch.zeros((4, 8), device="cuda", dtype=torch.bfloat16)
    times = []
    for _ in range(2000):
        t0 = time.perf_counter()
        t.__dlpack__()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


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
    py = {(r["form"], r["slots"]): r for r in python_rounds(args)}
    cpp = {r["slots"]: r for r in cpp_rounds(args)}
    print(f"\nOne round: extend {args.rows} device rows per slot + draft_async of {args.steps} steps; "
          f"medians of {args.rounds} rounds; Python's extend in the list and the batch form")
    print(f"{'slots':>5} {'form':>6} {'C++ call us':>12} {'Py call us':>11} {'extend us':>10} {'draft us':>9} "
          f"{'door us/call':>13} {'C++ round us':>13} {'Py round us':>12} {'Py/C++':>7}")
    for form in ("list", "batch"):
        for n in args.slots:
            c, q = cpp[n], py[(form, n)]
            door = q["door_us"]
            print(f"{n:>5} {form:>6} {c['call_us']:>12.1f} {q['call_us']:>11.1f} {q['extend_us']:>10.1f} "
                  f"{q['draft_us']:>9.1f} {door:>13.1f} {c['round_us']:>13.1f} {q['round_us']:>12.1f} "
                  f"{q['round_us'] / c['round_us']:>7.2f}")
    print(f"torch's own __dlpack__ of one CUDA tensor: {dlpack_us():.1f} us (median of 2000)")


if __name__ == "__main__":
    main()
