"""Integer division truncates toward zero for every pair, INT64_MIN included (the reference and
the backends used |a| // |b|, which overflows for INT64_MIN: INT64_MIN / 3 came out positive)."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

LO, HI = np.iinfo(np.int64).min, np.iinfo(np.int64).max
A = np.array([LO, HI - 1, -7, 7, -7, 5, LO + 1, 0], np.int64)
B = np.array([3, LO, 2, -2, -2, 0, 2, -5], np.int64)
WANT = np.array([-3074457345618258602, 0, -3, -3, 3, 0, -4611686018427387903, 0], np.int64)


def _graph(dt: str, n: int = len(A)) -> object:
    g = GraphBuilder("idiv")
    a = g.input("a", dt, (n,))
    b = g.input("b", dt, (n,))
    g.output(g.div(a, b), "q")
    return g.build()


def test_reference_truncates_toward_zero_without_overflow() -> None:
    got = evaluate(_graph("i64"), {"a": A, "b": B})["q"]
    np.testing.assert_array_equal(got, WANT)


@pytest.mark.parametrize("backend", ["cpu", "wasm"])
def test_backends_match(backend: str) -> None:
    out = Session(backend, use_cache=False).compile(_graph("i64")).run({"a": A, "b": B})["q"]
    np.testing.assert_array_equal(out, WANT)
    a32 = np.array([-2**31, -7, 7, 5], np.int32)
    b32 = np.array([3, 2, -2, 0], np.int32)
    out32 = Session(backend, use_cache=False).compile(_graph("i32", 4)).run({"a": a32, "b": b32})["q"]
    np.testing.assert_array_equal(out32, np.array([-715827882, -3, -3, 0], np.int32))
