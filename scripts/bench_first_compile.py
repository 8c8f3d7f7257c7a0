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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

HERE = Path(__file__).resolve().parent


def worker(kind: str, n: int) -> None:
    import bench_optimizer_step as steps
    import torch

    def first_compile(size: int) -> float:
        torch._dynamo.reset()
        params = steps._params(size, 0)
        opt = steps._make_optimizer(kind, params)
        steps._set_grads(params, 0)
        step = torch.compile(opt.step, backend="eager")
        return benchlib.cpu_time_of(step)

    first_compile(2)  # one-off imports and lazy initialisation, paid by any first compile
    print(json.dumps({"first_s": first_compile(n)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000])
    parser.add_argument("--kinds", nargs="+", default=["sgd", "once"], choices=["sgd", "adam", "adamw", "once"])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per side and row")
    benchlib.add_side_args(parser)
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return

    sides = benchlib.sides(args)
    print(f"stock: {sides['stock']}\npatched: {sides['patched']}")
    print(f"first compile, CPU s, median of {args.repeats} fresh processes per side (alternating); min-max")
    rows = []
    for n in args.sizes:
        for kind in args.kinds:
            argv = benchlib.worker_argv(__file__, kind, n)
            results = benchlib.run_sides(sides, argv, args.repeats, label=f"{kind} N={n}")
            times = {side: [r["first_s"] for r in rs] for side, rs in results.items()}
            med = benchlib.medians(times)
            cells = [f"{med[s]:6.2f} {min(times[s]):5.2f}-{max(times[s]):5.2f}" for s in ("stock", "patched")]
            rows.append([n, kind, *cells, benchlib.ratio(med["stock"], med["patched"])])
    benchlib.table(["N", "step", "stock", "patched", "stock/patched"], rows)


if __name__ == "__main__":
    main()
