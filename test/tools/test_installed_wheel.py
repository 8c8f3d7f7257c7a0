"""The torch installed in .venv is the custom wheel built from this checkout."""

import sys
import unittest
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from dplib.base import load_base  # noqa: E402
from dplib.common import Project  # noqa: E402
from dplib.series import load_series, series_digest  # noqa: E402


class InstalledWheelTest(unittest.TestCase):
    def test_version_label_and_series_hash(self):
        project = Project.at(ROOT)
        spec = load_base(project)
        self.assertEqual(torch.__version__, spec.patched_version)
        self.assertEqual(torch.version.dynapatch_base, spec.version)
        self.assertEqual(torch.version.dynapatch_series, series_digest(project, load_series(project)))

    def test_guard_accel_extension_imports(self):
        from torch._dynamo import _guard_accel

        self.assertRegex(_guard_accel.__version__, r"^\d+\.\d+\.\d+$")
        self.assertTrue(_guard_accel.__file__.startswith(str(Path(torch.__file__).parent)))


if __name__ == "__main__":
    unittest.main()
