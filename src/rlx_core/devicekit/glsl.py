"""One GLSL compute-shader kernel library for every GLSL target (Vulkan, OpenGL 4.3): templates,
lowering of LIR steps to dispatches, and claims, with the API's way of declaring resources as a
:class:`GlslFlavour` (the GLSL counterpart of :mod:`.cstyle`'s dialects).

Every shader sees three storage buffers: the arena (binding 0, ``uint A[]``), the constants
(binding 1, ``uint W[]``) and the program's launch parameters (binding 2, ``int M[]``), plus one
integer, ``pc.base``: where the dispatch's parameters (shapes, strides, buffer slots and *byte
offsets*) start in ``M``. Offsets travel as parameters, never as binding offsets, so nothing depends
on an API's binding-offset alignment (``GL_SHADER_STORAGE_BUFFER_OFFSET_ALIGNMENT``,
``minStorageBufferOffsetAlignment``) and every dispatch of a program shares one set of bindings.
A flavour says how that is declared: Vulkan (``#version 450``, descriptor set 0, ``pc.base`` a push
constant) or OpenGL (``#version 430``, plain bindings, ``pc.base`` a uniform struct member).

Elementwise bodies come from the shared renderer (:func:`rlx_core.codegen.render_program`, dialect
:data:`GLSL`: the shared ``"glsl"`` one with this library's helpers); matmul, reductions, row
kernels, scans, arg-extrema, conv2d and movement are hand-written templates. A GLSL target is a
flavour plus a runtime shim: an allocator, shader loading and binding (see :class:`GlslProgram`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np

from ..codegen.render import DIALECTS, render_program
from ..dtypes import DType
from ..errors import IRError
from ..ir.types import normalize_axis
from ..lir import Program, Step
from .claims import single_op_program
from .program import Allocator, KitProgram, Launch, Runtime


@dataclass(frozen=True, eq=False)  # identity: flavours are singletons, and hashable for the memos
class GlslFlavour:
    """How one graphics API's GLSL declares the library's resources."""

    name: str
    #: the ``#version`` line
    version: str
    #: what goes before ``binding = k`` in a storage buffer's layout (Vulkan: the descriptor set)
    set_qualifier: str
    #: the declaration that makes ``pc.base`` an ``int`` (push constant, uniform, ...)
    params: str


VULKAN = GlslFlavour("vulkan", "#version 450", "set = 0, ",
                     "layout(push_constant) uniform PC { int base; } pc;")
#: OpenGL 4.3 compute shaders: ``pc.base`` is the uniform ``pc.base`` (a struct member, so the
#: templates read the same in both flavours), set before each dispatch.
OPENGL = GlslFlavour("opengl", "#version 430", "", "struct RlxParams { int base; };\nuniform RlxParams pc;")
GLSL_FLAVOURS: dict[str, GlslFlavour] = {"vulkan": VULKAN, "opengl": OPENGL}

WG = 64
TYPES = {DType.F32: "float", DType.I32: "int", DType.BOOL: "bool", DType.I64: "int64_t"}
ESIZE = {DType.F32: 4, DType.I32: 4, DType.BOOL: 1, DType.I64: 8}

# rlx_tanh passes NaN through explicitly: tanh(NaN) is undefined in GLSL (llvmpipe's OpenGL path
# gives -1, its Vulkan path NaN).
HEADER = """%(version)s
layout(local_size_x = %(wx)d, local_size_y = %(wy)d) in;
layout(std430, %(set)sbinding = 0) buffer Arena { uint A[]; };
layout(std430, %(set)sbinding = 1) readonly buffer Weights { uint W[]; };
layout(std430, %(set)sbinding = 2) readonly buffer Meta { int M[]; };
%(params)s
uint rd(int b, uint a) { return b == 0 ? A[a >> 2] : W[a >> 2]; }
float ldf(int b, uint a) { return uintBitsToFloat(rd(b, a)); }
int ldi(int b, uint a) { return int(rd(b, a)); }
bool ldb(int b, uint a) { return ((rd(b, a) >> ((a & 3u) * 8u)) & 0xffu) != 0u; }
float rlx_inf() { return uintBitsToFloat(0x7f800000u); }
float rlx_nan() { return uintBitsToFloat(0x7fc00000u); }
int rlx_idiv(int a, int b) {
  if (b == 0) return 0;
  uint q = uint(abs(a)) / uint(abs(b));
  int s = ((a > 0) == (b > 0) || a == 0) ? 1 : -1;
  return int(q) * s;
}
float rlx_tanh(float x) { return x != x ? x : (abs(x) > 15.0 ? sign(x) : tanh(x)); }
float rlx_exp(float x) { return x != x ? x : (x > 88.8 ? rlx_inf() : (x < -104.0 ? 0.0 : exp(x))); }
float rlx_log(float x) {
  return x != x ? x : (x < 0.0 ? rlx_nan() : (x == 0.0 ? -rlx_inf() : (isinf(x) ? x : log(x))));
}
"""


def header(fl: GlslFlavour, wx: int = WG, wy: int = 1, extra: str = "") -> str:
    """The common prologue of every shader in flavour ``fl``: the three storage buffers, the step's
    base into ``M`` (``pc.base``) and the shared helpers; ``extra`` adds extensions and helpers."""
    src = HEADER % {"wx": wx, "wy": wy, "version": fl.version, "set": fl.set_qualifier, "params": fl.params}
    if extra:  # extensions right after #version, helpers after the common ones
        ext = "".join(ln + "\n" for ln in extra.splitlines() if ln.startswith("#extension"))
        body = "".join(ln + "\n" for ln in extra.splitlines() if not ln.startswith("#extension"))
        src = src.replace(fl.version + "\n", fl.version + "\n" + ext, 1) + body
    return src


#: f64/i64 helpers (need shaderFloat64 / shaderInt64): Payne-Hanek sin/cos and an accurate pow.
WIDE = """
#extension GL_ARB_gpu_shader_int64 : require
const uint TWO_OVER_PI[10] = uint[10](0xA2F9836Eu, 0x4E441529u, 0xFC2757D1u, 0xF534DDC0u, 0xDB629599u,
                                      0x3C439041u, 0xFE5163ABu, 0xDEBBC561u, 0xB7246E3Au, 0x424DD2E0u);
uint rlx_bits32(int j) {  // bits j..j+31 of 2/pi (bit j has weight 2^-j; bits j <= 0 are 0)
  int p = j - 1;
  if (p < 0) { int n = -p; return n >= 32 ? 0u : TWO_OVER_PI[0] >> uint(n); }
  int w = p >> 5, o = p & 31;
  uint hi = w < 10 ? TWO_OVER_PI[w] : 0u; uint lo = w + 1 < 10 ? TWO_OVER_PI[w + 1] : 0u;
  return o == 0 ? hi : (hi << uint(o)) | (lo >> uint(32 - o));
}
uint64_t rlx_bits64(int j) { return (uint64_t(rlx_bits32(j)) << 32) | uint64_t(rlx_bits32(j + 32)); }
// |x| * 2/pi mod 4 exactly (Payne-Hanek): quadrant q and the angle r in [-pi/4, pi/4]
float rlx_reduce(float x, out int q) {
  uint u = floatBitsToUint(abs(x));
  int E = int(u >> 23); uint64_t mant = uint64_t((u & 0x7fffffu) | (E > 0 ? 0x800000u : 0u));
  if (E == 0) E = 1;
  int sh = E - 150; int j0 = sh - 2;
  uint64_t c1 = rlx_bits64(j0 + 1); uint64_t c2 = rlx_bits64(j0 + 65);
  uint64_t S = mant * c1 + ((mant * (c2 >> 32)) >> 32);
  q = int(S >> 62);
  double f = double(S & 0x3fffffffffffffffUL) * (1.0LF / 4611686018427387904.0LF);
  if (f >= 0.5LF) { f -= 1.0LF; q += 1; }
  return float(f * 1.5707963267948966192LF);
}
// sin/cos on [-pi/4, pi/4] by polynomial (Cephes sinf/cosf, ~1 ulp): drivers may implement the
// GLSL built-ins with a fast hardware approximation (NVIDIA's has ~3e-7 absolute error).
float rlx_sinp(float r) {
  float z = r * r;
  return r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * (-1.9515295891e-4)));
}
float rlx_cosp(float r) {
  float z = r * r;
  return 1.0 - 0.5 * z
         + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
}
float rlx_sin(float x) {
  if (isnan(x) || isinf(x)) return rlx_nan();
  if (abs(x) <= 0.78539816) return rlx_sinp(x);
  int q; float r = rlx_reduce(x, q); q &= 3;
  float v = q == 0 ? rlx_sinp(r) : q == 1 ? rlx_cosp(r) : q == 2 ? -rlx_sinp(r) : -rlx_cosp(r);
  return x < 0.0 ? -v : v;
}
float rlx_cos(float x) {
  if (isnan(x) || isinf(x)) return rlx_nan();
  if (abs(x) <= 0.78539816) return rlx_cosp(x);
  int q; float r = rlx_reduce(x, q); q &= 3;
  return q == 0 ? rlx_cosp(r) : q == 1 ? -rlx_sinp(r) : q == 2 ? -rlx_cosp(r) : rlx_sinp(r);
}
float rlx_pow(float a, float b) {
  if (b == 0.0 || a == 1.0) return 1.0;
  if (isnan(a) || isnan(b)) return rlx_nan();
  if (isinf(b)) {
    float m = abs(a); if (m == 1.0) return 1.0;
    return ((m > 1.0) == (b > 0.0)) ? rlx_inf() : 0.0;
  }
  bool bint = floor(b) == b; bool odd = bint && mod(abs(b), 2.0) == 1.0;
  bool neg = (floatBitsToUint(a) >> 31) != 0u;
  if (neg && a != 0.0 && !isinf(a) && !bint) return rlx_nan();
  float m = abs(a); float r;
  if (m == 0.0) r = b > 0.0 ? 0.0 : rlx_inf();
  else if (isinf(m)) r = b > 0.0 ? rlx_inf() : 0.0;
  else {
    int e; float fm = frexp(m, e);
    double t = double(b) * double(e) + double(b * log2(fm));
    double n = floor(t); float f = float(t - n);
    if (n > 130.0LF) r = rlx_inf(); else if (n < -160.0LF) r = 0.0;
    else { int ni = int(n); r = ni < -120 ? ldexp(ldexp(exp2(f), ni + 60), -60) : ldexp(exp2(f), ni); }
  }
  return neg && odd ? -r : r;
}
"""


def load(dt: DType, b: str, a: str) -> str:
    if dt is DType.I64:  # two little-endian words
        return f"packInt2x32(ivec2(ldi({b}, {a}), ldi({b}, ({a}) + 4u)))"
    return {DType.F32: "ldf", DType.I32: "ldi", DType.BOOL: "ldb"}[dt] + f"({b}, {a})"


_GLSL = DIALECTS["glsl"]
#: GLSL built-ins replaced by this module's helpers (:data:`HEADER`, :data:`WIDE`): ``exp``/``log``
#: with IEEE overflow, underflow and special values, ``tanh`` saturating, ``sin``/``cos`` with
#: Payne-Hanek reduction and ``pow`` with the reference's special cases (drivers' built-ins differ).
HELPERS = {"exp": "rlx_exp", "log": "rlx_log", "tanh": "rlx_tanh", "sin": "rlx_sin", "cos": "rlx_cos",
           "pow": "rlx_pow"}
#: ops allowed to produce i64 values (integer wrap-around matches the reference)
I64_OPS = frozenset({"add", "sub", "mul", "neg", "maximum", "minimum", "where", "cast"})


def _math(op: str, dt: DType) -> str:
    if op == "pow" and not dt.is_float:
        raise IRError("integer pow has no GLSL rule", fix="compute pow in f32")
    return HELPERS.get(op) or _GLSL.math(op, dt)


def _literal(v: float, dt: DType) -> str:
    s = _GLSL.literal(v, dt)  # GLSL has no inf/nan literals: bit-pattern helpers instead
    return {"inf": "rlx_inf()", "-inf": "-rlx_inf()", "nan": "rlx_nan()"}.get(s, s)


def _rule(op: str, args: Sequence[str], in_types: Sequence[DType], out: DType, attrs: dict) -> str | None:
    if op == "cast" and out is DType.BOOL and in_types[0] is DType.BOOL:
        return args[0]  # GLSL cannot compare a bool with 0
    return None


def _rule64(op: str, args: Sequence[str], in_types: Sequence[DType], out: DType, attrs: dict
            ) -> str | None:
    if out is DType.I64 and (op not in I64_OPS or (op == "cast" and in_types[0].is_float)):
        raise IRError(f"{op} with an i64 result has no GLSL rule here", fix="compute in i32/f32")
    return _rule(op, args, in_types, out, attrs)


#: The shared GLSL dialect with this backend's helpers: ``rlx_*`` math, inf/nan literals, integer
#: division as the reference defines it (``rlx_idiv``) and the bool->bool cast.
GLSL = dataclasses.replace(_GLSL, math=_math, literal=_literal, idiv="rlx_idiv({a}, {b})", rule=_rule)
#: :data:`GLSL` plus ``int64_t`` (GL_ARB_gpu_shader_int64) for i64 results, only for programs with
#: an i64 value; ops other than :data:`I64_OPS` (and float->i64 casts) are refused for i64.
GLSL64 = dataclasses.replace(GLSL, types={**_GLSL.types, DType.I64: "int64_t"}, rule=_rule64)


@lru_cache(maxsize=4096)
def elementwise(fl: GlslFlavour, program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str:
    """Meta: n, rank, out_off, 0, shape[rank], then per input: buf, off, strides[rank]."""
    nin = len(in_dtypes)
    i64 = DType.I64 in in_dtypes or out_dtype is DType.I64  # (any i64 value: the int64_t table)
    lines, res, rdt = render_program(program, [f"x{k}" for k in range(nin)], in_dtypes,
                                     GLSL64 if i64 else GLSL)
    if rdt is not out_dtype:
        raise IRError(f"program yields {rdt}, the node {out_dtype}", fix="check the fused program")
    ot = TYPES[out_dtype]
    wide = (DType.I64 in in_dtypes or out_dtype is DType.I64
            or any(re.search(r"rlx_(sin|cos|pow)\(", ln) for ln in lines))
    src = [header(fl, extra=WIDE if wide else ""), f"{ot} value_at(uint i) {{",
           "  int B = pc.base; int rank = M[B + 1];"]
    src += [f"  int e{k} = 0; int p{k} = B + 4 + rank + {k} * (rank + 2);" for k in range(nin)]
    src += ["  uint rem = i;", "  for (int d = rank - 1; d >= 0; --d) {",
            "    uint s = uint(M[B + 4 + d]); int c = int(rem % s); rem /= s;"]
    src += [f"    e{k} += c * M[p{k} + 2 + d];" for k in range(nin)]
    src += ["  }"]
    for k, dt in enumerate(in_dtypes):
        addr = f"uint(M[p{k} + 1]) + uint(e{k}) * {ESIZE[dt]}u"
        src.append(f"  {TYPES[dt]} x{k} = {load(dt, f'M[p{k}]', addr)};")
    src += ["  " + ln for ln in lines] + [f"  return {res};", "}", "void main() {"]
    src += ["  uint n = uint(M[pc.base]); uint o = uint(M[pc.base + 2]) >> 2;",
            f"  uint step = gl_NumWorkGroups.x * {WG}u;"]
    if out_dtype is DType.BOOL:
        src += ["  for (uint t = gl_GlobalInvocationID.x; t < (n + 3u) / 4u; t += step) {",
                "    uint w = 0u;",
                "    for (uint k = 0u; k < 4u; ++k) { uint i = 4u * t + k;",
                "      if (i < n && value_at(i)) w |= 1u << (8u * k); }",
                "    A[o + t] = w;", "  }", "}"]
    elif out_dtype is DType.I64:
        src += ["  for (uint i = gl_GlobalInvocationID.x; i < n; i += step) {",
                "    ivec2 v = unpackInt2x32(value_at(i));",
                "    A[o + 2u * i] = uint(v.x); A[o + 2u * i + 1u] = uint(v.y);",
                "  }", "}"]
    else:
        st = "floatBitsToUint(v)" if out_dtype is DType.F32 else "uint(v)"
        src += ["  for (uint i = gl_GlobalInvocationID.x; i < n; i += step) {",
                f"    {ot} v = value_at(i); A[o + i] = {st};", "  }", "}"]
    return "\n".join(src) + "\n"


@cache
def copy32(fl: GlslFlavour) -> str:
    """Strided 4-byte copy. Meta: n, rank, in_buf, in_off, out_off, in_base_elems, shape[rank],
    istride[rank], ostride[rank] (strides in elements, may be negative)."""
    return header(fl) + """
void main() {
  int B = pc.base; uint n = uint(M[B]); int rank = M[B + 1];
  int ib = M[B + 2]; uint io = uint(M[B + 3]) >> 2; uint oo = uint(M[B + 4]) >> 2;
  for (uint i = gl_GlobalInvocationID.x; i < n; i += gl_NumWorkGroups.x * 64u) {
    uint rem = i; int ie = M[B + 5]; int oe = 0;
    for (int d = rank - 1; d >= 0; --d) {
      uint s = uint(M[B + 6 + d]); int c = int(rem % s); rem /= s;
      ie += c * M[B + 6 + rank + d]; oe += c * M[B + 6 + 2 * rank + d];
    }
    A[oo + uint(oe)] = ib == 0 ? A[io + uint(ie)] : W[io + uint(ie)];
  }
}
"""


@cache
def fill32(fl: GlslFlavour) -> str:
    """Meta: n, out_off, bits."""
    return header(fl) + """
void main() {
  uint n = uint(M[pc.base]); uint o = uint(M[pc.base + 1]) >> 2; uint v = uint(M[pc.base + 2]);
  for (uint i = gl_GlobalInvocationID.x; i < n; i += gl_NumWorkGroups.x * 64u) A[o + i] = v;
}
"""


#: Every matmul shader's prologue: sizes, operand bases/offsets and the batch-broadcast offsets
#: (ae, be) of this workgroup's batch index, decoded from the metadata words at pc.base.
_MATMUL_META = """  int B = pc.base; int Mr = M[B], N = M[B + 1], K = M[B + 2];
  int ab = M[B + 3], bb = M[B + 5]; uint ao = uint(M[B + 4]), bo = uint(M[B + 6]), co = uint(M[B + 7]);
  int br = M[B + 8]; uint bi = gl_WorkGroupID.z; uint rem = bi; int ae = 0, be = 0;
  for (int d = br - 1; d >= 0; --d) {
    uint s = uint(M[B + 9 + d]); int c = int(rem % s); rem /= s;
    ae += c * M[B + 9 + br + d]; be += c * M[B + 9 + 2 * br + d];
  }
"""


@cache
def matmul(fl: GlslFlavour, dt: DType) -> str:
    """Tiled (16x16 shared memory) batched matmul. Meta: M, N, K, a_buf, a_off, b_buf, b_off,
    c_off, brank, bshape[brank], astride[brank], bstride[brank] (batch strides in elements)."""
    t = TYPES[dt]
    ld = "ldf" if dt is DType.F32 else "ldi"
    st = "floatBitsToUint(acc)" if dt is DType.F32 else "uint(acc)"
    return header(fl, 16, 16) + f"""
shared {t} As[16][16];
shared {t} Bs[16][16];
void main() {{
{_MATMUL_META}  int row = int(gl_WorkGroupID.y) * 16 + int(gl_LocalInvocationID.y);
  int col = int(gl_WorkGroupID.x) * 16 + int(gl_LocalInvocationID.x);
  int ly = int(gl_LocalInvocationID.y), lx = int(gl_LocalInvocationID.x);
  {t} acc = {t}(0);
  for (int k0 = 0; k0 < K; k0 += 16) {{
    int ka = k0 + lx, kb = k0 + ly;
    As[ly][lx] = (row < Mr && ka < K) ? {ld}(ab, ao + uint(ae + row * K + ka) * 4u) : {t}(0);
    Bs[ly][lx] = (kb < K && col < N) ? {ld}(bb, bo + uint(be + kb * N + col) * 4u) : {t}(0);
    barrier();
    for (int k = 0; k < 16; ++k) acc += As[ly][k] * Bs[k][lx];
    barrier();
  }}
  if (row < Mr && col < N) A[(co >> 2) + bi * uint(Mr * N) + uint(row * N + col)] = {st};
}}
"""


@cache
def reduce(fl: GlslFlavour, op: str, dt: DType) -> str:
    """One invocation per output element. Meta: nout, nkept, nred, in_buf, in_off, out_off, R,
    kept (size, stride)*, red (size, stride)*."""
    t = TYPES[dt]
    ld = "ldf" if dt is DType.F32 else "ldi"
    st = "floatBitsToUint(acc)" if dt is DType.F32 else "uint(acc)"
    init = {"reduce_sum": f"{t}(0)", "reduce_mean": "0.0", "reduce_prod": f"{t}(1)"}.get(op, "v0")
    if op in ("reduce_sum", "reduce_mean") and dt is DType.F32:
        body = ("if (isinf(acc) || isinf(v) || isnan(v)) { acc += v; } else { precise float y = v - comp; "
                "precise float s = acc + y; comp = (s - acc) - y; acc = s; }")
    elif op in ("reduce_sum", "reduce_mean"):
        body = "acc += v;"
    elif op == "reduce_prod":
        body = "acc *= v;"
    else:
        cmp = ">" if op == "reduce_max" else "<"
        body = f"if (v {cmp} acc || v != v) acc = v;" if dt is DType.F32 else f"if (v {cmp} acc) acc = v;"
    fin = "acc = acc / float(R);" if op == "reduce_mean" else ""
    return header(fl) + f"""
void main() {{
  int B = pc.base; uint n = uint(M[B]); int nk = M[B + 1], nr = M[B + 2]; int ib = M[B + 3];
  uint io = uint(M[B + 4]); uint oo = uint(M[B + 5]) >> 2; int R = M[B + 6];
  for (uint i = gl_GlobalInvocationID.x; i < n; i += gl_NumWorkGroups.x * 64u) {{
    uint rem = i; int e = 0;
    for (int d = nk - 1; d >= 0; --d) {{
      uint s = uint(M[B + 7 + 2 * d]); int c = int(rem % s); rem /= s; e += c * M[B + 8 + 2 * d];
    }}
    int rb = B + 7 + 2 * nk;
    {t} v0 = R > 0 ? {ld}(ib, io + uint(e) * 4u) : {t}(0);
    {t} acc = {init}; precise float comp = 0.0;
    for (int r = 0; r < R; ++r) {{
      uint rr = uint(r); int f = e;
      for (int d = nr - 1; d >= 0; --d) {{
        uint s = uint(M[rb + 2 * d]); int c = int(rr % s); rr /= s; f += c * M[rb + 2 * d + 1];
      }}
      {t} v = {ld}(ib, io + uint(f) * 4u);
      {body}
    }}
    {fin}
    A[oo + i] = {st};
  }}
}}
"""


@cache
def rows(fl: GlslFlavour, op: str) -> str:
    """One invocation per row of ``cols`` contiguous f32. Meta: rows, cols, x_buf, x_off, out_off,
    eps bits, g_buf, g_off, b_buf, b_off."""
    if op == "layer_norm":
        body = """
    precise float mean = 0.0; precise float comp = 0.0;
    for (int j = 0; j < C; ++j) { float v = X(j);
      if (isinf(mean) || isinf(v) || isnan(v)) { mean += v; continue; }
      precise float y = v - comp; precise float s = mean + y; comp = (s - mean) - y; mean = s; }
    mean = mean / float(C);
    precise float var = 0.0; comp = 0.0;
    for (int j = 0; j < C; ++j) { float d = X(j) - mean;
      if (isinf(var) || isinf(d * d) || isnan(d)) { var += d * d; continue; }
      precise float y = d * d - comp; precise float s = var + y; comp = (s - var) - y; var = s; }
    var = var / float(C);
    float inv = 1.0 / sqrt(var + eps);
    for (int j = 0; j < C; ++j)
      A[oo + r * uint(C) + uint(j)] = floatBitsToUint((X(j) - mean) * inv * ldf(gb, go + uint(j) * 4u)
                                                      + ldf(bb, bo + uint(j) * 4u));"""
    else:
        final = ("(X(j) - mx) - rlx_log(s)" if op == "log_softmax" else "rlx_exp(X(j) - mx) / s")
        body = f"""
    float mx = -rlx_inf();
    for (int j = 0; j < C; ++j) {{ float v = X(j); if (v > mx || v != v) mx = v; }}
    if (isinf(mx) && mx < 0.0) mx = 0.0;
    precise float s = 0.0;
    for (int j = 0; j < C; ++j) s += rlx_exp(X(j) - mx);
    for (int j = 0; j < C; ++j) A[oo + r * uint(C) + uint(j)] = floatBitsToUint({final});"""
    return header(fl) + f"""
#define X(j) ldf(xb, xo + (r * uint(C) + uint(j)) * 4u)
void main() {{
  int B = pc.base; uint n = uint(M[B]); int C = M[B + 1]; int xb = M[B + 2]; uint xo = uint(M[B + 3]);
  uint oo = uint(M[B + 4]) >> 2; float eps = intBitsToFloat(M[B + 5]);
  int gb = M[B + 6]; uint go = uint(M[B + 7]); int bb = M[B + 8]; uint bo = uint(M[B + 9]);
  for (uint r = gl_GlobalInvocationID.x; r < n; r += gl_NumWorkGroups.x * 64u) {{{body}
  }}
}}
"""


@cache
def gather(fl: GlslFlavour, idx_esize: int) -> str:
    """Meta: n, nidx, inner, D, x_buf, x_off, i_buf, i_off, out_off (4-byte elements).

    Indices follow ONNX ([-D, D-1], negatives once from the end). One outside (only possible when
    computed on the device: the host checks inputs and constants) gives 0 and reads nothing: an
    unchecked index would read other tensors of the arena. An i64 index counts only if its high
    word is the sign extension of its low word (2**32 + 1 must not become 1)."""
    hi = "ldi(ib, a + 4u)" if idx_esize == 8 else "lo >> 31"
    return header(fl) + f"""
void main() {{
  int B = pc.base; uint n = uint(M[B]); uint ni = uint(M[B + 1]), inner = uint(M[B + 2]);
  int D = M[B + 3]; int xb = M[B + 4]; uint xo = uint(M[B + 5]) >> 2; int ib = M[B + 6];
  uint io = uint(M[B + 7]); uint oo = uint(M[B + 8]) >> 2;
  for (uint i = gl_GlobalInvocationID.x; i < n; i += gl_NumWorkGroups.x * 64u) {{
    uint k = i % inner; uint j = (i / inner) % ni; uint o = i / (inner * ni);
    uint a = io + j * {idx_esize}u; int lo = ldi(ib, a); int hi = {hi};
    int idx = lo; if (idx < 0) idx += D;
    bool ok = hi == (lo >> 31) && idx >= 0 && idx < D;
    uint src = xo + (o * uint(D) + uint(ok ? idx : 0)) * inner + k;
    A[oo + i] = !ok ? 0u : xb == 0 ? A[src] : W[src];
  }}
}}
"""


@cache
def copy8(fl: GlslFlavour) -> str:
    """Strided byte copy into a contiguous output, one invocation per output word. Meta as copy32
    (strides in bytes; the output strides are unused: it is contiguous)."""
    return header(fl) + """
void main() {
  int B = pc.base; uint n = uint(M[B]); int rank = M[B + 1];
  int ib = M[B + 2]; uint io = uint(M[B + 3]); uint oo = uint(M[B + 4]) >> 2;
  for (uint t = gl_GlobalInvocationID.x; t < (n + 3u) / 4u; t += gl_NumWorkGroups.x * 64u) {
    uint w = 0u;
    for (uint k = 0u; k < 4u; ++k) {
      uint i = 4u * t + k; if (i >= n) break;
      uint rem = i; int ie = M[B + 5];
      for (int d = rank - 1; d >= 0; --d) {
        uint s = uint(M[B + 6 + d]); int c = int(rem % s); rem /= s; ie += c * M[B + 6 + rank + d];
      }
      uint a = io + uint(ie);
      w |= ((rd(ib, a) >> ((a & 3u) * 8u)) & 0xffu) << (8u * k);
    }
    A[oo + t] = w;
  }
}
"""


@cache
def iota(fl: GlslFlavour, dt: DType) -> str:
    """Meta: n, inner, D, out_off."""
    store = {DType.F32: "A[o + i] = floatBitsToUint(float(v));", DType.I32: "A[o + i] = v;",
             DType.I64: "A[o + 2u * i] = v; A[o + 2u * i + 1u] = 0u;"}[dt]
    return header(fl) + f"""
void main() {{
  uint n = uint(M[pc.base]); uint inner = uint(M[pc.base + 1]), D = uint(M[pc.base + 2]);
  uint o = uint(M[pc.base + 3]) >> 2;
  for (uint i = gl_GlobalInvocationID.x; i < n; i += gl_NumWorkGroups.x * 64u) {{
    uint v = (i / inner) % D; {store}
  }}
}}
"""


@cache
def matmul_simple(fl: GlslFlavour, dt: DType) -> str:
    """Matmul without shared memory (one invocation per output element, 64 along N): what CPU
    implementations (lavapipe) run fastest, since workgroup barriers are costly there. Meta as
    :func:`matmul`."""
    t = TYPES[dt]
    ld = "ldf" if dt is DType.F32 else "ldi"
    st = "floatBitsToUint(acc)" if dt is DType.F32 else "uint(acc)"
    cv = "uintBitsToFloat" if dt is DType.F32 else "int"
    return header(fl) + f"""
#define LOOP(BA, BB) {{ for (int k = 0; k < K; ++k) {{ {t} bv = {cv}(BB[pb + uint(k * N)]); \\
  acc += {cv}(BA[pa + uint(k)]) * bv; acc1 += {cv}(BA[pa + uint(K + k)]) * bv; \\
  acc2 += {cv}(BA[pa + uint(2 * K + k)]) * bv; acc3 += {cv}(BA[pa + uint(3 * K + k)]) * bv; }} }}
void main() {{
{_MATMUL_META}  int row = int(gl_WorkGroupID.y) * 4;  // four rows per invocation: each B load feeds four FMAs
  int col = int(gl_GlobalInvocationID.x);
  if (col >= N) return;
  // rows past M read row M-1 again (in bounds) and are not stored
  uint pa = (ao >> 2) + uint(ae + min(row, Mr - 4 < 0 ? 0 : Mr - 4) * K), pb = (bo >> 2) + uint(be + col);
  int r0 = min(row, Mr - 4 < 0 ? 0 : Mr - 4);
  {t} acc = {t}(0), acc1 = {t}(0), acc2 = {t}(0), acc3 = {t}(0);
  if (Mr >= 4) {{
    if (ab == 0 && bb == 0) LOOP(A, A) else if (ab == 0) LOOP(A, W)
    else if (bb == 0) LOOP(W, A) else LOOP(W, W)
  }} else {{
    for (int k = 0; k < K; ++k) {{
      {t} bv = {ld}(bb, (pb + uint(k * N)) * 4u);
      acc += {ld}(ab, (pa + uint(k)) * 4u) * bv;
      if (Mr > 1) acc1 += {ld}(ab, (pa + uint(K + k)) * 4u) * bv;
      if (Mr > 2) acc2 += {ld}(ab, (pa + uint(2 * K + k)) * 4u) * bv;
    }}
  }}
  uint oc = (co >> 2) + bi * uint(Mr * N) + uint(col);
  // the last block is shifted to stay in bounds: it recomputes some rows (same values)
  A[oc + uint(r0 * N)] = {st.replace("acc", "acc")};
  if (r0 + 1 < Mr) A[oc + uint((r0 + 1) * N)] = {st.replace("acc", "acc1")};
  if (r0 + 2 < Mr) A[oc + uint((r0 + 2) * N)] = {st.replace("acc", "acc2")};
  if (r0 + 3 < Mr) A[oc + uint((r0 + 3) * N)] = {st.replace("acc", "acc3")};
}}
"""


@cache
def linear(fl: GlslFlavour) -> str:
    """y[r, n] = sum_k x[r, k] * w[n, k] + b[n]. Meta: R, N, K, x_buf, x_off, w_buf, w_off, b_buf,
    b_off, out_off, wt (1: w is stored transposed, (K, N), as the program pre-transposes constant
    weights so that neighbouring invocations read neighbouring words)."""
    return header(fl) + """
void main() {
  int B = pc.base; int R = M[B], N = M[B + 1], K = M[B + 2];
  int xb = M[B + 3]; uint xo = uint(M[B + 4]) >> 2; int wb = M[B + 5]; uint wo = uint(M[B + 6]) >> 2;
  int bb = M[B + 7]; uint bo = uint(M[B + 8]); uint oo = uint(M[B + 9]) >> 2; int wt = M[B + 10];
  int row = int(gl_WorkGroupID.y); int col = int(gl_GlobalInvocationID.x);
  if (col >= N) return;
  uint px = xo + uint(row * K);
  float acc = 0.0;
  if (wt == 1 && xb == 0 && wb == 1) {
    uint pw = wo + uint(col);
    for (int k = 0; k < K; ++k)
      acc += uintBitsToFloat(A[px + uint(k)]) * uintBitsToFloat(W[pw + uint(k * N)]);
  } else if (wt == 1) {
    for (int k = 0; k < K; ++k) acc += ldf(xb, (px + uint(k)) * 4u) * ldf(wb, (wo + uint(k * N + col)) * 4u);
  } else {
    for (int k = 0; k < K; ++k) acc += ldf(xb, (px + uint(k)) * 4u) * ldf(wb, (wo + uint(col * K + k)) * 4u);
  }
  A[oo + uint(row * N + col)] = floatBitsToUint(acc + ldf(bb, bo + uint(col) * 4u));
}
"""


@cache
def scan(fl: GlslFlavour, dt: DType) -> str:
    """cumsum, one invocation per line (sequential, as the reference). Meta: nlines, D, inner, x_buf,
    x_off, out_off, exclusive, reverse."""
    t = TYPES[dt]
    ld = "ldf" if dt is DType.F32 else "ldi"
    st = "floatBitsToUint" if dt is DType.F32 else "uint"
    return header(fl) + f"""
void main() {{
  int B = pc.base; uint n = uint(M[B]); int D = M[B + 1]; uint inner = uint(M[B + 2]);
  int xb = M[B + 3]; uint xo = uint(M[B + 4]); uint oo = uint(M[B + 5]) >> 2;
  bool excl = M[B + 6] != 0, rev = M[B + 7] != 0;
  for (uint l = gl_GlobalInvocationID.x; l < n; l += gl_NumWorkGroups.x * 64u) {{
    uint base = (l / inner) * uint(D) * inner + l % inner;
    {t} s = {t}(0);
    for (int jj = 0; jj < D; ++jj) {{
      uint e = base + uint(rev ? D - 1 - jj : jj) * inner;
      {t} v = {ld}(xb, xo + e * 4u);
      s += v;
      A[oo + e] = {st}(excl ? s - v : s);
    }}
  }}
}}
"""


@cache
def argext(fl: GlslFlavour, op: str, dt: DType) -> str:
    """argmax/argmin along one axis (first extreme; the first NaN wins), i64 result. Meta: n, D,
    inner, x_buf, x_off, out_off."""
    t = TYPES[dt]
    ld = "ldf" if dt is DType.F32 else "ldi"
    cmp = ">" if op == "argmax" else "<"
    nan = "if (v != v) { bi = j; break; }" if dt is DType.F32 else ""
    return header(fl) + f"""
void main() {{
  int B = pc.base; uint n = uint(M[B]); int D = M[B + 1]; uint inner = uint(M[B + 2]);
  int xb = M[B + 3]; uint xo = uint(M[B + 4]); uint oo = uint(M[B + 5]) >> 2;
  for (uint i = gl_GlobalInvocationID.x; i < n; i += gl_NumWorkGroups.x * 64u) {{
    uint base = (i / inner) * uint(D) * inner + i % inner;
    {t} best = {ld}(xb, xo + base * 4u); int bi = 0;
    if (best == best) {{
      for (int j = 1; j < D; ++j) {{
        {t} v = {ld}(xb, xo + (base + uint(j) * inner) * 4u);
        {nan}
        if (v {cmp} best) {{ best = v; bi = j; }}
      }}
    }}
    A[oo + 2u * i] = uint(bi); A[oo + 2u * i + 1u] = 0u;
  }}
}}
"""


@cache
def conv2d(fl: GlslFlavour, dt: DType) -> str:
    """Direct 2-D cross-correlation (NCHW x OIHW, strides, pads, dilations, groups), one invocation per
    output element. Meta: total, C, H, W, O, Cg, KH, KW, OH, OW, sh, sw, pt, pl, dh, dw, Og, x_buf,
    x_off, w_buf, w_off, out_off."""
    t = TYPES[dt]
    ld = "ldf" if dt is DType.F32 else "ldi"
    st = "floatBitsToUint" if dt is DType.F32 else "uint"
    return header(fl) + f"""
void main() {{
  int B = pc.base; uint n = uint(M[B]);
  int C = M[B + 1], H = M[B + 2], Wd = M[B + 3], O = M[B + 4], Cg = M[B + 5], KH = M[B + 6], KW = M[B + 7];
  int OH = M[B + 8], OW = M[B + 9], sh = M[B + 10], sw = M[B + 11], pt = M[B + 12], pl = M[B + 13];
  int dh = M[B + 14], dw = M[B + 15], Og = M[B + 16];
  int xb = M[B + 17]; uint xo = uint(M[B + 18]); int wb = M[B + 19]; uint wo = uint(M[B + 20]);
  uint oo = uint(M[B + 21]) >> 2;
  for (uint i = gl_GlobalInvocationID.x; i < n; i += gl_NumWorkGroups.x * 64u) {{
    int ow = int(i % uint(OW)); int oh = int((i / uint(OW)) % uint(OH));
    int o = int((i / uint(OW * OH)) % uint(O)); int b = int(i / uint(OW * OH * O));
    int g = o / Og;
    {t} acc = {t}(0);
    for (int c = 0; c < Cg; ++c) {{
      int ci = g * Cg + c;
      for (int kh = 0; kh < KH; ++kh) {{
        int ih = oh * sh - pt + kh * dh;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; ++kw) {{
          int iw = ow * sw - pl + kw * dw;
          if (iw < 0 || iw >= Wd) continue;
          acc += {ld}(xb, xo + uint(((b * C + ci) * H + ih) * Wd + iw) * 4u)
               * {ld}(wb, wo + uint(((o * Cg + c) * KH + kh) * KW + kw) * 4u);
        }}
      }}
    }}
    A[oo + i] = {st}(acc);
  }}
}}
"""


@cache
def matmul_4x4(fl: GlslFlavour, dt: DType, bufs: str = "AA") -> str:
    """Untiled matmul computing a 4x4 block per invocation (M and N multiples of 4): sixteen FMAs per
    eight loads, for CPU implementations. Meta as :func:`matmul`."""
    t = TYPES[dt]
    v = "vec4" if dt is DType.F32 else "ivec4"
    cv = "uintBitsToFloat" if dt is DType.F32 else "ivec4"
    st = "floatBitsToUint" if dt is DType.F32 else "uvec4"
    return header(fl) + f"""
#define LOOP(BA, BB) {{ for (int k = 0; k < K; ++k) {{ \\
  uint q = pb + uint(k * N); {v} bv = {cv}(uvec4(BB[q], BB[q + 1u], BB[q + 2u], BB[q + 3u])); \\
  uint p = pa + uint(k); \\
  c0 += {t}({cv}(BA[p])) * bv; c1 += {t}({cv}(BA[p + uint(K)])) * bv; \\
  c2 += {t}({cv}(BA[p + uint(2 * K)])) * bv; c3 += {t}({cv}(BA[p + uint(3 * K)])) * bv; }} }}
void main() {{
{_MATMUL_META}  int row = int(gl_WorkGroupID.y) * 4; int col = int(gl_GlobalInvocationID.x) * 4;
  if (col >= N) return;
  uint pa = (ao >> 2) + uint(ae + row * K), pb = (bo >> 2) + uint(be + col);
  {v} c0 = {v}(0), c1 = {v}(0), c2 = {v}(0), c3 = {v}(0);
  LOOP({bufs[0]}, {bufs[1]})
  uint oc = (co >> 2) + bi * uint(Mr * N) + uint(row * N + col);
  uvec4 u0 = {st}(c0), u1 = {st}(c1), u2 = {st}(c2), u3 = {st}(c3);
  for (int j = 0; j < 4; ++j) {{
    A[oc + uint(j)] = u0[j]; A[oc + uint(N + j)] = u1[j];
    A[oc + uint(2 * N + j)] = u2[j]; A[oc + uint(3 * N + j)] = u3[j];
  }}
}}
"""


#: GPU GEMM tiles (BM, BN, BK, TM, TN): a workgroup of (BN/TN) x (BM/TM) invocations computes a BM x BN
#: block of C, each invocation a TM x TN block held in registers, K stepping BK at a time through shared
#: memory. "large" amortises the shared-memory traffic best (8x8 per invocation); "small" keeps enough
#: workgroups in flight for the thin GEMMs of transformer layers (4096 x 384 is 384 small tiles but
#: only 96 large ones); "medium" sits between (not picked by "auto": a setting to measure).
GEMM_TILES: dict[str, tuple[int, int, int, int, int]] = {"large": (128, 128, 8, 8, 8),
                                                         "medium": (128, 64, 8, 8, 4),
                                                         "small": (64, 64, 16, 4, 4)}


@cache
def matmul_tiled(fl: GlslFlavour, dt: DType, bufs: str = "AA", tile: str = "small", bias: bool = False,
                 bt: bool = False, split: bool = False, res: bool = False,
                 epi: tuple[str, int, int] | None = None) -> str:
    """Register-blocked, shared-memory tiled (batched) matmul for GPUs (:data:`GEMM_TILES`). ``bufs``
    bakes each operand's buffer into the shader (the hot loop reads ``A[]``/``W[]`` directly, not
    through :func:`rd`'s switch); ``bt``: B is stored transposed, (N, K) (a linear's weight);
    ``bias``: adds the f32 row vector whose (buf, byte offset) follow the batch words. ``split``
    (with ``bias``, unbatched): C's (row, col) is stored at ``(row / S, row % S, col / D, col % D)``
    with the 4 element strides that follow the bias words after S and D (a head split + transpose
    folded into the store); ``res`` (with ``bias``, unbatched): adds the f32 (M, N) residual whose
    (buf, byte offset) follow the bias words (a residual add folded into the store); ``epi`` =
    (fused elementwise program, its input count, the input that is C) applies an f32 program to
    each stored value, its other inputs f32 scalars whose (buf, byte offset) follow the bias words.
    Meta as :func:`matmul`.

    Shared memory holds 4-vectors: an invocation owns TM/4 x TN/4 blocks of 4x4, block (g, h) at rows
    ``(g*TY + ty)*4 ..`` and columns ``(h*TX + tx)*4 ..``, so one K step reads TM/4 + TN/4 vectors
    (A's are broadcast across a warp, B's consecutive: no bank conflicts) for TM*TN FMAs. The next K
    step's operands are fetched into registers while this one is multiplied."""
    bm, bn, bk, tm, tn = GEMM_TILES[tile]
    tx, ty = bn // tn, bm // tm
    nt = tx * ty
    la, lb = bm * bk // nt, bk * bn // nt
    t = TYPES[dt]
    v = "vec4" if dt is DType.F32 else "ivec4"
    cv = "uintBitsToFloat" if dt is DType.F32 else "int"
    st = "floatBitsToUint" if dt is DType.F32 else "uint"
    un = "[[unroll]] " if fl is VULKAN else ""  # GL_EXT_control_flow_attributes: keeps acc in registers
    ext = "#extension GL_EXT_control_flow_attributes : require\n" if fl is VULKAN else ""
    ba, bb_ = bufs[0], bufs[1]
    # B tile element e: (kk, n) with consecutive invocations on consecutive addresses of B
    bpos = ("int kk = e % BK, n = e / BK;", "uint(c * K + k)") if bt else \
        ("int n = e % BN, kk = e / BN;", "uint(k * N + c)")
    badd = ("  int bw = B + 9 + 3 * br; int bsb = M[bw]; uint bso = uint(M[bw + 1]);\n" if bias else "")
    bval = " + ldf(bsb, bso + uint(c) * 4u)" if bias else ""
    if split:
        badd += ("  int PS = M[bw + 2], PD = M[bw + 3], T0 = M[bw + 4], T1 = M[bw + 5], T2 = M[bw + 6], "
                 "T3 = M[bw + 7];\n")
    if res:
        badd += "  int rsb = M[bw + 2]; uint rso = uint(M[bw + 3]);\n"
        bval += " + ldf(rsb, rso + uint(row * N + c) * 4u)"
    efn = ""
    if epi is not None:
        prog, nin, k0 = epi
        lines, out, rdt = render_program(prog, [f"x{k}" for k in range(nin)], (DType.F32,) * nin, GLSL)
        if rdt is not DType.F32:
            raise IRError(f"linear epilogue program yields {rdt}, not f32", fix="do not fold this program")
        loads = [f"  float x{k} = ldf(M[eb + {2 * j}], uint(M[eb + {2 * j + 1}]));"
                 for j, k in enumerate(k for k in range(nin) if k != k0)]
        efn = "\n".join([f"float epi_f(float x{k0}, int eb) {{", *loads, *("  " + ln for ln in lines),
                         f"  return {out};", "}"]) + "\n"
        bval = ""  # the bias goes inside the program's input
    store = ("epi_f(acc[g * 4 + r][h][q] + ldf(bsb, bso + uint(c) * 4u), bw + 2)" if epi is not None
             else f"acc[g * 4 + r][h][q]{bval}")
    cidx = ("uint(row / PS * T0 + row % PS * T1 + c / PD * T2 + c % PD * T3)" if split
            else "uint(row * N + c)")
    return header(fl, tx, ty, ext) + efn + f"""
const int BM = {bm}, BN = {bn}, BK = {bk}, TM = {tm}, TN = {tn}, TX = {tx}, TY = {ty}, NT = {nt};
const int GM = TM / 4, GN = TN / 4;
shared {v} As[BK][BM / 4 + 1];  // padded by a vector: the transposing stores spread over the banks
shared {v} Bs[BK][BN / 4 + 1];
void main() {{
{_MATMUL_META}{badd}  int lx = int(gl_LocalInvocationID.x), ly = int(gl_LocalInvocationID.y);
  int tid = ly * TX + lx;
  int row0 = int(gl_WorkGroupID.y) * BM, col0 = int(gl_WorkGroupID.x) * BN;
  uint pa = (ao >> 2) + uint(ae), pb = (bo >> 2) + uint(be);
  {v} acc[TM][GN];
  {un}for (int i = 0; i < TM; ++i) {un}for (int h = 0; h < GN; ++h) acc[i][h] = {v}(0);
  {t} ra[{la}], rb[{lb}];
  // A tile element e: (m, kk) = (e / BK, e % BK): consecutive invocations read along a row of A
#define FETCH(K0) \\
  {un}for (int i = 0; i < {la}; ++i) {{ int e = tid + i * NT; int r = row0 + e / BK, k = (K0) + e % BK; \\
    ra[i] = (r < Mr && k < K) ? {cv}({ba}[pa + uint(r * K + k)]) : {t}(0); }} \\
  {un}for (int i = 0; i < {lb}; ++i) {{ int e = tid + i * NT; {bpos[0]} int c = col0 + n, k = (K0) + kk; \\
    rb[i] = (c < N && k < K) ? {cv}({bb_}[pb + {bpos[1]}]) : {t}(0); }}
  FETCH(0)
  for (int k0 = 0; k0 < K; k0 += BK) {{
    {un}for (int i = 0; i < {la}; ++i) {{
      int e = tid + i * NT; int m = e / BK; As[e % BK][m >> 2][m & 3] = ra[i];
    }}
    {un}for (int i = 0; i < {lb}; ++i) {{ int e = tid + i * NT; {bpos[0]} Bs[kk][n >> 2][n & 3] = rb[i]; }}
    barrier();
    if (k0 + BK < K) {{ FETCH(k0 + BK) }}
    {un}for (int kk = 0; kk < BK; ++kk) {{
      {v} a[GM], b[GN];
      {un}for (int g = 0; g < GM; ++g) a[g] = As[kk][g * TY + ly];
      {un}for (int h = 0; h < GN; ++h) b[h] = Bs[kk][h * TX + lx];
      {un}for (int g = 0; g < GM; ++g) {un}for (int r = 0; r < 4; ++r)
        {un}for (int h = 0; h < GN; ++h) acc[g * 4 + r][h] += a[g][r] * b[h];
    }}
    barrier();
  }}
  uint oc = (co >> 2) + bi * uint(Mr * N);
  {un}for (int g = 0; g < GM; ++g) {un}for (int r = 0; r < 4; ++r) {{
    int row = (g * TY + ly) * 4 + row0 + r;
    if (row < Mr) {{
      {un}for (int h = 0; h < GN; ++h) {un}for (int q = 0; q < 4; ++q) {{
        int c = col0 + (h * TX + lx) * 4 + q;
        if (c < N) A[oc + {cidx}] = {st}({store});
      }}
    }}
  }}
}}
"""


#: invocations per row of :func:`rows_wg` (one workgroup per row)
ROW_WG = 128


#: Workgroup reductions over :data:`ROW_WG` invocations (every invocation calls them, in uniform control
#: flow): the total, the maximum and the minimum of one value per invocation; NaN wins max/min, as in
#: the sequential kernels.
_WG_REDUCE = f"""const int RW = {ROW_WG};
shared float red[RW];
int lid;
float wg_sum(float v) {{
  red[lid] = v; barrier();
  for (int s = RW / 2; s > 0; s >>= 1) {{ if (lid < s) red[lid] = red[lid] + red[lid + s]; barrier(); }}
  float t = red[0]; barrier(); return t;
}}
float wg_max(float v) {{
  red[lid] = v; barrier();
  for (int s = RW / 2; s > 0; s >>= 1) {{
    if (lid < s) {{
      float a = red[lid], b = red[lid + s]; red[lid] = (a != a || b != b) ? rlx_nan() : max(a, b);
    }}
    barrier();
  }}
  float t = red[0]; barrier(); return t;
}}
float wg_min(float v) {{
  red[lid] = v; barrier();
  for (int s = RW / 2; s > 0; s >>= 1) {{
    if (lid < s) {{
      float a = red[lid], b = red[lid + s]; red[lid] = (a != a || b != b) ? rlx_nan() : min(a, b);
    }}
    barrier();
  }}
  float t = red[0]; barrier(); return t;
}}
"""


@cache
def reduce_wg(fl: GlslFlavour, op: str) -> str:
    """f32 reduce_sum / reduce_mean / reduce_max / reduce_min over the innermost ``R`` contiguous
    elements, one workgroup of :data:`ROW_WG` invocations per output (GPUs: :func:`reduce`'s
    invocation per output reads its run of R words alone). Sums are compensated per invocation, then
    combined by a tree. Meta: nout, R, in_buf, in_off, out_off (R > 0)."""
    if op in ("reduce_sum", "reduce_mean"):
        body = """
    precise float acc = 0.0; precise float comp = 0.0;
    for (int j = lid; j < R; j += RW) { float v = X(j);
      if (isinf(acc) || isinf(v) || isnan(v)) { acc += v; continue; }
      precise float y = v - comp; precise float s = acc + y; comp = (s - acc) - y; acc = s; }
    float t = wg_sum(acc);""" + (" t = t / float(R);" if op == "reduce_mean" else "")
    else:
        cmp, fn = (">", "wg_max") if op == "reduce_max" else ("<", "wg_min")
        body = f"""
    float acc = X(0);
    for (int j = lid; j < R; j += RW) {{ float v = X(j); if (v {cmp} acc || v != v) acc = v; }}
    float t = {fn}(acc);"""
    return header(fl, ROW_WG) + _WG_REDUCE + f"""
#define X(j) ldf(xb, xo + (r * uint(R) + uint(j)) * 4u)
void main() {{
  int B = pc.base; uint n = uint(M[B]); int R = M[B + 1]; int xb = M[B + 2]; uint xo = uint(M[B + 3]);
  uint oo = uint(M[B + 4]) >> 2;
  lid = int(gl_LocalInvocationID.x);
  for (uint r = gl_WorkGroupID.x; r < n; r += gl_NumWorkGroups.x) {{{body}
    if (lid == 0) A[oo + r] = floatBitsToUint(t);
  }}
}}
"""


@cache
def rows_wg(fl: GlslFlavour, op: str) -> str:
    """softmax / log_softmax / layer_norm with one workgroup of :data:`ROW_WG` invocations per row
    (GPUs: a row per invocation leaves most of the device idle and reads rows uncoalesced). Each
    invocation reduces a strided part of the row (compensated, as :func:`rows`), then a tree in
    shared memory combines the parts; NaN and infinities propagate as in :func:`rows`. Meta as
    :func:`rows`."""
    if op == "layer_norm":
        body = """
    precise float mean = 0.0; precise float comp = 0.0;
    for (int j = lid; j < C; j += RW) { float v = X(j);
      if (isinf(mean) || isinf(v) || isnan(v)) { mean += v; continue; }
      precise float y = v - comp; precise float s = mean + y; comp = (s - mean) - y; mean = s; }
    mean = wg_sum(mean) / float(C);
    precise float var = 0.0; comp = 0.0;
    for (int j = lid; j < C; j += RW) { float d = X(j) - mean;
      if (isinf(var) || isinf(d * d) || isnan(d)) { var += d * d; continue; }
      precise float y = d * d - comp; precise float s = var + y; comp = (s - var) - y; var = s; }
    var = wg_sum(var) / float(C);
    float inv = 1.0 / sqrt(var + eps);
    for (int j = lid; j < C; j += RW)
      A[oo + r * uint(C) + uint(j)] = floatBitsToUint((X(j) - mean) * inv * ldf(gb, go + uint(j) * 4u)
                                                      + ldf(bb, bo + uint(j) * 4u));"""
    else:
        final = ("(X(j) - mx) - rlx_log(s)" if op == "log_softmax" else "rlx_exp(X(j) - mx) / s")
        body = f"""
    float mx = -rlx_inf();
    for (int j = lid; j < C; j += RW) {{ float v = X(j); if (v > mx || v != v) mx = v; }}
    mx = wg_max(mx);
    if (isinf(mx) && mx < 0.0) mx = 0.0;
    precise float s = 0.0;
    for (int j = lid; j < C; j += RW) s += rlx_exp(X(j) - mx);
    s = wg_sum(s);
    for (int j = lid; j < C; j += RW) A[oo + r * uint(C) + uint(j)] = floatBitsToUint({final});"""
    return header(fl, ROW_WG) + _WG_REDUCE + f"""
#define X(j) ldf(xb, xo + (r * uint(C) + uint(j)) * 4u)
void main() {{
  int B = pc.base; uint n = uint(M[B]); int C = M[B + 1]; int xb = M[B + 2]; uint xo = uint(M[B + 3]);
  uint oo = uint(M[B + 4]) >> 2; float eps = intBitsToFloat(M[B + 5]);
  int gb = M[B + 6]; uint go = uint(M[B + 7]); int bb = M[B + 8]; uint bo = uint(M[B + 9]);
  lid = int(gl_LocalInvocationID.x);
  for (uint r = gl_WorkGroupID.x; r < n; r += gl_NumWorkGroups.x) {{{body}
  }}
}}
"""


#: invocations (query rows) per workgroup of :func:`attention_wg`, and keys per shared-memory chunk
ATT_QB, ATT_KB = 64, 32
#: attention mask kinds as :func:`attention_wg` numbers them (meta word 12)
ATT_MASKS = {"none": 0, "causal": 1, "sliding_window": 2, "bias": 3, "padding": 4}
#: how :func:`attention_wg` reads a padding mask element (meta word 16), by dtype
ATT_MASK_DTYPES = {DType.F32: 0, DType.I32: 1, DType.I64: 2, DType.BOOL: 3}
#: the largest head dim :func:`attention_wg` takes (q and the output row live in registers)
ATT_MAX_D = 128


@cache
def attention_wg(fl: GlslFlavour, d: int, dv: int) -> str:
    """Fused f32 attention for GPUs: ``softmax(q k^T * scale + mask) v`` with the scores never in
    global memory. A workgroup of :data:`ATT_QB` invocations takes ATT_QB query rows of one (batch,
    head), an invocation one row (q in registers); K and V pass through shared memory
    :data:`ATT_KB` keys at a time, and each chunk's scores update a running max / sum / output
    (online softmax: one rescale per chunk). Masked scores are ``MASKED_SCORE`` (-1e9) as in the
    reference, so a fully masked row attends uniformly; NaN and infinities propagate as in the
    decomposition. Every operand is addressed by (batch, head, row, column) strides, in elements.

    Meta: Sq, Sk, NB, H, q (buf, off), k (buf, off), v (buf, off), out off, scale (f32 bits), mask
    kind (:data:`ATT_MASKS`), window, mask (buf, off), mask dtype (:data:`ATT_MASK_DTYPES`), the
    bias's 4 strides, then q, k, v and out strides (4 each)."""
    un = "[[unroll]] " if fl is VULKAN else ""
    ext = "#extension GL_EXT_control_flow_attributes : require\n" if fl is VULKAN else ""
    return header(fl, ATT_QB, 1, ext) + f"""
const int QB = {ATT_QB}, KB = {ATT_KB}, D = {d}, DV = {dv};
shared float Ks[KB][D];
shared float Vs[KB][DV];
void main() {{
  int B = pc.base;
  int Sq = M[B], Sk = M[B + 1], NB = M[B + 2], H = M[B + 3];
  int qb = M[B + 4]; uint qo = uint(M[B + 5]); int kb = M[B + 6]; uint ko = uint(M[B + 7]);
  int vb = M[B + 8]; uint vo = uint(M[B + 9]); uint oo = uint(M[B + 10]) >> 2;
  float scale = intBitsToFloat(M[B + 11]); int kind = M[B + 12]; int win = M[B + 13];
  int mb = M[B + 14]; uint mo = uint(M[B + 15]); int mdt = M[B + 16];
  int bs0 = M[B + 17], bs1 = M[B + 18], bs2 = M[B + 19], bs3 = M[B + 20];
  int qs0 = M[B + 21], qs1 = M[B + 22], qs2 = M[B + 23], qs3 = M[B + 24];
  int ks0 = M[B + 25], ks1 = M[B + 26], ks2 = M[B + 27], ks3 = M[B + 28];
  int vs0 = M[B + 29], vs1 = M[B + 30], vs2 = M[B + 31], vs3 = M[B + 32];
  int os0 = M[B + 33], os1 = M[B + 34], os2 = M[B + 35], os3 = M[B + 36];
  int lid = int(gl_LocalInvocationID.x);
  for (int bh = int(gl_WorkGroupID.y); bh < NB * H; bh += int(gl_NumWorkGroups.y)) {{
    int b = bh / H, h = bh % H;
    for (int q0 = int(gl_WorkGroupID.x) * QB; q0 < Sq; q0 += int(gl_NumWorkGroups.x) * QB) {{
      int i = q0 + lid;
      bool live = i < Sq;
      float qv[D], acc[DV], sc[KB];
      {un}for (int c = 0; c < D; ++c)
        qv[c] = live ? ldf(qb, qo + uint(b * qs0 + h * qs1 + i * qs2 + c * qs3) * 4u) : 0.0;
      {un}for (int c = 0; c < DV; ++c) acc[c] = 0.0;
      float m = -rlx_inf(), l = 0.0;
      for (int j0 = 0; j0 < Sk; j0 += KB) {{
        barrier();  // the previous chunk is consumed
        for (int e = lid; e < KB * D; e += QB) {{
          int jj = e / D, c = e % D, j = j0 + jj;
          Ks[jj][c] = j < Sk ? ldf(kb, ko + uint(b * ks0 + h * ks1 + j * ks2 + c * ks3) * 4u) : 0.0;
        }}
        for (int e = lid; e < KB * DV; e += QB) {{
          int jj = e / DV, c = e % DV, j = j0 + jj;
          Vs[jj][c] = j < Sk ? ldf(vb, vo + uint(b * vs0 + h * vs1 + j * vs2 + c * vs3) * 4u) : 0.0;
        }}
        barrier();
        if (live) {{
          int nk = min(KB, Sk - j0);
          float cm = m;
          {un}for (int jj = 0; jj < KB; ++jj) {{
            if (jj < nk) {{
              int j = j0 + jj;
              float p4[4] = float[4](0.0, 0.0, 0.0, 0.0);  // 4 chains: the FMAs overlap
              {un}for (int c = 0; c < D; ++c) p4[c & 3] += qv[c] * Ks[jj][c];
              float s = ((p4[0] + p4[1]) + (p4[2] + p4[3])) * scale;
              if (kind == 3) s += ldf(mb, mo + uint(b * bs0 + h * bs1 + i * bs2 + j * bs3) * 4u);
              bool keep = true;
              if (kind == 1 || kind == 2) keep = j <= i && (kind == 1 || j > i - win);
              else if (kind == 4) {{
                uint ma = mo + uint(b * Sk + j) * (mdt == 2 ? 8u : mdt == 3 ? 1u : 4u);
                keep = mdt == 0 ? ldf(mb, ma) != 0.0 : mdt == 1 ? ldi(mb, ma) != 0
                     : mdt == 2 ? (rd(mb, ma) | rd(mb, ma + 4u)) != 0u : ldb(mb, ma);
              }}
              if (!keep) s = -1e9;
              sc[jj] = s;
              if (s > cm || s != s) cm = s;
            }}
          }}
          float mu = (isinf(cm) && cm < 0.0) ? 0.0 : cm;
          float corr = rlx_exp(m - mu);
          l *= corr;
          {un}for (int c = 0; c < DV; ++c) acc[c] *= corr;
          {un}for (int jj = 0; jj < KB; ++jj) {{
            if (jj < nk) {{
              float p = rlx_exp(sc[jj] - mu);
              l += p;
              {un}for (int c = 0; c < DV; ++c) acc[c] += p * Vs[jj][c];
            }}
          }}
          m = cm;
        }}
      }}
      if (live) {{
        uint ob = oo + uint(b * os0 + h * os1 + i * os2);
        {un}for (int c = 0; c < DV; ++c) A[ob + uint(c * os3)] = floatBitsToUint(Sk > 0 ? acc[c] / l : 0.0);
      }}
    }}
  }}
}}
"""


# -- lowering: one LIR step -> dispatches ------------------------------------------------------------

def cstrides(shape: tuple[int, ...]) -> list[int]:
    s, acc = [], 1
    for d in reversed(shape):
        s.append(acc)
        acc *= d
    return list(reversed(s))


def bstrides(src: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """Element strides of ``src`` broadcast (right-aligned) to ``out``."""
    cs = cstrides(src)
    pad = len(out) - len(src)
    return [0 if i < pad or src[i - pad] == 1 else cs[i - pad] for i in range(len(out))]


# Checked reads of a step's attributes (the op's schema has given them these types); ``default``
# stands in for an absent attribute.
def _int(s: Step, name: str, default: int | None = None) -> int:
    v = s.attrs[name] if default is None else s.attrs.get(name, default)
    if not isinstance(v, (int, float)):
        raise TypeError(f"{s.op}: attribute {name!r} = {v!r} is not an int")
    return int(v)


def _float(s: Step, name: str, default: float) -> float:
    v = s.attrs.get(name, default)
    if not isinstance(v, (int, float)):
        raise TypeError(f"{s.op}: attribute {name!r} = {v!r} is not a number")
    return float(v)


def _ints(s: Step, name: str, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
    v = s.attrs[name] if default is None else s.attrs.get(name, default)
    if not isinstance(v, tuple):
        raise TypeError(f"{s.op}: attribute {name!r} = {v!r} is not a tuple of ints")
    return v


def _opt_ints(s: Step, name: str) -> tuple[int, ...] | None:
    """An ``ints`` attribute that may be absent or ``None``."""
    return None if s.attrs.get(name) is None else _ints(s, name)


def f2i(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", float(x)))[0]


def meta_block(launches: Sequence[Launch]) -> tuple[np.ndarray, list[int]]:
    """Every launch's parameters in one int32 array (the ``M`` buffer) and each launch's base in it
    (its ``pc.base``)."""
    meta: list[int] = []
    bases = []
    for ln in launches:
        bases.append(len(meta))
        meta += [int(x) for x in ln.params]
    return np.asarray(meta or [0], np.int32), bases


class ShaderProgram(KitProgram):
    """A :class:`KitProgram` whose LIR steps lower to compute-shader dispatches of this library's
    template set, in whatever shading language :meth:`source` returns them (GLSL here; WGSL in
    rlx-webgpu, HLSL in :mod:`.hlsl`): one lowering, many languages.

    Launches carry no buffers (every shader binds arena, constants and ``M`` the same way); their
    ``params`` are the dispatch's words of ``M`` (:func:`meta_block` lays them out) and their ``grid``
    the workgroup counts. ``cpu_device`` picks the untiled matmuls (a CPU implementation such as
    lavapipe/llvmpipe pays dearly for workgroup barriers); ``max_groups`` caps a 1-D dispatch (the
    shaders loop over the rest). Claim names are ``prefix + op``.
    """

    #: dtypes stored several to a 32-bit word by the elementwise shaders (one invocation per word)
    PACKED: dict[DType, int] = {DType.BOOL: 4}

    def __init__(self, program: Program, allocator: Allocator, runtime: Runtime, *,
                 prefix: str, cpu_device: bool, max_groups: int) -> None:
        self.prefix = prefix
        self.cpu_device, self.max_groups = cpu_device, max_groups
        #: constant linear weights, uploaded once more transposed to (in, out): contiguous loads
        self.transposed: dict[str, str] = {}
        self._out: list[Launch] = []
        super().__init__(program, allocator, runtime, lambda s, p: self._lower(s))
        #: dispatches per claim name (a concat records one per input, a pad two, an empty tensor or a
        #: folded constant transpose none)
        self.dispatch_counts: Counter[str] = Counter()
        for s, lns in self.launches:
            self.dispatch_counts[s.kernel] += sum(not ln.empty for ln in lns)

    def constants(self) -> dict[str, np.ndarray]:
        consts = super().constants()
        outs = {v for _, v in self.program.outputs}
        for s in self.program.kernels:  # transposes of constants: folded once, here (no dispatch per run)
            if s.kernel == self.prefix + "transpose" and s.inputs[0] in consts and s.outputs[0] not in outs:
                perm = _opt_ints(s, "perm")
                consts[s.outputs[0]] = np.ascontiguousarray(np.transpose(consts[s.inputs[0]], perm))
        for s in self.program.kernels:
            w = s.inputs[1] if s.kernel == self.prefix + "linear" else ""
            if w and w in consts and w + ".T" not in consts:
                consts[w + ".T"] = np.ascontiguousarray(consts[w].T)
                self.transposed[w] = w + ".T"
        return consts

    def _lower(self, s: Step) -> list[Launch]:
        self._step, self._out = s, []
        getattr(self, "_k_" + s.kernel[len(self.prefix):])(s)
        return self._out

    def source(self, name: str, *args: Any) -> str:
        """The shader ``name`` of the template set (``copy8``, ``copy32``, ``fill32``, ``elementwise``,
        ``matmul``, ``matmul_simple``, ``matmul_4x4``, ``linear``, ``reduce``, ``rows``, ``gather``,
        ``scan``, ``argext``, ``conv2d``, ``iota``) for ``args``, in this program's language."""
        raise NotImplementedError

    # -- helpers ----------------------------------------------------------------------------------
    def emit(self, src: str, meta: list[int], n: int | None = None,
             groups: tuple[int, int, int] | None = None) -> None:
        if groups is None:
            if not n:
                return
            groups = (max(1, min(-(-n // WG), self.max_groups)), 1, 1)
        if 0 in groups:
            return
        self._out.append(Launch(self._step.kernel, src, (), [int(x) for x in meta], groups))

    def _copy(self, n: int, shape: list[int], src: str, in_base: int, ist: list[int], out_off: int,
              ost: list[int]) -> None:
        """Strided copy of ``shape`` elements (strides in elements) of ``src``'s dtype."""
        b, off = self.locate(src)
        dt = self.types[src].dtype
        if dt is DType.BOOL:  # bytes; the output is contiguous (claims guarantee it)
            self.emit(self.source("copy8"), [n, len(shape), b, off, out_off, in_base, *shape, *ist, *ost],
                      -(-n // 4))
            return
        if dt.np.itemsize == 8:  # two words per element: one more (innermost) dim of 2
            shape, ist, ost = [*shape, 2], [2 * x for x in ist] + [1], [2 * x for x in ost] + [1]
            n, in_base = 2 * n, 2 * in_base
        self.emit(self.source("copy32"), [n, len(shape), b, off, out_off, in_base, *shape, *ist, *ost], n)

    # -- kernels ----------------------------------------------------------------------------------
    def _elementwise(self, s: Step, program: str) -> None:
        out = self.shape(s.outputs[0])
        n = math.prod(out)
        dts = tuple(self.types[i].dtype for i in s.inputs)
        src = self.source("elementwise", program, dts, self.types[s.outputs[0]].dtype)
        meta = [n, len(out), self.locate(s.outputs[0])[1], 0, *out]
        for i in s.inputs:
            meta += [*self.locate(i), *bstrides(self.shape(i), out)]
        self.emit(src, meta, -(-n // self.PACKED.get(self.types[s.outputs[0]].dtype, 1)))

    def _k_fused_elementwise(self, s: Step) -> None:
        self._elementwise(s, str(s.attrs["program"]))

    def _k_matmul(self, s: Step) -> None:
        a, b = (self.shape(i) for i in s.inputs)
        a2 = (1, *a) if len(a) == 1 else a
        b2 = (*b, 1) if len(b) == 1 else b
        M, K, N = a2[-2], a2[-1], b2[-1]  # noqa: N806
        ab, bb = a2[:-2], b2[:-2]
        batch = tuple(np.broadcast_shapes(ab, bb))
        ast = [x * M * K for x in bstrides(ab, batch)] if ab else [0] * len(batch)
        bst = [x * K * N for x in bstrides(bb, batch)] if bb else [0] * len(batch)
        nb = math.prod(batch)
        meta = [M, N, K, *self.locate(s.inputs[0]), *self.locate(s.inputs[1]), self.locate(s.outputs[0])[1],
                len(batch), *batch, *ast, *bst]
        dt = self.types[s.outputs[0]].dtype
        bufs = "".join("AW"[self.locate(v)[0]] for v in s.inputs)  # buffers baked into the shader
        if self.cpu_device and M % 4 == 0 and N % 4 == 0:  # 4x4 register blocks, no barriers
            self.emit(self.source("matmul_4x4", dt, bufs), meta, groups=(-(-N // (4 * WG)), M // 4, nb))
        elif self.cpu_device:  # lavapipe & co: no shared-memory tiles (barriers are costly there)
            self.emit(self.source("matmul_simple", dt, bufs), meta, groups=(-(-N // WG), -(-M // 4), nb))
        else:
            self.emit(self.source("matmul", dt), meta, groups=(-(-N // 16), -(-M // 16), nb))

    def _k_linear(self, s: Step) -> None:
        x, w = self.shape(s.inputs[0]), self.shape(s.inputs[1])
        N, K = w  # noqa: N806
        R = math.prod(x[:-1])  # noqa: N806
        wname = self.transposed.get(s.inputs[1], s.inputs[1])
        meta = [R, N, K, *self.locate(s.inputs[0]), *self.locate(wname), *self.locate(s.inputs[2]),
                self.locate(s.outputs[0])[1], 1 if wname != s.inputs[1] else 0]
        self.emit(self.source("linear"), meta, groups=(-(-N // WG), R, 1))

    def _reduce(self, s: Step) -> None:
        x = self.shape(s.inputs[0])
        given = _opt_ints(s, "axes")
        axes = set(range(len(x))) if given is None else {normalize_axis(int(a), len(x)) for a in given}
        cs = cstrides(x)
        kept = [(x[d], cs[d]) for d in range(len(x)) if d not in axes]
        red = [(x[d], cs[d]) for d in range(len(x)) if d in axes]
        n = math.prod(k for k, _ in kept)
        meta = [n, len(kept), len(red), *self.locate(s.inputs[0]), self.locate(s.outputs[0])[1],
                math.prod(r for r, _ in red)]
        for k in kept + red:
            meta += list(k)
        self.emit(self.source("reduce", s.op, self.types[s.inputs[0]].dtype), meta, n)

    _k_reduce_sum = _k_reduce_prod = _k_reduce_mean = _k_reduce_max = _k_reduce_min = _reduce

    def _rows(self, s: Step) -> None:
        x = self.shape(s.inputs[0])
        ax = normalize_axis(_int(s, "axis", -1), len(x))
        nrows, cols = math.prod(x[:ax]), math.prod(x[ax:])
        eps = f2i(_float(s, "eps", 0.0))
        gb = self.locate(s.inputs[1]) if len(s.inputs) > 1 else (0, 0)
        bb = self.locate(s.inputs[2]) if len(s.inputs) > 2 else (0, 0)
        meta = [nrows, cols, *self.locate(s.inputs[0]), self.locate(s.outputs[0])[1], eps, *gb, *bb]
        self.emit(self.source("rows", s.op), meta, nrows if cols else 0)

    _k_softmax = _k_log_softmax = _k_layer_norm = _rows

    def _k_reshape(self, s: Step) -> None:
        n = math.prod(self.shape(s.outputs[0]))
        self._copy(n, [n], s.inputs[0], 0, [1], self.locate(s.outputs[0])[1], [1])

    def _k_transpose(self, s: Step) -> None:
        if s.outputs[0] in self.constant_offsets:  # a constant, transposed at compile time
            return
        x = self.shape(s.inputs[0])
        given = _opt_ints(s, "perm")
        perm = (list(reversed(range(len(x)))) if given is None
                else [normalize_axis(int(p), len(x)) for p in given])
        out = self.shape(s.outputs[0])
        cs = cstrides(x)
        self._copy(math.prod(out), list(out), s.inputs[0], 0, [cs[p] for p in perm],
                   self.locate(s.outputs[0])[1], cstrides(out))

    def _k_expand(self, s: Step) -> None:
        out = self.shape(s.outputs[0])
        self._copy(math.prod(out), list(out), s.inputs[0], 0, bstrides(self.shape(s.inputs[0]), out),
                   self.locate(s.outputs[0])[1], cstrides(out))

    def _k_slice(self, s: Step) -> None:
        x = self.shape(s.inputs[0])
        out = self.shape(s.outputs[0])
        cs = cstrides(x)
        ist = list(cs)
        base = 0
        starts, stops = _ints(s, "starts"), _ints(s, "stops")
        axes = _opt_ints(s, "axes") or tuple(range(len(starts)))
        steps = _opt_ints(s, "steps") or (1,) * len(starts)
        for st, sp, given, step in zip(starts, stops, axes, steps):
            ax = normalize_axis(int(given), len(x))
            r = range(*slice(int(st), int(sp), int(step)).indices(x[ax]))
            if len(r):
                base += r.start * cs[ax]
            ist[ax] = cs[ax] * int(step)
        self._copy(math.prod(out), list(out), s.inputs[0], base, ist, self.locate(s.outputs[0])[1],
                   cstrides(out))

    def _k_concat(self, s: Step) -> None:
        out = self.shape(s.outputs[0])
        ax = normalize_axis(_int(s, "axis"), len(out))
        co = cstrides(out)
        o = self.locate(s.outputs[0])[1]
        pos = 0
        esz = self.types[s.outputs[0]].dtype.np.itemsize
        for i in s.inputs:
            x = self.shape(i)
            self._copy(math.prod(x), list(x), i, 0, cstrides(x), o + esz * pos * co[ax], co)
            pos += x[ax]

    def _k_pad(self, s: Step) -> None:
        x = self.shape(s.inputs[0])
        out = self.shape(s.outputs[0])
        r = len(x)
        pads = _ints(s, "pads")
        o = self.locate(s.outputs[0])[1]
        v = _float(s, "value", 0.0)
        bits = f2i(v) if self.types[s.outputs[0]].dtype is DType.F32 else int(np.int32(int(v)))
        n = math.prod(out)
        self.emit(self.source("fill32"), [n, o, bits], n)
        co = cstrides(out)
        off = o + 4 * sum(int(pads[i]) * co[i] for i in range(r))
        self._copy(math.prod(x), list(x), s.inputs[0], 0, cstrides(x), off, co)

    def _k_gather(self, s: Step) -> None:
        x = self.shape(s.inputs[0])
        idx = self.shape(s.inputs[1])
        ax = normalize_axis(_int(s, "axis"), len(x))
        n = math.prod(self.shape(s.outputs[0]))
        esz = 8 if self.types[s.inputs[1]].dtype is DType.I64 else 4
        words = self.types[s.inputs[0]].dtype.np.itemsize // 4
        n *= words
        meta = [n, math.prod(idx), math.prod(x[ax + 1:]) * words, x[ax], *self.locate(s.inputs[0]),
                *self.locate(s.inputs[1]), self.locate(s.outputs[0])[1]]
        self.emit(self.source("gather", esz), meta, n)

    def _axis_split(self, s: Step) -> tuple[int, int, int]:
        x = self.shape(s.inputs[0]) or (1,)
        ax = normalize_axis(_int(s, "axis", -1), len(x))
        return math.prod(x[:ax]), x[ax], math.prod(x[ax + 1:])

    def _k_cumsum(self, s: Step) -> None:
        outer, d, inner = self._axis_split(s)
        n = outer * inner
        meta = [n, d, inner, *self.locate(s.inputs[0]), self.locate(s.outputs[0])[1],
                int(bool(s.attrs.get("exclusive"))), int(bool(s.attrs.get("reverse")))]
        self.emit(self.source("scan", self.types[s.inputs[0]].dtype), meta, n)

    def _argext(self, s: Step) -> None:
        outer, d, inner = self._axis_split(s)
        n = outer * inner
        meta = [n, d, inner, *self.locate(s.inputs[0]), self.locate(s.outputs[0])[1]]
        self.emit(self.source("argext", s.op, self.types[s.inputs[0]].dtype), meta, n)

    _k_argmax = _k_argmin = _argext

    def _k_conv2d(self, s: Step) -> None:
        nb, c, h, w = self.shape(s.inputs[0])
        o, cg, kh, kw = self.shape(s.inputs[1])
        out = self.shape(s.outputs[0])
        st, pads, dil = _ints(s, "strides", (1, 1)), _ints(s, "pads", (0, 0, 0, 0)), \
            _ints(s, "dilations", (1, 1))
        groups = _int(s, "groups", 1)
        n = math.prod(out)
        meta = [n, c, h, w, o, cg, kh, kw, out[2], out[3], st[0], st[1], pads[0], pads[1], dil[0], dil[1],
                o // groups, *self.locate(s.inputs[0]), *self.locate(s.inputs[1]),
                self.locate(s.outputs[0])[1]]
        self.emit(self.source("conv2d", self.types[s.inputs[0]].dtype), meta, n)

    def _k_iota(self, s: Step) -> None:
        out = self.shape(s.outputs[0]) or (1,)
        ax = normalize_axis(_int(s, "axis"), len(out))
        n = math.prod(out)
        self.emit(self.source("iota", self.types[s.outputs[0]].dtype),
                  [n, math.prod(out[ax + 1:]), out[ax], self.locate(s.outputs[0])[1]], n)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_k_"):  # single elementwise ops
            def k(s: Step) -> None:
                self._elementwise(s, single_op_program(s.op, len(s.inputs), dict(s.attrs)))
            return k
        raise AttributeError(name)


class GlslProgram(ShaderProgram):
    """:class:`ShaderProgram` over this module's GLSL templates in flavour ``flavour``.

    ``gpu_kernels`` (a GPU target opts in; rlx-vulkan does on non-CPU devices) lowers matmul and
    linear to :func:`matmul_tiled` and softmax / log_softmax / layer_norm to :func:`rows_wg`;
    ``gemm_tile`` picks its tile (``"auto"``: ``"large"`` when that still gives at least
    :data:`LARGE_TILES_MIN` workgroups, else ``"small"``; or a key of :data:`GEMM_TILES`);
    ``epilogues`` lets a linear's store do a following head-split transpose or residual add
    (:meth:`_store_folds`)."""

    #: workgroups a GEMM must fill with large tiles before "auto" picks them. Measured on the H200
    #: (132 SMs): MiniLM b32 s128's GEMMs (384-1536 large tiles: 4096 x 1536 linears, 384 batched
    #: 128 x 128 attention products) ran faster as small tiles (device 6.98 vs 7.45 ms), while
    #: 4096^3 (1024 large tiles) needs large ones to stay within 1.41x of cuBLAS.
    LARGE_TILES_MIN = 1024
    #: f32 reductions over innermost runs of >= 32 that :func:`reduce_wg` serves (a workgroup per output)
    WG_REDUCE_OPS = frozenset({"reduce_sum", "reduce_mean", "reduce_max", "reduce_min"})

    def __init__(self, program: Program, allocator: Allocator, runtime: Runtime, flavour: GlslFlavour, *,
                 prefix: str, cpu_device: bool, max_groups: int, gpu_kernels: bool = False,
                 gemm_tile: str = "auto", epilogues: bool = True) -> None:
        self.flavour = flavour
        if gemm_tile != "auto" and gemm_tile not in GEMM_TILES:
            raise IRError(f"unknown GEMM tile {gemm_tile!r}", fix=f"use auto or one of {sorted(GEMM_TILES)}")
        self.gpu_kernels, self.gemm_tile = gpu_kernels and not cpu_device, gemm_tile
        #: the GEMM variant each matmul/linear step ran, by node (benchmarks report it)
        self.gemm_variants: dict[str, str] = {}
        #: head-split transposes folded into a linear's store (:meth:`_store_folds`), on first use
        self._folds: dict[str, tuple[str, list[int]]] | None = None
        #: residual adds folded into a linear's store: the linear's output -> (the add's output, the
        #: residual); and the step outputs whose work a linear's store did (they launch nothing)
        self._resid: dict[str, tuple[str, str]] = {}
        #: fused elementwise programs folded into a linear's store: its output -> (the program's
        #: output, the program's step)
        self._ew: dict[str, tuple[str, Step]] = {}
        self._done: set[str] = set()
        #: whether :meth:`_store_folds` may fold (False: every step launches its own kernel)
        self.epilogues = epilogues
        super().__init__(program, allocator, runtime, prefix=prefix, cpu_device=cpu_device,
                         max_groups=max_groups)

    def source(self, name: str, *args: Any) -> str:
        if name == "matmul_simple":  # the GLSL one reads its buffers through the arena/constants switch
            args = args[:1]
        return str(TEMPLATES[name](self.flavour, *args))

    def _tile(self, m: int, n: int, nb: int) -> str:
        if self.gemm_tile != "auto":
            return self.gemm_tile
        bm, bn = GEMM_TILES["large"][:2]
        return "large" if -(-m // bm) * -(-n // bn) * nb >= self.LARGE_TILES_MIN else "small"

    def _tiled(self, s: Step, meta: list[int], m: int, n: int, nb: int, bufs: str, dt: DType, *,
               bias: bool = False, bt: bool = False, split: bool = False, res: bool = False,
               epi: tuple[str, int, int] | None = None) -> None:
        tile = self._tile(m, n, nb)
        bm, bn = GEMM_TILES[tile][:2]
        self.gemm_variants[s.node] = (f"tiled-{tile} {bm}x{bn}" + (" +bias" if bias else "")
                                      + (" +split-heads" if split else "") + (" +residual" if res else "")
                                      + (" +elementwise" if epi else ""))
        self.emit(self.source("matmul_tiled", dt, bufs, tile, bias, bt, split, res, epi), meta,
                  groups=(-(-n // bn), -(-m // bm), nb))

    def _k_matmul(self, s: Step) -> None:
        if not self.gpu_kernels:
            self.gemm_variants[s.node] = "untiled (CPU device)" if self.cpu_device else "basic 16x16"
            super()._k_matmul(s)
            return
        a, b = (self.shape(i) for i in s.inputs)
        a2 = (1, *a) if len(a) == 1 else a
        b2 = (*b, 1) if len(b) == 1 else b
        m, k, n = a2[-2], a2[-1], b2[-1]
        ab, bb = a2[:-2], b2[:-2]
        batch = tuple(np.broadcast_shapes(ab, bb))
        ast = [x * m * k for x in bstrides(ab, batch)] if ab else [0] * len(batch)
        bst = [x * k * n for x in bstrides(bb, batch)] if bb else [0] * len(batch)
        meta = [m, n, k, *self.locate(s.inputs[0]), *self.locate(s.inputs[1]), self.locate(s.outputs[0])[1],
                len(batch), *batch, *ast, *bst]
        bufs = "".join("AW"[self.locate(v)[0]] for v in s.inputs)
        self._tiled(s, meta, m, n, math.prod(batch), bufs, self.types[s.outputs[0]].dtype)

    def _k_linear(self, s: Step) -> None:
        if not self.gpu_kernels:
            self.gemm_variants[s.node] = "linear one invocation per output"
            super()._k_linear(s)
            return
        x, w = self.shape(s.inputs[0]), self.shape(s.inputs[1])
        n, k = w
        r = math.prod(x[:-1])
        wname = self.transposed.get(s.inputs[1], s.inputs[1])  # (K, N) when pre-transposed, else (N, K)
        fold = self._store_folds().get(s.outputs[0])
        resid = self._resid.get(s.outputs[0])
        ew = self._ew.get(s.outputs[0])
        out = (fold[0] if fold is not None else resid[0] if resid is not None else ew[0] if ew is not None
               else s.outputs[0])
        meta = [r, n, k, *self.locate(s.inputs[0]), *self.locate(wname), self.locate(out)[1],
                0, *self.locate(s.inputs[2])]
        if fold is not None:
            meta += fold[1]
        if resid is not None:
            meta += self.locate(resid[1])
        epi: tuple[str, int, int] | None = None
        if ew is not None:
            fs = ew[1]
            k0 = fs.inputs.index(s.outputs[0])
            meta += [w for v in fs.inputs if v != s.outputs[0] for w in self.locate(v)]
            epi = (str(fs.attrs["program"]), len(fs.inputs), k0)
        bufs = "".join("AW"[self.locate(v)[0]] for v in (s.inputs[0], wname))
        self._tiled(s, meta, r, n, 1, bufs, DType.F32, bias=True, bt=wname == s.inputs[1],
                    split=fold is not None, res=resid is not None, epi=epi)

    def _rows(self, s: Step) -> None:
        if not self.gpu_kernels:
            super()._rows(s)
            return
        x = self.shape(s.inputs[0])
        ax = normalize_axis(_int(s, "axis", -1), len(x))
        nrows, cols = math.prod(x[:ax]), math.prod(x[ax:])
        eps = f2i(_float(s, "eps", 0.0))
        gb = self.locate(s.inputs[1]) if len(s.inputs) > 1 else (0, 0)
        bb = self.locate(s.inputs[2]) if len(s.inputs) > 2 else (0, 0)
        meta = [nrows, cols, *self.locate(s.inputs[0]), self.locate(s.outputs[0])[1], eps, *gb, *bb]
        if nrows and cols:
            self.emit(self.source("rows_wg", s.op), meta, groups=(min(nrows, self.max_groups), 1, 1))

    _k_softmax = _k_log_softmax = _k_layer_norm = _rows

    def _reduce(self, s: Step) -> None:
        x = self.shape(s.inputs[0])
        given = _opt_ints(s, "axes")
        axes = set(range(len(x))) if given is None else {normalize_axis(int(a), len(x)) for a in given}
        inner = axes == set(range(len(x) - len(axes), len(x)))  # the innermost axes: contiguous runs
        r = math.prod(x[d] for d in axes)
        if (not self.gpu_kernels or not inner or r < 32 or s.op not in self.WG_REDUCE_OPS
                or self.types[s.inputs[0]].dtype is not DType.F32):
            super()._reduce(s)
            return
        n = math.prod(x) // r
        if n:
            self.emit(self.source("reduce_wg", s.op),
                      [n, r, *self.locate(s.inputs[0]), self.locate(s.outputs[0])[1]],
                      groups=(min(n, self.max_groups), 1, 1))

    _k_reduce_sum = _k_reduce_prod = _k_reduce_mean = _k_reduce_max = _k_reduce_min = _reduce

    def _k_attention(self, s: Step) -> None:
        """One :func:`attention_wg` dispatch (claimed only by a target that serves it: rlx-vulkan's
        GPU path, for f32 and static head dims of at most :data:`ATT_MAX_D`)."""
        q, k, v = (self.shape(i) for i in s.inputs[:3])
        out = self.shape(s.outputs[0])
        four = len(q) == 4
        nb, h = q[0], (q[1] if four else 1)
        sq, d, sk, dv = q[-2], q[-1], k[-2], v[-1]
        kind = str(s.attrs.get("mask", "none"))
        sc = s.attrs.get("scale")
        scale = float(sc) if isinstance(sc, (int, float)) else 1.0 / math.sqrt(d)
        win = _int(s, "window", 0) if s.attrs.get("window") is not None else 0

        def st4(shape: tuple[int, ...]) -> list[int]:  # (batch, head, row, col) strides in elements
            c = cstrides(shape)
            return c if four else [c[0], 0, c[1], c[2]]

        mloc: tuple[int, int] = (0, 0)
        mdt, bst = 0, [0, 0, 0, 0]
        if kind in ("bias", "padding"):
            mloc = self.locate(s.inputs[3])
        if kind == "bias":
            bst = bstrides(self.shape(s.inputs[3]), (nb, h, sq, sk) if four else (nb, sq, sk))
            if not four:
                bst.insert(1, 0)
        elif kind == "padding":
            mdt = ATT_MASK_DTYPES[self.types[s.inputs[3]].dtype]
        meta = [sq, sk, nb, h, *(w for i in s.inputs[:3] for w in self.locate(i)),
                self.locate(s.outputs[0])[1], f2i(scale), ATT_MASKS[kind], win, *mloc, mdt, *bst,
                *st4(q), *st4(k), *st4(v), *st4(out)]
        if sq and nb * h:
            self.emit(self.source("attention_wg", d, dv), meta,
                      groups=(-(-sq // ATT_QB), min(nb * h, 65535), 1))

    def _store_folds(self) -> dict[str, tuple[str, list[int]]]:
        """Head splits folded into a linear's store: a linear's (B*S, H*D) result used only by an
        in-place reshape to (B, S, H, D) used only by a transpose (the q/k/v of a transformer layer)
        is stored by the GEMM straight into the transpose's output; maps the linear's output -> (the
        transpose's output, [S, D, the element strides of B, S, H, D there]); the transpose then
        launches nothing (:attr:`_done`). Only where the transpose's bytes are neither read by the
        linear nor touched by the steps between the two. Likewise a residual ``add(linear, r)`` (same
        shapes, f32) is done by the linear's store (:attr:`_resid`), and an f32 fused program of the
        linear's result and scalars (GELU) applied by it (:attr:`_ew`)."""
        if self._folds is not None:
            return self._folds
        folds: dict[str, tuple[str, list[int]]] = {}
        self._folds = folds
        if not (self.gpu_kernels and self.epilogues):
            return folds
        steps = list(self.program.kernels)
        users: dict[str, list[int]] = {}
        for i, st in enumerate(steps):
            for v in st.inputs:
                users.setdefault(v, []).append(i)
        outs = {v for _, v in self.program.outputs}

        def span(v: str) -> tuple[int, int, int]:
            b, off = self.locate(v)
            return b, off, off + self.types[v].nbytes()

        def hits(v: str, others: Sequence[str]) -> bool:  # shares arena bytes with one of ``others``?
            b, lo, hi = span(v)
            return any(b2 == b == 0 and lo < hi2 and lo2 < hi for b2, lo2, hi2 in map(span, others))

        for il, lin in enumerate(steps):
            y = lin.outputs[0]
            if lin.kernel != self.prefix + "linear" or y in outs or len(users.get(y, [])) != 1:
                continue
            ir = users[y][0]
            rs = steps[ir]
            z = rs.outputs[0]
            if rs.kernel == self.prefix + "add" and len(rs.inputs) == 2 and rs.inputs[0] != rs.inputs[1]:
                res = rs.inputs[1] if rs.inputs[0] == y else rs.inputs[0]
                between = [v for st in steps[il + 1:ir] for v in (*st.inputs, *st.outputs) if v != y]
                if (self.shape(res) == self.shape(y) == self.shape(z) and z not in self.constant_offsets
                        and all(self.types[v].dtype is DType.F32 for v in (res, z))
                        and not hits(z, [*lin.inputs, *between])
                        # in place over the residual: each element is read, then written, by one invocation
                        and (self.locate(z) == self.locate(res) or not hits(z, [res]))):
                    self._resid[y] = (z, res)
                    self._done.add(z)
                continue
            if rs.kernel == self.prefix + "fused_elementwise" and rs.inputs.count(y) == 1:
                others = [v for v in rs.inputs if v != y]
                between = [v for st in steps[il + 1:ir] for v in (*st.inputs, *st.outputs) if v != y]
                if (self.shape(z) == self.shape(y) and z not in self.constant_offsets
                        and all(self.types[v].dtype is DType.F32 for v in (*others, z))
                        and all(math.prod(self.shape(v)) == 1 for v in others)
                        and not hits(z, [*lin.inputs, *between]) and self._epi_renders(rs)):
                    self._ew[y] = (z, rs)
                    self._done.add(z)
                continue
            if (rs.kernel != self.prefix + "reshape" or self.locate(z) != self.locate(y) or z in outs
                    or len(users.get(z, [])) != 1):
                continue
            it = users[z][0]
            tr = steps[it]
            dst = tr.outputs[0]
            shape4, (rows, n) = self.shape(z), (math.prod(self.shape(y)[:-1]), self.shape(y)[-1])
            if (tr.kernel != self.prefix + "transpose" or len(shape4) != 4 or dst in self.constant_offsets
                    or shape4[0] * shape4[1] != rows or shape4[2] * shape4[3] != n or not rows or not n):
                continue
            between = [v for st in steps[il + 1:it] for v in (*st.inputs, *st.outputs) if v not in (y, z)]
            if hits(dst, [*lin.inputs, *between]):
                continue
            given = _opt_ints(tr, "perm")
            perm = [3, 2, 1, 0] if given is None else [normalize_axis(int(p), 4) for p in given]
            cs = cstrides(self.shape(dst))
            folds[y] = (dst, [shape4[1], shape4[3], *(cs[perm.index(e)] for e in range(4))])
            self._done.add(dst)
        return folds

    def _k_transpose(self, s: Step) -> None:
        if self.gpu_kernels:
            self._store_folds()
            if s.outputs[0] in self._done:
                return  # the linear before it stored its result here already
        super()._k_transpose(s)

    def _epi_renders(self, s: Step) -> bool:
        """Whether fused program ``s`` renders as an f32 store epilogue (no 64-bit helpers)."""
        try:
            lines, _, rdt = render_program(str(s.attrs["program"]), [f"x{k}" for k in range(len(s.inputs))],
                                           (DType.F32,) * len(s.inputs), GLSL)
        except Exception:
            return False
        return rdt is DType.F32 and not any(re.search(r"rlx_(sin|cos|pow)\(", ln) for ln in lines)

    def _k_fused_elementwise(self, s: Step) -> None:
        if self.gpu_kernels:
            self._store_folds()
            if s.outputs[0] in self._done:
                return  # computed by the linear before it, as it stored
        super()._k_fused_elementwise(s)

    def _k_add(self, s: Step) -> None:
        if self.gpu_kernels:
            self._store_folds()
            if s.outputs[0] in self._done:
                return  # added by the linear before it, as it stored
        self._elementwise(s, single_op_program(s.op, len(s.inputs), dict(s.attrs)))

    def _k_reshape(self, s: Step) -> None:
        if self.gpu_kernels and self.locate(s.inputs[0]) == self.locate(s.outputs[0]):
            return  # planned in place: the bytes are already there (a dispatch saved per reshape)
        super()._k_reshape(s)


#: The GLSL template set by name (what :meth:`GlslProgram.source` serves).
TEMPLATES: dict[str, Callable[..., str]] = {
    "copy8": copy8, "copy32": copy32, "fill32": fill32, "elementwise": elementwise, "matmul": matmul,
    "matmul_simple": matmul_simple, "matmul_4x4": matmul_4x4, "linear": linear, "reduce": reduce,
    "rows": rows, "gather": gather, "scan": scan, "argext": argext, "conv2d": conv2d, "iota": iota,
    "matmul_tiled": matmul_tiled, "rows_wg": rows_wg, "reduce_wg": reduce_wg, "attention_wg": attention_wg}


# -- claims -----------------------------------------------------------------------------------------

F32 = frozenset({DType.F32})
GEN = frozenset({DType.F32, DType.I32, DType.BOOL})
W4 = frozenset({DType.F32, DType.I32})
INDEX = frozenset({DType.I32, DType.I64})
#: word-copied dtypes (8-byte ones as two words) and, for movement into contiguous outputs, bool
W8 = frozenset({DType.F32, DType.I32, DType.I64})
MOVE = W8 | {DType.BOOL}
MAX_RANK = 8


def _rank_ok(v: Any) -> str | None:
    if any(t.rank > MAX_RANK for t in (*v.in_types, *v.out_types)):
        return f"rank > {MAX_RANK}"
    return None


def _last_axis(v: Any) -> str | None:
    t = v.in_types[0]
    if t.rank == 0:
        return "rank 0"
    if normalize_axis(int(v.attrs["axis"]), t.rank) != t.rank - 1:
        return "only the last axis (other axes run through the decomposition)"
    return None


_PREDICATES: dict[tuple[GlslFlavour, Callable[[], bool]], Any] = {}


def elementwise_predicate(fl: GlslFlavour, wide: Callable[[], bool]) -> Any:
    """The claim predicate of elementwise ops and fused programs: storage dtypes (i64 only where
    ``wide()``: the device has 64-bit integers and doubles in shaders), rank, then the render check
    (memoised per flavour and ``wide``: claims are asked per variant)."""
    key = (fl, wide)
    pred = _PREDICATES.get(key)
    if pred is None:
        from .claims import all_of, dtypes_in, render_check, renders

        def source_ok(src: str) -> str | None:
            if "GL_ARB_gpu_shader_int64" in src and not wide():
                return "sin/cos/pow need shaderFloat64 + shaderInt64, which this device lacks"
            return None

        check = render_check(lambda p, i, o: elementwise(fl, p, i, o), "as GLSL", source_ok=source_ok)
        pred = _PREDICATES[key] = all_of(
            dtypes_in(lambda: GEN | ({DType.I64} if wide() else set()), "no GLSL storage for"),
            _rank_ok, renders(check))
    return pred


def template_claims(prefix: str, language: str) -> list[Any]:
    """The claims of the template ops (everything but elementwise kernels), named ``prefix + op``:
    the same for every language :class:`ShaderProgram` lowers to (GLSL, HLSL, WGSL)."""
    from ..records import KernelClaim

    def claim(op: str, dtypes: frozenset[DType] | None, **kw: Any) -> KernelClaim:
        kw.setdefault("predicate", _rank_ok)
        return KernelClaim(op, f"{prefix}{op}", dtypes=dtypes, **kw)

    return [
        claim("matmul", W4,
              constraint=f"tiled shared-memory {language} kernel (16x16, or register-blocked 64-128 tiles "
                         "where the target opts in; untiled on CPU devices)"),
        claim("linear", F32, constraint="one kernel: GEMM with the (pre-transposed constant) weight + bias"),
        claim("softmax", F32, predicate=_last_axis, constraint="last axis"),
        claim("log_softmax", F32, predicate=_last_axis, constraint="last axis"),
        claim("layer_norm", F32),
        claim("reduce_sum", W4), claim("reduce_prod", W4), claim("reduce_mean", F32),
        claim("reduce_max", W4), claim("reduce_min", W4),
        claim("argmax", W4, out_dtypes=frozenset({DType.I64}), constraint="first extreme; NaN wins"),
        claim("argmin", W4, out_dtypes=frozenset({DType.I64}), constraint="first extreme; NaN wins"),
        claim("conv2d", W4, constraint="direct NCHW x OIHW (strides, pads, dilations, groups)"),
        claim("cumsum", W4, constraint="sequential per line, like the reference"),
        claim("reshape", MOVE, in_place=True), claim("transpose", MOVE), claim("expand", MOVE),
        claim("slice", MOVE), claim("concat", W8), claim("pad", W4),
        claim("gather", W8 | INDEX, out_dtypes=W8),
        claim("iota", frozenset({DType.F32, DType.I32, DType.I64}), out_dtypes=frozenset(
            {DType.F32, DType.I32, DType.I64}), constraint="f32/i32/i64"),
    ]


def claims(fl: GlslFlavour, prefix: str, wide: Callable[[], bool]) -> list[Any]:
    """The claim list of a backend running this library in flavour ``fl``, claim names
    ``prefix + op``: f32 (plus i32/bool, and i64 where natural) elementwise ops and fused programs
    that render, and every template op. ``wide()`` says whether the device runs 64-bit integer and
    double arithmetic in shaders (i64 values, Payne-Hanek sin/cos, the accurate pow)."""
    from .claims import elementwise_claims, fused_claim

    pred = elementwise_predicate(fl, wide)
    wide_dts = GEN | {DType.I64}
    cast = {"dtypes": wide_dts, "out_dtypes": wide_dts, "constraint": "i64 results only from integers/bool"}
    out: list[Any] = elementwise_claims(prefix, wide_dts, pred, overrides={"cast": cast})
    out.append(fused_claim(f"{prefix}fused_elementwise", pred,
                           constraint="f32/i32/bool programs the shared GLSL renderer can emit"))
    return out + template_claims(prefix, "GLSL")


__all__ = ["ATT_MASKS", "ATT_MASK_DTYPES", "GEMM_TILES", "GLSL", "GLSL64", "GLSL_FLAVOURS", "GlslFlavour",
           "GlslProgram", "OPENGL", "ShaderProgram", "TEMPLATES", "VULKAN", "WG", "argext", "attention_wg",
           "bstrides", "claims", "conv2d", "copy32", "copy8", "cstrides", "elementwise",
           "elementwise_predicate", "fill32", "gather", "header", "iota", "linear", "matmul", "matmul_4x4",
           "matmul_simple", "matmul_tiled", "meta_block", "reduce", "reduce_wg", "rows", "rows_wg", "scan",
           "template_claims"]
