# Owner(s): ["module: dynamo"]
"""Compiled SGD creates a group's first momentum buffers with one foreach clone
(_multi_tensor_sgd in torch/optim/sgd.py)."""

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounterWithBackend, EagerAndRecordGraphs


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
