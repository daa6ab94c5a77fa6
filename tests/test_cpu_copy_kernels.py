"""rlx-cpu's data-movement fast paths give exactly what NumPy's general calls give: a gather with a
constant one-element index as a bound assignment, concat as one assignment a part, reduce_mean's
division by the count in the output's own dtype (bit-equal to ``np.mean``), and sums over short
trailing rows as one matrix-vector product (within float32 rounding of the float64 reference)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

RNG = np.random.default_rng(7)


def _session() -> Session:
    return Session("cpu", use_cache=False)


def _run_of(exe: Any, kernel: str) -> Any:
    prog = exe.buffers({})
    (run,) = [r for n, r in zip(prog.kernel_names, prog.runs) if n == kernel]
    return run


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("index", [np.array(1), np.array([2]), np.array(-1), np.array([[0]])])
def test_gather_constant_index(axis: int, index: np.ndarray) -> None:
    g = GraphBuilder("gather_const")
    x = g.input("x", "f32", (3, 4, 5))
    # the gather reads a value computed in the program (an arena buffer rewritten every run)
    y = g.op("gather", g.op("mul", x, x), g.param("idx", index, "i64"), axis=axis)
    g.output(y, "y")
    exe = _session().compile(g.build())
    for _ in range(2):  # a second run reads the new values through the same bound view
        xv = RNG.standard_normal((3, 4, 5)).astype(np.float32)
        got = exe.run(x=xv)["y"]
        np.testing.assert_array_equal(got, np.take(xv * xv, index, axis=axis))
    assert isinstance(_run_of(exe, "cpu.gather"), functools.partial)  # the bound assignment


@pytest.mark.parametrize("parts", [2, 3, 4, 5])
@pytest.mark.parametrize("axis", [0, 2])
def test_concat_parts(parts: int, axis: int) -> None:
    g = GraphBuilder("cat")
    xs = [g.input(f"x{k}", "f32", (2, 3, k + 1) if axis == 2 else (k + 1, 3, 2)) for k in range(parts)]
    g.output(g.op("concat", *[g.op("neg", x) for x in xs], axis=axis), "y")
    exe = _session().compile(g.build())
    feed = {f"x{k}": RNG.standard_normal((2, 3, k + 1) if axis == 2 else (k + 1, 3, 2)).astype(np.float32)
            for k in range(parts)}
    np.testing.assert_array_equal(exe.run(feed)["y"], -np.concatenate(list(feed.values()), axis=axis))
    name = getattr(_run_of(exe, "cpu.concat"), "__name__", "")
    assert name == ("run2" if parts == 2 else "run" if parts <= 4 else "<lambda>")


@pytest.mark.parametrize("dtype", ["f32", "f16", "f64"])
@pytest.mark.parametrize("shape,axes", [((1, 4, 16, 16), (1,)), ((2, 3, 7), (2,)), ((5, 6, 7), (0, 2))])
def test_reduce_mean_equals_numpy_bit_for_bit(dtype: str, shape: tuple[int, ...],
                                              axes: tuple[int, ...]) -> None:
    g = GraphBuilder("mean")
    x = g.input("x", dtype, shape)
    g.output(g.op("reduce_mean", x, axes=axes, keepdims=False), "y")
    graph = g.build()
    exe = _session().compile(graph)
    xv = (RNG.standard_normal(shape) * 100).astype(graph.inputs[0].type.dtype.np)
    got = exe.run(x=xv)["y"]
    if dtype != "f16":  # float16: the sum itself is rounded per step, the division is what is tested
        np.testing.assert_array_equal(got, np.mean(xv, axis=axes, dtype=xv.dtype))
    s = np.add.reduce(xv, axis=axes, dtype=xv.dtype)
    want = s.copy()
    np.true_divide(want, np.intp(int(np.prod([shape[a] for a in axes]))), out=want, casting="unsafe")
    if dtype == "f16":
        ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2, atol=1e-1)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["reduce_mean", "reduce_sum"])
@pytest.mark.parametrize("shape,axes", [((1, 960, 4, 4), (2, 3)), ((2, 100, 3), (2,)), ((64, 256), (1,))])
def test_short_rows_sum_as_one_product(op: str, shape: tuple[int, ...], axes: tuple[int, ...]) -> None:
    from rlx_cpu import kernels

    g = GraphBuilder("rows")
    x = g.input("x", "f32", shape)
    g.output(g.op(op, x, axes=axes, keepdims=True), "y")
    graph = g.build()
    exe = _session().compile(graph)
    xv = RNG.standard_normal(shape).astype(np.float32)
    xv.reshape(-1)[[5, 77]] = [np.nan, np.inf]  # NaN and Inf reach their rows' results alone
    got = exe.run(x=xv)["y"]
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isinf(got), np.isinf(ref))
    ok = np.isfinite(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-5, atol=1e-5)
    inner = int(np.prod([shape[a] for a in axes]))
    run = _run_of(exe, f"cpu.{op}")
    if not isinstance(run, functools.partial):  # the mean: the sum, then the division
        run = dict(zip(run.__code__.co_freevars, [c.cell_contents for c in run.__closure__]))["total"]
    assert run.func is np.dot and inner <= kernels.ROWS_SUM_MAX
