#!/usr/bin/env python3
"""Guard-check cost of tensor containers: stock guards vs TensorContainerGuard.

Run with the patched wheel (python3 scripts/dynapatch.py build, then
.venv/bin/python scripts/bench_guards.py). For every scenario and size the same
function is compiled twice (backend "eager") in one process: once with
torch._dynamo.config.tensor_container_guards = False and every graph input given
an (empty) instance __dict__ as stock Dynamo gives it (no-tensor-instance-dict avoids that,
which also speeds up stock guard trees), which builds exactly the stock guard tree
on stock-shaped tensors, and once with the native guards and no such dicts. Each copy of the function has its own code
object, so both cache entries stay live and are measured alternately, round by
round, so that load on the machine hits both sides alike.

Printed, per scenario and N:
  * guard check: the cache entry's RootGuardManager.check(frame locals), median
    over rounds of the mean of many checks (us);
  * skip_guard_eval_unsafe: the cache entry's diff guard root, checked the same way;
  * compiled-call overhead: compiled call minus eager call of the same function on
    the same inputs, measured back to back, median over rounds (us).

Takes about 5 minutes on a 2-core VM, mostly compiling the N=10,000 cases twice;
--scenarios and --sizes narrow it down.

Scenarios (N tensors of 4 float32 elements each):
  list       f(xs): torch._foreach_add(xs, 1)
  dict       f(d): torch._foreach_add(list(d.values()), 1)      (key order guarded)
  paramlist  Module with an nn.ParameterList, forward: _foreach_mul(list(self.ps), x)
  optim      the optimizer-state update of foreach Adam over four lists
             (params, grads, exp_avgs, exp_avg_sqs), under no_grad
  init_once  OnceSGD.step of scripts/bench_skip_guard.py: a momentum-SGD class whose
             _init_group is an init_values_once function (grads, a state dict of
             dicts keyed by the params, params[i] is state key i); also prints
             the build_guards time of its compile
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib
import torch
import torch._dynamo
import torch._dynamo.config as dynamo_config
from bench_skip_guard import PlainSGD  # the same optimizer-like class as that benchmark
from torch._dynamo.eval_frame import _debug_get_cache_entry_list


def f_list(xs):
    return torch._foreach_add(xs, 1)


def f_dict(d):
    return torch._foreach_add(list(d.values()), 1)


def adam_update(params, grads, exp_avgs, exp_avg_sqs):
    with torch.no_grad():
        torch._foreach_lerp_(exp_avgs, grads, 0.1)
        torch._foreach_mul_(exp_avg_sqs, 0.999)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 0.001)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denom, 1e-8)
        torch._foreach_addcdiv_(params, exp_avgs, denom, -0.01)


def once_sgd_class(tag: str) -> type:
    def _init_group(self, group, params, grads, bufs):
        PlainSGD._init_group(self, group, params, grads, bufs)

    init = torch._dynamo.init_values_once(guards=["self.state", "self.param_groups", "group"])
    return type(
        f"OnceSGD_{tag}",
        (PlainSGD,),
        {"_init_group": init(_init_group), "step": fresh_copy(PlainSGD.step, tag)},
    )


def param_list_forward(self, x):
    return torch._foreach_mul(list(self.ps), x)


def fresh_copy(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    """The same function with its own code object, hence its own Dynamo cache."""
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__)


def make_case(kind: str, n: int, tag: str) -> tuple[Callable[..., Any], Any, tuple, dict]:
    """(callable, code whose cache entry to read, args, frame locals for the guards)."""
    if kind == "list":
        xs = [torch.randn(4) for _ in range(n)]
        fn = fresh_copy(f_list, tag)
        return fn, fn, (xs,), {"xs": xs}
    if kind == "dict":
        d = {f"t{i}": torch.randn(4) for i in range(n)}
        fn = fresh_copy(f_dict, tag)
        return fn, fn, (d,), {"d": d}
    if kind == "paramlist":
        forward = fresh_copy(param_list_forward, tag)
        cls = type(f"ParamListModule_{tag}", (torch.nn.Module,), {"forward": forward})
        m = cls()
        m.ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(4)) for _ in range(n)]
        )
        return m, forward, (2.0,), {"self": m, "x": 2.0}
    if kind == "optim":
        params = [torch.nn.Parameter(torch.randn(4)) for _ in range(n)]
        grads = [torch.randn(4) for _ in range(n)]
        exp_avgs = [torch.zeros(4) for _ in range(n)]
        exp_avg_sqs = [torch.zeros(4) for _ in range(n)]
        fn = fresh_copy(adam_update, tag)
        args = (params, grads, exp_avgs, exp_avg_sqs)
        names = ("params", "grads", "exp_avgs", "exp_avg_sqs")
        return fn, fn, args, dict(zip(names, args))
    if kind == "init_once":
        params = [torch.nn.Parameter(torch.randn(4)) for _ in range(n)]
        for p in params:
            p.grad = torch.randn(4)
        opt = once_sgd_class(tag)(params)
        return opt.step, type(opt).step, (), {"self": opt}
    raise ValueError(kind)


@contextlib.contextmanager
def stock_instance_dicts() -> Iterator[None]:
    """Give every traced tensor an empty instance __dict__, as stock Dynamo's
    _extract_tensor_dict does by reading t.__dict__ (no-tensor-instance-dict avoids it)."""
    import torch._dynamo.output_graph
    import torch._dynamo.variables.builder
    from torch._dynamo.utils import _extract_tensor_dict

    def extract(t: torch.Tensor) -> dict[str, Any]:
        t.__dict__  # creates the dict, as without no-tensor-instance-dict
        return _extract_tensor_dict(t)

    with (
        mock.patch.object(torch._dynamo.output_graph, "_extract_tensor_dict", extract),
        mock.patch.object(torch._dynamo.variables.builder, "_extract_tensor_dict", extract),
    ):
        yield


def build_guards_s() -> float:
    from torch._dynamo.utils import compilation_time_metrics

    return sum(compilation_time_metrics.get("build_guards", []))


def bench(kind: str, n: int, rounds: int, budget_us: float) -> dict[str, Any]:
    sides = {}
    for accel in (False, True):
        tag = "accel" if accel else "stock"
        fn, code, args, f_locals = make_case(kind, n, tag)
        with (
            dynamo_config.patch(tensor_container_guards=accel),
            contextlib.nullcontext() if accel else stock_instance_dicts(),
        ):
            compiled = torch.compile(fn, backend="eager")
            build_before = build_guards_s()
            start = time.perf_counter()
            compiled(*args)
            compile_s = time.perf_counter() - start
            build_s = build_guards_s() - build_before
        entries = _debug_get_cache_entry_list(code)
        assert len(entries) == 1, f"{kind}/{tag}: {len(entries)} cache entries"
        guard_manager = entries[0].guard_manager
        root = guard_manager.root
        assert root.check(f_locals), f"{kind}/{tag}: guards fail on their own inputs"
        native = sum(k.startswith("___tensor_container_") for k in guard_manager.closure_vars)
        assert accel or not native, f"{kind}/stock: has a TensorContainerGuard"
        diff_root = guard_manager.diff_guard_root
        sides[tag] = dict(
            native=native,
            diff_check=lambda d=diff_root, f_locals=f_locals: d.check(f_locals),
            eager=lambda fn=fn, args=args: fn(*args),
            compiled=lambda c=compiled, args=args: c(*args),
            check=lambda root=root, f_locals=f_locals: root.check(f_locals),
            compile_s=compile_s,
            build_s=build_s,
        )

    def calls_for(fn: Callable[[], Any], floor_us: float) -> int:
        fn()  # warm
        return max(1, int(budget_us / max(benchlib.per_call_us(fn, 1), floor_us)))

    samples: dict[str, list[float]] = {
        f"{tag}_{what}": []
        for tag in sides
        for what in ("check", "diff_check", "eager", "compiled", "overhead")
    }
    gc.collect()
    # Guard checks: consecutive checks of one side per sample (warm caches, as in a
    # loop of calls whose graph touches little memory), sides alternating.
    check_calls = {tag: calls_for(side["check"], 0.05) for tag, side in sides.items()}
    for _ in range(rounds):
        for tag, side in sides.items():
            side["check"]()
            samples[f"{tag}_check"].append(benchlib.per_call_us(side["check"], check_calls[tag]))
    # The diff guard root used under skip_guard_eval_unsafe (stock: O(N^2) in the
    # number of no-aliasing tensors, so fewer rounds).
    diff_calls = {tag: calls_for(side["diff_check"], 0.05) for tag, side in sides.items()}
    for _ in range(max(3, rounds // 3)):
        for tag, side in sides.items():
            side["diff_check"]()
            samples[f"{tag}_diff_check"].append(benchlib.per_call_us(side["diff_check"], diff_calls[tag]))
    # Calls: eager and compiled back to back; the overhead is their difference.
    call_calls = {tag: calls_for(side["eager"], 1.0) for tag, side in sides.items()}
    for _ in range(rounds):
        for tag, side in sides.items():
            eager = benchlib.per_call_us(side["eager"], call_calls[tag])
            compiled = benchlib.per_call_us(side["compiled"], call_calls[tag])
            samples[f"{tag}_eager"].append(eager)
            samples[f"{tag}_compiled"].append(compiled)
            samples[f"{tag}_overhead"].append(compiled - eager)
    out: dict[str, Any] = benchlib.medians(samples)
    out["native"] = sides["accel"]["native"]
    out["stock_compile_s"] = sides["stock"]["compile_s"]
    out["accel_compile_s"] = sides["accel"]["compile_s"]
    out["stock_build_s"] = sides["stock"]["build_s"]
    out["accel_build_s"] = sides["accel"]["build_s"]
    torch._dynamo.reset()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="list,dict,paramlist,optim")
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument(
        "--budget-us", type=float, default=3000.0, help="work per timing sample"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    print(
        f"torch {torch.__version__}, series {getattr(torch.version, 'dynapatch_series', '-')[:12]}, "
        f"tensor_container_guard_min_size={dynamo_config.tensor_container_guard_min_size}, "
        f"rounds={args.rounds}"
    )
    rows = []
    for kind in args.scenarios.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            r = bench(kind, n, args.rounds, args.budget_us)
            rows.append((kind, n, r))
            print(
                f"  {kind:9s} N={n:<6d} check stock {r['stock_check']:9.2f} us  "
                f"accel {r['accel_check']:8.2f} us  ({r['stock_check'] / r['accel_check']:.1f}x)  "
                f"compile {r['stock_compile_s']:.2f}s/{r['accel_compile_s']:.2f}s "
                f"(build_guards {r['stock_build_s']:.3f}s/{r['accel_build_s']:.3f}s)",
                flush=True,
            )

    print("\nGuard check: RootGuardManager.check(frame locals), median us")
    print(
        f"| {'scenario':9s} | {'N':>6s} | {'native guards':>13s} | {'stock':>9s} | "
        f"{'accelerated':>11s} | {'speedup':>7s} |"
    )
    print(f"|{'-' * 11}|{'-' * 8}|{'-' * 15}|{'-' * 11}|{'-' * 13}|{'-' * 9}|")
    for kind, n, r in rows:
        print(
            f"| {kind:9s} | {n:6d} | {r['native']:13d} | {r['stock_check']:9.2f} | "
            f"{r['accel_check']:11.2f} | {r['stock_check'] / r['accel_check']:6.1f}x |"
        )

    print(
        "\nskip_guard_eval_unsafe: diff guard root check (frame locals), median us"
    )
    print(f"| {'scenario':9s} | {'N':>6s} | {'stock':>11s} | {'accelerated':>11s} | {'speedup':>7s} |")
    print(f"|{'-' * 11}|{'-' * 8}|{'-' * 13}|{'-' * 13}|{'-' * 9}|")
    for kind, n, r in rows:
        print(
            f"| {kind:9s} | {n:6d} | {r['stock_diff_check']:11.2f} | {r['accel_diff_check']:11.2f} | "
            f"{r['stock_diff_check'] / r['accel_diff_check']:6.1f}x |"
        )

    print(
        "\nCompiled-call overhead: compiled call - eager call (median of per-round "
        "differences, us; negative when the compiled graph beats eager Python)"
    )
    print(
        f"| {'scenario':9s} | {'N':>6s} | {'eager call':>10s} | {'stock overhead':>14s} | "
        f"{'accel overhead':>14s} | {'ratio':>6s} |"
    )
    print(f"|{'-' * 11}|{'-' * 8}|{'-' * 12}|{'-' * 16}|{'-' * 16}|{'-' * 8}|")
    for kind, n, r in rows:
        eager = (r["stock_eager"] + r["accel_eager"]) / 2
        stock = r["stock_overhead"]
        accel = r["accel_overhead"]
        # A ratio of near-zero or negative overheads means nothing.
        ratio = f"{stock / accel:5.1f}x" if min(stock, accel) > 1.0 else "   n/a"
        print(
            f"| {kind:9s} | {n:6d} | {eager:10.1f} | {stock:14.1f} | {accel:14.1f} | {ratio:>6s} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
