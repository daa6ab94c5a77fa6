"""rlx-metal in "MSL on host" mode: the generated MSL compiled as C++ (clang++/g++) with the plugin's
``metal_stdlib`` compatibility header and run on the host, one loop trip per GPU thread.

Nothing here runs on an Apple GPU (that path needs macOS + metalcompute). A missing C++ compiler
is a failure, not a skip: the mode exists only with one.
"""

from __future__ import annotations

import collections
import shutil
import time

import numpy as np
import pytest

pytest.importorskip("rlx_metal")

from rlx_core import GraphBuilder, Session


@pytest.fixture(autouse=True)
def _host_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_METAL_MODE", "host")


def test_cxx_compiler_present() -> None:
    assert shutil.which("clang++") or shutil.which("g++"), "MSL on host needs clang++ or g++"


def test_device_says_msl_on_host() -> None:
    from rlx_core._hub import Hub

    b = Hub().load("metal")
    dev = b.device(0)
    assert dev.available, dev.reason
    assert dev.details["mode"] == "MSL on host"
    assert "Apple" not in dev.details.get("compiler", "")


def test_generated_msl_is_what_runs() -> None:
    from rlx_metal import host, msl
    from rlx_metal.program import _single

    from rlx_core.dtypes import DType

    name, src = msl.elementwise_source(_single("erf", 1, {}), (DType.F32,), DType.F32)
    assert src.startswith(f"kernel void {name}(") and "[[thread_position_in_grid]]" in src
    unit = msl.module([src])
    assert unit.startswith("#include <metal_stdlib>\nusing namespace metal;")
    assert "rlx_launch" in host.driver(src) and "rlx_launch" not in unit
    lib = host.build_all([src])[src]
    x = np.array([-2.0, -0.5, 0.0, 0.3, 1.0, 3.0], np.float32)
    y = np.zeros_like(x)
    import ctypes
    import math

    ptrs = (ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data)
    p = np.array([x.size, 1, x.size, 1], np.int32)
    lib.rlx_launch(ctypes.addressof(ptrs), p.ctypes.data)
    assert np.allclose(y, [math.erf(float(v)) for v in x], atol=2e-7)


def _mlp() -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    g = GraphBuilder("metal_mlp")
    x = g.input("x", "f32", ("batch", 20))
    w1 = g.param("w1", (rng.standard_normal((20, 33)) * 0.3).astype(np.float32))
    b1 = g.param("b1", rng.standard_normal(33).astype(np.float32))
    h = g.gelu(g.relu(x @ w1 + b1))
    g.output(g.softmax(h), "probs")
    return g.build(), {"x": rng.standard_normal((3, 20)).astype(np.float32)}


def test_mlp_run_profile_and_reference() -> None:
    from rlx_core.ir.reference import evaluate

    graph, feed = _mlp()
    exe = Session("metal").compile(graph)
    got = exe.run(**feed)["probs"]
    want = evaluate(graph, feed)["probs"]
    assert np.allclose(got, want, atol=1e-5)
    out, counts = exe.profile(**feed)
    assert counts and all(k.startswith("metal.") for k in counts)
    assert np.array_equal(out["probs"], got)


def test_conformance_certified_msl_on_host() -> None:
    from rlx_conformance.reuse import certified_or_run

    cert = certified_or_run("metal")  # CI's certification of metal when it ran (RLX_CERT_DIR)
    counts = cert.counts()
    skipped: collections.Counter[str] = collections.Counter(r.variant for r in cert.results
                                                             if r.status == "skipped")
    print("\nrlx-metal conformance (MSL on host):", counts, f"{cert.seconds:.1f}s")
    print("most-skipped variants:", skipped.most_common(12))
    bad = [f"{r.status} {r.id}: {r.message[:200]}" for r in cert.results
           if r.status in ("failed", "error", "xpassed")]
    assert not bad, "\n".join(bad[:30])
    assert cert.certified
    assert cert.device_details["mode"] == "MSL on host"
    assert counts["passed"] >= 1300
    v = cert.variants()
    for variant in ("matmul[f32]", "add[f32]", "softmax[f32]", "layer_norm[f32]", "exp[f32]"):
        assert v[variant]["verdict"] in ("certified", "partial"), (variant, v[variant])


SENTENCES = ["A man is eating food.", "Someone is having a meal.", "The weather is lovely today!"]


def test_minilm_parity_with_cpu() -> None:
    from rlx_core.models.minilm import MiniLM, ModelNotFoundError

    try:
        m = MiniLM()
    except ModelNotFoundError as e:
        pytest.skip(f"MiniLM not installed: {e.what}")
    t0 = time.perf_counter()
    want = m.embed(SENTENCES, device="cpu", batch_size=1)
    got = m.embed(SENTENCES, device="metal", batch_size=1)
    cos = np.sum(want * got, axis=1) / np.linalg.norm(want, axis=1) / np.linalg.norm(got, axis=1)
    print(f"\nMiniLM metal (MSL on host) vs cpu cosine: {cos}, max abs diff {np.abs(want - got).max():.3g} "
          f"({time.perf_counter() - t0:.1f}s)")
    assert cos.min() >= 0.9999
