"""Conformance cases for conv ops with a residual operand (``rlx_cpu.conv2d_bias_add_relu``: a
ResNet block's tail, ``relu(conv2d_bias(x, w, b) + residual)``): the ``"conv2d_bias_residual"``
family of :data:`rlx_conformance.cases.GENERATORS`. Every ``conv2d_bias`` case (strides, pads,
dilations, groups, depthwise, 1x1, large products, NaN/Inf pixels) with a residual of the conv
output's shape, plus residuals that matter to the tail: large negatives (the ReLU clamps outputs the
conv made positive), NaN and infinities (the add and the ReLU must propagate them).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from rlx_core.plugin import REGISTRY, DType

Shape = tuple[int, ...]


def _residual_special(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Normal values with a few NaN, +Inf and -Inf."""
    x = rng.standard_normal(shape)
    pick = rng.random(shape)
    x = np.where(pick < 0.05, np.nan, np.where(pick < 0.1, np.inf, np.where(pick < 0.15, -np.inf, x)))
    return x.astype(dt.np)


def _residual_negative(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Large negative values: most outputs clamp to 0 after the add."""
    return (-50.0 - 10 * rng.random(shape)).astype(dt.np)


def gen_conv2d_bias_residual(c: Any) -> None:
    from .cases import OpCase, _Cases, _gen_conv2d_bias, v_default

    base = _Cases(c.op, c.dtype, c.seed)
    _gen_conv2d_bias(base)
    conv = REGISTRY.get("conv2d_bias")
    extra = {"basic": (_residual_negative, "basic", "negative_residual"),
             "strided_padded": (_residual_special, "nan_inf", "nan_inf_residual")}
    for case in base.out:
        ins = dict(case.inputs)
        attrs = conv.check_attrs(case.attrs, c.op)  # with the defaults filled in
        (out,) = conv.reference([ins["x"], ins["w"], ins["b"]], attrs)
        label = case.id.split("-", 1)[1]
        variants = [(v_default, case.kind, label)]
        if label in extra:
            variants.append(extra[label])
        for fn, kind, lab in variants:
            cid = f"{c.op}[{c.dtype}]-{lab}"
            rng = np.random.default_rng(c.seed + zlib.crc32(cid.encode()))
            res = fn(rng, out.shape, c.dtype)
            assert cid not in c._ids, f"duplicate case id {cid}"
            c._ids.add(cid)
            inputs = (*case.inputs, ("residual", res))
            c.out.append(OpCase(cid, c.op, c.dtype, inputs, dict(case.attrs), kind))


GENERATORS = {"conv2d_bias_residual": gen_conv2d_bias_residual}
