"""rlx-cpu's NumPy max pool on channel-blocked tensors (rlx_cpu._pool_np): equal to a float64 NumPy
reference (padding never wins, NaN wins, infinities), for planes ``lo:hi`` only, across the row-max
buffer's plane groups; and it loads no Numba."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

# (planes, H, W, lanes), kernel, strides, pads (top, left)
CASES = [
    ((4, 112, 112, 16), (3, 3), (2, 2), (1, 1)),  # ResNet's stem pool, one image of 64 channels
    ((3, 7, 9, 8), (2, 3), (1, 2), (1, 2)),       # asymmetric kernel and strides
    ((2, 5, 5, 16), (5, 5), (5, 5), (0, 0)),      # one window a plane
    ((5, 6, 11, 4), (3, 2), (3, 1), (2, 1)),      # stride larger than the pad
    ((2, 3, 3, 16), (3, 3), (1, 1), (2, 2)),      # corner windows with a single tap
    ((2, 1, 40, 16), (1, 2), (1, 2), (0, 0)),     # a 1-D pool as (N, C, 1, L): no row pass
    ((3, 1, 9, 8), (1, 3), (1, 1), (0, 1)),       # 1-D, padded: the first column tap covers all but one
]


def _reference(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int], pads: tuple[int, int],
               ho: int, wo: int) -> np.ndarray:
    """float64 max over each window's in-bounds taps, NaN winning (the IR's max_pool2d rules)."""
    (kh, kw), (sh, sw), (pt, pl) = kernel, strides, pads
    p, h, w, b = x.shape
    out = np.full((p, ho, wo, b), -np.inf)
    x64 = x.astype(np.float64)
    for r in range(ho):
        for c in range(wo):
            rs = slice(max(r * sh - pt, 0), min(r * sh - pt + kh, h))
            cs = slice(max(c * sw - pl, 0), min(c * sw - pl + kw, w))
            win = x64[:, rs, cs].reshape(p, -1, b)
            if win.shape[1]:
                out[:, r, c] = np.max(win, axis=1)  # np.max propagates NaN
    return out


@pytest.mark.parametrize(("shape", "kernel", "strides", "pads"), CASES)
@pytest.mark.parametrize("chunk", [1 << 20, 1])  # 1: one plane a group (many groups)
def test_blocked_max_pool_matches_reference(shape: tuple[int, int, int, int], kernel: tuple[int, int],
                                            strides: tuple[int, int], pads: tuple[int, int], chunk: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import _pool_np

    monkeypatch.setattr(_pool_np, "CHUNK_BYTES", chunk)
    (kh, kw), (sh, sw), (pt, pl) = kernel, strides, pads
    p, h, w, _ = shape
    ho, wo = (h + 2 * pt - kh) // sh + 1, (w + 2 * pl - kw) // sw + 1
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    for v in (np.nan, np.inf, -np.inf):
        flat[rng.integers(0, flat.size, 1 + flat.size // 50)] = v
    want = _reference(x, kernel, strides, pads, ho, wo)
    got = np.full((p, ho, wo, shape[3]), 7.0, np.float32)  # planes outside lo:hi keep it
    lo, hi = (1, p) if p > 1 else (0, 1)
    _pool_np.max_pool_blocked(x, got, kh, kw, sh, sw, pt, pl, lo, hi)
    np.testing.assert_array_equal(got[lo:hi], want[lo:hi].astype(np.float32))
    assert (got[:lo] == 7.0).all()
    assert np.isnan(got[lo:hi]).any()


def test_setting_picks_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import _pool_np

    monkeypatch.delenv("RLX_CPU_POOL_NUMPY", raising=False)
    monkeypatch.delitem(sys.modules, "numba", raising=False)  # as in a process that has not loaded it
    assert _pool_np.blocked_kernel() is _pool_np.max_pool_blocked
    monkeypatch.undo()
    import numba  # noqa: F401  # loaded already: the faster Numba kernel costs nothing more
    monkeypatch.delenv("RLX_CPU_POOL_NUMPY", raising=False)
    assert _pool_np.blocked_kernel().__module__ == "rlx_cpu._pool_nb"
    monkeypatch.setenv("RLX_CPU_POOL_NUMPY", "0")
    nb = _pool_np.blocked_kernel()
    assert nb is not _pool_np.max_pool_blocked and nb.__module__ == "rlx_cpu._pool_nb"


def test_numpy_kernel_loads_no_numba() -> None:
    code = ("import sys, numpy as np\n"
            "from rlx_cpu._pool_np import blocked_kernel\n"
            "x = np.ones((1, 4, 4, 16), np.float32); o = np.empty((1, 2, 2, 16), np.float32)\n"
            "blocked_kernel()(x, o, 3, 3, 2, 2, 1, 1, 0, 1)\n"
            "assert (o == 1).all()\n"
            "print('numba' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


@pytest.mark.parametrize(("shape", "c"), [((2, 3, 4, 5, 16), 40), ((1, 1, 7, 7, 24), 24),
                                         ((3, 2, 1, 1, 16), 17)])
def test_blocked_mean_matches_the_numba_kernel(shape: tuple[int, ...], c: int) -> None:
    from rlx_cpu import _pool_np, _se_nb

    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 0, 0, 0, 1] = np.nan
    want = np.full((shape[0], c), -1.0, np.float32)
    got = want.copy()
    _se_nb.mean_blocked(x, want, c, 0, shape[0])
    _pool_np.mean_blocked(x, got, c, 0, shape[0])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # NaN where the Numba kernel has it
    assert np.isnan(got[0, 1]) and not np.isnan(got[0, 0])


def test_resnet_in_a_conv_chain_loads_no_numba() -> None:
    """The RSS claim: ResNet-18's chain (stem pool, global mean) and classifier run without Numba."""
    code = ("import sys\n"
            "from rlx_core.bench import inputs, rlx_graph\n"
            "from rlx_core.runtime import Session\n"
            "Session('cpu', use_cache=False).compile(rlx_graph('resnet18')).run(inputs('resnet18', 1, 8))\n"
            "print('numba' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip().splitlines()[-1] == "False", r.stderr[-2000:]
