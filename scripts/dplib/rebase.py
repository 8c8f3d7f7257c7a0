"""rebase-check: how the series applies to another torch release, patch by patch, hunk by hunk.

Patches are applied in series order to the other release's sources (each on top of
the earlier ones). Every hunk is checked on its own against the file as the earlier
patches left it, so one report names all conflicting hunks, not just the first.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .common import Project
from .series import Patch

CLEAN, OFFSETS, CONFLICT, BLOCKED, MISSING = "clean", "offsets", "conflict", "blocked", "missing file"
FILE_HEADER_RE = re.compile(r"^diff --git a/(\S+) b/\S+\n(?:(?!@@|diff --git ).*\n)*", re.M)
HUNK_START_RE = re.compile(r"^@@ .*$", re.M)
HUNK_POS_RE = re.compile(r"^@@ -(\d+)(,(\d+))? \+(\d+)")


def _new_start_at_old(match: re.Match) -> str:
    old_start, old_count = int(match.group(1)), match.group(3)
    new_start = old_start + 1 if old_count == "0" else old_start  # -N,0 inserts after line N
    return f"@@ -{match.group(1)}{match.group(2) or ''} +{new_start}"


@dataclass
class HunkResult:
    file: str
    header: str  # the @@ line
    status: str  # CLEAN, OFFSETS or CONFLICT
    detail: str = ""  # "offset 3 lines"; "context only" / "changed lines differ"


@dataclass
class PatchResult:
    name: str
    override: bool  # an override from patches/<version>/ was used
    status: str
    hunks: list[HunkResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [f"{h.file} @@{h.header.split('@@')[1]}@@ ({h.detail})"
                for h in self.hunks if h.status == CONFLICT] + self.notes


def split_hunks(diff: str) -> list[tuple[str, str, str]]:
    """(file, file header, hunk text) for every hunk of a git diff."""
    result = []
    sections = re.split(r"(?=^diff --git )", diff, flags=re.M)
    for section in sections:
        header_match = FILE_HEADER_RE.match(section)
        if not header_match:
            continue
        file, header = header_match.group(1), header_match.group(0)
        body = section[len(header):]
        starts = [m.start() for m in HUNK_START_RE.finditer(body)]
        for start, end in zip(starts, [*starts[1:], len(body)]):
            result.append((file, header, body[start:end]))
    return result


def _git_apply(tree: Path, patch_text: str, extra: list[str]) -> subprocess.CompletedProcess:
    # The ceiling stops git from applying relative to an enclosing repository.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    return subprocess.run(["git", "apply", "--verbose", "--whitespace=nowarn", *extra, "-"], input=patch_text,
                          cwd=tree, env=env, text=True, capture_output=True)


def check_hunk(tree: Path, file: str, header: str, hunk: str) -> HunkResult:
    """Does this one hunk apply to `tree` as it is: exactly, at an offset, or not at all?"""
    hunk_header = hunk.splitlines()[0]
    # git apply looks for a hunk at its new-file line, which counts the lines earlier
    # hunks add; alone, the hunk belongs at its old-file line.
    hunk = HUNK_POS_RE.sub(_new_start_at_old, hunk, count=1)
    proc = _git_apply(tree, header + hunk, ["--check"])
    if proc.returncode == 0:
        offset = re.search(r"\(offset (-?\d+) lines?\)", proc.stdout + proc.stderr)
        if offset:
            return HunkResult(file, hunk_header, OFFSETS, f"offset {offset.group(1)} lines")
        return HunkResult(file, hunk_header, CLEAN)
    # With no context required, the hunk applies if the lines it removes are still there:
    # then only the surrounding context moved on, and refreshing the patch is mechanical.
    context_free = _git_apply(tree, header + hunk, ["--check", "-C0"])
    detail = "context only" if context_free.returncode == 0 else "changed lines differ"
    return HunkResult(file, hunk_header, CONFLICT, detail)


def check_series(patches: list[Patch], overridden: set[str], target: Path, overlay_files: dict[str, str],
                 stage: Path) -> list[PatchResult]:
    """Apply `patches` in order to copies of `target`'s files in `stage`; a result per patch."""
    broken: dict[str, str] = {}  # file -> patch that failed to change it
    results = []
    for patch in patches:
        result = PatchResult(patch.name, patch.name in overridden, CLEAN)
        blockers = sorted({broken[f] for f in patch.files if f in broken})
        for rel in patch.files:
            staged, source = stage / rel, target / rel
            if not staged.exists():
                if not source.is_file():
                    result.notes.append(f"{rel} does not exist in the target")
                    continue
                staged.parent.mkdir(parents=True, exist_ok=True)
                staged.write_bytes(source.read_bytes())
        for rel in patch.overlay_files:
            if (target / rel).exists():
                result.notes.append(f"overlay file {rel} collides with a file of the target")
            if rel in overlay_files:
                result.notes.append(f"overlay file {rel} is also added by {overlay_files[rel]}")
        if blockers:
            result.status = BLOCKED
            result.notes.append(f"not checked: earlier patch {', '.join(blockers)} did not apply to its files")
        else:
            for file, header, hunk in split_hunks(patch.diff):
                if (stage / file).exists():
                    result.hunks.append(check_hunk(stage, file, header, hunk))
            if result.problems:
                result.status = CONFLICT
            elif any(h.status == OFFSETS for h in result.hunks):
                result.status = OFFSETS
            if result.status != CONFLICT:
                proc = _git_apply(stage, patch.path.read_text(), [])
                if proc.returncode != 0:  # hunks apply alone but not together
                    result.status = CONFLICT
                    result.notes.append(f"hunks apply one by one but not together: {proc.stderr.strip()}")
        if result.notes and result.status in (CLEAN, OFFSETS):
            result.status = CONFLICT
        if result.status in (CONFLICT, BLOCKED):
            broken.update(dict.fromkeys(patch.files, patch.name))
        for rel in patch.overlay_files:
            overlay_files.setdefault(rel, patch.name)
        results.append(result)
    return results


def rebase_check(project: Project, patches: list[Patch], overridden: set[str], target: Path) -> list[PatchResult]:
    with tempfile.TemporaryDirectory(prefix="dynapatch-rebase-") as tmp:
        stage = Path(tmp) / "tree"
        stage.mkdir()
        return check_series(patches, overridden, target, {}, stage)


def format_table(results: list[PatchResult], version: str) -> str:
    """A Markdown table: patch, result on `version`, details (conflicting hunks, offsets, notes)."""
    lines = [f"| patch | on torch {version} | details |", "|---|---|---|"]
    for r in results:
        status = r.status + (" (override)" if r.override else "")
        details = r.problems or [f"{h.file} @@{h.header.split('@@')[1]}@@: {h.detail}"
                                 for h in r.hunks if h.status == OFFSETS]
        hunks = len(r.hunks)
        lines.append(f"| {r.name} | {status} | {'; '.join(details) or f'{hunks} hunks apply exactly'} |")
    return "\n".join(lines)


def failed(results: list[PatchResult]) -> list[PatchResult]:
    return [r for r in results if r.status in (CONFLICT, BLOCKED)]
