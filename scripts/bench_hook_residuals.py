"""Compile time of hook patterns, stock vs patched torch, side by side.

A hook on an intermediate that is used in the graph is traced into it, as
without the hook patches (one trace); a hook on a tensor with no use in the
graph (an output) costs one extra trace: it is traced first, then the trace
restarts once, for all such hooks, to register them after the graph. This
measures first-call latency (Dynamo trace + aot_eager compile) per pattern,
median of N fresh compiles, in each interpreter. Stock falls back to eager for
output_hook_returned (no compile).

    python3 scripts/bench_hook_residuals.py [--stock-python PY] [--patched PY] [-n N] [--rounds R]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

PATTERNS = {
    "no_hook": "def fn(x):\n    y = x * 2\n    return (y.sin() * 3).sum()\n",
    "intermediate_used": (
        "def fn(x):\n    y = x * 2\n    y.register_hook(lambda g: g * 2)\n"
        "    return (y.sin() * 3).sum()\n"
    ),
    "8_used_intermediates": (
        "def fn(x):\n    for _ in range(8):\n        x = x * 2\n"
        "        x.register_hook(lambda g: g * 2)\n        x = x.sin()\n"
        "    return x.sum()\n"
    ),
    "output_hook_returned": (
        "def fn(x):\n    y = x * 2\n    h = y.register_hook(lambda g: g * 2)\n"
        "    return y, h\n"
    ),
}

CHILD = r"""
import json, statistics, sys, time, warnings
warnings.filterwarnings("ignore")
import torch, torch._dynamo
torch._logging.set_logs(dynamo=50)
src, n = sys.argv[1], int(sys.argv[2])
ns = {}
exec(src, ns)
fn = ns["fn"]
x = torch.randn(64, 64, requires_grad=True)
times = []
for _ in range(n + 1):
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager")
    t0 = time.perf_counter()
    compiled(x)
    times.append(time.perf_counter() - t0)
print(json.dumps([t * 1e3 for t in times[1:]]))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchlib.add_side_args(ap)
    ap.add_argument("--patched", default=str(benchlib.ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("-n", type=int, default=5, help="compiles per process")
    ap.add_argument("--rounds", type=int, default=3, help="alternating processes")
    args = ap.parse_args()
    sides = benchlib.sides(args, patched=args.patched)
    total = args.n * args.rounds
    print(f"first call (Dynamo + aot_eager compile), median of {total}, ms")
    rows = []
    for name, src in PATTERNS.items():
        # Alternate interpreters so machine noise hits both alike.
        runs = benchlib.run_sides(sides, ["-c", CHILD, src, args.n], args.rounds)
        s, p = (benchlib.median([t for run in runs[side] for t in run]) for side in ("stock", "patched"))
        rows.append([name, f"{s:.1f}", f"{p:.1f}", f"{p / s:.2f}"])
    benchlib.table(["pattern", "stock", "patched", "patched/stock"], rows)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
