"""rlx-rocm without an AMD GPU: the device says it cannot execute, and every HIP kernel the conformance
suite's programs generate compiles with clang's AMDGPU back end into amdgcn code objects for gfx90a
and gfx942 (the verdict is "code generated and compiled", never "executed"). A missing clang-19
FAILS these tests (CI installs it: apt-get install clang-19 lld-19)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from rlx_conformance.hostile import hostile_graph, hostile_graph_count, hostile_names

from rlx_core import GraphBuilder, Session
from rlx_core.cli import cli
from rlx_core.ir.serialize import save
from rlx_core.plugin import BackendNotFoundError, DType, IRError

APT = "apt-get install -y clang-19 lld-19 llvm-19"
ARCHS = ("gfx90a", "gfx942")


def _tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed; these tests compile real AMDGPU code: {APT}", pytrace=False)
    return exe


@pytest.fixture(scope="module")
def clang() -> str:
    return _tool("clang-19")


@pytest.fixture(scope="module")
def checked(clang: str) -> Any:
    """Every kernel of every conformance program, compiled for both targets (once per module)."""
    from rlx_rocm.check import compile_check

    return compile_check(ARCHS)


def _readelf(data: bytes, tmp: Path, *flags: str) -> str:
    p = tmp / "k.hsaco"
    p.write_bytes(data)
    return subprocess.run([_tool("llvm-readelf-19"), *flags, str(p)], capture_output=True, text=True,
                          check=True).stdout


def _mlp() -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    g = GraphBuilder("rocm_mlp")
    x = g.input("x", "f32", ("batch", 20))
    w1 = g.param("w1", (rng.standard_normal((20, 33)) * 0.3).astype(np.float32))
    b1 = g.param("b1", rng.standard_normal(33).astype(np.float32))
    h = g.gelu(g.relu(x @ w1 + b1) * 0.5 - 1.0)
    g.output(g.softmax(h), "probs")
    g.output(g.layer_norm(h, g.param("g", np.ones(33, np.float32)), g.param("b", np.zeros(33, np.float32))),
             "normed")
    return g.build(), {"x": rng.standard_normal((3, 20)).astype(np.float32)}


# -- what the device says -----------------------------------------------------------------------

def test_doctor_says_no_device_and_what_it_can_do(clang: str) -> None:
    from rlx_rocm import plugin

    dev = plugin.rlx_probe_devices()[0]
    assert dev.name == "rocm:0" and not dev.available
    assert dev.reason.startswith("no ROCm device (libamdhip64 not found)")
    assert "not executed" in dev.details["offline"] and "gfx90a" in dev.details["offline"]
    # what `rlx doctor` lists next to the device: the export target and the compile-check command
    assert [e.target for e in plugin.rlx_exporters()] == ["rocm"]
    assert [c.name for c in plugin.rlx_cli_commands()] == ["rocm-compile-check"]


def test_compiling_for_the_device_refuses_instead_of_running_elsewhere() -> None:
    graph, _ = _mlp()
    with pytest.raises(BackendNotFoundError, match="no ROCm device"):
        Session("rocm", use_cache=False).compile(graph)


# -- every generated kernel compiles for real AMD targets ---------------------------------------

def test_every_conformance_kernel_compiles_for_gfx90a_and_gfx942(checked: Any, tmp_path: Path) -> None:
    from rlx_rocm.hip import kernel_name

    names = {kernel_name(s) for s in checked.sources}
    # the representative kernels are among them: matmul, reductions, softmax rows, layer norm,
    # data movement, and rendered elementwise programs (fused chains of the model graphs included)
    for want in ("rlx_matmul_f32", "rlx_reduce_sum_f32", "rlx_reduce_max_f32", "rlx_reduce_mean_f32",
                 "rlx_softmax_f32", "rlx_log_softmax_f32", "rlx_copy_f32", "rlx_gather_f32_i64"):
        assert want in names, want
    assert any(n.startswith("rlx_layer_norm_f32") for n in names)
    assert sum(n.startswith("rlx_ew_") for n in names) > 50
    assert checked.lowered > 1000 and len(checked.sources) > 100
    for arch in ARCHS:
        co = checked.objects[arch]
        assert co.is_amdgcn and set(co.kernels) == names
        # the device library functions are the only imports (a ROCm loader links ocml)
        assert set(co.undefined) <= {f"__ocml_{f}_f32" for f in
                                     ("exp", "log", "sqrt", "sin", "cos", "tanh", "erf", "floor", "ceil",
                                      "fabs", "rint", "pow")}
        head = _readelf(checked.images[arch], tmp_path, "-h")
        assert re.search(r"Machine:\s+EM_AMDGPU", head), head
        assert re.search(rf"Flags:\s+0x[0-9a-fA-F]+, {arch}\b", head), head
        syms = _readelf(checked.images[arch], tmp_path, "--dyn-syms")
        assert "rlx_matmul_f32.kd" in syms and "rlx_softmax_f32.kd" in syms
    assert checked.summary()["verdict"].startswith("code generated and compiled")


def test_a_kernel_that_does_not_compile_fails_the_check(clang: str) -> None:
    from rlx_rocm.hip import HIP, module
    from rlx_rocm.offline import build

    bad = HIP.kernel("rlx_bad", []) + "\n  y[gid] = undefined_thing;\n}\n"
    with pytest.raises(IRError, match="undefined_thing"):
        build(module([bad]), "gfx90a")
    # a call the device libraries do not provide is refused even though clang accepts it
    decl = 'extern "C" __device__ __attribute__((visibility("default"))) float mystery(float);\n'
    stray = decl + HIP.kernel("rlx_stray", [(DType.F32, "y", False)]) + "\n  y[gid] = mystery(1.0f);\n}\n"
    with pytest.raises(IRError, match=r"no ROCm device library provides.*mystery"):
        build(module([stray]), "gfx942")


def test_the_code_object_check_knows_the_arch(checked: Any) -> None:
    from rlx_rocm.offline import inspect

    assert not inspect(checked.images["gfx90a"], "gfx942").is_amdgcn
    assert inspect(checked.images["gfx942"], "gfx942").is_amdgcn
    with pytest.raises(IRError):
        inspect(b"not an elf at all" * 8, "gfx90a")


# -- rlx export --target rocm -------------------------------------------------------------------

def test_export_writes_source_code_objects_and_launch_table(clang: str, tmp_path: Path) -> None:
    graph, _ = _mlp()
    model = tmp_path / "mlp.rlx"
    save(graph, model)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["export", str(model), "--target", "rocm", "-o", str(out),
                                 "--bind", "batch=3", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["verdict"] == "code generated and compiled (not executed)"
    assert set(info["code_objects"]) == set(ARCHS)
    table = json.loads((out / "launches.json").read_text())
    text = (out / "kernels.hip").read_text()
    fns = {ln["function"] for ln in table["launches"]}
    assert {"rlx_matmul_f32", "rlx_softmax_f32"} <= fns
    for fn in fns:
        assert f" void {fn}(" in text
    for ln in table["launches"]:
        for a in ln["args"]:
            limit = table["arena_bytes"] if a["buffer"] == "arena" else table["constants_bytes"]
            assert 0 <= a["offset"] < limit
    assert (out / "constants.bin").stat().st_size == table["constants_bytes"]
    assert table["inputs"][0]["shape"] == [3, 20]
    from rlx_rocm.offline import inspect

    for arch in ARCHS:
        co = inspect((out / f"rlx_{arch}.hsaco").read_bytes(), arch)
        assert co.is_amdgcn and fns <= set(co.kernels)


def test_hostile_names_are_escaped_in_the_hip_source(clang: str, tmp_path: Path) -> None:
    from rlx_rocm.export import export_graph
    from rlx_rocm.offline import build

    dangerous = [n for n in hostile_names() if re.search(r"[\n\r\"'`]|\*/", n)]
    for k in range(hostile_graph_count()):
        graph, _ = hostile_graph(k)
        out = tmp_path / f"h{k}"
        export_graph(graph, out, build=False)
        text = (out / "kernels.hip").read_text()
        assert "launched by:" in text  # the node names are there, escaped
        for n in dangerous:
            assert n not in text, n
        assert "RLX_PWNED\");" not in text and "\r" not in text
        json.loads((out / "launches.json").read_text())  # names in the table are JSON strings
        if k == 0:
            build(text, "gfx90a")  # and the file still compiles as written
