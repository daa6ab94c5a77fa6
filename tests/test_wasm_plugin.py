"""rlx-wasm: conformance (SIMD128 and scalar), MiniLM parity, profiling, export run under Node.js."""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("wasmtime")
pytest.importorskip("rlx_wasm")

from _devicetests import small_mlp

from rlx_core import GraphBuilder, Session
from rlx_core.errors import DispatchError, InputError

NODE = shutil.which("node")


def _mlp(batch: int | str = "batch") -> tuple[object, dict[str, np.ndarray]]:
    return small_mlp("wasm_mlp", batch)


def _skipped_by_variant(cert: object) -> dict[str, int]:
    c: collections.Counter[str] = collections.Counter()
    for r in cert.results:  # type: ignore[attr-defined]
        if r.status == "skipped":
            c[r.variant] += 1
    return dict(sorted(c.items()))


def _assert_certified(cert: object) -> None:
    counts = cert.counts()  # type: ignore[attr-defined]
    bad = [f"{r.status} {r.id}: {r.message[:200]}" for r in cert.results  # type: ignore[attr-defined]
           if r.status in ("failed", "error", "xpassed")]
    assert not bad, "\n".join(bad[:30])
    assert counts["failed"] == 0 and counts["error"] == 0 and counts["xpassed"] == 0
    assert cert.certified  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# discovery and the contract


def test_backend_is_discovered_as_whole_program() -> None:
    from rlx_core._hub import Hub

    b = Hub().load("wasm")
    assert b.info.name == "wasm" and b.info.whole_program
    dev = b.device(0)
    assert dev.available and dev.name == "wasm:0"
    assert "wasmtime" in dev.details["runtime"]


def test_conformance_certified_simd(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_conformance.reuse import certified_or_run

    # SIMD128 is the default: CI's certification of wasm is this run (RLX_CERT_DIR), reused here.
    monkeypatch.delenv("RLX_WASM_SIMD", raising=False)
    cert = certified_or_run("wasm")
    assert cert.device_details["simd128"] == "on"
    counts = cert.counts()
    print("\nrlx-wasm conformance (SIMD128):", counts, f"{cert.seconds:.1f}s")
    print("skipped (not certified) by variant:", _skipped_by_variant(cert))
    _assert_certified(cert)
    assert counts["passed"] >= 6300
    v = cert.variants()
    for variant in ("matmul[f32]", "add[f32]", "softmax[f32]", "layer_norm[f32]", "linear[f32]", "erf[f32]",
                    "exp[f32]", "transformer_encoder_layer[f32]", "native_kernels_ran", "determinism"):
        assert v[variant]["verdict"] == "certified", (variant, v[variant])


def test_conformance_certified_scalar(monkeypatch: pytest.MonkeyPatch) -> None:
    """RLX_WASM_SIMD=0: the same suite through the scalar kernels (an engine without SIMD)."""
    from rlx_conformance import run_suite

    monkeypatch.setenv("RLX_WASM_SIMD", "0")
    cert = run_suite("wasm")
    print("\nrlx-wasm conformance (scalar):", cert.counts(), f"{cert.seconds:.1f}s")
    _assert_certified(cert)
    assert cert.counts()["passed"] >= 6300


def test_unclaimed_variant_fails_compilation() -> None:
    g = GraphBuilder("sin")
    x = g.input("x", "f32", (4,))
    g.output(g.op("sin", x))
    with pytest.raises(DispatchError) as e:
        Session("wasm", use_cache=False).compile(g.build())
    assert "wasm" in str(e.value)


# ---------------------------------------------------------------------------------------------
# the artifact: SIMD switch, memory layout, profiling, zero-copy views


def test_simd_switch_changes_the_code_and_not_the_results(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_wasm.codegen import generate

    graph, feed = _mlp(3)
    got = {}
    for simd in ("1", "0"):
        monkeypatch.setenv("RLX_WASM_SIMD", simd)
        exe = Session("wasm", use_cache=False).compile(graph)
        got[simd] = exe.run(feed)["probs"]
        art = generate(exe.program(), simd == "1")
        if simd == "1":
            assert "f32x4.mul" in art.wat and "v128.load" in art.wat
        else:
            assert "v128" not in art.wat and "f32x4" not in art.wat
    want = Session("cpu", use_cache=False).compile(graph).run(feed)["probs"]
    np.testing.assert_allclose(got["1"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["0"], want, rtol=1e-5, atol=1e-6)


def _gemm_shapes() -> tuple[object, dict[str, np.ndarray]]:
    """GEMMs with every remainder: rows not a multiple of the tile, k < 4 and k % 4 != 0, columns
    not a multiple of 8 or 4, a batched matmul and linear layers with packed W^T."""
    rng = np.random.default_rng(1)
    g = GraphBuilder("wasm_gemms")
    a = g.input("a", "f32", (2, 9, 37))
    b = g.input("b", "f32", (2, 37, 21))
    x = g.input("x", "f32", (7, 3))
    w1 = g.param("w1", rng.standard_normal((13, 3)).astype(np.float32))
    b1 = g.param("b1", rng.standard_normal(13).astype(np.float32))
    w2 = g.param("w2", rng.standard_normal((16, 13)).astype(np.float32))
    b2 = g.param("b2", rng.standard_normal(16).astype(np.float32))
    g.output(a @ b, "mm")
    g.output(g.linear(g.linear(x, w1, b1), w2, b2), "lin")
    feed = {"a": rng.standard_normal((2, 9, 37)).astype(np.float32),
            "b": rng.standard_normal((2, 37, 21)).astype(np.float32),
            "x": rng.standard_normal((7, 3)).astype(np.float32)}
    return g.build(), feed


def test_js_tuning_changes_the_code_and_not_the_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """RLX_WASM_TUNE=js (what `rlx export` writes, for V8) picks other instructions for the GEMM
    than the wasmtime tuning, with bit-identical results (same sums in the same order)."""
    from rlx_wasm.codegen import CodegenError, generate

    monkeypatch.delenv("RLX_WASM_SIMD", raising=False)
    for graph, feed in (_gemm_shapes(), _mlp(3)):
        got = {}
        for tune in ("wasmtime", "js"):
            monkeypatch.setenv("RLX_WASM_TUNE", tune)
            exe = Session("wasm", use_cache=False).compile(graph)
            got[tune] = exe.run(feed)
            art = generate(exe.program(), True, tune)
            assert art.tune == tune
            if tune == "js":
                assert "v128.load32_splat" in art.wat and "i8x16.shuffle" not in art.wat
            else:
                assert "i8x16.shuffle" in art.wat
        want = Session("cpu", use_cache=False).compile(graph).run(feed)
        for name in want:
            np.testing.assert_array_equal(got["js"][name], got["wasmtime"][name])
            np.testing.assert_allclose(got["js"][name], want[name], rtol=1e-4, atol=1e-5)
    with pytest.raises(CodegenError) as e:
        generate(exe.program(), True, "spidermonkey")
    assert e.value.fix is not None and "js" in e.value.fix


def test_conformance_js_tuning_gemm_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ops whose code the js tuning changes, certified in that tuning (run in wasmtime)."""
    from rlx_conformance import run_suite

    monkeypatch.delenv("RLX_WASM_SIMD", raising=False)
    monkeypatch.setenv("RLX_WASM_TUNE", "js")
    cert = run_suite("wasm", keyword="matmul or linear or conv2d or attention or encoder or mlp or cnn")
    print("\nrlx-wasm conformance (js tuning, GEMM paths):", cert.counts(), f"{cert.seconds:.1f}s")
    _assert_certified(cert)
    assert cert.counts()["passed"] >= 100


def test_one_module_planned_memory_and_counted_calls() -> None:
    graph, feed = _mlp(3)
    exe = Session("wasm", use_cache=False).compile(graph)
    prog = exe.program()
    compiled = exe._specs[()][0]  # the WasmProgram of this specialisation
    art = compiled.artifact
    assert art.wasm[:4] == b"\0asm"
    # arena at a base offset; every value at base + plan offset
    for s in art.inputs:
        assert s.address == art.arena_offset + prog.plan.offsets[s.name]
    assert art.arena_offset >= art.weights_offset + art.weights_size
    # zero-copy: input/output arrays are views of linear memory
    for _, view in compiled.input_views:
        assert np.shares_memory(view, compiled.buffer)
    # profile counts what ran: one call per step, twice after two profiles, untouched by run()
    out, counts = exe.profile(feed)
    want = collections.Counter(s.kernel for s in prog.kernels)
    assert dict(counts) == dict(want)
    exe.run(feed)
    _, counts2 = exe.profile(feed)
    assert dict(counts2) == dict(want)
    for e in exe.report.entries:
        for k in e.kernels:
            assert counts[k] >= 1


def test_library_functions_accuracy(monkeypatch: pytest.MonkeyPatch) -> None:
    """exp/log/tanh/erf/sigmoid over dense grids, SIMD and scalar, within 3 ulp of float64."""
    x = np.concatenate([np.linspace(-20, 20, 40001), np.linspace(-1, 1, 20001),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 88.7, -103.0, 1e-30]]).astype(np.float32)
    pos = np.concatenate([np.geomspace(1e-38, 3e38, 20001), np.linspace(0.5, 2.0, 20001),
                          [0.0, np.inf, -1.0, np.nan, 1e-40]]).astype(np.float32)
    import math

    ref = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
           "erf": np.vectorize(math.erf, otypes=[np.float64])}
    for simd in ("1", "0"):
        monkeypatch.setenv("RLX_WASM_SIMD", simd)
        for op, fn in ref.items():
            xs = pos if op == "log" else x
            g = GraphBuilder(f"lib_{op}")
            t = g.input("x", "f32", xs.shape)
            g.output(g.op(op, t), "y")
            got = Session("wasm", use_cache=False).compile(g.build()).run(x=xs)["y"].astype(np.float64)
            with np.errstate(all="ignore"):
                want = fn(xs.astype(np.float64))
            assert np.array_equal(np.isnan(got), np.isnan(want)), op
            fin = np.isfinite(want)
            assert np.array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)]), op
            ulp = np.spacing(np.abs(want[fin]).astype(np.float32)).astype(np.float64)
            err = np.abs(got[fin] - want[fin]) / np.maximum(ulp, np.finfo(np.float32).smallest_subnormal)
            tiny = np.abs(want[fin]) < 1e-37  # subnormal results: absolute accuracy only
            assert err[~tiny].max() <= 3.0, (op, simd, float(err[~tiny].max()))


# ---------------------------------------------------------------------------------------------
# MiniLM parity


@pytest.fixture(scope="module")
def minilm() -> object:
    from rlx_core.models.minilm import MiniLM, ModelNotFoundError

    try:
        return MiniLM()
    except ModelNotFoundError as e:
        pytest.skip(f"MiniLM not installed: {e.what}")


SENTENCES = ["A man is eating food.", "Someone is having a meal.", "The weather is lovely today!"]


def test_minilm_parity_with_cpu(minilm: object, monkeypatch: pytest.MonkeyPatch) -> None:
    m = minilm
    t0 = time.perf_counter()
    want = m.embed(SENTENCES, device="cpu", batch_size=1)  # type: ignore[attr-defined]
    got = m.embed(SENTENCES, device="wasm", batch_size=1)  # type: ignore[attr-defined]
    cos = np.sum(want * got, axis=1) / np.linalg.norm(want, axis=1) / np.linalg.norm(got, axis=1)
    print(f"\nMiniLM wasm vs cpu cosine: {cos}, max abs diff {np.abs(want - got).max():.3g} "
          f"({time.perf_counter() - t0:.1f}s)")
    assert cos.min() >= 0.9999
    # the scalar build of the same graph
    monkeypatch.setenv("RLX_WASM_SIMD", "0")
    exe = Session("wasm", use_cache=False).compile(m.graph)  # type: ignore[attr-defined]
    ids, mask = m.pad(m.tokenize(SENTENCES[:1]))  # type: ignore[attr-defined]
    scalar = exe.run(input_ids=ids, attention_mask=mask)["embeddings"][0]
    c = float(scalar @ want[0] / np.linalg.norm(scalar) / np.linalg.norm(want[0]))
    print(f"MiniLM scalar wasm vs cpu cosine: {c}")
    assert c >= 0.9999


# ---------------------------------------------------------------------------------------------
# export: .wasm + weights + JS loaders, run under Node.js


def _node(script: Path) -> dict[str, object]:
    r = subprocess.run([NODE, str(script)], capture_output=True, text=True, timeout=120)  # type: ignore[list-item]
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_export_requires_static_shapes(tmp_path: Path) -> None:
    from rlx_wasm.export import export_wasm

    graph, _ = _mlp()
    with pytest.raises(InputError) as e:
        export_wasm(graph, tmp_path / "out")
    assert "--bind batch=" in e.value.fix


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_export_runs_under_node_esm_and_cjs(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from rlx_wasm.export import export_command

    from rlx_core.ir.serialize import save

    graph, feed = _mlp()
    x = feed["x"]
    save(graph, tmp_path / "mlp.rlx")
    out = tmp_path / "out"
    res = CliRunner().invoke(export_command, [str(tmp_path / "mlp.rlx"), "--target", "wasm", "-o", str(out),
                                              "--bind", "batch=3"])
    assert res.exit_code == 0, res.output
    for f in ("model.wasm", "weights.bin", "model.json", "rlx_model.mjs", "rlx_model.cjs"):
        assert (out / f).is_file(), f
    man = json.loads((out / "model.json").read_text())
    assert man["inputs"][0]["shape"] == [3, 20]
    assert man["tune"] == "js"  # exported modules are tuned for V8 unless --tune wasmtime
    assert man["weights"]["size"] == (out / "weights.bin").stat().st_size
    (out / "in.json").write_text(json.dumps({"x": x.ravel().tolist()}))
    (out / "esm.mjs").write_text(
        'import { load } from "./rlx_model.mjs";\nimport fs from "node:fs";\n'
        'const inp = JSON.parse(fs.readFileSync(new URL("./in.json", import.meta.url)));\n'
        "const m = await load();\nconst out = m.run({ x: Float32Array.from(inp.x) });\n"
        "console.log(JSON.stringify({ probs: Array.from(out.probs) }));\n")
    (out / "cjs.cjs").write_text(
        'const { load } = require("./rlx_model.cjs");\n'
        'const inp = JSON.parse(require("fs").readFileSync(__dirname + "/in.json"));\n'
        "load().then((m) => { const r = m.profile({ x: inp.x });\n"
        "  console.log(JSON.stringify({ probs: Array.from(r.outputs.probs), calls: r.calls })); });\n")
    want = Session("cpu", use_cache=False).compile(graph).run(feed)["probs"]
    esm = np.asarray(_node(out / "esm.mjs")["probs"], np.float32).reshape(want.shape)
    cjs = _node(out / "cjs.cjs")
    np.testing.assert_allclose(esm, want, rtol=1e-5, atol=1e-6)
    cjs_probs = np.asarray(cjs["probs"], np.float32).reshape(want.shape)
    np.testing.assert_allclose(cjs_probs, want, rtol=1e-5, atol=1e-6)
    assert cjs["calls"]["wasm.linear"] == 1 and cjs["calls"]["wasm.matmul"] == 1  # type: ignore[index]


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_export_minilm_under_node(minilm: object, tmp_path: Path) -> None:
    from rlx_wasm.export import export_wasm

    m = minilm
    ids, mask = m.pad(m.tokenize(SENTENCES[:1]), bucket=16)  # type: ignore[attr-defined]
    out = tmp_path / "minilm"
    export_wasm(m.graph, out, {"batch": 1, "seq": ids.shape[1]})  # type: ignore[attr-defined]
    (out / "in.json").write_text(json.dumps({"ids": ids.ravel().tolist(), "mask": mask.ravel().tolist()}))
    (out / "run.mjs").write_text(
        'import { load } from "./rlx_model.mjs";\nimport fs from "node:fs";\n'
        'const inp = JSON.parse(fs.readFileSync(new URL("./in.json", import.meta.url)));\n'
        "const m = await load();\n"
        "const feed = { input_ids: Float32Array.from(inp.ids),\n"
        "  attention_mask: Float32Array.from(inp.mask) };\n"
        "const out = m.run(feed);\n"
        "console.log(JSON.stringify({ e: Array.from(out.embeddings) }));\n")
    got = np.asarray(_node(out / "run.mjs")["e"], np.float32)
    want = m.executable("cpu").run(input_ids=ids, attention_mask=mask)["embeddings"][0]  # type: ignore[attr-defined]
    cos = float(got @ want / np.linalg.norm(got) / np.linalg.norm(want))
    print(f"\nMiniLM exported, Node.js vs rlx-cpu cosine: {cos}")
    assert cos >= 0.9999


def test_compiled_modules_cached_authenticated_and_rebuilt_when_tampered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wasmtime trusts serialized machine code completely: rlx-wasm keeps it only as the device
    kit's authenticated cache entries, and an edited entry is rebuilt, never deserialized."""
    from rlx_wasm import runtime

    from rlx_core.plugin import read_entry

    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "cache"))
    b = GraphBuilder("cwasm")
    x = b.input("x", "f32", (7,))
    b.output(b.mul(b.add(x, x), x))
    xv = np.arange(7, dtype=np.float32)

    def run() -> np.ndarray:
        runtime._MODULES.clear()
        for c in runtime._COMPILERS.values():
            c.forget()
        (out,) = Session("wasm", use_cache=False).compile(b.build()).run({"x": xv}).values()
        return np.asarray(out)

    np.testing.assert_array_equal(run(), (xv + xv) * xv)
    (entry,) = (tmp_path / "cache").rglob("*.cwasm")
    good = read_entry(entry)
    assert good
    entry.write_bytes(entry.read_bytes()[:-4] + b"EVIL")
    np.testing.assert_array_equal(run(), (xv + xv) * xv)  # rebuilt from the module, not loaded
    assert read_entry(entry) == good
