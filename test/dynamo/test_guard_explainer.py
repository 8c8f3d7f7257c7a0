# Owner(s): ["module: dynamo"]
"""torch._dynamo.explain_guards and the explained recompile reasons."""

import io
import logging
import unittest

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo import guard_accel
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


# The summaries below show the wheel's native container guards (guard_accel).
requires_native_guards = unittest.skipIf(
    guard_accel.extension() is None, "torch._dynamo._guard_accel is not built"
)


class GuardExplainerTests(torch._dynamo.test_case.TestCase):
    def test_module_with_counter(self):
        model = torch.compile(Counter(), backend="eager")
        for _ in range(3):
            model(torch.randn(3, 4))
        self.assertExpectedInline(explain(model), """\
Guards of forward (test_guard_explainer.py:21): 1 cache entry
cache entry 0:
  50 guards on 6 objects: tensor bookkeeping 15, type 11, identity 9, contents 5, global state 4, tensor 3, aliasing 2, relation 1
    self.layer: 15 guards
        type of 2 objects
        contents (1 key/length check)
        tensor metadata of 2 Parameter (float32x2): dtype, device, shape, stride, requires_grad; all dims static
        10 dynamic-dim marker checks
    <globals and imports>: 13 guards
        identity of 9 objects
        type of 4 objects
    self: 10 guards
        type of 4 objects
        contents (4 key/length checks)
        2 same-object checks (e.g. self.__dict__['_modules'] is self._modules)
    x: 6 guards
        tensor metadata of 1 Tensor (float32x1): dtype, device, shape, stride, requires_grad; all dims static
        5 dynamic-dim marker checks
    <global state>: 4 guards
        grad mode, autocast, default device, torch function modes
    self.step: 2 guards  [module scalar traced as SymInt (no value guard)]
        type of 1 object
        relation: -9223372036854775808 <= self.step <= 9223372036854775806""", skip=1)

    @requires_native_guards
    def test_optimizer_with_init_values_once(self):
        params = [torch.nn.Parameter(torch.randn(8)) for _ in range(200)]
        for p in params:
            p.grad = torch.randn(8)
        opt = LazySGD(params)
        step = torch.compile(opt.step, backend="eager")
        step()
        text = explain(step)
        self.assertExpectedInline(text, """\
Guards of step (test_guard_explainer.py:40): 1 cache entry
cache entry 0:
  23 guards on 6 objects: accelerated container 6, global state 4, type 4, contents 3, identity 3, tensor bookkeeping 2, value 1
    self.param_groups: 8 guards  [init_values_once[self.param_groups], accelerated container guard]
        tensor metadata of 200 tensors in one native TensorContainerGuard (type, dispatch keys, dtype, device, shape, stride, requires_grad, identity), with the .grad of 200 of them (200 tensor metadata)
        type of 3 objects
        contents (2 key/length checks)
        value: self.param_groups[0]['lr'] == 0.1
    <global state>: 4 guards
        grad mode, autocast, default device, torch function modes
    self: 4 guards  [init_values_once[self.state], accelerated container guard]
        200 same-object checks in one native ObjectIdentityGuard (e.g. self.param_groups[0]['params'][0] is list(dict.keys(self.state))[0])
        type of 1 object
        contents (1 key/length check)
    <globals and imports>: 3 guards
        identity of 3 objects
    <no-aliasing check>: 2 guards
        one native no-aliasing check over 400 tensors
    self.state: 2 guards  [init_values_once[self.state], accelerated container guard]
        tensor metadata of 200 tensors in one native TensorContainerGuard (type, dispatch keys, dtype, device, shape, stride, requires_grad, identity)""", skip=1)
        raw = str(_debug_get_cache_entry_list(LazySGD.step.__code__)[0].guard_manager)
        self.assertLessEqual(len(text.splitlines()), 40)
        # grads, state buffers and the param/state-key pairs are native guards
        # (guard_accel_nested); the stock tree has over 2,000 lines.
        self.assertLess(len(raw.splitlines()), 60)

    def test_function_taking_dict_of_tensors(self):
        fn = torch.compile(add_all, backend="eager")
        fn({"weight": torch.randn(3), "scale": torch.randn(3), "bias": torch.randn(3)})
        self.assertExpectedInline(explain(fn), """\
Guards of add_all (test_guard_explainer.py:49): 1 cache entry
cache entry 0:
  24 guards on 2 objects: tensor bookkeeping 16, global state 4, tensor 3, type 1
    d: 20 guards
        type of 1 object
        tensor metadata of 3 Tensor (float32x3): dtype, device, shape, stride, requires_grad; all dims static
        15 dynamic-dim marker checks, 1 no-aliasing check
    <global state>: 4 guards
        grad mode, autocast, default device, torch function modes""", skip=1)

    @requires_native_guards
    def test_list_of_1000_tensors_is_one_group(self):
        fn = torch.compile(total, backend="eager")
        fn([torch.randn(2) for _ in range(1000)])
        text = explain(fn)
        self.assertExpectedInline(text, """\
Guards of total (test_guard_explainer.py:53): 1 cache entry
cache entry 0:
  10 guards on 3 objects: global state 4, accelerated container 2, tensor bookkeeping 2, type 1, contents 1
    <global state>: 4 guards
        grad mode, autocast, default device, torch function modes
    xs: 4 guards  [accelerated container guard]
        tensor metadata of 1000 tensors in one native TensorContainerGuard (type, dispatch keys, dtype, device, shape, stride, requires_grad, identity)
        type of 1 object
        contents (1 key/length check)
    <no-aliasing check>: 2 guards
        one native no-aliasing check over 1000 tensors""", skip=1)

    def test_full_lists_raw_lines(self):
        fn = torch.compile(add_all, backend="eager")
        fn({"weight": torch.randn(3), "scale": torch.randn(3), "bias": torch.randn(3)})
        full = torch._dynamo.explain_guards(fn, full=True, file=io.StringIO())
        self.assertIn("| TENSOR_MATCH: check_tensor(L['d']['bias'], Tensor", full)
        self.assertGreater(len(full.splitlines()), len(explain(fn).splitlines()))

    @requires_native_guards
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
        self.assertIn("=> object xs, tensor xs[7]: dtype changed float32 -> float64", message)
        # The reasons Dynamo records and returns carry no explanation line.
        reasons = torch._dynamo.utils.guard_failures[total.__code__]
        self.assertEqual(reasons, ["0/0: xs[7]: dtype changed float32 -> float64"])

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
        self.assertIn("Guards of scale (compile_dict.py:2): 1 cache entry", proc.stdout)
        self.assertIn("value: d['a'] == 2.0", proc.stdout)

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
        # the reason a native TensorContainerGuard reports
        self.assertEqual(
            describe_guard_failure("0/0: xs[417]: dtype changed float32 -> float64", scope),
            "object xs, tensor xs[417]: dtype changed float32 -> float64",
        )


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
