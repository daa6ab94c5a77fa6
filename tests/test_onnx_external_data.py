"""ONNX external data is read from the model's folder only (issue 14, item 3).

Every tensor that names an external file (initializers, Constant / ConstantOfShape attributes, sparse
tensors, tensors in If branches) goes through one checked resolver: a relative location inside the
model's folder, no ``..``, no absolute path, no symbolic link out of the folder, never the current
directory. A model given as bytes has no folder, so its external data is refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.errors import SerializationError  # noqa: E402
from rlx_core.frontends.onnx import load_onnx  # noqa: E402
from rlx_core.runtime import Session  # noqa: E402

SECRET = np.array([7.0, 7.0, 7.0, 7.0], np.float32)
GOOD = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    reset_hub(Hub())
    yield
    reset_hub(Hub())


def external_tensor(name: str, location: str, n: int = 4, offset: int | None = None) -> TensorProto:
    t = TensorProto()
    t.name, t.data_type = name, TensorProto.FLOAT
    t.dims.extend([n])
    t.data_location = TensorProto.EXTERNAL
    entries = [("location", location)] + ([("offset", str(offset))] if offset is not None else [])
    for k, v in entries:
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def constant_model(location: str, op: str = "Constant") -> onnx.ModelProto:
    t = external_tensor("weights", location, 1 if op == "ConstantOfShape" else 4)
    if op == "Constant":
        nodes = [helper.make_node("Constant", [], ["c"], value=t, name="leaky_const")]
    else:
        nodes = [helper.make_node("Constant", [], ["shape"], name="shape_const",
                                  value=numpy_helper.from_array(np.array([4], np.int64), "shape")),
                 helper.make_node("ConstantOfShape", ["shape"], ["c"], value=t, name="leaky_const")]
    nodes.append(helper.make_node("Add", ["x", "c"], ["y"], name="add"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """``model/`` holds the model and its data; ``home/`` (the current directory) and the folder above
    ``model/`` hold a secret with the names a hostile model would use."""
    model_dir, home = tmp_path / "model", tmp_path / "home"
    model_dir.mkdir()
    home.mkdir()
    (model_dir / "weights.bin").write_bytes(GOOD.tobytes())
    for d in (home, tmp_path):
        (d / "secret").write_bytes(SECRET.tobytes())
        (d / "weights.bin").write_bytes(SECRET.tobytes())
    monkeypatch.chdir(home)
    return model_dir, home


def write(model_dir: Path, m: onnx.ModelProto, name: str = "m.onnx") -> Path:
    p = model_dir / name
    p.write_bytes(m.SerializeToString())
    return p


def run(graph) -> np.ndarray:
    return Session("cpu").run(graph, {"x": np.zeros(4, np.float32)})["y"]


@pytest.mark.parametrize("op", ["Constant", "ConstantOfShape"])
def test_constant_attribute_reads_from_the_model_folder_not_the_cwd(layout: tuple[Path, Path],
                                                                   op: str) -> None:
    model_dir, home = layout
    if op == "ConstantOfShape":
        (model_dir / "weights.bin").write_bytes(np.float32(2.5).tobytes())
    path = write(model_dir, constant_model("weights.bin", op))
    # The current directory has a weights.bin too (the secret): the model's own file must be used.
    got = run(load_onnx(path))
    want = GOOD if op == "Constant" else np.full(4, 2.5, np.float32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["Constant", "ConstantOfShape"])
def test_hostile_locations_are_refused_naming_tensor_and_node(layout: tuple[Path, Path], tmp_path: Path,
                                                               op: str) -> None:
    model_dir, home = layout
    outside = tmp_path / "secret"
    (model_dir / "link").symlink_to(outside)
    (model_dir / "dirlink").symlink_to(tmp_path, target_is_directory=True)
    hostile = {"../secret": "..", str(outside): "absolute", "link": "outside the model's folder",
               "dirlink/secret": "outside the model's folder", "sub/../../secret": "..",
               "secret": "does not exist"}
    for location, says in hostile.items():
        path = write(model_dir, constant_model(location, op))
        with pytest.raises(SerializationError) as ei:
            load_onnx(path)
        err = ei.value
        assert says in err.what, (location, err.what)
        assert "'weights'" in err.where and "'leaky_const'" in err.where and op in err.where, err.where
        assert err.fix


def test_symlink_inside_the_model_folder_is_fine(layout: tuple[Path, Path]) -> None:
    model_dir, _ = layout
    (model_dir / "data").mkdir()
    (model_dir / "data" / "w.bin").write_bytes(GOOD.tobytes())
    (model_dir / "alias.bin").symlink_to(model_dir / "data" / "w.bin")
    for loc in ("alias.bin", "data/w.bin"):
        np.testing.assert_array_equal(run(load_onnx(write(model_dir, constant_model(loc)))), GOOD)


def test_initializer_sparse_and_subgraph_tensors_use_the_same_rules(layout: tuple[Path, Path]) -> None:
    model_dir, _ = layout
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    # An initializer.
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name="add")], "g", [x], [y],
                          initializer=[external_tensor("w", "../secret")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(SerializationError, match=r"\.\.") as ei:
        load_onnx(write(model_dir, m))
    assert "'w'" in ei.value.where and "initializer" in ei.value.where
    # A Constant inside an If branch.
    then = helper.make_graph([helper.make_node("Constant", [], ["c"], value=external_tensor("t", "../secret"),
                                               name="inner")], "then", [], [y])
    cond = numpy_helper.from_array(np.array(True), "cond")
    g = helper.make_graph([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=then,
                                            name="branch")], "g", [x], [y], initializer=[cond])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(SerializationError) as ei:
        load_onnx(write(model_dir, m))
    assert "'inner'" in ei.value.where and "'branch'" in ei.value.where
    # A sparse Constant's values.
    sp = helper.make_sparse_tensor(external_tensor("sv", "/etc/passwd", 1),
                                   numpy_helper.from_array(np.array([0], np.int64), "si"), [4])
    g = helper.make_graph([helper.make_node("Constant", [], ["y"], sparse_value=sp, name="sparse")], "g",
                          [], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(SerializationError, match="absolute") as ei:
        load_onnx(write(model_dir, m))
    assert "'sparse'" in ei.value.where


def test_offset_and_length_outside_the_file_are_refused(layout: tuple[Path, Path]) -> None:
    model_dir, _ = layout
    t = external_tensor("weights", "weights.bin", offset=12)
    g = helper.make_graph([helper.make_node("Constant", [], ["y"], value=t, name="c")], "g", [],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(SerializationError, match="needs 16 bytes"):
        load_onnx(write(model_dir, m))


def test_external_data_in_bytes_or_a_modelproto_is_refused(layout: tuple[Path, Path]) -> None:
    model_dir, home = layout
    m = constant_model("weights.bin")
    for given in (m.SerializeToString(), m):
        with pytest.raises(SerializationError, match="no model folder") as ei:
            load_onnx(given)
        assert "'weights'" in ei.value.where and "path" in ei.value.fix


def test_legit_external_initializers_written_by_onnx_still_load(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    w = np.arange(64, dtype=np.float32).reshape(16, 4)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                          initializer=[numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "model").mkdir()
    path = tmp_path / "model" / "m.onnx"
    onnx.save(m, os.fspath(path), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    monkeypatch.chdir(tmp_path)
    x = np.ones((1, 16), np.float32)
    got = Session("cpu").run(load_onnx(path), {"x": x})["y"]
    np.testing.assert_allclose(got, x @ w)


def _conv_model(tmp_path: Path, w: np.ndarray, b: np.ndarray) -> Path:
    """A 3x3 conv (+ bias) whose weights (large enough to be memory-mapped) are external data."""
    g = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv")],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, w.shape[1], 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, w.shape[0], 6, 6])],
                          initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "model").mkdir()
    path = tmp_path / "model" / "m.onnx"
    onnx.save(m, os.fspath(path), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    return path


def _maps_its_file(a: np.ndarray) -> bool:
    base = a
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    return base is not None and base.mode == "r"


@pytest.mark.parametrize("mmap_on", [True, False])
def test_large_external_initializers_are_read_only_maps_of_the_file(tmp_path: Path, mmap_on: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """RLX_ONNX_MMAP (default on): a large initializer is a view of a read-only memory map of its
    external data file (no copy kept); a small one (the bias) is copied; 0 copies both. Same
    results either way, against a float64 reference."""
    from rlx_core.ir.reference import evaluate

    monkeypatch.setenv("RLX_ONNX_MMAP", "1" if mmap_on else "0")
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 32, 3, 3)).astype(np.float32)  # 73 KB: above the map threshold
    b = rng.standard_normal(64).astype(np.float32)
    graph = load_onnx(_conv_model(tmp_path, w, b))
    assert _maps_its_file(graph.weights["w"]) is mmap_on
    assert not graph.weights["w"].flags.writeable  # a constant either way
    assert not _maps_its_file(graph.weights["b"])
    np.testing.assert_array_equal(graph.weights["w"], w)
    x = rng.standard_normal((1, 32, 6, 6)).astype(np.float32)
    got = Session("cpu").run(graph, {"x": x})["y"]
    want = evaluate(graph, {"x": x.astype(np.float64)})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chain", ["1", "0"])
def test_packed_conv_weights_give_their_pages_back(tmp_path: Path, chain: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Once rlx-cpu has packed a memory-mapped conv weight (per-conv path: RLX_CPU_CONV_CHAIN=0),
    it gives the weight's pages back: counted through release_file_pages, the data still reads the same."""
    pytest.importorskip("rlx_cpu")
    from rlx_cpu import onednn_conv

    if not onednn_conv.available():
        pytest.skip("no oneDNN: convs run im2col and keep reading the weights")
    from rlx_core import pages

    released: list[int] = []
    real = pages.release_file_pages

    def counting(a: np.ndarray) -> int:
        n = real(a)
        released.append(n)
        return n
    monkeypatch.setattr(onednn_conv, "release_file_pages", counting)
    monkeypatch.setenv("RLX_CPU_CONV_CHAIN", chain)
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 32, 3, 3)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    graph = load_onnx(_conv_model(tmp_path, w, b))
    x = rng.standard_normal((1, 32, 6, 6)).astype(np.float32)
    exe = Session("cpu", use_cache=False).compile(graph)
    y1 = exe.run({"x": x})["y"]
    if chain == "0":
        assert sum(released) > 0, released
    np.testing.assert_array_equal(graph.weights["w"], w)  # the pages map again on the next read
    np.testing.assert_array_equal(exe.run({"x": x})["y"], y1)


def test_release_file_pages_only_touches_read_only_file_maps(tmp_path: Path) -> None:
    from rlx_core.pages import release_file_pages

    data = np.arange(1 << 16, dtype=np.float32)
    f = tmp_path / "d.bin"
    f.write_bytes(data.tobytes())
    ro = np.memmap(f, dtype=np.float32, mode="r")
    assert float(ro.sum()) == float(data.sum())  # make the pages resident
    assert release_file_pages(ro[100:]) > 0
    np.testing.assert_array_equal(ro, data)  # read again from the file
    anon = data.copy()
    anon.flags.writeable = False
    assert release_file_pages(anon) == 0  # anonymous memory: MADV_DONTNEED would zero it
    rw = np.memmap(f, dtype=np.float32, mode="r+")
    assert release_file_pages(rw) == 0  # writable maps may hold changes not written back
    assert release_file_pages(ro[::2]) == 0  # not contiguous
    np.testing.assert_array_equal(anon, data)
    np.testing.assert_array_equal(rw, data)
