"""ONNX neural-net operators (``rlx_core.frontends.onnx_nn``): Resize/Upsample, Attention,
RMSNormalization, RotaryEmbedding, the two losses, Group/InstanceNormalization.

Each case is a small onnx.helper model run on rlx-cpu and compared with ONNX Runtime and/or onnx's
reference evaluator (ONNX Runtime's Resize is the one real models are checked against). Cases that
cannot be translated exactly must raise UnsupportedOnnxError naming the op and the fix.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from rlx_core._hub import Hub, reset_hub  # noqa: E402
from rlx_core.frontends.onnx import UnsupportedOnnxError, load_onnx  # noqa: E402
from rlx_core.runtime import Session  # noqa: E402

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    monkeypatch.delenv("RLX_DEBUG", raising=False)
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


def make_model(nodes: Sequence[Any], inputs: Sequence[tuple[str, int, Sequence[Any]]],
               outputs: Sequence[tuple[str, int]], inits: dict[str, np.ndarray] | None = None,
               opset: int = 19) -> Any:
    graph = helper.make_graph(
        list(nodes), "case",
        [helper.make_tensor_value_info(n, dt, list(shape)) for n, dt, shape in inputs],
        [helper.make_tensor_value_info(n, dt, None) for n, dt in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in (inits or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset <= 18 else 10
    return m


def rlx_run(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    graph = load_onnx(model)
    outs = Session("cpu").compile(graph).run(feeds)
    return [outs[n] for n in graph.outputs]


def ort_run(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(s.run(None, feeds))


def ref_run(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(ReferenceEvaluator(model).run(None, feeds))


def close(got: np.ndarray, ref: np.ndarray, rel: float = 1e-5, what: str = "") -> None:
    """max |got - ref| <= rel * max(1, max |ref|); exact for ints and bools."""
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    if ref.dtype.kind in "iub":
        np.testing.assert_array_equal(got, ref, err_msg=what)
        return
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=f"{what}: NaN positions")
    inf = np.isinf(ref)
    np.testing.assert_array_equal(got[inf], ref[inf], err_msg=f"{what}: infinities")
    fin = np.isfinite(ref)
    g64, r64 = got[fin].astype(np.float64), ref[fin].astype(np.float64)
    scale = max(float(np.abs(r64).max()) if r64.size else 1.0, 1.0)
    err = float(np.abs(g64 - r64).max()) if r64.size else 0.0
    assert err <= rel * scale, f"{what}: max abs diff {err:.3g} > {rel} * {scale:.3g}"


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Resize


def _resize_model(x_shape: Sequence[int], *, scales: Sequence[float] | None = None,
                  sizes: Sequence[int] | None = None, roi: Sequence[float] | None = None,
                  opset: int = 19, **attrs: Any) -> Any:
    inits: dict[str, np.ndarray] = {}
    names = ["x", "", "", ""]
    if roi is not None:
        inits["roi"], names[1] = np.asarray(roi, np.float32), "roi"
    if scales is not None:
        inits["scales"], names[2] = np.asarray(scales, np.float32), "scales"
    if sizes is not None:
        inits["sizes"], names[3] = np.asarray(sizes, np.int64), "sizes"
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node("Resize", names, ["y"], **attrs)
    return make_model([node], [("x", F32, x_shape)], [("y", F32)], inits, opset=opset)


_CTMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
_SCALES = ((1.0, 1.0, 2.0, 2.0), (1.0, 1.0, 0.5, 0.6), (1.0, 1.0, 1.7, 0.8), (1.0, 1.0, 3.0, 1.0))


def _check_resize(m: Any, x: np.ndarray, rel: float, what: str) -> bool:
    """RLX equals ONNX Runtime (and onnx's reference), or refuses the case as ambiguous. True if run."""
    try:
        got = rlx_run(m, {"x": x})[0]
    except UnsupportedOnnxError as e:
        assert "ambiguous" in e.what and "sizes" in (e.fix or ""), f"{what}: {e}"
        return False
    close(got, ort_run(m, {"x": x})[0], rel, f"{what} vs onnxruntime")
    close(got, ref_run(m, {"x": x})[0], rel, f"{what} vs the reference")
    return True


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_matches_onnxruntime(mode: str) -> None:
    """Every coordinate mode x nearest mode x (up, down, mixed, integer) scale, and sizes, against ONNX
    Runtime; nearest must be bit-exact (it only gathers). Where ONNX Runtime and the reference
    disagree (float32 rounding ties, align_corners on a fractional output length) RLX refuses."""
    x = rand(2, 3, 5, 7)
    rel = 0.0 if mode == "nearest" else 1e-5
    nearest = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil") if mode == "nearest" else (None,)
    ran = 0
    for ctm, nm, sc in itertools.product(_CTMS, nearest, _SCALES):
        attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": ctm}
        if nm:
            attrs["nearest_mode"] = nm
        ok = _check_resize(_resize_model(x.shape, scales=sc, **attrs), x, rel, f"{attrs} scales {sc}")
        ran += ok
        if sc[2:] in ((2.0, 2.0), (3.0, 1.0)):
            assert ok, f"{attrs} scales {sc}: a whole-number scale is never ambiguous"
    assert ran >= len(_CTMS) * len(nearest) * 2
    for sizes in ((2, 3, 9, 4), (2, 3, 1, 1), (2, 3, 16, 21)):
        for ctm in _CTMS:
            m = _resize_model(x.shape, sizes=sizes, mode=mode, coordinate_transformation_mode=ctm)
            _check_resize(m, x, 1e-5, f"{mode} {ctm} sizes {sizes}")


def test_resize_variants() -> None:
    """axes, keep_aspect_ratio_policy, tf_crop_and_resize with extrapolation, exclude_outside,
    cubic_coeff_a, antialias (wide filters: one matmul), and an integer image (nearest only)."""
    x = rand(1, 2, 8, 6)
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"sizes": (5, 9)}, {"axes": [2, 3], "mode": "linear"}),
        ({"sizes": (5, 9)}, {"axes": [3, 2], "mode": "nearest"}),
        ({"sizes": (4, 4)}, {"axes": [2, 3], "mode": "nearest", "keep_aspect_ratio_policy": "not_larger"}),
        ({"sizes": (4, 4)}, {"axes": [2, 3], "mode": "linear", "keep_aspect_ratio_policy": "not_smaller"}),
        ({"sizes": (1, 2, 5, 5), "roi": (0, 0, 0.1, -0.2, 1, 1, 0.9, 1.3)},
         {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
          "extrapolation_value": 7.0}),
        ({"scales": (1, 1, 2, 2)}, {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}),
        ({"sizes": (1, 2, 3, 2)}, {"mode": "linear", "antialias": 1}),
        ({"sizes": (1, 2, 2, 5)}, {"mode": "cubic", "antialias": 1}),
    ]
    for inputs, attrs in cases:
        m = _resize_model(x.shape, **inputs, **attrs)
        assert _check_resize(m, x, 1e-5, f"{inputs} {attrs}"), f"{inputs} {attrs} was refused"
    xi = (np.arange(48, dtype=np.uint8) * 5).reshape(1, 1, 6, 8)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    m = make_model([node], [("x", TensorProto.UINT8, xi.shape)], [("y", TensorProto.UINT8)],
                   {"scales": np.array([1, 1, 2, 0.5], np.float32)})
    np.testing.assert_array_equal(rlx_run(m, {"x": xi})[0], ort_run(m, {"x": xi})[0])
    m = _resize_model(xi.shape, scales=(1, 1, 2, 2), mode="linear")
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.UINT8
    with pytest.raises(UnsupportedOnnxError, match="cast it to float32"):
        load_onnx(m)


@pytest.mark.parametrize("opset", [10, 11, 13])
def test_resize_old_opsets_and_upsample(opset: int) -> None:
    """Resize-10 (ONNX Runtime's legacy nearest: floor up, ceil down) and Resize-11/13 defaults, and
    Upsample-7 (scales attribute) / Upsample-9 (scales input), nearest and linear."""
    x = rand(1, 2, 4, 6)
    scales = ((1, 1, 2, 3), (1, 1, 0.5, 0.5), (1, 1, 1.5, 2))
    for mode, sc in itertools.product(("nearest", "linear"), scales):
        if opset == 10:
            node = helper.make_node("Resize", ["x", "scales"], ["y"], mode=mode)
        else:
            node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode=mode)
        inits = {"scales": np.asarray(sc, np.float32), "roi": np.zeros(0, np.float32)}
        if opset == 10:
            del inits["roi"]
        m = make_model([node], [("x", F32, x.shape)], [("y", F32)], inits, opset=opset)
        ok = _check_resize(m, x, 1e-5, f"Resize-{opset} {mode} {sc}") if opset > 10 else None
        if opset == 10:
            close(rlx_run(m, {"x": x})[0], ort_run(m, {"x": x})[0], 1e-6, f"Resize-10 {mode} {sc}")
        elif sc != (1, 1, 1.5, 2):
            assert ok
    for mode in ("nearest", "linear"):
        up7 = make_model([helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=[1.0, 1.0, 2.0, 3.0])],
                         [("x", F32, x.shape)], [("y", F32)], opset=7)
        up9 = make_model([helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode)],
                         [("x", F32, x.shape)], [("y", F32)], {"s": np.array([1, 1, 2, 3], np.float32)},
                         opset=9)
        for m in (up7, up9):
            close(rlx_run(m, {"x": x})[0], ort_run(m, {"x": x})[0], 1e-6, f"Upsample {mode}")


def test_resize_refusals() -> None:
    x_shape = (1, 1, 4, 4)
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear")
    m = make_model([node], [("x", F32, x_shape), ("s", F32, (4,))], [("y", F32)])
    with pytest.raises(UnsupportedOnnxError, match="computed at run time") as e:
        load_onnx(m)
    assert "Resize" in str(e.value) and "constant" in (e.value.fix or "")
    m = _resize_model(x_shape, scales=(1, 1, 2, 2), mode="nearest", antialias=1)
    with pytest.raises(UnsupportedOnnxError, match="antialias"):
        load_onnx(m)


# ---------------------------------------------------------------------------------------------
# Normalisations, RotaryEmbedding, losses, Attention (against onnx's reference evaluator)


def _check_ref(m: Any, feeds: dict[str, np.ndarray], rel: float = 1e-5, ort_too: bool = False) -> None:
    got = rlx_run(m, feeds)
    for i, (a, b) in enumerate(zip(got, ref_run(m, feeds))):
        close(a, np.asarray(b), rel, f"output {i} vs the reference")
    if ort_too:
        for i, (a, b) in enumerate(zip(got, ort_run(m, feeds))):
            close(a, b, rel, f"output {i} vs onnxruntime")


def test_norms() -> None:
    x = rand(2, 4, 3, 5)
    for axis, scale in ((-1, rand(5, seed=1)), (1, rand(4, 1, 1, seed=2)), (2, rand(1, 5, seed=3))):
        m = make_model([helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=axis, epsilon=1e-3)],
                       [("x", F32, x.shape)], [("y", F32)], {"s": scale}, opset=23)
        _check_ref(m, {"x": x})
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)
    m = make_model([node], [("x", F32, x.shape)], [("y", F32)], {"s": rand(4, seed=4), "b": rand(4, seed=5)},
                   opset=17)
    _check_ref(m, {"x": x}, ort_too=True)
    for opset, nparam in ((18, 2), (21, 4)):
        m = make_model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)],
                       [("x", F32, x.shape)], [("y", F32)],
                       {"s": rand(nparam, seed=6), "b": rand(nparam, seed=7)}, opset=opset)
        _check_ref(m, {"x": x}, ort_too=opset == 21)
    m = make_model([helper.make_node("RMSNormalization", ["x", "s"], ["y"], stash_type=10)],
                   [("x", F32, x.shape)], [("y", F32)], {"s": rand(5)}, opset=23)
    with pytest.raises(UnsupportedOnnxError, match="stash_type"):
        load_onnx(m)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding(interleaved: int) -> None:
    b, s, h, d = 2, 3, 2, 8
    x4, x3 = rand(b, h, s, d), rand(b, s, h * d, seed=1)
    cos, sin = rand(b, s, 2, seed=2), rand(b, s, 2, seed=3)  # rotary_embedding_dim 4 of 8
    m = make_model([helper.make_node("RotaryEmbedding", ["x", "c", "s"], ["y"], interleaved=interleaved,
                                     rotary_embedding_dim=4)],
                   [("x", F32, x4.shape), ("c", F32, cos.shape), ("s", F32, sin.shape)], [("y", F32)],
                   opset=23)
    _check_ref(m, {"x": x4, "c": cos, "s": sin})
    table_c, table_s = rand(10, 4, seed=4), rand(10, 4, seed=5)
    pos = np.array([[0, 3, 9], [1, 1, 2]], np.int64)
    m = make_model([helper.make_node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"], interleaved=interleaved,
                                     num_heads=h)],
                   [("x", F32, x3.shape), ("p", I64, pos.shape)], [("y", F32)],
                   {"c": table_c, "s": table_s}, opset=23)
    _check_ref(m, {"x": x3, "p": pos})


def test_losses() -> None:
    """Every reduction x weights x ignore_index against ONNX Runtime and the reference. One case is
    checked against ONNX Runtime only: mean without weights with ignore_index=-1, where onnx's
    reference divides by every element (ignored ones too) and the spec and ONNX Runtime by the kept."""
    x = rand(3, 5, 4)
    t = np.array([[0, 4, 2, 1], [3, -1, 0, 2], [1, 1, -1, 4]], np.int64)
    w = np.abs(rand(5, seed=1)) + 0.1
    for reduction, weight, ignore in itertools.product(("none", "sum", "mean"), (False, True), (None, -1, 1)):
        attrs: dict[str, Any] = {"reduction": reduction}
        if ignore is not None:
            attrs["ignore_index"] = ignore
        feeds = {"x": x, "t": t if ignore == -1 else np.abs(t)}  # a target outside [0, C) is ignored
        ins = ["x", "t", "w"] if weight else ["x", "t"]
        inits = {"w": w} if weight else {}
        nll = make_model([helper.make_node("NegativeLogLikelihoodLoss", ins, ["y"], **attrs)],
                         [("x", F32, x.shape), ("t", I64, t.shape)], [("y", F32)], inits, opset=22)
        sce = make_model([helper.make_node("SoftmaxCrossEntropyLoss", ins, ["y", "lp"], **attrs)],
                         [("x", F32, x.shape), ("t", I64, t.shape)], [("y", F32), ("lp", F32)], inits,
                         opset=13)
        for m in (nll, sce):
            if reduction == "mean" and not weight and ignore == -1:
                for a, b in zip(rlx_run(m, feeds), ort_run(m, feeds)):
                    close(a, b, 1e-5, f"{attrs} vs onnxruntime")
            else:
                _check_ref(m, feeds, ort_too=True)


def _attention_model(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
                     past: tuple[np.ndarray, np.ndarray] | None = None, opset: int = 23,
                     **attrs: Any) -> tuple[Any, dict[str, np.ndarray]]:
    feeds = {"q": q, "k": k, "v": v}
    names = ["q", "k", "v", "", "", ""]
    if mask is not None:
        feeds["m"], names[3] = mask, "m"
    if past is not None:
        feeds["pk"], feeds["pv"] = past
        names[4:6] = ["pk", "pv"]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Attention", names, ["y", "present_k", "present_v", "qk"], **attrs)
    dtypes = {np.dtype(np.float32): F32, np.dtype(bool): BOOL}
    m = make_model([node], [(n, dtypes[a.dtype], a.shape) for n, a in feeds.items()],
                   [("y", F32), ("present_k", F32), ("present_v", F32), ("qk", F32)], opset=opset)
    return m, feeds


def test_attention() -> None:
    """3-D GQA with a past cache, a short bool mask (padded with 'masked') and causal (bottom-right
    by the past length); 4-D with a float mask, softcap, scale and each qk_matmul_output mode; a
    fully masked row gives 0, as onnx's reference and ONNX Runtime do."""
    b, sq, skv, past_len = 2, 3, 4, 2
    q, k, v = rand(b, sq, 4 * 6), rand(b, skv, 2 * 6, seed=1), rand(b, skv, 2 * 5, seed=2)
    past = (rand(b, 2, past_len, 6, seed=3), rand(b, 2, past_len, 5, seed=4))
    mask = np.random.default_rng(5).random((sq, skv + past_len)) > 0.3
    for causal in (0, 1):
        m, feeds = _attention_model(q, k, v, mask, past, q_num_heads=4, kv_num_heads=2, is_causal=causal)
        _check_ref(m, feeds, ort_too=True)
        # ONNX Runtime refuses a mask shorter than the keys; the reference pads it with "masked".
        m, feeds = _attention_model(q, k, v, mask[:, :-2], past, q_num_heads=4, kv_num_heads=2,
                                    is_causal=causal)
        _check_ref(m, feeds)
    q4, k4, v4 = rand(2, 3, 4, 8), rand(2, 3, 5, 8, seed=1), rand(2, 3, 5, 8, seed=2)
    fmask = rand(2, 1, 4, 5, seed=3)
    fmask[0, 0, 1, :] = -np.inf  # a fully masked query row
    for mode, softcap, causal in itertools.product((0, 1, 2, 3), (0.0, 2.5), (0, 1)):
        m, feeds = _attention_model(q4, k4, v4, fmask, None, qk_matmul_output_mode=mode, softcap=softcap,
                                    scale=0.3, is_causal=causal)
        if (mode == 0 and softcap) or (mode == 2 and causal):  # the reference and ORT disagree: refused
            with pytest.raises(UnsupportedOnnxError, match="ambiguous"):
                load_onnx(m)
            continue
        _check_ref(m, feeds, ort_too=True)
    # No mask but causal, float32, no qk output: the HIR attention op (backends fuse it), same numbers.
    for causal in (0, 1):
        m, feeds = _attention_model(q4, k4, v4, None, None, is_causal=causal, scale=0.4)
        m.graph.node[0].ClearField("output")
        m.graph.node[0].output.extend(["y"])
        del m.graph.output[1:]
        assert "attention" in {n.op for n in load_onnx(m).nodes}
        _check_ref(m, feeds, ort_too=True)
    # nonpad_kv_seqlen (a run-time input here: per-batch causal frontier and key padding) and the
    # Attention-25 sliding windows.
    for opset, attrs in ((24, {"is_causal": 1}), (25, {"is_causal": 1, "left_window_size": 1}),
                         (25, {"left_window_size": 2, "right_window_size": 0})):
        m, feeds = _attention_model(q4, k4, v4, None, None, opset=opset, **attrs)
        m.graph.node[0].input.extend(["", "", "", "n"])
        m.graph.input.append(helper.make_tensor_value_info("n", I64, [2]))
        feeds["n"] = np.array([5, 3], np.int64)
        m.graph.node[0].ClearField("output")
        m.graph.node[0].output.extend(["y"])
        del m.graph.output[1:]
        _check_ref(m, feeds)
    m, feeds = _attention_model(q4, k4, v4, None, None, opset=25, q_num_heads=3, kv_num_heads=3)
    with pytest.raises(UnsupportedOnnxError, match="must not set q_num_heads"):
        load_onnx(m)


def test_grid_sample() -> None:
    """Every mode x padding_mode x align_corners on a grid reaching past the borders (reflection
    folds several times), against ONNX Runtime and the reference; 3-D (volumetric) against the
    reference."""
    x = rand(2, 3, 5, 4)
    grid = (np.random.default_rng(1).random((2, 3, 6, 2)) * 5 - 2.5).astype(np.float32)
    grid[0, 0, :3] = [[-1, -1], [1, 1], [0.5, -0.25]]  # corners and exact half-pixel points
    pads = ("zeros", "border", "reflection")
    for mode, pad, align in itertools.product(("nearest", "linear", "cubic"), pads, (0, 1)):
        m = make_model([helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=pad,
                                         align_corners=align)],
                       [("x", F32, x.shape), ("g", F32, grid.shape)], [("y", F32)], opset=22)
        if mode == "cubic" and pad == "border":  # the reference and ONNX Runtime disagree: refused
            with pytest.raises(UnsupportedOnnxError, match="ambiguous"):
                load_onnx(m)
            continue
        _check_ref(m, {"x": x, "g": grid}, rel=1e-5, ort_too=True)
    x3 = rand(1, 2, 3, 4, 2)
    grid3 = (np.random.default_rng(2).random((1, 2, 3, 2, 3)) * 3 - 1.5).astype(np.float32)
    for mode, pad in itertools.product(("nearest", "linear"), ("zeros", "border")):
        m = make_model([helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=pad)],
                       [("x", F32, x3.shape), ("g", F32, grid3.shape)], [("y", F32)], opset=22)
        _check_ref(m, {"x": x3, "g": grid3})


def test_resize_symbolic_batch_and_static_spatial_fix() -> None:
    """A dynamic batch stays a symbol (only the resized axes must be static); a dynamic resized axis
    is refused with the symbols fix, and fixing the size imports it."""
    m = _resize_model(("N", 3, 4, 5), scales=(1, 1, 2, 2), mode="linear")
    x = rand(2, 3, 4, 5)
    close(rlx_run(m, {"x": x})[0], ort_run(m, {"x": x})[0], 1e-5, "symbolic batch")
    m = _resize_model((1, 3, "H", 5), scales=(1, 1, 2, 2), mode="nearest")
    with pytest.raises(UnsupportedOnnxError, match="symbolic") as e:
        load_onnx(m)
    assert "symbols=" in (e.value.fix or "")
    load_onnx(m, symbols={"H": 4})
