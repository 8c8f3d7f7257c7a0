# Owner(s): ["module: dynamo"]
"""A compiled function called once per parameter (an optimizer's per-parameter helper, Muon's
Newton-Schulz iteration) with Parameters of many shapes: automatic dynamic makes the size
dynamic after the first change, as for any tensor argument, instead of one graph per shape
until the recompile limit. Parameters reached through a module stay static."""

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)

SHAPES = [(16, 32), (32, 32), (64, 32), (32, 128), (128, 64), (8, 8), (256, 16), (48, 96),
          (96, 48), (24, 40), (40, 24), (12, 200)]


def newton_schulz(G, steps: int = 3):
    # Muon's orthogonalization, without its transposition branch (a branch on the shape
    # costs one graph per side, as for any tensor).
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G / (G.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X


def sgd_update(p, lr: float):
    with torch.no_grad():
        p.sub_(lr * p.grad)
    return p


class ParameterArgumentShapeTests(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        torch.manual_seed(0)
        self.params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_helper_over_parameter_shapes(self, backend):
        # Without this patch every shape is a new static graph: the recompile limit (8)
        # is hit at the 9th shape and the rest run eagerly.
        cnt = CompileCounterWithBackend(backend)
        compiled = torch.compile(newton_schulz, backend=cnt)
        for _ in range(3):
            for p in self.params:
                self.assertEqual(compiled(p), newton_schulz(p), atol=1e-4, rtol=1e-4)
        # automatic dynamic: the first shape static, then dim 0 dynamic (32x32), then
        # both (32x128); the other 9 shapes and the later passes reuse that graph.
        # Inductor's CPU reduction adds one size class: its kernel guards
        # `G.size()[1]*G.size()[0] <= 4096` (need_use_acc_helper), 128x64 is past it.
        frames = 4 if backend == "inductor" else 3
        self.assertEqual(cnt.frame_count, frames)
        self.assertEqual(counters["stats"]["unique_graphs"], frames)
        self.assertNotIn("recompile_limit", dict(counters["frames"]))

    def test_parameter_like_plain_tensor(self):
        # The same helper over plain tensors of these shapes: the same graphs.
        counts = []
        for make in (lambda p: p, lambda p: p.detach().clone()):
            torch._dynamo.reset()
            cnt = CompileCounterWithBackend("eager")
            compiled = torch.compile(newton_schulz, backend=cnt)
            for p in self.params:
                compiled(make(p))
            counts.append(cnt.frame_count)
        self.assertEqual(counts, [3, 3])

    def test_in_place_update_per_parameter(self):
        # An in-place update of each parameter through the helper: values and the
        # parameters themselves as eager after every call.
        eager = [torch.nn.Parameter(p.detach().clone()) for p in self.params]
        for p, q in zip(self.params, eager):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        cnt = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(sgd_update, backend=cnt)
        for _ in range(2):
            for p, q in zip(self.params, eager):
                out = compiled(p, 0.1)
                sgd_update(q, 0.1)
                self.assertIs(out, p)
                self.assertEqual(p, q, atol=0, rtol=0)
        self.assertEqual(cnt.frame_count, 3)

    def test_same_shape_parameters_one_graph(self):
        cnt = CompileCounterWithBackend("eager")
        compiled = torch.compile(newton_schulz, backend=cnt)
        for p in [torch.nn.Parameter(torch.randn(8, 4)) for _ in range(4)]:
            self.assertEqual(compiled(p), newton_schulz(p))
        self.assertEqual(cnt.frame_count, 1)

    def test_module_parameters_stay_static(self):
        # A parameter reached through a module is part of that model: modules of
        # different widths keep one static graph each, as without this patch.
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm

        def forward(mod, x):
            return mod(x)

        compiled = torch.compile(forward, backend=backend)
        x = torch.randn(2, 4)
        for width in (3, 5, 7):
            mod = torch.nn.Linear(4, width)
            self.assertEqual(compiled(mod, x), mod(x))
        self.assertEqual(len(graphs), 3)
        for gm in graphs:
            for node in gm.graph.find_nodes(op="placeholder"):
                self.assertNotIsInstance(node.meta["example_value"], torch.SymInt)
                value = node.meta["example_value"]
                if isinstance(value, torch.Tensor):
                    self.assertTrue(all(isinstance(s, int) for s in value.shape), node)

    def test_all_parameters_dynamic_with_the_switch_off(self):
        # With force_parameter_static_shapes off everything is dynamic anyway; on
        # (default) only a frame argument follows automatic dynamic.
        with torch._dynamo.config.patch(force_parameter_static_shapes=False):
            cnt = CompileCounterWithBackend("eager")
            compiled = torch.compile(newton_schulz, backend=cnt)
            for p in self.params:
                self.assertEqual(compiled(p), newton_schulz(p), atol=1e-4, rtol=1e-4)
            self.assertEqual(cnt.frame_count, 3)


instantiate_parametrized_tests(ParameterArgumentShapeTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
