"""rlx-cpu's compiled dispatch loop (``rlx_cpu._dispatch``): a merged run of oneDNN primitives in
one C call, against the Python loop of ctypes calls it replaces."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from test_cpu_dense import _compiled, _mlp, _need_onednn

from rlx_core import Session

_EXEC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
_GET = ctypes.CFUNCTYPE(ctypes.c_int)
_SET = ctypes.CFUNCTYPE(None, ctypes.c_int)


def _dispatch() -> Any:
    from rlx_cpu import native

    why = native.why_not()
    if why is not None:
        if native.settings.NATIVE_DISPATCH.get():  # built by every install with a C compiler: CI's
            pytest.fail(why)
        pytest.skip(why)
    from rlx_cpu import _dispatch

    return _dispatch


class _Fake:
    """OpenMP's thread-count calls and oneDNN's execute as ctypes callbacks that record each call."""

    def __init__(self, fail_on: int | None = None, threads: int = 3) -> None:
        self.threads = threads
        self.calls: list[tuple[int, int, int, int, int]] = []
        self.sets: list[int] = []

        def execute(prim: int, stream: int, n: int, args: int) -> int:
            self.calls.append((prim, stream, n, args, self.threads))
            return 7 if prim == fail_on else 0

        def get() -> int:
            return self.threads

        def put(n: int) -> None:
            self.sets.append(n)
            self.threads = n
        self.fns = (_EXEC(execute), _GET(get), _SET(put))

    def words(self, steps: list[tuple[int, int, int, int]],
              io: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)) -> np.ndarray:
        addrs = [ctypes.cast(f, ctypes.c_void_p).value for f in self.fns]
        return np.array([*addrs, *io, *(w for s in steps for w in s)], np.int64)


def test_the_compiled_loop_is_built() -> None:
    """Every install with a C compiler builds it (CI's does): a missing build fails here, loudly."""
    _dispatch()


def test_plan_runs_each_step_on_its_thread_count_and_restores_the_callers() -> None:
    d = _dispatch()
    fake = _Fake()
    steps = [(2, 11, 2, 100), (2, 12, 0, 200), (1, 13, 1, 300)]
    plan = d.Plan(fake.words(steps), fake)
    assert d.run(plan, 55) == 0
    assert fake.calls == [(11, 55, 2, 100, 2), (12, 55, 0, 200, 2), (13, 55, 1, 300, 1)]
    assert fake.sets == [2, 1, 3] and fake.threads == 3
    fake.calls.clear()
    fake.sets.clear()
    fake.threads = 2  # already the first steps' count: set only where it changes
    assert d.run(plan, 55) == 0
    assert fake.sets == [1, 2]


def test_plan_stops_at_the_first_failure_with_its_status() -> None:
    d = _dispatch()
    fake = _Fake(fail_on=12)
    plan = d.Plan(fake.words([(2, 11, 1, 1), (2, 12, 1, 2), (2, 13, 1, 3)]), fake)
    assert d.run(plan, 9) == 7
    assert [c[0] for c in fake.calls] == [11, 12]
    assert fake.threads == 3  # restored after the failure too


@pytest.mark.parametrize("words,why", [
    (np.zeros(9, np.int64), "8 \\+ 4 \\* n"),
    (np.zeros(12, np.int32), "8 \\+ 4 \\* n"),
    (np.zeros(8, np.float64), "8 \\+ 4 \\* n"),
    (np.zeros(8, np.int64), "address is 0"),
    (np.array([1, 1, 1, 0, -1, 0, 0, 0], np.int64), "negative byte count"),
    (np.array([1, 1, 1, 0, 0, 0, 0, 2], np.int64), "nan_scan is 0, 4 or 8"),
    (np.array([1, 1, 1, 0, 0, 0, 0, 0, 0, 5, 1, 0], np.int64), "threads >= 1"),
    (np.array([1, 1, 1, 0, 0, 0, 0, 0, 1, 5, -1, 0], np.int64), "nargs"),
])
def test_plan_refuses_malformed_words(words: np.ndarray, why: str) -> None:
    d = _dispatch()
    with pytest.raises(ValueError, match=why):
        d.Plan(words, None)


def test_run_checks_its_arguments() -> None:
    d = _dispatch()
    fake = _Fake()
    plan = d.Plan(fake.words([]), fake)
    assert d.run(plan, 1) == 0 and fake.calls == []
    with pytest.raises(ValueError, match="stream"):
        d.run(plan, 0)
    with pytest.raises(TypeError, match="run\\(plan"):
        d.run(object(), 1)
    with pytest.raises(TypeError, match="run\\(plan"):
        d.run(plan)


def test_run_io_copies_in_runs_and_copies_out() -> None:
    """run_io: the argument into the input buffer before the first step, the output buffer into
    ``out`` after the last; nothing written to ``out`` when a step fails; sizes checked."""
    d = _dispatch()
    into, frm = np.zeros(6, np.float32), np.arange(4, dtype=np.float32)
    seen: list[np.ndarray] = []
    fake = _Fake(fail_on=None)
    plain = fake.fns[0]

    def execute(prim: int, stream: int, n: int, args: int) -> int:
        seen.append(into.copy())  # the input is in place before any step
        frm[:] = into[:4] * 2
        return plain(prim, stream, n, args) if prim != 99 else 5
    fake.fns = (_EXEC(execute), *fake.fns[1:])
    io = (into.ctypes.data, into.nbytes, frm.ctypes.data, frm.nbytes, 0)
    plan = d.Plan(fake.words([(1, 11, 0, 0)], io), (fake, into, frm))
    src, out = np.arange(6, dtype=np.float32) + 1, np.full(4, -1, np.float32)
    assert d.run_io(plan, 3, src, out) == 0
    np.testing.assert_array_equal(seen[0], src)
    np.testing.assert_array_equal(out, [2, 4, 6, 8])
    with pytest.raises(ValueError, match="24 and 12 bytes given"):
        d.run_io(plan, 3, src, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="20 and 16 bytes given"):
        d.run_io(plan, 3, src[:5], out)
    with pytest.raises((BufferError, ValueError), match="contiguous"):  # NumPy raises ValueError
        d.run_io(plan, 3, np.zeros(12, np.float32)[::2], out)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises((BufferError, ValueError), match="read-only"):
        d.run_io(plan, 3, src, ro)
    failing = d.Plan(fake.words([(1, 99, 0, 0)], io), (fake, into, frm))
    out[:] = -1
    assert d.run_io(failing, 3, src, out) == 5
    assert (out == -1).all()
    with pytest.raises(ValueError, match="no input and output buffers"):
        d.run_io(d.Plan(fake.words([]), fake), 3, src, out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_run_io_reports_a_nan_in_the_output(dtype: Any) -> None:
    """With nan_scan (the output's itemsize) run_io returns -1 when the copied-out output holds a
    NaN (the caller's NaN-row pass runs then), 0 otherwise; infinities are no NaN."""
    d = _dispatch()
    into, frm = np.zeros(3, dtype), np.zeros(5, dtype)
    fake = _Fake()
    io = (into.ctypes.data, into.nbytes, frm.ctypes.data, frm.nbytes, frm.itemsize)
    plan = d.Plan(fake.words([(1, 11, 0, 0)], io), (fake, into, frm))
    src, out = np.zeros(3, dtype), np.zeros(5, dtype)
    frm[:] = [1, np.inf, -np.inf, 0, 2]
    assert d.run_io(plan, 1, src, out) == 0
    for i in range(5):
        frm[:] = 0
        frm[i] = np.nan
        assert d.run_io(plan, 1, src, out) == -1
        assert np.isnan(out[i])


def test_a_failing_primitive_raises_onednn_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run made by ``onednn_conv._grouped`` turns a failing status into OneDNNError."""
    from rlx_cpu import onednn_conv

    _dispatch()
    fake = _Fake(fail_on=21)
    api = {"fns": {"dnnl_primitive_execute": fake.fns[0]}, "omp": fake.fns[1:]}
    args = (onednn_conv._ExecArg * 1)()
    monkeypatch.setattr(onednn_conv, "_stream_address", lambda api: 5)
    run = onednn_conv._grouped(api, [(1, [(ctypes.c_void_p(21), 1, args)])], None)
    assert run.__name__ == "native"
    with pytest.raises(onednn_conv.OneDNNError, match="status 7"):
        run()
    assert fake.calls == [(21, 5, 1, ctypes.addressof(args), 1)] and fake.threads == 3


@pytest.mark.parametrize("batch", [1, 8])
def test_native_and_python_loops_give_the_same_bits(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The MLP's merged team run through the compiled loop and through the Python loop: same bits,
    NaN and Inf rows included, and the caller's OpenMP thread count kept."""
    from rlx_cpu import onednn_conv, parallel

    _need_onednn()
    _dispatch()
    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(2))
    graph, feed, ref = _mlp(batch, (600, 512, 300, 10))
    x = feed["x"].copy()
    if batch > 1:
        x[0, 3], x[1, :] = np.nan, np.inf
    native = Session("cpu").compile(graph)
    monkeypatch.setenv("RLX_CPU_NATIVE_DISPATCH", "0")
    python_loop = Session("cpu").compile(graph)
    get_t, set_t = onednn_conv._api()["omp"]
    prev = get_t()
    set_t(1)
    try:
        got, want = native.run({"x": x})["y"], python_loop.run({"x": x})["y"]
        assert get_t() == 1
    finally:
        set_t(prev)
    np.testing.assert_array_equal(got, want)
    ok = slice(2, None) if batch > 1 else slice(None)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-5, atol=2e-6)
    for exe, loop in ((native, "native"), (python_loop, "run")):
        (merged,) = _compiled(exe, graph, {"x": x}).runs
        assert merged.teams.full.__name__ == loop
    assert _compiled(native, graph, {"x": x})._io is not None
    assert _compiled(python_loop, graph, {"x": x})._io is None


def test_program_io_call_gives_fresh_outputs_and_leaves_other_inputs_to_the_general_copy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run returns a new array (the next run does not change it); an input the compiled call
    does not take as is (not C-contiguous, another dtype) goes through the program's general copy
    with the same result."""
    from rlx_cpu import parallel

    _need_onednn()
    _dispatch()
    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(2))
    graph, feed, ref = _mlp(8, (600, 512, 10))
    exe = Session("cpu").compile(graph)
    first = exe.run(feed)["y"]
    kept = first.copy()
    np.testing.assert_allclose(first, ref, rtol=2e-5, atol=2e-6)
    c = _compiled(exe, graph, feed)
    assert c._io is not None
    second = c.run({"x": feed["x"][::-1].copy()})["y"]
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_array_equal(second, kept[::-1])
    fortran = np.asfortranarray(feed["x"])
    assert not fortran.flags.c_contiguous
    assert c._io({"x": fortran}) is None and c._io({"x": feed["x"].astype(np.float64)}) is None
    np.testing.assert_array_equal(c.run({"x": fortran})["y"], kept)
