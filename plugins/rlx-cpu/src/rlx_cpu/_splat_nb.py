"""Numba kernels of the 3D Gaussian splatting ops (see :mod:`rlx_cpu.splat`), compiled on first use
and cached next to this file (or in NUMBA_CACHE_DIR).

Every kernel computes in float64 whatever the storage dtype, so an f32 result is the float64
result rounded once: the same decisions (culling, thresholds, the transmittance stop) as the
float64 reference, which the conformance suite holds these kernels to.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

LOW_PASS = 0.3
ALPHA_MAX = 0.99
ALPHA_MIN = 1.0 / 255.0
T_MIN = 1e-4
FOV_MARGIN = 1.3
C0 = 0.28209479177387814
C1 = 0.4886025119029199
C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792, 0.5462742152960396)
C3 = (-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
      -0.4570457994644658, 1.445305721320277, -0.5900435899266435)


# -- projection --------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _rotation(q, i, rot):
    """The rotation of quaternion ``q[i]`` (w, x, y, z) normalised, into ``rot`` (3x3); returns
    (w, x, y, z, |q|)."""
    w, x, y, z = float(q[i, 0]), float(q[i, 1]), float(q[i, 2]), float(q[i, 3])
    n = math.sqrt(w * w + x * x + y * y + z * z)
    w, x, y, z = w / n, x / n, y / n, z / n
    rot[0, 0] = 1 - 2 * (y * y + z * z)
    rot[0, 1] = 2 * (x * y - w * z)
    rot[0, 2] = 2 * (x * z + w * y)
    rot[1, 0] = 2 * (x * y + w * z)
    rot[1, 1] = 1 - 2 * (x * x + z * z)
    rot[1, 2] = 2 * (y * z - w * x)
    rot[2, 0] = 2 * (x * z - w * y)
    rot[2, 1] = 2 * (y * z + w * x)
    rot[2, 2] = 1 - 2 * (x * x + y * y)
    return w, x, y, z, n


@njit(cache=True, nogil=True)
def _limits(width, height, fx, fy, cx, cy):
    mx = (FOV_MARGIN - 1) * 0.5 * width / fx
    my = (FOV_MARGIN - 1) * 0.5 * height / fy
    return (width - cx) / fx + mx, cx / fx + mx, (height - cy) / fy + my, cy / fy + my


@njit(cache=True, nogil=True)
def _forward_one(means, scales, quats, view, i, fx, fy, lims, rot, m, sigma, tm, cov):
    """Camera point, Jacobian terms and the 2-D covariance of Gaussian ``i`` (into the scratch
    arrays); returns (x, y, z, u, v, free_u, free_v)."""
    p = np.empty(3)
    for r in range(3):
        p[r] = (view[r, 0] * float(means[i, 0]) + view[r, 1] * float(means[i, 1])
                + view[r, 2] * float(means[i, 2]) + view[r, 3])
    x, y, z = p[0], p[1], p[2]
    _rotation(quats, i, rot)
    for r in range(3):
        for c in range(3):
            m[r, c] = rot[r, c] * float(scales[i, c])
    for r in range(3):
        for c in range(3):
            s = 0.0
            for k in range(3):
                s += m[r, k] * m[c, k]
            sigma[r, c] = s
    lxp, lxn, lyp, lyn = lims
    xz, yz = x / z, y / z
    u = min(max(xz, -lxn), lxp)
    v = min(max(yz, -lyn), lyp)
    j00, j02, j11, j12 = fx / z, -fx * u / z, fy / z, -fy * v / z
    for k in range(3):
        tm[0, k] = j00 * view[0, k] + j02 * view[2, k]
        tm[1, k] = j11 * view[1, k] + j12 * view[2, k]
    for a in range(2):
        for b in range(2):
            s = 0.0
            for k in range(3):
                t = 0.0
                for l in range(3):
                    t += sigma[k, l] * tm[b, l]
                s += tm[a, k] * t
            cov[a, b] = s
    cov[0, 0] += LOW_PASS
    cov[1, 1] += LOW_PASS
    return x, y, z, u, v, (xz > -lxn) and (xz < lxp), (yz > -lyn) and (yz < lyp)


@njit(cache=True, nogil=True, parallel=True)
def project_fwd(means, scales, quats, view64, intr, width, height, near, mu, conic, depth):
    fx, fy, cx, cy = float(intr[0]), float(intr[1]), float(intr[2]), float(intr[3])
    lims = _limits(width, height, fx, fy, cx, cy)
    for i in prange(means.shape[0]):
        rot, m, sigma = np.empty((3, 3)), np.empty((3, 3)), np.empty((3, 3))
        tm, cov = np.empty((2, 3)), np.empty((2, 2))
        z = (view64[2, 0] * float(means[i, 0]) + view64[2, 1] * float(means[i, 1])
             + view64[2, 2] * float(means[i, 2]) + view64[2, 3])
        depth[i] = z
        mu[i, 0] = mu[i, 1] = 0.0
        conic[i, 0] = conic[i, 1] = conic[i, 2] = 0.0
        if not z > near:
            continue
        x, y, z, u, v, fu, fv = _forward_one(means, scales, quats, view64, i, fx, fy, lims, rot, m, sigma,
                                             tm, cov)
        a, b, c = cov[0, 0], cov[0, 1], cov[1, 1]
        det = a * c - b * b
        if not det > 0:
            continue
        conic[i, 0] = c / det
        conic[i, 1] = -b / det
        conic[i, 2] = a / det
        mu[i, 0] = fx * x / z + cx
        mu[i, 1] = fy * y / z + cy


@njit(cache=True, nogil=True, parallel=True)
def project_bwd(means, scales, quats, view64, intr, width, height, near, g_mu, g_conic, g_depth,
                g_means, g_scales, g_quats):
    fx, fy, cx, cy = float(intr[0]), float(intr[1]), float(intr[2]), float(intr[3])
    lims = _limits(width, height, fx, fy, cx, cy)
    for i in prange(means.shape[0]):
        rot, m, sigma = np.empty((3, 3)), np.empty((3, 3)), np.empty((3, 3))
        tm, cov = np.empty((2, 3)), np.empty((2, 2))
        gd = float(g_depth[i])
        for k in range(3):
            g_scales[i, k] = 0.0
        for k in range(4):
            g_quats[i, k] = 0.0
        z0 = (view64[2, 0] * float(means[i, 0]) + view64[2, 1] * float(means[i, 1])
              + view64[2, 2] * float(means[i, 2]) + view64[2, 3])
        gp = np.zeros(3)
        gp[2] = gd
        ok = z0 > near
        if ok:
            x, y, z, u, v, fu, fv = _forward_one(means, scales, quats, view64, i, fx, fy, lims, rot, m,
                                                 sigma, tm, cov)
            a, b, c = cov[0, 0], cov[0, 1], cov[1, 1]
            det = a * c - b * b
            ok = det > 0
        if ok:
            # conic = cov^-1: dL/dcov = -Q G Q (G the symmetric gradient on Q)
            q00, q01, q11 = c / det, -b / det, a / det
            ga, gb, gc = float(g_conic[i, 0]), 0.5 * float(g_conic[i, 1]), float(g_conic[i, 2])
            # Q G
            p00 = q00 * ga + q01 * gb
            p01 = q00 * gb + q01 * gc
            p10 = q01 * ga + q11 * gb
            p11 = q01 * gb + q11 * gc
            h00 = -(p00 * q00 + p01 * q01)
            h01 = -(p00 * q01 + p01 * q11)
            h10 = -(p10 * q00 + p11 * q01)
            h11 = -(p10 * q01 + p11 * q11)
            # g_sigma = T^T H T ; g_T = 2 H T Sigma ; g_J = g_T W^T
            gsig = np.empty((3, 3))
            for r in range(3):
                for cc in range(3):
                    gsig[r, cc] = (tm[0, r] * (h00 * tm[0, cc] + h01 * tm[1, cc])
                                   + tm[1, r] * (h10 * tm[0, cc] + h11 * tm[1, cc]))
            gt = np.empty((2, 3))
            for r in range(2):
                hr0 = h00 if r == 0 else h10
                hr1 = h01 if r == 0 else h11
                for cc in range(3):
                    s = 0.0
                    for k in range(3):
                        s += (hr0 * tm[0, k] + hr1 * tm[1, k]) * sigma[k, cc]
                    gt[r, cc] = 2.0 * s
            gj00 = gt[0, 0] * view64[0, 0] + gt[0, 1] * view64[0, 1] + gt[0, 2] * view64[0, 2]
            gj02 = gt[0, 0] * view64[2, 0] + gt[0, 1] * view64[2, 1] + gt[0, 2] * view64[2, 2]
            gj11 = gt[1, 0] * view64[1, 0] + gt[1, 1] * view64[1, 1] + gt[1, 2] * view64[1, 2]
            gj12 = gt[1, 0] * view64[2, 0] + gt[1, 1] * view64[2, 1] + gt[1, 2] * view64[2, 2]
            z2 = z * z
            gx = 0.0
            gy = 0.0
            gz = -fx / z2 * gj00 - fy / z2 * gj11 + fx * u / z2 * gj02 + fy * v / z2 * gj12
            if fu:
                gx += -fx / z2 * gj02
                gz += fx * x / (z2 * z) * gj02
            if fv:
                gy += -fy / z2 * gj12
                gz += fy * y / (z2 * z) * gj12
            gmx, gmy = float(g_mu[i, 0]), float(g_mu[i, 1])
            gx += fx / z * gmx
            gy += fy / z * gmy
            gz += -fx * x / z2 * gmx - fy * y / z2 * gmy
            gp[0] = gx
            gp[1] = gy
            gp[2] = gz + gd
            # Sigma = M M^T, M = R S
            grot = np.empty((3, 3))
            for r in range(3):
                for cc in range(3):
                    s = 0.0
                    for k in range(3):
                        s += gsig[r, k] * m[k, cc]
                    gm = 2.0 * s
                    g_scales[i, cc] += gm * rot[r, cc]
                    grot[r, cc] = gm * float(scales[i, cc])
            w, qx, qy, qz, qn = _rotation(quats, i, rot)
            gw = 2 * (-qz * grot[0, 1] + qy * grot[0, 2] + qz * grot[1, 0] - qx * grot[1, 2]
                      - qy * grot[2, 0] + qx * grot[2, 1])
            gqx = 2 * (qy * grot[0, 1] + qz * grot[0, 2] + qy * grot[1, 0] - 2 * qx * grot[1, 1]
                       - w * grot[1, 2] + qz * grot[2, 0] + w * grot[2, 1] - 2 * qx * grot[2, 2])
            gqy = 2 * (-2 * qy * grot[0, 0] + qx * grot[0, 1] + w * grot[0, 2] + qx * grot[1, 0]
                       + qz * grot[1, 2] - w * grot[2, 0] + qz * grot[2, 1] - 2 * qy * grot[2, 2])
            gqz = 2 * (-2 * qz * grot[0, 0] - w * grot[0, 1] + qx * grot[0, 2] + w * grot[1, 0]
                       - 2 * qz * grot[1, 1] + qy * grot[1, 2] + qx * grot[2, 0] + qy * grot[2, 1])
            dot = w * gw + qx * gqx + qy * gqy + qz * gqz
            g_quats[i, 0] = (gw - w * dot) / qn
            g_quats[i, 1] = (gqx - qx * dot) / qn
            g_quats[i, 2] = (gqy - qy * dot) / qn
            g_quats[i, 3] = (gqz - qz * dot) / qn
        for k in range(3):
            g_means[i, k] = gp[0] * view64[0, k] + gp[1] * view64[1, k] + gp[2] * view64[2, k]


# -- spherical harmonics -----------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _sh_basis(x, y, z, degree, bs, db):
    """Basis values ``bs[k]`` and derivatives ``db[k, 0:3]`` at the unit direction (x, y, z)."""
    for k in range(16):
        bs[k] = 0.0
        db[k, 0] = db[k, 1] = db[k, 2] = 0.0
    bs[0] = C0
    if degree > 0:
        bs[1], bs[2], bs[3] = -C1 * y, C1 * z, -C1 * x
        db[1, 1], db[2, 2], db[3, 0] = -C1, C1, -C1
    if degree > 1:
        xx, yy, zz = x * x, y * y, z * z
        bs[4] = C2[0] * x * y
        bs[5] = C2[1] * y * z
        bs[6] = C2[2] * (2 * zz - xx - yy)
        bs[7] = C2[3] * x * z
        bs[8] = C2[4] * (xx - yy)
        db[4, 0], db[4, 1] = C2[0] * y, C2[0] * x
        db[5, 1], db[5, 2] = C2[1] * z, C2[1] * y
        db[6, 0], db[6, 1], db[6, 2] = -2 * C2[2] * x, -2 * C2[2] * y, 4 * C2[2] * z
        db[7, 0], db[7, 2] = C2[3] * z, C2[3] * x
        db[8, 0], db[8, 1] = 2 * C2[4] * x, -2 * C2[4] * y
    if degree > 2:
        xx, yy, zz = x * x, y * y, z * z
        bs[9] = C3[0] * y * (3 * xx - yy)
        bs[10] = C3[1] * x * y * z
        bs[11] = C3[2] * y * (4 * zz - xx - yy)
        bs[12] = C3[3] * z * (2 * zz - 3 * xx - 3 * yy)
        bs[13] = C3[4] * x * (4 * zz - xx - yy)
        bs[14] = C3[5] * z * (xx - yy)
        bs[15] = C3[6] * x * (xx - 3 * yy)
        db[9, 0], db[9, 1] = 6 * C3[0] * x * y, C3[0] * (3 * xx - 3 * yy)
        db[10, 0], db[10, 1], db[10, 2] = C3[1] * y * z, C3[1] * x * z, C3[1] * x * y
        db[11, 0], db[11, 1] = -2 * C3[2] * x * y, C3[2] * (4 * zz - xx - 3 * yy)
        db[11, 2] = 8 * C3[2] * y * z
        db[12, 0], db[12, 1] = -6 * C3[3] * x * z, -6 * C3[3] * y * z
        db[12, 2] = C3[3] * (6 * zz - 3 * xx - 3 * yy)
        db[13, 0], db[13, 1] = C3[4] * (4 * zz - 3 * xx - yy), -2 * C3[4] * x * y
        db[13, 2] = 8 * C3[4] * x * z
        db[14, 0], db[14, 1], db[14, 2] = 2 * C3[5] * x * z, -2 * C3[5] * y * z, C3[5] * (xx - yy)
        db[15, 0], db[15, 1] = C3[6] * (3 * xx - 3 * yy), -6 * C3[6] * x * y


@njit(cache=True, nogil=True, parallel=True)
def sh_fwd(sh, means, campos, degree, colors):
    nb = (degree + 1) ** 2
    for i in prange(sh.shape[0]):
        bs, db = np.empty(16), np.empty((16, 3))
        dx = float(means[i, 0]) - float(campos[0])
        dy = float(means[i, 1]) - float(campos[1])
        dz = float(means[i, 2]) - float(campos[2])
        n = math.sqrt(dx * dx + dy * dy + dz * dz)
        _sh_basis(dx / n, dy / n, dz / n, degree, bs, db)
        for c in range(sh.shape[2]):
            s = 0.0
            for k in range(nb):
                s += bs[k] * float(sh[i, k, c])
            colors[i, c] = max(s + 0.5, 0.0)


@njit(cache=True, nogil=True, parallel=True)
def sh_bwd(sh, means, campos, degree, g_colors, g_sh, g_means):
    nb = (degree + 1) ** 2
    for i in prange(sh.shape[0]):
        bs, db = np.empty(16), np.empty((16, 3))
        dx = float(means[i, 0]) - float(campos[0])
        dy = float(means[i, 1]) - float(campos[1])
        dz = float(means[i, 2]) - float(campos[2])
        n = math.sqrt(dx * dx + dy * dy + dz * dz)
        x, y, z = dx / n, dy / n, dz / n
        _sh_basis(x, y, z, degree, bs, db)
        gdx = gdy = gdz = 0.0
        for k in range(sh.shape[1]):
            for c in range(sh.shape[2]):
                g_sh[i, k, c] = 0.0
        for c in range(sh.shape[2]):
            s = 0.0
            for k in range(nb):
                s += bs[k] * float(sh[i, k, c])
            if not s + 0.5 > 0.0:  # clamped at 0: no gradient
                continue
            g = float(g_colors[i, c])
            for k in range(nb):
                g_sh[i, k, c] = bs[k] * g
                v = float(sh[i, k, c]) * g
                gdx += db[k, 0] * v
                gdy += db[k, 1] * v
                gdz += db[k, 2] * v
        dot = x * gdx + y * gdy + z * gdz
        g_means[i, 0] = (gdx - x * dot) / n
        g_means[i, 1] = (gdy - y * dot) / n
        g_means[i, 2] = (gdz - z * dot) / n


# -- rasterization -----------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def bin_tiles(means2d, conics, depths, width, height, tile):
    """Depth-sorted per-tile lists: ``(offsets [tiles + 1], ids [intersections])``; tile ``t``'s
    Gaussians are ``ids[offsets[t]:offsets[t+1]]``, nearest first (equal depths by index)."""
    n = means2d.shape[0]
    ntx = (width + tile - 1) // tile
    nty = (height + tile - 1) // tile
    box = np.full((n, 4), -1, np.int64)
    for i in range(n):
        a, b, c = float(conics[i, 0]), float(conics[i, 1]), float(conics[i, 2])
        det = a * c - b * b
        if not det > 0:
            continue
        s11, s12, s22 = c / det, -b / det, a / det
        mid = 0.5 * (s11 + s22)
        lam = mid + math.sqrt(max(0.1, mid * mid - (s11 * s22 - s12 * s12)))
        r = math.ceil(3.0 * math.sqrt(lam))
        mx, my = float(means2d[i, 0]), float(means2d[i, 1])
        if not (math.isfinite(r) and math.isfinite(mx) and math.isfinite(my)) or r <= 0:
            continue
        tx0 = math.floor((mx - r) / tile)
        tx1 = math.floor((mx + r) / tile)
        ty0 = math.floor((my - r) / tile)
        ty1 = math.floor((my + r) / tile)
        if tx1 < 0 or ty1 < 0 or tx0 > ntx - 1 or ty0 > nty - 1:
            continue
        box[i, 0] = max(tx0, 0)
        box[i, 1] = max(ty0, 0)
        box[i, 2] = min(tx1, ntx - 1)
        box[i, 3] = min(ty1, nty - 1)
    order = np.argsort(depths.astype(np.float64), kind="mergesort")
    counts = np.zeros(ntx * nty + 1, np.int64)
    for i in range(n):
        if box[i, 0] < 0:
            continue
        for ty in range(box[i, 1], box[i, 3] + 1):
            for tx in range(box[i, 0], box[i, 2] + 1):
                counts[ty * ntx + tx + 1] += 1
    offsets = np.cumsum(counts)
    ids = np.empty(offsets[-1], np.int64)
    fill = offsets[:-1].copy()
    for j in range(n):
        i = order[j]
        if box[i, 0] < 0:
            continue
        for ty in range(box[i, 1], box[i, 3] + 1):
            for tx in range(box[i, 0], box[i, 2] + 1):
                t = ty * ntx + tx
                ids[fill[t]] = i
                fill[t] += 1
    return offsets, ids


@njit(inline="always", nogil=True)
def _alpha_at(means2d, conics, opac, g, pxf, pyf):
    """Gaussian ``g``'s alpha at the pixel centre (pxf, pyf); 0.0 where it draws nothing there (the
    conic's power is positive, or the alpha is under ALPHA_MIN, which is > 0)."""
    dx = float(means2d[g, 0]) - pxf
    dy = float(means2d[g, 1]) - pyf
    power = (-0.5 * (float(conics[g, 0]) * dx * dx + float(conics[g, 2]) * dy * dy)
             - float(conics[g, 1]) * dx * dy)
    if power > 0.0:
        return 0.0
    a = min(ALPHA_MAX, float(opac[g]) * math.exp(power))
    return a if a >= ALPHA_MIN else 0.0


@njit(cache=True, nogil=True, parallel=True)
def raster_fwd(means2d, conics, colors, opac, depths, width, height, tile, image, alpha):
    offsets, ids = bin_tiles(means2d, conics, depths, width, height, tile)
    ntx = (width + tile - 1) // tile
    nty = (height + tile - 1) // tile
    nc = colors.shape[1]
    for t in prange(ntx * nty):
        tx, ty = t % ntx, t // ntx
        acc = np.empty(nc)
        for py in range(ty * tile, min((ty + 1) * tile, height)):
            for px in range(tx * tile, min((tx + 1) * tile, width)):
                pxf, pyf = px + 0.5, py + 0.5
                tr = 1.0
                for c in range(nc):
                    acc[c] = 0.0
                for j in range(offsets[t], offsets[t + 1]):
                    g = ids[j]
                    a = _alpha_at(means2d, conics, opac, g, pxf, pyf)
                    if a == 0.0:
                        continue
                    test = tr * (1.0 - a)
                    if test < T_MIN:
                        break
                    for c in range(nc):
                        acc[c] += float(colors[g, c]) * a * tr
                    tr = test
                for c in range(nc):
                    image[py, px, c] = acc[c]
                alpha[py, px] = 1.0 - tr


@njit(cache=True, nogil=True, parallel=True)
def raster_bwd(means2d, conics, colors, opac, depths, width, height, tile, g_img, g_alpha, chunks,
               acc_m, acc_q, acc_c, acc_o):
    """Per-chunk partial gradients into ``acc_*[chunk]`` (summed by the caller): chunk ``k`` takes
    tiles ``k, k + chunks, ...``, so no two threads add into the same row."""
    offsets, ids = bin_tiles(means2d, conics, depths, width, height, tile)
    ntx = (width + tile - 1) // tile
    nty = (height + tile - 1) // tile
    nc = colors.shape[1]
    for k in prange(chunks):
        behind = np.empty(nc)
        for t in range(k, ntx * nty, chunks):
            tx, ty = t % ntx, t // ntx
            m = offsets[t + 1] - offsets[t]
            lst_g = np.empty(m, np.int64)
            lst_a = np.empty(m)
            lst_t = np.empty(m)
            for py in range(ty * tile, min((ty + 1) * tile, height)):
                for px in range(tx * tile, min((tx + 1) * tile, width)):
                    pxf, pyf = px + 0.5, py + 0.5
                    # the forward pass, keeping each drawn Gaussian's alpha and T before it
                    tr = 1.0
                    cnt = 0
                    for j in range(offsets[t], offsets[t + 1]):
                        g = ids[j]
                        a = _alpha_at(means2d, conics, opac, g, pxf, pyf)
                        if a == 0.0:
                            continue
                        test = tr * (1.0 - a)
                        if test < T_MIN:
                            break
                        lst_g[cnt] = g
                        lst_a[cnt] = a
                        lst_t[cnt] = tr
                        cnt += 1
                        tr = test
                    ga_out = float(g_alpha[py, px])
                    for c in range(nc):
                        behind[c] = 0.0
                    # back to front
                    for q in range(cnt - 1, -1, -1):
                        g, a, tb = lst_g[q], lst_a[q], lst_t[q]
                        w = a * tb
                        dot_c = 0.0
                        dot_b = 0.0
                        for c in range(nc):
                            gi = float(g_img[py, px, c])
                            col = float(colors[g, c])
                            acc_c[k, g, c] += w * gi
                            dot_c += col * gi
                            dot_b += behind[c] * gi
                            behind[c] += w * col
                        inv1 = 1.0 / (1.0 - a)
                        gal = tb * dot_c - dot_b * inv1 + ga_out * tr * inv1
                        dx = float(means2d[g, 0]) - pxf
                        dy = float(means2d[g, 1]) - pyf
                        qa, qb, qc = float(conics[g, 0]), float(conics[g, 1]), float(conics[g, 2])
                        power = -0.5 * (qa * dx * dx + qc * dy * dy) - qb * dx * dy
                        gg = math.exp(power)
                        o = float(opac[g])
                        if o * gg >= ALPHA_MAX:  # clamped: no derivative
                            continue
                        acc_o[k, g] += gal * gg
                        gp = gal * o * gg
                        acc_m[k, g, 0] += -gp * (qa * dx + qb * dy)
                        acc_m[k, g, 1] += -gp * (qc * dy + qb * dx)
                        acc_q[k, g, 0] += -0.5 * gp * dx * dx
                        acc_q[k, g, 1] += -gp * dx * dy
                        acc_q[k, g, 2] += -0.5 * gp * dy * dy
