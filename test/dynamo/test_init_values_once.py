# Owner(s): ["module: dynamo"]
"""torch._dynamo.init_values_once: run lazy initialisers for real, guard their inputs."""

import collections
import gc
import importlib.util
import linecache
import logging
import weakref

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters, guard_failures

try:
    from .test_optimizer_variable import alive, gc_disabled, live_tensors, opt_step, RecordingCounter
except ImportError:
    from test_optimizer_variable import alive, gc_disabled, live_tensors, opt_step, RecordingCounter


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


def make_pair(cls, n=4):
    """Two optimizers of `cls` over equal parameters: eager, and one whose step is compiled."""
    eager, compiled = cls(make_params(n)), cls(make_params(n))
    cnt = CompileCounter()
    return eager, compiled, torch.compile(compiled.step, backend=cnt), cnt


def set_grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(3, 3, generator=gen)  # fresh grads, as zero_grad(set_to_none=True)


class InitValuesOnceTests(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        INIT_CALLS.clear()

    def make_pair(self, cls=PlainSGD, n=4):
        return make_pair(cls, n)

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

    def test_guard_label_is_a_frame_called_from_the_frame(self):
        # A spec's guards end their user stack in a frame named for the spec, called
        # from the traced frame's own line (step's _init_group call), which stays above
        # it, as for an inlined call: the label does not replace the frame's location.
        guards = []
        params = make_params(3)
        opt = PlainSGD(params)
        set_grads(params, 0)
        torch._dynamo.optimize(CompileCounter(), guard_export_fn=guards.extend)(opt.step)()
        labelled = [g for g in guards if g.user_stack and "init_values_once[" in g.user_stack[-1].name]
        names = {g.user_stack[-1].name for g in labelled}
        for spec in ("self.state", "self.param_groups"):
            self.assertIn(f"init_values_once[{spec}] of PlainSGD._init_group", names)
        init_code = PlainSGD._init_group.__code__
        for guard in labelled:
            callee, caller = guard.user_stack[-1], guard.user_stack[-2]
            self.assertEqual((callee.filename, callee.lineno), (init_code.co_filename, init_code.co_firstlineno))
            self.assertEqual(caller.name, "step")
            self.assertIn("self._init_group(", linecache.getline(caller.filename, caller.lineno))

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
        with self.assertRaisesRegex(
            ValueError,
            r"guard 'stat.x' names 'stat', which is not a parameter of .*\.f; its parameters are self, group",
        ):

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
        # Without this patch: fresh grads fail identity guards on every step.
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
        # Frame and graph-break counts measured on torch 2.13 without this patch series, with this loop.
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


def plain_sgd_refs(optimizer):
    """Weak references to an optimizer and its parameters, grads and state tensors."""
    params = optimizer.param_groups[0]["params"]
    return {
        "param": [weakref.ref(p) for p in params],
        "grad": [weakref.ref(p.grad) for p in params],
        "state": [weakref.ref(s["momentum_buffer"]) for s in optimizer.state.values()],
        "optimizer": [weakref.ref(optimizer)],
    }


class InitValuesOnceMemoryTests(torch._dynamo.test_case.TestCase):
    """A compiled step of an init_values_once optimizer keeps none of its tensors alive."""

    def setUp(self):
        super().setUp()
        INIT_CALLS.clear()

    def test_dropped_optimizer_frees_params_grads_and_state(self):
        gc.collect()
        before = live_tensors()
        cnt = CompileCounter()
        compiled_step = torch.compile(opt_step, backend=cnt)
        with gc_disabled():
            eager_params, params = make_params(), make_params()
            eager, opt = PlainSGD(eager_params), PlainSGD(params)
            for i in range(3):
                set_grads(eager_params, i)
                set_grads(params, i)
                eager.step()
                compiled_step(opt)
                for pe, pc in zip(eager_params, params):
                    self.assertEqual(pe, pc)
            self.assertEqual(cnt.frame_count, 1)
            self.assertEqual(INIT_CALLS[id(opt)], 1)
            refs = plain_sgd_refs(opt)
            self.assertEqual(len(refs["state"]), 4)
            del eager_params, params, eager, opt, pe, pc
            # Refcounting alone frees them: the graph takes them as inputs.
            self.assertEqual(alive(refs), "")
            self.assertEqual(live_tensors(), before)
        gc.collect()
        self.assertEqual(live_tensors(), before)

    def test_recreated_optimizers_do_not_grow_memory(self):
        # 1,000 optimizers over new parameters, each stepped twice by one compiled
        # function; gc stays off between the checks, so nothing may wait for it.
        iterations, check_every = 1000, 100
        gc.collect()
        before = live_tensors()
        cnt = RecordingCounter()
        compiled_step = torch.compile(opt_step, backend=cnt)
        counts, leaks = [], []
        with gc_disabled():
            for i in range(iterations):
                params = make_params(seed=i)
                opt = PlainSGD(params)
                for step in range(2):
                    set_grads(params, step)
                    compiled_step(opt)
                # The second step ran compiled code, which does not call
                # _init_group: only the first (traced or eager) did.
                self.assertEqual(INIT_CALLS.pop(id(opt)), 1, f"optimizer {i}")
                refs = plain_sgd_refs(opt)
                del params, opt
                if leak := alive(refs):
                    leaks.append(f"optimizer {i}: {leak}")
                if i % check_every == check_every - 1:
                    counts.append(live_tensors())
                    gc.collect()
        self.assertEqual(leaks, [])
        self.assertEqual(counts, [before] * (iterations // check_every))
        gc.collect()
        self.assertEqual(live_tensors(), before)
        # Every graph still alive belongs to a cache entry.
        cache_entries = len(_debug_get_cache_entry_list(opt_step.__code__))
        self.assertEqual(sum(g() is not None for g in cnt.graphs), cache_entries)


class GroupedSGD(PlainSGD):
    """PlainSGD with a decay / no-decay split: two param groups sharing one state dict."""

    def __init__(self, params):
        super().__init__(params)
        params = self.param_groups[0]["params"]
        self.param_groups = [
            {"params": params[:1], "lr": 0.1, "momentum": 0.9},
            {"params": params[1:], "lr": 0.05, "momentum": 0.5},
        ]


class CountingGroupedSGD(GroupedSGD):
    """Reads how many parameters have state after each group's _init_group."""

    def step(self):
        seen = []
        with torch.no_grad():
            for group in self.param_groups:
                params, grads, bufs = [], [], []
                self._init_group(group, params, grads, bufs)
                seen.append(len(self.state))
                for p, g, b in zip(params, grads, bufs):
                    b.mul_(group["momentum"]).add_(g)
                    p.add_(b, alpha=-group["lr"])
        return seen


class Holder:
    def __init__(self):
        self.cache = {"w": torch.ones(2)}

    @torch._dynamo.init_values_once(guards=["self.cache"])
    def read(self, out):
        out.append(self.cache["w"])


HOLDER = Holder()
CACHE_ALIAS = HOLDER.cache  # the same dict as HOLDER.cache, under a global name


class InitValuesOnceCallTests(torch._dynamo.test_case.TestCase):
    """What the real call sees, and what the frame sees of what it did."""

    def setUp(self):
        super().setUp()
        INIT_CALLS.clear()

    def assert_states_equal(self, eager, compiled):
        self.assertEqual(len(eager.state), len(compiled.state))
        for group_e, group_c in zip(eager.param_groups, compiled.param_groups):
            for pe, pc in zip(group_e["params"], group_c["params"]):
                self.assertEqual(pe, pc)
                self.assertEqual(eager.state[pe], compiled.state[pc])

    def step_both(self, eager, compiled, step, steps):
        results = []
        for i in range(steps):
            for opt in (eager, compiled):
                set_grads([p for g in opt.param_groups for p in g["params"]], i)
            expected = eager.step()
            self.assertEqual(step(), expected)
            self.assert_states_equal(eager, compiled)
            results.append(expected)
        return results

    def test_second_group_appends_to_state_the_first_guarded(self):
        # The second _init_group call adds entries to the state dict the first call's
        # guards were built from: no fallback to tracing, one call per group.
        eager, compiled = GroupedSGD(make_params()), GroupedSGD(make_params())
        cnt = CompileCounter()
        self.step_both(eager, compiled, torch.compile(compiled.step, backend=cnt), steps=6)
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(dict(counters["graph_break"]), {})
        self.assertEqual(INIT_CALLS[id(compiled)], 2)  # at trace time only

    def test_frame_that_read_the_state_before_it_grew_traces_the_call(self):
        # len(self.state) after the first group: a VariableTracker the second call
        # would change under the frame's feet. The compiled code must not reuse the
        # length the trace saw once the state is complete.
        eager, compiled = CountingGroupedSGD(make_params()), CountingGroupedSGD(make_params())
        cnt = CompileCounter()
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            results = self.step_both(eager, compiled, torch.compile(compiled.step, backend=cnt), steps=4)
        self.assertEqual(results[0], [1, 4])
        self.assertEqual(results[-1], [4, 4])
        self.assertIn("whose keys, length or membership the frame already read", "\n".join(logs.output))
        self.assertEqual(cnt.frame_count, 2)

    def test_pending_mutation_through_another_name(self):
        def fn(x, holder):
            CACHE_ALIAS["w"] = CACHE_ALIAS["w"] * 5  # the frame mutates holder.cache
            out = []
            holder.read(out)
            return x + out[0]

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            for i in range(3):
                x = torch.randn(2)
                HOLDER.cache["w"] = torch.ones(2)
                expected = fn(x, HOLDER)
                expected_w = HOLDER.cache["w"]
                HOLDER.cache["w"] = torch.ones(2)
                self.assertEqual(compiled(x, HOLDER), expected)
                self.assertEqual(HOLDER.cache["w"], expected_w)
        self.assertIn(
            "L['holder'].cache has pending mutations in the frame (as G['CACHE_ALIAS']", "\n".join(logs.output)
        )
        self.assertEqual(cnt.frame_count, 1)

    def test_pending_reassignment_on_a_spec_path(self):
        class Box:
            def __init__(self):
                self.cache = {}

        class Model:
            def __init__(self):
                self.box = Box()

            @torch._dynamo.init_values_once(guards=["self.box.cache"])
            def weight(self, out):
                out.append(self.box.cache.setdefault("w", torch.ones(2)))

        def fn(x, model):
            model.box.cache = {}  # the real call would fill the old dict
            out = []
            model.weight(out)
            return x + out[0], len(model.box.cache)

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        eager_model, compiled_model = Model(), Model()
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            for _ in range(3):
                x = torch.randn(2)
                self.assertEqual(compiled(x, compiled_model), fn(x, eager_model))
                self.assertEqual(compiled_model.box.cache, eager_model.box.cache)
        self.assertIn("L['model'].box.cache has pending mutations in the frame", "\n".join(logs.output))

    def test_result_not_reachable_from_guarded_inputs_is_traced(self):
        @torch._dynamo.init_values_once(guards=["cache"])
        def scale(cache):
            cache.setdefault("n", 3)
            return torch.ones(2) * cache["n"]  # a new tensor on every call

        def fn(x, cache):
            s = scale(cache)
            s.add_(1)
            return x * s

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        cache_e, cache_c = {}, {}
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            for _ in range(3):
                x = torch.randn(2)
                self.assertEqual(compiled(x, cache_c), fn(x, cache_e))
                self.assertEqual(cache_c, cache_e)
        self.assertIn("it returned a tensor (2,) that is not reachable from its guarded inputs", "\n".join(logs.output))
        self.assertEqual(cnt.frame_count, 1)

    def test_argument_from_the_caller_is_guarded(self):
        @torch._dynamo.init_values_once(guards=["cache"])
        def filled(cache, n):
            if n not in cache:
                cache[n] = torch.full((2,), float(n))
            return cache[n]

        def fn(x, cache, n):
            return x + filled(cache, n)

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        cache_e, cache_c = {}, {}
        for n in (1, 2, 2, 3):
            x = torch.randn(2)
            self.assertEqual(compiled(x, cache_c, n), fn(x, cache_e, n))
            self.assertEqual(cache_c, cache_e)
        self.assertEqual(cnt.frame_count, 3)
        # Each miss is the guard on the argument: n == 1 for n=2, then n == 1 and
        # n == 2 for n=3 (the cache's guards pass on the caller's dict).
        reasons = [r.splitlines()[0].split(":", 1)[1].split("#")[0].strip() for r in guard_failures[fn.__code__]]
        self.assertEqual(reasons, ["n == 1", "n == 2", "n == 1"])

    def test_container_from_the_caller_that_no_spec_names_is_traced(self):
        @torch._dynamo.init_values_once(guards=["cache"])
        def fill(cache, extra):
            cache.setdefault("a", torch.ones(2))
            extra.append(cache["a"])

        def fn(x, cache, extra):
            fill(cache, extra)
            return x + extra[-1]

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        cache_e, cache_c, extra_e, extra_c = {}, {}, [], []
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            for _ in range(3):
                x = torch.randn(2)
                self.assertEqual(compiled(x, cache_c, extra_c), fn(x, cache_e, extra_e))
                self.assertEqual(len(extra_c), len(extra_e))
        self.assertIn(
            "argument 'extra' (L['extra']) is a list from outside the frame that the guarded inputs ['cache'] "
            "do not reach (the function may read or fill it); name it in guards=[...] (e.g. 'extra') to cover it",
            "\n".join(logs.output),
        )
        self.assertEqual(cnt.frame_count, 3)  # traced: the appended tensor's list grows every call

    def test_spec_naming_a_missing_attribute_falls_back_visibly(self):
        # The fallback to tracing is logged at INFO, so TORCH_LOGS=dynamo shows it.
        class Holder2:
            def __init__(self):
                self.scale = 2.0

            @torch._dynamo.init_values_once(guards=["self.no_such_attribute"])
            def get(self):
                return self.scale

        def fn(x, h):
            return x * h.get()

        cnt = CompileCounter()
        h, x = Holder2(), torch.randn(2)
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.INFO) as logs:
            self.assertEqual(torch.compile(fn, backend=cnt)(x, h), fn(x, h))
        self.assertIn("guard 'self.no_such_attribute' does not resolve", "\n".join(logs.output))
        self.assertEqual(cnt.frame_count, 1)

    def test_returned_guarded_input_keeps_its_source(self):
        @torch._dynamo.init_values_once(guards=["cache"])
        def get(cache):
            cache.setdefault("scale", 2.0)
            return cache

        def fn(x, cache):
            d = get(cache)
            d["calls"] = d.get("calls", 0) + 1  # must reach the caller's dict
            return x * d["scale"]

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        cache_e, cache_c = {}, {}
        for _ in range(3):
            x = torch.randn(2)
            self.assertEqual(compiled(x, cache_c), fn(x, cache_e))
            self.assertEqual(cache_c, cache_e)
        self.assertEqual(cache_c["calls"], 3)
        # "calls" is a guarded constant, one frame per value, unless the patch
        # (scalar-state, which adds torch._dynamo.scalar_places) traces the
        # stored int: then its first change is the only recompile.
        stored_dynamic = (
            importlib.util.find_spec("torch._dynamo.scalar_places") is not None
            and torch._dynamo.config.scalar_state
        )
        self.assertEqual(cnt.frame_count, 2 if stored_dynamic else 3)

    def test_call_that_replaces_what_an_earlier_call_handed_out_is_traced(self):
        @torch._dynamo.init_values_once(guards=["cache"])
        def only(cache, key, out):
            # Keeps one entry: the second call drops the first call's tensor, which
            # the frame already uses through the source cache['a'].
            if key not in cache:
                cache.clear()
                cache[key] = torch.full((2,), float(len(key)))
            out.append(cache[key])

        def fn(x, cache):
            a, b = [], []
            only(cache, "a", a)
            y = x + a[0]
            only(cache, "bb", b)
            return y * b[0]

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        cache_e, cache_c = {}, {}
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            for _ in range(3):
                x = torch.randn(2)
                cache_e.clear()
                cache_c.clear()
                self.assertEqual(compiled(x, cache_c), fn(x, cache_e))
                self.assertEqual(cache_c, cache_e)
        self.assertIn("a dict whose items it replaced or removed", "\n".join(logs.output))

    def test_dict_made_in_the_frame_changed_by_the_call_is_traced(self):
        @torch._dynamo.init_values_once(guards=["cache"])
        def fill(cache, options):
            cache.setdefault("w", torch.ones(2))
            options["scale"] = 3.0  # the function only gets a copy of the frame's dict

        def fn(x, cache):
            options = {"scale": 1.0}
            fill(cache, options)
            return x * options["scale"]

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            for _ in range(2):
                x = torch.randn(2)
                self.assertEqual(compiled(x, {}), fn(x, {}))
        self.assertIn("it changed a dict made in the frame", "\n".join(logs.output))


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

    # 2: Dynamo's per-tensor guards; 9: tensor containers large enough for native guards
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
                # The reason names the second inner dict (per-tensor guards or native).
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



class DesignSGD:
    """The design's example, verbatim: `group` is not named in the guards; it is one of
    `self.param_groups`' dicts, which the `self.param_groups` guards cover."""

    def __init__(self, params, lr=0.1, momentum=0.9):
        self.param_groups = [{"params": list(params), "lr": lr, "momentum": momentum}]
        self.state = {}

    @torch._dynamo.init_values_once(guards=["self.state", "self.param_groups"])
    def _init_group(self, group, params_with_grad, grads, bufs):
        INIT_CALLS[id(self)] += 1
        for p in group["params"]:
            if p.grad is not None:
                params_with_grad.append(p)
                grads.append(p.grad)
                state = self.state.setdefault(p, {})
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                bufs.append(state["momentum_buffer"])

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params_with_grad, grads, bufs = [], [], []
            self._init_group(group, params_with_grad, grads, bufs)
            for p, g, b in zip(params_with_grad, grads, bufs):
                b.mul_(group["momentum"]).add_(g)
                p.add_(b, alpha=-group["lr"])


def grad_becomes_none(opt):
    opt.param_groups[0]["params"][1].grad = None


def param_group_added(opt):
    opt.param_groups.append({"params": make_params(2, seed=7), "lr": 0.05, "momentum": 0.5})


def state_entry_removed(opt):
    del opt.state[opt.param_groups[0]["params"][2]]


def state_dtype_changes(opt):
    state = opt.state[opt.param_groups[0]["params"][0]]
    state["momentum_buffer"] = state["momentum_buffer"].double()


class InitValuesOnceDesignExampleTests(torch._dynamo.test_case.TestCase):
    """`init_values_once(guards=["self.state", "self.param_groups"])` on
    `_init_group(self, group, ...)`, called per group of `self.param_groups`."""

    def setUp(self):
        super().setUp()
        INIT_CALLS.clear()

    def make_pair(self, n=4):
        return make_pair(DesignSGD, n)

    def step_both(self, eager, compiled, step, i, mutate=None, grads_of=None):
        """`mutate` both, give them the same fresh grads (every param, or those
        `grads_of` picks by index), step, then compare params, grads' presence and state."""
        for opt in (eager, compiled):
            if mutate is not None:
                mutate(opt)
            params = [p for g in opt.param_groups for p in g["params"]]
            gen = torch.Generator().manual_seed(100 + i)
            for k, p in enumerate(params):
                p.grad = torch.randn(3, 3, generator=gen) if grads_of is None or grads_of(k) else None
        eager.step()
        step()
        self.assertEqual(len(compiled.param_groups), len(eager.param_groups))
        for group_e, group_c in zip(eager.param_groups, compiled.param_groups):
            for pe, pc in zip(group_e["params"], group_c["params"]):
                self.assertEqual(pc, pe)
                self.assertEqual(pc.grad is None, pe.grad is None)
                self.assertEqual(pc in compiled.state, pe in eager.state)
                if pe in eager.state:
                    self.assertEqual(compiled.state[pc], eager.state[pe])
                    self.assertEqual(
                        compiled.state[pc]["momentum_buffer"].dtype, eager.state[pe]["momentum_buffer"].dtype
                    )

    def test_runs_once_and_compiles_once(self):
        eager, compiled, step, cnt = self.make_pair()
        for i in range(5):
            self.step_both(eager, compiled, step, i)
            self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(dict(counters["graph_break"]), {})
        self.assertEqual(INIT_CALLS[id(compiled)], 1)  # at trace time only
        self.assertEqual(INIT_CALLS[id(eager)], 5)

    def test_group_argument_needs_no_guard_of_its_own(self):
        # `group` is reached by the same path as `self.param_groups[0]`: no identity
        # guard on the dict, no CONSTANT_MATCH on its values beyond the spec's own.
        guards = []
        params = make_params(3)
        opt = DesignSGD(params)
        set_grads(params, 0)
        torch._dynamo.optimize(CompileCounter(), guard_export_fn=guards.extend)(opt.step)()
        self.assertEqual(INIT_CALLS[id(opt)], 1)
        group_guards = {g.create_fn_name() for g in guards if g.name == "L['self'].param_groups[0]"}
        self.assertNotIn("ID_MATCH", group_guards)
        self.assertNotIn("DUPLICATE_INPUT", group_guards)

    def test_each_guarded_change_recompiles_once(self):
        def grad_appears(opt):
            pass  # the grads are set by step_both: none for param 1 on steps 0-1

        grad_1 = "fn.__self__.param_groups[0]['params'][1].grad"
        cases = [
            (grad_becomes_none, None, f"{grad_1} is not None"),
            (grad_appears, lambda k: k != 1, f"{grad_1} is None"),
            (param_group_added, None, "len(fn.__self__.param_groups) == 1"),
            (state_dtype_changes, None, "momentum_buffer']' dtype mismatch. expected Float, actual Double"),
            (state_entry_removed, None, "len(fn.__self__.state) != 4"),
        ]
        for mutate, first_grads, reason in cases:
            with self.subTest(mutate.__name__):
                torch._dynamo.reset()
                INIT_CALLS.clear()
                guard_failures.clear()
                eager, compiled, step, cnt = self.make_pair()
                for i in range(2):
                    self.step_both(eager, compiled, step, i, grads_of=first_grads)
                self.assertEqual(cnt.frame_count, 1)
                self.assertEqual(INIT_CALLS[id(compiled)], 1)
                # grad_becomes_none / grad_appears: the grads of this step decide.
                keep = (lambda k: k != 1) if mutate is grad_becomes_none else None
                self.step_both(eager, compiled, step, 2, mutate=mutate, grads_of=keep)
                self.assertEqual(cnt.frame_count, 2)
                calls = 3 if mutate is param_group_added else 2  # the second trace calls it per group
                self.assertEqual(INIT_CALLS[id(compiled)], calls)
                # step is no_grad-decorated: the compiled frame is the decorator's wrapper.
                reasons = [r for code_reasons in guard_failures.values() for r in code_reasons]
                self.assertEqual(len(reasons), 1, reasons)
                self.assertIn(reason, reasons[0])
                self.step_both(eager, compiled, step, 3, grads_of=keep)
                self.assertEqual(cnt.frame_count, 2)
                self.assertEqual(INIT_CALLS[id(compiled)], calls)
                self.assertEqual(dict(counters["graph_break"]), {})

    def test_changes_in_sequence(self):
        # 5 steps, a grad turns None, then a param group is added: 1, 2, 3 frames.
        eager, compiled, step, cnt = self.make_pair()
        for i in range(5):
            self.step_both(eager, compiled, step, i)
        self.assertEqual(cnt.frame_count, 1)
        no_grad_1 = lambda k: k != 1  # noqa: E731
        for i in range(5, 8):
            self.step_both(eager, compiled, step, i, grads_of=no_grad_1)
        self.assertEqual(cnt.frame_count, 2)
        self.step_both(eager, compiled, step, 8, mutate=param_group_added, grads_of=no_grad_1)
        for i in range(9, 12):
            self.step_both(eager, compiled, step, i, grads_of=no_grad_1)
        self.assertEqual(cnt.frame_count, 3)
        self.assertEqual(INIT_CALLS[id(compiled)], 1 + 1 + 2)  # the third trace calls it per group

    def test_group_passed_under_another_name_must_stay_that_object(self):
        # The caller passes the group itself: the argument is an alias of
        # L['opt'].param_groups[0], so a later call with another dict fails a guard.
        def fn(opt, group):
            params_with_grad, grads, bufs = [], [], []
            opt._init_group(group, params_with_grad, grads, bufs)
            return [b.clone() for b in bufs]

        params = make_params(3)
        opt = DesignSGD(params)
        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        set_grads(params, 0)
        for _ in range(2):
            self.assertEqual(compiled(opt, opt.param_groups[0]), fn(opt, opt.param_groups[0]))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(INIT_CALLS[id(opt)], 1 + 2)  # once at trace time, twice eagerly
        other = {"params": make_params(2, seed=3), "lr": 0.1, "momentum": 0.9}
        set_grads(other["params"], 1)
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            result = compiled(opt, other)
        self.assertEqual(cnt.frame_count, 2)
        self.assertEqual(len(result), 2)
        for p, b in zip(other["params"], result):
            self.assertIs(opt.state[p]["momentum_buffer"].dtype, b.dtype)
            self.assertEqual(b, torch.zeros(3, 3))
        self.assertIn("opt.param_groups[0] is group ", guard_failures[fn.__code__][0])
        # A dict the guarded inputs do not reach is traced, and the reason names the specs.
        self.assertIn(
            "argument 'group' (L['group']) is a dict from outside the frame that the guarded inputs "
            "['self.state', 'self.param_groups'] do not reach",
            "\n".join(logs.output),
        )


    def test_group_of_a_torch_optimizer_under_another_name_is_pinned(self):
        # Guarded through a torch.optim.Optimizer (an OptimizerSource, under which
        # Dynamo installs no aliasing guard): the alias and the group are pinned by
        # identity instead, so another dict passed later recompiles.
        @torch._dynamo.init_values_once(guards=["opt.param_groups"])
        def lrs(opt, group, out):
            out.append(group["lr"])

        def fn(opt, group, x):
            x = x + opt.defaults["lr"] * 0  # the optimizer is wrapped (OptimizerSource) first
            out = []
            lrs(opt, group, out)
            return x * out[0]

        opt = torch.optim.SGD(make_params(2), lr=0.5)
        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        x = torch.ones(2)
        self.assertEqual(compiled(opt, opt.param_groups[0], x), x * 0.5)
        self.assertEqual(compiled(opt, opt.param_groups[0], x), x * 0.5)
        self.assertEqual(cnt.frame_count, 1)
        other = {"params": [], "lr": 3.0}
        self.assertEqual(compiled(opt, other, x), x * 3.0)  # stale code would give x * 0.5
        self.assertEqual(cnt.frame_count, 2)

    def test_set_argument_is_traced_even_when_reachable(self):
        # A set is a leaf of the guarded pytree: its items are not guarded, so a set
        # the function reads must not be skipped over.
        class Tags:
            def __init__(self):
                self.meta = {"tags": {"a"}, "w": torch.ones(2)}

            @torch._dynamo.init_values_once(guards=["self.meta"])
            def weight(self, tags, out):
                out.append(self.meta["w"] * len(tags))

        def fn(holder, x):
            out = []
            holder.weight(holder.meta["tags"], out)
            return x + out[0]

        eager, compiled_holder = Tags(), Tags()
        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        with self.assertLogs("torch._dynamo.variables.init_once", level=logging.DEBUG) as logs:
            for tag in ("b", "c"):
                x = torch.randn(2)
                self.assertEqual(compiled(compiled_holder, x), fn(eager, x))
                eager.meta["tags"].add(tag)
                compiled_holder.meta["tags"].add(tag)
        self.assertIn("argument 'tags' (L['holder'].meta['tags']) is a set from outside the frame", logs.output[0])
        self.assertEqual(cnt.frame_count, 2)  # traced: len(tags) is guarded and changes


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
