"""Full garbage collections are deferred while Dynamo compiles a frame.

A full (generation 2) collection walks every object the cyclic collector tracks.
Compiling a frame over many tensors creates hundreds of thousands of them
(VariableTrackers, sources, fake tensors, FX nodes, sympy expressions) while the
heap keeps growing, and CPython's default generation-2 threshold (10) starts a full
walk of that growing heap again and again: an Adam step over 1,000 parameters spends
about a tenth of its first compile in five full collections.

While a compile runs, the generation-2 threshold is raised to
``config.compile_gc_gen2_threshold``; generations 0 and 1 keep collecting, and
refcounting still frees what is not in a cycle, so what waits is cyclic garbage old
enough to reach generation 2. The previous threshold is restored when the outermost
compile ends (compiles nest: a graph break's resume function, compiled autograd), so
the next full collection comes soon after. A threshold changed by someone else during
the compile is left as they set it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

from . import config

_lock = threading.Lock()
_depth = 0
# (threshold before the outermost compile, threshold installed for it)
_thresholds: tuple[tuple[int, ...], tuple[int, ...]] | None = None


@contextlib.contextmanager
def deferred_full_collections() -> Iterator[None]:
    global _depth, _thresholds
    gen2_threshold = config.compile_gc_gen2_threshold
    if gen2_threshold is None:
        yield
        return
    with _lock:
        if _depth == 0:
            before = gc.get_threshold()
            installed = (before[0], before[1], max(before[2], gen2_threshold))
            gc.set_threshold(*installed)
            _thresholds = (before, installed)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _thresholds is not None:
                before, installed = _thresholds
                if gc.get_threshold() == installed:
                    gc.set_threshold(*before)
                _thresholds = None
