"""rlx-cpu's direct kernel for convs with few input channels (``rlx_cpu._stemconv``) vs oneDNN's
conv, both on two OpenMP threads in one process, calls alternating: the stems of ResNet (7x7 s2),
MobileNet (3x3 s2), VGG (3x3 s1) and ConvNeXt (4x4 s4) at 224x224 and the zoo's 64x64, NCHW input,
ReLU after (oneDNN's relu post-op). ``stem`` writes oneDNN's nChw16c, ``stem-nhwc`` NHWC. What
``rlx_cpu.stem_conv.MIN_TAPS`` / ``OC_MULTIPLE`` were chosen from. A benchmark, not a test.

    python bench/stem_conv.py
    python bench/stem_conv.py --threads 1
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _onednn_conv import relu_conv

CASES = {  # name: (input shape, weight shape, stride, pad)
    "resnet 7x7 s2 224 b1": ((1, 3, 224, 224), (64, 3, 7, 7), 2, 3),
    "resnet 7x7 s2 224 b8": ((8, 3, 224, 224), (64, 3, 7, 7), 2, 3),
    "resnet 7x7 s2 64 b1": ((1, 3, 64, 64), (64, 3, 7, 7), 2, 3),
    "5x5 s2 224 ->64": ((1, 3, 224, 224), (64, 3, 5, 5), 2, 2),
    "mobilenet 3x3 s2 224 ->32": ((1, 3, 224, 224), (32, 3, 3, 3), 2, 1),
    "mobilenet 3x3 s2 64 ->32": ((1, 3, 64, 64), (32, 3, 3, 3), 2, 1),
    "mobilenet_v3 3x3 s2 224 ->16": ((1, 3, 224, 224), (16, 3, 3, 3), 2, 1),
    "vgg 3x3 s1 224 ->64": ((1, 3, 224, 224), (64, 3, 3, 3), 1, 1),
    "3x3 s2 224 ->64": ((1, 3, 224, 224), (64, 3, 3, 3), 2, 1),
    "convnext 4x4 s4 224 ->96": ((1, 3, 224, 224), (96, 3, 4, 4), 4, 0),
}


def _stem(api: dict[str, Any], shape: tuple[int, ...], wshape: tuple[int, ...], s: int, pad: int, nhwc: bool,
           threads: int) -> tuple[Callable[[], None], Any]:
    from rlx_cpu import onednn_conv as oc
    from rlx_cpu import stem_conv as sc

    n, c, h, w = shape
    o, _, kh, kw = wshape
    ho, wo = (h + 2 * pad - kh) // s + 1, (w + 2 * pad - kw) // s + 1
    rng = np.random.default_rng(0)
    x = rng.random(shape, np.float32)
    wt = rng.random(wshape, np.float32)
    conv = sc.StemConv(shape, wt, np.zeros(o, np.float32), (n, o, ho, wo), (s, s), (pad,) * 4, "relu", None,
                        api["gomp"], sc.AUTO, nhwc)
    xp, y = oc._aligned(conv.pad_nbytes + 64), oc._aligned(4 * n * o * ho * wo)
    return lambda: conv.run(x.ctypes.data, xp.ctypes.data, y.ctypes.data, threads), (x, conv, xp, y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from rlx_cpu import onednn_conv, stem_conv

    api = onednn_conv._api()
    why = stem_conv.why_not()
    if api is None or why is not None:
        raise SystemExit(f"nothing to compare here: {why or 'no oneDNN'}")
    api["omp"][1](a.threads)
    for name, (shape, wshape, s, pad) in CASES.items():
        one, keep1, impl = relu_conv(api, shape, wshape, s, pad, nchw_src=True)
        sides: dict[str, Callable[[], None]] = {"onednn": one}
        keep = [keep1]
        for label, nhwc in (("stem", False), ("stem-nhwc", True)):
            fn, k = _stem(api, shape, wshape, s, pad, nhwc, a.threads)
            sides[label] = fn
            keep.append(k)
        reps = 40 if shape[0] > 1 or shape[2] > 100 else 400
        ts: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(reps):
            for k, f in sides.items():
                t = time.perf_counter()
                f()
                ts[k].append(time.perf_counter() - t)
        print(f"{name:30s} oneDNN {impl:16s} " + "  ".join(
            f"{k} p50 {np.median(v) * 1e6:7.0f} us (fastest {min(v) * 1e6:6.0f})" for k, v in ts.items()),
            flush=True)


if __name__ == "__main__":
    main()
