"""MiniLM-L6-v2, batch 1: rlx-wasm (wasmtime) vs rlx-cpu vs ONNX Runtime, in one run.

    python plugins/rlx-wasm/bench/bench_wasm.py                 # seq 16, 64 and 128
    python plugins/rlx-wasm/bench/bench_wasm.py --seq 16 --json

Every runtime gets the same inputs (random token ids with [CLS]/[SEP], full attention mask) and
its outputs are checked against rlx-cpu (cosine similarity) before timing. Reported: compile
time, median (p50) and p90 latency of a whole ``run`` call over at least ``--min-time`` seconds,
and GFLOP/s from the model's FLOP count. wasm is single-threaded SIMD128 code; ONNX Runtime is
measured with its default threads and with one thread (``ort-1t``) for a like-for-like number.
The ORT model is ``rlx_core.bench.onnx_path("minilm")`` (exported once from PyTorch, cached).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_core.bench import inputs, measure


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def run(seqs: list[int], min_reps: int, min_time: float, runtimes: list[str]) -> list[dict[str, Any]]:
    from rlx_core.bench import model_flops, onnx_path, rlx_graph
    from rlx_core.runtime import Session

    graph = rlx_graph("minilm")
    rows: list[dict[str, Any]] = []
    sessions: dict[str, Any] = {}
    if any(r.startswith("ort") for r in runtimes):
        import onnxruntime as ort

        path = onnx_path("minilm")
        for r in runtimes:
            if r.startswith("ort"):
                so = ort.SessionOptions()
                if r == "ort-1t":
                    so.intra_op_num_threads = 1
                    so.inter_op_num_threads = 1
                sessions[r] = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    exes: dict[str, Any] = {}
    for seq in seqs:
        feed = inputs("minilm", 1, seq)
        flops = model_flops("minilm", 1, seq)
        ref = None
        for r in runtimes:
            t0 = time.perf_counter()
            if r in ("wasm", "cpu"):
                if r not in exes:
                    exes[r] = Session(r).compile(graph)
                exe = exes[r]
                out = exe.run(feed)["embeddings"]
                fn: Callable[[], Any] = lambda exe=exe, feed=feed: exe.run(feed)  # noqa: E731
            else:
                sess = sessions[r]
                out = sess.run(None, feed)[0]
                fn = lambda sess=sess, feed=feed: sess.run(None, feed)  # noqa: E731
            first_s = time.perf_counter() - t0
            if ref is None:
                ref = out
            times = measure(fn, min_reps, min_time, max_reps=500)
            p50 = statistics.median(times)
            rows.append({"runtime": r, "seq": seq, "first_run_s": first_s, "p50_ms": p50 * 1e3,
                         "p90_ms": sorted(times)[int(0.9 * (len(times) - 1))] * 1e3, "reps": len(times),
                         "gflops": flops / p50 / 1e9, "cosine_vs_first": _cos(out, ref)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, action="append",
                    help="sequence length (repeatable; default 16 64 128)")
    ap.add_argument("--runtimes", default="cpu,wasm,ort,ort-1t",
                    help="comma list of cpu, wasm, ort, ort-1t (the first is the reference)")
    ap.add_argument("--min-reps", type=int, default=20)
    ap.add_argument("--min-time", type=float, default=2.0)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    seqs = a.seq or [16, 64, 128]
    runtimes = [r.strip() for r in a.runtimes.split(",") if r.strip()]
    rows = run(seqs, a.min_reps, a.min_time, runtimes)
    import rlx_wasm
    from rlx_wasm.options import simd_enabled

    import rlx_core

    try:
        from importlib.metadata import version

        wt = version("wasmtime")
        ortv = version("onnxruntime")
    except Exception:
        wt = ortv = "?"
    meta = {"machine": platform.machine(), "processor": platform.processor() or "?", "cores": os.cpu_count(),
            "python": sys.version.split()[0], "rlx_core": rlx_core.__version__,
            "rlx_wasm": rlx_wasm.__version__,
            "wasmtime": wt, "onnxruntime": ortv,
            "simd": "1" if simd_enabled() else "0", "date": time.strftime("%Y-%m-%d %H:%M")}
    if a.json:
        print(json.dumps({"meta": meta, "results": rows}, indent=2))
        return 0
    print(f"MiniLM-L6-v2 batch 1 | {meta['date']} | {meta['cores']} cores | wasmtime {wt} | "
          f"onnxruntime {ortv} | RLX_WASM_SIMD={meta['simd']}")
    print(f"{'seq':>4} {'runtime':<8} {'p50 ms':>9} {'p90 ms':>9} {'GFLOP/s':>8} {'first s':>8} {'cos':>9}")
    for r in rows:
        print(f"{r['seq']:>4} {r['runtime']:<8} {r['p50_ms']:>9.2f} {r['p90_ms']:>9.2f} {r['gflops']:>8.1f} "
              f"{r['first_run_s']:>8.2f} {r['cosine_vs_first']:>9.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
