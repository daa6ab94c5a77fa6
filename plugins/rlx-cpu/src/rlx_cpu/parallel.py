"""A small pool of Python threads that split row ranges of nogil Numba kernels.

Why not Numba's ``parallel=True``: its OpenMP/TBB pool and OpenBLAS's pool are two sets of threads
that each spin for the cores between kernels; on a 2-core machine that cost 10-30x. These workers
block in a C queue (no spinning), the caller runs the first share itself, and every kernel is a
nogil function ``f(*args, lo, hi)`` over rows ``lo:hi`` with cuts fixed in advance, so results
never depend on timing or on which thread took which piece.

Thread count: ``RLX_CPU_THREADS`` if set, else the cores this process may run on.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

#: Elements of work a thread must get before a kernel is split. Small kernels sit between small
#: GEMMs, which run on NumPy's threaded BLAS whose threads then spin on the other cores: MiniLM at
#: batch 1 (~200K-element attention/GELU, 49K-element layer_norm) ran 1.1 ms slower split than
#: serial. From batch 8 on (1.5M elements) the split pays.
MIN_ELEMS_PER_THREAD = 262144


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

    def run(self, fn: Callable[..., Any], n: int, args: Sequence[Any], parts: int, chunks: int = 0) -> None:
        """``fn(*args, lo, hi)`` over ``0:n`` on ``parts`` threads.

        The range is cut into ``chunks`` fixed contiguous pieces (default: one per thread) that the
        threads take in turn: on a busy machine a thread whose core is shared takes fewer pieces
        instead of holding every other thread up. The cuts never depend on timing, so neither
        do the results."""
        parts = max(1, min(parts, self.threads, n))
        if parts == 1:
            fn(*args, 0, n)
            return
        chunks = max(parts, min(chunks or parts, n))
        bounds = [n * k // chunks for k in range(chunks + 1)]
        if chunks == parts:
            work: Callable[[], None] | None = None
        else:
            ticket = itertools.count()  # next() on a count is atomic under the GIL

            def work() -> None:
                while (c := next(ticket)) < chunks:
                    fn(*args, bounds[c], bounds[c + 1])
        # One caller at a time: two sessions running in two threads share the workers.
        with self._lock:
            if not self._queues:
                self._start()
            for k in range(1, parts):
                if work is None:
                    self._queues[k - 1].put((fn, (*args, bounds[k], bounds[k + 1])))
                else:
                    self._queues[k - 1].put((work, ()))
            err: BaseException | None = None
            try:
                if work is None:
                    fn(*args, bounds[0], bounds[1])
                else:
                    work()
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


def split_rows(fn: Callable[..., Any], n: int, args: Sequence[Any], work_elems: int,
               chunks_per_thread: int = 4) -> Callable[[], None]:
    """A bound closure running ``fn`` over ``0:n`` rows on as many threads as the work is worth,
    in ``chunks_per_thread`` pieces a thread (see :meth:`RowPool.run`)."""
    parts = parts_for(work_elems)
    p = pool()
    if parts == 1:
        a = tuple(args)
        return lambda: fn(*a, 0, n)
    chunks = parts * chunks_per_thread
    return lambda: p.run(fn, n, args, parts, chunks)
