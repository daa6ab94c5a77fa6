"""Fit a small synthetic 3D Gaussian scene from rendered views, on RLX (default: the CPU backend).

    .venv/bin/python bench/splat_fit.py --out /tmp/splat_fit            # ~1 minute on 2 cores
    .venv/bin/python bench/splat_fit.py --out out --device cuda --steps 2000 --size 256

A ground-truth scene (Gaussians on a coloured trefoil knot, SH degree 1) is rendered from cameras
on a circle with the splatting ops (``splat_project`` -> ``splat_sh_color`` -> ``splat_rasterize``);
then a random initial scene is fitted to those views with the project's Adam (``rlx_core.optim``,
one learning rate per parameter group as the 3DGS paper), the whole training step (forward,
backward through the ops' ``*_grad`` ops, update) being one compiled RLX graph. Nothing is
downloaded. Writes ``view_<k>.png`` (target | fitted, side by side), ``loss.png`` and
``summary.json`` into ``--out``. No densification or pruning: a fixed set of Gaussians.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx_core.ir.builder import GraphBuilder, Tensor
from rlx_core.ir.graph import Graph
from rlx_core.optim import Adam, Optimizer, Trainer

SH_DEGREE = 1
K = (SH_DEGREE + 1) ** 2
C0 = 0.28209479177387814


# -- scene and cameras -------------------------------------------------------------------------

def look_at(center: np.ndarray) -> np.ndarray:
    """World-to-camera (OpenCV axes: +z forward) for a camera at ``center`` looking at the origin."""
    z = -center / np.linalg.norm(center)
    x = np.cross(z, [0.0, 1.0, 0.0])
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    r = np.stack([x, y, z])
    v = np.eye(4)
    v[:3, :3] = r
    v[:3, 3] = -r @ center
    return v


def cameras(n: int, radius: float = 4.0) -> list[np.ndarray]:
    out = []
    for k in range(n):
        a = 2 * math.pi * k / n
        out.append(np.array([radius * math.sin(a), 0.8 * math.sin(3 * a), -radius * math.cos(a)]))
    return out


def ground_truth(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Gaussians along a trefoil knot, coloured by position, lit a little from one side (SH 1)."""
    t = np.linspace(0, 2 * math.pi, n, endpoint=False)
    means = 0.35 * np.stack([np.sin(t) + 2 * np.sin(2 * t), np.cos(t) - 2 * np.cos(2 * t), -np.sin(3 * t)],
                            -1)
    means += 0.02 * rng.normal(size=means.shape)
    rgb = 0.5 + 0.5 * np.stack([np.cos(t), np.cos(t + 2.1), np.cos(t + 4.2)], -1)
    sh = np.zeros((n, K, 3))
    sh[:, 0] = (rgb - 0.5) / C0
    sh[:, 1:] = 0.15 * rng.normal(size=(n, K - 1, 3))
    return {"means": means, "log_scales": np.log(rng.uniform(0.05, 0.12, (n, 3))),
            "quats": rng.normal(size=(n, 4)), "sh": sh, "logit_opac": np.full(n, 2.0)}


def initial(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"means": rng.uniform(-1.0, 1.0, (n, 3)), "log_scales": np.full((n, 3), math.log(0.08)),
            "quats": np.tile([1.0, 0.0, 0.0, 0.0], (n, 1)) + 0.1 * rng.normal(size=(n, 4)),
            "sh": np.zeros((n, K, 3)), "logit_opac": np.full(n, -1.0)}


# -- the model graph ---------------------------------------------------------------------------

def render(b: GraphBuilder, p: Mapping[str, Tensor], view: Tensor, intr: Tensor, campos: Tensor,
           size: int) -> Tensor:
    mu, con, depth = b.op("splat_project", p["means"], b.op("exp", p["log_scales"]), p["quats"], view, intr,
                          width=size, height=size)
    col = b.op("splat_sh_color", p["sh"], p["means"], campos, degree=SH_DEGREE)
    img, alpha = b.op("splat_rasterize", mu, con, col, b.op("sigmoid", p["logit_opac"]), depth,
                      width=size, height=size, tile_size=16)
    return img  # black background


def model_graph(params: Mapping[str, np.ndarray], size: int, trainable: bool) -> Graph:
    b = GraphBuilder("splat_fit")
    p = {k: (b.param(k, v.astype(np.float32)) if trainable else b.input(k, "f32", v.shape))
         for k, v in params.items()}
    view, intr = b.input("viewmat", "f32", (4, 4)), b.input("intrinsics", "f32", (4,))
    campos = b.input("campos", "f32", (3,))
    img = render(b, p, view, intr, campos, size)
    if trainable:
        target = b.input("target", "f32", (size, size, 3))
        d = img - target
        # L1 + L2 (the paper's photometric loss uses L1 + D-SSIM; L2 smooths the start)
        loss = b.op("reduce_mean", b.op("abs", d) + d * d, axes=(0, 1, 2), keepdims=False)
        b.output(loss, "loss")
    else:
        b.output(img, "image")
    return b.build()


class GroupAdam(Optimizer):
    """Adam with a learning rate per parameter (the paper's groups: positions, scales, ...)."""

    uses_step = True

    def __init__(self, lrs: Mapping[str, float]) -> None:
        self.opts = {k: Adam(lr=v) for k, v in lrs.items()}

    def slots(self, shape: Any) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def update_one(self, b: GraphBuilder, name: str, p: Tensor, g: Tensor, state: Mapping[str, Tensor],
                   step: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        return self.opts[name].update_one(b, name, p, g, state, step)


# -- PNG output (no matplotlib needed) ---------------------------------------------------------

def write_png(path: Path, rgb: np.ndarray) -> None:
    """An 8-bit RGB PNG from ``rgb`` in [0, 1], ``[H, W, 3]``."""
    a = (np.clip(rgb, 0, 1) * 255 + 0.5).astype(np.uint8)
    h, w, _ = a.shape
    raw = b"".join(b"\x00" + a[r].tobytes() for r in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    path.write_bytes(png)


def plot_losses(path: Path, losses: Sequence[float], w: int = 640, h: int = 360) -> None:
    """A log-scale loss curve, drawn into a pixel array (matplotlib when installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        ax.semilogy(losses)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (L1 + L2)")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return
    except ImportError:
        pass
    img = np.ones((h, w, 3))
    m = 30
    img[m:h - m, m] = img[h - m, m:w - m] = 0.0  # axes
    y = np.log10(np.maximum(np.asarray(losses, np.float64), 1e-12))
    lo, hi = float(y.min()), float(y.max())
    xs = m + (w - 2 * m - 1) * np.arange(len(y)) / max(len(y) - 1, 1)
    ys = (h - m) - (h - 2 * m - 1) * (y - lo) / max(hi - lo, 1e-12)
    for k in range(len(y) - 1):  # a polyline, sampled densely
        for s in np.linspace(0, 1, 8):
            px = round(float(xs[k] + s * (xs[k + 1] - xs[k])))
            py = round(float(ys[k] + s * (ys[k + 1] - ys[k])))
            img[max(py - 1, 0):py + 1, max(px - 1, 0):px + 1] = (0.1, 0.3, 0.8)
    write_png(path, img)


# -- main --------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="splat_fit_out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--size", type=int, default=64, help="image side in pixels")
    ap.add_argument("--views", type=int, default=8)
    ap.add_argument("--gt", type=int, default=80, help="Gaussians in the ground truth")
    ap.add_argument("--fit", type=int, default=160, help="Gaussians fitted")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    from rlx_core.runtime import Session

    session = Session(a.device)
    f = 1.2 * a.size
    intr = np.array([f, f, a.size / 2, a.size / 2], np.float32)
    cams = cameras(a.views)
    views = [look_at(c).astype(np.float32) for c in cams]
    gt = ground_truth(a.gt, rng)
    renderer = session.compile(model_graph(gt, a.size, trainable=False))

    def feed(k: int) -> dict[str, np.ndarray]:
        return {"viewmat": views[k], "intrinsics": intr, "campos": cams[k].astype(np.float32)}
    gt32 = {k: v.astype(np.float32) for k, v in gt.items()}
    targets = [renderer.run({**gt32, **feed(k)})["image"] for k in range(a.views)]

    init = initial(a.fit, rng)
    opt = GroupAdam({"means": 0.01, "log_scales": 0.01, "quats": 0.01, "sh": 0.05, "logit_opac": 0.1})
    t0 = time.perf_counter()
    trainer = Trainer(model_graph(init, a.size, trainable=True), "loss", opt, list(init), session=session)
    compile_s = time.perf_counter() - t0
    losses = []
    t0 = time.perf_counter()
    for s in range(a.steps):
        k = int(rng.integers(a.views))
        losses.append(trainer.step({**feed(k), "target": targets[k]}))
        if s % 50 == 0 or s == a.steps - 1:
            print(f"step {s:5d}  loss {losses[-1]:.5f}  ({time.perf_counter() - t0:.1f} s)", flush=True)
    train_s = time.perf_counter() - t0
    fitted = {k: np.asarray(v, np.float32) for k, v in trainer.values.items()}
    err = []
    fit_renderer = session.compile(model_graph(init, a.size, trainable=False))
    for k in range(a.views):
        img = fit_renderer.run({**fitted, **feed(k)})["image"]
        err.append(float(np.mean((img - targets[k]) ** 2)))
        gap = np.ones((a.size, 4, 3))
        write_png(out / f"view_{k}.png", np.concatenate([targets[k], gap, img], axis=1))
    plot_losses(out / "loss.png", losses)
    psnr = float(np.mean([10 * math.log10(1.0 / max(e, 1e-12)) for e in err]))
    summary = {"device": a.device, "size": a.size, "views": a.views, "gaussians_gt": a.gt,
               "gaussians_fit": a.fit, "steps": a.steps, "compile_s": round(compile_s, 2),
               "train_s": round(train_s, 2), "ms_per_step": round(1e3 * train_s / a.steps, 2),
               "loss_first": losses[0], "loss_last": losses[-1], "psnr_db_mean": round(psnr, 2)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
