"""A chained source's value from its base's value, without evaluating its name.

Source.get_value (guard building, PyCodegen's dict-key caches, the native container
guards' plans) evaluates each chained source's name with eval: the base's value bound
to a temporary local and a string like ``tmp.grad`` or ``tmp['params']`` compiled and
run, thousands of times for a large frame. When the name is exactly the base, one
attribute load, one subscript with an int or str literal, ``list(dict.keys(...))[i]``,
or a dict item by its position among the same dict's keys, these do that operation
directly. They check the name template itself, so a subclass that
names its value differently (``list.__getitem__(...)``, an iterator helper) still gets
the eval. Each is a ChainedSource.value_from_base: NotImplemented means "evaluate the
name".
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from torch._guards import Source

from . import config

if TYPE_CHECKING:
    from torch._guards import ChainedSource

    from .source import AttrSource, ConstDictKeySource, DictGetItemSource, GetItemSource


def attr_value(source: AttrSource, base_value: Any) -> Any:
    """A name ``{0}.member``: getattr(base, member)."""
    if (
        not config.source_values_without_eval
        or source._name_template != "{0}." + source.member
    ):
        return NotImplemented
    return getattr(base_value, source.member)


def _named_by_literal_index(
    source: GetItemSource | DictGetItemSource | ConstDictKeySource,
    index_types: tuple[type, ...],
    before: str,
    after: str,
) -> bool:
    """The switch is on and the source's name is before + repr(index) + after, with an
    index of one of index_types (whose repr evaluates back to the same index)."""
    index = source.index
    return (
        config.source_values_without_eval
        and type(index) in index_types
        and source._name_template == before + repr(index) + after
    )


def item_value(source: GetItemSource | DictGetItemSource, base_value: Any) -> Any:
    """A name ``{0}[<int or str literal>]``: base[index]."""
    if not _named_by_literal_index(source, (int, str), "{0}[", "]"):
        return NotImplemented
    return base_value[source.index]


def dict_key_value(source: ConstDictKeySource, base_value: Any) -> Any:
    """A name ``list(dict.keys({0}))[<int>]``: the same expression, not compiled."""
    if not _named_by_literal_index(source, (int,), "list(dict.keys({0}))[", "]"):
        return NotImplemented
    return list(dict.keys(base_value))[source.index]


def same_value(source: ChainedSource, base_value: Any) -> Any:
    """A name ``{0}`` (a source that only marks its base): the base's value."""
    if not config.source_values_without_eval or source._name_template != "{0}":
        return NotImplemented
    return base_value


def dict_item_value(source: DictGetItemSource, base_value: Any) -> Any:
    """``{0}[<int or str literal>]`` as item_value, and ``{0}[list(dict.keys(B))[i]]``
    whose key source's base B is this source's base: base[list(dict.keys(base))[i]],
    with B's value taken from the caller's cache rather than evaluated again."""
    index = source.index
    if not isinstance(index, Source):
        return item_value(source, base_value)
    if (
        not config.source_values_without_eval
        or getattr(index, "base", None) != source.base
        or source._name_template != "{0}[" + index.name + "]"
    ):
        return NotImplemented
    key = index.value_from_base(base_value)
    if key is NotImplemented:
        return NotImplemented
    return base_value[key]
