# Owner(s): ["module: dynamo"]
"""Work done only for a diagnostic is done only when it is used: the graph's text
for a precompile-package bypass only when there is a package, and automatic
dynamic's copy of a size entry only when an entry is updated (the copy is compared
and logged then). Frame counts, dynamic decisions, their log lines and values are
checked."""

import copy
import logging
from unittest import mock

import torch
import torch._dynamo.pgo
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

    def run_sizes(self, sizes):
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("eager")
        compiled = torch.compile(scaled_sum, backend=counter)
        copies = []
        with (
            mock.patch.object(torch._dynamo.pgo, "copy", wraps=copy) as copy_module,
            self.assertLogs("torch._dynamo.pgo", level=logging.DEBUG) as logs,
        ):
            for size in sizes:
                x = torch.arange(float(size))
                self.assertEqual(compiled(x), scaled_sum(x))
                copies.append(copy_module.copy.call_count)
            logging.getLogger("torch._dynamo.pgo").debug("end")  # assertLogs needs one record
        lines = [line for line in logs.output if "automatic dynamic" in line]
        return counter.frame_count, copies, lines

    def test_entry_copied_only_on_update(self):
        frames, copies, lines = self.run_sizes((3, 4, 5))
        # 3 compiles static, 4 recompiles with a dynamic size, 5 reuses it.
        self.assertEqual(frames, 2)
        # The first compile creates entries: no copy (without this patch, one per
        # entry); the recompile updates x's entry.
        self.assertEqual(copies, [0, 1, 1])
        self.assertEqual(lines, ["DEBUG:torch._dynamo.pgo:automatic dynamic size L['x'] size(0) 4 != 3"])


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
