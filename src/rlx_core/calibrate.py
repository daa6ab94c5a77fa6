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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cache import publish_file
from .calibration import apply_calibration, calibration_path, machine_id
from .errors import CalibrationError
from .ir.builder import GraphBuilder
from .ir.graph import Graph
from .runtime import Session
from .timing import Timing, time_best

__all__ = ["REFUSE_FACTOR", "Verdict", "apply_calibration", "calibrate", "calibration_path", "judge",
           "machine_id"]


#: A benchmark this many times slower than the plugin's own estimate is not stored without --force.
REFUSE_FACTOR = 4.0

Timer = Callable[[str, Callable[[], Any]], Timing]


def _plugin_estimator(sess: Any) -> tuple[Callable[[Graph], float | None], Any]:
    """Seconds the plugin itself estimates for a graph: its declared caps, not a stored calibration
    (which the hub overlays on the session's device), so a bad calibration cannot vouch for itself."""
    try:
        raw = next(d for d in sess.backend.call("rlx_probe_devices") or [] if d.name == sess.device.name)
        est = Session(sess.device.name, hub=sess.hub, use_cache=False, fusion=False)
    except Exception:  # no estimate to compare with: nothing is refused
        return (lambda g: None), None
    est.devices = [(sess.backend, raw)]
    est.backend, est.device = est.devices[0]
    plugin_caps = raw.caps

    def estimate(g: Graph) -> float | None:
        try:
            return float(est.plan(g).total_seconds)
        except Exception:  # an estimate is advice: a graph the plan cannot price is just not compared
            return None

    return estimate, plugin_caps


def calibrate(backend_name: str, *, quick: bool = False, force: bool = False,
              progress: Callable[[str, float], None] | None = None,
              session_factory: Callable[[str], Any] | None = None,
              timer: Timer | None = None,
              estimator: Callable[[Graph], float | None] | None = None) -> dict[str, Any]:
    """Measure and cache; returns the measurements. ``progress(label, fraction)`` is called per step.

    Each benchmark is timed in several rounds (the best call of each) and the best round is kept:
    noise only ever slows a run. A try that looks contended (rounds disagree, other processes use
    the CPUs) is repeated, up to three tries. Every benchmark is compared with the plugin's own
    estimate for the same graph; one more than ``REFUSE_FACTOR`` times slower (a busy machine, a
    throttled core) is refused with a :class:`CalibrationError` unless ``force`` (then stored,
    flagged unreliable, so auto-placement still avoids the device). ``timer(label, fn)`` and
    ``estimator(graph)`` replace the clock and the plugin's estimate (tests)."""
    # No fusion: the launch-overhead chain must stay 256 kernels, not become one fused kernel.
    sess = session_factory(backend_name) if session_factory else Session(backend_name, use_cache=False,
                                                                         fusion=False)
    device = sess.device
    rounds, min_time = (3, 0.03) if quick else (5, 0.1)
    clock: Timer = timer or (lambda label, fn: time_best(fn, rounds=rounds, min_time=min_time))
    estimate, plugin_caps = (estimator, None) if estimator else _plugin_estimator(sess)
    trusted = plugin_caps is None or not plugin_caps.unreliable
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {"backend": backend_name, "device": device.name}
    benchmarks: dict[str, Any] = {}
    steps = ["launch overhead", "memory bandwidth", "gemm f32", "gemm f64", "gemm f16"]
    report = progress or (lambda label, frac: None)

    def measure(label: str, graph: Graph, fn: Callable[[], Any]) -> float:
        # A contended try is timed again (twice at most) and the fastest try kept: a burst of
        # load passes, and only what a quiet moment shows is stored.
        t, tries = clock(label, fn), 1
        while t.contended and tries < 3:
            again, tries = clock(label, fn), tries + 1
            t = again if again.best < t.best else t
        est = estimate(graph)
        benchmarks[label] = {**t.to_json(), "tries": tries, "estimate": est,
                             "slowdown": None if not est else t.best / est, "how": t.describe()}
        return t.best

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
        graph = g.build()
        exe = sess.compile(graph)
        xin = np.ones(1, np.float32)
        results["launch_overhead"] = measure(steps[0], graph, lambda: exe.run({"x": xin})) / (n_k + 1)

        # 2. bandwidth: c = a + b over 16 Mi f32 elements (3 x 64 MiB moved).
        report(steps[1], 0.2)
        n = (1 << 22) if quick else (1 << 24)
        g = GraphBuilder("cal_bw")
        a = g.input("a", "f32", (n,))
        b = g.input("b", "f32", (n,))
        g.output(a + b)
        graph = g.build()
        exe = sess.compile(graph)
        av, bv = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        t = measure(steps[1], graph, lambda: exe.run({"a": av, "b": bv}))
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
            graph = g.build()
            try:
                exe = sess.compile(graph)
            except Exception as e:  # a backend without this dtype is simply not measured for it
                results.setdefault("skipped", {})[dt] = str(e).splitlines()[0]
                continue
            npdt = {"f32": np.float32, "f64": np.float64, "f16": np.float16}[dt]
            av = rng.standard_normal((m, m)).astype(npdt)
            bv = rng.standard_normal((m, m)).astype(npdt)
            t = measure(steps[2 + i], graph, functools.partial(exe.run, {"a": av, "b": bv}))
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
    verdict = judge(benchmarks, trusted=trusted)
    if verdict.refused and not force:
        raise CalibrationError(
            f"calibration of {device.name} not stored: {'; '.join(verdict.refused)}",
            where=f"`rlx calibrate {backend_name}{' --quick' if quick else ''}`",
            fix="re-run on an idle machine (close other heavy programs; `rlx calibrate` without --quick "
                "times longer and bigger graphs), or add --force to store these figures anyway (the "
                "device then stays out of automatic placement)")
    results["warnings"] = verdict.warnings
    results["method"] = {"quick": quick, "rounds": rounds, "min_time_per_round": min_time, "forced": force,
                         "refuse_factor": REFUSE_FACTOR, "plugin_estimate_trusted": trusted,
                         "benchmarks": benchmarks}
    if verdict.refused:  # stored with --force
        results["unreliable"] = f"calibration stored with --force: {'; '.join(verdict.refused)}"
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


@dataclass
class Verdict:
    #: why storing is refused (one line per benchmark far slower than the plugin's estimate)
    refused: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def judge(benchmarks: dict[str, Any], *, trusted: bool = True) -> Verdict:
    """Refuse benchmarks more than REFUSE_FACTOR slower than the plugin's estimate (only when the
    plugin trusts its own figures); warn about rounds that disagree or a busy machine."""
    v = Verdict()
    for label, b in benchmarks.items():
        busy = b.get("contended", False)
        slow = b.get("slowdown")
        if slow is not None and slow > REFUSE_FACTOR:
            msg = (f"{label} ran {slow:.1f}x slower than the plugin estimates "
                   f"({_fmt(b['best'])} measured vs {_fmt(b['estimate'])}; {b['how']})")
            if busy:
                msg += "; the machine looked busy"
            (v.refused if trusted else v.warnings).append(
                msg if trusted else msg + " (the plugin flags its own figures as rough, so they are kept)")
        elif busy:
            v.warnings.append(f"{label}: the machine looked busy ({b['how']}); the figure may be low")
    return v


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms"
