"""A small pool of Python threads that split row ranges of nogil Numba kernels.

Why not Numba's ``parallel=True``: its OpenMP/TBB pool and OpenBLAS's pool are two sets of threads
that each spin for the cores between kernels; on a 2-core machine that cost 10-30x. These workers
block in a C queue (no spinning), the caller runs the first share itself, and every kernel is a
nogil function ``f(*args, lo, hi)`` over rows ``lo:hi``, so the split is deterministic: the same
rows always go to the same computation and results never depend on timing.

Thread count: ``RLX_CPU_THREADS`` if set, else the cores this process may run on.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

#: Below this many elements of work per extra thread, one thread is faster than a hand-off.
MIN_ELEMS_PER_THREAD = 16384


def default_threads() -> int:
    env = os.environ.get("RLX_CPU_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"RLX_CPU_THREADS={env!r} is not an integer; set it to a thread count "
                             "such as 2, or unset it to use every core") from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class RowPool:
    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._lock = threading.Lock()
        self._queues: list[queue.SimpleQueue[Any]] = []
        self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()

    def _start(self) -> None:
        for _ in range(self.threads - 1):
            q: queue.SimpleQueue[Any] = queue.SimpleQueue()
            threading.Thread(target=self._loop, args=(q,), daemon=True, name="rlx-cpu-rows").start()
            self._queues.append(q)

    def _loop(self, q: queue.SimpleQueue[Any]) -> None:
        while True:
            fn, args = q.get()
            try:
                fn(*args)
            except BaseException as e:  # handed back to the caller, never lost in a thread
                self._done.put(e)
            else:
                self._done.put(None)

    def run(self, fn: Callable[..., Any], n: int, args: Sequence[Any], parts: int) -> None:
        """``fn(*args, lo, hi)`` over ``0:n`` split in ``parts`` contiguous ranges."""
        parts = max(1, min(parts, self.threads, n))
        if parts == 1:
            fn(*args, 0, n)
            return
        bounds = [n * k // parts for k in range(parts + 1)]
        # One caller at a time: two sessions running in two threads share the workers.
        with self._lock:
            if not self._queues:
                self._start()
            for k in range(1, parts):
                self._queues[k - 1].put((fn, (*args, bounds[k], bounds[k + 1])))
            err: BaseException | None = None
            try:
                fn(*args, bounds[0], bounds[1])
            except BaseException as e:
                err = e
            for _ in range(1, parts):
                e2 = self._done.get()
                err = err or e2
        if err is not None:
            raise err


_POOL: RowPool | None = None


def pool() -> RowPool:
    global _POOL
    if _POOL is None:
        _POOL = RowPool(default_threads())
    return _POOL


def parts_for(work_elems: int) -> int:
    """How many threads a kernel touching ``work_elems`` elements should use."""
    return max(1, min(pool().threads, work_elems // MIN_ELEMS_PER_THREAD))


def split_rows(fn: Callable[..., Any], n: int, args: Sequence[Any], work_elems: int) -> Callable[[], None]:
    """A bound closure running ``fn`` over ``0:n`` rows on as many threads as the work is worth."""
    parts = parts_for(work_elems)
    p = pool()
    if parts == 1:
        a = tuple(args)
        return lambda: fn(*a, 0, n)
    return lambda: p.run(fn, n, args, parts)
