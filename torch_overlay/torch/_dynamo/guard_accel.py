"""One native guard for each large container of tensors, and the frame's no-aliasing check.

Without this module, Dynamo gives every tensor of a list, tuple or dict its own node
in the guard tree: an accessor (``xs[i]``), a TENSOR_MATCH leaf, a
DIMENSION_DYNAMIC_MARKING_GUARD leaf and a share of the relational
NO_TENSOR_ALIASING guard. An optimizer-like object adds, per parameter, the guards on
its ``.grad``, its state dict of dicts (TYPE_MATCH and DICT_KEYS_MATCH per inner
dict, TENSOR_MATCH per buffer) and a Python ``is`` lambda per ``params[i] is
list(dict.keys(state))[i]`` pair (DUPLICATE_INPUT); ``torch.optim``'s own step
guards its params and state by ID_MATCH. All of it is O(N) nodes and O(N) work on
every call.

``plan_tensor_containers`` makes one ``TensorContainerPlan`` from the sorted guards,
before any guard is created:

* containers of at least ``config.tensor_container_guard_min_size`` tensors: lists,
  tuples, dicts looked up by key or iterated in key order, and dicts of dicts of
  tensors (``dict_nested``: records at outer position and inner str key, the inner
  dicts' types and str keys in order checked too);
* identity records for the ID_MATCH'd tensors of such containers (sizes and strides
  None: the element must be the recorded object, plus its .grad presence);
* grad records: the guards on a planned element's ``.grad`` (None, present, or a
  record checked like TENSOR_MATCH) go into the element's record;
* identity pairs: DUPLICATE_INPUT pairs between list/tuple items and dict keys by
  position.

``TensorContainerPlan.install`` then adds one ``TensorContainerGuard`` leaf per
container, one ``TensorAliasingGroup`` epilogue for every tensor that would be under
the no-aliasing guard (a pointer compare when nothing changed, a hash set otherwise)
and one ``ObjectIdentityGuard`` for the identity pairs (``torch._dynamo._guard_accel``,
C++). A guard is only dropped from the tree when its replacement is installed: a
taken guard whose element ended up without a record is created as usual.

The guard builder calls in at five points (guards.py):

* ``CheckFunctionManager.build_guards``: ``plan_tensor_containers`` before the guards
  are created, and ``TensorContainerPlan.takes_guard`` for each guard;
* ``GuardBuilder.TENSOR_MATCH``: a planned tensor is recorded by
  ``TensorContainerPlan.add_tensor`` instead of getting its own node;
* ``GuardBuilder.DICT_KEYS_MATCH``: the key-order guards of a planned dict are left
  to its container guard (``TensorContainerPlan.owns_dict_keys``);
* ``compile_check_fn``: ``install_tensor_container_guards`` installs the plan; the
  nodes its guards go on are never tag safe (``add_native_guard``).

Without the extension (or with ``config.tensor_container_guards = False``) nothing
changes: Dynamo's per-tensor guards are used, and a missing extension is reported once.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import logging
import re
import warnings
from typing import Any, NamedTuple, TYPE_CHECKING

import torch

from . import config
from .source import (
    AttrSource,
    CellContentsSource,
    ConstDictKeySource,
    DefaultsSource,
    DictGetItemSource,
    DictSubclassGetItemSource,
    GetItemSource,
    GlobalSource,
    GradSource,
    is_from_unspecialized_builtin_nn_module_source,
    ListGetItemSource,
    LocalSource,
    NumpyTensorSource,
    UnspecializedParamBufferSource,
)
from .utils import builtin_dict_keys, istype

if TYPE_CHECKING:
    from torch._guards import Guard, Source

    from .guards import GuardBuilder


log = logging.getLogger(__name__)

# Exact tensor types the native guard handles; subclasses keep their per-tensor guards.
TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
# Dict keys whose comparison runs no Python code.
SIMPLE_KEY_TYPES = (str, int)
# The tensor attribute that makes DIMENSION_DYNAMIC_MARKING_GUARD check further
# attributes (_dynamo_shape_ids, _dynamo_unbacked_bounds); such tensors keep their own guards.
UNBACKED_MARK = "_dynamo_unbacked_indices"

_extension: Any = None
_extension_checked = False


def extension() -> Any:
    """The native module, or None (warns once) when it is missing."""
    global _extension, _extension_checked
    if not _extension_checked:
        _extension_checked = True
        try:
            _extension = importlib.import_module("torch._dynamo._guard_accel")
        except ImportError as e:
            warnings.warn(
                "torch._dynamo._guard_accel is not available "
                f"({e}); tensor containers are guarded with a TENSOR_MATCH per tensor",
                RuntimeWarning,
                stacklevel=2,
            )
    return _extension


class TensorRecord(NamedTuple):
    """One element of make_tensor_container_guard: what is checked about one tensor."""

    locator: int  # list/tuple index or dict position (dict_nested: outer position)
    key: Any  # dict_lookup: the dict's own key object; dict_nested: the inner str key
    tensor: torch.Tensor  # read at build time only; not kept by the guard
    sizes: list[int | None]  # None: a dynamic dimension, not checked
    strides: list[int | None]
    marks: tuple[Any, ...] | None  # per MARK_ATTRS entry: the set it must stay within
    aliasing: bool  # takes part in the no-aliasing check
    name: str  # how reasons name it, e.g. L['xs'][3]
    # None (not checked), "none", "present" or the TensorRecord of its .grad
    grad: Any = None


@dataclasses.dataclass
class Container:
    """A list, tuple, dict or dict of dicts whose tensors one TensorContainerGuard checks."""

    source: Source
    name: str
    kind: str  # "list", "tuple", "dict_lookup", "dict_ordered" or "dict_nested"
    value: Any
    # guard name -> (locator, key), as in the record: the list index or dict
    # position and the dict key (dict_nested: outer position and inner str key)
    members: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    locators: set[Any] = dataclasses.field(default_factory=set)
    records: list[TensorRecord] = dataclasses.field(default_factory=list)
    guard: Guard | None = None  # the first guard recorded (user stack, export info)
    diff_source: bool = False  # has a non-Parameter tensor (see TENSOR_MATCH)
    on_second_node: bool = False  # a tuple whose own node may be skipped (_plan_tuple)
    # dict_nested: inner dict source name -> its position in the outer dict
    inner_sources: dict[str, int] = dataclasses.field(default_factory=dict)
    # dict_nested: outer position -> the inner dict's str keys in order, checked
    inner_keys: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def guard_arguments(self) -> tuple[type, Any]:
        """(dict_type, ordered_keys) for make_tensor_container_guard."""
        if self.kind == "dict_nested":
            return dict, (dict(self.inner_keys) or None)
        if self.kind == "dict_ordered":
            return type(self.value), list(builtin_dict_keys(self.value))
        return type(self.value), None

    def sorted_records(self) -> list[TensorRecord]:
        if self.kind == "dict_nested":
            return sorted(self.records, key=lambda r: (r.locator, r.key))
        return sorted(self.records, key=lambda r: r.locator)

    def add_record(self, record: TensorRecord, guard: Guard) -> None:
        self.records.append(record)
        if not isinstance(record.tensor, torch.nn.Parameter):
            self.diff_source = True
        if self.guard is None:
            self.guard = guard

    def node(self, builder: GuardBuilder) -> Any:
        """The guard manager the container guard goes on."""
        # A DictGuardManager takes ID_MATCH leaves only: a plain node for the dict.
        if self.kind in ("dict_ordered", "dict_nested") or self.on_second_node:
            return second_node(builder, self)
        return builder.get_guard_manager_from_source(self.source)


@dataclasses.dataclass
class GradPlan:
    """The guards on one container element's .grad that its record takes over."""

    container: Container
    locator: tuple[Any, Any]  # the element's (locator, key), as in its record
    expect_none: bool
    guards: list[Guard]  # every guard taken over for this grad
    tensor_guard: Guard | None  # its TENSOR_MATCH, recorded by add_tensor
    record: TensorRecord | None = None  # tensor_guard's, once created


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


class TensorContainerPlan:
    """What the native guards of one frame check, and which guards they replace."""

    def __init__(self, extension: Any, containers: list[Container]) -> None:
        self.extension = extension
        self.containers = containers
        # guard name of a planned TENSOR_MATCH or ID_MATCH -> its container
        self._by_member = {member: c for c in containers for member in c.members}
        self._ordered_dicts = {c.name for c in containers if c.kind == "dict_ordered"}
        self._grads: dict[str, GradPlan] = {}  # grad source name -> plan
        # guard name of a grad's TENSOR_MATCH -> its plan (add_tensor records it there)
        self._grad_tensor_guards: dict[str, GradPlan] = {}
        self._taken: dict[int, Guard] = {}  # id(guard) -> guard, see takes_guard
        # inner dict TYPE_MATCH, DICT_KEYS_MATCH and key EQUALS_MATCH guards of
        # dict_nested containers: id -> (container, position)
        self._inner_types: dict[int, tuple[Container, int]] = {}
        self.identity_pairs: list[IdentityPair] = []
        self.closure_vars: dict[str, Any] = {}

    # -- what guards.py asks while the guards are built -----------------------

    def takes_guard(self, guard: Guard) -> bool:
        """True: the guard is checked by a native guard; do not create it."""
        return id(guard) in self._taken

    def _take(self, guard: Guard) -> None:
        self._taken[id(guard)] = guard

    def container_of(self, guard_name: str) -> Container | None:
        """The planned container holding the element guard_name guards."""
        return self._by_member.get(guard_name)

    def owns_dict_keys(self, guard: Guard) -> bool:
        """True if a planned container guard checks this dict's keys and their order."""
        return guard.name in self._ordered_dicts

    def add_tensor(self, builder: GuardBuilder, guard: Guard, value: Any) -> bool:
        """Record a planned TENSOR_MATCH (a container element or an element's grad);
        False: build it as usual."""
        grad = self._grad_tensor_guards.get(guard.name)
        if grad is not None:
            grad.record = self.tensor_record(builder, guard, value, *grad.locator)
            return True
        container = self._by_member.get(guard.name)
        if container is None:
            return False
        locator, key = container.members[guard.name]
        container.add_record(self.tensor_record(builder, guard, value, locator, key), guard)
        return True

    def tensor_record(
        self, builder: GuardBuilder, guard: Guard, value: Any, locator: Any, key: Any
    ) -> TensorRecord:
        """What the TENSOR_MATCH of guard (on value) checks, as a record at locator/key."""
        from .guards import convert_to_concrete_values

        output_graph = builder.check_fn_manager.output_graph
        if output_graph is None:
            raise AssertionError("check_fn_manager.output_graph must not be None")
        metadata = output_graph.input_source_to_sizes_strides[guard.originating_source]
        sizes = convert_to_concrete_values(metadata["size"])
        strides = convert_to_concrete_values(metadata["stride"])
        # Same rule as GuardBuilder.TENSOR_MATCH for the no-aliasing guard.
        aliasing = not (
            config.skip_no_tensor_aliasing_guards_on_parameters
            and (
                istype(value, torch.nn.Parameter)
                or is_from_unspecialized_builtin_nn_module_source(
                    guard.originating_source
                )
            )
        )
        marks = None
        attrs = self.extension.MARK_ATTRS
        if any(hasattr(value, a) for a in attrs):
            marks = tuple(getattr(value, a) if hasattr(value, a) else None for a in attrs)
        return TensorRecord(
            locator, key, value, sizes, strides, marks, aliasing, builder.arg_ref(guard)
        )

    # -- planning (plan_tensor_containers), after the containers -------------

    def _plan_grads(self, builder: GuardBuilder, guards: list[Guard]) -> None:
        """Grad records: the guards on a planned element's .grad."""
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
                        or not supported_tensor(value, output_graph.compile_on_one_rank)
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

    def _plan_inner_dicts(self, builder: GuardBuilder, guards: list[Guard]) -> None:
        """The type, and the keys in order, of the dicts holding a dict_nested
        container's tensors are checked by its guard."""
        inner: dict[str, tuple[Container, int]] = {}
        for container in self.containers:
            if container.kind == "dict_nested":
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

    def _plan_identity_records(
        self, builder: GuardBuilder, guards: list[Guard], min_size: int
    ) -> None:
        """Identity records for the ID_MATCH'd tensors of lists and dicts of dicts.

        Their records are made here (an ID_MATCH needs nothing from the guard's
        creation); the ID_MATCH guards are taken.
        """
        tensor_matched = {g.name for g in guards if g.create_fn_name() == "TENSOR_MATCH"}
        existing = {(c.name, c.kind): c for c in self.containers}
        planned: dict[tuple[str, str], Container] = {}
        # (container name, kind) -> (guard, tensor, (locator, key), inner dict source, by position)
        found: dict[tuple[str, str], list[tuple[Guard, Any, tuple[int, Any], Source | None, bool]]] = {}
        for guard in guards:
            if guard.create_fn_name() != "ID_MATCH" or guard.name in tensor_matched:
                continue
            value = builder.get(guard.originating_source)
            if type(value) not in TENSOR_TYPES:
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
                    container = Container(base, base.name, kind, builder.get(base))
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
                self._by_member[guard.name] = container
                if inner is not None:
                    container.inner_sources[inner.name] = locator[0]
                # What ID_MATCH does besides its check: the guard dies with the object.
                builder.id_ref(value, guard.name)
                container.add_record(
                    TensorRecord(
                        locator[0], locator[1], value, None, None, None, False, builder.arg_ref(guard)
                    ),
                    guard,
                )
                self._take(guard)
            if where not in existing and container.records:
                self.containers.append(container)

    # -- identity pairs (DUPLICATE_INPUT) -------------------------------------

    def _plan_identity_pairs(
        self, builder: GuardBuilder, guards: list[Guard], min_size: int
    ) -> None:
        """DUPLICATE_INPUT pairs of list/tuple items and dict keys by position."""
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

    def _prepare(self, builder: GuardBuilder) -> None:
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
        """The container guards, the frame's aliasing group and the identity pairs."""
        self._prepare(builder)
        # Its second part names the final count of tensors: appended at install.
        group = self.extension.TensorAliasingGroup(["___tensor_aliasing_group.explain()"])
        nested = [c for c in self.containers if c.kind == "dict_nested"]
        flat = [c for c in self.containers if c.kind != "dict_nested"]
        for i, container in enumerate(nested):
            self._install_container(builder, container, f"___tensor_container_nested_{i}", group)
        for i, container in enumerate(flat):
            self._install_container(builder, container, f"___tensor_container_{i}", group)
        # Grads are in group too: it counts them when deciding whether it is needed.
        self._install_aliasing_group(builder, group)
        self._install_identity(builder)

    def _install_container(
        self, builder: GuardBuilder, container: Container, var: str, group: Any
    ) -> None:
        """One TensorContainerGuard for container's records, on container.node().

        Its tensors that take part in no-aliasing join group (a TensorAliasingGroup);
        var is the closure variable naming the guard in verbose code parts.
        """
        if not container.records:
            return
        from .guards import get_verbose_code_parts

        if container.guard is None:
            raise AssertionError("a container with records has a guard")
        ref = builder.arg_ref(container.name)
        dict_type, ordered_keys = container.guard_arguments()
        records = container.sorted_records()
        # Recompile reasons evaluate the parts in order: the first one evaluates to
        # the reason ("xs[417]: dtype changed float32 -> float64").
        verbose_code_parts = get_verbose_code_parts(
            [f"{var}.explain({ref})", f"{var}({ref})"], container.guard
        )
        guard_fn = self.extension.make_tensor_container_guard(
            container.kind, ref, dict_type, ordered_keys, records, group, verbose_code_parts
        )
        self.closure_vars[var] = guard_fn
        node = container.node(builder)
        add_native_guard(builder, node, guard_fn, container.guard.user_stack)
        if container.diff_source:
            builder.guard_manager.diff_guard_sources.add(node.get_source())
        log.debug("%s: %d tensors checked by one TensorContainerGuard", ref, len(records))
        # The guard keeps metadata only; do not keep the frame's tensors alive.
        container.records = []
        container.value = None

    def _install_aliasing_group(self, builder: GuardBuilder, group: Any) -> None:
        """The frame's no-aliasing check: group, with the tensors that are not in a container.

        Called after every container guard joined group. The single tensors
        (``builder.no_tensor_aliasing_names``) record their identities into group from
        their own nodes, and group decides as an epilogue guard.
        """
        names = builder.no_tensor_aliasing_names
        if group.num_tensors() + len(names) <= 1:
            return  # a single tensor cannot alias; the group stays unused
        for i, (name, manager) in enumerate(zip(names, builder.no_tensor_aliasing_guard_managers)):
            var = f"___tensor_aliasing_slot_{i}"
            slot = group.add_tensor(name, [f"{var}  # records {name} for the no-aliasing check"])
            self.closure_vars[var] = slot
            add_native_guard(builder, manager, slot, None)
        self.closure_vars["___tensor_aliasing_group"] = group
        parts = group.verbose_code_parts()
        parts.append(f"___tensor_aliasing_group()  # no aliasing among {group.num_tensors()} tensors")
        builder.guard_manager.root.add_epilogue_lambda_guard(group, parts, None)

    def _install_identity(self, builder: GuardBuilder) -> None:
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
        from .guards import get_verbose_code_parts

        var = "___tensor_container_identity"
        first = self.identity_pairs[0].guard
        arg = builder.arg_ref(local.name) if local is not None else "L"
        code_parts = get_verbose_code_parts(
            [f"{var}.explain({arg})", f"{var}({arg})  # {len(pairs)} `is` pairs of container items"],
            first,
        )
        identity = self.extension.make_object_identity_guard(bases, pairs, code_parts)
        self.closure_vars[var] = identity
        if local is not None:
            add_native_guard(
                builder, builder.get_guard_manager_from_source(local), identity, first.user_stack
            )
        else:
            builder.guard_manager.root.add_epilogue_lambda_guard(
                identity, identity.verbose_code_parts(), None
            )


def plan_tensor_containers(
    builder: GuardBuilder, guards: list[Guard], save_guards: bool
) -> TensorContainerPlan | None:
    """What the native guards check, planned before any guard is built."""
    if not config.tensor_container_guards or save_guards:
        return None
    output_graph = builder.check_fn_manager.output_graph
    if output_graph is None or output_graph.export:
        return None  # export keeps Python guard code for every tensor
    if builder.check_fn_manager.guard_build_local_state is not None:
        # Rebuilt from a saved package: TENSOR_MATCH computes dispatch keys from the
        # saved local state, the native records from the live tensors and TLS.
        return None
    min_size = max(config.tensor_container_guard_min_size, 2)
    # ID_MATCH too: torch.optim's step guards its tensors by identity only.
    if sum(1 for g in guards if g.create_fn_name() in ("TENSOR_MATCH", "ID_MATCH")) < min_size:
        return None
    ext = extension()
    if ext is None:
        return None
    containers = _plan_flat(builder, guards, min_size)
    taken = {m for c in containers for m in c.members}
    containers += _plan_nested(builder, guards, taken, min_size)
    plan = TensorContainerPlan(ext, containers)
    plan._plan_identity_records(builder, guards, min_size)
    plan._plan_grads(builder, guards)
    plan._plan_inner_dicts(builder, guards)
    plan._plan_identity_pairs(builder, guards, min_size)
    if not plan.containers and not plan.identity_pairs:
        return None
    return plan


def _plan_flat(builder: GuardBuilder, guards: list[Guard], min_size: int) -> list[Container]:
    """Lists, tuples and dicts of TENSOR_MATCH'd tensors."""
    from .guards import match_on_id_for_tensor

    output_graph = builder.check_fn_manager.output_graph
    dict_keys_guarded = {
        g.name for g in guards if g.create_fn_name() == "DICT_KEYS_MATCH"
    }
    containers: dict[str, Container] = {}
    # id(dict) -> {key: (position, the dict's own key object)}
    key_positions: dict[int, dict[Any, tuple[int, Any]]] = {}
    for guard in guards:
        if guard.create_fn_name() != "TENSOR_MATCH":
            continue
        source = guard.originating_source
        if match_on_id_for_tensor(guard) or isinstance(source, NumpyTensorSource):
            continue
        if config._unsafe_skip_fsdp_module_guards and guard.is_fsdp_module():
            continue
        if source not in output_graph.input_source_to_sizes_strides:
            continue
        located = _locate(builder, source, key_positions)
        if located is None:
            continue
        base, kind, locator, key = located
        if not supported_tensor(builder.get(source), output_graph.compile_on_one_rank):
            continue
        container = containers.get(base.name)
        if container is None:
            container = containers[base.name] = Container(
                base, base.name, kind, builder.get(base)
            )
        if container.kind != kind or locator in container.locators:
            continue  # a second source for one element keeps its own TENSOR_MATCH
        container.locators.add(locator)
        container.members[guard.name] = (locator, key)

    chosen = []
    for container in containers.values():
        if len(container.members) < min_size:
            continue
        if container.kind.startswith("dict") and not _plan_dict(
            builder, container, dict_keys_guarded
        ):
            continue
        if container.kind == "tuple" and not _plan_tuple(builder, container):
            continue
        chosen.append(container)
    return chosen


def supported_tensor(value: Any, compile_on_one_rank: bool = False) -> bool:
    """A tensor whose TENSOR_MATCH and dimension-marking guards a record can replace.

    Not an accelerator tensor under compile_on_one_rank: its TENSOR_MATCH accepts the
    current device index, while a record checks the recorded one."""
    from .guards import _guard_device_index_is_current

    attrs = extension().MARK_ATTRS
    return (
        type(value) in TENSOR_TYPES
        and not _guard_device_index_is_current(value, compile_on_one_rank)
        and value.layout == torch.strided
        and not value.is_nested
        and not hasattr(value, UNBACKED_MARK)
        and not any(hasattr(type(value), a) for a in attrs)
        # What mark_dynamic & co store; the native guard compares nothing else.
        and all(_is_set_of_ints(getattr(value, a)) for a in attrs if hasattr(value, a))
    )


def _is_set_of_ints(value: Any) -> bool:
    return type(value) in (set, frozenset) and all(type(i) is int for i in value)


def _locate(
    builder: GuardBuilder,
    source: Source,
    key_positions: dict[int, dict[Any, tuple[int, Any]]],
) -> tuple[Source, str, int, Any] | None:
    """(container source, kind, locator, dict key) of a container element, or None."""
    if istype(source, (GetItemSource, ListGetItemSource)):
        if source.index_is_slice or type(source.index) is not int:
            return None
        base_value = builder.get(source.base)
        if isinstance(base_value, list):
            kind = "list"
        elif isinstance(base_value, tuple):
            kind = "tuple"
        else:
            return None
        if source.index < 0:
            return None
        return source.base, kind, source.index, None
    if istype(source, (DictGetItemSource, DictSubclassGetItemSource)):
        base_value = builder.get(source.base)
        if not isinstance(base_value, dict):
            return None
        index = source.index
        if isinstance(index, ConstDictKeySource):
            if index.base != source.base:
                return None
            # Only reached through a DictGuardManager: checked in key order.
            return source.base, "dict_ordered", index.index, None
        if type(index) not in SIMPLE_KEY_TYPES:
            return None
        positions = key_positions.get(id(base_value))
        if positions is None:
            positions = key_positions[id(base_value)] = {
                k: (i, k) for i, k in enumerate(builtin_dict_keys(base_value))
            }
        if index not in positions:
            return None
        # The dict's own key object: the guard's fast path compares key pointers.
        position, key = positions[index]
        if builder.requires_key_order_guarding(source.base):
            return source.base, "dict_ordered", position, None
        return source.base, "dict_lookup", position, key
    return None


def _plan_dict(
    builder: GuardBuilder, container: Container, dict_keys_guarded: set[str]
) -> bool:
    value = container.value
    if container.kind == "dict_lookup":
        return True
    # Key order is guarded: the DictGuardManager with one key guard per key is
    # kept for anything else that needs it, and the container guard takes over
    # the key guards (DICT_KEYS_MATCH) on a second node for the same dict.
    if container.name not in dict_keys_guarded:
        return False
    # ID_MATCH keys (tensors, modules) keep their guards, which also track the key
    # objects' lifetime (CheckFunctionManager.id_ref).
    if any(type(key) not in SIMPLE_KEY_TYPES for key in builtin_dict_keys(value)):
        return False
    return second_node_accessor(builder, container.source) is not None


def _plan_tuple(builder: GuardBuilder, container: Container) -> bool:
    if node_checked_on_every_call(builder, container.source):
        return True
    # The guard goes on a second node, reached by an accessor that always runs it.
    container.on_second_node = True
    return second_node_accessor(builder, container.source, by_getitem=True) is not None


def node_checked_on_every_call(builder: GuardBuilder, source: Source) -> bool:
    """False if the node Dynamo builds for a tuple at source may be skipped.

    GuardBuilder.get_guard_manager_from_source reaches a global, an item of a dict
    whose key order is not guarded, an nn.Module attribute held in its __dict__
    and a keyword-only default through DictGetItemGuardAccessor. While the dict's
    version tag is unchanged, that accessor skips the node of an immutable value
    (with config.skip_tensor_guards_with_matching_dict_tags, a tuple of tensors)
    that has no accessors. Without this patch each tensor of the tuple has its
    own accessor on the tuple's node; with a TensorContainerGuard the node has
    leaf guards only. Skipped, the guard would record no identities for the
    aliasing group (whose first check then fails) and miss metadata changed in
    place (t.requires_grad_(), t.unsqueeze_(0)).
    """
    if istype(source, (LocalSource, GetItemSource, ListGetItemSource)):
        return True
    if istype(source, (DictGetItemSource, DictSubclassGetItemSource)):
        # A DictGuardManager checks its values' nodes itself, without tags.
        return builder.requires_key_order_guarding(source.base)
    if istype(source, (AttrSource, CellContentsSource, UnspecializedParamBufferSource)):
        from .guards import should_optimize_getattr_on_nn_module

        return not should_optimize_getattr_on_nn_module(builder.get(source.base))
    if istype(source, DefaultsSource):
        return not source.is_kw
    return False


def second_node_accessor(
    builder: GuardBuilder, source: Source, by_getitem: bool = False
) -> str | None:
    """How to reach a container a second time, as a plain GuardManager.

    by_getitem: not through DictGetItemGuardAccessor (see
    node_checked_on_every_call); a global or a dict item is then read with
    PyObject_GetItem, which runs no Python code on an exact dict.
    """
    if istype(source, LocalSource):
        return "framelocals"
    if istype(source, GlobalSource):
        if by_getitem:
            return "global_getitem" if type(builder.runtime_global_scope) is dict else None
        return "global"
    if not hasattr(source, "base") or builder.requires_key_order_guarding(source.base):
        return None  # a DictGuardManager parent takes no new accessors
    if istype(source, AttrSource):
        return "getattr"
    if istype(source, (DictGetItemSource, DictSubclassGetItemSource)):
        if type(source.index) not in SIMPLE_KEY_TYPES:
            return None
        if by_getitem:
            exact = istype(source, DictGetItemSource) and type(builder.get(source.base)) is dict
            return "getitem" if exact else None
        return "dict_getitem"
    if istype(source, (GetItemSource, ListGetItemSource)):
        if not source.index_is_slice and type(source.index) is int:
            return "getitem"
    return None


def second_node(builder: GuardBuilder, container: Container) -> Any:
    """A plain GuardManager for a dict that also has a DictGuardManager, or for
    a tuple whose own node may be skipped (node_checked_on_every_call)."""
    from .guards import get_framelocals_idx, GuardManagerType

    source = container.source
    # A distinct source string gives a new accessor next to the container's own node.
    name = f"{container.name} (tensor container)"
    kwargs = dict(
        source=name,
        example_value=container.value,
        guard_manager_enum=GuardManagerType.GUARD_MANAGER,
    )
    how = second_node_accessor(builder, source, by_getitem=container.kind == "tuple")
    if how == "framelocals":
        idx = get_framelocals_idx(builder.f_code, source.local_name)
        return builder.guard_manager.root.framelocals_manager(
            key=(source.local_name, idx), **kwargs
        )
    if how == "global":
        return builder.get_global_guard_manager().dict_getitem_manager(
            key=source.global_name, **kwargs
        )
    if how == "global_getitem":
        return builder.get_global_guard_manager().getitem_manager(
            key=source.global_name, **kwargs
        )
    parent = builder.get_guard_manager_from_source(source.base)
    if how == "getattr":
        return parent.getattr_manager(attr=source.member, **kwargs)
    if how == "dict_getitem":
        return parent.dict_getitem_manager(key=source.index, **kwargs)
    parent_value = builder.get(source.base)
    if isinstance(parent_value, list):
        return parent.list_getitem_manager(key=source.index, **kwargs)
    if isinstance(parent_value, tuple):
        return parent.tuple_getitem_manager(key=source.index, **kwargs)
    return parent.getitem_manager(key=source.index, **kwargs)


def add_native_guard(builder: GuardBuilder, node: Any, guard: Any, user_stack: Any) -> None:
    """Install a native guard on node and keep node out of dict tag matching.

    With config.use_recursive_dict_tags_for_guards, a tag safe node is skipped while
    the dict tags under its nn.Module root are unchanged
    (GuardManagerWrapper.find_tag_safe_roots). A native guard checks objects that
    have no node of their own, so its node would count as tag safe, but tensor
    metadata changes without touching any dict (requires_grad_(), .data = ...,
    t_()), and a skipped member of the aliasing group would keep the identities
    recorded for another module run through the same code.
    """
    # The guard's own list: the LAMBDA_GUARD leaf returns it from verbose_code_parts(),
    # so explain_guards finds the native guard of a leaf by identity.
    node.add_lambda_guard(guard, guard.verbose_code_parts(), user_stack)
    builder.guard_manager.tag_unsafe_sources.add(node.get_source())


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
    if second_node_accessor(builder, outer) is None:
        return None
    return inner


def _plan_nested(
    builder: GuardBuilder, guards: list[Guard], taken: set[str], min_size: int
) -> list[Container]:
    """dict_nested containers: outer[ConstDictKey(i)][str key] tensors."""
    from .guards import match_on_id_for_tensor

    output_graph = builder.check_fn_manager.output_graph
    containers: dict[str, Container] = {}
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
        if not supported_tensor(builder.get(source), output_graph.compile_on_one_rank):
            continue
        outer = inner.base
        outer_value = builder.get(outer)
        container = containers.get(outer.name)
        if container is None:
            container = containers[outer.name] = Container(
                outer, outer.name, "dict_nested", outer_value
            )
        locator = (inner.index.index, source.index)
        if locator in container.locators:
            continue
        container.locators.add(locator)
        container.members[guard.name] = locator
        container.inner_sources[inner.name] = inner.index.index
    return [c for c in containers.values() if len(c.members) >= min_size]


def install_tensor_container_guards(builder: GuardBuilder) -> bool:
    """Install the planned guards; True if the no-aliasing guard was taken over.

    Called where Dynamo installs NO_TENSOR_ALIASING. When it returns True, all
    tensors that would be under that guard (container members and single tensors,
    ``builder.no_tensor_aliasing_names``) are checked by one TensorAliasingGroup.
    """
    plan = builder.tensor_container_plan
    if plan is None:
        return False
    plan.install(builder)
    return True


def closure_vars(builder: GuardBuilder) -> dict[str, Any]:
    """Names the verbose code parts of the installed guards refer to."""
    plan = builder.tensor_container_plan
    return plan.closure_vars if plan is not None else {}
