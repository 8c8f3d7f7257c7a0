"""lint: ruff over torch_overlay/, scripts/ and test/ (ruff.toml), clang-format over csrc/ (.clang-format).

Both tools come pinned from requirements-lint.txt into a venv made once under the cache dir.
ruff findings fail the run, and so does a csrc/ file clang-format would change (reported
per file with the number of places; `clang-format -i --style=file csrc/*` fixes them).
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from pathlib import Path

from .common import DynapatchError, log, Project, python_exe, run
from .series import NATIVE_DIR, NATIVE_SUFFIXES

LINTED = ("torch_overlay", "scripts", "test")
REQUIREMENTS = "requirements-lint.txt"


def lint_env(project: Project) -> Path:
    reqs = (project.root / REQUIREMENTS).read_bytes()
    env = project.cache / f"lintenv-{hashlib.sha256(reqs).hexdigest()[:12]}"
    with open(project.cache / f"{env.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the cache may be shared between checkouts
        if not (env / ".complete").is_file():
            shutil.rmtree(env, ignore_errors=True)
            run(["python3", "-m", "venv", env])
            run([python_exe(env), "-m", "pip", "install", "--quiet", "-r", project.root / REQUIREMENTS])
            (env / ".complete").write_text("ok\n")
    return env


def clang_format_report(project: Project, env: Path) -> dict[str, int]:
    """csrc/ file -> number of places clang-format would change."""
    counts = {}
    native = project.root / NATIVE_DIR
    for path in sorted(p for p in native.rglob("*") if p.is_file() and p.name.endswith(NATIVE_SUFFIXES)):
        style = f"--style=file:{project.root / '.clang-format'}"
        proc = subprocess.run([str(env / "bin" / "clang-format"), "--dry-run", style, str(path)],
                              text=True, capture_output=True)
        counts[str(path.relative_to(project.root))] = proc.stderr.count("warning:")
    return counts


def lint(project: Project) -> None:
    env = lint_env(project)
    proc = subprocess.run([str(env / "bin" / "ruff"), "check", "--no-cache", "--output-format", "concise", *LINTED],
                          cwd=project.root, text=True, capture_output=True)
    print(proc.stdout.strip(), flush=True)
    counts = clang_format_report(project, env)
    for rel, n in counts.items():
        log(f"clang-format: {rel}: {n} places differ from .clang-format" if n else f"clang-format: {rel}: clean")
    problems = []
    if proc.returncode != 0:
        problems.append("ruff found problems (listed above; settings in ruff.toml)")
    unformatted = [rel for rel, n in counts.items() if n]
    if unformatted:
        problems.append(f"{', '.join(unformatted)} not formatted as .clang-format says "
                        f"(clang-format -i --style=file {' '.join(unformatted)})")
    if problems:
        raise DynapatchError("; ".join(problems))
    log(f"lint ok: ruff clean over {', '.join(LINTED)}; csrc/ formatted")
