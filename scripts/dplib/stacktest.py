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
from .common import DynapatchError, Project, log, python_exe, run
from .ext import EXTENSION_DIR, EXTENSION_NAME, build_extension
from .series import Patch, patched_sources, series_digest
from .testsel import node_ids, shared_files, test_files
from .upstream_tests import FAILED, PASSED, SKIPPED, parse_junit, stock_venv
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


def scratch_venv(project: Project, base_wheel: Path, spec: BaseSpec) -> Path:
    """build/stack-test/venv: a hard-linked copy of the stock env (base wheel + requirements-test.txt)."""
    stock = stock_venv(project, base_wheel, spec.sha256)
    venv = project.build / "stack-test" / "venv"
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


def _native_digest(project: Project) -> str:
    digest = hashlib.sha256()
    for entry in NATIVE_INPUTS:
        path = project.root / entry
        for f in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
            digest.update(str(f.relative_to(project.root)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def _extension(project: Project, spec: BaseSpec, wheel: Path) -> tuple[str, bytes]:
    """The C++ extension, built once per native-input digest."""
    cache = project.build / "stack-test" / f"ext-{_native_digest(project)}"
    if (cache / "name").is_file():
        name = (cache / "name").read_text().strip()
        return name, (cache / "module.so").read_bytes()
    log("stack-test: building the C++ extension (once for every prefix that owns native code)")
    name, data = build_extension(project, spec, wheel)
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
        self._restore()
        stage = self.project.build / "stack-test" / "stage"
        changed = patched_sources(self.project, prefix, self.pristine, stage)
        files = {rel: (stage / rel).read_bytes() for rel in changed}
        version_py = (self.pristine / "torch" / "version.py").read_text()
        files["torch/version.py"] = stamp_version_py(version_py, self.spec,
                                                     series_digest(self.project, prefix)).encode()
        native = any(p.native_files for p in prefix)
        ext_dir = self.site / EXTENSION_DIR
        for old in ext_dir.glob(f"{EXTENSION_NAME}.*.so"):
            old.unlink()
        if native:
            name, data = _extension(self.project, self.spec, self.wheel)
            files[name] = data
        self.written = sorted(files)
        self.state.write_text("\n".join(self.written) + "\n")
        for rel, data in files.items():
            _replace(self.site / rel, data)
        shutil.rmtree(stage, ignore_errors=True)
        return native


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
    junit = project.build / "stack-test" / f"junit-{index + 1:04d}.xml"
    junit.unlink(missing_ok=True)
    cmd = ["nice", str(python_exe(venv)), "-m", "pytest", "-p", "no:cacheprovider", "-q",
           f"--junitxml={junit}", *ids]
    log(f"stack-test {index + 1}/{len(patches)} {patch.patch_name}: $ " + " ".join(cmd[1:]))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "DYNAPATCH_CACHE_DIR": str(project.cache)}
    try:
        proc = subprocess.run(cmd, cwd=work, env=env, text=True, capture_output=True, timeout=timeout)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    except subprocess.TimeoutExpired:
        proc, tail = None, [f"timed out after {timeout:.0f} s"]
    result.seconds = time.monotonic() - started
    if junit.is_file():
        result.results = parse_junit(junit)
    if proc is None or not result.results or (proc.returncode not in (0, 1)):
        result.error = "pytest did not complete: " + " | ".join(tail[-3:])
    if not result.ok:
        failed = [t for t, s in result.results.items() if s == FAILED]
        log(f"stack-test {patch.patch_name}: {len(failed)} failed: " + ", ".join(failed[:20])
            + ("\n" + "\n".join(tail) if tail else ""))
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
