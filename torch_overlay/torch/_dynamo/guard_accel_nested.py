"""Native guards for grads, per-tensor state dicts and object identity pairs.

``guard_accel`` checks the tensors of a large list, tuple or dict in one native
loop. Optimizer-like objects (``init_values_once`` guarded inputs, see
``scripts/bench_skip_guard.py``) leave three kinds of per-tensor guards beside
those, each O(N) nodes and O(N) work per call:

* the ``.grad`` of every tensor of a planned container (GradSource):
  NOT_NONE_MATCH or CONSTANT_MATCH(None), TENSOR_MATCH, a share of no-aliasing;
* a dict of dicts of tensors reached through a DictGuardManager with tensor keys
  (``self.state[p]['momentum_buffer']``): TYPE_MATCH and DICT_KEYS_MATCH (keys
  and their order) per inner dict, TENSOR_MATCH per tensor;
* ``params[i] is list(dict.keys(state))[i]`` (DUPLICATE_INPUT), one Python
  ``is`` lambda per pair, built with ``ast`` at compile time.

``torch.optim``'s own ``step`` guards the same objects by identity instead: its
parameters, their state buffers and its ``step`` tensors are static addresses
installed into the graph, so each gets an ID_MATCH leaf (plus NOT_NONE on
every ``.grad`` and an EQUALS_MATCH per state key), about 5,000 leaves for
1,000 parameters. Those become identity records of the same container guards:
the element must be the recorded object (its address compared, as ID_MATCH
does, with Dynamo's ``id_ref`` still invalidating the guard when it dies) and
its grad present or None; a state dict's key guards become the check of its
keys in order.

This module extends the plan of ``guard_accel`` through its public API (a plan
subclass overriding ``add_tensor`` and ``install``, ``Container``,
``TensorRecord``, ``tensor_record``, ``install_container_guard`` and
``install_aliasing_group``): a grad's guards become an
optional grad record of its element's record (its TENSOR_MATCH recorded by
``add_tensor`` with ``tensor_record``; checked in the same loop; grads
join the aliasing group), a dict of dicts becomes a ``dict_nested`` container
(records located by outer position and inner str key; the inner dicts' str keys
in order are checked too), and the identity pairs
become one ``ObjectIdentityGuard`` epilogue that fetches both containers from the
frame locals at every check and compares their live items: no object is kept
alive and no pointer is kept between checks.

A guard taken over here is only dropped from the tree if its replacement is
installed: at install time, every taken guard whose element has no record is
created as usual (``_create_unreplaced``).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any, NamedTuple, TYPE_CHECKING

import torch

from . import config, guard_accel
from .source import (
    AttrSource,
    ConstDictKeySource,
    DictGetItemSource,
    GetItemSource,
    GradSource,
    ListGetItemSource,
    LocalSource,
)
from .utils import builtin_dict_keys, istype

if TYPE_CHECKING:
    from torch._guards import Guard, Source

    from .guards import GuardBuilder


@dataclasses.dataclass
class NestedContainer(guard_accel.Container):
    """A dict of dicts of tensors: records at (outer position, inner str key)."""

    # inner dict source name -> its position in the outer dict
    inner_sources: dict[str, int] = dataclasses.field(default_factory=dict)
    # outer position -> the inner dict's str keys in order, checked by the guard
    inner_keys: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def guard_arguments(self) -> tuple[type, Any]:
        return dict, (dict(self.inner_keys) or None)

    def sorted_records(self) -> list[guard_accel.TensorRecord]:
        return sorted(self.records, key=lambda r: (r.locator, r.key))

    def node(self, builder: GuardBuilder) -> Any:
        # A DictGuardManager takes ID_MATCH leaves only: a plain node for the dict.
        return guard_accel.second_node(builder, self)


@dataclasses.dataclass
class GradPlan:
    """The guards on one container element's .grad that its record takes over."""

    container: guard_accel.Container
    locator: tuple[Any, Any]  # the element's (locator, key), as in its record
    expect_none: bool
    guards: list[Guard]  # every guard taken over for this grad
    tensor_guard: Guard | None  # its TENSOR_MATCH, recorded by add_tensor
    record: guard_accel.TensorRecord | None = None  # tensor_guard's, once created


class IdentityItem(NamedTuple):
    """A list/tuple item or a dict key by position, reached from a frame local."""

    local: Source  # a LocalSource
    steps: tuple[tuple[bool, Any], ...]  # (is_attr, name or key) from the local
    keys: bool  # the item is list(dict.keys(d))[index]
    index: int


class IdentityPair(NamedTuple):
    guard: Guard  # the DUPLICATE_INPUT guard replaced
    a: IdentityItem
    b: IdentityItem


class NestedTensorContainerPlan(guard_accel.TensorContainerPlan):
    def __init__(self, extension: Any, containers: list[guard_accel.Container]) -> None:
        super().__init__(extension, containers)
        self._grads: dict[str, GradPlan] = {}  # grad source name -> plan
        # guard name of a grad's TENSOR_MATCH -> its plan (add_tensor records it there)
        self._grad_tensor_guards: dict[str, GradPlan] = {}
        self._taken: dict[int, Guard] = {}  # id(guard) -> guard, see takes_guard
        # inner dict TYPE_MATCH and DICT_KEYS_MATCH guards of dict_nested containers:
        # id -> (container, position)
        self._inner_types: dict[int, tuple[NestedContainer, int]] = {}
        self.identity_pairs: list[IdentityPair] = []

    def takes_guard(self, builder: GuardBuilder, guard: Guard) -> bool:
        """True: the guard is checked by a native guard; do not create it."""
        return id(guard) in self._taken

    def _take(self, guard: Guard) -> None:
        self._taken[id(guard)] = guard

    def add_tensor(self, builder: GuardBuilder, guard: Guard, value: Any) -> bool:
        """A grad's TENSOR_MATCH becomes its element's grad record (see prepare)."""
        grad = self._grad_tensor_guards.get(guard.name)
        if grad is None:
            return super().add_tensor(builder, guard, value)
        grad.record = self.tensor_record(builder, guard, value, *grad.locator)
        return True

    # -- grads ---------------------------------------------------------------

    def plan_grads(self, builder: GuardBuilder, guards: list[Guard]) -> None:
        by_grad: dict[str, list[Guard]] = {}
        for guard in guards:
            source = guard.originating_source
            if (
                istype(source, GradSource)
                and source.member == "grad"
                and self.container_of(source.base.name) is not None
            ):
                by_grad.setdefault(source.name, []).append(guard)
        output_graph = builder.check_fn_manager.output_graph
        from .guards import match_on_id_for_tensor

        for name, grad_guards in by_grad.items():
            source = grad_guards[0].originating_source
            container = self.container_of(source.base.name)
            assert container is not None
            locator = container.members[source.base.name]  # (locator, key), as in records
            kinds = {g.create_fn_name() for g in grad_guards}
            value = builder.get(source)
            tensor_guard = None
            if value is None:
                if not kinds <= {"CONSTANT_MATCH", "NONE_MATCH"}:
                    continue
            else:
                if not kinds <= {"NOT_NONE_MATCH", "TENSOR_MATCH"}:
                    continue
                if "TENSOR_MATCH" in kinds:
                    tensor_guard = next(
                        g for g in grad_guards if g.create_fn_name() == "TENSOR_MATCH"
                    )
                    if (
                        match_on_id_for_tensor(tensor_guard)
                        or source not in output_graph.input_source_to_sizes_strides
                        or not guard_accel.supported_tensor(value)
                        or (config._unsafe_skip_fsdp_module_guards and tensor_guard.is_fsdp_module())
                    ):
                        continue
            grad = self._grads[name] = GradPlan(
                container, locator, value is None, grad_guards, tensor_guard
            )
            if tensor_guard is not None:
                self._grad_tensor_guards[tensor_guard.name] = grad
            for g in grad_guards:
                if g is not tensor_guard:
                    self._take(g)

    # -- nested dicts --------------------------------------------------------

    def note_inner_type_guards(self, builder: GuardBuilder, guards: list[Guard]) -> None:
        """The type, and the keys in order, of the dicts holding a dict_nested
        container's tensors are checked by its guard."""
        inner: dict[str, tuple[NestedContainer, int]] = {}
        for container in self.containers:
            if isinstance(container, NestedContainer):
                for source_name, position in container.inner_sources.items():
                    inner[source_name] = (container, position)
        for guard in guards:
            if guard.name not in inner:
                continue
            kind = guard.create_fn_name()
            if kind == "DICT_KEYS_MATCH":
                keys = tuple(builtin_dict_keys(builder.get(guard.originating_source)))
                if not all(type(k) is str for k in keys):
                    continue
                container, position = inner[guard.name]
                container.inner_keys[position] = keys
            elif kind != "TYPE_MATCH":
                continue
            self._inner_types[id(guard)] = inner[guard.name]
            self._take(guard)
        # A guard on every key by position (torch.optim's state, reached through
        # DictGuardManagers) is what the check of the keys in order does.
        for name, (inner_source, by_index) in _inner_key_guards(guards).items():
            if name not in inner or not _all_keys_guarded(builder, inner_source, by_index):
                continue
            container, position = inner[name]
            keys = tuple(builtin_dict_keys(builder.get(inner_source)))
            if container.inner_keys.setdefault(position, keys) != keys:
                continue
            for guard in by_index.values():
                self._inner_types[id(guard)] = (container, position)
                self._take(guard)

    # -- ID_MATCH'd tensors -------------------------------------------------

    def plan_identity_records(
        self, builder: GuardBuilder, guards: list[Guard], min_size: int
    ) -> None:
        """Identity records for the ID_MATCH'd tensors of lists and dicts of dicts.

        Their records are made here (an ID_MATCH needs nothing from the guard's
        creation); the ID_MATCH guards are taken.
        """
        tensor_matched = {g.name for g in guards if g.create_fn_name() == "TENSOR_MATCH"}
        existing = {(c.name, c.kind): c for c in self.containers}
        planned: dict[tuple[str, str], guard_accel.Container] = {}
        # (container name, kind) -> (guard, tensor, (locator, key), inner dict source, by position)
        found: dict[tuple[str, str], list[tuple[Guard, Any, tuple[int, Any], Source | None, bool]]] = {}
        for guard in guards:
            if guard.create_fn_name() != "ID_MATCH" or guard.name in tensor_matched:
                continue
            value = builder.get(guard.originating_source)
            if type(value) not in guard_accel.TENSOR_TYPES:
                continue
            located = _locate_identity(builder, guard.originating_source)
            if located is None:
                continue
            base, kind, locator, key, inner, by_position = located
            found.setdefault((base.name, kind), []).append(
                (guard, value, (locator, key), inner, by_position)
            )
            if (base.name, kind) not in planned:
                container = existing.get((base.name, kind))
                if container is None:
                    cls = NestedContainer if kind == "dict_nested" else guard_accel.Container
                    container = cls(base, base.name, kind, builder.get(base))
                planned[(base.name, kind)] = container
        for where, items in found.items():
            container = planned[where]
            if where not in existing and len(items) < min_size:
                continue
            for guard, value, locator, inner, by_position in items:
                # Lists locate by index, dicts of dicts by (position, inner key).
                slot = locator if inner is not None else locator[0]
                if slot in container.locators:
                    continue  # a second source for one element keeps its own guard
                if by_position:
                    keys = tuple(builtin_dict_keys(builder.get(inner)))
                    if container.inner_keys.setdefault(locator[0], keys) != keys:
                        continue
                container.locators.add(slot)
                container.members[guard.name] = locator
                self.route(guard.name, container)
                if inner is not None:
                    container.inner_sources[inner.name] = locator[0]
                # What ID_MATCH does besides its check: the guard dies with the object.
                builder.id_ref(value, guard.name)
                container.records.append(
                    guard_accel.TensorRecord(
                        locator[0], locator[1], value, None, None, None, False, builder.arg_ref(guard)
                    )
                )
                if not isinstance(value, torch.nn.Parameter):
                    container.diff_source = True
                if container.guard is None:
                    container.guard = guard
                self._take(guard)
            if where not in existing and container.records:
                self.containers.append(container)

    # -- identity pairs (DUPLICATE_INPUT) -------------------------------------

    def plan_identity(self, builder: GuardBuilder, guards: list[Guard], min_size: int) -> None:
        from .guards import is_from_optimizer_source, is_from_skip_guard_source

        seen: set[frozenset[str]] = set()
        pairs: list[IdentityPair] = []
        for guard in guards:
            if guard.create_fn_name() != "DUPLICATE_INPUT":
                continue
            source_b = getattr(guard.create_fn, "keywords", {}).get("source_b")
            source_a = guard.originating_source
            if source_b is None or any(
                is_from_skip_guard_source(s) or is_from_optimizer_source(s)
                for s in (source_a, source_b)
            ):
                continue  # DUPLICATE_INPUT installs nothing for these either
            item_a = _identity_item(builder, source_a)
            item_b = _identity_item(builder, source_b)
            if item_a is None or item_b is None:
                continue
            key = frozenset((source_a.name, source_b.name))
            if key in seen:
                self._take(guard)  # DUPLICATE_INPUT skips a repeated pair as well
                continue
            seen.add(key)
            pairs.append(IdentityPair(guard, item_a, item_b))
        if len(pairs) < min_size:
            return
        for pair in pairs:
            self._take(pair.guard)
        self.identity_pairs = pairs

    # -- install -------------------------------------------------------------

    def _create_unreplaced(self, builder: GuardBuilder, guards: list[Guard]) -> None:
        """Create taken guards whose replacement is not installed, as Dynamo would."""
        for guard in guards:
            # A grad's TENSOR_MATCH gets its own node.
            self._grad_tensor_guards.pop(guard.name, None)
            guard.create(builder)

    def prepare(self, builder: GuardBuilder) -> None:
        """Attach grad records; create taken guards that found no record as usual."""
        fallback: list[Guard] = []
        record_locators = {
            id(c): {(r.locator, r.key) for r in c.records} for c in self.containers
        }
        grad_specs: dict[int, dict[Any, Any]] = {}
        for plan in self._grads.values():
            locator = plan.locator
            container = plan.container
            # The record holds the grad until the container guard is built.
            record, plan.record = plan.record, None
            if locator not in record_locators[id(container)]:
                fallback += plan.guards  # its element kept its own guards: so does the grad
                continue
            if plan.expect_none:
                spec: Any = "none"
            elif record is not None:
                spec = record
                # As add_tensor: a non-Parameter tensor makes the node a diff source.
                if not isinstance(record.tensor, torch.nn.Parameter):
                    container.diff_source = True
            elif any(g is not plan.tensor_guard for g in plan.guards):
                # NOT_NONE_MATCH was taken; a TENSOR_MATCH, if any, was not
                # created (Dynamo skips it too).
                spec = "present"
            else:
                spec = None
            grad_specs.setdefault(id(container), {})[locator] = spec
        for container in self.containers:
            specs = grad_specs.get(id(container))
            if specs:
                container.records = [
                    r._replace(grad=specs.get((r.locator, r.key))) for r in container.records
                ]
        positions = {id(c): {r.locator for r in c.records} for c in self.containers}
        for guard_id, (container, position) in self._inner_types.items():
            if position not in positions[id(container)]:
                fallback.append(self._taken[guard_id])
                container.inner_keys.pop(position, None)
        if fallback:
            self._create_unreplaced(builder, fallback)

    def install(self, builder: GuardBuilder) -> None:
        """guard_accel's container guards and aliasing group, plus grad records,
        dict_nested containers and the identity pairs."""
        self.prepare(builder)
        group = self.extension.TensorAliasingGroup()
        nested = [c for c in self.containers if isinstance(c, NestedContainer)]
        flat = [c for c in self.containers if not isinstance(c, NestedContainer)]
        for i, container in enumerate(nested):
            var = f"___tensor_container_nested_{i}"
            guard_accel.install_container_guard(builder, self, container, var, group)
        for i, container in enumerate(flat):
            var = f"___tensor_container_{i}"
            guard_accel.install_container_guard(builder, self, container, var, group)
        # Grads are in group too: it counts them when deciding whether it is needed.
        guard_accel.install_aliasing_group(builder, self, group)
        self.install_identity(builder)

    def install_identity(self, builder: GuardBuilder) -> None:
        if not self.identity_pairs:
            return
        bases: list[tuple[str | None, list[tuple[bool, Any]], bool]] = []
        base_index: dict[tuple[Any, ...], int] = {}
        pairs = []
        # All pairs under one frame local (self): the guard goes on that local's
        # node, next to what it checks, and starts from it; else on the root.
        locals_ = {item.local for pair in self.identity_pairs for item in (pair.a, pair.b)}
        local = next(iter(locals_)) if len(locals_) == 1 else None

        def base_of(item: IdentityItem) -> int:
            name = None if local is not None else item.local.local_name
            key = (name, item.steps, item.keys)
            if key not in base_index:
                base_index[key] = len(bases)
                bases.append((name, list(item.steps), item.keys))
            return base_index[key]

        for guard, item_a, item_b in self.identity_pairs:
            ref_a = builder.arg_ref(guard)
            ref_b = builder.arg_ref(guard.create_fn.keywords["source_b"].name)
            # Shown without L[...], as recompile reasons show sources.
            text = re.sub(r"\bL\['([A-Za-z_]\w*)'\]", r"\1", f"{ref_b} is {ref_a}")
            pairs.append((base_of(item_a), item_a.index, base_of(item_b), item_b.index, text))
        identity = self.extension.make_object_identity_guard(bases, pairs)
        # The guard_accel prefix: explain_guards lists it as an accelerated guard.
        var = "___tensor_container_identity"
        self.closure_vars[var] = identity
        from .guards import get_verbose_code_parts

        first = self.identity_pairs[0].guard
        arg = builder.arg_ref(local.name) if local is not None else "L"
        code_parts = get_verbose_code_parts(
            [f"{var}.explain({arg})", f"{var}({arg})  # {len(pairs)} `is` pairs of container items"],
            first,
        )
        if local is not None:
            guard_accel.add_native_guard(
                builder,
                builder.get_guard_manager_from_source(local),
                identity,
                code_parts,
                first.user_stack,
            )
        else:
            builder.guard_manager.root.add_epilogue_lambda_guard(identity, code_parts, None)


def _path(source: Source) -> tuple[Source, tuple[tuple[bool, Any], ...]] | None:
    """(the LocalSource, steps) that reach `source` from a frame local, or None."""
    steps: list[tuple[bool, Any]] = []
    while True:
        if istype(source, LocalSource):
            return source, tuple(reversed(steps))
        if istype(source, AttrSource):
            if "." in source.member:
                return None
            steps.append((True, source.member))
        elif istype(source, DictGetItemSource):
            if type(source.index) not in (str, int):
                return None
            steps.append((False, source.index))
        elif istype(source, (GetItemSource, ListGetItemSource)):
            if source.index_is_slice or type(source.index) is not int or source.index < 0:
                return None
            steps.append((False, source.index))
        else:
            return None
        source = source.base


def _identity_item(builder: GuardBuilder, source: Source) -> IdentityItem | None:
    """How to reach a list/tuple item or a dict key by position from a frame local."""
    if istype(source, ConstDictKeySource):
        if not isinstance(builder.get(source.base), dict) or type(source.index) is not int:
            return None
        keys = True
    elif istype(source, (GetItemSource, ListGetItemSource)):
        if source.index_is_slice or type(source.index) is not int or source.index < 0:
            return None
        if type(builder.get(source.base)) not in (list, tuple):
            return None
        keys = False
    else:
        return None
    path = _path(source.base)
    if path is None:
        return None
    return IdentityItem(path[0], path[1], keys, source.index)


def _inner_key_guards(guards: list[Guard]) -> dict[str, tuple[Source, dict[int, Guard]]]:
    """Per dict: its source and the EQUALS_MATCH guards on its keys by position."""
    key_guards: dict[str, tuple[Source, dict[int, Guard]]] = {}
    for guard in guards:
        source = guard.originating_source
        if (
            guard.create_fn_name() == "EQUALS_MATCH"
            and istype(source, ConstDictKeySource)
            and type(source.index) is int
        ):
            key_guards.setdefault(source.base.name, (source.base, {}))[1][source.index] = guard
    return key_guards


def _all_keys_guarded(builder: GuardBuilder, source: Source, by_index: dict[int, Guard]) -> bool:
    """Every key of the dict at source is exact str and has its own key guard."""
    keys = tuple(builtin_dict_keys(builder.get(source)))
    return all(type(k) is str for k in keys) and set(by_index) == set(range(len(keys)))


def _locate_identity(
    builder: GuardBuilder, source: Source
) -> tuple[Source, str, int, Any, Source | None, bool] | None:
    """(container source, kind, locator, inner key, inner dict source, by
    position) of an ID_MATCH'd list/tuple item or dict-of-dicts value, or None.

    A value reached by its key's position (``inner[list(dict.keys(inner))[k]]``,
    how torch.optim's state is read) is by position: its record needs the check of
    its dict's keys in order, which takes the values by position. That check is
    stronger than the value's own guard (which leaves the keys to other guards):
    a state dict whose keys change without its values changing recompiles.
    """
    by_position = False
    if (
        istype(source, DictGetItemSource)
        and istype(source.index, ConstDictKeySource)
        and source.index.base == source.base
        and type(source.index.index) is int
    ):
        keys = list(builtin_dict_keys(builder.get(source.base)))
        if not all(type(k) is str for k in keys) or source.index.index >= len(keys):
            return None
        source = DictGetItemSource(source.base, keys[source.index.index])
        by_position = True
    if istype(source, (GetItemSource, ListGetItemSource)):
        if source.index_is_slice or type(source.index) is not int or source.index < 0:
            return None
        kind = {list: "list", tuple: "tuple"}.get(type(builder.get(source.base)))
        if kind is None:
            return None
        return source.base, kind, source.index, None, None, False
    inner = _nested_inner(builder, source)
    if inner is None:
        return None
    return inner.base, "dict_nested", inner.index.index, source.index, inner, by_position


def _nested_inner(builder: GuardBuilder, source: Source) -> Any:
    """The inner dict's source of outer[ConstDictKey(i)][str key], if a dict_nested
    container can check it, else None."""
    if not istype(source, DictGetItemSource) or type(source.index) is not str:
        return None
    inner = source.base
    if not istype(inner, DictGetItemSource) or not istype(inner.index, ConstDictKeySource):
        return None
    outer = inner.base
    if inner.index.base != outer or type(inner.index.index) is not int:
        return None
    # The native walk reads the dict's own entries (PyDict_Next), as its
    # DictGuardManager does: exact dicts, and defaultdict (torch.optim's state),
    # whose order is the dict's own.
    if type(builder.get(outer)) not in (dict, collections.defaultdict):
        return None
    if type(builder.get(inner)) is not dict:
        return None
    if not builder.requires_key_order_guarding(outer):
        return None
    # The guard needs a plain node for the dict (a DictGuardManager takes
    # ID_MATCH leaves only).
    if guard_accel.second_node_accessor(builder, outer) is None:
        return None
    return inner


def _plan_nested(
    builder: GuardBuilder, guards: list[Guard], taken: set[str], min_size: int
) -> list[NestedContainer]:
    """dict_nested containers: outer[ConstDictKey(i)][str key] tensors."""
    from .guards import match_on_id_for_tensor

    output_graph = builder.check_fn_manager.output_graph
    containers: dict[str, NestedContainer] = {}
    for guard in guards:
        if guard.create_fn_name() != "TENSOR_MATCH" or guard.name in taken:
            continue
        source = guard.originating_source
        inner = _nested_inner(builder, source)
        if inner is None:
            continue
        if match_on_id_for_tensor(guard) or source not in output_graph.input_source_to_sizes_strides:
            continue
        if config._unsafe_skip_fsdp_module_guards and guard.is_fsdp_module():
            continue
        if not guard_accel.supported_tensor(builder.get(source)):
            continue
        outer = inner.base
        outer_value = builder.get(outer)
        container = containers.get(outer.name)
        if container is None:
            container = containers[outer.name] = NestedContainer(
                outer, outer.name, "dict_nested", outer_value
            )
        locator = (inner.index.index, source.index)
        if locator in container.locators:
            continue
        container.locators.add(locator)
        container.members[guard.name] = locator
        container.inner_sources[inner.name] = inner.index.index
    return [c for c in containers.values() if len(c.members) >= min_size]


def plan_tensor_containers(
    builder: GuardBuilder, guards: list[Guard], save_guards: bool
) -> guard_accel.TensorContainerPlan | None:
    """guard_accel's plan, extended with grads, dicts of dicts and identity pairs."""
    base = guard_accel.plan_tensor_containers(builder, guards, save_guards)
    if not config.tensor_container_guards or save_guards:
        return base
    output_graph = builder.check_fn_manager.output_graph
    if output_graph is None or output_graph.export:
        return base
    min_size = max(config.tensor_container_guard_min_size, 2)
    # ID_MATCH too: torch.optim's step guards its tensors by identity only.
    tensor_guards = sum(1 for g in guards if g.create_fn_name() in ("TENSOR_MATCH", "ID_MATCH"))
    if tensor_guards < min_size:
        return base
    ext = guard_accel.extension()
    if ext is None:
        return None
    containers: list[guard_accel.Container] = list(base.containers) if base is not None else []
    taken = {m for c in containers for m in c.members}
    containers += _plan_nested(builder, guards, taken, min_size)
    plan = NestedTensorContainerPlan(ext, containers)
    plan.plan_identity_records(builder, guards, min_size)
    plan.plan_grads(builder, guards)
    plan.note_inner_type_guards(builder, guards)
    plan.plan_identity(builder, guards, min_size)
    if not plan.containers and not plan.identity_pairs:
        return None
    return plan
