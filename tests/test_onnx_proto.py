"""The importer reads models without the onnx package: its protobuf classes loaded on their own, its
own tensor and attribute decoding and a bundled table of operator schemas. Each is checked against
onnx itself here, so a drift (a new onnx, a new protobuf runtime) fails loudly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlx_core.frontends import _onnx_proto, onnx_schemas
from rlx_core.frontends import onnx as onnx_fe


def test_schema_table_matches_onnx() -> None:
    ops = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ("", "ai.onnx")}
    assert set(onnx_schemas.SCHEMAS) == ops, "regenerate: python scripts/gen_onnx_schemas.py"
    assert onnx_schemas.MAX_OPSET == onnx.defs.onnx_opset_version()
    for op in sorted(ops):
        for opset in range(1, onnx_schemas.MAX_OPSET + 1):
            try:
                s = onnx.defs.get_schema(op, max_inclusive_version=opset, domain="")
                want = (int(s.since_version), frozenset(s.attributes))
            except Exception:
                want = None
            onnx_fe._SINCE_CACHE.pop((op, opset), None)
            onnx_fe._SCHEMA_ATTRS.pop((op, opset), None)
            got_since = onnx_fe._since(op, opset)
            got_attrs = onnx_fe._schema_attrs(op, opset)
            assert (got_since, got_attrs) == (want or (None, frozenset())), (op, opset)


_PLAIN = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8, TensorProto.UINT8,
          TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64,
          TensorProto.UINT64, TensorProto.BOOL]


@pytest.mark.parametrize("code", _PLAIN)
@pytest.mark.parametrize("shape", [(), (0,), (3, 4), (2, 1, 5)])
@pytest.mark.parametrize("raw", [True, False])
def test_tensor_array_matches_numpy_helper(code: int, shape: tuple[int, ...], raw: bool) -> None:
    npdt = helper.tensor_dtype_to_np_dtype(code)
    rng = np.random.default_rng(code)
    vals = (rng.standard_normal(shape) * 50).astype(npdt) if npdt.kind != "b" else rng.random(shape) > 0.5
    t = helper.make_tensor("t", code, shape, vals.tobytes() if raw else vals.flatten().tolist(), raw=raw)
    got, want = _onnx_proto.tensor_array(t), numpy_helper.to_array(t)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, vals)


@pytest.mark.parametrize("raw", [True, False])
def test_tensor_array_refuses_short_data(raw: bool) -> None:
    t = TensorProto(name="t", data_type=TensorProto.FLOAT, dims=(2, 3))
    if raw:
        t.raw_data = np.ones(5, np.float32).tobytes()
    else:
        t.float_data.extend([1.0] * 5)
    with pytest.raises(ValueError):
        _onnx_proto.tensor_array(t)


def test_tensor_array_other_types_ask_onnx() -> None:
    t = helper.make_tensor("t", TensorProto.BFLOAT16, (3,), [1.0, -2.5, 3.0])
    np.testing.assert_array_equal(_onnx_proto.tensor_array(t).astype(np.float32), [1.0, -2.5, 3.0])
    s = helper.make_tensor("s", TensorProto.STRING, (2,), [b"a", b"b"])
    assert list(_onnx_proto.tensor_array(s)) == ["a", "b"]


def test_attribute_value_matches_helper() -> None:
    g = helper.make_graph([], "g", [], [])
    tp = helper.make_tensor_type_proto(TensorProto.FLOAT, (2,))
    t = numpy_helper.from_array(np.ones(2, np.float32), "w")
    sp = helper.make_sparse_tensor(t, numpy_helper.from_array(np.array([0, 1], np.int64)), (2,))
    values = {"f": 1.5, "i": 3, "s": b"xy", "t": t, "g": g, "tp": tp, "sp": sp, "fs": [1.0, 2.0],
              "is": [1, 2], "ss": [b"a"], "ts": [t], "gs": [g], "tps": [tp], "sps": [sp]}
    attrs = [helper.make_attribute(k, v) for k, v in values.items()]
    attrs.append(onnx.AttributeProto(name="u", type=onnx.AttributeProto.UNDEFINED))
    assert {a.type for a in attrs} == set(range(15))
    for a in attrs:
        assert _onnx_proto.attribute_value(a) == helper.get_attribute_value(a), a.name


def _mlp_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    w1, b1 = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    w2 = rng.standard_normal((16, 4)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["m"]),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ("n", 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ("n", 4))],
                              [numpy_helper.from_array(a, n) for a, n in
                               ((w1, "w1"), (b1, "b1"), (w2, "w2"))])
    p = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


_CHILD = """
import json, sys
import numpy as np
from rlx_core.frontends.onnx import load_onnx
from rlx_core.runtime import Session
g = load_onnx(sys.argv[1])
x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
y = Session("cpu").compile(g).run({"x": x})["y"]
print(json.dumps({"onnx": "onnx" in sys.modules, "ml_dtypes": "ml_dtypes" in sys.modules,
                  "y": np.asarray(y, np.float64).tolist()}))
"""


def _child(path: Path, **env: str) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=300)
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def test_loading_and_running_a_model_leaves_onnx_unimported(tmp_path: Path) -> None:
    import onnxruntime as ort

    p = _mlp_file(tmp_path)
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
    want = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    out = _child(p)
    assert out["onnx"] is False
    # float32 weights are typed without ml_dtypes (only bf16/float8/int4 tensors need it: ~1 MB RSS)
    assert out["ml_dtypes"] is False
    np.testing.assert_allclose(np.asarray(out["y"]), want, rtol=1e-5, atol=1e-6)
    # Protobuf's pure-Python runtime does not share classes with onnx's: onnx itself reads the file.
    py = _child(p, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    assert py["onnx"] is True
    np.testing.assert_allclose(np.asarray(py["y"]), want, rtol=1e-5, atol=1e-6)


def test_standalone_classes_are_onnx_classes(tmp_path: Path) -> None:
    code = ("from rlx_core.frontends import _onnx_proto\nm = _onnx_proto.pb().ModelProto\n"
            "import onnx\nassert m is onnx.ModelProto, (m, onnx.ModelProto)\n"
            "assert _onnx_proto.pb() is onnx\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
