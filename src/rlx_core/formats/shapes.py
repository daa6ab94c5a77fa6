"""Shape limits shared by the file readers (safetensors, ``.rlx``, GGUF).

A file can declare shapes NumPy cannot hold even when they have no elements (``[0, 2**62, 2**62]``) or
more axes than NumPy allows; without these checks the reader would fail later with NumPy's raw
ValueError ("array is too big", "maximum supported dimension"). Readers turn a problem reported here
into their own SerializationError naming the tensor and field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: NumPy's (and so RLX's) maximum number of array dimensions.
MAX_DIMS = 64
#: The largest byte size (and dimension) NumPy can describe: ``np.iinfo(np.intp).max`` on 64-bit hosts.
MAX_BYTES = 2**63 - 1


def shape_problem(shape: Sequence[int], itemsize: int) -> str | None:
    """Why an array of ``shape`` with ``itemsize``-byte elements cannot exist (None if it can).

    NumPy's rule, including for zero-element shapes: at most :data:`MAX_DIMS` axes, and the product
    of the non-zero dimensions times the item size fits in a signed 64-bit byte count."""
    if len(shape) > MAX_DIMS:
        return f"the shape has {len(shape)} dimensions, more than the {MAX_DIMS} an array can have"
    for axis, d in enumerate(shape):
        if d > MAX_BYTES:
            return f"dimension {axis} is {d}, larger than any array dimension can be ({MAX_BYTES})"
    extent = math.prod(int(d) for d in shape if d) * max(int(itemsize), 1)
    if extent > MAX_BYTES:
        empty = " (it has no elements, but its other dimensions still must fit)" if 0 in shape else ""
        return (f"shape {list(shape)} spans {extent:,} bytes, more than an array can describe "
                f"({MAX_BYTES:,}){empty}")
    return None


__all__ = ["MAX_BYTES", "MAX_DIMS", "shape_problem"]
