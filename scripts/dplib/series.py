"""The patch series: parsing `git format-patch`-style patches, validating, applying.

Every check function raises DynapatchError with exit code SERIES_INVALID (1) for a
series problem or DOES_NOT_APPLY (2) for a patch that does not apply exactly.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .common import DynapatchError, log, Project

SERIES_INVALID = 1
DOES_NOT_APPLY = 2

UPSTREAM_STATUSES = ("Pending", "Submitted", "Accepted", "Backport", "Inappropriate", "Denied")
TRAILER_RE = re.compile(r"^([A-Z][A-Za-z-]+): (.*)$")
DIFF_FILE_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
OVERRIDE_DIR_RE = re.compile(r"^\d+\.\d+\.\d+$")
HUNK_RE = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*$", re.M)
# A patch's stable identity (like gbp's `Gbp-Pq: Name`): kept when the patch is renumbered or
# its subject changes, so overrides and upstream-expected-changes cannot silently retarget.
PATCH_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")  # not a number: numbers change
PATCH_NAME_MAX = 48
# The C++ extension's sources: each is owned by one patch (its `Native-File:` trailer), whose PR
# carries it; the out-of-tree build files (setup.py, CMakeLists.txt) only build the wheel.
NATIVE_DIR = "csrc"
NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hpp")


@dataclass
class Patch:
    name: str  # path relative to patches/
    path: Path
    author: str = ""
    date: str = ""
    subject: str = ""
    description: str = ""
    trailers: list[tuple[str, str]] = field(default_factory=list)
    diff: str = ""

    def trailer_values(self, key: str) -> list[str]:
        return [v for k, v in self.trailers if k == key]

    @property
    def patch_name(self) -> str:
        """The `Patch-Name:` trailer ("" when missing; check_header refuses that)."""
        values = self.trailer_values("Patch-Name")
        return values[0] if values else ""

    @property
    def overlay_files(self) -> list[str]:
        return [f.strip() for v in self.trailer_values("Overlay-File") for f in v.split(",") if f.strip()]

    @property
    def native_files(self) -> list[str]:
        """csrc/ sources this patch owns (`Native-File:` trailers), relative to the project root."""
        return [f.strip() for v in self.trailer_values("Native-File") for f in v.split(",") if f.strip()]

    @property
    def files(self) -> list[str]:
        """Files of the base tree that the diff modifies."""
        return sorted({m.group(1) for m in DIFF_FILE_RE.finditer(self.diff)})


def parse_patch(name: str, path: Path) -> Patch:
    """Read one `git format-patch`-style file into its header fields and diff."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DynapatchError(f"patch {name} is unreadable: {e}", SERIES_INVALID) from e
    patch = Patch(name, path)
    head, sep, rest = text.partition("\n\n")
    if not sep:
        raise DynapatchError(f"patch {name} has no mail header (From:/Date:/Subject:)", SERIES_INVALID)
    headers: dict[str, str] = {}
    last = None
    for line in head.splitlines():
        if line.startswith((" ", "\t")) and last:
            headers[last] += " " + line.strip()
        elif ": " in line:
            last, _, value = line.partition(": ")
            headers[last] = value
    patch.author = headers.get("From", "")
    patch.date = headers.get("Date", "")
    patch.subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", headers.get("Subject", "")).strip()
    body, sep, diff_part = rest.partition("\n---\n")
    if not sep:
        raise DynapatchError(f"patch {name} has no '---' line between its description and diff", SERIES_INVALID)
    start = diff_part.find("diff --git ")
    patch.diff = diff_part[start:] if start >= 0 else ""
    paragraphs = body.strip().split("\n\n")
    last_par = paragraphs[-1].splitlines() if paragraphs else []
    if last_par and all(TRAILER_RE.match(line) for line in last_par):
        patch.trailers = [TRAILER_RE.match(line).groups() for line in last_par]
        paragraphs = paragraphs[:-1]
    patch.description = "\n\n".join(paragraphs).strip()
    return patch


def read_series_names(project: Project) -> list[str]:
    """Patch names listed in patches/series, in order (quilt format, `#` comments)."""
    if not project.series_file.is_file():
        raise DynapatchError(f"{project.series_file} is missing", SERIES_INVALID)
    names = []
    for line in project.series_file.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def check_series_listing(project: Project, names: list[str]) -> None:
    """Every listed patch exists, none is listed twice, and no *.patch file is unlisted."""
    seen = set()
    for name in names:
        if name in seen:
            raise DynapatchError(f"patches/series lists {name} twice", SERIES_INVALID)
        seen.add(name)
        if not (project.patches / name).is_file():
            raise DynapatchError(f"patches/series lists {name}, but patches/{name} does not exist", SERIES_INVALID)
    # patches/<version>/ holds per-base overrides (targets.py), checked separately.
    unused = sorted(str(p.relative_to(project.patches)) for p in project.patches.rglob("*.patch")
                    if str(p.relative_to(project.patches)) not in seen
                    and not OVERRIDE_DIR_RE.match(p.relative_to(project.patches).parts[0]))
    if unused:
        raise DynapatchError(f"patches not listed in patches/series (unused): {', '.join(unused)}", SERIES_INVALID)


def check_header(patch: Patch) -> None:
    """A patch says what it does (subject), why (description) and its upstream status."""
    problems = []
    if not patch.author:
        problems.append("no From: author")
    if not patch.subject:
        problems.append("no Subject:")
    if not patch.description:
        problems.append("no description of what it does and why")
    names = patch.trailer_values("Patch-Name")
    if len(names) != 1:
        problems.append(f"needs one 'Patch-Name: <name>' trailer (has {len(names)})")
    elif not PATCH_NAME_RE.match(names[0]) or len(names[0]) > PATCH_NAME_MAX:
        problems.append(f"Patch-Name {names[0]!r} is not lower-case words joined by '-', starting with "
                        f"a letter (at most {PATCH_NAME_MAX} characters)")
    statuses = patch.trailer_values("Upstream-Status")
    if len(statuses) != 1 or statuses[0].split(" ", 1)[0] not in UPSTREAM_STATUSES:
        problems.append(f"needs one 'Upstream-Status: <{'|'.join(UPSTREAM_STATUSES)}> [detail]' trailer")
    if not patch.diff:
        problems.append("no diff")
    if problems:
        raise DynapatchError(f"patch {patch.name}: " + "; ".join(problems), SERIES_INVALID)


def check_patch_names(patches: list[Patch]) -> None:
    """No two patches share a Patch-Name."""
    seen: dict[str, str] = {}
    for patch in patches:
        if patch.patch_name in seen:
            raise DynapatchError(f"patches {seen[patch.patch_name]} and {patch.name} have the same "
                                 f"Patch-Name {patch.patch_name}", SERIES_INVALID)
        seen[patch.patch_name] = patch.name


def by_patch_name(patches: list[Patch]) -> dict[str, Patch]:
    return {p.patch_name: p for p in patches}


def check_override_names(project: Project, patches: list[Patch]) -> None:
    """Each patches/<version>/ override is the series patch with its file name and its Patch-Name.

    A patch renumbered or renamed by refresh would otherwise orphan its override silently
    (matched by file name, it replaces nothing or the wrong patch): name the file to move.
    """
    by_file = {p.name: p for p in patches}
    named = by_patch_name(patches)
    for directory in sorted(d for d in project.patches.iterdir() if d.is_dir() and OVERRIDE_DIR_RE.match(d.name)):
        for path in sorted(directory.rglob("*.patch")):
            rel = str(path.relative_to(directory))
            override = parse_patch(f"{directory.name}/{rel}", path)
            primary = named.get(override.patch_name)
            where = f"override patches/{directory.name}/{rel}"
            if primary is None:
                raise DynapatchError(f"{where} has Patch-Name {override.patch_name or '(none)'!r}, which no "
                                     f"patch of the series has", SERIES_INVALID)
            if primary.name != rel:
                now = by_file.get(rel)
                raise DynapatchError(
                    f"{where} is patch {override.patch_name}, now patches/{primary.name}"
                    + (f" (patches/{rel} is {now.patch_name})" if now else "")
                    + f": rename it to patches/{directory.name}/{primary.name}", SERIES_INVALID)


def check_duplicate_content(patches: list[Patch]) -> None:
    """No two patches carry the same diff (a patch added twice under two names)."""
    seen: dict[str, str] = {}
    for patch in patches:
        if patch.diff in seen:
            raise DynapatchError(f"patches {seen[patch.diff]} and {patch.name} carry the same diff", SERIES_INVALID)
        seen[patch.diff] = patch.name


def check_overlay(project: Project, patches: list[Patch], pristine: Path | None) -> None:
    """Each overlay file is claimed by exactly one patch, exists, and is new to torch."""
    owner: dict[str, str] = {}
    for patch in patches:
        for rel in patch.overlay_files:
            if rel in owner:
                raise DynapatchError(f"overlay file {rel} is claimed by {owner[rel]} and {patch.name}", SERIES_INVALID)
            owner[rel] = patch.name
            if not (project.overlay / rel).is_file():
                raise DynapatchError(
                    f"patch {patch.name} needs overlay file torch_overlay/{rel}, which is missing", SERIES_INVALID)
            if pristine is not None and (pristine / rel).exists():
                raise DynapatchError(
                    f"overlay file torch_overlay/{rel} would replace a file of the base torch; "
                    f"change it with a patch instead", SERIES_INVALID)
    present = sorted(str(p.relative_to(project.overlay)) for p in project.overlay.rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
    unclaimed = [rel for rel in present if rel not in owner]
    if unclaimed:
        raise DynapatchError(
            f"overlay files no patch claims (add an Overlay-File: trailer to the patch that adds them): "
            f"{', '.join(unclaimed)}",
            SERIES_INVALID)


def check_native(project: Project, patches: list[Patch]) -> None:
    """Each csrc/ source is owned by exactly one patch, and each owned file exists."""
    owner: dict[str, str] = {}
    for patch in patches:
        for rel in patch.native_files:
            if not rel.startswith(NATIVE_DIR + "/") or not rel.endswith(NATIVE_SUFFIXES):
                raise DynapatchError(f"patch {patch.name}: Native-File {rel} is not a C/C++ source under "
                                     f"{NATIVE_DIR}/", SERIES_INVALID)
            if rel in owner:
                raise DynapatchError(f"native file {rel} is claimed by {owner[rel]} and {patch.name}", SERIES_INVALID)
            owner[rel] = patch.name
            if not (project.root / rel).is_file():
                raise DynapatchError(f"patch {patch.name} needs native file {rel}, which is missing", SERIES_INVALID)
    native = project.root / NATIVE_DIR
    present = sorted(str(p.relative_to(project.root)) for p in native.rglob("*")
                     if p.is_file() and p.name.endswith(NATIVE_SUFFIXES)) if native.is_dir() else []
    unowned = [rel for rel in present if rel not in owner]
    if unowned:
        raise DynapatchError(
            f"native sources no patch owns (add a Native-File: trailer to the patch whose code uses them, "
            f"so its PR carries them): {', '.join(unowned)}", SERIES_INVALID)


def load_series(project: Project, pristine: Path | None = None) -> list[Patch]:
    """Read and validate the whole series (everything but application)."""
    names = read_series_names(project)
    check_series_listing(project, names)
    patches = [parse_patch(name, project.patches / name) for name in names]
    for patch in patches:
        check_header(patch)
    check_duplicate_content(patches)  # first: a patch listed twice under two names has one Patch-Name
    check_patch_names(patches)
    check_overlay(project, patches, pristine)
    check_native(project, patches)
    return patches


def _git_apply(tree: Path, patch_path: Path, extra: list[str]) -> subprocess.CompletedProcess:
    # Stop git from discovering an enclosing repository: it would apply relative to
    # that repository's root instead of `tree`.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    return subprocess.run(["git", "apply", "--verbose", "--whitespace=nowarn", *extra, str(patch_path)],
                          cwd=tree, env=env, text=True, capture_output=True)


def _explain_failure(patch: Patch, output: str) -> str:
    match = re.search(r"error: patch failed: (\S+):(\d+)", output)
    if match:
        file, line = match.group(1), int(match.group(2))
        hunk = _hunk_at(patch, file, line)
        return (f"patch {patch.name} does not apply: file {file}, hunk {hunk!r} "
                f"(expected context at line {line} not found; zero fuzz is allowed)")
    match = re.search(r"error: (\S+): No such file or directory", output)
    if match:
        return f"patch {patch.name} does not apply: file {match.group(1)} does not exist in the tree"
    match = re.search(r"corrupt patch at line (\d+)", output)
    if match:
        return f"patch {patch.name} is corrupt at line {match.group(1)} of its diff"
    return f"patch {patch.name} does not apply:\n{output.strip()}"


def _hunk_at(patch: Patch, file: str, line: int) -> str:
    section = patch.diff.split(f"diff --git a/{file} b/{file}\n", 1)[-1].split("\ndiff --git ", 1)[0]
    for match in HUNK_RE.finditer(section):
        if int(match.group(1)) == line:
            return match.group(0)
    return f"@@ -{line} @@"


def apply_patch(tree: Path, patch: Patch, *, allow_offsets: bool = False) -> list[str]:
    """Apply one patch to `tree` with zero fuzz; return hunks that moved (offsets)."""
    proc = _git_apply(tree, patch.path, [])
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise DynapatchError(_explain_failure(patch, output), DOES_NOT_APPLY)
    offsets = re.findall(r"Hunk #\d+ succeeded at \d+ \(offset -?\d+ lines?\)\.", output)
    if offsets and not allow_offsets:
        raise DynapatchError(
            f"patch {patch.name} applies only with offsets ({'; '.join(offsets)}); "
            f"refresh it against the base (dynapatch.py devtree, then refresh)", DOES_NOT_APPLY)
    return offsets


def apply_series_to(tree: Path, patches: list[Patch], *, source: Path, allow_offsets: bool = False) -> None:
    """Copy the files the series touches from `source` into `tree`, then apply every patch."""
    for rel in sorted({f for p in patches for f in p.files}):
        src = source / rel
        if not src.is_file():
            owners = [p.name for p in patches if rel in p.files]
            raise DynapatchError(f"patch {owners[0]} does not apply: file {rel} does not exist in the base",
                                 DOES_NOT_APPLY)
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, tree / rel)
    for patch in patches:
        for offset in apply_patch(tree, patch, allow_offsets=allow_offsets):
            log(f"{patch.name}: {offset}")


def copy_overlay(project: Project, patches: list[Patch], tree: Path) -> list[str]:
    """Copy every patch's overlay files into `tree`; return their relative paths."""
    copied = []
    for patch in patches:
        for rel in patch.overlay_files:
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(project.overlay / rel, tree / rel)
            copied.append(rel)
    return copied


def patched_sources(project: Project, patches: list[Patch], pristine: Path, dest: Path) -> list[str]:
    """Build `dest`: the files changed by the series and overlay, patched. Returns their paths."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    try:
        apply_series_to(dest, patches, source=pristine)
        overlay = copy_overlay(project, patches, dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return sorted({f for p in patches for f in p.files} | set(overlay))


def apply_to_target(project: Project, patches: list[Patch], target_root: Path) -> list[str]:
    """Apply the series and overlay onto an existing torch tree, all or nothing."""
    with tempfile.TemporaryDirectory(prefix="dynapatch-apply-") as tmp:
        staged = Path(tmp) / "tree"
        staged.mkdir()
        # Patch copies first: if any patch fails, the target has not been touched.
        apply_series_to(staged, patches, source=target_root, allow_offsets=True)
        for patch in patches:
            for rel in patch.overlay_files:
                existing = target_root / rel
                if existing.exists() and existing.read_bytes() != (project.overlay / rel).read_bytes():
                    raise DynapatchError(
                        f"{existing} exists and differs from torch_overlay/{rel}; refusing to overwrite")
        overlay = copy_overlay(project, patches, staged)
        changed = sorted({f for p in patches for f in p.files} | set(overlay))
        for rel in changed:
            (target_root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(staged / rel, target_root / rel)
    return changed


def series_digest(project: Project, patches: list[Patch]) -> str:
    """sha256 over the series file, every patch and every overlay file (recorded in torch.version)."""
    import hashlib
    digest = hashlib.sha256(project.series_file.read_bytes())
    for patch in patches:
        digest.update(patch.name.encode() + b"\0" + patch.path.read_bytes())
        for rel in patch.overlay_files:
            digest.update(rel.encode() + b"\0" + (project.overlay / rel).read_bytes())
    return digest.hexdigest()
