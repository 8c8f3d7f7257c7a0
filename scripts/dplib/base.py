"""The pinned base wheels (one per variant: cpu, cuda): what patches/BASE says, fetching one, its pristine sources."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from .common import DynapatchError, log, PINNED_TORCH_PIP_ENV, pip_quiet, Project, run, sha256_file

# Text files of the torch package that patches may touch and devtree tracks.
SOURCE_SUFFIXES = (".py", ".pyi", ".json")


@dataclass(frozen=True)
class BaseSpec:
    version: str  # the wheel's version, e.g. 2.13.0+cpu or 2.13.0
    wheel: str  # the wheel's file name
    sha256: str
    local_label: str  # e.g. dynapatch
    variant: str = ""  # cpu, cuda
    torch_version: str = ""  # torch.__version__ in its version.py (2.13.0+cu130); default: version
    label: str = ""  # the variant's part of the custom wheel's local version (cpu, cu130)
    index: str = ""  # a package index serving this file
    series_tag: str = ""  # <patch count>.g<8 hex of the series digest>, "" if the series is invalid
    pinned: bool = True  # False: a CPU build given by --base-wheel, checked by version and sources (no block)

    @property
    def public_version(self) -> str:
        return self.version.split("+", 1)[0]

    @property
    def python_tag(self) -> str:
        """The wheel's Python tag (cp311, cp312, ...), from its file name."""
        return wheel_python_tag(self.wheel)

    @property
    def base_torch_version(self) -> str:
        return self.torch_version or self.version

    @property
    def patched_version(self) -> str:
        """e.g. 2.13.0+cpu.dynapatch.14.g1a2b3c4d: the variant, then a number that changes with the series."""
        if not self.series_tag:
            raise DynapatchError("the series is invalid (dynapatch.py check): no version for the custom wheel")
        local = ".".join(p for p in (self.label, self.local_label, self.series_tag) if p)
        return f"{self.public_version}+{local}"


def _parse_base(project: Project) -> tuple[dict[str, str], list[dict[str, str]]]:
    """patches/BASE: `key: value` lines, `#` comments; global keys, then one block per `variant:`."""
    if not project.base_file.is_file():
        raise DynapatchError(f"{project.base_file} is missing: it pins the base wheels")
    common: dict[str, str] = {}
    blocks: list[dict[str, str]] = []
    for line in project.base_file.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "variant":
            blocks.append({})
        (blocks[-1] if blocks else common)[key] = value
    if not blocks:  # the one-wheel format of earlier versions
        blocks = [dict(common, variant=common.get("variant", "default"))]
    return common, blocks


def base_variants(project: Project) -> list[BaseSpec]:
    """Every supported base wheel, in patches/BASE order (the first is the default)."""
    common, blocks = _parse_base(project)
    tag = _series_tag(project)
    specs = []
    for block in blocks:
        fields = {**{k: v for k, v in common.items() if k == "local-label"}, **block}
        missing = {"version", "wheel", "sha256", "local-label"} - fields.keys()
        if missing:
            raise DynapatchError(f"{project.base_file}: variant {fields.get('variant')} lacks "
                                 f"{', '.join(sorted(missing))}")
        version = fields["version"]
        label = fields.get("label", version.partition("+")[2])
        specs.append(BaseSpec(version, fields["wheel"], fields["sha256"], fields["local-label"],
                              fields["variant"], fields.get("torch-version", version), label,
                              fields.get("index", ""), tag))
    if len({s.public_version for s in specs}) != 1:
        raise DynapatchError(f"{project.base_file} pins several torch releases; all variants must be one release")
    return specs


def load_base(project: Project, variant: str | None = None, python_tag: str | None = None) -> BaseSpec:
    """The pinned base wheel of `variant` for `python_tag` (defaults: the first block of
    patches/BASE; with only `python_tag`, the first block for that Python)."""
    specs = base_variants(project)
    if python_tag is not None:
        tagged = [s for s in specs if s.python_tag == python_tag]
        if not tagged:
            pinned = sorted({s.python_tag for s in specs})
            raise DynapatchError(f"patches/BASE pins no {python_tag} wheel (it pins {', '.join(pinned)})")
        specs = tagged
    if variant is None:
        return specs[0]
    for spec in specs:
        if spec.variant == variant:
            return spec
    raise DynapatchError(f"patches/BASE has no variant {variant!r}" + (f" for {python_tag}" if python_tag else "")
                         + f" (it pins {', '.join(f'{s.variant} {s.python_tag}' for s in specs)})"
                         + (f"; for a CPU build pass its wheel: --base-wheel torch-{specs[0].public_version}+"
                            f"{UNPINNED_LABEL}-...whl" if variant == UNPINNED_LABEL else ""))


def default_python_tag(project: Project) -> str:
    """The Python of the first block of patches/BASE: the one .venv and build/wheel.stamp are for."""
    return base_variants(project)[0].python_tag


def _series_tag(project: Project) -> str:
    from .series import load_series, series_digest  # series imports nothing of base: no cycle

    try:
        patches = load_series(project)
    except DynapatchError:
        return ""
    return f"{len(patches)}.g{series_digest(project, patches)[:8]}"


def wheel_version(path: Path) -> str:
    """The version in a wheel's file name (PEP 427: name-version-...)."""
    parts = path.name.split("-")
    if len(parts) < 5 or not path.name.endswith(".whl"):
        raise DynapatchError(f"{path} is not a wheel file name")
    return parts[1]


def wheel_python_tag(name: str) -> str:
    """The Python tag of a wheel file name (PEP 427: name-version-python-abi-platform.whl)."""
    parts = name.split("-")
    return parts[2] if len(parts) >= 5 else ""


# The one base wheel build accepts without a patches/BASE block: a CPU build of the pinned release
# (its local label), given by --base-wheel, checked by version and sources instead of sha256.
UNPINNED_LABEL = "cpu"


def unpinned_version(project: Project) -> str:
    """The version of a CPU build of the series' torch release, e.g. 2.15.0+cpu."""
    return f"{load_base(project).public_version}+{UNPINNED_LABEL}"


def variant_of_wheel(project: Project, path: Path) -> BaseSpec:
    """The pinned variant `path` is, by file name, version and sha256; or, for a CPU build of the
    pinned release that no block pins, a spec for it (pinned=False: its sources are checked by
    check_unpinned_sources). DynapatchError for anything else."""
    if not path.is_file():
        raise DynapatchError(f"base wheel {path} does not exist")
    name = path.name.split("-")[0] if path.name.endswith(".whl") else ""
    if name != "torch":
        raise DynapatchError(f"base wheel {path.name} is not a torch wheel (patches/BASE pins torch "
                             f"{load_base(project).public_version} wheels)")
    version = wheel_version(path)
    specs = base_variants(project)
    candidates = [s for s in specs if s.version == version]
    cpu = unpinned_version(project)
    if not candidates and version != cpu:
        raise DynapatchError(
            f"base wheel {path.name} is torch {version}, but patches/BASE pins torch "
            f"{' or '.join(dict.fromkeys(s.version for s in specs))} (or a CPU build, {cpu}, through "
            f"--base-wheel): the series is only valid against that release")
    digest = sha256_file(path)
    for spec in candidates:
        if digest == spec.sha256:
            return spec
    if candidates:
        raise DynapatchError(
            f"base wheel {path} has sha256 {digest}, but patches/BASE pins "
            + " or ".join(f"{s.sha256} ({s.variant}: {s.wheel})" for s in candidates)
            + ": refusing a rebuilt or different file")
    return _unpinned_spec(project, path, version, digest)


def _unpinned_spec(project: Project, path: Path, version: str, digest: str) -> BaseSpec:
    """A CPU build of the pinned release: its METADATA and torch/version.py must say `version` too."""
    info = f"torch-{version}.dist-info/METADATA"
    try:
        with zipfile.ZipFile(path) as zf:
            metadata = zf.read(info).decode(errors="replace")
            version_py = zf.read("torch/version.py").decode(errors="replace")
    except zipfile.BadZipFile:
        raise DynapatchError(f"base wheel {path} is not a zip file (a truncated download?)") from None
    except KeyError as e:
        raise DynapatchError(f"base wheel {path.name} has no {e.args[0].split()[-1]}: not a torch {version} "
                             f"wheel") from None
    meta = re.search(r"^Version: (\S+)", metadata, re.M)
    if meta is None or meta.group(1) != version:
        raise DynapatchError(f"base wheel {path.name}: its {info} says Version "
                             f"{meta.group(1) if meta else '(none)'}, its file name {version}: refusing it")
    torch_version = _VERSION_RE.search(version_py)
    if torch_version is None or torch_version.group(1) != version:
        raise DynapatchError(f"base wheel {path.name}: its torch/version.py says __version__ "
                             f"{torch_version.group(1) if torch_version else '(none)'}, not {version}: refusing it")
    first = load_base(project)
    return BaseSpec(version, path.name, digest, first.local_label, UNPINNED_LABEL, version, UNPINNED_LABEL,
                    "", first.series_tag, pinned=False)


def check_unpinned_sources(project: Project, spec: BaseSpec, wheel: Path, pinned: BaseSpec,
                           pinned_wheel: Path) -> Path:
    """An unpinned base's Python sources (torch/ *.py, *.pyi, *.json) must be the pinned wheel's,
    torch/version.py aside: then the series applies to it exactly as `check` verified. Returns its
    pristine sources."""
    ours = pristine_sources(project, spec, wheel)
    theirs = pristine_sources(project, pinned, pinned_wheel)

    def files(root: Path) -> dict[str, Path]:
        return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file() and p.name != ".complete"}

    a, b = files(ours), files(theirs)
    a.pop("torch/version.py", None)
    b.pop("torch/version.py", None)
    only_ours, only_theirs = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    differ = sorted(rel for rel in a.keys() & b.keys() if a[rel].read_bytes() != b[rel].read_bytes())
    problems = ([f"{len(differ)} differ ({', '.join(differ[:3])}{', ...' if len(differ) > 3 else ''})"] if differ
                else []) + ([f"{len(only_ours)} only in it ({', '.join(only_ours[:3])}"
                             f"{', ...' if len(only_ours) > 3 else ''})"] if only_ours else []) \
        + ([f"{len(only_theirs)} missing ({', '.join(only_theirs[:3])}{', ...' if len(only_theirs) > 3 else ''})"]
           if only_theirs else [])
    if problems:
        raise DynapatchError(
            f"base wheel {spec.wheel} is not pinned in patches/BASE and its Python sources are not those of "
            f"the pinned {pinned.wheel}: {'; '.join(problems)}. The series is only checked against the pinned "
            f"sources: use a pinned wheel, or pin this one in patches/BASE once `check` passes with it")
    log(f"unpinned base: its {len(a)} Python sources are those of the pinned {pinned.wheel} "
        f"(torch/version.py aside)")
    return ours


def verify_base_wheel(spec: BaseSpec, path: Path) -> None:
    """Refuse a base wheel that is not the pinned version and file of `spec`."""
    version = wheel_version(path)
    if version != spec.version:
        raise DynapatchError(
            f"base wheel {path.name} is torch {version}, but patches/BASE pins torch "
            f"{spec.version} ({spec.variant}): the series is only valid against that release")
    digest = sha256_file(path)
    if digest != spec.sha256:
        raise DynapatchError(
            f"base wheel {path} has sha256 {digest}, but patches/BASE pins {spec.sha256} "
            f"for {spec.wheel}: refusing a rebuilt or different file")


def _pip_env_args(isolated_index: str | None) -> list[str]:
    """pip options: the user's configuration, or (for a variant pip does not pick) only `index`."""
    if isolated_index is None:
        return []
    args = ["--isolated", "--disable-pip-version-check", "--index-url", isolated_index]
    cert = os.environ.get("PIP_CERT")
    return args + (["--cert", cert] if cert else [])


def default_variant(project: Project, python: str = "python3", python_tag: str | None = None) -> BaseSpec:
    """The variant `pip download torch==<version> --no-deps` gives on this machine for the
    interpreter `python` (asked without downloading: its pip's resolver report)."""
    specs = [s for s in base_variants(project) if python_tag is None or s.python_tag == python_tag]
    if not specs:
        load_base(project, python_tag=python_tag)  # raises: names the pinned tags
    with tempfile.TemporaryDirectory(prefix="dynapatch-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        run([python, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps", "--ignore-installed",
             "--only-binary=:all:", "--report", report, f"torch=={specs[0].public_version}"], capture=True,
            env=PINNED_TORCH_PIP_ENV)
        items = json.loads(report.read_text()).get("install", [])
    if len(items) != 1:
        raise DynapatchError(f"pip resolves torch=={specs[0].public_version} to {len(items)} files")
    info = items[0]["download_info"]
    filename = unquote(info["url"].rsplit("/", 1)[-1].split("#", 1)[0])
    digest = info.get("archive_info", {}).get("hashes", {}).get("sha256")
    for spec in specs:
        if spec.wheel == filename and digest in (None, spec.sha256):
            return spec
    raise DynapatchError(
        f"pip download torch=={specs[0].public_version} gives {filename} (sha256 {digest}), which patches/BASE "
        f"does not pin; choose one with --variant {'|'.join(s.variant for s in specs)} or --base-wheel F")


def fetch_base_wheel(project: Project, spec: BaseSpec, explicit: Path | None = None, python: str = "python3") -> Path:
    """Return the verified base wheel: `explicit`, the cached copy, or `pip download` by the
    interpreter `python` (the wheel is for it: the user's pip configuration first; if it gives
    another variant, the variant's own index)."""
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
    attempts = [None] + ([spec.index] if spec.index else [])
    for index in attempts:
        with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
            # An exact pin where the version has a local label (2.13.0+cpu); the public one otherwise.
            # pip's progress bar is the only progress of this (0.5 GB) step: kept on a terminal.
            quiet = [] if sys.stdout.isatty() else pip_quiet()
            run([python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *quiet,
                 *_pip_env_args(index), "-d", tmp, f"torch=={spec.version}"], quiet=bool(quiet),
                env=PINNED_TORCH_PIP_ENV)
            wheels = list(Path(tmp).glob("torch-*.whl"))
            if len(wheels) == 1 and wheels[0].name == spec.wheel:
                verify_base_wheel(spec, wheels[0])
                wheels[0].replace(cached)
                log(f"base wheel: {cached} (sha256 ok)")
                return cached
            log(f"pip download torch=={spec.version} gave {[w.name for w in wheels]}, not {spec.wheel}"
                + (f"; trying {spec.index}" if index is None and spec.index else ""))
    raise DynapatchError(f"could not download {spec.wheel} ({spec.variant} variant); download it and pass "
                         f"--base-wheel F")


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
