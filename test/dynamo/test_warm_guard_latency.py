# Owner(s): ["module: dynamo"]
"""The compile-time guard latency is timed with warm caches, not after a cache eviction."""

import unittest.mock

import torch
import torch._dynamo.guards
import torch._dynamo.test_case
import torch._dynamo.testing
import torch._dynamo.utils


def f(x, y):
    return torch.sin(x) + y * 2


def count_profile_calls():
    calls = []
    original = torch._dynamo.guards.profile_guard_manager

    def counting(root, scope, n_iters):
        calls.append(n_iters)
        return original(root, scope, n_iters)

    return calls, unittest.mock.patch.object(torch._dynamo.guards, "profile_guard_manager", counting)


class WarmGuardLatencyTests(torch._dynamo.test_case.TestCase):
    def compile_twice(self, warm):
        """Compile f for two input shapes; the profiling calls and the recorded latencies."""
        torch._dynamo.utils.clear_compilation_metrics()
        counter = torch._dynamo.testing.CompileCounter()
        calls, patch = count_profile_calls()
        with patch, torch._dynamo.config.patch(warm_cache_guard_latency=warm, log_compilation_metrics=True):
            compiled = torch.compile(f, backend=counter, dynamic=False)
            for shape in ((3,), (5,)):
                x, y = torch.randn(shape), torch.randn(shape)
                self.assertEqual(compiled(x, y), f(x, y))
                self.assertEqual(compiled(x, y), f(x, y))  # the guards pass on a cached call
        self.assertEqual(counter.frame_count, 2)
        metrics = torch._dynamo.utils.get_compilation_metrics()
        return calls, [m.guard_latency_us for m in metrics]

    def test_warm_check_no_cache_eviction(self):
        calls, latencies = self.compile_twice(warm=True)
        self.assertEqual(calls, [])
        # Still recorded for every compiled frame (whole microseconds).
        self.assertEqual(len(latencies), 2)
        for latency in latencies:
            self.assertIsNotNone(latency)
            self.assertGreaterEqual(latency, 0)

    def test_without_this_patch_profiled_after_eviction(self):
        calls, latencies = self.compile_twice(warm=False)
        self.assertEqual(calls, [1, 1])
        self.assertEqual(len(latencies), 2)
        self.assertTrue(all(latency is not None for latency in latencies))

    def test_failing_guards_still_caught(self):
        # The warm timing runs after the check that a frame's guards pass on the frame
        # that created them; a guard failing there still raises.
        import torch._dynamo.guards as guards

        def always_false(self, x):
            return False

        with (
            torch._dynamo.config.patch(warm_cache_guard_latency=True),
            unittest.mock.patch.object(guards.GuardManagerWrapper, "check", always_false),
            self.assertRaisesRegex(Exception, "Guard failed on the same frame it was created"),
        ):
            torch.compile(f, backend="eager", fullgraph=True)(torch.randn(3), torch.randn(3))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
