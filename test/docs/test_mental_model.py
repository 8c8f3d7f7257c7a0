"""Every example in docs/mental-model.md prints what the page says it prints.

Each ```python block followed by a ```text block is run on its own (fresh Dynamo
state, fresh namespace); its stdout must equal the text block. EXPECTTEST_ACCEPT=1
rewrites the text blocks from the actual output.
"""

import contextlib
import io
import os
import re
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch._dynamo.test_case

DOC = Path(__file__).resolve().parents[2] / "docs" / "mental-model.md"
EXAMPLE = re.compile(r"```python\n(?P<code>.*?)```\n\n```text\n(?P<output>.*?)```", re.S)


def run_example(code: str) -> str:
    """The example's stdout when run as a script (python mental_model_example.py) would print it."""
    torch._dynamo.reset()
    # A real module, so classes defined by the example can be found by Dynamo, and a real
    # file: torch.compile wraps functions of exec'd "<string>" code in a frame of its own,
    # whose guards (on fn, args, kwargs) a script does not have.
    module = types.ModuleType("mental_model_example")
    sys.modules[module.__name__] = module
    out = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mental_model_example.py"
        path.write_text(code)
        module.__file__ = str(path)
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, str(path), "exec"), module.__dict__)
        finally:
            del sys.modules[module.__name__]
    return out.getvalue()


class MentalModelDocsTest(torch._dynamo.test_case.TestCase):
    def test_examples_print_what_the_page_says(self):
        text = DOC.read_text()
        examples = list(EXAMPLE.finditer(text))
        self.assertGreaterEqual(len(examples), 5)
        if os.environ.get("EXPECTTEST_ACCEPT") == "1":
            DOC.write_text(EXAMPLE.sub(
                lambda m: f"```python\n{m['code']}```\n\n```text\n{run_example(m['code'])}```", text))
            return
        from torch._dynamo import guard_accel

        native = guard_accel.extension() is not None
        for number, example in enumerate(examples, 1):
            with self.subTest(example=number):
                output = run_example(example["code"])
                if not native and "accelerated" in example["output"]:
                    # The page shows the wheel's native guards; stock guards print more.
                    self.assertNotIn("accelerated", output)
                    continue
                self.assertEqual(output, example["output"])

    def test_guard_summaries_print_the_same_as_a_script(self):
        # The page's guard counts are what a user running the example as a script sees.
        import subprocess

        examples = [m for m in EXAMPLE.finditer(DOC.read_text()) if "explain_guards(" in m["code"]]
        self.assertGreaterEqual(len(examples), 1)
        for example in examples:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "mental_model_example.py"
                path.write_text(example["code"])
                proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=tmp)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertEqual(proc.stdout, example["output"])


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
