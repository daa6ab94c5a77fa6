"""Helpers shared by the op-family modules and :mod:`rlx_core.ir.mir`: dtype groups, dtype checks
and the integer-safe reference wrapper."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...dtypes import FLOAT_DTYPES, INT_DTYPES, STORAGE_DTYPES, WIDE_UINT_DTYPES, DType
from ...errors import DTypeError
from ..types import Attrs, TensorType

REAL = FLOAT_DTYPES + INT_DTYPES
NUMERIC = FLOAT_DTYPES + (DType.C64,) + INT_DTYPES
FLOATS_C = FLOAT_DTYPES + (DType.C64,)
SIGNED = FLOAT_DTYPES + (DType.C64, DType.I8, DType.I16, DType.I32, DType.I64)
BOOL = (DType.BOOL,)
#: The families that also take u16/u32/u64 (opt-in, see dtypes.INT_DTYPES): elementwise arithmetic,
#: comparisons, min/max and the sum/max/min reductions, what ONNX graphs on unsigned tensors use.
NUMERIC_U = NUMERIC + WIDE_UINT_DTYPES
REAL_U = REAL + WIDE_UINT_DTYPES
#: cast and the movement ops that ONNX graphs apply to float8/float4/int4/int2 tensors (reshape,
#: transpose, concat, slice, gather, where) also take the low-precision types (dtypes.LOWP_DTYPES).
STORAGE = STORAGE_DTYPES


def check_dtypes(op: str, ts: Sequence[TensorType], allowed: Sequence[DType]) -> None:
    for i, t in enumerate(ts):
        if t.dtype not in allowed:
            raise DTypeError(f"op {op!r} does not accept {t.dtype} (input {i})",
                             fix=f"{op} accepts {', '.join(map(str, allowed))}; cast first")


def same_dtype(op: str, ts: Sequence[TensorType]) -> DType:
    d = ts[0].dtype
    for i, t in enumerate(ts[1:], 1):
        if t.dtype != d:
            raise DTypeError(f"op {op!r} needs equal dtypes, got {d} and {t.dtype} (input {i})",
                             fix="insert a cast so both operands have the same dtype")
    return d


def wrap_int(fn: Callable[..., Any]) -> Callable[[Sequence[np.ndarray], Attrs], list[np.ndarray]]:
    """A reference from a NumPy function; integer overflow wraps silently, as in C."""
    def ref(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            return [np.asarray(fn(*xs))]
    return ref
