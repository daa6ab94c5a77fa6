"""Metal Shading Language source for rlx-metal's kernels: the device kit's C-style kernel library
(:mod:`rlx_core.devicekit.cstyle`) in its Metal dialect. Pure Python.

Every kernel has the same calling convention, so one launcher serves them all (Apple GPU or host):
its device buffers in order (inputs, then the output), then ``constant int* P`` (the launch's
integer parameters: ``P[0]`` is the grid size, one thread per output element or row), then
``uint gid [[thread_position_in_grid]]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlx_core.plugin import KERNEL_DIALECTS, DType
from rlx_core.plugin import cstyle as _kit

MSL = KERNEL_DIALECTS["metal"]
HEADER = MSL.header
literal = _kit.literal


def elementwise_source(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> tuple[str, str]:
    """``(kernel name, MSL)``. P = [n, rank, dims[rank], strides of input k[rank] for each k]."""
    return _kit.elementwise_source(MSL, program, in_dtypes, out_dtype)


def module(sources: Sequence[str]) -> str:
    """One MSL translation unit holding ``sources`` (each kernel once)."""
    return _kit.module(MSL, sources)
