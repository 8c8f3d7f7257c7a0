# Owner(s): ["module: dynamo"]
"""A fake foreach op runs its meta kernel once per class of elements with equal metadata."""

import contextlib
import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.testing._internal.common_methods_invocations import (
    foreach_binary_op_db,
    foreach_other_op_db,
    foreach_pointwise_op_db,
    foreach_reduce_op_db,
    foreach_unary_op_db,
)
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize
from torch.utils._pytree import tree_map_only


def every_element():
    """Run the meta kernel of every element, as without this patch."""
    return unittest.mock.patch.object(fake_impls, "_foreach_element_classes", return_value=None)


def elements_run():
    """Record the element indices each per-class meta run is given."""
    return unittest.mock.patch.object(fake_impls, "_foreach_elements_at", wraps=fake_impls._foreach_elements_at)


def metadata(t):
    return (
        type(t),
        t.shape,
        t.stride(),
        t.dtype,
        t.device,
        t.storage_offset(),
        t.untyped_storage().nbytes(),
        t.requires_grad,
        t.is_conj(),
        t.is_neg(),
        t._version,
    )


def mixed_tensors():
    """Runs of equal metadata broken by other dtypes, strides, sizes and a 0-d tensor."""
    return [
        torch.randn(4, 4),
        torch.randn(4, 4),
        torch.randn(4, 4, dtype=torch.float64),
        torch.randn(4, 4).t(),
        torch.randn(4, 4),
        torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),
        torch.randn(()),
        torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),
        torch.randn(3),
        torch.randn(4, 4, dtype=torch.float64),
    ]


# (op, arguments given the fake lists xs and ys, both of mixed_tensors()' layout)
OUT_OF_PLACE = {
    "sqrt": lambda xs, ys: torch._foreach_sqrt(xs),
    "pow_scalar_and_tensor": lambda xs, ys: torch._foreach_pow(0.9, xs),
    "add_list": lambda xs, ys: torch._foreach_add(xs, ys, alpha=2),
    "mul_scalar": lambda xs, ys: torch._foreach_mul(xs, 3),
    "mul_scalar_list": lambda xs, ys: torch._foreach_mul(xs, [2.0] * 5 + [3] * 5),
    "addcmul": lambda xs, ys: torch._foreach_addcmul(xs, ys, ys, 0.5),
    "lerp": lambda xs, ys: torch._foreach_lerp(xs, ys, 0.1),
    "norm": lambda xs, ys: torch._foreach_norm(xs),
}
IN_PLACE = {
    "sqrt_": lambda xs, ys: torch._foreach_sqrt_(xs),
    "reciprocal_": lambda xs, ys: torch._foreach_reciprocal_(xs),
    "add_list_": lambda xs, ys: torch._foreach_add_(xs, ys),
    "mul_scalar_list_": lambda xs, ys: torch._foreach_mul_(xs, [2.0] * 10),
    "addcdiv_": lambda xs, ys: torch._foreach_addcdiv_(xs, ys, ys, 0.5),
    "lerp_": lambda xs, ys: torch._foreach_lerp_(xs, ys, 0.1),
    "copy_": lambda xs, ys: torch._foreach_copy_(xs, ys),
}


def run_fake(op, shape_env=None):
    """The op over fakes of mixed_tensors(); its outputs' and inputs' metadata."""
    torch.manual_seed(0)
    mode = FakeTensorMode(shape_env=shape_env)
    xs = [mode.from_tensor(t) for t in mixed_tensors()]
    ys = [mode.from_tensor(t.clone()) for t in mixed_tensors()]
    with mode:
        out = op(xs, ys)
    return (
        None if out is None else [metadata(t) for t in out],
        [metadata(t) for t in xs + ys],
        out,
    )


class ForeachMetaPerClassTests(torch._dynamo.test_case.TestCase):
    def test_classes_of_mixed_elements(self):
        mode = FakeTensorMode()
        xs = [mode.from_tensor(t) for t in mixed_tensors()]
        representatives, element_class = fake_impls._foreach_element_classes(len(xs), (xs,), {})
        self.assertEqual(representatives, [0, 2, 3, 5, 6, 8])
        self.assertEqual(element_class, [0, 0, 1, 2, 0, 3, 4, 3, 5, 1])
        # A scalar list splits classes by value and type; other lists by their items.
        scalars = [2.0] * 4 + [3.0] + [2.0] * 3 + [2] * 2
        representatives, element_class = fake_impls._foreach_element_classes(len(xs), (xs, scalars), {})
        self.assertEqual(representatives, [0, 2, 3, 4, 5, 6, 8, 9])
        self.assertEqual(element_class, [0, 0, 1, 2, 3, 4, 5, 4, 6, 7])

    def test_no_classes_when_nothing_repeats_or_is_unknown(self):
        mode = FakeTensorMode()
        xs = [mode.from_tensor(torch.randn(n)) for n in range(1, 4)]
        self.assertIsNone(fake_impls._foreach_element_classes(3, (xs,), {}))
        same = [mode.from_tensor(torch.randn(2)) for _ in range(3)]
        # Lists of other lengths: the meta kernel reports them.
        self.assertIsNone(fake_impls._foreach_element_classes(3, (same, same[:2]), {}))
        # Real (not fake) tensors and objects that are no numbers have no key.
        self.assertIsNone(fake_impls._foreach_element_classes(3, (same, [torch.ones(2)] * 3), {}))
        self.assertIsNone(fake_impls._foreach_element_classes(3, (same, ["a"] * 3), {}))
        # A tensor of per-element values (addcdiv's `scalars`) is indexed by element;
        # a 0-d tensor is one value for all.
        scalars = mode.from_tensor(torch.randn(3))
        self.assertIsNone(fake_impls._foreach_element_classes(3, (same, same, same, scalars), {}))
        self.assertEqual(
            fake_impls._foreach_element_classes(3, (same, mode.from_tensor(torch.tensor(2.0))), {}),
            ([0], [0, 0, 0]),
        )
        self.assertIsNone(fake_impls._foreach_element_classes(1, (same[:1],), {}))

    def test_symbolic_sizes_run_every_element(self):
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC])
        xs = [mode.from_tensor(torch.randn(5), symbolic_context=context) for _ in range(3)]
        self.assertIsNone(fake_impls._foreach_element_classes(3, (xs,), {}))
        with elements_run() as run, mode:
            out = torch._foreach_sqrt(xs)
        run.assert_not_called()
        self.assertEqual([o.shape for o in out], [x.shape for x in xs])

    @parametrize("name", sorted(OUT_OF_PLACE))
    def test_out_of_place_outputs_as_every_element(self, name):
        with elements_run() as run:
            outputs, inputs, out = run_fake(OUT_OF_PLACE[name])
        self.assertTrue(run.called)
        with every_element():
            expected_outputs, expected_inputs, _ = run_fake(OUT_OF_PLACE[name])
        self.assertEqual(outputs, expected_outputs)
        self.assertEqual(inputs, expected_inputs)
        # Every output owns its storage, as each element's own kernel result does.
        storages = {t.untyped_storage()._cdata for t in out}
        self.assertEqual(len(storages), len(out))

    @parametrize("name", sorted(IN_PLACE))
    def test_in_place_checks_once_per_class(self, name):
        with elements_run() as run:
            outputs, inputs, _ = run_fake(IN_PLACE[name])
        with every_element():
            expected_outputs, expected_inputs, _ = run_fake(IN_PLACE[name])
        # The binding returns the self list.
        self.assertEqual(outputs, expected_outputs)
        self.assertEqual(outputs, inputs[:10])
        self.assertEqual(inputs, expected_inputs)
        # The meta kernel saw the six classes' first elements.
        self.assertEqual(run.call_args_list[0].args[1], [0, 2, 3, 5, 6, 8])

    def test_fresh_dense_results_only_are_copied(self):
        # Other elements get an empty_strided like their class's result only when that
        # result is what empty_strided gives; anything else runs every element.
        fresh = torch.empty(4, 4, device="meta")
        self.assertTrue(fake_impls._is_fresh_dense_meta(fresh))
        self.assertTrue(fake_impls._is_fresh_dense_meta(torch.empty_strided((4, 2), (1, 4), device="meta")))
        self.assertFalse(fake_impls._is_fresh_dense_meta(fresh[1:]))
        self.assertFalse(fake_impls._is_fresh_dense_meta(fresh.t()))
        self.assertFalse(fake_impls._is_fresh_dense_meta(torch.empty(1, device="meta").expand(4)))
        self.assertFalse(fake_impls._is_fresh_dense_meta(torch.empty(8, device="meta")[:4].clone().resize_(2)))
        self.assertFalse(fake_impls._is_fresh_dense_meta(torch.empty(2, device="meta", dtype=torch.complex64).conj()))

    def test_errors_of_a_later_class_still_raised(self):
        mode = FakeTensorMode()

        def check(op, message):
            for patch in (every_element, contextlib.nullcontext):
                xs = [mode.from_tensor(torch.randn(3)) for _ in range(3)]
                xs.append(mode.from_tensor(torch.zeros(3, dtype=torch.long)))
                ys = [mode.from_tensor(torch.randn(3)) for _ in range(3)]
                ys.append(mode.from_tensor(torch.randn(2, 3)))
                with patch(), mode, self.assertRaisesRegex(RuntimeError, message):
                    op(xs, ys)

        # The last element's dtype and broadcast shape differ from the first three's.
        check(lambda xs, ys: torch._foreach_sqrt_(xs), "can't be cast")
        check(
            lambda xs, ys: torch._foreach_add_(xs[:3] + xs[:1], ys),
            "doesn't match the broadcast shape",
        )

    def test_foreach_opinfo_samples_as_every_element(self):
        # Every foreach OpInfo's float32 and int64 samples, each list doubled by equal
        # copies so that classes form: the same outputs, inputs and errors as running
        # every element.
        def fake_run(variant, sample, patch):
            mode = FakeTensorMode()
            length = len(sample.input)

            def doubled(x):
                if isinstance(x, (list, tuple)) and len(x) == length:
                    return type(x)([*x, *(t.clone() if isinstance(t, torch.Tensor) else t for t in x)])
                return x

            def fake(x):
                return tree_map_only(torch.Tensor, mode.from_tensor, doubled(x))

            inputs = fake(sample.input)
            args = tuple(fake(a) for a in sample.args)
            kwargs = {k: fake(v) for k, v in sample.kwargs.items()}
            with patch, mode:
                try:
                    out = variant(inputs, *args, **kwargs)
                except Exception as e:  # errors are compared too
                    return ("error", type(e), str(e))
            return tree_map_only(torch.Tensor, metadata, (out, inputs, args, kwargs))

        ops = (
            foreach_unary_op_db
            + foreach_binary_op_db
            + foreach_pointwise_op_db
            + foreach_reduce_op_db
            + foreach_other_op_db
        )
        differences, per_class = [], 0
        for op in ops:
            for dtype in (torch.float32, torch.int64):
                if dtype not in op.dtypes:
                    continue
                for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
                    for variant in (op.method_variant, op.inplace_variant):
                        if variant is None:
                            continue
                        expected = fake_run(variant, sample, every_element())
                        with elements_run() as run:
                            actual = fake_run(variant, sample, contextlib.nullcontext())
                        per_class += run.called
                        if actual != expected:
                            differences.append((op.name, dtype, variant, actual, expected))
        self.assertEqual(differences, [])
        self.assertEqual(per_class, 548)  # torch 2.15.0's foreach OpInfo samples

    def test_compiled_foreach_steps(self):
        # A foreach Adam step over parameters of three shapes, every backend users run.
        def make():
            torch.manual_seed(0)
            params = [torch.nn.Parameter(torch.randn(shape)) for shape in [(4, 4)] * 5 + [(3,)] * 4 + [(2, 3, 2)] * 3]
            return params, torch.optim.Adam(params, lr=0.01, foreach=True)

        for backend in ("eager", "aot_eager", "inductor"):
            torch._dynamo.reset()
            params, opt = make()
            eager_params, eager_opt = make()
            counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
            step = torch.compile(opt.step, backend=counter)
            for i in range(3):
                for p, e in zip(params, eager_params):
                    p.grad = torch.full_like(p, 0.1 * (i + 1))
                    e.grad = p.grad.clone()
                step()
                eager_opt.step()
                self.assertEqual(params, eager_params, atol=1e-6, rtol=1e-5)
                self.assertEqual(
                    opt.state_dict()["state"],
                    eager_opt.state_dict()["state"],
                    atol=1e-6,
                    rtol=1e-5,
                )
            self.assertEqual(counter.frame_count, 1, backend)


instantiate_parametrized_tests(ForeachMetaPerClassTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
