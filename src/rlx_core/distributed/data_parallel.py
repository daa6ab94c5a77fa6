"""Data-parallel training: every rank holds the whole model and 1/N of each global batch; the
gradients are averaged with ``all_reduce(mean)`` before the (identical) optimizer update, so every
rank takes the single-process step on the global batch (for a loss that is a mean over the batch).

Gradients are flattened into buckets of at most ``bucket_bytes`` (one all_reduce per bucket, not
per parameter: fewer, larger messages), in the order backward produces them, so a backend that runs
a collective asynchronously can overlap a bucket's all_reduce with the rest of backward. rlx-cpu
runs its steps in order (an all_reduce blocks its rank), so there it is bucketing without overlap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import IRError, ShapeError
from ..ir.builder import Tensor
from ..ir.graph import Graph
from ..optim import Optimizer, trainable_params

DEFAULT_BUCKET_BYTES = 1 << 20


def _buckets(grads: Sequence[tuple[str, Tensor]], bucket_bytes: int) -> list[list[tuple[str, Tensor]]]:
    out: list[list[tuple[str, Tensor]]] = []
    cur: list[tuple[str, Tensor]] = []
    size = 0
    for name, g in grads:
        nb = math.prod(int(d) for d in g.shape) * g.dtype.np.itemsize
        if cur and (size + nb > bucket_bytes or g.dtype != cur[0][1].dtype):
            out.append(cur)
            cur, size = [], 0
        cur.append((name, g))
        size += nb
    if cur:
        out.append(cur)
    return out


def allreduce_mean(b: Any, grads: Mapping[str, Tensor], world: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                   group: Sequence[int] = ()) -> dict[str, Tensor]:
    """``grads`` averaged over the ranks, one ``all_reduce(mean)`` per bucket of flattened gradients."""
    out: dict[str, Tensor] = {}
    for bucket in _buckets(list(grads.items()), bucket_bytes):
        if any(isinstance(d, str) for _, g in bucket for d in g.shape):
            raise ShapeError("data-parallel gradients need static shapes",
                             fix="give the parameters static shapes")
        if len(bucket) == 1:
            name, g = bucket[0]
            out[name] = b.op("all_reduce", g, world=world, reduction="mean", group=tuple(group))
            continue
        flat = [b.op("reshape", g, shape=(math.prod(int(d) for d in g.shape),)) for _, g in bucket]
        red = b.op("all_reduce", b.op("concat", *flat, axis=0), world=world, reduction="mean",
                   group=tuple(group))
        at = 0
        for name, g in bucket:
            n = math.prod(int(d) for d in g.shape)
            part = b.op("slice", red, starts=(at,), stops=(at + n,), axes=(0,))
            out[name] = b.op("reshape", part, shape=tuple(int(d) for d in g.shape))
            at += n
    return out


def dp_train_step_graph(model_graph: Graph, loss_output: str, params: Sequence[str] | None,
                        optimizer: Optimizer, world: int, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                        group: Sequence[int] = (), step_name: str = "step") -> Graph:
    """:func:`rlx_core.optim.train_step_graph` for one of ``world`` data-parallel ranks: the same
    inputs and outputs (the loss named ``<loss>.global``), gradients averaged over the ranks, and
    the loss the global mean."""
    from ..autodiff._util import full, zeros_like
    from ..autodiff.transforms import Trace, _check_scalar, _check_values, params_as_inputs

    params = trainable_params(model_graph) if params is None else list(params)
    if not params:
        raise IRError("dp_train_step_graph: no parameters to train", fix="pass params=[...]")
    _check_values(model_graph, [loss_output], "loss")
    _check_values(model_graph, params, "params")
    _check_scalar(model_graph, loss_output)
    graph = params_as_inputs(model_graph, params)
    tr = Trace(graph, differentiate=params, mode="vjp", name=f"{model_graph.name}_dp{world}_train_step")
    value = tr.env[loss_output]
    grads = tr.gradients({loss_output: full(tr.b, 1.0, value.shape, value.dtype)}, params)
    gmap = {p: gp if (gp := grads[p]) is not None else zeros_like(tr.b, tr.env[p]) for p in params}
    # backward produces the last layer's gradients first: bucket in that order
    order = list(reversed(params))
    avg = allreduce_mean(tr.b, {p: gmap[p] for p in order}, world, bucket_bytes, group)
    loss = tr.b.op("all_reduce", value, world=world, reduction="mean", group=tuple(group))
    ptypes = {p: graph.types[p] for p in params}
    names = optimizer.state_names(ptypes)
    state: dict[str, Tensor] = {}
    for p in params:
        for slot in optimizer.slots(ptypes[p].shape):
            s = f"{p}.{slot}"
            state[s] = tr.b.input(s, ptypes[p].dtype, ptypes[p].shape)
    step = tr.b.input(step_name, DType.I64, ())
    new_p, new_s = optimizer.build_update(tr.b, {p: tr.env[p] for p in params}, avg, state, step)
    outs = [(loss, tr.unique(f"{loss_output}.global"))]
    outs += [(new_p[p], tr.unique(f"{p}.next")) for p in params]
    outs += [(new_s[s], tr.unique(f"{s}.next")) for s in names]
    return tr.finish(outs)


class DataParallelTrainer:
    """:class:`rlx_core.optim.Trainer` over the ranks of a launch: ``step`` takes the global batch
    (every rank passes the same one, or ``shard=False`` and its own part) and returns the global loss.

    Run it under ``rlx launch -n N``; the batch must split evenly over the ranks."""

    def __init__(self, model_graph: Graph, loss_output: str, optimizer: Optimizer,
                 params: Sequence[str] | None = None, *, device: str = "cpu", world: int | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, batch_inputs: Sequence[str] | None = None,
                 step_name: str = "step") -> None:
        from ..runtime import Session
        from .runtime import world as get_world

        w = get_world()
        self.world = w.size if world is None else int(world)
        self.rank = w.rank
        self.params = trainable_params(model_graph) if params is None else list(params)
        self.graph = dp_train_step_graph(model_graph, loss_output, self.params, optimizer, self.world,
                                         bucket_bytes=bucket_bytes, step_name=step_name)
        self.batch_inputs = ([v.name for v in model_graph.inputs] if batch_inputs is None
                             else list(batch_inputs))
        self.values = {p: np.array(model_graph.weights[p], copy=True) for p in self.params}
        self.state = optimizer.init_state(self.values)
        self.state_names = optimizer.state_names(self.values)
        self.step_name = step_name
        self.steps = 0
        self.executable = Session(device).compile(self.graph)
        outs = self.graph.outputs
        self._loss = outs[0]
        self._param_outs = outs[1:1 + len(self.params)]
        self._state_outs = outs[1 + len(self.params):]

    def shard(self, name: str, x: np.ndarray) -> np.ndarray:
        n = x.shape[0]
        if n % self.world:
            raise ShapeError(f"input {name!r}: global batch {n} does not split over {self.world} ranks",
                             fix=f"use a batch that is a multiple of {self.world}")
        k = n // self.world
        return x[self.rank * k:(self.rank + 1) * k]

    def step(self, inputs: Mapping[str, Any] | None = None, *, shard: bool = True, **data: Any) -> float:
        feed = {**dict(inputs or {}), **data}
        if shard:
            feed = {k: self.shard(k, np.asarray(v)) if k in self.batch_inputs else v for k, v in feed.items()}
        out = self.executable.run({**feed, **self.values, **self.state,
                                   self.step_name: np.asarray(self.steps, np.int64)})
        for p, o in zip(self.params, self._param_outs):
            self.values[p] = out[o]
        for s, o in zip(self.state_names, self._state_outs):
            self.state[s] = out[o]
        self.steps += 1
        return float(np.asarray(out[self._loss]).reshape(()))


__all__ = ["DEFAULT_BUCKET_BYTES", "DataParallelTrainer", "allreduce_mean", "dp_train_step_graph"]
