"""State the microbenchmarks share with their conftest: which runtimes run, the thread count, and each
runtime's timings."""

from __future__ import annotations

from typing import Any

#: Backends benchmarked when installed; installed plugins not named here are added at collection.
KNOWN_BACKENDS = ("cpu", "wasm", "vulkan", "metal", "cortexm", "fpga", "cuda")
PEERS = ("numpy", "onnxruntime")

#: (group, runtime) -> (min, median) seconds, filled by the tests, printed as ratios at the end.
TIMES: dict[tuple[str, str], tuple[float, float]] = {}


def threads() -> int:
    """Threads every engine gets: RLX_BENCH_THREADS (as for `rlx bench`), else the CPU count."""
    import os

    from rlx_core.settings import BENCH_THREADS

    n: int = BENCH_THREADS.get() or os.cpu_count() or 1
    return n


def runtimes() -> list[str]:
    """The peers, then ``rlx-<backend>`` for every known or installed backend plugin."""
    from rlx_core import hub

    try:
        installed = [n for n in hub().names() if n not in KNOWN_BACKENDS]
    except Exception:  # discovery problems show up as skips of the known backends below
        installed = []
    return [*PEERS, *(f"rlx-{b}" for b in (*KNOWN_BACKENDS, *sorted(installed)))]


def record(group: str, runtime: str, benchmark: Any) -> None:
    stats = getattr(benchmark, "stats", None)  # None under --benchmark-disable
    if stats is not None and getattr(stats, "stats", None) is not None:
        TIMES[(group, runtime)] = (stats.stats.min, stats.stats.median)


def ratios(group: str) -> dict[str, float]:
    """Each runtime's fastest call in ``group`` over NumPy's (empty when NumPy did not run). The
    minimum, not the median: on a shared machine it is the estimate other processes disturb least."""
    base = TIMES.get((group, "numpy"))
    return {rt: t[0] / base[0] for (g, rt), t in TIMES.items() if g == group and base}
