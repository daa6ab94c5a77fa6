"""3D Gaussian splatting ops (``rlx_core.ir.ops.splat``): the float64 references against finite
differences and against hand-checked facts, rlx-cpu's kernels against the references, gradients
through ``rlx_core.autodiff`` end to end, a few optimizer steps, and rlx-cuda against rlx-cpu
(skipped without a GPU)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from rlx_core.autodiff import grad
from rlx_core.ir.schema import REGISTRY
from rlx_core.plugin import DType, GraphBuilder, Session

W, H = 24, 16
VIEW = np.eye(4)
VIEW[:3, :3] = np.array([[np.cos(0.2), 0, np.sin(0.2)], [0, 1, 0], [-np.sin(0.2), 0, np.cos(0.2)]])
VIEW[:3, 3] = [0.1, -0.2, 4.0]
INTR = np.array([20.0, 22.0, 12.3, 7.9])
CAMPOS = -VIEW[:3, :3].T @ VIEW[:3, 3]


def ref(op: str, xs: Sequence[np.ndarray], **attrs: Any) -> list[np.ndarray]:
    s = REGISTRY.get(op)
    outs = s.reference([np.asarray(x, np.float64) for x in xs], s.check_attrs(attrs, op))
    return [np.asarray(o) for o in outs]


def scene(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"means": rng.uniform(-1, 1, (n, 3)), "scales": rng.uniform(0.1, 0.4, (n, 3)),
            "quats": rng.normal(size=(n, 4)), "sh": 0.5 * rng.normal(size=(n, 16, 3)),
            "opac": rng.uniform(0.2, 0.9, n)}


def raster_inputs(n: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    m2 = np.stack([rng.uniform(-2, W + 2, n), rng.uniform(-2, H + 2, n)], -1)
    lc = rng.normal(size=(n, 2, 2)) * 2
    q = np.linalg.inv(lc @ lc.transpose(0, 2, 1) + 0.5 * np.eye(2))
    con = np.stack([q[:, 0, 0], q[:, 0, 1], q[:, 1, 1]], -1)
    return [m2, con, rng.uniform(0, 1, (n, 3)), rng.uniform(0.1, 0.9, n), rng.uniform(1, 5, n)]


def numeric_grad(f: Any, xs: list[np.ndarray], k: int, eps: float = 1e-6) -> np.ndarray:
    out = np.zeros_like(xs[k])
    for idx in np.ndindex(xs[k].shape):
        xp = [x.copy() for x in xs]
        xm = [x.copy() for x in xs]
        xp[k][idx] += eps
        xm[k][idx] -= eps
        out[idx] = (f(xp) - f(xm)) / (2 * eps)
    return out


# -- references --------------------------------------------------------------------------------

def test_project_matches_pinhole_and_ewa() -> None:
    """One axis-aligned Gaussian straight ahead: mean at the principal point,
    conic = 1/(f^2 s^2/z^2 + 0.3)."""
    m, s, q = np.array([[0.0, 0.0, 5.0]]), np.array([[0.2, 0.1, 0.3]]), np.array([[1.0, 0, 0, 0]])
    mu, con, depth = ref("splat_project", [m, s, q, np.eye(4), INTR], width=W, height=H)
    np.testing.assert_allclose(mu, [[INTR[2], INTR[3]]])
    np.testing.assert_allclose(depth, [5.0])
    np.testing.assert_allclose(con, [[1 / ((20 * 0.2 / 5) ** 2 + 0.3), 0.0, 1 / ((22 * 0.1 / 5) ** 2 + 0.3)]])


def test_project_culls_behind_near_plane() -> None:
    m = np.array([[0.0, 0.0, 0.005], [0.0, 0.0, -1.0], [0.1, 0.0, 2.0]])
    s, q = np.full((3, 3), 0.1), np.tile([1.0, 0, 0, 0], (3, 1))
    mu, con, depth = ref("splat_project", [m, s, q, np.eye(4), INTR], width=W, height=H, near=0.01)
    assert (mu[:2] == 0).all() and (con[:2] == 0).all() and (con[2, [0, 2]] > 0).all()
    np.testing.assert_allclose(depth, m[:, 2])


def test_rasterize_single_gaussian_by_hand() -> None:
    """One Gaussian: pixel = colour * min(0.99, o exp(power)) where >= 1/255 inside its tiles."""
    m2, con = np.array([[10.0, 6.0]]), np.array([[0.5, 0.1, 0.3]])
    col, op, dep = np.array([[1.0, 0.5, 0.25]]), np.array([0.8]), np.array([2.0])
    img, alpha = ref("splat_rasterize", [m2, con, col, op, dep], width=W, height=H, tile_size=8)
    py, px = np.mgrid[0:H, 0:W] + 0.5
    dx, dy = 10.0 - px, 6.0 - py
    a = np.minimum(0.99, 0.8 * np.exp(-0.5 * (0.5 * dx * dx + 0.3 * dy * dy) - 0.1 * dx * dy))
    a = np.where(a >= 1 / 255, a, 0.0)
    # the 3-sigma box: r = ceil(3 sqrt(lambda_max)) = 8 -> tiles x 0..2, y 0..1 (every tile here)
    np.testing.assert_allclose(alpha, a)
    np.testing.assert_allclose(img, a[..., None] * col[0])


def test_rasterize_tiles_limit_reach() -> None:
    """A Gaussian reaches only the tiles its box ``mean +- ceil(3 sqrt(lambda_max))`` touches (the
    paper's rule): sigma 6 gives r = 19, but alpha stays >= 1/255 out to 19.9 pixels, so pixel 24
    (centre 24.5, 19.7 from the mean) is drawn with 16-pixel tiles and not with 4-pixel ones."""
    m2, con = np.array([[4.8, 4.8]]), np.array([[1 / 36, 0.0, 1 / 36]])
    args = [m2, con, np.ones((1, 3)), np.array([0.99]), np.array([1.0])]
    _, a4 = ref("splat_rasterize", args, width=64, height=32, tile_size=4)
    _, a16 = ref("splat_rasterize", args, width=64, height=32, tile_size=16)
    assert a4[4, 23] > 0 and a4[4, 24] == 0 and a16[4, 24] > 1 / 255
    np.testing.assert_array_equal(a4[:24, :24], a16[:24, :24])


def test_rasterize_stops_on_transmittance() -> None:
    """Opacity-0.95 Gaussians piled on one pixel: T = 0.05^k; the fourth would take T under 1e-4,
    so the pixel stops after three."""
    n = 10
    args = [np.tile([[5.5, 5.5]], (n, 1)), np.tile([[0.1, 0.0, 0.1]], (n, 1)), np.eye(n, 3),
            np.full(n, 0.95), np.arange(n, dtype=float)]
    img, alpha = ref("splat_rasterize", args, width=12, height=12, tile_size=16)
    assert alpha[5, 5] == pytest.approx(1 - 0.05**3)
    np.testing.assert_allclose(img[5, 5], [0.95, 0.95 * 0.05, 0.95 * 0.05**2])


@pytest.mark.parametrize("deg", [0, 1, 2, 3])
def test_sh_degree0_is_dc_and_grad_fd(deg: int) -> None:
    sc = scene(5)
    a = {"degree": deg}
    if deg == 0:
        (c,) = ref("splat_sh_color", [sc["sh"], sc["means"], CAMPOS], **a)
        np.testing.assert_allclose(c, np.maximum(0.28209479177387814 * sc["sh"][:, 0] + 0.5, 0))
    (c,) = ref("splat_sh_color", [sc["sh"], sc["means"], CAMPOS], **a)
    g = np.random.default_rng(3).normal(size=c.shape)
    an = ref("splat_sh_color_grad", [sc["sh"], sc["means"], CAMPOS, g], **a)
    xs = [sc["sh"], sc["means"]]

    def loss(v: list[np.ndarray]) -> float:
        return float(np.sum(ref("splat_sh_color", [v[0], v[1], CAMPOS], **a)[0] * g))
    for k in range(2):
        np.testing.assert_allclose(an[k], numeric_grad(loss, xs, k), rtol=1e-6, atol=1e-7)


def test_project_grad_fd() -> None:
    sc = scene(6)
    m = sc["means"].copy()
    m[0] = [3.5, 0.0, 0.0]  # past the clamped field of view: the clamp's kink
    xs = [m, sc["scales"], sc["quats"]]
    att = {"width": W, "height": H}
    outs = ref("splat_project", [*xs, VIEW, INTR], **att)
    rng = np.random.default_rng(4)
    gs = [rng.normal(size=o.shape) for o in outs]
    an = ref("splat_project_grad", [*xs, VIEW, INTR, *gs], **att)

    def loss(v: list[np.ndarray]) -> float:
        return float(sum(np.sum(o * g) for o, g in zip(ref("splat_project", [*v, VIEW, INTR], **att), gs)))
    for k in range(3):
        num = numeric_grad(loss, xs, k)
        np.testing.assert_allclose(an[k], num, rtol=1e-5, atol=1e-6 * np.abs(num).max())


def test_rasterize_grad_fd() -> None:
    xs = raster_inputs(12)
    att = {"width": W, "height": H, "tile_size": 8}
    img, alpha = ref("splat_rasterize", xs, **att)
    rng = np.random.default_rng(5)
    gi, ga = rng.normal(size=img.shape), rng.normal(size=alpha.shape)
    an = ref("splat_rasterize_grad", [*xs, gi, ga], **att)

    def loss(v: list[np.ndarray]) -> float:
        i, a = ref("splat_rasterize", [*v, xs[4]], **att)
        return float(np.sum(i * gi) + np.sum(a * ga))
    for k in range(4):
        num = numeric_grad(loss, xs[:4], k)
        np.testing.assert_allclose(an[k], num, rtol=1e-5, atol=1e-6 * np.abs(num).max())


def test_rasterize_grad_zero_where_alpha_clamped() -> None:
    """Opacity 1 at the centre: alpha clamps at 0.99 there and passes no gradient to opacity."""
    args = [np.array([[4.5, 4.5]]), np.array([[4.0, 0.0, 4.0]]), np.ones((1, 3)), np.array([1.0]),
            np.array([1.0])]
    g = np.zeros((8, 8, 3))
    g[4, 4] = 1.0  # only the centre pixel, where exp(power) = 1
    _, _, gc, go = ref("splat_rasterize_grad", [*args, g, np.zeros((8, 8))], width=8, height=8, tile_size=8)
    assert go[0] == 0.0 and gc[0, 0] == pytest.approx(0.99)


# -- kernels and autodiff through a session ----------------------------------------------------

def _run(device: str, op: str, xs: Sequence[np.ndarray], dt: str, **attrs: Any) -> list[np.ndarray]:
    b = GraphBuilder(op)
    ins = [b.input(f"x{i}", dt, x.shape) for i, x in enumerate(xs)]
    out = b.op(op, *ins, **attrs)
    for o in out if isinstance(out, tuple) else (out,):
        b.output(o)
    g = b.build()
    res = Session(device, use_cache=False).compile(g).run(
        {f"x{i}": np.asarray(x, DType.parse(dt).np) for i, x in enumerate(xs)})
    return [res[o] for o in g.outputs]


def _all_cases() -> list[tuple[str, list[np.ndarray], dict[str, Any]]]:
    sc = scene(9)
    xs = raster_inputs(15)
    rng = np.random.default_rng(6)
    pa = {"width": W, "height": H}
    ra = {"width": W, "height": H, "tile_size": 8}
    pj = [sc["means"], sc["scales"], sc["quats"], VIEW, INTR]
    return [("splat_project", pj, pa),
            ("splat_project_grad", [*pj, rng.normal(size=(9, 2)), rng.normal(size=(9, 3)),
                                    rng.normal(size=9)], pa),
            ("splat_sh_color", [sc["sh"], sc["means"], CAMPOS], {"degree": 3}),
            ("splat_sh_color_grad", [sc["sh"], sc["means"], CAMPOS, rng.normal(size=(9, 3))], {"degree": 2}),
            ("splat_rasterize", xs, ra),
            ("splat_rasterize_grad", [*xs, rng.normal(size=(H, W, 3)), rng.normal(size=(H, W))], ra)]


@pytest.mark.parametrize("dt", ["f64", "f32"])
def test_cpu_kernels_match_reference(dt: str) -> None:
    for op, xs, attrs in _all_cases():
        cast = [np.asarray(x, DType.parse(dt).np) for x in xs]
        want = ref(op, cast, **attrs)
        got = _run("cpu", op, cast, dt, **attrs)
        tol = 1e-12 if dt == "f64" else 2e-6
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max())),
                                       err_msg=op)


def _pipeline(n: int, dt: str = "f64", trainable: Sequence[str] = ()) -> tuple[Any, dict[str, np.ndarray]]:
    """means/scales/quats/sh/opacity (raw: log scales, logit opacity) -> image -> squared error;
    the names in ``trainable`` are parameters (weights) instead of inputs."""
    sc = scene(n, seed=2)
    raw = {"means": sc["means"], "log_scales": np.log(sc["scales"]), "quats": sc["quats"], "sh": sc["sh"],
           "logit_opac": np.log(sc["opac"] / (1 - sc["opac"]))}
    npdt = DType.parse(dt).np
    b = GraphBuilder("splat")
    p = {k: (b.param(k, v.astype(npdt)) if k in trainable else b.input(k, dt, v.shape))
         for k, v in raw.items()}
    target = b.input("target", dt, (H, W, 3))
    view, intr, cam = b.const(VIEW, dt), b.const(INTR, dt), b.const(CAMPOS, dt)
    mu, con, depth = b.op("splat_project", p["means"], b.op("exp", p["log_scales"]), p["quats"], view, intr,
                          width=W, height=H)
    col = b.op("splat_sh_color", p["sh"], p["means"], cam, degree=3)
    img, _ = b.op("splat_rasterize", mu, con, col, b.op("sigmoid", p["logit_opac"]), depth,
                  width=W, height=H, tile_size=8)
    d = img - target
    b.output(b.op("reduce_sum", d * d, axes=(0, 1, 2), keepdims=False), "loss")
    feed = {k: v.astype(npdt) for k, v in raw.items() if k not in trainable}
    feed["target"] = np.random.default_rng(7).uniform(0, 1, (H, W, 3)).astype(npdt)
    return b.build(), feed


def test_autodiff_pipeline_matches_finite_differences() -> None:
    g, feed = _pipeline(6)
    wrt = ["means", "log_scales", "quats", "sh", "logit_opac"]
    gg = grad(g, "loss", wrt)
    exe = Session("cpu", use_cache=False).compile(gg)
    out = exe.run(feed)
    fwd = Session("cpu", use_cache=False).compile(g)

    def loss(v: list[np.ndarray], name: str) -> float:
        return float(fwd.run({**feed, name: v[0]})["loss"])
    rng = np.random.default_rng(8)
    assert gg.outputs == ("loss", *[f"grad_{n}" for n in wrt])
    for name, gname in zip(wrt, gg.outputs[1:]):
        x = feed[name]
        # a few random coordinates per parameter (the full Jacobian is slow through a session)
        for idx in [tuple(int(rng.integers(0, s)) for s in x.shape) for _ in range(4)]:
            xp, xm = x.copy(), x.copy()
            xp[idx] += 1e-6
            xm[idx] -= 1e-6
            num = (loss([xp], name) - loss([xm], name)) / 2e-6
            assert out[gname][idx] == pytest.approx(num, rel=1e-4, abs=1e-6), (name, idx)


def test_adam_fits_scene() -> None:
    """A few Adam steps through the project's Trainer lower the photometric loss."""
    from rlx_core.optim import Adam, Trainer

    names = ["means", "log_scales", "sh", "logit_opac"]
    model, feed = _pipeline(8, dt="f32", trainable=names)
    t = Trainer(model, "loss", Adam(lr=0.02), names)
    losses = [t.step(feed) for _ in range(15)]
    assert losses[-1] < 0.8 * losses[0], losses


# -- rlx-cuda ----------------------------------------------------------------------------------

def _cuda_available() -> bool:
    try:
        import rlx_core

        return any(d.backend == "cuda" for d in rlx_core.devices())
    except Exception:
        return False


@pytest.mark.skipif(not _cuda_available(), reason="no CUDA device (rlx-cuda not installed or no GPU)")
@pytest.mark.parametrize("dt", ["f64", "f32"])
def test_cuda_kernels_match_reference(dt: str) -> None:
    for op, xs, attrs in _all_cases():
        cast = [np.asarray(x, DType.parse(dt).np) for x in xs]
        want = ref(op, cast, **attrs)
        got = _run("cuda", op, cast, dt, **attrs)
        tol = 1e-11 if dt == "f64" else 5e-4
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max())),
                                       err_msg=op)
