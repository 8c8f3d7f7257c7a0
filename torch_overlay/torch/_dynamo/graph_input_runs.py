"""Load a run of graph inputs that index one list with one slice.

The bytecode before a graph loads every graph input on its own. For an optimizer over N
parameters that is `params[i]`, `params[i].grad` and `state_values[i]['momentum_buffer']`
for each i: three to five instructions per input, EXTENDED_ARGs once the indices pass 255,
and a temporary per parameter (stored, reloaded, deleted after the call).

Consecutive graph inputs `f(seq[a]) ... f(seq[b - 1])`, where `seq` is a list or tuple whose
type and length the guards pin and `f` is the same chain of attribute and constant-key
accesses, are instead gathered in C: `map(getter, seq[a:b])` extends the argument list, and
the graph is called with CALL_FUNCTION_EX. The elements are read in the same order, with the
same `getattr` and `obj[key]` calls, as the per-input loads.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TYPE_CHECKING

from . import config
from .bytecode_transformation import create_call_function, create_instruction
from .source import (
    AttrSource,
    ConstDictKeySource,
    DictGetItemSource,
    DictValuesListSource,
    GetItemSource,
    GradSource,
    NNModuleSource,
)

if TYPE_CHECKING:
    from torch._guards import Source

    from .codegen import PyCodegen
    from .variables.builder import GraphArg


# Below this many inputs the map and slice objects cost more than the loads they replace.
MIN_RUN_LENGTH = 8

# Guards that pin a sequence's exact type and its length: SEQUENCE_LENGTH runs TYPE_MATCH
# for anything but a dict. With them, seq[a:b] holds exactly the elements seq[a] ... seq[b - 1].
_LENGTH_GUARDS = ("SEQUENCE_LENGTH",)


# The reconstructions that are `getattr(base, member)` (a dotted member is a chain, as for
# operator.attrgetter).
_ATTR_LOADS = (AttrSource.reconstruct, GradSource.reconstruct)


@dataclasses.dataclass(frozen=True)
class GraphInputRun:
    """Graph inputs `steps(base[start]) ... steps(base[stop - 1])`; each step is
    ("attr", name) or ("item", constant key), applied in order."""

    base: Source
    start: int
    stop: int
    steps: tuple[tuple[str, Any], ...]


def _element(codegen: PyCodegen, source: Source) -> tuple[Source, int, tuple[tuple[str, Any], ...]] | None:
    """Split `source` into (sequence, index, steps after the index), or None."""
    steps: list[tuple[str, Any]] = []
    while True:
        if isinstance(source, NNModuleSource) and type(source).reconstruct is NNModuleSource.reconstruct:
            # Marks its base as a module for guards; loads as the base itself.
            source = source.base
            continue
        if isinstance(source, (AttrSource, GradSource)) and type(source).reconstruct in _ATTR_LOADS:
            # An attribute load (nn.Module parameter sources are AttrSource subclasses
            # that load the same way), which attrgetter repeats.
            steps.append(("attr", source.member))
            source = source.base
            continue
        if type(source) is DictGetItemSource:
            index = source.index
            if isinstance(index, ConstDictKeySource):
                # `d[list(d.keys())[i]]` loaded as `dict_values_list(d)[i]` (see
                # PyCodegen.cached_dict_values): element i of the values list.
                if index.base != source.base or DictValuesListSource(source.base) not in codegen.tempvars:
                    return None
                return DictValuesListSource(source.base), index.index, tuple(reversed(steps))
            if isinstance(index, str):
                # A constant str key: `obj[key]`, as DictGetItemSource.reconstruct loads it.
                steps.append(("item", index))
                source = source.base
                continue
            return None
        if type(source) is GetItemSource and not source.index_is_slice and type(source.index) is int:
            if source.index < 0:
                return None  # seq[-2], seq[-1] is not the slice seq[-2:0]
            return source.base, source.index, tuple(reversed(steps))
        return None


def _length_pinned(codegen: PyCodegen, sequence: Source) -> bool:
    if isinstance(sequence, DictValuesListSource):
        return True  # a new list of the dict's values, whose length the dict's guards pin
    try:
        value = codegen.tx.output.resolve_source_value(sequence)
    except Exception:
        return False
    if type(value) not in (list, tuple):
        return False
    return any(
        guard.originating_source == sequence and guard.create_fn_name() in _LENGTH_GUARDS
        for guard in codegen.tx.output.guards
    )


def split_graph_inputs(codegen: PyCodegen, graphargs: list[GraphArg]) -> list[GraphArg | GraphInputRun] | None:
    """The graph inputs in order, runs of MIN_RUN_LENGTH or more folded into a
    GraphInputRun; None when there is no run (load each input as before)."""
    elements = [
        None if arg.pass_arg_as_tensor or arg.source is None else _element(codegen, arg.source)
        for arg in graphargs
    ]
    pinned: dict[Source, bool] = {}
    out: list[GraphArg | GraphInputRun] = []
    i = 0
    while i < len(graphargs):
        first = elements[i]
        j = i + 1
        if first is not None:
            base, start, steps = first
            while j < len(graphargs) and elements[j] == (base, start + j - i, steps):
                j += 1
        if j - i >= MIN_RUN_LENGTH:
            if base not in pinned:
                pinned[base] = _length_pinned(codegen, base)
            if pinned[base]:
                out.append(GraphInputRun(base, start, start + j - i, steps))
                i = j
                continue
        out.extend(graphargs[i:j])
        i = j
    if not any(isinstance(item, GraphInputRun) for item in out):
        return None
    return out


def load_run(codegen: PyCodegen, run: GraphInputRun, arg_varnames: list[str]) -> None:
    """Extend the list of graph inputs below the top of the stack with the run's."""
    _load_run(codegen, run)
    codegen.append_output(create_instruction("LIST_EXTEND", arg=1))
    names = [codegen.tx.new_pycode_varname("arg") for _ in range(run.start, run.stop)]
    arg_varnames.extend(names)
    if config.generate_pycode:
        codegen.pycodes.append(f"{', '.join(names)} = {run_pycode(codegen, run)}")


def _load_run(codegen: PyCodegen, run: GraphInputRun) -> None:
    # map(getter_k, ... map(getter_1, base[start:stop])): the outermost map first.
    for kind, key in reversed(run.steps):
        codegen.add_push_null(lambda: codegen.load_import_from("builtins", "map"))
        getter = "attrgetter" if kind == "attr" else "itemgetter"
        codegen.add_push_null(lambda getter=getter: codegen.load_import_from("operator", getter))
        codegen.append_output(codegen.create_load_const(key))
        codegen.extend_output(create_call_function(1, False))
    codegen(run.base)
    codegen.append_output(codegen.create_load_const(run.start))
    codegen.append_output(codegen.create_load_const(run.stop))
    codegen.append_output(create_instruction("BUILD_SLICE", arg=2))
    codegen.append_output(codegen.create_binary_subscr())
    for _ in run.steps:
        codegen.extend_output(create_call_function(2, False))


def run_pycode(codegen: PyCodegen, run: GraphInputRun) -> str:
    """The run as Python, for the generated-code listing."""
    try:
        base = run.base.reconstruct_pycode(codegen)
    except NotImplementedError:
        base = run.base.name
    text = f"{base}[{run.start}:{run.stop}]"
    for kind, key in run.steps:
        getter = f"operator.attrgetter({key!r})" if kind == "attr" else f"operator.itemgetter({key!r})"
        text = f"map({getter}, {text})"
    return text
