"""In-process A/B of an rlx-cpu module flag on an ONNX zoo export: the model compiled once with each
value, then blocks of runs alternating between the two, so drift and other processes' load hit both.

    python bench/flag_ab.py env:RLX_CPU_CONV_OPENMP deeplabv3_mobilenet_v3 1 1 0   # a setting, on vs off
    python bench/flag_ab.py rlx_cpu.conv_chain.BRG_FIRST resnet18 1                  # a flag, True vs False

``env:NAME`` sets an environment variable (a setting) instead. The flag is read when a program is
bound (compile time), so each compiled program keeps the value it was built with. Prints the median
over blocks of each block's p50. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("flag", help="module.ATTRIBUTE, e.g. rlx_cpu.onednn_conv.ROW_POOL")
    ap.add_argument("model", help="a zoo model (tests/_zoo.py)")
    ap.add_argument("batch", type=int)
    ap.add_argument("values", nargs="*", default=["True", "False"],
                    help="two Python literals (default True False)")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    if len(a.values) != 2:
        raise SystemExit("give two values to compare")
    warnings.simplefilter("ignore")
    sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
    import profile_cpu

    from rlx_core.runtime import Session

    if a.flag.startswith("env:"):
        mod: object = os.environ
        attr = a.flag[4:]
        vals: list[object] = list(a.values)

        def put(v: object) -> None:
            os.environ[attr] = str(v)
    else:
        mod_name, attr = a.flag.rsplit(".", 1)
        mod = importlib.import_module(mod_name)
        vals = [ast.literal_eval(v) for v in a.values]

        def put(v: object) -> None:
            setattr(mod, attr, v)
    g, feed = profile_cpu._zoo_graph(a.model, a.batch)
    exes = []
    for v in vals:
        put(v)
        e = Session("cpu", use_cache=False).compile(g)
        for _ in range(5):
            e.run(feed)
        exes.append(e)
    p50s: list[list[float]] = [[], []]
    for _ in range(a.blocks):
        for i, e in enumerate(exes):
            put(vals[i])
            ts = []
            for _ in range(a.runs):
                t = time.perf_counter()
                e.run(feed)
                ts.append(time.perf_counter() - t)
            p50s[i].append(statistics.median(ts[3:]) * 1e3)
    for v, r in zip(vals, p50s):
        print(f"{a.model} b{a.batch} {attr}={v!r}: median of block p50 {statistics.median(r):.3f} ms "
              f"(blocks {min(r):.3f}-{max(r):.3f})")


if __name__ == "__main__":
    main()
