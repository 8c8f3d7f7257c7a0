# Owner(s): ["module: dynamo"]
"""An in-place foreach op returns its `self` list or tuple, as its Python binding
does (variables/torch.py _returns_self_argument): no getitem node and no new
TensorVariable per element, and `torch._foreach_mul_(xs, 2) is xs` as in eager.
Values and Python state equal eager's after every call; graphs are unchanged."""

import operator
from unittest import mock

import torch
import torch._dynamo.test_case
from torch._dynamo.output_graph import SubgraphTracer
from torch._dynamo.testing import CompileCounterWithBackend


def inplace_results(xs, ts):
    r = torch._foreach_mul_(xs, 2.0)
    s = torch._foreach_add_(ts, ts)
    same_list = r is xs
    r.append(xs[0] + 1)  # the returned list is the argument: eager's xs grows too
    return same_list, r[0] is xs[0], s[0] is ts[0], type(s) is tuple, len(xs), xs[-1] * s[0].sum()


def foreach_chain(xs, ys):
    torch._foreach_mul_(xs, 0.9)
    torch._foreach_add_(xs, ys, alpha=0.1)
    torch._foreach_addcmul_(xs, ys, ys, value=0.5)
    return xs[0].sum()


def out_of_place(xs):
    r = torch._foreach_add(xs, 1.0)
    return r is xs, r[0] is xs[0], r[0] * 2


def getitem_proxies_created(fn, *args):
    """Call compiled fn; count the operator.getitem proxies tracing created (before
    dead code elimination, which removes unused ones from the graph)."""
    created = []
    original = SubgraphTracer.create_proxy

    def counting(self, kind, target, *rest, **kwargs):
        if kind == "call_function" and target is operator.getitem:
            created.append(target)
        return original(self, kind, target, *rest, **kwargs)

    torch._dynamo.reset()
    with mock.patch.object(SubgraphTracer, "create_proxy", counting):
        result = torch.compile(fn, backend="eager", fullgraph=True)(*args)
    return result, len(created)


class InplaceForeachResultTests(torch._dynamo.test_case.TestCase):
    def test_result_is_the_argument(self):
        counter = CompileCounterWithBackend("eager")
        fn = torch.compile(inplace_results, backend=counter, fullgraph=True)
        gen = torch.Generator().manual_seed(0)
        xs = [torch.randn(3, generator=gen) for _ in range(4)]
        ts = tuple(torch.randn(3, generator=gen) for _ in range(2))
        xs_ref, ts_ref = [x.clone() for x in xs], tuple(t.clone() for t in ts)
        for _ in range(2):
            xs, xs_ref = xs[:4], xs_ref[:4]
            got, expected = fn(xs, ts), inplace_results(xs_ref, ts_ref)
            self.assertEqual(got, expected)
            self.assertEqual(got[:5], (True, True, True, True, 5))
            self.assertEqual(xs, xs_ref)  # values and the appended element
            self.assertEqual(ts, ts_ref)
        self.assertEqual(counter.frame_count, 1)

    def test_no_getitem_per_element(self):
        gen = torch.Generator().manual_seed(0)
        xs = [torch.randn(2, generator=gen) for _ in range(50)]
        ys = [torch.randn(2, generator=gen) for _ in range(50)]
        ref = [x.clone() for x in xs]
        result, created = getitem_proxies_created(foreach_chain, xs, ys)
        self.assertEqual(result, foreach_chain(ref, ys))
        self.assertEqual(xs, ref)
        # Without this patch: one per element of each of the three results, 150.
        self.assertEqual(created, 0)

    def test_graph_holds_the_ops_in_order(self):
        # The graph after dead code elimination, as without this patch: the three
        # in-place ops and the sum, no getitem of their results.
        gen = torch.Generator().manual_seed(0)
        xs = [torch.randn(2, 2, generator=gen) for _ in range(6)]
        ys = [torch.randn(2, 2, generator=gen) for _ in range(6)]
        ref = [x.clone() for x in xs]
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("eager")
        got = torch.compile(foreach_chain, backend=counter, fullgraph=True)(xs, ys)
        self.assertEqual(got, foreach_chain(ref, ys))
        self.assertEqual(xs, ref)
        self.assertEqual(counter.frame_count, 1)
        calls = [n.target for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
        self.assertEqual(
            calls[:3], [torch._foreach_mul_, torch._foreach_add_, torch._foreach_addcmul_]
        )
        self.assertNotIn(operator.getitem, calls[:3])

    def test_out_of_place_foreach_returns_new_tensors(self):
        xs = [torch.ones(2), torch.zeros(3)]
        got = torch.compile(out_of_place, backend="eager", fullgraph=True)(xs)
        self.assertEqual(got, out_of_place(xs))
        self.assertEqual(got[:2], (False, False))

    def test_length_mismatch_raises_like_eager(self):
        def mismatched(xs, ys):
            torch._foreach_add_(xs, ys)
            return xs[0] + 1

        xs, ys = [torch.ones(2), torch.ones(2)], [torch.ones(2)]
        with self.assertRaises(RuntimeError):
            mismatched(xs, ys)
        with self.assertRaisesRegex(Exception, "same length|must have the same"):
            torch.compile(mismatched, backend="eager", fullgraph=True)(xs, ys)
        self.assertEqual(xs, [torch.ones(2), torch.ones(2)])

    def test_optimizers_match_eager(self):
        def make(kind, params):
            if kind == "sgd":
                return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True)
            return torch.optim.Adam(params, lr=0.01, foreach=True)

        # SGD compiles twice: its first step creates the momentum buffers.
        for kind, frames in (("sgd", 2), ("adam", 1)):
            torch._dynamo.reset()
            gen = torch.Generator().manual_seed(0)
            params = [torch.nn.Parameter(torch.randn(3, 2, generator=gen)) for _ in range(8)]
            ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
            opt, opt_ref = make(kind, params), make(kind, ref)
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
            self.assertEqual(counter.frame_count, frames, kind)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
