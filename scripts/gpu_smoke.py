#!/usr/bin/env python3
"""GPU smoke test of the CUDA variant: dynapatch's features on CUDA tensors under inductor.

Run with the custom wheel's CUDA variant on a machine with a GPU:

    .venv/bin/python scripts/gpu_smoke.py

Each case runs the same code eagerly and compiled (backend="inductor") from the same
starting state, and compares every output and the Python state after every call
(counters, decays, optimizer state), then the number of compiled frames. Exit 0 when
all match, 1 on a mismatch; without a CUDA device it prints why and exits 0 (skipped).
"""

from __future__ import annotations

import copy
import sys

import torch
import torch._dynamo
import torch._dynamo.testing


def report(name: str, ok: bool, detail: str) -> bool:
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return ok


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


class Scalars(torch.nn.Module):
    """scalar state: an int step counter and a float decay the frame mutates."""

    def __init__(self):
        super().__init__()
        self.step = 0
        self.decay = 0.9
        self.layer = torch.nn.Linear(8, 8)

    def forward(self, x):
        self.step += 1
        self.decay = self.decay * 0.99
        return self.layer(x) * self.decay + self.step


class LazySGD:
    """init_values_once: state filled on first use, fresh grads every step."""

    def __init__(self, params):
        self.param_groups = [{"params": list(params), "lr": 0.1}]
        self.state = {}

    @torch._dynamo.init_values_once(guards=["self.state", "self.param_groups", "group"])
    def _init_group(self, group, params, grads, bufs):
        for p in group["params"]:
            if p.grad is not None:
                state = self.state.setdefault(p, {"buf": torch.zeros_like(p)})
                params.append(p)
                grads.append(p.grad)
                bufs.append(state["buf"])

    def step(self):
        with torch.no_grad():
            for group in self.param_groups:
                params, grads, bufs = [], [], []
                self._init_group(group, params, grads, bufs)
                torch._foreach_add_(bufs, grads)
                torch._foreach_add_(params, bufs, alpha=-group["lr"])


def total(xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


def case_scalars(device: str) -> bool:
    torch.manual_seed(0)
    eager = Scalars().to(device)
    compiled_mod = copy.deepcopy(eager)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(compiled_mod, backend=counter)
    ok = True
    for i in range(5):
        x = torch.randn(4, 8, device=device)
        out_e, out_c = eager(x), compiled(x)
        ok &= same(out_e, out_c) and (eager.step, eager.decay) == (compiled_mod.step, compiled_mod.decay)
    return report("scalar state (int counter + float decay)", ok and counter.frame_count == 1,
                  f"outputs and step/decay equal to eager: {ok}; frames {counter.frame_count} (expected 1)")


def case_init_values_once(device: str) -> bool:
    torch.manual_seed(0)
    params_e = [torch.nn.Parameter(torch.randn(16, device=device)) for _ in range(20)]
    params_c = [torch.nn.Parameter(p.detach().clone()) for p in params_e]
    opt_e, opt_c = LazySGD(params_e), LazySGD(params_c)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    step = torch.compile(opt_c.step, backend=counter)
    ok = True
    for i in range(5):
        for pe, pc in zip(params_e, params_c):
            g = torch.randn(16, device=device)
            pe.grad, pc.grad = g.clone(), g.clone()
        opt_e.step()
        step()
        ok &= same([p.detach() for p in params_e], [p.detach() for p in params_c])
        ok &= same([opt_e.state[p]["buf"] for p in params_e], [opt_c.state[p]["buf"] for p in params_c])
    return report("init_values_once optimizer", ok and counter.frame_count == 1,
                  f"params and state equal to eager: {ok}; frames {counter.frame_count} (expected 1)")


def case_container_guard(device: str) -> bool:
    torch.manual_seed(0)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    fn = torch.compile(total, backend=counter)
    xs = [torch.randn(32, device=device) for _ in range(64)]  # above tensor_container_guard_min_size
    ok = same(fn(xs), total(xs)) and same(fn(xs), total(xs))
    frames_same = counter.frame_count
    xs[7] = xs[7].double()  # the native container guard must catch a changed element
    ok &= same(fn(xs), total(xs))
    return report("tensor container guard", ok and frames_same == 1 and counter.frame_count == 2,
                  f"equal to eager: {ok}; frames {frames_same} then {counter.frame_count} after a dtype change "
                  f"(expected 1, 2)")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="dynapatch's features on CUDA tensors: inductor vs eager")
    parser.add_argument("--device", default="cuda",
                        help="run the cases on this device instead (cpu: to check the script itself)")
    device = parser.parse_args(argv).device
    if device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_smoke: skipped: no CUDA device (torch {torch.__version__}, "
              f"built for CUDA {torch.version.cuda})", flush=True)
        return 0
    where = torch.cuda.get_device_name(0) if device == "cuda" else device
    print(f"gpu_smoke: torch {torch.__version__} on {where}", flush=True)
    results = []
    for case in (case_scalars, case_init_values_once, case_container_guard):
        torch._dynamo.reset()
        try:
            results.append(case(device))
        except Exception as e:  # a crash is a failure of this case; the others still run
            results.append(report(case.__name__, False, f"{type(e).__name__}: {e}"))
    print(f"gpu_smoke: {sum(results)}/{len(results)} cases match eager", flush=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
