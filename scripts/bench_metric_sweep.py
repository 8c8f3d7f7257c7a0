#!/usr/bin/env python3
"""torchmetrics metrics with a compiled update(): stock torch vs the custom wheel.

Issue 44 item 6, beside bench_optimizer_sweep.py (the same harness: sweeplib). For each
metric of METRICS (torchmetrics 1.9.0, requirements-bench.txt; the aggregation,
regression and classification metrics whose update() takes tensors of one batch, with
their inputs), `def metric_update(metric, *batch): metric.update(*batch)` under
torch.compile (--backend, default aot_eager; config.recompile_limit --recompile-limit,
default 8), called --steps (20) times with a new random batch of the same shape each
time, next to an eager copy updated with the same batches in the same process. Each
metric runs in its own subprocess per side (stock interpreter first, then the patched
one); the third-party packages come from bench_scalar_state's packages dir on both
sides' PYTHONPATH.

Per metric and side: graphs, recompile-limit hits, eager identity of the metric's
states (`metric_state`) and update count after every call and of `compute()` after the
last (bench_scalar_state.compare: "same" bitwise, "close" within
torch.testing.assert_close's defaults, "DIFF"), the first 2 distinct recompile
reasons; and the summary of sweeplib.report (no recompile is expected of a metric's
first call: every recompile counts). A metric whose construction or eager update raises
is "skip" with the exception; a compiled update that raises is "ERROR".
Exit status: 0 when the sweep ran (whatever the results); 1 if a worker crashed outside
the compiled update (a harness error); 2 on a setup error.

    nice -n 19 .venv/bin/python scripts/bench_metric_sweep.py
    ... --metrics mean,mse,multiclass_accuracy --steps 10 --backend eager
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scalar_state as bss
import sweeplib
from sweeplib import describe

CLASSES = 5  # classes of the multiclass metrics
BATCH = 16


def _batches():
    """name: batch(step) -> the update's arguments (a fixed shape, new values each step)."""
    import torch

    def gen(step):
        return torch.Generator().manual_seed(step)

    def values(step, *shape):
        return torch.rand(*shape, generator=gen(step))

    def regression(step):
        g = gen(step)
        return torch.rand(BATCH, generator=g), torch.rand(BATCH, generator=g)

    def binary(step):
        g = gen(step)
        return torch.rand(BATCH, generator=g), torch.randint(0, 2, (BATCH,), generator=g)

    def multiclass(step):
        g = gen(step)
        return torch.randn(BATCH, CLASSES, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)

    def vectors(step):
        g = gen(step)
        return torch.rand(BATCH, 4, generator=g), torch.rand(BATCH, 4, generator=g)

    def images(step):
        g = gen(step)
        return torch.rand(2, 3, 16, 16, generator=g), torch.rand(2, 3, 16, 16, generator=g)

    return {"values": lambda step: (values(step, BATCH),), "regression": regression, "binary": binary,
            "multiclass": multiclass, "vectors": vectors, "images": images}


# name: (how to build it from the torchmetrics module, batch kind of _batches)
METRICS = {
    "mean": (lambda tm: tm.MeanMetric(), "values"),
    "sum": (lambda tm: tm.SumMetric(), "values"),
    "max": (lambda tm: tm.MaxMetric(), "values"),
    "min": (lambda tm: tm.MinMetric(), "values"),
    "cat": (lambda tm: tm.CatMetric(), "values"),
    "running_mean": (lambda tm: tm.RunningMean(window=5), "values"),
    "mse": (lambda tm: tm.MeanSquaredError(), "regression"),
    "rmse": (lambda tm: tm.MeanSquaredError(squared=False), "regression"),
    "mae": (lambda tm: tm.MeanAbsoluteError(), "regression"),
    "mape": (lambda tm: tm.MeanAbsolutePercentageError(), "regression"),
    "r2": (lambda tm: tm.R2Score(), "regression"),
    "pearson": (lambda tm: tm.PearsonCorrCoef(), "regression"),
    "spearman": (lambda tm: tm.SpearmanCorrCoef(), "regression"),
    "explained_variance": (lambda tm: tm.ExplainedVariance(), "regression"),
    "log_cosh": (lambda tm: tm.LogCoshError(), "regression"),
    "cosine_similarity": (lambda tm: tm.CosineSimilarity(reduction="mean"), "vectors"),
    "kl_divergence": (lambda tm: tm.KLDivergence(), "vectors"),
    "binary_accuracy": (lambda tm: tm.classification.BinaryAccuracy(), "binary"),
    "binary_f1": (lambda tm: tm.classification.BinaryF1Score(), "binary"),
    "binary_auroc": (lambda tm: tm.classification.BinaryAUROC(), "binary"),
    "binary_auroc_binned": (lambda tm: tm.classification.BinaryAUROC(thresholds=10), "binary"),
    "binary_calibration_error": (lambda tm: tm.classification.BinaryCalibrationError(), "binary"),
    "multiclass_accuracy": (lambda tm: tm.classification.MulticlassAccuracy(num_classes=CLASSES), "multiclass"),
    "multiclass_f1": (lambda tm: tm.classification.MulticlassF1Score(num_classes=CLASSES), "multiclass"),
    "multiclass_precision": (lambda tm: tm.classification.MulticlassPrecision(num_classes=CLASSES), "multiclass"),
    "multiclass_recall": (lambda tm: tm.classification.MulticlassRecall(num_classes=CLASSES), "multiclass"),
    "multiclass_confusion_matrix": (
        lambda tm: tm.classification.MulticlassConfusionMatrix(num_classes=CLASSES), "multiclass"),
    "psnr": (lambda tm: tm.image.PeakSignalNoiseRatio(data_range=1.0), "images"),
    "ssim": (lambda tm: tm.image.StructuralSimilarityIndexMeasure(data_range=1.0), "images"),
}


def metric_update(metric, *batch):
    metric.update(*batch)


# --------------------------------------------------------------------------- worker


def registry() -> dict:
    """The worker for the sides' versions."""
    from importlib.metadata import version

    import torch

    # torchmetrics imports torchvision when it is installed: the bench packages' build
    # (for bench_scalar_state's timm cases) has C ops this torch may not load
    note = bss.import_torchvision_tolerant(strict=False)
    return {"names": list(METRICS), "torch": torch.__version__, "torch_file": torch.__file__,
            "torchmetrics": version("torchmetrics"), "note": note}


def run_case(name: str, steps: int, backend: str, recompile_limit: int) -> dict:
    import traceback
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    bss.import_torchvision_tolerant(strict=False)  # see registry()
    import torchmetrics as tm

    build, kind = METRICS[name]
    batch = _batches()[kind]
    result: dict = {"torch": torch.__version__}
    try:
        metric_e, metric_c = build(tm), build(tm)
    except Exception as e:
        return {**result, "skipped": f"construct: {describe(e)}"}

    watch = sweeplib.CompileWatch(backend, recompile_limit)
    compiled = torch.compile(metric_update, backend=watch.backend)

    def state(metric, last):
        out = {"states": dict(metric.metric_state), "update_count": metric._update_count}
        if last:
            out["compute"] = metric.compute()
        return out

    for step in range(steps):
        args = batch(step)
        try:
            metric_update(metric_e, *args)
        except Exception as e:
            return {**result, "skipped": f"eager update {step + 1}: {describe(e)}"}
        try:
            compiled(metric_c, *args)
        except Exception as e:
            return {**result, "error": f"update {step + 1}: {describe(e)}",
                    "traceback": traceback.format_exc()[-3000:]}
        last = step == steps - 1
        watch.after_call(step + 1, state(metric_c, last), state(metric_e, last))
    return {**result, **watch.result()}


# --------------------------------------------------------------------------- parent


def fail(message: str) -> None:
    print(f"bench_metric_sweep: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


NO_FIRST_CALL_RECOMPILE = re.compile(r"(?!)")  # a metric's first call leaves no recompile behind


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweeplib.add_arguments(parser, "metric")
    parser.add_argument("--metrics", help=f"comma-separated subset of: {', '.join(METRICS)}")
    args = parser.parse_args()
    if args.worker:
        return sweeplib.worker(args, registry, run_case)

    names = [n.strip() for n in args.metrics.split(",") if n.strip()] if args.metrics else list(METRICS)
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        fail(f"unknown metric(s) {', '.join(unknown)}; known: {', '.join(METRICS)}")
    sides, env, registries = sweeplib.prepare(args, __file__, fail)
    for side, reg in registries.items():
        print(f"{side}: torch {reg['torch']} ({sides[side]}), torchmetrics {reg['torchmetrics']}"
              + (f"; {reg['note']}" if reg["note"] else ""), flush=True)
    return sweeplib.sweep(args, __file__, names, sides, env, "metric", NO_FIRST_CALL_RECOMPILE, "bench_metric_sweep")


if __name__ == "__main__":
    sys.exit(main())
