"""Spine benchmarks: start-up cost and per-kernel run overhead on rlx-cpu, next to a NumPy baseline.

    python bench/bench_core.py [--json PATH]

Measures, in one run:
  * ``import rlx_core`` + listing the installed backend plugins, in a fresh interpreter (median of
    15), next to a bare ``python -c pass`` start;
  * the per-kernel overhead of a compiled graph: a chain of N dependent adds on f32[1] run through
    ``Executable.run`` vs the same N ``np.add(..., out=)`` calls written by hand.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

import numpy as np


def _startup(code: str, reps: int = 15) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_import() -> dict[str, float]:
    bare = _startup("pass")
    full = _startup("import rlx_core, rlx_core._hub as h; h.Hub().names()")
    # The in-process figure is what the acceptance bound is about; measure it directly too.
    vals = []
    for _ in range(15):
        r = subprocess.run([sys.executable, "-c", "import time; t=time.perf_counter(); import rlx_core, "
                            "rlx_core._hub as h; h.Hub().names(); print(time.perf_counter()-t)"],
                           check=True, capture_output=True, text=True)
        vals.append(float(r.stdout))
    return {"python_start_s": bare, "python_plus_rlx_s": full,
            "import_and_discovery_s": statistics.median(vals)}


def bench_overhead(n: int = 1000, reps: int = 200) -> dict[str, float]:
    from rlx_core import GraphBuilder, Session

    g = GraphBuilder("chain")
    x = g.input("x", "f32", (1,))
    y = x
    for _ in range(n):
        y = y + x
    g.output(y)
    # Fusion off: this measures the cost of one kernel call, so the chain must stay 1001 kernels.
    exe = Session("cpu", use_cache=False, fusion=False).compile(g.build())
    assert len(exe.program().kernels) == n
    xin = np.ones(1, np.float32)
    exe.run(x=xin)
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        exe.run(x=xin)
        t.append(time.perf_counter() - t0)
    rlx = statistics.median(t) / n
    bufs = [np.ones(1, np.float32) for _ in range(n + 1)]
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(n):
            np.add(bufs[i], xin, out=bufs[i + 1])
        t.append(time.perf_counter() - t0)
    npy = statistics.median(t) / n
    return {"rlx_per_kernel_s": rlx, "numpy_per_call_s": npy, "ratio_rlx_over_numpy": rlx / npy}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    imp = bench_import()
    ovh = bench_overhead()
    res = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {platform.processor()} "
           f"{__import__('os').cpu_count()} cores", "python": platform.python_version(),
           "numpy": np.__version__, **imp, **ovh}
    print(f"import rlx_core + plugin discovery : {imp['import_and_discovery_s'] * 1e3:7.1f} ms "
          f"(bound 150 ms)")
    print(f"python start alone                 : {imp['python_start_s'] * 1e3:7.1f} ms")
    print(f"python start + rlx import+discovery: {imp['python_plus_rlx_s'] * 1e3:7.1f} ms")
    print(f"rlx-cpu per-kernel run overhead    : {ovh['rlx_per_kernel_s'] * 1e6:7.2f} µs (bound 5 µs)")
    print(f"hand-written np.add(out=) per call : {ovh['numpy_per_call_s'] * 1e6:7.2f} µs")
    print(f"ratio rlx / numpy                  : {ovh['ratio_rlx_over_numpy']:7.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
