"""Explain what Dynamo guards on, grouped by the user's objects, and why it recompiled.

``TORCH_LOGS=guards`` prints the guard tree: hundreds to thousands of lines for an
optimizer or a model with many parameters, and a recompile reason names one of them.
``explain_guards(fn)`` reads the same guard trees (of every cache entry of a compiled
function or module) and summarises them per user object (``self.layer``,
``opt.state``, an argument ``xs``): which objects are matched by identity, by type
only, by contents (keys, lengths), by tensor metadata (how many tensors, which dims
are dynamic), by symbolic relations or by value, and which dynapatch feature put the
guards there. ``describe_guard_failure`` does the same for one failed guard; Dynamo
appends its line to recompile reasons, so ``TORCH_LOGS=recompiles`` shows it.

Run ``python -m torch._dynamo.guard_explainer script.py`` to execute a script and
explain every function it compiled.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["explain_guards", "describe_guard_failure"]

# Leaf guard class -> what it checks, in words.
KIND_CATEGORY = {
    "ID_MATCH": "identity",
    "TYPE_MATCH": "type",
    "TENSOR_MATCH": "tensor",
    "DIMENSION_DYNAMIC_MARKING_GUARD": "tensor bookkeeping",
    "NO_TENSOR_ALIASING": "tensor bookkeeping",
    "EQUALS_MATCH": "value",
    "CONSTANT_MATCH": "value",
    "NOT_NONE_MATCH": "not None",
    "NOT_NONE": "not None",
    "NONE_MATCH": "value",
    # `x == True` / `x == False` (a bool flag such as an optimizer's foreach)
    "TRUE_MATCH": "value",
    "FALSE_MATCH": "value",
    "DICT_CONTAINS": "contents",
    "DICT_KEYS_MATCH": "contents",
    "DICT_VERSION": "contents",
    "LENGTH_CHECK": "contents",
    "SEQUENCE_LENGTH": "contents",
    "TUPLE_ITERATOR_LEN": "contents",
    "DICT_LENGTH": "contents",
    "MAPPING_KEYS_MATCH": "contents",
    "SET_CONTAINS": "contents",
    "NO_HASATTR": "contents",
    "FLOAT_IS_NAN": "value",
    "COMPLEX_IS_NAN": "value",
    "RANGE_ITERATOR_MATCH": "value",
    "FAKE_SCRIPT_TYPE_MATCH": "type",
    "OBJECT_ALIASING": "aliasing",
    "STORAGE_OVERLAPPING": "tensor bookkeeping",
    "SYMBOLIC_SHAPE_GUARD": "relation",
    "GLOBAL_STATE": "global state",
    "TORCH_FUNCTION_MODE_STACK": "global state",
    "DEFAULT_DEVICE": "global state",
}
# Guards of no category above, in words (a summary never shows a raw class name).
OTHER_KIND_TEXT = {
    "DISPATCH_KEY_SET_MATCH": ("dispatch key set check", "dispatch key set checks"),
    "DUAL_LEVEL_MATCH": ("forward-AD dual level check", "forward-AD dual level checks"),
}
# Names under which torch/_dynamo/guard_accel.py installs its native guards.
ACCELERATED_CONTAINER_PREFIX = "___tensor_container_"
ACCELERATED_ALIASING_PREFIX = "___tensor_aliasing_group"
GLOBAL_STATE_GROUP = "<global state>"
NO_ALIASING_GROUP = "<no-aliasing check>"
GLOBALS_GROUP = "<globals and imports>"

_LOCAL = re.compile(r"L\['([^']+)'\]")
_SOURCE = re.compile(r"(?:L|G)\[[^\]]+\](?:\.[A-Za-z_]\w*|\[[^\]]*\])*")
_TENSOR_CHECK = re.compile(
    r"check_tensor\((?P<src>.+?), (?P<type>\w+), DispatchKeySet\([^)]*\), (?P<dtype>torch\.\w+), "
    r"device=(?P<device>[^,]+), requires_grad=(?P<rg>\w+), size=\[(?P<size>[^\]]*)\], stride=\[(?P<stride>[^\]]*)\]"
)
_FEATURE_SPEC = re.compile(r"in (init_values_once\[[^\]]*\])")
_TENSOR_FAILURE = re.compile(
    r"tensor '(?P<src>.+?)' (?P<field>[\w ]+?) mismatch(?: at index (?P<index>\d+))?\. "
    r"expected (?P<old>.+?), actual (?P<new>[^\n]+)"
)


@dataclasses.dataclass
class GuardLine:
    source: str  # the guard manager's source, e.g. L['self'].step
    kind: str  # leaf guard class name, e.g. TYPE_MATCH
    code: str  # the check, without the user-stack comment
    comment: str  # where it was installed (user stack), may be empty

    @property
    def category(self) -> str:
        if self.kind == "LAMBDA_GUARD":
            if self.code.startswith(ACCELERATED_CONTAINER_PREFIX):
                return "accelerated container"
            if self.code.startswith(ACCELERATED_ALIASING_PREFIX):
                return "tensor bookkeeping"
            if "L[" not in self.code:
                return "global state"
            return "aliasing" if " is " in self.code else "relation"
        if self.kind == "EQUALS_MATCH" and self.source.startswith("list(dict.keys("):
            return "contents"  # a dict key, under its DictGuardManager
        return KIND_CATEGORY.get(self.kind, "other")


def _split_comment(part: str) -> tuple[str, str]:
    code, sep, comment = part.partition("  # ")
    return code.strip(), comment.strip() if sep else ""


def _walk(manager: Any, out: list[GuardLine]) -> None:
    from torch._C._dynamo.guards import DictGuardManager

    source = manager.get_source()
    for leaf in manager.get_leaf_guards():
        for part in leaf.verbose_code_parts():
            code, comment = _split_comment(part)
            out.append(GuardLine(source, type(leaf).__name__, code, comment))
    if isinstance(manager, DictGuardManager):
        for _, (key_mgr, value_mgr) in sorted(manager.get_key_value_managers().items()):
            for child in (key_mgr, value_mgr):
                if child is not None:
                    _walk(child, out)
    for child in manager.get_child_managers():
        _walk(child, out)


def guard_lines(guard_manager: Any) -> list[GuardLine]:
    """Every leaf guard of one cache entry's guard tree, relational guards once."""
    root = guard_manager.root
    out: list[GuardLine] = []
    _walk(root, out)
    for leaf in root.get_epilogue_lambda_guards():
        for part in leaf.verbose_code_parts():
            code, comment = _split_comment(part)
            out.append(GuardLine("", type(leaf).__name__, code, comment))
    seen, unique = set(), []
    for line in out:  # relational guards hang off every source they relate
        key = (line.kind, line.code)
        if line.kind in ("NO_TENSOR_ALIASING",) and key in seen:
            continue
        seen.add(key)
        unique.append(line)
    return unique


def user_object(source: str) -> str:
    """The user-level object a guard source belongs to: L['self'].__dict__['_modules']
    ['layer']._parameters['weight'] -> self.layer; L['xs'][3] -> xs."""
    if source in ("", "L", "G"):
        return GLOBAL_STATE_GROUP
    if source.startswith("G["):
        return GLOBALS_GROUP
    path = _unlocal(source)
    path = re.sub(r"\.__dict__\['([A-Za-z_]\w*)'\]", r".\1", path)
    path = re.sub(r"\.(?:_modules|_parameters|_buffers)\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\.(?:__dict__|_modules|_parameters|_buffers)\b", "", path)
    path = re.sub(r"^list\(dict\.keys\((.+?)\)\)", r"\1", path)
    path = re.sub(r"^fn\.__self__", "self", path)
    match = re.match(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?", path)
    return match.group(0) if match else path


def _object_of_line(line: GuardLine) -> str:
    if line.code.startswith(ACCELERATED_ALIASING_PREFIX):
        return NO_ALIASING_GROUP
    if line.source in ("", "L"):
        found = _SOURCE.search(line.code)
        return user_object(found.group(0)) if found else GLOBAL_STATE_GROUP
    return user_object(line.source)


def _scalar_places() -> dict[str, str]:
    """How each scalar place a frame marked is traced (CodeState.scalar_places: source
    name -> "SymInt", "float64 tensor", "specialized int", ...)."""
    from .pgo import get_code_state

    places = (getattr(state, "scalar_places", {}) for state in get_code_state().values())  # older profiles lack it
    return {name: how for p in places for name, how in p.items()}


def _unlocal(text: str) -> str:
    """L['self'].step -> self.step, for display."""
    return _LOCAL.sub(lambda m: m.group(1), text)


def _plural(n: int, word: str) -> str:
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word[:-1]}ies" if word.endswith("y") and word[-2:-1] not in "aeiou" else f"{n} {word}s"


def _kind_text(kind: str, n: int) -> str:
    """`n` guards of a class no category covers, in words: OTHER_KIND_TEXT, or the class
    name spelled out (MY_NEW_MATCH -> "my new match check")."""
    singular, plural = OTHER_KIND_TEXT.get(kind, (None, None))
    if singular is None:
        words = kind.lower().replace("_", " ").removesuffix(" guard")
        singular, plural = f"{words} check", f"{words} checks"
    return f"{n} {singular if n == 1 else plural}"


def _describe_tensors(lines: list[GuardLine]) -> str:
    checks = [m for m in (_TENSOR_CHECK.search(line.code) for line in lines) if m]
    if not checks:
        return ""
    kinds = collections.Counter(m["type"] for m in checks)
    dtypes = collections.Counter(m["dtype"].removeprefix("torch.") for m in checks)
    dynamic = sum(m["size"].split(", ").count("None") for m in checks)
    grads = sum(1 for m in checks if m["src"].endswith(".grad"))
    what = ", ".join(_plural(n, k) for k, n in kinds.most_common())
    if len(dtypes) == 1:
        dtype_text = f"dtype {next(iter(dtypes))}" if len(checks) == 1 else f"all {next(iter(dtypes))}"
    else:
        dtype_text = ", ".join(f"{n} {d}" for d, n in dtypes.most_common())
    text = f"tensor metadata of {what} ({dtype_text}"
    text += f"; {grads} of them grads" if grads else ""
    text += "): dtype, device, shape, stride, requires_grad"
    text += f"; {dynamic} dynamic dims" if dynamic else "; all dims static"
    return text


def _describe_accelerated(lines: list[GuardLine], closure_vars: dict[str, Any]) -> list[str]:
    parts = []
    for line in lines:
        if ".explain(" in line.code:
            continue  # the same guard's reason part
        name = line.code.split("(", 1)[0]
        guard = closure_vars.get(name)
        if hasattr(guard, "summary"):  # the native guard says what it checks
            parts.append(guard.summary())
            continue
        count = guard.num_tensors() if hasattr(guard, "num_tensors") else "?"
        parts.append(f"tensor metadata of {count} tensors in one native TensorContainerGuard "
                     "(type, dispatch keys, dtype, device, shape, stride, requires_grad, identity)")
    return parts


def _summarise(obj: str, lines: list[GuardLine], scalars: dict[str, str],
               closure_vars: dict[str, Any] | None = None) -> list[str]:
    by_category = collections.defaultdict(list)
    for line in lines:
        by_category[line.category].append(line)
    parts = []
    accelerated = _describe_accelerated(by_category.get("accelerated container", []), closure_vars or {})
    parts.extend(accelerated)
    if by_category.get("identity"):
        parts.append(f"identity of {_plural(len(by_category['identity']), 'object')}")
    if by_category.get("type"):
        parts.append(f"type of {_plural(len(by_category['type']), 'object')}")
    if by_category.get("contents"):
        parts.append(f"contents ({_plural(len(by_category['contents']), 'key/length check')})")
    tensors = _describe_tensors(by_category.get("tensor", []))
    if tensors:
        parts.append(tensors)
    if by_category.get("tensor bookkeeping"):
        bookkeeping = by_category["tensor bookkeeping"]
        markers = sum(1 for line in bookkeeping if line.kind == "DIMENSION_DYNAMIC_MARKING_GUARD")
        aliasing_checks = sum(1 for line in bookkeeping if line.kind == "NO_TENSOR_ALIASING")
        native = closure_vars.get(ACCELERATED_ALIASING_PREFIX) if closure_vars else None
        texts = []
        if markers:
            texts.append(_plural(markers, "dynamic-dim marker check"))
        if aliasing_checks:
            texts.append(_plural(aliasing_checks, "no-aliasing check"))
        if native is not None and obj == NO_ALIASING_GROUP:
            texts.append(f"one native no-aliasing check over {native.num_tensors()} tensors")
        if texts:
            parts.append(", ".join(texts))
    aliasing = by_category.get("aliasing", [])
    if aliasing:
        parts.append(f"{_plural(len(aliasing), 'same-object check')} (e.g. {_unlocal(aliasing[0].code)})")
    if by_category.get("not None"):
        parts.append(f"presence of {_plural(len(by_category['not None']), 'value')} (not None)")
    for line in by_category.get("value", [])[:3]:
        parts.append(f"value: {_unlocal(line.code)}")
    if len(by_category.get("value", [])) > 3:
        parts.append(f"... {len(by_category['value']) - 3} more value checks")
    for line in by_category.get("relation", [])[:3]:
        parts.append(f"relation: {_unlocal(line.code)}")
    if by_category.get("global state"):
        parts.append("grad mode, autocast, default device, torch function modes")
    if by_category.get("other"):
        kinds = collections.Counter(line.kind for line in by_category["other"])
        parts.append(", ".join(_kind_text(k, n) for k, n in kinds.most_common()))
    features = sorted({m.group(1) for line in lines if (m := _FEATURE_SPEC.search(line.comment))})
    if accelerated:
        features.append("accelerated container guard")
    features += [f"scalar place: {how}" for name, how in sorted(scalars.items()) if user_object(name) == obj][:1]
    header = f"{obj}: {_plural(len(lines), 'guard')}"
    if features:
        header += f"  [{', '.join(features)}]"
    return [header] + [f"    {part}" for part in parts]


def _cache_entries(fn_or_module: Any) -> tuple[str, list[Any]]:
    from .eval_frame import _debug_get_cache_entry_list

    def code_of(obj: Any) -> types.CodeType | None:
        if isinstance(obj, types.CodeType):
            return obj
        if hasattr(obj, "forward") and not isinstance(obj, types.FunctionType):
            obj = obj.forward
        return getattr(getattr(obj, "__func__", obj), "__code__", None)

    target = fn_or_module
    target = getattr(target, "_orig_mod", target)  # OptimizedModule
    target = getattr(target, "_torchdynamo_orig_callable", target)  # torch.compile(fn)
    code = code_of(target)
    if code is None:
        raise TypeError(f"explain_guards: cannot find the code object of {fn_or_module!r}")
    # torch.compile wraps some callables (exec'd code, builtins) in a frame of its
    # own; name the user's function, but read the wrapper's cache.
    shown = code_of(getattr(target, "__wrapped__", target)) or code
    name = f"{shown.co_name} ({shown.co_filename.rsplit('/', 1)[-1]}:{shown.co_firstlineno})"
    return name, list(reversed(_debug_get_cache_entry_list(code)))


def explain_entry(guard_manager: Any, *, full: bool = False) -> list[str]:
    lines = guard_lines(guard_manager)
    groups: dict[str, list[GuardLine]] = collections.defaultdict(list)
    for line in lines:
        groups[_object_of_line(line)].append(line)
    scalars = _scalar_places()
    counts = collections.Counter(line.category for line in lines)
    out = [
        f"{_plural(len(lines), 'guard')} on {_plural(len(groups), 'object')}: "
        + ", ".join(f"{category} {n}" for category, n in counts.most_common())
    ]
    closure_vars = getattr(guard_manager, "closure_vars", None) or {}
    for obj, group in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        out.extend("  " + text for text in _summarise(obj, group, scalars, closure_vars))
        if full:
            out.extend(f"      | {line.kind}: {line.code}" for line in group)
    return out


def explain_guards(fn_or_module: Any, *, full: bool = False, file: Any = None) -> str:
    """Print (to `file`, default stdout) and return a summary of the guards of every
    cache entry of a compiled function or module, grouped by the user's objects.
    ``full=True`` also lists the raw guard lines under each object."""
    name, entries = _cache_entries(fn_or_module)
    out = [f"Guards of {name}: {_plural(len(entries), 'cache entry')}"]
    for index, entry in enumerate(entries):
        out.append(f"cache entry {index}:")
        out.extend("  " + line for line in explain_entry(entry.guard_manager, full=full))
    text = "\n".join(out)
    print(text, file=file if file is not None else sys.stdout)
    return text


_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[[^\]]*\])*")
_STEP = re.compile(r"\.([A-Za-z_]\w*)|\[(-?\d+|'[^'\\]*'|\"[^\"\\]*\")\]")
_UNAVAILABLE = "<unavailable>"
_MISSING = object()
# Values shown with repr(): builtin types whose repr runs no Python code.
_SAFE_REPR_TYPES = (type(None), bool, int, float, complex, str, bytes)


def _type_name(value: Any) -> str:
    # type.__dict__ descriptors: no metaclass attribute lookup runs.
    return type.__dict__["__name__"].__get__(type(value))


# The helpers below test types with type() and issubclass(type(x), ...): isinstance()
# may look up x.__class__, which runs a user __getattribute__.


def _static_attr(obj: Any, name: str) -> Any:
    """obj.<name> when getting it runs no Python code: an instance __dict__ entry, a
    plain class attribute, a __slots__ member or an nn.Module's parameter, buffer or
    submodule. _MISSING otherwise (properties, __getattr__, other descriptors)."""
    import inspect

    import torch

    try:
        found = inspect.getattr_static(obj, name)
    except AttributeError:
        found = _MISSING
    instance_dict = inspect.getattr_static(obj, "__dict__", None)
    if type(instance_dict) is types.GetSetDescriptorType:
        instance_dict = instance_dict.__get__(obj)  # the builtin __dict__ getter
    if type(instance_dict) is not dict:
        instance_dict = {}
    if found is not _MISSING:
        if found is dict.get(instance_dict, name, _MISSING):
            return found
        if type(found) is types.MemberDescriptorType:
            return found.__get__(obj)
        if name == "__dict__" and type(found) is types.GetSetDescriptorType:
            return instance_dict
        has_get = inspect.getattr_static(type(found), "__get__", _MISSING) is not _MISSING
        return _MISSING if has_get else found
    if (
        issubclass(type(obj), torch.nn.Module)
        and inspect.getattr_static(type(obj), "__getattr__") is torch.nn.Module.__getattr__
    ):
        for table in ("_parameters", "_buffers", "_modules"):
            entries = dict.get(instance_dict, table)
            if type(entries) is dict and name in entries:
                return dict.__getitem__(entries, name)
    return _MISSING


def _resolve(expression: str, scope: dict[str, Any]) -> Any:
    """The value of a source expression (name, .attr, [int], ['key']) read without
    running user code: attributes as _static_attr, items of lists, tuples and dicts
    only (a str/int key compares, by __eq__, only with keys of the same hash).
    _MISSING when it cannot be read so."""
    match = re.match(r"[A-Za-z_]\w*", expression)
    if match is None or match.group(0) not in scope:
        return _MISSING
    value, pos = scope[match.group(0)], match.end()
    while pos < len(expression):
        step = _STEP.match(expression, pos)
        if step is None:
            return _MISSING
        attr, key = step.groups()
        if attr is not None:
            value = _static_attr(value, attr)
        else:
            key = int(key) if key[0] not in "'\"" else key[1:-1]
            if issubclass(type(value), dict):
                value = dict.get(value, key, _MISSING)
            elif type(value) in (list, tuple) and isinstance(key, int) and -len(value) <= key < len(value):
                value = value[key]
            else:
                value = _MISSING
        if value is _MISSING:
            return _MISSING
        pos = step.end()
    return value


def _safe_repr(value: Any, depth: int = 0) -> str:
    """repr() where it runs no user code (or torch's tensor printing); else the type."""
    import torch

    if type(value) in (torch.dtype, torch.device):
        return repr(value)
    if type(value) in _SAFE_REPR_TYPES:
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    if type(value) in (list, tuple) and depth == 0 and len(value) <= 8:
        items = ", ".join(_safe_repr(v, 1) for v in value)
        return f"[{items}]" if type(value) is list else f"({items}{',' if len(value) == 1 else ''})"
    if issubclass(type(value), type):
        return f"<class '{type.__dict__['__name__'].__get__(value)}'>"
    length = _builtin_len(value)
    size = f" of length {length}" if length is not None else ""
    return f"<{_type_name(value)}{size}>"


def _builtin_len(value: Any) -> int | None:
    """len(value) for builtin containers (and subclasses not overriding __len__)."""
    import inspect

    for base in (dict, list, tuple, set, frozenset, str, bytes):
        if issubclass(type(value), base) and inspect.getattr_static(type(value), "__len__") is base.__dict__["__len__"]:
            return base.__len__(value)
    return None


def _now(kind: str, src: str, scope: dict[str, Any]) -> str:
    """The current value of `src` as shown in an explanation: its repr, length or
    type name, computed without running user code ("<unavailable>" otherwise)."""
    value = _resolve(src, scope)
    if value is _MISSING:
        return _UNAVAILABLE
    if kind == "len":
        length = _builtin_len(value)
        return _UNAVAILABLE if length is None else str(length)
    if kind == "type":
        return _type_name(value)
    return _safe_repr(value)


def describe_guard_failure(reason: str, scope: dict[str, Any]) -> str | None:
    """One line naming the object, the field and old -> new value of a failed guard,
    or None when the reason cannot be attributed. `reason` is a recompile reason as
    Dynamo formats it (sources shown without L[...]); `scope` holds the frame's
    globals and locals by name. No user code runs: current values are read and
    shown only where that takes no user-defined __repr__, __len__, __getattr__,
    property or __getitem__ (see _resolve and _safe_repr)."""
    reason = reason.split(": ", 1)[1] if re.match(r"\d+/\d+: ", reason) else reason
    if reason.startswith("Cache line invalidated"):
        return None  # an object the entry referenced died: no guard failed, the reason says it all
    tensor = _TENSOR_FAILURE.search(reason)
    if tensor:
        src = tensor["src"]
        field = tensor["field"] + (f"[{tensor['index']}]" if tensor["index"] else "")
        return f"object {user_object(src)}, tensor {src}: {field} changed {tensor['old']} -> {tensor['new']}"
    code = reason.split("\n", 1)[0].split("  #", 1)[0].strip()
    native = re.fullmatch(r"(?P<src>[A-Za-z_][\w.\[\]']*): (?P<what>.+ changed .+)", code)
    if native:  # a TensorContainerGuard's own explanation
        return f"object {user_object(native['src'])}, tensor {native['src']}: {native['what']}"
    code = re.sub(r", type=<class '[^']*'>$", "", code)  # TYPE_MATCH / ID_MATCH suffix
    checks = (
        (r"len\((?P<src>.+)\) == (?P<old>\d+)", "length of {src} changed {old} -> {now}", "len"),
        (r"len\((?P<src>.+)\) != (?P<old>\d+)", "length of {src} changed {old} -> {now}", "len"),  # a dict's
        (r"not (?P<src>[A-Za-z_][\w.\[\]']*)", "length of {src} changed 0 -> {now}", "len"),
        (r"___check_type_id\((?P<src>.+), \d+\)", "type of {src} changed -> {now}", "type"),
        (r"___check_obj_id\((?P<src>.+), \d+\)", "{src} is a different object now", None),
        (r"(?P<src>.+) is not None", "{src} became None", None),
        (r"(?P<src>[A-Za-z_][\w.\[\]']*) == (?P<old>.+)", "value of {src} changed {old} -> {now}", "repr"),
    )
    for pattern, template, now_kind in checks:
        match = re.fullmatch(pattern, code)
        if match:
            fields = match.groupdict()
            now = _now(now_kind, fields["src"], scope) if now_kind else ""
            return f"object {user_object(fields['src'])}: " + template.format(now=now, **fields)
    # The first path in the code that names something of the frame (not a builtin
    # such as str or len).
    found = next((m.group(0) for m in _PATH.finditer(code) if re.match(r"\w+", m.group(0)).group(0) in scope), None)
    if found is None:
        return None
    value = _resolve(found, scope)
    shown = _UNAVAILABLE if value is _MISSING else _safe_repr(value)
    return f"object {user_object(found)}: {code} no longer holds ({found} = {shown})"


def annotate_recompile_reasons(reasons: Iterable[str], scope: dict[str, Any]) -> Iterator[str]:
    """Each reason, followed by its one-line explanation when there is one."""
    from . import config

    for reason in reasons:
        explanation = describe_guard_failure(reason, scope) if config.explain_recompile_reasons else None
        yield f"{reason}\n  => {explanation}" if explanation else reason


def main(argv: list[str] | None = None) -> int:
    import argparse
    import runpy

    parser = argparse.ArgumentParser(prog="python -m torch._dynamo.guard_explainer",
                                     description=(__doc__ or "").replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("script", help="the Python script to run (further arguments are passed to it)")
    parser.add_argument("--full", action="store_true", help="also print every raw guard line")
    args, rest = parser.parse_known_args(argv)
    sys.argv = [args.script, *rest]
    import gc

    from .eval_frame import _debug_get_cache_entry_list

    runpy.run_path(args.script, run_name="__main__")
    codes = {}
    for obj in gc.get_objects():
        if type(obj) is types.FunctionType and _debug_get_cache_entry_list(obj.__code__):
            codes.setdefault(obj.__code__, obj)
    if not codes:
        print(f"{args.script} compiled nothing with torch.compile")
    for code in sorted(codes, key=lambda c: (c.co_filename, c.co_firstlineno)):
        explain_guards(code, full=args.full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
