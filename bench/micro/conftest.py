"""pytest-benchmark microbenchmarks: one kernel per group, every installed RLX backend and the peers
(NumPy, ONNX Runtime) measured in the same run, so the report's ratios compare like with like.

Not part of the test suite: ``testpaths`` in pyproject.toml is ``tests``, so plain ``pytest`` (and CI)
never collects this folder. Run it with ``bash scripts/dev.sh microbench`` (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import os
from typing import Any

from _results import TIMES, ratios, threads

# Every engine gets the same threads, set before any of them starts its pool: rlx-cpu through its
# setting, NumPy's BLAS through threadpoolctl, ONNX Runtime per session (test_kernels.py).
_THREADS = threads()
os.environ["RLX_CPU_THREADS"] = str(_THREADS)
try:
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=_THREADS)  # for the whole process: never restored
except ImportError:  # NumPy then uses its BLAS default
    pass


def pytest_benchmark_update_machine_info(config: Any, machine_info: dict[str, Any]) -> None:
    machine_info["rlx_bench_threads"] = _THREADS
    machine_info["loadavg"] = list(os.getloadavg())  # other processes' load when the run ended


def pytest_benchmark_update_json(config: Any, benchmarks: Any, output_json: dict[str, Any]) -> None:
    """Each saved benchmark also carries its fastest call over NumPy's in the same run (``vs_numpy``)."""
    for b in output_json.get("benchmarks", []):
        runtime = b.get("extra_info", {}).get("runtime")
        base = TIMES.get((b.get("group"), "numpy"))
        if runtime and base:
            b["extra_info"]["vs_numpy"] = b["stats"]["min"] / base[0]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TIMES:
        return
    tr = terminalreporter
    tr.section(f"fastest call (median) in ms, min as a multiple of NumPy's; {_THREADS} thread(s) each")
    for g in sorted({g for g, _ in TIMES}):
        r = ratios(g)
        cells = []
        for (gg, rt), (lo, med) in sorted(TIMES.items(), key=lambda kv: kv[1]):
            if gg == g:
                cells.append(f"{rt} {lo * 1e3:.3f} ({med * 1e3:.3f})" + (f" {r[rt]:.2f}x" if rt in r else ""))
        tr.write_line(f"{g:<18} " + ", ".join(cells))
