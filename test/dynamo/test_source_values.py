# Owner(s): ["module: dynamo"]
"""Source.get_value of a chained source whose name is one plain operation on its base does
that operation instead of eval()ing the name: the same values and exceptions, fewer evals.
The reference is the source's name evaluated as a whole (evaluated)."""

import collections
import types
import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
import torch._guards
from torch._dynamo.source import (
    AttrSource,
    ConstDictKeySource,
    DictGetItemSource,
    GetItemSource,
    GradSource,
    ListGetItemSource,
    LocalSource,
    NNModuleSource,
    OptimizerSource,
)


class ShadowingList(list):
    """A list whose __getitem__ lies: list.__getitem__ and [] give different values."""

    def __getitem__(self, i):
        return "shadowed"


class Holder:
    def __init__(self):
        self.cfg = {"scale": 2.0, 3: "three", "a{b}": "braces"}
        self.other = {"a{b}": 0}
        self.items = [10, 20, 30]
        self.shadow = ShadowingList([1, 2])
        self.t = torch.ones(2, requires_grad=True)
        self.t.grad = torch.full((2,), 5.0)
        self.inner = types.SimpleNamespace(items=[7, 8])
        self.by_dtype = {torch.float32: "f32"}
        setattr(self, "odd name", "odd")


def scope_of(holder):
    return {"G": {}, "L": {"h": holder}}


def evaluated(sources, holder):
    """(value or exception type) of each source's whole name, evaluated."""
    out = []
    for source in sources:
        try:
            out.append(eval(source.name, scope_of(holder), {}))
        except Exception as e:  # the type is what is compared
            out.append(type(e))
    return out


def values(sources, holder):
    """(value or exception type) of each source's get_value, and how many times eval ran."""
    out = []
    with unittest.mock.patch.object(torch._guards, "eval", wraps=eval, create=True) as evals:
        for source in sources:
            try:
                out.append(source.get_value(scope_of(holder), {}, {}))
            except Exception as e:  # the type is what is compared
                out.append(type(e))
    return out, evals.call_count


def sources_of_every_kind():
    h = LocalSource("h")
    cfg = AttrSource(h, "cfg")
    return {
        "attr": AttrSource(h, "items"),
        "attr chain + int item": GetItemSource(AttrSource(h, "items"), 1),
        "negative int item": GetItemSource(AttrSource(h, "items"), -1),
        "slice item": GetItemSource(AttrSource(h, "items"), slice(0, 2)),
        "dict str item": DictGetItemSource(cfg, "scale"),
        "dict int item": DictGetItemSource(cfg, 3),
        "dict str item with braces": DictGetItemSource(cfg, "a{b}"),
        "dict key": ConstDictKeySource(cfg, 1),
        "dict item by key source": DictGetItemSource(cfg, ConstDictKeySource(cfg, 1)),
        "dict item by another dict's key": DictGetItemSource(
            cfg, ConstDictKeySource(AttrSource(h, "other"), 0)
        ),
        "grad": GradSource(AttrSource(h, "t"), "grad"),
        "non-identifier attr": AttrSource(h, "odd name"),
        "list.__getitem__ on a list subclass": ListGetItemSource(AttrSource(h, "shadow"), 0),
        "overridden __getitem__": GetItemSource(AttrSource(h, "shadow"), 0),
        "optimizer marker": OptimizerSource(AttrSource(h, "cfg")),
        "module marker": NNModuleSource(AttrSource(h, "items")),
        "missing attr": AttrSource(h, "nope"),
        "missing key": DictGetItemSource(cfg, "nope"),
        "index out of range": GetItemSource(AttrSource(h, "items"), 7),
        # The name does not evaluate in this scope (no `torch`): still the eval's error.
        "non-literal index": GetItemSource(AttrSource(h, "by_dtype"), torch.float32),
    }


class SourceValuesTests(torch._dynamo.test_case.TestCase):
    def test_every_kind_same_value_as_its_name(self):
        holder = Holder()
        kinds = sources_of_every_kind()
        direct, _ = values(kinds.values(), holder)
        for name, d, e in zip(kinds, direct, evaluated(kinds.values(), holder)):
            with self.subTest(name):
                self.assertIs(type(d), type(e))
                self.assertEqual(d, e)
        by_name = dict(zip(kinds, direct))
        # Spot checks that the comparison is of real values.
        self.assertEqual(by_name["attr chain + int item"], 20)
        self.assertEqual(by_name["negative int item"], 30)
        self.assertEqual(by_name["list.__getitem__ on a list subclass"], 1)
        self.assertEqual(by_name["overridden __getitem__"], "shadowed")
        self.assertEqual(by_name["dict key"], 3)
        self.assertEqual(by_name["dict item by key source"], "three")
        self.assertEqual(by_name["dict item by another dict's key"], "braces")
        self.assertIs(by_name["optimizer marker"], holder.cfg)
        self.assertIs(by_name["attr"], holder.items)
        self.assertEqual(by_name["slice item"], [10, 20])
        self.assertIs(by_name["grad"], holder.t.grad)
        self.assertIs(by_name["missing attr"], AttributeError)
        self.assertIs(by_name["missing key"], KeyError)
        self.assertIs(by_name["index out of range"], IndexError)
        self.assertIs(by_name["non-literal index"], NameError)

    def test_plain_links_are_not_evaluated(self):
        holder = Holder()
        h = LocalSource("h")
        chain = OptimizerSource(GetItemSource(AttrSource(AttrSource(h, "inner"), "items"), 1))
        direct, direct_evals = values([chain], holder)
        self.assertIs(direct[0], holder.inner.items[1])
        # Only the root (L['h']) is evaluated; without this patch every link is too (5).
        self.assertEqual(direct_evals, 1)

        # A dict item by its position among the same dict's keys: the root only too.
        cfg = AttrSource(h, "cfg")
        by_position = DictGetItemSource(cfg, ConstDictKeySource(cfg, 1))
        direct, direct_evals = values([by_position], holder)
        self.assertEqual(direct, ["three"])
        self.assertEqual(direct_evals, 1)

        # Names that escape braces or use getattr(): the same operation, done directly.
        for source, expected in (
            (DictGetItemSource(cfg, "a{b}"), "braces"),
            (AttrSource(h, "odd name"), "odd"),
        ):
            direct, direct_evals = values([source], holder)
            self.assertEqual(direct, [expected])
            self.assertEqual(direct_evals, 1)

    def test_links_named_otherwise_keep_the_eval(self):
        holder = Holder()
        kinds = sources_of_every_kind()
        for name in (
            "slice item",
            "list.__getitem__ on a list subclass",
            "non-literal index",
        ):
            with self.subTest(name):
                _, evals = values([kinds[name]], holder)
                self.assertEqual(evals, 2)  # the root and this link
        # torch 2.15.0's DictGetItemSource.get_value looks a key source up itself.
        _, evals = values([kinds["dict item by another dict's key"]], holder)
        self.assertEqual(evals, 1)

    def test_guards_and_recompiles(self):
        def run():
            torch._dynamo.reset()
            torch.manual_seed(0)
            holder = Holder()
            holder.modules = collections.OrderedDict(lin=torch.nn.Linear(2, 2))

            def f(h, x):
                y = x * h.cfg["scale"] + h.items[1]
                for k in h.cfg:
                    if isinstance(k, int):
                        y = y + k
                return h.modules["lin"](y) + h.t.grad

            counter = torch._dynamo.testing.CompileCounter()
            reasons = []
            compiled = torch.compile(f, backend=counter)
            x = torch.ones(2)
            outs = []
            for change in (None, ("cfg", "scale", 3.0), ("items", 1, 21), None):
                if change is not None:
                    attr, key, value = change
                    getattr(holder, attr)[key] = value
                outs.append(compiled(holder, x))
                self.assertEqual(outs[-1], f(holder, x))
            from torch._dynamo.eval_frame import _debug_get_cache_entry_list

            for entry in _debug_get_cache_entry_list(f.__code__):
                reasons.append(entry.guard_manager.check_verbose({"h": holder, "x": x}).verbose_code_parts)
            return counter.frame_count, reasons

        frames, reasons = run()
        # A recompile per changed value (guarded through the sources' values), the last
        # call hits the third entry.
        self.assertEqual(frames, 3)
        self.assertEqual(len(reasons), 3)
        # Newest first: it passes; the older two fail on the value changed after them.
        self.assertEqual(reasons[0], [])
        self.assertEqual(
            [r[0].split()[:3] for r in reasons[1:]],
            [["L['h'].items[1]", "==", "20"], ["L['h'].cfg['scale']", "==", "2.0"]],
        )


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
