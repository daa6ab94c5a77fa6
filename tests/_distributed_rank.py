"""Per-rank body of tests/test_distributed.py (run under `rlx launch -n N`): prints one JSON line
per scenario from rank 0, so the test compares with single-process runs made here on rank 0."""

from __future__ import annotations

import json
import sys

import numpy as np

from rlx_core.distributed import DataParallelTrainer, PipelineRunner, tensor_parallel, world
from rlx_core.optim import SGD, Trainer
from rlx_core.runtime import Session
from rlx_core.train_bench import init_params, mlp_graph, random_mnist

SENTENCES = ["A man is eating food.", "The quick brown fox jumps over the lazy dog.",
             "日本語のテキストです。", "", "Café crème brûlée à la française " * 4]


def report(w, name: str, **data: object) -> None:
    if w.rank == 0:
        print("RESULT " + json.dumps({"scenario": name, "world": w.size, **data}), flush=True)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def minilm(w, scenarios: list[str]) -> None:
    from rlx_core.models.minilm import MiniLM

    m = MiniLM()
    ids, mask = m.pad(m.tokenize(SENTENCES))
    feed = {"input_ids": ids, "attention_mask": mask}
    ref = Session("cpu").compile(m.graph).run(feed)["embeddings"] if w.rank in (0, w.size - 1) else None
    if "tp" in scenarios:
        g = tensor_parallel(m.graph, w.size, w.rank)
        out = Session("cpu").compile(g).run(feed)["embeddings"]
        ops = sorted({n.op for n in g.nodes if n.op in ("all_reduce", "all_gather")})
        report(w, "tp", cosine=cosine(out, ref) if ref is not None else None, collectives=ops,
               all_reduces=sum(n.op == "all_reduce" for n in g.nodes))
    if "pp" in scenarios:
        pr = PipelineRunner(m.graph, ["layer_norm_6"])
        out = pr.run(feed, micro_batches=len(SENTENCES))
        # the last stage holds the result: send its cosine to rank 0 for the report
        c = cosine(out["embeddings"], ref) if out is not None else None
        c = w.base.bcast(c, root=w.size - 1)
        report(w, "pp", cosine=c)
    if "mesh" in scenarios:  # 2 pipeline stages x 2 tensor-parallel ranks
        from rlx_core.distributed import DistributedSession, Mesh

        ds = DistributedSession("cpu", Mesh(pp=2, tp=2))
        prog = ds.program(m.graph, cuts=["layer_norm_6"])
        names = {v.name for v in prog.inputs}  # a later stage reads only the mask
        out = ds.session.compile(prog).run({k: v for k, v in feed.items() if k in names})
        last = ds.coords["pp"] == 1
        c = cosine(out["embeddings"], ref) if last and ref is not None else None
        c = w.base.bcast(c, root=w.size - 1)
        report(w, "mesh", cosine=c, ops=sorted({n.op for n in prog.nodes if n.op in
                                                ("send", "recv", "all_reduce", "all_gather")}))


def dp(w) -> None:
    arch, batch, steps = (32, 16, 10), 16, 20
    x, y = random_mnist(batch * steps, features=32, classes=10, seed=1)
    params = init_params(arch, seed=0)
    t = DataParallelTrainer(mlp_graph(arch, params), "loss", SGD(lr=0.1, momentum=0.9), bucket_bytes=1024)
    losses = [t.step(x=x[i * batch:(i + 1) * batch], y=y[i * batch:(i + 1) * batch]) for i in range(steps)]
    single = None
    if w.rank == 0:
        ref = Trainer(mlp_graph(arch, params), "loss", SGD(lr=0.1, momentum=0.9))
        single = [ref.step(x=x[i * batch:(i + 1) * batch], y=y[i * batch:(i + 1) * batch])
                  for i in range(steps)]
    report(w, "dp", losses=losses, single=single,
           buckets=sum(n.op == "all_reduce" for n in t.graph.nodes) - 1)


def main(argv: list[str]) -> None:
    w = world()
    scenarios = argv[0].split(",")
    if "dp" in scenarios:
        dp(w)
    if "tp" in scenarios or "pp" in scenarios:
        minilm(w, scenarios)
    if "timeout" in scenarios:  # rank 1 never joins: rank 0 must fail with a clear error, not hang
        from rlx_core.ir.builder import GraphBuilder

        g = GraphBuilder("late")
        g.output(g.op("all_reduce", g.input("x", "f32", (4,)), world=w.size), "y")
        exe = Session("cpu").compile(g.build())
        if w.rank == 0:
            exe.run({"x": np.ones(4, np.float32)})
        else:
            import time

            time.sleep(60)
    if "crash" in scenarios:
        if w.rank == 1:
            raise RuntimeError("boom on purpose")
        import time

        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1:])
