"""Mixed-precision training: f16/bf16 compute, f32 master weights, dynamic loss scaling.

Three pieces, each a graph transformation or a graph fragment like :mod:`rlx_core.optim`:

* :func:`autocast` rewrites a float32 model graph the way ``torch.autocast`` runs it: the
  matrix-product class of ops (``linear``, ``matmul``, ``conv2d``, ``conv2d_bias``, ``attention``) in
  the compute dtype, the precision-sensitive ops (softmaxes, norms, reductions, ``exp``/``log``/``pow``,
  cumulative sums) in f32, and every other op at the widest float dtype of its operands, where builder
  constants (``const_<k>``) are *weak* and follow the other operand (so ``relu`` = ``maximum(x, 0)``
  stays in the compute dtype). Parameters stay f32 and are cast where they are used, so the
  gradient of the cast carries the f32 master weights' gradient; float outputs are cast back to f32.
* :func:`amp_train_step_graph` builds forward, backward, loss scaling and the optimizer update as
  ONE graph. The backward pass is seeded with the loss scale (so every gradient is scaled, in the
  compute dtype too), gradients are unscaled in f32, and one flag says whether any of them is
  inf/NaN (``sum(g * 0)`` is NaN exactly then). With the flag set the step is skipped (parameters and
  optimizer state pass through unchanged) and the scale backs off; otherwise the update applies and
  the scale grows after ``growth_interval`` good steps in a row — ``torch.amp.GradScaler``'s rule.
* :class:`AmpTrainer` compiles it once and feeds parameters, optimizer state, the scale and the
  growth tracker back each step; the optimizer's step counter counts applied updates only.

Inputs of the step graph: the model's inputs, the parameters (f32), the optimizer state, ``step``
(i64), ``loss_scale`` (f32 scalar), ``growth_tracker`` (i64 scalar). Outputs: the unscaled f32 loss,
the new parameters, the new state, ``loss_scale.next``, ``growth_tracker.next``, ``found_inf``
(f32 scalar, 1 when the step was skipped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import DType
from .errors import IRError
from .ir.builder import Tensor
from .ir.graph import Graph
from .ir.schema import REGISTRY


def _amp_class(op: str) -> str | None:
    """The op's autocast class from its schema (``OpSchema.amp``): "low", "f32" or None."""
    return REGISTRY.get(op).amp if op in REGISTRY else None


def _ops_of_class(cls: str) -> frozenset[str]:
    return frozenset(s.name for s in REGISTRY.schemas() if s.amp == cls)


#: Ops run in the compute dtype (the matrix-product class: most FLOPs, tolerant of half inputs),
#: and ops always run in f32 (range or accumulation sensitive, like torch.autocast's fp32 list):
#: the ops registered at import whose schema says ``amp="low"`` / ``amp="f32"``.
LOW_PRECISION_OPS = _ops_of_class("low")
FP32_OPS = _ops_of_class("f32")
HALF_DTYPES = (DType.F16, DType.BF16)


def _dtype(d: DType | str) -> DType:
    dt = DType.parse(d)
    if dt not in (*HALF_DTYPES, DType.F32):
        raise IRError(f"mixed precision computes in f16, bf16 (or f32 for a reference run), not {dt}",
                      fix="pass compute_dtype='bf16' or 'f16'")
    return dt


def _weak_params(graph: Graph, params: Sequence[str]) -> set[str]:
    """Builder constants (non-trainable float parameters): they adopt their partner's dtype."""
    return {p.name for p in graph.params if p.name not in params and p.type.dtype.is_float}


def autocast(graph: Graph, compute_dtype: DType | str = "bf16", params: Sequence[str] | None = None,
             *, name: str | None = None) -> Graph:
    """``graph`` (float32) with autocast precision: see the module docstring. ``params`` are the
    trainable parameters (default :func:`rlx_core.optim.trainable_params`); they stay f32."""
    from .autodiff._util import ADBuilder
    from .optim import trainable_params

    cd = _dtype(compute_dtype)
    params = trainable_params(graph) if params is None else list(params)
    for v in [*graph.inputs, *graph.params]:
        if v.type.dtype.is_float and v.type.dtype is not DType.F32 and v.name in params:
            raise IRError(f"autocast: parameter {v.name!r} is {v.type.dtype}; master weights are f32",
                          fix="build the model in f32")
    reserved = set(graph.types) | {n.name for n in graph.nodes}
    b = ADBuilder(name or f"{graph.name}_{cd.value}", reserved)
    env: dict[str, Tensor] = {}
    weak = _weak_params(graph, params)
    for v in graph.inputs:
        env[v.name] = b.input(v.name, v.type.dtype, v.type.shape)
    for p in graph.params:
        env[p.name] = b.param(p.name, graph.weights[p.name], p.type.dtype)
    casts: dict[tuple[str, DType], Tensor] = {}

    def cast(t: Tensor, dt: DType) -> Tensor:
        if not t.dtype.is_float or t.dtype == dt:
            return t
        key = (t.name, dt)
        if key not in casts:
            casts[key] = b.op("cast", t, to=dt)
        return casts[key]

    for node in graph.nodes:
        ins = [env[i] for i in node.inputs]
        floats = [t for t in ins if t.dtype.is_float]
        strong = [t for i, t in zip(node.inputs, ins) if t.dtype.is_float and i not in weak]
        if node.op == "cast" or not floats:
            target = None
        elif (amp := _amp_class(node.op)) == "low":
            target = cd
        elif amp == "f32":
            target = DType.F32
        elif strong:
            kinds = {t.dtype for t in strong}
            target = kinds.pop() if len(kinds) == 1 else DType.F32
        else:
            target = None  # only constants: leave as built
        if target is not None:
            ins = [cast(t, target) for t in ins]
        out = b.op(node.op, *ins, name=None, **dict(node.attrs))  # a fresh name; attrs never hold one
        outs = out if isinstance(out, tuple) else (out,)
        env.update(zip(node.outputs, outs))
        if all(i in weak for i, t in zip(node.inputs, ins) if t.dtype.is_float) and node.inputs:
            weak.update(o for o, t in zip(node.outputs, outs) if t.dtype.is_float)
    for o in graph.outputs:
        t = env[o]
        want = graph.types[o].dtype
        b.output(b.op("cast", t, to=want) if t.dtype != want else t, o)
    return b.build()


@dataclass(frozen=True)
class LossScaler:
    """Dynamic loss scaling (``torch.amp.GradScaler``'s rule): on an inf/NaN gradient skip the step
    and multiply the scale by ``backoff_factor``; after ``growth_interval`` finite steps in a row
    multiply it by ``growth_factor``. ``enabled=False`` keeps the scale at 1 (bf16 rarely needs
    scaling) but still skips non-finite steps."""

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.enabled and not (self.growth_factor >= 1.0 and 0.0 < self.backoff_factor <= 1.0
                                 and self.init_scale > 0 and self.growth_interval >= 1):
            raise ValueError("LossScaler: need init_scale > 0, growth_factor >= 1, 0 < backoff_factor <= 1, "
                             "growth_interval >= 1")

    @property
    def initial(self) -> float:
        return float(self.init_scale) if self.enabled else 1.0


def default_scaler(compute_dtype: DType | str) -> LossScaler:
    """f16 needs loss scaling (5 exponent bits); bf16 has f32's range."""
    return LossScaler() if _dtype(compute_dtype) is DType.F16 else LossScaler(enabled=False)


def amp_train_step_graph(model_graph: Graph, loss_output: str, params: Sequence[str] | None, optimizer: Any,
                         *, compute_dtype: DType | str = "bf16", scaler: LossScaler | None = None,
                         step_name: str = "step", name: str | None = None) -> Graph:
    """One mixed-precision training step as one graph (inputs and outputs: module docstring)."""
    from .autodiff._util import zeros_like
    from .autodiff.transforms import Trace, _check_scalar, _check_values, params_as_inputs
    from .optim import trainable_params

    cd = _dtype(compute_dtype)
    scaler = scaler or default_scaler(cd)
    params = trainable_params(model_graph) if params is None else list(params)
    if not params:
        raise IRError("amp_train_step_graph: no parameters to train", fix="pass params=[...]")
    _check_values(model_graph, [loss_output], "loss")
    _check_values(model_graph, params, "params")
    _check_scalar(model_graph, loss_output)
    cast_graph = autocast(model_graph, cd, params)
    graph = params_as_inputs(cast_graph, params)
    tr = Trace(graph, differentiate=params, mode="vjp", name=name or f"{model_graph.name}_amp_step")
    b = tr.b
    f32, i64 = DType.F32, DType.I64
    ptypes = {p: graph.types[p] for p in params}
    names = optimizer.state_names(ptypes)
    for s in [*names, step_name, "loss_scale", "growth_tracker", "found_inf"]:
        if tr.unique(s) != s:
            raise IRError(f"amp_train_step_graph: the name {s!r} is already used in the model",
                          fix="rename the model value, or pass another step_name")
    value = tr.env[loss_output]
    scale = b.input("loss_scale", f32, ())
    tracker = b.input("growth_tracker", i64, ())
    seed = scale if value.dtype == f32 else b.op("cast", scale, to=value.dtype)
    if value.shape != ():
        seed = b.op("reshape", seed, shape=value.shape)
    grads = tr.gradients({loss_output: seed}, params)
    inv = b.const(1.0, f32) / scale
    unscaled: dict[str, Tensor] = {}
    nonfinite: Tensor | None = None
    zero = b.const(0.0, f32)
    for p in params:
        g = grads[p]
        if g is None:
            unscaled[p] = zeros_like(b, tr.env[p])
            continue
        g = g if g.dtype == f32 else b.op("cast", g, to=f32)
        g = g * inv
        unscaled[p] = g
        z = b.op("reduce_sum", g * zero, axes=None, keepdims=False)  # NaN iff some element is inf/NaN
        nonfinite = z if nonfinite is None else nonfinite + z
    found = b.op("not_equal", nonfinite, zero) if nonfinite is not None else b.op("not_equal", zero, zero)
    state: dict[str, Tensor] = {}
    for p in params:
        for slot in optimizer.slots(ptypes[p].shape):
            s = f"{p}.{slot}"
            state[s] = b.input(s, ptypes[p].dtype, ptypes[p].shape)
    step = b.input(step_name, i64, ())
    new_p, new_s = optimizer.build_update(b, {p: tr.env[p] for p in params}, unscaled, state, step)
    keep_p = {p: b.op("where", found, tr.env[p], new_p[p]) for p in params}
    keep_s = {s: b.op("where", found, state[s], new_s[s]) for s in names}
    # The scale: back off on overflow; grow after growth_interval good steps in a row.
    if scaler.enabled:
        one_i = b.const(1, i64)
        t1 = tracker + one_i
        grow = b.op("greater_equal", t1, b.const(scaler.growth_interval, i64))
        grown = b.op("where", grow, scale * b.const(scaler.growth_factor, f32), scale)
        new_scale = b.op("where", found, scale * b.const(scaler.backoff_factor, f32), grown)
        zero_i = b.const(0, i64)
        new_tracker = b.op("where", found, zero_i, b.op("where", grow, zero_i, t1))
    else:
        new_scale = scale * b.const(1.0, f32)
        new_tracker = tracker + b.const(0, i64)
    loss32 = value if value.dtype == f32 else b.op("cast", value, to=f32)
    outs = [(loss32, loss_output)]
    outs += [(keep_p[p], tr.unique(f"{p}.next")) for p in params]
    outs += [(keep_s[s], tr.unique(f"{s}.next")) for s in names]
    outs += [(new_scale, "loss_scale.next"), (new_tracker, "growth_tracker.next"),
             (b.op("cast", found, to=f32), "found_inf")]
    return tr.finish(outs)


class AmpTrainer:
    """Compile :func:`amp_train_step_graph` once; hold f32 master weights, optimizer state, the
    loss scale and the growth tracker as arrays and feed them back each step::

        t = AmpTrainer(model, "loss", SGD(lr=0.02, momentum=0.9), compute_dtype="f16")
        for xb, yb in batches:
            loss = t.step(x=xb, y=yb)     # f32 loss; t.skipped counts overflowed steps
        t.loss_scale, t.model()
    """

    def __init__(self, model_graph: Graph, loss_output: str, optimizer: Any,
                 params: Sequence[str] | None = None, *, compute_dtype: DType | str = "bf16",
                 scaler: LossScaler | None = None, device: str | None = "cpu", session: Any = None,
                 step_name: str = "step") -> None:
        from .optim import trainable_params
        from .runtime import Session

        self.model_graph = model_graph
        self.optimizer = optimizer
        self.compute_dtype = _dtype(compute_dtype)
        self.scaler = scaler or default_scaler(self.compute_dtype)
        self.params = trainable_params(model_graph) if params is None else list(params)
        self.graph = amp_train_step_graph(model_graph, loss_output, self.params, optimizer,
                                          compute_dtype=self.compute_dtype, scaler=self.scaler,
                                          step_name=step_name)
        self.values = {p: np.array(model_graph.weights[p], np.float32, copy=True) for p in self.params}
        self.state = optimizer.init_state(self.values)
        self.state_names = optimizer.state_names(self.values)
        self.step_name = step_name
        self.steps = 0  # optimizer updates applied
        self.skipped = 0
        self.scale = np.asarray(self.scaler.initial, np.float32)
        self.tracker = np.asarray(0, np.int64)
        self.scale_history: list[float] = []
        self.session = session if session is not None else Session(device)
        self.executable = self.session.compile(self.graph)
        outs = self.graph.outputs
        n, m = len(self.params), len(self.state_names)
        self._loss = outs[0]
        self._param_outs = outs[1:1 + n]
        self._state_outs = outs[1 + n:1 + n + m]

    @property
    def loss_scale(self) -> float:
        return float(self.scale)

    def step(self, inputs: Mapping[str, Any] | None = None, **data: Any) -> float:
        """One step; returns the (unscaled, f32) loss. An overflowed step changes nothing but the
        scale, and does not count in :attr:`steps`."""
        feed = {**dict(inputs or {}), **data, **self.values, **self.state,
                self.step_name: np.asarray(self.steps, np.int64), "loss_scale": self.scale,
                "growth_tracker": self.tracker}
        out = self.executable.run(feed)
        for p, o in zip(self.params, self._param_outs):
            self.values[p] = out[o]
        for s, o in zip(self.state_names, self._state_outs):
            self.state[s] = out[o]
        self.scale_history.append(float(self.scale))
        self.scale = out["loss_scale.next"]
        self.tracker = out["growth_tracker.next"]
        if float(out["found_inf"]) != 0.0:
            self.skipped += 1
        else:
            self.steps += 1
        return float(np.asarray(out[self._loss]).reshape(()))

    def model(self) -> Graph:
        """The (f32) model graph with the current master weights."""
        g = self.model_graph
        return Graph(g.name, g.inputs, g.params, g.nodes, g.outputs, {**g.weights, **self.values})


__all__ = ["FP32_OPS", "LOW_PRECISION_OPS", "AmpTrainer", "LossScaler", "amp_train_step_graph", "autocast",
           "default_scaler"]
