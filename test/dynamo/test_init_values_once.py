# Owner(s): ["module: dynamo"]
"""torch._dynamo.init_values_once: run lazy initialisers for real, guard their inputs."""

import collections
import logging

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters, guard_failures


# Calls of _init_group per optimizer instance (a global, so the function only
# mutates what its contract allows).
INIT_CALLS = collections.Counter()


class PlainSGD:
    """A momentum SGD that is not a torch.optim.Optimizer, with lazily created state."""

    def __init__(self, params, lr=0.1, momentum=0.9):
        self.param_groups = [{"params": list(params), "lr": lr, "momentum": momentum}]
        self.state = {}

    @torch._dynamo.init_values_once(guards=["self.state", "self.param_groups", "group"])
    def _init_group(self, group, params, grads, bufs):
        INIT_CALLS[id(self)] += 1
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {"momentum_buffer": torch.zeros_like(p)}
            params.append(p)
            grads.append(p.grad)
            bufs.append(state["momentum_buffer"])

    def step(self):
        with torch.no_grad():
            for group in self.param_groups:
                params, grads, bufs = [], [], []
                self._init_group(group, params, grads, bufs)
                for p, g, b in zip(params, grads, bufs):
                    b.mul_(group["momentum"]).add_(g)
                    p.add_(b, alpha=-group["lr"])


def make_params(n=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(3, 3, generator=gen)) for _ in range(n)]


def set_grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(3, 3, generator=gen)  # fresh grads, as zero_grad(set_to_none=True)


class InitValuesOnceTests(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        INIT_CALLS.clear()

    def make_pair(self, cls=PlainSGD, n=4):
        eager_params, compiled_params = make_params(n), make_params(n)
        eager, compiled = cls(eager_params), cls(compiled_params)
        cnt = CompileCounter()
        step = torch.compile(compiled.step, backend=cnt)
        return eager, compiled, step, cnt

    def run_step(self, eager, compiled, step, i, mutate=None):
        for opt in (eager, compiled):
            set_grads(opt.param_groups[0]["params"], i)
            if mutate is not None:
                mutate(opt)
        eager.step()
        step()
        for group_e, group_c in zip(eager.param_groups, compiled.param_groups):
            for pe, pc in zip(group_e["params"], group_c["params"]):
                self.assertEqual(pe, pc)

    def step_optimizers(self, eager, eager_params, compiled_step, compiled_params, steps):
        """Step a torch.optim optimizer eagerly and compiled with the same fresh grads,
        comparing the parameters after every step."""
        for i in range(steps):
            set_grads(eager_params, i)
            set_grads(compiled_params, i)
            eager.step()
            compiled_step()
            for pe, pc in zip(eager_params, compiled_params):
                self.assertEqual(pe, pc)

    def test_compiles_once_and_runs_body_once(self):
        eager, compiled, step, cnt = self.make_pair()
        for i in range(8):
            self.run_step(eager, compiled, step, i)
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(dict(counters["graph_break"]), {})
        self.assertEqual(INIT_CALLS[id(compiled)], 1)  # at trace time only
        self.assertEqual(INIT_CALLS[id(eager)], 8)

    def test_each_guarded_change_recompiles_once(self):
        def grad_becomes_none(opt):
            opt.param_groups[0]["params"][1].grad = None

        def state_key_disappears(opt):
            del opt.state[opt.param_groups[0]["params"][2]]

        def state_dtype_changes(opt):
            state = opt.state[opt.param_groups[0]["params"][0]]
            state["momentum_buffer"] = state["momentum_buffer"].double()

        def group_added(opt):
            opt.param_groups.append({"params": make_params(2, seed=7), "lr": 0.05, "momentum": 0.5})

        for mutate in (grad_becomes_none, state_key_disappears, state_dtype_changes, group_added):
            with self.subTest(mutate.__name__):
                torch._dynamo.reset()
                INIT_CALLS.clear()
                eager, compiled, step, cnt = self.make_pair()
                self.run_step(eager, compiled, step, 0)
                self.run_step(eager, compiled, step, 1, mutate)
                self.assertEqual(cnt.frame_count, 2)
                calls = INIT_CALLS[id(compiled)]
                self.run_step(eager, compiled, step, 2)
                self.assertEqual(cnt.frame_count, 2)
                self.assertEqual(INIT_CALLS[id(compiled)], calls)
                if mutate is grad_becomes_none:
                    # the changed state stays: a grad present again is a new change
                    self.assertEqual(INIT_CALLS[id(compiled)], 2)

    def test_recompile_reason_names_the_spec(self):
        eager, compiled, step, cnt = self.make_pair()
        self.run_step(eager, compiled, step, 0)
        self.run_step(eager, compiled, step, 1, lambda opt: opt.param_groups[0]["params"][1].__setattr__("grad", None))
        reasons = guard_failures[PlainSGD.step.__code__]
        self.assertEqual(len(reasons), 1)
        self.assertIn(".grad", reasons[0])
        self.assertIn("init_values_once[self.param_groups] of PlainSGD._init_group", reasons[0])

    def test_plain_function(self):
        cache = {}
        calls = []

        @torch.compiler.init_values_once(guards=["cache"])
        def fill(cache, names, out):
            calls.append(1)
            for name in names:
                if name not in cache:
                    cache[name] = torch.ones(2) * len(name)
                out.append(cache[name])

        def fn(x):
            out = []
            fill(cache, ("a", "bb"), out)
            return x + out[0] + out[1]

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt, fullgraph=True)
        for _ in range(4):
            x = torch.randn(2)
            self.assertEqual(compiled(x), x + 1 + 2)
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(len(calls), 1)
        cache["a"] = torch.zeros(2, dtype=torch.float64)  # a guarded input changes
        x = torch.randn(2)
        self.assertEqual(compiled(x), x.double() + 0 + 2)
        self.assertEqual(cnt.frame_count, 2)
        self.assertEqual(len(calls), 2)

    def test_bad_spec_name_raises_at_decoration(self):
        with self.assertRaisesRegex(ValueError, r"guard 'stat.x' names 'stat', which is not a parameter of .*\.f; its parameters are self, group"):

            @torch._dynamo.init_values_once(guards=["stat.x"])
            def f(self, group):
                pass

        with self.assertRaisesRegex(TypeError, "list of specs"):
            torch._dynamo.init_values_once(guards="self.state")

    def test_argument_computed_in_graph_falls_back_to_tracing(self):
        @torch._dynamo.init_values_once(guards=["scale"])
        def scaled(scale, out):
            out.append(scale * 2)

        def fn(x):
            out = []
            scaled(x.sum(), out)  # a value that exists only in the graph
            return x * out[0]

        cnt = CompileCounter()
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            compiled = torch.compile(fn, backend=cnt, fullgraph=True)
            x = torch.randn(3)
            self.assertEqual(compiled(x), fn(x))
        self.assertIn("argument 'scale' (TensorVariable) has no real value", "\n".join(logs.output))
        self.assertEqual(cnt.frame_count, 1)

    def test_pending_mutation_falls_back_to_tracing(self):
        eager, compiled, _, _ = self.make_pair()

        def step_after_clearing(opt):
            opt.state.clear()  # a pending mutation of a guarded input when _init_group runs
            opt.step()

        cnt = CompileCounter()
        compiled_step = torch.compile(step_after_clearing, backend=cnt)
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            for i in range(2):
                for opt in (eager, compiled):
                    set_grads(opt.param_groups[0]["params"], i)
                step_after_clearing(eager)
                compiled_step(compiled)
                for pe, pc in zip(eager.param_groups[0]["params"], compiled.param_groups[0]["params"]):
                    self.assertEqual(pe, pc)
        self.assertIn("pending mutations", "\n".join(logs.output))
        # Traced, so the body ran at run time on every step, like eager's.
        self.assertEqual(INIT_CALLS[id(compiled)], INIT_CALLS[id(eager)])

    def test_container_read_before_the_call_falls_back_to_tracing(self):
        eager, compiled, _, _ = self.make_pair()

        def step_reading_state_first(opt):
            # The frame holds a VariableTracker for opt.state before _init_group
            # fills it: the real call is undone and the function traced instead.
            n = len(opt.state)
            opt.step()
            return n

        compiled_step = torch.compile(step_reading_state_first, backend=CompileCounter())
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            for i in range(2):
                for opt in (eager, compiled):
                    set_grads(opt.param_groups[0]["params"], i)
                self.assertEqual(compiled_step(compiled), step_reading_state_first(eager))
                for pe, pc in zip(eager.param_groups[0]["params"], compiled.param_groups[0]["params"]):
                    self.assertEqual(pe, pc)
        self.assertIn("changed 1 container(s) the frame had already read", "\n".join(logs.output))
        self.assertEqual(len(compiled.state), len(eager.state))

    def test_switch_off_traces_normally(self):
        with torch._dynamo.config.patch(init_values_once=False):
            eager, compiled, step, cnt = self.make_pair()
            for i in range(3):
                self.run_step(eager, compiled, step, i)
        # Stock behaviour: fresh grads fail identity guards on every step.
        self.assertEqual(cnt.frame_count, 3)

    def test_torch_optim_init_group_runs_once_at_trace_time(self):
        calls = []

        class CountingSGD(torch.optim.SGD):
            def _init_group(self, *args):
                calls.append(1)
                return super()._init_group(*args)

        eager_params, compiled_params = make_params(3), make_params(3)
        eager = torch.optim.SGD(eager_params, lr=0.1, momentum=0.9)
        compiled = CountingSGD(compiled_params, lr=0.1, momentum=0.9)
        step = torch.compile(compiled.step, backend=CompileCounter())
        self.step_optimizers(eager, eager_params, step, compiled_params, steps=6)
        # Called for real once per compile of SGD.step (twice: the momentum buffers
        # SGD.step stores after the first step change the guarded state), never
        # replayed at run time.
        self.assertEqual(len(calls), 2)

    def test_torch_optim_frames_unchanged(self):
        # Frame and graph-break counts measured on stock torch 2.13 with this loop.
        expected = {"SGD": (2, 1), "Adam": (1, 1), "AdamW": (1, 1)}
        for name, kwargs in (("SGD", {"lr": 0.1, "momentum": 0.9}), ("Adam", {"lr": 0.01}), ("AdamW", {"lr": 0.01})):
            with self.subTest(name):
                torch._dynamo.reset()
                counters.clear()
                eager_params, compiled_params = make_params(3), make_params(3)
                eager = getattr(torch.optim, name)(eager_params, **kwargs)
                compiled = getattr(torch.optim, name)(compiled_params, **kwargs)
                cnt = CompileCounter()
                step = torch.compile(compiled.step, backend=cnt)
                self.step_optimizers(eager, eager_params, step, compiled_params, steps=4)
                self.assertEqual((cnt.frame_count, sum(counters["graph_break"].values())), expected[name])


# -- guard coverage: every guarded input, pytree-style -------------------------

# How a tensor whose grad comes and goes is reachable from the guarded inputs of
# `Layout._collect` (each layout also keeps one buffer per tensor, updated with
# the grad by `Layout.step`).
LAYOUTS = ("dict key", "dict value", "list item", "attribute", "nested")


class Layout:
    """n tensors reachable from a guarded input in one of LAYOUTS."""

    def __init__(self, layout, n, seed=0):
        gen = torch.Generator().manual_seed(seed)
        ws = [torch.randn(2, generator=gen, requires_grad=True) for _ in range(n)]
        bufs = [torch.zeros(2) for _ in range(n)]
        self.layout, self.n = layout, n
        if layout == "dict key":
            self.state = {w: {"buf": b} for w, b in zip(ws, bufs)}  # keys only
        elif layout == "dict value":
            self.tensors = {f"w{i}": w for i, w in enumerate(ws)}
            self.bufs = {f"w{i}": b for i, b in enumerate(bufs)}
        elif layout == "list item":
            self.tensors, self.bufs = ws, bufs
        elif layout == "attribute":
            for i, (w, b) in enumerate(zip(ws, bufs)):
                setattr(self, f"w{i}", w)
                setattr(self, f"buf{i}", b)
        else:
            self.groups = [{"params": ws[: n // 2], "bufs": bufs[: n // 2]},
                           {"params": ws[n // 2:], "bufs": bufs[n // 2:]}]
        self._collect = _collectors(layout, n)

    def weights(self):
        if self.layout == "dict key":
            return list(self.state)
        if self.layout == "dict value":
            return list(self.tensors.values())
        if self.layout == "list item":
            return self.tensors
        if self.layout == "attribute":
            return [getattr(self, f"w{i}") for i in range(self.n)]
        return [w for g in self.groups for w in g["params"]]

    def buffers(self):
        if self.layout == "dict key":
            return [s["buf"] for s in self.state.values()]
        if self.layout == "dict value":
            return list(self.bufs.values())
        if self.layout == "list item":
            return self.bufs
        if self.layout == "attribute":
            return [getattr(self, f"buf{i}") for i in range(self.n)]
        return [b for g in self.groups for b in g["bufs"]]

    def step(self):
        grads, bufs = [], []
        self._collect(self, grads, bufs)
        for g, b in zip(grads, bufs):
            b.add_(g)
        return len(grads)


def _collectors(layout, n):
    """The init_values_once function for a layout: the buffers of the tensors that
    have a grad, and those grads."""
    if layout == "dict key":

        @torch._dynamo.init_values_once(guards=["self.state"])
        def collect(self, grads, bufs):
            for w, state in self.state.items():
                if w.grad is not None:
                    grads.append(w.grad)
                    bufs.append(state["buf"])

    elif layout == "dict value":

        @torch._dynamo.init_values_once(guards=["self.tensors", "self.bufs"])
        def collect(self, grads, bufs):
            for name, w in self.tensors.items():
                if w.grad is not None:
                    grads.append(w.grad)
                    bufs.append(self.bufs[name])

    elif layout == "list item":

        @torch._dynamo.init_values_once(guards=["self.tensors", "self.bufs"])
        def collect(self, grads, bufs):
            for w, b in zip(self.tensors, self.bufs):
                if w.grad is not None:
                    grads.append(w.grad)
                    bufs.append(b)

    elif layout == "attribute":

        @torch._dynamo.init_values_once(
            guards=[f"self.w{i}" for i in range(n)] + [f"self.buf{i}" for i in range(n)]
        )
        def collect(self, grads, bufs):
            for i in range(n):
                w = getattr(self, f"w{i}")
                if w.grad is not None:
                    grads.append(w.grad)
                    bufs.append(getattr(self, f"buf{i}"))

    else:

        @torch._dynamo.init_values_once(guards=["self.groups"])
        def collect(self, grads, bufs):
            for group in self.groups:
                for w, b in zip(group["params"], group["bufs"]):
                    if w.grad is not None:
                        grads.append(w.grad)
                        bufs.append(b)

    return collect


class InitValuesOnceGuardCoverageTests(torch._dynamo.test_case.TestCase):
    """Every guarded input is guarded on its pytree structure and on the grad
    presence of each of its tensors, however the tensor is reached."""

    # 2: stock guards; 9: tensor containers large enough for native guards
    # (torch._dynamo.guard_accel), where the series has them.
    SIZES = (2, 9)

    def step_both(self, eager, compiled, step, grads):
        """Give both the grads `grads(layout)` sets, step, compare results and state."""
        for layout in (eager, compiled):
            grads(layout)
        self.assertEqual(step(), eager.step())
        self.assertEqual(compiled.buffers(), eager.buffers())
        for we, wc in zip(eager.weights(), compiled.weights()):
            self.assertEqual(we.grad is None, wc.grad is None)

    def check_grad_change(self, layout, n, fresh, appears):
        torch._dynamo.reset()
        eager, compiled = Layout(layout, n), Layout(layout, n)
        cnt = CompileCounter()
        step = torch.compile(compiled.step, backend=cnt)
        changing = n // 2  # in the second group of "nested"
        state = {"step": 0}

        def grads(obj):
            # Grads of every tensor but `changing`, which has one from the third step
            # on (appears) or until the second (disappears).
            i = state["step"]
            has = (i >= 2) if appears else (i < 2)
            for k, w in enumerate(obj.weights()):
                want = has if k == changing else True
                if not want:
                    w.grad = None
                elif fresh or w.grad is None:
                    w.grad = torch.full((2,), float(k + 1 + (i if fresh else 0)))

        for i in range(5):
            state["step"] = i
            self.step_both(eager, compiled, step, grads)
            self.assertEqual(cnt.frame_count, 1 if i < 2 else 2, f"after step {i}")
        reasons = guard_failures[Layout.step.__code__]
        self.assertEqual(len(reasons), 1, reasons)
        self.assertIn(".grad", reasons[0])

    def test_grad_appearing_recompiles_once(self):
        for layout in LAYOUTS:
            for n in self.SIZES:
                for fresh in (False, True):
                    with self.subTest(layout=layout, n=n, fresh=fresh):
                        guard_failures.clear()
                        self.check_grad_change(layout, n, fresh, appears=True)

    def test_grad_disappearing_recompiles_once(self):
        for layout in LAYOUTS:
            for n in self.SIZES:
                for fresh in (False, True):
                    with self.subTest(layout=layout, n=n, fresh=fresh):
                        guard_failures.clear()
                        self.check_grad_change(layout, n, fresh, appears=False)

    def test_grad_of_dict_key_names_the_key_and_spec(self):
        eager, compiled = Layout("dict key", 2), Layout("dict key", 2)
        for obj in (eager, compiled):
            obj.weights()[0].grad = torch.ones(2)
        step = torch.compile(compiled.step, backend=CompileCounter())
        self.assertEqual(step(), eager.step())
        for obj in (eager, compiled):
            obj.weights()[1].grad = torch.ones(2)
        self.assertEqual(step(), eager.step())
        self.assertEqual(compiled.buffers(), eager.buffers())
        reasons = guard_failures[Layout.step.__code__]
        self.assertEqual(len(reasons), 1)
        self.assertIn("list(dict.keys(self.state))[1].grad is None", reasons[0])
        self.assertIn("init_values_once[self.state]", reasons[0])

    def test_grad_of_tensor_not_requiring_grad_is_guarded(self):
        # .grad can be assigned on a tensor that does not require grad: the
        # function's `.grad is not None` test holds for every tensor it reads.
        class Holder:
            def __init__(self, n):
                self.xs = [torch.ones(2) for _ in range(n)]

            @torch._dynamo.init_values_once(guards=["self.xs"])
            def collect(self, out):
                for x in self.xs:
                    if x.grad is not None:
                        out.append(x.grad)

        def fn(holder):
            out = []
            holder.collect(out)
            return sum(out, torch.zeros(2))

        def set_grad(holder):
            holder.xs[1].grad = torch.full((2,), 4.0)

        for n in self.SIZES:
            with self.subTest(n=n):
                torch._dynamo.reset()
                guard_failures.clear()
                self.check_structure_change(lambda: Holder(n), set_grad, fn, "holder.xs[1].grad")

    def check_structure_change(self, make, mutate, fn, expected_reason, state=None):
        """Compile fn(holder), mutate both holders before the third call; compare
        results (and state(holder)) with eager after every call."""
        eager, compiled = make(), make()
        cnt = CompileCounter()
        compiled_fn = torch.compile(fn, backend=cnt)
        for i in range(4):
            if i == 2:
                mutate(eager)
                mutate(compiled)
            self.assertEqual(compiled_fn(compiled), fn(eager))
            if state is not None:
                self.assertEqual(state(compiled), state(eager))
            self.assertEqual(cnt.frame_count, 1 if i < 2 else 2, f"after call {i}")
        reasons = guard_failures[fn.__code__]
        self.assertEqual(len(reasons), 1, reasons)
        self.assertIn(expected_reason, reasons[0])

    def test_dict_key_added_or_reordered_recompiles(self):
        class Buffers:
            def __init__(self, n):
                self.buffers = {f"b{i}": torch.full((2,), float(i + 1)) for i in range(n)}

            @torch._dynamo.init_values_once(guards=["self.buffers"])
            def collect(self, out):
                for v in self.buffers.values():
                    out.append(v)

        def fn(holder):
            out = []
            holder.collect(out)
            weighted = out[0] * 10  # depends on the order too
            for v in out[1:]:
                weighted = weighted + v
            return weighted

        def add_key(holder):
            holder.buffers["new"] = torch.full((2,), 8.5)

        def reorder(holder):
            items = list(holder.buffers.items())
            holder.buffers.clear()
            holder.buffers.update(reversed(items))

        for n in self.SIZES:
            for mutate, reason in ((add_key, "len(holder.buffers)"), (reorder, "holder.buffers")):
                with self.subTest(n=n, mutate=mutate.__name__):
                    torch._dynamo.reset()
                    guard_failures.clear()
                    self.check_structure_change(lambda: Buffers(n), mutate, fn, reason)

    def test_tensor_keyed_dict_keys_are_guarded(self):
        # A dict keyed by tensors gets no DICT_KEYS_MATCH: its length and each key's
        # identity are guarded already. A key added, replaced by a tensor with the
        # same metadata, or moved, recompiles.
        def fn(holder):
            return holder.step()

        def add_key(holder):
            holder.state[torch.ones(2, requires_grad=True)] = {"buf": torch.zeros(2)}

        def replace_key(holder):
            (w0, s0), (w1, s1) = list(holder.state.items())
            holder.state.clear()
            holder.state.update({w0: s0, torch.zeros(2, requires_grad=True): s1})
            # Kept alive: a dead key would drop the cache entry instead of failing it.
            holder.replaced = w1

        def move_key(holder):
            first = next(iter(holder.state))
            holder.state[first] = holder.state.pop(first)

        def make():
            layout = Layout("dict key", 2)
            for w in layout.weights():
                w.grad = torch.ones(2)
            return layout

        for mutate, reason in ((add_key, "len(holder.state)"), (replace_key, "list(dict.keys(holder.state))[1]"),
                               (move_key, "list(dict.keys(holder.state))[0]")):
            with self.subTest(mutate=mutate.__name__):
                torch._dynamo.reset()
                guard_failures.clear()

                def mutate_and_grad(holder, mutate=mutate):
                    mutate(holder)
                    for w in holder.weights():
                        w.grad = torch.ones(2)

                self.check_structure_change(make, mutate_and_grad, fn, reason, state=Layout.buffers)

    def test_inner_dict_key_added_recompiles(self):
        class State:
            def __init__(self, n):
                gen = torch.Generator().manual_seed(0)
                self.params = [torch.randn(2, generator=gen) for _ in range(n)]
                self.state = {p: {"exp_avg": torch.ones(2)} for p in self.params}

            @torch._dynamo.init_values_once(guards=["self.state"])
            def collect(self, out):
                for per_param in self.state.values():
                    out.extend(per_param.values())

        def fn(holder):
            out = []
            holder.collect(out)
            total = torch.zeros(2)
            for v in out:
                total = total + v
            return total

        def add_inner_key(holder):
            holder.state[holder.params[1]]["exp_avg_sq"] = torch.full((2,), 3.0)

        for n in self.SIZES:
            with self.subTest(n=n):
                torch._dynamo.reset()
                guard_failures.clear()
                # The reason names the second inner dict (stock guards or native).
                self.check_structure_change(
                    lambda: State(n), add_inner_key, fn, "holder.state[list(dict.keys(holder.state))[1]]"
                )

    def test_list_and_tuple_lengths_are_guarded(self):
        class Holder:
            def __init__(self):
                self.items = {"xs": [torch.ones(2), torch.ones(2)], "pair": (torch.ones(2), torch.ones(2))}

            @torch._dynamo.init_values_once(guards=["self.items"])
            def collect(self, out):
                out.extend(self.items["xs"])
                out.extend(self.items["pair"])

        def fn(holder):
            out = []
            holder.collect(out)
            return torch.stack(out).sum(0)

        def grow_list(holder):
            holder.items["xs"].append(torch.full((2,), 5.0))

        def grow_tuple(holder):
            holder.items["pair"] = (*holder.items["pair"], torch.full((2,), 7.0))

        for mutate, reason in ((grow_list, "len(holder.items['xs'])"), (grow_tuple, "len(holder.items['pair'])")):
            with self.subTest(mutate=mutate.__name__):
                torch._dynamo.reset()
                guard_failures.clear()
                self.check_structure_change(Holder, mutate, fn, reason)



if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
