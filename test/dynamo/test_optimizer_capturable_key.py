# Owner(s): ["module: dynamo"]
"""A compiled optimizer step leaves param groups as eager leaves them: OptimizerVariable
sets "capturable" for the trace only in groups that declare the option."""

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounter
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize


class GroupCounterOpt(torch.optim.Optimizer):
    """A third-party pattern (timm Adan, pytorch-optimizer Lion): no "capturable" option,
    and a step counter kept in the param group, which the step mutates."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            for p in group["params"]:
                p.sub_(p.grad * group["lr"])


def opt_step(opt):
    opt.step()


def make(cls, **kwargs):
    torch.manual_seed(0)
    params = [torch.randn(4, requires_grad=True), torch.randn(3, requires_grad=True)]
    copies = [[p.detach().clone().requires_grad_() for p in params] for _ in range(2)]
    return [(ps, cls(ps, **kwargs)) for ps in copies]


class CapturableKeyTests(torch._dynamo.test_case.TestCase):
    def run_steps(self, cls, calls=4, exact=True, **kwargs):
        (eager_params, eager), (compiled_params, compiled) = make(cls, **kwargs)
        cnt = CompileCounter()
        fn = torch.compile(opt_step, backend=cnt)
        for i in range(calls):
            for ps in (eager_params, compiled_params):
                for j, p in enumerate(ps):
                    p.grad = torch.full_like(p, 0.1 * (i + j + 1))
            opt_step(eager)
            fn(compiled)
            for g, eager_g in zip(compiled.param_groups, eager.param_groups):
                self.assertEqual(list(g), list(eager_g))  # same keys, same order
                self.assertEqual({k: v for k, v in g.items() if k != "params"},
                                 {k: v for k, v in eager_g.items() if k != "params"})
            if exact:
                self.assertEqual(compiled_params, eager_params, atol=0, rtol=0)
            else:  # the traced capturable path rounds differently, with or without this patch
                self.assertEqual(compiled_params, eager_params)
        return cnt

    def test_group_without_the_option_keeps_its_keys(self):
        # Without this patch: the first compiled step adds "capturable": True to the group.
        cnt = self.run_steps(GroupCounterOpt)
        # The group's step counter changes each call: automatic dynamic makes it a SymInt at
        # the third call, and at the second with scalar-state's scalar_state.
        self.assertEqual(cnt.frame_count, 2 if getattr(torch._dynamo.config, "scalar_state", False) else 3)

    @parametrize("foreach", [False, True])
    def test_torch_optim_groups_unchanged(self, foreach):
        # torch.optim declares the option: the trace still sets it (as without this patch),
        # and the real CPU groups keep capturable=False.
        self.run_steps(torch.optim.Adam, exact=False, lr=0.01, foreach=foreach)


instantiate_parametrized_tests(CapturableKeyTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
