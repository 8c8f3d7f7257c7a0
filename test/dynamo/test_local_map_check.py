# Owner(s): ["module: dynamo"]
"""Wrapping a callable does not import torch.distributed.tensor to ask whether it is
local_map's wrapper while local_map wrapping is not enabled. The compile runs in a
fresh interpreter, since whether a module is imported is per process."""

import json
import subprocess
import sys
import textwrap

import torch
import torch._dynamo.test_case
from torch._dynamo.variables.higher_order_ops import LocalMapWrappedHigherOrderVariable

FUNC_MAP_MODULE = "torch.distributed.tensor.experimental._func_map"

# Compiles a function that calls a global helper and a torch.optim step (both wrap
# callables with VariableBuilder), compares them with eager, and prints whether the
# local_map module was imported before and after, and the frames compiled.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    imported_before = "{module}" in sys.modules

    def helper(x):
        return x.sin() * 2

    def fn(x, fns):
        return helper(x) + fns[0](x)

    counter = CompileCounter()
    x = torch.randn(4)
    same = torch.equal(torch.compile(fn, backend=counter)(x, [torch.cos]), fn(x, [torch.cos]))
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3)) for _ in range(3)]
    ref = [p.detach().clone().requires_grad_() for p in params]
    opt, ref_opt = torch.optim.SGD(params, lr=0.1), torch.optim.SGD(ref, lr=0.1)
    for p, r in zip(params, ref):
        p.grad = torch.ones(3)
        r.grad = torch.ones(3)
    torch.compile(opt.step, backend=counter)()
    ref_opt.step()
    same = same and all(torch.equal(p, r) for p, r in zip(params, ref))
    print(json.dumps({{
        "imported_before": imported_before,
        "imported_after": "{module}" in sys.modules,
        "frames": counter.frame_count,
        "same": same,
    }}))
    """
).format(module=FUNC_MAP_MODULE)


def run():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


class LocalMapCheckTests(torch._dynamo.test_case.TestCase):
    def test_compile_does_not_import_local_map(self):
        result = run()
        self.assertFalse(result["imported_before"])
        self.assertFalse(result["imported_after"])
        self.assertTrue(result["same"])
        self.assertEqual(result["frames"], 2)

    def test_enabled_wrapping_still_recognises_the_wrapper(self):
        if not torch.distributed.is_available():
            self.skipTest("torch.distributed is not available")
        from torch.distributed.tensor.experimental._func_map import _local_map_wrapped

        self.assertFalse(LocalMapWrappedHigherOrderVariable.should_wrap_in_hop(_local_map_wrapped))
        with LocalMapWrappedHigherOrderVariable.enable():
            self.assertTrue(LocalMapWrappedHigherOrderVariable.should_wrap_in_hop(_local_map_wrapped))
            self.assertFalse(LocalMapWrappedHigherOrderVariable.should_wrap_in_hop(torch.sin))
        self.assertFalse(LocalMapWrappedHigherOrderVariable.should_wrap_in_hop(_local_map_wrapped))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
