"""Python numbers a compiled program keeps changing, traced as graph inputs instead of
being specialized on their value (config.scalar_state; pytorch #115711, #128319,
#140464).

Dynamo specializes an int or float it reads from an object attribute, a dict entry or
a list slot on its value. That is right for configuration (head counts, sizes) and
wrong for state: a module's ``self.step += 1``, an optimizer's ``state[p]['step']``,
an EMA in ``state[p]['ema']`` recompile on every call until the recompile limit, and
then run eagerly. State is told apart from configuration in two ways, both
change-driven (a value is specialized until it is seen to change):

- The frame stores a new value to the place (`on_store`, the one store hook, called
  by every store path: ``SideEffects.store_attr``, ``generic_setitem`` for dict
  entries and list slots, ``dict.update``). The place's source is recorded on the
  frame's code state (one record per place, `places`), the trace goes on with the
  constant and restarts once, before it compiles, for all the places it recorded
  (`restart_for_marked_places`). The restarted trace wraps each recorded place through
  `wrap_place`, the builder's one entry for them; the new value is written back by the
  residual bytecode of the mutation.
- The value changes between calls, from outside the frame (an LR scheduler's lr, a
  counter another frame steps): automatic dynamic sees the change after one recompile.
  Ints Dynamo would specialize whatever automatic dynamic says (nn.Module attributes,
  places reached from globals) are then traced as dynamic SymInts (`wrap_changed_int`);
  floats at an object's attribute or in a container as FLOAT_TENSOR inputs, the same
  representation as a float the frame stores to (`wrap_changed_float`).

How a place is traced is its record (`places`: source name -> kind):

- SYMINT: an int, a DYNAMIC SymInt graph input. Inductor computes SymInts in int64
  where Python ints do not overflow: every int the graph computes from it is guarded to
  fit (_Int64Check), and one that does not fit on the frame's values restarts with the
  place SPECIALIZED_INT.
- FLOAT_TENSOR: a float, a 0-d float64 tensor graph input held by
  variables/float_as_tensor.py's FloatAsTensorVariable, whose arithmetic is Python's to
  the bit; a use it cannot trace as Python would records DEFAULT_FLOAT (wrapped as
  without this module, a SymFloat once it changes) or, for uses Dynamo gets wrong on a
  SymFloat, SPECIALIZED_FLOAT (a constant).

Records live on the PGO CodeState of the frame's code (`code_state`; a resume function
after a graph break uses its original frame's), so they survive recompiles and, with
PGO, processes. Places that are only read stay specialized. Each place is recorded at
most twice (marked, then specialized), so a frame restarts at most twice for it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from typing import Any, TYPE_CHECKING

import torch
from torch.fx.experimental.symbolic_shapes import guard_bool, statically_known_true

from . import config
from .exc import UnspecializeRestartAnalysis

if TYPE_CHECKING:
    from collections.abc import Iterator

    import sympy

    from .output_graph import OutputGraph
    from .source import Source
    from .symbolic_convert import InstructionTranslatorBase
    from .variables.base import VariableTracker
    from .variables.builder import VariableBuilder


log = logging.getLogger(__name__)
recompiles_log = torch._logging.getArtifactLogger(__name__, "recompiles")

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# How a recorded place is traced: its record in CodeState.scalar_places.
SYMINT = "SymInt"  # a DYNAMIC SymInt graph input
SPECIALIZED_INT = "specialized int"  # the graph computed an int beyond int64 from it
FLOAT_TENSOR = "float64 tensor"  # a 0-d float64 tensor graph input
DEFAULT_FLOAT = "default float"  # a use the tensor form cannot trace: wrapped as without this module
SPECIALIZED_FLOAT = "specialized float"  # such a use that a SymFloat gets wrong: a constant
_FLOAT_RECORDS = (FLOAT_TENSOR, DEFAULT_FLOAT, SPECIALIZED_FLOAT)


def enabled() -> bool:
    # Respects automatic_dynamic_shapes=False the way allow_unspec_int_on_nn_module
    # does: the user asked for no automatic dynamism, so scalars stay specialized.
    return config.scalar_state and config.automatic_dynamic_shapes


def code_state(tx: InstructionTranslatorBase) -> Any:
    """The PGO CodeState that keeps the records of the frame `tx` traces: its root
    frame's, or for a resume function after a graph break, the original frame's (its
    locals keep their names, so the rest of the frame sees the same places)."""
    from .pgo import CodeId, get_code_state
    from .resume_execution import ContinueExecutionCache

    root = tx.output.root_tx
    code = root.f_code
    meta = ContinueExecutionCache.generated_code_metadata.get(code)
    if meta is not None:
        code = meta.code
    return get_code_state()[CodeId.make(code, root.closure)]


def places(tx: InstructionTranslatorBase) -> dict[str, str]:
    """The records of the frame `tx` traces: source name -> how the place is traced."""
    state = code_state(tx)
    records = getattr(state, "scalar_places", None)
    if records is None:  # a CodeState unpickled from a profile written before the field existed
        records = state.scalar_places = {}
    return records


# ---------------------------------------------------------------------------------
# The store hook


def _original_value(item: VariableTracker, name: str) -> Any:
    # Only instance attributes: a class-level default shadowed by the store is left to
    # the default wrapping.
    instance_dict = getattr(getattr(item, "value", None), "__dict__", None)
    if not isinstance(instance_dict, dict):
        return None
    return instance_dict.get(name)


def _entered_value(vt: VariableTracker | None) -> tuple[Any, Source | None]:
    """The Python number `vt` holds if it entered the frame at a sourced place and the
    frame has not replaced it, with that source; else (None, None)."""
    from .variables.constant import ConstantVariable
    from .variables.lazy import LazyVariableTracker

    if vt is None or vt.source is None:
        return None, None
    if isinstance(vt, LazyVariableTracker):
        if not vt.is_realized():
            return vt.peek_value(), vt.source
        vt = vt.unwrap()
    if type(vt) is ConstantVariable and vt.source is not None:
        return vt.value, vt.source
    return None, None


def _stored_place(obj: VariableTracker, key: str | VariableTracker) -> tuple[Any, Source | None]:
    """The number that entered the frame at ``obj.key`` (key a str) or ``obj[key]``
    (a dict entry or list slot), and that place's source; (None, None) if none did."""
    from .source import AttrSource
    from .variables.dicts import ConstDictVariable
    from .variables.lists import ListVariable
    from .variables.user_defined import UserDefinedObjectVariable

    if isinstance(key, str):
        if not isinstance(obj, UserDefinedObjectVariable):
            return None, None
        return _original_value(obj, key), AttrSource(obj.source, key)
    obj = obj.realize()
    old_vt = None
    if isinstance(obj, ConstDictVariable):
        if key.is_python_constant():  # tensor keys hold tensors in an optimizer's state
            old_vt = obj.maybe_getitem_const(key)
    elif type(obj) is ListVariable and key.is_python_constant():
        index = key.as_python_constant()
        if type(index) is int and -len(obj.items) <= index < len(obj.items):
            old_vt = obj.items[index]
    return _entered_value(old_vt)


def on_store(obj: VariableTracker, key: str | VariableTracker, value: VariableTracker) -> None:
    """The frame stores `value` to ``obj.key`` (key a str: an attribute) or ``obj[key]``
    (a dict entry or list slot). If a number entered the frame at that sourced place
    and the frame stores a different one, record how the place is traced from now on
    (`_decide`); the trace goes on and restarts before it compiles."""
    from .symbolic_convert import InstructionTranslator

    if not enabled() or obj.source is None:
        return
    old, source = _stored_place(obj, key)
    if source is None or type(old) not in (int, float):
        return
    tx = InstructionTranslator.current_tx()
    record = _decide(tx, old, value)
    if record is None:
        return
    records = places(tx)
    source_name = source.name
    if source_name in records:
        return  # recorded already: each place is marked once
    records[source_name] = record
    new = repr(value.as_python_constant()) if value.is_python_constant() else "a SymFloat"
    if record == SYMINT:
        reason = f"{source_name} is a scalar mutated in the frame ({old!r} -> {new}); tracing it symbolically"
    else:
        reason = f"{source_name} is a float mutated in the frame ({old!r} -> {new}); tracing it as a {record} input"
    note_marked_place(tx, reason)


def _decide(tx: InstructionTranslatorBase, old: int | float, value: VariableTracker) -> str | None:
    """How a place holding `old` that the frame stores `value` to is traced: None if
    the store is no change (or not a number)."""
    from .variables.tensor import SymNodeVariable

    if type(old) is int:
        if config.specialize_int or not value.is_python_constant():
            return None  # already symbolic (or not a number)
        new = value.as_python_constant()
        return SYMINT if type(new) is int and new != old else None
    if isinstance(value, SymNodeVariable):
        # a SymFloat (computed from a SymInt counter, say): written back as a SymFloat,
        # _tensorify_python_scalars would specialize it per value
        changed = value.python_type() is float
    elif value.is_python_constant():
        new = value.as_python_constant()
        changed = type(new) is float and new != old and not (new != new and old != old)
    else:
        changed = False  # already a tensor input, or not a number
    return float_representation(tx) if changed else None


def float_representation(tx: InstructionTranslatorBase) -> str | None:
    """How a float place is traced once it is seen to change, whether the frame stores
    to it or it changes between calls: a FLOAT_TENSOR input. Not a SymFloat, as
    without this module: _tensorify_python_scalars specializes a SymFloat per value
    wherever it feeds an op the pass has no tensor form for, inductor writes a
    SymFloat graph output back stale, and the shape environment guards it with a
    Python NaN check at the guard root. None where no float input can be made:
    specialize_float (the user asked for static floats), export (local inputs only),
    cudagraphs (no CPU float64 input, as in wrap_symfloat)."""
    if config.specialize_float or tx.export or torch._inductor.config.triton.cudagraphs:
        return None
    return FLOAT_TENSOR


def note_marked_place(tx: InstructionTranslatorBase, reason: str) -> None:
    """A place this trace read as a constant is now recorded (`reason` says which and
    how it is traced): the trace goes on and restarts before it compiles."""
    log.debug("%s; restarting before the graph is compiled", reason)
    tx.output.marked_scalar_places.append(reason)


def on_dict_update(container: VariableTracker, args: list[VariableTracker], kwargs: dict[str, VariableTracker]) -> None:
    """``d.update(other)`` with a dict, or keyword arguments: each entry as a store to
    ``d[key]``. The iterable-of-pairs form is left as it is (no sourced number names
    its place)."""
    from .variables.constant import ConstantVariable
    from .variables.dicts import ConstDictVariable

    if not enabled() or container.source is None or len(args) > 1:
        return
    pairs = []
    if args:
        other = args[0].realize()
        if not isinstance(other, ConstDictVariable):
            return
        pairs = [(k.vt, v) for k, v in other.items.items()]
    pairs += [(ConstantVariable.create(k), v) for k, v in kwargs.items()]
    for key, value in pairs:
        on_store(container, key, value)


# ---------------------------------------------------------------------------------
# The restart

# Restart reasons name this many places, then count the rest.
_MAX_NAMED_PLACES = 3


def restart_for_marked_places(output: OutputGraph) -> UnspecializeRestartAnalysis:
    """The restart of a trace that recorded places (one for all of them)."""
    reasons = output.marked_scalar_places
    named = "; ".join(reasons[:_MAX_NAMED_PLACES])
    if len(reasons) > _MAX_NAMED_PLACES:
        named += f"; and {len(reasons) - _MAX_NAMED_PLACES} more places"
    return UnspecializeRestartAnalysis(named, restart_reason=named)


@contextlib.contextmanager
def restart_on_error_if_places_marked(output: OutputGraph) -> Iterator[None]:
    """Around a frame's trace: a trace that recorded places and then fails (an error, a
    skipped frame, a speculation restart) restarts with them recorded instead; what it
    did after the records used their stale constants. The restarted trace records none
    of them again, so it fails as it would have, if at all."""
    try:
        yield
    except UnspecializeRestartAnalysis:
        raise
    except Exception as e:
        if output.marked_scalar_places:
            raise restart_for_marked_places(output) from e
        raise


# ---------------------------------------------------------------------------------
# The wrap path


def wrap_place(builder: VariableBuilder, value: Any) -> VariableTracker | None:
    """The builder's entry for an int or float at a recorded place: the variable it is
    traced as, or None to wrap it as without this module."""
    from .guards import GuardBuilder
    from .variables.constant import ConstantVariable

    if not enabled() or type(value) not in (int, float) or config._dynamic_shapes_spec is not None:
        return None
    tx = builder.tx
    record = places(tx).get(builder.source.name)
    if type(value) is int:
        if record != SYMINT or config.specialize_int or not _INT64_MIN <= value <= _INT64_MAX:
            return None  # no int64 holds it: specialized
        log.debug("%s is a scalar the frame stores to", builder.source.name)
        return _wrap_symint(builder, value)
    if record not in _FLOAT_RECORDS:
        return None
    if record == SPECIALIZED_FLOAT:
        builder.install_guards(GuardBuilder.CONSTANT_MATCH)
        return ConstantVariable.create(value=value, source=builder.source)
    if float_representation(tx) is None:
        return None
    if record != FLOAT_TENSOR:
        # Recorded otherwise by a use later in this trace (which goes on until the
        # restart): the rest of it reads the same tensor input.
        var = tx.output.unspec_variable_map.get(builder.source.name)
        if var is None or not is_place_input(var):
            return None
    return _wrap_float_tensor(builder, value)


def _wrap_symint(builder: VariableBuilder, value: int) -> VariableTracker:
    """The int at builder.source as a DYNAMIC SymInt graph input, each int the graph
    computes from it checked by the graph's _Int64Check."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    from .variables.tensor import SymNodeVariable

    output = builder.tx.output
    new = builder.name not in output.unspec_variable_map
    var = builder.wrap_symint(value, dynamism=DimDynamic.DYNAMIC)
    if new and isinstance(var, SymNodeVariable) and isinstance(var.sym_num, torch.SymInt):
        check = next((f for f in output.register_finalizer_fns if isinstance(f, _Int64Check)), None)
        if check is None:
            check = _Int64Check(places(builder.tx))
            output.add_graph_finalizer(check)
        check.symbols[var.sym_num.node.expr] = builder.source.name
        note_place_input(var)
    return var


def _wrap_float_tensor(builder: VariableBuilder, value: float) -> VariableTracker | None:
    """The float at builder.source as a FloatAsTensorVariable over a 0-d float64 tensor
    graph input, or None to leave it to the default wrapping."""
    from .variables.float_as_tensor import FloatAsTensorVariable, PythonFloat

    tensor = builder.tx.output.unspec_variable_map.get(builder.name)
    if tensor is None:
        tensor = builder.wrap_float_as_tensor_input(value, item_symbol=False)
        if tensor is None:
            return None
        note_place_input(tensor)
    expr = PythonFloat(builder.source.name, value, (builder.source,))
    return FloatAsTensorVariable(tensor, frozenset({builder.source.name}), expr, source=builder.source)


# node.meta key of the graph inputs made for recorded places (only_place_arithmetic)
_PLACE_INPUT = "dynamo_marked_scalar_place"


def note_place_input(var: VariableTracker) -> None:
    """`var` is the graph input made for a recorded place."""
    var.as_proxy().node.meta[_PLACE_INPUT] = True


def is_place_input(var: VariableTracker) -> bool:
    """Whether `var` is a graph input made for a recorded place (note_place_input)."""
    return bool(var.as_proxy().node.meta.get(_PLACE_INPUT))


def only_place_arithmetic(output: OutputGraph) -> bool:
    """True if every call in the graph computes a number (a SymInt, or a 0-d tensor
    holding one) from graph inputs made for recorded places and nothing else: a
    counter's ``step + 1`` in a frame without tensor work. Without this module the
    places are constants Dynamo folds, the graph has no op and Dynamo skips the frame
    ("No ops traced"); such a frame is skipped here too, instead of compiling a graph
    that recompiles for every value the frame's other numbers take (a float handed to a
    resume function after ``.item()``)."""
    scalars: set[torch.fx.Node] = set()
    calls = False
    for node in output.graph.nodes:
        if node.op == "placeholder":
            if node.meta.get(_PLACE_INPUT):
                scalars.add(node)
        elif "call" in node.op:
            value = node.meta.get("example_value")
            scalar = isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) or (
                isinstance(value, torch.Tensor) and value.dim() == 0
            )
            inputs = node.all_input_nodes
            if not (scalar and inputs and all(n in scalars for n in inputs)):
                return False
            scalars.add(node)
            calls = True
    return calls


class _Int64Check:
    """A graph finalizer: every int the graph computes from the symbols of SYMINT
    places must fit in int64, as inductor computes it (``self.step * 3`` wraps around
    in its kernel beyond 2**63 / 3, the Python int does not). Each gets a guard that it
    fits unless the shape environment knows it does; if one does not fit on this
    frame's values, analysis restarts with its places SPECIALIZED_INT."""

    def __init__(self, records: dict[str, str]) -> None:
        self.symbols: dict[sympy.Symbol, str] = {}
        self.records = records

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        for module in gm.modules():
            if isinstance(module, torch.fx.GraphModule):
                for node in module.graph.nodes:
                    value = node.meta.get("example_value")
                    if isinstance(value, torch.SymInt):
                        self._check(value)

    def _check(self, value: torch.SymInt) -> None:
        names = sorted({self.symbols[s] for s in value.node.expr.free_symbols if s in self.symbols})
        if not names:
            return
        for fits in (value >= _INT64_MIN, value <= _INT64_MAX):
            if statically_known_true(fits) or (value.node.has_hint() and guard_bool(fits)):
                continue
            self.records.update(dict.fromkeys(names, SPECIALIZED_INT))
            log.debug("%s computes %s beyond int64: restarting with them specialized", names, value)
            raise UnspecializeRestartAnalysis(
                f"the graph computes {value} from {', '.join(names)} beyond int64; specializing them"
            )


# ---------------------------------------------------------------------------------
# Changes from outside the frame


def _changes_make_dynamic(source: Source) -> bool:
    from .source import ChainedSource, is_from_defaults

    return (
        enabled()
        and not config.specialize_int
        and isinstance(source, ChainedSource)
        and not is_from_defaults(source)
        # Ints of torch.nn's own modules and of torch._dynamo.mark_static classes (both
        # UNSPECIALIZED_BUILTIN_NN_MODULE) or of specialized modules are promised
        # constant, as without this module: mark_static documents "not symints".
        and not source.guard_source.is_unspecialized_builtin_nn_module()
        and not source.guard_source.is_specialized_nn_module()
    )


def _is_resume_function_local(tx: InstructionTranslatorBase, source: Source) -> bool:
    """A local (or stack value) of a resume function: a float the program computed
    before a graph break (an item(), a float read from a group) and goes on with after
    it, a new value every call, as a frame-stored place's is."""
    from .resume_execution import TORCH_DYNAMO_RESUME_IN_PREFIX
    from .source import LocalSource

    return (
        enabled()
        and isinstance(source, LocalSource)
        and tx.output.root_tx.f_code.co_name.startswith(TORCH_DYNAMO_RESUME_IN_PREFIX)
    )


def wrap_changed_int(builder: VariableBuilder, value: int, entry: Any) -> VariableTracker | None:
    """The int `value` at builder.source, which Dynamo specializes whatever automatic
    dynamic says (is_int_specialization_case), as a DYNAMIC SymInt if automatic dynamic
    has seen it change between compiles (`entry`, its FrameStateSizeEntry) and it is
    at an object's attribute or in a container; else None. Not beyond int64, nor once
    the graph computed an int beyond int64 from it (_Int64Check)."""
    from .pgo import auto_dynamic

    source = builder.source
    if (
        entry.scalar is not auto_dynamic
        or not _changes_make_dynamic(source)
        or not _INT64_MIN <= value <= _INT64_MAX
        or places(builder.tx).get(source.name) == SPECIALIZED_INT
    ):
        return None
    recompiles_log.info("%s changed between calls: it is now traced as a dynamic SymInt", source.name)
    return _wrap_symint(builder, value)


def changed_int_hint(source: Source, hint: str | None) -> str | None:
    """The recompile hint of the value guard on such an int: say that a change makes
    it dynamic (shown with the guard failure that recompiles)."""
    if not _changes_make_dynamic(source):
        return hint
    return (
        f"{source.name} is specialized until it changes; the recompile traces it as a dynamic SymInt "
        "(torch._dynamo.config.scalar_state)"
    )


def wrap_changed_float(builder: VariableBuilder, value: float) -> VariableTracker | None:
    """The float `value` at builder.source, which automatic dynamic has seen change
    between compiles, as a FLOAT_TENSOR input (the float representation of a place the
    frame stores to), recorded so, where it is at an object's attribute or in a
    container and no use recorded it otherwise; else None (a SymFloat, as without this
    module)."""
    source = builder.source
    records = places(builder.tx)
    if (
        not (
            _changes_make_dynamic(source)
            or _is_resume_function_local(builder.tx, source)
            or records.get(source.name) == FLOAT_TENSOR  # restart_instead_of_pinning_floats
        )
        or records.get(source.name, FLOAT_TENSOR) != FLOAT_TENSOR
        or float_representation(builder.tx) is None
    ):
        return None
    var = _wrap_float_tensor(builder, value)
    if var is not None:
        records[source.name] = FLOAT_TENSOR
        recompiles_log.info("%s changed between calls: it is now traced as a float64 tensor input", source.name)
    return var


def restart_instead_of_pinning_floats(output: OutputGraph) -> None:
    """Before remove_tensorify_specialized_graphargs pins the SymFloat inputs that
    _tensorify_python_scalars could not keep symbolic (an op with no tensor form for
    them: a foreach Scalar, a clamp bound), which then recompiles on every value: those
    that are locals of the frame (a float argument that automatic dynamic saw change,
    such as a step size handed to a per-step helper) are recorded FLOAT_TENSOR, and the
    trace restarts to trace them so. Places at attributes or in containers are already
    FLOAT_TENSOR once they change (wrap_changed_float); a local some use recorded
    otherwise keeps that record."""
    from torch._dynamo.symbolic_convert import TensorifyState

    from .source import LocalSource

    if not enabled() or float_representation(output.root_tx) is None:
        return
    records = places(output.root_tx)
    for node in output.graph.find_nodes(op="placeholder"):
        grapharg = node.meta.get("grapharg")
        memo = getattr(node.meta.get("example_value"), "item_memo", None)
        if (
            grapharg is None
            or not isinstance(grapharg.source, LocalSource)
            or grapharg.source.name in records
            or memo is None
            or not TensorifyState.should_specialize(getattr(memo.node._expr, "name", None))
        ):
            continue
        records[grapharg.source.name] = FLOAT_TENSOR
        note_marked_place(
            output.root_tx,
            f"{grapharg.source.name} changed between calls and feeds an op that takes no "
            "SymFloat: it is now traced as a float64 tensor input",
        )
    if output.marked_scalar_places:
        raise restart_for_marked_places(output)


def changed_float_guard(source: Source, value: float, entry: Any) -> Any:
    """The guard on a float at `source` that wrap_symfloat specializes because automatic
    dynamic has not seen it change yet (`entry`, its FrameStateSizeEntry): its value
    guard, with a recompile hint saying that a change makes it a float64 tensor input
    where one makes it so (the other reasons wrap_symfloat specializes for never change)."""
    from .guards import GuardBuilder
    from .pgo import auto_dynamic
    from .source import is_constant_source

    if (
        not _changes_make_dynamic(source)
        or config.specialize_float
        or not config.assume_static_by_default
        or entry.scalar is auto_dynamic
        or not math.isfinite(value)
        or is_constant_source(source)
        or torch._inductor.config.triton.cudagraphs
    ):
        return GuardBuilder.CONSTANT_MATCH
    hint = (
        f"{source.name} is specialized until it changes; the recompile traces it as a float64 tensor input "
        "(torch._dynamo.config.scalar_state)"
    )
    return functools.partial(GuardBuilder.EQUALS_MATCH, recompile_hint=hint)
