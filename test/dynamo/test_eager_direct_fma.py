# Owner(s): ["module: dynamo"]
"""The eager backend calls the fma prim's computation directly (direct_fma)."""

import torch
import torch._dynamo.test_case
from torch._dynamo import config
from torch._dynamo.backends.direct_fma import fma_reference
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor import inductor_prims

try:
    from .test_eager_bound_attributes import RecordingEager
except ImportError:
    from test_eager_bound_attributes import RecordingEager


def run_module(fn):
    """The GraphModule whose forward fn runs."""
    return getattr(fn, "func", fn).__self__


def count_calls(gm, target):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def addcmul_into(buf, a, b):
    with torch.no_grad():
        buf.addcmul_(a, b, value=0.3)
        buf.addcdiv_(a, b.abs() + 1, value=-0.2)
        buf.add_(a, alpha=torch.tensor(0.5))
    return buf * 2


class EagerDirectFmaTests(torch._dynamo.test_case.TestCase):
    def compile(self, fn):
        recording = RecordingEager()
        cnt = CompileCounterWithBackend(recording)
        return torch.compile(fn, backend=cnt), cnt, recording

    def adamw_steps(self, steps=4):
        """Run AdamW(foreach=False) compiled and eager with the same grads; return the
        compiled optimizer's params and state after each step, and the recording."""
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(3, 3)) for _ in range(5)]
        ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt = torch.optim.AdamW(params, lr=0.01, foreach=False)
        ref = torch.optim.AdamW(ref_params, lr=0.01, foreach=False)
        compiled, cnt, recording = self.compile(opt.step)
        history = []
        for i in range(steps):
            for p, q in zip(params, ref_params):
                p.grad = torch.randn(3, 3) * (i + 1)
                q.grad = p.grad.clone()
            compiled()
            ref.step()
            self.assertEqual(params, ref_params)
            # Every state entry (exp_avg, exp_avg_sq, step), as eager has them.
            self.assertEqual([dict(s) for s in opt.state.values()], [dict(r) for r in ref.state.values()])
            history.append(
                [p.detach().clone() for p in params]
                + [t.clone() for s in opt.state.values() for t in (s["exp_avg"], s["exp_avg_sq"], s["step"])]
            )
        self.assertEqual(cnt.frame_count, 1)
        return history, recording

    def test_adamw_step_calls_fma_directly(self):
        history, recording = self.adamw_steps()
        gm, fn = recording.compiled[-1]
        # Dynamo's graph keeps the prim (addcmul_ with value, one per parameter); the
        # module the backend runs calls its computation instead, with the
        # optimizer's tensors still bound as arguments.
        self.assertEqual(count_calls(gm, inductor_prims.fma), 5)
        module = run_module(fn)
        self.assertIsNot(module, gm)
        self.assertEqual(count_calls(module, inductor_prims.fma), 0)
        self.assertEqual(count_calls(module, fma_reference), 5)
        self.assertNotIn("prims.fma", module.code)
        self.assertGreater(len(fn.args), 0)
        self.assertEqual(sum(1 for n in module.graph.nodes if n.op == "get_attr"), 0)
        # Bit for bit what the prim computes.
        with config.patch(eager_backend_calls_fma_directly=False):
            history_off, recording_off = self.adamw_steps()
        self.assertEqual(count_calls(run_module(recording_off.compiled[-1][1]), inductor_prims.fma), 5)
        for on, off in zip(history, history_off):
            for a, b in zip(on, off):
                self.assertTrue(torch.equal(a, b))

    def test_graph_without_tensor_attributes(self):
        compiled, cnt, recording = self.compile(addcmul_into)
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            torch.manual_seed(1)
            a, b, buf = (torch.randn(8, dtype=dtype) for _ in range(3))
            ref_buf = buf.clone()
            with config.patch(eager_backend_calls_fma_directly=False):
                off_buf = buf.clone()
                off = torch.compile(addcmul_into, backend="eager")(off_buf, a, b)
            out = compiled(buf, a, b)
            self.assertEqual(out, addcmul_into(ref_buf, a, b))
            self.assertEqual(buf, ref_buf)
            self.assertTrue(torch.equal(out, off))
            self.assertTrue(torch.equal(buf, off_buf))
        self.assertEqual(cnt.frame_count, 3)  # one graph per dtype
        for gm, fn in recording.compiled:
            self.assertEqual(count_calls(gm, inductor_prims.fma), 3)
            module = run_module(fn)
            self.assertIsNot(module, gm)
            self.assertEqual(count_calls(module, fma_reference), 3)
            self.assertEqual(count_calls(module, inductor_prims.fma), 0)

    def test_node_recording_grad_keeps_the_prim(self):
        def fn(w, a, b):
            x = w * 2
            x.addcmul_(a, b, value=0.5)
            return x.sum()

        compiled, cnt, recording = self.compile(fn)
        w = torch.randn(4, requires_grad=True)
        a, b = torch.randn(4), torch.randn(4)
        compiled(w, a, b).backward()
        grad = w.grad.clone()
        w.grad = None
        fn(w, a, b).backward()
        self.assertEqual(grad, w.grad)
        gm, runtime = recording.compiled[-1]
        self.assertEqual(count_calls(gm, inductor_prims.fma), 1)
        # Its output records autograd history: the prim, with its backward, stays.
        self.assertIs(run_module(runtime), gm)
        self.assertEqual(cnt.frame_count, 1)

    def test_tensor_subclass_keeps_the_prim(self):
        from torch.testing._internal.two_tensor import TwoTensor

        compiled, cnt, recording = self.compile(addcmul_into)
        a, b, buf = (TwoTensor(torch.randn(8), torch.randn(8)) for _ in range(3))
        ref_buf = buf.clone()
        out = compiled(buf, a, b)
        self.assertEqual(out, addcmul_into(ref_buf, a, b))
        self.assertEqual(buf, ref_buf)
        gm, fn = recording.compiled[-1]
        self.assertEqual(count_calls(gm, inductor_prims.fma), 3)
        self.assertIs(run_module(fn), gm)
        self.assertEqual(cnt.frame_count, 1)

    def test_switch_off_runs_the_prim(self):
        with config.patch(eager_backend_calls_fma_directly=False):
            compiled, _, recording = self.compile(addcmul_into)
            a, b, buf = torch.randn(8), torch.randn(8), torch.randn(8)
            compiled(buf, a, b)
        gm, fn = recording.compiled[-1]
        self.assertIs(run_module(fn), gm)
        self.assertEqual(count_calls(gm, inductor_prims.fma), 3)

    def test_reference_matches_the_prim_bit_for_bit(self):
        torch.manual_seed(2)
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            a, c = torch.randn(64, dtype=dtype), torch.randn(64, dtype=dtype)
            for b in (1 - 0.999, -3.5, torch.tensor(0.3), torch.tensor(0.3, dtype=torch.float64), torch.tensor(3)):
                expected = inductor_prims.fma(a, b, c)
                got = fma_reference(a, b, c)
                self.assertEqual(got.dtype, expected.dtype)
                self.assertTrue(torch.equal(got, expected), f"{dtype} {b!r}")


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
