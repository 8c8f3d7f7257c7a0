"""The Python interpreter a custom wheel is built for (`build --python`, `test --python`)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .common import DynapatchError

DEFAULT_PYTHON = "python3"


@dataclass(frozen=True)
class Interpreter:
    executable: str  # absolute path of the interpreter
    version: str  # "3.12"

    @property
    def tag(self) -> str:
        """The wheel's Python tag, e.g. cp312."""
        return "cp" + self.version.replace(".", "")


def _candidates(name: str) -> list[str]:
    """`name` as given (a path, or a command on PATH); then, for a pyenv shim that does not select
    that version (`pyenv: python3.12: command not found`), the pyenv installations' own copies."""
    found = [name] if os.sep in name else ([shutil.which(name)] if shutil.which(name) else [])
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    if os.sep not in name:
        found += sorted(glob.glob(os.path.join(root, "versions", "*", "bin", name)), reverse=True)
    return found


def resolve_interpreter(name: str | None) -> Interpreter:
    """The CPython interpreter `name` (a command or a path; default python3) as it runs."""
    name = name or DEFAULT_PYTHON
    probe = "import sys; print(sys.implementation.name, '%d.%d' % sys.version_info[:2], sys.executable)"
    errors = []
    for exe in _candidates(name):
        proc = subprocess.run([exe, "-c", probe], capture_output=True, text=True)
        if proc.returncode == 0:
            impl, version, executable = proc.stdout.split(maxsplit=2)
            if impl != "cpython":
                raise DynapatchError(f"--python {name} is {impl}: the custom wheel is for CPython")
            return Interpreter(str(Path(executable.strip())), version)
        errors.append(f"{exe}: {(proc.stderr.strip().splitlines() or [f'exit {proc.returncode}'])[-1]}")
    raise DynapatchError(f"--python {name}: no interpreter of that name runs"
                         + (f" ({'; '.join(errors)})" if errors else " (not on PATH)"))
