"""Tensor types, symbolic dims, broadcasting and frozen attribute maps."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

from ..dtypes import DType
from ..errors import IRError, ShapeError
from . import symexpr

#: A dimension is a static size, the name of a symbol (``"batch"``) bound at run time, or the
#: canonical string of a polynomial over symbols (``"batch*seq"``, ``"past+seq"``; see :mod:`.symexpr`).
Dim = Union[int, str]
Shape = tuple[Dim, ...]


def check_dim(d: Any, where: str) -> Dim:
    if isinstance(d, bool):
        raise ShapeError(f"dimension {d!r} is a bool", where=where, fix="use an int >= 0 or a symbol name")
    if isinstance(d, int):
        if d < 0:
            raise ShapeError(f"negative dimension {d}", where=where, fix="dimensions are >= 0")
        return d
    if isinstance(d, str):
        if d.isidentifier():
            return d
        try:
            c = symexpr.canonical(d)
        except ShapeError as e:
            raise ShapeError(e.what, where=where, fix=e.fix) from None
        if (isinstance(c, int) and c < 0) or (isinstance(c, str) and all(
                v < 0 for v in symexpr.parse(c).values())):
            raise ShapeError(f"dimension {d!r} is negative for every size of its symbols", where=where,
                             fix="dimensions are >= 0")
        return c
    try:
        import numpy as np

        if isinstance(d, np.integer) and int(d) >= 0:
            return int(d)
    except ImportError:  # pragma: no cover
        pass
    raise ShapeError(f"invalid dimension {d!r}", where=where,
                     fix="a dimension is an int >= 0 or an identifier naming a symbol, e.g. 'batch'")


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: Shape

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        if not isinstance(self.shape, (tuple, list)):
            raise ShapeError(f"shape must be a tuple, got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(check_dim(d, "TensorType.shape") for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for d in self.shape if isinstance(d, str) for s in symexpr.symbols(d))

    def numel(self, bindings: Mapping[str, int] | None = None, default: int = 1) -> int:
        return math.prod(resolve_dim(d, bindings, default) for d in self.shape)

    def nbytes(self, bindings: Mapping[str, int] | None = None, default: int = 1) -> int:
        return self.numel(bindings, default) * self.dtype.itemsize

    def with_shape(self, shape: Iterable[Dim]) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)

    def specialize(self, bindings: Mapping[str, int]) -> TensorType:
        return TensorType(self.dtype, tuple(symexpr.substitute(d, bindings) for d in self.shape))

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


def resolve_dim(d: Dim, bindings: Mapping[str, int] | None, default: int = 1) -> int:
    if isinstance(d, int):
        return d
    return symexpr.evaluate(d, bindings or {}, default)


def broadcast_shapes(*shapes: Shape, where: str = "") -> Shape:
    """NumPy broadcasting, extended to symbols: a symbol or expression broadcasts with 1 and with
    itself only (expressions are canonical strings, so equal polynomials compare equal)."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dim: Dim = 1
        for s in shapes:
            j = i - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if isinstance(d, str) and not d.isidentifier():
                d = symexpr.canonical(d)
            if dim == 1:
                dim = d
            elif dim != d:
                pretty = " and ".join(str(tuple(s)) for s in shapes)
                raise ShapeError(f"shapes {pretty} do not broadcast (axis {i - rank}: {dim} vs {d})",
                                 where=where or None,
                                 fix="make the sizes equal, or 1, on that axis (reshape/expand first)")
        out.append(dim)
    return tuple(out)


def normalize_axis(axis: int, rank: int, where: str = "") -> int:
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} is out of range for rank {rank}", where=where or None,
                         fix=f"use an axis in [{-rank}, {rank - 1}]")
    return axis % max(rank, 1)


# ---------------------------------------------------------------------------------------------
# Attributes

AttrValue = Union[int, float, bool, str, None, DType, tuple]


def freeze_attr(value: Any) -> AttrValue:
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr(v) for v in value)
    if isinstance(value, DType) or value is None or isinstance(value, (bool, int, float, str)):
        return value
    try:
        import numpy as np

        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return freeze_attr(value.tolist())
    except ImportError:  # pragma: no cover
        pass
    raise IRError(f"attribute value {value!r} of type {type(value).__name__} is not supported",
                  fix="attributes are ints, floats, bools, strings, dtypes, None, or tuples of these")


def attr_float(attrs: Mapping[str, Any], name: str) -> float:
    """A ``float`` attribute as a float (:meth:`OpSchema.check_attrs` has made it one)."""
    v = attrs[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise IRError(f"attribute {name!r} = {v!r} is not a float", fix=f"pass {name}=<number>")
    return float(v)


def attr_dtype(attrs: Mapping[str, Any], name: str) -> DType:
    """A ``dtype`` attribute as a :class:`DType` (:meth:`DType.parse` reads any spelling of one)."""
    return DType.parse(attrs[name])


def attr_ints(attrs: Mapping[str, Any], name: str) -> tuple[int, ...]:
    """An ``ints`` attribute (:meth:`OpSchema.check_attrs` has checked its elements)."""
    v = attrs[name]
    if not isinstance(v, tuple):
        raise IRError(f"attribute {name!r} = {v!r} is not a tuple of ints", fix=f"pass {name}=(...)")
    return v


class Attrs(Mapping[str, AttrValue]):
    """An immutable, hashable mapping of attribute names to frozen values."""

    __slots__ = ("_d", "_h")

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        d = dict(items)
        self._d = {k: freeze_attr(d[k]) for k in sorted(d)}
        self._h: int | None = None

    def __getitem__(self, key: str) -> AttrValue:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def _key(self) -> tuple[Any, ...]:
        # NaN attributes (pad value=nan) must still make an Attrs equal to itself.
        return tuple((k, "nan" if isinstance(v, float) and v != v else v) for k, v in self._d.items())

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(self._key())
        return self._h

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._key() == other._key()
        if isinstance(other, Mapping):
            return self._d == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return "Attrs(" + ", ".join(f"{k}={v!r}" for k, v in self._d.items()) + ")"

    def replace(self, **changes: Any) -> Attrs:
        d = dict(self._d)
        d.update(changes)
        return Attrs(d)
