"""What cache authentication costs on MiniLM's cached compile (issue 14: must stay under 5 %).

    python bench/cache_auth.py                 # 5 cached processes, batch 1, seq 128
    python bench/cache_auth.py --runs 9 --json out.json

A first process fills a fresh private cache directory; each further process compiles MiniLM as
``rlx bench infer minilm`` does (``Session("cpu").compile`` + binding the input shapes: the
compile-cache entry, Numba's cached kernels and the private OpenBLAS copy all come from the cache)
and reports the whole compile time and, from :func:`rlx_core.cache.auth_stats`, the time spent
computing HMACs and manifest hashes over cache files in that window. There is no switch that
turns authentication off: the cost is measured where it is spent. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any


def worker(batch: int, seq: int) -> dict[str, Any]:
    from rlx_core.bench import inputs, rlx_graph
    from rlx_core.cache import auth_stats
    from rlx_core.runtime import Session, bind_inputs

    graph = rlx_graph("minilm")
    feed = inputs("minilm", batch, seq)
    a0 = auth_stats()
    t0 = time.perf_counter()
    sess = Session("cpu")
    exe = sess.compile(graph)
    exe.program(bind_inputs(graph, feed, "bench")[1])  # specialise + backend compile, no run
    dt = time.perf_counter() - t0
    a1 = auth_stats()
    return {"compile_s": dt, "auth_s": a1["seconds"] - a0["seconds"], "auth_bytes": a1["bytes"] - a0["bytes"],
            "auth_checks": a1["checks"] - a0["checks"], "from_cache": exe.report.from_cache}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="cached processes (default 5)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.batch, args.seq)))
        return
    with tempfile.TemporaryDirectory(prefix="rlx-cache-auth-") as tmp:
        env = {**os.environ, "RLX_CACHE_DIR": os.path.join(tmp, "cache")}
        env.pop("RLX_NO_CACHE", None)
        cmd = [sys.executable, __file__, "--worker", "--batch", str(args.batch), "--seq", str(args.seq)]

        def one() -> dict[str, Any]:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            return json.loads(out.strip().splitlines()[-1])

        cold = one()
        runs = [one() for _ in range(args.runs)]
    if not all(r["from_cache"] for r in runs):
        sys.exit("a cached run missed the compile cache: the numbers below would not mean anything")
    comp = statistics.median(r["compile_s"] for r in runs)
    auth = statistics.median(r["auth_s"] for r in runs)
    ratio = statistics.median(r["auth_s"] / r["compile_s"] for r in runs)
    print(f"MiniLM b{args.batch} s{args.seq}, cached compile (median of {args.runs} processes): "
          f"{comp * 1e3:.0f} ms (cold {cold['compile_s']:.2f} s)")
    print(f"authentication: {auth * 1e3:.1f} ms over {runs[0]['auth_checks']} checks, "
          f"{runs[0]['auth_bytes'] / 2**20:.1f} MiB -> {ratio * 100:.2f} % of the cached compile")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cold": cold, "runs": runs, "compile_s": comp, "auth_s": auth, "ratio": ratio}, f,
                      indent=2)


if __name__ == "__main__":
    main()
