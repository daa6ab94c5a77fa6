"""Conformance cases and tolerances for the 3D Gaussian splatting ops (``rlx_core``'s ``splat_*``),
by op name; part of :data:`rlx_conformance.cases.GENERATORS` and of the inexact-op tables there.

The scenes are small (at most 40 Gaussians, 32x24 pixels) so the dense float64 references stay
cheap. They cover: Gaussians behind the near plane (culled), past the clamped field of view, a
degenerate conic, no Gaussians at all, one Gaussian, partial edge tiles and three tile sizes,
alpha clamped at 0.99 (opacity 1 at a Gaussian's centre), and a pile of opaque Gaussians that
stops on the transmittance threshold; SH degrees 0 to 3, extra coefficients, one colour channel.

The tolerances come from the ops themselves: each schema is ``accumulates=True`` with a
``condition`` in its ``extra`` (``(k, scale)``, see ``rlx_core.ir.ops.splat``), which
:func:`rlx_conformance.cases.accumulation` reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_core.plugin import DType

Shape = tuple[int, ...]
Gen = Callable[[np.random.Generator, Shape, DType], np.ndarray]

W, H = 32, 24
INTRINSICS = (30.0, 28.0, 16.3, 12.1)


def _const(values: Any) -> Gen:
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return np.asarray(values, np.float64).reshape(shape).astype(dt.np)
    return make


def _uniform(lo: float, hi: float) -> Gen:
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return rng.uniform(lo, hi, size=shape).astype(dt.np)
    return make


def _normal(scale: float = 1.0) -> Gen:
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(dt.np)
    return make


def _viewmat(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """A camera 4 units in front of the origin, looking at it, turned by a small random rotation."""
    a, b = rng.uniform(-0.3, 0.3, size=2)
    ry = np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])
    rx = np.array([[1, 0, 0], [0, np.cos(b), -np.sin(b)], [0, np.sin(b), np.cos(b)]])
    v = np.eye(4)
    v[:3, :3] = rx @ ry
    v[:3, 3] = [rng.uniform(-0.2, 0.2), rng.uniform(-0.2, 0.2), 4.0]
    return v.astype(dt.np)


def _means3d(special: str) -> Gen:
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        m = rng.uniform(-1.0, 1.0, size=shape)
        if special == "culled" and shape[0] >= 3:
            m[:2, 2] = [-4.5, -3.995]           # behind the camera, and just inside the near plane
        if special == "clamped" and shape[0] >= 3:
            m[0] = [6.0, 0.1, 0.0]              # x/z far past the clamped field of view
            m[1] = [0.2, -7.0, 0.5]
        return m.astype(dt.np)
    return make


def _conics(degenerate: bool = False) -> Gen:
    """Inverse covariances of random 2-D Gaussians 0.7 to 5 pixels wide (+ the 0.3 low-pass)."""
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        n = shape[0]
        ang = rng.uniform(0, np.pi, n)
        s = rng.uniform(0.7, 5.0, (n, 2))
        c, si = np.cos(ang), np.sin(ang)
        r = np.stack([np.stack([c, -si], -1), np.stack([si, c], -1)], 1)
        cov = r @ (s[:, :, None] ** 2 * np.eye(2)) @ np.swapaxes(r, 1, 2) + 0.3 * np.eye(2)
        q = np.linalg.inv(cov) if n else np.zeros((0, 2, 2))
        out = np.stack([q[:, 0, 0], q[:, 0, 1], q[:, 1, 1]], -1) if n else np.zeros((0, 3))
        if degenerate and n >= 2:
            out[1] = 0.0                        # a culled Gaussian, as splat_project writes it
        return out.astype(dt.np)
    return make


def _means2d(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    return np.stack([rng.uniform(-3, W + 3, shape[0]), rng.uniform(-3, H + 3, shape[0])], -1).astype(dt.np)


def _opacities(with_ones: bool) -> Gen:
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        o = rng.uniform(0.05, 0.95, size=shape)
        if with_ones:
            o[::3] = 1.0                        # alpha clamps at 0.99 near those centres
        return o.astype(dt.np)
    return make


def _project_inputs(c: Any, n: int, special: str = "") -> list[tuple[str, Any]]:
    return [("means", c.arr(_means3d(special), (n, 3))), ("scales", c.arr(_uniform(0.05, 0.4), (n, 3))),
            ("quats", c.arr(_normal(), (n, 4))), ("viewmat", c.arr(_viewmat, (4, 4))),
            ("intrinsics", c.arr(_const(INTRINSICS), (4,)))]


def _gen_project(c: Any, grad: bool = False) -> None:
    att = {"width": W, "height": H}
    for label, kind, n, special in (("basic", "basic", 8, ""), ("culled", "basic", 6, "culled"),
                                    ("clamped", "basic", 5, "clamped"), ("one", "size1", 1, ""),
                                    ("empty", "size0", 0, "")):
        ins = _project_inputs(c, n, special)
        if grad:
            ins += [("grad_means2d", c.arr(_normal(), (n, 2))), ("grad_conics", c.arr(_normal(), (n, 3))),
                    ("grad_depths", c.arr(_normal(), (n,)))]
        c.add(label, kind, ins, att)
    ins = _project_inputs(c, 5)
    if grad:
        ins += [("grad_means2d", c.arr(_normal(), (5, 2))), ("grad_conics", c.arr(_normal(), (5, 3))),
                ("grad_depths", c.arr(_normal(), (5,)))]
    c.add("near_plane", "basic", ins, {**att, "near": 3.5})


def _gen_sh(c: Any, grad: bool = False) -> None:
    campos = c.arr(_const((0.1, -0.2, -4.0)), (3,))
    for label, kind, n, k, ch, deg in (("deg0", "basic", 6, 1, 3, 0), ("deg1", "basic", 6, 4, 3, 1),
                                       ("deg2", "basic", 6, 9, 3, 2), ("deg3", "basic", 7, 16, 3, 3),
                                       ("deg1_extra_coeffs", "basic", 5, 16, 3, 1),
                                       ("one_channel", "basic", 5, 16, 1, 3), ("one", "size1", 1, 16, 3, 3),
                                       ("empty", "size0", 0, 16, 3, 3)):
        ins = [("sh", c.arr(_normal(0.5), (n, k, ch))), ("means", c.arr(_uniform(-1, 1), (n, 3))),
               ("campos", campos)]
        if grad:
            ins.append(("grad_colors", c.arr(_normal(), (n, ch))))
        c.add(label, kind, ins, {"degree": deg})


def _gen_raster(c: Any, grad: bool = False) -> None:
    w, h = 20, 12
    for label, kind, n, tile, ones, degenerate, ch in (
            ("basic", "basic", 12, 8, False, False, 3), ("tile16", "basic", 10, 16, False, False, 3),
            ("tile4", "basic", 10, 4, False, True, 3), ("clamped_alpha", "basic", 9, 8, True, False, 3),
            ("opaque_pile", "basic", 40, 8, True, False, 3), ("one_channel", "basic", 8, 8, False, False, 1),
            ("one", "size1", 1, 8, False, False, 3), ("empty", "size0", 0, 8, False, False, 3)):
        ins = [("means2d", c.arr(_means2d, (n, 2))), ("conics", c.arr(_conics(degenerate), (n, 3))),
               ("colors", c.arr(_uniform(0.0, 1.0), (n, ch))), ("opacities", c.arr(_opacities(ones), (n,))),
               ("depths", c.arr(_uniform(1.0, 10.0), (n,)))]
        if grad:
            ins += [("grad_image", c.arr(_normal(), (h, w, ch))), ("grad_alpha", c.arr(_normal(), (h, w)))]
        c.add(label, kind, ins, {"width": w, "height": h, "tile_size": tile})


GENERATORS: dict[str, Callable[[Any], None]] = {
    "splat_project": _gen_project, "splat_project_grad": lambda c: _gen_project(c, True),
    "splat_sh_color": _gen_sh, "splat_sh_color_grad": lambda c: _gen_sh(c, True),
    "splat_rasterize": _gen_raster, "splat_rasterize_grad": lambda c: _gen_raster(c, True),
}

__all__ = ["GENERATORS"]
