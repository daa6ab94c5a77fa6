"""How much a busy core slows each runtime: MiniLM (or another `rlx bench` workload) with and
without a busy loop pinned to the last CPU this process may use.

    python bench/busy_core.py --batch 8                 # rlx, rlx with one fixed piece a thread, ort
    python bench/busy_core.py --batch 8 --json out.json

Every runtime runs in its own process (``rlx_core.bench.run_one``), as ``rlx bench infer`` does.
"rlx (1 piece/thread)" sets ``RLX_CPU_CHAIN_PIECES=1``: row chains then cut rows into one fixed
piece a thread, so a thread on the busy core holds the others up at every barrier. A benchmark,
not a test: numbers depend on the machine and its other load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any


def _busy_loop(cpu: int) -> subprocess.Popen[bytes]:
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="minilm", choices=["minilm", "resnet18", "mlp"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--json", dest="json_path")
    a = ap.parse_args()
    from rlx_core.bench import run_one

    configs: list[tuple[str, str, dict[str, str]]] = [
        ("rlx", "rlx", {}), ("rlx (1 piece/thread)", "rlx", {"RLX_CPU_CHAIN_PIECES": "1"}),
        ("ort", "ort", {})]
    cpu = max(os.sched_getaffinity(0))
    rows: list[dict[str, Any]] = []
    for busy in (False, True):
        for label, runtime, env in configs:
            old = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            hog = _busy_loop(cpu) if busy else None
            try:
                r = run_one(runtime, a.model, a.batch, a.seq, False)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
                for k, v in old.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            r.update(label=label, busy_core=busy)
            rows.append(r)
            p50 = r.get("p50_s", float("nan")) * 1e3
            print(f"{'busy' if busy else 'quiet':5s}  {label:22s} p50 {p50:9.2f} ms", flush=True)
    by = {(r["label"], r["busy_core"]): r.get("p50_s", float("nan")) for r in rows}
    print(f"\n{a.model} batch {a.batch}: slowdown from a busy loop on CPU {cpu}")
    for label, _, _ in configs:
        print(f"  {label:22s} x{by[(label, True)] / by[(label, False)]:.2f}")
    if a.json_path:
        with open(a.json_path, "w") as f:
            json.dump({"model": a.model, "batch": a.batch, "busy_cpu": cpu, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
