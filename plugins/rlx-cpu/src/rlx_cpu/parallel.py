"""A small pool of Python threads that split row ranges of nogil Numba kernels.

Why not Numba's ``parallel=True``: its OpenMP/TBB pool and OpenBLAS's pool are two sets of threads
that each spin for the cores between kernels; on a 2-core machine that cost 10-30x. These workers
block in a C queue (no spinning), the caller runs the first share itself, and every kernel is a
nogil function ``f(*args, lo, hi)`` over rows ``lo:hi`` with cuts fixed in advance, so results
never depend on timing or on which thread took which piece.

Thread count: ``RLX_CPU_THREADS`` if set (fixed), else the cores this process may run on, fewer
while other processes keep some of them busy (:class:`LoadProbe`; ``RLX_CPU_ADAPT=0`` turns that off).
"""

from __future__ import annotations

import itertools
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from . import settings

#: Elements of work a thread must get before a kernel is split. Small kernels sit between small
#: GEMMs, which run on NumPy's threaded BLAS whose threads then spin on the other cores: MiniLM at
#: batch 1 (~200K-element attention/GELU, 49K-element layer_norm) ran 1.1 ms slower split than
#: serial. From batch 8 on (1.5M elements) the split pays.
MIN_ELEMS_PER_THREAD = 262144


def default_threads() -> int:
    threads: int | None = settings.THREADS.get()
    if threads is not None:
        return threads
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def threads_for(cpus: int, others: float, most: int) -> int:
    """Threads to run when other processes keep ``others`` of our ``cpus`` allowed CPUs busy (in
    CPUs' worth): one a CPU that is at least three quarters free. A thread sharing its core with a
    busy process runs at half speed or less and holds every barrier up (MLP 784-512-256-10 at batch
    256 with a busy loop on one of two cores: 34 ms on two threads, 3.9 ms on one)."""
    return max(1, min(most, math.floor(cpus - others + 0.25)))


def _read_stat(cpus: list[int]) -> float | None:
    """Seconds the ``cpus`` have spent busy (not idle, not waiting for I/O) since boot, from
    /proc/stat; steal counts as busy (the hypervisor gave that time to someone else). None where
    there is no /proc/stat."""
    want = {f"cpu{c}" for c in cpus}
    try:
        with open("/proc/stat") as f:
            ticks = 0
            for line in f:
                if not line.startswith("cpu"):
                    break
                parts = line.split()
                if parts[0] in want:
                    v = [int(x) for x in parts[1:9]]
                    ticks += sum(v) - v[3] - v[4]  # minus idle and iowait
    except (OSError, ValueError, IndexError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


class LoadProbe:
    """How many of the allowed CPUs other processes leave to this one, measured every
    ``interval`` seconds (when :meth:`poll` is called) as the allowed CPUs' busy time minus this
    process's own CPU time. Reading /proc/stat costs ~30 us, once a quarter second at most."""

    def __init__(self, cpus: list[int], most: int, interval: float = 0.25,
                 read_stat: Callable[[list[int]], float | None] = _read_stat,
                 own_time: Callable[[], float] = time.process_time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cpus, self.most, self.interval = cpus, most, interval
        self._read, self._own, self._clock = read_stat, own_time, clock
        self.threads = most
        self.others = 0.0
        self._next = 0.0
        self._last: tuple[float, float, float] | None = None

    def due(self) -> float:
        """The ``time.monotonic`` time before which :meth:`poll` only returns ``threads`` (minus
        infinity with another clock: then every call polls)."""
        return self._next if self._clock is time.monotonic else -math.inf

    def poll(self) -> int:
        now = self._clock()
        if now < self._next:
            return self.threads
        self._next = now + self.interval
        busy = self._read(self.cpus)
        if busy is None:
            self._next = math.inf  # nothing to measure: keep every thread
            return self.threads
        own = self._own()
        if self._last is not None:
            t0, b0, o0 = self._last
            if now - t0 > 0:
                self.others = max(0.0, (busy - b0) - (own - o0)) / (now - t0)
                self.threads = threads_for(len(self.cpus), self.others, self.most)
        self._last = (now, busy, own)
        return self.threads


class _NumpyBlas:
    """NumPy's own OpenBLAS thread count, capped to the threads :class:`LoadProbe` allows while
    other processes keep CPUs busy and put back afterwards: its threads split each GEMM statically,
    so one on a busy core holds the GEMM up (ResNet-18 at batch 1 runs its convolutions there)."""

    def __init__(self) -> None:
        self._ctl: list[Any] | None = None
        self._orig: list[int] = []

    def cap(self, threads: int) -> None:
        if self._ctl is None:
            self._ctl = self._controllers()
            self._orig = [c.num_threads for c in self._ctl]
        for c, orig in zip(self._ctl, self._orig):
            want = min(orig, threads)
            if c.num_threads != want:  # a property: asks the library
                c.set_num_threads(want)

    @staticmethod
    def _controllers() -> list[Any]:
        try:
            from threadpoolctl import ThreadpoolController

            from .train_blas import _candidates
        except ImportError:
            return []
        mine = {os.path.realpath(p) for p in _candidates()}
        return [c for c in ThreadpoolController().lib_controllers
                if c.internal_api == "openblas" and os.path.realpath(c.filepath) in mine]


class RowPool:
    def __init__(self, threads: int, probe: LoadProbe | None = None) -> None:
        self.threads = threads
        #: threads dispatches use now (<= ``threads``; fewer while other processes load the CPUs)
        self.active = threads
        self.probe = probe
        #: the ``time.monotonic`` time before which :meth:`poll` has nothing to do (see poll())
        self.due = -math.inf if probe is not None else math.inf
        self._blas: _NumpyBlas | None = None
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

    def poll(self) -> None:
        """Follow the other processes' load (cheap between probes: one clock read)."""
        if self.probe is None:
            return
        active = self.probe.poll()
        due = getattr(self.probe, "due", None)
        self.due = due() if due is not None else -math.inf
        if active != self.active:
            self.active = active
            if self._blas is None:
                self._blas = _NumpyBlas()
            self._blas.cap(active)

    def run(self, fn: Callable[..., Any], n: int, args: Sequence[Any], parts: int, chunks: int = 0,
            exact: bool = False) -> None:
        """``fn(*args, lo, hi)`` over ``0:n`` on ``parts`` threads (``exact``: on that many
        whatever the load, for pieces that wait for each other).

        The range is cut into ``chunks`` fixed contiguous pieces (default: one per thread) that the
        threads take in turn: on a busy machine a thread whose core is shared takes fewer pieces
        instead of holding every other thread up. The cuts never depend on timing, so neither
        do the results, nor on how many threads run now (``active``): with fewer, the pieces
        are taken in turn by those."""
        want = max(1, min(parts, self.threads, n))
        chunks = max(want, min(chunks or want, n))
        parts = want if exact else min(want, self.active)
        if want == 1:
            fn(*args, 0, n)
            return
        if parts == 1:  # the same cuts one after another: results never depend on the load
            for c in range(chunks):
                fn(*args, n * c // chunks, n * (c + 1) // chunks)
            return
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
        threads = default_threads()
        adapt = settings.THREADS.get() is None and settings.ADAPT.get() and threads > 1
        cpus = allowed_cpus()
        _POOL = RowPool(threads, LoadProbe(cpus, min(threads, len(cpus))) if adapt else None)
    return _POOL


_monotonic = time.monotonic


def poll() -> None:
    """Called at the start of every program run: follow the machine's load (also for programs
    that never split a kernel: the cap on NumPy's BLAS threads applies to them too). Between
    probes one clock read and no further call: a small model's weights leave this code out of
    the caches at every run, where each Python frame costs several times its warm figure
    (``python bench/run_path.py``)."""
    p = _POOL or pool()
    if _monotonic() >= p.due:
        p.poll()


T = TypeVar("T")


class TeamSize(Protocol):
    """What :class:`PerTeam` reads of a pool: its threads and how many run now."""

    @property
    def threads(self) -> int: ...

    @property
    def active(self) -> int: ...


class _Solo:
    """A team of the calling thread alone (kernels too small for a team to pay off)."""

    threads = 1
    active = 1


SOLO: TeamSize = _Solo()


class PerTeam(Generic[T]):
    """One object per OpenMP team size: the pool's full team's made now, the others on first need.

    A oneDNN primitive's thread count is fixed when it is created (oneDNN sizes its work split then
    and opens that many OpenMP threads at every run, whatever ``omp_get_max_threads`` says later),
    so a kernel on a team keeps one primitive per thread count the pool runs with: ``get()``
    returns the one for the threads other processes leave now (``RowPool.active``)."""

    def __init__(self, make: Callable[[int], T], pl: TeamSize) -> None:
        self._make = make
        self._pl = pl
        #: the variant for all the pool's threads (made at once: a refused build fails the bind)
        self.full: T = make(pl.threads)
        self._variants: dict[int, T] = {pl.threads: self.full}

    @property
    def pool(self) -> TeamSize:
        """The pool whose active thread count picks the variant."""
        return self._pl

    def get(self) -> T:
        n = self._pl.active
        v = self._variants.get(n)
        if v is None:  # other processes took cores: a variant for fewer threads, made once
            v = self._variants[n] = self._make(n)
        return v

    def variant(self, n: int) -> T:
        """The variant for ``n`` threads (made on first need), whatever the load now."""
        v = self._variants.get(n)
        if v is None:
            v = self._variants[n] = self._make(n)
        return v


def parts_for(work_elems: int) -> int:
    """How many threads a kernel touching ``work_elems`` elements should use."""
    return max(1, min(pool().threads, work_elems // MIN_ELEMS_PER_THREAD))


class RowRun:
    """A bound kernel over rows ``0:n``: ``fn(*args, lo, hi)``, run on as many threads as its
    work is worth when called alone.

    It also says which memory a row piece touches (``rows_in`` / ``rows_out``: C-contiguous 2-D
    arrays of ``n`` rows, piece ``lo:hi`` reads or writes their rows ``lo:hi``; ``whole_in``: read
    in full by every piece), so :func:`chain` can run consecutive row kernels as one dispatch in
    which each thread carries its own rows through all of them."""

    __slots__ = (
        "_call",
        "args",
        "fn",
        "n",
        "rows_in",
        "rows_out",
        "whole_in",
        "work",
    )

    def __init__(self, fn: Callable[..., Any], n: int, args: Sequence[Any], work_elems: int, *,
                 chunks_per_thread: int = 4, parts: int | None = None,
                 rows_in: Sequence[Any] = (), whole_in: Sequence[Any] = (),
                 rows_out: Sequence[Any] = ()) -> None:
        self.fn, self.n, self.args = fn, n, tuple(args)
        self.work = work_elems
        self.rows_in, self.whole_in, self.rows_out = tuple(rows_in), tuple(whole_in), tuple(rows_out)
        parts = parts_for(work_elems) if parts is None else max(1, min(parts, pool().threads))
        a = self.args
        if parts == 1:
            self._call: Callable[[], None] = lambda: fn(*a, 0, n)
        else:
            p, chunks = pool(), parts * chunks_per_thread
            self._call = lambda: p.run(fn, n, a, parts, chunks)

    def __call__(self) -> None:
        self._call()

    def chainable(self) -> bool:
        return bool(self.rows_out) and all(_rows_ok(x, self.n) for x in (*self.rows_in, *self.rows_out))


def split_rows(fn: Callable[..., Any], n: int, args: Sequence[Any], work_elems: int,
               chunks_per_thread: int = 4, *, rows_in: Sequence[Any] = (), whole_in: Sequence[Any] = (),
               rows_out: Sequence[Any] = ()) -> RowRun:
    """A bound :class:`RowRun` of ``fn`` over ``0:n`` rows (the accessed rows: see :class:`RowRun`)."""
    return RowRun(fn, n, args, work_elems, chunks_per_thread=chunks_per_thread, rows_in=rows_in,
                  whole_in=whole_in, rows_out=rows_out)


def _rows_ok(x: Any, n: int) -> bool:
    return getattr(x, "ndim", 0) == 2 and x.shape[0] == n and x.flags.c_contiguous


def _span(x: Any, lo: int, hi: int) -> tuple[int, int]:
    """Byte interval of rows ``lo:hi`` of a C-contiguous 2-D array."""
    rb = x.strides[0]
    base = x.ctypes.data
    return base + lo * rb, base + hi * rb


def _whole(x: Any) -> tuple[int, int]:
    from numpy.lib.array_utils import byte_bounds

    lo, hi = byte_bounds(x)
    return int(lo), int(hi)


#: Marks a barrier between two stages of a :class:`_Chain`.
BARRIER = None
_POISON = 1 << 62


class _Chain:
    """Row kernels run back to back by each thread on its own rows: one dispatch instead of one
    per kernel (MiniLM: the whole encoder is one chain, ``bench/profile_cpu.py --chains``). Where a
    later kernel needs rows another thread wrote (or overwrites bytes another thread still reads:
    the memory planner reuses dead buffers), the threads meet at a barrier first.

    Between two barriers (a stage) the rows are cut into ``chunks`` fixed pieces that the threads
    take in turn, each running every kernel of the stage on its piece: a core slowed by another
    process takes fewer pieces instead of holding the others up. The cuts never depend on timing,
    so neither do the results."""

    def __init__(self, stages: Sequence[RowRun | None], parts: int, chunks: int) -> None:
        import numpy as np

        self.parts, self.chunks = parts, chunks
        self.stages: list[list[tuple[Any, tuple[Any, ...], int]]] = [[]]
        for r in stages:
            if r is None:
                self.stages.append([])
            else:
                self.stages[-1].append((r.fn, r.args, r.n))
        self.barriers = len(self.stages) - 1
        self.arrived = np.zeros(parts, np.int64)
        self.epoch = 0
        self._tickets: list[Any] = []
        self._q = parts

    def piece(self, p: int, _hi: int) -> None:
        from ._spin import wait_all

        chunks, tickets = self.chunks, self._tickets
        arrived = self.arrived[:self._q]  # the threads taking part in this run
        e = self.epoch
        try:
            for k, stage in enumerate(self.stages):
                if k:
                    e += 1
                    arrived[p] = e
                    while not wait_all(arrived, e, 20000):
                        os.sched_yield()  # another thread lost its core: let it have ours
                while (c := next(tickets[k])) < chunks:  # next() on a count is atomic under the GIL
                    for fn, args, n in stage:
                        fn(*args, n * c // chunks, n * (c + 1) // chunks)
        except BaseException:
            arrived[p] = _POISON  # nobody waits for this thread any more
            raise

    def __call__(self) -> None:
        pl = pool()
        q = min(self.parts, pl.active)
        if q == 1:  # the load left one thread: the same pieces in order, no barrier needed
            chunks = self.chunks
            for stage in self.stages:
                for c in range(chunks):
                    for fn, args, n in stage:
                        fn(*args, n * c // chunks, n * (c + 1) // chunks)
            return
        self._q = q
        self._tickets = [itertools.count() for _ in self.stages]
        try:
            pl.run(self.piece, q, (), q, exact=True)
        except BaseException:
            self.arrived[:] = 0
            self.epoch = 0
            raise
        self.epoch += self.barriers


Span = tuple[int, int]


def _meet(a: Span, b: Span) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[0] < a[1] and b[0] < b[1]


def _access_list(r: RowRun) -> list[tuple[Any, bool, bool]]:
    """(array, by rows?, written?) for everything ``r`` touches."""
    return ([(x, True, False) for x in r.rows_in] + [(x, False, False) for x in r.whole_in]
            + [(x, True, True) for x in r.rows_out])


def _hazard(group: Sequence[RowRun], r: RowRun, chunks: int) -> bool:
    """Could piece ``c`` of ``r`` touch bytes that piece ``c' != c`` of a kernel in ``group``
    writes, or write bytes such a piece reads or writes? (Pieces are ``n * c // chunks`` cuts
    of each kernel's rows; the same piece of every kernel runs on one thread, in order.)"""
    mine = _access_list(r)
    for g in group:
        for x, x_rows, x_w in mine:
            for y, y_rows, y_w in _access_list(g):
                if not (x_w or y_w) or not _meet(_whole(x), _whole(y)):
                    continue
                if not (x_rows and y_rows):
                    return chunks > 1  # read whole by every piece, or written by every piece
                for c in range(chunks):
                    sx = _span(x, r.n * c // chunks, r.n * (c + 1) // chunks)
                    for d in range(chunks):
                        if d != c and _meet(sx, _span(y, g.n * d // chunks, g.n * (d + 1) // chunks)):
                            return True
    return False


#: A chain is worth its dispatch from this much work (elements); below it kernels run alone.
CHAIN_MIN_WORK = 2 * MIN_ELEMS_PER_THREAD
#: How many unrelated steps (head-split transposes between the Q, K and V projections) a chain
#: may run ahead of.
CHAIN_LOOKAHEAD = 8

def _all_access(r: RowRun) -> tuple[list[Span], list[Span]]:
    reads = [_whole(x) for x in (*r.rows_in, *r.whole_in)]
    return reads, [_whole(x) for x in r.rows_out]


def _commute(r: RowRun, other: tuple[list[Span], list[Span]]) -> bool:
    """May ``r`` run before a step that came before it (reads/writes ``other``)?"""
    r_reads, r_writes = _all_access(r)
    o_reads, o_writes = other
    return not (any(_meet(w, x) for w in r_writes for x in (*o_reads, *o_writes))
                or any(_meet(w, x) for w in o_writes for x in r_reads))


def _gathers(r: RowRun) -> bool:
    """Does ``r`` read data in full that the program writes (so a chain needs a barrier first)?
    Read-only arrays are the program's constants."""
    return any(x.flags.writeable for x in r.whole_in)


def _hoist(runs: list[Any], ids: list[Any], acc: list[Any]) -> None:
    """Move each row-aligned row kernel in front of the gathering row kernels just before it when
    they touch no common bytes (in place). MiniLM: the K and V projections move in front of the
    Q head split, so the three projections and then the three head splits need one barrier each
    instead of one a pair."""
    for i in range(1, len(runs)):
        r = runs[i]
        if not (isinstance(r, RowRun) and r.chainable()) or _gathers(r):
            continue
        j = i
        while j > 0:
            p = runs[j - 1]
            if not (isinstance(p, RowRun) and p.chainable() and _gathers(p)
                    and _commute(r, _all_access(p))):
                break
            runs[j - 1], runs[j] = r, p
            ids[j - 1], ids[j] = ids[j], ids[j - 1]
            acc[j - 1], acc[j] = acc[j], acc[j - 1]
            j -= 1


#: Rows of the largest kernel a piece must keep for a chain to be cut finer than one piece a thread.
CHUNK_MIN_ROWS = 256


def _chunks(members: Sequence[RowRun], parts: int) -> int:
    """Pieces a chain's rows are cut into: up to four a thread when the largest kernel keeps
    ``CHUNK_MIN_ROWS`` rows a piece (MiniLM batch 8: two a thread; batch 1: one). More pieces let a
    thread on a busy core take fewer, at the cost of smaller GEMMs and more calls on a quiet one
    (``python bench/busy_core.py``: MiniLM batch 8 with a busy loop on one core 221 vs 245 ms with
    one fixed piece a thread, quiet 132 vs 125 ms)."""
    most, least = max(r.n for r in members), min(r.n for r in members)
    k = max(1, min(_max_pieces(), most // (parts * CHUNK_MIN_ROWS), least // (parts * 8)))
    return parts * k


def _max_pieces() -> int:
    """``RLX_CPU_CHAIN_PIECES``: pieces a thread at most (default 4; 1 = one fixed piece a thread)."""
    pieces: int = settings.CHAIN_PIECES.get()
    return pieces


def chain(runs: Sequence[Any], ids: Sequence[Any],
          access: Sequence[tuple[list[Span], list[Span]] | None] | None = None
          ) -> tuple[list[Any], list[Any]]:
    """Group chainable :class:`RowRun` steps into one dispatch each. ``ids``: one per run, a chain
    gets the tuple of its members'. ``access[i]``: the byte spans plain run ``i`` reads and writes,
    which lets a chain run ahead of it when they touch nothing in common (None: it never moves).
    ``RLX_CPU_CHAIN=0`` turns chaining off."""
    parts = pool().threads
    if parts < 2 or not settings.CHAIN.get():
        return list(runs), list(ids)
    acc = list(access) if access is not None else [None] * len(runs)
    runs, ids = list(runs), list(ids)
    _hoist(runs, ids, acc)
    out_runs: list[Any] = []
    out_ids: list[Any] = []
    stages: list[RowRun] = []
    gids: list[Any] = []
    held: list[int] = []  # plain steps the open chain has run ahead of, in order

    def ok(r: Any) -> bool:
        return isinstance(r, RowRun) and r.chainable() and r.n >= parts

    def flush() -> None:
        members = [r for r in stages if r is not None]
        if len(members) >= 2 and sum(r.work for r in members) >= CHAIN_MIN_WORK:
            chunks = _chunks(members, parts)
            staged: list[RowRun | None] = []
            stage_now: list[RowRun] = []
            for r in members:
                if stage_now and _hazard(stage_now, r, chunks):
                    staged.append(BARRIER)
                    stage_now.clear()
                staged.append(r)
                stage_now.append(r)
            out_runs.append(_Chain(staged, parts, chunks))
            out_ids.append(tuple(gids))
        else:
            out_runs.extend(members)
            out_ids.extend(gids)
        for i in held:
            out_runs.append(runs[i])
            out_ids.append(ids[i])
        stages.clear()
        gids.clear()
        held.clear()

    for i, r in enumerate(runs):
        if ok(r):
            if not (stages and all(_commute(r, acc[h]) for h in held)):  # type: ignore[arg-type]
                flush()
            stages.append(r)
            gids.append(ids[i])
        elif stages and acc[i] is not None and len(held) < CHAIN_LOOKAHEAD:
            held.append(i)
        else:
            flush()
            out_runs.append(r)
            out_ids.append(ids[i])
    flush()
    return out_runs, out_ids
