"""
RemovableHandles that enter a compiled frame: ``remove()`` replayed after the graph.

A handle created before the frame (``self.handle.remove()`` before registering
again, a live handle passed to a resume function) is an input guarded on its type.
``InputHandleVariable`` replays its ``remove()`` at runtime on whatever handle the
source yields, after the graph, like the registrations. That is exact only while
nothing traced in the frame reads the handle's hooks dicts: a tensor's or autograd
Node's hooks run in backward, outside the frame, but ``Module.__call__`` reads the
global module hooks, ``state_dict()`` its state-dict hooks, ``register_buffer()``
the global registration hooks, and user code its own registries. So a removal is
deferred only when no such read happens in the frame (see [Deferred removals]
below); otherwise it runs eagerly at a graph break.
"""

from typing import Any, TYPE_CHECKING

from torch.utils.hooks import RemovableHandle

from .. import graph_break_hints
from ..exc import RestartAnalysis, unimplemented
from ..guards import _get_closure_vars, GuardBuilder, install_guard
from ..source import AttrSource, Source
from .base import VariableTracker
from .constant import ConstantVariable
from .intermediate_hooks import refuse_in_subgraph
from .user_defined import RemovableHandleVariable

if TYPE_CHECKING:
    from ..codegen import PyCodegen
    from ..symbolic_convert import InstructionTranslatorBase


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
