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
    # Low-precision storage types (ONNX FLOAT8*/FLOAT4E2M1/INT4/UINT4/INT2/UINT2): NumPy arrays of
    # ml_dtypes' types, one element per byte (ONNX files pack int4/int2; the importer unpacks).
    F8E4M3FN = "f8e4m3fn"
    F8E5M2 = "f8e5m2"
    F8E4M3FNUZ = "f8e4m3fnuz"
    F8E5M2FNUZ = "f8e5m2fnuz"
    F4E2M1 = "f4e2m1"
    I4 = "i4"
    U4 = "u4"
    I2 = "i2"
    U2 = "u2"

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

    @property
    def is_lowp(self) -> bool:
        """A low-precision storage type (float8/float4/int4/int2): movement and casts only."""
        return self in _LOWP

    @cached_property
    def np(self) -> Any:
        """The NumPy dtype (bf16 and the low-precision types through ``ml_dtypes``, imported only
        when first needed)."""
        import numpy as np

        name = _ML_NAMES.get(self)
        if name is not None:
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, name))
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
            # ml_dtypes' types match only a dtype of ml_dtypes: NumPy's own are found without
            # importing it (~1 MB of RSS and 5 ms for every ONNX model's float32 weights).
            lowp = npd.type.__module__.startswith("ml_dtypes")
            for dt in cls:
                if (dt in _ML_NAMES) == lowp and dt.np == npd:
                    return dt
        names = ", ".join(d.value for d in cls)
        raise DTypeError(f"unknown dtype {value!r}", fix=f"use one of: {names}")


_LOWP_FLOATS = frozenset({DType.F8E4M3FN, DType.F8E5M2, DType.F8E4M3FNUZ, DType.F8E5M2FNUZ, DType.F4E2M1})
_LOWP_INTS = frozenset({DType.I4, DType.U4, DType.I2, DType.U2})
_LOWP = _LOWP_FLOATS | _LOWP_INTS
_FLOATS = frozenset({DType.F16, DType.BF16, DType.F32, DType.F64}) | _LOWP_FLOATS
_INTS = frozenset({DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32,
                   DType.U64}) | _LOWP_INTS
#: bool counts as unsigned for is_signed (it has no sign bit), as before u16/u32/u64 existed.
_UNSIGNED = frozenset({DType.U8, DType.U16, DType.U32, DType.U64, DType.BOOL, DType.U4, DType.U2})
#: Bytes per element in memory (NumPy storage): the packed int4/int2 layout exists only in files.
_ITEMSIZE = {DType.F16: 2, DType.BF16: 2, DType.F32: 4, DType.F64: 8, DType.C64: 8, DType.I8: 1,
             DType.I16: 2, DType.I32: 4, DType.I64: 8, DType.U8: 1, DType.U16: 2, DType.U32: 4,
             DType.U64: 8, DType.BOOL: 1, **{d: 1 for d in _LOWP}}
_ML_NAMES = {DType.BF16: "bfloat16", DType.F8E4M3FN: "float8_e4m3fn", DType.F8E5M2: "float8_e5m2",
             DType.F8E4M3FNUZ: "float8_e4m3fnuz", DType.F8E5M2FNUZ: "float8_e5m2fnuz",
             DType.F4E2M1: "float4_e2m1fn", DType.I4: "int4", DType.U4: "uint4", DType.I2: "int2",
             DType.U2: "uint2"}
_NP_NAMES = {DType.F16: "float16", DType.F32: "float32", DType.F64: "float64", DType.C64: "complex64",
             DType.I8: "int8", DType.I16: "int16", DType.I32: "int32", DType.I64: "int64",
             DType.U8: "uint8", DType.U16: "uint16", DType.U32: "uint32", DType.U64: "uint64",
             DType.BOOL: "bool"}
_ALIASES = {"float16": DType.F16, "half": DType.F16, "bfloat16": DType.BF16, "float32": DType.F32,
            "float": DType.F32, "float64": DType.F64, "double": DType.F64, "complex64": DType.C64,
            "int8": DType.I8, "int16": DType.I16, "int32": DType.I32, "int64": DType.I64,
            "uint8": DType.U8, "uint16": DType.U16, "uint32": DType.U32, "uint64": DType.U64,
            **{v: k for k, v in _ML_NAMES.items()}}

#: The low-precision storage types. They are in no other group below and not in ALL_DTYPES: only
#: ``cast`` and the movement ops (reshape, transpose, concat, slice, gather, where) opt in to them
#: (what ONNX graphs do with them before a DequantizeLinear or Cast), so every backend's claims and
#: the conformance suite grow only there; arithmetic on them is refused (cast first).
LOWP_FLOAT_DTYPES: tuple[DType, ...] = (DType.F8E4M3FN, DType.F8E5M2, DType.F8E4M3FNUZ, DType.F8E5M2FNUZ,
                                        DType.F4E2M1)
LOWP_INT_DTYPES: tuple[DType, ...] = (DType.I4, DType.U4, DType.I2, DType.U2)
LOWP_DTYPES: tuple[DType, ...] = LOWP_FLOAT_DTYPES + LOWP_INT_DTYPES
#: Every dtype but the low-precision ones (the default of an op schema's ``dtypes``).
ALL_DTYPES: tuple[DType, ...] = tuple(d for d in DType if d not in _LOWP)
#: ALL_DTYPES plus the low-precision types: the dtypes of ``cast`` and the movement ops.
STORAGE_DTYPES: tuple[DType, ...] = ALL_DTYPES + LOWP_DTYPES
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
