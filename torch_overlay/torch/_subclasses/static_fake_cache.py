"""Dispatch-cache hits of FakeTensorMode for fake tensors with static metadata.

A cache hit builds the key by describing every fake tensor argument as a TensorMetadata
and flattening it field by field, and builds the output by checking each cached size for
a symbolic stub and running empty_strided with guard creation suppressed. For a strided
tensor whose sizes, strides, storage offset and storage size are plain ints (every
parameter, grad and optimizer state tensor of a compiled optimizer step, thousands of ops
per frame), the key items can be appended directly and the output has nothing symbolic to
check or guard on. Both functions give exactly the general path's result and return
None / False, changing nothing, for anything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch._prims_common import suggest_memory_format

# fake_tensor imports this module at its end, when these names are defined.
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import (
        _DispatchCacheEntryOutputInfo,
        FakeTensorMode,
    )


# The general path tags each flattened sequence with its type and f"length_{n}".
_LENGTH_TAGS = tuple(f"length_{n}" for n in range(9))


def _append_int_sequence(result: list[object], seq_type: type, values: tuple) -> None:
    n = len(values)
    result.append(seq_type)
    result.append(_LENGTH_TAGS[n] if n < len(_LENGTH_TAGS) else f"length_{n}")
    for v in values:
        result.append(type(v))
        result.append(v)


def append_static_tensor_key(result: list[object], t: FakeTensor) -> bool:
    """Append to `result` the items extract_tensor_metadata(t)._flatten_into appends, in
    the same order, when `t` is strided with static sizes, strides, offset and storage
    size; return False, appending nothing, otherwise (symbolic or non-strided tensors)."""
    if t._has_symbolic_sizes_strides or t.layout != torch.strided:
        return False
    storage_bytes = t.untyped_storage().nbytes()
    if type(storage_bytes) is not int:
        return False
    memory_format = suggest_memory_format(t)
    if not t.is_contiguous(memory_format=memory_format):
        memory_format = None
    result.append(t.dtype)
    _append_int_sequence(result, torch.Size, t.shape)
    _append_int_sequence(result, tuple, t.stride())
    # device .. sparse_dim: a strided tensor is not sparse, so is_sparse is False and
    # is_coalesced / dense_dim / sparse_dim are None, as extract_tensor_metadata sets them.
    result.extend(
        (
            t.device,
            torch.strided,
            memory_format,
            t.storage_offset(),
            storage_bytes,
            t.requires_grad,
            t.is_quantized,
            t.is_conj(),
            t.is_neg(),
            t.is_inference(),
            False,
            None,
            None,
            None,
        )
    )
    return True


def _all_ints(values: tuple) -> bool:
    for v in values:
        if type(v) is not int:
            return False
    return True


def static_output_from_cache_entry(
    mode: FakeTensorMode, entry: _DispatchCacheEntryOutputInfo
) -> FakeTensor | None:
    """The fresh (non-view, non-inplace) output a cache entry describes, when its
    metadata is all ints and has no conj/neg bit; None, touching nothing, otherwise.

    The general path suppresses guards around empty_strided because cached sizes may be
    symbolic; with plain ints there is nothing to guard on."""
    metadata = entry.metadata
    if (
        metadata is None
        or entry.inplace_idx is not None
        or entry.view_idx is not None
        or metadata.layout != torch.strided
        or metadata.is_conj
        or metadata.is_neg
        or type(metadata.storage_offset) is not int
        or type(metadata.storage_bytes) is not int
        or not _all_ints(metadata.shape)
        or not _all_ints(metadata.stride)
    ):
        return None
    with in_kernel_invocation_manager(mode):
        empty = torch.empty_strided(
            metadata.shape,
            metadata.stride,
            dtype=metadata.dtype,
            layout=metadata.layout,
            device="meta",
            requires_grad=metadata.requires_grad,
        )
    return FakeTensor(mode, empty, metadata.device)
