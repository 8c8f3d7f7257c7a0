# Owner(s): ["module: dynamo"]
"""Tracing a tensor must not give it an instance __dict__ (torch/_dynamo/utils.py
_extract_tensor_dict): an empty dict on every graph input costs memory and one
more cache line for every guard check that looks for dimension markings."""

import gc

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounter


def has_instance_dict(t):
    # gc.get_referents reports the dict without creating it (t.__dict__ would).
    return any(type(r) is dict for r in gc.get_referents(t))


def add_one(xs):
    return torch._foreach_add(xs, 1)


class TensorInstanceDictTests(torch._dynamo.test_case.TestCase):
    def test_traced_inputs_get_no_instance_dict(self):
        xs = [torch.randn(4) for _ in range(10)] + [torch.nn.Parameter(torch.randn(4))]
        self.assertFalse(any(has_instance_dict(x) for x in xs[:10]))
        cnt = CompileCounter()
        out = torch.compile(add_one, backend=cnt)(xs)
        self.assertEqual(out, add_one(xs))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual([has_instance_dict(x) for x in xs[:10]], [False] * 10)

    def test_tensor_attributes_still_reach_the_graph(self):
        x = torch.randn(4)
        x.tag = "activation"
        metas = []

        def backend(gm, example_inputs):
            metas.extend(
                n.meta.get("tensor_dict") for n in gm.graph.nodes if n.op == "placeholder"
            )
            return gm

        torch.compile(lambda x: x + 1, backend=backend)(x)
        self.assertEqual(metas, [{"tag": "activation"}])

    def test_marking_after_compile_still_recompiles(self):
        # The dimension-marking guards (Dynamo's and native) must see an instance dict
        # created after the compile.
        for native in (False, True):
            torch._dynamo.reset()
            with torch._dynamo.config.patch(tensor_container_guards=native):
                xs = [torch.randn(4) for _ in range(10)]
                cnt = CompileCounter()
                compiled = torch.compile(add_one, backend=cnt)
                compiled(xs)
                compiled(xs)
                self.assertEqual(cnt.frame_count, 1)
                torch._dynamo.mark_dynamic(xs[7], 0)
                self.assertEqual(compiled(xs), add_one(xs))
                self.assertEqual(cnt.frame_count, 2)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
