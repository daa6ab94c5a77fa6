"""The shared renderer's dialect hooks (``idiv``, ``rule``, a :class:`Dialect` passed to
``render_program``) and the backend dialects built from them instead of patching rendered text."""

from __future__ import annotations

import dataclasses

import pytest

from rlx_core.codegen import DIALECTS, Dialect, render_program
from rlx_core.dtypes import DType
from rlx_core.errors import IRError
from rlx_core.fusion import encode

DIV = encode([("div", ["i0", "i1"], {})], "t0")


def test_hooks_default_to_the_shared_rules():
    for d in DIALECTS.values():
        assert d.idiv is None and d.rule is None
    lines, _, _ = render_program(DIV, ["a", "b"], [DType.I32, DType.I32], "c")
    assert lines == ["int t0 = (a / b);"]


def test_idiv_applies_to_integer_results_only():
    d = dataclasses.replace(DIALECTS["c"], idiv="my_div({a}, {b})")
    assert isinstance(d, Dialect)
    assert render_program(DIV, ["a", "b"], [DType.I64, DType.I64], d)[0] == ["long long t0 = my_div(a, b);"]
    assert render_program(DIV, ["a", "b"], [DType.F32, DType.F32], d)[0] == ["float t0 = (a / b);"]


def test_rule_overrides_or_falls_through():
    def rule(op, args, in_types, out, attrs):
        if op == "neg":
            return f"NEG({args[0]})"
        if op == "sqrt":
            raise IRError("no sqrt here")
        return None

    d = dataclasses.replace(DIALECTS["c"], rule=rule)
    prog = encode([("neg", ["i0"], {}), ("exp", ["t0"], {})], "t1")
    assert render_program(prog, ["x"], [DType.F32], d)[0] == ["float t0 = NEG(x);", "float t1 = expf(t0);"]
    with pytest.raises(IRError, match="no sqrt"):
        render_program(encode([("sqrt", ["i0"], {})], "t0"), ["x"], [DType.F32], d)


def test_vulkan_dialect_renders_its_helpers():
    glsl = pytest.importorskip("rlx_vulkan.glsl")
    assert render_program(DIV, ["x0", "x1"], [DType.I32] * 2, glsl.GLSL)[0] == ["int t0 = rlx_idiv(x0, x1);"]
    prog = encode([("sigmoid", ["i0"], {}), ("sin", ["t0"], {}), ("pow", ["t1", "i0"], {})], "t2")
    assert render_program(prog, ["x0"], [DType.F32], glsl.GLSL)[0] == [
        "float t0 = (1.0 / (1.0 + rlx_exp(-x0)));", "float t1 = rlx_sin(t0);", "float t2 = rlx_pow(t1, x0);"]
    cast = encode([("cast", ["i0"], {"to": DType.BOOL})], "t0")
    assert render_program(cast, ["x0"], [DType.BOOL], glsl.GLSL)[0] == ["bool t0 = x0;"]
    assert glsl.GLSL.literal(float("-inf"), DType.F32) == "-rlx_inf()"
    with pytest.raises(IRError, match="i64 result"):
        render_program(DIV, ["x0", "x1"], [DType.I64] * 2, glsl.GLSL64)


def test_cuda_dialect_integer_division():
    codegen = pytest.importorskip("rlx_cuda.codegen")
    lines = render_program(DIV, ["a", "b"], [DType.I8] * 2, codegen.CUDA)[0]
    assert lines == ["signed char t0 = rlx_idiv(a, b);"]
    assert render_program(DIV, ["a", "b"], [DType.F32] * 2, codegen.CUDA)[0] == ["float t0 = (a / b);"]
