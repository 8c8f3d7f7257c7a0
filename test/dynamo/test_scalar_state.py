# Owner(s): ["module: dynamo"]
"""Python ints and floats the compiled code keeps changing at any sourced place (object
attributes, dict entries such as an optimizer's state[p]['step'], list slots) are
traced symbolically from their first store; ints specialized on their value whatever
automatic dynamic says become dynamic after one observed change (scalar_state.py)."""

import collections
import copy
import math
import re

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend
from torch._dynamo.utils import guard_failures
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize

try:
    from .test_module_scalars import scalar_places_of
except ImportError:
    from test_module_scalars import scalar_places_of


class StepStateOpt(torch.optim.Optimizer):
    """An int `step` in per-parameter state, created on the first call (timm AdaBelief)."""

    def __init__(self, params, lr=0.1, beta=0.9):
        super().__init__(params, dict(lr=lr, beta=beta))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["avg"] = torch.zeros_like(p)
                state["step"] += 1
                state["avg"].mul_(group["beta"]).add_(p.grad)
                p.sub_(state["avg"] * (group["lr"] / state["step"]))


class EmaStateOpt(StepStateOpt):
    """A float EMA of the lr kept in per-parameter state (timm LaProp)."""

    @staticmethod
    def update_ema_lr(state, group):
        if len(state) == 0:
            state["ema_lr"] = 0.0
        state["ema_lr"] = state["ema_lr"] * group["beta"] + (1 - group["beta"]) * group["lr"]

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                self.update_ema_lr(state, group)
                p.sub_(p.grad * state["ema_lr"])


class GroupStepOpt(StepStateOpt):
    """An int `step` in the param group (timm Adan, MADGRAD)."""

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            if "step" in group:
                group["step"] += 1
            else:
                group["step"] = 1
            for p in group["params"]:
                p.sub_(p.grad * (group["lr"] / group["step"]))


def opt_step(opt):
    opt.step()


class PlainCounter:
    def __init__(self):
        self.count = 0
        self.seen = [0]


def count_calls(x, c):
    c.count += 1
    c.seen[0] += 2
    return x * c.count + c.seen[0]


def count_mod(x, c):
    c.count += 1
    if c.count % 3 == 0:
        return x.cos()
    return x.sin()


def count_size(x, c):
    c.count += 1
    return x.sum() + torch.ones(c.count).sum()


class EmaState:
    def __init__(self):
        self.state = {"ema": 1.0}


def ema(x, s):
    s.state["ema"] = s.state["ema"] * 0.5 + 0.25
    return x * s.state["ema"]


def ema_branch(x, s):
    s.state["ema"] = s.state["ema"] * 0.5 + 0.25
    if s.state["ema"] > 0.6:
        return x.cos() * s.state["ema"]
    return x.sin()


def state_of(obj):
    if isinstance(obj, torch.optim.Optimizer):
        return (
            # (Dynamo's OptimizerVariable adds 'capturable' to the compiled copy's groups)
            [{k: v for k, v in g.items() if k not in ("params", "capturable")} for g in obj.param_groups],
            [dict(s) for s in obj.state.values()],
            [p.detach().clone() for g in obj.param_groups for p in g["params"]],
        )
    return copy.deepcopy(vars(obj))


class ScalarStateTests(torch._dynamo.test_case.TestCase):
    def run_opt(self, cls, backend, calls=6, exact=True, sizes=(4, 3)):
        """Eager and compiled copies of an optimizer over parameters of `sizes` stepped
        alike: parameters, groups and state equal after every call (tensor values bitwise
        unless exact=False, then with the default tolerances); returns the backend."""
        torch.manual_seed(0)
        params = [torch.randn(n, requires_grad=True) for n in sizes]
        copies = [[p.detach().clone().requires_grad_() for p in params] for _ in range(2)]
        eager, compiled = cls(copies[0]), cls(copies[1])
        fn = torch.compile(opt_step, backend=backend)
        for i in range(calls):
            for ps in copies:
                for j, p in enumerate(ps):
                    p.grad = torch.full_like(p, 0.1 * (i + j + 1))
            opt_step(eager)
            fn(compiled)
            if exact:
                self.assertEqual(state_of(compiled), state_of(eager), atol=0, rtol=0)
            else:
                groups, states, values = state_of(compiled)
                eager_groups, eager_states, eager_values = state_of(eager)
                self.assertEqual((groups, states), (eager_groups, eager_states), atol=0, rtol=0)
                self.assertEqual(values, eager_values)
        return backend

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_optimizer_int_step_in_state(self, backend):
        # The first call fills the empty state (a constant in that frame), the second
        # stores to state[p]['step'] and traces it as a SymInt. Without this patch: a
        # recompile per step.
        cnt = self.run_opt(StepStateOpt, CompileCounterWithBackend(backend))
        self.assertEqual(cnt.frame_count, 2)

    def test_optimizer_int_steps_of_many_params_restart_once(self):
        # 150 state[p]['step'] places, all marked by the second call's trace: one restart
        # for all of them (Dynamo gives up on a frame after 100 restarts).
        cnt = self.run_opt(StepStateOpt, CompileCounter(), calls=3, sizes=(2,) * 150)
        self.assertEqual(cnt.frame_count, 2)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_optimizer_float_ema_in_state(self, backend):
        cnt = self.run_opt(EmaStateOpt, CompileCounterWithBackend(backend))
        self.assertEqual(cnt.frame_count, 2)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_optimizer_int_step_in_param_group(self, backend):
        cnt = self.run_opt(GroupStepOpt, CompileCounterWithBackend(backend))
        self.assertEqual(cnt.frame_count, 2)

    def run_fn(self, fn, make, backend, calls=6, between=None):
        eager, compiled = make(), make()
        cfn = torch.compile(fn, backend=backend)
        for i in range(calls):
            if between is not None:
                between(eager, i)
                between(compiled, i)
            x = torch.randn(3)
            self.assertEqual(cfn(x, compiled), fn(x, eager), atol=0, rtol=0)
            self.assertEqual(state_of(compiled), state_of(eager), atol=0, rtol=0)
        return backend

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_plain_object_counter_and_list_slot(self, backend):
        # Without this patch: 2 frames (automatic dynamic after the first change).
        cnt = self.run_fn(count_calls, PlainCounter, CompileCounterWithBackend(backend))
        self.assertEqual(cnt.frame_count, 1)

    def test_counter_reset_from_outside(self):
        def reset(c, i):
            if i == 3:
                c.count = 0

        cnt = self.run_fn(count_calls, PlainCounter, CompileCounterWithBackend("eager"), between=reset)
        self.assertEqual(cnt.frame_count, 1)

    def test_branch_on_counter_modulo(self):
        cnt = self.run_fn(count_mod, PlainCounter, CompileCounterWithBackend("aot_eager"), calls=7)
        self.assertEqual(cnt.frame_count, 2)  # one graph per branch
        reasons = [r.split("#")[0].strip() for r in guard_failures[count_mod.__code__]]
        self.assertIn("0/0: ((1 + c.count) % 3) != 0", reasons)

    def test_counter_used_as_a_size(self):
        self.run_fn(count_size, PlainCounter, CompileCounterWithBackend("aot_eager"))

    def test_counter_turning_float_from_outside(self):
        def to_float(c, i):
            if i == 2:
                c.count = 2.5

        cnt = self.run_fn(count_calls, PlainCounter, CompileCounterWithBackend("eager"), between=to_float)
        self.assertEqual(cnt.frame_count, 2)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_float_ema_in_dict(self, backend):
        cnt = self.run_fn(ema, EmaState, CompileCounterWithBackend(backend))
        self.assertEqual(cnt.frame_count, 1)
        (entry,) = torch._dynamo.eval_frame._debug_get_cache_entry_list(ema)
        self.assertNotIn("isnan", str(entry.guard_manager))

    def test_float_branch_graph_breaks_on_the_real_value(self):
        self.run_fn(ema_branch, EmaState, CompileCounterWithBackend("aot_eager"))

    def test_places_created_in_the_frame_stay_constants(self):
        def fill(x, d):
            d["step"] = 0
            d["step"] += 1
            return x + d["step"]

        cnt = CompileCounterWithBackend("eager")
        cfn = torch.compile(fill, backend=cnt)
        for _ in range(3):
            d = {}
            self.assertEqual(cfn(torch.ones(2), d), torch.ones(2) + 1)
            self.assertEqual(d, {"step": 1})
        self.assertEqual(cnt.frame_count, 1)
        (entry,) = torch._dynamo.eval_frame._debug_get_cache_entry_list(fill)
        self.assertNotIn("L['d']['step']", str(entry.guard_manager))

    def test_switches_off_restore_previous_behaviour(self):
        with torch._dynamo.config.patch(scalar_state=False):
            cnt = self.run_fn(count_calls, PlainCounter, CompileCounterWithBackend("eager"))
        self.assertEqual(cnt.frame_count, 2)
        torch._dynamo.reset()
        with torch._dynamo.config.patch(scalar_state=False):
            cnt = self.run_opt(StepStateOpt, CompileCounterWithBackend("eager"))
        self.assertEqual(cnt.frame_count, 3)


class EmaLrOpt(EmaStateOpt):
    """timm LaProp's step size: a float EMA of the lr in per-parameter state, compared
    with 0. and passed to the kernel as ``alpha=``."""

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                self.update_ema_lr(state, group)
                step_size = group["lr"] / state["ema_lr"] if state["ema_lr"] != 0.0 else 0.0
                p.add_(p.grad, alpha=-step_size)


class ScalarListOpt(StepStateOpt):
    """pytorch-optimizer's A2Grad: a float per parameter in its state, decayed each
    step, passed as a foreach op's ScalarList."""

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = group["params"]
            for p in params:
                if len(self.state[p]) == 0:
                    self.state[p]["alpha"] = 1.0
            grads = [p.grad.clone() for p in params]
            torch._foreach_mul_(grads, [group["lr"] * self.state[p]["alpha"] for p in params])
            torch._foreach_sub_(params, grads)
            for p in params:
                self.state[p]["alpha"] = self.state[p]["alpha"] * group["beta"]


class EmaWarmupOpt(EmaStateOpt):
    """A branch on a float EMA that flips once (the EMA of the lr passes half the lr)."""

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                self.update_ema_lr(state, group)
                if state["ema_lr"] > 0.5 * group["lr"]:
                    p.sub_(p.grad * state["ema_lr"])
                else:
                    p.sub_(p.grad * group["lr"])


class GroupPowOpt(StepStateOpt):
    """pytorch-optimizer's bias corrections: ``math.pow(beta, group['step'])``."""

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            if "step" not in group:
                group["step"] = 0
            group["step"] += 1
            step_size = self.step_size(group)
            for p in group["params"]:
                p.sub_(p.grad * step_size)

    def step_size(self, group):
        return group["lr"] / math.sqrt(1.0 - math.pow(group["beta"], group["step"]))


class ZeroBetaPowOpt(GroupPowOpt):
    """``math.pow(0.0, step)``: pytorch-optimizer's Muon groups debias with beta 0.0."""

    def __init__(self, params, lr=0.1, beta=0.0):
        super().__init__(params, lr, beta)


class GroupRootOpt(GroupPowOpt):
    """A step-size schedule ``lr / math.pow(step, 0.25)`` on the group's int step (as
    pytorch-optimizer's ADOPT and Muon variants write it)."""

    def step_size(self, group):
        return group["lr"] / math.pow(group["step"], 0.25)


class StatePowOpt(StepStateOpt):
    """timm AdaBelief's bias corrections on an int per-parameter step: ``beta ** step``
    and ``math.pow``, passed as ``value=``."""

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                state["step"] += 1
                bias_correction1 = 1 - group["beta"] ** state["step"]
                bias_correction2 = 1 - math.pow(0.99, state["step"])
                denom = torch.ones_like(p) * math.sqrt(bias_correction2)
                p.addcdiv_(p.grad, denom, value=-group["lr"] / bias_correction1)


class UpdateStateOpt(StepStateOpt):
    """Steps and an EMA stored through dict.update and dict.__setitem__ calls (the
    group's step created by setdefault on the first call)."""

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            group.setdefault("step", 0)
            group.update(step=group["step"] + 1)
            for p in group["params"]:
                state = self.state[p]
                if len(state) == 0:
                    state["ema"] = 0.0
                    state["count"] = 0
                state.update({"ema": state["ema"] * group["beta"] + (1 - group["beta"]) * group["lr"]})
                state.__setitem__("count", state["count"] + 1)
                p.sub_(p.grad * (state["ema"] / state["count"]) / group["step"])


class BiasCorrectedOpt(StepStateOpt):
    """Python floats of an int step in per-parameter state passed to tensor ops:
    pytorch-optimizer's LoRA-RITE (a bias-corrected decay of ``float(step + 1)`` as
    ``mul(1 - decay)`` and ``alpha=decay``) and SOAP (``alpha=-step_size``) steps, with
    ``lr / math.sqrt(step)`` passed to mul_ and ``(1 - beta) ** step`` as a lerp_ weight."""

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta = group["beta"]
            for p in group["params"]:
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                next_step = float(state["step"] + 1)
                decay = beta * (1.0 - beta ** (next_step - 1.0)) / (1.0 - beta**next_step)
                state["m"] = p.grad.mul(1.0 - decay).add_(state["m"], alpha=decay)
                step_size = group["lr"] * math.sqrt(1.0 - 0.95**next_step) / (1.0 - beta**next_step)
                p.add_(state["m"], alpha=-step_size)
                p.mul_(1.0 - 0.01 * group["lr"] / math.sqrt(next_step))
                state["m"].lerp_(p.grad, (1 - beta) ** next_step)
                state["step"] += 1


def pow_of_counter(x, c):
    c.count += 1
    return x * math.pow(2.0, c.count) + math.pow(c.count, -0.5)


class FloatComparePowTests(torch._dynamo.test_case.TestCase):
    """Float state compared and passed as a kernel's Scalar argument, and bias corrections
    ``beta ** step`` / ``math.pow(beta, step)`` on a traced int step: one graph after the
    first call fills the state (issue 13: timm LaProp, timm and pytorch-optimizer AdaBelief)."""

    def run_opt(self, cls, backend, calls=6, exact=True):
        # Inductor computes `p.add_(g, alpha=s)` as a multiply and an add; the CPU kernel
        # fuses them (the same on the first call, where s is a constant): callers compare
        # with the default tolerances there (exact=False).
        return ScalarStateTests.run_opt(self, cls, backend, calls, exact)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_float_ema_compared_and_passed_as_alpha(self, backend):
        # `ema != 0.` is decided under a guard on that relation, `alpha=-step_size` reads
        # the float64 tensor with item(). Without this patch: a recompile per step.
        cnt = self.run_opt(EmaLrOpt, CompileCounterWithBackend(backend), exact=backend != "inductor")
        self.assertEqual(cnt.frame_count, 2)
        self.assertEqual(dict(torch._dynamo.utils.counters["graph_break"]), {})
        (reason,) = guard_failures[opt_step.__code__]
        self.assertIn("not opt.state", reason)  # the first call filled the state; no value guard failed since

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_float_state_in_a_scalar_list(self, backend):
        # Each float in the foreach op's ScalarList is passed as its item(). Without this
        # patch (measured, 6 calls): 3 frames under eager, 7 under aot_eager and inductor.
        cnt = self.run_opt(ScalarListOpt, CompileCounterWithBackend(backend), exact=backend != "inductor")
        self.assertEqual(cnt.frame_count, 2)

    def test_float_branch_flip_recompiles_once(self):
        # The EMA passes lr / 2 at the 7th call: the guard on the relation fails once.
        cnt = self.run_opt(EmaWarmupOpt, CompileCounterWithBackend("aot_eager"), calls=10)
        self.assertEqual(cnt.frame_count, 3)
        reasons = "\n".join(guard_failures[opt_step.__code__])
        self.assertIn("> 0.05)", reasons)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_math_pow_on_param_group_step(self, backend):
        # Without this patch math.pow specializes the SymInt: a recompile per step
        # until the recompile limit.
        cnt = self.run_opt(GroupPowOpt, CompileCounterWithBackend(backend), calls=10)
        self.assertEqual(cnt.frame_count, 2)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_math_pow_of_zero_base(self, backend):
        # 0.0 for every step > 0, under a guard that the step is positive. Without this
        # patch a recompile per step until the recompile limit.
        cnt = self.run_opt(ZeroBetaPowOpt, CompileCounterWithBackend(backend), calls=10)
        self.assertEqual(cnt.frame_count, 2)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_math_pow_of_step_with_constant_exponent(self, backend):
        # An int base in [1, 2**63] with an exponent in [0, 16] cannot overflow: traced.
        # Without this patch a recompile per step until the recompile limit.
        cnt = self.run_opt(GroupRootOpt, CompileCounterWithBackend(backend), calls=10)
        self.assertEqual(cnt.frame_count, 2)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_pow_and_math_pow_on_state_step(self, backend):
        cnt = self.run_opt(StatePowOpt, CompileCounterWithBackend(backend), exact=backend != "inductor")
        self.assertEqual(cnt.frame_count, 2)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_stores_through_dict_update_and_setitem(self, backend):
        # Without this patch: 3 frames with the eager backend (the int steps become
        # dynamic after a change), a recompile per step under aot_eager (the EMA).
        cnt = self.run_opt(UpdateStateOpt, CompileCounterWithBackend(backend))
        self.assertEqual(cnt.frame_count, 2)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_floats_of_a_step_round_as_python(self, backend):
        # The floats computed from the traced step stay Python floats the graph computes
        # at run time: the kernels read them as in eager. Before, AOTAutograd's pass took
        # `add_(m, alpha=decay)` as `add(m * decay)`, which rounds once more than the fused
        # CPU kernel (off from the 2nd call under aot_eager, as the real LoRA-RITE and
        # SOAP were). Without this patch: 3 frames on every backend (the step is
        # specialized, then dynamic), bitwise under eager and aot_eager; inductor's
        # kernels round otherwise, with or without this patch.
        torch.manual_seed(0)
        params = [torch.randn(n, requires_grad=True) for n in (64, 67)]
        copies = [[p.detach().clone().requires_grad_() for p in params] for _ in range(2)]
        eager, compiled = BiasCorrectedOpt(copies[0], lr=0.1), BiasCorrectedOpt(copies[1], lr=0.1)
        cnt = CompileCounterWithBackend(backend)
        fn = torch.compile(opt_step, backend=cnt)
        for _ in range(20):
            grads = [torch.randn_like(p) for p in params]
            for ps in copies:
                for p, g in zip(ps, grads):
                    p.grad = g.clone()
            opt_step(eager)
            fn(compiled)
            if backend == "inductor":
                self.assertEqual(state_of(compiled), state_of(eager))
            else:
                self.assertEqual(state_of(compiled), state_of(eager), atol=0, rtol=0)
        self.assertEqual(cnt.frame_count, 2)

    def test_math_pow_outside_0_1_stays_specialized(self):
        # 2.0 ** step grows without bound (math.pow raises OverflowError where the
        # graph would not): specialized, as without this patch; step ** -0.5 is traced.
        cnt = ScalarStateTests.run_fn(self, pow_of_counter, PlainCounter, CompileCounterWithBackend("eager"), calls=4)
        self.assertEqual(cnt.frame_count, 4)
        reasons = "\n".join(guard_failures[pow_of_counter.__code__])
        self.assertIn("c.count == 1", reasons)


def pow_of_argument(x, n):
    return x * math.pow(0.9, n)


class MathPowSwitchTests(torch._dynamo.test_case.TestCase):
    def test_math_pow_of_dynamic_int_argument(self):
        # An int argument is a SymInt after its first change (automatic dynamic):
        # math.pow of it is traced, 2 frames over 5 values. With scalar_state=False,
        # as without this patch: math.pow specializes it, one frame per value.
        for switch, frames in ((True, 2), (False, 5)):
            torch._dynamo.reset()
            with torch._dynamo.config.patch(scalar_state=switch):
                cnt = CompileCounterWithBackend("eager")
                fn = torch.compile(pow_of_argument, backend=cnt)
                for n in range(1, 6):
                    x = torch.randn(3)
                    self.assertEqual(fn(x, n), pow_of_argument(x, n), atol=0, rtol=0)
            self.assertEqual(cnt.frame_count, frames, switch)


class CounterNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.step = 0
        self.n_heads = 2
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.step += 1
        return self.lin(x).view(self.n_heads, -1)


def read_step(model, x):
    return x * model.step


class ChangedScalarTests(torch._dynamo.test_case.TestCase):
    def test_module_counter_changed_from_outside(self):
        # Only read in this frame, incremented eagerly between calls: dynamic after
        # one observed change; n_heads, read-only and never changed, stays specialized.
        model = CounterNet()
        cnt = CompileCounterWithBackend("aot_eager")
        fn = torch.compile(read_step, backend=cnt)
        for _ in range(6):
            model.step += 1
            x = torch.randn(3)
            self.assertEqual(fn(model, x), read_step(model, x))
        self.assertEqual(cnt.frame_count, 2)
        reasons = "\n".join(guard_failures[read_step.__code__])
        self.assertIn("model.step == 1", reasons)
        with torch._dynamo.config.patch(scalar_state=False):
            torch._dynamo.reset()
            cnt = CompileCounterWithBackend("eager")
            fn = torch.compile(read_step, backend=cnt)
            for _ in range(4):
                model.step += 1
                fn(model, torch.randn(3))
            self.assertEqual(cnt.frame_count, 4)

    def test_marked_static_and_builtin_module_ints_stay_constants(self):
        # torch._dynamo.mark_static promises a class's int attributes stay constants,
        # not SymInts, as do torch.nn's own modules' (both UNSPECIALIZED_BUILTIN_NN_MODULE):
        # one graph per value, as without this patch.
        @torch._dynamo.mark_static
        class Scale(torch.nn.Module):
            def __init__(self, c):
                super().__init__()
                self.c = c

            def forward(self, x):
                return x * self.c

        cnt = CompileCounterWithBackend("eager")
        x = torch.randn(4, 4)
        for c in (10, 20, 30):
            self.assertEqual(torch.compile(Scale(c), backend=cnt, fullgraph=True)(x), x * c)
        self.assertEqual(cnt.frame_count, 3)

        torch._dynamo.reset()
        cnt = CompileCounterWithBackend("eager")
        flatten = torch.nn.Flatten()
        fn = torch.compile(lambda x: flatten(x), backend=cnt)
        x = torch.randn(2, 3, 4, 5)
        for start_dim in (1, 2, 1, 2):
            flatten.start_dim = start_dim
            self.assertEqual(fn(x), torch.flatten(x, start_dim))
        self.assertEqual(cnt.frame_count, 2)  # one graph per value, each reused

    def test_read_only_config_stays_specialized(self):
        model = torch.compile(CounterNet(), backend="eager")
        for _ in range(3):
            model(torch.randn(3, 4))
        (entry,) = torch._dynamo.eval_frame._debug_get_cache_entry_list(CounterNet.forward)
        self.assertIn("L['self'].n_heads == 2", str(entry.guard_manager))



def make_schedule(name, opt, steps):
    sched = torch.optim.lr_scheduler
    if name == "onecycle":  # default cycle_momentum: also writes group['betas'] every step
        return sched.OneCycleLR(opt, max_lr=1e-2, total_steps=steps)
    if name == "cosine":
        return sched.CosineAnnealingLR(opt, T_max=steps)
    return sched.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))  # linear warmup


def train_step(model, opt, x):
    model(x).sum().backward()  # a graph break
    opt.step()
    opt.zero_grad()


class Config:
    def __init__(self):
        self.scale = 0.5
        self.count = 1


CONFIG = Config()


def scale_by_config(ts, x):
    torch._foreach_mul_(ts, CONFIG.scale)
    return x * CONFIG.count + CONFIG.scale


class Samples:
    def __init__(self):
        self.scale = 0.5
        self.count = 2**30 + 1  # beyond 2**24: float32 holds no odd int there


SAMPLES = Samples()


def scale_by_samples(ts, x):
    torch._foreach_mul_(ts, SAMPLES.scale * (SAMPLES.count - 2.0**30))
    return x * (SAMPLES.scale * (SAMPLES.count - 2.0**30))


def partially_tensorified(x, c):
    return x * c.scale, x.clamp(min=1 - c.scale)


def partially_tensorified_argument(x, s):
    return x * s, x.clamp(min=1 - s)


class ChangedFloatTests(torch._dynamo.test_case.TestCase):
    """Floats only read by the compiled frame and changed between calls (an LR
    scheduler's param_groups[i]['lr'] and ['betas']): a SymFloat after one observed
    change that stays one where it feeds a Scalar argument (`_foreach_mul_(params,
    1 - lr * wd)`, `_foreach_div_`, `_foreach_pow(beta1, steps)`, lerp weights)."""

    def run_schedule(self, backend, schedule, foreach=True, steps=8, whole_step=False):
        def make():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
            opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=foreach)
            return model, opt, make_schedule(schedule, opt, steps)

        (model_e, opt_e, sched_e), (model_c, opt_c, sched_c) = make(), make()
        cnt = CompileCounterWithBackend(backend)
        compiled = torch.compile(train_step if whole_step else opt_step, backend=cnt)
        for _ in range(steps):
            x = torch.randn(5, 4)
            if whole_step:
                train_step(model_e, opt_e, x)
                compiled(model_c, opt_c, x)
            else:
                for model in (model_e, model_c):
                    model(x).sum().backward()
                opt_step(opt_e)
                compiled(opt_c)
            sched_e.step()
            sched_c.step()
            # compiled torch.optim takes the capturable path: close to eager, not bitwise
            self.assertEqual(list(model_c.parameters()), list(model_e.parameters()))
            self.assertEqual(opt_c.state_dict()["state"], opt_e.state_dict()["state"])
            groups_e, groups_c = (
                [{k: v for k, v in g.items() if k not in ("params", "capturable")} for g in o.param_groups]
                for o in (opt_e, opt_c)
            )
            self.assertEqual(groups_c, groups_e, atol=0, rtol=0)
            self.assertIs(type(opt_c.param_groups[0]["lr"]), float)
        self.compiled_opt = (compiled, opt_c)
        return cnt

    @parametrize("schedule", ["onecycle", "cosine", "lambda_warmup"])
    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_adamw_foreach_with_scheduler(self, backend, schedule):
        # Without this patch: 8 graphs under aot_eager and inductor (one per lr value).
        cnt = self.run_schedule(backend, schedule)
        self.assertEqual(cnt.frame_count, 2)

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_adamw_single_tensor_with_one_cycle(self, backend):
        # lerp_(grad, 1 - beta1) and beta1 ** step with a changing beta1
        cnt = self.run_schedule(backend, "onecycle", foreach=False)
        self.assertEqual(cnt.frame_count, 2)

    def test_whole_train_step_compiled(self):
        # The optimizer runs in the resume function after backward's graph break.
        cnt = self.run_schedule("aot_eager", "cosine", whole_step=True)
        self.assertEqual(cnt.frame_count, 3)

    def test_recompile_reason_and_read_only_hyperparameters(self):
        self.run_schedule("aot_eager", "cosine", steps=4)
        (code,) = [c for c in guard_failures if c.co_name == "step" and c.co_filename.endswith("adam.py")]
        (reason,) = guard_failures[code]
        self.assertIn("self.param_groups[0]['lr'] == 0.01", reason)
        self.assertIn(
            "self.param_groups[0]['lr'] is specialized until it changes; the recompile traces it as a "
            "float64 tensor input",
            reason,
        )
        # weight_decay never changed: still specialized on its value
        compiled, opt = self.compiled_opt
        opt.param_groups[0]["weight_decay"] = 0.02
        compiled(opt)
        self.assertIn("self.param_groups[0]['weight_decay'] == 0.01", "\n".join(guard_failures[code]))

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_plain_object_changed_by_eager_code(self, backend):
        cnt = CompileCounterWithBackend(backend)
        fn = torch.compile(scale_by_config, backend=cnt)
        ts_e, ts_c = [torch.ones(3), torch.ones(2)], [torch.ones(3), torch.ones(2)]
        for i in range(6):
            CONFIG.scale, CONFIG.count = 0.5 + 0.1 * i, 1 + i
            x = torch.randn(3)
            self.assertEqual(fn(ts_c, x), scale_by_config(ts_e, x))
            self.assertEqual(ts_c, ts_e)
        self.assertEqual(cnt.frame_count, 2)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_float_of_a_changed_float_and_a_large_int(self, backend):
        # scale and count become a SymFloat and a SymInt after one change. The tensor
        # AOTAutograd's pass computes `scale * (count - 2.0**30)` from read count as a
        # float32 tensor: 2**30 + 3 became 2**30 (x * 0.0 under aot_eager). Without this
        # patch: 6 frames on every backend (count stays specialized), bitwise eager.
        cnt = CompileCounterWithBackend(backend)
        fn = torch.compile(scale_by_samples, backend=cnt)
        ts_e, ts_c = [torch.ones(3), torch.ones(2)], [torch.ones(3), torch.ones(2)]
        for i in range(6):
            SAMPLES.scale, SAMPLES.count = 0.5 + 0.125 * i, 2**30 + 1 + 2 * i
            x = torch.randn(3)
            self.assertEqual(fn(ts_c, x), scale_by_samples(ts_e, x), atol=0, rtol=0)
            self.assertEqual(ts_c, ts_e, atol=0, rtol=0)
        self.assertEqual(cnt.frame_count, 2)

    def test_partially_tensorified_float_is_not_stale(self):
        # x * c.scale takes the float as a tensor, clamp(min=) cannot: specialized on
        # its value (a recompile per value), never a compiled constant reused by the
        # FX graph / AOTAutograd caches for another value, as without this patch.
        c = Config()
        fn = torch.compile(partially_tensorified, backend="inductor")
        for v in (0.5, 0.25, 0.125, 0.3):
            c.scale = v
            x = torch.linspace(-1, 1, 5)
            self.assertEqual(fn(x, c), partially_tensorified(x, c), atol=0, rtol=0)

    def test_partially_tensorified_float_argument(self):
        # The same uses of a float argument: the first value's frame and the frame with
        # the argument as a SymFloat the tensorify pass keeps symbolic (the clamp bound
        # included), on torch 2.15.0 with or without this patch (measured; on 2.13
        # without this patch 5 frames, one per value).
        cnt = CompileCounterWithBackend("inductor")
        fn = torch.compile(partially_tensorified_argument, backend=cnt)
        for v in (0.5, 0.25, 0.125, 0.3):
            x = torch.linspace(-1, 1, 5)
            self.assertEqual(fn(x, v), partially_tensorified_argument(x, v), atol=0, rtol=0)
        self.assertEqual(cnt.frame_count, 2)

    def test_switch_off(self):
        # As without this patch: the lr is specialized, each new value recompiles
        # (every cache entry failing on it). Frames are not counted: how many graphs
        # a recompile makes depends on the rest of the series (a tensorify restart).
        with torch._dynamo.config.patch(scalar_state=False):
            self.run_schedule("aot_eager", "cosine", steps=4)
        # Which code objects recompile depends on graph breaks earlier tests can change
        # (warnings emitted once per process): check every one that did, and that one did.
        self.assertNotEqual(dict(guard_failures), {})
        for code, reasons in guard_failures.items():
            # Calls 2, 3 and 4 each fail every cache entry, newest first.
            entries = [int(re.match(r"\d+/(\d+): ", r).group(1)) for r in reasons]
            self.assertEqual(entries, [0, 1, 0, 2, 1, 0], msg=code.co_name)
            for reason in reasons:
                self.assertIn("param_groups[0]['lr']", reason.splitlines()[0], msg=code.co_name)


# Floats a frame stores to and also uses in a way the float64 tensor form cannot trace
# (variables/float_as_tensor.py): the place is wrapped as without these patches from then
# on, so the frame compiles exactly as often as there, never pinned on every value.


class Places:
    def __init__(self):
        self.v = 1.0
        self.d = {"v": 1.0}
        self.l = [1.0]


def attr_is_not_none(x, o):
    if o.v is not None:
        o.v = o.v * 0.9 + 0.05
    return x * o.v


def dict_truth(x, o):
    o.d["v"] = o.d["v"] * 0.9 + 0.05
    if o.d["v"]:
        return x * o.d["v"]
    return x


def list_modulo_branch(x, o):
    o.l[0] = o.l[0] + 0.3
    if o.l[0] % 1.0 < 0.5:
        return x.sin()
    return x.cos()


def attr_formatted(x, o):
    o.v = o.v * 0.9 + 0.05
    message = f"v={o.v:.3f}"  # noqa: F841 (built for a log line that is off)
    return x * o.v


def attr_floor(x, o):
    o.v = o.v * 0.9 + 0.05
    return x * o.v + math.floor(o.v * 10)


def attr_fmod(x, o):
    o.v = o.v * 0.9 + 0.05
    return x * o.v + math.fmod(o.v, 0.3)


def attr_times_complex(x, o):
    o.v = o.v * 0.9 + 0.05
    return x.to(torch.complex64) * o.v


def attr_min(x, o):
    o.v = o.v * 0.9 + 0.05
    return x * min(o.v, 0.5)


def attr_max(x, o):
    o.v = o.v * 0.9 + 0.05
    return x * max(o.v, 0.5)


def attr_sqrt(x, o):
    o.v = o.v * 0.9 + 0.05
    return x / math.sqrt(o.v)


def attr_sqrt_negative(x, o):
    o.v = o.v * 0.9 - 0.2  # negative from the second call: math.sqrt raises
    try:
        return x / math.sqrt(o.v)
    except ValueError:
        return x * 2.0


def attr_clamp_and_compare(x, o):
    # the float as a kernel's Scalar: a clamp bound (pytorch #194976's pattern) and a
    # tensor comparison
    o.v = o.v * 0.9 + 0.05
    return x.clamp(max=o.v) + (x < o.v) + torch.clamp(x, min=-o.v)


def attr_foreach_lerp_weight(x, o):
    o.v = o.v * 0.9 + 0.05
    ts = [x.clone(), x * 2]
    torch._foreach_lerp_(ts, [x + 1, x - 1], weight=o.v)  # by keyword, as pytorch-optimizer passes it
    return ts[0] + ts[1]


def attr_tensor_of_floats(x, o):
    # pytorch-optimizer's LaProp and SimplifiedAdEMAMix gather per-parameter floats
    # into a tensor: torch.tensor(step_sizes, dtype=torch.float32, device=...)
    o.v = o.v * 0.9 + 0.05
    o.l[0] = o.l[0] * 0.5 + 0.25
    sizes = torch.tensor([o.v, -1.0 / o.v, 2], dtype=torch.float32, device=x.device)
    return x * sizes + torch.tensor((o.l[0], 1)).sum()  # the default dtype


def attr_powers(x, o):
    # a float power of the float: `**` with an int or a float exponent, math.pow,
    # pow(), a number raised to it, and another float as the exponent
    o.v = o.v * 0.9 + 0.05
    o.d["v"] = o.d["v"] * 0.5 + 0.25
    return x * (o.v**2) + x * math.pow(o.v, 0.25) - x * (0.999**o.v) + x * pow(o.v, o.d["v"])


def attr_power_as_alpha(x, o):
    # D-Adaptation AdaGrad (pytorch-optimizer): `gsq.add_(g_sq, alpha=d_lr ** 2)` next
    # to `sk.add_(grad, alpha=d_lr)`; without the power traced, the place is a SymFloat
    # and _tensorify_python_scalars pins it per value (the alpha keyword)
    o.v = o.v * 1.1
    d_lr = o.v * 0.5
    y = x.clone()
    y.add_(x, alpha=d_lr)
    y.add_(x, alpha=d_lr**2)
    return y


def attr_power_base_turns_negative(x, o):
    # positive for two calls, then negative: a negative float to an integral power is a
    # float in Python (and C pow()); to a fractional one a complex number (below)
    o.v = o.v - 0.4
    return x * (o.v**2.0) + x * (o.v**-3)


def attr_power_turns_complex(x, o):
    # from the third call the base is negative and Python's power a complex number
    o.v = o.v - 0.4
    return x * (o.v**0.5)


class ScheduleFreePlaces:
    """pytorch-optimizer's schedule-free groups: an int step and float sums of it."""

    def __init__(self):
        self.group = {"step": 0, "lr_max": -1.0, "weight_sum": 0.0}


def attr_sum_of_step_floats(x, o):
    # schedule-free AdamW's weights: floats of the int step (SymFloats once it is
    # traced) added to a float place, then compared, divided by and max()ed with it
    group = o.group
    group["step"] += 1
    lr = 0.01 * math.sqrt(group["step"] / (group["step"] + 1.0))
    lr_max = group["lr_max"] = max(lr, group["lr_max"])
    weight = (group["step"] ** 0.5) * (lr_max**2.0)
    weight_sum = group["weight_sum"] = group["weight_sum"] + weight
    checkpoint = weight / weight_sum if weight_sum != 0.0 else 0.0
    return x.lerp(x * 2, weight=checkpoint) * lr


def attr_round(x, o):
    o.v = o.v * 0.9 + 0.05
    return x * round(o.v, 2)


class SlotsPlace:
    __slots__ = ("v",)

    def __init__(self):
        self.v = 1.0


Pair = collections.namedtuple("Pair", "v w")


class TuplePlace:
    def __init__(self):
        self.t = Pair(1.0, 2)
        self.d = {"v": 1.0}


def slots_attr(x, o):
    o.v = o.v * 0.9 + 0.05
    return x * o.v


def namedtuple_replace(x, o):
    o.t = o.t._replace(v=o.t.v * 0.9 + 0.05)
    return x * o.t.v


def dict_update_pairs(x, o):
    o.d.update([("v", o.d["v"] * 0.9 + 0.05)])
    return x * o.d["v"]


GLOBAL_EMA = 1.0


def global_float(x, o):
    global GLOBAL_EMA
    GLOBAL_EMA = GLOBAL_EMA * 0.9 + 0.05
    return x * GLOBAL_EMA


class NonlocalPlace:
    def __init__(self):
        v = 1.0

        def step(x):
            nonlocal v
            v = v * 0.9 + 0.05
            return x * v

        self.step = step


def nonlocal_float(x, o):
    return o.step(x)


def place_state(o):
    if isinstance(o, SlotsPlace):
        return o.v
    if isinstance(o, NonlocalPlace):
        return o.step.__closure__[0].cell_contents
    return copy.deepcopy(vars(o))


def resume_after_item(x, group):
    """D-Adapt Lion's step (pytorch-optimizer): a float read from the group, a graph
    break at .item(), and a resume function that does only Python work on numbers and
    stores a tensor back."""
    d = group["d"]
    acc = group["acc"]
    acc.add_(x * d)
    d_hat = acc.abs().sum().item()  # a graph break
    d = max(d, d_hat * 1e-3)
    group["step"] += 1
    group["acc"] = acc
    group["d"] = d


def resume_with_item_float(x, group):
    """D-Adaptation's step (pytorch-optimizer's DAdaptAdam / SGD / AdaGrad): a float
    from .item() breaks the graph, and the resume function, handed it and the group's
    float on the stack, takes their min and max and stores the result in the group."""
    d = group["d"]
    d_hat = (x.abs().sum() * 1e-3).item()  # a graph break
    d = max(d, min(d_hat, d * 1.02))
    group["d"] = d
    return x * d


def step_with_size(params, grads, step_size):
    """A per-step helper handed a new step size every call (pytorch-optimizer's AvaGrad
    and MADGRAD hand theirs to a foreach helper): the foreach op's Scalar and the clamp
    bound take no SymFloat."""
    torch._foreach_addcdiv_(params, grads, [g.abs() + 1 for g in grads], value=-step_size)
    return params[0].clamp(max=step_size * 10)


class CounterAndDecay:
    def __init__(self):
        self.step = 0
        self.decay = 1.0


def places_then_graph_break(x, o):
    o.step += 1
    o.decay = o.decay * 0.9
    y = x * 2
    torch._dynamo.graph_break()
    return y + o.step * o.decay


# (function, object factory, frames over 6 calls under eager / aot_eager). Unpatched
# torch 2.15.0 (measured): 2 / 7 for every loop here (a SymFloat once the value
# changed, then one per value under aot_eager, the tensorify pass specializing it),
# fmod and the complex product 6 / 7, and two it gets wrong: `%` (list_modulo_branch:
# 2 / 7 frames, 4 of 6 calls take the wrong branch) and formatting with a spec (the
# compile fails). With these patches the place is specialized on its value there
# (6 / 6, eager-identical); a float that changed between calls is a float64 tensor
# input like one the frame stores to (slots, namedtuple, dict.update pairs, nonlocal:
# 2 / 2); the other uses (a truth test, `is not None`, floor, fmod, round, a global)
# are left to the default wrapping, with the frames it compiles without these
# patches. A complex operand is such a use.
PINNED_USES = {
    "attr_is_not_none": (attr_is_not_none, Places, 2, 7),
    "dict_truth": (dict_truth, Places, 2, 7),
    "list_modulo_branch": (list_modulo_branch, Places, 6, 6),
    "attr_formatted": (attr_formatted, Places, 6, 6),
    "attr_floor": (attr_floor, Places, 2, 7),
    "attr_fmod": (attr_fmod, Places, 6, 7),
    "attr_times_complex": (attr_times_complex, Places, 6, 7),
    "attr_round": (attr_round, Places, 2, 7),
    "slots_attr": (slots_attr, SlotsPlace, 2, 2),
    "namedtuple_replace": (namedtuple_replace, TuplePlace, 2, 2),
    "dict_update_pairs": (dict_update_pairs, TuplePlace, 2, 2),
    "global_float": (global_float, TuplePlace, 2, 7),
    "nonlocal_float": (nonlocal_float, NonlocalPlace, 2, 2),
}


# Uses decided by a comparison under a guard on its relation (min, max: Python's
# `b > a` / `b < a`; math.sqrt: `v < 0.0`, ValueError as Python raises) and traced on
# the float64 tensor: (function, object factory, frames over 6 calls on every backend).
# Unpatched 2.13 (measured): attr_min, attr_max and attr_sqrt 2 / 6 frames under eager /
# aot_eager and a stale written-back value from the third call under inductor;
# attr_sqrt_negative fails the compile (ValueError from the fake math.sqrt under eager,
# TorchRuntimeError under aot_eager) and is stale under inductor; attr_foreach_lerp_weight
# 2 / 7 frames and not eager-identical under inductor; attr_clamp_and_compare 2 / 6 frames
# and a stale written-back value under inductor (pytorch #194976's pattern);
# attr_tensor_of_floats 2 / 7 frames under eager / aot_eager and the recompile limit
# under inductor; attr_sum_of_step_floats 2 / 7 / 7 frames under eager / aot_eager /
# inductor. Unpatched 2.15.0 (measured): attr_powers 6 / 7 / 7 frames under eager /
# aot_eager / inductor, attr_power_as_alpha 2 / 7 / 7 (the alpha pinned per value by
# _tensorify_python_scalars), attr_power_base_turns_negative fails the compile (the fake
# pow of a SymFloat that may be negative) and runs eagerly.
TRACED_USES = {
    "attr_min": (attr_min, Places, 1),
    "attr_max": (attr_max, Places, 1),
    "attr_sqrt": (attr_sqrt, Places, 1),
    "attr_sqrt_negative": (attr_sqrt_negative, Places, 2),
    "attr_foreach_lerp_weight": (attr_foreach_lerp_weight, Places, 1),
    "attr_clamp_and_compare": (attr_clamp_and_compare, Places, 1),
    "attr_tensor_of_floats": (attr_tensor_of_floats, Places, 1),
    "attr_sum_of_step_floats": (attr_sum_of_step_floats, ScheduleFreePlaces, 1),
    "attr_powers": (attr_powers, Places, 1),
    "attr_power_as_alpha": (attr_power_as_alpha, Places, 1),
    "attr_power_base_turns_negative": (attr_power_base_turns_negative, Places, 1),
}


class PinnedUseTests(torch._dynamo.test_case.TestCase):
    def run_places(self, fn, make, backend, calls=6, exact=True):
        """Eager and compiled copies called alike: outputs (bitwise if `exact`, else
        within the default tolerances) and Python state bitwise equal after every call
        (a global is reset and compared around each side)."""
        global GLOBAL_EMA
        GLOBAL_EMA = 1.0
        eager, compiled = make(), make()
        cfn = torch.compile(fn, backend=backend)
        ema = GLOBAL_EMA
        for i in range(calls):
            x = torch.randn(3)
            GLOBAL_EMA = ema
            expected = fn(x.clone(), eager)
            ema, GLOBAL_EMA = GLOBAL_EMA, ema
            self.assertEqual(cfn(x.clone(), compiled), expected, **({"atol": 0, "rtol": 0} if exact else {}))
            self.assertEqual(GLOBAL_EMA, ema, atol=0, rtol=0)
            self.assertEqual(place_state(compiled), place_state(eager), atol=0, rtol=0)
        return backend

    @parametrize("backend", ["eager", "aot_eager"])
    @parametrize("name", list(PINNED_USES))
    def test_frames_as_without_these_patches(self, name, backend):
        fn, make, eager_frames, aot_frames = PINNED_USES[name]
        cnt = self.run_places(fn, make, CompileCounterWithBackend(backend))
        self.assertEqual(cnt.frame_count, eager_frames if backend == "eager" else aot_frames)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    @parametrize("name", list(TRACED_USES))
    def test_traced_uses(self, name, backend):
        fn, make, frames = TRACED_USES[name]
        # inductor's kernels round otherwise than eager's (a lerp: one float32 ulp)
        cnt = self.run_places(fn, make, CompileCounterWithBackend(backend), exact=backend != "inductor")
        self.assertEqual(cnt.frame_count, frames)

    @parametrize("backend", ["eager", "aot_eager"])
    def test_power_that_is_not_a_real_float_is_specialized(self, backend):
        # The guard that the power is a finite float fails on the third call (Python's
        # power is complex); the place is specialized from then on: one frame for the
        # float64 tensor, then one per value (0.2, -0.2, -0.6). Unpatched 2.15.0
        # (measured): the third call fails the compile (TorchRuntimeError from the fake
        # pow of a SymFloat that may be negative) and raises out of the compiled frame.
        cnt = self.run_places(attr_power_turns_complex, Places, CompileCounterWithBackend(backend), calls=5)
        self.assertEqual(cnt.frame_count, 4)
        self.assertEqual(scalar_places_of(attr_power_turns_complex), {"L['o'].v": "specialized float"})

    @parametrize("name", ["attr_is_not_none", "dict_truth"])
    def test_inductor(self, name):
        # Unpatched 2.15.0: 5 frames, as here (unpatched 2.13 compiled 3 and wrote back
        # a stale value from the third call): the place is left to the default wrapping.
        fn, make, _, _ = PINNED_USES[name]
        cnt = self.run_places(fn, make, CompileCounterWithBackend("inductor"), calls=4)
        self.assertEqual(cnt.frame_count, 5)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_resume_function_float_locals(self, backend):
        # The resume function's floats (d, and d_hat from the .item()) are new every call:
        # float64 tensor inputs once they changed, so each frame compiles once more (the
        # first for group['d']), not per value. Unpatched (measured): 4 / 9 frames under
        # eager / aot_eager (the resume function's SymFloats, specialized by the
        # tensorify pass), and a stale group['d'] from the third call under inductor.
        groups = [{"d": 1e-6} for _ in range(2)]
        cnt = CompileCounterWithBackend(backend)
        cfn = torch.compile(resume_with_item_float, backend=cnt)
        for _ in range(6):
            x = torch.randn(3)
            expected = resume_with_item_float(x, groups[0])
            self.assertEqual(cfn(x, groups[1]), expected, atol=0, rtol=0)
            self.assertEqual(groups[1], groups[0], atol=0, rtol=0)
        self.assertEqual(cnt.frame_count, 4)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_float_argument_an_op_takes_no_symfloat_for(self, backend):
        # The step size changes every call: a SymFloat after the first recompile, which
        # _tensorify_python_scalars cannot keep symbolic (the foreach Scalar, the clamp
        # bound), so the graph input would be pinned per value (one frame per call, as
        # without this patch: 7 frames under aot_eager / inductor, measured). It is
        # traced as a float64 tensor input instead: the first value's frame, the backend
        # call that _tensorify_python_scalars restarted, and the recompiled frame (3); the
        # eager backend never pins it (2).
        torch.manual_seed(0)
        params = [[torch.randn(3) for _ in range(2)]]
        params.append([p.clone() for p in params[0]])
        cnt = CompileCounterWithBackend(backend)
        cfn = torch.compile(step_with_size, backend=cnt)
        for i in range(6):
            grads = [torch.randn(3) for _ in range(2)]
            size = 0.1 / (i + 1)
            expected = step_with_size(params[0], grads, size)
            self.assertEqual(cfn(params[1], grads, size), expected, atol=0, rtol=0)
            self.assertEqual(params[1], params[0], atol=0, rtol=0)
        self.assertEqual(cnt.frame_count, 2 if backend == "eager" else 3)

    @parametrize("backend", ["eager", "aot_eager"])
    def test_restart_counts_a_graph_break_once(self, backend):
        # The trace finds the graph break (counted), compiles the graph before it, and
        # restarts for the places it recorded: the restart drops the speculation
        # entries, and the next attempt finds the break again. It is counted once, as
        # without this patch (where it was counted twice before the restart undid it).
        counters = torch._dynamo.utils.counters
        counters.clear()
        eager, compiled = CounterAndDecay(), CounterAndDecay()
        cnt = CompileCounterWithBackend(backend)
        cfn = torch.compile(places_then_graph_break, backend=cnt)
        for calls in range(1, 4):
            x = torch.randn(3)
            self.assertEqual(cfn(x, compiled), places_then_graph_break(x, eager), atol=0, rtol=0)
            self.assertEqual(vars(compiled), vars(eager), atol=0, rtol=0)
            self.assertEqual(list(counters["graph_break"].values()), [1])
            self.assertEqual(cnt.frame_count, 2)  # the graph before the break, the resume function's

    @parametrize("backend", ["eager", "aot_eager"])
    def test_scalar_only_resume_function_is_skipped(self, backend):
        # After .item()'s graph break the resume function steps the int and stores the
        # float: without these patches it traces no op and Dynamo skips it; with the
        # step a SymInt it compiled `step + 1` and recompiled for d_hat (under aot_eager
        # for every value: the SymFloat written back is specialized): 3 / 8 frames over
        # 6 calls. Unpatched (measured): 1 / 1.
        groups = [{"d": 1e-6, "step": 0, "acc": torch.zeros(3)} for _ in range(2)]
        cnt = CompileCounterWithBackend(backend)
        cfn = torch.compile(resume_after_item, backend=cnt)
        for _ in range(6):
            x = torch.randn(3)
            resume_after_item(x, groups[0])
            cfn(x, groups[1])
            self.assertEqual(groups[1], groups[0], atol=0, rtol=0)
        self.assertEqual(cnt.frame_count, 1)


instantiate_parametrized_tests(ScalarStateTests)
instantiate_parametrized_tests(ChangedScalarTests)
instantiate_parametrized_tests(FloatComparePowTests)
instantiate_parametrized_tests(ChangedFloatTests)
instantiate_parametrized_tests(PinnedUseTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
