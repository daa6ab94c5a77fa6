"""``rlx bench train-mlp``: MLP training throughput of RLX against a hand-written NumPy loop and
PyTorch eager, in one run, from one initialisation, with one thread count.

The setup of the RLX paper: an MLP (default 784-128-10), SGD with lr 0.02 and momentum 0.9, batch
128, one epoch over 60,000 MNIST-shaped seeded images (float32 in [0, 1), labels 0-9 given by a
fixed random linear teacher so the loss can fall). ``--dataset digits`` trains on scikit-learn's
bundled 8x8 digits instead and reports held-out accuracy. Batches are taken in order, the last
partial batch is dropped, and every runtime sees exactly the same batches.

* **rlx** — the whole training step (forward, backward, momentum update) is ONE compiled graph
  (:func:`rlx_core.optim.train_step_graph`) run by :class:`~rlx_core.optim.ResidentTrainer`: parameters and
  optimizer state live in the compiled program's own buffers between steps (on rlx-cpu), a step
  points the program at the batch (or copies it in), runs the bound kernels and reads the loss — no
  per-step validation, dictionaries or output copies. On rlx-cpu the unfused graph (``--fusion
  auto`` times both and normally keeps it) is what the backend's bind-time fusion
  (``rlx_cpu.train_fuse``) compiles into few calls: weights, gradients and momenta stored
  column-major so every GEMM takes OpenBLAS's fast layout, the momentum ``m = mu*m + g`` as the
  gradient GEMM's ``beta`` (no gradient buffer), each parameter update one in-place AXPY, the
  softmax cross-entropy and ReLU backward as single Numba calls, the batch read by the GEMMs where
  the caller keeps it;
* **numpy** — forward, backward and momentum SGD written by hand over preallocated float32 buffers
  (BLAS GEMMs on transposed views, in-place elementwise updates);
* **torch** — ``torch.nn`` layers, ``F.cross_entropy`` and ``torch.optim.SGD`` in eager mode.

BLAS threads (through ``threadpoolctl`` when installed) and ``torch.set_num_threads`` are set to
the same count: ``--threads``, else ``RLX_BENCH_THREADS``, else the number of CPUs.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np

from .benchplot import plot_command
from .errors import IRError
from .optim import ResidentTrainer

DATASETS = ("random", "digits")
PEERS = ("numpy", "torch")
DEFAULT_ARCH = {"random": "784-128-10", "digits": "64-128-10"}
DEFAULT_BATCH = {"random": 128, "digits": 32}
#: Epochs when ``--dataset digits`` is trained and ``--epochs`` is not given.
DIGITS_EPOCHS = 30

Params = list[tuple[np.ndarray, np.ndarray]]


# -- setup: architecture, initialisation, data ----------------------------------------------------

def parse_arch(text: str) -> tuple[int, ...]:
    """``"784-128-10"`` -> ``(784, 128, 10)``: the input size, the hidden sizes, the classes."""
    try:
        sizes = tuple(int(s) for s in text.replace("x", "-").split("-") if s.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a list of layer sizes like 784-128-10") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise click.BadParameter(f"{text!r}: give at least an input size and a class count, all >= 1")
    return sizes


def init_params(arch: Sequence[int], seed: int = 0) -> Params:
    """``torch.nn.Linear``'s default initialisation, seeded: W (out, in) and b ~ U(+-1/sqrt(in))."""
    rng = np.random.default_rng(seed)
    out: Params = []
    for i, o in itertools.pairwise(arch):
        bound = 1.0 / np.sqrt(i)
        out.append((rng.uniform(-bound, bound, (o, i)).astype(np.float32),
                    rng.uniform(-bound, bound, o).astype(np.float32)))
    return out


def random_mnist(n: int = 60000, features: int = 784, classes: int = 10, seed: int = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``n`` MNIST-shaped images (float32 in [0, 1)) and int64 labels from a seeded random linear
    teacher (``argmax((x - 0.5) @ T)``), so the classes are learnable and roughly balanced."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, features), dtype=np.float32)
    teacher = rng.standard_normal((features, classes)).astype(np.float32)
    y = np.empty(n, np.int64)
    for s in range(0, n, 8192):  # in chunks: no (n, features) temporary
        y[s:s + 8192] = np.argmax((x[s:s + 8192] - np.float32(0.5)) @ teacher, axis=1)
    return x, y


def digits_split(seed: int = 0, test_fraction: float = 0.2
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (1,797 images, scaled to [0, 1]) split into a seeded,
    stratified train and held-out set: ``(x_train, y_train, x_test, y_test)``."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as e:  # pragma: no cover - exercised only without scikit-learn
        raise click.ClickException(f"--dataset digits needs scikit-learn ({e}); "
                                   "pip install scikit-learn") from None
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return (np.ascontiguousarray(xtr), np.ascontiguousarray(ytr), np.ascontiguousarray(xte),
            np.ascontiguousarray(yte))


def mlp_graph(arch: Sequence[int], params: Params, batch: int | str = "batch", *, loss: bool = True,
              name: str = "mlp") -> Any:
    """The MLP as an RLX graph: ``linear`` + ``relu`` (HIR ops, so the CPU runs a native linear and
    relu's backward is one select); output ``loss`` (mean softmax cross-entropy against ``y``) or,
    with ``loss=False``, ``logits``."""
    from .ir.builder import GraphBuilder
    from .losses import softmax_cross_entropy

    if len(params) != len(arch) - 1:
        raise IRError(f"{len(params)} layers of parameters for architecture {arch}",
                      fix="pass one (W, b) pair per layer")
    g = GraphBuilder(name)
    h = g.input("x", "f32", (batch, arch[0]))
    for k, (w, b) in enumerate(params):
        wt = g.param(f"w{k}", np.array(w, np.float32))
        h = g.op("linear", h, wt, g.param(f"b{k}", np.array(b, np.float32)))
        if k < len(params) - 1:
            h = g.op("relu", h)
    if loss:
        y = g.input("y", "i64", (batch,))
        g.output(softmax_cross_entropy(g, h, y), "loss")
    else:
        g.output(h, "logits")
    return g.build()


def param_names(n_layers: int) -> list[str]:
    return [f"{p}{k}" for k in range(n_layers) for p in ("w", "b")]


# -- RLX: the training step as one graph, state resident in the program ---------------------------

class RlxMLP:
    """The benchmark's RLX runtime: an MLP trained by :class:`ResidentTrainer` with momentum SGD."""

    name = "rlx"

    def __init__(self, arch: Sequence[int], params: Params, batch: int, lr: float, momentum: float,
                 device: str = "cpu", resident: bool | None = None, fusion: bool | None = False) -> None:
        from .optim import SGD

        self.arch = tuple(arch)
        self.device = device
        self.trainer = ResidentTrainer(mlp_graph(arch, params, batch), "loss", SGD(lr=lr, momentum=momentum),
                                       param_names(len(params)), device=device, resident=resident,
                                       fusion=fusion)
        self.compile_s = self.trainer.compile_s

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        return self.trainer.step(x=x, y=y)

    def params(self) -> Params:
        v = self.trainer.values()
        return [(v[f"w{k}"], v[f"b{k}"]) for k in range(len(self.arch) - 1)]

    def logits(self, x: np.ndarray) -> np.ndarray:
        from .runtime import Session

        exe = Session(self.device).compile(mlp_graph(self.arch, self.params(), loss=False))
        return exe.run(x=np.ascontiguousarray(x, np.float32))["logits"]


# -- the hand-written NumPy + BLAS loop -------------------------------------------------------------

class NumpyMLP:
    """Forward, backward and momentum SGD by hand over preallocated float32 buffers.

    Per step: one GEMM per layer forward (``x @ W.T`` on a transposed view), the bias added and
    ReLU applied in place; a stable softmax cross-entropy whose gradient ``(softmax - onehot) / B``
    overwrites the exponentials; per layer backward one GEMM for ``dW = dZ.T @ A`` into its buffer,
    a column sum for ``db`` and (below the top layer) one GEMM for ``dA = dZ @ W`` masked by
    ``A > 0`` in place; then ``m = mu*m + g; p -= lr*m`` (``torch.optim.SGD``) in place."""

    name = "numpy"

    def __init__(self, arch: Sequence[int], params: Params, batch: int, lr: float, momentum: float) -> None:
        f32 = np.float32
        self.w = [np.array(w, f32) for w, _ in params]
        self.b = [np.array(b, f32) for _, b in params]
        self.mw = [np.zeros_like(w) for w in self.w]
        self.mb = [np.zeros_like(b) for b in self.b]
        self.gw = [np.empty_like(w) for w in self.w]
        self.gb = [np.empty_like(b) for b in self.b]
        self.tw = [np.empty_like(w) for w in self.w]
        self.tb = [np.empty_like(b) for b in self.b]
        self.act = [np.empty((batch, w.shape[0]), f32) for w in self.w]
        self.grad = [np.empty((batch, w.shape[0]), f32) for w in self.w]
        self.mask = [np.empty((batch, w.shape[0]), np.bool_) for w in self.w]
        self.rowsum = np.empty((batch, 1), f32)
        self.rows = np.arange(batch)
        self.batch = batch
        self.lr, self.mu = f32(lr), f32(momentum)
        self.inv_b = f32(1.0 / batch)

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        n = len(self.w)
        a = x
        for k in range(n):
            z = self.act[k]
            np.matmul(a, self.w[k].T, out=z)
            np.add(z, self.b[k], out=z)
            if k < n - 1:
                np.maximum(z, 0.0, out=z)
            a = z
        z, e, s = self.act[-1], self.grad[-1], self.rowsum
        np.subtract(z, z.max(axis=1, keepdims=True), out=z)
        np.exp(z, out=e)
        np.sum(e, axis=1, keepdims=True, out=s)
        loss = float(np.mean(np.log(s[:, 0]) - z[self.rows, y]))
        np.divide(e, s, out=e)  # softmax
        e[self.rows, y] -= 1.0
        np.multiply(e, self.inv_b, out=e)  # dL/dz of the mean loss
        for k in range(n - 1, -1, -1):
            dz = self.grad[k]
            below = x if k == 0 else self.act[k - 1]
            np.matmul(dz.T, below, out=self.gw[k])
            np.sum(dz, axis=0, out=self.gb[k])
            if k > 0:
                da = self.grad[k - 1]
                np.matmul(dz, self.w[k], out=da)
                np.greater(below, 0.0, out=self.mask[k - 1])
                np.multiply(da, self.mask[k - 1], out=da)
        for p, g, m, t in itertools.chain(zip(self.w, self.gw, self.mw, self.tw),
                                          zip(self.b, self.gb, self.mb, self.tb)):
            np.multiply(m, self.mu, out=m)
            np.add(m, g, out=m)
            np.multiply(m, self.lr, out=t)
            np.subtract(p, t, out=p)
        return loss

    def params(self) -> Params:
        return [(w.copy(), b.copy()) for w, b in zip(self.w, self.b)]

    def logits(self, x: np.ndarray) -> np.ndarray:
        a = np.asarray(x, np.float32)
        for k, (w, b) in enumerate(zip(self.w, self.b)):
            a = a @ w.T + b
            if k < len(self.w) - 1:
                a = np.maximum(a, 0.0)
        return a


# -- PyTorch eager ----------------------------------------------------------------------------------

class TorchMLP:
    """``nn.Linear``/``nn.ReLU`` in ``nn.Sequential``, ``F.cross_entropy``, ``torch.optim.SGD``."""

    name = "torch"

    def __init__(self, arch: Sequence[int], params: Params, batch: int, lr: float, momentum: float) -> None:
        import torch

        self.torch = torch
        layers: list[Any] = []
        for k, (w, b) in enumerate(params):
            lin = torch.nn.Linear(w.shape[1], w.shape[0])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(np.asarray(w, np.float32)))
                lin.bias.copy_(torch.from_numpy(np.asarray(b, np.float32)))
            layers.append(lin)
            if k < len(params) - 1:
                layers.append(torch.nn.ReLU())
        self.net = torch.nn.Sequential(*layers)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=lr, momentum=momentum)
        self.ce = torch.nn.functional.cross_entropy

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        t = self.torch
        self.opt.zero_grad(set_to_none=True)
        loss = self.ce(self.net(t.from_numpy(x)), t.from_numpy(y))
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def params(self) -> Params:
        lins = [m for m in self.net if isinstance(m, self.torch.nn.Linear)]
        return [(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy()) for m in lins]

    def logits(self, x: np.ndarray) -> np.ndarray:
        with self.torch.no_grad():
            return self.net(self.torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()


# -- running ----------------------------------------------------------------------------------------

def default_threads() -> int:
    from .settings import BENCH_THREADS

    threads: int = BENCH_THREADS.get() or os.cpu_count() or 1
    return threads


@contextmanager
def thread_limits(threads: int, torch_threads: bool = True) -> Iterator[dict[str, Any]]:
    """BLAS (through threadpoolctl, when installed) and (``torch_threads``) torch intra-op threads
    set to ``threads``."""
    info: dict[str, Any] = {"threads": threads}
    ctl: Any = None
    try:
        from threadpoolctl import threadpool_limits

        ctl = threadpool_limits(limits=threads)
        info["blas"] = "threadpoolctl"
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        info["blas"] = "default (threadpoolctl not installed)"
    prev_torch = None
    try:
        if not torch_threads:  # not imported at all: seconds saved on every rank of --data-parallel
            raise ImportError
        import torch

        prev_torch = torch.get_num_threads()
        torch.set_num_threads(threads)
    except ImportError:
        torch = None  # type: ignore[assignment]
    try:
        yield info
    finally:
        if ctl is not None:
            ctl.restore_original_limits()
        if torch is not None and prev_torch is not None:
            torch.set_num_threads(prev_torch)


@dataclass
class RunResult:
    runtime: str
    steps: int
    images: int
    seconds: float
    losses: list[float]
    setup_s: float = 0.0
    accuracy: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "steps": self.steps, "images": self.images, "seconds": self.seconds,
                "images_per_s": self.images_per_s, "first_loss": self.losses[0] if self.losses else None,
                "final_loss": self.losses[-1] if self.losses else None,
                "final_loss_avg50": float(np.mean(self.losses[-50:])) if self.losses else None,
                "setup_s": self.setup_s, "accuracy": self.accuracy, **self.extra}


def make_runtime(runtime: str, arch: Sequence[int], params: Params, batch: int, lr: float, momentum: float,
                 device: str = "cpu", fusion: bool | None = False) -> Any:
    if runtime == "rlx":
        return RlxMLP(arch, params, batch, lr, momentum, device, fusion=fusion)
    if runtime == "rlx-trainer":
        return _OptimTrainerMLP(arch, params, batch, lr, momentum, device)
    if runtime == "rlx-dp":
        return DataParallelMLP(arch, params, batch, lr, momentum, device)
    if runtime == "numpy":
        return NumpyMLP(arch, params, batch, lr, momentum)
    if runtime == "torch":
        return TorchMLP(arch, params, batch, lr, momentum)
    raise click.UsageError(f"unknown runtime {runtime!r}; choose from rlx, {', '.join(PEERS)}")


class _OptimTrainerMLP(RlxMLP):
    """The plain :class:`rlx_core.optim.Trainer` (validated run, copies in and out), for reference."""

    name = "rlx-trainer"

    def __init__(self, arch: Sequence[int], params: Params, batch: int, lr: float, momentum: float,
                 device: str = "cpu") -> None:
        from .optim import SGD, Trainer

        self.arch = tuple(arch)
        self.device = device
        t0 = time.perf_counter()
        # not self.trainer: that is RlxMLP's ResidentTrainer (whose extras the result reports)
        self.plain = Trainer(mlp_graph(arch, params, batch), "loss", SGD(lr=lr, momentum=momentum),
                             param_names(len(params)), device=device)
        self.compile_s = time.perf_counter() - t0

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        return self.plain.step(x=x, y=y)

    def params(self) -> Params:
        v = self.plain.values
        return [(np.array(v[f"w{k}"]), np.array(v[f"b{k}"])) for k in range(len(self.arch) - 1)]


class DataParallelMLP(RlxMLP):
    """``--data-parallel N``: one of N ranks of a launch, each holding the whole MLP and training on
    1/N of every global batch (:class:`rlx_core.distributed.DataParallelTrainer`: gradients averaged
    with bucketed ``all_reduce(mean)`` in the train-step graph), so every rank takes the
    single-process step on the global batch and reports the global loss."""

    name = "rlx-dp"

    def __init__(self, arch: Sequence[int], params: Params, batch: int, lr: float, momentum: float,
                 device: str = "cpu") -> None:
        from .distributed import DataParallelTrainer, world
        from .optim import SGD

        self.arch = tuple(arch)
        self.device = device
        self.world = world().size
        if batch % self.world:
            raise click.UsageError(f"--batch {batch} does not split over {self.world} data-parallel ranks; "
                                   f"use a multiple of {self.world}")
        t0 = time.perf_counter()
        # the rank's graph is built for its static share of the batch: one specialisation, no symbols
        self.dp = DataParallelTrainer(mlp_graph(arch, params, batch // self.world), "loss",
                                      SGD(lr=lr, momentum=momentum), param_names(len(params)), device=device)
        self.compile_s = time.perf_counter() - t0

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        return self.dp.step(x=x, y=y)

    def params(self) -> Params:
        v = self.dp.values
        return [(np.array(v[f"w{k}"]), np.array(v[f"b{k}"])) for k in range(len(self.arch) - 1)]


def batches(n: int, batch: int, steps: int | None = None, epochs: int = 1, shuffle_seed: int | None = None
            ) -> list[np.ndarray | slice]:
    """Row selections for ``epochs`` passes of full batches (in order, or seeded-shuffled per epoch),
    cut to ``steps`` when given."""
    per = n // batch
    if per == 0:
        raise click.UsageError(f"batch {batch} is larger than the {n} training examples")
    out: list[np.ndarray | slice] = []
    rng = np.random.default_rng(shuffle_seed) if shuffle_seed is not None else None
    for _ in range(epochs):
        if rng is None:
            out += [slice(i * batch, (i + 1) * batch) for i in range(per)]
        else:
            perm = rng.permutation(n)
            out += [np.sort(perm[i * batch:(i + 1) * batch]) for i in range(per)]
        if steps is not None and len(out) >= steps:
            break
    return out[:steps] if steps is not None else out


def train(rt: Any, x: np.ndarray, y: np.ndarray, sel: Sequence[np.ndarray | slice],
          warmup: int = 2) -> RunResult:
    """Time ``rt.step`` over the selected batches. Shuffled batches are gathered before the clock
    starts (the same copies for every runtime); in-order batches are contiguous row slices."""
    xb = [x[s] for s in sel] if not isinstance(sel[0], slice) else None
    losses: list[float] = []
    t0 = time.perf_counter()
    if xb is None:
        for s in sel:
            losses.append(rt.step(x[s], y[s]))
    else:
        for s, xs in zip(sel, xb):
            losses.append(rt.step(xs, y[s]))
    dt = time.perf_counter() - t0
    nimg = sum((s.stop - s.start) if isinstance(s, slice) else len(s) for s in sel)
    return RunResult(getattr(rt, "name", "?"), len(sel), nimg, dt, losses)


def choose_fusion(arch: Sequence[int], params: Params, x: np.ndarray, y: np.ndarray,
                  sel: Sequence[np.ndarray | slice], batch: int, lr: float, momentum: float,
                  device: str = "cpu", trials: int = 12) -> tuple[bool, dict[str, float]]:
    """Time the RLX train step with and without elementwise fusion on throw-away instances and
    return the faster choice with the timings: both are warmed up (three steps), then their steps
    alternate over the same batches and the best of ``trials`` steps of each counts, so a burst of
    load on the machine hits both.

    On rlx-cpu the unfused program is normally the faster: its elementwise kernels are what the
    backend's bind-time fusion (:mod:`rlx_cpu.train_fuse`) turns into GEMMs with ``beta``, in-place
    AXPY updates and one-call loss kernels, and every update runs in place; fused, the graph-level
    elementwise kernels hide those patterns and the fused updates are copied back."""
    rts = {f: RlxMLP(arch, params, batch, lr, momentum, device, fusion=f) for f in (False, True)}
    best = {False: math.inf, True: math.inf}
    for k, s in enumerate(sel[:trials + 3]):
        for f, rt in rts.items():
            t0 = time.perf_counter()
            rt.step(x[s], y[s])
            if k >= 3:
                best[f] = min(best[f], time.perf_counter() - t0)
    times = {"nofusion": best[False], "fusion": best[True]}
    return times["fusion"] < times["nofusion"], times


def run_one(runtime: str, arch: Sequence[int], params: Params, x: np.ndarray, y: np.ndarray,
            sel: Sequence[np.ndarray | slice], batch: int, lr: float, momentum: float, device: str = "cpu",
            warmup: int = 3, fusion: bool | str | None = "auto") -> tuple[RunResult, Any]:
    """Build ``runtime`` from ``params``, warm it up on a throw-away instance (first-call costs:
    allocator, BLAS thread start, lazy initialisation), then time the run from ``params``. For
    ``rlx``, ``fusion="auto"`` picks the faster of fused and unfused (:func:`choose_fusion`)."""
    extra: dict[str, Any] = {}
    if fusion == "auto":
        if runtime == "rlx":
            fusion, extra["fusion_trial_s"] = choose_fusion(arch, params, x, y, sel, batch, lr, momentum,
                                                            device)
        else:
            fusion = None
    if warmup:
        w = make_runtime(runtime, arch, params, batch, lr, momentum, device, fusion)  # type: ignore[arg-type]
        for s in sel[:warmup]:
            w.step(x[s], y[s])
        del w
    t0 = time.perf_counter()
    rt = make_runtime(runtime, arch, params, batch, lr, momentum, device, fusion)  # type: ignore[arg-type]
    setup = time.perf_counter() - t0
    res = train(rt, x, y, sel)
    res.runtime = runtime
    res.setup_s = setup
    res.extra.update(extra)
    if hasattr(rt, "compile_s"):
        res.extra["compile_s"] = rt.compile_s
    if getattr(rt, "trainer", None) is not None and hasattr(rt.trainer, "resident"):
        res.extra["fusion"] = bool(rt.trainer.session.fusion)
        res.extra["resident"] = rt.trainer.resident
        res.extra["carried_copies"] = len(getattr(rt.trainer, "_copies", ()))
        res.extra["kernels"] = len(rt.trainer.program.kernels)
        res.extra["bound_inputs"] = sorted(getattr(rt.trainer, "bound_inputs", ()))
    return res, rt


def accuracy(rt: Any, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(rt.logits(x), axis=1) == y))


def train_mlp(arch: str | Sequence[int] | None = None, *, batch: int | None = None, device: str = "cpu",
              peers: Sequence[str] = PEERS, steps: int | None = None, epochs: int | None = None,
              dataset: str = "random", lr: float = 0.02, momentum: float = 0.9, seed: int = 0,
              threads: int | None = None, n_images: int = 60000, warmup: int = 3,
              extra_runtimes: Sequence[str] = (), fusion: bool | str = "auto",
              data_parallel: int = 1) -> dict[str, Any]:
    """Run the benchmark and return its results as JSON-able data (what ``--json`` writes).

    ``data_parallel=N``: this process is one of the N ranks of a launch (``rlx launch -n N``);
    every rank first trains ``rlx-dp`` (:class:`DataParallelMLP`, the same global batches), then
    rank 0 alone runs the single-process runtimes and returns the whole result, with the two loss
    curves under ``"data_parallel"``; the other ranks return only ``{"rank": r, "results": {"rlx-dp": ...}}``.
    """
    if dataset not in DATASETS:
        raise click.UsageError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    sizes = parse_arch(arch or DEFAULT_ARCH[dataset]) if arch is None or isinstance(arch, str) \
        else tuple(arch)
    for p in peers:
        if p not in PEERS:
            raise click.UsageError(f"unknown peer {p!r}; choose from {', '.join(PEERS)}")
    rank = 0
    if data_parallel > 1:
        from .distributed import world

        w = world()
        if w.size != data_parallel:
            raise click.UsageError(f"data_parallel={data_parallel} but this launch has {w.size} rank(s); "
                                   f"start it with `rlx launch -n {data_parallel}` (or the CLI's "
                                   f"--data-parallel {data_parallel}, which does)")
        rank = w.rank
        # the ranks share the host's cores: a rank's fair share is one thread unless told otherwise
        from .settings import BENCH_THREADS

        threads = threads or BENCH_THREADS.get() or 1
    threads = threads or default_threads()
    batch = batch or DEFAULT_BATCH[dataset]
    t_data = time.perf_counter()
    xte: np.ndarray | None  # no test set for random images
    yte: np.ndarray | None
    if dataset == "digits":
        xtr, ytr, xte, yte = digits_split(seed)
        if sizes[0] != xtr.shape[1] or sizes[-1] != 10:
            raise click.UsageError(f"digits are {xtr.shape[1]} pixels and 10 classes; "
                                   "use e.g. --arch 64-128-10")
        sel = batches(len(xtr), batch, steps, epochs or DIGITS_EPOCHS, shuffle_seed=seed)
    else:
        xtr, ytr = random_mnist(n_images, sizes[0], sizes[-1], seed)
        xte = yte = None
        sel = batches(len(xtr), batch, steps, epochs or 1)
    data_s = time.perf_counter() - t_data
    params = init_params(sizes, seed)
    runtimes = ["rlx", *extra_runtimes, *peers]
    if data_parallel > 1:
        runtimes.insert(0, "rlx-dp")
    load_before = _loadavg()
    results: dict[str, RunResult] = {}
    with thread_limits(threads, torch_threads="torch" in runtimes) as tinfo:
        for r in runtimes:
            res, rt = run_one(r, sizes, params, xtr, ytr, sel, batch, lr, momentum, device, warmup, fusion)
            if xte is not None and yte is not None:
                res.accuracy = accuracy(rt, xte, yte)
            results[r] = res
            if rank != 0:  # the collective part is over: rank 0 alone runs the single-process ones
                return {"rank": rank, "results": {r: res.to_json()}}
    load_after = _loadavg()
    rlx = results["rlx"]
    ratios = {f"rlx/{p}": rlx.images_per_s / results[p].images_per_s for p in runtimes if p != "rlx"}
    k = min(len(r.losses) for r in results.values())
    agree = {p: float(np.max(np.abs(np.subtract(rlx.losses[:min(k, 10)], results[p].losses[:min(k, 10)]))))
             for p in runtimes if p != "rlx"}
    dp: dict[str, Any] | None = None
    if data_parallel > 1:
        dpl = results["rlx-dp"].losses
        dp = {"ranks": data_parallel, "global_batch": batch, "rank_batch": batch // data_parallel,
              "losses": dpl, "rlx_losses": rlx.losses,
              "max_abs_loss_diff_vs_rlx": float(np.max(np.abs(np.subtract(dpl, rlx.losses))))}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"platform": platform.platform(), "machine": platform.machine(),
                    "processor": platform.processor(), "cpus": os.cpu_count(),
                    "loadavg_before": load_before, "loadavg_after": load_after},
        "config": {"arch": "-".join(map(str, sizes)), "batch": batch, "device": device, "dataset": dataset,
                   "lr": lr, "momentum": momentum, "seed": seed, "steps": len(sel),
                   "train_examples": len(xtr), "test_examples": None if xte is None else len(xte),
                   "rlx_fusion": fusion, "data_s": data_s, **tinfo},
        "results": {r: v.to_json() for r, v in results.items()},
        "ratios": ratios,
        "first10_max_abs_loss_diff_vs_rlx": agree,
        "data_parallel": dp,
    }


def _loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return None


def format_report(res: dict[str, Any]) -> str:
    c = res["config"]
    lines = [f"train-mlp {c['arch']} on {c['dataset']}: batch {c['batch']}, {c['steps']} steps "
             f"({c['steps'] * c['batch']:,} images), SGD lr {c['lr']} momentum {c['momentum']}, "
             f"{c['threads']} thread{'s' if c['threads'] != 1 else ''}, rlx device {c['device']}",
             f"machine: {res['machine']['machine']} x{res['machine']['cpus']}, load average (1/5/15 min) "
             f"before {res['machine']['loadavg_before']}, after {res['machine']['loadavg_after']}"]
    head = (f"{'runtime':<12}{'images/s':>12}{'ms/step':>10}{'first loss':>12}{'final loss':>12}"
            f"{'last-50 mean':>14}")
    acc = any(r.get("accuracy") is not None for r in res["results"].values())
    if acc:
        head += f"{'held-out acc':>14}"
    lines.append(head)
    for name, r in res["results"].items():
        row = (f"{name:<12}{r['images_per_s']:>12,.0f}{1e3 * r['seconds'] / max(r['steps'], 1):>10.3f}"
               f"{r['first_loss']:>12.4f}{r['final_loss']:>12.4f}{r['final_loss_avg50']:>14.4f}")
        if acc:
            row += f"{100 * r['accuracy']:>13.2f}%" if r.get("accuracy") is not None else f"{'':>14}"
        lines.append(row)
    if res["ratios"]:
        lines.append("ratios (images/s): " + ", ".join(f"{k} = {v:.2f}" for k, v in res["ratios"].items()))
    rl = res["results"]["rlx"]
    if "compile_s" in rl:
        trial = rl.get("fusion_trial_s")
        how = (f"auto: best step {1e3 * trial['nofusion']:.3f} ms unfused, "
               f"{1e3 * trial['fusion']:.3f} ms fused" if trial else "as asked")
        runs = f" ({rl['runs']} calls after bind-time fusion)" if rl.get("runs") is not None else ""
        lines.append(f"rlx: one train-step graph, {rl.get('kernels')} kernels{runs}, compiled once in "
                     f"{rl['compile_s']:.2f} s, fusion {'on' if rl.get('fusion') else 'off'} ({how}); state "
                     f"resident: {rl.get('resident')}, tensors copied back per step: "
                     f"{rl.get('carried_copies')}, inputs read in place: {rl.get('bound_inputs') or 'none'}")
    dp = res.get("data_parallel")
    if dp:
        d = res["results"]["rlx-dp"]
        lines.append(f"rlx-dp: data-parallel over {dp['ranks']} ranks (Open MPI, one host), each on "
                     f"{dp['rank_batch']} of every batch of {dp['global_batch']}, gradients all-reduced; "
                     f"compiled in {d.get('compile_s', float('nan')):.2f} s; loss vs single-process rlx over "
                     f"{len(dp['losses'])} steps: max |diff| {dp['max_abs_loss_diff_vs_rlx']:.2e}")
    if res["first10_max_abs_loss_diff_vs_rlx"]:
        lines.append("loss agreement over the first 10 steps (max |diff| vs rlx): " + ", ".join(
            f"{k} {v:.2e}" for k, v in res["first10_max_abs_loss_diff_vs_rlx"].items())
            + " (later, f32 rounding differences grow chaotically: compare the last-50 means)")
    return "\n".join(lines)


@click.command("train-mlp", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--arch", default=None, help="Layer sizes, e.g. 784-512-256-10. [default: 784-128-10; "
                                           "64-128-10 with --dataset digits]")
@click.option("--batch", type=int, default=None, help="Batch size. [default: 128; 32 with --dataset digits]")
@click.option("--device", default="cpu", show_default=True, help="RLX device (peers run on the CPU).")
@click.option("--peers", default="numpy,torch", show_default=True, help="Comma list of numpy, torch (or '').")
@click.option("--steps", type=int, default=None, help="Stop after N steps. [default: one epoch]")
@click.option("--epochs", type=int, default=None,
              help=f"Passes over the data. [default: 1; {DIGITS_EPOCHS} with --dataset digits]")
@click.option("--dataset", type=click.Choice(DATASETS), default="random", show_default=True,
              help="random: 60,000 seeded MNIST-shaped images; digits: scikit-learn's 8x8 digits with a "
                   "held-out split (reports accuracy).")
@click.option("--images", type=int, default=60000, show_default=True,
              help="How many random images to generate (--dataset random).")
@click.option("--lr", type=float, default=0.02, show_default=True)
@click.option("--momentum", type=float, default=0.9, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=int, default=None, help="Threads for every runtime. [default: "
                                                         "RLX_BENCH_THREADS or the CPU count]")
@click.option("--fusion", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="Elementwise fusion for the RLX train step; auto times both on a few steps first "
                   "and keeps the faster (on rlx-cpu neither wins everywhere).")
@click.option("--with-trainer", is_flag=True, help="Also time rlx_core.optim.Trainer (copies in/out).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write results as JSON.")
@click.option("--data-parallel", "data_parallel", type=click.IntRange(min=1), default=1, show_default=True,
              metavar="N",
              help="Also train data-parallel (runtime rlx-dp) on N processes (ranks) that Open MPI's mpirun "
                   "starts on this host (as `rlx launch -n N` does): each rank trains on 1/N of every "
                   "batch and the gradients are all-reduced, so the loss follows the single-process "
                   "curve; rank 0 then runs the single-process runtimes and prints the report. "
                   "Under `rlx launch -n N` it uses that launch's ranks. --batch must be a multiple of "
                   "N; --threads defaults to 1 per rank. Needs Open MPI and mpi4py.")
def train_mlp_command(arch: str | None, batch: int | None, device: str, peers: str, steps: int | None,
                      epochs: int | None, dataset: str, images: int, lr: float, momentum: float, seed: int,
                      threads: int | None, fusion: str, with_trainer: bool, json_path: str | None,
                      data_parallel: int) -> None:
    """Train an MLP with RLX, a hand-written NumPy+BLAS loop and PyTorch eager, in one run.

    \b
    Examples:
      rlx bench train-mlp --arch 784-128-10 --batch 128 --device cpu
      rlx bench train-mlp --arch 784-512-256-10 --peers numpy,torch --json out.json
      rlx bench train-mlp --dataset digits
      rlx bench train-mlp --data-parallel 2 --peers numpy
    """
    if steps is not None and steps < 1:
        raise click.BadParameter("--steps must be >= 1")
    peer_list = [p.strip() for p in peers.split(",") if p.strip()]
    if data_parallel > 1:
        b = batch or DEFAULT_BATCH[dataset]
        if b % data_parallel:  # checked before starting N processes
            raise click.BadParameter(f"batch {b} does not split over {data_parallel} ranks; use a multiple "
                                     f"of {data_parallel}", param_hint="--batch")
        from .distributed.session import relaunch

        # outside a launch this re-runs the command line on N ranks and exits with their status
        relaunch(data_parallel, command="train-mlp")
    res = train_mlp(arch, batch=batch, device=device, peers=peer_list, steps=steps, epochs=epochs,
                    dataset=dataset, lr=lr, momentum=momentum, seed=seed, threads=threads, n_images=images,
                    extra_runtimes=("rlx-trainer",) if with_trainer else (),
                    fusion="auto" if fusion == "auto" else fusion == "on", data_parallel=data_parallel)
    if res.get("rank", 0) != 0:  # rank 0 reports for every rank
        return
    click.echo(format_report(res))
    if json_path:
        Path(json_path).write_text(json.dumps(res, indent=2))


def _infer_command() -> click.Command:
    """``rlx bench infer ...``: the existing inference benchmark, as a subcommand of the group."""
    from .bench import bench_command

    params = [p for p in bench_command.params if p.name != "task"]

    def callback(**kw: Any) -> Any:
        assert bench_command.callback is not None
        return bench_command.callback(task="infer", **kw)

    return click.Command("infer", params=params, callback=callback, help=bench_command.help,
                         context_settings={"help_option_names": ["-h", "--help"]})


@click.group("bench", context_settings={"help_option_names": ["-h", "--help"]})
def bench_group() -> None:
    """Benchmark RLX against its peers: inference (ONNX Runtime, PyTorch), MLP training (NumPy,
    PyTorch); `plot` charts saved inference results."""


bench_group.add_command(_infer_command())
bench_group.add_command(train_mlp_command)
bench_group.add_command(plot_command)


__all__ = ["DATASETS", "PEERS", "DataParallelMLP", "NumpyMLP", "ResidentTrainer", "RlxMLP", "TorchMLP",
           "bench_group", "digits_split", "format_report", "init_params", "mlp_graph", "parse_arch",
           "random_mnist", "train_mlp", "train_mlp_command"]
