# Owner(s): ["module: dynamo"]
"""A Python number divided by a dynamic int or float that becomes 0: the compiled frame
raises ZeroDivisionError where Python does, and divides where Python divides."""

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounterWithBackend
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


def scale_or_fallback(x, n):
    try:
        return x * (3 / n)
    except ZeroDivisionError:
        return x - 1


def floor_and_mod(x, n):
    try:
        return x * (7 // n) + (7 % n)
    except ZeroDivisionError:
        return x - 1


class SymbolicZeroDivisorTests(torch._dynamo.test_case.TestCase):
    def check(self, fn, backend, values, frames):
        cnt = CompileCounterWithBackend(backend)
        compiled = torch.compile(fn, backend=cnt)
        for n in values:
            x = torch.ones(2)
            self.assertEqual(compiled(x, n), fn(x, n), atol=0, rtol=0)
        self.assertEqual(cnt.frame_count, frames)

    @parametrize("backend", ["eager", "aot_eager"])
    def test_int_divisor_becomes_zero(self, backend):
        # n is a dynamic SymInt from the second call on. Without this patch the call
        # with n = 0 raised ZeroDivisionError out of the compiled frame (eager backend:
        # the graph divides by the SymInt) or returned inf (inductor) instead of
        # taking the except branch. Guards: `n != 0` (2 graphs), then `n == 0` (1).
        self.check(scale_or_fallback, backend, (2, 3, 0, 5), 3)

    def test_int_divisor_becomes_zero_inductor(self):
        self.check(scale_or_fallback, "inductor", (2, 3, 0, 5), 3)

    def test_floordiv_and_mod(self):
        self.check(floor_and_mod, "eager", (2, 3, 0, 5), 3)

    def test_float_divisor_becomes_zero(self):
        self.check(scale_or_fallback, "eager", (2.0, 3.0, 0.0, 5.0), 3)


instantiate_parametrized_tests(SymbolicZeroDivisorTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
