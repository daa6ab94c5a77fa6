"""rlx-directx: HLSL compute shaders compiled to SPIR-V by glslang's HLSL front end and run on the
device kit's Vulkan runtime (lavapipe in CI). Device probing (its details say what runs), an MLP and
i64/bool programs against the float64 reference, and every elementwise op rendered by the shared
renderer's "hlsl" dialect and accepted by glslang's HLSL front end. A missing glslangValidator or
Vulkan device FAILS these tests (it does not skip): CI installs both. Op-level correctness is the
conformance suite's (`rlx conformance directx`, run by scripts/dev.sh)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _devicetests import probe, small_mlp

from rlx_core import GraphBuilder, Session
from rlx_core.ir.reference import evaluate

APT = ("apt-get install -y mesa-vulkan-drivers libvulkan1 glslang-tools "
       "(and pip install -e plugins/rlx-directx)")


@pytest.fixture(scope="module")
def device() -> Any:
    return probe("rlx_directx", "no usable device for rlx-directx (it needs Vulkan and glslang)",
                 "pip install -e plugins/rlx-directx; " + APT)


def _mlp() -> tuple[Any, dict[str, np.ndarray]]:
    return small_mlp("dx_mlp")


def test_device_says_what_runs(device: Any) -> None:
    assert device.name == "directx:0" and device.host_memory is False
    assert "SPIR-V" in device.details["runs"] and "no D3D12" in device.details["runs"]
    assert device.details["api"].startswith("Vulkan ") and device.details["glslang"]


def test_mlp_matches_reference_natively(device: Any) -> None:
    graph, inputs = _mlp()
    exe = Session("directx", use_cache=False).compile(graph)
    got = exe.run(inputs)["probs"]
    np.testing.assert_allclose(got, evaluate(graph, inputs)["probs"], rtol=1e-5, atol=1e-6)
    assert exe.report is not None
    assert all(e.device == "directx:0" for e in exe.report.entries)
    text = exe.report.to_text()
    assert "directx.linear" in text and "directx.softmax" in text and "directx.matmul" in text


def test_i64_word_pairs_and_bool(device: Any) -> None:
    """i64 values are (low, high) uint2 pairs in the HLSL library: wrap-around, signed order, casts."""
    g = GraphBuilder("dx_i64")
    a = g.input("a", "i64", (8,))
    b = g.input("b", "i64", (8,))
    g.output(g.add(g.mul(a, b), g.neg(a)), "mix")
    g.output(g.less(a, b), "lt")
    g.output(g.maximum(a, b), "hi")
    g.output(g.cast(a, to="i32"), "low")
    g.output(g.cast(a, to="f32"), "f")  # rounded once, to nearest even
    big = np.iinfo(np.int64)
    av = np.array([3, -7, big.max, big.min, 1 << 33, -(1 << 40) + 5, (1 << 40) + (1 << 16) + 1,
                   -((1 << 56) + (1 << 32))], np.int64)
    bv = np.array([-2, -7, 2, -1, (1 << 31) + 3, 1 << 20, 5, -3], np.int64)
    feed = {"a": av, "b": bv}
    got = Session("directx", use_cache=False).compile(g.build()).run(feed)
    want = evaluate(g.build(), feed)
    for k in ("mix", "lt", "hi", "low", "f"):
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_sin_cos_pow_accurate_for_large_and_special_arguments(device: Any) -> None:
    """The library's Payne-Hanek sin/cos (32-bit words + a double) and pow, against float64 NumPy."""
    g = GraphBuilder("dx_trig")
    x = g.input("x", "f32", (7,))
    y = g.input("y", "f32", (7,))
    g.output(g.sin(x), "s")
    g.output(g.cos(x), "c")
    g.output(g.pow(g.abs(x), y), "p")
    xv = np.array([3.0e30, -1.0e10, 7.0, 0.5, 1.0e-40, 123456.78, -3.4e38], np.float32)
    yv = np.array([0.0, -0.5, 2.5, 3.0, 0.25, -1.5, 0.125], np.float32)
    out = Session("directx", use_cache=False).compile(g.build()).run({"x": xv, "y": yv})
    x64 = xv.astype(np.float64)
    np.testing.assert_allclose(out["s"], np.sin(x64), rtol=0, atol=2e-7)
    np.testing.assert_allclose(out["c"], np.cos(x64), rtol=0, atol=2e-7)
    np.testing.assert_allclose(out["p"], np.abs(x64) ** yv.astype(np.float64), rtol=3e-7)


def _elementwise_ops() -> list[tuple[str, int, Any]]:
    from rlx_core.plugin import REGISTRY, DType

    out = []
    for name in sorted(REGISTRY.names()):
        s = REGISTRY.get(name)
        if not s.elementwise or s.expr is None or name in ("cast", "where"):
            continue
        for dt in (DType.F32, DType.I32, DType.BOOL):
            if dt in s.dtypes:
                out.append((name, len(s.inputs), dt))
    return out


def test_hlsl_dialect_renders_every_elementwise_op(tmp_path: Path) -> None:
    """Every elementwise op in the shared renderer's plain "hlsl" dialect, for each of f32/i32/bool it
    takes, inside one shader that glslang's HLSL front end must accept (sin/cos/pow as the plain
    dialect's built-ins; the kit library replaces them with its accurate helpers)."""
    from rlx_core.plugin import DType, render_program, single_op_program, vulkan

    exe = vulkan.glslang()
    if exe is None:
        pytest.fail(f"glslangValidator not found: {APT}")
    ops = _elementwise_ops()
    assert len(ops) > 40
    names = {DType.F32: "float", DType.I32: "int", DType.BOOL: "bool"}
    body, seen = [], set()
    for j, (op, nin, dt) in enumerate(ops):
        lines, res, rdt = render_program(single_op_program(op, nin, {}), [f"x{k}" for k in range(nin)],
                                         (dt,) * nin, "hlsl", prefix=f"r{j}_")
        args = ", ".join(f"{names[dt]} x{k}" for k in range(nin))
        body.append(f"{names[rdt]} f{j}({args}) {{\n  " + "\n  ".join(lines) + f"\n  return {res};\n}}")
        seen.add(op)
    calls = " + ".join(f"float(f{j}({', '.join(names[dt] + '(A[' + str(k) + '])' for k in range(nin))}))"
                       for j, (_, nin, dt) in enumerate(ops))
    src = ("RWStructuredBuffer<uint> A : register(u0);\n" + "\n".join(body)
           + f"\n[numthreads(1, 1, 1)]\nvoid main() {{ A[0] = asuint({calls}); }}\n")
    path = tmp_path / "all_ops.hlsl"
    path.write_text(src)
    argv = [exe, "-D", "-V", "-e", "main", "-S", "comp", str(path), "-o", str(tmp_path / "o.spv")]
    r = subprocess.run(argv, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {"add", "div", "exp", "erf", "round", "maximum", "logical_xor", "sign"} <= seen


def test_hlsl_library_translates_every_template() -> None:
    """The GLSL templates reach HLSL through hlsl.translate: no GLSL-only construct is left over."""
    from rlx_core.plugin import DType, glsl, hlsl

    fl = hlsl.SOURCE
    srcs = [glsl.copy32(fl), glsl.fill32(fl), glsl.copy8(fl), glsl.linear(fl), glsl.gather(fl, 8),
            glsl.matmul(fl, DType.F32), glsl.matmul_simple(fl, DType.I32),
            glsl.matmul_4x4(fl, DType.F32, "AW"),
            glsl.reduce(fl, "reduce_sum", DType.F32), glsl.rows(fl, "layer_norm"), glsl.scan(fl, DType.I32),
            glsl.argext(fl, "argmax", DType.F32), glsl.conv2d(fl, DType.F32), glsl.iota(fl, DType.I64)]
    for s in srcs:
        out = hlsl.translate(s)
        assert out.startswith(hlsl.HEADER) and "[numthreads(" in out
        for glsl_only in ("gl_", "BitsTo", "vec4", "barrier()", "#version", "layout("):
            assert glsl_only not in out.split("ConstantBuffer<RlxParams> pc;", 1)[1], glsl_only


def test_probe_without_glslang_reports_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_directx import plugin

    from rlx_core.plugin import vulkan

    monkeypatch.setattr(vulkan, "glslang", lambda: None)
    dev = plugin.rlx_probe_devices()[0]
    assert not dev.available and "glslangValidator" in dev.reason and "glslang-tools" in dev.reason
