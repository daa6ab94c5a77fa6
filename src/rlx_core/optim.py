"""Optimizers as graph fragments, one training step as one graph, and a small :class:`Trainer`.

An optimizer appends its update to a builder::

    new_params, new_state = opt.build_update(b, params, grads, state, step)

``params``/``grads`` map parameter names to tensors, ``state`` maps state names
(``"<param>.<slot>"``, e.g. ``"w1.exp_avg"``) to tensors, and ``step`` is an i64 scalar tensor
holding the number of updates already applied (0 for the first). ``opt.init_state(params)``
gives the initial state as NumPy arrays. Hyperparameters are constants of the graph.

:func:`train_step_graph` builds forward, backward and update as ONE graph: inputs are the data,
then the parameters, then the optimizer state, then ``step``; outputs are the loss, then the new
parameters (same order), then the new state (same order as :meth:`Optimizer.state_names`).
:class:`Trainer` compiles it once and feeds the outputs back.

:class:`Trainer` copies parameters and state in and out of the executable every step;
:class:`ResidentTrainer` keeps them in the compiled program's buffers (the backend's
buffer-binding capability, :class:`rlx_core.records.BufferBinding`) with the same graphs.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dtypes import DType
from .errors import IRError
from .ir.builder import GraphBuilder, Tensor
from .ir.graph import Graph

Shape = tuple[Any, ...]


def _shape(x: Any) -> Shape:
    return tuple(x.shape)


class Optimizer:
    """Base class: subclasses define :meth:`slots` and :meth:`update_one`."""

    #: whether the update reads the step counter
    uses_step = False

    def slots(self, shape: Shape) -> tuple[str, ...]:
        """Names of the per-parameter state tensors (same shape and dtype as the parameter)."""
        return ()

    def state_names(self, params: Mapping[str, Any]) -> list[str]:
        return [f"{p}.{s}" for p, v in params.items() for s in self.slots(_shape(v))]

    def init_state(self, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Zero state for ``params`` (name -> array, or anything with ``shape`` and ``dtype``)."""
        out = {}
        for p, v in params.items():
            for s in self.slots(_shape(v)):
                dt = v.dtype.np if isinstance(v.dtype, DType) else np.asarray(v).dtype
                out[f"{p}.{s}"] = np.zeros(_shape(v), dt)
        return out

    def build_update(self, b: GraphBuilder, params: Mapping[str, Tensor], grads: Mapping[str, Tensor],
                     state: Mapping[str, Tensor], step: Tensor | None = None
                     ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        if step is None and self.uses_step:
            raise IRError(f"{type(self).__name__} needs the step counter",
                          fix="pass step=<i64 scalar tensor>")
        new_p: dict[str, Tensor] = {}
        new_s: dict[str, Tensor] = {}
        for name, p in params.items():
            st = {s: state[f"{name}.{s}"] for s in self.slots(p.shape)}
            p2, st2 = self.update_one(b, name, p, grads[name], st, step)
            new_p[name] = p2
            new_s.update({f"{name}.{k}": v for k, v in st2.items()})
        return new_p, new_s

    def update_one(self, b: GraphBuilder, name: str, p: Tensor, g: Tensor, state: Mapping[str, Tensor],
                   step: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        raise NotImplementedError


def _c(b: GraphBuilder, v: float, like: Tensor) -> Tensor:
    return b.const(v, like.dtype)


def _t(b: GraphBuilder, step: Tensor, like: Tensor) -> Tensor:
    """The 1-based step number as a float of ``like``'s dtype."""
    return b.op("cast", step, to=like.dtype) + _c(b, 1.0, like)


@dataclass
class SGD(Optimizer):
    """``torch.optim.SGD``: weight decay added to the gradient, (Nesterov) momentum, dampening."""

    lr: float = 0.01
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    maximize: bool = False

    def __post_init__(self) -> None:
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        self.uses_step = self.momentum != 0 and self.dampening != 0

    def slots(self, shape: Shape) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum else ()

    def update_one(self, b: GraphBuilder, name: str, p: Tensor, g: Tensor, state: Mapping[str, Tensor],
                   step: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        if self.maximize:
            g = b.op("neg", g)
        if self.weight_decay:
            g = g + _c(b, self.weight_decay, p) * p
        new: dict[str, Tensor] = {}
        if self.momentum:
            damped = _c(b, 1 - self.dampening, p) * g if self.dampening else g
            buf = state["momentum_buffer"] * _c(b, self.momentum, p) + damped
            if self.dampening:  # torch starts the buffer at the first gradient, undamped
                assert step is not None  # uses_step: build_update has required the step counter
                first = b.op("equal", step, b.const(0, step.dtype))
                buf = b.op("where", first, g, buf)
            new["momentum_buffer"] = buf
            g = g + _c(b, self.momentum, p) * buf if self.nesterov else buf
        return p - _c(b, self.lr, p) * g, new


@dataclass
class Adam(Optimizer):
    """``torch.optim.Adam`` (``decoupled=False``: L2 weight decay added to the gradient) and,
    with ``decoupled=True``, ``torch.optim.AdamW``; bias-corrected, optional AMSGrad."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    amsgrad: bool = False
    decoupled: bool = False
    uses_step = True

    def slots(self, shape: Shape) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if self.amsgrad else ())

    def update_one(self, b: GraphBuilder, name: str, p: Tensor, g: Tensor, state: Mapping[str, Tensor],
                   step: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        b1, b2 = self.betas
        if self.weight_decay:
            if self.decoupled:
                p = p * _c(b, 1 - self.lr * self.weight_decay, p)
            else:
                g = g + _c(b, self.weight_decay, p) * p
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m = m + _c(b, 1 - b1, p) * (g - m)  # torch's lerp
        v = v * _c(b, b2, p) + _c(b, 1 - b2, p) * (g * g)
        new = {"exp_avg": m, "exp_avg_sq": v}
        t = _t(b, step, p)  # type: ignore[arg-type]
        one = _c(b, 1.0, p)
        bc1 = one - b.op("pow", _c(b, b1, p), t)
        bc2 = one - b.op("pow", _c(b, b2, p), t)
        if self.amsgrad:
            v = b.op("maximum", state["max_exp_avg_sq"], v)
            new["max_exp_avg_sq"] = v
        denom = b.op("sqrt", v) / b.op("sqrt", bc2) + _c(b, self.eps, p)
        return p - (_c(b, self.lr, p) / bc1) * (m / denom), new


@dataclass
class AdamW(Adam):
    """``torch.optim.AdamW``: decoupled weight decay (default 1e-2)."""

    weight_decay: float = 1e-2
    decoupled: bool = True


@dataclass
class Lion(Optimizer):
    """Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms")::

        p <- p * (1 - lr * wd) - lr * sign(beta1 * m + (1 - beta1) * g)
        m <- beta2 * m + (1 - beta2) * g
    """

    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0

    def slots(self, shape: Shape) -> tuple[str, ...]:
        return ("exp_avg",)

    def update_one(self, b: GraphBuilder, name: str, p: Tensor, g: Tensor, state: Mapping[str, Tensor],
                   step: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        b1, b2 = self.betas
        m = state["exp_avg"]
        if self.weight_decay:
            p = p * _c(b, 1 - self.lr * self.weight_decay, p)
        update = b.op("sign", m * _c(b, b1, p) + g * _c(b, 1 - b1, p))
        return p - _c(b, self.lr, p) * update, {"exp_avg": m * _c(b, b2, p) + g * _c(b, 1 - b2, p)}


#: The quintic Newton-Schulz coefficients of the published Muon.
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz(b: GraphBuilder, g: Tensor, steps: int = 5, eps: float = 1e-7) -> Tensor:
    """Approximately orthogonalise a matrix (``zeropower_via_newtonschulz5`` of the published Muon,
    computed in the tensor's own dtype rather than bfloat16)."""
    a, bb, cc = NS_COEFFS
    rows, cols = g.shape
    x = b.op("transpose", g, perm=(1, 0)) if rows > cols else g  # type: ignore[operator]
    x = x / (b.op("sqrt", b.op("reduce_sum", x * x, axes=None, keepdims=False)) + _c(b, eps, g))
    for _ in range(steps):
        xt = b.op("transpose", x, perm=(1, 0))
        am = b.op("matmul", x, xt)
        bm = _c(b, bb, g) * am + _c(b, cc, g) * b.op("matmul", am, am)
        x = _c(b, a, g) * x + b.op("matmul", bm, x)
    return b.op("transpose", x, perm=(1, 0)) if rows > cols else x  # type: ignore[operator]


@dataclass
class Muon(Optimizer):
    """Muon (K. Jordan et al., 2024), as in the published ``muon.py``::

        m <- lerp(m, g, 1 - momentum)
        u <- lerp(g, m, momentum) if nesterov else m          (4-D: viewed as (out, -1))
        u <- NewtonSchulz5(u) * max(1, g.shape[-2] / g.shape[-1]) ** 0.5
        p <- p * (1 - lr * wd) - lr * u

    Muon is for matrices (and conv filters); parameters of rank < 2 use ``aux`` (by default the
    AdamW of the published ``MuonWithAuxAdam``: lr 3e-4, betas (0.9, 0.95), eps 1e-10, no decay).
    The Newton-Schulz iteration runs in the parameter dtype (the reference uses bfloat16).
    """

    lr: float = 0.02
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    weight_decay: float = 0.0
    aux: Optimizer = field(default_factory=lambda: AdamW(lr=3e-4, betas=(0.9, 0.95), eps=1e-10,
                                                         weight_decay=0.0))

    def __post_init__(self) -> None:
        self.uses_step = self.aux.uses_step

    def slots(self, shape: Shape) -> tuple[str, ...]:
        return ("momentum_buffer",) if len(shape) >= 2 else self.aux.slots(shape)

    def update_one(self, b: GraphBuilder, name: str, p: Tensor, g: Tensor, state: Mapping[str, Tensor],
                   step: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        if p.rank < 2:
            return self.aux.update_one(b, name, p, g, state, step)
        mu = self.momentum
        m = state["momentum_buffer"]
        m = m + _c(b, 1 - mu, p) * (g - m)
        u = g + _c(b, mu, p) * (m - g) if self.nesterov else m
        if u.rank > 2:
            u = b.op("reshape", u, shape=(p.shape[0], math.prod(p.shape[1:])))
        u = newton_schulz(b, u, self.ns_steps)
        u = u * _c(b, max(1.0, p.shape[-2] / p.shape[-1]) ** 0.5, p)  # type: ignore[operator]
        if u.shape != p.shape:
            u = b.op("reshape", u, shape=p.shape)
        if self.weight_decay:
            p = p * _c(b, 1 - self.lr * self.weight_decay, p)
        return p - _c(b, self.lr, p) * u, {"momentum_buffer": m}


# -- one training step as one graph --------------------------------------------------------------

_CONST = re.compile(r"(.*_)?const_\d+")


def trainable_params(graph: Graph) -> list[str]:
    """The floating parameters of ``graph`` that are not builder constants (``const_<k>``)."""
    return [p.name for p in graph.params if p.type.dtype.is_float and not _CONST.fullmatch(p.name)]


def train_step_graph(model_graph: Graph, loss_output: str, params: Sequence[str] | None,
                     optimizer: Optimizer, *, step_name: str = "step", name: str | None = None) -> Graph:
    """One graph computing the loss, its gradients and the optimizer update.

    Inputs: the model's inputs, then ``params`` (default :func:`trainable_params`), then the
    optimizer state (:meth:`Optimizer.state_names` order), then ``step_name`` (i64 scalar, the
    number of steps already taken). Outputs: ``loss_output``, then the new parameters, then the new
    state, in the same orders (named ``<name>.next``)."""
    from .autodiff._util import full, zeros_like
    from .autodiff.transforms import Trace, _check_scalar, _check_values, params_as_inputs

    params = trainable_params(model_graph) if params is None else list(params)
    if not params:
        raise IRError("train_step_graph: no parameters to train", fix="pass params=[...]")
    _check_values(model_graph, [loss_output], "loss")
    _check_values(model_graph, params, "params")
    _check_scalar(model_graph, loss_output)
    graph = params_as_inputs(model_graph, params)
    tr = Trace(graph, differentiate=params, mode="vjp", name=name or f"{model_graph.name}_train_step")
    value = tr.env[loss_output]
    grads = tr.gradients({loss_output: full(tr.b, 1.0, value.shape, value.dtype)}, params)
    ptypes = {p: graph.types[p] for p in params}
    names = optimizer.state_names(ptypes)
    state: dict[str, Tensor] = {}
    for s in names + [step_name]:
        if tr.unique(s) != s:
            raise IRError(f"train_step_graph: the name {s!r} is already used in the model",
                          fix="rename the model value, or pass another step_name")
    for p in params:
        for slot in optimizer.slots(ptypes[p].shape):
            s = f"{p}.{slot}"
            state[s] = tr.b.input(s, ptypes[p].dtype, ptypes[p].shape)
    step = tr.b.input(step_name, DType.I64, ())
    gmap = {p: gp if (gp := grads[p]) is not None else zeros_like(tr.b, tr.env[p]) for p in params}
    new_p, new_s = optimizer.build_update(tr.b, {p: tr.env[p] for p in params}, gmap, state, step)
    outs = [(value, loss_output)]
    outs += [(new_p[p], tr.unique(f"{p}.next")) for p in params]
    outs += [(new_s[s], tr.unique(f"{s}.next")) for s in names]
    return tr.finish(outs)


class Trainer:
    """Holds parameters and optimizer state as NumPy arrays, compiles the training step once, and
    runs steps feeding each step's outputs back as the next step's inputs::

        t = Trainer(model, "loss", SGD(lr=0.02, momentum=0.9))
        for xb, yb in batches:
            loss = t.step(x=xb, y=yb)
        trained = t.model()          # the model graph with the current weights

    Parameters and state are copied into and out of the executable every step; in-place update at
    the buffer level is a runtime optimisation to come.
    """

    def __init__(self, model_graph: Graph, loss_output: str, optimizer: Optimizer,
                 params: Sequence[str] | None = None, *, device: str | None = "cpu",
                 session: Any = None, step_name: str = "step") -> None:
        from .runtime import Session

        self.model_graph = model_graph
        self.optimizer = optimizer
        self.params = trainable_params(model_graph) if params is None else list(params)
        self.graph = train_step_graph(model_graph, loss_output, self.params, optimizer, step_name=step_name)
        self.values = {p: np.array(model_graph.weights[p], copy=True) for p in self.params}
        self.state = optimizer.init_state(self.values)
        self.state_names = optimizer.state_names(self.values)
        self.step_name = step_name
        self.steps = 0
        self.session = session if session is not None else Session(device)
        self.executable = self.session.compile(self.graph)
        outs = self.graph.outputs
        self._loss = outs[0]
        self._param_outs = outs[1:1 + len(self.params)]
        self._state_outs = outs[1 + len(self.params):]

    def step(self, inputs: Mapping[str, Any] | None = None, **data: Any) -> float:
        """One training step on ``inputs``/``data`` (the model's inputs); returns the loss."""
        feed = {**dict(inputs or {}), **data, **self.values, **self.state,
                self.step_name: np.asarray(self.steps, np.int64)}
        out = self.executable.run(feed)
        for p, o in zip(self.params, self._param_outs):
            self.values[p] = out[o]
        for s, o in zip(self.state_names, self._state_outs):
            self.state[s] = out[o]
        self.steps += 1
        return float(np.asarray(out[self._loss]).reshape(()))

    def model(self) -> Graph:
        """The model graph with the current parameter values as its weights."""
        g = self.model_graph
        weights = dict(g.weights)
        weights.update(self.values)
        return Graph(g.name, g.inputs, g.params, g.nodes, g.outputs, weights)


class ResidentTrainer:
    """:class:`rlx_core.optim.Trainer`'s job, with the per-step work cut to the minimum.

    The training step (:func:`~rlx_core.optim.train_step_graph`) is compiled once for static shapes
    by the session, with each parameter and optimizer state declared carried into from its
    ``<p>.next`` output (``Session.compile(carry=...)``: the normal lowering, with the device's
    memory settings, plans them safe to feed back). When the backend's compiled program has the
    buffer-binding capability (:class:`rlx_core.plugin.BufferBinding`, from
    ``Executable.buffers()``), parameters and state stay in the program's own buffers between
    steps: where the update ran in place ``<p>.next`` already occupies ``<p>``'s bytes and nothing
    moves, otherwise ``<p>.next`` is copied onto ``<p>`` after the run (one ``memcpy``). A step is:
    ``bind_input`` each batch array (rlx-cpu points its GEMMs at the caller's array when it can,
    else copies it in), ``run_bound``, read the loss. Without the capability (``resident=None``:
    when the backend has it; ``True`` requires it) steps go through ``Executable.run`` with the
    outputs fed back.

    ``step(x=..., y=...)`` returns the loss; :meth:`values` / :meth:`load` read and write the
    parameters, :meth:`model` gives the model graph with the current weights.
    """

    def __init__(self, model_graph: Graph, loss_output: str, optimizer: Optimizer,
                 params: Sequence[str] | None = None, *, device: str | None = "cpu", session: Any = None,
                 step_name: str = "step", resident: bool | None = None, train_graph: Graph | None = None,
                 fusion: bool | None = None) -> None:
        from .errors import CapabilityError, InputError
        from .runtime import Executable, Session

        self.model_graph = model_graph
        self.optimizer = optimizer
        self.params = trainable_params(model_graph) if params is None else list(params)
        self.graph = train_graph if train_graph is not None else train_step_graph(
            model_graph, loss_output, self.params, optimizer, step_name=step_name)
        if self.graph.symbols:
            raise IRError(f"ResidentTrainer compiles static shapes; graph {model_graph.name!r} has "
                          f"symbolic dims {sorted(self.graph.symbols)}",
                          fix="build the model with a fixed batch, or graph.specialize({'batch': B})")
        init = {p: np.array(model_graph.weights[p], copy=True) for p in self.params}
        self.state_names = optimizer.state_names(init)
        self.step_name = step_name
        self.data_names = [v.name for v in model_graph.inputs]
        outs = self.graph.outputs
        self.loss_name = outs[0]
        n = len(self.params)
        #: carried input -> the output that holds its next value
        self.carry = dict(zip(self.params + self.state_names,
                              outs[1:1 + n] + outs[1 + n:1 + n + len(self.state_names)], strict=True))
        self.session = session if session is not None else Session(device, fusion=fusion)
        t0 = time.perf_counter()
        exe = self.session.compile(self.graph, carry=None if resident is False else self.carry)
        if not isinstance(exe, Executable):  # carried state already needs one device; so does .program()
            names = ", ".join(self.session.device_names)
            raise InputError(f"ResidentTrainer runs on one device, not {names}",
                             where=f"graph {self.graph.name!r}", fix="pass one device, e.g. device='cpu'")
        self.executable = exe
        self.program = self.executable.program()
        self.binding: Any = None
        if resident is not False:
            try:
                self.binding = self.executable.buffers()
            except CapabilityError:
                if resident:
                    raise
        self.compile_s = time.perf_counter() - t0
        self.resident = self.binding is not None
        self.steps = 0
        #: data inputs the program last read in place (no copy), as bind_input reported
        self.bound_inputs: set[str] = set()
        if self.binding is not None:
            buf = self.binding.buffer
            self._bind = self.binding.bind_input
            self._run = self.binding.run_bound
            self._copies = [(buf(i), buf(o)) for i, o in self.carry.items()
                            if not np.shares_memory(buf(i), buf(o))]
            self._step_view = buf(step_name)
            self._loss_view = buf(self.loss_name)
        else:
            self._feed: dict[str, Any] = {}
        self.load(init)
        self.load_state(optimizer.init_state(init))

    # -- state --------------------------------------------------------------------------------------
    def load(self, values: Mapping[str, np.ndarray]) -> None:
        """Set parameters (any subset, by name)."""
        self._set(values, self.params)

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        self._set(state, self.state_names)

    def _set(self, values: Mapping[str, np.ndarray], allowed: Sequence[str]) -> None:
        for k, v in values.items():
            if k not in allowed:
                raise IRError(f"{k!r} is not one of {list(allowed)}", fix="use the names of the train graph")
            if self.binding is not None:
                np.copyto(self.binding.buffer(k), v)
            else:
                self._feed[k] = np.array(v, self.graph.types[k].dtype.np, copy=True)

    def _get(self, k: str) -> np.ndarray:
        return np.array(self.binding.buffer(k) if self.binding is not None else self._feed[k], copy=True,
                        order="C")

    def values(self) -> dict[str, np.ndarray]:
        """Copies of the current parameters."""
        return {p: self._get(p) for p in self.params}

    def state(self) -> dict[str, np.ndarray]:
        return {s: self._get(s) for s in self.state_names}

    def model(self) -> Graph:
        """The model graph with the current parameter values as its weights."""
        g = self.model_graph
        return Graph(g.name, g.inputs, g.params, g.nodes, g.outputs, {**g.weights, **self.values()})

    # -- stepping -----------------------------------------------------------------------------------
    def step(self, inputs: Mapping[str, Any] | None = None, **data: Any) -> float:
        """One training step on the model's data inputs (by name); returns the loss."""
        feed = {**dict(inputs or {}), **data}
        if self.binding is not None:
            bind, bound = self._bind, self.bound_inputs
            for name in self.data_names:
                if bind(name, feed[name]):
                    bound.add(name)
                else:
                    bound.discard(name)
            self._step_view[...] = self.steps
            try:
                self._run()
            except Exception as e:  # as Executable.run: a backend's failure names the backend
                from .errors import PluginError

                raise PluginError(f"the program compiled by {self.executable.backend.label} raised "
                                  f"{type(e).__name__}: {e}", where=f"graph {self.graph.name!r}",
                                  kind="runtime", fix="this is a bug in the backend plugin") from e
            for dst, src in self._copies:
                np.copyto(dst, src)
            self.steps += 1
            return float(self._loss_view)
        f = self._feed
        for name in self.data_names:
            f[name] = np.ascontiguousarray(feed[name], self.graph.types[name].dtype.np)
        f[self.step_name] = np.asarray(self.steps, np.int64)
        out = self.executable.run(f)
        for i, o in self.carry.items():
            f[i] = out[o]
        self.steps += 1
        return float(np.asarray(out[self.loss_name]).reshape(()))

__all__ = ["NS_COEFFS", "SGD", "Adam", "AdamW", "Lion", "Muon", "Optimizer", "ResidentTrainer", "Trainer",
           "newton_schulz", "train_step_graph", "trainable_params"]
