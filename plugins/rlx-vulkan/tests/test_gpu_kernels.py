"""rlx-vulkan's GPU kernels and device-local memory, run on whatever Vulkan device is here (Mesa
lavapipe in CI: ``RLX_VULKAN_TILED=1`` makes it run the GPU kernels too). Every result is checked
against a float64 NumPy reference; the GEMM variant that ran is checked, so a lowering that silently
took another path fails. A missing Vulkan device FAILS (it does not skip)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session

F = np.float64


@pytest.fixture(autouse=True)
def _gpu_kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from rlx_vulkan import plugin

    dev = plugin.rlx_probe_devices()[0]
    if not dev.available:
        pytest.fail(f"no usable Vulkan device: {dev.reason} (apt-get install libvulkan1 mesa-vulkan-drivers "
                    "glslang-tools)")
    monkeypatch.setenv("RLX_VULKAN_TILED", "1")
    monkeypatch.delenv("RLX_VULKAN_GEMM", raising=False)
    monkeypatch.delenv("RLX_VULKAN_MEMORY", raising=False)
    yield


def _run(build: Callable[[GraphBuilder], None], *feeds: np.ndarray) -> tuple[np.ndarray, Any]:
    g = GraphBuilder("vk_gpu")
    build(g)
    exe = Session("vulkan", use_cache=False).compile(g.build())
    out = exe(*feeds)
    prog = exe._specialise({})[0]  # the compiled VulkanProgram (variants, dispatches, timings)
    return np.asarray(out), prog


def _close(got: np.ndarray, want: np.ndarray, rtol: float = 2e-6) -> None:
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(got.astype(F) - want).max() <= rtol * scale * 8, np.abs(got.astype(F) - want).max()


@pytest.mark.parametrize("tile", ["small", "medium", "large"])
@pytest.mark.parametrize("mkn", [(1, 1, 1), (5, 3, 7), (64, 64, 64), (130, 200, 129), (257, 9, 300)])
def test_tiled_matmul(monkeypatch: pytest.MonkeyPatch, tile: str, mkn: tuple[int, int, int]) -> None:
    monkeypatch.setenv("RLX_VULKAN_GEMM", tile)
    m, k, n = mkn
    rng = np.random.default_rng(m * 7 + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)

    def build(g: GraphBuilder) -> None:
        g.output(g.input("a", "f32", a.shape) @ g.input("b", "f32", b.shape))

    got, prog = _run(build, a, b)
    _close(got, a.astype(F) @ b.astype(F))
    bm, bn = {"small": (64, 64), "medium": (128, 64), "large": (128, 128)}[tile]
    assert list(prog.gemm_variants.values()) == [f"tiled-{tile} {bm}x{bn}"]


def test_batched_broadcast_matmul_and_int32() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 2, 37, 20)).astype(np.float32)
    b = rng.standard_normal((2, 20, 45)).astype(np.float32)

    def build(g: GraphBuilder) -> None:
        g.output(g.input("a", "f32", a.shape) @ g.input("b", "f32", b.shape))

    got, prog = _run(build, a, b)
    _close(got, a.astype(F) @ b.astype(F))
    assert next(iter(prog.gemm_variants.values())).startswith("tiled-")
    ai = rng.integers(-50, 50, (70, 33)).astype(np.int32)
    bi = rng.integers(-50, 50, (33, 66)).astype(np.int32)

    def build_i(g: GraphBuilder) -> None:
        g.output(g.input("a", "i32", ai.shape) @ g.input("b", "i32", bi.shape))

    got, _ = _run(build_i, ai, bi)
    np.testing.assert_array_equal(got, ai @ bi)


@pytest.mark.parametrize("constant_weight", [True, False])
def test_linear_bias_epilogue(constant_weight: bool) -> None:
    rng = np.random.default_rng(2)
    w = rng.standard_normal((70, 50)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    x = rng.standard_normal((4, 9, 50)).astype(np.float32)

    def build(g: GraphBuilder) -> None:
        xv = g.input("x", "f32", x.shape)  # declared first: the positional feeds are (x, w)
        wv = g.param("w", w) if constant_weight else g.input("w", "f32", w.shape)
        g.output(g.linear(xv, wv, g.param("bias", bias)))

    got, prog = _run(build, *((x,) if constant_weight else (x, w)))
    _close(got, x.astype(F) @ w.T.astype(F) + bias)
    assert next(iter(prog.gemm_variants.values())).endswith("+bias")


def test_rows_per_workgroup_softmax_layer_norm_with_specials() -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((9, 300)) * 4).astype(np.float32)
    x[1, 7] = np.nan
    x[2, :] = -np.inf
    x[3, 5] = np.inf
    gamma = rng.standard_normal(300).astype(np.float32)
    beta = rng.standard_normal(300).astype(np.float32)

    def build(g: GraphBuilder) -> None:
        xi = g.input("x", "f32", x.shape)
        g.output(g.softmax(xi), "sm")
        g.output(g.layer_norm(xi, g.param("g", gamma), g.param("b", beta)), "ln")

    gb = GraphBuilder("vk_rows")
    build(gb)
    exe = Session("vulkan", use_cache=False).compile(gb.build())
    got = exe.run({"x": x})
    ref = Session("cpu", use_cache=False).compile(gb.build()).run({"x": x})
    for name in ("sm", "ln"):
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-6, equal_nan=True)
    counts = exe._specialise({})[0].dispatch_counts
    assert counts["vulkan.softmax"] == 1 and counts["vulkan.layer_norm"] == 1


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min"])
def test_reduce_per_workgroup(op: str) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 5, 300)).astype(np.float32)
    x[0, 1, 10] = np.nan
    x[1, 2, :] = np.inf
    x[2, 3, 4] = -np.inf
    x[3, 0, :] += 1e4  # compensated sums keep the small parts

    def build(g: GraphBuilder) -> None:
        g.output(getattr(g, op)(g.input("x", "f32", x.shape), axes=(2,)))

    got, prog = _run(build, x)
    fns: dict[str, Callable[..., Any]] = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max,
                                          "reduce_min": np.min}
    want = fns[op](x.astype(F), axis=2)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-5, equal_nan=True)
    sources = [ln.source for _, lns in prog.launches for ln in lns]
    assert len(sources) == 1 and "wg_" in sources[0]  # the workgroup-per-output kernel ran


@pytest.mark.parametrize("memory", ["device", "host"])
def test_staged_io_and_gpu_time(monkeypatch: pytest.MonkeyPatch, memory: str) -> None:
    monkeypatch.setenv("RLX_VULKAN_MEMORY", memory)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((40, 24)).astype(np.float32)

    def build(g: GraphBuilder) -> None:
        x = g.input("a", "f32", a.shape)
        g.output(g.tanh(x) * 2.0, "y")
        g.output(x, "same")  # an input that is also an output: uploaded and downloaded

    g = GraphBuilder("vk_io")
    build(g)
    exe = Session("vulkan", use_cache=False).compile(g.build())
    for k in range(3):  # the staging buffer is reused: every run sees its own inputs
        out = exe.run({"a": a + k})
        _close(out["y"], np.tanh((a + k).astype(F)) * 2.0)
        np.testing.assert_array_equal(out["same"], a + k)
    prog = exe._specialise({})[0]
    assert prog.memory == memory
    t = prog.gpu_seconds()
    assert (t is None) if memory == "host" else (t is None or t >= 0.0)


def _attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, kind: str, m: np.ndarray | None,
                   scale: float, window: int = 0) -> np.ndarray:
    """softmax(q k^T * scale + mask) v in float64, masked scores -1e9 (the op's definition)."""
    s = np.matmul(q.astype(F), np.swapaxes(k.astype(F), -1, -2)) * scale
    sq, sk = s.shape[-2:]
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    if kind in ("causal", "sliding_window"):
        keep = (j <= i) & ((j > i - window) if kind == "sliding_window" else True)
        s = np.where(keep, s, -1e9)
    elif kind == "bias":
        assert m is not None
        s = s + m.astype(F)
    elif kind == "padding":
        assert m is not None
        s = np.where((m != 0).reshape((q.shape[0],) + (1,) * (q.ndim - 2) + (sk,)), s, -1e9)
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.matmul(e / e.sum(-1, keepdims=True), v.astype(F))


# odd sizes: more query rows than a workgroup (64), keys not a multiple of the chunk (32), head dims
# that differ and are not powers of two; a (B, S, D) case without heads
ATT_SHAPES = [(2, 3, 70, 45, 24, 40), (1, 2, 5, 1, 8, 8), (3, 0, 33, 64, 32, 32)]


@pytest.mark.parametrize("shape", ATT_SHAPES)
@pytest.mark.parametrize("kind", ["none", "causal", "sliding_window", "bias", "padding"])
def test_fused_attention(shape: tuple[int, ...], kind: str) -> None:
    b, h, sq, sk, d, dv = shape
    lead = (b, h) if h else (b,)
    rng = np.random.default_rng(sum(shape))
    q = (rng.standard_normal((*lead, sq, d)) * 2).astype(np.float32)
    k = rng.standard_normal((*lead, sk, d)).astype(np.float32)
    v = rng.standard_normal((*lead, sk, dv)).astype(np.float32)
    m: np.ndarray | None = None
    if kind == "bias":  # broadcast over heads and queries
        m = (rng.standard_normal((b, 1, 1, sk) if h else (b, 1, sk)) * 3).astype(np.float32)
    elif kind == "padding":
        m = (rng.random((b, sk)) > 0.3).astype(np.int64)
        m[0, :] = 0  # a fully masked row attends uniformly
    scale, window = 0.3, 3

    def build(g: GraphBuilder) -> None:
        ins = [g.input(n, "f32", a.shape) for n, a in (("q", q), ("k", k), ("v", v))]
        if m is not None:
            ins.append(g.input("m", "f32" if kind == "bias" else "i64", m.shape))
        win = window if kind == "sliding_window" else None
        g.output(g.attention(*ins, mask=kind, scale=scale, window=win))

    got, prog = _run(build, q, k, v, *(() if m is None else (m,)))
    _close(got, _attention_ref(q, k, v, kind, m, scale, window), rtol=4e-6)
    assert prog.dispatch_counts["vulkan.attention"] == 1 and len(prog.all_launches()) == 1


@pytest.mark.parametrize("mdt", ["bool", "i32", "f32"])
def test_fused_attention_padding_mask_dtypes(mdt: str) -> None:
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((3, 2, 9, 16)).astype(np.float32) for _ in range(3))
    keep = rng.random((3, 9)) > 0.5
    keep[:, 0] = True
    m: np.ndarray = keep.astype({"bool": np.bool_, "i32": np.int32, "f32": np.float32}[mdt])

    def build(g: GraphBuilder) -> None:
        ins = [g.input(n, "f32", q.shape) for n in "qkv"]
        g.output(g.attention(*ins, g.input("m", mdt, m.shape), mask="padding"))

    got, prog = _run(build, q, k, v, m)
    _close(got, _attention_ref(q, k, v, "padding", m, 1 / 4.0), rtol=4e-6)
    assert prog.dispatch_counts["vulkan.attention"] == 1


def test_attention_off_decomposes_and_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """RLX_VULKAN_ATTENTION=off is the before of the fused kernel (the decomposition), with the same
    numbers; RLX_VULKAN_PROFILE times every dispatch."""
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((2, 3, 20, 8)).astype(np.float32) for _ in range(3))

    def build(g: GraphBuilder) -> None:
        g.output(g.attention(*(g.input(n, "f32", q.shape) for n in "qkv"), mask="causal"))

    want = _attention_ref(q, k, v, "causal", None, 1 / np.sqrt(8))
    monkeypatch.setenv("RLX_VULKAN_ATTENTION", "off")
    monkeypatch.setenv("RLX_VULKAN_PROFILE", "1")
    got, prog = _run(build, q, k, v)
    _close(got, want, rtol=4e-6)
    assert "vulkan.attention" not in prog.dispatch_counts and prog.dispatch_counts["vulkan.matmul"] == 2
    times = prog.dispatch_times()
    total = prog.gpu_seconds()
    if total is not None:  # a queue with timestamps: one time per dispatch, adding up to the total
        assert times is not None and len(times) == len(prog.all_launches())
        assert abs(sum(t for _, _, t in times) - total) <= 1e-9 + 1e-6 * total
        assert set(prog.kernel_seconds() or {}) == {kernel for _, kernel, _ in times}


def test_gemm_auto_rule() -> None:
    """auto takes 128x128 tiles only where they still give >= 1024 workgroups (4096^3: yes; MiniLM's
    4096 x 1536 linear, 384 tiles: no)."""
    from rlx_core.plugin import glsl

    p = glsl.GlslProgram.__new__(glsl.GlslProgram)
    p.gemm_tile = "auto"
    assert p._tile(4096, 4096, 1) == "large"
    assert p._tile(4096, 1536, 1) == "small" and p._tile(128, 128, 384) == "small"


@pytest.mark.parametrize("epilogues", [True, False])
def test_linear_store_folds_head_split_and_residual(monkeypatch: pytest.MonkeyPatch, epilogues: bool) -> None:
    """A transformer block's q/k/v head split (linear -> reshape -> transpose) and residual adds are
    done by the linear's store; a residual that is the linear's own input still gives right numbers.
    RLX_VULKAN_EPILOGUES=0 runs every step as its own kernel, with the same numbers."""
    monkeypatch.setenv("RLX_VULKAN_EPILOGUES", "1" if epilogues else "0")
    rng = np.random.default_rng(9)
    b, s, heads, d = 2, 5, 3, 4
    hid = heads * d
    x = rng.standard_normal((b, s, hid)).astype(np.float32)
    ws = {n: (rng.standard_normal((hid, hid)) * 0.3).astype(np.float32) for n in "qkvorfp"}
    bs = {n: rng.standard_normal(hid).astype(np.float32) for n in ws}

    def build(g: GraphBuilder) -> None:
        xi = g.input("x", "f32", x.shape)

        def lin(t: Any, n: str) -> Any:
            return g.linear(t, g.param("w" + n, ws[n]), g.param("b" + n, bs[n]))

        q, k, v = (lin(xi, n).reshape(b, s, heads, d).transpose(0, 2, 1, 3) for n in "qkv")
        att = g.attention(q, k, v, mask="none").transpose(0, 2, 1, 3).reshape(b, s, hid)
        y = lin(att, "o") + xi  # residual: not the linear's input
        y = lin(g.gelu(lin(y, "f")), "p") + y  # exact GELU (a fused program with scalar constants)
        g.output(lin(y, "r") + y, "out")  # residual = the linear's own input

    def lin_ref(t: np.ndarray, n: str) -> np.ndarray:
        return t @ ws[n].T.astype(F) + bs[n]

    xf = x.astype(F)
    q, k, v = (lin_ref(xf, n).reshape(b, s, heads, d).transpose(0, 2, 1, 3) for n in "qkv")
    att = _attention_ref(q, k, v, "none", None, 1 / 2.0).transpose(0, 2, 1, 3).reshape(b, s, hid)
    y = lin_ref(att, "o") + xf
    from math import erf

    f = lin_ref(y, "f")
    y = lin_ref(f * 0.5 * (1 + np.vectorize(erf)(f / np.sqrt(2))), "p") + y
    got, prog = _run(build, x)
    _close(got, lin_ref(y, "r") + y, rtol=4e-6)
    variants = list(prog.gemm_variants.values())
    if not epilogues:
        folded = ("+split-heads", "+residual", "+elementwise")
        assert not any(e in v for v in variants for e in folded), variants
        assert prog.dispatch_counts["vulkan.transpose"] >= 3 and prog.dispatch_counts["vulkan.add"] == 3
        return
    assert sum("+split-heads" in v for v in variants) == 3, variants
    assert any("+residual" in v for v in variants) and any("+elementwise" in v for v in variants), variants
    assert prog.dispatch_counts["vulkan.transpose"] <= 1  # only the attention output's, if any
