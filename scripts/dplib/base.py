"""The pinned base wheel: what patches/BASE says, fetching it, and its pristine sources."""

from __future__ import annotations

import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .common import DynapatchError, Project, log, run, sha256_file

# Text files of the torch package that patches may touch and devtree tracks.
SOURCE_SUFFIXES = (".py", ".pyi", ".json")


@dataclass(frozen=True)
class BaseSpec:
    version: str  # e.g. 2.13.0+cpu
    wheel: str  # the wheel's file name
    sha256: str
    local_label: str  # e.g. dynapatch.1

    @property
    def public_version(self) -> str:
        return self.version.split("+", 1)[0]

    @property
    def patched_version(self) -> str:
        sep = "." if "+" in self.version else "+"
        return f"{self.version}{sep}{self.local_label}"


def load_base(project: Project) -> BaseSpec:
    """Parse patches/BASE (`key: value` lines, `#` comments)."""
    if not project.base_file.is_file():
        raise DynapatchError(f"{project.base_file} is missing: it pins the base wheel")
    fields = {}
    for line in project.base_file.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    missing = {"version", "wheel", "sha256", "local-label"} - fields.keys()
    if missing:
        raise DynapatchError(f"{project.base_file} lacks {', '.join(sorted(missing))}")
    return BaseSpec(fields["version"], fields["wheel"], fields["sha256"], fields["local-label"])


def wheel_version(path: Path) -> str:
    """The version in a wheel's file name (PEP 427: name-version-...)."""
    parts = path.name.split("-")
    if len(parts) < 5 or not path.name.endswith(".whl"):
        raise DynapatchError(f"{path} is not a wheel file name")
    return parts[1]


def verify_base_wheel(spec: BaseSpec, path: Path) -> None:
    """Refuse a base wheel that is not the pinned version and file."""
    version = wheel_version(path)
    if version != spec.version:
        raise DynapatchError(
            f"base wheel {path.name} is torch {version}, but patches/BASE pins torch "
            f"{spec.version}: the series is only valid against that release")
    digest = sha256_file(path)
    if digest != spec.sha256:
        raise DynapatchError(
            f"base wheel {path} has sha256 {digest}, but patches/BASE pins {spec.sha256} "
            f"for {spec.wheel}: refusing a rebuilt or different file")


def fetch_base_wheel(project: Project, spec: BaseSpec, explicit: Path | None = None) -> Path:
    """Return the verified base wheel: `explicit`, the cached copy, or `pip download`."""
    if explicit is not None:
        if not explicit.is_file():
            raise DynapatchError(f"base wheel {explicit} does not exist")
        verify_base_wheel(spec, explicit)
        return explicit
    cached = project.cache / "base" / spec.wheel
    if cached.is_file() and sha256_file(cached) == spec.sha256:
        log(f"base wheel: {cached} (cached, sha256 ok)")
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
        run(["python3", "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "-d", tmp, f"torch=={spec.public_version}"])
        wheels = list(Path(tmp).glob("torch-*.whl"))
        if len(wheels) != 1:
            raise DynapatchError(f"pip download torch=={spec.public_version} gave {wheels}")
        verify_base_wheel(spec, wheels[0])
        wheels[0].replace(cached)
    log(f"base wheel: {cached} (sha256 ok)")
    return cached


def pristine_sources(project: Project, spec: BaseSpec, wheel: Path) -> Path:
    """The base wheel's torch/ text sources, extracted once into the cache (read-only use)."""
    dest = project.cache / f"pristine-{spec.sha256[:16]}"
    if (dest / ".complete").is_file():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=project.cache, prefix="pristine-"))
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.filename.startswith("torch/") and info.filename.endswith(SOURCE_SUFFIXES):
                zf.extract(info, tmp)
    (tmp / ".complete").write_text(spec.sha256 + "\n")
    tmp.rename(dest)
    log(f"pristine sources: {dest}")
    return dest


_VERSION_RE = re.compile(r"^__version__ = ['\"]([^'\"]+)['\"]", re.M)


def installed_torch_version(tree: Path) -> str | None:
    """torch.__version__ of a tree holding torch/version.py, or a checkout's version.txt."""
    version_py = tree / "torch" / "version.py"
    if version_py.is_file():
        match = _VERSION_RE.search(version_py.read_text())
        if match:
            return match.group(1)
    version_txt = tree / "version.txt"
    if version_txt.is_file():
        return version_txt.read_text().strip()
    return None
