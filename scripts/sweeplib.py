"""A sweep: many third-party cases (optimizers, metrics), each a callable compiled and called
--steps times next to an eager copy, in a fresh process per case and side (stock torch, the
custom wheel); then one table, the details and a summary.

The worker side (in each case's process): CompileWatch counts what the compiled callable
cost (graphs, recompile-limit hits, recompile reasons, graph breaks) and compares the
compiled copy's state with the eager copy's after every call. The parent side: run_cases
runs every case on both sides serially, report prints the results. The scripts
(bench_optimizer_sweep.py, bench_metric_sweep.py) hold what is particular to their cases:
how a case is built and called, and the recompile every case has on its first call.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from pathlib import Path

import bench_scalar_state as bss
import benchlib

MAX_GOOD = 2  # graphs: the first call fills an empty state, so one recompile is the floor
EAGER_RANK = {"same": 0, "close": 1, "DIFF": 2}


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


# --------------------------------------------------------------------------- worker


class CompileWatch:
    """What one compiled callable costs over a case's calls, and how far its state is
    from an eager copy's. Create it before the first compiled call (it sets
    config.recompile_limit and captures Dynamo's recompile-limit warning), compile with
    its `backend`, call `after_call` after each pair of calls, and `result` at the end.
    Besides the graphs (the callable's and those of the frames it calls or resumes
    after a graph break), it counts how often each frame was compiled: a place pinned
    per value recompiles its frame on every new value."""

    def __init__(self, backend: str, recompile_limit: int) -> None:
        import logging

        import torch._dynamo
        from torch._dynamo.testing import CompileCounterWithBackend
        from torch._guards import CompileContext

        torch._dynamo.config.recompile_limit = recompile_limit
        self.counter = CompileCounterWithBackend(backend)
        self.compiles: dict[int, set] = {}  # frame id: its compile ids that produced a graph

        def count_frame_compiles(gm, example_inputs, **kwargs):
            compile_id = CompileContext.current_compile_id()
            if compile_id is not None and compile_id.frame_id is not None:
                self.compiles.setdefault(compile_id.frame_id, set()).add(compile_id.frame_compile_id)
            return self.counter(gm, example_inputs, **kwargs)

        self.backend = count_frame_compiles
        self.limit_hits: set[str] = set()
        self.reasons: list[str] = []  # "function: reason", in the order the calls recorded them
        self.seen: dict = {}
        self.differences: dict[str, str] = {}
        self.max_diff = 0.0
        hits = self.limit_hits

        class Capture(logging.Handler):  # Dynamo's warning when a code object hits the limit
            def emit(self, record):
                msg = record.getMessage()
                if msg.startswith("torch._dynamo hit config."):
                    line = next((ln for ln in msg.splitlines() if ln.strip().startswith("function:")), "?")
                    hits.add(line.split("'")[1] if "'" in line else line.strip())

        lg = logging.getLogger("torch._dynamo.convert_frame")
        lg.addHandler(Capture())
        lg.propagate = False

    def after_call(self, call: int, compiled_state: dict, eager_state: dict) -> None:
        """Collect the recompile reasons recorded since the last call, and compare each
        part of the two states (bench_scalar_state.compare); the first difference beyond
        tolerance per part is kept."""
        from torch._dynamo.utils import guard_failures

        for code, failures in list(guard_failures.items()):
            for failure in failures[self.seen.get(code, 0):]:
                text = " ".join(re.sub(r"^[!\d/_]+: ", "", failure).split("\nUser stack trace")[0].split())
                text = re.sub(r"[^\s#]*/([^/\s]+\.py:\d+)", r"\1", text)  # file:line, no directories
                self.reasons.append(f"{getattr(code, 'co_name', code)}: {text}")
            self.seen[code] = len(failures)
        for part in compiled_state:
            if part not in self.differences:
                d, worst = bss.compare(compiled_state[part], eager_state[part], part)
                self.max_diff = max(self.max_diff, worst)
                if d:
                    self.differences[part] = f"call {call}: {d}"

    def result(self) -> dict:
        from torch._dynamo.utils import counters

        return {"graphs": self.counter.frame_count, "limit_hits": sorted(self.limit_hits),
                "frame_compiles": max(map(len, self.compiles.values()), default=0),
                "eager": "DIFF" if self.differences else ("same" if self.max_diff == 0.0 else "close"),
                "eager_detail": "; ".join(self.differences.values()), "max_diff": self.max_diff,
                "reasons": list(dict.fromkeys(self.reasons))[:20], "recompiles": len(self.reasons),
                "reason_counts": list(collections.Counter(self.reasons).items()),
                "graph_breaks": sum(counters["graph_break"].values()),
                "first_break": next(iter(counters["graph_break"]), "").strip().split("\n")[0]}


# --------------------------------------------------------------------------- parent


def add_arguments(parser: argparse.ArgumentParser, noun: str) -> None:
    """The options every sweep takes (the cases' subset option is the script's own)."""
    benchlib.add_side_args(parser)
    parser.add_argument("--patched", type=Path, default=benchlib.ROOT / ".venv" / "bin" / "python",
                        help="python of the custom wheel (default: .venv/bin/python)")
    parser.add_argument("--build-dir", type=Path, default=benchlib.ROOT / "build",
                        help="dynapatch build dir: bench-scalar/site-<hash> (installed there if missing) and "
                             "the default stock env cache/stockenv-* (default: this checkout's build/)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--recompile-limit", type=int, default=8, help="torch._dynamo.config.recompile_limit")
    parser.add_argument("--timeout", type=float, default=300, help=f"seconds per {noun} and side")
    parser.add_argument("--worker", help=argparse.SUPPRESS)


def worker(args: argparse.Namespace, registry, run_case) -> int:
    """A worker process: the registry (`--worker :registry`) or one case, as JSON on stdout."""
    out = registry() if args.worker == ":registry" else run_case(
        args.worker, args.steps, args.backend, args.recompile_limit)
    print(json.dumps(out, default=str), flush=True)
    return 0


def prepare(args: argparse.Namespace, script: str, fail) -> tuple[dict[str, str], dict, dict[str, dict]]:
    """The sides (stock, patched), the workers' environment (the bench packages on
    PYTHONPATH, installed if missing) and each side's registry worker's answer; `fail`
    on a setup error or a torch imported from the packages dir."""
    stock = benchlib.stock_python(args.stock_python, args.build_dir.resolve() / "cache")
    sides = benchlib.sides(argparse.Namespace(stock_python=stock), patched=str(args.patched))
    try:
        site = benchlib.bench_packages(sides["stock"], bss.REQUIREMENTS, args.build_dir.resolve())
    except benchlib.SetupError as e:
        fail(str(e))
    env = benchlib.worker_env(threads=1, pythonpath=site)
    print(f"packages: {site}", flush=True)
    registries = {side: benchlib.run_worker(python, benchlib.worker_argv(script, ":registry"), env=env)
                  for side, python in sides.items()}
    for side, reg in registries.items():
        if Path(reg["torch_file"]).resolve().is_relative_to(site.resolve()):
            fail(f"{side}: torch was imported from {reg['torch_file']}, the bench packages dir")
    return sides, env, registries


def sweep(args: argparse.Namespace, script: str, names: list[str], sides: dict[str, str], env: dict, noun: str,
          first_call: re.Pattern, program: str) -> int:
    """run_cases, then report (its exit status)."""
    print(f"backend={args.backend}, recompile_limit={args.recompile_limit}, steps={args.steps}, "
          f"timeout {args.timeout:.0f} s per case; {len(names)} {noun}s, each in a fresh process per side\n",
          flush=True)
    results = run_cases(script, names, sides, env, ["--steps", args.steps, "--backend", args.backend,
                        "--recompile-limit", args.recompile_limit], args.timeout)
    return report(results, sides, noun, f"{args.backend}, {args.steps} steps, recompile_limit {args.recompile_limit}",
                  first_call, program)


def cause(reason: str) -> str:
    """A recompile reason as `function: failed guard`, without the source line Dynamo
    appends (`# code # file:line in fn`) and with numbers and addresses as `#`."""
    reason = re.sub(r"0x[0-9a-fA-F]+", "#", reason.split("\n")[0].split(" # ")[0])
    return re.sub(r"(?<![A-Za-z\d])[-+]?\d+(\.\d*)?([eE][-+]?\d+)?", "#", reason)


# A value guard: `source == number` (a place pinned to one value)
PINNED = re.compile(r"^[\w.]+: [\w.\[\]'\"()]+ == [-+]?[\d.]+(e[-+]?\d+)?$")
# A guard on a relation of the step, the shape environment's (`(step % 10) != 0`,
# `1998.9 + (-1)*(... 0.999 ** torch.sym_float(1 + step) ...) < 4.0`): a Python branch on it
BRANCH = re.compile(r"^[\w.]+: (not )?\(?.*(%|\*|/| \+ | - |sym_float\(|min\(|max\().* ?(<|<=|>|>=|==|!=) .*$")


def branch_floor(r: dict, first_call: re.Pattern) -> list[str] | None:
    """The branch guards of a case at its branch floor, None if it is not there: every
    recompile reason is the first call's (`first_call`, matched against its cause) or a
    guard on a relation of the step (BRANCH, not a pinned value), and the graphs are at
    most the first call's two plus one per such guard (a recompile lists the failed guard
    of every cache entry, so a guard is counted by the distinct texts, not by how often
    it is listed). No graph breaks (their resume functions' graphs have floors of their
    own)."""
    counts = r.get("reason_counts")
    if counts is None or r.get("graph_breaks"):
        return None
    branches = []
    for reason, _ in counts:
        text = reason.split(" # ")[0].strip()
        if first_call.match(cause(reason)):
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
    """How the patched side does worse than stock on one case (empty: not worse)."""
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


def run_cases(script: str, names: list[str], sides: dict[str, str], env: dict, worker_args: list,
              timeout: float) -> dict[str, dict[str, dict]]:
    """Each case in a fresh `script --worker NAME *worker_args` process per side, serially;
    prints a line per case and side."""
    started_all = time.monotonic()
    results: dict[str, dict[str, dict]] = {}
    for i, name in enumerate(names, 1):
        results[name] = {}
        for side, python in sides.items():
            started = time.monotonic()
            argv = benchlib.worker_argv(script, name, *worker_args)
            r = benchlib.run_worker(python, argv, env=env, timeout=timeout, check=False)
            results[name][side] = r
            what = r.get("skipped") or r.get("error") or f"{r['graphs']} graphs, eager {r['eager']}"
            print(f"  [{i}/{len(names)}] {name:<20} {side:<8} {time.monotonic() - started:6.1f} s  {short(what, 100)}",
                  flush=True)
    print(f"\n{len(names)} cases in {(time.monotonic() - started_all) / 60:.1f} min\n")
    return results


def report(results: dict[str, dict[str, dict]], sides: dict[str, str], noun: str, settings: str,
           first_call: re.Pattern, program: str) -> int:
    """The table (graphs, recompile-limit hits, eager identity per side), the details of
    each case, and the summary: runnable cases, how many stay within 2 graphs per side
    and how many more are at their branch floor, every case the patched side does worse
    on than stock, those not eager-identical on the patched side only, and every patched
    case above 2 graphs grouped by its first recompile reason other than the first
    call's. 1 if a worker crashed outside the compiled calls (a harness error), else 0."""

    def cell(r: dict, key: str) -> str:
        if status(r):
            return status(r)
        return ("hit" if r[key] else "-") if key == "limit_hits" else str(r[key])

    benchlib.table([noun, "stock graphs", "patched graphs", "limit hit stock/patched", "eager stock/patched"],
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
            key = next((c for c in map(cause, r["reasons"]) if not first_call.match(c)), None)
            if key is None:
                key = f"(no recompile but the first call's) graph break: {cause(r['first_break'] or '?')}"
            causes.setdefault(short(key, 200), []).append(f"{n} ({r['graphs']})")

    print(f"\nSummary ({settings})")
    print(f"  {noun}s: {len(results)}, runnable: {len(runnable)}, skipped: {len(skipped)}")
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
                     and (b := branch_floor(results[n][side], first_call)) is not None} for side in sides}
    for side in sides:
        print(f"  {side}: <= {MAX_GOOD} graphs or at the branch floor (the first call's graphs plus one "
              f"recompile per side of a branch on the step): {len(within[side]) + len(floors[side])}/{len(runnable)}")
    for n, branches in floors["patched"].items():
        print(f"    {n} ({results[n]['patched']['graphs']}): " + "; ".join(short(b, 150) for b in branches))
    per_frame = {side: [n for n in ok[side] if results[n][side]["frame_compiles"] <= MAX_GOOD] for side in sides}
    for side in sides:
        print(f"  {side}: no frame compiled more than {MAX_GOOD} times (graph breaks allowed; a place pinned per "
              f"value recompiles its frame per value): {len(per_frame[side])}/{len(runnable)}")
    print("    patched above: " + (", ".join(f"{n} ({results[n]['patched']['frame_compiles']})"
                                           for n in ok["patched"] if n not in per_frame["patched"]) or "-"))
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
        print(f"{program}: error: worker crashed (see Details): {', '.join(crashed)}", file=sys.stderr, flush=True)
        return 1
    return 0
