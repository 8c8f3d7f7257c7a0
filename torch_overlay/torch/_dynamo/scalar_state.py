"""Python numbers the program keeps changing, wherever they live (pytorch #115711).

module_scalars.py (ints) and variables/module_float.py (floats) trace an nn.Module
attribute that the compiled frame stores a new value to as a symbolic graph input.
Real training code keeps its counters and running values elsewhere: an optimizer's
per-parameter state (``state[p]['step'] += 1``), ``param_groups[i]['step']``, a plain
object's attribute, a list slot. This module extends the same rule to every sourced
mutable place (all of it under ``config.scalar_state``, the switch of those two too):

- Stores: a store of a new number to an int or
  float that entered the frame at a sourced place (an attribute of any object with a
  source, a dict entry, a list slot) marks the place on the frame's code state
  (module_scalars.code_state: resume functions share their original frame's marks); the
  trace restarts once for all the places it marks, and the restarted trace wraps each as
  module_scalars / module_float wrap a marked module attribute (a DYNAMIC SymInt; a 0-d
  float64 tensor input), and the new value is written back by the residual bytecode of
  the mutation. A place the frame
  created itself (``state['step'] = 0`` into an empty dict) has no source: it stays a
  constant.
- Changes from outside: an int at an
  attribute or container place that Dynamo specializes on its value regardless of
  automatic dynamic (nn.Module attributes, places reached from globals) is traced as a
  DYNAMIC SymInt once automatic dynamic has seen it change between compiles of the
  frame: a counter that another frame, a resume function or eager code between calls
  increments costs one recompile, not one per value.
"""

from __future__ import annotations

import functools
import logging
import operator
from typing import Any, TYPE_CHECKING

import torch

from . import config
from .module_scalars import enabled, mark_stored

if TYPE_CHECKING:
    from .source import Source
    from .symbolic_convert import InstructionTranslatorBase
    from .variables.base import VariableTracker
    from .variables.builder import VariableBuilder


log = logging.getLogger(__name__)
recompiles_log = torch._logging.getArtifactLogger(__name__, "recompiles")


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


def on_store_attr(item: VariableTracker, name: str, value: VariableTracker) -> None:
    """SideEffects.store_attr of `value` to `item.name`, item not an nn.Module (whose
    attributes module_scalars and module_float handle): mark and restart when a number
    that entered the frame on a sourced object gets a new value."""
    from .module_scalars import _original_value
    from .source import AttrSource
    from .variables.nn_module import UnspecializedNNModuleVariable
    from .variables.user_defined import UserDefinedObjectVariable

    if not enabled() or not isinstance(item, UserDefinedObjectVariable):
        return
    if isinstance(item, UnspecializedNNModuleVariable) or item.source is None:
        return
    old = _original_value(item, name)
    if type(old) in (int, float):
        mark_stored(AttrSource(item.source, name), old, value)


def on_store_subscr(container: VariableTracker, key: VariableTracker, value: VariableTracker) -> None:
    """STORE_SUBSCR ``container[key] = value``: mark and restart when a number that
    entered the frame in a sourced dict entry or list slot gets a new value."""
    from .variables.dicts import ConstDictVariable
    from .variables.lists import ListVariable

    if not enabled() or container.source is None:
        return
    container = container.realize()  # __setitem__ realizes it anyway
    old_vt = None
    if isinstance(container, ConstDictVariable):
        if not key.is_python_constant():
            return  # tensor keys hold tensors in the optimizer's state; not a scalar place
        old_vt = container.maybe_getitem_const(key)
    elif type(container) is ListVariable and key.is_python_constant():
        index = key.as_python_constant()
        if type(index) is int and -len(container.items) <= index < len(container.items):
            old_vt = container.items[index]
    old, source = _entered_value(old_vt)
    if source is not None and type(old) in (int, float):
        mark_stored(source, old, value)


def _changes_make_dynamic(source: Source) -> bool:
    from .source import ChainedSource, is_from_defaults

    return (
        enabled()
        and not config.specialize_int
        and isinstance(source, ChainedSource)
        and not is_from_defaults(source)
        # Ints of torch.nn's own modules and of torch._dynamo.mark_static classes (both
        # UNSPECIALIZED_BUILTIN_NN_MODULE) or of specialized modules are promised
        # constant, as without this patch: mark_static documents "not symints".
        and not source.guard_source.is_unspecialized_builtin_nn_module()
        and not source.guard_source.is_specialized_nn_module()
    )


def is_changed_scalar(tx: InstructionTranslatorBase, source: Source, value: int, entry: Any) -> bool:
    """True if the int `value` at `source`, specialized by Dynamo whatever automatic
    dynamic says (is_int_specialization_case), has been seen to change between
    compiles (`entry` is its FrameStateSizeEntry) and is at an object's attribute or
    in a container: it is then traced as a DYNAMIC SymInt. Not beyond int64, nor once
    the graph computed an int beyond int64 from it (module_scalars' _Int64Check
    specialized it): inductor computes SymInts in int64."""
    from .module_scalars import _INT64_MAX, _INT64_MIN, scalar_places, SPECIALIZED_INT
    from .pgo import auto_dynamic

    return (
        entry.scalar is auto_dynamic
        and _changes_make_dynamic(source)
        and _INT64_MIN <= value <= _INT64_MAX
        and scalar_places(tx).get(source.name) != SPECIALIZED_INT
    )


def changed_scalar_hint(source: Source, hint: str | None) -> str | None:
    """The recompile hint of the value guard on such an int: say that a change makes
    it dynamic (shown with the guard failure that recompiles)."""
    if not _changes_make_dynamic(source):
        return hint
    return (
        f"{source.name} is specialized until it changes; the recompile traces it as a dynamic SymInt "
        "(torch._dynamo.config.scalar_state)"
    )


def wrap_changed_scalar(builder: VariableBuilder, value: int) -> VariableTracker:
    from .module_scalars import wrap_mutated_module_scalar

    recompiles_log.info("%s changed between calls: it is now traced as a dynamic SymInt", builder.source.name)
    return wrap_mutated_module_scalar(builder, value)


def call_math_pow(
    tx: InstructionTranslatorBase, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
) -> VariableTracker | None:
    """``math.pow(x, y)`` with a SymInt or SymFloat operand (a bias correction
    ``1 - math.pow(beta, group['step'])`` on a traced step), which the graph would
    otherwise call on the SymInt, specializing it on its value: one recompile per step.

    math.pow(x, y) is C pow() of the two doubles, as ``float(x) ** float(y)`` is, where
    neither raises: traced as that when x > 0 and x ** y lies in (0, 1] (x <= 1 and
    y >= 0, or x >= 1 and y <= 0; no ValueError, no OverflowError), under guards on
    those relations of the symbolic operands. Otherwise None (the value is specialized
    as before)."""
    from torch.fx.experimental.symbolic_shapes import guard_bool

    from .variables.builtin import BuiltinVariable
    from .variables.constant import ConstantVariable
    from .variables.tensor import SymNodeVariable

    if not config.scalar_state or kwargs or len(args) != 2:
        return None
    args = [a.realize() for a in args]
    if not any(isinstance(a, SymNodeVariable) for a in args):
        return None
    hints = []
    for a in args:
        if isinstance(a, SymNodeVariable):
            if a.python_type() not in (int, float) or not a.sym_num.node.has_hint():
                return None
            hints.append(a.sym_num.node.hint)
        elif a.is_python_constant() and type(a.as_python_constant()) in (int, float):
            hints.append(a.as_python_constant())
        else:
            return None
    (x, y), (hx, hy) = args, hints
    if not hx > 0:
        return None
    if hx <= 1 and hy >= 0:
        relations = ((x, operator.gt, 0), (x, operator.le, 1), (y, operator.ge, 0))
    elif hx >= 1 and hy <= 0:
        relations = ((x, operator.ge, 1), (y, operator.le, 0))
    else:
        return None
    for vt, op, bound in relations:
        if isinstance(vt, SymNodeVariable):
            guard_bool(op(vt.sym_num, bound))  # holds on this frame's values: guards it
    floats = [
        BuiltinVariable(float).call_function(tx, [a], {})
        if isinstance(a, SymNodeVariable)
        else ConstantVariable.create(float(a.as_python_constant()))
        for a in args
    ]
    return BuiltinVariable(operator.pow).call_function(tx, floats, {})


def on_dict_method_store(
    container: VariableTracker, name: str, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
) -> None:
    """``d.update(...)`` and ``d.__setitem__(k, v)`` on a dict: each stored entry as
    STORE_SUBSCR (on_store_subscr). ``update`` with a dict or keyword arguments; its
    iterable-of-pairs form is left as it is (no number entered a place it names)."""
    from .variables.constant import ConstantVariable
    from .variables.dicts import ConstDictVariable

    if not enabled() or container.source is None:
        return
    if name == "__setitem__" and len(args) == 2 and not kwargs:
        on_store_subscr(container, args[0], args[1])
    elif name == "update" and len(args) <= 1:
        pairs = []
        if args:
            other = args[0].realize()
            if not isinstance(other, ConstDictVariable):
                return
            pairs = [(k.vt, v) for k, v in other.items.items()]
        pairs += [(ConstantVariable.create(k), v) for k, v in kwargs.items()]
        for key, value in pairs:
            on_store_subscr(container, key, value)
# Floats changed from outside: an LR scheduler's param_groups[i]['lr'], a value eager
# code sets between calls. Automatic dynamic makes such a float a SymFloat after one
# observed change; AOTAutograd's _tensorify_python_scalars then turns the SymFloat's
# uses into tensor compute, but only for a few Tensor-Scalar operators: where it feeds
# the Scalar argument of any other op (torch.optim's `_foreach_mul_(params, 1 - lr * wd)`,
# `_foreach_div_(bias_correction, lr)`, `_foreach_pow(beta1, steps)`, `lerp(..., 1 - beta1)`)
# the float is specialized and every new value recompiles. The ops below have a
# Tensor overload that computes the same as the Scalar one when the 0-d tensor holds the
# scalar converted to the op's computation dtype (TensorIterator reads a CPU scalar
# tensor as it reads a wrapped Python number).


def changed_float_guard(source: Source, value: float, entry: Any) -> Any:
    """The guard on a float at `source` that wrap_symfloat specializes because automatic
    dynamic has not seen it change yet (`entry`, its FrameStateSizeEntry): its value
    guard, with a recompile hint saying that a change makes it a SymFloat where one
    makes it so (the other reasons wrap_symfloat specializes for never change)."""
    import math

    from .guards import GuardBuilder
    from .pgo import auto_dynamic
    from .source import is_constant_source

    if (
        not enabled()
        or not _changes_make_dynamic(source)
        or config.specialize_float
        or not config.assume_static_by_default
        or entry.scalar is auto_dynamic
        or not math.isfinite(value)
        or is_constant_source(source)
        or torch._inductor.config.triton.cudagraphs
    ):
        return GuardBuilder.CONSTANT_MATCH
    hint = (
        f"{source.name} is specialized until it changes; the recompile traces it as a dynamic SymFloat "
        "(torch._dynamo.config.scalar_state)"
    )
    return functools.partial(GuardBuilder.EQUALS_MATCH, recompile_hint=hint)


def _float_dtype(vals: Any) -> torch.dtype | None:
    """The one floating dtype of a tensor or of a non-empty list of tensors, else None."""
    vals = vals if isinstance(vals, (list, tuple)) else [vals]
    dtypes = {v.dtype for v in vals if isinstance(v, torch.Tensor)}
    if len(dtypes) != 1 or len(vals) != sum(isinstance(v, torch.Tensor) for v in vals):
        return None
    (dtype,) = dtypes
    return dtype if dtype.is_floating_point else None


def _call(graph: torch.fx.Graph, fake_mode: Any, op: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
    """A new node `op(*args, **kwargs)` with its fake value. (Casts are
    prims.convert_element_type, as the pass's own: this graph is decomposed already.)"""
    new = graph.call_function(op, args, kwargs)
    with fake_mode:
        new.meta["val"] = op(*torch.fx.map_arg(args, lambda n: n.meta["val"]), **kwargs)
    return new


def _has_float_input(sym: torch.SymFloat) -> bool:
    """Whether `sym` depends on a backed float symbol (a float graph input), which the
    pass specializes unless each use takes it as a tensor. A SymFloat computed from
    SymInts and constants only (a bias correction ``1 - 0.9 ** (step + 1)``) stays a
    Scalar that the graph computes in Python floats at run time, as eager does: in
    tensor form ``add(a, b, alpha=s)`` would lose the fused kernel's rounding
    (pytorch-optimizer's LoRA-RITE state was 1.7e-3 off eager from its second step)."""
    from torch.fx.experimental.symbolic_shapes import symbol_is_type
    from torch.utils._sympy.symbol import SymT

    return any(symbol_is_type(s, SymT.FLOAT) for s in sym.node.expr.free_symbols)


def _symbol_node(interp: Any, sym: torch.SymFloat) -> torch.fx.Node | None:
    """The graph node computing `sym` from the graph's symbols (the pass's interpreter
    of its sympy expression), or None where the interpreter has no rule for it."""
    try:
        return interp(sym.node.expr).node
    except NotImplementedError:
        return None


def tensorify_scalar_argument(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    fake_mode: Any,
    interp: Any,
    tensorified_symbols: set[Any],
) -> bool:
    """Called by _tensorify_python_scalars for a node none of its own replacements
    handle: if a backed SymFloat feeds a Scalar argument of one of the ops below,
    replace the node by the op's Tensor overload, taking the float as the 0-d float64
    tensor `interp` (the pass's sympy interpreter) computes for it, and return True."""
    from torch._prims_common import get_computation_dtype
    from torch.fx.experimental.symbolic_shapes import symbol_is_type
    from torch.utils._sympy.symbol import SymT

    aten = torch.ops.aten
    if not enabled() or node.op != "call_function":
        return False
    target, args, kwargs = node.target, node.args, node.kwargs
    if target in (aten.add.Tensor, aten.sub.Tensor) and list(kwargs) == ["alpha"]:
        return _tensorify_alpha(graph, node, fake_mode, interp, tensorified_symbols)
    # (index of the Scalar argument, the tensor argument whose dtype it is read in)
    where = {
        aten._foreach_mul.Scalar: (1, 0),
        aten._foreach_div.Scalar: (1, 0),
        aten._foreach_pow.ScalarAndTensor: (0, 1),
        aten.lerp.Scalar: (2, 0),
        aten.pow.Scalar: (0, 1),
        aten.full_like.default: (1, 0),
        aten.full.default: (1, None),  # (the decomposition of full_like)
    }.get(target)
    fills = target in (aten.full_like.default, aten.full.default)
    if where is None or (kwargs and not fills) or len(args) != 2 + (target is aten.lerp.Scalar):
        return False
    scalar_index, tensor_index = where
    scalar = args[scalar_index]
    if not isinstance(scalar, torch.fx.Node) or not isinstance(sym := scalar.meta.get("val"), torch.SymFloat):
        return False
    if not sym.node.has_hint() or not _has_float_input(sym):
        return False
    if tensor_index is None:
        dtype = _float_dtype(node.meta.get("val"))
    else:
        dtype = _float_dtype(torch.fx.map_arg(args[tensor_index], lambda n: n.meta.get("val")))
    if dtype is None:
        return False
    if get_computation_dtype(dtype) != dtype and target is not aten.lerp.Scalar and not fills:
        # float16/bfloat16: a 0-d operand among them in the computation dtype would promote
        return False
    if fills:
        # A fill with the default options of a CPU tensor (the float's 0-d tensor is on
        # the CPU); full() must say its dtype.
        defaults = {"dtype": (None, dtype) if tensor_index is not None else (dtype,),
                    "layout": (None, torch.strided), "pin_memory": (None, False),
                    "memory_format": (None, torch.preserve_format), "device": (None, torch.device("cpu"))}
        if any(k not in defaults or v not in defaults[k] for k, v in kwargs.items()):
            return False
        if node.meta["val"].device.type != "cpu" or (tensor_index is None and "dtype" not in kwargs):
            return False
    value = _symbol_node(interp, sym)
    if value is None:
        return False
    call = functools.partial(_call, graph, fake_mode)

    # lerp takes its weight in the tensors' dtype; the rest in their computation dtype
    cast_to = dtype if target in (aten.lerp.Scalar, aten.full.default) else get_computation_dtype(dtype)
    if value.meta["val"].dtype != cast_to and target is not aten.full_like.default:
        value = call(torch.ops.prims.convert_element_type.default, value, cast_to)
    if target is aten._foreach_mul.Scalar:
        replacement = call(aten._foreach_mul.Tensor, args[0], value)
    elif target is aten._foreach_div.Scalar:
        replacement = call(aten._foreach_div.Tensor, args[0], value)
    elif target is aten.lerp.Scalar:
        replacement = call(aten.lerp.Tensor, args[0], args[1], value)
    elif target is aten.pow.Scalar:
        replacement = call(aten.pow.Tensor_Tensor, value, args[1])
    elif target is aten.full_like.default:
        replacement = call(aten.copy.default, args[0], value)
    elif target is aten.full.default:
        replacement = call(aten.clone.default, call(aten.expand.default, value, args[0]))
    else:  # _foreach_pow(s, exponents): the same base for every exponent
        replacement = call(aten._foreach_pow.List, [value] * len(args[1]), args[1])
    node.replace_all_uses_with(replacement)
    graph.erase_node(node)
    tensorified_symbols.update(s for s in sym.node.expr.free_symbols if symbol_is_type(s, SymT.FLOAT))
    log.debug("tensorified the float argument of %s", target)
    return True


def _tensorify_alpha(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    fake_mode: Any,
    interp: Any,
    tensorified_symbols: set[Any],
) -> bool:
    """``add(a, b, alpha=f)`` / ``sub(a, b, alpha=f)`` of two tensors of one floating
    dtype with a SymFloat f (inductor's lerp decomposition writes one): as
    ``add(a, b * f)``, f in the computation dtype. Not bitwise the fused kernel (one
    rounding fewer), as inductor's own lowering of alpha is not."""
    from torch._prims_common import get_computation_dtype
    from torch.fx.experimental.symbolic_shapes import symbol_is_type
    from torch.utils._sympy.symbol import SymT

    alpha = node.kwargs["alpha"]
    if not isinstance(alpha, torch.fx.Node) or not isinstance(sym := alpha.meta.get("val"), torch.SymFloat):
        return False
    if len(node.args) != 2 or not all(isinstance(a, torch.fx.Node) for a in node.args) or not sym.node.has_hint():
        return False
    if not _has_float_input(sym):
        return False
    dtype = _float_dtype([a.meta.get("val") for a in node.args])
    if dtype is None or get_computation_dtype(dtype) != dtype:
        return False
    value = _symbol_node(interp, sym)
    if value is None:
        return False
    call = functools.partial(_call, graph, fake_mode)

    compute = get_computation_dtype(dtype)
    if value.meta["val"].dtype != compute:
        value = call(torch.ops.prims.convert_element_type.default, value, compute)
    scaled = call(torch.ops.aten.mul.Tensor, node.args[1], value)
    node.replace_all_uses_with(call(node.target, node.args[0], scaled))
    graph.erase_node(node)
    tensorified_symbols.update(s for s in sym.node.expr.free_symbols if symbol_is_type(s, SymT.FLOAT))
    return True


def _pin_holds(val: Any) -> bool:
    """Whether the guard that pins the SymFloat expression `val` to its value holds on
    the frame that makes it. The guard is Python code printed from the expression as
    sympy normalized it (`0.125 + 2.25*x` for `(x * 1.5 + 0.05) * 1.5 + 0.05`,
    `0.0010000000000000009*d*d` for `d * d * (1.0 - 0.999)`), whose roundings can
    differ from the frame's: evaluated here the same way on the symbols' values."""
    import math

    from torch.utils._sympy.printers import PythonPrinter

    node = val.node
    values = node.shape_env.backed_var_to_val
    try:
        env = {str(s): float(values[s]) if values[s].is_Float else int(values[s]) for s in node.expr.free_symbols}
        return eval(PythonPrinter().doprint(node.expr), {"math": math, "torch": torch}, env) == node.hint
    except Exception:  # no value, or code the printer writes for the guard builder alone
        return False


def restart_partially_tensorified(val: Any, tensorified_symbols: set[Any], saved_to_cache: bool) -> bool:
    """_tensorify_python_scalars specializes a SymFloat expression that some use could
    not take as a tensor (guard_scalar) without restarting when its float was
    tensorified elsewhere. Specialize those floats on restart instead (as for a float
    no use could take as a tensor), True if so, where that in-place specialization is
    unsafe:
    - the graph is saved to the AOTAutograd cache (`saved_to_cache`), under the key of
      the graph before the pass: the cache serves the compiled code, the value baked
      in, again for other values of the float (a stale result, also without these
      patches);
    - the guard on the expression would fail on this very frame (_pin_holds: sympy's
      form of `d * d * (1.0 - beta2)` is `0.0010000000000000009*d**2`), which fails
      the compile (also without these patches, rarer there: the Tensor overloads above
      make more floats partially tensorified).
    Elsewhere the pass guards on the expression as without these patches (a restart
    would compile the graph once more)."""
    from torch._dynamo.symbolic_convert import TensorifyState
    from torch.fx.experimental.symbolic_shapes import symbol_is_type
    from torch.utils._sympy.symbol import SymT

    if not enabled():
        return False
    partial = [s for s in val.node.expr.free_symbols if symbol_is_type(s, SymT.FLOAT) and s in tensorified_symbols]
    if partial and not saved_to_cache and _pin_holds(val):
        return False
    for s in partial:
        if not TensorifyState.should_specialize(str(s)):
            TensorifyState.specialize(str(s))
    return bool(partial)
