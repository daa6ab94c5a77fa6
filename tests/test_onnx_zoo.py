"""The ONNX model zoo (issue 17): real architectures, random weights, exported in the test, vs ONNX Runtime.

One case per (model, exporter, static/dynamic axes); the models and the comparison live in
tests/_zoo.py. The default run keeps a few representative cases (CI time); every other case carries
the ``zoo_slow`` marker and is skipped unless selected: ``pytest tests/test_onnx_zoo.py -m zoo_slow``
runs the rest, ``-m "zoo_slow or not zoo_slow"`` everything. Exported files are cached under
``.pytest_cache/rlx-onnx-zoo/`` keyed by the torch/torchvision/transformers/onnxscript versions and
_zoo.py's content (exports are deterministic: fixed seeds).

A case the importer cannot run yet is ``xfail(strict=True)`` with the missing piece as its reason
(``_GAPS`` below, also the table in docs/STATUS.md "ONNX model zoo"): a fix turns it into an XPASS
failure, so the list has to shrink with it; a listed case that fails with another error, or imports
and gives wrong numbers, fails outright.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import _zoo
import pytest

from rlx_core._hub import Hub, reset_hub

# find_spec, not importorskip: collection stays light, and torchvision must be imported through
# _zoo.torchvision() (PyPI's wheel needs its operator schemas declared first, see there).
_MISSING = [m for m in ("onnx", "onnxruntime", "torch", "torchvision", "transformers")
            if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"the ONNX zoo needs {', '.join(_MISSING)} (requirements/test.txt)", allow_module_level=True)

# Run by default (CI): one case per kind of model and exporter path, picked for a short export.
DEFAULT = {
    "mobilenet_v3_small-legacy-dynamic", "efficientnet_b0-legacy-static", "vit_hf-legacy-dynamic",
    "t5-legacy-static", "gpt2_past-legacy-static", "llama-legacy-static", "whisper_encoder-legacy-dynamic",
    "conv1d_audio-legacy-dynamic", "qwen2-dynamo-static", "lstm-legacy-static",
}

# missing piece -> (the error it gives, as a regex; the cases it fails), from running the whole zoo at HEAD
# with -m "zoo_slow or not zoo_slow"; docs/STATUS.md "ONNX model zoo" has the same table.
_GAPS: dict[str, tuple[str, list[str]]] = {
    "exporter: the legacy exporter bakes the traced sequence length (8) into a Reshape target": (
        r"has 256\*batch elements but the input \('seq', 'batch', 32\) has 32\*batch\*seq", [
        "multihead_attention-legacy-dynamic",
    ]),
    "exporter: torch.export fixes nn.LSTM/GRU's sequence length (8), so ONNX Runtime refuses another": (
        r"Got invalid dimensions for input: x", [
        "gru-dynamo-dynamic", "lstm-dynamo-dynamic",
    ]),
    "exporter: torch.export's FX decomposition fails on T5's attention reshape (Cannot view a tensor "
    "...); no ONNX file (the files it wrote on 2026-12-01 with the same versions import and match ORT: "
    "2.6e-7)": (
        r"Failed to decompose the FX graph", [
        "t5-dynamo-static", "t5-dynamo-dynamic",
    ]),
    "exporter: torch.export cannot trace batched_nms (data-dependent guard); no ONNX file": (
        r"Failed to export the model with torch\.export", [
        "retinanet_resnet50_fpn-dynamo-dynamic", "retinanet_resnet50_fpn-dynamo-static",
    ]),
}
# Models whose output shapes depend on data (detection: NMS keeps a data-dependent number of boxes):
# they run through the core's staged execution (rlx_core.frontends.onnx_staged), every stage on rlx-cpu.
STAGED = {"retinanet_resnet50_fpn"}
# Dynamic-axes files the IR cannot hold as one symbolic graph: run through staged execution's shape
# specialisation (imported and compiled once per input-shape signature), for this reason only. The
# importer unrolls LSTM/GRU over time steps; a loop region op would make them one graph.
SPECIALISED = {"lstm-legacy-dynamic": r"LSTM over the symbolic sequence length",
               "gru-legacy-dynamic": r"GRU over the symbolic sequence length"}
KNOWN: dict[str, str] = {cid: reason for reason, (_, ids) in _GAPS.items() for cid in ids}
_PATTERN = {cid: pat for pat, ids in _GAPS.values() for cid in ids}


def _cases() -> list[Any]:
    out = []
    for name, model in _zoo.ZOO.items():
        for exporter in _zoo.EXPORTERS:
            for axes in ("static", "dynamic"):
                cid = f"{name}-{exporter}-{axes}"
                marks = [] if cid in DEFAULT and not model.slow else [pytest.mark.zoo_slow]
                if cid in KNOWN:
                    # pytest.fail (a BaseException) in the test is never counted as the expected failure
                    marks.append(pytest.mark.xfail(reason=KNOWN[cid], strict=True, raises=Exception))
                out.append(pytest.param(name, exporter, axes == "dynamic", id=cid, marks=marks))
    return out


@pytest.fixture(scope="module")
def zoo_root(request: pytest.FixtureRequest) -> Path:
    # pytest's cacheprovider is off (addopts); its folder is still the conventional place
    return Path(str(request.config.rootpath)) / ".pytest_cache" / "rlx-onnx-zoo"


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Any:
    selected = "zoo_slow" in (request.config.option.markexpr or "")
    if request.node.get_closest_marker("zoo_slow") and not selected:
        pytest.skip("zoo_slow: run with -m zoo_slow")
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


@pytest.mark.parametrize("name,exporter,dynamic", _cases())
def test_zoo_model_matches_onnxruntime(name: str, exporter: str, dynamic: bool, zoo_root: Path) -> None:
    cid = f"{name}-{exporter}-{'dynamic' if dynamic else 'static'}"
    try:
        path = _zoo.export(name, exporter, dynamic, zoo_root)
        err = _zoo.compare(path, _zoo.check_feeds(name, dynamic), staged_ok=name in STAGED,
                             specialised_because=SPECIALISED.get(cid))
    except Exception as e:
        # A known case must fail for its listed reason: any other failure is news, not an xfail.
        if cid in _PATTERN and not re.search(_PATTERN[cid], str(e)):
            pytest.fail(f"{cid} no longer fails for its listed reason ({KNOWN[cid]}) but with: "
                        f"{type(e).__name__}: {str(e)[:2000]}", pytrace=False)
        raise
    if err > _zoo.RTOL:
        msg = f"{path.name}: max |rlx - ort| = {err:.3g} x output scale > {_zoo.RTOL}"
        if cid in KNOWN:  # wrong numbers are never an expected failure
            pytest.fail(f"{cid} now imports but gives wrong numbers: {msg}", pytrace=False)
        raise AssertionError(msg)


def test_zoo_lists_every_issue_model() -> None:
    # The issue's list: a model dropped from the zoo must be dropped here on purpose.
    assert len(_zoo.ZOO) == 30
    assert set(KNOWN) <= {p.id for p in _cases()}, "KNOWN names a case the zoo does not have"
    assert DEFAULT <= {p.id for p in _cases()}
