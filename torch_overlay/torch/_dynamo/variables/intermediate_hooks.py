"""
Hooks registered on intermediate tensors, with handles that work.

Dynamo keeps a ``register_hook`` handle only when the hooked tensor has a source:
the registration is replayed by residual bytecode (see [On tensor.register_hook]
in side_effects.py) and the handle is the value that call returns. A hook on an
intermediate is traced into the graph instead (``register_hook_op``, or the
compiled-autograd trampoline), with no runtime handle: returning the handle,
storing it or keeping it across a graph break made the whole frame run eagerly,
and ``remove()`` on it crashed.

Here a hook on an intermediate is first registered like one on an input: by
residual bytecode on the tensor, which becomes a graph output, and the handle is
the real one (``remove()`` in the frame cancels it). That is exact when the
tensor has no use in the graph (it is returned, or dead): its gradient can only
reach it from outside the graph, through the graph output the hook is on. If the
tensor is used in the graph (or is a view, whose history an in-place op on its
base could rebase), the hook must see the in-graph gradient, so the trace
restarts, once for all such registrations, with a decision for each (by ordinal
in the trace, kept in the SpeculationLog):

- TRACE: as without hook residuals, the hook is traced into the graph. Its handle
  is a ``TracedHookHandleVariable``, which has no runtime value:
- GRAPH_BREAK: if that handle escapes the frame or is removed, the trace restarts
  again and breaks the graph at the ``register_hook`` call: it runs eagerly on the
  real tensor and returns a real handle, and later uses of the tensor are traced
  in the resume function, where it is an input.
"""

from typing import Any, TYPE_CHECKING

import torch

from .. import graph_break_hints
from ..exc import RestartAnalysis, unimplemented
from .base import ValueMutationNew, VariableTracker
from .user_defined import RemovableHandleVariable

if TYPE_CHECKING:
    from ..codegen import PyCodegen
    from ..symbolic_convert import InstructionTranslatorBase


# node.meta key of register_hook_op / trampoline nodes: not uses of the tensor.
HOOK_REGISTRATION = "tensor_hook_registration"
TRACE = "trace"
GRAPH_BREAK = "graph_break"


def refuse_in_subgraph(context: str) -> None:
    unimplemented(
        gb_type="Tensor hook handle in a higher-order op body",
        context=context,
        explanation="Dynamo registers and removes tensor hooks with residual "
        "bytecode after the graph, which a higher-order op body (traced into a "
        "subgraph) cannot do.",
        hints=[*graph_break_hints.SUPPORTABLE],
    )


def next_hook_decision(
    tx: "InstructionTranslatorBase",
) -> tuple[int | None, str | None]:
    """(ordinal, decision) of a register_hook on an intermediate; ordinal None
    means tracing the hook as without hook residuals (inside a subgraph there is no graph output to use)."""
    if tx.output.current_tracer.parent is not None:
        return None, TRACE
    log = tx.speculation_log
    ordinal = log.traced_hook_count
    log.traced_hook_count += 1
    return ordinal, log.traced_hook_decisions.get(ordinal)


def refuse_traced_hook(name: str) -> None:
    unimplemented(
        gb_type="Tensor hook on an intermediate used in the graph, with a handle that escapes",
        context=f"Tensor.{name}",
        explanation="The hook's handle is returned, stored, removed or kept across "
        "a graph break, so the hook must be registered on the real tensor; the "
        "tensor is also used inside the graph, where a hook on the graph output "
        "would not see its gradient. The registration runs eagerly at a graph break.",
        hints=[
            "Register the hook after the last use of the tensor in the function, "
            "or do not keep the handle.",
        ],
    )


def restart_with_decisions(
    tx: Any, ordinals: list[int], decision: str, why: str
) -> None:
    log = tx.speculation_log
    for ordinal in ordinals:
        log.traced_hook_decisions[ordinal] = decision
    # The new decision changes which instructions are traced (the hook body), so
    # the recorded speculation entries would not match: rediscover them.
    log.clear()
    raise RestartAnalysis(restart_reason=f"tensor hook on an intermediate: {why}")


def used_in_graph(tensor_node: torch.fx.Node) -> bool:
    example = tensor_node.meta.get("example_value")
    if isinstance(example, torch.Tensor) and example._is_view():
        # An in-place op on its base would rebase the view's autograd history.
        return True
    # register_hook_op returns its input: the nodes before and after it are the
    # same tensor, and it is not a use.
    while tensor_node.meta.get(HOOK_REGISTRATION):
        hooked = tensor_node.args[0]
        assert isinstance(hooked, torch.fx.Node)
        tensor_node = hooked
    pending = [tensor_node]
    while pending:
        for user in pending.pop().users:
            if not user.meta.get(HOOK_REGISTRATION):
                return True
            pending.append(user)
    return False


class ResidualHookHandleVariable(RemovableHandleVariable):
    """The handle of a hook on an intermediate, registered by residual bytecode."""

    def __init__(self, ordinal: int, tensor_node: torch.fx.Node, **kwargs: Any) -> None:
        super().__init__(mutation_type=ValueMutationNew(), **kwargs)
        self.ordinal = ordinal
        self.tensor_node = tensor_node


def check_residual_registrations(tensor_hooks: dict[int, Any], tx: Any) -> None:
    """Before residual registrations are emitted: restart (once for all of
    them) if a hooked intermediate is used in the graph."""
    used = [
        handle.ordinal
        for _, _, handle, _ in tensor_hooks.values()
        if isinstance(handle, ResidualHookHandleVariable)
        and used_in_graph(handle.tensor_node)
    ]
    if used:
        restart_with_decisions(tx, used, TRACE, "tensor used in the graph")


class TracedHookHandleVariable(RemovableHandleVariable):
    """The handle of a hook traced into the graph on an intermediate tensor."""

    def __init__(self, ordinal: int | None, **kwargs: Any) -> None:
        super().__init__(mutation_type=ValueMutationNew(), **kwargs)
        self.ordinal = ordinal

    def _restart(self, tx: Any, why: str) -> None:
        if self.ordinal is None:
            refuse_in_subgraph(why)
        restart_with_decisions(tx, [self.ordinal], GRAPH_BREAK, why)

    def call_method(
        self,
        tx: "InstructionTranslatorBase",
        name: str,
        args: list[VariableTracker],
        kwargs: dict[str, VariableTracker],
    ) -> VariableTracker:
        if name == "remove":
            self._restart(tx, "handle removed")
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, codegen: "PyCodegen") -> None:
        self._restart(codegen.tx, "handle escapes")
