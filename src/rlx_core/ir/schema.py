"""The open op registry: one ``OpSchema`` per op, with attributes, inference and a float64 reference.

Unlike the closed op enum of the Rust original, plugins add ops by returning schemas from the
``rlx_ops`` hook; the conformance suite then covers them with the same generator.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..dtypes import ALL_DTYPES, DType
from ..errors import IRError
from .types import Attrs, TensorType, freeze_attr


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

ATTR_KINDS = ("int", "float", "bool", "str", "ints", "floats", "dtype", "shape", "any")


@dataclass(frozen=True)
class AttrSpec:
    name: str
    kind: str
    default: Any = REQUIRED
    doc: str = ""
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ATTR_KINDS:
            raise IRError(f"attribute kind {self.kind!r} of {self.name!r} is unknown",
                          fix=f"use one of {ATTR_KINDS}")

    def check(self, value: Any, where: str) -> Any:
        """Normalise ``value`` to this attribute's kind, or raise naming the node and field."""
        value = freeze_attr(value)
        k = self.kind
        ok = True
        if value is None and self.default is None:
            return None
        if k == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif k == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif k == "bool":
            ok = isinstance(value, bool)
        elif k == "str":
            ok = isinstance(value, str)
        elif k == "ints":
            value = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
            ok = isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool)
                                                  for v in value)
        elif k == "floats":
            ok = isinstance(value, tuple) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in value)
            value = tuple(float(v) for v in value) if ok else value
        elif k == "dtype":
            try:
                value = DType.parse(value)
            except IRError:
                ok = False
        elif k == "shape":
            ok = isinstance(value, tuple) and all(
                (isinstance(v, int) and not isinstance(v, bool) and v >= -1)
                or (isinstance(v, str) and v.isidentifier()) for v in value)
        if not ok:
            raise IRError(f"attribute {self.name!r} = {value!r} is not a valid {k}", where=where,
                          fix=self.doc or f"pass a {k}")
        if self.choices is not None and value not in self.choices:
            raise IRError(f"attribute {self.name!r} = {value!r} is not one of {self.choices}",
                          where=where, fix=f"choose one of {self.choices}")
        return value


@dataclass(frozen=True)
class IndexInput:
    """Operand ``input`` holds indices into axis ``axis`` of operand ``data`` (the axis is read from
    attribute ``axis_attr`` when set, else ``axis`` is used as is).

    Every index operand follows ONNX's rule: an index ``i`` along an axis of size ``n`` is valid in
    ``[-n, n - 1]``; a negative one counts from the end once (``i + n``); anything else is an error.
    The core checks such operands on the host (:mod:`rlx_core.ir.indices`): at compile time when
    they are constants, before every run when they are graph inputs; a kernel must still never
    read or write outside its buffers for indices computed on the device.
    """

    input: int
    data: int = 0
    axis_attr: str | None = "axis"
    axis: int = 0


InferFn = Callable[[Sequence[TensorType], Attrs], Sequence[TensorType]]
ReferenceFn = Callable[[Sequence[Any], Attrs], Sequence[Any]]
CostFn = Callable[[Sequence[TensorType], Sequence[TensorType], Attrs], float]


def _default_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    return float(sum(t.numel() for t in outs))


@dataclass(frozen=True)
class OpSchema:
    """Everything the core knows about one op.

    ``inputs`` names the operands; a name ending in ``*`` is variadic (one or more). ``reference``
    computes in float64 (complex128 for complex; integers exactly) and is the oracle for every
    backend. ``decompose`` (HIR ops, and MIR ops with a portable expansion) builds the op from
    simpler ones with a :class:`~rlx_core.ir.builder.GraphBuilder`.
    """

    name: str
    inputs: tuple[str, ...]
    infer: InferFn
    reference: ReferenceFn
    attrs: tuple[AttrSpec, ...] = ()
    level: str = "mir"
    category: str = "other"
    doc: str = ""
    dtypes: tuple[DType, ...] = ALL_DTYPES
    num_outputs: int = 1
    elementwise: bool = False
    flops: CostFn = _default_flops
    decompose: Callable[..., Any] | None = None
    provider: str = "rlx-core"
    differentiable: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: Operands holding indices (ONNX range rules, checked on the host): see :class:`IndexInput`.
    index_inputs: tuple[IndexInput, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.replace(".", "_").isidentifier():
            raise IRError(f"op name {self.name!r} is not an identifier",
                          fix="use lower_snake_case; plugins may prefix with 'vendor.'")
        if self.level not in ("mir", "hir"):
            raise IRError(f"op {self.name!r} has level {self.level!r}", fix="level is 'mir' or 'hir'")
        if self.level == "hir" and self.decompose is None:
            raise IRError(f"HIR op {self.name!r} has no decomposition into MIR",
                          fix="every HIR op must provide decompose=...")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "attrs", tuple(self.attrs))

    @property
    def variadic(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].endswith("*")

    def attr_spec(self, name: str) -> AttrSpec | None:
        for a in self.attrs:
            if a.name == name:
                return a
        return None

    def check_arity(self, n: int, where: str) -> None:
        fixed = len(self.inputs) - (1 if self.variadic else 0)
        ok = n >= max(fixed, 1 if self.variadic else 0) if self.variadic else n == fixed
        if not ok:
            want = f"at least {max(fixed, 1)}" if self.variadic else str(fixed)
            raise IRError(f"op {self.name!r} takes {want} inputs ({', '.join(self.inputs)}), got {n}",
                          where=where, fix="pass the operands listed in the op's schema")

    def check_attrs(self, attrs: Mapping[str, Any], where: str) -> Attrs:
        known = {a.name for a in self.attrs}
        unknown = [k for k in attrs if k not in known]
        if unknown:
            raise IRError(f"op {self.name!r} has no attribute {unknown[0]!r}", where=where,
                          fix=f"attributes of {self.name}: {sorted(known) or 'none'}")
        out: dict[str, Any] = {}
        for spec in self.attrs:
            if spec.name in attrs:
                out[spec.name] = spec.check(attrs[spec.name], f"{where}, attribute {spec.name!r}")
            elif spec.default is REQUIRED:
                raise IRError(f"op {self.name!r} needs attribute {spec.name!r}", where=where,
                              fix=spec.doc or f"pass {spec.name}=...")
            else:
                out[spec.name] = spec.default
        return Attrs(out)


class OpRegistry:
    def __init__(self) -> None:
        self._ops: dict[str, OpSchema] = {}

    def register(self, schema: OpSchema, *, replace: bool = False) -> OpSchema:
        old = self._ops.get(schema.name)
        if old is not None and not replace and old is not schema:
            if old.provider == schema.provider and old == schema:
                return old
            raise IRError(f"op {schema.name!r} is registered twice: by {old.provider!r} and by "
                          f"{schema.provider!r}",
                          fix="rename one op (plugins should prefix their ops, e.g. 'vendor.op')")
        self._ops[schema.name] = schema
        return schema

    def get(self, name: str, where: str | None = None) -> OpSchema:
        try:
            return self._ops[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._ops, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see `rlx ops` for the op list"
            raise IRError(f"unknown op {name!r}", where=where,
                          fix=f"{hint} Ops from plugins are registered when the plugin is loaded."
                          ) from None

    def __contains__(self, name: str) -> bool:
        return name in self._ops

    def names(self, level: str | None = None) -> list[str]:
        return sorted(n for n, s in self._ops.items() if level is None or s.level == level)

    def schemas(self, level: str | None = None) -> list[OpSchema]:
        return [self._ops[n] for n in self.names(level)]

    def unregister(self, name: str) -> None:
        self._ops.pop(name, None)


#: The process-wide registry. Core MIR/HIR ops are registered on import of ``rlx_core.ir``.
REGISTRY = OpRegistry()


def register_op(schema: OpSchema, *, replace: bool = False) -> OpSchema:
    return REGISTRY.register(schema, replace=replace)


def get_op(name: str, where: str | None = None) -> OpSchema:
    return REGISTRY.get(name, where)
