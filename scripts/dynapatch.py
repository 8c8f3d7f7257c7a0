#!/usr/bin/env python3
"""dynapatch: a Dynamo patch series against torch 2.13.0, turned into a custom wheel.

Subcommands:
  build    base wheel -> apply patches/series (zero fuzz) + torch_overlay/ -> build the
           C++ extension -> stamp version -> reproducible wheel in dist/ -> .venv/
  test     run test/ with pytest in .venv/ (building first if the wheel is stale)
  check    the series is valid and applies exactly to the pristine base
  devtree  a git tree of the pristine sources with one commit per patch, to edit
  refresh  export the devtree back into patches/ and torch_overlay/
  apply    apply the series and overlay onto an existing torch tree (--target DIR)
  export-prs      one git-am-able mbox per patch, each a PR description (OUTDIR)
  upstream-tests  Dynamo's own test files: stock base wheel vs the custom wheel
  rebase-check    per patch and hunk, does the series apply to another release (--to)
  stack-test      each prefix of the series passes the tests its last patch ships
  lint            ruff over torch_overlay/, scripts/, test/; clang-format check of csrc/

Exit codes: 0 success; 1 invalid series, bad input, failed step or (upstream-tests) a
regression; 2 a patch does not apply; otherwise pytest's own code (test).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dplib import devtree as devtree_mod  # noqa: E402
from dplib.base import fetch_base_wheel, installed_torch_version, load_base, pristine_sources  # noqa: E402
from dplib.common import DynapatchError, Project, die, log, python_exe, run, sha256_file  # noqa: E402
from dplib.ext import build_extension  # noqa: E402
from dplib import export as export_mod  # noqa: E402
from dplib import rebase as rebase_mod  # noqa: E402
from dplib import lint as lint_mod  # noqa: E402
from dplib import stacktest as stacktest_mod  # noqa: E402
from dplib import testsel as testsel_mod  # noqa: E402
from dplib import upstream_tests as upstream_mod  # noqa: E402
from dplib.targets import (check_overrides, fetch_release_wheel, override_versions, release_sources,  # noqa: E402
                           supported_versions, with_overrides)  # noqa: E402
from dplib.series import (apply_to_target, check_override_names, load_series, patched_sources,  # noqa: E402
                          series_digest)
from dplib.wheel import patched_wheel_name, repack, stamp_version_py  # noqa: E402

# Everything the wheel is made from: a change to any of these makes the wheel stale.
BUILD_INPUTS = ("patches", "torch_overlay", "csrc", "setup.py", "CMakeLists.txt",
                "requirements-build.txt", "requirements-test.txt", "scripts/dplib", "scripts/dynapatch.py")


def inputs_digest(project: Project) -> str:
    digest = hashlib.sha256()
    for entry in BUILD_INPUTS:
        path = project.root / entry
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if "__pycache__" in f.parts or not f.exists():
                continue
            digest.update(str(f.relative_to(project.root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def stamp_file(project: Project) -> Path:
    return project.build / "wheel.stamp"


def cmd_check(project: Project, args: argparse.Namespace) -> int:
    """Exit 0 if the series is valid and applies exactly; 1 invalid series; 2 does not apply."""
    spec = load_base(project)
    wheel = fetch_base_wheel(project, spec, args.base_wheel)
    pristine = pristine_sources(project, spec, wheel)
    patches = load_series(project, pristine)
    check_override_names(project, patches)  # before check_overrides: say which file to rename
    overrides = check_overrides(project, patches)
    upstream_mod.load_expected_changes(project)  # every entry names a patch of the series by Patch-Name
    if (project.root / "test").is_dir():  # a copy of the series alone has no tests to check
        testsel_mod.shared_files(project, patches)  # Tests: files exist, selectors select
    testsel_mod.check_pr_extra(project, patches, pristine)
    patched_sources(project, patches, pristine, project.build / "check")
    shutil.rmtree(project.build / "check", ignore_errors=True)
    log(f"check ok: {len(patches)} patches apply with zero fuzz and no offsets to torch {spec.version}"
        + (f"; {overrides} overrides for {', '.join(override_versions(project))} are valid "
           f"(rebase-check applies them)" if overrides else ""))
    return 0


def cmd_build(project: Project, args: argparse.Namespace) -> int:
    started = time.monotonic()
    spec = load_base(project)
    # A failed build must not leave a wheel that looks current.
    for old in project.dist.glob("torch-*.whl"):
        old.unlink()
    stamp_file(project).unlink(missing_ok=True)
    wheel = fetch_base_wheel(project, spec, args.base_wheel)
    pristine = pristine_sources(project, spec, wheel)
    patches = load_series(project, pristine)
    log(f"applying {len(patches)} patches")
    stage = project.build / "stage"
    changed = patched_sources(project, patches, pristine, stage)
    staged = {rel: (stage / rel).read_bytes() for rel in changed}
    series_sha = series_digest(project, patches)
    with open(pristine / "torch" / "version.py") as f:
        staged["torch/version.py"] = stamp_version_py(f.read(), spec, series_sha).encode()
    log("building the C++ extension")
    ext_name, ext_bytes = build_extension(project, spec, wheel)
    staged[ext_name] = ext_bytes
    project.dist.mkdir(exist_ok=True)
    out = project.dist / patched_wheel_name(spec)
    log(f"repacking into {out.name}")
    repack(wheel, out, spec, staged)
    wheel_sha = sha256_file(out)
    stamp_file(project).write_text(f"{inputs_digest(project)} {out.name} {wheel_sha}\n")
    log(f"built {out} sha256 {wheel_sha} in {time.monotonic() - started:.0f} s")
    if not args.no_venv:
        make_venv(project, out, wheel_sha)
    return 0


def make_venv(project: Project, wheel: Path, wheel_sha: str) -> None:
    """.venv with the custom wheel and the test dependencies; reinstalls torch only when the wheel changed."""
    marker = project.venv / "dynapatch-wheel.sha256"
    if marker.is_file() and marker.read_text().strip() == wheel_sha:
        log(f".venv already has {wheel.name}")
        return
    py = python_exe(project.venv)
    if not py.exists():
        run(["python3", "-m", "venv", project.venv])
        run([py, "-m", "pip", "install", "--quiet", "-r", project.root / "requirements-test.txt", wheel])
    else:
        run([py, "-m", "pip", "install", "--quiet", "-r", project.root / "requirements-test.txt"])
        run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", wheel])
    marker.write_text(wheel_sha + "\n")
    version = run([py, "-c", "import torch; print(torch.__version__)"], capture=True).stdout.strip()
    log(f".venv ready: torch {version}")


def wheel_is_current(project: Project) -> bool:
    stamp = stamp_file(project)
    if not stamp.is_file():
        return False
    digest, name, wheel_sha = stamp.read_text().split()
    wheel = project.dist / name
    marker = project.venv / "dynapatch-wheel.sha256"
    return (digest == inputs_digest(project) and wheel.is_file()
            and marker.is_file() and marker.read_text().strip() == wheel_sha)


def cmd_test(project: Project, args: argparse.Namespace) -> int:
    if not wheel_is_current(project):
        log("wheel or .venv missing or stale: building first")
        args.no_venv = False
        cmd_build(project, args)
    started = time.monotonic()
    cmd = [python_exe(project.venv), "-m", "pytest", "-p", "no:cacheprovider", *(args.pytest_args or ["test"])]
    log("$ " + " ".join(map(str, cmd)))
    # Toolchain tests reuse this run's cache (base wheel, pristine sources, stock venv).
    env = {**os.environ, "DYNAPATCH_CACHE_DIR": str(project.cache)}
    rc = subprocess.call([str(c) for c in cmd], cwd=project.root, env=env)
    log(f"pytest exit {rc} after {time.monotonic() - started:.0f} s")
    if rc == 5:
        log("pytest collected no tests: that is a failure")
    return rc


def devtree_dir(project: Project, args: argparse.Namespace) -> Path:
    return args.dir if args.dir.is_absolute() else project.root / args.dir


def cmd_devtree(project: Project, args: argparse.Namespace) -> int:
    spec = load_base(project)
    wheel = fetch_base_wheel(project, spec, args.base_wheel)
    pristine = pristine_sources(project, spec, wheel)
    devtree_mod.make_devtree(project, spec, pristine, devtree_dir(project, args), args.force)
    return 0


def cmd_refresh(project: Project, args: argparse.Namespace) -> int:
    devtree_mod.refresh(project, devtree_dir(project, args))
    return 0


def resolve_target(target: Path) -> Path:
    """The directory holding torch/: a source checkout, a site-packages dir, or a venv."""
    if (target / "torch" / "_dynamo").is_dir():
        return target
    for site in sorted(target.glob("lib/python3*/site-packages")):
        if (site / "torch" / "_dynamo").is_dir():
            return site
    raise DynapatchError(f"{target} holds no torch/_dynamo (expected a pytorch checkout, site-packages or a venv)")


def cmd_apply(project: Project, args: argparse.Namespace) -> int:
    root = resolve_target(args.target.resolve())
    version = installed_torch_version(root)
    supported = supported_versions(project)
    if version is None or version.split("+")[0] not in supported:
        raise DynapatchError(f"{root} holds torch {version}, but the series is for torch "
                             f"{' or '.join(supported)} (patches/BASE, patches/<version>/ overrides)")
    patches = load_series(project)
    check_overrides(project, patches)
    patches, overridden = with_overrides(project, patches, version.split("+")[0])
    changed = apply_to_target(project, patches, root)
    log(f"applied {len(patches)} patches ({len(changed)} files) to {root}"
        + (f"; from patches/{version.split('+')[0]}/: {', '.join(overridden)}" if overridden else ""))
    log("the C++ extension is not built by apply; features fall back to stock guards without it")
    return 0


def cmd_export_prs(project: Project, args: argparse.Namespace) -> int:
    """Exit 0 with OUTDIR holding one mbox per patch; 1 bad input; 2 a patch does not apply to the base."""
    spec = load_base(project)
    args.base_ref = args.base_ref or f"v{spec.public_version}"
    match = export_mod.TAG_RE.match(args.base_ref)
    if not match:
        raise DynapatchError(f"--base-ref {args.base_ref} is not a release tag like v{spec.public_version}")
    version = match.group(1)
    patches = load_series(project)
    check_overrides(project, patches)
    if version == spec.public_version:
        tree = pristine_sources(project, spec, fetch_base_wheel(project, spec, args.base_wheel))
    elif version in override_versions(project):
        tree = release_sources(project, fetch_release_wheel(project, version))
        patches, _ = with_overrides(project, patches, version)
    else:
        raise DynapatchError(f"the series targets torch {' or '.join(supported_versions(project))}, "
                             f"not {args.base_ref}")
    export_mod.export_prs(project, patches, tree, args.outdir.resolve(), args.base_ref,
                          allow_offsets=version != spec.public_version)
    return 0


def cmd_upstream_tests(project: Project, args: argparse.Namespace) -> int:
    """Exit 0 if no Dynamo test that passes with the stock wheel fails with the custom one, except the
    reviewed changes in patches/upstream-expected-changes; 1 otherwise."""
    spec = load_base(project)
    expected_changes = upstream_mod.load_expected_changes(project)
    pytorch_src = args.pytorch_src.resolve()
    _, files = upstream_mod.select_files(pytorch_src, args.files)
    wheel = fetch_base_wheel(project, spec, args.base_wheel)
    stock = upstream_mod.stock_venv(project, wheel, spec.sha256)
    if args.patched_venv is None:
        if not wheel_is_current(project):
            log("wheel or .venv missing or stale: building first")
            args.no_venv = False
            cmd_build(project, args)
        patched = project.venv
    else:
        patched = args.patched_venv.resolve()
    for label, venv, expected in (("stock", stock, spec.version), ("patched", patched, spec.patched_version)):
        version = run([python_exe(venv), "-c", "import torch; print(torch.__version__)"],
                      capture=True, cwd=project.cache).stdout.split()[-1]
        if version != expected:
            raise DynapatchError(f"the {label} env {venv} has torch {version}, expected {expected}")
    out = (args.junit_dir or project.build / "upstream-tests").resolve()
    comparison = upstream_mod.run_upstream_tests(pytorch_src, files, stock, patched, out, args.timeout,
                                                 expected_changes)
    unexpected = comparison.unexpected_regressions()
    if unexpected:
        raise DynapatchError(f"{len(unexpected)} upstream tests regress with the custom wheel "
                             f"(listed above)")
    expected_seen = len(comparison.regressions) - len(unexpected)
    log("upstream-tests ok: no regressions"
        + (f" besides {expected_seen} reviewed expected changes" if expected_seen else ""))
    return 0


def cmd_rebase_check(project: Project, args: argparse.Namespace) -> int:
    """Exit 0 if the series (with patches/<version>/ overrides) applies to torch <version>; 2 if not."""
    patches = load_series(project)
    check_overrides(project, patches)
    wheel = fetch_release_wheel(project, args.to, args.wheel)
    target = release_sources(project, wheel, cached=args.wheel is None)
    effective, overridden = with_overrides(project, patches, args.to)
    tables = [("series as is", patches, set())]
    if overridden:
        tables.append((f"with overrides from patches/{args.to}/", effective, set(overridden)))
    for title, series, used in tables:
        results = rebase_mod.rebase_check(project, series, used, target)
        print(f"\n{title}:\n{rebase_mod.format_table(results, args.to)}\n", flush=True)
    failures = rebase_mod.failed(results)
    if failures:
        raise DynapatchError(f"{len(failures)} of {len(patches)} patches do not apply to torch {args.to}: "
                             f"{', '.join(r.name for r in failures)}", 2)
    log(f"rebase-check ok: all {len(patches)} patches apply to torch {args.to}"
        + (f" ({len(overridden)} through overrides)" if overridden else ""))
    return 0


def select_prefixes(patches: list, wanted: list[str] | None) -> list[int]:
    """Indices of the prefixes to test: all, or the ones ending in the named patches."""
    if not wanted:
        return list(range(len(patches)))
    indices = []
    for name in wanted:
        matches = [i for i, p in enumerate(patches)
                   if name in (p.patch_name, p.name, p.name.split("-", 1)[0])]
        if not matches:
            raise DynapatchError(f"--patch {name}: no patch of the series has that Patch-Name, file name or number")
        indices += matches
    return sorted(set(indices))


def cmd_stack_test(project: Project, args: argparse.Namespace) -> int:
    """Exit 0 if every tested prefix passes the tests its last patch ships; 1 otherwise."""
    spec = load_base(project)
    wheel = fetch_base_wheel(project, spec, args.base_wheel)
    pristine = pristine_sources(project, spec, wheel)
    patches = load_series(project, pristine)
    indices = [len(patches) - 1] if args.last else select_prefixes(patches, args.patch)
    results = stacktest_mod.stack_test(project, spec, wheel, pristine, patches, indices, args.timeout)
    print("\n" + stacktest_mod.format_table(results, len(patches)) + "\n", flush=True)
    failing = [r for r in results if not r.ok]
    if failing:
        first = failing[0]
        raise DynapatchError(f"{len(failing)} of {len(results)} prefixes fail their own tests; the first is "
                             f"{first.index + 1}/{len(patches)} {first.patch.name} ({first.patch.patch_name})")
    log(f"stack-test ok: {len(results)} prefixes pass the tests their last patch ships")
    return 0


def cmd_lint(project: Project, args: argparse.Namespace) -> int:
    """Exit 0 if ruff finds nothing (and, with --strict-native, csrc/ is clang-formatted); 1 otherwise."""
    lint_mod.lint(project, args.strict_native)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dynapatch.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the dynapatch checkout (default: the one holding this script)")
    parser.add_argument("--cache-dir", type=Path, help="where base wheel extracts are kept (default: build/cache)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (("build", cmd_build), ("test", cmd_test), ("check", cmd_check), ("devtree", cmd_devtree)):
        p = sub.add_parser(name)
        p.set_defaults(func=func)
        p.add_argument("--base-wheel", type=Path, help="use this base wheel file instead of pip download")
        if name == "build":
            p.add_argument("--no-venv", action="store_true", help="only build the wheel")
        if name == "test":
            p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="arguments for pytest (default: test)")
        if name == "devtree":
            p.add_argument("--dir", type=Path, default=Path("build/devtree"))
            p.add_argument("--force", action="store_true", help="recreate an existing devtree")
    p = sub.add_parser("refresh")
    p.set_defaults(func=cmd_refresh)
    p.add_argument("--dir", type=Path, default=Path("build/devtree"))
    p = sub.add_parser("apply")
    p.set_defaults(func=cmd_apply)
    p.add_argument("--target", type=Path, required=True)
    p = sub.add_parser("export-prs", help="one git-am-able mbox per patch, written as a PR description")
    p.set_defaults(func=cmd_export_prs)
    p.add_argument("outdir", type=Path, metavar="OUTDIR")
    p.add_argument("--base-ref", default=None, help="the pytorch tag the stack applies to (default: v<BASE version>)")
    p.add_argument("--base-wheel", type=Path, help="use this base wheel file instead of pip download")
    p = sub.add_parser("upstream-tests", help="Dynamo's own tests: stock base wheel vs the custom wheel")
    p.set_defaults(func=cmd_upstream_tests)
    p.add_argument("--pytorch-src", type=Path, required=True, help="a pytorch checkout at the base's tag")
    p.add_argument("--files", nargs="+", help="test/dynamo/ files to run (default: %s)"
                   % " ".join(upstream_mod.DEFAULT_FILES))
    p.add_argument("--patched-venv", type=Path, help="a venv with the custom wheel (default: .venv, built if stale)")
    p.add_argument("--junit-dir", type=Path, help="where the junit xml goes (default: build/upstream-tests)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per test file and env (default 3600)")
    p.add_argument("--base-wheel", type=Path, help="use this base wheel file instead of pip download")
    p = sub.add_parser("rebase-check", help="does the series apply to another torch release?")
    p.set_defaults(func=cmd_rebase_check)
    p.add_argument("--to", required=True, metavar="VERSION", help="torch release, e.g. 2.14.1")
    p.add_argument("--wheel", type=Path, help="use this wheel of that release instead of pip download")
    p = sub.add_parser("stack-test", help="each prefix of the series passes the tests its last patch ships")
    p.set_defaults(func=cmd_stack_test)
    p.add_argument("--patch", action="append", metavar="NAME",
                   help="only the prefix ending in this patch (Patch-Name, file name or number; repeatable)")
    p.add_argument("--last", action="store_true", help="only the whole series (what CI runs)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per prefix (default 3600)")
    p.add_argument("--base-wheel", type=Path, help="use this base wheel file instead of pip download")
    p = sub.add_parser("lint", help="ruff (ruff.toml) and a clang-format check of csrc/ (.clang-format)")
    p.set_defaults(func=cmd_lint)
    p.add_argument("--strict-native", action="store_true", help="fail when csrc/ differs from .clang-format")
    args = parser.parse_args(argv)
    project = Project.at(args.project, args.cache_dir)
    try:
        project.cache.mkdir(parents=True, exist_ok=True)
        return args.func(project, args)
    except DynapatchError as e:
        die(e)


if __name__ == "__main__":
    sys.exit(main())
