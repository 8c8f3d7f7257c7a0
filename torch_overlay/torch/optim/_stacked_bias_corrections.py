"""Adam's capturable bias corrections on one stacked vector of CPU steps, when compiling.

Under torch.compile, Dynamo traces torch.optim's capturable formulation on every device
(OptimizerVariable sets ``capturable`` for the trace), so the bias corrections of a
group are foreach ops over its N ``step`` tensors. When those are 0-d CPU tensors (a
CPU model, or state created outside the compiled step), CPU foreach ops take the
per-tensor slow path: each of the eight ops is N kernel calls, where eager does the
same arithmetic on Python floats. Stacking the steps once makes it eight kernel calls
on one N-vector; the per-parameter values handed on are views of that vector.

The arithmetic is the same sequence of elementwise ops in the steps' dtype. ``sub``,
``div``, ``reciprocal`` and ``sqrt`` round the same on a vector as per element;
``pow`` on a vector may take the vectorized (SIMD) kernel, which can differ from the
per-element kernel in the last bit of a bias correction.
"""

import torch
from torch import Tensor


def stacks_bias_corrections(steps: list[Tensor]) -> bool:
    """Whether the capturable bias corrections of ``steps`` run on one stacked vector:
    only while compiling (eager capturable steps live on an accelerator, and eager
    non-capturable code uses Python floats) and only for 0-d CPU steps, which the
    foreach slow path would take one by one and ``torch.stack`` can stack."""
    return (
        torch.compiler.is_compiling()
        and torch._dynamo.config.optim_stacks_cpu_bias_corrections
        and all(step.is_cpu and step.dim() == 0 for step in steps)
    )


def adam_bias_corrections(
    steps: list[Tensor],
    beta1: float | Tensor,
    beta2: float | Tensor,
    lr: float | Tensor,
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Return (step_size, bias_correction2_sqrt), one 0-d view per step, where
    step_size = -lr / (1 - beta1 ** step) and bias_correction2_sqrt =
    sqrt(1 - beta2 ** step): the values _multi_tensor_adam's capturable branch builds
    with foreach ops, computed by the same operations in the same order."""
    stacked = torch.stack(steps)
    step_size = torch.pow(beta1, stacked).sub_(1).div_(lr).reciprocal_()
    bias_correction2_sqrt = torch.pow(beta2, stacked).sub_(1).neg_().sqrt_()
    return step_size.unbind(), bias_correction2_sqrt.unbind()
