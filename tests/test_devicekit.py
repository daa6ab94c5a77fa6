"""The device kit (rlx_core.devicekit): a whole backend in ~150 lines (tests/plugins/rlx-kitc: C kernels
built by the host compiler, run through ctypes) runs op cases and a model graph exactly, its binaries
are cached and authenticated by the kit, and the kit's claim helpers decide from the renderer."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rlx_conformance.cases import cases_for, run_case

from rlx_core.plugin import (
    DispatchError,
    DType,
    GraphBuilder,
    Hub,
    Replay,
    Session,
    evaluate,
    render_check,
    single_op_program,
)

KITC = Path(__file__).resolve().parent / "plugins" / "rlx-kitc" / "src"


@pytest.fixture
def kitc(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Hub, Any]]:
    monkeypatch.syspath_prepend(str(KITC))
    import rlx_kitc.plugin as plugin

    if plugin.cc() is None:
        pytest.skip("no C compiler")
    hub = Hub(autoload=False)
    hub.register(plugin, "kitc", distribution="rlx-kitc")
    yield hub, plugin
    sys.modules.pop("rlx_kitc.plugin", None)


@pytest.mark.parametrize("op", ["add", "div", "maximum", "exp", "tanh", "sigmoid", "erf", "round", "sign",
                                "less", "where", "logical_and", "pow"])
def test_op_cases_run_natively_and_match_the_reference(kitc: tuple[Hub, Any], op: str) -> None:
    hub, _ = kitc
    sess = Session("kitc", hub=hub, use_cache=False)
    dt = "bool" if op == "logical_and" else "f32"
    cases = cases_for(op, dt)
    assert cases
    for case in cases:
        r = run_case(case, sess)
        assert r.status == "passed", (case.id, r.message)
        assert "native" in r.path, (case.id, r.path)


def test_model_graph_fused_and_profiled(kitc: tuple[Hub, Any]) -> None:
    hub, plugin = kitc
    rng = np.random.default_rng(0)
    g = GraphBuilder("kit_mlp")
    x = g.input("x", "f32", (3, 8))
    w = g.param("w", rng.standard_normal((8, 5)).astype(np.float32))
    b = g.param("b", rng.standard_normal(5).astype(np.float32))
    h = g.op("sigmoid", g.op("add", g.op("matmul", x, w), b))
    g.output(g.op("reshape", g.op("mul", h, h), shape=(15,)), "y")
    graph = g.build()
    feed = {"x": rng.standard_normal((3, 8)).astype(np.float32)}
    exe = Session("kitc", hub=hub, use_cache=False).compile(graph)
    got = exe.run(**feed)["y"]
    np.testing.assert_allclose(got, evaluate(graph, feed)["y"], rtol=1e-5, atol=1e-6)
    compiled = next(iter(exe._specs.values()))[0]  # type: ignore[attr-defined]
    _, counts = compiled.profile(feed)
    assert counts["kitc.matmul"] == 1 and counts["kitc.fused_elementwise"] == 1, counts
    assert sum(counts.values()) == len(compiled.program.kernels)
    # the binaries are the kit's: one authenticated shared library per distinct kernel source
    libs = list(plugin.COMPILER.cache_dir().glob("k_*.so"))
    assert libs and all(Path(str(p) + ".mac").is_file() for p in libs)
    plugin.COMPILER.forget()
    again = Session("kitc", hub=hub, use_cache=False).compile(graph).run(**feed)["y"]  # from the disk cache
    np.testing.assert_array_equal(again, got)


def test_unclaimed_dtype_fails_with_the_render_reason(kitc: tuple[Hub, Any]) -> None:
    hub, _ = kitc
    g = GraphBuilder("f64")
    g.output(g.op("exp", g.input("x", "f64", (4,))), "y")
    with pytest.raises(DispatchError):
        Session("kitc", hub=hub, use_cache=False).compile(g.build())


def test_render_check_reports_why() -> None:
    def render(program: str, ins: tuple[DType, ...], out: DType) -> str:
        if DType.F64 in ins:
            from rlx_core.plugin import IRError

            raise IRError("no f64 here")
        return "ok"

    check = render_check(render, "as TEST", op_ok=lambda op, ins, out: "no erf" if op == "erf" else None)
    assert check(single_op_program("exp", 1, {}), (DType.F32,), DType.F32) is None
    why = check(single_op_program("exp", 1, {}), (DType.F64,), DType.F64)
    assert why == "not renderable as TEST: no f64 here"
    assert check(single_op_program("erf", 1, {}), (DType.F32,), DType.F32) == "no erf"


def test_replay_warms_up_captures_and_falls_back() -> None:
    log: list[str] = []
    rep = Replay(lambda: log.append("eager"), lambda: lambda: log.append("replay"), warmup=1)
    rep(), rep(), rep()
    assert log == ["eager", "replay", "replay"]

    def broken() -> Any:
        raise RuntimeError("not capturable")

    log.clear()
    rep = Replay(lambda: log.append("eager"), broken, warmup=1)
    rep(), rep(), rep()
    assert log == ["eager"] * 3 and "not capturable" in rep.error
