"""rlx-cpu's native kernels for the 3D Gaussian splatting ops (``rlx_core``'s ``splat_*`` family).

Projection and colour are one parallel Numba loop per Gaussian. The rasterizer bins Gaussians into
tiles on one core (a stable depth argsort, then one pass that appends every Gaussian to the tiles
its 3-sigma box touches, so each tile's list comes out nearest first), then composites the tiles in
parallel, one pixel at a time front to back. Its backward op re-bins, reruns each pixel's forward
pass keeping the drawn Gaussians' alpha and transmittance, and walks them back to front; threads
add into private gradient rows (one set per chunk of tiles), summed at the end, so the result does
not depend on scheduling. The intersection lists are scratch of the kernel: the ops' operands and
results keep static shapes (see ``rlx_core.ir.ops.splat``). Numba is imported when a kernel is
bound, never at plugin import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from rlx_core.plugin import Attrs

Run = Callable[[], None]


def _nb() -> Any:
    from . import _splat_nb

    return _splat_nb


def _chunks() -> int:
    import numba

    return max(1, int(numba.get_num_threads()))


def _int(attrs: Attrs, name: str) -> int:
    """An ``int`` attribute (the op schema has checked it is one)."""
    return int(cast(int, attrs[name]))


def _raster_attrs(attrs: Attrs) -> tuple[int, int, int]:
    return _int(attrs, "width"), _int(attrs, "height"), _int(attrs, "tile_size")


def k_project(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    means, scales, quats, view, intr = ins
    mu, conic, depth = outs
    nb = _nb()
    w, h = _int(attrs, "width"), _int(attrs, "height")
    near = float(cast(float, attrs["near"]))

    def run() -> None:
        nb.project_fwd(means, scales, quats, np.asarray(view, np.float64), intr, w, h, near, mu, conic,
                       depth)
    return run


def k_project_grad(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    means, scales, quats, view, intr, g_mu, g_conic, g_depth = ins
    g_means, g_scales, g_quats = outs
    nb = _nb()
    w, h = _int(attrs, "width"), _int(attrs, "height")
    near = float(cast(float, attrs["near"]))

    def run() -> None:
        nb.project_bwd(means, scales, quats, np.asarray(view, np.float64), intr, w, h, near, g_mu, g_conic,
                       g_depth, g_means, g_scales, g_quats)
    return run


def k_sh_color(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    sh, means, campos = ins
    nb = _nb()
    deg = _int(attrs, "degree")

    def run() -> None:
        nb.sh_fwd(sh, means, campos, deg, outs[0])
    return run


def k_sh_color_grad(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    sh, means, campos, g = ins
    nb = _nb()
    deg = _int(attrs, "degree")

    def run() -> None:
        nb.sh_bwd(sh, means, campos, deg, g, outs[0], outs[1])
    return run


def k_rasterize(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    means2d, conics, colors, opac, depths = ins
    image, alpha = outs
    nb = _nb()
    w, h, tile = _raster_attrs(attrs)

    def run() -> None:
        nb.raster_fwd(means2d, conics, colors, opac, depths, w, h, tile, image, alpha)
    return run


def k_rasterize_grad(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    means2d, conics, colors, opac, depths, g_img, g_alpha = ins
    g_m, g_q, g_c, g_o = outs
    nb = _nb()
    w, h, tile = _raster_attrs(attrs)
    n, nc = colors.shape
    chunks = _chunks()

    def run() -> None:
        acc_m = np.zeros((chunks, n, 2))
        acc_q = np.zeros((chunks, n, 3))
        acc_c = np.zeros((chunks, n, nc))
        acc_o = np.zeros((chunks, n))
        nb.raster_bwd(means2d, conics, colors, opac, depths, w, h, tile, g_img, g_alpha, chunks,
                      acc_m, acc_q, acc_c, acc_o)
        np.copyto(g_m, acc_m.sum(0))
        np.copyto(g_q, acc_q.sum(0))
        np.copyto(g_c, acc_c.sum(0))
        np.copyto(g_o, acc_o.sum(0))
    return run


#: Kernel factory per claim name (rlx-cpu claims ``cpu.<op>`` for f32 and f64).
FACTORIES: dict[str, Callable[..., Run]] = {
    "cpu.splat_project": k_project, "cpu.splat_project_grad": k_project_grad,
    "cpu.splat_sh_color": k_sh_color, "cpu.splat_sh_color_grad": k_sh_color_grad,
    "cpu.splat_rasterize": k_rasterize, "cpu.splat_rasterize_grad": k_rasterize_grad,
}
