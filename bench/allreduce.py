"""All-reduce bus bandwidth (RLX's cpu all_reduce vs raw mpi4py Allreduce vs torch.distributed gloo)
and tensor-parallel MiniLM latency per rank count. A benchmark, not a test: one run, printed table.

    python bench/allreduce.py                      # 2 ranks, 1 KiB .. 256 MiB, then MiniLM TP on 1, 2, 4
    python bench/allreduce.py --ranks 4 --max-mib 64 --no-minilm

It starts itself under ``rlx launch`` (Open MPI). Bus bandwidth = bytes / time * 2 (n - 1) / n (the
NCCL-tests convention: what each link carries in a ring all-reduce), best of the repetitions. RLX is
timed through ``Executable.buffers().run_bound()``: the compiled program's kernel on its own arena,
the same buffers each time, as a training step runs it (``Executable.run`` would add a copy in and
out, which measures memcpy, not the collective).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np


def _best(fn: Any, seconds: float, max_reps: int) -> float:
    from rlx_core.distributed import world

    w = world()
    fn()  # warm-up (and the first-call setup of each library)
    w.base.Barrier()
    best, spent, reps = float("inf"), 0.0, 0
    while reps < max_reps and (spent < seconds or reps < 3):
        w.base.Barrier()
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        dt = w.base.allreduce(dt, op=w.MPI.MAX)  # the slowest rank decides
        best, spent, reps = min(best, dt), spent + dt, reps + 1
        spent = w.base.bcast(spent, root=0)
    return best


def bandwidth(max_mib: int, seconds: float) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as td

    from rlx_core.distributed import world
    from rlx_core.ir.builder import GraphBuilder
    from rlx_core.runtime import Session

    w = world()
    n = w.size
    port = w.base.bcast(29500 + (os.getpid() % 2000), root=0)
    td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=w.rank, world_size=n)
    rows = []
    size = 1024
    while size <= max_mib << 20:
        count = size // 4
        g = GraphBuilder(f"ar{count}")
        g.output(g.op("all_reduce", g.input("x", "f32", (count,)), world=n, reduction="sum"), "y")
        prog = Session("cpu").compile(g.build()).buffers()
        prog.buffer("x")[...] = 1.0
        a = np.ones(count, np.float32)
        b = np.empty_like(a)
        t = torch.ones(count)
        reps = 200 if size < (1 << 20) else 20 if size < (64 << 20) else 5
        rlx = _best(prog.run_bound, seconds, reps)
        raw = _best(lambda a=a, b=b: w.base.Allreduce(a, b), seconds, reps)
        gloo = _best(lambda t=t: td.all_reduce(t), seconds, reps)
        factor = 2 * (n - 1) / n
        row = {"bytes": size, "rlx_s": rlx, "mpi_s": raw, "gloo_s": gloo,
               "rlx_GBps": size / rlx * factor / 1e9, "mpi_GBps": size / raw * factor / 1e9,
               "gloo_GBps": size / gloo * factor / 1e9}
        rows.append(row)
        if w.rank == 0:
            print(f"{_fmt(size):>9} rlx {row['rlx_GBps']:7.3f} GB/s  mpi4py {row['mpi_GBps']:7.3f}  gloo "
                  f"{row['gloo_GBps']:7.3f}   rlx/mpi {raw / rlx:5.2f}  rlx/gloo {gloo / rlx:5.2f}",
                  flush=True)
        del prog, a, b, t
        size *= 4
    td.destroy_process_group()
    return rows


def minilm_latency(batch: int, reps: int) -> dict[str, Any]:
    from rlx_core.distributed import tensor_parallel, world
    from rlx_core.models.minilm import MiniLM
    from rlx_core.runtime import Session

    w = world()
    m = MiniLM()
    ids, mask = m.pad(m.tokenize(["The quick brown fox jumps over the lazy dog."] * batch))
    g = m.graph if w.size == 1 else tensor_parallel(m.graph, w.size, w.rank)
    exe = Session("cpu").compile(g)
    feed = {"input_ids": ids, "attention_mask": mask}
    best = _best(lambda: exe.run(feed), 2.0, reps)
    return {"ranks": w.size, "batch": batch, "seconds": best}


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} TiB"


def rank_main(args: argparse.Namespace) -> None:
    from rlx_core.distributed import world

    w = world()
    out: dict[str, Any] = {}
    if args.mode == "bandwidth":
        out["bandwidth"] = bandwidth(args.max_mib, args.seconds)
    else:
        out["minilm"] = minilm_latency(args.batch, args.reps)
    if w.rank == 0:
        print("JSON " + json.dumps(out), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--max-mib", type=int, default=256)
    p.add_argument("--seconds", type=float, default=0.5, help="time budget per size and library")
    p.add_argument("--no-minilm", action="store_true")
    p.add_argument("--minilm-ranks", default="1,2,4")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        return rank_main(args)
    launch = [sys.executable, "-m", "rlx_core", "launch"]
    me = os.path.abspath(__file__)
    print(f"all-reduce bus bandwidth, {args.ranks} ranks on one host ({os.cpu_count()} cores), float32")
    subprocess.run([*launch, "-n", str(args.ranks), "--", me, "--mode", "bandwidth", "--max-mib",
                    str(args.max_mib), "--seconds", str(args.seconds)], check=True)
    if args.no_minilm:
        return
    print(f"\ntensor-parallel MiniLM-L6-v2, batch {args.batch} x 16 tokens, best of {args.reps}")
    base = None
    for n in (int(r) for r in args.minilm_ranks.split(",")):
        cmd = [*launch, "-n", str(n), "--", me, "--mode", "minilm", "--batch", str(args.batch),
               "--reps", str(args.reps)]
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
        res = json.loads(next(ln[5:] for ln in proc.stdout.splitlines() if ln.startswith("JSON ")))["minilm"]
        base = base or res["seconds"]
        print(f"  {n} rank(s): {res['seconds'] * 1e3:8.2f} ms   speed-up {base / res['seconds']:5.2f}x")


if __name__ == "__main__":
    main()
