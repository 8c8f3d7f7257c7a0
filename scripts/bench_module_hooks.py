"""Guard cost of nn.Module hook registrations in a compiled frame.

Patches tensor-hook-residuals (registration by residual bytecode) and
module-hook-registration-stale-results (the length guards).

Run with the patched interpreter: .venv/bin/python scripts/bench_module_hooks.py
A frame that calls a module and registers a forward (pre-)hook on it guards the
length of the hook dicts it registers into
(UnspecializedNNModuleVariable.note_hook_registration). This times the frame's
RootGuardManager.check(frame locals) with those guards and with them left out
(note_hook_registration patched to a no-op), and the whole compiled call,
medians over repeats.
"""

import os
import sys
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib
import torch
import torch._dynamo
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.variables.nn_module import UnspecializedNNModuleVariable


def add_one(mod, args, out):
    return out + 1


def frame(m, x):
    # Calls the module, then registers (and removes) a hook on it: the call's
    # code must be guarded on the hook dicts' real lengths.
    y = m.lin(x)
    h = m.lin.register_forward_hook(add_one)
    h.remove()
    return y


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)


def measure(narrow_guards):
    torch._dynamo.reset()
    m, x = Holder(), torch.randn(4, 8)
    guard = (
        UnspecializedNNModuleVariable.note_hook_registration
        if narrow_guards
        else lambda *a: None
    )
    with mock.patch.object(
        UnspecializedNNModuleVariable, "note_hook_registration", guard
    ):
        compiled = torch.compile(frame, backend="eager")
        compiled(m, x)
    entries = _debug_get_cache_entry_list(frame.__code__)
    assert len(entries) == 1
    root = entries[0].guard_manager.root
    f_locals = {"m": m, "x": x}
    assert root.check(f_locals)
    n_hook_guards = sum(
        "DictGuardManager" in line and "._forward" in line and "_global" not in line
        for line in str(entries[0].guard_manager).splitlines()
    )
    return dict(
        guards=n_hook_guards,
        check=benchlib.median_us(lambda: root.check(f_locals), 2000),
        call=benchlib.median_us(lambda: compiled(m, x), 300),
    )


def main():
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}")
    without = measure(False)
    with_ = measure(True)
    benchlib.table(
        ["", "hook-dict length guards", "guard check us", "compiled call us"],
        [
            [name, r["guards"], f"{r['check']:.2f}", f"{r['call']:.1f}"]
            for name, r in (("without the narrow guards", without), ("with (patched)", with_))
        ],
    )


if __name__ == "__main__":
    main()
