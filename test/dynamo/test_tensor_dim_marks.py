# Owner(s): ["module: dynamo"]
"""_automatic_dynamic reads a tensor's marks and source lists once per tensor, not per dimension."""

import contextlib
import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
import torch.compiler
from torch._dynamo.variables import builder


def f(x, y):
    return (x * 2).sum(0) + y.sum()


@contextlib.contextmanager
def count_per_dimension_lookups():
    """Calls of the per-dimension list matchers (is_dynamic_source / is_unbacked_source
    with a dimension, is_dynamic_value) and of normalize_source_name, made by
    _automatic_dynamic and the rest of VariableBuilder."""
    counts = {"list matches": 0, "normalize": 0}

    def counting(name, original, per_dimension):
        def wrapper(*args):
            if not per_dimension or len(args) > 1:
                counts[name] += 1
            return original(*args)

        return wrapper

    with (
        unittest.mock.patch.object(
            builder, "is_dynamic_source", counting("list matches", builder.is_dynamic_source, True)
        ),
        unittest.mock.patch.object(
            builder, "is_unbacked_source", counting("list matches", builder.is_unbacked_source, True)
        ),
        unittest.mock.patch.object(
            builder, "is_dynamic_value", counting("list matches", builder.is_dynamic_value, False)
        ),
        unittest.mock.patch.object(
            builder, "normalize_source_name", counting("normalize", builder.normalize_source_name, False)
        ),
    ):
        yield counts


def placeholder_sizes(gm):
    """Per placeholder tensor: a tuple with the size or 's' for each symbolic dimension."""
    sizes = []
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            sizes.append(tuple("s" if isinstance(s, torch.SymInt) else s for s in value.size()))
    return sizes


def recording_counter(graphs):
    """A CompileCounter whose backend appends each graph's placeholder sizes to graphs."""

    def backend(gm, example_inputs):
        graphs.append(placeholder_sizes(gm))
        return gm.forward

    return torch._dynamo.testing.CompileCounterWithBackend(backend)


class TensorDimMarksTests(torch._dynamo.test_case.TestCase):
    def compile(self, mark, **compiler_config):
        """Compile f on x (3, 4, 5) marked by mark and y (6,), call it again with x (3, 7, 5);
        frames, graphs' placeholder sizes, per-dimension lookups."""
        torch._dynamo.reset()
        graphs = []
        counter = recording_counter(graphs)
        with count_per_dimension_lookups() as counts, torch.compiler.config.patch(**compiler_config):
            compiled = torch.compile(f, backend=counter)
            for x_shape in ((3, 4, 5), (3, 7, 5)):
                # The second shape: what was marked dynamic does not recompile.
                x, y = torch.randn(x_shape), torch.randn(6)
                mark(x)
                self.assertEqual(compiled(x, y), f(x, y))
        return counter.frame_count, graphs, counts

    def test_no_per_dimension_lookups_with_empty_lists(self):
        frames, graphs, counts = self.compile(lambda x: None)
        # Static at first; the changed dim 1 recompiles as automatic dynamic.
        self.assertEqual(frames, 2)
        self.assertEqual(graphs, [[(3, 4, 5), (6,)], [(3, "s", 5), (6,)]])
        # Without this patch each of the 2 x 4 dimensions matched its name against the
        # (empty) lists four times and normalized the source's name.
        self.assertEqual(counts, {"list matches": 0, "normalize": 0})

    def test_mark_dynamic_one_dimension(self):
        frames, graphs, _ = self.compile(lambda x: torch._dynamo.mark_dynamic(x, 1))
        self.assertEqual(frames, 1)
        self.assertEqual(graphs, [[(3, "s", 5), (6,)]])

    def test_mark_static_wins_over_automatic_dynamic(self):
        # The second call recompiles; automatic dynamic makes dim 1 dynamic unless it is marked static.
        frames, graphs, _ = self.compile(lambda x: torch._dynamo.mark_static(x, 1))
        self.assertEqual(frames, 2)
        self.assertEqual(graphs[1][0], (3, 7, 5))

    def test_dynamic_sources_entry_for_one_dimension(self):
        frames, graphs, counts = self.compile(lambda x: None, dynamic_sources="L['x']:1")
        self.assertEqual(frames, 1)
        self.assertEqual(graphs, [[(3, "s", 5), (6,)]])
        # A listed entry can name one dimension: matched per dimension (x's 3, y's 1).
        self.assertEqual(counts["list matches"], 4)

    def test_unbacked_sources_entry(self):
        frames, graphs, _ = self.compile(lambda x: None, unbacked_sources="L['x']:1")
        self.assertEqual(frames, 1)
        self.assertEqual(graphs[0][0], (3, "s", 5))

    def test_dynamic_values_entry(self):
        frames, graphs, _ = self.compile(lambda x: None, dynamic_values="4,7")
        self.assertEqual(frames, 1)
        self.assertEqual(graphs[0][0], (3, "s", 5))

    def test_eager_then_compile_dynamism(self):
        torch._dynamo.reset()
        graphs = []
        counter = recording_counter(graphs)
        with count_per_dimension_lookups() as counts:
            compiled = torch.compile(f, backend=counter)
            with torch.compiler.set_stance("eager_then_compile"):
                for n in (3, 4, 5, 6):
                    x, y = torch.randn(n, 4, 5), torch.randn(6)
                    self.assertEqual(compiled(x, y), f(x, y))
        # Two examples ran eagerly, showed dim 0 of x changing: one graph, dim 0 symbolic.
        self.assertEqual(counter.frame_count, 1)
        self.assertEqual(graphs, [[("s", 4, 5), (6,)]])
        # The name is normalized once per tensor that has source dynamism (x and y),
        # not once per dimension.
        self.assertEqual(counts["normalize"], 2)

    def test_first_sight_of_an_input_copies_no_entry(self):
        # update_automatic_dynamic keeps a copy of a name's previous entry to log what
        # changed; a name seen for the first time has none. x and y are new on the
        # first compile; on the second, both entries are updated (x's dim 1 changes).
        from torch._dynamo import pgo

        torch._dynamo.reset()
        graphs = []
        counter = recording_counter(graphs)
        compiled = torch.compile(f, backend=counter)
        entry_copies = []
        real_copy = pgo.copy.copy

        def counting_copy(obj):
            if isinstance(obj, pgo.FrameStateSizeEntry):
                entry_copies.append(obj)
            return real_copy(obj)

        with unittest.mock.patch.object(pgo.copy, "copy", side_effect=counting_copy):
            per_compile = []
            for x_shape in ((3, 4, 5), (3, 7, 5)):
                x, y = torch.randn(x_shape), torch.randn(6)
                self.assertEqual(compiled(x, y), f(x, y))
                per_compile.append(len(entry_copies))
        self.assertEqual(counter.frame_count, 2)
        self.assertEqual(graphs, [[(3, 4, 5), (6,)], [(3, "s", 5), (6,)]])
        # Without this patch: 2 copies on the first compile as well.
        self.assertEqual(per_compile, [0, 2])

if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
