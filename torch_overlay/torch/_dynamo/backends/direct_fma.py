"""The eager backend runs ``inductor_prims.fma`` nodes as the prim's own computation.

With ``config.enable_dynamo_decompositions`` (the default) Dynamo traces
``Tensor.addcmul_(t1, t2, value=v)``, ``Tensor.addcdiv_(t1, t2, value=v)`` and
``Tensor.add_(other, alpha=tensor)`` as ``inductor_prims.fma(x, v, self)`` (and a
``copy_``), so that Inductor rounds them as the eager kernels do. Inductor lowers the
prim; the eager backend calls it as an operator on every run, and a call of this prim
goes through the custom-op machinery: the autograd wrapper, a redispatch, the
backend kernel, a disable-Dynamo wrapper, then the prim's meta check (for these prims,
the computation itself) and the computation again. That is about 24 us for a 4x4
float tensor where its computation, ``(a * b) + c``, takes 4 us; torch.optim's
``AdamW(foreach=False)`` under compile runs one per parameter per step.

``call_fma_directly`` retargets such nodes, in a graph the caller owns, to
``fma_reference``: the prim's ``impl_aten``, called directly, so the values are
the ones the prim computes (the test compares them bit for bit). Only nodes on plain
tensors whose output needs no grad are retargeted: the prim has its own backward
formula, and a node that records autograd history keeps it; a tensor subclass would
see a mul and an add instead of one op. An optimizer step runs under no_grad,
so all of its fma nodes qualify.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor


def fma_reference(a: Any, b: Any, c: Any) -> Any:
    """``inductor_prims.fma(a, b, c)``'s value, computed as the prim computes it."""
    # Only graphs that hold the prim call this, so its module is loaded.
    return sys.modules["torch._inductor.inductor_prims"].fma.impl_aten(a, b, c)


def _plain_without_grad(node: torch.fx.Node) -> bool:
    """Whether the node's output and tensor arguments are plain (fake) tensors and its
    output records no autograd history."""
    value = node.meta.get("example_value")
    if type(value) is not FakeTensor or value.requires_grad:
        return False
    # A tensor subclass would see two ops (mul, add) instead of the prim.
    return all(type(arg.meta.get("example_value")) is FakeTensor for arg in node.all_input_nodes)


def fma_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The fma calls of ``graph`` that ``call_fma_directly`` retargets."""
    # A graph holds the prim only if Dynamo imported it to trace it: a graph traced
    # without it does not pay for importing Inductor here.
    inductor_prims = sys.modules.get("torch._inductor.inductor_prims")
    if inductor_prims is None:
        return []
    return [
        node
        for node in graph.nodes
        if node.op == "call_function" and node.target is inductor_prims.fma and _plain_without_grad(node)
    ]


def call_fma_directly(graph: torch.fx.Graph) -> int:
    """Retarget ``graph``'s qualifying fma calls to ``fma_reference``, in place; how many."""
    nodes = fma_nodes(graph)
    for node in nodes:
        node.target = fma_reference
    return len(nodes)
