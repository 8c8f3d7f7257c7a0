#!/usr/bin/env python3
"""First compile of bench_skip_guard.py case (b) (OnceSGD): per-tensor guards
(tensor_container_guards=False) / native container guards (native-container-guard), alternated in one
process, medians.
Usage: .venv/bin/python scripts/bench_init_once_compile.py [N=1000] [REPS=5]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_skip_guard as b
import benchlib
import torch
import torch._dynamo
from torch._dynamo.utils import compilation_time_metrics

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("n", type=int, nargs="?", default=1000, help="parameters (default 1000)")
parser.add_argument("reps", type=int, nargs="?", default=5, help="repetitions, alternated (default 5)")
args = parser.parse_args()
configs = {
    "stock guards": dict(tensor_container_guards=False),
    "native-container-guard": dict(tensor_container_guards=True),
}
res = {k: {"first": [], "build": [], "steady": []} for k in configs}
for rep in range(args.reps):
    for name, cfg in configs.items():
        with torch._dynamo.config.patch(**cfg):
            r = b.run("b", args.n, 12, "eager")  # resets Dynamo, which clears the metrics
            res[name]["first"].append(r["first"])
            res[name]["build"].append(sum(compilation_time_metrics.get("build_guards", [])))
            res[name]["steady"].append(r["steady"])
            assert r["frames"] == 1, r
print(f"case (b) N={args.n}, {args.reps} reps alternated, medians")
for name, d in res.items():
    med = benchlib.medians(d)
    print(
        f"  {name:24s} first compile {med['first']:.3f} s  "
        f"build_guards {med['build']:.3f} s  "
        f"steady step {med['steady'] * 1e3:.3f} ms"
    )
