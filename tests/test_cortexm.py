"""rlx-cortexm: INT8 graphs as one C program, built with arm-none-eabi-gcc and run on QEMU (MPS2 boards).

Every result is compared bit for bit with the INT8 reference (rlx-cpu running the quantized ops
through their MIR decompositions, itself equal to the ops' exact NumPy references). These tests need
arm-none-eabi-gcc and qemu-system-arm; without them they FAIL (CI installs the Debian packages
gcc-arm-none-eabi and qemu-system-arm).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from rlx_conformance import run_suite
from rlx_conformance.reuse import certified_or_run
from rlx_cortexm import firmware
from rlx_cortexm.export import export_command, export_graph
from rlx_cortexm.program import CortexMProgram
from rlx_cortexm.targets import TARGETS, missing_reason, target

from rlx_core import GraphBuilder, Session
from rlx_core._hub import Hub
from rlx_core.errors import BackendNotFoundError, DispatchError
from rlx_core.ir.reference import evaluate
from rlx_core.ir.serialize import save
from rlx_core.quant import QUANT_OPS, quantize_graph
from rlx_core.quant.examples import random_cnn, split_digits, train_cnn, train_mlp

INT8_OPS = [op for op in QUANT_OPS if op != "dequantize_int4"]
QUANT_KEYWORD = " or ".join(f"op::{op}[" for op in INT8_OPS)
MIR_KEYWORD = " or ".join(f"op::{v}" for v in (
    "maximum[i8]", "argmax[i8]", "add[f32]", "reshape[i8]", "reshape[i32]", "reshape[f32]", "transpose[i8]",
    "transpose[i32]", "transpose[f32]"))


@pytest.fixture
def toolchain() -> None:
    why = missing_reason()
    if why:
        pytest.fail(f"rlx-cortexm cannot build or run firmware: {why}. The CI installs the Debian "
                    f"packages gcc-arm-none-eabi and qemu-system-arm "
                    f"(apt-get install gcc-arm-none-eabi qemu-system-arm).", pytrace=False)


# -- the conformance suite runs the INT8 op set on QEMU ------------------------------------------

def test_conformance_int8_ops_on_cortex_m4(toolchain: None) -> None:
    # Taken from CI's certification of cortexm:0 when it ran (RLX_CERT_DIR).
    cert = certified_or_run("cortexm:0", keyword=f"{QUANT_KEYWORD} or {MIR_KEYWORD} or contract::")
    c = cert.counts()
    bad = [(r.id, r.status, r.message[:300]) for r in cert.results
           if r.status in ("failed", "error", "xpassed")]
    assert not bad, bad
    assert cert.certified and c["passed"] >= 230, c
    v = cert.variants()
    for op in INT8_OPS:
        (key,) = [k for k in v if k.startswith(f"{op}[")]
        assert v[key]["verdict"] == "certified", (key, v[key])
    for key in ("maximum[i8]", "argmax[i8]", "add[f32]", "transpose[i8]", "reshape[i8]"):
        assert v[key]["verdict"] == "certified", (key, v[key])
    assert {r.path for r in cert.results if r.kind == "op" and r.path} == {"native"}
    # Float model ops are not claimed: skipped, i.e. not certified -- never passed.
    assert v["determinism"]["verdict"] == "not certified"


@pytest.mark.parametrize("index", [1, 2, 3], ids=[t.key for t in TARGETS[1:]])
def test_other_cores_give_the_same_bits(toolchain: None, index: int) -> None:
    kw = (f"({QUANT_KEYWORD}) and (basic or overflow or depthwise or per_channel or ties or inf or saturate) "
          f"and not twice")
    cert = run_suite(f"cortexm:{index}", keyword=kw)
    bad = [(r.id, r.status, r.message[:300]) for r in cert.results if r.status != "passed"]
    assert not bad, bad
    assert cert.counts()["passed"] >= 15


def test_float_graphs_are_not_claimed(toolchain: None) -> None:
    g = GraphBuilder("float_mlp")
    x = g.input("x", "f32", (2, 4))
    g.output(g.softmax(g.relu(x @ g.param("w", np.ones((4, 3), np.float32)))), "p")
    with pytest.raises(DispatchError) as e:
        Session("cortexm", use_cache=False).compile(g.build())
    assert "matmul" in str(e.value) and "cortexm" in str(e.value)


# -- the demonstration: digits MLP and CNN, trained in NumPy, quantized, run on QEMU ---------------

@pytest.fixture(scope="module")
def digits() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return split_digits(d.images, d.target)


@pytest.fixture(scope="module")
def quantized(digits: dict[str, np.ndarray]) -> dict[str, tuple[object, object]]:
    mlp = train_mlp(digits["x_train"], digits["y_train"])
    cnn = train_cnn(digits["x_train"].reshape(-1, 1, 8, 8), digits["y_train"])
    out = {}
    for name, g in (("mlp", mlp), ("cnn", cnn)):
        x = digits["x_train"][:400]
        out[name] = (g, quantize_graph(g, {"x": x.reshape(-1, 1, 8, 8) if name == "cnn" else x}))
    return out


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_digits_on_qemu_bit_exact(toolchain: None, digits: dict[str, np.ndarray],
                                  quantized: dict[str, tuple[object, object]], name: str) -> None:
    graph, q = quantized[name]
    n = 50
    x = digits["x_test"][:n]
    x = x.reshape(-1, 1, 8, 8) if name == "cnn" else x
    y = digits["y_test"][:n]
    want = Session("cpu", use_cache=False).compile(q).run(x=x)["probs"]  # the INT8 reference
    assert np.array_equal(want.astype(np.float64), evaluate(q, {"x": x})["probs"])
    float_probs = Session("cpu", use_cache=False).compile(graph).run(x=x)["probs"]
    lines = []
    for idx in (0, 1):  # Cortex-M4F (mps2-an386), Cortex-M7 (mps2-an500)
        exe = Session(f"cortexm:{idx}", use_cache=False).compile(q)
        got = exe.run(x=x)["probs"]
        assert got.dtype == np.float32 and got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
        assert all(e.path == "native" for e in exe.report.entries)
        fw1 = CortexMProgram(exe.program({"batch": 1}), target(idx))
        info = fw1.build()
        res = fw1.run({"x": x[:1]})
        assert np.array_equal(res["probs"], want[:1])
        assert fw1.last_run is not None and 0 < fw1.last_run.stack_peak_bytes < info.stack_bytes
        assert info.ram_bytes == info.bss + info.data and info.arena_bytes < info.ram_bytes
        assert info.flash_bytes < 32 * 1024 and info.ram_bytes < 8 * 1024
        lines.append(f"{target(idx).cpu}: flash {info.flash_bytes} B, RAM {info.ram_bytes} B (arena "
                     f"{info.arena_bytes} B + stack {info.stack_bytes} B reserved, "
                     f"{fw1.last_run.stack_peak_bytes} B used) for batch 1")
    acc_f = float((float_probs.argmax(1) == y).mean())
    acc_q = float((want.argmax(1) == y).mean())
    print(f"\n{name}: {n} held-out digits on QEMU, bit-exact with the INT8 reference; accuracy float "
          f"{100 * acc_f:.1f}%, int8 {100 * acc_q:.1f}%\n  " + "\n  ".join(lines))
    assert abs(acc_q - acc_f) <= 0.02 + 1e-9  # one image of 50 at most (360 images: tests/test_quant.py)


@pytest.mark.parametrize("index", [0, 3], ids=["m4", "m3"])
def test_layouts_depthwise_padding_and_two_outputs_on_qemu(toolchain: None, index: int) -> None:
    graph = random_cnn()
    x = np.random.default_rng(1).uniform(-1, 1, (24, 3, 9, 9)).astype(np.float32)
    q = quantize_graph(graph, {"x": x[:16]})
    want = Session("cpu", use_cache=False).compile(q).run(x=x[16:])
    exe = Session(f"cortexm:{index}", use_cache=False).compile(q)
    got = exe.run(x=x[16:])
    kernels = {k for e in exe.report.entries for k in e.kernels}
    assert {"cortexm.depthwise_conv_s8", "cortexm.convolve_s8", "cortexm.transpose", "cortexm.maximum_s8",
            "cortexm.avg_pool_s8", "cortexm.max_pool_s8"} <= kernels
    for k in ("features", "probs"):
        assert got[k].view(np.uint32).tolist() == want[k].view(np.uint32).tolist(), k


def test_profile_threads_and_determinism(toolchain: None, digits: dict[str, np.ndarray],
                                         quantized: dict[str, tuple[object, object]]) -> None:
    _, q = quantized["mlp"]
    x = digits["x_test"][:8]
    exe = Session("cortexm", use_cache=False).compile(q)
    out, counts = exe.profile(x=x)
    assert counts is not None
    kernels = [k for e in exe.report.entries for k in e.kernels]
    assert counts == {k: kernels.count(k) for k in kernels}  # each step's kernel ran once
    results: list[np.ndarray] = []

    def work() -> None:
        results.append(Session("cortexm", use_cache=False).compile(q).run(x=x)["probs"])

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and all(np.array_equal(r, out["probs"]) for r in results)


# -- rlx export --target cortexm ------------------------------------------------------------------

def test_export_writes_a_buildable_project(toolchain: None, tmp_path: Path, digits: dict[str, np.ndarray],
                                           quantized: dict[str, tuple[object, object]]) -> None:
    _, q = quantized["cnn"]
    x = digits["x_test"][:2].reshape(-1, 1, 8, 8)
    save(q, tmp_path / "cnn_int8.rlx")
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "fw"
    r = CliRunner().invoke(export_command, [str(tmp_path / "cnn_int8.rlx"), "--target", "cortexm",
                                            "-o", str(out), "--input", f"x={tmp_path / 'x.npy'}",
                                            "--cpu", "m7", "--build"])
    assert r.exit_code == 0, r.output
    assert "flash" in r.output and "arena" in r.output
    for f in ("Makefile", "rlx_model.c", "rlx_model.h", "rlx_kernels.c", "rlx_link.ld", "io.json",
              "rlx_in.bin", "firmware.elf"):
        assert (out / f).is_file(), f
    io = json.loads((out / "io.json").read_text())
    assert io["inputs"][0]["shape"] == [2, 1, 8, 8] and io["outputs"][0]["name"] == "probs"
    # Rebuild from the exported files alone (with make when it is installed), run on QEMU.
    (out / "firmware.elf").unlink()
    t = target("m7")
    if shutil.which("make"):
        res = subprocess.run(["make", "-s", "CPU=cortex-m7", "FPU=fpv5-sp-d16", "BOARD=mps2-an500"], cwd=out,
                             capture_output=True, text=True)
    else:
        res = subprocess.run(firmware.compile_command(t), cwd=out, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    if shutil.which("make"):  # the Makefile's `run` uses the runner's sandboxed QEMU flags
        run = subprocess.run(["make", "-s", "run", "BOARD=mps2-an500"], cwd=out, capture_output=True,
                             timeout=120)
    else:
        cmd = firmware.qemu_command(t, "firmware.elf", in_bytes=(out / "rlx_in.bin").stat().st_size)
        run = subprocess.run(cmd, cwd=out, capture_output=True, timeout=120)
    assert run.returncode == 0 and b"rlx: exit 0" in run.stdout, run.stdout + run.stderr
    got = np.frombuffer((out / "rlx_out.bin").read_bytes(), np.float32).reshape(2, 10)
    want = Session("cpu", use_cache=False).compile(q).run(x=x)["probs"]
    assert np.array_equal(got, want)


def test_export_needs_no_toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   quantized: dict[str, tuple[object, object]]) -> None:
    monkeypatch.setenv("RLX_CORTEXM_GCC", str(tmp_path / "no-such-gcc"))
    _, q = quantized["mlp"]
    info = export_graph(q, tmp_path / "fw", cpu="m4", bindings={"batch": 1})
    assert "rlx_model.c" in info["files"] and info["arena_bytes"] > 0
    assert "rlx_fully_connected_s8" in (tmp_path / "fw" / "rlx_model.c").read_text()


def test_lower_only_session_lowers_for_a_device_it_cannot_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quantized: dict[str, tuple[object, object]]) -> None:
    # A fresh hub: the device is probed with the toolchain missing (no cached probe can hide it).
    monkeypatch.setenv("RLX_CORTEXM_GCC", str(tmp_path / "no-such-gcc"))
    _, q = quantized["mlp"]
    s = Session("cortexm", hub=Hub(), use_cache=False, fusion=False, lower_only=True)
    assert not s.device.available
    program = s.lower(q, {"batch": 1})
    assert any(k.kernel.startswith("cortexm.") for k in program.kernels)
    with pytest.raises(BackendNotFoundError, match="lower_only"):
        s.compile(q)
    info = export_graph(q, tmp_path / "fw", cpu="m4", bindings={"batch": 1})
    assert "rlx_model.c" in info["files"]


def test_missing_toolchain_is_reported_with_the_package(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CORTEXM_GCC", str(tmp_path / "no-such-gcc"))
    dev = Hub().load("cortexm").devices()[0]
    assert not dev.available and "gcc-arm-none-eabi" in dev.reason
    with pytest.raises(BackendNotFoundError, match="gcc-arm-none-eabi"):
        Session("cortexm", hub=Hub(), use_cache=False)
