"""The cost model against measured run time: each estimate within 3x of the best measured run.

    python -m rlx_core.costmodel_check cpu wasm vulkan     # exit 1 when an estimate is off

For the ``rlx demo`` graphs (batch 4, 64, 512) on each named device, the planner's estimate (the
device's calibration where one is stored, else the plugin's figures) is compared with the best of
several rounds of steady-state runs. A benchmark-style check, not a unit test, built so that a
busy shared machine cannot make it fail spuriously:

* noise (another process, a frequency dip) only ever slows a run, so the best of many runs is the
  measurement and a run *faster* than estimate/3 is a real finding, whatever the load;
* a run *slower* than 3x the estimate is re-timed (``retries``), keeping the best over all tries,
  and when the machine was still busy (rounds disagreeing, or other processes using a quarter of
  the CPUs, :mod:`rlx_core.timing`) the result is ``busy``: inconclusive, reported, not a failure.
  On an idle machine a device slower than 3x its estimate fails every time.

A machine whose devices differ from the plugins' defaults is brought in line by ``rlx calibrate``
(the check then uses the measured figures); that is what calibration is for.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .timing import Timing, time_best

#: an estimate passes when best measured / estimate lies in [1/FACTOR, FACTOR]
FACTOR = 3.0
DEMO_BATCHES = (4, 64, 512)


def demo_graph(batch: int) -> Any:
    """The ``rlx demo`` model: 784 -> 128 -> relu -> 10 -> softmax with seeded weights."""
    import numpy as np

    from .ir.builder import GraphBuilder

    rng = np.random.default_rng(0)
    g = GraphBuilder("rlx_demo_mlp")
    x = g.input("x", "f32", (batch, 784))
    w1 = g.param("w1", (rng.standard_normal((784, 128)) * math.sqrt(2 / 784)).astype(np.float32))
    b1 = g.param("b1", (rng.standard_normal(128) * 0.01).astype(np.float32))
    w2 = g.param("w2", (rng.standard_normal((128, 10)) * math.sqrt(2 / 128)).astype(np.float32))
    b2 = g.param("b2", (rng.standard_normal(10) * 0.01).astype(np.float32))
    h = g.relu(x @ w1 + b1)
    g.output(g.softmax(h @ w2 + b2, axis=-1), "probs")
    return g.build()


@dataclass(frozen=True)
class CostCheck:
    device: str
    graph: str
    estimate: float | None
    timing: Timing | None = None
    #: "pass", "fail", "busy" (too slow while the machine was busy: inconclusive) or "skip"
    verdict: str = "skip"
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.timing is None or not self.estimate else self.timing.best / self.estimate

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "graph": self.graph, "estimate": self.estimate,
                "measured": None if self.timing is None else self.timing.to_json(), "ratio": self.ratio,
                "verdict": self.verdict, "note": self.note}


def verdict(estimate: float, timing: Timing, factor: float = FACTOR) -> str:
    ratio = timing.best / estimate
    if ratio < 1 / factor:
        return "fail"  # faster than the estimate allows: noise never speeds a run up
    if ratio <= factor:
        return "pass"
    return "busy" if timing.contended else "fail"


def check(device: str, name: str, *, estimate: float | None, run: Callable[[], Any] | None,
          timer: Callable[[Callable[[], Any]], Timing], retries: int = 2, factor: float = FACTOR,
          note: str = "") -> CostCheck:
    """One graph on one device: ``timer(run)`` gives the best of its rounds; a run too slow for
    the estimate is timed again up to ``retries`` times and the fastest try kept (a device really
    that slow stays that slow; a burst of load passes)."""
    if estimate is None or run is None:
        return CostCheck(device, name, estimate, note=note or "cannot run here")
    t = timer(run)
    for _ in range(retries):
        if t.best <= estimate * factor:
            break  # within the bound, or faster than it: more tries cannot change that
        again = timer(run)
        t = again if again.best < t.best else t
    v = verdict(estimate, t, factor)
    why = ""
    if v == "fail":
        side = "faster" if t.best < estimate else "slower"
        why = f"ran {t.best / estimate:.2f}x the estimate ({side} than {factor:g}x allows; {t.describe()})"
    elif v == "busy":
        why = f"inconclusive: {t.best / estimate:.2f}x the estimate on a busy machine ({t.describe()})"
    return CostCheck(device, name, estimate, t, v, "; ".join(x for x in (note, why) if x))


def check_device(device: str, batches: Sequence[int] = DEMO_BATCHES, *, rounds: int = 5,
                 min_time: float = 0.05, retries: int = 2, factor: float = FACTOR) -> list[CostCheck]:
    import numpy as np

    from .cost import estimate
    from .errors import RLXError
    from .runtime import Session

    out: list[CostCheck] = []
    for batch in batches:
        graph = demo_graph(batch)
        est = estimate(graph, device)
        if est.seconds is None:
            out.append(CostCheck(device, f"{graph.name}[b{batch}]", None, note=f"cannot run: {est.error}"))
            continue
        try:
            sess = Session(device, use_cache=False)
            exe = sess.compile(graph)
        except RLXError as e:
            out.append(CostCheck(device, f"{graph.name}[b{batch}]", None, note=f"cannot run: {e.what}"))
            continue
        x = np.random.default_rng(1).standard_normal((batch, 784)).astype(np.float32)
        caps = sess.device.caps
        note = caps.source + ("; flagged unreliable" if caps.unreliable else "")
        out.append(check(device, f"{graph.name}[b{batch}]", estimate=est.seconds,
                         run=functools.partial(exe.run, {"x": x}), retries=retries, factor=factor, note=note,
                         timer=lambda fn: time_best(fn, rounds=rounds, min_time=min_time)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlx_core.costmodel_check",
                                 description="Check the cost model's estimates against measured run time.")
    ap.add_argument("devices", nargs="*", help="devices or backends (default: every installed backend)")
    ap.add_argument("--factor", type=float, default=FACTOR, help="allowed ratio either way (default 3)")
    ap.add_argument("--batch", type=int, action="append", help="demo batch sizes (default 4, 64, 512)")
    ap.add_argument("--json", dest="json_path", help="also write the results as JSON here")
    a = ap.parse_args(argv)
    if not a.devices:
        from ._hub import hub

        a.devices = hub().names()
    results = [r for d in a.devices for r in check_device(d, a.batch or DEMO_BATCHES, factor=a.factor)]
    for r in results:
        ratio = "-" if r.ratio is None else f"{r.ratio:5.2f}x"
        est = "-" if r.estimate is None else f"{r.estimate * 1e6:10.1f} us"
        best = "-" if r.timing is None else f"{r.timing.best * 1e6:10.1f} us"
        print(f"{r.verdict:5} {r.device:9} {r.graph:20} est {est:>13}  best {best:>13}  {ratio:>7}  {r.note}")
    if a.json_path:
        with open(a.json_path, "w", encoding="utf-8") as f:
            json.dump([r.to_json() for r in results], f, indent=2)
    failed = [r for r in results if r.verdict == "fail"]
    busy = [r for r in results if r.verdict == "busy"]
    passed = sum(r.verdict == "pass" for r in results)
    skipped = sum(r.verdict == "skip" for r in results)
    print(f"{passed} passed, {skipped} skipped (cannot run here), {len(busy)} inconclusive (machine busy), "
          f"{len(failed)} failed (estimate not within {a.factor:g}x of the best measured run)")
    if failed:
        print("fix: correct the plugin's DeviceCaps or cost hook for the failing device, or run "
              "`rlx calibrate BACKEND` on this machine and check again", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
