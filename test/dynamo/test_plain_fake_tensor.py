# Owner(s): ["module: dynamo"]
"""MetaConverter builds the fake tensor of a plain dense tensor without describing it.

The reference is MetaConverter's general path, taken by every tensor when
convert_plain_tensor is patched to decline (general_path_only)."""

import contextlib
import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.source import LocalSource
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.meta_utils import MetaConverter
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)
from torch.multiprocessing.reductions import StorageWeakRef


def static_context(t):
    return StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC] * t.dim())


def count_general_path():
    """Calls of MetaConverter's general path (meta_tensor: one per tensor, grads included)."""
    calls = []
    original = MetaConverter.meta_tensor

    def counting(self, desc, *args, **kwargs):
        calls.append(desc)
        return original(self, desc, *args, **kwargs)

    return calls, unittest.mock.patch.object(MetaConverter, "meta_tensor", counting)


def general_path_only(fast=False):
    """Unless `fast`, every tensor takes MetaConverter's general path, as without the patch."""
    if fast:
        return contextlib.nullcontext()
    return unittest.mock.patch("torch._subclasses.plain_meta_tensor.convert_plain_tensor", lambda *args: None)


def fakeify(tensors, fast, shape_env=True):
    """Fake tensors of `tensors` in one FakeTensorMode, and how many took the general path."""
    calls, patch = count_general_path()
    with patch, general_path_only(fast):
        mode = FakeTensorMode(shape_env=ShapeEnv() if shape_env else None)
        fakes = [
            mode.from_tensor(t, source=LocalSource(f"t{i}"), symbolic_context=static_context(t) if shape_env else None)
            for i, t in enumerate(tensors)
        ]
    return fakes, len(calls)


def metadata(fake):
    """Everything a fake tensor carries that Dynamo and AOTAutograd read."""
    assert isinstance(fake, FakeTensor), type(fake)
    grad = fake.grad if fake.is_leaf else None  # a non-leaf has no .grad to read
    return (
        type(fake),
        tuple(fake.shape),
        fake.stride(),
        fake.storage_offset(),
        fake.dtype,
        fake.device,
        fake.requires_grad,
        fake.is_leaf,
        getattr(fake, "_is_param", False),
        fake.untyped_storage().nbytes(),
        fake.is_contiguous(),
        None if grad is None else metadata(grad),
    )


def storages(fakes):
    """Which fakes share a storage: the index of the first fake with the same one."""
    refs = [StorageWeakRef(f.untyped_storage()) for f in fakes]
    return [refs.index(r) for r in refs]


def plain_tensors():
    param = torch.nn.Parameter(torch.randn(4, 4))
    param.grad = torch.randn(4, 4)
    frozen = torch.nn.Parameter(torch.randn(3), requires_grad=False)
    leaf = torch.randn(2, 3, requires_grad=True)
    leaf.grad = torch.ones(2, 3)
    column_major = torch.empty_strided((4, 3), (1, 4))  # not a view, strides kept
    return [
        param,
        frozen,
        leaf,
        column_major,
        torch.randn(()),
        torch.arange(6, dtype=torch.int64).reshape(2, 3).clone(),
        torch.zeros(5, dtype=torch.bool),
        torch.randn(1, 0, 3),  # zero elements, but a storage of... none: general path
    ]


class PlainFakeTensorTests(torch._dynamo.test_case.TestCase):
    def test_same_fake_tensors_as_general_path(self):
        tensors = plain_tensors()
        for shape_env in (True, False):
            fast, fast_described = fakeify(tensors, True, shape_env)
            general, general_described = fakeify(tensors, False, shape_env)
            self.assertEqual([metadata(f) for f in fast], [metadata(f) for f in general])
            # Without the fast path every tensor and grad takes the general path; with
            # it only the empty one (no storage bytes: the general path resizes it).
            self.assertEqual(general_described, len(tensors) + 2)
            self.assertEqual(fast_described, 1)

    def test_memo_and_aliasing(self):
        base = torch.randn(4, 4)
        alias = torch.empty(0).set_(base.untyped_storage(), 0, (4, 4), (4, 1))
        other = torch.randn(4, 4)
        param = torch.nn.Parameter(torch.randn(2, 2))
        param.grad = torch.randn(2, 2)
        tensors = [base, alias, other, param, param.grad, base]
        for fast in (True, False):
            fakes, _ = fakeify(tensors, fast)
            # The alias shares the first tensor's fake storage (the general path's
            # set_(), since its storage is in the memo), the grad converted with its
            # parameter is the same fake as the grad converted on its own, and a tensor
            # converted twice is one fake.
            self.assertEqual(storages(fakes), [0, 0, 2, 3, 4, 0])
            self.assertIs(fakes[3].grad, fakes[4])
            self.assertIs(fakes[0], fakes[5])

    def test_general_path_for_other_tensors(self):
        base = torch.randn(4, 4)
        buffer = torch.nn.Buffer(torch.randn(3))
        others = {
            "view": base[1:],
            "transposed view": base.t(),
            "storage offset": torch.empty(0).set_(torch.randn(20).untyped_storage(), 4, (4,), (1,)),
            "subclass": torch.nn.Parameter(torch.randn(2)).as_subclass(type("Sub", (torch.Tensor,), {})),
            "non-leaf": torch.randn(3, requires_grad=True) * 2,
            "conj": torch.randn(3, dtype=torch.complex64).conj(),
            "inference": _inference_tensor(),
            "buffer": buffer,
            "grad needing grad": _param_with_grad_requiring_grad(),
            "nested tensor offsets": _nested_tensor_offsets(),
        }
        for name, t in others.items():
            with self.subTest(name):
                fast, fast_described = fakeify([t], True)
                general, general_described = fakeify([t], False)
                self.assertEqual(fast_described, general_described)
                self.assertGreater(fast_described, 0)
                self.assertEqual(metadata(fast[0]), metadata(general[0]))

    def test_dynamic_sizes_take_general_path(self):
        t = torch.randn(4, 4)
        calls, patch = count_general_path()
        with patch:
            mode = FakeTensorMode(shape_env=ShapeEnv())
            ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
            fake = mode.from_tensor(t, source=LocalSource("t"), symbolic_context=ctx)
        self.assertEqual(len(calls), 1)
        self.assertIsInstance(fake.shape[0], torch.SymInt)

    def test_compiled_step_same_with_and_without(self):
        def step(params, bufs):
            with torch.no_grad():
                grads = [p.grad for p in params]
                torch._foreach_add_(bufs, grads)
                torch._foreach_add_(params, bufs, alpha=-0.1)
            return params[0].sum()

        def make():
            torch.manual_seed(0)
            params = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(20)]
            for p in params:
                p.grad = torch.randn(4, 4)
            return params, [torch.zeros(4, 4) for _ in range(20)]

        results = {}
        for fast in (True, False):
            torch._dynamo.reset()
            counter = torch._dynamo.testing.CompileCounter()
            calls, patch = count_general_path()
            with patch, general_path_only(fast):
                compiled = torch.compile(step, backend=counter)
                params, bufs = make()
                eager_params, eager_bufs = make()
                outs = []
                for i in range(3):
                    if i == 2:
                        # A grad of another shape: the same recompile either way.
                        params[0].grad = eager_params[0].grad = torch.randn(4, 4).t().contiguous()
                        bufs[0] = torch.zeros(4, 4)
                        eager_bufs[0] = torch.zeros(4, 4)
                    outs.append(compiled(params, bufs))
                    self.assertEqual(outs[-1], step(eager_params, eager_bufs))
                    self.assertEqual(params, eager_params)
                    self.assertEqual(bufs, eager_bufs)
                reasons = list(torch._dynamo.utils.guard_failures[step.__code__])
            results[fast] = (counter.frame_count, counter.op_count, reasons, len(calls))
        fast_frames, fast_ops, fast_reasons, fast_described = results[True]
        self.assertEqual((fast_frames, fast_ops, fast_reasons), results[False][:3])
        self.assertEqual(fast_frames, 1)
        # Without the fast path every param, grad and buffer is described.
        self.assertEqual(results[False][3], 60)
        self.assertEqual(fast_described, 0)

    def test_aliased_inputs_compile_as_without(self):
        # AOTAutograd finds input aliasing from the fake tensors' storages: two inputs
        # over one storage must get fakes over one fake storage.
        def f(a, b):
            a.add_(1)
            return b * 2

        def aliased():
            base = torch.zeros(4)
            return base, torch.empty(0).set_(base.untyped_storage(), 0, (4,), (1,))

        for fast in (True, False):
            torch._dynamo.reset()
            counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
            with general_path_only(fast):
                a, b = aliased()
                eager_a, eager_b = aliased()
                self.assertEqual(torch.compile(f, backend=counter)(a, b), f(eager_a, eager_b))
                self.assertEqual((a, b), (eager_a, eager_b))
                self.assertEqual(counter.frame_count, 1)
            graph = counter.graphs[0]
            # Both inputs are placeholders of one graph whose output reads the mutation.
            self.assertEqual(len(graph.graph.find_nodes(op="placeholder")), 2)


    def test_nested_tensor_built_in_graph_from_its_offsets(self):
        # The offsets of a nested tensor carry its nested int: the fake of the offsets
        # passed on their own must share it with the nested tensor's, or `nt * nt2`
        # fails with shapes (3, s0, 5) and (3, s1, 5). Without this patch the offsets
        # took the fast path and lost it.
        def f(nt, values, offsets):
            nt2 = torch.nested.nested_tensor_from_jagged(values, offsets)
            return nt * nt2

        values = torch.randn(10, 5)
        offsets = torch.tensor([0, 2, 6, 10])
        nt = torch.nested.nested_tensor_from_jagged(values, offsets)
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        actual = torch.compile(f, backend=counter, fullgraph=True)(nt, values, offsets)
        self.assertEqual(actual.values(), f(nt, values, offsets).values())
        self.assertEqual(counter.frame_count, 1)


def _inference_tensor():
    with torch.inference_mode():
        return torch.randn(3)


def _nested_tensor_offsets():
    offsets = torch.tensor([0, 2, 6, 10])
    torch.nested.nested_tensor_from_jagged(torch.randn(10, 5), offsets)
    return offsets


def _param_with_grad_requiring_grad():
    p = torch.nn.Parameter(torch.randn(3))
    p.grad = torch.randn(3, requires_grad=True)
    return p


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
