"""Dense programs on rlx-cpu (issue 18): MLPs bound on NumPy and oneDNN through ctypes
(:mod:`rlx_cpu.dense`) match float64 references, fuse a linear with its ReLU, leave every other
program on the general path, and load neither Numba nor LLVM."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.runtime import bind_inputs

RNG = np.random.default_rng(6)


def _mlp(batch: int, sizes: tuple[int, ...], dtype: str = "f32", head: str = "softmax",
         zero_first: bool = False) -> tuple[Any, dict[str, np.ndarray], np.ndarray]:
    """``sizes[0] -> ... -> sizes[-1]`` with ReLUs between the linears and ``head`` at the end,
    its feed and a float64 reference."""
    npdt = np.float32 if dtype == "f32" else np.float64
    g = GraphBuilder("mlp")
    x = g.input("x", dtype, (batch, sizes[0]))
    xv = RNG.standard_normal((batch, sizes[0])).astype(npdt)
    h, ref = x, xv.astype(np.float64)
    zero = g.const(0.0, dtype)
    for k, (i, o) in enumerate(itertools.pairwise(sizes)):
        w = (RNG.standard_normal((o, i)) / np.sqrt(i)).astype(npdt)
        b = RNG.standard_normal(o).astype(npdt)
        h = g.op("linear", h, g.param(f"w{k}", w), g.param(f"b{k}", b))
        ref = ref @ w.T.astype(np.float64) + b
        if k < len(sizes) - 2:
            h = g.op("maximum", zero, h) if zero_first else g.op("maximum", h, zero)
            ref = np.maximum(ref, 0)
    if head != "none":
        h = g.op(head, h, axis=-1)
        e = np.exp(ref - ref.max(-1, keepdims=True))
        ref = e / e.sum(-1, keepdims=True)
        if head == "log_softmax":
            ref = np.log(ref)
    g.output(h, "y")
    return g.build(), {"x": xv}, ref


def _need_onednn() -> None:
    from rlx_cpu import onednn_conv

    if not onednn_conv.available():
        pytest.skip("oneDNN is not installed (pip install 'rlx-cpu[onednn]')")


def _same_as_general_path(graph: Any, x: np.ndarray, monkeypatch: pytest.MonkeyPatch, tol: float) -> None:
    """NaN where the general path (``RLX_CPU_DENSE=0``) has NaN, the same values elsewhere."""
    got = Session("cpu").compile(graph).run({"x": x})["y"]
    monkeypatch.setenv("RLX_CPU_DENSE", "0")
    want = Session("cpu").compile(graph).run({"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _compiled(exe: Any, graph: Any, feed: dict[str, np.ndarray]) -> Any:
    return exe._specialise(bind_inputs(graph, feed, "test")[1])[0]


def _kernels(c: Any) -> list[str]:
    """The program's kernels in order, a merged run's (names joined by ``+``) one by one."""
    return [k for n in c.kernel_names for k in n.split("+")]


@pytest.mark.parametrize("batch,sizes", [(1, (64, 48, 32, 10)), (2, (64, 48, 10)), (5, (64, 48, 32, 10)),
                                         (256, (128, 160, 10))])
def test_mlp_matches_float64_and_fuses_linear_relu(batch: int, sizes: tuple[int, ...]) -> None:
    graph, feed, ref = _mlp(batch, sizes)
    exe = Session("cpu").compile(graph)
    for _ in range(2):  # a second run: the buffers are reused, nothing carries over
        np.testing.assert_allclose(exe.run(feed)["y"], ref, rtol=2e-5, atol=2e-6)
    c = _compiled(exe, graph, feed)
    assert _kernels(c).count("cpu.dense_linear_relu") == len(sizes) - 2, c.kernel_names
    assert "cpu.maximum" not in _kernels(c)
    assert c.run_kernels[0][:2] == ("cpu.linear", "cpu.maximum")
    _, counts = c.profile(feed)
    assert counts["cpu.linear"] == len(sizes) - 1 and counts["cpu.maximum"] == len(sizes) - 2


@pytest.mark.parametrize("head", ["log_softmax", "none"])
def test_heads_float64_and_zero_first(head: str) -> None:
    graph, feed, ref = _mlp(3, (16, 12, 8), dtype="f64", head=head, zero_first=True)
    exe = Session("cpu").compile(graph)
    np.testing.assert_allclose(exe.run(feed)["y"], ref, rtol=1e-12, atol=1e-12)
    assert "cpu.dense_linear_relu" in _kernels(_compiled(exe, graph, feed))


def test_relu_keeps_nan_and_inf_like_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    graph, feed, _ = _mlp(4, (8, 6, 3), head="none")
    x = feed["x"].copy()
    x[0, 0], x[1, :] = np.nan, np.inf
    x[2, :] = -np.inf
    _same_as_general_path(graph, x, monkeypatch, 1e-6)


def test_setting_off_and_other_programs_take_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    graph, feed, ref = _mlp(3, (16, 12, 8))
    monkeypatch.setenv("RLX_CPU_DENSE", "0")
    exe = Session("cpu").compile(graph)
    np.testing.assert_allclose(exe.run(feed)["y"], ref, rtol=2e-5, atol=2e-6)
    assert "cpu.dense_linear_relu" not in _kernels(_compiled(exe, graph, feed))
    monkeypatch.delenv("RLX_CPU_DENSE")
    # A layer norm (a Numba row kernel) makes it a general program.
    g = GraphBuilder("ln_mlp")
    x = g.input("x", "f32", (3, 16))
    h = g.op("layer_norm", x, g.param("g", np.ones(16, np.float32)), g.param("b", np.zeros(16, np.float32)),
             axis=-1, eps=1e-5)
    h = g.op("linear", h, g.param("w", RNG.standard_normal((8, 16)).astype(np.float32)),
             g.param("bb", np.zeros(8, np.float32)))
    g.output(g.op("maximum", h, g.const(0.0, "f32")), "y")
    graph2 = g.build()
    exe2 = Session("cpu").compile(graph2)
    exe2.run(feed)
    assert "cpu.dense_linear_relu" not in _kernels(_compiled(exe2, graph2, feed))


def test_linear_read_twice_is_not_fused() -> None:
    g = GraphBuilder("two_readers")
    x = g.input("x", "f32", (3, 8))
    w = RNG.standard_normal((5, 8)).astype(np.float32)
    h = g.op("linear", x, g.param("w", w), g.param("b", np.zeros(5, np.float32)))
    g.output(g.op("maximum", h, g.const(0.0, "f32")), "r")
    g.output(h, "h")
    graph = g.build()
    xv = RNG.standard_normal((3, 8)).astype(np.float32)
    exe = Session("cpu").compile(graph)
    out = exe.run({"x": xv})
    ref = xv.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(out["h"], ref, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(out["r"], np.maximum(ref, 0), rtol=2e-5, atol=2e-6)
    assert "cpu.dense_linear_relu" not in _kernels(_compiled(exe, graph, {"x": xv}))


_CHILD = """
import json, sys
import numpy as np
sys.path[:0] = [{here!r}]
from test_cpu_dense import _mlp
from rlx_core import Session
errs = []
for batch in (1, 256):
    graph, feed, ref = _mlp(batch, (784, 512, 256, 10))
    y = Session("cpu").compile(graph).run(feed)["y"]
    errs.append(float(np.abs(y - ref).max()))
print(json.dumps({{"mods": sorted(m for m in ("numba", "llvmlite", "scipy") if m in sys.modules),
                  "errs": errs}}))
"""


def test_mlp_loads_no_numba() -> None:
    """The RSS claim: an MLP at batch 1 and 256 runs without Numba, LLVM or SciPy loaded."""
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", _CHILD.format(here=here)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["mods"] == [], got
    assert max(got["errs"]) < 1e-5, got


@pytest.mark.parametrize("batch", [1, 2, 8, 300])
def test_team_linears_match_float64_and_keep_their_bits(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``RLX_CPU_DENSE_OPENMP`` (the default): the big linears are one oneDNN sgemm on an OpenMP
    team of the pool's active threads; a busy core (fewer active threads) keeps every bit."""
    from rlx_cpu import parallel

    _need_onednn()
    pool = parallel.RowPool(2)
    monkeypatch.setattr(parallel, "_POOL", pool)
    monkeypatch.setattr(pool, "poll", lambda: None)  # the test sets the load, not /proc/stat
    graph, feed, ref = _mlp(batch, (600, 512, 300, 10))
    exe = Session("cpu").compile(graph)
    runs = []
    for active in (2, 1, 2):
        pool.active = active
        runs.append(exe.run(feed)["y"].copy())
        np.testing.assert_allclose(runs[-1], ref, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[0], runs[2])
    assert _kernels(_compiled(exe, graph, feed))[:2] == ["cpu.dense_linear_relu"] * 2
    monkeypatch.setenv("RLX_CPU_DENSE_OPENMP", "0")  # np.matmul / the row pool's pieces
    np.testing.assert_allclose(Session("cpu").compile(graph).run(feed)["y"], ref, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("batch", [1, 8])
def test_team_linears_keep_nan_and_inf(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The matmul primitive's bias and ReLU post-ops keep NaN and Inf as the general path does."""
    from rlx_cpu import parallel

    _need_onednn()
    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(2))
    graph, feed, _ = _mlp(batch, (600, 512, 300, 10), head="none")
    x = feed["x"].copy()
    x[0, 0] = np.nan
    if batch > 1:
        x[1, :] = np.inf
        x[2, 5] = -np.inf
    _same_as_general_path(graph, x, monkeypatch, 1e-4)


def test_matmul_team_falls_back_to_the_full_team_when_bits_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread count whose probe run gives other bits than the full team is never used: that load
    runs the full team's primitive (the probe is made to disagree here)."""
    from rlx_cpu import onednn_linear, parallel

    _need_onednn()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 600), dtype=np.float32)
    w = rng.standard_normal((512, 600), dtype=np.float32)
    b = rng.standard_normal(512, dtype=np.float32)
    o = np.empty((8, 512), np.float32)
    made: list[int] = []
    orig = onednn_linear._build

    def counting(api: Any, xx: Any, ww: Any, bb: Any, oo: Any, relu: bool, threads: int) -> Any:
        run = orig(api, xx, ww, bb, oo, relu, threads)
        made.append(threads if oo is o else -threads)  # negative: a probe's throwaway primitive
        return run
    monkeypatch.setattr(onednn_linear, "_build", counting)
    pl = parallel.RowPool(2)
    run = onednn_linear.linear_team(x, w, b, o, True, pl)
    assert run is not None
    run()
    want = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + b, 0)
    np.testing.assert_allclose(o, want, rtol=1e-4, atol=1e-3)
    full = o.copy()
    monkeypatch.setattr(onednn_linear, "_agree", lambda a, c: False)
    pl.active = 1
    run()
    assert made == [2, -1, -2], made  # probed, disagreed: no one-thread primitive on o
    np.testing.assert_array_equal(o, full)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape,axis", [((1, 10), 1), ((8, 10), 1), ((300, 10), 1), ((4, 6, 5), 1)])
def test_onednn_softmax_matches_the_numpy_form(shape: tuple[int, ...], axis: int, log: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The primitive the dense program uses where its linears loaded oneDNN: the NumPy form's values
    and NaN rows (a NaN, a +inf, or only -inf along the axis), on one thread and on a team."""
    from rlx_cpu import dense, onednn_softmax, parallel

    _need_onednn()
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = np.moveaxis(x, axis, -1)  # a view: rows along the axis
    flat[0, ..., 2] = np.nan
    if flat.shape[0] > 2:
        flat[1, ..., 3] = np.inf
        flat[2] = -np.inf
    want, got = np.empty_like(x), np.empty_like(x)
    with np.errstate(all="ignore"):
        dense._softmax(x, want, axis, log, onednn=False)()
        run = dense._softmax(x, got, axis, log, onednn=True)
        run()
    assert hasattr(run, "onednn_impl")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # float32 both: ~70 ulp apart in log
    team = np.empty_like(x)
    pl = parallel.RowPool(2)
    monkeypatch.setattr(parallel, "_POOL", pl)
    run2 = onednn_softmax.softmax_run(x, team, axis, log)
    assert run2 is not None
    for active in (1, 2):  # a team of one thread or two: the same bits
        pl.active = active
        team.fill(0)
        run2()
        np.testing.assert_array_equal(team, got)


@pytest.mark.parametrize("head", ["softmax", "log_softmax"])
@pytest.mark.parametrize("batch", [1, 8, 300])
def test_mlp_head_is_onednn_with_team_linears(head: str, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program whose linears run on the oneDNN team runs its last linear and softmax as one call
    of two oneDNN primitives on the team, NaN and Inf rows as the general path has them; with
    ``RLX_CPU_DENSE_OPENMP=0`` (no oneDNN loaded for the linears) both stay NumPy."""
    from rlx_cpu import parallel

    _need_onednn()
    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(2))
    graph, feed, ref = _mlp(batch, (600, 512, 10), head=head)
    fused = "cpu.dense_linear_" + head
    for team in ("1", "0"):
        monkeypatch.setenv("RLX_CPU_DENSE_OPENMP", team)
        exe = Session("cpu").compile(graph)
        np.testing.assert_allclose(exe.run(feed)["y"], ref, rtol=2e-5, atol=2e-5)
        c = _compiled(exe, graph, feed)
        names = c.kernel_names
        assert (fused in _kernels(c)) == (team == "1"), names
        # on the team the head ends the run of all the team's primitives (rlx_cpu.dense.merge_teams)
        assert names[-1] == ("cpu.dense_linear_relu+" + fused if team == "1" else "cpu." + head), names
        assert hasattr(c.runs[-1], "onednn_impl") == (team == "1"), names
    monkeypatch.setenv("RLX_CPU_DENSE_OPENMP", "1")
    x = feed["x"].copy()
    x[0, 0] = np.nan
    if batch > 1:
        x[1, :] = np.inf
    _same_as_general_path(graph, x, monkeypatch, 2e-5)


def test_merge_teams_groups_consecutive_team_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs on the oneDNN team merge while they follow each other; a run with an ``after`` pass
    ends its group (a later primitive may read what the pass writes); any other run splits."""
    from rlx_cpu import dense

    def run(name: str, team: bool, after: bool = False) -> Any:
        def r() -> None:
            pass
        r.__name__ = name
        if team:
            r.team = object()  # type: ignore[attr-defined]
        if after:
            r.after = r  # type: ignore[attr-defined]
        return r
    monkeypatch.setattr(dense, "_merged", lambda span: "+".join(r.__name__ for r in span))
    runs = [run("a", True), run("b", True, after=True), run("c", True), run("d", False), run("e", True),
            run("f", True), run("g", True)]
    names = [r.__name__ for r in runs]
    claims = [(n,) for n in names]
    got, got_names, got_claims = dense.merge_teams(runs, names, claims)
    assert got_names == ("a+b", "c", "d", "e+f+g")
    assert got[0] == "a+b" and got[1] is runs[2] and got[2] is runs[3] and got[3] == "e+f+g"
    assert got_claims == (("a", "b"), ("c",), ("d",), ("e", "f", "g"))


def test_merged_team_run_restores_the_callers_openmp_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """One call runs all the team's primitives on the thread count each was made for and leaves
    OpenMP's thread count as the caller had it."""
    from rlx_cpu import onednn_conv, parallel

    _need_onednn()
    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(2))
    graph, feed, ref = _mlp(2, (600, 512, 300, 10))
    exe = Session("cpu").compile(graph)
    get_t, set_t = onednn_conv._api()["omp"]
    prev = get_t()
    set_t(1)
    try:
        np.testing.assert_allclose(exe.run(feed)["y"], ref, rtol=2e-5, atol=2e-6)
        assert get_t() == 1
    finally:
        set_t(prev)
    c = _compiled(exe, graph, feed)
    assert len(c.runs) == 1 and len(c.runs[0].onednn_impl) == 3, c.kernel_names


@pytest.mark.parametrize("team", ["1", "0"])
def test_dense_program_runs_under_numpy_raise(team: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """np.seterr(all="raise") in the caller never reaches the kernels: the oneDNN team program runs
    without an errstate (it makes no NumPy arithmetic), the NumPy one inside one; both give the
    general path's inf/NaN."""
    from rlx_cpu import parallel

    _need_onednn()
    monkeypatch.setattr(parallel, "_POOL", parallel.RowPool(2))
    monkeypatch.setenv("RLX_CPU_DENSE_OPENMP", team)
    graph, feed, _ = _mlp(4, (600, 512, 10))
    x = feed["x"].copy()
    x[0, 0], x[1, :] = np.nan, np.inf
    exe = Session("cpu").compile(graph)
    with np.errstate(all="raise"):
        got = exe.run({"x": x})["y"]
    assert _compiled(exe, graph, {"x": x})._quiet == (team == "1")
    monkeypatch.setenv("RLX_CPU_DENSE", "0")
    want = Session("cpu").compile(graph).run({"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
