"""A direct convolution for few input channels (a CNN's stem), into oneDNN's nChw16c layout or NHWC.

The kernel is the optional C extension ``rlx_cpu._stemconv`` (its source says why and how); this
module binds one conv of a chain (:mod:`rlx_cpu.conv_chain`) to it: the weights packed once, the
call's arguments made once, the input's padded copy and the output in the chain's scratch. It runs
on the OpenMP runtime oneDNN runs on (``GOMP_parallel`` by address), so on the chain's own team.
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING, Any

from . import settings

if TYPE_CHECKING:
    import numpy as np

AUTO, GENERIC, AVX512 = 0, 1, 3
#: Input channels the kernel takes (a stem's RGB, grayscale or RGBA): each tap broadcasts one input
#: value; wider inputs are the home ground of oneDNN's blocked kernels (not measured against them).
MAX_CHANNELS = 8
#: Where the kernel beats oneDNN's (``python bench/stem_conv.py``, 2 threads, 2-core Ice Lake VM,
#: 2026-12-03, two runs, raw docs/device-runs/stem-conv-cpu-2026-12-03.txt; p50 us, kernel writing
#: NHWC vs oneDNN): 7x7 s2 3->64 224x224 b1 1502-1721 vs 1707-2708, b8 10795-12555 vs 13052-13985;
#: 5x5 s2 757-924 vs 913-1000; but 3x3 s2 3->64 422-476 vs 386-419, 3->32 273-358 vs 194-325, 4x4
#: s4 3->96 259-361 vs 238-317 (with few taps the bias, the stores and the padded copy weigh more per
#: tile), and output channels in groups of fewer than 4 blocks of 16 run its slow tiles. So: at
#: least 25 taps (5x5) a channel, output channels a multiple of 64.
MIN_TAPS = 25
OC_MULTIPLE = 64
ACT = {"": 0, "relu": 1, "relu_drops_nan": 1, "clip": 2}
#: The tiles bound convs use: AUTO (AVX-512 where the CPU has it, else none) or GENERIC (portable
#: and slow: tests set it to run the chain's path on any machine).
ISA = AUTO
_P = ctypes.c_void_p


@functools.cache
def _fns() -> tuple[Any, Any, Any] | None:
    try:
        from ._stemconv import addresses
    except ImportError:
        return None
    conv_a, pack_a, pad_a = addresses()
    conv = ctypes.CFUNCTYPE(ctypes.c_int, _P, _P, _P, _P, _P, _P, ctypes.c_float, ctypes.c_float, _P, _P, _P,
                            ctypes.c_int)(conv_a)
    pack = ctypes.CFUNCTYPE(ctypes.c_int, _P, _P, _P)(pack_a)
    pad = ctypes.CFUNCTYPE(ctypes.c_int64, _P)(pad_a)
    return conv, pack, pad


def why_not() -> str | None:
    """Why the kernel does not run here (oneDNN's conv does), or None where it does."""
    if not settings.STEM_CONV.get():
        return f"{settings.STEM_CONV.name}=0"
    try:
        from ._stemconv import isa
    except ImportError as e:
        from .native import not_built

        return not_built("rlx_cpu._stemconv", e)
    if ISA == AUTO and isa() != "avx512":
        return "this CPU has no AVX-512 (the kernel's only fast tiles)"
    return None


class StemConv:
    """One conv bound to the kernel: ``run(x, xp, y, threads)`` with the input's, the padded copy's
    and the output's addresses (nChw16c, or NHWC with ``nhwc``; ``pad_nbytes``: the copy's size)."""

    def __init__(self, x_shape: tuple[int, ...], w: np.ndarray, b: np.ndarray, oshape: tuple[int, ...],
                 strides: tuple[int, int], pads: tuple[int, int, int, int], act: str,
                 clip: tuple[float, float] | None, gomp: tuple[int, int, int], isa: int = AUTO,
                 nhwc: bool = False) -> None:
        import numpy as np

        from .onednn_conv import _aligned

        fns = _fns()
        if fns is None:
            raise ValueError("rlx_cpu._stemconv is not built")
        self.conv, pack, pad = fns
        n, c, h, wd = x_shape
        oc, _, kh, kw = w.shape
        kind = "clip" if clip is not None else act
        if kind not in ACT or (clip is not None and act):
            raise ValueError(f"no stem-conv form for activation {act!r} with clip {clip}")
        self.dims = np.array([n, c, h, wd, oc, kh, kw, strides[0], strides[1], pads[0], pads[1], 1, 1,
                              oshape[2], oshape[3], ACT[kind], isa, int(nhwc)], np.int64)
        self.pad_nbytes = int(pad(self.dims.ctypes.data))
        self.w = _aligned(4 * w.size)
        wc = np.ascontiguousarray(w, np.float32)
        if self.pad_nbytes < 0 or pack(wc.ctypes.data, self.w.ctypes.data, self.dims.ctypes.data) != 0:
            raise ValueError("the stem-conv kernel does not take this conv")
        self.b = np.ascontiguousarray(b, np.float32)
        lo, hi = clip if clip is not None else (0.0, 0.0)
        self.lo, self.hi = ctypes.c_float(lo), ctypes.c_float(hi)
        self.gomp = gomp
        self.impl = "stem_conv:" + ("generic" if isa == GENERIC else "avx512")

    def run(self, x: int, xp: int, y: int, threads: int) -> None:
        st = self.conv(x, xp, self.w.ctypes.data, self.b.ctypes.data, y, self.dims.ctypes.data, self.lo,
                       self.hi, *self.gomp, threads)
        if st != 0:
            from .onednn_conv import OneDNNError

            raise OneDNNError("the stem-conv kernel refused a conv it was bound to",
                              where="rlx_cpu.stem_conv",
                              fix="set RLX_CPU_STEM_CONV=0 (oneDNN runs the conv), and report it")
