"""The ONNX model zoo on rlx-cpu vs ONNX Runtime: p50 latency per model at batch 1 and 8, one run.

    python bench/onnx_zoo.py [--models a,b] [--all] [--reps 30] [--json PATH]

Every model of tests/_zoo.py (random weights, tiny configs) is exported with static shapes at each
batch, by the TorchScript exporter, else by the dynamo one (the first file that imports and matches
ONNX Runtime within 1e-4 x output scale is timed); the same feeds run through ``Executable.run`` on
rlx-cpu, then ``InferenceSession.run`` on ONNX Runtime's CPU provider (default threads), each after
warm-up runs. Prints p50s and the RLX/ORT ratio per model and batch, and their geometric mean; a
model that cannot run is listed with the reason. ``--all`` adds the zoo_slow models (Swin, RetinaNet).
Exports are cached where the tests cache them (.pytest_cache/rlx-onnx-zoo/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import _zoo  # noqa: E402

BATCHES = (1, 8)


def _p50(fn: Any, feeds: dict[str, Any], reps: int) -> float:
    for _ in range(3):  # warm-up: specialisation, thread pools, caches
        fn(feeds)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench_model(name: str, reps: int, cache: Path) -> dict[str, Any]:
    from rlx_core.frontends.onnx import load_onnx
    from rlx_core.runtime import Session

    row: dict[str, Any] = {"model": name}
    for b in BATCHES:
        problems = []
        for exporter in _zoo.EXPORTERS:
            feeds = _zoo.feeds(name, b)
            try:
                path = _zoo.export(name, exporter, False, cache, batch=b)
                err = _zoo.compare(path, [feeds])
            except Exception as e:  # reported per model; the run goes on
                problems.append(f"{exporter}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                continue
            if err > _zoo.RTOL:
                problems.append(f"{exporter}: max error {err:.3g} x scale")
                continue
            exe = Session("cpu").compile(load_onnx(path))
            sess = _zoo.ort_session(path)
            rlx = _p50(exe.run, feeds, reps)
            ort = _p50(lambda f, s=sess: s.run(None, f), feeds, reps)
            row[f"b{b}"] = {"exporter": exporter, "rlx_ms": rlx, "ort_ms": ort, "ratio": rlx / ort,
                            "max_rel_error": err}
            break
        else:
            row["skipped"] = "; ".join(problems)
            return row
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", help="comma-separated zoo names (default: every model not zoo_slow)")
    ap.add_argument("--all", action="store_true", help="include the zoo_slow models")
    ap.add_argument("--reps", type=int, default=30, help="timed runs per model, batch and runtime")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    os.environ.setdefault("RLX_BACKENDS", "cpu")
    warnings.simplefilter("ignore")
    names = args.models.split(",") if args.models else [m.name for m in _zoo.ZOO.values()
                                                        if args.all or not m.slow]
    unknown = [n for n in names if n not in _zoo.ZOO]
    if unknown:
        ap.error(f"unknown zoo models {unknown}; choose from {sorted(_zoo.ZOO)}")
    cache = ROOT / ".pytest_cache" / "rlx-onnx-zoo"
    rows = []
    head = " ".join(f"{'b' + str(b) + ' rlx ms':>11} {'ort ms':>8} {'ratio':>6}" for b in BATCHES)
    print(f"{'model':26} {head}", flush=True)
    for name in names:
        row = bench_model(name, args.reps, cache)
        rows.append(row)
        if "skipped" in row:
            print(f"{name:26} skipped: {row['skipped']}", flush=True)
            continue
        print(f"{name:26} " + " ".join(
            f"{row[f'b{b}']['rlx_ms']:11.3f} {row[f'b{b}']['ort_ms']:8.3f} {row[f'b{b}']['ratio']:6.2f}"
            for b in BATCHES), flush=True)
    geo = {}
    for b in BATCHES:
        ratios = [r[f"b{b}"]["ratio"] for r in rows if "skipped" not in r]
        geo[f"b{b}"] = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
    print("geometric mean RLX/ORT: " + ", ".join(
        f"batch {b}: {geo[f'b{b}']:.2f}" if geo[f"b{b}"] else f"batch {b}: n/a" for b in BATCHES)
        + f" over {sum('skipped' not in r for r in rows)} models")
    if args.json:
        import onnxruntime

        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.machine(),
                "cpus": os.cpu_count(), "python": platform.python_version(),
                "onnxruntime": onnxruntime.__version__, "versions": _zoo._versions(), "reps": args.reps,
                "load_avg": os.getloadavg()}
        Path(args.json).write_text(json.dumps({"meta": meta, "models": rows, "geomean": geo}, indent=1))


if __name__ == "__main__":
    main()
