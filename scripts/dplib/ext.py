"""Building the C++ extension torch._dynamo._guard_accel against the base wheel."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from .base import BaseSpec
from .common import DynapatchError, Project, python_exe, run

EXTENSION_DIR = "torch/_dynamo"
EXTENSION_NAME = "_guard_accel"


def tool_env(project: Project) -> Path:
    """A venv with the pinned build tools (cmake, ninja, setuptools from PyPI), made once."""
    reqs = (project.root / "requirements-build.txt").read_bytes()
    env = project.cache / f"toolenv-{hashlib.sha256(reqs).hexdigest()[:12]}"
    if (env / ".complete").is_file():
        return env
    shutil.rmtree(env, ignore_errors=True)
    run(["python3", "-m", "venv", env])
    run([python_exe(env), "-m", "pip", "install", "--quiet", "-r", project.root / "requirements-build.txt"])
    (env / ".complete").write_text("ok\n")
    return env


def torch_dev_tree(project: Project, spec: BaseSpec, wheel: Path) -> Path:
    """The base wheel's headers and shared libraries, extracted once: what the extension builds against."""
    dest = project.cache / f"torchdev-{spec.sha256[:16]}"
    if (dest / ".complete").is_file():
        return dest / "torch"
    shutil.rmtree(dest, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=project.cache, prefix="torchdev-"))
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.startswith("torch/include/") or (name.startswith("torch/lib/") and ".so" in name):
                zf.extract(info, tmp)
    (tmp / ".complete").write_text(spec.sha256 + "\n")
    tmp.rename(dest)
    return dest / "torch"


def find_cxx() -> str:
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return name
    raise DynapatchError("no C++ compiler found (looked for c++, g++, clang++): "
                         "the guard accelerator needs one; on Debian: apt-get install g++")


def build_extension(project: Project, spec: BaseSpec, wheel: Path) -> tuple[str, bytes]:
    """Configure and build the extension with CMake + Ninja through setup.py.

    Returns the wheel path of the built module and its bytes.
    """
    find_cxx()
    env_dir = tool_env(project)
    torch_root = torch_dev_tree(project, spec, wheel)
    out = project.build / "ext"
    shutil.rmtree(out, ignore_errors=True)
    run([python_exe(env_dir), "setup.py", "--quiet", "build_ext",
         "--build-temp", out / "temp", "--build-lib", out / "lib"],
        cwd=project.root,
        env={"DYNAPATCH_TORCH_ROOT": str(torch_root),
             "PATH": f"{env_dir / 'bin'}:{os.environ.get('PATH', '')}"})
    built = sorted((out / "lib" / EXTENSION_DIR).glob(f"{EXTENSION_NAME}.*.so"))
    if len(built) != 1:
        raise DynapatchError(f"extension build produced {built}, expected one {EXTENSION_NAME}.*.so")
    return f"{EXTENSION_DIR}/{built[0].name}", built[0].read_bytes()
