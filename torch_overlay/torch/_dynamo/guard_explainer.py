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
    "LAMBDA_GUARD": ("Python check", "Python checks"),
}
GLOBAL_STATE_GROUP = "<global state>"
NO_ALIASING_GROUP = "<no-aliasing check>"
GLOBALS_GROUP = "<globals and imports>"
# Python lambda guards at the root: symbolic shape relations and `a is b` checks
# between inputs (each of their code parts is one check).
RELATIONS_GROUP = "<relations between inputs>"
# A frame label of init_values_once (see variables/init_once.py, _label_guards).
_INIT_ONCE_LABEL = re.compile(r"(init_values_once\[.*\]) of ")

_LOCAL = re.compile(r"L\['([^']+)'\]")


@dataclasses.dataclass
class GuardLeaf:
    """One check of the guard tree, as read from it."""

    source: str  # source of the node the leaf guard is on; "" at the root
    kind: str  # leaf guard class, e.g. TYPE_MATCH (LAMBDA_GUARD for a Python or native callable)
    category: str  # what it checks, in words (KIND_CATEGORY and the node it is on)
    code: str = ""  # its first verbose code part, without the user stack, for display only
    value_type: type | None = None  # type of the node's value
    grad: bool = False  # the node is a tensor's .grad (reached by GradGuardAccessor)
    native: Any = None  # the native guard object behind a LAMBDA_GUARD, if any


def _code(part: str) -> str:
    """A verbose code part shown without its `  # user stack` suffix (display only)."""
    return part.split("  # ", 1)[0].strip()


def _native_guards(closure_vars: dict[str, Any]) -> dict[int, Any]:
    """Native guard objects by the identity of their verbose_code_parts list: a guard
    that owns its code parts (as a LeafGuard does) is installed with that same
    list, which its LAMBDA_GUARD leaf returns."""
    found = {}
    for value in closure_vars.values():
        parts = getattr(value, "verbose_code_parts", None)
        if callable(parts) and not isinstance(value, type):
            try:
                found[id(parts())] = value
            except TypeError:
                continue  # a verbose_code_parts of something else, taking arguments
    return found


def _leaf_category(kind: str, native: Any, key_node: bool) -> str:
    if native is not None:
        # Native guards that describe themselves replace per-tensor guards; the
        # others (no-aliasing group and its slots) are tensor bookkeeping.
        return "accelerated container" if hasattr(native, "summary") else "tensor bookkeeping"
    if key_node and kind == "EQUALS_MATCH":
        return "contents"  # a dict key, under its DictGuardManager
    return KIND_CATEGORY.get(kind, "other")


def guard_leaves(guard_manager: Any) -> list[GuardLeaf]:
    """Every check of one cache entry's guard tree (GuardManagerWrapper): each leaf
    guard of each node, relational guards once, the root's Python relation lambdas
    one per code part."""
    from torch._C._dynamo.guards import DictGuardManager

    natives = _native_guards(getattr(guard_manager, "closure_vars", None) or {})
    out: list[GuardLeaf] = []
    seen: set[int] = set()  # verbose_code_parts lists: a relational guard is on every node it relates

    def add_leaves(manager: Any, source: str, grad: bool, key_node: bool) -> None:
        value_type = manager.get_type_of_guarded_value()
        for leaf in manager.get_leaf_guards():
            parts = leaf.verbose_code_parts()
            if id(parts) in seen:
                continue
            seen.add(id(parts))
            kind = type(leaf).__name__
            native = natives.get(id(parts)) if kind == "LAMBDA_GUARD" else None
            category = _leaf_category(kind, native, key_node)
            code = _code(parts[0]) if parts else ""
            out.append(GuardLeaf(source, kind, category, code, value_type, grad, native))

    def walk(manager: Any, grad: bool = False, key_node: bool = False) -> None:
        add_leaves(manager, manager.get_source(), grad, key_node)
        if isinstance(manager, DictGuardManager):
            for _, (key_mgr, value_mgr) in sorted(manager.get_key_value_managers().items()):
                if key_mgr is not None:
                    walk(key_mgr, key_node=True)
                if value_mgr is not None:
                    walk(value_mgr)
        for accessor, child in zip(manager.get_accessors(), manager.get_child_managers()):
            walk(child, grad=type(accessor).__name__ == "GradGuardAccessor")

    root = guard_manager.root
    for accessor, child in zip(root.get_accessors(), root.get_child_managers()):
        walk(child, grad=type(accessor).__name__ == "GradGuardAccessor")
    aliasing = getattr(guard_manager, "aliasing_sources", {})
    epilogue = root.get_epilogue_lambda_guards()
    for leaf in [*root.get_leaf_guards(), *epilogue]:
        parts = leaf.verbose_code_parts()
        kind = type(leaf).__name__
        native = natives.get(id(parts)) if kind == "LAMBDA_GUARD" else None
        if kind == "LAMBDA_GUARD" and native is None:
            if leaf in epilogue:
                # add_python_lambda_leaf_guard_to_root: one Python function checking
                # relations between inputs, one per part: `a is b` (DUPLICATE_INPUT,
                # under a's object) and symbolic shape relations.
                for part in parts:
                    if part in aliasing:
                        out.append(GuardLeaf(aliasing[part][0], kind, "aliasing", _code(part)))
                    else:
                        out.append(GuardLeaf("", kind, "relation", _code(part)))
            else:
                # Run before any input is read: functorch, saved-tensor hooks.
                out.append(GuardLeaf("", kind, "global state", _code(parts[0]) if parts else ""))
            continue
        out.append(GuardLeaf("", kind, _leaf_category(kind, native, False), _code(parts[0]) if parts else "",
                             native=native))
    return out


def _strip_type_wrappers(path: str) -> str:
    """type(self).__mro__[1].f -> self, dict(type(self).__dict__) -> self: a guard on
    an object's class (its __dict__, __mro__, ...) belongs to the object."""
    while (match := re.match(r"(type|dict)\(", path)) is not None:
        depth = 0
        for end in range(match.end() - 1, len(path)):
            if path[end] == "(":
                depth += 1
            elif path[end] == ")":
                depth -= 1
                if depth == 0:
                    break
        else:
            return path
        inner = path[match.end() : end]
        if match.group(1) == "dict":
            if not inner.endswith(".__dict__"):
                return path
            inner = inner[: -len(".__dict__")]
        path = inner
    return path


def user_object(source: str) -> str:
    """The user-level object a guard source belongs to: L['self'].__dict__['_modules']
    ['layer']._parameters['weight'] -> self.layer; L['xs'][3] -> xs."""
    source = _strip_type_wrappers(source)
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


def _object_of(leaf: GuardLeaf) -> str:
    if leaf.source:
        return user_object(leaf.source)
    if leaf.native is not None and not hasattr(leaf.native, "summary"):
        return NO_ALIASING_GROUP
    if leaf.category == "global state":
        return GLOBAL_STATE_GROUP
    return RELATIONS_GROUP


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


def _describe_tensors(leaves: list[GuardLeaf], facts: dict[str, tuple[Any, int]]) -> str:
    """TENSOR_MATCH leaves: their nodes' value types, and the dtype and dynamic dims
    GuardBuilder.TENSOR_MATCH recorded (GuardManagerWrapper.tensor_match_facts)."""
    if not leaves:
        return ""
    kinds = collections.Counter(leaf.value_type.__name__ if leaf.value_type else "Tensor" for leaf in leaves)
    recorded = [facts[leaf.source] for leaf in leaves if leaf.source in facts]
    dtypes = collections.Counter(str(dtype).removeprefix("torch.") for dtype, _ in recorded)
    dynamic = sum(n for _, n in recorded)
    grads = sum(1 for leaf in leaves if leaf.grad)
    what = ", ".join(_plural(n, k) for k, n in kinds.most_common())
    if len(dtypes) == 1:
        dtype_text = f"dtype {next(iter(dtypes))}" if len(leaves) == 1 else f"all {next(iter(dtypes))}"
    else:
        dtype_text = ", ".join(f"{n} {d}" for d, n in dtypes.most_common()) or "dtype not recorded"
    text = f"tensor metadata of {what} ({dtype_text}"
    text += f"; {grads} of them grads" if grads else ""
    text += "): dtype, device, shape, stride, requires_grad"
    text += f"; {dynamic} dynamic dims" if dynamic else "; all dims static"
    return text


def _summarise(obj: str, leaves: list[GuardLeaf], scalars: dict[str, str],
               facts: dict[str, tuple[Any, int]] | None = None, labels: list[str] | None = None) -> list[str]:
    by_category = collections.defaultdict(list)
    for leaf in leaves:
        by_category[leaf.category].append(leaf)
    parts = []
    accelerated = [leaf.native.summary() for leaf in by_category.get("accelerated container", [])]
    parts.extend(accelerated)
    if by_category.get("identity"):
        parts.append(f"identity of {_plural(len(by_category['identity']), 'object')}")
    if by_category.get("type"):
        parts.append(f"type of {_plural(len(by_category['type']), 'object')}")
    if by_category.get("contents"):
        parts.append(f"contents ({_plural(len(by_category['contents']), 'key/length check')})")
    tensors = _describe_tensors(by_category.get("tensor", []), facts or {})
    if tensors:
        parts.append(tensors)
    bookkeeping = by_category.get("tensor bookkeeping", [])
    if bookkeeping:
        markers = sum(1 for leaf in bookkeeping if leaf.kind == "DIMENSION_DYNAMIC_MARKING_GUARD")
        # NO_TENSOR_ALIASING, or a tensor's slot in the native no-aliasing group
        aliasing_checks = sum(
            1 for leaf in bookkeeping if leaf.kind == "NO_TENSOR_ALIASING" or (leaf.native is not None and leaf.source)
        )
        groups = [leaf.native for leaf in bookkeeping if leaf.native is not None and not leaf.source]
        texts = []
        if markers:
            texts.append(_plural(markers, "dynamic-dim marker check"))
        if aliasing_checks:
            texts.append(_plural(aliasing_checks, "no-aliasing check"))
        texts.extend(f"one native no-aliasing check over {group.num_tensors()} tensors" for group in groups)
        if texts:
            parts.append(", ".join(texts))
    aliasing = by_category.get("aliasing", [])
    if aliasing:
        parts.append(f"{_plural(len(aliasing), 'same-object check')} (e.g. {_unlocal(aliasing[0].code)})")
    if by_category.get("not None"):
        parts.append(f"presence of {_plural(len(by_category['not None']), 'value')} (not None)")
    for leaf in by_category.get("value", [])[:3]:
        parts.append(f"value: {_unlocal(leaf.code)}")
    if len(by_category.get("value", [])) > 3:
        parts.append(f"... {len(by_category['value']) - 3} more value checks")
    for leaf in by_category.get("relation", [])[:3]:
        parts.append(f"relation: {_unlocal(leaf.code)}")
    if len(by_category.get("relation", [])) > 3:
        parts.append(f"... {len(by_category['relation']) - 3} more relations")
    if by_category.get("global state"):
        parts.append("grad mode, autocast, default device, torch function modes")
    if by_category.get("other"):
        kinds = collections.Counter(leaf.kind for leaf in by_category["other"])
        parts.append(", ".join(_kind_text(k, n) for k, n in kinds.most_common()))
    features = list(labels or [])
    if accelerated:
        features.append("accelerated container guard")
    features += [f"scalar place: {how}" for name, how in sorted(scalars.items()) if user_object(name) == obj][:1]
    header = f"{obj}: {_plural(len(leaves), 'guard')}"
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
    leaves = guard_leaves(guard_manager)
    groups: dict[str, list[GuardLeaf]] = collections.defaultdict(list)
    for leaf in leaves:
        groups[_object_of(leaf)].append(leaf)
    scalars = _scalar_places()
    facts = getattr(guard_manager, "tensor_match_facts", {})
    labels: dict[str, set[str]] = collections.defaultdict(set)
    for source, label in getattr(guard_manager, "guard_labels", {}).items():
        match = _INIT_ONCE_LABEL.match(label)
        labels[user_object(source)].add(match.group(1) if match else label)
    counts = collections.Counter(leaf.category for leaf in leaves)
    out = [
        f"{_plural(len(leaves), 'guard')} on {_plural(len(groups), 'object')}: "
        + ", ".join(f"{category} {n}" for category, n in counts.most_common())
    ]
    for obj, group in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        out.extend("  " + text for text in _summarise(obj, group, scalars, facts, sorted(labels.get(obj, ()))))
        if full:
            out.extend(f"      | {leaf.kind}: {leaf.code}" for leaf in group)
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


# Recompile reasons (describe_guard_failure) are text: what Dynamo logs and stores.
_TENSOR_FAILURE = re.compile(
    r"tensor '(?P<src>.+?)' (?P<field>[\w ]+?) mismatch(?: at index (?P<index>\d+))?\. "
    r"expected (?P<old>.+?), actual (?P<new>[^\n]+)"
)
# Reasons of native guards (torch._dynamo._guard_accel): "<element>: <field> changed
# <old> -> <new>" and the like, "<a> and <b> are the same tensor, ...", "<a> is <b>
# failed: ...".
_NATIVE_REASON = re.compile(
    r"(?P<src>\S.*?): (?P<what>(?:[\w ]+|size\[\d+\]|stride\[\d+\]) changed .+|the dict holding it changed .+"
    r"|is None, expected a tensor|is a tensor, expected None|missing from the container|is another object than .+"
    r"|_dynamo_\w+ (?:is not a subset of|was set after) .+)"
)
_SAME_TENSOR = re.compile(r"(?P<a>\S.*?) and (?P<b>\S.*?) are the same tensor, but .+")
_NOT_IDENTICAL = re.compile(r"(?P<a>\S.*?) is (?P<b>\S.*?) failed: the objects are no longer identical")
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
        if expression.startswith("[list(dict.keys(", pos):
            value, pos = _item_by_key_position(value, expression, pos, scope)
            if value is _MISSING:
                return _MISSING
            continue
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


def _item_by_key_position(container: Any, expression: str, pos: int, scope: dict[str, Any]) -> tuple[Any, int]:
    """container[list(dict.keys(d))[i]] (a step from `pos`, Dynamo's source of a dict
    item behind a non-constant key, e.g. an optimizer's state of a parameter), and the
    position after it. The key is found by position and the item by identity: no
    __hash__ or __eq__ of the user's runs. (_MISSING, pos) when it cannot be read so."""
    depth, end = 0, pos
    for end in range(pos, len(expression)):
        depth += {"[": 1, "]": -1}.get(expression[end], 0)
        if depth == 0:
            break
    inner = re.fullmatch(r"list\(dict\.keys\((?P<d>.+)\)\)\[(?P<i>\d+)\]", expression[pos + 1:end])
    if depth != 0 or inner is None or not issubclass(type(container), dict):
        return _MISSING, pos
    keys_of = _resolve(inner["d"], scope)
    index = int(inner["i"])
    if not issubclass(type(keys_of), dict) or index >= dict.__len__(keys_of):
        return _MISSING, pos
    key = list(dict.keys(keys_of))[index]
    found = next((v for k, v in dict.items(container) if k is key), _MISSING)
    return found, end + 1


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
    native = _NATIVE_REASON.fullmatch(code)
    if native:  # a native guard's own reason names the element (or container) and the field
        src, what = native["src"], native["what"]
        if what.startswith(("key at position ", "length changed ", "type changed to ")):
            return f"object {user_object(src)}: {src} {what}"
        return f"object {user_object(src)}, tensor {src}: {what}"
    same = _SAME_TENSOR.fullmatch(code)
    if same:
        return f"object {user_object(same['a'])}: {same['a']} and {same['b']} are the same tensor now"
    identical = _NOT_IDENTICAL.fullmatch(code)
    if identical:
        return f"object {user_object(identical['a'])}: {identical['a']} is no longer {identical['b']}"
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
