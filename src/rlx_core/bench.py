"""``rlx bench``: this project against its peers (ONNX Runtime, PyTorch, NumPy) in one run.

Every (runtime, workload, batch) is measured in its own subprocess so peak RSS is that runtime's
alone; all runtimes get the same thread count. Reported: p50/p90 latency, peak RSS, RLX compile
time (cold and cached), achieved GFLOP/s and the fraction of a GEMM roofline measured in the same
run on the same machine.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

WORKLOADS = ("minilm", "resnet18", "mlp")
RUNTIMES = ("rlx", "ort", "torch")


def _threads() -> int:
    from .settings import BENCH_THREADS

    threads: int = BENCH_THREADS.get() or os.cpu_count() or 1
    return threads


# -- workloads ----------------------------------------------------------------------------------

def _torch_bert(weights: dict[str, Any], cfg: dict[str, Any]) -> Any:
    import torch
    from torch import nn

    f = nn.functional

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(torch.from_numpy(v.copy()),
                                                                        requires_grad=False)
                                       for k, v in weights.items()})

        def p(self, name: str) -> Any:
            return self.w[name.replace(".", "__")]

        def forward(self, ids: Any, mask: Any) -> Any:
            b, s = ids.shape
            heads = cfg["num_attention_heads"]
            eps = cfg["layer_norm_eps"]
            h = (self.p("embeddings.word_embeddings.weight")[ids]
                 + self.p("embeddings.position_embeddings.weight")[torch.arange(s)][None]
                 + self.p("embeddings.token_type_embeddings.weight")[0])
            h = f.layer_norm(h, (h.shape[-1],), self.p("embeddings.LayerNorm.weight"),
                             self.p("embeddings.LayerNorm.bias"), eps)
            hd = h.shape[-1] // heads
            maskf = mask.to(h.dtype)
            additive = (1.0 - maskf)[:, None, None, :] * -1e9
            for i in range(cfg["num_hidden_layers"]):
                pre = f"encoder.layer.{i}."

                def lin(x: Any, name: str, pre: str = pre) -> Any:
                    return f.linear(x, self.p(pre + name + ".weight"), self.p(pre + name + ".bias"))

                def split(x: Any) -> Any:
                    return x.view(b, s, heads, hd).permute(0, 2, 1, 3)

                q, k, v = (split(lin(h, f"attention.self.{n}")) for n in ("query", "key", "value"))
                scores = q @ k.transpose(-1, -2) / math.sqrt(hd) + additive
                ctx = (torch.softmax(scores, dim=-1) @ v).permute(0, 2, 1, 3).reshape(b, s, -1)
                h = f.layer_norm(lin(ctx, "attention.output.dense") + h, (h.shape[-1],),
                                 self.p(pre + "attention.output.LayerNorm.weight"),
                                 self.p(pre + "attention.output.LayerNorm.bias"), eps)
                ff = f.gelu(lin(h, "intermediate.dense"))
                h = f.layer_norm(lin(ff, "output.dense") + h, (h.shape[-1],),
                                 self.p(pre + "output.LayerNorm.weight"),
                                 self.p(pre + "output.LayerNorm.bias"), eps)
            m = maskf[:, :, None]
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return f.normalize(pooled, p=2.0, dim=1)

    return Bert().eval()


def torch_resnet18(seed: int = 0, classes: int = 1000) -> Any:
    """The ResNet-18 that ``rlx bench infer resnet18`` and the ONNX import tests export (PyTorch
    eval mode, seeded weights, non-trivial batch-norm statistics)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            layers = []
            cin = 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(512, classes)

        def forward(self, x: Any) -> Any:
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    m = ResNet18().eval()
    with torch.no_grad():  # non-trivial BN statistics, so BN is not an identity
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                assert mod.running_mean is not None and mod.running_var is not None  # tracked (default)
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
    return m


def _torch_mlp(seed: int = 0) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 10), nn.Softmax(dim=-1)).eval()


def inputs(model: str, batch: int, seq: int) -> dict[str, Any]:
    """The seeded inputs every runtime gets (MiniLM: token ids framed by [CLS]/[SEP], full mask)."""
    import numpy as np

    rng = np.random.default_rng(0)
    if model == "minilm":
        ids = rng.integers(1000, 20000, (batch, seq)).astype(np.int64)
        ids[:, 0] = 101
        ids[:, -1] = 102
        return {"input_ids": ids, "attention_mask": np.ones((batch, seq), np.int64)}
    if model == "resnet18":
        return {"x": rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    return {"x": rng.standard_normal((batch, 784)).astype(np.float32)}


def _cache_dir() -> Path:
    """The authenticated ``bench`` cache directory, else a private temporary one (re-exported)."""
    from .cache import cache_subdir

    d = cache_subdir("bench")
    if d is None:
        if not _PRIVATE:  # one per process, 0700, removed at exit
            _PRIVATE.append(Path(tempfile.mkdtemp(prefix="rlx-bench-")))
            atexit.register(shutil.rmtree, _PRIVATE[0], True)
        d = _PRIVATE[0]
    return d


_PRIVATE: list[Path] = []


def _minilm_parts() -> tuple[dict[str, Any], dict[str, Any]]:
    from .formats.safetensors import read_safetensors
    from .models.minilm import model_dir

    d = model_dir()
    cfg = json.loads((d / "config.json").read_text())
    w, _ = read_safetensors(d / "model.safetensors")
    return cfg, w


def torch_model(model: str) -> Any:
    if model == "minilm":
        cfg, w = _minilm_parts()
        return _torch_bert(w, cfg)
    return torch_resnet18() if model == "resnet18" else _torch_mlp()


def onnx_path(model: str) -> Path:
    """The workload exported once from PyTorch (dynamic batch; dynamic seq for MiniLM)."""
    from .cache import publish_file, verify_file

    p = _cache_dir() / f"{model}.onnx"
    # An exported model is loaded only if its MAC sidecar matches (else deleted and re-exported);
    # it is read from a directory only the user can write, so checking first is race-free.
    if verify_file(p) or (p.exists() and _PRIVATE and p.parent == _PRIVATE[0]):
        return p
    import torch  # only to export: a worker timing the cached file must not carry torch in its RSS

    m = torch_model(model)
    feed = inputs(model, 2, 16)
    args = tuple(torch.from_numpy(v) for v in feed.values())
    names = list(feed)
    dyn = {n: {0: "batch"} for n in names}
    if model == "minilm":
        dyn = {n: {0: "batch", 1: "seq"} for n in names}
    tmp = p.with_suffix(f".tmp{os.getpid()}.onnx")
    torch.onnx.export(m, args, str(tmp), input_names=names, output_names=["y"], dynamic_axes=dyn,
                      opset_version=18, dynamo=True)
    if not publish_file(tmp, p):
        os.replace(tmp, p)
    return p


def rlx_graph(model: str) -> Any:
    if model == "minilm":
        from .models.bert import build_bert_encoder

        cfg, w = _minilm_parts()
        return build_bert_encoder(cfg, w, pooling="mean", normalize=True, name="all_minilm_l6_v2")
    from .frontends.onnx import load_onnx

    return load_onnx(onnx_path(model))


def model_flops(model: str, batch: int, seq: int) -> float:
    if model == "minilm":
        cfg, _ = _minilm_parts()
        h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
        per_tok = n * 2 * (4 * h * h + 2 * h * i)
        attn = n * 2 * 2 * seq * seq * h
        return float(batch * (seq * per_tok + attn))
    if model == "resnet18":
        return 2 * 1.82e9 * batch
    return 2.0 * batch * (784 * 512 + 512 * 256 + 256 * 10)


# -- one measurement, in its own process ---------------------------------------------------------

def measure(fn: Any, min_reps: int, min_time: float, max_reps: int = 200) -> list[float]:
    """Seconds per call of ``fn`` (after two warm-up calls): at least ``min_reps`` calls and
    ``min_time`` seconds, at most ``max_reps`` calls."""
    fn()
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= max_reps:
            break
    return times


def worker(runtime: str, model: str, batch: int, seq: int, min_reps: int, min_time: float) -> dict[str, Any]:
    threads = _threads()
    feed = inputs(model, batch, seq)
    out: dict[str, Any] = {"runtime": runtime, "model": model, "batch": batch, "seq": seq, "threads": threads}
    if runtime == "rlx":
        from .runtime import Executable, Session

        graph = rlx_graph(model)
        t0 = time.perf_counter()
        exe = Session("cpu").compile(graph)
        assert isinstance(exe, Executable)  # one device
        from .runtime import bind_inputs

        exe.program(bind_inputs(graph, feed, "bench")[1])  # specialise + backend compile, no run
        out["compile_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        exe.run(feed)
        out["first_run_s"] = time.perf_counter() - t1
        fn = lambda: exe.run(feed)  # noqa: E731
    elif runtime == "ort":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(onnx_path(model)), so, providers=["CPUExecutionProvider"])
        fn = lambda: sess.run(None, feed)  # noqa: E731
    else:
        import torch

        torch.set_num_threads(threads)
        m = torch_model(model)
        args = tuple(torch.from_numpy(v) for v in feed.values())

        def fn() -> Any:
            with torch.inference_mode():
                return m(*args)
    times = measure(fn, min_reps, min_time)
    out["p50_s"] = statistics.median(times)
    out["p10_s"] = sorted(times)[int(0.1 * (len(times) - 1))]
    out["p90_s"] = sorted(times)[int(0.9 * (len(times) - 1))]
    out["reps"] = len(times)
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


def _peak_rss_mb() -> float:
    """This process's own high-water mark (VmHWM): ru_maxrss survives exec from a forking parent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gemm_roofline(n: int = 1024) -> float:
    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    ts = measure(lambda: a @ a, 5, 1.0)
    return 2 * n**3 / min(ts)


def run_one(runtime: str, model: str, batch: int, seq: int, quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "rlx_core.bench", "--worker", runtime, model, str(batch), str(seq),
           "1" if quick else "0"]
    env = {**os.environ, "OMP_NUM_THREADS": str(_threads())}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"runtime": runtime, "model": model, "batch": batch, "seq": seq,
                "error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


@click.command("bench", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("task", type=click.Choice(["infer"]))
@click.argument("model", type=click.Choice(WORKLOADS))
@click.option("--batch", "batches", multiple=True, type=int, help="Batch size (repeatable). Default 1.")
@click.option("--seq", type=int, default=128, show_default=True, help="Sequence length (MiniLM).")
@click.option("--device", default="cpu", show_default=True, help="RLX device (peers run on the CPU).")
@click.option("--peers", default="ort,torch", show_default=True, help="Comma list of ort, torch.")
@click.option("--quick", is_flag=True, help="Fewer repetitions (for smoke tests).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write results as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Also write a chart of latency by batch per runtime (p50, p10-p90 bars): FILE.svg "
                   "(built in) or FILE.png (needs rlx-core[plot]).")
def bench_command(task: str, model: str, batches: tuple[int, ...], seq: int, device: str, peers: str,
                  quick: bool, json_path: str | None, plot_path: str | None = None) -> None:
    """Measure RLX against ONNX Runtime and PyTorch eager on one workload, in one run.

    \b
    Examples:
      rlx bench infer minilm --batch 1 --batch 8 --batch 32 --seq 128
      rlx bench infer resnet18 --batch 1 --batch 8 --peers ort,torch --json out.json
      rlx bench infer mlp --batch 1 --batch 8 --batch 128 --plot mlp.svg
    """
    from rich.console import Console
    from rich.table import Table

    if device != "cpu":
        raise click.UsageError("only --device cpu is benchmarked by this command so far")
    if plot_path:  # a bad chart name fails now, not after minutes of measuring
        from .benchplot import check_plot_path

        check_plot_path(plot_path)
    con = Console()
    runtimes = ["rlx"] + [p for p in peers.split(",") if p]
    for p in runtimes:
        if p not in RUNTIMES:
            raise click.UsageError(f"unknown peer {p!r}; choose from ort, torch")
    batches = batches or (1,)
    if "ort" in runtimes:
        onnx_path(model)  # export once, outside the timed workers
    roof = gemm_roofline()
    rows = []
    for b in batches:
        for rt in runtimes:
            con.print(f"[dim]measuring {rt} {model} batch={b} ...[/]")
            rows.append(run_one(rt, model, b, seq, quick))
    # Cached compile: a second RLX process with the same cache directory.
    cached = run_one("rlx", model, batches[0], seq, True)
    t = Table(title=f"{model} (seq {seq}) on {platform.machine()} x{os.cpu_count()} threads={_threads()}")
    for c in ("batch", "runtime", "p50", "p90", "vs ort", "vs torch", "GFLOP/s", "% roofline", "peak RSS"):
        t.add_column(c, justify="right")
    by = {(r["runtime"], r["batch"]): r for r in rows}
    for r in rows:
        if "error" in r:
            t.add_row(str(r["batch"]), r["runtime"], "error", r["error"][:40], "", "", "", "", "")
            continue
        fl = model_flops(model, r["batch"], seq) / r["p50_s"] / 1e9
        ort_r, torch_r = by.get(("ort", r["batch"])), by.get(("torch", r["batch"]))

        def vs(o: dict[str, Any] | None, r: dict[str, Any] = r) -> str:
            return f"{r['p50_s'] / o['p50_s']:.2f}x" if o and "p50_s" in o else ""
        t.add_row(str(r["batch"]), r["runtime"], f"{r['p50_s'] * 1e3:.2f} ms", f"{r['p90_s'] * 1e3:.2f} ms",
                  vs(ort_r), vs(torch_r), f"{fl:.1f}", f"{100 * fl * 1e9 / roof:.0f}%",
                  f"{r['peak_rss_mb']:.0f} MB")
    con.print(t)
    first = by.get(("rlx", batches[0]), {})
    con.print(f"GEMM roofline (f32 1024^3, NumPy BLAS, same run): {roof / 1e9:.1f} GFLOP/s")
    con.print(f"RLX compile: cold {first.get('compile_s', float('nan')):.2f} s, "
              f"cached {cached.get('compile_s', float('nan')):.2f} s")
    if json_path:
        Path(json_path).write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {platform.processor()}",
            "cpus": os.cpu_count(), "threads": _threads(), "gemm_roofline_flops": roof, "seq": seq,
            "results": rows, "cached_compile": cached}, indent=2))
    if plot_path:
        from .benchplot import latency_series, write_plot

        title = (f"{model}{f' (seq {seq})' if model == 'minilm' else ''}, {platform.machine()} "
                 f"x{os.cpu_count()}, threads={_threads()}")
        con.print(f"chart: {write_plot(plot_path, latency_series(rows), title=title)}")


def main() -> None:
    if len(sys.argv) >= 7 and sys.argv[1] == "--worker":
        _, _, runtime, model, batch, seq, quick = sys.argv[:7]
        q = quick == "1"
        res = worker(runtime, model, int(batch), int(seq), 3 if q else 10, 0.5 if q else 3.0)
        print(json.dumps(res))
        return
    bench_command()


if __name__ == "__main__":
    main()
