"""Out-of-range indices (issue 14, item 5): one semantics (ONNX's), checked on the host where it can
be, and no kernel ever reading or writing outside its buffers where it cannot.

* Host checks: an index *input* out of range raises InputError before the run (naming the node, the
  value, its position and the valid range); a *constant* index out of range fails at compile time
  (IRError naming the node); negative in-range indices count from the end once.
* Device safety: indices the host cannot see (computed on the device, or fed straight to the
  backend's compiled program, bypassing ``Executable.run``) never read other buffers: the output
  holds 0 there (the update is skipped for scatter_add), or the backend raises InputError from a
  device-side flag. Neighbouring tensors hold a sentinel that must never show up in an output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.errors import BackendNotFoundError, DispatchError, InputError, IRError
from rlx_core.ir.reference import evaluate

SENTINEL = 12345.0
BACKENDS = ("cpu", "wasm", "vulkan", "metal", "webgpu", "opengl", "directx")
#: Backends whose kernels flag a device-side out-of-range index (an InputError) instead of giving 0.
FLAGS = frozenset({"cpu", "wasm"})


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_METAL_MODE", "host")


def _session(name: str) -> Session:
    try:
        s = Session(name, use_cache=False)
    except BackendNotFoundError as e:
        pytest.skip(f"{name}: {e.what}")
    if not s.device.available:
        pytest.skip(f"{name}: {s.device.reason}")
    return s


def _compile(name: str, graph: Any) -> Any:
    try:
        return _session(name).compile(graph)
    except DispatchError as e:
        pytest.skip(f"{name} does not run this graph: {e.what.splitlines()[0]}")


def _x() -> np.ndarray:
    return (np.arange(15, dtype=np.float32).reshape(5, 3) + 1.0)  # no zero row: 0 means "skipped"


# -- the reference and the host checks (every backend) ----------------------------------------------

def _gather_graph(idt: str = "i64", shape: tuple[int, ...] = (4,), axis: int = 0) -> Any:
    g = GraphBuilder("gather_bounds")
    x = g.input("x", "f32", (5, 3))
    i = g.input("i", idt, shape)
    g.output(g.op("gather", x, i, axis=axis, name="gat"), "y")
    return g.build()


def test_reference_is_onnx() -> None:
    graph = _gather_graph()
    got = evaluate(graph, {"x": _x(), "i": np.array([-1, -5, 0, 4])})["y"]
    np.testing.assert_array_equal(got, _x()[[4, 0, 0, 4]])
    for bad in (5, -6, 2**32 + 1):
        with pytest.raises(InputError, match=r"(?s)index -?\d+ at position \(2,\).*node 'gat'"):
            evaluate(graph, {"x": _x(), "i": np.array([0, 1, bad, 2])})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("idt", ["i64", "i32"])
def test_input_indices_checked_on_host(backend: str, idt: str) -> None:
    exe = _compile(backend, _gather_graph(idt))
    ok = np.array([-1, -5, 0, 4], dtype=idt.replace("i", "int"))
    np.testing.assert_array_equal(exe.run(x=_x(), i=ok)["y"], _x()[[4, 0, 0, 4]])
    for bad in (5, -6, 1000):
        with pytest.raises(InputError) as e:
            exe.run(x=_x(), i=np.array([0, 1, bad, 2], dtype=ok.dtype))
        msg = str(e.value)
        assert f"index {bad} at position (2,)" in msg and "'gat'" in msg and "gather" in msg, msg
        assert "valid: -5 .. 4" in msg and "fix:" in msg, msg


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_ids_checked_on_host(backend: str) -> None:
    g = GraphBuilder("emb_bounds")
    t = g.param("table", np.arange(12, dtype=np.float32).reshape(6, 2))
    ids = g.input("ids", "i64", (2, 2))
    g.output(g.op("embedding", t, g.op("reshape", ids, shape=(4,)), name="emb"), "y")
    exe = _compile(backend, g.build())
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    np.testing.assert_array_equal(exe.run(ids=np.array([[-1, -6], [0, 5]]))["y"], table[[5, 0, 0, 5]])
    with pytest.raises(InputError, match=r"'emb'.*'ids'.*index 6 at position \(1, 0\)"):
        exe.run(ids=np.array([[0, 1], [6, 2]]))


def test_constant_indices_fail_at_compile_time() -> None:
    g = GraphBuilder("const_bounds")
    x = g.input("x", "f32", (5, 3))
    g.output(g.op("gather", x, g.param("c", np.array([0, -6])), name="gat"), "y")
    with pytest.raises(IRError, match=r"node 'gat'.*index -6 at position \(1,\).*valid: -5 \.\. 4"):
        Session("cpu", use_cache=False).compile(g.build())


def test_symbolic_extent_checked_when_bound() -> None:
    g = GraphBuilder("sym_bounds")
    x = g.input("x", "f32", ("n", 3))
    i = g.input("i", "i64", (2,))
    g.output(g.op("gather", x, i, axis=0, name="gat"), "y")
    exe = Session("cpu", use_cache=False).compile(g.build())
    x4 = np.ones((4, 3), np.float32)
    assert exe.run(x=x4, i=np.array([-4, 3]))["y"].shape == (2, 3)
    with pytest.raises(InputError, match="index 4 at position"):
        exe.run(x=x4, i=np.array([0, 4]))


@pytest.mark.parametrize("backend", ["cpu", "wasm"])
def test_scatter_add_follows_onnx(backend: str) -> None:
    g = GraphBuilder("scatter_bounds")
    x = g.input("x", "f32", (5, 3))
    i = g.input("i", "i64", (2, 3))
    u = g.input("u", "f32", (2, 3))
    g.output(g.op("scatter_add", x, i, u, axis=0, name="sca"), "y")
    exe = _compile(backend, g.build())
    upd = np.ones((2, 3), np.float32)
    want = _x().copy()
    idx = np.array([[-1, 0, -5], [4, 2, 1]])
    np.add.at(want, (np.where(idx < 0, idx + 5, idx), np.arange(3)[None, :]), upd)
    np.testing.assert_array_equal(exe.run(x=_x(), i=idx, u=upd)["y"], want)
    with pytest.raises(InputError, match=r"'sca'.*index 5 at position \(1, 0\)"):  # used to wrap to 0
        exe.run(x=_x(), i=np.array([[0, 0, 0], [5, 0, 0]]), u=upd)


# -- device safety: indices the host cannot check -----------------------------------------------------

#: Offsets added on the device to in-range inputs: just past either end, far away, and (for i64)
#: 2**32 + 1, which a kernel truncating to 32 bits would wrongly take as row 1.
OFFSETS = {"i32": [5, -6, 1000, -1000, -2, 0], "i64": [5, -6, 1000, -1000, -2, 0, 2**32 + 1]}


def _device_gather(idt: str) -> tuple[Any, dict[str, np.ndarray], np.ndarray]:
    off = np.array(OFFSETS[idt], dtype=np.dtype(idt.replace("i", "int")))
    g = GraphBuilder(f"device_gather_{idt}")
    before = g.input("before", "f32", (64,))
    x = g.input("x", "f32", (5, 3))
    after = g.input("after", "f32", (64,))
    i = g.input("i", idt, off.shape)
    k = g.op("add", i, g.param("off", off))  # computed on the device: no host check sees it
    g.output(g.op("gather", x, k, axis=0, name="gat"), "y")
    g.output(before * 2.0, "b2")  # keeps the sentinel tensors live next to x
    g.output(after * 2.0, "a2")
    sentinel = np.full(64, SENTINEL, np.float32)
    feed = {"before": sentinel, "x": _x(), "after": sentinel, "i": np.zeros_like(off)}
    return g.build(), feed, off


def _check_gather(backend: str, y: np.ndarray, off: np.ndarray) -> None:
    assert not np.isin(y, [SENTINEL, 2 * SENTINEL]).any(), f"{backend} read a neighbouring tensor: {y}"
    for row, k in zip(y, off.tolist()):
        if -5 <= k < 5:
            np.testing.assert_array_equal(row, _x()[k], err_msg=f"{backend}: index {k}")
        else:
            np.testing.assert_array_equal(row, 0.0, err_msg=f"{backend}: out-of-range index {k} gave {row}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("idt", ["i32", "i64"])
def test_device_computed_gather_index_stays_in_bounds(backend: str, idt: str) -> None:
    graph, feed, off = _device_gather(idt)
    exe = _compile(backend, graph)
    if backend in FLAGS:
        with pytest.raises(InputError, match="out of range"):
            exe.run(feed)
        return
    out = exe.run(feed)
    _check_gather(backend, out["y"], off)
    np.testing.assert_array_equal(out["b2"], 2 * SENTINEL)
    np.testing.assert_array_equal(out["a2"], 2 * SENTINEL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_program_bypassing_host_check_stays_in_bounds(backend: str) -> None:
    """Out-of-range indices handed straight to the backend's compiled program (no Executable.run)."""
    g = GraphBuilder("bypass")
    before = g.input("before", "f32", (64,))
    x = g.input("x", "f32", (5, 3))
    i = g.input("i", "i64", (7,))
    after = g.input("after", "f32", (64,))
    g.output(g.op("gather", x, i, axis=0, name="gat"), "y")
    g.output(before * 2.0, "b2")
    g.output(after * 2.0, "a2")
    exe = _compile(backend, g.build())
    compiled, program, _ = exe._specialise({})
    off = np.array(OFFSETS["i64"])
    sentinel = np.full(64, SENTINEL, np.float32)
    feed = {"before": sentinel, "x": _x(), "after": sentinel, "i": off}
    if backend in FLAGS:
        with pytest.raises(InputError, match="out of range"):
            compiled.run(feed)
        return
    raw = compiled.run(feed)
    _check_gather(backend, raw[dict(program.outputs)["y"]], off)


@pytest.mark.parametrize("backend", ["cpu", "wasm"])
def test_device_computed_scatter_index_writes_nothing_outside(backend: str) -> None:
    off = np.array([[5, 0, -6], [1000, -1, -1000]])
    g = GraphBuilder("device_scatter")
    before = g.input("before", "f32", (64,))
    x = g.input("x", "f32", (5, 3))
    after = g.input("after", "f32", (64,))
    i = g.input("i", "i64", (2, 3))
    u = g.input("u", "f32", (2, 3))
    k = g.op("add", i, g.param("off", off))
    g.output(g.op("scatter_add", x, k, u, axis=0, name="sca"), "y")
    g.output(before * 2.0, "b2")
    g.output(after * 2.0, "a2")
    exe = _compile(backend, g.build())
    sentinel = np.full(64, SENTINEL, np.float32)
    feed = {"before": sentinel, "x": _x(), "after": sentinel, "i": np.zeros((2, 3), np.int64),
            "u": np.full((2, 3), 100.0, np.float32)}
    if backend in FLAGS:
        with pytest.raises(InputError, match="out of range"):
            exe.run(feed)
        return
    out = exe.run(feed)
    want = _x().copy()
    want[0, 1] += 100.0
    want[4, 1] += 100.0
    np.testing.assert_array_equal(out["y"], want)
    np.testing.assert_array_equal(out["b2"], 2 * SENTINEL)
    np.testing.assert_array_equal(out["a2"], 2 * SENTINEL)


def test_cuda_bound_index_kernel_compiles(tmp_path: Any) -> None:
    """rlx-cuda's index-bounding kernel (it cannot run here: no GPU) compiles with nvcc, and its
    source does the 64-bit check (no narrowing before the range test)."""
    import shutil
    import subprocess

    pytest.importorskip("rlx_cuda")
    from rlx_cuda import codegen

    from rlx_core.dtypes import DType

    srcs = [codegen.bound_index_source(d) for d in (DType.I32, DType.I64)]
    for _, src in srcs:
        assert "long long v = (long long)idx[i]" in src and "v < 0 || v >= n" in src
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found: the CUDA source is not compiled on this machine")
    cu = tmp_path / "bound.cu"
    cu.write_text("\n".join(s for _, s in srcs))
    r = subprocess.run([nvcc, "-ptx", "-arch=sm_90", "-x", "cu", str(cu), "-o", str(tmp_path / "b.ptx")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    ptx = (tmp_path / "b.ptx").read_text()
    assert all(f".entry {name}" in ptx for name, _ in srcs)
