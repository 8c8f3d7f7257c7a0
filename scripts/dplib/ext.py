"""Building the C++ extension torch._dynamo._guard_accel against the base wheel."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from . import common
from .base import BaseSpec
from .common import debug, DynapatchError, pip_quiet, Project, python_exe, run
from .interp import Interpreter, resolve_interpreter

EXTENSION_DIR = "torch/_dynamo"
EXTENSION_NAME = "_guard_accel"
BUILD_LOG = "ext-build.log"


def tool_env(project: Project, python: Interpreter | None = None) -> Path:
    """A venv of the interpreter `python` (default python3) with the pinned build tools (cmake, ninja,
    setuptools from PyPI), made once per Python version; its cmake and ninja must run. The extension
    is compiled against the Python that runs setup.py: this venv's."""
    python = python or resolve_interpreter(None)
    reqs = (project.root / "requirements-build.txt").read_bytes()
    # The cp311 one keeps its earlier name, so existing caches stay valid.
    suffix = "" if python.tag == "cp311" else f"-{python.tag}"
    env = project.cache / f"toolenv-{hashlib.sha256(reqs).hexdigest()[:12]}{suffix}"
    if not (env / ".complete").is_file():
        shutil.rmtree(env, ignore_errors=True)
        run([python.executable, "-m", "venv", env])
        run([python_exe(env), "-m", "pip", "install", *pip_quiet(), "-r", project.root / "requirements-build.txt"],
            quiet=True)
        (env / ".complete").write_text("ok\n")
    for tool in ("cmake", "ninja"):
        exe = env / "bin" / tool
        proc = subprocess.run([str(exe), "--version"], capture_output=True, text=True) if exe.is_file() else None
        if proc is None or proc.returncode != 0:
            raise DynapatchError(f"{tool} of the build tools venv {env} does not run; remove {env} to "
                                 f"reinstall requirements-build.txt")
    return env


def torch_dev_tree(project: Project, spec: BaseSpec, wheel: Path) -> Path:
    """The base wheel's headers and shared libraries, extracted once: what the extension builds against.

    For the CUDA variant these are its own headers and libraries (libtorch_python.so needs
    libtorch_cuda.so, which needs the nvidia-* libraries only at run time): guards use no CUDA
    API, so no CUDA toolkit is needed to build.
    """
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
    """The C++ compiler CMake will use: $CXX if set (it must run), else c++, g++ or clang++."""
    explicit = os.environ.get("CXX")
    candidates = [explicit] if explicit else ["c++", "g++", "clang++"]
    for name in candidates:
        exe = shutil.which(name.split()[0])
        if exe and subprocess.run([exe, "--version"], capture_output=True).returncode == 0:
            return exe
    if explicit:
        raise DynapatchError(f"CXX={explicit} is not a C++ compiler that runs: the guard accelerator "
                             f"needs one (unset CXX to use c++, g++ or clang++)")
    raise DynapatchError("no C++ compiler found (looked for c++, g++, clang++): "
                         "the guard accelerator needs one; on Debian: apt-get install g++")


def check_toolchain(project: Project, python: Interpreter | None = None) -> Path:
    """Everything the extension build needs, before anything is built: compiler, cmake, ninja."""
    cxx = find_cxx()
    debug(f"C++ compiler: {cxx}")
    return tool_env(project, python)


def _build_dir(project: Project, spec: BaseSpec, sources: Path | None = None) -> Path:
    """CMake's build tree, kept between builds so ninja recompiles only what changed; one per
    base wheel, compiler and source directory (CMake fixes the compiler when it first
    configures a tree)."""
    key = f"{spec.sha256}\0{find_cxx()}\0{os.environ.get('CXXFLAGS', '')}"
    if sources is not None:
        key += f"\0{sources}"
    return project.build / "ext" / f"temp-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def first_error(output: str) -> str:
    """The compiler's (or CMake's) first error line of a failed build's output."""
    lines = output.splitlines()
    for pattern in (r"\berror\b", r"CMake Error", r"FAILED:", r"fatal"):
        for i, line in enumerate(lines):
            if re.search(pattern, line):
                if line.startswith("CMake Error") and i + 1 < len(lines):
                    # CMake puts the message on the following indented lines.
                    detail = " ".join(l.strip() for l in lines[i + 1:i + 4] if l.strip())
                    return f"{line.strip()} {detail}".strip()
                return line.strip()
    return lines[-1].strip() if lines else "(no output)"


def build_extension(project: Project, spec: BaseSpec, wheel: Path, env_dir: Path | None = None, *,
                    sources: Path | None = None, out: Path | None = None) -> tuple[str, bytes]:
    """Configure and build the extension with CMake + Ninja through setup.py.

    `sources` is the directory holding the native files (default: the project's csrc/; export-prs
    --verify passes an am'd pytorch tree's torch/csrc/dynamo); `out` where the module is linked
    (default: build/ext). Returns the wheel path of the built module and its bytes. On failure the
    error names the compiler's first error line; the whole output is in build/ext-build.log.
    """
    env_dir = env_dir or check_toolchain(project)
    torch_root = torch_dev_tree(project, spec, wheel)
    out = out or project.build / "ext"
    shutil.rmtree(out / "lib", ignore_errors=True)  # the module is always relinked into an empty dir
    cmd = [python_exe(env_dir), "setup.py", "--quiet", "build_ext",
           "--build-temp", _build_dir(project, spec, sources), "--build-lib", out / "lib"]
    env = {**os.environ, "DYNAPATCH_TORCH_ROOT": str(torch_root),
           "PATH": f"{env_dir / 'bin'}:{os.environ.get('PATH', '')}"}
    if sources is not None:
        env["DYNAPATCH_GUARD_ACCEL_SOURCES"] = str(sources.resolve())
    debug("$ " + " ".join(map(str, cmd)))
    proc = subprocess.run([str(c) for c in cmd], cwd=project.root, env=env, text=True,
                          stdout=None if common.VERBOSE else subprocess.PIPE,
                          stderr=None if common.VERBOSE else subprocess.STDOUT)
    log_file = project.build / BUILD_LOG
    if proc.stdout is not None:
        log_file.write_text(proc.stdout)
    if proc.returncode != 0:
        where = f"; full output in {log_file}" if proc.stdout is not None else ""
        first = first_error(proc.stdout) if proc.stdout is not None else "see the output above"
        raise DynapatchError(f"the C++ extension did not build: {first}{where}")
    built = sorted((out / "lib" / EXTENSION_DIR).glob(f"{EXTENSION_NAME}.*.so"))
    if len(built) != 1:
        raise DynapatchError(f"extension build produced {built}, expected one {EXTENSION_NAME}.*.so")
    return f"{EXTENSION_DIR}/{built[0].name}", built[0].read_bytes()
