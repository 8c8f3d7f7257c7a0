# Owner(s): ["module: dynamo"]
"""nn.Module forward / forward-pre hooks registered inside a compiled frame
(config.hook_residuals).

Every case runs the same protocol eagerly and compiled (CompileCounter with the
eager backend, aot_eager, and aot_eager with compiled autograd): three calls on one
module; after each call record the outputs, the gradients of a backward through
them, the returned or stored handles' types, the number of entries in the
module's forward / forward-pre / with_kwargs hook dicts and how often hooks ran;
then remove() the handles the protocol is told to remove and count again.
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

# How often hooks ran, counted in a tensor: an in-graph mutation that adds no
# guard (appending to a global list would add a length guard of its own).
FIRED = torch.zeros(4)


def add_one(mod, args, out):
    FIRED[0] += 1
    return out + 1


def times_ten(mod, args, out):
    FIRED[1] += 1
    return out * 10


def double_input(mod, args):
    FIRED[2] += 1
    return (args[0] * 2,)


def pre_with_kwargs(mod, args, kwargs):
    FIRED[3] += 1
    return (args[0] + 3,), kwargs


def post_with_kwargs(mod, args, kwargs, out):
    FIRED[3] += 1
    return out - args[0].sum()


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 3)
        self.h = None
        self.handles = []


# Each case: fn(m, x). Returned values that are handles, m.h and m.handles are
# the handles the protocol sees.
def returned_handle(m, x):
    h = m.lin.register_forward_hook(add_one)
    return x.sin(), h


def handle_on_attribute(m, x):
    m.h = m.lin.register_forward_pre_hook(double_input)
    return x.sin()


def handle_in_list(m, x):
    m.handles.append(m.lin.register_forward_hook(add_one))
    m.handles.append(m.lin.register_forward_pre_hook(double_input))
    return x.sin()


def called_after_registration(m, x):
    h = m.lin.register_forward_hook(add_one)
    return m.lin(x), h


def called_before_registration(m, x):
    y = m.lin(x)
    m.handles.append(m.lin.register_forward_hook(add_one))
    return y


def called_before_and_after(m, x):
    y = m.lin(x)
    m.h = m.lin.register_forward_hook(times_ten)
    return m.lin(y)


def pre_hook_modifies_input(m, x):
    m.h = m.lin.register_forward_pre_hook(double_input)
    return m.lin(x)


def removed_in_frame(m, x):
    h = m.lin.register_forward_hook(add_one)
    y = m.lin(x)
    h.remove()
    return y + m.lin(x)


def removed_before_call(m, x):
    h = m.lin.register_forward_pre_hook(double_input)
    h.remove()
    return m.lin(x), h


def with_kwargs(m, x):
    m.handles.append(m.lin.register_forward_pre_hook(pre_with_kwargs, with_kwargs=True))
    m.handles.append(m.lin.register_forward_hook(post_with_kwargs, with_kwargs=True))
    return m.lin(x)


def prepend(m, x):
    m.handles.append(m.lin.register_forward_hook(add_one))
    m.handles.append(m.lin.register_forward_hook(times_ten, prepend=True))
    return m.lin(x)


def always_call(m, x):
    m.h = m.lin.register_forward_hook(add_one, always_call=True)
    return m.lin(x)


def closure_hook(m, x):
    scale = x.sum()

    def hook(mod, args, out):
        return out * scale

    m.h = m.lin.register_forward_hook(hook)
    return m.lin(x)


def lambda_hook(m, x):
    m.h = m.lin.register_forward_hook(lambda mod, args, out: out.cos())
    return m.lin(x)


def registration_then_graph_break(m, x):
    h = m.lin.register_forward_hook(add_one)
    torch._dynamo.graph_break()
    return m.lin(x), h


# name -> (fn, remove handles after each call, frames, graph breaks)
# Frames: a frame that calls the module guards the length of the hook dicts it
# registers into, so it recompiles whenever the hooks the module has at the
# start of a call differ from the first call's (eager runs them all).
CASES = {
    # Not called in the frame: no guard, one frame however many hooks stack up.
    "returned_handle": (returned_handle, False, 1, 0),
    "handle_on_attribute": (handle_on_attribute, False, 1, 0),
    # m.handles grows by two per call: its length is guarded (as without this patch).
    "handle_in_list": (handle_in_list, False, 3, 0),
    "handle_in_list_removed_later": (handle_in_list, True, 1, 0),
    "returned_handle_removed_later": (returned_handle, True, 1, 0),
    # Called in the frame, hooks stack up (as in eager): one frame per call.
    "called_after_registration": (called_after_registration, False, 3, 0),
    "called_before_registration": (called_before_registration, False, 3, 0),
    "called_before_and_after": (called_before_and_after, False, 3, 0),
    "pre_hook_modifies_input": (pre_hook_modifies_input, False, 3, 0),
    "with_kwargs": (with_kwargs, False, 3, 0),
    "prepend": (prepend, False, 3, 0),
    "always_call": (always_call, False, 3, 0),
    "lambda_hook": (lambda_hook, False, 3, 0),
    "closure_hook": (closure_hook, False, 3, 0),
    # Handles removed after each call: the module starts every call hookless.
    "called_after_registration_removed_later": (called_after_registration, True, 1, 0),
    "called_before_registration_removed_later": (
        called_before_registration,
        True,
        1,
        0,
    ),
    "pre_hook_modifies_input_removed_later": (pre_hook_modifies_input, True, 1, 0),
    "with_kwargs_removed_later": (with_kwargs, True, 1, 0),
    "prepend_removed_later": (prepend, True, 1, 0),
    # Registered and removed in the frame: nothing changes between calls.
    "removed_in_frame": (removed_in_frame, False, 1, 0),
    "removed_before_call": (removed_before_call, False, 1, 0),
    # The user's own graph break: the registration is replayed before it, and
    # the module call in the resume function runs the hook (the first graph is
    # empty: one frame with a graph).
    "registration_then_graph_break": (registration_then_graph_break, True, 1, 1),
}

MODES = ("eager", "aot_eager", "compiled_autograd")


def hook_counts(mod):
    return [
        len(mod._forward_hooks),
        len(mod._forward_pre_hooks),
        len(mod._forward_hooks_with_kwargs),
        len(mod._forward_pre_hooks_with_kwargs),
        len(mod._forward_hooks_always_called),
    ]


def kind(value):
    return "handle" if isinstance(value, RemovableHandle) else type(value).__name__


def run_protocol(fn, remove_after, calls=3):
    FIRED.zero_()
    m = Holder()
    x = torch.randn(2, 3)
    seen = []
    for _ in range(calls):
        out = fn(m, x)
        out = list(out) if isinstance(out, tuple) else [out]
        handles = [h for h in [*out, m.h, *m.handles] if isinstance(h, RemovableHandle)]
        tensors = [o for o in out if isinstance(o, torch.Tensor)]
        m.lin.zero_grad(set_to_none=True)
        differentiable = [t for t in tensors if t.requires_grad]
        if differentiable:  # frames that do not call the module return x + 1
            sum(t.sum() for t in differentiable).backward()
        record = {
            "returned": [kind(o) for o in out],
            "stored": [kind(h) for h in [m.h, *m.handles]],
            "out": [o.detach().clone() for o in tensors],
            "grads": [None if p.grad is None else p.grad.clone() for p in m.lin.parameters()],
            "hooks after call": hook_counts(m.lin),
            "fired": FIRED.tolist(),
            "ids fresh": len({h.id for h in handles}) == len(handles),
        }
        if remove_after:
            for h in handles:
                h.remove()
            m.h = None
            m.handles.clear()
        record["hooks after remove"] = hook_counts(m.lin)
        seen.append(record)
    return seen


def run_compiled(fn, mode, remove_after, calls=3):
    torch._dynamo.reset()
    counters.clear()
    if mode == "eager":
        cnt = CompileCounter()
    else:
        cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=cnt)
    if mode == "compiled_autograd":
        # On while the forward is traced too, as in real use.
        with compiled_autograd._enable(torch.compile(backend="aot_eager")):
            seen = run_protocol(compiled, remove_after, calls)
    else:
        seen = run_protocol(compiled, remove_after, calls)
    return seen, cnt.frame_count, sum(counters["graph_break"].values())


class ModuleHookResidualsTests(torch._dynamo.test_case.TestCase):
    def assertGraphBreak(self, gb_types):
        # counters["graph_break"] is keyed by the full message.
        self.assertEqual(
            [msg.split("\n")[0] for msg in counters["graph_break"]], gb_types
        )

    @parametrize("mode", MODES)
    @parametrize("case", list(CASES))
    def test_matches_eager(self, case, mode):
        fn, remove_after, frames, breaks = CASES[case]
        expected = run_protocol(fn, remove_after)
        seen, got_frames, got_breaks = run_compiled(fn, mode, remove_after)
        self.assertEqual(seen, expected)
        self.assertEqual((got_frames, got_breaks), (frames, breaks))
        self.assertEqual(dict(counters["unimplemented"]), {})

    @parametrize("case", list(CASES))
    def test_matches_eager_recursive_dict_tags(self, case):
        # With recursive dict tags, a module whose guard subtree is tag safe is
        # skipped while its dicts' tags are unchanged. An empty hook dict had no
        # node whose tag is recorded, so its length guard was skipped and the
        # code traced without the new hook kept running.
        fn, remove_after, frames, breaks = CASES[case]
        expected = run_protocol(fn, remove_after)
        with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True):
            seen, got_frames, got_breaks = run_compiled(fn, "eager", remove_after)
        self.assertEqual(seen, expected)
        self.assertEqual((got_frames, got_breaks), (frames, breaks))
        self.assertEqual(dict(counters["unimplemented"]), {})

    def test_handle_is_real(self):
        # The handle is the one register_forward_hook returned at runtime.
        cnt = CompileCounter()
        m, x = Holder(), torch.randn(2, 3)
        _, h = torch.compile(returned_handle, backend=cnt, fullgraph=True)(m, x)
        self.assertIsInstance(h, RemovableHandle)
        self.assertEqual(list(m.lin._forward_hooks), [h.id])
        self.assertIs(m.lin._forward_hooks[h.id], add_one)
        h.remove()
        self.assertEqual(len(m.lin._forward_hooks), 0)

    def test_prepend_order(self):
        # prepend=True puts the hook before the hooks the module already has,
        # while tracing (output) and at runtime (dict order).
        m, x = Holder(), torch.randn(2, 3)
        first = m.lin.register_forward_hook(add_one)
        ref = Holder()
        ref.lin.register_forward_hook(add_one)

        def fn(m, x):
            m.h = m.lin.register_forward_hook(times_ten, prepend=True)
            return m.lin(x)

        cnt = CompileCounter()
        out = torch.compile(fn, backend=cnt, fullgraph=True)(m, x)
        self.assertEqual(out, fn(ref, x))
        self.assertEqual(list(m.lin._forward_hooks), [m.h.id, first.id])

    def test_guard_is_narrow(self):
        # A frame that registers without calling the module adds no hook-dict
        # guard; one that calls it guards the dicts it registers into.
        def register_only(m, x):
            m.h = m.lin.register_forward_hook(add_one)
            return x + 1

        cnt = CompileCounter()
        m, x = Holder(), torch.randn(2, 3)
        compiled = torch.compile(register_only, backend=cnt, fullgraph=True)
        for _ in range(5):
            compiled(m, x)
        self.assertEqual(len(m.lin._forward_hooks), 5)
        self.assertEqual(cnt.frame_count, 1)

        def length_guards(fn, m):
            guards = torch._dynamo.explain(fn)(m, x).out_guards
            return {
                g.name.rsplit(".", 1)[1]
                for g in guards
                if g.create_fn_name() == "SEQUENCE_LENGTH" and "hooks" in g.name
            }

        # torch 2.15.0 guards the lengths of the hook dicts Module.__call__ reads when
        # the module is called; registering in the frame adds the dicts it registers
        # into (with_kwargs too) and nothing else.
        hooked = Holder()
        hooked.lin.register_forward_pre_hook(double_input)
        self.assertEqual(
            length_guards(pre_hook_modifies_input, Holder()),
            length_guards(lambda m, x: m.lin(x), hooked) | {"_forward_pre_hooks_with_kwargs"},
        )

    def test_recompile_reason_names_the_hook_dict(self):
        failures = []
        cnt = CompileCounter()
        compiled = torch._dynamo.optimize(cnt, guard_fail_fn=failures.append)(
            called_after_registration
        )
        m, x = Holder(), torch.randn(2, 3)
        compiled(m, x)
        compiled(m, x)
        self.assertEqual(cnt.frame_count, 2)
        self.assertEqual(len(failures), 1)
        self.assertEqual(
            failures[0].reason, "0/0: len(m._modules['lin']._forward_hooks) != 0"
        )

    def test_handle_id_is_the_real_id(self):
        # The id exists only once the hook is registered for real: it is read
        # from the handle residual bytecode created, with no graph break.
        def fn(m, x):
            h = m.lin.register_forward_hook(add_one)
            return m.lin(x), h.id, h

        m, ref = Holder(), Holder()
        x = torch.randn(2, 3)
        cnt = CompileCounter()
        out, hid, h = torch.compile(fn, backend=cnt, fullgraph=True)(m, x)
        ref_out, _, _ = fn(ref, x)
        self.assertEqual(out, ref_out)
        self.assertEqual(hid, h.id)
        self.assertEqual(list(m.lin._forward_hooks), [hid])
        self.assertEqual(cnt.frame_count, 1)

    def test_handle_id_value_breaks_at_its_use(self):
        # Using the id's value (here arithmetic) breaks the graph there; the
        # registration is replayed before the break, so the value is real.
        def fn(m, x):
            h = m.lin.register_forward_hook(add_one)
            return m.lin(x), h.id + 1

        m, ref = Holder(), Holder()
        x = torch.randn(2, 3)
        cnt = CompileCounter()
        out, hid_plus_one = torch.compile(fn, backend=cnt)(m, x)
        ref_out, _ = fn(ref, x)
        self.assertEqual(out, ref_out)
        self.assertEqual([hid_plus_one - 1], list(m.lin._forward_hooks))
        # The graph before the break and the resume function's.
        self.assertEqual(cnt.frame_count, 2)
        self.assertEqual(
            [msg.split("\n")[0] for msg in counters["unimplemented"]],
            ["Value of a module hook handle's id registered in the frame"],
        )

    def test_removed_handle_is_real(self):
        # remove() in the frame is replayed after the registration, as in
        # eager: the returned handle is a real, removed one with its id.
        def fn(m, x):
            h = m.lin.register_forward_hook(add_one)
            hid = h.id
            h.remove()
            return m.lin(x), h, hid

        m, ref = Holder(), Holder()
        x = torch.randn(2, 3)
        cnt = CompileCounter()
        out, h, hid = torch.compile(fn, backend=cnt, fullgraph=True)(m, x)
        self.assertEqual(out, fn(ref, x)[0])
        self.assertIsInstance(h, RemovableHandle)
        self.assertEqual(h.id, hid)
        self.assertEqual(len(m.lin._forward_hooks), 0)

    def test_user_read_of_hooks_sees_pending_hook(self):
        # A read of the module's hook dict through the module sees the pending
        # hook, as in eager, with no graph break; the dict that leaves the frame
        # is the module's real dict.
        def fn(m, x):
            m.h = m.lin.register_forward_hook(add_one, prepend=True)
            hooks = m.lin._forward_hooks
            return x * len(hooks), hooks, list(hooks.values())

        m, ref = Holder(), Holder()
        m.lin.register_forward_hook(times_ten)
        ref.lin.register_forward_hook(times_ten)
        x = torch.randn(2, 3)
        cnt = CompileCounter()
        out, hooks, values = torch.compile(fn, backend=cnt, fullgraph=True)(m, x)
        ref_out, _, ref_values = fn(ref, x)
        self.assertEqual(out, ref_out)
        self.assertIs(hooks, m.lin._forward_hooks)
        self.assertEqual(values, ref_values)
        self.assertEqual(list(hooks)[0], m.h.id)

    def test_read_outside_the_module_breaks(self):
        # vars(m.lin) gives the dict as it is before the registration:
        # the registration then runs eagerly at a graph break.
        def fn(m, x):
            m.h = m.lin.register_forward_hook(add_one)
            return x * len(vars(m.lin)["_forward_hooks"])

        m, ref = Holder(), Holder()
        x = torch.randn(2, 3)
        self.assertEqual(torch.compile(fn, backend="eager")(m, x), fn(ref, x))
        self.assertEqual(len(m.lin._forward_hooks), 1)
        self.assertGraphBreak(
            [
                "nn.Module hook registration whose hooks dict is read or "
                "replaced in the frame"
            ],
        )

    def test_non_constant_flag_breaks(self):
        def fn(m, x, flag):
            m.h = m.lin.register_forward_hook(add_one, prepend=flag)
            return m.lin(x)

        m, ref = Holder(), Holder()
        x = torch.randn(2, 3)
        flag = torch.tensor(True)
        self.assertEqual(
            torch.compile(fn, backend="eager")(m, x, flag), fn(ref, x, flag)
        )
        self.assertEqual(len(m.lin._forward_hooks), 1)
        self.assertGraphBreak(
            ["nn.Module hook registration with a non-constant flag"],
        )

    def test_inductor(self):
        for fn in (pre_hook_modifies_input, with_kwargs, removed_in_frame):
            expected = run_protocol(fn, True)
            torch._dynamo.reset()
            self.assertEqual(
                run_protocol(torch.compile(fn, backend="inductor"), True), expected
            )

    def test_config_off_keeps_behaviour_without_this_patch(self):
        # Without this patch: graph break at RemovableHandle.next_id += 1.
        # (With nested_graph_breaks=True Dynamo then replaces the module's
        # _forward_hooks OrderedDict by a dict at that break: TypeError.)
        with torch._dynamo.config.patch(
            hook_residuals=False, nested_graph_breaks=False
        ):
            torch._dynamo.reset()
            counters.clear()
            cnt = CompileCounter()
            m = Holder()
            torch.compile(called_after_registration, backend=cnt)(m, torch.randn(2, 3))
        self.assertEqual(len(m.lin._forward_hooks), 1)
        self.assertEqual(sum(counters["graph_break"].values()), 1)


instantiate_parametrized_tests(ModuleHookResidualsTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
