#!/usr/bin/env python3
"""Benchmark init_values_once: first-compile time and steady-state step time.

Runs, side by side in one process, for N parameters (fresh grads every step, as with
zero_grad(set_to_none=True)):
  (a) a plain (non torch.optim) momentum-SGD class, traced through by Dynamo
      (config.init_values_once=False: what torch without the series does with it)
  (b) the same class with its _init_group decorated by init_values_once
  (c) torch.optim.SGD(foreach=True, momentum=0.9)
  (d) the floor: the same three foreach updates compiled as a function that is handed
      the params, grads and momentum buffers as lists (no lazy initialisation at all)
  (s) (a) on unpatched torch (--stock-python, default: the stock env upstream-tests
      caches), in a worker process: what tracing the step through costs without the series
and prints first-compile seconds, the total compile time until steady state, frames
compiled, the median steady-state step time and the ratios. Every case runs in a fresh
worker process, as a program's first compile does: a case run after another would pay
for what the earlier one left alive (after (a)'s six compiles of a 1,000-parameter step
the process holds twice the objects, and (b)'s first compile there takes about 6%
longer). (a) runs with the
feature switches off (traced as unpatched Dynamo would, with the series' speedups).
(b) is the design's example verbatim: guards=["self.state", "self.param_groups"] on
_init_group(self, group, ...). Each process compiles a trivial function first, so no
case pays Dynamo's one-off imports.

(d) bounds what any skip-and-guard scheme can reach on the first compile: (b) must
also turn every one of those 3N tensors into a graph input (fake tensor, placeholder,
guards), so (b)'s first compile cannot be cheaper than (d)'s, whatever the
initialiser costs. Use the custom wheel's python:
.venv/bin/python scripts/bench_skip_guard.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

if not hasattr(torch._dynamo, "init_values_once"):
    # Unpatched torch (the (s) worker): the decorator does not exist, OnceSGD is traced through.
    torch._dynamo.init_values_once = lambda guards: (lambda fn: fn)


class PlainSGD:
    def __init__(self, params, lr=0.01, momentum=0.9):
        self.param_groups = [{"params": list(params), "lr": lr, "momentum": momentum}]
        self.state = {}

    def _init_group(self, group, params, grads, bufs):
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {"momentum_buffer": torch.zeros_like(p)}
            params.append(p)
            grads.append(p.grad)
            bufs.append(state["momentum_buffer"])

    def step(self):
        with torch.no_grad():
            for group in self.param_groups:
                params, grads, bufs = [], [], []
                self._init_group(group, params, grads, bufs)
                torch._foreach_mul_(bufs, group["momentum"])
                torch._foreach_add_(bufs, grads)
                torch._foreach_add_(params, bufs, alpha=-group["lr"])


def floor_step(params, grads, bufs, lr, momentum):
    with torch.no_grad():
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-lr)


# Every feature switch the series adds: (a) runs with all of them off (stock Dynamo
# features; the speedups, which have no switch, stay on).
DYNAPATCH_SWITCHES = (
    "init_values_once",
    "scalar_state",
    "explain_recompile_reasons",
    "hook_residuals",
    "tensor_container_guards",
)


class OnceSGD(PlainSGD):
    # The design's example: `group` is one of self.param_groups' dicts, covered by its guards.
    @torch._dynamo.init_values_once(guards=["self.state", "self.param_groups"])
    def _init_group(self, group, params, grads, bufs):
        super()._init_group(group, params, grads, bufs)


def run(kind: str, n: int, steps: int, backend: str) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(32)) for _ in range(n)]
    counter = CompileCounterWithBackend(backend)
    if kind == "d":
        bufs = [torch.zeros(32) for _ in range(n)]
        compiled = torch.compile(floor_step, backend=counter)

        def step():
            compiled(params, [p.grad for p in params], bufs, 0.01, 0.9)
    else:
        if kind in "as":
            opt = PlainSGD(params)
        elif kind == "b":
            opt = OnceSGD(params)
        else:
            opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
        step = torch.compile(opt.step, backend=counter)
    times, compile_total = [], 0.0
    # the switches this wheel has (an older series named some otherwise)
    switches_off = {name: False for name in DYNAPATCH_SWITCHES if hasattr(torch._dynamo.config, name)}
    with torch._dynamo.config.patch(**(switches_off if kind == "a" else {})):
        for i in range(steps):
            for p in params:
                p.grad = torch.randn(32)
            frames = counter.frame_count
            start = time.perf_counter()
            step()
            elapsed = time.perf_counter() - start
            if counter.frame_count > frames:
                compile_total += elapsed  # this step compiled
            times.append(elapsed)
    return {"first": times[0], "total": compile_total, "steady": benchlib.median(times[1:]),
            "frames": counter.frame_count}


def warm_up(backend: str) -> None:
    """Compile a trivial function, so the first case measured does not pay Dynamo's
    one-off imports and initialisation."""
    torch.compile(lambda x: x + 1, backend=backend)(torch.ones(1))
    torch._dynamo.reset()


def worker(python: str, kind: str, n: int, steps: int, backend: str) -> dict:
    """One case in a fresh process of `python`; (s) is (a) run by unpatched torch."""
    argv = benchlib.worker_argv(__file__, "--case", kind, "--sizes", n, "--steps", steps, "--backend", backend)
    return benchlib.run_worker(python, argv, progress=kind == "s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--steps", type=int, default=6, help="steps for (a) and (s), which recompile on each")
    parser.add_argument("--steady-steps", type=int, default=40, help="steps for (b) and (c)")
    parser.add_argument("--backend", default="eager")
    benchlib.add_side_args(parser, no_stock=True)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", default="s", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch._dynamo.config.recompile_limit = args.steps + 1  # let (a) show its recompiles
    if args.worker:
        warm_up(args.backend)
        print(json.dumps(run(args.case, args.sizes[0], args.steps, args.backend)))
        return
    stock_python = benchlib.sides(args).get("stock")
    print(f"torch {torch.__version__}, backend={args.backend}, {args.steps} steps, fresh grads every step")
    print(f"{'N':>6} {'case':<30} {'1st compile s':>13} {'all compiles s':>14} {'frames':>6} {'median ms/step':>15}")
    names = {"a": "(a) plain, traced through", "b": "(b) plain + init_values_once",
             "c": "(c) optim.SGD foreach", "d": "(d) floor: lists passed in", "s": "(s) (a) on unpatched torch"}
    for n in args.sizes:
        results = {kind: worker(sys.executable, kind, n, args.steps if kind == "a" else args.steady_steps,
                                args.backend)
                   for kind in "abcd"}
        if stock_python is not None:
            results["s"] = worker(stock_python, "s", n, args.steps, args.backend)
        for kind, r in results.items():
            print(f"{n:>6} {names[kind]:<30} {r['first']:>13.2f} {r['total']:>14.2f} {r['frames']:>6} "
                  f"{r['steady'] * 1e3:>15.3f}")
        a, b, c, d = (results[k] for k in "abcd")
        stock = ""
        if "s" in results:
            s = results["s"]
            stock = (f"first compile s/b = {s['first'] / b['first']:.2f}x, all compiles s/b = "
                     f"{s['total'] / b['total']:.1f}x, ")
        print(f"{n:>6} ratios: {stock}first compile a/b = {a['first'] / b['first']:.2f}x "
              f"(a/d = {a['first'] / d['first']:.2f}x, b/d = "
              f"{b['first'] / d['first']:.2f}x), all compiles a/b = {a['total'] / b['total']:.1f}x "
              f"(a still recompiling after {args.steps} steps), median step b/c = "
              f"{b['steady'] / c['steady']:.2f}x, a/b = {a['steady'] / b['steady']:.0f}x")


if __name__ == "__main__":
    main()
