"""rlx-cuda's NCCL collectives (issue 22) as far as one GPU goes: a single-rank communicator, send
and recv to self, device-buffer plumbing (results in the program's own device views). Skipped
without a GPU, CuPy's NCCL or mpi4py; the multi-GPU run is the next issue's.

    pytest plugins/rlx-cuda/tests/test_cuda_collectives.py
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rlx_core.dtypes import DType


def test_claims_without_importing_cupy_or_mpi() -> None:
    before = {m for m in ("cupy", "mpi4py") if m in sys.modules}
    from rlx_cuda import collectives

    names = {c.name for c in collectives.claims()}
    assert names == {f"cuda.{op}" for op in collectives.OPS} == set(collectives.FACTORIES)
    assert all(DType.F32 in c.dtypes for c in collectives.claims() if c.op != "comm_rank")
    assert {m for m in ("cupy", "mpi4py") if m in sys.modules} == before


def _why() -> str | None:
    try:
        import cupy as cp
        import mpi4py  # noqa: F401
        from cupy.cuda import nccl  # noqa: F401
    except ImportError as e:
        return str(e)
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as e:  # no driver
        return str(e)
    return None


WHY = _why()
gpu = pytest.mark.skipif(WHY is not None, reason=f"needs a CUDA GPU with NCCL and mpi4py: {WHY}")


def _bound(ins: list[Any], outs: list[Any], **attrs: Any) -> Any:
    import cupy as cp

    return SimpleNamespace(ins=ins, outs=outs, attrs=attrs, ctx=SimpleNamespace(stream=cp.cuda.Stream()))


@gpu
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int32, np.int64])
def test_single_rank_collectives(dt: Any) -> None:
    import cupy as cp
    from rlx_cuda import collectives as c

    x_h = (np.arange(24).reshape(4, 6) - 7).astype(dt)
    x = cp.asarray(x_h)
    for name, attrs, want in [
        ("all_reduce", {"reduction": "sum"}, x_h), ("all_reduce", {"reduction": "mean"}, x_h),
        ("all_gather", {"axis": 1}, x_h), ("reduce_scatter", {"axis": 0, "reduction": "max"}, x_h),
        ("broadcast", {"root": 0}, x_h), ("all_to_all", {"split_axis": 0, "concat_axis": 1}, x_h),
    ]:
        out = cp.full(x_h.shape, 99, dt)
        b = _bound([x], [out], world=1, group=(), **attrs)
        c.FACTORIES[f"cuda.{name}"](b)()
        b.ctx.stream.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(out), want, err_msg=name)
    r = cp.full((), 7, np.int64)
    c.FACTORIES["cuda.comm_rank"](_bound([], [r], world=1, group=()))()
    assert int(r) == 0


@gpu
def test_send_recv_to_self_and_device_views() -> None:
    import cupy as cp
    from cupy.cuda import nccl
    from rlx_cuda.collectives import communicator

    comm, me = communicator((), 1, "test")
    assert me == 0
    arena = cp.zeros(64, np.float32)  # a program's arena: views at offsets, as CudaProgram binds them
    src, dst = arena[:16], arena[32:48]
    src[...] = cp.arange(16, dtype=np.float32)
    s = cp.cuda.Stream()
    nccl.groupStart()  # a self send/recv must be grouped, or the send waits for a recv never posted
    comm.send(src.data.ptr, 16, nccl.NCCL_FLOAT32, 0, s.ptr)
    comm.recv(dst.data.ptr, 16, nccl.NCCL_FLOAT32, 0, s.ptr)
    nccl.groupEnd()
    s.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(dst), np.arange(16, dtype=np.float32))
    assert float(arena[16:32].sum()) == 0.0  # nothing written outside the view


@gpu
def test_session_compiles_collectives_natively() -> None:
    """rlx-cuda's plugin registers claims() and FACTORIES: a graph runs on the device views."""
    from rlx_core import GraphBuilder, Session

    g = GraphBuilder("g")
    x = g.input("x", "f32", (3, 4))
    g.output(g.op("all_reduce", x, world=1, reduction="sum"), "y")
    exe = Session("cuda").compile(g.build())
    xv = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(exe.run({"x": xv})["y"], xv)
    assert not any(t for t in exe.report.to_text().splitlines() if "Transfer" in t and "all_reduce" in t)
