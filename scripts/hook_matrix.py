"""Print the hook-pattern matrix of test/dynamo/test_hook_residuals.py for this torch.

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

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import test_hook_residuals as t  # noqa: E402


def cell(case, mode):
    fn, _, remove_first = t.CASES[case]
    expected = t.run_protocol(fn, remove_first)
    try:
        seen, frames, breaks, fallbacks = t.run_compiled(fn, mode, remove_first)
    except Exception as e:  # noqa: BLE001
        return f"crash {type(e).__name__}"
    try:
        for got, want in zip(seen, expected, strict=True):
            for key in ("fired", "returned", "stored"):
                assert got.pop(key) == want.pop(key)
            torch.testing.assert_close(got, want)
        ok = "ok"
    except Exception:  # noqa: BLE001
        ok = "WRONG"
    return f"{frames}/{breaks}/{fallbacks} {ok}"


def main():
    torch._logging.set_logs(dynamo=50)
    print(f"torch {torch.__version__}")
    print("| case | " + " | ".join(t.MODES) + " |")
    print("|---|" + "---|" * len(t.MODES))
    cases = dict(t.CASES, module_forward_hook_inside=(t.module_forward_hook_inside, 1, False))
    t.CASES = cases
    for case in cases:
        print(f"| {case} | " + " | ".join(cell(case, m) for m in t.MODES) + " |")


if __name__ == "__main__":
    main()
