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
    "DICT_CONTAINS": "contents",
    "DICT_KEYS_MATCH": "contents",
    "DICT_VERSION": "contents",
    "LENGTH_CHECK": "contents",
    "SEQUENCE_LENGTH": "contents",
    "TUPLE_ITERATOR_LEN": "contents",
    "GLOBAL_STATE": "global state",
    "TORCH_FUNCTION_MODE_STACK": "global state",
    "DEFAULT_DEVICE": "global state",
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


def _mutated_module_scalars() -> set[str]:
    try:
        from .pgo import get_code_state

        return {n for state in get_code_state().values() for n in getattr(state, "mutated_module_scalars", ())}
    except Exception:
        return set()


def _unlocal(text: str) -> str:
    """L['self'].step -> self.step, for display."""
    return _LOCAL.sub(lambda m: m.group(1), text)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _describe_tensors(lines: list[GuardLine]) -> str:
    checks = [m for m in (_TENSOR_CHECK.search(line.code) for line in lines) if m]
    if not checks:
        return ""
    kinds = collections.Counter(m["type"] for m in checks)
    dtypes = collections.Counter(m["dtype"].removeprefix("torch.") for m in checks)
    dynamic = sum(m["size"].split(", ").count("None") for m in checks)
    grads = sum(1 for m in checks if m["src"].endswith(".grad"))
    what = ", ".join(f"{n} {k}" for k, n in kinds.most_common())
    text = f"tensor metadata of {what} ({', '.join(f'{d}x{n}' for d, n in dtypes.most_common())}"
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


def _summarise(obj: str, lines: list[GuardLine], scalars: set[str],
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
        parts.append(", ".join(f"{n} {k}" for k, n in kinds.most_common()))
    features = sorted({m.group(1) for line in lines if (m := _FEATURE_SPEC.search(line.comment))})
    if accelerated:
        features.append("accelerated container guard")
    features += [
        "module scalar traced as SymInt (no value guard)"
        for name in sorted(scalars)
        if user_object(name) == obj and not by_category.get("value")
    ][:1]
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
    scalars = _mutated_module_scalars()
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


def _evaluate(expression: str, scope: dict[str, Any]) -> Any:
    try:
        value = eval(expression, {}, scope)  # noqa: S307 - Dynamo's own source expressions
    except Exception:
        return "<unavailable>"
    if isinstance(value, str) and len(value) > 80:
        return value[:77] + "..."
    return value


def describe_guard_failure(reason: str, scope: dict[str, Any]) -> str | None:
    """One line naming the object, the field and old -> new value of a failed guard,
    or None when the reason cannot be attributed. `reason` is a recompile reason as
    Dynamo formats it (sources shown without L[...]); `scope` holds the frame's
    globals and locals by name."""
    reason = reason.split(": ", 1)[1] if re.match(r"\d+/\d+: ", reason) else reason
    tensor = _TENSOR_FAILURE.search(reason)
    if tensor:
        src = tensor["src"]
        field = tensor["field"] + (f"[{tensor['index']}]" if tensor["index"] else "")
        return f"object {user_object(src)}, tensor {src}: {field} changed {tensor['old']} -> {tensor['new']}"
    code = reason.split("\n", 1)[0].split("  #", 1)[0].strip()
    native = re.fullmatch(r"(?P<src>[A-Za-z_][\w.\[\]']*): (?P<what>.+ changed .+)", code)
    if native:  # a TensorContainerGuard's own explanation
        return f"object {user_object(native['src'])}, tensor {native['src']}: {native['what']}"
    checks = (
        (r"len\((?P<src>.+)\) == (?P<old>\d+)", "length of {src} changed {old} -> {now}", "len({src})"),
        (r"___check_type_id\((?P<src>.+), \d+\)", "type of {src} changed -> {now}", "type({src}).__name__"),
        (r"___check_obj_id\((?P<src>.+), \d+\)", "{src} is a different object now", "None"),
        (r"(?P<src>.+) is not None", "{src} became None", "None"),
        (r"(?P<src>[A-Za-z_][\w.\[\]']*) == (?P<old>.+)", "value of {src} changed {old} -> {now}", "repr({src})"),
    )
    for pattern, template, now_expr in checks:
        match = re.fullmatch(pattern, code)
        if match:
            fields = match.groupdict()
            now = _evaluate(now_expr.format(**fields), scope)
            return f"object {user_object(fields['src'])}: " + template.format(now=now, **fields)
    found = next((m.group(0) for m in _PATH.finditer(code) if not m.group(0).startswith("___")
                  and m.group(0) not in ("len", "not", "and", "or", "is", "None", "type", "isinstance")), None)
    if found is None:
        return None
    return f"object {user_object(found)}: {code} no longer holds ({found} = {_evaluate(f'repr({found})', scope)})"


def annotate_recompile_reasons(reasons: Iterable[str], scope: dict[str, Any]) -> Iterator[str]:
    """Each reason, followed by its one-line explanation when there is one."""
    from . import config

    for reason in reasons:
        explanation = describe_guard_failure(reason, scope) if config.explain_recompile_reasons else None
        yield f"{reason}\n  => {explanation}" if explanation else reason


def main(argv: list[str] | None = None) -> int:
    import argparse
    import runpy

    parser = argparse.ArgumentParser(prog="python -m torch._dynamo.guard_explainer", description=__doc__)
    parser.add_argument("script")
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
