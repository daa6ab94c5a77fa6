"""rlx-cpu's NumPy erf / expit (which replaced SciPy) against float64 references from ``math``."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from rlx_cpu import special


def _points() -> np.ndarray:
    rng = np.random.default_rng(0)
    # Random normals, a dense sweep over both erf branches (|x| < 1, 1 <= |x| < 8, >= 8) and the
    # branch edges and extremes themselves.
    edges = [0.0, -0.0, 1.0, -1.0, np.nextafter(1.0, 0.0), 8.0, -8.0, np.nextafter(8.0, 0.0),
             26.5, 27.3, 1e-300, -1e-300, 5e-324, 1e-8]
    return np.concatenate([rng.standard_normal(20000) * 3, np.linspace(-30.0, 30.0, 60001), edges])


def test_erf_float64_matches_math_erf() -> None:
    x = _points()
    want = np.array([math.erf(v) for v in x])
    got = special.erf(x)
    assert got.dtype == np.float64
    # Cephes' rational forms: a few ulp (the erf(x) = x*T/U branch is relative-accurate near 0).
    np.testing.assert_allclose(got, want, rtol=2e-15, atol=0)


def test_erf_special_values_and_out() -> None:
    got = special.erf(np.array([np.inf, -np.inf, np.nan, 40.0, -40.0]))
    assert got[0] == 1.0 and got[1] == -1.0 and np.isnan(got[2]) and got[3] == 1.0 and got[4] == -1.0
    assert math.copysign(1.0, float(special.erf(np.array([-0.0]))[0])) == -1.0  # sign of zero kept
    x = np.linspace(-4, 4, 1001, dtype=np.float32)
    out = np.empty_like(x)
    assert special.erf(x, out=out) is out
    want = np.array([math.erf(float(v)) for v in x]).astype(np.float32)  # one rounding of the truth
    np.testing.assert_array_equal(out, want)


def test_expit_float64_matches_reference() -> None:
    x = np.concatenate([_points(), np.linspace(-700.0, 700.0, 14001)])
    want = np.array([1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))
                     for v in x])
    got = special.expit(x)
    np.testing.assert_allclose(got, want, rtol=4e-16 * 4, atol=0)


def test_expit_extremes_and_dtypes() -> None:
    got = special.expit(np.array([-np.inf, np.inf, 1e4, -1e4, np.nan]))
    assert got[0] == 0.0 and got[1] == 1.0 and got[2] == 1.0 and got[3] == 0.0 and np.isnan(got[4])
    x = np.linspace(-80, 80, 4001, dtype=np.float32)  # results stay in float32's normal range
    out = np.empty_like(x)
    assert special.expit(x, out=out) is out
    want = np.array([1.0 / (1.0 + math.exp(-float(v))) for v in x])
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=3 * float(np.finfo(np.float32).eps))


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16])
def test_narrow_floats_keep_their_dtype(dt: type) -> None:
    x = np.linspace(-3, 3, 61).astype(dt)
    for f, ref in ((special.erf, math.erf), (special.expit, lambda v: 1.0 / (1.0 + math.exp(-v)))):
        got = f(x)
        assert got.dtype == np.dtype(dt)
        want = np.array([ref(float(v)) for v in x]).astype(dt)  # computed wide, rounded once
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_integer_input_gives_float64() -> None:
    np.testing.assert_allclose(special.erf(np.arange(3)), [0.0, math.erf(1.0), math.erf(2.0)], rtol=2e-15)
    assert special.expit(np.arange(2)).dtype == np.float64


@pytest.mark.parametrize("dt", [np.float16, np.float32, np.float64])
def test_zero_dimensional_inputs(dt: type) -> None:
    """A scalar tensor (0-d array) is an array like any other: NumPy returns scalars from its
    arithmetic on 0-d arrays, which must not break the in-place steps."""
    x = np.array(-0.75, dt)
    assert float(special.expit(x)) == pytest.approx(1 / (1 + math.exp(0.75)), rel=1e-3)
    assert float(special.erf(x)) == pytest.approx(math.erf(-0.75), rel=1e-3)
    out = np.empty((), np.float32)
    assert special.expit(x, out=out) is out
    assert float(out) == pytest.approx(1 / (1 + math.exp(0.75)), rel=1e-3)
