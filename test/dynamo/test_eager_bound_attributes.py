# Owner(s): ["module: dynamo"]
"""The eager backend binds the graph's tensor attributes as arguments (bound_attributes)."""

import torch
import torch._dynamo.test_case
from torch._dynamo import config
from torch._dynamo.backends.debugging import eager
from torch._dynamo.testing import CompileCounterWithBackend


class RecordingEager:
    """backend="eager", keeping what it returned for each graph."""

    def __init__(self):
        self.compiled = []

    def __call__(self, gm, example_inputs):
        fn = eager(gm, example_inputs)
        self.compiled.append((gm, fn))
        return fn


def tensor_attribute_loads(fn):
    """How many tensor attributes the module run by fn loads as self.<name>."""
    gm = getattr(fn, "func", fn).__self__
    return sum(
        1
        for node in gm.graph.nodes
        if node.op == "get_attr" and isinstance(getattr(gm, node.target), torch.Tensor)
    )


STATIC = torch.arange(4.0)
torch._dynamo.mark_static_address(STATIC, guard=True)


def add_static(x):
    return x + STATIC


class EagerBoundAttributeTests(torch._dynamo.test_case.TestCase):
    def compile(self, fn):
        recording = RecordingEager()
        cnt = CompileCounterWithBackend(recording)
        return torch.compile(fn, backend=cnt), cnt, recording

    def test_optimizer_state_is_passed_not_loaded(self):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(3, 3)) for _ in range(8)]
        ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True)
        ref = torch.optim.SGD(ref_params, lr=0.1, momentum=0.9, foreach=True)
        compiled, cnt, recording = self.compile(opt.step)
        for i in range(4):
            for p, q in zip(params, ref_params):
                p.grad = torch.full_like(p, 0.5 + i)
                q.grad = p.grad.clone()
            compiled()
            ref.step()
            for p, q in zip(params, ref_params):
                self.assertEqual(p, q)
            for s, r in zip(opt.state.values(), ref.state.values()):
                self.assertEqual(s["momentum_buffer"], r["momentum_buffer"])
        self.assertEqual(cnt.frame_count, 2)  # the first call creates the momentum buffers
        gm, fn = recording.compiled[-1]
        # The steady-state graph reads params and buffers as attributes; the
        # callable gets them as arguments.
        self.assertEqual(sum(1 for n in gm.graph.nodes if n.op == "get_attr"), 16)
        self.assertEqual(tensor_attribute_loads(fn), 0)
        self.assertEqual(len(fn.args), 16)
        bound = {id(a) for a in fn.args}
        state = {id(s["momentum_buffer"]) for s in opt.state.values()}
        self.assertEqual(bound, {id(p) for p in params} | state)

    def test_in_place_changes_are_seen_and_replacement_recompiles(self):
        global STATIC
        compiled, cnt, recording = self.compile(add_static)
        x = torch.ones(4)
        self.assertEqual(compiled(x), add_static(x))
        _, fn = recording.compiled[-1]
        self.assertEqual(tensor_attribute_loads(fn), 0)
        self.assertIs(fn.args[0], STATIC)
        saved = STATIC
        try:
            STATIC.mul_(2)  # the bound tensor is the attribute itself
            self.assertEqual(compiled(x), add_static(x))
            self.assertEqual(cnt.frame_count, 1)
            STATIC = torch.full((4,), 7.0)
            torch._dynamo.mark_static_address(STATIC, guard=True)
            self.assertEqual(compiled(x), add_static(x))  # its ID_MATCH failed
            self.assertEqual(cnt.frame_count, 2)
            self.assertIs(recording.compiled[-1][1].args[0], STATIC)
        finally:
            STATIC = saved

    def test_switch_off_runs_the_module_forward(self):
        with config.patch(eager_backend_binds_tensor_attributes=False):
            compiled, _, recording = self.compile(add_static)
            x = torch.ones(4)
            self.assertEqual(compiled(x), add_static(x))
        gm, fn = recording.compiled[-1]
        self.assertIs(fn.__self__, gm)  # gm.forward
        self.assertEqual(tensor_attribute_loads(fn), 1)

    def test_graph_without_tensor_attributes_is_unchanged(self):
        def double(x):
            return x * 2

        compiled, _, recording = self.compile(double)
        x = torch.randn(3)
        self.assertEqual(compiled(x), double(x))
        gm, fn = recording.compiled[-1]
        self.assertIs(fn.__self__, gm)  # gm.forward

    def test_module_parameters_and_submodule_attributes(self):
        # Without inlining nn.Modules, parameters are get_attr nodes too;
        # gradients flow to the same Parameters.
        torch.manual_seed(0)
        mod = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        ref = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        ref.load_state_dict(mod.state_dict())
        with config.patch(inline_inbuilt_nn_modules=False):
            compiled, cnt, recording = self.compile(mod)
            x = torch.randn(5, 4)
            compiled(x).sum().backward()
        ref(x).sum().backward()
        for p, q in zip(mod.parameters(), ref.parameters()):
            self.assertEqual(p.grad, q.grad)
        _, fn = recording.compiled[-1]
        self.assertEqual(tensor_attribute_loads(fn), 0)
        self.assertEqual(cnt.frame_count, 1)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
