"""A native barrier wait for row chains: poll the threads' counters without holding the GIL.

Why native: a Python loop would hold the GIL the other thread needs to reach the barrier, and a
blocking wait costs a wake-up through the kernel at every barrier (a pool hand-off, which
blocks, costs ~20 us at the median on the 2-core CI machine: ``python bench/profile_cpu.py --pool``).
"""

from __future__ import annotations

import platform
from typing import Any

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_PAUSE = platform.machine() in ("x86_64", "AMD64")


@intrinsic
def _relax(typingctx: Any) -> Any:
    """A CPU spin hint (``pause`` on x86) plus a compiler barrier, so the counter is re-read each turn."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if _PAUSE:
            fn = ir.Function(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause") \
                if "llvm.x86.sse2.pause" not in builder.module.globals \
                else builder.module.globals["llvm.x86.sse2.pause"]
            builder.call(fn, [])
        builder.fence("acquire")  # no instruction on x86; stops LLVM keeping the load in a register
        return context.get_dummy_value()
    return types.none(), codegen


@njit(cache=True, nogil=True)
def wait_all(counters, target, turns):
    """True once every ``counters[i] >= target``; False after ``turns`` polls."""
    for _ in range(turns):
        done = True
        for i in range(counters.shape[0]):
            if counters[i] < target:
                done = False
        if done:
            return True
        _relax()
    return False
