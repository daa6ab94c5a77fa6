"""The collective ops on CUDA buffers, over NCCL (CuPy's ``cupy.cuda.nccl``).

One NCCL communicator per group of global ranks, bootstrapped through the host process group
(``rlx_core.plugin.collective_world()``, MPI): the group's first rank makes the NCCL unique id and
broadcasts it. A run enqueues the NCCL call on the program's stream, reading and writing the
program's device views directly (no staging through the host: the dispatch report shows no
Transfer for a collective), then waits on an event with the ``RLX_COLLECTIVE_TIMEOUT`` deadline so a
missing peer becomes an error naming the rank and op (the communicator is aborted first).

Nothing here imports CuPy or MPI at module import: :func:`claims` is cheap, the factories import
when bound. Registration (by rlx-cuda's plugin): ``claims()`` appended to ``rlx_kernels`` and
``FACTORIES`` merged into ``kernels.factories()``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from rlx_core.plugin import CollectiveError, DType, KernelClaim, collective_world, normalize_axis

Run = Callable[[], None]
DTYPES = frozenset({DType.F32, DType.F64, DType.I32, DType.I64})
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send", "recv", "comm_rank")

_COMMS: dict[tuple[int, ...], Any] = {}
_LOCK = threading.Lock()


def claims() -> list[KernelClaim]:
    note = "NCCL on the program's stream, device buffers in place"
    return [KernelClaim(op, f"cuda.{op}", dtypes=frozenset({DType.I64}) if op == "comm_rank" else DTYPES,
                        constraint=note) for op in OPS]


def _nccl() -> Any:
    try:
        from cupy.cuda import nccl
    except ImportError as e:
        raise CollectiveError(f"CUDA collectives need CuPy's NCCL bindings ({e})",
                              fix="pip install cupy-cuda12x nvidia-nccl-cu12") from None
    return nccl


def communicator(group: Sequence[int], world: int, op: str) -> tuple[Any, int]:
    """The NCCL communicator of ``group`` (global ranks; empty: all) and this rank's index in it."""
    w = collective_world()
    host, me = w.comm(group, world, op)  # checks the group against the launch
    key = tuple(int(r) for r in group) or tuple(range(w.size))
    with _LOCK:
        comm = _COMMS.get(key)
        if comm is None:
            nccl = _nccl()
            uid = nccl.get_unique_id() if me == 0 else None
            uid = host.bcast(uid, root=0)
            comm = nccl.NcclCommunicator(len(key), uid, me)
            _COMMS[key] = comm
    return comm, me


def _dtype(nccl: Any, dt: Any) -> int:
    import numpy as np

    table = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
             np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.int64): nccl.NCCL_INT64}
    return int(table[np.dtype(dt)])


def _redop(nccl: Any, reduction: str) -> int:
    return int({"sum": nccl.NCCL_SUM, "mean": nccl.NCCL_SUM, "prod": nccl.NCCL_PROD,
                "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}[reduction])


def _stream(b: Any) -> Any:
    import cupy as cp

    s = getattr(b.ctx, "stream", None)
    return s if s is not None else cp.cuda.get_current_stream()


def wait(stream: Any, comm: Any, op: str, detail: str) -> None:
    """Block until ``stream`` has done the collective, or fail after ``RLX_COLLECTIVE_TIMEOUT``."""
    import cupy as cp

    ev = cp.cuda.Event(disable_timing=True)
    ev.record(stream)
    limit = collective_world().timeout()
    deadline = time.monotonic() + limit
    while not ev.done:
        if time.monotonic() > deadline:
            try:
                comm.abort()
            except Exception:  # the communicator is being torn down either way
                pass
            w = collective_world()
            raise CollectiveError(f"{op} (NCCL) did not complete within {limit:g} s on rank {w.rank} of "
                                  f"{w.size} ({detail}): a peer rank is late, stuck or dead",
                                  where=w.describe(),
                                  fix="check the other ranks' errors; every rank must run the same "
                                      "collectives in the same order")
        time.sleep(0.0001)


def _ptr(x: Any) -> int:
    return int(x.data.ptr)


def _mean(o: Any, n: int) -> None:
    if o.dtype.kind == "f":
        o /= n
    else:
        o //= n


def k_all_reduce(b: Any) -> Run:
    nccl = _nccl()
    x, o = b.ins[0], b.outs[0]
    n = int(b.attrs["world"])
    comm, _ = communicator(b.attrs["group"], n, "all_reduce")
    red = str(b.attrs["reduction"])
    dt, op = _dtype(nccl, o.dtype), _redop(nccl, red)

    def run() -> None:
        if o.size == 0:
            return
        s = _stream(b)
        src = x if x.flags.c_contiguous else x.copy()
        comm.allReduce(_ptr(src), _ptr(o), o.size, dt, op, s.ptr)
        if red == "mean":
            with s:
                _mean(o, n)
        wait(s, comm, "all_reduce", f"{o.nbytes} bytes")
    return run


def k_all_gather(b: Any) -> Run:
    import cupy as cp

    nccl = _nccl()
    x, o = b.ins[0], b.outs[0]
    n = int(b.attrs["world"])
    comm, _ = communicator(b.attrs["group"], n, "all_gather")
    ax = normalize_axis(b.attrs["axis"], x.ndim)
    dt = _dtype(nccl, x.dtype)

    def run() -> None:
        if o.size == 0:
            return
        s = _stream(b)
        with s:
            src = cp.ascontiguousarray(x)
            buf = o if ax == 0 else cp.empty((n, *x.shape), x.dtype)
            comm.allGather(_ptr(src), _ptr(buf), x.size, dt, s.ptr)
            if ax != 0:
                o[...] = cp.concatenate(list(buf), axis=ax)
        wait(s, comm, "all_gather", f"{x.nbytes} bytes")
    return run


def k_reduce_scatter(b: Any) -> Run:
    import cupy as cp

    nccl = _nccl()
    x, o = b.ins[0], b.outs[0]
    n = int(b.attrs["world"])
    comm, _ = communicator(b.attrs["group"], n, "reduce_scatter")
    ax = normalize_axis(b.attrs["axis"], x.ndim)
    red = str(b.attrs["reduction"])
    dt, op = _dtype(nccl, x.dtype), _redop(nccl, red)

    def run() -> None:
        if o.size == 0:
            return
        s = _stream(b)
        with s:
            src = cp.ascontiguousarray(x if ax == 0 else cp.stack(cp.split(x, n, axis=ax)))
            dst = o if o.flags.c_contiguous else cp.empty(o.shape, o.dtype)
            comm.reduceScatter(_ptr(src), _ptr(dst), o.size, dt, op, s.ptr)
            if dst is not o:
                o[...] = dst
            if red == "mean":
                _mean(o, n)
        wait(s, comm, "reduce_scatter", f"{x.nbytes} bytes")
    return run


def k_broadcast(b: Any) -> Run:
    nccl = _nccl()
    x, o = b.ins[0], b.outs[0]
    n = int(b.attrs["world"])
    comm, _ = communicator(b.attrs["group"], n, "broadcast")
    root, dt = int(b.attrs["root"]), _dtype(nccl, x.dtype)

    def run() -> None:
        if o.size == 0:
            return
        s = _stream(b)
        src = x if x.flags.c_contiguous else x.copy()
        comm.broadcast(_ptr(src), _ptr(o), o.size, dt, root, s.ptr)
        wait(s, comm, "broadcast", f"{o.nbytes} bytes")
    return run


def k_all_to_all(b: Any) -> Run:
    import cupy as cp

    nccl = _nccl()
    x, o = b.ins[0], b.outs[0]
    n = int(b.attrs["world"])
    comm, _ = communicator(b.attrs["group"], n, "all_to_all")
    sa = normalize_axis(b.attrs["split_axis"], x.ndim)
    ca = normalize_axis(b.attrs["concat_axis"], x.ndim)
    dt = _dtype(nccl, x.dtype)

    def run() -> None:
        if o.size == 0:
            return
        s = _stream(b)
        with s:
            send = cp.ascontiguousarray(cp.stack(cp.split(x, n, axis=sa)))
            recv = cp.empty_like(send)
            k, item = send[0].size, send.itemsize
            nccl.groupStart()
            for peer in range(n):  # grouped point-to-point: NCCL's all-to-all
                comm.send(_ptr(send) + peer * k * item, k, dt, peer, s.ptr)
                comm.recv(_ptr(recv) + peer * k * item, k, dt, peer, s.ptr)
            nccl.groupEnd()
            o[...] = cp.concatenate(list(recv), axis=ca)
        wait(s, comm, "all_to_all", f"{x.nbytes} bytes")
    return run


def k_comm_rank(b: Any) -> Run:
    _, me = communicator(b.attrs["group"], int(b.attrs["world"]), "comm_rank")
    o = b.outs[0]
    return lambda: o.fill(me)


def _p2p(b: Any, op: str) -> tuple[Any, int, int]:
    w = collective_world()
    peer = int(b.attrs["peer"])
    if not 0 <= peer < w.size:
        raise CollectiveError(f"{op} names peer rank {peer}, but the launch has {w.size} ranks",
                              where=w.describe(), fix=f"start it with `rlx launch -n {peer + 1}` or more")
    comm, _ = communicator((), w.size, op)
    return comm, peer, int(b.attrs["tag"])


def k_send(b: Any) -> Run:
    nccl = _nccl()
    x, o = b.ins[0], b.outs[0]
    comm, peer, _ = _p2p(b, "send")  # NCCL orders p2p per peer pair: the tag is implied by order
    dt = _dtype(nccl, x.dtype)

    def run() -> None:
        s = _stream(b)
        src = x if x.flags.c_contiguous else x.copy()
        if x.size:
            comm.send(_ptr(src), x.size, dt, peer, s.ptr)
        if o.data.ptr != x.data.ptr:
            o.data.copy_from_device_async(x.data, o.nbytes, s)
        wait(s, comm, "send", f"{x.nbytes} bytes to rank {peer}")
    return run


def k_recv(b: Any) -> Run:
    nccl = _nccl()
    o = b.outs[0]
    comm, peer, _ = _p2p(b, "recv")
    dt = _dtype(nccl, o.dtype)

    def run() -> None:
        s = _stream(b)
        if o.size:
            comm.recv(_ptr(o), o.size, dt, peer, s.ptr)
        wait(s, comm, "recv", f"{o.nbytes} bytes from rank {peer}")
    return run


FACTORIES: dict[str, Callable[[Any], Run]] = {
    "cuda.all_reduce": k_all_reduce, "cuda.all_gather": k_all_gather, "cuda.reduce_scatter": k_reduce_scatter,
    "cuda.broadcast": k_broadcast, "cuda.all_to_all": k_all_to_all, "cuda.comm_rank": k_comm_rank,
    "cuda.send": k_send, "cuda.recv": k_recv,
}

__all__ = ["FACTORIES", "OPS", "claims", "communicator", "wait"]
