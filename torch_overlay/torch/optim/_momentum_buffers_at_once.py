"""SGD's first momentum buffers as one foreach clone of the grads, when compiling.

_multi_tensor_sgd creates a group's missing momentum buffers in a Python loop, one
``grad.detach().clone()`` per parameter. Under torch.compile, Dynamo traces that loop
element by element: two tensor ops, two list stores and the loop's own bytecode per
parameter, the largest share of a compiled SGD(momentum) first step over many
parameters. When every buffer of the group is missing (the first step) and nothing
records autograd history, one ``torch._foreach_clone`` of the grads makes the same
buffers: the same values and strides, no autograd history, a new tensor each.
"""

import torch
from torch import Tensor


def clones_momentum_buffers_at_once(
    momentum_buffers: list[Tensor | None], has_sparse_grad: bool
) -> bool:
    """Whether _multi_tensor_sgd creates the group's momentum buffers with one
    ``torch._foreach_clone``: only while compiling, when every buffer of the group is
    missing, no grad is sparse, and grad mode is off (with it on, a clone of a grad
    that has history would keep it, where ``detach().clone()`` drops it)."""
    return (
        torch.compiler.is_compiling()
        and torch._dynamo.config.optim_clones_momentum_buffers_at_once
        and not has_sparse_grad
        and not torch.is_grad_enabled()
        and momentum_buffers.count(None) == len(momentum_buffers)
    )
