# Owner(s): ["module: dynamo"]
"""FakeTensorMode's dispatch-cache hits on fake tensors with static metadata: the key is
flattened without dataclasses.fields() per tensor or a type dispatch per size, and a hit
whose cached metadata is all ints is built without extracting symbolic stubs or entering
ShapeEnv.suppress_guards. Keys keep their items, and hit outputs equal what dispatching
the op computes (the cache's own crosscheck)."""

import dataclasses
import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.source import LocalSource
from torch._subclasses import fake_tensor
from torch._subclasses._fake_tensor_utils import _PySymInputStub
from torch._subclasses.fake_tensor import (
    _CacheKeyState,
    extract_tensor_metadata,
    FakeTensorMode,
)
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)
from torch.multiprocessing.reductions import StorageWeakRef

aten = torch.ops.aten


def make_mode():
    return FakeTensorMode(shape_env=ShapeEnv())


def fakeify(mode, t, dynamic=DimDynamic.STATIC, name="t"):
    context = StatelessSymbolicContext(dynamic_sizes=[dynamic] * t.dim())
    return mode.from_tensor(t, source=LocalSource(name), symbolic_context=context)


def varied_fakes(mode):
    """Fake tensors of many kinds of metadata, all static: base tensors are fakified, views
    are taken of static fakes inside the mode."""
    fakes = {
        name: fakeify(mode, t, name=name)
        for name, t in {
            "contiguous": torch.randn(4, 4),
            "param": torch.nn.Parameter(torch.randn(4, 4)),
            "requires_grad": torch.randn(2, 3, requires_grad=True),
            "scalar": torch.tensor(3.0),
            "empty": torch.empty(0, 3),
            "channels_last": torch.randn(2, 3, 4, 5).to(
                memory_format=torch.channels_last
            ),
            "column_major": torch.empty_strided((4, 3), (1, 4)),
            "base": torch.randn(6, 5),
            "int64": torch.arange(12),
            "bool": torch.ones(5, dtype=torch.bool),
            "complex": torch.randn(3, 2, dtype=torch.complex64),
            "nine_dims": torch.randn([1] * 8 + [2]),
        }.items()
    }
    with mode:
        fakes.update(
            transposed=fakes["base"].t(),
            offset_view=fakes["base"][2:],
            strided_slice=fakes["base"][:, ::2],
            expanded=fakes["base"][:, :1].expand(6, 4),
            int_view=fakes["int64"].view(3, 4),
            conj=fakes["complex"].conj(),
            neg=torch._neg_view(fakes["complex"]),
        )
    return fakes


def reference_items(metadata, state):
    """The key items of a TensorMetadata as _flatten_into built them without this patch:
    every field in declaration order; a sequence as its type, its length tag and each
    item; an int item as (type, value); a SymInt converted by the key state."""
    items = []
    for field in dataclasses.fields(metadata):
        value = getattr(metadata, field.name)
        if isinstance(value, torch.SymInt):
            state.convert_sym_int(items, value)
            continue
        if not isinstance(value, (tuple, list, torch.Size)):
            items.append(value)
            continue
        items += [type(value), f"length_{len(value)}"]
        for v in value:
            if isinstance(v, torch.SymInt):
                state.convert_sym_int(items, v)
            else:
                items += [type(v), v]
    return items


def typed(items):
    # 1 == 1.0 == True: compare the types too, as the cache key's hash/eq does not.
    # A symbolic input stub is compared by its type and the symbol it stands for.
    return [
        (type(x), str(x.value) if isinstance(x, _PySymInputStub) else x) for x in items
    ]


def output_metadata(out):
    return (
        type(out),
        tuple(out.shape),
        out.stride(),
        out.storage_offset(),
        out.dtype,
        out.device,
        out.requires_grad,
        out.is_conj(),
        out.is_neg(),
        out.untyped_storage().nbytes(),
    )


class StaticKeyTests(torch._dynamo.test_case.TestCase):
    def test_key_items_unchanged(self):
        mode = make_mode()
        for name, fake in varied_fakes(mode).items():
            with self.subTest(name):
                metadata = extract_tensor_metadata(fake)
                items = []
                metadata._flatten_into(items, mode, _CacheKeyState(mode.shape_env))
                reference = reference_items(metadata, _CacheKeyState(mode.shape_env))
                self.assertEqual(typed(items), typed(reference))

    def test_key_of_a_call_unchanged(self):
        mode = make_mode()
        a, b = fakeify(mode, torch.randn(4, 3)), fakeify(mode, torch.randn(4, 3).t(), name="b")
        with mode:
            key = mode._cache_key(
                _CacheKeyState(mode.shape_env), aten.add.Tensor, (a, b.t()), {"alpha": 2}
            ).key
        # After the op and the five mode settings: the arguments as a tuple of two
        # tensors, then the kwargs (a dict's keys, then its values, each without a
        # header of its own), as without this patch.
        self.assertEqual(key[0], aten.add.Tensor)
        state = _CacheKeyState(mode.shape_env)
        args_items = [tuple, "length_2"]
        with mode:
            for t in (a, b.t()):
                args_items += reference_items(extract_tensor_metadata(t), state)
        kwargs_items = [dict, "length_1", str, "alpha", int, 2]
        self.assertEqual(typed(key[6:]), typed(args_items + kwargs_items))

    def test_symbolic_sizes_still_converted(self):
        mode = make_mode()
        fake = fakeify(mode, torch.randn(4, 3), dynamic=DimDynamic.DYNAMIC)
        self.assertTrue(fake._has_symbolic_sizes_strides)
        metadata = extract_tensor_metadata(fake)
        items = []
        metadata._flatten_into(items, mode, _CacheKeyState(mode.shape_env))
        reference = reference_items(metadata, _CacheKeyState(mode.shape_env))
        # Symbolic sizes and strides are converted by the key state, as before.
        self.assertEqual(typed(items), typed(reference))
        self.assertIn(_PySymInputStub, [type(x) for x in items])

    def test_no_dataclass_fields_per_tensor(self):
        mode = make_mode()
        a, b = fakeify(mode, torch.randn(4, 4)), fakeify(mode, torch.randn(4, 4))
        with mode:
            a + b  # a miss: fills the cache entry
            with unittest.mock.patch.object(
                fake_tensor.dataclasses, "fields", wraps=dataclasses.fields
            ) as fields:
                hits = FakeTensorMode.cache_hits
                a + b
            self.assertEqual(FakeTensorMode.cache_hits, hits + 1)
        # Without this patch, one dataclasses.fields() per tensor argument: 2.
        self.assertEqual(fields.call_count, 0)

    def test_static_sizes_flattened_without_per_item_dispatch(self):
        mode = make_mode()
        fakes = varied_fakes(mode)
        static = fakes["column_major"]
        symbolic = fakeify(mode, torch.randn(4, 3), dynamic=DimDynamic.DYNAMIC, name="s")
        calls = []
        real = FakeTensorMode._prep_args_for_hash

        def counting(self, result, args, *rest):
            calls.append(tuple(args))
            return real(self, result, args, *rest)

        with unittest.mock.patch.object(FakeTensorMode, "_prep_args_for_hash", counting):
            for fake in (static, symbolic):
                extract_tensor_metadata(fake)._flatten_into(
                    [], mode, _CacheKeyState(mode.shape_env)
                )
        # Without this patch the static tensor's shape and stride went through the
        # general per-item dispatch too (4 calls); a symbolic tensor's still do.
        self.assertEqual(len(calls), 2)
        self.assertTrue(all(isinstance(v, torch.SymInt) for v in calls[0]))


class StaticOutputTests(torch._dynamo.test_case.TestCase):
    def test_hit_outputs_equal_miss_outputs(self):
        mode = make_mode()
        fakes = varied_fakes(mode)
        ops = {
            "clone": lambda: fakes["contiguous"].clone(),
            "add_transposed": lambda: fakes["transposed"] + 1,
            "add_column_major": lambda: fakes["column_major"] + 1,
            "neg_physical": lambda: fakes["neg"].resolve_neg(),
            "conj_clone": lambda: fakes["conj"].clone(),
            "mul_offset_view": lambda: fakes["offset_view"] * 2,
            "channels_last_relu": lambda: torch.relu(fakes["channels_last"]),
            "requires_grad_mul": lambda: fakes["requires_grad"] * 3,
            "empty_like": lambda: torch.empty_like(fakes["empty"]),
            "int_sum": lambda: fakes["int64"].sum(0),
            "bool_not": lambda: ~fakes["bool"],
            "view_t": lambda: fakes["strided_slice"].t(),
            "view_of_conj": lambda: fakes["conj"][1:],
        }
        with mode:
            for name, op in ops.items():
                with self.subTest(name):
                    miss = op()
                    hits = FakeTensorMode.cache_hits
                    hit = op()
                    self.assertEqual(FakeTensorMode.cache_hits, hits + 1)
                    self.assertEqual(output_metadata(hit), output_metadata(miss))
                    self.assertIs(hit.fake_mode, mode)
            self.assertTrue(fakes["requires_grad"].mul(3).requires_grad)
            target = fakes["contiguous"].detach()
            target.add_(1)
            hits = FakeTensorMode.cache_hits
            self.assertIs(target.add_(1), target)
            self.assertEqual(FakeTensorMode.cache_hits, hits + 1)
            fakes["offset_view"].t()  # a miss
            view = fakes["offset_view"].t()  # a hit
            self.assertEqual(
                StorageWeakRef(view.untyped_storage()),
                StorageWeakRef(fakes["offset_view"].untyped_storage()),
            )
            self.assertEqual(view.storage_offset(), fakes["offset_view"].storage_offset())

    def count_suppressions_of_hit(self, dynamic):
        mode = make_mode()
        a = fakeify(mode, torch.randn(4, 4), dynamic=dynamic)
        with mode:
            a.clone()
            with unittest.mock.patch.object(
                ShapeEnv, "suppress_guards", wraps=mode.shape_env.suppress_guards
            ) as suppress:
                hits = FakeTensorMode.cache_hits
                out = a.clone()
            self.assertEqual(FakeTensorMode.cache_hits, hits + 1)
        return suppress.call_count, out

    def test_static_hit_suppresses_no_guards(self):
        count, out = self.count_suppressions_of_hit(DimDynamic.STATIC)
        # Without this patch, every hit enters ShapeEnv.suppress_guards: 1.
        self.assertEqual(count, 0)
        self.assertEqual(tuple(out.shape), (4, 4))

    def test_symbolic_hit_still_suppresses_guards(self):
        count, out = self.count_suppressions_of_hit(DimDynamic.DYNAMIC)
        self.assertEqual(count, 1)
        self.assertTrue(out._has_symbolic_sizes_strides)


class StaticFakeCacheCompileTests(torch._dynamo.test_case.TestCase):
    @torch._dynamo.config.patch(fake_tensor_cache_crosscheck_enabled=True)
    def test_compiled_step_with_crosschecked_hits(self):
        """Every cache hit of the trace is checked against dispatching the op (the
        crosscheck raises on a difference); values and state against eager."""
        torch._dynamo.reset()

        def step(params, grads, bufs, lr):
            for p, g, b in zip(params, grads, bufs):
                b.mul_(0.9).add_(g)
                p.add_(b.t().t() * -lr)
                p.copy_(p.clamp(-10, 10))
            return [p.sum() for p in params]

        def make():
            torch.manual_seed(0)
            return (
                [torch.randn(4, 3) for _ in range(6)],
                [torch.randn(4, 3) for _ in range(6)],
                [torch.zeros(4, 3) for _ in range(6)],
            )

        params, grads, bufs = make()
        e_params, e_grads, e_bufs = make()
        counter = torch._dynamo.testing.CompileCounter()
        FakeTensorMode.cache_clear()
        compiled = torch.compile(step, backend=counter)
        with unittest.mock.patch.object(
            FakeTensorMode,
            "_crosscheck_cache_output",
            autospec=True,
            side_effect=FakeTensorMode._crosscheck_cache_output,
        ) as crosscheck:
            for _ in range(3):
                self.assertEqual(
                    compiled(params, grads, bufs, 0.1), step(e_params, e_grads, e_bufs, 0.1)
                )
                self.assertEqual(params, e_params)
                self.assertEqual(bufs, e_bufs)
        self.assertEqual(counter.frame_count, 1)
        # The six parameters repeat the same ops: the last five hit the cache, and each
        # hit was crosschecked.
        self.assertEqual(FakeTensorMode.cache_hits, 46)
        self.assertEqual(crosscheck.call_count, 46)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
