"""Symbolic int attributes of nn.Modules that a compiled frame mutates.

Dynamo specializes int attributes of nn.Modules (EQUALS_MATCH on the value), which is
right for configuration (head counts, sizes) and wrong for counters: a module doing
``self.step += 1`` recompiles on every call until it hits the recompile limit and
runs eagerly (pytorch #115711, #128319, #140464).

What tells the two apart is the frame itself: a counter is *stored to* with a new
value. When ``SideEffects.store_attr`` sees a sourced module attribute of exact type
int receive a different constant, we record the attribute's source name for
the root frame's code; the trace restarts (once for all the places it marks, below).
On the restarted trace (and on every
later compile of that code), ``VariableBuilder.wrap_literal`` wraps the attribute as
a DYNAMIC SymInt, so it is a graph input from the first compile; the new
value is returned by the graph and written back by residual bytecode, as for any
attribute mutation. Guards are then only what the shape environment needs: branches
on the value (``step % 2 == 0``) guard on that relation, never on the value itself.

Python ints do not overflow, inductor's kernels compute in int64: a value outside
int64 is specialized as without this patch, and every int the graph computes from
the SymInt (``self.step * 3``, the graph input itself) gets a guard that it fits in
int64 unless the shape environment knows it does (_Int64Check). One that does not
fit on the frame's values restarts analysis with the attribute specialized for good.

Attributes that are only read stay specialized, as without this module. The marks are kept on the
frame's PGO ``CodeState`` so they survive recompiles (and, with PGO, processes).
A frame restarts once for all the places its trace marks, not once per place (a
frame stepping 1,000 counters would otherwise hit Dynamo's limit of 100 restarts): a
mark is noted on the OutputGraph and the trace goes on with the place's constant,
as without this module; it restarts before it compiles a graph
(OutputGraph.compile_subgraph), or when it ends in an exception
(restart_on_error_if_places_marked), so the restarted trace, which wraps every place
marked so far, is the one compiled or refused. Each place is marked once.
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
    from collections.abc import Iterator

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


def _marked_names(tx: InstructionTranslatorBase, field: str = "mutated_module_scalars") -> set[str]:
    state = code_state(tx)
    marked = getattr(state, field, None)
    if marked is None:  # a CodeState unpickled from a profile written before the field existed
        marked = set()
        setattr(state, field, marked)
    return marked


def enabled() -> bool:
    # Respects automatic_dynamic_shapes=False the way allow_unspec_int_on_nn_module
    # does: the user asked for no automatic dynamism, so scalars stay specialized.
    return config.dynamic_mutated_module_scalars and config.automatic_dynamic_shapes


def is_mutated_module_scalar(tx: InstructionTranslatorBase, source: Source, value: Any) -> bool:
    """True if `source` names a module scalar that this code is known to mutate."""
    if not enabled() or type(value) not in SCALAR_TYPES:
        return False
    if config.specialize_int:
        return False
    if not _INT64_MIN <= value <= _INT64_MAX:
        return False  # no int64 holds it: specialized
    name = source.name
    return name in _marked_names(tx) and name not in _marked_names(tx, "specialized_module_scalars")


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
            check = _Int64Check(_marked_names(builder.tx, "specialized_module_scalars"))
            output.add_graph_finalizer(check)
        check.symbols[var.sym_num.node.expr] = builder.source.name
    return var


class _Int64Check:
    """A graph finalizer: every int the graph computes from the symbols of mutated
    module scalars must fit in int64, as inductor computes it (``self.step * 3`` wraps
    around in its kernel beyond 2**63 / 3, the Python int does not). Each gets a guard
    that it fits unless the shape environment knows it does; if one does not fit on
    this frame's values, analysis restarts with its scalars specialized."""

    def __init__(self, specialized: set[str]) -> None:
        self.symbols: dict[sympy.Symbol, str] = {}
        self.specialized = specialized

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
            self.specialized.update(names)
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
    """`fn(a, n)` (fn in DIVISIONS) with a number a and a SymInt n (a traced counter):
    Python raises ZeroDivisionError when n is 0, where fake-tensor propagation of the
    SymInt operation fails the compile (and a graph compiled for n != 0 would divide
    by zero at run time, after the frame's earlier stores were lost). Decide on n's
    value under a guard (``n != 0`` or ``n == 0``) and, at zero, raise what Python
    raises, as an exception observed in the frame. A tensor a keeps tensor semantics
    (inf, no exception)."""
    from torch.fx.experimental.symbolic_shapes import guard_bool

    from .variables.tensor import SymNodeVariable

    dividend, divisor = (a.realize() for a in args)
    if not isinstance(divisor, SymNodeVariable) or divisor.python_type() is not int:
        return
    sym = divisor.sym_num
    if not isinstance(sym, torch.SymInt) or not sym.node.has_hint():
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
        fn(example, 0)
    except ZeroDivisionError as e:
        raise_observed_exception(ZeroDivisionError, tx, args=list(e.args))


def _original_value(item: VariableTracker, name: str) -> Any:
    # Only instance attributes: a class-level default shadowed by the store is left to the default wrapping.
    instance_dict = getattr(getattr(item, "value", None), "__dict__", None)
    if not isinstance(instance_dict, dict):
        return None
    return instance_dict.get(name)


def unspecialize_on_store(item: VariableTracker, name: str, value: VariableTracker) -> None:
    """Called for every attribute store; marks a module scalar symbolic for this code
    the first time it is stored a new value (the trace then restarts)."""
    from .source import AttrSource
    from .variables.nn_module import UnspecializedNNModuleVariable

    if not enabled() or not isinstance(item, UnspecializedNNModuleVariable) or item.source is None:
        return
    old = _original_value(item, name)
    if type(old) in SCALAR_TYPES:
        mark_stored_int(AttrSource(item.source, name), old, value)


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
    marked = _marked_names(tx)
    if source_name in marked:
        return  # already marked: each place is marked once
    marked.add(source_name)
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
