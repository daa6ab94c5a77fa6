"""Element types. One name per type (``f32``, ``bf16`` ...), used in the IR, the file format and the CLI."""

from __future__ import annotations

import enum
from functools import cached_property
from typing import Any

from .errors import DTypeError


class DType(enum.Enum):
    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    C64 = "c64"
    I8 = "i8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    U16 = "u16"
    U32 = "u32"
    U64 = "u64"
    BOOL = "bool"

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"DType.{self.name}"

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_complex(self) -> bool:
        return self is DType.C64

    @property
    def is_int(self) -> bool:
        return self in _INTS

    @property
    def is_signed(self) -> bool:
        return self not in _UNSIGNED

    @property
    def is_bool(self) -> bool:
        return self is DType.BOOL

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @cached_property
    def np(self) -> Any:
        """The NumPy dtype (bf16 through ``ml_dtypes``, imported only when first needed)."""
        import numpy as np

        if self is DType.BF16:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(_NP_NAMES[self])

    @classmethod
    def parse(cls, value: DType | str | Any) -> DType:
        """Accept a DType, its short name (``"f32"``), a NumPy dtype or a NumPy scalar type."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
            alias = _ALIASES.get(value)
            if alias is not None:
                return alias
        try:
            import numpy as np

            npd = np.dtype(value)
        except Exception:
            npd = None
        if npd is not None:
            for dt in cls:
                if dt.np == npd:
                    return dt
        names = ", ".join(d.value for d in cls)
        raise DTypeError(f"unknown dtype {value!r}", fix=f"use one of: {names}")


_FLOATS = frozenset({DType.F16, DType.BF16, DType.F32, DType.F64})
_INTS = frozenset({DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32, DType.U64})
#: bool counts as unsigned for is_signed (it has no sign bit), as before u16/u32/u64 existed.
_UNSIGNED = frozenset({DType.U8, DType.U16, DType.U32, DType.U64, DType.BOOL})
_ITEMSIZE = {DType.F16: 2, DType.BF16: 2, DType.F32: 4, DType.F64: 8, DType.C64: 8, DType.I8: 1,
             DType.I16: 2, DType.I32: 4, DType.I64: 8, DType.U8: 1, DType.U16: 2, DType.U32: 4,
             DType.U64: 8, DType.BOOL: 1}
_NP_NAMES = {DType.F16: "float16", DType.F32: "float32", DType.F64: "float64", DType.C64: "complex64",
             DType.I8: "int8", DType.I16: "int16", DType.I32: "int32", DType.I64: "int64",
             DType.U8: "uint8", DType.U16: "uint16", DType.U32: "uint32", DType.U64: "uint64",
             DType.BOOL: "bool"}
_ALIASES = {"float16": DType.F16, "half": DType.F16, "bfloat16": DType.BF16, "float32": DType.F32,
            "float": DType.F32, "float64": DType.F64, "double": DType.F64, "complex64": DType.C64,
            "int8": DType.I8, "int16": DType.I16, "int32": DType.I32, "int64": DType.I64,
            "uint8": DType.U8, "uint16": DType.U16, "uint32": DType.U32, "uint64": DType.U64}

ALL_DTYPES: tuple[DType, ...] = tuple(DType)
FLOAT_DTYPES: tuple[DType, ...] = (DType.F16, DType.BF16, DType.F32, DType.F64)
#: The integer dtypes every integer-accepting op takes. u16/u32/u64 are integers too (``is_int``)
#: but not in this group: each op family opts in to them (WIDE_UINT_DTYPES) deliberately, so the
#: conformance suite and every backend's claims grow only where ONNX models need them.
INT_DTYPES: tuple[DType, ...] = (DType.I8, DType.I16, DType.I32, DType.I64, DType.U8)
WIDE_UINT_DTYPES: tuple[DType, ...] = (DType.U16, DType.U32, DType.U64)
UINT_DTYPES: tuple[DType, ...] = (DType.U8,) + WIDE_UINT_DTYPES
NUMERIC_DTYPES: tuple[DType, ...] = FLOAT_DTYPES + (DType.C64,) + INT_DTYPES
INDEX_DTYPES: tuple[DType, ...] = (DType.I32, DType.I64)


def reference_np_dtype(dt: DType) -> Any:
    """The dtype a float64 reference computes in: f64 for reals, c128 for complex, exact for ints/bool."""
    import numpy as np

    if dt.is_float:
        return np.dtype("float64")
    if dt.is_complex:
        return np.dtype("complex128")
    return dt.np
