#!/usr/bin/env python3
"""dynapatch: a Dynamo patch series against a torch release (patches/BASE), turned into a custom wheel.

Subcommands:
  build    base wheel (cpu or cuda variant) -> apply patches/series (zero fuzz) + torch_overlay/
           -> build the C++ extension -> stamp version -> reproducible wheel in dist/ -> .venv/;
           a no-op when nothing changed; a failed build leaves the last wheel in place
  test     run pytest in .venv/ (default test/; other arguments go to pytest; --quick),
           building first if the wheel is stale
  info     what a custom wheel holds (series, sha256s, dynapatch commit)
  check    the series is valid and applies exactly to the pristine base
  devtree  a git tree of the pristine sources with one commit per patch, to edit
  refresh  export the devtree back into patches/ and torch_overlay/
  apply    apply the series and overlay onto an existing torch tree (--target DIR)
  unapply  undo apply, byte for byte (--target DIR)
  export-prs      one git-am-able mbox per patch, each a PR description (OUTDIR)
  upstream-tests  Dynamo's own test files: stock base wheel vs the custom wheel
  rebase-check    per patch and hunk, does the series apply to another release (--to), and
                  what a refresh would change (three-way merge; refreshed patches in build/)
  stack-test      each prefix of the series passes the tests its last patch ships
  stats           per patch: upstream lines +/-, overlay and native lines, test cases
  lint            ruff over torch_overlay/, scripts/, test/; clang-format check of csrc/

Each step prints a line when it starts and its time when it ends; -v shows the commands
and pip's, cmake's and the compiler's own output. Run `dynapatch.py COMMAND --help`.

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
import zipfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dplib import (
    common,
    devtree as devtree_mod,
    export as export_mod,
    lint as lint_mod,
    rebase as rebase_mod,
    stacktest as stacktest_mod,
    stats as stats_mod,
    testsel as testsel_mod,
    upstream_tests as upstream_mod,
)
from dplib.base import (
    base_variants,
    BaseSpec,
    check_unpinned_sources,
    default_python_tag,
    default_variant,
    fetch_base_wheel,
    installed_torch_version,
    load_base,
    pristine_sources,
    unpinned_version,
    variant_of_wheel,
)
from dplib.common import (
    die,
    DynapatchError,
    git,
    log,
    PINNED_TORCH_PIP_ENV,
    pip_quiet,
    Project,
    python_exe,
    run,
    sha256_file,
    step,
)
from dplib.ext import build_extension, check_toolchain
from dplib.interp import Interpreter, resolve_interpreter
from dplib.series import check_override_names, load_series, patched_sources, series_digest
from dplib.targets import (
    apply_recorded,
    apply_state,
    check_overrides,
    fetch_release_wheel,
    override_versions,
    record_dir,
    release_sources,
    supported_versions,
    unapply_recorded,
    with_overrides,
)
from dplib.wheel import (
    describe_record,
    patched_wheel_name,
    read_record,
    RECORD_MODULE,
    record_module,
    repack,
    stamp_version_py,
)

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


def stamp_file(project: Project, python_tag: str | None = None) -> Path:
    """build/wheel.stamp for the Python of patches/BASE's first block, build/wheel-<tag>.stamp for another."""
    if python_tag is None or python_tag == default_python_tag(project):
        return project.build / "wheel.stamp"
    return project.build / f"wheel-{python_tag}.stamp"


def venv_dir(project: Project, python_tag: str | None = None) -> Path:
    """.venv for the Python of patches/BASE's first block, .venv-<tag> (e.g. .venv-cp312) for another."""
    if python_tag is None or python_tag == default_python_tag(project):
        return project.venv
    return project.root / f".venv-{python_tag}"


@dataclass(frozen=True)
class Stamp:
    """What the last successful build for one Python made: from which inputs, which wheel, which variant."""

    digest: str
    wheel: str
    wheel_sha256: str
    variant: str
    python_tag: str = ""


def read_stamp(project: Project, python_tag: str | None = None) -> Stamp | None:
    stamp = stamp_file(project, python_tag)
    fields = stamp.read_text().split() if stamp.is_file() else []
    if len(fields) == 4:  # written before stamps named their Python: the default one
        fields.append(default_python_tag(project))
    return Stamp(*fields) if len(fields) == 5 else None


def write_stamp(project: Project, stamp: Stamp) -> None:
    final = stamp_file(project, stamp.python_tag)
    tmp = final.with_name(final.name + ".partial")
    tmp.write_text(f"{stamp.digest} {stamp.wheel} {stamp.wheel_sha256} {stamp.variant} {stamp.python_tag}\n")
    os.replace(tmp, final)


def dynapatch_commit(project: Project) -> str:
    """The checkout's commit, `+dirty` if a build input differs from it."""
    if not (project.root / ".git").exists():
        return "unknown (not a git checkout)"
    try:
        head = git(["rev-parse", "HEAD"], project.root).strip()
        dirty = git(["status", "--porcelain", "--", *BUILD_INPUTS], project.root).strip()
    except DynapatchError:
        return "unknown"
    return head + ("+dirty" if dirty else "")


def select_base(project: Project, args: argparse.Namespace, python: Interpreter) -> tuple[BaseSpec, Path]:
    """The base wheel to build from: --base-wheel F (any pinned variant, or an unpinned CPU build of the
    release), --variant, or the variant `pip download torch==<version>` gives here, for the interpreter
    `python`. Verified against patches/BASE: by sha256, or for an unpinned CPU build by version and sources."""
    if args.base_wheel is not None:
        spec = variant_of_wheel(project, args.base_wheel)
        if args.variant and args.variant != spec.variant:
            raise DynapatchError(f"--base-wheel {args.base_wheel.name} is the {spec.variant} variant, "
                                 f"not {args.variant}")
        if spec.python_tag != python.tag:
            raise DynapatchError(f"--base-wheel {args.base_wheel.name} is a {spec.python_tag} wheel, but the "
                                 f"interpreter {python.executable} is Python {python.version} ({python.tag}); "
                                 f"pass --python for that wheel's Python")
        if not spec.pinned:
            pinned = load_base(project, python_tag=python.tag)
            log(f"base: {args.base_wheel.name} is not pinned in patches/BASE (a CPU build of torch "
                f"{spec.public_version}, sha256 {spec.sha256}); comparing its Python sources with the pinned "
                f"{pinned.wheel}")
            check_unpinned_sources(project, spec, args.base_wheel, pinned,
                                   fetch_base_wheel(project, pinned, python=python.executable))
        return spec, args.base_wheel
    if args.variant:
        spec = load_base(project, args.variant, python.tag)
    else:
        spec = default_variant(project, python.executable, python.tag)
    return spec, fetch_base_wheel(project, spec, python=python.executable)


def build_is_noop(project: Project, args: argparse.Namespace, python: Interpreter) -> Stamp | None:
    """The last build's stamp for this Python if it is what this build would make: same inputs, the
    wheel in dist/ intact, the same variant (asked for, or of --base-wheel; without either, the last one)."""
    stamp = read_stamp(project, python.tag)
    if stamp is None or args.force or stamp.digest != inputs_digest(project):
        return None
    wheel = project.dist / stamp.wheel
    if not wheel.is_file() or sha256_file(wheel) != stamp.wheel_sha256:
        return None
    if args.base_wheel is None:
        return stamp if (args.variant or stamp.variant) == stamp.variant else None
    # --base-wheel: the wheel in dist/ must be built from that very file (an unpinned CPU build
    # has no block: its variant alone does not say which file).
    spec = variant_of_wheel(project, args.base_wheel)
    with zipfile.ZipFile(wheel) as zf:
        built_from = (read_record(zf.read(RECORD_MODULE).decode()).get("base_sha256")
                      if RECORD_MODULE in zf.namelist() else None)
    return stamp if (spec.variant, spec.sha256) == (stamp.variant, built_from) else None


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


def wheel_record(project: Project, spec: BaseSpec, patches: list, series_sha: str) -> dict:
    """What the custom wheel records of itself (torch/_dynamo/dynapatch.py, `info`): its base wheel
    by sha256 (pinned in patches/BASE or not), the dynapatch commit, the series."""
    return {
        "version": spec.patched_version, "variant": spec.variant, "base_wheel": spec.wheel,
        "base_sha256": spec.sha256, "base_pinned": spec.pinned, "commit": dynapatch_commit(project),
        "series_sha256": series_sha,
        "patches": [{"name": p.name, "sha256": sha256_file(p.path)} for p in patches],
    }


def cmd_build(project: Project, args: argparse.Namespace) -> int:
    """Exit 0 with the custom wheel in dist/ (and .venv/); 1 bad input or failed step; 2 a patch does not apply.

    Nothing in dist/, build/wheel.stamp or .venv/ changes until every input is verified and the
    new wheel is complete: a failed build leaves the last good wheel in place.
    """
    started = time.monotonic()
    python = resolve_interpreter(getattr(args, "python", None))
    stamp = build_is_noop(project, args, python)
    if stamp is not None:
        log(f"nothing changed since the last build: dist/{stamp.wheel} is current "
            f"(sha256 {stamp.wheel_sha256}, {stamp.variant} variant, {stamp.python_tag}); --force rebuilds")
        if not args.no_venv:
            make_venv(project, project.dist / stamp.wheel, stamp.wheel_sha256, python)
        return 0
    with step(f"base wheel for Python {python.version}: choose, download if needed, verify sha256"):
        spec, wheel = select_base(project, args, python)
        log(f"base: {wheel.name} ({spec.variant} variant{'' if spec.pinned else ', not pinned'}, "
            f"torch {spec.base_torch_version}, {spec.python_tag})")
    with step(f"checking the toolchain (C++ compiler, cmake, ninja; Python {python.version})"):
        tools = check_toolchain(project, python)
    pristine = pristine_sources(project, spec, wheel)
    patches = load_series(project, pristine)
    stage = project.build / "stage"
    with step(f"applying {len(patches)} patches and the overlay"):
        changed = patched_sources(project, patches, pristine, stage)
    if RECORD_MODULE in changed or (pristine / RECORD_MODULE).exists():
        raise DynapatchError(f"{RECORD_MODULE} is written by build (what the wheel holds); "
                             f"no patch or overlay file may add it")
    staged = {rel: (stage / rel).read_bytes() for rel in changed}
    series_sha = series_digest(project, patches)
    with open(pristine / "torch" / "version.py") as f:
        staged["torch/version.py"] = stamp_version_py(f.read(), spec, series_sha).encode()
    staged[RECORD_MODULE] = record_module(wheel_record(project, spec, patches, series_sha)).encode()
    with step("building the C++ extension"):
        ext_name, ext_bytes = build_extension(project, spec, wheel, tools)
    staged[ext_name] = ext_bytes
    project.dist.mkdir(exist_ok=True)
    out = project.dist / patched_wheel_name(spec)
    with step(f"repacking into dist/{out.name}"):
        repack(wheel, out, spec, staged)  # written as .partial, renamed when complete
    wheel_sha = sha256_file(out)
    write_stamp(project, Stamp(inputs_digest(project), out.name, wheel_sha, spec.variant, spec.python_tag))
    # Older wheels of this variant and Python (another series) would be mistaken for this one.
    prefix = f"torch-{spec.public_version}+{spec.label}.{spec.local_label}."
    for old in project.dist.glob("torch-*.whl"):
        if old != out and old.name.startswith(prefix) and old.name.split("-")[2] == spec.python_tag:
            old.unlink()
    log(f"built dist/{out.name} sha256 {wheel_sha} in {time.monotonic() - started:.0f} s")
    if not args.no_venv:
        make_venv(project, out, wheel_sha, python)
    return 0


def make_venv(project: Project, wheel: Path, wheel_sha: str, python: Interpreter) -> None:
    """.venv (.venv-<tag> for another Python) with the custom wheel and the test dependencies;
    reinstalls torch only when the wheel changed."""
    venv = venv_dir(project, python.tag)
    marker = venv / "dynapatch-wheel.sha256"
    if marker.is_file() and marker.read_text().strip() == wheel_sha:
        log(f"{venv.name} already has {wheel.name}")
        return
    py = python_exe(venv)
    with step(f"{venv.name}: installing {wheel.name}" + ("" if py.exists() else " and requirements-test.txt")):
        marker.unlink(missing_ok=True)  # written again once torch imports: a broken venv is never "ready"
        if not py.exists():
            run([python.executable, "-m", "venv", venv])
            run([py, "-m", "pip", "install", *pip_quiet(), "-r", project.root / "requirements-test.txt", wheel],
                quiet=True, env=PINNED_TORCH_PIP_ENV)
        else:
            same_version = venv_torch_version(py) == wheel.name.split("-")[1]
            # With the wheel's dependencies: another base (the release or variant the venv had before)
            # has others, e.g. a CUDA build's nvidia-* libraries after a CPU build.
            run([py, "-m", "pip", "install", *pip_quiet(), "-r", project.root / "requirements-test.txt", wheel],
                quiet=True, env=PINNED_TORCH_PIP_ENV)
            if same_version:  # the same version with other bytes: pip keeps an installed version
                run([py, "-m", "pip", "install", *pip_quiet(), "--no-deps", "--force-reinstall", wheel], quiet=True,
                    env=PINNED_TORCH_PIP_ENV)
        version = run([py, "-c", "import torch; print(torch.__version__)"], capture=True).stdout.strip()
        marker.write_text(wheel_sha + "\n")
    log(f"{venv.name} ready: torch {version}")


def venv_torch_version(py: Path) -> str | None:
    """The version of the torch distribution installed in the venv of `py`, None without one."""
    proc = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def wheel_is_current(project: Project, python_tag: str | None = None) -> bool:
    stamp = read_stamp(project, python_tag)
    if stamp is None:
        return False
    marker = venv_dir(project, python_tag) / "dynapatch-wheel.sha256"
    return (stamp.digest == inputs_digest(project) and (project.dist / stamp.wheel).is_file()
            and marker.is_file() and marker.read_text().strip() == stamp.wheel_sha256)


# `test --quick`: the feature tests without the long ones (the toolchain's builds, the fuzzer,
# every torch.optim optimizer); a few minutes instead of the full run.
QUICK_IGNORE = ("test/tools/test_dynapatch_cli.py", "test/tools/test_upstream_workflow.py",
                "test/tools/test_benchmarks.py", "test/dynamo/test_differential_fuzz.py",
                "test/dynamo/test_optimizers_all.py")


def pytest_args(project: Project, args: argparse.Namespace) -> list[str]:
    """The user's pytest arguments, with test/ added unless one of them names a path."""
    extra = list(args.pytest_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    names_path = any(not a.startswith("-") and (project.root / a.split("::", 1)[0]).exists() for a in extra)
    ignore = [f"--ignore={f}" for f in QUICK_IGNORE] if args.quick else []
    return [*extra, *ignore] + ([] if names_path else ["test"])


def cmd_test(project: Project, args: argparse.Namespace) -> int:
    """pytest's exit code (5, no tests collected, counts as a failure); 1 if the build fails."""
    python = resolve_interpreter(args.python)
    venv = venv_dir(project, python.tag)
    if not wheel_is_current(project, python.tag):
        log(f"wheel or {venv.name} missing or stale: building first")
        last = read_stamp(project, python.tag)
        args.no_venv, args.force, args.base_wheel = False, False, getattr(args, "base_wheel", None)
        if args.base_wheel is None:  # --base-wheel says which variant
            args.variant = getattr(args, "variant", None) or (last.variant if last else None)
        cmd_build(project, args)
    started = time.monotonic()
    cmd = [python_exe(venv), "-m", "pytest", "-p", "no:cacheprovider", *pytest_args(project, args)]
    log("$ " + " ".join(map(str, cmd)))
    # Toolchain tests reuse this run's cache (base wheel, pristine sources, stock venv).
    env = {**os.environ, "DYNAPATCH_CACHE_DIR": str(project.cache)}
    rc = subprocess.call([str(c) for c in cmd], cwd=project.root, env=env)
    log(f"pytest exit {rc} after {time.monotonic() - started:.0f} s")
    if rc == 5:
        log("pytest collected no tests: that is a failure")
    return rc


def cmd_info(project: Project, args: argparse.Namespace) -> int:
    """What a custom wheel holds: variant, base wheel, dynapatch commit, each patch's name and sha256."""
    if args.wheel is None:
        stamp = read_stamp(project)
        if stamp is None or not (project.dist / stamp.wheel).is_file():
            raise DynapatchError("no built wheel in dist/ (run build, or pass --wheel F)")
        args.wheel = project.dist / stamp.wheel
    if not zipfile.is_zipfile(args.wheel):
        raise DynapatchError(f"{args.wheel} is not a wheel")
    with zipfile.ZipFile(args.wheel) as zf:
        if RECORD_MODULE not in zf.namelist():
            raise DynapatchError(f"{args.wheel.name} holds no {RECORD_MODULE}: not a dynapatch wheel "
                                 f"(or one built before wheels recorded their series)")
        source = zf.read(RECORD_MODULE).decode()
    print(f"{args.wheel.name}\n{describe_record(source)}", flush=True)
    return 0


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
    """Exit 0 applied (or already applied: nothing done); 1 bad target; 2 a patch does not apply."""
    root = resolve_target(args.target.resolve())
    version = installed_torch_version(root)
    supported = supported_versions(project)
    if version is None or version.split("+")[0] not in supported:
        raise DynapatchError(f"{root} holds torch {version}, but the series is for torch "
                             f"{' or '.join(supported)} (patches/BASE, patches/<version>/ overrides)")
    patches = load_series(project)
    check_overrides(project, patches)
    patches, overridden = with_overrides(project, patches, version.split("+")[0])
    done = apply_state(project, patches, root)
    if done is not None:
        log(f"already applied to {root}: {done}; nothing to do (unapply --target restores it)")
        return 0
    changed = apply_recorded(project, patches, root, series_digest(project, patches))
    log(f"applied {len(patches)} patches ({len(changed)} files) to {root}"
        + (f"; from patches/{version.split('+')[0]}/: {', '.join(overridden)}" if overridden else ""))
    log(f"what changed is recorded in {record_dir(root)}: `unapply --target {args.target}` restores it")
    log("the C++ extension is not built by apply; features fall back to stock guards without it")
    return 0


def cmd_unapply(project: Project, args: argparse.Namespace) -> int:
    """Exit 0 with the target restored byte for byte; 1 no record, or a file changed since apply."""
    root = resolve_target(args.target.resolve())
    restored = unapply_recorded(root, force=args.force)
    log(f"restored {root}: {restored} files as they were before apply")
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
    mboxes = export_mod.export_prs(project, patches, tree, args.outdir.resolve(), args.base_ref,
                                   allow_offsets=version != spec.public_version)
    if not args.verify:
        return 0
    if version != spec.public_version:
        raise DynapatchError(f"--verify runs the PRs' tests on the base wheel (v{spec.public_version}), "
                             f"not on {args.base_ref}")
    wheel = fetch_base_wheel(project, spec, args.base_wheel)
    results = export_mod.verify_prs(project, spec, wheel, tree, patches, mboxes,
                                    select_prefixes(patches, args.patch), args.timeout)
    print("\n" + stacktest_mod.format_table(results, len(patches)) + "\n", flush=True)
    failing = [r for r in results if not r.ok]
    if failing:
        first = failing[0]
        raise DynapatchError(f"{len(failing)} of {len(results)} PRs fail their own tests when applied with "
                             f"git am; the first is {first.index + 1}/{len(patches)} {first.patch.name} "
                             f"({first.patch.patch_name}): {first.error or 'tests fail'}")
    log(f"export-prs --verify ok: {len(results)} PRs, applied with git am onto the base's sources, pass "
        f"their own tests")
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
            # cmd_build reads build options upstream-tests does not take: build the last variant.
            args.force, args.python = False, None
            args.variant = read_stamp(project).variant if read_stamp(project) else None
            cmd_build(project, args)
        patched = project.venv
    else:
        patched = args.patched_venv.resolve()
    # torch.__version__ of the stock wheel is its version.py's (2.15.0+cu132 for PyPI's 2.15.0).
    for label, venv, expected in (("stock", stock, spec.base_torch_version),
                                  ("patched", patched, spec.patched_version)):
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
    """Exit 0 if every patch refreshes onto torch <version> without conflicts (applies as it is, at
    offsets, or by a clean three-way merge); 2 if not."""
    patches = load_series(project)
    check_overrides(project, patches)
    spec = load_base(project)
    base = pristine_sources(project, spec, fetch_base_wheel(project, spec, args.base_wheel))
    wheel = fetch_release_wheel(project, args.to, args.wheel)
    target = release_sources(project, wheel, cached=args.wheel is None)
    effective, overridden = with_overrides(project, patches, args.to)
    out = (args.out or project.build / f"rebase-{args.to}").resolve()
    tables = [("series as is", patches, set(), out)]
    if overridden:
        tables.append((f"with overrides from patches/{args.to}/", effective, set(overridden), out / "overrides"))
    for title, series, used, where in tables:
        # Overrides are refreshed against the release itself: no merge base on the pinned one.
        results = rebase_mod.rebase_check(project, series, used, target, None if used else base, where)
        print(f"\n{title}:\n{rebase_mod.format_table(results, args.to)}\n", flush=True)
        log(f"refreshed patches and conflicts: {where}")
    counts = {s: sum(r.status == s for r in results) for s in
              (rebase_mod.CLEAN, rebase_mod.OFFSETS, rebase_mod.MERGES, rebase_mod.CONFLICT)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    failures = rebase_mod.failed(results)
    if failures:
        raise DynapatchError(f"{len(failures)} of {len(patches)} patches conflict with torch {args.to} "
                             f"({summary}): {', '.join(r.name for r in failures)}", 2)
    log(f"rebase-check ok: all {len(patches)} patches refresh onto torch {args.to} without conflicts ({summary})"
        + (f"; {len(overridden)} through overrides" if overridden else ""))
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


def cmd_stats(project: Project, args: argparse.Namespace) -> int:
    """Exit 0 after printing the per-patch table; 1 if the series is invalid."""
    patches = load_series(project)
    print(stats_mod.format_table(stats_mod.patch_stats(project, patches)), flush=True)
    return 0


def cmd_lint(project: Project, args: argparse.Namespace) -> int:
    """Exit 0 if ruff finds nothing and csrc/ is clang-formatted; 1 otherwise."""
    lint_mod.lint(project)
    return 0


def version_text(project: Project) -> str:
    variants = ", ".join(f"{v.variant} {v.python_tag} ({v.wheel})" for v in base_variants(project))
    return (f"dynapatch.py {dynapatch_commit(project)}\nbase torch {load_base(project).public_version}: {variants}; "
            f"a CPU build ({unpinned_version(project)}) through build --base-wheel F\n"
            f"custom wheel: {load_base(project).patched_version} (or the variant's label)")


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the dynapatch commit, the base wheels and "
                         "the custom wheel's version, then exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text(Project.at(namespace.project)), flush=True)
        parser.exit()


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynapatch.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the dynapatch checkout (default: the one holding this script)")
    parser.add_argument("--cache-dir", type=Path, help="where base wheels, their extracts and tool venvs are "
                        "kept; may be shared between checkouts (default: build/cache)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="echo every command and show pip's, cmake's and the compiler's output")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    base_help = "use this base wheel file (a variant pinned in patches/BASE) instead of pip download"
    build_base_help = ("use this base wheel file instead of pip download: a variant pinned in patches/BASE, or a "
                       "CPU build of its release (torch-<version>+cpu, checked by version and sources; its sha256 "
                       "is recorded in the custom wheel)")
    helps = {
        "build": "base wheel -> patched, reproducible custom wheel in dist/ -> .venv/ (a no-op when nothing changed)",
        "test": "pytest in .venv/ (default: test/), building first if the wheel is stale; "
                "other arguments go to pytest",
        "check": "the series is valid and applies exactly (no fuzz, no offsets) to the pristine base",
        "devtree": "a git repo of the pristine torch sources with one commit per patch, to edit the series",
    }
    for name, func in (("build", cmd_build), ("test", cmd_test), ("check", cmd_check), ("devtree", cmd_devtree)):
        p = sub.add_parser(name, help=helps[name], description=helps[name] + ".")
        p.set_defaults(func=func)
        p.add_argument("--base-wheel", type=Path, help=build_base_help if name == "build" else base_help)
        if name in ("build", "test"):
            p.add_argument("--variant", metavar="cpu|cuda", help="the base wheel variant "
                           "(default: the one `pip download torch==<version>` "
                           "gives here; for test: the last build's); patches/BASE lists them")
            p.add_argument("--python", metavar="PYTHON", help="the interpreter the wheel is for (a command "
                           "or path, e.g. python3.12; default python3): its pip fetches the base wheel of its "
                           "Python tag, the C++ extension is compiled against it, and the wheel goes into .venv "
                           "(.venv-cp312 for another Python than patches/BASE's first block's)")
        if name == "build":
            p.add_argument("--no-venv", action="store_true", help="only build the wheel, leave .venv/ as it is")
            p.add_argument("--force", action="store_true", help="rebuild even if nothing changed")
        if name == "test":
            p.add_argument("--quick", action="store_true",
                           help="skip the slow files (toolchain builds, the fuzzer, every torch.optim optimizer): "
                                + ", ".join(Path(f).name for f in QUICK_IGNORE))
            p.set_defaults(pytest_args=[])
        if name == "devtree":
            p.add_argument("--dir", type=Path, default=Path("build/devtree"),
                           help="where to make it (default: build/devtree)")
            p.add_argument("--force", action="store_true", help="recreate an existing devtree")
    p = sub.add_parser("refresh", help="export the devtree's commits back to patches/ and torch_overlay/",
                       description="Export the devtree's commits back to patches/ and torch_overlay/.")
    p.set_defaults(func=cmd_refresh)
    p.add_argument("--dir", type=Path, default=Path("build/devtree"), help="the devtree (default: build/devtree)")
    target_help = ("a pytorch checkout at the base's release (or one with patches/<version>/), "
                   "a site-packages dir or a venv")
    p = sub.add_parser("apply", help="apply the series and overlay onto an existing torch tree",
                       description="Apply the series and overlay onto an existing torch tree, all or nothing; "
                                   "a record of what changed is kept in the tree for unapply.")
    p.set_defaults(func=cmd_apply)
    p.add_argument("--target", type=Path, required=True, help=target_help)
    p = sub.add_parser("unapply", help="undo apply: restore the tree exactly as it was",
                       description="Undo apply: restore every file apply changed and remove the files it added, "
                                   "from the record apply wrote.")
    p.set_defaults(func=cmd_unapply)
    p.add_argument("--target", type=Path, required=True, help="the tree given to apply --target")
    p.add_argument("--force", action="store_true", help="restore even files changed since apply")
    p = sub.add_parser("info", help="what a custom wheel holds: variant, base, dynapatch commit, patches and sha256s",
                       description="What a custom wheel holds: variant, base wheel, dynapatch commit, every "
                                   "patch's name and sha256. An installed one: python -m torch._dynamo.dynapatch.")
    p.set_defaults(func=cmd_info)
    p.add_argument("--wheel", type=Path, help="the wheel (default: the last build's, in dist/)")
    p = sub.add_parser("export-prs", help="one git-am-able mbox per patch, written as a PR description")
    p.set_defaults(func=cmd_export_prs)
    p.add_argument("outdir", type=Path, metavar="OUTDIR")
    p.add_argument("--base-ref", default=None, help="the pytorch tag the stack applies to (default: v<BASE version>)")
    p.add_argument("--base-wheel", type=Path, help="use this base wheel file instead of pip download")
    p.add_argument("--verify", action="store_true",
                   help="then git am the mboxes onto a repo of the base's sources and, after each PR, run the "
                        "tests it carries from that tree (slow: 13 minutes for all 22 on 2 lightly loaded cores)")
    p.add_argument("--patch", action="append", metavar="NAME",
                   help="with --verify: only the PR of this patch (Patch-Name, file name or number; repeatable)")
    p.add_argument("--timeout", type=float, default=3600, help="with --verify: seconds per PR (default 3600)")
    p = sub.add_parser("upstream-tests", help="Dynamo's own tests: stock base wheel vs the custom wheel")
    p.set_defaults(func=cmd_upstream_tests)
    p.add_argument("--pytorch-src", type=Path, required=True, help="a pytorch checkout at the base's tag")
    p.add_argument("--files", nargs="+",
                   help=f"test/dynamo/ files to run (default: {' '.join(upstream_mod.DEFAULT_FILES)})")
    p.add_argument("--patched-venv", type=Path, help="a venv with the custom wheel (default: .venv, built if stale)")
    p.add_argument("--junit-dir", type=Path, help="where the junit xml goes (default: build/upstream-tests)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per test file and env (default 3600)")
    p.add_argument("--base-wheel", type=Path, help="use this base wheel file instead of pip download")
    p = sub.add_parser("rebase-check", help="does the series apply to another torch release?")
    p.set_defaults(func=cmd_rebase_check)
    p.add_argument("--to", required=True, metavar="VERSION", help="torch release, e.g. 2.14.1")
    p.add_argument("--wheel", type=Path, help="use this wheel of that release instead of pip download")
    p.add_argument("--out", type=Path, help="where the refreshed patches (NNNN-name.patch) and the conflicts "
                   "(NNNN-name.conflicts) go (default: build/rebase-VERSION)")
    p.add_argument("--base-wheel", type=Path, help="the pinned base wheel (the merge base) instead of pip download")
    p = sub.add_parser("stack-test", help="each prefix of the series passes the tests its last patch ships")
    p.set_defaults(func=cmd_stack_test)
    p.add_argument("--patch", action="append", metavar="NAME",
                   help="only the prefix ending in this patch (Patch-Name, file name or number; repeatable)")
    p.add_argument("--last", action="store_true", help="only the whole series (what CI runs)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per prefix (default 3600)")
    p.add_argument("--base-wheel", type=Path, help="use this base wheel file instead of pip download")
    p = sub.add_parser("stats", help="per patch: upstream lines +/-, overlay and native lines, upstream test "
                       "edits, test cases shipped")
    p.set_defaults(func=cmd_stats)
    p = sub.add_parser("lint", help="ruff (ruff.toml) and a clang-format check of csrc/ (.clang-format)")
    p.set_defaults(func=cmd_lint)
    # A subcommand's --help starts with what it does: its one-line help where it has no description.
    for choice in sub._choices_actions:
        if sub.choices[choice.dest].description is None:
            sub.choices[choice.dest].description = choice.help[:1].upper() + choice.help[1:] + "."
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if args.command != "test":
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.pytest_args = unknown
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.VERBOSE = args.verbose
    project = Project.at(args.project, args.cache_dir)
    try:
        project.cache.mkdir(parents=True, exist_ok=True)
        return args.func(project, args)
    except DynapatchError as e:
        die(e)


if __name__ == "__main__":
    sys.exit(main())
