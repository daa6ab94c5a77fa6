"""Exact elementwise MIR ops that no arithmetic decomposition reproduces bit for bit: ``mod`` (the
floating-point remainder, C's ``fmod`` or Python's floor remainder) and ``bitcast`` (reinterpret
the bits of each element as another dtype of the same width).

``a - trunc(a / b) * b`` rounds twice in floating point (for ``a = 1e30, b = 3`` it is off by
whole units), whereas ``fmod`` is always exact: the remainder is representable in the operands'
precision. ``bitcast`` has no arithmetic form at all. So each is a primitive: a backend that does
not claim one fails to compile it with a ``DispatchError`` naming the op, and they are opaque to
fusion (no ``expr``). ONNX's ``Mod`` on floats and ``BitCast`` import onto them
(:mod:`rlx_core.frontends.onnx_ops2`). Conformance cases: ``rlx_conformance.ops2_cases``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...dtypes import FLOAT_DTYPES, INT_DTYPES, WIDE_UINT_DTYPES, DType
from ...errors import DTypeError
from ..schema import AttrSpec, CaseSpec, OpSchema, register_op
from ..types import Attrs, TensorType, attr_dtype, broadcast_shapes
from ._common import check_dtypes, same_dtype

MOD_MODES = ("fmod", "floor")


def _infer_mod(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    check_dtypes("mod", ts, FLOAT_DTYPES)
    dt = same_dtype("mod", ts)
    return [TensorType(dt, broadcast_shapes(ts[0].shape, ts[1].shape))]


def _ref_mod(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    # np.mod is Python's rule: fmod, then + b when the remainder's sign differs from b's, and a
    # zero remainder takes b's sign. In float64 both are exact for f16/f32 operands (the final
    # + b rounds once when the result is stored, as the storage-precision kernel rounds it).
    fn = np.fmod if attrs.get("mode", "fmod") == "fmod" else np.mod
    with np.errstate(all="ignore"):
        return [np.asarray(fn(xs[0], xs[1]))]


register_op(OpSchema(
    "mod", ("a", "b"), _infer_mod, _ref_mod,
    attrs=(AttrSpec("mode", "str", "fmod", choices=MOD_MODES,
                    doc="'fmod': C's fmod (sign of a); 'floor': Python's a % b (sign of b)"),),
    category="elementwise", dtypes=FLOAT_DTYPES, elementwise=True, differentiable=False,
    accuracy="exact", cases=CaseSpec("ops2"),
    doc="floating-point remainder, exact: mode='fmod' is a - trunc(a/b)*b (C fmod), mode='floor' "
        "is a - floor(a/b)*b (Python/NumPy %); x % 0 and inf % y are NaN"))


#: Every dtype has a fixed width, so any can be reinterpreted as another of the same width.
BITCAST_DTYPES: tuple[DType, ...] = (DType.BOOL,) + FLOAT_DTYPES + tuple(INT_DTYPES) + WIDE_UINT_DTYPES


def _infer_bitcast(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    check_dtypes("bitcast", ts, BITCAST_DTYPES)
    src, to = ts[0].dtype, attr_dtype(attrs, "to")
    said = attr_dtype(attrs, "src")
    if said != src:
        raise DTypeError(f"bitcast says src={said} but its input is {src}",
                         fix="give src= the input's dtype (the float64 reference needs it to "
                             "recover the input's bits)")
    if to not in BITCAST_DTYPES or to.itemsize != src.itemsize:
        raise DTypeError(f"bitcast from {src} ({src.itemsize} bytes) to {to} "
                         f"({to.itemsize} bytes) changes the element width",
                         fix="bitcast between dtypes of one width (e.g. f32 <-> i32, f16 <-> i16)")
    if to == DType.BOOL:
        # a byte other than 0/1 is not a valid bool: NumPy and C++ leave it undefined
        raise DTypeError("bitcast to bool is not supported (bytes other than 0 and 1 are not bools)",
                         fix="bitcast to u8, then compare with 0 (not_equal) for a bool")
    return [TensorType(to, ts[0].shape)]


def _ref_bitcast(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    # The reference receives float64; back to the input's storage dtype first (exact: the input
    # was stored in it), then reinterpret its bytes.
    src, to = attr_dtype(attrs, "src"), attr_dtype(attrs, "to")
    with np.errstate(all="ignore"):
        x = np.asarray(xs[0]).astype(src.np, order="C")  # a copy: C-contiguous, 0-d stays 0-d
    return [x.view(to.np)]


register_op(OpSchema(
    "bitcast", ("x",), _infer_bitcast, _ref_bitcast,
    attrs=(AttrSpec("to", "dtype", doc="target dtype of the same width, e.g. to='i32' for f32"),
           AttrSpec("src", "dtype", doc="the input's dtype (the reference recovers its bits)")),
    category="elementwise", dtypes=BITCAST_DTYPES, elementwise=True, differentiable=False,
    accuracy="exact", cases=CaseSpec("ops2"),
    doc="reinterpret each element's bits as dtype `to` of the same width (NumPy's .view)"))
