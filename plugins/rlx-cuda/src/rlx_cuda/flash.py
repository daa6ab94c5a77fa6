"""Flash-style fused attention for f16/bf16: one kernel per ``attention`` step.

``softmax(scale * q @ k^T + mask) @ v`` without the scores ever reaching global memory. The
two-GEMM path (:func:`rlx_cuda.kernels.k_attention`) writes S in f32 and P in the input dtype for
every (batch, head) and launches three kernels; at MiniLM's batch 128 that is 150 MB of traffic per
layer where q, k, v and o are 50 MB together. Here each block of 4 warps owns 64 query rows of one
(batch, head); every warp keeps its 16 rows' running max, running sum and output accumulator in
registers while it walks the keys in tiles of 64 (FlashAttention-2's online softmax).

* Tensor cores through inline PTX ``mma.sync.m16n8k16`` (f16 or bf16 inputs, f32 accumulation), so
  no header is needed (NVRTC compiles it as it is, like every other rlx-cuda kernel); sm_80+.
* Numbers: S in f32 (scaled in f32, as the GEMM path's alpha), masked keys get the reference's
  finite ``-1e9`` (so a fully masked row attends uniformly), keys past the end of the sequence get
  -inf (they are not part of the row), P is rounded to the input dtype for the second product (as
  the GEMM path stores it), the output rounded once. NaN scores propagate as in the reference.
* Legal for: f16/bf16 q, k, v; head dims 1..128 (padded with zeros to 32/64/128 inside the
  kernel); masks ``none``, ``causal``, ``sliding_window`` and ``padding`` (any mask dtype a buffer
  holds); compute capability >= 8.0; ``RLX_CUDA_FLASH`` on. Anything else keeps the two-GEMM path
  (:func:`flash_reason` says why), so a variant is never run by a kernel that cannot honour it.

Pure Python (no CuPy) up to :func:`bind`, so the source can be compile-checked without a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from rlx_core.plugin import DType, TensorType

from . import codegen

#: Query rows per block (4 warps x 16 rows: one m16 tile per warp).
BLOCK_M = 64
#: Keys per tile (shared memory: 64 x head dim of K and of V^T).
BLOCK_N = 64
WARPS = BLOCK_M // 16
THREADS = 32 * WARPS
#: Head dims the kernel is instantiated for; a smaller one is zero-padded to the next.
HEAD_DIMS = (32, 64, 128)
MASKS = ("none", "causal", "sliding_window", "padding")
#: Minimum compute capability (mma.sync m16n8k16 with bf16 inputs is sm_80+).
MIN_CC = 80
_MMA = {DType.F16: "f16", DType.BF16: "bf16"}
FLASH_DTYPES = tuple(_MMA)


def padded_head_dim(d: int) -> int | None:
    """The kernel's head dim for a real one of ``d`` (None: too large for this kernel)."""
    return next((h for h in HEAD_DIMS if d <= h), None)


def enabled() -> bool:
    from .settings import FLASH

    return bool(FLASH.get())


def flash_reason(in_types: Sequence[TensorType], attrs: Mapping[str, Any], cc: int | None) -> str | None:
    """None when the fused kernel may run this attention variant, else why not (then the two-GEMM
    path runs it). ``cc``: the device's compute capability as an int (86 for 8.6), None unknown."""
    if not enabled():
        return "RLX_CUDA_FLASH=0"
    if cc is None or cc < MIN_CC:
        return f"compute capability {cc} < {MIN_CC} (mma.sync with bf16 needs sm_80)"
    q, k, v = in_types[:3]
    if q.dtype not in _MMA or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q/k/v are {q.dtype}/{k.dtype}/{v.dtype}, not all f16 or all bf16"
    mask = str(attrs["mask"])
    if mask not in MASKS:
        return f"mask {mask!r} (the fused kernel takes {', '.join(MASKS)})"
    if mask == "padding" and in_types[3].dtype not in codegen.STORAGE:
        return f"padding mask dtype {in_types[3].dtype}"
    dims = [*q.shape, *k.shape, *v.shape]
    if not all(isinstance(x, int) for x in dims):
        return "symbolic shape"
    d, dv = int(q.shape[-1]), int(v.shape[-1])
    if not (1 <= d <= HEAD_DIMS[-1] and 1 <= dv <= HEAD_DIMS[-1]):
        return f"head dims {d}/{dv} outside 1..{HEAD_DIMS[-1]}"
    sq, sk = int(q.shape[-2]), int(k.shape[-2])
    blocks = math.prod(int(x) for x in q.shape[:-2]) * ((sq + BLOCK_M - 1) // BLOCK_M)
    if sq >= 2**31 or sk >= 2**31 or blocks >= 2**31:
        return "more query blocks or keys than 32-bit indices reach"
    return None


def _store(dt: DType, expr: str) -> str:
    return f"rlx_f2h({expr})" if dt is DType.F16 else f"rlx_f2b({expr})"


@lru_cache(maxsize=128)
def flash_source(dt: DType, mask: str, mask_dtype: DType | None, hd: int, vec: bool) -> tuple[str, str]:
    """``(kernel name, CUDA source)`` of the fused attention for one dtype, mask kind, padded head
    dim ``hd`` and load style (``vec``: 16-byte loads of K and V rows, legal when both head dims,
    K's and V's strides are multiples of 8 elements and their buffers 16-byte aligned; else
    element loads).

    Arguments: ``Q, K, V, O`` (16-bit patterns), ``int sq, sk, d, dv, heads, mblocks, float
    scale``, then per tensor (q, k, v, o) its batch, head and row strides in elements (``long long
    sb, long long sh, int sr``; the head dim is contiguous), then ``int window`` (sliding_window) or
    the ``(B, sk)`` mask pointer (padding). Strides let the kernel read ``(B, S, H, D)`` heads in
    place (:meth:`rlx_cuda.program.CudaProgram._absorb_head_transposes`). Grid: ``nbh * mblocks``
    blocks of :data:`THREADS`; block ``x`` is batch-head ``x / mblocks``, query rows from
    ``(x % mblocks) * 64``.
    """
    if dt not in _MMA or mask not in MASKS or hd not in HEAD_DIMS:
        raise ValueError(f"no fused attention for {dt}, mask {mask}, head dim {hd}")
    kp, vp = hd + 8, BLOCK_N + 8  # shared row strides (halves): +8 keeps fragment reads conflict-free
    mma = _MMA[dt]
    extra = ""
    if mask == "sliding_window":
        extra = ", int window"
    elif mask == "padding":
        assert mask_dtype is not None
        extra = f", const {codegen.STORAGE[mask_dtype]}* __restrict__ mk"
    # Per key of the tile: 0 keep, 1 masked (finite -1e9, as the reference), 2 past the end (-inf).
    if mask == "padding":
        assert mask_dtype is not None
        flag = f"key >= sk ? 2 : ({codegen.load(mask_dtype, 'mk[b * sk + key]')} != 0 ? 0 : 1)"
    else:
        flag = "key >= sk ? 2 : 0"
    # The per-score rule for masks that depend on the query row (key and row are absolute).
    row_mask = {"none": "", "padding": "", "causal": "key > row",
                "sliding_window": "key > row || key <= row - window"}[mask]
    masked = "f == 1" + (f" || ({row_mask})" if row_mask else "")
    if vec:
        loads = _vector_loads(hd, kp, vp)
    else:
        loads = f"""    for (int e = tid; e < {BLOCK_N} * {hd}; e += {THREADS}) {{
      const int row = e / {hd}, col = e % {hd}, key = n0 + row;
      Ks[row * {kp} + col] = (key < sk && col < d) ? k[(long long)key * ksr + col] : (unsigned short)0;
      Vt[col * {vp} + row] = (key < sk && col < dv) ? v[(long long)key * vsr + col] : (unsigned short)0;
    }}
"""
    nks, nvs, nst, nkk = hd // 16, hd // 8, BLOCK_N // 8, BLOCK_N // 16
    head = (f"const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K, "
            f"const unsigned short* __restrict__ V, unsigned short* O, int sq, int sk, int d, int dv, "
            f"int heads, int mblocks, float scale, long long qsb, long long qsh, int qsr, long long ksb, "
            f"long long ksh, int ksr, long long vsb, long long vsh, int vsr, long long osb, long long osh, "
            f"int osr{extra}")
    body = f"""
  __shared__ __align__(16) unsigned short Ks[{BLOCK_N} * {kp}];
  __shared__ __align__(16) unsigned short Vt[{hd} * {vp}];
  __shared__ int kf[{BLOCK_N}];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
  const long long bh = blockIdx.x / mblocks, b = bh / heads, h = bh % heads;
  const int m0 = (int)(blockIdx.x % mblocks) * {BLOCK_M} + warp * 16;
  /* (batch, head) of each tensor at b * sb + h * sh, its rows sr apart (head dims contiguous) */
  const unsigned short* q = Q + b * qsb + h * qsh;
  const unsigned short* k = K + b * ksb + h * ksh;
  const unsigned short* v = V + b * vsb + h * vsh;
  unsigned short* o = O + b * osb + h * osh;
  const int row0 = m0 + g, row1 = m0 + g + 8;  /* this thread's two query rows */
  /* Q as the A operand of S = Q K^T: a0 (row g, cols 2tg..), a1 (row g+8), a2/a3 the same 8 cols on */
  unsigned qa[{nks}][4];
#pragma unroll
  for (int kk = 0; kk < {nks}; ++kk)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        qa[kk][2 * hf + r] = rlx_ld2(q, r ? row1 : row0, kk * 16 + hf * 8 + 2 * tg, sq, d, qsr);
  float mr[2] = {{-INFINITY, -INFINITY}}, lr[2] = {{0.f, 0.f}};
  float acc[{nvs}][4];
#pragma unroll
  for (int nt = 0; nt < {nvs}; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
  const unsigned* K32 = (const unsigned*)Ks;
  const unsigned* V32 = (const unsigned*)Vt;
  for (int n0 = 0; n0 < sk; n0 += {BLOCK_N}) {{
    __syncthreads();  /* every warp is done with the previous tile */
{loads}    for (int j = tid; j < {BLOCK_N}; j += {THREADS}) {{ const int key = n0 + j; kf[j] = {flag}; }}
    __syncthreads();
    /* S (16 x 64 per warp) = Q K^T: B operand b0 = K[key g][2tg..], b1 = K[key g][8 + 2tg..] */
    float s[{nst}][4];
#pragma unroll
    for (int nt = 0; nt < {nst}; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < {nks}; ++kk)
#pragma unroll
      for (int nt = 0; nt < {nst}; ++nt) {{
        const unsigned* kr = K32 + (nt * 8 + g) * {kp // 2} + kk * 8 + tg;
        rlx_mma_{mma}(s[nt], qa[kk], kr[0], kr[4]);
      }}
    /* scale and mask; c0/c1 are row g, c2/c3 row g+8, columns 2tg and 2tg+1 of each 8-key block */
    float mx[2] = {{-INFINITY, -INFINITY}};
#pragma unroll
    for (int nt = 0; nt < {nst}; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {{
        const int j = nt * 8 + 2 * tg + (e & 1), key = n0 + j, row = (e >> 1) ? row1 : row0, f = kf[j];
        (void)row; (void)key;
        float x = s[nt][e] * scale;
        x = f == 2 ? -INFINITY : (({masked}) ? {codegen.MASKED_SCORE}f : x);
        s[nt][e] = x;
        mx[e >> 1] = rlx_nanmax(mx[e >> 1], x);
      }}
    float al[2], mu[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {{
      /* the 4 lanes of a quad hold one row's 64 scores between them */
      mx[r] = rlx_nanmax(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = rlx_nanmax(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = rlx_nanmax(mr[r], mx[r]);
      /* all -inf so far (infinite inputs): exponents from 0 so that -inf - -inf never makes a NaN */
      mu[r] = mn == -INFINITY ? 0.f : mn;
      al[r] = exp2f((mr[r] - mu[r]) * 1.4426950408889634f);
      mr[r] = mn;
      lr[r] *= al[r];
    }}
#pragma unroll
    for (int nt = 0; nt < {nst}; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {{
        const float p = exp2f((s[nt][e] - mu[e >> 1]) * 1.4426950408889634f);
        s[nt][e] = p;
        lr[e >> 1] += p;
      }}
#pragma unroll
    for (int nt = 0; nt < {nvs}; ++nt) {{
      acc[nt][0] *= al[0]; acc[nt][1] *= al[0]; acc[nt][2] *= al[1]; acc[nt][3] *= al[1];
    }}
    /* O += P V: P's accumulator fragments of key blocks 2kk, 2kk+1 are the A operand of slice kk;
       B operand b0 = V^T[col g][keys 2tg..], b1 = V^T[col g][keys 8 + 2tg..] */
#pragma unroll
    for (int kk = 0; kk < {nkk}; ++kk) {{
      unsigned pa[4];
      pa[0] = rlx_pack_{mma}(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = rlx_pack_{mma}(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = rlx_pack_{mma}(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = rlx_pack_{mma}(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int nt = 0; nt < {nvs}; ++nt) {{
        const unsigned* vr = V32 + (nt * 8 + g) * {vp // 2} + kk * 8 + tg;
        rlx_mma_{mma}(acc[nt], pa, vr[0], vr[4]);
      }}
    }}
  }}
#pragma unroll
  for (int r = 0; r < 2; ++r) {{
    lr[r] += __shfl_xor_sync(0xffffffffu, lr[r], 1);
    lr[r] += __shfl_xor_sync(0xffffffffu, lr[r], 2);
    lr[r] = 1.f / lr[r];
  }}
#pragma unroll
  for (int nt = 0; nt < {nvs}; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {{
      const int row = (e >> 1) ? row1 : row0, col = nt * 8 + 2 * tg + (e & 1);
      if (row < sq && col < dv) o[(long long)row * osr + col] = {_store(dt, "acc[nt][e] * lr[e >> 1]")};
    }}
"""
    # Guarded and named per dtype: the no-GPU test compiles every kernel in one translation unit.
    guard = f"RLX_FLASH_HELPERS_{mma.upper()}"
    helpers = f"""
#ifndef {guard}
#define {guard}
__device__ __forceinline__ void rlx_mma_{mma}(float* c, const unsigned* a, unsigned b0, unsigned b1) {{
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{mma}.{mma}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, "
               "{{%8,%9}}, {{%0,%1,%2,%3}};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}}
/* two floats as one 32-bit register of two {mma} values (lo in the low half), rounded once */
__device__ __forceinline__ unsigned rlx_pack_{mma}(float lo, float hi) {{
  return (unsigned){_store(dt, "lo")} | ((unsigned){_store(dt, "hi")} << 16);
}}
#endif
#ifndef RLXFLASH_LD2_GUARD
#define RLXFLASH_LD2_GUARD
/* elements (row, col) and (row, col + 1) of a rows x cols matrix (rows stride apart), zero outside it */
__device__ __forceinline__ unsigned rlx_ld2(const unsigned short* p, int row, int col, int rows, int cols,
                                            int stride) {{
  if (row >= rows) return 0u;
  const unsigned short* r = p + (long long)row * stride;
  const unsigned lo = col < cols ? (unsigned)r[col] : 0u, hi = col + 1 < cols ? (unsigned)r[col + 1] : 0u;
  return lo | (hi << 16);
}}
#endif
"""
    name = codegen._name(f"rlx_flash_{dt.value}_{mask}_d{hd}{'v' if vec else 's'}", head + helpers + body)
    src = (f"{codegen.PREAMBLE}{helpers}\n"
           f'extern "C" __global__ void __launch_bounds__({THREADS}) {name}({head}) {{{body}}}\n')
    return name, src


def _vector_loads(hd: int, kp: int, vp: int) -> str:
    """K rows into Ks and V rows transposed into Vt, 8 halves (16 bytes) per load."""
    vt = "".join(f"      Vt[(col + {2 * w}) * {vp} + row] = (unsigned short)(vv.{c} & 0xffffu);\n"
                 f"      Vt[(col + {2 * w + 1}) * {vp} + row] = (unsigned short)(vv.{c} >> 16);\n"
                 for w, c in enumerate("xyzw"))
    return f"""    for (int c = tid; c < {BLOCK_N} * {hd // 8}; c += {THREADS}) {{
      const int row = c / {hd // 8}, col = (c % {hd // 8}) * 8, key = n0 + row;
      uint4 kv, vv;
      kv.x = kv.y = kv.z = kv.w = 0u;
      vv.x = vv.y = vv.z = vv.w = 0u;
      if (key < sk && col < d) kv = *(const uint4*)(k + (long long)key * ksr + col);
      if (key < sk && col < dv) vv = *(const uint4*)(v + (long long)key * vsr + col);
      *(uint4*)(Ks + row * {kp} + col) = kv;
{vt}    }}
"""


def all_sources() -> list[tuple[str, str]]:
    """Every fused-attention kernel this module can emit (for compile checks without a GPU)."""
    out = []
    for dt in _MMA:
        for hd in HEAD_DIMS:
            for vec in (True, False):
                for mask in MASKS:
                    mdts: tuple[DType | None, ...] = (DType.I64, DType.BOOL, DType.F16, DType.BF16,
                                                       DType.F32) if mask == "padding" else (None,)
                    for mdt in mdts:
                        out.append(flash_source(dt, mask, mdt, hd, vec))
    return out


# -- binding (CuPy from here on) ------------------------------------------------------------------

def device_cc() -> int:
    import cupy as cp

    return int(cp.cuda.Device().compute_capability)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, int, int]:
    """(batch, head, row) strides of a contiguous (B, H, S, D) or (B, S, D) tensor."""
    if len(shape) == 4:
        _, h, s, d = shape
        return h * s * d, s * d, d
    _, s, d = shape
    return s * d, 0, d


def bind(b: Any) -> Callable[[], None] | None:
    """The fused kernel bound to step ``b`` (a :class:`rlx_cuda.kernels.Bound`), or None when
    :func:`flash_reason` refuses the variant. ``b.layout`` may map ``q``/``k``/``v``/``o`` to
    ``(view, batch stride, head stride, row stride)``: read or write that buffer instead of the
    step's own (a (B, S, H, D) tensor whose head transpose was dropped). The returned run has
    ``variant = "flash"``."""
    import numpy as np

    from .kernels import _noop, _ptr, raw_kernel

    if flash_reason(b.in_types, b.attrs, device_cc()) is not None:
        return None
    qt, kt, vt = b.in_types[:3]
    dt = qt.dtype
    mask = str(b.attrs["mask"])
    sq, d = int(qt.shape[-2]), int(qt.shape[-1])
    sk, dv = int(kt.shape[-2]), int(vt.shape[-1])
    nbh = math.prod(int(x) for x in qt.shape[:-2])
    heads = int(qt.shape[1]) if qt.rank == 4 else 1
    scale = b.attrs["scale"]
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    layout: Mapping[str, tuple[Any, int, int, int]] = getattr(b, "layout", None) or {}
    own = {"q": b.ins[0], "k": b.ins[1], "v": b.ins[2], "o": b.outs[0]}
    types = {"q": qt, "k": kt, "v": vt, "o": b.out_types[0]}
    views = {n: layout[n][0] if n in layout else own[n] for n in own}
    strides = {n: layout[n][1:] if n in layout else contiguous_strides([int(x) for x in types[n].shape])
               for n in own}
    o = views["o"]
    run: Callable[[], None]
    if own["o"].size == 0:
        def run() -> None:  # (not the shared _noop: it gets the variant attribute below)
            _noop()
    elif sk == 0:  # softmax over no keys: the reference's product is empty, all zeros
        def run() -> None:
            o.fill(0)
    else:
        hd = padded_head_dim(max(d, dv))
        assert hd is not None  # flash_reason checked the head dims
        vec = d % 8 == 0 and dv % 8 == 0 and all(
            _ptr(views[n]) % 16 == 0 and all(x % 8 == 0 for x in strides[n]) for n in ("k", "v"))
        mdt = b.in_types[3].dtype if mask == "padding" else None
        name, src = flash_source(dt, mask, mdt, hd, vec)
        kern = raw_kernel(name, src)
        mblocks = (sq + BLOCK_M - 1) // BLOCK_M
        grid = nbh * mblocks  # < 2^31: flash_reason checked
        args: tuple[Any, ...] = (views["q"], views["k"], views["v"], o, np.int32(sq), np.int32(sk),
                                 np.int32(d), np.int32(dv), np.int32(heads), np.int32(mblocks),
                                 np.float32(scale))
        for n in ("q", "k", "v", "o"):
            sb, sh, sr = strides[n]
            args += (np.int64(sb), np.int64(sh), np.int32(sr))
        if mask == "sliding_window":
            args += (np.int32(int(b.attrs["window"])),)
        elif mask == "padding":
            args += (b.ins[3],)

        def run() -> None:
            kern((grid,), (THREADS,), args)
    run.variant = "flash"  # type: ignore[attr-defined]
    return run
