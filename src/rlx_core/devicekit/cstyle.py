"""One kernel library for every C-style device language (Metal, OpenCL, CUDA-like): templates,
lowering and claims, with the language as a :class:`KernelDialect` (tinygrad's "one renderer,
many dialects", for whole kernels).

Every kernel has one calling convention, so one launcher per runtime serves them all: its buffers
in order (inputs, then the output), then ``P``, the launch's integer parameters (``P[0]`` is the
grid: one thread per output element or row), then the thread index ``gid``. Shapes are launch
parameters, not source constants, so one compiled kernel serves every shape.

* **Elementwise** (single MIR ops and ``fused_elementwise``): the body comes from the shared
  renderer (:func:`rlx_core.codegen.render_program`); the skeleton computes each input's
  (broadcast, strided) offset from the output index.
* **Templates**: batched broadcasting ``matmul``, ``reduce_sum/mean/max/min`` over any axes,
  ``softmax``/``log_softmax``/``layer_norm`` rows, a strided copy (reshape, transpose, expand,
  slice, concat, pad), a fill (pad), ``gather`` and ``iota``.

A dialect says how a kernel is declared (qualifiers, attributes, how ``gid`` is obtained, how a
buffer arrives: as a pointer, or as a byte buffer plus an offset) and the names of its precise
math; a new C-style target is one :class:`KernelDialect` plus a runtime shim.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from ..codegen.render import render_program
from ..dtypes import DType
from ..errors import IRError
from ..fusion import decode
from ..ir.types import TensorType, normalize_axis
from ..lir import Step
from .claims import single_op_program
from .program import Launch

D = DType


@dataclass(frozen=True, eq=False)  # identity: dialects are singletons, and hashable for the memos
class KernelDialect:
    """How one C-style language declares a kernel. ``render`` names the shared renderer's dialect
    for elementwise bodies; ``storage`` overrides a dtype's type in buffers (OpenCL keeps bool as
    ``uchar``: kernel arguments may not point to bool)."""

    name: str
    render: str
    header: str
    #: value type per dtype
    types: Mapping[DType, str]
    #: address-space qualifier of device buffers and of the parameter block
    global_q: str
    const_q: str
    #: precise math: ``exp``/``log``/``sqrt`` -> the function to call
    math: Mapping[str, str]
    #: ``signature(name, params) -> text up to and including "{"``; params are full declarations
    signature: Callable[[str, Sequence[str], str], str]
    #: buffers arrive as ``(uchar* raw, int offset)`` pairs (no sub-buffer pointers in the API)
    byte_offsets: bool = False
    storage: Mapping[DType, str] = field(default_factory=dict)
    #: statements at the top of every kernel (e.g. ``const uint gid = get_global_id(0);``)
    prologue: str = ""

    def ty(self, dt: DType) -> str:
        try:
            return self.types[dt]
        except KeyError:
            raise IRError(f"{self.name} kernels do not handle {dt}",
                          fix="cast to f32/i32/bool first") from None

    def st(self, dt: DType) -> str:
        return self.storage.get(dt, self.ty(dt))

    def kernel(self, name: str, bufs: Sequence[tuple[DType, str, bool]]) -> str:
        """The kernel's header (signature, ``{``, prologue): ``bufs`` as ``(dtype, name, const)``."""
        params: list[str] = []
        unpack: list[str] = []
        for dt, nm, const in bufs:
            c = "const " if const else ""
            if self.byte_offsets:
                params += [f"{self.global_q} uchar* {nm}_raw", f"const int {nm}_off"]
                unpack.append(f"  {self.global_q} {c}{self.st(dt)}* {nm} = "
                              f"({self.global_q} {c}{self.st(dt)}*)({nm}_raw + {nm}_off);")
            else:
                params.append(f"{self.global_q} {c}{self.st(dt)}* {nm}")
        pblock = f"{self.const_q} int* P"
        head = self.signature(name, params, pblock)
        return "\n".join([head, *([self.prologue] if self.prologue else []), *unpack])

    def gptr(self, dt: DType, const: bool = True) -> str:
        return f"{self.global_q} {'const ' if const else ''}{self.st(dt)}*"


def _metal_signature(name: str, params: Sequence[str], pblock: str) -> str:
    ps = [f"{p} [[buffer({k})]]" for k, p in enumerate(params)]
    ps += [f"{pblock} [[buffer({len(params)})]]", "uint gid [[thread_position_in_grid]]"]
    return f"kernel void {name}(" + ", ".join(ps) + ") {"


def _opencl_signature(name: str, params: Sequence[str], pblock: str) -> str:
    return f"__kernel void {name}(" + ", ".join([*params, pblock]) + ") {"


METAL = KernelDialect(
    "metal", "metal", "#include <metal_stdlib>\nusing namespace metal;\n",
    {D.F32: "float", D.I32: "int", D.I64: "long", D.BOOL: "bool"}, "device", "constant",
    {f: f"metal::precise::{f}" for f in ("exp", "log", "sqrt")}, _metal_signature)

OPENCL = KernelDialect(
    "opencl", "opencl", "",
    {D.F32: "float", D.I32: "int", D.I64: "long", D.BOOL: "bool"}, "__global", "__constant",
    {f: f for f in ("exp", "log", "sqrt")}, _opencl_signature, byte_offsets=True,
    storage={D.BOOL: "uchar"}, prologue="  const uint gid = (uint)get_global_id(0);")

KERNEL_DIALECTS: dict[str, KernelDialect] = {"metal": METAL, "opencl": OPENCL}


def kernel_name(source: str) -> str:
    """The kernel's function name (every source holds one kernel)."""
    for kw in ("kernel void ", "__kernel void "):
        if kw in source:
            return source.split(kw, 1)[1].split("(", 1)[0].strip()
    raise IRError("no kernel in the generated source", fix="report this bug")


def _name(prefix: str, body: str) -> str:
    return f"{prefix}_{hashlib.sha256(body.encode()).hexdigest()[:16]}"


def literal(v: float | int | bool, dt: DType) -> str:
    if dt is DType.BOOL:
        return "true" if bool(v) else "false"
    if dt is DType.F32:
        s = repr(float(v))
        return {"inf": "INFINITY", "-inf": "(-INFINITY)", "nan": "NAN"}.get(s, s + "f")
    return str(int(v))


def module(kd: KernelDialect, sources: Sequence[str]) -> str:
    """One translation unit holding ``sources`` (each kernel once)."""
    return kd.header + "\n" + "\n".join(dict.fromkeys(sources))


# -- elementwise ----------------------------------------------------------------------------------

@lru_cache(maxsize=4096)
def elementwise_source(kd: KernelDialect, program: str, in_dtypes: tuple[DType, ...],
                       out_dtype: DType) -> tuple[str, str]:
    """``(kernel name, source)``. P = [n, rank, dims[rank], strides of input k[rank] for each k]."""
    bufs = [(dt, f"x{k}", True) for k, dt in enumerate(in_dtypes)] + [(out_dtype, "y", False)]
    ni = len(in_dtypes)
    lines, res, _ = render_program(program, [f"a{k}" for k in range(ni)], list(in_dtypes), kd.render)
    body = ["  const int n = P[0];", "  if ((int)gid >= n) return;", "  const int R = P[1];"]
    if ni:
        body.append("  int " + ", ".join(f"o{k} = 0" for k in range(ni)) + ";")
        body.append("  int r = (int)gid;")
        body.append("  for (int d = R - 1; d >= 0; --d) {")
        body.append("    const int c = r % P[2 + d]; r /= P[2 + d];")
        body.append("    " + " ".join(f"o{k} += c * P[2 + R * {k + 1} + d];" for k in range(ni)))
        body.append("  }")
    for k, dt in enumerate(in_dtypes):
        body.append(f"  const {kd.ty(dt)} a{k} = x{k}[o{k}];")
    body += ["  " + ln for ln in lines]
    body.append(f"  y[gid] = ({kd.st(out_dtype)})({res});")
    text = "\n".join(body)
    sig = repr(bufs)
    name = _name("rlx_ew", sig + text)
    return name, f"{kd.kernel(name, bufs)}\n{text}\n}}\n"


def program_ops(program: str) -> list[tuple[str, list[str], dict[str, Any]]]:
    return decode(program)[0]


# -- matmul ---------------------------------------------------------------------------------------

@lru_cache(maxsize=32)
def matmul_source(kd: KernelDialect, dt: DType) -> tuple[str, str]:
    """P = [n, M, N, K, R, batch dims[R], a batch strides[R], b batch strides[R]] (elements)."""
    t = kd.ty(dt)
    name = f"rlx_matmul_{dt.value}"
    acc = "float" if dt is DType.F32 else t
    src = f"""{kd.kernel(name, [(dt, "a", True), (dt, "b", True), (dt, "y", False)])}
  const int n = P[0];
  if ((int)gid >= n) return;
  const int M = P[1], N = P[2], K = P[3], R = P[4];
  const int j = (int)gid % N, i = ((int)gid / N) % M;
  int bi = (int)gid / (M * N), oa = 0, ob = 0;
  for (int d = R - 1; d >= 0; --d) {{
    const int c = bi % P[5 + d]; bi /= P[5 + d];
    oa += c * P[5 + R + d]; ob += c * P[5 + 2 * R + d];
  }}
  {kd.gptr(dt)} ar = a + oa + i * K;
  {kd.gptr(dt)} bc = b + ob + j;
  {acc} s = 0;
  for (int k = 0; k < K; ++k) s += ar[k] * bc[k * N];
  y[gid] = ({t})s;
}}
"""
    return name, src


# -- reductions -----------------------------------------------------------------------------------

@lru_cache(maxsize=64)
def reduce_source(kd: KernelDialect, kind: str, dt: DType) -> tuple[str, str]:
    """One thread per output element. P = [n, KR, kept dims[KR], kept strides[KR], RR, reduced
    dims[RR], reduced strides[RR], count]."""
    t = kd.ty(dt)
    name = f"rlx_reduce_{kind}_{dt.value}"
    acc = "float" if dt is DType.F32 else t
    init = {"sum": "0", "mean": "0", "max": "-INFINITY", "min": "INFINITY"}[kind]
    if kind in ("sum", "mean"):
        step = "s += v;"
    else:
        cmp = ">" if kind == "max" else "<"
        step = f"s = (v {cmp} s || v != v) ? v : s;"
    fin = "s / (float)cnt" if kind == "mean" else "s"
    src = f"""{kd.kernel(name, [(dt, "x", True), (dt, "y", False)])}
  const int n = P[0];
  if ((int)gid >= n) return;
  const int KR = P[1];
  int r = (int)gid, base = 0;
  for (int d = KR - 1; d >= 0; --d) {{
    const int c = r % P[2 + d]; r /= P[2 + d]; base += c * P[2 + KR + d];
  }}
  const int RR = P[2 + 2 * KR];
  {kd.const_q} int* rd = P + 3 + 2 * KR;
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

@lru_cache(maxsize=16)
def softmax_source(kd: KernelDialect, log: bool) -> tuple[str, str]:
    """One thread per row. P = [rows, n]."""
    name = f"rlx_{'log_' if log else ''}softmax_f32"
    exp, lg = kd.math["exp"], kd.math["log"]
    if log:
        out = f"for (int j = 0; j < n; ++j) yr[j] = (xr[j] - m) - {lg}(s);"
    else:
        out = f"for (int j = 0; j < n; ++j) yr[j] = {exp}(xr[j] - m) / s;"
    src = f"""{kd.kernel(name, [(D.F32, "x", True), (D.F32, "y", False)])}
  const int rows = P[0], n = P[1];
  if ((int)gid >= rows) return;
  {kd.gptr(D.F32)} xr = x + (int)gid * n;
  {kd.gptr(D.F32, False)} yr = y + (int)gid * n;
  float m = -INFINITY;
  for (int j = 0; j < n; ++j) m = (xr[j] > m || xr[j] != xr[j]) ? xr[j] : m;
  float s = 0;
  for (int j = 0; j < n; ++j) s += {exp}(xr[j] - m);
  {out}
}}
"""
    return name, src


@lru_cache(maxsize=64)
def layer_norm_source(kd: KernelDialect, eps: float) -> tuple[str, str]:
    """One thread per row, two-pass statistics. P = [rows, n]."""
    body = f"""  const int rows = P[0], n = P[1];
  if ((int)gid >= rows) return;
  {kd.gptr(D.F32)} xr = x + (int)gid * n;
  {kd.gptr(D.F32, False)} yr = y + (int)gid * n;
  float mu = 0;
  for (int j = 0; j < n; ++j) mu += xr[j];
  mu /= (float)n;
  float var = 0;
  for (int j = 0; j < n; ++j) {{ const float d = xr[j] - mu; var += d * d; }}
  var /= (float)n;
  const float rstd = 1.0f / {kd.math["sqrt"]}(var + {literal(eps, DType.F32)});
  for (int j = 0; j < n; ++j) yr[j] = ((xr[j] - mu) * rstd) * g[j] + b[j];
"""
    bufs = [(D.F32, "x", True), (D.F32, "g", True), (D.F32, "b", True), (D.F32, "y", False)]
    name = _name("rlx_layer_norm_f32", body)
    return name, f"{kd.kernel(name, bufs)}\n{body}}}\n"


# -- data movement --------------------------------------------------------------------------------

@lru_cache(maxsize=16)
def copy_source(kd: KernelDialect, dt: DType) -> tuple[str, str]:
    """y[yo + sum c_d*ys_d] = x[xo + sum c_d*xs_d] over the out dims. P = [n, R, yo, xo, dims[R],
    y strides[R], x strides[R]] (elements, strides may be negative or 0)."""
    name = f"rlx_copy_{dt.value}"
    src = f"""{kd.kernel(name, [(dt, "x", True), (dt, "y", False)])}
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
def fill_source(kd: KernelDialect, dt: DType, value: str) -> tuple[str, str]:
    """y[i] = value. P = [n]."""
    body = f"  if ((int)gid >= P[0]) return;\n  y[gid] = ({kd.st(dt)})({value});\n"
    name = _name(f"rlx_fill_{dt.value}", body)
    return name, f"{kd.kernel(name, [(dt, 'y', False)])}\n{body}}}\n"


@lru_cache(maxsize=64)
def gather_source(kd: KernelDialect, dt: DType, idt: DType) -> tuple[str, str]:
    """y[o, j, i] = x[o, idx[j] (wrapped once if negative), i]. P = [n, nidx, inner, axis_len].

    Indices follow ONNX ([-len, len-1]); one outside (only possible when computed on the device:
    the host checks inputs and constants) gives 0 and reads nothing. The check is in 64 bits so an
    i64 index is not truncated into range first (2**32 + 1 must not become 1)."""
    name = f"rlx_gather_{dt.value}_{idt.value}"
    src = f"""{kd.kernel(name, [(dt, "x", True), (idt, "idx", True), (dt, "y", False)])}
  const int n = P[0];
  if ((int)gid >= n) return;
  const int nidx = P[1], inner = P[2], len = P[3];
  const int ii = (int)gid % inner, q = (int)gid / inner, j = q % nidx, o = q / nidx;
  long k = (long)idx[j];
  if (k < 0) k += len;
  y[gid] = (k >= 0 && k < len) ? x[(o * len + (int)k) * inner + ii] : ({kd.st(dt)})0;
}}
"""
    return name, src


@lru_cache(maxsize=16)
def iota_source(kd: KernelDialect, dt: DType) -> tuple[str, str]:
    """y[i] = coordinate of i along the axis. P = [n, axis_len, inner]."""
    t = kd.ty(dt)
    name = f"rlx_iota_{dt.value}"
    src = f"""{kd.kernel(name, [(dt, "y", False)])}
  if ((int)gid >= P[0]) return;
  y[gid] = ({t})(((int)gid / P[2]) % P[1]);
}}
"""
    return name, src


# -- lowering: one LIR step -> launches -------------------------------------------------------------

def _launch(kernel: str, source: str, bufs: Sequence[str], params: np.ndarray) -> Launch:
    return Launch(kernel, source, tuple(bufs), params, (int(params[0]), 1, 1))


def _contig(shape: tuple[int, ...]) -> list[int]:
    st, acc = [0] * len(shape), 1
    for j in range(len(shape) - 1, -1, -1):
        st[j] = acc
        acc *= shape[j]
    return st


def _bcast_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    full = (1,) * (len(out) - len(shape)) + tuple(shape)
    st = _contig(full)
    return [0 if full[j] == 1 else st[j] for j in range(len(out))]


def _p(*xs: Any) -> np.ndarray:
    flat: list[int] = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            flat += [int(v) for v in x]
        else:
            flat.append(int(x))
    return np.asarray(flat or [0], np.int32)


def _shape(t: TensorType) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _ints(attrs: Mapping[str, object], name: str) -> tuple[int, ...]:
    v = attrs[name]
    if not isinstance(v, tuple):
        raise IRError(f"attribute {name!r} = {v!r} is not a tuple of ints", fix=f"pass {name}=(...)")
    return v


def _copy(kd: KernelDialect, kernel: str, x: str, y: str, dt: DType, dims: list[int], ys: list[int],
          xs: list[int], yo: int = 0, xo: int = 0) -> Launch:
    params = _p(math.prod(dims), len(dims), yo, xo, dims, ys, xs)
    return _launch(kernel, copy_source(kd, dt)[1], [x, y], params)


def launches(kd: KernelDialect, step: Step, types: Mapping[str, TensorType], ew_prefix: str) -> list[Launch]:
    """The launches of one LIR step. ``ew_prefix`` marks the backend's single-op elementwise claims
    (``"metal.ew."``): those render through the shared renderer like a fused program."""
    op = step.op
    ins, out = list(step.inputs), step.outputs[0]
    its = [types[i] for i in ins]
    ot = types[out]
    oshape = _shape(ot)
    n = math.prod(oshape)
    a = step.attrs
    k = step.kernel
    if op == "fused_elementwise" or k.startswith(ew_prefix):
        prog = str(a["program"]) if op == "fused_elementwise" else single_op_program(op, len(ins), dict(a))
        src = elementwise_source(kd, prog, tuple(t.dtype for t in its), ot.dtype)[1]
        strides = [s for t in its for s in _bcast_strides(_shape(t), oshape)]
        return [_launch(k, src, [*ins, out], _p(n, len(oshape), oshape, strides))]
    if op == "matmul":
        ta, tb = its
        ash = _shape(ta) if ta.rank > 1 else (1, *_shape(ta))
        bsh = _shape(tb) if tb.rank > 1 else (*_shape(tb), 1)
        m, kk = ash[-2:]
        nn = bsh[-1]
        batch = tuple(np.broadcast_shapes(ash[:-2], bsh[:-2]))
        sa = [s * m * kk for s in _bcast_strides(ash[:-2], batch)]
        sb = [s * kk * nn for s in _bcast_strides(bsh[:-2], batch)]
        src = matmul_source(kd, ot.dtype)[1]
        return [_launch(k, src, [*ins, out], _p(n, m, nn, kk, len(batch), batch, sa, sb))]
    if op in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min"):
        xshape = _shape(its[0])
        r = len(xshape)
        red = set(range(r)) if a["axes"] is None else {normalize_axis(x, r) for x in _ints(a, "axes")}
        st = _contig(xshape)
        kept = [d for d in range(r) if d not in red]
        rd = sorted(red)
        src = reduce_source(kd, op.split("_", 1)[1], ot.dtype)[1]
        cnt = math.prod(xshape[d] for d in rd)
        return [_launch(k, src, [ins[0], out],
                        _p(n, len(kept), [xshape[d] for d in kept], [st[d] for d in kept], len(rd),
                           [xshape[d] for d in rd], [st[d] for d in rd], cnt))]
    if op in ("softmax", "log_softmax", "layer_norm"):
        xshape = _shape(its[0])
        ax = normalize_axis(int(a["axis"]), len(xshape)) if xshape else 0  # type: ignore[arg-type]
        inner = math.prod(xshape[ax:])
        rows = math.prod(xshape) // inner if inner else 0
        if op == "layer_norm":
            src = layer_norm_source(kd, float(a["eps"]))[1]  # type: ignore[arg-type]
        else:
            src = softmax_source(kd, op == "log_softmax")[1]
        return [_launch(k, src, [*ins, out], _p(rows, inner))]
    dt = ot.dtype
    if op == "reshape":
        return [_copy(kd, k, ins[0], out, dt, [n], [1], [1])]
    if op in ("transpose", "expand", "slice"):
        xshape = _shape(its[0])
        base = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), xshape, _contig(xshape)) \
            if xshape else np.zeros((), np.int8)
        if op == "transpose":
            v = base.transpose(_ints(a, "perm")) if a["perm"] is not None else base.transpose()
        elif op == "expand":
            v = np.broadcast_to(base, oshape)
        else:
            from ..ir.mir import slice_params

            idx: list[Any] = [slice(None)] * len(xshape)
            for axx, sl in slice_params(a, xshape):
                idx[axx] = sl
            v = base[tuple(idx)]
        off = (v.__array_interface__["data"][0] - base.__array_interface__["data"][0]) if v.size else 0
        return [_copy(kd, k, ins[0], out, dt, list(oshape), _contig(oshape), list(v.strides), 0, off)]
    if op == "concat":
        ax = normalize_axis(int(a["axis"]), len(oshape))  # type: ignore[arg-type]
        ost = _contig(oshape)
        res, start = [], 0
        for x, t in zip(ins, its):
            xs = _shape(t)
            if math.prod(xs):
                res.append(_copy(kd, k, x, out, dt, list(xs), ost, _contig(xs), start * ost[ax], 0))
            start += xs[ax]
        return res
    if op == "pad":
        pads = _ints(a, "pads")
        xs = _shape(its[0])
        ost = _contig(oshape)
        fill = _launch(k, fill_source(kd, dt, literal(a["value"], dt))[1], [out], _p(n))  # type: ignore[arg-type]
        yo = sum(int(pads[d]) * ost[d] for d in range(len(xs)))
        res = [fill]
        if math.prod(xs):
            res.append(_copy(kd, k, ins[0], out, dt, list(xs), ost, _contig(xs), yo, 0))
        return res
    if op == "gather":
        xs = _shape(its[0])
        ax = normalize_axis(int(a["axis"]), len(xs))  # type: ignore[arg-type]
        src = gather_source(kd, dt, its[1].dtype)[1]
        params = _p(n, math.prod(_shape(its[1])), math.prod(xs[ax + 1:]), xs[ax])
        return [_launch(k, src, [*ins, out], params)]
    if op == "iota":
        if not oshape:
            return [_launch(k, iota_source(kd, dt)[1], [out], _p(1, 1, 1))]
        ax = normalize_axis(int(a["axis"]), len(oshape))  # type: ignore[arg-type]
        return [_launch(k, iota_source(kd, dt)[1], [out], _p(n, oshape[ax], math.prod(oshape[ax + 1:])))]
    raise IRError(f"the {kd.name} kernel library has no kernel for {op}",
                  fix="report this bug (the claim and codegen disagree)")




# -- claims -----------------------------------------------------------------------------------------

F32 = frozenset({D.F32})
FI = frozenset({D.F32, D.I32, D.I64})
FIB = frozenset({D.F32, D.I32, D.I64, D.BOOL})
INDEX = frozenset({D.I32, D.I64})
FLOAT_ONLY = frozenset({"exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf",
                        "floor", "ceil", "round", "div", "pow"})
INT_OK = frozenset({"neg", "abs", "sign", "add", "sub", "mul", "maximum", "minimum"})
LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor", "logical_not"})

OpOk = Callable[[str, tuple[DType, ...], DType], "str | None"]


def op_ok(op: str, ins: tuple[DType, ...], out: DType) -> str | None:
    """None when the C-style kernels compute ``op`` on these dtypes exactly as the reference does
    (f32, plus i32/i64/bool where C integer semantics match)."""
    if any(d not in FIB for d in (*ins, out)):
        return f"the C-style kernels handle f32/i32/i64/bool only (got {[d.value for d in ins]})"
    if op in FLOAT_ONLY and any(d is not D.F32 for d in ins):
        return f"{op} is claimed for f32 only"
    if op in INT_OK and any(d not in FI for d in ins):
        return f"{op} is claimed for f32/i32/i64 only"
    if op in LOGICAL and any(d is not D.BOOL for d in ins):
        return f"{op} is claimed for bool only"
    if op == "where" and (ins[0] is not D.BOOL or ins[1] != ins[2]):
        return "where needs a bool condition and equal branch dtypes"
    if op == "cast" and ins[0] is D.F32 and out in (D.I32, D.I64):
        return "float -> int cast of NaN/Inf/out-of-range values is undefined in C-style languages"
    return None


def _numel(t: TensorType) -> int:
    n = 1
    for d in t.shape:
        n *= int(d)
    return n


def fits(v: Any) -> str | None:
    """The kernels index with 32-bit ints."""
    if any(_numel(t) >= 2**31 - 1 for t in (*v.in_types, *v.out_types)):
        return "tensors of 2**31 elements or more (32-bit indices)"
    return None


def _last_axis(v: Any) -> str | None:
    t = v.in_types[0]
    if t.rank and normalize_axis(int(v.attrs["axis"]), t.rank) != t.rank - 1:
        return "only the last axis (other axes run through the decomposition)"
    return fits(v)


def claims(kd: KernelDialect, prefix: str, *, extra_op_ok: OpOk | None = None) -> list[Any]:
    """The claim list of a backend running this library in ``kd``: elementwise ops and fused
    programs that render (``prefix + "ew."``), and every template op. ``extra_op_ok`` narrows the
    elementwise claims further (a dialect's own exceptions)."""
    from ..fusion import FUSIBLE
    from ..records import KernelClaim
    from .claims import all_of, elementwise_claims, fused_claim, render_check, renders

    def ok(op: str, ins: tuple[DType, ...], out: DType) -> str | None:
        return op_ok(op, ins, out) or (extra_op_ok(op, ins, out) if extra_op_ok else None)

    program_ok = render_check(lambda p, i, o: elementwise_source(kd, p, i, o), f"as {kd.name}", op_ok=ok)
    renderable = all_of(fits, renders(program_ok))

    def claim(op: str, dtypes: frozenset[DType] | None, **kw: Any) -> Any:
        kw.setdefault("predicate", fits)
        return KernelClaim(op, f"{prefix}{op}", dtypes=dtypes, **kw)

    out: list[Any] = elementwise_claims(f"{prefix}ew.", FIB, renderable, ops=tuple(sorted(FUSIBLE)),
                                        out_dtypes=FIB)
    out += [
        fused_claim(f"{prefix}fused_elementwise", renderable,
                    constraint=f"f32/i32/i64/bool programs of claimed elementwise ops (shared renderer, "
                               f"{kd.render} dialect)"),
        claim("matmul", F32, constraint="one thread per output element, f32 accumulation"),
        claim("softmax", F32, predicate=_last_axis, constraint="last axis, one thread per row"),
        claim("log_softmax", F32, predicate=_last_axis, constraint="last axis, one thread per row"),
        claim("layer_norm", F32, constraint="one thread per row, two-pass statistics"),
        claim("reduce_sum", F32), claim("reduce_mean", F32), claim("reduce_max", F32),
        claim("reduce_min", F32),
        claim("reshape", FIB, in_place=True), claim("transpose", FIB), claim("expand", FIB),
        claim("slice", FIB), claim("concat", FIB), claim("pad", FIB),
        claim("gather", FIB | INDEX, out_dtypes=FIB),
        claim("iota", FI),
    ]
    return out


__all__ = ["KERNEL_DIALECTS", "METAL", "OPENCL", "KernelDialect", "claims", "copy_source",
           "elementwise_source", "fill_source", "fits", "gather_source", "iota_source", "kernel_name",
           "launches", "layer_norm_source", "literal", "matmul_source", "module", "op_ok", "program_ops",
           "reduce_source", "softmax_source"]
