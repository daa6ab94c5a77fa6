"""The device kit's HLSL compute-shader library (Shader Model 5/6 syntax, Vulkan bindings): the GLSL
library's resources, lowering and claims (:mod:`.glsl`) in the language DirectX targets speak.

Every shader sees the same three storage buffers as the GLSL library: the arena
(``[[vk::binding(0)]] RWStructuredBuffer<uint> A``), the constants (binding 1, ``W``) and the
program's launch parameters (binding 2, ``M``), plus the push constant ``pc``: ``pc.base`` (where the
dispatch's parameters start in ``M``) and ``pc.gx`` (its workgroup count along x: HLSL has no
``NumWorkGroups``). Offsets travel as parameters, as in :mod:`.glsl`.

Elementwise kernels and fused programs are rendered natively by the shared renderer
(:func:`rlx_core.codegen.render_program`, the ``"hlsl"`` dialect with this library's helpers:
:data:`HLSL`). The other kernels (matmul, reductions, row kernels, scans, arg-extrema, conv2d,
movement) are the GLSL library's templates, lowered by :class:`glsl.GlslProgram` and translated
to HLSL by :func:`translate`: a fixed table (bit casts, vector types, built-in IDs, group-shared
memory, barriers, the entry point), so the two libraries cannot drift apart; a template using
anything outside the table is refused with the construct named. A target is this library plus a
runtime: rlx-directx compiles the HLSL to SPIR-V with glslang's HLSL front end and runs it on the
kit's Vulkan runtime (:mod:`.vulkan`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from ..codegen.render import DIALECTS, render_program
from ..dtypes import DType
from ..errors import IRError
from ..lir import Program
from . import glsl
from .program import Allocator, Runtime

WG = glsl.WG
#: i64 values are ``uint2`` (low word, high word): glslang's HLSL front end has no usable int64_t
TYPES = {DType.F32: "float", DType.I32: "int", DType.BOOL: "bool", DType.I64: "uint2"}
ESIZE = {DType.F32: 4, DType.I32: 4, DType.BOOL: 1, DType.I64: 8}

# Helpers as in the GLSL library (its HEADER): the reference's integer division, IEEE exp/log
# special values, a saturating tanh that passes NaN. rd() branches: HLSL's ?: evaluates both sides,
# and the buffer not named may be shorter than the address.
HEADER = """[[vk::binding(0, 0)]] RWStructuredBuffer<uint> A : register(u0);
[[vk::binding(1, 0)]] StructuredBuffer<uint> W : register(t1);
[[vk::binding(2, 0)]] StructuredBuffer<int> M : register(t2);
struct RlxParams { int base; uint gx; };
[[vk::push_constant]] ConstantBuffer<RlxParams> pc;
uint rd(int b, uint a) { if (b == 0) return A[a >> 2]; return W[a >> 2]; }
float ldf(int b, uint a) { return asfloat(rd(b, a)); }
int ldi(int b, uint a) { return int(rd(b, a)); }
bool ldb(int b, uint a) { return ((rd(b, a) >> ((a & 3u) * 8u)) & 0xffu) != 0u; }
float rlx_inf() { return asfloat(0x7f800000u); }
float rlx_nan() { return asfloat(0x7fc00000u); }
int rlx_idiv(int a, int b) {
  if (b == 0) return 0;
  uint q = uint(abs(a)) / uint(abs(b));
  int s = ((a > 0) == (b > 0) || a == 0) ? 1 : -1;
  return int(q) * s;
}
float rlx_tanh(float x) {
  if (x != x) return x;
  if (abs(x) > 15.0) return x > 0.0 ? 1.0 : -1.0;
  return tanh(x);
}
float rlx_exp(float x) {
  if (x != x) return x;
  if (x > 88.8) return rlx_inf();
  if (x < -104.0) return 0.0;
  return exp(x);
}
float rlx_log(float x) {
  if (x != x) return x;
  if (x < 0.0) return rlx_nan();
  if (x == 0.0) return -rlx_inf();
  if (isinf(x)) return x;
  return log(x);
}
"""


def header() -> str:
    """The common prologue of every shader: bindings, push constants and the shared helpers."""
    return HEADER


def entry(wx: int = WG, wy: int = 1) -> str:
    """The entry point's declaration (the IDs under the names :func:`translate` gives them)."""
    return (f"[numthreads({wx}, {wy}, 1)]\nvoid main(uint3 rlx_gid : SV_DispatchThreadID, "
            "uint3 rlx_wg : SV_GroupID, uint3 rlx_lid : SV_GroupThreadID) {")


_HLSL = DIALECTS["hlsl"]
#: built-ins replaced by the helpers in :data:`HEADER` and :data:`WIDE` (drivers' built-ins differ
#: on special values and lose accuracy for large sin/cos arguments)
HELPERS = {"exp": "rlx_exp", "log": "rlx_log", "tanh": "rlx_tanh", "sin": "rlx_sin", "cos": "rlx_cos",
           "pow": "rlx_pow"}

#: sin/cos/pow as the GLSL library computes them (its WIDE helpers): Payne-Hanek reduction by 2/pi,
#: here with 32-bit words (16-bit partial products: no 64-bit integers in glslang's HLSL) and a
#: double for the reduced angle (the device's shaderFloat64), then Cephes polynomials on
#: [-pi/4, pi/4]; pow through a double log2 product, with frexp/ldexp done on the bits (powers of
#: two as bit patterns: ldexp gave inf on glslang 12 + lavapipe). Branches rather than ?: where an
#: operand would index past an array.
WIDE = """static const uint TWO_OVER_PI[10] = {
  0xA2F9836Eu, 0x4E441529u, 0xFC2757D1u, 0xF534DDC0u, 0xDB629599u,
  0x3C439041u, 0xFE5163ABu, 0xDEBBC561u, 0xB7246E3Au, 0x424DD2E0u};
uint rlx_bits32(int j) {  // bits j..j+31 of 2/pi (bit j has weight 2^-j; bits j <= 0 are 0)
  int p = j - 1;
  if (p < 0) { int n = -p; if (n >= 32) return 0u; return TWO_OVER_PI[0] >> uint(n); }
  int w = p >> 5; uint o = uint(p & 31);
  uint hi = 0u, lo = 0u;
  if (w < 10) hi = TWO_OVER_PI[w];
  if (w + 1 < 10) lo = TWO_OVER_PI[w + 1];
  if (o == 0u) return hi;
  return (hi << o) | (lo >> (32u - o));
}
uint2 rlx_mul32(uint a, uint b) {  // the full 64-bit product (low, high)
  uint a0 = a & 0xffffu, a1 = a >> 16, b0 = b & 0xffffu, b1 = b >> 16;
  uint p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0;
  uint mid = (p00 >> 16) + (p01 & 0xffffu) + (p10 & 0xffffu);
  return uint2((p00 & 0xffffu) | (mid << 16), a1 * b1 + (p01 >> 16) + (p10 >> 16) + (mid >> 16));
}
// |x| * 2/pi mod 4 exactly: quadrant q and the angle r in [-pi/4, pi/4]
float rlx_reduce(float x, out int q) {
  uint u = asuint(abs(x));
  int E = int(u >> 23); uint mant = (u & 0x7fffffu) | (E > 0 ? 0x800000u : 0u);
  if (E == 0) E = 1;
  int j0 = E - 152;
  uint2 p = rlx_mul32(mant, rlx_bits32(j0 + 33));
  p.y += mant * rlx_bits32(j0 + 1);
  uint t = rlx_mul32(mant, rlx_bits32(j0 + 65)).y;
  uint lo = p.x + t; uint hi = p.y + (lo < p.x ? 1u : 0u);
  q = int(hi >> 30);
  double f = double(hi & 0x3fffffffu) * 9.313225746154785e-10L + double(lo) * 2.168404344971009e-19L;
  if (f >= 0.5L) { f -= 1.0L; q += 1; }
  return float(f * 1.5707963267948966192L);
}
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
float rlx_p2(int k) { return asfloat(uint(k + 127) << 23); }  // 2^k for k in [-126, 127]
float rlx_pow(float a, float b) {
  if (b == 0.0 || a == 1.0) return 1.0;
  if (isnan(a) || isnan(b)) return rlx_nan();
  if (isinf(b)) {
    float am = abs(a); if (am == 1.0) return 1.0;
    return ((am > 1.0) == (b > 0.0)) ? rlx_inf() : 0.0;
  }
  bool bint = floor(b) == b; bool odd = bint && fmod(abs(b), 2.0) == 1.0;
  bool neg = (asuint(a) >> 31) != 0u;
  if (neg && a != 0.0 && !isinf(a) && !bint) return rlx_nan();
  float m = abs(a); float r;
  if (m == 0.0) r = b > 0.0 ? 0.0 : rlx_inf();
  else if (isinf(m)) r = b > 0.0 ? rlx_inf() : 0.0;
  else {
    uint u = asuint(m); int e = 0;
    if ((u >> 23) == 0u) { u = asuint(m * 16777216.0); e = -24; }  // subnormal: scaled by 2^24
    e += int(u >> 23) - 126;
    float fm = asfloat((u & 0x7fffffu) | 0x3f000000u);  // m = fm * 2^e, fm in [0.5, 1)
    double t = double(b) * double(e) + double(b * log2(fm));
    if (t >= 131.0L) r = rlx_inf();
    else if (t < -160.0L) r = 0.0;
    else {
      int ni = int(t); if (double(ni) > t) ni -= 1;  // floor(t)
      float x = exp2(float(t - double(ni)));
      if (ni > 127) r = x * rlx_p2(127) * rlx_p2(ni - 127);
      else if (ni < -120) r = x * rlx_p2(ni + 60) * rlx_p2(-60);  // one rounding into subnormals
      else r = x * rlx_p2(ni);
    }
  }
  return neg && odd ? -r : r;
}
"""


def _math(op: str, dt: DType) -> str:
    if op == "pow" and not dt.is_float:
        raise IRError("integer pow has no HLSL rule", fix="compute pow in f32")
    return HELPERS.get(op) or _HLSL.math(op, dt)


def _rule(op: str, args: Sequence[str], in_types: Sequence[DType], out: DType, attrs: dict) -> str | None:
    if op == "cast" and out is DType.BOOL and in_types[0] is DType.BOOL:
        return args[0]
    return None


#: i64 arithmetic on (low, high) word pairs, two's complement (wrap-around as the reference), in
#: sources with an i64 value only. l_mul: the low 64 bits from 16-bit partial products (HLSL has no
#: 32x32->64 multiply).
I64_HELPERS = """uint2 ldl(int b, uint a) { return uint2(rd(b, a), rd(b, a + 4u)); }
uint2 l_add(uint2 a, uint2 b) { uint lo = a.x + b.x; return uint2(lo, a.y + b.y + (lo < a.x ? 1u : 0u)); }
uint2 l_neg(uint2 a) { return l_add(uint2(~a.x, ~a.y), uint2(1u, 0u)); }
uint2 l_sub(uint2 a, uint2 b) { return l_add(a, l_neg(b)); }
uint2 l_mul(uint2 a, uint2 b) {
  uint a0 = a.x & 0xffffu, a1 = a.x >> 16, b0 = b.x & 0xffffu, b1 = b.x >> 16;
  uint p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0;
  uint mid = (p00 >> 16) + (p01 & 0xffffu) + (p10 & 0xffffu);
  uint hi = a1 * b1 + (p01 >> 16) + (p10 >> 16) + (mid >> 16) + a.x * b.y + a.y * b.x;
  return uint2((p00 & 0xffffu) | (mid << 16), hi);
}
bool l_eq(uint2 a, uint2 b) { return a.x == b.x && a.y == b.y; }
bool l_lt(uint2 a, uint2 b) {
  if (a.y != b.y) return int(a.y) < int(b.y);
  return a.x < b.x;
}
uint2 l_sel(bool c, uint2 a, uint2 b) { if (c) return a; return b; }
uint2 l_max(uint2 a, uint2 b) { if (l_lt(a, b)) return b; return a; }
uint2 l_min(uint2 a, uint2 b) { if (l_lt(b, a)) return b; return a; }
uint2 l_of(int x) { return uint2(uint(x), x < 0 ? 0xffffffffu : 0u); }
// i64 -> f32 rounded once (to nearest even): the top 32 bits from the leading one, the bits below
// folded into bit 0 (below the rounding bit), converted, scaled by a power of two (exact)
float l_tof(uint2 a) {
  bool neg = int(a.y) < 0;
  uint2 m = l_sel(neg, l_neg(a), a);
  if (m.y == 0u) return neg ? -float(m.x) : float(m.x);
  uint sh = 31u - firstbithigh(m.y);
  uint v = m.y;
  if (sh != 0u) v = (m.y << sh) | (m.x >> (32u - sh));
  if ((m.x << sh) != 0u) v |= 1u;
  // times 2^(32-sh) written by its bits: ldexp gave inf here (glslang 12, lavapipe)
  float r = float(v) * asfloat((127u + 32u - sh) << 23);
  return neg ? -r : r;
}
"""
_L_BINARY = {"add": "l_add({a}, {b})", "sub": "l_sub({a}, {b})", "mul": "l_mul({a}, {b})",
             "maximum": "l_max({a}, {b})", "minimum": "l_min({a}, {b})", "equal": "l_eq({a}, {b})",
             "not_equal": "(!l_eq({a}, {b}))", "less": "l_lt({a}, {b})", "greater": "l_lt({b}, {a})",
             "less_equal": "(!l_lt({b}, {a}))", "greater_equal": "(!l_lt({a}, {b}))"}


def _rule64(op: str, args: Sequence[str], in_types: Sequence[DType], out: DType, attrs: dict
            ) -> str | None:
    """i64 values as ``uint2``: every op touching one becomes a helper call, or is refused."""
    if out is not DType.I64 and DType.I64 not in in_types:
        return _rule(op, args, in_types, out, attrs)
    if op == "cast":
        src = in_types[0]
        if src is DType.I64:
            conv = {DType.I64: args[0], DType.I32: f"int({args[0]}.x)", DType.F32: f"l_tof({args[0]})",
                    DType.BOOL: f"(({args[0]}.x | {args[0]}.y) != 0u)"}
        else:
            conv = {DType.I64: {DType.I32: f"l_of({args[0]})",
                                DType.BOOL: f"uint2({args[0]} ? 1u : 0u, 0u)"}.get(src, "")}
        expr = conv.get(out, "")
        if expr:
            return expr
    elif op == "neg":
        return f"l_neg({args[0]})"
    elif op == "where":
        return f"l_sel({args[0]}, {args[1]}, {args[2]})"
    elif op in _L_BINARY and len(args) == 2:
        return _L_BINARY[op].format(a=args[0], b=args[1])
    sig = "/".join(str(t) for t in in_types)
    raise IRError(f"{op} on {sig} -> {out} has no HLSL rule for i64 (word pairs)", fix="compute in i32/f32")


#: The shared HLSL dialect with this library's helpers: ``rlx_*`` math, integer division as the
#: reference defines it (``rlx_idiv``), the bool->bool cast.
HLSL = dataclasses.replace(_HLSL, math=_math, idiv="rlx_idiv({a}, {b})", rule=_rule)
#: :data:`HLSL` plus i64 values as ``uint2`` word pairs (:data:`I64_HELPERS`), for programs with an
#: i64 value: add/sub/mul/neg/maximum/minimum/where/comparisons and integer/bool casts.
HLSL64 = dataclasses.replace(HLSL, types={**_HLSL.types, DType.I64: "uint2"}, rule=_rule64)


def load(dt: DType, b: str, a: str) -> str:
    return {DType.F32: "ldf", DType.I32: "ldi", DType.BOOL: "ldb", DType.I64: "ldl"}[dt] + f"({b}, {a})"


@lru_cache(maxsize=4096)
def elementwise(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str:
    """Meta as :func:`glsl.elementwise`: n, rank, out_off, 0, shape[rank], then per input: buf, off,
    strides[rank]. f32/i32/bool, and i64 values (``uint2`` word pairs) where the program has one."""
    nin = len(in_dtypes)
    for dt in (*in_dtypes, out_dtype):
        if dt not in TYPES:
            raise IRError(f"no HLSL storage for {dt} in this library", fix="compute in f32/i32/bool")
    i64 = DType.I64 in in_dtypes or out_dtype is DType.I64
    lines, res, rdt = render_program(program, [f"x{k}" for k in range(nin)], in_dtypes,
                                     HLSL64 if i64 else HLSL)
    if rdt is not out_dtype:
        raise IRError(f"program yields {rdt}, the node {out_dtype}", fix="check the fused program")
    ot = TYPES[out_dtype]
    trig = any(re.search(r"rlx_(sin|cos|pow)\(", ln) for ln in lines)
    src = [header() + (I64_HELPERS if i64 else "") + (WIDE if trig else ""), f"{ot} value_at(uint i) {{",
           "  int B = pc.base; int rank = M[B + 1];"]
    src += [f"  int e{k} = 0; int p{k} = B + 4 + rank + {k} * (rank + 2);" for k in range(nin)]
    src += ["  uint rem = i;", "  for (int d = rank - 1; d >= 0; --d) {",
            "    uint s = uint(M[B + 4 + d]); int c = int(rem % s); rem /= s;"]
    src += [f"    e{k} += c * M[p{k} + 2 + d];" for k in range(nin)]
    src += ["  }"]
    for k, dt in enumerate(in_dtypes):
        addr = f"uint(M[p{k} + 1]) + uint(e{k}) * {ESIZE[dt]}u"
        src.append(f"  {TYPES[dt]} x{k} = {load(dt, f'M[p{k}]', addr)};")
    src += ["  " + ln for ln in lines] + [f"  return {res};", "}", entry()]
    src += ["  uint n = uint(M[pc.base]); uint o = uint(M[pc.base + 2]) >> 2;",
            f"  uint stride = pc.gx * {WG}u;"]
    if out_dtype is DType.BOOL:  # && does not short-circuit in HLSL: value_at(i) only for i < n
        src += ["  for (uint t = rlx_gid.x; t < (n + 3u) / 4u; t += stride) {",
                "    uint w = 0u;",
                "    for (uint k = 0u; k < 4u; ++k) { uint i = 4u * t + k;",
                "      if (i < n) { if (value_at(i)) w |= 1u << (8u * k); } }",
                "    A[o + t] = w;", "  }", "}"]
    elif out_dtype is DType.I64:
        src += ["  for (uint i = rlx_gid.x; i < n; i += stride) {",
                "    uint2 v = value_at(i); A[o + 2u * i] = v.x; A[o + 2u * i + 1u] = v.y;", "  }", "}"]
    else:
        st = "asuint(v)" if out_dtype is DType.F32 else "uint(v)"
        src += ["  for (uint i = rlx_gid.x; i < n; i += stride) {",
                f"    {ot} v = value_at(i); A[o + i] = {st};", "  }", "}"]
    return "\n".join(src) + "\n"


#: The GLSL flavour the templates are written in before :func:`translate` (never compiled as GLSL).
SOURCE = glsl.GlslFlavour("hlsl-source", "#version 450", "set = 0, ",
                          "layout(push_constant) uniform PC { int base; } pc;")

#: GLSL -> HLSL, applied in order to a template's body (words only: ``\b`` on both sides)
_WORDS = [
    ("uintBitsToFloat", "asfloat"), ("intBitsToFloat", "asfloat"), ("floatBitsToUint", "asuint"),
    ("floatBitsToInt", "asint"), ("uvec4", "uint4"), ("ivec4", "int4"), ("vec4", "float4"),
    ("ivec2", "int2"), ("gl_GlobalInvocationID", "rlx_gid"), ("gl_WorkGroupID", "rlx_wg"),
    ("gl_LocalInvocationID", "rlx_lid"), ("shared", "groupshared"), ("roundEven", "round"),
]
_WORD_RE = re.compile(r"\b(" + "|".join(g for g, _ in _WORDS) + r")\b")
_WORD_MAP = dict(_WORDS)
_LAYOUT = re.compile(r"layout\(local_size_x = (\d+), local_size_y = (\d+)\) in;")
#: GLSL constructs the table does not translate: a template using one is refused by name
_UNTRANSLATED = re.compile(r"\b(gl_\w+|packInt2x32|unpackInt2x32|int64_t|uint64_t|mix|fract|mod|"
                           r"atomic\w+|memoryBarrier\w*|#extension)\b|\d\.\d*LF\b")


@lru_cache(maxsize=1024)
def translate(src: str) -> str:
    """A GLSL library template (written in :data:`SOURCE`) as HLSL: the GLSL header replaced by
    :data:`HEADER`, then the :data:`_WORDS` table, ``gl_NumWorkGroups.x`` -> ``pc.gx``,
    ``barrier()`` -> ``GroupMemoryBarrierWithGroupSync()`` and ``void main()`` -> the HLSL entry with
    the template's workgroup size."""
    m = _LAYOUT.search(src)
    if m is None:
        raise IRError("a GLSL template without a workgroup size", where="hlsl.translate",
                      fix="write templates with glsl.header()")
    wx, wy = int(m.group(1)), int(m.group(2))
    head = glsl.header(SOURCE, wx, wy)
    if not src.startswith(head):
        raise IRError("a GLSL template whose prologue is not glsl.header() (own extensions or helpers)",
                      where="hlsl.translate", fix="translate only templates built on the plain header")
    body = src[len(head):].replace("gl_NumWorkGroups.x", "pc.gx").replace("barrier()",
                                                                        "GroupMemoryBarrierWithGroupSync()")
    bad = _UNTRANSLATED.search(body.replace("gl_GlobalInvocationID", "").replace("gl_WorkGroupID", "")
                               .replace("gl_LocalInvocationID", ""))
    if bad:
        raise IRError(f"the GLSL template uses {bad.group(0)!r}, which hlsl.translate has no rule for",
                      where="hlsl.translate",
                      fix="add the construct to hlsl._WORDS or write the kernel in HLSL")
    body = _WORD_RE.sub(lambda w: _WORD_MAP[w.group(1)], body)
    if body.count("void main() {") != 1:
        raise IRError("a GLSL template without exactly one main()", where="hlsl.translate",
                      fix="write templates with one entry point")
    return header() + body.replace("void main() {", entry(wx, wy))


class HlslProgram(glsl.GlslProgram):
    """The GLSL library's lowering (:class:`glsl.GlslProgram`) emitting HLSL: elementwise kernels
    rendered natively (:func:`elementwise`), every other template translated (:func:`translate`).
    The runtime loads HLSL sources; claim names are ``prefix + op``."""

    def __init__(self, program: Program, allocator: Allocator, runtime: Runtime, *, prefix: str,
                 cpu_device: bool, max_groups: int) -> None:
        super().__init__(program, allocator, runtime, SOURCE, prefix=prefix, cpu_device=cpu_device,
                         max_groups=max_groups)

    def source(self, name: str, *args: Any) -> str:
        if name == "elementwise":
            return elementwise(*args)
        return translate(super().source(name, *args))


# -- claims -----------------------------------------------------------------------------------------

GEN = frozenset({DType.F32, DType.I32, DType.BOOL})
_PREDICATES: dict[Callable[[], bool], Any] = {}


def elementwise_predicate(doubles: Callable[[], bool]) -> Any:
    """Elementwise ops and fused programs: f32/i32/bool/i64 storage, rank, then the HLSL render check
    (sin/cos/pow only where ``doubles()``: the device runs doubles in shaders; memoised per
    ``doubles``)."""
    pred = _PREDICATES.get(doubles)
    if pred is None:
        from .claims import all_of, dtypes_in, render_check, renders

        def source_ok(src: str) -> str | None:
            if "rlx_reduce" in src and not doubles():
                return "sin/cos/pow need doubles in shaders (shaderFloat64), which this device lacks"
            return None

        check = render_check(elementwise, "as HLSL", source_ok=source_ok)
        pred = _PREDICATES[doubles] = all_of(dtypes_in(GEN | {DType.I64}, "no HLSL storage for"),
                                             glsl._rank_ok, renders(check))
    return pred


def claims(prefix: str, doubles: Callable[[], bool], keep: Callable[[str], bool] = lambda op: True
           ) -> list[Any]:
    """The claim list of a backend running this library, claim names ``prefix + op``: elementwise ops
    and fused programs with the HLSL render check (sin/cos/pow only where ``doubles()``), and the GLSL
    library's template claims (the same lowering, translated); ``keep(op)`` filters template ops a
    target has not certified."""
    from .claims import elementwise_claims, fused_claim

    pred = elementwise_predicate(doubles)
    wide_dts = GEN | {DType.I64}
    cast = {"dtypes": wide_dts, "out_dtypes": wide_dts, "constraint": "i64 results only from integers/bool"}
    out: list[Any] = elementwise_claims(prefix, wide_dts, pred, overrides={"cast": cast})
    out.append(fused_claim(f"{prefix}fused_elementwise", pred,
                           constraint="f32/i32/bool (i64 where the device has it) programs the shared "
                                      "HLSL renderer can emit"))
    elementwise_ops = {c.op for c in out}
    for c in glsl.claims(SOURCE, prefix, doubles):
        if c.op not in elementwise_ops and c.op != "fused_elementwise" and keep(c.op):
            out.append(c)
    return out


__all__ = ["HEADER", "HLSL", "SOURCE", "WG", "HlslProgram", "claims", "elementwise", "elementwise_predicate",
           "entry", "header", "translate"]
