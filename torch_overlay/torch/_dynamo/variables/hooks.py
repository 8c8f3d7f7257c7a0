"""
Tensor and nn.Module hooks registered, and RemovableHandles removed, in a compiled frame.

Without this module Dynamo keeps a handle only for ``Tensor.register_hook`` on a
tensor with a source (replayed by residual bytecode, see [On tensor.register_hook]
in side_effects.py). Here every handle a frame creates or receives is one
``HookHandleVariable``, whose ``origin`` says where it comes from:

* ``INPUT``: a RemovableHandle created before the frame (kept on an attribute to
  remove before registering again, passed to a resume function). It is guarded
  on its type and tracked as an existing object whose value ``remove()``
  mutates; the removal is replayed after the graph by the side-effect replay
  handler ``removable_handle_removal``, see [Deferred removals].
* ``TRACED``: a hook on an intermediate traced into the graph as without this
  module (``register_hook_op``). Its handle has no runtime value.
* ``RESIDUAL_TENSOR``: a hook on an intermediate where tracing it is not exact
  (the tensor has no use in the graph, or the handle is removed or escapes),
  registered like one on an input: by residual bytecode on the tensor, which
  becomes a graph output, and the handle is the real one (``remove()`` in the
  frame cancels it). See [Hooks on intermediates].
* ``BACKWARD_STATE``: the same under compiled autograd, where the graph calls
  the hook from the frame's BackwardState hooks dict: the handle is a real
  ``BackwardStateHookHandle`` whose ``remove()`` deletes the hook from it.
* ``RESIDUAL_MODULE``: ``Module.register_forward_hook`` /
  ``register_forward_pre_hook`` on a module with a source, registered after the
  graph by residual bytecode; see [Module hooks].

Every registration that residual bytecode replays, and the removal of a handle
such a registration returns, is one entry of ``SideEffects.hook_ledger``
(``HookLedgerEntry``: ``target.method(*args, **kwargs)``), in program order,
emitted by one codegen (``SideEffects.codegen_hooks``): a registration's result
is the handle every later use loads, so it is made before the graph's outputs
are restored. The ledger holds no INPUT handle: removing one mutates an object
that exists before the frame, which the side-effect replay handlers replay.
When a registration turns out not to be exact, the trace restarts with a
decision for its call site in
``SpeculationLog.hook_decisions`` (``RESIDUAL``: register the tensor hook
after the graph; ``TRACE``: trace it into the graph; ``GRAPH_BREAK``: break the
graph at the call, which then runs eagerly and later code is traced in the
resume function).
"""

import collections
import enum
from collections.abc import Callable
from typing import Any, NoReturn, TYPE_CHECKING

import torch
from torch.utils.hooks import RemovableHandle

from .. import graph_break_hints
from ..bytecode_transformation import create_call_function
from ..exc import RestartAnalysis, unimplemented
from ..guards import _get_closure_vars, GuardBuilder, install_guard
from ..side_effects import (
    HookLedgerEntry,
    register_side_effect_replay_handler,
    SideEffectReplayContext,
)
from ..source import AttrSource, Source
from .base import Method, ValueMutationExisting, ValueMutationNew, VariableTracker
from .constant import ConstantVariable
from .dicts import ConstDictVariable, HashableTracker, OrderedDictVariable
from .user_defined import RemovableHandleVariable

if TYPE_CHECKING:
    from ..codegen import PyCodegen
    from ..symbolic_convert import InstructionTranslatorBase
    from .nn_module import UnspecializedNNModuleVariable


class HandleOrigin(enum.Enum):
    INPUT = "input"
    RESIDUAL_TENSOR = "residual tensor hook"
    RESIDUAL_MODULE = "residual module hook"
    TRACED = "traced"
    BACKWARD_STATE = "backward state"


# SpeculationLog.hook_decisions values, by call site.
RESIDUAL = "residual"
TRACE = "trace"
GRAPH_BREAK = "graph_break"

# node.meta keys of register_hook_op / trampoline nodes: not uses of the
# tensor; the call site of the register_hook (None in a subgraph).
HOOK_REGISTRATION = "tensor_hook_registration"
HOOK_SITE = "tensor_hook_site"


def call_site(tx: "InstructionTranslatorBase") -> tuple[Any, ...]:
    """The instruction being traced, with those of the calls inlining it:
    the same across restarts of the trace."""
    site = []
    cur: Any = tx
    while cur is not None:
        site.append((cur.f_code, cur.current_instruction.offset))
        cur = cur.parent
    return tuple(site)


def restart_with_decision(
    tx: "InstructionTranslatorBase",
    sites: list[tuple[Any, ...]],
    decision: str,
    why: str,
) -> NoReturn:
    log = tx.speculation_log
    for site in sites:
        log.hook_decisions[site] = decision
    # The decision changes which instructions are traced (a hook body, a graph
    # break), so the recorded speculation entries would not match: rediscover them.
    # A graph break is counted when the trace finds it, and the next attempt
    # finds those of the failed entries again: un-count them.
    log.uncount_graph_breaks()
    log.clear()
    raise RestartAnalysis(restart_reason=f"hook handle: {why}")


def refuse_in_subgraph(context: str) -> NoReturn:
    unimplemented(
        gb_type="Tensor hook handle in a higher-order op body",
        context=context,
        explanation="Tensor hooks are registered and removed by residual bytecode "
        "after the graph; a higher-order op body is a subgraph, which has none.",
        hints=[*graph_break_hints.SUPPORTABLE],
    )


class HookHandleVariable(RemovableHandleVariable):
    """A RemovableHandle a compiled frame creates or receives (see HandleOrigin)."""

    _nonvar_fields = {
        "origin",
        "site",
        "value",
        "tensor_node",
        "bw_hook_name",
        *RemovableHandleVariable._nonvar_fields,
    }

    def __init__(
        self,
        origin: HandleOrigin,
        site: tuple[Any, ...] | None = None,
        *,
        value: RemovableHandle | None = None,
        tensor_node: torch.fx.Node | None = None,
        bw_hook_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        if origin is not HandleOrigin.INPUT:
            kwargs.setdefault("mutation_type", ValueMutationNew())
        super().__init__(**kwargs)
        self.origin = origin
        # The call site of the registration (of remove() for INPUT): the key of
        # its decision in SpeculationLog.hook_decisions. None in a subgraph.
        self.site = site
        # INPUT: the handle seen while tracing; its hooks dicts are the ones
        # whose reads must come before a deferred remove().
        self.value = value
        # RESIDUAL_TENSOR, TRACED, BACKWARD_STATE: the hooked tensor's node.
        self.tensor_node = tensor_node
        # BACKWARD_STATE: the hook's key in the BackwardState's hooks dict.
        self.bw_hook_name = bw_hook_name
        # INPUT: whether the guard of [Deferred removals] is installed.
        self.guarded_unobserved = False

    def hooks_dicts(self) -> list[Any]:
        assert self.value is not None
        return hooks_dicts_of(self.value)

    def remove(
        self,
        tx: "InstructionTranslatorBase",
        args: list[VariableTracker],
        kwargs: dict[str, VariableTracker],
    ) -> VariableTracker | None:
        if args or kwargs:
            return None
        if self.origin is HandleOrigin.INPUT:
            return self._remove_input(tx)
        if self.origin in (HandleOrigin.TRACED, HandleOrigin.BACKWARD_STATE):
            # Registered after the graph, the registration is then cancelled.
            self._restart_registration(tx, RESIDUAL, "handle removed")
        if self.origin is HandleOrigin.RESIDUAL_MODULE:
            return self._remove_module_hook(tx)
        # RESIDUAL_TENSOR: upstream's removal (the ledger entry is cancelled).
        return super().remove(tx, args, kwargs)

    tp_methods = {**RemovableHandleVariable.tp_methods, "remove": Method(remove)}

    def call_method(
        self,
        tx: "InstructionTranslatorBase",
        name: str,
        args: list[VariableTracker],
        kwargs: dict[str, VariableTracker],
    ) -> VariableTracker:
        if self.origin is HandleOrigin.RESIDUAL_MODULE and name != "remove":
            refuse_module_handle_use(f"handle.{name}()")
        return super().call_method(tx, name, args, kwargs)

    def tp_getattro_impl(
        self, tx: "InstructionTranslatorBase", name: str
    ) -> VariableTracker:
        if self.origin is HandleOrigin.RESIDUAL_MODULE:
            if name == "id":
                return PendingHookIdVariable(self)
            if name != "remove":
                refuse_module_handle_use(f"handle.{name}")
        return super().tp_getattro_impl(tx, name)

    def _remove_module_hook(self, tx: "InstructionTranslatorBase") -> VariableTracker:
        """Replayed after the registration, as in eager: the handle stays a real
        (removed) RemovableHandle with its real id."""
        side_effects = tx.output.side_effects
        if not any(e.handle is self and not e.registers for e in side_effects.hook_ledger):
            side_effects.record_hook_call(HookLedgerEntry(self, self, "remove"))
        return ConstantVariable.create(None)

    def reconstruct(self, codegen: "PyCodegen") -> None:
        if self.origin is HandleOrigin.TRACED:
            # Escapes: register it on the real tensor, after the graph if that
            # is exact, else at a graph break.
            assert self.tensor_node is not None
            self._restart_registration(
                codegen.tx,
                GRAPH_BREAK if used_in_graph(self.tensor_node) else RESIDUAL,
                "handle escapes",
            )
        if self.origin is HandleOrigin.BACKWARD_STATE:
            codegen.add_push_null(
                lambda: codegen.load_import_from(__name__, "BackwardStateHookHandle")
            )
            codegen.append_output(
                codegen.create_load(codegen.tx.output.backward_state_var)
            )
            codegen.extend_output([codegen.create_load_attr(BACKWARD_STATE_HOOKS)])
            codegen(ConstantVariable.create(self.bw_hook_name))
            codegen.extend_output(create_call_function(2, False))
            return
        super().reconstruct(codegen)

    def _restart_registration(self, tx: Any, decision: str, why: str) -> NoReturn:
        """A traced hook's handle is removed or escapes: register the hook on
        the real tensor instead (see [Hooks on intermediates])."""
        if self.site is None:
            refuse_in_subgraph(why)
        restart_with_decision(tx, [self.site], decision, why)

    def _remove_input(self, tx: "InstructionTranslatorBase") -> VariableTracker:
        """See [Deferred removals]."""
        assert self.source is not None
        install_guard(
            AttrSource(self.source, "extra_dict_ref").make_guard(
                GuardBuilder.SEQUENCE_LENGTH
            )
        )
        if tx.output.current_tracer.parent is not None:
            # A subgraph's side effects may be discarded (e.g. a hook body).
            refuse_in_subgraph(f"{self.source.name}.remove()")
        assert self.value is not None
        if self.value.extra_dict_ref:
            # Module forward/forward-pre hook handles carry extra dicts; the hooks
            # they remove are inlined by Dynamo when the module is called.
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
        if tx.speculation_log.hook_decisions.get(self.site) == GRAPH_BREAK or any(
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
        # Replayed by removable_handle_removal; the handle's only mutation.
        side_effects.mutation(self)
        side_effects.has_handle_removal = True
        return ConstantVariable.create(None)


# ---------------------------------------------------------------------------
# Note [Hooks on intermediates]
# Without compiled autograd, register_hook on an intermediate is traced into the
# graph as without hook residuals (register_hook_op; handle origin TRACED). That
# is right when the tensor is used in the graph and the handle stays in the
# frame. Otherwise the trace restarts with a decision for the call site:
# * RESIDUAL (origin RESIDUAL_TENSOR): register the hook by residual bytecode on
#   the tensor, which becomes a graph output, and return the real handle: when
#   the tensor has no use in the graph (a returned or dead tensor, whose
#   gradient can only reach it through that output; check_traced_hooks finds
#   them before codegen), when the hook body cannot be traced, when the handle
#   is removed in the frame (the registration is then cancelled), or when it
#   escapes and the tensor is unused.
# * GRAPH_BREAK: the handle escapes (or the hook body cannot be traced) and the
#   tensor is used in the graph (or is a view, whose history an in-place op on
#   its base could rebase): register_hook runs eagerly on the real tensor at a
#   graph break (whose reason is the body's own when it cannot be traced), and
#   later uses of the tensor are traced in the resume function, where it is an
#   input. check_residual_registrations makes that decision for a
#   RESIDUAL registration whose tensor turns out to be used.
# Under compiled autograd the residual path comes first (the BackwardState
# trampoline is wrong on a tensor that leaves the graph), and a hook whose
# tensor is used in the graph restarts with TRACE: it is called from the
# BackwardState (origin BACKWARD_STATE), whose handle is real
# (BackwardStateHookHandle, see [BackwardState hooks]); only its remove()
# restarts (RESIDUAL: cancelled).


def register_hook_decision(
    tx: "InstructionTranslatorBase",
) -> tuple[tuple[Any, ...] | None, str]:
    """(site, decision) of a register_hook on an intermediate; site None means
    tracing the hook as without hook residuals (inside a subgraph there is no
    graph output to use)."""
    if tx.output.current_tracer.parent is not None:
        return None, TRACE
    site = call_site(tx)
    return site, tx.speculation_log.hook_decisions.get(site, _default_decision())


def _default_decision() -> str:
    from .. import compiled_autograd

    # Without compiled autograd Dynamo traces the hook into the graph itself
    # (register_hook_op). Compiled autograd's BackwardState trampoline on a tensor
    # that leaves the graph does not see the gradient the user's backward gives
    # it (hook_matrix output_* rows): there the residual path comes first.
    return RESIDUAL if compiled_autograd.compiled_autograd_enabled else TRACE


def traced_hook_handle(
    origin: HandleOrigin,
    site: tuple[Any, ...] | None,
    hook_node: torch.fx.Node,
    tensor_node: torch.fx.Node,
    **kwargs: Any,
) -> "HookHandleVariable":
    """The handle of a hook traced into the graph by hook_node."""
    hook_node.meta[HOOK_REGISTRATION] = True
    hook_node.meta[HOOK_SITE] = site
    return HookHandleVariable(origin, site, tensor_node=tensor_node, **kwargs)


def refuse_traced_hook(name: str) -> NoReturn:
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


def check_traced_hooks(tx: "InstructionTranslatorBase") -> None:
    """Before codegen: restart (once for all of them) with RESIDUAL if a hook
    traced into the graph is on a tensor with no use in it."""
    unused = [
        node.meta[HOOK_SITE]
        for node in tx.output.graph.nodes
        if node.meta.get(HOOK_REGISTRATION)
        and node.meta.get(HOOK_SITE) is not None
        and not used_in_graph(node.args[0])
    ]
    if unused:
        restart_with_decision(tx, unused, RESIDUAL, "tensor not used in the graph")


def check_residual_registrations(
    ledger: list[HookLedgerEntry], tx: "InstructionTranslatorBase"
) -> None:
    """Before residual registrations are emitted: restart (once for all of
    them) with GRAPH_BREAK if a hooked intermediate is used in the graph."""
    used = [
        e.handle.site
        for e in ledger
        if isinstance(e.handle, HookHandleVariable)
        and e.handle.origin is HandleOrigin.RESIDUAL_TENSOR
        and e.handle.tensor_node is not None
        and used_in_graph(e.handle.tensor_node)
    ]
    if used:
        # By default (compiled autograd) trace it into the graph; if it was
        # already found not traceable, break the graph at the registration.
        decisions = tx.speculation_log.hook_decisions
        for site in used:
            decisions[site] = GRAPH_BREAK if site in decisions else TRACE
        restart_with_decision(tx, [], GRAPH_BREAK, "tensor used in the graph")


# ---------------------------------------------------------------------------
# Note [BackwardState hooks]
# Under compiled autograd a hook traced on an intermediate is called, when
# backward runs, from the frame's BackwardState (call_hook_from_backward_state).
# With hook residuals the frame's hooks live in one real dict there,
# ``bw_state.tensor_hooks`` (an OrderedDict the residual bytecode builds), keyed
# by a name given while tracing; the handle of such a hook
# (BackwardStateHookHandle) is a RemovableHandle of that dict, and remove()
# deletes the hook from it, after which the trampoline leaves the gradient
# unchanged.
#
# Why the key is the name, not the handle's id as in other hooks dicts (so
# remove() deletes that key instead of RemovableHandle's id): Dynamo traces
# call_hook_from_backward_state when compiled autograd compiles the backward,
# and guards the keys of the dict it reads. A handle's id is new on every call,
# so an id key would recompile the backward on every call; the name is the
# same on every call, and removing the hook recompiles it once.


# The BackwardState attribute that holds the frame's hooks dict; Dynamo names
# its other BackwardState attributes with a number at the end.
BACKWARD_STATE_HOOKS = "tensor_hooks"


class BackwardStateHooksVariable(OrderedDictVariable):
    """The BackwardState's hooks dict, built by the residual code. Never a constant:
    asking a dict whether it is one realizes its values, and a hook read lazily (a
    closure's function) would then be guarded on which function it is, which
    without the dict it is not (a new hook function would recompile the frame)."""

    def is_python_constant(self) -> bool:
        return False


def add_backward_state_hook(
    tx: "InstructionTranslatorBase", hook: VariableTracker
) -> tuple[str, str]:
    """Put a tensor hook compiled autograd calls into the frame's BackwardState
    hooks dict; the dict's BackwardState attribute and the hook's key in it."""
    backward_state = tx.output.backward_state
    hooks = backward_state.get(BACKWARD_STATE_HOOKS)
    if hooks is None:
        hooks = BackwardStateHooksVariable({})
        backward_state[BACKWARD_STATE_HOOKS] = hooks
    assert isinstance(hooks, BackwardStateHooksVariable)
    name = f"hook{len(hooks.items)}"
    hooks.items[HashableTracker(ConstantVariable.create(name))] = hook
    return BACKWARD_STATE_HOOKS, name


class BackwardStateHookHandle(RemovableHandle):
    """Runtime handle (origin BACKWARD_STATE) of a hook in a BackwardState's
    hooks dict, whose key there is the hook's name (see [BackwardState hooks])."""

    def __init__(
        self, hooks: "collections.OrderedDict[str, Callable[..., Any]]", key: str
    ) -> None:
        super().__init__(hooks)
        self.key = key

    def remove(self) -> None:
        hooks = self.hooks_dict_ref()
        if hooks is not None:
            hooks.pop(self.key, None)


# ---------------------------------------------------------------------------
# Note [Deferred removals]
# remove() of a handle from outside the frame (origin INPUT) is replayed after
# the graph (replay handler removable_handle_removal). Until then, code traced
# in the frame must not read the handle's hooks dicts, or it sees (and runs) the
# removed hook. A tensor's or autograd
# Node's hooks run in backward, outside the frame, but Module.__call__ reads the
# global module hooks, state_dict() its state-dict hooks, register_buffer() the
# global registration hooks, and user code its own registries. Every read of an
# existing object goes through VariableBuilder, which calls
# check_hooks_dict_read: if the object is the hooks dict of a handle whose
# removal is deferred, the trace restarts and breaks the graph at that remove()
# instead, so that it runs eagerly and later code is traced in the resume
# function. A dict read before the remove() is already tracked by SideEffects
# (later reads reuse its VariableTracker): the graph breaks at remove() directly.
# Module forward / forward-pre hook dicts are read outside VariableBuilder
# (NNModuleHooksDictVariable): removing such a handle always breaks the graph
# (its extra dicts tell it apart, guarded).
#
# Which dicts the trace read depends on the handle seen while tracing; another
# call may pass a handle whose dicts the compiled code read (a global hook's,
# after a tensor hook's). A guard checks that the handle's dicts are none of
# the non-empty, int-keyed (hook-id keyed) dicts the trace read.


def hooks_dicts_of(handle: RemovableHandle) -> list[Any]:
    refs = (handle.hooks_dict_ref, *handle.extra_dict_ref)
    return [d for d in (ref() for ref in refs) if d is not None]


def wrap_input_handle(builder: Any, value: RemovableHandle) -> VariableTracker:
    install_guard(builder.source.make_guard(GuardBuilder.TYPE_MATCH))
    handle = HookHandleVariable(
        HandleOrigin.INPUT, value=value, source=builder.source
    )
    # Tracked, so that every source of the same handle is one variable whose
    # remove() is one mutation.
    return builder.tx.output.side_effects.track_object_existing(
        value, handle, mutation_type_cls=ValueMutationExisting
    )


def is_deferred_removal(var: VariableTracker) -> bool:
    """var is a handle from outside the frame that the frame removed."""
    return (
        isinstance(var, HookHandleVariable)
        and var.origin is HandleOrigin.INPUT
        and isinstance(var.mutation_type, ValueMutationExisting)
        and var.mutation_type.is_modified
    )


def _deferred_removals(side_effects: Any) -> list[HookHandleVariable]:
    return [v for v in side_effects.id_to_variable.values() if is_deferred_removal(v)]


def check_hooks_dict_read(tx: "InstructionTranslatorBase", value: object) -> None:
    """VariableBuilder is about to represent value, an object as it is before
    the frame's replayed hook calls: if a ledger entry changes it (the hooks
    dict of a handle whose removal is deferred, or a module hook dict a pending
    registration adds to), restart and break the graph at that call instead."""
    if not isinstance(value, dict):
        return
    side_effects = tx.output.side_effects
    ledger = side_effects.hook_ledger
    removals = _deferred_removals(side_effects) if side_effects.has_handle_removal else []
    for handle in removals:
        if any(d is value for d in handle.hooks_dicts()):
            assert handle.site is not None and handle.source is not None
            restart_with_decision(
                tx,
                [handle.site],
                GRAPH_BREAK,
                f"hooks dict of {handle.source.name} read after its remove()",
            )
    for entry in _module_registrations(ledger):
        names = HOOK_DICTS[entry.method]
        if any(getattr(entry.target.value, n, None) is value for n in names):
            _break_at_module_registration(
                tx, [entry.handle], f"{entry.target.source}.{entry.method}"
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

    assert handle.source is not None
    install_guard(handle.source.make_guard(HOOKS_DICTS_UNOBSERVED))


@register_side_effect_replay_handler(
    name="removable_handle_removal",
    matcher=lambda ctx: is_deferred_removal(ctx.var),
    priority=35,
)
def _codegen_removable_handle_removal(ctx: SideEffectReplayContext) -> None:
    """``handle.remove()`` of a handle from outside the frame, after the graph
    and the frame's own hook registrations (see [Deferred removals])."""
    handle = ctx.var
    assert isinstance(handle, HookHandleVariable) and handle.source is not None
    cg = ctx.codegen
    if not handle.guarded_unobserved:
        # Once, though the suffix is generated twice.
        handle.guarded_unobserved = True
        side_effects = ctx.side_effects
        # Dicts a hook id can be a key of: see [Deferred removals].
        observed = [
            side_effects[obj].source
            for obj in side_effects.keepalive
            if isinstance(obj, dict)
            and obj in side_effects
            and side_effects[obj].source is not None
            and any(type(k) is int for k in obj)
        ]
        if observed:
            _guard_removal_unobserved(handle, observed)

    def load_remove() -> None:
        cg(handle.source)
        cg.extend_output([cg.create_load_attr("remove")])

    cg.add_push_null(load_remove)
    cg.extend_output(create_call_function(0, False))
    cg.pop_top()
    ctx.log(handle)


# ---------------------------------------------------------------------------
# Note [Module hooks]
# Module.register_forward_hook / register_forward_pre_hook create a
# RemovableHandle, whose constructor increments the class attribute
# RemovableHandle.next_id, and store the hook in the module's hook dicts under
# that id. Without this, Dynamo inlines the method and breaks the graph at the
# class attribute mutation. Here a registration on a module with a source is a
# residual side effect:
#
# * At trace time nothing is mutated. The registration is a ledger entry
#   ``module.register_forward_hook(hook, prepend=..., with_kwargs=...,
#   always_call=...)`` whose result is the handle (origin RESIDUAL_MODULE).
# * After the graph, residual bytecode makes that call, in program order with
#   the frame's other hook calls, and caches the RemovableHandle it returns:
#   every use of the handle that leaves the frame (returned, stored on an
#   attribute or in a list, a resume function's argument) loads that real
#   handle. handle.remove() in the frame is replayed after it.
# * The handle's id is known only at run time. While tracing it is a
#   PendingHookIdVariable, whose value is read from the real handle wherever it
#   leaves the frame. A read of one of the module's hook dicts through the
#   module (Module._call_impl, Dynamo's has-hooks check, user code) sees the
#   pending hook under that id, at the end (or at the front for prepend=True),
#   and in the with_kwargs dict; the dict keeps its source, so a dict that
#   leaves the frame is the real one, which by then holds the hook.
#
# Why this is exact: RemovableHandle.next_id only grows, so the new id is a key
# of no dict before the registration, and equal to no id of another handle.
# The PendingHookIdVariable is equal to itself only; every other use of its
# value (arithmetic, ordering, formatting, a constant) is not supported by the
# variable and breaks the graph there, which replays the registration first and
# then passes the real id on. Any other attribute of the handle likewise breaks
# the graph at its use. A read of the module's hook dict that does not go
# through the module (e.g. vars(m)) comes through VariableBuilder, which sees
# the dict as it is before the registration: check_hooks_dict_read then
# restarts with a graph break at the registration. Registering after the frame
# replaced the module's hook dict graph breaks at the registration (program
# order between the ledger and attribute writes is not kept).
#
# Guards: the module-hook-registration-stale-results patch guards the real
# lengths of the hook dicts a frame registers into
# (UnspecializedNNModuleVariable.note_hook_registration), so the next call
# recompiles with the hooks the module has by then.

# register method name -> the flags it accepts
REGISTER_METHODS = {
    torch.nn.Module.register_forward_hook: ("prepend", "with_kwargs", "always_call"),
    torch.nn.Module.register_forward_pre_hook: ("prepend", "with_kwargs"),
}

# register method name -> (hooks dict, with_kwargs dict)
HOOK_DICTS = {
    "register_forward_hook": ("_forward_hooks", "_forward_hooks_with_kwargs"),
    "register_forward_pre_hook": (
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
    ),
}


class PendingHookIdVariable(VariableTracker):
    """The id of a RemovableHandle that residual bytecode creates (origin
    RESIDUAL_MODULE). See [Module hooks] for why identity is its only traced
    property."""

    _nonvar_fields = {"handle", *VariableTracker._nonvar_fields}

    def __init__(self, handle: HookHandleVariable, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handle = handle

    def python_type(self) -> type:
        return int

    def is_python_equal(self, other: object) -> bool:
        return isinstance(other, PendingHookIdVariable) and other.handle is self.handle

    def hash_impl(self, tx: "InstructionTranslatorBase") -> tuple[int, bool]:
        # A trace-time hash: it must not reach the output (is_fake).
        return hash((PendingHookIdVariable, id(self.handle))), True

    def tp_richcompare_impl(
        self, tx: "InstructionTranslatorBase", other: VariableTracker, op: str
    ) -> VariableTracker:
        if op in ("__eq__", "__ne__") and isinstance(other, PendingHookIdVariable):
            return ConstantVariable.create(self.is_python_equal(other) == (op == "__eq__"))
        refuse_pending_id_use(self, op)

    def reconstruct(self, codegen: "PyCodegen") -> None:
        codegen(self.handle)
        codegen.extend_output([codegen.create_load_attr("id")])


def refuse_pending_id_use(id_var: VariableTracker, what: str) -> NoReturn:
    unimplemented(
        gb_type="Value of a module hook handle's id registered in the frame",
        context=f"{id_var}: {what}",
        explanation="The id of a handle Dynamo registers after the graph is "
        "known only at run time; the graph breaks where its value is used, "
        "after the registration.",
        hints=["Use the handle's id after the compiled function returns."],
    )


# Every other object protocol slot (arithmetic, ordering, bool, str, index, ...),
# attribute and method would need the id's value: it breaks the graph instead.
for _slot in [
    name
    for name in vars(VariableTracker)
    if (name.endswith("_impl") or name == "call_method")
    and name not in vars(PendingHookIdVariable)
]:
    setattr(
        PendingHookIdVariable,
        _slot,
        lambda self, tx, *args, _slot=_slot, **kwargs: refuse_pending_id_use(
            # an attribute's or method's name, else the slot's
            self, args[0] if _slot in ("tp_getattro_impl", "call_method") else _slot
        ),
    )


def refuse_module_handle_use(what: str) -> NoReturn:
    unimplemented(
        gb_type="Use of a module hook handle registered in the frame",
        context=what,
        explanation="Dynamo registers nn.Module forward hooks registered in "
        "a compiled frame after the graph, so the handle exists only then: "
        "remove() and its id are supported, other uses break the graph there.",
        hints=[
            "Use the handle after the compiled function returns.",
            *graph_break_hints.SUPPORTABLE,
        ],
    )


def _break_at_module_registration(
    tx: "InstructionTranslatorBase",
    registrations: list[HookHandleVariable],
    what: str,
) -> NoReturn:
    """The frame reads a module hook dict as it was before a pending
    registration: trace again, and break the graph at these registrations
    instead, so that they run eagerly."""
    decisions = tx.speculation_log.hook_decisions
    new = [
        h.site
        for h in registrations
        if h.site is not None and decisions.get(h.site) != GRAPH_BREAK
    ]
    if not new:
        refuse_module_handle_use(what)
    restart_with_decision(tx, new, GRAPH_BREAK, f"nn.Module hook registration: {what}")


def _module_registrations(ledger: list[HookLedgerEntry]) -> list[HookLedgerEntry]:
    """Module hook registrations of the ledger not removed in the frame."""
    removed = {id(e.handle) for e in ledger if not e.registers}
    return [
        e
        for e in ledger
        if e.registers and e.method in HOOK_DICTS and id(e.handle) not in removed
    ]


def maybe_register(
    tx: "InstructionTranslatorBase",
    module: "UnspecializedNNModuleVariable",
    fn: Any,
    args: list[VariableTracker],
    kwargs: dict[str, VariableTracker],
) -> VariableTracker | None:
    """Record a forward (pre-)hook registration; None: trace the method as usual."""
    from .. import config

    accepted = REGISTER_METHODS[fn]
    if (
        not config.hook_residuals
        or tx.export
        or module.source is None
        or len(args) != 1
        or not set(kwargs) <= set(accepted)
    ):
        return None
    if tx.output.current_tracer.parent is not None:
        unimplemented(
            gb_type="nn.Module hook registration in a higher-order op body",
            context=f"{module.source.name}.{fn.__name__}",
            explanation="Dynamo registers nn.Module forward hooks with residual "
            "bytecode after the graph, which a higher-order op body (traced into "
            "a subgraph) cannot do.",
            hints=[*graph_break_hints.SUPPORTABLE],
        )
    site = call_site(tx)
    side_effects = tx.output.side_effects
    if tx.speculation_log.hook_decisions.get(site) == GRAPH_BREAK or any(
        side_effects.has_pending_mutation_of_attr(module, name)
        for name in HOOK_DICTS[fn.__name__]
    ):
        unimplemented(
            gb_type="nn.Module hook registration whose hooks dict is read or replaced in the frame",
            context=f"{module.source.name}.{fn.__name__}",
            explanation="The frame replaces the module's hook dict, or reads it "
            "other than through the module, so Dynamo cannot defer the "
            "registration to after the graph: it runs eagerly at a graph break.",
            hints=[
                "Read or replace the module's hook dicts outside the compiled function.",
            ],
        )
    flags = {}
    for name in accepted:
        value = kwargs.get(name, ConstantVariable.create(False))
        if not value.is_python_constant() or not isinstance(
            value.as_python_constant(), bool
        ):
            unimplemented(
                gb_type="nn.Module hook registration with a non-constant flag",
                context=f"{module.source.name}.{fn.__name__}({name}={value})",
                explanation=f"The {name}= argument decides how Module.__call__ runs "
                "the hook; Dynamo needs it as a constant bool while tracing.",
                hints=[f"Pass {name}=True or {name}=False."],
            )
        flags[name] = ConstantVariable.create(value.as_python_constant())
    handle = HookHandleVariable(HandleOrigin.RESIDUAL_MODULE, site)
    side_effects.record_hook_call(
        HookLedgerEntry(handle, module, fn.__name__, [args[0]], flags)
    )
    return handle


def with_pending(
    tx: "InstructionTranslatorBase",
    module: "UnspecializedNNModuleVariable",
    name: str,
    hooks_vt: "ConstDictVariable",
) -> "ConstDictVariable":
    """The module's hook dict ``name`` as the program sees it at this point:
    the real hooks (hooks_vt, as UnspecializedNNModuleVariable.tp_getattro_impl
    builds it) and the registrations pending in this frame, keyed by their
    PendingHookIdVariable. It keeps the real dict's source: after the
    residual registrations that dict holds the same entries."""
    pending = [
        e
        for e in _module_registrations(tx.output.side_effects.hook_ledger)
        if name in HOOK_DICTS[e.method] and e.target.value is module.value
    ]
    if not pending:
        return hooks_vt
    items = dict(hooks_vt.items)
    for e in pending:
        key = PendingHookIdVariable(e.handle)
        flag = e.kwargs
        if name == HOOK_DICTS[e.method][0]:
            entry = {key: e.args[0]}
        elif flag["with_kwargs"].as_python_constant():
            entry = {key: ConstantVariable.create(True)}
        else:
            continue
        if flag["prepend"].as_python_constant():
            items = {**entry, **items}
        else:
            items.update(entry)
    return hooks_vt.clone(items=items)


# ---------------------------------------------------------------------------
# The ledger, before its codegen (SideEffects.codegen_hooks).


def check_ledger(ledger: list[HookLedgerEntry], cg: "PyCodegen") -> None:
    check_traced_hooks(cg.tx)
    check_residual_registrations(ledger, cg.tx)
