"""Per-shape specialisations are bounded (issue 14, item 7).

Each distinct input shape of a graph with symbolic dims compiles a specialisation (program, arena,
backend code). They were never dropped: 60 batch sizes grew a process from 54 to 519 MiB. An
executable now keeps the ``max_specializations`` most recently used ones (Session option,
``RLX_MAX_SPECIALIZATIONS``, default 16) and recompiles an evicted shape when it comes back.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import numpy as np
import pytest

from rlx_core._hub import Hub, reset_hub
from rlx_core.dtypes import DType
from rlx_core.errors import RLXError
from rlx_core.ir.builder import GraphBuilder
from rlx_core.ir.graph import Graph
from rlx_core.runtime import DEFAULT_MAX_SPECIALIZATIONS, Session

W = np.linspace(-1.0, 1.0, 8 * 8, dtype=np.float32).reshape(8, 8)


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    monkeypatch.delenv("RLX_MAX_SPECIALIZATIONS", raising=False)
    reset_hub(Hub())
    yield
    reset_hub(Hub())


def mlp() -> Graph:
    g = GraphBuilder("dyn")
    x = g.input("x", DType.F32, ("batch", 8))
    g.output(g.op("relu", g.op("matmul", x, g.param("w", W, DType.F32))), "y")
    return g.build()


def feed(batch: int) -> np.ndarray:
    return np.arange(batch * 8, dtype=np.float32).reshape(batch, 8) / 10.0 - 1.0


def test_forty_batch_sizes_keep_a_bounded_most_recent_set() -> None:
    exe = Session("cpu", use_cache=False, max_specializations=4).compile(mlp())
    alive: list[weakref.ref] = []
    for b in range(1, 41):
        x = feed(b)
        np.testing.assert_allclose(exe.run({"x": x})["y"], np.maximum(x @ W, 0), rtol=1e-5, atol=1e-6)
        assert len(exe._specs) <= 4
        try:
            alive.append(weakref.ref(exe._specs[(("batch", b),)][0]))
        except TypeError:  # a compiled program without weak references: the count above still holds
            pass
    assert list(exe._specs) == [(("batch", b),) for b in (37, 38, 39, 40)]
    gc.collect()
    if alive:
        assert sum(r() is not None for r in alive) <= 4, "evicted specialisations are still alive"
    # A hit refreshes its place; an evicted shape recompiles and still computes the right result.
    exe.run({"x": feed(37)})
    exe.run({"x": feed(2)})
    assert list(exe._specs) == [(("batch", b),) for b in (39, 40, 37, 2)]
    np.testing.assert_allclose(exe.run({"x": feed(5)})["y"], np.maximum(feed(5) @ W, 0), rtol=1e-5,
                               atol=1e-6)


def test_limit_from_the_environment_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Session("cpu", use_cache=False).max_specializations == DEFAULT_MAX_SPECIALIZATIONS == 16
    monkeypatch.setenv("RLX_MAX_SPECIALIZATIONS", "3")
    exe = Session("cpu", use_cache=False).compile(mlp())
    for b in range(1, 11):
        exe.run({"x": feed(b)})
    assert len(exe._specs) == 3
    for bad in ("0", "many", "-2"):
        monkeypatch.setenv("RLX_MAX_SPECIALIZATIONS", bad)
        with pytest.raises(RLXError, match="RLX_MAX_SPECIALIZATIONS"):
            Session("cpu", use_cache=False)
    monkeypatch.delenv("RLX_MAX_SPECIALIZATIONS")
    with pytest.raises(RLXError, match="max_specializations"):
        Session("cpu", use_cache=False, max_specializations=0)


def test_multi_device_executables_are_bounded_too() -> None:
    sess = Session("cpu,cpu", use_cache=False, max_specializations=2)
    exe = sess.compile(mlp())
    for b in range(1, 8):
        x = feed(b)
        np.testing.assert_allclose(exe.run({"x": x})["y"], np.maximum(x @ W, 0), rtol=1e-5, atol=1e-6)
    assert len(exe._specs) == 2
