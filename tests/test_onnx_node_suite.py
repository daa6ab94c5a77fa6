"""The official ONNX backend node tests on rlx-cpu, through ``rlx_core.frontends.onnx_backend``.

The cases are generated in memory from the installed onnx package (``onnx.backend.test.case.node``)
and run in one test function (about 2,000 cases in seconds; a pytest item each would cost more than
the cases). ``plugins/rlx-cpu/onnx-node-excludes.txt`` lists every case that does not pass, with a
reason; like ``xfail_strict``, the suite fails when a case not listed does not pass (a regression)
and when a listed case passes (a stale entry). Regenerate the file and the report with::

    python scripts/onnx_node_tests.py --write-excludes --markdown docs/onnx-node-tests/cpu.md

The adapter's own behaviour (device names, output order, frozen inputs, errors) is tested on small
``onnx.helper`` models below.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from rlx_core.errors import DispatchError, RLXError  # noqa: E402
from rlx_core.frontends import onnx_backend as ob  # noqa: E402
from rlx_core.frontends.onnx import UnsupportedOnnxError  # noqa: E402
from rlx_core.frontends.onnx_backend import RLXBackend  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXCLUDES = ROOT / "plugins" / "rlx-cpu" / "onnx-node-excludes.txt"
REGEN = "python scripts/onnx_node_tests.py --write-excludes --markdown docs/onnx-node-tests/cpu.md"
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes: list, inputs: list, outputs: list, opset: int = 18, inits: list | None = None) -> object:
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _generated_for() -> str | None:
    m = re.search(r"^# onnx-version: (\S+)", EXCLUDES.read_text(), re.MULTILINE)
    return m.group(1) if m else None


# ---------------------------------------------------------------------------------------------
# The suite


def test_exclusion_file_is_well_formed() -> None:
    excludes = ob.read_excludes(EXCLUDES)  # raises on a line without a reason or a repeated name
    assert excludes, "the exclusion file is empty"
    for name, reason in excludes.items():
        assert name.startswith("test_") and " " not in name, name
        assert len(reason) >= 10, f"{name}: give a real reason, not {reason!r}"


def test_onnx_node_suite_on_cpu() -> None:
    generated = _generated_for()
    if generated is not None and generated != onnx.__version__:
        pytest.skip(f"the exclusion file was generated with onnx {generated}, onnx {onnx.__version__} is "
                    f"installed (its node cases differ); regenerate it: {REGEN}")
    cases = ob.node_test_cases()
    assert len(cases) > 1000, f"only {len(cases)} node test cases were generated"
    suite = ob.run_suite("cpu", cases=cases, use_cache=False)
    check = ob.check_excludes(suite, ob.read_excludes(EXCLUDES), names={c.name for c in cases})
    counts = suite.counts()
    assert check.ok, (f"{check.to_text()}\n(passed {counts['passed']}/{len(cases)}; fix the regression, or "
                      f"update the file: {REGEN})")
    # Every excluded case still fails for a reason the classification can name.
    assert all(r.reason for r in suite.results if r.status != ob.PASSED)


# ---------------------------------------------------------------------------------------------
# The adapter


def test_device_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLX_ONNX_DEVICE", raising=False)
    assert ob.rlx_device("CPU") == "cpu"
    assert ob.rlx_device("CUDA:1") == "cuda:1"
    assert ob.rlx_device("vulkan:0") == "vulkan:0"
    assert ob.rlx_device("CPU", "whole") == "whole"
    monkeypatch.setenv("RLX_ONNX_DEVICE", "cpu:0")
    assert ob.rlx_device("CUDA") == "cpu:0"
    monkeypatch.setattr(ob, "DEFAULT_DEVICE", "nope")
    assert ob.rlx_device("CUDA") == "cpu:0"  # the environment wins over the module default
    monkeypatch.delenv("RLX_ONNX_DEVICE")
    assert ob.rlx_device("CUDA") == "nope"


def test_supports_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLX_ONNX_DEVICE", raising=False)
    assert RLXBackend.supports_device("CPU")
    assert RLXBackend.supports_device("cpu")
    assert not RLXBackend.supports_device("no-such-backend")


def test_outputs_in_model_order_and_inputs_by_position_or_name() -> None:
    x = helper.make_tensor_value_info("x", F32, [2, 3])
    y = helper.make_tensor_value_info("y", F32, [2, 3])
    outs = [helper.make_tensor_value_info(n, F32, [2, 3]) for n in ("sub", "add")]
    m = _model([helper.make_node("Add", ["x", "y"], ["add"]), helper.make_node("Sub", ["x", "y"], ["sub"])],
               [x, y], outs)
    rep = RLXBackend.prepare(m, "CPU", use_cache=False)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 10, np.float32)
    sub, add = rep.run([a, b])
    np.testing.assert_array_equal(sub, a - b)
    np.testing.assert_array_equal(add, a + b)
    by_name = rep.run({"y": b, "x": a})
    np.testing.assert_array_equal(by_name.add, a + b)  # a namedtuple, as other ONNX backends return
    np.testing.assert_array_equal(by_name["sub"], a - b)
    with pytest.raises(RLXError, match="takes 2"):
        rep.run([a])
    (out,) = RLXBackend.run_model(_model([helper.make_node("Relu", ["x"], ["r"])], [x],
                                         [helper.make_tensor_value_info("r", F32, [2, 3])]), [a - 3],
                                  use_cache=False)
    np.testing.assert_array_equal(out, np.maximum(a - 3, 0))


def test_run_node() -> None:
    node = helper.make_node("Mul", ["a", "b"], ["c"])
    a = np.arange(4, dtype=np.float32)
    (c,) = RLXBackend.run_node(node, [a, a], use_cache=False)
    np.testing.assert_array_equal(c, a * a)


def test_unsupported_operator_raises_from_prepare() -> None:
    x = helper.make_tensor_value_info("x", F32, [4])
    m = _model([helper.make_node("Bernoulli", ["x"], ["y"])], [x],
               [helper.make_tensor_value_info("y", F32, [4])])
    with pytest.raises(UnsupportedOnnxError, match="Bernoulli"):
        RLXBackend.prepare(m, "CPU", use_cache=False)


def test_unknown_device_raises_from_prepare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLX_ONNX_DEVICE", raising=False)
    x = helper.make_tensor_value_info("x", F32, [4])
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [helper.make_tensor_value_info("y", F32, [4])])
    with pytest.raises(RLXError, match="no-such-backend"):
        RLXBackend.prepare(m, "no-such-backend", use_cache=False)


def test_run_time_axes_are_staged_per_value() -> None:
    """ReduceSum-13 with ``axes`` fed at run time: the core's staged execution compiles the reduction
    once per distinct axes value (the adapter itself freezes nothing)."""
    x = helper.make_tensor_value_info("x", F32, [2, 3])
    axes = helper.make_tensor_value_info("axes", I64, [1])
    m = _model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], [x, axes],
               [helper.make_tensor_value_info("y", F32, None)], opset=13)
    rep = RLXBackend.prepare(m, "CPU", use_cache=False)
    assert rep.staged is not None and rep.executable is None
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y0,) = rep.run([a, np.array([0])])
    (y1,) = rep.run([a, np.array([1])])
    (y0b,) = rep.run([a + 1, np.array([0])])
    np.testing.assert_array_equal(y0, a.sum(0))
    np.testing.assert_array_equal(y1, a.sum(1))
    np.testing.assert_array_equal(y0b, (a + 1).sum(0))
    assert rep.staged.compiles == 2 and rep.staged.last_origins == {"y": "backend"}


def test_cases_computed_only_on_the_host_do_not_pass() -> None:
    """ConstantOfShape of a run-time shape is a constant once the shape is value-keyed (no arithmetic
    on the fed value is left); the adapter runs it, but the suite counts it unsupported (nothing ran on
    the backend). A Range of run-time scalars, by contrast, computes start + delta * i from the fed
    values on the backend (onnx_staged's live value keys)."""
    shape = helper.make_tensor_value_info("shape", I64, [2])
    m = _model([helper.make_node("ConstantOfShape", ["shape"], ["y"])], [shape],
               [helper.make_tensor_value_info("y", F32, None)], opset=11)
    rep = RLXBackend.prepare(m, "CPU", use_cache=False)
    (y,) = rep.run([np.array([2, 3])])
    np.testing.assert_array_equal(y, np.zeros((2, 3), np.float32))
    assert rep.staged.last_origins == {"y": "host"}
    ins = [helper.make_tensor_value_info(n, I64, []) for n in ("start", "limit", "delta")]
    m = _model([helper.make_node("Range", ["start", "limit", "delta"], ["y"])], ins,
               [helper.make_tensor_value_info("y", I64, None)], opset=11)
    rep = RLXBackend.prepare(m, "CPU", use_cache=False)
    (y,) = rep.run([np.array(0), np.array(5), np.array(1)])
    np.testing.assert_array_equal(y, np.arange(5))
    assert rep.staged.last_origins == {"y": "backend"}
    # Unique stays a host op (NonZero runs on the backend as the bounded op `nonzero` where claimed).
    (case,) = [c for c in ob.node_test_cases("test_unique_not_sorted_without_axis")]
    r = ob.run_case(case)
    assert r.status == ob.UNSUPPORTED and r.reason.startswith("staged execution computes every output")
    assert r.staged == "host op Unique"


def test_case_classification() -> None:
    cases = {c.name: c for c in ob.node_test_cases("test_")
             if c.name in ("test_abs", "test_bernoulli", "test_string_concat")}
    assert ob.run_case(cases["test_abs"]).status == ob.PASSED
    r = ob.run_case(cases["test_bernoulli"])
    assert (r.status, r.stage, r.op) == (ob.UNSUPPORTED, "import", "Bernoulli")
    assert "Bernoulli" in r.reason
    r = ob.run_case(cases["test_string_concat"])
    assert r.status == ob.UNSUPPORTED and r.reason.startswith("out of scope: string")


def test_case_classification_failed_and_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    (case,) = ob.node_test_cases("test_relu")[:1]
    orig = ob.RLXBackendRep.run
    monkeypatch.setattr(ob.RLXBackendRep, "run", lambda self, i, **k: tuple(o + 1 for o in orig(self, i)))
    r = ob.run_case(case)
    assert (r.status, r.stage) == (ob.FAILED, "compare") and "Mismatched" in r.reason

    def no_path(*a: object, **k: object) -> None:
        raise DispatchError("no kernel for relu[f32]")

    monkeypatch.setattr(ob.RLXBackendRep, "run", orig)
    monkeypatch.setattr(ob, "_session", lambda *a: type("S", (), {"compile": staticmethod(no_path)})())
    r = ob.run_case(case)
    assert (r.status, r.stage) == (ob.UNSUPPORTED, "compile")

    def boom(*a: object, **k: object) -> None:
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(ob, "_session", lambda *a: type("S", (), {"compile": staticmethod(boom)})())
    r = ob.run_case(case)
    assert r.status == ob.ERROR and "ZeroDivisionError" in r.reason


def test_check_excludes_is_strict() -> None:
    suite = ob.SuiteResult("cpu", onnx.__version__, [
        ob.CaseResult("test_a", "A", ob.PASSED), ob.CaseResult("test_b", "B", ob.UNSUPPORTED, reason="x"),
        ob.CaseResult("test_c", "C", ob.FAILED, reason="y"), ob.CaseResult("test_d", "D", ob.PASSED)])
    assert ob.check_excludes(suite, {"test_b": "r", "test_c": "r"}).ok
    chk = ob.check_excludes(suite, {"test_b": "r", "test_d": "r", "test_zz": "r"})
    assert [r.name for r in chk.regressions] == ["test_c"]
    assert chk.stale == ["test_d"] and chk.unknown == ["test_zz"]
    assert "test_c" in chk.to_text() and "now pass" in chk.to_text()


def test_read_excludes_needs_reasons(tmp_path: Path) -> None:
    p = tmp_path / "x.txt"
    p.write_text("# comment\n\ntest_a # op A: not translated\n")
    assert ob.read_excludes(p) == {"test_a": "op A: not translated"}
    p.write_text("test_a\n")
    with pytest.raises(ValueError, match="no reason"):
        ob.read_excludes(p)
    p.write_text("test_a # r1\ntest_a # r2\n")
    with pytest.raises(ValueError, match="twice"):
        ob.read_excludes(p)
