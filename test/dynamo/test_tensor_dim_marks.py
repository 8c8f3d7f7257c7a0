# Owner(s): ["module: dynamo"]
"""_automatic_dynamic reads a tensor's marks and source lists once per tensor, not per dimension."""

import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
import torch.compiler
from torch._dynamo import tensor_dim_marks
from torch._dynamo.tensor_dim_marks import TensorDimMarks


def f(x, y):
    return (x * 2).sum(0) + y.sum()


def count_reads():
    calls = []
    original = TensorDimMarks.read.__func__

    def counting(cls, e, source):
        calls.append(e.dim())
        return original(cls, e, source)

    return calls, unittest.mock.patch.object(TensorDimMarks, "read", classmethod(counting))


def placeholder_sizes(gm):
    """Per placeholder tensor: a tuple with the size or 's' for each symbolic dimension."""
    sizes = []
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            sizes.append(tuple("s" if isinstance(s, torch.SymInt) else s for s in value.size()))
    return sizes


class TensorDimMarksTests(torch._dynamo.test_case.TestCase):
    def compile(self, once, mark, calls_with=((3, 4, 5), (6,)), **compiler_config):
        """Compile f on x, y (x marked by mark), call it on each shape pair; frames, sizes, reads."""
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(placeholder_sizes(gm))
            return gm.forward

        counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
        calls, patch = count_reads()
        with (
            patch,
            torch._dynamo.config.patch(automatic_dynamic_marks_once=once),
            torch.compiler.config.patch(**compiler_config),
        ):
            compiled = torch.compile(f, backend=counter)
            for x_shape in calls_with[:1]:
                x, y = torch.randn(x_shape), torch.randn(calls_with[1])
                mark(x)
                self.assertEqual(compiled(x, y), f(x, y))
            # A second shape: what was marked dynamic does not recompile.
            x, y = torch.randn(3, 7, 5), torch.randn(6)
            mark(x)
            self.assertEqual(compiled(x, y), f(x, y))
        return counter.frame_count, graphs, calls

    def assert_same_on_and_off(self, mark, **compiler_config):
        torch._dynamo.reset()
        on = self.compile(True, mark, **compiler_config)
        torch._dynamo.reset()
        off = self.compile(False, mark, **compiler_config)
        self.assertEqual(on[:2], off[:2])
        return on, off

    def test_read_once_per_tensor(self):
        (frames, graphs, calls), (_, _, calls_off) = self.assert_same_on_and_off(lambda x: None)
        # Static by default: one graph per x shape, sizes specialized.
        self.assertEqual(frames, 2)
        self.assertEqual(graphs[0], [(3, 4, 5), (6,)])
        # One read per wrapped tensor; without this patch one per dimension.
        self.assertEqual(calls[:2], [3, 1])
        self.assertEqual(calls_off[:4], [3, 3, 3, 1])

    def test_mark_dynamic_one_dimension(self):
        (frames, graphs, _), _ = self.assert_same_on_and_off(lambda x: torch._dynamo.mark_dynamic(x, 1))
        self.assertEqual(frames, 1)
        self.assertEqual(graphs[0][0], (3, "s", 5))

    def test_mark_static_wins_over_automatic_dynamic(self):
        # The second call recompiles; automatic dynamic makes dim 1 dynamic unless it is marked static.
        (frames, graphs, _), _ = self.assert_same_on_and_off(lambda x: torch._dynamo.mark_static(x, 1))
        self.assertEqual(frames, 2)
        self.assertEqual(graphs[1][0], (3, 7, 5))

    def test_dynamic_sources_entry_for_one_dimension(self):
        (frames, graphs, _), _ = self.assert_same_on_and_off(lambda x: None, dynamic_sources="L['x']:1")
        self.assertEqual(frames, 1)
        self.assertEqual(graphs[0][0], (3, "s", 5))

    def test_unbacked_sources_entry(self):
        (frames, graphs, _), _ = self.assert_same_on_and_off(lambda x: None, unbacked_sources="L['x']:1")
        self.assertEqual(frames, 1)
        self.assertEqual(graphs[0][0], (3, "s", 5))

    def test_dynamic_values_entry(self):
        (frames, graphs, _), _ = self.assert_same_on_and_off(lambda x: None, dynamic_values="4,7")
        self.assertEqual(frames, 1)
        self.assertEqual(graphs[0][0], (3, "s", 5))

    def test_source_name_normalized_only_for_source_dynamism(self):
        # The normalized name is only looked up in a LocalSource's dynamism (set by the
        # eager_then_compile stance); without it, no regex substitution per tensor.
        with unittest.mock.patch.object(
            tensor_dim_marks, "normalize_source_name", wraps=tensor_dim_marks.normalize_source_name
        ) as normalize:
            self.assert_same_on_and_off(lambda x: None)
        self.assertEqual(normalize.call_count, 0)

    def test_eager_then_compile_dynamism(self):
        def run(once):
            torch._dynamo.reset()
            graphs = []

            def backend(gm, example_inputs):
                graphs.append(placeholder_sizes(gm))
                return gm.forward

            counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
            with (
                torch._dynamo.config.patch(automatic_dynamic_marks_once=once),
                unittest.mock.patch.object(
                    tensor_dim_marks, "normalize_source_name", wraps=tensor_dim_marks.normalize_source_name
                ) as normalize,
            ):
                compiled = torch.compile(f, backend=counter)
                with torch.compiler.set_stance("eager_then_compile"):
                    for n in (3, 4, 5, 6):
                        x, y = torch.randn(n, 4, 5), torch.randn(6)
                        self.assertEqual(compiled(x, y), f(x, y))
            return counter.frame_count, graphs, normalize.call_count

        on, off = run(True), run(False)
        self.assertEqual(on[:2], off[:2])
        # Two examples ran eagerly, showed dim 0 of x changing: one graph, dim 0 symbolic.
        self.assertEqual(on[0], 1)
        self.assertEqual(on[1][0][0], ("s", 4, 5))
        # Normalized once per tensor that has source dynamism (x and y).
        self.assertEqual(on[2], 2)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
