"""Meta conversion of plain tensors without a full description.

``MetaConverter`` describes every tensor it converts (``describe_tensor``: some thirty
properties, views, subclasses, functorch levels, nested ints) and then walks the general
``meta_tensor`` path with that description. For a plain dense leaf tensor with static
sizes (the parameters, grads and optimizer state of a model: thousands of them in an
optimizer step) all of that produces one ``empty_strided`` meta tensor with the same
sizes, strides, dtype and ``requires_grad``, a fresh storage, and its grad converted the
same way. ``convert_plain_tensor`` builds exactly that, and returns ``None`` for any
tensor where the general path would do something else, before changing any state, so
the caller falls back to it.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

import torch
from torch._C._functorch import is_functorch_wrapped_tensor, is_legacy_batchedtensor, peek_interpreter_stack
from torch._logging import trace_structured
from torch._logging._internal import trace_log

if TYPE_CHECKING:
    from torch._guards import Source
    from torch.fx.experimental.symbolic_shapes import ShapeEnv, SymbolicContext

    from .meta_utils import MetaConverter


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _is_plain(t: torch.Tensor) -> bool:
    """A real CPU/CUDA tensor of exact Tensor/Parameter type (no fake or functional
    subclass): strided, a leaf and no view, at offset 0 of a non-empty storage, with none
    of the properties the general path special-cases."""
    return (
        type(t) in _PLAIN_TYPES
        and t.layout is torch.strided
        and not t.is_nested
        and t.device.type in ("cpu", "cuda")
        and t.is_leaf
        and not t._is_view()
        and t.storage_offset() == 0
        and not t.is_conj()
        and not t.is_neg()
        and not t.is_inference()
        and not t.is_quantized
        and not is_functorch_wrapped_tensor(t)
        and not is_legacy_batchedtensor(t)
        and not torch._is_functional_tensor(t)
        and not getattr(t, "_is_buffer", False)
        and t.untyped_storage().nbytes() > 0
        and not _has_nested_int(t)
    )


def _has_nested_int(t: torch.Tensor) -> bool:
    """Whether ``t`` is the offsets (or lengths) of a nested tensor: the general path
    gives its fake the symbolic nested int every nested tensor built on it shares."""
    from torch.nested._internal.nested_tensor import _tensor_symint_registry

    return t in _tensor_symint_registry


def _static_sizes(t: torch.Tensor, shape_env: ShapeEnv | None, symbolic_context: SymbolicContext | None) -> bool:
    """Whether the general path would give ``t`` its own sizes and strides as ints."""
    from torch.fx.experimental.symbolic_shapes import (
        _is_all_static,
        StatefulSymbolicContext,
        StatelessSymbolicContext,
    )

    if shape_env is None:
        return True
    # A view-base context makes the general path give the grad a fresh (dynamic) one;
    # subclass contexts are for subclasses.
    if type(symbolic_context) not in (StatelessSymbolicContext, StatefulSymbolicContext):
        return False
    if symbolic_context.view_base_context is not None:
        return False

    # Only where ShapeEnv's static fast path (static-fake-sizes-fast-path) hands the
    # ints back: elsewhere the general path goes through sympy and may record events.
    return not shape_env._translation_validation_enabled and _is_all_static(
        shape_env, symbolic_context, t.dim()
    )


def _fresh(converter: MetaConverter[Any], t: torch.Tensor) -> bool:
    """Neither ``t`` nor its storage has been converted: an aliasing storage takes the
    general path's ``set_()``, a converted tensor its memo."""
    describer = converter.describer
    if t in describer.lookup_tensor:
        return False
    storage_id = describer.lookup_storage.get(t.untyped_storage())
    return storage_id is None or storage_id not in converter.storage_memo


def _eligible(
    converter: MetaConverter[Any],
    t: torch.Tensor,
    shape_env: ShapeEnv | None,
    symbolic_context: SymbolicContext | None,
) -> bool:
    if not (_is_plain(t) and _static_sizes(t, shape_env, symbolic_context) and _fresh(converter, t)):
        return False
    grad = t.grad
    # The general path converts the grad with the tensor's symbolic context.
    return grad is None or (
        not grad.requires_grad
        and _is_plain(grad)
        and _static_sizes(grad, shape_env, symbolic_context)
        and _fresh(converter, grad)
        and grad.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    )


def _make(converter: MetaConverter[Any], t: torch.Tensor, callback: Any) -> torch.Tensor:
    """What ``meta_tensor``'s dense branch builds for a plain tensor, memos included."""
    describer = converter.describer
    tensor_id = describer.get_tensor_id(t)
    storage_id = describer.get_storage_id(t.untyped_storage())
    sizes, strides, dtype = tuple(t.shape), t.stride(), t.dtype
    r = callback(lambda: torch.empty_strided(sizes, strides, dtype=dtype, device="meta"), device=t.device)
    if t.requires_grad:
        r.requires_grad = True
    converter.storage_memo[storage_id] = r.untyped_storage()
    if type(t) is torch.nn.Parameter:
        r._is_param = True
    converter.tensor_memo[tensor_id] = r
    converter.arg_cnt += 1
    return r


def convert_plain_tensor(
    converter: MetaConverter[Any],
    t: torch.Tensor,
    shape_env: ShapeEnv | None,
    callback: Any,
    source: Source | None,
    symbolic_context: SymbolicContext | None,
    trace: bool,
) -> torch.Tensor | None:
    """``converter(t, ...)``'s result for a plain tensor, or None (nothing changed) when
    ``t`` needs the general path."""
    # Real-tensor propagation copies data; the general path builds under
    # inference_mode(False) and with functorch's interpreter stack cleared; it also
    # raises its no_dispatch() error.
    if (
        converter.copy_data
        or torch.is_inference_mode_enabled()
        or peek_interpreter_stack() is not None
        or torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.Python)
    ):
        return None
    tracing = trace and source is not None and bool(trace_log.handlers)
    if not tracing and _is_plain(t):
        # Converted before (a grad converted with its parameter): the general path
        # describes it again only to find its memo.
        tensor_id = converter.describer.lookup_tensor.get(t)
        if tensor_id is not None and tensor_id in converter.tensor_memo:
            return converter.tensor_memo[tensor_id]
    if not _eligible(converter, t, shape_env, symbolic_context):
        return None
    if tracing:
        # A structured trace logs the description (tensor, storage, grad) and its source
        # as the general path does; only then is the description worth making.
        desc = converter.describer.describe_tensor(t, trace=True)
        trace_structured(
            "describe_source",
            metadata_fn=lambda: {"describer_id": converter.describer.id, "id": desc.id, "source": source.name},
        )
    with torch._dispatch.python.suspend_functionalization():
        r = _make(converter, t, callback)
        grad = t.grad
        if grad is not None:
            r.grad = _make(converter, grad, callback)
    return r
