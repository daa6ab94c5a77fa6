"""rlx-cpu conv2d: several convs of one program share one per-thread im2col scratch buffer; float32
convs and conv2d_bias on oneDNN's convolution primitive (odd shapes, constant and fed weights)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

RNG = np.random.default_rng(3)


# pooled: every conv of a batch of >= 2 images on rlx-cpu's BLAS over a 2-thread pool, whole
# images a thread, each with its own scratch (a batch of 1 is never pooled).
@pytest.mark.parametrize(("batch", "pooled"), [(1, False), (3, False), (3, True)])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_convs_sharing_scratch_match_reference(batch: int, pooled: bool, dt: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import conv, onednn_conv, parallel

    monkeypatch.setattr(onednn_conv, "USE", False)  # the im2col path, which float32 takes without oneDNN
    monkeypatch.setattr(conv, "POOL_MIN_MACS", 0 if pooled else 1 << 62)
    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(2))
    np_dt = np.float32 if dt == "f32" else np.float64
    g = GraphBuilder("convs")
    x = g.input("x", dt, (batch, 4, 9, 11))

    def w(o: int, i: int, k: int) -> object:
        return g.param(f"w{o}_{i}_{k}", RNG.standard_normal((o, i, k, k)).astype(np_dt))

    # No padding first (fills the scratch with data), then padded, strided, grouped and dilated
    # convs that must not see those bytes in their zero borders.
    a = g.op("conv2d", x, w(6, 4, 3), strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1)
    b = g.op("conv2d", a, w(6, 6, 3), strides=(2, 1), pads=(2, 1, 1, 2), dilations=(1, 1), groups=1)
    c = g.op("conv2d", b, w(6, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 2), groups=2)
    d = g.op("conv2d", c, w(5, 6, 1), strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1)
    g.output(d, "y")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    for _ in range(2):  # the second run reuses a scratch that already holds the last conv's bytes
        xv = RNG.standard_normal((batch, 4, 9, 11)).astype(np_dt)
        np.testing.assert_allclose(exe.run(x=xv)["y"], evaluate(graph, {"x": xv})["y"], rtol=1e-4, atol=1e-4)


def _onednn() -> Any:
    from rlx_cpu import onednn_conv

    if not onednn_conv.available():
        pytest.skip("oneDNN is not installed (pip install 'rlx-cpu[onednn]'); the im2col tests cover f32")
    return onednn_conv


# (batch, channels, size, out channels, kernel, strides, pads (t, l, b, r), dilations, groups)
SHAPES = [
    (1, 3, 23, 16, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1),    # stem-like: 3 input channels, stride 2
    (2, 16, 9, 32, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),    # batch > 1
    (3, 32, 8, 32, 3, (2, 2), (1, 0, 2, 1), (1, 1), 32),   # depthwise, strided, asymmetric pads
    (1, 12, 11, 18, 3, (1, 2), (2, 1, 0, 2), (2, 1), 3),   # grouped, dilated, odd strides
    (2, 24, 7, 40, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),    # 1x1
    (1, 24, 13, 20, 1, (2, 2), (0, 0, 0, 0), (1, 1), 4),   # 1x1 strided, grouped
    (1, 5, 6, 7, 5, (3, 1), (0, 4, 1, 0), (1, 2), 1),      # a kernel as large as the padded input
    (1, 32, 5, 64, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),    # weights outweigh the input: split by channels
    (1, 4, 10, 8, 3, (3, 1), (0, 1, 2, 1), (2, 1), 1),     # row pieces: the last reads bottom padding
]


def _conv_graph(dt: str, shape: tuple, tail: str, fed_weights: bool) -> tuple[Any, np.ndarray]:
    """conv2d (``tail`` "none") or conv2d_bias, then "relu", "add_relu" (a residual input r),
    "silu" (the core op), "sig_mul" (``y * sigmoid(y)``, as ONNX exporters write SiLU) or "hswish"
    (``y * min(max(y / 6 + 1/2, 0), 1)``, as they write HardSwish)."""
    n, c, s, oc, k, strides, pads, dil, groups = shape
    r = np.random.default_rng(7)
    npdt = np.float32 if dt == "f32" else np.float64
    g = GraphBuilder("conv")
    x = g.input("x", dt, (n, c, s, s))
    wv = r.standard_normal((oc, c // groups, k, k))
    w = g.input("w", dt, wv.shape) if fed_weights else g.param("w", wv.astype(npdt))
    kw = {"strides": strides, "pads": pads, "dilations": dil, "groups": groups}
    if tail == "none":
        y = g.op("conv2d", x, w, **kw)
    else:
        y = g.op("conv2d_bias", x, w, g.param("b", r.standard_normal(oc).astype(npdt)), **kw)
    if tail == "add_relu":  # a ResNet block's tail
        ho = (s + pads[0] + pads[2] - dil[0] * (k - 1) - 1) // strides[0] + 1
        wo = (s + pads[1] + pads[3] - dil[1] * (k - 1) - 1) // strides[1] + 1
        y = y + g.input("r", dt, (n, oc, ho, wo))
    if tail in ("relu", "add_relu"):
        y = g.op("relu", y)
    if tail == "silu":
        y = g.op("silu", y)
    if tail == "sig_mul":
        y = g.op("sigmoid", y) * y
    if tail == "hswish":
        t = g.op("maximum", y * g.const(1 / 6, dt) + g.const(0.5, dt), g.const(0.0, dt))
        y = y * g.op("minimum", t, g.const(1.0, dt))
    g.output(y, "y")
    return g.build(), wv


#: what oneDNN must have been asked for: (bias, residual, activation)
POST = {"none": (False, False, ""), "bias": (True, False, ""), "relu": (True, False, "relu"),
        "add_relu": (True, True, "relu"), "silu": (True, False, "silu"), "sig_mul": (True, False, "silu"),
        "hswish": (True, False, ("hardswish", float(np.float32(1 / 6)), 0.5))}


def _check_float32_conv(shape: tuple, tail: str, fed: bool) -> None:
    """The float32 conv (and ``tail``) against the float64 reference, twice: fed weights change
    between the runs (they are read, or reordered, every run)."""
    graph, wv = _conv_graph("f32", shape, tail, fed)
    ref_graph, _ = _conv_graph("f64", shape, tail, fed)
    exe = Session("cpu", use_cache=False).compile(graph)
    n, c, s = shape[:3]
    for rep in range(2):
        xv = RNG.standard_normal((n, c, s, s))
        feed, ref_feed = {"x": xv.astype(np.float32)}, {"x": xv}
        if fed:
            wr = wv * (1 + rep)
            feed["w"], ref_feed["w"] = wr.astype(np.float32), wr
        if tail == "add_relu":
            rv = RNG.standard_normal(ref_graph.types["r"].shape) * 10
            feed["r"], ref_feed["r"] = rv.astype(np.float32), rv
        got = exe.run(**feed)["y"]
        np.testing.assert_allclose(got, evaluate(ref_graph, ref_feed)["y"], rtol=2e-5, atol=2e-4)
        if tail in ("relu", "add_relu"):
            assert (got == 0).any() and (got > 0).any()  # the ReLU did clamp something


# split: every conv cut into pieces on the 2-thread row pool (images, else output channels, else
# output rows), whatever its size; else only convs of 1M+ multiply-adds a piece are (none here).
@pytest.mark.parametrize("shape", SHAPES, ids=[f"s{i}" for i in range(len(SHAPES))])
@pytest.mark.parametrize(("tail", "fed"), [("none", False), ("bias", False), ("relu", True),
                                           ("add_relu", False), ("add_relu", True), ("silu", False),
                                           ("sig_mul", True), ("hswish", False)])
@pytest.mark.parametrize("mode", ["team", "whole", "split"])
def test_onednn_conv_matches_float64_reference(shape: tuple, tail: str, fed: bool, mode: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """team: one primitive on an OpenMP team (the default); whole / split: RLX_CPU_CONV_OPENMP=0."""
    from rlx_cpu import conv, parallel

    onednn_conv = _onednn()
    split = mode == "split"
    monkeypatch.setattr(conv, "SMALL_MACS", 0)  # these shapes are tiny: keep them on oneDNN
    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(2))  # no load probe: 2 threads throughout
    monkeypatch.setenv("RLX_CPU_CONV_OPENMP", "1" if mode == "team" else "0")
    monkeypatch.setattr(onednn_conv, "MIN_MACS_PER_PIECE", 0 if split else 1 << 62)
    built: list[tuple[bool, bool, bool]] = []
    orig = onednn_conv._build

    def counting(*a: Any) -> Any:
        built.append((a[8] is not None, a[9] is not None, a[10]))  # bias, residual, activation
        return orig(*a)
    monkeypatch.setattr(onednn_conv, "_build", counting)
    _check_float32_conv(shape, tail, fed)
    # Each piece is the conv and its tail as one oneDNN primitive; only a batch of 1 with a single
    # output row (s6) has nothing to cut.
    assert built == [POST[tail]] * len(built), "the conv and its tail did not run as one oneDNN primitive"
    assert (len(built) > 1) == (split and shape is not SHAPES[6])


@pytest.mark.parametrize("shape", SHAPES, ids=[f"s{i}" for i in range(len(SHAPES))])
@pytest.mark.parametrize(("tail", "fed"), [("none", False), ("bias", True), ("relu", False),
                                           ("add_relu", True)])
def test_small_conv_matches_float64_reference(shape: tuple, tail: str, fed: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny convs as one Numba call (im2col tables + oneDNN's sgemm + the tail), every shape taken
    whatever its size or group width; fed weights are read at each run."""
    from rlx_cpu import conv

    _onednn()
    monkeypatch.setattr(conv, "SMALL_MACS", 1 << 62)
    monkeypatch.setattr(conv, "SMALL_MIN_GROUP_OUT", 1)
    taken: list[bool] = []
    orig = conv._small_conv

    def counting(*a: Any) -> Any:
        run = orig(*a)
        taken.append(run is not None)
        return run
    monkeypatch.setattr(conv, "_small_conv", counting)
    _check_float32_conv(shape, tail, fed)
    assert taken and all(taken), "the conv did not take the small path"


def test_small_conv_pads_with_zeros_times_nan_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Zero padding then convolve: a NaN weight over the padding makes that output NaN, as in the
    reference (oneDNN skips the padding instead, so rlx-cpu checks weights for it there)."""
    from rlx_cpu import conv

    _onednn()
    monkeypatch.setattr(conv, "SMALL_MIN_GROUP_OUT", 1)
    w = RNG.standard_normal((8, 2, 3, 3)).astype(np.float32)
    w[0, 1, 0, 0] = np.nan
    g = GraphBuilder("nanpad")
    x = g.input("x", "f32", (1, 2, 5, 5))
    g.output(g.op("conv2d", x, g.param("w", w), strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1),
                  groups=1), "y")
    graph = g.build()
    xv = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    got = Session("cpu", use_cache=False).compile(graph).run(x=xv)["y"]
    want = evaluate(graph, {"x": xv})["y"]
    assert np.isnan(got[0, 0]).all() and np.isnan(want[0, 0]).all()  # padded corners included
    np.testing.assert_allclose(got[0, 1:], want[0, 1:], rtol=1e-5, atol=1e-5)


def test_onednn_conv_pieces_run_on_the_row_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The conv's pieces run as one-thread primitives on the row pool (no OpenMP team, whose
    spinning worker would slow the pool's next step); while other processes take cores (the pool's
    ``active`` drops) the same pieces run one after another, with the same results."""
    from rlx_cpu import parallel

    onednn_conv = _onednn()
    pl = parallel.RowPool(2)
    monkeypatch.setattr(parallel, "_POOL", pl)
    monkeypatch.setenv("RLX_CPU_CONV_OPENMP", "0")
    monkeypatch.setattr(onednn_conv, "MIN_MACS_PER_PIECE", 0)
    threads: list[int] = []
    orig = onednn_conv._build

    def counting(*a: Any) -> Any:
        threads.append(a[11])
        return orig(*a)
    monkeypatch.setattr(onednn_conv, "_build", counting)
    graph, _ = _conv_graph("f32", SHAPES[1], "add_relu", False)
    ref, _ = _conv_graph("f64", SHAPES[1], "add_relu", False)
    exe = Session("cpu", use_cache=False).compile(graph)
    xv, rv = RNG.standard_normal((2, 16, 9, 9)), RNG.standard_normal((2, 32, 9, 9))
    want = evaluate(ref, {"x": xv, "r": rv})["y"]
    ran: list[int] = []
    orig_run = pl.run

    def run(fn: Any, n: int, args: Any, parts: int, chunks: int = 0, exact: bool = False) -> None:
        ran.append(min(parts, pl.active))
        orig_run(fn, n, args, parts, chunks, exact)
    monkeypatch.setattr(pl, "run", run)
    for active in (2, 1, 1, 2):
        pl.active = active
        got = exe.run(x=xv.astype(np.float32), r=rv.astype(np.float32))["y"]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)
    assert threads == [1, 1]  # one image a piece, each a one-thread primitive made once
    assert ran == [2, 1, 1, 2]


def test_onednn_conv_openmp_team_follows_the_pools_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ROW_POOL = False`` (the A/B side): one primitive per thread count the pool runs with."""
    from rlx_cpu import parallel

    onednn_conv = _onednn()
    pl = parallel.RowPool(2)
    monkeypatch.setattr(parallel, "_POOL", pl)
    monkeypatch.setattr(onednn_conv, "ROW_POOL", False)
    threads: list[int] = []
    orig = onednn_conv._build

    def counting(*a: Any) -> Any:
        threads.append(a[11])
        return orig(*a)
    monkeypatch.setattr(onednn_conv, "_build", counting)
    graph, _ = _conv_graph("f32", SHAPES[1], "add_relu", False)
    ref, _ = _conv_graph("f64", SHAPES[1], "add_relu", False)
    exe = Session("cpu", use_cache=False).compile(graph)
    xv, rv = RNG.standard_normal((2, 16, 9, 9)), RNG.standard_normal((2, 32, 9, 9))
    want = evaluate(ref, {"x": xv, "r": rv})["y"]
    for active in (2, 1, 1, 2):
        pl.active = active
        got = exe.run(x=xv.astype(np.float32), r=rv.astype(np.float32))["y"]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)
    assert threads == [2, 1]  # one primitive per thread count, each made once


def test_onednn_conv_is_off_without_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where oneDNN cannot be loaded the im2col path runs, tails included (no hard dependency)."""
    from rlx_cpu import onednn_conv

    monkeypatch.setattr(onednn_conv, "_api", lambda: None)
    graph, _ = _conv_graph("f32", SHAPES[1], "add_relu", False)
    ref, _ = _conv_graph("f64", SHAPES[1], "add_relu", False)
    xv, rv = RNG.standard_normal((2, 16, 9, 9)), RNG.standard_normal((2, 32, 9, 9))
    got = Session("cpu", use_cache=False).compile(graph).run(x=xv.astype(np.float32), r=rv.astype(np.float32))
    np.testing.assert_allclose(got["y"], evaluate(ref, {"x": xv, "r": rv})["y"], rtol=2e-5, atol=2e-4)


def test_conv_tails_are_fused_only_where_nothing_else_reads_them() -> None:
    """A conv output also read elsewhere (here: a second graph output) keeps its own node."""
    from rlx_cpu.conv_fusion import find_conv_tails

    graph, _ = _conv_graph("f32", SHAPES[1], "add_relu", False)
    assert [len(r.members) for r in find_conv_tails(graph)] == [3]
    g = GraphBuilder("two_readers")
    x = g.input("x", "f32", (1, 2, 5, 5))
    y = g.op("conv2d_bias", x, g.param("w", np.ones((2, 2, 1, 1), np.float32)),
             g.param("b", np.zeros(2, np.float32)), strides=(1, 1), pads=(0, 0, 0, 0),
             dilations=(1, 1), groups=1)
    g.output(g.op("relu", y), "relu_out")
    g.output(y, "conv_out")
    assert find_conv_tails(g.build()) == []


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2]], ids=["s1", "s2"])
@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize(("tail", "op"), [("sig_mul", "silu"), ("hswish", "hardswish")])
def test_conv_activation_tail_matches_reference_with_nan_and_inf(
        shape: tuple, onednn: bool, tail: str, op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """conv2d_bias -> y * sigmoid(y) runs as one rlx_cpu.conv2d_bias_silu (oneDNN's swish post-op,
    or the im2col path's NumPy tail), the HardSwish chain as rlx_cpu.conv2d_bias_hardswish, NaN
    and infinite inputs included."""
    from rlx_cpu import onednn_conv

    if onednn:
        _onednn()
    else:
        monkeypatch.setattr(onednn_conv, "USE", False)
    graph, _ = _conv_graph("f32", shape, tail, False)
    ref, _ = _conv_graph("f64", shape, tail, False)
    exe = Session("cpu", use_cache=False).compile(graph)
    assert f"cpu.rlx_cpu.conv2d_bias_{op}" in exe.report.to_text()
    n, c, s = shape[:3]
    xv = RNG.standard_normal((n, c, s, s)) * 4
    xv[0, 0, 1, 1], xv[-1, -1, 2, 3] = np.nan, np.inf
    got = exe.run(x=xv.astype(np.float32))["y"]
    want = evaluate(ref, {"x": xv})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)
    assert np.isnan(got).any() and (got < 0).any()


@pytest.mark.parametrize(("hw", "k", "pad", "dil", "stride"), [
    (4, 3, 12, 12, 1),    # DeepLabV3's ASPP on a 4x4 map: only the centre tap reads the input
    (4, 3, 36, 36, 1),
    (5, 5, 6, 3, 1),      # the outer ring of a 5x5 is dead, the inner 3x3 live
    (4, 3, 4, 4, 2),      # strided: the crop keeps each output where it was (end pad rounded up)
    (7, 3, 1, 1, 1),      # every tap live: nothing cropped
])
def test_dead_taps_are_cropped_with_the_same_result(hw: int, k: int, pad: int, dil: int, stride: int) -> None:
    """A constant conv's taps that only ever read padding are dropped (rlx_cpu.conv.crop_dead_taps);
    the outputs stay those of the full conv, and a NaN in a dead tap keeps the full conv (the
    definition multiplies it by the padding: NaN everywhere it reads)."""
    from rlx_cpu import conv

    w = RNG.standard_normal((8, 6, k, k)).astype(np.float32)
    ho = (hw + 2 * pad - dil * (k - 1) - 1) // stride + 1
    for bad in (False, True):
        wv = w.copy()
        if bad:
            wv[0, 0, 0, 0] = np.nan  # a corner tap: dead in every case but the last
        ro = wv.copy()
        ro.flags.writeable = False
        crop = conv.crop_dead_taps((1, 6, hw, hw), ro, (1, 8, ho, ho), (stride, stride), (pad,) * 4,
                                   (dil, dil))
        if hw == 7 or bad:
            assert crop is None
            continue
        assert crop is not None and crop[0].shape[2] < k and not crop[0].flags.writeable
        g = GraphBuilder("dil")
        x = g.input("x", "f32", (1, 6, hw, hw))
        g.output(g.op("conv2d", x, g.param("w", wv, "f32"), strides=(stride, stride), pads=(pad,) * 4,
                      dilations=(dil, dil), groups=1), "y")
        graph = g.build()
        xv = RNG.standard_normal((1, 6, hw, hw)).astype(np.float32)
        got = Session("cpu", use_cache=False).compile(graph).run(x=xv)["y"]
        ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
        assert got.shape == ref.shape == (1, 8, ho, ho)
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-4)


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("mode", ["team", "pieces", "nan_weight", "escape"])
def test_conv_writes_channels_last_for_its_transpose(dt: str, mode: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """conv2d_bias -> transpose(0, 2, 3, 1) is one rlx_cpu.conv2d_bias_nhwc whose kernels write the
    NHWC buffer through its strides (oneDNN on a team or in pieces, im2col for f64 or NaN weights);
    a conv whose output is read elsewhere too keeps its transpose."""
    if mode == "pieces":
        monkeypatch.setenv("RLX_CPU_CONV_OPENMP", "0")
    w = RNG.standard_normal((12, 1, 7, 7)) * 0.2
    if mode == "nan_weight":
        w[3, 0, 0, 0] = np.nan  # multiplied by the padding: NaN at that channel's edges
    g = GraphBuilder("nhwc")
    x = g.input("x", dt, (2, 12, 9, 10))
    y = g.op("conv2d_bias", x, g.param("w", w, dt), g.param("b", RNG.standard_normal(12), dt), strides=(1, 1),
             pads=(3, 3, 3, 3), dilations=(1, 1), groups=12)
    g.output(g.op("transpose", y, perm=(0, 2, 3, 1)), "y")
    if mode == "escape":
        g.output(y, "nchw")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    xv = RNG.standard_normal((2, 12, 9, 10)).astype(graph.inputs[0].type.dtype.np)
    got = exe.run(x=xv)
    ref = evaluate(graph, {"x": xv.astype(np.float64)})
    for k, v in ref.items():
        assert got[k].shape == v.shape
        assert np.array_equal(np.isnan(got[k]), np.isnan(v))
        ok = ~np.isnan(v)
        np.testing.assert_allclose(got[k][ok], v[ok], rtol=2e-5, atol=2e-5)
    kernels = [k.kernel for k in exe.program({}).kernels]
    assert ("cpu.rlx_cpu.conv2d_bias_nhwc" in kernels) == (mode != "escape"), kernels
    assert ("cpu.transpose" in kernels) == (mode == "escape"), kernels
