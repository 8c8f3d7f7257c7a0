"""Floats a compiled program keeps changing at an object's attribute, a dict entry or
a list slot, traced as 0-d float64 tensor graph inputs (the FLOAT_TENSOR places of
torch/_dynamo/scalar_places.py): one the frame stores new values to, and one that
changes between calls (an LR scheduler's ``param_groups[0]['lr']``).

Without this file Dynamo specializes such a float on its value on the first compile
and makes it a SymFloat once it has changed (automatic dynamic). A decay such as
``self.temp *= 0.9`` so compiles twice, guards with ``not math.isnan(...)`` (a Python
lambda at the root of the guard tree), and under AOTAutograd the SymFloat is
specialized by _tensorify_python_scalars wherever it feeds an op the pass has no
tensor form for (``_foreach_mul_(params, 1 - lr * wd)``, a clamp bound, the
write-back): one compile per value, and stale values under inductor (pytorch
#194976).

scalar_places.py records the place when the frame stores a new float to it, or when
automatic dynamic has seen it change, and wraps it as a graph input passed as a 0-d
float64 tensor (the tensor wrap_symfloat builds before its item(), without a backed
item() symbol), held by a FloatAsTensorVariable. The shape environment never sees the
value: no guard on it, no NaN guard, nothing for _tensorify_python_scalars to
specialize; the only guard is TYPE_MATCH (and, where a number is divided by it or
compared with it, the relation: see below). The graph returns a new value as a tensor
and the residual stores ``out.item()`` at the place.

A tensor is not a Python float, so FloatAsTensorVariable lets through only the operations
whose traced form gives the same result, dtype and bits as the float form:

- ``+ - * /`` (and their in-place forms), unary ``- + abs()`` with an int (|i| <= 2**53)
  or float constant, a SymInt (a module counter), a SymFloat or another such variable:
  IEEE double arithmetic on the float64 tensor, exactly Python's.
  ``c / f`` divides a float64 tensor holding c (``operator.truediv(c, tensor)`` would run
  Tensor.__rtruediv__, a reciprocal and a multiply). Where the tensor gives inf or nan
  for a zero divisor, Python raises ZeroDivisionError: each such variable carries the
  Python expression of its value over the attributes it reads (PythonFloat), so a
  division by it is traced under a guard that the divisor is nonzero (``1.0 / (t * 0.9)``
  guards ``(L['self'].t * 0.9) != 0.0``) and, when it is zero, under a guard that it is
  zero, raising ZeroDivisionError as Python does. A SymInt or SymFloat divisor is
  guarded by the shape environment, a constant one needs no guard.
- ``== != < <= > >=`` with a number or another such variable (``ema != 0.``, a branch on
  it): decided on this frame's values under a guard that the relation holds, written
  over the PythonFloat expressions (``not ((L['self'].temp * 0.9) < 0.5)``), so a branch
  recompiles only when the relation flips, never per value.
- ``max(a, b)`` / ``min(a, b)`` with a number or another such variable: ``b`` if
  ``b > a`` (``b < a``), as Python picks, that comparison decided as above;
  ``math.sqrt(f)`` as the float64 tensor's correctly rounded square root under a guard
  that f is not negative (below zero, ValueError as math.sqrt raises).
- ``f ** g``, ``pow(f, g)`` and ``math.pow(f, g)`` with a number or another such
  variable (``d_lr ** 2``, ``beta ** step``): pow of the float64 tensors, which runs C
  pow() on the two doubles as CPython's float power does, under a guard that Python's
  result is a finite float (``math.isfinite(L['g'].d ** 2)``). Where Python raises
  (ZeroDivisionError, OverflowError; math.pow ValueError) or returns a complex number
  or an inf, such a use is not traced on the tensor form (below). Inductor's C++
  compiler turns ``std::pow(x, 2.0)`` into ``x * x``, which rounds differently from
  pow() for about one value in a thousand, as for the SymFloats
  _tensorify_python_scalars turns into pow.Tensor_Tensor; eager and aot_eager run pow().
- ``float(f)`` is ``f``; ``isinstance`` and ``type`` see a float.
- Where the float meets a CPU tensor as a kernel's Scalar argument (``f * t``,
  ``f ** t``, ``t < f``; ``t.mul_(f)``, ``t.add_(u, alpha=f)``, ``t.clamp(max=f)``;
  ``torch._foreach_mul_(ts, f)`` and the other functions of _SCALAR_FUNCTIONS, also as an
  item of a ScalarList), the graph
  passes ``f.item()``, an unbacked SymFloat: the kernel reads the same Python float as
  in eager, and there is nothing to guard or specialize. lerp's weight is the
  exception: inductor's decomposition of a Scalar weight branches on its value, so it
  is passed as the tensor in the operands' dtype (lerp.Tensor). Complex tensors and
  other devices are left out (not verified).

Any other use (``//`` of numbers, a power that is not a finite float, ``int()``,
``round()``, truth tests, ``is None``, hashing (a ``set``), other ``math`` and torch
functions, methods, complex tensors) is not traced on the tensor form: the attributes the
value derives from are recorded DEFAULT_FLOAT for the frame, and from the restart on
they are wrapped exactly as without this module (specialized until automatic dynamic
sees them change, then SymFloats), so such a frame compiles as often as without it.
Neither alternative does: pinning the value (CONSTANT_MATCH) recompiles on every value
where a SymFloat costs the eager backend one recompile, and a graph break costs a graph
and a resume function that recompiles for the values it is handed. Uses that Dynamo
gets wrong on a SymFloat (``%``, formatting with a spec, a power that is not a finite
float: _symfloat_wrong) record SPECIALIZED_FLOAT instead: the value is specialized
(CONSTANT_MATCH). The trace goes on with the value as a constant until it ends, so that every use in it decides (a later
``%`` overrides an earlier ``round()``), and restarts before it compiles, once for all
the places it recorded. Each attribute restarts a trace at most twice.

Marks are keyed by the original frame's code, also when the frame is a resume function
after a graph break, so the rest of the frame sees the same attribute as a tensor input.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
from typing import Any, NamedTuple, NoReturn, TYPE_CHECKING

import torch

from ..exc import raise_observed_exception, UnspecializeRestartAnalysis
from ..scalar_places import DEFAULT_FLOAT, SPECIALIZED_FLOAT
from .base import VariableTracker

if TYPE_CHECKING:
    from torch._dynamo.codegen import PyCodegen
    from torch._dynamo.guards import GuardBuilder
    from torch._dynamo.source import Source
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    from .tensor import UnspecializedPythonVariable


log = logging.getLogger(__name__)


_ARITH = {
    operator.add: operator.add,
    operator.iadd: operator.add,
    operator.sub: operator.sub,
    operator.isub: operator.sub,
    operator.mul: operator.mul,
    operator.imul: operator.mul,
    operator.truediv: operator.truediv,
    operator.itruediv: operator.truediv,
}
_UNARY = {operator.neg: "(-{})", operator.pos: "(+{})", abs: "abs({})", math.sqrt: "math.sqrt({})"}
# The graph op of each: the float64 tensor's is Python's to the bit (IEEE negation,
# absolute value and correctly rounded square root).
_UNARY_OPS = {operator.neg: operator.neg, operator.pos: operator.pos, abs: abs, math.sqrt: torch.sqrt}
_BINARY = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/", operator.pow: "**"}

# Longer expressions are not kept (`self.t = self.t * self.t` in a loop doubles its
# length each time): a division by such a value is not traced.
_MAX_EXPR_LEN = 1000


class PythonFloat(NamedTuple):
    """How Python computes a FloatAsTensorVariable's value: `code`, an expression over the
    source names of the attributes it reads (evaluated by guards as the shape
    environment's guards are), its `value` on this frame's inputs, and those `sources`.
    The float64 tensor computes the same value, bit for bit."""

    code: str
    value: float
    sources: tuple[Source, ...]


def _constant_code(value: float | int) -> str:
    # repr gives back the same number; inf and nan have no literal
    return repr(value) if not isinstance(value, float) or math.isfinite(value) else f"float({str(value)!r})"


def _python_float(vt: VariableTracker) -> PythonFloat | None:
    from .tensor import SymNodeVariable

    if isinstance(vt, FloatAsTensorVariable):
        return vt.expr
    if isinstance(vt, SymNodeVariable):
        return _python_number_of_graph_node(vt.as_proxy().node)
    if vt.is_python_constant():
        value = vt.as_python_constant()
        return PythonFloat(_constant_code(value), value, ())
    return None


# The operations on SymInts and SymFloats a PythonFloat repeats: in the graph's order,
# on the inputs' values, they compute what the program computed (`step ** 0.5`,
# `sym_float(step + 1) * 0.1`). The shape environment's expression of the same value
# is simplified (reordered), so it may differ in the last bit.
_SYM_NODE_CODE = {
    operator.add: ("({} + {})", operator.add),
    operator.sub: ("({} - {})", operator.sub),
    operator.mul: ("({} * {})", operator.mul),
    operator.truediv: ("({} / {})", operator.truediv),
    operator.pow: ("({} ** {})", operator.pow),
    operator.neg: ("(-{})", operator.neg),
    torch.sym_float: ("float({})", float),
    torch._sym_sqrt: ("math.sqrt({})", math.sqrt),  # math.sqrt of a SymFloat
}


def _python_number_of_graph_node(node: torch.fx.Node) -> PythonFloat | None:
    """The PythonFloat of a SymInt or SymFloat graph value: the operations of
    _SYM_NODE_CODE that computed it from the graph inputs with a source (the frame's
    ints and floats), replayed on their values. None for anything else (an item(), an
    unbacked or derived-from-tensor size)."""

    def replay(arg: Any) -> PythonFloat | None:
        if type(arg) in (int, float):
            return PythonFloat(_constant_code(arg), arg, ())
        if not isinstance(arg, torch.fx.Node):
            return None
        example = arg.meta.get("example_value")
        if not isinstance(example, (torch.SymInt, torch.SymFloat)) or not example.node.has_hint():
            return None
        if arg.op == "placeholder":
            grapharg = arg.meta.get("grapharg")
            if grapharg is None or grapharg.source is None:
                return None
            hint = example.node.hint
            return PythonFloat(grapharg.source.name, hint, (grapharg.source,))
        if arg.op != "call_function" or arg.target not in _SYM_NODE_CODE or arg.kwargs:
            return None
        operands = [replay(a) for a in arg.args]
        if any(o is None for o in operands):
            return None
        template, op = _SYM_NODE_CODE[arg.target]
        code = template.format(*(o.code for o in operands))  # type: ignore[union-attr]
        if len(code) > _MAX_EXPR_LEN:
            return None
        try:
            value = op(*(o.value for o in operands))  # type: ignore[union-attr]
        except (ArithmeticError, ValueError):
            return None
        if value != example.node.hint:
            return None  # not the value the graph computes for this frame
        sources = tuple(dict.fromkeys(s for o in operands for s in o.sources))  # type: ignore[union-attr]
        return PythonFloat(code, value, sources)

    return replay(node)


def _python_result(op: Any, operands: list[VariableTracker]) -> PythonFloat | None:
    exprs = [_python_float(v) for v in operands]
    if any(e is None for e in exprs):
        return None
    if op in _UNARY:
        code = _UNARY[op].format(exprs[0].code)  # type: ignore[union-attr]
    else:
        code = f"({exprs[0].code} {_BINARY[op]} {exprs[1].code})"  # type: ignore[union-attr]
    if len(code) > _MAX_EXPR_LEN:
        return None
    sources = tuple(dict.fromkeys(s for e in exprs for s in e.sources))  # type: ignore[union-attr]
    return PythonFloat(code, op(*(e.value for e in exprs)), sources)  # type: ignore[union-attr]


def _origins(values: list[VariableTracker]) -> frozenset[str]:
    """The marked attributes the FloatAsTensorVariables among `values` are computed from."""
    return frozenset().union(*(v.origins for v in values if isinstance(v, FloatAsTensorVariable)))


def _python_float_guard(code: str, builder: GuardBuilder, guard: Any) -> None:
    """A guard on a PythonFloat expression, at the root like the shape environment's
    guards. A guard that raises fails (a division by zero inside `code`, whose own
    divisor guard fails too)."""
    from ..guards import _get_closure_vars, get_verbose_code_parts

    closure_vars = {**_get_closure_vars(), "math": math, "float": float}
    builder.add_python_lambda_leaf_guard_to_root(
        [code], get_verbose_code_parts([code], guard), closure_vars=closure_vars
    )


def _raise_on_zero_divisor(
    tx: InstructionTranslatorBase, divisor: VariableTracker, args: list[VariableTracker]
) -> None:
    """Python raises ZeroDivisionError for a float divided by zero, where the float64
    tensor gives inf or nan: decide on the divisor's value, guard that the decision
    holds, and raise as Python does when it is zero."""
    from torch.fx.experimental.symbolic_shapes import guard_bool

    from ..guards import install_guard
    from .tensor import SymNodeVariable

    if isinstance(divisor, SymNodeVariable):
        sym = divisor.sym_num
        if isinstance(sym, (torch.SymInt, torch.SymFloat)) and not sym.node.has_hint():
            _restart_unsupported(tx, args, f"division by the unbacked {divisor}")
        zero = guard_bool(sym == 0)
    elif isinstance(divisor, FloatAsTensorVariable):
        expr = divisor.expr
        if expr is None:
            _restart_unsupported(tx, args, f"division by {divisor}, a value computed from a SymInt or SymFloat")
        zero = expr.value == 0
        code = f"{expr.code} {'==' if zero else '!='} 0.0"
        install_guard(expr.sources[0].make_guard(functools.partial(_python_float_guard, code)))
    else:
        zero = divisor.as_python_constant() == 0
    if zero:
        raise_observed_exception(ZeroDivisionError, tx, args=["float division by zero"])


class FloatAsTensorVariable(VariableTracker):
    """A Python float held by the graph as a 0-d float64 tensor (`tensor`, an
    UnspecializedPythonVariable that reconstructs as ``graph_out.item()``)."""

    _nonvar_fields = {"origins", "expr", *VariableTracker._nonvar_fields}

    def __init__(
        self,
        tensor: UnspecializedPythonVariable,
        origins: frozenset[str],
        expr: PythonFloat | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tensor = tensor
        # the marked attributes (source names) this value is computed from
        self.origins = origins
        # how Python computes it, None if from a SymInt or SymFloat
        self.expr = expr

    def __repr__(self) -> str:
        return f"FloatAsTensorVariable({self.source.name if self.source else ''})"

    def python_type(self) -> type:
        return float

    def is_python_constant(self) -> bool:
        return False

    def reconstruct(self, codegen: PyCodegen) -> None:
        codegen(self.tensor)

    def as_proxy(self) -> Any:
        # Asked for by torch functions, math functions and methods taking the value:
        # the float64 tensor is not a float there.
        from ..symbolic_convert import InstructionTranslator

        (value,) = _unsupported(InstructionTranslator.current_tx(), [self], f"{self} passed to a function")
        return value.as_proxy()

    def nb_bool_impl(self, tx: InstructionTranslatorBase) -> VariableTracker:
        (value,) = _unsupported(tx, [self], f"truth value of {self}")
        return value.nb_bool_impl(tx)

    def hash_impl(self, tx: InstructionTranslatorBase) -> tuple[int, bool]:
        (value,) = _unsupported(tx, [self], f"hash of {self}")
        return value.hash_impl(tx)

    def tp_getattro_impl(self, tx: InstructionTranslatorBase, name: str) -> VariableTracker:
        (value,) = _unsupported(tx, [self], f"attribute {name!r} of {self}")
        return value.tp_getattro_impl(tx, name)

    def call_method(
        self,
        tx: InstructionTranslatorBase,
        name: str,
        args: list[VariableTracker],
        kwargs: dict[str, VariableTracker],
    ) -> VariableTracker:
        (value,) = _unsupported(tx, [self], f"method {name!r} of {self}")
        return value.call_method(tx, name, args, kwargs)


# Uses that Dynamo gets wrong on a SymFloat without this module: `%` (a wrong branch
# on `f % 1.0 < 0.5` under the eager backend, a failed compile under AOTAutograd, whose
# _tensorify_python_scalars has no python_mod) and formatting with a spec
# (LazySymNodeFormatString formats the value's str: `f"{f:.3f}"` fails the compile).
_SYMFLOAT_WRONG = frozenset({operator.mod, operator.imod, str.format, format})


def _symfloat_wrong(fn: Any, values: list[VariableTracker]) -> bool:
    """Whether Dynamo gets `fn` of `values` wrong on a SymFloat: a use in _SYMFLOAT_WRONG,
    or a power Python does not compute as a finite float (a negative base to a
    fractional power, 0.0 to a negative one, an overflow), whose fake pow on a SymFloat
    fails the compile without this module."""
    if fn in _SYMFLOAT_WRONG:
        return True
    if fn not in _POWERS or len(values) != 2:
        return False
    try:
        expr = _python_result(operator.pow, values)
    except ArithmeticError:
        return True
    except TypeError:  # an operand that is not a number
        return False
    return expr is not None and (type(expr.value) is not float or not math.isfinite(expr.value))


def _record_places(
    tx: InstructionTranslatorBase, floats: list[FloatAsTensorVariable], how: str
) -> tuple[list[str], list[str]]:
    """Record the attributes `floats` derive from as `how` (DEFAULT_FLOAT or
    SPECIALIZED_FLOAT, which wins over the former): their names, and those whose
    record changed."""
    from ..scalar_places import places

    origins = sorted(set().union(*(v.origins for v in floats)))
    records = places(tx)
    changed = [o for o in origins if records.get(o) not in (how, SPECIALIZED_FLOAT)]
    records.update(dict.fromkeys(changed, how))
    return origins, changed


def _unsupported(
    tx: InstructionTranslatorBase, values: list[VariableTracker], context: str, fn: Any = None
) -> list[VariableTracker]:
    """A use the float64 tensor cannot trace as Python would: record the attributes the
    values derive from to be wrapped as without this module (automatic dynamic decides)
    or, for a use `fn` Dynamo gets wrong on a SymFloat (_symfloat_wrong), specialized on
    their values, which wins over the former. The trace restarts before it compiles (scalar_places.note_marked_place)
    and goes on until then with the values as constants, so that every use of the
    frame's attributes decides their record; `values` with such constants in place is
    returned for that. A value with no Python expression restarts at once."""
    from ..scalar_places import note_marked_place
    from .constant import ConstantVariable

    floats = [v for v in values if isinstance(v, FloatAsTensorVariable)]
    how = SPECIALIZED_FLOAT if _symfloat_wrong(fn, values) else DEFAULT_FLOAT
    origins, changed = _record_places(tx, floats, how)
    reason = f"{context}: unsupported for a float64 tensor input; tracing {origins} as a {how}"
    if any(v.expr is None for v in floats):
        log.debug("%s; restarting", reason)
        raise UnspecializeRestartAnalysis(reason)
    if changed:
        note_marked_place(tx, reason)
    return [ConstantVariable.create(v.expr.value) if isinstance(v, FloatAsTensorVariable) else v for v in values]


def _restart_unsupported(tx: InstructionTranslatorBase, values: list[VariableTracker], context: str) -> NoReturn:
    """A use with no constant to go on with (a division by a value with no Python
    expression): the attributes are recorded as by _unsupported, and analysis restarts."""
    origins, _ = _record_places(tx, [v for v in values if isinstance(v, FloatAsTensorVariable)], DEFAULT_FLOAT)
    raise UnspecializeRestartAnalysis(
        f"{context}: unsupported for a float64 tensor input; tracing {origins} as a {DEFAULT_FLOAT}"
    )


def _is_number(vt: VariableTracker) -> bool:
    """An int or float constant, a SymInt (a module counter) or a SymFloat: Python
    converts it to a double as torch does a Scalar. Not bool (it promotes
    differently), not ints beyond 2**53 (Python rounds them, torch rejects those
    beyond int64)."""
    from .tensor import SymNodeVariable

    if isinstance(vt, SymNodeVariable):
        return vt.python_type() in (int, float)
    if not vt.is_python_constant():
        return False
    value = vt.as_python_constant()
    return type(value) is float or (type(value) is int and abs(value) <= 2**53)


def _number_proxy(vt: VariableTracker) -> Any:
    from .tensor import SymNodeVariable

    return vt.as_proxy() if isinstance(vt, SymNodeVariable) else vt.as_python_constant()


def _kernel_tensors(values: list[VariableTracker]) -> bool:
    """Whether `values` (and lists and tuples among them) hold a tensor, and every
    tensor is a CPU tensor (the kernels this is verified on) and not complex (type
    promotion calls complex() on a Scalar of a complex op, a guard on the unbacked
    item())."""
    from .lists import BaseListVariable
    from .tensor import TensorVariable, UnspecializedPythonVariable

    tensors = []
    for v in values:
        items = v.items if isinstance(v, BaseListVariable) else [v]
        tensors += [
            t for t in items if isinstance(t, TensorVariable) and not isinstance(t, UnspecializedPythonVariable)
        ]
    examples = [t.proxy.node.meta.get("example_value") for t in tensors]
    return bool(examples) and all(
        isinstance(e, torch.Tensor) and e.device.type == "cpu" and not e.dtype.is_complex for e in examples
    )


def _as_kernel_scalars(tx: InstructionTranslatorBase, values: list[VariableTracker]) -> list[VariableTracker]:
    """`values` with each FloatAsTensorVariable replaced by its ``item()``, the Python
    float a kernel's Scalar argument reads in eager. The item() is an unbacked
    SymFloat: the shape environment has no value to guard on and
    _tensorify_python_scalars none to specialize (it only specializes backed float
    symbols)."""
    from .builder import wrap_fx_proxy

    # The frame's fake mode refuses data-dependent scalars unless
    # capture_scalar_outputs; these never steer tracing (they are only passed on to
    # kernels). AOTAutograd retraces the graph in the same fake mode.
    tx.fake_mode.allow_scalar_outputs = True

    def item(v: VariableTracker) -> VariableTracker:
        if not isinstance(v, FloatAsTensorVariable):
            return v
        return wrap_fx_proxy(tx, tx.output.create_proxy("call_method", "item", (v.tensor.as_proxy(),), {}))

    return [_map_lists(item, v) for v in values]


def _map_lists(fn: Any, v: VariableTracker) -> VariableTracker:
    """fn(v), or for a list or tuple (a foreach op's ScalarList) a new one of fn of each item."""
    from .lists import ListVariable, TupleVariable

    if type(v) in (ListVariable, TupleVariable) and _has_float(v):
        return type(v)([fn(i) for i in v.items])
    return fn(v)


def _has_float(v: VariableTracker) -> bool:
    """Whether `v`, or an item of a list or tuple `v`, is a FloatAsTensorVariable."""
    from .lists import ListVariable, TupleVariable

    items = v.items if type(v) in (ListVariable, TupleVariable) else [v]
    return any(isinstance(i, FloatAsTensorVariable) for i in items)


def call_builtin(
    tx: InstructionTranslatorBase,
    fn: Any,
    args: list[VariableTracker],
    kwargs: dict[str, VariableTracker],
) -> VariableTracker | None:
    """BuiltinVariable(fn)(*args, **kwargs) when an argument is a FloatAsTensorVariable.
    Returns None for the calls the default handlers do right on it (isinstance, type)."""
    if fn in (isinstance, type):
        return None
    args = [a.realize() for a in args]
    if not kwargs and fn is float and len(args) == 1:
        return args[0]
    if not kwargs and fn in _TENSOR_OPERAND_BUILTINS and len(args) == 2 and _kernel_tensors(args):
        # `f op t` / `t op f` with a tensor t: eager passes f to the kernel as a Scalar
        # (through Tensor.__r<op>__ for `f op t`); so does the graph.
        from .builtin import BuiltinVariable

        return BuiltinVariable(fn).call_function(tx, _as_kernel_scalars(tx, args), {})
    if not kwargs and fn in _COMPARISONS and len(args) == 2:
        result = _compare(fn, args)
        if result is not None:
            return result
    if not kwargs and fn in (max, min) and len(args) == 2:
        # Python's max(a, b) is a unless b > a (min: unless b < a): that comparison,
        # decided under a guard on its relation, picks the operand.
        a, b = args
        b_wins = _compare(operator.gt if fn is max else operator.lt, [b, a])
        if b_wins is not None:
            return b if b_wins.as_python_constant() else a
    domain_checked = fn is not math.sqrt
    if not kwargs and fn is math.sqrt and len(args) == 1:
        # ValueError for a negative operand, as math.sqrt raises: decided under a guard
        negative = _compare(operator.lt, [args[0], VariableTracker.build(tx, 0.0)])
        if negative is not None and negative.as_python_constant():
            raise_observed_exception(ValueError, tx, args=["math domain error"])
        domain_checked = negative is not None
    if not kwargs and fn in _UNARY and len(args) == 1 and domain_checked:
        (a,) = args
        return _float_result(tx, _UNARY_OPS[fn], (a.tensor.as_proxy(),), a.origins, _python_result(fn, args))
    if not kwargs and fn in _POWERS and len(args) == 2:
        result = _power(tx, args)
        if result is not None:
            return result
    if not kwargs and fn in _ARITH and len(args) == 2:
        op = _ARITH[fn]
        is_float = [isinstance(v, FloatAsTensorVariable) for v in args]
        if all(f or _is_number(v) for f, v in zip(is_float, args)):
            if op is operator.truediv:
                _raise_on_zero_divisor(tx, args[1], args)
            operands = [v.tensor.as_proxy() if f else _number_proxy(v) for f, v in zip(is_float, args)]  # type: ignore[attr-defined]
            if not is_float[0] and op is operator.truediv:
                # c / f: divide a float64 tensor holding c, as Python divides c by f
                # (operator.truediv(c, tensor) would take a reciprocal, then multiply).
                operands[0] = _proxy(tx, "call_function", torch.full_like, operands[1], operands[0])
            return _float_result(tx, op, tuple(operands), _origins(args), _python_result(op, args))
    from .builtin import BuiltinVariable

    context = f"{getattr(fn, '__name__', fn)}({', '.join(map(str, args))})"
    keys = list(kwargs)
    values = _unsupported(tx, [*args, *kwargs.values()], context, fn)
    args, kwargs = values[: len(args)], dict(zip(keys, values[len(args) :]))
    return BuiltinVariable(fn).call_function(tx, args, kwargs)


_COMPARISONS = {
    operator.eq: "==",
    operator.ne: "!=",
    operator.lt: "<",
    operator.le: "<=",
    operator.gt: ">",
    operator.ge: ">=",
}

# Binary operators whose tensor operand takes the float as a kernel Scalar.
_TENSOR_OPERAND_BUILTINS = frozenset(
    {*_ARITH, *_COMPARISONS, pow, operator.pow, operator.ipow, operator.floordiv, operator.ifloordiv}
)


_POWERS = frozenset({operator.pow, operator.ipow, pow, math.pow})
# math functions Dynamo traces as torch functions that call_builtin takes: their arity
_MATH_BUILTINS = {math.sqrt: 1, math.pow: 2}


def _power(tx: InstructionTranslatorBase, args: list[VariableTracker]) -> FloatAsTensorVariable | None:
    """``b ** e`` (``pow(b, e)``, ``math.pow(b, e)``) of such variables and numbers:
    pow.Tensor_Tensor of the float64 tensors (a number as a float64 tensor like the
    other operand), C pow() of the two doubles as CPython's float power calls it (of
    ``abs(b)`` for a negative b and an integral e, negated for an odd e: pow() gives the
    same), under a guard that Python's ``b ** e`` is a finite float. There Python
    neither raises nor returns a complex number, and ``math.pow`` equals ``**``. None
    where that does not hold on this frame's values or an operand has no Python
    expression."""
    from ..guards import install_guard

    if not all(isinstance(v, FloatAsTensorVariable) or _is_number(v) for v in args):
        return None
    try:
        expr = _python_result(operator.pow, args)
    except ArithmeticError:
        return None
    if expr is None or type(expr.value) is not float or not math.isfinite(expr.value):
        return None
    # fails where Python raises, returns a complex number (TypeError) or a non-finite one
    guard = f"math.isfinite({expr.code})"
    install_guard(expr.sources[0].make_guard(functools.partial(_python_float_guard, guard)))
    like = next(v.tensor.as_proxy() for v in args if isinstance(v, FloatAsTensorVariable))  # type: ignore[attr-defined]
    operands = tuple(
        v.tensor.as_proxy()  # type: ignore[attr-defined]
        if isinstance(v, FloatAsTensorVariable)
        else _proxy(tx, "call_function", torch.full_like, like, _number_proxy(v))
        for v in args
    )
    return _float_result(tx, torch.pow, operands, _origins(args), expr)


def _comparand(vt: VariableTracker) -> PythonFloat | None:
    """The PythonFloat of a comparison operand: such a variable with an expression, or
    an int or float constant (Python compares a float with any int exactly)."""
    from .tensor import SymNodeVariable

    if isinstance(vt, (FloatAsTensorVariable, SymNodeVariable)):
        return _python_float(vt)
    if vt.is_python_constant() and type(vt.as_python_constant()) in (int, float):
        return _python_float(vt)
    return None


def _compare(fn: Any, args: list[VariableTracker]) -> VariableTracker | None:
    """``f != 0.0`` and the other comparisons of such a variable with a number or
    another such variable: decided on the values of this frame, under a guard that the
    relation holds (``(L['s'].ema * 0.9 + 0.01) != 0.0``), so the value stays a graph
    input and a branch on it recompiles only when the relation flips. None if an
    operand has no Python expression (computed from a SymInt or SymFloat)."""
    from ..guards import install_guard
    from .constant import ConstantVariable

    exprs = [_comparand(a) for a in args]
    if any(e is None for e in exprs):
        return None
    left, right = exprs
    result = fn(left.value, right.value)  # type: ignore[union-attr]
    relation = f"{left.code} {_COMPARISONS[fn]} {right.code}"  # type: ignore[union-attr]
    code = relation if result else f"not ({relation})"
    sources = left.sources or right.sources  # type: ignore[union-attr]
    install_guard(sources[0].make_guard(functools.partial(_python_float_guard, code)))
    return ConstantVariable.create(result)


# Tensor methods and torch functions whose Python-number arguments are a kernel's
# Scalar arguments: given a FloatAsTensorVariable, the graph passes its item() (the
# Python float eager passes). Not the arguments that steer tracing (sizes, dims).
_SCALAR_METHODS = frozenset(
    f"{name}{suffix}"
    for suffix in ("", "_")
    for name in (
        "add", "sub", "mul", "div", "true_divide", "clamp", "clamp_min", "clamp_max",
        "addcmul", "addcdiv", "pow", "masked_fill", "fill",
    )
)
_SCALAR_FUNCTIONS = frozenset(
    {
        *(getattr(torch, f"_foreach_{name}{suffix}") for suffix in ("", "_") for name in (
            "add", "sub", "mul", "div", "addcmul", "addcdiv", "clamp_min", "clamp_max",
            "maximum", "minimum", "pow",
        )),
        torch.add, torch.sub, torch.mul, torch.div, torch.true_divide, torch.clamp,
        torch.clamp_min, torch.clamp_max, torch.addcmul, torch.addcdiv, torch.pow, torch.full_like,
    }
)
# lerp's Scalar weight makes inductor's decomposition branch on its value (`weight >=
# 0.5`), which an item() has not: the weight is passed as the 0-d tensor in the
# operands' dtype instead (lerp.Tensor, the same formula; _foreach_lerp_'s handler
# takes a tensor weight through its polyfill).
_WEIGHT_METHODS = frozenset({"lerp", "lerp_"})
_WEIGHT_FUNCTIONS = frozenset({torch.lerp, torch._foreach_lerp_})


def _as_weight_tensors(tx: InstructionTranslatorBase, values: list[VariableTracker]) -> list[VariableTracker] | None:
    """`values` with each FloatAsTensorVariable replaced by its tensor in the floating
    dtype of the tensors it operates on, or None if they have none."""
    from .builder import wrap_fx_proxy
    from .lists import BaseListVariable
    from .tensor import TensorVariable

    tensors = [t for v in values for t in (v.items if isinstance(v, BaseListVariable) else [v])]
    dtypes = {t.proxy.node.meta["example_value"].dtype for t in tensors if type(t) is TensorVariable}
    if len(dtypes) != 1 or not (dtype := dtypes.pop()).is_floating_point:
        return None
    return [
        wrap_fx_proxy(tx, tx.output.create_proxy("call_method", "to", (v.tensor.as_proxy(), dtype), {}))  # type: ignore[attr-defined]
        if isinstance(v, FloatAsTensorVariable)
        else v
        for v in values
    ]


def _realize_floats(values: list[VariableTracker]) -> list[VariableTracker]:
    """`values` with the floats read lazily built, to see how they are traced: also
    the items of a list or tuple (a foreach op's ScalarList), which are realized in
    place (a lazy constant, or one computed from lazy constants, is the same value)."""
    from .lazy import LazyVariableTracker
    from .lists import ListVariable, TupleVariable

    def realized(v: VariableTracker) -> VariableTracker:
        if isinstance(v, LazyVariableTracker) and (v.is_realized() or type(v.peek_value()) is float):
            return v.realize()
        return v

    for v in values:
        if type(v) in (ListVariable, TupleVariable):
            v.items[:] = [realized(item) for item in v.items]
    return [realized(v) for v in values]


def _kernel_scalar_call(
    tx: InstructionTranslatorBase,
    args: list[VariableTracker],
    kwargs: dict[str, VariableTracker],
    weight: bool,
) -> tuple[list[VariableTracker], dict[str, VariableTracker]] | None:
    """The arguments of a kernel call with its FloatAsTensorVariables as item()s (as
    weight tensors if `weight`), or None if none is one or a tensor it operates on is
    not on the CPU (not verified on other devices)."""
    values = _realize_floats([*args, *kwargs.values()])
    if not any(_has_float(v) for v in values) or not _kernel_tensors(values):
        return None
    new_values = _as_weight_tensors(tx, values) if weight else _as_kernel_scalars(tx, values)
    if new_values is None:
        return None
    return new_values[: len(args)], dict(zip(kwargs, new_values[len(args) :]))


def call_tensor_method(
    tx: InstructionTranslatorBase,
    tensor: VariableTracker,
    name: str,
    args: list[VariableTracker],
    kwargs: dict[str, VariableTracker],
) -> VariableTracker | None:
    """``t.mul_(f)``, ``t.add_(u, alpha=f)``, ``t.clamp(max=f)`` and the other methods of
    _SCALAR_METHODS with a FloatAsTensorVariable f: f passed as its item(); None to let
    TensorVariable.call_method handle the call (whose as_proxy restarts with the place
    wrapped as without this module)."""
    from .tensor import TensorVariable

    weight = name in _WEIGHT_METHODS
    if type(tensor) is not TensorVariable or not (weight or name in _SCALAR_METHODS):
        return None
    call = _kernel_scalar_call(tx, [tensor, *args], kwargs, weight)
    if call is None:
        return None
    (_, *args), kwargs = call
    return tensor.call_method(tx, name, args, kwargs)


def call_torch_function(
    tx: InstructionTranslatorBase,
    fn_var: VariableTracker,
    args: list[VariableTracker],
    kwargs: dict[str, VariableTracker],
) -> VariableTracker | None:
    """``fn(*args, **kwargs)`` for a torch function (or a math function Dynamo traces as
    one) called with a FloatAsTensorVariable: for _SCALAR_FUNCTIONS, traced with each
    such argument as its item() (lerp: its weight tensor), ``math.sqrt`` and
    ``math.pow`` as the builtin operators are; None to let the call be traced as it is (its as_proxy restarts as
    for a method)."""
    fn = fn_var.value  # type: ignore[attr-defined]
    if fn in _MATH_BUILTINS:
        args = _realize_floats(args)
        if kwargs or len(args) != _MATH_BUILTINS[fn] or not any(isinstance(a, FloatAsTensorVariable) for a in args):
            return None
        return call_builtin(tx, fn, args, kwargs)
    if fn is torch.tensor:
        return _tensor_of_floats(tx, args, kwargs)
    weight = fn in _WEIGHT_FUNCTIONS
    if weight and len(args) == 2 and list(kwargs) == ["weight"]:
        # positional, as _foreach_lerp_'s handler takes a tensor weight
        args, kwargs = [*args, kwargs["weight"]], {}
    call = _kernel_scalar_call(tx, args, kwargs, weight) if weight or fn in _SCALAR_FUNCTIONS else None
    return None if call is None else fn_var.call_function(tx, *call)


# torch.tensor(list) converts each Python float to these dtypes as Tensor.to converts
# a float64 element (one static_cast from double); narrower ones may round twice.
_TENSOR_OF_FLOATS_DTYPES = frozenset({torch.float32, torch.float64})


def _tensor_of_floats(
    tx: InstructionTranslatorBase, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
) -> VariableTracker | None:
    """``torch.tensor([f, g, 0.5], dtype=..., device="cpu")`` with FloatAsTensorVariables
    among the numbers of a flat list: the float64 tensors stacked and converted to the
    dtype, the values eager converts from the Python floats. None (the default path)
    for anything else: nested lists, other keywords, other devices and dtypes."""
    from .builder import wrap_fx_proxy
    from .lists import ListVariable, TupleVariable

    if len(args) != 1 or not set(kwargs) <= {"dtype", "device"}:
        return None
    (data,) = _realize_floats(args)
    if type(data) not in (ListVariable, TupleVariable):
        return None
    items = _realize_floats(data.items)
    floats = [i for i in items if isinstance(i, FloatAsTensorVariable)]
    constants = [i for i in items if not isinstance(i, FloatAsTensorVariable)]
    if not floats or not all(_is_number(i) and i.is_python_constant() for i in constants):
        return None
    options = {k: v.as_python_constant() for k, v in kwargs.items() if v.is_python_constant()}
    if len(options) != len(kwargs):
        return None
    dtype = options.get("dtype") or torch.get_default_dtype()  # the default dtype is guarded globally
    device = torch.device(options.get("device") or "cpu")
    if dtype not in _TENSOR_OF_FLOATS_DTYPES or device.type != "cpu":
        return None
    like = floats[0].tensor.as_proxy()
    elements = [
        i.tensor.as_proxy()
        if isinstance(i, FloatAsTensorVariable)
        else _proxy(tx, "call_function", torch.full_like, like, i.as_python_constant())
        for i in items
    ]
    stacked = _proxy(tx, "call_function", torch.stack, elements)
    return wrap_fx_proxy(tx, tx.output.create_proxy("call_method", "to", (stacked, dtype), {}))


def _proxy(tx: InstructionTranslatorBase, kind: str, target: Any, *args: Any) -> Any:
    """A graph node with its example value (so later nodes can use it)."""
    from .builder import wrap_fx_proxy

    return wrap_fx_proxy(tx, tx.output.create_proxy(kind, target, args, {})).as_proxy()


def _float_result(
    tx: InstructionTranslatorBase,
    op: Any,
    proxy_args: tuple[Any, ...],
    origins: frozenset[str],
    expr: PythonFloat | None,
) -> FloatAsTensorVariable:
    from .builder import wrap_fx_proxy_cls
    from .tensor import UnspecializedPythonVariable

    proxy = tx.output.create_proxy("call_function", op, proxy_args, {})
    tensor = wrap_fx_proxy_cls(UnspecializedPythonVariable, tx, proxy, raw_value=None, need_unwrap=True)
    return FloatAsTensorVariable(tensor, origins, expr)  # type: ignore[arg-type]
