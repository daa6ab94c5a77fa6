"""Small, deterministic model graphs for conformance *graph tests*.

Op cases (:mod:`rlx_conformance.cases`) check each op alone; graph tests check that ops compose: layouts
flow through reshapes and transposes, symbolic dims specialise, decompositions meet native kernels,
and rounding errors stay bounded through a whole model. Each factory returns
``(graph, inputs, tolerance)`` and is seeded, so a name and dtype always give the same weights and
inputs (the same float64 values rounded to each dtype):

* :func:`mlp` — 784-64-10 ``linear -> relu -> linear -> softmax`` with a symbolic ``batch``;
* :func:`small_cnn` — ``conv2d_bias -> relu -> max_pool2d -> conv2d_bias -> avg_pool2d -> reshape ->
  linear -> log_softmax`` on NCHW 2x3x12x12;
* :func:`attention_block` — ``embedding -> layer_norm -> q/k/v linear -> heads -> attention(mask) ->
  merge heads -> linear -> residual -> layer_norm -> gelu MLP -> residual``, per mask kind;
* :func:`transformer_encoder_layer` — a BERT-style post-LN encoder layer (padding mask, exact gelu,
  eps 1e-12) with symbolic ``batch`` and ``seq``.

:data:`GRAPHS` maps names to factories and :func:`graph_cases` turns them into :class:`GraphCase`
objects (id ``graph::attention_block[causal,f32]``); :func:`check_graph` compiles one on a session
and compares it with :func:`rlx_core.plugin.evaluate`, returning a
:class:`~rlx_conformance.cases.CaseResult`.

**Tolerance.** The reference rounds every intermediate value to its declared dtype, as a correct
backend storing it does, but a backend may differ from it at every node (its own roundings, a fused
kernel, another summation order), and those differences propagate. :func:`error_budget` combines the
nodes' typical relative errors (:func:`node_bound`: a few storage ulps, ``sqrt(k)`` compute ulps
for a reduction of ``k`` terms) in quadrature along the costliest path from an input to an output,
the probabilistic model of rounding errors; the factory's :class:`GraphTolerance` gives the
*condition allowance* ``cond``, how much the model may amplify a relative perturbation on the way
(2 for the MLP and the CNN; 3 where attention turns absolute score errors into relative weight
errors). The case then uses ``rtol = cond * budget`` and ``atol = rtol * max|reference output|``:
the absolute tolerance is relative to the output's scale. For f32 that is ``5e-6`` to ``1.3e-5`` of
the output scale, for f16 0.6-2%, for bf16 5-15%; on rlx-cpu the observed errors stay below a tenth
of it (eight seeds, every dtype), and a weight changed by 0.01 fails the f32 check.
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_core.plugin import MASK_KINDS, DType, Graph, GraphBuilder, Node, Tensor, normalize_axis

from .cases import (
    EPS,
    EXACT_OPS,
    HIR_CONDITION,
    HIR_LIBRARY,
    HIR_ROUNDINGS,
    HIR_STORAGE_ACCUMULATING,
    LIBRARY_OPS,
    LIBRARY_ULPS,
    CaseResult,
    compare_values,
)

__all__ = ["GRAPHS", "GRAPH_VARIANTS", "GraphCase", "GraphTolerance", "attention_block", "check_graph",
           "error_budget", "graph_cases", "make_case", "mlp", "node_bound", "small_cnn",
           "transformer_encoder_layer"]


@dataclass(frozen=True)
class GraphTolerance:
    """What a factory says about its graph's numerics: ``cond`` multiplies :func:`error_budget`."""

    cond: float
    note: str = ""

    def bounds(self, graph: Graph, inputs: Mapping[str, Any], dtype: DType | str,
               output_scale: float) -> tuple[float, float]:
        """``(rtol, atol)``: ``rtol = cond * error_budget``, ``atol = rtol * output_scale``."""
        rtol = self.cond * error_budget(graph, inputs, dtype)
        return rtol, rtol * output_scale


Factory = Callable[..., tuple[Graph, dict[str, np.ndarray], GraphTolerance]]


@dataclass(frozen=True, eq=False)
class GraphCase:
    """One graph test: ``graph`` fed ``inputs``; outputs must match the reference within
    ``|got - want| <= atol + rtol * |want|`` (NaN/Inf exactly)."""

    id: str
    name: str
    dtype: DType
    graph: Graph
    inputs: dict[str, np.ndarray]
    rtol: float
    atol: float
    params: Mapping[str, Any] = field(default_factory=dict)

    def feed(self) -> dict[str, np.ndarray]:
        return dict(self.inputs)


# ---------------------------------------------------------------------------------------------
# Building blocks

class _Model:
    """A builder plus a seeded generator: weights are drawn in float64, then rounded to ``dtype``."""

    def __init__(self, name: str, dtype: DType | str, seed: int) -> None:
        self.dtype = DType.parse(dtype)
        if not self.dtype.is_float:
            raise ValueError(f"graph {name}: dtype must be a float dtype, got {self.dtype}")
        self.g = GraphBuilder(f"{name}_{self.dtype}")
        self.rng = np.random.default_rng(seed + zlib.crc32(name.encode()))

    def cast(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(x).astype(self.dtype.np)

    def param(self, name: str, x: np.ndarray) -> Tensor:
        return self.g.param(name, self.cast(x), self.dtype)

    def uniform(self, name: str, shape: tuple[int, ...], bound: float, center: float = 0.0) -> Tensor:
        return self.param(name, center + self.rng.uniform(-bound, bound, shape))

    def linear(self, name: str, x: Tensor, n_in: int, n_out: int, gain: float = 1.0) -> Tensor:
        """``torch.nn.Linear``-like init: uniform in +-gain*sqrt(3/n_in) (unit output variance)."""
        w = self.uniform(f"{name}.weight", (n_out, n_in), gain * math.sqrt(3.0 / n_in))
        b = self.uniform(f"{name}.bias", (n_out,), 0.1)
        return self.g.op("linear", x, w, b)

    def layer_norm(self, name: str, x: Tensor, dim: int, eps: float = 1e-5) -> Tensor:
        gamma = self.uniform(f"{name}.weight", (dim,), 0.1, center=1.0)
        beta = self.uniform(f"{name}.bias", (dim,), 0.1)
        return self.g.op("layer_norm", x, gamma, beta, axis=-1, eps=eps)

    def conv(self, name: str, x: Tensor, c_in: int, c_out: int, k: int, groups: int = 1,
             **attrs: Any) -> Tensor:
        fan_in = c_in // groups * k * k
        w = self.uniform(f"{name}.weight", (c_out, c_in // groups, k, k), math.sqrt(6.0 / fan_in))
        b = self.uniform(f"{name}.bias", (c_out,), 0.1)
        return self.g.op("conv2d_bias", x, w, b, groups=groups, **attrs)

    def build(self, out: Tensor) -> Graph:
        self.g.output(out)
        return self.g.build()


def _split_heads(g: GraphBuilder, x: Tensor, b: Any, s: Any, heads: int, dh: int) -> Tensor:
    """(B, S, H*Dh) -> (B, H, S, Dh)."""
    return g.op("transpose", g.op("reshape", x, shape=(b, s, heads, dh)), perm=(0, 2, 1, 3))


def _merge_heads(g: GraphBuilder, x: Tensor, b: Any, s: Any, heads: int, dh: int) -> Tensor:
    """(B, H, S, Dh) -> (B, S, H*Dh)."""
    return g.op("reshape", g.op("transpose", x, perm=(0, 2, 1, 3)), shape=(b, s, heads * dh))


# ---------------------------------------------------------------------------------------------
# The models

def mlp(dtype: DType | str = "f32", batch: int = 4, seed: int = 0
        ) -> tuple[Graph, dict[str, np.ndarray], GraphTolerance]:
    """784-64-10 classifier: ``softmax(linear(relu(linear(x))))``; input ``x: (batch, 784)`` with a
    symbolic ``batch`` dim, fed ``batch`` rows of pixel-like values in [0, 1]."""
    m = _Model("mlp", dtype, seed)
    x = m.g.input("x", m.dtype, ("batch", 784))
    h = m.g.op("relu", m.linear("fc1", x, 784, 64, gain=math.sqrt(2.0)))
    y = m.g.op("softmax", m.linear("fc2", h, 64, 10), axis=-1)
    graph = m.build(y)
    inputs = {"x": m.cast(m.rng.uniform(0.0, 1.0, (batch, 784)))}
    return graph, inputs, GraphTolerance(2.0, "unit-variance layers; softmax of O(1) logits")


def small_cnn(dtype: DType | str = "f32", seed: int = 0
              ) -> tuple[Graph, dict[str, np.ndarray], GraphTolerance]:
    """NCHW 2x3x12x12 -> conv3x3(8, pad 1) -> relu -> maxpool 2 -> conv3x3(16, groups 2) ->
    avgpool 2 -> reshape (2, 64) -> linear 10 -> log_softmax."""
    m = _Model("small_cnn", dtype, seed)
    g = m.g
    x = g.input("x", m.dtype, (2, 3, 12, 12))
    h = g.op("relu", m.conv("conv1", x, 3, 8, 3, pads=(1, 1, 1, 1)))  # 2x8x12x12
    h = g.op("max_pool2d", h, kernel=(2, 2))  # 2x8x6x6
    h = m.conv("conv2", h, 8, 16, 3, groups=2)  # 2x16x4x4
    h = g.op("avg_pool2d", h, kernel=(2, 2))  # 2x16x2x2
    h = g.op("reshape", h, shape=(2, 64))
    y = g.op("log_softmax", m.linear("fc", h, 64, 10), axis=-1)
    graph = m.build(y)
    inputs = {"x": m.cast(m.rng.uniform(-1.0, 1.0, (2, 3, 12, 12)))}
    return graph, inputs, GraphTolerance(2.0, "He-initialised convolutions; log_softmax of O(1) logits")


#: attention_block dimensions.
_AB = {"batch": 2, "seq": 6, "vocab": 32, "dim": 16, "heads": 2, "ffn": 32, "window": 2}


def attention_block(mask_kind: str = "causal", dtype: DType | str = "f32", seed: int = 0
                    ) -> tuple[Graph, dict[str, np.ndarray], GraphTolerance]:
    """A pre-LN transformer block on token ids: ``h = embedding(ids)``; ``a = attention(heads of
    q/k/v linear(layer_norm(h)), mask)``; ``h2 = h + linear(merged a)``;
    ``out = h2 + linear(gelu_tanh(linear(layer_norm(h2))))``. ``ids: (2, 6)`` i64; ``mask_kind``
    ``bias`` adds a ``bias: (2, 1, 6, 6)`` input (ALiBi-like distances plus noise), ``padding`` an
    ``attention_mask: (2, 6)`` i64 input that hides the last two tokens of sequence 1;
    ``sliding_window`` uses window 2."""
    if mask_kind not in MASK_KINDS:
        raise ValueError(f"mask_kind must be one of {MASK_KINDS}, got {mask_kind!r}")
    b, s, vocab, d, heads, ffn = (_AB[k] for k in ("batch", "seq", "vocab", "dim", "heads", "ffn"))
    dh = d // heads
    m = _Model(f"attention_block_{mask_kind}", dtype, seed)
    g = m.g
    ids = g.input("ids", DType.I64, (b, s))
    table = m.uniform("embed.weight", (vocab, d), 1.0)
    h = g.op("embedding", table, ids)
    x = m.layer_norm("ln1", h, d)
    q, k, v = (_split_heads(g, m.linear(f"attn.{n}", x, d, d), b, s, heads, dh) for n in "qkv")
    extra: list[Tensor] = []
    attrs: dict[str, Any] = {"mask": mask_kind}
    inputs: dict[str, np.ndarray] = {"ids": m.rng.integers(0, vocab, (b, s)).astype(np.int64)}
    if mask_kind == "bias":
        extra.append(g.input("bias", m.dtype, (b, 1, s, s)))
        dist = -np.abs(np.arange(s)[:, None] - np.arange(s)[None, :]) * 0.5
        inputs["bias"] = m.cast(dist[None, None] + m.rng.uniform(-0.2, 0.2, (b, 1, s, s)))
    elif mask_kind == "padding":
        extra.append(g.input("attention_mask", DType.I64, (b, s)))
        mask = np.ones((b, s), np.int64)
        mask[1, -2:] = 0
        inputs["attention_mask"] = mask
    elif mask_kind == "sliding_window":
        attrs["window"] = _AB["window"]
    a = g.op("attention", q, k, v, *extra, **attrs)
    h2 = h + m.linear("attn.out", _merge_heads(g, a, b, s, heads, dh), d, d)
    f = m.linear("mlp.fc2", g.op("gelu", m.linear("mlp.fc1", m.layer_norm("ln2", h2, d), d, ffn),
                                 approximate="tanh"), ffn, d)
    graph = m.build(h2 + f)
    return graph, inputs, GraphTolerance(3.0, "attention turns absolute score errors into relative "
                                              "weight errors; two residual paths")


#: transformer_encoder_layer dimensions (BERT-style, scaled down).
_TE = {"batch": 2, "seq": 8, "dim": 32, "heads": 4, "ffn": 64}


def transformer_encoder_layer(dtype: DType | str = "f32", seed: int = 0
                              ) -> tuple[Graph, dict[str, np.ndarray], GraphTolerance]:
    """A BERT encoder layer (post-LN): ``a = LN(x + dense(attention(q, k, v, padding mask)))``,
    ``out = LN(a + dense(gelu(dense(a))))`` with exact gelu and eps 1e-12. Inputs
    ``hidden_states: (batch, seq, 32)`` and ``attention_mask: (batch, seq)`` i64, both symbolic,
    fed batch 2 and seq 8 (sequence 1 padded after 5 tokens)."""
    b, s, d, heads, ffn = (_TE[k] for k in ("batch", "seq", "dim", "heads", "ffn"))
    dh = d // heads
    m = _Model("transformer_encoder_layer", dtype, seed)
    g = m.g
    x = g.input("hidden_states", m.dtype, ("batch", "seq", d))
    mask = g.input("attention_mask", DType.I64, ("batch", "seq"))
    q, k, v = (_split_heads(g, m.linear(f"attention.self.{n}", x, d, d), "batch", "seq", heads, dh)
               for n in ("query", "key", "value"))
    ctx = _merge_heads(g, g.op("attention", q, k, v, mask, mask="padding"), "batch", "seq", heads, dh)
    a = m.layer_norm("attention.output.LayerNorm", x + m.linear("attention.output.dense", ctx, d, d), d,
                     eps=1e-12)
    inter = g.op("gelu", m.linear("intermediate.dense", a, d, ffn), approximate="none")
    out = m.layer_norm("output.LayerNorm", a + m.linear("output.dense", inter, ffn, d), d, eps=1e-12)
    graph = m.build(out)
    am = np.ones((b, s), np.int64)
    am[1, 5:] = 0
    inputs = {"hidden_states": m.cast(m.rng.standard_normal((b, s, d))), "attention_mask": am}
    return graph, inputs, GraphTolerance(3.0, "attention plus two post-LN residual blocks")


#: Graph factories by name.
GRAPHS: dict[str, Factory] = {
    "mlp": mlp, "small_cnn": small_cnn, "attention_block": attention_block,
    "transformer_encoder_layer": transformer_encoder_layer,
}
#: Keyword variants per factory (each becomes its own case); absent means one case.
GRAPH_VARIANTS: dict[str, tuple[dict[str, Any], ...]] = {
    "attention_block": tuple({"mask_kind": k} for k in MASK_KINDS),
}


# ---------------------------------------------------------------------------------------------
# Tolerance

def _bindings(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in graph.inputs:
        if v.name in inputs:
            for dim, n in zip(v.type.shape, np.shape(inputs[v.name])):
                if isinstance(dim, str):
                    out[dim] = int(n)
    return out


def _node_k(graph: Graph, node: Node) -> int:
    """Terms summed per output element of ``node`` (1 for non-reductions)."""
    ins = [graph.types[i].shape for i in node.inputs]
    a = node.attrs
    op = node.op
    if op == "matmul":
        return int(ins[0][-1]) if ins[0] else 1
    if op == "conv2d":
        return int(math.prod(ins[1][1:]))
    if op in ("reduce_sum", "reduce_mean", "reduce_prod"):
        out = graph.types[node.outputs[0]]
        n_out = out.numel()
        return int(math.prod(ins[0])) // n_out if n_out else 1
    if op == "cumsum":
        axis = a["axis"]
        if not isinstance(axis, int):
            raise TypeError(f"cumsum: attribute 'axis' = {axis!r} is not an int")
        return int(ins[0][normalize_axis(axis, len(ins[0]))]) if ins[0] else 1
    if op in HIR_CONDITION:
        # shapes only: k never depends on the values (the graph is specialised: its dims are ints)
        dummies = [np.zeros(tuple(int(d) for d in sh)) for sh in ins]
        fn = HIR_CONDITION[op]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn(dummies, a)[0]
    return 1


def node_bound(op: str, dtype: DType | str, k: int = 1) -> float:
    """A node's typical relative error against the rounded reference, in the probabilistic model.

    ``e`` storage eps, ``c`` compute eps (f32 for half types), as :func:`~rlx_conformance.cases.tolerance`:
    ``e`` for the two final roundings (reference and backend, half an ulp each), ``L*c`` for library
    functions, ``sqrt(D)*e/2`` for an HIR op's chain of ``D`` storage roundings
    (:data:`~rlx_conformance.cases.HIR_ROUNDINGS`; 1 for MIR ops) and ``sqrt(k)*c`` for a sum of ``k``
    terms (``sqrt(k)*e`` where the decomposition sums in storage precision). Exact ops give 0.
    """
    dt = DType.parse(dtype)
    if op in EXACT_OPS or not (dt.is_float or dt.is_complex):
        return 0.0
    e = EPS[dt]
    c = min(e, EPS[DType.F32])
    lib = LIBRARY_ULPS if op in LIBRARY_OPS or op in HIR_LIBRARY else 1
    chain = math.sqrt(HIR_ROUNDINGS.get(op, 1)) * e / 2
    acc = math.sqrt(k) * (e if op in HIR_STORAGE_ACCUMULATING else c) if k > 1 else 0.0
    return e + lib * c + chain + acc


def error_budget(graph: Graph, inputs: Mapping[str, Any], dtype: DType | str) -> float:
    """The probabilistic relative error bound of the costliest path from an input to an output.

    Rounding errors are independent and of random sign, so they add in quadrature (Higham & Mary,
    *A New Approach to Probabilistic Rounding Error Analysis*, 2019): a chain of ``n`` roundings or a
    sum of ``n`` terms is off by ``~sqrt(n)`` ulps rather than the worst case ``n``. The budget is the
    largest ``sqrt(sum b^2)`` over paths, with ``b`` each node's :func:`node_bound`. (Op tests use
    worst-case bounds; over a whole graph those add up to a tolerance too loose to find anything.)
    Symbolic dims are bound from ``inputs`` first; ``dtype`` is used for non-float outputs.
    """
    dt = DType.parse(dtype)
    binds = _bindings(graph, inputs)
    if binds:
        graph = graph.specialize(binds)
    cost: dict[str, float] = {}
    for node in graph.nodes:
        out_dt = graph.types[node.outputs[0]].dtype
        local = node_bound(node.op, out_dt if out_dt.is_float else dt, _node_k(graph, node)) ** 2
        before = max((cost.get(i, 0.0) for i in node.inputs), default=0.0)
        for o in node.outputs:
            cost[o] = before + local
    return math.sqrt(max((cost.get(o, 0.0) for o in graph.outputs), default=0.0))


def _output_scale(ref: Mapping[str, np.ndarray]) -> float:
    mags = [np.abs(a[np.isfinite(a)]) for a in ref.values()]
    return max((float(m.max()) for m in mags if m.size), default=1.0)


def _reference(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """:func:`~rlx_core.plugin.evaluate` of the graph specialised to the inputs' shapes
    (the reference cannot bind a reshape target with two symbols, e.g. ``(batch, seq, 4, 8)``)."""
    from rlx_core.plugin import evaluate

    binds = _bindings(graph, inputs)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return evaluate(graph.specialize(binds) if binds else graph, inputs)


def make_case(name: str, dtype: DType | str = "f32", seed: int = 0, **params: Any) -> GraphCase:
    """Build one :class:`GraphCase` from :data:`GRAPHS`; the reference sets the output scale."""
    dt = DType.parse(dtype)
    graph, inputs, tol = GRAPHS[name](dtype=dt, seed=seed, **params)
    rtol, atol = tol.bounds(graph, inputs, dt, _output_scale(_reference(graph, inputs)))
    label = ",".join([*(str(v) for v in params.values()), str(dt)])
    return GraphCase(f"graph::{name}[{label}]", name, dt, graph, inputs, rtol, atol, dict(params))


def graph_cases(dtypes: Iterable[DType | str] = ("f32",), names: Iterable[str] | None = None,
                seed: int = 0) -> list[GraphCase]:
    """Every registered graph (or those in ``names``), every variant, for each of ``dtypes``."""
    out = []
    for name in (list(names) if names is not None else list(GRAPHS)):
        for params in GRAPH_VARIANTS.get(name, ({},)):
            for dt in dtypes:
                out.append(make_case(name, dt, seed, **params))
    return out


def check_graph(case: GraphCase, session: Any) -> CaseResult:
    """Compile ``case.graph`` on ``session``, run it and compare every output with the reference.

    Statuses as :func:`rlx_conformance.cases.run_case`: ``error`` if building, compiling, running or the
    reference raised; ``failed`` if an output is missing or differs; ``passed`` otherwise. The
    result's ``op`` is the graph's name and its ``kind`` is ``"graph"``.
    """
    def result(status: str, message: str = "", path: str = "") -> CaseResult:
        return CaseResult(case.id, case.name, case.dtype, "graph", status, message, path)

    path = ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            exe = session.compile(case.graph)
            if exe.report is not None:
                path = ",".join(dict.fromkeys(e.path for e in exe.report.entries))
            got = exe.run(case.feed())
        except Exception as e:
            return result("error", f"{type(e).__name__}: {e}", path)
        try:
            want = _reference(case.graph, case.feed())
        except Exception as e:
            return result("error", f"reference failed: {type(e).__name__}: {e}", path)
    problems = []
    for name in case.graph.outputs:
        if name not in got:
            problems.append(f"output {name!r} missing")
            continue
        dt = case.graph.types[name].dtype
        msg = compare_values(got[name], want[name], dt, f"{case.id} output {name!r}",
                             rtol=case.rtol, atol=case.atol)
        if msg:
            problems.append(msg)
    if problems:
        return result("failed", "; ".join(problems), path)
    return result("passed", "", path)
