"""Compile time of hook patterns, stock vs patched torch, side by side.

A hook on an intermediate that is used in the graph is traced into it, as
without the hook patches (one trace); a hook on a tensor with no use in the
graph (an output) costs one extra trace: it is traced first, then the trace
restarts once, for all such hooks, to register them after the graph. This
measures first-call latency (Dynamo trace + aot_eager compile) per pattern,
median of N fresh compiles, in each interpreter. Stock falls back to eager for
output_hook_returned (no compile).

    python3 scripts/bench_hook_residuals.py [--stock PY] [--patched PY] [-n N] [--rounds R]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

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


def measure(python, src, n):
    out = subprocess.run(
        [python, "-c", CHILD, src, str(n)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--stock", default="/tmp/stock/bin/python")
    ap.add_argument("--patched", default=os.path.join(root, ".venv", "bin", "python"))
    ap.add_argument("-n", type=int, default=5, help="compiles per process")
    ap.add_argument("--rounds", type=int, default=3, help="alternating processes")
    args = ap.parse_args()
    total = args.n * args.rounds
    print(f"first call (Dynamo + aot_eager compile), median of {total}, ms")
    print("| pattern | stock | patched | patched/stock |")
    print("|---|---|---|---|")
    for name, src in PATTERNS.items():
        stock, patched = [], []
        # Alternate interpreters so machine noise hits both alike.
        for _ in range(args.rounds):
            stock += measure(args.stock, src, args.n)
            patched += measure(args.patched, src, args.n)
        s, p = statistics.median(stock), statistics.median(patched)
        print(f"| {name} | {s:.1f} | {p:.1f} | {p / s:.2f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
