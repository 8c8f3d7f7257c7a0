#!/usr/bin/env python3
"""Scalar state in real training code: stock torch vs the custom wheel, side by side.

Issue 13's benchmark. Each case is a short training loop of unmodified code: the
optimizer (or the training step) is `torch.compile`d, everything else runs eagerly,
and a second copy of the same model, optimizer and scheduler runs the same steps
entirely eagerly next to it. Every case runs in its own subprocess, first with the
stock interpreter, then with the patched one, one at a time (the machine's cores are
shared).

Cases (steps: 20; scheduler cases: 30):
  torch_adamw          torch.optim.AdamW(foreach=True), no scheduler (the reference row)
  timm_laprop          timm.optim.LaProp          (float EMA of the lr in per-param state)
  timm_adabelief       timm.optim.AdaBelief       (int state[p]['step'], 0.999 ** step)
  timm_adabelief_deep  the same over a 61-layer MLP: 122 state[p]['step'] places marked by
                       one trace (more than Dynamo's 100 restarts if each restarted it)
  timm_adan            timm.optim.Adan            (param_groups[0]['step'])
  timm_madgrad         timm.optim.MADGRAD         (param_groups[0]['step'])
  po_lion              pytorch_optimizer.Lion     (param_groups[0]['step'])
  po_adabelief         pytorch_optimizer.AdaBelief (param_groups[0]['step'] and floats of it)
  po_lorarite          pytorch_optimizer.LoRARite (a decay of float(state['step'] + 1) passed as
                       mul() and add_(alpha=); the MLP's params paired as LoRA factors)
  po_soap              pytorch_optimizer.SOAP     (step_size of param_groups[0]['step'] as
                       add_(alpha=); its preconditioner refresh every 10 steps is a branch)
  po_dadapt_lion       pytorch_optimizer.DAdaptLion (a float d_hat from .item() after a graph
                       break, d = max(d, d_hat) stored in param_groups[0]['d'] by the resume frame)
  sched_onecycle       AdamW(foreach=True, lr=float) + OneCycleLR (default cycle_momentum:
                       it writes group['lr'] and group['betas'] every step)
  sched_cosine         AdamW(foreach=True, lr=float) + CosineAnnealingLR(T_max=steps)
  sched_lambda_warmup  AdamW(foreach=True, lr=float) + LambdaLR, linear warmup over 10 steps
  counter_after_backward
                       an nn.Module whose forward does `self.step += 1`; the compiled
                       training step calls it, runs `loss.backward()` (a graph break) and
                       then reads `model.step` (an lr decay `alpha=0.1 / model.step`)
The optimizer and scheduler cases compile `def opt_step(opt): opt.step()` and call it
after an eager forward/backward of a small MLP, then `scheduler.step()` eagerly, as
in a training loop; the optimizers use their defaults.

Columns, per side (stock / patched):
  graphs     graphs handed to the backend (CompileCounterWithBackend around --backend)
  limit      code objects that hit config.recompile_limit (default 8): from then on they
             run eagerly for good
  1st s      wall time of the first call (it compiles)
  compile s  wall time of all calls that compiled at least one graph (each also runs
             its step once)
  ms/step    median wall time of the compiled call over the calls that compiled nothing
  eager      "same": parameters, optimizer state_dict (tensors, ints and floats, with
             their Python types), scheduler state_dict and the module counter are
             bitwise equal to the eager copy after every step; "close": within
             torch.testing.assert_close's tolerances (tensors) and 1e-12 relative
             (Python floats), types, ints and keys exact (compiled torch.optim is ~1 ulp
             off eager on stock too); "DIFF": the first difference (printed below)
Targets (issue 13), judged on the patched side: every optimizer <= 2 graphs over 20
steps (the first call fills an empty state: that one recompile is the floor; po_soap
<= 3: its refresh at step 10 is a real branch; timm_adabelief <= 3: its RAdam-style
rectification `if num_sma >= 5` on the symbolic step flips at step 6, one graph per side;
po_dadapt_lion <= 3, stock's count: its
.item() graph break makes a resume frame); torch_adamw <= 1; each scheduler case
<= 2 graphs over 30 steps; the counter case
compiles nothing after its 2 warm-up steps (1 graph per code object from then on);
and always: no recompile-limit hit and results "same" or "close". Recompile reasons
(TORCH_LOGS=recompiles) of the cases that recompiled are printed below the table.

Environments. --stock-python (or --stock) defaults to the cached venv with the unpatched
base wheel that `dynapatch.py upstream-tests` uses (<cache-dir>/stockenv-<key>; run
`dynapatch.py upstream-tests` once to create it), else the stock env benchlib finds;
--patched to .venv/bin/python. Neither env is modified: the third-party packages
(requirements-bench.txt, exact pins) are installed once with `pip install --no-deps
--target` into build/bench-scalar/site-<hash of that file> and put on PYTHONPATH of
both sides, so torch is never replaced or shadowed (each side's torch.__version__
is printed; a torch imported from that directory is refused). torchvision 0.28.0 from the
registry is a CUDA build: its C ops cannot load with CPU torch and its import fails
while registering fake kernels for them. timm needs only its pure-Python parts, so
the child imports torchvision with torch.library.register_fake made to skip
torchvision ops that do not exist (restored right after; no case uses a torchvision
op) and says so; --strict-imports turns that off, and then the timm cases are
skipped. A case whose package does not import is skipped and reported.

Exit status (only the patched side is judged; stock is the reference):
0 every case ran and met its targets on the patched side;
1 some case missed a target or failed to run on the patched side (FAIL/ERROR rows);
2 bad arguments, or an environment that could not be set up (or imports torch from
the packages dir);
3 nothing failed, but some case was skipped (a package did not import).

    .venv/bin/python scripts/bench_scalar_state.py --cache-dir /work/main/build/cache
    .venv/bin/python scripts/bench_scalar_state.py --cases sched_cosine --scheduler-steps 10
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

ROOT = benchlib.ROOT
REQUIREMENTS = ROOT / "requirements-bench.txt"
WARMUP_STEPS = 2  # the counter case: steps allowed to compile (first trace, one observed change)


@dataclass(frozen=True)
class Case:
    name: str
    package: str | None  # third-party top-level package the case needs, or None
    scheduler: bool  # runs --scheduler-steps instead of --steps
    max_graphs: int | None  # target on the patched side; None: the counter case's own target
    what: str


CASES = {c.name: c for c in (
    Case("torch_adamw", None, False, 1, "torch.optim.AdamW(foreach=True)"),
    Case("timm_laprop", "timm", False, 2, "timm LaProp"),
    Case("timm_adabelief", "timm", False, 3, "timm AdaBelief (rectification flips at step 6)"),
    Case("timm_adabelief_deep", "timm", False, 3, "timm AdaBelief, 122 parameter tensors"),
    Case("timm_adan", "timm", False, 2, "timm Adan"),
    Case("timm_madgrad", "timm", False, 2, "timm MADGRAD"),
    Case("po_lion", "pytorch_optimizer", False, 2, "pytorch-optimizer Lion"),
    Case("po_adabelief", "pytorch_optimizer", False, 2, "pytorch-optimizer AdaBelief"),
    Case("po_lorarite", "pytorch_optimizer", False, 2, "pytorch-optimizer LoRA-RITE"),
    Case("po_soap", "pytorch_optimizer", False, 3, "pytorch-optimizer SOAP (refresh at step 10)"),
    Case("po_dadapt_lion", "pytorch_optimizer", False, 3, "pytorch-optimizer D-Adapt Lion (.item() break)"),
    Case("sched_onecycle", None, True, 2, "AdamW + OneCycleLR"),
    Case("sched_cosine", None, True, 2, "AdamW + CosineAnnealingLR"),
    Case("sched_lambda_warmup", None, True, 2, "AdamW + LambdaLR warmup"),
    Case("counter_after_backward", None, False, None, "self.step += 1, read after backward"),
)}


# --------------------------------------------------------------------------- child


def import_torchvision_tolerant(strict: bool) -> str | None:
    """Import torchvision; return a note if its missing C ops had to be tolerated."""
    import torch
    import torch.library

    try:
        import torchvision  # imported only to learn whether it loads

        return None
    except RuntimeError as e:
        if strict or "torchvision::" not in str(e):
            raise
        first_error = str(e).splitlines()[0]
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    original = torch.library.register_fake

    def register_fake(op, *args, **kwargs):
        if isinstance(op, str) and op.startswith("torchvision::"):
            try:
                getattr(torch.ops.torchvision, op.split("::", 1)[1])
            except (AttributeError, RuntimeError):
                return lambda fn: fn  # the op does not exist: nothing to register a fake for
        return original(op, *args, **kwargs)

    torch.library.register_fake = register_fake
    try:
        import torchvision
    finally:
        torch.library.register_fake = original
    return (f"torchvision {torchvision.__version__}: C ops not loadable ({first_error}); "
            "imported with fake registrations of missing ops skipped")


# Compiled optimizers compute bias corrections etc. as tensors, not Python floats, so even
# stock torch.optim under aot_eager is ~1 ulp off eager: tensors are compared with
# torch.testing.assert_close's float32/float64 tolerances, Python floats with 1e-12
# relative, ints, types, keys and lengths exactly.
FLOAT_RTOL = 1e-12


def compare(a, b, path: str = "") -> tuple[str | None, float]:
    """(first difference beyond tolerance or None, max abs difference of all tensors and floats)."""
    import torch

    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs eager {type(b).__name__}", 0.0
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{path}: {a.dtype}{list(a.shape)} vs eager {b.dtype}{list(b.shape)}", 0.0
        if torch.equal(a, b):
            return None, 0.0
        if not a.is_floating_point():
            return f"{path}: {a.tolist()} vs eager {b.tolist()}", 0.0
        delta = (a.double() - b.double()).abs().nan_to_num(nan=float("inf"))
        delta[a.isnan() & b.isnan()] = 0.0
        worst = delta.max().item() if delta.numel() else 0.0
        try:
            torch.testing.assert_close(a, b, equal_nan=True)
        except AssertionError:
            return f"{path}: max abs diff {worst:.3g}", worst
        return None, worst
    if isinstance(a, (dict, list, tuple, collections.deque)):  # deques: pytorch-optimizer AdaShift
        if isinstance(a, dict) and list(a) != list(b):
            return f"{path}: keys {list(a)} vs eager {list(b)}", 0.0
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs eager {len(b)}", 0.0
        worst = 0.0
        for k, x, y in (((k, a[k], b[k]) for k in a) if isinstance(a, dict) else
                        ((i, x, y) for i, (x, y) in enumerate(zip(a, b)))):
            d, w = compare(x, y, f"{path}[{k!r}]")
            if d:
                return d, w
            worst = max(worst, w)
        return None, worst
    if isinstance(a, float):
        if a == b or (a != a and b != b):
            return None, 0.0
        if abs(a - b) <= FLOAT_RTOL * abs(b):
            return None, abs(a - b)
        return f"{path}: {a!r} vs eager {b!r}", abs(a - b)
    if a != b:
        return f"{path}: {a!r} vs eager {b!r}", 0.0
    return None, 0.0


DEEP_LAYERS = 61  # the *_deep cases: 122 parameter tensors


def make_mlp(case: str):
    import torch

    torch.manual_seed(0)
    if case.endswith("_deep"):
        hidden = [m for _ in range(DEEP_LAYERS - 1) for m in (torch.nn.Linear(16, 16), torch.nn.Tanh())]
        return torch.nn.Sequential(*hidden, torch.nn.Linear(16, 4))
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def batch(step: int):
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def make_optimizer(case: str, params):
    import torch

    if case == "torch_adamw" or case.startswith("sched_"):
        return torch.optim.AdamW(params, lr=1e-2, foreach=True)
    if case.startswith("timm_"):
        import timm.optim

        cls = {"timm_laprop": timm.optim.LaProp, "timm_adabelief": timm.optim.AdaBelief,
               "timm_adan": timm.optim.Adan, "timm_madgrad": timm.optim.MADGRAD}[case.removesuffix("_deep")]
        return cls(params)
    import pytorch_optimizer

    cls = {"po_lion": pytorch_optimizer.Lion, "po_adabelief": pytorch_optimizer.AdaBelief,
           "po_lorarite": pytorch_optimizer.LoRARite, "po_soap": pytorch_optimizer.SOAP,
           "po_dadapt_lion": pytorch_optimizer.DAdaptLion}[case]
    return cls(params)


def make_scheduler(case: str, opt, steps: int):
    import torch

    lr = torch.optim.lr_scheduler
    if case == "sched_onecycle":
        return lr.OneCycleLR(opt, max_lr=1e-2, total_steps=steps)
    if case == "sched_cosine":
        return lr.CosineAnnealingLR(opt, T_max=steps)
    if case == "sched_lambda_warmup":
        return lr.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    return None


def opt_step(opt):
    opt.step()


def counter_net_class():
    import torch

    class CountingNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc1 = torch.nn.Linear(16, 32)
            self.fc2 = torch.nn.Linear(32, 4)
            self.step = 0

        def forward(self, x):
            self.step += 1
            return self.fc2(torch.tanh(self.fc1(x)))

    return CountingNet


def train_step(model, x, y):
    import torch

    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(p.grad, alpha=0.1 / model.step)
    return loss.detach()


def run_child(case: str, steps: int, backend: str, recompile_limit: int, strict_imports: bool) -> dict:
    import copy
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend

    result: dict = {"torch": torch.__version__, "torch_file": torch.__file__, "notes": []}
    spec = CASES[case]
    try:
        if spec.package == "timm":
            note = import_torchvision_tolerant(strict_imports)
            if note:
                result["notes"].append(note)
            import timm
            import timm.optim  # imported only to learn whether it loads

            # Importing timm.optim (its kron module) sets torch._dynamo.config.cache_size_limit
            # = 1_000_000: imported here, before --recompile-limit is set below, or the timm
            # rows would recompile without ever hitting the limit.
            result["notes"].append(f"timm {timm.__version__}")
        elif spec.package == "pytorch_optimizer":
            from importlib.metadata import version

            import pytorch_optimizer  # noqa: F401

            result["notes"].append(f"pytorch-optimizer {version('pytorch_optimizer')}")
    except Exception as e:  # any import failure means: skip this case
        result["skipped"] = f"{spec.package} does not import: {type(e).__name__}: {str(e).splitlines()[0]}"
        return result

    torch._dynamo.config.recompile_limit = recompile_limit
    limit_hits: set[str] = set()
    reasons: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if msg.startswith("torch._dynamo hit config."):
                # "...\n   function: 'name' (file:line)\n..."
                for line in msg.splitlines():
                    if line.strip().startswith("function:"):
                        limit_hits.add(line.split("'")[1] if "'" in line else line.strip())
            elif msg.startswith("Recompiling function"):
                lines = msg.splitlines()
                fn = lines[0].split()[2]
                first = next((ln.strip()[2:] for ln in lines[1:] if ln.strip().startswith("- ")), "?")
                reasons.append(f"{fn}: {' '.join(first.split())}")

    torch._logging.set_logs(recompiles=True)
    for name in ("torch._dynamo.convert_frame", "torch._dynamo.guards.__recompiles"):
        lg = logging.getLogger(name)
        lg.addHandler(Capture())
        lg.propagate = False  # keep stderr quiet; the parent prints what matters

    compiles: list[tuple[int, str]] = []  # (step, code object) per graph
    current_step = [0]

    class Counter(CompileCounterWithBackend):
        def __call__(self, gm, example_inputs):
            try:
                from torch._dynamo.symbolic_convert import InstructionTranslator

                code = InstructionTranslator.current_tx().f_code.co_name
            except Exception:  # only a label
                code = "?"
            compiles.append((current_step[0], code))
            return super().__call__(gm, example_inputs)

    counter = Counter(backend)
    times: list[float] = []
    compiled_steps: list[bool] = []
    differences: dict[str, str] = {}
    max_diff = 0.0

    if case == "counter_after_backward":
        cls = counter_net_class()
        model_e, model_c = cls(), cls()
        compiled = torch.compile(train_step, backend=counter)

        def one_step(step):
            x, y = batch(step)
            for m in (model_e, model_c):
                for p in m.parameters():
                    p.grad = None
            train_step(model_e, x, y)
            start = time.perf_counter()
            compiled(model_c, x, y)
            return time.perf_counter() - start

        def state(model):
            return {"params": dict(model.state_dict()), "step": model.step}

        sides = (model_c, model_e)
    else:
        model_e = make_mlp(case)
        model_c = copy.deepcopy(model_e)
        opt_e, opt_c = make_optimizer(case, model_e.parameters()), make_optimizer(case, model_c.parameters())
        sched_e, sched_c = make_scheduler(case, opt_e, steps), make_scheduler(case, opt_c, steps)
        compiled = torch.compile(opt_step, backend=counter)

        def one_step(step):
            x, y = batch(step)
            for m, o in ((model_e, opt_e), (model_c, opt_c)):
                o.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(m(x), y).backward()
            opt_e.step()
            start = time.perf_counter()
            compiled(opt_c)
            elapsed = time.perf_counter() - start
            if sched_c is not None:
                sched_e.step()
                sched_c.step()
            return elapsed

        def state(side):
            model, opt, sched = side
            return {"params": dict(model.state_dict()), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict() if sched is not None else None}

        sides = ((model_c, opt_c, sched_c), (model_e, opt_e, sched_e))

    try:
        for step in range(steps):
            current_step[0] = step
            before = counter.frame_count
            times.append(one_step(step))
            compiled_steps.append(counter.frame_count > before)
            # Each part (parameters, optimizer, scheduler, counter) keeps its first difference,
            # so a difference in Python state does not hide one in the values, or vice versa.
            compiled_state, eager_state = state(sides[0]), state(sides[1])
            for part in compiled_state:
                if part not in differences:
                    d, worst = compare(compiled_state[part], eager_state[part], part)
                    max_diff = max(max_diff, worst)
                    if d:
                        differences[part] = f"step {step + 1}: {d}"
    except Exception as e:  # reported as this side's error
        import traceback

        result["error"] = f"step {len(times) + 1}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        result["traceback"] = traceback.format_exc()[-3000:]
        return result

    steady = [t for t, c in zip(times, compiled_steps) if not c]
    per_code: dict[str, int] = {}
    for _, code in compiles:
        per_code[code] = per_code.get(code, 0) + 1
    result.update({
        "graphs": counter.frame_count,
        "limit_hits": sorted(limit_hits),
        "first_s": times[0],
        "compile_s": sum(t for t, c in zip(times, compiled_steps) if c),
        "steady_ms": benchlib.median(steady) * 1e3 if steady else None,
        "eager": "; ".join(differences.values()) or ("same" if max_diff == 0.0 else "close"),
        "max_diff": max_diff,
        "graphs_per_code": per_code,
        "graphs_after_warmup": sum(1 for s, _ in compiles if s >= WARMUP_STEPS),
        "reasons": reasons,
    })
    return result


# --------------------------------------------------------------------------- parent


def fail_setup(message: str) -> None:
    print(f"bench_scalar_state: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def run_side(python: Path, case: str, steps: int, args: argparse.Namespace, pythonpath: Path | None) -> dict:
    env = benchlib.worker_env(threads=None, pythonpath=pythonpath)
    argv = [Path(__file__).resolve(), "--child", case, "--steps", steps, "--backend", args.backend,
            "--recompile-limit", args.recompile_limit, *(["--strict-imports"] if args.strict_imports else [])]
    return benchlib.run_worker(str(python), argv, env=env, timeout=args.timeout, check=False)


def verdict(case: Case, r: dict) -> tuple[str, list[str]]:
    """(PASS/FAIL/SKIP/ERROR, the targets missed) for the patched side."""
    if "skipped" in r:
        return "SKIP", [r["skipped"]]
    if "error" in r:
        return "ERROR", [r["error"]]
    missed = []
    if case.max_graphs is not None and r["graphs"] > case.max_graphs:
        missed.append(f"{r['graphs']} graphs > {case.max_graphs}")
    if case.max_graphs is None and r["graphs_after_warmup"]:
        missed.append(f"{r['graphs_after_warmup']} graphs after {WARMUP_STEPS} warm-up steps")
    if r["limit_hits"]:
        missed.append("recompile limit hit: " + ", ".join(r["limit_hits"]))
    if r["eager"] not in ("same", "close"):
        missed.append(f"differs from eager: {r['eager']}")
    return ("FAIL" if missed else "PASS"), missed


def target_text(case: Case, steps: int) -> str:
    if case.max_graphs is None:
        return f"0 graphs after step {WARMUP_STEPS}"
    return f"<={case.max_graphs} graphs/{steps}"


def cell(r: dict, key: str) -> str:
    if "skipped" in r:
        return "skip"
    if "error" in r:
        return "ERROR"
    value = r[key]
    if key == "limit_hits":
        return str(len(value))
    if key == "eager":
        return value if value in ("same", "close") else "DIFF"
    if value is None:
        return "-"
    if key in ("first_s", "compile_s"):
        return f"{value:.2f}"
    if key == "steady_ms":
        return f"{value:.2f}"
    return str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchlib.add_side_args(parser)
    parser.add_argument("--patched", type=Path, default=ROOT / ".venv" / "bin" / "python",
                        help="python of the custom wheel (default: .venv/bin/python)")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / "build" / "cache",
                        help="dynapatch cache dir (base wheel, stock env); default build/cache")
    parser.add_argument("--cases", help="comma-separated subset of: " + ", ".join(CASES))
    parser.add_argument("--steps", type=int, default=20, help="steps of the optimizer and counter cases")
    parser.add_argument("--scheduler-steps", type=int, default=30, help="steps of the scheduler cases")
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--recompile-limit", type=int, default=8, help="torch._dynamo.config.recompile_limit")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per case and side")
    parser.add_argument("--strict-imports", action="store_true",
                        help="no torchvision import workaround: the timm cases are skipped if it fails")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(json.dumps(run_child(args.child, args.steps, args.backend, args.recompile_limit,
                                   args.strict_imports)), flush=True)
        return 0

    names = list(CASES) if not args.cases else [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        fail_setup(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    if min(args.steps, args.scheduler_steps) < WARMUP_STEPS + 1:
        fail_setup(f"--steps and --scheduler-steps must be at least {WARMUP_STEPS + 1}")
    stock = benchlib.stock_python(args.stock_python, args.cache_dir.resolve())
    sides = benchlib.sides(argparse.Namespace(stock_python=stock), patched=str(args.patched))
    needs_packages = any(CASES[n].package for n in names)
    try:
        site = benchlib.bench_packages(stock, REQUIREMENTS) if needs_packages else None
    except benchlib.SetupError as e:
        fail_setup(str(e))

    results: dict[str, dict[str, dict]] = {}
    for name in names:
        case = CASES[name]
        steps = args.scheduler_steps if case.scheduler else args.steps
        results[name] = {}
        for label, python in sides.items():
            started = time.monotonic()
            r = run_side(Path(python), name, steps, args, site)
            results[name][label] = r
            status = r.get("skipped") or r.get("error") or f"{r['graphs']} graphs"
            print(f"  {name:<24} {label:<8} {time.monotonic() - started:6.1f} s  {status}", flush=True)
            torch_file = r.get("torch_file")
            if torch_file and site is not None and Path(torch_file).resolve().is_relative_to(site):
                fail_setup(f"{label}: torch was imported from {torch_file}, the bench packages dir")

    versions = {label: next((r[label]["torch"] for r in results.values() if "torch" in r[label]), "?")
                for label in sides}
    if versions["stock"] == versions["patched"]:
        print(f"note: both sides run torch {versions['stock']}", flush=True)
    print(f"\nstock: torch {versions['stock']} ({stock})\npatched: torch {versions['patched']} "
          f"({args.patched})\nbackend={args.backend}, recompile_limit={args.recompile_limit}, "
          f"steps={args.steps}, scheduler steps={args.scheduler_steps}; each cell: stock / patched\n")
    print("| case | target (patched) | graphs | limit | 1st s | compile s | ms/step | eager | patched |")
    print("|---|---|---|---|---|---|---|---|---|")
    verdicts = {}
    for name, by_side in results.items():
        case = CASES[name]
        steps = args.scheduler_steps if case.scheduler else args.steps
        s, p = by_side["stock"], by_side["patched"]
        verdicts[name] = verdict(case, p)
        cells = [f"{cell(s, k)} / {cell(p, k)}"
                 for k in ("graphs", "limit_hits", "first_s", "compile_s", "steady_ms", "eager")]
        print(f"| {name} | {target_text(case, steps)} | " + " | ".join(cells) + f" | {verdicts[name][0]} |")

    print()
    for name, by_side in results.items():
        for label in sides:
            r = by_side[label]
            extra = []
            if r.get("notes"):
                extra.append("; ".join(r["notes"]))
            if "skipped" in r:
                extra.append(f"SKIPPED: {r['skipped']}")
            if "error" in r:
                extra.append(f"ERROR: {r['error']}\n{r.get('traceback', '')}")
            if r.get("eager", "same") == "close":
                extra.append(f"eager: close, max abs diff {r['max_diff']:.3g}")
            elif r.get("eager", "same") != "same":
                extra.append(f"eager difference: {r['eager']}")
            if r.get("limit_hits"):
                extra.append("recompile limit hit by: " + ", ".join(r["limit_hits"]))
            if len(r.get("graphs_per_code", {})) > 1 or (r.get("graphs", 0) > 1):
                extra.append("graphs per code object: " + ", ".join(
                    f"{code} {n}" for code, n in r["graphs_per_code"].items()))
            distinct = list(dict.fromkeys(r.get("reasons", [])))
            if distinct:
                shown = [x if len(x) <= 160 else x[:157] + "..." for x in distinct[:3]]
                extra.append(f"recompile reasons ({len(r['reasons'])}, first {len(shown)} distinct): "
                             + " | ".join(shown))
            for line in extra:
                print(f"{name} [{label}]: {line}")
    failed = [n for n, (v, _) in verdicts.items() if v in ("FAIL", "ERROR")]
    skipped = [n for n, (v, _) in verdicts.items() if v == "SKIP"]
    passed = [n for n, (v, _) in verdicts.items() if v == "PASS"]
    print(f"\npatched: {len(passed)} PASS, {len(failed)} FAIL/ERROR, {len(skipped)} SKIP")
    for n in failed:
        print(f"  {n}: {'; '.join(verdicts[n][1])}")
    if failed:
        return 1
    return 3 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
