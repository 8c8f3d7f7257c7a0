#!/usr/bin/env python3
"""Every pytorch-optimizer optimizer with a compiled step: stock torch vs the custom wheel.

Issue 44 item 6. For each optimizer that pytorch-optimizer (4.1.0, requirements-bench.txt)
registers (`get_supported_optimizers()`, built by `load_optimizer(name)`), the optimizer
cases of scripts/bench_scalar_state.py with this optimizer in them: its small MLP
(Linear(16,32)-Tanh-Linear(32,4), seed 0) and batches, the optimizer with its defaults,
`def opt_step(opt): opt.step()` under torch.compile (--backend, default aot_eager;
config.recompile_limit --recompile-limit, default 8) after an eager forward/backward,
--steps (20) times, next to an eager copy of the same model and optimizer stepped
eagerly in the same process. Both copies' steps see the same RNG state (torch's,
`random`'s and numpy's, seeded, are restored between them), so an optimizer that draws
random numbers is compared like any other. Each optimizer runs in its own subprocess (benchlib.run_worker,
--timeout per case), first with the stock interpreter, then with the patched one,
serially; the third-party packages come from bench_scalar_state's packages dir
(benchlib.bench_packages) on both sides' PYTHONPATH.

Per optimizer and side:
  graphs  graphs handed to the backend (CompileCounterWithBackend frame_count)
  limit   "hit" if a code object hit config.recompile_limit (Dynamo's warning, captured)
  eager   parameters and optimizer state_dict after every step vs the eager copy
          (bench_scalar_state.compare): "same" bitwise, "close" within
          torch.testing.assert_close's defaults (Python floats 1e-12 relative; ints,
          types and keys exact), "DIFF" (the first difference is printed below the table)
  reasons the first 2 distinct recompile reasons, in order, from
          torch._dynamo.utils.guard_failures (as stock records them on both sides)
A case is "skip" when the optimizer cannot run here: its construction or an eager step
raises (needs a closure, a process group, a package not installed, ...); the exception
is the reason. A few optimizers get the setup their docs require (SETUP below: Muon-style
use_muon groups, a model instead of parameters, a required count; HESSIAN: backward with
create_graph=True); everything else is built as `cls(model.parameters())`. A compiled
step that raises is "ERROR", a worker that runs out of time "timeout".

Summary: runnable optimizers, how many stay within 2 graphs per side and how many more are
at their branch floor (no graph break, every recompile the first call's or a guard on a
relation of the step such as RAdam's rectification or `step % k`, at most one recompile
per such guard: one per side of the branch; each listed with its guards), every optimizer the
patched side does worse on than stock (more graphs, a limit hit, an eager result
further from eager, an error), those not eager-identical on the patched side only, and
every patched case above 2 graphs grouped by its first recompile reason other than the
first call's (it fills the empty state or adds keys to it or to the param groups: every
optimizer recompiles once for that), as `function: failed guard` with numbers and
addresses replaced by `#` (cases without such a recompile: by their first graph break).
Exit status: 0 when the sweep ran (whatever the results); 1 if a worker crashed outside
the compiled step (a harness error: its traceback is printed); 2 on a setup error.

    nice -n 19 /work/venv-sweep/bin/python scripts/bench_optimizer_sweep.py \\
        --patched /work/venv-sweep/bin/python --build-dir /work/main/build
    ... --optimizers lion,adabelief,soap --steps 10 --backend eager
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scalar_state as bss
import benchlib

ROOT = benchlib.ROOT
MAX_GOOD = 2  # graphs: the first call fills an empty state, so one recompile is the floor
EAGER_RANK = {"same": 0, "close": 1, "DIFF": 2}


def muon_groups(model):
    """Muon-style groups (their docs): matrices orthogonalized, the rest by AdamW."""
    return [dict(params=[p for p in model.parameters() if p.ndim >= 2], use_muon=True),
            dict(params=[p for p in model.parameters() if p.ndim < 2], use_muon=False)]


# name: (what is different, build(cls, model, steps)); the rest: cls(model.parameters())
SETUP = {
    **{n: ("use_muon param groups", lambda cls, m, steps: cls(muon_groups(m)))
       for n in ("muon", "adamuon", "adago", "normuon", "muonclip", "distributedmuon")},
    **{n: ("built from the model", lambda cls, m, steps: cls(m)) for n in ("adammini", "lomo", "adalomo")},
    "ranger21": ("num_iterations=steps", lambda cls, m, steps: cls(m.parameters(), num_iterations=steps)),
    "bsam": ("num_data=8", lambda cls, m, steps: cls(m.parameters(), num_data=8)),
    "spectralsphere": ("2-D parameters only (the weights)",
                       lambda cls, m, steps: cls([p for p in m.parameters() if p.ndim == 2])),
}
HESSIAN = {"adahessian", "sophiah"}  # Hessian-vector products of the gradients: backward(create_graph=True)


# --------------------------------------------------------------------------- worker


def describe(e: BaseException) -> str:
    """`Type: first line of the message` (an empty message: where it was raised)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if not text:
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            text = f"(raised in {tb.tb_frame.f_code.co_qualname})"
    return f"{type(e).__name__}: {text[:200]}"


def registry() -> dict:
    """The worker for the sides' registries: names and versions."""
    from importlib.metadata import version

    import pytorch_optimizer

    import torch

    return {"names": pytorch_optimizer.get_supported_optimizers(), "torch": torch.__version__,
            "torch_file": torch.__file__, "pytorch_optimizer": version("pytorch_optimizer")}


def run_case(name: str, steps: int, backend: str, recompile_limit: int) -> dict:
    import copy
    import logging
    import random
    import traceback
    import warnings

    warnings.filterwarnings("ignore")
    import numpy as np
    import pytorch_optimizer

    import torch
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters, guard_failures

    torch._dynamo.config.recompile_limit = recompile_limit
    result: dict = {"torch": torch.__version__, "setup": SETUP.get(name, ("",))[0]}
    if name in HESSIAN:
        result["setup"] = "backward(create_graph=True)"
    random.seed(0)
    np.random.seed(0)
    model_e = bss.make_mlp("")
    model_c = copy.deepcopy(model_e)
    build = SETUP.get(name, ("", lambda cls, m, steps: cls(m.parameters())))[1]
    try:
        cls = pytorch_optimizer.load_optimizer(name)
        opt_e, opt_c = build(cls, model_e, steps), build(cls, model_c, steps)
    except Exception as e:
        return {**result, "skipped": f"construct: {describe(e)}"}

    limit_hits: set[str] = set()

    class Capture(logging.Handler):  # Dynamo's warning when a code object hits the limit
        def emit(self, record):
            msg = record.getMessage()
            if msg.startswith("torch._dynamo hit config."):
                line = next((ln for ln in msg.splitlines() if ln.strip().startswith("function:")), "?")
                limit_hits.add(line.split("'")[1] if "'" in line else line.strip())

    lg = logging.getLogger("torch._dynamo.convert_frame")
    lg.addHandler(Capture())
    lg.propagate = False

    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(bss.opt_step, backend=counter)
    reasons: list[str] = []  # "function: reason", in the order the steps recorded them
    seen: dict = {}
    differences: dict[str, str] = {}
    max_diff = 0.0

    def state(model, opt):
        return {"params": dict(model.state_dict()), "optimizer": opt.state_dict()}

    for step in range(steps):
        x, y = bss.batch(step)
        for m, o in ((model_e, opt_e), (model_c, opt_c)):
            o.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(m(x), y).backward(create_graph=name in HESSIAN)
        rng = torch.get_rng_state(), random.getstate(), np.random.get_state()
        try:
            opt_e.step()
        except Exception as e:
            return {**result, "skipped": f"eager step {step + 1}: {describe(e)}"}
        torch.set_rng_state(rng[0])
        random.setstate(rng[1])
        np.random.set_state(rng[2])
        try:
            compiled(opt_c)
        except Exception as e:
            return {**result, "error": f"step {step + 1}: {describe(e)}",
                    "traceback": traceback.format_exc()[-3000:]}
        for code, failures in list(guard_failures.items()):
            for failure in failures[seen.get(code, 0):]:
                text = " ".join(re.sub(r"^[!\d/_]+: ", "", failure).split("\nUser stack trace")[0].split())
                text = re.sub(r"[^\s#]*/([^/\s]+\.py:\d+)", r"\1", text)  # file:line, no directories
                reasons.append(f"{getattr(code, 'co_name', code)}: {text}")
            seen[code] = len(failures)
        compiled_state, eager_state = state(model_c, opt_c), state(model_e, opt_e)
        for part in compiled_state:
            if part not in differences:
                d, worst = bss.compare(compiled_state[part], eager_state[part], part)
                max_diff = max(max_diff, worst)
                if d:
                    differences[part] = f"step {step + 1}: {d}"

    return {**result, "graphs": counter.frame_count, "limit_hits": sorted(limit_hits),
            "eager": "DIFF" if differences else ("same" if max_diff == 0.0 else "close"),
            "eager_detail": "; ".join(differences.values()), "max_diff": max_diff,
            "reasons": list(dict.fromkeys(reasons))[:20], "recompiles": len(reasons),
            "reason_counts": list(collections.Counter(reasons).items()),
            "graph_breaks": sum(counters["graph_break"].values()),
            "first_break": next(iter(counters["graph_break"]), "").strip().split("\n")[0]}


# --------------------------------------------------------------------------- parent


def fail(message: str) -> None:
    print(f"bench_optimizer_sweep: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def cause(reason: str) -> str:
    """A recompile reason as `function: failed guard`, without the source line Dynamo
    appends (`# code # file:line in fn`) and with numbers and addresses as `#`."""
    reason = re.sub(r"0x[0-9a-fA-F]+", "#", reason.split("\n")[0].split(" # ")[0])
    return re.sub(r"(?<![A-Za-z\d])[-+]?\d+(\.\d*)?([eE][-+]?\d+)?", "#", reason)


# The recompile every optimizer has: its first call fills the empty state or adds keys to it
# or to the param groups (the floor of 2 graphs)
FIRST_CALL = re.compile(r"^[\w.]+: not (opt|self)\.state$"
                        r"|^[\w.]+: not ___dict_contains\('\w+', (opt|self)\.(state|param_groups\[#\])\)$")


# A value guard: `source == number` (a place pinned to one value)
PINNED = re.compile(r"^[\w.]+: [\w.\[\]'\"()]+ == [-+]?[\d.]+(e[-+]?\d+)?$")
# A guard on a relation of the step, the shape environment's (`(step % 10) != 0`,
# `1998.9 + (-1)*(... 0.999 ** torch.sym_float(1 + step) ...) < 4.0`): a Python branch on it
BRANCH = re.compile(r"^[\w.]+: (not )?\(?.*(%|\*|/| \+ | - |sym_float\(|min\(|max\().* ?(<|<=|>|>=|==|!=) .*$")


def branch_floor(r: dict) -> list[str] | None:
    """The branch guards of a case at its branch floor, None if it is not there: every
    recompile reason is the first call's (FIRST_CALL) or a guard on a relation of the
    step (BRANCH, not a pinned value), and the graphs are at most the first call's two
    plus one per such guard (a recompile lists the failed guard of every cache entry,
    so a guard is counted by the distinct texts, not by how often it is listed). No
    graph breaks (their resume functions' graphs have floors of their own)."""
    counts = r.get("reason_counts")
    if counts is None or r.get("graph_breaks"):
        return None
    branches = []
    for reason, _ in counts:
        text = reason.split(" # ")[0].strip()
        if FIRST_CALL.match(cause(reason)):
            continue
        if PINNED.match(text) or not BRANCH.match(text):
            return None
        branches.append(text)
    return branches if r["graphs"] <= MAX_GOOD + len(branches) else None


def status(r: dict) -> str | None:
    """skip / timeout / ERROR for a case that did not produce figures, else None."""
    if "skipped" in r:
        return "skip"
    if "error" in r:
        return "timeout" if r["error"].startswith("timed out") else "ERROR"
    return None


def worse(s: dict, p: dict) -> list[str]:
    """How the patched side does worse than stock on one optimizer (empty: not worse)."""
    if status(p) and not status(s):
        return [f"{status(p)}: {p['error'] if 'error' in p else p.get('skipped')}"]
    if status(p) or status(s):
        return []
    out = []
    if p["graphs"] > s["graphs"]:
        out.append(f"graphs {s['graphs']} -> {p['graphs']}")
    if p["limit_hits"] and not s["limit_hits"]:
        out.append("recompile limit hit (stock: not)")
    if EAGER_RANK[p["eager"]] > EAGER_RANK[s["eager"]]:
        out.append(f"eager {s['eager']} -> {p['eager']}")
    return out


def short(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchlib.add_side_args(parser)
    parser.add_argument("--patched", type=Path, default=ROOT / ".venv" / "bin" / "python",
                        help="python of the custom wheel (default: .venv/bin/python)")
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build",
                        help="dynapatch build dir: bench-scalar/site-<hash> (installed there if missing) and "
                             "the default stock env cache/stockenv-* (default: this checkout's build/)")
    parser.add_argument("--optimizers", help="comma-separated subset of the registered names")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--recompile-limit", type=int, default=8, help="torch._dynamo.config.recompile_limit")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per optimizer and side")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        out = registry() if args.worker == ":registry" else run_case(
            args.worker, args.steps, args.backend, args.recompile_limit)
        print(json.dumps(out), flush=True)
        return 0

    stock = benchlib.stock_python(args.stock_python, args.build_dir.resolve() / "cache")
    sides = benchlib.sides(argparse.Namespace(stock_python=stock), patched=str(args.patched))
    try:
        site = benchlib.bench_packages(sides["stock"], bss.REQUIREMENTS, args.build_dir.resolve())
    except benchlib.SetupError as e:
        fail(str(e))
    env = benchlib.worker_env(threads=1, pythonpath=site)
    print(f"packages: {site}", flush=True)

    registries = {side: benchlib.run_worker(python, benchlib.worker_argv(__file__, ":registry"), env=env)
                  for side, python in sides.items()}
    for side, reg in registries.items():
        print(f"{side}: torch {reg['torch']} ({sides[side]}), pytorch-optimizer {reg['pytorch_optimizer']}, "
              f"{len(reg['names'])} optimizers", flush=True)
        if Path(reg["torch_file"]).resolve().is_relative_to(site.resolve()):
            fail(f"{side}: torch was imported from {reg['torch_file']}, the bench packages dir")
    if registries["stock"]["names"] != registries["patched"]["names"]:
        fail("the sides register different optimizers")
    known = registries["patched"]["names"]
    names = [n.strip().lower() for n in args.optimizers.split(",") if n.strip()] if args.optimizers else known
    unknown = [n for n in names if n not in known]
    if unknown:
        fail(f"unknown optimizer(s) {', '.join(unknown)}; registered: {', '.join(known)}")
    print(f"backend={args.backend}, recompile_limit={args.recompile_limit}, steps={args.steps}, "
          f"timeout {args.timeout:.0f} s per case; {len(names)} optimizers, each in a fresh process per side\n",
          flush=True)

    started_all = time.monotonic()
    results: dict[str, dict[str, dict]] = {}
    for i, name in enumerate(names, 1):
        results[name] = {}
        for side, python in sides.items():
            started = time.monotonic()
            argv = benchlib.worker_argv(__file__, name, "--steps", args.steps, "--backend", args.backend,
                                        "--recompile-limit", args.recompile_limit)
            r = benchlib.run_worker(python, argv, env=env, timeout=args.timeout, check=False)
            results[name][side] = r
            what = r.get("skipped") or r.get("error") or f"{r['graphs']} graphs, eager {r['eager']}"
            print(f"  [{i}/{len(names)}] {name:<20} {side:<8} {time.monotonic() - started:6.1f} s  {short(what, 100)}",
                  flush=True)
    print(f"\n{len(names)} optimizers in {(time.monotonic() - started_all) / 60:.1f} min\n")

    def cell(r: dict, key: str) -> str:
        if status(r):
            return status(r)
        return ("hit" if r[key] else "-") if key == "limit_hits" else str(r[key])

    benchlib.table(["optimizer", "stock graphs", "patched graphs", "limit hit stock/patched",
                    "eager stock/patched"],
                   [[name, cell(by["stock"], "graphs"), cell(by["patched"], "graphs"),
                     f"{cell(by['stock'], 'limit_hits')} / {cell(by['patched'], 'limit_hits')}",
                     f"{cell(by['stock'], 'eager')} / {cell(by['patched'], 'eager')}"]
                    for name, by in results.items()])

    print("\nDetails (setup, errors, eager differences, first 2 distinct recompile reasons):")
    for name, by in results.items():
        for side in sides:
            r = by[side]
            lines = []
            if r.get("setup") and side == "patched" and not status(r):
                lines.append(f"setup: {r['setup']}")
            if "error" in r:
                lines.append(f"{status(r)}: {r['error']}")
                lines += [f"    {ln}" for ln in r.get("traceback", "").strip().splitlines()[-6:]]
            if r.get("eager") == "DIFF":
                lines.append(f"eager: {short(r['eager_detail'])}")
            if r.get("limit_hits"):
                lines.append("recompile limit hit by: " + ", ".join(r["limit_hits"]))
            if r.get("graph_breaks"):
                lines.append(f"graph breaks: {r['graph_breaks']}, first: {short(r['first_break'])}")
            for j, reason in enumerate(r.get("reasons", [])[:2], 1):
                lines.append(f"reason {j}/{r['recompiles']}: {short(reason)}")
            for line in lines:
                print(f"  {name} [{side}]: {line}")

    skipped = {n: by["patched"].get("skipped") or by["stock"].get("skipped") for n, by in results.items()
               if "skipped" in by["patched"] or "skipped" in by["stock"]}
    runnable = [n for n in results if n not in skipped]
    ok = {side: [n for n in runnable if not status(results[n][side])] for side in sides}
    within = {side: [n for n in ok[side] if results[n][side]["graphs"] <= MAX_GOOD] for side in sides}
    worse_than_stock = {n: w for n in runnable if (w := worse(results[n]["stock"], results[n]["patched"]))}
    better = [n for n in ok["patched"] if n in ok["stock"]
              and results[n]["patched"]["graphs"] < results[n]["stock"]["graphs"]]
    newly_not_same = [n for n in runnable if n in ok["patched"] and n in ok["stock"]
                      and results[n]["patched"]["eager"] != "same" and results[n]["stock"]["eager"] == "same"]
    causes: dict[str, list[str]] = {}
    for n in ok["patched"]:
        r = results[n]["patched"]
        if r["graphs"] > MAX_GOOD:
            key = next((c for c in map(cause, r["reasons"]) if not FIRST_CALL.match(c)), None)
            if key is None:
                key = f"(no recompile but the first call's) graph break: {cause(r['first_break'] or '?')}"
            causes.setdefault(short(key, 200), []).append(f"{n} ({r['graphs']})")

    print(f"\nSummary ({args.backend}, {args.steps} steps, recompile_limit {args.recompile_limit})")
    print(f"  optimizers: {len(results)}, runnable: {len(runnable)}, skipped: {len(skipped)}")
    for side in sides:
        failed = [f"{n} ({status(results[n][side])})" for n in runnable if n not in ok[side]]
        print(f"  {side}: <= {MAX_GOOD} graphs: {len(within[side])}/{len(runnable)}"
              + (f"; ERROR/timeout: {', '.join(failed)}" if failed else ""))
    nothing = [n for n in ok["patched"] if results[n]["patched"]["graphs"] == 0]
    print(f"  patched compiles nothing (0 graphs, counted as <= {MAX_GOOD}): {', '.join(nothing) or '-'}")
    print(f"  patched fewer graphs than stock: {len(better)}")
    print(f"  patched worse than stock: {len(worse_than_stock)}")
    for n, w in worse_than_stock.items():
        print(f"    {n}: {'; '.join(w)}")
    print(f"  not eager-identical on patched only (stock 'same'): {len(newly_not_same)}")
    for n in newly_not_same:
        r = results[n]["patched"]
        print(f"    {n}: {r['eager']}" + (f" ({short(r['eager_detail'], 120)})" if r["eager"] == "DIFF"
                                          else f" (max abs diff {r['max_diff']:.3g})"))
    floors = {side: {n: b for n in ok[side] if results[n][side]["graphs"] > MAX_GOOD
                     and (b := branch_floor(results[n][side])) is not None} for side in sides}
    for side in sides:
        print(f"  {side}: <= {MAX_GOOD} graphs or at the branch floor (the first call's graphs plus one "
              f"recompile per side of a branch on the step): {len(within[side]) + len(floors[side])}/{len(runnable)}")
    for n, branches in floors["patched"].items():
        print(f"    {n} ({results[n]['patched']['graphs']}): " + "; ".join(short(b, 150) for b in branches))
    print(f"  patched > {MAX_GOOD} graphs, by first recompile reason (after the first call's): "
          f"{sum(len(v) for v in causes.values())} cases, {len(causes)} causes")
    for key, cases in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        print(f"    [{len(cases)}] {key}\n        {', '.join(cases)}")
    print(f"  skipped ({len(skipped)}):")
    for n, why in skipped.items():
        print(f"    {n}: {why}")
    crashed = [f"{n} [{side}]" for n, by in results.items() for side, r in by.items()
               if r.get("error", "").startswith("child exited")]
    if crashed:
        print(f"bench_optimizer_sweep: error: worker crashed (see Details): {', '.join(crashed)}",
              file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
