"""The patch-series toolchain (scripts/dynapatch.py), run on temporary copies of the project."""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DYNAPATCH_CACHE_DIR", ROOT / "build" / "cache"))
PROJECT_FILES = ("patches", "torch_overlay", "scripts", "csrc", "setup.py", "CMakeLists.txt",
                 "requirements-build.txt", "requirements-test.txt")
WHEEL_TAGS = "cp311-cp311-manylinux_2_28_x86_64"

sys.path.insert(0, str(ROOT / "scripts"))
import dynapatch as dynapatch_mod  # noqa: E402
from dplib import wheel as wheel_mod  # noqa: E402
from dplib.base import load_base  # noqa: E402
from dplib.common import Project, sha256_file  # noqa: E402


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

    def patch_named(self, name):
        """The patch file with this Patch-Name (numbers move when the series is re-cut)."""
        return next(p for p in sorted((self.project / "patches").glob("*.patch"))
                    if f"\nPatch-Name: {name}\n" in p.read_text())

    def number(self, name):
        return self.patch_named(name).name[:4]

    def dynapatch(self, *args, env=None):
        return subprocess.run(
            [sys.executable, str(self.project / "scripts" / "dynapatch.py"), "--cache-dir", str(CACHE), *args],
            cwd=self.tmp, text=True, capture_output=True, env={**os.environ, **(env or {})})

    def assertFailsWith(self, proc, exit_code, *fragments):
        self.assertEqual(proc.returncode, exit_code, proc.stdout + proc.stderr)
        for fragment in fragments:
            self.assertIn(fragment, proc.stderr)

    def last_good_build(self, current=False):
        """dist/ and build/wheel.stamp as an earlier successful build left them (for the project's
        inputs as they are if `current`, else for other inputs). Returns their bytes."""
        project = Project.at(self.project)
        spec = load_base(project)
        (self.project / "dist").mkdir(exist_ok=True)
        wheel = self.project / "dist" / f"torch-2.13.0+cpu.dynapatch.14.g00000000-{WHEEL_TAGS}.whl"
        wheel.write_bytes(b"last good wheel")
        digest = dynapatch_mod.inputs_digest(project) if current else "0" * 64
        (self.project / "build").mkdir(exist_ok=True)
        (self.project / "build" / "wheel.stamp").write_text(
            f"{digest} {wheel.name} {sha256_file(wheel)} {spec.variant}\n")
        return self.dist_and_stamp()

    def dist_and_stamp(self):
        files = sorted((self.project / "dist").glob("*")) + [self.project / "build" / "wheel.stamp"]
        return {f.name: f.read_bytes() for f in files if f.is_file()}

    def assertLastGoodBuildKept(self, before):
        """A failed build leaves the last good wheel and its stamp as they were (and nothing else)."""
        self.assertEqual(self.dist_and_stamp(), before)


class SeriesValidationTest(ProjectCopyTestCase):
    def test_check_passes(self):
        proc = self.dynapatch("check")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("apply with zero fuzz and no offsets", proc.stdout)

    def test_patch_with_changed_context_names_patch_file_and_hunk(self):
        text = self.patch.read_text()
        self.patch.write_text(text.replace(" # which will directly inline\n", " # which will inline\n", 1))
        before = self.last_good_build()
        proc = self.dynapatch("build", "--no-venv", "--variant", "cpu")
        self.assertFailsWith(proc, 2, self.patch.name, "torch/_dynamo/variables/optimizer.py", "@@ -150,7 +152,7 @@")
        self.assertLastGoodBuildKept(before)

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
        self.patch.write_text(
            text.replace("Upstream-Status:", "Overlay-File: torch/_dynamo/absent.py\nUpstream-Status:")
        )
        before = self.last_good_build()
        proc = self.dynapatch("build", "--no-venv", "--variant", "cpu")
        self.assertFailsWith(proc, 1, self.patch.name, "torch_overlay/torch/_dynamo/absent.py", "missing")
        self.assertLastGoodBuildKept(before)

    def test_unclaimed_overlay_file(self):
        stray = self.project / "torch_overlay" / "torch" / "_dynamo" / "stray.py"
        stray.parent.mkdir(parents=True, exist_ok=True)
        stray.write_text("x = 1\n")
        self.assertFailsWith(self.dynapatch("check"), 1, "torch/_dynamo/stray.py")


class BaseWheelTest(ProjectCopyTestCase):
    def fake_wheel(self, name, payload=b"not torch"):
        path = self.tmp / name
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("torch/version.py", payload)
        return path

    def test_wrong_version_refused(self):
        before = self.last_good_build()
        proc = self.dynapatch("build", "--no-venv", "--base-wheel",
                              str(self.fake_wheel(f"torch-2.12.0+cpu-{WHEEL_TAGS}.whl")))
        self.assertFailsWith(proc, 1, "torch 2.12.0+cpu", "pins torch 2.13.0+cpu or 2.13.0")
        self.assertLastGoodBuildKept(before)

    def test_wrong_file_refused(self):
        before = self.last_good_build()
        proc = self.dynapatch("build", "--no-venv", "--base-wheel",
                              str(self.fake_wheel(f"torch-2.13.0+cpu-{WHEEL_TAGS}.whl")))
        self.assertFailsWith(proc, 1, "sha256", load_base(Project.at(self.project), "cpu").sha256)
        self.assertLastGoodBuildKept(before)

    def test_other_package_refused(self):
        # The `six` wheel: not torch at all. Refused before dist/ or the stamp change.
        before = self.last_good_build()
        six = self.fake_wheel("six-1.16.0-py2.py3-none-any.whl", b"")
        proc = self.dynapatch("build", "--no-venv", "--base-wheel", str(six))
        self.assertFailsWith(proc, 1, "six-1.16.0-py2.py3-none-any.whl is not a torch wheel")
        self.assertNotIn("Traceback", proc.stderr)
        self.assertLastGoodBuildKept(before)

    def test_unknown_variant_refused(self):
        before = self.last_good_build()
        proc = self.dynapatch("build", "--no-venv", "--variant", "rocm")
        self.assertFailsWith(proc, 1, "no variant 'rocm' for cp311", "cpu cp311, cuda cp311")
        self.assertLastGoodBuildKept(before)

    def test_variants_label_the_custom_wheel(self):
        project = Project.at(self.project)
        cpu, cuda = load_base(project, "cpu"), load_base(project, "cuda")
        self.assertEqual((cpu.version, cuda.version), ("2.13.0+cpu", "2.13.0"))
        # The label counts the series' patches.
        n = sum(1 for line in (self.project / "patches/series").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
        self.assertRegex(cpu.patched_version, rf"^2\.13\.0\+cpu\.dynapatch\.{n}\.g[0-9a-f]{{8}}$")
        self.assertRegex(cuda.patched_version, rf"^2\.13\.0\+cu130\.dynapatch\.{n}\.g[0-9a-f]{{8}}$")
        self.assertEqual(wheel_mod.patched_wheel_name(cuda), f"torch-{cuda.patched_version}-{WHEEL_TAGS}.whl")
        # The number after the label changes with the series: here an overlay file's content.
        explainer = self.project / "torch_overlay/torch/_dynamo/guard_explainer.py"
        explainer.write_text(explainer.read_text() + "\n# edited\n")
        self.assertNotEqual(load_base(project, "cpu").patched_version, cpu.patched_version)


class BuildTest(ProjectCopyTestCase):
    def test_missing_compiler_keeps_last_good_wheel(self):
        before = self.last_good_build()
        proc = self.dynapatch("build", "--no-venv", "--variant", "cpu", env={"CXX": "/nonexistent"})
        self.assertFailsWith(proc, 1, "CXX=/nonexistent is not a C++ compiler that runs")
        self.assertNotIn("Traceback", proc.stderr)
        self.assertLastGoodBuildKept(before)

    def test_compiler_error_shows_its_first_error_line(self):
        # A "compiler" that runs (--version) but fails every compile with an error of its own.
        fake = self.tmp / "fake-c++"
        fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo fake 1.0; exit 0; }\n"
                        "echo 'guard.cpp:1:1: error: the fake compiler refuses' >&2\nexit 1\n")
        fake.chmod(0o755)
        before = self.last_good_build()
        proc = self.dynapatch("build", "--no-venv", "--variant", "cpu", env={"CXX": str(fake)})
        self.assertFailsWith(proc, 1, "the C++ extension did not build:", "error: the fake compiler refuses",
                             "ext-build.log")
        self.assertNotIn("Traceback", proc.stderr)
        self.assertLastGoodBuildKept(before)

    def test_no_change_build_is_a_noop(self):
        before = self.last_good_build(current=True)
        started = time.monotonic()
        proc = self.dynapatch("build", "--no-venv", env={"CXX": "/nonexistent"})
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertLess(time.monotonic() - started, 30)
        self.assertIn("nothing changed since the last build", proc.stdout)
        self.assertEqual(self.dist_and_stamp(), before)
        # Any input change makes it a real build (which the missing compiler stops).
        (self.project / "csrc" / "guard_accel.cpp").write_text("// edited\n")
        proc = self.dynapatch("build", "--no-venv", "--variant", "cpu", env={"CXX": "/nonexistent"})
        self.assertFailsWith(proc, 1, "CXX=/nonexistent")
        self.assertEqual(self.dist_and_stamp(), before)

    def test_another_variant_is_not_a_noop(self):
        before = self.last_good_build(current=True)
        proc = self.dynapatch("build", "--no-venv", "--variant", "cuda", "--base-wheel",
                              str(self.tmp / "absent.whl"))
        self.assertFailsWith(proc, 1, "absent.whl does not exist")
        self.assertEqual(self.dist_and_stamp(), before)


def other_python():
    """An installed CPython other than the one running the tests (3.12 or 3.13), or None."""
    from dplib.common import DynapatchError
    from dplib.interp import resolve_interpreter
    for name in ("python3.12", "python3.13"):
        try:
            found = resolve_interpreter(name)
        except DynapatchError:
            continue
        if found.version != f"{sys.version_info[0]}.{sys.version_info[1]}":
            return found
    return None


class PythonTagTest(ProjectCopyTestCase):
    """build/test --python: base wheel, stamp and venv per Python tag."""

    def setUp(self):
        super().setUp()
        self.other = other_python()
        if self.other is None:
            self.skipTest("no Python 3.12 or 3.13 installed")

    def fake_build(self, tag, variant):
        """dist/ and build/wheel[-tag].stamp as a successful build for `tag` leaves them (current inputs)."""
        project = Project.at(self.project)
        spec = load_base(project, variant, tag)
        (self.project / "dist").mkdir(exist_ok=True)
        wheel = self.project / "dist" / wheel_mod.patched_wheel_name(spec)
        wheel.write_bytes(f"good {tag} wheel".encode())
        stamp = dynapatch_mod.Stamp(dynapatch_mod.inputs_digest(project), wheel.name, sha256_file(wheel),
                                    variant, tag)
        (self.project / "build").mkdir(exist_ok=True)
        dynapatch_mod.write_stamp(project, stamp)
        return dynapatch_mod.stamp_file(project, tag)

    def test_base_blocks_per_python_tag(self):
        project = Project.at(self.project)
        self.assertEqual(load_base(project).python_tag, "cp311")  # the default: the first block
        for tag in ("cp312", "cp313"):
            spec = load_base(project, python_tag=tag)
            wheel = f"torch-2.13.0-{tag}-{tag}-manylinux_2_28_x86_64.whl"
            self.assertEqual((spec.variant, spec.wheel), ("cuda", wheel))
            self.assertTrue(wheel_mod.patched_wheel_name(spec).endswith(f"-{tag}-{tag}-manylinux_2_28_x86_64.whl"))
        proc = self.dynapatch("build", "--no-venv", "--python", self.other.executable, "--variant", "cpu")
        self.assertFailsWith(proc, 1, f"no variant 'cpu' for {self.other.tag}", f"cuda {self.other.tag}")

    def test_stamps_and_venvs_are_per_python(self):
        default = self.fake_build("cp311", "cpu")
        other = self.fake_build(self.other.tag, "cuda")
        self.assertEqual(default.name, "wheel.stamp")
        self.assertEqual(other.name, f"wheel-{self.other.tag}.stamp")
        before = self.dist_and_stamp(), other.read_bytes()
        # Each Python's last build is current: a no-op that names its Python.
        proc = self.dynapatch("build", "--no-venv", "--python", self.other.executable, env={"CXX": "/nonexistent"})
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("nothing changed since the last build: dist/torch-2.13.0+cu130.", proc.stdout)
        self.assertIn(f"cuda variant, {self.other.tag})", proc.stdout)
        proc = self.dynapatch("build", "--no-venv", env={"CXX": "/nonexistent"})
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("cpu variant, cp311)", proc.stdout)
        # A change rebuilds; a failed build for one Python leaves both Pythons' wheels and stamps.
        (self.project / "csrc" / "guard_accel.cpp").write_text("// edited\n")
        proc = self.dynapatch("build", "--no-venv", "--variant", "cpu", env={"CXX": "/nonexistent"})
        self.assertFailsWith(proc, 1, "CXX=/nonexistent")
        self.assertEqual((self.dist_and_stamp(), other.read_bytes()), before)
        self.assertEqual(len(list((self.project / "dist").glob("*.whl"))), 2)
        self.assertEqual(dynapatch_mod.venv_dir(Project.at(self.project), self.other.tag).name,
                         f".venv-{self.other.tag}")
        self.assertEqual(dynapatch_mod.venv_dir(Project.at(self.project), "cp311").name, ".venv")

    def test_base_wheel_of_another_python_refused(self):
        cpu = CACHE / "base" / load_base(Project.at(ROOT), "cpu").wheel
        if not cpu.is_file():
            self.skipTest(f"{cpu} not cached")
        proc = self.dynapatch("build", "--no-venv", "--python", self.other.executable, "--base-wheel", str(cpu))
        self.assertFailsWith(proc, 1, f"{cpu.name} is a cp311 wheel", f"is Python {self.other.version} "
                             f"({self.other.tag})")

    def test_unknown_interpreter_refused(self):
        for command in ("build", "test"):
            proc = self.dynapatch(command, "--python", "python9.9")
            self.assertFailsWith(proc, 1, "--python python9.9: no interpreter of that name runs")
            self.assertNotIn("Traceback", proc.stderr)


class CommandLineTest(unittest.TestCase):
    def test_test_passes_unknown_arguments_to_pytest_and_keeps_test_dir(self):
        project = Project.at(ROOT)
        args = dynapatch_mod.parse_args(["test", "-k", "explain", "-x"])
        self.assertEqual(dynapatch_mod.pytest_args(project, args), ["-k", "explain", "-x", "test"])
        args = dynapatch_mod.parse_args(["test", "test/dynamo/test_guard_explainer.py::GuardExplainerTest", "-q"])
        self.assertEqual(dynapatch_mod.pytest_args(project, args),
                         ["test/dynamo/test_guard_explainer.py::GuardExplainerTest", "-q"])
        args = dynapatch_mod.parse_args(["test", "--quick"])
        self.assertEqual(dynapatch_mod.pytest_args(project, args)[-1], "test")
        self.assertIn("--ignore=test/dynamo/test_differential_fuzz.py", dynapatch_mod.pytest_args(project, args))

    def test_other_commands_refuse_unknown_arguments(self):
        proc = subprocess.run([sys.executable, str(ROOT / "scripts/dynapatch.py"), "build", "-k", "x"],
                              text=True, capture_output=True)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("unrecognized arguments: -k x", proc.stderr)

    def test_every_subcommand_and_option_has_help(self):
        parser = dynapatch_mod.make_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        self.assertGreaterEqual(set(sub.choices), {"build", "test", "check", "devtree", "refresh", "apply",
                                                   "unapply", "info", "export-prs", "upstream-tests", "rebase-check"})
        listed = {c.dest: c.help for c in sub._choices_actions}
        for name, command in [("dynapatch.py", parser), *sub.choices.items()]:
            if command is not parser:
                self.assertTrue(listed.get(name), f"{name} has no help in the command list")
                self.assertTrue(command.description, f"{name} --help has no description")
            for action in command._actions:
                # export-prs belongs to another part of the toolchain; its OUTDIR help is reported there.
                if action is not sub and (name, action.dest) != ("export-prs", "outdir"):
                    self.assertTrue(action.help, f"{name} {action.option_strings or action.dest} has no help")
        proc = subprocess.run([sys.executable, str(ROOT / "scripts/dynapatch.py"), "apply", "--help"],
                              text=True, capture_output=True)
        self.assertIn(
            "--target TARGET  a pytorch checkout", " ".join(proc.stdout.split()).replace("TARGET a", "TARGET  a")
        )

    def test_version(self):
        proc = subprocess.run([sys.executable, str(ROOT / "scripts/dynapatch.py"), "--version"],
                              text=True, capture_output=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertRegex(proc.stdout, r"^dynapatch\.py ([0-9a-f]{40}(\+dirty)?|unknown.*)\n")
        self.assertIn("base torch 2.13.0: cpu cp311 (torch-2.13.0+cpu-", proc.stdout)
        self.assertIn("cuda cp311 (torch-2.13.0-cp311", proc.stdout)
        self.assertIn("cuda cp312 (torch-2.13.0-cp312", proc.stdout)
        self.assertIn(load_base(Project.at(ROOT)).patched_version, proc.stdout)


class InfoTest(ProjectCopyTestCase):
    def test_info_prints_series_and_commit_from_the_wheel(self):
        record = {
            "version": "2.13.0+cpu.dynapatch.1.gdeadbeef",
            "variant": "cpu",
            "base_wheel": "base.whl",
            "base_sha256": "b" * 64,
            "commit": "c" * 40,
            "series_sha256": "d" * 64,
            "patches": [{"name": "0001-x.patch", "sha256": "e" * 64}, {"name": "0002-y.patch", "sha256": "f" * 64}],
        }
        wheel = self.tmp / f"torch-2.13.0+cpu.dynapatch.1.gdeadbeef-{WHEEL_TAGS}.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(wheel_mod.RECORD_MODULE, wheel_mod.record_module(record))
        proc = self.dynapatch("info", "--wheel", str(wheel))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout, f"""{wheel.name}
torch 2.13.0+cpu.dynapatch.1.gdeadbeef (dynapatch, cpu variant)
base wheel: base.whl sha256 {"b" * 64}
dynapatch commit: {"c" * 40}
series sha256: {"d" * 64} (2 patches)
  {"e" * 64}  0001-x.patch
  {"f" * 64}  0002-y.patch
""")
        # The module prints the same when run.
        module = self.tmp / "dynapatch_record.py"
        module.write_text(wheel_mod.record_module(record))
        run = subprocess.run([sys.executable, str(module)], text=True, capture_output=True)
        self.assertEqual(run.stdout, proc.stdout.split("\n", 1)[1])

    def test_info_refuses_a_wheel_without_record(self):
        wheel = self.tmp / f"torch-2.13.0+cpu-{WHEEL_TAGS}.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("torch/__init__.py", "")
        self.assertFailsWith(self.dynapatch("info", "--wheel", str(wheel)), 1, "holds no torch/_dynamo/dynapatch.py")


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
        info = target / "torch-2.13.0+cpu.dist-info"
        info.mkdir()
        lines = [f"{p.relative_to(target)},sha256=x,1" for p in sorted((target / "torch").rglob("*.py"))]
        (info / "RECORD").write_text("\n".join(lines) + f"\n{info.name}/RECORD,,\n")
        return target

    def snapshot(self, root):
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    def test_apply_twice_says_already_applied_and_unapply_restores_exactly(self):
        target = self.make_target()
        pristine = self.snapshot(target)
        proc = self.dynapatch("apply", "--target", str(target))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        patched = self.snapshot(target)
        self.assertIn('if name == "_init_group":', patched["torch/_dynamo/variables/optimizer.py"].decode())
        # The files apply added are in torch's RECORD, so pip uninstall torch removes them.
        record = (target / "torch-2.13.0+cpu.dist-info/RECORD").read_text()
        self.assertIn("torch/_dynamo/guard_explainer.py,sha256=", record)
        proc = self.dynapatch("apply", "--target", str(target))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("already applied", proc.stdout)
        self.assertEqual(self.snapshot(target), patched)
        proc = self.dynapatch("unapply", "--target", str(target))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(self.snapshot(target), pristine)
        self.assertEqual(sorted(p for p in target.rglob("*") if p.is_dir() and not any(p.iterdir())), [])
        self.assertFailsWith(self.dynapatch("unapply", "--target", str(target)), 1, "no record of an apply")

    def test_already_applied_without_record(self):
        target = self.make_target()
        self.assertEqual(self.dynapatch("apply", "--target", str(target)).returncode, 0)
        shutil.rmtree(target / ".dynapatch-apply")
        patched = self.snapshot(target)
        proc = self.dynapatch("apply", "--target", str(target))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("already applied", proc.stdout)
        self.assertIn("applied without a record", proc.stdout)
        self.assertEqual(self.snapshot(target), patched)

    def test_unapply_refuses_files_changed_since_apply(self):
        target = self.make_target()
        self.assertEqual(self.dynapatch("apply", "--target", str(target)).returncode, 0)
        optimizer = target / "torch/_dynamo/variables/optimizer.py"
        optimizer.write_text(optimizer.read_text() + "# local edit\n")
        self.assertFailsWith(self.dynapatch("unapply", "--target", str(target)), 1,
                             "changed since apply: torch/_dynamo/variables/optimizer.py")
        self.assertIn("# local edit", optimizer.read_text())

    def test_a_failing_patch_leaves_the_target_untouched(self):
        target = self.make_target()
        optimizer = target / "torch/_dynamo/variables/optimizer.py"
        optimizer.write_text(optimizer.read_text().replace(" # which will directly inline\n", " # edited\n", 1))
        before = self.snapshot(target)
        self.assertFailsWith(self.dynapatch("apply", "--target", str(target)), 2, self.patch.name)
        self.assertEqual(self.snapshot(target), before)

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


class LintTest(ProjectCopyTestCase):
    """lint: ruff and clang-format, on a copy of the project; either finding fails it."""

    def setUp(self):
        super().setUp()
        shutil.copytree(ROOT / "test", self.project / "test", ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("ruff.toml", ".clang-format", "requirements-lint.txt"):
            shutil.copy2(ROOT / name, self.project / name)

    def test_clean_then_unformatted_csrc_fails(self):
        proc = self.dynapatch("lint")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("csrc/ formatted", proc.stdout)
        header = self.project / "csrc/tensor_aliasing_group.h"
        header.write_text(header.read_text() + "\nnamespace  dynapatch_lint_test { int  x; }\n")
        proc = self.dynapatch("lint")
        self.assertFailsWith(proc, 1, "csrc/tensor_aliasing_group.h not formatted as .clang-format says")
        self.assertRegex(proc.stdout, r"csrc/tensor_aliasing_group.h: [1-9]\d* places differ")
        self.assertIn("csrc/guard_accel.cpp: clean", proc.stdout)

    def test_ruff_finding_fails(self):
        (self.project / "scripts/unused_import.py").write_text("import os\n")
        proc = self.dynapatch("lint")
        self.assertFailsWith(proc, 1, "ruff found problems")
        self.assertIn("scripts/unused_import.py:1:8: F401", proc.stdout)


class StatsTest(ProjectCopyTestCase):
    """stats: per patch, upstream +/- (as git apply --numstat counts them), overlay, native lines, cases."""

    def setUp(self):
        super().setUp()
        shutil.copytree(ROOT / "test", self.project / "test", ignore=shutil.ignore_patterns("__pycache__"))

    def rows(self):
        proc = self.dynapatch("stats")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        rows = {}
        for line in proc.stdout.splitlines()[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
        return rows

    def test_counts_match_numstat_and_the_files(self):
        rows = self.rows()
        patches = sorted((self.project / "patches").glob("0*.patch"))
        self.assertEqual(len(rows), len(patches) + 1)  # and the total
        for patch in patches:
            numstat = subprocess.run(["git", "apply", "--numstat", str(patch)], capture_output=True, text=True,
                                     cwd=self.tmp, check=True).stdout.split()
            added, removed = sum(map(int, numstat[0::3])), sum(map(int, numstat[1::3]))
            self.assertEqual(rows[patch.name[:4]][1], f"+{added}/-{removed}", patch.name)
        # Each patch's native lines are those of the csrc/ files its Native-File trailers name.
        owners = {p.name[:4]: [line.split(": ", 1)[1] for line in p.read_text().splitlines()
                               if line.startswith("Native-File: ")] for p in patches}
        self.assertEqual(sorted(f for files in owners.values() for f in files),
                         sorted(f"csrc/{p.name}" for p in (self.project / "csrc").iterdir()))
        for number, files in owners.items():
            native = sum(len((self.project / f).read_text().splitlines()) for f in files)
            self.assertEqual(rows[number][3], str(native), number)
        init = self.patch_named("init-values-once")
        overlay = [line.split(": ", 1)[1] for line in init.read_text().splitlines()
                   if line.startswith("Overlay-File: ")]
        self.assertEqual(rows[init.name[:4]][2], str(sum(len((self.project / "torch_overlay" / rel).read_text()
                                                             .splitlines()) for rel in overlay)))

    def test_cases_follow_the_patch_that_owns_them(self):
        # A later patch's selector (::InitValuesOnceTests::test_torch_optim_*) takes those cases
        # from the file of init-values-once, which introduces it.
        last = sorted((self.project / "patches").glob("*.patch"))[-1]
        text = last.read_text()
        trailer = next(line for line in text.splitlines() if line.startswith("Tests: "))
        last.write_text(text.replace(trailer, trailer + "\nTests: test/dynamo/test_init_values_once.py"
                                     "::InitValuesOnceTests::test_torch_optim_*", 1))
        before = self.rows()
        first = self.project / "test/dynamo/test_optimizer_variable.py"
        first.write_text(first.read_text() + "\n\ndef test_added():\n    pass\n")
        shared = self.project / "test/dynamo/test_init_values_once.py"
        text = shared.read_text()
        anchor = "class InitValuesOnceTests("
        self.assertIn(anchor, text)
        head, tail = text.split(anchor, 1)
        body_start = tail.index("\n    def ")
        shared.write_text(head + anchor + tail[:body_start] + "\n    def test_torch_optim_added(self):\n"
                          "        pass\n" + tail[body_start:])
        after = self.rows()
        self.assertEqual(int(after["0001"][5]), int(before["0001"][5]) + 1)
        init = self.number("init-values-once")
        self.assertEqual(int(after[last.name[:4]][5]), int(before[last.name[:4]][5]) + 1)
        self.assertEqual(after[init][5], before[init][5])
        self.assertEqual(int(after["all"][5]), int(before["all"][5]) + 2)
