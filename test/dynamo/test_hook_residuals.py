# Owner(s): ["module: dynamo"]
"""Tensor hook handles that enter or leave a compiled frame (config.hook_residuals).

Every case runs the same protocol eagerly and compiled (CompileCounter with the
eager backend, aot_eager, and aot_eager under compiled autograd): call twice; after
each call count the hooks on the input, the returned tensors and the parameters,
run backward, record gradients and how often hooks fired, then remove() every
handle the call returned or stored and count the hooks again.
"""

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo import compiled_autograd
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.utils.hooks import RemovableHandle


FIRED = []


def double(g):
    return g * 2


def log_and_double(g):
    FIRED.append("log_and_double")
    return g * 2


def log_only(g):
    # Returns None: the gradient is unchanged.
    FIRED.append("log_only")


def inspect_only(g):
    # Returns None: the gradient is unchanged.
    g.sum()


def scale_grad(p):
    FIRED.append("post_accumulate")
    p.grad.mul_(3)


def forward_hook(mod, args, out):
    return out + 1


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 3)
        self.h = None
        self.handles = []


# Each case: fn(m, x), graph breaks expected patched (0 unless documented in the
# README as out of scope), and whether the protocol removes handles before backward.
def input_returned(m, x):
    h = x.register_hook(double)
    return x.sin(), h


def input_removed_before_backward(m, x):
    h = x.register_hook(double)
    return x.sin(), h


def input_removed_in_frame(m, x):
    h = x.register_hook(double)
    y = x.sin()
    h.remove()
    return y


def intermediate_removed_in_frame(m, x):
    y = x * 2
    h = y.register_hook(double)
    z = y.sin()
    h.remove()
    return z


def intermediate_dropped_handle(m, x):
    y = x * 2
    y.register_hook(double)
    return y.sin()


def intermediate_returned(m, x):
    y = x * 2
    h = y.register_hook(double)
    return y.sin(), h


def intermediate_removed_before_backward(m, x):
    y = x * 2
    h = y.register_hook(double)
    return y.sin(), h


def intermediate_on_attribute(m, x):
    y = x * 2
    m.h = y.register_hook(double)
    return y.cos()


def output_returned(m, x):
    y = x * 2
    h = y.register_hook(double)
    return y, h


def output_removed_before_backward(m, x):
    y = x * 2
    h = y.register_hook(double)
    return y, h


def output_on_attribute(m, x):
    y = m.lin(x)
    m.h = y.register_hook(log_and_double)
    return y


def output_in_list(m, x):
    y = x.sin()
    m.handles.append(y.register_hook(double))
    m.handles.append(y.register_hook(log_only))
    return y


def output_handle_dropped(m, x):
    y = x * 2
    y.register_hook(double)
    return y


def params_loop(m, x):
    for p in m.parameters():
        m.handles.append(p.register_hook(double))
    return m.lin(x)


def closure_over_intermediate(m, x):
    scale = x.detach().sum()
    y = x * 2
    h = y.register_hook(lambda g: g * scale)
    return y, h


def lambda_on_input(m, x):
    k = 3
    return x.cos(), x.register_hook(lambda g: g * k)


def post_accumulate_grad(m, x):
    m.h = m.lin.weight.register_post_accumulate_grad_hook(scale_grad)
    return m.lin(x)


def removed_in_later_call(m, x):
    if m.h is not None:
        m.h.remove()
        m.h = None
    else:
        m.h = x.register_hook(double)
    return x.sin()


def reregister(m, x):
    if m.h is not None:
        m.h.remove()
    m.h = x.register_hook(double)
    return x.sin()


def input_hook_then_graph_break(m, x):
    h = x.register_hook(double)
    torch._dynamo.graph_break()
    return x.sin(), h


def output_handle_across_graph_break(m, x):
    y = x * 2
    h = y.register_hook(log_and_double)
    torch._dynamo.graph_break()
    return y + 0, h


def intermediate_side_effect_hook(m, x):
    y = x * 2
    y.register_hook(log_and_double)
    return y.sin()


def intermediate_hook_returns_none(m, x):
    y = x * 2
    y.register_hook(inspect_only)
    return y.sin()


BREAK_UNLESS_CA = {"eager": 1, "aot_eager": 1, "compiled_autograd": 0}

# name -> (fn, expected graph breaks patched, remove handles before backward)
CASES = {
    "input_returned": (input_returned, 0, False),
    "input_removed_before_backward": (input_removed_before_backward, 0, True),
    "input_removed_in_frame": (input_removed_in_frame, 0, False),
    "intermediate_removed_in_frame": (intermediate_removed_in_frame, 0, False),
    "intermediate_dropped_handle": (intermediate_dropped_handle, 0, False),
    # The tensor is used in the graph: the hook must see the in-graph gradient,
    # so a removable registration runs eagerly at a graph break. Compiled
    # autograd calls the hook from a BackwardState, which its handle can clear.
    "intermediate_returned": (intermediate_returned, BREAK_UNLESS_CA, False),
    "intermediate_removed_before_backward": (
        intermediate_removed_before_backward,
        BREAK_UNLESS_CA,
        True,
    ),
    "intermediate_on_attribute": (intermediate_on_attribute, BREAK_UNLESS_CA, False),
    "output_returned": (output_returned, 0, False),
    "output_removed_before_backward": (output_removed_before_backward, 0, True),
    "output_on_attribute": (output_on_attribute, 0, False),
    "output_in_list": (output_in_list, 0, False),
    "output_handle_dropped": (output_handle_dropped, 0, False),
    "params_loop": (params_loop, 0, False),
    "closure_over_intermediate": (closure_over_intermediate, 0, False),
    "lambda_on_input": (lambda_on_input, 0, False),
    "post_accumulate_grad": (post_accumulate_grad, 0, False),
    "removed_in_later_call": (removed_in_later_call, 0, False),
    "reregister": (reregister, 0, False),
    # The user's own graph break.
    "input_hook_then_graph_break": (input_hook_then_graph_break, 1, False),
    "output_handle_across_graph_break": (output_handle_across_graph_break, 1, False),
    "intermediate_hook_returns_none": (intermediate_hook_returns_none, 0, False),
    # Out of scope (README): a hook traced into the graph cannot append to a
    # global list. Compiled autograd calls the hook itself: no graph break.
    "intermediate_side_effect_hook": (
        intermediate_side_effect_hook,
        BREAK_UNLESS_CA,
        False,
    ),
}

MODES = ("eager", "aot_eager", "compiled_autograd")


def num_hooks(t):
    return len(t._backward_hooks or {}) + len(
        getattr(t, "_post_accumulate_grad_hooks", None) or {}
    )


def kind(value):
    return "handle" if isinstance(value, RemovableHandle) else type(value).__name__


def flatten(out):
    return list(out) if isinstance(out, tuple) else [out]


def run_protocol(fn, remove_first, compiled_autograd_backend=None):
    """Returns what the user can observe; fn is the eager or compiled callable."""
    FIRED.clear()
    m = Holder()
    x = torch.randn(2, 3, requires_grad=True)
    seen = []
    for _ in range(2):
        out = flatten(fn(m, x))
        tensors = [t for t in out if isinstance(t, torch.Tensor)]
        handles = [h for h in out if isinstance(h, RemovableHandle)]
        handles += [h for h in [m.h, *m.handles] if h is not None]
        tracked = [x, *m.parameters(), *tensors]
        record = {"returned": [kind(o) for o in out]}
        record["stored"] = [kind(h) for h in [m.h, *m.handles]]
        record["out"] = [t.detach().clone() for t in tensors]
        record["hooks after call"] = [num_hooks(t) for t in tracked]
        if remove_first:
            for h in handles:
                h.remove()
        loss = sum(t.sum() for t in tensors if t.requires_grad)
        if compiled_autograd_backend is None:
            loss.backward()
        else:
            with compiled_autograd._enable(compiled_autograd_backend):
                loss.backward()
        record["grads"] = [
            None if p.grad is None else p.grad.clone() for p in [x, *m.parameters()]
        ]
        record["fired"] = list(FIRED)
        for h in handles:
            h.remove()
        m.handles.clear()
        record["hooks after remove"] = [num_hooks(t) for t in tracked]
        seen.append(record)
    return seen


def run_compiled(fn, mode, remove_first):
    """(observations, frames compiled, graph breaks, silent fallbacks)."""
    torch._dynamo.reset()
    counters.clear()
    if mode == "eager":
        cnt = CompileCounter()
    else:
        cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=cnt)
    if mode == "compiled_autograd":
        # Compiled autograd must also be on while the forward is traced.
        backend = torch.compile(backend="aot_eager")
        with compiled_autograd._enable(backend):
            seen = run_protocol(compiled, remove_first, backend)
    else:
        seen = run_protocol(compiled, remove_first)
    breaks = sum(counters["graph_break"].values())
    fallbacks = sum(counters["unimplemented"].values())
    return seen, cnt.frame_count, breaks, fallbacks


class HookResidualsTests(torch._dynamo.test_case.TestCase):
    @parametrize("mode", MODES)
    @parametrize("case", list(CASES))
    def test_matches_eager(self, case, mode):
        fn, expected_breaks, remove_first = CASES[case]
        if isinstance(expected_breaks, dict):
            expected_breaks = expected_breaks[mode]
        expected = run_protocol(fn, remove_first)
        seen, frames, breaks, fallbacks = run_compiled(fn, mode, remove_first)
        self.assertEqual(seen, expected)
        self.assertGreaterEqual(frames, 1)
        self.assertEqual(breaks, expected_breaks)
        self.assertEqual(fallbacks, 0)

    def test_intermediate_handle_is_real(self):
        # The handle of a hook on an output is the one register_hook returned at
        # runtime: removing it removes the hook from the returned tensor.
        cnt = CompileCounter()
        x = torch.randn(2, 3, requires_grad=True)
        y, h = torch.compile(output_returned, backend=cnt)(None, x)
        self.assertIsInstance(h, RemovableHandle)
        self.assertEqual(list(y._backward_hooks), [h.id])
        h.remove()
        self.assertEqual(len(y._backward_hooks), 0)
        self.assertEqual(cnt.frame_count, 1)

    def test_inductor(self):
        # The residual registration is on a graph output, whatever the backend.
        for fn in (output_returned, intermediate_removed_in_frame):
            expected = run_protocol(fn, False)
            torch._dynamo.reset()
            self.assertEqual(
                run_protocol(torch.compile(fn, backend="inductor"), False), expected
            )

    def test_reregister_does_not_recompile_per_handle(self):
        # Handles from outside the frame are guarded on their type, not identity.
        cnt = CompileCounter()
        m, x = Holder(), torch.randn(2, 3, requires_grad=True)
        compiled = torch.compile(reregister, backend=cnt)
        for _ in range(4):
            compiled(m, x)
        self.assertEqual(num_hooks(x), 1)
        self.assertEqual(cnt.frame_count, 2)  # m.h None, then a handle

    def test_reregister_list_of_handles(self):
        # Remove every stored handle, clear the list, register again: the
        # removals load the handles before the list mutation is replayed.
        def fn(m, x):
            for h in m.handles:
                h.remove()
            m.handles.clear()
            for p in m.parameters():
                m.handles.append(p.register_hook(double))
            return m.lin(x)

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        m, x = Holder(), torch.randn(2, 3, requires_grad=True)
        for _ in range(4):
            compiled(m, x).sum().backward()
        ref_m = Holder()
        for _ in range(4):
            fn(ref_m, x).sum().backward()
        self.assertEqual([num_hooks(p) for p in m.parameters()], [1, 1])
        self.assertEqual(
            [p.grad for p in m.parameters()], [p.grad for p in ref_m.parameters()]
        )
        self.assertEqual(cnt.frame_count, 2)  # empty list, then two handles
        self.assertEqual(sum(counters["graph_break"].values()), 0)

    def test_removal_is_residual(self):
        # remove() on a handle from outside the frame runs after the graph.
        x = torch.randn(2, 3, requires_grad=True)
        h = x.register_hook(double)

        def fn(x, h):
            h.remove()
            return x * 2

        cnt = CompileCounter()
        torch.compile(fn, backend=cnt, fullgraph=True)(x, h)
        self.assertEqual(num_hooks(x), 0)
        self.assertEqual(cnt.frame_count, 1)

    def test_module_hook_handle_removal_breaks(self):
        # Removing a module forward hook at the end of the frame would be too late
        # for a call of the module in the frame: graph break at remove() instead,
        # also when the same code first saw a tensor hook handle (guarded).
        m, x = Holder(), torch.randn(2, 3, requires_grad=True)

        def fn(m, x, h):
            h.remove()
            return m.lin(x)

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        compiled(m, x, x.register_hook(double))
        self.assertEqual(sum(counters["graph_break"].values()), 0)
        h = m.lin.register_forward_hook(forward_hook)
        self.assertEqual(compiled(m, x, h), m.lin(x))
        self.assertEqual(len(m.lin._forward_hooks), 0)
        self.assertEqual(num_hooks(x), 0)
        self.assertEqual(sum(counters["graph_break"].values()), 1)

    def test_removal_in_subgraph_breaks(self):
        # A higher-order op body may discard its side effects: a removal there
        # must not be lost, so it graph breaks and runs eagerly.
        x = torch.randn(2, 3, requires_grad=True)
        h = x.register_hook(double)

        def body(x, h):
            h.remove()
            return x.sin()

        def fn(x, h):
            return torch.utils.checkpoint.checkpoint(body, x, h, use_reentrant=False)

        torch.compile(fn, backend="aot_eager")(x, h)
        self.assertEqual(num_hooks(x), 0)
        self.assertEqual(sum(counters["graph_break"].values()), 1)

    def test_config_off_keeps_stock_behaviour(self):
        x = torch.randn(2, 3, requires_grad=True)
        with torch._dynamo.config.patch(hook_residuals=False):
            torch._dynamo.reset()
            counters.clear()
            cnt = CompileCounter()
            torch.compile(output_returned, backend=cnt)(None, x)
        self.assertEqual(cnt.frame_count, 0)


instantiate_parametrized_tests(HookResidualsTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
