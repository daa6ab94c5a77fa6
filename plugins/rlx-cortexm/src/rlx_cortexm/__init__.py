"""rlx-cortexm: INT8 graphs as one freestanding C program for Arm Cortex-M, run on QEMU.

The backend claims the quantized ops of :mod:`rlx_core.quant` (and the data movement they need),
generates one C program per compiled LIR program (weights in flash, one static arena laid out by the
LIR memory planner, no heap), builds it with arm-none-eabi-gcc and runs it on QEMU's MPS2 boards with
semihosting file I/O. Results are bit-identical to the INT8 reference (rlx-cpu, common_ir).
"""

__version__ = "0.1.0"
