"""The bitwise MIR ops on integers: ``bitwise_and``, ``bitwise_or``, ``bitwise_xor`` (broadcasting
binary) and ``bitwise_not`` (unary), two's complement as NumPy and ONNX define them.

No decomposition into the arithmetic ops is practical (one bit at a time would take 64 steps for
int64), so each is a primitive: backends that do not claim one fail to compile it with a
``DispatchError`` naming the op. They are opaque to fusion (no ``expr``): a backend runs them only
through a claim of its own. Conformance cases come from the small ``"bitwise"`` generator
(``rlx_conformance.bitwise_cases``): the ends of each type's range, -1/0, broadcasting, scalars and
empty tensors, compared exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...dtypes import INT_DTYPES, WIDE_UINT_DTYPES
from ..schema import CaseSpec, OpSchema, register_op
from ..types import Attrs, TensorType, broadcast_shapes
from ._common import check_dtypes, same_dtype, wrap_int

#: int8/16/32/64 and uint8: RLX's integer dtypes (bool has the logical ops).
INTS = tuple(INT_DTYPES) + WIDE_UINT_DTYPES


def _binary(name: str, fn: Callable[..., Any], doc: str) -> OpSchema:
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        check_dtypes(name, ts, INTS)
        dt = same_dtype(name, ts)
        return [TensorType(dt, broadcast_shapes(ts[0].shape, ts[1].shape))]

    return register_op(OpSchema(name, ("a", "b"), infer, wrap_int(fn), category="elementwise", doc=doc,
                                dtypes=INTS, elementwise=True, differentiable=False, accuracy="exact",
                                cases=CaseSpec("bitwise")))


def _infer_not(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    check_dtypes("bitwise_not", ts, INTS)
    return [TensorType(ts[0].dtype, ts[0].shape)]


_binary("bitwise_and", np.bitwise_and, "a & b on integers (two's complement)")
_binary("bitwise_or", np.bitwise_or, "a | b on integers (two's complement)")
_binary("bitwise_xor", np.bitwise_xor, "a ^ b on integers (two's complement)")
register_op(OpSchema("bitwise_not", ("x",), _infer_not, wrap_int(np.invert), category="elementwise",
                     doc="~x on integers (two's complement: -x - 1 for signed, 255 - x for uint8)",
                     dtypes=INTS, elementwise=True, differentiable=False, accuracy="exact",
                     cases=CaseSpec("bitwise")))
