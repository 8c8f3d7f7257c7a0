# Owner(s): ["module: dynamo"]
"""A skipped static-size guard's log message is formatted only when it is logged."""

import logging
import unittest.mock

import sympy

import torch
import torch._dynamo.test_case
import torch._dynamo.testing


def step(tensors):
    with torch.no_grad():
        torch._foreach_mul_(tensors, 0.5)
    return tensors[0].sum()


class SkippedStaticGuardMessageTests(torch._dynamo.test_case.TestCase):
    """produce_guards skips the guards on static sizes (TENSOR_MATCH checks them) and
    logs each at DEBUG: the message is formatted only when that log is enabled."""

    def compile_counting_formats(self, tensors):
        torch._dynamo.reset()
        formats = []
        original = sympy.Expr.__format__

        def counting(expr, spec):
            formats.append(expr)
            return original(expr, spec)

        counter = torch._dynamo.testing.CompileCounter()
        expected = step([t.clone() for t in tensors])
        with unittest.mock.patch.object(sympy.Expr, "__format__", counting):
            actual = torch.compile(step, backend=counter)(tensors)
        self.assertEqual(actual, expected)
        self.assertEqual(counter.frame_count, 1)
        return formats

    def test_not_formatted_when_not_logged(self):
        # Without this patch: one f-string per size, stride and offset (5 per tensor, 1000).
        formats = self.compile_counting_formats([torch.randn(4, 4) for _ in range(200)])
        self.assertEqual(len(formats), 0)

    def test_same_message_when_logged(self):
        logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
        with self.assertLogs(logger, level=logging.DEBUG) as logs:
            self.compile_counting_formats([torch.randn(4, 3) for _ in range(2)])
        skipped = [r.getMessage() for r in logs.records if r.getMessage().startswith("Skipping guard")]
        self.assertIn("Skipping guard L['tensors'][1].size()[1] == 3", skipped)
        self.assertIn("Skipping guard L['tensors'][0].stride()[0] == 3", skipped)
        self.assertEqual(len(skipped), 2 * 5)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
