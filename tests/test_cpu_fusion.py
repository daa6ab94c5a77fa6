"""rlx-cpu fused elementwise kernels: NumPy path for small tensors, Numba for large ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.codegen import render_program
from rlx_core.dtypes import DType
from rlx_core.fusion import FUSED, elementwise_groups, fuse
from rlx_core.ir.reference import evaluate

RNG = np.random.default_rng(5)


def _gelu_bias(rows: int, cols: int, dtype: str = "f32") -> object:
    g = GraphBuilder("gelu_bias")
    x = g.input("x", dtype, (rows, cols))
    b = g.param("b", RNG.standard_normal(cols).astype(DType.parse(dtype).np))
    s = g.param("s", RNG.standard_normal((rows, 1)).astype(DType.parse(dtype).np))
    h = (x + b) * s
    g.output(g.maximum(h * 0.5 * (g.erf(h * 0.7071067811865476) + 1.0), -x), "y")
    return g.build()


@pytest.mark.parametrize("rows", [4, 256])  # 4x384 runs the NumPy path, 256x384 the Numba kernel
@pytest.mark.parametrize("split", [False, True])  # True: rows split over the row pool
def test_fused_matches_reference(rows: int, split: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if split:
        monkeypatch.setattr("rlx_cpu.parallel.MIN_ELEMS_PER_THREAD", 256)
    graph = _gelu_bias(rows, 384)
    x = RNG.standard_normal((rows, 384)).astype(np.float32)
    exe = Session("cpu", use_cache=False).compile(graph)
    assert len(exe.report.fused) == 1 and len(exe.report.fused[0]) >= 7, exe.report.fused
    got = exe.run(x=x)["y"]
    want = evaluate(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_fused_nan_propagates_and_f64() -> None:
    graph = _gelu_bias(128, 512, "f64")
    x = RNG.standard_normal((128, 512))
    x[3, 7] = np.nan
    got = Session("cpu", use_cache=False).compile(graph).run(x=x)["y"]
    want = evaluate(graph, {"x": x})["y"]
    assert np.isnan(got[3, 7])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_groups_respect_outside_uses_and_shapes() -> None:
    g = GraphBuilder("t")
    x = g.input("x", "f32", (8, 4))
    a = g.exp(x)
    b = a * 2.0
    r = g.reduce_sum(a, axes=(1,), keepdims=True)  # `a` is used outside: it cannot be fused away
    g.output(b + r)
    graph = g.build()
    groups = elementwise_groups(graph)
    assert [[n.op for n in grp] for grp in groups] == [["mul", "add"]]
    fused, names = fuse(graph)
    assert names == [["mul_0", "add_0"]] and sum(n.op == FUSED for n in fused.nodes) == 1


def test_second_process_reuses_the_compiled_kernel(tmp_path: Path) -> None:
    code = (
        "from rlx_core import GraphBuilder, Session\n"
        "from rlx_cpu import fused\n"
        "g = GraphBuilder('k'); x = g.input('x', 'f32', (256, 512))\n"
        "g.output(g.erf(x * 3.0 + 1.0) * x)\n"  # erf: generated at any size (tanh now runs as NumPy)
        "exe = Session('cpu').compile(g.build())\n"
        "(mod,) = fused._MODULES.values()\n"
        "k = mod.k_rows\n"
        "print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))\n"
    )
    env = {"RLX_CACHE_DIR": str(tmp_path), "HOME": str(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "nb")}
    stats = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        stats.append(tuple(int(v) for v in r.stdout.split()))
    assert list((tmp_path / "cpu-numba").glob("rlx_fused_*.py"))
    assert stats[0] == (0, 1)  # first process compiles ...
    assert stats[1] == (1, 0)  # ... the second loads the machine code from the disk cache


def test_renderer_c_dialect_compiles(tmp_path: Path) -> None:
    """The C dialect's output is real C: compile it with the system compiler and run it."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler on this machine; the C dialect cannot be verified")
    program = ('{"ops":[["mul",["i0","i1"],{}],["add",["t0","i1"],{}],["erf",["t1"],{}],'
               '["maximum",["t2","i0"],{}],["sigmoid",["t3"],{}]],"out":"t4"}')
    lines, res, _ = render_program(program, ["a[i]", "b"], [DType.F32, DType.F32], "c")
    head = "#include <math.h>\n#include <stdio.h>\n#include <stdbool.h>\n"
    src = (head + "int main(void){float a[3]={-1.5f,0.25f,2.0f};float b=0.5f;for(int i=0;i<3;i++){"
           + "".join(lines) + f'printf("%.9g\\n",(double){res});}}return 0;}}')
    (tmp_path / "k.c").write_text(src)
    subprocess.run([cc, "-O2", "-o", str(tmp_path / "k"), str(tmp_path / "k.c"), "-lm"], check=True)
    out = subprocess.run([str(tmp_path / "k")], capture_output=True, text=True, check=True).stdout.split()
    from scipy.special import erf, expit

    a = np.array([-1.5, 0.25, 2.0])
    want = expit(np.maximum(erf(a * 0.5 + 0.5), a))
    np.testing.assert_allclose(np.array(out, float), want, rtol=1e-6)


@pytest.mark.parametrize("op", ["exp", "tanh", "sigmoid", "erf"])
def test_vectorised_transcendentals_on_large_tensors(op: str) -> None:
    """The chunked Numba path (f32, >= 32768 elements) against the float64 reference, specials too."""
    g = GraphBuilder(op)
    x = g.input("x", "f32", (64, 1024))
    g.output(g.op(op, x * 1.0) + 0.0, "y")  # a chain, so it is fused
    graph = g.build()
    xv = (RNG.standard_normal((64, 1024)) * 4).astype(np.float32)
    xv[0, :6] = [np.nan, np.inf, -np.inf, 0.0, 90.0, -90.0]
    exe = Session("cpu", use_cache=False).compile(graph)
    assert exe.report.fused, exe.report.to_text()
    got = exe.run(x=xv)["y"]
    want = evaluate(graph, {"x": xv})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1.2e-38)
    assert np.array_equal(np.isnan(got), np.isnan(want))
