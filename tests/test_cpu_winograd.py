"""rlx-cpu's Winograd F(4x4, 3x3) kernel (rlx_cpu._winograd): checked against a float64 reference,
for every thread count bit for bit, and inside a conv chain's finite variant against the direct
conv and the reference; a NaN input runs the exact variant (oneDNN's direct conv) with NaN where
the reference has it. The portable code runs on any machine; the AVX-512 code where the CPU has it
(the only one the chain picks by itself)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _cpu_kernels import chain_impls, isas, require_built

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

RNG = np.random.default_rng(23)


@pytest.fixture(autouse=True)
def _built() -> Iterator[None]:
    require_built("rlx_cpu._winograd", "the chain's Winograd convs")
    yield


def _isas() -> list[int]:
    from rlx_cpu import winograd

    return isas("rlx_cpu._winograd", winograd)


def _reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, p: tuple[int, int, int, int],
               res: np.ndarray | None, act: str, clip: tuple[float, float] | None) -> np.ndarray:
    """NCHW float64 conv (+ bias, + residual, activation)."""
    n, c, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    oh, ow = h + p[0] + p[2] - 2, wd + p[1] + p[3] - 2
    y = np.zeros((n, w.shape[0], oh, ow)) + b.astype(np.float64)[None, :, None, None]
    for i in range(3):
        for k in range(3):
            y = y + np.einsum("nchw,oc->nohw", xp[:, :, i:i + oh, k:k + ow], w[:, :, i, k].astype(np.float64))
    if res is not None:
        y = y + res
    if act:
        y = np.where(y <= 0, 0.0, y)
    if clip is not None:
        y = np.clip(y, *clip)
    return y


def _run(x: np.ndarray, w: np.ndarray, b: np.ndarray, p: tuple[int, int, int, int], res: np.ndarray | None,
         act: str, clip: tuple[float, float] | None, isa: int, threads: int) -> np.ndarray:
    from rlx_cpu import onednn_conv, winograd

    api = onednn_conv._api()
    assert api is not None and api["gomp"]
    n, c, h, wd = x.shape
    oshape = (n, w.shape[0], h + p[0] + p[2] - 2, wd + p[1] + p[3] - 2)
    conv = winograd.WinogradConv(x.shape, w, b, oshape, p, act, clip, api["gomp"], isa)
    xn = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    y = np.full((n, oshape[2], oshape[3], oshape[1]), np.nan, np.float32)
    if res is not None:
        y[...] = res.transpose(0, 2, 3, 1)  # the residual sits in the destination (added in place)
    scratch = onednn_conv._aligned(conv.scratch_nbytes(threads))
    scratch[:] = np.nan  # the kernel writes every scratch value it reads
    conv.run(xn.ctypes.data, y.ctypes.data if res is not None else 0, y.ctypes.data, scratch.ctypes.data,
             threads)
    return y.transpose(0, 3, 1, 2)


CASES = [  # n, c, h, w, k, pads (top, left, bottom, right), residual
    (1, 16, 9, 9, 64, (1, 1, 1, 1), False),     # 3x3 tiles, the last ones partly outside
    (2, 32, 13, 10, 64, (1, 1, 1, 1), True),    # two images, uneven tiles, a residual
    (1, 64, 16, 16, 128, (0, 0, 0, 0), False),  # no padding: 14x14 out
    (1, 16, 8, 11, 64, (2, 0, 1, 2), True),     # uneven pads
    (3, 48, 5, 7, 192, (1, 1, 1, 1), False),    # fewer output pixels than a tile's width; 3 channel groups
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("act", ["", "relu", "clip"])
def test_kernel_matches_the_float64_reference(case: tuple[Any, ...], act: str) -> None:
    n, c, h, wd, k, p, with_res = case
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = (RNG.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = RNG.standard_normal(k).astype(np.float32)
    oshape = (n, k, h + p[0] + p[2] - 2, wd + p[1] + p[3] - 2)
    res = RNG.standard_normal(oshape).astype(np.float32) if with_res else None
    clip = (-0.5, 1.5) if act == "clip" else None
    relu = "relu" if act == "relu" else ""
    ref = _reference(x, w, b, p, res, relu, clip)
    for isa in _isas():
        outs = [_run(x, w, b, p, res, relu, clip, isa, t) for t in (1, 2, 3)]
        # Winograd's rounding: ~1e-6 of the values' magnitude (the direct sum's ~1e-7)
        np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=2e-5 * float(np.abs(ref).max()))
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])  # each tile summed in one order by one thread


def test_weights_transform_is_exact_for_one_tap() -> None:
    """U = G g G^T: a kernel with one tap at the centre gives G's middle column's outer product."""
    from rlx_cpu import winograd

    w = np.zeros((64, 16, 3, 3), np.float32)
    w[5, 3, 1, 1] = 1.0
    u = winograd.transform_weights(w)  # 36 x (k / 64) x c x 64
    g = np.asarray(winograd._G)
    want = np.outer(g[:, 1], g[:, 1]).reshape(36).astype(np.float32)
    np.testing.assert_array_equal(u[:, 0, 3, 5], want)
    assert np.count_nonzero(u) == np.count_nonzero(want)


def test_refuses_what_it_does_not_take() -> None:
    from rlx_cpu import _winograd, onednn_conv, winograd

    api = onednn_conv._api()
    assert api is not None

    def bind(c: int, k: int, act: str = "", kernel: int = 3) -> Any:
        w, b = np.ones((k, c, kernel, kernel), np.float32), np.zeros(k, np.float32)
        return winograd.WinogradConv((1, c, 8, 8), w, b, (1, k, 8, 8), (1, 1, 1, 1), act, None, api["gomp"],
                                     winograd.GENERIC)

    for bad in ((16, 48, ""), (8, 64, ""), (16, 64, "silu"), (16, 64, "", 5)):  # k % 64, c % 16, act, 5x5
        with pytest.raises(ValueError):
            bind(*bad)
    conv = bind(16, 64)
    conv_a, _ = _winograd.addresses()
    fn = ctypes.CFUNCTYPE(ctypes.c_int, *([ctypes.c_void_p] * 7), ctypes.c_float, ctypes.c_float,
                          *([ctypes.c_void_p] * 3), ctypes.c_int)(conv_a)
    x = np.ones((1, 8, 8, 16), np.float32)
    y = np.full(64 * 64, 7.0, np.float32)
    scratch = onednn_conv._aligned(conv.scratch_nbytes(2) + 64)
    for field, bad in ((5, 3), (7, 20), (9, 7), (10, 2), (0, 0)):  # pad > 2, oh past the input, act, ISA, n
        dims = conv.dims.copy()
        dims[field] = bad
        assert fn(x.ctypes.data, conv.u.ctypes.data, conv.b.ctypes.data, None, y.ctypes.data,
                  scratch.ctypes.data, dims.ctypes.data, 0.0, 0.0, *api["gomp"], 2) == -1
    unaligned = scratch.ctypes.data + 4
    assert fn(x.ctypes.data, conv.u.ctypes.data, conv.b.ctypes.data, None, y.ctypes.data, unaligned,
              conv.dims.ctypes.data, 0.0, 0.0, *api["gomp"], 2) == -1
    assert (y == 7.0).all()  # nothing written
    assert not winograd.worth_it((1, 256, 14, 14), (256, 256, 3, 3), (1, 256, 14, 14))  # C x K too big
    assert not winograd.worth_it((1, 64, 8, 8), (64, 64, 3, 3), (1, 64, 8, 8))  # 4 tiles
    assert winograd.worth_it((1, 64, 56, 56), (64, 64, 3, 3), (1, 64, 56, 56))
    assert winograd.worth_it((8, 256, 14, 14), (256, 256, 3, 3), (8, 256, 14, 14))  # 128 tiles
    assert not winograd.worth_it((8, 512, 7, 7), (512, 512, 3, 3), (8, 512, 7, 7))


def _block(batch: int, c: int = 64, hw: int = 20, scale: float = 1.0) -> Any:
    """A ResNet basic block between two convs: conv-relu, conv-relu, conv + residual - relu, conv-relu."""
    g = GraphBuilder("block")
    x = g.input("x", "f32", (batch, 16, hw, hw))

    def conv(v: Any, cin: int, name: str) -> Any:
        w = (RNG.standard_normal((c, cin, 3, 3)) * np.sqrt(2 / (9 * cin)) * scale).astype(np.float32)
        return g.op("conv2d_bias", v, g.param(name, w), g.param(name + "b", (RNG.standard_normal(c) * 0.1)
                                                                .astype(np.float32)),
                    strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), groups=1)

    h0 = g.op("relu", conv(x, 16, "w0"))
    h1 = g.op("relu", conv(h0, c, "w1"))
    h2 = g.op("relu", g.op("add", conv(h1, c, "w2"), h0))
    g.output(g.op("relu", conv(h2, c, "w3")), "y")
    return g.build()


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("isa", ["auto", "generic"])
def test_chain_runs_3x3_convs_as_winograd(batch: int, isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a chain's finite variant the 3x3 convs with 16+ input channels (the ones oneDNN keeps in
    NHWC) run on the kernel (AVX-512 where the CPU has it, the portable code when a test asks):
    close to the float64 reference and to oneDNN's direct conv. A NaN in the input runs the exact
    variant (oneDNN's direct conv): NaN exactly where the reference has it. RLX_CPU_WINOGRAD=0
    keeps oneDNN's."""
    from rlx_cpu import _winograd, conv_chain, winograd

    if isa == "generic":
        monkeypatch.setattr(winograd, "ISA", winograd.GENERIC)
    graph = _block(batch)
    xf = RNG.standard_normal((batch, 16, 20, 20)).astype(np.float32)
    exe = Session("cpu", use_cache=False).compile(graph)
    impls = chain_impls(exe, graph, {"x": xf})
    used = isa == "generic" or _winograd.isa() == "avx512"
    name = f"winograd_4x3:{'generic' if isa == 'generic' else 'avx512'}"
    assert (impls.count(name) == 4) == used, impls  # the first one after a reorder into NHWC
    monkeypatch.setattr(conv_chain, "WINOGRAD", False)
    direct = Session("cpu", use_cache=False).compile(graph)
    assert not any(i.startswith("winograd") for i in chain_impls(direct, graph, {"x": xf}))
    monkeypatch.setattr(conv_chain, "WINOGRAD", True)
    for nan in (False, True):
        xv = xf.copy()
        if nan:
            xv[0, 3, 7, 9] = np.nan
        got = exe.run(x=xv)["y"]
        ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
        base = direct.run(x=xv)["y"]
        assert np.isnan(ref).any() == nan and not np.isnan(ref).all()
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isnan(base), np.isnan(ref))
        ok = ~np.isnan(ref)
        scale = float(np.abs(ref[ok]).max())
        np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-4, atol=2e-5 * scale)
        np.testing.assert_allclose(got[ok], base[ok], rtol=1e-4, atol=2e-5 * scale)
    monkeypatch.setenv("RLX_CPU_WINOGRAD", "0")
    assert winograd.why_not() == "RLX_CPU_WINOGRAD=0"
    off = chain_impls(Session("cpu", use_cache=False).compile(graph), graph, {"x": xf})
    assert not any(i.startswith("winograd") for i in off), off


def test_inputs_past_the_bound_run_the_direct_conv(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the weights' bound no longer covers every input below float32's dot overflow, the finite
    variant's check bounds the input's norm by the Winograd convs' limit (still covering inputs of
    RMS 256): a finite input past it runs the exact variant (oneDNN's direct conv), equal to the
    reference; one below it runs Winograd's."""
    from rlx_cpu import _winograd, conv_chain, winograd

    if _winograd.isa() != "avx512":
        monkeypatch.setattr(winograd, "ISA", winograd.GENERIC)
    graph = _block(1, scale=40.0)  # ~1e3 per conv: the chain's bound ~1e12
    plans: list[Any] = []
    plan = conv_chain._finite_plan
    monkeypatch.setattr(conv_chain, "_finite_plan", lambda *a: plans.append(plan(*a)) or plans[-1])
    calls: list[int] = []
    run = winograd.WinogradConv.run
    monkeypatch.setattr(winograd.WinogradConv, "run", lambda self, *a: calls.append(1) or run(self, *a))
    exe = Session("cpu", use_cache=False).compile(graph)
    xf = RNG.standard_normal((1, 16, 20, 20)).astype(np.float32)
    exe.run(x=xf)
    (fin,) = plans
    assert fin.wino and 256 * np.sqrt(xf.size) <= fin.limit < conv_chain._X_MAX, fin.limit
    assert len(calls) == 4
    big = (xf * (2 * fin.limit / float(np.linalg.norm(xf)))).astype(np.float32)  # norm 2x the limit
    calls.clear()
    got = exe.run(x=big)["y"]
    assert not calls  # the exact variant: oneDNN's direct convs
    ref = evaluate(graph, {"x": big.astype(np.float64)})["y"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * float(np.abs(ref).max()))


def test_too_few_tiles_keep_the_direct_conv() -> None:
    graph = _block(1, hw=8)  # 8x8: 4 tiles
    xf = RNG.standard_normal((1, 16, 8, 8)).astype(np.float32)
    impls = chain_impls(Session("cpu", use_cache=False).compile(graph), graph, {"x": xf})
    assert impls and not any(i.startswith("winograd") for i in impls), impls


def test_probe_says_which_conv_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import _winograd, plugin

    (dev,) = plugin.rlx_probe_devices()
    avx512 = _winograd.isa() == "avx512"
    want = "rlx_cpu._winograd (AVX-512)" if avx512 else "oneDNN: this CPU has no AVX-512"
    assert dev.details["winograd"].startswith(want), dev.details
    monkeypatch.setenv("RLX_CPU_WINOGRAD", "0")
    (dev,) = plugin.rlx_probe_devices()
    assert dev.details["winograd"] == "oneDNN: RLX_CPU_WINOGRAD=0"
