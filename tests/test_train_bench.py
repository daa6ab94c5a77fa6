"""`rlx bench train-mlp` and its pieces: the resident RLX trainer against optim.Trainer, the
hand-written NumPy loop and PyTorch from one initialisation, the command itself, and real accuracy
on scikit-learn's digits."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from rlx_core.optim import SGD, Adam, Trainer
from rlx_core.train_bench import (
    NumpyMLP,
    ResidentTrainer,
    RlxMLP,
    bench_group,
    init_params,
    mlp_graph,
    parse_arch,
    random_mnist,
    thread_limits,
    train_mlp,
    train_mlp_command,
)


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    # Two BLAS threads on a loaded 2-core CI machine can be many times slower than one.
    with thread_limits(1):
        yield


def _batches(x: np.ndarray, y: np.ndarray, b: int, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    k = len(x) // b
    return [(x[(i % k) * b:(i % k + 1) * b], y[(i % k) * b:(i % k + 1) * b]) for i in range(n)]


def test_parse_arch() -> None:
    assert parse_arch("784-128-10") == (784, 128, 10)
    assert parse_arch("784-512-256-10") == (784, 512, 256, 10)
    for bad in ("784", "a-b", "784-0-10", ""):
        with pytest.raises(click.BadParameter):
            parse_arch(bad)


def test_random_mnist_is_seeded_and_learnable() -> None:
    x, y = random_mnist(2048, seed=3)
    x2, y2 = random_mnist(2048, seed=3)
    assert x.dtype == np.float32 and x.shape == (2048, 784) and y.dtype == np.int64
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert 0.0 <= x.min() and x.max() < 1.0
    assert set(np.unique(y)) == set(range(10))  # every class appears


@pytest.mark.parametrize("fusion", [False, True], ids=["nofusion", "fusion"])
@pytest.mark.parametrize("opt", [SGD(lr=0.05, momentum=0.9), Adam(lr=1e-2)], ids=["sgd", "adam"])
def test_resident_trainer_matches_optim_trainer(fusion: bool, opt: object) -> None:
    """Same losses and parameters as the plain Trainer, whether each <p>.next lands in <p>'s own
    buffer (an in-place update: nothing to copy) or is copied back after the run."""
    arch = (20, 16, 12, 5)
    params = init_params(arch, seed=1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 20)).astype(np.float32)
    y = rng.integers(0, 5, 64)
    model = mlp_graph(arch, params, 16)
    ref = Trainer(model, "loss", opt)
    fast = ResidentTrainer(model, "loss", opt, device="cpu", fusion=fusion)
    generic = ResidentTrainer(model, "loss", opt, resident=False, fusion=fusion)
    assert fast.resident and not generic.resident
    for xb, yb in _batches(x, y, 16, 12):
        want = ref.step(x=xb, y=yb)
        assert fast.step(x=xb, y=yb) == pytest.approx(want, rel=1e-6, abs=1e-7)
        assert generic.step(x=xb, y=yb) == pytest.approx(want, rel=1e-6, abs=1e-7)
    for p, v in ref.values.items():
        np.testing.assert_allclose(fast.values()[p], v, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(generic.values()[p], v, rtol=1e-5, atol=1e-6)
    for s, v in ref.state.items():
        np.testing.assert_allclose(fast.state()[s], v, rtol=1e-5, atol=1e-6)
    if not fusion and isinstance(opt, SGD):
        # Unfused, the planner runs every momentum-SGD update in place: parameters and state
        # never move between steps.
        assert fast._copies == []


def test_resident_trainer_needs_static_shapes() -> None:
    from rlx_core.errors import IRError

    with pytest.raises(IRError, match="static shapes"):
        ResidentTrainer(mlp_graph((4, 3), init_params((4, 3))), "loss", SGD(lr=0.1))


def test_rlx_numpy_torch_losses_agree_from_one_init() -> None:
    """The three implementations of one training run: same batches, same initialisation."""
    from rlx_core.train_bench import TorchMLP

    pytest.importorskip("torch")
    arch, b = (784, 64, 32, 10), 32
    params = init_params(arch, seed=5)
    x, y = random_mnist(b * 8, seed=5)
    runs = [RlxMLP(arch, params, b, 0.02, 0.9), NumpyMLP(arch, params, b, 0.02, 0.9),
            TorchMLP(arch, params, b, 0.02, 0.9)]
    curves = [[rt.step(xb, yb) for xb, yb in _batches(x, y, b, 16)] for rt in runs]
    assert all(np.isfinite(curves[0]))
    for c in curves[1:]:
        np.testing.assert_allclose(c, curves[0], rtol=2e-5, atol=2e-6)
    for p in runs[1:]:
        for (w0, b0), (w1, b1) in zip(runs[0].params(), p.params()):
            np.testing.assert_allclose(w1, w0, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(b1, b0, rtol=1e-4, atol=1e-6)
    xt = x[:7]
    np.testing.assert_allclose(runs[0].logits(xt), runs[1].logits(xt), rtol=1e-4, atol=1e-5)


def test_train_mlp_command_quick(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "train.json"
    r = CliRunner().invoke(train_mlp_command, ["--arch", "784-128-10", "--batch", "128", "--device", "cpu",
                                               "--peers", "numpy,torch", "--steps", "20", "--images", "3000",
                                               "--threads", "1", "--fusion", "off", "--json", str(out)])
    assert r.exit_code == 0, r.output
    for word in ("rlx", "numpy", "torch", "images/s", "rlx/numpy", "rlx/torch", "final loss"):
        assert word in r.output, r.output
    data = json.loads(out.read_text())
    assert data["config"]["steps"] == 20 and data["config"]["arch"] == "784-128-10"
    assert data["config"]["threads"] == 1
    res = data["results"]
    assert set(res) == {"rlx", "numpy", "torch"}
    for v in res.values():
        assert v["steps"] == 20 and v["images"] == 20 * 128 and v["images_per_s"] > 0
    assert res["rlx"]["resident"] is True and res["rlx"]["fusion"] is False
    assert res["rlx"]["carried_copies"] == 0  # unfused: every update ran in place
    assert set(data["ratios"]) == {"rlx/numpy", "rlx/torch"}
    # One initialisation, one batch order: the runtimes agree over the first steps.
    assert max(data["first10_max_abs_loss_diff_vs_rlx"].values()) < 1e-4
    assert res["rlx"]["final_loss"] == pytest.approx(res["numpy"]["final_loss"], abs=1e-3)


def test_fusion_auto_picks_the_faster_variant() -> None:
    res = train_mlp("784-24-10", peers=(), steps=12, n_images=2048, threads=1, warmup=1)
    rlx = res["results"]["rlx"]
    trial = rlx["fusion_trial_s"]
    assert set(trial) == {"fusion", "nofusion"} and all(t > 0 for t in trial.values())
    assert rlx["fusion"] == (trial["fusion"] < trial["nofusion"])


def test_bench_group_has_infer_and_train_mlp() -> None:
    r = CliRunner().invoke(bench_group, ["--help"])
    assert r.exit_code == 0 and "train-mlp" in r.output and "infer" in r.output
    r = CliRunner().invoke(bench_group, ["infer", "--help"])
    assert r.exit_code == 0 and "--batch" in r.output and "--peers" in r.output
    r = CliRunner().invoke(bench_group, ["train-mlp", "--steps", "0"])
    assert r.exit_code != 0
    r = CliRunner().invoke(bench_group, ["train-mlp", "--dataset", "digits", "--arch", "784-10",
                                         "--peers", ""])
    assert r.exit_code != 0 and "64-128-10" in r.output


def test_digits_held_out_accuracy() -> None:
    """Real data: scikit-learn's 8x8 digits, seeded stratified 80/20 split, RLX training only."""
    pytest.importorskip("sklearn")
    t0 = time.perf_counter()
    res = train_mlp(dataset="digits", peers=(), threads=1, warmup=0)
    elapsed = time.perf_counter() - t0
    rlx = res["results"]["rlx"]
    assert res["config"]["arch"] == "64-128-10" and res["config"]["test_examples"] == 360
    assert rlx["accuracy"] >= 0.95, rlx
    assert rlx["final_loss_avg50"] < 0.3
    assert elapsed < 30, elapsed
