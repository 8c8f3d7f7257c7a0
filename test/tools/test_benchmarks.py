"""The benchmark scripts run end to end at tiny sizes and report what they claim.

No timing is asserted (the machines are noisy; figures belong in the scripts'
output). What is checked is structural: every case runs, and the frame counts the
scripts print are the ones the features promise.
"""

import os
import re
import subprocess
import sys
import unittest
from pathlib import Path
from unittest import mock

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def run_script(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise AssertionError(f"{name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


class BenchSkipGuardTest(unittest.TestCase):
    def test_frames_per_case(self):
        # This interpreter as the (s) worker's too: the row's shape, not stock's figures.
        out = run_script(
            "bench_skip_guard.py", "--sizes", "12", "--steps", "3", "--steady-steps", "3",
            "--stock-python", sys.executable,
        )
        frames = {
            m.group(1): int(m.group(2))
            for m in re.finditer(r"^\s+12 \((\w)\) .*?\s(\d+)\s+[\d.]+$", out, re.MULTILINE)
        }
        # (a) and (s) recompile on every step (traced through); (b), the design's example,
        # and the floor (d) compile once; torch.optim.SGD (c) compiles twice (its first
        # step has no momentum buffers).
        self.assertEqual(frames, {"a": 3, "b": 1, "c": 2, "d": 1, "s": 3}, out)
        self.assertIn("first compile s/b", out)
        self.assertIn("first compile a/b", out)


class BenchFirstCompileTest(unittest.TestCase):
    def test_a_row_per_step_with_both_sides(self):
        # This interpreter on both sides: the table's shape, not a ratio, is checked.
        out = run_script(
            "bench_first_compile.py", "--stock-python", sys.executable, "--sizes", "12",
            "--kinds", "sgd", "once", "--repeats", "1",
        )
        rows = re.findall(
            r"^\|\s+12 \| (\w+)\s+\|\s+([\d.]+)\s+[\d.]+-\s*[\d.]+ \|\s+([\d.]+)\s+[\d.]+-\s*[\d.]+ \|\s+([\d.]+)x \|$",
            out, re.MULTILINE,
        )
        self.assertEqual([kind for kind, *_ in rows], ["sgd", "once"], out)
        for _, stock, patched, ratio in rows:
            self.assertGreater(float(stock), 0, out)
            self.assertGreater(float(patched), 0, out)
            # The ratio is of the unrounded medians: only its presence is checked.
            self.assertGreater(float(ratio), 0, out)

    def test_missing_stock_interpreter_is_reported(self):
        proc = subprocess.run(
            [sys.executable, str(SCRIPTS / "bench_first_compile.py"), "--stock-python", "/nonexistent/python",
             "--sizes", "12", "--kinds", "sgd", "--repeats", "1"],
            capture_output=True, text=True, timeout=600,
        )
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn("/nonexistent/python", proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)


class BenchOptimizerStepTest(unittest.TestCase):
    def test_every_step_runs_and_splits_the_call(self):
        out = run_script(
            "bench_optimizer_step.py", "--no-stock", "--sizes", "12", "--steps", "3",
            "--rounds", "1", "--calls", "1",
        )
        # | N | step | side | 1st compile | all compiles | frames | call | eager | ratio | 4 splits |
        rows = re.findall(r"^\|\s+12 \| ([\w-]+)\s+\| patched \|[^|]+\|[^|]+\|\s+(\d+)(\*?)\s*\|", out, re.MULTILINE)
        # torch.optim.SGD compiles twice (its first step has no momentum buffers); the
        # init_values_once step once; none still recompiles in the steady state.
        self.assertEqual({kind: int(frames) for kind, frames, _ in rows}["once"], 1, out)
        self.assertEqual({kind: int(frames) for kind, frames, _ in rows}["sgd"], 2, out)
        self.assertEqual(sorted(kind for kind, _, _ in rows), ["adam", "adamw", "once", "sgd"], out)
        self.assertEqual([star for _, _, star in rows], ["", "", "", ""], out)
        self.assertIn("patched before+after", out)
        # Every guard timed apart passes, as in the call (torch.optim's step guards run
        # under _use_grad's grad mode); one line per row gives the guard and get_attr costs.
        self.assertNotIn("a guard check failed", out)
        costs = re.findall(r"^  N=12\s+([\w-]+)\s+guard\s+\d+  graph get_attr\s+\d+", out, re.MULTILINE)
        self.assertEqual(sorted(costs), ["adam", "adamw", "once", "sgd"], out)
        # The pre-graph markers fire (torch 2.15 calls them only under a profiler, and its
        # exit only with what enter returned): every row's before-graph time is measured.
        before = re.findall(r"^\|\s+12 \| [\w-]+\s+\| patched \|(?:[^|]+\|){7}\s+(\d+)\s+[\d.]+ \|", out,
                            re.MULTILINE)
        self.assertEqual(len(before), 4, out)
        self.assertTrue(all(int(us) > 0 for us in before), out)

    def test_inductor_adam_row(self):
        out = run_script(
            "bench_optimizer_step.py", "--no-stock", "--sizes", "12", "--kinds", "sgd", "--steps", "2",
            "--rounds", "1", "--calls", "1", "--inductor-sizes", "12",
        )
        rows = re.findall(r"^\|\s+12 \| ([\w-]+)\s+\| patched \|[^|]+\|[^|]+\|\s+(\d+)(\*?)\s*\|", out, re.MULTILINE)
        # backend="inductor" Adam after the chosen steps; it compiles once.
        self.assertEqual(rows, [("sgd", "2", ""), ("adam-ind", "1", "")], out)
        self.assertIn("medians over the rows", out)


class BenchGuardsTest(unittest.TestCase):
    def test_every_scenario_gets_native_guards(self):
        out = run_script(
            "bench_guards.py", "--sizes", "16", "--rounds", "1", "--budget-us", "200"
        )
        rows = re.findall(r"^\| (\w+)\s+\|\s+16 \|\s+(\d+) \|", out, re.MULTILINE)
        self.assertEqual(
            sorted(rows), sorted([("list", "1"), ("dict", "1"), ("paramlist", "1"), ("optim", "4")]), out
        )


class BenchScalarStateTest(unittest.TestCase):
    """Only torch.optim cases (no third-party packages); the custom wheel on both sides."""

    def test_table_verdicts_and_exit_status(self):
        cmd = [sys.executable, str(SCRIPTS / "bench_scalar_state.py"), "--stock", sys.executable,
               "--patched", sys.executable, "--cases", "torch_adamw,sched_lambda_warmup",
               "--steps", "3", "--scheduler-steps", "4", "--backend", "eager",
               # The lr changes on every step: a wheel that recompiles for it hits this limit
               # and FAILs; one that does not PASSes. Either way the verdict must fit the row.
               "--recompile-limit", "1"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        out = proc.stdout
        self.assertIn(proc.returncode, (0, 1), f"{out}\n{proc.stderr}")
        pair = r"(\S+) / (\S+)"
        rows = {
            m.group(1): m.groups()[1:]
            for m in re.finditer(rf"^\| (\w+) \| ([^|]+) \| {pair} \| {pair} \| .*? \| {pair} \| (\w+) \|$",
                                 out, re.MULTILINE)
        }
        self.assertEqual(sorted(rows), ["sched_lambda_warmup", "torch_adamw"], out)
        # AdamW without a scheduler compiles once on every wheel and matches eager.
        adamw = rows["torch_adamw"]
        self.assertEqual(adamw[:5] + adamw[7:], ("<=1 graphs/3", "1", "1", "0", "0", "PASS"), out)
        self.assertTrue({"same", "close"}.issuperset(adamw[5:7]), out)
        target, _, graphs, _, hits, _, eager, verdict = rows["sched_lambda_warmup"]
        self.assertEqual(target, "<=2 graphs/4", out)
        self.assertIn(eager, ("same", "close"), out)  # never a wrong result, whichever wheel
        expected = "PASS" if int(graphs) <= 2 and hits == "0" else "FAIL"
        self.assertEqual(verdict, expected, out)
        # Warmup changes the lr on every one of the 4 steps: at most 4 graphs.
        self.assertLessEqual(int(graphs), 4, out)
        self.assertEqual(proc.returncode, 0 if expected == "PASS" else 1, out)
        passed = 1 + (expected == "PASS")
        self.assertIn(f"patched: {passed} PASS, {2 - passed} FAIL/ERROR, 0 SKIP", out)
        self.assertIn("note: both sides run torch", out)

    def test_unknown_case_is_a_usage_error(self):
        proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_scalar_state.py"), "--stock",
                               sys.executable, "--cases", "no_such_case"],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("unknown case(s) no_such_case", proc.stderr)




class BenchOptimizerSweepBranchFloorTest(unittest.TestCase):
    """bench_optimizer_sweep counts a case above 2 graphs as at its branch floor only
    when every recompile is the first call's or one per side of a branch on the step."""

    FIRST_CALL = "opt_step: not opt.state # state = self.state[p] # adam.py:1 in init_group"
    BRANCH = "opt_step: (opt.param_groups[0]['step'] % 10) != 0 # if step % 10 == 0: # soap.py:2 in step"

    def floor(self, graphs, *reasons, graph_breaks=0):
        sys.path.insert(0, str(SCRIPTS))
        try:
            import bench_optimizer_sweep
        finally:
            sys.path.remove(str(SCRIPTS))
        case = {"graphs": graphs, "graph_breaks": graph_breaks, "reason_counts": [(r, 1) for r in reasons]}
        return bench_optimizer_sweep.branch_floor(case)

    def test_one_recompile_per_branch_guard(self):
        self.assertEqual(self.floor(3, self.FIRST_CALL, self.BRANCH),
                         ["opt_step: (opt.param_groups[0]['step'] % 10) != 0"])

    def test_not_the_floor(self):
        self.assertIsNone(self.floor(4, self.FIRST_CALL, self.BRANCH))  # the branch recompiled twice
        self.assertIsNone(self.floor(3, self.FIRST_CALL, self.BRANCH, graph_breaks=1))
        for pinned in ("opt_step: opt.param_groups[0]['step'] == 1 # for group in ...",
                       "torch_dynamo_resume_in_step_at_601: ___stack3 == 1.559759255087556e-07",
                       "opt_step: len(opt.state[list(dict.keys(opt.state))[0]]['q']) == 1"):
            self.assertIsNone(self.floor(3, self.FIRST_CALL, pinned), pinned)


class StockSideTest(unittest.TestCase):
    """benchlib.stock_python finds a stock env of the custom wheel's base, never one of another
    release (a machine keeps the stock env of the series it had before a rebase)."""

    def venv(self, root: Path, name: str, version: str) -> Path:
        site = root / name / "lib" / "python3.11" / "site-packages" / "torch"
        site.mkdir(parents=True)
        (site / "version.py").write_text(f"__version__ = '{version}'\ngit_version = 'x'\n")
        python = root / name / "bin" / "python"
        python.parent.mkdir()
        python.write_text("")
        return python

    def test_the_stock_env_of_the_base_is_chosen(self):
        import tempfile
        sys.path.insert(0, str(SCRIPTS))
        import benchlib

        with tempfile.TemporaryDirectory() as tmp, mock.patch.object(benchlib, "FIXED_STOCK_PYTHONS", ()), \
                mock.patch.object(benchlib, "ROOT", Path(tmp)), \
                mock.patch.dict(os.environ, {"DYNAPATCH_CACHE_DIR": str(Path(tmp) / "no-cache")}):
            # Only the envs made here: not this machine's stock envs.
            root = Path(tmp)
            patched = self.venv(root, "custom", "2.15.0+cu132.dynapatch.26.g3f784c7a")
            older = self.venv(root / "cache", "stockenv-0000", "2.13.0+cpu")
            base = self.venv(root / "cache", "stockenv-1111", "2.15.0+cu132")
            self.assertEqual(benchlib.base_torch_version(patched), "2.15.0+cu132")
            self.assertEqual(benchlib.stock_python(None, root / "cache", patched=patched), str(base))
            base.parent.parent.joinpath("lib/python3.11/site-packages/torch/version.py").unlink()
            with self.assertRaises(SystemExit) as raised:
                benchlib.stock_python(None, root / "cache", patched=patched)
            self.assertIn("no stock venv with torch 2.15.0+cu132", str(raised.exception))
            self.assertIn(f"{older} (torch 2.13.0+cpu)", str(raised.exception))
            # Given explicitly, any interpreter is taken (a before/after of two series).
            self.assertEqual(benchlib.stock_python(older, root / "cache", patched=patched), str(older))


class SweeplibCompileWatchTest(unittest.TestCase):
    """sweeplib.CompileWatch counts the graphs and recompile reasons of a compiled callable
    and tells whether its state stayed the eager copy's."""

    def watch(self):
        sys.path.insert(0, str(SCRIPTS))
        try:
            import sweeplib
        finally:
            sys.path.remove(str(SCRIPTS))
        import torch

        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()  # a worker is a fresh process; these tests share one
        return sweeplib.CompileWatch("eager", 8), torch

    def test_graphs_reasons_and_same_state(self):
        watch, torch = self.watch()

        def scale(state, x):
            state["total"] = state["total"] + (x * 2).sum()

        compiled = torch.compile(scale, backend=watch.backend)
        eager_state, compiled_state = {"total": torch.zeros(())}, {"total": torch.zeros(())}
        for call, size in enumerate((3, 3, 5, 7), 1):
            x = torch.ones(size)
            scale(eager_state, x)
            compiled(compiled_state, x)
            watch.after_call(call, {"s": compiled_state}, {"s": eager_state})
        r = watch.result()
        # the size changes once: a static graph, then one with a dynamic size
        self.assertEqual((r["graphs"], r["frame_compiles"]), (2, 2))
        self.assertEqual(r["recompiles"], 1)
        self.assertIn("size mismatch at index 0. expected 3, actual 5", r["reasons"][0])
        self.assertEqual((r["eager"], r["eager_detail"], r["limit_hits"], r["graph_breaks"]), ("same", "", [], 0))

    def test_frames_of_a_graph_break_are_counted_apart(self):
        watch, torch = self.watch()

        def broken(x):
            y = x + 1
            torch._dynamo.graph_break()
            return y * 2

        compiled = torch.compile(broken, backend=watch.backend)
        for call in range(1, 4):
            compiled(torch.ones(3))
            watch.after_call(call, {}, {})
        r = watch.result()
        # the graph before the break and the resume function's: one compile each
        self.assertEqual((r["graphs"], r["frame_compiles"], r["graph_breaks"]), (2, 1, 1))

    def test_a_difference_is_reported_with_its_call(self):
        watch, torch = self.watch()
        watch.after_call(1, {"s": {"v": torch.ones(2)}}, {"s": {"v": torch.ones(2)}})
        watch.after_call(2, {"s": {"v": torch.ones(2)}}, {"s": {"v": torch.zeros(2)}})
        r = watch.result()
        self.assertEqual(r["eager"], "DIFF")
        self.assertTrue(r["eager_detail"].startswith("call 2: s['v']: max abs diff 1"), r["eager_detail"])


class BenchMetricSweepTest(unittest.TestCase):
    def test_unknown_metric_is_a_usage_error(self):
        proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_metric_sweep.py"), "--metrics", "mse,no_such"],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("unknown metric(s) no_such", proc.stderr)


if __name__ == "__main__":
    unittest.main()
