#!/usr/bin/env python3
"""First compiled torch.optim step in a fresh process: stock torch vs the custom wheel.

What a user pays once per process, before any step is cached: the CPU time
(time.process_time) of the first and second compiled steps, measured right after
`import torch`, so one-off imports made during the compile count. Sides, run
alternately (never at once), --reps fresh processes each:

  stock       unpatched torch (--stock-python, or the stock env benchlib finds)
  patched     the custom wheel (the python running this script, normally .venv/bin/python)

Steps: sgd = SGD(momentum=0.9, foreach=True), adam = Adam(foreach=True),
adamw = AdamW(foreach=False); --n parameters of 4x4 fp32, backend="eager".
Prints medians and ratios; exit 1 if a worker fails.
  .venv/bin/python scripts/bench_cold_first_compile.py --reps 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

KINDS = ("sgd", "adam", "adamw")

WORKER = """
import json, sys, time
t0 = time.process_time()
import torch
import_s = time.process_time() - t0
kind, n = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
torch.manual_seed(0)
params = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(n)]
opt = {
    "sgd": lambda: torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True),
    "adam": lambda: torch.optim.Adam(params, lr=1e-3, foreach=True),
    "adamw": lambda: torch.optim.AdamW(params, lr=1e-3, foreach=False),
}[kind]()
step = torch.compile(opt.step, backend="eager")
times = []
for _ in range(2):
    for p in params:
        p.grad = torch.randn_like(p)
    t = time.process_time()
    step()
    times.append(time.process_time() - t)
print(json.dumps({"import_s": import_s, "first_s": times[0], "second_s": times[1],
                  "inductor_compiler_imported": "torch._inductor.compile_fx" in sys.modules}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--n", type=int, default=10, help="parameters (default 10)")
    ap.add_argument("--reps", type=int, default=5, help="fresh processes per side (default 5)")
    benchlib.add_side_args(ap)
    args = ap.parse_args()
    sides = benchlib.sides(args)
    print(f"stock {sides['stock']}  vs  patched {sides['patched']}; N={args.n}, backend=eager, "
          f"CPU s of the first two compiled steps in a fresh process, median of {args.reps}")
    rows, table = {}, []
    for kind in args.kinds:
        samples = benchlib.run_sides(sides, ["-c", WORKER, kind, args.n], args.reps)
        rows[kind] = samples
        for side, results in samples.items():
            med = benchlib.medians({k: [r[k] for r in results] for k in ("first_s", "second_s")})
            both = benchlib.median(r["first_s"] + r["second_s"] for r in results)
            imported = sum(r["inductor_compiler_imported"] for r in results)
            table.append([kind, side, f"{med['first_s']:.2f}", f"{med['second_s']:.2f}", f"{both:.2f}",
                          f"{imported}/{len(results)}"])
    benchlib.table(["step", "side", "first s", "second s", "first+second s", "inductor compiler imported"],
                   table)
    print("ratios of first+second (higher is better for patched):")
    for kind, samples in rows.items():
        med = {side: benchlib.median(r["first_s"] + r["second_s"] for r in rs) for side, rs in samples.items()}
        print(f"  {kind:6} stock/patched {benchlib.ratio(med['stock'], med['patched'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
