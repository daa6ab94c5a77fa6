"""Interleaved A/B of rlx-cpu on ONNX zoo exports: two source trees, alternating processes.

    python bench/onnx_zoo_ab.py --old /tmp/old --models bert,vit_hf --rounds 3

``--old`` is a directory holding an older ``src/rlx_core`` tree under ``src/`` and an older
``rlx_cpu`` package under ``cpu/`` (e.g. ``git archive`` of a commit): the "old" processes put them
first on ``PYTHONPATH``, the "new" ones run the working tree (or ``--new``, laid out the
same). Each process times one model at one batch: p50 of ``Executable.run`` and of ONNX Runtime
on the same feeds (ORT, run in the same process right after, is the load reference: compare the
RLX/ORT ratios, not raw milliseconds). Old and new alternate per round, so load from other
processes hits both alike. Exports come from the zoo
cache (.pytest_cache/rlx-onnx-zoo/, written by ``bench/onnx_zoo.py`` or the zoo tests).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import glob, json, os, statistics, sys, time, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
import _zoo
from rlx_core.frontends.onnx import load_onnx
from rlx_core.runtime import Session
name, b, reps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cache = os.path.join(sys.argv[1], ".pytest_cache", "rlx-onnx-zoo")
path = _zoo.export(name, "legacy", False, __import__("pathlib").Path(cache), batch=b)
feeds = _zoo.feeds(name, b)
exe = Session("cpu").compile(load_onnx(path))
sess = _zoo.ort_session(path)
def p50(fn):
    for _ in range(5):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3
rlx = p50(lambda: exe.run(feeds))
ort = p50(lambda: sess.run(None, feeds))
print(json.dumps({"rlx": rlx, "ort": ort}))
"""


def child(tree: str | None, name: str, batch: int, reps: int) -> dict[str, float]:
    env = dict(os.environ, RLX_BACKENDS="cpu")
    if tree:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(tree) / "src"), str(Path(tree) / "cpu"),
                                             env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), name, str(batch), str(reps)], env=env,
                         capture_output=True, text=True, check=True).stdout
    res: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True,
                    help="directory with src/rlx_core and cpu/rlx_cpu of the baseline")
    ap.add_argument("--new", help="the same for the new side (default: the working tree)")
    ap.add_argument("--models", default="bert,vit_hf,whisper_encoder,llama")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json", help="also write every process's p50s and the medians to this file")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    print(f"load average at start: {os.getloadavg()}")
    cols = ("old ms", "new ms", "ORT ms", "old/ORT", "new/ORT", "new/old")
    print(f"{'model':18} {'b':>2} " + " ".join(f"{c:>8}" for c in cols))
    for name in args.models.split(","):
        for b in (int(x) for x in args.batches.split(",")):
            runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
            for _ in range(args.rounds):
                runs["old"].append(child(args.old, name, b, args.reps))
                runs["new"].append(child(args.new, name, b, args.reps))
            med = {k: {m: statistics.median(r[m] for r in v) for m in ("rlx", "ort")}
                   for k, v in runs.items()}
            ro = statistics.median(r["rlx"] / r["ort"] for r in runs["old"])
            rn = statistics.median(r["rlx"] / r["ort"] for r in runs["new"])
            ort = statistics.median([r["ort"] for v in runs.values() for r in v])
            print(f"{name:18} {b:2d} {med['old']['rlx']:8.3f} {med['new']['rlx']:8.3f} {ort:8.3f} "
                  f"{ro:8.2f} {rn:8.2f} {med['new']['rlx'] / med['old']['rlx']:8.2f}", flush=True)
            rows.append({"model": name, "batch": b, "runs": runs, "old_ms": med["old"]["rlx"],
                         "new_ms": med["new"]["rlx"], "ort_ms": ort, "old_over_ort": ro, "new_over_ort": rn})
    print(f"load average at end: {os.getloadavg()}")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "old": args.old,
                "rounds": args.rounds}
        Path(args.json).write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
