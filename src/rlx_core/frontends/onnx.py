"""Import ONNX models into RLX graphs: ``load_onnx("model.onnx") -> Graph``.

Covers the operators PyTorch's exporters (the ``torch.export``-based one and the legacy TorchScript
one) emit for MLPs, CNNs (ResNet family) and transformer encoders (BERT family), default-domain
opsets 1 to 28, each operator from the version its handler translates exactly (most from the
one in effect at opset 11, many older; see :func:`op_version_problem`). :data:`SUPPORTED_OPS` lists them.

Every ONNX value becomes one of three things while the nodes are translated in order:

* a **constant** (initializers, ``Constant`` nodes, and every node whose inputs are all constant:
  it is folded at import time with NumPy, through onnx's reference evaluator for the general case);
* a **symbolic shape**: a small integer tensor whose entries may be products of symbols, which is
  what ``Shape`` of a dynamic tensor gives. ``Shape -> Gather -> Concat -> Reshape`` chains are
  evaluated symbolically here, so they become static or symbolic ``reshape``/``expand``/``iota``
  attributes rather than run-time work;
* a run-time RLX **tensor** produced by HIR/MIR ops. Obvious fused patterns map to HIR ops:
  ``Gemm`` and ``MatMul`` + bias ``Add`` -> ``linear``, ``Conv`` -> ``conv2d_bias``,
  ``LayerNormalization`` -> ``layer_norm``, ``BatchNormalization`` -> ``batch_norm``,
  ``Gelu`` -> ``gelu``, ``Softmax`` -> ``softmax``, ``Gather`` of a weight table -> ``embedding``.

Dynamic dims (``dim_param`` or unknown) become RLX symbols; ``symbols=`` renames or fixes them.
An RLX dim is an int or a single symbol, so a value whose shape would be a product such as
``batch*seq`` cannot be represented: that is reported with the fix (fix the symbol's size).

Failures are :class:`~rlx_core.errors.RLXError` s with what/where/fix: an unsupported operator or
attribute raises :class:`UnsupportedOnnxError` naming the op type, node name and opset; a malformed
or truncated file raises :class:`~rlx_core.errors.SerializationError`.
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from .. import settings as _settings
from ..dtypes import LOWP_DTYPES, WIDE_UINT_DTYPES, DType
from ..errors import DTypeError, IRError, RLXError, SerializationError
from ..fold import FoldBudget as _CoreFoldBudget
from ..ir import symexpr
from ..ir.builder import GraphBuilder, Tensor
from ..ir.graph import Graph
from ..ir.types import Dim
from . import _onnx_proto
from . import onnx_schemas as _schemas

#: Default-domain opsets this importer accepts. Within them each operator is also checked per
#: version (:func:`op_version_problem`): a version older or newer than its handler translates exactly
#: is refused by name. MAX_OPSET is onnx 1.23's latest; every translated operator's changes up to it
#: were reviewed (see _OP_REVIEWED).
MIN_OPSET, MAX_OPSET = 1, 28

_INSTALL_FIX = _onnx_proto.INSTALL_FIX


class UnsupportedOnnxError(IRError):
    """The ONNX model uses an operator, attribute or pattern the importer cannot translate."""


class SymbolicShapeError(UnsupportedOnnxError):
    """A shape depends on dynamic dims in a way RLX cannot express; fixing the symbols' sizes helps."""


class RuntimeValueError(UnsupportedOnnxError):
    """A node needs the *value* of tensors computed at run time (an axes, shape, count or limit input):
    ``tensors`` names them (ONNX names) and ``node`` the node. Staged execution
    (:func:`rlx_core.frontends.onnx_staged.load_onnx_model`) computes them first and compiles them in.
    ``speculative``: the handler refused for another stated reason while these inputs were run-time
    tensors; staging tries them as constants and re-raises if that does not help."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None,
                 tensors: Sequence[str] = (), node: str = "", speculative: bool = False) -> None:
        super().__init__(what, where=where, fix=fix)
        self.tensors = tuple(tensors)
        self.node = node
        self.speculative = speculative


class DataDependentShapeError(UnsupportedOnnxError):
    """A node's output *shape* depends on its input data (NonZero, Unique, NonMaxSuppression, Compress
    with a run-time condition): ``node`` names it. Staged execution runs it on the host between stages."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None,
                 node: str = "", outputs: Sequence[str] = ()) -> None:
        super().__init__(what, where=where, fix=fix)
        self.node = node
        self.outputs = tuple(outputs)


_STAGED_FIX = ("compile it with staged execution: rlx_core.frontends.onnx.load_onnx_model(path) (the "
               "`rlx run` and ONNX backend paths use it), which computes the value first and compiles it in "
               "as a constant, or export with the value constant")


class _NotSymbolic(Exception):
    """Internal: a symbolic evaluation is not possible; translate the node to run-time ops."""


# ---------------------------------------------------------------------------------------------
# Symbolic integers: polynomials over shape symbols (batch*seq, 4*batch, past+seq; ir.symexpr)


class SymInt:
    """A dimension computed from shape symbols: a polynomial with int coefficients, held as the
    canonical expression string of :mod:`rlx_core.ir.symexpr` (so it is directly an RLX ``Dim``)."""

    __slots__ = ("expr",)

    def __init__(self, expr: str) -> None:
        self.expr = expr

    @staticmethod
    def of(d: Dim) -> SymLike:
        d = symexpr.canonical(d) if isinstance(d, str) else int(d)
        return SymInt(d) if isinstance(d, str) else int(d)

    @staticmethod
    def make(coef: int, syms: Iterable[str]) -> SymLike:
        return SymInt.of(symexpr.mul(int(coef), symexpr.prod(tuple(syms))))

    @property
    def syms(self) -> tuple[str, ...]:
        return tuple(sorted(symexpr.symbols(self.expr)))

    def key(self) -> str:
        return self.expr

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SymInt) and other.expr == self.expr

    def __hash__(self) -> int:
        return hash(self.expr)

    def __repr__(self) -> str:
        return self.expr


SymLike = Union[int, SymInt]


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _sym_of(d: Dim) -> SymLike:
    return SymInt.of(d)


def _dim_of(x: Any, what: str) -> Dim:
    if isinstance(x, SymInt):
        return x.expr
    if _is_int(x):
        return int(x)
    raise _NotSymbolic(what)


def _sym_result(d: Dim) -> SymLike:
    return SymInt(d) if isinstance(d, str) else int(d)


def s_mul(a: Any, b: Any) -> SymLike:
    if _is_int(a) and _is_int(b):
        return int(a) * int(b)
    return _sym_result(symexpr.mul(_dim_of(a, f"{a!r} * {b!r}"), _dim_of(b, f"{a!r} * {b!r}")))


def s_div(a: Any, b: Any) -> SymLike:
    """Exact division of symbolic polynomials; truncating (C-like) division of plain ints."""
    if _is_int(a) and _is_int(b):
        a, b = int(a), int(b)
        if b == 0:
            raise _NotSymbolic("division by zero")
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q
    q = symexpr.div_exact(_dim_of(a, f"{a!r} / {b!r}"), _dim_of(b, f"{a!r} / {b!r}"))
    if q is None:
        raise _NotSymbolic(f"{a!r} / {b!r}")
    return _sym_result(q)


def s_add(a: Any, b: Any) -> SymLike:
    if _is_int(a) and _is_int(b):
        return int(a) + int(b)
    return _sym_result(symexpr.add(_dim_of(a, f"{a!r} + {b!r}"), _dim_of(b, f"{a!r} + {b!r}")))


def s_sub(a: Any, b: Any) -> SymLike:
    if _is_int(a) and _is_int(b):
        return int(a) - int(b)
    return _sym_result(symexpr.sub(_dim_of(a, f"{a!r} - {b!r}"), _dim_of(b, f"{a!r} - {b!r}")))


def _nonneg(x: SymInt) -> bool:
    """True when the polynomial is >= 0 for every binding (all its coefficients are >= 0)."""
    return all(c >= 0 for c in symexpr.parse(x.expr).values())


def s_eq(a: Any, b: Any) -> bool:
    """Equality when it is decidable (dims are >= 0, so a symbol never equals a negative int)."""
    if _is_int(a) and _is_int(b):
        return int(a) == int(b)
    diff = s_sub(a, b)
    if _is_int(diff):
        return diff == 0
    for x, y in ((a, b), (b, a)):
        if isinstance(x, SymInt) and _is_int(y) and int(y) < 0 and _nonneg(x):
            return False
    raise _NotSymbolic(f"{a!r} == {b!r}")


def s_prod(xs: Iterable[Any]) -> SymLike:
    out: SymLike = 1
    for x in xs:
        out = s_mul(out, x)
    return out


# ---------------------------------------------------------------------------------------------
# Import-time values


class _Const:
    """A value known at import time (an initializer, a Constant node, a folded node)."""

    __slots__ = ("array", "name", "tensors")

    def __init__(self, array: Any, name: str | None = None) -> None:
        self.array = np.asarray(array)
        self.name = name
        self.tensors: dict[Any, Tensor] = {}


class _Live(_Const):
    """A value-keyed graph input of a staged import: its value is known (the stage is compiled for
    it, so shapes, axes and limits read it as a constant), and it is also fed at run time (``live``),
    so arithmetic on it runs on the backend instead of being folded at import."""

    __slots__ = ("live",)

    def __init__(self, array: Any, live: Tensor, name: str | None = None) -> None:
        super().__init__(array, name)
        self.live = live


class _Sym:
    """A small integer tensor whose entries are ints or :class:`SymInt` (a symbolic shape)."""

    __slots__ = ("arr", "dtype", "tensor")

    def __init__(self, arr: np.ndarray, dtype: DType) -> None:
        self.arr = arr
        self.dtype = dtype
        self.tensor: Tensor | None = None


Value = Union[Tensor, _Const, _Sym]

_ONNX_TO_DTYPE = {1: DType.F32, 2: DType.U8, 3: DType.I8, 4: DType.U16, 5: DType.I16, 6: DType.I32,
                  7: DType.I64, 9: DType.BOOL, 10: DType.F16, 11: DType.F64, 12: DType.U32, 13: DType.U64,
                  14: DType.C64, 16: DType.BF16, 17: DType.F8E4M3FN, 18: DType.F8E4M3FNUZ, 19: DType.F8E5M2,
                  20: DType.F8E5M2FNUZ, 21: DType.U4, 22: DType.I4, 23: DType.F4E2M1, 25: DType.U2,
                  26: DType.I2}
#: Bits per element of the types ONNX packs several to a byte (raw_data and external data).
_ONNX_PACKED_BITS = {21: 4, 22: 4, 23: 4, 25: 2, 26: 2}
#: The float8 types whose Cast/QuantizeLinear honour ``saturate`` (float4 always saturates).
_SATURATING = frozenset({DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ})


def _onnx_type_name(code: int) -> str:
    try:
        return str(_onnx_proto.pb().TensorProto.DataType.Name(code))
    except (RLXError, ValueError):
        return str(code)


def _has_sym(arr: np.ndarray) -> bool:
    return arr.dtype == object and any(isinstance(x, SymInt) for x in arr.flat)


def _to_obj(a: np.ndarray) -> np.ndarray:
    out = np.empty(a.shape, dtype=object)
    for idx in np.ndindex(a.shape):
        out[idx] = int(a[idx])
    return out


def _finish(arr: np.ndarray, dtype: DType) -> Value:
    """An evaluated shape computation: symbolic if any entry still holds a symbol, else constant."""
    arr = np.asarray(arr)
    if _has_sym(arr):
        return _Sym(arr, dtype)
    if arr.dtype == object:
        flat = [x for x in arr.flat]
        return _Const(np.asarray(flat, dtype=dtype.np).reshape(arr.shape))
    return _Const(arr.astype(dtype.np, copy=False))


def _elementwise(fn: Callable[..., Any], *arrs: np.ndarray) -> np.ndarray:
    b = np.broadcast_arrays(*arrs)
    out = np.empty(b[0].shape, dtype=object)
    for idx in np.ndindex(out.shape):
        out[idx] = fn(*(a[idx] for a in b))
    return out


# ---------------------------------------------------------------------------------------------
# Loading and validating the file


def read_model(model: Any, *, mapped: dict[str, tuple[str, int, int]] | None = None) -> tuple[Any, str]:
    """Parse ``model`` (a path, bytes or an ``onnx.ModelProto``) and load its external data.

    Returns ``(ModelProto, source)``. Every problem with the file is a SerializationError.
    ``mapped``: filled with ``name -> (file, offset, length)`` of the main graph's initializers read
    from external data (checked as :func:`resolve_external_data` checks them), for memory maps.
    """
    onnx = _onnx_proto.pb()  # the message classes only: onnx itself loads when a node needs it
    if isinstance(model, onnx.ModelProto):
        proto, source = model, f"ONNX model {model.graph.name or '(unnamed)'!r}"
        _check_model(proto, source)
        resolve_external_data(proto, None, source)  # refuses external data: there is no folder
        return proto, source
    if isinstance(model, (bytes, bytearray, memoryview)):
        data, source, base = bytes(model), "ONNX model bytes", None
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        source = f"file {os.fspath(model)}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SerializationError("the ONNX file does not exist", where=source,
                                     fix="check the path") from None
        except OSError as e:
            raise SerializationError(f"cannot read the ONNX file: {e.strerror or e}", where=source,
                                     fix="check the path and its permissions") from None
        base = path.parent
    else:
        raise SerializationError(f"load_onnx() needs a path, bytes or onnx.ModelProto, got "
                                 f"{type(model).__name__}", where="load_onnx",
                                 fix="pass the path of a .onnx file")
    if not data:
        raise SerializationError("the ONNX file is empty", where=source,
                                 fix="export the model again (torch.onnx.export(...))")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError and friends: never leak them raw
        raise SerializationError(f"the file is not a valid ONNX protobuf, or it is truncated "
                                 f"({type(e).__name__}: {e})", where=source,
                                 fix="export or download the model again; a .onnx file must be "
                                     "copied completely (check its size)") from None
    _check_model(proto, source)
    resolve_external_data(proto, base, source, mapped)
    return proto, source


# ---------------------------------------------------------------------------------------------
# External data: one checked resolver for every tensor in the model


def _walk_tensors(proto: Any) -> Iterable[tuple[Any, str]]:
    """Every TensorProto of the model, with where it is: initializers, sparse initializers, node
    attributes (``t``, ``tensors``, sparse ones), subgraphs at any depth, local functions and training
    info. onnx's own walker skips sparse tensors, so a path it misses could still read a file."""

    def sparse(sp: Any, what: str) -> Iterable[tuple[Any, str]]:
        yield sp.values, f"{what} (values)"
        yield sp.indices, f"{what} (indices)"

    def nodes(ns: Sequence[Any], where: str) -> Iterable[tuple[Any, str]]:
        for idx, node in enumerate(ns):
            label = node.name or f"{node.op_type}_{idx}"
            for a in node.attribute:
                yield from attribute(a, f"attribute {a.name!r} of ONNX node {label!r} (#{idx}, op "
                                        f"{node.op_type}) in {where}")

    def attribute(a: Any, what: str) -> Iterable[tuple[Any, str]]:
        if a.HasField("t"):
            yield a.t, what
        for t in a.tensors:
            yield t, what
        if a.HasField("sparse_tensor"):
            yield from sparse(a.sparse_tensor, what)
        for sp in a.sparse_tensors:
            yield from sparse(sp, what)
        if a.HasField("g"):
            yield from graph(a.g, f"the subgraph of {what}")
        for sub in a.graphs:
            yield from graph(sub, f"a subgraph of {what}")

    def graph(g: Any, where: str) -> Iterable[tuple[Any, str]]:
        for t in g.initializer:
            yield t, f"initializer of {where}"
        for sp in g.sparse_initializer:
            yield from sparse(sp, f"sparse initializer of {where}")
        yield from nodes(g.node, where)

    yield from graph(proto.graph, "the main graph")
    for f in proto.functions:
        fwhere = f"local function {f.name!r}"
        for a in f.attribute_proto:
            yield from attribute(a, f"default of attribute {a.name!r} of {fwhere}")
        yield from nodes(f.node, fwhere)
    for k, ti in enumerate(proto.training_info):
        yield from graph(ti.initialization, f"training_info[{k}].initialization")
        yield from graph(ti.algorithm, f"training_info[{k}].algorithm")


def resolve_external_data(proto: Any, base: str | os.PathLike[str] | None, source: str,
                          mapped: dict[str, tuple[str, int, int]] | None = None) -> None:
    """Replace every tensor's external data by the bytes it names, read from the model's folder.

    The rules (the same for initializers, Constant/ConstantOfShape attributes, sparse tensors and
    tensors in subgraphs): the location is a relative path without ``..``, it resolves (symlinks
    followed) to a regular file inside ``base``, and offset/length lie inside that file. Anything
    else is a SerializationError naming the tensor and where it is; nothing is ever read relative to
    the current directory. ``base=None`` (a model given as bytes or a ModelProto) refuses external
    data, since there is no folder it could be relative to. ``mapped``: see :func:`read_model`.
    """
    external = _onnx_proto.pb().TensorProto.EXTERNAL
    for t, what in _walk_tensors(proto):
        if t.data_location != external:
            continue
        where = f"tensor {t.name!r}, {what} in {source}"
        if base is None:
            raise SerializationError(
                "the tensor's data is in an external file, but the model was given as bytes or a "
                "ModelProto, so there is no model folder to read it from", where=where,
                fix="pass the path of the .onnx file (its external data is read from the same folder), "
                    "or embed the data: onnx.load(path) then onnx.save(model, path, "
                    "save_as_external_data=False)")
        spot: list[tuple[str, int, int]] = []
        t.raw_data = _read_external(t, os.fspath(base), where, spot)
        if mapped is not None and what == "initializer of the main graph" and spot:
            mapped[t.name] = spot[0]
        t.data_location = _onnx_proto.pb().TensorProto.DEFAULT
        del t.external_data[:]


_EXTERNAL_FIX = ("keep the external data file (e.g. model.onnx.data) in the .onnx file's folder and name it "
                 "by a relative path there; re-save the model with onnx.save(model, path, "
                 "save_as_external_data=True, location='model.onnx.data')")


def _read_external(t: Any, base: str, where: str, spot: list[tuple[str, int, int]] | None = None) -> bytes:
    """The bytes ``t``'s external data names (checked); ``spot`` gets (file, offset, length) read."""
    info: dict[str, str] = {}
    for e in t.external_data:
        info[e.key] = e.value

    def bad(what: str) -> SerializationError:
        return SerializationError(what, where=where, fix=_EXTERNAL_FIX)

    location = info.get("location", "")
    if not location or "\x00" in location:
        raise bad(f"the external data location {location!r} is empty or not a file name")
    parts = re.split(r"[\\/]+", location)
    if os.path.isabs(location) or location.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", location):
        raise bad(f"the external data location {location!r} is an absolute path; only files in the "
                  f"model's folder may be read")
    if ".." in parts:
        raise bad(f"the external data location {location!r} leaves the model's folder ('..')")
    root = os.path.realpath(base)
    full = os.path.realpath(os.path.join(root, *[p for p in parts if p]))
    if os.path.commonpath([root, full]) != root:
        raise bad(f"the external data location {location!r} resolves to {full}, outside the model's folder "
                  f"{root} (a symbolic link out of it)")
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise bad(f"the external data offset/length {info.get('offset')!r}/{info.get('length')!r} are not "
                  f"integers") from None
    if offset < 0 or (length is not None and length < 0):
        raise bad(f"the external data offset {offset} / length {length} is negative")
    try:
        with open(full, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise bad(f"the external data location {location!r} is not a regular file")
            if offset > st.st_size or (length is not None and offset + length > st.st_size):
                raise bad(f"the external data [{offset}, {offset + (length or 0)}) lies outside "
                          f"{location!r} ({st.st_size} bytes): the file is truncated or not this model's")
            want = _external_nbytes(t)
            if want is not None and (length if length is not None else st.st_size - offset) < want:
                raise bad(f"the tensor needs {want} bytes but {location!r} has only "
                          f"{length if length is not None else st.st_size - offset} at offset {offset}")
            f.seek(offset)
            # Read what the tensor needs, not a whole (possibly huge) file named without a length.
            n = length if length is not None else (want if want is not None else st.st_size - offset)
            if spot is not None:
                spot.append((full, offset, n))
            return f.read(n)
    except FileNotFoundError:
        raise bad(f"the external data file {location!r} does not exist in the model's folder "
                  f"{root}") from None
    except IsADirectoryError:
        raise bad(f"the external data location {location!r} is a folder, not a file") from None
    except OSError as e:
        raise bad(f"cannot read the external data file {location!r}: {e.strerror or e}") from None


#: Initializers from external data of at least this many bytes are memory-mapped (smaller ones, shape
#: vectors and biases, are copied: a map's page granularity would gain nothing there).
_MAP_MIN_BYTES = 64 << 10


def _mappable_dtype(onnx_type: int) -> np.dtype[Any] | None:
    """The NumPy dtype whose little-endian bytes are ONNX's external data of ``onnx_type`` as they
    are (plain fixed-width numbers; None for packed, bool, string and float8/bfloat16 types)."""
    name = None if onnx_type == _onnx_proto.pb().TensorProto.BOOL else _onnx_proto.RAW_DTYPES.get(onnx_type)
    dt = _ONNX_TO_DTYPE.get(onnx_type)
    if name is None or dt is None or np.dtype(dt.np) != np.dtype(name):
        return None
    return np.dtype(name)


def _external_nbytes(t: Any) -> int | None:
    """The bytes a fixed-size tensor's data must have (None for types RLX does not read anyway)."""
    dt = _ONNX_TO_DTYPE.get(t.data_type)
    if dt is None:
        return None
    n = max(0, math.prod(int(d) for d in t.dims))
    bits = _ONNX_PACKED_BITS.get(t.data_type)
    return n * dt.itemsize if bits is None else (n * bits + 7) // 8


def _check_model(proto: Any, source: str) -> None:
    g = proto.graph
    if proto.ir_version <= 0 or not proto.opset_import:
        raise SerializationError("the file is truncated, or it is not an ONNX model (it has no IR "
                                 "version or opset import)", where=source,
                                 fix="pass an ONNX model file (.onnx), e.g. one written by "
                                     "torch.onnx.export")
    if not g.output:
        raise SerializationError("the ONNX graph has no outputs: the file is truncated or malformed",
                                 where=source, fix="export or download the model again")


def _default_opset(proto: Any, source: str) -> int:
    for o in proto.opset_import:
        if o.domain in ("", "ai.onnx"):
            v = int(o.version)
            if not MIN_OPSET <= v <= MAX_OPSET:
                raise UnsupportedOnnxError(
                    f"ONNX default-domain opset {v} is not supported (this importer reads opsets "
                    f"{MIN_OPSET} to {MAX_OPSET})", where=source,
                    fix="re-export with a supported opset, e.g. torch.onnx.export(..., opset_version=17), "
                        "or convert it: onnx.version_converter.convert_version(model, 17)")
            return v
    others = sorted({o.domain for o in proto.opset_import})
    used = sorted({(n.domain, n.op_type) for n in proto.graph.node})
    if used and all(key in _CUSTOM for key in used):
        return MAX_OPSET  # every node has a registered handler: the default opset does not matter
    missing = sorted({d for d, op in used if (d, op) not in _CUSTOM}) or others
    raise UnsupportedOnnxError(
        f"the model imports no default-domain (ai.onnx) opset, only {', '.join(map(repr, others))}; "
        f"its operators come from domain(s) {', '.join(map(repr, missing))}, which RLX does not translate",
        where=source, fix=_domain_fix())


# ---------------------------------------------------------------------------------------------
# Operator versions: which versions of each translated operator the handlers implement exactly

#: The oldest version (an ONNX ``since_version``) of each operator whose handler is exact for it,
#: for operators translated from before the version in effect at opset 11 (the default floor). Older
#: versions differ: legacy ``broadcast``/``axis`` attributes on binary ops (before 7),
#: ``consumed_inputs`` (before 6), ``is_test`` (Dropout/BatchNormalization before 7), Cast's string
#: ``to`` (before 6), Reshape's shape attribute (before 5), Concat's optional axis (before 4), Pad's
#: ``paddings`` (before 2), Tile's ``tiles``/``axis`` inputs (before 6), Split's split input (before 2).
_OP_SINCE: dict[str, int] = {
    # onnx_index.py: the older versions only lack negative indices/axes, which the handlers accept.
    "Scatter": 9, "OneHot": 9, "Compress": 9, "Mod": 10, "TopK": 10,
    "NonZero": 9, "NonMaxSuppression": 10, "Unique": 11,  # onnx_staged.py: the reference runs every version
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Equal", "Greater", "Less", "Gemm",
                     "Dropout", "BatchNormalization"), 7),
    **dict.fromkeys(("Abs", "Neg", "Sqrt", "Exp", "Log", "Tanh", "Sigmoid", "Reciprocal", "Floor", "Ceil",
                     "Relu", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "Clip", "Cast", "Tile", "Max",
                     "Min", "Sum", "Mean"), 6),
    "Reshape": 5, "Concat": 4, "Pad": 2, "Split": 2,
    **dict.fromkeys(("Identity", "Constant", "Shape", "Size", "MatMul", "Transpose", "Flatten", "Squeeze",
                     "Unsqueeze", "Gather", "Slice", "Softmax", "LogSoftmax", "ArgMax", "ArgMin",
                     "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                     "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "MaxPool", "AveragePool",
                     "GlobalAveragePool", "GlobalMaxPool", "Conv", "Softplus", "Softsign"), 1),
}

#: The newest version of each operator reviewed against its handler, where it is newer than the
#: version in effect at opset 23 (the default ceiling). Up to opset 28 these changes only add
#: dtypes RLX does not have (float8e8m0, float6; refused by dtype), Cast/CastLike's
#: ``round_mode`` (float8e8m0 targets only), Range's ``stash_type`` (float16/bfloat16: the handler
#: computes in float32 as the default asks and refuses any other) and ReduceLogSum(Exp) dropping
#: integer dtypes. A newer version of an operator not listed here is refused until reviewed.
_OP_REVIEWED: dict[str, int] = {
    **dict.fromkeys(("Constant", "ConstantOfShape", "Flatten", "Identity", "If", "Pad", "Reshape", "Shape",
                     "Size", "Squeeze", "Transpose", "Unsqueeze", "CastLike"), 25),
    "Cast": 28, "Range": 27, "ReduceLogSum": 28, "ReduceLogSumExp": 28,
    # onnx_index.py: -28/-24 add bfloat16 (OneHot, Compress, Einsum, TopK), float Mod with fmod=0 (the
    # handler refuses float Mod), signed BitShift (the handler implements its arithmetic shift).
    **dict.fromkeys(("OneHot", "Compress", "Mod", "BitShift", "Einsum"), 28), "TopK": 24,
    # onnx_staged.py: host ops run with onnx's reference implementation of the model's own version.
    **dict.fromkeys(("NonZero", "Unique", "NonMaxSuppression"), 28),
}

_SINCE_CACHE: dict[tuple[str, int], int | None] = {}


def _since(op: str, opset: int) -> int | None:
    """The version of default-domain ``op`` in effect at ``opset`` (None: no such operator then)."""
    key = (op, opset)
    if key not in _SINCE_CACHE and opset <= _schemas.MAX_OPSET:
        versions = [v for v, _ in _schemas.SCHEMAS.get(op, ()) if v <= opset]
        _SINCE_CACHE[key] = versions[-1] if versions else None
    if key not in _SINCE_CACHE:
        import onnx.defs

        try:
            _SINCE_CACHE[key] = int(onnx.defs.get_schema(op, max_inclusive_version=opset,
                                                         domain="").since_version)
        except Exception:
            _SINCE_CACHE[key] = None
    return _SINCE_CACHE[key]


def op_version_problem(op: str, opset: int) -> str | None:
    """Why default-domain ``op`` at ``opset`` is outside the versions its handler translates exactly
    (None when it is inside, or when ``op`` is unknown to onnx's schemas)."""
    v = _since(op, opset)
    if v is None:
        return None
    lo = _OP_SINCE.get(op, _since(op, 11) or 0)
    hi = max(_OP_REVIEWED.get(op, 0), _since(op, 23) or v)
    if v < lo:
        return (f"{op}-{v} (the version in effect at opset {opset}) is older than the RLX importer "
                f"translates ({op}-{lo} and newer: the older version's attributes mean something else)")
    if v > hi:
        return (f"{op}-{v} (the version in effect at opset {opset}) is newer than the RLX importer's "
                f"translation of {op} was checked against ({op}-{hi})")
    return None


Refusal = Union[tuple[str, str], None]
AttrRule = Callable[[Mapping[str, Any], int, Any], Refusal]


def _spatial_rule(attrs: Mapping[str, Any], opset: int, node: Any) -> Refusal:
    op = node.op_type
    kernel = attrs.get("kernel_shape")
    if kernel is not None and len(kernel) > 2 and op == "Conv":
        return (f"{len(kernel)}-D convolution (kernel_shape {list(kernel)}) is not translated (1-D and 2-D "
                f"only)", "RLX has 1-D and 2-D convolutions (NCL / NCHW)")
    auto = str(attrs.get("auto_pad", "NOTSET"))
    if auto not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        return f"auto_pad={auto!r} is not defined", "use NOTSET, VALID, SAME_UPPER or SAME_LOWER"
    return None


def _attr_is(name: str, default: Any, bad: Callable[[Any], bool], what: str, fix: str) -> AttrRule:
    def rule(attrs: Mapping[str, Any], opset: int, node: Any) -> Refusal:
        v = attrs.get(name, default)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        return (what.format(v=v), fix) if bad(v) else None
    return rule


def _dropout_mask_rule(attrs: Mapping[str, Any], opset: int, node: Any) -> Refusal:
    if opset < 10 and len(node.output) > 1 and node.output[1]:
        return ("the mask output before opset 10 (typed like the input, with no defined inference-mode "
                "value) is not translated", "do not use the mask, or convert the model to opset 10 or newer")
    return None


#: Attribute values the handlers do not translate, checked before a node is translated (and by
#: :func:`coverage` for every node at once): ``rule(attrs, opset, node) -> (what, fix) | None``.
_ATTR_RULES: dict[str, list[AttrRule]] = {
    "BatchNormalization": [
        _attr_is("training_mode", 0, lambda v: int(v) != 0, "training_mode={v} (training) is not translated",
                 "export the model in eval mode (model.eval())"),
        _attr_is("spatial", 1, lambda v: int(v) == 0,
                 "spatial=0 (statistics per element, opset 7-8) is not translated",
                 "export with spatial=1 (per-channel statistics), the only form from opset 9 on")],
    "Gelu": [_attr_is("approximate", "none", lambda v: v not in ("none", "tanh"), "approximate={v!r} is not "
                      "defined", "use 'none' or 'tanh'")],
    "Dropout": [_dropout_mask_rule],
    **{op: [_spatial_rule] for op in ("Conv", "MaxPool", "AveragePool")},
}

#: Operators whose trailing optional outputs the handler does not produce (how many it does).
_MAX_OUTPUTS: dict[str, int] = {"BatchNormalization": 1}


def _schema_attrs(op: str, opset: int) -> frozenset[str]:
    """The attributes default-domain ``op`` defines at ``opset`` (empty when onnx does not know it)."""
    key = (op, opset)
    known = _SCHEMA_ATTRS.get(key)
    if known is None and opset <= _schemas.MAX_OPSET:
        attrs = [a for v, a in _schemas.SCHEMAS.get(op, ()) if v <= opset]
        known = _SCHEMA_ATTRS[key] = frozenset(attrs[-1] if attrs else ())
    if known is None:
        import onnx.defs

        try:
            known = frozenset(onnx.defs.get_schema(op, opset, "").attributes)
        except Exception:
            known = frozenset()  # unknown operator: its translation (or the error) comes later
        _SCHEMA_ATTRS[key] = known
    return known


def _domain_fix() -> str:
    return ("RLX translates the default ONNX domain (ai.onnx) only, plus operators registered with "
            "rlx_core.frontends.onnx.register_handler(op, fn, domain=...) (ai.onnx.ml: Binarizer, "
            "ArrayFeatureExtractor, TreeEnsemble; ai.onnx.preview.training: Adagrad, Adam, Momentum); other "
            "classical-ML models (linear classifiers, scalers...) run in ONNX Runtime, or convert them to "
            "default-domain operators (e.g. hummingbird)")


def coverage(model: str | os.PathLike[str] | bytes | Any) -> Any:
    """Every problem the importer would meet in ``model`` (unsupported operators, versions,
    attributes, dtypes, domains, opset), all at once and without importing it: a
    :class:`~rlx_core.frontends.onnx_coverage.CoverageReport` (``.ok``, ``.to_text()``, ``.to_json()``)."""
    from .onnx_coverage import coverage as run

    return run(model)


_VERSION_FIX = ("convert the model to a version the importer reads: "
                "onnx.version_converter.convert_version(model, 17), or re-export with "
                "torch.onnx.export(..., opset_version=17)")


# ---------------------------------------------------------------------------------------------
# The public entry point


def load_onnx(model: str | os.PathLike[str] | bytes | Any, *, name: str | None = None,
              input_shapes: Mapping[str, Sequence[int | str | None]] | None = None,
              symbols: Mapping[str, int | str] | None = None,
              batch_symbol: str | None = "batch", fuse: bool = True,
              fold_max_elements: int | None = None, fold_max_bytes: int | None = None,
              _live: Iterable[str] = ()) -> Graph:
    """Translate an ONNX model into an RLX :class:`~rlx_core.ir.graph.Graph`.

    ``model`` is a path, the file's bytes or an ``onnx.ModelProto``. Initializers become
    parameters (named as in the file); dynamic dims become symbols.

    * ``symbols``: per ONNX ``dim_param``, a new symbol name (``{"s0": "batch"}``) or a fixed size
      (``{"batch": 1}``), applied to every input that uses it;
    * ``input_shapes``: override an input's shape (ints, symbol names, or None to keep the file's
      dim), e.g. ``{"x": ("batch", 3, 224, 224)}``;
    * ``batch_symbol``: the symbol for a dynamic axis 0 that has no name in the file (others get
      ``<input>_dim<axis>``); None names it like the others;
    * ``fuse``: map ``MatMul`` + bias ``Add`` to the HIR ``linear`` op (the numbers are the same);
    * ``fold_max_elements`` / ``fold_max_bytes``: the import-time constant-folding budget (defaults:
      ``RLX_ONNX_FOLD_MAX_ELEMENTS`` / ``RLX_ONNX_FOLD_MAX_BYTES``, else 16M elements / 64 MiB). A node
      whose folded result would be larger than its largest input by more than that (ConstantOfShape,
      Expand, Tile, Range, broadcasting...) stays a graph node computed at run time, so a tiny file
      cannot make the import (or ``rlx explain``) allocate gigabytes; see :class:`FoldBudget`.

    ``_live`` (staged execution's, private): initializers also listed as graph inputs that are fed
    at run time with exactly the initializer's value (the value the stage is compiled for): shapes
    read the value, arithmetic on them runs in the graph.

    Raises :class:`~rlx_core.errors.SerializationError` for malformed or truncated files and
    :class:`UnsupportedOnnxError` for operators, attributes or shapes it cannot translate.
    """
    mapped: dict[str, tuple[str, int, int]] | None = {} if _settings.ONNX_MMAP.get() else None
    proto, source = read_model(model, mapped=mapped)
    opset = _default_opset(proto, source)
    if proto.functions:
        try:
            import onnx.inliner

            proto = onnx.inliner.inline_local_functions(proto)
        except Exception as e:
            raise UnsupportedOnnxError(f"cannot inline the model's local functions ({e})", where=source,
                                       fix="export without functions (torch.onnx.export(..., "
                                           "export_modules_as_functions=False))") from None
    if name is None:
        if isinstance(model, (str, os.PathLike)):
            name = Path(model).stem
        else:
            name = proto.graph.name or "onnx_model"
    imp = _Importer(proto, opset, source, name=name, input_shapes=input_shapes or {},
                    symbols=symbols or {}, batch_symbol=batch_symbol, fuse=fuse,
                    budget=FoldBudget.for_model(proto, fold_max_elements, fold_max_bytes), live=_live,
                    mapped=mapped or {})
    return imp.run()


def input_types(model: str | os.PathLike[str] | bytes | Any, *,
                input_shapes: Mapping[str, Sequence[int | str | None]] | None = None,
                symbols: Mapping[str, int | str] | None = None,
                batch_symbol: str | None = "batch") -> dict[str, Any]:
    """The RLX :class:`~rlx_core.ir.types.TensorType` of each graph input, named as :func:`load_onnx`
    names them (``dim_param`` symbols, ``batch``...), without translating the nodes."""
    proto, source = read_model(model)
    opset = _default_opset(proto, source)
    imp = _Importer(proto, opset, source, name="inputs", input_shapes=input_shapes or {},
                    symbols=symbols or {}, batch_symbol=batch_symbol, fuse=False)
    return imp.input_types()


# ---------------------------------------------------------------------------------------------
# The importer


_SYMBOL_RE = re.compile(r"\W")
_SCHEMA_ATTRS: dict[tuple[str, int], frozenset[str]] = {}

#: Ops that must never be folded even with constant inputs (their result is not a function of them).
_NO_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                      "Multinomial", "Bernoulli", "If", "Loop", "Scan"})

#: Ops evaluated on constant/symbolic integer tensors directly (shape arithmetic).
_SHAPE_OPS = frozenset({"Identity", "Cast", "Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Reshape",
                        "Flatten", "Concat", "Slice", "Transpose", "Expand", "Mul", "Div", "Add", "Sub",
                        "Equal", "Where", "Abs", "Max", "Min", "Neg"})


#: Ops whose result size depends on the data (shape inference leaves a dim unknown) but never exceeds
#: their inputs' (times the rank, for NonZero's coordinates): they may fold when the inputs fit the budget.
_DATA_BOUNDED = frozenset({"NonZero", "Unique", "Compress", "TopK", "NonMaxSuppression"})
#: Ops whose folding time grows with a reduction the output size does not show.
_CONTRACTIONS = frozenset({"MatMul", "MatMulInteger", "QLinearMatMul", "Gemm", "Conv", "ConvInteger",
                           "QLinearConv", "ConvTranspose", "DeformConv", "Einsum"})
#: Inputs up to this many elements are given to shape inference as data (shapes, repeats, limits).
_PREDICT_DATA_ELEMS = 4096
DEFAULT_FOLD_MAX_ELEMENTS: int = _settings.ONNX_FOLD_MAX_ELEMENTS.default
DEFAULT_FOLD_MAX_BYTES: int = _settings.ONNX_FOLD_MAX_BYTES.default


class FoldBudget(_CoreFoldBudget):
    """How much constant folding one ONNX import may do: the rules of the core's
    :class:`rlx_core.fold.FoldBudget` (amplifying folds at most ``max_elements``, all folds at most
    ``max_bytes`` plus twice the model's own bytes, contractions at most ``16 * max_elements``
    multiply-adds), with ONNX's operators: data-bounded ones (NonZero, Unique ...) may fold without a
    predicted size, and contractions' work is counted from their operands' shapes.

    A node over budget is not folded: its handler makes it a run-time graph node, or, for an operator
    that can only be imported by folding, the import fails saying so.
    """

    @classmethod
    def for_model(cls, proto: Any, max_elements: int | None = None,
                  max_bytes: int | None = None) -> FoldBudget:
        from ..settings import ONNX_FOLD_MAX_BYTES, ONNX_FOLD_MAX_ELEMENTS

        if max_elements is None:
            max_elements = ONNX_FOLD_MAX_ELEMENTS.get()
        if max_bytes is None:
            max_bytes = ONNX_FOLD_MAX_BYTES.get()
        # The stored size (not dims, which a hostile file can make huge without any data).
        own = sum(t.ByteSize() for t, _ in _walk_tensors(proto))
        return cls(int(max_elements), int(max_bytes), own)

    @property
    def fix(self) -> str:
        return ("raise the import's folding budget if the model is trusted: load_onnx(path, "
                "fold_max_elements=..., fold_max_bytes=...) or RLX_ONNX_FOLD_MAX_ELEMENTS / "
                "RLX_ONNX_FOLD_MAX_BYTES (defaults 16777216 elements / 64 MiB), or fold the model offline "
                "(onnx-simplifier) so the file carries the constant")

    def data_bounded(self, op: str) -> bool:
        return op in _DATA_BOUNDED

    def work(self, op: str, shapes: Sequence[tuple[int, ...]], out_elems: int) -> int | None:
        return _fold_work(op, shapes, out_elems) if op in _CONTRACTIONS else None


def _fold_work(op: str, shapes: Sequence[tuple[int, ...]], out_elems: int) -> int:
    """Multiply-adds of a contraction, from its operands' shapes (an upper bound)."""
    def prod(s: Sequence[int]) -> int:
        return math.prod(int(d) for d in s)

    a = shapes[0] if shapes else ()
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        return out_elems * (int(a[-1]) if a else 1)
    if op == "Gemm":
        return out_elems * (max(int(d) for d in a) if a else 1)
    if op == "ConvTranspose":
        return prod(a) * (prod(shapes[1][1:]) if len(shapes) > 1 else 1)
    if op in ("Conv", "ConvInteger", "DeformConv"):
        return out_elems * (prod(shapes[1][1:]) if len(shapes) > 1 else 1)
    if op == "QLinearConv":
        return out_elems * (prod(shapes[3][1:]) if len(shapes) > 3 else 1)
    return out_elems * max((prod(s) for s in shapes), default=1)  # Einsum: any contraction


def _predict_fold(node: Any, feeds: Mapping[str, np.ndarray], ovis: Sequence[Any],
                  opset: int) -> list[tuple[int, int]] | None:
    """``(elements, itemsize)`` of each output of ``node`` run on ``feeds``, from ONNX shape inference
    (small inputs given as data, so shapes, repeats and limits are known); None when unknown."""
    from onnx import helper, numpy_helper, shape_inference

    try:
        small = {nm: a for nm, a in feeds.items() if a.size <= _PREDICT_DATA_ELEMS}
        vis = [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for nm, a in feeds.items() if nm not in small]
        inits = [numpy_helper.from_array(np.asarray(a), nm) for nm, a in small.items()]
        model = helper.make_model(helper.make_graph([node], "size", vis, list(ovis), initializer=inits),
                                  opset_imports=[helper.make_opsetid("", opset)])
        inferred = shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception:
        return None
    out: list[tuple[int, int]] = []
    for vi in inferred.graph.output:
        tt = vi.type.tensor_type
        if not tt.HasField("shape") or any(not d.HasField("dim_value") or d.dim_value < 0
                                           for d in tt.shape.dim):
            return None
        try:
            size = helper.tensor_dtype_to_np_dtype(tt.elem_type).itemsize if tt.elem_type else 8
        except Exception:
            size = 8
        out.append((math.prod(int(d.dim_value) for d in tt.shape.dim), size))
    return out


class _Importer:
    def __init__(self, proto: Any, opset: int, source: str, *, name: str,
                 input_shapes: Mapping[str, Sequence[int | str | None]], symbols: Mapping[str, int | str],
                 batch_symbol: str | None, fuse: bool, budget: FoldBudget | None = None,
                 live: Iterable[str] = (), mapped: Mapping[str, tuple[str, int, int]] | None = None) -> None:
        self.proto = proto
        #: Main-graph initializers read from external data: name -> (file, offset, length).
        self.mapped = dict(mapped or {})
        self._maps: dict[str, np.ndarray] = {}
        #: Initializers that are also graph inputs fed at run time (staged execution's value keys).
        self.live = frozenset(live)
        self.opset = opset
        self.source = source
        self.g = GraphBuilder(name)
        self.env: dict[str, Value] = {}
        self.input_shapes = dict(input_shapes)
        self.symbols = dict(symbols)
        self.batch_symbol = batch_symbol
        self.fuse = fuse
        self.skip: set[tuple[str, ...]] = set()
        self.node: Any = None
        self.node_where = source
        self.consumers: dict[str, list[Any]] = {}
        self.graph_outputs: set[str] = set()
        self.depth = 0
        self.budget = budget or FoldBudget(DEFAULT_FOLD_MAX_ELEMENTS, DEFAULT_FOLD_MAX_BYTES, 0)
        #: Why the last node with constant inputs was not folded (for the error when it must be).
        self.fold_refused: str | None = None
        #: The current node's handler is running (its refusals may depend on run-time values).
        self.in_handler = False

    # -- errors --------------------------------------------------------------------------------
    def unsupported(self, what: str, fix: str) -> UnsupportedOnnxError:
        return UnsupportedOnnxError(what, where=self.node_where, fix=fix)

    def has_symbols(self) -> bool:
        return any(isinstance(d, str) for v in self.g._inputs for d in v.type.shape)

    def symbolic(self, what: str, syms: Iterable[str] = ()) -> SymbolicShapeError:
        """An error that giving the dynamic dims fixed sizes at import resolves."""
        names = sorted(set(syms)) or sorted({d for v in self.g._inputs for d in v.type.shape
                                             if isinstance(d, str)}) or ["batch"]
        py = ", ".join(f"{s!r}: 2" for s in names)
        cli = " ".join(f"--bind {s}=2" for s in names)
        return SymbolicShapeError(what, where=self.node_where,
                                  fix=f"give the dynamic dims fixed sizes when importing: "
                                      f"load_onnx(path, symbols={{{py}}}) (rlx CLI: {cli}, or the sizes "
                                      f"of the --input arrays are used), or re-export with static shapes")

    def _unrepresentable(self, d: Any, what: str) -> SymbolicShapeError:
        syms = sorted(set(d.syms)) if isinstance(d, SymInt) else []
        return self.symbolic(f"{what} would be {d!r}, which is not a polynomial in the shape "
                             f"symbols (an RLX dimension is an int, a symbol or a polynomial such as "
                             f"batch*seq)", syms)

    # -- the driver ----------------------------------------------------------------------------
    def input_types(self) -> dict[str, Any]:
        """The graph inputs' RLX types (without translating any node)."""
        graph = self.proto.graph
        inits = {t.name for t in graph.initializer}
        return {vi.name: self._graph_input(vi).type for vi in graph.input if vi.name not in inits}

    def run(self) -> Graph:
        graph = self.proto.graph
        inits = {t.name for t in graph.initializer}
        for t in graph.initializer:
            arr = self._mapped_array(t)
            self.env[t.name] = _Const(self._tensor_array(t) if arr is None else arr, t.name)
        for vi in graph.input:
            if vi.name in inits:
                if vi.name in self.live:  # value-keyed by staged execution, and fed
                    const = self.env[vi.name]
                    assert isinstance(const, _Const)
                    self.env[vi.name] = _Live(const.array, self._graph_input(vi), vi.name)
                continue  # an initializer listed as an input (old exporters): a constant
            self.env[vi.name] = self._graph_input(vi)
        unknown = sorted(set(self.input_shapes) - {vi.name for vi in graph.input})
        if unknown:
            raise IRError(f"input_shapes names {', '.join(map(repr, unknown))}, which the model does not "
                          f"have", where=self.source,
                          fix=f"the model's inputs: {', '.join(vi.name for vi in graph.input) or 'none'}")
        self.graph_outputs = {o.name for o in graph.output}
        for node in graph.node:
            for i in node.input:
                if i:
                    self.consumers.setdefault(i, []).append(node)
        self._run_nodes(graph.node)
        for o in graph.output:
            v = self.env.get(o.name)
            if v is None:
                raise SerializationError(f"graph output {o.name!r} is never computed: the file is "
                                         f"truncated or malformed", where=self.source,
                                         fix="export or download the model again")
            self.node_where = f"{self.source}, graph output {o.name!r}"
            self.g.prefix = ""
            if isinstance(v, _onnx_seq.SeqValue):  # one RLX output per element (onnx_seq docstring)
                _onnx_seq.emit_output(self, v, o.name)
                continue
            t = self.t(v)
            self.g.output(t, o.name)
        try:
            return self.g.build()
        except RLXError as e:
            raise _with_where(e, self.source) from None

    def _run_nodes(self, nodes: Sequence[Any]) -> None:
        for idx, node in enumerate(nodes):
            if tuple(node.output) in self.skip:
                continue
            self.node = node
            label = node.name or f"{node.op_type}_{idx}"
            self.node_where = (f"ONNX node {label!r} (#{idx}, op {node.op_type}, opset {self.opset}) in "
                               f"{self.source}")
            self.g.prefix = f"{label}/"
            ins: list[Value | None] = []
            for i in node.input:
                if not i:
                    ins.append(None)
                    continue
                v = self.env.get(i)
                if v is None:
                    raise SerializationError(f"value {i!r} is used before it is defined: the graph is "
                                             f"malformed, truncated or not topologically sorted",
                                             where=self.node_where, fix="export or download the model again")
                ins.append(v)
            attrs = self._attrs(node)
            self._check_attrs(node, attrs)
            try:
                outs = self._convert(node, ins, attrs)
            except _NotSymbolic as e:  # pragma: no cover - handlers turn these into errors
                raise self.symbolic(f"cannot evaluate {node.op_type} on symbolic shapes ({e})") from None
            except (RuntimeValueError, DataDependentShapeError):
                raise
            except SymbolicShapeError as e:
                raise _with_where(e, self.node_where) from None
            except UnsupportedOnnxError as e:
                late = [v for v in ins[1:] if isinstance(v, Tensor)]
                # Staged execution may resolve it with those inputs' values as constants.
                if late and self.in_handler:
                    raise self.needs_values(late, e.what, speculative=True, fix=e.fix) from None
                raise _with_where(e, self.node_where) from None
            except RLXError as e:
                hint = any(w in e.what or w in (e.fix or "") for w in ("symbol", "specialize", "static"))
                if isinstance(e, IRError) and not isinstance(e, UnsupportedOnnxError) and hint \
                        and self.has_symbols():
                    # The core cannot express this with symbolic dims; fixed sizes make it static.
                    raise self.symbolic(e.what + (f" ({e.where})" if e.where else "")) from None
                raise _with_where(e, self.node_where) from None
            except Exception as e:
                raise IRError(f"translating ONNX {node.op_type} raised {type(e).__name__}: {e}",
                              where=self.node_where,
                              fix="this is a bug in the RLX ONNX importer, or the node is malformed; "
                                  "check the node with onnx.checker.check_model and report it") from e
            wanted = [o for o in node.output]
            for k, oname in enumerate(wanted):
                if not oname:
                    continue
                if k >= len(outs) or outs[k] is None:
                    raise self.unsupported(f"output {k} ({oname!r}) of {node.op_type} is not supported",
                                           fix="only the main output(s) of this operator can be used; "
                                               "re-export without using the optional output")
                self.env[oname] = outs[k]

    def _convert(self, node: Any, ins: list[Value | None], attrs: dict[str, Any]) -> list[Value | None]:
        op = node.op_type
        self.fold_refused = None
        self.in_handler = False
        if node.domain not in ("", "ai.onnx"):
            fn = _CUSTOM.get((node.domain, op))
            if fn is not None:
                return list(fn(self, node, ins, attrs))
            raise self.unsupported(
                f"ONNX operator {op!r} from domain {node.domain!r} is not supported",
                fix="export with standard ONNX operators only (no contrib/custom ops, e.g. without "
                    "onnxruntime's transformer optimizer), or add a converter with "
                    f"rlx_core.frontends.onnx.register_handler({op!r}, fn, domain={node.domain!r})")
        if op in ("Identity", "Dropout"):
            return list(_HANDLERS[op](self, node, ins, attrs))  # pass values through, constants included
        present = [v for v in ins if v is not None]
        if present and op not in _NO_FOLD and not any(isinstance(v, Tensor) for v in present) \
                and not _onnx_seq.involves_sequences(op, present):  # lists never fold to one array
            small_ints = all(isinstance(v, _Sym) or (v.array.dtype.kind in "iub" and v.array.size <= 4096)
                             for v in present)
            if op in _SHAPE_OPS and (small_ints or op in ("Shape", "Size")):
                try:
                    return self._shape_eval(node, ins, attrs)
                except _NotSymbolic:
                    pass
            if all(isinstance(v, _Const) for v in present) and op not in _CUSTOM_DEFAULT:
                if op in _HANDLERS and any(isinstance(v, _Live) for v in present):
                    try:  # computed on the backend from the fed value-keyed inputs
                        return self._translate(node, ins, attrs)
                    except UnsupportedOnnxError:
                        pass  # the handler cannot (it needs another input constant): fold it
                folded = self._fold(node, ins)
                if folded is not None:
                    return folded
        return self._translate(node, ins, attrs)

    def _translate(self, node: Any, ins: list[Value | None], attrs: dict[str, Any]) -> list[Value | None]:
        """``node`` translated by its handler (not folded)."""
        op = node.op_type
        fn = _CUSTOM.get(("", op))
        if fn is None:
            fn = _HANDLERS.get(op)
            problem = None if fn is None else op_version_problem(op, self.opset)
            if problem is not None:
                raise self.unsupported(problem, fix=_VERSION_FIX)
            for rule in _ATTR_RULES.get(op, ()) if fn is not None else ():
                refusal = rule(attrs, self.opset, node)
                if refusal is not None:
                    raise self.unsupported(f"{op}: {refusal[0]}", fix=refusal[1])
        if fn is None and self.fold_refused is not None:
            raise self.unsupported(
                f"ONNX operator {op!r} can only be imported by folding it to a constant, and "
                f"{self.fold_refused}", fix=self.budget.fix)
        if fn is None:
            raise self.unsupported(
                f"ONNX operator {op!r} is not supported by the RLX ONNX importer",
                fix="rewrite that part of the model with supported operators before export "
                    "(see rlx_core.frontends.onnx.SUPPORTED_OPS), fold it away (e.g. with "
                    "onnxruntime offline optimization or onnx-simplifier), or add a converter with "
                    f"rlx_core.frontends.onnx.register_handler({op!r}, fn)")
        self.in_handler = True  # a refusal from here on may depend on run-time input values
        try:
            return list(fn(self, node, ins, attrs))
        except DTypeError as e:
            # u16/u32/u64 reach only some IR op families (rlx_core.dtypes.INT_DTYPES says why): an
            # operator that needs another one is refused here; other dtype errors stay importer bugs.
            wide = sorted({str(v.dtype) for v in ins if getattr(v, "dtype", None) in WIDE_UINT_DTYPES})
            # float8/float4/int4/int2 reach only cast and the movement ops (rlx_core.dtypes.LOWP_DTYPES).
            lowp = sorted({str(v.dtype) for v in ins if getattr(v, "dtype", None) in LOWP_DTYPES})
            if lowp:
                raise self.unsupported(f"{op} on {'/'.join(lowp)}: {e.what}",
                                       fix=f"RLX moves and casts low-precision tensors only: Cast (or "
                                           f"DequantizeLinear) the input to float32 before this {op}"
                                       ) from None
            if not wide:
                raise
            raise self.unsupported(f"{op} on {'/'.join(wide)}: {e.what}",
                                   fix="cast the input to i64 (exact for u16/u32) or a float type before "
                                       f"this {op}, or run the model with ONNX Runtime") from None

    # -- attributes and inputs -----------------------------------------------------------------
    def _attrs(self, node: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for a in node.attribute:
            if a.ref_attr_name:
                raise self.unsupported(f"attribute {a.name!r} refers to a function attribute",
                                       fix="inline the model's functions first (onnx.inliner)")
            v = _onnx_proto.attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            out[a.name] = v
        return out

    def _check_attrs(self, node: Any, attrs: Mapping[str, Any]) -> None:
        """Attributes must exist in the operator's schema for this opset (e.g. no ``axes`` attribute
        on ReduceMean-18, where axes became an input)."""
        if node.domain not in ("", "ai.onnx") or not attrs:
            return
        known = _schema_attrs(node.op_type, self.opset)
        unknown = sorted(a for a in attrs if known and a not in known)
        if unknown:
            raise self.unsupported(
                f"attribute(s) {', '.join(map(repr, unknown))} are not defined for {node.op_type} in opset "
                f"{self.opset} (it has {', '.join(sorted(known))})",
                fix="the model is malformed or was written for another opset (e.g. axes moved from an "
                    "attribute to an input); check it with onnx.checker.check_model")

    def _mapped_array(self, t: Any) -> np.ndarray | None:
        """A large initializer from external data as a read-only view of a memory map of its file
        (the bytes just read into the proto, which is dropped after the import), or None to copy
        it. Why: a copy is one more resident copy of the weights for as long as the graph lives;
        mapped pages cost RSS only while read, and a backend that packs the weights into its own
        layout gives them back (:func:`rlx_core.pages.release_file_pages`)."""
        spot = self.mapped.get(t.name)
        npdt = _mappable_dtype(t.data_type)
        if spot is None or npdt is None or sys.byteorder != "little":
            return None
        full, offset, n = spot
        shape = tuple(int(d) for d in t.dims)
        if n < _MAP_MIN_BYTES or n != math.prod(shape) * npdt.itemsize or offset % npdt.itemsize:
            return None
        mm = self._maps.get(full)
        if mm is None:
            try:
                mm = self._maps[full] = np.memmap(full, dtype=np.uint8, mode="r")
            except (OSError, ValueError):
                return None
        raw = mm[offset:offset + n]
        if raw.size != n:  # the file shrank since it was read: keep the bytes read
            return None
        return raw.view(npdt).reshape(shape)

    def _tensor_array(self, t: Any) -> np.ndarray:
        if t.data_location == _onnx_proto.pb().TensorProto.EXTERNAL:
            # read_model resolves external data from the model's folder; numpy_helper would read it
            # relative to the current directory instead, so never let it see such a tensor.
            raise SerializationError(f"tensor {t.name!r} still refers to external data",
                                     where=self.node_where,
                                     fix="load the model with load_onnx(path) so its external data is "
                                         "read (checked) from the model's folder")
        if t.data_type not in _ONNX_TO_DTYPE:
            raise UnsupportedOnnxError(f"tensor {t.name!r} has ONNX type {_onnx_type_name(t.data_type)}, "
                                       f"which RLX does not have", where=self.node_where,
                                       fix=f"RLX dtypes: {', '.join(d.value for d in DType)}; cast in the "
                                           f"model before exporting")
        try:
            arr = _onnx_proto.tensor_array(t)
        except Exception as e:
            raise SerializationError(f"tensor {t.name!r} cannot be decoded ({type(e).__name__}: {e}); the "
                                     f"file is truncated or malformed", where=self.node_where,
                                     fix="export or download the model again") from None
        dt = _ONNX_TO_DTYPE[t.data_type]
        if arr.dtype != dt.np:
            arr = arr.astype(dt.np)
        return arr

    def _graph_input(self, vi: Any) -> Tensor:
        where = f"{self.source}, graph input {vi.name!r}"
        if _onnx_seq.is_sequence_input(vi):  # imported per fed length by staged execution
            raise _onnx_seq.sequence_input_error(vi, where)
        vi = _onnx_optional.present_input(vi)  # an optional tensor is imported present: the tensor
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedOnnxError(f"graph input {vi.name!r} is not a tensor", where=where,
                                       fix="RLX graphs take tensors only (no sequences, maps or optionals)")
        tt = vi.type.tensor_type
        dt = _ONNX_TO_DTYPE.get(tt.elem_type)
        if dt is None:
            raise UnsupportedOnnxError(f"graph input {vi.name!r} has ONNX type "
                                       f"{_onnx_type_name(tt.elem_type)}, which RLX does not have",
                                       where=where, fix=f"RLX dtypes: {', '.join(d.value for d in DType)}")
        override = self.input_shapes.get(vi.name)
        if not tt.HasField("shape") and override is None:
            raise UnsupportedOnnxError(f"graph input {vi.name!r} has no shape in the file", where=where,
                                       fix=f"pass it: load_onnx(path, input_shapes={{{vi.name!r}: (...)}})")
        file_dims: list[Any] = []
        for axis, d in enumerate(tt.shape.dim if tt.HasField("shape") else ()):
            if d.HasField("dim_value"):
                file_dims.append(int(d.dim_value))
            elif d.dim_param:
                file_dims.append(self._symbol(d.dim_param))
            elif axis == 0 and self.batch_symbol:
                file_dims.append(self.batch_symbol)
            else:
                file_dims.append(self._sanitize(f"{vi.name}_dim{axis}"))
        dims = file_dims
        if override is not None:
            override = list(override)
            if file_dims and len(override) != len(file_dims):
                raise IRError(f"input_shapes gives {vi.name!r} rank {len(override)}, the model declares "
                              f"rank {len(file_dims)}", where=where, fix="give one entry per axis")
            dims = [file_dims[i] if d is None else (self.symbols.get(d, d) if isinstance(d, str) else int(d))
                    for i, d in enumerate(override)]
        return self.g.input(vi.name, dt, tuple(dims))

    def _sanitize(self, s: str) -> str:
        s = _SYMBOL_RE.sub("_", s) or "dim"
        return f"d_{s}" if s[0].isdigit() else s

    def _symbol(self, param: str) -> Dim:
        mapped = self.symbols.get(param, param)
        if isinstance(mapped, str):
            return self._sanitize(mapped)
        return int(mapped)

    # -- values --------------------------------------------------------------------------------
    def t(self, v: Value | None, dtype: DType | None = None) -> Tensor:
        """The value as a run-time tensor (constants become parameters; symbols are computed)."""
        if v is None:
            raise self.unsupported("a required input is missing", fix="check the node's inputs")
        if isinstance(v, Tensor):
            return v
        if isinstance(v, _Live):
            return v.live if dtype is None or v.live.dtype == dtype else self.g.op("cast", v.live, to=dtype)
        if isinstance(v, _Sym):
            if v.tensor is None:
                v.tensor = self._materialize_sym(v)
            t = v.tensor
            return t if dtype is None or t.dtype == dtype else self.g.op("cast", t, to=dtype)
        arr = v.array
        if dtype is not None and DType.parse(arr.dtype) != dtype:
            arr = arr.astype(dtype.np)
        key = str(arr.dtype)
        hit = v.tensors.get(key)
        if hit is not None:
            return hit
        t = self.param(arr, v.name if arr is v.array else None)
        v.tensors[key] = t
        return t

    def param(self, arr: np.ndarray, name: str | None = None) -> Tensor:
        try:
            dt = DType.parse(arr.dtype)
        except RLXError:
            raise self.unsupported(f"a constant has dtype {arr.dtype}, which RLX does not have",
                                   fix=f"RLX dtypes: {', '.join(d.value for d in DType)}") from None
        if name is None or arr.size <= 16:
            return self.g.const(arr, dt)
        prefix, self.g.prefix = self.g.prefix, ""
        try:
            if name in self.g._types:
                name = self.g.fresh(name)
            return self.g.param(name, np.ascontiguousarray(arr), dt)
        finally:
            self.g.prefix = prefix

    def _materialize_sym(self, v: _Sym) -> Tensor:
        """Compute a symbolic shape at run time: ``s`` is ``reduce_sum(expand(1, (s,)))``."""
        g = self.g
        one = g.const(1, DType.I64)
        elems = []
        sizes: dict[str, Tensor] = {}

        def size(s: str) -> Tensor:
            if s not in sizes:
                sizes[s] = g.op("reduce_sum", g.op("expand", g.op("reshape", one, shape=(1,)), shape=(s,)),
                                axes=(0,), keepdims=False)
            return sizes[s]

        for x in v.arr.flat:
            if isinstance(x, SymInt):
                total: Tensor | None = None
                for mono, coef in sorted(symexpr.parse(x.expr).items()):
                    term = g.const(coef, DType.I64)
                    for s in mono:
                        term = term * size(s)
                    total = term if total is None else total + term
                assert total is not None  # a SymInt always has a symbolic term
                elems.append(total)
            else:
                elems.append(g.const(int(x), DType.I64))
        if v.arr.ndim == 0:
            out = elems[0]
        else:
            out = g.op("concat", *[g.op("reshape", e, shape=(1,)) for e in elems], axis=0)
            out = g.op("reshape", out, shape=v.arr.shape)
        return out if v.dtype is DType.I64 else g.op("cast", out, to=v.dtype)

    def sdims(self, x: Tensor) -> list[SymLike]:
        return [_sym_of(d) for d in x.shape]

    def dims(self, v: Value | None, what: str) -> list[SymLike]:
        """A 1-D shape-like input known at import time (ints or symbolic dims)."""
        if v is None:
            raise self.unsupported(f"{what} is missing", fix="pass it as a constant")
        if isinstance(v, Tensor):
            raise self.needs_values([v], f"{what} is computed at run time from tensor data, so the "
                                         f"result's shape is data-dependent")
        arr = v.arr if isinstance(v, _Sym) else v.array
        return [x if isinstance(x, SymInt) else int(x) for x in np.asarray(arr).reshape(-1)]

    def ints(self, v: Value | None, what: str) -> list[int] | None:
        """A constant int list (None when the optional input is absent)."""
        if v is None:
            return None
        ds = self.dims(v, what)
        if any(isinstance(d, SymInt) for d in ds):
            raise self.symbolic(f"{what} depends on a symbolic dim ({ds})")
        return [int(d) for d in ds]

    def scalar(self, v: Value | None, what: str) -> Any:
        if v is None:
            return None
        if isinstance(v, Tensor):
            raise self.needs_values([v], f"{what} is computed at run time")
        if not isinstance(v, _Const):
            raise self.symbolic(f"{what} depends on a symbolic dim")
        return v.array.reshape(-1)[0].item() if v.array.size else None

    def needs_values(self, vals: Sequence[Value | None], what: str, *, speculative: bool = False,
                     fix: str | None = None) -> RuntimeValueError:
        """The error for a handler that needs the values of run-time tensors ``vals`` (named by their
        ONNX names: the node's inputs holding them, else every run-time input of the node)."""
        node = self.node
        names = [n for n in (node.input if node is not None else ()) if n and
                 any(self.env.get(n) is v for v in vals if v is not None)]
        if not names and node is not None:  # derived inside the handler: from the non-data inputs first
            late = [n for n in node.input[1:] if n and isinstance(self.env.get(n), Tensor)]
            names = late or [n for n in node.input if n and isinstance(self.env.get(n), Tensor)]
        label = (node.name or node.op_type) if node is not None else ""
        listed = ", ".join(map(repr, dict.fromkeys(names)))
        return RuntimeValueError(f"{what} (ONNX tensor(s) {listed or '?'})", where=self.node_where,
                                 fix=fix or _STAGED_FIX, tensors=list(dict.fromkeys(names)), node=label,
                                 speculative=speculative)

    def to_dim(self, d: SymLike, what: str) -> Dim:
        if isinstance(d, SymInt):
            if not any(c > 0 for c in symexpr.parse(d.expr).values()):
                raise self._unrepresentable(d, what)
            # seq-1 is kept: a binding that makes it negative fails at specialisation, never silently
            return d.expr
        if d < 0:
            raise self.unsupported(f"{what} has the negative size {d}", fix="check the model's shapes")
        return int(d)

    def shape_of(self, dims: Sequence[SymLike], what: str) -> tuple[Dim, ...]:
        return tuple(self.to_dim(d, what) for d in dims)

    def dim_tensor(self, d: Dim | SymLike) -> Tensor:
        """A size as an i64 scalar tensor: a constant, or computed at run time for a symbolic dim
        (index arithmetic over symbolic axes: strides, bounds, sentinels)."""
        x = d if isinstance(d, SymInt) else _sym_of(d)  # type: ignore[arg-type]
        if isinstance(x, SymInt):
            return self.t(_Sym(np.array(x, dtype=object).reshape(()), DType.I64))
        return self.g.const(int(x), DType.I64)

    def axes_arg(self, ins: Sequence[Value | None], attrs: Mapping[str, Any], index: int,
                 since: int) -> list[int] | None:
        """Axes given as an attribute before opset ``since`` and as input ``index`` from it on."""
        if self.opset >= since:
            v = ins[index] if len(ins) > index else None
            return self.ints(v, "axes")
        a = attrs.get("axes")
        return None if a is None else [int(x) for x in a]

    def pair(self, a: Value | None, b: Value | None) -> tuple[Tensor, Tensor]:
        """Two operands as tensors; a constant takes the other operand's dtype."""
        if isinstance(a, Tensor) and not isinstance(b, Tensor):
            return a, self.t(b, a.dtype)
        if isinstance(b, Tensor) and not isinstance(a, Tensor):
            return self.t(a, b.dtype), b
        return self.t(a), self.t(b)

    def reshape(self, x: Tensor, dims: Sequence[SymLike], what: str = "the reshaped shape") -> Tensor:
        shape = self.shape_of(dims, what)
        if shape == x.shape:
            return x
        n_in, n_out = symexpr.numel(x.shape), symexpr.numel(d for d in shape if d != -1)
        if -1 not in shape and n_in != n_out and (isinstance(n_in, str) or isinstance(n_out, str)):
            # e.g. the legacy exporter baked seq=8 into (8, 4*batch, 8): right for one size only
            syms = sorted(symexpr.symbols(n_in) | symexpr.symbols(n_out))
            raise self.symbolic(f"{what} {shape} has {n_out} elements but the input {x.shape} has {n_in}: "
                                f"they agree only for particular sizes of {', '.join(syms)} (a size the "
                                f"exporter fixed as a constant)", syms)
        return self.g.op("reshape", x, shape=shape)

    # -- folding -------------------------------------------------------------------------------
    def _fold(self, node: Any, ins: list[Value | None]) -> list[Value] | None:
        """Evaluate a node with constant inputs with onnx's NumPy reference evaluator."""
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        names = [f"in{i}" if n else "" for i, n in enumerate(node.input)]
        feeds = {nm: v.array for nm, v in zip(names, ins) if nm and isinstance(v, _Const)}
        outs = [f"out{i}" if n else "" for i, n in enumerate(node.output)]
        copy = helper.make_node(node.op_type, names, outs, domain=node.domain)
        copy.attribute.extend(node.attribute)
        for a in copy.attribute:
            if a.name == "keepdims" and a.i not in (0, 1):
                a.i = 0  # as ONNX Runtime (and the handlers) read it; the reference evaluator says bool()
        try:
            vis = [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                   for nm, a in feeds.items()]
            ovis = [helper.make_tensor_value_info(o, 0, None) for o in outs if o]
            model = helper.make_model(helper.make_graph([copy], "fold", vis, ovis),
                                      opset_imports=[helper.make_opsetid("", self.opset)])
        except Exception:
            return None
        # Size the result before computing it: ConstantOfShape/Expand/Tile/Range and broadcasting can
        # turn a few bytes of file into gigabytes (issue 14), which then stay a run-time node instead.
        refusal = self.budget.check(node.op_type, [feeds[nm] for nm in names if nm in feeds],
                                    _predict_fold(copy, feeds, ovis, self.opset))
        if refusal is not None:
            self.fold_refused = refusal
            return None
        try:
            res = ReferenceEvaluator(model).run(None, feeds)
        except Exception:
            return None  # not foldable here: the handler translates it (or says it is unsupported)
        it = iter(res)
        out: list[Value] = []
        for o in outs:
            if not o:
                out.append(None)  # type: ignore[arg-type]
                continue
            arr = np.asarray(next(it))
            try:
                DType.parse(arr.dtype)
            except RLXError:
                return None
            out.append(_Const(arr))
        self.budget.charge(sum(v.array.nbytes for v in out if v is not None))
        return out

    def _shape_eval(self, node: Any, ins: list[Value | None], attrs: Mapping[str, Any]) -> list[Value]:
        """Evaluate shape arithmetic on constants and symbolic shapes (raises _NotSymbolic)."""
        op = node.op_type

        def arr(v: Value | None) -> np.ndarray | None:
            if v is None:
                return None
            if isinstance(v, _Sym):
                return v.arr
            a = v.array
            return _to_obj(a) if a.dtype.kind in "iu" else a

        def dtype_of(v: Value | None) -> DType:
            if isinstance(v, _Sym):
                return v.dtype
            return DType.parse(v.array.dtype)  # type: ignore[union-attr]

        def numeric(v: Value | None, what: str) -> list[int] | None:
            if v is None:
                return None
            if isinstance(v, _Sym):
                raise _NotSymbolic(what)
            return [int(x) for x in v.array.reshape(-1)]

        def capped(shape: Sequence[int]) -> None:
            # Shape arithmetic runs on Python objects: a broadcast or Expand of two 4096-entry
            # vectors would be 16M objects. Larger results fall back to the budgeted fold.
            if math.prod(shape) > _PREDICT_DATA_ELEMS:
                raise _NotSymbolic("too large for shape arithmetic")

        x = ins[0]
        if op in ("Shape", "Size"):
            raw = x.arr if isinstance(x, _Sym) else x.array  # type: ignore[union-attr]
            if op == "Size":
                return [_Const(np.asarray(raw.size, np.int64))]
            start, end = attrs.get("start", 0), attrs.get("end")
            return [_Const(np.asarray(list(raw.shape)[slice(start, end)], np.int64))]
        a = arr(x)
        if a is None:
            raise _NotSymbolic("missing input")
        dt = dtype_of(x)
        if op in ("Identity",):
            return [_finish(a, dt)]
        if op == "Cast":
            to = _ONNX_TO_DTYPE.get(int(attrs["to"]))
            if to is None or to.is_lowp:  # low-precision casts (saturate ...): cast_onnx in the graph
                raise _NotSymbolic("cast type")
            if _has_sym(a) and not to.is_int:
                raise _NotSymbolic("cast of a symbol to a non-integer")
            if not _has_sym(a):
                return [_Const(np.asarray(x.array).astype(to.np))]  # type: ignore[union-attr]
            return [_Sym(a, to)]
        if op == "Gather":
            idx = numeric(ins[1], "indices")
            assert idx is not None
            ind = np.asarray(idx, np.int64).reshape(ins[1].array.shape)  # type: ignore[union-attr]
            gax = int(attrs.get("axis", 0)) % max(a.ndim, 1)
            capped(a.shape[:gax] + ind.shape + a.shape[gax + 1:])
            return [_finish(np.take(a, ind, axis=int(attrs.get("axis", 0))), dt)]
        if op == "Unsqueeze":
            axes = self.axes_arg(ins, attrs, 1, 13)
            if axes is None:
                raise _NotSymbolic("axes")
            r = a.ndim + len(axes)
            shape = list(a.shape)
            for ax in sorted(ax % r for ax in axes):
                shape.insert(ax, 1)
            return [_finish(a.reshape(shape), dt)]
        if op == "Squeeze":
            axes = self.axes_arg(ins, attrs, 1, 13)
            if axes is None:
                shape = [d for d in a.shape if d != 1]
            else:
                norm = {ax % max(a.ndim, 1) for ax in axes}
                shape = [d for i, d in enumerate(a.shape) if i not in norm]
            return [_finish(a.reshape(shape), dt)]
        if op == "Reshape":
            target = numeric(ins[1], "shape")
            assert target is not None
            allowzero = int(attrs.get("allowzero", 0))
            tgt = [a.shape[i] if (t == 0 and not allowzero) else t for i, t in enumerate(target)]
            return [_finish(a.reshape(tgt), dt)]
        if op == "Flatten":
            ax = int(attrs.get("axis", 1)) % (a.ndim + 1) if a.ndim else 0
            outer = math.prod(a.shape[:ax])
            return [_finish(a.reshape(outer, -1) if a.size else a.reshape(outer, 0), dt)]
        if op == "Concat":
            parts = [arr(v) for v in ins if v is not None]
            capped([sum(p.size for p in parts)])  # type: ignore[union-attr]
            dts = {dtype_of(v) for v in ins if v is not None}
            cat = np.concatenate(parts, axis=int(attrs["axis"]))
            return [_finish(cat, dts.pop() if len(dts) == 1 else dt)]
        if op == "Slice":
            if self.opset < 10:  # Slice-1: attributes
                starts, ends = list(attrs["starts"]), list(attrs["ends"])
                axes = list(attrs.get("axes") or range(len(starts)))
            else:
                starts, ends = numeric(ins[1], "starts"), numeric(ins[2], "ends")
                axes = numeric(ins[3] if len(ins) > 3 else None, "axes") or list(range(len(starts or [])))
            steps = numeric(ins[4] if len(ins) > 4 else None, "steps") or [1] * len(axes)
            idx: list[Any] = [slice(None)] * a.ndim
            for s, e, ax, st in zip(starts or [], ends or [], axes, steps):
                idx[ax % a.ndim] = slice(s, e, st)
            return [_finish(a[tuple(idx)], dt)]
        if op == "Transpose":
            perm = attrs.get("perm")
            return [_finish(np.transpose(a, perm), dt)]
        if op == "Expand":
            shape = numeric(ins[1], "shape")
            assert shape is not None
            out_shape = np.broadcast_shapes(a.shape, tuple(shape))
            capped(out_shape)
            return [_finish(np.broadcast_to(a, out_shape).copy(), dt)]
        if op in ("Mul", "Div", "Add", "Sub", "Max", "Min", "Equal"):
            if dt.is_float or any(v is not None and dtype_of(v).is_float for v in ins):
                raise _NotSymbolic("float arithmetic")
            arrays = [arr(v) for v in ins if v is not None]
            capped(np.broadcast_shapes(*(q.shape for q in arrays)))  # type: ignore[union-attr]
            if op == "Equal":
                return [_Const(_elementwise(s_eq, *arrays).astype(bool))]
            if op in ("Max", "Min"):
                pick = max if op == "Max" else min

                def mm(*xs: Any) -> Any:
                    if any(isinstance(v, SymInt) for v in xs):
                        raise _NotSymbolic("max/min of symbols")
                    return pick(int(v) for v in xs)
                return [_finish(_elementwise(mm, *arrays), dt)]
            fn = {"Mul": s_mul, "Div": s_div, "Add": s_add, "Sub": s_sub}[op]
            return [_finish(_elementwise(fn, *arrays), dt)]
        if op == "Neg":
            if _has_sym(a):
                raise _NotSymbolic("negative symbol")
            return [_Const(-x.array)]  # type: ignore[union-attr]
        if op == "Abs":
            return [_finish(_elementwise(lambda v: v if isinstance(v, SymInt) else abs(int(v)), a), dt)]
        if op == "Where":
            c = ins[0]
            if not isinstance(c, _Const):
                raise _NotSymbolic("symbolic condition")
            xa, xb = arr(ins[1]), arr(ins[2])
            capped(np.broadcast_shapes(c.array.shape, xa.shape, xb.shape))  # type: ignore[union-attr]
            return [_finish(np.where(c.array.astype(bool), xa, xb), dtype_of(ins[1]))]
        raise _NotSymbolic(op)


def _with_where(e: RLXError, where: str) -> RLXError:
    """The same error with the ONNX node prepended to its location."""
    full = where if not e.where or where in e.where else f"{where}; {e.where}"
    try:
        return type(e)(e.what, where=full, fix=e.fix)
    except TypeError:
        return IRError(e.what, where=full, fix=e.fix)


# ---------------------------------------------------------------------------------------------
# Handlers: (importer, node, inputs, attributes) -> outputs

Handler = Callable[[_Importer, Any, list, dict], Sequence[Any]]
_HANDLERS: dict[str, Handler] = {}
_CUSTOM: dict[tuple[str, str], Handler] = {}
_CUSTOM_DEFAULT: set[str] = set()


def register_handler(op_type: str, fn: Handler, *, domain: str = "") -> None:
    """Add or replace the translation of one ONNX operator.

    ``fn(importer, node, inputs, attrs)`` returns one value per node output; ``importer.t(v)`` turns
    an input into an RLX tensor and ``importer.g`` is the :class:`GraphBuilder`.
    """
    _CUSTOM[(domain, op_type)] = fn
    if domain == "":
        _CUSTOM_DEFAULT.add(op_type)


def _handler(*names: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for n in names:
            _HANDLERS[n] = fn
        return fn
    return deco


def _register_simple() -> None:
    unary = {"Neg": "neg", "Abs": "abs", "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Erf": "erf",
             "Tanh": "tanh", "Sigmoid": "sigmoid", "Reciprocal": "reciprocal", "Floor": "floor",
             "Ceil": "ceil", "Round": "round", "Sin": "sin", "Cos": "cos", "Sign": "sign",
             "Not": "logical_not"}
    for onnx_op, rlx_op in unary.items():
        _HANDLERS[onnx_op] = (lambda r: lambda imp, node, ins, attrs: [imp.g.op(r, imp.t(ins[0]))])(rlx_op)
    binary = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Equal": "equal", "Less": "less",
              "LessOrEqual": "less_equal", "Greater": "greater", "GreaterOrEqual": "greater_equal",
              "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}
    for onnx_op, rlx_op in binary.items():
        _HANDLERS[onnx_op] = (lambda r: lambda imp, node, ins, attrs: [imp.g.op(r, *imp.pair(ins[0], ins[1]))]
                              )(rlx_op)


_register_simple()


def _c(imp: _Importer, value: float, like: Tensor) -> Tensor:
    return imp.g.const(value, like.dtype)


@_handler("Constant")
def _constant(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    if "value" in attrs:
        return [_Const(imp._tensor_array(attrs["value"]))]
    for key, dt in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                    ("value_ints", np.int64)):
        if key in attrs:
            return [_Const(np.asarray(attrs[key], dt))]
    raise imp.unsupported(f"Constant with attribute(s) {sorted(attrs)} is not supported",
                          fix="use a dense tensor value (not sparse or string)")


@_handler("Identity")
def _identity(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    return [ins[0]]


@_handler("Dropout")
def _dropout(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    training = ins[2] if len(ins) > 2 else None
    ratio = ins[1] if len(ins) > 1 else None
    zero = isinstance(ratio, _Const) and ratio.array.size == 1 and float(ratio.array.reshape(-1)[0]) == 0.0
    if training is not None and (not isinstance(training, _Const) or bool(training.array.reshape(-1)[0])) \
            and not zero:  # ratio 0 drops nothing, in training mode too
        raise imp.unsupported("Dropout in training mode is not supported",
                              fix="export the model in eval mode (model.eval())")
    if not isinstance(ins[0], Tensor) and not (len(node.output) > 1 and node.output[1]):
        return [ins[0]]
    x = imp.t(ins[0])
    outs: list[Any] = [x]
    if len(node.output) > 1 and node.output[1]:
        outs.append(imp.g.op("expand", imp.g.const(True, DType.BOOL), shape=x.shape))
    return outs


def cast_onnx(imp: _Importer, x: Tensor, to: DType, saturate: bool = True) -> Tensor:
    """ONNX's Cast of ``x`` to ``to``. The IR's ``cast`` is ONNX's ``saturate=0`` (Inf/NaN on
    overflow, as the float8 type has them); ``saturate=1`` (the default) clamps to the largest finite
    value first, which is that clip written with maximum/minimum (NaN stays NaN, +-Inf clamps)."""
    if x.dtype == to:
        return x
    if saturate and to in _SATURATING and not x.dtype.is_bool:
        import ml_dtypes

        top = float(ml_dtypes.finfo(to.np).max)
        g = imp.g
        if x.dtype.is_complex:
            raise imp.unsupported(f"Cast from {x.dtype} to {to} with saturate=1 is not translated",
                                  fix="cast to float32 first (the real part), then to the float8 type")
        if x.dtype.is_lowp:  # float8/float4/int4 have no min/max: clamp exactly in float32
            x = g.op("cast", x, to=DType.F32)
        src = x.dtype
        if src.is_float:
            x = g.op("minimum", g.op("maximum", x, g.const(-top, src)), g.const(top, src))
        else:
            info = np.iinfo(src.np)
            if info.max > top:
                x = g.op("minimum", x, g.const(int(top), src))
            if info.min < -top:
                x = g.op("maximum", x, g.const(-int(top), src))
    return imp.g.op("cast", x, to=to)


def _saturate_attr(imp: _Importer, attrs: dict) -> bool:
    s = int(attrs.get("saturate", 1))
    if s not in (0, 1):
        raise imp.unsupported(f"saturate={s}", fix="saturate is 0 or 1 (the model is malformed)")
    return bool(s)


@_handler("Cast")
def _cast(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    to = _ONNX_TO_DTYPE.get(int(attrs["to"]))
    if to is None:
        raise imp.unsupported(f"Cast to ONNX type {_onnx_type_name(int(attrs['to']))} is not supported",
                              fix=f"RLX dtypes: {', '.join(d.value for d in DType)}")
    x = imp.t(ins[0])
    return [cast_onnx(imp, x, to, _saturate_attr(imp, attrs))]


@_handler("CastLike")
def _cast_like(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    target = ins[1]
    to = target.dtype if isinstance(target, (Tensor, _Sym)) else DType.parse(target.array.dtype)
    x = imp.t(ins[0])
    return [cast_onnx(imp, x, to, _saturate_attr(imp, attrs))]


@_handler("Pow")
def _pow(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    e = ins[1]
    e_dt = e.dtype if isinstance(e, (Tensor, _Sym)) else DType.parse(e.array.dtype)
    if not x.dtype.is_float:
        # ORT computes integer powers in the integer type (wrapping); a float pow is not exact for
        # every int64 result, so these are refused rather than approximated.
        raise imp.unsupported(f"Pow of a {x.dtype.value} base (exponent {e_dt.value}) is not translated",
                              fix="cast the base to float32/float64 in the model before Pow")
    if not e_dt.is_float:  # an integer exponent: the same power in the base's float type
        if isinstance(e, _Const):
            e = _Const(e.array.astype(x.dtype.np))
        else:
            e = imp.g.op("cast", imp.t(e), to=x.dtype)
    if isinstance(e, _Const) and e.array.size == 1 and e.array.ndim <= x.rank:
        v = float(e.array.reshape(-1)[0])
        if v == 1.0:
            return [x]
        if v == 2.0:
            return [x * x]
        if v == 0.5:
            return [imp.g.op("sqrt", x)]
    return [imp.g.op("pow", x, imp.t(e, x.dtype))]


@_handler("Relu")
def _relu(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    return [imp.g.op("relu", x) if x.dtype.is_float else imp.g.op("maximum", x, imp.g.const(0, x.dtype))]


@_handler("LeakyRelu")
def _leaky_relu(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    alpha = float(attrs.get("alpha", 0.01))
    return [imp.g.op("where", imp.g.op("less", x, _c(imp, 0, x)), x * _c(imp, alpha, x), x)]


@_handler("PRelu")
def _prelu(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x, slope = imp.pair(ins[0], ins[1])
    return [imp.g.op("where", imp.g.op("less", x, _c(imp, 0, x)), x * slope, x)]


@_handler("Elu")
def _elu(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    alpha = float(attrs.get("alpha", 1.0))
    neg = (imp.g.op("exp", x) - _c(imp, 1.0, x)) * _c(imp, alpha, x)
    return [imp.g.op("where", imp.g.op("less", x, _c(imp, 0, x)), neg, x)]


@_handler("Selu")
def _selu(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    alpha = float(attrs.get("alpha", 1.67326319217681884765625))
    gamma = float(attrs.get("gamma", 1.05070102214813232421875))
    neg = (imp.g.op("exp", x) - _c(imp, 1.0, x)) * _c(imp, alpha, x)
    return [imp.g.op("where", imp.g.op("less_equal", x, _c(imp, 0, x)), neg, x) * _c(imp, gamma, x)]


def _hard_sigmoid(imp: _Importer, x: Tensor, alpha: float, beta: float) -> Tensor:
    y = x * _c(imp, alpha, x) + _c(imp, beta, x)
    return imp.g.op("minimum", imp.g.op("maximum", y, _c(imp, 0.0, x)), _c(imp, 1.0, x))


@_handler("HardSigmoid")
def _hardsigmoid(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    return [_hard_sigmoid(imp, x, float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5)))]


@_handler("HardSwish")
def _hardswish(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    return [x * _hard_sigmoid(imp, x, 1.0 / 6.0, 0.5)]


def _softplus_t(imp: _Importer, x: Tensor) -> Tensor:
    # max(x, 0) + log(1 + exp(-|x|)): never overflows.
    g = imp.g
    return g.op("maximum", x, _c(imp, 0.0, x)) + g.op(
        "log", _c(imp, 1.0, x) + g.op("exp", g.op("neg", g.op("abs", x))))


@_handler("Softplus")
def _softplus(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    return [_softplus_t(imp, imp.t(ins[0]))]


@_handler("Softsign")
def _softsign(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    return [x / (_c(imp, 1.0, x) + imp.g.op("abs", x))]


@_handler("Mish")
def _mish(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    return [x * imp.g.op("tanh", _softplus_t(imp, x))]


@_handler("Gelu")
def _gelu(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    approx = str(attrs.get("approximate", "none"))  # checked by _ATTR_RULES
    return [imp.g.op("gelu", imp.t(ins[0]), approximate=approx)]


@_handler("IsNaN")
def _isnan(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    return [imp.g.op("not_equal", x, x)]


def _variadic(rlx_op: str) -> Handler:
    def h(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
        vals = [v for v in ins if v is not None]
        like = next((v for v in vals if isinstance(v, Tensor)), None)
        ts = [imp.t(v, like.dtype if like is not None else None) for v in vals]
        y = ts[0]
        for t in ts[1:]:
            y = imp.g.op(rlx_op, y, t)
        if node.op_type == "Mean":
            y = y / _c(imp, len(ts), y)
        return [y]
    return h


_HANDLERS["Max"] = _variadic("maximum")
_HANDLERS["Min"] = _variadic("minimum")
_HANDLERS["Sum"] = _variadic("add")
_HANDLERS["Mean"] = _variadic("add")


@_handler("Clip")
def _clip(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    if imp.opset < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
        lo_t = None if lo is None else _c(imp, lo, x)
        hi_t = None if hi is None else _c(imp, hi, x)
    else:
        lo_t = imp.t(ins[1], x.dtype) if len(ins) > 1 and ins[1] is not None else None
        hi_t = imp.t(ins[2], x.dtype) if len(ins) > 2 and ins[2] is not None else None
    if lo_t is not None:
        x = imp.g.op("maximum", x, lo_t)
    if hi_t is not None:
        x = imp.g.op("minimum", x, hi_t)
    return [x]


@_handler("Where")
def _where(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    cond = imp.t(ins[0])
    if cond.dtype is not DType.BOOL:
        cond = imp.g.op("cast", cond, to=DType.BOOL)
    a, b = imp.pair(ins[1], ins[2])
    return [imp.g.op("where", cond, a, b)]


# -- matmul, gemm, linear --------------------------------------------------------------------

def _weight_t(imp: _Importer, c: _Const, transpose: bool, scale: float = 1.0) -> Tensor:
    """A constant matrix as a (out, in) parameter for ``linear`` (cached per transform)."""
    key = ("linear_w", transpose, scale)
    hit = c.tensors.get(key)  # type: ignore[arg-type]
    if hit is not None:
        return hit
    arr = c.array.T if transpose else c.array
    if scale != 1.0:
        arr = arr * np.asarray(scale, arr.dtype)
    name = c.name if c.name and not transpose and scale == 1.0 else (f"{c.name}.T" if c.name else None)
    t = imp.param(np.ascontiguousarray(arr), name)
    c.tensors[key] = t  # type: ignore[index]
    return t


def _bias_vector(c: _Const, n: int) -> np.ndarray | None:
    """A constant that broadcasts like a per-output-feature bias of length n, as shape (n,)."""
    a = c.array
    if a.size == n and (a.ndim == 1 or all(d == 1 for d in a.shape[:-1])):
        return a.reshape(n)
    if a.size == 1:
        return np.full((n,), a.reshape(-1)[0], a.dtype)
    return None


def _linear_bias_consumer(imp: _Importer, node: Any, x: Tensor, n: int) -> tuple[Any, Tensor] | None:
    """The single ``Add`` consuming a MatMul output with a constant per-feature bias, if any."""
    out = node.output[0]
    users = imp.consumers.get(out, [])
    if imp.depth or not imp.fuse or len(users) != 1 or out in imp.graph_outputs:
        return None
    add = users[0]
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2:
        return None
    other = add.input[1] if add.input[0] == out else add.input[0]
    if other == out:
        return None
    c = imp.env.get(other)
    if not isinstance(c, _Const) or DType.parse(c.array.dtype) != x.dtype:
        return None
    if c.array.ndim > max(x.rank, 1):
        return None
    if c.array.shape == (n,):
        return add, imp.t(c)
    b = _bias_vector(c, n)
    return None if b is None else (add, imp.param(np.ascontiguousarray(b), None))


@_handler("MatMul")
def _matmul(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    a, b = ins
    if isinstance(a, Tensor) and isinstance(b, _Const) and b.array.ndim == 2 and a.dtype.is_float \
            and DType.parse(b.array.dtype) == a.dtype and a.shape[-1] == b.array.shape[0]:
        fused = _linear_bias_consumer(imp, node, a, b.array.shape[1])
        if fused is not None:
            add, bias = fused
            y = imp.g.op("linear", a, _weight_t(imp, b, True), bias)
            imp.env[add.output[0]] = y
            imp.skip.add(tuple(add.output))
            return [y]
    ta, tb = imp.pair(a, b)
    return [imp.g.op("matmul", ta, tb)]


@_handler("Gemm")
def _gemm(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    trans_a, trans_b = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
    a = imp.t(ins[0])
    if a.rank != 2:
        raise imp.unsupported(f"Gemm input A has rank {a.rank}", fix="Gemm takes 2-D A and B")
    if trans_a:
        a = g.op("transpose", a, perm=(1, 0))
    b, c = ins[1], ins[2] if len(ins) > 2 else None
    if isinstance(b, _Const) and b.array.ndim == 2 and a.dtype.is_float:
        w = _weight_t(imp, b, not trans_b, alpha)
        n = w.shape[0]
        bias = None
        if c is None:
            bias = np.zeros((n,), a.dtype.np)
        elif isinstance(c, _Const):
            bias = _bias_vector(c, n)
            if bias is not None and beta != 1.0:
                bias = bias * np.asarray(beta, bias.dtype)
        if bias is not None:
            return [g.op("linear", a, w, imp.param(np.ascontiguousarray(bias.astype(a.dtype.np)),
                                                   c.name if isinstance(c, _Const) and beta == 1.0
                                                   and c.array.shape == (n,) else None))]
    tb = imp.t(b, a.dtype)
    if trans_b:
        tb = g.op("transpose", tb, perm=(1, 0))
    y = g.op("matmul", a, tb)
    if alpha != 1.0:
        y = y * _c(imp, alpha, y)
    if c is not None:
        tc = imp.t(c, y.dtype)
        if beta != 1.0:
            tc = tc * _c(imp, beta, tc)
        y = y + tc
    return [y]


# -- convolution, normalisation, pooling -----------------------------------------------------

def _spatial(imp: _Importer, attrs: Mapping[str, Any], in_hw: Sequence[Dim], kernel: Sequence[int],
             nd: int, what: str) -> tuple[list[int], list[int], list[int]]:
    """strides, dilations and pads (begins then ends) with auto_pad resolved."""
    strides = [int(s) for s in attrs.get("strides", [1] * nd)]
    dil = [int(d) for d in attrs.get("dilations", [1] * nd)]
    pads = [int(p) for p in attrs.get("pads", [0] * (2 * nd))]
    auto = str(attrs.get("auto_pad", "NOTSET"))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nd)
        for i in range(nd):
            size = in_hw[i]
            if not isinstance(size, int):
                raise imp.symbolic(f"{what} auto_pad={auto} needs static spatial dims")
            out = -(-size // strides[i])
            total = max((out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - size, 0)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + nd] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    elif auto != "NOTSET":
        raise imp.unsupported(f"{what} auto_pad={auto!r} is not supported",
                              fix="use NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    if len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd:
        raise imp.unsupported(f"{what} has {nd} spatial dims but strides {strides}, dilations {dil}, pads "
                              f"{pads}", fix="the model is malformed; export it again")
    return strides, dil, pads


@_handler("Conv")
def _conv(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    x = imp.t(ins[0])
    w_val = ins[1]
    w_shape = tuple(w_val.array.shape) if isinstance(w_val, _Const) else imp.t(w_val).shape
    nd = x.rank - 2
    if nd not in (1, 2) or len(w_shape) != x.rank:
        raise imp.unsupported(f"Conv with {nd} spatial dims (input {x.shape}) is not supported",
                              fix="RLX has 1-D and 2-D convolutions (NCL / NCHW)")
    kernel = [int(k) for k in attrs.get("kernel_shape", w_shape[2:])]
    strides, dil, pads = _spatial(imp, attrs, x.shape[2:], kernel, nd, "Conv")
    group = int(attrs.get("group", 1))
    w = imp.t(w_val, x.dtype)
    if nd == 1:
        x = g.op("reshape", x, shape=(x.shape[0], x.shape[1], 1, x.shape[2]))
        w = g.op("reshape", w, shape=(w.shape[0], w.shape[1], 1, w.shape[2]))
        strides, dil, pads = [1, strides[0]], [1, dil[0]], [0, pads[0], 0, pads[1]]
    kw = dict(strides=tuple(strides), pads=tuple(pads), dilations=tuple(dil), groups=group)
    b = ins[2] if len(ins) > 2 else None
    if b is not None and x.dtype.is_float:
        y = g.op("conv2d_bias", x, w, imp.t(b, x.dtype), **kw)
    else:
        y = g.op("conv2d", x, w, **kw)
        if b is not None:
            y = y + g.op("reshape", imp.t(b, x.dtype), shape=(w.shape[0], 1, 1))
    if nd == 1:
        y = g.op("reshape", y, shape=(y.shape[0], y.shape[1], y.shape[3]))
    return [y]


@_handler("BatchNormalization")
def _batch_norm(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    params = [imp.t(v, x.dtype) for v in ins[1:5]]
    return [imp.g.op("batch_norm", x, *params, eps=float(attrs.get("epsilon", 1e-5)))]


@_handler("LayerNormalization")
def _layer_norm(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    x = imp.t(ins[0])
    axis = int(attrs.get("axis", -1)) % max(x.rank, 1)
    norm_shape = x.shape[axis:]

    def affine(v: Value | None, fill: float) -> Tensor:
        if v is None:
            if not all(isinstance(d, int) for d in norm_shape):
                raise imp.symbolic("LayerNormalization over symbolic dims without a bias")
            return imp.param(np.full(norm_shape, fill, x.dtype.np), None)
        if isinstance(v, _Const) and tuple(v.array.shape) != norm_shape and \
                all(isinstance(d, int) for d in norm_shape):
            return imp.param(np.ascontiguousarray(np.broadcast_to(v.array.astype(x.dtype.np), norm_shape)),
                             None)
        t = imp.t(v, x.dtype)
        return t if t.shape == norm_shape else g.op("expand", t, shape=norm_shape)

    eps = float(attrs.get("epsilon", 1e-5))
    y = g.op("layer_norm", x, affine(ins[1], 1.0), affine(ins[2] if len(ins) > 2 else None, 0.0),
             axis=axis, eps=eps)
    if not any(node.output[1:3]):
        return [y]
    # Mean and InvStdDev (training exports keep them): computed in stash_type, which is also their
    # dtype, over the normalized axes, keeping them as size-1 axes.
    stash = _ONNX_TO_DTYPE.get(int(attrs.get("stash_type", 1)))
    if stash is None or not stash.is_float or stash is DType.C64:
        raise imp.unsupported(f"LayerNormalization stash_type={attrs.get('stash_type')} is not a float "
                              f"dtype RLX has", fix="export with stash_type=1 (float32)")
    xs = x if x.dtype is stash else g.op("cast", x, to=stash)
    axes = tuple(range(axis, x.rank))
    mean = g.op("reduce_mean", xs, axes=axes, keepdims=True)
    d = xs - mean
    var = g.op("reduce_mean", d * d, axes=axes, keepdims=True)
    inv = g.op("reciprocal", g.op("sqrt", var + g.const(eps, stash)))
    return [y, mean, inv]


def _pool(imp: _Importer, node: Any, ins: list, attrs: dict, kind: str) -> list:
    g = imp.g
    x = imp.t(ins[0])
    nd = x.rank - 2
    if nd < 1:
        raise imp.unsupported(f"{node.op_type} of a rank-{x.rank} input {x.shape}",
                              fix="pooling takes (N, C, spatial...) inputs")
    if kind == "max" and x.dtype in (DType.U8, DType.I8):
        # MaxPool-12's 8-bit inputs: pooled in float32 (every 8-bit value is exact there) and cast
        # back; a max is always one of the inputs, so the result is exact.
        y = _pool(imp, node, [g.op("cast", x, to=DType.F32), *ins[1:]], attrs, kind)[0]
        return [g.op("cast", y, to=x.dtype)]
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides, dil, pads = _spatial(imp, attrs, x.shape[2:], kernel, nd, node.op_type)
    span_k = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]  # the window's extent with dilation
    include_pad = bool(int(attrs.get("count_include_pad", 0)))
    ceil_ext = [0] * nd  # ceil_mode's extra end padding (never counted, even with count_include_pad)
    if int(attrs.get("ceil_mode", 0)):
        for i in range(nd):
            size = x.shape[2 + i]
            if not isinstance(size, int):
                raise imp.symbolic(f"{node.op_type} ceil_mode needs static spatial dims")
            span = size + pads[i] + pads[i + nd] - span_k[i]
            out = -(-span // strides[i]) + 1
            if (out - 1) * strides[i] >= size + pads[i]:
                out -= 1  # the last window must start inside the input or the begin padding
            ceil_ext[i] = max(0, (out - 1) * strides[i] + span_k[i] - (size + pads[i] + pads[i + nd]))
    indices = kind == "max" and len(node.output) > 1 and bool(node.output[1])
    column_major = bool(int(attrs.get("storage_order", 0)))
    if indices or nd > 2 or any(d != 1 for d in dil) or (kind == "avg" and include_pad and any(ceil_ext)):
        return _pool_windows(imp, x, kind, kernel, strides, dil, pads, ceil_ext, include_pad, indices,
                             column_major)
    pads = pads[:nd] + [p + e for p, e in zip(pads[nd:], ceil_ext)]
    if nd == 1:
        x = g.op("reshape", x, shape=(x.shape[0], x.shape[1], 1, x.shape[2]))
        kernel, strides, pads = [1, kernel[0]], [1, strides[0]], [0, pads[0], 0, pads[1]]
    kw: dict[str, Any] = dict(kernel=tuple(kernel), strides=tuple(strides), pads=tuple(pads))
    if kind == "max":
        y = g.op("max_pool2d", x, **kw)
    else:
        y = g.op("avg_pool2d", x, count_include_pad=include_pad, **kw)
    if nd == 1:
        y = g.op("reshape", y, shape=(y.shape[0], y.shape[1], y.shape[3]))
    return [y]


#: Most kernel positions a pooling written out as shifted slices may have (each is a graph node).
_POOL_WINDOW_MAX = 512


def _pool_windows(imp: _Importer, x: Tensor, kind: str, kernel: Sequence[int], strides: Sequence[int],
                  dil: Sequence[int], pads: Sequence[int], ceil_ext: Sequence[int],
                  include_pad: bool, indices: bool = False, column_major: bool = False) -> list[Tensor]:
    """N-d and dilated pooling (RLX's pools are 2-D, undilated) written out exactly: one strided slice
    of the padded input per kernel position, combined with maximum, or summed and divided by the
    number of counted positions of each window (a constant: the shapes are static). MaxPool's
    Indices (flat positions in the input: the spatial part row-major, or column-major for
    storage_order=1, plus (n * C + c) * prod(spatial)) follow the first maximum in kernel order, as
    ONNX Runtime's do."""
    g = imp.g
    nd = len(kernel)
    if not all(isinstance(n, int) for n in x.shape[2:]):
        raise imp.symbolic(f"{nd}-D or dilated pooling needs static spatial dims (input {x.shape})")
    sizes = [int(n) for n in x.shape[2:]]
    n_pos = math.prod(kernel)
    if n_pos > _POOL_WINDOW_MAX:
        raise imp.unsupported(f"pooling with a {list(kernel)} kernel ({n_pos} positions) written out as "
                              f"slices would be too large a graph", fix="use a 1-D/2-D undilated pool")
    if not x.dtype.is_float:
        raise imp.unsupported(f"{nd}-D or dilated pooling of {x.dtype.value} is not translated",
                              fix="cast to a float dtype before pooling")
    end = [p + e for p, e in zip(pads[nd:], ceil_ext)]
    full = [0, 0, *pads[:nd], 0, 0, *end]
    fill = -math.inf if kind == "max" else 0.0
    xp = g.op("pad", x, pads=tuple(full), value=fill) if any(full) else x
    padded = [n + pads[i] + end[i] for i, n in enumerate(sizes)]
    outs = [(padded[i] - ((kernel[i] - 1) * dil[i] + 1)) // strides[i] + 1 for i in range(nd)]
    axes = tuple(range(2, 2 + nd))
    acc: Tensor | None = None
    idx: Tensor | None = None
    grids = np.meshgrid(*[np.arange(o) for o in outs], indexing="ij")
    for pos in np.ndindex(*kernel):
        starts = tuple(j * d for j, d in zip(pos, dil))
        stops = tuple(st + (o - 1) * s + 1 for st, o, s in zip(starts, outs, strides))
        t = g.op("slice", xp, starts=starts, stops=stops, axes=axes, steps=tuple(strides))
        if indices:
            # This position's flat index in the unpadded input, per output element (padding is -inf,
            # so it is never the maximum unless a window lies wholly in it: then ORT's index too is
            # undefined, and such a window cannot occur without ceil_mode padding beyond the input).
            coord = [grid * s + j * d - p for grid, s, j, d, p in zip(grids, strides, pos, dil, pads)]
            flat = np.zeros(outs, np.int64)
            for c, n in (zip(coord[::-1], sizes[::-1]) if column_major else zip(coord, sizes)):
                flat = flat * n + c
            here = imp.param(flat.reshape(1, 1, *outs), None)
            if idx is None:
                idx = g.op("expand", here, shape=tuple(t.shape))
            else:
                better = g.op("greater", t, acc)
                idx = g.op("where", better, here, idx)
        acc = t if acc is None else g.op("maximum" if kind == "max" else "add", acc, t)
    assert acc is not None
    if kind == "max":
        if idx is None:
            return [acc]
        # Add each (batch, channel)'s offset: (n * C + c) * prod(spatial).
        bc = x.shape[:2]
        if not all(isinstance(d, int) for d in bc):
            raise imp.symbolic(f"MaxPool's Indices need a static batch and channel count (input {x.shape})")
        off = (np.arange(int(bc[0]) * int(bc[1]), dtype=np.int64) * math.prod(sizes)).reshape(
            int(bc[0]), int(bc[1]), *([1] * nd))
        return [acc, idx + imp.param(off, None)]
    # The divisor per output position: kernel positions on the input (count_include_pad=0) or on the
    # input and its explicit padding (=1); ceil_mode's extension is never counted.
    mask = np.zeros(padded, np.float64)
    if include_pad:
        mask[tuple(slice(0, padded[i] - ceil_ext[i]) for i in range(nd))] = 1
    else:
        mask[tuple(slice(pads[i], pads[i] + sizes[i]) for i in range(nd))] = 1
    count = np.zeros(outs, np.float64)
    for pos in np.ndindex(*kernel):
        count += mask[tuple(slice(j * d, j * d + (o - 1) * s + 1, s)
                            for j, d, o, s in zip(pos, dil, outs, strides))]
    divisor = imp.param(np.maximum(count, 1).astype(x.dtype.np).reshape(1, 1, *outs), None)
    return [acc / divisor]


@_handler("MaxPool")
def _max_pool(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    return _pool(imp, node, ins, attrs, "max")


@_handler("AveragePool")
def _avg_pool(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    return _pool(imp, node, ins, attrs, "avg")


@_handler("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    op = "reduce_mean" if node.op_type == "GlobalAveragePool" else "reduce_max"
    return [imp.g.op(op, x, axes=tuple(range(2, x.rank)), keepdims=True)]


# -- activations with an axis ----------------------------------------------------------------

def _softmax_like(rlx_op: str) -> Handler:
    def h(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
        g = imp.g
        x = imp.t(ins[0])
        if imp.opset >= 13:
            return [g.op(rlx_op, x, axis=int(attrs.get("axis", -1)))]
        axis = int(attrs.get("axis", 1)) % max(x.rank, 1)
        if axis == x.rank - 1:
            return [g.op(rlx_op, x, axis=-1)]
        # Before opset 13 the input is coerced to 2-D: (prod(d[:axis]), prod(d[axis:])).
        d = imp.sdims(x)
        flat = imp.reshape(x, [s_prod(d[:axis]), s_prod(d[axis:])], f"{node.op_type} coerced to 2-D")
        return [g.op("reshape", g.op(rlx_op, flat, axis=-1), shape=x.shape)]
    return h


_HANDLERS["Softmax"] = _softmax_like("softmax")
_HANDLERS["LogSoftmax"] = _softmax_like("log_softmax")


# -- reductions ------------------------------------------------------------------------------

def _keepdims(attrs: Mapping[str, Any]) -> bool:
    """ONNX Runtime keeps the reduced axes only for ``keepdims == 1``: any other value (0, 2, -1, 7)
    drops them, for every Reduce* and ArgMax/ArgMin (checked against onnxruntime 1.32). The spec only
    defines 0 and 1, so a model with another value means whatever ORT runs it as."""
    return int(attrs.get("keepdims", 1)) == 1


def _reduce(kind: str) -> Handler:
    def h(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
        g = imp.g
        x = imp.t(ins[0])
        since = 13 if node.op_type == "ReduceSum" else 18
        axes = imp.axes_arg(ins, attrs, 1, since)
        keep = _keepdims(attrs)
        if not axes:
            if int(attrs.get("noop_with_empty_axes", 0)):
                return [x]
            axes = list(range(x.rank))
        ax = tuple(sorted({a % max(x.rank, 1) for a in axes}))
        if kind in ("max", "min", "logsumexp") and any(x.shape[a] == 0 for a in ax):
            # ONNX: an empty max is -inf (the dtype's minimum for integers, False for bool), an empty
            # min +inf (maximum, True), an empty log-sum-exp -inf. RLX's reduce_max/min have no
            # identity, but reduce_sum has (0): the backend sums the empty axis and shifts the exact 0
            # to the identity, so the result is computed from the input's shape on the device.
            if kind == "logsumexp":  # log(0) = -inf; no max to subtract from an empty set
                return [g.op("log", g.op("reduce_sum", g.op("exp", x), axes=ax, keepdims=keep))]
            big = kind == "min"
            if x.dtype is DType.BOOL:
                zero = g.op("reduce_sum", g.op("cast", x, to=DType.I32), axes=ax, keepdims=keep)
                return [g.op("equal" if big else "not_equal", zero, g.const(0, DType.I32))]
            if x.dtype.is_float:
                fill: Any = math.inf if big else -math.inf
            else:
                info = np.iinfo(x.dtype.np)
                fill = int(info.max if big else info.min)
            return [g.op("reduce_sum", x, axes=ax, keepdims=keep) + g.const(fill, x.dtype)]
        if kind in ("max", "min") and x.dtype is DType.BOOL:  # any / all
            m = g.op(f"reduce_{kind}", g.op("cast", x, to=DType.I32), axes=ax, keepdims=keep)
            return [g.op("cast", m, to=DType.BOOL)]
        if kind in ("mean", "sum", "max", "min", "prod"):
            return [g.op(f"reduce_{kind}", x, axes=ax, keepdims=keep)]
        if kind == "sumsquare":
            return [g.op("reduce_sum", x * x, axes=ax, keepdims=keep)]
        if kind == "l1":
            return [g.op("reduce_sum", g.op("abs", x), axes=ax, keepdims=keep)]
        if kind == "l2":
            return [g.op("sqrt", g.op("reduce_sum", x * x, axes=ax, keepdims=keep))]
        if kind == "logsum":
            return [g.op("log", g.op("reduce_sum", x, axes=ax, keepdims=keep))]
        m = g.op("reduce_max", x, axes=ax, keepdims=True)  # logsumexp, stable
        s = g.op("log", g.op("reduce_sum", g.op("exp", x - m), axes=ax, keepdims=True)) + m
        return [s if keep else imp.reshape(s, [d for i, d in enumerate(imp.sdims(s)) if i not in ax])]
    return h


for _name, _kind in (("ReduceMean", "mean"), ("ReduceSum", "sum"), ("ReduceMax", "max"), ("ReduceMin", "min"),
                     ("ReduceProd", "prod"), ("ReduceSumSquare", "sumsquare"), ("ReduceL1", "l1"),
                     ("ReduceL2", "l2"), ("ReduceLogSum", "logsum"), ("ReduceLogSumExp", "logsumexp")):
    _HANDLERS[_name] = _reduce(_kind)


@_handler("ArgMax", "ArgMin")
def _arg(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    x = imp.t(ins[0])
    axis = int(attrs.get("axis", 0)) % max(x.rank, 1)
    if not int(attrs.get("select_last_index", 0)):
        return [g.op(node.op_type.lower(), x, axis=axis, keepdims=_keepdims(attrs))]
    # The last extreme index is n-1 minus the first one of the axis reversed.
    n = x.shape[axis]
    if not isinstance(n, int):
        raise imp.symbolic(f"{node.op_type} select_last_index=1 over the symbolic axis {n!r}", [str(n)])
    rev = g.op("slice", x, starts=(-1,), stops=(-_INT_BIG,), axes=(axis,), steps=(-1,))
    first = g.op(node.op_type.lower(), rev, axis=axis, keepdims=_keepdims(attrs))
    return [g.const(n - 1, first.dtype) - first]


@_handler("CumSum")
def _cumsum(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    axis = imp.ints(ins[1], "CumSum axis")
    return [imp.g.op("cumsum", x, axis=axis[0] if axis else 0, exclusive=bool(int(attrs.get("exclusive", 0))),
                     reverse=bool(int(attrs.get("reverse", 0))))]


# -- shapes and data movement ----------------------------------------------------------------

@_handler("Shape")
def _shape(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = ins[0]
    if isinstance(x, Tensor):
        dims = imp.sdims(x)
    else:
        dims = list(np.shape(x.arr if isinstance(x, _Sym) else x.array))
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    sel = dims[slice(start, None if end is None else int(end))]
    arr = np.empty((len(sel),), dtype=object)
    for i, d in enumerate(sel):
        arr[i] = d
    return [_finish(arr, DType.I64)]


@_handler("Size")
def _size(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    arr = np.empty((), dtype=object)
    arr[()] = s_prod(imp.sdims(x))
    return [_finish(arr, DType.I64)]


@_handler("Reshape")
def _reshape(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    target = imp.dims(ins[1], "the Reshape target shape")
    allowzero = int(attrs.get("allowzero", 0))
    src = imp.sdims(x)
    out: list[SymLike] = []
    for i, d in enumerate(target):
        if isinstance(d, int) and d == 0 and not allowzero:
            if i >= len(src):
                raise imp.unsupported(f"Reshape target {target} copies axis {i} of a rank-{len(src)} input",
                                      fix="the model is malformed")
            out.append(src[i])
        else:
            out.append(d)
    minus = [i for i, d in enumerate(out) if isinstance(d, int) and d == -1]
    if len(minus) > 1:
        raise imp.unsupported(f"Reshape target {target} has more than one -1", fix="the model is malformed")
    if minus:
        known = s_prod(d for i, d in enumerate(out) if i != minus[0])
        try:
            out[minus[0]] = s_div(s_prod(src), known)
        except _NotSymbolic:
            raise imp.symbolic(f"Reshape cannot infer the -1 in {target} from the input shape {x.shape}"
                               ) from None
    return [imp.reshape(x, out, "the Reshape result")]


@_handler("Flatten")
def _flatten(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    axis = int(attrs.get("axis", 1))
    axis = axis + x.rank if axis < 0 else axis
    d = imp.sdims(x)
    return [imp.reshape(x, [s_prod(d[:axis]), s_prod(d[axis:])], "the Flatten result")]


@_handler("Unsqueeze")
def _unsqueeze(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    axes = imp.axes_arg(ins, attrs, 1, 13)
    if axes is None:
        raise imp.unsupported("Unsqueeze without axes", fix="the model is malformed")
    r = x.rank + len(axes)
    dims = imp.sdims(x)
    for ax in sorted(a % r for a in axes):
        dims.insert(ax, 1)
    return [imp.reshape(x, dims)]


@_handler("Squeeze")
def _squeeze(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    axes = imp.axes_arg(ins, attrs, 1, 13)
    if axes is None:
        keep = [d for d in x.shape if d != 1]
    else:
        norm = {a % max(x.rank, 1) for a in axes}
        for a in norm:
            if isinstance(x.shape[a], str):
                raise imp.symbolic(f"Squeeze of the symbolic axis {a} ({x.shape[a]!r}) of {x.shape}",
                                   [str(x.shape[a])])
            if x.shape[a] != 1:
                raise imp.unsupported(f"Squeeze of axis {a} of size {x.shape[a]} (input {x.shape})",
                                      fix="only axes of size 1 can be squeezed; the model is malformed")
        keep = [d for i, d in enumerate(x.shape) if i not in norm]
    return [imp.reshape(x, [_sym_of(d) for d in keep])]


@_handler("Transpose")
def _transpose(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    perm = attrs.get("perm")
    perm = tuple(range(x.rank - 1, -1, -1)) if perm is None else tuple(int(p) for p in perm)
    if perm == tuple(range(x.rank)):
        return [x]
    return [imp.g.op("transpose", x, perm=perm)]


@_handler("Concat")
def _concat(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    vals = [v for v in ins if v is not None]
    like = next((v for v in vals if isinstance(v, Tensor)), None)
    ts = [imp.t(v, like.dtype if like is not None else None) for v in vals]
    axis = int(attrs["axis"]) % max(ts[0].rank, 1)
    nonempty = [t for t in ts if t.shape[axis] != 0]
    ts = nonempty or ts[:1]
    if len(ts) == 1:
        return [ts[0]]
    return [imp.g.op("concat", *ts, axis=axis)]


@_handler("Split")
def _split(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    axis = int(attrs.get("axis", 0)) % max(x.rank, 1)
    n_out = len(node.output)
    if imp.opset >= 13:
        sizes = imp.ints(ins[1] if len(ins) > 1 else None, "Split sizes")
    else:
        sizes = [int(s) for s in attrs["split"]] if "split" in attrs else None
    total = x.shape[axis]
    if sizes is None:
        if n_out == 1:
            return [x]
        if not isinstance(total, int):
            raise imp.symbolic(f"Split of the symbolic axis {total!r}", [str(total)])
        n = int(attrs.get("num_outputs", n_out))
        chunk = -(-total // n)
        sizes = [min(chunk, total - i * chunk) for i in range(n)]
    if not isinstance(total, int):
        raise imp.symbolic(f"Split of the symbolic axis {total!r}", [str(total)])
    outs, start = [], 0
    for s in sizes:
        outs.append(imp.g.op("slice", x, starts=(start,), stops=(start + s,), axes=(axis,)))
        start += s
    return outs


_INT_BIG = 2**62


def _clamp(v: Any) -> int:
    return max(min(int(v), _INT_BIG), -_INT_BIG)


@_handler("Slice")
def _slice(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    x = imp.t(ins[0])
    starts: list[SymLike]
    ends: list[SymLike]
    if imp.opset < 10:  # Slice-1: starts, ends and axes are attributes, and there are no steps
        starts, ends = [int(v) for v in attrs["starts"]], [int(v) for v in attrs["ends"]]
        axes = [int(v) for v in attrs["axes"]] if "axes" in attrs else list(range(len(starts)))
        steps = [1] * len(axes)
    else:
        starts = imp.dims(ins[1], "Slice starts")
        ends = imp.dims(ins[2], "Slice ends")
        axes = imp.ints(ins[3] if len(ins) > 3 else None, "Slice axes") or list(range(len(starts)))
        steps = imp.ints(ins[4] if len(ins) > 4 else None, "Slice steps") or [1] * len(axes)
    st_l, sp_l, ax_l, step_l = [], [], [], []
    y = x
    for s, e, ax, step in zip(starts, ends, axes, steps):
        ax %= max(x.rank, 1)
        d = x.shape[ax]
        if isinstance(s, SymInt) or isinstance(e, SymInt) or isinstance(d, str):
            dim = _sym_of(d)
            s_full = isinstance(s, int) and (s == 0 or s <= -_INT_BIG) and step == 1
            e_full = (isinstance(e, int) and e >= _INT_BIG) or (
                isinstance(e, SymInt) and isinstance(dim, SymInt) and e.key() == dim.key())
            if s_full and e_full:
                continue  # the whole axis
            if isinstance(s, int) and s >= 0 and step == 1 and isinstance(e, SymInt) and isinstance(d, int):
                # x[s:e] with a symbolic e on a static axis: gather the rows s, s+1, ... (e - s of them)
                if s != 0:
                    raise imp.symbolic(f"Slice [{s}:{e!r}] has a symbolic length")
                n = imp.to_dim(e, "the Slice length")
                idx = g.op("iota", shape=(n,), axis=0, dtype=DType.I64)
                y = g.op("gather", y, idx, axis=ax)
                continue
            raise imp.symbolic(f"Slice [{s!r}:{e!r}:{step}] of axis {ax} (size {d!r}) has a symbolic "
                               f"result size")
        st_l.append(_clamp(s))
        sp_l.append(_clamp(e))
        ax_l.append(ax)
        step_l.append(int(step))
    if st_l:
        y = g.op("slice", y, starts=tuple(st_l), stops=tuple(sp_l), axes=tuple(ax_l), steps=tuple(step_l))
    return [y]


@_handler("Gather")
def _gather(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    data, idx = ins
    axis = int(attrs.get("axis", 0))
    ids = imp.t(idx)
    if ids.dtype not in (DType.I32, DType.I64):
        ids = g.op("cast", ids, to=DType.I64)
    table = isinstance(data, _Const) and data.array.ndim == 2 and data.array.dtype.kind == "f"
    if table and axis in (0, -2) and not isinstance(idx, _Const):
        return [g.op("embedding", imp.t(data), ids)]
    return [g.op("gather", imp.t(data), ids, axis=axis)]


@_handler("GatherND")
def _gather_nd(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """``batch_dims = 0``: the last index axis (length k) addresses the first k data axes. k == 1 is
    a gather on axis 0 (an embedding lookup for a float table: what exporters emit for
    ``nn.Embedding``); k > 1 flattens the addressed axes into one and linearises the index."""
    g = imp.g
    data, idx = ins
    ids = imp.t(idx)
    x = imp.t(data)
    k = ids.shape[-1] if ids.rank else None
    if not isinstance(k, int) or k < 1 or k > x.rank:
        raise imp.unsupported(f"GatherND with indices {ids.shape} on data {x.shape}",
                              fix="the last index axis must be a static length between 1 and the data rank")
    if ids.dtype not in (DType.I32, DType.I64):
        ids = g.op("cast", ids, to=DType.I64)
    lead = [_sym_of(d) for d in ids.shape[:-1]]
    if k == 1:
        flat = imp.reshape(ids, lead)
    else:
        addressed = x.shape[:k]
        if not all(isinstance(d, int) for d in addressed):
            raise imp.symbolic(f"GatherND over the symbolic data axes {addressed}",
                               [str(d) for d in addressed if isinstance(d, str)])
        flat = None
        stride = 1
        for j in range(k - 1, -1, -1):
            col = g.op("slice", ids, starts=(j,), stops=(j + 1,), axes=(ids.rank - 1,), steps=(1,))
            term = imp.reshape(col, lead)
            if stride != 1:
                term = term * g.const(stride, term.dtype)
            flat = term if flat is None else flat + term
            stride *= int(addressed[j])  # type: ignore[arg-type]
        x = imp.reshape(x, [stride, *(_sym_of(d) for d in x.shape[k:])])
    table = isinstance(data, _Const) and k == 1 and data.array.ndim == 2 and data.array.dtype.kind == "f"
    if table and not isinstance(idx, _Const):
        return [g.op("embedding", x, flat)]
    return [g.op("gather", x, flat, axis=0)]


def _broadcast_dims(imp: _Importer, a: Sequence[SymLike], b: Sequence[SymLike], what: str) -> list[SymLike]:
    r = max(len(a), len(b))
    a = [1] * (r - len(a)) + list(a)
    b = [1] * (r - len(b)) + list(b)
    out: list[SymLike] = []
    for x, y in zip(a, b):
        if isinstance(y, int) and y == 1:
            out.append(x)
        elif isinstance(x, int) and x == 1:
            out.append(y)
        else:
            try:
                same = s_eq(x, y)
            except _NotSymbolic:
                same = False
            if not same:
                raise imp.symbolic(f"{what}: dims {x!r} and {y!r} do not broadcast (or cannot be proven to)")
            out.append(x)
    return out


@_handler("Expand")
def _expand(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    target = imp.dims(ins[1], "the Expand shape")
    out = _broadcast_dims(imp, imp.sdims(x), target, "Expand")
    shape = imp.shape_of(out, "the Expand result")
    return [x if shape == x.shape else imp.g.op("expand", x, shape=shape)]


@_handler("ConstantOfShape")
def _constant_of_shape(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    value = imp._tensor_array(attrs["value"]) if "value" in attrs else np.zeros((1,), np.float32)
    dims = imp.dims(ins[0], "the ConstantOfShape shape")
    shape = imp.shape_of(dims, "the ConstantOfShape result")
    scalar = imp.g.const(value.reshape(()), DType.parse(value.dtype))
    return [imp.g.op("expand", scalar, shape=shape)]


@_handler("Range")
def _range(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    start, limit, delta = ins
    if not isinstance(start, _Const) or not isinstance(delta, _Const):
        if isinstance(start, _Sym) or isinstance(delta, _Sym):
            raise imp.symbolic("Range with a symbolic start or delta")
        raise imp.needs_values([v for v in (start, delta) if isinstance(v, Tensor)],
                               "Range with a run-time start or delta")
    dt = DType.parse(start.array.dtype)
    s0, d0 = start.array.reshape(-1)[0].item(), delta.array.reshape(-1)[0].item()
    cdt = dt
    if dt in (DType.F16, DType.BF16):  # Range-27: computed in stash_type (float32) and cast back
        if int(attrs.get("stash_type", 1)) != 1:
            raise imp.unsupported(f"Range stash_type={attrs['stash_type']} is not translated (float32 only)",
                                  fix="export with the default stash_type=1 (float32)")
        cdt = DType.F32
    if (isinstance(start, _Live) or isinstance(delta, _Live)) and isinstance(limit, _Const) and d0 != 0:
        # Staged execution keyed the stage on these values and feeds them: the length comes from the
        # key, start + delta * i is computed from the fed tensors on the backend.
        n = max(0, math.ceil((limit.array.reshape(-1)[0].item() - s0) / d0))
        out = imp.g.op("iota", shape=(n,), axis=0, dtype=cdt) * imp.t(delta, cdt) + imp.t(start, cdt)
    else:
        out = _range_values(imp, s0, limit, d0, cdt)
    return [out if cdt == dt else imp.g.op("cast", out, to=dt)]


def _range_values(imp: _Importer, s0: Any, limit: Value, d0: Any, dt: DType) -> Tensor:
    if isinstance(limit, _Const) and d0 != 0:
        # A constant Range too large to fold (the import's budget): start + delta * iota(n) at run time.
        l0 = limit.array.reshape(-1)[0].item()
        n = max(0, math.ceil((l0 - s0) / d0))
        out = imp.g.op("iota", shape=(n,), axis=0, dtype=dt)
        if d0 != 1:
            out = out * imp.g.const(d0, dt)
        return out + imp.g.const(s0, dt) if s0 != 0 else out
    lim = imp.dims(limit, "the Range limit")
    if len(lim) != 1 or d0 != 1 or not _is_int(s0):
        raise imp.symbolic(f"Range({s0}, {lim}, {d0}) has a symbolic length (only Range(k, n, 1) with an "
                           f"int k has a polynomial length n - k)")
    # n - k must stay >= 0 for every size >= 1 of its symbols (the sizes a compile checks with):
    # then a binding with n < k (a 0 size) fails at specialisation, never a silently wrong range
    length = s_sub(lim[0], int(s0))
    if not isinstance(length, SymInt):
        length = max(0, int(length))
    poly = symexpr.parse(length.expr) if isinstance(length, SymInt) else {}
    if sum(poly.values()) < 0 or any(c < 0 for mono, c in poly.items() if mono):
        raise imp.symbolic(f"Range({s0}, {lim[0]}, 1) would have the length {length}, which is negative "
                           f"for some sizes of its symbols")
    n = imp.to_dim(length, "the Range length")
    out = imp.g.op("iota", shape=(n,), axis=0, dtype=dt)
    return out + imp.g.const(s0, dt) if s0 != 0 else out


@_handler("Tile")
def _tile(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    reps: list[Any] = imp.dims(ins[1], "Tile repeats") if ins[1] is not None else []
    if len(reps) != x.rank:
        raise imp.unsupported(f"Tile repeats {reps} for a rank-{x.rank} input",
                              fix="give one repeat per axis")
    for ax, r in enumerate(reps):
        if isinstance(r, SymInt):
            # repeats from the symbolic shape (whisper's batch): [.., d, ..] -> expand -> [.., r*d, ..]
            s = list(x.shape)
            rd = imp.to_dim(r, "the Tile repeat")
            x = imp.g.op("reshape", x, shape=tuple(s[:ax] + [1] + s[ax:]))
            x = imp.g.op("expand", x, shape=tuple(s[:ax] + [rd] + s[ax:]))
            x = imp.g.op("reshape", x, shape=tuple(s[:ax] + [symexpr.mul(rd, s[ax])] + s[ax + 1:]))
        elif r != 1:
            if r <= 0:
                x = imp.g.op("slice", x, starts=(0,), stops=(0,), axes=(ax,))
            elif r <= _TILE_CONCAT_MAX:
                x = imp.g.op("concat", *([x] * r), axis=ax)
            else:
                # A concat of r inputs would make the graph (not just the tensor) r times larger:
                # [.., d, ..] -> [.., 1, d, ..] -> expand [.., r, d, ..] -> [.., r*d, ..].
                s = list(x.shape)
                x = imp.g.op("reshape", x, shape=tuple(s[:ax] + [1] + s[ax:]))
                x = imp.g.op("expand", x, shape=tuple(s[:ax] + [r] + s[ax:]))
                x = imp.g.op("reshape", x, shape=tuple(s[:ax] + [symexpr.mul(r, s[ax])] + s[ax + 1:]))
    return [x]


#: Tile repeats up to this many are a concat (as before); more are an expand.
_TILE_CONCAT_MAX = 16


@_handler("Pad")
def _pad(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    mode = str(attrs.get("mode", "constant"))
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise imp.unsupported(f"Pad mode={mode!r} is not defined", fix="use constant, edge, reflect or wrap")
    value_t: Tensor | None = None  # a pad value computed at run time
    if imp.opset >= 11:
        pads = imp.ints(ins[1], "Pad pads")
        v_in = ins[2] if len(ins) > 2 else None
        if isinstance(v_in, Tensor):
            value, value_t = 0.0, v_in
        else:
            value = imp.scalar(v_in, "the Pad value") or 0.0
        axes = imp.ints(ins[3] if len(ins) > 3 else None, "Pad axes")
    else:  # Pad-2: pads and value are attributes
        pads, value, axes = [int(p) for p in attrs["pads"]], float(attrs.get("value", 0.0)), None
    assert pads is not None
    r = x.rank
    if axes is not None:
        full = [0] * (2 * r)
        k = len(axes)
        for i, ax in enumerate(axes):
            full[ax % r], full[ax % r + r] = pads[i], pads[i + k]
        pads = full
    g = imp.g
    if any(p < 0 for p in pads):
        if mode != "constant":
            raise imp.unsupported(f"Pad mode={mode!r} with negative pads {pads} (cropping) is not translated",
                                  fix="crop with Slice, then pad")
        # Negative pads crop: slice those off first, then pad with the rest.
        ax_c = [a for a in range(r) if pads[a] < 0 or pads[a + r] < 0]
        for a in ax_c:
            if not isinstance(x.shape[a], int):
                raise imp.symbolic(f"Pad cropping the symbolic axis {x.shape[a]!r}", [str(x.shape[a])])
        x = g.op("slice", x, starts=tuple(-min(pads[a], 0) for a in ax_c),
                 stops=tuple(int(x.shape[a]) + min(pads[a + r], 0) for a in ax_c), axes=tuple(ax_c),
                 steps=(1,) * len(ax_c))
        pads = [max(p, 0) for p in pads]
    if not any(pads):
        return [x]
    if mode != "constant":
        return [_pad_border(imp, x, pads, mode)]
    y = g.op("pad", x, pads=tuple(pads), value=float(value))
    if value_t is not None:
        # The border takes the run-time value: select it where a padded all-true mask is false
        # (exact for every value, inf and NaN included, unlike a masked sum).
        vt = value_t if value_t.dtype == x.dtype else g.op("cast", value_t, to=x.dtype)
        if vt.rank:
            vt = g.op("reshape", vt, shape=())
        inside = g.op("pad", g.op("expand", g.const(1.0, DType.F32), shape=x.shape), pads=tuple(pads),
                      value=0.0)
        y = g.op("where", g.op("greater", inside, g.const(0.5, DType.F32)), y, vt)
    return [y]


def _pad_border(imp: _Importer, x: Tensor, pads: Sequence[int], mode: str) -> Tensor:
    """Pad mode edge / reflect / wrap as slices and concats, one axis after the other (as np.pad, the
    reference, does: later axes pad the already padded corners)."""
    g = imp.g
    r = x.rank
    for a in range(r):
        b, e = pads[a], pads[a + r]
        if not b and not e:
            continue
        n = x.shape[a]
        if not isinstance(n, int):
            raise imp.symbolic(f"Pad mode={mode!r} of the symbolic axis {n!r}", [str(n)])
        limit = n - 1 if mode == "reflect" else n
        if n == 0 or b > limit or e > limit:
            raise imp.unsupported(f"Pad mode={mode!r} of {b}+{e} on an axis of size {n} (more than {limit} "
                                  f"per side) is not translated", fix="pad less, or in several Pad nodes")

        if mode == "edge":
            spans = [(0, 1, 1, b), (n - 1, n, 1, e)]
        elif mode == "reflect":  # mirror without repeating the border element
            spans = [(b, 0, -1, 0), (n - 2, n - 2 - e, -1, 0)]
        else:  # wrap
            spans = [(n - b, n, 1, 0), (0, e, 1, 0)]
        sides: list[Tensor | None] = []
        for (start, stop, step, rep), k in zip(spans, (b, e)):
            if not k:
                sides.append(None)
                continue
            t = g.op("slice", x, starts=(start,), stops=(stop if stop >= 0 else -_INT_BIG,), axes=(a,),
                     steps=(step,))
            if rep:  # edge: the border element repeated k times
                shape = list(x.shape)
                shape[a] = rep
                t = g.op("expand", t, shape=tuple(shape))
            sides.append(t)
        x = g.op("concat", *[t for t in (sides[0], x, sides[1]) if t is not None], axis=a)
    return x


#: A branch with more nodes than this (subgraphs included) is not predicated: both branches would run.
_PREDICATE_MAX_NODES = 256


def _branch_nodes(graph: Any) -> Iterable[Any]:
    for n in graph.node:
        yield n
        for a in n.attribute:
            for sub in ([a.g] if a.type == 5 else list(a.graphs) if a.type == 10 else []):
                yield from _branch_nodes(sub)


def _import_branch(imp: _Importer, branch: Any) -> list[Value]:
    saved = (imp.node, imp.node_where)
    for t in branch.initializer:
        imp.env[t.name] = _Const(imp._tensor_array(t), t.name)
    imp.depth += 1
    try:
        imp._run_nodes(branch.node)
    finally:
        imp.depth -= 1
        imp.node, imp.node_where = saved
    return [imp.env[o.name] for o in branch.output]


def _if_predicated(imp: _Importer, node: Any, cond: Tensor, attrs: dict) -> list | None:
    """If with a run-time condition as ``where(cond, then, else)`` per output, both branches computed
    on the backend; None (staged execution takes the branch instead) when a branch is large, has a
    side effect (random numbers), gives a non-tensor or its outputs differ in shape or dtype."""
    branches = [attrs["then_branch"], attrs["else_branch"]]
    if cond.dtype is not DType.BOOL or len(branches[0].output) != len(branches[1].output):
        return None
    for b in branches:
        nodes = list(_branch_nodes(b))
        if len(nodes) > _PREDICATE_MAX_NODES or any(n.op_type in _NO_FOLD - {"If", "Loop", "Scan"}
                                                    for n in nodes):
            return None
        if any(o.type.WhichOneof("value") not in (None, "tensor_type") for o in b.output):
            return None  # sequence/optional branches: not values a where() selects
    if symexpr.numel(cond.shape) != 1:
        return None  # ONNX requires a one-element condition; anything else is left to staging
    try:
        outs = [_import_branch(imp, b) for b in branches]
        then, other = ([imp.t(v) for v in vs] for vs in outs)
    except RLXError:
        return None  # a branch needs staging itself (run-time values, data-dependent shapes ...)
    if any(a.dtype != b.dtype or a.shape != b.shape for a, b in zip(then, other)):
        return None  # shapes/dtypes differ per branch: only taking the branch can type the result
    c = cond if cond.rank == 0 else imp.g.op("reshape", cond, shape=())
    return [imp.g.op("where", c, a, b) for a, b in zip(then, other)]


@_handler("If")
def _if(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    cond = ins[0]
    if not isinstance(cond, _Const):
        msg = "If with a condition computed at run time (data-dependent control flow)"
        if isinstance(cond, Tensor):
            predicated = _if_predicated(imp, node, cond, attrs)
            if predicated is not None:
                return predicated
            # staged execution computes it first and takes the branch
            raise imp.needs_values([cond], msg)
        if imp.has_symbols():
            raise imp.symbolic(msg)
        raise imp.unsupported(msg, fix="export without data-dependent branches (torch.cond)")
    return _import_branch(imp, attrs["then_branch" if bool(cond.array.reshape(-1)[0]) else "else_branch"])


from . import onnx_index as _onnx_index  # noqa: E402,F401  (indexing/integer handlers register here)
from . import onnx_misc as _onnx_misc  # noqa: E402,F401  (trig, Col2Im, Scan/Loop, bitwise... register here)
from . import onnx_misc2 as _onnx_misc2  # noqa: E402,F401  (training optimizers, ai.onnx.ml)
from . import onnx_nn as _onnx_nn  # noqa: E402,F401  (Resize, Attention, norms, losses register here)
from . import onnx_ops2 as _onnx_ops2  # noqa: E402,F401  (float Mod, BitCast, LpPool... register here)
from . import onnx_optional as _onnx_optional  # noqa: E402  (Optional* on tensors, optional inputs)
from . import onnx_quant as _onnx_quant  # noqa: E402,F401  (quantized operators register here)
from . import onnx_rnn as _onnx_rnn  # noqa: E402,F401  (RNN, GRU, LSTM register here)
from . import onnx_seq as _onnx_seq  # noqa: E402  (sequence values and operators, If over sequences)
from . import onnx_signal as _onnx_signal  # noqa: E402,F401  (DFT, STFT, windows register here)
from . import onnx_staged as _onnx_staged  # noqa: E402  (NonZero, Unique, NMS register here; staging)


def load_onnx_model(model: str | os.PathLike[str] | bytes | Any, **kw: Any) -> Any:
    """An ONNX model compiled for a device, staged where one RLX graph cannot hold it: see
    :func:`rlx_core.frontends.onnx_staged.load_onnx_model` (same keywords) and its ``StagedModel``."""
    return _onnx_staged.load_onnx_model(model, **kw)


def __getattr__(name: str) -> Any:
    # Looked up lazily: onnx_staged imports this module, so importing it first must still work.
    if name == "StagedModel":
        return _onnx_staged.StagedModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: The ONNX operators (default domain) this importer translates.
SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(_HANDLERS))


def supported_ops() -> list[str]:
    """Supported default-domain operators, including ones added with :func:`register_handler`."""
    return sorted(set(_HANDLERS) | _CUSTOM_DEFAULT)


__all__ = ["MAX_OPSET", "MIN_OPSET", "SUPPORTED_OPS", "DataDependentShapeError", "RuntimeValueError",
           "SymInt", "SymbolicShapeError", "UnsupportedOnnxError", "input_types", "load_onnx",
           "load_onnx_model", "read_model", "register_handler", "supported_ops"]
