"""A git patch queue over the pristine torch sources, like `gbp pq import` / `export`.

`make_devtree` commits the pristine sources, then one commit per patch (its overlay files
included). `refresh` writes the commits back as patches/ and torch_overlay/: files a
commit adds become overlay files, everything else becomes the patch's diff.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from .base import BaseSpec
from .common import DynapatchError, git, log, Project
from .series import load_series, Patch, PATCH_NAME_MAX, read_series_names, TRAILER_RE

BASE_TAG = "dynapatch-base"
ZERO_FROM = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001"
# Fixed committer identity and date: commit ids in the devtree do not depend on when it was made.
FIXED_ENV = {"GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
             "GIT_COMMITTER_NAME": "dynapatch", "GIT_COMMITTER_EMAIL": "dynapatch@localhost"}


def make_devtree(project: Project, spec: BaseSpec, pristine: Path, dest: Path, force: bool) -> None:
    """Create `dest`: a git repository of the base sources with the series as commits."""
    patches = load_series(project, pristine)
    if dest.exists():
        if not force:
            raise DynapatchError(f"{dest} exists: refresh it, or pass --force to recreate it (edits are lost)")
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    git(["init", "-q"], dest)
    shutil.copytree(pristine / "torch", dest / "torch")
    git(["add", "-A"], dest)
    git(["commit", "-q", "-m", f"base: torch {spec.version} pristine sources"], dest, env=FIXED_ENV)
    git(["tag", BASE_TAG], dest)
    for patch in patches:
        _import_patch(project, patch, dest)
    log(f"devtree ready: {dest} ({len(patches)} patch commits on top of tag {BASE_TAG})")


def _import_patch(project: Project, patch: Patch, dest: Path) -> None:
    env = {**FIXED_ENV}
    env.pop("GIT_AUTHOR_DATE")  # git am keeps the patch's own Date:
    out = git(["am", "--quiet", "--keep-cr", "--keep-non-patch", str(patch.path)], dest, env=env, check=False)
    if git(["status", "--porcelain"], dest).strip() or (dest / ".git" / "rebase-apply").exists():
        git(["am", "--abort"], dest, check=False)
        raise DynapatchError(f"patch {patch.name} does not apply in the devtree: {out}")
    if patch.overlay_files:
        for rel in patch.overlay_files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(project.overlay / rel, dest / rel)
        git(["add", "--", *patch.overlay_files], dest)
        git(["commit", "-q", "--amend", "--no-edit"], dest, env=env)


def _slug(subject: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", subject).strip("-.")[:52].rstrip("-.")


def _patch_name(subject: str, taken: set[str]) -> str:
    """A Patch-Name for a new commit that has none: its subject, lower-case, words joined by '-'."""
    words = re.sub(r"^\[[^\]]*\]\s*", "", subject).lower()
    words = re.sub(r"[^a-z0-9]+", "-", words).strip("-").lstrip("0123456789-") or "patch"
    name = words[:PATCH_NAME_MAX].rsplit("-", 1)[0] if len(words) > PATCH_NAME_MAX else words
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name[:PATCH_NAME_MAX - 3]}-{n}", n + 1
    return candidate


def _message_with_overlay(body: str, added: list[str], patch_name: str | None = None) -> str:
    paragraphs = body.strip().split("\n\n")
    if patch_name and not all(TRAILER_RE.match(line) for line in paragraphs[-1].splitlines()):
        paragraphs.append("")  # no trailer block yet: start one
    trailers = [line for line in paragraphs[-1].splitlines() if not line.startswith("Overlay-File:")]
    if patch_name:
        trailers.insert(0, f"Patch-Name: {patch_name}")
    trailers += [f"Overlay-File: {rel}" for rel in added]
    paragraphs[-1] = "\n".join(trailers)
    return "\n\n".join(p for p in paragraphs if p)


def refresh(project: Project, dest: Path) -> list[str]:
    """Export the devtree's commits to patches/ + torch_overlay/; return the patch names."""
    if not (dest / ".git").is_dir():
        raise DynapatchError(f"{dest} is not a devtree (run: dynapatch.py devtree)")
    if git(["status", "--porcelain"], dest).strip():
        raise DynapatchError(f"{dest} has uncommitted changes: commit (or amend) them into the patch they belong to")
    commits = git(["rev-list", "--reverse", f"{BASE_TAG}..HEAD"], dest).split()
    exported: list[tuple[str, str]] = []
    overlay: dict[str, bytes] = {}
    bodies = [git(["log", "-1", "--format=%b", c], dest) for c in commits]
    taken = {m.group(1) for b in bodies for m in re.finditer(r"^Patch-Name: (\S+)$", b, re.M)}
    for index, commit in enumerate(commits, 1):
        author, date, subject = git(["log", "-1", "--format=%an <%ae>%n%aD%n%s", commit], dest).splitlines()
        body = git(["log", "-1", "--format=%b", commit], dest)
        changed = [line.split("\t", 1) for line in
                   git(["diff-tree", "-r", "--no-commit-id", "--no-renames", "--name-status", f"{commit}^", commit],
                       dest).splitlines()]
        added = sorted(path for status, path in changed if status == "A")
        modified = sorted(path for status, path in changed if status != "A")
        for path in modified:
            if path in overlay:
                raise DynapatchError(
                    f"commit {commit[:12]} ({subject}) changes {path}, an overlay file added by an earlier "
                    f"commit: squash the change into that commit (git rebase -i {BASE_TAG})")
        for path in added:
            overlay[path] = _git_show_bytes(dest, commit, path)
        diff = git(["diff", "--full-index", "--stat=72", "--summary", "-p", "--no-color", "--no-ext-diff",
                    "--no-textconv", f"{commit}^", commit, "--", *modified], dest) if modified else ""
        new_name = None
        if not re.search(r"^Patch-Name: ", body, re.M):
            new_name = _patch_name(subject, taken)
            taken.add(new_name)
            log(f"commit {commit[:12]} ({subject}) has no Patch-Name: trailer; named it {new_name}")
        text = (f"{ZERO_FROM}\nFrom: {author}\nDate: {date}\nSubject: [PATCH] {subject}\n\n"
                f"{_message_with_overlay(body, added, new_name)}\n---\n{diff}")
        exported.append((f"{index:04d}-{_slug(subject)}.patch", text))

    for name in read_series_names(project):
        (project.patches / name).unlink(missing_ok=True)
    for name, text in exported:
        (project.patches / name).write_text(text)
    comments = [line for line in project.series_file.read_text().splitlines() if line.startswith("#")]
    project.series_file.write_text("\n".join(comments + [name for name, _ in exported]) + "\n")
    _replace_overlay(project, overlay)
    log(f"refreshed {len(exported)} patches and {len(overlay)} overlay files from {dest}")
    return [name for name, _ in exported]


def _git_show_bytes(dest: Path, commit: str, path: str) -> bytes:
    import subprocess
    return subprocess.run(["git", "show", f"{commit}:{path}"], cwd=dest, capture_output=True, check=True).stdout


def _replace_overlay(project: Project, files: dict[str, bytes]) -> None:
    if project.overlay.exists():
        for old in sorted(project.overlay.rglob("*"), reverse=True):
            if old.is_file():
                old.unlink()
            elif old.is_dir() and not any(old.iterdir()):
                old.rmdir()
    for rel, data in files.items():
        (project.overlay / rel).parent.mkdir(parents=True, exist_ok=True)
        (project.overlay / rel).write_bytes(data)
