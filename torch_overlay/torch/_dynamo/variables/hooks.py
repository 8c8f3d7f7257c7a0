"""
Tensor and nn.Module hooks registered, and RemovableHandles removed, in a compiled frame.

Without this module Dynamo keeps a handle only for ``Tensor.register_hook`` on a
tensor with a source (replayed by residual bytecode, see [On tensor.register_hook]
in side_effects.py). Here every handle a frame creates or receives is one
``HookHandleVariable``, whose ``origin`` says where it comes from:

* ``INPUT``: a RemovableHandle created before the frame (kept on an attribute to
  remove before registering again, passed to a resume function). It is guarded
  on its type; its ``remove()`` is replayed after the graph, see [Deferred
  removals].
* ``RESIDUAL_TENSOR``: ``register_hook`` on an intermediate, registered like one
  on an input: by residual bytecode on the tensor, which becomes a graph output,
  and the handle is the real one (``remove()`` in the frame cancels it). That is
  exact when the tensor has no use in the graph (it is returned, or dead): its
  gradient can only reach it through that output. See [Hooks on intermediates].
* ``TRACED``: a hook on an intermediate used in the graph, traced into it as
  without this module (``register_hook_op``). Its handle has no runtime value.
* ``BACKWARD_STATE``: the same under compiled autograd, where the graph calls
  the hook from the frame's BackwardState: the handle is a real
  ``BackwardStateHookHandle`` whose ``remove()`` clears the hook there.
* ``RESIDUAL_MODULE``: ``Module.register_forward_hook`` /
  ``register_forward_pre_hook`` on a module with a source, registered after the
  graph by residual bytecode; see [Module hooks].

Registrations and removals that residual bytecode replays (other than the tensor
hooks upstream keeps in ``SideEffects.tensor_hooks``) are in
``SideEffects.hook_ledger``, in program order, emitted by ``codegen_hook_ledger``.
When one of them turns out not to be exact, the trace restarts with a decision
for its call site in ``SpeculationLog.hook_decisions`` (``TRACE``: trace the
tensor hook into the graph; ``GRAPH_BREAK``: break the graph at the call, which
then runs eagerly and later code is traced in the resume function).
"""

import contextlib
import enum
import itertools
from collections.abc import Iterator
from typing import Any, NoReturn, TYPE_CHECKING

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
    from .dicts import ConstDictVariable
    from .nn_module import UnspecializedNNModuleVariable


class HandleOrigin(enum.Enum):
    INPUT = "input"
    RESIDUAL_TENSOR = "residual tensor hook"
    RESIDUAL_MODULE = "residual module hook"
    TRACED = "traced"
    BACKWARD_STATE = "backward state"


# SpeculationLog.hook_decisions values, by call site.
TRACE = "trace"
GRAPH_BREAK = "graph_break"

# node.meta key of register_hook_op / trampoline nodes: not uses of the tensor.
HOOK_REGISTRATION = "tensor_hook_registration"


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
    log.clear()
    raise RestartAnalysis(restart_reason=f"hook handle: {why}")


def refuse_in_subgraph(context: str) -> NoReturn:
    unimplemented(
        gb_type="Tensor hook handle in a higher-order op body",
        context=context,
        explanation="Dynamo registers and removes tensor hooks with residual "
        "bytecode after the graph, which a higher-order op body (traced into a "
        "subgraph) cannot do.",
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
        "kind",
        "flags",
        "key",
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
        module: "UnspecializedNNModuleVariable | None" = None,
        hook: VariableTracker | None = None,
        kind: str | None = None,
        flags: dict[str, bool] | None = None,
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
        # RESIDUAL_TENSOR: the hooked tensor's node.
        self.tensor_node = tensor_node
        # BACKWARD_STATE: the hook's name in the frame's BackwardState.
        self.bw_hook_name = bw_hook_name
        # RESIDUAL_MODULE: the registration residual bytecode replays.
        self.module = module
        self.hook = hook
        self.kind = kind
        self.flags = flags
        self.key = next(_placeholder_ids) if origin is HandleOrigin.RESIDUAL_MODULE else None
        # INPUT: whether the guard of [Deferred removals] is installed.
        self.guarded_unobserved = False

    def hooks_dicts(self) -> list[Any]:
        assert self.value is not None
        return hooks_dicts_of(self.value)

    def call_method(
        self,
        tx: "InstructionTranslatorBase",
        name: str,
        args: list[VariableTracker],
        kwargs: dict[str, VariableTracker],
    ) -> VariableTracker:
        if name == "remove" and not args and not kwargs:
            if self.origin is HandleOrigin.INPUT:
                return self._remove_input(tx)
            if self.origin in (HandleOrigin.TRACED, HandleOrigin.BACKWARD_STATE):
                self._break_at_registration(tx, "handle removed")
            if self.origin is HandleOrigin.RESIDUAL_MODULE:
                if self.idx != self.REMOVED:
                    ledger = tx.output.side_effects.hook_ledger
                    ledger[:] = [h for h in ledger if h is not self]
                    self.idx = self.REMOVED
                return ConstantVariable.create(None)
            # RESIDUAL_TENSOR: upstream's removal from SideEffects.tensor_hooks.
        elif self.origin is HandleOrigin.RESIDUAL_MODULE:
            _break_at_module_registration(tx, [self], f"handle.{name}")
        return super().call_method(tx, name, args, kwargs)

    def var_getattr(
        self, tx: "InstructionTranslatorBase", name: str
    ) -> VariableTracker:
        if self.origin is HandleOrigin.RESIDUAL_MODULE and name != "remove":
            _break_at_module_registration(tx, [self], f"handle.{name}")
        return super().var_getattr(tx, name)

    def reconstruct(self, codegen: "PyCodegen") -> None:
        if self.origin is HandleOrigin.TRACED:
            self._break_at_registration(codegen.tx, "handle escapes")
        if self.origin is HandleOrigin.BACKWARD_STATE:
            codegen.add_push_null(
                lambda: codegen.load_import_from(__name__, "BackwardStateHookHandle")
            )
            codegen.append_output(
                codegen.create_load(codegen.tx.output.backward_state_var)
            )
            codegen(ConstantVariable.create(self.bw_hook_name))
            codegen.extend_output(create_call_function(2, False))
            return
        super().reconstruct(codegen)

    def _break_at_registration(self, tx: Any, why: str) -> NoReturn:
        """A traced hook's handle is removed or escapes: register it on the
        real tensor at a graph break instead (see [Hooks on intermediates])."""
        if self.site is None:
            refuse_in_subgraph(why)
        restart_with_decision(tx, [self.site], GRAPH_BREAK, why)

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
        if not any(h is self for h in side_effects.hook_ledger):
            side_effects.hook_ledger.append(self)
        return ConstantVariable.create(None)


# ---------------------------------------------------------------------------
# Note [Hooks on intermediates]
# register_hook on an intermediate first takes the residual path (handle origin
# RESIDUAL_TENSOR, entry in SideEffects.tensor_hooks). Before the residual
# registrations are emitted, check_residual_registrations restarts the trace,
# once for all of them, if a hooked tensor is used in the graph (or is a view,
# whose history an in-place op on its base could rebase): the hook must see the
# in-graph gradient, so it is traced into the graph (decision TRACE; origin
# TRACED, or BACKWARD_STATE under compiled autograd). If a TRACED handle then
# escapes the frame or is removed, the trace restarts again with GRAPH_BREAK:
# register_hook runs eagerly on the real tensor and returns a real handle, and
# later uses of the tensor are traced in the resume function, where it is an input.


def register_hook_decision(
    tx: "InstructionTranslatorBase",
) -> tuple[tuple[Any, ...] | None, str | None]:
    """(site, decision) of a register_hook on an intermediate; site None means
    tracing the hook as without hook residuals (inside a subgraph there is no
    graph output to use)."""
    if tx.output.current_tracer.parent is not None:
        return None, TRACE
    site = call_site(tx)
    return site, tx.speculation_log.hook_decisions.get(site)


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


def check_residual_registrations(tensor_hooks: dict[int, Any], tx: Any) -> None:
    """Before residual registrations are emitted: restart (once for all of
    them) if a hooked intermediate is used in the graph."""
    used = [
        handle.site
        for _, _, handle, _ in tensor_hooks.values()
        if isinstance(handle, HookHandleVariable)
        and handle.origin is HandleOrigin.RESIDUAL_TENSOR
        and used_in_graph(handle.tensor_node)
    ]
    if used:
        restart_with_decision(tx, used, TRACE, "tensor used in the graph")


class BackwardStateHookHandle(RemovableHandle):
    """Runtime handle (origin BACKWARD_STATE) of a hook that compiled autograd
    calls from a BackwardState: removing it clears the hook there
    (call_hook_from_backward_state then leaves the gradient unchanged)."""

    def __init__(self, bw_state: Any, hook_name: str) -> None:
        super().__init__(_BackwardStateHooks({0: hook_name}))
        self.bw_state = bw_state
        self.hook_name = hook_name

    def remove(self) -> None:
        setattr(self.bw_state, self.hook_name, None)


class _BackwardStateHooks(dict[int, str]):
    # RemovableHandle keeps a weakref to its hooks dict; a plain dict has none.
    pass


# ---------------------------------------------------------------------------
# Note [Deferred removals]
# remove() of a handle from outside the frame (origin INPUT) is replayed after
# the graph. Until then, code traced in the frame must not read the handle's
# hooks dicts, or it sees (and runs) the removed hook. A tensor's or autograd
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
    return HookHandleVariable(HandleOrigin.INPUT, value=value, source=builder.source)


def _deferred_removals(ledger: list[HookHandleVariable]) -> list[HookHandleVariable]:
    return [h for h in ledger if h.origin is HandleOrigin.INPUT]


def check_hooks_dict_read(tx: "InstructionTranslatorBase", value: object) -> None:
    """VariableBuilder is about to represent value: if it is the hooks dict of a
    handle whose removal is deferred, restart and break the graph at remove()."""
    if not isinstance(value, dict):
        return
    for handle in _deferred_removals(tx.output.side_effects.hook_ledger):
        if any(d is value for d in handle.hooks_dicts()):
            assert handle.site is not None and handle.source is not None
            restart_with_decision(
                tx,
                [handle.site],
                GRAPH_BREAK,
                f"hooks dict of {handle.source.name} read after its remove()",
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


def _guard_removals_unobserved(
    removals: list[HookHandleVariable], cg: "PyCodegen"
) -> None:
    unguarded = [h for h in removals if not h.guarded_unobserved]
    if not unguarded:
        return
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


# ---------------------------------------------------------------------------
# Note [Module hooks]
# Module.register_forward_hook / register_forward_pre_hook create a
# RemovableHandle, whose constructor increments the class attribute
# RemovableHandle.next_id, and store the hook in the module's hook dicts under
# that id. Without this, Dynamo inlines the method and breaks the graph at the
# class attribute mutation. Here a registration on a module with a source is a
# residual side effect:
#
# * At trace time nothing is mutated. The registration (module, hook, kind,
#   flags) is a handle of origin RESIDUAL_MODULE in SideEffects.hook_ledger.
# * After the graph, residual bytecode calls the real register method with the
#   same flags, in program order, and the handle it returns is cached: every use
#   of the handle that leaves the frame loads that real RemovableHandle. Not
#   modelling next_id at trace time is equivalent to eager because nothing in
#   the frame can observe it: the pending entries below are keyed by trace-time
#   placeholders that only Module._call_impl sees, and reading the handle's id
#   (or any attribute but remove), or the module's hook dicts anywhere else,
#   makes the trace restart with a graph break at the registration, which then
#   runs eagerly. The real registration increments next_id once per hook, so the
#   ids are fresh and ordered per dict as in eager; only the relative numbering
#   of ids across different dicts can differ from eager (module hooks of the
#   frame are numbered before its residual tensor hooks), and no PyTorch code
#   compares ids of different dicts.
# * handle.remove() in the frame cancels the pending registration.
# * A call of the module later in the same frame runs the hook, as in eager:
#   while a registration is pending, Module._call_impl (and Dynamo's check
#   whether a module has hooks) reads the module's hook dicts with the pending
#   hooks in them, at the end (or at the front for prepend=True), and with the
#   with_kwargs flag. always_call has no effect inside a compiled region and is
#   passed on to the real registration.
#
# Guards: the module-hook-registration-stale-results patch guards the real
# lengths of the hook dicts a frame registers into
# (UnspecializedNNModuleVariable.note_hook_registration), so the next call
# recompiles with the hooks the module has by then.

FORWARD = "forward"
FORWARD_PRE = "forward_pre"

# register method -> (kind, flags it accepts)
REGISTER_METHODS = {
    torch.nn.Module.register_forward_hook: (
        FORWARD,
        ("prepend", "with_kwargs", "always_call"),
    ),
    torch.nn.Module.register_forward_pre_hook: (
        FORWARD_PRE,
        ("prepend", "with_kwargs"),
    ),
}

# kind -> (hooks dict, with_kwargs dict)
HOOK_DICTS = {
    FORWARD: ("_forward_hooks", "_forward_hooks_with_kwargs"),
    FORWARD_PRE: ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs"),
}

# Trace-time keys of pending hooks in the hook dicts Module._call_impl reads.
# Real handle ids are >= 0, so these never collide with a registered hook.
_placeholder_ids = itertools.count(-1, -1)

# The only readers that may see placeholder keys: they iterate the dicts, test
# membership and take lengths, and never let a key leave the frame.
_MODULE_PY = torch.nn.modules.module.__file__
_ALLOWED_READERS = {
    (_MODULE_PY, "_call_impl"),
    (_MODULE_PY, "inner"),
}


def register_residual(
    module: torch.nn.Module,
    hook: Any,
    pre: bool,
    prepend: bool,
    with_kwargs: bool,
    always_call: bool,
) -> RemovableHandle:
    """Called by residual bytecode after the graph: the real registration."""
    if pre:
        return module.register_forward_pre_hook(
            hook, prepend=prepend, with_kwargs=with_kwargs
        )
    return module.register_forward_hook(
        hook, prepend=prepend, with_kwargs=with_kwargs, always_call=always_call
    )


def _break_at_module_registration(
    tx: "InstructionTranslatorBase",
    registrations: list[HookHandleVariable],
    what: str,
) -> NoReturn:
    """The frame reads state only a real registration has (the handle's id,
    the module's hook dicts outside Module.__call__): trace again, and break
    the graph at these registrations instead, so that they run eagerly."""
    decisions = tx.speculation_log.hook_decisions
    new = [
        h.site
        for h in registrations
        if h.site is not None and decisions.get(h.site) != GRAPH_BREAK
    ]
    if not new:
        unimplemented(
            gb_type="Use of a module hook handle registered in the frame",
            context=what,
            explanation="Dynamo registers nn.Module forward hooks registered in "
            "a compiled frame after the graph, so the handle has no id or other "
            "state while tracing; only remove() is supported.",
            hints=[
                "Use the handle after the compiled function returns.",
                *graph_break_hints.SUPPORTABLE,
            ],
        )
    restart_with_decision(tx, new, GRAPH_BREAK, f"nn.Module hook registration: {what}")


def _pending_for(
    tx: "InstructionTranslatorBase", module: VariableTracker
) -> list[HookHandleVariable]:
    value = getattr(module, "value", None)
    return [
        h
        for h in tx.output.side_effects.hook_ledger
        if h.origin is HandleOrigin.RESIDUAL_MODULE
        and h.module is not None
        and h.module.value is value
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

    kind, accepted = REGISTER_METHODS[fn]
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
    if tx.speculation_log.hook_decisions.get(site) == GRAPH_BREAK:
        unimplemented(
            gb_type="nn.Module hook registration whose hooks or handle are read in the frame",
            context=f"{module.source.name}.{fn.__name__}",
            explanation="Later code in the frame reads the module's hook dicts "
            "or the handle's id, which exist only once the hook is registered "
            "for real: the registration runs eagerly at a graph break.",
            hints=[
                "Read the module's hooks or the handle's id outside the "
                "compiled function.",
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
        flags[name] = value.as_python_constant()
    handle = HookHandleVariable(
        HandleOrigin.RESIDUAL_MODULE,
        site,
        module=module,
        hook=args[0],
        kind=kind,
        flags=flags,
    )
    tx.output.side_effects.hook_ledger.append(handle)
    return handle


@contextlib.contextmanager
def counting_hooks(tx: "InstructionTranslatorBase") -> Iterator[None]:
    """Hook dicts read inside only have their length taken.

    UnspecializedNNModuleVariable.call_function reads the module's hook dicts to
    decide whether to inline ``forward`` directly or ``Module._call_impl``; a
    pending registration must count there, and it cannot leak a placeholder id.
    """
    output = tx.output
    saved = output.counting_module_hooks
    output.counting_module_hooks = True
    try:
        yield
    finally:
        output.counting_module_hooks = saved


def _allowed_reader(tx: "InstructionTranslatorBase") -> bool:
    code = tx.f_code
    if (code.co_filename, code.co_name) in _ALLOWED_READERS:
        return True
    return tx.output.counting_module_hooks


def pending_in_dict(
    tx: "InstructionTranslatorBase",
    module: "UnspecializedNNModuleVariable",
    name: str,
) -> list[HookHandleVariable]:
    """Registrations pending in this frame that a read of the module's hook dict
    ``name`` must see (with_pending adds them); [] if there are none."""
    if module.source is None:
        return []
    pending = [h for h in _pending_for(tx, module) if name in HOOK_DICTS[h.kind]]
    if not pending:
        return []
    if not _allowed_reader(tx) or tx.output.side_effects.has_pending_mutation_of_attr(
        module, name
    ):
        _break_at_module_registration(
            tx, list(pending), f"{module.source.name}.{name}"
        )
    return pending


def with_pending(
    hooks_vt: "ConstDictVariable", name: str, pending: list[HookHandleVariable]
) -> "ConstDictVariable":
    """The hook dict as Module._call_impl must see it: the module's real hooks
    (hooks_vt, as UnspecializedNNModuleVariable.var_getattr builds it) with the
    pending ones added under their placeholder ids. It has no source: it is not
    the real dict."""
    if not pending:
        return hooks_vt
    items = dict(hooks_vt.items)
    is_main = all(name == HOOK_DICTS[h.kind][0] for h in pending)
    for h in pending:
        assert h.flags is not None and h.hook is not None
        if is_main:
            entry = {ConstantVariable.create(h.key): h.hook}
        elif h.flags["with_kwargs"]:
            entry = {ConstantVariable.create(h.key): ConstantVariable.create(True)}
        else:
            continue
        if is_main and h.flags["prepend"]:
            items = {**entry, **items}
        else:
            items.update(entry)
    return hooks_vt.clone(items=items, source=None)


# ---------------------------------------------------------------------------
# The ledger: replayed registrations and removals, in program order.


def codegen_hook_ledger(ledger: list[HookHandleVariable], cg: "PyCodegen") -> None:
    _guard_removals_unobserved(_deferred_removals(ledger), cg)
    for handle in ledger:
        if handle.origin is HandleOrigin.INPUT:
            cg(handle)
            cg.load_method("remove")
            cg.call_method(0)
            cg.pop_top()
            continue
        assert handle.origin is HandleOrigin.RESIDUAL_MODULE and handle.flags
        cg.add_push_null(lambda: cg.load_import_from(__name__, "register_residual"))
        cg(handle.module)
        cg(handle.hook)
        for value in (
            handle.kind == FORWARD_PRE,
            handle.flags["prepend"],
            handle.flags["with_kwargs"],
            handle.flags.get("always_call", False),
        ):
            cg(ConstantVariable.create(value))
        cg.extend_output(create_call_function(6, False))
        # Later uses of the handle (returned, stored, resume arguments) load it.
        cg.add_cache(handle)
