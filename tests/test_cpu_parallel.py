"""rlx-cpu's row pool: deterministic contiguous splits, every row exactly once, errors reach the caller."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from rlx_cpu.parallel import RowPool, default_threads, split_rows


def _mark(out: np.ndarray, tids: np.ndarray, lo: int, hi: int) -> None:
    out[lo:hi] += 1
    tids[lo:hi] = threading.get_ident()


@pytest.mark.parametrize("n", [1, 2, 7, 1000])
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_every_row_once_in_contiguous_ranges(n: int, parts: int) -> None:
    pool = RowPool(3)
    out = np.zeros(n, np.int64)
    tids = np.zeros(n, np.int64)
    for _ in range(3):  # reuse: the workers survive between calls
        pool.run(_mark, n, (out, tids), parts)
    assert (out == 3).all()
    used = min(parts, n)
    # Each thread owns one contiguous block: the owner changes at most used-1 times along the rows.
    assert int((np.diff(tids) != 0).sum()) <= used - 1


def test_worker_exception_reaches_the_caller() -> None:
    pool = RowPool(2)

    def boom(lo: int, hi: int) -> None:
        if lo > 0:
            raise ValueError(f"row {lo} failed")

    with pytest.raises(ValueError, match="row 5 failed"):
        pool.run(boom, 10, (), 2)
    out = np.zeros(4, np.int64)
    pool.run(_mark, 4, (out, np.zeros(4, np.int64)), 2)  # the pool still works afterwards
    assert (out == 1).all()


def test_small_work_stays_on_the_calling_thread() -> None:
    out = np.zeros(8, np.int64)
    tids = np.zeros(8, np.int64)
    split_rows(_mark, 8, (out, tids), work_elems=100)()
    assert (tids == threading.get_ident()).all() and (out == 1).all()


def test_thread_count_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CPU_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("RLX_CPU_THREADS", "many")
    with pytest.raises(ValueError, match="RLX_CPU_THREADS"):
        default_threads()


@pytest.mark.parametrize("n,chunks", [(10, 8), (1000, 8), (5, 40)])
def test_chunked_runs_cover_every_row_once(n: int, chunks: int) -> None:
    pool = RowPool(2)
    out = np.zeros(n, np.int64)
    seen: list[tuple[int, int]] = []

    def mark(o: np.ndarray, lo: int, hi: int) -> None:
        seen.append((lo, hi))
        o[lo:hi] += 1

    pool.run(mark, n, (out,), 2, chunks)
    assert (out == 1).all()
    c = min(chunks, n)
    assert sorted(seen) == [(n * k // c, n * (k + 1) // c) for k in range(c)]  # the fixed cuts


# The spinning hand-off (RLX_CPU_POOL_SPIN_US > 0) against the blocking one (0): the same cuts, the same
# results, errors and concurrent callers handled alike, and workers that outlast the spin window (or a
# caller that waits past it) falling back to blocking without losing a hand-off.

_SPINS = [0, 200, 1]  # blocking; the default window; a window so short every wait ends up blocking


def _spin_pool(threads: int, spin_us: int) -> RowPool:
    """A pool on the hand-off asked for (the spinning one runs where Numba is loaded)."""
    pytest.importorskip("numba")
    pool = RowPool(threads, spin_us=spin_us)
    pool.run(_mark, threads, (np.zeros(threads, np.int64), np.zeros(threads, np.int64)), threads)
    assert (pool._spin is not None) == (spin_us > 0)
    return pool


def _sum_rows(x: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
    out[lo:hi] = x[lo:hi].sum(axis=1)


@pytest.mark.parametrize("spin_us", _SPINS)
@pytest.mark.parametrize("threads", [2, 3])
def test_many_back_to_back_dispatches(spin_us: int, threads: int) -> None:
    pool = _spin_pool(threads, spin_us)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((97, 33))
    want = x.astype(np.float64).sum(axis=1)
    counts = np.zeros(97, np.int64)
    for i in range(3000):
        out = np.full(97, np.nan)
        parts = 1 + i % threads
        pool.run(_sum_rows, 97, (x, out), parts, chunks=(i % 5) * parts)
        np.testing.assert_allclose(out, want, rtol=1e-12)
        pool.run(_mark, 97, (counts, np.zeros(97, np.int64)), parts)
    assert (counts == 3000).all()


@pytest.mark.parametrize("spin_us", _SPINS)
def test_spin_pool_cuts_do_not_depend_on_timing(spin_us: int) -> None:
    """Pieces that sleep at random cover the same fixed cuts, each once, whatever the window."""
    import random
    import time

    pool = _spin_pool(3, spin_us)
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()
    r = random.Random(1)

    def piece(lo: int, hi: int) -> None:
        time.sleep(r.choice([0.0, 0.0, 0.0005, 0.002]))
        with lock:
            seen.append((lo, hi))

    for _ in range(20):
        seen.clear()
        pool.run(piece, 50, (), 3, chunks=7)
        assert sorted(seen) == [(50 * k // 7, 50 * (k + 1) // 7) for k in range(7)]


@pytest.mark.parametrize("spin_us", _SPINS)
def test_spin_pool_worker_exception_reaches_the_caller(spin_us: int) -> None:
    pool = _spin_pool(3, spin_us)

    def boom(lo: int, hi: int) -> None:
        if lo > 0:
            raise ValueError(f"row {lo} failed")

    for _ in range(5):
        with pytest.raises(ValueError, match="failed"):
            pool.run(boom, 9, (), 3)
    out = np.zeros(9, np.int64)
    pool.run(_mark, 9, (out, np.zeros(9, np.int64)), 3)  # the workers survive the error
    assert (out == 1).all()

    def caller_boom(lo: int, hi: int) -> None:
        if lo == 0:
            raise KeyError("caller's piece")
        out[lo:hi] += 1

    with pytest.raises(KeyError):
        pool.run(caller_boom, 9, (), 3)
    assert (out[3:] == 2).all()  # the workers' pieces still ran to the end before the error surfaced


@pytest.mark.parametrize("spin_us", _SPINS)
def test_two_threads_calling_at_once(spin_us: int) -> None:
    pool = _spin_pool(2, spin_us)
    errors: list[BaseException] = []

    def caller(seed: int) -> None:
        try:
            x = np.random.default_rng(seed).standard_normal((64, 16))
            want = x.sum(axis=1)
            for _ in range(500):
                out = np.zeros(64)
                pool.run(_sum_rows, 64, (x, out), 2)
                np.testing.assert_allclose(out, want, rtol=1e-12)
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=caller, args=(s,)) for s in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


def _within(seconds: float, fn: object) -> None:
    """Run ``fn`` on a thread: a lost wake-up fails the test instead of hanging it."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "a hand-off was lost: the pool hangs"
    if errors:
        raise errors[0]


def test_workers_sleeping_past_the_window_still_get_work() -> None:
    """Pauses longer than the window put both sides to sleep (the blocking fallback) and a hand-off
    still reaches the workers; a piece longer than the window makes the caller block for it."""
    _within(120, _sleeping_workers)


def _sleeping_workers() -> None:
    import time

    pool = _spin_pool(3, 50)
    out = np.zeros(30, np.int64)
    for i in range(30):
        pool.run(_mark, 30, (out, np.zeros(30, np.int64)), 3)
        time.sleep(0.002 if i % 2 else 0.0)  # 40x the window: the workers are asleep
    assert (out == 30).all()
    st = pool._spin
    assert st is not None
    deadline = time.monotonic() + 30  # generous: only a worker that never stops spinning fails this
    while st.asleep.tolist() != [0, 1, 1] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert st.asleep.tolist() == [0, 1, 1]  # an idle pool's workers block after the window, not spin

    def slow(o: np.ndarray, lo: int, hi: int) -> None:
        if lo > 0:
            time.sleep(0.003)  # the caller's wait outlasts its window: it blocks until woken
        o[lo:hi] += 1

    for _ in range(10):
        pool.run(slow, 30, (out,), 3)
    assert (out == 40).all()


def test_spin_setting_restores_the_blocking_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("numba")  # loaded: the setting alone picks the blocking hand-off
    monkeypatch.setenv("RLX_CPU_POOL_SPIN_US", "0")
    pool = RowPool(2)
    assert pool.spin_us == 0
    pool.run(_mark, 4, (np.zeros(4, np.int64), np.zeros(4, np.int64)), 2)
    assert pool._spin is None and len(pool._queues) == 1
    monkeypatch.setenv("RLX_CPU_POOL_SPIN_US", "300")
    assert RowPool(2).spin_us == 300
