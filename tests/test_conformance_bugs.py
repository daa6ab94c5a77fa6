"""The conformance suite catches real backend bugs, precisely.

``tests/buggy/numpy_backend.py`` is a small NumPy backend of reference quality (arena buffers,
in-place planning, native f16 reductions accumulated in f32, ``profile()``). Each test installs it,
or a copy with one planted one-line bug from ``tests/buggy/bugs.py``, as its own distribution
(a real ``rlx.backends`` entry point) and certifies it with ``run_suite``. A caught bug must:

* make the certificate *not certified*, with a failed result naming the op and the variant
  (``op == "transpose"``, ``variant == "transpose[f32]"``) and the Markdown listing it;
* leave unrelated variants certified, and every failing op or graph check must actually run the
  buggy code (its compiled program calls a bugged kernel): the suite is precise, not just noisy.

A planted bug the suite misses is a gap in the suite: it is kept visible as a strict xfail.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

import numpy as np
from buggy.bugs import BUGS, TEMPLATE, source
from conftest import PluginFactory
from rlx_conformance import run_suite
from rlx_conformance.cases import build_case_graph, cases_for
from rlx_conformance.certificate import Certificate, Result

from rlx_core import GraphBuilder
from rlx_core._hub import Hub
from rlx_core.ir.graph import Graph
from rlx_core.ir.reference import evaluate
from rlx_core.runtime import Session

BAD = ("failed", "error")
#: Variants every correct run of the template certifies (f16 via the compute_f16_in_f32 rewrite).
CORE_VARIANTS = [f"{op}[{dt}]" for op in ("add", "sub", "mul", "div", "maximum", "exp", "neg", "matmul",
                                          "reduce_sum", "reduce_max", "reshape", "transpose", "expand")
                 for dt in ("f16", "f32", "f64")] + ["add[i32]", "sub[i32]", "mul[i32]",
                                                     "softmax[f32]", "relu[f32]"]


def _install(make_plugin: PluginFactory, bug: str | None = None) -> str:
    name = "refnp" if bug is None else bug
    make_plugin(f"rlx-{name.replace('_', '-')}", name, source(name, bug))
    return name


def _certify(name: str, keyword: str | None = None) -> tuple[Certificate, Hub]:
    hub = Hub()
    return run_suite(name, hub=hub, keyword=keyword), hub


def _verdicts(cert: Certificate) -> dict[str, str]:
    return {k: v["verdict"] for k, v in cert.variants().items()}


def _failed_variants(cert: Certificate) -> set[str]:
    return {k for k, v in _verdicts(cert).items() if v == "failed"}


def _bad(cert: Certificate) -> list[Result]:
    return [r for r in cert.results if r.status in BAD]


def _labels(cert: Certificate, variant: str, statuses: Iterable[str] = BAD) -> set[str]:
    """Case labels (``swap01`` of ``op::transpose[f32]-swap01``) of ``variant`` with a status."""
    return {r.id.split("]-", 1)[1] for r in cert.results
            if r.variant == variant and r.kind == "op" and r.status in tuple(statuses)}


def _assert_named(cert: Certificate, op: str, variant: str) -> None:
    """A failed result names the op and the variant, and the Markdown certificate lists it."""
    hits = [r for r in cert.results if r.status == "failed" and r.op == op and r.variant == variant]
    assert hits, f"no failed result for {variant}: {[(r.id, r.status) for r in _bad(cert)]}"
    assert all(r.id.startswith(f"op::{variant}-") and (variant in r.message or r.id.endswith("-twice"))
               for r in hits)
    md = cert.to_markdown()
    assert "**Verdict: not certified: " in md and "variants failed" in md
    assert "## Failures" in md
    assert f"- `{hits[0].id}` **failed**: {variant}" in md
    assert f"| `{variant}` | op | failed |" in md


@cache
def _graph_cases() -> dict[str, Graph]:
    from rlx_conformance import graphs

    return {gc.id: gc.graph for gc in graphs.graph_cases(dtypes=("f32", "f16"))}


def _check_graph(r: Result) -> Graph:
    if r.kind == "graph":
        return _graph_cases()[r.id]
    cid = r.id.removesuffix("-twice")
    case = next(c for c in cases_for(r.op, r.dtype) if f"op::{c.id}" == cid)
    return build_case_graph(case)


def _assert_precise(cert: Certificate, hub: Hub, name: str, bugged_ops: set[str]) -> None:
    """Every failing op/graph check runs a bugged kernel of ``name`` (so no failure is noise)."""
    bugged = {f"{name}.{op}" for op in bugged_ops}
    session = Session(name, hub=hub, use_cache=False)
    for r in _bad(cert):
        if r.kind == "contract":
            continue
        exe = session.compile(_check_graph(r))
        assert exe.report is not None
        used = {k for e in exe.report.entries for k in e.kernels}
        assert used & bugged, f"{r.id} failed without running a bugged kernel ({sorted(used)}): {r.message}"


def _assert_certified(cert: Certificate, variants: Iterable[str]) -> None:
    v = _verdicts(cert)
    wrong = {x: v.get(x, "absent") for x in variants if v.get(x) != "certified"}
    assert not wrong, f"unrelated variants not certified: {wrong}"


# ---------------------------------------------------------------------------------------------


def test_each_planted_bug_is_a_one_line_change() -> None:
    ref = source("refnp").splitlines()
    for bug in BUGS:
        planted = source("refnp", bug).splitlines()
        assert len(planted) == len(ref)
        assert sum(a != b for a, b in zip(ref, planted)) == 1, bug
    text = TEMPLATE.read_text()
    assert "import rlx_cpu" not in text and "from rlx_cpu" not in text  # plugins never import each other


def test_reference_backend_is_certified(make_plugin: PluginFactory) -> None:
    name = _install(make_plugin)
    cert, _ = _certify(name)  # the full suite
    assert cert.certified, [(r.id, r.message) for r in _bad(cert)]
    assert cert.counts()["failed"] == cert.counts()["error"] == 0
    assert cert.keyword is None
    _assert_certified(cert, CORE_VARIANTS)
    contract = {r.variant: r.status for r in cert.results if r.kind == "contract"}
    assert set(contract.values()) == {"passed"}, contract  # profile() counts every native kernel
    # f16 reduce_sum/matmul run natively; other f16 variants through the core's rewrite.
    paths = cert.variants()
    assert paths["matmul[f16]"]["paths"] == ["native"]
    assert paths["add[f16]"]["paths"] == ["rewritten"]
    assert "**Verdict: certified" in cert.to_markdown()


def test_transpose_that_ignores_perm(make_plugin: PluginFactory) -> None:
    name = _install(make_plugin, "transpose_wrong_axes")
    cert, hub = _certify(name, keyword="transpose")
    assert not cert.certified
    assert _failed_variants(cert) == {"transpose[f16]", "transpose[f32]", "transpose[f64]"}
    for dt in ("f32", "f64"):
        _assert_named(cert, "transpose", f"transpose[{dt}]")
        # Only the non-reversing permutations of rank-3 tensors are wrong; the rest still pass.
        labels = {lb.removesuffix("-twice") for lb in _labels(cert, f"transpose[{dt}]")}
        assert labels == {"swap01", "rotate", "negative_perm"}
        assert {"reverse", "matrix", "size1", "scalar", "noncontiguous"} <= _labels(
            cert, f"transpose[{dt}]", ("passed",))
    # The f16 variant runs the same kernel through the f32 rewrite, and the certificate says so.
    assert cert.variants()["transpose[f16]"]["paths"] == ["rewritten"]
    _assert_precise(cert, hub, name, {"transpose"})


def test_broadcast_that_only_works_for_equal_shapes(make_plugin: PluginFactory) -> None:
    name = _install(make_plugin, "broadcast_equal_shapes_only")
    cert, hub = _certify(name)  # the full suite, as a vendor runs it before release
    assert not cert.certified
    binary = {f"{op}[{dt}]" for op in ("add", "sub", "mul", "div", "maximum") for dt in ("f16", "f32", "f64")}
    binary |= {"add[i32]", "sub[i32]", "mul[i32]"}
    failed = _failed_variants(cert)
    assert binary | {"softmax[f32]"} <= failed
    for v in sorted(binary):
        op = v.split("[")[0]
        _assert_named(cert, op, v)
        # Equal shapes, scalars and trailing-row broadcasts happen to work; the rest do not.
        bad = _labels(cert, v)
        # (maximum[f64]-broadcast_outer passes by luck: its misplaced operands lose every max.)
        assert "broadcast_rank" in bad and bad <= {"broadcast_outer", "broadcast_rank", "nan_inf"}
        assert {"basic", "scalar_rhs", "broadcast_row", "noncontiguous"} <= _labels(cert, v, ("passed",))
    # Model-shaped contract checks see it too (softmax subtracts a (n, 1) row max).
    assert {"symbolic_specialisation", "memory_reuse_no_corruption"} <= failed
    _assert_certified(cert, [f"{op}[{dt}]" for op in ("exp", "neg", "matmul", "reduce_sum", "reduce_max",
                                                      "reshape", "transpose", "expand")
                             for dt in ("f16", "f32", "f64")] + ["records", "determinism"])
    _assert_precise(cert, hub, name, {"add", "sub", "mul", "div", "maximum"})


def test_f16_accumulated_in_f16(make_plugin: PluginFactory) -> None:
    name = _install(make_plugin, "f16_accumulates_in_f16")
    cert, hub = _certify(name, keyword="matmul or reduce_sum")
    assert not cert.certified
    assert _failed_variants(cert) == {"matmul[f16]", "reduce_sum[f16]"}
    _assert_named(cert, "matmul", "matmul[f16]")
    _assert_named(cert, "reduce_sum", "reduce_sum[f16]")
    assert "long_k" in _labels(cert, "matmul[f16]")  # 64 terms summed in f16
    assert cert.variants()["matmul[f16]"]["paths"] == ["native"]
    _assert_certified(cert, ["matmul[f32]", "matmul[f64]", "reduce_sum[f32]", "reduce_sum[f64]"])
    _assert_precise(cert, hub, name, {"matmul", "reduce_sum"})


def test_add_claims_dtypes_it_computes_in_f32(make_plugin: PluginFactory) -> None:
    name = _install(make_plugin, "add_computes_in_f32")
    cert, hub = _certify(name, keyword="add or sub")
    assert not cert.certified
    assert _failed_variants(cert) == {"add[f64]", "add[i32]"}
    _assert_named(cert, "add", "add[f64]")
    _assert_named(cert, "add", "add[i32]")
    # Integer operands of O(10) are exact in f32: only the range-end (wraparound) case exposes it.
    assert _labels(cert, "add[i32]") == {"overflow"}
    assert "basic" in _labels(cert, "add[f64]")
    _assert_certified(cert, ["add[f32]", "add[f16]", "sub[f16]", "sub[f32]", "sub[f64]", "sub[i32]"])
    _assert_precise(cert, hub, name, {"add"})


def test_in_place_that_ignores_the_plan(make_plugin: PluginFactory) -> None:
    name = _install(make_plugin, "in_place_ignores_plan")
    cert, hub = _certify(name)
    assert not cert.certified
    hit = [r for r in _bad(cert) if r.id == "contract::memory_reuse_no_corruption"]
    assert hit and hit[0].status == "failed", [(r.id, r.message) for r in _bad(cert)]
    md = cert.to_markdown()
    assert "- `contract::memory_reuse_no_corruption` **failed**" in md
    assert "| `memory_reuse_no_corruption` | contract | failed |" in md
    # Kernels that never run in place are untouched by the bug and stay certified.
    _assert_certified(cert, [v for v in CORE_VARIANTS if v.split("[")[0] in
                             ("matmul", "reduce_sum", "reduce_max", "reshape", "transpose", "expand")])
    _assert_precise(cert, hub, name, {"add", "sub", "mul", "div", "maximum", "exp", "neg"})


def test_native_kernel_that_never_runs(make_plugin: PluginFactory) -> None:
    name = _install(make_plugin, "exp_kernel_never_called")
    cert, _ = _certify(name)
    assert not cert.certified
    bad = _bad(cert)
    assert [r.id for r in bad] == ["contract::native_kernels_ran"], [(r.id, r.message) for r in bad]
    assert f"ran {name}.exp" in bad[0].message and "never called it" in bad[0].message
    # The results are right (a library exp), so the op variants stay certified: precise.
    _assert_certified(cert, [v for v in CORE_VARIANTS if not v.startswith("exp[")])
    assert "- `contract::native_kernels_ran` **failed**" in cert.to_markdown()


def test_exp_that_clobbers_its_input_is_a_real_bug(make_plugin: PluginFactory) -> None:
    """The planted bug below is observable: ``exp(x) * x`` reads x after exp overwrote it."""
    g = GraphBuilder("exp_times_x")
    x = g.input("x", "f32", (3, 4))
    g.output(g.op("exp", x) * x, "y")
    graph = g.build()
    feed = {"x": np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)}
    want = evaluate(graph, feed)["y"]
    good, bad = _install(make_plugin), _install(make_plugin, "exp_clobbers_input")
    hub = Hub()
    ok = Session(good, hub=hub, use_cache=False).compile(graph).run(feed)["y"]
    np.testing.assert_allclose(ok, want, rtol=1e-6, atol=1e-6)
    wrong = Session(bad, hub=hub, use_cache=False).compile(graph).run(feed)["y"]
    assert not np.allclose(wrong, want, rtol=1e-3)
    np.testing.assert_allclose(wrong, np.exp(feed["x"]) ** 2, rtol=1e-6)


def test_suite_catches_exp_clobbering_its_input(make_plugin: PluginFactory) -> None:
    # Caught by the "-twice" op checks: the same op applied twice to one live input.
    name = _install(make_plugin, "exp_clobbers_input")
    cert, _ = _certify(name)
    assert not cert.certified
    assert any(r.id.endswith("-twice") and r.op == "exp" for r in _bad(cert))
