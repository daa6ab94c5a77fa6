"""rlx-cpu's private BLAS: every operand layout, computed in row pieces, equals NumPy's product."""

from __future__ import annotations

import ctypes
import itertools
import platform
import sys

import numpy as np
import pytest
from rlx_cpu import blas

RNG = np.random.default_rng(5)


def _operand(rows: int, cols: int, layout: str, dt: type) -> np.ndarray:
    if layout == "C":
        return RNG.standard_normal((rows, cols)).astype(dt)
    return np.asfortranarray(RNG.standard_normal((rows, cols)).astype(dt))  # read transposed


@pytest.mark.skipif(not blas.available(), reason="no private OpenBLAS on this NumPy build: not certified")
@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("la", ["C", "F"])
@pytest.mark.parametrize("lb", ["C", "F"])
def test_split_gemm_matches_numpy(dt: type, la: str, lb: str) -> None:
    m, k, n = 37, 19, 53
    a, b = _operand(m, k, la, dt), _operand(k, n, lb, dt)
    c = np.full((m, n), np.nan, dt)
    run = blas.gemm_fn(a, b, c)
    assert run is not None
    cuts = [0, 5, 5, m // 2, m]  # uneven row pieces, one of them empty
    for lo, hi in itertools.pairwise(cuts):
        run(lo, hi)
    tol = 1e-5 if dt is np.float32 else 1e-12
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=tol, atol=tol * k)


def test_unreadable_operands_fall_back() -> None:
    a = RNG.standard_normal((8, 6)).astype(np.float32)[:, ::2]  # neither row- nor column-contiguous
    b = RNG.standard_normal((3, 4)).astype(np.float32)
    assert blas.gemm_fn(a, b, np.empty((8, 4), np.float32)) is None
    assert blas.gemm_fn(a.astype(np.float16), b.astype(np.float16), np.empty((8, 4), np.float16)) is None


ONEDNN_HERE = platform.machine() == "x86_64" and sys.platform == "linux"


@pytest.mark.skipif(not ONEDNN_HERE, reason="the onednn-cpu-gomp wheel exists for x86-64 Linux only")
def test_float32_runs_on_onednn_and_keeps_the_callers_openmp_setting() -> None:
    assert blas.library(np.float32) == "oneDNN sgemm", blas._load().get("dnnl_why")
    assert blas.library(np.float64) == "private OpenBLAS"
    omp = ctypes.CDLL("libgomp.so.1")
    omp.omp_set_num_threads(3)
    a, b = _operand(64, 40, "C", np.float32), _operand(40, 24, "F", np.float32)
    c = np.empty((64, 24), np.float32)
    run = blas.gemm_fn(a, b, c)
    assert run is not None
    run(0, 64)
    assert omp.omp_get_max_threads() == 3  # set to 1 for the call only
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("env", "want"), [
    ({"RLX_CPU_PRIVATE_BLAS": "0"}, "NumPy (np.matmul): RLX_CPU_PRIVATE_BLAS=0"),
    ({"RLX_CPU_ONEDNN": "0"}, "private OpenBLAS")])
def test_switches(env: dict[str, str], want: str, tmp_path: object) -> None:
    import subprocess

    code = "import numpy as np; from rlx_cpu import blas; print(blas.library(np.float32))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**env, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == want



@pytest.mark.skipif(not ONEDNN_HERE, reason="the onednn-cpu-gomp wheel exists for x86-64 Linux only")
@pytest.mark.parametrize("la", ["C", "F"])
@pytest.mark.parametrize("lb", ["C", "F"])
def test_native_linear_rows_match_numpy(la: str, lb: str) -> None:
    m, k, n = 37, 19, 53
    x, w = _operand(m, k, la, np.float32), _operand(k, n, lb, np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    o = np.full((m, n), np.nan, np.float32)
    call = blas.linear_rows(x, w, bias, o)
    assert call is not None
    fn, args = call
    for lo, hi in itertools.pairwise([0, 5, 5, m // 2, m]):
        fn(*args, lo, hi)
    np.testing.assert_allclose(o, x.astype(np.float64) @ w + bias, rtol=1e-5, atol=1e-4)
    assert blas.linear_rows(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64),
                            o.astype(np.float64)) is None  # float64 stays on OpenBLAS
