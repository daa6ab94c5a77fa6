"""rlx-cpu convolutions A/B in one process: ResNet-18 with its convs as one conv chain (activations
in oneDNN's blocked layout between convs, ``rlx_cpu.conv_chain``: the default) vs each conv alone
with oneDNN on the row pool (one-thread primitives, NCHW reorders around every conv: the default
before the chains), optionally vs the chain of one-thread pieces (``--chain-pieces``), the chain
on an OpenMP team even where it is tiny (``--chain-team``: ``conv_chain.SOLO_MACS``) or on the
calling thread whatever its size (``--chain-solo``), each conv on
an OpenMP team (``--openmp``,
``onednn_conv.ROW_POOL = False``), vs im2col (``--im2col``), vs the chain with its stem on oneDNN's
conv instead of rlx-cpu's direct kernel (``--onednn-stem``: ``conv_chain.STEM_CONV`` off) and with
that and ReLUs in the NaN-keeping elu form (``--elu-relu``: ``conv_chain.FINITE_RELU`` off too),
vs the chain with its 3x3 convs on oneDNN's direct conv instead of Winograd's F(4x4, 3x3)
(``--direct-3x3``: ``conv_chain.WINOGRAD`` off);
``--no-pool`` leaves out the per-conv side. All programs are compiled
first; then blocks of runs alternate A, B, A, B so that drift and other processes' load hit both.
The first run of each block is dropped (libgomp's worker may still spin from the other side's last
conv). Prints each side's median
over blocks of the block p50, the fastest run, and the median process CPU time a run (a spinning
OpenMP worker counts there; on a loaded machine it varies less than wall time), and ONNX Runtime's
p50 from its own process (``--ort``) or as one more side of the alternation in this process
(``--ort-inline``: 2 intra-op threads; its spinning threads may still run into the next side's
first run, which is dropped).

    taskset -c 0,1 python bench/conv_ab.py --batch 1 --batch 8 --rounds 6 --ort
    python bench/conv_ab.py --zoo efficientnet_b0 --batch 1 --batch 8   # a zoo CNN (64x64, tests/_zoo.py)
    python bench/conv_ab.py --zoo conv1d_audio --batch 1 --chain-team --block 200 --rounds 6
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time
from typing import Any


def _programs(graph: Any, feed: dict[str, Any], sides: list[str]) -> dict[str, Any]:
    from rlx_cpu import conv_chain, onednn_conv

    from rlx_core.runtime import Session

    exes = {}
    saved = conv_chain.USE, conv_chain.OPENMP, conv_chain.SOLO_MACS, onednn_conv.ROW_POOL, onednn_conv.USE
    stem = conv_chain.STEM_CONV, conv_chain.FINITE_RELU, conv_chain.WINOGRAD
    for side in sides:
        # off: the chain's convs bound one at a time
        conv_chain.USE = side in ("chain", "chain-openmp", "chain-team", "chain-solo", "chain-pieces",
                                  "onednn-stem", "elu-relu", "direct-3x3")
        conv_chain.STEM_CONV = stem[0] and side not in ("onednn-stem", "elu-relu")
        conv_chain.FINITE_RELU = stem[1] and side != "elu-relu"
        conv_chain.WINOGRAD = stem[2] and side != "direct-3x3"
        conv_chain.OPENMP = side != "chain-pieces"
        conv_chain.SOLO_MACS = {"chain-team": 0, "chain-solo": 1 << 62}.get(side, saved[2])
        onednn_conv.ROW_POOL = side != "openmp"
        onednn_conv.USE = side != "im2col"
        exe = Session("cpu", use_cache=False).compile(graph)
        exe.run(feed)  # binds the kernels with the switches above
        exes[side] = exe
    conv_chain.USE, conv_chain.OPENMP, conv_chain.SOLO_MACS, onednn_conv.ROW_POOL, onednn_conv.USE = saved
    conv_chain.STEM_CONV, conv_chain.FINITE_RELU, conv_chain.WINOGRAD = stem
    return exes


class _Ort:
    """ONNX Runtime on the same model as a side: ``run(feed)`` as an Executable's."""

    def __init__(self, path: str, feed: dict[str, Any]) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.sess.get_inputs()]
        self.outs = [o.name for o in self.sess.get_outputs()]

    def run(self, feed: dict[str, Any]) -> dict[str, Any]:
        vals = list(feed.values())
        res = self.sess.run(None, dict(zip(self.names, vals)))
        return dict(zip(self.outs, res))


def _zoo() -> Any:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    return importlib.import_module("_zoo")  # the tests' zoo (not type-checked with the benches)


def _zoo_path(name: str, batch: int) -> Any:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    return _zoo().export(name, "legacy", False, root / ".pytest_cache" / "rlx-onnx-zoo", batch=batch)


def _zoo_model(name: str, batch: int) -> tuple[Any, dict[str, Any]]:
    from rlx_core.frontends.onnx import load_onnx

    return load_onnx(str(_zoo_path(name, batch))), dict(_zoo().feeds(name, batch))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--block", type=int, default=8, help="runs per block (the first is dropped)")
    ap.add_argument("--openmp", action="store_true", help="a side: each conv on an OpenMP team")
    ap.add_argument("--chain-pieces", action="store_true",
                    help="a side: the chain with one-thread primitives cut into pieces for the row pool "
                         "(conv_chain.OPENMP off; the default chain is on OpenMP teams)")
    ap.add_argument("--chain-openmp", action="store_true",
                    help="a side: the chain on OpenMP teams (the default chain since 2026-12-02; kept so "
                         "that older commands in docs/BENCHMARKS.md still run)")
    ap.add_argument("--chain-team", action="store_true",
                    help="a side: the chain on an OpenMP team even below conv_chain.SOLO_MACS")
    ap.add_argument("--chain-solo", action="store_true",
                    help="a side: the chain on the calling thread alone whatever its size")
    ap.add_argument("--im2col", action="store_true", help="a side: the im2col path")
    ap.add_argument("--onednn-stem", action="store_true",
                    help="a side: the chain with oneDNN's conv for the stem (conv_chain.STEM_CONV off)")
    ap.add_argument("--elu-relu", action="store_true",
                    help="a side: as --onednn-stem, and every ReLU post-op in the NaN-keeping elu form "
                         "(conv_chain.FINITE_RELU off)")
    ap.add_argument("--direct-3x3", action="store_true",
                    help="a side: the chain with its 3x3 convs on oneDNN's direct conv "
                         "(conv_chain.WINOGRAD off)")
    ap.add_argument("--no-pool", action="store_true", help="leave out the side of convs bound one at a time")
    ap.add_argument("--ort", action="store_true", help="ONNX Runtime's p50 in its own process (ResNet-18)")
    ap.add_argument("--ort-inline", action="store_true",
                    help="a side: ONNX Runtime (2 threads) in this process, alternating with the others")
    ap.add_argument("--zoo", help="a zoo CNN instead of ResNet-18 (tests/_zoo.py; exports cached where "
                                  "the tests cache them)")
    a = ap.parse_args()
    from rlx_core import bench

    sides = ["chain"] + ([] if a.no_pool else ["pool"]) + (["chain-pieces"] if a.chain_pieces else [])
    sides += (["onednn-stem"] if a.onednn_stem else []) + (["elu-relu"] if a.elu_relu else [])
    sides += ["direct-3x3"] if a.direct_3x3 else []
    sides += (["chain-openmp"] if a.chain_openmp else []) + (["chain-team"] if a.chain_team else [])
    sides += ["chain-solo"] if a.chain_solo else []
    sides += (["openmp"] if a.openmp else []) + (["im2col"] if a.im2col else [])
    print(f"cpus {sorted(os.sched_getaffinity(0))}, load {os.getloadavg()}")
    for batch in a.batch or [1]:
        graph, feed = _zoo_model(a.zoo, batch) if a.zoo else (bench.rlx_graph("resnet18"),
                                                              bench.inputs("resnet18", batch, 128))
        exes = _programs(graph, feed, sides)
        ref = exes["chain"].run(feed)
        if a.ort_inline:
            exes["ort"] = _Ort(str(_zoo_path(a.zoo, batch) if a.zoo else bench.onnx_path("resnet18")), feed)
            got = exes["ort"].run(feed)
            for (k, v), o in zip(ref.items(), got.values()):
                err = float(abs(v - o).max())
                assert err < 1e-3 * max(1.0, float(abs(v).max())), ("ort", k, err)
                print(f"batch {batch}: output {k} vs ORT's: max abs difference {err:.2g} on values up to "
                      f"{float(abs(o).max()):.2g}, same argmax {bool((v.argmax(-1) == o.argmax(-1)).all())}")
        for s in sides[1:]:
            for k, v in exes[s].run(feed).items():
                err = float(abs(v - ref[k]).max())
                assert err < 1e-3 * max(1.0, float(abs(ref[k]).max())), (s, k, err)
        sides_all = sides + (["ort"] if a.ort_inline else [])
        p50s: dict[str, list[float]] = {s: [] for s in sides_all}
        cpu: dict[str, list[float]] = {s: [] for s in sides_all}  # process CPU time a run (spinning counts)
        best = dict.fromkeys(sides_all, float("inf"))  # fastest run: the moments both cores were free
        for r in range(a.rounds):
            for s in sides_all if r % 2 == 0 else sides_all[::-1]:
                ts = []
                exes[s].run(feed)
                c0 = time.process_time()
                for _ in range(a.block - 1):
                    t0 = time.perf_counter()
                    exes[s].run(feed)
                    ts.append(time.perf_counter() - t0)
                cpu[s].append((time.process_time() - c0) / len(ts) * 1e3)
                best[s] = min(best[s], min(ts) * 1e3)
                p50s[s].append(statistics.median(ts) * 1e3)
        line = ", ".join(f"{s} {statistics.median(v):.3f} ms (blocks {min(v):.3f}-{max(v):.3f}; "
                         f"fastest {best[s]:.3f}; CPU {statistics.median(cpu[s]):.3f} ms a run)"
                         for s, v in p50s.items())
        if a.ort_inline:
            ort_p50 = statistics.median(p50s["ort"])
            line += ", " + ", ".join(f"{s}/ORT {statistics.median(p50s[s]) / ort_p50:.3f}" for s in sides)
        if a.ort and not a.zoo:
            o = bench.run_one("ort", "resnet18", batch, 128, False)
            line += f", ORT {o.get('p50_s', float('nan')) * 1e3:.2f} ms"
        print(f"{a.zoo or 'resnet18'} batch {batch}: {line}; load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
