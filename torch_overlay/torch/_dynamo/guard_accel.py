"""One native guard for each large list, tuple or dict of tensors.

Without this module, Dynamo gives every tensor of a container its own node in the
guard tree: an accessor (``xs[i]``), a TENSOR_MATCH leaf, a
DIMENSION_DYNAMIC_MARKING_GUARD leaf and a share of the relational
NO_TENSOR_ALIASING guard. A container of 1,000 tensors costs about 100 us per guard
check and 10,000 tensors several ms, on every call.

For containers of at least ``config.tensor_container_guard_min_size`` tensors, this
module replaces those nodes with one ``TensorContainerGuard`` leaf on the container's
node (``torch._dynamo._guard_accel``, C++): it keeps what TENSOR_MATCH and the
dimension-marking guard check about each tensor as flat records and compares a whole
container in one loop. All tensors of the frame that would be under the no-aliasing
guard are then checked by one ``TensorAliasingGroup`` instead, run as an epilogue
guard: a pointer compare when nothing changed, a hash set otherwise.

The guard builder calls in at four points (guards.py):

* ``CheckFunctionManager.build_guards``: ``plan_tensor_containers`` picks the
  containers before any guard is created;
* ``GuardBuilder.TENSOR_MATCH``: a tensor of a planned container is recorded by
  ``TensorContainerPlan.add_tensor`` instead of getting its own node;
* ``GuardBuilder.DICT_KEYS_MATCH``: the key-order guards of a planned dict are left
  to its container guard (``TensorContainerPlan.owns_dict_keys``);
* ``compile_check_fn``: ``install_tensor_container_guards`` adds the guards; the
  nodes they go on are never tag safe (``add_native_guard``).

Without the extension (or with ``config.tensor_container_guards = False``) nothing
changes: Dynamo's per-tensor guards are used, and a missing extension is reported once.

API for modules that plan more containers (guard_accel_nested.py): ``Container`` and
``TensorRecord`` are what a plan holds; ``TensorContainerPlan.route`` sends a guard's
TENSOR_MATCH to a container, ``tensor_record`` makes the record of a TENSOR_MATCH and
``install`` installs the plan; ``install_container_guard`` and ``install_aliasing_group``
install one container's guard and the aliasing group.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
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
    """A list, tuple or dict whose tensors one TensorContainerGuard checks."""

    source: Source
    name: str
    kind: str  # "list", "tuple", "dict_lookup" or "dict_ordered"
    value: Any
    # guard name -> (locator, dict key); locator is the list index or dict position
    members: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    locators: set[Any] = dataclasses.field(default_factory=set)
    records: list[TensorRecord] = dataclasses.field(default_factory=list)
    guard: Guard | None = None  # the first TENSOR_MATCH recorded (user stack, export info)
    diff_source: bool = False  # has a non-Parameter tensor (see TENSOR_MATCH)
    on_second_node: bool = False  # a tuple whose own node may be skipped (_plan_tuple)

    def guard_arguments(self) -> tuple[type, Any]:
        """(dict_type, ordered_keys) for make_tensor_container_guard."""
        if self.kind == "dict_ordered":
            return type(self.value), list(builtin_dict_keys(self.value))
        return type(self.value), None

    def sorted_records(self) -> list[TensorRecord]:
        return sorted(self.records, key=lambda r: r.locator)

    def node(self, builder: GuardBuilder) -> Any:
        """The guard manager the container guard goes on."""
        if self.kind == "dict_ordered" or self.on_second_node:
            return second_node(builder, self)
        return builder.get_guard_manager_from_source(self.source)


class TensorContainerPlan:
    """The containers of one frame whose tensors get a TensorContainerGuard."""

    def __init__(self, extension: Any, containers: list[Container]) -> None:
        self.extension = extension
        self.containers = containers
        self._by_member = {
            member: c for c in containers for member in c.members
        }
        self._ordered_dicts = {
            c.name for c in containers if c.kind == "dict_ordered"
        }
        self.closure_vars: dict[str, Any] = {}

    def container_of(self, guard_name: str) -> Container | None:
        """The planned container whose record the TENSOR_MATCH of guard_name becomes."""
        return self._by_member.get(guard_name)

    def route(self, guard_name: str, container: Container | None) -> None:
        """Record the TENSOR_MATCH of guard_name in container (None: build it as usual)."""
        if container is None:
            self._by_member.pop(guard_name, None)
        else:
            self._by_member[guard_name] = container

    def add_tensor(self, builder: GuardBuilder, guard: Guard, value: Any) -> bool:
        """Record a TENSOR_MATCH of a planned container; False: build it as usual."""
        container = self._by_member.get(guard.name)
        if container is None:
            return False
        locator, key = container.members[guard.name]
        container.records.append(self.tensor_record(builder, guard, value, locator, key))
        if not isinstance(value, torch.nn.Parameter):
            container.diff_source = True
        if container.guard is None:
            container.guard = guard
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

    def owns_dict_keys(self, guard: Guard) -> bool:
        """True if a planned container guard checks this dict's keys and their order."""
        return guard.name in self._ordered_dicts

    def install(self, builder: GuardBuilder) -> None:
        """The container guards and the frame's aliasing group."""
        group = self.extension.TensorAliasingGroup()
        for i, container in enumerate(self.containers):
            install_container_guard(builder, self, container, f"___tensor_container_{i}", group)
        install_aliasing_group(builder, self, group)


def plan_tensor_containers(
    builder: GuardBuilder, guards: list[Guard], save_guards: bool
) -> TensorContainerPlan | None:
    """Pick the containers whose tensors get one native guard, before guards are built."""
    if not config.tensor_container_guards or save_guards:
        return None
    output_graph = builder.check_fn_manager.output_graph
    if output_graph is None or output_graph.export:
        return None  # export keeps Python guard code for every tensor
    min_size = max(config.tensor_container_guard_min_size, 2)
    tensor_guards = [g for g in guards if g.create_fn_name() == "TENSOR_MATCH"]
    if len(tensor_guards) < min_size:
        return None
    ext = extension()
    if ext is None:
        return None

    from .guards import match_on_id_for_tensor

    dict_keys_guarded = {
        g.name for g in guards if g.create_fn_name() == "DICT_KEYS_MATCH"
    }
    containers: dict[str, Container] = {}
    # id(dict) -> {key: (position, the dict's own key object)}
    key_positions: dict[int, dict[Any, tuple[int, Any]]] = {}
    for guard in tensor_guards:
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
        if not supported_tensor(builder.get(source)):
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
    return TensorContainerPlan(ext, chosen) if chosen else None


def supported_tensor(value: Any) -> bool:
    """A tensor whose TENSOR_MATCH and dimension-marking guards a record can replace."""
    attrs = extension().MARK_ATTRS
    return (
        type(value) in TENSOR_TYPES
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


def add_native_guard(
    builder: GuardBuilder,
    node: Any,
    guard: Any,
    verbose_code_parts: list[str],
    user_stack: Any,
) -> None:
    """Install a native guard on node and keep node out of dict tag matching.

    With config.use_recursive_dict_tags_for_guards, a tag safe node is skipped while
    the dict tags under its nn.Module root are unchanged
    (GuardManagerWrapper.find_tag_safe_roots). A native guard checks objects that
    have no node of their own, so its node would count as tag safe, but tensor
    metadata changes without touching any dict (requires_grad_(), .data = ...,
    t_()), and a skipped member of the aliasing group would keep the identities
    recorded for another module run through the same code.
    """
    node.add_lambda_guard(guard, verbose_code_parts, user_stack)
    builder.guard_manager.tag_unsafe_sources.add(node.get_source())


def install_container_guard(
    builder: GuardBuilder,
    plan: TensorContainerPlan,
    container: Container,
    var: str,
    group: Any,
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
    guard_fn = plan.extension.make_tensor_container_guard(
        container.kind, ref, dict_type, ordered_keys, records, group
    )
    plan.closure_vars[var] = guard_fn
    node = container.node(builder)
    # Recompile reasons evaluate the parts in order: the first one evaluates to
    # the reason ("xs[417]: dtype changed float32 -> float64").
    verbose_code_parts = get_verbose_code_parts(
        [f"{var}.explain({ref})", f"{var}({ref})"], container.guard
    )
    add_native_guard(
        builder, node, guard_fn, verbose_code_parts, container.guard.user_stack
    )
    if container.diff_source:
        builder.guard_manager.diff_guard_sources.add(node.get_source())
    log.debug("%s: %d tensors checked by one TensorContainerGuard", ref, len(records))
    # The guard keeps metadata only; do not keep the frame's tensors alive.
    container.records = []
    container.value = None


def install_aliasing_group(
    builder: GuardBuilder, plan: TensorContainerPlan, group: Any
) -> None:
    """The frame's no-aliasing check: group, with the tensors that are not in a container.

    Called after every container guard joined group. The single tensors
    (``builder.no_tensor_aliasing_names``) record their identities into group from
    their own nodes, and group decides as an epilogue guard.
    """
    names = builder.no_tensor_aliasing_names
    if group.num_tensors() + len(names) <= 1:
        return  # a single tensor cannot alias; the group stays unused
    for name, manager in zip(names, builder.no_tensor_aliasing_guard_managers):
        add_native_guard(
            builder,
            manager,
            group.add_tensor(name),
            [f"___tensor_aliasing_group  # records {name} for the no-aliasing check"],
            None,
        )
    plan.closure_vars["___tensor_aliasing_group"] = group
    builder.guard_manager.root.add_epilogue_lambda_guard(
        group,
        [
            "___tensor_aliasing_group.explain()",
            f"___tensor_aliasing_group()  # no aliasing among {group.num_tensors()} tensors",
        ],
        None,
    )


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
