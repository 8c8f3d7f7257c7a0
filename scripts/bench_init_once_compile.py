#!/usr/bin/env python3
"""First compile of bench_skip_guard.py case (b) (OnceSGD): per-tensor guards
(tensor_container_guards=False) / native container guards (native-container-guard), alternated in one
process, medians.
Usage: .venv/bin/python scripts/bench_init_once_compile.py [N=1000] [REPS=5]"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_skip_guard as b
import torch
import torch._dynamo
from torch._dynamo.utils import compilation_time_metrics

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
configs = {
    "stock guards": dict(tensor_container_guards=False),
    "native-container-guard": dict(tensor_container_guards=True),
}
res = {k: {"first": [], "build": [], "steady": []} for k in configs}
for rep in range(REPS):
    for name, cfg in configs.items():
        with torch._dynamo.config.patch(**cfg):
            before = 0.0  # run() resets Dynamo, which clears the metrics
            r = b.run("b", N, 12, "eager")
            res[name]["first"].append(r["first"])
            res[name]["build"].append(sum(compilation_time_metrics.get("build_guards", [])) - before)
            res[name]["steady"].append(r["steady"])
            assert r["frames"] == 1, r
print(f"case (b) N={N}, {REPS} reps alternated, medians")
for name, d in res.items():
    print(
        f"  {name:24s} first compile {statistics.median(d['first']):.3f} s  "
        f"build_guards {statistics.median(d['build']):.3f} s  "
        f"steady step {statistics.median(d['steady']) * 1e3:.3f} ms"
    )
