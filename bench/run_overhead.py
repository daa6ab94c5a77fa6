"""Per-call overhead of a tiny graph (one add of 4 floats): RLX's Executable.run vs ONNX Runtime's
InferenceSession.run vs the bare NumPy ufunc, in one run. Best of 7 rounds of N calls each.

    python bench/run_overhead.py [--calls 2000] [--device cpu]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np


def best_us(fn: Callable[[], object], calls: int, rounds: int = 7) -> float:
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    from rlx_core import GraphBuilder, Session

    g = GraphBuilder("tiny")
    x = g.input("x", "f32", (4,))
    g.output(g.add(x, x), "y")
    exe = Session(args.device, use_cache=False).compile(g.build())
    xv = np.ones(4, np.float32)
    out = np.empty(4, np.float32)
    rows = [("numpy ufunc", best_us(lambda: np.add(xv, xv, out=out), args.calls)),
            (f"rlx {args.device}", best_us(lambda: exe.run({"x": xv}), args.calls))]
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper

        m = helper.make_model(helper.make_graph(
            [helper.make_node("Add", ["x", "x"], ["y"])], "tiny",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]),
            opset_imports=[helper.make_opsetid("", 17)])
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        rows.append(("onnxruntime", best_us(lambda: sess.run(None, {"x": xv}), args.calls)))
    except ImportError:
        pass
    base = dict(rows).get("onnxruntime")
    for name, us in rows:
        ratio = f"  {us / base:.2f}x ORT" if base else ""
        print(f"{name:14s} {us:8.2f} us/call{ratio}")


if __name__ == "__main__":
    main()
