"""3D Gaussian splatting (Kerbl et al., SIGGRAPH 2023) as IR ops: projection, spherical-harmonics
colour, tile rasterization, and the backward op of each.

* ``splat_project(means, scales, quats, viewmat, intrinsics; width, height, near)`` -> ``means2d``
  ``[N, 2]``, ``conics`` ``[N, 3]``, ``depths`` ``[N]``. Camera-space ``p = R m + t`` (``viewmat`` is
  world-to-camera, 4x4, row-major, OpenCV axes: +z forward), pixel ``u = fx x/z + cx`` (the centre of
  pixel ``(i, j)`` is ``(i + 0.5, j + 0.5)``). The covariance ``Sigma = R_q S S^T R_q^T`` (``S =
  diag(scales)``, ``R_q`` the rotation of the normalised quaternion ``(w, x, y, z)``) goes to the
  image with EWA splatting: ``Sigma' = J W Sigma W^T J^T + 0.3 I`` (the low-pass filter), ``J`` the
  Jacobian of the projection at ``p`` with ``x/z`` and ``y/z`` clamped to 1.3 x the field of view
  (as the paper's code). ``conics = (a, b, c)`` is ``Sigma'^-1 = [[a, b], [b, c]]``. A Gaussian
  with ``z <= near`` is culled: its means2d and conic are 0 (the rasterizer skips a conic with
  ``a c - b^2 <= 0``); ``depths`` is ``z`` for every Gaussian.
* ``splat_sh_color(sh, means, campos; degree)`` -> ``colors`` ``[N, C]``: the real spherical-harmonics
  basis up to ``degree`` (0..3, the paper's constants) evaluated at the unit direction from the
  camera centre to each mean, ``max(sum_k B_k sh[:, k] + 0.5, 0)``; ``sh`` is ``[N, K, C]`` with ``K
  >= (degree + 1)^2`` (higher coefficients are ignored).
* ``splat_rasterize(means2d, conics, colors, opacities, depths; width, height, tile_size)`` ->
  ``image`` ``[H, W, C]`` and ``alpha`` ``[H, W]`` (``1 - T`` at the end, so a background is
  ``image + (1 - alpha) * bg``). Per Gaussian, ``r = ceil(3 sqrt(lambda_max(Sigma')))`` and the tiles
  (``tile_size`` square, from the top-left) that the box ``[u +- r] x [v +- r]`` touches; per pixel,
  the Gaussians binned to its tile in depth order (equal depths by index), front to back:
  ``power = -(a dx^2 + c dy^2)/2 - b dx dy`` (``d = mean - pixel centre``), skipped when ``> 0``;
  ``alpha = min(0.99, opacity exp(power))``, skipped when ``< 1/255``; the pixel stops *before* the
  Gaussian that would bring the transmittance ``T`` under ``1e-4``; ``image += colour alpha T``,
  ``T *= 1 - alpha``. This is the paper's rasterizer, so the result depends on the tiling exactly as
  theirs does (a Gaussian reaches every pixel of the tiles its 3-sigma box touches, and no other).

**Why these op boundaries.** Binning produces one list per tile whose lengths depend on the data
(how many Gaussians overlap each tile), and sorting orders those lists. Ops with data-dependent
output shapes would make every downstream buffer dynamic, break the static buffer plan the LIR is
built on (one arena, offsets fixed at compile time) and CUDA-graph capture. So binning and the sort
live *inside* ``splat_rasterize`` (and ``splat_rasterize_grad``): its operands and results have
static shapes (``N`` Gaussians in, an ``H x W`` image out) and the variable-length intersection
lists are the kernel's private scratch. Projection and colour are separate ops because they are
per-Gaussian maps a model combines freely (activations of the raw parameters, a fixed colour instead
of SH, several cameras against one scene).

**Backward.** Each op's ``vjp`` emits its ``*_grad`` op (an MIR op with a float64 reference and
kernels of its own): ``splat_rasterize_grad`` re-bins, recomputes each pixel's front-to-back pass
and walks it back to front (the paper's backward, without its saved per-pixel state, so no output
has a data-dependent shape); the thresholds (``1/255``, ``1e-4``, the 0.99 clamp, the tile boxes)
are piecewise constant and contribute no gradient; a clamped alpha passes none to opacity or
position. Depths, the camera and the intrinsics get no gradient.

No decomposition into other ops is given: a dense one (every pixel against every Gaussian) is
O(H W N) memory, so a backend without these kernels fails compilation naming them (the dispatch
contract) rather than running something unusably large.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ...dtypes import DType
from ...errors import DTypeError, ShapeError
from ..schema import AttrSpec, OpSchema, register_op
from ..types import Attrs, TensorType, attr_float

FLOATS = (DType.F32, DType.F64)
#: The paper's constants: the low-pass filter added to the 2-D covariance, alpha's clamp and
#: threshold, the transmittance at which a pixel stops, the frustum margin of the Jacobian.
LOW_PASS = 0.3
ALPHA_MAX = 0.99
ALPHA_MIN = 1.0 / 255.0
T_MIN = 1e-4
FOV_MARGIN = 1.3
SH_C0 = 0.28209479177387814
SH_C1 = 0.4886025119029199
SH_C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792,
         0.5462742152960396)
SH_C3 = (-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
         -0.4570457994644658, 1.445305721320277, -0.5900435899266435)


# -- shape checks ------------------------------------------------------------------------------

def _float(op: str, ts: Sequence[TensorType]) -> DType:
    dt = ts[0].dtype
    for i, t in enumerate(ts):
        if t.dtype not in FLOATS:
            raise DTypeError(f"{op} does not accept {t.dtype} (input {i})", fix="use f32 or f64; cast first")
        if t.dtype != dt:
            raise DTypeError(f"{op} needs one dtype for every operand, got {dt} and {t.dtype} (input {i})",
                             fix="cast every operand to the same float dtype")
    return dt


def _want(op: str, what: str, t: TensorType, shape: tuple[Any, ...]) -> None:
    """``shape`` may hold ``None`` (any dim) and symbols that must match ``t``'s dims exactly."""
    ok = t.rank == len(shape) and all(w is None or d == w or isinstance(d, str) or isinstance(w, str)
                                       for d, w in zip(t.shape, shape))
    if not ok:
        want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
        raise ShapeError(f"{op}: {what} has shape {t.shape}, expected {want}",
                         fix=f"pass {what} as {want} (N = the number of Gaussians)")


def _int(attrs: Attrs, name: str) -> int:
    """An ``int`` attribute (:meth:`OpSchema.check_attrs` has checked it is one)."""
    return int(cast(int, attrs[name]))


def _image_attrs(op: str, attrs: Attrs) -> tuple[int, int]:
    w, h = _int(attrs, "width"), _int(attrs, "height")
    if w <= 0 or h <= 0:
        raise ShapeError(f"{op}: image size {w}x{h} is empty", fix="width and height must be >= 1")
    return w, h


# -- error bounds (conformance tolerance) ------------------------------------------------------
# Each op is ``accumulates=True`` with ``extra["condition"](inputs, attrs) -> (k, scale)``: the
# conformance tolerance is then ``rtol = (2 + 8) eps + k eps`` and ``atol = k eps scale``, where ``k``
# counts the roundings on the op's longest chain plus the terms it sums, and ``scale`` is the
# magnitude the absolute error is proportional to. A projected conic inherits the condition number
# of the 2-D covariance it inverts; a composited pixel sums up to N Gaussians whose power terms
# cancel by up to the conic's condition number (a drawn Gaussian has |power| <= log 255 < 6).

def _amax(*xs: Any) -> float:
    vals = [float(np.max(np.abs(x))) for x in xs if np.size(x)]
    return max((v for v in vals if np.isfinite(v)), default=0.0)


def conic_condition(conics: np.ndarray) -> float:
    """Largest condition number of the positive-definite 2x2 conics ``[N,3]`` (1 if none)."""
    a, b, c = conics[:, 0], conics[:, 1], conics[:, 2]
    tr, det = a + c, a * c - b * b
    ok = det > 0
    if not ok.any():
        return 1.0
    disc = np.sqrt(np.maximum(tr[ok] ** 2 / 4 - det[ok], 0.0))
    lo, hi = tr[ok] / 2 - disc, tr[ok] / 2 + disc
    return float(np.max(hi / np.maximum(lo, 1e-300)))


def _cond_project(xs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    # 16 roundings (camera point, rotation, R S, Sigma, J W, the 2-D covariance, its inverse)
    # and 3-term dot products along them
    mu, conic, _ = _ref_project(xs[:5], attrs)
    return 16 + 9, max(_amax(conic) * conic_condition(conic), _amax(mu) * depth_cancellation(xs), 1.0)


def _cond_project_grad(xs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    _, conic, _ = _ref_project(xs[:5], attrs)
    amp = conic_condition(conic) * depth_cancellation(xs) ** 2
    return 32 + 27, max(_amax(*_ref_project_grad(xs, attrs)) * amp, 1.0)


def depth_cancellation(xs: Sequence[np.ndarray]) -> float:
    """How much the camera-space depth ``z = W m + t`` of a drawn Gaussian loses to cancellation:
    ``max (|W_z| |m| + |t_z|) / z`` (its relative error is that many ulps)."""
    means, view = xs[0], xs[3]
    if not means.size:
        return 1.0
    z = means @ view[2, :3] + view[2, 3]
    terms = np.abs(means) @ np.abs(view[2, :3]) + abs(view[2, 3])
    ok = z > 0
    return float(np.max(terms[ok] / z[ok])) if ok.any() else 1.0


def _cond_sh(xs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    k = (_int(attrs, "degree") + 1) ** 2
    return 8 + k, max(_amax(xs[0][:, :k]) * 3.0, 1.0)  # every |basis| <= 3


def _cond_sh_grad(xs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    k = (_int(attrs, "degree") + 1) ** 2
    dist = np.sqrt(np.sum((xs[1] - xs[2]) ** 2, -1))
    near = float(dist.min()) if dist.size else 1.0
    # basis derivatives reach 6 x 2.9; the normalisation of the direction divides by its length
    return 12 + 3 * k, max(_amax(xs[0][:, :k]) * _amax(xs[3]) * 18.0 / max(near, 1e-3), 1.0)


def _cond_raster(xs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    return 12 + xs[0].shape[0], max(_amax(xs[2]), 1.0) * (1.0 + 6.0 * conic_condition(xs[1]))


def _cond_raster_grad(xs: Sequence[np.ndarray], attrs: Attrs) -> tuple[int, float]:
    grads = _ref_raster_grad(xs, attrs)
    return 24 + 2 * xs[0].shape[0], max(_amax(*grads), 1.0) * (1.0 + 6.0 * conic_condition(xs[1]))


_EXACTNESS: dict[str, Any] = dict(accumulates=True, accuracy="library")


# -- splat_project -----------------------------------------------------------------------------

def _infer_project(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    dt = _float("splat_project", ts)
    _image_attrs("splat_project", attrs)
    _want("splat_project", "means", ts[0], (None, 3))
    n = ts[0].shape[0]
    for what, t, shape in (("scales", ts[1], (n, 3)), ("quats", ts[2], (n, 4)),
                           ("viewmat", ts[3], (4, 4)), ("intrinsics", ts[4], (4,))):
        _want("splat_project", what, t, shape)
    return [TensorType(dt, (n, 2)), TensorType(dt, (n, 3)), TensorType(dt, (n,))]


def _rotations(q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(R [N,3,3], q_hat [N,4], |q| [N])`` of quaternions ``(w, x, y, z)``."""
    qn = np.sqrt(np.sum(q * q, axis=-1))
    with np.errstate(all="ignore"):
        w, x, y, z = np.moveaxis(q / qn[:, None], -1, 0)
    r = np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                  2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                  2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1)
    return r.reshape(-1, 3, 3), np.stack([w, x, y, z], -1), qn


def _camera(means: np.ndarray, viewmat: np.ndarray, intr: np.ndarray, attrs: Attrs) -> dict[str, Any]:
    """Everything projection and its backward share, per Gaussian (float64)."""
    w_img, h_img = _image_attrs("splat_project", attrs)
    near = attr_float(attrs, "near")
    rw, t = viewmat[:3, :3], viewmat[:3, 3]
    p = means @ rw.T + t
    x, y, z = p[:, 0], p[:, 1], p[:, 2]
    fx, fy, cx, cy = (float(v) for v in intr)
    valid = z > near
    zs = np.where(valid, z, 1.0)
    # The paper clamps x/z to 1.3 x tan(fov/2); with a principal point off centre, gsplat's
    # asymmetric limits are the same margin measured from each image edge.
    lim_xp = (w_img - cx) / fx + (FOV_MARGIN - 1) * 0.5 * w_img / fx
    lim_xn = cx / fx + (FOV_MARGIN - 1) * 0.5 * w_img / fx
    lim_yp = (h_img - cy) / fy + (FOV_MARGIN - 1) * 0.5 * h_img / fy
    lim_yn = cy / fy + (FOV_MARGIN - 1) * 0.5 * h_img / fy
    xz, yz = x / zs, y / zs
    u, v = np.clip(xz, -lim_xn, lim_xp), np.clip(yz, -lim_yn, lim_yp)
    free_u = (xz > -lim_xn) & (xz < lim_xp)
    free_v = (yz > -lim_yn) & (yz < lim_yp)
    n = means.shape[0]
    jac = np.zeros((n, 2, 3))
    jac[:, 0, 0] = fx / zs
    jac[:, 0, 2] = -fx * u / zs
    jac[:, 1, 1] = fy / zs
    jac[:, 1, 2] = -fy * v / zs
    return dict(rw=rw, x=x, y=y, z=z, zs=zs, valid=valid, fx=fx, fy=fy, cx=cx, cy=cy, u=u, v=v,
                free_u=free_u, free_v=free_v, jac=jac)


def _project_all(means: np.ndarray, scales: np.ndarray, quats: np.ndarray, viewmat: np.ndarray,
                 intr: np.ndarray, attrs: Attrs) -> dict[str, Any]:
    c = _camera(means, viewmat, intr, attrs)
    rq, qhat, qn = _rotations(quats)
    m = rq * scales[:, None, :]                       # R_q S
    sigma = m @ np.swapaxes(m, 1, 2)                  # R_q S S^T R_q^T
    tmat = c["jac"] @ c["rw"]                          # J W
    cov = tmat @ sigma @ np.swapaxes(tmat, 1, 2) + LOW_PASS * np.eye(2)
    a, b, cc = cov[:, 0, 0], cov[:, 0, 1], cov[:, 1, 1]
    det = a * cc - b * b
    valid = c["valid"] & (det > 0)
    with np.errstate(all="ignore"):
        inv = np.where(valid, 1.0 / np.where(valid, det, 1.0), 0.0)
    conic = np.stack([cc * inv, -b * inv, a * inv], -1)
    mu = np.stack([c["fx"] * c["x"] / c["zs"] + c["cx"], c["fy"] * c["y"] / c["zs"] + c["cy"]], -1)
    mu = np.where(valid[:, None], mu, 0.0)
    conic = np.where(valid[:, None], conic, 0.0)
    c.update(rq=rq, qhat=qhat, qn=qn, m=m, sigma=sigma, tmat=tmat, cov=cov, conic=conic, mu=mu,
             valid=valid)
    return c


def _ref_project(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    means, scales, quats, viewmat, intr = xs
    c = _project_all(means, scales, quats, viewmat, intr, attrs)
    return [c["mu"], c["conic"], c["z"].copy()]


def quat_backward(qhat: np.ndarray, qn: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Gradient on the raw quaternions ``[N,4]`` from the gradient ``g [N,3,3]`` on their rotations."""
    w, x, y, z = np.moveaxis(qhat, -1, 0)
    gr = g.reshape(-1, 9)
    g00, g01, g02, g10, g11, g12, g20, g21, g22 = np.moveaxis(gr, -1, 0)
    gw = 2 * (-z * g01 + y * g02 + z * g10 - x * g12 - y * g20 + x * g21)
    gx = 2 * (y * g01 + z * g02 + y * g10 - 2 * x * g11 - w * g12 + z * g20 + w * g21 - 2 * x * g22)
    gy = 2 * (-2 * y * g00 + x * g01 + w * g02 + x * g10 + z * g12 - w * g20 + z * g21 - 2 * y * g22)
    gz = 2 * (-2 * z * g00 - w * g01 + x * g02 + w * g10 - 2 * z * g11 + y * g12 + x * g20 + y * g21)
    gq = np.stack([gw, gx, gy, gz], -1)
    # through q_hat = q / |q|
    with np.errstate(all="ignore"):
        return (gq - qhat * np.sum(qhat * gq, -1, keepdims=True)) / qn[:, None]


def _ref_project_grad(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    means, scales, quats, viewmat, intr, g_mu, g_conic, g_depth = xs
    c = _project_all(means, scales, quats, viewmat, intr, attrs)
    valid = c["valid"]
    zs, fx, fy = c["zs"], c["fx"], c["fy"]
    x, y = c["x"], c["y"]
    # conic = cov^-1: dL/dcov = -Q G Q with G the symmetric gradient on Q
    vm = valid[:, None, None]
    q = np.where(vm, np.linalg.inv(np.where(vm, c["cov"], np.eye(2))), 0.0)
    gq = np.stack([g_conic[:, 0], 0.5 * g_conic[:, 1], 0.5 * g_conic[:, 1], g_conic[:, 2]], -1)
    gq = gq.reshape(-1, 2, 2)
    h = -q @ gq @ q
    tmat, sigma = c["tmat"], c["sigma"]
    g_sigma = np.swapaxes(tmat, 1, 2) @ h @ tmat
    g_t = 2.0 * h @ tmat @ sigma
    g_j = g_t @ c["rw"].T
    # the Jacobian's dependence on the camera-space position
    gx = np.zeros_like(zs)
    gy = np.zeros_like(zs)
    gz = np.zeros_like(zs)
    z2 = zs * zs
    gz += -fx / z2 * g_j[:, 0, 0] - fy / z2 * g_j[:, 1, 1]
    gz += fx * c["u"] / z2 * g_j[:, 0, 2] + fy * c["v"] / z2 * g_j[:, 1, 2]
    fu, fv = c["free_u"], c["free_v"]
    # J02 = -fx u / z with u = x / z where not clamped
    gx += np.where(fu, -fx / z2 * g_j[:, 0, 2], 0.0)
    gz += np.where(fu, fx * x / (z2 * zs) * g_j[:, 0, 2], 0.0)
    gy += np.where(fv, -fy / z2 * g_j[:, 1, 2], 0.0)
    gz += np.where(fv, fy * y / (z2 * zs) * g_j[:, 1, 2], 0.0)
    # means2d
    gx += fx / zs * g_mu[:, 0]
    gy += fy / zs * g_mu[:, 1]
    gz += -fx * x / z2 * g_mu[:, 0] - fy * y / z2 * g_mu[:, 1]
    gz += g_depth
    # a culled Gaussian's means2d and conic are constant (0); its depth is still z
    g_p = np.where(valid[:, None], np.stack([gx, gy, gz], -1),
                   np.stack([np.zeros_like(gx), np.zeros_like(gx), g_depth], -1))
    g_means = g_p @ c["rw"]
    # Sigma = M M^T, M = R_q S
    g_m = 2.0 * g_sigma @ c["m"]
    g_scales = np.sum(g_m * c["rq"], axis=1)
    g_rq = g_m * scales[:, None, :]
    g_quats = quat_backward(c["qhat"], c["qn"], g_rq)
    g_scales = np.where(valid[:, None], g_scales, 0.0)
    g_quats = np.where(valid[:, None], g_quats, 0.0)
    return [g_means, g_scales, g_quats]


_PROJECT_ATTRS = (AttrSpec("width", "int", doc="image width in pixels (>= 1)"),
                  AttrSpec("height", "int", doc="image height in pixels (>= 1)"),
                  AttrSpec("near", "float", default=0.01, doc="Gaussians with camera z <= near are culled"))


def _zeros_like(b: Any, t: Any) -> Any:
    return b.op("expand", b.const(0.0, t.dtype), shape=tuple(t.shape))


def _project_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    if all(c is None for c in cts):
        return [None] * 5
    cts = [c if c is not None else _zeros_like(b, o) for c, o in zip(cts, outs)]
    gm, gs, gq = b.op("splat_project_grad", *ins, *cts, **dict(attrs))
    return [gm, gs, gq, None, None]


def _project_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    n = ins[0].shape[0]
    return 250.0 * (n if isinstance(n, int) else 1)


register_op(OpSchema(
    "splat_project", ("means", "scales", "quats", "viewmat", "intrinsics"), _infer_project, _ref_project,
    attrs=_PROJECT_ATTRS, category="splat", dtypes=FLOATS, num_outputs=3, flops=_project_flops,
    vjp=_project_vjp, amp="f32", extra={"condition": _cond_project}, **_EXACTNESS,
    doc="3DGS projection: means [N,3], scales [N,3], quats [N,4] (w,x,y,z), viewmat [4,4] (world to "
        "camera), intrinsics [4] (fx, fy, cx, cy) -> means2d [N,2], conics [N,3] (inverse of the EWA 2-D "
        "covariance J W Sigma W^T J^T + 0.3 I), depths [N]; culled (z <= near) Gaussians get zeros"))


def _infer_project_grad(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    fwd = _infer_project(ts[:5], attrs)
    _float("splat_project_grad", ts)
    for what, t, want in zip(("grad_means2d", "grad_conics", "grad_depths"), ts[5:], fwd):
        _want("splat_project_grad", what, t, tuple(want.shape))
    return [ts[0], ts[1], ts[2]]


register_op(OpSchema(
    "splat_project_grad", ("means", "scales", "quats", "viewmat", "intrinsics", "grad_means2d",
                           "grad_conics", "grad_depths"), _infer_project_grad, _ref_project_grad,
    attrs=_PROJECT_ATTRS, category="splat", dtypes=FLOATS, num_outputs=3, flops=_project_flops,
    differentiable=False, amp="f32", extra={"condition": _cond_project_grad}, **_EXACTNESS,
    doc="backward of splat_project: the gradients on means, scales and quats"))


# -- splat_sh_color ----------------------------------------------------------------------------

def _sh_dims(op: str, ts: Sequence[TensorType], attrs: Attrs) -> None:
    deg = _int(attrs, "degree")
    _want(op, "sh", ts[0], (None, None, None))
    n = ts[0].shape[0]
    _want(op, "means", ts[1], (n, 3))
    _want(op, "campos", ts[2], (3,))
    k = ts[0].shape[1]
    if isinstance(k, int) and k < (deg + 1) ** 2:
        raise ShapeError(f"{op}: degree {deg} needs {(deg + 1) ** 2} coefficients, sh has {k} "
                         f"({ts[0].shape})",
                         fix="pass sh as [N, (degree+1)^2, C] or lower the degree")


def _infer_sh(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    dt = _float("splat_sh_color", ts)
    _sh_dims("splat_sh_color", ts, attrs)
    return [TensorType(dt, (ts[0].shape[0], ts[0].shape[2]))]


def sh_basis(d: np.ndarray, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """The real SH basis ``B [N, K]`` at unit directions ``d [N,3]`` and its derivative
    ``dB/dd [N, K, 3]``, ``K = (degree + 1)^2``, with the paper's constants and signs."""
    x, y, z = d[:, 0], d[:, 1], d[:, 2]
    one, zero = np.ones_like(x), np.zeros_like(x)
    basis = [SH_C0 * one]
    grad = [(zero, zero, zero)]
    if degree > 0:
        c1 = SH_C1
        basis += [-c1 * y, c1 * z, -c1 * x]
        grad += [(zero, -c1 * one, zero), (zero, zero, c1 * one), (-c1 * one, zero, zero)]
    if degree > 1:
        c: tuple[float, ...] = SH_C2
        xx, yy, zz = x * x, y * y, z * z
        basis += [c[0] * x * y, c[1] * y * z, c[2] * (2 * zz - xx - yy), c[3] * x * z, c[4] * (xx - yy)]
        grad += [(c[0] * y, c[0] * x, zero), (zero, c[1] * z, c[1] * y),
                 (-2 * c[2] * x, -2 * c[2] * y, 4 * c[2] * z), (c[3] * z, zero, c[3] * x),
                 (2 * c[4] * x, -2 * c[4] * y, zero)]
    if degree > 2:
        c = SH_C3
        xx, yy, zz = x * x, y * y, z * z
        basis += [c[0] * y * (3 * xx - yy), c[1] * x * y * z, c[2] * y * (4 * zz - xx - yy),
                  c[3] * z * (2 * zz - 3 * xx - 3 * yy), c[4] * x * (4 * zz - xx - yy),
                  c[5] * z * (xx - yy), c[6] * x * (xx - 3 * yy)]
        grad += [(6 * c[0] * x * y, c[0] * (3 * xx - 3 * yy), zero),
                 (c[1] * y * z, c[1] * x * z, c[1] * x * y),
                 (-2 * c[2] * x * y, c[2] * (4 * zz - xx - 3 * yy), 8 * c[2] * y * z),
                 (-6 * c[3] * x * z, -6 * c[3] * y * z, c[3] * (6 * zz - 3 * xx - 3 * yy)),
                 (c[4] * (4 * zz - 3 * xx - yy), -2 * c[4] * x * y, 8 * c[4] * x * z),
                 (2 * c[5] * x * z, -2 * c[5] * y * z, c[5] * (xx - yy)),
                 (c[6] * (3 * xx - 3 * yy), -6 * c[6] * x * y, zero)]
    return np.stack(basis, -1), np.stack([np.stack(g, -1) for g in grad], 1)


def _sh_all(sh: np.ndarray, means: np.ndarray, campos: np.ndarray, attrs: Attrs) -> dict[str, Any]:
    deg = _int(attrs, "degree")
    k = (deg + 1) ** 2
    dvec = means - campos
    dn = np.sqrt(np.sum(dvec * dvec, -1))
    with np.errstate(all="ignore"):
        d = dvec / dn[:, None]
    basis, dbasis = sh_basis(d, deg)
    raw = np.einsum("nk,nkc->nc", basis, sh[:, :k]) + 0.5
    return dict(k=k, d=d, dn=dn, basis=basis, dbasis=dbasis, raw=raw)


def _ref_sh(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    c = _sh_all(xs[0], xs[1], xs[2], attrs)
    return [np.maximum(c["raw"], 0.0)]


def _ref_sh_grad(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    sh, means, campos, g = xs
    c = _sh_all(sh, means, campos, attrs)
    g = np.where(c["raw"] > 0, g, 0.0)  # the clamp at 0 passes no gradient
    k = c["k"]
    g_sh = np.zeros_like(sh)
    g_sh[:, :k] = c["basis"][:, :, None] * g[:, None, :]
    g_d = np.einsum("nkj,nkc,nc->nj", c["dbasis"], sh[:, :k], g)
    d, dn = c["d"], c["dn"]
    with np.errstate(all="ignore"):
        g_means = (g_d - d * np.sum(d * g_d, -1, keepdims=True)) / dn[:, None]
    return [g_sh, g_means]


_SH_ATTRS = (AttrSpec("degree", "int", default=3, choices=(0, 1, 2, 3), doc="SH degree, 0 to 3"),)


def _sh_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    if cts[0] is None:
        return [None, None, None]
    g_sh, g_means = b.op("splat_sh_color_grad", *ins, cts[0], **dict(attrs))
    return [g_sh, g_means, None]


def _sh_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    return float(ins[0].numel()) * 2 + 60.0 * outs[0].numel()


register_op(OpSchema(
    "splat_sh_color", ("sh", "means", "campos"), _infer_sh, _ref_sh, attrs=_SH_ATTRS, category="splat",
    dtypes=FLOATS, flops=_sh_flops, vjp=_sh_vjp, amp="f32", extra={"condition": _cond_sh}, **_EXACTNESS,
    doc="3DGS view-dependent colour: sh [N,K,C] coefficients, means [N,3], camera centre campos [3] -> "
        "colors [N,C] = max(SH_degree(dir) . sh + 0.5, 0), dir the unit vector from campos to the mean"))


def _infer_sh_grad(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _float("splat_sh_color_grad", ts)
    (out,) = _infer_sh(ts[:3], attrs)
    _want("splat_sh_color_grad", "grad_colors", ts[3], tuple(out.shape))
    return [ts[0], ts[1]]


register_op(OpSchema(
    "splat_sh_color_grad", ("sh", "means", "campos", "grad_colors"), _infer_sh_grad, _ref_sh_grad,
    attrs=_SH_ATTRS, category="splat", dtypes=FLOATS, num_outputs=2, flops=_sh_flops,
    differentiable=False, amp="f32", extra={"condition": _cond_sh_grad}, **_EXACTNESS,
    doc="backward of splat_sh_color: the gradients on sh and means"))


# -- splat_rasterize ---------------------------------------------------------------------------

_RASTER_ATTRS = (AttrSpec("width", "int", doc="image width in pixels (>= 1)"),
                 AttrSpec("height", "int", doc="image height in pixels (>= 1)"),
                 AttrSpec("tile_size", "int", default=16, doc="tile edge in pixels (>= 1)"))


def _raster_dims(op: str, ts: Sequence[TensorType], attrs: Attrs) -> tuple[int, int, Any]:
    w, h = _image_attrs(op, attrs)
    if _int(attrs, "tile_size") < 1:
        raise ShapeError(f"{op}: tile_size {attrs['tile_size']} < 1", fix="tile_size is >= 1 (16 is usual)")
    _want(op, "means2d", ts[0], (None, 2))
    n = ts[0].shape[0]
    _want(op, "conics", ts[1], (n, 3))
    _want(op, "colors", ts[2], (n, None))
    _want(op, "opacities", ts[3], (n,))
    _want(op, "depths", ts[4], (n,))
    return w, h, ts[2].shape[1]


def _infer_raster(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    dt = _float("splat_rasterize", ts)
    w, h, c = _raster_dims("splat_rasterize", ts, attrs)
    return [TensorType(dt, (h, w, c)), TensorType(dt, (h, w))]


def tile_ranges(means2d: np.ndarray, conics: np.ndarray, width: int, height: int, tile: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per Gaussian, the inclusive tile box ``[tx0, ty0, tx1, ty1]`` (``int64 [N,4]``) its
    3-sigma box touches, and whether it is drawn at all (a positive-definite conic, a box that
    meets the image)."""
    a, b, c = conics[:, 0], conics[:, 1], conics[:, 2]
    det = a * c - b * b
    ok = det > 0
    with np.errstate(all="ignore"):
        inv = np.where(ok, 1.0 / np.where(ok, det, 1.0), 0.0)
        s11, s12, s22 = c * inv, -b * inv, a * inv
        mid = 0.5 * (s11 + s22)
        lam = mid + np.sqrt(np.maximum(0.1, mid * mid - (s11 * s22 - s12 * s12)))
        r = np.ceil(3.0 * np.sqrt(lam))
        ok &= np.isfinite(r) & np.isfinite(means2d).all(-1)
        r = np.where(ok, r, 0.0)
        mx, my = np.where(ok, means2d[:, 0], 0.0), np.where(ok, means2d[:, 1], 0.0)
        tx0 = np.floor((mx - r) / tile)
        tx1 = np.floor((mx + r) / tile)
        ty0 = np.floor((my - r) / tile)
        ty1 = np.floor((my + r) / tile)
    ntx, nty = -(-width // tile), -(-height // tile)
    box = np.stack([np.clip(tx0, 0, ntx - 1), np.clip(ty0, 0, nty - 1),
                    np.clip(tx1, 0, ntx - 1), np.clip(ty1, 0, nty - 1)], -1).astype(np.int64)
    ok &= (tx1 >= 0) & (ty1 >= 0) & (tx0 <= ntx - 1) & (ty0 <= nty - 1) & (r > 0)
    return box, ok


def _raster_dense(xs: Sequence[np.ndarray], attrs: Attrs) -> dict[str, Any]:
    """The rasterizer on every (pixel, Gaussian) pair at once, in depth order (small scenes)."""
    means2d, conics, colors, opac, depths = xs
    w, h = _int(attrs, "width"), _int(attrs, "height")
    tile = _int(attrs, "tile_size")
    box, ok = tile_ranges(means2d, conics, w, h, tile)
    order = np.argsort(depths, kind="stable")
    grid_y, grid_x = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    px, py = grid_x.reshape(-1), grid_y.reshape(-1)
    tx, ty = px // tile, py // tile
    bx = box[order]
    binned = (ok[order][None, :] & (tx[:, None] >= bx[None, :, 0]) & (tx[:, None] <= bx[None, :, 2])
              & (ty[:, None] >= bx[None, :, 1]) & (ty[:, None] <= bx[None, :, 3]))
    m, q = means2d[order], conics[order]
    dx = m[None, :, 0] - (px[:, None] + 0.5)
    dy = m[None, :, 1] - (py[:, None] + 0.5)
    power = -0.5 * (q[None, :, 0] * dx * dx + q[None, :, 2] * dy * dy) - q[None, :, 1] * dx * dy
    with np.errstate(all="ignore"):
        g = np.exp(power)
        raw = opac[order][None, :] * g
    alpha = np.minimum(ALPHA_MAX, raw)
    use = binned & (power <= 0) & (alpha >= ALPHA_MIN)
    a = np.where(use, alpha, 0.0)
    t_after = np.cumprod(1.0 - a, axis=1)
    incl = use & (t_after >= T_MIN)  # T only falls, so the drawn Gaussians are a prefix
    a = np.where(incl, a, 0.0)
    t_after = np.cumprod(1.0 - a, axis=1)
    t_before = np.concatenate([np.ones((a.shape[0], 1)), t_after[:, :-1]], axis=1)
    wgt = a * t_before
    col = colors[order]
    image = wgt @ col
    t_final = t_after[:, -1] if a.shape[1] else np.ones(a.shape[0])
    return dict(order=order, dx=dx, dy=dy, g=g, raw=raw, a=a, incl=incl, t_before=t_before,
                t_final=t_final, wgt=wgt, col=col, q=q, image=image.reshape(h, w, -1),
                alpha=(1.0 - t_final).reshape(h, w), opac=opac[order])


def _ref_raster(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    r = _raster_dense(xs, attrs)
    return [r["image"], r["alpha"]]


def _ref_raster_grad(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    means2d, conics, colors, opac, depths, g_img, g_alpha = xs
    r = _raster_dense(xs[:5], attrs)
    nc = colors.shape[1]
    gi = g_img.reshape(-1, nc)
    ga = g_alpha.reshape(-1)
    a, tb, incl, col = r["a"], r["t_before"], r["incl"], r["col"]
    g_col_sorted = r["wgt"].T @ gi                                    # sum_p a T g
    contrib = r["wgt"][:, :, None] * col[None, :, :]                  # [P, N, C]
    behind = np.cumsum(contrib[:, ::-1], axis=1)[:, ::-1] - contrib   # sum over j > i
    with np.errstate(all="ignore"):
        inv1 = 1.0 / (1.0 - a)
    g_a = tb * np.einsum("nc,pc->pn", col, gi)
    g_a = g_a - np.einsum("pnc,pc->pn", behind, gi) * inv1 + ga[:, None] * r["t_final"][:, None] * inv1
    g_a = np.where(incl, g_a, 0.0)
    free = incl & (r["raw"] < ALPHA_MAX)  # a clamped alpha has no derivative
    g_a = np.where(free, g_a, 0.0)
    g_op_sorted = np.sum(g_a * r["g"], axis=0)
    g_pow = g_a * r["opac"][None, :] * r["g"]
    q, dx, dy = r["q"], r["dx"], r["dy"]
    g_mx = np.sum(g_pow * -(q[None, :, 0] * dx + q[None, :, 1] * dy), axis=0)
    g_my = np.sum(g_pow * -(q[None, :, 2] * dy + q[None, :, 1] * dx), axis=0)
    g_qa = np.sum(g_pow * (-0.5 * dx * dx), axis=0)
    g_qb = np.sum(g_pow * (-dx * dy), axis=0)
    g_qc = np.sum(g_pow * (-0.5 * dy * dy), axis=0)
    inv = np.empty_like(r["order"])
    inv[r["order"]] = np.arange(r["order"].size)
    return [np.stack([g_mx, g_my], -1)[inv], np.stack([g_qa, g_qb, g_qc], -1)[inv], g_col_sorted[inv],
            g_op_sorted[inv]]


def _raster_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    if all(c is None for c in cts):
        return [None] * 5
    cts = [c if c is not None else _zeros_like(b, o) for c, o in zip(cts, outs)]
    gm, gq, gc, go = b.op("splat_rasterize_grad", *ins, *cts, **dict(attrs))
    return [gm, gq, gc, go, None]


def _raster_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> float:
    """A rough count: each pixel meets on the order of a hundred Gaussians in a real scene."""
    w, h = _int(attrs, "width"), _int(attrs, "height")
    n = ins[0].shape[0]
    n = n if isinstance(n, int) else 1
    return 20.0 * w * h * min(max(n, 1), 100) + 50.0 * n * math.log2(max(n, 2))


register_op(OpSchema(
    "splat_rasterize", ("means2d", "conics", "colors", "opacities", "depths"), _infer_raster, _ref_raster,
    attrs=_RASTER_ATTRS, category="splat", dtypes=FLOATS, num_outputs=2, flops=_raster_flops,
    vjp=_raster_vjp, amp="f32", extra={"condition": _cond_raster}, **_EXACTNESS,
    doc="3DGS tile rasterizer: means2d [N,2], conics [N,3], colors [N,C], opacities [N], depths [N] -> "
        "image [H,W,C], alpha [H,W]; binning and the depth sort happen inside (static shapes), "
        "front-to-back compositing with alpha = min(0.99, o exp(power)) >= 1/255 and T >= 1e-4"))


def _infer_raster_grad(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    _float("splat_rasterize_grad", ts)
    img, alpha = _infer_raster(ts[:5], attrs)
    _want("splat_rasterize_grad", "grad_image", ts[5], tuple(img.shape))
    _want("splat_rasterize_grad", "grad_alpha", ts[6], tuple(alpha.shape))
    return [ts[0], ts[1], ts[2], ts[3]]


register_op(OpSchema(
    "splat_rasterize_grad", ("means2d", "conics", "colors", "opacities", "depths", "grad_image",
                             "grad_alpha"), _infer_raster_grad, _ref_raster_grad,
    attrs=_RASTER_ATTRS, category="splat", dtypes=FLOATS, num_outputs=4,
    flops=lambda i, o, a: 2.5 * _raster_flops(i, o, a), differentiable=False, amp="f32",
    extra={"condition": _cond_raster_grad}, **_EXACTNESS,
    doc="backward of splat_rasterize: the gradients on means2d, conics, colors and opacities"))


SPLAT_OPS = ("splat_project", "splat_project_grad", "splat_sh_color", "splat_sh_color_grad",
             "splat_rasterize", "splat_rasterize_grad")

__all__ = ["ALPHA_MAX", "ALPHA_MIN", "FOV_MARGIN", "LOW_PASS", "SH_C0", "SH_C1", "SH_C2", "SH_C3",
           "SPLAT_OPS", "T_MIN", "quat_backward", "sh_basis", "tile_ranges"]
