# Owner(s): ["module: dynamo"]
"""MetaTensorDescriber.describe_tensor describes a plain tensor cheaply.

Two reads of the description have a cheaper answer for the tensors Dynamo fakifies by
the thousand (parameters, grads, optimizer state): safe_grad reads the .grad of a leaf
that runs no __torch_function__ without its warning filter (_grad_read_cannot_warn),
and maybe_get_fake_mode is not asked about a tensor of exact type Tensor or Parameter
that wraps nothing (_is_plain_tensor). The reference is the same code with both
answers forced to "no" (full_description): every tensor is then described as without
this patch, and the descriptions, fake tensors, memos, counters and structured-trace
records must be the same."""

import contextlib
import dataclasses
import gc
import logging
import re
import unittest.mock
import warnings

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
import torch._subclasses.meta_utils as meta_utils
from torch._dynamo.source import LocalSource
from torch._logging._internal import trace_log
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.meta_utils import MetaStorageDesc, MetaTensorDesc, MetaTensorDescriber
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.testing._internal.two_tensor import TwoTensor


@contextlib.contextmanager
def full_description(full=True):
    """If `full`, every tensor is described as without the patch: the .grad read
    through the warning filter, maybe_get_fake_mode asked."""
    if not full:
        yield
        return
    with (
        unittest.mock.patch.object(meta_utils, "_grad_read_cannot_warn", lambda t: False),
        unittest.mock.patch.object(meta_utils, "_is_plain_tensor", lambda t: False),
    ):
        yield


@contextlib.contextmanager
def count_slow_probes():
    """Calls of the two probes a plain tensor's description does without."""
    calls = {"hide_warnings": 0, "maybe_get_fake_mode": 0}
    hide_warnings = torch._logging.hide_warnings
    maybe_get_fake_mode = torch._subclasses.fake_tensor.maybe_get_fake_mode

    def counting_hide_warnings(*args, **kwargs):
        calls["hide_warnings"] += 1
        return hide_warnings(*args, **kwargs)

    def counting_maybe_get_fake_mode(t):
        calls["maybe_get_fake_mode"] += 1
        return maybe_get_fake_mode(t)

    with (
        unittest.mock.patch.object(torch._logging, "hide_warnings", counting_hide_warnings),
        unittest.mock.patch.object(
            torch._subclasses.fake_tensor, "maybe_get_fake_mode", counting_maybe_get_fake_mode
        ),
    ):
        yield calls


def desc_fields(desc):
    """Every field of a description, nested descriptions included, in a comparable
    form. Objects a description holds but makes afresh each time (the view function
    of a sparse tensor's index tensors, functorch's interpreter stack) are compared by
    kind; tensors by identity, the storage description's data (copy_data: the
    described tensor itself) included: a dataclass's == compares it by value on
    Python 3.13 (field by field, without 3.11/3.12's same-object shortcut), and a
    fake tensor has no value to compare."""
    out = {}
    for field in dataclasses.fields(desc):
        value = getattr(desc, field.name)
        if isinstance(value, MetaTensorDesc):
            value = desc_fields(value)
        elif isinstance(value, dict) and value and all(isinstance(v, MetaTensorDesc) for v in value.values()):
            value = {k: desc_fields(v) for k, v in value.items()}
        elif isinstance(value, MetaStorageDesc):
            value = {f.name: tensors_by_identity(getattr(value, f.name)) for f in dataclasses.fields(value)}
        elif field.name == "view_func":
            value = (type(value), getattr(getattr(value, "func", None), "__name__", None))
        elif field.name == "functorch_stack" and value is not None:
            value = [type(layer) for layer in value]
        else:
            value = tensors_by_identity(value)
        out[field.name] = value
    return out


def tensors_by_identity(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value))
    if isinstance(value, dict):
        return {k: tensors_by_identity(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(tensors_by_identity(v) for v in value)
    return value


def describe(t, full, copy_data=False):
    with full_description(full):
        return MetaTensorDescriber(copy_data=copy_data).describe_tensor(t)


def static_context(t):
    """All sizes static, as Dynamo's first compile gives them; subclasses and nested
    tensors get the context meta_tensor makes for them (None)."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.is_nested or t.layout != torch.strided:
        return None
    return StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC] * t.dim())


def metadata(fake):
    """Everything a fake tensor carries that Dynamo and AOTAutograd read."""
    grad = fake.grad if fake.is_leaf else None  # a non-leaf has no .grad to read
    inner = (
        {name: metadata(getattr(fake, name)) for name in fake.__tensor_flatten__()[0]}
        if hasattr(fake, "__tensor_flatten__") and not isinstance(fake, FakeTensor)
        else None
    )
    real = getattr(fake, "real_tensor", None)
    return (
        type(fake),
        tuple(fake.shape),
        fake.stride() if fake.layout == torch.strided and not fake.is_nested else None,
        fake.storage_offset() if fake.layout == torch.strided and not fake.is_nested else None,
        fake.dtype,
        fake.device,
        fake.layout,
        fake.requires_grad,
        fake.is_leaf,
        fake.is_conj(),
        fake.is_neg(),
        fake._is_view(),
        getattr(fake, "_is_param", False),
        getattr(fake, "_is_buffer", False),
        str(getattr(fake, "nested_int_memo", None)),
        None if real is None else (tuple(real.shape), real.layout, real.dtype),
        inner,
        None if grad is None else metadata(grad),
    )


def storages(fakes):
    """Which fakes share a storage: the index of the first fake with the same one."""
    refs = [
        StorageWeakRef(f.untyped_storage()).cdata
        if isinstance(f, FakeTensor) and f.layout == torch.strided and not f.is_nested
        else None
        for f in fakes
    ]
    return [refs.index(r) if r is not None else None for r in refs]


class TraceRecords(logging.Handler):
    """The structured-trace records MetaConverter logs (describe_storage,
    describe_tensor, describe_source), describer ids made relative."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        for name, body in record.metadata.items():
            if name.startswith("describe_"):
                # Reprs of objects (the view function) name their address, and each
                # nested tensor made gets a new nested int.
                body = {
                    k: re.sub("0x[0-9a-f]+", "0x", re.sub("j[0-9]+", "j", str(v)))
                    for k, v in body.items()
                    if k not in ("describer_id", "nested_int")
                }
                self.records.append((name, body))


def fakeify(tensors, full, *, shape_env=True, contexts=None, propagate_real_tensors=False, trace=False):
    """Fake tensors of `tensors` in one FakeTensorMode; its converter and, with
    `trace`, the structured-trace records."""
    handler = TraceRecords()
    if trace:
        trace_log.addHandler(handler)
    try:
        with (
            full_description(full),
            torch._functorch.config.patch(fake_tensor_propagate_real_tensors=propagate_real_tensors),
        ):
            mode = FakeTensorMode(shape_env=ShapeEnv() if shape_env else None)
            fakes = []
            for i, t in enumerate(tensors):
                context = None
                if shape_env:
                    context = contexts[i] if contexts is not None else static_context(t)
                fakes.append(mode.from_tensor(t, source=LocalSource(f"t{i}"), symbolic_context=context))
    finally:
        trace_log.removeHandler(handler)
    return fakes, mode.fake_tensor_converter.meta_converter, handler.records


def converter_state(converter):
    gc.collect()  # the memos hold their values weakly
    return (
        converter.hit,
        converter.miss,
        converter.arg_cnt,
        len(converter.tensor_memo),
        len(converter.storage_memo),
        converter.describer.next_tensor_id,
        converter.describer.next_storage_id,
    )


def plain_tensors():
    param = torch.nn.Parameter(torch.randn(4, 4))
    param.grad = torch.randn(4, 4)
    frozen = torch.nn.Parameter(torch.randn(3), requires_grad=False)
    leaf = torch.randn(2, 3, requires_grad=True)
    leaf.grad = torch.ones(2, 3)
    marked = torch.randn(5, 2)
    torch._dynamo.mark_dynamic(marked, 0)
    return {
        "parameter with grad": param,
        "frozen parameter": frozen,
        "leaf with grad": leaf,
        "column major": torch.empty_strided((4, 3), (1, 4)),
        "0-dim": torch.randn(()),
        "int64": torch.arange(6, dtype=torch.int64).reshape(2, 3).clone(),
        "bool": torch.zeros(5, dtype=torch.bool),
        "zero elements": torch.randn(1, 0, 3),
        "marked dynamic": marked,
    }


def other_tensors(nested=True, wrappers=True):
    """Tensors whose description takes the probes (subclasses, wrappers, views, ...)
    or carries what the probes find (a fake mode, a nested int). Nested tensors and
    their offsets are fakified with a ShapeEnv only (their nested int is a symbol),
    subclasses and wrappers without real-tensor propagation (meta_tensor supports
    neither)."""
    base = torch.randn(4, 4)
    offsets = torch.tensor([0, 2, 6, 10])
    jagged = torch.nested.nested_tensor_from_jagged(torch.randn(10, 5), offsets)
    grad_view = torch.nn.Parameter(torch.randn(3))
    grad_view.grad = torch.randn(6)[::2]
    fake = FakeTensorMode().from_tensor(torch.randn(3))
    kinds = {
        "view": base[1:],
        "transposed view": base.t(),
        "aliasing storage": torch.empty(0).set_(base.untyped_storage(), 0, (4, 4), (4, 1)),
        "storage offset": torch.empty(0).set_(torch.randn(20).untyped_storage(), 4, (4,), (1,)),
        "as_subclass": torch.nn.Parameter(torch.randn(2)).as_subclass(type("Sub", (torch.Tensor,), {})),
        "traceable wrapper subclass": TwoTensor(torch.randn(3), torch.randn(3)),
        "non-leaf": torch.randn(3, requires_grad=True) * 2,
        "conj": torch.randn(3, dtype=torch.complex64).conj(),
        "neg": torch.randn(3, dtype=torch.complex64).conj().imag,
        "inference": _inference_tensor(),
        "buffer": torch.nn.Buffer(torch.randn(3)),
        "grad needing grad": _param_with_grad_requiring_grad(),
        "grad that is a view": grad_view,
        "nested tensor offsets": offsets,
        "nested tensor": jagged,
        "functional": torch._to_functional_tensor(torch.randn(3)),
        "fake": fake,
        "functional over a fake": torch._to_functional_tensor(fake),
        "sparse": torch.randn(3, 3).to_sparse(),
    }
    if not nested:
        del kinds["nested tensor offsets"], kinds["nested tensor"]
    if not wrappers:
        kinds = {k: t for k, t in kinds.items() if type(t) in (torch.Tensor, torch.nn.Parameter)}
        del kinds["functional"], kinds["functional over a fake"]
    return kinds


def _inference_tensor():
    with torch.inference_mode():
        return torch.randn(3)


def _param_with_grad_requiring_grad():
    p = torch.nn.Parameter(torch.randn(3))
    p.grad = torch.randn(3, requires_grad=True)
    return p


class ReadsAttributes(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class PlainFakeTensorTests(torch._dynamo.test_case.TestCase):
    def test_descriptions_same_as_full(self):
        kinds = {**plain_tensors(), **other_tensors()}
        for name, t in kinds.items():
            for copy_data in (False, True):
                with self.subTest(name, copy_data=copy_data):
                    self.assertEqual(
                        desc_fields(describe(t, full=False, copy_data=copy_data)),
                        desc_fields(describe(t, full=True, copy_data=copy_data)),
                    )
        # What the probes find is in the descriptions compared above.
        self.assertIsNotNone(describe(kinds["fake"], full=False).fake_mode)
        self.assertIsNotNone(describe(kinds["functional over a fake"], full=False).fake_mode)
        self.assertIsNotNone(describe(kinds["nested tensor offsets"], full=False).nested_int)
        self.assertIsNotNone(describe(kinds["parameter with grad"], full=False).grad)

    def test_descriptions_under_functorch_and_modes(self):
        # Functorch-wrapped fake tensors (exact type Tensor, with the fake mode and
        # the functorch stack in their description), inference mode, and a torch
        # function mode that sees every attribute read.
        seen = []

        def f(x):
            seen.append((desc_fields(describe(x, full=False)), desc_fields(describe(x, full=True))))
            return x * 2

        mode = FakeTensorMode()
        with mode:
            torch.func.vmap(f)(torch.randn(2, 3))
            torch.func.grad(lambda x: f(x).sum())(torch.randn(3))
        with torch.inference_mode():
            f(torch.randn(3))
        param = torch.nn.Parameter(torch.randn(3))
        param.grad = torch.randn(3)
        with ReadsAttributes():
            f(param)
        self.assertEqual(len(seen), 4)
        self.assertTrue(seen[0][0]["is_batchedtensor"])
        self.assertTrue(seen[1][0]["is_gradtrackingtensor"])
        self.assertIs(seen[0][0]["fake_mode"], mode)
        self.assertIs(seen[1][0]["fake_mode"], mode)
        for cheap, full in seen:
            self.assertEqual(cheap, full)

    def test_plain_tensors_skip_the_probes(self):
        tensors = list(plain_tensors().values())
        with count_slow_probes() as cheap:
            fakeify(tensors, full=False)
        with count_slow_probes() as full:
            fakeify(tensors, full=True)
        # Without the patch each tensor and grad is described (9 + 2), the grad read
        # through the filter and maybe_get_fake_mode asked; meta_tensor's
        # assert_metadata_eq reads each fake's grad once more, and a parameter's
        # grad a second time through its parameter (9 + 2 + 2 + 2).
        self.assertEqual(full, {"hide_warnings": 11 + 15, "maybe_get_fake_mode": 11})
        self.assertEqual(cheap, {"hide_warnings": 0, "maybe_get_fake_mode": 0})

    def test_safe_grad_keeps_the_filter_where_a_read_can_warn(self):
        non_leaf = torch.randn(3, requires_grad=True) * 2
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertIsNone(non_leaf.grad)
        self.assertEqual(len(caught), 1)  # the warning safe_grad must hide
        sub = torch.nn.Parameter(torch.randn(2)).as_subclass(type("Sub", (torch.Tensor,), {}))
        leaf = torch.nn.Parameter(torch.randn(2))
        leaf.grad = torch.randn(2)
        cases = [(non_leaf, 1), (sub, 1), (leaf, 0), (FakeTensorMode().from_tensor(leaf), 0)]
        for t, filtered in cases:
            with count_slow_probes() as calls, warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                grad = meta_utils.safe_grad(t)
            self.assertEqual(caught, [])
            self.assertEqual(calls["hide_warnings"], filtered)
            self.assertIs(grad, None if t is non_leaf or t is sub else t.grad)
        # Under a torch function mode reading .grad runs Python code: filtered.
        with count_slow_probes() as calls, ReadsAttributes():
            self.assertIs(meta_utils.safe_grad(leaf), leaf.grad)
        self.assertEqual(calls["hide_warnings"], 1)

    def test_ids(self):
        describer = MetaTensorDescriber()
        a, b = torch.randn(2), torch.randn(2)
        alias = torch.empty(0).set_(a.untyped_storage(), 0, (2,), (1,))
        self.assertEqual([describer.get_tensor_id(t) for t in (a, a, b, a, alias)], [0, 0, 1, 0, 2])
        storages_ids = [describer.get_storage_id(t.untyped_storage()) for t in (a, b, a, alias)]
        self.assertEqual(storages_ids, [0, 1, 0, 0])
        self.assertEqual((describer.next_tensor_id, describer.next_storage_id), (3, 2))

    def test_fakes_memos_and_counters_same_as_full(self):
        # Fresh tensors for each run, after one run that is not compared: the first
        # fakification of a kind in a process can describe more (a non-leaf's fake
        # gets its autograd history made once).
        def tensors(shape_env, propagate_real_tensors):
            torch.manual_seed(0)
            others = other_tensors(nested=shape_env, wrappers=not propagate_real_tensors)
            return [*plain_tensors().values(), *others.values()]

        for shape_env in (True, False):
            for propagate_real_tensors in (False, True):
                with self.subTest(shape_env=shape_env, propagate_real_tensors=propagate_real_tensors):
                    fakeify(
                        tensors(shape_env, propagate_real_tensors),
                        False,
                        shape_env=shape_env,
                        propagate_real_tensors=propagate_real_tensors,
                    )
                    runs = [
                        fakeify(
                            tensors(shape_env, propagate_real_tensors),
                            full,
                            shape_env=shape_env,
                            propagate_real_tensors=propagate_real_tensors,
                        )
                        for full in (False, True)
                    ]
                    (cheap, cheap_converter, _), (full, full_converter, _) = runs
                    self.assertEqual([metadata(f) for f in cheap], [metadata(f) for f in full])
                    self.assertEqual(storages(cheap), storages(full))
                    self.assertEqual(converter_state(cheap_converter), converter_state(full_converter))
        # Fakified under inference mode (the descriptions read is_inference() there).
        with self.subTest("under inference mode"), torch.inference_mode():
            fakeify(tensors(True, False), False)
            (cheap, cheap_converter, _), (full, full_converter, _) = (
                fakeify(tensors(True, False), full) for full in (False, True)
            )
            self.assertEqual([metadata(f) for f in cheap], [metadata(f) for f in full])
            self.assertEqual(storages(cheap), storages(full))
            self.assertEqual(converter_state(cheap_converter), converter_state(full_converter))

    def test_memo_and_aliasing(self):
        base = torch.randn(4, 4)
        alias = torch.empty(0).set_(base.untyped_storage(), 0, (4, 4), (4, 1))
        other = torch.randn(4, 4)
        param = torch.nn.Parameter(torch.randn(2, 2))
        param.grad = torch.randn(2, 2)
        tensors = [base, alias, other, param, param.grad, base]
        for full in (False, True):
            fakes, converter, _ = fakeify(tensors, full)
            # The alias shares the first tensor's fake storage (meta_tensor's set_()),
            # the grad converted with its parameter is the same fake as the grad
            # converted on its own, and a tensor converted twice is one fake.
            self.assertEqual(storages(fakes), [0, 0, 2, 3, 4, 0])
            self.assertIs(fakes[3].grad, fakes[4])
            self.assertIs(fakes[0], fakes[5])
            # 6 conversions, 2 of them memo hits before the converter; 5 tensors
            # and 4 storages described and converted.
            self.assertEqual(converter_state(converter), (4, 0, 5, 5, 4, 5, 4))

    def test_dynamic_sizes_same_as_full(self):
        param = torch.nn.Parameter(torch.randn(4, 4))
        param.grad = torch.randn(4, 4)
        t = torch.randn(4, 3)
        contexts = [
            StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC]),
            StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC]),
        ]
        shapes = []
        for full in (False, True):
            fakes, _, _ = fakeify([t, param], full, contexts=contexts)
            shapes.append([str(tuple(f.shape)) for f in (*fakes, fakes[1].grad)])
        self.assertEqual(shapes[0], shapes[1])
        self.assertIn("s", shapes[0][0])

    def test_structured_trace_same_as_full(self):
        def tensors():
            torch.manual_seed(0)
            return [*plain_tensors().values(), *other_tensors().values()]

        fakeify(tensors(), False)  # see test_fakes_memos_and_counters_same_as_full
        (_, _, cheap), (_, _, full) = (fakeify(tensors(), full, trace=True) for full in (False, True))
        self.assertEqual(cheap, full)
        names = [name for name, _ in cheap]
        # One describe_source per tensor converted.
        self.assertEqual(names.count("describe_source"), len(tensors()))
        self.assertGreater(names.count("describe_tensor"), len(tensors()))
        self.assertGreater(names.count("describe_storage"), 0)
        # The parameter's record names its grad's.
        self.assertIn("grad", next(body for name, body in cheap if name == "describe_tensor" and body["id"] == "0"))

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
        for full in (False, True):
            torch._dynamo.reset()
            counter = torch._dynamo.testing.CompileCounter()
            with full_description(full), count_slow_probes() as calls:
                compiled = torch.compile(step, backend=counter)
                params, bufs = make()
                eager_params, eager_bufs = make()
                for i in range(3):
                    if i == 2:
                        # A grad of other strides: the same recompile either way.
                        params[0].grad = eager_params[0].grad = torch.randn(4, 4).t().contiguous().t()
                        bufs[0] = torch.zeros(4, 4)
                        eager_bufs[0] = torch.zeros(4, 4)
                    self.assertEqual(compiled(params, bufs), step(eager_params, eager_bufs))
                    self.assertEqual(params, eager_params)
                    self.assertEqual(bufs, eager_bufs)
                reasons = list(torch._dynamo.utils.guard_failures[step.__code__])
            results[full] = (counter.frame_count, counter.op_count, reasons, calls["maybe_get_fake_mode"])
        self.assertEqual(results[False][:3], results[True][:3])
        self.assertEqual(results[False][0], 2)
        # Every param, grad and buffer of both compiles is described; only without
        # the patch is maybe_get_fake_mode asked about them.
        self.assertEqual(results[False][3], 0)
        # (measured: two compiles of 60 tensors each, and one more description)
        self.assertEqual(results[True][3], 121)

    def test_aliased_inputs_compile_as_eager(self):
        # AOTAutograd finds input aliasing from the fake tensors' storages: two inputs
        # over one storage must get fakes over one fake storage.
        def f(a, b):
            a.add_(1)
            return b * 2

        def aliased():
            base = torch.zeros(4)
            return base, torch.empty(0).set_(base.untyped_storage(), 0, (4,), (1,))

        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        a, b = aliased()
        eager_a, eager_b = aliased()
        self.assertEqual(torch.compile(f, backend=counter)(a, b), f(eager_a, eager_b))
        self.assertEqual((a, b), (eager_a, eager_b))
        self.assertEqual(counter.frame_count, 1)

    def test_nested_tensor_built_in_graph_from_its_offsets(self):
        # The offsets of a nested tensor carry its nested int: the fake of the offsets
        # passed on their own must share it with the nested tensor's, or `nt * nt2`
        # fails with shapes (3, s0, 5) and (3, s1, 5).
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


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
