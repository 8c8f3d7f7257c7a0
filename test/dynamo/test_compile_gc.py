# Owner(s): ["module: dynamo"]
"""While Dynamo compiles a frame, the cyclic collector's generation-2 threshold is
raised to at least 1,000 (convert_frame._deferred_full_collections), and restored
when the outermost compile ends, also when it fails; generations 0 and 1 keep
collecting."""

import gc
from unittest import mock

import torch
import torch._dynamo.convert_frame
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounterWithBackend


def many_ops(x):
    for i in range(60):
        x = x * 1.01 + i
    return x


def with_graph_break(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y.cos()


class CompileGCTests(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.saved_threshold = gc.get_threshold()

    def tearDown(self):
        gc.set_threshold(*self.saved_threshold)
        super().tearDown()

    def compile_recording_thresholds(self, fn, *args):
        """Compile fn; return its result and the thresholds its backend saw."""
        seen = []

        def backend(gm, example_inputs):
            seen.append(gc.get_threshold())
            return gm.forward

        torch._dynamo.reset()
        result = torch.compile(fn, backend=backend)(*args)
        return result, seen

    def test_raised_while_compiling_and_restored(self):
        gc.set_threshold(700, 10, 10)
        x = torch.randn(3)
        result, seen = self.compile_recording_thresholds(with_graph_break, x)
        self.assertEqual(result, with_graph_break(x))
        self.assertEqual(seen, [(700, 10, 1000)] * 2)  # the frame and its resume function
        self.assertEqual(gc.get_threshold(), (700, 10, 10))

    def test_never_lowered(self):
        gc.set_threshold(700, 10, 5000)
        _, seen = self.compile_recording_thresholds(many_ops, torch.randn(3))
        self.assertEqual(seen, [(700, 10, 5000)])
        self.assertEqual(gc.get_threshold(), (700, 10, 5000))

    def test_restored_when_the_compile_fails(self):
        gc.set_threshold(700, 10, 10)

        def failing_backend(gm, example_inputs):
            raise RuntimeError("backend failed")

        torch._dynamo.reset()
        with self.assertRaisesRegex(Exception, "backend failed"):
            torch.compile(many_ops, backend=failing_backend)(torch.randn(3))
        self.assertEqual(gc.get_threshold(), (700, 10, 10))

    def test_threshold_set_during_the_compile_is_kept(self):
        gc.set_threshold(700, 10, 10)

        def backend(gm, example_inputs):
            gc.set_threshold(500, 5, 50)  # someone else's choice
            return gm.forward

        torch._dynamo.reset()
        torch.compile(many_ops, backend=backend)(torch.randn(3))
        self.assertEqual(gc.get_threshold(), (500, 5, 50))

    def test_no_full_collection_while_compiling(self):
        collections = {0: 0, 1: 0, 2: 0}

        def count(phase, info):
            # Only those while a frame compiles: the next full collection is due
            # right after the compile, when the threshold is back.
            if phase == "start" and torch._guards.CompileContext.current_compile_id() is not None:
                collections[info["generation"]] += 1

        x = torch.randn(3)
        # A threshold of 0 keeps CPython's (as without this patch): the control that
        # shows this setup sees full collections during a compile.
        for threshold, full in ((0, True), (10**6, False)):
            # CPython starts a full collection only when a quarter as many objects as
            # survived the last one are new: with the heap frozen and collected (none
            # survive in generation 2), only the threshold decides.
            gc.collect()
            gc.freeze()
            gc.collect()
            gc.set_threshold(10, 2, 2)  # full collections every 40 allocations without
            for generation in collections:
                collections[generation] = 0
            gc.callbacks.append(count)
            try:
                counter = CompileCounterWithBackend("eager")
                torch._dynamo.reset()
                with mock.patch.object(
                    torch._dynamo.convert_frame, "_COMPILE_GC_GEN2_THRESHOLD", threshold
                ):
                    self.assertEqual(torch.compile(many_ops, backend=counter)(x), many_ops(x))
            finally:
                gc.callbacks.remove(count)
                gc.set_threshold(*self.saved_threshold)
                gc.unfreeze()
            self.assertEqual(counter.frame_count, 1)
            self.assertGreater(collections[0], 0)
            self.assertGreater(collections[1], 0)  # the younger generations keep collecting
            self.assertEqual(collections[2] > 0, full, f"{threshold} {collections}")

if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
