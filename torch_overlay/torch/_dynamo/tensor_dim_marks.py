"""What ``_automatic_dynamic`` reads of one tensor and its source, read once per tensor.

For every dimension of every wrapped tensor, ``_automatic_dynamic`` looked up the
tensor's ``mark_dynamic``/``mark_static``/``mark_unbacked`` index sets (five
``getattr`` calls), normalized the source's name with a regex, walked the source
chain to its base, and matched the name against the dynamic-sources,
unbacked-sources and dynamic-values lists (each list lookup hashes its config
string). None of that depends on the dimension; on a compile that wraps thousands
of small tensors it is a few percent of the first compile. ``TensorDimMarks.read``
does it once per tensor; the per-dimension loop only asks ``i in ...``.

The lists are still matched per dimension when they are non-empty (an entry can
name one dimension), so the decisions are the same as reading everything per
dimension, which is what ``config.automatic_dynamic_marks_once = False`` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container
from typing import Any, TYPE_CHECKING

from torch.fx.experimental._dynamism import normalize_source_name

from .source import ChainedSource, LocalSource

if TYPE_CHECKING:
    import torch
    from torch._guards import Source


@dataclasses.dataclass(frozen=True, slots=True)
class TensorDimMarks:
    strict_unbacked: Container[int]
    unbacked: Container[int]
    dynamic: Container[int]
    weak_dynamic: Container[int]
    propagated_dynamic: Container[int]
    static: Container[int]
    specialize_on: dict[int, Any]
    # Only read when the base source is a LocalSource with dynamism (per-source PGO
    # hints); None otherwise, which saves a regex substitution per tensor.
    normalized_source_name: str | None
    base_source: Source
    # Whether torch.compiler.config's dynamic_sources / unbacked_sources /
    # dynamic_values lists have any entry: an empty list matches no dimension.
    dynamic_sources_listed: bool
    unbacked_sources_listed: bool
    dynamic_values_listed: bool

    @classmethod
    def read(cls, e: torch.Tensor, source: Source) -> TensorDimMarks:
        # Imported here: builder imports this module.
        from .variables.builder import (
            get_dynamic_sources,
            get_dynamic_values,
            get_unbacked_sources,
        )

        base_source = source.get_base() if isinstance(source, ChainedSource) else source
        has_dynamism = (
            isinstance(base_source, LocalSource) and base_source.dynamism is not None
        )
        return cls(
            strict_unbacked=getattr(e, "_dynamo_strict_unbacked_indices", ()),
            unbacked=getattr(e, "_dynamo_unbacked_indices", ()),
            dynamic=getattr(e, "_dynamo_dynamic_indices", ()),
            weak_dynamic=getattr(e, "_dynamo_weak_dynamic_indices", ()),
            propagated_dynamic=getattr(e, "_dynamo_propagated_dynamic_indices", ()),
            static=getattr(e, "_dynamo_static_indices", ()),
            specialize_on=getattr(e, "_specialize_on", {}),
            normalized_source_name=(
                normalize_source_name(source.name) if has_dynamism else None
            ),
            base_source=base_source,
            dynamic_sources_listed=bool(get_dynamic_sources()),
            unbacked_sources_listed=bool(get_unbacked_sources()),
            dynamic_values_listed=bool(get_dynamic_values()),
        )
