"""rlx-webgpu on wgpu-native over Mesa lavapipe (software Vulkan): device probing, an MLP against a
float64 reference, the tiled GPU matmul, conformance, and `rlx export --target webgpu` (the loader is
syntax-checked with node, and run under Deno's WebGPU when a `deno` is on PATH). Skipped, with the
reason, when wgpu-py or a WebGPU adapter is missing."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.errors import DispatchError

SETUP = ("apt-get install -y libvulkan1 mesa-vulkan-drivers (the lavapipe device) and "
         "pip install -e plugins/rlx-webgpu (pulls wgpu)")


@pytest.fixture(scope="module")
def device() -> object:
    try:
        from rlx_webgpu import plugin
    except Exception as e:  # pragma: no cover - environment problem
        pytest.skip(f"rlx_webgpu does not import ({type(e).__name__}: {e}); {SETUP}")
    dev = plugin.rlx_probe_devices()[0]
    if not dev.available:
        pytest.skip(f"no WebGPU adapter: {dev.reason}; {SETUP}")
    return dev


def _mlp() -> tuple[object, dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((20, 33)) * 0.3).astype(np.float32)
    b1 = rng.standard_normal(33).astype(np.float32)
    w2 = (rng.standard_normal((7, 33)) * 0.3).astype(np.float32)
    b2 = rng.standard_normal(7).astype(np.float32)
    gamma = rng.standard_normal(7).astype(np.float32)
    beta = rng.standard_normal(7).astype(np.float32)
    g = GraphBuilder("wg_mlp")
    x = g.input("x", "f32", ("batch", 20))
    h = g.linear(g.relu(x @ g.param("w1", w1) + g.param("b1", b1)), g.param("w2", w2), g.param("b2", b2))
    g.output(g.softmax(g.tanh(h)), "probs")
    g.output(g.layer_norm(h, g.param("gamma", gamma), g.param("beta", beta)), "ln")
    xv = rng.standard_normal((5, 20)).astype(np.float32)
    # the float64 reference, written out
    h64 = np.maximum(xv.astype(np.float64) @ w1 + b1, 0) @ w2.T.astype(np.float64) + b2
    e = np.exp(np.tanh(h64) - np.tanh(h64).max(-1, keepdims=True))
    mu, var = h64.mean(-1, keepdims=True), h64.var(-1, keepdims=True)
    want = {"probs": e / e.sum(-1, keepdims=True), "ln": (h64 - mu) / np.sqrt(var + 1e-5) * gamma + beta}
    return g.build(), {"x": xv}, want


def test_device_details(device: object) -> None:
    assert device.name == "webgpu:0" and device.host_memory is False  # type: ignore[attr-defined]
    details = device.details  # type: ignore[attr-defined]
    assert details["device"] and details["backend"] in ("Vulkan", "Metal", "D3D12", "DX12")


def test_probe_without_adapter_reports_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_webgpu import gpu, plugin

    def boom() -> object:
        raise RuntimeError("wgpu-native found no Vulkan/Metal/DX12 adapter")

    monkeypatch.setattr(gpu, "context", boom)
    dev = plugin.rlx_probe_devices()[0]
    assert dev.available is False and "no Vulkan/Metal/DX12 adapter" in dev.reason
    assert "mesa-vulkan-drivers" in dev.reason  # says how to fix it


def test_mlp_matches_float64_reference_and_profile(device: object) -> None:
    graph, inputs, want = _mlp()
    exe = Session("webgpu").compile(graph)
    got = exe.run(**inputs)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=2e-5, err_msg=k)
    text = exe.report.to_text()
    for k in ("webgpu.linear", "webgpu.matmul", "webgpu.softmax", "webgpu.layer_norm",
              "webgpu.fused_elementwise"):
        assert k in text, k
    compiled = next(iter(exe._specs.values()))[0]  # type: ignore[attr-defined]
    out, counts = compiled.profile(inputs)
    assert counts["webgpu.linear"] == 1 and counts["webgpu.softmax"] == 1
    assert sum(counts.values()) == len(compiled.program.kernels)
    again = exe.run(**inputs)  # a second run re-encodes the same pass: same bits
    assert all(np.array_equal(again[k], got[k]) for k in want)


def test_tiled_matmul_on_lavapipe(device: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workgroup-memory kernel a GPU adapter gets, forced on the CPU adapter: odd sizes (partial
    tiles) and a broadcast batch."""
    monkeypatch.setenv("RLX_WEBGPU_TILED", "1")
    rng = np.random.default_rng(1)
    g = GraphBuilder("tiled")
    a = g.input("a", "f32", (3, 37, 21))
    b = g.param("b", rng.standard_normal((21, 19)).astype(np.float32))
    g.output(a @ b, "y")
    av = rng.standard_normal((3, 37, 21)).astype(np.float32)
    exe = Session("webgpu").compile(g.build())
    compiled = next(iter(exe._specs.values()))[0]  # type: ignore[attr-defined]
    assert compiled.tiled
    got = exe.run(a=av)["y"]
    np.testing.assert_allclose(got, av.astype(np.float64) @ exe_weight(exe, "b"), rtol=1e-5, atol=1e-5)


def test_untiled_4x4_block_matmul(device: object) -> None:
    """M and N multiples of 4 take the 4x4-register-block kernel on a CPU adapter; both operands from
    the arena, and a constant right operand (baked into the shader as the constants array)."""
    rng = np.random.default_rng(2)
    g = GraphBuilder("blocks")
    a = g.input("a", "f32", (2, 8, 12))
    b = g.input("b", "f32", (12, 16))
    w = rng.standard_normal((16, 4)).astype(np.float32)
    g.output((a @ b) @ g.param("w", w), "y")
    av = rng.standard_normal((2, 8, 12)).astype(np.float32)
    bv = rng.standard_normal((12, 16)).astype(np.float32)
    exe = Session("webgpu").compile(g.build())
    got = exe.run(a=av, b=bv)["y"]
    compiled = next(iter(exe._specs.values()))[0]  # type: ignore[attr-defined]
    if not compiled.tiled:
        assert sum("vec4<f32>()" in ln.source for ln in compiled.all_launches()) == 2
    np.testing.assert_allclose(got, (av.astype(np.float64) @ bv) @ w, rtol=1e-5, atol=1e-5)


def exe_weight(exe: object, name: str) -> np.ndarray:
    compiled = next(iter(exe._specs.values()))[0]  # type: ignore[attr-defined]
    return np.asarray(compiled.program.graph.weights[name], np.float64)


def test_unsupported_variants_fail_to_compile(device: object) -> None:
    g = GraphBuilder("f64")
    x = g.input("x", "f64", (4,))
    g.output(g.op("exp", x), "y")
    with pytest.raises(DispatchError):
        Session("webgpu").compile(g.build())


def test_conformance_suite_zero_failures(device: object) -> None:
    from rlx_conformance.reuse import certified_or_run

    t = time.perf_counter()
    cert = certified_or_run("webgpu")  # CI's certification of webgpu when it ran (RLX_CERT_DIR)
    counts = cert.counts()
    print(f"\nwebgpu conformance: {counts} in {time.perf_counter() - t:.1f} s")
    bad = [f"{r.id}: {r.message[:300]}" for r in cert.results if r.status in ("failed", "error", "xpassed")]
    assert not bad, "\n".join(bad[:20])
    assert counts["passed"] >= 4000


_DRIVER = """import { load } from "./rlx_model.mjs";
const x = new Float32Array((await Deno.readFile(new URL("./x.bin", import.meta.url))).buffer);
const model = await load();
const out = await model.run({ x });
console.log(JSON.stringify(Object.fromEntries(Object.entries(out).map(([k, v]) => [k, Array.from(v)]))));
"""


def test_export_webgpu(device: object, tmp_path: Path) -> None:
    from rlx_webgpu.export import export_webgpu

    graph, inputs, want = _mlp()
    man = export_webgpu(graph, tmp_path, {"batch": 5})
    assert man["format"] == "rlx-webgpu/1" and man["inputs"][0]["shape"] == [5, 20]
    assert sorted(p.name for p in (tmp_path / "shaders").iterdir()) == [Path(s).name for s in man["shaders"]]
    assert json.loads((tmp_path / "model.json").read_text()) == man
    js = (tmp_path / "rlx_model.mjs").read_text()
    assert "export async function load" in js
    if shutil.which("node"):
        r = subprocess.run(["node", "--check", str(tmp_path / "rlx_model.mjs")], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
    deno = shutil.which("deno")
    if not deno:
        pytest.skip("no `deno` on PATH: the loader was checked but not run (npm install deno gives one "
                    "with WebGPU, which runs it on lavapipe)")
    inputs["x"].astype("<f4").tofile(tmp_path / "x.bin")
    (tmp_path / "main.mjs").write_text(_DRIVER)
    r = subprocess.run([deno, "run", "--allow-read", str(tmp_path / "main.mjs")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]).reshape(want[k].shape), want[k], rtol=2e-5, atol=2e-5)


def test_export_escapes_model_names(device: object, tmp_path: Path) -> None:
    from rlx_webgpu.export import export_webgpu

    g = GraphBuilder('evil */ </script> "name\u2028')
    x = g.input("x", "f32", (2, 3))
    g.output(g.relu(x), 'out"; alert(1); //')
    export_webgpu(g.build(), tmp_path)
    js = (tmp_path / "rlx_model.mjs").read_text()
    assert "</script>" not in js and "\u2028" not in js and 'out"; alert(1)' not in js
    first = js.splitlines()[0]
    assert first.startswith("// ") and "*/" not in first
    if shutil.which("node"):
        r = subprocess.run(["node", "--check", str(tmp_path / "rlx_model.mjs")], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
