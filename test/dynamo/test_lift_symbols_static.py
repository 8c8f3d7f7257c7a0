# Owner(s): ["module: dynamo"]
"""SubgraphTracer._lift_basic_symbols returns at once for a strided graph input whose
sizes, strides and offset are all ints; symbolic inputs and wrapper subclasses still have
their symbols lifted."""

import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo import output_graph
from torch.testing._internal.two_tensor import TwoTensor


def count_property_sources():
    """TensorPropertySources made in output_graph (by _lift_basic_symbols)."""
    made = []
    real = output_graph.TensorPropertySource

    def counting(*args, **kwargs):
        made.append((args[0].name, *args[1:]))
        return real(*args, **kwargs)

    return made, unittest.mock.patch.object(output_graph, "TensorPropertySource", counting)


def compile_once(fn, args, dynamic=None, mark=()):
    """Compile fn on args: graph code, placeholders' example values, sources made, frames,
    and the outputs."""
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(
            (
                gm.code,
                [
                    type(n.meta["example_value"]).__name__
                    for n in gm.graph.nodes
                    if n.op == "placeholder"
                ],
            )
        )
        return gm.forward

    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    for t, dim in mark:
        torch._dynamo.mark_dynamic(t, dim)
    made, patch = count_property_sources()
    with patch:
        out = torch.compile(fn, backend=counter, dynamic=dynamic)(*args)
    return graphs, made, counter.frame_count, out


def f(x, y):
    return (x * 2 + y).sum(0), x.t() @ y


class LiftSymbolsStaticTests(torch._dynamo.test_case.TestCase):
    # Dynamo's default placeholder order: lifted symbols before the tensors that hold
    # them (the test case canonicalizes the order otherwise).
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._exit_stack.enter_context(torch._dynamo.config.patch(canonicalize_output_graph_node_order=False))

    def test_static_inputs_make_no_property_sources(self):
        x, y = torch.randn(4, 3), torch.randn(4, 3)
        fast = compile_once(f, (x, y))
        self.assertEqual(fast[0][0][1], ["FakeTensor", "FakeTensor"])
        # Without this patch: two sizes, two strides and the offset of each input (10).
        self.assertEqual(fast[1], [])
        self.assertEqual(fast[2], 1)
        self.assertEqual(fast[3], f(x, y))

    def test_dynamic_inputs_still_lift_their_symbols(self):
        x, y = torch.randn(4, 3), torch.randn(4, 3)
        fast = compile_once(f, (x, y), dynamic=True)
        code, placeholders = fast[0][0]
        self.assertEqual(placeholders, ["SymInt", "SymInt", "FakeTensor", "FakeTensor"])
        # Both inputs' sizes, strides and offsets are looked at, as without this patch.
        self.assertEqual({made[0] for made in fast[1]}, {"L['x']", "L['y']"})
        self.assertEqual(len(fast[1]), 10)
        self.assertEqual(fast[3], f(x, y))

        # The lifted symbols serve other sizes without a recompile.
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(f, backend=counter, dynamic=True)
        for n in (4, 6, 9):
            a, b = torch.randn(n, 3), torch.randn(n, 3)
            self.assertEqual(compiled(a, b), f(a, b))
        self.assertEqual(counter.frame_count, 1)

    def test_one_dynamic_input_among_static_ones(self):
        x, y = torch.randn(5, 3), torch.randn(3, 2)

        def g(x, y):
            return x @ y + 1

        fast = compile_once(g, (x, y), mark=[(x, 0)])
        self.assertEqual(fast[0][0][1], ["SymInt", "FakeTensor", "FakeTensor"])
        # With the patch only the marked input's properties are looked at (without it,
        # y's too).
        self.assertEqual({made[0] for made in fast[1]}, {"L['x']"})
        self.assertEqual(len(fast[1]), 5)
        self.assertEqual(fast[3], g(x, y))

    def test_wrapper_subclass_inner_symbols_lifted(self):
        def h(t):
            return t * 2

        a = TwoTensor(torch.randn(4, 3), torch.randn(4, 3))
        fast = compile_once(h, (a,), mark=[(a, 0)])
        self.assertEqual(fast[0][0][1], ["SymInt", "TwoTensor"])
        # The subclass and its inner tensors go through the loop, as without this patch.
        self.assertEqual({made[0] for made in fast[1]}, {"L['t']", "L['t'].a", "L['t'].b"})
        self.assertEqual(fast[3], h(a))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
