"""Metal Shading Language source for rlx-metal's kernels. Pure Python.

Every kernel has the same calling convention, so one launcher serves them all (Apple GPU or host):
its device buffers in order (inputs, then the output), then ``constant int* P`` (the launch's
integer parameters: ``P[0]`` is the grid size, one thread per output element or row), then
``uint gid [[thread_position_in_grid]]``. Shapes are launch parameters, not source constants, so
one compiled kernel serves every shape.

* **Elementwise** (single MIR ops and ``fused_elementwise``): the body comes from the shared
  renderer (:func:`rlx_core.codegen.render_program`, dialect ``"metal"``); the skeleton computes
  each input's (broadcast, strided) offset from the output index.
* **Templates**: batched broadcasting ``matmul``, ``reduce_sum/mean/max/min`` over any axes,
  ``softmax``/``log_softmax``/``layer_norm`` rows, a strided copy (reshape, transpose, expand,
  slice, concat, pad), a fill (pad) and ``gather``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

from rlx_core.plugin import DType, IRError, render_program
from rlx_core.plugin import decode_fused as decode

#: MSL type per dtype the kernels handle.
MSL_TYPES: dict[DType, str] = {DType.F32: "float", DType.I32: "int", DType.I64: "long", DType.BOOL: "bool"}
HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"


def _name(prefix: str, body: str) -> str:
    return f"{prefix}_{hashlib.sha256(body.encode()).hexdigest()[:16]}"


def _sig(name: str, bufs: Sequence[str]) -> str:
    params = [f"{b} [[buffer({k})]]" for k, b in enumerate(bufs)]
    params.append(f"constant int* P [[buffer({len(bufs)})]]")
    params.append("uint gid [[thread_position_in_grid]]")
    return f"kernel void {name}(" + ", ".join(params) + ")"


def _ty(dt: DType) -> str:
    try:
        return MSL_TYPES[dt]
    except KeyError:
        raise IRError(f"rlx-metal kernels do not handle {dt}", fix="cast to f32/i32/bool first") from None


def literal(v: float | int | bool, dt: DType) -> str:
    if dt is DType.BOOL:
        return "true" if bool(v) else "false"
    if dt is DType.F32:
        s = repr(float(v))
        return {"inf": "INFINITY", "-inf": "(-INFINITY)", "nan": "NAN"}.get(s, s + "f")
    return str(int(v))


# -- elementwise ----------------------------------------------------------------------------------

@lru_cache(maxsize=4096)
def elementwise_source(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> tuple[str, str]:
    """``(kernel name, MSL)``. P = [n, rank, dims[rank], strides of input k[rank] for each k]."""
    bufs = [f"device const {_ty(dt)}* x{k}" for k, dt in enumerate(in_dtypes)]
    bufs.append(f"device {_ty(out_dtype)}* y")
    ni = len(in_dtypes)
    names = [f"a{k}" for k in range(ni)]
    lines, res, _ = render_program(program, names, list(in_dtypes), "metal")
    body = ["  const int n = P[0];", "  if ((int)gid >= n) return;", "  const int R = P[1];"]
    if ni:
        body.append("  int " + ", ".join(f"o{k} = 0" for k in range(ni)) + ";")
        body.append("  int r = (int)gid;")
        body.append("  for (int d = R - 1; d >= 0; --d) {")
        body.append("    const int c = r % P[2 + d]; r /= P[2 + d];")
        body.append("    " + " ".join(f"o{k} += c * P[2 + R * {k + 1} + d];" for k in range(ni)))
        body.append("  }")
    for k, dt in enumerate(in_dtypes):
        body.append(f"  const {_ty(dt)} a{k} = x{k}[o{k}];")
    body += ["  " + ln for ln in lines]
    body.append(f"  y[gid] = ({_ty(out_dtype)})({res});")
    text = "\n".join(body)
    name = _name("rlx_ew", ",".join(bufs) + text)
    return name, f"{_sig(name, bufs)} {{\n{text}\n}}\n"


def program_ops(program: str) -> list[tuple[str, list[str], dict]]:
    return decode(program)[0]


# -- matmul ---------------------------------------------------------------------------------------

@lru_cache(maxsize=8)
def matmul_source(dt: DType) -> tuple[str, str]:
    """P = [n, M, N, K, R, batch dims[R], a batch strides[R], b batch strides[R]] (elements)."""
    t = _ty(dt)
    name = f"rlx_matmul_{dt.value}"
    acc = "float" if dt is DType.F32 else t
    src = f"""{_sig(name, [f"device const {t}* a", f"device const {t}* b", f"device {t}* y"])} {{
  const int n = P[0];
  if ((int)gid >= n) return;
  const int M = P[1], N = P[2], K = P[3], R = P[4];
  const int j = (int)gid % N, i = ((int)gid / N) % M;
  int bi = (int)gid / (M * N), oa = 0, ob = 0;
  for (int d = R - 1; d >= 0; --d) {{
    const int c = bi % P[5 + d]; bi /= P[5 + d];
    oa += c * P[5 + R + d]; ob += c * P[5 + 2 * R + d];
  }}
  device const {t}* ar = a + oa + i * K;
  device const {t}* bc = b + ob + j;
  {acc} s = 0;
  for (int k = 0; k < K; ++k) s += ar[k] * bc[k * N];
  y[gid] = ({t})s;
}}
"""
    return name, src


# -- reductions -----------------------------------------------------------------------------------

@lru_cache(maxsize=32)
def reduce_source(kind: str, dt: DType) -> tuple[str, str]:
    """One thread per output element. P = [n, KR, kept dims[KR], kept strides[KR], RR, reduced
    dims[RR], reduced strides[RR], count]."""
    t = _ty(dt)
    name = f"rlx_reduce_{kind}_{dt.value}"
    acc = "float" if dt is DType.F32 else t
    init = {"sum": "0", "mean": "0", "max": "-INFINITY", "min": "INFINITY"}[kind]
    if kind in ("sum", "mean"):
        step = "s += v;"
    else:
        cmp = ">" if kind == "max" else "<"
        step = f"s = (v {cmp} s || v != v) ? v : s;"
    fin = "s / (float)cnt" if kind == "mean" else "s"
    src = f"""{_sig(name, [f"device const {t}* x", f"device {t}* y"])} {{
  const int n = P[0];
  if ((int)gid >= n) return;
  const int KR = P[1];
  int r = (int)gid, base = 0;
  for (int d = KR - 1; d >= 0; --d) {{
    const int c = r % P[2 + d]; r /= P[2 + d]; base += c * P[2 + KR + d];
  }}
  const int RR = P[2 + 2 * KR];
  constant int* rd = P + 3 + 2 * KR;
  const int cnt = rd[2 * RR];
  {acc} s = {init};
  for (int e = 0; e < cnt; ++e) {{
    int q = e, off = base;
    for (int d = RR - 1; d >= 0; --d) {{ const int c = q % rd[d]; q /= rd[d]; off += c * rd[RR + d]; }}
    const {acc} v = x[off];
    {step}
  }}
  y[gid] = ({t})({fin});
}}
"""
    return name, src


# -- rows -----------------------------------------------------------------------------------------

@lru_cache(maxsize=8)
def softmax_source(log: bool) -> tuple[str, str]:
    """One thread per row. P = [rows, n]."""
    name = f"rlx_{'log_' if log else ''}softmax_f32"
    if log:
        out = "for (int j = 0; j < n; ++j) yr[j] = (xr[j] - m) - metal::precise::log(s);"
    else:
        out = "for (int j = 0; j < n; ++j) yr[j] = metal::precise::exp(xr[j] - m) / s;"
    src = f"""{_sig(name, ["device const float* x", "device float* y"])} {{
  const int rows = P[0], n = P[1];
  if ((int)gid >= rows) return;
  device const float* xr = x + (int)gid * n;
  device float* yr = y + (int)gid * n;
  float m = -INFINITY;
  for (int j = 0; j < n; ++j) m = (xr[j] > m || xr[j] != xr[j]) ? xr[j] : m;
  float s = 0;
  for (int j = 0; j < n; ++j) s += metal::precise::exp(xr[j] - m);
  {out}
}}
"""
    return name, src


@lru_cache(maxsize=64)
def layer_norm_source(eps: float) -> tuple[str, str]:
    """One thread per row, two-pass statistics. P = [rows, n]."""
    body = f"""  const int rows = P[0], n = P[1];
  if ((int)gid >= rows) return;
  device const float* xr = x + (int)gid * n;
  device float* yr = y + (int)gid * n;
  float mu = 0;
  for (int j = 0; j < n; ++j) mu += xr[j];
  mu /= (float)n;
  float var = 0;
  for (int j = 0; j < n; ++j) {{ const float d = xr[j] - mu; var += d * d; }}
  var /= (float)n;
  const float rstd = 1.0f / metal::precise::sqrt(var + {literal(eps, DType.F32)});
  for (int j = 0; j < n; ++j) yr[j] = ((xr[j] - mu) * rstd) * g[j] + b[j];
"""
    bufs = ["device const float* x", "device const float* g", "device const float* b", "device float* y"]
    name = _name("rlx_layer_norm_f32", body)
    return name, f"{_sig(name, bufs)} {{\n{body}}}\n"


# -- data movement --------------------------------------------------------------------------------

@lru_cache(maxsize=8)
def copy_source(dt: DType) -> tuple[str, str]:
    """y[yo + sum c_d*ys_d] = x[xo + sum c_d*xs_d] over the out dims. P = [n, R, yo, xo, dims[R],
    y strides[R], x strides[R]] (elements, strides may be negative or 0)."""
    t = _ty(dt)
    name = f"rlx_copy_{dt.value}"
    src = f"""{_sig(name, [f"device const {t}* x", f"device {t}* y"])} {{
  const int n = P[0];
  if ((int)gid >= n) return;
  const int R = P[1];
  int r = (int)gid, oy = P[2], ox = P[3];
  for (int d = R - 1; d >= 0; --d) {{
    const int c = r % P[4 + d]; r /= P[4 + d];
    oy += c * P[4 + R + d]; ox += c * P[4 + 2 * R + d];
  }}
  y[oy] = x[ox];
}}
"""
    return name, src


@lru_cache(maxsize=256)
def fill_source(dt: DType, value: str) -> tuple[str, str]:
    """y[i] = value. P = [n]."""
    t = _ty(dt)
    body = f"  if ((int)gid >= P[0]) return;\n  y[gid] = ({t})({value});\n"
    name = _name(f"rlx_fill_{dt.value}", body)
    return name, f"{_sig(name, [f'device {t}* y'])} {{\n{body}}}\n"


@lru_cache(maxsize=32)
def gather_source(dt: DType, idt: DType) -> tuple[str, str]:
    """y[o, j, i] = x[o, idx[j] (wrapped once if negative), i]. P = [n, nidx, inner, axis_len].

    Indices follow ONNX ([-len, len-1]); one outside (only possible when computed on the device:
    the host checks inputs and constants) gives 0 and reads nothing. The check is in 64 bits so an
    i64 index is not truncated into range first (2**32 + 1 must not become 1)."""
    t, it = _ty(dt), _ty(idt)
    name = f"rlx_gather_{dt.value}_{idt.value}"
    src = f"""{_sig(name, [f"device const {t}* x", f"device const {it}* idx", f"device {t}* y"])} {{
  const int n = P[0];
  if ((int)gid >= n) return;
  const int nidx = P[1], inner = P[2], len = P[3];
  const int ii = (int)gid % inner, q = (int)gid / inner, j = q % nidx, o = q / nidx;
  long k = (long)idx[j];
  if (k < 0) k += len;
  y[gid] = (k >= 0 && k < len) ? x[(o * len + (int)k) * inner + ii] : ({t})0;
}}
"""
    return name, src


def module(sources: Sequence[str]) -> str:
    """One MSL translation unit holding ``sources`` (each kernel once)."""
    return HEADER + "\n" + "\n".join(dict.fromkeys(sources))


@lru_cache(maxsize=8)
def iota_source(dt: DType) -> tuple[str, str]:
    """y[i] = coordinate of i along the axis. P = [n, axis_len, inner]."""
    t = _ty(dt)
    name = f"rlx_iota_{dt.value}"
    src = f"""{_sig(name, [f"device {t}* y"])} {{
  if ((int)gid >= P[0]) return;
  y[gid] = ({t})(((int)gid / P[2]) % P[1]);
}}
"""
    return name, src
