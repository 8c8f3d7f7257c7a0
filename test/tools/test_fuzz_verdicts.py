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

    def test_program_failing_on_upstream_dynamo_fails_traced_through_too(self):
        # init_once/5226 writes into a global dict its frame compiled with; between calls a
        # `cache["d"] = cache.pop("d")` from outside reorders it. Dynamo without the series
        # replays a global dict's mutation as a rebuild in the key order it traced, and
        # guards its length and keys, not their order: the compiled run ends with the old
        # order (values equal). Stock 2.15.0 fails the same way on the shrunk program (no
        # init_values_once left in it), so the verdict on the whole program is "fails too".
        program = self.cli.fuzz.generate("init_once", 5226, "eager")
        failure = self.cli.fuzz.run_program(program).failure
        self.assertIsNotNone(failure)
        self.assertIn("dict keys", str(failure))
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
