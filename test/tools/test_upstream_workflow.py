"""export-prs, rebase-check and patches/<version>/ overrides, on temporary copies of the project."""

import re
import shutil
import subprocess
import zipfile
from pathlib import Path

from test_dynapatch_cli import (  # also puts scripts/ on sys.path
    changed_line,
    context_line,
    hunks,
    pristine_tree,
    ProjectCopyTestCase,
    replace_line,
    ROOT,
    WHEEL_TAGS,
)

from dplib.base import load_base
from dplib.common import Project


def tree_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and ".git" not in p.relative_to(root).parts}


class ExportPrsTest(ProjectCopyTestCase):
    def setUp(self):
        super().setUp()
        # The patches' Tests: files travel with their PRs.
        shutil.copytree(ROOT / "test/dynamo", self.project / "test/dynamo",
                        ignore=shutil.ignore_patterns("__pycache__"))

    def git(self, *args, cwd):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
                               *args], cwd=cwd, text=True, capture_output=True)

    def test_git_am_onto_pristine_tree_equals_apply(self):
        self.assertEqual(self.dynapatch("check").returncode, 0)  # fills the cache with the pristine sources
        out = self.tmp / "prs"
        proc = self.dynapatch("export-prs", str(out))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        mboxes = sorted(out.glob("*.patch"))
        series = [n for n in (self.project / "patches/series").read_text().splitlines() if n and n[0] != "#"]
        self.assertEqual(len(mboxes), len(series))

        # A checkout-like git repo of the base wheel's Python sources.
        repo = self.tmp / "pytorch"
        shutil.copytree(pristine_tree() / "torch", repo / "torch")
        self.git("init", "-q", cwd=repo)
        self.git("add", "-A", cwd=repo)
        self.git("commit", "-q", "-m", f"v{load_base(Project.at(ROOT)).public_version}", cwd=repo)
        # Files of pytorch's tree the wheel lacks (upstream tests, build lists) are not in this repo.
        excludes = ["--exclude=build_variables.bzl"] + [
            f"--exclude={line.split()[2][2:]}" for d in (self.project / "patches/pr-extra").glob("*.diff")
            for line in d.read_text().splitlines() if line.startswith("diff --git ")]
        am = self.git("am", *excludes, *map(str, mboxes), cwd=repo)
        self.assertEqual(am.returncode, 0, am.stdout + am.stderr)
        self.assertEqual(self.git("rev-list", "--count", "HEAD", cwd=repo).stdout.strip(), str(len(series) + 1))

        applied = self.tmp / "applied"
        shutil.copytree(pristine_tree() / "torch", applied / "torch")
        self.assertEqual(self.dynapatch("apply", "--target", str(applied)).returncode, 0)
        exported = tree_files(repo / "torch")
        native = {rel for rel in exported if rel.startswith("csrc/dynamo/")}  # apply builds no C++
        self.assertEqual({k: v for k, v in exported.items() if k not in native}, tree_files(applied / "torch"))
        # After the last PR every test file and native source is there as in the project.
        named = "".join(p.read_text() for p in (self.project / "patches").glob("*.patch"))
        for test in (self.project / "test/dynamo").glob("test_*.py"):
            if f"Tests: test/dynamo/{test.name}" in named:
                self.assertEqual((repo / "test/dynamo" / test.name).read_bytes(), test.read_bytes())
        for source in (self.project / "csrc").iterdir():
            self.assertEqual((repo / "torch/csrc/dynamo" / source.name).read_bytes(), source.read_bytes())

    def test_verify_runs_each_prs_own_tests_from_the_amd_tree(self):
        """export-prs --verify on the first PR, with a small test file in place of its own: it runs from
        the git-am'd tree against a venv holding that tree's files (two cases check that), and its
        failing case fails the PR. (The full run over every PR takes about 35 minutes, see docs/toolchain.md.)"""
        hunk, added = changed_line(self.patch, "+")  # the fixture looks for a line the first PR adds
        fixture = AM_FIXTURE.replace("MODULE", hunk.file[:-3].replace("/", ".")).replace("ADDED", repr(added))
        (self.project / "test/dynamo/test_am_fixture.py").write_text(
            fixture + "\n\ndef test_fails_on_purpose():\n    assert False\n")
        self.patch.write_text(self.patch.read_text().replace(
            "Tests: test/dynamo/test_optimizer_variable.py", "Tests: test/dynamo/test_am_fixture.py", 1))
        proc = self.dynapatch("export-prs", str(self.tmp / "prs"), "--verify", "--patch", "0001")
        self.assertFailsWith(proc, 1, "1 of 1 PRs fail their own tests when applied with git am; the first is 1/",
                             "(optimizer-init-group-match)")
        self.assertRegex(proc.stdout, r"\| 1/\d+ \| optimizer-init-group-match \| test/dynamo/test_am_fixture.py "
                                      r"\| 2/1/0 \| no \| \d+ \| FAIL \|")
        self.assertIn("test_fails_on_purpose", proc.stdout)
        self.assertEqual(
            len(list((self.tmp / "prs").glob("*.patch"))), len(list((self.project / "patches").glob("*.patch")))
        )

    def test_message_is_a_pr_description(self):
        out = self.tmp / "prs"
        self.assertEqual(self.dynapatch("export-prs", str(out)).returncode, 0)
        last = sorted(out.glob("*.patch"))[-1].read_text()
        message = last.split("\n---\n", 1)[0]
        self.assertIn("Test plan:\n    python test/dynamo/test_", message)
        base = load_base(Project.at(ROOT)).public_version
        self.assertIn(f"Stack (oldest first; apply in this order onto v{base}):", message)
        self.assertIn("(this PR)", message)
        self.assertIn("Depends on:", message)
        self.assertNotIn("Upstream-Status:", message)
        self.assertNotIn("Overlay-File:", message)

    def test_refuses_unknown_base_and_nonempty_outdir(self):
        proc = self.dynapatch("export-prs", str(self.tmp / "prs"), "--base-ref", "v2.12.0")
        self.assertFailsWith(proc, 1, "v2.12.0")
        (self.tmp / "full").mkdir()
        (self.tmp / "full" / "old.patch").write_text("x")
        self.assertFailsWith(self.dynapatch("export-prs", str(self.tmp / "full")), 1, "not empty")


AM_FIXTURE = '''
import os

import torch


def test_runs_from_the_amd_tree_against_its_installed_files():
    here = os.path.dirname(os.path.abspath(__file__))
    assert here.endswith(os.path.join("export-verify", "pytorch", "test", "dynamo")), here
    assert "export-verify" in torch.__file__ and "pytorch" not in torch.__file__, torch.__file__


def test_prefix_is_installed():
    import importlib

    with open(importlib.import_module("MODULE").__file__) as f:
        assert "\\n" + ADDED + "\\n" in f.read()
'''


class PatchNameTest(ProjectCopyTestCase):
    """Patch-Name: every patch has one, unique, and overrides and expected changes follow it."""

    def set_trailer(self, path, value):
        text = path.read_text()
        old = next(line for line in text.splitlines() if line.startswith("Patch-Name: "))
        path.write_text(text.replace(old + "\n", f"Patch-Name: {value}\n" if value is not None else "", 1))

    def renumber(self, old_path, new_name):
        """What refresh does when a patch is inserted before this one: the file is renamed."""
        series = self.project / "patches/series"
        series.write_text(series.read_text().replace(old_path.name, new_name))
        old_path.rename(old_path.with_name(new_name))

    def test_every_shipped_patch_and_override_has_a_unique_name(self):
        names = [line.split(": ", 1)[1] for p in sorted((ROOT / "patches").glob("*.patch"))
                 for line in p.read_text().split("\n---\n", 1)[0].splitlines() if line.startswith("Patch-Name: ")]
        self.assertEqual(len(names), len(list((ROOT / "patches").glob("*.patch"))))
        self.assertEqual(len(set(names)), len(names))

    def test_refresh_names_a_new_commit_from_its_subject(self):
        from dplib.devtree import _patch_name
        self.assertEqual(_patch_name("[dynamo] guard the thing, once", set()), "guard-the-thing-once")
        self.assertEqual(_patch_name("[dynamo] guard the thing, once", {"guard-the-thing-once"}),
                         "guard-the-thing-once-2")
        self.assertLessEqual(len(_patch_name("[dynamo] " + "word " * 30, set())), 48)

    def test_missing_name(self):
        self.set_trailer(self.patch, None)
        self.assertFailsWith(self.dynapatch("check"), 1, self.patch.name, "needs one 'Patch-Name: <name>' trailer")

    def test_two_names(self):
        text = self.patch.read_text()
        self.patch.write_text(text.replace("Upstream-Status:", "Patch-Name: second\nUpstream-Status:", 1))
        self.assertFailsWith(self.dynapatch("check"), 1, self.patch.name, "(has 2)")

    def test_bad_format(self):
        for bad in ("Optimizer_Fix", "0001", "-x", "a" * 49):
            with self.subTest(bad=bad):
                self.set_trailer(self.patch, bad)
                self.assertFailsWith(self.dynapatch("check"), 1, self.patch.name, "is not lower-case words")

    def test_duplicate_name(self):
        second = sorted((self.project / "patches").glob("0002-*.patch"))[0]
        self.set_trailer(second, "optimizer-init-group-match")
        self.assertFailsWith(self.dynapatch("check"), 1, second.name, "same Patch-Name optimizer-init-group-match")

    def override(self, path):
        """An override of the patch at `path` for a later release, identical but for a context line."""
        override = self.project / "patches/2.99.0" / path.name
        override.parent.mkdir(exist_ok=True)
        _, line = context_line(path)
        override.write_text(replace_line(path.read_text(), f" {line}", f" {line}  # upstream"))
        return override

    def test_renumbered_patch_keeps_expected_changes_and_names_its_override(self):
        second = self.patch_named("scalar-state")
        override = self.override(self.patch)
        self.assertEqual(self.dynapatch("check").returncode, 0)
        self.renumber(second, "0099-moved.patch")  # expected changes name scalar-state
        self.assertEqual(self.dynapatch("check").returncode, 0)
        self.renumber(self.patch, "0098-moved.patch")
        self.assertFailsWith(self.dynapatch("check"), 1, f"override patches/2.99.0/{override.name} is patch "
                             "optimizer-init-group-match, now patches/0098-moved.patch",
                             "rename it to patches/2.99.0/0098-moved.patch")
        override.rename(override.with_name("0098-moved.patch"))
        self.assertEqual(self.dynapatch("check").returncode, 0)

    def test_override_with_another_patch_name(self):
        override = self.override(self.patch)
        self.set_trailer(override, "scalar-state")
        self.assertFailsWith(self.dynapatch("check"), 1, f"override patches/2.99.0/{override.name} is patch "
                             f"scalar-state, now patches/{self.number('scalar-state')}-")
        self.set_trailer(override, "unknown-name")
        self.assertFailsWith(self.dynapatch("check"), 1, "Patch-Name 'unknown-name', which no patch")


class RebaseCheckTest(ProjectCopyTestCase):
    """rebase-check against a small fake release wheel made from the base's own sources."""

    def fake_release(self, version, edit=None, extra=(), drop=()):
        """A torch-<version> wheel holding the files the series changes (but `drop`), optionally edited."""
        pristine = pristine_tree()
        files = sorted({line.split()[2][2:] for p in (self.project / "patches").glob("*.patch")
                        for line in p.read_text().splitlines() if line.startswith("diff --git ")} - set(drop))
        path = self.tmp / f"torch-{version}-{WHEEL_TAGS}.whl"
        with zipfile.ZipFile(path, "w") as zf:
            for rel in files:
                text = (pristine / rel).read_text()
                zf.writestr(rel, edit(rel, text) if edit else text)
            for rel in extra:
                zf.writestr(rel, "")
        return path

    def rebase_check(self, version, wheel):
        return self.dynapatch("rebase-check", "--to", version, "--wheel", str(wheel))

    def test_same_sources_apply_cleanly(self):
        proc = self.rebase_check("2.99.0", self.fake_release("2.99.0"))
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn(f"| {self.patch.name} | clean |", proc.stdout)

    def test_context_change_merges_and_writes_the_refreshed_patch(self):
        # A context line with no changed line next to it (an adjacent one would conflict).
        hunk, line = context_line(self.patch, near=False)

        def edit(rel, text):
            return replace_line(text, line, line + "  # upstream") if rel == hunk.file else text
        wheel = self.fake_release("2.99.0", edit)
        proc = self.rebase_check("2.99.0", wheel)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        # The hunk does not apply as it is; the three-way merge says a refresh changes its context.
        self.assertIn(f"| {self.patch.name} | merges | context of 1 of ", proc.stdout)
        self.assertIn(f"{hunk.file} {hunk.header} (context only)", proc.stdout)
        self.assertIn("1 merges", proc.stdout)
        # The refreshed patch keeps the header and applies to the release's file exactly.
        refreshed = self.project / "build/rebase-2.99.0" / self.patch.name
        self.assertEqual(refreshed.read_text().split("\n---\n")[0], self.patch.read_text().split("\n---\n")[0])
        tree = self.tmp / "release"
        with zipfile.ZipFile(wheel) as zf:
            for rel in {h.file for h in hunks(self.patch)}:
                zf.extract(rel, tree)
        applied = subprocess.run(["git", "apply", "--check", "--verbose", str(refreshed)], cwd=tree,
                                 text=True, capture_output=True, env={"GIT_CEILING_DIRECTORIES": str(self.tmp)})
        self.assertEqual(applied.returncode, 0, applied.stderr)
        self.assertNotIn("offset", applied.stdout + applied.stderr)

    def test_conflict_names_regions_and_later_patches_are_still_checked(self):
        # Upstream rewrites a line the first patch changes.
        hunk, removed = changed_line(self.patch, "-")
        rewritten = removed + "  # upstream"

        def edit(rel, text):
            return replace_line(text, removed, rewritten) if rel == hunk.file else text
        proc = self.rebase_check("2.99.0", self.fake_release("2.99.0", edit))
        self.assertFailsWith(proc, 2, self.patch.name, "1 conflict")
        self.assertRegex(proc.stdout, rf"\| {self.patch.name} \| conflict \| 1 conflicts: "
                                      rf"{re.escape(hunk.file)}:\d+-\d+ \|")
        self.assertIn("(changed lines differ)", proc.stdout)
        conflicts = (self.project / "build/rebase-2.99.0" / self.patch.name).with_suffix(".conflicts").read_text()
        self.assertIn(rewritten, conflicts)
        self.assertIn("(pinned base)", conflicts)
        # The next patch of that file is checked against the merged file, not left blocked.
        later = next(p for p in sorted((self.project / "patches").glob("*.patch"))[1:]
                     if hunk.file in {h.file for h in hunks(p)})
        self.assertRegex(proc.stdout, rf"\| {later.name} \| clean \|")
        self.assertNotIn("blocked", proc.stdout)

    def test_change_the_release_already_has_drops_out(self):
        # The release carries the patch's own change (a backport): the refresh drops it.
        patched = self.tmp / "patched"
        files = {h.file for h in hunks(self.patch)}  # the files the first patch changes
        for rel in files:
            (patched / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pristine_tree() / rel, patched / rel)
        applied = subprocess.run(["git", "apply", str(self.patch)], cwd=patched, text=True, capture_output=True,
                                 env={"GIT_CEILING_DIRECTORIES": str(self.tmp)})
        self.assertEqual(applied.returncode, 0, applied.stderr)

        def edit(rel, text):
            return (patched / rel).read_text() if rel in files else text
        proc = self.rebase_check("2.99.0", self.fake_release("2.99.0", edit))
        self.assertRegex(proc.stdout, rf"\| {self.patch.name} \| merges \| (\d+) of its \1 \+/- lines drop out")

    def test_offsets_are_reported_and_accepted(self):
        first = hunks(self.patch)
        moved = [h for h in first if h.file == first[0].file]  # the hunks of the first patch's first file

        def edit(rel, text):
            return "# moved\n# down\n" + text if rel == first[0].file else text
        proc = self.rebase_check("2.99.0", self.fake_release("2.99.0", edit))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(f"| {self.patch.name} | offsets | line numbers of {len(moved)} hunks | "
                      f"{first[0].file} {first[0].header}: offset 2 lines", proc.stdout)

    def test_file_missing_in_the_release(self):
        # The first file of a patch that no earlier patch changes.
        patches = sorted((self.project / "patches").glob("*.patch"))
        seen, patch, rel = set(), None, None
        for p in patches:
            files = [h.file for h in hunks(p)]
            if files and files[0] not in seen and patch is None:
                patch, rel = p, files[0]
            seen.update(files)
        proc = self.rebase_check("2.99.0", self.fake_release("2.99.0", drop=[rel]))
        self.assertFailsWith(proc, 2)
        self.assertRegex(proc.stdout, rf"\| {re.escape(patch.name)} \| conflict \| not possible \| "
                                      rf"{re.escape(rel)} does not exist in the target \|")
        self.assertNotIn("Traceback", proc.stderr)

    def test_overlay_collision(self):
        overlay = next(line.split(": ", 1)[1] for p in sorted((self.project / "patches").glob("*.patch"))
                       for line in p.read_text().splitlines() if line.startswith("Overlay-File: "))
        proc = self.rebase_check("2.99.0", self.fake_release("2.99.0", extra=[overlay]))
        self.assertFailsWith(proc, 2)
        self.assertIn(f"overlay file {overlay} collides with a file of the target", proc.stdout)

    def test_override_makes_series_apply_and_check_validates_it(self):
        # Upstream changes a line next to one the patch changes; the override carries that line.
        hunk, line = context_line(self.patch, near=True)

        def edit(rel, text):
            return replace_line(text, line, line + "  # upstream") if rel == hunk.file else text
        wheel = self.fake_release("2.99.0", edit)
        override = self.project / "patches/2.99.0" / self.patch.name
        override.parent.mkdir()
        original = self.patch.read_text()
        override.write_text(replace_line(original, f" {line}", f" {line}  # upstream"))
        # An override is the same patch: other subjects or files are refused.
        self.assertEqual(self.dynapatch("check").returncode, 0)
        proc = self.rebase_check("2.99.0", wheel)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn(f"| {self.patch.name} | clean (override) |", proc.stdout)
        # The base build does not see it.
        # Upstream changed the line next to the one the patch changes: a conflict without the override.
        self.assertIn(f"| {self.patch.name} | conflict |", proc.stdout.split("with overrides")[0])

        override.write_text(original.replace("Subject: [PATCH] ", "Subject: [PATCH] other ", 1))
        self.assertFailsWith(self.dynapatch("check"), 1, "patches/2.99.0/" + self.patch.name, "subject")
        override.write_text(original)
        self.assertFailsWith(self.dynapatch("check"), 1, "identical")
        override.unlink()
        (override.parent / "0099-nothing.patch").write_text(original)
        self.assertFailsWith(self.dynapatch("check"), 1, "0099-nothing.patch is patch optimizer-init-group-match",
                             f"rename it to patches/2.99.0/{self.patch.name}")

    def test_shipped_overrides_are_for_releases_other_than_the_base(self):
        self.assertFalse((ROOT / "patches" / load_base(Project.at(ROOT)).public_version).exists())


FIXTURE_TESTS = {
    # Passes with both wheels.
    "test_fixture_stable.py": '''
import torch


def test_compiles():
    assert torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2)).sum().item() == 4


def test_skipped():
    import pytest
    pytest.skip("not on this machine")
''',
    # Regresses on purpose with the custom wheel; and gains a pass the stock wheel lacks.
    "test_fixture_version.py": '''
import torch


def test_stock_version():
    assert "dynapatch" not in torch.__version__


def test_has_init_values_once():
    assert hasattr(torch._dynamo.config, "init_values_once")
''',
}


class UpstreamTestsTest(ProjectCopyTestCase):
    """upstream-tests on a pytorch-like directory with two tiny test files, against the built .venv."""

    def run_fixture_checkout(self):
        """upstream-tests on a checkout holding FIXTURE_TESTS, against the built .venv."""
        if not (ROOT / ".venv/bin/python").exists():
            self.skipTest("no .venv: run `dynapatch.py test`, which builds it first")
        checkout = self.tmp / "pytorch"
        for name, text in FIXTURE_TESTS.items():
            (checkout / "test/dynamo").mkdir(parents=True, exist_ok=True)
            (checkout / "test/dynamo" / name).write_text(text)
        return self.dynapatch("upstream-tests", "--pytorch-src", str(checkout), "--files", *FIXTURE_TESTS,
                              "--patched-venv", str(ROOT / ".venv"), "--junit-dir", str(self.tmp / "junit"))

    def test_reports_regression_and_newly_passing(self):
        proc = self.run_fixture_checkout()
        self.assertFailsWith(proc, 1, "1 upstream tests regress")
        out = proc.stdout
        self.assertIn("| test_fixture_stable.py | 1/0/1 | 1/0/1 |", out)
        self.assertIn("| test_fixture_version.py | 1/1/0 | 1/1/0 |", out)
        regressions = out.split("regressions (passed on stock, fail patched): ")[1]
        self.assertTrue(regressions.startswith("1\n  dynamo.test_fixture_version::test_stock_version\n"), out)
        newly = out.split("newly passing (failed on stock, pass patched): ")[1]
        self.assertTrue(newly.startswith("1\n  dynamo.test_fixture_version::test_has_init_values_once\n"), out)
        self.assertTrue((self.tmp / "junit/patched/test_fixture_version.xml").is_file())

    def test_reviewed_expected_change_does_not_fail(self):
        expected = self.project / "patches/upstream-expected-changes"
        expected.write_text("# reviewed\ndynamo.test_fixture_version::test_stock_version  optimizer-init-group-match  "
                            "checks the stock version\n")
        proc = self.run_fixture_checkout()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("regressions (passed on stock, fail patched): 0\n", proc.stdout)
        self.assertIn("expected changes (patches/upstream-expected-changes): 1\n"
                      "  dynamo.test_fixture_version::test_stock_version  (0001-", proc.stdout)

    def test_expected_change_must_name_a_patch_of_the_series(self):
        expected = self.project / "patches/upstream-expected-changes"
        expected.write_text("dynamo.test_x::test_y  no-such-patch  gone\n")
        self.assertFailsWith(self.dynapatch("check"), 1, "upstream-expected-changes:1",
                             "no patch of patches/series has Patch-Name no-such-patch")
        # Numbers are not names: a renumbered series would retarget them silently.
        expected.write_text("dynamo.test_x::test_y  0001  gone\n")
        self.assertFailsWith(self.dynapatch("check"), 1, "Patch-Name 0001", "not by number")

    def test_missing_file_is_named(self):
        (self.tmp / "pytorch/test/dynamo").mkdir(parents=True)
        proc = self.dynapatch("upstream-tests", "--pytorch-src", str(self.tmp / "pytorch"),
                              "--files", "test_absent.py", "--patched-venv", str(ROOT / ".venv"))
        self.assertFailsWith(proc, 1, "test_absent.py")


class NativeOwnershipTest(ProjectCopyTestCase):
    """Native-File: every csrc/ source goes with one patch, whose PR carries it."""

    def native_patch(self, number):
        return sorted((self.project / "patches").glob(f"{number}-*.patch"))[0]

    def test_unowned_source_is_refused(self):
        (self.project / "csrc/extra_guard.cpp").write_text("// no patch owns this\n")
        self.assertFailsWith(self.dynapatch("check"), 1, "native sources no patch owns", "csrc/extra_guard.cpp")

    def test_missing_source_is_refused(self):
        (self.project / "csrc/tensor_aliasing_group.h").unlink()
        self.assertFailsWith(self.dynapatch("check"), 1, "needs native file csrc/tensor_aliasing_group.h")

    def test_source_claimed_twice_or_outside_csrc(self):
        native = self.number("native-container-guard")
        later = self.patch_named("no-tensor-instance-dict")
        self.assertGreater(later.name[:4], native)
        original = later.read_text()
        later.write_text(original.replace("Upstream-Status:", "Native-File: csrc/guard_accel.cpp\nUpstream-Status:", 1))
        self.assertFailsWith(self.dynapatch("check"), 1, f"csrc/guard_accel.cpp is claimed by {native}-", later.name)
        later.write_text(original.replace("Upstream-Status:", "Native-File: setup.py\nUpstream-Status:", 1))
        self.assertFailsWith(self.dynapatch("check"), 1, "Native-File setup.py is not a C/C++ source under csrc/")


class TestsTravelTest(ProjectCopyTestCase):
    """Tests: selectors and patches/pr-extra/: each PR carries the cases and upstream test edits it causes."""

    def setUp(self):
        super().setUp()
        shutil.copytree(ROOT / "test/dynamo", self.project / "test/dynamo",
                        ignore=shutil.ignore_patterns("__pycache__"))

    def edit_trailer(self, number, old, new):
        path = sorted((self.project / "patches").glob(f"{number}-*.patch"))[0]
        text = path.read_text()
        self.assertIn(old, text)
        path.write_text(text.replace(old, new, 1))

    def test_shared_file_is_split_by_selectors(self):
        from dplib.testsel import SharedFile
        text = ("import x\n\n\nclass A:\n    def test_a(self):\n        pass\n\n    @deco\n    def test_b(self):\n"
                "        pass\n\n\nclass B:\n    def test_c(self):\n        pass\n\n\ninstantiate(B)\n")
        shared = SharedFile("t.py", text, [0, 1, 2], {"A::test_b": 1, "B": 2})
        self.assertEqual(shared.text_at(0), "import x\n\n\nclass A:\n    def test_a(self):\n        pass\n")
        self.assertNotIn("class B", shared.text_at(1))
        self.assertIn("    @deco\n    def test_b(self):\n", shared.text_at(1))
        self.assertEqual(shared.text_at(2), text)

    def test_selectors_are_checked(self):
        self.edit_trailer(self.number("compiled-autograd-hook-none"),
                          "::HookResidualsTests::test_hook_returning_none_matches_eager",
                          "::HookResidualsTests::test_nothing_*")
        self.assertFailsWith(self.dynapatch("check"), 1,
                             "test_hook_residuals.py::HookResidualsTests::test_nothing_* matches no test")

    def test_selector_on_the_patch_that_introduces_the_file(self):
        self.edit_trailer("0001", "Tests: test/dynamo/test_optimizer_variable.py",
                          "Tests: test/dynamo/test_optimizer_variable.py::X")
        self.assertFailsWith(self.dynapatch("check"), 1, "selects cases of a file it introduces")

    def test_case_selected_by_two_patches(self):
        # A later patch selecting cases a selector of native-container-guard already takes.
        native = self.number("native-container-guard")
        last = sorted((self.project / "patches").glob("*.patch"))[-1]
        trailer = next(line for line in last.read_text().splitlines() if line.startswith("Tests: "))
        self.edit_trailer(last.name[:4], trailer,
                          trailer + "\nTests: test/dynamo/test_guard_explainer.py::NativeGuardExplainerTests")
        self.assertFailsWith(self.dynapatch("check"), 1, f"is selected by {native}-")

    def test_pr_extra_must_belong_to_a_patch_and_stay_outside_the_wheel(self):
        extra = self.project / "patches/pr-extra"
        (extra / "no-such-patch.diff").write_text((extra / "scalar-state.diff").read_text())
        self.assertFailsWith(self.dynapatch("check"), 1, "no-such-patch.diff is not <Patch-Name>.diff")
        (extra / "no-such-patch.diff").unlink()
        (extra / "explain-guards.diff").write_text("diff --git a/torch/_dynamo/guards.py b/torch/_dynamo/guards.py\n")
        self.assertFailsWith(self.dynapatch("check"), 1, "changes torch/_dynamo/guards.py, a file of the torch package")

    def test_each_pr_carries_its_own_cases_native_code_and_upstream_test_edits(self):
        out = self.tmp / "prs"
        proc = self.dynapatch("export-prs", str(out))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        mbox = {p.name[:4]: p.read_text() for p in out.glob("*.patch")}
        explain = self.number("explain-guards")
        scalars = self.number("scalar-state")
        native = self.number("native-container-guard")
        # explain-guards adds test_guard_explainer.py without native-container-guard's class of
        # cases, which that patch adds to it (a class selector in its Tests: trailer).
        self.assertIn("+class GuardExplainerTests(torch._dynamo.test_case.TestCase):", mbox[explain])
        self.assertNotIn("class NativeGuardExplainerTests(", mbox[explain])
        self.assertIn("+class NativeGuardExplainerTests(", mbox[native])
        self.assertIn("python -m pytest test/dynamo/test_guard_explainer.py::NativeGuardExplainerTests", mbox[native])
        # scalar-state's expected-count edits of upstream's test_modules.py travel in its PR.
        self.assertIn("diff --git a/test/dynamo/test_modules.py b/test/dynamo/test_modules.py", mbox[scalars])
        self.assertIn("+        self.assertEqual(cnt.frame_count, 2)", mbox[scalars])
        # native-container-guard carries the native sources at pytorch paths, the build list entry
        # and the port notes ...
        self.assertIn("diff --git a/torch/csrc/dynamo/tensor_container_guard.cpp", mbox[native])
        self.assertIn('+    "torch/csrc/dynamo/tensor_container_guard.cpp",', mbox[native])
        self.assertIn("LeafGuard subclass", mbox[native])
        self.assertIn("GuardDebugInfo", mbox[native])
        # ... and every guard class of its one plan, ObjectIdentityGuard included.
        self.assertIn("diff --git a/torch/csrc/dynamo/object_identity_guard.cpp", mbox[native])
        self.assertIn('+    "torch/csrc/dynamo/object_identity_guard.cpp",', mbox[native])
        for number, text in mbox.items():
            self.assertNotIn("Patch-Name:", text.split("\n---\n", 1)[0], number)
            self.assertNotIn("csrc/dynamo/", text if number != native else "", number)


class StackTestTest(ProjectCopyTestCase):
    """stack-test on the first prefix (no native code, one test file): passes, and names a failing patch."""

    def setUp(self):
        super().setUp()
        shutil.copytree(ROOT / "test", self.project / "test", ignore=shutil.ignore_patterns("__pycache__"))

    def test_prefix_passes_then_fails_when_its_own_test_fails(self):
        proc = self.dynapatch("stack-test", "--patch", "optimizer-init-group-match")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertRegex(proc.stdout, r"\| 1/\d+ \| optimizer-init-group-match \| "
                                      r"test/dynamo/test_optimizer_variable.py \| [1-9]\d*/0/\d+ \| no \|")
        test = self.project / "test/dynamo/test_optimizer_variable.py"
        test.write_text(test.read_text() + "\n\ndef test_fails_on_purpose():\n    assert False\n")
        proc = self.dynapatch("stack-test", "--patch", "0001")
        self.assertFailsWith(proc, 1, "1 of 1 prefixes fail their own tests; the first is 1/",
                             "(optimizer-init-group-match)")
        self.assertIn("test_fails_on_purpose", proc.stdout)

    def test_unknown_patch(self):
        self.assertFailsWith(self.dynapatch("stack-test", "--patch", "nope"), 1, "--patch nope")
