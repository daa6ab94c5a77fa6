"""Quantization: INT8 post-training quantization (TFLite/CMSIS-NN arithmetic) and INT4 weight-only.

Importing this package registers the quantized ops (:mod:`rlx_core.quant.ops`: ``quantize``,
``dequantize``, ``matmul_i8``, ``conv2d_i8``, ``requantize``, ``softmax_i8``, ``max_pool2d_i8``,
``avg_pool2d_i8``, ``dequantize_int4``), each with an exact reference and a decomposition into MIR
integer ops, so every backend that runs the MIR integer ops runs INT8 graphs bit-exactly.

    from rlx_core.quant import quantize_graph
    q = quantize_graph(float_graph, {"x": calibration_images}, method="percentile")
    Session("cpu").compile(q).run(x=images)        # the INT8 reference, via common_ir

Pieces: :mod:`.calibrate` (ranges: maxabs / percentile / minmax), :mod:`.schemes` (scales, zero
points, int8 weights per tensor or per channel, int32 biases, INT4 groups), :mod:`.fixedpoint`
(the integer rules: requantization, softmax table), :mod:`.convert` (:func:`quantize_graph`,
:func:`quantize_weights_int4`), :mod:`.cli` (``rlx quantize``).
"""

from __future__ import annotations

from . import ops as ops  # registers the quantized ops
from .calibrate import METHODS, Range, calibrate
from .convert import QTensor, quantize_graph, quantize_weights_int4
from .fixedpoint import (
                         multiply_by_quantized_multiplier,
                         quantize_multiplier,
                         quantize_multipliers,
                         requantize_reference,
                         softmax_lut,
)
from .ops import QUANT_OPS
from .schemes import (
                         QuantizationError,
                         activation_qparams,
                         quantize_bias,
                         quantize_int4_groups,
                         quantize_weights_int8,
)

__all__ = ["METHODS", "QUANT_OPS", "QTensor", "QuantizationError", "Range", "activation_qparams",
           "calibrate", "multiply_by_quantized_multiplier", "ops", "quantize_bias", "quantize_graph",
           "quantize_int4_groups", "quantize_multiplier", "quantize_multipliers", "quantize_weights_int4",
           "quantize_weights_int8", "requantize_reference", "softmax_lut"]
