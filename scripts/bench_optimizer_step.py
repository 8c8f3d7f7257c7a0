#!/usr/bin/env python3
"""Compiled optimizer steps over many small tensors: stock torch vs the custom wheel.

One run prints, side by side, unpatched torch (a separate venv: --stock-python, or the
one benchlib.stock_python finds, e.g. the stock env `dynapatch.py upstream-tests` caches)
and the custom wheel (the python running this script, normally .venv/bin/python), for
every N and optimizer step:

  * first compile: CPU seconds (time.process_time) of the first step;
  * all compiles: CPU seconds of the steps that compiled a frame, over --steps steps;
  * the steady-state call (CPU time of the thread, median over rounds; with
    backend="eager" the graph runs as traced, gm.forward, on every wheel), split into
    guard (the cache entries' guard checks, timed apart on the frame locals they
    were hit with), before the graph (the pre-graph bytecode: Dynamo's
    record_pregraph_bytecode_enter/exit markers), graph (the backend's compiled
    callable) and after (the rest: post-graph bytecode, resume frames, glue), in µs
    and µs per tensor (tensors = parameters);
  * eager opt.step() on an identical optimizer;
  * the floor (patched side): the steady graph called straight from Python, its
    inputs rebuilt on fresh grads the cheapest way (map(attrgetter("grad")) over
    the parameters), no Dynamo: µs outside the graph that any Python caller of
    that graph pays, the yardstick for before + after.

Steps (parameters 4x4 float32, fresh grads every step as zero_grad(set_to_none=True)):
  sgd    torch.optim.SGD(lr=0.01, momentum=0.9, foreach=True)
  adam   torch.optim.Adam(lr=1e-3, foreach=True)
  adamw  torch.optim.AdamW(lr=1e-3, foreach=False)
  once   OnceSGD of scripts/bench_skip_guard.py (an init_values_once _init_group); on
         the stock side the same class traced through (init_values_once does not exist)

Plus, with --inductor-sizes (default: 1000 when it is among --sizes), Adam compiled
with backend="inductor" on both sides (a row "adam-ind"). With --jax and `jax` +
`optax` importable, the patched side also times optax's sgd/adam/adamw (first call:
trace + compile, then the steady call) on the same shapes.

Every steady-state figure is the median of --rounds rounds of --calls calls; the
worker's progress (one JSON line per row) goes to stderr as it runs. N=3000 compiles
take minutes each: choose rows with --sizes and --kinds.

Run the stock and patched workers one after the other (never at once: CPU time is
the measure, but two processes on a 2-core machine still disturb each other).
  .venv/bin/python scripts/bench_optimizer_step.py --quick
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

HERE = Path(__file__).resolve().parent

KINDS = ("sgd", "adam", "adamw", "once")
SHAPE = (4, 4)


# --------------------------------------------------------------------- worker side


class _Timeline:
    """Thread-CPU timestamps of the markers one compiled call passes."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.graphs: list[Any] = []  # the GraphModules the marked call ran
        self._on = False
        # With capture set, every graph call appends (callable, args, grad mode): the
        # floor's inputs (_floor_inputs). Off while timing: kept args would keep the
        # previous call's grads alive into the next.
        self.capture = False
        self.captured: list[tuple[Any, tuple[Any, ...], bool]] = []

    @property
    def on(self) -> bool:
        return self._on

    @on.setter
    def on(self, value: bool) -> None:
        """Marking on or off. Since torch 2.15 the compiled bytecode calls the pre-graph
        markers only while a profiler is attached (it reads this flag on every call): the
        flag is raised for the marked calls only, so the before-graph time is measured."""
        import torch.autograd.profiler

        self._on = value
        torch.autograd.profiler._is_profiler_enabled = value

    def mark(self, what: str) -> None:
        if self._on:
            self.events.append((what, time.thread_time_ns()))


def _install_markers(timeline: _Timeline) -> None:
    """Time the pre-graph bytecode through the markers Dynamo's codegen already emits
    around it (config.record_runtime_overhead), looked up at run time."""
    import torch._dynamo.config
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.config.record_runtime_overhead = True

    @torch._disable_dynamo
    def enter() -> Any:
        timeline.mark("pre_enter")
        return timeline  # torch 2.15 calls exit only with what enter returned, if not None

    @torch._disable_dynamo
    def exit_(cm: Any) -> None:
        timeline.mark("pre_exit")

    dynamo_utils.record_pregraph_bytecode_enter = enter
    dynamo_utils.record_pregraph_bytecode_exit = exit_


def _timed_backend(timeline: _Timeline, backend_name: str = "eager"):
    """backend="eager" (or "inductor"), with the graph's run time marked."""

    def backend(gm: Any, example_inputs: Any) -> Any:
        if backend_name == "inductor":
            from torch._inductor.compile_fx import compile_fx

            compiled = compile_fx(gm, example_inputs)  # called like gm.forward
        else:
            # The graph as traced, which is what backend="eager" runs without this
            # series. Called directly rather than through the wheel's eager backend, so
            # two wheels compare on Dynamo's own cost: the 46-patch series' eager backend
            # ran a rewritten graph, and how a graph runs changes what lands in "after"
            # (its outputs' and intermediates' lifetimes).
            compiled = gm.forward
        run_module = gm  # the module whose forward runs, for the get_attr timing

        def run(*args: Any) -> Any:
            if timeline.capture:
                import torch

                timeline.captured.append((run, args, torch.is_grad_enabled()))
            if timeline.on:
                timeline.graphs.append(run_module)
            timeline.mark("graph_start")
            out = compiled(*args)
            timeline.mark("graph_end")
            return out

        return run

    return backend


def _make_optimizer(kind: str, params: list[Any]) -> Any:
    import torch

    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-3, foreach=True)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, foreach=False)
    import torch._dynamo

    if not hasattr(torch._dynamo, "init_values_once"):
        # Unpatched torch: the decorator does not exist, so OnceSGD is traced through.
        torch._dynamo.init_values_once = lambda guards: (lambda fn: fn)
    sys.path.insert(0, str(HERE))
    import bench_skip_guard

    return bench_skip_guard.OnceSGD(params)


def _params(n: int, seed: int) -> list[Any]:
    import torch

    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(SHAPE)) for _ in range(n)]


def _set_grads(params: list[Any], step: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = torch.randn(SHAPE, generator=gen)


def _cache_entries() -> list[Any]:
    from torch._dynamo.convert_frame import input_codes
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    entries = []
    for ref in input_codes.seen:
        code = ref()
        if code is not None:
            entries.extend(_debug_get_cache_entry_list(code))
    return entries


def _capture_guard_inputs(call: Any) -> list[tuple[Any, dict[str, Any], bool]]:
    """(guard manager, frame locals, grad mode) of every cache entry one call runs.

    The grad mode is the one the frame was entered with: torch.optim's step runs
    under _use_grad's set_grad_enabled(False), and its guards check the global
    state first, so a check under another grad mode fails at once and times
    nothing (the step's guards then landed in "after")."""
    import torch

    by_code = {id(e.code): e for e in _cache_entries()}
    hits: list[tuple[Any, dict[str, Any], bool]] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            entry = by_code.get(id(frame.f_code))
            if entry is not None:
                hits.append((entry.guard_manager, dict(frame.f_locals), torch.is_grad_enabled()))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return hits


def _time_guards(guard_inputs: list[tuple[Any, dict[str, Any], bool]], refresh: Any) -> tuple[int, bool]:
    """Thread-CPU ns of one check of every captured guard, as the call runs them:
    under the frame's grad mode, on fresh grads (refresh() untimed, before each).
    Also whether every check passed (else the figure is not the call's guard cost)."""
    import torch

    total, passed = 0, True
    for manager, f_locals, grad_mode in guard_inputs:
        refresh()
        with torch.set_grad_enabled(grad_mode):
            start = time.thread_time_ns()
            ok = manager.check(f_locals)
            total += time.thread_time_ns() - start
        passed &= bool(ok)
    return total, passed


def _time_graph_attrs(graphs: list[Any]) -> int:
    """Thread-CPU ns of the graphs' get_attr loads (self.<name> on the GraphModule:
    nn.Module.__getattr__ for every static tensor), part of the graph column."""
    names = [(gm, node.target) for gm in graphs for node in gm.graph.nodes if node.op == "get_attr"]
    start = time.thread_time_ns()
    for gm, name in names:
        getattr(gm, name)
    return time.thread_time_ns() - start


def _floor_inputs(timeline: _Timeline, call: Any, params: list[Any], refresh: Any) -> Any:
    """For the floor: (graph callable, grad mode, a function that builds its inputs the
    cheapest way a Python caller can), or None.

    Two calls are captured on fresh grads: an input that was params[i].grad both times
    is read again with map(attrgetter("grad")) over runs of consecutive parameters, an
    input that was the same object both times is passed as captured; anything else (or
    more than one graph per call) has no floor."""
    import operator

    captures = []
    for step in range(2):
        refresh(step)
        timeline.capture, timeline.captured = True, []
        try:
            call()
        finally:
            timeline.capture = False
        if len(timeline.captured) != 1:
            timeline.captured = []
            return None
        graph, args, grad_mode = timeline.captured.pop()
        grad_index = {id(p.grad): i for i, p in enumerate(params) if p.grad is not None}
        captures.append((graph, args, grad_mode, [grad_index.get(id(a)) for a in args]))
    (graph, first, grad_mode, first_grads), (_, second, _, second_grads) = captures
    segments: list[tuple[str, Any, Any]] = []  # ("grads", start, stop) or ("objects", list, None)
    for k, (a, b) in enumerate(zip(first, second)):
        if first_grads[k] is not None and first_grads[k] == second_grads[k]:
            i = first_grads[k]
            if segments and segments[-1][0] == "grads" and segments[-1][2] == i:
                segments[-1] = ("grads", segments[-1][1], i + 1)
            else:
                segments.append(("grads", i, i + 1))
        elif a is b:
            if segments and segments[-1][0] == "objects":
                segments[-1][1].append(a)
            else:
                segments.append(("objects", [a], None))
        else:
            return None
    getter = operator.attrgetter("grad")

    def inputs() -> list[Any]:
        out: list[Any] = []
        for kind, a, b in segments:
            out.extend(map(getter, params[a:b]) if kind == "grads" else a)
        return out

    return graph, grad_mode, inputs


def _time_floor(timeline: _Timeline, floor: Any, refresh: Any, rounds: int, calls: int) -> float:
    """Median µs per call outside the graph when the steady graph is called straight from
    Python with inputs(), under the step's grad mode: no Dynamo frame, no guard, no
    bytecode around it. What any caller of that graph from Python pays at least."""
    import torch

    graph, grad_mode, inputs = floor
    around = []
    for r in range(rounds):
        tot = 0
        for c in range(calls):
            refresh(r * calls + c)
            timeline.events.clear()
            timeline.on = True
            start = time.thread_time_ns()
            with torch.set_grad_enabled(grad_mode):
                graph(*inputs())
            end = time.thread_time_ns()
            timeline.on = False
            marks = dict(timeline.events)
            tot += (end - start) - (marks["graph_end"] - marks["graph_start"])
        around.append(tot / calls)
    return _median_us(around)


def _median_us(samples: list[float]) -> float:
    return benchlib.median(samples) / 1e3  # from ns


def bench_torch(
    kind: str, n: int, steps: int, rounds: int, calls: int, backend: str = "eager"
) -> dict[str, Any]:
    import torch
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.set_num_threads(1)
    torch._dynamo.reset()
    timeline = _Timeline()
    _install_markers(timeline)
    counter = CompileCounterWithBackend(_timed_backend(timeline, backend))
    torch._dynamo.config.recompile_limit = max(8, steps + 2)  # stock `once` recompiles every step
    params = _params(n, 0)
    opt = _make_optimizer(kind, params)
    compiled = torch.compile(opt.step, backend=counter)

    first, total = 0.0, 0.0
    for step in range(steps):
        _set_grads(params, step)
        frames = counter.frame_count
        elapsed = benchlib.cpu_time_of(compiled)
        if step == 0:
            first = elapsed
        if counter.frame_count > frames:
            total += elapsed
    frames_compiled = counter.frame_count
    recompiled_steady = False

    # Steady state.
    _set_grads(params, steps)
    guard_inputs = _capture_guard_inputs(compiled)
    call_ns, before_ns, graph_ns, guard_ns, attr_ns = [], [], [], [], []
    guards_passed = True
    for r in range(rounds):
        tot = bef = gra = 0
        for c in range(calls):
            _set_grads(params, steps + 1 + r * calls + c)
            timeline.events.clear()
            timeline.graphs.clear()
            timeline.on = True
            start = time.thread_time_ns()
            compiled()
            end = time.thread_time_ns()
            timeline.on = False
            tot += end - start
            opened: dict[str, int] = {}
            for what, t in timeline.events:
                if what in ("pre_enter", "graph_start"):
                    opened[what] = t
                elif what == "pre_exit":
                    bef += t - opened.pop("pre_enter")
                elif what == "graph_end":
                    gra += t - opened.pop("graph_start")
        call_ns.append(tot / calls)
        before_ns.append(bef / calls)
        graph_ns.append(gra / calls)
        gtot = 0
        for c in range(calls):
            ns, ok = _time_guards(guard_inputs, lambda: _set_grads(params, steps + 1 + r * calls + c))
            gtot += ns
            guards_passed &= ok
        guard_ns.append(gtot / calls)
        if backend == "eager":  # inductor's compiled callable does not load them this way
            attr_ns.append(sum(_time_graph_attrs(timeline.graphs) for _ in range(calls)) / calls)
        else:
            attr_ns.append(0.0)
    recompiled_steady = counter.frame_count != frames_compiled

    def refresh(i: int) -> None:
        _set_grads(params, steps + 1 + rounds * calls + i)

    floor = None if recompiled_steady else _floor_inputs(timeline, compiled, params, refresh)
    floor_us = None if floor is None else _time_floor(timeline, floor, refresh, rounds, calls)

    # Eager opt.step() on an identical optimizer, same grads schedule.
    eparams = _params(n, 0)
    eopt = _make_optimizer(kind, eparams)
    eager_ns = []
    for r in range(rounds + 1):
        tot = 0
        for c in range(calls):
            _set_grads(eparams, r * calls + c)
            start = time.thread_time_ns()
            eopt.step()
            tot += time.thread_time_ns() - start
        if r:  # round 0 initialises the state
            eager_ns.append(tot / calls)

    call, before, graph, guard, attrs = map(_median_us, (call_ns, before_ns, graph_ns, guard_ns, attr_ns))
    return {
        "kind": kind if backend == "eager" else f"{kind}-ind",
        "backend": backend,
        "n": n,
        "first_s": first,
        "total_s": total,
        "frames": frames_compiled,
        "recompiled_steady": recompiled_steady,
        "graphs_per_call": sum(1 for w, _ in timeline.events if w == "graph_start"),
        "call_us": call,
        "guard_us": guard,
        "before_us": before,
        "graph_us": graph,
        "graph_attr_us": attrs,
        "guards_passed": guards_passed,
        "after_us": max(call - guard - before - graph, 0.0),
        "floor_us": floor_us,
        "eager_us": _median_us(eager_ns),
    }


def bench_jax(kind: str, n: int, rounds: int, calls: int) -> dict[str, Any] | None:
    try:
        import jax
        import jax.numpy as jnp
        import optax
    except ImportError:
        return None
    if kind == "once":
        return None
    make = {"sgd": lambda: optax.sgd(0.01, momentum=0.9), "adam": lambda: optax.adam(1e-3),
            "adamw": lambda: optax.adamw(1e-3)}[kind]
    tx = make()
    params = [jnp.ones(SHAPE, jnp.float32) * i for i in range(n)]
    grads = [jnp.ones(SHAPE, jnp.float32) for _ in range(n)]
    state = tx.init(params)

    @jax.jit
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    start = time.process_time()
    params, state = jax.block_until_ready(step(params, state, grads))
    first = time.process_time() - start
    samples = []
    for _ in range(rounds):
        start = time.thread_time_ns()
        for _ in range(calls):
            params, state = jax.block_until_ready(step(params, state, grads))
        samples.append((time.thread_time_ns() - start) / calls)
    return {"kind": kind, "n": n, "first_s": first, "call_us": _median_us(samples)}


def worker(args: argparse.Namespace) -> None:
    import torch

    results: list[dict[str, Any]] = []
    for n in args.sizes:
        for kind in args.kinds:
            results.append(bench_torch(kind, n, args.steps, args.rounds, args.calls))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        if n in args.inductor_sizes:
            results.append(bench_torch("adam", n, args.steps, args.rounds, args.calls, "inductor"))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    jax_results = []
    if args.jax:
        for n in args.sizes:
            for kind in args.kinds:
                r = bench_jax(kind, n, args.rounds, args.calls)
                if r is not None:
                    jax_results.append(r)
    json.dump({"torch": torch.__version__, "results": results, "jax": jax_results,
               "rounds": args.rounds, "calls": args.calls}, sys.stdout)


# --------------------------------------------------------------------- driver side


def run_worker(python: str, args: argparse.Namespace, jax: bool) -> dict[str, Any]:
    argv = benchlib.worker_argv(__file__, "--sizes", *args.sizes, "--kinds", *args.kinds, "--steps", args.steps,
                                "--rounds", args.rounds, "--calls", args.calls,
                                "--inductor-sizes", *args.inductor_sizes, *(["--jax"] if jax else []))
    # A fresh inductor cache per worker: a side whose graph an earlier run cached would
    # otherwise compile adam-ind in seconds while the other side compiles cold.
    cache_dir = tempfile.mkdtemp(prefix="bench-inductor-cache-")
    try:
        # stderr (the worker's progress) goes straight to ours.
        return benchlib.run_worker(python, argv, env=benchlib.worker_env(TORCHINDUCTOR_CACHE_DIR=cache_dir),
                                   progress=True)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def _fmt_split(r: dict[str, Any]) -> str:
    n = r["n"]
    parts = [f"{r[k]:8.0f} {r[k] / n:6.2f}" for k in ("guard_us", "before_us", "graph_us", "after_us")]
    return " | ".join(parts)


def report(stock: dict[str, Any] | None, patched: dict[str, Any]) -> None:
    versus = f"stock torch {stock['torch']}  vs  " if stock else ""
    print(f"{versus}patched torch {patched['torch']}; backend=eager (adam-ind: inductor), CPU time, "
          "params 4x4 fp32, fresh grads every step")
    print(f"steady figures: medians of {patched.get('rounds', '?')} rounds x {patched.get('calls', '?')} calls; "
          "split columns: µs per call, µs per tensor")
    head = (f"| {'N':>5} | {'step':<8} | {'side':<7} | {'1st compile s':>13} | {'all compiles s':>14} | "
            f"{'frames':>6} | {'call µs':>8} | {'eager µs':>8} | {'call/eager':>10} | "
            f"{'guard':>15} | {'before graph':>15} | {'graph':>15} | {'after graph':>15} |")
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    key = {(r["n"], r["kind"]): r for r in patched["results"]}
    stock_key = {(r["n"], r["kind"]): r for r in stock["results"]} if stock else {}
    for p in patched["results"]:
        s = stock_key.get((p["n"], p["kind"]))
        for side, r in (("stock", s), ("patched", p)):
            if r is None:
                continue
            note = "*" if r["recompiled_steady"] else ""
            print(f"| {r['n']:>5} | {r['kind']:<8} | {side:<7} | {r['first_s']:>13.2f} | {r['total_s']:>14.2f} | "
                  f"{r['frames']:>5}{note:1} | {r['call_us']:>8.0f} | {r['eager_us']:>8.0f} | "
                  f"{r['call_us'] / r['eager_us']:>9.2f}x | {_fmt_split(r)} |")
    print("(* = still recompiling in the steady state)")
    print()
    print("ratios stock/patched (higher is better for patched):")
    for p in patched["results"]:
        s = stock_key.get((p["n"], p["kind"]))
        around = (p["before_us"] + p["after_us"]) / p["n"] * 1e3
        versus = (f"first compile {s['first_s'] / p['first_s']:5.2f}x  all compiles "
                  f"{s['total_s'] / max(p['total_s'], 1e-9):5.2f}x  call {s['call_us'] / p['call_us']:5.2f}x  "
                  if s else "")
        print(f"  N={p['n']:<5} {p['kind']:<8} {versus}"
              f"patched call/eager {p['call_us'] / p['eager_us']:4.2f}x  patched before+after {around:6.0f} ns/tensor")
    print("where the patched call's time outside eager's work goes (ns per tensor): guard check, "
          "graph get_attr loads (inside the graph column: nn.Module.__getattr__ per static tensor), before+after;")
    print("  floor: the same graph called straight from Python, its grads read with map(attrgetter), no Dynamo "
          "(what any caller of it from Python pays outside the graph)")
    for p in patched["results"]:
        n = p["n"]
        flag = ("" if p.get("guards_passed", True)
                else "  (! a guard check failed when timed apart: figure not the call's)")
        floor = p.get("floor_us")
        floor_text = "   n/a" if floor is None else f"{floor / n * 1e3:6.0f}"
        print(f"  N={n:<5} {p['kind']:<8} guard {p['guard_us'] / n * 1e3:6.0f}  graph get_attr "
              f"{p.get('graph_attr_us', 0.0) / n * 1e3:6.0f}  before+after "
              f"{(p['before_us'] + p['after_us']) / n * 1e3:6.0f}  floor {floor_text}{flag}")
    sizes = sorted({r["n"] for r in patched["results"]})
    if 1000 in sizes and 3000 in sizes:
        print("scaling N=3000 vs N=1000 (patched, ratio of per-tensor costs; linear = 1.00x):")
        for kind in sorted({r["kind"] for r in patched["results"]}):
            a, b = key.get((1000, kind)), key.get((3000, kind))
            if a and b:
                around_a = max(a["before_us"] + a["after_us"], 1e-9)
                floor = (f"  floor {b['floor_us'] / 3 / a['floor_us']:4.2f}x"
                         if a.get("floor_us") and b.get("floor_us") else "")
                print(f"  {kind:<8} call {b['call_us'] / 3 / a['call_us']:4.2f}x  eager "
                      f"{b['eager_us'] / 3 / a['eager_us']:4.2f}x  call/eager "
                      f"{(b['call_us'] / b['eager_us']) / (a['call_us'] / a['eager_us']):4.2f}x  before+after "
                      f"{(b['before_us'] + b['after_us']) / 3 / around_a:4.2f}x{floor}  first compile "
                      f"{b['first_s'] / 3 / a['first_s']:4.2f}x")
    print()
    print("medians over the rows of each side (call/eager; before+after ns per tensor):")
    for side, data in (("stock", stock), ("patched", patched)):
        if data is None:
            continue
        rows = [r for r in data["results"] if r.get("backend", "eager") == "eager"]
        if rows:
            ratio = benchlib.median(r["call_us"] / r["eager_us"] for r in rows)
            around = benchlib.median((r["before_us"] + r["after_us"]) / r["n"] * 1e3 for r in rows)
            print(f"  {side:<7} call/eager {ratio:4.2f}x  before+after {around:6.0f} ns/tensor")
    if patched.get("jax"):
        print()
        print("JAX + optax (patched side's python): first call CPU s (trace + compile), steady call µs")
        for r in patched["jax"]:
            print(f"  N={r['n']:<5} {r['kind']:<5} first {r['first_s']:7.2f} s  steady {r['call_us']:9.0f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="default 100 1000 3000")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--steps", type=int, default=5, help="steps compiled (all compiles over them)")
    parser.add_argument("--rounds", type=int, default=7, help="steady-state rounds (median)")
    parser.add_argument("--calls", type=int, default=5, help="calls per round")
    parser.add_argument("--quick", action="store_true", help="N=100 and 1000, fewer rounds")
    benchlib.add_side_args(parser, no_stock=True)
    parser.add_argument("--jax", action="store_true", help="also time JAX+optax when importable")
    parser.add_argument("--inductor-sizes", type=int, nargs="*", default=None,
                        help="N of the backend=inductor Adam rows (default: 1000 if among --sizes; none: no rows)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sizes is None:
        args.sizes = [100, 1000] if args.quick else [100, 1000, 3000]
    if args.quick:
        args.rounds, args.calls = min(args.rounds, 5), min(args.calls, 3)
    if args.inductor_sizes is None:
        args.inductor_sizes = [1000] if 1000 in args.sizes and not args.worker else []
    if args.worker:
        worker(args)
        return
    patched = run_worker(sys.executable, args, args.jax)
    stock_python = benchlib.sides(args).get("stock")
    stock = None if stock_python is None else run_worker(stock_python, args, False)
    report(stock, patched)


if __name__ == "__main__":
    main()
