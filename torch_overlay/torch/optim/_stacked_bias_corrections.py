"""Adam's capturable bias corrections on one stacked vector of CPU steps, when compiling.

Under torch.compile, Dynamo traces torch.optim's capturable formulation on every device
(OptimizerVariable sets ``capturable`` for the trace), so the bias corrections are
tensor ops on each parameter's ``step``: eight foreach ops over a group's N steps in
_multi_tensor_adam, nine 0-d ops per parameter in _single_tensor_adam. When the steps
are 0-d CPU tensors (a CPU model, or state created outside the compiled step), each of
those is a kernel call per parameter (CPU foreach ops take the per-tensor slow path),
where eager does the same arithmetic on Python floats. Stacking the steps once makes
it a handful of kernel calls on one N-vector; the per-parameter values handed on are
0-d views of the result.

The arithmetic is the same sequence of elementwise operations in the steps' dtype as
the code it replaces. ``sub``, ``mul``, ``div``, ``reciprocal`` and ``sqrt`` round the
same on a vector as per element; ``pow`` on a vector may take the vectorized (SIMD)
kernel, which can differ from the per-element kernel in the last bit of a bias
correction.
"""

import torch
from torch import Tensor


def runs_graph_as_traced() -> bool:
    """Whether the frame Dynamo is tracing goes to a backend known to run its graph op
    by op: eager, aot_eager, and the torch._dynamo.testing backends built on them,
    also behind wrappers that name what they wrap (``__wrapped__``, ``.backend``).

    Dynamo calls this at trace time and takes the result as a constant (marked below,
    as torch._dynamo.assume_constant_result does); no guard is needed, the backend is
    part of every cache entry (BACKEND_MATCH). Other backends keep the foreach ops:
    Inductor fuses them itself, and given the stacked graph its lowering of the N
    views was superlinear in N (Adam over 200 CPU params: cold compile 32 s -> 115 s);
    a backend Dynamo cannot see through may be Inductor."""
    from torch._dynamo import testing
    from torch._dynamo.backends.registry import lookup_backend
    from torch._dynamo.symbolic_convert import InstructionTranslator

    op_by_op = ("eager", "aot_eager")
    backend = InstructionTranslator.current_tx().output.compiler_fn
    for _ in range(16):  # unwrap Dynamo's and the test utilities' backend wrappers
        if isinstance(backend, str):
            return backend in op_by_op
        if any(backend is lookup_backend(name) for name in op_by_op):
            return True
        if isinstance(backend, (testing.CompileCounter, testing.EagerAndRecordGraphs)):
            return True
        inner = next(
            (
                getattr(backend, name)
                for name in ("_torchdynamo_orig_backend", "compiler_fn", "backend", "__wrapped__")
                if getattr(backend, name, None) is not None
            ),
            None,
        )
        if inner is None or inner is backend:
            return False
        backend = inner
    return False


runs_graph_as_traced._dynamo_marked_constant = True  # type: ignore[attr-defined]


def stacks_bias_corrections(steps: list[Tensor]) -> bool:
    """Whether the capturable bias corrections of ``steps`` run on one stacked vector:
    only while compiling (eager capturable steps live on an accelerator, and eager
    non-capturable code uses Python floats) for a backend that runs the graph op by
    op (where the kernel count is the cost), and only for 0-d CPU steps of one dtype,
    which the per-tensor path would take one by one and ``torch.stack`` stacks
    without promoting."""
    if not (
        steps  # a group whose params have no grads steps nothing
        and torch.compiler.is_compiling()
        and torch._dynamo.config.optim_stacks_cpu_bias_corrections
        and runs_graph_as_traced()
    ):
        return False
    dtype = steps[0].dtype
    return all(step.is_cpu and step.dim() == 0 and step.dtype == dtype for step in steps)


def steps_are_distinct(steps: list[Tensor]) -> bool:
    """Whether no step tensor is listed twice (a parameter listed twice in a group,
    which torch.optim only warns about, or two parameters' states sharing a step).
    _single_tensor_adam increments a parameter's step just before its update, so the
    second update of a doubly listed step sees one more increment than the first; its
    stacked pre-pass, incrementing every step first, is only the same when the steps
    are distinct. (_multi_tensor_adam increments all steps before reading any, so a
    step listed twice is no different there.) dict.fromkeys, not a set: Dynamo builds
    the dict in one call, where it traces set's constructor element by element."""
    return len(dict.fromkeys(steps)) == len(steps)


def adam_bias_corrections(
    steps: list[Tensor],
    beta1: float | Tensor,
    beta2: float | Tensor,
    lr: float | Tensor,
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Return (step_size, bias_correction2_sqrt), one 0-d view per step, where
    step_size = -lr / (1 - beta1 ** step) and bias_correction2_sqrt =
    sqrt(1 - beta2 ** step): what _multi_tensor_adam's capturable branch builds with
    foreach ops, computed by the same operations in the same order."""
    stacked = torch.stack(steps)
    step_size = torch.pow(beta1, stacked).sub_(1).div_(lr).reciprocal_()
    bias_correction2_sqrt = torch.pow(beta2, stacked).sub_(1).neg_().sqrt_()
    return step_size.unbind(), bias_correction2_sqrt.unbind()


def adam_denominator_terms(
    steps: list[Tensor],
    beta1: float | Tensor,
    beta2: float | Tensor,
    lr: float | Tensor,
    eps: float,
) -> tuple[list[Tensor], list[Tensor]]:
    """Return (scale, eps_term), one 0-d view per step, for _single_tensor_adam's
    capturable denominator ``sqrt(exp_avg_sq) / scale + eps_term``: scale =
    sqrt(1 - beta2 ** step) * -(lr / (1 - beta1 ** step)) and eps_term = eps /
    -(lr / (1 - beta1 ** step)), written with the operators that branch uses per
    parameter."""
    stacked = torch.stack(steps)
    bias_correction1 = 1 - beta1**stacked
    bias_correction2 = 1 - beta2**stacked
    step_size_neg = (lr / bias_correction1).neg()
    scale = bias_correction2.sqrt() * step_size_neg
    eps_term = eps / step_size_neg
    return list(scale.unbind()), list(eps_term.unbind())
