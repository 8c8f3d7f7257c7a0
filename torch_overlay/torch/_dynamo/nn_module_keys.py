"""Find the key an object is registered under in OutputGraph.nn_modules in O(1).

OutputGraph.register_attr_or_module installs every module and static tensor (an
optimizer's parameters and state, non-inlined module parameters) under a key of
``nn_modules`` and reuses the key when the same object comes again through another
source. Without this module it finds that key by walking ``nn_modules`` for an entry
that ``is`` the object: one walk per registration, quadratic in the number of
registered objects (an Adam step over 1,000 parameters registers 4,000 tensors).

NNModuleKeys keeps, for one ``nn_modules`` dict, a map from each value's id to its
first key in insertion order: the key the walk returns. The values are alive while
the dict holds them, so their ids are unambiguous. The map is rebuilt whenever the
dict is not the one it was built from (``restore_graphstate`` installs a copy), has
another length than the map has seen (an entry added elsewhere, ``clear()``), or no
longer holds the object under the key found. Dynamo only ever adds new keys to
``nn_modules`` (under get_unique_name_wrt names), clears or replaces it; an entry
overwritten elsewhere with an object not held before is not seen until the next
rebuild, which at worst registers that object under a second key (its
VariableTracker is the same: register_attr_or_module looks it up first).
"""

from __future__ import annotations

from typing import Any

from . import config


class NNModuleKeys:
    __slots__ = ("_modules", "_length", "_first_key")

    def __init__(self) -> None:
        self._modules: dict[str, Any] | None = None
        self._length = 0
        self._first_key: dict[int, str] = {}

    def _sync(self, nn_modules: dict[str, Any]) -> None:
        if nn_modules is self._modules and len(nn_modules) == self._length:
            return
        first_key: dict[int, str] = {}
        for key, value in nn_modules.items():
            first_key.setdefault(id(value), key)
        self._modules, self._length, self._first_key = nn_modules, len(nn_modules), first_key

    def find(self, nn_modules: dict[str, Any], target: Any) -> str | None:
        """The first key of ``nn_modules`` whose value ``is`` target, or None."""
        if not config.nn_module_key_index:
            return next((key for key, value in nn_modules.items() if value is target), None)
        self._sync(nn_modules)
        key = self._first_key.get(id(target))
        if key is not None and nn_modules.get(key) is not target:
            # The key was given another object without the map: rebuild.
            self._modules = None
            self._sync(nn_modules)
            key = self._first_key.get(id(target))
        return key

    def add(self, nn_modules: dict[str, Any], key: str, target: Any) -> None:
        """``nn_modules[key] = target``, kept in the map."""
        replaced = key in nn_modules
        nn_modules[key] = target
        if replaced or not config.nn_module_key_index:
            self._modules = None  # the old value's entry is stale: rebuild on next use
            return
        if nn_modules is self._modules and len(nn_modules) == self._length + 1:
            self._length += 1
            self._first_key.setdefault(id(target), key)
