"""export-prs: the series as a stack of upstream pull requests, one mbox per patch.

Each patch becomes one commit in a scratch repository holding the base release's
files: its diff, its overlay files at their real paths in the torch tree, its native
sources (`Native-File:`) under torch/csrc/dynamo/, and its test cases (`Tests:`; in a
file several patches share, each PR adds its own cases, see testsel.py). The commit
message is the PR description. `git format-patch` then writes the mboxes, and each
patch's changes to pytorch files the wheel lacks (patches/pr-extra/<Patch-Name>.diff,
the build list for its native sources) are added to its mbox; `git am` applies them in
order onto a pytorch checkout at the matching tag.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from .common import DynapatchError, git, log, Project
from .devtree import FIXED_ENV
from .series import apply_patch, Patch, series_digest
from .testsel import node_ids, pr_extra, pr_extra_files, shared_files, test_files

# Trailers that only mean something to dynapatch; the rest (Signed-off-by, ...) are kept.
INTERNAL_TRAILERS = ("Patch-Name", "Upstream-Status", "Bug", "Tests", "Overlay-File", "Native-File")
TAG_RE = re.compile(r"^v(\d+\.\d+\.\d+)$")
# Where Dynamo's C++ lives in pytorch's tree, and the list libtorch_python is built from.
NATIVE_PR_DIR = "torch/csrc/dynamo"
BUILD_LIST = "build_variables.bzl"
BUILD_LIST_ANCHOR = '    "torch/csrc/dynamo/guards.cpp",'
BUILD_LIST_NEXT = '    "torch/csrc/dynamo/utils.cpp",'
PORT_NOTES = """\
Native code: {files} ({sources} added to libtorch_python_core_sources in {build_list}).
Out of tree these are the extension module torch._dynamo._guard_accel. libtorch_python
exports none of torch::dynamo's guard classes, so each guard derives from a LeafGuard
with guards.cpp's interface (guard_accel_common.h: check_nopybind, check_verbose_nopybind
returning GuardDebugInfo(result, verbose_code_parts, num_guards_executed), the guard's
own verbose_code_parts; references held as py::object members) and is installed as a
Python callable through GuardManager's add_lambda_guard / add_epilogue_lambda_guard.
An in-tree port changes, mechanically:
- each guard class becomes a LeafGuard subclass in torch/csrc/dynamo/guards.cpp (its
  constructor also takes the RootGuardManager), and guard_accel_common.h goes away;
- each guard's Python type and construction (tensor_container_guard_bindings.cpp, the
  type blocks of the other files) becomes a py::class_ next to GuardManager and an
  add_*_guard method taking today's tuples as typed arguments, so the guard tree calls
  check_nopybind without going through Python;
- DispatchState (LocalState::apply re-done with c10's exported TLS getter and
  the public Python getter of the dispatch-mode flag, because LocalState's
  constructor calls get_is_in_mode_without_ignore_compile_internals(), which
  libtorch_python does not export) becomes a LocalState, which also reads the
  flag per thread instead of process-wide;
- the module's bindings move from PYBIND11_MODULE into initDynamoBindings
  (torch._C._dynamo), and guard_accel.py imports them from there."""


def native_pr_path(rel: str) -> str:
    """csrc/x.cpp -> torch/csrc/dynamo/x.cpp: where a native source goes in pytorch's tree."""
    return f"{NATIVE_PR_DIR}/{Path(rel).name}"


def build_list_diff(native: list[str]) -> str:
    """The build wiring a reviewer expects: the patch's .cpp files in libtorch_python's source list.

    The wheel has no build_variables.bzl, so the hunk is located by its context (the entry of
    guards.cpp and the one after it); git am applies it at whatever line that is.
    """
    added = [f'+    "{native_pr_path(rel)}",' for rel in native if rel.endswith((".c", ".cc", ".cpp", ".cxx"))]
    if not added:
        return ""
    return (f"diff --git a/{BUILD_LIST} b/{BUILD_LIST}\n--- a/{BUILD_LIST}\n+++ b/{BUILD_LIST}\n"
            f"@@ -1,2 +1,{2 + len(added)} @@ libtorch_python_core_sources = [\n"
            f" {BUILD_LIST_ANCHOR}\n" + "\n".join(added) + f"\n {BUILD_LIST_NEXT}\n")


def _module_name(rel: str) -> str:
    return rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _added_text(project: Project, patch: Patch) -> str:
    """What the patch brings in: its added diff lines, overlay files and test files."""
    added = [line[1:] for line in patch.diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    texts = ["\n".join(added)]
    texts += [(project.overlay / rel).read_text() for rel in patch.overlay_files]
    texts += [(project.root / rel).read_text() for rel in test_files(patch) if (project.root / rel).is_file()]
    texts += [(project.root / rel).read_text() for rel in patch.native_files]
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
               base_ref: str, tests: dict | None = None) -> str:
    """The commit message: title, summary, issues, native code, test plan, stack and dependencies."""
    patch, total = patches[index], len(patches)
    tests = tests if tests is not None else shared_files(project, patches)
    parts = [patch.subject, patch.description]
    bugs = patch.trailer_values("Bug")
    if bugs:
        parts.append("Related issues:\n" + "\n".join(f"- {url}" for url in bugs))
    if patch.native_files:
        sources = [native_pr_path(rel) for rel in patch.native_files if not rel.endswith((".h", ".hpp"))]
        parts.append(PORT_NOTES.format(files=", ".join(native_pr_path(rel) for rel in patch.native_files),
                                       sources=", ".join(Path(s).name for s in sources), build_list=BUILD_LIST))
    extra = pr_extra(project, patch)
    if extra is not None:
        parts.append("Upstream tests whose expected results this patch changes (updated here): "
                     + ", ".join(pr_extra_files(extra)) + ".")
    plan = []
    for rel in test_files(patch):
        ids = node_ids(tests[rel], index)
        plan += [f"    python {rel}"] if ids == [rel] else [f"    python -m pytest {i}" for i in ids]
    if plan:
        parts.append("Test plan:\n" + "\n".join(plan))
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
    tests = shared_files(project, patches)
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
            for rel in patch.native_files:
                (repo / native_pr_path(rel)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(project.root / rel, repo / native_pr_path(rel))
            for rel in test_files(patch):
                (repo / rel).parent.mkdir(parents=True, exist_ok=True)
                (repo / rel).write_text(tests[rel].text_at(index))
            message = Path(tmp) / "message"
            message.write_text(pr_message(project, patches, index, needs[index], base_ref, tests))
            name, _, email = patch.author.rpartition(" <")
            env = {**FIXED_ENV, "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email.rstrip(">"),
                   "GIT_AUTHOR_DATE": patch.date}
            git(["add", "-A"], repo)
            git(["commit", "-q", "--cleanup=verbatim", "-F", str(message)], repo, env=env)
        outdir.mkdir(parents=True, exist_ok=True)
        # --zero-commit: the scratch commits' ids mean nothing upstream and would vary.
        names = git(["format-patch", "--zero-commit", "--no-signature", "--numbered", "--full-index",
                     "--stat=72", "-o", str(outdir.resolve()), f"HEAD~{len(patches)}"], repo).split()
    written = [Path(n) for n in names]
    for patch, path in zip(patches, written):
        extra = pr_extra(project, patch)
        appended = (extra.read_text() if extra is not None else "") + build_list_diff(patch.native_files)
        if appended:
            # Files the scratch repository lacks (not in the wheel): the diff goes after the commit's own.
            with open(path, "a") as f:
                f.write(appended)
    for path in written:
        log(f"wrote {path.name}")
    log(f"exported {len(written)} PRs to {outdir} (apply with: git am {outdir}/*.patch, on a checkout at {base_ref})")
    return written


def _am_excludes(project: Project) -> list[str]:
    """Files of pytorch's tree the wheel lacks (upstream tests a pr-extra diff edits, the build list):
    a tree of the wheel's sources cannot take their hunks, so git am leaves them out."""
    paths = {BUILD_LIST}
    for extra in sorted((project.root / "patches" / "pr-extra").glob("*.diff")):
        paths.update(pr_extra_files(extra))
    return [f"--exclude={p}" for p in sorted(paths)]


def verify_prs(project: Project, spec, wheel: Path, pristine: Path, patches: list[Patch], mboxes: list[Path],
               indices: list[int], timeout: float) -> list:
    """Apply the mboxes with git am onto a git repository of the base's sources, and after PR k
    (for k in `indices`) run the tests PR k carries from that tree, with its Python files installed
    into a scratch venv as stack-test installs a prefix, and the C++ extension built from the tree's
    torch/csrc/dynamo once a PR of the prefix carries native code. Returns stacktest.PrefixResult's.
    """
    from . import stacktest

    work = project.build / "export-verify"
    repo = work / "pytorch"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    shutil.copytree(pristine / "torch", repo / "torch")
    git(["init", "-q"], repo)
    git(["add", "-A"], repo)
    git(["commit", "-q", "-m", "base: the base wheel's sources"], repo, env=FIXED_ENV)
    base = git(["rev-parse", "HEAD"], repo).strip()
    excludes = _am_excludes(project)
    venv = stacktest.scratch_venv(project, wheel, spec, "export-verify")
    installer = stacktest.Installer(project, spec, wheel, pristine, venv)
    tests = shared_files(project, patches)
    results = []
    try:
        for index, (patch, mbox) in enumerate(zip(patches[: max(indices) + 1], mboxes)):
            try:
                git(["am", "-q", *excludes, str(mbox)], repo, env=FIXED_ENV)
                failed = ""
            except DynapatchError as e:
                failed = str(e).strip().splitlines()[-1]
            if index not in indices and not failed:
                continue
            ids = [i for rel in test_files(patch) for i in node_ids(tests[rel], index)]
            result = stacktest.PrefixResult(index, patch, ids)
            results.append(result)
            if failed:
                result.error = f"git am {mbox.name} failed: {failed}"
                break
            if not ids:
                result.error = "ships no tests (no Tests: trailer)"
                continue
            changed = git(["diff", "--name-status", "--no-renames", base, "HEAD", "--", "torch"], repo).splitlines()
            files = {}
            for line in changed:
                status, rel = line.split("\t", 1)
                if status == "D":
                    raise DynapatchError(f"PR {mbox.name} deletes {rel}: the installer only adds and replaces")
                if not rel.startswith(NATIVE_PR_DIR + "/"):
                    files[rel] = (repo / rel).read_bytes()
            result.native = any(p.native_files for p in patches[: index + 1])
            ext = (stacktest.extension(project, spec, wheel, repo / NATIVE_PR_DIR, work)
                   if result.native else None)
            installer.install_files(files, series_digest(project, patches[: index + 1]), ext)
            missing = [rel for rel in test_files(patch) if not (repo / rel).is_file()]
            if missing:
                result.error = f"the PR lacks its test files: {', '.join(missing)}"
                continue
            stacktest.run_tests(project, venv, repo, ids, work / f"junit-{index + 1:04d}.xml",
                                f"export-prs --verify {index + 1}/{len(patches)} {patch.patch_name}", timeout,
                                result, safe_path=True)
    finally:
        installer._restore()
    return results
