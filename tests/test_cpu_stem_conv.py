"""rlx-cpu's direct kernel for convs with few input channels (rlx_cpu._stemconv): checked against a
float64 reference (NaN and Inf included), for every thread count bit for bit, and as a conv chain's
stem against the oneDNN path. The portable tiles run on any machine; the AVX-512 tiles where the CPU
has them (they are the only ones the chain picks by itself)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _cpu_kernels import chain_impls, isas, require_built

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _built() -> Iterator[None]:
    require_built("rlx_cpu._stemconv", "the chain's stem convs")
    yield


def _isas() -> list[int]:
    from rlx_cpu import stem_conv

    return isas("rlx_cpu._stemconv", stem_conv)


def _reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, s: tuple[int, int], p: tuple[int, int, int, int],
               act: str, clip: tuple[float, float] | None) -> np.ndarray:
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    oh, ow = (h + p[0] + p[2] - kh) // s[0] + 1, (wd + p[1] + p[3] - kw) // s[1] + 1
    y = np.zeros((n, oc, oh, ow)) + b.astype(np.float64)[None, :, None, None]
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(kh):
            for k in range(kw):
                patch = xp[:, :, i:i + s[0] * (oh - 1) + 1:s[0], k:k + s[1] * (ow - 1) + 1:s[1]]
                y = y + np.einsum("nchw,oc->nohw", patch, w[:, :, i, k].astype(np.float64))
    if act:
        y = np.where(y <= 0, 0.0, y)  # NaN stays (y <= 0 is False)
    if clip is not None:
        y = np.where(y < clip[0], clip[0], y)
        y = np.where(y > clip[1], clip[1], y)
    return y


def _run(x: np.ndarray, w: np.ndarray, b: np.ndarray, s: tuple[int, int], p: tuple[int, int, int, int],
         act: str, clip: tuple[float, float] | None, isa: int, threads: int) -> np.ndarray:
    from rlx_cpu import onednn_conv, stem_conv

    api = onednn_conv._api()
    assert api is not None and api["gomp"]
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    oshape = (n, oc, (h + p[0] + p[2] - kh) // s[0] + 1, (wd + p[1] + p[3] - kw) // s[1] + 1)
    conv = stem_conv.StemConv(x.shape, w, b, oshape, s, p, act, clip, api["gomp"], isa)
    xp = np.full(conv.pad_nbytes // 4, np.nan, np.float32)  # the kernel writes every byte it reads
    y = np.full((n, oc // 16, oshape[2], oshape[3], 16), np.nan, np.float32)
    conv.run(x.ctypes.data, xp.ctypes.data, y.ctypes.data, threads)
    return y.transpose(0, 1, 4, 2, 3).reshape(oshape)


CASES = [  # n, c, h, w, oc, k, stride, pads (top, left, bottom, right)
    (1, 3, 30, 28, 64, 7, 2, (3, 3, 3, 3)),   # ResNet's stem, small
    (2, 3, 23, 26, 32, 7, 2, (3, 3, 3, 3)),
    (1, 3, 17, 15, 48, 3, 2, (1, 1, 1, 1)),   # MobileNet's stem, 3 blocks (a tail group)
    (1, 1, 9, 12, 16, 3, 1, (0, 0, 0, 0)),
    (2, 4, 12, 11, 80, 5, 1, (2, 1, 0, 2)),   # uneven pads, 5 blocks
    (1, 8, 10, 13, 16, 1, 3, (0, 0, 0, 0)),   # stride 3 (runtime stride), 1x1
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("act", ["", "relu", "clip"])
def test_kernel_matches_the_float64_reference(case: tuple[Any, ...], act: str) -> None:
    n, c, h, wd, oc, k, s, p = case
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = RNG.standard_normal((oc, c, k, k)).astype(np.float32)
    b = RNG.standard_normal(oc).astype(np.float32)
    clip = (-0.5, 1.5) if act == "clip" else None
    relu = "relu" if act == "relu" else ""
    ref = _reference(x, w, b, (s, s), p, relu, clip)
    for isa in _isas():
        outs = [_run(x, w, b, (s, s), p, relu, clip, isa, t) for t in (1, 2, 3)]
        np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])  # each output summed in one order by one thread


def test_nan_and_inf_propagate_as_the_reference() -> None:
    """A NaN input pixel makes NaN in every window holding it (ReLU and clip keep it), an Inf input
    Inf (or NaN where it meets an opposite Inf); an Inf weight times the zero padding is NaN, as
    the reference's sum has it (oneDNN skips padded taps)."""
    x = RNG.standard_normal((1, 3, 14, 14)).astype(np.float32)
    x[0, 1, 5, 6] = np.nan
    x[0, 2, 0, 0] = np.inf
    w = RNG.standard_normal((32, 3, 3, 3)).astype(np.float32)
    w[3, 0, 0, 0] = np.inf  # reads the padding at the top-left corner
    b = np.zeros(32, np.float32)
    for act, clip in (("relu", None), ("", (0.0, 6.0))):
        ref = _reference(x, w, b, (1, 1), (1, 1, 1, 1), act, clip)
        assert np.isnan(ref).any() and np.isinf(ref).any() == (clip is None)
        for isa in _isas():
            got = _run(x, w, b, (1, 1), (1, 1, 1, 1), act, clip, isa, 2)
            assert np.array_equal(np.isnan(got), np.isnan(ref)), isa
            ok = np.isfinite(ref)
            assert np.array_equal(got[~ok & ~np.isnan(ref)], ref[~ok & ~np.isnan(ref)])
            np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-5, atol=1e-5 * float(np.abs(ref[ok]).max()))


def test_refuses_what_it_does_not_take() -> None:
    from rlx_cpu import _stemconv, onednn_conv, stem_conv

    api = onednn_conv._api()
    assert api is not None
    x_shape = (1, 3, 8, 8)
    def bind(oc: int, act: str) -> Any:
        w, b = np.ones((oc, 3, 3, 3), np.float32), np.zeros(oc, np.float32)
        return stem_conv.StemConv(x_shape, w, b, (1, oc, 6, 6), (1, 1), (0, 0, 0, 0), act, None,
                                    api["gomp"], stem_conv.GENERIC)

    with pytest.raises(ValueError):  # output channels not in whole blocks of 16
        bind(24, "")
    with pytest.raises(ValueError):  # an activation it has no form for
        bind(16, "silu")
    conv_a, pack_a, pad_a = _stemconv.addresses()
    fn = ctypes.CFUNCTYPE(ctypes.c_int, *([ctypes.c_void_p] * 6), ctypes.c_float, ctypes.c_float,
                          *([ctypes.c_void_p] * 3), ctypes.c_int)(conv_a)
    conv = bind(16, "")
    y = np.full(16 * 36, 7.0, np.float32)
    x = np.ones(x_shape, np.float32)
    xp = np.zeros(conv.pad_nbytes // 4, np.float32)
    for field, bad in ((11, 2), (16, 2), (15, 5), (4, 20), (0, 0)):  # dilation, ISA, act, oc, n
        dims = conv.dims.copy()
        dims[field] = bad
        assert fn(x.ctypes.data, xp.ctypes.data, conv.w.ctypes.data, conv.b.ctypes.data, y.ctypes.data,
                  dims.ctypes.data, 0.0, 0.0, *api["gomp"], 2) == -1
    assert (y == 7.0).all()  # nothing written
    if _stemconv.isa() != "avx512":  # AUTO picks no tiles on such a CPU: the chain keeps oneDNN's conv
        dims = conv.dims.copy()
        dims[16] = stem_conv.AUTO
        assert fn(x.ctypes.data, xp.ctypes.data, conv.w.ctypes.data, conv.b.ctypes.data, y.ctypes.data,
                  dims.ctypes.data, 0.0, 0.0, *api["gomp"], 2) == -1


def _stem(batch: int, oc: int = 64, fed: bool = False, k: int = 7) -> Any:
    g = GraphBuilder("stem")
    x = g.input("x", "f32", (batch, 3, 40, 36))
    w = (RNG.standard_normal((oc, 3, k, k)) * 0.2).astype(np.float32)
    wt = g.input("w", "f32", w.shape) if fed else g.param("w", w)
    y = g.op("relu", g.op("conv2d_bias", x, wt, g.param("b", RNG.standard_normal(oc).astype(np.float32)),
                          strides=(2, 2), pads=(k // 2,) * 4, dilations=(1, 1), groups=1))
    y = g.op("max_pool2d", y, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    w2 = (RNG.standard_normal((oc, oc, 3, 3)) * 0.05).astype(np.float32)
    y = g.op("relu", g.op("conv2d_bias", y, g.param("w2", w2), g.param("b2", np.zeros(oc, np.float32)),
                          strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), groups=1))
    g.output(y, "y")
    return g.build()


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("isa", ["auto", "generic"])
def test_chain_stem_runs_on_the_kernel(batch: int, isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ResNet's stem (3->64 7x7 s2 + ReLU, max pool, a 3x3 conv) is one chain whose first conv is
    the kernel (the AVX-512 tiles where the CPU has them, else oneDNN's conv; the portable tiles when
    a test asks for them): equal to the float64 reference and close to oneDNN's conv, NaN included;
    RLX_CPU_STEM_CONV=0 and fed weights keep oneDNN's."""
    from rlx_cpu import _stemconv, conv_chain, stem_conv

    if isa == "generic":
        monkeypatch.setattr(stem_conv, "ISA", stem_conv.GENERIC)
    graph = _stem(batch)
    xf = RNG.standard_normal((batch, 3, 40, 36)).astype(np.float32)
    made: list[Any] = []
    orig = conv_chain._Blocked._plan

    def plan(self: Any, *a: Any, **k: Any) -> None:
        orig(self, *a, **k)
        made.append(self)
    monkeypatch.setattr(conv_chain._Blocked, "_plan", plan)
    exe = Session("cpu", use_cache=False).compile(graph)
    impls = chain_impls(exe, graph, {"x": xf})
    used = isa == "generic" or _stemconv.isa() == "avx512"
    assert (impls[0] == f"stem_conv:{'generic' if isa == 'generic' else 'avx512'}") == used, impls
    if used and _stemconv.isa() == "avx512":  # NHWC out, as the 3x3 conv's brgconv reads it: no
        # reorder but the chain's output's
        assert made and all(len(b.entries) == len(b.impls) + 1 for b in made), [b.impls for b in made]
    monkeypatch.setattr(conv_chain._Blocked, "_plan", orig)
    monkeypatch.setattr(conv_chain, "STEM_CONV", False)
    onednn = Session("cpu", use_cache=False).compile(graph)
    base_impls = chain_impls(onednn, graph, {"x": xf})
    assert not base_impls[0].startswith("stem_conv"), base_impls
    monkeypatch.setattr(conv_chain, "STEM_CONV", True)
    for nan in (False, True):
        xv = xf.copy()
        if nan:
            xv[0, 1, 7, 9] = np.nan
        got = exe.run(x=xv)["y"]
        ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
        base = onednn.run(x=xv)["y"]
        assert np.isnan(ref).any() == nan
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isnan(base), np.isnan(ref))
        ok = ~np.isnan(ref)
        scale = float(np.abs(ref[ok]).max())
        np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-4, atol=2e-4 * scale)
        np.testing.assert_allclose(got[ok], base[ok], rtol=2e-4, atol=2e-4 * scale)
    monkeypatch.setenv("RLX_CPU_STEM_CONV", "0")
    assert stem_conv.why_not() == "RLX_CPU_STEM_CONV=0"
    off = chain_impls(Session("cpu", use_cache=False).compile(graph), graph, {"x": xf})
    assert not off[0].startswith("stem_conv"), off
    monkeypatch.delenv("RLX_CPU_STEM_CONV")
    for oc, k in ((32, 7), (64, 3)):  # where oneDNN's is the faster (stem_conv.OC_MULTIPLE, MIN_TAPS)
        other = _stem(batch, oc, k=k)
        impls = chain_impls(Session("cpu", use_cache=False).compile(other), other, {"x": xf})
        assert not impls[0].startswith("stem_conv"), impls
    fed = _stem(batch, fed=True)
    w = RNG.standard_normal((64, 3, 7, 7)).astype(np.float32)
    impls = chain_impls(Session("cpu", use_cache=False).compile(fed), fed, {"x": xf, "w": w})
    assert not any(i.startswith("stem_conv") for i in impls), impls


def test_probe_says_which_conv_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import _stemconv, plugin

    (dev,) = plugin.rlx_probe_devices()
    avx512 = _stemconv.isa() == "avx512"
    want = "rlx_cpu._stemconv (AVX-512)" if avx512 else "oneDNN: this CPU has no AVX-512"
    assert dev.details["stem_conv"].startswith(want), dev.details
    monkeypatch.setenv("RLX_CPU_STEM_CONV", "0")
    (dev,) = plugin.rlx_probe_devices()
    assert dev.details["stem_conv"] == "oneDNN: RLX_CPU_STEM_CONV=0"
