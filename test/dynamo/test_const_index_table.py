# Owner(s): ["module: dynamo"]
"""Bytecode assembly indexes LOAD_CONSTs through one identity table
(ConstIndexTable): the same indices and co_consts as one scan per instruction
(get_const_index, what fix_vars does without this patch), with co_consts walked
once per pass."""

import dis

import torch
import torch._dynamo.test_case
from torch._dynamo.bytecode_transformation import (
    create_instruction,
    fix_vars,
    get_code_keys,
    get_const_index,
)
from torch._dynamo.testing import CompileCounter


class CountingTuple(tuple):
    """A co_consts that counts how often it is walked."""

    iterations = 0

    def __iter__(self):
        CountingTuple.iterations += 1
        return super().__iter__()


def code_options_of(fn):
    code = fn.__code__
    return {k: getattr(code, k) for k in get_code_keys()}, code._varname_from_oparg


def shared():
    return None


def foreach_step(xs):
    return torch._foreach_add(xs, 1)


class ConstIndexTableTests(torch._dynamo.test_case.TestCase):
    def assemble(self, argvals):
        """fix_vars over LOAD_CONSTs of argvals: their args and the co_consts after it."""
        code_options, varname_from_oparg = code_options_of(shared)
        insts = [create_instruction("LOAD_CONST", argval=v) for v in argvals]
        fix_vars(insts, code_options, varname_from_oparg)
        return [inst.arg for inst in insts], code_options["co_consts"]

    def assemble_by_scans(self, argvals):
        """The same by one get_const_index scan per instruction."""
        code_options, _ = code_options_of(shared)
        args = [get_const_index(code_options, v) for v in argvals]
        return args, code_options["co_consts"]

    def test_same_indices_and_consts_as_one_scan_per_instruction(self):
        zero, neg_zero, unhashable = 0.0, -0.0, [1, 2]
        existing = shared.__code__.co_consts[0]  # the function's own None
        argvals = [zero, neg_zero, 1, True, unhashable, existing, zero, unhashable, 1, (3, 4)]
        args, consts = self.assemble(argvals)
        ref_args, ref_consts = self.assemble_by_scans(argvals)
        self.assertEqual(args, ref_args)
        self.assertEqual([id(c) for c in consts], [id(c) for c in ref_consts])
        for arg, val in zip(args, argvals):
            self.assertIs(consts[arg], val)
        # Equal but different constants keep their own slots; the same object shares one.
        self.assertNotEqual(args[0], args[1])  # 0.0 and -0.0
        self.assertNotEqual(args[2], args[3])  # 1 and True
        self.assertEqual(args[0], args[6])
        self.assertEqual(args[4], args[7])
        self.assertEqual(args[5], shared.__code__.co_consts.index(existing))
        self.assertEqual(len(consts), len(shared.__code__.co_consts) + 6)

    def test_co_consts_walked_once_per_pass(self):
        # Without this patch: one walk per instruction, 500.
        values = list(range(500))
        code_options, varname_from_oparg = code_options_of(shared)
        code_options["co_consts"] = CountingTuple(values)
        insts = [create_instruction("LOAD_CONST", argval=v) for v in values]
        CountingTuple.iterations = 0
        fix_vars(insts, code_options, varname_from_oparg)
        self.assertEqual(CountingTuple.iterations, 1)
        self.assertEqual([inst.arg for inst in insts], values)

    def transformed_code(self, xs):
        torch._dynamo.reset()
        counter = CompileCounter()
        fn = torch.compile(foreach_step, backend=counter)
        for _ in range(2):
            for got, want in zip(fn(xs), foreach_step(xs)):
                self.assertEqual(got, want)
        self.assertEqual(counter.frame_count, 1)
        entries = torch._dynamo.eval_frame._debug_get_cache_entry_list(foreach_step.__code__)
        self.assertEqual(len(entries), 1)
        return entries[0].code

    def test_frame_over_many_inputs_one_slot_per_constant(self):
        xs = [torch.randn(2) for _ in range(300)]
        code = self.transformed_code(xs)
        # Each constant has one slot (the first index get_const_index would find).
        self.assertEqual(len({id(c) for c in code.co_consts}), len(code.co_consts))
        loaded = {inst.argval for inst in dis.get_instructions(code) if inst.opname == "LOAD_CONST"}
        self.assertTrue(set(range(300)) <= loaded)  # each input by its position


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
