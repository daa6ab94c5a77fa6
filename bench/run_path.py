"""Where a small model's call goes on rlx-cpu: the run path's layers timed in place, calls interleaved.

    python bench/run_path.py [--batch 1] [--calls 6000]

Two rows of figures, in microseconds (p50 over ``--calls`` rounds; in each round every layer is called
once, so all see the same moments of a shared machine):

* the MLP 784-512-256-10 (``rlx bench infer mlp``): ``Executable.run``, the compiled program's ``run``
  (input copied in, load probe, outputs copied out), its runs with floating-point warnings off, and the
  runs alone. The differences are the layers' own cost as the model leaves the caches: the weights
  (2.1 MB) stream through the core's L2 (1.25 MB on the 2-core CI VM) every call, so the Python
  between the kernels runs cache-cold.
* a one-op graph (``x + x`` on 8 floats), ``Executable.run`` and the program's ``run``: warm (called
  back to back) and cold (after a 3 MB sum evicts the caches), the same layers without the model.
* single operations of that path, cold (each after the same 3 MB sum, an empty call's time
  subtracted): the input's NumPy assignment (784 floats), rlx-cpu's load poll, a ctypes call into
  OpenMP (``omp_get_max_threads``), ``a.flags.c_contiguous``, a one-entry dict.

A benchmark, not a test; docs/BENCHMARKS.md quotes it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _rounds(fns: dict[str, Callable[[], Any]], calls: int, before: Callable[[], Any] | None = None
            ) -> dict[str, float]:
    """p50 microseconds of each function over ``calls`` rounds (``before`` runs untimed first)."""
    clock = time.perf_counter_ns
    ts: dict[str, list[int]] = {k: [] for k in fns}
    for _ in range(calls):
        for k, f in fns.items():
            if before is not None:
                before()
            t0 = clock()
            f()
            ts[k].append(clock() - t0)
    return {k: statistics.median(v) / 1e3 for k, v in ts.items()}


def _compiled(exe: Any, graph: Any, feed: dict[str, np.ndarray]) -> Any:
    from rlx_core.runtime import bind_inputs

    return exe._specialise(bind_inputs(graph, feed, "bench")[1])[0]


def mlp(batch: int, calls: int) -> dict[str, float]:
    from rlx_core.bench import inputs, rlx_graph
    from rlx_core.runtime import Session

    graph, feed = rlx_graph("mlp"), inputs("mlp", batch, 1)
    exe = Session("cpu").compile(graph)
    exe.run(feed)
    c = _compiled(exe, graph, feed)
    runs = c.runs

    def runs_alone() -> None:
        for r in runs:
            r()
    return _rounds({"Executable.run": lambda: exe.run(feed), "program.run": lambda: c.run(feed),
                    "runs, warnings off": c._run_all, "runs alone": runs_alone}, calls)


def tiny(calls: int) -> dict[str, float]:
    from rlx_core import GraphBuilder, Session

    g = GraphBuilder("tiny")
    x = g.input("x", "f32", (1, 8))
    g.output(g.op("add", x, x), "y")
    graph = g.build()
    feed = {"x": np.ones((1, 8), np.float32)}
    exe = Session("cpu").compile(graph)
    exe.run(feed)
    c = _compiled(exe, graph, feed)
    fns: dict[str, Callable[[], Any]] = {"Executable.run": lambda: exe.run(feed),
                                         "program.run": lambda: c.run(feed)}
    big = np.ones(3_000_000 // 4, np.float32)
    warm = _rounds(fns, calls * 5)
    cold = _rounds(fns, calls // 2, before=big.sum)
    return {**{f"{k} warm": v for k, v in warm.items()}, **{f"{k} cold": v for k, v in cold.items()}}


def cold_ops(calls: int) -> dict[str, float]:
    from rlx_cpu import onednn_conv
    from rlx_cpu.parallel import poll

    v, a = np.empty((1, 784), np.float32), np.ones((1, 784), np.float32)
    o = np.ones((1, 10), np.float32)
    ops: dict[str, Callable[[], Any]] = {"empty call": lambda: None,
                                         "view[...] = a": lambda: v.__setitem__(Ellipsis, a),
                                         "poll()": poll, "a.flags.c_contiguous": lambda: a.flags.c_contiguous,
                                         "dict": lambda: {"y": o}}
    api = onednn_conv._api()
    if api is not None:
        ops["ctypes omp_get_max_threads"] = api["omp"][0]
    big = np.ones(3_000_000 // 4, np.float32)
    got = _rounds(ops, calls // 2, before=big.sum)
    base = got.pop("empty call")
    return {k: v - base for k, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--calls", type=int, default=6000)
    a = ap.parse_args()
    for title, row in ((f"MLP 784-512-256-10 batch {a.batch}", mlp(a.batch, a.calls)),
                       ("one add on 8 floats", tiny(a.calls)),
                       ("cold, one by one, empty call subtracted", cold_ops(a.calls))):
        print(f"{title}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
