# Owner(s): ["module: dynamo"]
"""nn.Module int attributes mutated by the compiled frame are traced as SymInts."""

import re

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.step = 0
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = x + 1
        self.step += 1
        return self.layer(x)


class Parity(Counter):
    def forward(self, x):
        self.step += 1
        if self.step % 2 == 0:
            return x.cos()
        return x.sin()


class ScaleByStep(Counter):
    def forward(self, x):
        self.step += 1
        return x * self.step


class RecordSteps(Counter):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.step += 1
        self.seen.append(self.step)
        return x + self.step


class ViewRows(torch.nn.Module):
    """`n` is configuration: only read, changed between calls by the user."""

    def __init__(self):
        super().__init__()
        self.n = 2

    def forward(self, x):
        return x.view(self.n, -1) * 2


class Decay(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.temp = 1.0

    def forward(self, x):
        self.temp *= 0.9
        return x / self.temp


class PlainState:
    def __init__(self):
        self.step = 0


def plain_fn(x, state):
    state.step += 1
    return x * state.step


class ModuleScalarTests(torch._dynamo.test_case.TestCase):
    def run_both(self, cls, backend, inputs):
        """Call eager and compiled copies on the same inputs; compare every output and the
        final attributes; return the backend (its frame_count)."""
        torch.manual_seed(0)
        eager, compiled = cls(), cls()
        compiled.load_state_dict(eager.state_dict())
        compiled_fn = torch.compile(compiled, backend=backend)
        for x in inputs:
            self.assertEqual(compiled_fn(x), eager(x))
        for name in ("step", "seen", "n", "temp"):
            if hasattr(eager, name):
                self.assertEqual(getattr(compiled, name), getattr(eager, name))
        return backend

    def inputs(self, rows=(3,) * 10):
        return [torch.randn(r, 4) for r in rows]

    def test_counter_compiles_once(self):
        cnt = self.run_both(Counter, CompileCounter(), self.inputs())
        self.assertEqual(cnt.frame_count, 1)

    def test_counter_compiles_once_aot_eager(self):
        cnt = self.run_both(Counter, CompileCounterWithBackend("aot_eager"), self.inputs())
        self.assertEqual(cnt.frame_count, 1)

    def test_counter_compiles_once_inductor(self):
        cnt = self.run_both(Counter, CompileCounterWithBackend("inductor"), self.inputs((3,) * 4))
        self.assertEqual(cnt.frame_count, 1)

    def test_counter_with_changing_rows(self):
        # One compile, plus one when the batch dimension goes dynamic.
        cnt = self.run_both(Counter, CompileCounter(), self.inputs((3, 4, 5, 3, 4, 5)))
        self.assertLessEqual(cnt.frame_count, 2)

    def test_parity_branch_compiles_once_per_branch(self):
        for backend in (CompileCounter(), CompileCounterWithBackend("aot_eager")):
            torch._dynamo.reset()
            cnt = self.run_both(Parity, backend, self.inputs())
            self.assertEqual(cnt.frame_count, 2)

    def test_value_used_in_compute(self):
        cnt = self.run_both(ScaleByStep, CompileCounter(), self.inputs())
        self.assertEqual(cnt.frame_count, 1)

    def test_value_escaping_into_list(self):
        # The list grows, so its length guard recompiles as in stock; what matters is
        # that the residual writes plain ints, equal to eager's, into it.
        model = RecordSteps()
        eager = RecordSteps()
        compiled_fn = torch.compile(model, backend=CompileCounter())
        for x in self.inputs((3,) * 5):
            self.assertEqual(compiled_fn(x), eager(x))
        self.assertEqual(model.seen, eager.seen)
        self.assertEqual([type(v) for v in model.seen], [int] * 5)

    def test_read_only_int_used_as_shape_stays_specialized(self):
        torch.manual_seed(0)
        eager, compiled = ViewRows(), ViewRows()
        cnt = CompileCounter()
        compiled_fn = torch.compile(compiled, backend=cnt)
        for n in (2, 2, 3, 3, 2):
            eager.n = compiled.n = n
            x = torch.randn(6, 4)
            self.assertEqual(compiled_fn(x), eager(x))
        # Stock behaviour: one specialization per value seen, no restart, no SymInt.
        self.assertEqual(cnt.frame_count, 2)

    def test_plain_object_argument_keeps_stock_behaviour(self):
        cnt = CompileCounter()
        compiled_fn = torch.compile(plain_fn, backend=cnt)
        eager_state, compiled_state = PlainState(), PlainState()
        for _ in range(10):
            x = torch.randn(3)
            self.assertEqual(compiled_fn(x, compiled_state), plain_fn(x, eager_state))
        self.assertEqual(compiled_state.step, eager_state.step)
        self.assertLessEqual(cnt.frame_count, 2)

    def test_float_attribute_keeps_stock_behaviour(self):
        # Floats are not made symbolic (see module_scalars.SCALAR_TYPES); the decay
        # must still be written back and used correctly on every call.
        for backend in (CompileCounter(), CompileCounterWithBackend("aot_eager")):
            torch._dynamo.reset()
            self.run_both(Decay, backend, self.inputs((3,) * 10))

    def test_switch_off_restores_stock_specialization(self):
        with torch._dynamo.config.patch(dynamic_mutated_module_scalars=False):
            cnt = self.run_both(Counter, CompileCounter(), self.inputs((3,) * 4))
        self.assertEqual(cnt.frame_count, 4)

    def test_respects_no_automatic_dynamic_and_specialize_int(self):
        for patch in ({"automatic_dynamic_shapes": False}, {"specialize_int": True}):
            torch._dynamo.reset()
            with torch._dynamo.config.patch(**patch):
                cnt = self.run_both(Counter, CompileCounter(), self.inputs((3,) * 3))
            self.assertEqual(cnt.frame_count, 3, patch)


def step_guard_lines(fn):
    """The guards on L['self'].step of every cache entry of `fn`, as TORCH_LOGS=guards
    prints them, without tree drawing, object ids and source comments."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    entries = []
    for entry in _debug_get_cache_entry_list(fn):
        lines = []
        for line in str(entry.guard_manager).splitlines():
            if "L['self'].step" in line:
                line = re.sub(r"^[| ]*\+- ", "", line)
                line = re.sub(r"\s+#.*$", "", line)
                lines.append(re.sub(r"\b\d{6,}\b", "<id>", line))
        entries.append("\n".join(lines))
    return "\n--\n".join(reversed(entries))


class ModuleScalarGuardTests(torch._dynamo.test_case.TestCase):
    def test_counter_guards_have_no_value_equality(self):
        model = torch.compile(Counter(), backend="eager")
        for _ in range(3):
            model(torch.randn(3, 4))
        self.assertExpectedInline(step_guard_lines(Counter.forward), """\
GuardManager: source=L['self'].step, accessed_by=DictGetItemGuardAccessor('step'), type=<class 'int'>, tag_safe=(False, False)
TYPE_MATCH: ___check_type_id(L['self'].step, <id>), type=<class 'int'>""", skip=1)

    def test_parity_guards_on_the_relation_only(self):
        model = torch.compile(Parity(), backend="eager")
        for _ in range(3):
            model(torch.randn(3, 4))
        self.assertExpectedInline(step_guard_lines(Parity.forward), """\
GuardManager: source=L['self'].step, accessed_by=DictGetItemGuardAccessor('step'), type=<class 'int'>, tag_safe=(False, False)
TYPE_MATCH: ___check_type_id(L['self'].step, <id>), type=<class 'int'>
LAMBDA_GUARD: ((1 + L['self'].step) % 2) == 0
--
GuardManager: source=L['self'].step, accessed_by=DictGetItemGuardAccessor('step'), type=<class 'int'>, tag_safe=(False, False)
TYPE_MATCH: ___check_type_id(L['self'].step, <id>), type=<class 'int'>
LAMBDA_GUARD: ((1 + L['self'].step) % 2) != 0""", skip=1)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
