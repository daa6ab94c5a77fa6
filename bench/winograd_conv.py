"""rlx-cpu's Winograd F(4x4, 3x3) kernel (``rlx_cpu._winograd``) vs oneDNN's direct conv, both on
two OpenMP threads in one process, calls alternating: ResNet-18's 3x3 stride-1 convs at 224x224
(batch 1 and 8) and at the zoo's 64x64, ReLU after; oneDNN picks its layouts (NHWC brgconv here),
the kernel reads and writes NHWC. Also prints whether ``rlx_cpu.winograd.worth_it`` takes the
shape: what ``MAX_CK`` / ``MIN_TILES`` were chosen from. A benchmark, not a test.

    python bench/winograd_conv.py
    python bench/winograd_conv.py --threads 1 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _onednn_conv import relu_conv

CASES = {  # name: (batch, channels, height = width)
    "layer1 64ch 56x56 b1": (1, 64, 56),
    "layer2 128ch 28x28 b1": (1, 128, 28),
    "layer3 256ch 14x14 b1": (1, 256, 14),
    "layer4 512ch 7x7 b1": (1, 512, 7),
    "layer1 64ch 56x56 b8": (8, 64, 56),
    "layer2 128ch 28x28 b8": (8, 128, 28),
    "layer3 256ch 14x14 b8": (8, 256, 14),
    "layer4 512ch 7x7 b8": (8, 512, 7),
    "zoo 64x64: layer1 64ch 16x16 b1": (1, 64, 16),
    "zoo 64x64: layer2 128ch 8x8 b1": (1, 128, 8),
}


def _winograd(api: dict[str, Any], n: int, c: int, h: int, threads: int) -> tuple[Callable[[], None], Any]:
    from rlx_cpu import onednn_conv as oc
    from rlx_cpu import winograd as wg

    rng = np.random.default_rng(0)
    x = rng.random((n, h, h, c), np.float32) - 0.5
    w = ((rng.random((c, c, 3, 3), np.float32) - 0.5) / np.sqrt(9 * c)).astype(np.float32)
    conv = wg.WinogradConv((n, c, h, h), w, np.zeros(c, np.float32), (n, c, h, h), (1, 1, 1, 1), "relu",
                           None, api["gomp"], wg.AUTO)
    y, scratch = np.empty_like(x), oc._aligned(conv.scratch_nbytes(threads) + 64)
    keep = (x, conv, y, scratch)
    return lambda: conv.run(x.ctypes.data, 0, y.ctypes.data, scratch.ctypes.data, threads), keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of alternating bursts (the median of the bursts' p50s)")
    a = ap.parse_args()
    from rlx_cpu import onednn_conv, winograd

    api = onednn_conv._api()
    why = winograd.why_not()
    if api is None or why is not None:
        raise SystemExit(f"nothing to compare here: {why or 'no oneDNN'}")
    api["omp"][1](a.threads)
    for name, (n, c, h) in CASES.items():
        one, keep1, impl = relu_conv(api, (n, c, h, h), (c, c, 3, 3), 1, 1, nchw_src=False)
        wino, keep2 = _winograd(api, n, c, h, a.threads)
        sides = {"onednn": one, "winograd": wino}
        reps = 10 if n > 1 else 40
        p50s: dict[str, list[float]] = {k: [] for k in sides}
        best = dict.fromkeys(sides, float("inf"))
        for _ in range(a.rounds):
            for k, f in sides.items():
                f()
                ts = []
                for _ in range(reps):
                    t = time.perf_counter()
                    f()
                    ts.append(time.perf_counter() - t)
                p50s[k].append(statistics.median(ts))
                best[k] = min(best[k], min(ts))
        med = {k: statistics.median(v) * 1e3 for k, v in p50s.items()}
        taken = winograd.worth_it((n, c, h, h), (c, c, 3, 3), (n, c, h, h))
        print(f"{name:32s} oneDNN {impl:20s} p50 {med['onednn']:7.3f} ms "
              f"(fastest {best['onednn'] * 1e3:6.3f})"
              f"  winograd p50 {med['winograd']:7.3f} ms (fastest {best['winograd'] * 1e3:6.3f})"
              f"  ratio {med['winograd'] / med['onednn']:.2f}  taken: {'yes' if taken else 'no'}", flush=True)
        del keep1, keep2


if __name__ == "__main__":
    main()
