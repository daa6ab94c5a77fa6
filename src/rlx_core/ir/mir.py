"""The MIR primitive op set: every op with inference and a float64 NumPy reference.

References receive arrays already in reference precision (float64 for reals, complex128 for
complex, integers and bools exact) and return arrays the caller casts to the inferred dtype.
Integer arithmetic wraps (two's complement); integer ``div`` truncates toward zero, as C does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..dtypes import INDEX_DTYPES, DType
from ..errors import DTypeError, ShapeError
from .indices import normalize as normalize_indices

# Elementwise ops (unary, binary, compare, logical, where, cast), reductions (reduce_*, argmax,
# argmin) and data movement (reshape, transpose, expand, slice, concat, pad) are declared once each,
# with all their facts, in their family's module: importing it registers them.
from .ops import bitwise as _bitwise  # noqa: F401  (bitwise_and/or/xor/not on integers)
from .ops import bounded as _bounded  # noqa: F401  (nonzero, non_max_suppression: padded + count)
from .ops import elementwise as _elementwise  # noqa: F401
from .ops import exact as _exact  # noqa: F401  (mod on floats, bitcast: exact primitives)
from .ops import linalg as _linalg  # noqa: F401  (CSR sparse, solvers, dense factorizations)
from .ops import movement as _movement  # noqa: F401
from .ops import recurrent as _recurrent  # noqa: F401  (lstm_scan, gru_scan: one node a layer)
from .ops import reduction as _reduction  # noqa: F401
from .ops import splat as _splat  # noqa: F401  (3D Gaussian splatting: project, SH colour, rasterize)
from .ops._common import BOOL, FLOATS_C, NUMERIC, REAL, SIGNED, STORAGE  # noqa: F401  (re-exported)
from .ops._common import check_dtypes as _check_dtypes
from .ops._common import same_dtype as _same_dtype
from .ops._common import wrap_int as _wrap_int
from .ops.movement import slice_params  # noqa: F401  (public: rlx_core.plugin.slice_params)
from .schema import AttrSpec, IndexInput, OpSchema, register_op
from .types import Attrs, TensorType, attr_dtype, attr_ints, broadcast_shapes, normalize_axis

# -- matmul ------------------------------------------------------------------------------------

def _infer_matmul(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _check_dtypes("matmul", ts, NUMERIC)
    dt = _same_dtype("matmul", ts)
    a, b = ts[0].shape, ts[1].shape
    if not a or not b:
        raise ShapeError("matmul operands must have rank >= 1", fix="reshape scalars to [1]")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"matmul inner dims differ: {a} @ {b} ({a2[-1]} vs {b2[-2]})",
                         fix="the last dim of a must equal the second-to-last dim of b")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return [TensorType(dt, out)]


def _matmul_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    k = ins[0].shape[-1]
    return 2.0 * outs[0].numel() * (k if isinstance(k, int) else 1)


register_op(OpSchema("matmul", ("a", "b"), _infer_matmul,
                     _wrap_int(lambda a, b: np.matmul(a, b)), category="matmul", dtypes=NUMERIC,
                     flops=_matmul_flops, amp="low", accumulates=True,
                     doc="batched matrix product with broadcasting (NumPy rules)"))


# -- gather, scatter_add -----------------------------------------------------------------------

def _infer_gather(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _check_dtypes("gather (indices)", ts[1:], INDEX_DTYPES)
    ax = normalize_axis(attrs["axis"], ts[0].rank)  # type: ignore[arg-type]
    s = ts[0].shape
    return [TensorType(ts[0].dtype, s[:ax] + ts[1].shape + s[ax + 1:])]


def _ref_gather(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    ax = normalize_axis(attrs["axis"], xs[0].ndim)  # type: ignore[arg-type]
    idx = normalize_indices(xs[1], xs[0].shape[ax], what="gather", axis=ax)
    return [np.take(xs[0], idx, axis=ax)]


register_op(OpSchema("gather", ("x", "indices"), _infer_gather, _ref_gather,
                     attrs=(AttrSpec("axis", "int", default=0),), category="movement",
                     flops=lambda i, o, a: 0.0, index_inputs=(IndexInput(1),), dtypes=STORAGE,
                     doc="take along axis (NumPy take). Indices follow ONNX: valid in [-n, n-1] for "
                         "an axis of size n, a negative one counts from the end once, anything else "
                         "is an error (InputError; see rlx_core.ir.indices)"))


def _infer_scatter_add(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _check_dtypes("scatter_add (indices)", ts[1:2], INDEX_DTYPES)
    _check_dtypes("scatter_add", ts[:1], NUMERIC)
    if ts[2].dtype != ts[0].dtype:
        raise DTypeError(f"scatter_add updates are {ts[2].dtype}, data is {ts[0].dtype}",
                         fix="cast updates to the data dtype")
    if ts[1].shape != ts[2].shape or ts[1].rank != ts[0].rank:
        raise ShapeError(f"scatter_add: indices {ts[1].shape} and updates {ts[2].shape} must have "
                         f"equal shapes and the rank of data {ts[0].shape}",
                         fix="ONNX ScatterElements rules")
    normalize_axis(attrs["axis"], ts[0].rank)  # type: ignore[arg-type]
    return [ts[0]]


def _ref_scatter_add(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    data, idx, upd = xs
    ax = normalize_axis(attrs["axis"], data.ndim)  # type: ignore[arg-type]
    out = data.copy()
    grids: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    grids[ax] = normalize_indices(idx, data.shape[ax], what="scatter_add", axis=ax)
    np.add.at(out, tuple(grids), upd)
    return [out]


register_op(OpSchema("scatter_add", ("x", "indices", "updates"), _infer_scatter_add,
                     _ref_scatter_add, attrs=(AttrSpec("axis", "int", default=0),),
                     category="movement", dtypes=NUMERIC, index_inputs=(IndexInput(1),),
                     accumulates=True,
                     doc="out = x; out[.., indices[i], ..] += updates[i] along axis (duplicates add "
                         "up; ONNX ScatterElements with reduction='add'). Indices follow ONNX: valid in "
                         "[-n, n-1], a negative one counts from the end once, anything else is an "
                         "error (InputError; see rlx_core.ir.indices)"))


def _infer_iota(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    shape = tuple(attrs["shape"])  # type: ignore[arg-type]
    if any(d == -1 for d in shape):
        raise ShapeError("iota shape may not contain -1", fix="give every dim")
    normalize_axis(attrs["axis"], len(shape))  # type: ignore[arg-type]
    return [TensorType(attr_dtype(attrs, "dtype"), shape)]


def _ref_iota(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    shape = tuple(attrs["shape"])  # type: ignore[arg-type]
    ax = normalize_axis(attrs["axis"], len(shape))  # type: ignore[arg-type]
    if not shape:
        return [np.zeros((), np.int64)]
    view = [1] * len(shape)
    view[ax] = shape[ax]
    return [np.broadcast_to(np.arange(shape[ax]).reshape(view), shape)]


register_op(OpSchema("iota", (), _infer_iota, _ref_iota,
                     attrs=(AttrSpec("shape", "shape"), AttrSpec("axis", "int", default=0),
                            AttrSpec("dtype", "dtype", default=DType.I64)),
                     category="movement", dtypes=NUMERIC, differentiable=False,
                     doc="the index along `axis`, broadcast to `shape`"))


# -- conv2d and cumsum -------------------------------------------------------------------------

def _conv_attrs(attrs: Attrs) -> tuple[tuple[int, int], tuple[int, int, int, int], tuple[int, int], int]:
    s, p, d = attr_ints(attrs, "strides"), attr_ints(attrs, "pads"), attr_ints(attrs, "dilations")
    if len(s) != 2 or len(p) != 4 or len(d) != 2 or min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise ShapeError(f"conv2d strides {s}, pads {p}, dilations {d} are invalid",
                         fix="strides (sh, sw) >= 1, pads (top, left, bottom, right) >= 0, "
                             "dilations (dh, dw) >= 1")
    return (s[0], s[1]), (p[0], p[1], p[2], p[3]), (d[0], d[1]), int(attrs["groups"])  # type: ignore[arg-type]


def _infer_conv2d(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _check_dtypes("conv2d", ts, NUMERIC)
    dt = _same_dtype("conv2d", ts)
    x, w = ts[0].shape, ts[1].shape
    if len(x) != 4 or len(w) != 4:
        raise ShapeError(f"conv2d needs x NCHW and w OIHW (rank 4), got {x} and {w}",
                         fix="reshape to 4-D")
    (sh, sw), (pt, pl, pb, pr), (dh, dw), g = _conv_attrs(attrs)
    n, c, h, wd = x
    o, ci, kh, kw = w
    if g < 1 or (isinstance(c, int) and c % g) or (isinstance(o, int) and o % g):
        raise ShapeError(f"conv2d groups={g} must divide C={c} and O={o}", fix="pick a valid groups")
    if isinstance(c, int) and ci * g != c:
        raise ShapeError(f"conv2d weight has {ci} input channels per group, x has {c} channels "
                         f"and groups={g}", fix="w.shape[1] * groups must equal C")
    if isinstance(h, str) or isinstance(wd, str):
        raise ShapeError("conv2d spatial dims must be static", fix="specialize the graph first")
    ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1  # type: ignore[operator]
    wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1  # type: ignore[operator]
    if ho < 1 or wo < 1:
        raise ShapeError(f"conv2d output would be {ho}x{wo}", fix="the kernel is larger than the "
                         "padded input; reduce dilation or add padding")
    return [TensorType(dt, (n, o, ho, wo))]


def conv2d_reference(x: np.ndarray, w: np.ndarray, attrs: Attrs) -> np.ndarray:
    (sh, sw), (pt, pl, pb, pr), (dh, dw), g = _conv_attrs(attrs)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, c, h, wd = xp.shape
    o, ci, kh, kw = w.shape
    ho = (h - dh * (kh - 1) - 1) // sh + 1
    wo = (wd - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, ho, wo), dtype=np.result_type(x, w))
    og = o // g
    for gi in range(g):
        xs = xp[:, gi * ci:(gi + 1) * ci]
        ws = w[gi * og:(gi + 1) * og]
        for i in range(kh):
            for j in range(kw):
                rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)
                cols = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
                patch = xs[:, :, rows, cols]
                out[:, gi * og:(gi + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


def _conv_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    _, ci, kh, kw = ins[1].shape
    return 2.0 * outs[0].numel() * ci * kh * kw  # type: ignore[operator]


register_op(OpSchema("conv2d", ("x", "w"), _infer_conv2d,
                     lambda xs, a: [conv2d_reference(xs[0], xs[1], a)],
                     attrs=(AttrSpec("strides", "ints", default=(1, 1)),
                            AttrSpec("pads", "ints", default=(0, 0, 0, 0),
                                     doc="(top, left, bottom, right)"),
                            AttrSpec("dilations", "ints", default=(1, 1)),
                            AttrSpec("groups", "int", default=1)),
                     category="conv", dtypes=NUMERIC, flops=_conv_flops, amp="low",
                     accumulates=True,
                     doc="2-D cross-correlation, x NCHW, w OIHW (no bias: add it after)"))


def _infer_cumsum(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _check_dtypes("cumsum", ts, NUMERIC)
    normalize_axis(attrs["axis"], ts[0].rank)  # type: ignore[arg-type]
    return [ts[0]]


def _ref_cumsum(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = xs[0]
    if x.ndim == 0:
        return [x.copy()] if not attrs["exclusive"] else [np.zeros_like(x)]
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    if attrs["reverse"]:
        x = np.flip(x, ax)
    with np.errstate(all="ignore"):
        out = np.cumsum(x, axis=ax, dtype=x.dtype)
    if attrs["exclusive"]:
        out = out - x
    if attrs["reverse"]:
        out = np.flip(out, ax)
    return [out]


register_op(OpSchema("cumsum", ("x",), _infer_cumsum, _ref_cumsum,
                     attrs=(AttrSpec("axis", "int", default=-1),
                            AttrSpec("exclusive", "bool", default=False),
                            AttrSpec("reverse", "bool", default=False)),
                     category="scan", dtypes=NUMERIC, amp="f32", accumulates=True,
                     doc="running sum along axis"))

MIR_OPS: tuple[str, ...] = ()


def _collect() -> tuple[str, ...]:
    from .schema import REGISTRY

    return tuple(REGISTRY.names("mir"))


MIR_OPS = _collect()
from .ops import collective as _collective  # noqa: E402,F401  (after MIR_OPS: the compute primitives)
