# Owner(s): ["module: dynamo"]
"""nn.Module int attributes mutated by the compiled frame are traced as SymInts, float
attributes as 0-d float64 tensor inputs."""

import itertools
import math
import operator
import re

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend
from torch._dynamo.utils import counters, guard_failures


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.step = 0
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = x + 1
        self.step += 1
        return self.layer(x)


class CounterAfterItem(torch.nn.Module):
    """Counts its calls after a graph break (.item()): the resume function only steps
    the counter and stores a float."""

    def __init__(self):
        super().__init__()
        self.step = 0
        self.last = 0.0
        self.register_buffer("acc", torch.zeros(4))

    def forward(self, x):
        self.acc.add_(x.sum(0))
        total = self.acc.sum().item()  # a graph break
        self.step += 1
        self.last = total
        return self.step


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


class DecayBranch(Decay):
    """The value steers control flow: the comparison guards the relation."""

    def forward(self, x):
        self.temp *= 0.9
        if self.temp < 0.5:
            return x.cos() * self.temp
        return x.sin() * self.temp


class DecayRecord(Decay):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.temp *= 0.9
        self.seen.append(self.temp)
        return x * self.temp


class DecayArithmetic(Decay):
    """Every traced form: with constants (both sides, c / f), with itself, in place,
    unary, with float tensors (both sides, f / t), and a half tensor."""

    def forward(self, x):
        self.temp = 1.0 / (self.temp * 0.9 + 0.05) - 0.25
        self.temp -= 3 * self.temp / 7
        self.temp = abs(-self.temp) + 2 - (1.5 - self.temp) * float(self.temp)
        y = (x - self.temp) * self.temp / (x + 3.0) + self.temp / (x.abs() + 1.0)
        return y, x.half() / self.temp + self.temp


class DecayWithTensors(Decay):
    """`f op t` and `t op f` for + - * / with CPU tensors of every dtype the tensor
    form traces (integer tensors, 0-d tensors, half precision; complex operands take
    the default wrapping: test_scalar_state's attr_times_complex)."""

    ops = (operator.add, operator.sub, operator.mul, operator.truediv)

    def forward(self, tensors):
        self.temp = self.temp * 0.9 + 0.013
        out = []
        for t in tensors:
            for op in self.ops:
                out.append(op(t, self.temp))
                if t.dtype not in (torch.float16, torch.bfloat16) or op in (operator.add, operator.mul):
                    out.append(op(self.temp, t))
        return out


class DecayLoopPow(Decay):
    """An unsupported use in a loop, where Dynamo cannot graph-break."""

    def forward(self, x):
        self.temp *= 0.9
        for _ in range(2):
            x = x + math.exp(self.temp)
        return x


class Counted(Decay):
    """A float computed from an int counter (both mutated)."""

    def __init__(self):
        super().__init__()
        self.step = 0

    def forward(self, x):
        self.step += 1
        self.temp = self.temp * 0.5 + self.step / 3
        return x * self.temp


class EmaDecay(Decay):
    """Tensor methods taking the float, in place on a buffer and out of place."""

    def __init__(self):
        super().__init__()
        self.register_buffer("avg", torch.zeros(4))

    def forward(self, x):
        self.temp = self.temp * 0.5 + 0.45
        self.avg.mul_(self.temp).add_(x.mean(0).mul(1.0 - self.temp))
        return x.div(self.temp).sub(self.temp) + self.avg


class ScaleReadOnly(torch.nn.Module):
    """A float that is only read (the user changes it between calls)."""

    def __init__(self):
        super().__init__()
        self.scale = 0.5

    def forward(self, x):
        return x * self.scale


class DecayExp(Decay):
    def forward(self, x):
        self.temp *= 0.9
        return x * math.exp(self.temp)


class DecayInt(Decay):
    def forward(self, x):
        self.temp *= 0.9
        return x * int(self.temp * 10)


class DecayPow(Decay):
    """`**` of the float with a constant: traced on the float64 tensor (C pow(), as
    Python's float power), under a guard that the power is a finite float."""

    def forward(self, x):
        self.temp *= 0.9
        return x * self.temp**2


class DecayIntTensor(Decay):
    """An integer tensor promotes a float64 tensor differently from a float: it is
    cast to the default dtype first, as the op does."""

    def forward(self, x):
        self.temp *= 0.9
        return x + torch.arange(4) * self.temp


class DecayNan(Decay):
    def forward(self, x):
        self.temp = self.temp * 1e200 * 1e200 * 0.0  # inf * 0.0: nan from the second call
        return x * self.temp


class TripleStep(Counter):
    def forward(self, x):
        self.step += 1
        return x * (self.step * 3)


class NearInt64(torch.nn.Module):
    """Counters crossing the int64 bounds, which Python ints do not have."""

    def __init__(self):
        super().__init__()
        self.up = 2**63 - 3
        self.down = -(2**63) + 2

    def forward(self, x):
        self.up += 1
        self.down -= 1
        return x * self.up, x * (self.down // 2)


class FloatsOfCounters(torch.nn.Module):
    """Python floats computed from counters: a bias correction, and a count of samples
    beyond 2**24 (float32 holds no odd int there)."""

    def __init__(self):
        super().__init__()
        self.step = 0
        self.seen = 2**30 + 1

    def forward(self, x):
        self.step += 1
        self.seen += 2
        return x * (0.9 * (1.0 - 0.9**self.step)), x * (float(self.seen) - 2.0**30)


class DivideByTemp(torch.nn.Module):
    """temp is 0.0 in the third call, where Python raises ZeroDivisionError (the
    float64 tensor gives inf or nan)."""

    def __init__(self):
        super().__init__()
        self.temp = 3.0
        self.other = 0.75
        self.step = 3

    def forward(self, x):
        self.temp -= 1.0
        return x * (2.0 / self.temp)


class DivideComputed(DivideByTemp):
    def forward(self, x):
        self.temp -= 1.0
        return x * (1.0 / (self.temp * 0.5) + self.temp)


class DivideFloats(DivideByTemp):
    def forward(self, x):
        self.temp -= 1.0
        self.other *= 0.5
        return x * (self.other / self.temp)


class DivideInCall(DivideByTemp):
    def forward(self, x):
        self.temp -= 1.0
        return x * operator.truediv(1.0, self.temp)


class DivideByCounter(DivideByTemp):
    def forward(self, x):
        self.temp -= 1.0
        self.step -= 1
        return x * (self.temp / self.step)


class DivideByZeroConstant(DivideByTemp):
    def forward(self, x):
        self.temp -= 1.0
        return x * (self.temp / 0.0)


class DivideCaught(DivideByTemp):
    def forward(self, x):
        self.temp -= 1.0
        try:
            y = 1.0 / self.temp
        except ZeroDivisionError:
            y = -1.0
        return x * y


class DivideTensor(DivideByTemp):
    """Tensor division: inf at 0.0, in eager too."""

    def forward(self, x):
        self.temp -= 1.0
        return x / self.temp, self.temp / x


class ModuloTemp(DivideByTemp):
    def forward(self, x):
        self.temp -= 1.0
        return x * (1.0 % self.temp)


class FloorDivideTemp(DivideByTemp):
    def forward(self, x):
        self.temp -= 1.0
        return x * (1.0 // self.temp)


class DivmodTemp(DivideByTemp):
    def forward(self, x):
        self.temp -= 1.0
        return x * divmod(1.0, self.temp)[1]


class FmodTemp(DivideByTemp):
    def forward(self, x):
        self.temp -= 1.0
        return x * math.fmod(1.0, self.temp)


class IntDivideAfterStore(DivideByTemp):
    """An int counter stored before the division: 0 in the third call (scalars/79 of
    the differential fuzzer)."""

    def forward(self, x):
        self.step -= 1
        return x + 3 / self.step


class IntDivideBeforeStore(DivideByTemp):
    """The division reads the counter before the store (scalars/105)."""

    def forward(self, x):
        y = x + 1 / (self.step - 2)
        self.step -= 1
        return y


class IntFloorDivide(DivideByTemp):
    def forward(self, x):
        self.step -= 1
        return x * (7 // self.step) + 7 % self.step


class IntDivideCaught(DivideByTemp):
    def forward(self, x):
        self.step -= 1
        try:
            y = 1 / self.step
        except ZeroDivisionError:
            y = -1.0
        return x * y


class StepNet(Counter):
    def forward(self, x):
        self.step += 1
        return self.layer(x)


def train_step(model, x):
    loss = model(x).sum()
    loss.backward()  # graph break: the rest runs in a resume function
    return loss.detach() * model.step


class PlainState:
    def __init__(self):
        self.step = 0


def plain_fn(x, state):
    state.step += 1
    return x * state.step


class ManyCounters(torch.nn.Module):
    """`n` counters of the same module, each stepped by forward: `n` places marked by one trace."""

    def __init__(self, n=150, start=0):
        super().__init__()
        self.names = [f"c{i}" for i in range(n)]
        for i, name in enumerate(self.names):
            setattr(self, name, start + i)

    def forward(self, x):
        for i, name in enumerate(self.names):
            setattr(self, name, getattr(self, name) + i + 1)
        return x * getattr(self, self.names[-1]) + getattr(self, self.names[0])


class ManyDecays(ManyCounters):
    def __init__(self, n=150):
        super().__init__(n, start=1.0)

    def forward(self, x):
        for name in self.names:
            setattr(self, name, getattr(self, name) * 0.5)
        return x * getattr(self, self.names[-1]) + getattr(self, self.names[0])


def add_after_break(x):
    torch._dynamo.graph_break()
    return x + 1


class CounterThenInlinedBreak(Counter):
    def forward(self, x):
        self.step += 1
        y = add_after_break(x)  # a graph break in an inlined call: a speculation restart
        return y * self.step


def scalar_places_of(fn):
    """The records (source name -> how it is traced) of the places marked for fn's code."""
    from torch._dynamo.pgo import get_code_state

    code = fn.__code__
    states = [s for k, s in get_code_state().items() if (k.name, k.firstlineno) == (code.co_name, code.co_firstlineno)]
    return {name: how for s in states for name, how in s.scalar_places.items()}


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

    def restarts_of(self, fn):
        """Run fn; return how many times a frame's trace restarted and the restart reasons
        recorded in the compilation metrics."""
        torch._dynamo.utils.clear_compilation_metrics()
        with self.assertLogs("torch._dynamo.convert_frame", level="INFO") as logs:
            fn()
        restarts = sum(r.msg.startswith("Restarting analysis") for r in logs.records)
        reasons = [r for m in torch._dynamo.utils.get_compilation_metrics() for r in m.restart_reasons or ()]
        return restarts, reasons

    def step_many(self, cls, calls=3):
        """Step eager and compiled copies of `cls` alike (outputs and every counter equal
        after each call); check one frame and one restart; return the restart's reason."""
        eager, compiled = cls(), cls()
        cnt = CompileCounter()
        compiled_fn = torch.compile(compiled, backend=cnt)

        def run():
            for _ in range(calls):
                x = torch.randn(3)
                self.assertEqual(compiled_fn(x), eager(x))
                values = [getattr(compiled, n) for n in compiled.names]
                self.assertEqual(values, [getattr(eager, n) for n in eager.names])

        restarts, reasons = self.restarts_of(run)
        # All places marked by one trace: one frame, one restart whose reason names them.
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(restarts, 1)
        self.assertEqual(len(reasons), 1)
        return reasons[0]

    def test_many_counters_restart_once(self):
        # 150 places marked by one trace: one restart for all of them, not one per place (Dynamo
        # gives up on a frame after 100 restarts and runs it eagerly).
        reason = self.step_many(ManyCounters)
        self.assertIn("L['self'].c0 is a scalar mutated in the frame (0 -> 1); tracing it symbolically", reason)
        self.assertIn("and 147 more places", reason)

    def test_float_many_decays_restart_once(self):
        reason = self.step_many(ManyDecays)
        self.assertIn("L['self'].c0 is a float mutated in the frame (1.0 -> 0.5)", reason)
        self.assertIn("and 147 more places", reason)

    def test_counter_marked_before_a_speculation_restart(self):
        # The trace marks self.step, then an inlined call graph-breaks: the restart that
        # follows traces self.step symbolically (in the resume function too).
        cnt = self.run_both(CounterThenInlinedBreak, CompileCounter(), self.inputs((3,) * 5))
        self.assertEqual(cnt.frame_count, 2)

    def test_counter_only_resume_function_is_skipped(self):
        # The resume function after .item() does no tensor work: without this patch it
        # traces no op and Dynamo skips it (1 frame over 6 calls on unpatched 2.13,
        # measured). A graph of nothing but `step + 1` on the traced counter is skipped
        # alike; it compiled, and recompiled for `total` (3 frames under the eager
        # backend, 4 under aot_eager).
        for backend in ("eager", "aot_eager"):
            torch._dynamo.reset()
            cnt = CompileCounterWithBackend(backend)
            eager, compiled = CounterAfterItem(), CounterAfterItem()
            compiled_fn = torch.compile(compiled, backend=cnt)
            for x in self.inputs((3,) * 6):
                self.assertEqual(compiled_fn(x), eager(x))
                self.assertEqual((compiled.step, compiled.last), (eager.step, eager.last), atol=0, rtol=0)
                self.assertEqual(compiled.acc, eager.acc, atol=0, rtol=0)
            self.assertEqual(cnt.frame_count, 1, backend)

    def test_counter_compiles_once(self):
        cnt = self.run_both(Counter, CompileCounter(), self.inputs())
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(scalar_places_of(Counter.forward), {"L['self'].step": "SymInt"})

    def test_float_place_recorded(self):
        # (explain_guards' view of the record: test_guard_explainer.py, test_float_scalar_place)
        model = torch.compile(Decay(), backend="eager")
        for _ in range(3):
            model(torch.randn(3))
        self.assertEqual(scalar_places_of(Decay.forward), {"L['self'].temp": "float64 tensor"})

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
        # The list grows, so its length guard recompiles as without this patch; what matters is
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
        # As without this patch: one specialization per value seen, no restart, no SymInt.
        self.assertEqual(cnt.frame_count, 2)

    def test_plain_object_argument_keeps_default_behaviour(self):
        cnt = CompileCounter()
        compiled_fn = torch.compile(plain_fn, backend=cnt)
        eager_state, compiled_state = PlainState(), PlainState()
        for _ in range(10):
            x = torch.randn(3)
            self.assertEqual(compiled_fn(x, compiled_state), plain_fn(x, eager_state))
        self.assertEqual(compiled_state.step, eager_state.step)
        self.assertLessEqual(cnt.frame_count, 2)

    def test_counter_beyond_int64_is_right_under_inductor(self):
        # Without the int64 guards the kernel computes self.up + 1 in int64: the third
        # call returns x * -2**63 (and x * (self.down // 2) wrapped around), the fourth
        # fails ("expected int arg"). A counter whose next value leaves int64 is
        # specialized, as without this patch (a recompile per value).
        eager, compiled = NearInt64(), NearInt64()
        cnt = CompileCounterWithBackend("inductor")
        compiled_fn = torch.compile(compiled, backend=cnt)
        for _ in range(4):
            x = torch.randn(3, dtype=torch.float64)
            self.assertEqual(compiled_fn(x), eager(x), atol=0, rtol=0)
            self.assertEqual((compiled.up, compiled.down), (eager.up, eager.down))
        self.assertEqual(cnt.frame_count, 3)
        reasons = [r.split("#")[0].strip() for r in guard_failures[NearInt64.forward.__code__]]
        self.assertIn("0/0: -9223372036854775808 <= self.up <= 9223372036854775806", reasons)
        self.assertIn(f"0/1: self.up == {2**63 - 1}", reasons)
        # One record per place: each specialized once the graph computed beyond int64 from it.
        self.assertEqual(
            scalar_places_of(NearInt64.forward), dict.fromkeys(["L['self'].up", "L['self'].down"], "specialized int")
        )

    def test_counter_int64_guards(self):
        # Each int the graph computes from the counter (the input, step + 1,
        # 3 * (step + 1)) is guarded to fit in int64; the counter is specialized from
        # the call where one does not.
        torch.compile(TripleStep(), backend="eager")(torch.randn(3, 4))
        self.assertExpectedInline(step_guard_lines(TripleStep.forward), """\
GuardManager: source=L['self'].step, accessed_by=DictGetItemGuardAccessor('step'), type=<class 'int'>, tag_safe=(False, False)
TYPE_MATCH: ___check_type_id(L['self'].step, <id>), type=<class 'int'>
LAMBDA_GUARD: 3 + 3*L['self'].step >= -9223372036854775808
LAMBDA_GUARD: 3 + 3*L['self'].step <= 9223372036854775807
LAMBDA_GUARD: -9223372036854775808 <= L['self'].step <= 9223372036854775806""", skip=1)  # noqa: E501

        torch._dynamo.reset()
        eager, compiled = TripleStep(), TripleStep()
        eager.step = compiled.step = (2**63 - 1) // 3 - 3
        cnt = CompileCounter()
        compiled_fn = torch.compile(compiled, backend=cnt)
        for _ in range(5):
            x = torch.randn(3, 4, dtype=torch.float64)
            self.assertEqual(compiled_fn(x), eager(x), atol=0, rtol=0)
            self.assertEqual(compiled.step, eager.step)
        # 3 calls in the first frame, then one frame per value
        self.assertEqual(cnt.frame_count, 3)
        reasons = [r.split("#")[0].strip() for r in guard_failures[TripleStep.forward.__code__]]
        self.assertEqual(
            reasons,
            [
                "0/0: 3 + 3*self.step <= 9223372036854775807",
                f"0/1: self.step == {(2**63 - 1) // 3}",
                "0/0: 3 + 3*self.step <= 9223372036854775807",
            ],
        )

    def test_counter_floats_round_as_python(self):
        # Without this patch the counters are specialized: 8 frames (the recompile
        # limit; eager from then on), every result bitwise eager's. As SymInts, the
        # floats computed from them stay Python floats the graph computes at run time;
        # before, _tensorify_python_scalars computed them from their sympy expressions,
        # `0.9 - 0.9*0.9**step` (float64 results off by an ulp from the 1st call under
        # aot_eager) with `seen` read as a float32 tensor (x * 0.0 under aot_eager and
        # inductor). Inductor evaluates such a float from its sympy expression itself: its
        # float64 results are close, not bitwise (as for the ints Dynamo makes dynamic
        # without this patch).
        for backend, dtype in itertools.product(("eager", "aot_eager", "inductor"), (torch.float32, torch.float64)):
            torch._dynamo.reset()
            exact = not (backend == "inductor" and dtype == torch.float64)
            eager, compiled = FloatsOfCounters(), FloatsOfCounters()
            cnt = CompileCounterWithBackend(backend)
            compiled_fn = torch.compile(compiled, backend=cnt)
            for _ in range(12):
                x = torch.randn(8, dtype=dtype)
                if exact:
                    self.assertEqual(compiled_fn(x), eager(x), atol=0, rtol=0, msg=f"{backend} {dtype}")
                else:
                    self.assertEqual(compiled_fn(x), eager(x))
                self.assertEqual((compiled.step, compiled.seen), (eager.step, eager.seen))
            self.assertEqual(cnt.frame_count, 1)

    def test_counter_outside_int64_is_specialized(self):
        # No int64 graph input holds these values: specialized from the first call.
        for start in (2**64, -(2**64)):
            torch._dynamo.reset()
            eager, compiled = Counter(), Counter()
            compiled.load_state_dict(eager.state_dict())
            eager.step = compiled.step = start
            cnt = CompileCounter()
            compiled_fn = torch.compile(compiled, backend=cnt)
            for _ in range(3):
                x = torch.randn(3, 4)
                self.assertEqual(compiled_fn(x), eager(x))
                self.assertEqual(compiled.step, eager.step)
            self.assertEqual(cnt.frame_count, 3)
            reasons = [r.split("#")[0].strip() for r in guard_failures[Counter.forward.__code__]]
            self.assertEqual(reasons[0], f"0/0: self.step == {start}")

    def run_float(self, cls, backend, calls=10, **kwargs):
        """Eager and compiled copies of a float module on the same inputs: outputs and
        `temp` must be bitwise equal (and `temp` a Python float) after every call."""
        eager, compiled = cls(), cls()
        compiled_fn = torch.compile(compiled, backend=backend, **kwargs)
        for _ in range(calls):
            x = torch.randn(3, 4)
            self.assertEqual(compiled_fn(x), eager(x), atol=0, rtol=0, exact_dtype=True)
            self.assertIs(type(compiled.temp), float)
            self.assertEqual(compiled.temp, eager.temp, atol=0, rtol=0)
            if hasattr(eager, "seen"):
                self.assertEqual(compiled.seen, eager.seen, atol=0, rtol=0)
        return backend

    def test_float_decay_compiles_once(self):
        # Without this patch: 2 frames with the eager backend, 8 (the recompile limit) with
        # aot_eager, where _tensorify_python_scalars specializes the SymFloat.
        for backend in (CompileCounter(), CompileCounterWithBackend("aot_eager")):
            torch._dynamo.reset()
            cnt = self.run_float(Decay, backend)
            self.assertEqual(cnt.frame_count, 1)

    def test_float_decay_compiles_once_inductor(self):
        cnt = self.run_float(Decay, CompileCounterWithBackend("inductor"), calls=4)
        self.assertEqual(cnt.frame_count, 1)

    def test_float_arithmetic_is_bitwise_python(self):
        for backend in (CompileCounter(), CompileCounterWithBackend("aot_eager")):
            torch._dynamo.reset()
            counters.clear()
            cnt = self.run_float(DecayArithmetic, backend)
            self.assertEqual(cnt.frame_count, 1)
            self.assertEqual(sum(counters["graph_break"].values()), 0)

    def test_float_with_tensors_of_every_dtype_is_bitwise_eager(self):
        def tensors():
            return [
                torch.randn(50) * 3,
                torch.randn(50, dtype=torch.float64),
                torch.randn(50).half(),
                torch.randn(50).bfloat16(),
                torch.arange(-25, 25),
                torch.arange(1, 51, dtype=torch.int32),
                torch.arange(50, dtype=torch.uint8),
                torch.tensor(1.7),
                torch.tensor(1.3, dtype=torch.float64),
                torch.tensor(3),
            ]

        cnt = CompileCounter()
        eager, compiled = DecayWithTensors(), DecayWithTensors()
        compiled_fn = torch.compile(compiled, backend=cnt)
        for _ in range(4):
            ts = tensors()
            self.assertEqual(compiled_fn(ts), eager(ts), atol=0, rtol=0, exact_dtype=True)
            self.assertEqual(compiled.temp, eager.temp, atol=0, rtol=0)
        self.assertEqual(cnt.frame_count, 1)

    def test_float_in_tensor_methods(self):
        # Without this patch: 2 frames (eager backend), 6 (aot_eager), and wrong under inductor.
        for backend, calls in (
            (CompileCounter(), 6),
            (CompileCounterWithBackend("aot_eager"), 6),
            (CompileCounterWithBackend("inductor"), 3),
        ):
            torch._dynamo.reset()
            eager, compiled = EmaDecay(), EmaDecay()
            compiled_fn = torch.compile(compiled, backend=backend)
            for _ in range(calls):
                x = torch.randn(3, 4)
                self.assertEqual(compiled_fn(x), eager(x), atol=0, rtol=0)
                self.assertEqual(compiled.avg, eager.avg, atol=0, rtol=0)
                self.assertEqual(compiled.temp, eager.temp, atol=0, rtol=0)
            self.assertEqual(backend.frame_count, 1)

    def test_float_from_int_counter(self):
        for backend in (CompileCounter(), CompileCounterWithBackend("aot_eager")):
            torch._dynamo.reset()
            cnt = self.run_float(Counted, backend)
            self.assertEqual(cnt.frame_count, 1)

    def test_float_unsupported_use_with_fullgraph(self):
        # fullgraph=True: the restart wraps the attribute as without this patch, where
        # math.exp specializes it per value (3 frames over 3 calls there too), instead
        # of the frame failing.
        for kwargs in ({}, {"fullgraph": True}):
            torch._dynamo.reset()
            cnt = self.run_float(DecayLoopPow, CompileCounter(), calls=3, **kwargs)
            self.assertEqual(cnt.frame_count, 3, kwargs)

    def test_float_nan_needs_no_guard(self):
        cnt = self.run_float(DecayNan, CompileCounter(), calls=4)
        self.assertEqual(cnt.frame_count, 1)

    def test_float_branch_guards_the_relation(self):
        # `self.temp < 0.5` is decided under a guard on that relation of the value's
        # Python expression: one recompile when temp passes 0.5 (the 7th call), no
        # graph break, no guard on the value. Without this patch: 3 frames (eager backend), 8 (aot_eager).
        for backend in (CompileCounter(), CompileCounterWithBackend("aot_eager")):
            torch._dynamo.reset()
            counters.clear()
            cnt = self.run_float(DecayBranch, backend)
            self.assertEqual(cnt.frame_count, 2)
            self.assertEqual(sum(counters["graph_break"].values()), 0)
            reasons = "\n".join(guard_failures[DecayBranch.forward.__code__])
            self.assertIn("not ((self.temp * 0.9) < 0.5)", reasons)

    def test_float_escaping_into_list(self):
        # The list grows, so its length guard recompiles as without this patch.
        self.run_float(DecayRecord, CompileCounter(), calls=5)

    def test_float_unsupported_uses_fall_back_to_default_wrapping(self):
        # A use the float64 tensor cannot trace restarts with the attribute wrapped as
        # without this patch: the frames over 6 calls are those of unpatched torch
        # 2.15.0 (measured with these loops, CompileCounter / aot_eager), and nothing
        # graph-breaks. Before, DecayExp and DecayInt graph-broke (3 frames each).
        cases = [
            (DecayExp, 6, 7),  # math.exp specializes a SymFloat per value there too
            (DecayInt, 2, 7),
            (DecayLoopPow, 6, 7),  # in a loop
            # traced on the tensor form (the integer tensor is cast as the op casts it;
            # the power is pow() of the float64 tensors); unpatched 2.15.0: 2 / 7 each
            (DecayIntTensor, 1, 1),
            (DecayPow, 1, 1),
        ]
        for cls, frames, aot_frames in cases:
            for backend, expected in ((CompileCounter(), frames), (CompileCounterWithBackend("aot_eager"), aot_frames)):
                torch._dynamo.reset()
                counters.clear()
                cnt = self.run_float(cls, backend, calls=6)
                self.assertEqual(cnt.frame_count, expected, (cls.__name__, backend))
                self.assertEqual(sum(counters["graph_break"].values()), 0, cls.__name__)
            place = "float64 tensor" if cls in (DecayIntTensor, DecayPow) else "default float"
            self.assertEqual(scalar_places_of(cls.forward), {"L['self'].temp": place}, cls.__name__)

    def run_raising(self, cls, backend, calls=4):
        """Eager and compiled copies called alike: the same outputs or the same
        exception, the same attributes after every call."""
        eager, compiled = cls(), cls()
        compiled_fn = torch.compile(compiled, backend=backend)
        for _ in range(calls):
            x = torch.randn(3)
            outcomes = []
            for fn in (eager, compiled_fn):
                try:
                    outcomes.append(fn(x))
                except (ZeroDivisionError, ValueError) as e:
                    outcomes.append(repr(e))
            self.assertEqual(type(outcomes[1]), type(outcomes[0]), msg=(cls.__name__, outcomes))
            self.assertEqual(outcomes[1], outcomes[0], atol=0, rtol=0, msg=cls.__name__)
            state = [(m.temp, m.other, m.step) for m in (compiled, eager)]
            self.assertEqual(state[0], state[1], atol=0, rtol=0, msg=cls.__name__)
        return backend

    def test_float_division_by_zero_raises_as_python(self):
        # A nonzero divisor is guarded: `(self.temp - 1.0) != 0.0`. At zero, the
        # recompile raises ZeroDivisionError as Python does (uncaught: the frame runs
        # eagerly). Without the guard: inf or nan and no exception.
        # (model, frames over 4 calls, a recompile reason)
        cases = [
            (DivideByTemp, 1, "(self.temp - 1.0) != 0.0"),
            (DivideComputed, 1, "((self.temp - 1.0) * 0.5) != 0.0"),
            (DivideFloats, 1, "(self.temp - 1.0) != 0.0"),
            (DivideInCall, 1, "(self.temp - 1.0) != 0.0"),
            (DivideByCounter, 1, "((-1) + self.step) != 0"),
            (DivideByZeroConstant, 0, None),  # raises in every call, as Python
            # the handler is traced under `(self.temp - 1.0) == 0.0`
            (DivideCaught, 2, "(self.temp - 1.0) != 0.0"),
            # tensor division is inf in eager too: no guard
            (DivideTensor, 1, None),
        ]
        for backend in ("eager", "aot_eager"):
            for cls, frames, reason in cases:
                torch._dynamo.reset()
                cnt = self.run_raising(cls, CompileCounterWithBackend(backend))
                self.assertEqual(cnt.frame_count, frames, (cls.__name__, backend))
                reasons = [r.split("#")[0].strip() for r in guard_failures[cls.forward.__code__]]
                if reason is not None:
                    self.assertIn(f"0/0: {reason}", reasons, cls.__name__)
                if cls is DivideTensor:
                    (entry,) = torch._dynamo.eval_frame._debug_get_cache_entry_list(cls.forward)
                    self.assertNotIn("0.0", str(entry.guard_manager))

    def test_symfloat_division_by_zero_raises_as_python(self):
        # A number divided by a SymFloat (here a float attribute the tensor form cannot
        # trace `%`, `//` or divmod on, wrapped as without these patches: a SymFloat
        # once it changed) is guarded nonzero and at zero raises ZeroDivisionError as
        # Python does. Unpatched 2.15.0 (same loops; as 2.13) returns a wrong value for
        # `%` and `//` under the eager backend and fails the compile for `//` under
        # aot_eager (fake-tensor propagation divides by zero). Not here: `%` under
        # AOTAutograd, which unpatched 2.13 fails to compile for any value (its
        # _tensorify_python_scalars has no python_mod), and math.fmod, whose
        # fake-tensor propagation fails at zero there too.
        cases = [
            (ModuloTemp, "eager", 2),
            (FloorDivideTemp, "eager", 2),
            # torch 2.15.0's tensorify pass pins the SymFloat `//` takes once
            # (remove_tensorify_specialized_graphargs): one frame more than on 2.13
            (FloorDivideTemp, "aot_eager", 3),
            (DivmodTemp, "eager", 1),
            (DivmodTemp, "aot_eager", 1),
        ]
        for cls, backend, frames in cases:
            torch._dynamo.reset()
            cnt = self.run_raising(cls, CompileCounterWithBackend(backend))
            self.assertEqual(cnt.frame_count, frames, (cls.__name__, backend))
            if frames == 2:
                reasons = [r.split("#")[0].strip() for r in guard_failures[cls.forward.__code__]]
                self.assertIn("0/0: self.temp == 3.0", reasons, cls.__name__)

    def test_int_division_by_zero_raises_as_python(self):
        # A traced int counter that is 0 where the frame divides by it: Python raises
        # ZeroDivisionError (after the counter's store), as the compiled frame must; a
        # nonzero divisor is guarded. Without the guard, fake-tensor propagation of
        # `3 / 0` fails the compile (TorchRuntimeError) before the store happens.
        # (model, frames over 4 calls, a recompile reason)
        cases = [
            (IntDivideAfterStore, 1, "((-1) + self.step) != 0"),
            (IntDivideBeforeStore, 1, "((-2) + self.step) != 0"),
            (IntFloorDivide, 1, "((-1) + self.step) != 0"),
            # the handler is traced under `self.step - 1 == 0`
            (IntDivideCaught, 2, "((-1) + self.step) != 0"),
        ]
        for backend in ("eager", "aot_eager", "inductor"):
            for cls, frames, reason in cases:
                torch._dynamo.reset()
                cnt = self.run_raising(cls, CompileCounterWithBackend(backend))
                self.assertEqual(cnt.frame_count, frames, (cls.__name__, backend))
                reasons = [r.split("#")[0].strip() for r in guard_failures[cls.forward.__code__]]
                self.assertIn(f"0/0: {reason}", reasons, (cls.__name__, reasons))

    def test_float_division_by_zero_raises_as_python_inductor(self):
        # Without the divisor guard: inf in the third call.
        cnt = self.run_raising(DivideComputed, CompileCounterWithBackend("inductor"))
        self.assertEqual(cnt.frame_count, 1)

    def test_float_divisor_guard(self):
        model = torch.compile(DivideComputed(), backend="eager")
        model(torch.randn(3))
        self.assertExpectedInline(step_guard_lines(DivideComputed.forward, "temp"), """\
GuardManager: source=L['self'].temp, accessed_by=DictGetItemGuardAccessor('temp'), type=<class 'float'>, tag_safe=(False, False)
TYPE_MATCH: ___check_type_id(L['self'].temp, <id>), type=<class 'float'>
LAMBDA_GUARD: ((L['self'].temp - 1.0) * 0.5) != 0.0""", skip=1)  # noqa: E501

    def test_read_only_float_keeps_default_specialization(self):
        eager, compiled = ScaleReadOnly(), ScaleReadOnly()
        cnt = CompileCounter()
        compiled_fn = torch.compile(compiled, backend=cnt)
        for scale in (0.5, 0.5, 0.25, 0.125, 0.125):
            eager.scale = compiled.scale = scale
            x = torch.randn(3, 4)
            self.assertEqual(compiled_fn(x), eager(x), atol=0, rtol=0)
        # Without this patch: specialized on the first compile, a SymFloat after the first change.
        self.assertEqual(cnt.frame_count, 2)

    def test_float_switches_off_restore_default_behaviour(self):
        for patch in (
            {"scalar_state": False},
            {"specialize_float": True},
        ):
            torch._dynamo.reset()
            with torch._dynamo.config.patch(**patch):
                cnt = self.run_float(Decay, CompileCounter(), calls=4)
            self.assertEqual(cnt.frame_count, 4 if "specialize_float" in patch else 2, patch)

    def test_counter_read_after_backward_graph_break(self):
        # The resume function after `loss.backward()` shares the marks of its frame:
        # model.step is a SymInt there from the first compile. Without the shared
        # marks: a recompile of the resume function per step, up to the limit.
        for backend in ("eager", "aot_eager", "inductor"):
            torch._dynamo.reset()
            torch.manual_seed(0)
            eager, compiled = StepNet(), StepNet()
            compiled.load_state_dict(eager.state_dict())
            cnt = CompileCounterWithBackend(backend)
            fn = torch.compile(train_step, backend=cnt)
            for _ in range(6):
                x = torch.randn(3, 4)
                self.assertEqual(fn(compiled, x), train_step(eager, x))
                self.assertEqual(compiled.step, eager.step)
                self.assertEqual(compiled.layer.weight.grad, eager.layer.weight.grad)
            # the graph before the break and the resume function's
            self.assertEqual(cnt.frame_count, 2, backend)

    def test_switch_off_restores_default_specialization(self):
        with torch._dynamo.config.patch(scalar_state=False):
            cnt = self.run_both(Counter, CompileCounter(), self.inputs((3,) * 4))
        self.assertEqual(cnt.frame_count, 4)

    def test_respects_no_automatic_dynamic_and_specialize_int(self):
        for patch in ({"automatic_dynamic_shapes": False}, {"specialize_int": True}):
            torch._dynamo.reset()
            with torch._dynamo.config.patch(**patch):
                cnt = self.run_both(Counter, CompileCounter(), self.inputs((3,) * 3))
            self.assertEqual(cnt.frame_count, 3, patch)


def step_guard_lines(fn, name="step"):
    """The guards on L['self'].<name> of every cache entry of `fn`, as TORCH_LOGS=guards
    prints them, without tree drawing, object ids and source comments."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    entries = []
    for entry in _debug_get_cache_entry_list(fn):
        lines = []
        for line in str(entry.guard_manager).splitlines():
            if f"L['self'].{name}" in line:
                line = re.sub(r"^[| ]*\+- ", "", line)
                line = re.sub(r"\s+#.*$", "", line)
                lines.append(re.sub(r"(___check_(?:type|obj)_id\(.*?, )\d+", r"\1<id>", line))
        entries.append("\n".join(lines))
    return "\n--\n".join(reversed(entries))


class ModuleScalarGuardTests(torch._dynamo.test_case.TestCase):
    def test_counter_guards_have_no_value_equality(self):
        model = torch.compile(Counter(), backend="eager")
        for _ in range(3):
            model(torch.randn(3, 4))
        self.assertExpectedInline(step_guard_lines(Counter.forward), """\
GuardManager: source=L['self'].step, accessed_by=DictGetItemGuardAccessor('step'), type=<class 'int'>, tag_safe=(False, False)
TYPE_MATCH: ___check_type_id(L['self'].step, <id>), type=<class 'int'>
LAMBDA_GUARD: -9223372036854775808 <= L['self'].step <= 9223372036854775806""", skip=1)  # noqa: E501

    def test_parity_guards_on_the_relation_only(self):
        model = torch.compile(Parity(), backend="eager")
        for _ in range(3):
            model(torch.randn(3, 4))
        self.assertExpectedInline(step_guard_lines(Parity.forward), """\
GuardManager: source=L['self'].step, accessed_by=DictGetItemGuardAccessor('step'), type=<class 'int'>, tag_safe=(False, False)
TYPE_MATCH: ___check_type_id(L['self'].step, <id>), type=<class 'int'>
LAMBDA_GUARD: ((1 + L['self'].step) % 2) == 0
LAMBDA_GUARD: -9223372036854775808 <= L['self'].step <= 9223372036854775806
--
GuardManager: source=L['self'].step, accessed_by=DictGetItemGuardAccessor('step'), type=<class 'int'>, tag_safe=(False, False)
TYPE_MATCH: ___check_type_id(L['self'].step, <id>), type=<class 'int'>
LAMBDA_GUARD: ((1 + L['self'].step) % 2) != 0
LAMBDA_GUARD: -9223372036854775808 <= L['self'].step <= 9223372036854775806""", skip=1)  # noqa: E501

    def test_decay_guards_have_no_value_equality_and_no_nan_lambda(self):
        model = torch.compile(Decay(), backend="aot_eager")
        for _ in range(3):
            model(torch.randn(3, 4))
        self.assertExpectedInline(step_guard_lines(Decay.forward, "temp"), """\
GuardManager: source=L['self'].temp, accessed_by=DictGetItemGuardAccessor('temp'), type=<class 'float'>, tag_safe=(False, False)
TYPE_MATCH: ___check_type_id(L['self'].temp, <id>), type=<class 'float'>""", skip=1)  # noqa: E501
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        (entry,) = _debug_get_cache_entry_list(Decay.forward)
        self.assertNotIn("isnan", str(entry.guard_manager))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
