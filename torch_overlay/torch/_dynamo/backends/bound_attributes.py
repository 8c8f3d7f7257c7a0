"""The eager backend's callable, with the graph's tensor attributes bound as arguments.

Dynamo installs static tensors into the FX graph as attributes (``get_attr`` nodes):
an optimizer's parameters, state buffers and step tensors, and any tensor marked with
``mark_static_address(guard=True)``, non-inlined module parameters. The graph
module gets them as attributes at compile time and nothing sets them afterwards, so
the objects are fixed for the life of the compiled code (the optimizer's are also
identity-guarded: a replaced one recompiles). AOTAutograd backends lift them
once, at compile time, into the flat arguments of their compiled function; the eager
backend runs ``gm.forward`` itself, which reads every one of them as ``self.<name>``
on each call. On a GraphModule that load misses the instance dict and ends in
``nn.Module.__getattr__`` (a Python call and three dict lookups), about 1-2 us per
tensor: 2,000 loads per step for SGD with momentum over 1,000 parameters.

``bind_tensor_attributes`` does what AOTAutograd does: it turns each tensor
``get_attr`` into a leading placeholder of a copy of the graph
(``lift_tensor_attributes``) and returns the new module's forward with the tensors
bound (``bound_forward``: ``functools.partial``), so the call passes them as arguments.
The tensors are the module's own attribute values, which the module keeps alive
anyway; in-place changes to them are seen, as before. Graphs without tensor
attributes, or with a non-default codegen, are returned as ``gm.forward`` unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch.fx.graph_module import _get_attr


def lift_tensor_attributes(gm: torch.fx.GraphModule) -> tuple[torch.fx.Graph, list[torch.Tensor]] | None:
    """A copy of gm's graph in which each tensor attribute is a leading placeholder,
    and those tensors in placeholder order; None if gm has none to lift."""
    if type(gm.graph._codegen) is not torch.fx.graph.CodeGen:
        return None  # e.g. pytree codegen: its signature is not the placeholders'
    bound: list[tuple[torch.fx.Node, torch.Tensor]] = []
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value = _get_attr(gm, node.target)
        # Exact types: a subclass's attribute access may run code.
        if type(value) in (torch.Tensor, torch.nn.Parameter):
            bound.append((node, value))
    if not bound:
        return None
    graph = torch.fx.Graph()
    val_map: dict[torch.fx.Node, torch.fx.Node] = {}
    for node, _ in bound:
        placeholder = graph.placeholder(f"bound_{node.name}")
        placeholder.meta = dict(node.meta)
        val_map[node] = placeholder
    output = graph.graph_copy(gm.graph, val_map)
    graph.output(output)
    return graph, [value for _, value in bound]


def bound_forward(gm: torch.fx.GraphModule, graph: torch.fx.Graph, values: list[torch.Tensor]) -> Callable[..., Any]:
    """The forward of a module running ``graph`` (gm's attributes), ``values`` bound as its
    leading arguments."""
    module = torch.fx.GraphModule(gm, graph, gm.__class__.__name__)
    return functools.partial(module.forward, *values) if values else module.forward


def bind_tensor_attributes(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """gm.forward, or an equivalent callable with gm's tensor attributes bound."""
    lifted = lift_tensor_attributes(gm)
    return gm.forward if lifted is None else bound_forward(gm, *lifted)
