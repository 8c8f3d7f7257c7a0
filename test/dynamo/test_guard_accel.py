# Owner(s): ["module: dynamo"]
"""One native guard for large containers of tensors (torch._dynamo.guard_accel)."""

import contextlib
import gc
import json
import random
import re
import subprocess
import sys
import textwrap
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
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
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


# Without the extension the guards are Dynamo's per-tensor ones; only the fallback tests run.
requires_extension = unittest.skipIf(
    guard_accel.extension() is None, "torch._dynamo._guard_accel is not built"
)


# Runs each case's statement in a fresh interpreter and prints, as JSON, the name of
# the exception each raised ("no exception" otherwise). A C++ exception crossing
# the C-API boundary or a memory error aborts the interpreter: the test sees a
# nonzero exit status instead of a missing entry.
_BAD_ARGUMENT_RUNNER = """
import json, sys
import torch
from torch._dynamo import _guard_accel as ext
t = torch.randn(2)
def rec(locator=0, key=None, tensor=t, sizes=(2,), strides=(1,), marks=None, aliasing=False, name="xs[0]", *grad):
    return (locator, key, tensor, sizes, strides, marks, aliasing, name, *grad)
def make(kind="list", elements=None, name="xs", dict_type=list, keys=None, group=None, parts="default"):
    elements = [rec()] if elements is None else elements
    parts = ["xs_guard(L['xs'])"] if parts == "default" else parts
    return ext.make_tensor_container_guard(kind, name, dict_type, keys, elements, group, parts)
def ident(bases, pairs, parts="default"):
    return ext.make_object_identity_guard(bases, pairs, [] if parts == "default" else parts)
results = {}
for label, stmt in json.load(sys.stdin):
    print("running", label, file=sys.stderr, flush=True)
    try:
        exec(stmt)
        results[label] = "no exception"
    except Exception as e:
        results[label] = type(e).__name__
print(json.dumps(results))
"""


def run_bad_argument_cases(test, cases):
    """{label: (statement, expected exception name)}: run them all in one subprocess."""
    proc = subprocess.run(
        [sys.executable, "-c", _BAD_ARGUMENT_RUNNER],
        input=json.dumps([(label, stmt) for label, (stmt, _) in cases.items()]),
        capture_output=True,
        text=True,
        timeout=600,
    )
    test.assertEqual(
        proc.returncode,
        0,
        f"the interpreter died (exit {proc.returncode}); last lines:\n{proc.stderr[-3000:]}",
    )
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    test.assertEqual(results, {label: exc for label, (_, exc) in cases.items()})


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

    def recompile_reason(self, compiled, args):
        """The guard failure(s) a call recompiles for, as Dynamo logs them (each
        reason and its explanation line), raised by error_on_recompile."""
        with config.patch(error_on_recompile=True):
            with self.assertRaises(RecompileError) as raised:
                compiled(*args)
        return textwrap.dedent(str(raised.exception).split("guard failure(s):\n", 1)[1])

    def assert_recompile_reason(self, compiled, args, reason):
        """For cases parametrized by the tensor's name: the first failure logged is
        exactly `reason` (compile id left out)."""
        logged = self.recompile_reason(compiled, args).splitlines()[0]
        self.assertEqual(re.sub(r"^- \d+/\d+: ", "", logged), reason)


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
        # type, dispatch keys, dtype, requires_grad, rank, size, stride, dim marking, aliasing
        changed = [
            torch.nn.Parameter(t.clone()),
            t._neg_view(),
            t.double(),
            t.clone().requires_grad_(),
            t.reshape(2, 2),
            torch.randn(5),
            strided,
            marked,
            xs[3],
        ]
        reasons = []
        for value in changed:
            ys = list(xs)
            ys[417] = value
            reasons.append(self.recompile_reason(compiled, (ys,)))
        self.assertExpectedInline("\n".join(reasons), """\
- 0/0: xs[417]: type changed Tensor -> Parameter
-   => object xs, tensor xs[417]: type changed Tensor -> Parameter
- 0/0: xs[417]: dispatch key set changed DispatchKeySet(CPU, BackendSelect, ADInplaceOrView, AutogradCPU) -> DispatchKeySet(CPU, BackendSelect, Negative, ADInplaceOrView, AutogradCPU)
-   => object xs, tensor xs[417]: dispatch key set changed DispatchKeySet(CPU, BackendSelect, ADInplaceOrView, AutogradCPU) -> DispatchKeySet(CPU, BackendSelect, Negative, ADInplaceOrView, AutogradCPU)
- 0/0: xs[417]: dtype changed float32 -> float64
-   => object xs, tensor xs[417]: dtype changed float32 -> float64
- 0/0: xs[417]: requires_grad changed False -> True
-   => object xs, tensor xs[417]: requires_grad changed False -> True
- 0/0: xs[417]: rank changed 1 -> 2
-   => object xs, tensor xs[417]: rank changed 1 -> 2
- 0/0: xs[417]: size[0] changed 4 -> 5
-   => object xs, tensor xs[417]: size[0] changed 4 -> 5
- 0/0: xs[417]: stride[0] changed 1 -> 2
-   => object xs, tensor xs[417]: stride[0] changed 1 -> 2
- 0/0: xs[417]: _dynamo_dynamic_indices was set after compilation
-   => object xs, tensor xs[417]: _dynamo_dynamic_indices was set after compilation
- 0/0: xs[3] and xs[417] are the same tensor, but the graph was compiled for distinct tensors
-   => object xs: xs[3] and xs[417] are the same tensor now""", skip=1)  # noqa: E501
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
        self.assertExpectedInline(self.recompile_reason(compiled, (2.0,)), """\
- 0/0: self._modules['ps']._parameters['17']: size[0] changed 4 -> 5 (a parameter; torch._dynamo.config.force_parameter_static_shapes = False allows dynamic shapes on parameters)
-   => object self.ps, tensor self._modules['ps']._parameters['17']: size[0] changed 4 -> 5 (a parameter; torch._dynamo.config.force_parameter_static_shapes = False allows dynamic shapes on parameters)""", skip=1)  # noqa: E501

    def test_dict_key_order_guarded(self):
        d = {f"t{i}": torch.randn(4) for i in range(64)}
        fn, compiled, cnt = self.compile_once(values_add, d)
        gm = guard_manager_of(fn)
        self.assertEqual(native_guards(gm), ["___tensor_container_0"])
        self.assertNotIn("EQUALS_MATCH", str(gm))  # key guards are in the native guard

        renamed = {("zz" if k == "t3" else k): v for k, v in d.items()}
        self.assertExpectedInline(self.recompile_reason(compiled, (renamed,)), """\
- 0/0: d: key at position 3 changed 't3' -> 'zz'
-   => object d: d key at position 3 changed 't3' -> 'zz'""", skip=1)
        reordered = dict(reversed(list(d.items())))
        self.assertExpectedInline(self.recompile_reason(compiled, (reordered,)), """\
- 0/0: d: key at position 0 changed 't0' -> 't63'
-   => object d: d key at position 0 changed 't0' -> 't63'""", skip=1)
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
        self.assertExpectedInline(self.recompile_reason(compiled, (changed, keys)), """\
- 0/0: d['t5']: dtype changed float32 -> float64
-   => object d, tensor d['t5']: dtype changed float32 -> float64""", skip=1)

        xs = [torch.randn(4) for _ in range(64)]
        fn, compiled, cnt = self.compile_once(foreach_add_star, *xs)
        self.assertEqual(native_guards(guard_manager_of(fn)), ["___tensor_container_0"])
        ys = list(xs)
        ys[9] = ys[9].t().clone().requires_grad_()
        self.assertExpectedInline(self.recompile_reason(compiled, ys), """\
- 1/0: xs[9]: requires_grad changed False -> True
-   => object xs, tensor xs[9]: requires_grad changed False -> True""", skip=1)

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
        self.assertExpectedInline(self.recompile_reason(compiled, (xs, zs, x)), """\
- 0/0: xs[3] and ys[5] are the same tensor, but the graph was compiled for distinct tensors
-   => object xs: xs[3] and ys[5] are the same tensor now""", skip=1)
        self.assertExpectedInline(self.recompile_reason(compiled, (xs, ys, xs[0])), """\
- 0/0: xs[0] and x are the same tensor, but the graph was compiled for distinct tensors
-   => object xs: xs[0] and x are the same tensor now""", skip=1)
        self.assertEqual(cnt.frame_count, 1)

    def test_dynamic_dims(self):
        xs = [torch.randn(4, 3) for _ in range(64)]
        fn, compiled, cnt = self.compile_once(foreach_add, xs)
        compiled([torch.randn(5, 3) for _ in range(64)])  # automatic dynamic: dim 0
        self.assertEqual(cnt.frame_count, 2)
        compiled([torch.randn(7, 3) for _ in range(64)])
        self.assertEqual(cnt.frame_count, 2)
        self.assertExpectedInline(self.recompile_reason(compiled, ([torch.randn(7, 2) for _ in range(64)],)), """\
- 0/1: xs[0]: size[1] changed 3 -> 2
-   => object xs, tensor xs[0]: size[1] changed 3 -> 2
- 0/0: xs[0]: size[0] changed 4 -> 7
-   => object xs, tensor xs[0]: size[0] changed 4 -> 7""", skip=1)

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


# ---------------------------------------------------------------------------
# Containers held by an nn.Module, with and without
# config.use_recursive_dict_tags_for_guards: the nodes native guards go on must
# not be skipped while the module's dict tags are unchanged, since tensor
# metadata changes in place without touching any dict.


@requires_extension
class BadArgumentTests(torch._dynamo.test_case.TestCase):
    """Every entry point of the extension raises a Python exception on bad input."""

    def test_construction_and_calls_raise_python_errors(self):
        big = 2**70
        cases = {
            # TensorAliasingGroup / TensorAliasingSlot
            "add_tensor surrogate": ('ext.TensorAliasingGroup([]).add_tensor("\\ud800", [])', "UnicodeEncodeError"),
            "add_tensor int": ("ext.TensorAliasingGroup([]).add_tensor(1, [])", "TypeError"),
            "add_tensor None": ("ext.TensorAliasingGroup([]).add_tensor(None, [])", "TypeError"),
            "add_tensor no args": ("ext.TensorAliasingGroup([]).add_tensor()", "TypeError"),
            "add_tensor parts not a list": ('ext.TensorAliasingGroup([]).add_tensor("a", ("x",))', "TypeError"),
            "add_tensor three args": ('ext.TensorAliasingGroup([]).add_tensor("a", [], [])', "TypeError"),
            "group without parts": ("ext.TensorAliasingGroup()", "TypeError"),
            "group parts not a list": ("ext.TensorAliasingGroup(1)", "TypeError"),
            "group two args": ("ext.TensorAliasingGroup([], [])", "TypeError"),
            "group with kwargs": ("ext.TensorAliasingGroup(x=1)", "TypeError"),
            "slot constructed": ("ext.TensorAliasingSlot()", "TypeError"),
            "slot no args": ('ext.TensorAliasingGroup([]).add_tensor("a", [])()', "TypeError"),
            "slot two args": ('ext.TensorAliasingGroup([]).add_tensor("a", [])(t, t)', "TypeError"),
            "slot kwargs": ('ext.TensorAliasingGroup([]).add_tensor("a", [])(x=t)', "TypeError"),
            "group explain any args": ("assert ext.TensorAliasingGroup([]).explain(1, None) is True", "no exception"),
            # TensorContainerGuard calls
            "guard constructed": ("ext.TensorContainerGuard()", "TypeError"),
            "guard no args": ("make()()", "TypeError"),
            "guard two args": ("make()([t], [t])", "TypeError"),
            "guard kwargs": ("make()(container=[t])", "TypeError"),
            "guard explain no args": ("make().explain()", "TypeError"),
            "guard on None, int, dict, non-tensors, short list": (
                "g = make(); assert [g(None), g(1), g({}), g([None]), g(['x']), g([])] == [False] * 6",
                "no exception",
            ),
            "explain on None and non-tensors": (
                "g = make(); assert isinstance(g.explain(None), str) and isinstance(g.explain([1]), str)",
                "no exception",
            ),
            "explain of a huge locator": (
                "g = make(elements=[rec(locator=10**12)]); assert not g([t]) and 'missing' in g.explain([t])",
                "no exception",
            ),
            # make_tensor_container_guard arguments
            "kind surrogate": ('make(kind="\\ud800")', "UnicodeEncodeError"),
            "kind int": ("make(kind=1)", "TypeError"),
            "kind unknown": ('make(kind="set")', "ValueError"),
            "name surrogate": ('make(name="x\\udcff")', "UnicodeEncodeError"),
            "name None": ("make(name=None)", "TypeError"),
            "elements None": ("ext.make_tensor_container_guard('list', 'xs', None, None, None, None, [])", "TypeError"),
            "elements tuple": (
                "ext.make_tensor_container_guard('list', 'xs', None, None, (rec(),), None, [])",
                "TypeError",
            ),
            "too few arguments": ("ext.make_tensor_container_guard('list', 'xs')", "TypeError"),
            "verbose_code_parts None": ("make(parts=None)", "TypeError"),
            "verbose_code_parts a tuple": ("make(parts=('a',))", "TypeError"),
            "element a list": ("make(elements=[list(rec())])", "TypeError"),
            "element None": ("make(elements=[None])", "TypeError"),
            "element too short": ("make(elements=[rec()[:3]])", "ValueError"),
            "element name surrogate": ('make(elements=[rec(name="\\ud800")])', "UnicodeEncodeError"),
            "element name None": ("make(elements=[rec(name=None)])", "TypeError"),
            "locator negative": ("make(elements=[rec(locator=-1)])", "ValueError"),
            "locator huge": (f"make(elements=[rec(locator={big})])", "OverflowError"),
            "locator str": ('make(elements=[rec(locator="0")])', "TypeError"),
            "locators unsorted": ("make(elements=[rec(locator=1), rec(locator=0)])", "ValueError"),
            "tensor None": ("make(elements=[rec(tensor=None)])", "TypeError"),
            "tensor sparse": (
                "make(elements=[rec(tensor=torch.eye(2).to_sparse(), sizes=(2, 2), strides=(1, 1))])",
                "ValueError",
            ),
            "sizes None": ("make(elements=[rec(sizes=None)])", "TypeError"),
            "sizes of the wrong rank": ("make(elements=[rec(sizes=(2, 1))])", "ValueError"),
            "size huge": (f"make(elements=[rec(sizes=({big},))])", "ValueError"),
            "size int64 min": (f"make(elements=[rec(sizes=({-(2**63)},))])", "ValueError"),
            "size str": ('make(elements=[rec(sizes=("2",))])', "TypeError"),
            "strides None": ("make(elements=[rec(strides=None)])", "TypeError"),
            "marks too short": ("make(elements=[rec(marks=(None,))])", "ValueError"),
            "marks not sets": ("make(elements=[rec(marks=([0], None, None, None, None))])", "ValueError"),
            "marks a list": ("make(elements=[rec(marks=[None] * 5)])", "TypeError"),
            "aliasing not a bool": ('make(elements=[rec(aliasing="yes")])', "TypeError"),
            "aliasing without a group": ("make(elements=[rec(aliasing=True)])", "TypeError"),
            "aliasing with a wrong group": ("make(elements=[rec(aliasing=True)], group=object())", "TypeError"),
            "grad spec unknown": (
                'make(elements=[rec(0, None, t, (2,), (1,), None, False, "x", "maybe")])',
                "ValueError",
            ),
            "grad spec surrogate": (
                'make(elements=[rec(0, None, t, (2,), (1,), None, False, "x", "\\ud800")])',
                "UnicodeEncodeError",
            ),
            "grad record too short": (
                "make(elements=[rec(0, None, t, (2,), (1,), None, False, 'x', (0,))])",
                "ValueError",
            ),
            "grad record bad name": (
                "make(elements=[rec(0, None, t, (2,), (1,), None, False, 'x', rec(name=b'x'))])",
                "TypeError",
            ),
            # dicts
            "dict_ordered with a list type": ('make("dict_ordered", dict_type=list, keys=["a"])', "TypeError"),
            "dict_ordered with None type": ('make("dict_ordered", dict_type=None, keys=["a"])', "TypeError"),
            "dict_ordered without keys": ('make("dict_ordered", dict_type=dict, keys=None)', "TypeError"),
            "dict_ordered float key": ('make("dict_ordered", dict_type=dict, keys=[1.5])', "TypeError"),
            "dict_ordered locator past the keys": (
                'g = make("dict_ordered", elements=[rec(locator=1)], dict_type=dict, keys=["a"]); g({"a": t})',
                "ValueError",
            ),
            "dict_lookup key None": ('make("dict_lookup", elements=[rec(key=None)])', "TypeError"),
            "dict_lookup key tuple": ('make("dict_lookup", elements=[rec(key=("a",))])', "TypeError"),
            "dict_lookup on non-dicts": (
                'g = make("dict_lookup", elements=[rec(key="a")]); assert [g(None), g([t]), g({})] == [False] * 3',
                "no exception",
            ),
        }
        run_bad_argument_cases(self, cases)


class TensorHolder(torch.nn.Module):
    """16 tensors of shape (4, 4), kept where modules keep tensors."""

    WHERE = ("buffers", "parameters", "parameter_list", "dict", "dict_values", "list")
    M = 16

    def __init__(self, where):
        super().__init__()
        self.where = where
        tensors = [torch.randn(4, 4) for _ in range(self.M)]
        if where == "buffers":
            for i, t in enumerate(tensors):
                self.register_buffer(f"t{i}", t)
        elif where == "parameters":
            for i, t in enumerate(tensors):
                self.register_parameter(f"t{i}", torch.nn.Parameter(t))
        elif where == "parameter_list":
            self.ps = torch.nn.ParameterList(tensors)
        elif where in ("dict", "dict_values"):
            self.d = {f"t{i}": t for i, t in enumerate(tensors)}
        else:
            self.xs = tensors

    def slot(self, i):
        """(container, key) of tensor i, and its name in recompile reasons."""
        if self.where == "buffers":
            return self._buffers, f"t{i}", f"self._buffers['t{i}']"
        if self.where == "parameters":
            return self._parameters, f"t{i}", f"self._parameters['t{i}']"
        if self.where == "parameter_list":
            return (
                self.ps._parameters,
                str(i),
                f"self._modules['ps']._parameters['{i}']",
            )
        if self.where in ("dict", "dict_values"):
            return self.d, f"t{i}", f"self.d['t{i}']"
        return self.xs, i, f"self.xs[{i}]"

    def members(self):
        if self.where in ("buffers", "parameters"):
            return [getattr(self, f"t{i}") for i in range(self.M)]
        if self.where == "parameter_list":
            return list(self.ps)
        if self.where == "dict":
            return [self.d[f"t{i}"] for i in range(self.M)]
        if self.where == "dict_values":
            return list(self.d.values())
        return list(self.xs)

    def forward(self, x):
        for t in self.members():
            x = x + t.sum()
        return x


def set_data(value_fn):
    def change(t):
        t.data = value_fn(t.data)

    return change


def transpose_(t):
    with torch.no_grad():  # parameters are leaves that require grad
        t.t_()


def mark_dynamic_0(t):
    torch._dynamo.mark_dynamic(t, 0)


# field -> (in-place change of one tensor, the recompile reason after "name: "; {rg}
# the requires_grad change, {param} the hint for parameters). None of them writes to a
# dict (or list): dict tags stay as they were.
IN_PLACE_CHANGES = {
    "requires_grad": (lambda t: t.requires_grad_(not t.requires_grad), "requires_grad changed {rg}"),
    "dtype": (set_data(lambda d: d.double()), "dtype changed float32 -> float64"),
    "size": (set_data(lambda d: torch.randn(5, 4)), "size[0] changed 4 -> 5{param}"),
    "stride": (transpose_, "stride[0] changed 4 -> 1{param}"),
    "rank": (set_data(lambda d: d.unsqueeze(0)), "rank changed 2 -> 3"),
    "dispatch keys": (
        set_data(lambda d: d._neg_view()),
        "dispatch key set changed DispatchKeySet(CPU, BackendSelect, ADInplaceOrView, AutogradCPU) -> "
        "DispatchKeySet(CPU, BackendSelect, Negative, ADInplaceOrView, AutogradCPU)",
    ),
    "dim marking": (mark_dynamic_0, "_dynamo_dynamic_indices was set after compilation"),
}
PARAMETER_HINT = (
    " (a parameter; torch._dynamo.config.force_parameter_static_shapes = False allows dynamic shapes on parameters)"
)


@requires_extension
class ModuleContainerTests(ContainerTestCase):
    def compile_holder(self, where):
        m = TensorHolder(where)
        cnt = CompileCounter()
        compiled = torch.compile(m, backend=cnt)
        x = torch.randn(4)
        compiled(x)
        compiled(x)  # the first guard check records the dict tags
        self.assertEqual(cnt.frame_count, 1)
        gm = guard_manager_of(TensorHolder.forward)
        self.assertEqual(native_guards(gm), ["___tensor_container_0"])
        return m, compiled, cnt, x

    @parametrize("recursive_dict_tags", [False, True])
    @parametrize("where", TensorHolder.WHERE)
    def test_each_field_change_fails_and_is_named(self, where, recursive_dict_tags):
        with config.patch(use_recursive_dict_tags_for_guards=recursive_dict_tags):
            m, compiled, cnt, x = self.compile_holder(where)
            container, key, name = m.slot(5)
            t = container[key]
            is_param = isinstance(t, torch.nn.Parameter)
            fill = {
                "rg": "True -> False" if t.requires_grad else "False -> True",
                "param": PARAMETER_HINT if is_param else "",
            }
            for field, (change, reason) in IN_PLACE_CHANGES.items():
                with self.subTest(field=field):
                    data, requires_grad = t.data, t.requires_grad
                    change(t)
                    try:
                        self.assert_recompile_reason(compiled, (x,), f"{name}: {reason.format(**fill)}")
                    finally:
                        t.data = data
                        t.requires_grad_(requires_grad)
                        if hasattr(t, "_dynamo_dynamic_indices"):
                            del t._dynamo_dynamic_indices
                    self.assertEqual(compiled(x), m(x))
            # Writes to the container change its tag; still checked by the guard.
            other = torch.randn(4, 4) if is_param else torch.nn.Parameter(t.clone())
            writes = {
                "type": (
                    other,
                    f"{name}: type changed Parameter -> Tensor"
                    if is_param
                    else f"{name}: type changed Tensor -> Parameter",
                ),
            }
            if not is_param:  # parameters are not under the no-aliasing guard
                _, _, other_name = m.slot(3)
                writes["aliasing"] = (
                    container[m.slot(3)[1]],
                    f"{other_name} and {name} are the same tensor, but the graph was compiled for distinct tensors",
                )
            for field, (value, reason) in writes.items():
                with self.subTest(field=field):
                    container[key] = value
                    try:
                        self.assert_recompile_reason(compiled, (x,), reason)
                    finally:
                        container[key] = t
            self.assertEqual(compiled(x), m(x))
            self.assertEqual(cnt.frame_count, 1)

    def test_native_guard_nodes_are_not_tag_safe(self):
        class Outer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.holder = TensorHolder("buffers")
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, x):
                return self.lin(self.holder(x))

        def find(node, source):
            if node.get_source() == source:
                return node
            for child in node.get_child_managers():
                found = find(child, source)
                if found is not None:
                    return found
            return None

        m = Outer()
        with config.patch(use_recursive_dict_tags_for_guards=True):
            torch.compile(m, backend="eager")(torch.randn(4))
        root = guard_manager_of(Outer.forward).root
        buffers = find(root, "L['self']._modules['holder']._buffers")
        self.assertIn(
            "___tensor_container_0.explain(",
            buffers.get_leaf_guards()[-1].verbose_code_parts()[0],
        )
        self.assertFalse(buffers.is_tag_safe())
        self.assertFalse(find(root, "L['self']._modules['holder']").is_tag_safe())
        self.assertFalse(find(root, "L['self']").is_tag_safe_root())
        # A module without native guards keeps the dict tag fast path.
        self.assertTrue(find(root, "L['self']._modules['lin']").is_tag_safe_root())

    @parametrize("recursive_dict_tags", [False, True])
    def test_aliasing_across_instances_of_one_module(self, recursive_dict_tags):
        # Instances of one module class share the compiled code and its guards
        # (the dict tag fast path records up to
        # config.max_saved_pointers_for_recursive_dict_tags_check of them). A
        # single tensor under a module is a member of the aliasing group.
        class Layer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("b", torch.randn(4))

            def forward(self, x, xs):
                x.mul_(2)
                return self.b + torch.stack(xs).sum(0)

        xs = [torch.randn(4) for _ in range(K)]
        with config.patch(use_recursive_dict_tags_for_guards=recursive_dict_tags):
            a, b = Layer(), Layer()
            cnt = CompileCounter()
            fa, fb = torch.compile(a, backend=cnt), torch.compile(b, backend=cnt)
            for f in (fa, fb, fa):
                f(torch.randn(4), xs)
            self.assertEqual(cnt.frame_count, 1)
            self.assertIn(
                "___tensor_aliasing_group", guard_manager_of(Layer.forward).closure_vars
            )
            self.assertExpectedInline(self.recompile_reason(fa, (a.b, xs)), """\
- 0/0: x and self._buffers['b'] are the same tensor, but the graph was compiled for distinct tensors
-   => object x: x and self._buffers['b'] are the same tensor now""", skip=1)
            expected_b = a.b * 2
            out = fa(a.b, xs)
            self.assertEqual(a.b, expected_b)
            self.assertEqual(out, expected_b + torch.stack(xs).sum(0))
            self.assertEqual(cnt.frame_count, 2)


class TwelveBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for i in range(12):
            self.register_buffer(f"b{i}", torch.randn(3, 3))

    def forward(self, x):
        for i in range(12):
            x = x + getattr(self, f"b{i}").sum(0)
        return x


def replace_data(b):
    b.data = torch.randn(5, 3)


USER_CHANGES = {
    "requires_grad_": lambda b: b.requires_grad_(True),
    "data": replace_data,
    "t_": lambda b: b.t_(),
}


@requires_extension
class ModuleBufferChangeTests(torch._dynamo.test_case.TestCase):
    """What a user sees: a buffer changed in place between two calls."""

    @parametrize("recursive_dict_tags", [False, True])
    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_in_place_change_recompiles(self, backend, recursive_dict_tags):
        for change_name, change in USER_CHANGES.items():
            with self.subTest(change=change_name), config.patch(
                use_recursive_dict_tags_for_guards=recursive_dict_tags
            ):
                torch._dynamo.reset()
                m = TwelveBuffers()
                cnt = CompileCounterWithBackend(backend)
                compiled = torch.compile(m, backend=cnt)
                x = torch.randn(3)
                for _ in range(2):
                    self.assertEqual(compiled(x), m(x))
                self.assertEqual(
                    native_guards(guard_manager_of(TwelveBuffers.forward)),
                    ["___tensor_container_0"],
                )
                change(m.b4)
                out, expected = compiled(x), m(x)
                self.assertEqual(out, expected)
                self.assertEqual(out.requires_grad, expected.requires_grad)
                self.assertEqual(cnt.frame_count, 2)


instantiate_parametrized_tests(ModuleContainerTests)
instantiate_parametrized_tests(ModuleBufferChangeTests)


# ---------------------------------------------------------------------------
# Tuples Dynamo reaches through DictGetItemGuardAccessor: a global, an item of a
# dict looked up by key, an nn.Module attribute (through its __dict__). While the
# dict is unchanged, that accessor skips the node of a tuple of tensors that has
# no accessors; with a native guard, the tuple's node has leaf guards only.

GLOBAL_TENSORS = ()
GLOBAL_DICT = {}


def add_global_tensors(x):
    return x + sum(GLOBAL_TENSORS)


def add_global_dict_item(x):
    return x + sum(GLOBAL_DICT["ts"])


def add_dict_item(x, d):
    return x + sum(d["ts"])


class TupleHolder(torch.nn.Module):
    def __init__(self, ts):
        super().__init__()
        self.ts = ts

    def forward(self, x):
        return x + sum(self.ts)


def call_module(x, m):
    return m(x)


def with_keyword_default(x, *, ts=()):
    return x + sum(ts)


def add_keyword_default(x):
    return with_keyword_default(x)


@requires_extension
class DictItemTupleTests(ContainerTestCase):
    def set_global(self, name, value):
        module = sys.modules[__name__]
        self.addCleanup(setattr, module, name, getattr(module, name))
        setattr(module, name, value)

    @parametrize("backend", ["eager", "aot_eager"])
    @parametrize("kind", ["tuple", "list"])
    @parametrize("size", [K - 1, K, K + 1])
    def test_global_container_iterated_by_the_frame(self, size, kind, backend):
        # x + sum(S) with a global tuple S of K or more tensors failed on the first
        # call: "Guard failed on the same frame it was created".
        def make(tensors):
            return tuple(tensors) if kind == "tuple" else list(tensors)

        self.set_global("GLOBAL_TENSORS", make(torch.randn(3) for _ in range(size)))
        fn = fresh_copy(add_global_tensors)
        cnt = CompileCounterWithBackend(backend)
        compiled = torch.compile(fn, backend=cnt)
        x = torch.randn(3)
        for _ in range(3):
            self.assertEqual(compiled(x), add_global_tensors(x))
        self.assertEqual(cnt.frame_count, 1)
        gm = guard_manager_of(fn)
        self.assertEqual(native_guards(gm), ["___tensor_container_0"] if size >= K else [])
        if size >= K and kind == "tuple":
            self.assertIn(
                "source=G['GLOBAL_TENSORS'] (tensor container), accessed_by=GetItemGuardAccessor",
                str(gm),
            )

        # Other tensors with the same metadata: the graph reads them.
        self.set_global("GLOBAL_TENSORS", make(t * 2 for t in GLOBAL_TENSORS))
        self.assertEqual(compiled(x), add_global_tensors(x))
        self.assertEqual(cnt.frame_count, 1)

        # Metadata changed in place, no write to any dict: recompiles once.
        GLOBAL_TENSORS[2].unsqueeze_(0)
        if size >= K:
            self.assertExpectedInline(self.recompile_reason(compiled, (x,)), """\
- 0/0: G['GLOBAL_TENSORS'][2]: rank changed 1 -> 2
-   => object <globals and imports>, tensor G['GLOBAL_TENSORS'][2]: rank changed 1 -> 2""", skip=1)
        for _ in range(2):
            out = compiled(x)
            self.assertEqual(out, add_global_tensors(x))
            self.assertEqual(out.shape, (1, 3))
        self.assertEqual(cnt.frame_count, 2)
        # An argument that is one of the global's tensors.
        if size >= K:
            self.assertExpectedInline(self.recompile_reason(compiled, (GLOBAL_TENSORS[4],)), """\
- 0/2: G['GLOBAL_TENSORS'][4] and x are the same tensor, but the graph was compiled for distinct tensors
-   => object <globals and imports>: G['GLOBAL_TENSORS'][4] and x are the same tensor now
- 0/0: G['GLOBAL_TENSORS'][2]: rank changed 1 -> 2
-   => object <globals and imports>, tensor G['GLOBAL_TENSORS'][2]: rank changed 1 -> 2""", skip=1)

        # The global rebound to tensors of another dtype: recompiles once.
        self.set_global("GLOBAL_TENSORS", make(t.double() for t in GLOBAL_TENSORS))
        for _ in range(2):
            out = compiled(x)
            self.assertEqual(out, add_global_tensors(x))
            self.assertEqual(out.dtype, torch.float64)
        self.assertEqual(cnt.frame_count, 3)

    @parametrize("recursive_dict_tags", [False, True])
    @parametrize(
        "where", ["global_dict", "dict_argument", "module_attribute", "keyword_default"]
    )
    def test_tuple_reached_through_a_dict(self, where, recursive_dict_tags):
        ts = tuple(torch.randn(3) for _ in range(K + 1))
        d = {"ts": ts}
        m = TupleHolder(ts)
        # where -> (function, its arguments after x, the dict holding the tuple, its
        # source, its name in recompile reasons)
        cases = {
            "global_dict": (
                add_global_dict_item, (), d, "G['GLOBAL_DICT']['ts']", "G['GLOBAL_DICT']['ts']"
            ),
            "dict_argument": (add_dict_item, (d,), d, "L['d']['ts']", "d['ts']"),
            "module_attribute": (call_module, (m,), m.__dict__, "L['m'].ts", "m.ts"),
            "keyword_default": (
                add_keyword_default, (), with_keyword_default.__kwdefaults__, None, None
            ),
        }
        fn, args, holder, source, name = cases[where]
        self.set_global("GLOBAL_DICT", d)
        self.addCleanup(with_keyword_default.__kwdefaults__.__setitem__, "ts", ())
        with_keyword_default.__kwdefaults__["ts"] = ts
        with config.patch(use_recursive_dict_tags_for_guards=recursive_dict_tags):
            compiled_fn = fresh_copy(fn)
            cnt = CompileCounter()
            compiled = torch.compile(compiled_fn, backend=cnt)
            x = torch.randn(3)
            for _ in range(3):
                self.assertEqual(compiled(x, *args), fn(x, *args))
            self.assertEqual(cnt.frame_count, 1)
            gm = guard_manager_of(compiled_fn)
            if source is None:
                # No second node for a keyword-only default: per-tensor guards.
                self.assertEqual(native_guards(gm), [])
                self.assertEqual(str(gm).count("TENSOR_MATCH"), K + 2)
            else:
                self.assertEqual(native_guards(gm), ["___tensor_container_0"])
                self.assertIn(f"source={source} (tensor container)", str(gm))

            ts[5].requires_grad_()
            if name is not None:
                self.assert_recompile_reason(
                    compiled, (x, *args), f"{name}[5]: requires_grad changed False -> True"
                )
            for _ in range(2):
                out = compiled(x, *args)
                self.assertEqual(out, fn(x, *args))
                self.assertTrue(out.requires_grad)
            self.assertEqual(cnt.frame_count, 2)

            holder["ts"] = tuple(t.detach().double() for t in ts)
            for _ in range(2):
                out = compiled(x, *args)
                self.assertEqual(out, fn(x, *args))
                self.assertEqual(out.dtype, torch.float64)
            self.assertEqual(cnt.frame_count, 3)


instantiate_parametrized_tests(DictItemTupleTests)


class FallbackTests(ContainerTestCase):
    def test_switch_off_uses_per_tensor_guards(self):
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
            self.assertIn("a TENSOR_MATCH per tensor", messages[0])
            gm = guard_manager_of(fn)
            self.assertEqual(native_guards(gm), [])
            self.assertEqual(str(gm).count("TENSOR_MATCH"), 64)
            ys = list(xs)
            ys[7] = ys[7].double()
            self.assertEqual(compiled(ys), foreach_add(ys))
            self.assertEqual(cnt.frame_count, 2)


# ---------------------------------------------------------------------------
# Randomized comparison with the guards built without this patch (the switch off).


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
    """The accelerated guards accept exactly the inputs the per-tensor guards accept."""

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
                per_tensor = managers[False].check(f_locals)
                accel = managers[True].check(f_locals)
            self.assertEqual(
                accel, per_tensor, f"seed {seed} case {case} ({mode}): accel={accel} per-tensor={per_tensor}"
            )
            outcomes[per_tensor] += 1
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


class ModuleHeld(torch.nn.Module):
    """Mixed tensors in buffers, parameters, a ParameterList, a dict and a list."""

    def __init__(self, rng, base, n=K):
        super().__init__()
        plain = [t.detach() for t in mixed_tensors(rng, n, base)]
        for i, t in enumerate(plain):
            self.register_buffer(f"b{i}", t)
        params = [
            torch.nn.Parameter(t.detach().clone(), requires_grad=t.is_floating_point())
            for t in mixed_tensors(rng, n, base)
        ]
        for i, p in enumerate(params):
            self.register_parameter(f"p{i}", p)
        self.ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(3)) for _ in range(n)]
        )
        self.d = {f"k{i}": t for i, t in enumerate(mixed_tensors(rng, n, base))}
        self.xs = mixed_tensors(rng, n, base)

    def slots(self):
        """(container, key) of every tensor."""
        out = [(self._buffers, k) for k in self._buffers]
        out += [(self._parameters, k) for k in self._parameters]
        out += [(self.ps._parameters, k) for k in self.ps._parameters]
        out += [(self.d, k) for k in self.d]
        return out + [(self.xs, i) for i in range(len(self.xs))]


def module_held(self, x):
    n = len(self.xs)
    return (
        [getattr(self, f"b{i}") * 2 for i in range(n)],
        [getattr(self, f"p{i}") * 3 for i in range(n)],
        [p * 4 for p in self.ps],
        [t * 5 for t in self.d.values()],
        [t * 6 for t in self.xs],
        x + 1,
    )


class InPlaceMutator(Mutator):
    """Changes to a module's tensors that write to no dict, and their undo."""

    KINDS = ["same", "values", "same_metadata", "attr", "attr"]
    KINDS += ["requires_grad", "dtype", "size", "stride", "rank", "neg", "t_"]
    # Not mark_dynamic: the per-tensor guards' dict tag fast path checks TENSOR_MATCH of
    # tagged tensors but not their dimension markings (accel rejects, they accept).

    def change(self, t):
        """Change t in place; returns the undo."""
        r = self.rng
        data, requires_grad = t.data, t.requires_grad

        def undo():
            t.data = data
            t.requires_grad_(requires_grad)
            if hasattr(t, "unrelated_attribute"):
                del t.unrelated_attribute

        kind = r.choice(self.KINDS)
        try:
            if kind == "values":
                with torch.no_grad():
                    t.add_(1)
            elif kind == "same_metadata":
                t.data = self.new_like(data)
            elif kind == "attr":
                t.unrelated_attribute = 1
            elif kind == "requires_grad" and t.is_floating_point():
                t.requires_grad_(not requires_grad)
            elif kind == "dtype":
                t.data = data.to(r.choice([torch.float64, torch.float16]))
            elif kind == "size":
                shape = list(data.shape) or [0]
                shape[r.randrange(len(shape))] += 1
                t.data = rand(shape, data.dtype)
            elif kind == "stride" and data.dim() in (1, 2):
                t.data = (
                    rand((data.shape[1], data.shape[0]), data.dtype).t()
                    if data.dim() == 2
                    else rand((data.shape[0] * 2,), data.dtype)[::2]
                )
            elif kind == "rank":
                t.data = rand((*data.shape, 1), data.dtype)
            elif kind == "neg":
                t.data = data._neg_view()
            elif kind == "t_" and t.dim() == 2:
                with torch.no_grad():
                    t.t_()
        except RuntimeError:
            pass  # e.g. .data of another dtype on a tensor that requires grad
        return undo


@requires_extension
class ModuleAgreementTests(torch._dynamo.test_case.TestCase):
    """RandomizedAgreementTests with the tensors held by an nn.Module, changed in
    place (no dict write, so no dict tag changes) and by writes to its containers."""

    @parametrize("recursive_dict_tags", [False, True])
    def test_agrees_with_per_tensor_guards(self, recursive_dict_tags):
        rng = random.Random(30)
        base = torch.randn(256)
        m = ModuleHeld(rng, base)
        x = torch.randn(3)
        managers = {}
        with config.patch(use_recursive_dict_tags_for_guards=recursive_dict_tags):
            for accel in (False, True):
                fn = fresh_copy(module_held)
                with config.patch(tensor_container_guards=accel):
                    torch.compile(fn, backend="eager")(m, x)
                managers[accel] = guard_manager_of(fn)
        self.assertEqual(len(native_guards(managers[True])), 5)
        mutator = InPlaceMutator(rng, base)
        outcomes = {True: 0, False: 0}
        for case in range(100):
            f_locals = {"self": m, "x": x}
            undo = []
            # First only changes in place, so that the dict tag fast path of both
            # guard trees is taken until the per-tensor tree rejects; then writes as well.
            if case < 40 or rng.random() < 0.5:
                for _ in range(rng.choice([1, 1, 2])):
                    container, key = rng.choice(m.slots())
                    undo.append(mutator.change(container[key]))
            elif rng.random() < 0.8:
                container, key = rng.choice(m.slots())
                old = container[key]
                others = [c[k] for c, k in m.slots()]
                container[key] = mutator.tensor(old, others)
                undo.append(lambda c=container, k=key, v=old: c.__setitem__(k, v))
            else:
                name = rng.choice(["d", "xs"])
                old = getattr(m, name)
                setattr(m, name, mutator.container(old, [c[k] for c, k in m.slots()]))
                undo.append(lambda n=name, v=old: setattr(m, n, v))
            try:
                per_tensor = managers[False].check(f_locals)
                accel = managers[True].check(f_locals)
            finally:
                for u in reversed(undo):
                    u()
            self.assertEqual(accel, per_tensor, f"case {case}: accel={accel} per-tensor={per_tensor}")
            outcomes[per_tensor] += 1
        self.assertGreater(outcomes[True], 10)
        self.assertGreater(outcomes[False], 10)


instantiate_parametrized_tests(ModuleAgreementTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
