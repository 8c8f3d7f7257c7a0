# Owner(s): ["module: dynamo"]
"""Consecutive graph inputs that index one guarded list the same way are loaded with
one slice and a C-level map before the graph (PyCodegen._graph_input_runs), not with
one subscript and one temporary per input."""

import dis
import inspect

import torch
import torch._dynamo.test_case
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import guard_failures

try:
    from .test_codegen_dict_keys import instructions, make_params, MomentumSGD, set_grads
except ImportError:
    from test_codegen_dict_keys import instructions, make_params, MomentumSGD, set_grads


def codes_of(fn):
    return [entry.code for entry in _debug_get_cache_entry_list(inspect.unwrap(fn).__code__)]


def count(code, opname):
    return sum(1 for ins in dis.get_instructions(code) if ins.opname == opname)


class GraphInputRunsTests(torch._dynamo.test_case.TestCase):
    # Dynamo's default graph input order (the test case canonicalizes it: inputs sorted
    # by name, so [10] comes before [2] and the runs of inputs break every ten).
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._exit_stack.enter_context(torch._dynamo.config.patch(canonicalize_output_graph_node_order=False))

    def step_both(self, make_opt, n, steps, frames):
        """Step an optimizer eagerly and compiled over n params, comparing parameters and
        state after every step; return the compiled step's transformed codes."""
        eager_params, compiled_params = make_params(n), make_params(n)
        eager, compiled = make_opt(eager_params), make_opt(compiled_params)
        cnt = CompileCounter()
        step = torch.compile(compiled.step, backend=cnt)
        for i in range(steps):
            set_grads(eager_params, i)
            set_grads(compiled_params, i)
            eager.step()
            step()
            self.assertEqual(eager_params, compiled_params)
            self.assertEqual(len(eager.state), len(compiled.state))
            for pe, pc in zip(eager_params, compiled_params):
                self.assertEqual(eager.state[pe], compiled.state[pc])
        self.assertEqual(cnt.frame_count, frames)
        return codes_of(type(compiled).step)

    def test_init_values_once_step_bytecode_does_not_grow(self):
        # The params, their grads and their momentum buffers: three slices, however
        # many parameters; no temporary per parameter.
        (small,) = self.step_both(MomentumSGD, 1000, 3, frames=1)
        torch._dynamo.reset()
        (large,) = self.step_both(MomentumSGD, 2000, 3, frames=1)
        self.assertEqual(len(instructions(small)), len(instructions(large)))
        self.assertLess(len(instructions(large)), 200)
        self.assertEqual(count(large, "CALL_FUNCTION_EX"), 1)
        self.assertEqual(count(large, "LIST_EXTEND"), count(small, "LIST_EXTEND"))
        self.assertEqual(count(large, "BUILD_SLICE"), 3)
        # Passed as one list (*args), not pushed one by one: the frame's stack does
        # not grow with N either.
        self.assertEqual(small.co_stacksize, large.co_stacksize)

    def test_torch_optim(self):
        for make_opt, frames in (
            (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True), 2),
            (lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True), 1),
            (lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False), 1),
        ):
            with self.subTest(opt=make_opt([torch.nn.Parameter(torch.ones(1))]).__class__.__name__):
                torch._dynamo.reset()
                codes = self.step_both(make_opt, 40, 3, frames)
                self.assertTrue(any(count(c, "BUILD_SLICE") for c in codes))

    def test_element_replaced_from_outside_is_loaded(self):
        # The slice is taken at each call: a list element swapped for another tensor
        # of the same metadata (the guards pass) is the one the graph gets.
        def fn(xs):
            return torch._foreach_mul(xs, 2.0)

        xs = [torch.randn(3) for _ in range(12)]
        cnt = CompileCounter()
        opt_fn = torch.compile(fn, backend=cnt)
        self.assertEqual(opt_fn(xs), fn(xs))
        xs[5] = torch.randn(3)
        xs[11] = torch.randn(3)
        self.assertEqual(opt_fn(xs), fn(xs))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(count(codes_of(fn)[0], "BUILD_SLICE"), 1)

    def test_without_runtime_overhead_markers(self):
        # The list of inputs is built with nothing else on the stack either way.
        with torch._dynamo.config.patch(record_runtime_overhead=False):
            (code,) = self.step_both(MomentumSGD, 30, 2, frames=1)
        self.assertEqual(count(code, "BUILD_SLICE"), 3)
        self.assertEqual(count(code, "CALL_FUNCTION_EX"), 1)

    def test_length_change_recompiles_with_length_reason(self):
        def fn(xs):
            return torch._foreach_add(xs, 1.0)

        xs = [torch.randn(3) for _ in range(10)]
        cnt = CompileCounter()
        opt_fn = torch.compile(fn, backend=cnt)
        self.assertEqual(opt_fn(xs), fn(xs))
        xs.append(torch.randn(3))
        self.assertEqual(opt_fn(xs), fn(xs))
        self.assertEqual(cnt.frame_count, 2)
        reasons = [str(r) for r in guard_failures[fn.__code__]]
        self.assertTrue(any("len(xs) == 10" in r for r in reasons), reasons)

    def test_part_of_a_list(self):
        # Inputs xs[2] ... xs[13] of a longer list: the slice 2:14.
        def fn(xs):
            return [x * 3 for x in xs[2:14]], xs[0] + 1

        xs = [torch.randn(2) for _ in range(16)]
        cnt = CompileCounter()
        opt_fn = torch.compile(fn, backend=cnt)
        self.assertEqual(opt_fn(xs), fn(xs))
        xs[13] = torch.randn(2)
        self.assertEqual(opt_fn(xs), fn(xs))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(count(codes_of(fn)[0], "BUILD_SLICE"), 1)

    def test_tuple_and_chained_accesses(self):
        # Steps after the index: an attribute, then a constant key; on a tuple.
        class Holder:
            def __init__(self, t):
                self.d = {"t": t, "other": torch.zeros(1)}

        def fn(hs):
            return [h.d["t"] + 1 for h in hs]

        hs = tuple(Holder(torch.randn(2)) for _ in range(9))
        cnt = CompileCounter()
        opt_fn = torch.compile(fn, backend=cnt)
        self.assertEqual(opt_fn(hs), fn(hs))
        hs[4].d["t"] = torch.randn(2)
        self.assertEqual(opt_fn(hs), fn(hs))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(count(codes_of(fn)[0], "BUILD_SLICE"), 1)

    def test_module_list_parameters(self):
        # A list of modules: each weight is L['mods'][i]._parameters['weight'].
        mods = [torch.nn.Linear(2, 2, bias=False) for _ in range(10)]

        def fn(mods, x):
            return [m(x) for m in mods]

        x = torch.randn(2)
        cnt = CompileCounter()
        opt_fn = torch.compile(fn, backend=cnt)
        self.assertEqual(opt_fn(mods, x), fn(mods, x))
        with torch.no_grad():
            mods[7].weight.mul_(2)
        self.assertEqual(opt_fn(mods, x), fn(mods, x))
        self.assertEqual(cnt.frame_count, 1)
        # UnspecializedParamBufferSource loads `._parameters` as AttrSource does.
        self.assertEqual(count(codes_of(fn)[0], "BUILD_SLICE"), 1)

    def test_float_passed_as_tensor_next_to_a_run(self):
        # A module float the frame mutates is a graph input made a tensor before the
        # call (torch._as_tensor_fullprec); the run after it still lines up.
        class Decay(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.temp = 1.0

            def forward(self, xs):
                self.temp = self.temp * 0.5 + 0.25
                return [x * self.temp for x in xs]

        eager, compiled = Decay(), Decay()
        cnt = CompileCounter()
        opt = torch.compile(compiled, backend=cnt)
        for _ in range(3):
            xs = [torch.randn(2) for _ in range(10)]
            self.assertEqual(opt(xs), eager(xs), atol=0, rtol=0)
            self.assertEqual(compiled.temp, eager.temp)
        self.assertEqual(cnt.frame_count, 1)
        (code,) = codes_of(Decay.forward)
        self.assertEqual(count(code, "BUILD_SLICE"), 1)
        self.assertEqual(count(code, "LIST_APPEND"), 1)  # the float, as a tensor

    def test_negative_indices_are_not_a_run(self):
        # xs[-2], xs[-1] are not the slice xs[-2:0]: a source with a negative index
        # is loaded on its own.
        from torch._dynamo.codegen import PyCodegen
        from torch._dynamo.source import GetItemSource, GradSource, LocalSource

        element = PyCodegen._graph_input_element
        xs = LocalSource("xs")
        self.assertIsNone(element(None, GetItemSource(xs, -1)))
        self.assertEqual(element(None, GetItemSource(xs, 3)), (xs, False, 3, ()))
        self.assertEqual(
            element(None, GradSource(GetItemSource(xs, 3), "grad")), (xs, False, 3, (("attr", "grad"),))
        )

    def test_short_run_loads_each_input(self):
        def fn(xs):
            return torch._foreach_mul(xs, 2.0)

        xs = [torch.randn(3) for _ in range(4)]
        cnt = CompileCounter()
        self.assertEqual(torch.compile(fn, backend=cnt)(xs), fn(xs))
        self.assertEqual(count(codes_of(fn)[0], "CALL_FUNCTION_EX"), 0)

    def test_list_subclass_is_not_sliced(self):
        # Slicing a list subclass may not give its elements (__getitem__ overridden):
        # its inputs are loaded one by one, as without this patch.
        class Rotated(list):
            def __getitem__(self, i):
                if isinstance(i, slice):
                    raise AssertionError("sliced")
                return list.__getitem__(self, i)

        def fn(xs):
            return torch._foreach_mul(list(xs), 2.0)

        xs = Rotated(torch.randn(2) for _ in range(10))
        cnt = CompileCounter()
        opt_fn = torch.compile(fn, backend=cnt)
        self.assertEqual(opt_fn(xs), fn(xs))
        xs[3] = torch.randn(2)
        self.assertEqual(opt_fn(xs), fn(xs))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(count(codes_of(fn)[0], "BUILD_SLICE"), 0)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
