"""stack-test: every prefix of the series passes the tests its last patch ships.

For prefix k (patches 1..k) the scratch venv holds torch as a wheel of that prefix would:
the base wheel's files, the prefix's patched files and overlay files, torch/version.py
stamped with the prefix's digest, and the C++ extension only when a patch of the prefix
owns native sources (`Native-File:`). The venv is made once from the cached stock env
(hard links; every file the series writes is replaced, never written through), so a
prefix costs only its changed files, not a wheel repack and reinstall. The tests are the
ones patch k's PR carries (testsel.py): its own files as of patch k, or its selected
cases of a shared file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .base import BaseSpec
from .common import DynapatchError, log, Project, python_exe, run
from .ext import build_extension, EXTENSION_DIR, EXTENSION_NAME
from .series import Patch, patched_sources, series_digest
from .testsel import node_ids, shared_files, test_files
from .upstream_tests import FAILED, parse_junit, PASSED, SKIPPED, stock_venv
from .wheel import stamp_version_py

NATIVE_INPUTS = ("csrc", "setup.py", "CMakeLists.txt", "requirements-build.txt")


@dataclass
class PrefixResult:
    index: int
    patch: Patch
    node_ids: list[str]
    results: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    native: bool = False
    error: str = ""

    def count(self, status: str) -> int:
        return sum(1 for s in self.results.values() if s == status)

    @property
    def ok(self) -> bool:
        return not self.error and self.count(FAILED) == 0 and self.count(PASSED) > 0


def _replace(path: Path, data: bytes) -> None:
    """Write a new file at `path` (never through a hard link into the stock env)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_bytes(data)


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise DynapatchError(f"{venv}: expected one lib/python3*/site-packages, found {found}")
    return found[0]


def scratch_venv(project: Project, base_wheel: Path, spec: BaseSpec, name: str = "stack-test") -> Path:
    """build/<name>/venv: a hard-linked copy of the stock env (base wheel + requirements-test.txt)."""
    stock = stock_venv(project, base_wheel, spec.sha256)
    venv = project.build / name / "venv"
    marker = venv / "dynapatch-stack-test.source"
    if marker.is_file() and marker.read_text().strip() == str(stock):
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Hard links: about 1 GB of torch costs no copy; files the series changes are replaced.
    if subprocess.run(["cp", "-al", str(stock), str(venv)]).returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        shutil.copytree(stock, venv, symlinks=True)
    (venv / "dynapatch-stockenv.complete").unlink(missing_ok=True)
    marker.write_text(f"{stock}\n")
    return venv


def _native_digest(project: Project, sources: Path) -> str:
    digest = hashlib.sha256()
    inputs = [(entry, project.root / entry) for entry in NATIVE_INPUTS if entry != "csrc"] + [("csrc", sources)]
    for entry, path in inputs:
        for f in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
            digest.update(f"{entry}/{f.relative_to(path)}".encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def extension(project: Project, spec: BaseSpec, wheel: Path, sources: Path | None = None,
              work: Path | None = None) -> tuple[str, bytes]:
    """The C++ extension built from `sources` (default csrc/), once per native-input digest.

    `work` (default build/stack-test) holds the cache and the link directory; a non-default
    `sources` gets its own CMake tree, so the build really compiles the files found there.
    """
    work = work or project.build / "stack-test"
    cache = work / f"ext-{_native_digest(project, sources or project.root / 'csrc')}"
    if (cache / "name").is_file():
        name = (cache / "name").read_text().strip()
        return name, (cache / "module.so").read_bytes()
    log(f"{work.name}: building the C++ extension from {sources or 'csrc/'} (once for every prefix that "
        f"owns native code)")
    name, data = build_extension(project, spec, wheel, sources=sources, out=work / "ext")
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "module.so").write_bytes(data)
    (cache / "name").write_text(name + "\n")
    return name, data


class Installer:
    """Puts one prefix of the series into the scratch venv, undoing the previous prefix first."""

    def __init__(self, project: Project, spec: BaseSpec, wheel: Path, pristine: Path, venv: Path) -> None:
        self.project, self.spec, self.wheel, self.pristine = project, spec, wheel, pristine
        self.site = _site_packages(venv)
        self.written: list[str] = []
        state = venv / "dynapatch-stack-test.written"
        self.state = state
        if state.is_file():  # an interrupted run: restore what it changed
            self.written = state.read_text().split()
            self._restore()

    def _restore(self) -> None:
        for rel in self.written:
            target = self.site / rel
            target.unlink(missing_ok=True)
            original = self.pristine / rel
            if original.is_file():
                _replace(target, original.read_bytes())
            elif rel != "torch/version.py" and not rel.endswith(".so"):
                # An overlay file: its __pycache__ entry would be stale too.
                for pyc in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
                    pyc.unlink()
        self.written = []
        self.state.unlink(missing_ok=True)

    def install(self, prefix: list[Patch]) -> bool:
        """Returns whether the prefix owns native code (the extension is installed)."""
        stage = self.project.build / "stack-test" / "stage"
        changed = patched_sources(self.project, prefix, self.pristine, stage)
        files = {rel: (stage / rel).read_bytes() for rel in changed}
        shutil.rmtree(stage, ignore_errors=True)
        native = any(p.native_files for p in prefix)
        self.install_files(files, series_digest(self.project, prefix),
                           extension(self.project, self.spec, self.wheel) if native else None)
        return native

    def install_files(self, files: dict[str, bytes], digest: str, ext: tuple[str, bytes] | None) -> None:
        """Put `files` (site-packages paths -> contents) in place of the previous prefix's, with
        torch/version.py stamped with `digest` and the extension `ext` (wheel path, bytes) if given."""
        self._restore()
        files = dict(files)
        version_py = (self.pristine / "torch" / "version.py").read_text()
        files["torch/version.py"] = stamp_version_py(version_py, self.spec, digest).encode()
        ext_dir = self.site / EXTENSION_DIR
        for old in ext_dir.glob(f"{EXTENSION_NAME}.*.so"):
            old.unlink()
        if ext is not None:
            files[ext[0]] = ext[1]
        self.written = sorted(files)
        self.state.write_text("\n".join(self.written) + "\n")
        for rel, data in files.items():
            _replace(self.site / rel, data)


def run_tests(project: Project, venv: Path, cwd: Path, ids: list[str], junit: Path, label: str,
              timeout: float, result: PrefixResult, *, safe_path: bool = False) -> None:
    """pytest `ids` in `venv` from `cwd`; fills `result` (statuses, seconds, error).

    `python -P`: the working directory is not put on sys.path, so from a pytorch tree `import
    torch` is the venv's installed torch, not the tree's sources (which have no libraries).
    `safe_path` (a pytorch tree as `cwd`) does the same for the interpreters the tests start
    (PYTHONSAFEPATH=1), such as the subprocesses of the native bad-argument tests.
    """
    started = time.monotonic()
    junit.unlink(missing_ok=True)
    cmd = ["nice", str(python_exe(venv)), "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q",
           f"--junitxml={junit}", *ids]
    log(f"{label}: $ " + " ".join(cmd[1:]))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "DYNAPATCH_CACHE_DIR": str(project.cache)}
    if safe_path:
        env["PYTHONSAFEPATH"] = "1"
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    except subprocess.TimeoutExpired:
        proc, tail = None, [f"timed out after {timeout:.0f} s"]
    result.seconds += time.monotonic() - started
    if junit.is_file():
        result.results = parse_junit(junit)
    if proc is None or not result.results or (proc.returncode not in (0, 1)):
        result.error = "pytest did not complete: " + " | ".join(tail[-3:])
    if not result.ok:
        failed = [t for t, s in result.results.items() if s == FAILED]
        log(f"{label}: {len(failed)} failed: " + ", ".join(failed[:20]) + ("\n" + "\n".join(tail) if tail else ""))


def run_prefix(project: Project, patches: list[Patch], index: int, installer: Installer, venv: Path,
               timeout: float) -> PrefixResult:
    patch = patches[index]
    tests = shared_files(project, patches)
    ids = [i for rel in test_files(patch) for i in node_ids(tests[rel], index)]
    result = PrefixResult(index, patch, ids)
    if not ids:
        result.error = "ships no tests (no Tests: trailer)"
        return result
    started = time.monotonic()
    result.native = installer.install(patches[: index + 1])
    # The test files as this patch's PR carries them, next to the project's other test helpers.
    work = project.build / "stack-test" / "tests"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(project.root / "test", work / "test", ignore=shutil.ignore_patterns("__pycache__"))
    for rel in test_files(patch):
        (work / rel).write_text(tests[rel].text_at(index))
    result.seconds = time.monotonic() - started
    run_tests(project, venv, work, ids, project.build / "stack-test" / f"junit-{index + 1:04d}.xml",
              f"stack-test {index + 1}/{len(patches)} {patch.patch_name}", timeout, result)
    return result


def format_table(results: list[PrefixResult], total: int) -> str:
    lines = ["| prefix | patch | tests run | passed/failed/skipped | native | seconds | result |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        counts = f"{r.count(PASSED)}/{r.count(FAILED)}/{r.count(SKIPPED)}"
        verdict = "ok" if r.ok else (r.error or "FAIL")
        lines.append(f"| {r.index + 1}/{total} | {r.patch.patch_name} | {', '.join(r.node_ids) or '-'} | "
                     f"{counts} | {'yes' if r.native else 'no'} | {r.seconds:.0f} | {verdict} |")
    return "\n".join(lines)


def stack_test(project: Project, spec: BaseSpec, wheel: Path, pristine: Path, patches: list[Patch],
               indices: list[int], timeout: float) -> list[PrefixResult]:
    venv = scratch_venv(project, wheel, spec)
    run([python_exe(venv), "-c", "import sys; print(sys.prefix)"], capture=True)
    installer = Installer(project, spec, wheel, pristine, venv)
    results = []
    try:
        for index in indices:
            results.append(run_prefix(project, patches, index, installer, venv, timeout))
    finally:
        installer._restore()
    return results
