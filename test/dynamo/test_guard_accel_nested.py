# Owner(s): ["module: dynamo"]
"""Native guards for grads, dicts of dicts and identity pairs (guard_accel, native-container-guard)."""

import collections
import copy
import random
import re
import textwrap
import types
import unittest

import torch
import torch._dynamo.test_case
from torch._dynamo import config, guard_accel
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.exc import RecompileError
from torch._dynamo.testing import CompileCounter
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)

try:  # test_guard_accel.py's bad-argument runner
    from .test_guard_accel import run_bad_argument_cases
except ImportError:
    from test_guard_accel import run_bad_argument_cases


N = 1000


class PlainSGD:
    def __init__(self, params, lr=0.01, momentum=0.9):
        self.param_groups = [{"params": list(params), "lr": lr, "momentum": momentum}]
        self.state = {}

    def _init_group(self, group, params, grads, bufs):
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {"momentum_buffer": torch.zeros_like(p)}
            params.append(p)
            grads.append(p.grad)
            bufs.append(state["momentum_buffer"])

    def step(self):
        with torch.no_grad():
            for group in self.param_groups:
                params, grads, bufs = [], [], []
                self._init_group(group, params, grads, bufs)
                torch._foreach_mul_(bufs, group["momentum"])
                torch._foreach_add_(bufs, grads)
                torch._foreach_add_(params, bufs, alpha=-group["lr"])


class ModulePlainSGD(torch.nn.Module, PlainSGD):
    """PlainSGD as an nn.Module: with config.use_recursive_dict_tags_for_guards its
    node can be the root of a subtree skipped while its dict tags are unchanged."""

    def __init__(self, params, **kwargs):
        torch.nn.Module.__init__(self)
        PlainSGD.__init__(self, params, **kwargs)


class DefaultdictPlainSGD(PlainSGD):
    """PlainSGD whose state is a defaultdict, as torch.optim's is."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.state = collections.defaultdict(dict)


def make_opt_class(base=PlainSGD):
    """A fresh OnceSGD class (own code objects, so its own Dynamo cache)."""

    step = types.FunctionType(
        PlainSGD.step.__code__.replace(co_name=f"step_{id(object())}"),
        PlainSGD.step.__globals__,
    )

    class OnceSGD(base):
        @torch._dynamo.init_values_once(guards=["self.state", "self.param_groups", "group"])
        def _init_group(self, group, params, grads, bufs):
            super()._init_group(group, params, grads, bufs)

    OnceSGD.step = step
    return OnceSGD


def make_params(n, none_grads=()):
    params = [torch.nn.Parameter(torch.randn(4)) for _ in range(n)]
    for i, p in enumerate(params):
        p.grad_dtype = None  # allow grads of another dtype
        if i not in none_grads:
            p.grad = torch.randn(4)
    return params


def compile_opt(params, accel=True, opt=None):
    if opt is None:
        opt = make_opt_class()(params)
    cls = type(opt)
    cnt = CompileCounter()
    with config.patch(tensor_container_guards=accel):
        compiled = torch.compile(opt.step, backend=cnt)
        compiled()
    entries = _debug_get_cache_entry_list(cls.step)
    assert len(entries) == 1, len(entries)
    return opt, compiled, cnt, entries[0].guard_manager


class RecompileReasonAssertions:
    def recompile_reason(self, compiled, *args):
        """The guard failure(s) compiled(*args) recompiles for, as Dynamo logs them
        (each reason and its explanation line), raised by error_on_recompile."""
        with config.patch(error_on_recompile=True):
            with self.assertRaises(RecompileError) as raised:
                compiled(*args)
        return textwrap.dedent(str(raised.exception).split("guard failure(s):\n", 1)[1])

    def assert_recompile_reason(self, compiled, reason, *args):
        """For cases parametrized by names: the first failure logged is exactly
        reason (compile id left out)."""
        logged = self.recompile_reason(compiled, *args).splitlines()[0]
        self.assertEqual(re.sub(r"^- \d+/\d+: ", "", logged), reason)


requires_extension = unittest.skipIf(
    guard_accel.extension() is None, "torch._dynamo._guard_accel is not built"
)


@requires_extension
@instantiate_parametrized_tests
class NestedGuardTests(RecompileReasonAssertions, torch._dynamo.test_case.TestCase):
    @parametrize("base", [PlainSGD, DefaultdictPlainSGD], name_fn=lambda base: base.__name__)
    def test_tree_is_compact(self, base):
        # A defaultdict state (torch.optim's) is walked natively like a dict.
        params = make_params(64)
        _, _, _, gm = compile_opt(params, opt=make_opt_class(base)(params))
        tree = str(gm)
        self.assertNotIn("TENSOR_MATCH", tree)
        self.assertNotIn("GradGuardAccessor", tree)
        self.assertNotIn("NOT_NONE", tree)
        # Only the param group's 3 keys; the state's inner dicts' keys are native.
        self.assertEqual(tree.count("KeyValueManager"), 3)
        self.assertNotIn(" is list(dict.keys", tree)
        self.assertIn(
            "the keys in order of the 64 dicts holding them",
            gm.closure_vars["___tensor_container_nested_0"].summary(),
        )
        self.assertEqual(gm.closure_vars["___tensor_container_identity"].num_pairs(), 64)
        self.assertEqual(gm.closure_vars["___tensor_container_nested_0"].num_tensors(), 64)
        # grads (64) and buffers (64); the parameters skip the no-aliasing guard
        self.assertEqual(gm.closure_vars["___tensor_aliasing_group"].num_tensors(), 128)

    def test_switch_off_keeps_per_tensor_guards(self):
        params = make_params(16)
        _, _, _, gm = compile_opt(params, accel=False)
        tree = str(gm)
        self.assertIn("GradGuardAccessor", tree)
        self.assertIn("is list(dict.keys", tree)
        self.assertFalse(any(k.startswith("___tensor_container") for k in gm.closure_vars))
        self.assertNotIn("___tensor_container_identity", gm.closure_vars)

    def test_small_frames_keep_per_tensor_guards(self):
        params = make_params(config.tensor_container_guard_min_size - 1)
        _, _, _, gm = compile_opt(params)
        self.assertIn("GradGuardAccessor", str(gm))
        self.assertNotIn("___tensor_container_identity", gm.closure_vars)

    def test_subclass_grad_keeps_per_tensor_guards(self):
        # A grad the native guard does not handle (a tensor subclass) keeps its
        # own NOT_NONE and TENSOR_MATCH guards; the other grads are native.
        class MyTensor(torch.Tensor):
            pass

        params = make_params(16)
        params[7].grad = torch.randn(4).as_subclass(MyTensor)
        opt, compiled, cnt, gm = compile_opt(params)
        tree = str(gm)
        self.assertEqual(tree.count("GradGuardAccessor"), 1)
        self.assertIn("['params'][7].grad", tree)
        params[7].grad = torch.randn(4)
        with config.patch(error_on_recompile=True):
            with self.assertRaises(RecompileError):
                compiled()

    def test_inner_dict_keys_not_all_str_keep_their_key_guards(self):
        # The native guard checks inner dicts with str keys only; one with an int
        # key keeps its own key guards, and a key added to it still recompiles.
        params = make_params(16)
        opt = make_opt_class()(params)
        for i, p in enumerate(params):
            opt.state[p] = {"momentum_buffer": torch.zeros(4)}
            if i == 3:
                opt.state[p][0] = "not a tensor"
        _, compiled, cnt, gm = compile_opt(params, opt=opt)
        tree = str(gm)
        self.assertIn("list(dict.keys(L['self'].state[list(dict.keys(L['self'].state))[3]]))[1] == 0", tree)
        self.assertEqual(tree.count("KeyValueManager"), 3 + 3)  # param group; state[3]'s two keys, itself
        self.assertIn("the keys in order of the 15 dicts", gm.closure_vars["___tensor_container_nested_0"].summary())
        opt.state[params[3]][1] = "another"
        self.assertExpectedInline(self.recompile_reason(compiled), """\
- 0/0: len(self.state[list(dict.keys(self.state))[3]]) != 2
-   => object self.state: length of self.state[list(dict.keys(self.state))[3]] changed 2 -> 3""", skip=1)
        del opt.state[params[3]][1]
        opt.state[params[4]]["step"] = 1
        self.assertExpectedInline(self.recompile_reason(compiled), """\
- 0/0: self.state[list(dict.keys(self.state))[4]]['momentum_buffer']: the dict holding it changed keys ['momentum_buffer'] -> ['momentum_buffer', 'step']
-   => object self.state, tensor self.state[list(dict.keys(self.state))[4]]['momentum_buffer']: the dict holding it changed keys ['momentum_buffer'] -> ['momentum_buffer', 'step']""", skip=1)  # noqa: E501

    def test_inner_keys_argument_is_validated(self):
        ext = guard_accel.extension()
        t = torch.randn(2)
        record = (0, "a", t, [2], [1], None, False, "d[k]['a']")
        guard = ext.make_tensor_container_guard("dict_nested", "d", dict, {0: ("a", "b")}, [record], None, [])
        self.assertTrue(guard({"k": {"a": t, "b": 1}}))
        self.assertFalse(guard({"k": {"b": 1, "a": t}}))
        self.assertFalse(guard({"k": {"a": t}}))
        self.assertEqual(
            guard.explain({"k": {"b": 1, "a": t}}),
            "d[k]['a']: the dict holding it changed keys ['a', 'b'] -> ['b', 'a']",
        )
        # A key whose repr could run user code is shown by its type only.
        self.assertEqual(
            guard.explain({"k": {"a": t, object(): 1}}),
            "d[k]['a']: the dict holding it changed keys ['a', 'b'] -> ['a', <object object>]",
        )
        with self.assertRaisesRegex(ValueError, "position without records"):
            ext.make_tensor_container_guard("dict_nested", "d", dict, {1: ("a",)}, [record], None, [])
        with self.assertRaisesRegex(ValueError, "missing from the inner keys"):
            ext.make_tensor_container_guard("dict_nested", "d", dict, {0: ("b",)}, [record], None, [])
        with self.assertRaisesRegex(TypeError, "exact str"):
            ext.make_tensor_container_guard("dict_nested", "d", dict, {0: ("a", 1)}, [record], None, [])

    def test_grads_alone_join_the_aliasing_group(self):
        # Only Parameters (exempt from no-aliasing) and their grads: the group
        # is still installed for the grads.
        def step(params):
            with torch.no_grad():
                torch._foreach_add_(params, [p.grad for p in params])

        params = make_params(16)
        cnt = CompileCounter()
        compiled = torch.compile(step, backend=cnt)
        compiled(params)
        gm = _debug_get_cache_entry_list(step)[0].guard_manager
        self.assertNotIn("GradGuardAccessor", str(gm))
        self.assertEqual(gm.closure_vars["___tensor_aliasing_group"].num_tensors(), 16)
        g = params[9].grad
        params[9].grad = params[2].grad
        self.assertExpectedInline(self.recompile_reason(compiled, params), """\
- 0/0: params[2].grad and params[9].grad are the same tensor, but the graph was compiled for distinct tensors
-   => object params: params[2].grad and params[9].grad are the same tensor now""", skip=1)
        params[9].grad = g
        compiled(params)
        self.assertEqual(cnt.frame_count, 1)

    def test_grad_presence_alone_is_checked(self):
        # The grads are only tested for None (NOT_NONE_MATCH, no TENSOR_MATCH):
        # their record still checks presence.
        def keep_with_grads(xs):
            return [x * 2 for x in xs if x.grad is not None]

        xs = make_params(16)
        cnt = CompileCounter()
        compiled = torch.compile(keep_with_grads, backend=cnt)
        self.assertEqual(len(compiled(xs)), 16)
        self.assertNotIn("GradGuardAccessor", str(_debug_get_cache_entry_list(keep_with_grads)[0].guard_manager))
        xs[3].grad = None
        out = compiled(xs)
        self.assertEqual(len(out), 15)
        self.assertEqual(out, keep_with_grads(xs))
        self.assertEqual(cnt.frame_count, 2)

    def test_each_field_change_fails_and_is_named(self):
        params = make_params(N, none_grads={5})
        opt, compiled, cnt, _ = compile_opt(params)
        grads = "self.param_groups[0]['params']"
        p = params[417]
        g = p.grad
        bufs = list(opt.state.values())
        buf = bufs[416]["momentum_buffer"]  # params[5] has no state: position 416
        state_name = "self.state[list(dict.keys(self.state))[416]]['momentum_buffer']"
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = g

        def reorder_state():
            bufs[416]["step"] = 1
            bufs[416]["momentum_buffer"] = bufs[416].pop("momentum_buffer")

        cases = {
            "grad None": (lambda: setattr(p, "grad", None), lambda: setattr(p, "grad", g),
                          f"{grads}[417].grad: is None, expected a tensor"),
            "grad present": (lambda: setattr(params[5], "grad", torch.randn(4)),
                             lambda: setattr(params[5], "grad", None),
                             f"{grads}[5].grad: is a tensor, expected None"),
            "grad dtype": (lambda: setattr(p, "grad", g.double()), lambda: setattr(p, "grad", g),
                           f"{grads}[417].grad: dtype changed float32 -> float64"),
            "grad stride": (lambda: setattr(p, "grad", torch.randn(8)[::2]),
                            lambda: setattr(p, "grad", g),
                            f"{grads}[417].grad: stride[0] changed 1 -> 2"),
            "grad requires_grad": (lambda: setattr(p, "grad", g.clone().requires_grad_()),
                                   lambda: setattr(p, "grad", g),
                                   f"{grads}[417].grad: requires_grad changed False -> True"),
            "grad aliasing": (lambda: setattr(p, "grad", params[3].grad),
                              lambda: setattr(p, "grad", g),
                              f"{grads}[3].grad and {grads}[417].grad are the same tensor, "
                              "but the graph was compiled for distinct tensors"),
            "state dtype": (lambda: bufs[416].__setitem__("momentum_buffer", buf.double()),
                            lambda: bufs[416].__setitem__("momentum_buffer", buf),
                            f"{state_name}: dtype changed float32 -> float64"),
            "state missing": (lambda: bufs[416].pop("momentum_buffer"),
                              lambda: bufs[416].__setitem__("momentum_buffer", buf),
                              f"{state_name}: the dict holding it changed keys ['momentum_buffer'] -> []"),
            "state key added": (lambda: bufs[416].__setitem__("step", 1),
                                lambda: bufs[416].pop("step"),
                                f"{state_name}: the dict holding it changed keys "
                                "['momentum_buffer'] -> ['momentum_buffer', 'step']"),
            "state keys reordered": (reorder_state, lambda: bufs[416].pop("step"),
                                     f"{state_name}: the dict holding it changed keys "
                                     "['momentum_buffer'] -> ['step', 'momentum_buffer']"),
            "state aliasing": (lambda: bufs[416].__setitem__("momentum_buffer", bufs[3]["momentum_buffer"]),
                               lambda: bufs[416].__setitem__("momentum_buffer", buf),
                               "self.state[list(dict.keys(self.state))[3]]['momentum_buffer'] and "
                               f"{state_name} are the same tensor, but the graph was compiled for distinct tensors"),
            "param swapped": (lambda: opt.param_groups[0]["params"].__setitem__(417, q),
                              lambda: opt.param_groups[0]["params"].__setitem__(417, p),
                              f"{grads}[417] is list(dict.keys(self.state))[416] failed: "
                              "the objects are no longer identical"),
        }
        # Same metadata, new grads: no recompile.
        for x in params:
            if x.grad is not None:
                x.grad = torch.randn(4)
        g = p.grad
        q.grad = g
        compiled()
        self.assertEqual(cnt.frame_count, 1)
        for field, (mutate, restore, reason) in cases.items():
            with self.subTest(field=field):
                mutate()
                try:
                    self.assert_recompile_reason(compiled, reason)
                finally:
                    restore()
        compiled()
        self.assertEqual(cnt.frame_count, 1)


def make_torch_optim(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-3, foreach=True)
    return torch.optim.AdamW(params, lr=1e-3, foreach=False)


def unwrapped_step(opt):
    """A torch.optim step without its decorators."""
    fn = type(opt).step
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def step_code(opt):
    return unwrapped_step(opt).__code__


@requires_extension
@instantiate_parametrized_tests
class TorchOptimIdentityTests(RecompileReasonAssertions, torch._dynamo.test_case.TestCase):
    """torch.optim's step guards its params, state buffers and step tensors by
    identity (static addresses installed into the graph): identity records."""

    def run_pair(self, kind, n, calls, between=None):
        """Compiled and eager copies of one optimizer, stepped side by side."""
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(n)]
        ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt, ref = make_torch_optim(kind, params), make_torch_optim(kind, ref_params)
        cnt = CompileCounter()
        compiled = torch.compile(opt.step, backend=cnt)
        for i in range(calls):
            for p, q in zip(params, ref_params):
                p.grad = torch.full_like(p, 0.1 * (i + 1))
                q.grad = p.grad.clone()
            if between is not None:
                between(i, opt, ref)
            compiled()
            ref.step()
            for p, q in zip(params, ref_params):
                self.assertEqual(p, q)
            for s, r in zip(opt.state.values(), ref.state.values()):
                self.assertEqual(list(s), list(r))
                for k in s:
                    self.assertEqual(s[k], r[k])
        return opt, compiled, cnt

    def cache_entries(self, opt):
        return _debug_get_cache_entry_list(step_code(opt))

    @parametrize("kind", ["sgd", "adam", "adamw"])
    def test_step_guards_are_native_and_agree(self, kind):
        opt, compiled, cnt = self.run_pair(kind, 16, 4)
        frames = cnt.frame_count
        tree = str(self.cache_entries(opt)[0].guard_manager)
        # No per-tensor identity, grad or state-key leaves are left.
        self.assertNotIn("['params'][3]", tree)
        self.assertNotIn("GradGuardAccessor", tree)
        self.assertNotIn("['momentum_buffer']", tree)
        self.assertNotIn("['exp_avg']", tree)
        self.assertIn("___tensor_container_nested_0(L['self'].state)", tree)
        with config.patch(tensor_container_guards=False):
            torch._dynamo.reset()
            opt_off, _, cnt_off = self.run_pair(kind, 16, 4)
            tree_off = str(self.cache_entries(opt_off)[0].guard_manager)
        self.assertEqual(cnt_off.frame_count, frames)
        self.assertIn("GradGuardAccessor", tree_off)
        self.assertGreater(tree_off.count("ID_MATCH"), 3 * 16)

    @parametrize("kind", ["sgd", "adam"])
    def test_identity_changes_fail_and_are_named(self, kind):
        opt, compiled, cnt = self.run_pair(kind, 16, 3)
        params = opt.param_groups[0]["params"]
        p = params[11]
        states = list(opt.state.values())
        key = "momentum_buffer" if kind == "sgd" else "exp_avg"
        buf = states[11][key]
        q = torch.nn.Parameter(p.detach().clone())
        group = "self.param_groups[0]['params']"
        keys = list(states[11])
        state_11 = "self.state[list(dict.keys(self.state))[11]]"
        state_item = f"{state_11}[list(dict.keys({state_11}))[{keys.index(key)}]]"

        def add_key():
            states[11]["extra"] = 1

        cases = {
            "param replaced": (
                lambda: params.__setitem__(11, q), lambda: params.__setitem__(11, p),
                f"{group}[11]: is another object than the Parameter guarded by identity (ID_MATCH)",
            ),
            "state buffer replaced": (
                lambda: states[11].__setitem__(key, buf.clone()),
                lambda: states[11].__setitem__(key, buf),
                f"{state_item}: is another object than the Tensor guarded by identity (ID_MATCH)",
            ),
            "grad None": (
                lambda: setattr(p, "grad", None), None, f"{group}[11].grad: is None, expected a tensor",
            ),
            "state key added": (
                add_key, lambda: states[11].pop("extra"),
                f"{state_item}: the dict holding it changed keys {keys} -> {[*keys, 'extra']}",
            ),
        }
        for field, (mutate, restore, reason) in cases.items():
            with self.subTest(field=field):
                for x in params:
                    x.grad = torch.randn(4, 4)
                mutate()
                try:
                    self.assert_recompile_reason(compiled, reason)
                finally:
                    if restore is not None:
                        restore()
        for x in params:
            x.grad = torch.randn(4, 4)
        frames = cnt.frame_count
        compiled()
        self.assertEqual(cnt.frame_count, frames)

    @parametrize("kind", ["sgd", "adam"])
    def test_changes_between_calls_match_eager(self, kind):
        # A param swapped for a fresh one, a grad dropped, a state reset from
        # outside: the compiled step follows eager and recompiles as often as it
        # does with per-tensor guards.
        def between(i, opt, ref):
            for o in (opt, ref):
                params = o.param_groups[0]["params"]
                if i == 2:
                    params[5].grad = None
                if i == 3:
                    o.state[params[7]] = {}
                    del o.state[params[7]]
                if i == 4:
                    fresh = torch.nn.Parameter(params[9].detach().clone())
                    fresh.grad = params[9].grad
                    params[9] = fresh

        frames = []
        for native in (True, False):
            torch._dynamo.reset()
            with config.patch(tensor_container_guards=native):
                _, _, cnt = self.run_pair(kind, 12, 6, between)
            frames.append(cnt.frame_count)
        self.assertEqual(frames[0], frames[1])

    def test_identity_record_argument_is_validated(self):
        ext = guard_accel.extension()
        t = torch.randn(2)
        group = ext.TensorAliasingGroup([])
        with self.assertRaisesRegex(ValueError, "takes no marks and no aliasing"):
            ext.make_tensor_container_guard(
                "list", "xs", list, None, [(0, None, t, None, None, None, True, "xs[0]")], group, []
            )
        guard = ext.make_tensor_container_guard(
            "list", "xs", list, None, [(0, None, t, None, None, None, False, "xs[0]")], group, []
        )
        self.assertTrue(guard([t]))
        self.assertFalse(guard([t.clone()]))
        self.assertFalse(guard([object()]))
        self.assertFalse(guard([]))
        self.assertIn("identity of 1 tensors in one native TensorContainerGuard (as ID_MATCH", guard.summary())


def guard_nodes(node):
    yield node
    for child in node.get_child_managers():
        yield from guard_nodes(child)
    # A DictGuardManager (a dict with key guards) keeps its items' nodes apart.
    if hasattr(node, "get_key_value_managers"):
        for key_node, value_node in node.get_key_value_managers().values():
            for child in (key_node, value_node):
                if child is not None:
                    yield from guard_nodes(child)


@requires_extension
class ModuleOptimizerTests(RecompileReasonAssertions, torch._dynamo.test_case.TestCase):
    """The native guards of an optimizer that is an nn.Module, with and without
    config.use_recursive_dict_tags_for_guards: grads, state buffers and parameters
    change in place without a write to any dict, so without a new dict tag."""

    @parametrize("recursive_dict_tags", [False, True])
    def test_in_place_changes_fail_and_are_named(self, recursive_dict_tags):
        with config.patch(use_recursive_dict_tags_for_guards=recursive_dict_tags):
            params = make_params(16, none_grads={5})
            opt = make_opt_class(ModulePlainSGD)(params)
            opt, compiled, cnt, gm = compile_opt(params, opt=opt)
            compiled()  # the first guard check records the dict tags
            self.assertEqual(cnt.frame_count, 1)
            self.assertEqual(
                sorted(k for k in gm.closure_vars if k.startswith("___tensor_container")),
                ["___tensor_container_0", "___tensor_container_nested_0"],
            )
            native = [
                node
                for node in guard_nodes(gm.root)
                if any(
                    "___tensor_container" in part
                    for leaf in node.get_leaf_guards()
                    for part in leaf.verbose_code_parts()
                )
            ]
            self.assertEqual(len(native), 2)
            for node in native:
                self.assertFalse(node.is_tag_safe(), node.get_source())

            grads = "self.param_groups[0]['params']"
            p, q = params[9], params[5]
            g = p.grad
            buf = opt.state[p]["momentum_buffer"]
            # params[5] has no grad, so no state: params[9] is at position 8
            state_name = "self.state[list(dict.keys(self.state))[8]]['momentum_buffer']"

            def set_data(t, value):
                t.data = value

            def transpose_(t):
                with torch.no_grad():
                    t.t_()

            cases = {
                "grad None": (lambda: setattr(p, "grad", None),
                              f"{grads}[9].grad: is None, expected a tensor"),
                "grad present": (lambda: setattr(q, "grad", torch.randn(4)),
                                 f"{grads}[5].grad: is a tensor, expected None"),
                "grad dtype": (lambda: set_data(g, g.data.double()),
                               f"{grads}[9].grad: dtype changed float32 -> float64"),
                "grad requires_grad": (lambda: g.requires_grad_(),
                                       f"{grads}[9].grad: requires_grad changed False -> True"),
                "state dtype": (lambda: set_data(buf, buf.data.double()),
                                f"{state_name}: dtype changed float32 -> float64"),
                "state size": (lambda: set_data(buf, torch.zeros(5)),
                               f"{state_name}: size[0] changed 4 -> 5"),
                "param requires_grad": (lambda: p.requires_grad_(False),
                                        f"{grads}[9]: requires_grad changed True -> False"),
                "param rank": (lambda: set_data(p, p.data.unsqueeze(0)),
                               f"{grads}[9]: rank changed 1 -> 2"),
            }
            for field, (mutate, reason) in cases.items():
                saved = [(t, t.data, t.requires_grad) for t in (p, g, buf)]
                with self.subTest(field=field):
                    mutate()
                    try:
                        self.assert_recompile_reason(compiled, reason)
                    finally:
                        for t, data, requires_grad in saved:
                            t.data = data
                            t.requires_grad_(requires_grad)
                        p.grad, q.grad = g, None
            compiled()
            self.assertEqual(cnt.frame_count, 1)


instantiate_parametrized_tests(ModuleOptimizerTests)


class Mutator:
    """Random mutations of an optimizer's grads, state and param list (a copy)."""

    def __init__(self, rng, opt):
        self.rng = rng
        self.opt = opt

    def case(self):
        """(mutated optimizer copy, undo) for one random mutation."""
        rng, opt = self.rng, self.opt
        new = copy.copy(opt)
        new.param_groups = [dict(g, params=list(g["params"])) for g in opt.param_groups]
        new.state = copy.copy(opt.state)  # its own type (torch.optim's: a defaultdict)
        for key in new.state:
            new.state[key] = dict(new.state[key])
        params = new.param_groups[0]["params"]
        undo = []
        for _ in range(rng.choice([1, 1, 1, 2])):
            i = rng.randrange(len(params))
            p = params[i]
            kind = rng.choice(
                ["grad_none", "grad_new", "grad_dtype", "grad_stride", "grad_alias",
                 "grad_alias_buf", "grad_set", "state_new", "state_dtype", "state_del",
                 "state_add_key", "state_alias", "outer_del", "outer_add", "param_swap",
                 "param_new", "inner_type", "nothing"]
            )
            old_grad = p.grad
            undo.append(lambda p=p, g=old_grad: setattr(p, "grad", g))
            other = params[rng.randrange(len(params))]
            keys = list(new.state)
            k = keys[rng.randrange(len(keys))]
            if kind == "grad_none":
                p.grad = None
            elif kind == "grad_new":
                p.grad = torch.randn(4) if old_grad is not None else None
            elif kind == "grad_set":
                p.grad = torch.randn(4)
            elif kind == "grad_dtype":
                p.grad = torch.randn(4, dtype=torch.float64)
            elif kind == "grad_stride":
                p.grad = torch.randn(8)[::2]
            elif kind == "grad_alias":
                p.grad = other.grad
            elif kind == "grad_alias_buf":
                p.grad = new.state[k]["momentum_buffer"]
            elif kind == "state_new":
                new.state[k]["momentum_buffer"] = torch.zeros(4)
            elif kind == "state_dtype":
                new.state[k]["momentum_buffer"] = torch.zeros(4, dtype=torch.float64)
            elif kind == "state_del":
                del new.state[k]["momentum_buffer"]
            elif kind == "state_add_key":
                new.state[k]["extra"] = torch.zeros(4)
            elif kind == "state_alias":
                k2 = keys[rng.randrange(len(keys))]
                if "momentum_buffer" in new.state[k2]:
                    new.state[k]["momentum_buffer"] = new.state[k2]["momentum_buffer"]
            elif kind == "outer_del":
                del new.state[k]
            elif kind == "outer_add":
                new.state[torch.nn.Parameter(torch.randn(4))] = {"momentum_buffer": torch.zeros(4)}
            elif kind == "param_swap":
                j = rng.randrange(len(params))
                params[i], params[j] = params[j], params[i]
            elif kind == "param_new":
                q = torch.nn.Parameter(p.detach().clone())
                q.grad = old_grad
                params[i] = q
            elif kind == "inner_type":
                import collections

                new.state[k] = collections.OrderedDict(new.state[k])
        return new, undo


@instantiate_parametrized_tests
class RandomizedAgreementTests(torch._dynamo.test_case.TestCase):
    CASES = 300

    @requires_extension
    @parametrize("base", [PlainSGD, DefaultdictPlainSGD], name_fn=lambda base: base.__name__)
    def test_agrees_with_per_tensor_guards(self, base):
        for seed in range(2):
            params = make_params(24, none_grads={2, 11})
            managers = {}
            opt = make_opt_class(base)(params)
            for accel in (False, True):
                torch._dynamo.reset()
                _, _, _, managers[accel] = compile_opt(params, accel=accel, opt=opt)
            self.assertIn("___tensor_container_identity", managers[True].closure_vars)
            self.assertNotIn("___tensor_container_identity", managers[False].closure_vars)
            mutator = Mutator(random.Random(seed), opt)
            self.assert_decisions_agree(seed, managers, mutator, lambda new, undo: {"self": new})

    def assert_decisions_agree(self, seed, managers, mutator, frame_locals, grad_enabled=True):
        """managers[True] (native) decides every random mutation as managers[False]
        (per-tensor) does; frame_locals(copy, undo) gives the locals to check."""
        outcomes = {True: 0, False: 0}
        for case in range(self.CASES):
            new, undo = mutator.case()
            try:
                f_locals = frame_locals(new, undo)
                with torch.set_grad_enabled(grad_enabled):  # the frame's grad mode
                    per_tensor = managers[False].check(f_locals)
                    native = managers[True].check(f_locals)
            finally:
                for u in reversed(undo):
                    u()
            self.assertEqual(native, per_tensor, f"seed {seed} case {case}")
            outcomes[per_tensor] += 1
        self.assertGreater(outcomes[True], self.CASES // 10)
        self.assertGreater(outcomes[False], self.CASES // 4)

    @requires_extension
    def test_torch_optim_agrees_with_per_tensor_guards(self):
        # torch.optim's own step: identity records instead of ID_MATCH leaves.
        for seed in range(2):
            params = make_params(24, none_grads={2, 11})
            opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
            managers = {}
            for native in (False, True):
                # A copy of SGD.step's code per tree: both stay cached side by side.
                step = unwrapped_step(opt)
                step = types.FunctionType(
                    step.__code__.replace(co_name=f"step_{native}"), step.__globals__,
                    argdefs=step.__defaults__,
                )
                with config.patch(tensor_container_guards=native), torch.no_grad():
                    compiled = torch.compile(step, backend="eager")
                    compiled(opt)
                    compiled(opt)  # the first call filled the state
                    managers[native] = _debug_get_cache_entry_list(step.__code__)[0].guard_manager
            self.assertIn("___tensor_container_nested_0", managers[True].closure_vars)
            self.assertNotIn("___tensor_container_nested_0", managers[False].closure_vars)

            def in_the_optimizer(new, undo):
                # The step guards the optimizer's identity: check the mutated
                # containers in the optimizer itself.
                saved = opt.state, opt.param_groups
                undo.append(lambda: setattr(opt, "state", saved[0]))
                undo.append(lambda: setattr(opt, "param_groups", saved[1]))
                opt.state, opt.param_groups = new.state, new.param_groups
                return {"self": opt, "closure": None}

            mutator = Mutator(random.Random(seed), opt)
            # step runs under no_grad (torch.optim's _use_grad)
            self.assert_decisions_agree(seed, managers, mutator, in_the_optimizer, grad_enabled=False)


@requires_extension
class BadArgumentTests(torch._dynamo.test_case.TestCase):
    """The entry points this patch adds raise Python exceptions on bad input."""

    def test_construction_and_calls_raise_python_errors(self):
        big = 2**70
        ident = "ident"
        ok_base = '(None, [(True, "params")], False)'
        ok_pair = '(0, 0, 0, 1, "a is b")'
        cases = {
            "bases None": (f"{ident}(None, [])", "TypeError"),
            "pairs None": (f"{ident}([], None)", "TypeError"),
            "one argument": ("ext.make_object_identity_guard([])", "TypeError"),
            "two arguments": ("ext.make_object_identity_guard([], [])", "TypeError"),
            "verbose_code_parts None": (f"{ident}([], [], None)", "TypeError"),
            "base a list": (f'{ident}([[None, [], False]], [])', "TypeError"),
            "base too short": (f"{ident}([(None, [])], [])", "ValueError"),
            "base name an int": (f"{ident}([(1, [], False)], [])", "ValueError"),
            "base keys not a bool": (f'{ident}([(None, [], "yes")], [])', "TypeError"),
            "base steps None": (f"{ident}([(None, None, False)], [])", "TypeError"),
            "step too short": (f"{ident}([(None, [(True,)], False)], [])", "ValueError"),
            "step is_attr an int": (f'{ident}([(None, [(1, "a")], False)], [])', "TypeError"),
            "step attribute an int": (f"{ident}([(None, [(True, 1)], False)], [])", "TypeError"),
            "step key a float": (f"{ident}([(None, [(False, 1.5)], False)], [])", "TypeError"),
            "pair too short": (f"{ident}([{ok_base}], [(0, 0, 0)])", "ValueError"),
            "pair index negative": (f'{ident}([{ok_base}], [(0, -1, 0, 1, "d")])', "ValueError"),
            "pair index huge": (f'{ident}([{ok_base}], [(0, {big}, 0, 1, "d")])', "OverflowError"),
            "pair unknown base": (f'{ident}([{ok_base}], [(5, 0, 0, 1, "d")])', "ValueError"),
            "pair base huge": (f'{ident}([{ok_base}], [({big}, 0, 0, 1, "d")])', "OverflowError"),
            "pair description surrogate": (f'{ident}([{ok_base}], [(0, 0, 0, 1, "\\ud800")])', "UnicodeEncodeError"),
            "pair description None": (f"{ident}([{ok_base}], [(0, 0, 0, 1, None)])", "TypeError"),
            "identity no args": (f"{ident}([{ok_base}], [{ok_pair}])()", "TypeError"),
            "identity two args": (f"{ident}([{ok_base}], [{ok_pair}])(1, 2)", "TypeError"),
            "identity on None, ints, missing attributes": (
                f"g = {ident}([{ok_base}], [{ok_pair}]); "
                "assert [g(None), g(1), g(object())] == [False] * 3 and isinstance(g.explain(None), str)",
                "no exception",
            ),
            "identity local name surrogate": (
                f'g = {ident}([("\\ud800", [], False)], [(0, 0, 0, 0, "x")]); assert not g({{}})',
                "no exception",
            ),
            # dict_nested arguments of make_tensor_container_guard
            "nested type list": ('make("dict_nested", elements=[rec(key="a")], dict_type=list)', "TypeError"),
            "nested key not a str": ('make("dict_nested", elements=[rec(key=1)], dict_type=dict)', "TypeError"),
            "nested keys a list": (
                'make("dict_nested", elements=[rec(key="a")], dict_type=dict, keys=[("a",)])',
                "TypeError",
            ),
            "nested keys a str": (
                'make("dict_nested", elements=[rec(key="a")], dict_type=dict, keys={0: "a"})',
                "TypeError",
            ),
            "nested position negative": (
                'make("dict_nested", elements=[rec(key="a")], dict_type=dict, keys={-1: ("a",)})',
                "ValueError",
            ),
            "nested position huge": (
                f'make("dict_nested", elements=[rec(key="a")], dict_type=dict, keys={{{big}: ("a",)}})',
                "OverflowError",
            ),
            "nested position a str": (
                'make("dict_nested", elements=[rec(key="a")], dict_type=dict, keys={"0": ("a",)})',
                "TypeError",
            ),
            "nested inner key surrogate": (
                'make("dict_nested", elements=[rec(key="a")], dict_type=dict, keys={0: ("\\ud800",)})',
                "ValueError",
            ),
            "nested on non-dicts": (
                'g = make("dict_nested", elements=[rec(key="a")], dict_type=dict); '
                'assert [g(None), g([t]), g({"k": [t]}), g({"k": {}})] == [False] * 4',
                "no exception",
            ),
            "grad record without a tensor": (
                "make(elements=[rec(0, None, t, (2,), (1,), None, False, 'x', rec(tensor=None))])",
                "TypeError",
            ),
        }
        run_bad_argument_cases(self, cases)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
