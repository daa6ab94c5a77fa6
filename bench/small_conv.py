"""Tiny float32 convolutions on rlx-cpu: the one-call path (``rlx_cpu.conv._small_conv``: im2col by
offset tables + oneDNN's sgemm + the tail) vs oneDNN's convolution primitive, and vs a single-node
ONNX Runtime session, on the conv shapes of the zoo models this path is for.

    python bench/small_conv.py [--calls 2000] [--rounds 5]

Both rlx-cpu sides are bound in this process (``conv.SMALL_MACS = 0`` forces oneDNN); bursts of
``--calls`` calls alternate between them (and ORT), so drift and other processes' load hit each
alike; each figure is the median over rounds of a burst's median, in microseconds. Shapes over
``SMALL_MACS`` are listed too (the path is off there: both rlx columns then time oneDNN). A
benchmark, not a test: numbers depend on the machine and its other load.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

#: name -> (x shape, w shape, strides, pads (t, l, b, r), groups)
CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, int], tuple[int, int, int, int], int]] = {
    "ViT patch 3->32 8x8/8 on 32x32": ((1, 3, 32, 32), (32, 3, 8, 8), (8, 8), (0, 0, 0, 0), 1),
    "ViT patch, 8 images": ((8, 3, 32, 32), (32, 3, 8, 8), (8, 8), (0, 0, 0, 0), 1),
    "Whisper conv1d 16->32 k3 L32": ((1, 16, 1, 32), (32, 16, 1, 3), (1, 1), (0, 1, 0, 1), 1),
    "Whisper conv1d 32->32 k3/2 L32": ((1, 32, 1, 32), (32, 32, 1, 3), (1, 2), (0, 1, 0, 1), 1),
    "conv1d 1->16 k5/2 L400": ((1, 1, 1, 400), (16, 1, 1, 5), (1, 2), (0, 2, 0, 2), 1),
    "conv1d 16->32 k5/2 L100": ((1, 16, 1, 100), (32, 16, 1, 5), (1, 2), (0, 2, 0, 2), 1),
    "conv1d 32->32 k3 groups 4 L25": ((1, 32, 1, 25), (32, 8, 1, 3), (1, 1), (0, 1, 0, 1), 4),
    "ConvNeXt stem 3->16 4x4/4 on 64x64": ((1, 3, 64, 64), (16, 3, 4, 4), (4, 4), (0, 0, 0, 0), 1),
    "ConvNeXt down 16->32 2x2/2 on 16x16": ((1, 16, 16, 16), (32, 16, 2, 2), (2, 2), (0, 0, 0, 0), 1),
    "depthwise 7x7, 16 ch on 16x16": ((1, 16, 16, 16), (16, 1, 7, 7), (1, 1), (3, 3, 3, 3), 16),
}


def _burst(fn: Callable[[], Any], calls: int) -> float:
    from rlx_core.bench import measure

    return statistics.median(measure(fn, calls, 0.0, calls)) * 1e6


def _ort(xs: tuple[int, ...], w: np.ndarray, b: np.ndarray, st: tuple[int, int], pd: tuple[int, ...],
         g: int) -> Callable[[], Any] | None:
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=list(st), pads=list(pd), group=g)
    graph = helper.make_graph([node], "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {"x": np.zeros(xs, np.float32)}
    return lambda: sess.run(None, feed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="calls a burst")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    from rlx_cpu import conv

    rng = np.random.default_rng(0)
    print(f"{'conv':38s} {'MACs':>7s} {'oneDNN us':>10s} {'one call us':>12s} {'ORT node us':>12s} "
          f"{'one call / oneDNN':>18s}")
    for name, (xs, ws, st, pd, g) in CASES.items():
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        w.flags.writeable = False
        b = rng.standard_normal(ws[0]).astype(np.float32)
        ho = (xs[2] + pd[0] + pd[2] - ws[2]) // st[0] + 1
        wo = (xs[3] + pd[1] + pd[3] - ws[3]) // st[1] + 1
        outs = [np.empty((xs[0], ws[0], ho, wo), np.float32) for _ in range(2)]
        keep = conv.SMALL_MACS
        conv.SMALL_MACS = 0
        onednn = conv.conv2d_float(x, w, outs[0], st, pd, (1, 1), g, b)
        conv.SMALL_MACS = keep
        small = conv.conv2d_float(x, w, outs[1], st, pd, (1, 1), g, b)
        onednn()
        small()
        np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)
        peer = _ort(xs, np.asarray(w), b, st, pd, g)
        sides = [onednn, small] + ([peer] if peer else [])
        for fn in sides:
            _burst(fn, 50)
        got: list[list[float]] = [[] for _ in sides]
        for _ in range(a.rounds):
            for fn, acc in zip(sides, got):
                acc.append(_burst(fn, a.calls))
        med = [statistics.median(v) for v in got]
        macs = outs[0].size * ws[1] * ws[2] * ws[3]
        ort_us = f"{med[2]:12.1f}" if peer else f"{'-':>12s}"
        print(f"{name:38s} {macs / 1e3:6.0f}K {med[0]:10.1f} {med[1]:12.1f} {ort_us} {med[1] / med[0]:18.2f}")


if __name__ == "__main__":
    main()
