# Owner(s): ["module: dynamo"]
"""Tensor hook handles that enter or leave a compiled frame (config.hook_residuals).

Every case runs the same protocol eagerly and compiled (CompileCounter with the
eager backend, aot_eager, and aot_eager under compiled autograd): call twice; after
each call count the hooks on the input, the returned tensors and the parameters,
run backward, record gradients and how often hooks fired, then remove() every
handle the call returned or stored and count the hooks again.

The removal cases (REMOVAL_KINDS) register a hook before each of three calls and
pass its handle in; the frame removes it, then runs code that would run the hook.
After each call and after backward: outputs, gradients, how often the removed
hook ran and the hooks left in the handle's dicts.
"""

import collections
import io
from unittest import mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
import torch.nn.modules.module as module_globals
import torch.optim.optimizer as optimizer_globals
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


def triple(g):
    return g * 3


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


# Each case: fn(m, x), graph breaks expected patched (0 unless documented in
# docs/features.md as out of scope), and whether the protocol removes handles before backward.
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


# A graph break after a registration whose handling restarts the trace once it
# reaches the compile at the break: the tensor has no use in the graph
# (check_traced_hooks), the handle is live across the break (it escapes), or,
# under compiled autograd, a tensor registered after the graph is used in it
# (check_residual_registrations).
def dropped_handle_then_graph_break(m, x):
    y = x * 2
    y.register_hook(double)
    torch._dynamo.graph_break()
    return y


def escaping_handle_then_graph_break(m, x):
    y = x * 2
    h = y.register_hook(double)
    torch._dynamo.graph_break()
    return y + 0, h


def used_intermediate_then_graph_break(m, x):
    y = x * 2
    y.register_hook(double)
    z = y.sin()
    torch._dynamo.graph_break()
    return z


def used_escaping_handle_then_graph_break(m, x):
    y = x * 2
    h = y.register_hook(double)
    z = y.sin()
    torch._dynamo.graph_break()
    return z, h


BREAK_UNLESS_CA = {"eager": 1, "aot_eager": 1, "compiled_autograd": 0}

# Hooks registered in the frame on inputs, intermediates and outputs.
# name -> (fn, expected graph breaks patched, remove handles before backward)
CASES = {
    "input_returned": (input_returned, 0, False),
    "input_removed_before_backward": (input_removed_before_backward, 0, True),
    "input_removed_in_frame": (input_removed_in_frame, 0, False),
    "intermediate_removed_in_frame": (intermediate_removed_in_frame, 0, False),
    "intermediate_dropped_handle": (intermediate_dropped_handle, 0, False),
    "output_returned": (output_returned, 0, False),
    "output_removed_before_backward": (output_removed_before_backward, 0, True),
    "output_on_attribute": (output_on_attribute, 0, False),
    "output_in_list": (output_in_list, 0, False),
    "output_handle_dropped": (output_handle_dropped, 0, False),
    "params_loop": (params_loop, 0, False),
    "closure_over_intermediate": (closure_over_intermediate, 0, False),
    "lambda_on_input": (lambda_on_input, 0, False),
    "post_accumulate_grad": (post_accumulate_grad, 0, False),
    # Out of scope (docs/features.md): a hook traced into the graph cannot append to a
    # global list. Compiled autograd calls the hook itself: no graph break.
    "intermediate_side_effect_hook": (
        intermediate_side_effect_hook,
        BREAK_UNLESS_CA,
        False,
    ),
}

# The handle of a hook on an intermediate used in the graph escapes: the hook
# must see the in-graph gradient, so a removable registration runs eagerly at
# a graph break (1). Compiled autograd calls the hook from a BackwardState,
# which its handle can clear (0).
# name -> (fn, remove handles before backward)
ESCAPING_CASES = {
    "intermediate_returned": (intermediate_returned, False),
    "intermediate_removed_before_backward": (intermediate_removed_before_backward, True),
    "intermediate_on_attribute": (intermediate_on_attribute, False),
}

# A handle from outside the frame: live across the user's own graph break, the
# resume function receives it.
INPUT_HANDLE_CASES = {
    "input_hook_then_graph_break": (input_hook_then_graph_break, 1, False),
    "output_handle_across_graph_break": (output_handle_across_graph_break, 1, False),
}

# remove() of a handle from outside the frame (stored on the module by an
# earlier call), replayed after the graph.
REMOVAL_CASES = {
    "removed_in_later_call": (removed_in_later_call, 0, False),
    "reregister": (reregister, 0, False),
}

# Every pattern, for scripts/hook_matrix.py.
ALL_CASES = {
    **CASES,
    **{name: (fn, BREAK_UNLESS_CA, remove) for name, (fn, remove) in ESCAPING_CASES.items()},
    **INPUT_HANDLE_CASES,
    **REMOVAL_CASES,
}

MODES = ("eager", "aot_eager", "compiled_autograd")

USER_BREAK = "Call to `torch._dynamo.graph_break()`"
ESCAPING_USED = "Tensor hook on an intermediate used in the graph, with a handle that escapes"

ONE_USER_BREAK = {USER_BREAK: 1}

# name -> (fn, mode -> (frames compiled, restarts for a hook decision, graph
# breaks by type)) over the protocol. Stock Dynamo (hook_residuals=False) counts
# the user's graph break once in each of them.
RESTART_BREAK_CASES = {
    # Restarts to register the hook after the graph (the tensor has no use in
    # it); the resume function's graph is empty. Compiled autograd registers it
    # there first.
    "dropped_handle_then_graph_break": (
        dropped_handle_then_graph_break,
        {
            "eager": (1, 1, ONE_USER_BREAK),
            "aot_eager": (1, 1, ONE_USER_BREAK),
            "compiled_autograd": (1, 0, ONE_USER_BREAK),
        },
    ),
    # The handle is live across the graph break: restarts to register the
    # hook after the graph, and the resume function gets the real handle.
    "escaping_handle_then_graph_break": (
        escaping_handle_then_graph_break,
        {
            "eager": (2, 1, ONE_USER_BREAK),
            "aot_eager": (2, 1, ONE_USER_BREAK),
            "compiled_autograd": (2, 0, ONE_USER_BREAK),
        },
    ),
    # Compiled autograd restarts to call the hook from the BackwardState.
    "used_intermediate_then_graph_break": (
        used_intermediate_then_graph_break,
        {
            "eager": (1, 0, ONE_USER_BREAK),
            "aot_eager": (1, 0, ONE_USER_BREAK),
            "compiled_autograd": (1, 1, ONE_USER_BREAK),
        },
    ),
    # The handle of a used intermediate escapes: restarts to break the graph at
    # register_hook, and the user's graph break is in the resume function.
    # Compiled autograd restarts to call the hook from the BackwardState.
    "used_escaping_handle_then_graph_break": (
        used_escaping_handle_then_graph_break,
        {
            "eager": (2, 1, {ESCAPING_USED: 1, USER_BREAK: 1}),
            "aot_eager": (2, 1, {ESCAPING_USED: 1, USER_BREAK: 1}),
            "compiled_autograd": (1, 1, ONE_USER_BREAK),
        },
    ),
}


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


# remove() of a handle from outside the frame, for every RemovableHandle producer
# in torch 2.13, then code in the same frame that would run (or read) the hook.
# Not here: torch.autograd.function._HookMixin._register_hook (the legacy path of
# Node hooks), torch._dynamo.convert_frame.register_bytecode_hook (run by the
# compiler, not by the frame), torch.package.PackageExporter's extern / mock /
# intern hooks (not traced) and torch._dynamo.utils.invalid_removeable_handle
# (a handle of no dict).
# How often removed hooks ran, counted in a tensor (no guard of its own).
REMOVED_FIRED = torch.zeros(1)


def _fired():
    REMOVED_FIRED.add_(1)


def r_grad_hook(g):
    _fired()
    return g * 2


def r_post_accumulate(p):
    _fired()


def r_node_hook(grad_inputs, grad_outputs):
    _fired()


def r_node_prehook(grad_outputs):
    _fired()
    return (grad_outputs[0] * 2,)


def r_forward_pre(mod, args):
    _fired()
    return (args[0] * 2,)


def r_forward_pre_kwargs(mod, args, kwargs):
    _fired()
    return (args[0] * 2,), kwargs


def r_forward(mod, args, out):
    _fired()
    return out + 1


def r_backward(mod, grad_input, grad_output):
    _fired()


def r_backward_pre(mod, grad_output):
    _fired()


def r_state_dict_pre(mod, prefix, keep_vars):
    _fired()


def r_state_dict_post(mod, state_dict, prefix, local_metadata):
    _fired()
    state_dict["removed_hook_ran"] = torch.ones(1)


def r_state_dict_hook_private(mod, state_dict, prefix, local_metadata):
    _fired()
    state_dict["removed_hook_ran"] = torch.ones(1)


def r_load_state_dict_pre(mod, state_dict, *args):
    _fired()


def r_load_state_dict_post(mod, incompatible_keys):
    _fired()


def r_registration(mod, name, value):
    _fired()
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        return value * 2


def r_step_hook(opt, args, kwargs):
    _fired()


def r_optimizer_hook(opt, *args):
    _fired()


def r_registry_fn(x):
    _fired()
    return x * 2


class RemovalState:
    def __init__(self):
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 3)
        for p in self.lin.parameters():
            p.grad = torch.ones_like(p)
        self.opt = torch.optim.SGD(self.lin.parameters(), lr=0.1)
        self.lin_state = {k: v.detach().clone() for k, v in self.lin.state_dict().items()}
        self.opt_state = self.opt.state_dict()
        self.buf = torch.ones(3)
        self.param = torch.nn.Parameter(torch.ones(3))
        self.sub = torch.nn.Identity()
        self.registry = collections.OrderedDict()
        self.y = None


def node_input(s, x, prehook=False):
    # y is a non-leaf input of the frame: backward runs its grad_fn's hooks.
    s.y = x * 1
    fn = s.y.grad_fn
    return fn.register_prehook(r_node_prehook) if prehook else fn.register_hook(r_node_hook)


def registry_handle(s, x):
    # A RemovableHandle over a user's own registry.
    h = RemovableHandle(s.registry)
    s.registry[h.id] = r_registry_fn
    return h


def call_lin(s, x):
    return s.lin(x)


def run_registry(s, x):
    for fn in s.registry.values():
        x = fn(x)
    return x * 1


def step(s, x):
    s.opt.step()
    return x + s.lin.weight.sum()


# kind -> (register the hook before the frame: make(s, x) -> handle,
#          code after remove() in the frame: later(s, x) -> tensor)
REMOVAL_KINDS = {
    "tensor_hook": (lambda s, x: x.register_hook(r_grad_hook), lambda s, x: x * 2),
    "post_accumulate_grad_hook": (
        lambda s, x: s.lin.weight.register_post_accumulate_grad_hook(r_post_accumulate),
        call_lin,
    ),
    "node_hook": (node_input, lambda s, x: s.y * 2),
    "node_prehook": (
        lambda s, x: node_input(s, x, prehook=True),
        lambda s, x: s.y * 2,
    ),
    "module_forward_pre_hook": (
        lambda s, x: s.lin.register_forward_pre_hook(r_forward_pre),
        call_lin,
    ),
    "module_forward_pre_hook_with_kwargs": (
        lambda s, x: s.lin.register_forward_pre_hook(
            r_forward_pre_kwargs, with_kwargs=True
        ),
        call_lin,
    ),
    "module_forward_hook": (
        lambda s, x: s.lin.register_forward_hook(r_forward, always_call=True),
        call_lin,
    ),
    "module_full_backward_hook": (
        lambda s, x: s.lin.register_full_backward_hook(r_backward),
        call_lin,
    ),
    "module_full_backward_pre_hook": (
        lambda s, x: s.lin.register_full_backward_pre_hook(r_backward_pre),
        call_lin,
    ),
    "module_backward_hook": (
        lambda s, x: s.lin.register_backward_hook(r_backward),
        call_lin,
    ),
    "global_forward_pre_hook": (
        lambda s, x: module_globals.register_module_forward_pre_hook(r_forward_pre),
        call_lin,
    ),
    "global_forward_hook": (
        lambda s, x: module_globals.register_module_forward_hook(r_forward),
        call_lin,
    ),
    "global_full_backward_hook": (
        lambda s, x: module_globals.register_module_full_backward_hook(r_backward),
        call_lin,
    ),
    "global_full_backward_pre_hook": (
        lambda s, x: module_globals.register_module_full_backward_pre_hook(
            r_backward_pre
        ),
        call_lin,
    ),
    "global_backward_hook": (
        lambda s, x: module_globals.register_module_backward_hook(r_backward),
        call_lin,
    ),
    "global_buffer_registration_hook": (
        lambda s, x: module_globals.register_module_buffer_registration_hook(
            r_registration
        ),
        lambda s, x: (s.lin.register_buffer("extra", s.buf), x + s.lin.extra)[1],
    ),
    "global_parameter_registration_hook": (
        lambda s, x: module_globals.register_module_parameter_registration_hook(
            r_registration
        ),
        lambda s, x: (s.lin.register_parameter("extra", s.param), x * 2)[1],
    ),
    "global_module_registration_hook": (
        lambda s, x: module_globals.register_module_module_registration_hook(
            r_registration
        ),
        lambda s, x: (s.lin.add_module("sub", s.sub), x * 2)[1],
    ),
    "state_dict_pre_hook": (
        lambda s, x: s.lin.register_state_dict_pre_hook(r_state_dict_pre),
        lambda s, x: x * len(s.lin.state_dict()),
    ),
    "state_dict_post_hook": (
        lambda s, x: s.lin.register_state_dict_post_hook(r_state_dict_post),
        lambda s, x: x * len(s.lin.state_dict()),
    ),
    "state_dict_hook_private": (
        lambda s, x: s.lin._register_state_dict_hook(r_state_dict_hook_private),
        lambda s, x: x * len(s.lin.state_dict()),
    ),
    "load_state_dict_pre_hook": (
        lambda s, x: s.lin.register_load_state_dict_pre_hook(r_load_state_dict_pre),
        lambda s, x: (s.lin.load_state_dict(s.lin_state), x * 2)[1],
    ),
    "load_state_dict_post_hook": (
        lambda s, x: s.lin.register_load_state_dict_post_hook(r_load_state_dict_post),
        lambda s, x: (s.lin.load_state_dict(s.lin_state), x * 2)[1],
    ),
    "optimizer_step_pre_hook": (
        lambda s, x: s.opt.register_step_pre_hook(r_step_hook),
        step,
    ),
    "optimizer_step_post_hook": (
        lambda s, x: s.opt.register_step_post_hook(r_step_hook),
        step,
    ),
    "global_optimizer_step_pre_hook": (
        lambda s, x: optimizer_globals.register_optimizer_step_pre_hook(r_step_hook),
        step,
    ),
    "global_optimizer_step_post_hook": (
        lambda s, x: optimizer_globals.register_optimizer_step_post_hook(r_step_hook),
        step,
    ),
    "optimizer_state_dict_pre_hook": (
        lambda s, x: s.opt.register_state_dict_pre_hook(r_optimizer_hook),
        lambda s, x: x * len(s.opt.state_dict()),
    ),
    "optimizer_state_dict_post_hook": (
        lambda s, x: s.opt.register_state_dict_post_hook(r_optimizer_hook),
        lambda s, x: x * len(s.opt.state_dict()),
    ),
    "optimizer_load_state_dict_pre_hook": (
        lambda s, x: s.opt.register_load_state_dict_pre_hook(r_optimizer_hook),
        lambda s, x: (s.opt.load_state_dict(s.opt_state), x * 2)[1],
    ),
    "optimizer_load_state_dict_post_hook": (
        lambda s, x: s.opt.register_load_state_dict_post_hook(r_optimizer_hook),
        lambda s, x: (s.opt.load_state_dict(s.opt_state), x * 2)[1],
    ),
    "user_registry": (registry_handle, run_registry),
}


READS = "RemovableHandle.remove() of a hook whose hooks dict the frame reads"
FORWARD = "RemovableHandle.remove() of a module forward hook"
# Graph breaks of torch 2.15.0 in Module.state_dict / load_state_dict.
STATE_DICT_SETATTR = "setattr() on unsupported type"
STATE_DICT_HASATTR = "unsupported hasattr operation"
STATE_DICT_PYTHON_TYPE = "Unsupported python_type() call"
NON_TENSOR_OP = "torch.* op returned non-Tensor"


def in_every_mode(frames, breaks, fallbacks=0):
    return dict.fromkeys(MODES, (frames, breaks, fallbacks))


# kind -> mode -> (frames compiled, graph breaks by type, silent fallbacks) over
# three calls.
REMOVAL_EXPECTED = {
    # Backward runs these hooks, outside the frame: nothing traced in the frame
    # reads their dicts, so remove() is replayed after the graph.
    "tensor_hook": in_every_mode(1, {}),
    "post_accumulate_grad_hook": in_every_mode(1, {}),
    "node_hook": in_every_mode(1, {}),
    "node_prehook": in_every_mode(1, {}),
    # Module.__call__ reads these dicts: remove() runs eagerly at a graph break
    # and the module call is traced in the resume function. Without this fix,
    # the traced call of a global forward-pre hook ran the removed hook, and
    # one with (full) backward hooks replayed them through the dict entry the
    # replayed remove() had deleted: KeyError, or under compiled autograd the
    # removed hook ran in backward.
    "module_forward_pre_hook": in_every_mode(1, {FORWARD: 1}),
    "module_forward_pre_hook_with_kwargs": in_every_mode(1, {FORWARD: 1}),
    "module_forward_hook": in_every_mode(1, {FORWARD: 1}),
    "module_full_backward_hook": in_every_mode(1, {READS: 1}),
    "module_full_backward_pre_hook": in_every_mode(1, {READS: 1}),
    "module_backward_hook": in_every_mode(1, {READS: 1}),
    "global_forward_pre_hook": in_every_mode(1, {READS: 1}),
    "global_forward_hook": in_every_mode(1, {FORWARD: 1}),
    "global_full_backward_hook": in_every_mode(1, {READS: 1}),
    "global_full_backward_pre_hook": in_every_mode(1, {READS: 1}),
    "global_backward_hook": in_every_mode(1, {READS: 1}),
    # register_buffer / register_parameter / add_module read the global
    # registration hooks. The first call adds the attribute: the resume function
    # recompiles once.
    "global_buffer_registration_hook": in_every_mode(2, {READS: 1}),
    "global_parameter_registration_hook": in_every_mode(2, {READS: 1}),
    "global_module_registration_hook": in_every_mode(2, {READS: 1}),
    # state_dict() breaks the graph before it reads its hooks (torch 2.15.0 traces
    # neither its destination dict's setattr and hasattr nor a python_type() call
    # there): the removal is replayed at that graph break, before the hooks are read.
    **dict.fromkeys(
        ("state_dict_pre_hook", "state_dict_post_hook", "state_dict_hook_private"),
        in_every_mode(1, dict.fromkeys((STATE_DICT_SETATTR, STATE_DICT_HASATTR, STATE_DICT_PYTHON_TYPE), 1)),
    ),
    # load_state_dict breaks the graph and runs a frame eagerly (as without this patch)
    # before it reads the post hooks, not before the pre hooks.
    "load_state_dict_pre_hook": in_every_mode(1, {READS: 1, NON_TENSOR_OP: 1}, fallbacks=1),
    "load_state_dict_post_hook": in_every_mode(1, {NON_TENSOR_OP: 1}, fallbacks=1),
    # Optimizer.step reads the pre hooks before its own graph break
    # (_use_grad_for_differentiable), the post hooks after it.
    "optimizer_step_pre_hook": in_every_mode(3, {READS: 1, USER_BREAK: 1}),
    "optimizer_step_post_hook": in_every_mode(3, {USER_BREAK: 1}),
    "global_optimizer_step_pre_hook": in_every_mode(3, {READS: 1, USER_BREAK: 1}),
    "global_optimizer_step_post_hook": in_every_mode(3, {USER_BREAK: 1}),
    # Optimizer.state_dict / load_state_dict are not traced (as without this patch).
    **{
        kind: in_every_mode(1, {"Attempted to inline function marked as skipped": 1})
        for kind in (
            "optimizer_state_dict_pre_hook",
            "optimizer_state_dict_post_hook",
            "optimizer_load_state_dict_pre_hook",
            "optimizer_load_state_dict_post_hook",
        )
    },
    "user_registry": in_every_mode(1, {READS: 1}),
}


def hook_names(h):
    dicts = [h.hooks_dict_ref(), *(ref() for ref in h.extra_dict_ref)]
    return [
        None if d is None else [getattr(v, "__name__", v) for v in d.values()]
        for d in dicts
    ]


def run_removal_protocol(kind, fn, compiled_autograd_backend=None, calls=3):
    """Per call: a new hook and handle, fn(s, x, h) removes it and runs the later
    code; record the output, the removed hook's runs and the handle's hooks
    dicts, then backward (which runs tensor, Node and module backward hooks)."""
    make, _ = REMOVAL_KINDS[kind]
    REMOVED_FIRED.zero_()
    s = RemovalState()
    full_backward = module_globals._global_is_full_backward_hook
    handles = []
    seen = []
    try:
        for _ in range(calls):
            x = torch.randn(2, 3, requires_grad=True)
            h = make(s, x)
            handles.append(h)
            out = fn(s, x, h)
            record = {
                "out": out.detach().clone(),
                "fired": REMOVED_FIRED.item(),
                "hooks after call": hook_names(h),
            }
            x.grad = None
            s.lin.zero_grad(set_to_none=True)
            if out.requires_grad:
                if compiled_autograd_backend is None:
                    out.sum().backward()
                else:
                    with compiled_autograd._enable(compiled_autograd_backend):
                        out.sum().backward()
            record["grads"] = [
                None if t.grad is None else t.grad.clone()
                for t in [x, *s.lin.parameters()]
            ]
            record["fired after backward"] = REMOVED_FIRED.item()
            record["hooks after backward"] = hook_names(h)
            seen.append(record)
    finally:
        for h in handles:
            h.remove()
        module_globals._global_is_full_backward_hook = full_backward
    return seen


def remove_then(kind):
    _, later = REMOVAL_KINDS[kind]

    def fn(s, x, h):
        h.remove()
        return later(s, x)

    return fn


def run_removal_compiled(kind, mode, calls=3):
    """(observations, frames compiled, graph breaks by type, silent fallbacks)."""
    torch._dynamo.reset()
    counters.clear()
    if mode == "eager":
        cnt = CompileCounter()
    else:
        cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(remove_then(kind), backend=cnt)
    if mode == "compiled_autograd":
        backend = torch.compile(backend="aot_eager")
        with compiled_autograd._enable(backend):
            seen = run_removal_protocol(kind, compiled, backend, calls)
    else:
        seen = run_removal_protocol(kind, compiled, calls=calls)
    fallbacks = sum(counters["unimplemented"].values())
    return seen, cnt.frame_count, graph_breaks_by_type(), fallbacks


def graph_breaks_by_type():
    breaks = collections.Counter()
    for msg, n in counters["graph_break"].items():
        breaks[msg.split("\n")[0]] += n
    return dict(breaks)


class HookResidualsTestCase(torch._dynamo.test_case.TestCase):
    def check_matches_eager(
        self, fn, mode, expected_breaks, remove_first, expected_frames=None
    ):
        # Frames: one, and one more after each graph break, unless told.
        if expected_frames is None:
            expected_frames = 1 + expected_breaks
        expected = run_protocol(fn, remove_first)
        seen, frames, breaks, fallbacks = run_compiled(fn, mode, remove_first)
        self.assertEqual(seen, expected)
        self.assertEqual(frames, expected_frames)
        self.assertEqual(breaks, expected_breaks)
        self.assertEqual(fallbacks, 0)


class HookResidualsTests(HookResidualsTestCase):
    """Hooks registered in the frame on inputs, intermediates and outputs."""

    @parametrize("mode", MODES)
    @parametrize("case", list(CASES))
    def test_matches_eager(self, case, mode):
        fn, expected_breaks, remove_first = CASES[case]
        if isinstance(expected_breaks, dict):
            expected_breaks = expected_breaks[mode]
        self.check_matches_eager(fn, mode, expected_breaks, remove_first)

    def test_autograd_grad_after_a_hook_registration(self):
        # torch.autograd.grad in the frame (trace_autograd_ops off) asks whether a graph
        # intermediate stays live across the break, walking the hooks the frame registered
        # (the hook ledger): it crashed reading the field the ledger replaces. Now as
        # without this patch (torch 2.15.0, measured): the same values, 2 frames.
        def fn(x):
            y = x * 2
            h = y.register_hook(double)
            (g,) = torch.autograd.grad(y.sum(), x)
            h.remove()
            return y.detach() + g, num_hooks(y)

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        for _ in range(2):
            x = torch.randn(2, 3, requires_grad=True)
            self.assertEqual(compiled(x), fn(x))
        self.assertEqual(cnt.frame_count, 2)

    def test_hook_returning_none_matches_eager(self):
        # A hook that only inspects the gradient of an intermediate returns None:
        # the gradient is unchanged. Under compiled autograd the hook is called
        # through call_hook_from_backward_state, which without the
        # compiled-autograd-hook-none patch replaced the gradient with None.
        for mode in MODES:
            with self.subTest(mode=mode):
                self.check_matches_eager(intermediate_hook_returns_none, mode, 0, False)

    def test_untraceable_hook_body_breaks_with_its_own_reason(self):
        # The hook body appends to a global list, so it cannot be traced into the graph,
        # and its tensor is used in the graph: the graph breaks at register_hook, as
        # without hook residuals, with the body's own reason (not the escaping-handle
        # one, which this patch gave before).
        torch._dynamo.reset()
        x = torch.ones(3, requires_grad=True)
        with self.assertRaisesRegex(torch._dynamo.exc.Unsupported, "Unsafe side effect"):
            torch.compile(intermediate_side_effect_hook, backend="eager", fullgraph=True)(None, x)
        counters.clear()
        self.check_matches_eager(intermediate_side_effect_hook, "eager", 1, False)
        self.assertEqual(len(counters["graph_break"]), 1)
        (reason,) = counters["graph_break"]
        self.assertIn("Unsafe side effect", reason)

    @parametrize("mode", MODES)
    @parametrize("case", list(RESTART_BREAK_CASES))
    def test_restart_counts_a_graph_break_once(self, case, mode):
        # The graph break is counted when the trace first finds it. Compiling
        # the graph before it then restarts the trace for a hook decision, which
        # drops the speculation log, and the next attempt finds it again: it
        # counted twice before, once in each attempt. Stock Dynamo's own
        # speculation restarts keep the log and count a graph break once.
        from torch._dynamo.variables import hooks

        fn, expected = RESTART_BREAK_CASES[case]
        frames, expected_restarts, breaks = expected[mode]
        with mock.patch.object(
            hooks, "restart_with_decision", wraps=hooks.restart_with_decision
        ) as restarts:
            self.check_matches_eager(fn, mode, sum(breaks.values()), False, frames)
        self.assertEqual(restarts.call_count, expected_restarts)
        self.assertEqual(graph_breaks_by_type(), breaks)
        # Stock Dynamo counts the user's graph break once too (and compiles
        # or falls back around it as it does without this patch).
        with torch._dynamo.config.patch(hook_residuals=False):
            run_compiled(fn, mode, False)
        self.assertEqual(graph_breaks_by_type()[USER_BREAK], breaks[USER_BREAK])

    def test_used_intermediate_is_traced_without_restart(self):
        # Without compiled autograd, a hook on an intermediate used in the graph
        # whose handle stays in the frame is traced into the graph as without
        # hook residuals (upstream #172126): one trace. Before, it was
        # registered by residual bytecode first and the trace restarted once to
        # trace it (still so under compiled autograd).
        from torch._dynamo.variables import hooks

        with mock.patch.object(
            hooks, "restart_with_decision", wraps=hooks.restart_with_decision
        ) as restarts:
            for mode in ("eager", "aot_eager"):
                self.check_matches_eager(intermediate_dropped_handle, mode, 0, False)
        self.assertEqual(restarts.call_count, 0)

    def test_output_hook_restarts_once_to_register_after_the_graph(self):
        # A hook on a tensor with no use in the graph is traced first; the trace
        # restarts once, for all such hooks, to register them after the graph.
        from torch._dynamo.variables import hooks

        def two_outputs(m, x):
            y, z = x * 2, x * 3
            return y, z, y.register_hook(double), z.register_hook(double)

        with mock.patch.object(
            hooks, "restart_with_decision", wraps=hooks.restart_with_decision
        ) as restarts:
            self.check_matches_eager(two_outputs, "eager", 0, False)
        # run_protocol calls the compiled function three times; one compile.
        self.assertEqual(restarts.call_count, 1)
        _, sites, decision, _ = restarts.call_args.args
        self.assertEqual((len(sites), decision), (2, hooks.RESIDUAL))

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

    def test_config_off_keeps_behaviour_without_this_patch(self):
        x = torch.randn(2, 3, requires_grad=True)
        with torch._dynamo.config.patch(hook_residuals=False):
            torch._dynamo.reset()
            counters.clear()
            cnt = CompileCounter()
            torch.compile(output_returned, backend=cnt)(None, x)
        self.assertEqual(cnt.frame_count, 0)


class ResidualHandleInputTests(HookResidualsTestCase):
    """The real handle of a hook on an intermediate, registered in the frame,
    reaching a resume function as an input (removable-handle-inputs)."""

    @parametrize("mode", ("eager", "aot_eager"))
    @parametrize("case", list(ESCAPING_CASES))
    def test_escaping_handle_reaches_the_resume_function(self, case, mode):
        # Without compiled autograd, the registration runs eagerly at a graph
        # break: the real handle is an input of the resume function.
        fn, remove_first = ESCAPING_CASES[case]
        self.check_matches_eager(fn, mode, 1, remove_first)

    @parametrize("mode", MODES)
    @parametrize("case", ["output_handle_across_graph_break"])
    def test_input_handle_matches_eager(self, case, mode):
        fn, expected_breaks, remove_first = INPUT_HANDLE_CASES[case]
        self.check_matches_eager(fn, mode, expected_breaks, remove_first)


class CompiledAutogradHandleTests(HookResidualsTestCase):
    """Real handles for hooks on intermediates that compiled autograd calls."""

    @parametrize("case", list(ESCAPING_CASES))
    def test_compiled_autograd_escaping_handle_is_real(self, case):
        # The hook is called from the frame's BackwardState: its handle is a
        # real one (the protocol records the kinds of returned and stored
        # handles), removing it clears the hook there, and nothing breaks.
        fn, remove_first = ESCAPING_CASES[case]
        self.check_matches_eager(fn, "compiled_autograd", 0, remove_first)

    def test_compiled_autograd_removed_handle_keeps_the_gradient(self):
        # remove() of the BackwardState handle before backward: the hook does
        # not run and the gradient passes unchanged.
        backend = torch.compile(backend="aot_eager")
        x = torch.randn(2, 3, requires_grad=True)
        # Compiled autograd must also be on while the forward is traced.
        with compiled_autograd._enable(backend):
            y, h = torch.compile(intermediate_returned, backend="aot_eager")(None, x)
            self.assertIsInstance(h, RemovableHandle)
            h.remove()
            y.sum().backward()
        self.assertEqual(x.grad, 2 * torch.cos(x * 2))
        self.assertEqual(sum(counters["graph_break"].values()), 0)


    def test_compiled_autograd_handle_removes_from_the_backward_state_hooks_dict(self):
        # The handle's hooks dict is the one the hook lives in, in the frame's
        # BackwardState, where the backward looks it up: remove() deletes it
        # there (also on leaving a with block; a second remove() does nothing),
        # and the gradient is then unchanged. The backward compiles once with
        # the hook and once without: the hook's key there is the same on every
        # call, unlike the handle's id.
        bw = CompileCounterWithBackend("aot_eager")
        cnt = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(intermediate_returned, backend=cnt)
        ids = []
        with compiled_autograd._enable(torch.compile(backend=bw)):
            for i in range(4):
                x = torch.randn(2, 3, requires_grad=True)
                y, h = compiled(None, x)
                self.assertIsInstance(h, RemovableHandle)
                hooks = h.hooks_dict_ref()
                self.assertEqual(list(hooks.values()), [double])
                removed = i == 2
                if removed:
                    with h:
                        pass
                    self.assertEqual(len(hooks), 0)
                    h.remove()
                    self.assertEqual(len(hooks), 0)
                y.sum().backward()
                scale = 2 if removed else 4
                self.assertEqual(x.grad, scale * torch.cos(x * 2))
                ids.append(h.id)
        self.assertEqual(ids, sorted(set(ids)))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(bw.frame_count, 2)
        self.assertEqual(sum(counters["graph_break"].values()), 0)

    def test_compiled_autograd_hook_function_swapped_without_a_recompile(self):
        # The hook is a closure's function, read lazily: the residual code puts
        # whichever function the closure holds into the BackwardState's hooks dict,
        # and the frame is not guarded on which one it is (building that dict must
        # not realize it), as without the patch. The backward runs the new hook.
        hook = double

        def fn(x):
            y = x * 2
            h = y.register_hook(hook)
            return y.sin(), h

        cnt = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(fn, backend=cnt)
        with compiled_autograd._enable(torch.compile(backend="aot_eager")):
            for scale, hook in ((2, double), (3, triple), (2, double)):
                x = torch.randn(2, 3, requires_grad=True)
                y, h = compiled(x)
                self.assertEqual(list(h.hooks_dict_ref().values()), [hook])
                y.sum().backward()
                self.assertEqual(x.grad, 2 * scale * torch.cos(x * 2))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(sum(counters["graph_break"].values()), 0)


class InputHandleTests(HookResidualsTestCase):
    """RemovableHandles from outside the frame, guarded on their type."""

    @parametrize("mode", MODES)
    @parametrize("case", ["input_hook_then_graph_break"])
    def test_input_handle_matches_eager(self, case, mode):
        fn, expected_breaks, remove_first = INPUT_HANDLE_CASES[case]
        # The graph before the break is empty: only the resume function's.
        self.check_matches_eager(fn, mode, expected_breaks, remove_first, 1)

    def test_input_handle_is_guarded_on_its_type(self):
        # A handle from outside the frame is only passed along: a new handle
        # each call does not recompile, and the caller gets it back.
        def fn(x, h):
            return x.sin(), h

        failures = []
        cnt = CompileCounter()
        compiled = torch._dynamo.optimize(cnt, nopython=True, guard_fail_fn=failures.append)(fn)
        x = torch.randn(2, 3, requires_grad=True)
        for _ in range(3):
            h = x.register_hook(double)
            y, back = compiled(x, h)
            self.assertIs(back, h)
            self.assertEqual(y, x.sin())
            h.remove()
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(failures, [])
        compiled(x, None)
        self.assertEqual(cnt.frame_count, 2)
        self.assertEqual(len(failures), 1)
        self.assertIn("___check_type_id(h, ", failures[0].reason)

    def test_input_handle_removal_runs_once(self):
        # remove() of a handle from outside the frame: the hook is gone after
        # each call, as in eager, and the frame compiles (no silent fallback).
        def fn(x, h):
            h.remove()
            return x * 2

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        x = torch.randn(2, 3, requires_grad=True)
        for _ in range(3):
            h = x.register_hook(double)
            self.assertEqual(compiled(x, h), x * 2)
            self.assertEqual(num_hooks(x), 0)
        compiled(x, x.register_hook(double)).sum().backward()
        self.assertEqual(x.grad, torch.full_like(x, 2))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(sum(counters["unimplemented"].values()), 0)


class HandleRemovalTests(HookResidualsTestCase):
    """remove() of a handle from outside the frame, replayed after the graph."""

    @parametrize("mode", MODES)
    @parametrize("case", list(REMOVAL_CASES))
    def test_removal_cases_match_eager(self, case, mode):
        fn, expected_breaks, remove_first = REMOVAL_CASES[case]
        # The first call has no handle to remove; later calls compile once more.
        self.check_matches_eager(fn, mode, expected_breaks, remove_first, 2)

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

    @parametrize("mode", MODES)
    @parametrize("kind", list(REMOVAL_KINDS))
    def test_removal_matches_eager(self, kind, mode):
        # Compiled: the same outputs, gradients, removed-hook runs and hooks
        # dicts as eager after every call.
        expected = run_removal_protocol(kind, remove_then(kind))
        seen, frames, breaks, fallbacks = run_removal_compiled(kind, mode)
        self.assertEqual(seen, expected)
        self.assertEqual((frames, breaks, fallbacks), REMOVAL_EXPECTED[kind][mode])

    def test_removal_matches_eager_without_nested_graph_breaks(self):
        # The test case turns nested graph breaks on; by default a graph break
        # inside an inlined call breaks at the call in the compiled frame.
        kinds = [k for k, e in REMOVAL_EXPECTED.items() if READS in e["eager"][1]]
        with torch._dynamo.config.patch(nested_graph_breaks=False):
            for kind in kinds:
                expected = run_removal_protocol(kind, remove_then(kind))
                seen, _, breaks, _ = run_removal_compiled(kind, "eager")
                self.assertEqual(seen, expected, kind)
                self.assertEqual(breaks.get(READS), 1, kind)

    def test_removed_closure_hook_is_not_reconstructed(self):
        # A global forward-pre hook counting its calls in a closure cell: traced
        # into the module call, its cell update was replayed through the hooks
        # dict entry the replayed remove() had deleted (KeyError after the
        # graph ran). Now remove() breaks the graph and the hook does not run.
        lin = torch.nn.Linear(3, 3)
        x = torch.randn(2, 3)

        def make_hook():
            calls = 0

            def hook(mod, args):
                nonlocal calls
                calls += 1
                return (args[0] * 2,)

            return hook, lambda: calls

        def fn(x, h):
            h.remove()
            return lin(x)

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        for _ in range(2):
            hook, calls = make_hook()
            h = module_globals.register_module_forward_pre_hook(hook)
            try:
                self.assertEqual(compiled(x, h), lin(x))
            finally:
                h.remove()
            self.assertEqual(calls(), 0)
            self.assertEqual(len(module_globals._global_forward_pre_hooks), 0)
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(
            [msg.split("\n")[0] for msg in counters["graph_break"]], [READS]
        )

    def test_removal_after_a_read_breaks(self):
        # The hooks dict was read before remove(): later reads reuse what was
        # traced there, so remove() breaks the graph at once. Eager runs the
        # hook in the first call of the module only.
        lin = torch.nn.Linear(3, 3)
        x = torch.randn(2, 3)

        def fn(x, h):
            y = lin(x)
            h.remove()
            return lin(y)

        def run(f):
            REMOVED_FIRED.zero_()
            h = module_globals.register_module_forward_pre_hook(r_forward_pre)
            try:
                out = f(x, h)
            finally:
                h.remove()
            return out, REMOVED_FIRED.item()

        expected = run(fn)
        cnt = CompileCounter()
        self.assertEqual(run(torch.compile(fn, backend=cnt)), expected)
        self.assertEqual(expected[1], 1)
        self.assertEqual(cnt.frame_count, 2)
        self.assertEqual(
            [msg.split("\n")[0] for msg in counters["graph_break"]], [READS]
        )

    def test_removal_guards_handle_dicts_against_reads(self):
        # Compiled with a tensor hook handle (removal replayed after the graph)
        # while a global forward-pre hook runs in the module call; then called
        # with that global hook's handle: the compiled code read its dict, so
        # the guard fails and the retrace breaks the graph at remove().
        lin = torch.nn.Linear(3, 3)
        x = torch.randn(2, 3, requires_grad=True)

        def fn(x, h):
            h.remove()
            return lin(x)

        failures = []
        cnt = CompileCounter()
        compiled = torch._dynamo.optimize(cnt, guard_fail_fn=failures.append)(fn)
        REMOVED_FIRED.zero_()
        g = module_globals.register_module_forward_pre_hook(r_forward_pre)
        try:
            t = x.register_hook(r_grad_hook)
            linear = torch.nn.functional.linear
            self.assertEqual(compiled(x, t), linear(x * 2, lin.weight, lin.bias))
            guards = torch._dynamo.explain_guards(
                compiled, full=True, file=io.StringIO()
            )
            self.assertEqual(guards.count("LAMBDA_GUARD: ___hooks_dicts_unobserved"), 1)
            self.assertEqual(x._backward_hooks, {})
            self.assertEqual(REMOVED_FIRED.item(), 1)
            self.assertEqual(sum(counters["graph_break"].values()), 0)
            self.assertEqual(compiled(x, g), linear(x, lin.weight, lin.bias))
            self.assertEqual(REMOVED_FIRED.item(), 1)
            self.assertEqual(len(module_globals._global_forward_pre_hooks), 0)
        finally:
            g.remove()
        self.assertEqual(len(failures), 1)
        self.assertEqual(
            failures[0].reason,
            "0/0: ___hooks_dicts_unobserved(h, (G['__import_torch_dot_nn_dot_"
            "modules_dot_module']._global_forward_pre_hooks,))",
        )
        self.assertEqual(
            [msg.split("\n")[0] for msg in counters["graph_break"]], [READS]
        )

    def test_removal_without_a_read_is_deferred(self):
        # Nothing in the frame reads the state-dict hooks: remove() is
        # replayed after the graph, no graph break, and a new handle each call
        # does not recompile.
        lin = torch.nn.Linear(3, 3)
        x = torch.randn(2, 3)

        def fn(x, h):
            h.remove()
            return lin(x)

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt, fullgraph=True)
        for _ in range(3):
            h = lin.register_state_dict_pre_hook(r_state_dict_pre)
            self.assertEqual(compiled(x, h), lin(x))
            self.assertEqual(len(lin._state_dict_pre_hooks), 0)
        self.assertEqual(cnt.frame_count, 1)


    def test_removal_through_two_sources_is_one_replayed_removal(self):
        # One handle kept on an attribute and in a list, removed through both:
        # one tracked object, one mutation, replayed once after the graph by
        # the side-effect replay handler (a second remove() is a no-op in eager).
        def fn(m, x):
            m.h.remove()
            m.handles[0].remove()
            return m.lin(x)

        calls = []
        remove = RemovableHandle.remove

        def counting_remove(handle):
            calls.append(handle)
            return remove(handle)

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt, fullgraph=True)
        m, ref_m = Holder(), Holder()
        x = torch.randn(2, 3)
        with mock.patch.object(RemovableHandle, "remove", counting_remove):
            for _ in range(3):
                for mod in (m, ref_m):
                    mod.h = mod.lin.weight.register_hook(double)
                    mod.handles = [mod.h]
                calls.clear()
                expected = fn(ref_m, x)
                self.assertEqual(compiled(m, x), expected)
                # eager's two calls, then the compiled frame's one
                self.assertEqual(calls, [ref_m.h, ref_m.h, m.h])
                self.assertEqual(num_hooks(m.lin.weight), 0)
                self.assertEqual(num_hooks(ref_m.lin.weight), 0)
        self.assertEqual(cnt.frame_count, 1)


instantiate_parametrized_tests(HookResidualsTests)
instantiate_parametrized_tests(ResidualHandleInputTests)
instantiate_parametrized_tests(CompiledAutogradHandleTests)
instantiate_parametrized_tests(InputHandleTests)
instantiate_parametrized_tests(HandleRemovalTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
