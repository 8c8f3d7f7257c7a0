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
random numbers is compared like any other. Each optimizer runs in its own subprocess (sweeplib.run_cases,
--timeout per case), first with the stock interpreter, then with the patched one,
serially; the third-party packages come from bench_scalar_state's packages dir
(benchlib.bench_packages) on both sides' PYTHONPATH. The harness and the report are
sweeplib.py's (shared with bench_metric_sweep.py).

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
import functools
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scalar_state as bss
import sweeplib
from sweeplib import describe


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


def registry() -> dict:
    """The worker for the sides' registries: names and versions."""
    from importlib.metadata import version

    import pytorch_optimizer

    import torch

    return {"names": pytorch_optimizer.get_supported_optimizers(), "torch": torch.__version__,
            "torch_file": torch.__file__, "pytorch_optimizer": version("pytorch_optimizer")}


def run_case(name: str, steps: int, backend: str, recompile_limit: int) -> dict:
    import copy
    import random
    import traceback
    import warnings

    warnings.filterwarnings("ignore")
    import numpy as np
    import pytorch_optimizer

    import torch

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

    watch = sweeplib.CompileWatch(backend, recompile_limit)
    compiled = torch.compile(bss.opt_step, backend=watch.backend)

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
        watch.after_call(step + 1, state(model_c, opt_c), state(model_e, opt_e))
    return {**result, **watch.result()}


# --------------------------------------------------------------------------- parent


def fail(message: str) -> None:
    print(f"bench_optimizer_sweep: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


# The recompile every optimizer has: its first call fills the empty state or adds keys to it
# or to the param groups (the floor of 2 graphs)
FIRST_CALL = re.compile(r"^[\w.]+: not (opt|self)\.state$"
                        r"|^[\w.]+: not ___dict_contains\('\w+', (opt|self)\.(state|param_groups\[#\])\)$")
branch_floor = functools.partial(sweeplib.branch_floor, first_call=FIRST_CALL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweeplib.add_arguments(parser, "optimizer")
    parser.add_argument("--optimizers", help="comma-separated subset of the registered names")
    args = parser.parse_args()
    if args.worker:
        return sweeplib.worker(args, registry, run_case)

    sides, env, registries = sweeplib.prepare(args, __file__, fail)
    for side, reg in registries.items():
        print(f"{side}: torch {reg['torch']} ({sides[side]}), pytorch-optimizer {reg['pytorch_optimizer']}, "
              f"{len(reg['names'])} optimizers", flush=True)
    if registries["stock"]["names"] != registries["patched"]["names"]:
        fail("the sides register different optimizers")
    known = registries["patched"]["names"]
    names = [n.strip().lower() for n in args.optimizers.split(",") if n.strip()] if args.optimizers else known
    unknown = [n for n in names if n not in known]
    if unknown:
        fail(f"unknown optimizer(s) {', '.join(unknown)}; registered: {', '.join(known)}")
    return sweeplib.sweep(args, __file__, names, sides, env, "optimizer", FIRST_CALL, "bench_optimizer_sweep")


if __name__ == "__main__":
    sys.exit(main())
