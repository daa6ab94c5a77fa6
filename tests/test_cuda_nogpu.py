"""rlx-cuda on a machine without a GPU: the plugin loads and says why there is no device, and every
CUDA kernel it generates compiles with nvcc (``nvcc -ptx``) when the CUDA compiler is installed.

The plugin is found through a real ``rlx.backends`` entry point: the installed ``rlx-cuda``
distribution if there is one, else a dist-info written for this test over ``plugins/rlx-cuda/src``.
The kernels come from the CUDA backend's own dispatch of real graphs (gelu chains, bias + relu,
where/compare with broadcasting, f16/bf16 casts, integer chains): legalization and fusion need no
GPU, only the plugin's claims, so a stand-in device is probed for them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core._hub import Hub, reset_hub
from rlx_core.dtypes import DType
from rlx_core.errors import BackendNotFoundError
from rlx_core.fusion import FUSED

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "plugins" / "rlx-cuda" / "src"
RNG = np.random.default_rng(11)


@pytest.fixture
def cuda_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    try:
        metadata.distribution("rlx-cuda")
    except metadata.PackageNotFoundError:
        site = tmp_path / "site"
        info = site / "rlx_cuda-0.1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlx-cuda\nVersion: 0.1.0\n")
        (info / "entry_points.txt").write_text("[rlx.backends]\ncuda = rlx_cuda.plugin\n")
        monkeypatch.syspath_prepend(str(SRC))
        monkeypatch.syspath_prepend(str(site))
        monkeypatch.setenv("PYTHONPATH", f"{site}:{SRC}")
    hub = reset_hub(Hub())
    yield hub
    reset_hub(Hub())


def _no_gpu(hub: Hub) -> None:
    if any(d.available for d in hub.load("cuda").devices()):
        pytest.skip("a CUDA device is present: this test is for machines without one")


def test_plugin_imports_without_cupy_and_reports_no_device(cuda_plugin: Hub) -> None:
    code = "import sys, rlx_cuda.plugin; print('cupy' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**__import__("os").environ})
    assert r.stdout.strip() == "False", "importing the plugin must not import CuPy"
    _no_gpu(cuda_plugin)
    (dev,) = cuda_plugin.load("cuda").devices()
    assert not dev.available and dev.name == "cuda:0" and not dev.host_memory
    assert dev.reason.startswith("no CUDA device: ") and len(dev.reason) > len("no CUDA device: ") + 10


def test_reason_names_missing_cupy(cuda_plugin: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # as on a machine without CuPy
    from rlx_cuda.plugin import rlx_probe_devices

    (dev,) = rlx_probe_devices()
    assert not dev.available and dev.reason.startswith("no CUDA device: CuPy cannot be imported")
    assert "rlx-cuda[cuda12]" in dev.reason


def test_doctor_and_session_report_the_reason(cuda_plugin: Hub) -> None:
    from click.testing import CliRunner

    from rlx_core.cli import cli, doctor_report

    _no_gpu(cuda_plugin)
    rep = doctor_report(cuda_plugin)
    (rec,) = [b for b in rep["backends"] if b["name"] == "cuda"]
    assert rec["kind"] == "no available device" and "no CUDA device: " in rec["reason"]
    assert rec["devices"][0]["reason"].startswith("no CUDA device: ")
    assert rec["distributions"][0]["name"] == "rlx-cuda"
    out = CliRunner().invoke(cli, ["doctor"]).output
    assert "cuda" in out and "no CUDA device" in out, out
    with pytest.raises(BackendNotFoundError) as e:
        Session("cuda", hub=cuda_plugin)
    assert "no CUDA device: " in e.value.what


# -- every generated kernel compiles ------------------------------------------------------------

def _graphs() -> list[Any]:
    f32 = np.float32
    gs = []
    g = GraphBuilder("gelu_linear")  # linear + exact gelu + residual, as in a BERT FFN
    x = g.input("x", "f32", (8, 64))
    w = g.param("w", RNG.standard_normal((128, 64)).astype(f32))
    b = g.param("b", RNG.standard_normal(128).astype(f32))
    w2 = g.param("w2", RNG.standard_normal((64, 128)).astype(f32))
    b2 = g.param("b2", RNG.standard_normal(64).astype(f32))
    g.output(g.op("linear", g.op("gelu", g.op("linear", x, w, b)), w2, b2) + x, "y")
    gs.append(g.build())
    g = GraphBuilder("gelu_tanh_scale")
    x = g.input("x", "f32", (4, 3, 32))
    s = g.param("s", RNG.standard_normal((3, 1)).astype(f32))
    g.output(g.op("gelu", x * s, approximate="tanh") * 0.5, "y")
    gs.append(g.build())
    g = GraphBuilder("bias_relu")
    x = g.input("x", "f32", (16, 48))
    b = g.param("b", RNG.standard_normal(48).astype(f32))
    g.output(g.relu(x + b) - 1.0, "y")
    gs.append(g.build())
    g = GraphBuilder("where_compare")
    x = g.input("x", "f32", (3, 1))
    y = g.input("y", "f32", (1, 4))
    g.output(g.op("where", g.op("greater", x, y), x * 2.0, y - 1.0), "z")
    g.output(g.op("logical_and", g.op("less", x, y), g.op("not_equal", x, y)), "m")
    gs.append(g.build())
    for dt in ("f16", "bf16"):  # half types: the compute_f16_in_f32 rewrite, then fusion
        g = GraphBuilder(f"casts_{dt}")
        x = g.input("x", dt, (4, 32))
        y = g.input("y", dt, (32,))
        h = g.op("exp", x * y) + g.op("cast", g.op("cast", x, to="f32"), to=dt)
        g.output(h, "h")
        g.output(g.op("cast", g.op("sigmoid", g.op("cast", h, to="f32")), to="f64"), "d")
        g.output(g.op("cast", x, to="i32"), "i")
        gs.append(g.build())
    g = GraphBuilder("ints")
    a = g.input("a", "i32", (5, 6))
    c = g.input("c", "i64", (6,))
    q = g.op("cast", a, to="i64")
    g.output(g.op("abs", g.op("div", q * 3, c) - c) + g.op("sign", q), "r")
    g.output(g.op("cast", g.op("cast", a, to="f16"), to="f32"), "h")
    gs.append(g.build())
    g = GraphBuilder("attention_block")
    q = g.input("q", "f32", (2, 4, 8, 16))
    k = g.input("k", "f32", (2, 4, 8, 16))
    m = g.input("m", "i64", (2, 8))
    g.output(g.op("softmax", g.op("attention", q, k, k, m, mask="padding"), axis=-1), "o")
    gs.append(g.build())
    return gs


def _fake_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in available device: dispatch and fusion only read the plugin's claims."""
    from rlx_cuda import plugin

    from rlx_core.records import DeviceCaps, DeviceInfo

    caps = DeviceCaps(peak_flops={"default": 1e13}, mem_bandwidth=1e12, launch_overhead=5e-6,
                      host_link_bandwidth=2.5e10, source="test stand-in")
    dev = DeviceInfo("cuda", "cuda:0", True, caps, host_memory=False)
    monkeypatch.setattr(plugin, "_probe", lambda: [dev])


def _kernels_of(graph: Any, sess: Session) -> tuple[list[tuple[str, str]], list[str]]:
    from rlx_cuda import codegen
    from rlx_cuda.plugin import ELEMENTWISE

    legal, _ = sess.legalize(graph)
    out, fused = [], []
    g = legal.graph
    for node in g.nodes:
        if node.op != FUSED and node.op not in ELEMENTWISE:
            continue
        ins = [g.types[i] for i in node.inputs]
        t = g.types[node.outputs[0]]
        prog = (str(node.attrs["program"]) if node.op == FUSED
                else codegen.single_op_program(node.op, len(ins), dict(node.attrs)))
        if node.op == FUSED:
            fused.append(",".join(o[0] for o in __import__("json").loads(prog)["ops"]))
        lays, dims, _ = codegen.plan_layouts([tuple(i.shape) for i in ins], tuple(t.shape))
        for wide in (False, True):
            out.append(codegen.elementwise_source(prog, tuple(i.dtype for i in ins), t.dtype, lays,
                                                  len(dims), wide))
    return out, fused


def _every_single_op() -> list[tuple[str, str]]:
    """Each elementwise op for each dtype rlx-cuda claims it, flat and broadcast layouts."""
    from rlx_cuda import codegen
    from rlx_cuda.plugin import ELEMENTWISE, GEN, STORE

    from rlx_core.ir.schema import REGISTRY

    out = []
    for op in ELEMENTWISE:
        schema = REGISTRY.get(op)
        if op == "cast":
            for src in STORE:
                for to in STORE:
                    out.append(codegen.elementwise_source(codegen.single_op_program("cast", 1, {"to": to}),
                                                          (src,), to, "f", 0, False))
            continue
        for dt in sorted(set(schema.dtypes) & GEN, key=lambda d: d.value):
            n = len(schema.inputs)
            ins = (DType.BOOL, dt, dt) if op == "where" else (dt,) * n
            from rlx_core.ir.types import TensorType

            odt = schema.infer([TensorType(d, (2,)) for d in ins], schema.check_attrs({}, op))[0].dtype
            prog = codegen.single_op_program(op, n, {})
            out.append(codegen.elementwise_source(prog, ins, odt, "f" * n, 0, False))
            out.append(codegen.elementwise_source(prog, ins, odt, "b" + "s" * (n - 1), 2, True))
    return out


def _nvcc(sources: list[tuple[str, str]], tmp: Path, arch: str = "sm_90") -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        for cand in ("/usr/local/cuda/bin/nvcc",):
            if Path(cand).exists():
                nvcc = cand
    if nvcc is None:
        pytest.skip("nvcc not found: the generated CUDA kernels are NOT verified on this machine "
                    "(install the CUDA toolkit to compile them)")
    names = list(dict.fromkeys(n for n, _ in sources))
    text = "\n".join(dict.fromkeys(s for _, s in sources))
    cu, ptx = tmp / "kernels.cu", tmp / "kernels.ptx"
    cu.write_text(text)
    r = subprocess.run([nvcc, "-ptx", f"-arch={arch}", "--std=c++14", "-x", "cu", str(cu), "-o", str(ptx)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"nvcc failed on {cu}:\n{r.stderr[-4000:]}"
    entries = set(line.split()[-1].rstrip("(") for line in ptx.read_text().splitlines()
                  if ".entry" in line)
    missing = [n for n in names if n not in entries]
    assert not missing, f"kernels missing from the PTX: {missing[:5]}"


def test_fused_kernels_from_real_graphs_compile(cuda_plugin: Hub, monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    from rlx_cuda import codegen

    _fake_device(monkeypatch)
    sess = Session("cuda", hub=reset_hub(Hub()), use_cache=False)
    sources, chains = [], []
    for graph in _graphs():
        srcs, fused = _kernels_of(graph, sess)
        sources += srcs
        chains += fused
    # The chains the CUDA dispatch fused: gelu (erf and tanh forms), bias+relu, where/compare, casts.
    assert any("erf" in c for c in chains) and any("tanh" in c for c in chains), chains
    assert any("maximum" in c for c in chains) and any("where" in c and "greater" in c for c in chains)
    assert any(c.startswith("cast") and c.endswith("cast") for c in chains), chains
    sources += [*codegen.all_row_kernels(), codegen.minmax_check_source()]
    _nvcc(sources, tmp_path)


def test_every_single_op_kernel_compiles(cuda_plugin: Hub, tmp_path: Path) -> None:
    _nvcc(_every_single_op(), tmp_path)


def test_layouts_collapse_broadcast_dims(cuda_plugin: Hub) -> None:
    from rlx_cuda.codegen import plan_layouts

    assert plan_layouts([(3, 4), ()], (3, 4)) == ("fs", [], {})
    lays, dims, st = plan_layouts([(3, 4), (2, 3, 4)], (2, 3, 4))  # contiguous dims merge
    assert lays == "bf" and dims == [2, 12] and st == {0: [0, 1]}
    lays, dims, st = plan_layouts([(4,), (3, 1)], (2, 3, 4))
    assert lays == "bb" and dims == [2, 3, 4] and st == {0: [0, 0, 1], 1: [0, 1, 0]}
    lays, dims, st = plan_layouts([(2, 1, 4)], (2, 3, 4))
    assert dims == [2, 3, 4] and st == {0: [4, 0, 1]}
