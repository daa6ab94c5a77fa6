"""Run plans (issue 18): ``Executable.run`` of a shape seen before skips binding and the
specialisation lookup, checking per call only what must stay checked (each input a plain
C-contiguous ndarray of the graph's dtype, shapes by one tuple compare). Anything else still goes
through the full check, with its error messages; plans never outlive their specialisation."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rlx_core._hub import Hub, reset_hub
from rlx_core.errors import InputError
from rlx_core.ir.builder import GraphBuilder
from rlx_core.ir.graph import Graph
from rlx_core.runtime import Executable, Session

W = np.linspace(-1.0, 1.0, 8 * 8, dtype=np.float32).reshape(8, 8)


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    monkeypatch.delenv("RLX_MAX_SPECIALIZATIONS", raising=False)
    reset_hub(Hub())
    yield
    reset_hub(Hub())


def dyn() -> Graph:
    g = GraphBuilder("dyn")
    x = g.input("x", "f32", ("batch", 8))
    h = g.op("relu", g.op("matmul", x, g.param("w", W, "f32")))
    g.output(h, "y")
    g.output(h, "y_again")  # two public names of one value
    return g.build()


def feed(batch: int) -> np.ndarray:
    return np.arange(batch * 8, dtype=np.float32).reshape(batch, 8) / 10.0 - 1.0


def want(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.maximum(x.astype(np.float64) @ W.astype(np.float64), 0))


def compile_(graph: Graph, **kw: Any) -> Executable:
    exe = Session("cpu", use_cache=False, **kw).compile(graph)
    assert isinstance(exe, Executable)
    return exe


def no_binding(monkeypatch: pytest.MonkeyPatch, exe: Executable) -> list[int]:
    """Count the runs that go through the full check (the slow path)."""
    calls: list[int] = []
    orig = exe._binder.bind

    def bind(*a: Any) -> Any:
        calls.append(1)
        return orig(*a)
    monkeypatch.setattr(exe._binder, "bind", bind)
    return calls


def test_a_seen_shape_runs_without_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    exe = compile_(dyn())
    slow = no_binding(monkeypatch, exe)
    for b in (3, 5):
        out = exe.run({"x": feed(b)})  # first time for this shape: the full check
        np.testing.assert_allclose(out["y"], want(feed(b)), rtol=1e-5, atol=1e-6)
    assert len(slow) == 2 and set(exe._plans) == {((3, 8),), ((5, 8),)}
    for b in (3, 5, 3):
        x = feed(b) * 2
        out = exe.run({"x": x})
        np.testing.assert_allclose(out["y"], want(x), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out["y_again"], out["y"])
    out = exe.run(x=feed(5))  # keywords take the same plan
    np.testing.assert_allclose(out["y"], want(feed(5)), rtol=1e-5, atol=1e-6)
    assert len(slow) == 2, "a shape already seen went through the full check again"


def test_static_graph_plan_and_unmutated_feed(monkeypatch: pytest.MonkeyPatch) -> None:
    g = GraphBuilder("static")
    x = g.input("x", "f32", (4,))
    g.output(g.add(x, x), "y")
    exe = compile_(g.build())
    slow = no_binding(monkeypatch, exe)
    inputs = {"x": np.arange(4, dtype=np.float32)}
    for k in range(3):
        inputs["x"] = np.full(4, k, np.float32)
        np.testing.assert_array_equal(exe.run(inputs)["y"], np.full(4, 2 * k, np.float32))
    assert list(inputs) == ["x"] and len(slow) == 1


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"x": np.zeros((3, 8), np.float64)}, "dtype float64, the graph expects f32"),
        ({"x": np.zeros((3, 7), np.float32)}, "axis 1: 7 != 8"),
        ({"x": np.zeros((3, 8, 1), np.float32)}, "rank 3"),
        ({}, "missing input"),
        ({"x": np.zeros((3, 8), np.float32), "z": np.zeros(1, np.float32)}, "unknown input"),
        ({"z": np.zeros((3, 8), np.float32)}, "unknown input"),
    ],
)
def test_wrong_inputs_after_a_plan_keep_their_errors(bad: dict[str, Any], match: str) -> None:
    exe = compile_(dyn())
    exe.run({"x": feed(3)})
    assert exe._plans
    with pytest.raises(InputError, match=match) as e:
        exe.run(bad)
    assert e.value.fix and "dyn" in str(e.value)


def test_inconsistent_symbols_after_a_plan() -> None:
    g = GraphBuilder("two")
    a = g.input("a", "f32", ("n",))
    b = g.input("b", "f32", ("n",))
    g.output(a + b, "s")
    exe = compile_(g.build())
    np.testing.assert_array_equal(exe.run(a=np.ones(3, np.float32), b=np.ones(3, np.float32))["s"], 2)
    with pytest.raises(InputError, match="symbol 'n' is 3 in one input but 4"):
        exe.run(a=np.zeros(3, np.float32), b=np.zeros(4, np.float32))


def test_inputs_off_the_fast_path_still_run() -> None:
    """Strided and subclass inputs: the full check converts them; a byte-swapped one is refused."""
    exe = compile_(dyn())
    exe.run({"x": feed(4)})
    base = np.asfortranarray(feed(4))

    class Sub(np.ndarray):
        pass
    for x in (base, feed(8)[::2], feed(4).view(Sub)):
        ref = np.asarray(x, np.float32)
        np.testing.assert_allclose(exe.run({"x": x})["y"], want(ref), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="dtype >f4"):
        exe.run({"x": feed(4).astype(">f4")})


def test_plans_follow_the_bounded_specialisations() -> None:
    exe = compile_(dyn(), max_specializations=2)
    exe.run({"x": feed(1)})
    exe.run({"x": feed(2)})
    alive = weakref.ref(exe._specs[(("batch", 2),)][0])
    exe.run({"x": feed(1)})  # a plan hit refreshes its specialisation
    assert list(exe._specs) == [(("batch", 2),), (("batch", 1),)]
    exe.run({"x": feed(3)})  # evicts batch 2, and its plan with it
    assert list(exe._specs) == [(("batch", 1),), (("batch", 3),)]
    assert set(exe._plans) == {((1, 8),), ((3, 8),)}
    gc.collect()
    assert alive() is None, "an evicted specialisation is kept alive by its plan"
    np.testing.assert_allclose(exe.run({"x": feed(2)})["y"], want(feed(2)), rtol=1e-5, atol=1e-6)


def test_index_checked_graphs_check_every_run() -> None:
    g = GraphBuilder("gat")
    x = g.input("x", "f32", (5, 3))
    i = g.input("i", "i64", (2,))
    g.output(g.op("gather", x, i, axis=0), "y")
    exe = compile_(g.build())
    xv = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_array_equal(exe.run(x=xv, i=np.array([0, 4]))["y"], xv[[0, 4]])
    assert exe._plans  # the shapes take the fast path; the index values are checked on it too
    for bad in ([0, 5], [-6, 1]):
        with pytest.raises(InputError, match="out of range"):
            exe.run(x=xv, i=np.array(bad))
    np.testing.assert_array_equal(exe.run(x=xv, i=np.array([-1, 2]))["y"], xv[[-1, 2]])


@pytest.mark.parametrize("n", [3, 100])  # below and above inputs_in_range's small-array path
def test_index_values_checked_on_the_fast_path_at_any_size(n: int) -> None:
    """The run plan's bounds hold the extent bound for this specialisation (a symbol here); the
    full check still names the first bad value and its position."""
    g = GraphBuilder("gat_sym")
    x = g.input("x", "f32", ("rows", 2))
    i = g.input("i", "i64", (n,))
    g.output(g.op("gather", x, i, axis=0), "y")
    exe = compile_(g.build())
    for rows in (7, 9):
        xv = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
        good = np.arange(n) % rows - (n % 2)
        np.testing.assert_array_equal(exe.run(x=xv, i=good)["y"], xv[good])
        assert exe._plans
        bad = good.copy()
        bad[n - 2] = rows  # one past the end of this specialisation's extent
        with pytest.raises(InputError, match=rf"index {rows} at position \({n - 2},\)"):
            exe.run(x=xv, i=bad)
        bad[n - 2] = -rows - 1
        with pytest.raises(InputError, match="out of range"):
            exe.run(x=xv, i=bad)


def test_threads_share_plans() -> None:
    exe = compile_(dyn())
    xs = [feed(b) for b in (1, 2, 3, 4)]
    wants = [exe.run({"x": x})["y"] for x in xs]
    bad: list[int] = []

    def work(k: int) -> None:
        for n in range(200):
            j = (k + n) % len(xs)
            if not np.array_equal(exe.run({"x": xs[j]})["y"], wants[j]):
                bad.append(j)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
