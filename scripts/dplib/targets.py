"""Other torch releases the series targets, and per-base patch overrides.

patches/BASE pins the release the wheel is built from. The same series may also be
applied to another release (rebase-check, apply --target). Where a patch's context
differs there, `patches/<version>/<patch name>` holds the same patch refreshed
against that release: it replaces the series' copy when targeting <version> and is
never used for the pinned base, so overrides cannot change the built wheel.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .base import BaseSpec, load_base, pristine_sources, wheel_version
from .common import DynapatchError, log, PINNED_TORCH_PIP_ENV, Project, run, sha256_file
from .series import apply_to_target, check_header, OVERRIDE_DIR_RE, parse_patch, Patch, SERIES_INVALID


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
            try:
                run(["python3", "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                     "-d", tmp, f"torch=={version}"], env=PINNED_TORCH_PIP_ENV)
            except DynapatchError as e:
                raise DynapatchError(f"{e}\npip could not download torch=={version}: "
                                     f"download the wheel and pass --wheel F") from e
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


# apply --target keeps what it changed next to the target, so unapply can restore it exactly:
# <root>/.dynapatch-apply/record.json and orig/<path> (each file as it was), beside torch/ so the
# torch tree itself holds only what the series puts there.
RECORD_DIR = ".dynapatch-apply"


def record_dir(root: Path) -> Path:
    return root / RECORD_DIR


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _reverse_applies(patches: list[Patch], root: Path) -> bool:
    """Whether `root` holds the series already: every patch un-applies, last first, and the
    overlay files are there (checked on copies; `root` is not touched)."""
    with tempfile.TemporaryDirectory(prefix="dynapatch-reverse-") as tmp:
        tree = Path(tmp) / "tree"
        for rel in sorted({f for p in patches for f in p.files}):
            if not (root / rel).is_file():
                return False
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / rel, tree / rel)
        for patch in reversed(patches):
            proc = subprocess.run(["git", "apply", "-R", "--whitespace=nowarn", str(patch.path)], cwd=tree,
                                  env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)},
                                  capture_output=True)
            if proc.returncode != 0:
                return False
    return all((root / rel).is_file() for p in patches for rel in p.overlay_files)


def apply_state(project: Project, patches: list[Patch], root: Path) -> str | None:
    """None if the series is not applied to `root`; otherwise how it is (for the message)."""
    record = record_dir(root) / "record.json"
    if record.is_file():
        data = json.loads(record.read_text())
        return f"recorded in {record} ({len(data['files'])} files, series sha256 {data['series_sha256'][:16]})"
    if _reverse_applies(patches, root):
        return "its files already hold every patch and overlay file (applied without a record)"
    return None


def _dist_info_record(root: Path) -> str | None:
    """torch-*.dist-info/RECORD of a site-packages root, relative to it."""
    found = sorted(root.glob("torch-*.dist-info/RECORD"))
    return str(found[0].relative_to(root)) if len(found) == 1 else None


def _record_line(rel: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def apply_recorded(project: Project, patches: list[Patch], root: Path, series_sha256: str) -> list[str]:
    """apply_to_target, keeping each file's previous bytes next to the target (RECORD_DIR) first.

    In a site-packages dir the files apply adds (overlay, the record) are added to torch's
    dist-info RECORD with the changed files' new hashes, so `pip uninstall torch` removes them.
    """
    touched = sorted({f for p in patches for f in p.files} | {f for p in patches for f in p.overlay_files})
    before = {rel: (root / rel).read_bytes() if (root / rel).is_file() else None for rel in touched}
    dist_record = _dist_info_record(root)
    if dist_record:
        before[dist_record] = (root / dist_record).read_bytes()
    final = record_dir(root)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    for rel, data in before.items():
        if data is not None:
            (partial / "orig" / rel).parent.mkdir(parents=True, exist_ok=True)
            (partial / "orig" / rel).write_bytes(data)
    try:
        changed = apply_to_target(project, patches, root)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    files = [{"path": rel, "before": _sha(before[rel]), "after": _sha((root / rel).read_bytes())}
             for rel in touched]
    record = {"series_sha256": series_sha256, "patches": [p.name for p in patches], "files": files,
              "dist_info_record": dist_record}
    (partial / "record.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(partial, final)
    if dist_record:
        lines = (root / dist_record).read_text().splitlines()
        ours = set(touched) | {str(f.relative_to(root)) for f in final.rglob("*") if f.is_file()}
        lines = [line for line in lines if line.split(",", 1)[0] not in ours]
        lines += [_record_line(rel, (root / rel).read_bytes()) for rel in sorted(ours)]
        (root / dist_record).write_text("\n".join(lines) + "\n")
        record["files"].append({"path": dist_record, "before": _sha(before[dist_record]),
                                "after": _sha((root / dist_record).read_bytes())})
        (final / "record.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return changed


def unapply_recorded(root: Path, *, force: bool = False) -> int:
    """Restore what apply_recorded changed; refuse (unless force) if a file changed since."""
    final = record_dir(root)
    if not (final / "record.json").is_file():
        raise DynapatchError(f"{root} has no record of an apply ({final}/record.json): nothing to undo")
    record = json.loads((final / "record.json").read_text())
    if not force:
        edited = [f["path"] for f in record["files"]
                  if _sha((root / f["path"]).read_bytes() if (root / f["path"]).is_file() else None) != f["after"]]
        if edited:
            raise DynapatchError(f"changed since apply: {', '.join(edited)}; --force restores them anyway")
    for f in record["files"]:
        target = root / f["path"]
        if f["before"] is None:
            target.unlink(missing_ok=True)
            parent = target.parent
            while parent != root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
        else:
            shutil.copyfile(final / "orig" / f["path"], target)
    shutil.rmtree(final)
    return len(record["files"])
