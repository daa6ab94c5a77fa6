"""One home per op (issue 15): an op's facts live on its schema, and the passes read them there.

A new elementwise op declared with one ``OpSchema`` must be fusible, renderable in every dialect,
differentiable, autocast by its class and covered by the conformance generator, with no other
core file naming it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from rlx_conformance.cases import cases_for, tolerance

from rlx_core.amp import autocast
from rlx_core.autodiff import get_jvp, get_vjp
from rlx_core.codegen import render_program
from rlx_core.dtypes import FLOAT_DTYPES, DType
from rlx_core.errors import IRError
from rlx_core.fusion import FUSIBLE, encode, is_fusible
from rlx_core.ir import REGISTRY, GraphBuilder, OpSchema, TensorType, register_op
from rlx_core.ir.schema import CaseSpec
from rlx_core.ir.types import Attrs

OP = "test_homes.cube"


def _infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    return [ts[0]]


def _vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g = cts[0]
    return [None if g is None else g * (ins[0] * ins[0] * b.const(3.0, ins[0].dtype))]


@pytest.fixture
def cube() -> Iterator[OpSchema]:
    schema = register_op(OpSchema(
        OP, ("x",), _infer, lambda xs, a: [xs[0] ** 3], category="elementwise", elementwise=True,
        dtypes=FLOAT_DTYPES, provider="tests", fusion="elementwise", expr="({a} * {a} * {a})",
        vjp=_vjp, amp="f32", cases=CaseSpec("unary", ("positive",)), accuracy="exact"))
    try:
        yield schema
    finally:
        REGISTRY.unregister(OP)


def test_a_new_elementwise_op_is_one_declaration(cube: OpSchema) -> None:
    assert is_fusible(OP) and OP not in FUSIBLE  # FUSIBLE is the import-time snapshot
    program = encode([(OP, ["i0"], {}), ("exp", ["t0"], {})], "t1")
    for name in ("c", "cuda", "metal", "wgsl", "numba"):
        lines, _, _ = render_program(program, ["x"], [DType.F32], name)
        assert "(x * x * x)" in lines[0], (name, lines)
    assert get_vjp(OP) is _vjp and get_jvp(OP) is None
    ids = {c.id.split("-", 1)[1] for c in cases_for(OP, "f32")}
    assert {"basic", "scalar", "size0", "noncontiguous", "nan_inf", "large"} <= ids
    assert all((c.inputs[0][1] > 0).all() for c in cases_for(OP, "f32") if c.kind == "basic")
    assert tolerance("f32", OP) == (0.0, 0.0)
    g = GraphBuilder("amp")
    x = g.input("x", "f32", (2,))
    g.output(g.op(OP, g.op("matmul", x, g.param("w", np.ones((2, 2), np.float32)))))
    cast = autocast(g.build(), "bf16", params=["w"])
    op_in = next(n for n in cast.nodes if n.op == OP).inputs[0]
    assert cast.types[op_in].dtype is DType.F32  # amp="f32": runs in f32 after a bf16 matmul


def test_core_elementwise_ops_carry_all_their_facts() -> None:
    for schema in REGISTRY.schemas("mir"):
        if schema.fusion != "elementwise":
            continue
        assert schema.expr is not None and schema.cases is not None, schema.name
        assert get_vjp(schema.name) is not None and get_jvp(schema.name) is not None, schema.name


def test_core_reductions_carry_all_their_facts() -> None:
    from rlx_conformance.cases import ACCUMULATING_OPS

    from rlx_core.autodiff import get_batch_rule

    reductions = [s for s in REGISTRY.schemas("mir") if s.category == "reduction"]
    assert {s.name for s in reductions} >= {"reduce_sum", "reduce_max", "argmax"}
    for schema in reductions:
        assert schema.cases is not None and schema.cases.family in ("reduction", "arg"), schema.name
        assert schema.vjp is not None and schema.jvp is not None and schema.batch is not None, schema.name
        assert get_vjp(schema.name) is schema.vjp and get_batch_rule(schema.name) is schema.batch
        assert (schema.name in ACCUMULATING_OPS) == schema.accumulates, schema.name


@pytest.mark.parametrize("op", ["reshape", "transpose", "expand", "slice", "concat", "pad"])
def test_core_movement_ops_carry_all_their_facts(op: str) -> None:
    from rlx_core.autodiff import get_batch_rule

    schema = REGISTRY.get(op)
    assert schema.cases is not None and schema.accuracy == "exact" and tolerance("f16", op) == (0.0, 0.0)
    assert get_vjp(op) is schema.vjp is not None and get_jvp(op) is schema.jvp is not None
    assert get_batch_rule(op) is schema.batch is not None
    assert cases_for(op, "f32")


def test_a_new_reduction_is_one_declaration() -> None:
    """A plugin reduction declared with the reduction case family and ``accumulates`` gets the
    reduction suite and the summation tolerance."""
    from rlx_conformance.cases import accumulation

    base = REGISTRY.get("reduce_sum")
    schema = register_op(OpSchema("test_homes.sum", base.inputs, base.infer, base.reference,
                                  attrs=base.attrs, category="reduction", dtypes=FLOAT_DTYPES,
                                  provider="tests", cases=CaseSpec("reduction", ("unit",)),
                                  accumulates=True))
    try:
        cases = {c.id.split("-", 1)[1]: c for c in cases_for(schema, "f32")}
        assert {"all", "axis_neg", "size0_reduced", "nan_inf"} <= set(cases)
        assert accumulation(cases["all"])[0] == 24
        assert tolerance("f32", schema.name, k=24) != tolerance("f32", schema.name)
    finally:
        REGISTRY.unregister(schema.name)


@pytest.mark.parametrize("kwargs, fix", [
    ({"fusion": "elementwise"}, "expr"),
    ({"amp": "half"}, "amp"),
    ({"fusion": "fused"}, "fusion"),
    ({"accuracy": "close"}, "accuracy"),
])
def test_bad_op_attributes_are_refused(kwargs: dict[str, Any], fix: str) -> None:
    with pytest.raises(IRError, match=fix):
        OpSchema("test_homes.bad", ("x",), _infer, lambda xs, a: [xs[0]], **kwargs)


def test_unknown_case_domain_is_refused() -> None:
    with pytest.raises(IRError, match="domain"):
        CaseSpec("unary", ("negative",))
