# Owner(s): ["module: dynamo"]
"""FakeTensorMode's dispatch-cache hits on fake tensors with static metadata: the key items
and the output are built directly, and are exactly what the general path builds.

The reference is the general path, taken for every tensor when the two static helpers are
patched to decline (general_path_only)."""

import contextlib
import dataclasses
import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.source import LocalSource
from torch._subclasses import fake_tensor
from torch._subclasses._fake_tensor_utils import _SymIntOutputStub
from torch._subclasses.fake_tensor import (
    _CacheKeyState,
    extract_tensor_metadata,
    FakeTensorMode,
)
from torch._subclasses.static_fake_cache import (
    append_static_tensor_key,
    static_output_from_cache_entry,
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


@contextlib.contextmanager
def general_path_only(fast=False):
    """Unless `fast`, every key and hit output takes the general path, as without the patch."""
    if fast:
        yield
        return
    with (
        unittest.mock.patch.object(fake_tensor, "append_static_tensor_key", lambda result, arg: False),
        unittest.mock.patch.object(fake_tensor, "static_output_from_cache_entry", lambda mode, entry: None),
    ):
        yield


def fakeify(mode, t, dynamic=DimDynamic.STATIC, name="t"):
    context = StatelessSymbolicContext(dynamic_sizes=[dynamic] * t.dim())
    return mode.from_tensor(t, source=LocalSource(name), symbolic_context=context)


def varied_fakes(mode):
    """Fake tensors of many kinds of metadata, all static: base tensors are fakified, views
    are taken of static fakes inside the mode (a view fakified directly gets a symbolic
    storage size, which is left to the general path)."""
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


def typed(items):
    # 1 == 1.0 == True: compare the types too, as the cache key's hash/eq does not.
    return [(type(x), x) for x in items]


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
    def test_key_items_are_the_general_path_items(self):
        mode = make_mode()
        for name, fake in varied_fakes(mode).items():
            with self.subTest(name):
                fast = []
                self.assertTrue(append_static_tensor_key(fast, fake))
                general = []
                extract_tensor_metadata(fake)._flatten_into(
                    general, mode, _CacheKeyState(mode.shape_env)
                )
                self.assertEqual(typed(fast), typed(general))

    def test_symbolic_tensor_is_left_to_the_general_path(self):
        mode = make_mode()
        fake = fakeify(mode, torch.randn(4, 3), dynamic=DimDynamic.DYNAMIC)
        self.assertTrue(fake._has_symbolic_sizes_strides)
        items = []
        self.assertFalse(append_static_tensor_key(items, fake))
        self.assertEqual(items, [])

    def test_cache_keys_equal_with_and_without_fast_path(self):
        def keys(fast):
            with general_path_only(fast):
                return keys_of_calls()

        def keys_of_calls():
            mode = make_mode()
            fakes = varied_fakes(mode)
            calls = [
                (aten.clone.default, (fakes["contiguous"],), {}),
                (aten.add.Tensor, (fakes["transposed"], fakes["transposed"]), {"alpha": 2}),
                (aten.mul.Tensor, (fakes["offset_view"], 1.5), {}),
                (aten.sum.dim_IntList, (fakes["channels_last"], [1]), {}),
                (aten.t.default, (fakes["strided_slice"],), {}),
                (aten.add_.Tensor, (fakes["requires_grad"].detach(), 1), {}),
                (aten._conj_physical.default, (fakes["conj"],), {}),
                (aten.clone.default, (fakes["nine_dims"],), {}),
            ]
            with mode:
                return [
                    mode._cache_key(_CacheKeyState(mode.shape_env), f, a, k).key
                    for f, a, k in calls
                ]

        fast, general = keys(True), keys(False)
        self.assertEqual(len(fast), 8)
        for f, g in zip(fast, general):
            self.assertEqual(typed(f), typed(g))
        # Different tensors give different keys (the items are not a constant).
        self.assertEqual(len(set(fast)), len(fast))

    def test_no_tensor_metadata_built_for_static_args(self):
        for fast, expected in ((True, 0), (False, 2)):
            mode = make_mode()
            a, b = fakeify(mode, torch.randn(4, 4)), fakeify(mode, torch.randn(4, 4))
            with general_path_only(fast), mode:
                a + b  # a miss: fills the cache entry
                with unittest.mock.patch.object(
                    fake_tensor,
                    "extract_tensor_metadata",
                    wraps=fake_tensor.extract_tensor_metadata,
                ) as extract:
                    hits = FakeTensorMode.cache_hits
                    a + b
                self.assertEqual(FakeTensorMode.cache_hits, hits + 1)
            # Without this patch, one TensorMetadata per tensor argument of a hit.
            self.assertEqual(extract.call_count, expected)


class StaticOutputTests(torch._dynamo.test_case.TestCase):
    def run_ops(self, fast):
        """Each op twice (a miss, then a hit): the hit's output and how it aliases."""
        with general_path_only(fast):
            return self.run_ops_in_mode()

    def run_ops_in_mode(self):
        mode = make_mode()
        fakes = varied_fakes(mode)
        ops = {
            "clone": lambda: fakes["contiguous"].clone(),
            "add_transposed": lambda: fakes["transposed"] + 1,
            "add_column_major": lambda: fakes["column_major"] + 1,
            "neg_physical": lambda: fakes["neg"].resolve_neg(),
            "mul_offset_view": lambda: fakes["offset_view"] * 2,
            "channels_last_relu": lambda: torch.relu(fakes["channels_last"]),
            "requires_grad_mul": lambda: fakes["requires_grad"] * 3,
            "empty_like": lambda: torch.empty_like(fakes["empty"]),
            "int_sum": lambda: fakes["int64"].sum(0),
            "bool_not": lambda: ~fakes["bool"],
            "view_t": lambda: fakes["strided_slice"].t(),
            "view_of_conj": lambda: fakes["conj"][1:],
        }
        results = {}
        with mode:
            for name, op in ops.items():
                op()
                hits = FakeTensorMode.cache_hits
                out = op()
                self.assertEqual(FakeTensorMode.cache_hits, hits + 1, name)
                results[name] = output_metadata(out)
            target = fakes["contiguous"].detach()
            target.add_(1)
            hits = FakeTensorMode.cache_hits
            self.assertIs(target.add_(1), target)
            self.assertEqual(FakeTensorMode.cache_hits, hits + 1)
            fakes["offset_view"].t()  # a miss
            view = fakes["offset_view"].t()  # a hit
            results["view_shares_storage"] = StorageWeakRef(
                view.untyped_storage()
            ) == StorageWeakRef(fakes["offset_view"].untyped_storage())
        return results

    def test_outputs_match_the_general_path(self):
        fast, general = self.run_ops(True), self.run_ops(False)
        self.assertEqual(fast, general)
        self.assertTrue(fast["view_shares_storage"])
        self.assertTrue(fast["requires_grad_mul"][6])

    def test_static_hit_suppresses_no_guards(self):
        for fast, expected in ((True, 0), (False, 1)):
            mode = make_mode()
            a = fakeify(mode, torch.randn(4, 4))
            with general_path_only(fast), mode:
                a.clone()
                with unittest.mock.patch.object(
                    ShapeEnv, "suppress_guards", wraps=mode.shape_env.suppress_guards
                ) as suppress:
                    a.clone()
            # Without this patch, every hit enters ShapeEnv.suppress_guards.
            self.assertEqual(suppress.call_count, expected)

    def test_entry_fields_decide_the_static_output(self):
        mode = make_mode()
        a = fakeify(mode, torch.randn(4, 3))
        entries = []
        original = FakeTensorMode._get_output_tensor_from_cache_entry

        def record(self, state, entry, key, func, args):
            entries.append(entry)
            return original(self, state, entry, key, func, args)

        with unittest.mock.patch.object(
            FakeTensorMode, "_get_output_tensor_from_cache_entry", record
        ), mode:
            a.clone()
        entry = entries[0]
        out = static_output_from_cache_entry(mode, entry)
        self.assertEqual(output_metadata(out), output_metadata(a))
        self.assertIs(out.fake_mode, mode)

        def with_metadata(**changes):
            return dataclasses.replace(
                entry, metadata=dataclasses.replace(entry.metadata, **changes)
            )

        self.assertTrue(
            static_output_from_cache_entry(mode, with_metadata(requires_grad=True)).requires_grad
        )
        self.assertEqual(
            static_output_from_cache_entry(mode, with_metadata(stride=(1, 4))).stride(),
            (1, 4),
        )
        for name, changed in {
            "neg": with_metadata(is_neg=True),
            "conj": with_metadata(is_conj=True),
            "symbolic size": with_metadata(shape=(4, _SymIntOutputStub.__new__(_SymIntOutputStub))),
            "symbolic offset": with_metadata(storage_offset=_SymIntOutputStub.__new__(_SymIntOutputStub)),
            "in-place": dataclasses.replace(entry, inplace_idx=0),
            "view": dataclasses.replace(entry, view_idx=0),
            "no metadata": dataclasses.replace(entry, metadata=None),
        }.items():
            with self.subTest(name):
                self.assertIsNone(static_output_from_cache_entry(mode, changed))

    def test_symbolic_and_view_entries_are_left_to_the_general_path(self):
        mode = make_mode()
        dyn = fakeify(mode, torch.randn(4, 3), dynamic=DimDynamic.DYNAMIC)
        static = fakeify(mode, torch.randn(4, 3), name="s")
        entries = {}
        original = FakeTensorMode._get_output_tensor_from_cache_entry

        def record(self, state, entry, key, func, args):
            entries.setdefault(func, entry)
            return original(self, state, entry, key, func, args)

        with unittest.mock.patch.object(
            FakeTensorMode, "_get_output_tensor_from_cache_entry", record
        ), mode:
            out = dyn * 2
            static.t()
            static * 2
        self.assertIsNone(static_output_from_cache_entry(mode, entries[aten.mul.Tensor]))
        self.assertIsNone(static_output_from_cache_entry(mode, entries[aten.t.default]))
        self.assertTrue(out._has_symbolic_sizes_strides)


class StaticFakeCacheCompileTests(torch._dynamo.test_case.TestCase):
    def compile_and_run(self, fast):
        torch._dynamo.reset()

        def step(params, grads, bufs, lr):
            for p, g, b in zip(params, grads, bufs):
                b.mul_(0.9).add_(g)
                p.add_(b.t().t() * -lr)
                p.copy_(p.clamp(-10, 10))
            return [p.sum() for p in params]

        torch.manual_seed(0)
        params = [torch.randn(4, 3) for _ in range(6)]
        grads = [torch.randn(4, 3) for _ in range(6)]
        bufs = [torch.zeros(4, 3) for _ in range(6)]
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm.code)
            return gm.forward

        counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
        # The cache is shared by all modes: start each side from an empty one.
        FakeTensorMode.cache_clear()
        with general_path_only(fast):
            compiled = torch.compile(step, backend=counter)
            outs = [compiled(params, grads, bufs, 0.1) for _ in range(3)]
        hits = FakeTensorMode.cache_hits
        return outs, params, bufs, graphs, counter.frame_count, hits

    def test_compiled_step_same_with_and_without_fast_path(self):
        fast = self.compile_and_run(True)
        general = self.compile_and_run(False)
        outs, params, bufs, graphs, frames, hits = fast
        self.assertEqual(outs, general[0])
        self.assertEqual(params, general[1])
        self.assertEqual(bufs, general[2])
        self.assertEqual(graphs, general[3])
        self.assertEqual(frames, 1)
        self.assertEqual(general[4], 1)
        self.assertGreater(hits, 0)
        self.assertEqual(hits, general[5])

        # And the same values as eager.
        torch.manual_seed(0)
        e_params = [torch.randn(4, 3) for _ in range(6)]
        e_grads = [torch.randn(4, 3) for _ in range(6)]
        e_bufs = [torch.zeros(4, 3) for _ in range(6)]
        for _ in range(3):
            for p, g, b in zip(e_params, e_grads, e_bufs):
                b.mul_(0.9).add_(g)
                p.add_(b * -0.1)
                p.copy_(p.clamp(-10, 10))
        self.assertEqual(params, e_params)
        self.assertEqual(bufs, e_bufs)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
