"""Exact integer arithmetic of INT8 inference, in NumPy: the rules every backend must reproduce bit for bit.

The requantization rule is the one of TFLite and CMSIS-NN (gemmlowp's "double rounding"):

    y = RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(x * 2**left, multiplier), right)

with ``left = max(shift, 0)`` and ``right = max(-shift, 0)``: a real multiplier ``M`` is stored as a
Q31 ``multiplier`` in ``[2**30, 2**31)`` and a power-of-two ``shift`` (positive = left), see
:func:`quantize_multiplier`. Every function here takes and returns int64 arrays holding int32 values,
and says what happens at the ends of the int32 range (C code built with ``-fwrapv`` does the same).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
#: The shifts :func:`multiply_by_quantized_multiplier` accepts (TFLite allows [-31, 30]).
SHIFT_RANGE = (-31, 31)


def wrap_i32(x: Any) -> np.ndarray:
    """Two's-complement wraparound of int64 values to the int32 range (what C does with -fwrapv)."""
    x = np.asarray(x, np.int64)
    return ((x + 2**31) & (2**32 - 1)) - 2**31


def trunc_div(a: Any, b: Any) -> np.ndarray:
    """C integer division (truncates toward zero) on int64 arrays; ``b`` must be non-zero."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


def saturating_rounding_doubling_high_mul(a: Any, b: Any) -> np.ndarray:
    """``round(a * b / 2**31)`` with ties away from zero; the one overflow (INT32_MIN squared)
    saturates to INT32_MAX. gemmlowp's SaturatingRoundingDoublingHighMul."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    ab = a * b  # |ab| <= 2**62: exact in int64
    nudge = np.where(ab >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    q = trunc_div(ab + nudge, 1 << 31)
    return np.where((a == INT32_MIN) & (b == INT32_MIN), np.int64(INT32_MAX), q)


def rounding_divide_by_pot(x: Any, exponent: Any) -> np.ndarray:
    """``x / 2**exponent`` rounded to nearest, ties away from zero (gemmlowp's RoundingDivideByPOT);
    ``0 <= exponent <= 31``."""
    x = np.asarray(x, np.int64)
    e = np.asarray(exponent, np.int64)
    mask = (np.int64(1) << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> e) + (remainder > threshold)


def check_shift(shift: Any) -> None:
    s = np.asarray(shift)
    if s.size and (int(s.min()) < SHIFT_RANGE[0] or int(s.max()) > SHIFT_RANGE[1]):
        from ..errors import IRError

        raise IRError(f"requantize shift {int(s.min())}..{int(s.max())} is outside "
                      f"[{SHIFT_RANGE[0]}, {SHIFT_RANGE[1]}]",
                      fix="compute (multiplier, shift) with rlx_core.quant.quantize_multiplier")


def multiply_by_quantized_multiplier(x: Any, multiplier: Any, shift: Any) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier: ``x * multiplier * 2**(shift - 31)``, rounded.

    The left shift happens in int32 and wraps (as ``(int32_t)((uint32_t)x << left)`` in C)."""
    check_shift(shift)
    x = np.asarray(x, np.int64)
    s = np.asarray(shift, np.int64)
    left = np.maximum(s, 0)
    right = np.maximum(-s, 0)
    shifted = wrap_i32(x << left)
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(shifted, multiplier), right)


def requantize_reference(x: Any, multiplier: Any, shift: Any, zero_point: int, act_min: int,
                         act_max: int) -> np.ndarray:
    """The ``requantize`` op: scale an int32 accumulator, add the output zero point (int32, wrapping)
    and clamp to ``[act_min, act_max]``."""
    y = multiply_by_quantized_multiplier(x, multiplier, shift)
    return np.clip(wrap_i32(y + int(zero_point)), act_min, act_max)


def quantize_multiplier(real: float) -> tuple[int, int]:
    """A real multiplier ``M >= 0`` as ``(multiplier, shift)`` with ``M ~= multiplier * 2**(shift - 31)``
    and ``multiplier`` in ``[2**30, 2**31)`` (0 for M == 0); TFLite's QuantizeMultiplier."""
    if not math.isfinite(real) or real < 0:
        from ..errors import IRError

        raise IRError(f"cannot quantize the multiplier {real!r}", fix="multipliers are finite and >= 0")
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)  # real = q * 2**shift, q in [0.5, 1)
    fixed = math.floor(q * 2.0**31 + 0.5)
    if fixed == 2**31:
        fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    if shift > 30:
        return INT32_MAX, 30
    return fixed, shift


def quantize_multipliers(reals: Any) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quantize_multiplier` elementwise: (int32 multipliers, int32 shifts)."""
    flat = np.asarray(reals, np.float64).reshape(-1)
    pairs = [quantize_multiplier(float(r)) for r in flat]
    shape = np.shape(reals)
    m = np.array([p[0] for p in pairs], np.int32).reshape(shape)
    s = np.array([p[1] for p in pairs], np.int32).reshape(shape)
    return m, s


def round_half_even_f32(x: Any, scale: float) -> np.ndarray:
    """``rint(x / scale)`` where the quotient is the IEEE float32 quotient (what an f32 backend
    computes), as float64."""
    with np.errstate(all="ignore"):
        q = np.asarray(x).astype(np.float32) / np.float32(scale)
        return np.rint(q).astype(np.float64)


#: Softmax LUT resolution: exp values are Q16 (exp(0) = 65536), so a row may hold up to 32767 values.
SOFTMAX_ONE = 1 << 16
SOFTMAX_MAX_ROW = 32767


def softmax_lut(scale: float, beta: float = 1.0) -> np.ndarray:
    """``round(2**16 * exp(-beta * scale * d))`` for ``d = 0..255``: the int32 table of ``softmax_i8``."""
    d = np.arange(256, dtype=np.float64)
    return np.floor(SOFTMAX_ONE * np.exp(-float(beta) * float(np.float32(scale)) * d) + 0.5).astype(np.int32)


def softmax_i8_reference(x: Any, scale: float, beta: float, axis: int) -> np.ndarray:
    """Integer softmax: ``e = LUT[max - x]``, ``y = floor((256 * e + sum(e) / 2) / sum(e)) - 128``
    clamped to int8; the output is quantized with scale 1/256 and zero point -128."""
    x = np.asarray(x, np.int64)
    lut = softmax_lut(scale, beta).astype(np.int64)
    if x.size == 0:
        return x.copy()
    d = x.max(axis=axis, keepdims=True) - x
    e = lut[d]
    s = e.sum(axis=axis, keepdims=True)
    q = (e * 256 + s // 2) // s
    return np.clip(q - 128, -128, 127)


def round_half_away(x: Any) -> np.ndarray:
    """Round to nearest, ties away from zero (TFLite's TfLiteRound), as float64."""
    x = np.asarray(x, np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)
