"""How much a busy core slows RLX and ONNX Runtime: MiniLM, the MLP and ResNet-18 with and without
a busy loop pinned to the last CPU this process may use, RLX/ORT p50 ratios quiet vs busy.

    python bench/busy_core.py                                  # mlp:256 mlp:1 resnet18:1 minilm:8
    python bench/busy_core.py mlp:256 resnet18:1 --rounds 3
    taskset -c 0,1 python bench/busy_core.py --threads 2       # a bigger machine pinned to 2 cores
    python bench/busy_core.py minilm:8 --config "rlx 1 piece=rlx:RLX_CPU_CHAIN_PIECES=1" --json out.json
    # before/after in one run: a worktree of the old commit as one more RLX variant
    git worktree add /tmp/before <commit>
    B=$(printf %s: /tmp/before/src /tmp/before/plugins/*/src)
    python bench/busy_core.py --config "before=rlx:PYTHONPATH=$B"

Every measurement runs in its own process (``rlx_core.bench.run_one``, as ``rlx bench infer``
does), with default settings unless ``--config`` adds variants. Rounds alternate quiet and busy and
RLX and ORT, so drift of the machine hits every side; each figure is the median over rounds of
each process's p50. ``--threads`` sets ``RLX_BENCH_THREADS`` (the threads ONNX Runtime is given;
default: the CPUs this process may run on); RLX keeps its own default policy.
A benchmark, not a test: numbers depend on the machine and its other load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any


def _busy_loop(cpu: int) -> subprocess.Popen[bytes]:
    """A process spinning on ``cpu`` until killed, or until this one dies: a benchmark killed from
    outside (no ``finally``) must not leave a busy core behind for every later measurement."""
    code = (f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nparent = os.getppid()\nn = 0\n"
            "while True:\n    n += 1\n    if n % 1000000 == 0 and os.getppid() != parent:\n        break\n")
    return subprocess.Popen([sys.executable, "-c", code])


def _config(spec: str) -> tuple[str, str, dict[str, str]]:
    """``label=runtime:KEY=VAL,KEY=VAL`` -> (label, runtime, env)."""
    label, _, rest = spec.partition("=")
    runtime, _, envs = rest.partition(":")
    env = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
    if runtime not in ("rlx", "ort", "torch"):
        raise SystemExit(f"--config {spec!r}: runtime must be rlx, ort or torch (label=runtime:K=V,...)")
    return label, runtime, env


def _run(runtime: str, model: str, batch: int, seq: int, quick: bool, env: dict[str, str],
         busy_cpu: int | None) -> dict[str, Any]:
    from rlx_core.bench import run_one

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    hog = _busy_loop(busy_cpu) if busy_cpu is not None else None
    try:
        return run_one(runtime, model, batch, seq, quick)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="*", default=["mlp:256", "mlp:1", "resnet18:1", "minilm:8"],
                    help="MODEL:BATCH with MODEL one of minilm, resnet18, mlp")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, help="RLX_BENCH_THREADS for the peers (default: CPUs allowed)")
    ap.add_argument("--busy-cpu", type=int, help="CPU the busy loop runs on (default: the last allowed)")
    ap.add_argument("--config", action="append", default=[],
                    help="extra variant label=runtime:KEY=VAL,... (e.g. 'rlx 1t=rlx:RLX_CPU_THREADS=1')")
    ap.add_argument("--quick", action="store_true", help="shorter measurements (smoke runs)")
    ap.add_argument("--rss", action="store_true",
                    help="also a column of each runtime's peak RSS (MB, median over the quiet runs)")
    ap.add_argument("--json", dest="json_path")
    a = ap.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    cpu = a.busy_cpu if a.busy_cpu is not None else allowed[-1]
    os.environ["RLX_BENCH_THREADS"] = str(a.threads or len(allowed))
    configs: list[tuple[str, str, dict[str, str]]] = [("rlx", "rlx", {}), ("ort", "ort", {})]
    configs += [_config(c) for c in a.config]
    loads: list[tuple[str, int]] = []
    for w in a.workloads:
        model, _, b = w.partition(":")
        loads.append((model, int(b or 1)))
    print(f"CPUs allowed {allowed}, peers' threads {os.environ['RLX_BENCH_THREADS']}, busy loop on CPU {cpu}",
          flush=True)
    rows: list[dict[str, Any]] = []
    for rnd in range(a.rounds):
        # Alternate the order of quiet/busy and of the runtimes from round to round.
        for busy in ((False, True) if rnd % 2 == 0 else (True, False)):
            for model, batch in loads:
                for label, runtime, env in (configs if rnd % 2 == 0 else configs[::-1]):
                    r = _run(runtime, model, batch, a.seq, a.quick, env, cpu if busy else None)
                    r.update(label=label, busy_core=busy, round=rnd)
                    rows.append(r)
                    p50 = r.get("p50_s", float("nan")) * 1e3
                    err = f"  ERROR {r['error']}" if "error" in r else ""
                    print(f"round {rnd} {'busy ' if busy else 'quiet'} {model}:{batch:<4d} {label:16s} "
                          f"p50 {p50:9.3f} ms{err}", flush=True)

    def med(label: str, model: str, batch: int, busy: bool) -> float:
        v = [r.get("p50_s", float("nan")) for r in rows if r["label"] == label and r["model"] == model
             and r["batch"] == batch and r["busy_core"] == busy]
        return statistics.median(v) * 1e3 if v else float("nan")

    def rss(label: str, model: str, batch: int) -> float:
        v = [r["peak_rss_mb"] for r in rows if r["label"] == label and r["model"] == model
             and r["batch"] == batch and not r["busy_core"] and "peak_rss_mb" in r]
        return statistics.median(v) if v else float("nan")

    print(f"\nmedian over {a.rounds} rounds of each process's p50 (ms); busy = a busy loop on CPU {cpu}")
    print(f"{'workload':14s} {'runtime':16s} {'quiet':>9s} {'busy':>9s} {'slowdown':>8s} "
          f"{'/ort quiet':>10s} {'/ort busy':>10s}" + (f" {'peak RSS MB':>11s}" if a.rss else ""))
    summary = []
    for model, batch in loads:
        oq, ob = med("ort", model, batch, False), med("ort", model, batch, True)
        for label, _, _ in configs:
            q, b = med(label, model, batch, False), med(label, model, batch, True)
            mb = rss(label, model, batch)
            print(f"{model + ':' + str(batch):14s} {label:16s} {q:9.3f} {b:9.3f} {b / q:7.2f}x "
                  f"{q / oq:9.2f}x {b / ob:9.2f}x" + (f" {mb:11.0f}" if a.rss else ""))
            summary.append({"model": model, "batch": batch, "label": label, "quiet_ms": q, "busy_ms": b,
                            "ratio_ort_quiet": q / oq, "ratio_ort_busy": b / ob, "peak_rss_mb": mb})
    if a.json_path:
        with open(a.json_path, "w") as f:
            json.dump({"busy_cpu": cpu, "allowed": allowed, "summary": summary, "results": rows}, f,
                      indent=2)


if __name__ == "__main__":
    main()
