"""Differential fuzzing of dynapatch: random stateful programs, eager vs torch.compile.

Generates programs with test/dynamo/differential_fuzz.py (families: scalars, optim,
init_once, hooks, containers), runs each eagerly and compiled, compares results, Python
state, exceptions and guard checks after every call, shrinks the first failing program
of each kind of failure to a minimal repro and prints it. Exit code 1 on any mismatch.

    .venv/bin/python scripts/fuzz_differential.py --seed-start 0 --count 100
    .venv/bin/python scripts/fuzz_differential.py --families init_once,hooks --backend aot_eager
    .venv/bin/python scripts/fuzz_differential.py --replay init_once/17      # one program, verbose
    .venv/bin/python scripts/fuzz_differential.py --coverage --count 200     # CI seed choice

Program k (0 <= k < count) is family FAMILIES[k % len(FAMILIES)] with seed
seed_start + k // len(FAMILIES), so a seed range covers every family evenly.
Run long sessions under `nice -n 10`.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "dynamo"))
warnings.filterwarnings("ignore")

import differential_fuzz as fuzz  # noqa: E402

import torch  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed-start", type=int, default=0)
    p.add_argument("--count", type=int, default=50, help="programs to run (spread over the families)")
    p.add_argument(
        "--families", default=",".join(fuzz.FAMILIES), help="comma-separated subset of " + ",".join(fuzz.FAMILIES)
    )
    p.add_argument(
        "--backend",
        default="mix",
        choices=["mix", "eager", "aot_eager", "inductor"],
        help="mix: mostly eager, some aot_eager, rarely inductor (scalars)",
    )
    p.add_argument("--no-shrink", action="store_true", help="report failing programs as generated")
    p.add_argument("--shrink-budget", type=float, default=180.0, help="seconds per shrunk failure")
    p.add_argument(
        "--shrink-all",
        action="store_true",
        help="shrink every failing program (default: skip those whose features include an earlier repro's)",
    )
    p.add_argument("--replay", metavar="FAMILY/SEED", help="run one program and print it and its outcome")
    p.add_argument("--coverage", action="store_true", help="print a greedy seed set covering every feature tag")
    p.add_argument("--quiet", action="store_true", help="only failures and the summary")
    p.add_argument(
        "--stock-python",
        default="/work/stockenv/bin/python" if os.path.exists("/work/stockenv/bin/python") else "",
        help="an interpreter with unpatched torch: each reported repro is also run there, to tell "
        "dynapatch bugs from stock ones ('' to skip)",
    )
    p.add_argument("--run-json", metavar="FILE", help=argparse.SUPPRESS)  # one program, for --stock-python
    p.add_argument(
        "--self-check",
        action="store_true",
        help="run both sides eagerly: every program must pass (the generator and harness are deterministic)",
    )
    return p.parse_args(argv)


def programs(args: argparse.Namespace) -> list[tuple[str, int]]:
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in fuzz.FAMILIES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; known: {list(fuzz.FAMILIES)}")
    return [(families[k % len(families)], args.seed_start + k // len(families)) for k in range(args.count)]


def coverage(args: argparse.Namespace) -> int:
    """Print a greedy set of programs of the range covering every feature tag (but
    backend.inductor): most new tags first, smaller programs on ties. The chosen
    programs are run; one that fails on stock torch too is dropped and the choice
    redone (the set must pass once dynapatch's bugs are fixed; dynapatch's own
    failures stay in)."""
    universe = fuzz.ALL_TAGS() - {"backend.inductor"}
    candidates = {}
    for family, seed in programs(args):
        program = fuzz.generate(family, seed, args.backend)
        if program.backend != "inductor":
            candidates[(family, seed)] = program
    features = {k: p.features() & universe for k, p in candidates.items()}
    size = {k: len(p.steps) + sum(len(ops) for ops in p.sections.values()) for k, p in candidates.items()}
    verdicts: dict[tuple[str, int], tuple[float, str]] = {}
    while True:
        chosen, covered = [], set()
        while True:
            best = max(features, key=lambda k: (len(features[k] - covered), -size[k]))
            if not features[best] - covered:
                break
            chosen.append(best)
            covered |= features[best]
        dropped = False
        for key in chosen:
            if key not in verdicts:
                result = fuzz.run_program(candidates[key])
                verdict = "passes" if result.failure is None else f"FAILS: {result.failure}"
                if result.failure is not None and args.stock_python:
                    stock = on_stock(args.stock_python, candidates[key])
                    verdict += f" ({stock})"
                    if "fails too" in stock:
                        del features[key]
                        dropped = True
                        print(f"dropped {key[0]}/{key[1]}: {verdict}", flush=True)
                verdicts[key] = (result.seconds, verdict)
        if not dropped:
            break
    total = sum(verdicts[k][0] for k in chosen)
    print(f"{len(chosen)} programs cover {len(covered)} of {len(universe)} tags; they ran in {total:.0f}s")
    for family, seed in sorted(chosen):
        seconds, verdict = verdicts[(family, seed)]
        print(f'    ("{family}", {seed}),  # {seconds:.1f}s {verdict[:100]}')
    missing = sorted(universe - covered)
    if missing:
        print("not covered in this seed range:", ", ".join(missing))
    return 0


def replay(args: argparse.Namespace) -> int:
    family, seed = args.replay.split("/")
    program = fuzz.generate(family, int(seed), args.backend)
    print(program.render())
    result = fuzz.run_program(program)
    print(f"{program.name}: {result.calls} calls, {result.frames} graphs, {result.seconds:.1f}s")
    print("OK" if result.failure is None else f"FAIL {result.failure}")
    if result.failure is not None and not args.no_shrink:
        program, failure, runs = fuzz.shrink(program, result.failure, args.shrink_budget, print)
        print(f"\nminimised ({runs} runs): {failure}\n")
        print(program.render())
    if result.failure is not None and args.stock_python:
        print(on_stock(args.stock_python, program))
    return 0 if result.failure is None else 1


def run_json(path: str) -> int:
    """Run one serialised program; print one JSON line (used under the stock interpreter)."""
    with open(path) as f:
        program = fuzz.Program.from_json(json.load(f))
    result = fuzz.run_program(program)
    failure = result.failure
    print("RESULT " + json.dumps(None if failure is None else {"text": str(failure), "signature": failure.signature}))
    return 0


def on_stock(python: str, program: fuzz.Program) -> str:
    """What the stock interpreter says about `program`."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(program.to_json(), f)
    try:
        proc = subprocess.run(
            [python, os.path.abspath(__file__), "--run-json", f.name], capture_output=True, text=True, timeout=900
        )
    finally:
        os.unlink(f.name)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            outcome = json.loads(line[len("RESULT "):])
            if outcome is None:
                return "stock torch: passes (a dynapatch bug)"
            if outcome["signature"][0] == "setup":
                return f"stock torch: does not run it ({outcome['text']}); {traced_through(program)}"
            return f"stock torch: fails too: {outcome['text']}"
    return f"stock torch: harness error (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"


def traced_through(program: fuzz.Program) -> str:
    """What the custom wheel says about `program` with config.init_values_once off: the
    decorated functions traced through, as stock Dynamo traces any function. The verdict for
    a program stock cannot run (it uses init_values_once): failing this way too means
    Dynamo's own behaviour (e.g. an all-or-nothing graph on a program that raises mid-step),
    not skip-and-guard's."""
    off = dataclasses.replace(program, config={**program.config, "init_values_once": False})
    failure = fuzz.run_program(off).failure
    if failure is None:
        return "traced through (config.init_values_once=False): passes (a dynapatch bug)"
    return f"traced through (config.init_values_once=False): fails too: {failure}"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.run_json:
        return run_json(args.run_json)
    if args.coverage:
        return coverage(args)
    if args.replay:
        return replay(args)
    todo = programs(args)
    print(
        f"torch {torch.__version__}; {len(todo)} programs, families {args.families}, backend {args.backend}, "
        f"seeds {args.seed_start}..{args.seed_start + (len(todo) - 1) // max(1, len(args.families.split(',')))}",
        flush=True,
    )
    start = time.perf_counter()
    calls = 0
    graphs = 0
    by_signature: dict[tuple[str, str], list[fuzz.RunResult]] = collections.defaultdict(list)
    per_family = collections.Counter()
    backends = collections.Counter()
    for family, seed in todo:
        program = fuzz.generate(family, seed, args.backend)
        result = fuzz.run_program(program, None if args.self_check else "program")
        calls += result.calls
        graphs += result.frames
        per_family[family] += 1
        backends[program.backend] += 1
        status = "ok" if result.failure is None else f"FAIL {result.failure}"
        if result.failure is not None:
            by_signature[result.failure.signature].append(result)
        if not args.quiet or result.failure is not None:
            print(
                f"{program.name:<16} {program.backend:<9} {result.calls} calls {result.frames:>2} graphs "
                f"{result.seconds:5.1f}s  {status}",
                flush=True,
            )
    elapsed = time.perf_counter() - start
    failed = sum(len(v) for v in by_signature.values())
    print()
    print(
        f"ran {len(todo)} programs ({', '.join(f'{k} {v}' for k, v in per_family.items())}; backends "
        f"{', '.join(f'{k} {v}' for k, v in backends.items())}), {calls} cases (calls per side), "
        f"{graphs} graphs compiled, in {elapsed:.0f}s"
    )
    print(f"found {failed} failing programs in {len(by_signature)} kinds of failure")
    for signature, results in sorted(by_signature.items(), key=lambda kv: -len(kv[1])):
        names = ", ".join(r.program.name for r in results)
        print(f"\n=== {signature[0]} [{signature[1]}]: {len(results)} programs: {names}")
        # One signature can be several bugs (every stale value is a result[0] mismatch).
        # Shrink each program unless a repro already shrunk from this signature uses only
        # features this program has too (then it most likely shows the same bug).
        shrunk_features: list[set[str]] = []
        for result in results:
            program, failure = result.program, result.failure
            if not args.shrink_all and any(f <= program.features() for f in shrunk_features):
                continue
            if not args.no_shrink:
                program, failure, runs = fuzz.shrink(program, failure, args.shrink_budget)
                shrunk_features.append(program.features())
                print(f"--- {program.name} minimised in {runs} runs: {failure}")
                print(f"--- features left: {', '.join(sorted(program.features()))}")
            else:
                shrunk_features.append(program.features())
                print(f"--- {program.name}: {failure}")
            if args.stock_python:
                print("--- " + on_stock(args.stock_python, program))
            print(program.render())
    return 1 if by_signature else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
