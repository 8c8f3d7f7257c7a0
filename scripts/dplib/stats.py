"""stats: the size of each patch as a PR, for review notes.

Per patch: the lines its diff adds to and removes from upstream files, the lines of the
overlay files (new files) and native sources it owns, the lines of its pr-extra diff (edits
of upstream tests the wheel lacks), and the test cases it ships (testsel.case_count: the
test* definitions it owns in its Tests: files as of that patch).
"""

from __future__ import annotations

from dataclasses import dataclass

from .common import Project
from .series import Patch
from .testsel import case_count, pr_extra, shared_files, test_files


@dataclass
class PatchStats:
    patch: Patch
    added: int
    removed: int
    overlay: int
    native: int
    extra_added: int
    extra_removed: int
    cases: int


def _diff_counts(diff: str) -> tuple[int, int]:
    lines = diff.splitlines()
    added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++ "))
    removed = sum(1 for line in lines if line.startswith("-") and not line.startswith("--- "))
    return added, removed


def _lines(project: Project, rels: list[str], base) -> int:
    return sum(len((base / rel).read_text().splitlines()) for rel in rels)


def patch_stats(project: Project, patches: list[Patch]) -> list[PatchStats]:
    tests = shared_files(project, patches)
    result = []
    for index, patch in enumerate(patches):
        added, removed = _diff_counts(patch.diff)
        extra = pr_extra(project, patch)
        extra_added, extra_removed = _diff_counts(extra.read_text()) if extra is not None else (0, 0)
        result.append(PatchStats(
            patch, added, removed,
            overlay=_lines(project, patch.overlay_files, project.overlay),
            native=_lines(project, patch.native_files, project.root),
            extra_added=extra_added, extra_removed=extra_removed,
            cases=sum(case_count(tests[rel], index) for rel in test_files(patch))))
    return result


def format_table(stats: list[PatchStats]) -> str:
    lines = ["| patch | Patch-Name | upstream +/- | overlay lines | native lines | upstream tests +/- | test cases |",
             "|---|---|---|---|---|---|---|"]
    for s in stats:
        extra = f"+{s.extra_added}/-{s.extra_removed}" if s.extra_added or s.extra_removed else "-"
        lines.append(f"| {s.patch.name.split('-', 1)[0]} | {s.patch.patch_name} | +{s.added}/-{s.removed} | "
                     f"{s.overlay} | {s.native} | {extra} | {s.cases} |")
    total = [sum(getattr(s, f) for s in stats) for f in ("added", "removed", "overlay", "native", "extra_added",
                                                          "extra_removed", "cases")]
    lines.append(f"| all | {len(stats)} patches | +{total[0]}/-{total[1]} | {total[2]} | {total[3]} | "
                 f"+{total[4]}/-{total[5]} | {total[6]} |")
    return "\n".join(lines)
