"""ONNX import (``rlx_core.frontends.onnx``), DOT export and the ``rlx run/explain`` ONNX paths.

PyTorch models (an MLP, a hand-built ResNet-18 and a BERT-style encoder) are exported in the test
with seeded weights, by the torch.export-based exporter (``dynamo=True``) and by the legacy
TorchScript one, with dynamic batch (and sequence) dims; each runs on rlx-cpu and is compared with
ONNX Runtime on the same file. Small ``onnx.helper`` models cover single operators and opset
differences (axes as attribute vs input) against ONNX Runtime too.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from click.testing import CliRunner  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.bench import torch_resnet18  # noqa: E402
from rlx_core.errors import RLXError, SerializationError  # noqa: E402
from rlx_core.frontends import onnx as onnx_frontend  # noqa: E402
from rlx_core.frontends.dot import PATH_COLORS, to_dot  # noqa: E402
from rlx_core.frontends.onnx import SymbolicShapeError, UnsupportedOnnxError, load_onnx  # noqa: E402
from rlx_core.runtime import Session  # noqa: E402

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


# ---------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    monkeypatch.delenv("RLX_DEBUG", raising=False)
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


def ort_session(model: Any) -> Any:
    src = str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"])


def ort_run(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort_session(model).run(None, feeds)


def assert_close(got: np.ndarray, ref: np.ndarray, rel: float = 1e-4, what: str = "") -> None:
    """max |got - ref| <= rel * max |ref| (the output scale); exact for ints and bools."""
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    if ref.dtype.kind in "iub":
        np.testing.assert_array_equal(got, ref, err_msg=what)
        return
    scale = max(float(np.abs(ref).max()), 1e-6) if ref.size else 1.0
    err = float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max()) if ref.size else 0.0
    assert err <= rel * scale, f"{what}: max abs diff {err:.3g} > {rel} * {scale:.3g}"


def compare(model: Any, feeds_list: Sequence[dict[str, np.ndarray]], rel: float = 1e-4,
            **load_kw: Any) -> Any:
    """Import, compile once, and compare every feed against ONNX Runtime. Returns the graph."""
    graph = load_onnx(model, **load_kw)
    exe = Session("cpu").compile(graph)
    sess = ort_session(model)
    for feeds in feeds_list:
        refs = sess.run(None, feeds)
        outs = exe.run(feeds)
        for name, ref in zip(graph.outputs, refs):
            assert_close(outs[name], ref, rel, f"output {name!r} for input shapes "
                                               f"{ {k: v.shape for k, v in feeds.items()} }")
    return graph


def make_model(nodes: Sequence[Any], inputs: Sequence[tuple[str, int, Sequence[Any]]],
               outputs: Sequence[tuple[str, int]], inits: dict[str, np.ndarray] | None = None,
               opset: int = 17, name: str = "case") -> Any:
    graph = helper.make_graph(
        list(nodes), name,
        [helper.make_tensor_value_info(n, dt, list(shape)) for n, dt, shape in inputs],
        [helper.make_tensor_value_info(n, dt, None) for n, dt in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in (inits or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset <= 18 else 10
    return m


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# PyTorch models, exported once per module


def _torch_models() -> dict[str, Callable[[], Any]]:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F  # noqa: N812

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.l2, self.l3 = nn.Linear(20, 32), nn.Linear(32, 16), nn.Linear(16, 5)

        def forward(self, x: Any) -> Any:
            return F.log_softmax(self.l3(F.gelu(self.l2(torch.relu(self.l1(x))))), dim=-1)

    class EncoderLayer(nn.Module):
        def __init__(self, d: int = 64, heads: int = 4) -> None:
            super().__init__()
            self.h = heads
            self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ff1, self.ff2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: Any, bias: Any) -> Any:
            b, s, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=-1)

            def heads(t: Any) -> Any:
                return t.reshape(b, s, self.h, d // self.h).transpose(1, 2)

            q, k, v = heads(q), heads(k), heads(v)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.h) + bias, dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, s, d)
            x = self.ln1(x + self.o(y))
            return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))

    class Bert(nn.Module):
        def __init__(self, vocab: int = 100, d: int = 64, max_pos: int = 32) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_pos, d)
            self.ln = nn.LayerNorm(d)
            self.layers = nn.ModuleList([EncoderLayer(d) for _ in range(2)])

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            pos = torch.arange(input_ids.shape[1]).unsqueeze(0)
            x = self.ln(self.tok(input_ids) + self.pos(pos))
            bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
            for layer in self.layers:
                x = layer(x, bias)
            return x

    def seeded(cls: Any) -> Any:
        torch.manual_seed(0)
        m = cls()
        with torch.no_grad():  # non-trivial batch-norm statistics and norm affines
            for mod in m.modules():
                if isinstance(mod, (nn.BatchNorm2d, nn.LayerNorm)):
                    mod.weight.uniform_(0.5, 1.5)
                    mod.bias.normal_(0.0, 0.1)
                if isinstance(mod, nn.BatchNorm2d):
                    mod.running_mean.normal_(0.0, 0.1)
                    mod.running_var.uniform_(0.5, 1.5)
        return m.eval()

    return {"mlp": lambda: seeded(MLP), "resnet18": lambda: seeded(lambda: torch_resnet18(classes=10)),
            "bert": lambda: seeded(Bert)}


def _example(name: str) -> tuple[Any, ...]:
    import torch

    g = torch.Generator().manual_seed(1)
    if name == "mlp":
        return (torch.randn(2, 20, generator=g),)
    if name == "resnet18":
        return (torch.randn(1, 3, 64, 64, generator=g),)
    ids = torch.randint(0, 100, (2, 8), generator=g)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    return ids, mask


_INPUTS = {"mlp": (["x"], {"x": {0: "batch"}}),
           "resnet18": (["x"], {"x": {0: "batch"}}),
           "bert": (["input_ids", "attention_mask"],
                    {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``exported(model, exporter, opset=None, fold=True)`` -> path of the .onnx file (cached)."""
    torch = pytest.importorskip("torch")
    models = _torch_models()
    root = tmp_path_factory.mktemp("onnx-models")
    cache: dict[tuple[Any, ...], Path] = {}

    def export(name: str, exporter: str, opset: int | None = None, fold: bool = True) -> Path:
        key = (name, exporter, opset, fold)
        if key in cache:
            return cache[key]
        path = root / f"{name}_{exporter}_{opset}_{fold}.onnx"
        names, axes = _INPUTS[name]
        kw: dict[str, Any] = {"input_names": names, "output_names": ["y"], "opset_version": opset}
        if exporter == "dynamo":
            dims = {"batch": torch.export.Dim("batch", max=64), "seq": torch.export.Dim("seq", max=32)}
            kw["dynamic_shapes"] = {n: {ax: dims[s] for ax, s in a.items()} for n, a in axes.items()}
        else:
            kw.update(dynamic_axes=axes, do_constant_folding=fold)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(models[name](), _example(name), str(path), dynamo=exporter == "dynamo", **kw)
        cache[key] = path
        return path

    return export


def _bert_feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2:] = 0  # padding in the last row
    return {"input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64), "attention_mask": mask}


# ---------------------------------------------------------------------------------------------
# Exported PyTorch models vs ONNX Runtime


def test_mlp_matches_onnxruntime(exported: Callable[..., Path]) -> None:
    path = exported("mlp", "dynamo", 20)
    graph = compare(path, [{"x": rand(3, 20)}, {"x": rand(7, 20, seed=1)}])
    assert [str(v.type) for v in graph.inputs] == ["f32[batch,20]"]
    ops = graph.op_counts()
    assert ops["linear"] == 3 and ops["gelu"] == 1 and ops["log_softmax"] == 1  # Gemm -> linear, Gelu-20
    assert "matmul" not in ops


@pytest.mark.parametrize("exporter,opset,fold", [("dynamo", None, True), ("legacy", 13, False)],
                         ids=["dynamo", "legacy-opset13-batchnorm"])
def test_resnet18_matches_onnxruntime(exported: Callable[..., Path], exporter: str, opset: int | None,
                                      fold: bool) -> None:
    path = exported("resnet18", exporter, opset, fold)
    feeds = [{"x": rand(2, 3, 64, 64, seed=3)}]  # exported with batch 1: the batch dim is dynamic
    if exporter == "dynamo":
        feeds.insert(0, {"x": rand(1, 3, 64, 64)})
    graph = compare(path, feeds)
    assert str(graph.inputs[0].type) == "f32[batch,3,64,64]"
    ops = graph.op_counts()
    assert ops.get("conv2d", 0) + ops.get("conv2d_bias", 0) == 20
    assert ops["max_pool2d"] == 1 and ops["linear"] == 1
    if not fold:  # the legacy exporter kept BatchNormalization: it maps to the HIR op
        assert ops["batch_norm"] == 20


@pytest.mark.parametrize("exporter,opset", [("dynamo", 20), ("legacy", 13)],
                         ids=["dynamo-opset20", "legacy-opset13"])
def test_bert_encoder_matches_onnxruntime(exported: Callable[..., Path], exporter: str, opset: int) -> None:
    path = exported("bert", exporter, opset)
    graph = compare(path, [_bert_feeds(2, 8, 0), _bert_feeds(3, 5, 1), _bert_feeds(1, 16, 2)])
    assert [str(v.type) for v in graph.inputs] == ["i64[batch,seq]", "i64[batch,seq]"]
    ops = graph.op_counts()
    assert ops["embedding"] == 2 and ops["linear"] == 8 and ops["softmax"] == 2
    if opset >= 17:
        assert ops["layer_norm"] == 5 and ops["gelu"] == 2  # LayerNormalization-17, Gelu-20
    # The Shape/Gather/Concat arithmetic folded into symbolic reshapes: no run-time shape math.
    assert all(op not in ops for op in ("concat", "reduce_prod"))


def test_bert_mask_matters_and_rlx_roundtrip(exported: Callable[..., Path], tmp_path: Path) -> None:
    from rlx_core import load, save

    graph = load_onnx(exported("bert", "dynamo", 20))
    save(graph, tmp_path / "bert.rlx")  # ONNX names ("/", "::", ".") survive the .rlx format
    assert load(tmp_path / "bert.rlx").fingerprint == graph.fingerprint
    exe = Session("cpu").compile(graph)
    feeds = _bert_feeds(2, 6, 0)
    full = dict(feeds, attention_mask=np.ones_like(feeds["attention_mask"]))
    a, b = exe.run(feeds)["y"], exe.run(full)["y"]
    assert np.abs(a[-1] - b[-1]).max() > 1e-3  # the padded row changed
    np.testing.assert_allclose(a[0], b[0], atol=1e-5)  # the unpadded row did not


# ---------------------------------------------------------------------------------------------
# Single operators vs ONNX Runtime

node = helper.make_node
X = ("x", F32, ["batch", 3, 8, 8])

_CASES: list[tuple[str, Any, list[dict[str, np.ndarray]]]] = []


def case(name: str, nodes: Sequence[Any], inputs: Sequence[tuple[str, int, Sequence[Any]]],
         feeds: list[dict[str, np.ndarray]], outputs: Sequence[tuple[str, int]] = (("y", F32),),
         inits: dict[str, np.ndarray] | None = None, opset: int = 17) -> None:
    _CASES.append((name, make_model(nodes, inputs, outputs, inits, opset, name), feeds))


x4 = [{"x": rand(2, 3, 8, 8)}, {"x": rand(1, 3, 8, 8, seed=1)}]
x2 = [{"x": rand(4, 6)}, {"x": rand(2, 6, seed=1)}]
X2 = ("x", F32, ["batch", 6])

case("gemm_transA_alpha_beta_matrixC", [node("Gemm", ["xt", "w", "c"], ["y"], transA=1, alpha=0.5, beta=2.0)],
     [("xt", F32, [6, 4])], [{"xt": rand(6, 4)}], inits={"w": rand(6, 5, seed=2), "c": rand(4, 5, seed=3)})
case("gemm_runtime_b", [node("Gemm", ["x", "b"], ["y"], transB=1)], [X2, ("b", F32, [5, 6])],
     [{"x": rand(4, 6), "b": rand(5, 6, seed=1)}])
case("matmul_broadcast_batched", [node("MatMul", ["a", "b"], ["y"])],
     [("a", F32, ["batch", 2, 4, 5]), ("b", F32, [5, 3])], [{"a": rand(3, 2, 4, 5), "b": rand(5, 3, seed=1)}])
case("matmul_add_fuses_to_linear", [node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "b"], ["y"])], [X2],
     x2, inits={"w": rand(6, 3, seed=1), "b": rand(3, seed=2)})
case("conv_groups_dilation_stride_pads", [node("Conv", ["x", "w", "b"], ["y"], group=3, dilations=[2, 1],
                                               strides=[1, 2], pads=[1, 0, 2, 1])],
     [X], x4, inits={"w": rand(6, 1, 3, 3, seed=2), "b": rand(6, seed=3)})
case("conv_same_upper_no_bias", [node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
     [X], x4, inits={"w": rand(4, 3, 2, 2, seed=2)})
case("conv1d", [node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1])], [("x", F32, ["batch", 3, 10])],
     [{"x": rand(2, 3, 10)}], inits={"w": rand(4, 3, 3, seed=2), "b": rand(4, seed=3)})
case("batchnorm", [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)], [X], x4,
     inits={"s": rand(3, seed=1), "b": rand(3, seed=2), "m": rand(3, seed=3),
            "v": np.abs(rand(3, seed=4)) + 0.5})
case("maxpool_ceil", [node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)],
     [X], x4)
case("avgpool_pads_exclusive", [node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
     [X], x4)
case("avgpool_include_pad", [node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                                  pads=[1, 1, 1, 1], count_include_pad=1)], [X], x4)
case("global_pools", [node("GlobalAveragePool", ["x"], ["a"]), node("GlobalMaxPool", ["x"], ["b"]),
                      node("Add", ["a", "b"], ["y"])], [X], x4)
case("flatten_axis2", [node("Flatten", ["x"], ["y"], axis=2)], [("x", F32, [2, 3, 4, 5])],
     [{"x": rand(2, 3, 4, 5)}])
case("activations", [node("LeakyRelu", ["x"], ["a"], alpha=0.2), node("HardSwish", ["a"], ["b"]),
                     node("Softplus", ["b"], ["c"]), node("Elu", ["c"], ["d"]),
                     node("HardSigmoid", ["d"], ["e"]), node("Mish", ["e"], ["f"]),
                     node("Softsign", ["f"], ["g"]), node("Selu", ["g"], ["y"])],
     [X2], [{"x": rand(4, 6) * 4}], opset=18)
case("unary_math", [node("Abs", ["x"], ["a"]), node("Sqrt", ["a"], ["b"]), node("Log", ["b"], ["c"]),
                    node("Exp", ["c"], ["d"]), node("Neg", ["d"], ["e"]), node("Tanh", ["e"], ["f"]),
                    node("Erf", ["f"], ["g"]), node("Sigmoid", ["g"], ["h"]),
                    node("Reciprocal", ["h"], ["i"]), node("Pow", ["i", "two"], ["j"]),
                    node("Pow", ["j", "half"], ["y"])],
     [X2], x2, inits={"two": np.float32(2.0), "half": np.float32(0.5)})
case("prelu_clip_minmax_sum_mean", [
    node("PRelu", ["x", "slope"], ["a"]), node("Clip", ["a", "lo", "hi"], ["b"]),
    node("Max", ["b", "x", "a"], ["c"]), node("Min", ["c", "x"], ["d"]), node("Sum", ["a", "b", "d"], ["e"]),
    node("Mean", ["e", "x"], ["y"])], [X2], x2,
    inits={"slope": rand(6, seed=5), "lo": np.float32(-0.5), "hi": np.float32(0.7)})
case("where_equal_cast", [node("Greater", ["x", "zero"], ["m"]), node("Cast", ["m"], ["mf"], to=F32),
                          node("Equal", ["mf", "one"], ["e"]), node("Where", ["e", "x", "mf"], ["y"])],
     [X2], x2, inits={"zero": np.float32(0), "one": np.float32(1)})
case("reductions_axes_input", [node("ReduceMax", ["x", "ax"], ["a"], keepdims=0),
                               node("ReduceMin", ["x", "ax"], ["b"], keepdims=0),
                               node("ReduceL2", ["x", "ax"], ["c"], keepdims=0),
                               node("ReduceLogSumExp", ["x", "ax"], ["d"], keepdims=0),
                               node("ReduceSumSquare", ["x", "ax"], ["e"], keepdims=0),
                               node("Sum", ["a", "b", "c", "d", "e"], ["y"])],
     [X], x4, inits={"ax": np.array([1, -1], np.int64)}, opset=18)
case("argmax_keepdims", [node("ArgMax", ["x"], ["y"], axis=1)], [X2], x2, outputs=[("y", I64)])
case("softmax_logsoftmax_axis1", [node("Softmax", ["x"], ["a"], axis=1),
                                  node("LogSoftmax", ["a"], ["y"], axis=2)], [X], x4)
case("slice_negative_steps", [node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], [X], x4,
     inits={"st": np.array([-1, 1], np.int64), "en": np.array([-9223372036854775807, 7], np.int64),
            "ax": np.array([3, 2], np.int64), "sp": np.array([-2, 3], np.int64)})
case("gather_scalar_and_negative", [node("Gather", ["x", "i"], ["a"], axis=1),
                                    node("Gather", ["a", "j"], ["y"], axis=-1)], [X], x4,
     inits={"i": np.array(-1, np.int64), "j": np.array([[0, -1], [2, 3]], np.int64)})
case("gathernd_embedding_and_pairs", [
    node("Unsqueeze", ["ids", "last"], ["ids1"]), node("GatherND", ["table", "ids1"], ["e"]),
    node("GatherND", ["cube", "pairs"], ["p"]), node("Add", ["e", "p"], ["y"])],
    [("ids", I64, [2, 3])], [{"ids": np.array([[1, 2, 9], [4, 5, 0]], np.int64)}],
    inits={"table": rand(10, 4, seed=1), "last": np.array([-1], np.int64), "cube": rand(3, 5, 4, seed=2),
           "pairs": np.array([[[0, 1], [2, 4], [1, 0]], [[2, 2], [0, 0], [1, 3]]], np.int64)})
case("transpose_concat_split", [node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
                                node("Split", ["t", "sizes"], ["a", "b"], axis=3),
                                node("Concat", ["b", "a", "b"], ["y"], axis=-1)],
     [X], x4, inits={"sizes": np.array([1, 2], np.int64)})
case("tile_pad_cumsum", [node("Tile", ["x", "r"], ["a"]), node("Pad", ["a", "p", "v"], ["b"]),
                         node("CumSum", ["b", "ax"], ["y"], reverse=1)],
     [("x", F32, [2, 3])], [{"x": rand(2, 3)}],
     inits={"r": np.array([2, 1], np.int64), "p": np.array([0, 1, 1, 2], np.int64), "v": np.float32(0.5),
            "ax": np.array(1, np.int64)})
case("layernorm_no_bias_axis", [node("LayerNormalization", ["x", "s"], ["y"], axis=-2, epsilon=1e-3)],
     [X], x4, inits={"s": rand(8, 8, seed=1)})
case("dynamic_shape_arithmetic", [
    node("Shape", ["x"], ["s"]), node("Gather", ["s", "zero"], ["b"]),
    node("Unsqueeze", ["b", "zero1"], ["b1"]), node("Concat", ["b1", "minus1"], ["shp"], axis=0),
    node("Reshape", ["x", "shp"], ["flat"]),
    node("ConstantOfShape", ["s"], ["ones"], value=numpy_helper.from_array(np.array([2.0], np.float32))),
    node("Mul", ["x", "ones"], ["x2"]), node("Shape", ["x2"], ["s2"]), node("Expand", ["bias", "s2"], ["bb"]),
    node("Add", ["x2", "bb"], ["z"]), node("Reshape", ["z", "shp"], ["z2"]),
    node("Add", ["flat", "z2"], ["y"])],
    [X], x4, inits={"zero": np.array(0, np.int64), "zero1": np.array([0], np.int64),
                    "minus1": np.array([-1], np.int64), "bias": rand(8, seed=2)})
case("range_symbolic_gather_table", [
    node("Shape", ["ids"], ["s"], start=1, end=2), node("Squeeze", ["s"], ["n"]),
    node("Range", ["zero", "n", "one"], ["pos"]), node("Gather", ["table", "pos"], ["pe"]),
    node("Gather", ["table", "ids"], ["te"]), node("Add", ["te", "pe"], ["y"])],
    [("ids", I64, ["batch", "seq"])], [{"ids": np.array([[1, 2, 3], [4, 5, 0]], np.int64)},
                                       {"ids": np.array([[7, 1, 2, 3, 4]], np.int64)}],
    inits={"table": rand(10, 4, seed=1), "zero": np.array(0, np.int64), "one": np.array(1, np.int64)})
case("slice_table_to_symbolic_length", [
    node("Shape", ["x"], ["s"]), node("Slice", ["s", "one", "two"], ["n"]),
    node("Slice", ["table", "zero", "n"], ["t"]), node("Add", ["x", "t"], ["y"])],
    [("x", F32, ["seq", 4])], [{"x": rand(3, 4)}, {"x": rand(6, 4, seed=1)}],
    inits={"table": rand(10, 4, seed=1), "zero": np.array([0], np.int64), "one": np.array([0], np.int64),
           "two": np.array([1], np.int64)})
case("dropout_identity_constant", [node("Dropout", ["x"], ["d"]), node("Identity", ["d"], ["e"]),
                                   node("Constant", [], ["c"], value_float=3.0),
                                   node("Mul", ["e", "c"], ["y"])], [X2], x2)
case("constant_folding_chain", [node("Sqrt", ["k"], ["k2"]), node("Cast", ["k2"], ["k3"], to=F32),
                                node("Unsqueeze", ["k3", "zero1"], ["k4"]), node("Mul", ["x", "k4"], ["y"])],
     [X2], x2, inits={"k": np.arange(6, dtype=np.float64), "zero1": np.array([0], np.int64)})


@pytest.mark.parametrize("name,model,feeds", _CASES, ids=[c[0] for c in _CASES])
def test_operator_matches_onnxruntime(name: str, model: Any, feeds: list[dict[str, np.ndarray]]) -> None:
    graph = compare(model, feeds, rel=1e-5)
    if name == "matmul_add_fuses_to_linear":
        assert graph.op_counts() == {"linear": 1}  # naming the output adds no node
    if name == "constant_folding_chain":  # Sqrt/Cast/Unsqueeze of initializers fold at import
        assert graph.op_counts() == {"mul": 1}
    if name == "dynamic_shape_arithmetic":
        assert "concat" not in graph.op_counts()


# ---------------------------------------------------------------------------------------------
# Opset differences: axes as attribute (old opsets) vs as input (new opsets)


def _axes_model(op: str, opset: int, as_input: bool, axes: Sequence[int], **attrs: Any) -> Any:
    inputs = ["x", "axes"] if as_input else ["x"]
    if not as_input:
        attrs["axes"] = list(axes)
    inits = {"axes": np.array(axes, np.int64)} if as_input else {}
    return make_model([node(op, inputs, ["y"], **attrs)], [("x", F32, ["batch", 3, 4])], [("y", F32)], inits,
                      opset)


@pytest.mark.parametrize("op,old,new,axes,attrs", [
    ("Unsqueeze", 11, 13, [0, 3], {}),
    ("Squeeze", 11, 13, [2], {}),
    ("ReduceSum", 11, 13, [1], {"keepdims": 0}),
    ("ReduceMean", 13, 18, [-1, 1], {}),
    ("ReduceMax", 13, 18, [2], {"keepdims": 0}),
])
def test_axes_attribute_vs_input(op: str, old: int, new: int, axes: list[int], attrs: dict[str, Any]) -> None:
    shape = (2, 3, 1) if op == "Squeeze" else (2, 3, 4)
    feeds = [{"x": rand(*shape)}]
    results = []
    for opset, as_input in ((old, False), (new, True)):
        m = _axes_model(op, opset, as_input, axes, **attrs)
        if op == "Squeeze":
            m.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 1
        compare(m, feeds, rel=1e-6)
        results.append(Session("cpu").compile(load_onnx(m)).run(feeds[0])["y"])
    np.testing.assert_array_equal(results[0], results[1])
    # The attribute form is an error where the input form is required, and vice versa.
    if op != "Squeeze":
        with pytest.raises(RLXError):
            load_onnx(_axes_model(op, new, False, axes, **attrs))


@pytest.mark.parametrize("opset,split_as", [(11, "attr"), (13, "input"), (18, "num_outputs")])
def test_split_across_opsets(opset: int, split_as: str) -> None:
    attrs: dict[str, Any] = {"axis": 1}
    inputs, inits = ["x"], {}
    if split_as == "attr":
        attrs["split"] = [2, 4]
    elif split_as == "input":
        inputs, inits = ["x", "s"], {"s": np.array([2, 4], np.int64)}
    else:
        attrs["num_outputs"] = 2
    m = make_model([node("Split", inputs, ["a", "b"], **attrs)], [X2], [("a", F32), ("b", F32)], inits, opset)
    compare(m, x2, rel=0)


def test_softmax_before_opset13_coerces_to_2d() -> None:
    m = make_model([node("Softmax", ["x"], ["y"], axis=1)], [("x", F32, [2, 3, 4])], [("y", F32)], opset=11)
    compare(m, [{"x": rand(2, 3, 4)}], rel=1e-5)  # softmax over 12 values per row, not over axis 1


def test_clip_attributes_before_opset11_and_inputs_after() -> None:
    feeds = [{"x": rand(4, 6) * 3}]
    compare(make_model([node("Clip", ["x", "lo", "hi"], ["y"])], [X2], [("y", F32)],
                       {"lo": np.float32(-1), "hi": np.float32(1)}, 13), feeds)
    compare(make_model([node("Clip", ["x", "", "hi"], ["y"])], [X2], [("y", F32)],
                       {"hi": np.float32(0.5)}, 12), feeds)


# ---------------------------------------------------------------------------------------------
# Errors: unsupported operators and attributes, symbolic shapes, malformed files


def test_unsupported_operator_names_op_node_opset_and_fix() -> None:
    m = make_model([node("RandomNormalLike", ["x"], ["y"], name="rnd_0")],  # random: never translated
                   [("x", F32, [1, 2, 8, 8])], [("y", F32)], opset=13)
    with pytest.raises(UnsupportedOnnxError) as ei:
        load_onnx(m)
    e = ei.value
    assert "'RandomNormalLike'" in e.what and "not supported" in e.what
    assert "'rnd_0'" in e.where and "opset 13" in e.where
    assert "register_handler" in e.fix and "SUPPORTED_OPS" in e.fix
    assert "RandomNormalLike" not in onnx_frontend.SUPPORTED_OPS


def test_unsupported_domain_and_attribute() -> None:
    m = make_model([node("FusedGemm", ["x", "x"], ["y"], domain="com.microsoft", name="fg")], [X2],
                   [("y", F32)])
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(UnsupportedOnnxError, match=r"com\.microsoft") as ei:
        load_onnx(m)
    assert "'fg'" in ei.value.where
    m = make_model([node("Pad", ["x", "p"], ["y"], mode="mirror", name="pad_r")], [X2], [("y", F32)],
                   {"p": np.array([0, 1, 0, 1], np.int64)}, 13)
    with pytest.raises(UnsupportedOnnxError, match="mode='mirror'") as ei:
        load_onnx(m)
    assert "'pad_r'" in ei.value.where and "Pad" in ei.value.where and ei.value.fix


def test_constant_inputs_fold_even_for_unsupported_ops() -> None:
    # NonZero has no run-time translation, but on an initializer it folds at import.
    m = make_model([node("NonZero", ["k"], ["nz"]), node("Cast", ["nz"], ["f"], to=F32),
                    node("ReduceSum", ["f"], ["s"], keepdims=0), node("Add", ["x", "s"], ["y"])], [X2],
                   [("y", F32)], {"k": np.array([0, 3, 0, 5], np.float32)}, 13)
    compare(m, x2, rel=1e-6)


def test_register_handler_adds_an_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_frontend, "_CUSTOM", {})
    monkeypatch.setattr(onnx_frontend, "_CUSTOM_DEFAULT", set())
    onnx_frontend.register_handler("Twice", lambda imp, n, ins, attrs: [imp.t(ins[0]) * 2.0], domain="my.ops")
    m = make_model([node("Twice", ["x"], ["y"], domain="my.ops")], [X2], [("y", F32)])
    m.opset_import.append(helper.make_opsetid("my.ops", 1))
    out = Session("cpu").compile(load_onnx(m)).run(x2[0])["y"]
    np.testing.assert_allclose(out, 2 * x2[0]["x"])


def _mha_style_model() -> Any:
    """Reshape (batch, 4, 6) -> (-1, 16): the -1 is 1.5*batch, not a polynomial in batch (batch*4 rows
    of 6 would be fine: dims may be expressions such as 4*batch)."""
    return make_model([node("Reshape", ["x", "s"], ["f"], name="to_rows"), node("Relu", ["f"], ["y"])],
                      [("x", F32, ["batch", 4, 6])], [("y", F32)], {"s": np.array([-1, 16], np.int64)}, 17)


def test_symbolic_product_needs_fixed_sizes() -> None:
    m = _mha_style_model()
    with pytest.raises(SymbolicShapeError) as ei:
        load_onnx(m)
    e = ei.value
    assert "cannot infer the -1" in e.what and "'to_rows'" in e.where
    assert "symbols={'batch': 2}" in e.fix and "--bind batch=2" in e.fix
    graph = compare(m, [{"x": rand(2, 4, 6)}], symbols={"batch": 2})
    assert graph.is_static
    assert str(load_onnx(m, input_shapes={"x": (2, None, None)}).inputs[0].type) == "f32[2,4,6]"
    renamed = load_onnx(make_model([node("Relu", ["x"], ["y"])], [X2], [("y", F32)]), symbols={"batch": "n"})
    assert str(renamed.inputs[0].type) == "f32[n,6]"


def test_unnamed_dynamic_dims_become_symbols() -> None:
    m = make_model([node("Add", ["a", "b"], ["y"])], [("a", F32, [None, 4]), ("b", F32, [None, 4])],
                   [("y", F32)])
    graph = compare(m, [{"a": rand(3, 4), "b": rand(3, 4, seed=1)}])
    assert [str(v.type) for v in graph.inputs] == ["f32[batch,4]", "f32[batch,4]"]
    m = make_model([node("Relu", ["x"], ["y"])], [("x", F32, [2, None])], [("y", F32)])
    assert str(load_onnx(m).inputs[0].type) == "f32[2,x_dim1]"


def test_opset_out_of_range() -> None:
    m = make_model([node("Relu", ["x"], ["y"])], [X2], [("y", F32)], opset=29)  # MAX_OPSET + 1
    with pytest.raises(UnsupportedOnnxError, match="opset 29") as ei:
        load_onnx(m)
    assert "opset_version" in ei.value.fix


def _no_protobuf_leak(e: BaseException) -> None:
    assert e.__cause__ is None and (e.__context__ is None or e.__suppress_context__)
    assert "google.protobuf" not in str(e) and "Traceback" not in str(e)


def test_malformed_and_truncated_files(tmp_path: Path) -> None:
    good = _mha_style_model().SerializeToString()
    files = {
        "truncated.onnx": good[: len(good) // 2],
        "garbage.onnx": b"\x08\x07\x12\xff\xff\xff\xff\x0f this is not a model",
        "empty.onnx": b"",
        "text.onnx": b"hello, I am a text file pretending to be a model\n" * 3,
    }
    for fname, data in files.items():
        p = tmp_path / fname
        p.write_bytes(data)
        with pytest.raises(SerializationError) as ei:
            load_onnx(p)
        e = ei.value
        assert e.where and str(p) in e.where and e.fix, fname
        _no_protobuf_leak(e)
    with pytest.raises(SerializationError, match="does not exist"):
        load_onnx(tmp_path / "missing.onnx")


def test_truncated_at_every_cut_never_leaks(tmp_path: Path) -> None:
    good = make_model([node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "b"], ["y"])], [X2],
                      [("y", F32)], {"w": rand(6, 3), "b": rand(3)}).SerializeToString()
    for cut in range(0, len(good), max(1, len(good) // 40)):
        try:
            load_onnx(good[:cut])
        except SerializationError as e:
            _no_protobuf_leak(e)
        except RLXError as e:  # a cut that still parses: a clear error about the graph
            assert e.where


# ---------------------------------------------------------------------------------------------
# DOT


def test_to_dot_without_and_with_report() -> None:
    m = make_model([node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "b"], ["h"]),
                    node("Relu", ["h"], ["y"])], [X2], [("y", F32)], {"w": rand(6, 3), "b": rand(3)})
    graph = load_onnx(m)
    plain = to_dot(graph)
    assert plain.startswith('digraph "case" {') and plain.rstrip().endswith("}")
    assert 'label="x\\nf32[batch,6]"' in plain and "linear" in plain
    assert '[label="f32[batch,3]"]' in plain  # edges carry the tensor type
    report = Session("cpu").plan(graph, {"batch": 4})
    dot = to_dot(graph, report)
    for e in report.entries:
        assert PATH_COLORS[e.path] in dot
        assert e.variant.replace('"', '\\"')[:40] in dot
    assert "cluster_legend" in dot and "with batch=4" in dot
    assert "p0" not in to_dot(graph, params=False)


# ---------------------------------------------------------------------------------------------
# CLI: rlx run / rlx explain with .onnx


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def invoke(runner: CliRunner, *args: str) -> Any:
    from rlx_core.cli import cli

    return runner.invoke(cli, list(args), prog_name="rlx")


def _mlp_file(tmp_path: Path) -> Path:
    m = make_model([node("Gemm", ["x", "w", "b"], ["h"], transB=1), node("Relu", ["h"], ["r"]),
                    node("Softmax", ["r"], ["probs"], axis=-1)], [X2], [("probs", F32)],
                   {"w": rand(5, 6, seed=1), "b": rand(5, seed=2)}, name="tiny_mlp")
    p = tmp_path / "tiny_mlp.onnx"
    p.write_bytes(m.SerializeToString())
    return p


def test_cli_run_onnx_matches_onnxruntime(runner: CliRunner, tmp_path: Path) -> None:
    model = _mlp_file(tmp_path)
    x = rand(3, 6, seed=7)
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "out"
    res = invoke(runner, "run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--json", "-o",
                 str(out_dir))
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["graph"] == "tiny_mlp" and data["outputs"]["probs"]["shape"] == [3, 5]
    assert_close(np.load(out_dir / "probs.npy"), ort_run(model, {"x": x})[0], 1e-5)


def test_cli_explain_onnx_and_dot(runner: CliRunner, tmp_path: Path) -> None:
    model = _mlp_file(tmp_path)
    res = invoke(runner, "explain", str(model), "--bind", "batch=4")
    assert res.exit_code == 0, res.output
    assert "Dispatch report: graph 'tiny_mlp'" in res.stdout and "linear" in res.stdout
    dot_file = tmp_path / "g.dot"
    res = invoke(runner, "explain", str(model), "--dot", str(dot_file), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["graph"] == "tiny_mlp"
    text = dot_file.read_text()
    assert text.startswith("digraph") and "softmax" in text and "f32[batch,5]" in text
    assert any(c in text for c in PATH_COLORS.values())
    res = invoke(runner, "explain", str(model), "--dot", "-")
    assert res.exit_code == 0 and res.stdout.startswith("digraph") and "Dispatch report" not in res.stdout


def test_cli_onnx_symbolic_fallback_uses_input_shapes_and_bind(runner: CliRunner, tmp_path: Path) -> None:
    p = tmp_path / "rows.onnx"
    p.write_bytes(_mha_style_model().SerializeToString())
    x = rand(2, 4, 6)
    np.save(tmp_path / "x.npy", x)
    res = invoke(runner, "run", str(p), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o"))
    assert res.exit_code == 0, res.output
    assert "imported with fixed sizes batch=2" in res.stderr
    np.testing.assert_allclose(np.load(tmp_path / "o" / "y.npy"), np.maximum(x.reshape(3, 16), 0))
    res = invoke(runner, "explain", str(p))
    assert res.exit_code == 1 and "SymbolicShapeError" in res.output and "--bind" in res.output
    assert "Traceback" not in res.output
    res = invoke(runner, "explain", str(p), "--bind", "batch=4")
    assert res.exit_code == 0, res.output
    assert "f32[6,16]" in res.stdout


def test_cli_malformed_onnx_is_a_clean_error(runner: CliRunner, tmp_path: Path) -> None:
    good = _mlp_file(tmp_path).read_bytes()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(good[: len(good) // 3])
    for cmd in ("run", "explain"):
        res = invoke(runner, cmd, str(bad))
        assert res.exit_code == 1, res.output
        assert "SerializationError" in res.output and "truncated" in res.output
        assert "Traceback" not in res.output
    rnd = tmp_path / "rnd.onnx"
    rnd.write_bytes(make_model([node("RandomNormalLike", ["x"], ["y"], name="rnd")],
                               [("x", F32, [1, 2, 8, 8])], [("y", F32)], opset=13).SerializeToString())
    res = invoke(runner, "explain", str(rnd))
    assert res.exit_code == 1 and "RandomNormalLike" in res.output and "Traceback" not in res.output


def test_if_with_constant_condition_inlines_the_branch() -> None:
    def branch(op: str, out: str) -> Any:
        outs = [helper.make_tensor_value_info(out, F32, None)]
        return helper.make_graph([node(op, ["x"], [out])], op, [], outs)

    then, other = branch("Relu", "t"), branch("Neg", "e")
    m = make_model([node("Greater", ["k", "zero"], ["c"]),
                    node("If", ["c"], ["y"], then_branch=then, else_branch=other)], [X2], [("y", F32)],
                   {"k": np.float32(1.0), "zero": np.float32(0.0)}, 13)
    graph = compare(m, x2, rel=0)
    assert graph.op_counts() == {"relu": 1}
