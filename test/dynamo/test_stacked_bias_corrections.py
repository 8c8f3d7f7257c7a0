# Owner(s): ["module: dynamo"]
"""Compiled Adam computes the capturable bias corrections of 0-d CPU steps on one stacked
vector (torch/optim/_stacked_bias_corrections.py)."""

import operator
import unittest

import torch
import torch._dynamo.test_case
from torch._dynamo import config
from torch._dynamo.testing import CompileCounterWithBackend, EagerAndRecordGraphs


def count_calls(gm, target):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def count_pows(gm):
    return sum(count_calls(gm, target) for target in (operator.pow, torch.pow))


def state_of(opt):
    return [{k: v.clone() for k, v in s.items()} for s in opt.state.values()]


def step_compiled_and_eager(
    test, make_optimizer, check, steps=4, groups=1, shapes=((3, 3), (5,), (2, 4)), prepare=None
):
    """Step a compiled and an eager optimizer with the same grads (optionally prepared
    by prepare(opt, params) first); after every step compare the params and call
    check(opt, ref, params, ref_params); return (graphs, frame_count, params)."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for _ in range(groups) for s in shapes]
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]

    def param_groups(ps):
        k = len(shapes)
        if groups == 1:
            return ps
        return [{"params": ps[i * k : (i + 1) * k], "lr": 0.01 * (i + 1)} for i in range(groups)]

    opt = make_optimizer(param_groups(params))
    ref = make_optimizer(param_groups(ref_params))
    if prepare is not None:
        prepare(opt, params)
        prepare(ref, ref_params)
    recording = EagerAndRecordGraphs()
    cnt = CompileCounterWithBackend(recording)
    compiled = torch.compile(opt.step, backend=cnt)
    for i in range(steps):
        for p, q in zip(params, ref_params):
            p.grad = torch.randn(p.shape) * (i + 1)
            q.grad = p.grad.clone()
        compiled()
        ref.step()
        test.assertEqual(params, ref_params)
        check(opt, ref, params, ref_params)
    return recording.graphs, cnt.frame_count, params


class StackedBiasCorrectionTests(torch._dynamo.test_case.TestCase):
    def run_steps(self, make_optimizer, **kwargs):
        """step_compiled_and_eager, comparing every state entry with eager's."""

        def same_state(opt, ref, params, ref_params):
            self.assertEqual(state_of(opt), state_of(ref))

        return step_compiled_and_eager(self, make_optimizer, same_state, **kwargs)

    def test_adam_foreach_stacks_cpu_steps(self):
        graphs, frames, _ = self.run_steps(lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True))
        self.assertEqual(frames, 1)
        (gm,) = graphs
        # One stack of the steps and one pow per beta, not a foreach pow per beta over
        # every step (each a kernel per step on CPU).
        self.assertEqual(count_calls(gm, torch._foreach_pow), 0)
        self.assertEqual(count_calls(gm, torch.stack), 1)
        self.assertEqual(count_calls(gm, torch.pow), 2)

    def test_switch_off_keeps_foreach_bias_corrections(self):
        with config.patch(optim_stacks_cpu_bias_corrections=False):
            graphs, frames, params_off = self.run_steps(lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True))
        self.assertEqual(frames, 1)
        self.assertEqual(count_calls(graphs[0], torch._foreach_pow), 2)
        self.assertEqual(count_calls(graphs[0], torch.stack), 0)
        _, _, params_on = self.run_steps(lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True))
        # Same operations in the same order; only a vectorized pow may round a bias
        # correction's last bit differently.
        self.assertEqual(params_on, params_off, atol=1e-6, rtol=1e-6)

    def test_group_without_grads(self):
        # A frozen param group has no grads, so no steps to stack (torch.stack of none
        # would fail); its step is a no-op as in eager.
        for foreach in (True, False):
            with self.subTest(foreach=foreach):
                torch._dynamo.reset()
                torch.manual_seed(0)
                live = [torch.nn.Parameter(torch.randn(3)) for _ in range(2)]
                frozen = [torch.nn.Parameter(torch.randn(3))]
                ref_live, ref_frozen = ([torch.nn.Parameter(p.detach().clone()) for p in ps] for ps in (live, frozen))
                opt = torch.optim.AdamW([{"params": live}, {"params": frozen}], lr=0.01, foreach=foreach)
                ref = torch.optim.AdamW([{"params": ref_live}, {"params": ref_frozen}], lr=0.01, foreach=foreach)
                cnt = CompileCounterWithBackend("eager")
                compiled = torch.compile(opt.step, backend=cnt)
                for i in range(3):
                    for p, q in zip(live, ref_live):
                        p.grad = torch.randn(3) * (i + 1)
                        q.grad = p.grad.clone()
                    compiled()
                    ref.step()
                    self.assertEqual(live + frozen, ref_live + ref_frozen)
                    self.assertEqual(state_of(opt), state_of(ref))
                self.assertEqual(len(opt.state), 2)
                self.assertEqual(cnt.frame_count, 1)

    def test_only_op_by_op_backends_stack(self):
        # Inductor fuses the foreach ops itself and, given the stacked graph, lowers its N
        # views superlinearly; a backend Dynamo cannot see through may be Inductor.
        # Dynamo answers at trace time.
        import functools

        from torch._dynamo.backends.debugging import eager
        from torch.optim._stacked_bias_corrections import runs_graph_as_traced

        def fn(x):
            return x + 1 if runs_graph_as_traced() else x - 1

        def opaque(gm, example_inputs):
            return gm.forward

        @functools.wraps(eager)
        def named(gm, example_inputs):
            return eager(gm, example_inputs)

        x = torch.ones(2)
        for backend, stacks in (
            ("eager", True),
            ("aot_eager", True),
            (CompileCounterWithBackend("eager"), True),
            (EagerAndRecordGraphs(), True),
            (named, True),
            (opaque, False),
            ("inductor", False),
            (CompileCounterWithBackend("inductor"), False),
        ):
            with self.subTest(backend=backend):
                torch._dynamo.reset()
                self.assertEqual(torch.compile(fn, backend=backend)(x), x + 1 if stacks else x - 1)

    def test_switch_is_guarded_with_a_readable_reason(self):
        params = [torch.nn.Parameter(torch.randn(3)) for _ in range(2)]
        opt = torch.optim.Adam(params, lr=0.01, foreach=True)
        compiled = torch.compile(opt.step, backend="eager")
        for p in params:
            p.grad = torch.ones(3)
        compiled()
        with config.patch(optim_stacks_cpu_bias_corrections=False, error_on_recompile=True):
            with self.assertRaises(torch._dynamo.exc.RecompileError) as caught:
                compiled()
        self.assertIn("optim_stacks_cpu_bias_corrections == True", str(caught.exception))

    def test_variants_match_eager(self):
        variants = {
            "two groups": (dict(), 2),
            "amsgrad": (dict(amsgrad=True), 1),
            "weight decay, maximize": (dict(weight_decay=0.1, maximize=True), 1),
            "adamw": (dict(decoupled_weight_decay=True, weight_decay=0.1), 2),
        }
        for name, (kwargs, groups) in variants.items():
            with self.subTest(name):
                torch._dynamo.reset()
                graphs, frames, _ = self.run_steps(
                    lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True, **kwargs), groups=groups
                )
                self.assertEqual(frames, 1)
                (gm,) = graphs
                self.assertEqual(count_calls(gm, torch._foreach_pow), 0)
                self.assertEqual(count_calls(gm, torch.stack), groups)

    def test_single_tensor_adam_stacks_cpu_steps(self):
        for name, kwargs in {
            "adamw": dict(weight_decay=0.1),
            "amsgrad": dict(amsgrad=True),
            "maximize": dict(maximize=True),
            "tensor lr": dict(lr=torch.tensor(0.01)),
        }.items():
            with self.subTest(name):
                torch._dynamo.reset()
                kwargs = {"lr": 0.01, **kwargs}
                graphs, frames, _ = self.run_steps(lambda ps: torch.optim.AdamW(ps, foreach=False, **kwargs))
                self.assertEqual(frames, 1)
                (gm,) = graphs
                # beta1 ** step and beta2 ** step once on the stacked steps, not per parameter.
                self.assertEqual(count_pows(gm), 2)
                self.assertEqual(count_calls(gm, torch.stack), 1)

    def test_single_tensor_switch_off(self):
        with config.patch(optim_stacks_cpu_bias_corrections=False):
            graphs, frames, params_off = self.run_steps(lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False))
        self.assertEqual(frames, 1)
        self.assertEqual(count_pows(graphs[0]), 2 * 3)  # two per parameter
        self.assertEqual(count_calls(graphs[0], torch.stack), 0)
        _, _, params_on = self.run_steps(lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False))
        self.assertEqual(params_on, params_off, atol=1e-6, rtol=1e-6)

    @unittest.skipUnless(torch.distributed.is_available(), "needs torch.distributed")
    def test_single_tensor_adam_still_scripts(self):
        # TorchScript compiles _single_tensor_adam for the functional optimizers; the
        # stacked path is Python-only and skipped there.
        from torch.distributed.optim.functional_adam import _FunctionalAdam

        torch.manual_seed(0)
        params = [torch.randn(3, 3, requires_grad=True) for _ in range(2)]
        ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
        scripted = torch.jit.script(_FunctionalAdam(params, lr=0.01, foreach=False))
        ref = torch.optim.Adam(ref_params, lr=0.01, foreach=False)
        for _ in range(3):
            grads = [torch.randn(3, 3) for _ in params]
            for q, g in zip(ref_params, grads):
                q.grad = g.clone()
            scripted.step(grads)
            ref.step()
            self.assertEqual(params, ref_params)

    def test_step_listed_twice_in_a_group(self):
        # torch.optim only warns about a parameter listed twice in a group.
        # _single_tensor_adam increments a step right before its parameter's update, so
        # eager's two updates of that parameter see steps k+1 and k+2; the stacked
        # pre-pass increments every step first (both would see k+2), so such a group
        # keeps the per-step ops. _multi_tensor_adam increments all steps before reading
        # any, so its stacked vector may hold a step twice. Two parameters sharing one
        # step tensor are the same case.
        import warnings

        def listed_twice(ps):
            return [*ps, ps[0]]

        def share_step(opt, params):
            for p in params:
                p.grad = torch.ones_like(p)
            opt.step()
            opt.state[params[2]]["step"] = opt.state[params[0]]["step"]

        cases = {
            "distinct": (lambda ps: ps, None, True),
            "param listed twice": (listed_twice, None, False),
            "step shared": (lambda ps: ps, share_step, False),
        }
        for name, (group, prepare, distinct) in cases.items():
            for cls in (torch.optim.Adam, torch.optim.AdamW):
                for foreach in (True, False):
                    with self.subTest(name, cls=cls.__name__, foreach=foreach):
                        torch._dynamo.reset()
                        with warnings.catch_warnings():
                            # "optimizer contains a parameter group with duplicate parameters"
                            warnings.simplefilter("ignore", UserWarning)
                            graphs, frames, _ = self.run_steps(
                                lambda ps: cls(group(ps), lr=0.01, foreach=foreach), prepare=prepare
                            )
                        self.assertEqual(frames, 1)
                        (gm,) = graphs
                        if foreach or distinct:
                            self.assertEqual(count_calls(gm, torch.stack), 1)
                            self.assertEqual(count_calls(gm, torch._foreach_pow), 0)
                            self.assertEqual(count_pows(gm), 2)
                        else:
                            self.assertEqual(count_calls(gm, torch.stack), 0)
                            self.assertEqual(count_pows(gm), 2 * len(group([0, 1, 2])))  # two per entry

    def test_other_steps_keep_per_step_ops(self):
        # A checkpoint can hold a step of shape [1] or of another dtype; stacking it
        # with the others would fail or promote, so the group keeps per-step ops.
        for step in (torch.tensor([1.0]), torch.tensor(1.0, dtype=torch.float64)):
            for foreach in (True, False):
                with self.subTest(step=step, foreach=foreach):

                    def make(ps):
                        opt = torch.optim.Adam(ps, lr=0.01, foreach=foreach)
                        for p in ps:
                            p.grad = torch.ones_like(p)
                        opt.step()
                        opt.state[ps[1]]["step"] = step.clone()
                        return opt

                    torch._dynamo.reset()
                    graphs, frames, _ = self.run_steps(make)
                    self.assertEqual(frames, 1)
                    self.assertEqual(count_calls(graphs[0], torch.stack), 0)
                    if foreach:
                        self.assertEqual(count_calls(graphs[0], torch._foreach_pow), 2)
                    else:
                        self.assertEqual(count_pows(graphs[0]), 2 * 3)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
