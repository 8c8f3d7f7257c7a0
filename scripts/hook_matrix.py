"""Print the hook-pattern matrices of test/dynamo/test_hook_residuals.py (tensor
hooks; row 9: remove() of a handle from outside the frame, one per RemovableHandle
producer, then code that would run the hook) and test_module_hook_residuals.py
(row 8: nn.Module forward / forward-pre hooks registered inside the frame) for
this torch.

Run with a stock and a patched interpreter to compare:
    /tmp/stock/bin/python scripts/hook_matrix.py
    .venv/bin/python scripts/hook_matrix.py
Per case and mode: frames compiled / graph breaks / silent fallbacks
(counters["unimplemented"]), and whether what the user observes (outputs, hook
counts after the call and after remove(), gradients, hooks fired) matches eager.
"""

import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "test", "dynamo"))
warnings.filterwarnings("ignore")

import test_hook_residuals as t  # noqa: E402
import test_module_hook_residuals as mt  # noqa: E402

import torch  # noqa: E402
import torch._dynamo  # noqa: E402


def cell(case, mode):
    fn, _, remove_first = t.ALL_CASES[case]
    expected = t.run_protocol(fn, remove_first)
    try:
        seen, frames, breaks, fallbacks = t.run_compiled(fn, mode, remove_first)
    except Exception as e:
        return f"crash {type(e).__name__}"
    try:
        for got, want in zip(seen, expected, strict=True):
            for key in ("fired", "returned", "stored"):
                assert got.pop(key) == want.pop(key)
            torch.testing.assert_close(got, want)
        ok = "ok"
    except Exception:
        ok = "WRONG"
    return f"{frames}/{breaks}/{fallbacks} {ok}"


def module_cell(case, mode):
    fn, remove_after, _, _ = mt.CASES[case]
    expected = mt.run_protocol(fn, remove_after)
    torch._dynamo.utils.counters.clear()
    try:
        seen, frames, breaks = mt.run_compiled(fn, mode, remove_after)
    except Exception as e:
        return f"crash {type(e).__name__}"
    fallbacks = sum(torch._dynamo.utils.counters["unimplemented"].values())
    try:
        for got, want in zip(seen, expected, strict=True):
            for key in ("out", "grads"):
                torch.testing.assert_close(got.pop(key), want.pop(key))
            assert got == want
        ok = "ok"
    except Exception:
        ok = "WRONG"
    return f"{frames}/{breaks}/{fallbacks} {ok}"


def removal_cell(kind, mode):
    expected = t.run_removal_protocol(kind, t.remove_then(kind))
    try:
        seen, frames, breaks, fallbacks = t.run_removal_compiled(kind, mode)
    except Exception as e:
        return f"crash {type(e).__name__}"
    try:
        torch.testing.assert_close(seen, expected)
        ok = "ok"
    except Exception:
        ok = "WRONG"
    return f"{frames}/{sum(breaks.values())}/{fallbacks} {ok}"


def main():
    torch._logging.set_logs(dynamo=50)
    print(f"torch {torch.__version__}")
    print("| case | " + " | ".join(t.MODES) + " |")
    print("|---|" + "---|" * len(t.MODES))
    for case in t.ALL_CASES:
        print(f"| {case} | " + " | ".join(cell(case, m) for m in t.MODES) + " |")
    print()
    print("Row 8, nn.Module forward / forward-pre hooks registered inside:")
    print("| case | " + " | ".join(mt.MODES) + " |")
    print("|---|" + "---|" * len(mt.MODES))
    for case in mt.CASES:
        print(f"| {case} | " + " | ".join(module_cell(case, m) for m in mt.MODES) + " |")
    print()
    print("Row 9, remove() of a handle from outside the frame, then code that would run the hook:")
    print("| kind | " + " | ".join(t.MODES) + " |")
    print("|---|" + "---|" * len(t.MODES))
    for kind in t.REMOVAL_KINDS:
        print(f"| {kind} | " + " | ".join(removal_cell(kind, m) for m in t.MODES) + " |")


if __name__ == "__main__":
    main()
