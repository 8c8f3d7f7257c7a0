"""Floats a compiled frame stores new values to, traced as 0-d float64 tensor graph
inputs (the FLOAT_TENSOR places of torch/_dynamo/scalar_places.py).

Without this file Dynamo specializes such a float on its value on the first compile
and makes it a SymFloat once it has changed (automatic dynamic). A decay such as
``self.temp *= 0.9`` so compiles twice, guards with ``not math.isnan(...)`` (a Python
lambda at the root of the guard tree), and under AOTAutograd the SymFloat the graph
returns for the write-back is specialized by _tensorify_python_scalars: one compile per
value (and, with assume_static_by_default=False, a stale value under inductor).

scalar_places.py records the place when the frame stores a new float to it and wraps
it, on the restarted trace, as a graph input passed as a 0-d float64 tensor (the
tensor wrap_symfloat builds before its item(), without a backed item() symbol), held by
a FloatAsTensorVariable. The shape environment never sees the value: no guard on it,
no NaN guard, nothing for _tensorify_python_scalars to specialize; the only guard is
TYPE_MATCH (and, where a number is divided by it or compared with it, the relation:
see below). The graph returns the new value as a tensor and the residual stores
``out.item()`` at the place.

A tensor is not a Python float, so FloatAsTensorVariable lets through only the operations
whose tensor form gives the same result, dtype and bits as the float form:

- ``+ - * /`` (and their in-place forms), unary ``- + abs()`` with an int (|i| <= 2**53)
  or float constant, a SymInt (a module counter), a SymFloat or another such variable:
  IEEE double arithmetic, exactly Python's.
  ``c / f`` divides a float64 tensor holding c (``operator.truediv(c, tensor)`` would run
  Tensor.__rtruediv__, a reciprocal and a multiply). Where the tensor gives inf or nan
  for a zero divisor, Python raises ZeroDivisionError: each such variable carries the
  Python expression of its value over the attributes it reads (PythonFloat), so a
  division by it is traced under a guard that the divisor is nonzero (``1.0 / (t * 0.9)``
  guards ``(L['self'].t * 0.9) != 0.0``) and, when it is zero, under a guard that it is
  zero, raising ZeroDivisionError as Python does. A SymInt or SymFloat divisor is
  guarded by the shape environment, a constant one needs no guard.
- ``+ - * /`` with a CPU tensor t: the float64 tensor is cast to the compute type of
  the result (float32 for float16/bfloat16) and an integer t to the default dtype, as
  the op does with a Python scalar, then the op is traced as eager computes it:
  ``f + t`` as ``t + f``, ``f * t`` as ``t * f``, ``f - t`` as ``torch.rsub(t, f)``,
  ``f / t`` as ``t.reciprocal() * f`` (Tensor.__r<op>__). See _tensor_casts for what is
  left out (bool tensors, some 0-d and float16/bfloat16 cases, other devices).
- ``t.add(f)``, ``t.mul_(f)`` and the other add/sub/mul/div tensor methods (in place
  only on a tensor that needs no cast) as the operators.
- ``float(f)`` is ``f``; ``isinstance`` and ``type`` see a float.
- ``== != < <= > >=`` with a number or another such variable (``ema != 0.``, a branch on
  it): decided on this frame's values under a guard that the relation holds, written
  over the PythonFloat expressions (``not ((L['self'].temp * 0.9) < 0.5)``), so a branch
  recompiles only when the relation flips, never per value.
- ``t.add_(u, alpha=f)`` and the other tensor methods whose Scalar keyword the kernel reads
  as a number (add, sub: ``alpha``; addcdiv, addcmul: ``value``; CPU tensors): the graph
  passes ``f.item()`` (an unbacked SymFloat, nothing to guard or specialize), so the
  kernel sees the same Python float as eager (a multiply and an add would round
  differently from CPU's fused multiply-add).

Any other use (``//``, ``**``, ``int()``, ``round()``, ``min``/``max``, truth tests,
``is None``, hashing (a ``set``), ``math`` and torch functions, methods, the tensor
operands _tensor_casts leaves out) is not traced on the tensor form: the attributes the
value derives from are recorded DEFAULT_FLOAT for the frame, and from the restart on
they are wrapped exactly as without this module (specialized until automatic dynamic
sees them change, then SymFloats), so such a frame compiles as often as without it.
Neither alternative does: pinning the value (CONSTANT_MATCH) recompiles on every value
where a SymFloat costs the eager backend one recompile, and a graph break costs a graph
and a resume function that recompiles for the values it is handed. Two uses that
Dynamo gets wrong on a SymFloat (``%``, formatting with a spec: _SYMFLOAT_WRONG) record
SPECIALIZED_FLOAT instead: the value is specialized (CONSTANT_MATCH). The trace goes on
with the value as a constant until it ends, so that every use in it decides (a later
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
_UNARY = {operator.neg: "(-{})", operator.pos: "(+{})", abs: "abs({})"}
_BINARY = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/"}

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


def _python_float(vt: VariableTracker) -> PythonFloat | None:
    if isinstance(vt, FloatAsTensorVariable):
        return vt.expr
    if vt.is_python_constant():
        value = vt.as_python_constant()
        # repr gives back the same float; inf and nan have no literal
        code = repr(value) if math.isfinite(value) else f"float({str(value)!r})"
        return PythonFloat(code, value, ())
    return None  # a SymInt or SymFloat: not expressed (a division by the result is not traced)


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


def _python_float_guard(code: str, builder: GuardBuilder, guard: Any) -> None:
    """A guard on a PythonFloat expression, at the root like the shape environment's
    guards. A guard that raises fails (a division by zero inside `code`, whose own
    divisor guard fails too)."""
    from ..guards import get_verbose_code_parts

    builder.add_python_lambda_leaf_guard_to_root([code], get_verbose_code_parts([code], guard))


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

    def bool_impl(self, tx: InstructionTranslatorBase) -> VariableTracker | None:
        (value,) = _unsupported(tx, [self], f"truth value of {self}")
        return value.bool_impl(tx)

    def hash_impl(self, tx: InstructionTranslatorBase) -> tuple[int, bool]:
        (value,) = _unsupported(tx, [self], f"hash of {self}")
        return value.hash_impl(tx)

    def var_getattr(self, tx: InstructionTranslatorBase, name: str) -> VariableTracker:
        (value,) = _unsupported(tx, [self], f"attribute {name!r} of {self}")
        return value.var_getattr(tx, name)

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
    or, for a use `fn` in _SYMFLOAT_WRONG, specialized on their values, which wins over
    the former. The trace restarts before it compiles (scalar_places.note_marked_place)
    and goes on until then with the values as constants, so that every use of the
    frame's attributes decides their record; `values` with such constants in place is
    returned for that. A value with no Python expression restarts at once."""
    from ..scalar_places import note_marked_place
    from .constant import ConstantVariable

    floats = [v for v in values if isinstance(v, FloatAsTensorVariable)]
    how = SPECIALIZED_FLOAT if fn in _SYMFLOAT_WRONG else DEFAULT_FLOAT
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


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _tensor_casts(
    vt: VariableTracker, op: Any, float_first: bool
) -> tuple[torch.dtype | None, torch.dtype | None] | None:
    """For `t op f` (or `f op t` if float_first), t a tensor and f a Python float:
    (dtype to cast t to, dtype to cast the float64 tensor to) so that the traced
    tensor op computes what the op with a Python float computes, bitwise, or None.

    With a Python float, the result dtype is t's if it is floating or complex, else the
    default dtype (t is cast to it by the op); the float is read as a scalar in the
    result's compute type (float32 for float16/bfloat16). The float64 0-d tensor is
    cast to that compute type first, so that the CPU kernels and inductor read the
    same scalar; a 0-d t would otherwise promote with it. Not traced: bool tensors
    (`bool_tensor - 1.5` raises), 0-d float16/bfloat16/complex tensors, `f - t` and
    `f / t` with float16/bfloat16 tensors (the scalar comes first there), tensors on
    other devices (not verified)."""
    from .tensor import TensorVariable, UnspecializedPythonVariable

    if not isinstance(vt, TensorVariable) or isinstance(vt, UnspecializedPythonVariable):
        return None
    example = vt.proxy.node.meta.get("example_value")
    if not isinstance(example, torch.Tensor) or example.device.type != "cpu":
        return None
    dtype = example.dtype
    if dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        default = torch.get_default_dtype()
        return (default, default) if default in (torch.float32, torch.float64) else None
    if dtype in (torch.float32, torch.float64):
        return None, dtype
    if dtype in _LOW_PRECISION:
        if example.dim() == 0 or (float_first and op in (operator.sub, operator.truediv)):
            return None
        return None, torch.float32
    if dtype.is_complex and example.dim() > 0:
        return None, None
    return None


def call_builtin(
    tx: InstructionTranslatorBase,
    fn: Any,
    args: list[VariableTracker],
    kwargs: dict[str, VariableTracker],
) -> VariableTracker | None:
    """BuiltinVariable(fn)(*args, **kwargs) when an argument is a FloatAsTensorVariable.
    Returns None for the calls the default handlers do right on it (isinstance, type)."""
    from .builder import wrap_fx_proxy

    if fn in (isinstance, type):
        return None
    args = [a.realize() for a in args]
    if not kwargs and fn is float and len(args) == 1:
        return args[0]
    if not kwargs and fn in _COMPARISONS and len(args) == 2:
        result = _compare(fn, args)
        if result is not None:
            return result
    if not kwargs and fn in _UNARY and len(args) == 1:
        (a,) = args
        return _float_result(tx, fn, (a.tensor.as_proxy(),), a.origins, _python_result(fn, args))  # type: ignore[attr-defined]
    if not kwargs and fn in _ARITH and len(args) == 2:
        op = _ARITH[fn]
        is_float = [isinstance(v, FloatAsTensorVariable) for v in args]
        origins = frozenset().union(*(v.origins for v in args if isinstance(v, FloatAsTensorVariable)))  # type: ignore[attr-defined]
        if all(f or _is_number(v) for f, v in zip(is_float, args)):
            if op is operator.truediv:
                _raise_on_zero_divisor(tx, args[1], args)
            operands = [v.tensor.as_proxy() if f else _number_proxy(v) for f, v in zip(is_float, args)]  # type: ignore[attr-defined]
            if not is_float[0] and op is operator.truediv:
                # c / f: divide a float64 tensor holding c, as Python divides c by f
                # (operator.truediv(c, tensor) would take a reciprocal, then multiply).
                operands[0] = _proxy(tx, "call_function", torch.full_like, operands[1], operands[0])
            return _float_result(tx, op, tuple(operands), origins, _python_result(op, args))
        if not all(is_float):
            t_index = is_float.index(False)
            float_first = t_index == 1
            casts = _tensor_casts(args[t_index], op, float_first)
            if casts is not None:
                tensor_cast, float_cast = casts
                f, t = args[1 - t_index].tensor.as_proxy(), args[t_index].as_proxy()  # type: ignore[attr-defined]
                if tensor_cast is not None:
                    t = _proxy(tx, "call_method", "to", t, tensor_cast)
                if float_cast is not None:
                    f = _proxy(tx, "call_method", "to", f, float_cast)
                # `f op t` runs Tensor.__r<op>__ in eager; trace what it computes.
                if float_first and op is operator.truediv:
                    target, proxy_args = operator.mul, (_proxy(tx, "call_method", "reciprocal", t), f)
                elif float_first and op is operator.sub:
                    target, proxy_args = torch.rsub, (t, f)
                else:
                    target, proxy_args = op, (t, f)
                return wrap_fx_proxy(tx, tx.output.create_proxy("call_function", target, proxy_args, {}))
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


def _comparand(vt: VariableTracker) -> PythonFloat | None:
    """The PythonFloat of a comparison operand: such a variable with an expression, or
    an int or float constant (Python compares a float with any int exactly)."""
    if isinstance(vt, FloatAsTensorVariable):
        return vt.expr
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


_TENSOR_METHODS = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": operator.truediv,
    "true_divide": operator.truediv,
    "add_": operator.add,
    "sub_": operator.sub,
    "mul_": operator.mul,
    "div_": operator.truediv,
}


def call_tensor_method(
    tx: InstructionTranslatorBase,
    tensor: VariableTracker,
    name: str,
    args: list[VariableTracker],
    kwargs: dict[str, VariableTracker],
) -> VariableTracker | None:
    """`t.mul_(f)` and the like (add, sub, mul, div, true_divide, in place or not,
    no keyword arguments) with a FloatAsTensorVariable f, as the binary operators
    trace them; None to let TensorVariable.call_method handle the call (whose
    as_proxy restarts with the attribute wrapped as without this module). In place,
    t is never cast (an integer t raises in eager, as it does here)."""
    from .builder import wrap_fx_proxy
    from .tensor import TensorVariable

    key = _SCALAR_KWARGS.get(name)
    if type(tensor) is TensorVariable and key in kwargs:
        others = [*args, *(v for k, v in kwargs.items() if k != key)]
        scalar = _kernel_scalar(tx, tensor, kwargs[key], others)
        if scalar is not None:
            return tensor.call_method(tx, name, args, {**kwargs, key: scalar})
    if (
        type(tensor) is not TensorVariable
        or name not in _TENSOR_METHODS
        or kwargs
        or len(args) != 1
        or not isinstance(args[0], FloatAsTensorVariable)
    ):
        return None
    casts = _tensor_casts(tensor, _TENSOR_METHODS[name], False)
    if casts is None or (name.endswith("_") and casts[0] is not None):
        return None
    f = args[0].tensor.as_proxy()  # type: ignore[attr-defined]
    if casts[1] is not None:
        f = _proxy(tx, "call_method", "to", f, casts[1])
    return wrap_fx_proxy(
        tx, tx.output.create_proxy("call_method", name, (tensor.as_proxy(), f), {})
    )


# Tensor methods whose Scalar keyword argument the kernel reads as a number in the
# compute type (``p.add_(u, alpha=-step_size)`` is one fused multiply-add on CPU: no
# tensor form computes the same bits).
_SCALAR_KWARGS = {
    "add": "alpha",
    "add_": "alpha",
    "sub": "alpha",
    "sub_": "alpha",
    "addcdiv": "value",
    "addcdiv_": "value",
    "addcmul": "value",
    "addcmul_": "value",
}


def _kernel_scalar(
    tx: InstructionTranslatorBase, tensor: VariableTracker, f: VariableTracker, others: list[VariableTracker]
) -> VariableTracker | None:
    """``t.add_(u, alpha=f)`` (and sub, addcdiv, addcmul, in place or not) with a
    FloatAsTensorVariable f as the Scalar: the value to pass instead, ``item()`` of the
    float64 tensor, so the kernel sees the same Python float as in eager. The item() is
    an unbacked SymFloat: the shape environment has no value to guard on and
    _tensorify_python_scalars none to specialize (it only specializes backed float
    symbols). None to leave the call as it is (one of the `others` arguments is such a
    variable too, or the tensor is not on the CPU)."""
    from .builder import wrap_fx_proxy

    if not isinstance(f, FloatAsTensorVariable) or any(isinstance(v, FloatAsTensorVariable) for v in others):
        return None
    example = tensor.as_proxy().node.meta.get("example_value")
    if not isinstance(example, torch.Tensor) or example.device.type != "cpu":
        return None  # not verified on other devices
    # The frame's fake mode refuses data-dependent scalars unless capture_scalar_outputs;
    # this one never steers tracing (it is only passed on to the kernel). AOTAutograd
    # retraces the graph in the same fake mode: it stays allowed for this trace.
    tx.fake_mode.allow_scalar_outputs = True
    return wrap_fx_proxy(tx, tx.output.create_proxy("call_method", "item", (f.tensor.as_proxy(),), {}))  # type: ignore[attr-defined]


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
