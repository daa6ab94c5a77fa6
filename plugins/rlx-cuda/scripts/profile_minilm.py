"""Where MiniLM's GPU time goes, RLX vs PyTorch, kernel by kernel (a tool for tuning, not a test).

1. The linear shapes of MiniLM (rows = batch x 128) as RLX binds them: cuBLASLt with the bias
   epilogue, the old copy-bias-then-GEMM(beta=1), the bare GEMM, and ``torch.nn.functional.linear``.
2. MiniLM at the given batches: RLX device time per run with cuBLASLt on and off (``RLX_CUDA_LT``),
   and per CUDA kernel (CUPTI through ``torch.profiler``, which sees CuPy's and cuBLAS's launches
   too) for RLX's eager run and for PyTorch eager.

    RLX_MINILM_DIR=/tmp/minilm python plugins/rlx-cuda/scripts/profile_minilm.py [--batches 32,128]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_cuda import _compiled, _minilm_parts, device_time, torch_device_time


class _Ctx:
    """The one thing kernels.gemm / lt_linear need from a program: a cuBLAS workspace."""

    def __init__(self) -> None:
        import cupy as cp
        from rlx_cuda import kernels

        self._ws = cp.cuda.alloc(kernels.CUBLAS_WORKSPACE)

    def cublas_workspace(self) -> Any:
        return self._ws


def linear_shapes(rows_list: list[int], hidden: int, inter: int) -> list[dict[str, Any]]:
    import cupy as cp
    import torch
    from rlx_cuda import kernels as kern

    from rlx_core.dtypes import DType

    out = []
    ctx = _Ctx()
    for m in rows_list:
        for n, k in ((hidden, hidden), (inter, hidden), (hidden, inter)):
            x = cp.random.standard_normal((m, k), dtype=np.float32)
            w = cp.random.standard_normal((n, k), dtype=np.float32) / float(np.sqrt(k))
            bias = cp.random.standard_normal((n,), dtype=np.float32)
            y = cp.empty((m, n), np.float32)
            px, pw, pbias, py = (int(a.data.ptr) for a in (x, w, bias, y))
            lt = kern.lt_linear(px, pw, pbias, py, m, n, k, DType.F32, ctx)
            f32 = DType.F32
            tn = (kern.OP_T, kern.OP_N, n, m, k, 1.0, pw, k, 0, px, k, 0)
            g1 = kern.gemm(*tn, 1.0, py, n, 0, 1, f32, f32, ctx)  # type: ignore[arg-type]
            g0 = kern.gemm(*tn, 0.0, py, n, 0, 1, f32, f32, ctx)  # type: ignore[arg-type]

            def old(g1: Any = g1, y: Any = y, bias: Any = bias) -> None:
                cp.copyto(y, bias)
                g1()
            row: dict[str, Any] = {"m": m, "n": n, "k": k, "lt_available": lt is not None}
            row["old_copy_gemm_ms"] = device_time(old) * 1e3
            row["gemm_only_ms"] = device_time(g0) * 1e3
            tx, tw, tb = (torch.as_tensor(a, device="cuda") for a in (x, w, bias))
            row["torch_linear_ms"] = torch_device_time(lambda tx=tx, tw=tw, tb=tb:
                                                       torch.nn.functional.linear(tx, tw, tb)) * 1e3
            if lt is not None:
                row["lt_bias_ms"] = device_time(lt) * 1e3
                cp.cuda.get_current_stream().synchronize()
                ref = torch.nn.functional.linear(tx, tw, tb)
                torch.cuda.synchronize()
                row["lt_max_abs_diff_vs_torch"] = float((torch.as_tensor(y, device="cuda") - ref).abs().max())
            flops = 2.0 * m * n * k
            row["torch_tflops"] = flops / row["torch_linear_ms"] / 1e9
            row["rlx_tflops"] = flops / row.get("lt_bias_ms", row["old_copy_gemm_ms"]) / 1e9
            print(json.dumps(row))
            out.append(row)
    return out


def _kernel_table(prof: Any, runs: int, top: int = 25) -> list[dict[str, Any]]:
    rows: dict[str, list[float]] = {}
    for ev in prof.events():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if str(getattr(ev, "device_type", "")).endswith("CUDA") and t > 0:
            rows.setdefault(ev.name, []).append(t)  # microseconds
    tab = [{"kernel": k[:110], "calls_per_run": len(v) / runs, "ms_per_run": sum(v) / runs / 1e3}
           for k, v in rows.items()]
    tab.sort(key=lambda r: -r["ms_per_run"])
    return tab[:top]


def minilm(batches: list[int]) -> list[dict[str, Any]]:
    import cupy as cp
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rlx_core.bench import _torch_bert, inputs
    from rlx_core.models.bert import build_bert_encoder
    from rlx_core.runtime import Session

    parts = _minilm_parts()
    if parts is None:
        return []
    cfg, w = parts
    graph = build_bert_encoder(cfg, w, pooling="mean", normalize=True, name="all_minilm_l6_v2")
    tmodel = _torch_bert(w, cfg).cuda().eval()
    res = []
    for b in batches:
        feed = inputs("minilm", b, 128)
        row: dict[str, Any] = {"batch": b}
        for lt in ("1", "0"):
            os.environ["RLX_CUDA_LT"] = lt
            exe = Session("cuda", use_cache=False).compile(graph)
            exe.run(feed)
            exe.run(feed)
            prog = _compiled(exe)
            with prog.device, prog.stream:
                prog.upload(feed)
                row[f"rlx_graph_device_ms_lt{lt}"] = device_time(prog.launch, reps=20) * 1e3
                if lt == "1":
                    prog.use_graph = False
                    prog.synchronize()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(3):
                            prog.launch()
                        prog.synchronize()
                    row["rlx_kernels"] = _kernel_table(prof, 3)
            del exe, prog
            cp.get_default_memory_pool().free_all_blocks()
        os.environ["RLX_CUDA_LT"] = "1"
        ids, mask = (torch.from_numpy(feed[k]).cuda() for k in ("input_ids", "attention_mask"))
        with torch.inference_mode():
            t_dev = torch_device_time(lambda ids=ids, mask=mask: tmodel(ids, mask), reps=20)
            row["torch_device_ms"] = t_dev * 1e3
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    tmodel(ids, mask)
                torch.cuda.synchronize()
        row["torch_kernels"] = _kernel_table(prof, 3)
        print(f"== batch {b}: rlx lt {row['rlx_graph_device_ms_lt1']:.3f} ms, old "
              f"{row['rlx_graph_device_ms_lt0']:.3f} ms, torch {row['torch_device_ms']:.3f} ms (device)")
        for side in ("rlx_kernels", "torch_kernels"):
            print(f"  -- {side}")
            for r in row[side]:
                print(f"    {r['ms_per_run']:8.3f} ms  x{r['calls_per_run']:<5g} {r['kernel']}")
        res.append(row)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="32,128")
    ap.add_argument("--json", default=str(Path(os.environ.get("OUT", ".")) / "profile-minilm.json"))
    args = ap.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # like RLX's default: f32 GEMMs in full f32
    torch.backends.cudnn.allow_tf32 = False
    print("torch", torch.__version__, "allow_tf32", torch.backends.cuda.matmul.allow_tf32,
          "float32_matmul_precision", torch.get_float32_matmul_precision())
    batches = [int(b) for b in args.batches.split(",")]
    out = {"linear": linear_shapes([b * 128 for b in batches], 384, 1536), "minilm": minilm(batches)}
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
