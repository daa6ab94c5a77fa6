"""pytest-benchmark microbenchmarks: one kernel per group, every installed RLX backend and the peers
(NumPy, ONNX Runtime) measured in the same run, so the report's ratios compare like with like.

Not part of the test suite: ``testpaths`` in pyproject.toml is ``tests``, so plain ``pytest`` (and CI)
never collects this folder. Run it with ``bash scripts/dev.sh microbench`` (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

from typing import Any

from _results import MEDIANS, ratios


def pytest_benchmark_update_json(config: Any, benchmarks: Any, output_json: dict[str, Any]) -> None:
    """Each saved benchmark also carries its median over NumPy's in the same run (``vs_numpy``)."""
    for b in output_json.get("benchmarks", []):
        runtime = b.get("extra_info", {}).get("runtime")
        base = MEDIANS.get((b.get("group"), "numpy"))
        if runtime and base:
            b["extra_info"]["vs_numpy"] = b["stats"]["median"] / base


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not MEDIANS:
        return
    tr = terminalreporter
    tr.section("median per call, and as a multiple of NumPy's in this run (lower is faster)")
    groups = sorted({g for g, _ in MEDIANS})
    for g in groups:
        r = ratios(g)
        cells = []
        for (gg, rt), m in sorted(MEDIANS.items(), key=lambda kv: kv[1]):
            if gg == g:
                cells.append(f"{rt} {m * 1e3:.3f} ms" + (f" ({r[rt]:.2f}x)" if rt in r else ""))
        tr.write_line(f"{g:<18} " + ", ".join(cells))
