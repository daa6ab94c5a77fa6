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
