# Owner(s): ["module: dynamo"]
"""Graph inputs that are consecutive elements of one container are loaded by one
helper call per run before the graph (config.codegen_batched_graph_inputs): the
same objects as the per-element loads, values equal eager after every call, the
same recompiles, and a constant number of instructions per run."""

import dis
import inspect

import torch
import torch._dynamo.test_case
from torch._dynamo import batched_graph_inputs
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.testing import CompileCounter

N = 40


def transformed_codes(fn):
    return [entry.code for entry in _debug_get_cache_entry_list(inspect.unwrap(fn).__code__)]


def instructions(code):
    return [ins for ins in dis.get_instructions(code) if ins.opname != "EXTENDED_ARG"]


def helper_calls(code):
    """Names of the batched_graph_inputs helpers the code loads (each loaded once)."""
    helpers = {"items", "attrs", "subscripts"}
    return sorted(
        ins.argval
        for ins in dis.get_instructions(code)
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval in helpers
    )


def seeded(i):
    gen = torch.Generator().manual_seed(i)
    return lambda *size: torch.randn(*size, generator=gen)


def make_params(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(3, generator=gen)) for _ in range(n)]


def set_grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(3, generator=gen)


def scale_all(xs):
    return [x * 2 for x in xs]


def total(xs):
    return sum(x * 2 for x in xs)


def grad_step(params):
    # The params are inputs first (all of them), then their grads: two runs.
    with torch.no_grad():
        torch._foreach_mul_(params, 0.99)
        torch._foreach_add_(params, [p.grad for p in params], alpha=-0.1)


class StateSGD:
    """Momentum buffers in a dict keyed by the parameters, read by position."""

    def __init__(self, params):
        self.params = params
        self.state = {p: {"momentum_buffer": torch.zeros_like(p)} for p in params}

    def step(self, grads):
        # Each list is read in one sweep, as torch.optim's _init_group collects them.
        with torch.no_grad():
            bufs = [s["momentum_buffer"] for s in self.state.values()]
            torch._foreach_mul_(bufs, 0.9)
            torch._foreach_add_(bufs, grads)
            torch._foreach_add_(self.params, bufs, alpha=-0.1)


def fresh_grads(n, step):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(3, generator=gen) for _ in range(n)]


class BatchedGraphInputsTests(torch._dynamo.test_case.TestCase):
    def run_calls(self, fn, make_args, calls=3, backend=None):
        """fn compiled vs eager on fresh copies of make_args(i) for each call; the
        compiled frame's counter."""
        cnt = backend or CompileCounter()
        opt_fn = torch.compile(fn, backend=cnt)
        for i in range(calls):
            eager_args, compiled_args = make_args(i), make_args(i)
            self.assertEqual(opt_fn(*compiled_args), fn(*eager_args))
            self.assertEqual(compiled_args, eager_args)
        return cnt

    def test_list_items_one_call(self):
        xs = [torch.randn(2) for _ in range(N)]
        for fn in (scale_all, total):
            cnt = self.run_calls(fn, lambda i: ([x + i for x in xs],))
            self.assertEqual(cnt.frame_count, 1)
            (code,) = transformed_codes(fn)
            self.assertEqual(helper_calls(code), ["items"])
        self.assertLess(len(instructions(code)), 60)

    def test_switch_off_loads_each_input(self):
        xs = [torch.randn(2) for _ in range(N)]
        with torch._dynamo.config.patch(codegen_batched_graph_inputs=False):
            cnt = self.run_calls(total, lambda i: ([x + i for x in xs],))
        self.assertEqual(cnt.frame_count, 1)
        (code,) = transformed_codes(total)
        self.assertEqual(helper_calls(code), [])
        self.assertGreater(len(instructions(code)), 3 * N)

    def test_instructions_do_not_grow_with_inputs(self):
        lengths = []
        for n in (20, 400):
            torch._dynamo.reset()
            xs = [torch.randn(2) for _ in range(n)]
            self.run_calls(total, lambda i, xs=xs: ([x + i for x in xs],), calls=1)
            (code,) = transformed_codes(total)
            lengths.append(len(instructions(code)))
        self.assertEqual(lengths[0], lengths[1])

    def test_grads_of_list_elements(self):
        # Inputs p[i] and p[i].grad: two runs over one list, each parameter's grad
        # read at call time (fresh grads every call).
        cnt = CompileCounter()
        eager, compiled = make_params(N), make_params(N)
        opt_step = torch.compile(grad_step, backend=cnt)
        for i in range(3):
            set_grads(eager, i)
            set_grads(compiled, i)
            grad_step(eager)
            opt_step(compiled)
            self.assertEqual(compiled, eager)
        self.assertEqual(cnt.frame_count, 1)
        (code,) = transformed_codes(grad_step)
        self.assertEqual(helper_calls(code), ["attrs", "items"])

    def test_dict_values_by_position(self):
        cnt = CompileCounter()
        eager, compiled = StateSGD(make_params(N)), StateSGD(make_params(N))
        opt_step = torch.compile(compiled.step, backend=cnt)
        for i in range(3):
            eager.step(fresh_grads(N, i))
            opt_step(fresh_grads(N, i))
            self.assertEqual(compiled.params, eager.params)
            self.assertEqual(list(compiled.state.values()), list(eager.state.values()))
        self.assertEqual(cnt.frame_count, 1)
        (code,) = transformed_codes(StateSGD.step)
        # The buffers (the state's values by position), the grads, the params.
        self.assertEqual(helper_calls(code), ["items", "subscripts"])

    def test_replaced_state_buffer_is_read(self):
        # A buffer replaced from outside by another tensor of the same metadata: the
        # run reads the new object (no recompile: a graph input, not a constant).
        cnt = CompileCounter()
        eager, compiled = StateSGD(make_params(N)), StateSGD(make_params(N))
        opt_step = torch.compile(compiled.step, backend=cnt)
        for i in range(3):
            for opt in (eager, compiled):
                opt.state[opt.params[5]]["momentum_buffer"] = torch.full((3,), float(i))
            eager.step(fresh_grads(N, i))
            opt_step(fresh_grads(N, i))
            self.assertEqual(compiled.params, eager.params)
            self.assertEqual(list(compiled.state.values()), list(eager.state.values()))
        self.assertEqual(cnt.frame_count, 1)

    def test_length_change_recompiles(self):
        xs = [torch.randn(2) for _ in range(N)]
        cnt = CompileCounter()
        opt_fn = torch.compile(scale_all, backend=cnt)
        for n in (N, N + 3, N - 3, N):
            inputs = (xs + xs)[:n]
            self.assertEqual(opt_fn(inputs), scale_all(inputs))
        self.assertEqual(cnt.frame_count, 3)  # one per length; the last reuses the first

    def test_mixed_inputs_keep_their_order(self):
        # A run, single inputs, a short run (per element), a tuple run, in one call.
        def fn(a, xs, b, short, ys):
            return a + b + sum(xs) + sum(short) * 2 + sum(ys) * 3

        def make(i):
            t = seeded(i)
            return t(2), [t(2) for _ in range(N)], t(2), [t(2) for _ in range(3)], tuple(t(2) for _ in range(12))

        cnt = self.run_calls(fn, make)
        self.assertEqual(cnt.frame_count, 1)
        (code,) = transformed_codes(fn)
        self.assertEqual(helper_calls(code), ["items"])
        with torch._dynamo.config.patch(codegen_batched_graph_inputs=False):
            torch._dynamo.reset()
            self.run_calls(fn, make, calls=1)
        (per_element,) = transformed_codes(fn)
        # 40 + 12 inputs in two runs; the other five loaded one by one.
        self.assertLess(len(instructions(code)), len(instructions(per_element)) - 2 * 52)

    def test_interleaved_sources_are_not_batched(self):
        # Inputs alternate between two lists: no run of MIN_RUN, per-element loads.
        def fn(xs, ys):
            return [x * y for x, y in zip(xs, ys)]

        def make(i):
            t = seeded(i)
            return [t(2) for _ in range(N)], [t(2) for _ in range(N)]

        cnt = self.run_calls(fn, make)
        self.assertEqual(cnt.frame_count, 1)
        (code,) = transformed_codes(fn)
        self.assertEqual(helper_calls(code), [])

    def test_list_subclass_is_not_batched(self):
        class Tensors(list):
            def __getitem__(self, i):
                return super().__getitem__(i)

        xs = Tensors(torch.randn(2) for _ in range(N))
        cnt = self.run_calls(scale_all, lambda i: (xs,), calls=2)
        self.assertEqual(cnt.frame_count, 1)
        for code in transformed_codes(scale_all):
            self.assertEqual(helper_calls(code), [])

    def test_torch_optim_sgd(self):
        eager_params, compiled_params = make_params(N), make_params(N)
        eager = torch.optim.SGD(eager_params, lr=0.1, momentum=0.9, foreach=True)
        compiled = torch.optim.SGD(compiled_params, lr=0.1, momentum=0.9, foreach=True)
        cnt = CompileCounter()
        step = torch.compile(compiled.step, backend=cnt)
        for i in range(4):
            set_grads(eager_params, i)
            set_grads(compiled_params, i)
            eager.step()
            step()
            self.assertEqual(compiled_params, eager_params)
            for pe, pc in zip(eager_params, compiled_params):
                self.assertEqual(compiled.state[pc]["momentum_buffer"], eager.state[pe]["momentum_buffer"])
        self.assertEqual(cnt.frame_count, 2)  # the first step creates the momentum buffers
        for code in transformed_codes(torch.optim.SGD.step):
            self.assertEqual(helper_calls(code), ["attrs"])  # the grads; params and buffers are static

    def test_helpers_raise_index_error_like_a_load(self):
        xs = [1, 2, 3]
        self.assertEqual(batched_graph_inputs.items(xs, 1, 3), [2, 3])
        with self.assertRaises(IndexError):
            batched_graph_inputs.items(xs, 0, 4)
        with self.assertRaises(IndexError):
            batched_graph_inputs.attrs(xs, 0, 5, "real")
        with self.assertRaises(IndexError):
            batched_graph_inputs.subscripts([{"k": 1}], 0, 2, "k")
        self.assertEqual(batched_graph_inputs.subscripts([{"k": 1}, {"k": 2}], 0, 2, "k"), [1, 2])


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
