"""The torch installed in .venv is the custom wheel built from this checkout, and says so."""

import dataclasses
import hashlib
import subprocess
import sys
import unittest
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from dplib.base import base_variants, load_base, unpinned_version  # noqa: E402
from dplib.common import Project  # noqa: E402
from dplib.series import load_series, series_digest  # noqa: E402

# The BASE block of the running interpreter: its wheels differ per Python (cp311, cp312, ...).
PYTHON_TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"


def installed_base(project):
    """The base the installed wheel was built from: its BASE block, or (a CPU build given to build by
    --base-wheel, no block) the release's CPU version with the file and sha256 the wheel records."""
    variant = torch.version.dynapatch_variant
    if any(s.variant == variant and s.python_tag == PYTHON_TAG for s in base_variants(project)):
        return load_base(project, variant, PYTHON_TAG)
    from torch._dynamo import dynapatch

    version = unpinned_version(project)
    return dataclasses.replace(load_base(project, python_tag=PYTHON_TAG), version=version, torch_version=version,
                               variant=variant, label=version.split("+")[1], wheel=dynapatch.RECORD["base_wheel"],
                               sha256=dynapatch.RECORD["base_sha256"], pinned=False)


class InstalledWheelTest(unittest.TestCase):
    def test_version_label_and_series_hash(self):
        project = Project.at(ROOT)
        spec = installed_base(project)
        self.assertEqual(torch.__version__, spec.patched_version)
        self.assertEqual(torch.version.dynapatch_base, spec.version)
        self.assertEqual(torch.version.dynapatch_series, series_digest(project, load_series(project)))

    def test_wheel_records_the_series(self):
        from torch._dynamo import dynapatch

        project = Project.at(ROOT)
        patches = load_series(project)
        spec = installed_base(project)
        record = dynapatch.RECORD
        self.assertEqual(record["patches"], [{"name": p.name, "sha256": hashlib.sha256(p.path.read_bytes()).hexdigest()}
                                             for p in patches])
        self.assertEqual((record["version"], record["variant"], record["base_sha256"], record["series_sha256"]),
                         (torch.__version__, spec.variant, spec.sha256, torch.version.dynapatch_series))
        self.assertEqual(record.get("base_pinned", True), spec.pinned)
        self.assertRegex(record["commit"], r"^([0-9a-f]{40}(\+dirty)?|unknown.*)$")
        proc = subprocess.run([sys.executable, "-W", "error", "-m", "torch._dynamo.dynapatch"],
                              capture_output=True, text=True, cwd=ROOT / "test")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stderr, "")
        self.assertEqual(proc.stdout.splitlines()[0], f"torch {torch.__version__} (dynapatch, {spec.variant} variant)")
        for patch in record["patches"]:
            self.assertIn(f"  {patch['sha256']}  {patch['name']}\n", proc.stdout)

    def test_guard_accel_extension_imports(self):
        from torch._dynamo import _guard_accel

        self.assertRegex(_guard_accel.__version__, r"^\d+\.\d+\.\d+$")
        self.assertTrue(_guard_accel.__file__.startswith(str(Path(torch.__file__).parent)))


if __name__ == "__main__":
    unittest.main()
