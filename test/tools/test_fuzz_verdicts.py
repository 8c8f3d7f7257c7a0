"""scripts/fuzz_differential.py's verdict for a failing program stock torch cannot run:
the same program on the custom wheel with init_values_once off (traced through)."""

import importlib.util
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_differential.py"


def load_script():
    spec = importlib.util.spec_from_file_location("fuzz_differential", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TracedThroughVerdictTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cli = load_script()

    @unittest.skip(
        "torch 2.15.0: init_once/5061 no longer fails (the compiled step graph-breaks and "
        "raises as eager does); the only generated program found failing both ways, "
        "init_once/5226, is a dict key order mismatch still to be explained "
        "(docs/rebase-2.15.0.md), not a program to pin a verdict on"
    )
    def test_program_that_raises_mid_step_fails_traced_through_too(self):
        # init_once/5061 replaces a parameter's .data by another shape, so the step raises
        # after eager updated the first parameter; the compiled step raises at trace time
        # with nothing applied, with or without skip-and-guard.
        program = self.cli.fuzz.generate("init_once", 5061, "eager")
        self.assertIsNotNone(self.cli.fuzz.run_program(program).failure)
        verdict = self.cli.traced_through(program)
        self.assertTrue(verdict.startswith("traced through (config.init_values_once=False): fails too: "), verdict)

    def test_passing_program(self):
        program = self.cli.fuzz.generate("init_once", 5063, "eager")
        self.assertIsNone(self.cli.fuzz.run_program(program).failure)
        self.assertEqual(
            self.cli.traced_through(program), "traced through (config.init_values_once=False): passes (a dynapatch bug)"
        )


if __name__ == "__main__":
    unittest.main()
