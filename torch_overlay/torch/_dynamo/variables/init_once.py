"""InitValuesOnceVariable: call an ``init_values_once`` function for real and guard its inputs.

The generalisation of what ``OptimizerVariable`` does for ``_init_group``: instead of
tracing a lazy initialiser, run it at trace time on the real objects, guard on the
inputs its decorator names (post-call state), and hand its results and the lists it
filled to the graph with sources, so tensors reachable from guarded inputs become graph
inputs guarded like any other. See ``torch/_dynamo/init_once.py`` for the contract.

Whenever the call cannot be made exactly equivalent to tracing, it is traced normally
(inlined) and the reason is logged: an argument with no real value at trace time or
that cannot be guarded, an input with pending mutations in the frame, a guarded input
without a source, a result that is not reachable from the guarded inputs, or a change
to a container the frame has already read that the frame's view cannot follow.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from collections.abc import Iterator
from typing import Any, TYPE_CHECKING

import torch

from .. import config
from ..init_once import GuardSpec, InitValuesOnceFunction
from ..source import (
    AttrSource,
    ConstDictKeySource,
    DictGetItemSource,
    GetItemSource,
    GradSource,
    Source,
)
from .base import ValueMutationNew, VariableTracker

if TYPE_CHECKING:
    from ..symbolic_convert import InstructionTranslatorBase


log = logging.getLogger(__name__)


class InlineInstead(Exception):
    """The call cannot be run for real soundly; trace it normally. The message says why."""


def _step_source(source: Source, kind: str, key: Any) -> Source:
    if kind == "attr":
        return AttrSource(source, key)
    return GetItemSource(source, key) if isinstance(key, int) else DictGetItemSource(source, key)


def _walk(value: Any, source: Source, seen: set[int]) -> Iterator[tuple[Any, Source]]:
    """Every node of `value`'s pytree (dicts, lists, tuples, dict keys, leaves), with
    the source Dynamo's VariableBuilder gives it; each container once, a leaf under
    every source it has. Depth first, a dict's key before its value; iterative, as a
    pytree can hold thousands of nodes."""
    from .constant import ConstantVariable

    stack = [(value, source)]
    while stack:
        value, source = stack.pop()
        if isinstance(value, (dict, list, tuple)):
            if id(value) in seen:
                continue
            seen.add(id(value))
        yield value, source
        if isinstance(value, dict):
            children: list[tuple[Any, Source]] = []
            # As VariableBuilder: keys are sources of their own unless all are constants.
            if all(ConstantVariable.is_literal(k) for k in value):
                children.extend((item, DictGetItemSource(source, key)) for key, item in value.items())
            else:
                for index, (key, item) in enumerate(value.items()):
                    key_source = ConstDictKeySource(source, index)
                    children.append((key, key_source))
                    children.append((item, DictGetItemSource(source, key_source)))
            stack.extend(reversed(children))
        elif isinstance(value, (list, tuple)):
            stack.extend((value[i], GetItemSource(source, i)) for i in reversed(range(len(value))))


def _containers(value: Any, seen: set[int]) -> Iterator[Any]:
    if id(value) in seen or not isinstance(value, (dict, list)):
        return
    seen.add(id(value))
    yield value
    for item in value.values() if isinstance(value, dict) else value:
        yield from _containers(item, seen)


def _snapshot(container: Any) -> list[Any]:
    """What a VariableTracker built earlier in the frame has captured of `container`."""
    return list(container.items()) if isinstance(container, dict) else list(container)


def _identities(container: Any, items: list[Any]) -> list[Any]:
    return [(id(k), id(v)) for k, v in items] if isinstance(container, dict) else [id(v) for v in items]


def _changed(container: Any, snapshot: list[Any]) -> bool:
    return _identities(container, _snapshot(container)) != _identities(container, snapshot)


def _restore(container: Any, snapshot: list[Any]) -> None:
    if isinstance(container, dict):
        container.clear()
        container.update(snapshot)
    else:
        container[:] = snapshot


def _appended_only(container: Any, snapshot: list[Any]) -> bool:
    """Whether `container` still starts with `snapshot`, item for item: what was there
    (and any source handed out for it, by key or by position) is unchanged."""
    before = _identities(container, snapshot)
    return _identities(container, _snapshot(container))[: len(before)] == before


def _pytree_sources(value: Any, source: Source, found: dict[int, tuple[Any, Source]]) -> None:
    """Add every object of `value`'s pytree to `found` with its source; the first
    source found (over all calls with the same `found`) wins."""
    for node, node_source in _walk(value, source, set()):
        found.setdefault(id(node), (node, node_source))


# Guards on a container itself that hold whatever items it has. Any other guard on it
# (keys, length, contains, equality, version) means the frame read which items it has.
_ITEM_INDEPENDENT_GUARDS = frozenset({"TYPE_MATCH", "ID_MATCH", "CLASS_MATCH"})


def _frame_read_items(tx: InstructionTranslatorBase, vt: VariableTracker) -> bool:
    """Whether the frame has read which items the container behind `vt` holds (its keys,
    length, membership): Dynamo guards every such read, on the container's source."""
    guards = tx.output.guards.source_to_guards.get(vt.source, ())
    return any(guard.create_fn_name() not in _ITEM_INDEPENDENT_GUARDS for guard in guards)


def _add_appended_items(
    tx: InstructionTranslatorBase, vt: VariableTracker, container: dict[Any, Any], snapshot: list[Any]
) -> None:
    """Extend the frame's VariableTracker of `container` (built when it held `snapshot`)
    with the items the call appended, lazily and with the sources VariableBuilder gives
    them, as if it had been built now."""
    from .constant import ConstantVariable
    from .hashable import HashableTracker
    from .lazy import LazyVariableTracker
    from .user_defined import UserDefinedDictVariable

    dict_vt = vt._base_vt if isinstance(vt, UserDefinedDictVariable) else vt
    source = vt.source
    for index, (key, value) in enumerate(container.items()):
        if index < len(snapshot):
            continue
        if ConstantVariable.is_literal(key):
            key_vt = ConstantVariable.create(key)
            item_key: Any = key
        else:
            # Keys without a constant value are found by position, as VariableBuilder does.
            tx.output.guard_on_key_order.add(source)
            item_key = ConstDictKeySource(source, index)
            key_vt = LazyVariableTracker.create(key, item_key, tx=tx)
        value_vt = LazyVariableTracker.create(value, DictGetItemSource(source, item_key), tx=tx)
        dict_vt.items[HashableTracker(key_vt)] = value_vt
        # Present in the real dict already: nothing for the frame to write back.
        dict_vt.original_items[key_vt] = value_vt


class _FrameView:
    """The containers reachable from the guarded inputs that the frame already has a
    view of: a VariableTracker it built (and maybe guarded or specialised on), or
    sources an earlier init_values_once call of this frame handed to the graph."""

    def __init__(self, tx: InstructionTranslatorBase, roots: list[tuple[GuardSpec, Any, Source]]) -> None:
        side_effects = tx.output.side_effects
        handed_out = _handed_out(tx)
        seen: set[int] = set()
        self.entries = [
            (c, _snapshot(c), side_effects.id_to_variable.get(id(c)), handed_out.get(id(c), (None,))[0] is c)
            for _, value, _ in roots
            for c in _containers(value, seen)
            if c in side_effects or handed_out.get(id(c), (None,))[0] is c
        ]

    def restore(self) -> None:
        """Undo the call's changes to these containers."""
        for container, snapshot, _, _ in self.entries:
            if _changed(container, snapshot):
                _restore(container, snapshot)

    def reconcile(self, tx: InstructionTranslatorBase) -> None:
        """After the call: bring the frame's views of what it changed up to date, or
        undo the changes and refuse when a view cannot follow them soundly."""
        changed = [entry for entry in self.entries if _changed(entry[0], entry[1])]
        reasons = [reason for entry in changed if (reason := self._cannot_follow(tx, *entry))]
        if reasons:
            # The frame's views (and any guards or specialisation on them) describe the
            # pre-call state. Put the containers back and trace the function instead; by
            # the contract, what else it did is idempotent initialisation.
            self.restore()
            raise InlineInstead(
                f"it changed {len(changed)} container(s) the frame had already read (first: {reasons[0]})"
            )
        for container, snapshot, vt, _ in changed:
            if vt is not None:
                _add_appended_items(tx, vt, container, snapshot)

    @staticmethod
    def _cannot_follow(
        tx: InstructionTranslatorBase,
        container: Any,
        snapshot: list[Any],
        vt: VariableTracker | None,
        handed_out: bool,
    ) -> str | None:
        kind = type(container).__name__
        if (vt is not None or handed_out) and not _appended_only(container, snapshot):
            return f"a {kind} whose items it replaced or removed"
        if vt is None:
            return None  # sources handed out earlier still name the same objects
        # Guards are built from the real objects once the frame is traced, so any the
        # frame installed on this container check its post-call state; what the frame
        # computed from its pre-call items would be reused for the post-call state.
        if not isinstance(container, dict):
            return f"a {kind} the frame holds (its length is guarded)"
        from .dicts import ConstDictVariable
        from .user_defined import UserDefinedDictVariable

        if not isinstance(vt, (ConstDictVariable, UserDefinedDictVariable)):
            return f"a {kind} the frame holds as a {type(vt).__name__}"
        if vt.source is None or tx.output.side_effects.is_modified(vt) or _frame_read_items(tx, vt):
            return f"a {kind} whose keys, length or membership the frame already read"
        return None


# Per OutputGraph (by id, dropped with it): the containers reachable from the guarded
# inputs of the init_values_once calls it made, with their post-call items.
_HANDED_OUT: dict[int, dict[int, tuple[Any, list[Any]]]] = {}


def _handed_out(tx: InstructionTranslatorBase) -> dict[int, tuple[Any, list[Any]]]:
    key = id(tx.output)
    if key not in _HANDED_OUT:
        _HANDED_OUT[key] = {}
        # Gone once the graph is compiled, or with the OutputGraph if it never is.
        tx.output.add_cleanup_hook(lambda: _HANDED_OUT.pop(key, None))
        weakref.finalize(tx.output, _HANDED_OUT.pop, key, None)
    return _HANDED_OUT[key]


@contextlib.contextmanager
def _guards_only(tx: InstructionTranslatorBase, roots: list[tuple[GuardSpec, Any, Source]]) -> Iterator[None]:
    """The VariableTrackers built inside for containers the frame had no view of serve
    the guards only: forget them afterwards (tensors stay: they are graph inputs), so a
    later read of such a container builds a view of its state then, and a later call
    that appends to it does not meet a stale view."""
    from .lazy import LazyVariableTracker

    side_effects = tx.output.side_effects
    cache = tx.output.variable_tracker_cache
    before = set(side_effects.id_to_variable)
    lazy_before = [vt for vt in cache.values() if isinstance(vt, LazyVariableTracker) and not vt.is_realized()]
    yield
    seen: set[int] = set()
    containers = {id(c): c for _, value, _ in roots for c in _containers(value, seen)}
    # A new container VariableTracker stays if the frame can reach it: it realizes a
    # LazyVariableTracker the frame already had (VariableTracker.build hands out the
    # cached one for a source), or one the frame had holds it (realize_all filled that
    # one's lazy items with it).
    realized = {id(vt.unwrap()) for vt in lazy_before if vt.is_realized()}
    pending = [
        c
        for key, c in containers.items()
        if key in before or id(side_effects.id_to_variable.get(key)) in realized
    ]
    reachable = {id(c) for c in pending}
    while pending:
        container = pending.pop()
        for item in container.values() if isinstance(container, dict) else container:
            if isinstance(item, (dict, list)) and id(item) not in reachable:
                reachable.add(id(item))
                pending.append(item)
    drop = {
        key: side_effects.id_to_variable[key]
        for key in containers
        if key not in before and key not in reachable and key in side_effects.id_to_variable
    }
    if not drop:
        return
    dropped = {id(vt) for vt in drop.values()}
    for key in drop:
        del side_effects.id_to_variable[key]
    for source, vt in list(cache.items()):
        if isinstance(vt, LazyVariableTracker):
            if not vt.is_realized():
                continue
            vt = vt.unwrap()
        if id(vt) in dropped:
            del cache[source]


class InitValuesOnceVariable(VariableTracker):
    """A call of a function decorated with ``torch._dynamo.init_values_once``.

    Subclasses specialise the steps (OptimizerInitGroupVariable for torch.optim):
    ``_before_call``, ``_real_arguments``, ``_check_no_pending_mutations``,
    ``_guard_arguments``, ``_install_guards``, ``_wrap_tensor``, ``_run`` and ``_after_call``.
    """

    def __init__(self, entry: InitValuesOnceFunction, fn_vt: VariableTracker, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entry = entry
        self.fn_vt = fn_vt  # the UserFunctionVariable to inline when we cannot run it

    def python_type(self) -> type:
        return type(self.entry.fn)

    def call_function(
        self,
        tx: InstructionTranslatorBase,
        args: list[VariableTracker],
        kwargs: dict[str, VariableTracker],
    ) -> VariableTracker:
        try:
            return self._call_and_guard(tx, self._bind(args, kwargs))
        except InlineInstead as reason:
            log.info("init_values_once: tracing %s normally: %s", self.entry.fn.__qualname__, reason)
            return tx.inline_user_function_return(self.fn_vt, args, kwargs)

    # -- steps a subclass may specialise ---------------------------------------

    def _before_call(self, tx: InstructionTranslatorBase) -> None:
        pass

    def _after_call(self, tx: InstructionTranslatorBase) -> None:
        pass

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The real call of the function."""
        return self.entry.fn(*args, **kwargs)

    def _real_arguments(
        self,
        tx: InstructionTranslatorBase,
        bound_vts: dict[str, VariableTracker],
        filled_lists: list[tuple[VariableTracker, list[Any], list[Any]]],
    ) -> dict[str, Any]:
        """The real Python value of every argument; lists made in the frame for the
        function to fill are recorded in `filled_lists` (vt, before, after), as are the
        copies of dicts made in the frame (vt, items before, copy)."""
        real = {}
        for name, vt in bound_vts.items():
            kind = self.entry.signature.parameters[name].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise InlineInstead(f"*args/**kwargs parameter {name!r} is not supported")
            real[name] = self._real_value(tx, name, vt, filled_lists)
        return real

    # -- steps --------------------------------------------------------------

    def _bind(
        self, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
    ) -> dict[str, VariableTracker]:
        """The arguments by parameter name, as the call binds them."""
        try:
            return self.entry.signature.bind(*args, **kwargs).arguments
        except TypeError as e:
            raise InlineInstead(f"arguments do not match the signature ({e})") from None

    def _call_and_guard(
        self, tx: InstructionTranslatorBase, arguments: dict[str, VariableTracker]
    ) -> VariableTracker:
        self._before_call(tx)
        filled_lists: list[tuple[VariableTracker, list[Any], list[Any]]] = []
        real = self._real_arguments(tx, arguments, filled_lists)
        roots = self._guarded_roots(tx, arguments, real)
        self._check_no_pending_mutations(tx, roots)
        self._guard_arguments(tx, arguments, roots)
        view = _FrameView(tx, roots)

        call = self.entry.signature.bind_partial()
        call.arguments.update(real)
        try:
            result = self._run(call.args, call.kwargs)
        except Exception as e:
            view.restore()
            raise InlineInstead(f"it raised {type(e).__name__}: {e}") from None
        view.reconcile(tx)
        for _, before, after in filled_lists:
            if isinstance(after, dict) and _changed(after, before):
                raise InlineInstead("it changed a dict made in the frame, which it is passed a copy of")
        filled_lists = [entry for entry in filled_lists if isinstance(entry[2], list)]

        with _guards_only(tx, roots):
            tensor_sources = self._install_guards(tx, roots)
        # What the call returned or put into the frame's lists, by identity: the
        # arguments' own VariableTrackers, then anything reachable from a guarded input
        # (with its source, so the frame's later mutations reach the real object).
        known: dict[int, VariableTracker | Source] = {}
        for name, vt in arguments.items():
            known.setdefault(id(real[name]), vt)
        for list_vt, _, after in filled_lists:
            known[id(after)] = list_vt
        reachable: dict[int, tuple[Any, Source]] = {}
        for _, value, source in roots:
            _pytree_sources(value, source, reachable)
        for key, (_, source) in reachable.items():
            known.setdefault(key, source)
        # Wrap everything before changing any list, so a refusal leaves the frame as it was.
        filled = [
            (
                list_vt,
                [
                    list_vt.items[i]
                    if i < len(before) and item is before[i]
                    else self._wrap(tx, item, tensor_sources, known)
                    for i, item in enumerate(after)
                ],
            )
            for list_vt, before, after in filled_lists
        ]
        result_vt = self._wrap(tx, result, tensor_sources, known)
        for list_vt, items in filled:
            tx.output.side_effects.mutation(list_vt)
            list_vt.items[:] = items
        handed_out = _handed_out(tx)
        seen: set[int] = set()
        for _, value, _ in roots:
            for container in _containers(value, seen):
                handed_out[id(container)] = (container, _snapshot(container))
        self._after_call(tx)
        return result_vt

    def _real_value(
        self,
        tx: InstructionTranslatorBase,
        name: str,
        vt: VariableTracker,
        filled_lists: list[tuple[VariableTracker, list[Any], list[Any]]],
    ) -> Any:
        from .lazy import LazyVariableTracker
        from .lists import ListVariable

        if isinstance(vt, LazyVariableTracker):
            if not vt.is_realized() and vt.source is not None:
                # Not looked at yet in this frame: realizing it later reads the
                # post-call state. _guard_arguments guards it.
                return vt.peek_value()
            vt = vt.unwrap()
        if type(vt) is ListVariable and vt.source is None and isinstance(vt.mutation_type, ValueMutationNew):
            # A list made in this frame for the function to fill: pass a real list
            # and mirror what the function put into it.
            before = [self._real_value(tx, f"{name}[{i}]", item, filled_lists) for i, item in enumerate(vt.items)]
            after = list(before)
            filled_lists.append((vt, before, after))
            return after
        if vt.source is not None:
            # The object itself, not a copy: the function may fill it.
            if tx.output.side_effects.is_modified(vt):
                raise InlineInstead(f"argument {name!r} has pending mutations in the frame")
            return tx.output.resolve_source_value(vt.source)
        if vt.is_python_constant() and not isinstance(vt, ListVariable):
            value = vt.as_python_constant()
            if isinstance(value, dict):
                # A dict made in this frame: the function gets a copy, so it must not change it.
                filled_lists.append((vt, _snapshot(value), value))
            return value
        raise InlineInstead(f"argument {name!r} ({type(vt).__name__}) has no real value at trace time")

    def _guard_arguments(
        self,
        tx: InstructionTranslatorBase,
        bound_vts: dict[str, VariableTracker],
        roots: list[tuple[GuardSpec, Any, Source]],
    ) -> None:
        """Guard what the call depends on besides its guarded inputs: the arguments the
        frame got from outside (with a source) that no guard spec names. The compiled
        code does not call the function again while its guards pass, so each must be
        the same on a later call: constants by value (CONSTANT_MATCH), tensors by
        metadata (the contract: the function reads nothing else of them), any other
        object by identity (ID_MATCH). A list, dict or set from outside may be read
        item by item or filled by the function: it is covered when it is an object the
        guarded inputs reach (``group`` from ``for group in self.param_groups``), whose
        guards check its items; otherwise the call is traced."""
        named = {spec.root for spec in self.entry.guards}
        covered: dict[int, tuple[Any, Source]] = {}
        for _, value, source in roots:
            _pytree_sources(value, source, covered)
        for name, vt in bound_vts.items():
            kind = self.entry.signature.parameters[name].kind
            if name in named or kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            self._guard_argument(tx, name, vt, covered)

    def _guard_argument(
        self,
        tx: InstructionTranslatorBase,
        name: str,
        vt: VariableTracker,
        covered: dict[int, tuple[Any, Source]],
    ) -> None:
        from ..guards import GuardBuilder, install_guard
        from .constant import ConstantVariable
        from .lazy import LazyVariableTracker
        from .lists import ListVariable

        if isinstance(vt, LazyVariableTracker) and vt.is_realized():
            vt = vt.unwrap()
        if type(vt) is ListVariable and vt.source is None:
            for i, item in enumerate(vt.items):
                self._guard_argument(tx, f"{name}[{i}]", item, covered)
            return
        source = vt.source
        if source is None:
            return  # made in the frame: the trace itself specialises on it
        value = tx.output.resolve_source_value(source)
        if isinstance(value, torch.Tensor):
            LazyVariableTracker.realize_all(vt)
        elif isinstance(value, (dict, list)):
            if id(value) in covered:
                self._guard_alias_of_guarded_input(name, source, covered[id(value)][1])
                return
            specs = ", ".join(repr(spec.text) for spec in self.entry.guards)
            raise InlineInstead(
                f"argument {name!r} ({source.name}) is a {type(value).__name__} from outside the frame "
                f"that the guarded inputs [{specs}] do not reach (the function may read or fill it); "
                f"name it in guards=[...] (e.g. {name!r}) to cover it"
            )
        elif isinstance(value, set):
            # A leaf of the guarded pytree, even when reachable: its items are not guarded.
            raise InlineInstead(
                f"argument {name!r} ({source.name}) is a set from outside the frame (the function may read "
                "or fill it, and guards do not cover a set's items)"
            )
        elif ConstantVariable.is_literal(value):
            install_guard(source.make_guard(GuardBuilder.CONSTANT_MATCH))
        else:
            install_guard(source.make_guard(GuardBuilder.ID_MATCH))

    @staticmethod
    def _guard_alias_of_guarded_input(name: str, source: Source, guarded: Source) -> None:
        """Argument `name` is an object a guarded input reaches under `guarded`, whose
        guards check its type and items. Reached by the same path (``group`` iterated
        from ``self.param_groups``) it needs nothing more; under another name (a global
        alias) it must stay that same object on later calls."""
        from ..guards import GuardBuilder, install_guard, make_dupe_guard
        from ..source import is_from_optimizer_source, is_from_skip_guard_source

        if source == guarded:
            return
        dupe = make_dupe_guard(source, guarded)
        # DUPLICATE_INPUT installs nothing under an optimizer or skip-guard source.
        skipped = any(is_from_optimizer_source(s) or is_from_skip_guard_source(s) for s in (source, guarded))
        if dupe is not None and not skipped:
            install_guard(source.make_guard(dupe))
        else:
            # One local and one global source (make_dupe_guard cannot pair them), or
            # an aliasing guard that would not be installed: pin both to the object.
            log.debug("init_values_once: argument %r pinned by identity, with %s", name, guarded.name)
            install_guard(source.make_guard(GuardBuilder.ID_MATCH), guarded.make_guard(GuardBuilder.ID_MATCH))

    def _guarded_roots(
        self, tx: InstructionTranslatorBase, bound_vts: dict[str, VariableTracker], real: dict[str, Any]
    ) -> list[tuple[GuardSpec, Any, Source]]:
        roots = []
        for spec in self.entry.guards:
            vt = bound_vts.get(spec.root)
            if vt is None:
                param = self.entry.signature.parameters[spec.root]
                raise InlineInstead(f"guarded parameter {spec.root!r} was not passed (default {param.default!r})")
            vt = vt.unwrap()
            if vt.source is None:
                raise InlineInstead(f"guarded input {spec.text!r} has no source to guard on")
            source = vt.source
            for kind, key in spec.path:
                source = _step_source(source, kind, key)
            try:
                value = spec.resolve(real[spec.root])
            except (AttributeError, KeyError, IndexError, TypeError) as e:
                raise InlineInstead(f"guard {spec.text!r} does not resolve ({type(e).__name__}: {e})") from None
            roots.append((spec, value, source))
        # Lists first: a tensor reachable both from a list and as a dict key (a
        # parameter in param_groups and in state) is then built from the list, and
        # the key gets an `is` guard against that item instead of an ID_MATCH.
        def order(root: tuple[GuardSpec, Any, Source]) -> int:
            value = root[1]
            if isinstance(value, dict) and any(isinstance(k, torch.Tensor) for k in value):
                return 2
            return 0 if isinstance(value, (list, tuple)) else 1

        roots.sort(key=order)
        return roots

    def _check_no_pending_mutations(
        self, tx: InstructionTranslatorBase, roots: list[tuple[GuardSpec, Any, Source]]
    ) -> None:
        """The function runs on the real objects, which do not have the frame's pending
        mutations yet. Found by identity: the frame may have mutated an object under
        any name (a global alias, another argument), not only under a guard's source."""
        side_effects = tx.output.side_effects
        reachable: dict[int, tuple[Any, Source]] = {}
        for spec, value, source in roots:
            # The objects a spec's path goes through: the attribute or item it takes.
            base = source
            steps = []
            for _ in spec.path:
                steps.append(base)
                base = base.base  # type: ignore[attr-defined]
            obj = tx.output.resolve_source_value(base)
            for (kind, key), step_source in zip(spec.path, reversed(steps)):
                vt = side_effects.id_to_variable.get(id(obj))
                if vt is not None and (
                    side_effects.has_pending_mutation_of_attr(vt, key)
                    if kind == "attr"
                    else side_effects.is_modified(vt)
                ):
                    raise InlineInstead(f"{step_source.name} has pending mutations in the frame")
                obj = getattr(obj, key) if kind == "attr" else obj[key]
            _pytree_sources(value, source, reachable)
        for key, (_, source) in reachable.items():
            vt = side_effects.id_to_variable.get(key)
            if vt is not None and side_effects.is_modified(vt):
                alias = "" if vt.source is None or vt.source == source else f" (as {vt.source.name})"
                raise InlineInstead(f"{source.name} has pending mutations in the frame{alias}")

    def _install_guards(
        self, tx: InstructionTranslatorBase, roots: list[tuple[GuardSpec, Any, Source]]
    ) -> dict[int, Source]:
        """Guard every named input (post-call state) pytree-style, whether or not the
        frame reads it later: the function may have iterated any of it. Return the
        source of each tensor."""
        from ..guards import GuardBuilder, install_guard
        from .lazy import LazyVariableTracker

        tensor_sources: dict[int, Source] = {}
        tensors: dict[int, tuple[torch.Tensor, GuardSpec]] = {}
        for spec, value, source in roots:
            with _label_guards(tx, self.entry, spec):
                for node, node_source in _walk(value, source, set()):
                    if type(node) in (dict, list, tuple):
                        # Guarded directly: a VariableTracker of the container (and a
                        # LazyVariableTracker per item) would only serve these guards.
                        install_guard(node_source.make_guard(GuardBuilder.TYPE_MATCH))
                    else:
                        # A leaf (tensor metadata, a constant's value, an `is` guard for
                        # an object reachable twice), or a container of another type,
                        # guarded as VariableBuilder guards it. A tensor's VariableTracker
                        # holds nothing lazy: only other leaves need realize_all.
                        vt = VariableTracker.build(tx, node, node_source, realize=True)
                        if not isinstance(node, torch.Tensor):
                            LazyVariableTracker.realize_all(vt)
                    if isinstance(node, dict):
                        _guard_dict_keys(tx, node, node_source)
                    elif isinstance(node, (list, tuple)):
                        install_guard(node_source.make_guard(GuardBuilder.SEQUENCE_LENGTH))
                    elif isinstance(node, torch.Tensor):
                        known = tensor_sources.get(id(node))
                        if known is None or (known.is_dict_key() and not node_source.is_dict_key()):
                            # A dict key is matched by identity: prefer any other source.
                            tensor_sources[id(node)] = node_source
                            tensors[id(node)] = (node, spec)
        # Grads once every tensor has its preferred source; one label per spec.
        by_spec: dict[int, list[torch.Tensor]] = {}
        for tensor, spec in tensors.values():
            by_spec.setdefault(id(spec), []).append(tensor)
        for spec, _, _ in roots:
            if id(spec) not in by_spec:
                continue
            with _label_guards(tx, self.entry, spec):
                for tensor in by_spec.pop(id(spec)):
                    self._guard_grad(tx, tensor, tensor_sources[id(tensor)], tensor_sources)
        return tensor_sources

    @staticmethod
    def _guard_grad(
        tx: InstructionTranslatorBase,
        tensor: torch.Tensor,
        source: Source,
        tensor_sources: dict[int, Source],
    ) -> None:
        """Guard grad presence, and the grad's metadata when present: of every tensor
        (``.grad`` can be set on one that does not require grad), also under a dict-key
        source, where only the key is matched by identity: a grad (GradSource) gets
        TENSOR_MATCH like any other (``match_on_id_for_tensor``)."""
        from ..guards import GuardBuilder, install_guard

        grad_source = GradSource(source, "grad")
        if tensor.grad is None:
            install_guard(grad_source.make_guard(GuardBuilder.CONSTANT_MATCH))
        else:
            # Presence first, so a grad set to None fails here, with the spec's label,
            # rather than in TENSOR_MATCH, whose reason carries no label.
            install_guard(grad_source.make_guard(GuardBuilder.NOT_NONE_MATCH))
            VariableTracker.build(tx, tensor.grad, grad_source, realize=True)
            tensor_sources.setdefault(id(tensor.grad), grad_source)

    def _wrap_tensor(
        self, tx: InstructionTranslatorBase, tensor: torch.Tensor, tensor_sources: dict[int, Source]
    ) -> VariableTracker:
        source = tensor_sources.get(id(tensor))
        if source is None:
            # Nothing the guards cover holds it: on a later call the compiled code would
            # need the tensor without calling the function, and eager would get a new one.
            raise InlineInstead(
                f"it returned a tensor {tuple(tensor.shape)} that is not reachable from its guarded "
                "inputs or arguments (store it in a guarded input to reuse it)"
            )
        return VariableTracker.build(tx, tensor, source)

    def _wrap(
        self,
        tx: InstructionTranslatorBase,
        value: Any,
        tensor_sources: dict[int, Source],
        known: dict[int, VariableTracker | Source],
    ) -> VariableTracker:
        """A VariableTracker for something the function returned or put into a list."""
        from .builder import SourcelessBuilder
        from .constant import ConstantVariable
        from .lists import ListVariable, TupleVariable

        if ConstantVariable.is_literal(value) and not isinstance(value, (list, set)):
            return ConstantVariable.create(value)
        found = known.get(id(value))
        if isinstance(found, VariableTracker):
            return found
        if isinstance(value, torch.Tensor):
            return self._wrap_tensor(tx, value, tensor_sources)
        if found is not None:
            # Reachable from a guarded input: the real object, not a copy.
            return VariableTracker.build(tx, value, found)
        if type(value) is list:
            items = [self._wrap(tx, v, tensor_sources, known) for v in value]
            return ListVariable(items, mutation_type=ValueMutationNew())
        if type(value) is tuple:
            return TupleVariable([self._wrap(tx, v, tensor_sources, known) for v in value])
        if isinstance(value, (dict, set)):
            raise InlineInstead(f"it returned a {type(value).__name__} that is not reachable from its guarded inputs")
        try:
            return SourcelessBuilder.create(tx, value)
        except Exception:
            raise InlineInstead(f"it returned a {type(value).__name__}, which has no source") from None


def _guard_dict_keys(tx: InstructionTranslatorBase, value: dict[Any, Any], source: Source) -> None:
    """A dict's keys and their order, as tracing an iteration over it guards them."""
    from ..guards import GuardBuilder, install_guard

    tx.output.guard_on_key_order.add(source)
    if value and all(isinstance(k, torch.Tensor) for k in value):
        # Already guarded: with its key order guarded the dict's node is a
        # DictGuardManager, which checks the length, and each key, built from its
        # ConstDictKeySource, has an identity guard (ID_MATCH, or `is` against the same
        # tensor's other source). DICT_KEYS_MATCH would add a second ID_MATCH per key.
        return
    install_guard(source.make_guard(GuardBuilder.DICT_KEYS_MATCH))


@contextlib.contextmanager
def _label_guards(tx: InstructionTranslatorBase, entry: InitValuesOnceFunction, spec: GuardSpec) -> Iterator[None]:
    """Guards installed inside get a user stack that ends in a call of the function,
    named `init_values_once[<spec>] of <function>`, so TORCH_LOGS=guards and recompile
    reasons say which spec they came from. The frame is pushed with
    TracingContext.current_frame, as inlining a call pushes its caller's frame; the
    caller's own location stays on the stack above it."""
    import traceback

    from torch._guards import TracingContext

    code = entry.fn.__code__
    callee = traceback.FrameSummary(
        code.co_filename,
        code.co_firstlineno,
        f"init_values_once[{spec.text}] of {entry.fn.__qualname__}",
        lookup_line=False,
    )
    with TracingContext.current_frame(tx.frame_summary()), TracingContext.current_frame(callee):
        yield


def maybe_init_values_once_variable(fn: Any) -> InitValuesOnceVariable | None:
    """The VariableTracker to call instead of inlining `fn`, if it is marked.
    Called for every traced user function call, so the common case is one dict lookup."""
    from ..init_once import lookup_init_values_once

    entry = lookup_init_values_once(fn)
    if entry is None or not config.init_values_once:
        return None
    from .functions import UserFunctionVariable

    return InitValuesOnceVariable(entry, UserFunctionVariable(fn))
