# Owner(s): ["module: dynamo"]
"""Every torch.optim optimizer compiled through InitValuesOnceVariable matches eager.

_init_group runs for real at trace time (once per param group); the compiled step
must update parameters and every state entry exactly as eager does, with no more
frames than without this patch.
"""

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

OPTIMIZERS = {
    "SGD": {"lr": 0.1, "momentum": 0.9},
    "Adam": {"lr": 0.01},
    "AdamW": {"lr": 0.01},
    "Adagrad": {"lr": 0.1},
    "Adadelta": {"lr": 1.0},
    "Adamax": {"lr": 0.01},
    "NAdam": {"lr": 0.01},
    "RAdam": {"lr": 0.01},
    "RMSprop": {"lr": 0.01},
    "Rprop": {"lr": 0.01},
    "ASGD": {"lr": 0.01},
}

# Frames and graph breaks over the 10 steps of test_matches_eager, for every optimizer,
# foreach True and False, one and two param groups, measured by running this file's
# loop on torch 2.13.0 without this patch series: SGD compiles twice (the momentum
# buffers SGD.step stores after its first step change the state it guards), every
# other optimizer once; each has the one graph break of _use_grad_for_differentiable.
FRAMES_WITHOUT_PATCH = {name: 2 if name == "SGD" else 1 for name in OPTIMIZERS}
GRAPH_BREAKS_WITHOUT_PATCH = 1

# The compiled step takes the torch.compiler.is_compiling() branches of torch.optim
# (step counts stay tensors, bias corrections are float32 tensor math instead of
# Python floats), so most optimizers differ from eager in the last bits, also without
# this patch. Measured the same way, these (optimizer, foreach) pairs are bitwise
# equal to eager; the others are compared with assertEqual's float32 tolerance.
BITWISE_WITHOUT_PATCH = {
    ("SGD", False),
    ("SGD", True),
    ("Adagrad", True),
    ("Adadelta", True),
    ("RMSprop", True),
    ("Rprop", False),
    ("Rprop", True),
    ("ASGD", True),
}


def make_params():
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(2, 3, generator=gen)) for _ in range(3)]


def set_grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)


def param_groups(name, params, groups):
    options = {"maximize": True}
    if name != "Rprop":  # Rprop has no weight decay
        options["weight_decay"] = 0.1
    if groups == 1:
        return [{"params": params, **options}]
    # The usual decay / no-decay split: the second group adds state to a dict the
    # first group's _init_group already filled.
    return [{"params": params[:1]}, {"params": params[1:], **options}]


class AllOptimizersTests(torch._dynamo.test_case.TestCase):
    def assert_same(self, eager, compiled, bitwise, msg):
        if bitwise:
            self.assertEqual(type(eager), type(compiled), msg=msg)
            if isinstance(eager, torch.Tensor):
                self.assertEqual(eager.dtype, compiled.dtype, msg=msg)
                self.assertTrue(torch.equal(eager, compiled), msg=f"{msg}: {eager} != {compiled}")
            else:
                self.assertEqual(eager, compiled, msg=msg)
        else:
            self.assertEqual(eager, compiled, msg=msg)

    def check_step(self, eager_opt, compiled_opt, eager_params, compiled_params, bitwise, step):
        for i, (pe, pc) in enumerate(zip(eager_params, compiled_params)):
            self.assert_same(pe.detach(), pc.detach(), bitwise, f"step {step}: param {i}")
        self.assertEqual(len(eager_opt.state), len(compiled_opt.state))
        for i, (pe, pc) in enumerate(zip(eager_params, compiled_params)):
            self.assertEqual(pe in eager_opt.state, pc in compiled_opt.state, msg=f"step {step}: state of param {i}")
            if pe not in eager_opt.state:
                continue
            state_e, state_c = eager_opt.state[pe], compiled_opt.state[pc]
            self.assertEqual(list(state_e), list(state_c), msg=f"step {step}: state keys of param {i}")
            for key in state_e:
                self.assert_same(state_e[key], state_c[key], bitwise, f"step {step}: state[{i}][{key!r}]")

    def test_matches_eager(self):
        for name, kwargs in OPTIMIZERS.items():
            for foreach in (False, True):
                for groups in (1, 2):
                    with self.subTest(optimizer=name, foreach=foreach, groups=groups):
                        torch._dynamo.reset()
                        counters.clear()
                        eager_params, compiled_params = make_params(), make_params()
                        cls = getattr(torch.optim, name)
                        eager = cls(param_groups(name, eager_params, groups), foreach=foreach, **kwargs)
                        compiled = cls(param_groups(name, compiled_params, groups), foreach=foreach, **kwargs)
                        cnt = CompileCounterWithBackend("eager")
                        step = torch.compile(compiled.step, backend=cnt)
                        bitwise = (name, foreach) in BITWISE_WITHOUT_PATCH
                        for i in range(10):
                            set_grads(eager_params, i)
                            set_grads(compiled_params, i)
                            eager.step()
                            step()
                            self.check_step(eager, compiled, eager_params, compiled_params, bitwise, i)
                        self.assertLessEqual(cnt.frame_count, FRAMES_WITHOUT_PATCH[name])
                        self.assertLessEqual(sum(counters["graph_break"].values()), GRAPH_BREAKS_WITHOUT_PATCH)

    def test_user_init_values_once_on_init_group_changes_nothing(self):
        # OptimizerVariable runs _init_group with the optimizer's own guards, which
        # cover its whole state; an init_values_once(guards=...) decorator on a
        # subclass's _init_group is not used (it names fewer inputs than
        # _init_group depends on). The step compiles as for SGD itself.
        class DecoratedSGD(torch.optim.SGD):
            @torch._dynamo.init_values_once(guards=["self.param_groups"])
            def _init_group(self, group, params, grads, momentum_buffer_list):
                return super()._init_group(group, params, grads, momentum_buffer_list)

        def run(cls, compiled):
            torch._dynamo.reset()
            counters.clear()
            params = make_params()
            opt = cls(params, lr=0.1, momentum=0.9)
            guards = []
            cnt = CompileCounterWithBackend("eager")
            step = opt.step
            if compiled:
                step = torch._dynamo.optimize(cnt, guard_export_fn=guards.extend)(step)
            for i in range(4):
                set_grads(params, i)
                step()
            return opt, params, cnt.frame_count, dict(counters["graph_break"]), guards

        eager, eager_params, *_ = run(torch.optim.SGD, False)
        _, _, frames, breaks, guards = run(torch.optim.SGD, True)
        opt, params, user_frames, user_breaks, user_guards = run(DecoratedSGD, True)
        self.check_step(eager, opt, eager_params, params, True, 3)
        self.assertEqual((user_frames, user_breaks), (frames, breaks))
        self.assertEqual(len(user_guards), len(guards))
        self.assertEqual(
            [g for g in user_guards if "init_values_once[" in str(g.user_stack)], []
        )

    def test_add_param_group(self):
        # Frames after each of the 8 steps, measured as above without this patch: the
        # new group (added before step 3) recompiles once; SGD also stores momentum
        # buffers after the first step of each group.
        frames_without_patch = {
            "Adam": [1, 1, 1, 2, 2, 2, 2, 2],
            "SGD": [1, 2, 2, 3, 4, 4, 4, 4],
        }
        for name, bound in frames_without_patch.items():
            for foreach in (False, True):
                with self.subTest(optimizer=name, foreach=foreach):
                    torch._dynamo.reset()
                    counters.clear()
                    eager_params, compiled_params = make_params() + make_params()[:1], make_params() + make_params()[:1]
                    cls, kwargs = getattr(torch.optim, name), OPTIMIZERS[name]
                    eager = cls(eager_params[:2], foreach=foreach, **kwargs)
                    compiled = cls(compiled_params[:2], foreach=foreach, **kwargs)
                    cnt = CompileCounterWithBackend("eager")
                    step = torch.compile(compiled.step, backend=cnt)
                    for i in range(8):
                        if i == 3:
                            eager.add_param_group({"params": eager_params[2:], "weight_decay": 0.1})
                            compiled.add_param_group({"params": compiled_params[2:], "weight_decay": 0.1})
                        set_grads(eager_params, i)
                        set_grads(compiled_params, i)
                        eager.step()
                        step()
                        bitwise = (name, foreach) in BITWISE_WITHOUT_PATCH
                        self.check_step(eager, compiled, eager_params, compiled_params, bitwise, i)
                        self.assertLessEqual(cnt.frame_count, bound[i], msg=f"after step {i}")
                    self.assertLessEqual(sum(counters["graph_break"].values()), GRAPH_BREAKS_WITHOUT_PATCH)

    def test_two_param_groups_other_backends(self):
        # The state the second group's _init_group adds reaches AOTAutograd and
        # Inductor as graph inputs like the first group's (1 frame, as without this patch).
        for backend in ("aot_eager", "inductor"):
            with self.subTest(backend=backend):
                torch._dynamo.reset()
                eager_params, compiled_params = make_params(), make_params()
                eager = torch.optim.Adam(param_groups("Adam", eager_params, 2), lr=0.01, foreach=True)
                compiled = torch.optim.Adam(param_groups("Adam", compiled_params, 2), lr=0.01, foreach=True)
                cnt = CompileCounterWithBackend(backend)
                step = torch.compile(compiled.step, backend=cnt)
                for i in range(3):
                    set_grads(eager_params, i)
                    set_grads(compiled_params, i)
                    eager.step()
                    step()
                    self.check_step(eager, compiled, eager_params, compiled_params, False, i)
                self.assertEqual(cnt.frame_count, FRAMES_WITHOUT_PATCH["Adam"])


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
