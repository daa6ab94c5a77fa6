"""rlx-cpu's native HIR kernels against the float64 reference, on both the NumPy and Numba paths."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

RNG = np.random.default_rng(21)
SIZES = [(3, 5, 7), (4, 96, 128)]  # small -> NumPy path; >= 32768 elements -> Numba row kernels


def _run(graph: object, feed: dict) -> tuple[dict, dict, object]:
    exe = Session("cpu", use_cache=False).compile(graph)
    return exe.run(feed), evaluate(graph, feed), exe.report


@pytest.mark.parametrize("shape", SIZES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_row_ops(shape: tuple[int, ...], op: str, dtype: str) -> None:
    g = GraphBuilder(op)
    x = g.input("x", dtype, shape)
    g.output(g.op(op, x, axis=-1), "y")
    xv = (RNG.standard_normal(shape) * 4).astype(np.float32 if dtype == "f32" else np.float64)
    got, want, report = _run(g.build(), {"x": xv})
    assert report.entries[0].path == "native" and report.entries[0].kernels == (f"cpu.{op}",)
    tol = 2e-6 if dtype == "f32" else 1e-12
    np.testing.assert_allclose(got["y"], want["y"], rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", SIZES)
@pytest.mark.parametrize("split", [False, True])
def test_layer_norm(shape: tuple[int, ...], split: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if split:
        monkeypatch.setattr("rlx_cpu.parallel.MIN_ELEMS_PER_THREAD", 256)
    g = GraphBuilder("ln")
    x = g.input("x", "f32", shape)
    gam = g.param("g", RNG.standard_normal(shape[-1]).astype(np.float32))
    bet = g.param("b", RNG.standard_normal(shape[-1]).astype(np.float32))
    g.output(g.layer_norm(x, gam, bet, eps=1e-5), "y")
    xv = (RNG.standard_normal(shape) * 3 + 100).astype(np.float32)  # offset: a naive variance fails
    got, want, report = _run(g.build(), {"x": xv})
    assert report.entries[0].kernels == ("cpu.layer_norm",)
    np.testing.assert_allclose(got["y"], want["y"], rtol=2e-4, atol=2e-4)


def test_linear() -> None:
    g = GraphBuilder("lin")
    x = g.input("x", "f32", ("batch", 64))
    w = g.param("w", RNG.standard_normal((32, 64)).astype(np.float32))
    b = g.param("b", RNG.standard_normal(32).astype(np.float32))
    g.output(g.linear(x, w, b), "y")
    xv = RNG.standard_normal((5, 64)).astype(np.float32)
    got, want, report = _run(g.build(), {"x": xv})
    assert report.entries[0].kernels == ("cpu.linear",)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mask", ["none", "causal", "padding", "bias", "sliding_window"])
@pytest.mark.parametrize("seq", [6, 128, 130])  # 130: a partial last query block
@pytest.mark.parametrize("split", [False, True])  # True: small work already split over the row pool
def test_attention(mask: str, seq: int, split: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if split:
        monkeypatch.setattr("rlx_cpu.parallel.MIN_ELEMS_PER_THREAD", 256)
    b, h, d = 2, 3, 16
    g = GraphBuilder("attn")
    q = g.input("q", "f32", (b, h, seq, d))
    k = g.input("k", "f32", (b, h, seq, d))
    v = g.input("v", "f32", (b, h, seq, d))
    feed = {n: RNG.standard_normal((b, h, seq, d)).astype(np.float32) for n in "qkv"}
    extra = []
    attrs: dict = {"mask": mask}
    if mask == "padding":
        extra.append(g.input("m", "i64", (b, seq)))
        m = np.ones((b, seq), np.int64)
        m[1, seq // 2:] = 0
        feed["m"] = m
    elif mask == "bias":
        extra.append(g.input("m", "f32", (b, 1, seq, seq)))
        feed["m"] = RNG.standard_normal((b, 1, seq, seq)).astype(np.float32)
    elif mask == "sliding_window":
        attrs["window"] = 3
    g.output(g.attention(q, k, v, *extra, **attrs), "y")
    got, want, report = _run(g.build(), feed)
    expected = "common_ir" if mask == "sliding_window" else "native"
    assert report.entries[0].path == expected
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)


def test_attention_kernel_loads_from_disk_cache_in_a_second_process(tmp_path: object) -> None:
    """The Numba attention kernel must be cacheable: a first-class function argument once made it
    recompile (~3 s) in every process."""
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from rlx_core import GraphBuilder, Session\n"
        "from rlx_cpu import _attention as na\n"
        "g = GraphBuilder('a'); q = g.input('q', 'f32', (1, 2, 8, 4))\n"
        "g.output(g.attention(q, q, q, mask='causal'), 'y')\n"
        "Session('cpu', use_cache=False).compile(g.build()).run(q=np.ones((1, 2, 8, 4), np.float32))\n"
        "k = na.attention_items\n"
        "print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))\n"
    )
    env = {"RLX_CACHE_DIR": str(tmp_path), "HOME": str(tmp_path), "NUMBA_CACHE_DIR": f"{tmp_path}/nb"}
    stats = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        stats.append(tuple(int(v) for v in r.stdout.split()))
    assert stats[0] == (0, 1) and stats[1] == (1, 0), stats


@pytest.mark.parametrize("seq", [6, 128])
def test_attention_value_head_size_differs(seq: int) -> None:
    """v may have another head size than q/k (ONNX Attention, FlexAttention): the Numba kernel
    once wrote only q's head size of each output row (wrong numbers, no error)."""
    b, h, d, dv = 2, 2, 6, 32
    g = GraphBuilder("attn_dv")
    q = g.input("q", "f32", (b, h, seq, d))
    k = g.input("k", "f32", (b, h, seq, d))
    v = g.input("v", "f32", (b, h, seq, dv))
    g.output(g.attention(q, k, v), "y")
    feed = {"q": RNG.standard_normal((b, h, seq, d)).astype(np.float32),
            "k": RNG.standard_normal((b, h, seq, d)).astype(np.float32),
            "v": RNG.standard_normal((b, h, seq, dv)).astype(np.float32)}
    got, want, _ = _run(g.build(), feed)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
