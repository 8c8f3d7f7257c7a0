# Owner(s): ["module: dynamo"]
"""A float that AOTAutograd's _tensorify_python_scalars takes as a tensor for one use
(``x * s``) and specializes for another (``x.clamp(min=1 - s)``): the compiled code
must never return a result computed with an old value of the float. The float is a
frame argument, which automatic dynamic makes a SymFloat once it changes."""

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounterWithBackend


def clamp_by_complement(x, s):
    return x * s, x.clamp(min=1 - s)


def clamp_by_polynomial(x, s):
    # sympy prints the pinned expression as `0.125 + 2.25*s`, which rounds otherwise
    # than the frame's `(s * 1.5 + 0.05) * 1.5 + 0.05` for s = 0.1.
    return x * s, x.clamp(min=(s * 1.5 + 0.05) * 1.5 + 0.05)


class PartiallyTensorifiedFloatTests(torch._dynamo.test_case.TestCase):
    def check(self, fn, backend, values, frames):
        # The SymFloat path: patch scalar-state, later in the series, traces a float
        # argument the pass would pin as a float64 tensor input instead (its own tests).
        scalar_state_off = {"scalar_state": False} if hasattr(torch._dynamo.config, "scalar_state") else {}
        cnt = CompileCounterWithBackend(backend)
        compiled = torch.compile(fn, backend=cnt)
        with torch._dynamo.config.patch(**scalar_state_off):
            for s in values:
                x = torch.linspace(-1, 1, 5)
                self.assertEqual(compiled(x, s), fn(x, s), atol=0, rtol=0)
        self.assertEqual(cnt.frame_count, frames)

    def test_not_stale_from_the_aot_autograd_cache(self):
        # Without this patch on torch 2.13 the clamp's bound was baked into the code the
        # AOTAutograd cache saves under the key of the graph before the pass: 0.125 and
        # 0.3 got the clamp of 0.25 (5 frames). torch 2.15.0 keeps the bound symbolic:
        # 2 frames and no stale result, with or without this patch (measured).
        self.check(clamp_by_complement, "inductor", (0.5, 0.25, 0.125, 0.3), 2)

    def test_pinned_expression_holds_on_its_own_frame(self):
        # Without this patch the third call fails to compile: "Guard failed on the same
        # frame it was created" for `(0.125 + 2.25*s) == 0.35000000000000003`.
        self.check(clamp_by_polynomial, "aot_eager", (0.5, 0.3, 0.1, 0.7), 5)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
