"""The result of an in-place foreach op is its first argument.

The Python binding of every in-place foreach op (``torch._foreach_add_(self, ...)``,
schema ``(Tensor(a!)[] self, ...) -> ()``) returns the very list or tuple it was given
as ``self``: ``torch._foreach_mul_(bufs, 0.9) is bufs``. Without this module Dynamo
wraps the traced op's fake result like any list output, one ``operator.getitem`` node
and one new TensorVariable per element: N graph nodes that dead code elimination
removes again, N VariableTrackers for tensors that already have one, and a result
that ``is`` not the argument, unlike eager. An optimizer step over N parameters makes
ten or more such calls.

Here the result is the argument's own VariableTracker, once the fake op has run (its
checks and in-place metadata updates are kept) and has returned, element for element,
the same fake tensors as the argument holds. Anything else is wrapped as before.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

import torch

from .. import config
from ..utils import _disable_saved_tensors_hooks_during_tracing, get_fake_value, set_example_value
from .base import VariableTracker
from .lists import ListVariable, TupleVariable

if TYPE_CHECKING:
    from ..symbolic_convert import InstructionTranslatorBase


def _is_inplace_foreach(fn: Any) -> bool:
    name = getattr(fn, "__name__", "")
    return (
        name.startswith("_foreach_")
        and name.endswith("_")
        and getattr(torch, name, None) is fn
        and getattr(torch.ops.aten, name, None) is not None
    )


def returns_self_argument(fn: Any, args: list[VariableTracker]) -> bool:
    """Whether ``fn(*args)`` is an in-place foreach call on a list or tuple of tensors,
    whose result :func:`wrap_inplace_foreach_result` takes from ``args[0]``."""
    if not (config.inplace_foreach_returns_self and args and _is_inplace_foreach(fn)):
        return False
    self_arg = args[0].realize()  # an argument of the frame may be a lazy tracker
    return type(self_arg) in (ListVariable, TupleVariable) and all(
        item.is_tensor() for item in self_arg.items
    )


def wrap_inplace_foreach_result(
    tx: InstructionTranslatorBase, proxy: torch.fx.Proxy, self_arg: VariableTracker
) -> VariableTracker:
    """Run the in-place foreach op on fake tensors and return ``self_arg`` when the
    op returned ``self_arg``'s fake tensors; otherwise wrap its result as usual."""
    from .builder import handle_traced_output
    from .tensor import TensorVariable

    with _disable_saved_tensors_hooks_during_tracing():
        example_value = get_fake_value(proxy.node, tx, allow_non_graph_fake=True)
    items = self_arg.realize().items
    if isinstance(example_value, (list, tuple)) and len(example_value) == len(items):
        if all(
            result is item.as_proxy().node.meta.get("example_value")
            for result, item in zip(example_value, items)
        ):
            set_example_value(proxy.node, example_value)
            return self_arg
    return handle_traced_output(example_value, tx, proxy, {}, None, TensorVariable)
