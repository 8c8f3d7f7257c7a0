"""upstream-tests: Dynamo's own test files, run with the stock base wheel and with the custom one.

Each test file runs whole, in its own pytest process, once per environment: tests
that are flaky or depend on their file's order behave as they do upstream, and one
crashing file does not take the others with it. The verdict compares test by test:
a regression passed with the stock wheel and fails (or did not run) with the custom one.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from .common import DynapatchError, log, PINNED_TORCH_PIP_ENV, Project, python_exe, run
from .series import by_patch_name, load_series

# Upstream files covering what the series touches: guards, recompiles, hooks,
# modules, optimizers, unspecialized scalars, decorators; then the broad ones that
# exercise the same paths from every side: repros, misc, AOT autograd, tensor
# subclasses, context managers, functions, export, higher-order ops (2,500+ tests passing on the
# stock wheel).
DEFAULT_FILES = ("test_guard_manager.py", "test_recompiles.py", "test_hooks.py", "test_modules.py",
                 "test_optimizers.py", "test_unspec.py", "test_decorators.py",
                 "test_repros.py", "test_misc.py", "test_aot_autograd.py", "test_subclasses.py",
                 "test_ctx_manager.py", "test_functions.py", "test_export.py", "test_higher_order_ops.py")
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class FileRun:
    file: str
    returncode: int
    seconds: float
    results: dict[str, str] = field(default_factory=dict)  # test id -> PASSED/FAILED/SKIPPED

    def count(self, status: str) -> int:
        return sum(1 for s in self.results.values() if s == status)


def stock_venv(project: Project, base_wheel: Path, base_sha256: str) -> Path:
    """A venv with the stock base wheel and requirements-test.txt, made once per (wheel, requirements)."""
    requirements = project.root / "requirements-test.txt"
    key = hashlib.sha256(base_sha256.encode() + b"\0" + requirements.read_bytes()).hexdigest()[:16]
    venv = project.cache / f"stockenv-{key}"
    done = venv / "dynapatch-stockenv.complete"
    # The cache may be shared: one checkout creates the env while the others wait.
    with open(project.cache / f"stockenv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            log(f"stock env: {venv} (cached)")
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        log(f"stock env: creating {venv} (base wheel + {requirements.name})")
        run(["python3", "-m", "venv", venv])
        run([python_exe(venv), "-m", "pip", "install", "--quiet", "-r", requirements, base_wheel],
            env=PINNED_TORCH_PIP_ENV)
        done.write_text(f"{base_sha256}\n")
    return venv


def torch_in(venv: Path, cwd: Path) -> tuple[str, str]:
    """(torch.__version__, torch.__file__) as the tests in `cwd` will import it."""
    out = run([python_exe(venv), "-c", "import torch; print(torch.__version__); print(torch.__file__)"],
              cwd=cwd, capture=True).stdout.split()
    return out[-2], out[-1]


def parse_junit(path: Path) -> dict[str, str]:
    """Test id (file::class::name) -> status, from a pytest junit xml file."""
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            status = FAILED
        elif "skipped" in tags:
            status = SKIPPED
        else:
            status = PASSED
        # A test can appear twice (a failing teardown adds an error case): the worst wins.
        if results.get(test_id) != FAILED:
            results[test_id] = status
    return results


def run_file(venv: Path, test_dir: Path, file: str, xml: Path, timeout: float) -> FileRun:
    """Run one test file in its own pytest process; a crash or timeout becomes a failed pseudo-test."""
    xml.parent.mkdir(parents=True, exist_ok=True)
    xml.unlink(missing_ok=True)
    cmd = [str(python_exe(venv)), "-m", "pytest", "-p", "no:cacheprovider", "-q", "--tb=no",
           f"--junit-xml={xml}", f"dynamo/{file}"]
    started = time.monotonic()
    log(f"$ (cd {test_dir}) {' '.join(cmd)}")
    try:
        proc = subprocess.run(cmd, cwd=test_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        returncode = -1
    result = FileRun(file, returncode, time.monotonic() - started)
    if xml.is_file():
        result.results = parse_junit(xml)
    # pytest exits 0 (all passed), 1 (some failed) or 5 (none collected); anything else
    # (crash, timeout, internal error) means tests may be missing from the xml.
    if returncode not in (0, 1, 5) or not xml.is_file():
        why = "timed out" if returncode == -1 else f"exited {returncode}"
        result.results[f"{file}::<pytest {why}>"] = FAILED
    return result


@dataclass
class Comparison:
    regressions: list[str]
    newly_passing: list[str]
    now_skipped: list[str]
    # Regressions listed in patches/upstream-expected-changes: test id -> "patch: why".
    expected: dict[str, str] = field(default_factory=dict)

    def unexpected_regressions(self) -> list[str]:
        return [t for t in self.regressions if t not in self.expected]


EXPECTED_CHANGES = "upstream-expected-changes"


def load_expected_changes(project: Project) -> dict[str, str]:
    """Reviewed upstream test results the series changes on purpose: test id -> reason.

    Lines of patches/upstream-expected-changes are `<test id> <Patch-Name> <why>`
    (`#` starts a comment); the test id is the one this report prints and the patch
    must be in the series, named by its Patch-Name trailer so an entry neither outlives
    the patch it explains nor moves to another patch when the series is renumbered.
    """
    path = project.patches / EXPECTED_CHANGES
    if not path.is_file():
        return {}
    series = by_patch_name(load_series(project))
    expected = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split(None, 2)
        if len(parts) < 3:
            raise DynapatchError(f"{path}:{lineno}: expected `<test id> <Patch-Name> <why>`")
        test_id, name, why = parts
        if name not in series:
            raise DynapatchError(f"{path}:{lineno}: no patch of patches/series has Patch-Name {name}"
                                 + (" (entries name patches by Patch-Name, not by number)" if name.isdigit() else ""))
        if test_id in expected:
            raise DynapatchError(f"{path}:{lineno}: {test_id} is listed twice")
        expected[test_id] = f"{series[name].name}: {why}"
    return expected


def compare(stock: list[FileRun], patched: list[FileRun]) -> Comparison:
    regressions, newly_passing, now_skipped = [], [], []
    for before, after in zip(stock, patched):
        for test_id, status in sorted(before.results.items()):
            new = after.results.get(test_id, FAILED)  # a test that did not run has not passed
            if status == PASSED and new == FAILED:
                regressions.append(test_id)
            elif status == PASSED and new == SKIPPED:
                now_skipped.append(test_id)
        for test_id, new in sorted(after.results.items()):
            if new == PASSED and before.results.get(test_id) == FAILED:
                newly_passing.append(test_id)
    return Comparison(regressions, newly_passing, now_skipped)


def format_report(stock: list[FileRun], patched: list[FileRun], comparison: Comparison) -> str:
    lines = ["| file | stock passed/failed/skipped | patched passed/failed/skipped | seconds (stock, patched) |",
             "|---|---|---|---|"]
    for before, after in zip(stock, patched):
        counts = [f"{r.count(PASSED)}/{r.count(FAILED)}/{r.count(SKIPPED)}" for r in (before, after)]
        lines.append(f"| {before.file} | {counts[0]} | {counts[1]} | {before.seconds:.0f}, {after.seconds:.0f} |")
    totals = [f"{sum(r.count(s) for r in runs)}" for runs in (stock, patched) for s in (PASSED, FAILED, SKIPPED)]
    lines.append(f"| total | {'/'.join(totals[:3])} | {'/'.join(totals[3:])} | |")
    expected = [t for t in comparison.regressions if t in comparison.expected]
    for title, tests in (("regressions (passed on stock, fail patched)", comparison.unexpected_regressions()),
                         (f"expected changes (patches/{EXPECTED_CHANGES})", expected),
                         ("newly passing (failed on stock, pass patched)", comparison.newly_passing),
                         ("now skipped (passed on stock, skipped patched)", comparison.now_skipped)):
        lines.append(f"\n{title}: {len(tests)}")
        lines += [f"  {t}" + (f"  ({comparison.expected[t]})" if t in comparison.expected else "") for t in tests]
    return "\n".join(lines)


def select_files(pytorch_src: Path, files: list[str] | None) -> tuple[Path, list[str]]:
    """The checkout's test/ dir and the test files to run; every one must exist."""
    test_dir = pytorch_src / "test"
    if not (test_dir / "dynamo").is_dir():
        raise DynapatchError(f"{pytorch_src} has no test/dynamo/: expected a pytorch source checkout")
    names = [Path(f).name for f in (files or DEFAULT_FILES)]
    missing = [n for n in names if not (test_dir / "dynamo" / n).is_file()]
    if missing:
        raise DynapatchError(f"not in {test_dir / 'dynamo'}: {', '.join(missing)}")
    return test_dir, names


def run_upstream_tests(pytorch_src: Path, names: list[str], stock: Path, patched: Path, out: Path,
                       timeout: float, expected: dict[str, str]) -> Comparison:
    test_dir = pytorch_src / "test"
    runs: dict[str, list[FileRun]] = {}
    for label, venv in (("stock", stock), ("patched", patched)):
        version, location = torch_in(venv, test_dir)
        # Run from test/: from the checkout root, `import torch` would find the unbuilt sources.
        if Path(location).resolve().is_relative_to(pytorch_src.resolve()):
            raise DynapatchError(f"the {label} env imports torch from {location}, inside the checkout")
        log(f"{label}: torch {version} from {location}")
        runs[label] = [run_file(venv, test_dir, name, out / label / f"{Path(name).stem}.xml", timeout)
                       for name in names]
    comparison = compare(runs["stock"], runs["patched"])
    comparison.expected = expected
    print("\n" + format_report(runs["stock"], runs["patched"], comparison) + "\n", flush=True)
    log(f"junit xml: {out}/stock, {out}/patched")
    return comparison
