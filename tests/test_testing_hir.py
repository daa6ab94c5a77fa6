"""HIR op cases and model graph tests from :mod:`rlx_conformance.cases` and :mod:`rlx_conformance.graphs`.

Every HIR op x float dtype gets dedicated cases; they must all pass on rlx-cpu (whose HIR support is
the core decompositions run in storage precision) and, where it compiles, on the whole-program test
backend. The tolerances must also be *discriminating*: wrong semantics (a mask ignored, a window or
scale off, the wrong axis) must fail in every dtype, bf16 included, and the graph tests must notice
a perturbed weight or a wrong reference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from rlx_conformance.cases import (
    EXACT_OPS,
    KINDS,
    OpCase,
    accumulation,
    build_case_graph,
    cases_for,
    hir_cases,
    run_case,
    tolerance,
)
from rlx_conformance.graphs import (
    GRAPH_VARIANTS,
    GRAPHS,
    GraphCase,
    check_graph,
    error_budget,
    graph_cases,
    make_case,
    mlp,
)

from rlx_core.dtypes import FLOAT_DTYPES, DType
from rlx_core.ir import REGISTRY
from rlx_core.ir.graph import Graph
from rlx_core.ir.hir import HIR_OPS, MASK_KINDS
from rlx_core.ir.reference import evaluate
from rlx_core.ir.schema import register_op
from rlx_core.runtime import Session

CASES = hir_cases()
FLOATS = tuple(FLOAT_DTYPES)


@pytest.fixture(scope="module")
def session() -> Session:
    return Session("cpu", use_cache=False)


def _by(op: str, dtype: Any) -> list[OpCase]:
    return [c for c in CASES if c.op == op and c.dtype is DType.parse(dtype)]


# ---------------------------------------------------------------------------------------------
# Coverage of the generator

def test_every_hir_op_and_float_dtype_has_cases() -> None:
    assert {c.op for c in CASES} == set(HIR_OPS)
    for op in HIR_OPS:
        floats = [dt for dt in REGISTRY.get(op).dtypes if dt.is_float]
        assert set(floats) == set(FLOATS), op
        for dt in floats:
            cases = _by(op, dt)
            assert len(cases) >= 3, f"{op}[{dt}] has {len(cases)} cases"
            kinds = {c.kind for c in cases}
            assert {"basic", "size1"} <= kinds, f"{op}[{dt}]: {kinds}"
            if op not in ("embedding",):
                assert "large" in kinds and "nan_inf" in kinds, f"{op}[{dt}]: {kinds}"
    # Embedding cases are per table dtype; its int schema dtypes name the ids.
    assert cases_for("embedding", "i32") == [] and cases_for("embedding", "i64") == []
    id_dtypes = {c.feed()["ids"].dtype for c in _by("embedding", "f16")}
    assert id_dtypes == {np.dtype(np.int32), np.dtype(np.int64)}
    assert {c.kind for c in CASES} <= set(KINDS)
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_attention_cases_cover_masks_ranks_and_shapes(dtype: DType) -> None:
    cases = _by("attention", dtype)
    assert {c.attrs["mask"] for c in cases} == set(MASK_KINDS)
    for kind in MASK_KINDS:
        ranks = {c.feed()["q"].ndim for c in cases if c.attrs["mask"] == kind}
        assert ranks == {3, 4}, f"{kind}: ranks {ranks}"
    assert any(c.feed()["q"].shape[-2] != c.feed()["k"].shape[-2] for c in cases)  # Sq != Sk
    assert any(c.attrs.get("scale") is not None for c in cases)
    assert any(c.attrs.get("window") == 2 for c in cases)
    bias_shapes = {c.feed()["mask"].shape for c in cases if c.attrs["mask"] == "bias"}
    assert {(2, 1, 3, 5), (3, 5)} <= bias_shapes  # (B, 1, Sq, Sk) and (Sq, Sk) broadcasts
    pad = [c.feed()["mask"] for c in cases if c.attrs["mask"] == "padding"]
    assert {m.dtype.kind for m in pad} >= {"b", "i"}
    assert {m.dtype for m in pad} >= {np.dtype(np.int32), np.dtype(np.int64)}
    for kind in "bi":  # bool and int masks with a fully masked row (uniform weights, not NaN)
        assert any((m == 0).all(axis=-1).any() for m in pad if m.dtype.kind == kind), kind
    nan_inf = [c for c in cases if c.kind == "nan_inf"]
    for c in nan_inf:
        bias = c.feed()["mask"].astype(np.float64)
        assert np.isneginf(bias).any() and not np.isneginf(bias).all(axis=-1).any()


def test_special_hir_kinds_are_what_they_say() -> None:
    for op in ("softmax", "log_softmax"):
        for dt in ("f32", "f64"):
            large = [c for c in _by(op, dt) if c.kind == "large"]
            assert any(np.abs(c.feed()["x"].astype(np.float64)).min() >= 900 for c in large)
        for c in (c for c in _by(op, "f32") if c.kind == "nan_inf"):
            x = c.feed()["x"]
            axis = c.attrs["axis"]
            assert np.isneginf(x).any() and not np.isneginf(x).all(axis=axis).any()
        neg = [c for c in _by(op, "f16") if c.kind == "negative_axis"]
        assert {c.attrs["axis"] for c in neg} >= {-2}
    for op in ("layer_norm", "rms_norm"):
        cases = _by(op, "bf16")
        neg2 = [c for c in cases if c.attrs["axis"] == -2]
        assert neg2 and neg2[0].feed()["gamma"].ndim == 2  # normalises two trailing axes
        assert any(c.attrs["axis"] == -1 for c in cases)
    assert {c.feed()["x"].ndim for c in _by("batch_norm", "f16")} >= {2, 4}
    gelu = _by("gelu", "f32")
    assert {c.attrs["approximate"] for c in gelu} == {"none", "tanh"}
    linear = _by("linear", "f64")
    assert any(not c.feed()["b"].any() for c in linear) and any(c.feed()["b"].any() for c in linear)
    conv = [c.attrs for c in _by("conv2d_bias", "f32")]
    assert any(a.get("groups", 1) > 1 for a in conv) and any(a.get("strides") for a in conv)
    assert any(any(a.get("pads", ())) for a in conv)
    avg = [c.attrs for c in _by("avg_pool2d", "f16") if any(c.attrs.get("pads", ()))]
    assert {a["count_include_pad"] for a in avg} == {True, False}
    assert any(a.get("strides") not in (None, a["kernel"]) for a in avg)
    emb = [c for c in _by("embedding", "bf16") if c.kind == "negative_index"]
    assert emb and all((c.feed()["ids"] < 0).any() for c in emb)


def test_hir_generation_is_deterministic() -> None:
    a, b = cases_for("attention", "bf16"), cases_for("attention", "bf16")
    assert [c.id for c in a] == [c.id for c in b]
    for ca, cb in zip(a, b):
        for (_, xa), (_, xb) in zip(ca.inputs, cb.inputs):
            np.testing.assert_array_equal(xa, xb)


# ---------------------------------------------------------------------------------------------
# The cases on rlx-cpu and on the whole-program backend

@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hir_case_on_cpu(case: OpCase, session: Session) -> None:
    r = run_case(case, session)
    assert r.status == "passed", f"{r.case_id} (kind {r.kind}, path {r.path or '-'}): {r.message}"


def test_hir_cases_on_whole_backend() -> None:
    """The test backend claims few ops (f32/f64, no broadcasting): what compiles must pass."""
    whole = Session("whole", use_cache=False)
    passed, skipped, bad = set(), 0, []
    for case in CASES:
        r = run_case(case, whole)
        if r.status == "passed":
            passed.add(case.op)
        elif r.status == "error" and r.message.startswith("DispatchError"):
            skipped += 1
        else:
            bad.append(f"{r.case_id}: {r.status}: {r.message}")
    assert not bad, "\n".join(bad)
    assert {"attention", "linear", "softmax", "relu"} <= passed
    assert skipped > 0


# ---------------------------------------------------------------------------------------------
# Tolerances: principled, and tight enough to find semantic bugs

def test_hir_tolerances() -> None:
    for op in ("relu", "max_pool2d", "embedding"):
        assert op in EXACT_OPS and tolerance("bf16", op) == (0.0, 0.0)
    for op in ("attention", "linear", "layer_norm", "softmax", "gelu", "avg_pool2d", "batch_norm"):
        r16, a16 = tolerance("f16", op, k=8)
        r32, a32 = tolerance("f32", op, k=8)
        rb, ab = tolerance("bf16", op, k=8)
        r64, _ = tolerance("f64", op, k=8)
        assert r64 < r32 < r16 < rb and a32 < a16 < ab, op
        assert tolerance("f32", op, k=8, scale=10.0)[1] == pytest.approx(10 * a32)
    # Reductions grow with k (in compute precision for half types: f32 accumulation).
    assert tolerance("f32", "linear", k=1000)[0] > tolerance("f32", "linear", k=10)[0]
    grow16 = tolerance("f16", "linear", k=1000)[0] - tolerance("f16", "linear", k=10)[0]
    assert grow16 == pytest.approx(990 * 2.0**-23)
    # avg_pool2d's decomposition adds taps in storage precision: k storage ulps.
    assert tolerance("f16", "avg_pool2d", k=9)[0] - tolerance("f16", "avg_pool2d", k=1)[0] == \
        pytest.approx(8 * 2.0**-10)


def test_attention_scale_follows_score_magnitude() -> None:
    case = next(c for c in _by("attention", "f32") if c.id.endswith("-none_rank4"))
    big = next(c for c in _by("attention", "f32") if c.id.endswith("-large"))
    k, scale = accumulation(case)
    assert k == 4 + 5  # head dim + keys
    assert accumulation(big)[1] > 10 * scale
    ln = next(c for c in _by("layer_norm", "f64") if c.id.endswith("-large_offset"))
    assert accumulation(ln)[1] > 100  # |mean| / sigma: the cancellation in x - mean


class _FakeExe:
    def __init__(self, out: Mapping[str, np.ndarray]) -> None:
        self.out, self.report = out, None

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(self.out)


class _WrongSemantics:
    """A 'backend' that runs the reference with changed attributes (or inputs): a semantic bug."""

    def __init__(self, case: OpCase, attrs: Mapping[str, Any] | None = None,
                 inputs: Mapping[str, np.ndarray] | None = None) -> None:
        wrong = dataclasses.replace(case, attrs={**case.attrs, **(attrs or {})},
                                    inputs=tuple((n, (inputs or {}).get(n, a)) for n, a in case.inputs))
        out = evaluate(build_case_graph(wrong), wrong.feed())["node"]
        self.out = {"node": out.astype(case.dtype.np)}

    def compile(self, graph: Graph) -> _FakeExe:
        return _FakeExe(self.out)


def _case(op: str, dtype: DType, label: str) -> OpCase:
    return next(c for c in _by(op, dtype) if c.id == f"{op}[{dtype}]-{label}")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_semantic_bugs_fail_in_every_dtype(dtype: DType) -> None:
    def keep_all(case: OpCase) -> dict[str, np.ndarray]:
        return {"mask": np.ones_like(case.feed()["mask"])}

    def zero_bias(case: OpCase) -> dict[str, np.ndarray]:
        return {"mask": np.zeros_like(case.feed()["mask"])}

    mutations: list[tuple[str, str, dict[str, Any] | None, Any]] = [
        ("attention", "causal_rank4", {"mask": "none"}, None),
        ("attention", "causal_sq_lt_sk", {"mask": "none"}, None),
        ("attention", "sliding_window2_rank4", {"window": 3}, None),
        ("attention", "sliding_window2_rank3", {"mask": "causal", "window": None}, None),
        ("attention", "none_scale", {"scale": None}, None),
        ("attention", "padding_bool_rank4", None, keep_all),
        ("attention", "padding_i32_rank3", None, keep_all),
        ("attention", "bias_b1qk", None, zero_bias),
        ("softmax", "axis_neg2", {"axis": -1}, None),
        ("log_softmax", "rank3_axis1", {"axis": 2}, None),
        ("layer_norm", "axis1", {"axis": -2}, None),  # same axis: must pass (control)
        ("avg_pool2d", "pad1_k3_s2-exclude_pad", {"count_include_pad": True}, None),
        ("batch_norm", "eps", {"eps": 1e-5}, None),
        ("rms_norm", "eps", {"eps": 1e-6}, None),
    ]
    for op, label, attrs, inputs in mutations:
        case = _case(op, dtype, label)
        r = run_case(case, _WrongSemantics(case, attrs, inputs(case) if inputs else None))
        control = op == "layer_norm"
        assert r.status == ("passed" if control else "failed"), f"{case.id} with {attrs}: {r}"


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_gelu_approximation_is_told_apart_in_wide_dtypes(dtype: str) -> None:
    case = _case("gelu", DType.parse(dtype), "wide")
    assert run_case(case, _WrongSemantics(case, {"approximate": "tanh"})).status == "failed"


# Regressions: the core decompositions of norms and average pooling must accumulate half types in
# f32 (a square or a window sum above 65504 overflows f16 even when the result does not).

@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_f16_norm_of_values_above_256(op: str, session: Session) -> None:
    x = np.array([[300.0, -300.0, 100.0, -100.0]], np.float16)
    params = [("gamma", np.ones(4, np.float16))] + ([] if op == "rms_norm" else
                                                     [("beta", np.zeros(4, np.float16))])
    case = OpCase(f"{op}[f16]-above_256", op, DType.F16, (("x", x), *params), {})
    r = run_case(case, session)
    assert r.status == "passed", r.message


def test_f16_avg_pool_of_large_values(session: Session) -> None:
    case = OpCase("avg_pool2d[f16]-big_sum", "avg_pool2d", DType.F16,
                  (("x", np.full((1, 1, 3, 3), 3.0e4, np.float16)),), {"kernel": (3, 3)})
    r = run_case(case, session)
    assert r.status == "passed", r.message


# ---------------------------------------------------------------------------------------------
# Model graphs

GRAPH_F32 = graph_cases(("f32",))


def test_graph_registry_and_ids() -> None:
    assert set(GRAPHS) == {"mlp", "small_cnn", "attention_block", "transformer_encoder_layer"}
    ids = [c.id for c in GRAPH_F32]
    assert len(ids) == len(set(ids)) == 3 + len(MASK_KINDS)
    assert "graph::attention_block[causal,f32]" in ids and "graph::mlp[f32]" in ids
    assert len(GRAPH_VARIANTS["attention_block"]) == len(MASK_KINDS)
    ops = {n.op for c in GRAPH_F32 for n in c.graph.nodes}
    assert {"embedding", "layer_norm", "linear", "attention", "gelu", "relu", "softmax", "log_softmax",
            "conv2d_bias", "max_pool2d", "avg_pool2d", "reshape", "transpose", "add"} <= ops
    masks = {n.attrs["mask"] for c in GRAPH_F32 for n in c.graph.nodes if n.op == "attention"}
    assert masks == set(MASK_KINDS)
    g, inputs, _ = mlp("f32", batch=4)
    assert g.inputs[0].type.shape == ("batch", 784) and inputs["x"].shape == (4, 784)


@pytest.mark.parametrize("case", GRAPH_F32, ids=[c.id for c in GRAPH_F32])
def test_graph_case_on_cpu(case: GraphCase, session: Session) -> None:
    r = check_graph(case, session)
    assert r.status == "passed", f"{r.case_id} (path {r.path}): {r.message}"
    assert r.kind == "graph" and r.op == case.name


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f64"])
def test_mlp_in_other_dtypes(dtype: str, session: Session) -> None:
    case = make_case("mlp", dtype)
    r = check_graph(case, session)
    assert r.status == "passed", r.message
    f32 = make_case("mlp", "f32")
    assert (case.rtol > f32.rtol) == (dtype != "f64")


def test_graph_cases_are_deterministic_and_share_weights_across_dtypes() -> None:
    a, b = make_case("attention_block", "f32", mask_kind="padding"), make_case("attention_block", "f32",
                                                                                mask_kind="padding")
    for n in a.graph.weights:
        np.testing.assert_array_equal(a.graph.weights[n], b.graph.weights[n])
    for n in a.inputs:
        np.testing.assert_array_equal(a.inputs[n], b.inputs[n])
    h = make_case("attention_block", "f16", mask_kind="padding")
    w32, w16 = a.graph.weights["attn.q.weight"], h.graph.weights["attn.q.weight"]
    assert w16.dtype == np.float16
    np.testing.assert_array_equal(w32.astype(np.float16), w16)
    other = make_case("attention_block", "f32", seed=1, mask_kind="padding")
    assert not np.array_equal(other.graph.weights["attn.q.weight"], w32)


def test_graph_tolerance_is_relative_to_output_scale() -> None:
    case = make_case("small_cnn", "f32")
    budget = error_budget(case.graph, case.inputs, "f32")
    assert case.rtol == pytest.approx(2.0 * budget)
    scale = np.abs(evaluate(case.graph, case.inputs)[case.graph.outputs[0]]).max()
    assert case.atol == pytest.approx(case.rtol * scale)
    assert 1e-7 < case.rtol < 1e-4
    half = make_case("small_cnn", "f16")
    assert error_budget(half.graph, half.inputs, "f16") > 100 * budget  # node dtypes decide


class _Perturbing:
    """A 'backend' that runs the graph on cpu with one weight changed: a bug graph tests must see."""

    def __init__(self, inner: Session, name: str, fn: Any) -> None:
        self.inner, self.name, self.fn = inner, name, fn

    def compile(self, graph: Graph) -> Any:
        weights = dict(graph.weights)
        weights[self.name] = self.fn(weights[self.name]).astype(weights[self.name].dtype)
        bad = Graph(graph.name, graph.inputs, graph.params, graph.nodes, graph.outputs, weights)
        return self.inner.compile(bad)


def _bump(w: np.ndarray) -> np.ndarray:
    w = w.copy()
    w.reshape(-1)[0] += 0.01
    return w


@pytest.mark.parametrize(("name", "weight", "fn"), [
    ("mlp", "fc2.weight", lambda w: w * 1.001),
    ("small_cnn", "conv2.bias", _bump),
    ("attention_block", "attn.v.weight", _bump),
    ("transformer_encoder_layer", "attention.self.key.weight", _bump),
])
def test_graph_check_finds_a_perturbed_weight(name: str, weight: str, fn: Any, session: Session) -> None:
    case = next(c for c in GRAPH_F32 if c.name == name)
    assert check_graph(case, session).status == "passed"
    r = check_graph(case, _Perturbing(session, weight, fn))
    assert r.status == "failed" and "exceed tolerance" in r.message, r


def _swap_reference(op: str, make: Any) -> Iterator[None]:
    schema = REGISTRY.get(op)
    register_op(dataclasses.replace(schema, reference=make(schema.reference)), replace=True)
    try:
        yield
    finally:
        register_op(schema, replace=True)


@pytest.fixture()
def unbiased_layer_norm() -> Iterator[None]:
    """A layer_norm reference with the unbiased variance (n - 1), a classic porting bug."""
    def make(orig: Any) -> Any:
        def ref(xs: Any, attrs: Any) -> list[np.ndarray]:
            x, gamma, beta = xs
            axes = tuple(range(attrs["axis"] % x.ndim, x.ndim))
            c = x - x.mean(axis=axes, keepdims=True)
            var = c.var(axis=axes, keepdims=True, ddof=1)
            return [c / np.sqrt(var + attrs["eps"]) * gamma + beta]
        return ref
    yield from _swap_reference("layer_norm", make)


@pytest.fixture()
def bottom_right_causal() -> Iterator[None]:
    """An attention reference whose causal mask aligns bottom-right instead of top-left."""
    def make(orig: Any) -> Any:
        def ref(xs: Any, attrs: Any) -> list[np.ndarray]:
            if attrs["mask"] != "causal":
                return orig(xs, attrs)
            sq, sk = xs[0].shape[-2], xs[1].shape[-2]
            bias = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), 0.0, -1e9)
            return orig([*xs[:3], bias], attrs.replace(mask="bias"))
        return ref
    yield from _swap_reference("attention", make)


def test_graph_check_finds_a_wrong_reference(unbiased_layer_norm: None, session: Session) -> None:
    results = {c.id: check_graph(c, session) for c in GRAPH_F32}
    for cid, r in results.items():
        uses_ln = "attention_block" in cid or "transformer" in cid
        assert r.status == ("failed" if uses_ln else "passed"), f"{cid}: {r}"


def test_op_check_finds_a_wrong_mask_alignment(bottom_right_causal: None, session: Session) -> None:
    for dt in FLOATS:
        # Self-attention (Sq == Sk) cannot tell the alignments apart; Sq != Sk must.
        assert run_case(_case("attention", dt, "causal_rank4"), session).status == "passed"
        for label in ("causal_sq_lt_sk", "causal_sq_gt_sk"):
            r = run_case(_case("attention", dt, label), session)
            assert r.status == "failed", r


def test_graph_check_reports_compile_errors() -> None:
    case = next(c for c in GRAPH_F32 if c.name == "transformer_encoder_layer")
    r = check_graph(case, Session("whole", use_cache=False))
    assert r.status == "error" and "DispatchError" in r.message
