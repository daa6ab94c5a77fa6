"""``rlx calibrate BACKEND``: measure a device's capabilities with micro-benchmarks, cache them.

The benchmarks run through the backend's own compile path (so they measure what RLX will use):
launch overhead from a chain of tiny kernels, memory bandwidth from a large elementwise add, and
GEMM throughput per float dtype. Results are cached per machine and overlay the plugin defaults
(:mod:`rlx_core.calibration`, below the hub, reads them back; re-exported here).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .cache import publish_file
from .calibration import apply_calibration, calibration_path, machine_id
from .errors import CalibrationError
from .ir.builder import GraphBuilder
from .runtime import Session

__all__ = ["apply_calibration", "calibrate", "calibration_path", "machine_id"]


def _time(fn: Callable[[], Any], min_time: float) -> float:
    fn()  # warm up (first-run specialisation, caches)
    best = float("inf")
    total = 0.0
    reps = 0
    while total < min_time or reps < 3:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = min(best, dt)
        total += dt
        reps += 1
    return best


def calibrate(backend_name: str, *, quick: bool = False, progress: Callable[[str, float], None] | None = None,
              session_factory: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Measure and cache; returns the measurements. ``progress(label, fraction)`` is called per step."""
    # No fusion: the launch-overhead chain must stay 256 kernels, not become one fused kernel.
    sess = session_factory(backend_name) if session_factory else Session(backend_name, use_cache=False,
                                                                         fusion=False)
    device = sess.device
    min_time = 0.05 if quick else 0.3
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {"backend": backend_name, "device": device.name}
    steps = ["launch overhead", "memory bandwidth", "gemm f32", "gemm f64", "gemm f16"]
    report = progress or (lambda label, frac: None)

    try:
        # 1. launch overhead: 256 dependent tiny adds.
        report(steps[0], 0.0)
        g = GraphBuilder("cal_launch")
        x = g.input("x", "f32", (1,))
        y = x
        n_k = 256
        for _ in range(n_k):
            y = y + x
        g.output(y)
        exe = sess.compile(g.build())
        xin = np.ones(1, np.float32)
        results["launch_overhead"] = _time(lambda: exe.run({"x": xin}), min_time) / (n_k + 1)

        # 2. bandwidth: c = a + b over 16 Mi f32 elements (3 x 64 MiB moved).
        report(steps[1], 0.2)
        n = (1 << 22) if quick else (1 << 24)
        g = GraphBuilder("cal_bw")
        a = g.input("a", "f32", (n,))
        b = g.input("b", "f32", (n,))
        g.output(a + b)
        exe = sess.compile(g.build())
        av, bv = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        t = _time(lambda: exe.run({"a": av, "b": bv}), min_time)
        results["mem_bandwidth"] = 3 * 4 * n / t

        # 3. GEMM throughput per float dtype.
        peaks: dict[str, float] = {}
        for i, dt in enumerate(("f32", "f64", "f16")):
            report(steps[2 + i], 0.4 + 0.2 * i)
            m = 256 if quick else 1024
            g = GraphBuilder(f"cal_gemm_{dt}")
            a = g.input("a", dt, (m, m))
            b = g.input("b", dt, (m, m))
            g.output(a @ b)
            try:
                exe = sess.compile(g.build())
            except Exception as e:  # a backend without this dtype is simply not measured for it
                results.setdefault("skipped", {})[dt] = str(e).splitlines()[0]
                continue
            npdt = {"f32": np.float32, "f64": np.float64, "f16": np.float16}[dt]
            av = rng.standard_normal((m, m)).astype(npdt)
            bv = rng.standard_normal((m, m)).astype(npdt)
            t = _time(functools.partial(exe.run, {"a": av, "b": bv}), min_time)
            peaks[dt] = 2.0 * m**3 / t
        if not peaks:
            raise CalibrationError(f"no GEMM could run on {device.name}",
                                   fix="the backend must claim matmul for at least one float dtype")
        peaks["default"] = min(peaks.values())
        results["peak_flops"] = peaks
        results["host_link_bandwidth"] = device.caps.host_link_bandwidth
        report("done", 1.0)
    except CalibrationError:
        raise
    except Exception as e:
        raise CalibrationError(f"calibration of {backend_name} failed: {type(e).__name__}: {e}",
                               where=f"device {device.name}", fix="run `rlx doctor` to check the backend"
                               ) from e
    results["date"] = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results["machine"] = machine_id()
    p = calibration_path(backend_name, device.name)
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    saved = False
    try:
        tmp.write_text(json.dumps(results, indent=2))
        saved = publish_file(tmp, p)  # plain JSON (readable) plus a MAC sidecar
    except OSError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    results["path"] = str(p) if saved else None
    return results
