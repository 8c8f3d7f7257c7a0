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
import unittest.mock
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DYNAPATCH_CACHE_DIR", ROOT / "build" / "cache"))
PROJECT_FILES = ("patches", "torch_overlay", "scripts", "csrc", "setup.py", "CMakeLists.txt",
                 "requirements-build.txt", "requirements-test.txt")
WHEEL_TAGS = "cp311-cp311-manylinux_2_28_x86_64"

sys.path.insert(0, str(ROOT / "scripts"))
import dynapatch as dynapatch_mod  # noqa: E402
from dplib import wheel as wheel_mod  # noqa: E402
from dplib.base import base_variants, load_base  # noqa: E402
from dplib.common import DynapatchError, Project, sha256_file  # noqa: E402

# Facts of the series and its base are read from the project's files at test time (never written
# out here), so a rebase or a re-cut does not break these tests.


def pristine_tree() -> Path:
    """The pinned base's extracted Python sources (check and build fill the cache)."""
    return CACHE / f"pristine-{load_base(Project.at(ROOT)).sha256[:16]}"


@dataclass
class Hunk:
    file: str
    header: str  # "@@ -150,7 +152,7 @@"
    lines: list  # " context", "-removed", "+added"


def hunks(patch: Path) -> list:
    """The hunks of a patch file, in order."""
    out, file, left = [], None, (0, 0)
    for line in patch.read_text().split("\n---\n", 1)[1].splitlines():
        if left != (0, 0):
            out[-1].lines.append(line)
            left = (left[0] - (line[:1] != "+"), left[1] - (line[:1] != "-"))
        elif line.startswith("diff --git a/"):
            file = line.split()[2][2:]
        elif line.startswith("@@ ") and file:
            match = re.match(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@", line)
            out.append(Hunk(file, match.group(0), []))
            left = (int(match.group(1) or 1), int(match.group(2) or 1))
    return out


def context_line(patch: Path, near=None):
    """A context line of `patch` found once in it and once in its file of the pinned base, as
    (hunk, line without its " "). near=True: next to a changed line; False: not next to one."""
    text = patch.read_text()
    for hunk in hunks(patch):
        source = (pristine_tree() / hunk.file).read_text().splitlines()
        for i, line in enumerate(hunk.lines):
            if line[:1] != " " or not line.strip() or text.count(f"\n{line}\n") != 1 or source.count(line[1:]) != 1:
                continue
            changed = any(hunk.lines[j][:1] in ("+", "-") for j in (i - 1, i + 1) if 0 <= j < len(hunk.lines))
            if near is None or near == changed:
                return hunk, line[1:]
    raise AssertionError(f"{patch.name} has no context line once in it and its file (near={near})")


def changed_line(patch: Path, sign: str):
    """The first line `patch` adds (sign "+") or removes ("-") that is not blank and is found once in
    the patch, as (hunk, line without its sign)."""
    text = patch.read_text()
    for hunk in hunks(patch):
        for line in hunk.lines:
            if line[:1] == sign and line[1:].strip() and text.count(f"\n{line}\n") == 1:
                return hunk, line[1:]
    raise AssertionError(f"{patch.name} has no such {sign} line")


def replace_line(text: str, line: str, new: str) -> str:
    """`text` with its one line `line` replaced by `new`."""
    lines = text.split("\n")
    assert lines.count(line) == 1, (line, lines.count(line))
    lines[lines.index(line)] = new
    return "\n".join(lines)


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

    def last_good_build(self, current=False, variant=None):
        """dist/ and build/wheel.stamp as an earlier successful build left them (for the project's
        inputs as they are if `current`, else for other inputs; of the first block's variant unless
        `variant`). Returns their bytes."""
        project = Project.at(self.project)
        spec = load_base(project)
        label = variant or spec.label
        (self.project / "dist").mkdir(exist_ok=True)
        wheel = self.project / "dist" / f"torch-{spec.public_version}+{label}.dynapatch.14.g00000000-{WHEEL_TAGS}.whl"
        wheel.write_bytes(b"last good wheel")
        digest = dynapatch_mod.inputs_digest(project) if current else "0" * 64
        (self.project / "build").mkdir(exist_ok=True)
        (self.project / "build" / "wheel.stamp").write_text(
            f"{digest} {wheel.name} {sha256_file(wheel)} {variant or spec.variant}\n")
        return self.dist_and_stamp()

    @property
    def variant(self):
        """The variant of patches/BASE's first block (the default; cached in build/cache/base)."""
        return load_base(Project.at(self.project)).variant

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
        hunk, line = context_line(self.patch)
        self.patch.write_text(replace_line(self.patch.read_text(), f" {line}", f" {line}  # edited"))
        before = self.last_good_build()
        proc = self.dynapatch("build", "--no-venv", "--variant", self.variant)
        self.assertFailsWith(proc, 2, self.patch.name, hunk.file, hunk.header)
        self.assertLastGoodBuildKept(before)

    def test_truncated_patch_is_reported_corrupt(self):
        # Cut in the middle of a hunk: the lines its header counts are missing.
        text = self.patch.read_text()
        _, added = changed_line(self.patch, "+")
        self.patch.write_text(text[: text.index(f"\n+{added}\n") + 1] + "-garbage\n")
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
        proc = self.dynapatch("build", "--no-venv", "--variant", self.variant)
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

    def test_pip_constraint_capping_torch_is_not_applied_to_the_pinned_base(self):
        # Some machines' pip configuration caps torch below the release through a constraint
        # file: check downloads the pinned base wheel into an empty cache all the same.
        spec = load_base(Project.at(self.project))
        constraint = self.tmp / "constraints.txt"
        constraint.write_text(f"torch<{spec.public_version}\n")
        env = {**os.environ, "PIP_CONSTRAINT": str(constraint)}
        capped = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps", "--only-binary=:all:",
             f"torch=={spec.public_version}"], text=True, capture_output=True, env=env)
        self.assertNotEqual(capped.returncode, 0, "the constraint does not cap torch for pip")
        proc = subprocess.run(
            [sys.executable, str(self.project / "scripts" / "dynapatch.py"), "--cache-dir", str(self.tmp / "cache"),
             "check"], cwd=self.tmp, text=True, capture_output=True, env=env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn(f"{spec.wheel} (sha256 ok)", proc.stdout)
        self.assertIn("check ok", proc.stdout)

    def test_wrong_version_refused(self):
        specs = base_variants(Project.at(self.project))
        pinned = " or ".join(dict.fromkeys(s.version for s in specs))
        before = self.last_good_build()
        # Another release's CPU build, and the release with a local label that is not cpu.
        for version in ("2.12.0+cpu", f"{specs[0].public_version}+cu999"):
            with self.subTest(version=version):
                proc = self.dynapatch("build", "--no-venv", "--base-wheel",
                                      str(self.fake_wheel(f"torch-{version}-{WHEEL_TAGS}.whl")))
                self.assertFailsWith(proc, 1, f"torch {version}, but patches/BASE pins torch {pinned} "
                                     f"(or a CPU build, {specs[0].public_version}+cpu, through --base-wheel)")
                self.assertLastGoodBuildKept(before)

    def test_wrong_file_refused(self):
        # A pinned block's file name and version, other bytes: pinned versions are held to their sha256.
        spec = load_base(Project.at(self.project))
        before = self.last_good_build()
        proc = self.dynapatch("build", "--no-venv", "--base-wheel", str(self.fake_wheel(spec.wheel)))
        self.assertFailsWith(proc, 1, "sha256", spec.sha256, "refusing a rebuilt or different file")
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
        pinned = ", ".join(f"{s.variant} {s.python_tag}" for s in base_variants(Project.at(self.project))
                           if s.python_tag == "cp311")
        before = self.last_good_build()
        proc = self.dynapatch("build", "--no-venv", "--variant", "rocm")
        self.assertFailsWith(proc, 1, "no variant 'rocm' for cp311", f"(it pins {pinned})")
        self.assertNotIn("--base-wheel", proc.stderr)
        self.assertLastGoodBuildKept(before)
        if "cpu" not in pinned:  # a CPU build is a --base-wheel away: the error says so
            proc = self.dynapatch("build", "--no-venv", "--variant", "cpu")
            self.assertFailsWith(proc, 1, "no variant 'cpu' for cp311", "for a CPU build pass its wheel: "
                                 f"--base-wheel torch-{load_base(Project.at(self.project)).public_version}+cpu-")

    def test_variants_label_the_custom_wheel(self):
        project = Project.at(self.project)
        specs = base_variants(project)
        self.assertEqual(len({s.public_version for s in specs}), 1)
        # The label counts the series' patches.
        n = sum(1 for line in (self.project / "patches/series").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
        for spec in specs:
            self.assertEqual(spec.version.split("+")[0], spec.public_version)
            self.assertRegex(spec.patched_version, rf"^{re.escape(spec.public_version)}\+{re.escape(spec.label)}"
                                                   rf"\.dynapatch\.{n}\.g[0-9a-f]{{8}}$")
            tags = spec.wheel.split("-", 2)[2]
            self.assertEqual(wheel_mod.patched_wheel_name(spec), f"torch-{spec.patched_version}-{tags}")
        # The number after the label changes with the series: here an overlay file's content.
        explainer = self.project / "torch_overlay/torch/_dynamo/guard_explainer.py"
        explainer.write_text(explainer.read_text() + "\n# edited\n")
        self.assertNotEqual(load_base(project).patched_version, specs[0].patched_version)


class UnpinnedCpuBaseTest(ProjectCopyTestCase):
    """build --base-wheel with a CPU build of the release that patches/BASE does not pin (issue 43):
    accepted by version (file name, METADATA, torch/version.py), Python tag and sources (the pinned
    wheel's, torch/version.py aside), and recorded by sha256 in the custom wheel. The CPU wheel is
    fabricated from the pinned wheel's sources (no real one is reachable from these machines)."""

    def setUp(self):
        super().setUp()
        self.spec = load_base(Project.at(self.project))
        if not (pristine_tree() / ".complete").is_file():
            self.skipTest(f"{pristine_tree()} not extracted (run check or build first)")
        self.cpu_version = f"{self.spec.public_version}+cpu"

    def cpu_wheel(self, tags=WHEEL_TAGS, metadata_version=None, torch_version=None, edit=None, sources=True):
        """torch-<release>+cpu-<tags>.whl: the pinned sources (but `edit`: rel -> text or None to drop),
        torch/version.py and METADATA saying `torch_version` and `metadata_version` (default: its version)."""
        path = self.tmp / f"torch-{self.cpu_version}-{tags}.whl"
        pristine = pristine_tree()
        files = {}
        if sources:
            files = {str(f.relative_to(pristine)): f.read_bytes() for f in sorted(pristine.rglob("*"))
                     if f.is_file() and f.name != ".complete"}
        version_py = (pristine / "torch/version.py").read_text()
        files["torch/version.py"] = version_py.replace(f"'{self.spec.base_torch_version}'",
                                                       f"'{torch_version or self.cpu_version}'").encode()
        for rel, text in (edit or {}).items():
            if text is None:
                del files[rel]
            else:
                files[rel] = text.encode()
        info = f"torch-{self.cpu_version}.dist-info"
        files[f"{info}/METADATA"] = (f"Metadata-Version: 2.4\nName: torch\n"
                                     f"Version: {metadata_version or self.cpu_version}\n").encode()
        files[f"{info}/WHEEL"] = f"Wheel-Version: 1.0\nTag: {tags}\n".encode()
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
            for rel, data in sorted(files.items()):
                zf.writestr(zipfile.ZipInfo(rel, date_time=wheel_mod.ZIP_EPOCH), data)
        # build extracts its sources into the shared cache: remove them again.
        self.addCleanup(shutil.rmtree, CACHE / f"pristine-{sha256_file(path)[:16]}", ignore_errors=True)
        return path

    def build(self, wheel, *args):
        """build --base-wheel `wheel`, stopped by a missing compiler (the step after the base wheel's)."""
        return self.dynapatch("build", "--no-venv", "--base-wheel", str(wheel), *args, env={"CXX": "/nonexistent"})

    def test_cpu_build_is_accepted_by_version_and_sources(self):
        wheel = self.cpu_wheel()
        before = self.last_good_build()
        proc = self.build(wheel)
        # It got past the base wheel step: the compiler check is what stops it.
        self.assertFailsWith(proc, 1, "CXX=/nonexistent is not a C++ compiler that runs")
        self.assertIn(f"base: {wheel.name} is not pinned in patches/BASE (a CPU build of torch "
                      f"{self.spec.public_version}, sha256 {sha256_file(wheel)})", proc.stdout)
        self.assertRegex(proc.stdout, rf"unpinned base: its \d+ Python sources are those of the pinned "
                                      rf"{re.escape(self.spec.wheel)} \(torch/version.py aside\)")
        self.assertIn(f"base: {wheel.name} (cpu variant, not pinned, torch {self.cpu_version}, cp311)", proc.stdout)
        self.assertLastGoodBuildKept(before)

    def test_other_sources_refused(self):
        # The series applies to a file with another context line elsewhere, but it is not the pinned file.
        hunk, line = context_line(self.patch)
        dropped = "torch/_dynamo/__init__.py"
        edited = replace_line((pristine_tree() / hunk.file).read_text(), line, line + "  # rebuilt")
        before = self.last_good_build()
        proc = self.build(self.cpu_wheel(edit={hunk.file: edited, dropped: None}))
        self.assertFailsWith(proc, 1, "is not pinned in patches/BASE and its Python sources are not those of the "
                             f"pinned {self.spec.wheel}: 1 differ ({hunk.file}); 1 missing ({dropped})",
                             "use a pinned wheel, or pin this one in patches/BASE once `check` passes with it")
        self.assertLastGoodBuildKept(before)

    def test_version_is_checked_in_metadata_and_version_py(self):
        before = self.last_good_build()
        proc = self.build(self.cpu_wheel(metadata_version="2.12.0+cpu", sources=False))
        self.assertFailsWith(proc, 1, f"METADATA says Version 2.12.0+cpu, its file name {self.cpu_version}")
        proc = self.build(self.cpu_wheel(torch_version="2.12.0+cpu", sources=False))
        self.assertFailsWith(proc, 1, f"torch/version.py says __version__ 2.12.0+cpu, not {self.cpu_version}")
        self.assertNotIn("Traceback", proc.stderr)
        self.assertLastGoodBuildKept(before)

    def test_python_tag_must_be_the_interpreters(self):
        wheel = self.cpu_wheel(tags="cp399-cp399-manylinux_2_28_x86_64", sources=False)
        proc = self.build(wheel)
        self.assertFailsWith(proc, 1, f"{wheel.name} is a cp399 wheel, but the interpreter",
                             "pass --python for that wheel's Python")

    def test_wheel_records_the_unpinned_base(self):
        from dplib.base import variant_of_wheel
        from dplib.series import load_series, series_digest

        project = Project.at(self.project)
        wheel = self.cpu_wheel(sources=False)
        spec = variant_of_wheel(project, wheel)
        self.assertEqual((spec.variant, spec.version, spec.sha256, spec.pinned),
                         ("cpu", self.cpu_version, sha256_file(wheel), False))
        self.assertTrue(spec.patched_version.startswith(f"{self.cpu_version}.dynapatch."))
        patches = load_series(project)
        record = dynapatch_mod.wheel_record(project, spec, patches, series_digest(project, patches))
        self.assertEqual((record["base_wheel"], record["base_sha256"], record["base_pinned"]),
                         (wheel.name, sha256_file(wheel), False))
        custom = self.tmp / wheel_mod.patched_wheel_name(spec)
        self.assertEqual(custom.name, f"torch-{spec.patched_version}-{WHEEL_TAGS}.whl")
        with zipfile.ZipFile(custom, "w") as zf:
            zf.writestr(wheel_mod.RECORD_MODULE, wheel_mod.record_module(record))
        proc = self.dynapatch("info", "--wheel", str(custom))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(f"torch {spec.patched_version} (dynapatch, cpu variant)\n"
                      f"base wheel: {wheel.name} sha256 {sha256_file(wheel)} (not pinned in patches/BASE: "
                      f"a CPU build, checked by version and sources)\n", proc.stdout)
        # A pinned base says nothing more than before.
        pinned = dynapatch_mod.wheel_record(project, self.spec, patches, series_digest(project, patches))
        self.assertTrue(pinned["base_pinned"])
        with zipfile.ZipFile(custom, "w") as zf:
            zf.writestr(wheel_mod.RECORD_MODULE, wheel_mod.record_module(pinned))
        proc = self.dynapatch("info", "--wheel", str(custom))
        self.assertIn(f"base wheel: {self.spec.wheel} sha256 {self.spec.sha256}\n", proc.stdout)

    def test_no_op_only_for_the_same_file(self):
        # The last build was from this CPU wheel (its record names its sha256): nothing to do. From
        # another CPU wheel (same variant, other file): not a no-op.
        project = Project.at(self.project)
        wheel = self.cpu_wheel(sources=False)
        spec = dynapatch_mod.variant_of_wheel(project, wheel)

        def last_build(base_sha256):
            (self.project / "dist").mkdir(exist_ok=True)
            built = self.project / "dist" / wheel_mod.patched_wheel_name(spec)
            with zipfile.ZipFile(built, "w") as zf:
                zf.writestr(wheel_mod.RECORD_MODULE, wheel_mod.record_module({"base_sha256": base_sha256}))
            (self.project / "build").mkdir(exist_ok=True)
            dynapatch_mod.write_stamp(project, dynapatch_mod.Stamp(
                dynapatch_mod.inputs_digest(project), built.name, sha256_file(built), "cpu", "cp311"))
            return self.dist_and_stamp()

        before = last_build(spec.sha256)
        proc = self.build(wheel)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("nothing changed since the last build", proc.stdout)
        self.assertIn("cpu variant, cp311)", proc.stdout)
        self.assertEqual(self.dist_and_stamp(), before)
        before = last_build("0" * 64)
        proc = self.build(wheel)
        self.assertNotIn("nothing changed", proc.stdout)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertEqual(self.dist_and_stamp(), before)


class BuildTest(ProjectCopyTestCase):
    def test_missing_compiler_keeps_last_good_wheel(self):
        before = self.last_good_build()
        proc = self.dynapatch("build", "--no-venv", "--variant", self.variant, env={"CXX": "/nonexistent"})
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
        proc = self.dynapatch("build", "--no-venv", "--variant", self.variant, env={"CXX": str(fake)})
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
        proc = self.dynapatch("build", "--no-venv", "--variant", self.variant, env={"CXX": "/nonexistent"})
        self.assertFailsWith(proc, 1, "CXX=/nonexistent")
        self.assertEqual(self.dist_and_stamp(), before)

    def test_another_variant_is_not_a_noop(self):
        # The last build was of another variant (a CPU build from --base-wheel): the default one builds.
        before = self.last_good_build(current=True, variant="cpu")
        proc = self.dynapatch("build", "--no-venv", "--variant", self.variant, env={"CXX": "/nonexistent"})
        self.assertNotIn("nothing changed", proc.stdout)
        self.assertFailsWith(proc, 1, "CXX=/nonexistent")
        self.assertEqual(self.dist_and_stamp(), before)
        proc = self.dynapatch("build", "--no-venv", "--base-wheel", str(self.tmp / "absent.whl"))
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


class VenvTest(ProjectCopyTestCase):
    """build's venv step (make_venv) with small fabricated "torch" wheels and a local index: a wheel of
    another base brings its own dependencies into an existing venv."""

    def wheel(self, directory, name, version, requires=(), body=""):
        directory.mkdir(exist_ok=True)
        path = directory / f"{name}-{version}-py3-none-any.whl"
        info = f"{name}-{version}.dist-info"
        metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
        files = {f"{name}/__init__.py": body + f"__version__ = {version!r}\n", f"{info}/METADATA": metadata,
                 f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
        files[f"{info}/RECORD"] = "".join(f"{rel},,\n" for rel in files) + f"{info}/RECORD,,\n"
        with zipfile.ZipFile(path, "w") as zf:
            for rel, text in files.items():
                zf.writestr(rel, text)
        return path

    def test_another_base_installs_its_dependencies_into_an_existing_venv(self):
        (self.project / "requirements-test.txt").write_text("")  # no index needed
        index = self.tmp / "index"
        self.wheel(index, "dynapatch_fake_cuda_libs", "1.0")
        old = self.wheel(self.tmp / "old", "torch", "2.0.0+cpu.dynapatch.1.g00000000")
        new = self.wheel(self.tmp / "new", "torch", "2.1.0+cu1.dynapatch.1.g00000000",
                         requires=["dynapatch_fake_cuda_libs"], body="import dynapatch_fake_cuda_libs\n")
        project = Project.at(self.project)
        python = dynapatch_mod.Interpreter(sys.executable, f"{sys.version_info[0]}.{sys.version_info[1]}")
        venv = dynapatch_mod.venv_dir(project, python.tag)
        env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index)}
        with unittest.mock.patch.dict(os.environ, env):
            dynapatch_mod.make_venv(project, old, sha256_file(old), python)
            self.assertEqual(dynapatch_mod.venv_torch_version(dynapatch_mod.python_exe(venv)),
                             "2.0.0+cpu.dynapatch.1.g00000000")
            # Without its dependency the new torch would not import (as a CUDA build without
            # nvidia-* libraries): build installed it with --no-deps and marked the venv ready.
            dynapatch_mod.make_venv(project, new, sha256_file(new), python)
        py = dynapatch_mod.python_exe(venv)
        proc = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
        self.assertEqual((proc.returncode, proc.stdout.strip()), (0, "2.1.0+cu1.dynapatch.1.g00000000"), proc.stderr)
        self.assertEqual((venv / "dynapatch-wheel.sha256").read_text().strip(), sha256_file(new))

    def test_a_venv_where_torch_does_not_import_is_not_marked_ready(self):
        (self.project / "requirements-test.txt").write_text("")
        broken = self.wheel(self.tmp / "broken", "torch", "2.1.0+cpu.dynapatch.1.g00000000",
                            body="raise ImportError('libcudnn.so.9: cannot open shared object file')\n")
        project = Project.at(self.project)
        python = dynapatch_mod.Interpreter(sys.executable, f"{sys.version_info[0]}.{sys.version_info[1]}")
        with unittest.mock.patch.dict(os.environ, {"PIP_NO_INDEX": "1"}):
            with self.assertRaises(DynapatchError):
                dynapatch_mod.make_venv(project, broken, sha256_file(broken), python)
        self.assertFalse((dynapatch_mod.venv_dir(project, python.tag) / "dynapatch-wheel.sha256").exists())


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
            self.assertEqual(spec.python_tag, tag)
            self.assertEqual(spec.wheel, f"torch-{spec.version}-{tag}-{tag}-manylinux_2_28_x86_64.whl")
            self.assertTrue(wheel_mod.patched_wheel_name(spec).endswith(f"-{tag}-{tag}-manylinux_2_28_x86_64.whl"))
        pinned = [s.variant for s in base_variants(project) if s.python_tag == self.other.tag]
        proc = self.dynapatch("build", "--no-venv", "--python", self.other.executable, "--variant", "rocm")
        self.assertFailsWith(proc, 1, f"no variant 'rocm' for {self.other.tag}", f"{pinned[0]} {self.other.tag}")

    def test_stamps_and_venvs_are_per_python(self):
        project = Project.at(self.project)
        default_spec, other_spec = load_base(project, python_tag="cp311"), load_base(project, python_tag=self.other.tag)
        default = self.fake_build("cp311", default_spec.variant)
        other = self.fake_build(self.other.tag, other_spec.variant)
        self.assertEqual(default.name, "wheel.stamp")
        self.assertEqual(other.name, f"wheel-{self.other.tag}.stamp")
        before = self.dist_and_stamp(), other.read_bytes()
        # Each Python's last build is current: a no-op that names its Python.
        proc = self.dynapatch("build", "--no-venv", "--python", self.other.executable, env={"CXX": "/nonexistent"})
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn(f"nothing changed since the last build: dist/torch-{other_spec.public_version}"
                      f"+{other_spec.label}.", proc.stdout)
        self.assertIn(f"{other_spec.variant} variant, {self.other.tag})", proc.stdout)
        proc = self.dynapatch("build", "--no-venv", env={"CXX": "/nonexistent"})
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn(f"{default_spec.variant} variant, cp311)", proc.stdout)
        # A change rebuilds; a failed build for one Python leaves both Pythons' wheels and stamps.
        (self.project / "csrc" / "guard_accel.cpp").write_text("// edited\n")
        proc = self.dynapatch("build", "--no-venv", "--variant", default_spec.variant, env={"CXX": "/nonexistent"})
        self.assertFailsWith(proc, 1, "CXX=/nonexistent")
        self.assertEqual((self.dist_and_stamp(), other.read_bytes()), before)
        self.assertEqual(len(list((self.project / "dist").glob("*.whl"))), 2)
        self.assertEqual(dynapatch_mod.venv_dir(Project.at(self.project), self.other.tag).name,
                         f".venv-{self.other.tag}")
        self.assertEqual(dynapatch_mod.venv_dir(Project.at(self.project), "cp311").name, ".venv")

    def test_base_wheel_of_another_python_refused(self):
        cp311 = CACHE / "base" / load_base(Project.at(ROOT), python_tag="cp311").wheel
        if not cp311.is_file():
            self.skipTest(f"{cp311} not cached")
        proc = self.dynapatch("build", "--no-venv", "--python", self.other.executable, "--base-wheel", str(cp311))
        self.assertFailsWith(proc, 1, f"{cp311.name} is a cp311 wheel", f"is Python {self.other.version} "
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
        specs = base_variants(Project.at(ROOT))
        self.assertIn(f"base torch {specs[0].public_version}: {specs[0].variant} {specs[0].python_tag} "
                      f"({specs[0].wheel})", proc.stdout)
        for spec in specs:
            self.assertIn(f"{spec.variant} {spec.python_tag} ({spec.wheel})", proc.stdout)
        self.assertIn(f"a CPU build ({specs[0].public_version}+cpu) through build --base-wheel F", proc.stdout)
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
        hunk, line = context_line(self.patch)  # a line of the file once: its edit is the new patch's one change
        target = devtree / hunk.file
        target.write_text(replace_line(target.read_text(), line, line + "  # reworded"))
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
        self.assertIn(f"\n+{line}  # reworded\n", text)
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
        target = self.tmp / "site-packages"
        shutil.copytree(pristine_tree() / "torch", target / "torch")
        info = target / f"torch-{load_base(Project.at(ROOT)).version}.dist-info"
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
        hunk, added = changed_line(self.patch, "+")
        self.assertIn(f"\n{added}\n", patched[hunk.file].decode())
        # The files apply added are in torch's RECORD, so pip uninstall torch removes them.
        record = next(target.glob("torch-*.dist-info/RECORD")).read_text()
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
        hunk, line = context_line(self.patch)
        changed = target / hunk.file
        changed.write_text(replace_line(changed.read_text(), line, line + "  # edited"))
        before = self.snapshot(target)
        self.assertFailsWith(self.dynapatch("apply", "--target", str(target)), 2, self.patch.name)
        self.assertEqual(self.snapshot(target), before)

    def test_apply_refuses_other_torch_version(self):
        target = self.make_target()
        version = target / "torch/version.py"
        spec = load_base(Project.at(ROOT))
        version.write_text(version.read_text().replace(f"'{spec.base_torch_version}'", "'2.12.0+cpu'"))
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
