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
from ..errors import IRError, ShapeError
from . import symexpr
from .types import Attrs, TensorType, freeze_attr


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

ATTR_KINDS = ("int", "float", "bool", "str", "ints", "floats", "dtype", "shape", "any")



def _dim_expr(v: str) -> Any:
    """A symbol or dimension expression in canonical form, or None when ``v`` is not one."""
    try:
        return symexpr.canonical(v)
    except ShapeError:
        return None

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
                or (isinstance(v, str) and _dim_expr(v) is not None) for v in value)
            if ok:  # canonical expressions, so equal shapes are equal attributes (hashing, caching)
                value = tuple(_dim_expr(v) if isinstance(v, str) else v for v in value)
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
#: ``expr(dialect, args, in_dtypes, out_dtype, attrs) -> str``: the op as one C-style expression of
#: its argument expressions in a :class:`rlx_core.codegen.render.Dialect`; it may raise
#: :class:`~rlx_core.errors.IRError` to refuse a dtype the dialect cannot compute.
ExprFn = Callable[[Any, Sequence[str], Sequence[DType], DType, Mapping[str, Any]], str]
#: Autodiff rules, as :data:`rlx_core.autodiff.registry.VjpRule` / ``JvpRule`` (typed loosely here
#: so the IR does not import the builder).
GradFn = Callable[..., Sequence[Any]]
#: A ``vmap`` rule, as :data:`rlx_core.autodiff.registry.BatchRule`: ``rule(b, inputs, batched,
#: attrs, axis_size) -> (outputs, out_batched)`` or ``None`` to decline.
BatchFn = Callable[..., Any]

AMP_CLASSES = ("low", "f32")
FUSION_CLASSES = ("elementwise", "reduction")
ACCURACY_CLASSES = ("exact", "library")
#: Value domains the conformance generator knows (``rlx_conformance.cases``, which reads this).
CASE_DOMAINS = ("default", "positive", "nonzero", "halves", "ties", "bool", "unit")


@dataclass(frozen=True)
class CaseSpec:
    """How the conformance generator (``rlx_conformance.cases.cases_for``) feeds an op.

    ``family`` picks the generator: ``"unary"`` / ``"binary"`` (the elementwise suites: shapes,
    broadcasting, scalars, size 0/1, non-contiguous, NaN/Inf, large values), ``"reduction"``
    (``axes``/``keepdims`` reductions), ``"arg"`` (``axis``/``keepdims`` index reductions) or the
    name of a dedicated generator in ``rlx_conformance.cases.GENERATORS``. ``domains`` gives one
    value domain per operand (one of :data:`CASE_DOMAINS`; values outside an op's domain give NaN,
    which tests little). ``overflow`` adds integer cases at the type's extremes (``neg``/``abs`` of INT_MIN).
    """

    family: str
    domains: tuple[str, ...] = ()
    overflow: bool = False

    def __post_init__(self) -> None:
        bad = [d for d in self.domains if d not in CASE_DOMAINS]
        if bad:
            raise IRError(f"case domain {bad[0]!r} is unknown", fix=f"use one of {CASE_DOMAINS}")

    def domain(self, i: int) -> str:
        return self.domains[i] if i < len(self.domains) else "default"


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
    # Per-op facts the passes read from here rather than from op-name tables of their own (issue
    # 15, "one home per op"; TVM's op attributes are the model). ``flops`` above is the cost hint.
    #: :func:`rlx_core.amp.autocast` class: ``"low"`` runs in the compute dtype (the matrix-product
    #: class), ``"f32"`` always in f32 (range or accumulation sensitive), ``None`` at the widest
    #: float dtype of the operands.
    amp: str | None = None
    #: ``"elementwise"``: may join a ``fused_elementwise`` program (needs ``expr``);
    #: ``"reduction"``; ``None``: opaque to fusion.
    fusion: str | None = None
    #: C-style expression per dialect, for fused kernels: an :data:`ExprFn`, or a template such as
    #: ``"({a} + {b})"`` (operands ``{a}``, ``{b}``, ``{c}``) written the same in every dialect.
    expr: ExprFn | str | None = None
    #: Reverse- and forward-mode rules (``rlx_core.autodiff`` falls back to these when no rule was
    #: registered for the op with ``register_vjp``/``register_jvp``).
    vjp: GradFn | None = None
    jvp: GradFn | None = None
    #: ``vmap`` rule (``rlx_core.autodiff`` falls back to it when none was registered with
    #: ``register_batch_rule``).
    batch: BatchFn | None = None
    #: How the conformance suite generates cases for the op (core ops; ``None``: by op name).
    cases: CaseSpec | None = None
    #: The op sums (or multiplies) ``k`` terms per output element: its conformance tolerance adds
    #: the summation error bound for ``k`` terms.
    accumulates: bool = False
    #: Tolerance class: ``"exact"`` (results are input values or exactly representable),
    #: ``"library"`` (a libm-style function, a few ulps), ``None`` (correctly rounded).
    accuracy: str | None = None

    def __post_init__(self) -> None:
        if not self.name.replace(".", "_").isidentifier():
            raise IRError(f"op name {self.name!r} is not an identifier",
                          fix="use lower_snake_case; plugins may prefix with 'vendor.'")
        if self.level not in ("mir", "hir"):
            raise IRError(f"op {self.name!r} has level {self.level!r}", fix="level is 'mir' or 'hir'")
        if self.level == "hir" and self.decompose is None:
            raise IRError(f"HIR op {self.name!r} has no decomposition into MIR",
                          fix="every HIR op must provide decompose=...")
        if len(set(self.dtypes)) != len(tuple(self.dtypes)):
            # each dtype would get its conformance cases twice, under the same check ids
            names = [getattr(d, "value", d) for d in self.dtypes]
            raise IRError(f"op {self.name!r} lists a dtype twice: {names}",
                          fix="list each accepted dtype once")
        for field_name, value, allowed in (("amp", self.amp, AMP_CLASSES),
                                           ("fusion", self.fusion, FUSION_CLASSES),
                                           ("accuracy", self.accuracy, ACCURACY_CLASSES)):
            if value is not None and value not in allowed:
                raise IRError(f"op {self.name!r} has {field_name}={value!r}",
                              fix=f"{field_name} is None or one of {allowed}")
        if self.fusion == "elementwise" and self.expr is None:
            raise IRError(f"op {self.name!r} is fusible (fusion='elementwise') but has no expr",
                          fix="give expr=... (a C-style template or an ExprFn) so fused kernels "
                              "can render it, or leave fusion=None")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "attrs", tuple(self.attrs))

    def render(self, dialect: Any, args: Sequence[str], in_dtypes: Sequence[DType], out: DType,
               attrs: Mapping[str, Any]) -> str:
        """This op as one expression of ``args`` in ``dialect`` (see :attr:`expr`)."""
        if self.expr is None:
            raise IRError(f"op {self.name!r} has no C-style expression (dialect "
                          f"{getattr(dialect, 'name', dialect)!r})",
                          fix="leave this op out of fused groups for this backend, or give its "
                              "schema expr=...")
        if isinstance(self.expr, str):
            return self.expr.format(**dict(zip("abc", args)))
        return self.expr(dialect, args, in_dtypes, out, attrs)

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
