"""InitValuesOnceVariable: call an ``init_values_once`` function for real and guard its inputs.

The generalisation of what ``OptimizerVariable`` does for ``_init_group``: instead of
tracing a lazy initialiser, run it at trace time on the real objects, guard on the
inputs its decorator names (post-call state), and hand its results and the lists it
filled to the graph with sources, so tensors reachable from guarded inputs become graph
inputs guarded like any other. See ``torch/_dynamo/init_once.py`` for the contract.

Whenever the call cannot be made exactly equivalent to tracing, it is traced normally
(inlined) and the reason is logged: an argument with no real value at trace time, an
input with pending mutations in the frame, a guarded input without a source, or a
container the frame already holds a view of that the call changed.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
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
    GlobalWeakRefSource,
    GradSource,
    Source,
)
from ..utils import GLOBAL_KEY_PREFIX
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
    every source it has."""
    from .constant import ConstantVariable

    if isinstance(value, (dict, list, tuple)):
        if id(value) in seen:
            return
        seen.add(id(value))
    yield value, source
    if isinstance(value, dict):
        # As VariableBuilder: keys are sources of their own unless all are constants.
        const_keys = all(ConstantVariable.is_literal(k) for k in value)
        for index, (key, item) in enumerate(value.items()):
            if const_keys:
                item_key = key
            else:
                item_key = ConstDictKeySource(source, index)
                yield from _walk(key, item_key, seen)
            yield from _walk(item, DictGetItemSource(source, item_key), seen)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _walk(item, GetItemSource(source, index), seen)


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


def _changed(container: Any, snapshot: list[Any]) -> bool:
    now = _snapshot(container)
    if isinstance(container, dict):
        return [(id(k), id(v)) for k, v in now] != [(id(k), id(v)) for k, v in snapshot]
    return [id(v) for v in now] != [id(v) for v in snapshot]


def _restore(container: Any, snapshot: list[Any]) -> None:
    if isinstance(container, dict):
        container.clear()
        container.update(snapshot)
    else:
        container[:] = snapshot


class InitValuesOnceVariable(VariableTracker):
    """A call of a function decorated with ``torch._dynamo.init_values_once``.

    Subclasses specialise the steps (OptimizerInitGroupVariable for torch.optim):
    ``_before_call``, ``_real_arguments``, ``_check_no_pending_mutations``,
    ``_install_guards``, ``_wrap_tensor`` and ``_after_call``.
    """

    def __init__(self, entry: InitValuesOnceFunction, fn_vt: VariableTracker, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entry = entry
        self.fn_vt = fn_vt  # the UserFunctionVariable to inline when we cannot run it

    def python_type(self) -> type:
        return type(self.entry.fn)

    def call_function(
        self,
        tx: "InstructionTranslatorBase",
        args: list[VariableTracker],
        kwargs: dict[str, VariableTracker],
    ) -> VariableTracker:
        try:
            return self._call_and_guard(tx, args, kwargs)
        except InlineInstead as reason:
            log.debug("init_values_once: tracing %s normally: %s", self.entry.fn.__qualname__, reason)
            return tx.inline_user_function_return(self.fn_vt, args, kwargs)

    # -- steps a subclass may specialise ---------------------------------------

    def _before_call(self, tx: "InstructionTranslatorBase") -> None:
        pass

    def _after_call(self, tx: "InstructionTranslatorBase") -> None:
        pass

    def _real_arguments(
        self,
        tx: "InstructionTranslatorBase",
        bound_vts: dict[str, VariableTracker],
        filled_lists: list[tuple[VariableTracker, list[Any], list[Any]]],
    ) -> dict[str, Any]:
        """The real Python value of every argument; lists made in the frame for the
        function to fill are recorded in `filled_lists` (vt, before, after)."""
        real = {}
        for name, vt in bound_vts.items():
            kind = self.entry.signature.parameters[name].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise InlineInstead(f"*args/**kwargs parameter {name!r} is not supported")
            real[name] = self._real_value(tx, name, vt, filled_lists)
        return real

    # -- steps --------------------------------------------------------------

    def _call_and_guard(
        self,
        tx: "InstructionTranslatorBase",
        args: list[VariableTracker],
        kwargs: dict[str, VariableTracker],
    ) -> VariableTracker:
        try:
            bound = self.entry.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise InlineInstead(f"arguments do not match the signature ({e})") from None
        self._before_call(tx)
        filled_lists: list[tuple[VariableTracker, list[Any], list[Any]]] = []
        real = self._real_arguments(tx, bound.arguments, filled_lists)
        roots = self._guarded_roots(tx, bound.arguments, real)
        self._check_no_pending_mutations(tx, roots)
        # Containers the frame already holds VariableTrackers (and maybe guards) for.
        already_seen = {
            id(c): (c, _snapshot(c))
            for _, value, _ in roots
            for c in _containers(value, set())
            if c in tx.output.side_effects
        }

        call = self.entry.signature.bind_partial()
        call.arguments.update(real)
        try:
            result = self.entry.fn(*call.args, **call.kwargs)
        except Exception as e:
            raise InlineInstead(f"it raised {type(e).__name__}: {e}") from None

        changed = [(c, snap) for c, snap in already_seen.values() if _changed(c, snap)]
        if changed:
            # Those VariableTrackers (and any guards on them) describe the pre-call
            # state. Put the containers back and trace the function instead; by the
            # contract, what else it did is idempotent initialisation.
            for container, snapshot in changed:
                _restore(container, snapshot)
            raise InlineInstead(
                f"it changed {len(changed)} container(s) the frame had already read "
                f"(first: a {type(changed[0][0]).__name__})"
            )

        tensor_sources = self._install_guards(tx, roots)
        for list_vt, before, after in filled_lists:
            tx.output.side_effects.mutation(list_vt)
            items = [
                list_vt.items[i] if i < len(before) and item is before[i] else self._wrap(tx, item, tensor_sources)
                for i, item in enumerate(after)
            ]
            list_vt.items[:] = items
        self._after_call(tx)
        return self._wrap(tx, result, tensor_sources)

    def _real_value(
        self,
        tx: "InstructionTranslatorBase",
        name: str,
        vt: VariableTracker,
        filled_lists: list[tuple[VariableTracker, list[Any], list[Any]]],
    ) -> Any:
        from .lazy import LazyVariableTracker
        from .lists import ListVariable

        if isinstance(vt, LazyVariableTracker):
            if not vt.is_realized() and vt.source is not None:
                # Not looked at yet in this frame: no guards on its pre-call state,
                # and realizing it later reads the post-call state.
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
            return vt.as_python_constant()
        raise InlineInstead(f"argument {name!r} ({type(vt).__name__}) has no real value at trace time")

    def _guarded_roots(
        self, tx: "InstructionTranslatorBase", bound_vts: dict[str, VariableTracker], real: dict[str, Any]
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
        self, tx: "InstructionTranslatorBase", roots: list[tuple[GuardSpec, Any, Source]]
    ) -> None:
        guarded = [source.name for _, _, source in roots]
        for vt in list(tx.output.side_effects.id_to_variable.values()):
            if vt.source is None or not tx.output.side_effects.is_modified(vt):
                continue
            try:
                name = vt.source.name
            except NotImplementedError:  # sources with no Python expression
                continue
            for root in guarded:
                if name == root or name.startswith((root + ".", root + "[")) or root.startswith((name + ".", name + "[")):
                    raise InlineInstead(f"{name} has pending mutations in the frame")

    def _install_guards(
        self, tx: "InstructionTranslatorBase", roots: list[tuple[GuardSpec, Any, Source]]
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
                # Types, tensor metadata, values of leaves, and `is` guards for objects
                # reachable twice.
                LazyVariableTracker.realize_all(VariableTracker.build(tx, value, source))
                for node, node_source in _walk(value, source, set()):
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
        # Grads once every tensor has its preferred source.
        for tensor, spec in tensors.values():
            with _label_guards(tx, self.entry, spec):
                self._guard_grad(tx, tensor, tensor_sources[id(tensor)], tensor_sources)
        return tensor_sources

    @staticmethod
    def _guard_grad(
        tx: "InstructionTranslatorBase",
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
            VariableTracker.build(tx, tensor.grad, grad_source).realize()
            tensor_sources.setdefault(id(tensor.grad), grad_source)

    def _wrap_tensor(
        self, tx: "InstructionTranslatorBase", tensor: torch.Tensor, tensor_sources: dict[int, Source]
    ) -> VariableTracker:
        source = tensor_sources.get(id(tensor))
        if source is None:
            # Not reachable from a guarded input: keep it alive through a weak
            # global, guarded on identity, as OptimizerVariable does.
            source = GlobalWeakRefSource(tx.store_global_weakref_by_id(GLOBAL_KEY_PREFIX, tensor))
        return VariableTracker.build(tx, tensor, source)

    def _wrap(self, tx: "InstructionTranslatorBase", value: Any, tensor_sources: dict[int, Source]) -> VariableTracker:
        """A VariableTracker for something the function returned or put into a list."""
        from .builder import SourcelessBuilder
        from .constant import ConstantVariable
        from .lists import ListVariable, TupleVariable

        if isinstance(value, torch.Tensor):
            return self._wrap_tensor(tx, value, tensor_sources)
        if ConstantVariable.is_literal(value):
            return ConstantVariable.create(value)
        if type(value) is list:
            return ListVariable([self._wrap(tx, v, tensor_sources) for v in value], mutation_type=ValueMutationNew())
        if type(value) is tuple:
            return TupleVariable([self._wrap(tx, v, tensor_sources) for v in value])
        try:
            return SourcelessBuilder.create(tx, value)
        except Exception:
            raise InlineInstead(f"it returned a {type(value).__name__}, which has no source") from None


def _guard_dict_keys(tx: "InstructionTranslatorBase", value: dict[Any, Any], source: Source) -> None:
    """A dict's keys and their order, as tracing an iteration over it guards them."""
    from ..guards import GuardBuilder, install_guard

    tx.output.guard_on_key_order.add(source)
    if value and all(isinstance(k, torch.Tensor) for k in value):
        # Already guarded: with its key order guarded the dict's node is a
        # DictGuardManager, which checks the length, and realizing the dict gave each
        # key an identity guard (ID_MATCH, or `is` against the same tensor's other
        # source). DICT_KEYS_MATCH would add a second ID_MATCH per key.
        return
    install_guard(source.make_guard(GuardBuilder.DICT_KEYS_MATCH))


@contextlib.contextmanager
def _label_guards(tx: "InstructionTranslatorBase", entry: InitValuesOnceFunction, spec: GuardSpec) -> Iterator[None]:
    """Guards installed inside carry `init_values_once[<spec>]` as their frame name, so
    TORCH_LOGS=guards and recompile reasons say which spec they came from."""
    from torch._guards import TracingContext

    context = TracingContext.get()
    saved = context.loc_in_frame, context.loc_in_frame_positions
    code = entry.fn.__code__
    context.loc_in_frame = (code.co_filename, code.co_firstlineno, f"init_values_once[{spec.text}] of {entry.fn.__qualname__}")
    context.loc_in_frame_positions = None
    try:
        yield
    finally:
        context.loc_in_frame, context.loc_in_frame_positions = saved


def maybe_init_values_once_variable(fn: Any) -> InitValuesOnceVariable | None:
    """The VariableTracker to call instead of inlining `fn`, if it is marked.
    Called for every traced user function call, so the common case is one dict lookup."""
    from ..init_once import lookup_init_values_once

    entry = lookup_init_values_once(fn)
    if entry is None or not config.init_values_once:
        return None
    from .functions import UserFunctionVariable

    return InitValuesOnceVariable(entry, UserFunctionVariable(fn))
