"""What the device plugins' tests share: the device probe that fails loudly, and a small MLP."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder


def probe(package: str, needs: str, install: str) -> Any:
    """The first device of ``package``'s plugin. A plugin that does not import or a device that is
    not usable FAILS the test with what to install: a skip would read as "nothing to test here" when the
    backend is simply untested."""
    try:
        plugin = importlib.import_module(f"{package}.plugin")
    except Exception as e:  # pragma: no cover - environment problem
        pytest.fail(f"{package} does not import ({type(e).__name__}: {e}); {install}")
    dev = plugin.rlx_probe_devices()[0]
    if not dev.available:
        pytest.fail(f"{needs}: {dev.reason}\n{install}")
    return dev


def small_mlp(name: str, batch: int | str = "batch", rows: int = 3,
              normed: bool = False) -> tuple[Any, dict[str, np.ndarray]]:
    """matmul + bias + ReLU, linear, GELU and softmax over ``batch`` (``rows`` rows fed); ``normed``
    adds a layer_norm output "normed" (unit gamma, zero beta)."""
    rng = np.random.default_rng(0)
    g = GraphBuilder(name)
    x = g.input("x", "f32", (batch, 20))
    w1 = g.param("w1", (rng.standard_normal((20, 33)) * 0.3).astype(np.float32))
    b1 = g.param("b1", rng.standard_normal(33).astype(np.float32))
    w2 = g.param("w2", (rng.standard_normal((7, 33)) * 0.3).astype(np.float32))
    b2 = g.param("b2", rng.standard_normal(7).astype(np.float32))
    h = g.gelu(g.linear(g.relu(x @ w1 + b1), w2, b2))
    g.output(g.softmax(h), "probs")
    if normed:
        g.output(g.layer_norm(h, g.param("gamma", np.ones(7, np.float32)),
                              g.param("beta", np.zeros(7, np.float32))), "normed")
    return g.build(), {"x": rng.standard_normal((rows, 20)).astype(np.float32)}
