# Owner(s): ["module: dynamo"]
"""OptimizerVariable: attribute routing and guards on per-parameter state."""

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters


class ScaledSGD(torch.optim.Optimizer):
    """SGD whose per-parameter step size lives in optimizer state as a Python float."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    def _init_group(self, group, params, grads, scales):
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if len(state) == 0:
                state["scale"] = 1.0
            params.append(p)
            grads.append(p.grad)
            scales.append(state["scale"])

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params, grads, scales = [], [], []
            self._init_group(group, params, grads, scales)
            for p, g, s in zip(params, grads, scales):
                p.add_(g, alpha=-group["lr"] * s * self.multiplier())

    def multiplier(self):
        return 1


class GroupScaledSGD(ScaledSGD):
    def __init__(self, params, lr):
        super().__init__(params, lr)
        # An attribute whose name is a substring of "_init_group".
        self.group = 3

    def multiplier(self):
        return self.group


def make_params(seed):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(4, 4, generator=gen)) for _ in range(2)]
    for p in params:
        p.grad = torch.randn(4, 4, generator=gen)
    return params


class OptimizerVariableTests(torch._dynamo.test_case.TestCase):
    def test_attribute_named_like_init_group_substring(self):
        # `self.group` used to be routed to _init_group's interception (a substring
        # test), breaking the graph and running the whole step eagerly.
        eager_params, compiled_params = make_params(0), make_params(0)
        eager_opt = GroupScaledSGD(eager_params, lr=0.1)
        compiled_opt = GroupScaledSGD(compiled_params, lr=0.1)
        cnt = CompileCounter()
        compiled_step = torch.compile(compiled_opt.step, backend=cnt, fullgraph=True)
        for _ in range(3):
            eager_opt.step()
            compiled_step()
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(dict(counters["graph_break"]), {})
        for e, c in zip(eager_params, compiled_params):
            self.assertEqual(e, c)

    def test_state_of_first_param_is_guarded(self):
        # The first parameter's state sits at index 0 of optimizer.state; its
        # non-tensor values must be guarded like any other parameter's.
        eager_params, compiled_params = make_params(1), make_params(1)
        eager_opt = ScaledSGD(eager_params, lr=0.1)
        compiled_opt = ScaledSGD(compiled_params, lr=0.1)
        cnt = CompileCounter()
        compiled_step = torch.compile(compiled_opt.step, backend=cnt)
        eager_opt.step()
        compiled_step()
        self.assertEqual(cnt.frame_count, 1)

        for opt, params in ((eager_opt, eager_params), (compiled_opt, compiled_params)):
            opt.state[params[0]]["scale"] = 0.5
        eager_opt.step()
        compiled_step()
        self.assertEqual(cnt.frame_count, 2)
        for e, c in zip(eager_params, compiled_params):
            self.assertEqual(e, c)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
