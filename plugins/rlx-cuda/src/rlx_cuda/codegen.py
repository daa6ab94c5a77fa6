"""CUDA C source for rlx-cuda's generated kernels. Pure Python (no CuPy): CI compiles every kernel
this module can emit with ``nvcc -ptx`` on machines without a GPU.

* **Elementwise** (every elementwise MIR op and ``fused_elementwise``): the body comes from the shared
  renderer (:func:`rlx_core.codegen.render_program`, dialect :data:`CUDA`); this module adds the
  skeleton: a grid-stride loop, one load per input (``f`` same shape as the output: flat index;
  ``s`` one element; ``b`` broadcast: strided index math over the collapsed output dims) and the
  store. f16/bf16 live in memory as 16-bit patterns and in registers as ``float``: loads widen
  exactly, stores round once to nearest-even (from f64 and i64 through round-to-odd, so there is no
  double rounding). An intermediate cast to f16 inside a fused chain uses ``half``, a register
  type rounding on construction; the dialect has no bf16 type, so a bf16 intermediate is refused.
  The vectorised variant (:func:`elementwise_vec_source`) moves one aligned vector of up to 16
  bytes per operand per thread (``s`` inputs, ``f`` ones and ``r``: a row along the last dim) and
  renders the same per-element math; :func:`vector_width` decides when it applies.
* **Row kernels** (softmax, log_softmax, layer_norm, the masked softmax of attention): one block
  per row, warp-shuffle reductions, NaN-propagating max; f16/bf16 compute in f32. layer_norm and
  the attention softmax take one warp per row instead when the row has at most 1024 elements
  (held in registers: no shared memory, no ``__syncthreads``); the layer_norm ones also in vectors
  of 2-8 elements (:func:`layer_norm_vec_source`).
* **Permute copy** (transpose): one gather kernel per rank and copy unit; 16-byte units when the
  last axis stays last.

No kernel includes a header: NVRTC compiles them as they are (no CUDA toolkit needed at run time).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from functools import lru_cache

from rlx_core.plugin import DIALECTS, DType, IRError, render_program
from rlx_core.plugin import decode_fused as decode
from rlx_core.plugin import encode_fused as encode
from rlx_core.plugin import single_op_program as _kit_single_op_program

HALF = frozenset({DType.F16, DType.BF16})
#: Storage C type of each dtype the kernels handle (f16/bf16 as raw 16-bit patterns).
STORAGE: dict[DType, str] = {
    DType.F32: "float", DType.F64: "double", DType.F16: "unsigned short", DType.BF16: "unsigned short",
    DType.I8: "signed char", DType.I16: "short", DType.I32: "int", DType.I64: "long long",
    DType.U8: "unsigned char", DType.BOOL: "bool"}
#: Dtypes elementwise kernels compute in natively (f16/bf16 are loaded/stored only: casts).
COMPUTE = frozenset(STORAGE) - HALF

def _register_half(name: str, code: str, comment: str, extra: str = "") -> str:
    """A half type held in a float register, rounded once to its storage precision (``code``:
    ``h`` f16, ``b`` bf16) on construction from every C type the renderer may cast from."""
    rnd = f"rlx_{code}2f(rlx_f2{code}"
    ctors = [("float", "x"), ("double", "rlx_odd(x)"), ("long long", "rlx_odd(x)"),
             ("int", "rlx_odd((double)x)"), ("short", "(float)x"), ("signed char", "(float)x"),
             ("unsigned char", "(float)x")]
    body = "".join(f"  __device__ {name}({t} x) : v({rnd}({e}))) {{}}\n" for t, e in ctors)
    return (f"/* {comment} */\nstruct {name} {{\n  float v;\n  __device__ {name}() {{}}\n{body}"
            f"  __device__ {name}(bool x) : v(x ? 1.0f : 0.0f) {{}}\n{extra}"
            f"  __device__ operator float() const {{ return v; }}\n}};\n")


PREAMBLE = r"""
#ifndef RLX_CUDA_PREAMBLE
#define RLX_CUDA_PREAMBLE
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
__device__ __forceinline__ float rlx_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short rlx_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float rlx_b2f(unsigned short b) {
  return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short rlx_f2b(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                                                   /* nearest-even */
  return (unsigned short)(u >> 16);
}
/* Round to odd: a float that rounds to the same f16/bf16 as x does (so one rounding, not two). */
__device__ __forceinline__ float rlx_odd(double x) {
  float f = __double2float_rz(x);
  if ((double)f != x && f == f) f = __uint_as_float(__float_as_uint(f) | 1u);
  return f;
}
__device__ __forceinline__ float rlx_odd(long long x) {
  float f = __ll2float_rz(x);
  if ((long long)f != x) f = __uint_as_float(__float_as_uint(f) | 1u);
  return f;
}
""" + _register_half(
    "half", "h", "f16 in a register: a float rounded to f16 on construction (intermediate casts in "
    "fused chains).") + _register_half(
    "__nv_bfloat16", "b", "bf16 in a register, for when the shared dialect names a bf16 type (today "
    "it has none).", "  __device__ __nv_bfloat16(half x) : v(rlx_b2f(rlx_f2b(x.v))) {}\n") + \
    r"""/* Integer division as the MIR reference defines it: C's truncation toward zero, 0 for a zero
   divisor, and INT64_MIN / -1 wrapping to INT64_MIN (in C that one quotient is undefined). */
__device__ __forceinline__ long long rlx_idiv(long long a, long long b) {
  if (b == 0) return 0;
  if (b == -1) return (long long)(0ull - (unsigned long long)a);
  return a / b;
}
template <typename T> __device__ __forceinline__ T rlx_idiv(T a, T b) {
  return b == 0 ? (T)0 : (T)((long long)a / (long long)b);
}
template <typename T> __device__ __forceinline__ T rlx_nanmax(T a, T b) { return (b > a || b != b) ? b : a; }
template <typename T> __device__ __forceinline__ T rlx_warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = rlx_nanmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename T> __device__ __forceinline__ T rlx_warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/* Block-wide reduction (max when MAX, else sum); every thread gets the result. sh: 32 slots. */
template <typename T, bool MAX> __device__ T rlx_block_reduce(T v, T* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = MAX ? rlx_warp_max(v) : rlx_warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < nw ? sh[lane] : (MAX ? (T)(-INFINITY) : (T)0);
    w = MAX ? rlx_warp_max(w) : rlx_warp_sum(w);
    if (lane == 0) sh[0] = w;
  }
  __syncthreads();
  return sh[0];
}
#endif
"""


#: The body of ``rlx_f2b`` in :data:`PREAMBLE` (see :data:`VEC_PREAMBLE`).
_F2B_INT = PREAMBLE[PREAMBLE.index("  unsigned int u = __float_as_uint(f);"):
                    PREAMBLE.index("  return (unsigned short)(u >> 16);\n}")]
_F2B_INT += "  return (unsigned short)(u >> 16);\n"


def _name(prefix: str, body: str) -> str:
    return f"{prefix}_{hashlib.sha256(body.encode()).hexdigest()[:16]}"


def load(dt: DType, ref: str) -> str:
    """Expression reading one element (f16/bf16 widened to float)."""
    return {DType.F16: f"rlx_h2f({ref})", DType.BF16: f"rlx_b2f({ref})"}.get(dt, ref)


def store(dt: DType, expr: str, src: DType) -> str:
    """Expression converting a computed value of dtype ``src`` to ``dt``'s storage (one rounding)."""
    if dt not in HALF:
        return expr
    if src in (DType.F64, DType.I64, DType.I32):
        wide = f"(double)({expr})" if src is DType.I32 else f"({expr})"
        val = f"rlx_odd({wide})"
    else:  # f32, f16/bf16 (exact in float), narrow ints and bool (exact in float)
        val = f"(float)({expr})"
    return f"rlx_f2h({val})" if dt is DType.F16 else f"rlx_f2b({val})"


def _ctype_in_registers(dt: DType) -> str:
    return "float" if dt in HALF else STORAGE[dt]


# -- elementwise ----------------------------------------------------------------------------------

#: Elements per thread per loop trip: their loads are all issued before any store (memory-level
#: parallelism without ``__restrict__``, which in-place steps would make a lie).
UNROLL = 4


#: The shared CUDA dialect with integer ``div`` as the MIR reference defines it (``rlx_idiv`` in the
#: preamble): ``|a| // |b|`` computed in wrapping int64, times the signs, 0 for a zero divisor
#: (C's ``/`` is undefined for a zero divisor and ``MIN / -1``).
CUDA = dataclasses.replace(DIALECTS["cuda"], idiv="rlx_idiv({a}, {b})")


@lru_cache(maxsize=4096)
def elementwise_source(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType, layouts: str,
                       rank: int, wide: bool) -> tuple[str, str]:
    """``(kernel name, CUDA source)`` of one elementwise program.

    ``layouts`` has one letter per input: ``f`` (same shape as the output), ``s`` (one element),
    ``b`` (broadcast: strided over ``rank`` collapsed output dims). ``wide``: 64-bit indices.
    Each thread handles :data:`UNROLL` elements a grid-stride apart per trip.
    Raises :class:`IRError` when the program cannot be rendered for CUDA.
    """
    prog = _store_rounded(program, in_dtypes, out_dtype)
    idx = "long long" if wide else "int"
    params = [f"const {STORAGE[dt]}* x{k}" for k, dt in enumerate(in_dtypes)]
    params += [f"{STORAGE[out_dtype]}* y", f"{idx} n"]
    bcast = [k for k, lay in enumerate(layouts) if lay == "b"]
    if bcast:
        params += [f"{idx} d{j}" for j in range(rank)]
        params += [f"{idx} s{k}_{j}" for k in bcast for j in range(rank)]
    body = [f"  const {idx} T = ({idx})blockDim.x * gridDim.x;",
            f"  for ({idx} i0 = ({idx})blockIdx.x * blockDim.x + threadIdx.x; i0 < n; i0 += {UNROLL} * T) {{"]
    computes = []
    for u in range(UNROLL):
        i = f"i_{u}"
        body.append(f"    const {idx} {i} = i0 + {u} * T;")
        if bcast:
            body.append(f"    {idx} " + ", ".join(f"o{k}_{u} = 0" for k in bcast) + ";")
            body.append(f"    if ({i} < n) {{")
            body.append(f"      {idx} r = {i}, c;")
            for j in range(rank - 1, 0, -1):
                body.append(f"      c = r % d{j}; r /= d{j}; "
                            + " ".join(f"o{k}_{u} += c * s{k}_{j};" for k in bcast))
            body.append("      " + " ".join(f"o{k}_{u} += r * s{k}_0;" for k in bcast) + "\n    }")
        names = [f"a{k}_{u}" for k in range(len(in_dtypes))]
        for k, (dt, lay) in enumerate(zip(in_dtypes, layouts)):
            ct = _ctype_in_registers(dt)
            if lay == "s":
                body.append(f"    const {ct} {names[k]} = {load(dt, f'x{k}[0]')};")
            else:
                ref = f"x{k}[{i}]" if lay == "f" else f"x{k}[o{k}_{u}]"
                body.append(f"    const {ct} {names[k]} = {i} < n ? ({ct}){load(dt, ref)} : ({ct})0;")
        # Each copy lives in its own block, so the renderer's t<j> names can repeat.
        lines, res, rdt = render_program(prog, names, list(in_dtypes), CUDA)
        computes.append(f"    if ({i} < n) {{")
        computes += ["      " + ln for ln in lines]
        computes.append(f"      y[{i}] = {store(out_dtype, res, rdt)};")
        computes.append("    }")
    body += computes
    body.append("  }")
    sig = ", ".join(params)
    text = "\n".join(body)
    name = _name("rlx_ew", sig + text)
    return name, f'{PREAMBLE}\nextern "C" __global__ void {name}({sig}) {{\n{text}\n}}\n'


def _store_rounded(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str:
    """``program`` with a final cast to f16/bf16 dropped: it becomes the store's rounding (the
    dialect has no bf16 type). Raises :class:`IRError` for a dtype the kernels do not handle."""
    for dt in (*in_dtypes, out_dtype):
        if dt not in STORAGE:
            raise IRError(f"rlx-cuda elementwise kernels do not handle {dt}", fix="cast first")
    ops, out = decode(program)
    if ops and out == f"t{len(ops) - 1}" and ops[-1][0] == "cast" and ops[-1][2]["to"] in HALF:
        ops, out = ops[:-1], ops[-1][1][0]
    return encode(ops, out)


#: Widest access of the vectorised elementwise kernel, and the most elements one thread renders.
VEC_BYTES = 16
VEC_MAX = 8


def vector_layouts(layouts: str, dims: Sequence[int], strides: dict[int, list[int]]) -> str | None:
    """``layouts`` for :func:`elementwise_vec_source`: each broadcast input (``b``) that varies only
    along the last collapsed output dim (a bias: offset ``i % dims[-1]``) becomes ``r``; None when
    another broadcast pattern is present (then only the scalar kernel handles it)."""
    out = []
    for k, lay in enumerate(layouts):
        if lay == "b":
            st = strides[k]
            if st[-1] != 1 or any(st[:-1]):
                return None
            lay = "r"
        out.append(lay)
    return "".join(out)


def vector_width(layouts: str, in_dtypes: Sequence[DType], out_dtype: DType, n: int, last: int,
                 aligns: Sequence[int]) -> int:
    """Elements per thread of the vectorised kernel (2..:data:`VEC_MAX`; 0: use the scalar one).

    ``layouts`` from :func:`vector_layouts`, ``n`` output elements, ``last`` the length of the
    last collapsed output dim (``r`` inputs repeat every ``last``), ``aligns[k]`` the largest power
    of two dividing input ``k``'s address (the output's last). Every vector access is at most
    :data:`VEC_BYTES` and must be aligned to its size, and the vectors tile ``n`` and ``last``."""
    moved = [(dt, a) for lay, dt, a in zip(layouts, in_dtypes, aligns) if lay != "s"]
    moved.append((out_dtype, aligns[-1]))
    widest = max(dt.itemsize for dt, _ in moved)
    v = min(VEC_MAX, VEC_BYTES // widest)
    while v >= 2:
        if (n % v == 0 and ("r" not in layouts or last % v == 0)
                and all(a % (v * dt.itemsize) == 0 for dt, a in moved)):
            return v
        v //= 2
    return 0


@lru_cache(maxsize=4096)
def elementwise_vec_source(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType, layouts: str,
                           vec: int, wide: bool) -> tuple[str, str]:
    """``(kernel name, CUDA source)`` of one elementwise program, ``vec`` elements per thread and
    loop trip, moved as one aligned vector per operand (16 bytes: 8 x f16/bf16, 4 x f32).

    ``layouts``: ``f`` (same shape as the output), ``s`` (one element, loaded once), ``r`` (a row
    repeating along the output's last dim: vector ``v % dv``). Arguments: inputs, output, ``nv``
    (vectors in the output), then ``dv`` (vectors per row) when an ``r`` input is present. The
    element math is the scalar kernel's (:func:`elementwise_source`): each element is rendered on
    its own, in f32 for f16/bf16, with every rounding where the unfused graph has it; only the
    loads and stores are wider (the scalar kernel moves 2 bytes per f16 access and spends index
    math and bounds checks per element, which makes MiniLM's GELU issue-bound at ~40% of the
    bandwidth). Raises :class:`IRError` when the program cannot be rendered for CUDA."""
    prog = _store_rounded(program, in_dtypes, out_dtype)
    idx = "long long" if wide else "int"
    # (no __restrict__: an in-place step's output is one of its inputs; every trip loads its
    # vectors before storing, as the scalar kernel does)
    params = [f"const {STORAGE[dt]}* x{k}" for k, dt in enumerate(in_dtypes)]
    params += [f"{STORAGE[out_dtype]}* y", f"{idx} nv"]
    if "r" in layouts:
        params.append(f"{idx} dv")

    def unit(dt: DType) -> str:
        return PERMUTE_UNITS[vec * dt.itemsize]
    head = []
    for k, (dt, lay) in enumerate(zip(in_dtypes, layouts)):
        if lay == "s":
            ct = _ctype_in_registers(dt)
            head.append(f"  const {ct} s{k} = ({ct}){load(dt, f'x{k}[0]')};")
    body = [f"  const {idx} T = ({idx})blockDim.x * gridDim.x;",
            f"  for ({idx} v = ({idx})blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += T) {{"]
    if "r" in layouts:
        body.append(f"    const {idx} rv = v % dv;")
    for k, (dt, lay) in enumerate(zip(in_dtypes, layouts)):
        if lay == "s":
            continue
        body.append(f"    union {{ {unit(dt)} u; {STORAGE[dt]} e[{vec}]; }} l{k};")
        body.append(f"    l{k}.u = reinterpret_cast<const {unit(dt)}*>(x{k})[{'rv' if lay == 'r' else 'v'}];")
    body.append(f"    union {{ {unit(out_dtype)} u; {STORAGE[out_dtype]} e[{vec}]; }} o;")
    for u in range(vec):
        names = [f"s{k}" if lay == "s" else f"a{k}" for k, lay in enumerate(layouts)]
        body.append("    {")
        for k, (dt, lay) in enumerate(zip(in_dtypes, layouts)):
            if lay != "s":
                ct = _ctype_in_registers(dt)
                body.append(f"      const {ct} a{k} = ({ct}){load(dt, f'l{k}.e[{u}]')};")
        # Each element lives in its own block, so the renderer's t<j> names can repeat.
        lines, res, rdt = render_program(prog, names, list(in_dtypes), CUDA)
        body += ["      " + ln for ln in lines]
        body.append(f"      o.e[{u}] = {store(out_dtype, res, rdt)};")
        body.append("    }")
    body.append(f"    reinterpret_cast<{unit(out_dtype)}*>(y)[v] = o.u;")
    body.append("  }")
    sig = ", ".join(params)
    text = "\n".join(head + body)
    name = _name("rlx_ewv", sig + text)
    return name, f'{VEC_PREAMBLE}\nextern "C" __global__ void {name}({sig}) {{\n{text}\n}}\n'


#: The preamble of the vectorised kernels: bf16 rounding is one ``cvt.rn.bf16x2.f32`` on sm_80+
#: instead of seven integer instructions (a bf16 GELU rounds four times per element): IEEE
#: nearest-even either way, the same bits for every number and infinity; a NaN becomes the
#: canonical quiet NaN (as ``cvt.rn.f16.f32`` already does for f16) instead of keeping its payload.
#: The scalar kernels keep :data:`PREAMBLE` as it was.
VEC_PREAMBLE = PREAMBLE.replace(_F2B_INT, f"""#if __CUDA_ARCH__ >= 800
  unsigned int h; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(0.0f), "f"(f));
  return (unsigned short)h;  /* the low half: f; the packed form issues at full rate (F2FP, not F2F) */
#else
{_F2B_INT}#endif
""")
assert VEC_PREAMBLE != PREAMBLE


single_op_program = _kit_single_op_program  # the device kit's (one op as a fused program)


def plan_layouts(in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]
                 ) -> tuple[str, list[int], dict[int, list[int]]]:
    """Per input ``f``/``s``/``b``; for broadcast inputs the collapsed output dims and their strides."""
    r = len(out_shape)
    lays, strides = [], {}
    for k, shp in enumerate(in_shapes):
        full = (1,) * (r - len(shp)) + tuple(shp)
        n = 1
        for d in full:
            n *= d
        if full == tuple(out_shape):
            lays.append("f")
        elif n == 1:
            lays.append("s")
        else:
            lays.append("b")
            st, acc = [0] * r, 1
            for j in range(r - 1, -1, -1):
                st[j] = 0 if full[j] == 1 else acc
                acc *= full[j]
            strides[k] = st
    if not strides:
        return "".join(lays), [], {}
    keep = [j for j in range(r) if out_shape[j] != 1] or [r - 1]
    dims = [out_shape[j] for j in keep]
    kept = {k: [s[j] for j in keep] for k, s in strides.items()}
    j = len(dims) - 2
    while j >= 0:  # merge dim j into j+1 where every broadcast input is contiguous across both
        if all(s[j] == s[j + 1] * dims[j + 1] for s in kept.values()):
            dims[j:j + 2] = [dims[j] * dims[j + 1]]
            for s in kept.values():
                s[j:j + 2] = [s[j + 1]]
        j -= 1
    return "".join(lays), dims, kept


# -- row kernels ----------------------------------------------------------------------------------

def _compute(dt: DType) -> tuple[str, str]:
    """(C compute type, math suffix) for a row kernel of ``dt``."""
    return ("double", "") if dt is DType.F64 else ("float", "f")


@lru_cache(maxsize=64)
def softmax_source(dt: DType, log: bool) -> tuple[str, str]:
    """One block per row of ``n`` elements: y = softmax(x) (or log_softmax) along the row."""
    ct, f = _compute(dt)
    s = STORAGE[dt]
    if log:
        out = f"({load(dt, 'x[j]')} - m) - lse"
        pre = f"  const {ct} lse = log{f}(s);\n"
    else:
        out = f"exp{f}({load(dt, 'x[j]')} - m) / s"
        pre = ""
    name = f"rlx_{'log_' if log else ''}softmax_{dt.value}"
    src = f"""{PREAMBLE}
extern "C" __global__ void {name}(const {s}* xg, {s}* yg, int n) {{
  __shared__ {ct} sh[32];
  const {s}* x = xg + (long long)blockIdx.x * n;
  {s}* y = yg + (long long)blockIdx.x * n;
  {ct} m = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) m = rlx_nanmax(m, ({ct}){load(dt, 'x[j]')});
  m = rlx_block_reduce<{ct}, true>(m, sh);
  {ct} s = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) s += exp{f}({load(dt, 'x[j]')} - m);
  s = rlx_block_reduce<{ct}, false>(s, sh);
{pre}  for (int j = threadIdx.x; j < n; j += blockDim.x) y[j] = {store(dt, out, _cdt(dt))};
}}
"""
    return name, src


def _cdt(dt: DType) -> DType:
    return DType.F64 if dt is DType.F64 else DType.F32


#: ``x`` of a residual add fused into layer_norm: ``a + b`` rounded to ``dt`` as the add's own
#: kernel stores it (f16/bf16: computed in float, rounded once to nearest-even), so the statistics
#: see the same values as when the sum went through memory.
ADD_ROUNDED = {DType.F16: "rlx_h2f(rlx_f2h({a} + {b}))", DType.BF16: "rlx_b2f(rlx_f2b({a} + {b}))",
               DType.F32: "({a} + {b})", DType.F64: "({a} + {b})"}


@lru_cache(maxsize=64)
def layer_norm_source(dt: DType, per: int = 0) -> tuple[str, str]:
    """y = (x - mean) / sqrt(var + eps) * gamma + beta (two-pass statistics). ``per == 0``: one
    block per row; ``per > 0``: one warp per row of at most ``32 * per`` elements (see
    :func:`warp_per`), the row held in registers."""
    ct, f = _compute(dt)
    s = STORAGE[dt]
    if per:
        return _layer_norm_warp(dt, per)
    name = f"rlx_layer_norm_{dt.value}"
    y = f"(({load(dt, 'x[j]')} - mu) * rstd) * {load(dt, 'g[j]')} + {load(dt, 'b[j]')}"
    src = f"""{PREAMBLE}
extern "C" __global__ void {name}(const {s}* xg, const {s}* g, const {s}* b, {s}* yg, int n, {ct} eps) {{
  __shared__ {ct} sh[32];
  const {s}* x = xg + (long long)blockIdx.x * n;
  {s}* y = yg + (long long)blockIdx.x * n;
  {ct} acc = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) acc += {load(dt, 'x[j]')};
  const {ct} mu = rlx_block_reduce<{ct}, false>(acc, sh) / n;
  acc = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {{ {ct} d = {load(dt, 'x[j]')} - mu; acc += d * d; }}
  const {ct} var = rlx_block_reduce<{ct}, false>(acc, sh) / n;
  const {ct} rstd = ({ct})1 / sqrt{f}(var + eps);
  for (int j = threadIdx.x; j < n; j += blockDim.x) y[j] = {store(dt, y, _cdt(dt))};
}}
"""
    return name, src


def _layer_norm_warp(dt: DType, per: int, add: bool = False) -> tuple[str, str]:
    ct, f = _compute(dt)
    s = STORAGE[dt]
    name = f"rlx_{'add_' if add else ''}layer_norm_w{per}_{dt.value}"
    y = f"((v[t] - mu) * rstd) * {load(dt, 'g[j]')} + {load(dt, 'b[j]')}"
    xin = (ADD_ROUNDED[dt].format(a=load(dt, "x[j]"), b=load(dt, "x2[j]")) if add
           else load(dt, "x[j]"))
    x2p = f"const {s}* x2g, " if add else ""
    x2 = f"  const {s}* x2 = x2g + row * n;\n" if add else ""
    src = f"""{PREAMBLE}
extern "C" __global__ void {name}(const {s}* xg, {x2p}const {s}* g, const {s}* b, {s}* yg, int n, {ct} eps,
                                  long long rows) {{
  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;  /* whole warps leave together: the shuffles below stay full-warp */
  const int lane = threadIdx.x & 31;
  const {s}* x = xg + row * n;
{x2}  {s}* y = yg + row * n;
  {ct} v[{per}];
  {ct} acc = 0;
#pragma unroll
  for (int t = 0; t < {per}; ++t) {{
    const int j = lane + 32 * t;
    v[t] = j < n ? ({ct}){xin} : ({ct})0;
    acc += v[t];
  }}
  const {ct} mu = rlx_warp_sum(acc) / n;
  acc = 0;
#pragma unroll
  for (int t = 0; t < {per}; ++t) {{
    const int j = lane + 32 * t;
    if (j < n) {{ const {ct} d = v[t] - mu; acc += d * d; }}
  }}
  const {ct} var = rlx_warp_sum(acc) / n;
  const {ct} rstd = ({ct})1 / sqrt{f}(var + eps);
#pragma unroll
  for (int t = 0; t < {per}; ++t) {{
    const int j = lane + 32 * t;
    if (j < n) y[j] = {store(dt, y, _cdt(dt))};
  }}
}}
"""
    return name, src


@lru_cache(maxsize=64)
def layer_norm_vec_source(dt: DType, per: int, vec: int, add: bool = False) -> tuple[str, str]:
    """:func:`layer_norm_source` (``add``: :func:`add_layer_norm_source`) one warp per row, each
    lane moving ``per`` vectors of ``vec`` elements (``vec * itemsize`` <= 16 bytes) instead of
    ``per * vec`` single elements: same arguments and math (statistics in the compute type, the
    residual sum rounded to ``dt`` in registers), rows of ``n`` with ``n % vec == 0``, every row
    and ``g``/``b`` aligned to the vector. The warp holds its row in registers before storing,
    so ``y`` may be ``x`` (or ``x2``)."""
    ct, f = _compute(dt)
    s = STORAGE[dt]
    u = PERMUTE_UNITS[vec * dt.itemsize]
    name = f"rlx_{'add_' if add else ''}layer_norm_w{per}v{vec}_{dt.value}"
    xin = (ADD_ROUNDED[dt].format(a=load(dt, "lx.e[k]"), b=load(dt, "lx2.e[k]")) if add
           else load(dt, "lx.e[k]"))
    x2p = f"const {s}* x2g, " if add else ""
    x2 = f"  const {u}* x2 = reinterpret_cast<const {u}*>(x2g + row * n);\n" if add else ""
    ld2 = " lx2.u = x2[j];" if add else ""
    y = f"((v[t * {vec} + k] - mu) * rstd) * {load(dt, 'lg.e[k]')} + {load(dt, 'lb.e[k]')}"
    src = f"""{PREAMBLE}
extern "C" __global__ void {name}(const {s}* xg, {x2p}const {s}* g, const {s}* b, {s}* yg, int n, {ct} eps,
                                  long long rows) {{
  typedef union {{ {u} u; {s} e[{vec}]; }} vec_t;
  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;  /* whole warps leave together: the shuffles below stay full-warp */
  const int lane = threadIdx.x & 31;
  const int nv = n / {vec};
  const {u}* x = reinterpret_cast<const {u}*>(xg + row * n);
{x2}  {u}* y = reinterpret_cast<{u}*>(yg + row * n);
  const {u}* gv = reinterpret_cast<const {u}*>(g);
  const {u}* bv = reinterpret_cast<const {u}*>(b);
  {ct} v[{per * vec}];
  {ct} acc = 0;
#pragma unroll
  for (int t = 0; t < {per}; ++t) {{
    const int j = lane + 32 * t;
    if (j < nv) {{
      vec_t lx, lx2;
      lx.u = x[j];{ld2}
      (void)lx2;
#pragma unroll
      for (int k = 0; k < {vec}; ++k) {{ v[t * {vec} + k] = ({ct}){xin}; acc += v[t * {vec} + k]; }}
    }} else {{
#pragma unroll
      for (int k = 0; k < {vec}; ++k) v[t * {vec} + k] = ({ct})0;
    }}
  }}
  const {ct} mu = rlx_warp_sum(acc) / n;
  acc = 0;
#pragma unroll
  for (int t = 0; t < {per}; ++t) {{
    if (lane + 32 * t < nv) {{
#pragma unroll
      for (int k = 0; k < {vec}; ++k) {{ const {ct} d = v[t * {vec} + k] - mu; acc += d * d; }}
    }}
  }}
  const {ct} var = rlx_warp_sum(acc) / n;
  const {ct} rstd = ({ct})1 / sqrt{f}(var + eps);
#pragma unroll
  for (int t = 0; t < {per}; ++t) {{
    const int j = lane + 32 * t;
    if (j < nv) {{
      vec_t lg, lb, lo;
      lg.u = gv[j];
      lb.u = bv[j];
#pragma unroll
      for (int k = 0; k < {vec}; ++k) lo.e[k] = {store(dt, y, _cdt(dt))};
      y[j] = lo.u;
    }}
  }}
}}
"""
    return name, src


def layer_norm_vec(n: int, dt: DType, aligns: Sequence[int]) -> int:
    """Elements per vector of :func:`layer_norm_vec_source` for rows of ``n`` (1: the scalar
    kernels): the widest of 8/4/2 whose vector is at most 16 bytes, divides ``n`` and every
    address's alignment (``aligns``), preferring one whose vectors fill whole warp trips (f16 at
    384: 4 x 2 bytes, 3 per lane, rather than 8 x 2 bytes with half the lanes idle on the 2nd)."""
    best = 1
    for v in (8, 4, 2):
        if v * dt.itemsize > VEC_BYTES or n % v or any(a % (v * dt.itemsize) for a in aligns):
            continue
        if (n // v) % 32 == 0:
            return v
        best = max(best, v)
    return best


#: Longest row a warp-per-row kernel takes (32 lanes x 32 values in registers).
WARP_ROW_MAX = 1024
#: Warps (rows) per block of a warp-per-row kernel.
WARP_ROWS = 4


def warp_per(n: int) -> int:
    """Values per lane for a warp-per-row kernel over rows of ``n``, or 0 (use one block per row).

    Short rows (attention scores at seq <= 1024, hidden sizes) waste a block per row: most of its
    time goes to __syncthreads and shared-memory reductions; a warp reduces with shuffles alone.
    """
    return (n + 31) // 32 if 0 < n <= WARP_ROW_MAX else 0


MASKED_SCORE = "-1e9"  # the reference's masked score (rlx_core.ir.hir.MASKED_SCORE)


@lru_cache(maxsize=256)
def attention_softmax_source(dt: DType, mask: str, mask_dtype: DType | None, per: int = 0
                             ) -> tuple[str, str]:
    """Masked softmax over the rows of the scores ``S`` (``scale * q @ k^T``, in the compute type)
    into the probabilities ``P`` (``dt``; may alias ``S`` when the types agree).

    Row ``r`` is query ``i = r % sq`` of batch-head ``bh = r / sq`` (``b = bh / heads``). ``mask``:
    ``none``, ``causal`` (key j visible iff j <= i), ``sliding_window`` (and j > i - window),
    ``padding`` (``m[b, j] != 0``), ``bias`` (``+ m[b*s0 + h*s1 + i*s2 + j*s3]``).
    ``per == 0``: one block per row; ``per > 0``: one warp per row of ``sk <= 32 * per`` scores
    held in registers (one more argument: the row count).
    """
    ct, f = _compute(dt)
    sc = ct  # scores are stored in the compute type
    s = STORAGE[dt]
    extra = ""
    if mask == "sliding_window":
        extra = ", int window"
    elif mask == "padding":
        assert mask_dtype is not None
        extra = f", const {STORAGE[mask_dtype]}* mk"
    elif mask == "bias":
        extra = f", const {s}* mk, long long s0, long long s1, long long s2, long long s3"
    keep = {"none": None, "causal": "j <= i", "sliding_window": "j <= i && j > i - window",
            "padding": None if mask_dtype is None else f"{load(mask_dtype, 'mk[b * sk + j]')} != 0",
            "bias": None}[mask]
    score = "S[j]"
    if mask == "bias":
        score = f"(S[j] + ({ct}){load(dt, 'mk[b * s0 + h * s1 + i * s2 + j * s3]')})"
    val = score if keep is None else f"(({keep}) ? {score} : ({ct}){MASKED_SCORE})"
    head = f"const {sc}* sg, {s}* pg, int sk, int sq, int heads{extra}"
    if per:
        head += ", long long rows"
        body = f"""
  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;  /* whole warps leave together: the shuffles below stay full-warp */
  const int lane = threadIdx.x & 31;
  const int i = (int)(row % sq);
  const long long bh = row / sq, b = bh / heads, h = bh % heads;
  const {sc}* S = sg + row * sk;
  {s}* P = pg + row * sk;
  (void)i; (void)b; (void)h;
  {ct} v[{per}];
  {ct} m = -INFINITY;
#pragma unroll
  for (int t = 0; t < {per}; ++t) {{
    const int j = lane + 32 * t;
    v[t] = j < sk ? ({ct}){val} : ({ct})-INFINITY;
    m = rlx_nanmax(m, v[t]);
  }}
  m = rlx_warp_max(m);
  {ct} tot = 0;
#pragma unroll
  for (int t = 0; t < {per}; ++t) {{
    const int j = lane + 32 * t;
    v[t] = j < sk ? exp{f}(v[t] - m) : ({ct})0;
    tot += v[t];
  }}
  tot = rlx_warp_sum(tot);
#pragma unroll
  for (int t = 0; t < {per}; ++t) {{
    const int j = lane + 32 * t;
    if (j < sk) {{ const {ct} e = v[t] / tot; P[j] = {store(dt, 'e', _cdt(dt))}; }}
  }}
"""
        name = _name("rlx_attn_softmax_w", head + body)
        return name, f'{PREAMBLE}\nextern "C" __global__ void {name}({head}) {{{body}}}\n'
    body = f"""
  __shared__ {ct} sh[32];
  const long long row = blockIdx.x;
  const int i = (int)(row % sq);
  const long long bh = row / sq, b = bh / heads, h = bh % heads;
  const {sc}* S = sg + row * sk;
  {s}* P = pg + row * sk;
  (void)i; (void)b; (void)h;
  {ct} m = -INFINITY;
  for (int j = threadIdx.x; j < sk; j += blockDim.x) m = rlx_nanmax(m, ({ct}){val});
  m = rlx_block_reduce<{ct}, true>(m, sh);
  {ct} t = 0;
  for (int j = threadIdx.x; j < sk; j += blockDim.x) t += exp{f}({val} - m);
  t = rlx_block_reduce<{ct}, false>(t, sh);
  for (int j = threadIdx.x; j < sk; j += blockDim.x) {{
    const {ct} e = exp{f}({val} - m) / t;
    P[j] = {store(dt, 'e', _cdt(dt))};
  }}
"""
    name = _name("rlx_attn_softmax", head + body)
    return name, f'{PREAMBLE}\nextern "C" __global__ void {name}({head}) {{{body}}}\n'


#: Identities of max/min for CuPy ReductionKernels (``rlx_lo<T>()`` / ``rlx_hi<T>()``).
MINMAX_PREAMBLE = r"""
template <typename T> __device__ T rlx_lo();
template <typename T> __device__ T rlx_hi();
template <> __device__ float rlx_lo<float>() { return __int_as_float(0xff800000); }
template <> __device__ float rlx_hi<float>() { return __int_as_float(0x7f800000); }
template <> __device__ double rlx_lo<double>() { return __longlong_as_double(0xfff0000000000000LL); }
template <> __device__ double rlx_hi<double>() { return __longlong_as_double(0x7ff0000000000000LL); }
template <> __device__ signed char rlx_lo<signed char>() { return -128; }
template <> __device__ signed char rlx_hi<signed char>() { return 127; }
template <> __device__ short rlx_lo<short>() { return -32768; }
template <> __device__ short rlx_hi<short>() { return 32767; }
template <> __device__ int rlx_lo<int>() { return -2147483647 - 1; }
template <> __device__ int rlx_hi<int>() { return 2147483647; }
template <> __device__ long long rlx_lo<long long>() { return -9223372036854775807LL - 1; }
template <> __device__ long long rlx_hi<long long>() { return 9223372036854775807LL; }
template <> __device__ unsigned char rlx_lo<unsigned char>() { return 0; }
template <> __device__ unsigned char rlx_hi<unsigned char>() { return 255; }
"""


def minmax_check_source() -> tuple[str, str]:
    """A kernel using :data:`MINMAX_PREAMBLE` for every type (compiled by the no-GPU test)."""
    name = "rlx_minmax_identities"
    types = [STORAGE[d] for d in (DType.F32, DType.F64, DType.I8, DType.I16, DType.I32, DType.I64, DType.U8)]
    body = " ".join(f"(({t}*)p)[{i}] = rlx_lo<{t}>() + rlx_hi<{t}>();" for i, t in enumerate(types))
    return name, f'{MINMAX_PREAMBLE}\nextern "C" __global__ void {name}(void* p) {{ {body} }}\n'


# -- index bounds (gather, scatter_add) ----------------------------------------------------------

def bound_index_source(idt: DType) -> tuple[str, str]:
    """``k[i]`` = ``idx[i]`` counted from the end once if negative (ONNX), ``bad[i]`` = it is still
    outside ``[0, n)`` (then ``k[i]`` = 0, a safe address). gather zeroes the bad outputs and
    scatter_add skips the bad updates: CuPy's take and add.at wrap indices modulo n, which is
    in bounds but not ONNX's rule. Checked in 64 bits (an i64 index is not narrowed first)."""
    ct = {DType.I32: "int", DType.I64: "long long"}[idt]
    name = f"rlx_bound_index_{idt.value}"
    return name, (
        f'extern "C" __global__ void {name}(const {ct}* __restrict__ idx, long long n, long long count,\n'
        f"    long long* __restrict__ k, bool* __restrict__ bad) {{\n"
        f"  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;\n"
        f"       i += (long long)gridDim.x * blockDim.x) {{\n"
        f"    long long v = (long long)idx[i];\n"
        f"    if (v < 0) v += n;\n"
        f"    const bool out = v < 0 || v >= n;\n"
        f"    k[i] = out ? 0 : v;\n"
        f"    bad[i] = out;\n"
        f"  }}\n}}\n")


# -- permute copy (transpose) --------------------------------------------------------------------

#: Copy unit in bytes -> C type: a transpose that keeps the last axis moves whole 16-byte vectors.
PERMUTE_UNITS = {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}
PERMUTE_MAX_RANK = 6


@lru_cache(maxsize=64)
def permute_source(rank: int, unit: int, wide: bool) -> tuple[str, str]:
    """``y[o] = x[offset(o)]`` over ``n`` units of ``unit`` bytes: ``o`` is split into the output
    coordinates (dims ``d0..``, last fastest) and ``offset`` sums coordinate x input stride (``st0..``,
    in units). One kernel for every transpose of this rank and unit; ``wide``: 64-bit indices."""
    t = PERMUTE_UNITS[unit]
    it = "long long" if wide else "int"
    dims = ", ".join(f"{it} d{k}" for k in range(rank))
    sts = ", ".join(f"{it} st{k}" for k in range(rank))
    split = "".join(f"    c = rem % d{k}; rem /= d{k}; off += c * st{k};\n" for k in range(rank - 1, 0, -1))
    name = f"rlx_permute_r{rank}_u{unit}_{'w' if wide else 'n'}"
    src = f"""extern "C" __global__ void {name}(const {t}* __restrict__ x, {t}* __restrict__ y, {it} n,
                                  {dims}, {sts}) {{
  for ({it} o = ({it})blockIdx.x * blockDim.x + threadIdx.x; o < n; o += ({it})gridDim.x * blockDim.x) {{
    {it} rem = o, off = 0, c = 0;
{split}    off += rem * st0;
    (void)c; (void)d0;
    y[o] = x[off];
  }}
}}
"""
    return name, src


def row_block(n: int) -> int:
    """Threads per block for a row kernel over rows of ``n`` elements."""
    if n >= 1024:
        return 1024
    return max(32, (n + 31) // 32 * 32)


def all_row_kernels() -> list[tuple[str, str]]:
    """Every row kernel (and permute copy) the plugin can emit (the no-GPU test compiles them all)."""
    out = []
    for dt in (DType.F32, DType.F64, DType.F16, DType.BF16):
        out += [softmax_source(dt, False), softmax_source(dt, True)]
        for per in (0, 1, 4, 12, 32):
            out.append(layer_norm_source(dt, per))
            for mask in ("none", "causal", "sliding_window", "bias"):
                out.append(attention_softmax_source(dt, mask, None, per))
            for mdt in (DType.BOOL, DType.I32, DType.I64, DType.F32, DType.F16, dt):
                out.append(attention_softmax_source(dt, "padding", mdt, per))
    for rank in range(1, PERMUTE_MAX_RANK + 1):
        for unit in PERMUTE_UNITS:
            out += [permute_source(rank, unit, False), permute_source(rank, unit, True)]
    from . import flash  # (imports this module: not at the top)

    for dt in flash.FLASH_DTYPES:  # the fused attention (sm_80+: the no-GPU test targets sm_90)
        for hd in flash.HEAD_DIMS:
            for vec in (True, False):
                out += [flash.flash_source(dt, "padding", DType.I64, hd, vec),
                        flash.flash_source(dt, "sliding_window", None, hd, vec)]
    out += all_data_kernels()  # gather, sum/prod/mean, add + layer_norm
    return list(dict.fromkeys(out))


# -- gather (embedding lookups) -------------------------------------------------------------------

#: Index dtypes a gather kernel reads (as stored: no widening pass over the indices first).
GATHER_INDEX = {DType.I32: "int", DType.I64: "long long"}


@lru_cache(maxsize=64)
def gather_source(unit: int, idt: DType, wide: bool) -> tuple[str, str]:
    """``y[b, j, c] = x[b, k(j), c]``: ``x`` viewed as (outer, n, inner) and ``y`` as (outer, nidx,
    inner), both in copy units of ``unit`` bytes (``inner`` counts units). ``k(j)`` is ``idx[j]``
    counted from the end once if negative (ONNX); an index still outside ``[0, n)`` gives zeros.

    One fused pass (the old path ran a bounds kernel, CuPy's take with per-element int64 index
    math, then a masked copy): consecutive threads copy consecutive units of one gathered row, so
    an f16 embedding row of 384 moves as 48 coalesced 16-byte loads. ``wide``: 64-bit offsets."""
    t = PERMUTE_UNITS[unit]
    ct = GATHER_INDEX[idt]
    it = "long long" if wide else "int"
    name = f"rlx_gather_u{unit}_{idt.value}_{'w' if wide else 'n'}"
    src = f"""extern "C" __global__ void {name}(const {t}* __restrict__ x, const {ct}* __restrict__ idx,
    {t}* __restrict__ y, {it} total, {it} inner, {it} nidx, long long n) {{
  for ({it} o = ({it})blockIdx.x * blockDim.x + threadIdx.x; o < total; o += ({it})gridDim.x * blockDim.x) {{
    const {it} row = o / inner;
    const {it} c = o - row * inner;
    const {it} b = row / nidx;
    long long v = (long long)idx[row - b * nidx];
    if (v < 0) v += n;
    {t} val{{}};  /* zeros: an out-of-range index reads nothing */
    if (v >= 0 && v < n) val = x[(b * ({it})n + ({it})v) * inner + c];
    y[o] = val;
  }}
}}
"""
    return name, src


# -- sum / prod / mean over one run of adjacent axes ----------------------------------------------

#: Accumulator C type per input dtype: integers wrap in unsigned 64-bit arithmetic (defined in C,
#: and the same low bits as the int32/int64 result), floats accumulate in their own precision.
REDUCE_ACC = {DType.F32: "float", DType.F64: "double", DType.I32: "unsigned long long",
              DType.I64: "unsigned long long"}
#: Threads splitting the reduced axis in the strided kernel (blockDim.y; blockDim.x = 32 outputs).
REDUCE_SPLIT = 8
#: Rows per block of the warp-per-row kernel.
REDUCE_WARP_ROWS = 8


@lru_cache(maxsize=128)
def reduce_source(op: str, in_dt: DType, out_dt: DType, kind: str) -> tuple[str, str]:
    """``y[o, i] = op over r of x[o, r, i]`` (``op``: sum, prod or mean), ``x`` contiguous as
    (outer, R, inner). ``kind``:

    * ``warp``: inner == 1, one warp per row (lanes stride the row: coalesced), shuffle reduction;
    * ``block``: inner == 1, one 256-thread block per row, for few long rows;
    * ``strided``: inner > 1, a block of 32 x 8 threads per 32 adjacent outputs: ``x`` lanes take
      adjacent outputs (coalesced loads along ``inner``), the 8 ``y`` threads split R, and shared
      memory adds their partials.
    Floats accumulate in their own precision (as CuPy's sum); mean divides the total by R."""
    acc = REDUCE_ACC[in_dt]
    tin, tout = STORAGE[in_dt], STORAGE[out_dt]
    ident = "1" if op == "prod" else "0"
    sym = "*" if op == "prod" else "+"

    def comb(a: str, b: str) -> str:
        return f"{a} {sym} ({b})"
    fin = f"acc / ({acc})R" if op == "mean" else "acc"
    if acc == "unsigned long long":  # wrap back to the (signed) output type
        final = f"({tout})(long long)({fin})"
    else:
        final = f"({tout})({fin})"
    # (no file-scope helpers: CI compiles every kernel in one translation unit)
    at, ld, ldi = acc, f"({acc})p[r]", f"({acc})p[r * inner]"
    if kind == "warp":
        body = f"""(const {tin}* __restrict__ x, {tout}* __restrict__ y, long long rows, long long R) {{
  const int lane = threadIdx.x & 31;
  for (long long row = (long long)blockIdx.x * {REDUCE_WARP_ROWS} + (threadIdx.x >> 5); row < rows;
       row += (long long)gridDim.x * {REDUCE_WARP_ROWS}) {{  /* warp-uniform: full-mask shuffles below */
    const {tin}* p = x + row * R;
    {at} acc = ({ident});
    for (long long r = lane; r < R; r += 32) acc = {comb('acc', ld)};
    for (int s = 16; s > 0; s >>= 1) acc = {comb('acc', '__shfl_xor_sync(0xffffffffu, acc, s)')};
    if (lane == 0) y[row] = {final};
  }}
}}
"""
    elif kind == "block":
        body = f"""(const {tin}* __restrict__ x, {tout}* __restrict__ y, long long rows, long long R) {{
  __shared__ {at} sh[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {{  /* block-uniform */
    const {tin}* p = x + row * R;
    {at} acc = ({ident});
    for (long long r = threadIdx.x; r < R; r += blockDim.x) acc = {comb('acc', ld)};
    for (int s = 16; s > 0; s >>= 1) acc = {comb('acc', '__shfl_xor_sync(0xffffffffu, acc, s)')};
    if (lane == 0) sh[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {{
      for (int w = 1; w < nw; ++w) acc = {comb('acc', 'sh[w]')};
      y[row] = {final};
    }}
    __syncthreads();  /* sh is reused by the next row */
  }}
}}
"""
    elif kind == "strided":
        body = f"""(const {tin}* __restrict__ x, {tout}* __restrict__ y, long long outer, long long R,
    long long inner) {{
  __shared__ {at} sh[{REDUCE_SPLIT}][33];
  const long long i = (long long)blockIdx.x * 32 + threadIdx.x;
  for (long long o = blockIdx.y; o < outer; o += gridDim.y) {{  /* block-uniform */
    {at} acc = ({ident});
    if (i < inner) {{
      const {tin}* p = x + o * R * inner + i;
      for (long long r = threadIdx.y; r < R; r += {REDUCE_SPLIT}) acc = {comb('acc', ldi)};
    }}
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && i < inner) {{
      for (int k = 1; k < {REDUCE_SPLIT}; ++k) acc = {comb('acc', 'sh[k][threadIdx.x]')};
      y[o * inner + i] = {final};
    }}
    __syncthreads();  /* sh is reused by the next o */
  }}
}}
"""
    else:
        raise ValueError(f"unknown reduce kernel kind {kind!r}")
    name = _name(f"rlx_reduce_{op}_{kind}", body)
    return name, f'extern "C" __global__ void {name}{body}'


def reduce_plan(shape: Sequence[int], axes: Sequence[int]) -> tuple[int, int, int] | None:
    """``(outer, R, inner)`` when the reduced axes, ignoring size-1 dims, are adjacent; else None."""
    red = set(axes)
    kept = [(int(d), k in red) for k, d in enumerate(shape) if int(d) != 1]
    flags = [r for _, r in kept]
    if True in flags:
        first, last = flags.index(True), len(flags) - 1 - flags[::-1].index(True)
        if not all(flags[first:last + 1]):
            return None
    else:
        first = last = len(kept)  # nothing (but size-1 dims) reduced: R = 1
        last -= 1
    dims = [d for d, _ in kept]
    outer = 1
    for d in dims[:first]:
        outer *= d
    rr = 1
    for d in dims[first:last + 1]:
        rr *= d
    inner = 1
    for d in dims[last + 1:]:
        inner *= d
    return outer, rr, inner


@lru_cache(maxsize=64)
def add_layer_norm_source(dt: DType, per: int) -> tuple[str, str]:
    """layer_norm(a + b) in one warp-per-row kernel (``per`` as in :func:`layer_norm_source`): the
    residual add's sum is rounded to ``dt`` in registers (:data:`ADD_ROUNDED`) and never stored."""
    return _layer_norm_warp(dt, per, add=True)


def all_data_kernels() -> list[tuple[str, str]]:
    """Every gather, reduce and add + layer_norm kernel the plugin can emit (compiled by the
    no-GPU tests)."""
    out = []
    for dt in ADD_ROUNDED:
        for per in (1, 4, 12, 32):
            out.append(add_layer_norm_source(dt, per))
        for vec in (2, 4, 8):
            if vec * dt.itemsize <= VEC_BYTES:
                for per in (1, 3, 32 // vec):
                    out += [layer_norm_vec_source(dt, per, vec), layer_norm_vec_source(dt, per, vec, True)]
    for unit in PERMUTE_UNITS:
        for idt in GATHER_INDEX:
            out += [gather_source(unit, idt, False), gather_source(unit, idt, True)]
    for in_dt in REDUCE_ACC:
        for op in ("sum", "prod", "mean"):
            if op == "mean" and in_dt not in (DType.F32, DType.F64):
                continue
            for kind in ("warp", "block", "strided"):
                out.append(reduce_source(op, in_dt, in_dt, kind))
    return list(dict.fromkeys(out))
