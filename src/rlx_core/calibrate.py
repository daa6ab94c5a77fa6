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
from .dtypes import DType
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
    # whether the plugin vouches for its own figures (the device's caps where its raw probe is unknown)
    trusted = not getattr(plugin_caps if plugin_caps is not None else device.caps, "unreliable", "")
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

        # A device with its own memory also moves every input and output over the host link; timing
        # one kernel would price that link as the kernel's bandwidth or FLOP/s (on an H200, 300x
        # below HBM). There, a chain of k kernels is timed too: the difference is k-1 kernels alone.
        # Bandwidth is taken that way everywhere: one run of one add also pays for its output's
        # first-touch page faults (a 16-core host: 4.8 GB/s, which priced the demo MLP 3x too slow).
        chain = 1 if getattr(device, "host_memory", True) else 4
        kept: dict[str, str] = {}
        base = plugin_caps if plugin_caps is not None else device.caps  # figures kept where unmeasurable

        def per_kernel(label: str, build: Callable[[int], Graph], feed: dict[str, Any],
                       chain: int = chain) -> float | None:
            """Seconds of one kernel, or None where the host link hides it."""
            graph = build(1)
            exe = sess.compile(graph)
            t1 = measure(label, graph, functools.partial(exe.run, feed))
            if chain == 1:
                return t1
            graph = build(chain)
            exe = sess.compile(graph)
            tk = measure(f"{label} (chain of {chain})", graph, functools.partial(exe.run, feed))
            # Kernels that add less than a quarter to the link's time drown in its noise (an H200
            # moves the inputs of a 1024^3 GEMM over PCIe in 1 ms and multiplies them in 10 us):
            # such a difference is no measurement, and the plugin's figure is kept instead.
            if tk - t1 < 0.25 * t1:
                kept[label] = (f"not measured: the host link takes nearly all of the time ({_fmt(t1)} for "
                               f"one kernel, {_fmt(tk)} for {chain}); the plugin's figure is kept")
                return None
            return (tk - t1) / (chain - 1)

        # 2. bandwidth: c = a + b over 16 Mi f32 elements (3 x 64 MiB moved).
        report(steps[1], 0.2)
        n = (1 << 22) if quick else (1 << 24)

        def bw_graph(k: int) -> Graph:
            g = GraphBuilder(f"cal_bw{k}")
            a = g.input("a", "f32", (n,))
            b = g.input("b", "f32", (n,))
            y = a + b
            for _ in range(k - 1):
                y = y + b
            g.output(y)
            return g.build()

        av, bv = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        t_bw = per_kernel(steps[1], bw_graph, {"a": av, "b": bv}, chain=4)
        results["mem_bandwidth"] = base.mem_bandwidth if t_bw is None else 3 * 4 * n / t_bw

        # 3. GEMM throughput per float dtype.
        peaks: dict[str, float] = {}
        for i, dt in enumerate(("f32", "f64", "f16")):
            report(steps[2 + i], 0.4 + 0.2 * i)
            m = 256 if quick else 1024

            def gemm_graph(k: int, dt: str = dt, m: int = m) -> Graph:
                g = GraphBuilder(f"cal_gemm_{dt}{k}")
                a = g.input("a", dt, (m, m))
                b = g.input("b", dt, (m, m))
                y = a @ b
                for _ in range(k - 1):
                    y = y @ b
                g.output(y)
                return g.build()

            try:
                sess.compile(gemm_graph(1))
            except Exception as e:  # a backend without this dtype is simply not measured for it
                results.setdefault("skipped", {})[dt] = str(e).splitlines()[0]
                continue
            npdt = {"f32": np.float32, "f64": np.float64, "f16": np.float16}[dt]
            av = rng.standard_normal((m, m)).astype(npdt)
            # scaled so that a chain of products stays O(1) (no f16 overflow to inf)
            bv = (rng.standard_normal((m, m)) / np.sqrt(m)).astype(npdt)
            t_mm = per_kernel(steps[2 + i], gemm_graph, {"a": av, "b": bv})
            peaks[dt] = base.peak(DType(dt)) if t_mm is None else 2.0 * m**3 / t_mm
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
    results["warnings"] = verdict.warnings + [f"{k}: {v}" for k, v in kept.items()]
    results["method"] = {"quick": quick, "rounds": rounds, "min_time_per_round": min_time, "forced": force,
                         "refuse_factor": REFUSE_FACTOR, "plugin_estimate_trusted": trusted,
                         "benchmarks": benchmarks}
    if verdict.refused:  # stored with --force
        results["unreliable"] = f"calibration stored with --force: {'; '.join(verdict.refused)}"
    elif not trusted and any(b.get("contended") for b in benchmarks.values()):
        # No estimate of the plugin's to vouch for figures timed on a busy machine: keep the flag.
        results["unreliable"] = (f"calibrated while the machine was busy; run `rlx calibrate {backend_name}` "
                                 "again on an idle machine")
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
