"""rlx-wasm vs onnxruntime-web (ONNX Runtime's own WebAssembly build), both under Node.js, in one run.

    python bench/wasm_vs_ortweb.py                    # MiniLM-L6-v2 shape, batch 1, seq 128, 1 thread
    python bench/wasm_vs_ortweb.py --threads 4        # onnxruntime-web multi-threaded (RLX stays 1)
    python bench/wasm_vs_ortweb.py --json out.json

The model is all-MiniLM-L6-v2's architecture (6 layers, hidden 384, 12 heads; mean pooling, L2
normalised) with random weights of its shapes (bench/minilm_shapes.json, seed 0): speed does not
depend on the values, and nothing is downloaded. It is built once as an RLX graph; RLX exports it
with ``rlx_wasm.export.export_wasm`` (model.wasm + weights + its own JS loader) and PyTorch exports
the same weights to ONNX for onnxruntime-web. ``bench/wasm_vs_ortweb.mjs`` then loads both in one
Node.js process, checks nothing itself, and times whole calls (inputs in, output copied out)
interleaved, alternating which runtime goes first. This script compares the outputs (cosine of
each against rlx-cpu, and of the two against each other; at least 0.9999 or it fails) and reports
p50/p90 and the ratio rlx/ortweb. onnxruntime-web runs SIMD128 with ``--threads`` threads
(``ort.env.wasm.numThreads``, graph optimisation "all"); RLX's module is single-threaded SIMD128.
For reference it also times the RLX module under wasmtime from Python (``Session("wasm")``).

onnxruntime-web is pinned (1.30.0) and installed with npm into build/ortweb when missing (said so
on stderr). Needs Node.js >= 18, npm, torch and onnx (for the ONNX export) in this environment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ORTWEB_VERSION = "1.30.0"
ROOT = Path(__file__).resolve().parent.parent
MIN_COSINE = 0.9999


def ensure_ortweb(folder: Path) -> str:
    """onnxruntime-web at the pinned version in ``folder`` (npm install when missing)."""
    pkg = folder / "node_modules" / "onnxruntime-web" / "package.json"
    if pkg.is_file() and json.loads(pkg.read_text())["version"] == ORTWEB_VERSION:
        return ORTWEB_VERSION
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("npm not found: install Node.js (>= 18) with npm, or put onnxruntime-web@"
                         f"{ORTWEB_VERSION} in {folder}/node_modules")
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "package.json").exists():
        (folder / "package.json").write_text('{"name": "rlx-ortweb-bench", "private": true}\n')
    print(f"installing onnxruntime-web@{ORTWEB_VERSION} into {folder} (npm)", file=sys.stderr)
    subprocess.run([npm, "install", "--no-audit", "--no-fund", "--save-exact",
                    f"onnxruntime-web@{ORTWEB_VERSION}"], cwd=folder, check=True)
    return ORTWEB_VERSION


def random_minilm() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    spec = json.loads((ROOT / "bench" / "minilm_shapes.json").read_text())
    rng = np.random.default_rng(0)
    weights = {k: (rng.standard_normal(s) * 0.05).astype(np.float32) for k, s in spec["shapes"].items()}
    for k in weights:
        if k.endswith("LayerNorm.weight"):
            weights[k] = np.ones_like(weights[k])
    return spec["config"], weights


def export_onnx(cfg: dict[str, Any], weights: dict[str, np.ndarray], feed: dict[str, np.ndarray],
                path: Path) -> None:
    """The same weights through PyTorch's BERT (rlx_core.bench's, used by `rlx bench`) to ONNX."""
    import torch

    from rlx_core.bench import _torch_bert

    model = _torch_bert(weights, cfg)
    args = tuple(torch.from_numpy(v) for v in feed.values())
    # Static shapes, like the RLX export: both runtimes see exactly one specialisation.
    torch.onnx.export(model, args, str(path), input_names=list(feed), output_names=["embeddings"],
                      opset_version=18, dynamo=True, external_data=False)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def stats(ms: list[float], cpu_ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {"p50_ms": statistics.median(s), "p90_ms": s[int(0.9 * (len(s) - 1))], "min_ms": s[0],
            "cpu_p50_ms": statistics.median(cpu_ms), "n": len(s)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime-web wasm threads (default 1)")
    ap.add_argument("--repeats", type=int, default=40, help="timed calls per runtime (interleaved)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "build" / "wasm_vs_ortweb"), help="work folder")
    ap.add_argument("--ortweb-dir", default=str(ROOT / "build" / "ortweb"))
    ap.add_argument("--tune", choices=("js", "wasmtime"), default="js",
                    help="engine the exported RLX module is tuned for (rlx export --tune; default js)")
    ap.add_argument("--no-wasmtime", action="store_true", help="skip the wasmtime-from-Python reference")
    ap.add_argument("--json", dest="json_out", default=None, help="also write the results as JSON here")
    a = ap.parse_args(argv)

    node = shutil.which("node")
    if node is None:
        raise SystemExit("node not found: Node.js >= 18 is needed")
    ortweb_dir = Path(a.ortweb_dir).resolve()
    ensure_ortweb(ortweb_dir)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    import rlx_wasm
    from rlx_wasm.export import export_wasm

    from rlx_core import Session
    from rlx_core.bench import inputs
    from rlx_core.models.bert import build_bert_encoder

    cfg, weights = random_minilm()
    graph = build_bert_encoder(cfg, weights, pooling="mean", normalize=True, name="minilm")
    feed = inputs("minilm", 1, a.seq)
    t0 = time.perf_counter()
    man = export_wasm(graph, out / "rlx", {"batch": 1, "seq": a.seq}, tune=a.tune)
    t_rlx = time.perf_counter() - t0
    t0 = time.perf_counter()
    # The ONNX export takes ~20 s and depends only on the (seeded) weights, the seq and torch.
    import torch

    stamp = out / "minilm.onnx.stamp"
    key = f"seq={a.seq} torch={torch.__version__} shapes-seed=0\n"
    if not (out / "minilm.onnx").is_file() or not stamp.is_file() or stamp.read_text() != key:
        export_onnx(cfg, weights, feed, out / "minilm.onnx")
        stamp.write_text(key)
    t_onnx = time.perf_counter() - t0
    print(f"MiniLM-L6-v2 shape (random weights, seed 0), batch 1, seq {a.seq}; rlx export {t_rlx:.1f}s "
          f"({(out / 'rlx' / 'model.wasm').stat().st_size / 1024:.0f} KiB wasm), onnx export {t_onnx:.1f}s",
          flush=True)

    ref = Session("cpu", use_cache=False).compile(graph).run(feed)["embeddings"]
    in_specs = []
    for name, arr in feed.items():
        f = out / f"in_{name}.i64"
        f.write_bytes(np.ascontiguousarray(arr, np.int64).tobytes())
        in_specs.append({"name": name, "file": str(f), "shape": list(arr.shape)})
    conf = {"rlx_dir": str(out / "rlx"), "onnx": str(out / "minilm.onnx"), "ortweb_dir": str(ortweb_dir),
            "inputs": in_specs, "threads": a.threads, "warmup": a.warmup, "repeats": a.repeats,
            "out_dir": str(out)}
    (out / "config.json").write_text(json.dumps(conf, indent=2))
    proc = subprocess.run([node, str(ROOT / "bench" / "wasm_vs_ortweb.mjs"), str(out / "config.json")],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"node runner failed (exit {proc.returncode})")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    got_rlx = np.fromfile(out / "out_rlx.f32", np.float32).reshape(ref.shape)
    got_ort = np.fromfile(out / "out_ortweb.f32", np.float32).reshape(ref.shape)
    cos = {"rlx_node_vs_cpu": cosine(got_rlx, ref), "ortweb_vs_cpu": cosine(got_ort, ref),
           "rlx_node_vs_ortweb": cosine(got_rlx, got_ort)}

    rows: dict[str, Any] = {"rlx_wasm_node": stats(res["times"]["rlx"], res["cpu"]["rlx"]),
                            "ortweb_node": stats(res["times"]["ortweb"], res["cpu"]["ortweb"])}
    if not a.no_wasmtime:
        exe = Session("wasm", use_cache=False).compile(graph)
        got_wt = exe.run(feed)["embeddings"]
        cos["rlx_wasmtime_vs_cpu"] = cosine(got_wt, ref)
        for _ in range(a.warmup):
            exe.run(feed)
        ts, cs = [], []
        for _ in range(a.repeats):
            c, t = time.process_time(), time.perf_counter()
            exe.run(feed)
            ts.append((time.perf_counter() - t) * 1e3)
            cs.append((time.process_time() - c) * 1e3)
        rows["rlx_wasm_wasmtime"] = stats(ts, cs)
    ratio = rows["rlx_wasm_node"]["p50_ms"] / rows["ortweb_node"]["p50_ms"]
    cpu_ratio = rows["rlx_wasm_node"]["cpu_p50_ms"] / rows["ortweb_node"]["cpu_p50_ms"]

    from importlib.metadata import version

    meta = {"node": res["node"], "v8": res["v8"], "onnxruntime_web": res["ortweb"],
            "ortweb_threads": a.threads, "rlx_threads": 1, "rlx_simd": res["simd"], "rlx_tune": a.tune,
            "rlx_wasm": rlx_wasm.__version__,
            "wasmtime": version("wasmtime"), "machine": platform.machine(),
            "processor": platform.processor() or "?", "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M"), "seq": a.seq, "batch": 1,
            "wasm_kib": (out / "rlx" / "model.wasm").stat().st_size / 1024, "kernels": len(man["kernels"])}
    print(f"node {meta['node']} (V8 {meta['v8']}), onnxruntime-web {meta['onnxruntime_web']} "
          f"({a.threads} thread{'s' if a.threads > 1 else ''}, SIMD), rlx-wasm {meta['rlx_wasm']} (1 thread, "
          f"{'SIMD128' if res['simd'] else 'scalar'}, tuned for {a.tune}), {a.repeats} interleaved calls")
    print(f"{'runtime':<22} {'p50 ms':>9} {'p90 ms':>9} {'min ms':>9} {'cpu p50':>9}")
    for name, r in rows.items():
        print(f"{name:<22} {r['p50_ms']:>9.2f} {r['p90_ms']:>9.2f} {r['min_ms']:>9.2f} "
              f"{r['cpu_p50_ms']:>9.2f}")
    print(f"ratio rlx/ortweb (p50, Node): {ratio:.3f}x wall, {cpu_ratio:.3f}x CPU time"
          + (" (CPU time sums onnxruntime-web's threads)" if a.threads > 1 else ""))
    print("cosine: " + ", ".join(f"{k} {v:.7f}" for k, v in cos.items()))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"meta": meta, "results": rows, "ratio_p50": ratio,
                                                "ratio_cpu_p50": cpu_ratio, "cosine": cos}, indent=2) + "\n")
    bad = {k: v for k, v in cos.items() if not v >= MIN_COSINE}
    if bad:
        print(f"FAIL: cosine below {MIN_COSINE}: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
