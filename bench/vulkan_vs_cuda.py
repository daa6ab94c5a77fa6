"""rlx-vulkan against rlx-cuda on one GPU, in one run (issue 18's goal: within 2x of rlx-cuda on a
4096^3 f32 GEMM and on MiniLM-L6-v2 batch 32 seq 128).

Every row is ``Executable.run`` end to end (host inputs in, host outputs out: the copies are part of
what a user waits for), p50 over ``--runs`` after one warm-up run, all rows in this one process.
rlx-vulkan runs in several configurations (``RLX_VULKAN_GEMM`` x ``RLX_VULKAN_MEMORY``, read when a
program is compiled): the default first, then the others as an A/B of what each change buys.
For each Vulkan row the GEMM variant that ran is reported (``VulkanProgram.gemm_variants``) and the
device time between the first and the last dispatch (timestamp queries, copies excluded), and
MiniLM's device time per kernel class (matmul/linear, attention, softmax, layer_norm, elementwise,
copies) from a second compile with a timestamp after every dispatch (``RLX_VULKAN_PROFILE``).
Correctness: the GEMM against NumPy's f32 product (max |err| / max |ref|), MiniLM's embeddings
against rlx-cpu (lowest per-sentence cosine). MiniLM weights are the installed all-MiniLM-L6-v2 or
random ones of its shapes (see bench/gpu_targets.py); speed does not depend on the values.

    python bench/vulkan_vs_cuda.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: the Vulkan configurations (RLX_VULKAN_GEMM / RLX_VULKAN_MEMORY / RLX_VULKAN_ATTENTION /
#: RLX_VULKAN_EPILOGUES); the first is the default. "off/noepi" rows are the kernels before the fused
#: attention and the store epilogues (the 2026-12-02 run: its "small" row is auto/device/off/noepi now,
#: its default mostly large/device/off/noepi); "off/epi" and "fused/noepi" split the two changes.
VULKAN_CONFIGS = [("auto", "device", "fused", "epi"), ("auto", "device", "off", "noepi"),
                  ("auto", "device", "off", "epi"), ("auto", "device", "fused", "noepi"),
                  ("large", "device", "fused", "epi"), ("large", "device", "off", "noepi"),
                  ("basic", "device", "off", "noepi")]


def kernel_class(node: str, kernel: str) -> str:
    """The class a dispatch's device time is reported under (the per-class breakdown)."""
    op = kernel.split(".", 1)[-1]
    if op == "attention":
        return "attention (fused)"
    if "attention" in node:  # the decomposition's parts, named after the attention node
        part = "matmul" if op == "matmul" else "copy" if op == "transpose" else "softmax+mask"
        return "attention: " + part
    if op in ("matmul", "linear"):
        return "matmul/linear"
    if op in ("softmax", "log_softmax", "layer_norm"):
        return op
    if op.startswith("reduce_") or op in ("argmax", "argmin", "cumsum"):
        return "reductions"
    if op in ("transpose", "reshape", "concat", "slice", "pad", "expand", "gather", "iota", "copy"):
        return "copies/movement"
    return "elementwise"


def breakdown(prog: Any) -> dict[str, Any] | None:
    """Device time per kernel class (ms) and dispatches per class, from a RLX_VULKAN_PROFILE program."""
    times = prog.dispatch_times() if hasattr(prog, "dispatch_times") else None
    if not times:
        return None
    ms: dict[str, float] = {}
    count: dict[str, int] = {}
    for node, kernel, t in times:
        c = kernel_class(node, kernel)
        ms[c] = ms.get(c, 0.0) + t * 1e3
        count[c] = count.get(c, 0) + 1
    return {"ms": dict(sorted(ms.items(), key=lambda kv: -kv[1])), "dispatches": count,
            "total_ms": sum(ms.values())}


def p50(fn: Any, runs: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def compiled_of(exe: Any, bindings: dict[str, int]) -> Any:
    """The backend's compiled program behind an Executable (for the Vulkan diagnostics)."""
    try:
        return exe._specialise(bindings)[0]
    except Exception:
        return None


def measure(row: dict[str, Any], s: Any, graph: Any, feed: dict[str, np.ndarray], bind: dict[str, int],
            ref: np.ndarray, gemm: Any, av: np.ndarray, bv: np.ndarray, cref: np.ndarray, args: Any) -> None:
    """One backend (configuration): MiniLM then the GEMM, results into ``row``."""
    n = args.gemm
    row["detail"] = str(s.devices[0][1].details)
    t = time.perf_counter()
    exe = s.compile(graph)
    got = exe.run(feed)["embeddings"]
    row["minilm_first_run_s"] = time.perf_counter() - t
    cos = np.sum(got * ref, 1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    row["minilm_cosine_min"] = float(np.min(cos))
    row["minilm_p50_ms"] = p50(lambda: exe.run(feed), args.runs) * 1e3
    prog = compiled_of(exe, bind)
    if row["device"] == "vulkan" and prog is not None:
        row["minilm_gpu_ms"] = (prog.gpu_seconds() or 0.0) * 1e3
        row["minilm_gemm_variants"] = sorted(set(prog.gemm_variants.values()))
        row["minilm_dispatches"] = len(prog.all_launches())
        row["minilm_attention"] = "fused" if prog.dispatch_counts.get("vulkan.attention") else "decomposed"
    if row["device"] == "vulkan" and row.get("memory") == "device" and args.breakdown:
        # a second compile with a timestamp after every dispatch (kept out of the p50 above)
        os.environ["RLX_VULKAN_PROFILE"] = "1"
        try:
            pexe = s.compile(graph)
            for _ in range(3):
                pexe.run(feed)
            pprog = compiled_of(pexe, bind)
            row["minilm_breakdown"] = breakdown(pprog) if pprog is not None else None
        finally:
            os.environ.pop("RLX_VULKAN_PROFILE", None)
    ge = s.compile(gemm)
    c_out = ge.run({"a": av, "b": bv})["c"]
    row["gemm_rel_err"] = float(np.abs(c_out - cref).max() / np.abs(cref).max())
    row["gemm_p50_ms"] = p50(lambda: ge.run({"a": av, "b": bv}), args.gemm_runs) * 1e3
    row["gemm_gflops_e2e"] = 2 * n**3 / (row["gemm_p50_ms"] * 1e-3) / 1e9
    prog = compiled_of(ge, {})
    if row["device"] == "vulkan" and prog is not None:
        gs = prog.gpu_seconds()
        row["gemm_gpu_ms"] = (gs or 0.0) * 1e3
        if gs:
            row["gemm_gflops_device"] = 2 * n**3 / gs / 1e9
        row["gemm_variant"] = next(iter(prog.gemm_variants.values()), "?")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gemm", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--gemm-runs", type=int, default=10)
    ap.add_argument("--configs", default=",".join("/".join(c) for c in VULKAN_CONFIGS),
                    help="Vulkan configurations GEMM/MEMORY[/ATTENTION[/epi|noepi]], comma-separated "
                         "(first = the one compared)")
    ap.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                    help="skip the per-kernel-class device time (a second MiniLM compile per Vulkan row)")
    ap.add_argument("--no-cuda", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from gpu_targets import minilm_graph

    from rlx_core import GraphBuilder, Session

    t0 = time.perf_counter()
    graph, source = minilm_graph()
    rng = np.random.default_rng(1)
    ids = rng.integers(1000, 20000, (args.batch, args.seq)).astype(np.int64)
    mask = np.ones((args.batch, args.seq), np.int64)
    feed = {"input_ids": ids, "attention_mask": mask}
    bind = {"batch": args.batch, "seq": args.seq}
    ref = Session("cpu", use_cache=False).compile(graph).run(feed)["embeddings"]
    n = args.gemm
    g = GraphBuilder("gemm")
    a = g.input("a", "f32", (n, n))
    b = g.input("b", "f32", (n, n))
    g.output(a @ b, "c")
    gemm = g.build()
    av = rng.standard_normal((n, n)).astype(np.float32)
    bv = rng.standard_normal((n, n)).astype(np.float32)
    cref = av @ bv
    print(f"MiniLM-L6-v2 encoder b{args.batch} s{args.seq} ({source}); GEMM {n}^3 f32; "
          f"p50 of {args.runs} / {args.gemm_runs} runs, end to end (host copies included); "
          f"reference ready in {time.perf_counter() - t0:.1f} s", flush=True)

    rows: list[dict[str, Any]] = []

    def dump(verdict: dict[str, Any]) -> None:
        if args.json:
            doc = {"source": source, "batch": args.batch, "seq": args.seq, "gemm": n, "runs": args.runs,
                   "rows": rows, "verdict": verdict}
            args.json.write_text(json.dumps(doc, indent=1))

    plan: list[tuple[str, str, str, str, str]] = [] if args.no_cuda else [("cuda", "", "", "", "")]
    for c in args.configs.split(","):
        parts = c.split("/")
        gm, mem, att, epi = (*parts, *("auto", "device", "fused", "epi")[len(parts):])[:4]
        plan.append(("vulkan", gm, mem, att, epi))
    for dev, gm, mem, att, epi in plan:
        label = dev if dev != "vulkan" else f"vulkan[{gm}/{mem}/{att}/{epi}]"
        if dev == "vulkan":
            os.environ["RLX_VULKAN_GEMM"], os.environ["RLX_VULKAN_MEMORY"] = gm, mem
            os.environ["RLX_VULKAN_ATTENTION"] = att
            os.environ["RLX_VULKAN_EPILOGUES"] = "0" if epi == "noepi" else "1"
        row: dict[str, Any] = {"device": dev}
        if dev == "vulkan":
            row.update(gemm_setting=gm, memory=mem, attention=att, epilogues=epi, label=label)
        try:
            measure(row, Session(dev, use_cache=False), graph, feed, bind, ref, gemm, av, bv, cref, args)
        except Exception as e:  # a target without a device here: say why, go on
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        rows.append(row)
        dump({})  # after every row: a run cut short by a timeout still leaves what it measured
        if "error" in row:
            print(f"FAIL {label}: {row['error']}", flush=True)
            continue
        extra = ""
        if dev == "vulkan":
            extra = (f" | device time: MiniLM {row.get('minilm_gpu_ms', 0):.2f} ms, GEMM "
                     f"{row.get('gemm_gpu_ms', 0):.2f} ms ({row.get('gemm_gflops_device', 0):.0f} GFLOP/s); "
                     f"GEMM variant {row.get('gemm_variant')}; MiniLM {row.get('minilm_gemm_variants')}, "
                     f"{row.get('minilm_dispatches')} dispatches, attention {row.get('minilm_attention')}")
        print(f"{label:32s} MiniLM p50 {row['minilm_p50_ms']:8.2f} ms (cos {row['minilm_cosine_min']:.7f}) | "
              f"GEMM p50 {row['gemm_p50_ms']:8.2f} ms = {row['gemm_gflops_e2e']:7.0f} GFLOP/s e2e "
              f"(rel err {row['gemm_rel_err']:.1e}){extra}", flush=True)
        bd = row.get("minilm_breakdown")
        if bd:
            parts = ", ".join(f"{k} {v:.2f} ms/{bd['dispatches'][k]}" for k, v in bd["ms"].items())
            print(f"    MiniLM device time by kernel class (ms/dispatches; total {bd['total_ms']:.2f} ms "
                  f"with a timestamp per dispatch): {parts}", flush=True)

    cuda = next((r for r in rows if r["device"] == "cuda" and "error" not in r), None)
    vk = next((r for r in rows if r["device"] == "vulkan"), None)
    verdict: dict[str, Any] = {}
    if cuda and vk and "error" not in vk:
        for w in ("minilm", "gemm"):
            ratio = vk[f"{w}_p50_ms"] / cuda[f"{w}_p50_ms"]
            verdict[f"{w}_ratio"] = ratio
            ok = ratio <= 2.0
            vms, cms = vk[f"{w}_p50_ms"], cuda[f"{w}_p50_ms"]
            print(f"{'PASS' if ok else 'MISS'} {w}: {vk['label']} "
                  f"{vms:.2f} ms / cuda {cms:.2f} ms = {ratio:.2f}x (goal <= 2x)")
    elif not args.no_cuda:
        print("FAIL no ratio: the cuda or the default vulkan row did not run")
        verdict["no_ratio"] = True
    by = {r.get("label"): r for r in rows if r["device"] == "vulkan" and "error" not in r}
    # before (no fused attention, no epilogues) -> after, same GEMM setting; and each change alone
    pairs = [(f"{gm}: before -> after", f"{gm}/device/off/noepi", f"{gm}/device/fused/epi") for gm in
             ("auto", "large", "small")]
    pairs += [("auto: fused attention alone", "auto/device/off/noepi", "auto/device/fused/noepi"),
              ("auto: epilogues alone", "auto/device/off/noepi", "auto/device/off/epi")]
    for what, before, after in pairs:
        a, b = by.get(f"vulkan[{before}]"), by.get(f"vulkan[{after}]")
        if a and b:
            verdict[what] = {"before_ms": a["minilm_p50_ms"], "after_ms": b["minilm_p50_ms"]}
            print(f"BEFORE/AFTER {what}: MiniLM p50 {a['minilm_p50_ms']:.2f} -> "
                  f"{b['minilm_p50_ms']:.2f} ms, device {a.get('minilm_gpu_ms', 0):.2f} -> "
                  f"{b.get('minilm_gpu_ms', 0):.2f} ms, dispatches {a.get('minilm_dispatches')} -> "
                  f"{b.get('minilm_dispatches')}")
    acc_ok = True
    for r in rows:  # every configuration must run and be right, not only the default
        if r["device"] != "vulkan":
            continue
        if "error" in r:
            acc_ok = False
            continue
        ok = r["minilm_cosine_min"] >= 0.9999 and r["gemm_rel_err"] < 1e-4
        acc_ok = acc_ok and ok
        print(f"{'PASS' if ok else 'FAIL'} accuracy {r['label']}: MiniLM cosine "
              f"{r['minilm_cosine_min']:.7f} (>= 0.9999), GEMM rel err {r['gemm_rel_err']:.1e} (< 1e-4)")
    verdict["accuracy_ok"] = acc_ok and vk is not None
    dump(verdict)
    return 0 if verdict["accuracy_ok"] and not verdict.get("no_ratio") else 1


if __name__ == "__main__":
    sys.exit(main())
