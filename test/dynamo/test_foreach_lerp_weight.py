# Owner(s): ["module: dynamo"]
"""torch._foreach_lerp_ with a Python-number weight is traced as the native foreach
op, as later torch releases do, not through the polyfill's one
full_like per element; tensor weights still take the polyfill. Values equal eager's
after every call."""

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounterWithBackend


def count_targets(gm, target):
    return sum(1 for node in gm.graph.nodes if node.op == "call_function" and node.target is target)


def lerp_step(xs, ends, weight):
    torch._foreach_lerp_(xs, ends, weight)
    return xs[0] * 2


class ForeachLerpWeightTests(torch._dynamo.test_case.TestCase):
    def run_lerp(self, n, weight, backend="eager", exact=True, calls=3):
        """Compiled lerp steps vs eager's, values after every call (bitwise if exact);
        the one graph compiled."""
        torch._dynamo.reset()  # a weight seen before with another value would be dynamic
        gen = torch.Generator().manual_seed(0)
        xs = [torch.randn(4, 3, generator=gen) for _ in range(n)]
        ref = [x.clone() for x in xs]
        counter = CompileCounterWithBackend(backend)
        fn = torch.compile(lerp_step, backend=counter, fullgraph=True)
        tol = {"atol": 0, "rtol": 0} if exact else {}
        for _ in range(calls):
            ends = [torch.randn(4, 3, generator=gen) for _ in range(n)]
            self.assertEqual(fn(xs, ends, weight), lerp_step(ref, ends, weight), **tol)
            for x, r in zip(xs, ref):
                self.assertEqual(x, r, **tol)
        self.assertEqual(counter.frame_count, 1)
        return counter.graphs[0]

    def test_scalar_weight_native_op(self):
        for n, weight in ((1, 0.1), (40, 0.1), (5, 0.9), (5, -0.2), (5, 1)):
            gm = self.run_lerp(n, weight)
            self.assertEqual(count_targets(gm, torch._foreach_lerp_), 1)
            self.assertEqual(count_targets(gm, torch.full_like), 0)
            self.assertEqual(count_targets(gm, torch._foreach_addcmul_), 0)

    def test_tensor_weight_still_decomposed(self):
        # A tensor weight keeps the polyfill (inductor's lerp_scalar lowering would
        # call float() on it).
        gm = self.run_lerp(4, torch.tensor(0.1), exact=False)
        self.assertEqual(count_targets(gm, torch._foreach_lerp_), 0)
        self.assertEqual(count_targets(gm, torch._foreach_addcmul_), 1)

    def test_changing_weight(self):
        # A float weight that changes between calls may be traced as a SymFloat on
        # the recompile: not a constant, it keeps the polyfill; values stay eager's.
        counter = CompileCounterWithBackend("eager")
        fn = torch.compile(lerp_step, backend=counter, fullgraph=True)
        gen = torch.Generator().manual_seed(0)
        xs = [torch.randn(4, 3, generator=gen) for _ in range(3)]
        ref = [x.clone() for x in xs]
        for weight in (0.1, 0.2, 0.3, 0.7):
            ends = [torch.randn(4, 3, generator=gen) for _ in range(3)]
            self.assertEqual(fn(xs, ends, weight), lerp_step(ref, ends, weight))
            for x, r in zip(xs, ref):
                self.assertEqual(x, r)
        self.assertEqual(count_targets(counter.graphs[0], torch._foreach_lerp_), 1)
        # 0.1 as a constant (native op), 0.2 and 0.3 recompile as the weight turns
        # dynamic (polyfill); 0.7 reuses the last graph.
        self.assertEqual([count_targets(g, torch._foreach_lerp_) for g in counter.graphs], [1, 0, 0])
        self.assertEqual(counter.frame_count, 3)

    def test_inductor_scalar_weight(self):
        self.run_lerp(3, 0.1, backend="inductor", exact=False, calls=2)

    def test_adam_foreach_matches_eager(self):
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(3, 2, generator=gen)) for _ in range(6)]
        eager_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt = torch.optim.Adam(params, lr=1e-2, foreach=True)
        eager_opt = torch.optim.Adam(eager_params, lr=1e-2, foreach=True)
        counter = CompileCounterWithBackend("eager")
        step = torch.compile(opt.step, backend=counter)
        for i in range(4):
            g = torch.Generator().manual_seed(10 + i)
            for p, q in zip(params, eager_params):
                p.grad = torch.randn(3, 2, generator=g)
                q.grad = p.grad.clone()
            step()
            eager_opt.step()
            for p, q in zip(params, eager_params):
                # The compiled step is capturable (tensor bias corrections): close, not bitwise.
                self.assertEqual(p, q)
                self.assertEqual(opt.state[p]["exp_avg"], eager_opt.state[q]["exp_avg"])
                self.assertEqual(opt.state[p]["exp_avg_sq"], eager_opt.state[q]["exp_avg_sq"])
                self.assertEqual(opt.state[p]["step"], eager_opt.state[q]["step"])
        self.assertEqual(counter.frame_count, 1)
        self.assertEqual([count_targets(gm, torch.full_like) for gm in counter.graphs], [0])
        self.assertEqual([count_targets(gm, torch._foreach_lerp_) for gm in counter.graphs], [1])


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
