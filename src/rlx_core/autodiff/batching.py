"""``vmap``: batch a graph over a new leading axis.

Batched values carry the batch as axis 0. Per node, in order: the op's batching rule (axis
attributes shifted by one, operands aligned); the generic elementwise rule (operands reshaped so
the batch axis lines up under broadcasting); the op's decomposition, batched op by op; and for a
static batch size, unrolling (one slice per example, results concatenated). Nodes that see no
batched operand are copied unchanged, and unbatched outputs are broadcast at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import IRError
from ..ir.builder import Tensor
from ..ir.graph import Graph, Node
from ..ir.schema import REGISTRY
from ..ir.types import Attrs, Dim, TensorType, normalize_axis
from ._util import ADBuilder, decomposition_graph, reshape, unique_name
from .registry import get_batch_rule, register_batch_rule
from .transforms import prune

Flags = Sequence[bool]


def _orig_rank(t: Tensor, f: bool) -> int:
    return t.rank - 1 if f else t.rank


def _unbatched(t: Tensor, f: bool) -> TensorType:
    return TensorType(t.dtype, t.shape[1:]) if f else t.type


def _batched(b: ADBuilder, t: Tensor, f: bool, size: Dim) -> Tensor:
    """``t`` with the batch axis, broadcasting an unbatched value."""
    return t if f else b.op("expand", t, shape=(size, *t.shape))


# -- the node batcher ------------------------------------------------------------------------------

def _check(op: str, outs: Sequence[Tensor], flags: Sequence[bool], want: Sequence[TensorType], size: Dim,
           how: str) -> tuple[list[Tensor], list[bool]]:
    outs, flags = list(outs), list(flags)
    for t, f, w in zip(outs, flags, want):
        shape = (size, *w.shape) if f else w.shape
        if t.shape != shape or t.dtype != w.dtype:
            raise IRError(f"batching op {op!r} ({how}) produced {t.type}, expected "
                          f"{TensorType(w.dtype, shape)}",
                          fix="a batching rule must return the batched result with the batch on axis 0")
    return outs, flags


def batch_node(b: ADBuilder, op: str, ins: Sequence[Tensor], flags: Flags, attrs: Attrs, size: Dim,
               out_types: Sequence[TensorType]) -> tuple[list[Tensor], list[bool]]:
    """Outputs of ``op`` applied per example to ``ins`` (flags: which carry the batch axis 0)."""
    rule = get_batch_rule(op)
    if rule is not None:
        res = rule(b, ins, flags, attrs, size)
        if res is not None:
            return _check(op, res[0], res[1], out_types, size, "its batching rule")
    schema = REGISTRY.get(op)
    if schema.elementwise and schema.num_outputs == 1:
        return _check(op, _elementwise(b, op, ins, flags, attrs), [True], out_types, size, "elementwise")
    if schema.decompose is not None:
        sub = decomposition_graph(schema, [_unbatched(t, f) for t, f in zip(ins, flags)], attrs)
        env = {v.name: (t, f) for v, t, f in zip(sub.inputs, ins, flags)}
        _batch_nodes(b, sub, env, size, fresh=True)
        return _check(op, [env[o][0] for o in sub.outputs], [env[o][1] for o in sub.outputs],
                      out_types, size, "its decomposition")
    if isinstance(size, int) and size > 0:
        return _check(op, *_unroll(b, op, ins, flags, attrs, size), out_types, size, "unrolled")
    why = "its batching rule does not cover this case" if rule is not None else "it has no batching rule"
    raise IRError(f"cannot batch op {op!r}: {why}, it has no decomposition, and the batch size "
                  f"{size!r} is symbolic so it cannot be unrolled",
                  fix=f"pass axis_size=<int> to vmap, or register_batch_rule({op!r}, rule)")


def _batch_nodes(b: ADBuilder, graph: Graph, env: dict[str, tuple[Tensor, bool]], size: Dim,
                 fresh: bool, rename: frozenset[str] = frozenset()) -> None:
    """Batch ``graph``'s nodes into ``b``. With ``fresh`` every node gets new names; otherwise
    unbatched nodes keep theirs, except nodes producing a value in ``rename``."""
    for p in graph.params:
        if p.name not in env:
            w = np.asarray(graph.weights[p.name])
            env[p.name] = ((b.const(w, p.type.dtype) if fresh else b.param(p.name, w, p.type.dtype)), False)
    for node in graph.nodes:
        ins = [env[i][0] for i in node.inputs]
        flags = [env[i][1] for i in node.inputs]
        if not any(flags):
            if fresh or any(o in rename for o in node.outputs):
                outs = b.emit(node.op, ins, node.attrs)
            else:
                outs = b.add_node(Node(node.name, node.op, tuple(t.name for t in ins), node.outputs,
                                       node.attrs))
            oflags = [False] * len(outs)
        else:
            outs, oflags = batch_node(b, node.op, ins, flags, node.attrs, size,
                                      [graph.types[o] for o in node.outputs])
        for o, t, f in zip(node.outputs, outs, oflags):
            env[o] = (t, f)


def _elementwise(b: ADBuilder, op: str, ins: Sequence[Tensor], flags: Flags, attrs: Attrs) -> list[Tensor]:
    ranks = [_orig_rank(t, f) for t, f in zip(ins, flags)]
    r = max(ranks)
    xs = [reshape(b, t, (t.shape[0],) + (1,) * (r - k) + t.shape[1:]) if f and k < r else t
          for t, f, k in zip(ins, flags, ranks)]
    return b.emit(op, xs, attrs)


def _unroll(b: ADBuilder, op: str, ins: Sequence[Tensor], flags: Flags, attrs: Attrs, size: int
            ) -> tuple[list[Tensor], list[bool]]:
    per: list[list[Tensor]] = []
    for i in range(size):
        xs = [reshape(b, b.op("slice", t, starts=(i,), stops=(i + 1,), axes=(0,)), t.shape[1:]) if f else t
              for t, f in zip(ins, flags)]
        per.append(b.emit(op, xs, attrs))
    outs = []
    for k in range(len(per[0])):
        parts = [reshape(b, p[k], (1, *p[k].shape)) for p in per]
        outs.append(parts[0] if size == 1 else b.op("concat", *parts, axis=0))
    return outs, [True] * len(outs)


# -- vmap ------------------------------------------------------------------------------------------

def vmap(graph: Graph, in_axes: int | None | Sequence[int | None] | Mapping[str, int | None] = 0, *,
         axis_size: int | str | None = None, name: str | None = None) -> Graph:
    """Batch ``graph`` over a new axis: each input named in ``in_axes`` (a mapping name -> axis or
    None, a sequence aligned with the graph inputs, or one axis for every input) gains a dimension
    of size ``axis_size`` at that axis (default: a new symbol ``vmap``); every output gains it as
    its leading axis. Parameters are shared across the batch (make one an input with
    :func:`~rlx_core.autodiff.params_as_inputs` to batch it)."""
    names = [v.name for v in graph.inputs]
    if in_axes is None or isinstance(in_axes, int):
        axes = dict.fromkeys(names, in_axes)
    elif isinstance(in_axes, Mapping):
        unknown = [k for k in in_axes if k not in names]
        if unknown:
            params = {p.name for p in graph.params}
            hint = ("parameters are shared; batch one by making it an input first (params_as_inputs)"
                    if any(k in params for k in unknown) else f"inputs: {names}")
            raise IRError(f"vmap in_axes names {unknown}, which are not inputs of {graph.name!r}", fix=hint)
        axes = {n: in_axes.get(n) for n in names}
    else:
        if len(in_axes) != len(names):
            raise IRError(f"vmap in_axes has {len(in_axes)} entries for {len(names)} inputs",
                          fix="give one axis (or None) per graph input, or a mapping by name")
        axes = dict(zip(names, in_axes))
    if all(a is None for a in axes.values()):
        raise IRError("vmap: no input is batched", fix="give at least one input an axis in in_axes")
    size: Dim
    if axis_size is None:
        size = "vmap"
        k = 1
        while size in graph.symbols:
            size, k = f"vmap{k}", k + 1
    else:
        size = axis_size
    reserved = set(graph.types) | {n.name for n in graph.nodes}
    b = ADBuilder(name or f"{graph.name}_vmap", reserved)
    env: dict[str, tuple[Tensor, bool]] = {}
    for v in graph.inputs:
        a = axes[v.name]
        if a is None:
            env[v.name] = (b.input(v.name, v.type.dtype, v.type.shape), False)
            continue
        a = normalize_axis(a, v.type.rank + 1)
        t = b.input(v.name, v.type.dtype, v.type.shape[:a] + (size,) + v.type.shape[a:])
        if a:
            t = b.op("transpose", t, perm=(a, *range(a), *range(a + 1, t.rank)))
        env[v.name] = (t, True)
    # Outputs that do not depend on a batched input are broadcast at the end, under their own
    # name: the nodes producing them are re-emitted under fresh names.
    batched = {n for n, a in axes.items() if a is not None}
    for node in graph.nodes:
        if any(i in batched for i in node.inputs):
            batched.update(node.outputs)
    rename = frozenset(o for o in graph.outputs if o not in batched)
    _batch_nodes(b, graph, env, size, fresh=False, rename=rename)
    leaves = {v.name for v in graph.inputs} | {p.name for p in graph.params}
    for o in graph.outputs:
        t, f = env[o]
        if f:
            b.output(t, o)
        else:  # an unbatched input or parameter returned as is keeps its name for the input
            name = o if o not in leaves else unique_name(f"{o}_batched", b._types)
            b.output(b.op("expand", t, shape=(size, *t.shape)), name)
    return prune(b.build(), keep_params=[p.name for p in graph.params])


# -- batching rules --------------------------------------------------------------------------------

def _shift(axis: Any, rank: int) -> int:
    return normalize_axis(int(axis), rank) + 1


# The reductions (reduce_*, argmax, argmin) and the movement ops (reshape, transpose, expand, slice,
# concat, pad) carry their rules on their schemas (OpSchema.batch): see rlx_core.ir.ops.

def _axis_rule(op: str, min_rank: int = 0) -> None:
    """Ops whose only axis attribute is ``axis`` and whose batched operand is input 0 only."""
    def rule(b: ADBuilder, ins: Sequence[Tensor], flags: Flags, attrs: Attrs, size: Dim) -> Any:
        if any(flags[1:]) or ins[0].rank - 1 < min_rank:
            return None
        a = dict(attrs)
        a["axis"] = _shift(a["axis"], ins[0].rank - 1)
        return [b.op(op, *ins, **a)], [True]

    register_batch_rule(op, rule)


for _op in ("softmax", "log_softmax", "layer_norm", "rms_norm"):
    _axis_rule(_op)
_axis_rule("cumsum", min_rank=1)


@register_batch_rule("linear")
def _linear(b: ADBuilder, ins: Sequence[Tensor], flags: Flags, attrs: Attrs, size: Dim) -> Any:
    if any(flags[1:]):
        return None
    return [b.op("linear", *ins)], [True]


@register_batch_rule("matmul")
def _matmul(b: ADBuilder, ins: Sequence[Tensor], flags: Flags, attrs: Attrs, size: Dim) -> Any:
    (a, c), (fa, fc) = ins, flags
    out = REGISTRY.get("matmul").infer([_unbatched(a, fa), _unbatched(c, fc)], attrs)[0]
    if fa and a.rank == 2:
        a = reshape(b, a, (a.shape[0], 1, a.shape[1]))
    if fc and c.rank == 2:
        c = reshape(b, c, (c.shape[0], c.shape[1], 1))

    def nbatch(t: Tensor, f: bool) -> int:
        return max(t.rank - 2 - (1 if f else 0), 0)

    n = max(nbatch(a, fa), nbatch(c, fc))
    if fa and nbatch(a, fa) < n:
        a = reshape(b, a, (a.shape[0],) + (1,) * (n - nbatch(a, fa)) + a.shape[1:])
    if fc and nbatch(c, fc) < n:
        c = reshape(b, c, (c.shape[0],) + (1,) * (n - nbatch(c, fc)) + c.shape[1:])
    y = b.op("matmul", a, c)
    return [reshape(b, y, (size, *out.shape))], [True]


@register_batch_rule("gather")
def _gather(b: ADBuilder, ins: Sequence[Tensor], flags: Flags, attrs: Attrs, size: Dim) -> Any:
    (x, idx), (fx, fi) = ins, flags
    rx = _orig_rank(x, fx)
    ax = normalize_axis(int(attrs["axis"]), rx)  # type: ignore[arg-type]
    if fx and not fi:
        return [b.op("gather", x, idx, axis=ax + 1)], [True]
    if fi and not fx:
        y = b.op("gather", x, idx, axis=ax)
        if ax:
            y = b.op("transpose", y, perm=(ax, *range(ax), *range(ax + 1, y.rank)))
        return [y], [True]
    return None


@register_batch_rule("scatter_add")
def _scatter_add(b: ADBuilder, ins: Sequence[Tensor], flags: Flags, attrs: Attrs, size: Dim) -> Any:
    r = _orig_rank(ins[0], flags[0])
    xs = [_batched(b, t, f, size) for t, f in zip(ins, flags)]
    return [b.op("scatter_add", *xs, axis=_shift(attrs["axis"], r))], [True]


@register_batch_rule("conv2d")
def _conv2d(b: ADBuilder, ins: Sequence[Tensor], flags: Flags, attrs: Attrs, size: Dim) -> Any:
    (x, w), (fx, fw) = ins, flags
    a = dict(attrs)
    if fx and not fw and isinstance(x.shape[0], int) and isinstance(x.shape[1], int):
        bsz, n = x.shape[0], x.shape[1]
        y = b.op("conv2d", reshape(b, x, (bsz * n, *x.shape[2:])), w, **a)
        return [reshape(b, y, (bsz, n, *y.shape[1:]))], [True]
    if not isinstance(size, int):
        return None
    # One grouped convolution: the batch becomes groups (x channels and w output channels).
    xb, wb = _batched(b, x, fx, size), _batched(b, w, fw, size)
    n, c, h, wd = xb.shape[1:]
    o, cg, kh, kw = wb.shape[1:]
    xt = reshape(b, b.op("transpose", xb, perm=(1, 0, 2, 3, 4)), (n, size * c, h, wd))  # type: ignore[operator]
    wt = reshape(b, wb, (size * o, cg, kh, kw))  # type: ignore[operator]
    a["groups"] = size * int(a["groups"])
    y = b.op("conv2d", xt, wt, **a)
    y = reshape(b, y, (n, size, o, *y.shape[2:]))
    return [b.op("transpose", y, perm=(1, 0, 2, 3, 4))], [True]


@register_batch_rule("conv2d_bias")
def _conv2d_bias(b: ADBuilder, ins: Sequence[Tensor], flags: Flags, attrs: Attrs, size: Dim) -> Any:
    x = ins[0]
    if flags[1] or flags[2] or not (isinstance(x.shape[0], int) and isinstance(x.shape[1], int)):
        return None
    bsz, n = x.shape[0], x.shape[1]
    y = b.op("conv2d_bias", reshape(b, x, (bsz * n, *x.shape[2:])), ins[1], ins[2], **dict(attrs))
    return [reshape(b, y, (bsz, n, *y.shape[1:]))], [True]


@register_batch_rule("attention")
def _attention(b: ADBuilder, ins: Sequence[Tensor], flags: Flags, attrs: Attrs, size: Dim) -> Any:
    kind = attrs["mask"]
    if _orig_rank(ins[0], flags[0]) != 3 or kind == "padding":
        return None  # 4-D heads or a (batch, keys) mask: batch the decomposition instead
    qkv = [_batched(b, t, f, size) for t, f in zip(ins[:3], flags[:3])]
    extra = []
    if kind == "bias":
        m, fm = ins[3], flags[3]
        if fm:
            m = reshape(b, m, (m.shape[0],) + (1,) * (3 - (m.rank - 1)) + m.shape[1:])
        extra.append(m)
    return [b.op("attention", *qkv, *extra, **dict(attrs))], [True]


@register_batch_rule("embedding")
def _embedding(b: ADBuilder, ins: Sequence[Tensor], flags: Flags, attrs: Attrs, size: Dim) -> Any:
    if flags[0]:
        return None
    return [b.op("embedding", *ins)], [True]
