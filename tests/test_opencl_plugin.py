"""rlx-opencl on PoCL's CPU device (or whatever OpenCL device is installed): device probing, model
graphs against the float64 reference, bool buffers, the authenticated binary cache. A missing
OpenCL platform FAILS these tests (it does not skip): CI installs PoCL. Op-level correctness is
the conformance suite's (`rlx conformance opencl`, run by scripts/dev.sh)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _devicetests import probe, small_mlp

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

APT = "apt-get install -y pocl-opencl-icd ocl-icd-libopencl1 (and pip install pyopencl rlx-opencl)"


@pytest.fixture(scope="module")
def device() -> Any:
    return probe("rlx_opencl", "no usable OpenCL device (an OpenCL platform)",
                 "pip install -e plugins/rlx-opencl; " + APT)


def _mlp() -> tuple[Any, dict[str, np.ndarray]]:
    return small_mlp("cl_mlp")


def test_device_names_platform_and_driver(device: Any) -> None:
    assert device.name == "opencl:0" and device.host_memory is False
    assert " / " in device.details["device"] and device.details["driver"]


def test_mlp_matches_reference_natively(device: Any) -> None:
    graph, inputs = _mlp()
    exe = Session("opencl", use_cache=False).compile(graph)
    got = exe.run(inputs)["probs"]
    want = evaluate(graph, inputs)["probs"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert exe.report is not None
    paths = {e.path for e in exe.report.entries}
    assert "native" in paths and all(e.device == "opencl:0" for e in exe.report.entries)


def test_bool_buffers_and_where(device: Any) -> None:
    """OpenCL kernels may not take bool pointers: bools live as uchar, converted on load/store."""
    g = GraphBuilder("cl_bool")
    a = g.input("a", "f32", (5,))
    b = g.input("b", "f32", (5,))
    m = g.less(a, b)
    g.output(m, "mask")
    g.output(g.where(m, a, b), "low")
    av = np.array([1, 5, -2, 3, np.inf], np.float32)
    bv = np.array([2, 4, -2, 9, 0], np.float32)
    out = Session("opencl", use_cache=False).compile(g.build()).run({"a": av, "b": bv})
    np.testing.assert_array_equal(out["mask"], av < bv)
    np.testing.assert_array_equal(out["low"], np.minimum(av, bv))


def test_binaries_are_authenticated_cache_entries(device: Any, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """pyopencl's own cache is never used; the device binary is an authenticated RLX entry, and an
    edited one is rebuilt from source, never loaded."""
    from rlx_opencl import runtime

    from rlx_core.plugin import read_entry

    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "cache"))
    label, dev = runtime.pick("")  # type: ignore[misc]
    comp = runtime.context(label, dev).compiler
    comp.forget()
    src = runtime.cstyle.fill_source(runtime.cstyle.OPENCL, runtime.cstyle.D.F32, "1.5f")[1]
    blob = comp.compile(src)
    (entry,) = (tmp_path / "cache").rglob("*.clbin")
    assert read_entry(entry) == blob
    entry.write_bytes(entry.read_bytes()[:-6] + b"PLANTD")
    comp.forget()
    assert comp.compile(src) and read_entry(entry) is not None  # rebuilt and re-sealed
    assert not list(Path.home().glob(".cache/pyopencl*/**/*rlx_fill*"))


def test_no_matching_device_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_opencl import plugin

    monkeypatch.setenv("RLX_OPENCL_DEVICE", "no-such-device-xyz")
    dev = plugin._probe()[0]
    assert not dev.available and "RLX_OPENCL_DEVICE" in dev.reason
