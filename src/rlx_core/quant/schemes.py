"""Quantization schemes: activation parameters from a range, symmetric INT8 weights (per tensor or per
channel), int32 biases, and INT4 weights in groups. Scales are float32 values (what every backend uses).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import RLXError
from .fixedpoint import round_half_away


class QuantizationError(RLXError):
    """A graph, a weight or calibration data that cannot be quantized as asked."""


def f32(x: float) -> float:
    """``x`` rounded to float32 (as a Python float): the scale every implementation uses."""
    return float(np.float32(x))


def activation_qparams(lo: float, hi: float, *, symmetric: bool = False) -> tuple[float, int]:
    """``(scale, zero_point)`` of an int8 activation covering ``[lo, hi]`` (widened to contain 0).

    Asymmetric (default): ``scale = (hi - lo) / 255`` and the zero point puts ``lo`` at -128, so a
    non-negative tensor (after ReLU) uses all 256 levels. Symmetric: ``scale = max|.| / 127``, zero
    point 0. An all-zero range gets scale 1.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise QuantizationError(f"the calibrated range [{lo}, {hi}] is not finite",
                                fix="calibrate with finite data (no NaN/Inf activations)")
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if symmetric:
        a = max(-lo, hi)
        return (f32(a / 127.0) if a > 0 else 1.0), 0
    if hi == lo:
        return 1.0, 0
    scale = f32((hi - lo) / 255.0)
    if scale <= 0.0:  # a range so tiny its step underflows float32
        return 1.0, 0
    zp = int(round_half_away(-128.0 - lo / scale))
    return scale, max(-128, min(127, zp))


def quantize_weights_int8(w: Any, *, axis: int | None = 0) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights in [-127, 127]: per channel along ``axis`` (scales shaped
    ``(w.shape[axis],)``), or per tensor with ``axis=None`` (a scalar scale, shape ``()``).

    ``q = clamp(round(w / scale))`` with ``scale = max|w| / 127`` (1 for an all-zero channel);
    rounding is half away from zero, as TFLite's converter does.
    """
    w = np.asarray(w, np.float64)
    if not np.all(np.isfinite(w)):
        raise QuantizationError("a weight tensor holds NaN or Inf", fix="fix the model's weights first")
    if axis is None:
        amax = np.asarray(np.abs(w).max() if w.size else 0.0)
    else:
        ax = axis % w.ndim
        amax = np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != ax)) if w.size else \
            np.zeros(w.shape[ax])
    scales = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    view = scales if axis is None else scales.reshape([-1 if i == axis % w.ndim else 1
                                                       for i in range(w.ndim)])
    q = np.clip(round_half_away(w / view.astype(np.float64)), -127, 127).astype(np.int8)
    return q, scales


def quantize_bias(b: Any, x_scale: float, w_scales: Any) -> np.ndarray:
    """int32 bias with scale ``x_scale * w_scale`` (zero point 0), saturated to the int32 range."""
    s = np.float64(x_scale) * np.asarray(w_scales, np.float64)
    q = round_half_away(np.asarray(b, np.float64) / s)
    return np.clip(q, -(2**31), 2**31 - 1).astype(np.int32)


def quantize_int4_groups(w: Any, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """INT4 weight-only: ``w`` (N, K) -> packed bytes (N, K/2) and float32 scales (N, K/group_size).

    Symmetric per (row, group) with values in [-7, 7] (``scale = max|w| / 7``); two values per byte,
    element ``2j`` in the low nibble. ``K`` must be even and a multiple of ``group_size``.
    """
    w = np.asarray(w, np.float64)
    if w.ndim != 2:
        raise QuantizationError(f"INT4 groups need a 2-D (N, K) weight, got shape {w.shape}",
                                fix="quantize matmul/linear weights only")
    n, k = w.shape
    if group_size < 1 or k % group_size or k % 2:
        raise QuantizationError(f"K={k} is not even or not a multiple of group_size={group_size}",
                                fix="choose a group_size that divides K (K must be even)")
    if not np.all(np.isfinite(w)):
        raise QuantizationError("a weight tensor holds NaN or Inf", fix="fix the model's weights first")
    g = w.reshape(n, k // group_size, group_size)
    amax = np.abs(g).max(axis=2) if w.size else np.zeros((n, k // group_size))
    scales = np.where(amax > 0, amax / 7.0, 1.0).astype(np.float32)
    q = np.clip(round_half_away(g / scales[..., None].astype(np.float64)), -7, 7).astype(np.int64)
    q = (q.reshape(n, k) & 15).astype(np.uint8)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return packed, scales
