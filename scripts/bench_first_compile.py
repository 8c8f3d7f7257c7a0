#!/usr/bin/env python3
"""First-compile CPU seconds of compiled optimizer steps, stock torch vs the custom wheel,
robust to a noisy machine.

bench_optimizer_step.py runs each side's rows in one worker, one side after the other,
so load that drifts over minutes lands on one side. Here every measurement is its own
fresh process (the first compiled step of one optimizer, one-off imports excluded by a
warm-up compile of a 2-parameter step in the same process), the sides alternate
(stock, patched, patched, stock, ...), and each figure is the median of --repeats
processes; the ratio is of the medians, and min/max show the spread.

Steps and shapes are bench_optimizer_step.py's (--kinds sgd adam adamw once).
  .venv/bin/python scripts/bench_first_compile.py --sizes 1000 --kinds sgd once --repeats 5
Exit status: 0, or 1 when a worker fails (its stderr is shown).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(kind: str, n: int) -> None:
    sys.path.insert(0, str(HERE))
    import bench_optimizer_step as steps
    import torch

    def first_compile(size: int) -> float:
        torch._dynamo.reset()
        params = steps._params(size, 0)
        opt = steps._make_optimizer(kind, params)
        steps._set_grads(params, 0)
        step = torch.compile(opt.step, backend="eager")
        start = time.process_time()
        step()
        return time.process_time() - start

    first_compile(2)  # one-off imports and lazy initialisation, paid by any first compile
    print(json.dumps({"first_s": first_compile(n)}))


def measure(python: str, kind: str, n: int) -> float:
    cmd = [python, str(Path(__file__).resolve()), "--worker", kind, str(n)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"worker {python} {kind} N={n} failed ({proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])["first_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000])
    parser.add_argument("--kinds", nargs="+", default=["sgd", "once"], choices=["sgd", "adam", "adamw", "once"])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per side and row")
    parser.add_argument("--stock-python", help="python of a venv with unpatched torch")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return

    sys.path.insert(0, str(HERE))
    from bench_optimizer_step import find_stock_python

    sides = {"stock": find_stock_python(args.stock_python), "patched": sys.executable}
    for side, python in sides.items():
        if not os.path.exists(python):
            raise SystemExit(f"{side} interpreter not found: {python}")
    print(f"stock: {sides['stock']}\npatched: {sides['patched']}")
    print(f"first compile, CPU s, median of {args.repeats} fresh processes per side (alternating); min-max")
    print("|     N | step  |             stock |           patched | stock/patched |")
    print("|-------|-------|-------------------|-------------------|---------------|")
    for n in args.sizes:
        for kind in args.kinds:
            times: dict[str, list[float]] = {"stock": [], "patched": []}
            for i in range(args.repeats):
                order = ("stock", "patched") if i % 2 == 0 else ("patched", "stock")
                for side in order:
                    times[side].append(measure(sides[side], kind, n))
                    print(f"  {kind} N={n} {side} {times[side][-1]:.2f} s", file=sys.stderr, flush=True)
            med = {side: statistics.median(t) for side, t in times.items()}
            cells = [f"{med[s]:6.2f} {min(times[s]):5.2f}-{max(times[s]):5.2f}" for s in ("stock", "patched")]
            ratio = med["stock"] / med["patched"]
            print(f"| {n:5d} | {kind:5s} | {cells[0]:>17s} | {cells[1]:>17s} | {ratio:12.2f}x |")


if __name__ == "__main__":
    main()
