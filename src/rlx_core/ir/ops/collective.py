"""Collective communication ops: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``,
``all_to_all``, ``send``, ``recv`` and ``comm_rank``.

A graph holding them is one rank's program (SPMD: every rank of a group runs a program with the
same collectives in the same order). Their values depend on the other ranks, so:

* ``reference`` is the single-process value only where one exists (a group of one rank); with more
  ranks it raises :class:`IRError`, which also keeps constant folding away from them. The float64
  oracle over several ranks is ``extra["simulate"]`` (``fn(per_rank_inputs, attrs) ->
  per_rank_outputs``), driven by :func:`rlx_core.distributed.simulate` with simulated ranks.
* no decomposition: a backend claims a collective natively (MPI on cpu, NCCL on cuda) or the graph
  does not compile (the dispatch contract's failure, naming the op).
* conformance: the ordinary generator gets no case (``world`` and the peers are required), the
  cases over N ranks are ``extra["world_cases"]`` (``fn(world, dtype) -> [(case, attrs, shape)]``),
  run by ``rlx conformance BACKEND --world N``.

Attributes shared by the group collectives: ``world`` (ranks in the group, needed for shapes) and
``group`` (the global ranks forming the group, in order; empty: all ranks of the launch).
Gradients follow the SPMD convention (the loss is the sum of every rank's loss): the adjoint of
``all_reduce(sum)`` is ``all_reduce(sum)``, of ``all_gather`` is ``reduce_scatter(sum)`` and back,
of ``all_to_all`` the swapped ``all_to_all``, of ``broadcast`` a sum to the root.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...dtypes import DType
from ...errors import IRError, ShapeError
from ..schema import AttrSpec, CaseSpec, OpSchema, register_op
from ..types import Attrs, TensorType, normalize_axis
from ._common import check_dtypes

#: Dtypes every transport carries without conversion (MPI and NCCL both have them).
COLLECTIVE_DTYPES = (DType.F32, DType.F64, DType.I32, DType.I64)
REDUCTIONS = ("sum", "mean", "max", "min", "prod")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send", "recv",
               "comm_rank")

_WORLD = AttrSpec("world", "int", doc="number of ranks in the group (world=N)")
_GROUP = AttrSpec("group", "ints", default=(), doc="global ranks of the group; () means every rank")
_TAG = AttrSpec("tag", "int", default=0, doc="message tag, to tell apart several transfers to one peer")

PerRank = list[list[np.ndarray]]


def _world(attrs: Attrs, where: str) -> int:
    w = int(attrs["world"])  # type: ignore[arg-type]
    group: Any = attrs.get("group", ())
    if w < 1:
        raise IRError(f"{where}: world={w} must be >= 1", fix="pass the number of ranks in the group")
    if group and len(group) != w:
        raise IRError(f"{where}: group {tuple(group)} has {len(group)} ranks but world={w}",
                      fix="give world=len(group)")
    if group and len(set(group)) != len(group):
        raise IRError(f"{where}: group {tuple(group)} names a rank twice", fix="list each rank once")
    return w


def _no_single(op: str, attrs: Attrs) -> IRError:
    return IRError(f"{op} over {attrs.get('world', '?')} ranks has no single-process value",
                   fix="evaluate the per-rank programs together with rlx_core.distributed.simulate, "
                       "or run them under `rlx launch -n N`")


def _np_reduce(reduction: str, xs: Sequence[np.ndarray]) -> np.ndarray:
    stack = np.stack(xs)
    with np.errstate(all="ignore"):
        if reduction == "sum":
            return stack.sum(axis=0)
        if reduction == "mean":
            return stack.sum(axis=0) / len(xs) if stack.dtype.kind == "f" else stack.sum(axis=0) // len(xs)
        if reduction == "prod":
            return stack.prod(axis=0)
        return stack.max(axis=0) if reduction == "max" else stack.min(axis=0)


# -- all_reduce ----------------------------------------------------------------------------------

def _infer_same(op: str) -> Callable[[Sequence[TensorType], Attrs], list[TensorType]]:
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        check_dtypes(op, ts, COLLECTIVE_DTYPES)
        _world(attrs, op)
        return [ts[0]]
    return infer


def _single(op: str) -> Callable[[Sequence[np.ndarray], Attrs], list[np.ndarray]]:
    def ref(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        if int(attrs["world"]) != 1:  # type: ignore[arg-type]
            raise _no_single(op, attrs)
        return [np.array(xs[0], copy=True)]
    return ref


def _sim_all_reduce(xs: PerRank, attrs: Attrs) -> PerRank:
    r = _np_reduce(str(attrs["reduction"]), [x[0] for x in xs])
    return [[r.copy()] for _ in xs]


def _ar_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g = cts[0]
    red = attrs["reduction"]
    if g is None or not ins[0].dtype.is_float:
        return [None]
    if red not in ("sum", "mean"):
        raise IRError(f"all_reduce({red}) is not differentiable here",
                      fix="differentiate a sum or mean all_reduce, or stop the gradient before it")
    return [b.op("all_reduce", g, **dict(attrs))]


def _lin_jvp(op: str) -> Callable[..., list]:
    def jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
        t = ts[0]
        if t is None or not outs[0].dtype.is_float:
            return [None]
        if op in ("all_reduce", "reduce_scatter") and attrs["reduction"] not in ("sum", "mean"):
            raise IRError(f"{op}({attrs['reduction']}) has no forward-mode rule",
                          fix="use a sum or mean reduction")
        return [b.op(op, t, **dict(attrs))]
    return jvp


# -- all_gather / reduce_scatter / all_to_all -------------------------------------------------------

def _dim(d: Any, f: Callable[[int], int], op: str, what: str) -> Any:
    if isinstance(d, str):
        raise ShapeError(f"{op}: the {what} axis is symbolic ({d!r})",
                         fix="gather or scatter along a static axis, or specialize the graph first")
    return f(int(d))


def _infer_all_gather(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    check_dtypes("all_gather", ts, COLLECTIVE_DTYPES)
    w = _world(attrs, "all_gather")
    x = ts[0]
    ax = normalize_axis(attrs["axis"], x.rank)  # type: ignore[arg-type]
    shape = list(x.shape)
    shape[ax] = _dim(shape[ax], lambda n: n * w, "all_gather", "gathered")
    return [TensorType(x.dtype, tuple(shape))]


def _divided(op: str, n: int, w: int, ax: int) -> int:
    if n % w:
        raise ShapeError(f"{op}: axis {ax} has {n} elements, not divisible by world={w}",
                         fix="pad the axis to a multiple of the world size")
    return n // w


def _infer_reduce_scatter(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    check_dtypes("reduce_scatter", ts, COLLECTIVE_DTYPES)
    w = _world(attrs, "reduce_scatter")
    x = ts[0]
    ax = normalize_axis(attrs["axis"], x.rank)  # type: ignore[arg-type]
    shape = list(x.shape)
    shape[ax] = _dim(shape[ax], lambda n: _divided("reduce_scatter", n, w, ax), "reduce_scatter", "scattered")
    return [TensorType(x.dtype, tuple(shape))]


def _infer_all_to_all(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    check_dtypes("all_to_all", ts, COLLECTIVE_DTYPES)
    w = _world(attrs, "all_to_all")
    x = ts[0]
    sa = normalize_axis(attrs["split_axis"], x.rank)  # type: ignore[arg-type]
    ca = normalize_axis(attrs["concat_axis"], x.rank)  # type: ignore[arg-type]
    shape = list(x.shape)
    shape[sa] = _dim(shape[sa], lambda n: _divided("all_to_all", n, w, sa), "all_to_all", "split")
    shape[ca] = _dim(shape[ca], lambda n: n * w, "all_to_all", "concatenated")
    return [TensorType(x.dtype, tuple(shape))]


def _sim_all_gather(xs: PerRank, attrs: Attrs) -> PerRank:
    ax = normalize_axis(attrs["axis"], xs[0][0].ndim)  # type: ignore[arg-type]
    r = np.concatenate([x[0] for x in xs], axis=ax)
    return [[r.copy()] for _ in xs]


def _sim_reduce_scatter(xs: PerRank, attrs: Attrs) -> PerRank:
    ax = normalize_axis(attrs["axis"], xs[0][0].ndim)  # type: ignore[arg-type]
    total = _np_reduce(str(attrs["reduction"]), [x[0] for x in xs])
    return [[np.ascontiguousarray(p)] for p in np.split(total, len(xs), axis=ax)]


def _sim_all_to_all(xs: PerRank, attrs: Attrs) -> PerRank:
    nd = xs[0][0].ndim
    sa = normalize_axis(attrs["split_axis"], nd)  # type: ignore[arg-type]
    ca = normalize_axis(attrs["concat_axis"], nd)  # type: ignore[arg-type]
    chunks = [np.split(x[0], len(xs), axis=sa) for x in xs]  # chunks[src][dst]
    return [[np.concatenate([chunks[src][dst] for src in range(len(xs))], axis=ca)] for dst in range(len(xs))]


def _ag_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g = cts[0]
    if g is None or not ins[0].dtype.is_float:
        return [None]
    return [b.op("reduce_scatter", g, reduction="sum", **dict(attrs))]


def _rs_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g = cts[0]
    red = attrs["reduction"]
    if g is None or not ins[0].dtype.is_float:
        return [None]
    if red not in ("sum", "mean"):
        raise IRError(f"reduce_scatter({red}) is not differentiable here", fix="use sum or mean")
    a = {k: v for k, v in attrs.items() if k != "reduction"}
    out = b.op("all_gather", g, **a)
    if red == "mean":
        out = out / b.const(float(attrs["world"]), g.dtype)  # type: ignore[arg-type]
    return [out]


def _a2a_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g = cts[0]
    if g is None or not ins[0].dtype.is_float:
        return [None]
    a = dict(attrs)
    a["split_axis"], a["concat_axis"] = attrs["concat_axis"], attrs["split_axis"]
    return [b.op("all_to_all", g, **a)]


# -- broadcast, comm_rank --------------------------------------------------------------------------

def _sim_broadcast(xs: PerRank, attrs: Attrs) -> PerRank:
    root = int(attrs["root"])  # type: ignore[arg-type]
    return [[xs[root][0].copy()] for _ in xs]


def _bc_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g = cts[0]
    if g is None or not ins[0].dtype.is_float:
        return [None]
    a = {k: v for k, v in attrs.items() if k != "root"}
    total = b.op("all_reduce", g, reduction="sum", **a)
    me = b.op("comm_rank", **a)
    is_root = b.op("equal", me, b.const(int(attrs["root"]), DType.I64))  # type: ignore[arg-type]
    return [b.op("where", is_root, total, b.op("mul", total, b.const(0.0, g.dtype)))]


def _infer_broadcast(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    out = _infer_same("broadcast")(ts, attrs)
    root, w = int(attrs["root"]), int(attrs["world"])  # type: ignore[arg-type]
    if not 0 <= root < w:
        raise IRError(f"broadcast: root {root} is not a rank of a group of {w}", fix=f"use 0..{w - 1}")
    return out


def _infer_rank(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _world(attrs, "comm_rank")
    return [TensorType(DType.I64, ())]


def _ref_rank(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    if int(attrs["world"]) != 1:  # type: ignore[arg-type]
        raise _no_single("comm_rank", attrs)
    return [np.asarray(0, np.int64)]


def _sim_rank(xs: PerRank, attrs: Attrs) -> PerRank:
    return [[np.asarray(r, np.int64)] for r in range(len(xs))]


# -- send / recv -----------------------------------------------------------------------------------

def _infer_send(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    check_dtypes("send", ts, COLLECTIVE_DTYPES)
    if int(attrs["peer"]) < 0:  # type: ignore[arg-type]
        raise IRError(f"send: peer {attrs['peer']} is not a rank", fix="give the receiving rank")
    return [ts[0]]


def _infer_recv(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    dt = attrs["dtype"]
    if dt not in COLLECTIVE_DTYPES:
        raise IRError(f"recv: dtype {dt} is not carried", fix=f"use one of {COLLECTIVE_DTYPES}")
    if int(attrs["peer"]) < 0:  # type: ignore[arg-type]
        raise IRError(f"recv: peer {attrs['peer']} is not a rank", fix="give the sending rank")
    return [TensorType(dt, tuple(attrs["shape"]))]  # type: ignore[arg-type]


def _ref_p2p(op: str) -> Callable[[Sequence[np.ndarray], Attrs], list[np.ndarray]]:
    def ref(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        raise IRError(f"{op} to/from rank {attrs['peer']} has no single-process value",
                      fix="evaluate the per-rank programs together with rlx_core.distributed.simulate")
    return ref


def _send_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    """The peer's gradient of what it received comes back (its ``recv`` cannot send it itself: the
    pipeline pass sends it with a ``send`` of the same tag), plus this rank's own use of ``x``."""
    x = ins[0]
    if not x.dtype.is_float:
        return [None]
    back = b.op("recv", peer=attrs["peer"], shape=x.shape, dtype=x.dtype, tag=int(attrs["tag"]) + 1)  # type: ignore[arg-type]
    g = cts[0]
    return [back if g is None else g + back]


def _no_input_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    return []  # no operand: nothing to differentiate (recv's cotangent goes back by the peer's send rule)


def _recv_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    raise IRError("recv has no forward-mode rule (the tangent would need its own transfer)",
                  fix="differentiate pipeline programs in reverse mode")


def _rank_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    return [None]  # an integer index: no tangent


def _send_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    raise IRError("send has no forward-mode rule (the tangent would need its own transfer)",
                  fix="differentiate pipeline programs in reverse mode")


# -- conformance cases over N ranks -----------------------------------------------------------------

Case = tuple[str, dict[str, Any], tuple[int, ...]]


def _cases_reduce(world: int, dt: DType) -> list[Case]:
    reds = ["sum", "max", "min"] + (["mean"] if dt.is_float else [])
    out: list[Case] = [(f"{r}-vector", {"reduction": r}, (7,)) for r in reds]
    out += [("sum-matrix", {"reduction": "sum"}, (3, 5)), ("sum-scalar", {"reduction": "sum"}, ()),
            ("sum-empty", {"reduction": "sum"}, (0, 4)), ("sum-large", {"reduction": "sum"}, (1 << 16,))]
    if world > 1:
        out.append(("sum-subgroup", {"reduction": "sum", "group": tuple(range(0, world, 2)) or (0,)}, (5,)))
    return out


def _cases_gather(world: int, dt: DType) -> list[Case]:
    return [("axis0", {"axis": 0}, (2, 3)), ("axis1", {"axis": 1}, (2, 3)), ("neg-axis", {"axis": -1}, (4,)),
            ("empty", {"axis": 0}, (0, 3))]


def _cases_scatter(world: int, dt: DType) -> list[Case]:
    out: list[Case] = [("sum-axis0", {"axis": 0, "reduction": "sum"}, (2 * world, 3)),
                       ("sum-axis1", {"axis": 1, "reduction": "sum"}, (3, world)),
                       ("max-axis0", {"axis": 0, "reduction": "max"}, (world, 5))]
    if dt.is_float:
        out.append(("mean-axis0", {"axis": 0, "reduction": "mean"}, (world, 4)))
    return out


def _cases_a2a(world: int, dt: DType) -> list[Case]:
    return [("split0-concat0", {"split_axis": 0, "concat_axis": 0}, (2 * world, 3)),
            ("split0-concat1", {"split_axis": 0, "concat_axis": 1}, (world, 3)),
            ("split1-concat0", {"split_axis": 1, "concat_axis": 0}, (2, 3 * world))]


def _cases_broadcast(world: int, dt: DType) -> list[Case]:
    return [(f"root{r}", {"root": r}, (6,)) for r in sorted({0, world - 1})] + [("scalar", {"root": 0}, ())]


def _cases_rank(world: int, dt: DType) -> list[Case]:
    return [("basic", {}, ())] if dt is DType.I64 else []


def _cases_p2p(world: int, dt: DType) -> list[Case]:
    # run as a ring: every rank sends to the next and receives from the previous one
    return [("ring-vector", {}, (9,)), ("ring-matrix", {}, (4, 3)), ("ring-empty", {}, (0,))]


def _schema(name: str, inputs: tuple[str, ...], infer: Any, ref: Any, attrs: tuple[AttrSpec, ...],
            simulate: Callable[[PerRank, Attrs], PerRank] | None, cases: Callable[[int, DType], list[Case]],
            doc: str, **kw: Any) -> OpSchema:
    return register_op(OpSchema(
        name, inputs, infer, ref, attrs=attrs, category="collective", doc=doc,
        dtypes=kw.pop("dtypes", COLLECTIVE_DTYPES), cases=CaseSpec("collective"),
        accuracy=kw.pop("accuracy", "exact"), flops=lambda i, o, a: 0.0,
        extra={"simulate": simulate, "world_cases": cases, "collective": True}, **kw))


_RED = AttrSpec("reduction", "str", default="sum", choices=REDUCTIONS, doc="how the ranks' values combine")

_schema("all_reduce", ("x",), _infer_same("all_reduce"), _single("all_reduce"), (_WORLD, _RED, _GROUP),
        _sim_all_reduce, _cases_reduce, "every rank gets the reduction of every rank's x",
        vjp=_ar_vjp, jvp=_lin_jvp("all_reduce"), accumulates=True, accuracy=None)
_schema("all_gather", ("x",), _infer_all_gather, _single("all_gather"),
        (_WORLD, AttrSpec("axis", "int", default=0), _GROUP), _sim_all_gather, _cases_gather,
        "every rank gets the ranks' x concatenated along axis, in rank order",
        vjp=_ag_vjp, jvp=_lin_jvp("all_gather"))
_schema("reduce_scatter", ("x",), _infer_reduce_scatter, _single("reduce_scatter"),
        (_WORLD, _RED, AttrSpec("axis", "int", default=0), _GROUP), _sim_reduce_scatter, _cases_scatter,
        "the reduction over ranks, split along axis: rank r keeps part r",
        vjp=_rs_vjp, jvp=_lin_jvp("reduce_scatter"), accumulates=True, accuracy=None)
_schema("broadcast", ("x",), _infer_broadcast, _single("broadcast"),
        (_WORLD, AttrSpec("root", "int", default=0), _GROUP), _sim_broadcast, _cases_broadcast,
        "every rank gets the root's x", vjp=_bc_vjp, jvp=_lin_jvp("broadcast"))
_schema("all_to_all", ("x",), _infer_all_to_all, _single("all_to_all"),
        (_WORLD, AttrSpec("split_axis", "int", default=0), AttrSpec("concat_axis", "int", default=0), _GROUP),
        _sim_all_to_all, _cases_a2a,
        "x split along split_axis, part j to rank j; the parts received concatenated along concat_axis",
        vjp=_a2a_vjp, jvp=_lin_jvp("all_to_all"))
_schema("comm_rank", (), _infer_rank, _ref_rank, (_WORLD, _GROUP), _sim_rank, _cases_rank,
        "this rank's index in the group (i64 scalar)", dtypes=(DType.I64,), differentiable=False,
        vjp=_no_input_vjp, jvp=_rank_jvp)
_schema("send", ("x",), _infer_send, _ref_p2p("send"),
        (AttrSpec("peer", "int", doc="the receiving rank (global)"), _TAG), None, _cases_p2p,
        "sends x to rank peer (returns x, so the send is a value a graph can output)",
        vjp=_send_vjp, jvp=_send_jvp)
_schema("recv", (), _infer_recv, _ref_p2p("recv"),
        (AttrSpec("peer", "int", doc="the sending rank (global)"), AttrSpec("shape", "shape"),
         AttrSpec("dtype", "dtype"), _TAG), None, _cases_p2p,
        "receives a tensor of shape and dtype from rank peer", vjp=_no_input_vjp, jvp=_recv_jvp)


def is_collective(op: str) -> bool:
    return op in COLLECTIVES


__all__ = ["COLLECTIVES", "COLLECTIVE_DTYPES", "REDUCTIONS", "is_collective"]
