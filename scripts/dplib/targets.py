"""Other torch releases the series targets, and per-base patch overrides.

patches/BASE pins the release the wheel is built from. The same series may also be
applied to another release (rebase-check, apply --target). Where a patch's context
differs there, `patches/<version>/<patch name>` holds the same patch refreshed
against that release: it replaces the series' copy when targeting <version> and is
never used for the pinned base, so overrides cannot change the built wheel.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .base import BaseSpec, load_base, pristine_sources, wheel_version
from .common import DynapatchError, Project, log, run, sha256_file
from .series import OVERRIDE_DIR_RE, SERIES_INVALID, Patch, check_header, parse_patch




def public_version(version: str) -> str:
    return version.split("+", 1)[0]


def override_versions(project: Project) -> list[str]:
    """Releases with an override directory patches/<version>/."""
    if not project.patches.is_dir():
        return []
    return sorted(p.name for p in project.patches.iterdir() if p.is_dir() and OVERRIDE_DIR_RE.match(p.name))


def supported_versions(project: Project) -> list[str]:
    """The pinned base first, then every release that has an override directory."""
    return [load_base(project).public_version, *override_versions(project)]


def check_overrides(project: Project, patches: list[Patch]) -> int:
    """Every override replaces a listed patch, describes it identically and changes the same files.

    Exit code 1 (series invalid) on the first problem. Returns the number of overrides.
    """
    base = load_base(project).public_version
    by_name = {p.name: p for p in patches}
    count = 0
    for version in override_versions(project):
        if version == base:
            raise DynapatchError(f"patches/{version}/ overrides patches for the pinned base {base}: "
                                 f"change the patches themselves instead", SERIES_INVALID)
        for path in sorted((project.patches / version).rglob("*")):
            if path.is_dir():
                continue
            name = str(path.relative_to(project.patches / version))
            where = f"override patches/{version}/{name}"
            if name not in by_name:
                raise DynapatchError(f"{where} replaces no patch listed in patches/series", SERIES_INVALID)
            primary = by_name[name]
            override = parse_patch(f"{version}/{name}", path)
            check_header(override)
            if (override.subject, override.description, override.trailers) != (
                    primary.subject, primary.description, primary.trailers):
                raise DynapatchError(f"{where} has a different subject, description or trailers than "
                                     f"patches/{name}: an override may only differ in its diff", SERIES_INVALID)
            if override.files != primary.files:
                raise DynapatchError(f"{where} changes {', '.join(override.files)}, but patches/{name} changes "
                                     f"{', '.join(primary.files)}: an override may only differ in context",
                                     SERIES_INVALID)
            if override.diff == primary.diff:
                raise DynapatchError(f"{where} is identical to patches/{name}: remove it", SERIES_INVALID)
            count += 1
    return count


def with_overrides(project: Project, patches: list[Patch], version: str) -> tuple[list[Patch], list[str]]:
    """The series as it applies to `version`: overrides replace patches. Returns (patches, overridden names)."""
    directory = project.patches / public_version(version)
    if public_version(version) == load_base(project).public_version or not directory.is_dir():
        return patches, []
    result, used = [], []
    for patch in patches:
        path = directory / patch.name
        if path.is_file():
            override = parse_patch(f"{public_version(version)}/{patch.name}", path)
            override.name = patch.name  # reports name the series entry; .path says which copy applies
            result.append(override)
            used.append(patch.name)
        else:
            result.append(patch)
    return result, used


def fetch_release_wheel(project: Project, version: str, explicit: Path | None = None) -> Path:
    """A torch wheel of release `version`: `explicit`, the cached copy, or `pip download`.

    Unlike the pinned base there is no sha256 to check against; the digest is printed.
    """
    if explicit is not None:
        if not explicit.is_file():
            raise DynapatchError(f"wheel {explicit} does not exist")
        found = public_version(wheel_version(explicit))
        if found != version:
            raise DynapatchError(f"wheel {explicit.name} is torch {found}, not {version}")
        return explicit
    cache = project.cache / f"release-{version}"
    cached = sorted(cache.glob("torch-*.whl"))
    if not cached:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            run(["python3", "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                 "-d", tmp, f"torch=={version}"])
            wheels = list(Path(tmp).glob("torch-*.whl"))
            if len(wheels) != 1:
                raise DynapatchError(f"pip download torch=={version} gave {wheels}")
            wheels[0].replace(cache / wheels[0].name)
        cached = sorted(cache.glob("torch-*.whl"))
    if len(cached) != 1:
        raise DynapatchError(f"{cache} holds {len(cached)} wheels; expected one torch {version} wheel")
    return cached[0]


def release_sources(project: Project, wheel: Path, *, cached: bool = True) -> Path:
    """torch/ text sources of a torch wheel: extracted once into the cache (keyed by sha256),
    or, for a wheel given by hand (cached=False), afresh into build/ so the shared cache
    does not collect one-off extracts."""
    digest = sha256_file(wheel)
    log(f"torch {wheel_version(wheel)}: {wheel.name} sha256 {digest}")
    spec = BaseSpec(wheel_version(wheel), wheel.name, digest, "")
    if cached:
        return pristine_sources(project, spec, wheel)
    scratch = Project(project.root, project.build / "release-sources")
    shutil.rmtree(scratch.cache, ignore_errors=True)
    scratch.cache.mkdir(parents=True)
    return pristine_sources(scratch, spec, wheel)
