"""How rlx-cpu's conv chains cut a conv into pieces for the row pool (``conv_chain._choose_cut``):
whole images, output rows (NHWC, one image) or output channels (the weights' share of each
piece), whichever makes a piece read the fewest bytes. Each kind is checked against the float64
reference, and the results against the earlier cuts (``CUT_CHANNELS = False``) and the uncut
convs (one thread) bit for bit: the cuts change who computes an output, never how."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

RNG = np.random.default_rng(11)
NHWC = (64, (64 * 16 * 16, 1, 16 * 64, 64), True)  # what _layout gives for a 64-channel 16x16 NHWC value
BLOCKED = (16, (64 * 16 * 16, 16 * 16 * 16, 16 * 16, 16), False)  # the same value in nChw16c


@pytest.fixture(autouse=True)
def _onednn() -> Iterator[None]:
    from rlx_cpu import onednn_conv

    if not onednn_conv.available():
        pytest.skip("oneDNN is not installed (pip install 'rlx-cpu[onednn]')")
    yield


def _conv(g: GraphBuilder, x: Any, name: str, o: int, i: int, k: int, s: int = 1, groups: int = 1,
          d: int = 1, pads: tuple[int, int, int, int] | None = None) -> Any:
    w = (RNG.standard_normal((o, i // groups, k, k)) / np.sqrt(i // groups * k * k)).astype(np.float32)
    b = (0.1 * RNG.standard_normal(o)).astype(np.float32)
    p = d * (k // 2)
    return g.op("conv2d_bias", x, g.param(name, w), g.param(name + "_b", b), strides=(s, s),
                pads=pads or (p, p, p, p), dilations=(d, d), groups=groups)


def _kernels(exe: Any, batch: int) -> list[tuple[str, Any]]:
    prog = exe.buffers({}) if not exe.graph.symbols else exe.buffers({"batch": batch})
    return list(zip(prog.kernel_names, prog.runs))


def _impls(exe: Any, batch: int) -> list[str]:
    (impls,) = [getattr(r, "onednn_impl", None) for n, r in _kernels(exe, batch) if "conv_chain" in n]
    assert impls, "the chain did not take the blocked path"
    return list(impls)


def _run(graph: Any, xv: np.ndarray, threads: int, cut_channels: bool, monkeypatch: pytest.MonkeyPatch
         ) -> tuple[np.ndarray, list[str]]:
    from rlx_cpu import conv_chain, onednn_conv, parallel

    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(threads))
    monkeypatch.setattr(conv_chain, "OPENMP", False)  # the pieces (RLX_CPU_CONV_OPENMP=0)
    monkeypatch.setattr(conv_chain, "CUT_CHANNELS", cut_channels)
    monkeypatch.setattr(onednn_conv, "MIN_MACS_PER_PIECE", 1000)  # the tests' small convs are cut too
    exe = Session("cpu", use_cache=False).compile(graph)
    got = exe.run(x=xv)["y"]
    again = exe.run(x=xv)["y"]  # the scratch and the pieces' own buffers are reused
    assert np.array_equal(got, again, equal_nan=True)
    return got, _impls(exe, xv.shape[0])


def _check(graph: Any, xv: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The chain on two threads with the new cuts: vs the float64 reference (NaN where it has NaN),
    and bit for bit vs the old cuts and vs one thread (no pieces). Its impls, for the caller."""
    got, impls = _run(graph, xv, 2, True, monkeypatch)
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert not np.isnan(ref[-1]).any()
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-4, atol=2e-4 * float(np.abs(ref[ok]).max()))
    old, _ = _run(graph, xv, 2, False, monkeypatch)
    one, one_impls = _run(graph, xv, 1, True, monkeypatch)
    assert not any(" x" in i for i in one_impls), one_impls  # one thread: no conv is cut
    assert np.array_equal(got, old, equal_nan=True)
    assert np.array_equal(got, one, equal_nan=True)
    return impls


def _weight_bound(batch: int, c: int, o: int, hw: int) -> Any:
    """Convs with many weights and few outputs (ResNet's layer3/4 at 64x64): a stride-2 conv, a
    residual block (sum post-op, then ReLU), a plain residual add, a dilated conv with uneven
    padding, a 1x1 conv."""
    g = GraphBuilder("weight_bound")
    x = g.input("x", "f32", (batch, c, hw, hw))
    y = g.op("relu", _conv(g, x, "down", o, c, 3, 2))
    h = g.op("relu", _conv(g, y, "c1", o, o, 3))
    y = g.op("relu", _conv(g, h, "c2", o, o, 3) + y)
    y = _conv(g, y, "c3", o, o, 3) + y
    y = g.op("relu", _conv(g, y, "dil", o, o, 3, d=2, pads=(2, 1, 2, 3)))
    g.output(g.op("relu", _conv(g, y, "pw", o, o, 1)), "y")
    return g.build()


@pytest.mark.parametrize(("batch", "c", "o"), [(1, 96, 128), (1, 64, 40), (1, 80, 72), (3, 96, 128)])
def test_weight_bound_convs_are_cut_by_output_channels(batch: int, c: int, o: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each piece reads only its channels' weights; odd channel counts give unequal pieces of
    whole 16-channel blocks; at batch 3 a channel piece holds every image. NaN and Inf go through
    the pieces (and their own output buffers) as the reference has them."""
    xv = RNG.standard_normal((batch, c, 6, 6)).astype(np.float32)
    if batch > 1:  # image 0 only: NaN and Inf reach every output of their image through the convs
        xv[0, 3, 1, 2] = np.nan
        xv[0, 5, 4, 4] = np.inf
    impls = _check(_weight_bound(batch, c, o, 6), xv, monkeypatch)
    convs = [i for i in impls if "max_pool" not in i and "numpy" not in i]
    assert sum(" channels x2" in i for i in convs) >= 4, impls
    assert all(i.startswith(("brg", "jit")) for i in convs), impls  # never oneDNN's reference conv


def test_activation_bound_convs_keep_rows_and_images(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small weights, big activations (ResNet's layer1): output rows at batch 1 (each piece reads
    its input rows and the halo), whole images at batch 3; strided, dilated, grouped convs too."""
    def net(batch: int) -> Any:
        g = GraphBuilder("activation_bound")
        x = g.input("x", "f32", (batch, 32, 28, 28))
        h = g.op("relu", _conv(g, x, "c1", 32, 32, 3))
        y = g.op("relu", _conv(g, h, "c2", 32, 32, 3) + x)
        y = g.op("relu", _conv(g, y, "dw", 32, 32, 3, groups=32))
        y = g.op("relu", _conv(g, y, "dil", 32, 32, 3, d=2))
        g.output(g.op("relu", _conv(g, y, "s2", 48, 32, 3, 2)), "y")
        return g.build()

    for batch, kind in ((1, "rows"), (3, "images")):
        xv = RNG.standard_normal((batch, 32, 28, 28)).astype(np.float32)
        if batch > 1:
            xv[0, 2, 9, 9] = np.nan
        impls = _check(net(batch), xv, monkeypatch)
        cut = [i for i in impls if " x" in i]
        assert len(cut) >= 4 and all(f" {kind} x" in i for i in cut), impls


def test_blocked_layout_cuts_channel_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stem-like conv (3 input channels, 7x7, stride 2) writes nChw16c: its pieces are whole
    channel blocks (contiguous in that layout) at batch 1, whole images at batch 3."""
    for batch, kind in ((1, "channels"), (3, "images")):
        g = GraphBuilder("stem")
        x = g.input("x", "f32", (batch, 3, 33, 35))
        y = g.op("relu", _conv(g, x, "stem", 48, 3, 7, 2))
        y = g.op("max_pool2d", y, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
        g.output(g.op("relu", _conv(g, y, "c1", 48, 48, 3)), "y")
        graph = g.build()
        xv = RNG.standard_normal((batch, 3, 33, 35)).astype(np.float32)
        impls = _check(graph, xv, monkeypatch)
        assert impls[0].startswith("jit") and f" {kind} x" in impls[0], impls


def test_choose_cut_by_bytes() -> None:
    """The chooser alone: the cheaper way first, then the others to fall back on; the old cuts
    with CUT_CHANNELS off; never more pieces than threads or work allow."""
    from rlx_cpu import conv_chain

    geo = (3, 1, 1, 1)  # 3x3, stride 1, pad 1, no dilation
    # ResNet layer4 at batch 1: 9.4 MB of weights, 2x2 outputs: channels, then rows
    nhwc4 = (512, (2 * 2 * 512, 1, 2 * 512, 512), True)
    ways = conv_chain._choose_cut((1, 512, 2, 2), (1, 512, 2, 2), 512 * 512 * 9, 1, True, 2, 9, nhwc4,
                                  nhwc4, geo)
    assert [k for k, _ in ways] == ["channels", "rows"]
    assert ways[0][1] == [(0, 1, 0, 256, 0, 2), (0, 1, 256, 512, 0, 2)]
    # layer1 at batch 1 (64 channels, 16x16): rows, then channels
    ways = conv_chain._choose_cut((1, 64, 16, 16), (1, 64, 16, 16), 64 * 64 * 9, 1, False, 2, 37, NHWC,
                                  NHWC, geo)
    assert [k for k, _ in ways] == ["rows", "channels"]
    assert ways[0][1] == [(0, 1, 0, 64, 0, 8), (0, 1, 0, 64, 8, 16)]
    # batch 8: whole images (up to two pieces a thread)
    ways = conv_chain._choose_cut((8, 64, 16, 16), (8, 64, 16, 16), 64 * 64 * 9, 1, False, 2, 300, NHWC,
                                  NHWC, geo)
    assert ways[0] == ("images", [(0, 2, 0, 64, 0, 16), (2, 4, 0, 64, 0, 16), (4, 6, 0, 64, 0, 16),
                                  (6, 8, 0, 64, 0, 16)])
    # groups: never by channels (a piece would need its groups' input channels only)
    ways = conv_chain._choose_cut((1, 64, 16, 16), (1, 64, 16, 16), 64 * 9, 64, False, 2, 37, NHWC, NHWC,
                                  geo)
    assert [k for k, _ in ways] == ["rows"]
    # nChw16c at batch 1 with 40 channels: blocks 0:16 and 16:40 (the old cut: equal halves only)
    blk40 = (16, (48 * 256, 16 * 256, 16 * 16, 16), False)
    ways = conv_chain._choose_cut((1, 40, 16, 16), (1, 3, 32, 32), 40 * 3 * 9, 1, False, 2, 9, BLOCKED,
                                  blk40, geo)
    assert ways == [("channels", [(0, 1, 0, 16, 0, 16), (0, 1, 16, 40, 0, 16)])]
    # nChw16c with several images: a channel slice of it is not one dense block, so images only
    blk512 = (16, (512 * 4, 4 * 16, 2 * 16, 16), False)
    ways = conv_chain._choose_cut((3, 512, 2, 2), (3, 512, 2, 2), 512 * 512 * 9, 1, False, 2, 9, blk512,
                                  blk512, geo)
    assert [k for k, _ in ways] == ["images"]
    assert conv_chain._choose_cut((1, 64, 16, 16), (1, 64, 16, 16), 64 * 64 * 9, 1, False, 2, 1, NHWC,
                                  NHWC, geo) == []  # too little work for two pieces


def test_old_cuts_with_the_flag_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import conv_chain

    monkeypatch.setattr(conv_chain, "CUT_CHANNELS", False)
    nhwc4 = (512, (2 * 2 * 512, 1, 2 * 512, 512), True)
    ways = conv_chain._choose_cut((1, 512, 2, 2), (1, 512, 2, 2), 512 * 512 * 9, 1, True, 2, 9, nhwc4,
                                  nhwc4, (3, 1, 1, 1))
    assert [k for k, _ in ways] == ["rows"]
    ways = conv_chain._choose_cut((1, 64, 16, 16), (1, 64, 16, 16), 64 * 64 * 9, 1, False, 2, 37, BLOCKED,
                                  BLOCKED, (3, 1, 1, 1))
    assert ways == [("channels", [(0, 1, 0, 32, 0, 16), (0, 1, 32, 64, 0, 16)])]
    blk40 = (16, (48 * 256, 16 * 256, 16 * 16, 16), False)
    assert conv_chain._choose_cut((1, 40, 16, 16), (1, 3, 32, 32), 40 * 27, 1, False, 2, 9, BLOCKED, blk40,
                                  (3, 1, 1, 1)) == []  # 40 channels: no equal halves of whole blocks
