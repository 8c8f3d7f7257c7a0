"""The harness the scripts/bench_*.py benchmarks share.

Each benchmark keeps its own cases and figures; what is common lives here:
  * the two sides: unpatched torch of the custom wheel's base (`stock_python`: --stock-python, or the stock
    env `dynapatch.py upstream-tests` caches) and the custom wheel (the python running
    the script, normally .venv/bin/python), and their command-line options;
  * a worker: the same script (or a `-c` program) in a fresh process of either side,
    one thread, answering one JSON line on stdout (`run_worker`), and the stock and
    patched workers alternated over repetitions (`run_sides`);
  * third-party packages both sides import (timm, pytorch-optimizer): installed once
    with `pip install --no-deps --target` into a directory put on the workers'
    PYTHONPATH, so neither env is changed (`bench_packages`, `worker_env(pythonpath=)`);
  * timing: CPU time (`time.process_time`), time per call and medians over rounds;
  * output: medians, stock/patched ratios and markdown tables, formatted alike.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SIDES = ("stock", "patched")

median = statistics.median
cpu_s = time.process_time  # CPU seconds of the process: compiles, first steps


# ------------------------------------------------------------------------- the sides


def venv_torch_version(python: str | os.PathLike[str]) -> str | None:
    """torch.__version__ of the venv of `python`, read from its torch/version.py (no import)."""
    venv = Path(python).parent.parent
    for version_py in sorted(venv.glob("lib/python3*/site-packages/torch/version.py")):
        for line in version_py.read_text().splitlines():
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("'\"")
    return None


def base_torch_version(patched: str | os.PathLike[str] = sys.executable) -> str | None:
    """The torch version the custom wheel of `patched` was built from: 2.15.0+cu132 for
    2.15.0+cu132.dynapatch.26.g1a2b3c4d (a stock torch's own version)."""
    version = venv_torch_version(patched)
    return version.split(".dynapatch.", 1)[0] if version else None


# Stock envs made by hand on the project's machines, tried after `cache_dir`'s.
FIXED_STOCK_PYTHONS = ("/work/stock/bin/python", "/work/stockenv/bin/python")


def stock_python(explicit: str | os.PathLike[str] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None,
                 patched: str | os.PathLike[str] = sys.executable) -> str:
    """The python of a venv with unpatched torch of the custom wheel's base: `explicit` (taken
    as given: a before/after of two series passes an older custom wheel's), or the first of
    the stock env `dynapatch.py upstream-tests` caches under `cache_dir`, /work/stock,
    /work/stockenv, or that stock env under $DYNAPATCH_CACHE_DIR (default build/cache of
    /work/main, then of this checkout) whose torch is that base; the others are skipped
    with their versions named, so a stock env of another release is never compared."""
    if explicit:
        print(f"stock side: {explicit} (torch {venv_torch_version(explicit)}, as given)", file=sys.stderr)
        return str(explicit)
    base = base_torch_version(patched)
    caches = [os.environ.get("DYNAPATCH_CACHE_DIR", "/work/main/build/cache"), str(ROOT / "build" / "cache")]
    candidates = sorted(glob.glob(os.path.join(cache_dir, "stockenv-*", "bin", "python"))) if cache_dir else []
    candidates += list(FIXED_STOCK_PYTHONS)
    for cache in caches:
        candidates += sorted(glob.glob(os.path.join(cache, "stockenv-*", "bin", "python")))
    skipped = []
    for c in dict.fromkeys(candidates):
        if not os.path.exists(c):
            continue
        version = venv_torch_version(c)
        if version == base:
            print(f"stock side: {c} (torch {version})", file=sys.stderr)
            return c
        skipped.append(f"{c} (torch {version})")
    raise SystemExit(f"no stock venv with torch {base} found (skipped: {', '.join(skipped) or 'none'}): "
                     f"pass --stock-python")


def add_side_args(parser: argparse.ArgumentParser, *, no_stock: bool = False) -> None:
    """--stock-python (and --no-stock, where a script can run the patched side alone)."""
    parser.add_argument("--stock-python", "--stock", dest="stock_python",
                        help="python of a venv with unpatched torch "
                        "(default: a cached stock env of the custom wheel's base)")
    if no_stock:
        parser.add_argument("--no-stock", action="store_true", help="patched side only")


def sides(args: argparse.Namespace, patched: str | None = None) -> dict[str, str]:
    """{"stock": its python, "patched": `patched` or this python}; no stock with --no-stock."""
    patched = patched or sys.executable
    out = {} if getattr(args, "no_stock", False) else {"stock": stock_python(args.stock_python, patched=patched)}
    out["patched"] = patched
    for side, python in out.items():
        if not os.path.exists(python):
            raise SystemExit(f"{side} interpreter not found: {python}")
    return out


# ------------------------------------------------------------------------- workers


def worker_env(threads: int | None = 1, pythonpath: str | os.PathLike[str] | None = None,
               **extra: str) -> dict[str, str]:
    """The environment of a worker: `threads` OpenMP threads (None: as ours), TORCH_LOGS
    unset, `pythonpath` (e.g. `bench_packages`) first on PYTHONPATH, plus `extra`."""
    env = dict(os.environ, **extra)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env.pop("TORCH_LOGS", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_worker(python: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
               timeout: float | None = None, progress: bool = False, check: bool = True) -> Any:
    """Run `python *argv` in a fresh process and return the JSON value of the last line
    of its stdout that starts with `{` or `[`. `argv` is the worker's script and options
    (see `worker_argv`) or ["-c", program, ...]. With `progress`, its stderr goes to ours
    as it runs. A failure (exit status, timeout, no JSON line) exits with its stderr, or,
    without `check`, returns {"error": ..., "traceback": ...}."""
    cmd = [python, *map(str, argv)]
    if progress:
        print(f"[{python}]", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE,
                              text=True, env=env or worker_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        if check:
            raise SystemExit(f"worker {python} timed out after {timeout:.0f} s") from None
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("{", "["))]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (proc.stderr or proc.stdout or "")[-3000:]
    if check:
        raise SystemExit(f"worker {python} {' '.join(cmd[1:3])} failed ({proc.returncode}):\n{tail}")
    return {"error": f"child exited {proc.returncode}", "traceback": tail}


def worker_argv(script: str, *options: Any) -> list[str]:
    """`script` (a bench script's __file__) run as its own worker: script --worker options."""
    return [str(Path(script).resolve()), "--worker", *map(str, options)]


def run_sides(pythons: dict[str, str], argv: Sequence[str], reps: int, *, label: str = "",
              **kwargs: Any) -> dict[str, list[Any]]:
    """`reps` fresh workers per side, the sides alternating (stock, patched, patched,
    stock, ...) so that load drifting over minutes reaches both alike; per side, the
    workers' answers in order."""
    results: dict[str, list[Any]] = {side: [] for side in pythons}
    for rep in range(reps):
        order = list(pythons) if rep % 2 == 0 else list(reversed(pythons))
        for side in order:
            results[side].append(run_worker(pythons[side], argv, **kwargs))
            if label:
                print(f"  {label} {side} {rep + 1}/{reps}", file=sys.stderr, flush=True)
    return results


class SetupError(Exception):
    """An environment a benchmark could not set up (its message says why)."""


def bench_packages(python: str | os.PathLike[str], requirements: Path, build_dir: Path = ROOT / "build") -> Path:
    """The third-party packages of `requirements` (exact pins), installed once with `python
    -m pip install --no-deps --target` into <build_dir>/bench-scalar/site-<hash of the file>
    and returned from there after. Put on the workers' PYTHONPATH, they change neither env;
    a file that would install torch or numpy (replacing the env's) is refused. Raises
    SetupError."""
    key = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    dest = build_dir / "bench-scalar" / f"site-{key}"
    if (dest / ".complete").is_file():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    subprocess.run(["rm", "-rf", str(tmp), str(dest)], check=True)
    print(f"installing {requirements.name} into {dest} (--no-deps --target)", flush=True)
    proc = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                           "--target", str(tmp), "-r", str(requirements)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SetupError(f"pip install -r {requirements} failed:\n{proc.stdout}\n{proc.stderr}")
    leaked = [n for n in ("torch", "numpy") if (tmp / n).exists()]
    if leaked:
        raise SetupError(f"{requirements.name} would install {', '.join(leaked)}: it must not replace the env's")
    (tmp / ".complete").write_text(requirements.read_text())
    tmp.rename(dest)
    return dest


# ------------------------------------------------------------------------- timing


def per_call_us(fn: Callable[[], Any], calls: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """µs per call of `calls` consecutive calls of fn."""
    start = clock()
    for _ in range(calls):
        fn()
    return (clock() - start) / calls * 1e6


def median_us(fn: Callable[[], Any], calls: int, rounds: int = 15,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """Median over `rounds` of per_call_us, after one warm-up call."""
    fn()
    return median(per_call_us(fn, calls, clock) for _ in range(rounds))


def cpu_time_of(fn: Callable[[], Any]) -> float:
    """CPU seconds (process) of one call of fn."""
    start = cpu_s()
    fn()
    return cpu_s() - start


# ------------------------------------------------------------------------- output


def ratio(before: float, after: float) -> str:
    """before/after as `1.23x` ("n/a" where after is not positive)."""
    return f"{before / after:.2f}x" if after > 0 else "n/a"


def medians(samples: dict[str, Iterable[float]]) -> dict[str, float]:
    return {key: median(list(values)) for key, values in samples.items()}


def table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print a markdown table: cells as given (format numbers first), numbers right-aligned."""
    rows = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]

    def align(cell: str, width: int) -> str:
        number = cell.strip().lstrip("-")[:1].isdigit()
        return cell.rjust(width) if number else cell.ljust(width)

    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(align(c, w) for c, w in zip(r, widths)) + " |")
