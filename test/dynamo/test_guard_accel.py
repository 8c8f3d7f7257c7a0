# Owner(s): ["module: dynamo"]
"""One native guard for large containers of tensors (torch._dynamo.guard_accel)."""

import contextlib
import gc
import random
import re
import sys
import types
import unittest
import warnings
import weakref
from unittest import mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo import config, guard_accel
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.exc import RecompileError
from torch._dynamo.testing import CompileCounter
from torch.utils._python_dispatch import TorchDispatchMode


N = 1000
K = config.tensor_container_guard_min_size


def foreach_add(xs):
    return torch._foreach_add(xs, 1)


def foreach_add_star(*xs):
    return torch._foreach_add(xs, 1)


def values_add(d):
    return torch._foreach_add(list(d.values()), 1)


def two_lists_and_one(xs, ys, x):
    return torch._foreach_add(xs, ys), x * 2


def lookup_add(d, keys):
    # d is only indexed, never iterated: its key order is not guarded.
    return [d[k] + 1 for k in keys]


class ParamList(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(4)) for _ in range(n)]
        )

    def forward(self, x):
        return torch._foreach_mul(list(self.ps), x)


def fresh_copy(fn):
    """The same function with its own code object (so its own Dynamo cache)."""
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{id(object())}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__)


def guard_manager_of(fn):
    entries = _debug_get_cache_entry_list(fn)
    assert len(entries) == 1, len(entries)
    return entries[0].guard_manager


def native_guards(guard_manager):
    return sorted(
        k for k in guard_manager.closure_vars if k.startswith("___tensor_container_")
    )


# Without the extension the guards are the stock ones; only the fallback tests run.
requires_extension = unittest.skipIf(
    guard_accel.extension() is None, "torch._dynamo._guard_accel is not built"
)


class PassThroughMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class ContainerTestCase(torch._dynamo.test_case.TestCase):
    def compile_once(self, fn, *args, **compile_kwargs):
        fn = fresh_copy(fn)
        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt, **compile_kwargs)
        compiled(*args)
        self.assertEqual(cnt.frame_count, 1)
        return fn, compiled, cnt

    def assert_recompile_reason(self, compiled, args, reason):
        with config.patch(error_on_recompile=True):
            with self.assertRaisesRegex(RecompileError, re.escape(reason)):
                compiled(*args)


@requires_extension
class TensorContainerGuardTests(ContainerTestCase):

    def test_installed_for_large_containers_only(self):
        small = [torch.randn(4) for _ in range(K - 1)]
        fn, _, _ = self.compile_once(foreach_add, small)
        gm = guard_manager_of(fn)
        self.assertEqual(native_guards(gm), [])
        self.assertIn("TENSOR_MATCH", str(gm))

        large = [torch.randn(4) for _ in range(K)]
        fn, _, _ = self.compile_once(foreach_add, large)
        gm = guard_manager_of(fn)
        self.assertEqual(native_guards(gm), ["___tensor_container_0"])
        self.assertNotIn("TENSOR_MATCH", str(gm))
        self.assertNotIn("NO_TENSOR_ALIASING", str(gm))
        self.assertEqual(gm.closure_vars["___tensor_container_0"].num_tensors(), K)

    def test_each_field_change_fails_and_is_named(self):
        xs = [torch.randn(4) for _ in range(N)]
        fn, compiled, cnt = self.compile_once(foreach_add, xs)
        self.assertEqual(native_guards(guard_manager_of(fn)), ["___tensor_container_0"])

        # Same metadata, new tensors: no recompile.
        compiled([x.clone() for x in xs])
        self.assertEqual(cnt.frame_count, 1)

        t = xs[417]
        strided = torch.randn(8)[::2]
        marked = t.clone()
        torch._dynamo.mark_dynamic(marked, 0)
        cases = {
            "type": (torch.nn.Parameter(t.clone()), "type changed Tensor -> Parameter"),
            "dispatch keys": (t._neg_view(), "dispatch key set changed"),
            "dtype": (t.double(), "dtype changed float32 -> float64"),
            "requires_grad": (
                t.clone().requires_grad_(),
                "requires_grad changed False -> True",
            ),
            "rank": (t.reshape(2, 2), "rank changed 1 -> 2"),
            "size": (torch.randn(5), "size[0] changed 4 -> 5"),
            "stride": (strided, "stride[0] changed 1 -> 2"),
            "dim marking": (marked, "_dynamo_dynamic_indices was set after compilation"),
        }
        for field, (value, reason) in cases.items():
            with self.subTest(field=field):
                ys = list(xs)
                ys[417] = value
                self.assert_recompile_reason(compiled, (ys,), f"xs[417]: {reason}")
        with self.subTest(field="aliasing"):
            ys = list(xs)
            ys[417] = ys[3]
            self.assert_recompile_reason(
                compiled, (ys,), "xs[3] and xs[417] are the same tensor"
            )
        self.assertEqual(cnt.frame_count, 1)

        # Every failure above is a real guard failure: it recompiles.
        ys = list(xs)
        ys[417] = t.double()
        compiled(ys)
        self.assertEqual(cnt.frame_count, 2)

    def test_parameter_list_module(self):
        forward = fresh_copy(ParamList.forward)
        m = type("ParamListCopy", (ParamList,), {"forward": forward})(64)
        cnt = CompileCounter()
        compiled = torch.compile(m, backend=cnt)
        self.assertEqual(compiled(2.0), m(2.0))
        gm = guard_manager_of(forward)
        self.assertEqual(native_guards(gm), ["___tensor_container_0"])
        # Parameters are not under the no-aliasing guard (skip_no_tensor_aliasing_guards_on_parameters).
        self.assertNotIn("___tensor_aliasing_group", gm.closure_vars)

        with torch.no_grad():
            m.ps[17] = torch.nn.Parameter(torch.randn(5))
        self.assert_recompile_reason(
            compiled, (2.0,), "self._modules['ps']._parameters['17']: size[0] changed 4 -> 5"
        )

    def test_dict_key_order_guarded(self):
        d = {f"t{i}": torch.randn(4) for i in range(64)}
        fn, compiled, cnt = self.compile_once(values_add, d)
        gm = guard_manager_of(fn)
        self.assertEqual(native_guards(gm), ["___tensor_container_0"])
        self.assertNotIn("EQUALS_MATCH", str(gm))  # key guards are in the native guard

        renamed = {("zz" if k == "t3" else k): v for k, v in d.items()}
        self.assert_recompile_reason(
            compiled, (renamed,), "d: key at position 3 changed 't3' -> 'zz'"
        )
        reordered = dict(reversed(list(d.items())))
        self.assert_recompile_reason(compiled, (reordered,), "d: key at position 0")
        self.assertEqual(compiled(dict(d)), values_add(d))
        self.assertEqual(cnt.frame_count, 1)

    def test_dict_by_key_and_tuple(self):
        d = {f"t{i}": torch.randn(4) for i in range(64)}
        keys = list(d)
        fn, compiled, cnt = self.compile_once(lookup_add, d, keys)
        self.assertEqual(native_guards(guard_manager_of(fn)), ["___tensor_container_0"])
        shuffled = dict(reversed(list(d.items())))  # order is not guarded here
        self.assertEqual(compiled(shuffled, keys), lookup_add(d, keys))
        self.assertEqual(cnt.frame_count, 1)
        changed = dict(d)
        changed["t5"] = torch.randn(4, dtype=torch.float64)
        self.assert_recompile_reason(
            compiled, (changed, keys), "d['t5']: dtype changed float32 -> float64"
        )

        xs = [torch.randn(4) for _ in range(64)]
        fn, compiled, cnt = self.compile_once(foreach_add_star, *xs)
        self.assertEqual(native_guards(guard_manager_of(fn)), ["___tensor_container_0"])
        ys = list(xs)
        ys[9] = ys[9].t().clone().requires_grad_()
        self.assert_recompile_reason(compiled, ys, "xs[9]: requires_grad changed")

    def test_aliasing_across_containers_and_single_tensors(self):
        xs = [torch.randn(4) for _ in range(64)]
        ys = [torch.randn(4) for _ in range(64)]
        x = torch.randn(4)
        fn, compiled, cnt = self.compile_once(two_lists_and_one, xs, ys, x)
        gm = guard_manager_of(fn)
        self.assertEqual(len(native_guards(gm)), 2)
        self.assertEqual(gm.closure_vars["___tensor_aliasing_group"].num_tensors(), 129)

        # Ping-pong buffers: the same tensors in swapped roles are still distinct.
        for _ in range(3):
            compiled(ys, xs, x)
            compiled(xs, ys, x)
        self.assertEqual(cnt.frame_count, 1)

        zs = list(ys)
        zs[5] = xs[3]
        self.assert_recompile_reason(
            compiled, (xs, zs, x), "xs[3] and ys[5] are the same tensor"
        )
        self.assert_recompile_reason(
            compiled, (xs, ys, xs[0]), "xs[0] and x are the same tensor"
        )
        self.assertEqual(cnt.frame_count, 1)

    def test_dynamic_dims(self):
        xs = [torch.randn(4, 3) for _ in range(64)]
        fn, compiled, cnt = self.compile_once(foreach_add, xs)
        compiled([torch.randn(5, 3) for _ in range(64)])  # automatic dynamic: dim 0
        self.assertEqual(cnt.frame_count, 2)
        compiled([torch.randn(7, 3) for _ in range(64)])
        self.assertEqual(cnt.frame_count, 2)
        self.assert_recompile_reason(
            compiled, ([torch.randn(7, 2) for _ in range(64)],), "size[1] changed 3 -> 2"
        )

    def test_skip_guard_eval_unsafe(self):
        # The diff guard root (skip_guard_eval_unsafe) keeps the container guard
        # and the aliasing epilogue, without the relational NO_TENSOR_ALIASING
        # guard whose per-node resets made a diff-root check O(N^2).
        xs = [torch.randn(4) for _ in range(64)]
        fn, compiled, cnt = self.compile_once(foreach_add, xs)
        gm = guard_manager_of(fn)
        diff_root = torch._dynamo.guards.GuardManagerWrapper(gm.diff_guard_root)
        self.assertIn("___tensor_container_0(L['xs'])", str(diff_root))
        self.assertIn("___tensor_aliasing_group()", str(diff_root))
        self.assertNotIn("NO_TENSOR_ALIASING", str(diff_root))
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            self.assertEqual(compiled([x.clone() for x in xs]), foreach_add(xs))
            for changed in (3, 5):
                ys = list(xs)
                ys[changed] = ys[3] if changed == 5 else ys[3].double()
                with self.assertRaisesRegex(RuntimeError, "Recompilation triggered"):
                    compiled(ys)
        self.assertEqual(cnt.frame_count, 1)

    def test_tensors_are_not_kept_alive(self):
        xs = [torch.randn(4) for _ in range(64)]
        refs = [weakref.ref(x) for x in xs]
        fn, compiled, _ = self.compile_once(foreach_add, xs)
        self.assertEqual(native_guards(guard_manager_of(fn)), ["___tensor_container_0"])
        del xs
        gc.collect()
        self.assertEqual(sum(r() is not None for r in refs), 0)

class StockFallbackTests(ContainerTestCase):
    def test_switch_off_uses_stock_guards(self):
        xs = [torch.randn(4) for _ in range(64)]
        with config.patch(tensor_container_guards=False):
            fn, compiled, cnt = self.compile_once(foreach_add, xs)
            gm = guard_manager_of(fn)
            self.assertEqual(native_guards(gm), [])
            self.assertEqual(str(gm).count("TENSOR_MATCH"), 64)
            ys = list(xs)
            ys[7] = ys[7].double()
            compiled(ys)
            self.assertEqual(cnt.frame_count, 2)

    def test_missing_extension_falls_back_with_one_warning(self):
        xs = [torch.randn(4) for _ in range(64)]
        with contextlib.ExitStack() as stack:
            # Only this entry: patch.dict(sys.modules) would drop every module
            # imported while compiling when it restores the dict.
            name = "torch._dynamo._guard_accel"
            saved = sys.modules.get(name)
            sys.modules[name] = None  # import raises ImportError
            stack.callback(
                lambda: sys.modules.__setitem__(name, saved)
                if saved is not None
                else sys.modules.pop(name, None)
            )
            stack.enter_context(mock.patch.object(guard_accel, "_extension", None))
            stack.enter_context(mock.patch.object(guard_accel, "_extension_checked", False))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn, compiled, cnt = self.compile_once(foreach_add, xs)
                fn2, compiled2, _ = self.compile_once(values_add, {str(i): x for i, x in enumerate(xs)})
            messages = [str(w.message) for w in caught if "_guard_accel" in str(w.message)]
            self.assertEqual(len(messages), 1, messages)
            self.assertIn("stock guards", messages[0])
            gm = guard_manager_of(fn)
            self.assertEqual(native_guards(gm), [])
            self.assertEqual(str(gm).count("TENSOR_MATCH"), 64)
            ys = list(xs)
            ys[7] = ys[7].double()
            self.assertEqual(compiled(ys), foreach_add(ys))
            self.assertEqual(cnt.frame_count, 2)


# ---------------------------------------------------------------------------
# Randomized comparison with the stock guards.


def rand(shape, dtype):
    return torch.randn(shape).to(dtype)


class Mutator:
    """Random changes to a frame's inputs, for comparing two guard managers."""

    def __init__(self, rng, base):
        self.rng = rng
        self.base = base  # storage for views

    def new_like(self, t):
        out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype)
        out.copy_(t.detach())
        if isinstance(t, torch.nn.Parameter):
            out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
        elif t.requires_grad:
            out.requires_grad_()
        return out

    def tensor(self, t, others):
        """A replacement for tensor t; others: tensors it may alias."""
        r = self.rng
        # Changes a guard must accept (new tensor with the same metadata, a view
        # at another offset, an unrelated attribute) are drawn as often as the
        # ones it must reject.
        kind = r.choice(
            ["same", "clone", "clone", "clone", "offset", "offset", "attr", "attr"]
            + ["dtype", "size", "size_dyn", "stride", "rank", "requires_grad"]
            + ["parameter", "plain", "alias", "mark", "mark_static", "neg"]
            + ["inference", "scalar"]
        )
        if kind == "same":
            return t
        if kind == "clone":
            return self.new_like(t)
        if kind == "dtype":
            return t.detach().to(r.choice([torch.float64, torch.float16, torch.int64]))
        if kind in ("size", "size_dyn"):
            if t.dim() == 0:
                return torch.randn(1)
            shape = list(t.shape)
            d = 0 if kind == "size_dyn" else r.randrange(t.dim())
            shape[d] += r.choice([1, 2, 5])
            return rand(shape, t.dtype)
        if kind == "stride":
            if t.dim() == 2:
                return rand((t.shape[1], t.shape[0]), t.dtype).t()
            if t.dim() == 1:
                return rand((t.shape[0] * 2,), t.dtype)[::2]
            return self.new_like(t)
        if kind == "rank":
            return rand((*t.shape, 1), t.dtype)
        if kind == "requires_grad":
            out = t.detach().clone()
            if not t.requires_grad and t.is_floating_point():
                out.requires_grad_()
            return out
        if kind == "parameter":
            return torch.nn.Parameter(t.detach().clone(), requires_grad=t.requires_grad)
        if kind == "plain":
            return t.detach().clone()
        if kind == "alias":
            return r.choice(others)
        if kind == "offset":
            n = t.numel()
            if t.dim() == 1 and t.is_contiguous() and t.dtype == torch.float32:
                start = r.randrange(len(self.base) - n)
                return self.base[start : start + n]
            return self.new_like(t)
        if kind in ("mark", "mark_static"):
            out = self.new_like(t)
            if t.dim() > 0:
                if kind == "mark":
                    torch._dynamo.mark_dynamic(out, r.randrange(t.dim()))
                else:
                    torch._dynamo.mark_static(out, 0)
            return out
        if kind == "attr":
            out = self.new_like(t)
            out.unrelated_attribute = 1
            return out
        if kind == "neg":
            return t._neg_view() if not t.requires_grad else t
        if kind == "inference":
            with torch.inference_mode():
                return rand(t.shape, t.dtype)
        return 1.5  # not a tensor

    def container(self, c, others):
        r = self.rng
        c = dict(c) if isinstance(c, dict) else list(c)
        for _ in range(r.choice([1, 1, 1, 2, 3])):
            keys = list(c) if isinstance(c, dict) else list(range(len(c)))
            action = r.random()
            if action < 0.8:
                k = r.choice(keys)
                c[k] = self.tensor(c[k], others)
            elif action < 0.9:
                i, j = r.choice(keys), r.choice(keys)
                c[i], c[j] = c[j], c[i]
            elif isinstance(c, dict):
                if r.random() < 0.5:
                    k = r.choice(keys)
                    c[f"{k}_renamed"] = c.pop(k)
                else:
                    c = dict(reversed(list(c.items())))
            else:
                if r.random() < 0.5 and len(c) > 1:
                    c.pop()
                else:
                    c.append(torch.randn(3))
        return c


def mixed_tensors(rng, n, base):
    out = []
    for i in range(n):
        kind = i % 7
        if kind == 0:
            out.append(torch.randn(3))
        elif kind == 1:
            out.append(torch.nn.Parameter(torch.randn(2, 3)))
        elif kind == 2:
            start = rng.randrange(len(base) - 3)
            out.append(base[start : start + 3])  # view of a shared base
        elif kind == 3:
            out.append(torch.randn(3, 2).t())  # non-contiguous
        elif kind == 4:
            out.append(torch.tensor(2.0))  # 0-dim
        elif kind == 5:
            out.append(torch.randn(3, requires_grad=True))
        else:
            out.append(torch.randint(0, 5, (4,)))
    return out


def list_dict_and_tensor(xs, d, x):
    return [t * 2 for t in xs], [t * 3 for t in d.values()], x + 1


@requires_extension
class RandomizedAgreementTests(torch._dynamo.test_case.TestCase):
    """The accelerated guards accept exactly the inputs the stock guards accept."""

    CASES = 120  # per configuration

    def guard_managers(self, args, setup=None, **compile_kwargs):
        out = {}
        for accel in (False, True):
            fn = fresh_copy(list_dict_and_tensor)
            if setup is not None:
                setup()
            with config.patch(tensor_container_guards=accel):
                torch.compile(fn, backend="eager", **compile_kwargs)(*args)
            out[accel] = guard_manager_of(fn)
        self.assertEqual(len(native_guards(out[True])), 2)
        self.assertEqual(native_guards(out[False]), [])
        return out

    def run_cases(self, seed, xs, d, x, managers):
        rng = random.Random(seed)
        base = torch.randn(64)
        mutator = Mutator(rng, base)
        outcomes = {True: 0, False: 0}
        for case in range(self.CASES):
            others = [*xs, *d.values(), x]
            f_locals = {"xs": xs, "d": d, "x": x}
            which = rng.random()
            if which < 0.45:
                f_locals["xs"] = mutator.container(xs, others)
            elif which < 0.8:
                f_locals["d"] = mutator.container(d, others)
            elif which < 0.9:
                f_locals["x"] = mutator.tensor(x, others)
            else:
                f_locals["xs"] = mutator.container(xs, others)
                f_locals["d"] = mutator.container(d, others)
            mode = rng.choice(["none"] * 6 + ["inference", "no_grad", "dispatch_mode"])
            ctx = {
                "none": contextlib.nullcontext,
                "inference": torch.inference_mode,
                "no_grad": torch.no_grad,
                "dispatch_mode": PassThroughMode,
            }[mode]()
            with ctx:
                stock = managers[False].check(f_locals)
                accel = managers[True].check(f_locals)
            self.assertEqual(
                accel, stock, f"seed {seed} case {case} ({mode}): accel={accel} stock={stock}"
            )
            outcomes[stock] += 1
        # Both outcomes are well represented: the comparison is not vacuous.
        self.assertGreater(outcomes[True], self.CASES // 10)
        self.assertGreater(outcomes[False], self.CASES // 4)

    def make_inputs(self, seed, n=40):
        rng = random.Random(seed)
        base = torch.randn(256)
        xs = mixed_tensors(rng, n, base)
        d = {f"k{i}": t for i, t in enumerate(mixed_tensors(rng, n, base))}
        return xs, d, torch.randn(3)

    def test_static_shapes(self):
        for seed in range(3):
            xs, d, x = self.make_inputs(seed)
            managers = self.guard_managers((xs, d, x))
            self.run_cases(seed, xs, d, x, managers)

    def test_marked_dynamic_dims(self):
        xs, d, x = self.make_inputs(10)
        marked = [t for t in [*xs, *d.values()] if t.dim() > 0][::3]

        def mark():
            for t in marked:
                torch._dynamo.mark_dynamic(t, 0)

        managers = self.guard_managers((xs, d, x), setup=mark)
        self.run_cases(10, xs, d, x, managers)

    def test_dynamic_true(self):
        xs, d, x = self.make_inputs(20)
        managers = self.guard_managers((xs, d, x), dynamic=True)
        self.run_cases(20, xs, d, x, managers)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
