"""Small float models trained in NumPy, for demonstrations and tests of INT8 quantization.

:func:`train_mlp` (64-32-10) and :func:`train_cnn` (two convolutions, max and average pooling, a
dense classifier) fit 8x8 digit images (e.g. scikit-learn's ``load_digits``, pixels scaled to
[0, 1]) with Adam and softmax cross-entropy, deterministically for a seed, in a few seconds, and
return RLX graphs with a symbolic batch: input ``x`` (``(batch, 64)`` or ``(batch, 1, 8, 8)``),
output ``probs``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir.builder import GraphBuilder
from ..ir.graph import Graph


class _Adam:
    def __init__(self, params: dict[str, np.ndarray], lr: float) -> None:
        self.p, self.lr, self.t = params, lr, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, grads: dict[str, np.ndarray]) -> None:
        self.t += 1
        for k, g in grads.items():
            self.m[k] = 0.9 * self.m[k] + 0.1 * g
            self.v[k] = 0.999 * self.v[k] + 0.001 * g * g
            mh = self.m[k] / (1 - 0.9**self.t)
            vh = self.v[k] / (1 - 0.999**self.t)
            self.p[k] -= self.lr * mh / (np.sqrt(vh) + 1e-8)


def _softmax_xent(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d(mean cross-entropy)/d(logits)."""
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return p / len(y)


def _fit(params: dict[str, np.ndarray], step: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]],
         x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float, batch: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    opt = _Adam(params, lr)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for i in range(0, len(x), batch):
            idx = order[i:i + batch]
            opt.step(step(x[idx], y[idx]))


def train_mlp(x: np.ndarray, y: np.ndarray, *, hidden: int = 32, epochs: int = 60, lr: float = 5e-3,
              seed: int = 0) -> Graph:
    """A 64-``hidden``-10 ReLU MLP; ``x`` is (N, 64) float, ``y`` (N,) class ids."""
    rng = np.random.default_rng(seed)
    x = np.asarray(x, np.float64)
    d, k = x.shape[1], int(y.max()) + 1
    p = {"w1": rng.standard_normal((d, hidden)) * np.sqrt(2.0 / d), "b1": np.zeros(hidden),
         "w2": rng.standard_normal((hidden, k)) * np.sqrt(1.0 / hidden), "b2": np.zeros(k)}

    def step(xb: np.ndarray, yb: np.ndarray) -> dict[str, np.ndarray]:
        h = np.maximum(xb @ p["w1"] + p["b1"], 0.0)
        g = _softmax_xent(h @ p["w2"] + p["b2"], yb)
        gh = (g @ p["w2"].T) * (h > 0)
        return {"w2": h.T @ g, "b2": g.sum(0), "w1": xb.T @ gh, "b1": gh.sum(0)}

    _fit(p, step, x, y, epochs=epochs, lr=lr, batch=64, seed=seed)
    g = GraphBuilder("digits_mlp")
    xi = g.input("x", "f32", ("batch", d))
    f = {n: g.param(n, v.astype(np.float32)) for n, v in p.items()}
    h = g.relu(xi @ f["w1"] + f["b1"])
    g.output(g.softmax(h @ f["w2"] + f["b2"]), "probs")
    return g.build()


def _im2col(x: np.ndarray) -> np.ndarray:
    """3x3, pad 1, stride 1 patches of NCHW ``x``: (N*H*W, C*9)."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # n c h w 3 3
    return win.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def _col2im(cols: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    n, c, h, w = shape
    g = cols.reshape(n, h, w, c, 3, 3)
    out = np.zeros((n, c, h + 2, w + 2))
    for i in range(3):
        for j in range(3):
            out[:, :, i:i + h, j:j + w] += g[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return out[:, :, 1:-1, 1:-1]


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, _, h, wd = x.shape
    cols = _im2col(x)
    y = (cols @ w.reshape(w.shape[0], -1).T + b).reshape(n, h, wd, -1).transpose(0, 3, 1, 2)
    return y, cols


def _conv_back(gy: np.ndarray, cols: np.ndarray, w: np.ndarray, xshape: tuple[int, ...]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    o = w.shape[0]
    gm = gy.transpose(0, 2, 3, 1).reshape(-1, o)
    gw = (gm.T @ cols).reshape(w.shape)
    gx = _col2im(gm @ w.reshape(o, -1), xshape)
    return gx, gw, gm.sum(0)


def train_cnn(x: np.ndarray, y: np.ndarray, *, c1: int = 8, c2: int = 16, epochs: int = 12, lr: float = 4e-3,
              seed: int = 0) -> Graph:
    """conv3x3(1->c1)+ReLU, maxpool 2, conv3x3(c1->c2)+ReLU, avgpool 2, dense(4*c2->10); ``x`` is
    (N, 1, 8, 8) float."""
    rng = np.random.default_rng(seed)
    x = np.asarray(x, np.float64)
    k = int(y.max()) + 1
    p = {"w1": rng.standard_normal((c1, 1, 3, 3)) * np.sqrt(2.0 / 9), "b1": np.zeros(c1),
         "w2": rng.standard_normal((c2, c1, 3, 3)) * np.sqrt(2.0 / (9 * c1)), "b2": np.zeros(c2),
         "w3": rng.standard_normal((k, 4 * c2)) * np.sqrt(1.0 / (4 * c2)), "b3": np.zeros(k)}

    def step(xb: np.ndarray, yb: np.ndarray) -> dict[str, np.ndarray]:
        n = len(xb)
        a1, cols1 = _conv(xb, p["w1"], p["b1"])
        r1 = np.maximum(a1, 0.0)
        win = r1.reshape(n, c1, 4, 2, 4, 2)
        m1 = win.max(axis=(3, 5))
        a2, cols2 = _conv(m1, p["w2"], p["b2"])
        r2 = np.maximum(a2, 0.0)
        m2 = r2.reshape(n, c2, 2, 2, 2, 2).mean(axis=(3, 5))
        flat = m2.reshape(n, -1)
        g = _softmax_xent(flat @ p["w3"].T + p["b3"], yb)
        grads = {"w3": g.T @ flat, "b3": g.sum(0)}
        gm2 = (g @ p["w3"]).reshape(m2.shape)
        gr2 = np.repeat(np.repeat(gm2, 2, axis=2), 2, axis=3) / 4.0
        ga2 = gr2 * (a2 > 0)
        gm1, grads["w2"], grads["b2"] = _conv_back(ga2, cols2, p["w2"], m1.shape)
        mask = win == m1[:, :, :, None, :, None]
        gr1 = (mask * gm1[:, :, :, None, :, None]).reshape(r1.shape)
        ga1 = gr1 * (a1 > 0)
        _, grads["w1"], grads["b1"] = _conv_back(ga1, cols1, p["w1"], xb.shape)
        return grads

    _fit(p, step, x, y, epochs=epochs, lr=lr, batch=32, seed=seed)
    g = GraphBuilder("digits_cnn")
    xi = g.input("x", "f32", ("batch", 1, 8, 8))
    f = {n: g.param(n, v.astype(np.float32)) for n, v in p.items()}
    h = g.op("relu", g.op("conv2d_bias", xi, f["w1"], f["b1"], pads=(1, 1, 1, 1)))
    h = g.op("max_pool2d", h, kernel=(2, 2))
    h = g.op("conv2d", h, f["w2"], pads=(1, 1, 1, 1)) + g.op("reshape", f["b2"], shape=(c2, 1, 1))
    h = g.op("avg_pool2d", g.op("relu", h), kernel=(2, 2))
    h = g.op("reshape", h, shape=("batch", 4 * c2))
    g.output(g.softmax(g.op("linear", h, f["w3"], f["b3"])), "probs")
    return g.build()


def split_digits(images: np.ndarray, target: np.ndarray, *, test: int = 360, seed: int = 0
                 ) -> dict[str, Any]:
    """A seeded train/test split of 8x8 digits; pixels scaled from [0, 16] to [0, 1], float32."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(images))
    x = (np.asarray(images, np.float32).reshape(-1, 64) / 16.0).astype(np.float32)
    y = np.asarray(target, np.int64)
    tr, te = order[:-test], order[-test:]
    return {"x_train": x[tr], "y_train": y[tr], "x_test": x[te], "y_test": y[te]}


def random_cnn(seed: int = 0, *, channels: int = 3) -> Graph:
    """A random-weight float CNN exercising every INT8 rewrite: a multi-channel NCHW input (int8
    transpose to NHWC), a depthwise convolution (channel multiplier 2) with a fused ReLU, a strided
    asymmetric-padded convolution with an ``add`` bias, a lone ReLU (``maximum(x, 0)``) after max
    pooling, padded average pooling that excludes the padding, and a flatten feeding both an output
    (``features``, so NHWC goes back to NCHW order) and a ``linear`` + softmax (``probs``)."""
    rng = np.random.default_rng(seed)
    c = channels
    g = GraphBuilder("random_cnn")
    x = g.input("x", "f32", ("batch", c, 9, 9))

    def p(name: str, *shape: int, scale: float = 0.4) -> Any:
        return g.param(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    h = g.op("relu", g.op("conv2d_bias", x, p("dw", 2 * c, 1, 3, 3), p("dw_b", 2 * c), pads=(1, 1, 1, 1),
                          groups=c))
    h = g.op("conv2d", h, p("cw", 4, 2 * c, 3, 3), strides=(2, 2), pads=(0, 1, 1, 0))
    h = h + g.op("reshape", p("cw_b", 4), shape=(1, 4, 1, 1))
    h = g.relu(g.op("max_pool2d", h, kernel=(2, 2), strides=(1, 1)))
    h = g.op("avg_pool2d", h, kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), count_include_pad=False)
    flat = g.op("reshape", h, shape=("batch", -1))
    g.output(flat, "features")
    k = int(np.prod(flat.shape[1:]))
    g.output(g.softmax(g.op("linear", flat, p("fc", 5, k, scale=0.2), p("fc_b", 5))), "probs")
    return g.build()
