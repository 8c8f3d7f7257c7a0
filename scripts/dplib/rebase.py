"""rebase-check: how the series applies to another torch release, and what a refresh would change.

Each patch is checked twice against the other release's sources, in series order:

1. its hunks as they are (each hunk alone: exactly, at an offset, or not at all), which says
   whether the patch file itself still applies;
2. a three-way merge per file it changes (git merge-file): base = the file on the pinned
   release before the patch, ours = after it, theirs = the other release's file with the
   earlier patches already refreshed. A clean merge is the refreshed patch (written to
   --out as NNNN-name.patch); a conflict is a place where upstream changed what the patch
   changes, and the conflicting regions are written to --out as NNNN-name.conflicts.

Because each patch is merged onto the refreshed result of the earlier ones (conflicts are
resolved towards the patch for the later ones), no patch is left unchecked behind an
earlier conflict: the report covers the whole series in one run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .common import Project
from .series import Patch

# clean: the patch file applies as it is; offsets: it applies with line offsets (a refresh
# only renumbers hunks); merges: its hunks do not apply but a three-way merge is clean (a
# refresh changes context lines); conflict: upstream changed what the patch changes.
CLEAN, OFFSETS, MERGES, CONFLICT = "clean", "offsets", "merges", "conflict"
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
    conflicts: list[str] = field(default_factory=list)  # "file:line-line" of each conflicting region
    refresh: list[str] = field(default_factory=list)  # what a refresh changes in the patch file
    refreshed_diff: str = ""  # the patch's diff against the other release ("" if it conflicts)

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


def _env(tree: Path) -> dict[str, str]:
    # The ceiling stops git from applying relative to an enclosing repository.
    return {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}


def _git_apply(tree: Path, patch_text: str, extra: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "apply", "--verbose", "--whitespace=nowarn", *extra, "-"], input=patch_text,
                          cwd=tree, env=_env(tree), text=True, capture_output=True)


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


def merge_file(theirs: bytes, base: bytes, ours: bytes, rel: str) -> tuple[bytes, bytes, int]:
    """Three-way merge of a patch's change to one file (base -> ours) into `theirs`, the other
    release's file. Returns (merged with conflict markers, merged with conflicts resolved to
    the patch's side, number of conflicts)."""
    with tempfile.TemporaryDirectory(prefix="dynapatch-merge-") as tmp:
        paths = []
        for label, data in (("upstream", theirs), ("base", base), ("patch", ours)):
            path = Path(tmp) / label
            path.write_bytes(data)
            paths.append(str(path))
        labels = ["-L", f"{rel} (target release)", "-L", f"{rel} (pinned base)", "-L", f"{rel} (patch)"]
        marked = subprocess.run(["git", "merge-file", "-p", "--diff3", *labels, *paths], capture_output=True)
        if marked.returncode < 0 or marked.returncode > 127:
            raise RuntimeError(f"git merge-file failed on {rel}: {marked.stderr.decode()}")
        if marked.returncode == 0:
            return marked.stdout, marked.stdout, 0
        resolved = subprocess.run(["git", "merge-file", "-p", "--theirs", *paths], capture_output=True)
        return marked.stdout, resolved.stdout, marked.returncode


CONFLICT_START_RE = re.compile(rb"^<<<<<<< ", re.M)


def conflict_regions(marked: bytes, rel: str) -> list[str]:
    """`file:first-last` (lines of the merged file) for each conflict region."""
    regions, start = [], None
    for number, line in enumerate(marked.splitlines(), 1):
        if line.startswith(b"<<<<<<< "):
            start = number
        elif line.startswith(b">>>>>>> ") and start is not None:
            regions.append(f"{rel}:{start}-{number}")
            start = None
    return regions


def file_diff(rel: str, before: bytes, after: bytes) -> str:
    """`git diff` of one file, before -> after, in the series' patch format (a/ b/ paths, full index)."""
    if before == after:
        return ""
    with tempfile.TemporaryDirectory(prefix="dynapatch-diff-") as tmp:
        for side, data in (("a", before), ("b", after)):
            path = Path(tmp) / side / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        proc = subprocess.run(["git", "-c", "core.quotepath=off", "diff", "--no-index", "--no-color",
                               "--full-index", "--no-prefix", f"a/{rel}", f"b/{rel}"],
                              cwd=tmp, env=_env(Path(tmp)), capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"git diff failed on {rel}: {proc.stderr}")
    return proc.stdout


def _changed_lines(diff: str) -> list[str]:
    return [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def describe_refresh(original: str, refreshed: str) -> list[str]:
    """What replacing the patch's diff with `refreshed` changes, in a few words."""
    if original == refreshed:
        return []
    old_hunks, new_hunks = split_hunks(original), split_hunks(refreshed)
    old_changed, new_changed = _changed_lines(original), _changed_lines(refreshed)
    notes = []
    if old_changed != new_changed:
        gone = len(old_changed) - len(new_changed)
        if set(new_changed) < set(old_changed) or (gone > 0 and all(x in old_changed for x in new_changed)):
            notes.append(f"{gone} of its {len(old_changed)} +/- lines drop out (the target already has them)")
        else:
            notes.append("its +/- lines change")
    old_context = [[ln for ln in h.splitlines()[1:] if ln.startswith(" ")] for _, _, h in old_hunks]
    new_context = [[ln for ln in h.splitlines()[1:] if ln.startswith(" ")] for _, _, h in new_hunks]
    if len(old_hunks) != len(new_hunks):
        notes.append(f"{len(old_hunks)} hunks become {len(new_hunks)}")
    else:
        context = sum(a != b for a, b in zip(old_context, new_context))
        moved = sum(a[2].splitlines()[0] != b[2].splitlines()[0] for a, b in zip(old_hunks, new_hunks))
        if context:
            notes.append(f"context of {context} of {len(old_hunks)} hunks")
        if moved:
            notes.append(f"line numbers of {moved} hunks")
    return notes or ["index lines only"]


def check_series(patches: list[Patch], overridden: set[str], target: Path, overlay_files: dict[str, str],
                 stage: Path, base: Path | None = None, out: Path | None = None) -> list[PatchResult]:
    """Check `patches` in order against copies of `target`'s files in `stage`; a result per patch.

    With `base` (the pinned release's sources) each patch is also merged three-way into the
    stage, so the next patch is checked against the refreshed series; without it a patch that
    does not apply leaves its files as they were. `out` receives the refreshed patches and the
    conflicts.
    """
    old = stage.parent / (stage.name + "-base")
    results = []
    for patch in patches:
        result = PatchResult(patch.name, patch.name in overridden, CLEAN)
        old_before = {}
        for rel in patch.files:
            if base is not None:  # the pinned release's file as the earlier patches left it
                old_file = old / rel
                if not old_file.exists():
                    old_file.parent.mkdir(parents=True, exist_ok=True)
                    old_file.write_bytes((base / rel).read_bytes())
            staged, source = stage / rel, target / rel
            if not staged.exists():
                if not source.is_file():
                    result.notes.append(f"{rel} does not exist in the target")
                    continue
                staged.parent.mkdir(parents=True, exist_ok=True)
                staged.write_bytes(source.read_bytes())
            if base is not None:
                old_before[rel] = (old / rel).read_bytes()
        for rel in patch.overlay_files:
            if (target / rel).exists():
                result.notes.append(f"overlay file {rel} collides with a file of the target")
            if rel in overlay_files:
                result.notes.append(f"overlay file {rel} is also added by {overlay_files[rel]}")
        for file, header, hunk in split_hunks(patch.diff):
            if (stage / file).exists():
                result.hunks.append(check_hunk(stage, file, header, hunk))
        if any(h.status == CONFLICT for h in result.hunks):
            result.status = MERGES
        elif any(h.status == OFFSETS for h in result.hunks):
            result.status = OFFSETS
        applies_whole = result.status in (CLEAN, OFFSETS) and _git_apply(stage, patch.diff, ["--check"]).returncode == 0
        if result.status in (CLEAN, OFFSETS) and not applies_whole:  # hunks apply alone but not together
            result.status = MERGES
        if base is None:
            if result.status == MERGES:
                result.status = CONFLICT
            elif not result.notes:
                _git_apply(stage, patch.diff, [])
        else:
            _merge_patch(patch, result, stage, old, old_before, out)
        if result.notes:
            result.status = CONFLICT
        for rel in patch.overlay_files:
            overlay_files.setdefault(rel, patch.name)
        results.append(result)
    return results


def _merge_patch(patch: Patch, result: PatchResult, stage: Path, old: Path, old_before: dict[str, bytes],
                 out: Path | None) -> None:
    """Merge `patch` three-way into `stage` (old: the pinned release's files as the earlier
    patches left them), record what a refresh changes, write the refreshed patch or conflicts."""
    proc = _git_apply(old, patch.diff, [])
    if proc.returncode != 0:  # the series is checked against the base first: cannot happen
        raise RuntimeError(f"{patch.name} does not apply to the pinned base: {proc.stderr}")
    diffs, marked_files = [], []
    for rel, before in old_before.items():
        theirs = (stage / rel).read_bytes()
        marked, resolved, conflicts = merge_file(theirs, before, (old / rel).read_bytes(), rel)
        if conflicts:
            result.conflicts += conflict_regions(marked, rel)
            marked_files.append(f"=== {rel}\n" + _conflict_excerpts(marked))
        diffs.append(file_diff(rel, theirs, resolved))
        (stage / rel).write_bytes(resolved)
    if result.conflicts:
        result.status = CONFLICT
    else:
        result.refreshed_diff = "".join(diffs)
        if result.status != CLEAN:
            result.refresh = describe_refresh(patch.diff, result.refreshed_diff)
        elif not result.refreshed_diff.strip():
            result.refresh = ["the whole change drops out (the target already has it)"]
    if out is None:
        return
    stem = Path(patch.name).name.removesuffix(".patch")
    if result.conflicts:
        (out / f"{stem}.conflicts").write_text("".join(marked_files))
    elif result.status != CLEAN:
        text = patch.path.read_text()
        head = text.split("\n---\n", 1)[0]
        (out / f"{stem}.patch").write_text(f"{head}\n---\n\n{result.refreshed_diff}")


def _conflict_excerpts(marked: bytes, context: int = 3) -> str:
    """The conflict regions of a merged file with a few lines around each, numbered."""
    lines = marked.decode(errors="replace").splitlines()
    keep: set[int] = set()
    start = None
    for i, line in enumerate(lines):
        if line.startswith("<<<<<<< "):
            start = i
        elif line.startswith(">>>>>>> ") and start is not None:
            keep.update(range(max(0, start - context), min(len(lines), i + context + 1)))
            start = None
    out, previous = [], None
    for i in sorted(keep):
        if previous is not None and i != previous + 1:
            out.append("...")
        out.append(f"{i + 1:6d}  {lines[i]}")
        previous = i
    return "\n".join(out) + "\n"


def rebase_check(project: Project, patches: list[Patch], overridden: set[str], target: Path,
                 base: Path | None = None, out: Path | None = None) -> list[PatchResult]:
    if out is not None:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="dynapatch-rebase-") as tmp:
        stage = Path(tmp) / "tree"
        stage.mkdir()
        return check_series(patches, overridden, target, {}, stage, base, out)


def format_table(results: list[PatchResult], version: str) -> str:
    """A Markdown table: patch, result on `version`, what a refresh changes, the hunks that do
    not apply as they are (offsets, conflicts, notes)."""
    lines = [f"| patch | on torch {version} | a refresh | details |", "|---|---|---|---|"]
    for r in results:
        status = r.status + (" (override)" if r.override else "")
        if r.conflicts:
            refresh = f"{len(r.conflicts)} conflicts: {', '.join(r.conflicts)}"
        elif r.notes:
            refresh = "not possible"
        else:
            refresh = "; ".join(r.refresh) or "nothing"
        details = r.problems or [f"{h.file} @@{h.header.split('@@')[1]}@@: {h.detail}"
                                 for h in r.hunks if h.status == OFFSETS]
        hunks = len(r.hunks)
        lines.append(f"| {r.name} | {status} | {refresh} | {'; '.join(details) or f'{hunks} hunks apply exactly'} |")
    return "\n".join(lines)


def failed(results: list[PatchResult]) -> list[PatchResult]:
    return [r for r in results if r.status == CONFLICT]
