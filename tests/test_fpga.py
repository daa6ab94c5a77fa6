"""rlx-fpga: INT8 graphs as synthesizable Verilog, simulated with Icarus Verilog, sized with yosys.

Every simulated result is compared bit for bit with the INT8 reference (rlx-cpu running the quantized
ops through their MIR decompositions). These tests need iverilog (with vvp) and yosys; without them
they FAIL (Debian packages: iverilog, yosys).
"""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest
from click.testing import CliRunner
from rlx_conformance import run_suite
from rlx_conformance.reuse import certified_or_run
from rlx_fpga import synth
from rlx_fpga.export import export_command, export_graph, lower_graph
from rlx_fpga.program import FPGAProgram
from rlx_fpga.rtl import matmul_cycles

from rlx_core import GraphBuilder, Session
from rlx_core.errors import DispatchError
from rlx_core.ir.serialize import save

CLAIMED = ("matmul_i8[", "requantize[", "maximum[i8]", "reshape[i8]", "reshape[i32]", "reshape[f32]",
           "add[f32]")


@pytest.fixture
def tools() -> None:
    missing = [t for t in ("iverilog", "vvp", "yosys") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"rlx-fpga needs {', '.join(missing)}: install the Debian packages iverilog and yosys "
                    f"(apt-get install iverilog yosys).", pytrace=False)


def test_conformance_int8_ops_simulated(tools: None) -> None:
    # The whole suite (unclaimed ops and checks are skipped: not certified); CI's certification of
    # fpga:0 when it ran (RLX_CERT_DIR).
    cert = certified_or_run("fpga:0")
    c = cert.counts()
    bad = [(r.id, r.status, r.message[:300]) for r in cert.results
           if r.status in ("failed", "error", "xpassed")]
    assert not bad, bad
    assert c["passed"] >= 70 and cert.certified, c
    claimed = tuple(f"op::{k}" for k in CLAIMED)
    assert sum(r.status == "passed" for r in cert.results if r.id.startswith(claimed)) >= 90
    v = cert.variants()
    for key in ("matmul_i8[i8]", "requantize[i32]", "maximum[i8]", "reshape[i8]", "reshape[i32]", "add[f32]"):
        assert v[key]["verdict"] == "certified", (key, v[key])
    assert {r.path for r in cert.results if r.kind == "op" and r.status == "passed"} <= {"native", ""}


def test_eight_macs_give_the_same_bits(tools: None) -> None:
    cert = run_suite("fpga:1", keyword="op::matmul_i8[ and not twice")
    bad = [(r.id, r.status, r.message[:300]) for r in cert.results if r.status != "passed"]
    assert not bad and cert.counts()["passed"] >= 8, bad


def test_f32_adder_is_ieee_exact(tools: None) -> None:
    """The add[f32] unit (rlx doctor's x + 1) against NumPy, bit for bit: random bit patterns
    (NaN, Inf, subnormals), cancellations, tiny addends, a broadcast constant."""
    rng = np.random.default_rng(3)
    n = 3000

    def mk() -> np.ndarray:
        a = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
        a[:500] = rng.standard_normal(500).astype(np.float32)
        a[500:1000] = (rng.integers(0, 2**23, 500).astype(np.uint32) | np.uint32(1 << 31)).view(np.float32)
        a[1000:1008] = [np.inf, -np.inf, 0.0, -0.0, np.nan, 3.4e38, -1e-45, 1.0]
        return a

    x, y = mk(), mk()
    with np.errstate(all="ignore"):
        y[1500:2000] = -x[1500:2000] * np.float32(1 + 2**-20)
        y[2000:2500] = -np.nextafter(x[2000:2500], np.float32(np.inf))
    g = GraphBuilder("fadd")
    a, b = g.input("x", "f32", (n,)), g.input("y", "f32", (n,))
    g.output(g.op("add", g.op("add", a, b), g.param("c", np.float32([0.5]))), "z")
    with np.errstate(all="ignore"):
        want = (x + y) + np.float32(0.5)
    got = Session("fpga", use_cache=False).compile(g.build()).run(x=x, y=y)["z"]
    same = (want.view(np.uint32) == got.view(np.uint32)) | (np.isnan(want) & np.isnan(got))
    assert same.all(), np.where(~same)[0][:10]


def test_float_graphs_are_not_claimed(tools: None) -> None:
    g = GraphBuilder("float_mlp")
    x = g.input("x", "f32", (2, 4))
    g.output(g.relu(x @ g.param("w", np.ones((4, 3), np.float32))), "y")  # f32 matmul: not claimed
    with pytest.raises(DispatchError) as e:
        Session("fpga", use_cache=False).compile(g.build())
    assert "fpga" in str(e.value)


def test_exporting_a_float_graph_names_the_fix(tmp_path: object) -> None:
    # Was a raw ValueError (or a DTypeError about a node the user never wrote), found by fuzzing.
    g = GraphBuilder("float_mlp")
    x = g.input("x", "f32", (2, 4))
    g.output(g.relu(x @ g.param("w", np.ones((4, 3), np.float32))), "y")
    with pytest.raises(DispatchError, match="no integer core") as e:
        export_graph(g.build(), tmp_path)
    assert "rlx quantize" in str(e.value)


# -- demonstration: the PTQ digits MLP, simulated bit-exact -------------------------------------

@pytest.fixture(scope="module")
def mlp() -> dict[str, object]:
    from rlx_fpga.demo import digits_mlp

    return digits_mlp(40, parallel=4)


def test_digits_mlp_bit_exact_in_simulation(tools: None, mlp: dict[str, object]) -> None:
    r = mlp
    logits, ref = np.asarray(r["logits"]), np.asarray(r["ref_logits"])
    assert logits.dtype == np.int8 and np.array_equal(logits, ref)
    probs, want = np.asarray(r["probs"]), np.asarray(r["ref_probs"])
    assert probs.view(np.uint32).tolist() == want.view(np.uint32).tolist()  # end to end, bit for bit
    kernels = r["program"].kernels  # type: ignore[attr-defined]
    assert kernels.count("fpga.mac_array") == 2 and "fpga.requantize" in kernels
    assert "fpga.maximum_s8" in kernels
    run = r["run"]
    n = len(logits)
    macs = n * (matmul_cycles(1, 32, 64, 4) + matmul_cycles(1, 10, 32, 4))
    model = r["program"].design.cycle_model  # type: ignore[attr-defined]
    assert model == macs + n * (32 + 32 + 10) + 3  # MAC blocks + one element per cycle (+1 per step)
    assert abs(run.cycles_busy - model) <= 8, (run.cycles_busy, model)  # type: ignore[attr-defined]
    assert r["acc_int8"] >= 0.75
    print(f"\ndigits MLP 64-32-10: {n} held-out images simulated (4 MACs), bit-exact with the INT8 "
          f"reference; accuracy float {100 * r['acc_float']:.1f}%, int8 {100 * r['acc_int8']:.1f}%; "  # type: ignore[operator]
          f"{run.cycles_busy} compute cycles ({run.cycles_busy / n:.0f} per image), "  # type: ignore[attr-defined]
          f"{run.cycles_total} with streaming")  # type: ignore[attr-defined]


def test_export_command_writes_rtl(tools: None, mlp: dict[str, object], tmp_path: object) -> None:
    model = tmp_path / "mlp_int8.rlx"  # type: ignore[operator]
    save(mlp["q"], model)
    out = tmp_path / "rtl"  # type: ignore[operator]
    res = CliRunner().invoke(export_command, [str(model), "--target", "fpga", "-o", str(out), "--bind",
                                              "batch=1", "--json"])
    assert res.exit_code == 0, res.output
    names = {p.name for p in out.iterdir()}
    assert {"rlx_top.v", "tb.v", "README.md", "io.json"} <= names
    assert sum(n.endswith(".mem") for n in names) >= 8
    assert "$readmemh" in (out / "rlx_top.v").read_text()
    # the core's `rlx export --target fpga` routes here
    from rlx_core.export_cmd import export_command as core_export

    out2 = tmp_path / "rtl2"  # type: ignore[operator]
    res = CliRunner().invoke(core_export, [str(model), "--target", "fpga", "-o", str(out2), "-p", "8"])
    assert res.exit_code == 0, res.output
    assert "8 MACs" in res.output and (out2 / "v_q_w1_q_0__b7.mem").exists()  # bank 7 of a weight ROM


# -- yosys: resource estimates, fed to the kernel cost ------------------------------------------

def _small_design(tmp: object) -> object:
    rng = np.random.default_rng(0)
    g = GraphBuilder("dense_small")
    x = g.input("x", "i8", (1, 32))
    w = g.param("w", rng.integers(-127, 128, (8, 32)).astype(np.int8))
    b = g.param("b", rng.integers(-500, 500, (8,)).astype(np.int32))
    acc = g.op("matmul_i8", x, w, b, x_zero_point=-3)
    m = g.param("m", np.full((8,), 1 << 30, np.int32))
    s = g.param("s", np.full((8,), -7, np.int32))
    y = g.op("requantize", acc, m, s, zero_point=-5)
    g.output(g.op("maximum", y, g.const(-5, "i8")), "y")
    graph = g.build()
    out = tmp / "small"  # type: ignore[operator]
    export_graph(graph, out, parallel=2)
    return graph, out


def test_yosys_resources_parsed_and_used_in_cost(tools: None, tmp_path: object) -> None:
    graph, out = _small_design(tmp_path)
    res: dict[str, synth.Resources] = {}

    def go(fam: str) -> None:
        res[fam] = synth.synthesize(out, fam)  # type: ignore[arg-type]

    threads = [threading.Thread(target=go, args=(f,)) for f in ("ice40", "xilinx")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(res) == {"ice40", "xilinx"}, res
    ice, xil = res["ice40"], res["xilinx"]
    assert ice.luts > 0 and ice.ffs > 0 and ice.dsps >= 1 and ice.cells["SB_LUT4"] == ice.luts
    assert xil.luts > 0 and xil.ffs > 0 and xil.dsps >= 1
    print(f"\n{ice.summary()}\n{xil.summary()}")
    # the kernel cost of a large matmul is capped by the DSPs the report says the part has left
    from rlx_fpga.plugin import rlx_kernel_cost

    from rlx_core._hub import Hub

    program = lower_graph(graph)
    exe = FPGAProgram(program, parallel=2)
    xin = np.arange(32, dtype=np.int8).reshape(1, 32)
    got = exe.run({"x": xin})
    want = Session("cpu", use_cache=False).compile(graph).run(x=xin)["y"]
    assert np.array_equal(next(iter(got.values())), want)
    from rlx_core.dtypes import DType
    from rlx_core.ir.types import TensorType
    from rlx_core.records import KernelClaim, NodeVariant

    dev = Hub().load("fpga").devices()[0]
    claim = KernelClaim("matmul_i8", "fpga.mac_array")

    def cost(m: int, n: int, k: int) -> float:
        v = NodeVariant("matmul_i8", (TensorType(DType.I8, (m, k)), TensorType(DType.I8, (n, k)),
                                      TensorType(DType.I32, (n,))), (TensorType(DType.I32, (m, n)),), {})
        return float(rlx_kernel_cost(claim, v, dev.caps))

    p = synth.effective_parallel(4)
    assert 1 <= p <= 4
    assert cost(1, 256, 256) == pytest.approx(matmul_cycles(1, 256, 256, p) / 24e6)
    assert cost(1, 256, 256) > cost(1, 16, 16) > 0
    synth.LATEST["ice40"] = synth.Resources("ice40", 1, 1, 64, 0, {})  # a design needing 64 DSPs for 4 MACs
    assert synth.effective_parallel(4, "ice40") == 1  # 16 DSPs per MAC: the UP5K's 8 fit none, keep 1
    assert cost(1, 256, 256) == pytest.approx(matmul_cycles(1, 256, 256, 1) / 24e6)
    synth.LATEST.clear()


def test_digits_cnn_bit_exact(tools: None) -> None:
    """The PTQ digits CNN (conv2d_i8, max_pool2d_i8, avg_pool2d_i8, matmul_i8) on the RTL: logits and
    probabilities bit for bit equal to the INT8 reference on rlx-cpu, for 8 held-out images."""
    from rlx_fpga.demo import digits_cnn

    r = digits_cnn(8)
    assert r["logits"].shape == (8, 10)
    np.testing.assert_array_equal(r["logits"], r["ref_logits"])
    np.testing.assert_array_equal(r["probs"], r["ref_probs"])
    assert {"fpga.conv_taps", "fpga.max_pool", "fpga.avg_pool", "fpga.mac_array"} <= set(r["program"].kernels)
    assert r["acc_int8"] >= 0.75, r["acc_int8"]
    assert r["run"].cycles_busy >= r["program"].design.cycle_model // 2


def test_window_ops_certified(tools: None) -> None:
    for op in ("conv2d_i8", "max_pool2d_i8", "avg_pool2d_i8"):
        cert = certified_or_run("fpga:0", keyword=f"op::{op}[")  # from CI's certification when it ran
        bad = [(r.id, r.status, r.message[:300]) for r in cert.results if r.status != "passed"]
        assert not bad and cert.counts()["passed"] >= 12, (op, bad)
