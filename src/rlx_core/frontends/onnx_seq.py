"""ONNX sequence values (``seq(tensor)``) as import-time lists of RLX values (issue 17).

RLX graphs carry tensors only, so an ONNX sequence never reaches a graph: while the nodes are
translated it is a :class:`SeqValue`, a tuple of importer values (run-time tensors, constants or
symbolic shapes) of **static length**, and every sequence operator is list manipulation at import:

* ``SequenceEmpty``, ``SequenceConstruct``, ``SequenceInsert``, ``SequenceErase``, ``SequenceAt``,
  ``SequenceLength`` (a constant) build, edit and read the list; a *position* computed at run time
  is value-keyed by staged execution (:class:`~rlx_core.frontends.onnx.RuntimeValueError`: the value
  becomes a constant of the next stage, compiled once per distinct value);
* ``SplitToSequence`` slices a tensor (split sizes known at import, or value-keyed the same way),
  ``ConcatFromSequence`` concatenates or stacks the elements with the ``concat`` IR op;
* ``SequenceMap`` copies its body once per element (the body's ops run on the backend per element);
* ``Loop`` carrying a sequence needs nothing more (the Loop handler unrolls a static trip count and
  carries any importer value); ``If`` with a condition computed at run time and sequence-typed
  branch outputs is *predicated*: both branches are translated and every element is chosen with the
  ``where`` IR op on the backend, when both branches give sequences of the same length with elements
  of equal shape and dtype and are small (:data:`PREDICATE_MAX_NODES`) and free of random-number
  operators (otherwise the condition is value-keyed by staged execution, as for tensor outputs).

A length that depends on tensor data (``SplitToSequence`` with run-time split sizes whose values
are not small, ``Loop`` with a data-dependent exit ...) is refused by the existing rules, naming
the node.

**Graph inputs.** A sequence-typed graph input has a length known only when it is fed, so
:func:`~rlx_core.frontends.onnx.load_onnx` raises :class:`SequenceInputError` (a
:class:`~rlx_core.frontends.onnx.SymbolicShapeError`: a fixed signature resolves it). Staged
execution (:func:`~rlx_core.frontends.onnx.load_onnx_model`, the ONNX backend adapter) then imports
the model once per input signature, which for a sequence is its length and each element's dtype and
shape (:func:`signature`): :func:`bind_sequences` rewrites the model so the sequence ``x`` of ``n``
elements is the tensor inputs ``x[0]`` ... ``x[n-1]`` and a ``SequenceConstruct`` node (``SequenceEmpty``
for ``n == 0``), and :func:`flatten_feed` feeds the list the same way. Running the model again with
another length compiles another variant (cached, ``RLX_ONNX_STAGED_CACHE``).

**Graph outputs.** A sequence output ``y`` of ``n`` elements is the RLX graph outputs ``y[0]`` ...
``y[n-1]`` (what :func:`~rlx_core.frontends.onnx.load_onnx` returns); :func:`pack_outputs` turns them
back into a Python list of arrays, which is what staged execution and the ONNX backend adapter return
for it (as ``onnx.reference`` and ONNX Runtime do). An empty sequence has no graph output: a packed
output with no element is the empty list.

**Optional values** are translated by :mod:`rlx_core.frontends.onnx_optional` (a present optional is
its value), so an optional holding a sequence is a :class:`SeqValue` there too; here only an
``optional(seq(tensor))`` *graph input* is added, bound like a sequence when it is fed present (a
list); fed empty (None) it is refused (an absent optional has no value in an RLX graph).

``rlx run`` feeds ``.npy`` arrays only, so it cannot feed a sequence input: it reports the
:class:`SequenceInputError` (use ``load_onnx_model(path).run({"x": [a, b]})`` from Python).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import InputError
from ..ir.builder import Tensor
from . import onnx as _o
from .onnx import (
    _HANDLERS,
    _ONNX_TO_DTYPE,
    DataDependentShapeError,
    RuntimeValueError,
    SymbolicShapeError,
    UnsupportedOnnxError,
    _Const,
    _handler,
    _Importer,
    _Sym,
)
from .onnx_misc import _run_body

_MALFORMED = "the model is malformed: check it with onnx.checker.check_model"

#: The ONNX operators whose inputs or outputs are sequences (never folded by the generic path: the
#: handlers keep constant elements constant themselves).
SEQUENCE_OPS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase",
                          "SequenceAt", "SequenceLength", "SplitToSequence", "ConcatFromSequence",
                          "SequenceMap"})


class SequenceInputError(SymbolicShapeError):
    """A sequence-typed graph input: its length (and its elements' shapes) are known only at run
    time, so the model is imported once per fed signature (staged execution does that)."""


class SeqValue:
    """An ONNX sequence while a model is imported: its elements (RLX tensors, constants, symbolic
    shapes) and element dtype (known even when empty, from ``SequenceEmpty``'s ``dtype``).

    Only the sequence handlers read it. Every tensor-only path of the importer reads a value's
    ``array`` (or makes it a tensor through it), which for a sequence raises the refusal naming it,
    so a sequence can never be mistaken for a tensor.
    """

    __slots__ = ("dtype", "elems")

    def __init__(self, elems: Iterable[Any], dtype: DType | None) -> None:
        self.elems: tuple[Any, ...] = tuple(elems)
        self.dtype = dtype

    @property
    def array(self) -> np.ndarray:
        raise UnsupportedOnnxError(
            f"a sequence value ({len(self.elems)} element(s)) is used where a tensor is needed",
            fix="the model is malformed (a sequence where the operator takes a tensor), or the operator "
                "takes sequences and is not translated; check it with onnx.checker.check_model")

    def __len__(self) -> int:
        return len(self.elems)

    def __repr__(self) -> str:
        return f"SeqValue({len(self.elems)} x {self.dtype})"


# ---------------------------------------------------------------------------------------------
# Element helpers


def _dtype_of(v: Any) -> DType:
    if isinstance(v, Tensor):
        return v.dtype
    if isinstance(v, _Sym):
        return v.dtype
    return DType.parse(v.array.dtype)


def _shape_of(v: Any) -> tuple[Any, ...]:
    if isinstance(v, Tensor):
        return tuple(v.shape)
    if isinstance(v, _Sym):
        return tuple(v.arr.shape)
    return tuple(v.array.shape)


def _seq(imp: _Importer, v: Any, what: str) -> SeqValue:
    if not isinstance(v, SeqValue):
        raise imp.unsupported(f"{what} is a tensor where a sequence is needed", fix=_MALFORMED)
    return v


def _tensor_elem(imp: _Importer, v: Any, what: str) -> Any:
    if v is None:
        raise imp.unsupported(f"{what} is missing", fix=_MALFORMED)
    if isinstance(v, SeqValue):
        raise imp.unsupported(f"{what} is a sequence; a sequence's elements are tensors (no nested "
                              f"sequences in RLX)", fix="flatten the nested sequence before export")
    return v


def _check_dtype(imp: _Importer, seq: SeqValue, v: Any, op: str) -> None:
    dt = _dtype_of(v)
    if seq.dtype is not None and dt != seq.dtype:
        raise imp.unsupported(f"{op}: a {dt.value} tensor in a sequence of {seq.dtype.value}",
                              fix=_MALFORMED)


def _position(imp: _Importer, v: Any, n: int, op: str, *, insert: bool) -> int | None:
    """The constant position input (None when absent); a run-time position is value-keyed."""
    if v is None:
        return None
    if isinstance(v, Tensor):
        raise imp.needs_values([v], f"{op} position is computed at run time")
    pos = imp.scalar(v, f"{op} position")
    if pos is None:
        raise imp.unsupported(f"{op} position is an empty tensor", fix=_MALFORMED)
    pos = int(pos)
    hi = n if insert else n - 1
    if not -n <= pos <= hi:
        raise imp.unsupported(f"{op} position {pos} is outside [{-n}, {hi}] for a sequence of {n} element(s)",
                              fix="ONNX defines this as an error: fix the position")
    return pos + n if pos < 0 else pos


# ---------------------------------------------------------------------------------------------
# Sequence operators


@_handler("SequenceEmpty")
def _sequence_empty(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    code = int(attrs.get("dtype", 1))
    dt = _ONNX_TO_DTYPE.get(code)
    if dt is None:
        raise imp.unsupported(f"SequenceEmpty of ONNX type {_o._onnx_type_name(code)}, which RLX does not "
                              f"have",
                              fix=f"RLX dtypes: {', '.join(d.value for d in DType)}")
    return [SeqValue((), dt)]


@_handler("SequenceConstruct")
def _sequence_construct(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    elems = [_tensor_elem(imp, v, f"SequenceConstruct input {k}") for k, v in enumerate(ins)]
    if not elems:
        raise imp.unsupported("SequenceConstruct with no input", fix=_MALFORMED)
    dts = {_dtype_of(v) for v in elems}
    if len(dts) != 1:
        raise imp.unsupported(f"SequenceConstruct of tensors of different dtypes "
                              f"({sorted(d.value for d in dts)})",
                              fix=_MALFORMED)
    return [SeqValue(elems, dts.pop())]


@_handler("SequenceInsert")
def _sequence_insert(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    seq = _seq(imp, ins[0], "SequenceInsert input 0")
    x = _tensor_elem(imp, ins[1] if len(ins) > 1 else None, "SequenceInsert tensor")
    _check_dtype(imp, seq, x, "SequenceInsert")
    pos = _position(imp, ins[2] if len(ins) > 2 else None, len(seq), "SequenceInsert", insert=True)
    elems = list(seq.elems)
    elems.insert(len(elems) if pos is None else pos, x)
    return [SeqValue(elems, _dtype_of(x))]


@_handler("SequenceErase")
def _sequence_erase(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    seq = _seq(imp, ins[0], "SequenceErase input 0")
    if not seq.elems:
        raise imp.unsupported("SequenceErase of an empty sequence", fix="ONNX defines this as an error")
    pos = _position(imp, ins[1] if len(ins) > 1 else None, len(seq), "SequenceErase", insert=False)
    elems = list(seq.elems)
    del elems[len(elems) - 1 if pos is None else pos]
    return [SeqValue(elems, seq.dtype)]


@_handler("SequenceAt")
def _sequence_at(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    seq = _seq(imp, ins[0], "SequenceAt input 0")
    pos = _position(imp, ins[1] if len(ins) > 1 else None, len(seq), "SequenceAt", insert=False)
    if pos is None:
        raise imp.unsupported("SequenceAt without a position", fix=_MALFORMED)
    return [seq.elems[pos]]


@_handler("SequenceLength")
def _sequence_length(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    return [_Const(np.array(len(_seq(imp, ins[0], "SequenceLength input")), np.int64))]


def _static_axis(imp: _Importer, shape: Sequence[Any], axis: int, op: str, extra: int = 0) -> int:
    r = len(shape) + extra
    if not -r <= axis < max(r, 1):
        raise imp.unsupported(f"{op} axis {axis} is outside [{-r}, {r - 1}]", fix=_MALFORMED)
    return axis % max(r, 1)


def _take_range(imp: _Importer, x: Any, axis: int, start: int, stop: int, keep: bool) -> Any:
    """``x[start:stop]`` along ``axis`` (the axis dropped when not ``keep``; then stop == start + 1)."""
    if isinstance(x, _Const):
        part = np.take(x.array, np.arange(start, stop), axis=axis)
        return _Const(part if keep else np.squeeze(part, axis=axis))
    t = imp.t(x)
    s = imp.g.op("slice", t, starts=(start,), stops=(stop,), axes=(axis,))
    if keep:
        return s
    return imp.g.op("reshape", s, shape=t.shape[:axis] + t.shape[axis + 1:])


@_handler("SplitToSequence")
def _split_to_sequence(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = _tensor_elem(imp, ins[0] if ins else None, "SplitToSequence input")
    shape = _shape_of(x)
    if not shape:
        raise imp.unsupported("SplitToSequence of a scalar", fix=_MALFORMED)
    axis = _static_axis(imp, shape, int(attrs.get("axis", 0)), "SplitToSequence")
    d = shape[axis]
    if isinstance(d, str):
        raise imp.symbolic(f"SplitToSequence along the symbolic dim {d!r}: the sequence length would "
                           f"depend on it", [d])
    d = int(d)
    split = ins[1] if len(ins) > 1 else None
    keep = True
    if split is None:
        sizes = [1] * d
        keep = bool(int(attrs.get("keepdims", 1)))
    else:
        if isinstance(split, Tensor):
            raise imp.needs_values([split], "SplitToSequence split is computed at run time, so the "
                                            "sequence length depends on tensor data")
        if isinstance(split, SeqValue):
            raise imp.unsupported("SplitToSequence split is a sequence", fix=_MALFORMED)
        arr = np.asarray(split.arr if isinstance(split, _Sym) else split.array)
        if any(not isinstance(v, (int, np.integer)) for v in arr.reshape(-1).tolist()):
            raise imp.symbolic("SplitToSequence split depends on a symbolic dim")
        vals = [int(v) for v in arr.reshape(-1)]
        if any(v <= 0 for v in vals):
            raise imp.unsupported(f"SplitToSequence split {vals} has a non-positive entry",
                                  fix="ONNX requires positive split sizes")
        if arr.ndim == 0:
            sizes = [vals[0]] * (d // vals[0]) + ([d % vals[0]] if d % vals[0] else [])
        elif arr.ndim == 1:
            if sum(vals) != d:
                raise imp.unsupported(f"SplitToSequence split {vals} sums to {sum(vals)}, the axis has {d}",
                                      fix=_MALFORMED)
            sizes = vals
        else:
            raise imp.unsupported(f"SplitToSequence split of rank {arr.ndim}", fix=_MALFORMED)
    elems, start = [], 0
    for n in sizes:
        elems.append(_take_range(imp, x, axis, start, start + n, keep))
        start += n
    return [SeqValue(elems, _dtype_of(x))]


@_handler("ConcatFromSequence")
def _concat_from_sequence(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    seq = _seq(imp, ins[0] if ins else None, "ConcatFromSequence input")
    if not seq.elems:
        raise imp.unsupported("ConcatFromSequence of an empty sequence (its shape is not defined)",
                              fix="ONNX requires at least one element")
    new_axis = bool(int(attrs.get("new_axis", 0)))
    if "axis" not in attrs:
        raise imp.unsupported("ConcatFromSequence without its axis attribute", fix=_MALFORMED)
    shape = _shape_of(seq.elems[0])
    axis = _static_axis(imp, shape, int(attrs["axis"]), "ConcatFromSequence", 1 if new_axis else 0)
    if all(isinstance(v, _Const) for v in seq.elems):
        arrs = [v.array for v in seq.elems]
        return [_Const(np.stack(arrs, axis=axis) if new_axis else np.concatenate(arrs, axis=axis))]
    ts = [imp.t(v) for v in seq.elems]
    if new_axis:
        ts = [imp.g.op("reshape", t, shape=(*t.shape[:axis], 1, *t.shape[axis:])) for t in ts]
    if len(ts) == 1:
        return [ts[0]]
    return [imp.g.op("concat", *ts, axis=axis)]


@_handler("SequenceMap")
def _sequence_map(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    body = attrs["body"]
    if not ins or not isinstance(ins[0], SeqValue):
        raise imp.unsupported("SequenceMap input 0 is not a sequence", fix=_MALFORMED)
    lengths = {len(v) for v in ins if isinstance(v, SeqValue)}
    if len(lengths) != 1:
        raise imp.unsupported(f"SequenceMap over sequences of different lengths {sorted(lengths)}",
                              fix="ONNX requires every input sequence to have the same length")
    n = lengths.pop()
    per: list[list[Any]] = [[] for _ in body.output]
    snapshot = dict(imp.env)
    for i in range(n):
        feeds = [v.elems[i] if isinstance(v, SeqValue) else v for v in ins]
        outs = _run_body(imp, body, feeds, "SequenceMap")
        for k, v in enumerate(outs):
            per[k].append(_tensor_elem(imp, v, f"SequenceMap body output {k}"))
    imp.env.clear()
    imp.env.update(snapshot)
    result = []
    for k, vals in enumerate(per):
        if vals:
            result.append(SeqValue(vals, _dtype_of(vals[0])))
            continue
        tt = body.output[k].type
        code = tt.tensor_type.elem_type if tt.HasField("tensor_type") else 0
        result.append(SeqValue((), _ONNX_TO_DTYPE.get(code)))
    return result


# ---------------------------------------------------------------------------------------------
# If with sequence-typed branch outputs and a run-time condition: predicated with `where`


#: The most nodes (subgraphs included) a branch may have to be predicated: both branches always run.
PREDICATE_MAX_NODES = 256
#: Operators whose result is not a function of their inputs: a branch holding one is never predicated.
_RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                         "Multinomial", "Bernoulli"})


def _is_seq_typed(g: Any) -> bool:
    return any(o.type.HasField("sequence_type") for o in g.output)


def _nodes(g: Any) -> Iterable[Any]:
    for n in g.node:
        yield n
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _nodes(sub)


def _predicable(g: Any) -> bool:
    nodes = list(_nodes(g))
    return len(nodes) <= PREDICATE_MAX_NODES and not any(n.op_type in _RANDOM_OPS for n in nodes)


def _run_branch(imp: _Importer, branch: Any) -> list[Any]:
    for t in branch.initializer:
        imp.env[t.name] = _Const(imp._tensor_array(t), t.name)
    saved = (imp.node, imp.node_where, imp.g.prefix)
    imp.depth += 1
    try:
        imp._run_nodes(branch.node)
    finally:
        imp.depth -= 1
        imp.node, imp.node_where, imp.g.prefix = saved
    return [imp.env[o.name] for o in branch.output]


def _select(imp: _Importer, cond: Tensor, a: Any, b: Any) -> Any | None:
    """``cond ? a : b`` for one branch output pair, or None when the branches cannot be merged."""
    if isinstance(a, SeqValue) or isinstance(b, SeqValue):
        if not (isinstance(a, SeqValue) and isinstance(b, SeqValue)) or len(a) != len(b):
            return None
        if a.dtype is not None and b.dtype is not None and a.dtype != b.dtype:
            return None
        elems = []
        for x, y in zip(a.elems, b.elems):
            e = _select(imp, cond, x, y)
            if e is None:
                return None
            elems.append(e)
        return SeqValue(elems, a.dtype if a.dtype is not None else b.dtype)
    if a is b:
        return a
    if _dtype_of(a) != _dtype_of(b) or _shape_of(a) != _shape_of(b):
        return None
    return imp.g.op("where", cond, imp.t(a), imp.t(b))


_prev_if = _HANDLERS["If"]


@_handler("If")
def _if(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """If whose branches give sequences and whose condition is computed at run time: both branches
    are translated and each element selected with ``where`` (module docstring). Anything else is
    the If translation this module found registered."""
    cond = ins[0] if ins else None
    then_g, else_g = attrs.get("then_branch"), attrs.get("else_branch")
    if not (isinstance(cond, Tensor) and then_g is not None and else_g is not None
            and (_is_seq_typed(then_g) or _is_seq_typed(else_g))):
        return list(_prev_if(imp, node, ins, attrs))
    c = imp.t(cond)
    if c.dtype != DType.BOOL or not all(d == 1 for d in c.shape) or \
            not (_predicable(then_g) and _predicable(else_g)):
        return list(_prev_if(imp, node, ins, attrs))
    snapshot = dict(imp.env)
    try:
        then_out = _run_branch(imp, then_g)
        imp.env.clear()
        imp.env.update(snapshot)
        else_out = _run_branch(imp, else_g)
    except (RuntimeValueError, DataDependentShapeError, UnsupportedOnnxError):
        # A branch that cannot be translated with the condition unknown: value-key the condition.
        imp.env.clear()
        imp.env.update(snapshot)
        return list(_prev_if(imp, node, ins, attrs))
    imp.env.clear()
    imp.env.update(snapshot)
    c0 = imp.g.op("reshape", c, shape=()) if c.shape != () else c
    merged = [_select(imp, c0, a, b) for a, b in zip(then_out, else_out)]
    if len(then_out) != len(else_out) or any(m is None for m in merged):
        return list(_prev_if(imp, node, ins, attrs))
    return merged


# ---------------------------------------------------------------------------------------------
# Import/run boundary: sequence graph inputs and outputs


def element_name(name: str, i: int) -> str:
    """The RLX name of element ``i`` of the sequence graph input or output ``name``."""
    return f"{name}[{i}]"


def _seq_type(tp: Any) -> Any:
    """The ``sequence_type`` of a sequence or of an optional holding one, else None."""
    if tp.HasField("optional_type"):
        tp = tp.optional_type.elem_type
    return tp.sequence_type if tp.HasField("sequence_type") else None


def is_sequence_input(vi: Any) -> bool:
    """A graph input of type ``seq(tensor)``, or ``optional(seq(tensor))`` (fed present: a present
    optional is its value, as onnx_optional translates it)."""
    return _seq_type(vi.type) is not None


def sequence_input_error(vi: Any, where: str) -> SequenceInputError:
    """The importer's error for a sequence-typed graph input (staged execution resolves it)."""
    return SequenceInputError(
        f"graph input {vi.name!r} is a sequence: its length and element shapes are known only when it is "
        f"fed, and an RLX graph takes tensors of static rank", where=where,
        fix="run the model with staged execution, which imports it once per fed sequence length and "
            "element shapes: rlx_core.frontends.onnx.load_onnx_model(path).run({name: [array, ...]}) or "
            "the ONNX backend (rlx_core.frontends.onnx_backend.RLXBackend); `rlx run` feeds .npy arrays "
            "only and cannot feed a sequence")


def emit_output(imp: _Importer, v: SeqValue, name: str) -> None:
    """Graph output ``name`` holding a sequence: one RLX output per element (:func:`element_name`)."""
    for i, e in enumerate(v.elems):
        imp.g.output(imp.t(e), element_name(name, i))
    outs = imp.proto.graph.output
    if not v.elems and not imp.g._outputs and outs and outs[-1].name == name:
        raise imp.unsupported("every graph output is an empty sequence: the RLX graph would compute nothing",
                              fix="the model's result does not depend on its inputs; use the empty lists "
                                  "directly")


@dataclass(frozen=True)
class SeqSig:
    """The import signature of a fed sequence: each element's dtype and shape."""

    elems: tuple[tuple[str, tuple[int, ...]], ...]


def signature(value: Any) -> Any:
    """What an input-specialised import is keyed on: a tensor's shape, a sequence's :class:`SeqSig`."""
    if isinstance(value, list):
        return SeqSig(tuple((str(np.asarray(e).dtype), tuple(np.shape(e))) for e in value))
    return np.asarray(value).shape


def normalize_feed(proto: Any, feed: Mapping[str, Any]) -> dict[str, Any]:
    """Inputs as arrays, and a sequence-typed input's value as a list of arrays (a tensor input given
    as nested lists stays one array, as before)."""
    seqs = {vi.name for vi in proto.graph.input if is_sequence_input(vi)}
    out: dict[str, Any] = {}
    for k, v in feed.items():
        if k in seqs:
            if v is None:
                raise UnsupportedOnnxError(
                    f"input {k!r} is an optional sequence fed empty (None); an absent optional has no value "
                    f"in an RLX graph", where="ONNX model input",
                    fix="feed the sequence (a list of arrays, possibly empty)")
            if isinstance(v, np.ndarray) or not isinstance(v, (list, tuple)):
                raise InputError(f"input {k!r} is a sequence; got {type(v).__name__}",
                                 where="ONNX model input", fix="pass a list of arrays (one per element)")
            out[k] = [np.asarray(e) for e in v]
        else:
            out[k] = np.asarray(v)
    return out


def flatten_feed(feed: Mapping[str, Any]) -> dict[str, Any]:
    """A feed with every list value (a sequence) given as its elements' inputs :func:`element_name`."""
    out: dict[str, Any] = {}
    for k, v in feed.items():
        if isinstance(v, list):
            out.update({element_name(k, i): np.asarray(e) for i, e in enumerate(v)})
        else:
            out[k] = v
    return out


def _all_names(graph: Any) -> set[str]:
    names = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    for n in graph.node:
        names.update(n.input)
        names.update(n.output)
        for a in n.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names |= _all_names(g)
    return names


def bind_sequences(model: Any, sigs: Mapping[str, Any]) -> Any:
    """``model`` (modified in place and returned) with each sequence input named in ``sigs`` (a
    :class:`SeqSig`) replaced by its elements' tensor inputs and a node rebuilding the sequence."""
    from onnx import helper

    g = model.graph
    todo = [(k, vi) for k, vi in enumerate(g.input) if is_sequence_input(vi) and isinstance(sigs.get(vi.name),
                                                                                               SeqSig)]
    if not todo:
        return model
    used = _all_names(g)
    new_inputs: list[Any] = []
    nodes: list[Any] = []
    for vi in list(g.input):
        sig = sigs.get(vi.name)
        if not (is_sequence_input(vi) and isinstance(sig, SeqSig)):
            new_inputs.append(vi)
            continue
        elem = _seq_type(vi.type).elem_type
        if elem.HasField("sequence_type") or elem.HasField("optional_type") or elem.HasField("map_type"):
            raise UnsupportedOnnxError(f"graph input {vi.name!r} is a sequence of non-tensors",
                                       where=f"graph input {vi.name!r}",
                                       fix="RLX sequences hold tensors only")
        code = elem.tensor_type.elem_type if elem.HasField("tensor_type") else 0
        names = []
        for i, (dt, shape) in enumerate(sig.elems):
            nm = element_name(vi.name, i)
            if nm in used:
                raise UnsupportedOnnxError(
                    f"sequence input {vi.name!r}: its element input name {nm!r} is already a value of the "
                    f"model", where=f"graph input {vi.name!r}", fix="rename that value of the model")
            names.append(nm)
            new_inputs.append(helper.make_tensor_value_info(
                nm, code or helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape))
        if names:
            nodes.append(helper.make_node("SequenceConstruct", names, [vi.name], name=f"{vi.name}/construct"))
        else:
            nodes.append(helper.make_node("SequenceEmpty", [], [vi.name], name=f"{vi.name}/construct",
                                          dtype=code or 1))
    del g.input[:]
    g.input.extend(new_inputs)
    rest = list(g.node)
    del g.node[:]
    g.node.extend(nodes + rest)
    return model


def sequence_value_info(name: str, value: list[Any]) -> Any:
    """A ``seq(tensor)`` value info for a list carried from one stage to the next."""
    from onnx import helper

    code = helper.np_dtype_to_tensor_dtype(np.asarray(value[0]).dtype) if value else 1
    elem = helper.make_tensor_type_proto(code, None)
    return helper.make_value_info(name, helper.make_sequence_type_proto(elem))


def pack_outputs(names: Sequence[str], out: Mapping[str, Any],
                 independent: Iterable[str] = ()) -> tuple[dict[str, Any], dict[str, str]]:
    """The RLX outputs ``out`` as the ONNX outputs ``names`` (a sequence's elements as a list), and
    where each was computed: "host" when every element is independent of the inputs (folded at
    import), else "backend"."""
    host = set(independent)
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for n in names:
        if n in out:
            values[n] = out[n]
            origins[n] = "host" if n in host else "backend"
            continue
        elems, i = [], 0
        while element_name(n, i) in out:
            elems.append(out[element_name(n, i)])
            i += 1
        values[n] = elems
        keys = [element_name(n, k) for k in range(i)]
        origins[n] = "backend" if any(k not in host for k in keys) else "host"
    return values, origins


def involves_sequences(op: str, inputs: Iterable[Any]) -> bool:
    """True when a node makes or reads a sequence: the importer's generic constant folding (one array
    per output) must leave it to its handler."""
    return op in SEQUENCE_OPS or any(isinstance(v, SeqValue) for v in inputs)


def _install() -> None:
    # SplitToSequence-24 adds bfloat16 only (the slices are dtype-agnostic).
    _o._OP_REVIEWED["SplitToSequence"] = max(_o._OP_REVIEWED.get("SplitToSequence", 0), 28)


_install()


__all__ = ["SEQUENCE_OPS", "SeqSig", "SeqValue", "SequenceInputError", "bind_sequences", "element_name",
           "emit_output", "flatten_feed", "involves_sequences", "is_sequence_input", "normalize_feed",
           "pack_outputs",
           "sequence_input_error", "sequence_value_info", "signature"]
