"""ONNX indexing and integer operators, translated into existing RLX IR ops (issue 17).

GatherElements, GatherND (any ``batch_dims``), ScatterElements, ScatterND, Trilu, OneHot, Compress,
Mod, BitShift, Einsum and TopK. The handlers register in :mod:`rlx_core.frontends.onnx`'s table (that
module imports this one), so the ONNX importer stays one entry point.

Index arithmetic rule (why the decompositions are safe): an element index computed from several
per-axis indices (GatherElements, GatherND, ScatterND) is built from each per-axis index normalised
ONNX's way (``i + n`` for ``-n <= i < 0``), and an index outside ``[-n, n - 1]`` on *any* axis makes
the linear index out of range too, so the ``gather``/``scatter`` kernel reports it (rlx-cpu raises
an ``InputError``, as ONNX Runtime does) instead of reading a neighbouring element.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir import symexpr
from ..ir.builder import Tensor
from ..ir.types import Dim
from .onnx import _Const, _handler, _Importer

_MALFORMED = "the model is malformed: check it with onnx.checker.check_model"


# ---------------------------------------------------------------------------------------------
# Shared helpers


def _static(imp: _Importer, x: Tensor, what: str) -> tuple[int, ...]:
    """``x``'s shape as ints; a symbolic dim is refused with the fix (fix the symbols' sizes)."""
    syms = [d for d in x.shape if isinstance(d, str)]
    if syms:
        raise imp.symbolic(f"{what} needs static dims, got {x.shape}", [str(s) for s in syms])
    return tuple(int(d) for d in x.shape)


def _i64(imp: _Importer, v: Any) -> Tensor:
    t = imp.t(v)
    if t.dtype is not DType.I64:
        if not t.dtype.is_int:
            raise imp.unsupported(f"indices have dtype {t.dtype}, not an integer type",
                                  fix="ONNX indices are int32 or int64; cast them in the model")
        t = imp.g.op("cast", t, to=DType.I64)
    return t


def _normalised(imp: _Importer, i: Tensor, n: Dim) -> tuple[Tensor, Tensor]:
    """ONNX's index rule on an int64 tensor: ``(i + n if i < 0 else i, -n <= i < n)``; a symbolic
    extent ``n`` is computed at run time."""
    g = imp.g
    zero, cn = g.const(0, DType.I64), imp.dim_tensor(n)
    neg = g.op("less", i, zero)
    norm = g.op("where", neg, i + cn, i)
    valid = g.op("logical_and", g.op("greater_equal", i, g.op("neg", cn)), g.op("less", i, cn))
    return norm, valid


def _check_const_indices(imp: _Importer, v: Any, extents: Sequence[int], what: str,
                         last_axis: bool = False) -> None:
    """A constant index operand out of range is a malformed model: say so at import time."""
    if not isinstance(v, _Const) or v.array.size == 0:
        return
    a = v.array.astype(np.int64)
    cols = [a[..., j] for j in range(a.shape[-1])] if last_axis else [a]
    for j, (col, n) in enumerate(zip(cols, extents)):
        bad = (col < -n) | (col >= n)
        if bad.any():
            pos = tuple(int(p) for p in np.unravel_index(int(np.argmax(bad)), col.shape))
            raise imp.unsupported(f"{what}: constant index {int(col[pos])} at {pos} (component {j}) is out "
                                  f"of range for an axis of size {n} (valid: {-n} .. {n - 1})",
                                  fix="the model is malformed: fix its indices")


def _strides(shape: Sequence[Dim]) -> list[Dim]:
    out: list[Dim] = []
    s: Dim = 1
    for d in reversed(shape):
        out.append(s)
        s = symexpr.mul(s, d)
    return out[::-1]


def _scaled(imp: _Importer, t: Tensor, k: Dim) -> Tensor:
    return t if k == 1 else t * imp.dim_tensor(k)


def _linear_nd(imp: _Importer, ids: Tensor, addressed: Sequence[Dim], lead: Sequence[Any],
               oob: Dim) -> Tensor:
    """Row index into the flattened ``addressed`` axes from ``ids[..., k]`` (k = len(addressed)), shape
    ``lead``; any component out of range gives ``oob`` (itself out of range)."""
    g = imp.g
    strides = _strides(addressed)
    lin: Tensor | None = None
    ok: Tensor | None = None
    r = ids.rank
    for j, n in enumerate(addressed):
        col = g.op("slice", ids, starts=(j,), stops=(j + 1,), axes=(r - 1,))
        col = g.op("reshape", col, shape=tuple(lead))
        norm, valid = _normalised(imp, col, n)
        term = _scaled(imp, norm, strides[j])
        lin = term if lin is None else lin + term
        ok = valid if ok is None else g.op("logical_and", ok, valid)
    assert lin is not None and ok is not None
    return g.op("where", ok, lin, imp.dim_tensor(oob))


# ---------------------------------------------------------------------------------------------
# Gathers


@_handler("GatherElements")
def _gather_elements(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """``out[i][j][k] = data[i][idx[i][j][k]][k]`` (axis 1) as one ``gather`` from the flattened
    data at ``sum(coordinate * stride)``, the coordinate along ``axis`` read from ``idx``."""
    g = imp.g
    data, idx = imp.t(ins[0]), _i64(imp, ins[1])
    ds, ish = tuple(data.shape), tuple(idx.shape)
    r = len(ds)
    if len(ish) != r or r == 0:
        raise imp.unsupported(f"GatherElements indices {ish} must have the rank of data {ds} (>= 1)",
                              fix=_MALFORMED)
    axis = int(attrs.get("axis", 0))
    if not -r <= axis < r:
        raise imp.unsupported(f"GatherElements axis={axis} is outside the rank {r} of data {ds}",
                              fix=_MALFORMED)
    axis %= r
    for d in range(r):
        if d == axis or ish[d] == ds[d] or ish[d] == 1:
            continue
        i_d, d_d = ish[d], ds[d]
        if isinstance(i_d, int) and isinstance(d_d, int):
            if i_d > d_d:
                raise imp.unsupported(f"GatherElements indices {ish} are larger than data {ds} off axis "
                                      f"{axis}", fix=_MALFORMED)
            continue
        # Off the gather axis, indices may not outgrow data; symbolic sizes must be provably equal.
        raise imp.symbolic(f"GatherElements indices {ish} and data {ds} (axis {axis}): axis {d} is "
                           f"{ish[d]} vs {ds[d]}, not provably within the data",
                           sorted(symexpr.symbols(ish[d]) | symexpr.symbols(ds[d])))
    n_axis = ds[axis]
    if isinstance(n_axis, int):
        _check_const_indices(imp, ins[1], [n_axis], "GatherElements indices")
    strides, total = _strides(ds), symexpr.prod(ds)
    if symexpr.prod(ish) == 0:
        return [g.op("expand", g.const(0, data.dtype), shape=ish) if data.dtype is not DType.BOOL
                else g.op("expand", g.const(False, DType.BOOL), shape=ish)]
    norm, valid = _normalised(imp, idx, ds[axis])
    lin = _scaled(imp, norm, strides[axis])
    for d in range(r):
        if d != axis and ish[d] != 1 and ish[d] != 0:
            lin = lin + _scaled(imp, g.op("iota", shape=ish, axis=d, dtype=DType.I64), strides[d])
    flat = g.op("where", valid, lin, imp.dim_tensor(total))
    return [g.op("gather", g.op("reshape", data, shape=(total,)), flat, axis=0)]


@_handler("GatherND")
def _gather_nd(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """``batch_dims = b``: the first b axes of data and indices are paired; the last index axis
    (length k) addresses data axes b .. b+k-1. k == 1 with b == 0 is a plain ``gather`` on axis 0
    (an ``embedding`` for a float table: what exporters emit for ``nn.Embedding``); anything else
    is one ``gather`` of the flattened rows at a linear index (each component normalised and
    range-checked, see the module's index rule)."""
    g = imp.g
    data, idx = ins
    b = int(attrs.get("batch_dims", 0))
    ids, x = _i64(imp, idx), imp.t(data)
    k = ids.shape[-1] if ids.rank else None
    if not isinstance(k, int) or b < 0 or b >= min(ids.rank, x.rank + 1) or k < 1 or b + k > x.rank:
        raise imp.unsupported(f"GatherND batch_dims={b} with indices {ids.shape} on data {x.shape}",
                              fix="the last index axis must be a static length k with batch_dims + k <= "
                                  "the data rank, and batch_dims < the indices' rank")
    if b == 0 and k == 1:
        flat = g.op("reshape", ids, shape=ids.shape[:-1])
        table = isinstance(data, _Const) and data.array.ndim == 2 and data.array.dtype.kind == "f"
        if table and not isinstance(idx, _Const):
            return [g.op("embedding", x, flat)]
        return [g.op("gather", x, flat, axis=0)]
    # Symbolic axes (torch.export's vmap-built masks) are fine: sizes and strides are polynomials,
    # computed at run time where the index arithmetic needs them.
    xs = tuple(x.shape[:b + k])
    if tuple(ids.shape[:b]) != xs[:b]:
        if any(isinstance(d, str) for d in (*ids.shape[:b], *xs[:b])):
            raise imp.symbolic(f"GatherND batch dims of indices {ids.shape} and data {x.shape} are equal "
                               f"only for some sizes of the symbols",
                               sorted({s for d in (*ids.shape[:b], *xs[:b]) for s in symexpr.symbols(d)}))
        raise imp.unsupported(f"GatherND batch dims of indices {ids.shape} and data {x.shape} differ",
                              fix=_MALFORMED)
    addressed, rest = xs[b:b + k], tuple(x.shape[b + k:])
    if all(isinstance(d, int) for d in addressed):
        _check_const_indices(imp, idx, addressed, "GatherND indices", last_axis=True)  # type: ignore[arg-type]
    nb, rows = symexpr.prod(xs[:b]), symexpr.prod(addressed)
    lead = tuple(ids.shape[:-1])
    lin = _linear_nd(imp, ids, addressed, lead, symexpr.mul(nb, rows))
    if b:
        # Batch element i's rows start at i * rows of the flattened (batch..., addressed...) axes.
        l2 = g.op("reshape", lin, shape=(nb, *lead[b:]))
        bvec = _scaled(imp, g.op("iota", shape=(nb,), axis=0, dtype=DType.I64), rows)
        bterm = g.op("reshape", bvec, shape=(nb, *([1] * (len(lead) - b))))
        lin = g.op("where", g.op("less", l2, imp.dim_tensor(rows)), l2 + bterm,
                   imp.dim_tensor(symexpr.mul(nb, rows)))
    flat_x = g.op("reshape", x, shape=(symexpr.mul(nb, rows), *rest))
    out = g.op("gather", flat_x, lin, axis=0)
    return [g.op("reshape", out, shape=(*lead, *rest))]


# ---------------------------------------------------------------------------------------------
# Scatters


def _reduction(imp: _Importer, node: Any, attrs: dict) -> str:
    red = str(attrs.get("reduction", "none"))
    if red not in ("none", "add", "mul", "max", "min"):
        raise imp.unsupported(f"{node.op_type} reduction={red!r} is not an ONNX reduction",
                              fix="use none, add, mul, max or min")
    return red


def _scatter(imp: _Importer, node: Any, data: Tensor, ids: Tensor, upd: Tensor, axis: int,
             red: str) -> Tensor:
    g = imp.g
    if upd.dtype != data.dtype:
        upd = g.op("cast", upd, to=data.dtype)
    if red == "add":
        return g.op("scatter_add", data, ids, upd, axis=axis)
    if data.dtype is DType.BOOL or data.dtype.is_complex:
        raise imp.unsupported(f"{node.op_type} reduction={red!r} on {data.dtype}",
                              fix="scatter reductions take real numbers; cast the data first")
    return g.op("scatter_reduce", data, ids, upd, axis=axis, reduction=red)


@_handler("ScatterElements", "Scatter")
def _scatter_elements(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    data, idx, upd = imp.t(ins[0]), _i64(imp, ins[1]), imp.t(ins[2])
    red = _reduction(imp, node, attrs)
    ds = _static(imp, data, f"{node.op_type} data")
    ish = _static(imp, idx, f"{node.op_type} indices")
    r = len(ds)
    if len(ish) != r or tuple(upd.shape) != ish:
        raise imp.unsupported(f"{node.op_type} indices {ish} and updates {upd.shape} must have equal shapes "
                              f"and the rank of data {ds}", fix=_MALFORMED)
    axis = int(attrs.get("axis", 0))
    if not -r <= axis < r:
        raise imp.unsupported(f"{node.op_type} axis={axis} is outside the rank {r}", fix=_MALFORMED)
    _check_const_indices(imp, ins[1], [ds[axis % r]], f"{node.op_type} indices")
    return [_scatter(imp, node, data, idx, upd, axis % r, red)]


@_handler("ScatterND")
def _scatter_nd(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Rows of the flattened addressed axes, updated by ``scatter``/``scatter_add`` along axis 0 with
    each update row's linear index (out of range on any component: out of range, reported)."""
    g = imp.g
    data, ids, upd = imp.t(ins[0]), _i64(imp, ins[1]), imp.t(ins[2])
    red = _reduction(imp, node, attrs)
    ds = _static(imp, data, "ScatterND data")
    ish = _static(imp, ids, "ScatterND indices")
    k = ish[-1] if ish else 0
    if not 1 <= k <= len(ds):
        raise imp.unsupported(f"ScatterND indices {ish} on data {ds}: the last index axis must be 1 .. rank",
                              fix=_MALFORMED)
    lead, addressed, rest = ish[:-1], ds[:k], ds[k:]
    if tuple(upd.shape) != (*lead, *rest):
        raise imp.unsupported(f"ScatterND updates {upd.shape} must have shape {(*lead, *rest)}",
                              fix=_MALFORMED)
    _check_const_indices(imp, ins[1], addressed, "ScatterND indices", last_axis=True)
    rows, m, width = math.prod(addressed), math.prod(lead), math.prod(rest)
    if m == 0:
        return [data]
    lin = _linear_nd(imp, ids, addressed, lead, rows)
    tgt = g.op("expand", g.op("reshape", lin, shape=(m, 1)), shape=(m, width))
    out = _scatter(imp, node, g.op("reshape", data, shape=(rows, width)), tgt,
                   g.op("reshape", upd, shape=(m, width)), 0, red)
    return [g.op("reshape", out, shape=ds)]


@_handler("TensorScatter")
def _tensor_scatter(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """A KV-cache write: ``update`` goes into ``past_cache`` along ``axis`` from each batch row's
    ``write_indices[b]`` on (modulo the axis for ``mode='circular'``): one ``scatter_reduce`` with
    ``reduction='none'`` (so a circular wrap that writes a slot twice keeps the later value, as the
    operator's loop does)."""
    g = imp.g
    cache, upd = imp.t(ins[0]), imp.t(ins[1])
    mode = str(attrs.get("mode", "linear"))
    if mode not in ("linear", "circular"):
        raise imp.unsupported(f"TensorScatter mode={mode!r}", fix="use linear or circular")
    cs = _static(imp, cache, "TensorScatter past_cache")
    us = _static(imp, upd, "TensorScatter update")
    r = len(cs)
    axis = int(attrs.get("axis", -2))
    if r < 2 or not -r <= axis < r or len(us) != r or (axis % r) == 0:
        raise imp.unsupported(f"TensorScatter axis={axis} on past_cache {cs} and update {us}", fix=_MALFORMED)
    axis %= r
    if any(us[d] != cs[d] for d in range(r) if d != axis) or us[axis] > cs[axis]:
        raise imp.unsupported(f"TensorScatter update {us} does not fit past_cache {cs} along axis {axis}",
                              fix=_MALFORMED)
    if math.prod(us) == 0:
        return [cache]
    n = cs[axis]
    pos = g.op("iota", shape=us, axis=axis, dtype=DType.I64)
    if len(ins) > 2 and ins[2] is not None:
        wi = _i64(imp, ins[2])
        if tuple(wi.shape) != (cs[0],):
            raise imp.unsupported(f"TensorScatter write_indices {wi.shape} must have shape ({cs[0]},)",
                                  fix=_MALFORMED)
        pos = pos + g.op("reshape", wi, shape=(cs[0], *([1] * (r - 1))))
    if mode == "circular":
        cn = g.const(n, DType.I64)
        rem = pos - (pos / cn) * cn
        pos = g.op("where", g.op("less", rem, g.const(0, DType.I64)), rem + cn, rem)
    if upd.dtype != cache.dtype:
        upd = g.op("cast", upd, to=cache.dtype)
    if cache.dtype is DType.BOOL or cache.dtype.is_complex:
        raise imp.unsupported(f"TensorScatter on {cache.dtype}", fix="cast the cache to a real dtype")
    return [g.op("scatter_reduce", cache, pos, upd, axis=axis, reduction="none")]


# ---------------------------------------------------------------------------------------------
# Masks and selections


@_handler("Trilu")
def _trilu(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    x = imp.t(ins[0])
    if x.rank < 2:
        raise imp.unsupported(f"Trilu needs rank >= 2, got {x.shape}", fix=_MALFORMED)
    kv = imp.ints(ins[1] if len(ins) > 1 else None, "the Trilu k")
    k = kv[0] if kv else 0
    shape = tuple(x.shape[-2:])
    i = g.op("iota", shape=shape, axis=0, dtype=DType.I64)
    j = g.op("iota", shape=shape, axis=1, dtype=DType.I64)
    diff = j - i  # keep j - i >= k (upper) or j - i <= k (lower)
    kc = g.const(k, DType.I64)
    keep = g.op("greater_equal" if int(attrs.get("upper", 1)) else "less_equal", diff, kc)
    zero = g.const(False if x.dtype is DType.BOOL else 0, x.dtype)
    return [g.op("where", keep, x, zero)]


@_handler("OneHot")
def _one_hot(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """``where(index == iota(depth), on, off)``; a negative index counts from the end, one outside
    ``[-depth, depth - 1]`` gives a row of ``off`` values (ONNX)."""
    g = imp.g
    idx = imp.t(ins[0])
    dv = ins[1]
    if not isinstance(dv, _Const) or dv.array.size != 1:
        raise imp.unsupported("OneHot depth is computed at run time, so the output shape is data-dependent",
                              fix="export with a constant depth")
    dval = dv.array.reshape(-1)[0]
    depth = int(dval)
    if depth != dval or depth < 1:
        raise imp.unsupported(f"OneHot depth {dval!r} is not a positive integer", fix=_MALFORMED)
    if idx.dtype.is_float:
        # ONNX casts non-integer indices to int64 (truncation toward zero).
        idx = g.op("cast", idx, to=DType.I64)
    elif idx.dtype is not DType.I64:
        if not idx.dtype.is_int:
            raise imp.unsupported(f"OneHot indices of dtype {idx.dtype}", fix="use integer indices")
        idx = g.op("cast", idx, to=DType.I64)
    r = idx.rank + 1
    axis = int(attrs.get("axis", -1))
    if not -r <= axis < r:
        raise imp.unsupported(f"OneHot axis={axis} is outside the output rank {r}", fix=_MALFORMED)
    axis %= r
    vals = imp.t(ins[2])
    if vals.rank != 1 or vals.shape[0] != 2:
        raise imp.unsupported(f"OneHot values must be [off, on], got shape {vals.shape}",
                              fix=_MALFORMED)
    cd = g.const(depth, DType.I64)
    norm = g.op("where", g.op("less", idx, g.const(0, DType.I64)), idx + cd, idx)
    shape = list(idx.shape)
    shape.insert(axis, 1)
    ex = g.op("reshape", norm, shape=tuple(shape))
    view = [1] * r
    view[axis] = depth
    pos = g.op("iota", shape=tuple(view), axis=axis, dtype=DType.I64)
    hit = g.op("equal", ex, pos)
    off = g.op("reshape", g.op("slice", vals, starts=(0,), stops=(1,), axes=(0,)), shape=())
    on = g.op("reshape", g.op("slice", vals, starts=(1,), stops=(2,), axes=(0,)), shape=())
    out = g.op("where", hit, on, off)
    full = list(idx.shape)
    full.insert(axis, depth)
    if tuple(out.shape) != tuple(full):
        out = g.op("expand", out, shape=tuple(full))
    return [out]


@_handler("Compress")
def _compress(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """A constant condition is a constant list of kept positions: a ``gather``."""
    g = imp.g
    x = imp.t(ins[0])
    cond = ins[1]
    if not isinstance(cond, _Const):
        raise imp.unsupported("Compress with a condition computed at run time has a data-dependent output "
                              "shape, which RLX (static shapes per signature) cannot express",
                              fix="export with a constant condition, or select with Gather on constant "
                                  "indices")
    keep = np.flatnonzero(cond.array.reshape(-1).astype(bool)).astype(np.int64)
    axis = attrs.get("axis")
    n: Any
    if axis is None:
        n = math.prod(_static(imp, x, "Compress input"))
        src = g.op("reshape", x, shape=(n,))
        ax = 0
    else:
        ax = int(axis)
        if not -x.rank <= ax < x.rank:
            raise imp.unsupported(f"Compress axis={ax} is outside the rank {x.rank}", fix=_MALFORMED)
        ax %= x.rank
        src, n = x, x.shape[ax]
    if isinstance(n, int) and cond.array.size > n and cond.array.reshape(-1)[n:].astype(bool).any():
        raise imp.unsupported(f"Compress condition selects position {int(keep[-1])} of an axis of size {n}",
                              fix=_MALFORMED)
    # On a symbolic axis the kept positions are checked against its size when it is bound.
    return [g.op("gather", src, g.const(keep, DType.I64), axis=ax)]


# ---------------------------------------------------------------------------------------------
# Integer arithmetic


@_handler("Mod")
def _mod(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Integers only: ``fmod=1`` is C's remainder ``a - trunc(a / b) * b`` (RLX integer ``div``
    truncates), ``fmod=0`` moves a non-zero remainder whose sign differs from ``b``'s by ``+ b``
    (Python's rule). Float ``Mod`` is refused: ``a - trunc(a / b) * b`` is not exact in floating
    point (ONNX Runtime's ``std::fmod`` is), and RLX has no exact fmod op."""
    g = imp.g
    a, b = imp.pair(ins[0], ins[1])
    if not a.dtype.is_int:
        raise imp.unsupported(f"Mod on {a.dtype} is not supported: only integer Mod is exact with RLX's "
                              f"ops (a - trunc(a/b)*b rounds in floating point)",
                              fix="compute it on integers, or replace Mod by the model's own formula "
                                  "(e.g. a - floor(a / b) * b) if approximate results are acceptable")
    rem = a - (a / b) * b
    if int(attrs.get("fmod", 0)):
        return [rem]
    zero = g.const(0, a.dtype)
    if not a.dtype.is_signed:
        return [rem]
    fix = g.op("logical_and", g.op("not_equal", rem, zero),
               g.op("not_equal", g.op("less", rem, zero), g.op("less", b, zero)))
    return [g.op("where", fix, rem + b, rem)]


@_handler("BitShift")
def _bitshift(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Integers of width w (the unsigned ones, and from BitShift-28 the signed ones):
    ``x << s`` is ``x * 2**s`` (products wrap, as bits shifted out are lost) and ``x >> s`` is
    ``floor(x / 2**s)`` (arithmetic for signed x). ``2**s`` comes from a table of w + 1 entries
    indexed by s clamped into [0, w], so every shift amount is exact; a shift outside [0, w) gives
    what the sign fill alone gives (-1 for a right shift of a negative x, else 0), as ONNX says."""
    g = imp.g
    x, s = imp.pair(ins[0], ins[1])
    if not x.dtype.is_int:
        raise imp.unsupported(f"BitShift on {x.dtype}", fix="BitShift takes integer operands")
    direction = str(attrs.get("direction", ""))
    if direction not in ("LEFT", "RIGHT"):
        raise imp.unsupported(f"BitShift direction={direction!r}", fix="use LEFT or RIGHT")
    left, signed = direction == "LEFT", x.dtype.is_signed
    w = x.dtype.itemsize * 8
    # Right shifts divide by 2**s only while 2**s is a positive value of the type (s < w - 1 signed).
    top = w if left or not signed else w - 1
    pw = [(1 << i) if i < top else (0 if left else 1) for i in range(w + 1)]
    table = np.array([v - (1 << w) if signed and v >= 1 << (w - 1) else v for v in pw], dtype=x.dtype.np)
    si = g.op("cast", s, to=DType.I64) if s.dtype is not DType.I64 else s
    inside = g.op("logical_and", g.op("greater_equal", si, g.const(0, DType.I64)),
                  g.op("less", si, g.const(top, DType.I64)))
    pos = g.op("where", inside, si, g.const(w, DType.I64))
    p = g.op("gather", g.const(table, x.dtype), pos, axis=0)
    if left:
        return [x * p]
    zero = g.const(0, x.dtype)
    q = x / p
    if signed:
        q = g.op("where", g.op("less", x - q * p, zero), q - g.const(1, x.dtype), q)  # floor, not trunc
        fill = g.op("where", g.op("less", x, zero), g.const(-1, x.dtype), zero)
    else:
        fill = zero
    return [g.op("where", inside, q, fill)]


# ---------------------------------------------------------------------------------------------
# Einsum


def _parse_einsum(imp: _Importer, eq: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """Operand subscripts and output subscripts, with ``...`` expanded to upper-case letters (input
    letters are lower-case or upper-case ASCII; ellipsis letters are taken from those unused)."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise imp.unsupported(f"Einsum equation {eq!r} has {len(terms)} operand(s), the node {len(ranks)}",
                              fix=_MALFORMED)
    used = set(eq) - set(".,->")
    if not used <= set(string.ascii_letters):
        raise imp.unsupported(f"Einsum equation {eq!r} uses characters other than letters",
                              fix=_MALFORMED)
    free = [c for c in string.ascii_letters if c not in used]
    n_ell = max((r - (len(t) - 3) for t, r in zip(terms, ranks) if "..." in t), default=0)
    if n_ell > len(free):
        raise imp.unsupported("Einsum ellipsis too wide", fix=_MALFORMED)
    ell = "".join(free[:n_ell])
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            w = r - (len(t) - 3)
            t = t.replace("...", ell[n_ell - w:] if w else "")
        if len(t) != r:
            raise imp.unsupported(f"Einsum term {t!r} does not match an operand of rank {r}",
                                  fix=_MALFORMED)
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {c: sum(t.count(c) for t in out_terms) for c in set("".join(out_terms))}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    return out_terms, out


def _diagonals(imp: _Importer, x: Tensor, t: str) -> tuple[Tensor, str]:
    """A letter repeated within one term takes the diagonal: its two axes go last, are flattened to
    n * n and ``gather``ed at ``i * (n + 1)`` (exact, one read per element)."""
    g = imp.g
    while len(set(t)) != len(t):
        c = next(ch for ch in t if t.count(ch) > 1)
        p, q = t.index(c), t.index(c, t.index(c) + 1)
        shape = _static(imp, x, "Einsum operand")
        n = shape[p]
        if shape[q] != n:
            raise imp.unsupported(f"Einsum term {t!r}: the repeated letter {c!r} has sizes {n} and "
                                  f"{shape[q]}", fix=_MALFORMED)
        keep = [a for a in range(len(t)) if a not in (p, q)]
        y = g.op("transpose", x, perm=(*keep, p, q)) if keep != list(range(len(t) - 2)) else x
        y = g.op("reshape", y, shape=(*(shape[a] for a in keep), n * n))
        pos = g.op("iota", shape=(n,), axis=0, dtype=DType.I64) * g.const(n + 1, DType.I64)
        x = g.op("gather", y, pos, axis=len(keep))
        t = "".join(t[a] for a in keep) + c
    return x, t


@_handler("Einsum")
def _einsum(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """Pairwise contractions, left to right: each operand first sums away the letters no one else
    needs, then two operands become one batched ``matmul`` (batch letters, kept letters of each,
    contracted letters) through ``transpose``/``reshape``; the result is transposed to the output
    order. A letter repeated within one input term takes that diagonal first."""
    g = imp.g
    xs = [imp.t(v) for v in ins if v is not None]
    dts = {x.dtype for x in xs}
    if len(dts) != 1:
        raise imp.unsupported(f"Einsum operands have dtypes {sorted(map(str, dts))}", fix=_MALFORMED)
    eq = str(attrs.get("equation", ""))
    terms, out = _parse_einsum(imp, eq, [x.rank for x in xs])
    if len(set(out)) != len(out):
        raise imp.unsupported(f"Einsum {eq!r}: the output {out!r} repeats a letter", fix=_MALFORMED)
    for i, (x, t) in enumerate(zip(xs, terms)):
        xs[i], terms[i] = _diagonals(imp, x, t)
    size: dict[str, int] = {}
    for x, t in zip(xs, terms):
        for c, d in zip(t, _static(imp, x, "Einsum operand")):
            if size.get(c, d) != d and 1 not in (size[c], d):
                raise imp.unsupported(f"Einsum {eq!r}: letter {c!r} has sizes {size[c]} and {d}",
                                      fix=_MALFORMED)
            size[c] = max(size.get(c, d), d)
    for i, (x, t) in enumerate(zip(xs, terms)):
        full = tuple(size[c] for c in t)
        if tuple(x.shape) != full:  # a size-1 letter broadcasts against the others' size
            xs[i] = g.op("expand", x, shape=full)

    def reduce(x: Tensor, t: str, keep: set[str]) -> tuple[Tensor, str]:
        drop = [i for i, c in enumerate(t) if c not in keep]
        if not drop:
            return x, t
        return g.op("reduce_sum", x, axes=tuple(drop), keepdims=False), "".join(c for c in t if c in keep)

    def permute(x: Tensor, t: str, order: str) -> Tensor:
        perm = tuple(t.index(c) for c in order)
        return x if perm == tuple(range(len(t))) else g.op("transpose", x, perm=perm)

    cur, ct = xs[0], terms[0]
    rest_terms = terms[1:]
    cur, ct = reduce(cur, ct, set(out) | set("".join(rest_terms)))
    for k, (y, yt) in enumerate(zip(xs[1:], rest_terms)):
        later = set(out) | set("".join(rest_terms[k + 1:]))
        y, yt = reduce(y, yt, later | set(ct))
        cur, ct = reduce(cur, ct, later | set(yt))
        batch = [c for c in ct if c in yt and c in later]
        contr = [c for c in ct if c in yt and c not in later]
        a_only = [c for c in ct if c not in yt]
        b_only = [c for c in yt if c not in ct]
        nb, na, nk, nn = (math.prod(size[c] for c in cs) for cs in (batch, a_only, contr, b_only))
        a = g.op("reshape", permute(cur, ct, "".join(batch + a_only + contr)), shape=(nb, na, nk))
        b = g.op("reshape", permute(y, yt, "".join(batch + contr + b_only)), shape=(nb, nk, nn))
        ct = "".join(batch + a_only + b_only)
        cur = g.op("reshape", g.op("matmul", a, b), shape=tuple(size[c] for c in ct))
    cur, ct = reduce(cur, ct, set(out))
    return [permute(cur, ct, out)]


# ---------------------------------------------------------------------------------------------
# TopK


@_handler("TopK")
def _topk(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    if imp.opset >= 10:
        kv = imp.ints(ins[1] if len(ins) > 1 else None, "the TopK k")
        if not kv or len(kv) != 1:
            raise imp.unsupported("TopK k must be a single constant", fix="export with a constant k")
        k = kv[0]
    else:  # pragma: no cover - below MIN_OPSET
        k = int(attrs["k"])
    axis = int(attrs.get("axis", -1))
    if not -x.rank <= axis < x.rank:
        raise imp.unsupported(f"TopK axis={axis} is outside the rank {x.rank}", fix=_MALFORMED)
    axis %= x.rank
    n = x.shape[axis]
    if isinstance(n, str):
        raise imp.symbolic(f"TopK along the symbolic axis {n!r}", [n])
    if not 0 <= k <= n:
        raise imp.unsupported(f"TopK k={k} is outside [0, {n}] (axis {axis} of {x.shape})",
                              fix=_MALFORMED)
    if x.dtype is DType.BOOL or x.dtype.is_complex:
        raise imp.unsupported(f"TopK on {x.dtype}", fix="ONNX TopK takes real numbers")
    # sorted=0 allows any order, so the sorted one is a valid answer too.
    g = imp.g
    idx = g.op("topk_indices", x, k=k, axis=axis, largest=bool(int(attrs.get("largest", 1))))
    shape = _static(imp, x, "TopK input")
    if k == 0 or math.prod(shape) == 0:
        return [g.op("expand", g.const(0, x.dtype), shape=idx.shape), idx]
    # The values: x at those positions (a take along the axis as one flat gather; always in range).
    strides, total = _strides(shape), math.prod(shape)
    ish = tuple(int(d) for d in idx.shape)
    lin = idx * g.const(strides[axis], DType.I64) if strides[axis] != 1 else idx
    for d in range(len(shape)):
        if d != axis and ish[d] > 1:
            lin = lin + g.op("iota", shape=ish, axis=d, dtype=DType.I64) * g.const(strides[d], DType.I64)
    vals = g.op("gather", g.op("reshape", x, shape=(total,)), lin, axis=0)
    return [vals, idx]


__all__: list[str] = []
