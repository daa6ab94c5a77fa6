"""Registries of differentiation and batching rules, one entry per op name.

Rules build graph fragments with a :class:`~rlx_core.ir.builder.GraphBuilder`; they never compute
numbers. An op may also carry its rules on its schema (``OpSchema.vjp``/``jvp``/``batch``, as the
core's elementwise ops and reductions do); :func:`get_vjp`/:func:`get_jvp`/:func:`get_batch_rule`
see both, a registered rule first.
A plugin that adds an op (``rlx_ops`` hook) makes it differentiable with
:func:`register_vjp` (reverse mode), :func:`register_jvp` (forward mode) and batchable with
:func:`register_batch_rule`. Ops without a rule are handled through their decomposition when they
have one; forward mode can also transpose a reverse rule (see :mod:`.transforms`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import IRError
from ..ir.builder import GraphBuilder, Tensor
from ..ir.schema import REGISTRY
from ..ir.types import Attrs

#: ``rule(b, inputs, outputs, cotangents, attrs) -> [input cotangent | None, ...]`` (one per input;
#: ``None`` means no gradient: integer inputs, or a gradient that is identically zero).
VjpRule = Callable[[GraphBuilder, Sequence[Tensor], Sequence[Tensor], Sequence["Tensor | None"], Attrs],
                   Sequence["Tensor | None"]]
#: ``rule(b, inputs, outputs, tangents, attrs) -> [output tangent | None, ...]`` (one per output;
#: an input tangent is ``None`` when that input is constant with respect to the differentiation).
JvpRule = Callable[[GraphBuilder, Sequence[Tensor], Sequence[Tensor], Sequence["Tensor | None"], Attrs],
                   Sequence["Tensor | None"]]
#: ``rule(b, inputs, batched, attrs, axis_size) -> (outputs, out_batched)`` or ``None`` to decline
#: (the transform then falls back to the decomposition, or unrolls a static batch). Batched inputs
#: carry the batch as a new leading axis 0.
BatchRule = Callable[[GraphBuilder, Sequence[Tensor], Sequence[bool], Attrs, Any],
                     "tuple[Sequence[Tensor], Sequence[bool]] | None"]

VJP_RULES: dict[str, VjpRule] = {}
JVP_RULES: dict[str, JvpRule] = {}
BATCH_RULES: dict[str, BatchRule] = {}


def _register(table: dict[str, Any], kind: str, op: str, rule: Any, replace: bool) -> Any:
    def put(fn: Any) -> Any:
        if not replace and op in table and table[op] is not fn:
            raise IRError(f"op {op!r} already has a {kind} rule ({table[op].__module__}."
                          f"{getattr(table[op], '__qualname__', table[op])})",
                          fix=f"pass replace=True to override the {kind} rule of {op!r}")
        table[op] = fn
        return fn

    return put if rule is None else put(rule)


def register_vjp(op: str, rule: VjpRule | None = None, *, replace: bool = False) -> Any:
    """Register the reverse-mode rule of ``op`` (usable as a decorator: ``@register_vjp("my.op")``)."""
    return _register(VJP_RULES, "vjp", op, rule, replace)


def register_jvp(op: str, rule: JvpRule | None = None, *, replace: bool = False) -> Any:
    """Register the forward-mode rule of ``op`` (usable as a decorator)."""
    return _register(JVP_RULES, "jvp", op, rule, replace)


def register_batch_rule(op: str, rule: BatchRule | None = None, *, replace: bool = False) -> Any:
    """Register the ``vmap`` rule of ``op`` (usable as a decorator)."""
    return _register(BATCH_RULES, "batching", op, rule, replace)


def _schema_rule(op: str, kind: str) -> Any:
    # Ops declared with their rules on the schema (OpSchema.vjp/jvp) need no registration here.
    return getattr(REGISTRY.get(op), kind) if op in REGISTRY else None


def get_vjp(op: str) -> VjpRule | None:
    """The reverse-mode rule of ``op``: a registered one, else the one on its schema, else None."""
    return VJP_RULES.get(op) or _schema_rule(op, "vjp")


def get_jvp(op: str) -> JvpRule | None:
    """The forward-mode rule of ``op``: a registered one, else the one on its schema, else None."""
    return JVP_RULES.get(op) or _schema_rule(op, "jvp")


def get_batch_rule(op: str) -> BatchRule | None:
    """The ``vmap`` rule of ``op``: a registered one, else the one on its schema, else None."""
    return BATCH_RULES.get(op) or _schema_rule(op, "batch")
