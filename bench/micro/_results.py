"""State the microbenchmarks share with their conftest: which runtimes run, and each one's median."""

from __future__ import annotations

from typing import Any

#: Backends benchmarked when installed; installed plugins not named here are added at collection.
KNOWN_BACKENDS = ("cpu", "wasm", "vulkan", "metal", "cortexm", "fpga", "cuda")
PEERS = ("numpy", "onnxruntime")

#: (group, runtime) -> median seconds, filled by the tests, printed as ratios at the end.
MEDIANS: dict[tuple[str, str], float] = {}


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
        MEDIANS[(group, runtime)] = stats.stats.median


def ratios(group: str) -> dict[str, float]:
    """Each runtime's median in ``group`` over NumPy's (empty when NumPy did not run)."""
    base = MEDIANS.get((group, "numpy"))
    return {rt: m / base for (g, rt), m in MEDIANS.items() if g == group and base}
