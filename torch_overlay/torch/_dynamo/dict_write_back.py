"""Which entries of a dict the frame mutated the residual bytecode writes back.

ConstDictVariable writes back an entry whose value tracker is not the tracker of
the entry's original value. A frame can store back the very object an entry held
under another tracker: torch.optim's SGD step runs
``self.state[p]["momentum_buffer"] = buf`` for every parameter, where ``buf`` is
the tensor the state dict already holds, wrapped through the optimizer's own
source ``state[p][list(dict.keys(state[p]))[i]]``. Without this module every such
store is replayed after the graph: N dict lookups and N ``dict.update`` calls per
call for N parameters.

An entry ``d[k]`` (``k`` a constant) still holds its original object when the
stored value's tracker has a source that is, by the guards, the slot ``d[k]``
when the frame started:

* ``d[k]`` itself, or
* ``d[list(dict.keys(d))[i]]`` where the key order of ``d`` is guarded and its
  key at ``i`` is ``k``: a guard ``list(dict.keys(d))[i] == k`` is installed, the
  check any guard through ``d[k]`` makes on a key-order-guarded dict
  (guards.getitem_on_dict_manager), so both sources name one slot on every call
  the guards accept.

Anything else (new objects, another slot, a dict whose keys were removed) is
written back as before.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from . import config
from .guards import GuardBuilder, install_guard
from .source import ConstDictKeySource, DictGetItemSource
from .utils import dict_keys_list

if TYPE_CHECKING:
    from .variables.base import VariableTracker
    from .variables.dicts import ConstDictVariable
    from .variables.hashable import HashableTracker


def _is_literal(value: Any) -> bool:
    return type(value) in (int, str)


def holds_original_value(
    dict_vt: ConstDictVariable, key: HashableTracker, value: VariableTracker
) -> bool:
    """True if `value`, stored at `key` of `dict_vt`, is by the guards the object
    that entry held when the frame started, so writing it back changes nothing."""
    if not config.write_back_changed_dict_entries_only:
        return False
    base = dict_vt.source
    if base is None or dict_vt.should_reconstruct_all:
        return False
    if not key.vt.is_python_constant():
        return False
    k = key.vt.as_python_constant()
    source = getattr(value, "source", None)
    if not _is_literal(k) or not isinstance(source, DictGetItemSource) or source.base != base:
        return False
    if _is_literal(source.index):
        return type(source.index) is type(k) and source.index == k
    if not isinstance(source.index, ConstDictKeySource) or source.index.base != base:
        return False

    from .symbolic_convert import InstructionTranslator

    output = InstructionTranslator.current_tx().output
    if base not in output.guard_on_key_order:
        return False
    try:
        keys = dict_keys_list(output.resolve_source_value(base))
    except Exception:
        return False
    position = source.index.index
    if not (0 <= position < len(keys)) or type(keys[position]) is not type(k) or keys[position] != k:
        return False
    # Pin the key at `position` to `k`: the check that a guard through `d[k]` already
    # makes on a key-order-guarded dict (torch.optim's state dicts have it), so for
    # them nothing new is checked.
    install_guard(source.index.make_guard(GuardBuilder.EQUALS_MATCH))
    return True
