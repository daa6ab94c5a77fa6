"""rlx-cpu's threading policy under other processes' load: the thread counts chosen from a given
load (a fake /proc/stat, clock and CPU time, never timing), the same results whatever the count,
NumPy's BLAS capped while the load lasts, and inference linears kept off NumPy's BLAS threads."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

pytest.importorskip("rlx_cpu")

from rlx_cpu import parallel
from rlx_cpu.parallel import LoadProbe, RowPool, RowRun, threads_for


@pytest.mark.parametrize("cpus,others,most,want", [
    (2, 0.0, 2, 2), (2, 0.2, 2, 2), (2, 0.8, 2, 1), (2, 1.0, 2, 1), (2, 2.0, 2, 1),
    (4, 1.0, 4, 3), (4, 1.3, 4, 2), (16, 0.0, 8, 8), (1, 0.0, 1, 1)])
def test_threads_for_load(cpus: int, others: float, most: int, want: int) -> None:
    assert threads_for(cpus, others, most) == want


class _Fake:
    """A scripted machine: ``busy`` (seconds the allowed CPUs were busy), ``own`` (this process's
    CPU seconds), ``now`` (the clock); counts /proc/stat reads."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy: float | None = 0.0
        self.own = 0.0
        self.reads = 0

    def read(self, cpus: list[int]) -> float | None:
        self.reads += 1
        return self.busy

    def probe(self, cpus: int = 2) -> LoadProbe:
        return LoadProbe(list(range(cpus)), cpus, 0.25, self.read, lambda: self.own, lambda: self.now)


def test_probe_follows_other_processes_not_its_own() -> None:
    m = _Fake()
    p = m.probe()
    assert p.poll() == 2 and m.reads == 1  # no interval measured yet: every thread
    # Over one second the CPUs were busy 1.9 s, 0.9 s of it ours: another process held a CPU.
    m.now, m.busy, m.own = 1.0, 1.9, 0.9
    assert p.poll() == 1 and p.others == pytest.approx(1.0)
    m.now = 1.1  # within the interval: no read, same answer
    assert p.poll() == 1 and m.reads == 2
    # Busy 2 s of 2, all of it ours: the machine is ours again.
    m.now, m.busy, m.own = 2.0, 3.9, 2.9
    assert p.poll() == 2 and p.others == pytest.approx(0.0)


def test_probe_without_proc_stat_keeps_every_thread() -> None:
    m = _Fake()
    m.busy = None
    p = m.probe()
    assert p.poll() == 2
    m.now = 10.0
    assert p.poll() == 2 and m.reads == 1  # never tried again


class _Scripted:
    def __init__(self, threads: int) -> None:
        self.threads = threads

    def poll(self) -> int:
        return self.threads


def _pool(monkeypatch: pytest.MonkeyPatch, active: int, threads: int = 2) -> RowPool:
    pl = RowPool(threads, _Scripted(active))  # type: ignore[arg-type]
    monkeypatch.setattr(parallel, "_POOL", pl)
    monkeypatch.setattr(parallel, "_NumpyBlas", _NoBlas)
    parallel.poll()
    assert pl.active == active
    return pl


class _NoBlas:
    def cap(self, threads: int) -> None:
        pass


def test_a_loaded_pool_runs_the_same_cuts_on_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    pl = _pool(monkeypatch, 1)
    seen: list[tuple[int, int, int]] = []

    def mark(lo: int, hi: int) -> None:
        seen.append((lo, hi, threading.get_ident()))

    pl.run(mark, 100, (), 2, 8)
    assert [(lo, hi) for lo, hi, _ in seen] == [(100 * k // 8, 100 * (k + 1) // 8) for k in range(8)]
    assert {t for _, _, t in seen} == {threading.get_ident()}


def _chain_result(monkeypatch: pytest.MonkeyPatch, active: int) -> tuple[np.ndarray, int]:
    """Two row kernels with a barrier between them (the second reads rows the first wrote on
    other pieces), run as one chain on a pool that may use ``active`` of its 2 threads."""
    _pool(monkeypatch, active)
    n = 64
    x = np.arange(n * 4, dtype=np.float64).reshape(n, 4)
    y = np.zeros_like(x)
    z = np.zeros_like(x)
    tids: set[int] = set()

    def double(a: np.ndarray, o: np.ndarray, lo: int, hi: int) -> None:
        tids.add(threading.get_ident())
        o[lo:hi] = a[lo:hi] * 2

    def flip(a: np.ndarray, o: np.ndarray, lo: int, hi: int) -> None:
        tids.add(threading.get_ident())
        o[lo:hi] = a[::-1][lo:hi] + 1

    r1 = RowRun(double, n, (x, y), 10**9, parts=2, rows_in=[x], rows_out=[y])
    r2 = RowRun(flip, n, (y, z), 10**9, parts=2, whole_in=[y], rows_out=[z])
    runs, ids = parallel.chain([r1, r2], [0, 1])
    assert ids == [(0, 1)] and isinstance(runs[0], parallel._Chain)
    assert runs[0].barriers == 1
    runs[0]()
    return z, len(tids)


def test_chain_gives_the_same_result_on_one_thread_or_two(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CPU_CHAIN", "1")
    z1, t1 = _chain_result(monkeypatch, 1)
    z2, _ = _chain_result(monkeypatch, 2)
    want = np.arange(64 * 4, dtype=np.float64).reshape(64, 4)[::-1] * 2 + 1
    np.testing.assert_array_equal(z1, want)
    np.testing.assert_array_equal(z2, want)
    assert t1 == 1  # the loaded pool ran the chain on the caller alone, past its barrier


def test_numpy_blas_capped_while_loaded_and_put_back() -> None:
    threadpoolctl = pytest.importorskip("threadpoolctl")
    blas = parallel._NumpyBlas()
    ctl = blas._controllers()
    if not ctl:
        pytest.skip("NumPy's OpenBLAS not found by threadpoolctl in numpy.libs")
    orig = [c.num_threads for c in ctl]
    if max(orig) < 2:
        pytest.skip("NumPy's OpenBLAS runs one thread here: nothing to cap")
    try:
        blas.cap(1)
        assert [c.num_threads for c in ctl] == [1] * len(ctl)
        blas.cap(64)
        assert [c.num_threads for c in ctl] == orig
    finally:
        with threadpoolctl.threadpool_limits(limits=None):
            for c, n in zip(ctl, orig):
                c.set_num_threads(n)


def test_explicit_threads_or_adapt_off_fix_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "_POOL", None)
    monkeypatch.setenv("RLX_CPU_THREADS", "2")
    assert parallel.pool().probe is None
    monkeypatch.setattr(parallel, "_POOL", None)
    monkeypatch.delenv("RLX_CPU_THREADS")
    monkeypatch.setenv("RLX_CPU_ADAPT", "0")
    assert parallel.pool().probe is None
    monkeypatch.setattr(parallel, "_POOL", None)


def _mlp(batch: int) -> tuple[Any, dict[str, np.ndarray], np.ndarray]:
    from rlx_core.ir.builder import GraphBuilder

    rng = np.random.default_rng(0)
    g = GraphBuilder("mlp")
    x = g.input("x", "f32", (batch, 32))
    ws = [(rng.standard_normal((24, 32)) * 0.3, rng.standard_normal(24)),
          (rng.standard_normal((10, 24)) * 0.3, rng.standard_normal(10))]
    h = x
    for k, (w, b) in enumerate(ws):
        h = g.op("linear", h, g.param(f"w{k}", w.astype(np.float32)), g.param(f"b{k}", b.astype(np.float32)))
        if k == 0:
            h = g.relu(h)
    g.output(h, "y")
    xv = rng.standard_normal((batch, 32)).astype(np.float32)
    ref = np.maximum(xv.astype(np.float64) @ ws[0][0].T + ws[0][1], 0) @ ws[1][0].T + ws[1][1]
    return g.build(), {"x": xv}, ref


def test_inference_linears_stay_off_numpy_blas() -> None:
    from rlx_core.runtime import Session, bind_inputs

    graph, feed, ref = _mlp(16)
    exe = Session("cpu").compile(graph)
    out = exe.run(feed)["y"]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    compiled: Any = exe._specialise(bind_inputs(graph, feed, "test")[1])[0]
    names = set(compiled.kernel_names)
    assert not names & {"cpu.linear_blas", "cpu.linear_relu"}, names


def test_run_silences_fp_warnings_and_restores_the_callers_state() -> None:
    import warnings

    from rlx_core.ir.builder import GraphBuilder
    from rlx_core.runtime import Session

    g = GraphBuilder("div0")
    x = g.input("x", "f32", (4,))
    g.output(g.op("div", x, g.const(0.0, "f32")), "y")
    exe = Session("cpu").compile(g.build())
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning from a kernel would raise here
        y = exe.run({"x": np.array([1.0, -1.0, 0.0, 2.0], np.float32)})["y"]
    assert np.isposinf(y[0]) and np.isneginf(y[1]) and np.isnan(y[2])
    assert np.geterr() == before


def test_poll_probes_once_an_interval_else_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between probes a program run reads the clock only (RowPool.due); a probe on another clock
    than time.monotonic (tests, simulations) is asked at every call."""
    reads: list[int] = []

    def read(cpus: list[int]) -> float:
        reads.append(1)
        return 0.0
    pl = RowPool(2, LoadProbe([0, 1], 2, 100.0, read))
    monkeypatch.setattr(parallel, "_POOL", pl)
    monkeypatch.setattr(parallel, "_NumpyBlas", _NoBlas)
    calls: list[int] = []
    orig = pl.poll

    def counted() -> None:
        calls.append(1)
        orig()
    monkeypatch.setattr(pl, "poll", counted)
    for _ in range(5):
        parallel.poll()
    assert len(calls) == 1 and len(reads) == 1
    pl.due = float("-inf")  # the interval has passed
    parallel.poll()
    assert len(calls) == 2
    pl2 = RowPool(2, LoadProbe([0, 1], 2, 100.0, read, clock=lambda: 0.0))
    monkeypatch.setattr(parallel, "_POOL", pl2)
    seen: list[int] = []
    monkeypatch.setattr(pl2, "poll", lambda: seen.append(1))
    for _ in range(3):
        parallel.poll()
    assert len(seen) == 3
