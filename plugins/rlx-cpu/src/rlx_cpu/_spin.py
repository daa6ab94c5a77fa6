"""Native waits for row chains' barriers and the row pool's hand-off: poll the threads' counters
without holding the GIL.

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


# The row pool's hand-off (parallel.RowPool with a spin window): counters the caller and the workers
# publish with sequentially consistent atomics, so a thread that is about to block and the thread
# that would wake it can never both miss each other (each stores, then reads the other's flag).

_YIELD = platform.system() in ("Linux", "Darwin")


def _item_ptr(context: Any, builder: Any, aryty: Any, ary: Any, idx: Any) -> Any:
    from numba.core import cgutils

    arr = context.make_array(aryty)(context, builder, value=ary)
    return cgutils.get_item_pointer(context, builder, aryty, arr, [idx], wraparound=False)


@intrinsic
def _load(typingctx: Any, ary: Any, idx: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.load_atomic(_item_ptr(context, builder, signature.args[0], args[0], args[1]),
                                   "seq_cst", 8)
    return types.int64(ary, types.intp), codegen


@intrinsic
def _store(typingctx: Any, ary: Any, idx: Any, val: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.store_atomic(args[2], _item_ptr(context, builder, signature.args[0], args[0], args[1]),
                             "seq_cst", 8)
        return context.get_dummy_value()
    return types.none(ary, types.intp, types.int64), codegen


@intrinsic
def _xchg(typingctx: Any, ary: Any, idx: Any, val: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.atomic_rmw("xchg", _item_ptr(context, builder, signature.args[0], args[0], args[1]),
                                  args[2], "seq_cst")
    return types.int64(ary, types.intp, types.int64), codegen


@intrinsic
def _yield(typingctx: Any) -> Any:
    """``sched_yield()``: a thread spinning on a core another process wants lets it run."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if _YIELD:
            from numba.core import cgutils

            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []),
                                                "sched_yield")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.none(), codegen


_CLOCK = {"Linux": 1, "Darwin": 6}.get(platform.system())  # CLOCK_MONOTONIC


@intrinsic
def _now_ns(typingctx: Any) -> Any:
    """``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds (0 where there is none)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i64 = ir.IntType(64)
        if _CLOCK is None:
            return ir.Constant(i64, 0)
        from numba.core import cgutils

        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(32), [ir.IntType(32), ir.IntType(8).as_pointer()]),
            "clock_gettime")
        ts = cgutils.alloca_once(builder, ir.ArrayType(i64, 2))  # struct timespec on 64-bit targets
        ptr = builder.bitcast(ts, ir.IntType(8).as_pointer())
        builder.call(fn, [ir.Constant(ir.IntType(32), _CLOCK), ptr])
        zero = ir.Constant(ir.IntType(32), 0)
        sec = builder.load(builder.gep(ts, [zero, zero]))
        nsec = builder.load(builder.gep(ts, [zero, ir.Constant(ir.IntType(32), 1)]))
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)
    return types.int64(), codegen


@njit(cache=True, nogil=True)
def spin_until(counters, lo, hi, target, turns, yield_every, window_ns=0):
    """True once every ``counters[lo:hi] >= target``; False after ``turns`` polls or, with
    ``window_ns``, that many nanoseconds (yielding the core every ``yield_every`` polls). The clock
    bounds the wait where the thread loses its core meanwhile: polls are only counted while it runs."""
    start = _now_ns() if window_ns > 0 else 0
    for t in range(turns):
        done = True
        for i in range(lo, hi):
            if _load(counters, i) < target:
                done = False
                break
        if done:
            return True
        _relax()
        if (t + 1) % yield_every == 0:
            _yield()
            if window_ns > 0 and _now_ns() - start >= window_ns:
                return False
    return False


@njit(cache=True, nogil=True)
def worker_wait(go, done, asleep, started, k, finished, target, turns, yield_every, settle, window_ns):
    """A pool worker ``k``: publish ``finished`` (>= 0) in ``done[k]``, then wait ``turns`` polls
    (``window_ns`` at most) for ``go[k] >= target``. 2: the caller sleeps and this worker must wake
    it (then call again with ``finished=-1``); 1: work arrived; 0: nothing within the window.

    Work arrives while the caller still holds the GIL: a worker that asked for it now would sleep
    in the kernel until the caller lets go (a wake-up, what the spin avoids). So it first waits for
    ``started[0]`` (the caller about to run its own piece, which lets go of the GIL) and ``settle``
    polls more."""
    if finished >= 0:
        _store(done, k, finished)
        if _load(asleep, 0) == 1 and _xchg(asleep, 0, 0) == 1:
            return 2
    if not spin_until(go, k, k + 1, target, turns, yield_every, window_ns):
        return 0
    spin_until(started, 0, 1, _load(go, k), turns, yield_every, window_ns)
    for _ in range(settle):
        _relax()
    return 1


@njit(cache=True, nogil=True)
def prepare_sleep(asleep, w, counters, lo, hi, target):
    """Thread ``w`` is about to block until ``counters[lo:hi] >= target``: mark it asleep, then look
    again. 0: block (a waker will see the mark); 1: ready, nobody will wake it; 2: ready, but a
    waker took the mark and sends (or sent) it a wake-up token: take that token."""
    _xchg(asleep, w, 1)
    for i in range(lo, hi):
        if _load(counters, i) < target:
            return 0
    return 1 if _xchg(asleep, w, 0) == 1 else 2


@njit(cache=True, nogil=True)
def publish(go, asleep, k, value):
    """Hand ``value`` to worker ``k``; True when it sleeps and must be sent a wake-up token."""
    _store(go, k, value)
    return _load(asleep, k) == 1 and _xchg(asleep, k, 0) == 1
