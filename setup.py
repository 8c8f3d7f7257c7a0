"""Builds torch._dynamo._guard_accel with CMake + Ninja.

Driven by `scripts/dynapatch.py build`, which sets DYNAPATCH_TORCH_ROOT to the base
wheel's unpacked torch package; the result is placed into the custom wheel, not
installed on its own.

The build uses -Wall -Wextra -Werror. DYNAPATCH_GUARD_ACCEL_ASAN=1 builds an
AddressSanitizer variant instead (for test runs only, never for a wheel), e.g.:

    DYNAPATCH_GUARD_ACCEL_ASAN=1 DYNAPATCH_TORCH_ROOT=... python setup.py build_ext \
        --build-temp /tmp/asan/temp --build-lib /tmp/asan/lib
    # put /tmp/asan/lib/torch/_dynamo/_guard_accel.*.so in place of the installed one, then
    LD_PRELOAD="$(c++ -print-file-name=libasan.so) $(c++ -print-file-name=libstdc++.so)" \
        ASAN_OPTIONS=detect_leaks=0 PYTHONMALLOC=malloc \
        python -m pytest test/dynamo/test_guard_accel.py ...

libstdc++ is preloaded too: python does not link it, and ASan's __cxa_throw
interceptor, set up before libtorch is loaded, would otherwise abort at the first
C++ exception. PYTHONMALLOC=malloc makes Python objects ASan-checked allocations.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

GUARD_ACCEL_VERSION = "0.1.0"


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


def cxx11_abi(torch_root: Path) -> str:
    """The _GLIBCXX_USE_CXX11_ABI libtorch_python was built with (new-ABI symbols present or not)."""
    return "1" if b"St7__cxx11" in (torch_root / "lib" / "libtorch_python.so").read_bytes() else "0"


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        torch_root = os.environ.get("DYNAPATCH_TORCH_ROOT")
        if not torch_root:
            sys.exit("setup.py: set DYNAPATCH_TORCH_ROOT to the unpacked base wheel's torch/ "
                     "(scripts/dynapatch.py build does this)")
        for tool in ("cmake", "ninja"):
            if not shutil.which(tool):
                sys.exit(f"setup.py: {tool} not found on PATH (pip install -r requirements-build.txt)")
        out_dir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_dir = Path(self.build_temp).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        source_dir = Path(__file__).parent.resolve()
        # The native sources: csrc/, or another directory holding the same files (export-prs
        # --verify builds them from a pytorch tree's torch/csrc/dynamo).
        native_dir = Path(os.environ.get("DYNAPATCH_GUARD_ACCEL_SOURCES") or source_dir / "csrc").resolve()
        subprocess.check_call([
            "cmake", "-S", str(source_dir), "-B", str(build_dir), "-G", "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DTORCH_ROOT={torch_root}",
            f"-DTORCH_CXX11_ABI={cxx11_abi(Path(torch_root))}",
            f"-DGUARD_ACCEL_VERSION={GUARD_ACCEL_VERSION}",
            f"-DGUARD_ACCEL_SOURCES={native_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DGUARD_ACCEL_PYTHON_VERSION={sys.version_info[0]}.{sys.version_info[1]}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DGUARD_ACCEL_ASAN={'ON' if os.environ.get('DYNAPATCH_GUARD_ACCEL_ASAN') == '1' else 'OFF'}",
        ])
        subprocess.check_call(["cmake", "--build", str(build_dir)])


setup(
    name="dynapatch-guard-accel",
    version=GUARD_ACCEL_VERSION,
    ext_modules=[CMakeExtension("torch._dynamo._guard_accel")],
    cmdclass={"build_ext": CMakeBuild},
)
