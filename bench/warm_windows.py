"""One runtime's p50 over consecutive windows of calls in fresh processes: shows drift after start-up
and how much a process's own p50 differs from the next one's (on a shared VM the same code can settle
at two levels), which a single p50 a process hides.

    python bench/warm_windows.py mlp --batch 1 --procs 4            # rlx-cpu, then ORT, alternating
    python bench/warm_windows.py resnet18 --batch 1 --windows 5 --calls 20
    python bench/warm_windows.py mlp --batch 1 --procs 6 --old /tmp/old   # A/B: an older tree too

``--old DIR``: a third runtime, ``old``, runs rlx-cpu from an older tree (``DIR/src`` and the
``rlx_cpu`` package under ``DIR/cpu``, as ``bench/onnx_zoo_ab.py`` takes it) in processes that
alternate with the others; the summary gives each runtime's median over processes of a process's
median window, and the ratios to ONNX Runtime.

Each process compiles (or opens an ONNX Runtime session on) the ``rlx bench infer`` export of the
model, makes two warm-up calls, then prints the median of each window of ``--calls`` calls in
microseconds. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys


def _child(runtime: str, model: str, batch: int, windows: int, calls: int) -> None:
    from rlx_core import bench

    feed = bench.inputs(model, batch, 128)
    if runtime in ("rlx", "old"):
        from rlx_core.runtime import Session

        exe = Session("cpu").compile(bench.rlx_graph(model))

        def fn() -> None:
            exe.run(feed)
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = len(os.sched_getaffinity(0))
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(bench.onnx_path(model)), so, providers=["CPUExecutionProvider"])

        def fn() -> None:
            sess.run(None, feed)
    out = [f"{statistics.median(bench.measure(fn, calls, 0.0, calls)) * 1e6:.1f}" for _ in range(windows)]
    print(f"{runtime:4s} {model} b{batch}: " + " ".join(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="an `rlx bench infer` model (mlp, resnet18, minilm)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--procs", type=int, default=2, help="processes per runtime (alternating)")
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--calls", type=int, default=200, help="calls a window")
    ap.add_argument("--old", help="an older tree (DIR/src, DIR/cpu) to run as a third runtime")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.child, a.model, a.batch, a.windows, a.calls)
        return
    from rlx_core import bench

    bench.onnx_path(a.model)  # export once, outside the timed processes
    print(f"p50 us per window of {a.calls} calls; load {os.getloadavg()}")
    runtimes = ("rlx", "old", "ort") if a.old else ("rlx", "ort")
    per: dict[str, list[float]] = {rt: [] for rt in runtimes}
    for _ in range(a.procs):
        for rt in runtimes:
            env = dict(os.environ)
            if rt == "old":
                paths = [f"{a.old}/src", f"{a.old}/cpu", env.get("PYTHONPATH", "")]
                env["PYTHONPATH"] = os.pathsep.join(paths)
            out = subprocess.run([sys.executable, __file__, a.model, "--batch", str(a.batch), "--windows",
                                  str(a.windows), "--calls", str(a.calls), "--child", rt],
                                 check=True, env=env, capture_output=True, text=True).stdout
            line = out.strip().splitlines()[-1]
            print(line, flush=True)
            per[rt].append(statistics.median(float(v) for v in line.split(":", 1)[1].split()))
    med = {rt: statistics.median(v) for rt, v in per.items()}
    print("median over processes of each one's median window (us): "
          + ", ".join(f"{rt} {m:.1f}" for rt, m in med.items()))
    print("ratios: " + ", ".join(f"{rt}/ort {med[rt] / med['ort']:.3f}" for rt in runtimes if rt != "ort")
          + (f", rlx/old {med['rlx'] / med['old']:.3f}" if a.old else ""))


if __name__ == "__main__":
    main()
