# Owner(s): ["module: dynamo"]
"""Tracing a torch.optim step over CPU tensors does not import
torch._inductor.cudagraph_trees: only a CUDA grad is looked up in the CUDA graph tree manager. Each case runs in a fresh
interpreter, since whether a module is imported is per process."""

import json
import subprocess
import sys
import textwrap

import torch
import torch._dynamo.test_case
from torch._dynamo.variables.optimizer import _is_static_for_cudagraphs

MANAGER_MODULE = "torch._inductor.cudagraph_trees"

# Compiles three steps of an optimizer and the same steps in eager on a copy; prints
# whether the manager's module was imported before and after, the frames compiled,
# and whether parameters and optimizer state matched eager after every step.
STEP_SCRIPT = textwrap.dedent(
    """
    import copy, json, sys
    import torch
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    opt_name, foreach = sys.argv[1], sys.argv[2] == "1"
    imported_before = "{module}" in sys.modules
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 3)) for _ in range(4)]
    ref_params = copy.deepcopy(params)
    kwargs = dict(lr=0.1, foreach=foreach)
    if opt_name == "SGD":
        kwargs["momentum"] = 0.9
    opt = getattr(torch.optim, opt_name)(params, **kwargs)
    ref_opt = getattr(torch.optim, opt_name)(ref_params, **kwargs)
    counter = CompileCounter()
    step = torch.compile(opt.step, backend=counter)
    matches = []
    for i in range(3):
        for p, r in zip(params, ref_params):
            p.grad = torch.full_like(p, 0.5 + i)
            r.grad = torch.full_like(r, 0.5 + i)
        step()
        ref_opt.step()
        same = all(torch.allclose(p, r, rtol=1.3e-6, atol=1e-5) for p, r in zip(params, ref_params))
        for p, r in zip(params, ref_params):
            state, ref_state = opt.state[p], ref_opt.state[r]
            same = same and state.keys() == ref_state.keys()
            same = same and all(torch.allclose(state[k], ref_state[k], rtol=1.3e-6, atol=1e-5) for k in state)
        matches.append(same)
    print(json.dumps({{
        "imported_before": imported_before,
        "imported_after": "{module}" in sys.modules,
        "frames": counter.frame_count,
        "matches": matches,
    }}))
    """
).format(module=MANAGER_MODULE)


def run_step(opt_name: str, foreach: bool) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", STEP_SCRIPT, opt_name, "1" if foreach else "0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise AssertionError(f"step script failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class CudagraphManagerCudaOnlyTests(torch._dynamo.test_case.TestCase):
    def check_optimizer(self, opt_name: str, foreach: bool, frames: int):
        result = run_step(opt_name, foreach)
        # Without this patch the first CPU grad imports the manager's module.
        self.assertEqual(
            result,
            {
                "imported_before": False,
                "imported_after": False,
                "frames": frames,
                "matches": [True, True, True],
            },
        )

    def test_sgd_foreach(self):
        self.check_optimizer("SGD", foreach=True, frames=2)  # the first step makes the buffers

    def test_adam_foreach(self):
        self.check_optimizer("Adam", foreach=True, frames=1)

    def test_adamw_for_loop(self):
        self.check_optimizer("AdamW", foreach=False, frames=1)

    def test_cpu_tensor_is_static(self):
        # CPU tensors are never copied into a CUDA graph: static, as without this patch.
        self.assertTrue(_is_static_for_cudagraphs(torch.ones(2)))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
