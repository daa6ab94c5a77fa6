"""rlx-cuda's generated gather and sum/prod/mean kernels (``RLX_CUDA_FAST_GATHER`` /
``RLX_CUDA_FAST_REDUCE``, :func:`rlx_cuda.codegen.gather_source` / :func:`~rlx_cuda.codegen.reduce_source`).

Without a GPU: the axis plan of the reductions, and, where an NVRTC library is found (CuPy's, the
``nvidia-cuda-nvrtc-cu12`` wheel's, or the system's), that every gather/reduce kernel the plugin can
emit compiles for sm_90 and sm_80. On a GPU: results against NumPy (gather: exact, negative
indices, i32/i64 indices, f16/bf16/f32/i64/bool tables, copy units of 16 down to 1 byte, every
axis; reductions: float64 reference, warp/block/strided kernels, odd sizes, adjacent multi-axis,
size-1 dims, the non-adjacent CuPy fallback, keepdims), that the generated kernels really ran,
CUDA-graph replay with fresh inputs, and the old path (settings off) agreeing.

    pytest plugins/rlx-cuda/tests/test_cuda_datamove.py
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _cudakit import BOUND, gpu, nvrtc_compile, nvrtc_lib, record_kernels
from rlx_cuda import codegen

from rlx_core import GraphBuilder, Session
from rlx_core._hub import Hub, reset_hub
from rlx_core.dtypes import DType

RNG = np.random.default_rng(181)




@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "rlx-cache"))
    monkeypatch.delenv("RLX_CUDA_FAST_GATHER", raising=False)
    monkeypatch.delenv("RLX_CUDA_FAST_REDUCE", raising=False)
    reset_hub(Hub())
    record_kernels(monkeypatch)
    yield
    reset_hub(Hub())


# -- no GPU ---------------------------------------------------------------------------------------

def test_reduce_plan() -> None:
    plan = codegen.reduce_plan
    assert plan((128, 128, 384), (1,)) == (128, 128, 384)  # MiniLM's mean pooling
    assert plan((128, 128, 1), (1,)) == (128, 128, 1)
    assert plan((4, 6, 3, 5), (1, 2)) == (4, 18, 5)
    assert plan((6, 1, 9), (0, 2)) == (1, 54, 1)  # a size-1 dim between reduced axes is no gap
    assert plan((2, 3, 4), ()) == (24, 1, 1)
    assert plan((), ()) == (1, 1, 1)
    assert plan((3, 4, 5), (0, 2)) is None  # not adjacent: CuPy's reduction




@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_every_data_kernel_compiles(arch: str) -> None:
    lib = nvrtc_lib()
    if lib is None:
        pytest.skip("no libnvrtc (pip install nvidia-cuda-nvrtc-cu12 or CuPy): the gather/reduce "
                    "kernels are NOT compile-checked on this machine")
    sources = codegen.all_data_kernels()
    assert len(sources) == len({name for name, _ in sources}) > 40  # one name per distinct kernel
    for name, src in sources:
        assert f" {name}(" in src
        rc, log = nvrtc_compile(lib, src, arch, "data.cu")
        assert rc == 0, f"{name} does not compile for {arch}:\n{log[-3000:]}"


# -- GPU ------------------------------------------------------------------------------------------

def _ran(prefix: str) -> bool:
    return bool(_loaded(prefix))


def _loaded(prefix: str) -> set[str]:
    return {name for name in BOUND if name.startswith(prefix)}


def _table(dt: str, shape: tuple[int, ...]) -> np.ndarray:
    if dt == "bool":
        return RNG.random(shape) < 0.5
    if dt in ("i64", "i32"):
        return RNG.integers(-1000, 1000, shape).astype(DType.parse(dt).np)
    return RNG.standard_normal(shape).astype(DType.parse(dt).np)


GATHER_CASES = [  # (table shape, axis, index shape): copy units 16 / 8 / 4 / 2 bytes for f16
    ((50, 384), 0, (4, 33)),     # MiniLM's word embedding (16-byte units)
    ((50, 12), 0, (7,)),         # 24 bytes a row: 8-byte units
    ((9, 3), 0, (2, 5)),         # 6 bytes: 2-byte units (odd rows)
    ((3, 40, 5), 1, (6,)),       # a middle axis
    ((4, 7), 1, (3, 2)),         # the last axis: one element a row
    ((31,), 0, ()),              # a 0-d index
]


@gpu
@pytest.mark.parametrize("dt", ["f16", "bf16", "f32", "i64", "bool"])
@pytest.mark.parametrize("idt", ["i64", "i32"])
@pytest.mark.parametrize("case", range(len(GATHER_CASES)))
def test_gather_exact(dt: str, idt: str, case: int) -> None:
    shape, ax, ishape = GATHER_CASES[case]
    n = shape[ax]
    g = GraphBuilder("gather")
    x = g.input("x", dt, shape)
    i = g.input("i", idt, ishape)
    g.output(g.op("gather", x, i, axis=ax), "y")
    exe = Session("cuda", use_cache=False).compile(g.build())
    for _ in range(3):  # eager, captured, replayed: each with fresh tables and indices
        xv = _table(dt, shape)
        iv = RNG.integers(-n, n, ishape).astype(DType.parse(idt).np)  # negative: from the end
        got = exe.run(x=xv, i=iv)["y"]
        want = np.take(xv, iv, axis=ax)
        assert got.dtype == want.dtype and got.shape == want.shape
        # bytes compared flat: a 0-d result cannot change its itemsize in .view, and
        # np.ascontiguousarray turns a 0-d array into a 1-d one
        assert np.array_equal(np.ascontiguousarray(got).reshape(-1).view(np.uint8),
                              np.ascontiguousarray(want).reshape(-1).view(np.uint8))
    assert _ran("rlx_gather_"), "the generated gather kernel did not run"


@gpu
def test_gather_old_path_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    g = GraphBuilder("gather_old")
    x = g.input("x", "f16", (64, 384))
    i = g.input("i", "i64", (8, 16))
    g.output(g.op("gather", x, i, axis=0), "y")
    graph = g.build()
    xv = _table("f16", (64, 384))
    iv = RNG.integers(-64, 64, (8, 16))
    fast = Session("cuda", use_cache=False).compile(graph).run(x=xv, i=iv)["y"]
    monkeypatch.setenv("RLX_CUDA_FAST_GATHER", "0")
    old = Session("cuda", use_cache=False).compile(graph).run(x=xv, i=iv)["y"]
    assert np.array_equal(fast, old) and np.array_equal(fast, np.take(xv, iv, axis=0))


REDUCE_CASES = [  # (shape, axes, keepdims): the kernel each takes
    ((7, 33), (1,), False),            # warp per row
    ((3, 5001), (1,), True),           # few long rows: block per row
    ((200003,), None, False),          # everything into one output: block
    ((5, 130, 37), (1,), False),       # strided, odd inner
    ((4, 6, 3, 5), (1, 2), True),      # strided, two adjacent axes
    ((4, 6, 3, 5), (0,), False),       # strided, outer 1
    ((6, 1, 9), (0, 2), False),        # adjacent once the size-1 dim is ignored: warp
    ((3, 4, 5), (0, 2), False),        # not adjacent: CuPy's reduction
    ((2, 3), None, True),              # tiny
    ((8, 128, 384), (1,), False),      # MiniLM's pooling at batch 8
]


def _reduce_input(op: str, dt: str, shape: tuple[int, ...]) -> np.ndarray:
    npdt = DType.parse(dt).np
    if op == "prod":  # magnitudes near 1 keep even 200k-factor products finite and in range
        sign = RNG.choice(np.array([-1, 1], npdt), shape)
        if dt in ("i32", "i64"):
            return sign
        return (sign * (1 + RNG.uniform(-1e-3, 1e-3, shape))).astype(npdt)
    if dt in ("i32", "i64"):
        return RNG.integers(-1000, 1000, shape).astype(npdt)
    return RNG.standard_normal(shape).astype(npdt)


def _reference(op: str, x: np.ndarray, axes: tuple[int, ...] | None, keep: bool, dt: str) -> np.ndarray:
    wide = x.astype(np.int64 if dt in ("i32", "i64") else np.float64)
    fn: Any = {"sum": np.sum, "prod": np.prod, "mean": np.mean}[op]
    out: np.ndarray = np.asarray(fn(wide, axis=axes, keepdims=keep))
    return out


@gpu
@pytest.mark.parametrize(("op", "dt"), [("sum", "f32"), ("sum", "f64"), ("sum", "i32"), ("sum", "i64"),
                                        ("mean", "f32"), ("mean", "f64"), ("prod", "f32"), ("prod", "i64")])
@pytest.mark.parametrize("case", range(len(REDUCE_CASES)))
def test_reduce_vs_float64(op: str, dt: str, case: int) -> None:
    shape, axes, keep = REDUCE_CASES[case]
    g = GraphBuilder("reduce")
    x = g.input("x", dt, shape)
    g.output(g.op(f"reduce_{op}", x, axes=axes, keepdims=keep), "y")
    exe = Session("cuda", use_cache=False).compile(g.build())
    for _ in range(3):  # eager, captured, replayed
        xv = _reduce_input(op, dt, shape)
        got = exe.run(x=xv)["y"]
        want = _reference(op, xv, axes, keep, dt)
        assert got.shape == want.shape, (got.shape, want.shape)
        if dt in ("i32", "i64"):
            assert np.array_equal(got.astype(np.int64), want)
            continue
        eps = {"f32": 2.0**-23, "f64": 2.0**-52}[dt]
        rr = max(1, xv.size // max(1, want.size))
        if op == "prod":  # relative: each factor adds one rounding
            tol = 4 * eps * rr * np.abs(want) + 1e-300
        else:  # against the sum of magnitudes (mean: divided by R as well)
            mag = _reference("sum" if op == "sum" else "mean", np.abs(xv), axes, keep, dt)
            tol = 4 * eps * rr * mag + 1e-300
        err = np.abs(got.astype(np.float64) - want)
        assert (err <= tol).all(), f"max err {err.max()} vs tol {tol.max()}"
    adjacent = codegen.reduce_plan(shape, tuple(range(len(shape))) if axes is None else axes) is not None
    assert _ran(f"rlx_reduce_{op}_") or not adjacent, "the generated reduce kernel did not run"


@gpu
def test_reduce_kernel_kinds_and_old_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kernel kind is taken where planned, and CuPy's path (setting off) agrees."""
    got = {}
    for shape, axes, kind in [((7, 33), (1,), "warp"), ((3, 5001), (1,), "block"),
                              ((5, 130, 37), (1,), "strided")]:
        g = GraphBuilder(f"kind_{kind}")
        x = g.input("x", "f32", shape)
        g.output(x.sum(axes=axes), "y")
        graph = g.build()
        xv = RNG.standard_normal(shape).astype(np.float32)
        BOUND.clear()
        monkeypatch.delenv("RLX_CUDA_FAST_REDUCE", raising=False)
        got[kind] = Session("cuda", use_cache=False).compile(graph).run(x=xv)["y"]
        assert _loaded("rlx_reduce_sum_") == _loaded(f"rlx_reduce_sum_{kind}_") != set(), \
            f"expected the {kind} kernel, loaded {_loaded('rlx_reduce_')}"
        BOUND.clear()
        monkeypatch.setenv("RLX_CUDA_FAST_REDUCE", "0")
        old = Session("cuda", use_cache=False).compile(graph).run(x=xv)["y"]
        np.testing.assert_allclose(got[kind], old, rtol=1e-5, atol=1e-4)
        assert not _loaded("rlx_reduce_"), "RLX_CUDA_FAST_REDUCE=0 still ran the generated kernel"


# -- weight-only steps folded at bind time (RLX_CUDA_FOLD_WEIGHTS) ----------------------------------

def _gelu_half_graph(dt: str) -> Any:
    """The MiniLM pattern: f16 GELU (its constants are f16 weights cast to f32 by legalization)
    plus a scalar weight cast explicitly, chained through two weight-only steps."""
    g = GraphBuilder(f"fold_{dt}")
    x = g.input("x", dt, (33, 70))
    c = g.const(0.75, dt).astype("f32")  # weight-only: cast ...
    c2 = g.op("exp", c)                  # ... and a step reading only that (a chain)
    y = g.op("gelu", x, approximate="none")
    g.output(y.astype("f32") * c2, "y")
    return g.build()


@gpu
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_weight_only_steps_folded(dt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _gelu_half_graph(dt)
    npdt = DType.parse(dt).np

    def run(fold: str) -> tuple[list[np.ndarray], Any]:
        monkeypatch.setenv("RLX_CUDA_FOLD_WEIGHTS", fold)
        exe = Session("cuda", use_cache=False).compile(graph)
        outs = []
        for seed in range(3):  # eager, captured, replayed: the folded values must survive all three
            xv = np.random.default_rng(seed).standard_normal((33, 70)).astype(npdt)
            outs.append(exe.run(x=xv)["y"])
        prog = next(iter(exe._specs.values()))[0]
        return outs, prog
    folded_out, prog = run("1")
    plain_out, prog0 = run("0")
    assert prog0.folded == set()
    assert prog.folded, "no weight-only step was folded"
    for k in prog.folded:
        st = prog.program.kernels[k]
        assert st.kernel.startswith("cuda."), st
        assert all(i in {p.name for p in prog.program.graph.params} or
                   any(i in prog.program.kernels[j].outputs for j in prog.folded) for i in st.inputs)
    for a, b in zip(folded_out, plain_out):
        assert np.array_equal(a, b)  # the same kernels, run once instead of every time
    xv = np.random.default_rng(2).standard_normal((33, 70)).astype(npdt).astype(np.float64)
    from math import erf

    gelu = 0.5 * xv * (1 + np.vectorize(erf)(xv / np.sqrt(2)))
    want = gelu * np.exp(0.75)
    tol = {"f16": 4e-3, "bf16": 3e-2}[dt]  # a few roundings to the half type along the chain
    assert (np.abs(folded_out[2] - want) <= tol * (np.abs(want) + 1)).all()


# -- residual add fused into layer_norm (RLX_CUDA_FUSE_ADD_LN) --------------------------------------

@gpu
@pytest.mark.parametrize("dt", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("shape", [(5, 37, 384), (3, 1000), (2, 1500)])
def test_add_fused_into_layer_norm(dt: str, shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Same bytes as the two steps (the sum is rounded to the dtype in registers exactly as the
    add stores it), close to float64, through graph replay; rows over 1024 keep two steps."""
    n = shape[-1]
    npdt = DType.parse(dt).np
    g = GraphBuilder(f"add_ln_{dt}")
    x, r = g.input("x", dt, shape), g.input("r", dt, shape)
    gv = (1 + 0.1 * RNG.standard_normal(n)).astype(npdt)
    bv = (0.1 * RNG.standard_normal(n)).astype(npdt)
    g.output(g.layer_norm(x + r, g.param("gamma", gv), g.param("beta", bv), eps=1e-12), "y")
    graph = g.build()
    feeds = [{k: np.random.default_rng(s + (k == "r")).standard_normal(shape).astype(npdt) for k in "xr"}
             for s in range(0, 6, 2)]

    def run(fuse: str) -> tuple[list[np.ndarray], Any]:
        monkeypatch.setenv("RLX_CUDA_FUSE_ADD_LN", fuse)
        exe = Session("cuda", use_cache=False).compile(graph)
        outs = [exe.run(**f)["y"] for f in feeds]  # eager, captured, replayed
        return outs, next(iter(exe._specs.values()))[0]
    fused, prog = run("1")
    plain, prog0 = run("0")
    assert prog0.fused_adds == set()
    assert bool(prog.fused_adds) == (n <= 1024), prog.fused_adds
    for a, b in zip(fused, plain):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    f = feeds[2]
    s = (f["x"].astype(np.float64) + f["r"].astype(np.float64)).astype(npdt).astype(np.float64)
    mu = s.mean(-1, keepdims=True)
    want = (s - mu) / np.sqrt(((s - mu) ** 2).mean(-1, keepdims=True) + 1e-12)
    want = want * gv.astype(np.float64) + bv.astype(np.float64)
    tol = {"f16": 8e-3, "bf16": 6e-2, "f32": 1e-5}[dt]
    assert np.abs(fused[2].astype(np.float64) - want).max() < tol
