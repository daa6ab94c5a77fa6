"""``rlx calibrate BACKEND``: measure a device's capabilities with micro-benchmarks, cache them.

The benchmarks run through the backend's own compile path (so they measure what RLX will use):
launch overhead from a chain of tiny kernels, memory bandwidth from a large elementwise add, and
GEMM throughput per float dtype. Results are cached per machine and overlay the plugin defaults.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import CalibrationError, RLXError


def machine_id() -> str:
    raw = "|".join([platform.node(), platform.machine(), platform.processor(), str(os.cpu_count())])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def calibration_path(backend: str, device: str) -> Path:
    from .cache import cache_subdir, default_cache_dir

    safe = device.replace(":", "_")
    # Results, not a cache: kept under RLX_NO_CACHE=1. Where the cache root is unusable the path
    # is outside any authenticated root, so reading finds nothing and saving is skipped.
    d = cache_subdir("calibration", ignore_no_cache=True) or default_cache_dir() / "calibration"
    return d / f"{backend}-{safe}-{machine_id()}.json"


def _read_calibration(p: Path) -> str:
    """The file's text if its MAC sidecar matches (a planted or edited file is deleted, as missing)."""
    from .cache import read_sealed

    raw = read_sealed(p)
    if raw is None:
        raise FileNotFoundError(str(p))
    return raw.decode("utf-8", "replace")


def _rate(value: Any, key: str, *, zero_ok: bool = False) -> float:
    # bool is an int to Python but never a measurement; NaN and inf would poison every cost.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} is {value!r}, not a number")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        raise ValueError(f"{key} is {value!r}, not a finite {'non-negative' if zero_ok else 'positive'} "
                         "number")
    return v


def apply_calibration(device: Any) -> Any:
    """Overlay cached measurements (if any) on a device's plugin-declared caps.

    A calibration file that cannot be used (unreadable, malformed, NaN or infinite numbers) is
    ignored with a warning naming it, and the device keeps its plugin defaults, its ``caps.source``
    saying why: a bad cache file must neither break the device nor, by breaking it, move the default
    device to another backend.
    """
    if not device.available:
        return device
    p = calibration_path(device.backend, device.name)
    try:
        text = _read_calibration(p)
    except FileNotFoundError:
        return device
    except OSError as e:
        return _ignored(device, p, f"it cannot be read ({e.strerror or e})")
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("peak_flops"), dict):
            raise ValueError("it has no 'peak_flops' object")
        link = data.get("host_link_bandwidth", device.caps.host_link_bandwidth)
        caps = dataclasses.replace(
            device.caps,
            peak_flops={str(k): _rate(v, f"peak_flops[{k!r}]") for k, v in data["peak_flops"].items()},
            mem_bandwidth=_rate(data.get("mem_bandwidth"), "mem_bandwidth"),
            launch_overhead=_rate(data.get("launch_overhead"), "launch_overhead", zero_ok=True),
            host_link_bandwidth=None if link is None else _rate(link, "host_link_bandwidth"),
            source=f"calibrated {data.get('date', '?')}")
    except (ValueError, TypeError, RLXError) as e:
        return _ignored(device, p, str(e.what if isinstance(e, RLXError) else e))
    return dataclasses.replace(device, caps=caps)


def _ignored(device: Any, path: Path, why: str) -> Any:
    warnings.warn(f"calibration file {path} for {device.name} is ignored: {why}; the device uses its "
                  f"plugin defaults (fix: run `rlx calibrate {device.backend}` again, or delete the file)",
                  RuntimeWarning, stacklevel=3)
    caps = dataclasses.replace(device.caps, source=f"{device.caps.source} (calibration file ignored: {why})")
    return dataclasses.replace(device, caps=caps)


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
    import numpy as np

    from .ir.builder import GraphBuilder
    from .runtime import Session

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
            t = _time(lambda exe=exe, av=av, bv=bv: exe.run({"a": av, "b": bv}), min_time)
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
    from .cache import publish_file

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
