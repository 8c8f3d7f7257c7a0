# Owner(s): ["module: dynamo"]
"""A compiled frame that calls a module and registers a hook on it: the code
traced for the call must not keep running once the module has the hook."""

import contextlib
from unittest import mock

import torch
import torch._dynamo.test_case
from torch._dynamo.guards import GuardBuilder
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize


def add_one(mod, args, out):
    return out + 1


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 3)
        self.handles = []


def double_input(mod, args):
    return (args[0] * 2,)


def called_before_pre_hook_registration(m, x):
    y = m.lin(x)
    m.handles.append(m.lin.register_forward_pre_hook(double_input))
    return y


def called_before_registration(m, x):
    y = m.lin(x)
    m.handles.append(m.lin.register_forward_hook(add_one))
    return y


class ModuleHookRegistrationGuardTests(torch._dynamo.test_case.TestCase):
    """A frame that calls a module and registers a hook on it: the code traced
    for the call must not keep running once the module has the hook
    (module-hook-registration-stale-results)."""

    def check_later_call_recompiles_with_hooks(self, tree=contextlib.nullcontext):
        cnt = CompileCounter()
        m, x = Holder(), torch.randn(2, 3)
        compiled = torch.compile(called_before_registration, backend=cnt)
        with tree():
            first = compiled(m, x)
            second = compiled(m, x)
        self.assertEqual(first + 1, second)
        self.assertEqual(len(m.lin._forward_hooks), 2)
        self.assertEqual(cnt.frame_count, 2)

    def test_later_call_recompiles_with_hooks(self):
        # Dynamo skips the guard on an empty module hook dict: a frame
        # that added a hook and calls the module must not keep running the code
        # traced without it.
        self.check_later_call_recompiles_with_hooks()

    def test_pre_hook_registered_after_call_matches_eager(self):
        # Three calls: each adds one more pre-hook, which the next call runs
        # (the input doubled once per hook), and recompiles for it.
        cnt = CompileCounter()
        m, ref, x = Holder(), Holder(), torch.randn(2, 3)
        compiled = torch.compile(called_before_pre_hook_registration, backend=cnt)
        for _ in range(3):
            self.assertEqual(compiled(m, x), called_before_pre_hook_registration(ref, x))
            self.assertEqual(len(m.lin._forward_pre_hooks), len(ref.lin._forward_pre_hooks))
        self.assertEqual(cnt.frame_count, 3)

    @torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True)
    def test_empty_dict_attribute_recursive_dict_tags(self):
        # The same gap without any hook: a module iterating an empty dict
        # attribute kept the code traced for the empty dict after an insert.
        class Cache(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(3, 3)
                self.extra = {}

            def forward(self, x):
                y = self.lin(x)
                for key in self.extra:
                    y = y + self.extra[key]
                return y

        cnt = CompileCounter()
        m, x = Cache(), torch.randn(2, 3)
        compiled = torch.compile(m, backend=cnt)
        self.assertEqual(compiled(x), m(x))
        m.extra["a"] = 1.0
        self.assertEqual(compiled(x), m(x))
        self.assertEqual(cnt.frame_count, 2)


    # CPython 3.13.0 has no usable __dict__ versions, so Dynamo gives a module's
    # __dict__ node the example value None (_get_generic_dict_manager_example_value).
    # The tests below build that tree on any Python.
    def as_on_cpython_3_13_0(self):
        return mock.patch.object(
            GuardBuilder,
            "_get_generic_dict_manager_example_value",
            staticmethod(lambda example_value: None),
        )

    @torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True)
    def test_list_attribute_under_module_dict_guarding_none(self):
        # A None-valued node counts as immutable, and was tag safe whatever its
        # children guard: the module became a tag safe root, and an in-place
        # change of a list attribute kept the code traced for the old value.
        class Scaled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(3, 3)
                self.scale = [1.0]

            def forward(self, x):
                return self.lin(x) * self.scale[0]

        for emulate in (False, True):
            with self.subTest(cpython_3_13_0=emulate):
                torch._dynamo.reset()
                cnt = CompileCounter()
                m, x = Scaled(), torch.randn(2, 3)
                compiled = torch.compile(m, backend=cnt)
                with self.as_on_cpython_3_13_0() if emulate else contextlib.nullcontext():
                    for scale in (1.0, 2.0, 3.0):
                        m.scale[0] = scale
                        self.assertEqual(compiled(x), m(x))
                        self.assertEqual(m.scale, [scale])
                # 2.0 recompiles; 3.0 reuses that graph (the float is dynamic).
                self.assertEqual(cnt.frame_count, 2)

    @torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True)
    def test_later_call_recompiles_with_hooks_module_dict_guarding_none(self):
        # The reproduction of test_later_call_recompiles_with_hooks, where the
        # hook dict's node hangs below a None-valued __dict__ node.
        self.check_later_call_recompiles_with_hooks(self.as_on_cpython_3_13_0)


def add_one_with_kwargs(mod, args, kwargs, out):
    return out + 1


def triple_input_with_kwargs(mod, args, kwargs):
    return (args[0] * 3,), kwargs


def times_two(mod, args, out):
    return out * 2


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(3, 3) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class HooksRegisteredOutsideTests(torch._dynamo.test_case.TestCase):
    """A hook registered on a submodule before every call and removed after it
    (pytorch#170110): each registration has a new id, so a guard on the hook dict's
    keys recompiles every call. The guards on the hook dicts (their lengths, as this
    patch adds, and the hook functions) must say what the hooks are, not their ids:
    one frame while the hooks are the same, one more when they differ."""

    def run_registrations(self, register, backend, calls=6, fullgraph=True):
        cnt = CompileCounterWithBackend(backend)
        compiled_model, eager_model = Stack(), Stack()
        compiled = torch.compile(compiled_model, backend=cnt, fullgraph=fullgraph)
        for i in range(calls):
            x = torch.randn(2, 3)
            handles = register(compiled_model.layers[1], i) + register(eager_model.layers[1], i)
            self.assertEqual(compiled(x), eager_model(x))
            for h in handles:
                h.remove()
            self.assertEqual(len(compiled_model.layers[1]._forward_hooks), 0)
            self.assertEqual(len(compiled_model.layers[1]._forward_hooks_with_kwargs), 0)
        return cnt.frame_count

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_same_hook_with_kwargs_every_call(self, backend):
        frames = self.run_registrations(
            lambda m, i: [m.register_forward_hook(add_one_with_kwargs, with_kwargs=True)], backend
        )
        self.assertEqual(frames, 1)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_same_pre_hook_with_kwargs_every_call(self, backend):
        frames = self.run_registrations(
            lambda m, i: [m.register_forward_pre_hook(triple_input_with_kwargs, with_kwargs=True)], backend
        )
        self.assertEqual(frames, 1)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_same_hooks_every_call_without_fullgraph(self, backend):
        frames = self.run_registrations(
            lambda m, i: [
                m.register_forward_hook(times_two),
                m.register_forward_hook(add_one_with_kwargs, with_kwargs=True),
            ],
            backend,
            fullgraph=False,
        )
        self.assertEqual(frames, 1)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_different_hook_recompiles(self, backend):
        # two hook sets, alternating: one frame each, then both reused
        frames = self.run_registrations(
            lambda m, i: [
                m.register_forward_hook(times_two)
                if i % 2
                else m.register_forward_hook(add_one_with_kwargs, with_kwargs=True)
            ],
            backend,
        )
        self.assertEqual(frames, 2)


instantiate_parametrized_tests(HooksRegisteredOutsideTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
