"""A differential fuzzer for dynapatch: random stateful programs, run eagerly and compiled.

A program is a seeded sequence of typed operations (``Op``) placed in the sections of a
family's template: state built at setup, operations inside the compiled frame (or inside
a module's ``forward`` it calls) and, per call, mutations made between calls (``Step.pre``).
``Program.render()`` turns it into plain Python source, which is exec'd twice into fresh
namespaces: once with every call made eagerly, once with ``frame`` compiled by
``torch.compile(backend=..., fullgraph=False)``. After every call the harness compares

* the result (values, dtype, shape, stride, requires_grad, aliasing with the state),
* the Python state the program registers in ``TRACK`` (module attributes, parameters,
  buffers, hook-dict sizes, optimizer state dicts, plain dicts/lists, hook call counters,
  handles) and the global module hook registries,
* exceptions: one raised eagerly must be raised compiled, of the same type, and none other,
* for the compiled run, before each call: ``guard_manager.check()`` against
  ``check_verbose()`` for every cache entry of the frame (the fast path of a guard tree,
  e.g. recursive dict tags, must not accept what the full check rejects).

A failing program is shrunk by dropping operations, steps and setup lines while it
still fails the same way (``shrink``), so reports carry a small readable repro.

Families (``FAMILIES``) follow the features in docs/features.md: ``scalars`` (module int and
float attributes mutated in the frame), ``optim`` (torch.optim optimizers), ``init_once``
(``init_values_once`` inputs, guarded inputs mutated between calls and in the frame),
``hooks`` (every hook kind registered and removed around and inside the frame) and
``containers`` (large tensor containers mutated in place between calls). Every op
carries feature tags (``Program.features()``); the CI seeds are chosen to cover them all.

Used by test/dynamo/test_differential_fuzz.py (fixed seeds) and
scripts/fuzz_differential.py (longer runs, shrinking, replay).
"""

from __future__ import annotations

import dataclasses
import functools
import linecache
import math
import random
import re
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._dynamo

__all__ = [
    "ALL_TAGS",
    "FAMILIES",
    "Failure",
    "Op",
    "Program",
    "RunResult",
    "Step",
    "generate",
    "run_program",
    "shrink",
]


# ---------------------------------------------------------------------------
# Programs


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation: dedented source lines and the features it exercises."""

    code: str
    tags: tuple[str, ...] = ()
    keep: bool = False  # never dropped when shrinking (the frame's skeleton)


@dataclasses.dataclass
class Step:
    """One call of the frame: mutations made before it (outside the frame), then
    ``frame(x, n)`` with a fresh seeded ``x`` and the plain int ``n``."""

    pre: list[Op]
    n: int


PRELUDE = '''\
import collections
import copy
import math
import torch


def rnd(seed, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
'''


@dataclasses.dataclass
class Program:
    family: str
    seed: int
    backend: str
    config: dict[str, Any]
    template: str  # lines "<indent>@@name@@" are replaced by sections[name]
    sections: dict[str, list[Op]]
    steps: list[Step]
    x_shape: tuple[int, ...]
    backward: bool = False  # run result[0].sum().backward() after each call
    x_requires_grad: bool = False
    # tags of the program as a whole (backend, config), not of a droppable op
    base_tags: tuple[str, ...] = ()

    def features(self) -> set[str]:
        tags = set(self.base_tags)
        tags.add(f"backend.{self.backend}")
        for ops in self.sections.values():
            for op in ops:
                tags.update(op.tags)
        for step in self.steps:
            for op in step.pre:
                tags.update(op.tags)
        return tags

    @property
    def name(self) -> str:
        return f"{self.family}/{self.seed}"

    def render(self) -> str:
        out = [
            f"# dynapatch differential fuzz program {self.name}: backend={self.backend!r}, "
            f"dynamo config {self.config!r}, x shape {self.x_shape}"
            + (", x requires grad" if self.x_requires_grad else "")
            + (", result[0].sum().backward() after each call" if self.backward else ""),
            PRELUDE,
        ]
        out.extend(self._expand(textwrap.dedent(self.template).strip("\n").splitlines()))
        out.append("")
        calls = []
        for i, step in enumerate(self.steps):
            if step.pre:
                out.append("")
                out.append(f"def pre_{i}():")
                for op in step.pre:
                    out.append(textwrap.indent(textwrap.dedent(op.code).strip("\n"), "    "))
                calls.append(f"(pre_{i}, {step.n})")
            else:
                calls.append(f"(None, {step.n})")
        out.append("# (mutation made before the call, n); x is rnd(10_000 + call index, *x_shape)")
        out.append("CALLS = [" + ", ".join(calls) + "]")
        return "\n".join(out) + "\n"

    def _expand(self, lines: list[str]) -> list[str]:
        """Replace each "@@name@@" line by the ops of that section, at its indentation
        (op code may hold placeholders of its own)."""
        out = []
        for line in lines:
            stripped = line.strip()
            if stripped.startswith("@@") and stripped.endswith("@@"):
                indent = line[: len(line) - len(line.lstrip())]
                body = []
                previous_block = False
                for op in self.sections[stripped[2:-2]]:
                    code = textwrap.dedent(op.code).strip("\n").splitlines()
                    if not indent and (len(code) > 1 or previous_block):
                        body.extend(["", ""])  # top-level blocks, PEP 8 spaced
                    previous_block = len(code) > 1
                    body.extend(indent + l if l.strip() else "" for l in self._expand(code))
                out.extend(body)  # every template keeps a statement beside its placeholders
            else:
                out.append(line)
        return out

    # -- shrinking -----------------------------------------------------------------

    def candidates(self) -> Iterator[tuple[str, Any]]:
        """Every single removal, biggest first."""
        for j in range(len(self.steps) - 1, 0, -1):
            yield ("step", j)
        for name, ops in self.sections.items():
            for i in range(len(ops) - 1, -1, -1):
                if not ops[i].keep:
                    yield ("op", (name, i))
        for j, step in enumerate(self.steps):
            for i in range(len(step.pre) - 1, -1, -1):
                yield ("pre", (j, i))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Program:
        data = dict(data)
        data["sections"] = {
            k: [Op(o["code"], tuple(o["tags"]), o["keep"]) for o in v] for k, v in data["sections"].items()
        }
        data["steps"] = [
            Step([Op(o["code"], tuple(o["tags"]), o["keep"]) for o in s["pre"]], s["n"]) for s in data["steps"]
        ]
        data["x_shape"] = tuple(data["x_shape"])
        data["base_tags"] = tuple(data["base_tags"])
        return cls(**data)

    def without(self, kind: str, where: Any) -> Program:
        sections = {k: list(v) for k, v in self.sections.items()}
        steps = [Step(list(s.pre), s.n) for s in self.steps]
        if kind == "step":
            del steps[where]
        elif kind == "op":
            del sections[where[0]][where[1]]
        else:
            del steps[where[0]].pre[where[1]]
        return dataclasses.replace(self, sections=sections, steps=steps)


# ---------------------------------------------------------------------------
# Generators. Each family returns a Program; ops say what they exercise.

_GEN_SEED_SALT = {"scalars": 11, "optim": 23, "init_once": 37, "hooks": 41, "containers": 53}


def _pick_backend(r: random.Random, backend: str, inductor_ok: bool = False) -> str:
    x = r.random()  # drawn for every backend: a seed's program differs only in the backend
    if backend != "mix":
        return backend
    if inductor_ok and x < 0.02:
        return "inductor"
    return "aot_eager" if x < 0.15 else "eager"


def _ns(r: random.Random, count: int) -> list[int]:
    return [r.choice([0, 1, 2, 3, 5, 7]) for _ in range(count)]


def _steps(r: random.Random, count: int, make_pre: Callable[[int], list[Op]], empty: float = 0.35) -> list[Step]:
    ns = _ns(r, count)
    return [Step([] if i == 0 or r.random() < empty else make_pre(i), ns[i]) for i in range(count)]


# -- scalars: nn.Module int counters and float attributes (scalar-state), float
# places elsewhere that forward stores to and uses (scalar-state) ----

SCALARS_TEMPLATE = '''
torch.manual_seed(0)
@@places@@


class Mod(torch.nn.Module):
    def __init__(self):
        super().__init__()
        @@init@@
        self.seen = []
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, y):
        @@forward@@
        return y


m = Mod()
TRACK = {"m": m}
@@track@@


def frame(x, n):
    y = x
    out = []
    @@frame@@
    return y, out
'''


def _big_int(r: random.Random) -> str:
    return f"2**63 - {r.randint(1, 3)}"


def gen_scalars(r: random.Random, backend: str) -> dict[str, Any]:
    step0 = r.choice(["0", "1", "5", "-3", _big_int(r), _big_int(r), "2**62"])
    temp0 = r.choice(["1.0", "0.5", "2.0", "1e-3", "0.0"])
    init = [
        Op(f"self.step = {step0}", ("scalars.int_attr",) + (("scalars.bigint",) if "63" in step0 else ()), keep=True),
        Op(f"self.temp = {temp0}", ("scalars.float_attr",) + (("scalars.zero",) if temp0 == "0.0" else ()), keep=True),
    ]
    mutate = [
        lambda: Op(f"self.step += {r.choice([1, 2])}", ("scalars.int_counter",)),
        lambda: Op("self.step -= 1", ("scalars.int_counter",)),
        lambda: (
            lambda c: Op(f"self.temp *= {c}", ("scalars.float_mutation",) + (("scalars.zero",) if c == 0.0 else ()))
        )(r.choice([0.9, 0.5, 0.0, 1.5])),
        lambda: Op(
            f"self.temp = self.temp * {r.choice([0.9, 0.5])} + {r.choice([0.05, 0.0, -0.5])}",
            ("scalars.float_mutation",),
        ),
        lambda: Op("self.temp -= 0.25", ("scalars.float_mutation",)),
    ]
    use = [
        lambda: Op("y = y * self.step", ("scalars.int_use",)),
        lambda: Op(f"y = y + self.step % {r.choice([3, 7])}", ("scalars.int_mod",)),
        lambda: Op(f"y = y + self.step // {r.choice([2, 5])}", ("scalars.int_floordiv",)),
        lambda: Op(f"y = y + {r.choice([1, 3])} / self.step", ("scalars.int_div",)),
        lambda: Op("y = y / self.temp", ("scalars.float_div_tensor",)),
        lambda: Op(f"y = y + {r.choice([1.0, 2.0])} / self.temp", ("scalars.float_div_const",)),
        lambda: Op("y = y * self.temp + self.temp", ("scalars.float_use",)),
        lambda: Op("y = y + float(self.temp)", ("scalars.float_use",)),
        lambda: Op("if self.step % 2 == 0:\n    y = y.cos()\nelse:\n    y = y.sin()", ("scalars.branch_int",)),
        lambda: Op(f"if self.temp < {r.choice([0.5, 0.8])}:\n    y = y * 2", ("scalars.branch_float",)),
        lambda: Op("y = y + (self.step > 2**62)", ("scalars.int_compare",)),
        lambda: Op("self.seen.append(self.step)", ("scalars.record",)),
        lambda: Op("y = self.lin(y)", ("scalars.linear",)),
    ]
    forward = []
    for _ in range(r.randint(2, 6)):
        forward.append(r.choice(mutate)() if r.random() < 0.45 else r.choice(use)())
    if not any(op.tags[0] in ("scalars.int_counter", "scalars.float_mutation") for op in forward):
        forward.insert(0, r.choice(mutate)())
    frame = [Op("y = m(y)", ("scalars.call",), keep=True)]
    if r.random() < 0.3:
        frame.append(Op("y = m(y)", ("scalars.call_twice",)))
    if r.random() < 0.3:
        frame.append(Op("y = y * n", ("scalars.int_arg",)))
    if r.random() < 0.4:
        frame.append(Op("out.append(m.step)", ("scalars.read_in_frame",)))
    if r.random() < 0.3:
        frame.append(Op("out.append(m.temp)", ("scalars.read_in_frame",)))

    pres = [
        lambda i: Op("m.temp = 0.0", ("scalars.zero", "scalars.set_between")),
        lambda i: Op(f"m.temp = {r.choice([0.25, 3.0, -1.0])}", ("scalars.set_between",)),
        lambda i: Op(f"m.step = {_big_int(r)}", ("scalars.bigint", "scalars.set_between")),
        lambda i: Op("m.step = 0", ("scalars.set_between",)),
        lambda i: Op("m.step += 1", ("scalars.set_between",)),
    ]
    steps = _steps(r, r.randint(3, 6), lambda i: [r.choice(pres)(i)])
    backend = _pick_backend(r, backend, inductor_ok=True)
    # Drawn after everything above, so a seed without them is the program it was before.
    sections = {"init": init, "forward": forward, "frame": frame, "places": [], "track": []}
    if r.random() < 0.5:
        _add_float_places(random.Random(r.random()), sections, steps)
    return dict(
        backend=backend,
        config={},
        template=SCALARS_TEMPLATE,
        sections=sections,
        steps=steps,
        x_shape=(4,),
    )


# Float places outside nn.Module attributes (scalar-state) that forward stores to and
# also uses: the uses the float64 tensor form cannot trace (float_as_tensor.py) and
# places no store hook sees. (place: definition at module level, its setup in
# Mod.__init__, the store of `{new}`, the expression reading it, a TRACK entry)
_FLOAT_PLACES = {
    "attr": ("class Box:\n    pass", "self.box = Box()\nself.box.v = 1.0", "self.box.v = {new}", "self.box.v", None),
    "dict": (None, 'self.d = {"v": 1.0}', 'self.d["v"] = {new}', 'self.d["v"]', None),
    "list": (None, "self.l = [1.0]", "self.l[0] = {new}", "self.l[0]", None),
    "dict_update_pairs": (None, 'self.u = {"v": 1.0}', 'self.u.update([("v", {new})])', 'self.u["v"]', None),
    "slots": (
        'class Slots:\n    __slots__ = ("v",)\n\n    def __repr__(self):\n        return f"Slots({self.v!r})"',
        "self.sl = Slots()\nself.sl.v = 1.0",
        "self.sl.v = {new}",
        "self.sl.v",
        None,
    ),
    "namedtuple_replace": (
        'Pair = collections.namedtuple("Pair", "v w")',
        "self.nt = Pair(1.0, 2)",
        "self.nt = self.nt._replace(v={new})",
        "self.nt.v",
        None,
    ),
    "global": (
        "GF = 1.0\n\n\nclass GlobalView:\n    __slots__ = ()\n\n"
        "    def __repr__(self):\n        return repr(GF)",
        None,
        "global GF\nGF = {new}",
        "GF",
        'TRACK["GF"] = GlobalView()',
    ),
    "nonlocal": (
        "def make_cell():\n    v = 1.0\n\n    def bump(new):\n        nonlocal v\n        v = new(v)\n"
        "        return v\n\n"
        "    return bump\n\n\nclass CellView:\n    __slots__ = ()\n\n    def __repr__(self):\n"
        "        return repr(m.cell(lambda v: v))",
        "self.cell = make_cell()",
        "self.cell(lambda v: {new_v})",
        "self.cell(lambda v: v)",
        'TRACK["cell"] = CellView()',
    ),
}

# (use of the float expression E, tag): E ends up in y or steers a branch
_FLOAT_PLACE_USES = [
    ("y = y * E", "arith"),
    ("if E is not None:\n    y = y * E", "is_not_none"),
    ("if E:\n    y = y + 1", "truth"),
    ("y = y + E % 0.7", "mod"),
    ("if E % 1.0 < 0.5:\n    y = y * 2", "mod_branch"),
    ("y = y + len(f'{E:.3f}')", "format_spec"),
    ("y = y + math.floor(E * 10)", "floor"),
    ("y = y + math.fmod(E, 0.3)", "fmod"),
    ("y = y * min(E, 0.5)", "min"),
    ("y = y * max(E, 0.5)", "max"),
    ("y = y * round(E, 2)", "round"),
]


def _add_float_places(r: random.Random, sections: dict[str, list[Op]], steps: list[Step]) -> None:
    kinds = r.sample(sorted(_FLOAT_PLACES), r.randint(1, 2))
    for kind in kinds:
        define, setup, store, read, track = _FLOAT_PLACES[kind]
        tag = f"scalars.place_{kind}"
        if define is not None:
            sections["places"].append(Op(define, (tag,), keep=True))
        if setup is not None:
            sections["init"].append(Op(setup, (tag,), keep=True))
        if track is not None:
            sections["track"].append(Op(track, (tag,), keep=True))
        c, b = r.choice([0.9, 0.5, 0.0, 1.5]), r.choice([0.05, 0.0, -0.5, 0.25])
        new = f"{read} * {c} + {b}"
        store_code = store.format(new=new, new_v=f"v * {c} + {b}")
        ops = [Op(store_code, (tag, "scalars.place_store"))]
        for _ in range(r.randint(1, 2)):
            use, use_tag = r.choice(_FLOAT_PLACE_USES)
            ops.append(Op(use.replace("E", read), (tag, f"scalars.place_use_{use_tag}")))
        if kind == "global":
            ops[0] = Op(store_code.split("\n", 1)[1], ops[0].tags)
            sections["forward"].insert(0, Op("global GF", (tag,), keep=True))
        sections["forward"].extend(ops)
        if kind in ("attr", "dict", "list") and r.random() < 0.5:
            # changed from outside between some calls too
            outside = {"attr": "m.box.v", "dict": 'm.d["v"]', "list": "m.l[0]"}[kind]
            for step in steps[1:]:
                if r.random() < 0.3:
                    step.pre.append(Op(f"{outside} = {r.choice([0.25, 3.0, -1.0])}", (tag, "scalars.set_between")))


# -- optim: torch.optim optimizers ---------------------------------------------------

OPTIM_TEMPLATE = '''
torch.manual_seed(0)
@@params@@
@@opt@@
SAVE = {}


def all_params():
    return [p for g in opt.param_groups for p in g["params"]]


def fresh_grads(i):
    for k, p in enumerate(all_params()):
        p.grad = rnd(1000 * i + k, *p.shape, dtype=p.dtype)


def persistent_grads(i):
    for k, p in enumerate(all_params()):
        if p.grad is None:
            p.grad = rnd(1000 * i + k, *p.shape, dtype=p.dtype)
        else:
            p.grad.copy_(rnd(1000 * i + k, *p.shape))


fresh_grads(0)
TRACK = {"params": params, "opt": opt}


def frame(x, n):
    y = x
    out = []
    @@frame@@
    return y, out
'''

OPTIMIZERS = {
    "SGD": ["lr=0.1, momentum=0.9", "lr=0.1", "lr=0.05, momentum=0.5, nesterov=True"],
    "Adam": ["lr=0.01", "lr=0.01, amsgrad=True", "lr=0.02, weight_decay=0.1"],
    "AdamW": ["lr=0.01"],
    "RMSprop": ["lr=0.01", "lr=0.01, momentum=0.5"],
    "Adagrad": ["lr=0.1"],
}


def gen_optim(r: random.Random, backend: str) -> dict[str, Any]:
    kind = r.choice(list(OPTIMIZERS))
    kwargs = r.choice(OPTIMIZERS[kind])
    foreach = r.choice([True, False])
    groups = r.choice([1, 2])
    shapes = [r.choice([(2, 3), (3,), (4,)]) for _ in range(r.randint(2, 4))]
    params = Op(
        "params = [\n"
        + "".join(f"    torch.nn.Parameter(rnd({i + 1}, {', '.join(map(str, s))})),\n" for i, s in enumerate(shapes))
        + "]",
        keep=True,
    )
    cut = len(shapes) if groups == 1 else r.randint(1, len(shapes) - 1)
    frame = [Op("opt.step()", ("optim.step",), keep=True)]
    if r.random() < 0.3:
        frame.append(Op("y = y + params[0].sum()", ("optim.read_param",)))
    if r.random() < 0.2:
        frame.append(Op('out.append(opt.param_groups[0]["lr"])', ("optim.read_hyper",)))
    if r.random() < 0.1:
        frame.append(Op("opt.zero_grad()", ("optim.zero_grad_in_frame",)))

    hyper = {
        "SGD": ['"lr"] = 0.2', '"momentum"] = 0.3'],
        "Adam": ['"lr"] = 0.03', '"betas"] = (0.8, 0.99)', '"weight_decay"] = 0.05'],
        "AdamW": ['"lr"] = 0.03', '"weight_decay"] = 0.2'],
        "RMSprop": ['"lr"] = 0.02', '"alpha"] = 0.9'],
        "Adagrad": ['"lr"] = 0.2'],
    }[kind]

    def pre(i: int) -> list[Op]:
        ops = [
            Op(f"fresh_grads({i})", ("optim.fresh_grads",))
            if r.random() < 0.7
            else Op(f"persistent_grads({i})", ("optim.persistent_grads",))
        ]
        for _ in range(r.choice([0, 1, 1, 2])):
            ops.append(
                r.choice(
                    [
                        lambda: Op(f"all_params()[{r.randint(0, len(shapes) - 1)}].grad = None", ("optim.grad_none",)),
                        lambda: Op(
                            f'opt.add_param_group({{"params": [torch.nn.Parameter(rnd({100 + i}, 3))], "lr": 0.02}})\n'
                            f"fresh_grads({i})",
                            ("optim.add_param_group",),
                        ),
                        lambda: Op(f"opt.param_groups[{r.randint(0, groups - 1)}][{r.choice(hyper)}", ("optim.hyper",)),
                        lambda: Op('SAVE["sd"] = copy.deepcopy(opt.state_dict())', ("optim.save_state_dict",)),
                        lambda: Op('if "sd" in SAVE:\n    opt.load_state_dict(SAVE["sd"])', ("optim.load_state_dict",)),
                        lambda: Op(
                            f"p = opt.param_groups[0][\"params\"][0]\n"
                            f"opt.param_groups[0][\"params\"][0] = torch.nn.Parameter(rnd({200 + i}, *p.shape))\n"
                            f"fresh_grads({i})",
                            ("optim.param_replaced",),
                        ),
                        lambda: Op("opt.zero_grad()", ("optim.zero_grad",)),
                    ]
                )()
            )
        return ops

    steps = _steps(r, r.randint(3, 6), pre, empty=0.1)
    for j, step in enumerate(steps):
        if j and not step.pre:
            step.pre.append(Op(f"fresh_grads({j})", ("optim.fresh_grads",)))
    picked_backend = _pick_backend(r, backend)

    # Drawn last, so the programs of seeds without a duplicate are what they were.
    tags = (f"optim.{kind}", f"optim.foreach_{foreach}", f"optim.groups_{groups}")
    # A parameter listed twice in its group (torch.optim warns; a parameter in two groups
    # raises): it shares its grad and state, and the optimizer updates it twice. Not with
    # foreach ops for a backend that functionalizes the graph: AOTAutograd applies one of
    # the two in-place updates of a tensor listed twice (torch._foreach_add_([a, a], 1)
    # adds 1), without this series too.
    if r.random() < 0.25 and not (foreach and picked_backend != "eager"):
        members = [list(range(cut)), list(range(cut, len(shapes)))][: groups]
        group = r.randrange(groups)
        members[group].insert(r.randint(0, len(members[group])), r.choice(members[group]))
        lists = ["[" + ", ".join(f"params[{i}]" for i in m) + "]" for m in members]
        spec = lists[0] if groups == 1 else f'[{{"params": {lists[0]}}}, {{"params": {lists[1]}, "lr": 0.005}}]'
        tags += ("optim.duplicate_param",)
    elif groups == 1:
        spec = "params"
    else:
        spec = f'[{{"params": params[:{cut}]}}, {{"params": params[{cut}:], "lr": 0.005}}]'
    opt = Op(f"opt = torch.optim.{kind}({spec}, {kwargs}, foreach={foreach})", tags, keep=True)
    return dict(
        backend=picked_backend,
        config={},
        template=OPTIM_TEMPLATE,
        sections={"params": [params], "opt": [opt], "frame": frame},
        steps=steps,
        x_shape=(2,),
    )


# -- init_once: torch._dynamo.init_values_once (init-values-once, native-container-guard) ----

INIT_ONCE_TEMPLATE = '''
torch.manual_seed(0)
@@cache@@
SAVE = {}
TRACK = {"cache": cache}
@@setup@@


def frame(x, n):
    y = x
    out = []
    @@frame_pre@@
    @@frame@@
    return y, out
'''

PLAIN_OPT = '''
class PlainOpt:
    """A momentum SGD that is not a torch.optim.Optimizer; lazily created state."""

    def __init__(self, params):
        self.param_groups = [{"params": list(params), "lr": 0.1, "momentum": 0.9}]
        self.state = {}

    @torch._dynamo.init_values_once(guards=["self.state", "self.param_groups", "group"])
    def _init_group(self, group, params, grads, bufs):
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {"buf": torch.zeros_like(p), "step": 0}
            params.append(p)
            grads.append(p.grad)
            bufs.append(state["buf"])

    def step(self):
        with torch.no_grad():
            for group in self.param_groups:
                params, grads, bufs = [], [], []
                self._init_group(group, params, grads, bufs)
                for p, g, b in zip(params, grads, bufs):
                    b.mul_(group["momentum"]).add_(g)
                    p.add_(b, alpha=-group["lr"])
                    @@popt_per_param@@
                @@popt_per_group@@

    def all_params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self):
        index = {id(p): i for i, p in enumerate(self.all_params())}
        state = {index[id(p)]: s for p, s in self.state.items() if id(p) in index}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        return copy.deepcopy({"state": state, "groups": groups})

    def load_state_dict(self, sd):
        # as torch.optim does: new state dict and new group dicts
        sd = copy.deepcopy(sd)
        flat = self.all_params()
        self.state = {flat[i]: s for i, s in sd["state"].items() if i < len(flat)}
        self.param_groups = [dict(h, params=g["params"]) for g, h in zip(self.param_groups, sd["groups"])]


popt = PlainOpt([torch.nn.Parameter(rnd(20 + i, 2)) for i in range(3)])
for k, p in enumerate(popt.all_params()):
    p.grad = rnd(30 + k, 2)
TRACK["popt"] = popt
'''


def _popt_pre(r: random.Random, i: int) -> Op:
    k = r.randint(0, 2)
    return r.choice(
        [
            lambda: Op(
                f"for k, p in enumerate(popt.all_params()):\n    p.grad = rnd({1000 * i} + k, *p.shape, dtype=p.dtype)",
                ("init_once.opt_fresh_grads",),
            ),
            lambda: Op(
                f"for k, p in enumerate(popt.all_params()):\n"
                f"    if p.grad is not None:\n"
                f"        p.grad.copy_(rnd({1000 * i} + k, *p.shape))",
                ("init_once.opt_persistent_grads",),
            ),
            lambda: Op(f"popt.all_params()[{k}].grad = None", ("init_once.opt_grad_none",)),
            lambda: Op(
                f"p = popt.all_params()[{k}]\n"
                f"if p.grad is None:\n    p.grad = rnd({1000 * i + 7}, *p.shape, dtype=p.dtype)",
                ("init_once.opt_grad_appears",),
            ),
            lambda: Op(f"p = popt.all_params()[{k}]\np.data = p.data.double()", ("init_once.opt_param_dtype",)),
            lambda: Op(
                f"p = popt.all_params()[{k}]\np.data = rnd({i}, 3)\np.grad = None", ("init_once.opt_param_shape",)
            ),
            lambda: Op(f"popt.all_params()[{k}].requires_grad_(False)", ("init_once.opt_requires_grad",)),
            lambda: Op(
                f'popt.param_groups[0]["params"][{k}] = torch.nn.Parameter(rnd({300 + i}, 2))\n'
                f'popt.param_groups[0]["params"][{k}].grad = rnd({400 + i}, 2)',
                ("init_once.opt_param_replaced",),
            ),
            lambda: Op(
                f'q = torch.nn.Parameter(rnd({500 + i}, 2))\nq.grad = rnd({600 + i}, 2)\n'
                f'popt.param_groups.append({{"params": [q], "lr": 0.05, "momentum": 0.5}})',
                ("init_once.opt_group_added",),
            ),
            lambda: Op(
                f'popt.param_groups[0]["{r.choice(["lr", "momentum"])}"] = {r.choice([0.3, 0.05])}',
                ("init_once.opt_hyper",),
            ),
            lambda: Op('SAVE["popt"] = popt.state_dict()', ("init_once.opt_save_state",)),
            lambda: Op(
                'if "popt" in SAVE:\n    popt.load_state_dict(SAVE["popt"])', ("init_once.opt_load_state_dict",)
            ),
            lambda: Op(
                'for st in popt.state.values():\n    st["buf"] = st["buf"].double()\n    break',
                ("init_once.opt_state_dtype",),
            ),
            lambda: Op(
                "if popt.state:\n    del popt.state[next(iter(popt.state))]", ("init_once.opt_state_key_removed",)
            ),
        ]
    )()


def _cache_pre(r: random.Random, i: int, keys: list[str]) -> Op:
    k = r.choice(keys)
    new = r.choice(["e", "f", "g"])
    return r.choice(
        [
            lambda: Op(f'cache["{new}"] = rnd({700 + i}, 2)', ("init_once.key_added",)),
            lambda: Op(f'cache.pop("{k}", None)', ("init_once.key_removed",)),
            lambda: Op(f'if "{k}" in cache:\n    cache["{k}"] = cache.pop("{k}")', ("init_once.key_reordered",)),
            lambda: Op(
                f'if isinstance(cache.get("{k}"), torch.Tensor):\n    cache["{k}"] = cache["{k}"].double()',
                ("init_once.value_dtype",),
            ),
            lambda: Op(f'cache["{k}"] = rnd({800 + i}, 3)', ("init_once.value_shape",)),
            lambda: Op(f'cache["{k}"] = rnd({800 + i}, 4)[::2]', ("init_once.value_stride",)),
            lambda: Op(
                f'if isinstance(cache.get("{k}"), torch.Tensor):\n'
                f'    cache["{k}"].requires_grad_(not cache["{k}"].requires_grad)',
                ("init_once.value_requires_grad",),
            ),
            lambda: Op(
                f'if isinstance(cache.get("{k}"), torch.Tensor):\n'
                f'    cache["{k}"].grad = (\n'
                f'        None if cache["{k}"].grad is not None else rnd({900 + i}, *cache["{k}"].shape)\n'
                f'    )',
                ("init_once.value_grad_presence",),
            ),
            lambda: Op(f'cache["{k}"] = rnd({850 + i}, 2)', ("init_once.value_replaced",)),
            lambda: Op(f'cache.setdefault("lst", []).append(rnd({950 + i}, 2))', ("init_once.list_length",)),
        ]
    )()


def gen_init_once(r: random.Random, backend: str) -> dict[str, Any]:
    # Draws added after the CI seed set was chosen use `side`, seeded from r's state
    # without advancing r: programs that do not draw them stay what they were.
    side = random.Random(hash(r.getstate()[1]))
    keys = ["a", "b"] + r.sample(["c", "d"], r.randint(0, 2))
    cache = [
        Op("cache = {" + ", ".join(f'"{k}": rnd({j + 1}, 2)' for j, k in enumerate(keys)) + "}", keep=True),
    ]
    if r.random() < 0.3:
        cache.append(Op('cache["lst"] = [rnd(9, 2)]', ("init_once.list_value",)))
    setup: list[Op] = []
    frame_pre: list[Op] = []
    frame: list[Op] = []
    sections: dict[str, list[Op]] = {"cache": cache, "setup": setup, "frame_pre": frame_pre, "frame": frame}
    pre_makers: list[Callable[[int], Op]] = [lambda i: _cache_pre(r, i, keys)]

    components = r.sample(["fill", "collect", "make", "pick", "sub", "self", "popt", "keyed"], r.randint(1, 3))
    if side.random() < 0.25:
        components.append("alias_arg")
    for c in components:
        if c == "fill":
            setup.append(
                Op(
                    '''
                    @torch._dynamo.init_values_once(guards=["cache"])
                    def fill(cache, names, out):
                        for name in names:
                            if name not in cache:
                                cache[name] = torch.full((2,), float(len(name)))
                            out.append(cache[name])
                    ''',
                    ("init_once.fill",),
                )
            )
            frame.append(Op('got = []\nfill(cache, ("a", "bb"), got)\ny = y + got[0] + got[1]', ("init_once.fill",)))
        elif c == "collect":
            setup.append(
                Op(
                    '''
                    @torch._dynamo.init_values_once(guards=["cache"])
                    def collect(cache, out):
                        for key in cache:
                            if isinstance(cache[key], torch.Tensor):
                                out.append(cache[key])
                    ''',
                    ("init_once.iterate",),
                )
            )
            frame.append(
                Op(
                    "vals = []\ncollect(cache, vals)\nout.append(len(vals))\nfor v in vals:\n    y = y + v.sum()",
                    ("init_once.iterate",),
                )
            )
        elif c == "make":
            fresh = r.random() < 0.4
            body = "return torch.ones(2) * len(cache)" if fresh else 'return cache.get("a", None)'
            tag = "init_once.fresh_tensor_result" if fresh else "init_once.result_from_input"
            setup.append(Op(f'@torch._dynamo.init_values_once(guards=["cache"])\ndef make(cache):\n    {body}', (tag,)))
            frame.append(Op("t = make(cache)\nif t is not None:\n    y = y + t", (tag,)))
        elif c == "pick":
            setup.append(
                Op(
                    '''
                    @torch._dynamo.init_values_once(guards=["cache"])
                    def pick(cache, k, out):
                        keys = sorted(key for key in cache if isinstance(cache[key], torch.Tensor))
                        out.append(cache[keys[k % len(keys)]])
                    ''',
                    ("init_once.int_arg",),
                )
            )
            frame.append(Op("picked = []\npick(cache, n, picked)\ny = y + picked[0].sum()", ("init_once.int_arg",)))
        elif c == "sub":
            setup.append(
                Op(
                    '''
                    @torch._dynamo.init_values_once(guards=["cache"])
                    def sub(cache):
                        if "sub" not in cache:
                            cache["sub"] = {}
                        return cache["sub"]
                    ''',
                    ("init_once.dict_result",),
                )
            )
            frame.append(Op('d = sub(cache)\nd["hits"] = d.get("hits", 0) + 1', ("init_once.dict_result",)))
        elif c == "self":
            setup.append(
                Op(
                    '@torch._dynamo.init_values_once(guards=["cache"])\ndef get_cache(cache):\n    return cache',
                    ("init_once.result_is_input",),
                )
            )
            frame.append(
                Op(
                    'c = get_cache(cache)\nc["seen"] = c.get("seen", 0) + n\ny = y + c["a"] if "a" in c else y',
                    ("init_once.result_is_input",),
                )
            )
        elif c == "popt":
            if side.random() < 0.5:
                # The design's example: `group` is not named; self.param_groups' guards cover it.
                plain = Op(PLAIN_OPT.replace(', "group"]', "]"), ("init_once.plain_opt", "init_once.group_unnamed"))
            else:
                plain = Op(PLAIN_OPT, ("init_once.plain_opt",))
            setup.append(plain)
            sections["popt_per_param"] = []
            sections["popt_per_group"] = []
            if r.random() < 0.5:
                sections["popt_per_param"].append(Op('self.state[p]["step"] += 1', ("init_once.opt_state_counter",)))
            if r.random() < 0.5:
                sections["popt_per_group"].append(Op('group["lr"] *= 0.9', ("init_once.opt_state_float",)))
            frame.append(Op("popt.step()", ("init_once.plain_opt",)))
            if r.random() < 0.3:
                frame.append(Op("out.append(len(popt.state))", ("init_once.opt_read_state",)))
            pre_makers.append(lambda i: _popt_pre(r, i))
            pre_makers.append(lambda i: _popt_pre(r, i))
        elif c == "alias_arg":
            # An argument no spec names that is (or was, or never was) an object the
            # guarded input reaches: by the same path, under a global alias, or not at all.
            cache.append(Op('SUB = cache["sub"] = {"w": rnd(70, 2)}\nOTHER = {}', keep=True))
            setup.append(
                Op(
                    '''
                    TRACK["other"] = OTHER


                    @torch._dynamo.init_values_once(guards=["cache"])
                    def read_sub(cache, sub, out):
                        if "w" not in sub:
                            sub["w"] = torch.zeros(2)
                        out.append(sub["w"])
                    ''',
                    ("init_once.alias_arg",),
                )
            )
            arg, tag = side.choice(
                [
                    ('cache["sub"]', "init_once.alias_arg_same_path"),
                    ("SUB", "init_once.alias_arg_global"),
                    ("OTHER", "init_once.alias_arg_unreachable"),
                ]
            )
            frame.append(
                Op(f'if "sub" in cache:\n    got = []\n    read_sub(cache, {arg}, got)\n    y = y + got[0]', (tag,))
            )
            pre_makers.append(
                lambda i: side.choice(
                    [
                        lambda: Op(f'cache["sub"] = {{"w": rnd({1200 + i}, 2)}}', ("init_once.alias_arg_rebound",)),
                        lambda: Op(f'SUB["w"] = rnd({1250 + i}, 3)', ("init_once.alias_arg_item_changed",)),
                        lambda: Op('SUB.pop("w", None)', ("init_once.alias_arg_item_removed",)),
                    ]
                )()
            )
        elif c == "keyed":
            setup.append(
                Op(
                    '''
                    kstate = {torch.nn.Parameter(rnd(50 + i, 2)): {"n": i} for i in range(3)}
                    for i, p in enumerate(kstate):
                        if i % 2 == 0:
                            p.grad = rnd(60 + i, 2)
                    TRACK["kstate"] = kstate


                    @torch._dynamo.init_values_once(guards=["state"])
                    def key_grads(state, out):
                        for p in state:
                            if p.grad is not None:
                                out.append(p.grad)
                    ''',
                    ("init_once.dict_key_grads",),
                )
            )
            frame.append(
                Op(
                    "kg = []\nkey_grads(kstate, kg)\nout.append(len(kg))\nfor g in kg:\n    y = y + g",
                    ("init_once.dict_key_grads",),
                )
            )
            pre_makers.append(
                lambda i: r.choice(
                    [
                        lambda: Op(
                            f"list(kstate)[{r.randint(0, 2)}].grad = rnd({1100 + i}, 2)",
                            ("init_once.key_grad_appears",),
                        ),
                        lambda: Op(f"list(kstate)[{r.randint(0, 2)}].grad = None", ("init_once.key_grad_disappears",)),
                        lambda: Op(
                            f"g = list(kstate)[{r.randint(0, 2)}].grad\nif g is not None:\n    g.mul_(2)",
                            ("init_once.key_grad_in_place",),
                        ),
                    ]
                )()
            )

    # Mutations of the guarded dict inside the frame, before the calls.
    if r.random() < 0.45:
        if r.random() < 0.6:
            setup.insert(0, Op("ALIAS = cache  # a global referencing the same dict", ("init_once.alias",)))
            target, tag = "ALIAS", "init_once.alias_mutation"
        else:
            target, tag = "cache", "init_once.frame_mutation"
        for _ in range(r.randint(1, 2)):
            frame_pre.append(
                r.choice(
                    [
                        lambda: Op(f'{target}["a"] = torch.full((2,), {r.choice([5.0, 7.0])})', (tag,)),
                        lambda: Op(f'{target}.pop("b", None)', (tag,)),
                        lambda: Op(f'{target}["z"] = x * 0 + 3', (tag, "init_once.graph_value_stored")),
                    ]
                )()
            )

    def pre(i: int) -> list[Op]:
        return [r.choice(pre_makers)(i) for _ in range(r.choice([1, 1, 2]))]

    steps = _steps(r, r.randint(3, 6), pre)
    return dict(
        backend=_pick_backend(r, backend),
        config={},
        template=INIT_ONCE_TEMPLATE,
        sections=sections,
        steps=steps,
        x_shape=(2,),
    )


# -- hooks: every hook kind registered/removed around and inside the frame ------------

HOOKS_TEMPLATE = '''
torch.manual_seed(0)
HITS = {}  # hook calls by kind
H = {}  # handles; the harness removes them all after the run


def count(name):
    HITS[name] = HITS.get(name, 0) + 1


def pre_hook(mod, args):
    count("pre")


def fwd_hook(mod, args, output):
    count("fwd")


def gpre_hook(mod, args):
    count("gpre")


def gfwd_hook(mod, args, output):
    count("gfwd")


def sd_pre_hook(mod, prefix, keep_vars):
    count("sd_pre")


def t_hook(grad):
    count("tensor")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x).relu()


m = Net()
TRACK = {"m": m, "HITS": HITS, "H": H}
@@setup@@


def frame(x, n):
    y = x
    out = []
    @@frame@@
    return y, out
'''

HOOK_KINDS = {
    "pre": ("m.register_forward_pre_hook(pre_hook)", "hooks.module_pre"),
    "fwd": ("m.register_forward_hook(fwd_hook)", "hooks.module_fwd"),
    "gpre": ("torch.nn.modules.module.register_module_forward_pre_hook(gpre_hook)", "hooks.global_pre"),
    "gfwd": ("torch.nn.modules.module.register_module_forward_hook(gfwd_hook)", "hooks.global_fwd"),
    "sd": ("m.register_state_dict_pre_hook(sd_pre_hook)", "hooks.state_dict_pre"),
    "t": ("m.lin.weight.register_hook(t_hook)", "hooks.tensor_param"),
}


def gen_hooks(r: random.Random, backend: str) -> dict[str, Any]:
    kinds = r.sample(list(HOOK_KINDS), r.randint(1, 4))
    setup = [Op(f'H["{k}"] = {HOOK_KINDS[k][0]}', (HOOK_KINDS[k][1],)) for k in kinds]
    frame: list[Op] = []
    calls_module = lambda: Op("y = m(y)", ("hooks.call_module",))  # noqa: E731
    for _ in range(r.randint(2, 5)):
        frame.append(
            r.choice(
                [
                    lambda: Op(f'H["{r.choice(kinds)}"].remove()', ("hooks.remove_in_frame",)),
                    calls_module,
                    calls_module,
                    lambda: Op('sd = m.state_dict()\ny = y + sd["lin.weight"].sum()', ("hooks.state_dict",)),
                    lambda: Op('H["fwd2"] = m.register_forward_hook(fwd_hook)', ("hooks.register_in_frame",)),
                    lambda: Op('H["pre2"] = m.register_forward_pre_hook(pre_hook)', ("hooks.register_in_frame",)),
                    lambda: Op("z = y * 2\nz.register_hook(t_hook)\ny = z", ("hooks.tensor_intermediate",)),
                    lambda: Op(
                        "z = y * 3\nh = z.register_hook(t_hook)\nh.remove()\ny = z", ("hooks.tensor_remove_in_frame",)
                    ),
                    lambda: Op('out.append(len(m._forward_hooks))', ("hooks.read_hook_dict",)),
                ]
            )()
        )
    if not any("hooks.call_module" in op.tags or "hooks.state_dict" in op.tags for op in frame):
        frame.append(calls_module())

    def pre(i: int) -> list[Op]:
        k = r.choice(kinds)
        return [
            r.choice(
                [
                    lambda: Op(f'H["{k}"] = {HOOK_KINDS[k][0]}', ("hooks.register_between",)),
                    lambda: Op(f'H["{k}"].remove()', ("hooks.remove_between",)),
                    lambda: Op("m.zero_grad()", ("hooks.zero_grad",)),
                ]
            )()
        ]

    return dict(
        backend=_pick_backend(r, backend),
        # Dynamo's default skips guards on module hook dicts, so hooks added between calls
        # are knowingly ignored by code compiled before; fuzz the sound setting.
        config={"skip_nnmodule_hook_guards": False},
        template=HOOKS_TEMPLATE,
        sections={"setup": setup, "frame": frame},
        steps=_steps(r, r.randint(3, 5), pre),
        x_shape=(3,),
        backward=r.random() < 0.6,
        x_requires_grad=True,
    )


# -- containers: large tensor containers (native-container-guard) ----------

CONTAINERS_TEMPLATE = '''
torch.manual_seed(0)
@@holder@@
TRACK = {"holder": holder}


def frame(x, n):
    y = x
    out = []
    @@frame@@
    return y, out
'''

HOLDERS = {
    # name: (setup code with {n}, access expression, kind)
    "global_list": ("holder = [rnd(i, 2, 3) for i in range({n})]", "holder", "list"),
    # a variant of global_list (gen_containers)
    "global_tuple": ("holder = tuple(rnd(i, 2, 3) for i in range({n}))", "holder", "tuple"),
    "global_dict": ('holder = {{f"k{{i}}": rnd(i, 2, 3) for i in range({n})}}', "holder", "dict"),
    "module_list": (
        "class Holder(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.ts = [rnd(i, 2, 3) for i in range({n})]\n\n\nholder = Holder()",
        "holder.ts",
        "list",
    ),
    "module_dict": (
        "class Holder(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        '        self.ts = {{f"k{{i}}": rnd(i, 2, 3) for i in range({n})}}\n\n\nholder = Holder()',
        "holder.ts",
        "dict",
    ),
    "module_nested_dict": (
        "class Holder(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        '        self.cfg = {{"ts": {{f"k{{i}}": rnd(i, 2, 3) for i in range({n})}}}}\n\n\nholder = Holder()',
        'holder.cfg["ts"]',
        "dict",
    ),
    "submodule_nested_dict": (
        "class Inner(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        '        self.cfg = {{"ts": {{f"k{{i}}": rnd(i, 2, 3) for i in range({n})}}}}\n\n\n'
        "class Holder(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.inner = Inner()\n        self.scale = [1.0]\n\n\nholder = Holder()",
        'holder.inner.cfg["ts"]',
        "dict",
    ),
    "parameter_list": (
        "holder = torch.nn.ParameterList([torch.nn.Parameter(rnd(i, 2, 3)) for i in range({n})])\n"
        "for i, p in enumerate(holder):\n    p.grad = rnd(100 + i, 2, 3)",
        "holder",
        "plist",
    ),
}


def gen_containers(r: random.Random, backend: str) -> dict[str, Any]:
    # the nested dicts twice as often: their trees hold tag-safe nn.Module roots; the
    # global tuple is drawn as a variant of the global list (the other holders' seeds
    # keep their programs)
    holder_name = r.choice(
        [h for h in HOLDERS if h != "global_tuple"] + ["module_nested_dict", "submodule_nested_dict"]
    )
    global_sequence = holder_name == "global_list"
    if global_sequence and r.random() < 0.5:
        holder_name = "global_tuple"
    code, c, kind = HOLDERS[holder_name]
    # A global list or tuple (reached through the globals dict) around the native
    # guard's threshold, config.tensor_container_guard_min_size (8); others above it.
    n = r.randint(6, 10) if global_sequence else r.randint(8, 11)
    recursive = r.random() < 0.5
    holder = [Op(code.format(n=n), (f"containers.{holder_name}",), keep=True)]
    values = f"{c}.values()" if kind == "dict" else c
    frame = [Op(f"for t in {values}:\n    y = y + t.sum()", ("containers.read_values",), keep=True)]
    reads = [
        Op(f"out.append([t.requires_grad for t in {values}])", ("containers.meta_requires_grad",)),
        Op(f"out.append([tuple(t.shape) for t in {values}])", ("containers.meta_shape",)),
        Op(f"out.append([t.dtype for t in {values}])", ("containers.meta_dtype",)),
        Op(f"out.append([t.stride() for t in {values}])", ("containers.meta_stride",)),
        Op(f"out.append(len({c}))", ("containers.len",)),
    ]
    if kind == "plist":  # the only holder whose tensors have grads
        reads.append(Op(f"out.append([t.grad is None for t in {values}])", ("containers.meta_grad",)))
    frame.extend(r.sample(reads, r.randint(2, 4)))

    def elem(i: int) -> str:
        return f'{c}["k{i}"]' if kind == "dict" else f"{c}[{i}]"

    def rebind(value: str) -> str:
        # A tuple is never written to: the global is rebound (globals(): a `global`
        # statement after another op's use of the name would not compile).
        return f'globals()["{c}"] = {value}\nTRACK["holder"] = {c}'

    def pre(i: int) -> list[Op]:
        j = r.randint(0, n - 1)
        e = elem(j)
        choices = [
            lambda: Op(f"{e}.requires_grad_(not {e}.requires_grad)", ("containers.requires_grad",)),
            # (a grad of the old shape would make the state one eager never checks)
            lambda: Op(
                f"{e}.data = rnd({2000 + i}, 3, 2)" + (f"\n{e}.grad = None" if kind == "plist" else ""),
                ("containers.data_shape",),
            ),
            lambda: Op(f"{e}.t_()", ("containers.t_",)),
        ]
        if kind == "tuple":
            choices.append(
                lambda: Op(
                    rebind(f"{c}[:{j}] + (rnd({2100 + i}, 2, 3),) + {c}[{j + 1}:]"),
                    ("containers.replace_same_meta",),
                )
            )
            choices.append(lambda: Op(rebind(f"{c}[:{j}] + ({e}.double(),) + {c}[{j + 1}:]"), ("containers.dtype",)))
            choices.append(lambda: Op(rebind(f"{c} + (rnd({2300 + i}, 2, 3),)"), ("containers.length",)))
            choices.append(lambda: Op(rebind(f"{c}[:-1]"), ("containers.length",)))
        else:
            choices.append(lambda: Op(f"{e} = rnd({2100 + i}, 2, 3)", ("containers.replace_same_meta",)))
        if kind not in ("plist", "tuple"):
            choices.append(lambda: Op(f"{e} = {e}.double()", ("containers.dtype",)))
        elif kind == "plist":
            choices.append(
                lambda: Op(
                    f"{e}.grad = None if {e}.grad is not None else rnd({2200 + i}, *{e}.shape)",
                    ("containers.grad_presence",),
                )
            )
        if kind == "list":
            choices.append(lambda: Op(f"{c}.append(rnd({2300 + i}, 2, 3))", ("containers.length",)))
            choices.append(lambda: Op(f"{c}.pop()", ("containers.length",)))
        if kind == "dict":
            choices.append(lambda: Op(f'{c}["k{j}"] = {c}.pop("k{j}")', ("containers.key_order",)))
            choices.append(lambda: Op(f'{c}["new{i}"] = rnd({2400 + i}, 2, 3)', ("containers.key_added",)))
        if global_sequence:
            # other tensors, same metadata: the graph must read the new ones
            choices.append(lambda: Op(rebind(f"type({c})(t.clone() for t in {c})"), ("containers.rebind_global",)))
        return [r.choice(choices)() for _ in range(r.choice([1, 1, 2]))]

    # Three calls with nothing changed first: the guard tree records its fast path
    # (recursive dict tags) on the second check and uses it from the third on.
    count = r.randint(4, 7)
    ns = _ns(r, count)
    steps = [Step([] if i < 3 or r.random() < 0.2 else pre(i), ns[i]) for i in range(count)]
    return dict(
        backend=_pick_backend(r, backend),
        config={"use_recursive_dict_tags_for_guards": recursive},
        template=CONTAINERS_TEMPLATE,
        sections={"holder": holder, "frame": frame},
        steps=steps,
        x_shape=(1,),
        base_tags=(("containers.recursive_dict_tags",) if recursive else ())
        + (("containers.below_native_threshold",) if n < 8 else ()),
    )


FAMILIES: dict[str, Callable[[random.Random, str], dict[str, Any]]] = {
    "scalars": gen_scalars,
    "optim": gen_optim,
    "init_once": gen_init_once,
    "hooks": gen_hooks,
    "containers": gen_containers,
}


def generate(family: str, seed: int, backend: str = "mix") -> Program:
    """The program of `family` for `seed` (deterministic). backend: "mix" lets the
    generator choose (mostly eager, some aot_eager, rarely inductor for scalars)."""
    r = random.Random(seed * 1009 + _GEN_SEED_SALT[family])
    fields = FAMILIES[family](r, backend)
    return Program(family=family, seed=seed, **fields)


@functools.cache
def _all_tags() -> set[str]:
    """Every tag any generator can produce (by sampling many seeds)."""
    tags: set[str] = set()
    for family in FAMILIES:
        for seed in range(400):
            tags |= generate(family, seed).features()
    return tags


def ALL_TAGS() -> set[str]:  # upper case: a constant, computed once
    return set(_all_tags())


# ---------------------------------------------------------------------------
# Observation


@dataclasses.dataclass
class TensorSnap:
    number: int  # order of first appearance in the snapshot: aliasing is compared
    type: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool
    values: torch.Tensor
    grad: Any  # TensorSnap, an alias, or None


@dataclasses.dataclass
class ContainerSnap:
    kind: str  # "dict", "list", "tuple", "module Net", "object PlainOpt", "optimizer Adam"
    # (label for the path, snapshot of the key for tensor-keyed dicts, snapshot of the value)
    items: list[tuple[str, Any, Any]]


class _Snapshotter:
    """Turns objects into comparable plain structures. Tensors are numbered in the
    order they are first seen, so aliasing (the same tensor in two places) is part of
    what is compared."""

    def __init__(self) -> None:
        self.numbers: dict[int, int] = {}
        self.keep: list[Any] = []  # snapshotted tensors stay alive while their ids are used

    def __call__(self, obj: Any, depth: int = 0) -> Any:
        if depth > 12:
            return ("too deep",)
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj, depth)
        if obj is None or isinstance(obj, (bool, int, str)):
            return obj
        if isinstance(obj, float):
            return ("float", obj)
        if isinstance(obj, (torch.dtype, torch.device, torch.Size)):
            return ("repr", repr(obj))
        if isinstance(obj, torch.optim.Optimizer):
            # Not state_dict(): it raises once a parameter with state left the groups.
            return ContainerSnap(
                f"optimizer {type(obj).__name__}",
                [
                    (".param_groups", None, self(obj.param_groups, depth + 1)),
                    (".state", None, self(dict(obj.state), depth + 1)),
                ],
            )
        if isinstance(obj, torch.nn.Module):
            return self.module(obj, depth)
        if isinstance(obj, torch.utils.hooks.RemovableHandle):
            hooks = obj.hooks_dict_ref()
            return ("handle registered", hooks is not None and obj.id in hooks)
        if isinstance(obj, dict):
            items = []
            for k, v in obj.items():
                if isinstance(k, torch.Tensor):
                    key = self(k, depth + 1)
                    label = f"[<tensor {key.number if isinstance(key, TensorSnap) else key[1]}>]"
                else:
                    key, label = None, f"[{k!r}]"
                items.append((label, key, self(v, depth + 1)))
            return ContainerSnap("dict", items)
        if isinstance(obj, (list, tuple)):
            return ContainerSnap(type(obj).__name__, [(f"[{i}]", None, self(v, depth + 1)) for i, v in enumerate(obj)])
        if callable(obj):
            return ("callable", getattr(obj, "__qualname__", type(obj).__name__))
        if hasattr(obj, "__dict__"):
            return ContainerSnap(
                f"object {type(obj).__name__}", [(f".{k}", None, self(v, depth + 1)) for k, v in vars(obj).items()]
            )
        return ("repr", repr(obj))

    def tensor(self, t: torch.Tensor, depth: int) -> Any:
        if id(t) in self.numbers:
            return ("alias of tensor", self.numbers[id(t)])
        self.numbers[id(t)] = len(self.numbers)
        self.keep.append(t)
        grad = self(t.grad, depth + 1) if t.is_leaf and t.grad is not None else None
        return TensorSnap(
            self.numbers[id(t)],
            type(t).__name__,
            str(t.dtype),
            tuple(t.shape),
            tuple(t.stride()),
            t.requires_grad,
            t.detach().clone(),
            grad,
        )

    def module(self, m: torch.nn.Module, depth: int) -> Any:
        items = []
        for k, v in vars(m).items():
            if k in ("_parameters", "_buffers", "_modules"):
                items.extend((f".{name}", None, self(value, depth + 1)) for name, value in v.items())
            elif k.endswith(("_hooks", "_hooks_with_kwargs", "_hooks_always_called")):
                items.append((f".{k}", None, ("hooks registered", len(v))))  # handle ids differ between runs
            elif not k.startswith("_"):
                items.append((f".{k}", None, self(v, depth + 1)))
        return ContainerSnap(f"module {type(m).__name__}", items)


_GLOBAL_HOOKS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
    "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs",
)


def _global_hook_dicts() -> dict[str, dict]:
    module = torch.nn.modules.module
    return {name: getattr(module, name) for name in _GLOBAL_HOOKS}


def observe(result: Any, track: dict[str, Any], baseline: dict[str, int]) -> ContainerSnap:
    snap = _Snapshotter()
    hooks = {k: len(v) - baseline[k] for k, v in _global_hook_dicts().items()}
    return ContainerSnap(
        "observation",
        [
            ("result", None, snap(result)),
            ("", None, ContainerSnap("state", [(k, None, snap(v)) for k, v in track.items()])),
            ("torch.nn.modules.module", None, ContainerSnap("globals", [(f".{k}", None, v) for k, v in hooks.items()])),
        ],
    )


def _tensors_differ(a: torch.Tensor, b: torch.Tensor, exact: bool) -> str | None:
    try:
        if exact:
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(a, b, equal_nan=True)
    except AssertionError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        return "; ".join(lines[:3]) if lines else "values differ"
    return None


def compare(a: Any, b: Any, path: str, exact: bool) -> tuple[str, str] | None:
    """The first difference between two snapshots: (path, description)."""
    if type(a) is not type(b):
        return (path, f"{_short(a)} != {_short(b)}")
    if isinstance(a, TensorSnap):
        for field in ("number", "type", "dtype", "shape", "stride", "requires_grad"):
            if getattr(a, field) != getattr(b, field):
                return (f"{path}", f"{field} {getattr(a, field)!r} != {getattr(b, field)!r}")
        d = _tensors_differ(a.values, b.values, exact)
        if d is not None:
            return (path, f"values differ: {d}; eager {_short(a.values)} compiled {_short(b.values)}")
        return compare(a.grad, b.grad, f"{path}.grad", exact)
    if isinstance(a, ContainerSnap):
        if a.kind != b.kind:
            return (path, f"{a.kind} != {b.kind}")
        labels_a, labels_b = [x[0] for x in a.items], [x[0] for x in b.items]
        if labels_a != labels_b:
            return (path, f"{a.kind} keys {labels_a} != {labels_b}")
        for (label, ka, va), (_, kb, vb) in zip(a.items, b.items):
            sub = f"{path}{label}" if label.startswith((".", "[")) or not path else f"{path}.{label}"
            d = compare(ka, kb, f"{sub} (key)", exact) or compare(va, vb, sub, exact)
            if d:
                return d
        return None
    if isinstance(a, tuple) and a and a[0] == "float":
        x, y = a[1], b[1]
        same = (
            (math.isnan(x) and math.isnan(y))
            or x == y
            or (not exact and math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9))
        )
        return None if same else (path, f"{x!r} != {y!r}")
    if a != b:
        return (path, f"{_short(a)} != {_short(b)}")
    return None


def _short(x: Any) -> str:
    s = repr(x)
    return s if len(s) < 160 else s[:157] + "..."


# ---------------------------------------------------------------------------
# Running


@dataclasses.dataclass
class Failure:
    kind: str  # "exception", "result", "state", "guard-check", "setup"
    call: int
    detail: str
    path: str = ""

    @property
    def signature(self) -> tuple[str, str]:
        """What shrinking must preserve: the kind and where (not the call index)."""
        if self.kind in ("exception", "setup"):
            return (self.kind, self.detail.split(":")[0])
        if self.kind == "guard-check":
            return (self.kind, "")
        # the first two steps of the path: "HITS['gpre']", "cache['sub']", "result[0]"
        return (self.kind, "".join(re.findall(r"^[^.\[]*|[.\[][^.\[]*", self.path)[:2]))

    def __str__(self) -> str:
        where = f" at {self.path}" if self.path else ""
        return f"{self.kind} mismatch on call {self.call}{where}: {self.detail}"


@dataclasses.dataclass
class RunResult:
    program: Program
    failure: Failure | None
    calls: int  # frame calls made per side
    frames: int  # frames compiled (compiled side)
    seconds: float


@dataclasses.dataclass
class _Side:
    observations: list[Any]
    outcomes: list[tuple[str, str]]  # ("ok", "") or ("exc", "Type: message")
    guard_disagreements: list[tuple[int, str]]
    setup_error: str | None = None


def _exc(e: BaseException) -> tuple[str, str]:
    """("exc", "Type: message"); the types of the MRO are kept after a "|" so that a
    subclass raised compiled (TorchRuntimeError for a RuntimeError) is accepted."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    mro = ",".join(t.__name__ for t in type(e).__mro__)
    return ("exc", f"{type(e).__name__}: {msg[:200]}|{mro}")


def _exc_type(text: str) -> str:
    return text.split(":", 1)[0]


def _exc_is_a(compiled: str, eager: str) -> bool:
    return _exc_type(eager) in compiled.rsplit("|", 1)[-1].split(",")


def _guard_disagreements(code: Any, f_locals: dict[str, Any]) -> list[str]:
    """Cache entries of `code` whose fast check() disagrees with check_verbose()."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    found = []
    for index, entry in enumerate(_debug_get_cache_entry_list(code)):
        manager = entry.guard_manager
        try:
            fast = bool(manager.check(f_locals))
            verbose = manager.check_verbose(f_locals)
        except Exception:  # a guard needing more than the arguments
            continue
        if fast != bool(verbose.result):
            found.append(
                f"cache entry {index}: check() is {fast}, check_verbose() is {bool(verbose.result)} "
                f"({'; '.join(str(p).split('#')[0].strip() for p in verbose.verbose_code_parts)[:300]})"
            )
    return found


class _Frames:
    """A backend wrapper counting the graphs compiled (frames + graph-break pieces)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs += 1
        if self.backend == "eager":
            return gm.forward
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(self.backend)(gm, example_inputs)


def _run_side(program: Program, source: str, backend: Any) -> tuple[_Side, int]:
    """Exec `source` into a fresh namespace and make its calls; `backend` None = eager."""
    filename = f"<dfuzz {program.name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    baseline_dicts = _global_hook_dicts()
    baseline_keys = {k: list(v) for k, v in baseline_dicts.items()}
    baseline = {k: len(v) for k, v in baseline_dicts.items()}
    side = _Side([], [], [])
    graphs = 0
    ns: dict[str, Any] = {"__name__": f"dfuzz_{program.family}_{program.seed}"}
    try:
        with torch._dynamo.config.patch(**program.config):
            try:
                exec(compile(source, filename, "exec"), ns)  # our own generated source
            except Exception as e:
                side.setup_error = _exc(e)[1]
                return side, 0
            frame = ns["frame"]
            counter = None
            if backend is not None:
                torch._dynamo.reset()
                counter = _Frames(backend)
                fn = torch.compile(frame, backend=counter, fullgraph=False)
            else:
                fn = frame
            for i, (pre, n) in enumerate(ns["CALLS"]):
                if pre is not None:
                    try:
                        pre()
                    except Exception as e:
                        side.outcomes.append(("pre-exc", _exc(e)[1]))
                        side.observations.append(None)
                        break
                x = _input(i, program.x_shape).requires_grad_(program.x_requires_grad)
                if backend is not None:
                    for d in _guard_disagreements(frame.__code__, {"x": x, "n": n}):
                        side.guard_disagreements.append((i, d))
                result = None
                try:
                    result = fn(x, n)
                    if program.backward and isinstance(result[0], torch.Tensor) and result[0].requires_grad:
                        result[0].sum().backward()
                    outcome = ("ok", "")
                except Exception as e:
                    outcome = _exc(e)
                side.outcomes.append(outcome)
                side.observations.append(observe(result, ns.get("TRACK", {}), baseline))
                if outcome[0] != "ok":
                    break
            graphs = counter.graphs if counter is not None else 0
    finally:
        for handle in list(ns.get("H", {}).values()):
            if isinstance(handle, torch.utils.hooks.RemovableHandle):
                handle.remove()
        for name, d in _global_hook_dicts().items():  # anything left behind
            for key in list(d):
                if key not in baseline_keys[name]:
                    del d[key]
        if backend is not None:
            torch._dynamo.reset()
    return side, graphs


def _input(i: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(10_000 + i))


def run_program(program: Program, compiled_backend: Any = "program") -> RunResult:
    """Run `program` eagerly and compiled and compare after every call.
    compiled_backend: "program" (the program's own), a backend name or callable, or
    None to run the second side eagerly too (checks the programs are deterministic)."""
    start = time.perf_counter()
    source = program.render()
    backend = program.backend if compiled_backend == "program" else compiled_backend
    eager, _ = _run_side(program, source, None)
    compiled, graphs = _run_side(program, source, backend)
    # Not bitwise even with backend="eager": torch.optim takes other code paths when
    # compiling (e.g. Adagrad's state differs by 1 ulp), so values are compared with
    # assert_close's default tolerances; stale or wrong values are far outside them.
    failure = _diff(eager, compiled, exact=backend is None)
    return RunResult(program, failure, len(eager.outcomes), graphs, time.perf_counter() - start)


def _diff(eager: _Side, compiled: _Side, exact: bool) -> Failure | None:
    if eager.setup_error or compiled.setup_error:
        errors = {(e or "none").rsplit("|", 1)[0] for e in (eager.setup_error, compiled.setup_error)}
        return Failure("setup", 0, " / ".join(sorted(errors)))
    for i in range(max(len(eager.outcomes), len(compiled.outcomes))):
        if i >= len(eager.outcomes) or i >= len(compiled.outcomes):
            return Failure("exception", i, f"eager made {len(eager.outcomes)} calls, compiled {len(compiled.outcomes)}")
        for j, d in compiled.guard_disagreements:
            if j == i:
                return Failure("guard-check", i, d)
        (ek, em), (ck, cm) = eager.outcomes[i], compiled.outcomes[i]
        if ek != ck or (ek != "ok" and not _exc_is_a(cm, em)):
            em, cm = em.rsplit("|", 1)[0], cm.rsplit("|", 1)[0]
            return Failure("exception", i, f"eager {em or 'returned'} / compiled {cm or 'returned'}")
        if eager.observations[i] is None:
            continue
        d = compare(eager.observations[i], compiled.observations[i], "", exact)
        if d is not None:
            path, detail = d
            kind = "result" if path.startswith("result") else "state"
            return Failure(kind, i, f"eager vs compiled: {detail}", path)
    return None


def shrink(
    program: Program,
    failure: Failure,
    budget_seconds: float = 120.0,
    log: Callable[[str], None] | None = None,
    compiled_backend: Any = "program",
) -> tuple[Program, Failure, int]:
    """Drop steps, ops and setup lines while the program still fails with the same
    signature. Returns the smallest program found, its failure and the runs made."""
    deadline = time.perf_counter() + budget_seconds
    runs = 0
    changed = True
    while changed and time.perf_counter() < deadline:
        changed = False
        for kind, where in list(program.candidates()):
            if time.perf_counter() >= deadline:
                break
            candidate = program.without(kind, where)
            result = run_program(candidate, compiled_backend)
            runs += 1
            if result.failure is not None and result.failure.signature == failure.signature:
                program, failure, changed = candidate, result.failure, True
                if log:
                    log(f"  shrunk: dropped {kind} {where} ({sum(len(v) for v in program.sections.values())} ops left)")
                break
    return program, failure, runs
