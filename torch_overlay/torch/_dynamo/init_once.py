"""``init_values_once``: mark a lazy-initialisation function that Dynamo runs instead of tracing.

Lazily initialising code (an optimizer's ``_init_group``, a cache keyed by parameters,
per-tensor state dicts) is a no-op after its first call, but Dynamo traces through it
on every compile and guards on whatever it happens to read. A function marked with
``init_values_once(guards=[...])`` is instead called for real when Dynamo reaches it
at trace time; Dynamo then guards on the named inputs and hands the function's results
and the lists it filled to the graph (see ``variables/init_once.py``).

This module holds only the decorator and its registry, so importing it costs nothing
and the decorated function is returned unchanged: eager calls are not affected.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["init_values_once"]

_F = TypeVar("_F", bound=Callable[..., Any])

# One path step of a guard spec: ("attr", name) or ("item", key).
PathStep = tuple[str, Any]

_SPEC_ROOT = re.compile(r"[A-Za-z_]\w*")
_SPEC_STEP = re.compile(r"\.([A-Za-z_]\w*)|\[\s*(?:'([^']*)'|\"([^\"]*)\"|(-?\d+))\s*\]")


@dataclasses.dataclass(frozen=True)
class GuardSpec:
    """A guarded input: a parameter name followed by attribute and item steps."""

    text: str
    root: str
    path: tuple[PathStep, ...]

    def resolve(self, root_value: Any) -> Any:
        value = root_value
        for kind, key in self.path:
            value = getattr(value, key) if kind == "attr" else value[key]
        return value


@dataclasses.dataclass(frozen=True)
class InitValuesOnceFunction:
    fn: Callable[..., Any]
    signature: inspect.Signature
    guards: tuple[GuardSpec, ...]


def parse_guard_spec(text: str) -> GuardSpec:
    """``"self.state"``, ``"group['params']"``, ``"groups[0].lr"`` -> GuardSpec."""
    if not isinstance(text, str):
        raise TypeError(f"init_values_once: a guard spec must be a string, got {text!r}")
    match = _SPEC_ROOT.match(text)
    if match is None:
        raise ValueError(f"init_values_once: guard spec {text!r} must start with a parameter name")
    root, pos, path = match.group(0), match.end(), []
    while pos < len(text):
        step = _SPEC_STEP.match(text, pos)
        if step is None:
            raise ValueError(
                f"init_values_once: cannot parse guard spec {text!r} at {text[pos:]!r} "
                "(use .attribute, ['key'] or [index])"
            )
        attr, single, double, index = step.groups()
        if attr is not None:
            path.append(("attr", attr))
        elif index is not None:
            path.append(("item", int(index)))
        else:
            path.append(("item", single if single is not None else double))
        pos = step.end()
    return GuardSpec(text, root, tuple(path))


_registry: dict[int, InitValuesOnceFunction] = {}


def init_values_once(guards: Sequence[str]) -> Callable[[_F], _F]:
    """Run the decorated function for real at trace time instead of tracing it, and
    guard on the inputs named by ``guards``.

    ``guards`` are parameter names, optionally followed by attribute and item steps:
    ``["self.state", "self.param_groups"]``. Each named input is guarded
    pytree-style after the call: container types, lengths, dict keys and their order,
    every tensor's metadata (dtype, device, shape, stride, requires_grad) and whether
    it has a ``.grad`` (and the grad's metadata). While the guards pass, the compiled
    code runs and the function is not called again; when one fails, Dynamo recompiles
    and calls the function again.

    The contract, which makes this sound:

    * the function's behaviour depends only on its guarded inputs, on its other
      arguments (which must be constants, objects Dynamo can resolve, or lists and
      dicts created in the compiled frame) and on tensor *metadata*, never tensor values;
    * it mutates only its guarded inputs and the lists it was passed that the frame
      created (a dict created in the frame is passed as a copy and must not change);
    * it is idempotent: a second call with the state it produced changes nothing
      (Dynamo may call it again when it restarts a trace);
    * what it returns or puts into those lists is a constant, a guarded input or
      something reachable from one (a tensor kept in a guarded input, not a new one).

    Arguments that come from outside the frame and are not named in ``guards`` are
    guarded too: constants by value, tensors by metadata, other objects by identity.
    A list or dict that a guarded input reaches is covered by that input's guards:
    ``group`` in ``for group in self.param_groups: self._init_group(group, ...)``
    needs no spec of its own (passed under another name, it must stay that object).

    When the call cannot be made equivalent to tracing it, Dynamo traces the function
    normally instead and logs why on ``torch._dynamo.variables.init_once``: an argument
    has no real value at trace time (a tensor computed in the graph) or is a list,
    dict or set from outside the frame that no guarded input covers; an object reachable from a guarded
    input was already mutated in the frame (under any name); the function returned a
    tensor that is not reachable from its guarded inputs; or it changed a container the
    frame had already read in a way the frame's view of it cannot follow (it replaced or
    removed items, or the frame read the container's keys or length). A call that only
    adds entries to state an earlier call (another param group) filled is run for real.
    Disable with ``torch._dynamo.config.init_values_once = False``.
    """
    if isinstance(guards, str):
        raise TypeError(f"init_values_once: guards must be a list of specs, not the string {guards!r}")
    specs = tuple(parse_guard_spec(g) for g in guards)

    def decorate(fn: _F) -> _F:
        if not inspect.isfunction(fn):
            raise TypeError(f"init_values_once decorates plain functions and methods, not {fn!r}")
        signature = inspect.signature(fn)
        names = list(signature.parameters)
        for spec in specs:
            if spec.root not in signature.parameters:
                raise ValueError(
                    f"init_values_once: guard {spec.text!r} names {spec.root!r}, which is not a "
                    f"parameter of {fn.__qualname__}; its parameters are {', '.join(names)}"
                )
            kind = signature.parameters[spec.root].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise ValueError(f"init_values_once: guard {spec.text!r} names a *args/**kwargs parameter")
        key = id(fn)
        _registry[key] = InitValuesOnceFunction(fn, signature, specs)
        weakref.finalize(fn, _registry.pop, key, None)
        return fn

    return decorate


def lookup_init_values_once(fn: Any) -> InitValuesOnceFunction | None:
    entry = _registry.get(id(fn))
    return entry if entry is not None and entry.fn is fn else None
