"""Optimizers as graph fragments, one-graph training steps and the Trainer: step by step against
torch.optim (SGD, Adam, AdamW) and against the published update rules (Lion, Muon)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.autodiff import grad
from rlx_core.errors import IRError
from rlx_core.ir.graph import Graph
from rlx_core.ir.reference import evaluate
from rlx_core.losses import mse, softmax_cross_entropy
from rlx_core.optim import (
    SGD,
    Adam,
    AdamW,
    Lion,
    Muon,
    Optimizer,
    Trainer,
    train_step_graph,
    trainable_params,
)

torch = pytest.importorskip("torch")

F64 = "f64"
SHAPES = {"w": (4, 3), "tall": (6, 2), "conv": (3, 2, 2, 2), "b": (3,)}
STEPS = 5


def _update_graph(opt: Optimizer, shapes: dict[str, tuple], dtype: str = F64) -> tuple[Graph, list[str]]:
    """params, grads, state and step as inputs; new params then new state as outputs."""
    b = GraphBuilder("update")
    params = {n: b.input(n, dtype, s) for n, s in shapes.items()}
    grads = {n: b.input(f"g_{n}", dtype, s) for n, s in shapes.items()}
    names = opt.state_names(params)
    ptype = {f"{n}.{slot}": s for n, s in shapes.items() for slot in opt.slots(s)}
    state = {s: b.input(s, dtype, ptype[s]) for s in names}
    step = b.input("step", "i64", ())
    new_p, new_s = opt.build_update(b, params, grads, state, step)
    for n in shapes:
        b.output(new_p[n], f"{n}.next")
    for s in names:
        b.output(new_s[s], f"{s}.next")
    return b.build(), names


def _run_rlx(opt: Optimizer, init: dict[str, np.ndarray], grads: list[dict[str, np.ndarray]],
             dtype: str = F64) -> list[dict[str, np.ndarray]]:
    graph, names = _update_graph(opt, {n: v.shape for n, v in init.items()}, dtype)
    exe = Session("cpu", use_cache=False).compile(graph)
    params = dict(init)
    state = opt.init_state(params)
    assert sorted(state) == sorted(names)
    out = []
    for k, gs in enumerate(grads):
        res = exe.run({**params, **{f"g_{n}": g for n, g in gs.items()}, **state,
                       "step": np.asarray(k, np.int64)})
        params = {n: res[f"{n}.next"] for n in params}
        state = {s: res[f"{s}.next"] for s in state}
        out.append(params)
    return out


def _run_torch(make: Callable[[list[Any]], Any], init: dict[str, np.ndarray],
               grads: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    ps = {n: torch.tensor(v.copy(), requires_grad=True) for n, v in init.items()}
    opt = make(list(ps.values()))
    out = []
    for gs in grads:
        for n, p in ps.items():
            p.grad = torch.tensor(gs[n])
        opt.step()
        out.append({n: p.detach().numpy().copy() for n, p in ps.items()})
    return out


def _data(seed: int = 0, shapes: dict[str, tuple] = SHAPES, dtype: Any = np.float64
          ) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(seed)
    init = {n: rng.standard_normal(s).astype(dtype) for n, s in shapes.items()}
    grads = [{n: rng.standard_normal(s).astype(dtype) for n, s in shapes.items()} for _ in range(STEPS)]
    return init, grads


def _compare(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]], tol: float = 1e-6) -> None:
    for k, (g, w) in enumerate(zip(got, want)):
        for n in w:
            np.testing.assert_allclose(g[n], w[n], rtol=tol, atol=tol, err_msg=f"step {k + 1}, {n}")


TORCH_CASES = [
    ("sgd", SGD(lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    ("sgd-momentum", SGD(lr=0.05, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    ("sgd-nesterov-wd", SGD(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1)),
    ("sgd-dampening-maximize", SGD(lr=0.03, momentum=0.7, dampening=0.3, weight_decay=0.05, maximize=True),
     lambda p: torch.optim.SGD(p, lr=0.03, momentum=0.7, dampening=0.3, weight_decay=0.05, maximize=True)),
    ("adam", Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    ("adam-wd-amsgrad", Adam(lr=0.02, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1, amsgrad=True),
     lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1, amsgrad=True)),
    ("adamw", AdamW(lr=0.01), lambda p: torch.optim.AdamW(p, lr=0.01)),
    ("adamw-custom", AdamW(lr=0.05, betas=(0.5, 0.7), weight_decay=0.3),
     lambda p: torch.optim.AdamW(p, lr=0.05, betas=(0.5, 0.7), weight_decay=0.3)),
]


@pytest.mark.parametrize("case", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_against_torch_optim(case: tuple) -> None:
    _, opt, make = case
    init, grads = _data()
    _compare(_run_rlx(opt, init, grads), _run_torch(make, init, grads))


def test_adam_in_float32_against_torch() -> None:
    init, grads = _data(1, {"w": (8, 5), "b": (5,)}, np.float32)
    got = _run_rlx(Adam(lr=0.01, weight_decay=0.01), init, grads, dtype="f32")
    want = _run_torch(lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.01), init, grads)
    assert got[-1]["w"].dtype == np.float32
    _compare(got, want, tol=1e-5)


# -- the published rules, transliterated (in float64) --------------------------------------------

def _lion_reference(lr: float, betas: tuple[float, float], wd: float) -> Callable[[list[Any]], Any]:
    """The update of the Lion paper's pseudo-code / lion-pytorch, as a tiny torch optimizer."""
    class LionRef:
        def __init__(self, params: list[Any]) -> None:
            self.params = params
            self.exp_avg = [torch.zeros_like(p) for p in params]

        @torch.no_grad()
        def step(self) -> None:
            b1, b2 = betas
            for p, exp_avg in zip(self.params, self.exp_avg):
                g = p.grad
                p.data.mul_(1 - lr * wd)
                update = exp_avg.clone().mul_(b1).add(g, alpha=1 - b1).sign_()
                p.add_(update, alpha=-lr)
                exp_avg.mul_(b2).add_(g, alpha=1 - b2)

    return LionRef


def _zeropower_via_newtonschulz5(g: Any, steps: int) -> Any:
    """KellerJordan/Muon ``muon.py``, with ``.bfloat16()`` dropped (float64 here)."""
    assert g.ndim >= 2
    a, b, c = (3.4445, -4.7750, 2.0315)
    x = g.clone()
    if g.size(-2) > g.size(-1):
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        am = x @ x.mT
        bm = b * am + c * am @ am
        x = a * x + bm @ x
    if g.size(-2) > g.size(-1):
        x = x.mT
    return x


def _muon_update(grad: Any, momentum: Any, beta: float = 0.95, ns_steps: int = 5,
                 nesterov: bool = True) -> Any:
    momentum.lerp_(grad, 1 - beta)
    update = grad.lerp_(momentum, beta) if nesterov else momentum
    if update.ndim == 4:
        update = update.view(len(update), -1)
    update = _zeropower_via_newtonschulz5(update, steps=ns_steps)
    update *= max(1, grad.size(-2) / grad.size(-1)) ** 0.5
    return update


def _muon_reference(lr: float, momentum: float, wd: float, nesterov: bool, aux_lr: float
                    ) -> Callable[[list[Any]], Any]:
    class MuonRef:
        def __init__(self, params: list[Any]) -> None:
            self.params = params
            self.buf = [torch.zeros_like(p) for p in params]
            self.aux = torch.optim.AdamW([p for p in params if p.ndim < 2], lr=aux_lr, betas=(0.9, 0.95),
                                         eps=1e-10, weight_decay=0.0)

        @torch.no_grad()
        def step(self) -> None:
            for p, buf in zip(self.params, self.buf):
                if p.ndim < 2:
                    continue
                update = _muon_update(p.grad.clone(), buf, beta=momentum, nesterov=nesterov)
                p.mul_(1 - lr * wd)
                p.add_(update.reshape(p.shape), alpha=-lr)
            self.aux.step()

    return MuonRef


def test_lion_against_the_published_rule() -> None:
    init, grads = _data(2)
    _compare(_run_rlx(Lion(lr=0.01, betas=(0.9, 0.99), weight_decay=0.1), init, grads),
             _run_torch(_lion_reference(0.01, (0.9, 0.99), 0.1), init, grads))


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_against_the_published_rule(nesterov: bool) -> None:
    init, grads = _data(3)
    opt = Muon(lr=0.02, momentum=0.95, nesterov=nesterov, weight_decay=0.1,
               aux=AdamW(lr=3e-3, betas=(0.9, 0.95), eps=1e-10, weight_decay=0.0))
    assert opt.slots((4, 3)) == ("momentum_buffer",) and opt.slots((3,)) == ("exp_avg", "exp_avg_sq")
    want = _run_torch(_muon_reference(0.02, 0.95, 0.1, nesterov, 3e-3), init, grads)
    _compare(_run_rlx(opt, init, grads), want)


def test_newton_schulz_orthogonalises() -> None:
    from rlx_core.optim import newton_schulz

    b = GraphBuilder("ns")
    x = b.input("x", F64, (8, 5))
    b.output(newton_schulz(b, x), "o")
    o = evaluate(b.build(), {"x": np.random.default_rng(4).standard_normal((8, 5))})["o"]
    s = np.linalg.svd(o, compute_uv=False)
    assert np.all((s > 0.6) & (s < 1.25)), s  # the quintic iteration pushes singular values to ~[0.7, 1.2]


# -- one training step as one graph, and the Trainer ---------------------------------------------

def _mlp(sizes: tuple[int, ...], dtype: str, seed: int = 0, loss: str = "ce") -> Graph:
    rng = np.random.default_rng(seed)
    npdt = np.float32 if dtype == "f32" else np.float64
    g = GraphBuilder("mlp")
    x = g.input("x", dtype, ("batch", sizes[0]))
    h = x
    for k, (i, o) in enumerate(itertools.pairwise(sizes)):
        bound = 1 / np.sqrt(i)
        w = g.param(f"w{k}", rng.uniform(-bound, bound, (o, i)).astype(npdt))
        b = g.param(f"b{k}", rng.uniform(-bound, bound, o).astype(npdt))
        h = g.op("linear", h, w, b)
        if k < len(sizes) - 2:
            h = g.relu(h)
    if loss == "ce":
        y = g.input("y", "i64", ("batch",))
        g.output(softmax_cross_entropy(g, h, y), "loss")
    else:
        y = g.input("y", dtype, ("batch", sizes[-1]))
        g.output(mse(g, h, y), "loss")
    return g.build()


def test_train_step_graph_layout_and_one_step() -> None:
    model = _mlp((3, 4, 2), F64)
    params = trainable_params(model)
    assert params == ["w0", "b0", "w1", "b1"]
    opt = Adam(lr=0.1)
    tg = train_step_graph(model, "loss", params, opt)
    names = opt.state_names({p: model.weights[p] for p in params})
    assert [v.name for v in tg.inputs] == ["x", "y", *params, *names, "step"]
    assert tg.outputs == ("loss", *[f"{p}.next" for p in params], *[f"{s}.next" for s in names])
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((6, 3)), rng.integers(0, 2, 6)
    state = opt.init_state({p: np.asarray(model.weights[p]) for p in params})
    feeds = {"x": x, "y": y, **{p: np.asarray(model.weights[p]) for p in params}, **state,
             "step": np.asarray(0, np.int64)}
    out = Session("cpu", use_cache=False).compile(tg).run(feeds)
    gr = evaluate(grad(model, "loss", params), {"x": x, "y": y})
    for p in params:  # Adam's first step moves each weight by lr * sign(grad) (up to eps)
        want = np.asarray(model.weights[p]) - 0.1 * np.sign(gr[f"grad_{p}"])
        np.testing.assert_allclose(out[f"{p}.next"], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["loss"], gr["loss"], rtol=1e-12)
    with pytest.raises(IRError, match="already used"):
        train_step_graph(model, "loss", params, opt, step_name="x")


def _blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved half-moons (a small non-linear classification problem, no sklearn)."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, np.pi, n)
    y = rng.integers(0, 2, n)
    x = np.stack([np.cos(t) + y * 1.0, np.sin(t) * (1 - 2 * y) + y * 0.5], 1) + rng.normal(0, 0.1, (n, 2))
    return x, y


@pytest.mark.parametrize("opt", [SGD(lr=0.2, momentum=0.9), Adam(lr=0.02), AdamW(lr=0.02), Lion(lr=0.003),
                                 Muon(lr=0.05, aux=AdamW(lr=0.02, weight_decay=0.0))],
                         ids=["sgd", "adam", "adamw", "lion", "muon"])
def test_trainer_decreases_the_loss_of_a_tiny_mlp(opt: Optimizer) -> None:
    model = _mlp((2, 16, 16, 2), F64, seed=1)
    trainer = Trainer(model, "loss", opt)
    x, y = _blobs(64, 6)
    losses = [trainer.step(x=x, y=y) for _ in range(60)]
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    assert trainer.steps == 60
    trained = trainer.model()
    np.testing.assert_allclose(evaluate(trained, {"x": x, "y": y})["loss"],
                               trainer.step(x=x, y=y), rtol=1e-10)


def test_trainer_mse_regression() -> None:
    model = _mlp((3, 8, 1), F64, seed=2, loss="mse")
    trainer = Trainer(model, "loss", Adam(lr=0.03))
    rng = np.random.default_rng(7)
    x = rng.standard_normal((32, 3))
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3])
    losses = [trainer.step(x=x, y=y) for _ in range(80)]
    assert losses[-1] < 0.2 * losses[0]


def test_loss_curve_matches_torch_mlp_784_128_10() -> None:
    """20 SGD(lr 0.02, momentum 0.9) steps in f32, alternating two batches of 128 seeded random
    images: rlx and torch produce the same loss curve from the same initialisation."""
    dtype = "f32"
    model = _mlp((784, 128, 10), dtype, seed=3)
    trainer = Trainer(model, "loss", SGD(lr=0.02, momentum=0.9))
    npdt = np.float32 if dtype == "f32" else np.float64
    tdt = torch.float32 if dtype == "f32" else torch.float64
    ps = {n: torch.tensor(np.array(model.weights[n]), requires_grad=True) for n in ("w0", "b0", "w1", "b1")}
    topt = torch.optim.SGD(list(ps.values()), lr=0.02, momentum=0.9)
    rng = np.random.default_rng(8)
    batches = [(rng.standard_normal((128, 784)).astype(npdt), rng.integers(0, 10, 128)) for _ in range(2)]
    ours, theirs = [], []
    for k in range(20):
        x, y = batches[k % 2]
        ours.append(trainer.step(x=x, y=y))
        topt.zero_grad()
        h = torch.relu(torch.nn.functional.linear(torch.tensor(x, dtype=tdt), ps["w0"], ps["b0"]))
        loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, ps["w1"], ps["b1"]),
                                                 torch.tensor(y))
        loss.backward()
        topt.step()
        theirs.append(loss.item())
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    assert ours[-1] < ours[0]
    np.testing.assert_allclose(trainer.values["w1"], ps["w1"].detach().numpy(), atol=1e-5)
