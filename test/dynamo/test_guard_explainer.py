# Owner(s): ["module: dynamo"]
"""torch._dynamo.explain_guards and the explained recompile reasons."""

import gc
import io
import logging
import textwrap

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.eval_frame import _debug_get_cache_entry_list


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.step = 0
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.step += 1
        return self.layer(x)


class LazySGD:
    def __init__(self, params):
        self.param_groups = [{"params": list(params), "lr": 0.1}]
        self.state = {}

    @torch._dynamo.init_values_once(guards=["self.state", "self.param_groups", "group"])
    def _init_group(self, group, params, grads, bufs):
        for p in group["params"]:
            if p.grad is not None:
                state = self.state.setdefault(p, {"buf": torch.zeros_like(p)})
                params.append(p)
                grads.append(p.grad)
                bufs.append(state["buf"])

    def step(self):
        with torch.no_grad():
            for group in self.param_groups:
                params, grads, bufs = [], [], []
                self._init_group(group, params, grads, bufs)
                torch._foreach_add_(bufs, grads)
                torch._foreach_add_(params, bufs, alpha=-group["lr"])


def add_all(d):
    return d["weight"] * d["scale"] + d["bias"]


def total(xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


def explain(fn):
    return torch._dynamo.explain_guards(fn, file=io.StringIO())


class GuardExplainerTests(torch._dynamo.test_case.TestCase):
    def test_module_with_counter(self):
        model = torch.compile(Counter(), backend="eager")
        for _ in range(3):
            model(torch.randn(3, 4))
        self.assertExpectedInline(
            explain(model),
            """\
Guards of forward (test_guard_explainer.py:21): 1 cache entry
cache entry 0:
  39 guards on 7 objects: type 11, identity 9, contents 6, global state 4, tensor 3, tensor bookkeeping 3, aliasing 2, relation 1
    <globals and imports>: 13 guards
        identity of 9 objects
        type of 4 objects
    self: 11 guards
        type of 4 objects
        contents (5 key/length checks)
        2 same-object checks (e.g. self.__dict__['_modules'] is self._modules)
    self.layer: 7 guards
        type of 2 objects
        contents (1 key/length check)
        tensor metadata of 2 Parameters (all float32): dtype, device, shape, stride, requires_grad; all dims static
        2 dynamic-dim marker checks
    <global state>: 4 guards
        grad mode, autocast, default device, torch function modes
    x: 2 guards
        tensor metadata of 1 Tensor (dtype float32): dtype, device, shape, stride, requires_grad; all dims static
        1 dynamic-dim marker check
    <relations between inputs>: 1 guard
        relation: -9223372036854775808 <= self.step <= 9223372036854775806
    self.step: 1 guard  [scalar place: SymInt]
        type of 1 object""",  # noqa: E501
            skip=1,
        )

    def test_float_scalar_place(self):
        # A float the frame stores to (patch scalar-state) is a float64 tensor input: its
        # one guard is its type, and the explanation names how its place is traced.
        class Decay(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.temp = 1.0

            def forward(self, x):
                self.temp *= 0.9
                return x / self.temp

        model = torch.compile(Decay(), backend="eager")
        for _ in range(3):
            model(torch.randn(3))
        self.assertIn("self.temp: 1 guard  [scalar place: float64 tensor]", explain(model))

    def test_function_taking_dict_of_tensors(self):
        fn = torch.compile(add_all, backend="eager")
        fn({"weight": torch.randn(3), "scale": torch.randn(3), "bias": torch.randn(3)})
        self.assertExpectedInline(explain(fn), """\
Guards of add_all (test_guard_explainer.py:49): 1 cache entry
cache entry 0:
  12 guards on 2 objects: tensor bookkeeping 4, global state 4, tensor 3, type 1
    d: 8 guards
        type of 1 object
        tensor metadata of 3 Tensors (all float32): dtype, device, shape, stride, requires_grad; all dims static
        3 dynamic-dim marker checks, 1 no-aliasing check
    <global state>: 4 guards
        grad mode, autocast, default device, torch function modes""", skip=1)

    def test_full_lists_raw_lines(self):
        fn = torch.compile(add_all, backend="eager")
        fn({"weight": torch.randn(3), "scale": torch.randn(3), "bias": torch.randn(3)})
        full = torch._dynamo.explain_guards(fn, full=True, file=io.StringIO())
        # the raw lines of the tensors (the others hold type ids and machine state)
        raw = [line.strip() for line in full.splitlines() if line.strip().startswith("|") and "L['d']['" in line]
        self.assertExpectedInline("\n".join(raw), """\
| TENSOR_MATCH: check_tensor(L['d']['bias'], Tensor, DispatchKeySet(CPU, BackendSelect, ADInplaceOrView, AutogradCPU), torch.float32, device=None, requires_grad=False, size=[3], stride=[1])
| DIMENSION_DYNAMIC_MARKING_GUARD: hasattr(L['d']['bias'], '_dynamo_dynamic_indices') == False
| NO_TENSOR_ALIASING: check_no_aliasing(L['d']['bias'], L['d']['scale'], L['d']['weight'])
| TENSOR_MATCH: check_tensor(L['d']['scale'], Tensor, DispatchKeySet(CPU, BackendSelect, ADInplaceOrView, AutogradCPU), torch.float32, device=None, requires_grad=False, size=[3], stride=[1])
| DIMENSION_DYNAMIC_MARKING_GUARD: hasattr(L['d']['scale'], '_dynamo_dynamic_indices') == False
| TENSOR_MATCH: check_tensor(L['d']['weight'], Tensor, DispatchKeySet(CPU, BackendSelect, ADInplaceOrView, AutogradCPU), torch.float32, device=None, requires_grad=False, size=[3], stride=[1])
| DIMENSION_DYNAMIC_MARKING_GUARD: hasattr(L['d']['weight'], '_dynamo_dynamic_indices') == False""", skip=1)  # noqa: E501

    def test_command_line_explains_a_script(self):
        import subprocess
        import sys
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            script = f"{tmp}/compile_dict.py"
            with open(script, "w") as f:
                f.write(
                    "import torch\n"
                    "def scale(x, d):\n"
                    "    return x * d['a']\n"
                    "torch.compile(scale, backend='eager')(torch.randn(2), {'a': 2.0})\n"
                )
            proc = subprocess.run(
                [sys.executable, "-m", "torch._dynamo.guard_explainer", script],
                capture_output=True, text=True, cwd=tmp,
            )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertExpectedInline(proc.stdout, """\
Guards of scale (compile_dict.py:2): 1 cache entry
cache entry 0:
  8 guards on 3 objects: global state 4, type 1, value 1, tensor 1, tensor bookkeeping 1
    <global state>: 4 guards
        grad mode, autocast, default device, torch function modes
    d: 2 guards
        type of 1 object
        value: d['a'] == 2.0
    x: 2 guards
        tensor metadata of 1 Tensor (dtype float32): dtype, device, shape, stride, requires_grad; all dims static
        1 dynamic-dim marker check
""", skip=1)
        # Without this patch's lazy import torch._dynamo imports the module first: runpy warned.
        self.assertNotIn("RuntimeWarning", proc.stderr)
        self.assertEqual(proc.stderr, "")

    def test_command_line_help_is_plain_text(self):
        import subprocess
        import sys

        proc = subprocess.run(
            [sys.executable, "-W", "error", "-m", "torch._dynamo.guard_explainer", "--help"],
            capture_output=True, text=True,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("``", proc.stdout)
        self.assertExpectedInline(proc.stdout.split("positional arguments:", 1)[1], """\

  script      the Python script to run (further arguments are passed to it)

options:
  -h, --help  show this help message and exit
  --full      also print every raw guard line
""", skip=1)

    def test_function_never_compiled_has_no_cache_entries(self):
        def never_called(x):
            return x + 1

        text = explain(torch.compile(never_called, backend="eager"))
        self.assertExpectedInline(text.split(": ", 1)[1], """0 cache entries""")

    def test_tensor_metadata_names_dtypes_by_count(self):
        def mixed(d):
            return d["a"] + d["b"] + d["c"].sum()

        fn = torch.compile(mixed, backend="eager")
        fn({"a": torch.randn(3), "b": torch.randn(3), "c": torch.arange(3)})
        line = next(l for l in explain(fn).splitlines() if "tensor metadata" in l)
        self.assertExpectedInline(line.strip(), """\
tensor metadata of 3 Tensors (2 float32, 1 int64): dtype, device, shape, stride, requires_grad; all dims static""")

        def one(x):
            return x * 2

        fn = torch.compile(one, backend="eager")
        fn(torch.randn(2, dtype=torch.float64))
        line = next(l for l in explain(fn).splitlines() if "tensor metadata" in l)
        self.assertExpectedInline(line.strip(), """\
tensor metadata of 1 Tensor (dtype float64): dtype, device, shape, stride, requires_grad; all dims static""")

    def test_guard_classes_are_named_in_words(self):
        from torch._dynamo.guard_explainer import _leaf_category, _summarise, GuardLeaf

        def leaf(kind, code):
            return GuardLeaf("L['x']", kind, _leaf_category(kind, None, False), code)

        leaves = [
            leaf("DISPATCH_KEY_SET_MATCH", "___check_dispatch_key_set(x)"),
            leaf("DISPATCH_KEY_SET_MATCH", "___check_dispatch_key_set(x)"),
            leaf("DUAL_LEVEL_MATCH", "___check_dual_level(0)"),
            leaf("SOME_FUTURE_GUARD", "f(x)"),
            # A bool flag's guard is a value check, not a constant verdict.
            leaf("FALSE_MATCH", "L['x'].flag == False"),
        ]
        self.assertExpectedInline("\n".join(_summarise("x", leaves, {})), """\
x: 5 guards
    value: x.flag == False
    2 dispatch key set checks, 1 forward-AD dual level check, 1 some future check""")

        def kw(x, **kwargs):
            return x * kwargs["scale"]

        fn = torch.compile(kw, backend="eager")
        fn(torch.randn(2), scale=torch.randn(2))
        text = explain(fn)
        self.assertNotRegex(text, r"\b[A-Z]+_[A-Z_]+\b")  # no raw guard class name such as DICT_LENGTH

    def test_deallocated_object_reason_gets_no_explanation(self):
        from torch._dynamo.guard_explainer import annotate_recompile_reasons, describe_guard_failure

        reason = "Cache line invalidated because L['mod'] got deallocated"
        self.assertIsNone(describe_guard_failure(reason, {"Cache": object()}))
        self.assertEqual(list(annotate_recompile_reasons([reason], {})), [reason])

        def run(c, x):
            return x * c.scale

        fn = torch.compile(run, backend="eager")
        x = torch.randn(2)
        fn(type("C", (), {"scale": 2}), x)  # a class is guarded by identity (a weakref)
        gc.collect()
        torch._logging.set_logs(recompiles=True)
        try:
            with self.assertLogs("torch._dynamo", level=logging.DEBUG) as logs:
                fn(type("C", (), {"scale": 2}), x)  # the first class is gone: its entry was invalidated
        finally:
            torch._logging.set_logs()
        message = "\n".join(r.getMessage() for r in logs.records if "Recompiling" in r.getMessage())
        self.assertExpectedInline(textwrap.dedent(message.split("guard failure(s):\n", 1)[1]), """- 0/0: Cache line invalidated because L['c'] got deallocated""", skip=1)  # noqa: E501

    def test_explanation_of_length_and_value_guards(self):
        from torch._dynamo.guard_explainer import describe_guard_failure

        scope = {"xs": [1, 2, 3], "self": Counter()}
        self.assertEqual(
            describe_guard_failure("0/0: len(xs) == 2  # total(xs)  # f.py:1 in f", scope),
            "object xs: length of xs changed 2 -> 3",
        )
        self.assertEqual(
            describe_guard_failure("0/0: self.step == 7", scope),
            "object self.step: value of self.step changed 7 -> 0",
        )
        # reasons native guards (torch._dynamo._guard_accel) report
        native = [
            "xs[417]: dtype changed float32 -> float64",
            "d: key at position 3 changed 't3' -> 'zz'",
            "self.state[list(dict.keys(self.state))[4]]['buf']: the dict holding it changed keys ['buf'] -> []",
            "xs[3] and xs[417] are the same tensor, but the graph was compiled for distinct tensors",
            "self.param_groups[0]['params'][7] is list(dict.keys(self.state))[7] failed: "
            "the objects are no longer identical",
        ]
        self.assertExpectedInline(
            "\n".join(describe_guard_failure(f"0/0: {reason}", scope) for reason in native), """\
object xs, tensor xs[417]: dtype changed float32 -> float64
object d: d key at position 3 changed 't3' -> 'zz'
object self.state, tensor self.state[list(dict.keys(self.state))[4]]['buf']: the dict holding it changed keys ['buf'] -> []
object xs: xs[3] and xs[417] are the same tensor now
object self.param_groups: self.param_groups[0]['params'][7] is no longer list(dict.keys(self.state))[7]""", skip=1  # noqa: E501
        )
        # an item behind a non-constant key (Dynamo's list(dict.keys(d))[i]), read by identity
        key = object()
        state = {"self": type("Opt", (), {})()}
        state["self"].state = {key: {"buf": 1, "step": 2}}
        self.assertExpectedInline(
            describe_guard_failure("0/0: len(self.state[list(dict.keys(self.state))[0]]) != 1", state),
            """object self.state: length of self.state[list(dict.keys(self.state))[0]] changed 1 -> 2""",
            skip=1,
        )

    def test_explained_recompile_runs_no_user_code(self):
        # A recompile logged under TORCH_LOGS=recompiles calls a user __repr__ as
        # often with the explanation line as without it (Dynamo's own reason
        # formatting and guard building call it: the keys' repr is in their guards).
        reprs = []

        class Key(str):
            def __repr__(self):
                reprs.append(self)
                return f"Key({str(self)!r})"

        def total_of(d):
            out = torch.zeros(2)
            for v in d.values():
                out = out + v
            return out

        def recompile(explain_reasons):
            torch._dynamo.reset()
            cnt = torch._dynamo.testing.CompileCounter()
            fn = torch.compile(total_of, backend=cnt)
            d = {Key("a"): torch.ones(2)}
            self.assertEqual(fn(d), total_of(d))
            d[Key("b")] = torch.full((2,), 2.0)
            reprs.clear()
            torch._logging.set_logs(recompiles=True)
            try:
                with torch._dynamo.config.patch(explain_recompile_reasons=explain_reasons):
                    with self.assertLogs("torch._dynamo", level=logging.DEBUG) as logs:
                        self.assertEqual(fn(d), total_of(d))
            finally:
                torch._logging.set_logs()
            self.assertEqual(cnt.frame_count, 2)
            message = "\n".join(r.getMessage() for r in logs.records if "Recompiling" in r.getMessage())
            return len(reprs), message

        with_explanation, message = recompile(True)
        without, plain = recompile(False)
        self.assertGreater(without, 0)
        self.assertEqual(with_explanation, without)
        self.assertExpectedInline(textwrap.dedent(message.split("guard failure(s):\n", 1)[1]), """\
- 0/0: len(d) != 1
-   => object d: length of d changed 1 -> 2""", skip=1)
        plain_reasons = textwrap.dedent(plain.split("guard failure(s):\n", 1)[1])
        self.assertExpectedInline(plain_reasons, """- 0/0: len(d) != 1""", skip=1)

    def test_explanation_reads_values_without_user_code(self):
        from torch._dynamo.guard_explainer import describe_guard_failure

        calls = []

        class Loud:
            """Every hook that could run during an explanation records its call."""

            def __init__(self):
                self.plain = 3  # an instance attribute: read directly

            def __repr__(self):
                calls.append("__repr__")
                return "Loud()"

            def __len__(self):
                calls.append("__len__")
                return 1

            def __getitem__(self, key):
                calls.append("__getitem__")
                return 1

            def __getattr__(self, name):
                calls.append("__getattr__")
                return 1

            @property
            def prop(self):
                calls.append("prop")
                return 1

        class LoudList(list):
            def __len__(self):
                calls.append("LoudList.__len__")
                return 0

        class Cls:
            seen = [0] * 8  # a plain class attribute: read directly

        loud = Loud()
        scope = {"loud": loud, "xs": LoudList([1, 2]), "m": Cls(), "d": {"k": loud, "n": 5}}
        cases = {
            "0/0: loud.plain == 2": "object loud.plain: value of loud.plain changed 2 -> 3",
            "0/0: len(m.seen) == 7": "object m.seen: length of m.seen changed 7 -> 8",
            "0/0: len(loud) == 2": "object loud: length of loud changed 2 -> <unavailable>",
            "0/0: len(xs) == 3": "object xs: length of xs changed 3 -> <unavailable>",
            "0/0: loud.prop == 2": "object loud.prop: value of loud.prop changed 2 -> <unavailable>",
            "0/0: loud.missing == 2": "object loud.missing: value of loud.missing changed 2 -> <unavailable>",
            "0/0: d['k'] == 2": "object d: value of d['k'] changed 2 -> <Loud>",
            "0/0: d['n'] == 4": "object d: value of d['n'] changed 4 -> 5",
            "0/0: len(d) != 1": "object d: length of d changed 1 -> 2",
            "0/0: ___check_type_id(loud, 123), type=<class 'Loud'>": "object loud: type of loud changed -> Loud",
            "0/0: hasattr(loud, 'x')": "object loud: hasattr(loud, 'x') no longer holds (loud = <Loud>)",
            "0/0: str(loud) == 'a'": "object loud: str(loud) == 'a' no longer holds (loud = <Loud>)",
        }
        for reason, expected in cases.items():
            with self.subTest(reason=reason):
                self.assertEqual(describe_guard_failure(reason, scope), expected)
        self.assertEqual(calls, [])


class NativeGuardExplainerTests(torch._dynamo.test_case.TestCase):
    """Summaries and recompile reasons of native container guards (guard_accel)."""

    def setUp(self):
        super().setUp()
        from torch._dynamo import guard_accel

        if guard_accel.extension() is None:
            self.skipTest("torch._dynamo._guard_accel is not built")

    def test_list_of_1000_tensors_is_one_group(self):
        fn = torch.compile(total, backend="eager")
        fn([torch.randn(2) for _ in range(1000)])
        text = explain(fn)
        self.assertExpectedInline(
            text,
            """\
Guards of total (test_guard_explainer.py:53): 1 cache entry
cache entry 0:
  8 guards on 3 objects: global state 4, type 1, contents 1, accelerated container 1, tensor bookkeeping 1
    <global state>: 4 guards
        grad mode, autocast, default device, torch function modes
    xs: 3 guards  [accelerated container guard]
        tensor metadata of 1000 tensors in one native TensorContainerGuard (type, dispatch keys, dtype, device, shape, stride, requires_grad, identity)
        type of 1 object
        contents (1 key/length check)
    <no-aliasing check>: 1 guard
        one native no-aliasing check over 1000 tensors""",  # noqa: E501
            skip=1,
        )

    def test_recompile_reason_names_object_field_and_values(self):
        fn = torch.compile(total, backend="eager")
        xs = [torch.randn(2) for _ in range(10)]
        fn(xs)
        xs[7] = xs[7].double()
        torch._logging.set_logs(recompiles=True)
        try:
            with self.assertLogs("torch._dynamo", level=logging.DEBUG) as logs:
                fn(xs)
        finally:
            torch._logging.set_logs()
        message = "\n".join(r.getMessage() for r in logs.records if "Recompiling" in r.getMessage())
        # 10 tensors: one native TensorContainerGuard, which names the element itself.
        self.assertExpectedInline(textwrap.dedent(message.split("guard failure(s):\n", 1)[1]), """\
- 0/0: xs[7]: dtype changed float32 -> float64
-   => object xs, tensor xs[7]: dtype changed float32 -> float64""", skip=1)
        # The reasons Dynamo records and returns carry no explanation line.
        reasons = torch._dynamo.utils.guard_failures[total.__code__]
        self.assertEqual(reasons, ["0/0: xs[7]: dtype changed float32 -> float64"])


class NestedNativeGuardExplainerTests(torch._dynamo.test_case.TestCase):
    """Summaries of native guards over grads and per-tensor state (guard_accel)."""

    def setUp(self):
        super().setUp()
        from torch._dynamo import guard_accel

        if guard_accel.extension() is None:
            self.skipTest("torch._dynamo._guard_accel is not built")

    def test_optimizer_with_init_values_once(self):
        params = [torch.nn.Parameter(torch.randn(8)) for _ in range(200)]
        for p in params:
            p.grad = torch.randn(8)
        opt = LazySGD(params)
        step = torch.compile(opt.step, backend="eager")
        step()
        text = explain(step)
        self.assertExpectedInline(
            text,
            """\
Guards of step (test_guard_explainer.py:40): 1 cache entry
cache entry 0:
  20 guards on 6 objects: contents 5, global state 4, type 3, accelerated container 3, identity 3, value 1, tensor bookkeeping 1
    self.param_groups: 8 guards  [init_values_once[group], init_values_once[self.param_groups], accelerated container guard]
        tensor metadata of 200 tensors in one native TensorContainerGuard (type, dispatch keys, dtype, device, shape, stride, requires_grad, identity), with the .grad of 200 of them (200 tensor metadata)
        type of 2 objects
        contents (4 key/length checks)
        value: self.param_groups[0]['lr'] == 0.1
    <global state>: 4 guards
        grad mode, autocast, default device, torch function modes
    <globals and imports>: 3 guards
        identity of 3 objects
    self: 3 guards  [accelerated container guard]
        200 same-object checks in one native ObjectIdentityGuard (e.g. self.param_groups[0]['params'][0] is list(dict.keys(self.state))[0])
        type of 1 object
        contents (1 key/length check)
    <no-aliasing check>: 1 guard
        one native no-aliasing check over 400 tensors
    self.state: 1 guard  [init_values_once[self.state], accelerated container guard]
        tensor metadata of 200 tensors in one native TensorContainerGuard (type, dispatch keys, dtype, device, shape, stride, requires_grad, identity), with the .grad of 200 of them (200 None), and the keys in order of the 200 dicts holding them""",  # noqa: E501
            skip=1,
        )
        raw = str(_debug_get_cache_entry_list(LazySGD.step.__code__)[0].guard_manager)
        self.assertLessEqual(len(text.splitlines()), 40)
        # grads, state buffers and the param/state-key pairs are native guards
        # (guard_accel); without this patch the tree has over 2,000 lines.
        self.assertLess(len(raw.splitlines()), 60)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
