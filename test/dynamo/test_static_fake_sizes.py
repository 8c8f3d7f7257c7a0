# Owner(s): ["module: dynamo"]
"""Fake tensors of inputs with static shapes skip ShapeEnv's per-dimension symbol setup."""

import contextlib
import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch.fx.experimental.symbolic_shapes import ShapeEnv


def step(tensors):
    with torch.no_grad():
        torch._foreach_mul_(tensors, 0.5)
    return tensors[0].sum()


def count_create_symbol():
    calls = []
    original = ShapeEnv.create_symbol

    def counting(self, *args, **kwargs):
        calls.append(args[0] if args else kwargs.get("val"))
        return original(self, *args, **kwargs)

    return calls, unittest.mock.patch.object(ShapeEnv, "create_symbol", counting)


def compile_and_check(test, make_inputs, calls=3, **config):
    """Compile `step` over the inputs `make_inputs(i)` gives for call i, compare
    with eager, and return the frame count and the recompile reasons."""
    counter = torch._dynamo.testing.CompileCounter()
    with torch._dynamo.config.patch(**config):
        compiled = torch.compile(step, backend=counter)
        for i in range(calls):
            compiled_inputs, eager_inputs = make_inputs(i), make_inputs(i)
            test.assertEqual(compiled(compiled_inputs), step(eager_inputs))
            test.assertEqual(compiled_inputs, eager_inputs)
        reasons = list(torch._dynamo.utils.guard_failures[step.__code__])
    return counter.frame_count, reasons


EXPECTED_REASONS = {
    "stride": "0/0: tensors[0]: stride[0] changed 4 -> 1",
    "dtype": "0/0: tensors[0]: dtype changed float32 -> float64",
    "requires_grad": "0/0: tensors[0]: requires_grad changed False -> True",
    "size": "0/0: tensors[0]: size[1] changed 4 -> 5",
}
AUTOMATIC_DYNAMIC_REASON = "0/0: tensor 'tensors[0]' size mismatch at index 0. expected 4, actual 5"


class StaticFakeSizesTests(torch._dynamo.test_case.TestCase):
    def test_no_symbol_setup_for_static_inputs(self):
        # 1,000 same-shaped static tensors: the sizes need no symbol at all.
        # Without this patch: one create_symbol call for both sizes and the offset of
        # every tensor (the strides follow from the sizes), 3,000.
        tensors = [torch.randn(4, 4) for _ in range(1000)]
        torch._dynamo.reset()
        calls, patch = count_create_symbol()
        with patch:
            counter = torch._dynamo.testing.CompileCounter()
            expected = step([t.clone() for t in tensors])
            actual = torch.compile(step, backend=counter)(tensors)
        self.assertEqual(actual, expected)
        self.assertEqual(tensors, [t.clone() for t in tensors])
        self.assertEqual(counter.frame_count, 1)
        self.assertEqual(calls, [])

    def test_dynamic_inputs_still_get_symbols(self):
        torch._dynamo.reset()
        x = torch.randn(5, 4)
        torch._dynamo.mark_dynamic(x, 0)
        counter = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(lambda t: t * 2, backend=counter)
        calls, patch = count_create_symbol()
        with patch:
            self.assertEqual(compiled(x), x * 2)
            y = torch.randn(7, 4)
            self.assertEqual(compiled(y), y * 2)
        self.assertIn(5, calls)
        self.assertEqual(counter.frame_count, 1)

    def test_guards_still_catch_metadata_changes(self):
        # Each later call changes one property of the first tensor: the guards of a
        # fast-path fake tensor must catch it, with the reason TENSOR_MATCH gives.
        def make(change):
            def inputs(i):
                torch.manual_seed(0)
                tensors = [torch.randn(4, 4) for _ in range(20)]
                if i == 0:
                    return tensors
                first = tensors[0]
                if change == "stride":
                    tensors[0] = first.t().contiguous().t()
                elif change == "dtype":
                    tensors = [t.double() for t in tensors]
                elif change == "requires_grad":
                    tensors[0] = first.requires_grad_()
                elif change == "size":
                    tensors[0] = torch.randn(4, 5)
                return tensors

            return inputs

        for change, reason in EXPECTED_REASONS.items():
            torch._dynamo.reset()
            torch._dynamo.utils.guard_failures.clear()
            result = compile_and_check(self, make(change), calls=2, automatic_dynamic_shapes=False)
            with self.subTest(change=change):
                self.assertEqual(result, (2, [reason]))

    def test_automatic_dynamic_recompile_matches(self):
        # A size change marks the dimension dynamic on the recompile: same frames,
        # same reasons, and the recompiled frame serves a third size.
        def inputs(i):
            return [torch.ones(4 + i, 4) for _ in range(3)]

        torch._dynamo.reset()
        torch._dynamo.utils.guard_failures.clear()
        self.assertEqual(compile_and_check(self, inputs, calls=3), (2, [AUTOMATIC_DYNAMIC_REASON]))

    def test_free_symbols_of_static_and_symbolic_fakes(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import free_symbols, has_free_symbols

        mode = FakeTensorMode(shape_env=ShapeEnv())
        static = mode.from_tensor(torch.randn(3, 4), static_shapes=True)
        symbolic = mode.from_tensor(torch.randn(3, 4))
        with mode:
            static_view = static.t()[1:]
            offset_view = symbolic[1:]  # its storage offset is symbolic too
        sizes_read = []
        real_size = type(static).size

        def counting_size(t, *args):
            sizes_read.append(t)
            return real_size(t, *args)

        with unittest.mock.patch.object(type(static), "size", counting_size):
            self.assertFalse(has_free_symbols(static))
            self.assertFalse(has_free_symbols(static_view))
            # Without this patch a static tensor's sizes, strides and offset are walked.
            self.assertEqual(sizes_read, [])
            self.assertTrue(has_free_symbols(symbolic))
        expected = {str(s) for s in symbolic.shape}
        self.assertEqual({str(s) for s in free_symbols(symbolic)}, expected)
        self.assertEqual({str(s) for s in free_symbols(offset_view)}, expected)
        self.assertEqual(free_symbols(static_view), set())


    def test_produce_guards_skips_static_tensors(self):
        # Static tensors among the placeholders: the same guards, the same roots
        # recorded through source_ref, but one source_ref per static tensor instead of
        # one per size, stride and offset (5 for a 4x4 tensor without this patch).
        from torch._dynamo.source import LocalSource
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental import symbolic_shapes

        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        placeholders = [mode.from_tensor(torch.randn(4, 4), static_shapes=True) for _ in range(3)]
        placeholders.append(mode.from_tensor(torch.randn(5, 4)))  # symbolic sizes
        sources = [LocalSource(f"t{i}") for i in range(len(placeholders))]

        def produce(general):
            refs = []

            def source_ref(source):
                refs.append(source.name)
                return source.name

            # The general path: no tensor is taken as static.
            patch = (
                unittest.mock.patch.object(symbolic_shapes, "_is_static_unconstrained", return_value=False)
                if general
                else contextlib.nullcontext()
            )
            with patch:
                helpers = shape_env.produce_guards_verbose(placeholders, sources, source_ref=source_ref)
            return [h.exprs for h in helpers], refs

        fast_guards, fast_refs = produce(general=False)
        general_guards, general_refs = produce(general=True)
        self.assertEqual(fast_guards, general_guards)
        self.assertTrue(any("L['t3']" in expr for expr in fast_guards[0]))
        root = torch._dynamo.guards.strip_function_call
        self.assertEqual({root(r) for r in fast_refs}, {root(r) for r in general_refs})
        self.assertEqual([r for r in fast_refs if r.startswith("L['t0']")], ["L['t0'].storage_offset()"])
        self.assertEqual(len([r for r in general_refs if r.startswith("L['t0']")]), 5)
        self.assertEqual(
            [r for r in fast_refs if r.startswith("L['t3']")], [r for r in general_refs if r.startswith("L['t3']")]
        )


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
