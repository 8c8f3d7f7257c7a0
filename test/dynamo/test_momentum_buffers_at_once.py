# Owner(s): ["module: dynamo"]
"""Compiled SGD creates a group's first momentum buffers with one foreach clone
(torch/optim/_momentum_buffers_at_once.py)."""

import torch
import torch._dynamo.test_case
from torch._dynamo import config
from torch._dynamo.testing import EagerAndRecordGraphs

try:
    from .test_stacked_bias_corrections import step_compiled_and_eager
except ImportError:
    from test_stacked_bias_corrections import step_compiled_and_eager


def count_calls(gm, target):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def count_methods(gm, name):
    return sum(1 for n in gm.graph.nodes if n.op == "call_method" and n.target == name)


SHAPES = ((3, 3), (5,), (2, 4))


class MomentumBuffersAtOnceTests(torch._dynamo.test_case.TestCase):
    def run_steps(self, make_optimizer, **kwargs):
        """step_compiled_and_eager, comparing every momentum buffer with eager's; return
        (graphs, frame_count)."""

        def same_buffers(opt, ref, params, ref_params):
            buffers = [opt.state[p]["momentum_buffer"] for p in params]
            self.assertEqual(buffers, [ref.state[q]["momentum_buffer"] for q in ref_params])
            # Each its own tensor, not a grad, with no autograd history.
            self.assertEqual(len({b.data_ptr() for b in buffers}), len(params))
            self.assertFalse(any(b.data_ptr() == p.grad.data_ptr() for b, p in zip(buffers, params)))
            self.assertFalse(any(b.requires_grad or b.grad_fn is not None for b in buffers))

        graphs, frames, _ = step_compiled_and_eager(self, make_optimizer, same_buffers, shapes=SHAPES, **kwargs)
        return graphs, frames

    def test_first_step_clones_the_grads_at_once(self):
        graphs, frames = self.run_steps(lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=True))
        # The first step creates the buffers, later steps update them: two graphs, as
        # without this change.
        self.assertEqual(frames, 2)
        first = graphs[0]
        self.assertEqual(count_calls(first, torch._foreach_clone), 1)
        self.assertEqual(count_methods(first, "clone") + count_methods(first, "detach"), 0)
        self.assertEqual(count_calls(graphs[1], torch._foreach_clone), 0)

    def test_switch_off_clones_per_parameter(self):
        with config.patch(optim_clones_momentum_buffers_at_once=False):
            graphs, frames = self.run_steps(lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=True))
        self.assertEqual(frames, 2)
        self.assertEqual(count_calls(graphs[0], torch._foreach_clone), 0)
        self.assertEqual(count_methods(graphs[0], "clone"), len(SHAPES))

    def test_switch_is_guarded_with_a_readable_reason(self):
        def first_step(params, grads):
            bufs = [None] * len(params)
            torch.optim._functional.sgd(
                params, grads, bufs, lr=0.01, momentum=0.9, weight_decay=0.0, dampening=0.0,
                nesterov=False, maximize=False, foreach=True,
            )
            return bufs

        params, grads = [torch.randn(3) for _ in range(2)], [torch.ones(3) for _ in range(2)]
        compiled = torch.compile(first_step, backend="eager")
        with torch.no_grad():
            compiled(params, grads)
            with config.patch(optim_clones_momentum_buffers_at_once=False, error_on_recompile=True):
                with self.assertRaises(torch._dynamo.exc.RecompileError) as caught:
                    compiled(params, grads)
        self.assertIn("optim_clones_momentum_buffers_at_once == True", str(caught.exception))

    def test_variants_match_eager(self):
        variants = {
            "two groups": (dict(), 2),
            "nesterov": (dict(nesterov=True), 1),
            "maximize, weight decay": (dict(maximize=True, weight_decay=0.1), 1),
            "dampening": (dict(dampening=0.5), 2),
        }
        for name, (kwargs, groups) in variants.items():
            with self.subTest(name):
                torch._dynamo.reset()
                graphs, frames = self.run_steps(
                    lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=True, **kwargs), groups=groups
                )
                self.assertEqual(frames, 2)
                self.assertEqual(count_calls(graphs[0], torch._foreach_clone), groups)

    def test_some_buffers_present_keeps_the_loop(self):
        # A group with some buffers already (state loaded for part of the model) keeps
        # the per-parameter loop, which updates those and creates the others.
        def prepare(opt, params):
            opt.state[params[1]]["momentum_buffer"] = torch.ones(params[1].shape)

        graphs, frames = self.run_steps(
            lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=True), prepare=prepare
        )
        self.assertEqual(frames, 2)
        self.assertEqual(count_calls(graphs[0], torch._foreach_clone), 0)
        self.assertEqual(count_methods(graphs[0], "clone"), len(SHAPES) - 1)

    def test_grad_mode_on_keeps_the_loop(self):
        # differentiable=True runs the step with grad mode on: detach() must drop the
        # grads' history, so the loop stays.
        def fn(params, bufs, grads):
            torch.optim._functional.sgd(
                params, grads, bufs, lr=0.01, momentum=0.9, weight_decay=0.0, dampening=0.0,
                nesterov=False, maximize=False, foreach=True,
            )
            return bufs

        torch.manual_seed(0)
        w = torch.randn(3, requires_grad=True)
        params = [torch.randn(3) for _ in range(3)]
        grads = [w * (i + 1) for i in range(3)]
        recording = EagerAndRecordGraphs()
        compiled = torch.compile(fn, backend=recording)
        bufs = compiled([p.clone() for p in params], [None] * 3, grads)
        ref = fn([p.clone() for p in params], [None] * 3, grads)
        self.assertEqual(bufs, ref)
        self.assertTrue(all(b.grad_fn is None and not b.requires_grad for b in bufs))
        self.assertEqual(count_calls(recording.graphs[0], torch._foreach_clone), 0)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
