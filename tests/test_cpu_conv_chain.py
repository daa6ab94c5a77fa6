"""rlx-cpu conv chains (``rlx_cpu.conv_chain``): runs of convs, their fused tails and max pools
become one node whose kernel keeps the activations in oneDNN's blocked layout between convs.
Checked against the float64 reference (NaN/Inf included), the per-op path, and the fusion
rule's boundaries (a value read outside ends a chain)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _onednn() -> Iterator[None]:
    from rlx_cpu import onednn_conv

    if not onednn_conv.available():
        pytest.skip("oneDNN is not installed (pip install 'rlx-cpu[onednn]')")
    yield


def _w(g: GraphBuilder, name: str, o: int, i: int, k: int) -> tuple[Any, Any]:
    w = (RNG.standard_normal((o, i, k, k)) / np.sqrt(i * k * k)).astype(np.float32)
    return g.param(name, w), g.param(name + "_b", (0.1 * RNG.standard_normal(o)).astype(np.float32))


def _conv(g: GraphBuilder, x: Any, name: str, o: int, i: int, k: int, s: int = 1, groups: int = 1) -> Any:
    w, b = _w(g, name, o, i // groups, k)
    p = k // 2
    return g.op("conv2d_bias", x, w, b, strides=(s, s), pads=(p, p, p, p), dilations=(1, 1), groups=groups)


def _net(batch: int, escape: bool = False) -> Any:
    """A small ResNet/MobileNet mix: stem, max pool, basic blocks (identity and 1x1-downsample
    residuals), channels that are not a multiple of 16, depthwise, SiLU and HardSwish tails."""
    g = GraphBuilder("chain_net")
    x = g.input("x", "f32", (batch, 3, 29, 31))
    y = g.op("relu", _conv(g, x, "stem", 32, 3, 7, 2))
    y = g.op("max_pool2d", y, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    h = g.op("relu", _conv(g, y, "b1c1", 32, 32, 3))
    y = g.op("relu", _conv(g, h, "b1c2", 32, 32, 3) + y)
    down = _conv(g, y, "b2d", 24, 32, 1, 2)
    h = g.op("relu", _conv(g, y, "b2c1", 24, 32, 3, 2))
    y = g.op("relu", _conv(g, h, "b2c2", 24, 24, 3) + down)
    y = g.op("silu", _conv(g, y, "dw", 24, 24, 3, groups=24))
    z = _conv(g, y, "hs", 40, 24, 1)
    t = g.op("minimum", g.op("maximum", z * g.const(1 / 6, "f32") + g.const(0.5, "f32"), g.const(0.0, "f32")),
             g.const(1.0, "f32"))
    y = z * t
    if escape:
        g.output(g.op("reduce_mean", h, axes=(2, 3), keepdims=False), "side")
    y = g.op("relu", _conv(g, y, "last", 16, 40, 3))
    g.output(y, "y")
    return g.build()


def _reference_and_decomposition(graph: Any, node: Any, xv: np.ndarray
                                 ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The chain node's float64 reference on ``xv``, its decomposition's result on ``xv`` and the
    ops it decomposes to."""
    from rlx_core.plugin import REGISTRY

    schema = REGISTRY.get("rlx_cpu.conv_chain")
    ins = [xv] + [np.asarray(graph.weights[v], np.float64) for v in node.inputs[1:]]
    (got,) = schema.reference(ins, node.attrs)
    d = GraphBuilder("decomposed")
    ts = [d.input("x", "f32", xv.shape)] + [d.param(f"p{k}", np.asarray(graph.weights[v]))
                                            for k, v in enumerate(node.inputs[1:])]
    assert schema.decompose is not None
    (out,) = schema.decompose(d, ts, node.attrs)
    d.output(out, "y")
    built = d.build()
    return got, evaluate(built, {"x": xv})["y"], [n.op for n in built.nodes]


def _kernels(exe: Any, batch: int) -> list[tuple[str, Any]]:
    prog = exe.buffers({}) if not exe.graph.symbols else exe.buffers({"batch": batch})
    return list(zip(prog.kernel_names, prog.runs))


@pytest.mark.parametrize("team", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3])
def test_chain_matches_reference(batch: int, threads: int, team: bool,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Each conv on an OpenMP team (the default) and as one-thread pieces on the row pool."""
    from rlx_cpu import conv_chain, parallel

    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(threads))
    monkeypatch.setattr(conv_chain, "OPENMP", team)
    graph = _net(batch)
    exe = Session("cpu", use_cache=False).compile(graph)
    xv = RNG.standard_normal((batch, 3, 29, 31)).astype(np.float32)
    if batch > 1:  # NaN and Inf through the convs, the pool (NaN wins) and the tails of image 0
        xv[0, 1, 4, 5] = np.nan
        xv[0, 0, 20, 7] = np.inf
    got = exe.run(x=xv)["y"]
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert not np.isnan(ref[-1]).any()
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-4, atol=2e-4 * float(np.abs(ref[ok]).max()))
    chains = [r for n, r in _kernels(exe, batch) if n == "cpu.rlx_cpu.conv_chain"]
    assert len(chains) == 1  # the whole body is one chain ...
    assert getattr(chains[0], "onednn_impl", None)  # ... on the blocked path


def test_team_follows_the_load_with_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """With other processes on a core the pool's probe lowers ``active``: the chain then runs
    primitives made for that many OpenMP threads (once, kept), and the results keep every bit;
    ``RLX_CPU_CONV_OPENMP=0`` goes back to the row pool's pieces."""
    from rlx_cpu import conv_chain, parallel

    pool = parallel.RowPool(2)
    monkeypatch.setattr(parallel, "_POOL", pool)
    monkeypatch.setattr(pool, "poll", lambda: None)  # the test sets the load, not /proc/stat
    made: list[tuple[int, bool]] = []  # (threads, the finite variant?)

    class Counted(conv_chain._Blocked):
        def __init__(self, api: Any, ins: Any, o: Any, steps: Any, threads: int, *a: Any, **k: Any) -> None:
            made.append((threads, k.get("finite") is not None))
            super().__init__(api, ins, o, steps, threads, *a, **k)

    monkeypatch.setattr(conv_chain, "_Blocked", Counted)
    graph = _net(3)
    xv = RNG.standard_normal((3, 3, 29, 31)).astype(np.float32)
    xv[0, 1, 4, 5] = np.nan
    exe = Session("cpu", use_cache=False).compile(graph)
    runs = []
    for active in (2, 1, 1, 2):
        pool.active = active
        runs.append(exe.run(x=xv)["y"].copy())
    # The finite variant (oneDNN's max pool) for all threads at bind time; a NaN in the input runs
    # the exact one: one variant per thread count, made on first need.
    assert made == [(2, True), (2, False), (1, False)], made
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])
    xf = RNG.standard_normal((3, 3, 29, 31)).astype(np.float32)
    finite = []
    for active in (2, 1):
        pool.active = active
        finite.append(exe.run(x=xf)["y"].copy())
    assert made[3:] == [(1, True)], made
    np.testing.assert_array_equal(finite[0], finite[1])
    want = evaluate(graph, {"x": xf.astype(np.float64)})["y"]
    np.testing.assert_allclose(finite[0], want, rtol=2e-4, atol=2e-4 * float(np.abs(want).max()))
    monkeypatch.setenv("RLX_CPU_CONV_OPENMP", "0")
    made.clear()
    pieces = Session("cpu", use_cache=False).compile(graph).run(x=xv)["y"]
    assert made == [(1, False)], made  # one-thread primitives, cut for the pool
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    ok = ~np.isnan(ref)
    assert np.array_equal(np.isnan(pieces), ~ok)
    np.testing.assert_allclose(pieces[ok], ref[ok], rtol=2e-4, atol=2e-4 * float(np.abs(ref[ok]).max()))


@pytest.mark.parametrize("solo", [True, False])
def test_tiny_chain_runs_on_the_calling_thread(solo: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below SOLO_MACS a chain's primitives are made for one thread whatever the pool has (no
    OpenMP region a primitive); the bits are the team's (oneDNN's split does not change them)."""
    from rlx_cpu import conv_chain, parallel

    pool = parallel.RowPool(2)
    monkeypatch.setattr(parallel, "_POOL", pool)
    monkeypatch.setattr(pool, "poll", lambda: None)
    made: list[int] = []

    class Counted(conv_chain._Blocked):
        def __init__(self, api: Any, ins: Any, o: Any, steps: Any, threads: int, *a: Any, **k: Any) -> None:
            made.append(threads)
            super().__init__(api, ins, o, steps, threads, *a, **k)

    monkeypatch.setattr(conv_chain, "_Blocked", Counted)
    graph = _net(1)
    xv = RNG.standard_normal((1, 3, 29, 31)).astype(np.float32)
    monkeypatch.setattr(conv_chain, "SOLO_MACS", 0)
    team = Session("cpu", use_cache=False).compile(graph).run(x=xv)["y"]
    assert made and set(made) == {2}, made
    monkeypatch.setattr(conv_chain, "SOLO_MACS", 10**12 if solo else 1)
    made.clear()
    got = Session("cpu", use_cache=False).compile(graph).run(x=xv)["y"]
    assert set(made) == ({1} if solo else {2}), made
    np.testing.assert_array_equal(got, team)


def test_per_op_switch_gives_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_cpu import conv_chain

    graph = _net(2)
    xv = RNG.standard_normal((2, 3, 29, 31)).astype(np.float32)
    fast = Session("cpu", use_cache=False).compile(graph).run(x=xv)["y"]
    monkeypatch.setattr(conv_chain, "USE", False)
    exe = Session("cpu", use_cache=False).compile(graph)
    slow = exe.run(x=xv)["y"]
    assert not any(getattr(r, "onednn_impl", None) for n, r in _kernels(exe, 2) if "conv_chain" in n)
    np.testing.assert_allclose(fast, slow, rtol=1e-4, atol=1e-4 * float(np.abs(slow).max()))


def test_a_value_read_outside_ends_the_chain() -> None:
    graph = _net(1, escape=True)
    exe = Session("cpu", use_cache=False).compile(graph)
    xv = RNG.standard_normal((1, 3, 29, 31)).astype(np.float32)
    out = exe.run(x=xv)
    ref = evaluate(graph, {"x": xv.astype(np.float64)})
    for k in ("y", "side"):
        np.testing.assert_allclose(out[k], ref[k], rtol=2e-4, atol=2e-4 * float(np.abs(ref[k]).max()))
    names = [n for n, _ in _kernels(exe, 1)]
    assert names.count("cpu.rlx_cpu.conv_chain") == 2  # cut after the conv whose output escapes


def test_fed_weights_and_nan_weights() -> None:
    """The op with fed weights (the conformance suite's form: one conv, no ``steps``) packs them
    every run; NaN weights with padding take the per-op path (oneDNN would skip the padding)."""
    g = GraphBuilder("fed")
    x = g.input("x", "f32", (1, 16, 6, 6))
    w = g.input("w", "f32", (32, 16, 3, 3))
    b = g.input("b", "f32", (32,))
    g.output(g.op("rlx_cpu.conv_chain", x, w, b, pads=(1, 1, 1, 1)), "y")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    feeds = {"x": RNG.standard_normal((1, 16, 6, 6)).astype(np.float32),
             "w": RNG.standard_normal((32, 16, 3, 3)).astype(np.float32),
             "b": RNG.standard_normal(32).astype(np.float32)}
    for poison in (False, True, False):
        if poison:
            feeds["w"] = feeds["w"].copy()
            feeds["w"][3, 2, 0, 0] = np.nan
        got = exe.run(**feeds)["y"]
        ref = evaluate(graph, {k: v.astype(np.float64) for k, v in feeds.items()})["y"]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.nanmax(np.abs(ref))))
        assert np.array_equal(np.isnan(got), np.isnan(ref))


@pytest.mark.parametrize("channels", [16, 20, 3])
def test_pool_in_blocked_layout_nan_wins(channels: int) -> None:
    """conv 1x1 -> max_pool2d: the pool runs on the conv's blocked output (padded channel lanes
    for 20; plain for 3 channels' layout if oneDNN picks it); a NaN pixel wins its windows,
    padding never does, -inf stays."""
    g = GraphBuilder("pool_chain")
    x = g.input("x", "f32", (2, channels, 9, 8))
    w = np.eye(channels, dtype=np.float32).reshape(channels, channels, 1, 1)
    y = g.op("conv2d_bias", x, g.param("w", w), g.param("b", np.zeros(channels, np.float32)),
             strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1)
    g.output(g.op("max_pool2d", y, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), "y")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    assert [n for n, _ in _kernels(exe, 2)] == ["cpu.rlx_cpu.conv_chain"]
    xv = RNG.standard_normal((2, channels, 9, 8)).astype(np.float32)
    xv[0, 0, 3, 3] = np.nan
    xv[1, -1, 0, 0] = -np.inf
    xv[1, -1, 0, 1] = xv[1, -1, 1, 0] = xv[1, -1, 1, 1] = -np.inf
    got = exe.run(x=xv)["y"]
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    assert np.isnan(got[0, 0, 1:3, 1:3]).all() and np.isneginf(got[1, -1, 0, 0])
    np.testing.assert_array_equal(got, ref.astype(np.float32))


def test_bottleneck_ending_in_a_residual_on_plain_layout() -> None:
    """A ResNet-50 bottleneck on 512 channels at 8x8: oneDNN picks its GEMM convs on plain NCHW, so
    the last conv writes the program's output directly and its residual must be put there first
    (RetinaNet's backbone gave wrong numbers before that)."""
    g = GraphBuilder("bottleneck")
    x = g.input("x", "f32", (1, 512, 8, 8))
    h = g.op("relu", _conv(g, x, "c1", 256, 512, 1))
    h = g.op("relu", _conv(g, h, "c2", 256, 256, 3, 2))
    down = _conv(g, x, "down", 1024, 512, 1, 2)
    g.output(g.op("relu", _conv(g, h, "c3", 1024, 256, 1) + down), "y")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    assert [n for n, _ in _kernels(exe, 1)] == ["cpu.rlx_cpu.conv_chain"]
    xv = RNG.standard_normal((1, 512, 8, 8)).astype(np.float32)
    got = exe.run(x=xv)["y"]
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4 * float(np.abs(ref).max()))


@pytest.mark.parametrize("batch", [1, 4])
def test_convs_cut_into_pieces_for_the_row_pool(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Big convs run as one-thread primitives on pieces the pool's threads take in turn: output
    channel blocks of the one image (every piece reads the whole blocked input; the residual is
    added in place, piece by piece) or whole images."""
    from rlx_cpu import conv_chain, parallel

    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(2))
    monkeypatch.setattr(conv_chain, "OPENMP", False)
    g = GraphBuilder("pieces")
    x = g.input("x", "f32", (batch, 64, 24, 24))
    h = g.op("relu", _conv(g, x, "c1", 64, 64, 3))
    h = g.op("relu", _conv(g, h, "c2", 64, 64, 3) + x)
    g.output(g.op("relu", _conv(g, h, "c3", 128, 64, 1, 2)), "y")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    (impls,) = [getattr(r, "onednn_impl", None) for n, r in _kernels(exe, batch) if "conv_chain" in n]
    assert impls is not None and all(i.endswith((" x2", " x4")) for i in impls[:2]), impls
    xv = RNG.standard_normal((batch, 64, 24, 24)).astype(np.float32)
    for _ in range(2):
        got = exe.run(x=xv)["y"]
        ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
        np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4 * float(np.abs(ref).max()))
        xv = xv[::-1].copy()


def _relu6(g: GraphBuilder, y: Any) -> Any:
    """ONNX Clip(0, 6) as the importer writes it."""
    return g.op("minimum", g.op("maximum", y, g.const(0.0, "f32")), g.const(6.0, "f32"))


def _inverted_residual(g: GraphBuilder, x: Any, name: str, c: int, e: int) -> Any:
    """MobileNetV2's block: 1x1 expand + ReLU6, depthwise 3x3 + ReLU6, 1x1 project, + x."""
    h = _relu6(g, _conv(g, x, name + "e", c * e, c, 1))
    h = _relu6(g, _conv(g, h, name + "d", c * e, c * e, 3, groups=c * e))
    return _conv(g, h, name + "p", c, c * e, 1) + x


def _mobilenet(batch: int, c: int = 24) -> Any:
    g = GraphBuilder("inverted_residual")
    x = g.input("x", "f32", (batch, 3, 21, 19))
    y = _relu6(g, _conv(g, x, "stem", c, 3, 3, 2))
    y = _inverted_residual(g, y, "b1", c, 6)
    y = _inverted_residual(g, y, "b2", c, 6)
    g.output(y, "y")
    return g.build()


@pytest.mark.parametrize("c", [24, 16])
@pytest.mark.parametrize("batch", [1, 2])
def test_inverted_residual_blocks_are_one_chain(batch: int, c: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """ReLU6 (maximum 0, minimum 6) and the residual add without activation are chain steps: the
    stem and two whole inverted residual blocks are one chain on the blocked path, equal to the
    float64 reference and to the per-op path. Each ReLU6 is its conv's clip post-op while the input
    is finite; an input holding NaN or Inf runs the exact variant (one NumPy pass a ReLU6), where
    they propagate through the clips as the IR's do, and the next finite input the fused one."""
    from rlx_cpu import conv_chain, parallel

    pool = parallel.RowPool(2)
    monkeypatch.setattr(parallel, "_POOL", pool)
    monkeypatch.setattr(pool, "poll", lambda: None)  # all threads whatever the machine's load
    graph = _mobilenet(batch, c)
    exe = Session("cpu", use_cache=False).compile(graph)
    kernels = _kernels(exe, batch)
    assert [n for n, _ in kernels] == ["cpu.rlx_cpu.conv_chain"]
    impls = getattr(kernels[0][1], "onednn_impl", None)
    assert impls and "clip:numpy" not in impls and len(impls) == 7, impls  # 7 convs, clips fused
    made: list[bool] = []  # variants made from here on: fused?
    orig = conv_chain._Blocked.__init__

    def counting(self: Any, *a: Any, **k: Any) -> None:
        made.append(bool(k.get("finite")))
        orig(self, *a, **k)
    monkeypatch.setattr(conv_chain._Blocked, "__init__", counting)
    xf = 3 * RNG.standard_normal((batch, 3, 21, 19)).astype(np.float32)
    fused = exe.run(x=xf)["y"]
    ref = evaluate(graph, {"x": xf.astype(np.float64)})["y"]
    np.testing.assert_allclose(fused, ref, rtol=2e-4, atol=2e-4 * float(np.abs(ref).max()))
    assert made == []  # the finite variant ran
    xv = xf.copy()
    xv[0, 1, 4, 5] = np.nan
    xv[-1, 0, 12, 7] = np.inf
    got = exe.run(x=xv)["y"]
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    assert np.isnan(ref).any() and np.array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-4, atol=2e-4 * float(np.abs(ref[ok]).max()))
    assert made == [False]  # the exact variant, made on the first input holding NaN/Inf
    again = exe.run(x=xf)["y"]
    assert made == [False]
    np.testing.assert_array_equal(again, fused)  # finite again: the finite variant, same bits
    monkeypatch.setattr(conv_chain, "USE", False)
    slow = Session("cpu", use_cache=False).compile(graph).run(x=xv)["y"]
    assert np.array_equal(np.isnan(got), np.isnan(slow))
    np.testing.assert_allclose(got[ok], slow[ok], rtol=1e-4, atol=1e-4 * float(np.abs(slow[ok]).max()))


def test_clips_stay_numpy_passes_where_a_value_could_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """No finite variant where its bound check fails: weights whose row sums could carry an input
    below 1.9e19 past 1e30 (an overflow would make Inf, then NaN, that the clip post-op would
    hide), weights fed at run time, or ``FUSE_CLIPS`` off; each ReLU6 is then a NumPy pass."""
    from rlx_cpu import conv_chain

    def clips(graph: Any) -> int:
        exe = Session("cpu", use_cache=False).compile(graph)
        (impls,) = [getattr(r, "onednn_impl", None) for n, r in _kernels(exe, 1) if "conv_chain" in n]
        assert impls is not None
        return int(impls.count("clip:numpy"))

    assert clips(_mobilenet(1)) == 0
    g = GraphBuilder("huge")
    x = g.input("x", "f32", (1, 16, 9, 9))
    y = _relu6(g, g.op("conv2d_bias", x, g.param("w", np.full((16, 16, 3, 3), 1e9, np.float32)),
                       g.param("b", np.zeros(16, np.float32)), strides=(1, 1), pads=(1, 1, 1, 1),
                       dilations=(1, 1), groups=1))
    y = _relu6(g, _conv(g, y, "c2", 16, 16, 1))
    g.output(y, "y")
    assert clips(g.build()) == 2  # 1.9e19 * 1.44e11 > 1e30: no fused variant
    # The op with fed weights (a chain the fusion rule never makes: its convs' weights are
    # constants) and the steps conv, ReLU6, conv, ReLU6.
    conv = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "groups": 1}
    steps = [{"op": "conv2d_bias", "src": 0, "w": 1, "b": 2, "res": None, "attrs": conv},
             {"op": "maximum", "src": 1, "res": None, "c": 0.0, "attrs": {}},
             {"op": "minimum", "src": 2, "res": None, "c": 6.0, "attrs": {}},
             {"op": "conv2d_bias", "src": 3, "w": 3, "b": 4, "res": None, "attrs": conv},
             {"op": "maximum", "src": 4, "res": None, "c": 0.0, "attrs": {}},
             {"op": "minimum", "src": 5, "res": None, "c": 6.0, "attrs": {}}]
    g = GraphBuilder("fed")
    ins = [g.input("x", "f32", (1, 16, 9, 9))]
    for i in (1, 2):
        ins += [g.input(f"w{i}", "f32", (16, 16, 1, 1)), g.input(f"b{i}", "f32", (16,))]
    g.output(g.op("rlx_cpu.conv_chain", *ins, steps=json.dumps(steps)), "y")
    fed = g.build()
    assert clips(fed) == 2
    feeds = {"x": RNG.standard_normal((1, 16, 9, 9)).astype(np.float32)}
    for i in (1, 2):
        feeds[f"w{i}"] = RNG.standard_normal((16, 16, 1, 1)).astype(np.float32)
        feeds[f"b{i}"] = RNG.standard_normal(16).astype(np.float32)
    feeds["w2"][3, 5] = np.nan  # a NaN weight: NaN in the output, as the reference has it
    got = Session("cpu", use_cache=False).compile(fed).run(**feeds)["y"]
    ref = evaluate(fed, {k: v.astype(np.float64) for k, v in feeds.items()})["y"]
    assert np.isnan(ref).any() and np.array_equal(np.isnan(got), np.isnan(ref))
    monkeypatch.setattr(conv_chain, "FUSE_CLIPS", False)
    assert clips(_mobilenet(1)) == 5


@pytest.mark.parametrize("scale", [1.0, 1e11, 1e27])
def test_max_pool_is_onednn_in_the_finite_variant_where_the_bound_holds(scale: float) -> None:
    """A max pool after a conv is oneDNN's (in the finite variant) where the conv cannot overflow for
    the inputs the run-time check lets through: any below 1.9e19 (scale 1), or with the ReLU
    post-op in the variant a norm below the bound's limit, which must allow an RMS of
    ``RELU_RMS`` (1e11: row sums ~1e12, limit ~1e18); weights near 1e26 keep the NaN-wins pass. A
    NaN in the input wins either way (the exact variant runs)."""
    g = GraphBuilder("pool")
    x = g.input("x", "f32", (2, 16, 12, 10))
    w = (RNG.standard_normal((16, 16, 3, 3)) * scale / 12).astype(np.float32)
    y = g.op("relu", g.op("conv2d_bias", x, g.param("w", w), g.param("b", np.zeros(16, np.float32)),
                          strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), groups=1))
    y = g.op("max_pool2d", y, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    g.output(_conv(g, y, "c2", 16, 16, 1), "y")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    (impls,) = [getattr(r, "onednn_impl", None) for n, r in _kernels(exe, 2) if "conv_chain" in n]
    assert impls is not None
    assert any(i.startswith("max_pool2d:") for i in impls) == (scale > 1e20), impls
    for nan in (False, True):
        xv = RNG.standard_normal((2, 16, 12, 10)).astype(np.float32)
        if nan:
            xv[1, 3, 5, 5] = np.nan
        got = exe.run(x=xv)["y"]
        ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.isnan(ref).any() == nan
        ok = ~np.isnan(ref)
        np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-4, atol=2e-4 * float(np.abs(ref[ok]).max()))


def _relu_net(scale: float) -> Any:
    g = GraphBuilder("relus")
    x = g.input("x", "f32", (2, 16, 12, 10))
    y = x
    for i in range(2):
        w = (RNG.standard_normal((16, 16, 3, 3)) * scale).astype(np.float32)
        b = g.param(f"b{i}", np.zeros(16, np.float32))
        y = g.op("relu", g.op("conv2d_bias", y, g.param(f"w{i}", w), b, strides=(1, 1), pads=(1, 1, 1, 1),
                              dilations=(1, 1), groups=1))
        if i == 0:
            y = g.op("max_pool2d", y, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    g.output(y, "y")
    return g.build()


@pytest.mark.parametrize("scale", [0.1, 1e9])
def test_relu_post_op_in_the_finite_variant(scale: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the finite variant a conv's ReLU is oneDNN's relu post-op (NaN becomes 0: no exp per
    negative output): the same bits as the NaN-keeping form for a finite input; an input holding
    NaN, or one whose norm passes the bound's limit (weights ~1e9: row sums ~1e11, limit ~1e8; an
    input of 1e9s), runs the exact variant, where NaN propagates as the reference's does."""
    from rlx_cpu import conv_chain, parallel

    pool = parallel.RowPool(2)
    monkeypatch.setattr(parallel, "_POOL", pool)
    monkeypatch.setattr(pool, "poll", lambda: None)  # one team size whatever the machine's load
    made: list[tuple[bool, float]] = []  # variants made: (ReLU post-op, input norm limit)
    orig = conv_chain._Blocked.__init__

    def counting(self: Any, *a: Any, **k: Any) -> None:
        f = k.get("finite")
        made.append((bool(f and f.relus), f.limit if f else 0.0))
        orig(self, *a, **k)
    monkeypatch.setattr(conv_chain._Blocked, "__init__", counting)
    graph = _relu_net(scale)
    exe = Session("cpu", use_cache=False).compile(graph)
    assert [n for n, _ in _kernels(exe, 2)] == ["cpu.rlx_cpu.conv_chain"]
    assert made and all(relus for relus, _ in made), made
    limit = made[0][1]
    assert limit == conv_chain._X_MAX if scale < 1 else 1e7 < limit < 1e9
    made.clear()
    xf = RNG.standard_normal((2, 16, 12, 10)).astype(np.float32)
    got = exe.run(x=xf)["y"]
    ref = evaluate(graph, {"x": xf.astype(np.float64)})["y"]
    np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4 * float(np.abs(ref).max()))
    assert made == []  # the finite variant ran
    monkeypatch.setattr(conv_chain, "FINITE_RELU", False)
    assert np.array_equal(Session("cpu", use_cache=False).compile(graph).run(x=xf)["y"], got)
    assert made and not any(relus for relus, _ in made)
    monkeypatch.setattr(conv_chain, "FINITE_RELU", True)
    made.clear()
    for bad in ("nan", "big"):
        xv = xf.copy()
        if bad == "nan":
            xv[1, 3, 5, 5] = np.nan
        elif scale > 1:
            xv *= np.float32(1e9)  # finite, norm ~6e10: past the limit
        else:
            continue
        m = len(made)
        got = exe.run(x=xv)["y"]
        ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
        assert made[m:] in ([], [(False, 0.0)]) and made == [(False, 0.0)]  # the exact variant, once
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.isnan(ref).any() == (bad == "nan")
        ok = ~np.isnan(ref)
        np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-4, atol=2e-4 * float(np.abs(ref[ok]).max()))


def test_clip_nan_and_bounds_that_end_the_chain() -> None:
    """A clip step keeps NaN (oneDNN's clip post-op would give the lower bound); a bound that
    would turn the blocked layout's zero padding channels non-zero (maximum with 0.5) is no step:
    the chain ends before it."""
    g = GraphBuilder("clips")
    x = g.input("x", "f32", (1, 20, 7, 6))
    y = _relu6(g, _conv(g, x, "a", 20, 20, 1))
    y = g.op("maximum", _conv(g, y, "b", 20, 20, 3), g.const(-1.5, "f32"))
    y = g.op("maximum", _conv(g, y, "c", 20, 20, 1), g.const(0.5, "f32"))
    g.output(y, "y")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    names = [n for n, _ in _kernels(exe, 1)]
    assert names.count("cpu.rlx_cpu.conv_chain") == 1 and len(names) >= 2, names
    xv = RNG.standard_normal((1, 20, 7, 6)).astype(np.float32)
    xv[0, :, 2, 3] = np.nan
    got = exe.run(x=xv)["y"]
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    assert np.isnan(ref).any() and np.array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-4, atol=2e-4 * float(np.abs(ref[ok]).max()))


def test_residual_add_without_activation_is_a_step() -> None:
    """conv -> conv + x (no ReLU) -> conv: one chain (the add is the middle conv's sum post-op),
    also where the residual comes first in the add and the chain ends with the add."""
    for last in (True, False):
        g = GraphBuilder("res_add")
        x = g.input("x", "f32", (2, 32, 9, 10))
        h = g.op("relu", _conv(g, x, "a", 32, 32, 3))
        y = g.op("add", h, _conv(g, h, "b", 32, 32, 3))
        if not last:
            y = _conv(g, y, "c", 16, 32, 1)
        g.output(y, "y")
        graph = g.build()
        exe = Session("cpu", use_cache=False).compile(graph)
        assert [n for n, _ in _kernels(exe, 2)] == ["cpu.rlx_cpu.conv_chain"]
        xv = RNG.standard_normal((2, 32, 9, 10)).astype(np.float32)
        got = exe.run(x=xv)["y"]
        ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
        np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4 * float(np.abs(ref).max()))


def test_chain_with_clip_and_add_steps_decomposes() -> None:
    """Other backends decompose the chain: its reference and decomposition cover the new steps."""
    from rlx_cpu.conv_chain import find_conv_chains


    Session("cpu", use_cache=False)  # loads the plugin's ops
    graph = _mobilenet(1)
    (region,) = find_conv_chains(graph)  # no conv tails here: the rule sees the graph as built
    (node,) = region.nodes
    xv = RNG.standard_normal((1, 3, 21, 19))
    ref = evaluate(graph, {"x": xv})["y"]
    got, dec, ops = _reference_and_decomposition(graph, node, xv)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    assert ops.count("maximum") == 5 and ops.count("minimum") == 5 and ops.count("add") == 2, ops
    np.testing.assert_allclose(dec, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def _se(g: GraphBuilder, y: Any, name: str, c: int, act: str, hard: bool, mul_first: bool = True) -> Any:
    """Squeeze-excitation as torchvision exports it: global mean, 1x1 conv + act, 1x1 conv, gate
    (sigmoid, or HardSigmoid as the ONNX importer writes it), times the input."""
    m = g.op("reduce_mean", y, axes=(2, 3), keepdims=True)
    h = g.op(act, _conv(g, m, name + "f1", max(1, c // 4), c, 1))
    z = _conv(g, h, name + "f2", c, max(1, c // 4), 1)
    if hard:
        z = g.op("maximum", z * g.const(1 / 6, "f32") + g.const(0.5, "f32"), g.const(0.0, "f32"))
        z = g.op("minimum", z, g.const(1.0, "f32"))
    else:
        z = g.op("sigmoid", z)
    return g.op("mul", y, z) if mul_first else g.op("mul", z, y)


def _se_net(batch: int, c: int, act: str, hard: bool, nhwc: bool, blocks: int = 1,
            hw: tuple[int, int] = (11, 9)) -> Any:
    """nhwc: MBConv blocks (1x1 expand, depthwise, SE, 1x1 projection + residual), whose brgconv
    convs run on NHWC; else an SE right after the stem (its jit conv writes nChw16c), then a 1x1
    projection + residual."""
    g = GraphBuilder("se_net")
    x = g.input("x", "f32", (batch, 3, *hw))
    y = g.op(act, _conv(g, x, "stem", 16 if nhwc else c, 3, 3))
    for k in range(blocks if nhwc else 0):
        h = g.op(act, _conv(g, y, f"e{k}", c, 16, 1))
        h = g.op(act, _conv(g, h, f"d{k}", c, c, 3, groups=c))
        y = _conv(g, _se(g, h, f"se{k}", c, act, hard, k % 2 == 0), f"p{k}", 16, c, 1) + y
    if not nhwc:
        y = _conv(g, _se(g, y, "se", c, act, hard), "p", c, c, 1) + y
    g.output(g.op(act, _conv(g, y, "last", 24, y.type.shape[1], 3)), "y")
    return g.build()


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("nhwc", [True, False])
@pytest.mark.parametrize("act,hard", [("relu", True), ("silu", False), ("relu", False), ("silu", True)])
def test_squeeze_excitation_is_a_chain_step(act: str, hard: bool, nhwc: bool, batch: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An SE block (mean, two 1x1 FCs, sigmoid or hard-sigmoid gate, channel scale) is one step of
    the chain on its blocked buffer (37 channels: padding lanes in nChw16c), so the projection conv
    and its residual join the chain; equal to the float64 reference (a NaN makes its image's gates,
    so that whole image, NaN, as the IR's ops do), the per-op path and the chain without SE steps."""
    from rlx_cpu import conv_chain

    graph = _se_net(batch, 37, act, hard, nhwc)
    exe = Session("cpu", use_cache=False).compile(graph)
    kernels = _kernels(exe, batch)
    assert [n for n, _ in kernels] == ["cpu.rlx_cpu.conv_chain"]
    impls = getattr(kernels[0][1], "onednn_impl", None)
    assert impls and impls.count("se:numba:nhwc" if nhwc else "se:numba:blocked16") == 1, impls
    xv = 2 * RNG.standard_normal((batch, 3, 11, 9)).astype(np.float32)
    if batch > 1:
        xv[0, 1, 4, 5] = np.nan
    got = exe.run(x=xv)["y"]
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and not np.isnan(ref[-1]).any()
    assert batch == 1 or np.isnan(ref[0]).all()
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-4, atol=2e-4 * float(np.abs(ref[ok]).max()))
    for flag in ("USE", "SE"):
        with monkeypatch.context() as m:
            m.setattr(conv_chain, flag, False)
            other = Session("cpu", use_cache=False).compile(graph)
            assert flag == "USE" or len(_kernels(other, batch)) > 1  # the SE ends a chain, as before
            slow = other.run(x=xv)["y"]
        assert np.array_equal(np.isnan(got), np.isnan(slow))
        np.testing.assert_allclose(got[ok], slow[ok], rtol=1e-4, atol=1e-4 * float(np.abs(slow[ok]).max()))


def test_efficientnet_blocks_are_one_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three MBConv blocks with SE (odd channel count, multiply operands in both orders): one chain
    node with three SE steps; without SE steps every SE ends a chain and its ops run alone."""
    from rlx_cpu import conv_chain

    graph = _se_net(2, 24, "silu", False, True, blocks=3)
    exe = Session("cpu", use_cache=False).compile(graph)
    kernels = _kernels(exe, 2)
    assert [n for n, _ in kernels] == ["cpu.rlx_cpu.conv_chain"]
    assert [i for i in kernels[0][1].onednn_impl if i.startswith("se:")] == ["se:numba:nhwc"] * 3
    xv = RNG.standard_normal((2, 3, 11, 9)).astype(np.float32)
    got = exe.run(x=xv)["y"]
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4 * float(np.abs(ref).max()))
    monkeypatch.setattr(conv_chain, "SE", False)
    names = [n for n, _ in _kernels(Session("cpu", use_cache=False).compile(graph), 2)]
    assert names.count("cpu.rlx_cpu.conv_chain") >= 4 and len(names) > 10, names


@pytest.mark.parametrize("where", ["mean", "fc1", "gate"])
def test_se_whose_intermediate_is_read_outside_is_no_step(where: str) -> None:
    """An SE value that a graph output also reads (the mean, FC1's output, the gate) is no chain
    step: the SE ends the chain as before, and both outputs are right."""
    g = GraphBuilder("se_escape")
    x = g.input("x", "f32", (1, 3, 11, 9))
    y = g.op("relu", _conv(g, x, "stem", 20, 3, 3))
    m = g.op("reduce_mean", y, axes=(2, 3), keepdims=True)
    h = g.op("relu", _conv(g, m, "f1", 5, 20, 1))
    z = g.op("sigmoid", _conv(g, h, "f2", 20, 5, 1))
    y = _conv(g, g.op("mul", y, z), "p", 20, 20, 1) + y
    g.output(g.op("relu", _conv(g, y, "last", 8, 20, 3)), "y")
    g.output({"mean": m, "fc1": h, "gate": z}[where], "side")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    kernels = _kernels(exe, 1)
    assert not any(i.startswith("se:") for _, r in kernels for i in getattr(r, "onednn_impl", None) or ())
    assert len(kernels) > 1
    xv = RNG.standard_normal((1, 3, 11, 9)).astype(np.float32)
    out = exe.run(x=xv)
    ref = evaluate(graph, {"x": xv.astype(np.float64)})
    for k in ("y", "side"):
        np.testing.assert_allclose(out[k], ref[k], rtol=2e-4, atol=2e-4 * float(np.abs(ref[k]).max()))


@pytest.mark.parametrize("hard", [False, True])
def test_chain_with_se_steps_decomposes(hard: bool) -> None:
    """The chain's reference and decomposition give the SE's original ops (FC1 with its fused
    activation, the gate's ops, the multiply), NaN included."""
    from rlx_cpu.conv_chain import find_conv_chains


    Session("cpu", use_cache=False)  # loads the plugin's ops
    g = GraphBuilder("se_fused")
    x = g.input("x", "f32", (2, 3, 9, 8))
    one = {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "groups": 1}
    y = g.op("rlx_cpu.conv2d_bias_relu", x, *_w(g, "stem", 20, 3, 1), **one)  # the rule sees fused tails
    m = g.op("reduce_mean", y, axes=(2, 3), keepdims=True)
    h = g.op("rlx_cpu.conv2d_bias_silu", m, *_w(g, "f1", 5, 20, 1), **one)
    z = g.op("conv2d_bias", h, *_w(g, "f2", 20, 5, 1), **one)
    if hard:
        z = g.op("maximum", z * g.const(0.2, "f32") + g.const(0.5, "f32"), g.const(0.0, "f32"))
        z = g.op("minimum", z, g.const(1.0, "f32"))
    else:
        z = g.op("sigmoid", z)
    y = _conv(g, g.op("mul", z, y), "p", 8, 20, 3)
    g.output(g.op("reduce_mean", y, axes=(2, 3), keepdims=False), "y")  # a global mean ends it
    graph = g.build()
    (region,) = find_conv_chains(graph)
    (node,) = region.nodes
    assert '"op":"se"' in str(node.attrs["steps"])
    xv = RNG.standard_normal((2, 3, 9, 8))
    xv[1, 0, 2, 2] = np.nan
    ref = evaluate(graph, {"x": xv})["y"]
    got, dec, ops = _reference_and_decomposition(graph, node, xv)
    assert np.isnan(ref[1]).all() and not np.isnan(ref[0]).any()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.nanmax(np.abs(ref))))
    assert ops.count("reduce_mean") == 2 and "rlx_cpu.conv2d_bias_silu" in ops
    assert ops.count("mul") == 1 + hard
    assert ops.count("sigmoid") == (not hard) and ops.count("maximum") == hard, ops
    np.testing.assert_allclose(dec, ref, rtol=1e-5, atol=1e-5 * float(np.nanmax(np.abs(ref))))


def test_se_images_cut_for_the_row_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A big SE step's images are cut for the pool's threads: the same bits as on one thread."""
    from rlx_cpu import conv_chain, parallel

    monkeypatch.setattr(conv_chain, "OPENMP", False)

    graph = _se_net(4, 32, "silu", False, False, hw=(32, 32))
    xv = RNG.standard_normal((4, 3, 32, 32)).astype(np.float32)
    got = []
    for threads in (1, 2):
        monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(threads))
        exe = Session("cpu", use_cache=False).compile(graph)
        assert [n for n, _ in _kernels(exe, 4)] == ["cpu.rlx_cpu.conv_chain"]
        got.append(exe.run(x=xv)["y"])
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    np.testing.assert_allclose(got[1], ref, rtol=2e-4, atol=2e-4 * float(np.abs(ref).max()))
    np.testing.assert_array_equal(got[0], got[1])


@pytest.mark.parametrize("keepdims", [True, False])
@pytest.mark.parametrize("nhwc", [True, False])
def test_global_mean_ends_the_chain(nhwc: bool, keepdims: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A global average pool after the last conv is the chain's last step, read from the blocked
    buffer (37 channels: padding lanes are not channels); NaN stays in its image's channel."""
    from rlx_cpu import conv_chain

    g = GraphBuilder("gap")
    x = g.input("x", "f32", (3, 3, 11, 9))
    y = g.op("relu", _conv(g, x, "stem", 16 if nhwc else 37, 3, 3))
    if nhwc:  # brgconv 1x1 and depthwise: NHWC
        y = g.op("relu", _conv(g, g.op("relu", _conv(g, y, "e", 37, 16, 1)), "d", 37, 37, 3, groups=37))
    g.output(g.op("reduce_mean", y, axes=(2, 3), keepdims=keepdims), "y")
    graph = g.build()
    exe = Session("cpu", use_cache=False).compile(graph)
    kernels = _kernels(exe, 3)
    assert [n for n, _ in kernels] == ["cpu.rlx_cpu.conv_chain"]
    assert kernels[0][1].onednn_impl[-1] == ("mean:numba:nhwc" if nhwc else "mean:numba:blocked16")
    xv = RNG.standard_normal((3, 3, 11, 9)).astype(np.float32)
    xv[0, 1, 4, 5] = np.nan
    got = exe.run(x=xv)["y"]
    ref = evaluate(graph, {"x": xv.astype(np.float64)})["y"]
    assert got.shape == ref.shape and np.isnan(ref[0]).any() and not np.isnan(ref[1:]).any()
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-4, atol=2e-4 * float(np.abs(ref[ok]).max()))
    for flag in ("USE", "MEAN"):
        with monkeypatch.context() as m:
            m.setattr(conv_chain, flag, False)
            other = Session("cpu", use_cache=False).compile(graph)
            assert (flag == "USE") != ("cpu.reduce_mean" in [n for n, _ in _kernels(other, 3)])
            slow = other.run(x=xv)["y"]
        np.testing.assert_allclose(got[ok], slow[ok], rtol=1e-4, atol=1e-4 * float(np.abs(slow[ok]).max()))


def _conv1d_net(batch: int, keepdims: bool, escape: bool) -> Any:
    """conv1d_audio's shape of graph: convs on (N, C, 1, W), then the reshape to (N, C, W) and the
    mean over W that importers write for AdaptiveAvgPool1d(1)."""
    g = GraphBuilder("conv1d_net")
    x = g.input("x", "f32", (batch, 4, 1, 40))
    w1 = g.param("w1", RNG.standard_normal((16, 4, 1, 5)) * 0.3, "f32")
    b1 = g.param("b1", RNG.standard_normal(16), "f32")
    w2 = g.param("w2", RNG.standard_normal((24, 16, 1, 3)) * 0.3, "f32")
    b2 = g.param("b2", RNG.standard_normal(24), "f32")
    y = g.op("relu", g.op("conv2d_bias", x, w1, b1, strides=(1, 2), pads=(0, 2, 0, 2), dilations=(1, 1),
                          groups=1))
    y = g.op("conv2d_bias", y, w2, b2, strides=(1, 1), pads=(0, 1, 0, 1), dilations=(1, 1), groups=1)
    flat = g.op("reshape", y, shape=(batch, 24, 20))
    g.output(g.op("reduce_mean", flat, axes=(-1,), keepdims=keepdims), "y")
    if escape:  # the (N, C, W) value is read elsewhere too: nothing to rewrite
        g.output(flat, "flat")
    return g.build()


@pytest.mark.parametrize("keepdims", [True, False])
@pytest.mark.parametrize("escape", [False, True])
def test_conv1d_global_mean_ends_the_chain(keepdims: bool, escape: bool) -> None:
    graph = _conv1d_net(2, keepdims, escape)
    exe = Session("cpu", use_cache=False).compile(graph)
    xv = RNG.standard_normal((2, 4, 1, 40)).astype(np.float32)
    got = exe.run(x=xv)
    ref = evaluate(graph, {"x": xv.astype(np.float64)})
    for k, v in ref.items():
        assert got[k].shape == v.shape
        np.testing.assert_allclose(got[k], v, rtol=2e-5, atol=2e-5 * float(np.abs(v).max()))
    names = [n for n, _ in _kernels(exe, 2)]
    assert "cpu.rlx_cpu.conv_chain" in names
    assert ("cpu.reduce_mean" in names) == escape, names  # the mean is the chain's last step
