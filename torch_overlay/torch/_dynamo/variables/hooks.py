"""
Tensor hook handles that enter or leave a compiled frame.

Without hook residuals, Dynamo keeps a ``register_hook`` handle only when the
hooked tensor has a source: the registration is replayed by residual bytecode (see
[On tensor.register_hook] in side_effects.py) and the handle is the value that
call returns. Two kinds of handles had no representation and made the whole
frame run eagerly, or crash:

* Handles created before the frame (``self.handle.remove()`` before
  registering again, a live handle passed to a resume function).
  ``InputHandleVariable`` wraps them with a TYPE_MATCH guard: only the type
  matters, because ``remove()`` is replayed at runtime on whatever handle the
  source yields, after the graph, like the registrations. That is exact only
  while nothing traced in the frame reads the handle's hooks dicts: a tensor's
  or autograd Node's hooks run in backward, outside the frame, but
  ``Module.__call__`` reads the global module hooks, ``state_dict()`` its
  state-dict hooks, ``register_buffer()`` the global registration hooks, and
  user code its own registries. So a removal is deferred only when no such
  read happens in the frame (see [Deferred removals] below); otherwise it
  runs eagerly at a graph break.

* Handles of hooks on intermediates, which Dynamo otherwise traces into the graph
  (``register_hook_op``, or the compiled-autograd trampoline) with no runtime
  handle. Here a hook on an intermediate is first registered like one on an
  input: by residual bytecode on the tensor, which becomes a graph output, and
  the handle is the real one (``remove()`` in the frame cancels it). That is
  exact when the tensor has no use in the graph (it is returned, or dead): its
  gradient can only reach it from outside the graph, through the graph output
  the hook is on. If the tensor is used in the graph (or is a view, whose
  history an in-place op on its base could rebase), the hook must see the
  in-graph gradient, so the trace restarts, once for all such registrations,
  with a decision for each (by ordinal in the trace, kept in the
  SpeculationLog):

  - TRACE: as without hook residuals, the hook is traced into the graph. Its handle is a
    ``TracedHookHandleVariable``. Under compiled autograd the hook is called
    from the frame's BackwardState, so an escaping handle is a real
    ``BackwardStateHookHandle`` whose ``remove()`` clears it there. Otherwise
    the handle has no runtime value:
  - GRAPH_BREAK: if that handle escapes the frame or is removed, the trace
    restarts again and breaks the graph at the ``register_hook`` call: it runs
    eagerly on the real tensor and returns a real handle, and later uses of
    the tensor are traced in the resume function, where it is an input.
"""

from typing import Any, TYPE_CHECKING

import torch
from torch.utils.hooks import RemovableHandle

from .. import graph_break_hints
from ..bytecode_transformation import create_call_function
from ..exc import RestartAnalysis, unimplemented
from ..guards import _get_closure_vars, GuardBuilder, install_guard
from ..source import AttrSource, Source
from .base import ValueMutationNew, VariableTracker
from .constant import ConstantVariable
from .user_defined import RemovableHandleVariable


if TYPE_CHECKING:
    from ..codegen import PyCodegen
    from ..symbolic_convert import InstructionTranslatorBase


# node.meta key of register_hook_op / trampoline nodes: not uses of the tensor.
HOOK_REGISTRATION = "tensor_hook_registration"
TRACE = "trace"
GRAPH_BREAK = "graph_break"


# Note [Deferred removals]
# remove() of a handle from outside the frame is replayed after the graph. Until
# then, code traced in the frame must not read the handle's hooks dicts, or it
# sees (and runs) the removed hook. Every read of an existing object goes
# through VariableBuilder, which calls check_hooks_dict_read: if the object is
# the hooks dict of a handle whose removal is deferred, the trace restarts and
# breaks the graph at that remove() instead, so that it runs eagerly and later
# code is traced in the resume function. A dict read before the remove() is
# already tracked by SideEffects (later reads reuse its VariableTracker): the
# graph breaks at remove() directly. Module forward / forward-pre hook dicts are
# read outside VariableBuilder (NNModuleHooksDictVariable): removing such a
# handle always breaks the graph (its extra dicts tell it apart, guarded).
#
# Which dicts the trace read depends on the handle seen while tracing; another
# call may pass a handle whose dicts the compiled code read (a global hook's,
# after a tensor hook's). A guard checks that the handle's dicts are none of
# the non-empty, int-keyed (hook-id keyed) dicts the trace read.


def call_site(tx: "InstructionTranslatorBase") -> tuple[Any, ...]:
    """The instruction being traced, with those of the calls inlining it:
    the same across restarts of the trace."""
    site = []
    cur: Any = tx
    while cur is not None:
        site.append((cur.f_code, cur.current_instruction.offset))
        cur = cur.parent
    return tuple(site)


class InputHandleVariable(RemovableHandleVariable):
    """A RemovableHandle that exists before the frame runs (it has a source)."""

    _nonvar_fields = {"site", *RemovableHandleVariable._nonvar_fields}

    def __init__(self, value: RemovableHandle, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # The handle seen while tracing: its hooks dicts are the ones whose
        # reads must come before a deferred remove().
        self.value = value
        # Module forward/forward-pre hook handles carry extra dicts; the hooks
        # they remove are inlined by Dynamo when the module is called.
        self.num_extra_dicts = len(value.extra_dict_ref)
        self.site: tuple[Any, ...] | None = None
        self.guarded_unobserved = False

    def hooks_dicts(self) -> list[Any]:
        return hooks_dicts_of(self.value)

    def call_method(
        self,
        tx: "InstructionTranslatorBase",
        name: str,
        args: list[VariableTracker],
        kwargs: dict[str, VariableTracker],
    ) -> VariableTracker:
        if name == "remove" and not args and not kwargs:
            install_guard(
                AttrSource(self.source, "extra_dict_ref").make_guard(
                    GuardBuilder.SEQUENCE_LENGTH
                )
            )
            if tx.output.current_tracer.parent is not None:
                # A subgraph's side effects may be discarded (e.g. a hook body).
                refuse_in_subgraph(f"{self.source.name}.remove()")
            if self.num_extra_dicts:
                unimplemented(
                    gb_type="RemovableHandle.remove() of a module forward hook",
                    context=f"{self.source.name}.remove()",
                    explanation="The handle removes an nn.Module forward or "
                    "forward-pre hook. Dynamo traces module calls with the hooks "
                    "they have while tracing, so removing one at the end of the "
                    "frame could run a removed hook in this frame.",
                    hints=[*graph_break_hints.SUPPORTABLE],
                )
            side_effects = tx.output.side_effects
            self.site = call_site(tx)
            if self.site in tx.speculation_log.eager_handle_removals or any(
                d in side_effects for d in self.hooks_dicts()
            ):
                unimplemented(
                    gb_type="RemovableHandle.remove() of a hook whose hooks dict the frame reads",
                    context=f"{self.source.name}.remove()",
                    explanation="The handle comes from outside the frame, and code "
                    "traced in the same frame reads its hooks dict (e.g. "
                    "Module.__call__ the global module hooks, state_dict() the "
                    "state-dict hooks). Dynamo replays such a remove() after the "
                    "graph, so that code would still see the removed hook: the "
                    "removal runs eagerly at a graph break instead.",
                    hints=[
                        "Remove the hook outside the compiled function, or read "
                        "its hooks in another function.",
                    ],
                )
            if self not in side_effects.handle_removals:
                side_effects.handle_removals.append(self)
            return ConstantVariable.create(None)
        return super().call_method(tx, name, args, kwargs)


def hooks_dicts_of(handle: RemovableHandle) -> list[Any]:
    refs = (handle.hooks_dict_ref, *handle.extra_dict_ref)
    return [d for d in (ref() for ref in refs) if d is not None]


def wrap_input_handle(builder: Any, value: RemovableHandle) -> VariableTracker:
    install_guard(builder.source.make_guard(GuardBuilder.TYPE_MATCH))
    return InputHandleVariable(value, source=builder.source)


def check_hooks_dict_read(tx: "InstructionTranslatorBase", value: object) -> None:
    """VariableBuilder is about to represent value: if it is the hooks dict of a
    handle whose removal is deferred, restart and break the graph at remove()."""
    if not isinstance(value, dict):
        return
    for handle in tx.output.side_effects.handle_removals:
        if any(d is value for d in handle.hooks_dicts()):
            tx.speculation_log.eager_handle_removals.add(handle.site)
            # The graph break changes which instructions are traced.
            tx.speculation_log.clear()
            raise RestartAnalysis(
                restart_reason=f"hooks dict of {handle.source.name} read after "
                "its remove()"
            )


def hooks_dicts_unobserved(handle: Any, observed: tuple[Any, ...]) -> bool:
    """Guard: none of the handle's hooks dicts is a dict the trace read."""
    return not any(d is o for d in hooks_dicts_of(handle) for o in observed)


def _guard_removal_unobserved(
    handle: VariableTracker, observed: list[Source]
) -> None:
    def HOOKS_DICTS_UNOBSERVED(builder: Any, guard: Any) -> None:
        dicts = ", ".join(builder.arg_ref(s.name) for s in observed)
        code = f"___hooks_dicts_unobserved({builder.arg_ref(guard)}, ({dicts},))"
        builder.add_python_lambda_leaf_guard_to_root(
            [code],
            [code],
            closure_vars={
                **_get_closure_vars(),
                "___hooks_dicts_unobserved": hooks_dicts_unobserved,
            },
        )

    install_guard(handle.source.make_guard(HOOKS_DICTS_UNOBSERVED))


def codegen_handle_removals(
    handle_removals: list[VariableTracker], cg: "PyCodegen"
) -> None:
    unguarded = [h for h in handle_removals if not h.guarded_unobserved]
    if unguarded:
        side_effects = cg.tx.output.side_effects
        # Dicts a hook id can be a key of: see [Deferred removals].
        observed = [
            side_effects[obj].source
            for obj in side_effects.keepalive
            if isinstance(obj, dict)
            and obj in side_effects
            and side_effects[obj].source is not None
            and any(type(k) is int for k in obj)
        ]
        for handle in unguarded:
            # Once, though the suffix is generated twice.
            handle.guarded_unobserved = True
            if observed:
                _guard_removal_unobserved(handle, observed)
    for handle in handle_removals:
        cg(handle)
        cg.load_method("remove")
        cg.call_method(0)
        cg.pop_top()


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



def check_residual_registrations(tensor_hooks: Any, tx: Any) -> None:
    """Before residual registrations are emitted: restart (once for all of
    them) if a hooked intermediate is used in the graph."""
    used = [
        handle.ordinal
        for _, _, handle, _ in tensor_hooks
        if isinstance(handle, ResidualHookHandleVariable)
        and used_in_graph(handle.tensor_node)
    ]
    if used:
        restart_with_decisions(tx, used, TRACE, "tensor used in the graph")


class BackwardStateHookHandle(RemovableHandle):
    """Runtime handle of a hook that compiled autograd calls from a BackwardState:
    removing it clears the hook there (call_hook_from_backward_state then leaves
    the gradient unchanged)."""

    def __init__(self, bw_state: Any, hook_name: str) -> None:
        super().__init__(_BackwardStateHooks({0: hook_name}))
        self.bw_state = bw_state
        self.hook_name = hook_name

    def remove(self) -> None:
        setattr(self.bw_state, self.hook_name, None)


class _BackwardStateHooks(dict[int, str]):
    # RemovableHandle keeps a weakref to its hooks dict; a plain dict has none.
    pass


class TracedHookHandleVariable(RemovableHandleVariable):
    """The handle of a hook traced into the graph on an intermediate tensor."""

    def __init__(
        self, ordinal: int | None, bw_hook_name: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(mutation_type=ValueMutationNew(), **kwargs)
        self.ordinal = ordinal
        # Under compiled autograd, the hook's name in the frame's BackwardState:
        # the handle can be a real one that clears it.
        self.bw_hook_name = bw_hook_name

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
        if self.bw_hook_name is None:
            self._restart(codegen.tx, "handle escapes")
        codegen.add_push_null(
            lambda: codegen.load_import_from(__name__, "BackwardStateHookHandle")
        )
        codegen.append_output(
            codegen.create_load(codegen.tx.output.backward_state_var)
        )
        codegen(ConstantVariable.create(self.bw_hook_name))
        codegen.extend_output(create_call_function(2, False))
