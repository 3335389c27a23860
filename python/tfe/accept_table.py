"""tfe-accept-table: the accept log's JSON lines (docs/runtime.md "The accept log") as a table by label
(e.g. prompt class) and window position, and optionally a plot of the acceptance rate by position.

    tfe-accept-table run1.jsonl run2.jsonl [--plot accept.png]

Lines of one label are summed across files. Per label and position: drafts asked (examined by the target),
kept, and the rate kept / asked; per label: rounds, sequences and tokens per round (mean kept + 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Iterable, Sequence


@dataclass
class LabelCounts:
    rounds: int = 0
    sequences: int = 0
    kept_tokens: float = 0.0
    asked: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)

    def add(self, line: dict) -> None:
        self.rounds += int(line["rounds"])
        self.sequences += int(line["sequences"])
        self.kept_tokens += float(line["mean_kept"]) * int(line["sequences"])
        for w in line["window"]:
            p = int(w["position"])
            while len(self.asked) < p:
                self.asked.append(0)
                self.kept.append(0)
            self.asked[p - 1] += int(w["asked"])
            self.kept[p - 1] += int(w["kept"])

    def rate(self, i: int) -> float | None:
        return self.kept[i] / self.asked[i] if self.asked[i] else None

    @property
    def tokens_per_round(self) -> float:
        return (self.kept_tokens / self.sequences if self.sequences else 0.0) + 1.0


def read_logs(paths: Iterable[str]) -> dict[str, LabelCounts]:
    """Sums the lines of every file per label (in the order labels first appear)."""
    out: dict[str, LabelCounts] = {}
    for path in paths:
        with open(path) as f:
            for n, text in enumerate(f, 1):
                if not text.strip():
                    continue
                try:
                    line = json.loads(text)
                    out.setdefault(str(line.get("label", "")), LabelCounts()).add(line)
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}:{n}: not an accept log line ({e})") from None
    return out


def table(counts: dict[str, LabelCounts]) -> str:
    rows = [f"{'label':<16} {'pos':>3} {'asked':>10} {'kept':>10} {'rate':>6}"]
    for label, c in counts.items():
        for i in range(len(c.asked)):
            r = c.rate(i)
            rate = f"{r:6.3f}" if r is not None else f"{'-':>6}"
            rows.append(f"{label or '-':<16} {i + 1:>3} {c.asked[i]:>10} {c.kept[i]:>10} {rate}")
    rows.append("")
    rows.append(f"{'label':<16} {'rounds':>10} {'sequences':>10} {'tokens/round':>12}")
    for label, c in counts.items():
        rows.append(f"{label or '-':<16} {c.rounds:>10} {c.sequences:>10} {c.tokens_per_round:>12.3f}")
    return "\n".join(rows)


def plot(counts: dict[str, LabelCounts], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("tfe-accept-table: --plot needs matplotlib (pip install matplotlib)") from None
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, c in counts.items():
        xs = [i + 1 for i in range(len(c.asked)) if c.asked[i]]
        ax.plot(xs, [c.rate(x - 1) for x in xs], marker="o", label=f"{label or '-'} ({c.tokens_per_round:.2f} tok/round)")
    ax.set_xlabel("window position")
    ax.set_ylabel("acceptance rate (kept / asked)")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="tfe-accept-table",
        description="Tabulates accept-log JSON lines (TFE_ACCEPT_LOG, tfe-speculate --accept-lines) by label and "
        "window position.",
    )
    p.add_argument("logs", nargs="+", help="JSON-lines files; lines of one label are summed across them")
    p.add_argument("--plot", metavar="FILE.png", help="draw the acceptance rate by position, one line per label")
    a = p.parse_args(argv)
    try:
        counts = read_logs(a.logs)
    except (OSError, ValueError) as e:
        print(f"tfe-accept-table: {e}", file=sys.stderr)
        return 1
    if not counts:
        print("tfe-accept-table: no lines in " + ", ".join(a.logs), file=sys.stderr)
        return 1
    print(table(counts))
    if a.plot:
        plot(counts, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
