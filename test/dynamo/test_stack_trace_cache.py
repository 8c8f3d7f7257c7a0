# Owner(s): ["module: dynamo"]
"""A node's user stack trace is formatted once per distinct frame chain, not per node.

The reference is every node formatted on its own, as without this patch: the tracer's
cache made to keep nothing (formatting_every_node)."""

import contextlib
import sys
import traceback
import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.output_graph import SubgraphTracer


def helper(x):
    return x.sin() + x.cos()


class Block(torch.nn.Module):
    def forward(self, x):
        return helper(x) * 2


def f(x, block):
    for _ in range(4):
        x = x + 1
    y = helper(x)
    return block(y) - y.sum()


def frame_chain(summary):
    return tuple((f.filename, f.lineno, f.end_lineno, f.name, f.colno, f.end_colno) for f in summary)


def count_formats():
    """The frame chains the tracer formats as node stack traces."""
    chains = []
    original = traceback.StackSummary.format

    def counting(self):
        if sys._getframe(1).f_code.co_name == "_create_proxy":
            chains.append(frame_chain(self))
        return original(self)

    return chains, unittest.mock.patch.object(traceback.StackSummary, "format", counting)


class _KeepNothing(dict):
    def __setitem__(self, key, value):
        pass


def formatting_every_node(cache=False):
    """Unless `cache`, each SubgraphTracer's formatted-trace cache keeps nothing."""
    if cache:
        return contextlib.nullcontext()
    original = SubgraphTracer.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.formatted_stack_traces = _KeepNothing()

    return unittest.mock.patch.object(SubgraphTracer, "__init__", init)


class StackTraceCacheTests(torch._dynamo.test_case.TestCase):
    def trace(self, cache):
        """Compile f once; the graph's (node, stack trace) pairs and the format calls."""
        torch._dynamo.reset()
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
        x, block = torch.randn(3), Block()
        calls, patch = count_formats()
        with patch, formatting_every_node(cache):
            compiled = torch.compile(f, backend=counter, fullgraph=True)
            self.assertEqual(compiled(x, block), f(x, block))
        self.assertEqual(counter.frame_count, 1)
        (gm,) = graphs
        traced = [(node.op, str(node.target), node.stack_trace) for node in gm.graph.nodes]
        return traced, calls

    def test_same_stack_traces_formatted_once_per_frame_chain(self):
        traced, calls = self.trace(cache=True)
        traced_without, calls_without = self.trace(cache=False)
        # Exactly the text formatting each node gives.
        self.assertEqual(traced, traced_without)
        traces = [trace for op, _, trace in traced if op in ("call_function", "call_method")]
        # 4 loop adds; sin, cos, + of helper called from f; the same under Block.forward;
        # Block's *2; sum; -.
        self.assertEqual(len(traces), 4 + 3 + 3 + 1 + 1 + 1)
        self.assertTrue(all(trace for trace in traces))
        # The four adds of the loop come from one instruction: one text.
        self.assertEqual(len(set(traces[:4])), 1)
        # cos and sin of one line differ in their carets.
        self.assertNotEqual(traces[4], traces[5])
        # The helper inlined under Block.forward differs by its outer frames.
        self.assertTrue(set(traces[4:7]).isdisjoint(traces[7:10]))
        self.assertIn("block(y)", traces[7])
        self.assertNotIn("block(y)", traces[4])
        # Without this patch every node is formatted; with it each frame chain once.
        self.assertEqual(len(calls_without), len([t for _, _, t in traced_without if t]))
        self.assertEqual(len(calls), len(set(calls)))
        self.assertEqual(set(calls), set(calls_without))
        self.assertLessEqual(len(calls), len(calls_without) - 3)

    def test_higher_order_op_subgraphs(self):
        # Each HOP body has its own SubgraphTracer; its nodes get the same text as
        # without this patch, and the outer graph's are unaffected.
        def cond_f(x):
            def true_fn(x):
                return helper(x) + 1

            def false_fn(x):
                return helper(x) - 1

            y = x * 2
            return torch.cond(x.sum() > 0, true_fn, false_fn, (y,)) + y

        def traced(cache):
            graphs = []

            def backend(gm, example_inputs):
                graphs.append(gm)
                return gm.forward

            x = torch.randn(3)
            with formatting_every_node(cache):
                torch._dynamo.reset()
                out = torch.compile(cond_f, backend=backend, fullgraph=True)(x)
            self.assertEqual(out, cond_f(x))
            (gm,) = graphs
            return [
                (name, node.op, str(node.target), node.stack_trace)
                for name, module in gm.named_modules()
                if isinstance(module, torch.fx.GraphModule)
                for node in module.graph.nodes
            ]

        with_cache, without = traced(True), traced(False)
        self.assertEqual(with_cache, without)
        subgraph_traces = [t for name, op, _, t in with_cache if name and op == "call_method"]
        self.assertEqual(len(subgraph_traces), 4)  # sin and cos in each branch
        self.assertTrue(all("helper" in t for t in subgraph_traces))

    def test_cache_is_per_tracer(self):
        # A second compile of the same code formats again: nothing outlives its graph.
        _, first = self.trace(cache=True)
        torch._dynamo.reset()
        _, second = self.trace(cache=True)
        self.assertEqual(len(first), len(second))
        self.assertGreater(len(second), 0)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
