"""Shared plumbing for the dynapatch tools: project layout, logging, errors."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn


class DynapatchError(Exception):
    """A user-facing failure: the message names the culprit; no traceback is shown."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# -v: echo every command and let pip/cmake/the compiler print as they go. Otherwise each
# step prints one line when it starts and one with its time when it ends, and a failing
# command's output is shown only when it fails.
VERBOSE = False


def log(message: str) -> None:
    print(f"dynapatch: {message}", flush=True)


def debug(message: str) -> None:
    if VERBOSE:
        log(message)


@contextlib.contextmanager
def step(title: str) -> Iterator[None]:
    """One line when the step starts, one with its time when it ends (or fails)."""
    log(f"{title} ...")
    started = time.monotonic()
    try:
        yield
    except BaseException:
        log(f"{title}: failed after {time.monotonic() - started:.1f} s")
        raise
    log(f"{title}: done in {time.monotonic() - started:.1f} s")


@dataclass(frozen=True)
class Project:
    """Where a dynapatch checkout keeps things. `cache` may be shared between checkouts."""

    root: Path
    cache: Path

    @classmethod
    def at(cls, root: Path, cache: Path | None = None) -> Project:
        root = root.resolve()
        return cls(root, (cache or root / "build" / "cache").resolve())

    patches = property(lambda self: self.root / "patches")
    series_file = property(lambda self: self.root / "patches" / "series")
    base_file = property(lambda self: self.root / "patches" / "BASE")
    overlay = property(lambda self: self.root / "torch_overlay")
    build = property(lambda self: self.root / "build")
    dist = property(lambda self: self.root / "dist")
    venv = property(lambda self: self.root / ".venv")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def run(cmd: list[str], *, cwd: Path | None = None, env: dict | None = None,
        check: bool = True, capture: bool = False, quiet: bool = False) -> subprocess.CompletedProcess:
    """Run a command (echoed under -v); raise DynapatchError with its output on failure.

    capture: return its output in .stdout. quiet: hide its output unless -v or it fails.
    """
    debug("$ " + " ".join(str(c) for c in cmd))
    hide = capture or (quiet and not VERBOSE)
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env={**os.environ, **(env or {})},
        text=True, stdout=subprocess.PIPE if hide else None,
        stderr=subprocess.STDOUT if hide else None,
    )
    if check and proc.returncode != 0:
        detail = f"\n{proc.stdout.strip()}" if hide and proc.stdout else ""
        raise DynapatchError(f"command failed (exit {proc.returncode}): {' '.join(map(str, cmd))}{detail}")
    return proc


# The environment of every pip command that fetches or installs a torch this tool pins: the base
# wheel (patches/BASE: version and sha256), the custom wheel built from it, the release
# `rebase-check --to` names. A constraint file in the pip configuration (PIP_CONSTRAINT, or
# `constraint` in pip.conf: some machines cap torch below the release) would make those
# commands fail and cannot loosen an exact pin, so it is not applied to them; the
# requirement files pin the other packages they install.
PINNED_TORCH_PIP_ENV = {"PIP_CONSTRAINT": "/dev/null"}


def pip_quiet() -> list[str]:
    """pip's own output only under -v."""
    return [] if VERBOSE else ["--quiet"]


def git(args: list[str], cwd: Path, *, env: dict | None = None, check: bool = True) -> str:
    """Run git with config pinned so its output does not depend on the user's settings."""
    pinned = ["-c", "core.quotePath=true", "-c", "diff.noprefix=false",
              "-c", "diff.mnemonicPrefix=false", "-c", "diff.algorithm=myers",
              "-c", "diff.renames=false", "-c", "core.autocrlf=false",
              "-c", "user.name=dynapatch", "-c", "user.email=dynapatch@localhost",
              "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]
    proc = subprocess.run(["git", *pinned, *args], cwd=cwd, text=True,
                          capture_output=True, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise DynapatchError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stderr.strip()}")
    return proc.stdout


def python_exe(venv: Path) -> Path:
    return venv / "bin" / "python"


def die(error: DynapatchError) -> NoReturn:
    print(f"dynapatch: error: {error}", file=sys.stderr, flush=True)
    sys.exit(error.exit_code)
