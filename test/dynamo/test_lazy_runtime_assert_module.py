# Owner(s): ["module: dynamo"]
"""The module Dynamo wraps its graph in for insert_deferred_runtime_asserts is a
lazy graph module: the pass edits the graph only, so the graph's Python code is no
longer generated and exec'd one extra time per compile. Runtime asserts are still
inserted and run; values equal eager's."""

from unittest import mock

import torch
import torch._dynamo.test_case
import torch.fx.graph_module
from torch._dynamo.testing import CompileCounterWithBackend


def many_inputs(xs):
    return [x * 2 + 1 for x in xs]


def unbacked(x, y):
    n = x.item()
    torch._check(n >= 2)
    return y[:n] + 1


def compile_and_count_codegens(fn, *args):
    """Compile fn (backend="eager"), call it, and count real GraphModule code
    generations (GraphModule.recompile; a lazy module's is deferred until used)."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    original = torch.fx.graph_module.GraphModule.recompile
    calls = []

    def counting(self):
        calls.append(self)
        return original(self)

    with mock.patch.object(torch.fx.graph_module.GraphModule, "recompile", counting):
        result = torch.compile(fn, backend=counter, fullgraph=True)(*args)
    return result, len(calls), counter


class LazyRuntimeAssertModuleTests(torch._dynamo.test_case.TestCase):
    def test_one_codegen_fewer(self):
        xs = [torch.randn(3) for _ in range(20)]
        result, codegens, counter = compile_and_count_codegens(many_inputs, xs)
        self.assertEqual(result, many_inputs(xs))
        self.assertEqual(counter.frame_count, 1)
        # The graph module the backend runs; without this patch also the module
        # around the runtime-assert pass: 2.
        self.assertEqual(codegens, 1)

    @torch._dynamo.config.patch(capture_scalar_outputs=True)
    def test_runtime_asserts_still_inserted(self):
        x, y = torch.tensor(3), torch.arange(6.0)
        result, _, counter = compile_and_count_codegens(unbacked, x, y)
        self.assertEqual(result, unbacked(x, y))
        self.assertEqual(counter.frame_count, 1)
        gm = counter.graphs[0]
        self.assertIn("_assert_scalar", gm.code)
        # The assert is in the graph and runs: a value that breaks it fails there.
        self.assertEqual(gm(x, y), (unbacked(x, y),))
        with self.assertRaisesRegex(RuntimeError, "Runtime assertion failed"):
            gm(torch.tensor(1), y)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
