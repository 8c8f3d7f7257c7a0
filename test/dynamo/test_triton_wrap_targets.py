# Owner(s): ["module: dynamo"]
"""VariableBuilder looks up the triton objects it recognises once per process."""

import builtins
import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.variables.builder import VariableBuilder
from torch.utils._triton import has_triton

_triton_wrap_targets = VariableBuilder._triton_wrap_targets


def step(tensors, scale):
    return [t * scale for t in tensors]


def count_classes_built_while_wrapping():
    """Names of the classes defined by class statements in VariableBuilder._wrap or in
    the lookup of triton objects (not by the modules a wrap may import on the way)."""
    built = []
    original_build_class = builtins.__build_class__
    class_bodies = {
        *VariableBuilder._wrap.__code__.co_consts,
        *_triton_wrap_targets.__wrapped__.__code__.co_consts,
    }

    def build_class(func, name, *args, **kwargs):
        if func.__code__ in class_bodies:
            built.append(name)
        return original_build_class(func, name, *args, **kwargs)

    return built, unittest.mock.patch.object(builtins, "__build_class__", build_class)


class TritonWrapTargetsTests(torch._dynamo.test_case.TestCase):
    def compile_step(self):
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounter()
        tensors = [torch.randn(3) for _ in range(50)]
        built, patches = count_classes_built_while_wrapping()
        with patches:
            actual = torch.compile(step, backend=counter)(tensors, 2.0)
        self.assertEqual(actual, step(tensors, 2.0))
        self.assertEqual(counter.frame_count, 1)
        return built

    def test_no_classes_defined_per_wrapped_value(self):
        _triton_wrap_targets()  # looked up before: the process's first wrap pays it once
        built = self.compile_step()
        self.assertEqual(built, [])

    def test_stand_ins_match_no_user_value(self):
        # Without triton the stand-ins are private classes and functions: user objects
        # of the same names are wrapped like any other object or function.
        class JITFunction:
            def __init__(self, scale):
                self.scale = scale

        def set_allocator(x):
            return x + 1

        def f(x, obj):
            return set_allocator(x) * obj.scale

        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounter()
        x = torch.randn(4)
        self.assertEqual(torch.compile(f, backend=counter)(x, JITFunction(3.0)), f(x, JITFunction(3.0)))
        self.assertEqual(counter.frame_count, 1)
        self.assertEqual(counter.op_count, 2)

    def test_same_objects_every_call(self):
        self.assertIs(_triton_wrap_targets(), _triton_wrap_targets())
        fresh = _triton_wrap_targets.__wrapped__()
        if not has_triton():
            # Stand-ins: new ones per uncached call, so nothing outside can hold them.
            self.assertIsNot(fresh[0], _triton_wrap_targets()[0])


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
