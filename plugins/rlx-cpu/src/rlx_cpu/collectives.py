"""The collective ops on the host, over MPI (Open MPI through mpi4py).

Each kernel is bound once to its planned input/output views; a run makes one blocking MPI call (Open
MPI's tuned algorithms: the speed of raw ``mpi4py``) through ``collective_world().call``, whose
watchdog turns a peer missing for ``RLX_COLLECTIVE_TIMEOUT`` into an error naming this rank and the
op, and ends the launch. mpi4py is imported, and MPI
initialised, when the first collective kernel is bound, never when the plugin is discovered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import Attrs, CollectiveError, collective_world, normalize_axis

Run = Callable[[], None]
Factory = Callable[[Sequence[np.ndarray], Sequence[np.ndarray], Attrs], Run]


def _op(world: Any, reduction: str) -> Any:
    m = world.MPI
    return {"sum": m.SUM, "mean": m.SUM, "max": m.MAX, "min": m.MIN, "prod": m.PROD}[reduction]


def _contig(x: np.ndarray) -> np.ndarray:
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


def _detail(x: np.ndarray, group: Any) -> str:
    return f"{x.nbytes} bytes, group {tuple(group) or 'all ranks'}"


def _mean(out: np.ndarray, n: int) -> None:
    if out.dtype.kind == "f":
        np.divide(out, n, out=out)
    else:  # integer mean rounds toward -inf, as the reference (floor division)
        np.floor_divide(out, n, out=out)


def k_all_reduce(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    w = collective_world()
    x, out = ins[0], outs[0]
    comm, _ = w.comm(attrs["group"], int(attrs["world"]), "all_reduce")  # type: ignore[arg-type]
    red = str(attrs["reduction"])
    op, n, detail = _op(w, red), int(attrs["world"]), _detail(x, attrs["group"])  # type: ignore[arg-type]
    in_place = w.MPI.IN_PLACE

    def run() -> None:
        if out.size == 0:
            return
        if out.flags.c_contiguous:
            src = in_place if np.shares_memory(x, out) else _contig(x)
            w.call(lambda: comm.Allreduce(src, out, op), "all_reduce", detail)
        else:
            tmp = np.empty(out.shape, out.dtype)
            w.call(lambda: comm.Allreduce(_contig(x), tmp, op), "all_reduce", detail)
            out[...] = tmp
        if red == "mean":
            _mean(out, n)
    return run


def _stacked(x: np.ndarray, n: int, axis: int) -> np.ndarray:
    """``x`` split in ``n`` parts along ``axis``, the parts contiguous one after another."""
    return np.ascontiguousarray(np.stack(np.split(x, n, axis=axis)))


def k_all_gather(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    w = collective_world()
    x, out = ins[0], outs[0]
    n = int(attrs["world"])  # type: ignore[arg-type]
    comm, _ = w.comm(attrs["group"], n, "all_gather")  # type: ignore[arg-type]
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    detail = _detail(x, attrs["group"])
    direct = ax == 0 and out.flags.c_contiguous  # rank order along axis 0 is MPI's own layout

    def run() -> None:
        if out.size == 0:
            return
        if direct:
            w.call(lambda: comm.Allgather(_contig(x), out), "all_gather", detail)
            return
        buf = np.empty((n, *x.shape), x.dtype)
        w.call(lambda: comm.Allgather(_contig(x), buf), "all_gather", detail)
        out[...] = np.concatenate(list(buf), axis=ax)
    return run


def k_reduce_scatter(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    w = collective_world()
    x, out = ins[0], outs[0]
    n = int(attrs["world"])  # type: ignore[arg-type]
    comm, _ = w.comm(attrs["group"], n, "reduce_scatter")  # type: ignore[arg-type]
    ax = normalize_axis(attrs["axis"], x.ndim)  # type: ignore[arg-type]
    red = str(attrs["reduction"])
    op, detail = _op(w, red), _detail(x, attrs["group"])

    def run() -> None:
        if out.size == 0:
            return
        send = _contig(x) if ax == 0 else _stacked(x, n, ax)
        dst = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        w.call(lambda: comm.Reduce_scatter_block(send, dst, op), "reduce_scatter", detail)
        if dst is not out:
            out[...] = dst
        if red == "mean":
            _mean(out, n)
    return run


def k_all_to_all(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    w = collective_world()
    x, out = ins[0], outs[0]
    n = int(attrs["world"])  # type: ignore[arg-type]
    comm, _ = w.comm(attrs["group"], n, "all_to_all")  # type: ignore[arg-type]
    sa = normalize_axis(attrs["split_axis"], x.ndim)  # type: ignore[arg-type]
    ca = normalize_axis(attrs["concat_axis"], x.ndim)  # type: ignore[arg-type]
    detail = _detail(x, attrs["group"])

    def run() -> None:
        if out.size == 0:
            return
        send = _stacked(x, n, sa)
        recv = np.empty_like(send)
        w.call(lambda: comm.Alltoall(send, recv), "all_to_all", detail)
        out[...] = np.concatenate(list(recv), axis=ca)
    return run


def k_broadcast(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    w = collective_world()
    x, out = ins[0], outs[0]
    n = int(attrs["world"])  # type: ignore[arg-type]
    comm, _ = w.comm(attrs["group"], n, "broadcast")  # type: ignore[arg-type]
    root, detail = int(attrs["root"]), _detail(x, attrs["group"])  # type: ignore[arg-type]

    def run() -> None:
        if out.size == 0:
            return
        buf = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        if not np.shares_memory(x, buf):
            buf[...] = x
        w.call(lambda: comm.Bcast(buf, root=root), "broadcast", detail)
        if buf is not out:
            out[...] = buf
    return run


def k_comm_rank(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    w = collective_world()
    _, me = w.comm(attrs["group"], int(attrs["world"]), "comm_rank")  # type: ignore[arg-type]
    out = outs[0]
    return lambda: out.fill(me)


def _peer(w: Any, attrs: Attrs, op: str) -> int:
    peer = int(attrs["peer"])  # type: ignore[arg-type]
    if not 0 <= peer < w.size:
        raise CollectiveError(f"{op} names peer rank {peer}, but the launch has {w.size} ranks",
                              where=w.describe(), fix=f"start it with `rlx launch -n {peer + 1}` or more")
    return peer


def k_send(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    w = collective_world()
    x, out = ins[0], outs[0]
    peer, tag = _peer(w, attrs, "send"), int(attrs["tag"])  # type: ignore[arg-type]
    detail = f"{x.nbytes} bytes to rank {peer}, tag {tag}"

    def run() -> None:
        data = _contig(x)
        w.call(lambda: w.base.Send(data, dest=peer, tag=tag), "send", detail)
        if not np.shares_memory(x, out):
            out[...] = x
    return run


def k_recv(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    w = collective_world()
    out = outs[0]
    peer, tag = _peer(w, attrs, "recv"), int(attrs["tag"])  # type: ignore[arg-type]
    detail = f"{out.nbytes} bytes from rank {peer}, tag {tag}"

    def run() -> None:
        buf = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        w.call(lambda: w.base.Recv(buf, source=peer, tag=tag), "recv", detail)
        if buf is not out:
            out[...] = buf
    return run


FACTORIES: dict[str, Factory] = {
    "cpu.all_reduce": k_all_reduce, "cpu.all_gather": k_all_gather, "cpu.reduce_scatter": k_reduce_scatter,
    "cpu.all_to_all": k_all_to_all, "cpu.broadcast": k_broadcast, "cpu.comm_rank": k_comm_rank,
    "cpu.send": k_send, "cpu.recv": k_recv,
}

__all__ = ["FACTORIES"]
