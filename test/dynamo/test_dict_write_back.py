# Owner(s): ["module: dynamo"]
"""After the graph, only the dict entries whose value changed are written back
(ConstDictVariable.holds_original_value): torch.optim's
state[p]["momentum_buffer"] = buf, buf the tensor the entry holds, is not replayed."""

import dis
import inspect

import torch
import torch._dynamo.test_case
from torch._dynamo.convert_frame import register_bytecode_hook
from torch._dynamo.testing import CompileCounter


def make_params(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(2, generator=gen)) for _ in range(n)]


def set_grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(2, generator=gen)


def after_graph(code):
    """The instructions after the call of the compiled graph (the residual bytecode)."""
    ins = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    start = next(k for k, i in enumerate(ins) if i.opname == "LOAD_GLOBAL" and "__compiled_fn" in str(i.argval))
    # Follow the stack from the compiled function (and its NULL) pushed: the CALL that
    # pops them is the graph call.
    depth = 0
    for k in range(start + 1, len(ins)):
        arg = ins[k].arg if ins[k].opcode >= dis.HAVE_ARGUMENT else None
        depth += dis.stack_effect(ins[k].opcode, arg, jump=False)
        if ins[k].opname in ("CALL", "CALL_FUNCTION_EX") and depth == -1:
            return ins[k + 1 :]
    raise AssertionError("no graph call found")


def method_loads(instructions, name):
    return sum(1 for i in instructions if i.opname in ("LOAD_METHOD", "LOAD_ATTR") and i.argval == name)


class DictWriteBackTests(torch._dynamo.test_case.TestCase):
    # after_graph follows the stack from the graph call: without the runtime overhead
    # markers' branches around it.
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._exit_stack.enter_context(torch._dynamo.config.patch(record_runtime_overhead=False))

    def assert_same_state(self, eager, compiled, eager_params, compiled_params):
        self.assertEqual(eager_params, compiled_params)
        for pe, pc in zip(eager_params, compiled_params):
            self.assertEqual(list(eager.state[pe].keys()), list(compiled.state[pc].keys()))
            for key in eager.state[pe]:
                self.assertEqual(eager.state[pe][key], compiled.state[pc][key])

    def run_sgd(self, n, steps=4, between=None):
        eager_params, compiled_params = make_params(n), make_params(n)
        eager = torch.optim.SGD(eager_params, lr=0.1, momentum=0.9, foreach=True)
        compiled = torch.optim.SGD(compiled_params, lr=0.1, momentum=0.9, foreach=True)
        cnt = CompileCounter()
        step = torch.compile(compiled.step, backend=cnt)
        sgd_step = inspect.unwrap(torch.optim.SGD.step).__code__
        self.step_codes = []
        handle = register_bytecode_hook(
            lambda code, new_code: self.step_codes.append(new_code) if code is sgd_step else None
        )
        self.addCleanup(handle.remove)
        for i in range(steps):
            if between is not None and i >= 2:
                between(i, eager, eager_params)
                between(i, compiled, compiled_params)
            set_grads(eager_params, i)
            set_grads(compiled_params, i)
            eager_bufs = [eager.state[p].get("momentum_buffer") for p in eager_params]
            compiled_bufs = [compiled.state[p].get("momentum_buffer") for p in compiled_params]
            eager.step()
            step()
            self.assert_same_state(eager, compiled, eager_params, compiled_params)
            # The same buffer objects are kept (or replaced) as eagerly.
            for pe, pc, be, bc in zip(eager_params, compiled_params, eager_bufs, compiled_bufs):
                self.assertEqual(
                    eager.state[pe]["momentum_buffer"] is be, compiled.state[pc]["momentum_buffer"] is bc
                )
        return cnt

    def steady_code(self):
        # The last code made: the steady step's (the first step has no momentum
        # buffers yet, and its frame restarts once).
        return self.step_codes[-1]

    def test_sgd_steady_step_writes_no_momentum_buffer_back(self):
        self.run_sgd(20)
        small = after_graph(self.steady_code())
        self.assertEqual(method_loads(small, "update"), 0)
        torch._dynamo.reset()
        self.run_sgd(40)
        large = after_graph(self.steady_code())
        # Nothing per parameter after the graph.
        self.assertEqual(len(small), len(large))

    def test_buffer_replaced_mutated_or_deleted_from_outside(self):
        def between(i, opt, params):
            if i == 2:
                opt.state[params[0]]["momentum_buffer"] = torch.ones(2)  # replaced
                opt.state[params[1]]["momentum_buffer"].mul_(0.5)  # mutated
                del opt.state[params[2]]["momentum_buffer"]  # deleted: made again
            elif i == 3:
                # the key renamed: the step makes a new buffer and keeps the old one
                state = opt.state[params[3]]
                state["other"] = state.pop("momentum_buffer")

        cnt = self.run_sgd(6, steps=5, between=between)
        # Every step compiles: 0 without momentum buffers, 1 with them, 2 and 3
        # after the changes from outside, 4 with buffer 3 made again (5 without this
        # patch too); values and state match eager after each (run_sgd).
        self.assertEqual(cnt.frame_count, 5)

    def test_store_of_another_entry_is_written(self):
        def fn(d):
            a, b = d["a"], d["b"]
            d["a"] = b  # another slot's value
            d["b"] = b  # its own
            d["c"] = a * 2  # a new value
            return a + b

        def make():
            return {"a": torch.zeros(2), "b": torch.ones(2), "c": torch.full((2,), 3.0)}

        eager_d, compiled_d = make(), make()
        cnt = CompileCounter()
        self.assertEqual(fn(eager_d), torch.compile(fn, backend=cnt)(compiled_d))
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(list(eager_d), list(compiled_d))
        self.assertEqual(list(eager_d.values()), list(compiled_d.values()))
        self.assertIs(compiled_d["a"], compiled_d["b"])


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
