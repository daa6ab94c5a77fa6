"""rlx-cpu against the float64 reference: every MIR op x every dtype it accepts x every generated case.

The cases come from :mod:`rlx_conformance.cases` (the generator the conformance suite builds on); this
file also tests that generator and comparator themselves, so a bug there cannot silently turn the
op tests into no-ops.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from rlx_conformance.cases import (
    EXACT_OPS,
    KINDS,
    OpCase,
    all_cases,
    build_case_graph,
    cases_for,
    compare,
    run_case,
    tolerance,
)

from rlx_core.dtypes import ALL_DTYPES, DType
from rlx_core.errors import DispatchError
from rlx_core.ir import REGISTRY, AttrSpec, OpSchema, TensorType, register_op
from rlx_core.ir.mir import MIR_OPS
from rlx_core.runtime import Session

CASES = all_cases()


@pytest.fixture(scope="module")
def session() -> Session:
    # No disk cache: every case is compiled fresh, so the test exercises dispatch and lowering.
    return Session("cpu", use_cache=False)


# ---------------------------------------------------------------------------------------------
# The op matrix

@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_case(case: OpCase, session: Session) -> None:
    r = run_case(case, session)
    assert r.status == "passed", f"{r.case_id} (kind {r.kind}, path {r.path or '-'}): {r.message}"


def test_matrix_covers_every_mir_op_and_dtype() -> None:
    covered = {(c.op, c.dtype) for c in CASES}
    missing = [f"{op}[{dt}]" for op in MIR_OPS for dt in REGISTRY.get(op).dtypes if (op, dt) not in covered]
    assert not missing, f"no generated cases for {missing}"
    assert MIR_OPS and set(MIR_OPS) <= set(REGISTRY.names("mir"))  # no op count pinned: ops come and go


@pytest.mark.parametrize("op", MIR_OPS)
def test_every_dtype_resolves_on_cpu(op: str, session: Session) -> None:
    """Each op x dtype (and for cast each target) has a legal path on cpu: no DispatchError."""
    failures = []
    for dt in REGISTRY.get(op).dtypes:
        cases = cases_for(op, dt)
        # One case per distinct attribute set covers cast's targets without planning every case.
        seen: set[str] = set()
        for case in cases:
            key = repr(sorted(case.attrs.items()))
            if key in seen or case.kind not in ("basic", "scalar"):
                continue
            seen.add(key)
            try:
                session.plan(build_case_graph(case))
            except DispatchError as e:
                failures.append(f"{case.id}: {e.what}")
    assert not failures, "\n".join(failures)


def _paths(op: str, dtype: DType, session: Session) -> tuple[str, str, tuple[str, ...]]:
    case = cases_for(op, dtype)[0]
    report = session.plan(build_case_graph(case))
    (entry,) = report.entries
    return entry.path, entry.via, entry.kernels


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16])
@pytest.mark.parametrize("op", ["add", "exp", "reduce_sum", "matmul", "conv2d", "cumsum"])
def test_half_arithmetic_is_rewritten_to_f32(op: str, dtype: DType, session: Session) -> None:
    # rlx-cpu never accumulates in half precision: arithmetic goes through compute_f16_in_f32.
    path, via, kernels = _paths(op, dtype, session)
    assert path == "rewritten"
    assert via == "compute_f16_in_f32"
    assert kernels[0] == "cpu.cast" and kernels[-1] == "cpu.cast" and f"cpu.{op}" in kernels


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16])
@pytest.mark.parametrize("op", ["transpose", "reshape", "slice", "gather", "where", "maximum", "neg"])
def test_half_exact_ops_are_native(op: str, dtype: DType, session: Session) -> None:
    path, _, kernels = _paths(op, dtype, session)
    assert path == "native"
    assert kernels == (f"cpu.{op}",)


def test_narrow_int_ops_run_native(session: Session) -> None:
    assert _paths("add", DType.I8, session)[0] == "native"
    assert _paths("div", DType.I8, session)[2] == ("cpu.div_int",)


# ---------------------------------------------------------------------------------------------
# The generator

def test_case_ids_are_unique_and_kinds_known() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert {c.kind for c in CASES} == set(KINDS)
    for c in CASES:
        assert c.id.startswith(f"{c.op}[{c.dtype}]-")


def test_generation_is_deterministic_and_seeded() -> None:
    a, b = cases_for("add", "f32"), cases_for("add", "f32")
    assert [c.id for c in a] == [c.id for c in b]
    for ca, cb in zip(a, b):
        for (na, xa), (nb, xb) in zip(ca.inputs, cb.inputs):
            assert na == nb
            np.testing.assert_array_equal(xa, xb)
    other = cases_for("add", "f32", rng_seed=1)
    assert not np.array_equal(a[0].inputs[0][1], other[0].inputs[0][1])


def test_inputs_match_the_case_dtype_and_domain() -> None:
    for c in cases_for("log", "f32") + cases_for("sqrt", "f16") + cases_for("rsqrt", "bf16"):
        x = c.feed()["x"].astype(np.float64)
        if c.kind not in ("nan_inf",):
            assert (x > 0).all(), c.id
    for c in cases_for("div", "i16") + cases_for("div", "f32"):
        b = c.feed()["b"].astype(np.float64)
        if c.kind != "nan_inf":
            assert (b != 0).all(), c.id
    for c in cases_for("where", "f16"):
        assert c.feed()["cond"].dtype == np.bool_
        assert c.feed()["a"].dtype == np.float16
    for c in cases_for("gather", "bf16"):
        assert c.feed()["indices"].dtype in (np.int32, np.int64)
    assert {c.attrs["to"] for c in cases_for("cast", "i8")} == set(ALL_DTYPES)
    assert cases_for("iota", "f16")[0].inputs == ()


def test_special_kinds_are_what_they_say() -> None:
    nan_inf = [c for c in cases_for("add", "f32") if c.kind == "nan_inf"]
    assert nan_inf and any(np.isnan(x).any() and np.isinf(x).any() for _, x in nan_inf[0].inputs)
    overflow = [c for c in cases_for("mul", "i8") if c.kind == "overflow"]
    assert overflow and any((x == -128).any() or (x == 127).any() for _, x in overflow[0].inputs)
    large = [c for c in cases_for("exp", "f16") if c.kind == "large"]
    assert large and np.abs(large[0].feed()["x"].astype(np.float64)).max() >= 5e3
    neg = [c for c in cases_for("gather", "f32") if c.kind == "negative_index"]
    assert neg and (neg[0].feed()["indices"] < 0).any()
    for c in CASES:
        if c.kind == "noncontiguous":
            assert any(not x.flags.c_contiguous for _, x in c.inputs), c.id
        if c.kind == "size0":
            types = build_case_graph(c).types  # "node", or "node:i" for a multi-output op
            assert any(x.size == 0 for _, x in c.inputs) or any(
                0 in t.shape for k, t in types.items() if k == "node" or k.startswith("node:")), c.id


def test_cases_only_for_schema_dtypes() -> None:
    assert cases_for("exp", "i32") == []
    assert cases_for("logical_and", "f32") == []
    assert all(c.dtype is DType.BOOL for c in cases_for("logical_not", "bool"))


@pytest.fixture()
def plugin_op() -> Iterator[OpSchema]:
    """A plugin-style op unknown to the generator (and to rlx-cpu), removed afterwards."""
    def infer(ts: Any, attrs: Mapping[str, Any]) -> list[TensorType]:
        return [ts[0]]

    def ref(xs: Any, attrs: Mapping[str, Any]) -> list[np.ndarray]:
        return [xs[0] * attrs["factor"]]

    schema = register_op(OpSchema("testvendor.scale", ("x",), infer, ref, provider="testvendor",
                                  attrs=(AttrSpec("factor", "float", default=2.0),),
                                  category="elementwise", dtypes=(DType.F32, DType.I32)))
    yield schema
    REGISTRY.unregister(schema.name)


def test_generic_cases_for_plugin_ops(plugin_op: OpSchema, session: Session) -> None:
    cases = cases_for(plugin_op, "f32")
    assert any(c.id == "testvendor.scale[f32]-generic" for c in cases)
    assert any(c.kind == "nan_inf" for c in cases)  # elementwise schema: the elementwise suite
    assert cases_for(plugin_op, "f64") == []
    # rlx-cpu has no kernel for it: run_case reports the dispatch failure as an error.
    r = run_case(cases[0], session)
    assert r.status == "error" and "DispatchError" in r.message and r.path == ""


class _FakeExe:
    """A 'backend' returning fixed results, to check that run_case notices wrong answers."""

    def __init__(self, out: Mapping[str, np.ndarray]) -> None:
        self.out = out
        self.report = None

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(self.out)


class _FakeSession:
    def __init__(self, out: Mapping[str, np.ndarray]) -> None:
        self.out = out

    def compile(self, graph: Any) -> _FakeExe:
        return _FakeExe(self.out)


def test_run_case_fails_wrong_results() -> None:
    case = cases_for("exp", "f32")[0]
    x = case.feed()["x"]
    good = run_case(case, _FakeSession({"node": np.exp(x)}))
    assert good.status == "passed", good.message
    bad = run_case(case, _FakeSession({"node": np.exp(x) * np.float32(1.001)}))
    assert bad.status == "failed" and "exceed tolerance" in bad.message
    missing = run_case(case, _FakeSession({}))
    assert missing.status == "failed" and "missing" in missing.message


# ---------------------------------------------------------------------------------------------
# The comparator

def test_compare_accepts_equal_and_within_tolerance() -> None:
    want = np.array([1.0, -2.0, 0.0, math.nan, math.inf, -math.inf])
    assert compare(want.astype(np.float32), want, DType.F32, "exp") is None
    near = (want * (1 + 2e-7)).astype(np.float32)
    assert compare(near, want, DType.F32, "exp") is None
    assert compare(np.zeros((0, 3), np.float16), np.zeros((0, 3)), DType.F16, "add") is None


def test_compare_catches_wrong_value() -> None:
    want = np.array([[1.0, 2.0], [3.0, 4.0]])
    got = want.astype(np.float32)
    got[1, 0] = 3.001
    msg = compare(got, want, DType.F32, "add")
    assert msg is not None and "[1, 0]" in msg and "max abs err" in msg and "max rel err" in msg


def test_compare_catches_wrong_shape_and_dtype() -> None:
    want = np.ones((2, 3))
    assert "shape" in (compare(np.ones((3, 2), np.float32), want, DType.F32, "add") or "")
    assert "shape" in (compare(np.ones((6,), np.float32), want, DType.F32, "reshape") or "")
    assert "dtype" in (compare(np.ones((2, 3), np.float64), want, DType.F32, "add") or "")
    assert "dtype" in (compare(np.ones((2, 3), np.int32), want.astype(np.int64), DType.I64, "add") or "")
    assert compare([1.0], np.ones(1), DType.F64, "add") is not None


def test_compare_nan_and_inf_must_match_exactly() -> None:
    want = np.array([1.0, math.nan, math.inf])
    assert "NaN" in (compare(np.array([1.0, 0.0, math.inf], np.float32), want, DType.F32, "add") or "")
    assert "NaN" in (compare(np.array([math.nan, math.nan, math.inf], np.float32), want, DType.F32, "add")
                     or "")
    assert "Inf" in (compare(np.array([1.0, math.nan, -math.inf], np.float32), want, DType.F32, "add")
                     or "")
    assert "Inf" in (compare(np.array([1.0, math.nan, 3e38], np.float32), want, DType.F32, "add") or "")
    # Complex: NaN/Inf are checked per component.
    cw = np.array([1 + 1j, complex(math.inf, 0.0)])
    assert "imaginary" in (compare(np.array([1 + 1j, complex(math.inf, math.nan)], np.complex64), cw,
                                   DType.C64, "mul") or "")


def test_compare_integers_and_bools_are_exact() -> None:
    want = np.array([1, -128, 127], np.int64)
    assert compare(want.astype(np.int8), want.astype(np.int8), DType.I8, "add") is None
    msg = compare(np.array([1, -128, 126], np.int8), want.astype(np.int8), DType.I8, "add")
    assert msg is not None and "[2]" in msg
    assert compare(np.array([True, False]), np.array([True, True]), DType.BOOL, "less") is not None


def test_tolerance_is_exact_for_ints_bools_and_exact_ops() -> None:
    for dt in (DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.BOOL):
        for op in ("add", "matmul", "reduce_sum", "exp", "cast"):
            assert tolerance(dt, op) == (0.0, 0.0)
    for op in EXACT_OPS:
        assert tolerance(DType.F16, op) == (0.0, 0.0)
    assert tolerance(DType.F32, "abs", src=DType.C64) != (0.0, 0.0)


def test_tolerance_follows_dtype_eps_and_accumulation() -> None:
    r16, a16 = tolerance(DType.F16, "add")
    assert r16 == pytest.approx(2e-3, rel=0.05) and a16 == pytest.approx(1e-3, rel=0.05)
    rb, ab = tolerance(DType.BF16, "add")
    assert rb == pytest.approx(1.6e-2, rel=0.05) and ab == pytest.approx(7.8e-3, rel=0.05)
    r32, _ = tolerance(DType.F32, "add")
    r64, _ = tolerance(DType.F64, "add")
    assert r64 < r32 < r16 < rb
    assert tolerance(DType.F32, "exp")[0] > r32  # library functions get a few ulps more
    small, big = tolerance(DType.F32, "reduce_sum", k=4), tolerance(DType.F32, "reduce_sum", k=400)
    assert big[0] > small[0] and big[1] > small[1]
    assert tolerance(DType.F32, "matmul", k=8, scale=100.0)[1] == pytest.approx(
        100 * tolerance(DType.F32, "matmul", k=8)[1])
