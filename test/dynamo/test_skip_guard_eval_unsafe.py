# Owner(s): ["module: dynamo"]
"""skip_guard_eval_unsafe on frames whose guards have no diff sources."""

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.testing import CompileCounter


class ParamsOnly(torch.nn.Module):
    """A frame whose only tensors are parameters: none of them is a diff source."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(4))
        self.b = torch.nn.Parameter(torch.randn(4))

    def forward(self, scale):
        return (self.a * self.b).sum() * scale


class SkipGuardEvalUnsafeTests(torch._dynamo.test_case.TestCase):
    def test_frame_with_only_parameters_runs_without_guards(self):
        m = ParamsOnly()
        cnt = CompileCounter()
        compiled = torch.compile(m, backend=cnt)
        expected = m(2.0)
        self.assertEqual(compiled(2.0), expected)
        entries = _debug_get_cache_entry_list(ParamsOnly.forward)
        self.assertIsNotNone(entries[0].guard_manager.diff_guard_root)

        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            for _ in range(3):
                self.assertEqual(compiled(2.0), expected)
        self.assertEqual(cnt.frame_count, 1)

    def test_root_guards_are_kept(self):
        # The diff root of such a frame still checks the root's own guards, here
        # the grad mode in the global state: the graph compiled with grad enabled
        # is not silently reused under no_grad.
        m = ParamsOnly()
        compiled = torch.compile(m, backend=CompileCounter())
        compiled(2.0)
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True), torch.no_grad():
            with self.assertRaisesRegex(RuntimeError, "Recompilation triggered"):
                compiled(2.0)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
