"""Which test cases travel with which patch.

A `Tests:` trailer names a test file, optionally with selectors of the cases this patch
adds to a file an earlier patch introduced:

    Tests: test/dynamo/test_init_values_once.py
    Tests: test/dynamo/test_init_values_once.py::InitValuesOnceTests::test_torch_optim_*

A selector is a top-level name (`Name`) or a method of a top-level class
(`Class::method`), shell-style patterns allowed. In a file several patches name, every
definition a selector matches belongs to that patch; the rest belongs to the first patch
naming the file. The file as of patch k is the file without the definitions of later
patches (and without module-level statements that use them, such as
`instantiate_parametrized_tests(Class)`): that is what the PR of patch k carries and what
`stack-test` runs on the series up to k.
"""

from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass
from pathlib import Path

from .common import DynapatchError, Project
from .series import Patch, SERIES_INVALID


@dataclass(frozen=True)
class TestRef:
    path: str  # relative to the project root
    selector: str | None  # None: the whole file


def test_refs(patch: Patch) -> list[TestRef]:
    refs = []
    for value in patch.trailer_values("Tests"):
        for item in value.split(","):
            item = item.strip()
            if item:
                path, _, selector = item.partition("::")
                refs.append(TestRef(path, selector or None))
    return refs


def test_files(patch: Patch) -> list[str]:
    """The test files a patch names, in trailer order, once each."""
    return list(dict.fromkeys(ref.path for ref in test_refs(patch)))


def _items(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every top-level definition and every method of a top-level class."""
    items = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            items.append((node.name, node))
            if isinstance(node, ast.ClassDef):
                items += [(f"{node.name}::{sub.name}", sub) for sub in node.body
                          if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return items


def _start(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


@dataclass
class SharedFile:
    """One test file and, per patch index naming it, the definitions that patch owns."""

    path: str
    text: str
    patches: list[int]  # indices of the patches naming the file, in series order
    owner: dict[str, int]  # qualified name -> patch index (selected items only)

    def text_at(self, index: int) -> str:
        """The file as of patch `index`: without the definitions of later patches."""
        later = {name for name, i in self.owner.items() if i > index}
        if not later:
            return self.text
        tree = ast.parse(self.text)
        lines = self.text.splitlines(keepends=True)
        drop: set[int] = set()
        dropped_top = set()
        for name, node in _items(tree):
            if name in later:
                drop.update(range(_start(node) - 1, node.end_lineno))
                if "::" not in name:
                    dropped_top.add(name)
        for node in tree.body:  # e.g. instantiate_parametrized_tests(DroppedClass)
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
                    isinstance(n, ast.Name) and n.id in dropped_top for n in ast.walk(node)):
                drop.update(range(_start(node) - 1, node.end_lineno))
        for start in sorted(drop):  # and the blank lines before each removed definition
            i = start - 1
            while i >= 0 and i not in drop and not lines[i].strip():
                drop.add(i)
                i -= 1
        text = "".join(line for i, line in enumerate(lines) if i not in drop)
        try:
            ast.parse(text)
        except SyntaxError as e:
            raise DynapatchError(f"{self.path} as of its patch {index + 1} does not parse after removing "
                                 f"later patches' cases ({e}); give the class a case of its own or move the "
                                 f"cases into their own class", SERIES_INVALID) from e
        return text

    def first(self) -> int:
        return self.patches[0]


def shared_files(project: Project, patches: list[Patch]) -> dict[str, SharedFile]:
    """Every test file the series names, with its definitions assigned to patches."""
    files: dict[str, SharedFile] = {}
    for index, patch in enumerate(patches):
        for ref in test_refs(patch):
            source = project.root / ref.path
            if not source.is_file():
                raise DynapatchError(f"patch {patch.name} names test file {ref.path} (Tests:), which does not exist",
                                     SERIES_INVALID)
            if ref.path not in files:
                text = source.read_text()
                files[ref.path] = SharedFile(ref.path, text, [], {})
            shared = files[ref.path]
            if index not in shared.patches:
                shared.patches.append(index)
            if ref.selector is None:
                continue
            if shared.patches[0] == index:
                raise DynapatchError(f"patch {patch.name}: Tests: {ref.path}::{ref.selector} selects cases of a "
                                     f"file it introduces; name the whole file", SERIES_INVALID)
            names = [name for name, _ in _items(ast.parse(shared.text)) if fnmatch.fnmatchcase(name, ref.selector)]
            if not names:
                raise DynapatchError(f"patch {patch.name}: Tests: {ref.path}::{ref.selector} matches no test "
                                     f"class, function or method", SERIES_INVALID)
            for name in names:
                if shared.owner.get(name, index) != index:
                    raise DynapatchError(f"{ref.path}::{name} is selected by {patches[shared.owner[name]].name} "
                                         f"and {patch.name}", SERIES_INVALID)
                shared.owner[name] = index
    return files


def node_ids(shared: SharedFile, index: int) -> list[str]:
    """pytest node ids of the cases patch `index` ships in this file ([path] for its whole file)."""
    names = sorted(name for name, i in shared.owner.items() if i == index)
    if index == shared.first() or not names:  # named without selectors: the whole file as of this patch
        return [shared.path]
    # A selected method's class may be selected too: the class covers it.
    return [f"{shared.path}::{name}" for name in names
            if "::" not in name or shared.owner.get(name.split("::")[0]) != index]


# patches/pr-extra/<Patch-Name>.diff: a patch's changes to pytorch files the wheel does not
# hold (upstream tests whose expected counts it changes, e.g. test/dynamo/test_modules.py), as a
# git diff against the base tag's checkout. The wheel never sees them; export-prs puts them in
# that patch's PR and stack-test applies them to a checkout given with --pytorch-src.
PR_EXTRA_DIR = "pr-extra"


def pr_extra(project: Project, patch: Patch) -> Path | None:
    path = project.patches / PR_EXTRA_DIR / f"{patch.patch_name}.diff"
    return path if path.is_file() else None


def pr_extra_files(path: Path) -> list[str]:
    return sorted({line.split()[2][2:] for line in path.read_text().splitlines() if line.startswith("diff --git ")})


def check_pr_extra(project: Project, patches: list[Patch], pristine: Path | None) -> None:
    """Each pr-extra diff belongs to a patch (by Patch-Name) and only touches files the wheel lacks."""
    directory = project.patches / PR_EXTRA_DIR
    if not directory.is_dir():
        return
    names = {p.patch_name: p for p in patches}
    for path in sorted(directory.iterdir()):
        where = f"patches/{PR_EXTRA_DIR}/{path.name}"
        if path.suffix != ".diff" or path.stem not in names:
            raise DynapatchError(f"{where} is not <Patch-Name>.diff of a patch of the series", SERIES_INVALID)
        files = pr_extra_files(path)
        if not files:
            raise DynapatchError(f"{where} holds no `diff --git` section", SERIES_INVALID)
        for rel in files:
            if rel.startswith("torch/") and (pristine is None or (pristine / rel).exists()):
                raise DynapatchError(f"{where} changes {rel}, a file of the torch package: that change belongs "
                                     f"in patches/{names[path.stem].name} itself", SERIES_INVALID)


def case_count(shared: SharedFile, index: int) -> int:
    """How many test cases (test* methods of classes, top-level test* functions) patch `index` ships
    in this file: those it owns in the file as of that patch, counted once per definition (a
    parametrized case counts once)."""
    count = 0
    for name, node in _items(ast.parse(shared.text_at(index))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.name.startswith("test"):
            continue
        owner = shared.owner.get(name)
        if owner is None and "::" in name:
            owner = shared.owner.get(name.split("::")[0])
        if (shared.first() if owner is None else owner) == index:
            count += 1
    return count
