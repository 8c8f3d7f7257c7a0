# Owner(s): ["module: optimizer"]
"""`opt.step = torch.compile(opt.step)` then an LR scheduler: the scheduler wraps the
compiled callable (which has no __func__), so the compiled step stays what runs."""

import gc
import warnings
import weakref

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounterWithBackend
from torch.optim import lr_scheduler
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize

SCHEDULERS = {
    "StepLR": lambda opt: lr_scheduler.StepLR(opt, step_size=2),
    "MultiStepLR": lambda opt: lr_scheduler.MultiStepLR(opt, milestones=[1, 3]),
    "ConstantLR": lambda opt: lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2),
    "LinearLR": lambda opt: lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=3),
    "ExponentialLR": lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.9),
    "PolynomialLR": lambda opt: lr_scheduler.PolynomialLR(opt, total_iters=4, power=2.0),
    "CosineAnnealingLR": lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=4),
    "LambdaLR": lambda opt: lr_scheduler.LambdaLR(opt, lambda epoch: 0.9**epoch),
    "MultiplicativeLR": lambda opt: lr_scheduler.MultiplicativeLR(opt, lambda epoch: 0.95),
    "CyclicLR": lambda opt: lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=2),
    "OneCycleLR": lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10),
    "CosineAnnealingWarmRestarts": lambda opt: lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2),
    "SequentialLR": lambda opt: lr_scheduler.SequentialLR(
        opt,
        [lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2), lr_scheduler.ExponentialLR(opt, gamma=0.9)],
        milestones=[2],
    ),
    "ChainedScheduler": lambda opt: lr_scheduler.ChainedScheduler(
        [lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2), lr_scheduler.ExponentialLR(opt, gamma=0.9)]
    ),
    "ReduceLROnPlateau": lambda opt: lr_scheduler.ReduceLROnPlateau(opt, patience=0),
}
STEPS = 6


def train(name, backend=None):
    """STEPS steps of SGD(momentum) on a small Linear with the scheduler `name`, opt.step
    compiled before the scheduler is built when a backend is given. Returns parameters,
    the lr and momentum each opt.step() saw, how many times a compiled graph ran and the
    warnings raised."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    counter, graph_runs = None, [0]
    if backend is not None:
        counter = CompileCounterWithBackend(backend)

        def counting(gm, example_inputs):
            compiled = counter(gm, example_inputs)

            def run(*args):
                graph_runs[0] += 1
                return compiled(*args)

            return run

        opt.step = torch.compile(opt.step, backend=counting)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scheduler = SCHEDULERS[name](opt)
        x = torch.randn(4, 3)
        seen, params = [], []
        for _ in range(STEPS):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            seen.append((opt.param_groups[0]["lr"], opt.param_groups[0]["momentum"]))
            opt.step()
            if name == "ReduceLROnPlateau":
                scheduler.step(1.0)
            else:
                scheduler.step()
            params.append([p.detach().clone() for p in model.parameters()])
    return params, seen, graph_runs[0] if counter else None, [str(w.message) for w in caught]


class CompiledStepWithSchedulerTests(torch._dynamo.test_case.TestCase):
    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    @parametrize("name", list(SCHEDULERS))
    def test_scheduler_wraps_compiled_step(self, name, backend):
        eager_params, eager_seen, _, eager_warnings = train(name)
        params, seen, graph_runs, caught = train(name, backend)
        self.assertEqual(seen, eager_seen)
        # Bitwise under "eager". Once lr is dynamic it feeds `alpha` of `_foreach_add_`, which
        # has no Tensor overload: the graph multiplies, then adds, where eager's kernel fuses
        # both, so aot_eager and inductor match to float32 rounding.
        tolerance = {"atol": 0, "rtol": 0} if backend == "eager" else {}
        for step, (got, want) in enumerate(zip(params, eager_params)):
            self.assertEqual(got, want, msg=f"step {step}", **tolerance)
        # The compiled step is what runs: one compiled graph per opt.step() call (how often
        # it recompiles is Dynamo's business, with or without a scheduler) ...
        self.assertEqual(graph_runs, STEPS)
        # ... and the scheduler saw each opt.step() call: no "scheduler before optimizer" warning.
        self.assertEqual([w for w in caught if "lr_scheduler.step()" in w], [])
        self.assertEqual([w for w in eager_warnings if "lr_scheduler.step()" in w], [])

    def test_wrapped_compiled_step_keeps_nothing_alive(self):
        def make():
            model = torch.nn.Linear(3, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            opt.step = torch.compile(opt.step, backend="eager")
            scheduler = lr_scheduler.ExponentialLR(opt, gamma=0.9)
            for _ in range(3):
                model(torch.randn(4, 3)).sum().backward()
                opt.step()
                scheduler.step()
            return weakref.ref(opt), weakref.ref(scheduler)

        refs = make()
        gc.collect()
        self.assertEqual([r() for r in refs], [None, None])

    def test_scheduler_still_wraps_a_plain_bound_step(self):
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        lr_scheduler.StepLR(opt, step_size=1)
        self.assertTrue(opt.step._wrapped_by_lr_sched)
        self.assertIs(opt.step.__wrapped__, torch.optim.SGD.step)


instantiate_parametrized_tests(CompiledStepWithSchedulerTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
