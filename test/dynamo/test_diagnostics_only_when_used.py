# Owner(s): ["module: dynamo"]
"""The graph's text for a precompile-package bypass is formatted only when there is a
package. Frame counts and values are checked."""

from unittest import mock

import torch
import torch._dynamo.test_case
from torch._dynamo.output_graph import OutputGraph
from torch._dynamo.testing import CompileCounterWithBackend


def scaled_sum(x):
    return (x * 2).sum()


class DiagnosticsOnlyWhenUsedTests(torch._dynamo.test_case.TestCase):
    def run_sgd(self):
        """Three compiled SGD steps (its params are static: get_attr) vs eager;
        returns the frame count and how often the graph was formatted for a
        package bypass (the test harness's structured trace formats it too)."""
        torch._dynamo.reset()
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(3, 2, generator=gen)) for _ in range(5)]
        ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True)
        opt_ref = torch.optim.SGD(ref, lr=0.1, momentum=0.9, foreach=True)
        counter = CompileCounterWithBackend("eager")
        with mock.patch.object(
            OutputGraph, "bypass_package", autospec=True, side_effect=OutputGraph.bypass_package
        ) as bypass_package:
            step = torch.compile(opt.step, backend=counter)
            for _ in range(3):
                for p, r in zip(params, ref):
                    p.grad = torch.randn(3, 2, generator=gen)
                    r.grad = p.grad.clone()
                step()
                opt_ref.step()
                self.assertEqual(params, ref)
                for p, r in zip(params, ref):
                    self.assertEqual(opt.state[p], opt_ref.state[r])
        formatted = [call for call in bypass_package.call_args_list if "gm" in call.kwargs]
        for call in formatted:
            self.assertIn("def forward", call.kwargs["gm"])
        return counter.frame_count, len(formatted)

    def test_graph_not_formatted_without_a_package(self):
        frames, formatted = self.run_sgd()
        self.assertEqual(frames, 2)  # the first step creates the momentum buffers
        # Without this patch: once per graph with parameters, 2.
        self.assertEqual(formatted, 0)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
