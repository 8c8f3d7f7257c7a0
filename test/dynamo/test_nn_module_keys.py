# Owner(s): ["module: dynamo"]
"""OutputGraph.register_attr_or_module finds the key of an already registered module
or static tensor through an id map (config.nn_module_key_index,
torch/_dynamo/nn_module_keys.py) instead of walking nn_modules per registration.
The key found is the walk's (the first one holding the object) after any sequence of
additions, outside insertions, clear() and replacement by a copy; graphs, frame
counts and values are the same as without the map."""

import random

import torch
import torch._dynamo.test_case
from torch._dynamo.nn_module_keys import NNModuleKeys
from torch._dynamo.testing import CompileCounterWithBackend


def walk(nn_modules, target):
    return next((key for key, value in nn_modules.items() if value is target), None)


class CountingDict(dict):
    walks = 0

    def items(self):
        CountingDict.walks += 1
        return super().items()


class NNModuleKeysTests(torch._dynamo.test_case.TestCase):
    def test_finds_the_first_key_by_identity(self):
        keys, modules = NNModuleKeys(), {}
        a, b = torch.zeros(2), torch.zeros(2)  # equal values, distinct objects
        keys.add(modules, "a", a)
        self.assertIsNone(keys.find(modules, b))
        keys.add(modules, "b", b)
        modules["a_again"] = a  # inserted without the map
        keys.add(modules, "b_again", b)
        self.assertEqual((keys.find(modules, a), keys.find(modules, b)), ("a", "b"))
        keys.add(modules, "a", b)  # a key given another object
        self.assertEqual((keys.find(modules, a), keys.find(modules, b)), ("a_again", "a"))
        modules.clear()
        self.assertIsNone(keys.find(modules, a))

    def test_agrees_with_the_walk(self):
        rng = random.Random(0)
        objects = [torch.zeros(1) for _ in range(12)]
        keys, modules, snapshots = NNModuleKeys(), {}, []
        for step in range(3000):
            op = rng.random()
            target = rng.choice(objects)
            if op < 0.45:
                keys.add(modules, f"k{rng.randrange(40)}", target)
            elif op < 0.6:
                key = f"o{step}"  # an insertion elsewhere, under a new key
                modules[key] = target
            elif op < 0.7:
                snapshots.append(dict(modules))  # copy_graphstate
            elif op < 0.78 and snapshots:
                modules = dict(rng.choice(snapshots))  # restore_graphstate installs a copy
            elif op < 0.8:
                modules.clear()
            elif op < 0.82 and modules:
                # Overwritten elsewhere with an object already held: the key found
                # still holds the object.
                modules[rng.choice(list(modules))] = rng.choice(list(modules.values()))
                for obj in objects:
                    found = keys.find(modules, obj)
                    self.assertIs(found is None, walk(modules, obj) is None, step)
                    self.assertTrue(found is None or modules[found] is obj, step)
                keys = NNModuleKeys()  # the walk's order from here on
            for obj in objects:
                self.assertIs(keys.find(modules, obj), walk(modules, obj), step)

    def test_no_walk_per_lookup(self):
        objects = [torch.zeros(1) for _ in range(100)]
        for index, expected_walks in ((True, 1), (False, 100)):
            CountingDict.walks = 0
            keys, modules = NNModuleKeys(), CountingDict()
            with torch._dynamo.config.patch(nn_module_key_index=index):
                for i, obj in enumerate(objects):
                    self.assertIsNone(keys.find(modules, obj))
                    keys.add(modules, f"k{i}", obj)
            self.assertEqual(CountingDict.walks, expected_walks)

    def test_optimizer_graphs_same_as_without(self):
        def make(params):
            return torch.optim.Adam(params, lr=0.01, foreach=True)

        results = []
        for index in (True, False):
            torch._dynamo.reset()
            gen = torch.Generator().manual_seed(0)
            params = [torch.nn.Parameter(torch.randn(3, 2, generator=gen)) for _ in range(20)]
            ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
            opt, opt_ref = make(params), make(ref)
            counter = CompileCounterWithBackend("eager")
            with torch._dynamo.config.patch(nn_module_key_index=index):
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
            results.append((counter.frame_count, [gm.code for gm in counter.graphs]))
        self.assertEqual(results[0], results[1])
        # The step tensors and buffers of the 20 parameters are get_attr nodes.
        self.assertGreaterEqual(results[0][1][-1].count("getattr") + results[0][1][-1].count("self."), 20)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
