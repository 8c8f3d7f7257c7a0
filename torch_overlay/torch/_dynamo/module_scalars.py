"""Scalar places a compiled frame keeps changing, traced symbolically: the mechanism,
and nn.Module int attributes (the first kind of place and number it serves).

Dynamo specializes int attributes of nn.Modules (EQUALS_MATCH on the value), which is
right for configuration (head counts, sizes) and wrong for counters: a module doing
``self.step += 1`` recompiles on every call until it hits the recompile limit and
runs eagerly (pytorch #115711, #128319, #140464).

What tells the two apart is the frame itself: a counter is *stored to* with a new
value. The mechanism, which every kind of place and number goes through:

- One store hook, `mark_stored(source, old, value)`: the number `old` entered the
  frame at the sourced place `source`, which the frame stores `value` to. It calls the
  marker registered for type(old): `mark_stored_int` here; variables/module_float.py
  registers floats. Callers find the place: ``SideEffects.store_attr`` on a module
  (`unspecialize_on_store`, here), scalar_state.py's stores to other objects, dict
  entries and list slots.
- One code state per frame (`code_state`): the PGO ``CodeState`` of the root frame's
  code, or for a resume function after a graph break, the original frame's, so the
  rest of the frame sees the same places marked; marks survive recompiles (and, with
  PGO, processes).
- One record per place (`scalar_places`: source name -> how it is traced): SYMINT,
  SPECIALIZED_INT, or module_float's kinds. The builder reads it when it wraps the
  place.
- One restart per frame: a marker notes the mark on the OutputGraph
  (`note_marked_place`) and the trace goes on with the place's constant, as without
  this module; it restarts once, for every place it marked, before it compiles a graph
  (OutputGraph.compile_subgraph) or when it ends in an exception
  (`restart_on_error_if_places_marked`). One restart per place would make a frame
  stepping 1,000 counters hit Dynamo's limit of 100 restarts.

An int marked SYMINT is wrapped by ``VariableBuilder.wrap_literal`` as a DYNAMIC
SymInt, so it is a graph input from the first compile; the new value is returned by
the graph and written back by residual bytecode, as for any attribute mutation.
Guards are then only what the shape environment needs: branches on the value
(``step % 2 == 0``) guard on that relation, never on the value itself.

Python ints do not overflow, inductor's kernels compute in int64: a value outside
int64 is specialized as without this patch, and every int the graph computes from
the SymInt (``self.step * 3``, the graph input itself) gets a guard that it fits in
int64 unless the shape environment knows it does (_Int64Check). One that does not
fit on the frame's values restarts analysis with the place recorded SPECIALIZED_INT.

Places that are only read stay specialized, as without this module. Each place is
marked once.
"""
from __future__ import annotations

import contextlib
import logging
import operator
from typing import Any, TYPE_CHECKING

import torch
from torch.fx.experimental.symbolic_shapes import guard_bool, statically_known_true

from . import config
from .exc import raise_observed_exception, UnspecializeRestartAnalysis

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import sympy

    from .output_graph import OutputGraph
    from .source import Source
    from .symbolic_convert import InstructionTranslatorBase
    from .variables.base import VariableTracker
    from .variables.builder import VariableBuilder


log = logging.getLogger(__name__)

# The scalar types that are made symbolic: exact int (bool is excluded). Floats are
# not made SymFloats: AOTAutograd's _tensorify_python_scalars pass specializes a
# written-back SymFloat (one recompile per value under aot_eager) and inductor writes
# back a stale value (wrong results). variables/module_float.py traces them as 0-d
# float64 tensor inputs instead.
SCALAR_TYPES = (int,)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# How a marked place is traced: its record in CodeState.scalar_places. A place has one
# record; the first mark of a place of its type decides, a later one only specializes.
SYMINT = "SymInt"  # a DYNAMIC SymInt graph input
SPECIALIZED_INT = "specialized int"  # the graph computed an int beyond int64 from it


def code_state(tx: InstructionTranslatorBase) -> Any:
    """The PGO CodeState that keeps the marks of the frame `tx` traces: its root
    frame's, or for a resume function after a graph break, the original frame's (its
    locals keep their names, so the rest of the frame sees the same places marked)."""
    from .pgo import CodeId, get_code_state
    from .resume_execution import ContinueExecutionCache

    root = tx.output.root_tx
    code = root.f_code
    meta = ContinueExecutionCache.generated_code_metadata.get(code)
    if meta is not None:
        code = meta.code
    return get_code_state()[CodeId.make(code, root.closure)]


def scalar_places(tx: InstructionTranslatorBase) -> dict[str, str]:
    """The records of the places marked for the frame `tx` traces: source name -> how
    the place is traced (SYMINT, SPECIALIZED_INT, or a kind of variables/module_float.py)."""
    state = code_state(tx)
    places = getattr(state, "scalar_places", None)
    if places is None:  # a CodeState unpickled from a profile written before the field existed
        places = state.scalar_places = {}
    return places


def enabled() -> bool:
    # Respects automatic_dynamic_shapes=False the way allow_unspec_int_on_nn_module
    # does: the user asked for no automatic dynamism, so scalars stay specialized.
    return config.scalar_state and config.automatic_dynamic_shapes


def is_mutated_module_scalar(tx: InstructionTranslatorBase, source: Source, value: Any) -> bool:
    """True if `source` names a module scalar that this code is known to mutate."""
    if not enabled() or type(value) not in SCALAR_TYPES:
        return False
    if config.specialize_int:
        return False
    if not _INT64_MIN <= value <= _INT64_MAX:
        return False  # no int64 holds it: specialized
    return scalar_places(tx).get(source.name) == SYMINT


def wrap_mutated_module_scalar(builder: VariableBuilder, value: int) -> VariableTracker:
    """The marked scalar at builder.source as a DYNAMIC SymInt graph input, each int
    the graph computes from it checked by the graph's _Int64Check."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    from .variables.tensor import SymNodeVariable

    output = builder.tx.output
    new = builder.name not in output.unspec_variable_map
    var = builder.wrap_symint(value, dynamism=DimDynamic.DYNAMIC)
    if new and isinstance(var, SymNodeVariable) and isinstance(var.sym_num, torch.SymInt):
        check = next((f for f in output.register_finalizer_fns if isinstance(f, _Int64Check)), None)
        if check is None:
            check = _Int64Check(scalar_places(builder.tx))
            output.add_graph_finalizer(check)
        check.symbols[var.sym_num.node.expr] = builder.source.name
        note_place_input(var)
    return var


# node.meta key of the graph inputs made for marked places (only_place_arithmetic)
_PLACE_INPUT = "dynamo_marked_scalar_place"


def note_place_input(var: VariableTracker) -> None:
    """`var` is the graph input made for a marked place."""
    var.as_proxy().node.meta[_PLACE_INPUT] = True


def is_place_input(var: VariableTracker) -> bool:
    """Whether `var` is a graph input made for a marked place (note_place_input)."""
    return bool(var.as_proxy().node.meta.get(_PLACE_INPUT))


def only_place_arithmetic(output: OutputGraph) -> bool:
    """True if every call in the graph computes a number (a SymInt, or a 0-d tensor
    holding one) from graph inputs made for marked places and nothing else: a counter's
    ``step + 1`` in a frame without tensor work. Without these patches the places are
    constants Dynamo folds, the graph has no op and Dynamo skips the frame ("No ops
    traced"); such a frame is skipped here too, instead of compiling a graph that
    recompiles for every value the frame's other numbers take (a float handed to a
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
    """A graph finalizer: every int the graph computes from the symbols of mutated
    module scalars must fit in int64, as inductor computes it (``self.step * 3`` wraps
    around in its kernel beyond 2**63 / 3, the Python int does not). Each gets a guard
    that it fits unless the shape environment knows it does; if one does not fit on
    this frame's values, analysis restarts with its scalars specialized."""

    def __init__(self, places: dict[str, str]) -> None:
        self.symbols: dict[sympy.Symbol, str] = {}
        self.places = places

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
            self.places.update(dict.fromkeys(names, SPECIALIZED_INT))
            log.debug("%s computes %s beyond int64: restarting with them specialized", names, value)
            raise UnspecializeRestartAnalysis(
                f"the graph computes {value} from {', '.join(names)} beyond int64; specializing them"
            )


# Python number operations that raise ZeroDivisionError for a zero divisor.
DIVISIONS = frozenset(
    {
        operator.truediv,
        operator.itruediv,
        operator.floordiv,
        operator.ifloordiv,
        operator.mod,
        operator.imod,
        divmod,
    }
)


def raise_on_zero_int_divisor(tx: InstructionTranslatorBase, fn: Any, args: list[VariableTracker]) -> None:
    """`fn(a, n)` (fn in DIVISIONS) with a number a and a SymInt n (a traced counter)
    or SymFloat n: Python raises ZeroDivisionError when n is 0, where fake-tensor
    propagation of the symbolic operation fails the compile or computes inf or nan
    (and a graph compiled for n != 0 would divide by zero at run time, after the
    frame's earlier stores were lost). Decide on n's value under a guard (``n != 0``
    or ``n == 0``) and, at zero, raise what Python raises, as an exception observed in
    the frame. A tensor a keeps tensor semantics (inf, no exception)."""
    from torch.fx.experimental.symbolic_shapes import guard_bool

    from .variables.tensor import SymNodeVariable

    dividend, divisor = (a.realize() for a in args)
    if not isinstance(divisor, SymNodeVariable) or divisor.python_type() not in (int, float):
        return
    sym = divisor.sym_num
    if not isinstance(sym, (torch.SymInt, torch.SymFloat)) or not sym.node.has_hint():
        return  # unbacked: no value to decide on (specialized as without this module)
    if isinstance(dividend, SymNodeVariable):
        if dividend.python_type() not in (int, float) or not dividend.sym_num.node.has_hint():
            return
        example = dividend.sym_num.node.hint
    elif dividend.is_python_constant() and type(dividend.as_python_constant()) in (int, float):
        example = dividend.as_python_constant()
    else:
        return
    if not guard_bool(sym == 0):
        return
    try:
        fn(example, sym.node.hint)
    except ZeroDivisionError as e:
        raise_observed_exception(ZeroDivisionError, tx, args=list(e.args))


def _original_value(item: VariableTracker, name: str) -> Any:
    # Only instance attributes: a class-level default shadowed by the store is left to the default wrapping.
    instance_dict = getattr(getattr(item, "value", None), "__dict__", None)
    if not isinstance(instance_dict, dict):
        return None
    return instance_dict.get(name)


def unspecialize_on_store(item: VariableTracker, name: str, value: VariableTracker) -> None:
    """Called for every attribute store; marks a module scalar for this code the first
    time it is stored a new value (the trace then restarts)."""
    from .source import AttrSource
    from .variables.nn_module import UnspecializedNNModuleVariable

    if not enabled() or not isinstance(item, UnspecializedNNModuleVariable) or item.source is None:
        return
    mark_stored(AttrSource(item.source, name), _original_value(item, name), value)


# The marker of a place, by the type of the number that entered the frame there: ints
# here, floats from variables/module_float.py (registered when the builder imports it).
_MARKERS: dict[type, Callable[[Source, Any, VariableTracker], None]] = {}


def register_marker(kind: type, marker: Callable[[Source, Any, VariableTracker], None]) -> None:
    _MARKERS[kind] = marker


def mark_stored(source: Source, old: Any, value: VariableTracker) -> None:
    """The number `old` entered the frame at `source`, which is stored `value`: mark the
    place as its type's marker decides. Every store hook comes here."""
    marker = _MARKERS.get(type(old))
    if marker is not None:
        marker(source, old, value)


def mark_stored_int(source: Source, old: int, value: VariableTracker) -> None:
    """The int `old` that entered the frame at `source` is stored `value`: if that is
    a different int constant, mark `source` symbolic for this code (the trace then
    restarts)."""
    from .symbolic_convert import InstructionTranslator

    if not enabled() or config.specialize_int or not value.is_python_constant():
        return  # already symbolic (or not a scalar at all)
    new = value.as_python_constant()
    if type(new) is not type(old) or new == old:
        return
    tx = InstructionTranslator.current_tx()
    source_name = source.name
    places = scalar_places(tx)
    if places.get(source_name) in (SYMINT, SPECIALIZED_INT):
        return  # already marked: each place is marked once
    places[source_name] = SYMINT
    note_marked_place(
        tx, f"{source_name} is a scalar mutated in the frame ({old!r} -> {new!r}); tracing it symbolically"
    )


def note_marked_place(tx: InstructionTranslatorBase, reason: str) -> None:
    """A place this trace read as a constant is now marked (`reason` says which and how
    it is traced): the trace goes on and restarts before it compiles."""
    log.debug("%s; restarting before the graph is compiled", reason)
    tx.output.marked_scalar_places.append(reason)


# Restart reasons name this many places, then count the rest.
_MAX_NAMED_PLACES = 3


def restart_for_marked_places(output: OutputGraph) -> UnspecializeRestartAnalysis:
    """The restart of a trace that marked scalar places (one for all of them)."""
    reasons = output.marked_scalar_places
    named = "; ".join(reasons[:_MAX_NAMED_PLACES])
    if len(reasons) > _MAX_NAMED_PLACES:
        named += f"; and {len(reasons) - _MAX_NAMED_PLACES} more places"
    return UnspecializeRestartAnalysis(named, restart_reason=named)


@contextlib.contextmanager
def restart_on_error_if_places_marked(output: OutputGraph) -> Iterator[None]:
    """Around a frame's trace: a trace that marked places and then fails (an error, a
    skipped frame, a speculation restart) restarts with them marked instead; what it
    did after the marks used their stale constants. The restarted trace marks none of
    them again, so it fails as it would have, if at all."""
    try:
        yield
    except UnspecializeRestartAnalysis:
        raise
    except Exception as e:
        if output.marked_scalar_places:
            raise restart_for_marked_places(output) from e
        raise


register_marker(int, mark_stored_int)
