"""3x3 stride-1 convolutions as Winograd's F(4x4, 3x3) on NHWC tensors (rlx_cpu._winograd).

The kernel is the optional C extension ``rlx_cpu._winograd`` (its source says why, how and what it
does to NaN, Inf and rounding); this module transforms a conv's weights once (in float64, then
float32), and binds one conv of a chain (:mod:`rlx_cpu.conv_chain`) to it. It runs on the OpenMP
runtime oneDNN runs on (``GOMP_parallel`` by address), so on the chain's own team.
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING, Any

from . import settings

if TYPE_CHECKING:
    import numpy as np

AUTO, GENERIC, AVX512 = 0, 1, 3
ACT = {"": 0, "relu": 1, "relu_drops_nan": 1, "clip": 2}
#: The code bound convs use: AUTO (AVX-512 where the CPU has it, else none) or GENERIC (portable
#: and slow: tests set it to run the chain's path on any machine).
ISA = AUTO
#: Where it beats oneDNN's direct conv (``python bench/winograd_conv.py --rounds 3``, 2 threads, 2-core
#: Ice Lake VM, 2026-12-03 22:12 UTC, raw docs/device-runs/winograd-conv-cpu-2026-12-03.txt, p50 ms,
#: ResNet-18's 3x3 convs, kernel vs oneDNN's brgconv): 64 ch on 56x56 b1 0.51 vs 1.23, b8 4.15 vs
#: 9.03; 128 ch on 28x28 b1 0.43 vs 1.03, b8 3.32 vs 8.10; 256 ch on 14x14 b8 4.91 vs 8.12; but 256 ch
#: b1 (16 tiles) 1.02 vs 0.99, 512 ch on 7x7 b1 3.71 vs 1.15 and 128 ch on 8x8 (4 tiles) 0.145 vs
#: 0.088: each thread reads all 36 x C x K transformed weights (4x the direct conv's) for every block
#: of tiles, which pays only while they stay in cache or the tiles are many. 512 ch at b8 (6.19 vs
#: 9.19) is left to oneDNN: 38 MB more weights a conv. So: C x K up to 128 x 128 with at least 16
#: tiles, up to 256 x 256 with at least 64.
MAX_CK, MIN_TILES = 128 * 128, 16
MAX_CK_MANY, MANY_TILES = 256 * 256, 64
_P = ctypes.c_void_p

# F(4x4, 3x3) (Lavin and Gray, 2016): G turns a 3x3 kernel into 6x6; B^T and A^T are in the C source.
_G = ((1 / 4, 0.0, 0.0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6),
      (1 / 24, -1 / 12, 1 / 6), (0.0, 0.0, 1.0))


@functools.cache
def _fns() -> tuple[Any, Any] | None:
    try:
        from ._winograd import addresses
    except ImportError:
        return None
    conv_a, scratch_a = addresses()
    conv = ctypes.CFUNCTYPE(ctypes.c_int, *([_P] * 7), ctypes.c_float, ctypes.c_float, _P, _P, _P,
                            ctypes.c_int)(conv_a)
    scratch = ctypes.CFUNCTYPE(ctypes.c_int64, _P, ctypes.c_int)(scratch_a)
    return conv, scratch


def why_not() -> str | None:
    """Why the kernel does not run here (oneDNN's direct conv does), or None where it does."""
    if not settings.WINOGRAD.get():
        return f"{settings.WINOGRAD.name}=0"
    try:
        from ._winograd import isa
    except ImportError as e:
        from .native import not_built

        return not_built("rlx_cpu._winograd", e)
    if ISA == AUTO and isa() != "avx512":
        return "this CPU has no AVX-512 (the kernel's only fast code)"
    return None


def worth_it(x_shape: tuple[int, ...], w_shape: tuple[int, ...], oshape: tuple[int, ...]) -> bool:
    """Whether a 3x3 stride-1 conv is in the range where the kernel measured faster (see MAX_CK)."""
    k, c = w_shape[:2]
    tiles = oshape[0] * -(-oshape[2] // 4) * -(-oshape[3] // 4)
    fits = (c * k <= MAX_CK and tiles >= MIN_TILES) or (c * k <= MAX_CK_MANY and tiles >= MANY_TILES)
    return c % 16 == 0 and k % 64 == 0 and fits and x_shape[1] == c


def transform_weights(w: np.ndarray) -> np.ndarray:
    """OIHW 3x3 weights as the kernel reads them: U = G g G^T for each (out, in) pair, laid out
    36 x (out / 64) x in x 64 (float64 arithmetic, float32 result)."""
    import numpy as np

    k, c = w.shape[:2]
    g = np.asarray(_G)
    u = np.einsum("ia,kcab,jb->ijck", g, w.astype(np.float64), g, optimize=True)  # (6, 6, c, k)
    u = u.reshape(36, c, k // 64, 64).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(u, np.float32)


class WinogradConv:
    """One conv bound to the kernel: ``run(x, res, y, scratch, threads)`` with addresses (NHWC
    input, residual or 0, output; ``scratch_nbytes(threads)`` of 64-byte aligned scratch); ``u``:
    the weights as an earlier binding transformed them."""

    def __init__(self, x_shape: tuple[int, ...], w: np.ndarray, b: np.ndarray, oshape: tuple[int, ...],
                 pads: tuple[int, int, int, int], act: str, clip: tuple[float, float] | None,
                 gomp: tuple[int, int, int], isa: int = AUTO, u: np.ndarray | None = None) -> None:
        import numpy as np

        from .onednn_conv import _aligned

        fns = _fns()
        if fns is None:
            raise ValueError("rlx_cpu._winograd is not built")
        self.conv, self._scratch = fns
        n, c, h, wd = x_shape
        k = w.shape[0]
        kind = "clip" if clip is not None else act
        if w.shape[1:] != (c, 3, 3) or kind not in ACT or (clip is not None and act):
            raise ValueError(f"no Winograd form for weights {w.shape} with activation {act!r}, clip {clip}")
        self.dims = np.array([n, c, h, wd, k, pads[0], pads[1], oshape[2], oshape[3], ACT[kind], isa],
                             np.int64)
        if self.scratch_nbytes(1) < 0:
            raise ValueError("the Winograd kernel does not take this conv")
        if u is None:  # else transformed by an earlier binding of the same weights
            t = transform_weights(w)
            u = _aligned(t.nbytes)
            u[:] = t.reshape(-1)
        #: the transformed weights, 64-byte aligned (other thread-count variants may share them)
        self.u = u
        self.b = np.ascontiguousarray(b, np.float32)
        lo, hi = clip if clip is not None else (0.0, 0.0)
        self.lo, self.hi = ctypes.c_float(lo), ctypes.c_float(hi)
        self.gomp = gomp
        self.impl = "winograd_4x3:" + ("generic" if isa == GENERIC else "avx512")

    def scratch_nbytes(self, threads: int) -> int:
        return int(self._scratch(self.dims.ctypes.data, threads))

    def run(self, x: int, res: int, y: int, scratch: int, threads: int) -> None:
        st = self.conv(x, self.u.ctypes.data, self.b.ctypes.data, res or None, y, scratch,
                       self.dims.ctypes.data, self.lo, self.hi, *self.gomp, threads)
        if st != 0:
            from .onednn_conv import OneDNNError

            raise OneDNNError("the Winograd kernel refused a conv it was bound to",
                              where="rlx_cpu.winograd",
                              fix="set RLX_CPU_WINOGRAD=0 (oneDNN runs the conv), and report it")
