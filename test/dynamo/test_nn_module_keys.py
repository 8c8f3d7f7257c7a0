# Owner(s): ["module: dynamo"]
"""OutputGraph.register_attr_or_module finds the key of an already registered module
or static tensor through an id map (OutputGraph._nn_module_key) instead of walking
nn_modules per registration. The key found is the walk's (the first one holding the
object) after any sequence of additions, outside insertions, clear() and replacement
by a copy; a compiled optimizer step registers each static tensor once and matches
eager."""

import random

import torch
import torch._dynamo.test_case
from torch._dynamo.output_graph import OutputGraph
from torch._dynamo.testing import CompileCounterWithBackend


class Keys:
    """OutputGraph's key map over a plain nn_modules dict: its two methods read and
    write only these attributes."""

    def __init__(self, nn_modules):
        self.nn_modules = nn_modules
        self._nn_module_keys = {}
        self._nn_module_keys_of = (None, 0)

    find = OutputGraph._nn_module_key
    add = OutputGraph._add_nn_module


def walk(nn_modules, target):
    return next((key for key, value in nn_modules.items() if value is target), None)


class CountingDict(dict):
    walks = 0

    def items(self):
        CountingDict.walks += 1
        return super().items()


class NNModuleKeysTests(torch._dynamo.test_case.TestCase):
    def test_finds_the_first_key_by_identity(self):
        modules = {}
        keys = Keys(modules)
        a, b = torch.zeros(2), torch.zeros(2)  # equal values, distinct objects
        keys.add("a", a)
        self.assertIsNone(keys.find(b))
        keys.add("b", b)
        modules["a_again"] = a  # inserted without the map
        keys.add("b_again", b)
        self.assertEqual((keys.find(a), keys.find(b)), ("a", "b"))
        keys.add("a", b)  # a key given another object
        self.assertEqual((keys.find(a), keys.find(b)), ("a_again", "a"))
        self.assertEqual(modules, {"a": b, "b": b, "a_again": a, "b_again": b})
        modules.clear()
        self.assertIsNone(keys.find(a))

    def test_agrees_with_the_walk(self):
        rng = random.Random(0)
        objects = [torch.zeros(1) for _ in range(12)]
        modules, snapshots = {}, []
        keys = Keys(modules)
        for step in range(3000):
            op = rng.random()
            target = rng.choice(objects)
            if op < 0.45:
                keys.add(f"k{rng.randrange(40)}", target)
            elif op < 0.6:
                key = f"o{step}"  # an insertion elsewhere, under a new key
                modules[key] = target
            elif op < 0.7:
                snapshots.append(dict(modules))  # copy_graphstate
            elif op < 0.78 and snapshots:
                modules = dict(rng.choice(snapshots))  # restore_graphstate installs a copy
                keys.nn_modules = modules
            elif op < 0.8:
                modules.clear()
            elif op < 0.82 and modules:
                # Overwritten elsewhere with an object already held: the key found
                # still holds the object.
                modules[rng.choice(list(modules))] = rng.choice(list(modules.values()))
                for obj in objects:
                    found = keys.find(obj)
                    self.assertIs(found is None, walk(modules, obj) is None, step)
                    self.assertTrue(found is None or modules[found] is obj, step)
                keys = Keys(modules)  # the walk's order from here on
            for obj in objects:
                self.assertIs(keys.find(obj), walk(modules, obj), step)

    def test_no_walk_per_lookup(self):
        # Without this patch: one walk per registration, 100.
        objects = [torch.zeros(1) for _ in range(100)]
        CountingDict.walks = 0
        keys = Keys(CountingDict())
        for i, obj in enumerate(objects):
            self.assertIsNone(keys.find(obj))
            keys.add(f"k{i}", obj)
        self.assertEqual(CountingDict.walks, 1)

    def test_optimizer_registers_each_tensor_once(self):
        torch._dynamo.reset()
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(3, 2, generator=gen)) for _ in range(20)]
        ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt = torch.optim.Adam(params, lr=0.01, foreach=True)
        opt_ref = torch.optim.Adam(ref, lr=0.01, foreach=True)
        counter = CompileCounterWithBackend("eager")
        step = torch.compile(opt.step, backend=counter)
        for _ in range(3):
            for p, r in zip(params, ref):
                p.grad = torch.randn(3, 2, generator=gen)
                r.grad = p.grad.clone()
            step()
            opt_ref.step()
            self.assertEqual(params, ref)
            for p, r in zip(params, ref):
                self.assertEqual(opt.state[p], opt_ref.state[r])
        self.assertEqual(counter.frame_count, 1)
        gm = counter.graphs[0]
        attrs = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
        # The parameters, both moment buffers and the step of each of the 20
        # parameters, each under one key.
        self.assertEqual(len(attrs), 4 * 20)
        self.assertEqual(len({id(a) for a in attrs}), len(attrs))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
