"""Paired before/after bench: the same `python -m engine bench` in two checkouts, alternated.

    python tests/paired_bench.py BEFORE_DIR AFTER_DIR [--rounds 3] [--limit 3] -- <bench arguments>

Runs A B A B ... (so drift hits both alike), takes each cell's median tok/s and step ms per
checkout, and prints them with the change; exits 1 if any decode cell of AFTER is slower than
BEFORE by more than --limit percent. A device tool, not a test (pytest does not collect it).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys


def parse(out: str) -> dict[str, tuple[float | None, float | None]]:
    """{cell: (tok/s, step ms)} from the bench's table."""
    lines = out[out.index("cell\t"):].splitlines()[1:]
    cells = {}
    for line in lines:
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("decode graphs"):
            break
        num = [float(p.replace(",", "")) if p.strip() else None for p in parts[1:3]]
        cells[parts[0]] = (num[0], num[1])
    return cells


def run(checkout: str, args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": checkout}
    done = subprocess.run([sys.executable, "-m", "engine", "bench", *args], cwd=checkout, env=env,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"bench failed in {checkout}:\n{done.stderr[-3000:]}")
    return parse(done.stdout)


def fmt(v: float | None, digits: int) -> str:
    return "" if v is None else f"{v:,.{digits}f}"


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", type=float, default=3.0, help="percent a decode cell may lose")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a, args = ap.parse_args(argv[:cut]), argv[cut + 1:]
    runs: dict[str, list[dict]] = {a.before: [], a.after: []}
    for r in range(a.rounds):
        for checkout in (a.before, a.after):
            runs[checkout].append(run(checkout, args))
            print(f"round {r + 1}: {checkout} done", file=sys.stderr)
    print("cell\tbefore tok/s\tafter tok/s\tchange\tbefore step ms\tafter step ms")
    slower = []
    for cell in runs[a.before][0]:
        b = [median([x[cell][i] for x in runs[a.before]]) for i in (0, 1)]
        f = [median([x[cell][i] for x in runs[a.after] if cell in x]) for i in (0, 1)]
        change = 100 * (f[0] / b[0] - 1) if b[0] and f[0] else None
        if change is not None and "stream" in cell and change < -a.limit:
            slower.append(cell)
        print(f"{cell}\t{fmt(b[0], 1)}\t{fmt(f[0], 1)}\t{'' if change is None else f'{change:+.1f} %'}"
              f"\t{fmt(b[1], 2)}\t{fmt(f[1], 2)}")
    if slower:
        print(f"slower than before by more than {a.limit} %: {', '.join(slower)}", file=sys.stderr)
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
