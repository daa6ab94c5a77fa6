"""Names from model files never become code: rlx_core.codegen.names and every generator that uses it.

Hostile graph, node, input and parameter names (rlx_conformance.hostile: newlines, CR, ``*/``, ``//``,
quotes, backticks, backslashes, ``$system``, NUL, U+2028/U+2029, unicode, 10k characters) go through
every generator and exporter; the tests check that the generated text holds no raw payload, that
what it generates compiles and runs with no side effect (no ``RLX_PWNED`` file appears), and that the
numbers still equal the reference. Tools (gcc, arm-none-eabi-gcc + QEMU, iverilog, node) are
installed by the CI; a missing one FAILS its test.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rlx_conformance.hostile import MARKER, hostile_graph, hostile_graph_count, hostile_names

from rlx_core import GraphBuilder, Session
from rlx_core.codegen import Namer, comment, identifier, safe_comment, string_literal
from rlx_core.codegen.names import COMMENT_LANGS, COMMENT_LIMIT
from rlx_core.ir.reference import evaluate
from rlx_core.ir.serialize import save

NAMES = hostile_names()
GRAPHS = range(hostile_graph_count())
#: what ends a comment or a string in some language: a name holding one must appear in generated
#: text only escaped (inside a string literal that escapes it, or not at all)
_DANGER = re.compile(r"[\n\r\x00\u2028\u2029\"'`]|\*/")
DANGEROUS = [n for n in NAMES if _DANGER.search(n)]


def need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed (the CI installs them: scripts/dev.sh)",
                    pytrace=False)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in an empty directory, so a payload's ``touch RLX_PWNED`` would show up here."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert not (tmp_path / MARKER).exists(), "a hostile name ran code"


def assert_no_payload(text: str, what: str) -> None:
    # inside a JS/JSON string literal a name is data: drop the (escaped) occurrences first
    bare = text
    for n in sorted(NAMES, key=len, reverse=True):
        bare = bare.replace(string_literal(n, "js")[1:-1], "").replace(json.dumps(n)[1:-1], "")
    for n in DANGEROUS:
        assert n not in bare, f"{what} holds the raw hostile name {n[:60]!r}"
    for payload in ('RLX_PWNED");', "RLX_PWNED');", "RLX_PWNED')}"):
        assert payload not in bare, f"{what} holds {payload!r}"
    for ch in ("\x00", "\r", "\u2028", "\u2029"):
        assert ch not in text, f"{what} holds {ch!r}"


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray], tol: float = 1e-5) -> None:
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=tol, atol=tol, err_msg=k[:60])


# -- the helper itself ---------------------------------------------------------------------------

@pytest.mark.parametrize("lang", COMMENT_LANGS)
def test_comment_bodies_cannot_end_or_continue_a_comment(lang: str) -> None:
    for n in [*NAMES, "a*", "*", "/", "x/", "(", ";", "?", "??/", "a" * 79 + "\\n"]:
        body = safe_comment(n, lang)
        assert body.isascii() and body.isprintable(), (n[:40], body)
        for bad in ("*/", "/*", "//", "(;", ";)", "??", "<", ">", "`", "$", '"', "'"):
            assert bad not in body, (lang, n[:40], body)
        assert not body.endswith("\\") and len(body) <= COMMENT_LIMIT + 4
        assert body == safe_comment(n, lang)  # deterministic
        assert "\n" not in comment(n, lang)
    assert "coding:" not in safe_comment("x -*- coding: utf-7 -*-", "python")


def test_identifiers_are_plain_unique_and_keep_simple_names() -> None:
    seen: dict[str, str] = {}
    extra = ["a_b", "a b", "a-b", "x_1a2b3c4d", "gl_Position", "rlx_arena", "A", "a__b"]
    for n in dict.fromkeys([*NAMES, *extra]):
        ident = identifier(n)
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", ident) and "__" not in ident, (n[:40], ident)
        assert len(ident) <= 32 + 9 and ident == identifier(n)
        assert ident not in seen, (n[:40], seen.get(ident, "")[:40])
        seen[ident] = n
    assert identifier("weight") == "weight" and identifier("int") != "int"
    assert identifier("gl_Position") != "gl_Position" and identifier("rlx_arena") != "rlx_arena"
    namer = Namer(prefix="v_", taken={"v_x"})
    assert namer("x") != "v_x" and namer("x") == namer("x")
    assert len({namer(n) for n in NAMES}) == len(NAMES)


def test_string_literals_round_trip_in_c_js_and_python(tmp_path: Path) -> None:
    need("gcc", "node")
    names = [n for n in NAMES if "\x00" not in n]  # a C string stops at NUL by definition
    lines = [f"    puts_hex({string_literal(n, 'c')});" for n in names]
    src = ('#include <stdio.h>\nstatic void puts_hex(const char *s) { while (*s) printf("%02x", '
           '(unsigned char)*s++); printf("\\n"); }\nint main(void) {\n' + "\n".join(lines)
           + "\n return 0; }\n")
    (tmp_path / "lit.c").write_text(src)
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-Wno-trigraphs", "lit.c", "-o", "lit"],
                   cwd=tmp_path, check=True)
    out = subprocess.run([str(tmp_path / "lit")], capture_output=True, text=True, check=True).stdout.split()
    assert [bytes.fromhex(h).decode() for h in out] == names
    js = "console.log(JSON.stringify([" + ",".join(string_literal(n, "js") for n in NAMES) + "]));"
    res = subprocess.run(["node", "-e", js], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert json.loads(res.stdout) == NAMES
    for n in NAMES:
        lit = string_literal(n, "python")
        assert lit.isascii() and "\n" not in lit and ast.literal_eval(lit) == n
        for lang in ("wat", "verilog", "metal"):
            assert string_literal(n, lang).isascii() and "\n" not in string_literal(n, lang)


# -- every generator, with hostile names ---------------------------------------------------------

@pytest.mark.parametrize("k", GRAPHS)
def test_cpu_numba_sources_and_results(k: int, in_tmp: Path) -> None:
    from rlx_cpu import fused

    graph, feed = hostile_graph(k)
    assert_same(Session("cpu", use_cache=False).compile(graph).run(feed), evaluate(graph, feed))
    for mod in list(fused._MODULES.values()):
        assert_no_payload(mod.__rlx_source__, "generated Numba module")


@pytest.mark.parametrize("k", GRAPHS)
def test_metal_msl_on_host(k: int, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_metal import host

    seen: list[str] = []
    real = host.build_all

    def spy(sources: Any) -> Any:
        seen.extend(sources)
        return real(sources)

    monkeypatch.setattr(host, "build_all", spy)
    graph, feed = hostile_graph(k)
    assert_same(Session("metal", use_cache=False).compile(graph).run(feed), evaluate(graph, feed))
    for s in seen:
        assert_no_payload(s, "MSL")


@pytest.mark.parametrize("k", GRAPHS)
def test_vulkan_glsl(k: int, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_vulkan import glsl, plugin, vk

    if not plugin.rlx_probe_devices()[0].available:
        pytest.fail("no Vulkan device (lavapipe): apt-get install mesa-vulkan-drivers glslang-tools")
    seen: list[str] = []
    real = vk.SPIRV.compile

    def spy(src: str) -> bytes:
        seen.append(src)
        return real(src)

    monkeypatch.setattr(vk.SPIRV, "compile", spy)  # what the kit's Vulkan runtime builds pipelines with
    graph, feed = hostile_graph(k)
    assert_same(Session("vulkan", use_cache=False).compile(graph).run(feed), evaluate(graph, feed))
    for s in seen:
        assert_no_payload(s, "GLSL")
    assert_no_payload(glsl.header(), "GLSL header")


def test_cuda_sources_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA kernels are rendered from the legalized graph (no GPU needed): names never reach them."""
    from rlx_cuda import codegen, plugin

    from rlx_core.fusion import FUSED
    from rlx_core.records import DeviceCaps, DeviceInfo

    caps = DeviceCaps(peak_flops={"default": 1e13}, mem_bandwidth=1e12, launch_overhead=5e-6,
                      host_link_bandwidth=2.5e10, source="test stand-in")
    dev = DeviceInfo("cuda", "cuda:0", True, caps, host_memory=False)
    monkeypatch.setattr(plugin, "_probe", lambda: [dev])
    from rlx_core._hub import Hub

    sess = Session("cuda", hub=Hub(), use_cache=False)
    n = 0
    for k in GRAPHS:
        graph, _ = hostile_graph(k)
        legal, _ = sess.legalize(graph)
        g = legal.graph
        for node in g.nodes:
            if node.op != FUSED and node.op not in plugin.ELEMENTWISE:
                continue
            ins = [g.types[i] for i in node.inputs]
            t = g.types[node.outputs[0]]
            prog = (str(node.attrs["program"]) if node.op == FUSED
                    else codegen.single_op_program(node.op, len(ins), dict(node.attrs)))
            lays, dims, _ = codegen.plan_layouts([tuple(i.shape) for i in ins], tuple(t.shape))
            _, src = codegen.elementwise_source(prog, tuple(i.dtype for i in ins), t.dtype, lays, len(dims),
                                                False)
            assert_no_payload(src, "CUDA source")
            n += 1
    assert n >= len(GRAPHS)


@pytest.mark.parametrize("k", GRAPHS)
def test_wasm_module_and_js_export(k: int, in_tmp: Path) -> None:
    need("node")
    from rlx_wasm.export import compile_for_export, export_wasm

    graph, feed = hostile_graph(k)
    want = evaluate(graph, feed)
    assert_same(Session("wasm", use_cache=False).compile(graph).run(feed), want)
    _, art = compile_for_export(graph, {})
    assert_no_payload(art.wat, "WAT")
    out = in_tmp / "wasm"
    export_wasm(graph, out, {})
    for f in ("rlx_model.cjs", "rlx_model.mjs", "model.json"):
        assert_no_payload((out / f).read_text(encoding="utf-8"), f)
    # require() the CommonJS loader and run the model in node: no side effect, the reference's numbers
    (name,) = feed
    script = (f"const m = require({json.dumps(str(out / 'rlx_model.cjs'))});"
              f"m.load().then(model => {{ const x = {json.dumps(feed[name].ravel().tolist())};"
              f"const inputs = {{}}; inputs[m.manifest.inputs[0].name] = x;"
              f"const o = model.run(inputs); const r = {{}}; for (const k in o) r[k] = Array.from(o[k]);"
              f"console.log(JSON.stringify(r)); }});")
    res = subprocess.run(["node", "-e", script], capture_output=True, text=True, cwd=in_tmp, timeout=60)
    assert res.returncode == 0, res.stderr
    got = {k: np.array(v, np.float32).reshape(want[k].shape) for k, v in json.loads(res.stdout).items()}
    assert_same(got, want)
    esm = f"import({json.dumps((out / 'rlx_model.mjs').as_uri())}).then(m => console.log(m.manifest.graph));"
    res = subprocess.run(["node", "-e", esm], capture_output=True, text=True, cwd=in_tmp, timeout=60)
    assert res.returncode == 0 and res.stdout.rstrip("\n") == graph.name.replace("\x00", "\x00"), res.stderr


def test_rlx_export_wasm_command_with_a_hostile_graph_name(in_tmp: Path) -> None:
    """The reported exploit: a newline in the graph name ran code when the loader was require()d."""
    need("node")
    from click.testing import CliRunner

    from rlx_core.export_cmd import export_command

    g = GraphBuilder('g\nrequire("child_process").execSync("touch RLX_PWNED");//')
    x = g.input("x", "f32", (3,))
    g.output(x + 1.0, "y")
    save(g.build(), in_tmp / "m.rlx")
    r = CliRunner().invoke(export_command, [str(in_tmp / "m.rlx"), "--target", "wasm", "-o", "out"])
    assert r.exit_code == 0, r.output
    subprocess.run(["node", "-e", "require('./out/rlx_model.cjs')"], cwd=in_tmp, check=True, timeout=60)


def _cortexm_toolchain() -> None:
    from rlx_cortexm.targets import missing_reason

    why = missing_reason()
    if why:
        pytest.fail(why, pytrace=False)


@pytest.mark.parametrize("k", GRAPHS)
def test_cortexm_c_and_firmware(k: int, in_tmp: Path) -> None:
    _cortexm_toolchain()
    need("gcc")
    from rlx_cortexm.export import export_graph

    graph, feed = hostile_graph(k)
    exe = Session("cortexm", use_cache=False).compile(graph)
    assert_same(exe.run(feed), evaluate(graph, feed))
    out = in_tmp / "fw"
    export_graph(graph, out, cpu="m4", inputs=feed)
    for f in ("rlx_model.c", "rlx_model.h", "Makefile"):
        assert_no_payload((out / f).read_text(), f)
    # the generated C compiles warning-free with the host gcc too (no stray code from a comment)
    res = subprocess.run(["gcc", "-std=c99", "-fsyntax-only", "-Wall", "-Werror", "-Wno-trigraphs",
                          "-Wno-unused-const-variable", "rlx_model.c"], cwd=out, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    subprocess.run(["make", "-s", "-n", "run"], cwd=out, check=True, capture_output=True)


def test_cortexm_newline_in_a_parameter_name_does_not_compile_in(in_tmp: Path) -> None:
    """The reported exploit: a parameter name ending a C comment planted a host command."""
    _cortexm_toolchain()
    g = GraphBuilder("m")
    x = g.input("x", "f32", (4,))
    w = g.param('w */ int rlx_evil(void) { return 1; } /*\n__asm__("bkpt 0xAB");\n//', np.ones(4, np.float32))
    g.output(x + w, "y")
    graph = g.build()
    from rlx_cortexm.export import lower_graph
    from rlx_cortexm.program import CortexMProgram
    from rlx_cortexm.targets import target

    src = CortexMProgram(lower_graph(graph), target("m4")).sources["rlx_model.c"]
    code = re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", src, flags=re.S))  # what the compiler reads
    assert "rlx_evil" not in code and "bkpt" not in code, code
    exe = Session("cortexm", use_cache=False).compile(graph)
    xv = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(exe.run(x=xv)["y"], xv + 1)


def _int8_dense(names: list[str]) -> tuple[Any, dict[str, np.ndarray]]:
    import rlx_core.quant  # noqa: F401  (registers matmul_i8 and requantize)

    rng = np.random.default_rng(0)
    g = GraphBuilder(names[0])
    x = g.input(names[1], "i8", (1, 16))
    w = g.param(names[2], rng.integers(-127, 128, (8, 16)).astype(np.int8))
    b = g.param(names[3], rng.integers(-500, 500, (8,)).astype(np.int32))
    acc = g.op("matmul_i8", x, w, b, x_zero_point=-3, name=names[4])
    m = g.param(names[5], np.full((8,), 1 << 30, np.int32))
    s = g.param(names[6], np.full((8,), -7, np.int32))
    y = g.op("requantize", acc, m, s, zero_point=-5, name=names[7])
    g.output(g.op("maximum", y, g.const(-5, "i8"), name=names[8]), names[9])
    return g.build(), {names[1]: rng.integers(-128, 128, (1, 16)).astype(np.int8)}


@pytest.mark.parametrize("k", range(-(-len(NAMES) // 10)))
def test_fpga_rtl_export_and_icarus(k: int, in_tmp: Path) -> None:
    need("iverilog", "vvp")
    from rlx_fpga.export import export_graph

    names = [NAMES[(10 * k + j) % len(NAMES)] for j in range(10)]
    graph, feed = _int8_dense(names)
    want = Session("cpu", use_cache=False).compile(graph).run(feed)
    assert_same(Session("fpga", use_cache=False).compile(graph).run(feed), want, tol=0)
    out = in_tmp / "rtl"
    export_graph(graph, out, parallel=2)
    for f in out.iterdir():
        assert re.fullmatch(r"[A-Za-z0-9_.]+", f.name), f.name
        assert_no_payload(f.read_text(), f.name)
    # the exported testbench runs in the export directory: a $system/$fopen in a name would act here
    subprocess.run(["iverilog", "-g2012", "-s", "tb", "-o", "sim.vvp", "tb.v", "rlx_top.v"], cwd=out,
                   check=True)
    (out / "input.mem").write_text("\n".join(f"{int(v) & 0xFFFFFFFF:08x}" for v in feed[names[1]].ravel()))
    subprocess.run(["vvp", "-n", "sim.vvp"], cwd=out, check=True, capture_output=True, timeout=300)
    lines = (out / "output.hex").read_text().splitlines()
    words = [int(v, 16) for v in lines if v and not v.startswith("#")]
    got = np.array([w - (1 << 32) if w >= 1 << 31 else w for w in words], np.int64)
    np.testing.assert_array_equal(got, want[names[9]].ravel().astype(np.int64))
    assert not (out / MARKER).exists()


def test_onnx_model_with_hostile_names(in_tmp: Path) -> None:
    """The ONNX path: hostile graph/node/input/initializer names, imported, run and exported."""
    need("node")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from rlx_wasm.export import export_wasm

    from rlx_core.frontends.onnx import load_onnx

    n = NAMES
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    nodes = [helper.make_node("Add", [n[1], n[2]], [n[3]], name=n[4]),
             helper.make_node("Relu", [n[3]], [n[5]], name=n[6])]
    g = helper.make_graph(nodes, n[0], [helper.make_tensor_value_info(n[1], TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info(n[5], TensorProto.FLOAT, [2, 3])],
                          [numpy_helper.from_array(w, n[2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(in_tmp / "m.onnx"))
    graph = load_onnx(in_tmp / "m.onnx")
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    (inp,) = [v.name for v in graph.inputs]
    want = {k: np.maximum(x + w, 0) for k in graph.outputs}
    assert_same(Session("cpu", use_cache=False).compile(graph).run({inp: x}), want)
    assert_same(Session("wasm", use_cache=False).compile(graph).run({inp: x}), want)
    export_wasm(graph, in_tmp / "out", {})
    assert_no_payload((in_tmp / "out" / "rlx_model.cjs").read_text(encoding="utf-8"), "JS loader")
    subprocess.run(["node", "-e", "require('./out/rlx_model.cjs')"], cwd=in_tmp, check=True, timeout=60)
