"""export-prs: the series as a stack of upstream pull requests, one mbox per patch.

Each patch becomes one commit in a scratch repository holding the base release's
files: its diff, its overlay files at their real paths in the torch tree, and the
test files its `Tests:` trailer names (the first patch naming a test file adds it).
The commit message is the PR description. `git format-patch` then writes the mboxes,
which `git am` applies in order onto a pytorch checkout at the matching tag.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from .common import DynapatchError, Project, git, log
from .devtree import FIXED_ENV
from .series import Patch, apply_patch

# Trailers that only mean something to dynapatch; the rest (Signed-off-by, ...) are kept.
INTERNAL_TRAILERS = ("Upstream-Status", "Bug", "Tests", "Overlay-File")
TAG_RE = re.compile(r"^v(\d+\.\d+\.\d+)$")


def test_files(patch: Patch) -> list[str]:
    return [f.strip() for v in patch.trailer_values("Tests") for f in v.split(",") if f.strip()]


def _module_name(rel: str) -> str:
    return rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _added_text(project: Project, patch: Patch) -> str:
    """What the patch brings in: its added diff lines, overlay files and test files."""
    added = [line[1:] for line in patch.diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    texts = ["\n".join(added)]
    texts += [(project.overlay / rel).read_text() for rel in patch.overlay_files]
    texts += [(project.root / rel).read_text() for rel in test_files(patch) if (project.root / rel).is_file()]
    return "\n".join(texts)


def dependencies(project: Project, patches: list[Patch]) -> list[list[tuple[int, str]]]:
    """For each patch, the earlier patches it needs: (index, reason)."""
    result = []
    for i, patch in enumerate(patches):
        text = _added_text(project, patch)
        needs = []
        for j, earlier in enumerate(patches[:i]):
            reasons = []
            shared = sorted(set(patch.files) & set(earlier.files))
            if shared:
                reasons.append(f"both change {', '.join(shared)}")
            for rel in earlier.overlay_files:
                stem = Path(rel).stem
                if re.search(rf"^\s*(from|import)\s+[\w.]*\b{re.escape(stem)}\b|\bimport\s+{re.escape(stem)}\b",
                             text, re.M):
                    reasons.append(f"uses {_module_name(rel)}, which it adds")
            shared_tests = sorted(set(test_files(patch)) & set(test_files(earlier)))
            if shared_tests:
                reasons.append(f"extends {', '.join(shared_tests)}, which it adds")
            if reasons:
                needs.append((j, "; ".join(reasons)))
        result.append(needs)
    return result


def pr_message(project: Project, patches: list[Patch], index: int, needs: list[tuple[int, str]],
               base_ref: str) -> str:
    """The commit message: title, summary, issues, test plan, stack and dependencies."""
    patch, total = patches[index], len(patches)
    parts = [patch.subject, patch.description]
    bugs = patch.trailer_values("Bug")
    if bugs:
        parts.append("Related issues:\n" + "\n".join(f"- {url}" for url in bugs))
    tests = test_files(patch)
    if tests:
        parts.append("Test plan:\n" + "\n".join(f"    python {rel}" for rel in tests))
    else:
        parts.append("Test plan:\n    none named (the patch has no Tests: trailer)")
    stack = [f"* {'-> ' if i == index else ''}{i + 1}/{total} {p.subject}{' (this PR)' if i == index else ''}"
             for i, p in enumerate(patches)]
    parts.append(f"Stack (oldest first; apply in this order onto {base_ref}):\n" + "\n".join(stack))
    if needs:
        parts.append("Depends on:\n" + "\n".join(f"* {j + 1}/{total} {patches[j].subject}: {why}"
                                                  for j, why in needs))
    elif index:
        parts.append(f"Depends on: nothing earlier in the stack; it is stacked on {index}/{total} "
                     f"only to keep the series order.")
    kept = [f"{k}: {v}" for k, v in patch.trailers if k not in INTERNAL_TRAILERS]
    if kept:
        parts.append("\n".join(kept))
    return "\n\n".join(parts) + "\n"


def export_prs(project: Project, patches: list[Patch], base_tree: Path, outdir: Path, base_ref: str,
               *, allow_offsets: bool = False) -> list[Path]:
    """Write one mbox per patch into `outdir` (which must be empty or absent); return them in order."""
    if outdir.exists() and any(outdir.iterdir()):
        raise DynapatchError(f"{outdir} is not empty: export-prs writes a fresh stack, give it a new directory")
    claimed: set[str] = set()
    for patch in patches:
        for rel in test_files(patch):
            if not (project.root / rel).is_file():
                raise DynapatchError(f"patch {patch.name} names test file {rel} (Tests:), which does not exist")
    needs = dependencies(project, patches)
    with tempfile.TemporaryDirectory(prefix="dynapatch-export-") as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        git(["init", "-q"], repo)
        for rel in sorted({f for p in patches for f in p.files}):
            if not (base_tree / rel).is_file():
                raise DynapatchError(f"{rel}, changed by the series, is not in the {base_ref} sources")
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(base_tree / rel, repo / rel)
        git(["add", "-A"], repo)
        git(["commit", "-q", "--allow-empty", "-m", f"base: {base_ref} files the series changes"], repo,
            env=FIXED_ENV)
        for index, patch in enumerate(patches):
            apply_patch(repo, patch, allow_offsets=allow_offsets)
            for rel in patch.overlay_files:
                (repo / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(project.overlay / rel, repo / rel)
            for rel in test_files(patch):
                if rel not in claimed:
                    claimed.add(rel)
                    (repo / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(project.root / rel, repo / rel)
            message = Path(tmp) / "message"
            message.write_text(pr_message(project, patches, index, needs[index], base_ref))
            name, _, email = patch.author.rpartition(" <")
            env = {**FIXED_ENV, "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email.rstrip(">"),
                   "GIT_AUTHOR_DATE": patch.date}
            git(["add", "-A"], repo)
            git(["commit", "-q", "--cleanup=verbatim", "-F", str(message)], repo, env=env)
        outdir.mkdir(parents=True, exist_ok=True)
        # --zero-commit: the scratch commits' ids mean nothing upstream and would vary.
        names = git(["format-patch", "--zero-commit", "--no-signature", "--numbered", "--full-index",
                     "--stat=72", "-o", str(outdir.resolve()), "HEAD~%d" % len(patches)], repo).split()
    written = [Path(n) for n in names]
    for path in written:
        log(f"wrote {path.name}")
    log(f"exported {len(written)} PRs to {outdir} (apply with: git am {outdir}/*.patch, on a checkout at {base_ref})")
    return written
