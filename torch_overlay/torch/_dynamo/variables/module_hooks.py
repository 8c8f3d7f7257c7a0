"""
nn.Module forward and forward-pre hooks registered inside a compiled frame.

``Module.register_forward_hook`` / ``register_forward_pre_hook`` create a
``RemovableHandle``, whose constructor increments the class attribute
``RemovableHandle.next_id``, and store the hook in the module's hook dicts under
that id. Without this, Dynamo inlines the method and breaks the graph at the class
attribute mutation. Here (``config.hook_residuals``) a registration on a
module with a source is a residual side effect, like ``Tensor.register_hook`` on
an input (see [On tensor.register_hook] in side_effects.py):

* At trace time nothing is mutated. The registration (module, hook, kind, flags)
  is recorded in ``SideEffects.module_hook_registrations`` and the call returns a
  ``ModuleHookHandleVariable``.

* After the graph, residual bytecode calls the real ``register_forward_hook``
  (or ``register_forward_pre_hook``) with the same flags, in program order, and
  the handle it returns is cached: every use of the handle that leaves the frame
  (returned, stored on an attribute or in a list, passed to a resume function)
  loads that real ``RemovableHandle``.

  Not modelling ``next_id`` at trace time is equivalent to eager because nothing
  in the frame can observe it: the pending entries below are keyed by trace-time
  placeholders that only ``Module._call_impl`` sees, and reading the handle's
  ``id`` (or any attribute but ``remove``), or the module's hook dicts anywhere
  else, makes the trace restart with a graph break at the registration, which
  then runs eagerly and gives later code the real handle and dicts. The
  real registration increments ``next_id`` once per hook, so the ids the module's
  dicts hold after the frame are fresh and unique and their order within each
  dict is the program order, as in eager. Only the relative numbering of ids
  across different dicts can differ from eager (tensor hook handles created by
  residual bytecode in the same frame are numbered first), and no PyTorch code
  compares ids of different dicts.

* ``handle.remove()`` in the frame cancels the pending registration.

* A call of the module later in the same frame runs the hook, as in eager: while
  a registration is pending, ``Module._call_impl`` (and Dynamo's check whether a
  module has hooks) reads the module's hook dicts with the pending hooks in
  them, at the end (or at the front for ``prepend=True``), and with the
  ``with_kwargs`` flag. ``always_call`` has no effect inside a compiled region
  (``_call_impl`` does not run always-called hooks on an exception when
  compiling) and is passed on to the real registration.

Guards. Dynamo skips the guard on an *empty* module hook dict
(``config.skip_nnmodule_hook_guards``), so code traced while a module had no
hooks keeps running after hooks are added. A frame that registers a hook on a
module and also calls it (before or after registering) would then be wrong from
its second call on: eager runs the hooks the first call added. So for such a
module the length of the hook dicts the registration changes is guarded for
real (``SEQUENCE_LENGTH``): the next call recompiles with the hooks the module
has by then, like eager, which stacks one more hook per call. A frame that
registers without calling the module installs no guard. Code compiled by other
frames before the hook was added is unchanged.
"""

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any, NoReturn, TYPE_CHECKING

import torch
from torch.utils.hooks import RemovableHandle

from .. import graph_break_hints
from ..bytecode_transformation import create_call_function
from ..exc import RestartAnalysis, unimplemented
from ..guards import GuardBuilder, install_guard
from ..source import AttrSource
from .base import ValueMutationNew, VariableTracker
from .constant import ConstantVariable
from .hooks import call_site
from .user_defined import RemovableHandleVariable

if TYPE_CHECKING:
    from ..codegen import PyCodegen
    from ..symbolic_convert import InstructionTranslatorBase
    from .dicts import ConstDictVariable
    from .nn_module import UnspecializedNNModuleVariable


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


class PendingModuleHook:
    def __init__(
        self,
        module: "UnspecializedNNModuleVariable",
        hook: VariableTracker,
        kind: str,
        flags: dict[str, bool],
        handle: "ModuleHookHandleVariable",
        site: tuple[Any, ...],
    ) -> None:
        self.site = site
        self.module = module
        self.hook = hook
        self.kind = kind
        self.flags = flags
        self.handle = handle
        self.key = next(_placeholder_ids)


class ModuleHookHandleVariable(RemovableHandleVariable):
    """The handle of a module forward (pre-)hook registered by residual bytecode."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(mutation_type=ValueMutationNew(), **kwargs)
        self.pending: PendingModuleHook | None = None

    def call_method(
        self,
        tx: "InstructionTranslatorBase",
        name: str,
        args: list[VariableTracker],
        kwargs: dict[str, VariableTracker],
    ) -> VariableTracker:
        if name == "remove" and not args and not kwargs:
            if self.idx != self.REMOVED:
                pending = tx.output.side_effects.module_hook_registrations
                for i, registration in enumerate(pending):
                    if registration.handle is self:
                        del pending[i]
                        break
                self.idx = self.REMOVED
            return ConstantVariable.create(None)
        _restart_with_eager_registration(tx, [self.pending], f"handle.{name}")

    def var_getattr(
        self, tx: "InstructionTranslatorBase", name: str
    ) -> VariableTracker:
        if name == "remove":
            return super().var_getattr(tx, name)
        _restart_with_eager_registration(tx, [self.pending], f"handle.{name}")


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


def _restart_with_eager_registration(
    tx: "InstructionTranslatorBase",
    pending: list[PendingModuleHook | None],
    what: str,
) -> NoReturn:
    """The frame reads state only a real registration has (the handle's id,
    the module's hook dicts outside Module.__call__): trace again, and break
    the graph at these registrations instead, so that they run eagerly."""
    sites = tx.speculation_log.module_hook_eager_sites
    new = {p.site for p in pending if p is not None} - sites
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
    sites.update(new)
    # The graph break changes which instructions are traced: rediscover them.
    tx.speculation_log.clear()
    raise RestartAnalysis(restart_reason=f"nn.Module hook registration: {what}")


def _guard_hook_dicts(module: "UnspecializedNNModuleVariable", kind: str) -> None:
    # Not EMPTY_NN_MODULE_HOOKS_DICT, which skip_nnmodule_hook_guards drops.
    for name in HOOK_DICTS[kind]:
        install_guard(
            AttrSource(module.source, name).make_guard(GuardBuilder.SEQUENCE_LENGTH)
        )


def _pending_for(
    tx: "InstructionTranslatorBase", module: VariableTracker
) -> list[PendingModuleHook]:
    value = getattr(module, "value", None)
    return [
        p
        for p in tx.output.side_effects.module_hook_registrations
        if p.module.value is value
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
    if site in tx.speculation_log.module_hook_eager_sites:
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
    handle = ModuleHookHandleVariable()
    pending = PendingModuleHook(module, args[0], kind, flags, handle, site)
    handle.pending = pending
    tx.output.side_effects.module_hook_registrations.append(pending)
    if id(module.value) in tx.output.module_hook_dicts_read:
        # The module was called earlier in the frame: the code traced there
        # assumes the hooks it had, which this registration changes.
        _guard_hook_dicts(module, kind)
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
) -> list[PendingModuleHook]:
    """Registrations pending in this frame that a read of the module's hook dict
    ``name`` must see (with_pending adds them); [] if there are none."""
    if module.source is None:
        return []
    tx.output.module_hook_dicts_read.add(id(module.value))
    pending = [p for p in _pending_for(tx, module) if name in HOOK_DICTS[p.kind]]
    if not pending:
        return []
    if not _allowed_reader(tx) or tx.output.side_effects.has_pending_mutation_of_attr(
        module, name
    ):
        _restart_with_eager_registration(
            tx, list(pending), f"{module.source.name}.{name}"
        )
    for kind in {p.kind for p in pending}:
        _guard_hook_dicts(module, kind)
    return pending


def with_pending(
    hooks_vt: "ConstDictVariable", name: str, pending: list[PendingModuleHook]
) -> "ConstDictVariable":
    """The hook dict as Module._call_impl must see it: the module's real hooks
    (hooks_vt, as UnspecializedNNModuleVariable.var_getattr builds it) with the
    pending ones added under their placeholder ids. It has no source: it is not
    the real dict."""
    if not pending:
        return hooks_vt
    items = dict(hooks_vt.items)
    is_main = all(name == HOOK_DICTS[p.kind][0] for p in pending)
    for p in pending:
        if is_main:
            entry = {ConstantVariable.create(p.key): p.hook}
        elif p.flags["with_kwargs"]:
            entry = {ConstantVariable.create(p.key): ConstantVariable.create(True)}
        else:
            continue
        if is_main and p.flags["prepend"]:
            items = {**entry, **items}
        else:
            items.update(entry)
    return hooks_vt.clone(items=items, source=None)


def codegen_registrations(
    registrations: list[PendingModuleHook], cg: "PyCodegen"
) -> None:
    for p in registrations:
        cg.add_push_null(lambda: cg.load_import_from(__name__, "register_residual"))
        cg(p.module)
        cg(p.hook)
        for value in (
            p.kind == FORWARD_PRE,
            p.flags["prepend"],
            p.flags["with_kwargs"],
            p.flags.get("always_call", False),
        ):
            cg(ConstantVariable.create(value))
        cg.extend_output(create_call_function(6, False))
        # Later uses of the handle (returned, stored, resume arguments) load it.
        cg.add_cache(p.handle)
