"""The patch-series toolchain (scripts/dynapatch.py), run on temporary copies of the project."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DYNAPATCH_CACHE_DIR", ROOT / "build" / "cache"))
PROJECT_FILES = ("patches", "torch_overlay", "scripts", "csrc", "setup.py", "CMakeLists.txt",
                 "requirements-build.txt", "requirements-test.txt")
WHEEL_TAGS = "cp311-cp311-manylinux_2_28_x86_64"

sys.path.insert(0, str(ROOT / "scripts"))
from dplib import wheel as wheel_mod  # noqa: E402
from dplib.base import load_base  # noqa: E402
from dplib.common import Project  # noqa: E402


class ProjectCopyTestCase(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="dynapatch-test-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.project = self.tmp / "project"
        for name in PROJECT_FILES:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, self.project / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif src.exists():
                (self.project / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, self.project / name)
        (self.project / "torch_overlay").mkdir(exist_ok=True)
        self.patch = sorted((self.project / "patches").glob("0001-*.patch"))[0]

    def dynapatch(self, *args):
        return subprocess.run(
            [sys.executable, str(self.project / "scripts" / "dynapatch.py"), "--cache-dir", str(CACHE), *args],
            cwd=self.tmp, text=True, capture_output=True)

    def assertFailsWith(self, proc, exit_code, *fragments):
        self.assertEqual(proc.returncode, exit_code, proc.stdout + proc.stderr)
        for fragment in fragments:
            self.assertIn(fragment, proc.stderr)

    def assertNoWheel(self):
        self.assertEqual(list((self.project / "dist").glob("*.whl")), [])

    def stale_wheel(self):
        """A wheel from an earlier build: a failed build must remove it."""
        (self.project / "dist").mkdir(exist_ok=True)
        (self.project / "dist" / f"torch-2.13.0+cpu.dynapatch.1-{WHEEL_TAGS}.whl").write_bytes(b"old")


class SeriesValidationTest(ProjectCopyTestCase):
    def test_check_passes(self):
        proc = self.dynapatch("check")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("apply with zero fuzz and no offsets", proc.stdout)

    def test_patch_with_changed_context_names_patch_file_and_hunk(self):
        text = self.patch.read_text()
        self.patch.write_text(text.replace(" # which will directly inline\n", " # which will inline\n", 1))
        self.stale_wheel()
        proc = self.dynapatch("build", "--no-venv")
        self.assertFailsWith(proc, 2, self.patch.name, "torch/_dynamo/variables/optimizer.py", "@@ -150,7 +152,7 @@")
        self.assertNoWheel()

    def test_truncated_patch_is_reported_corrupt(self):
        text = self.patch.read_text()
        self.patch.write_text(text[: text.index("+        if name ==")] + "-garbage\n")
        proc = self.dynapatch("check")
        self.assertFailsWith(proc, 2, self.patch.name, "corrupt")

    def test_missing_header_fields(self):
        text = self.patch.read_text()
        self.patch.write_text(re.sub(r"Upstream-Status: .*\n", "", text))
        proc = self.dynapatch("check")
        self.assertFailsWith(proc, 1, self.patch.name, "Upstream-Status")

    def test_unlisted_and_duplicate_patches(self):
        extra = self.patch.with_name("0099-stray.patch")
        shutil.copy(self.patch, extra)
        self.assertFailsWith(self.dynapatch("check"), 1, "unused", "0099-stray.patch")
        series = self.project / "patches" / "series"
        series.write_text(series.read_text() + "0099-stray.patch\n")
        self.assertFailsWith(self.dynapatch("check"), 1, "same diff", "0099-stray.patch")

    def test_missing_overlay_file(self):
        text = self.patch.read_text()
        self.patch.write_text(text.replace("Upstream-Status:", "Overlay-File: torch/_dynamo/absent.py\nUpstream-Status:"))
        self.stale_wheel()
        proc = self.dynapatch("build", "--no-venv")
        self.assertFailsWith(proc, 1, self.patch.name, "torch_overlay/torch/_dynamo/absent.py", "missing")
        self.assertNoWheel()

    def test_unclaimed_overlay_file(self):
        stray = self.project / "torch_overlay" / "torch" / "_dynamo" / "stray.py"
        stray.parent.mkdir(parents=True, exist_ok=True)
        stray.write_text("x = 1\n")
        self.assertFailsWith(self.dynapatch("check"), 1, "torch/_dynamo/stray.py")


class BaseWheelTest(ProjectCopyTestCase):
    def fake_wheel(self, version, payload=b"not torch"):
        path = self.tmp / f"torch-{version}-{WHEEL_TAGS}.whl"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("torch/version.py", payload)
        return path

    def test_wrong_version_refused(self):
        self.stale_wheel()
        proc = self.dynapatch("build", "--no-venv", "--base-wheel", str(self.fake_wheel("2.12.0+cpu")))
        self.assertFailsWith(proc, 1, "torch 2.12.0+cpu", "pins torch 2.13.0+cpu")
        self.assertNoWheel()

    def test_wrong_file_refused(self):
        proc = self.dynapatch("build", "--no-venv", "--base-wheel", str(self.fake_wheel("2.13.0+cpu")))
        self.assertFailsWith(proc, 1, "sha256", load_base(Project.at(self.project)).sha256)
        self.assertNoWheel()


class DevtreeTest(ProjectCopyTestCase):
    def test_roundtrip_is_byte_identical(self):
        before = {str(p): p.read_bytes() for p in (self.project / "patches").rglob("*") if p.is_file()}
        devtree = self.tmp / "devtree"
        self.assertEqual(self.dynapatch("devtree", "--dir", str(devtree)).returncode, 0)
        proc = self.dynapatch("refresh", "--dir", str(devtree))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        after = {str(p): p.read_bytes() for p in (self.project / "patches").rglob("*") if p.is_file()}
        self.assertEqual(before, after)

    def test_edit_and_new_file_are_exported(self):
        devtree = self.tmp / "devtree"
        self.assertEqual(self.dynapatch("devtree", "--dir", str(devtree)).returncode, 0)
        target = devtree / "torch/_dynamo/variables/optimizer.py"
        target.write_text(target.read_text().replace("# Note: this allows us", "# Note: this lets us", 1))
        (devtree / "torch/_dynamo/new_module.py").write_text("VALUE = 1\n")
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "add", "-A"], cwd=devtree, check=True)
        # A new commit, so a new last patch: amending the current last patch would
        # make it differ from its patches/<version>/ override, if it has one.
        message = "dynamo: reword a comment, add a module\n\nWhat and why.\n\nUpstream-Status: Pending\n"
        subprocess.run([*git, "commit", "-q", "-m", message], cwd=devtree, check=True)
        self.assertEqual(self.dynapatch("refresh", "--dir", str(devtree)).returncode, 0)
        last = sorted((self.project / "patches").glob("*.patch"))[-1]
        text = last.read_text()
        self.assertIn("+        # Note: this lets us", text)
        self.assertIn("Overlay-File: torch/_dynamo/new_module.py", text)
        self.assertEqual((self.project / "torch_overlay/torch/_dynamo/new_module.py").read_text(), "VALUE = 1\n")
        proc = self.dynapatch("check")
        self.assertEqual(proc.returncode, 0, proc.stderr)

    def test_refresh_refuses_uncommitted_edits(self):
        devtree = self.tmp / "devtree"
        self.assertEqual(self.dynapatch("devtree", "--dir", str(devtree)).returncode, 0)
        (devtree / "torch/_dynamo/config.py").write_text("edited\n")
        self.assertFailsWith(self.dynapatch("refresh", "--dir", str(devtree)), 1, "uncommitted")


class ApplyTest(ProjectCopyTestCase):
    def make_target(self):
        # The cache may also hold other releases' sources (rebase-check).
        pristine = CACHE / f"pristine-{load_base(Project.at(ROOT)).sha256[:16]}"
        target = self.tmp / "site-packages"
        shutil.copytree(pristine / "torch", target / "torch")
        return target

    def test_apply_then_reapply_is_refused_untouched(self):
        target = self.make_target()
        proc = self.dynapatch("apply", "--target", str(target))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        patched = (target / "torch/_dynamo/variables/optimizer.py").read_text()
        self.assertIn('if name == "_init_group":', patched)
        # A second application fails on the first hunk and leaves the tree as it was.
        self.assertFailsWith(self.dynapatch("apply", "--target", str(target)), 2, self.patch.name)
        self.assertEqual((target / "torch/_dynamo/variables/optimizer.py").read_text(), patched)

    def test_apply_refuses_other_torch_version(self):
        target = self.make_target()
        version = target / "torch/version.py"
        version.write_text(version.read_text().replace("'2.13.0+cpu'", "'2.12.0+cpu'"))
        self.assertFailsWith(self.dynapatch("apply", "--target", str(target)), 1, "torch 2.12.0+cpu")


class ReproducibleWheelTest(unittest.TestCase):
    def test_repack_is_byte_identical_and_records_hashes(self):
        tmp = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, tmp)
        spec = load_base(Project.at(ROOT))
        base = tmp / spec.wheel
        info = f"torch-{spec.version}.dist-info"
        with zipfile.ZipFile(base, "w") as zf:
            zf.writestr("torch/__init__.py", "")
            zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.4\nName: torch\nVersion: {spec.version}\n")
            zf.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nTag: {WHEEL_TAGS}\n")
            zf.writestr(f"{info}/RECORD", "stale\n")
        outputs = []
        for i in range(2):
            out = tmp / f"out{i}.whl"
            wheel_mod.repack(base, out, spec, {"torch/_dynamo/new.py": b"x = 1\n", "torch/__init__.py": b"# patched\n"})
            outputs.append(out.read_bytes())
        self.assertEqual(outputs[0], outputs[1])
        with zipfile.ZipFile(tmp / "out0.whl") as zf:
            new_info = f"torch-{spec.patched_version}.dist-info"
            self.assertIn(f"Version: {spec.patched_version}", zf.read(f"{new_info}/METADATA").decode())
            self.assertEqual(zf.namelist()[-1], f"{new_info}/RECORD")
            for line in zf.read(f"{new_info}/RECORD").decode().splitlines()[:-1]:
                name, digest, size = line.split(",")
                data = zf.read(name)
                self.assertEqual(int(size), len(data))
                self.assertEqual(digest, wheel_mod._record_hash(data))
            self.assertEqual({i.date_time for i in zf.infolist()}, {wheel_mod.ZIP_EPOCH})


if __name__ == "__main__":
    unittest.main()
