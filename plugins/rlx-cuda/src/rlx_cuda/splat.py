"""rlx-cuda kernels for the 3D Gaussian splatting ops (``rlx_core``'s ``splat_*`` family).

CUDA C compiled through the plugin's NVRTC path (:func:`rlx_cuda.kernels.raw_kernel`: cubins cached
and authenticated), one source per compute type (``float`` for f32, ``double`` for f64).

* projection, SH colour and their backward ops: one thread per Gaussian;
* rasterize: per Gaussian its tile box and tile count; an exclusive scan gives each Gaussian's
  slots; every (tile, Gaussian) pair gets the key ``tile * N + depth rank`` (the depth rank from a
  stable argsort, so equal depths stay in index order) and one sort of the keys makes each tile's
  list contiguous and nearest first; ``searchsorted`` finds the list bounds. Then one block per
  tile, one thread per pixel, walks its tile's list front to back (the paper's rasterizer).
* rasterize backward: the same binning; each pixel reruns its forward pass for the final
  transmittance and its last drawn Gaussian, then walks back to front recovering ``T`` by division
  and adds its gradient terms with ``atomicAdd``.

The intersection count is read on the host to size the key buffers, so a program with these
kernels cannot be captured into a CUDA graph: their ``run`` refuses while the stream is capturing
and the program stays eager (``CudaProgram.graph_error`` says why). Tile sizes above 32 (more than
1024 threads per block) are not claimed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import cupy as cp
import numpy as np

from rlx_core.plugin import DType

from .kernels import Bound, Run, _noop, raw_kernel

_COMMON = r"""
#define LOW_PASS 0.3
#define ALPHA_MAX 0.99
#define ALPHA_MIN (1.0 / 255.0)
#define T_MIN 1e-4
#define FOV_MARGIN 1.3
typedef long long i64;

__device__ inline void rotation(const real* q, real* r, real* qh, real* qn) {
  real w = q[0], x = q[1], y = q[2], z = q[3];
  real n = sqrt(w * w + x * x + y * y + z * z);
  w /= n; x /= n; y /= n; z /= n;
  qh[0] = w; qh[1] = x; qh[2] = y; qh[3] = z; *qn = n;
  r[0] = 1 - 2 * (y * y + z * z); r[1] = 2 * (x * y - w * z); r[2] = 2 * (x * z + w * y);
  r[3] = 2 * (x * y + w * z); r[4] = 1 - 2 * (x * x + z * z); r[5] = 2 * (y * z - w * x);
  r[6] = 2 * (x * z - w * y); r[7] = 2 * (y * z + w * x); r[8] = 1 - 2 * (x * x + y * y);
}

/* camera point, Jacobian and 2-D covariance of one Gaussian; returns false when culled */
__device__ inline bool forward_one(const real* m, const real* s, const real* q, const real* V, const real* K,
                                   int width, int height, real near, real* p, real* rot, real* M,
                                   real* sig, real* T, real* cov, real* uv, bool* free_uv,
                                   real* qh, real* qn) {
  for (int r = 0; r < 3; ++r)
    p[r] = V[4 * r] * m[0] + V[4 * r + 1] * m[1] + V[4 * r + 2] * m[2] + V[4 * r + 3];
  if (!(p[2] > near)) return false;
  real fx = K[0], fy = K[1], cx = K[2], cy = K[3];
  real mx = (real)(FOV_MARGIN - 1) * (real)0.5 * width / fx;
  real my = (real)(FOV_MARGIN - 1) * (real)0.5 * height / fy;
  real lxp = (width - cx) / fx + mx, lxn = cx / fx + mx, lyp = (height - cy) / fy + my, lyn = cy / fy + my;
  rotation(q, rot, qh, qn);
  for (int r = 0; r < 3; ++r) for (int c = 0; c < 3; ++c) M[3 * r + c] = rot[3 * r + c] * s[c];
  for (int r = 0; r < 3; ++r) for (int c = 0; c < 3; ++c) {
    real a = 0; for (int k = 0; k < 3; ++k) a += M[3 * r + k] * M[3 * c + k]; sig[3 * r + c] = a; }
  real z = p[2], xz = p[0] / z, yz = p[1] / z;
  real u = fmin(fmax(xz, -lxn), lxp), v = fmin(fmax(yz, -lyn), lyp);
  uv[0] = u; uv[1] = v; free_uv[0] = (xz > -lxn) && (xz < lxp); free_uv[1] = (yz > -lyn) && (yz < lyp);
  real j00 = fx / z, j02 = -fx * u / z, j11 = fy / z, j12 = -fy * v / z;
  for (int k = 0; k < 3; ++k) {
    T[k] = j00 * V[k] + j02 * V[8 + k]; T[3 + k] = j11 * V[4 + k] + j12 * V[8 + k]; }
  for (int a = 0; a < 2; ++a) for (int b = 0; b < 2; ++b) {
    real acc = 0;
    for (int k = 0; k < 3; ++k) { real t = 0; for (int l = 0; l < 3; ++l) t += sig[3 * k + l] * T[3 * b + l];
                                  acc += T[3 * a + k] * t; }
    cov[2 * a + b] = acc; }
  cov[0] += (real)LOW_PASS; cov[3] += (real)LOW_PASS;
  return cov[0] * cov[3] - cov[1] * cov[1] > 0;
}

extern "C" __global__ void project_fwd(const real* means, const real* scales, const real* quats,
    const real* V, const real* K, int n, int width, int height, real near, real* mu, real* conic,
    real* depth) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  real p[3], rot[9], M[9], sig[9], T[6], cov[4], uv[2], qh[4], qn; bool fr[2];
  bool ok = forward_one(means + 3 * i, scales + 3 * i, quats + 4 * i, V, K, width, height, near,
                        p, rot, M, sig, T, cov, uv, fr, qh, &qn);
  depth[i] = V[8] * means[3 * i] + V[9] * means[3 * i + 1] + V[10] * means[3 * i + 2] + V[11];
  mu[2 * i] = 0; mu[2 * i + 1] = 0; conic[3 * i] = 0; conic[3 * i + 1] = 0; conic[3 * i + 2] = 0;
  if (!ok) return;
  real det = cov[0] * cov[3] - cov[1] * cov[1];
  conic[3 * i] = cov[3] / det; conic[3 * i + 1] = -cov[1] / det; conic[3 * i + 2] = cov[0] / det;
  mu[2 * i] = K[0] * p[0] / p[2] + K[2]; mu[2 * i + 1] = K[1] * p[1] / p[2] + K[3];
}

extern "C" __global__ void project_bwd(const real* means, const real* scales, const real* quats,
    const real* V, const real* K, int n, int width, int height, real near, const real* g_mu,
    const real* g_conic, const real* g_depth, real* g_means, real* g_scales, real* g_quats) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  real p[3], rot[9], M[9], sig[9], T[6], cov[4], uv[2], qh[4], qn; bool fr[2];
  bool ok = forward_one(means + 3 * i, scales + 3 * i, quats + 4 * i, V, K, width, height, near,
                        p, rot, M, sig, T, cov, uv, fr, qh, &qn);
  real gp[3] = {0, 0, g_depth[i]};
  for (int k = 0; k < 3; ++k) g_scales[3 * i + k] = 0;
  for (int k = 0; k < 4; ++k) g_quats[4 * i + k] = 0;
  if (ok) {
    real fx = K[0], fy = K[1], x = p[0], y = p[1], z = p[2];
    real det = cov[0] * cov[3] - cov[1] * cov[1];
    real q00 = cov[3] / det, q01 = -cov[1] / det, q11 = cov[0] / det;
    real ga = g_conic[3 * i], gb = (real)0.5 * g_conic[3 * i + 1], gc = g_conic[3 * i + 2];
    real p00 = q00 * ga + q01 * gb, p01 = q00 * gb + q01 * gc;
    real p10 = q01 * ga + q11 * gb, p11 = q01 * gb + q11 * gc;
    real h[4] = {-(p00 * q00 + p01 * q01), -(p00 * q01 + p01 * q11),
                 -(p10 * q00 + p11 * q01), -(p10 * q01 + p11 * q11)};
    real gsig[9], gt[6];
    for (int r = 0; r < 3; ++r) for (int c = 0; c < 3; ++c)
      gsig[3 * r + c] = T[r] * (h[0] * T[c] + h[1] * T[3 + c]) + T[3 + r] * (h[2] * T[c] + h[3] * T[3 + c]);
    for (int r = 0; r < 2; ++r) for (int c = 0; c < 3; ++c) {
      real acc = 0;
      for (int k = 0; k < 3; ++k) acc += (h[2 * r] * T[k] + h[2 * r + 1] * T[3 + k]) * sig[3 * k + c];
      gt[3 * r + c] = 2 * acc; }
    real gj00 = gt[0] * V[0] + gt[1] * V[1] + gt[2] * V[2];
    real gj02 = gt[0] * V[8] + gt[1] * V[9] + gt[2] * V[10];
    real gj11 = gt[3] * V[4] + gt[4] * V[5] + gt[5] * V[6];
    real gj12 = gt[3] * V[8] + gt[4] * V[9] + gt[5] * V[10];
    real z2 = z * z, gx = 0, gy = 0;
    real gz = -fx / z2 * gj00 - fy / z2 * gj11 + fx * uv[0] / z2 * gj02 + fy * uv[1] / z2 * gj12;
    if (fr[0]) { gx += -fx / z2 * gj02; gz += fx * x / (z2 * z) * gj02; }
    if (fr[1]) { gy += -fy / z2 * gj12; gz += fy * y / (z2 * z) * gj12; }
    real gmx = g_mu[2 * i], gmy = g_mu[2 * i + 1];
    gx += fx / z * gmx; gy += fy / z * gmy; gz += -fx * x / z2 * gmx - fy * y / z2 * gmy;
    gp[0] = gx; gp[1] = gy; gp[2] = gz + g_depth[i];
    real grot[9];
    for (int r = 0; r < 3; ++r) for (int c = 0; c < 3; ++c) {
      real acc = 0; for (int k = 0; k < 3; ++k) acc += gsig[3 * r + k] * M[3 * k + c];
      real gm = 2 * acc;
      g_scales[3 * i + c] += gm * rot[3 * r + c];
      grot[3 * r + c] = gm * scales[3 * i + c]; }
    real w = qh[0], qx = qh[1], qy = qh[2], qz = qh[3];
    real gw = 2 * (-qz * grot[1] + qy * grot[2] + qz * grot[3] - qx * grot[5] - qy * grot[6] + qx * grot[7]);
    real gqx = 2 * (qy * grot[1] + qz * grot[2] + qy * grot[3] - 2 * qx * grot[4] - w * grot[5] + qz * grot[6]
                    + w * grot[7] - 2 * qx * grot[8]);
    real gqy = 2 * (-2 * qy * grot[0] + qx * grot[1] + w * grot[2] + qx * grot[3] + qz * grot[5] - w * grot[6]
                    + qz * grot[7] - 2 * qy * grot[8]);
    real gqz = 2 * (-2 * qz * grot[0] - w * grot[1] + qx * grot[2] + w * grot[3] - 2 * qz * grot[4]
                    + qy * grot[5] + qx * grot[6] + qy * grot[7]);
    real dot = w * gw + qx * gqx + qy * gqy + qz * gqz;
    g_quats[4 * i] = (gw - w * dot) / qn; g_quats[4 * i + 1] = (gqx - qx * dot) / qn;
    g_quats[4 * i + 2] = (gqy - qy * dot) / qn; g_quats[4 * i + 3] = (gqz - qz * dot) / qn;
  }
  for (int k = 0; k < 3; ++k) g_means[3 * i + k] = gp[0] * V[k] + gp[1] * V[4 + k] + gp[2] * V[8 + k];
}

__device__ inline void sh_basis(real x, real y, real z, int degree, real* bs, real* db) {
  const real C0 = 0.28209479177387814, C1 = 0.4886025119029199;
  const real C2[5] = {1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792,
                      0.5462742152960396};
  const real C3[7] = {-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
                      -0.4570457994644658, 1.445305721320277, -0.5900435899266435};
  for (int k = 0; k < 48; ++k) db[k] = 0;
  bs[0] = C0;
  if (degree > 0) { bs[1] = -C1 * y; bs[2] = C1 * z; bs[3] = -C1 * x; db[3 * 1 + 1] = -C1; db[3 * 2 + 2] = C1;
                    db[3 * 3 + 0] = -C1; }
  real xx = x * x, yy = y * y, zz = z * z;
  if (degree > 1) {
    bs[4] = C2[0] * x * y; bs[5] = C2[1] * y * z; bs[6] = C2[2] * (2 * zz - xx - yy); bs[7] = C2[3] * x * z;
    bs[8] = C2[4] * (xx - yy);
    db[12] = C2[0] * y; db[13] = C2[0] * x; db[16] = C2[1] * z; db[17] = C2[1] * y;
    db[18] = -2 * C2[2] * x; db[19] = -2 * C2[2] * y; db[20] = 4 * C2[2] * z;
    db[21] = C2[3] * z; db[23] = C2[3] * x;
    db[24] = 2 * C2[4] * x; db[25] = -2 * C2[4] * y; }
  if (degree > 2) {
    bs[9] = C3[0] * y * (3 * xx - yy); bs[10] = C3[1] * x * y * z; bs[11] = C3[2] * y * (4 * zz - xx - yy);
    bs[12] = C3[3] * z * (2 * zz - 3 * xx - 3 * yy); bs[13] = C3[4] * x * (4 * zz - xx - yy);
    bs[14] = C3[5] * z * (xx - yy); bs[15] = C3[6] * x * (xx - 3 * yy);
    db[27] = 6 * C3[0] * x * y; db[28] = C3[0] * (3 * xx - 3 * yy);
    db[30] = C3[1] * y * z; db[31] = C3[1] * x * z; db[32] = C3[1] * x * y;
    db[33] = -2 * C3[2] * x * y; db[34] = C3[2] * (4 * zz - xx - 3 * yy); db[35] = 8 * C3[2] * y * z;
    db[36] = -6 * C3[3] * x * z; db[37] = -6 * C3[3] * y * z; db[38] = C3[3] * (6 * zz - 3 * xx - 3 * yy);
    db[39] = C3[4] * (4 * zz - 3 * xx - yy); db[40] = -2 * C3[4] * x * y; db[41] = 8 * C3[4] * x * z;
    db[42] = 2 * C3[5] * x * z; db[43] = -2 * C3[5] * y * z; db[44] = C3[5] * (xx - yy);
    db[45] = C3[6] * (3 * xx - 3 * yy); db[46] = -6 * C3[6] * x * y; }
}

extern "C" __global__ void sh_fwd(const real* sh, const real* means, const real* cam, int n, int kk, int nc,
                                  int degree, real* colors) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  real bs[16], db[48];
  real dx = means[3 * i] - cam[0], dy = means[3 * i + 1] - cam[1], dz = means[3 * i + 2] - cam[2];
  real d = sqrt(dx * dx + dy * dy + dz * dz);
  sh_basis(dx / d, dy / d, dz / d, degree, bs, db);
  int nb = (degree + 1) * (degree + 1);
  for (int c = 0; c < nc; ++c) {
    real acc = 0;
    for (int k = 0; k < nb; ++k) acc += bs[k] * sh[((i64)i * kk + k) * nc + c];
    colors[(i64)i * nc + c] = fmax(acc + (real)0.5, (real)0);
  }
}

extern "C" __global__ void sh_bwd(const real* sh, const real* means, const real* cam, int n, int kk, int nc,
                                  int degree, const real* g_colors, real* g_sh, real* g_means) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  real bs[16], db[48];
  real dx = means[3 * i] - cam[0], dy = means[3 * i + 1] - cam[1], dz = means[3 * i + 2] - cam[2];
  real d = sqrt(dx * dx + dy * dy + dz * dz);
  real x = dx / d, y = dy / d, z = dz / d;
  sh_basis(x, y, z, degree, bs, db);
  int nb = (degree + 1) * (degree + 1);
  real gd[3] = {0, 0, 0};
  for (int k = 0; k < kk * nc; ++k) g_sh[(i64)i * kk * nc + k] = 0;
  for (int c = 0; c < nc; ++c) {
    real acc = 0;
    for (int k = 0; k < nb; ++k) acc += bs[k] * sh[((i64)i * kk + k) * nc + c];
    if (!(acc + (real)0.5 > 0)) continue;
    real g = g_colors[(i64)i * nc + c];
    for (int k = 0; k < nb; ++k) {
      g_sh[((i64)i * kk + k) * nc + c] = bs[k] * g;
      real v = sh[((i64)i * kk + k) * nc + c] * g;
      gd[0] += db[3 * k] * v; gd[1] += db[3 * k + 1] * v; gd[2] += db[3 * k + 2] * v;
    }
  }
  real dot = x * gd[0] + y * gd[1] + z * gd[2];
  g_means[3 * i] = (gd[0] - x * dot) / d; g_means[3 * i + 1] = (gd[1] - y * dot) / d;
  g_means[3 * i + 2] = (gd[2] - z * dot) / d;
}

/* per Gaussian its inclusive tile box (-1 when not drawn) and how many tiles it touches */
extern "C" __global__ void tile_boxes(const real* means2d, const real* conics, int n, int width, int height,
                                      int tile, int* box, i64* counts) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int ntx = (width + tile - 1) / tile, nty = (height + tile - 1) / tile;
  box[4 * i] = -1; counts[i] = 0;
  double a = conics[3 * i], b = conics[3 * i + 1], c = conics[3 * i + 2];
  double det = a * c - b * b;
  if (!(det > 0)) return;
  double s11 = c / det, s12 = -b / det, s22 = a / det;
  double mid = 0.5 * (s11 + s22);
  double lam = mid + sqrt(fmax(0.1, mid * mid - (s11 * s22 - s12 * s12)));
  double r = ceil(3.0 * sqrt(lam));
  double mx = means2d[2 * i], my = means2d[2 * i + 1];
  if (!(isfinite(r) && isfinite(mx) && isfinite(my)) || r <= 0) return;
  double tx0 = floor((mx - r) / tile), tx1 = floor((mx + r) / tile);
  double ty0 = floor((my - r) / tile), ty1 = floor((my + r) / tile);
  if (tx1 < 0 || ty1 < 0 || tx0 > ntx - 1 || ty0 > nty - 1) return;
  int x0 = (int)fmax(tx0, 0.0), y0 = (int)fmax(ty0, 0.0);
  int x1 = (int)fmin(tx1, (double)(ntx - 1)), y1 = (int)fmin(ty1, (double)(nty - 1));
  box[4 * i] = x0; box[4 * i + 1] = y0; box[4 * i + 2] = x1; box[4 * i + 3] = y1;
  counts[i] = (i64)(x1 - x0 + 1) * (y1 - y0 + 1);
}

/* key = tile * n + depth rank for each (tile, Gaussian) pair, at the Gaussian's slots */
extern "C" __global__ void tile_keys(const int* box, const i64* offsets, const i64* rank, int n, int width,
                                     int tile, i64* keys, int* ids) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n || box[4 * i] < 0) return;
  int ntx = (width + tile - 1) / tile;
  i64 o = offsets[i];
  for (int ty = box[4 * i + 1]; ty <= box[4 * i + 3]; ++ty)
    for (int tx = box[4 * i]; tx <= box[4 * i + 2]; ++tx) {
      keys[o] = (i64)(ty * ntx + tx) * n + rank[i]; ids[o] = i; ++o; }
}

__device__ inline bool alpha_of(const real* means2d, const real* conics, const real* opac, int g, real px,
                                real py, real* a, real* gauss, real* dx, real* dy) {
  *dx = means2d[2 * g] - px; *dy = means2d[2 * g + 1] - py;
  real qa = conics[3 * g], qb = conics[3 * g + 1], qc = conics[3 * g + 2];
  real power = (real)-0.5 * (qa * *dx * *dx + qc * *dy * *dy) - qb * *dx * *dy;
  if (power > 0) return false;
  *gauss = exp(power);
  *a = fmin((real)ALPHA_MAX, opac[g] * *gauss);
  return *a >= (real)ALPHA_MIN;
}

/* one block per tile, one thread per pixel, front to back */
extern "C" __global__ void raster_fwd(const real* means2d, const real* conics, const real* colors,
    const real* opac, const i64* ranges, const int* ids, int width, int height, int tile, int nc,
    real* image, real* alpha_out) {
  int ntx = (width + tile - 1) / tile;
  int t = blockIdx.x, px = (t % ntx) * tile + threadIdx.x, py = (t / ntx) * tile + threadIdx.y;
  if (px >= width || py >= height) return;
  real pxf = px + (real)0.5, pyf = py + (real)0.5, T = 1;
  real acc[4] = {0, 0, 0, 0};
  i64 pix = (i64)py * width + px;
  for (int c = 0; c < nc; ++c) image[pix * nc + c] = 0;
  for (i64 j = ranges[t]; j < ranges[t + 1]; ++j) {
    int g = ids[j];
    real a, gs, dx, dy;
    if (!alpha_of(means2d, conics, opac, g, pxf, pyf, &a, &gs, &dx, &dy)) continue;
    real test = T * (1 - a);
    if (test < (real)T_MIN) break;
    for (int c = 0; c < nc; ++c) {
      real v = colors[(i64)g * nc + c] * a * T;
      if (c < 4) acc[c] += v; else image[pix * nc + c] += v;
    }
    T = test;
  }
  for (int c = 0; c < nc && c < 4; ++c) image[pix * nc + c] = acc[c];
  alpha_out[pix] = 1 - T;
}

extern "C" __global__ void raster_bwd(const real* means2d, const real* conics, const real* colors,
    const real* opac, const i64* ranges, const int* ids, int width, int height, int tile, int nc,
    const real* g_img, const real* g_alpha, real* g_m, real* g_q, real* g_c, real* g_o) {
  int ntx = (width + tile - 1) / tile;
  int t = blockIdx.x, px = (t % ntx) * tile + threadIdx.x, py = (t / ntx) * tile + threadIdx.y;
  if (px >= width || py >= height) return;
  real pxf = px + (real)0.5, pyf = py + (real)0.5, T = 1;
  i64 last = ranges[t] - 1;
  for (i64 j = ranges[t]; j < ranges[t + 1]; ++j) {
    real a, gs, dx, dy;
    if (!alpha_of(means2d, conics, opac, ids[j], pxf, pyf, &a, &gs, &dx, &dy)) continue;
    real test = T * (1 - a);
    if (test < (real)T_MIN) break;
    T = test; last = j;
  }
  i64 pix = (i64)py * width + px;
  real t_final = T, ga_out = g_alpha[pix];
  real dot_b = 0;  /* behind . g_img, kept as a scalar so any channel count works */
  for (i64 j = last; j >= ranges[t]; --j) {
    int g = ids[j];
    real a, gs, dx, dy;
    if (!alpha_of(means2d, conics, opac, g, pxf, pyf, &a, &gs, &dx, &dy)) continue;
    real inv1 = 1 / (1 - a);
    T = T * inv1;  /* the transmittance in front of g */
    real w = a * T, dot_c = 0;
    for (int c = 0; c < nc; ++c) {
      real gi = g_img[pix * nc + c], col = colors[(i64)g * nc + c];
      atomicAdd(&g_c[(i64)g * nc + c], w * gi);
      dot_c += col * gi;
    }
    real gal = T * dot_c - dot_b * inv1 + ga_out * t_final * inv1;
    for (int c = 0; c < nc; ++c) dot_b += w * colors[(i64)g * nc + c] * g_img[pix * nc + c];
    if (opac[g] * gs >= (real)ALPHA_MAX) continue;  /* clamped: no derivative */
    real qa = conics[3 * g], qb = conics[3 * g + 1], qc = conics[3 * g + 2];
    atomicAdd(&g_o[g], gal * gs);
    real gp = gal * opac[g] * gs;
    atomicAdd(&g_m[2 * g], -gp * (qa * dx + qb * dy));
    atomicAdd(&g_m[2 * g + 1], -gp * (qc * dy + qb * dx));
    atomicAdd(&g_q[3 * g], (real)-0.5 * gp * dx * dx);
    atomicAdd(&g_q[3 * g + 1], -gp * dx * dy);
    atomicAdd(&g_q[3 * g + 2], (real)-0.5 * gp * dy * dy);
  }
}
"""


KERNELS = ("project_fwd", "project_bwd", "sh_fwd", "sh_bwd", "tile_boxes", "tile_keys", "raster_fwd",
           "raster_bwd")


def source(dt: DType) -> str:
    """The kernels for one compute type, each named ``<kernel>_<dtype>`` (loaded kernels are
    cached by name)."""
    real = "double" if dt is DType.F64 else "float"
    src = f"typedef {real} real;\n" + _COMMON
    for name in KERNELS:
        src = src.replace(f" void {name}(", f" void {name}_{dt.value}(")
    return src


def _kernel(name: str, dt: DType) -> Any:
    return raw_kernel(f"{name}_{dt.value}", source(dt))


def _real(dt: DType) -> Any:
    return np.float64 if dt is DType.F64 else np.float32


def _grid(n: int, block: int = 128) -> tuple[tuple[int], tuple[int]]:
    return ((max(1, (n + block - 1) // block),), (block,))


def _int(b: Bound, name: str) -> int:
    """An ``int`` attribute of ``b``'s node (the op schema has checked it is one)."""
    return int(cast(int, b.attrs[name]))


def _refuse_capture() -> None:
    if cp.cuda.get_current_stream().is_capturing():
        raise RuntimeError("splat rasterization reads its intersection count on the host, so it cannot be "
                           "captured into a CUDA graph; the program runs eagerly")


def k_project(b: Bound, grad: bool = False) -> Run:
    dt = b.in_types[0].dtype
    n = int(b.in_types[0].shape[0])
    if n == 0:
        return _noop
    k = _kernel("project_bwd" if grad else "project_fwd", dt)
    r = _real(dt)
    w, h = _int(b, "width"), _int(b, "height")
    args = (*b.ins[:5], np.int32(n), np.int32(w), np.int32(h), r(float(cast(float, b.attrs["near"]))),
            *b.ins[5:], *b.outs)
    grid, block = _grid(n)
    return lambda: k(grid, block, args)


def k_sh(b: Bound, grad: bool = False) -> Run:
    dt = b.in_types[0].dtype
    n, kk, nc = (int(d) for d in b.in_types[0].shape)
    if n == 0:
        return _noop
    k = _kernel("sh_bwd" if grad else "sh_fwd", dt)
    args = (*b.ins[:3], np.int32(n), np.int32(kk), np.int32(nc), np.int32(_int(b, "degree")),
            *b.ins[3:], *b.outs)
    grid, block = _grid(n)
    return lambda: k(grid, block, args)


def _binning(b: Bound) -> Callable[[], tuple[Any, Any]]:
    """A function that bins the Gaussians of ``b``'s inputs: ``(ranges [tiles + 1], ids)``."""
    dt = b.in_types[0].dtype
    n = int(b.in_types[0].shape[0])
    w, h, tile = (_int(b, k) for k in ("width", "height", "tile_size"))
    ntiles = -(-w // tile) * -(-h // tile)
    boxes, keys = _kernel("tile_boxes", dt), _kernel("tile_keys", dt)
    means2d, conics, depths = b.ins[0], b.ins[1], b.ins[4]
    grid, block = _grid(n)
    tiles = cp.arange(ntiles + 1, dtype=cp.int64)

    def bins() -> tuple[Any, Any]:
        _refuse_capture()
        box = cp.empty((n, 4), cp.int32)
        counts = cp.empty(n, cp.int64)
        boxes(grid, block, (means2d, conics, np.int32(n), np.int32(w), np.int32(h), np.int32(tile), box,
                            counts))
        ends = cp.cumsum(counts)
        total = int(ends[-1].get()) if n else 0
        if total == 0:
            return cp.zeros(ntiles + 1, cp.int64), cp.zeros(1, cp.int32)
        rank = cp.empty(n, cp.int64)
        # depth order, equal depths by index (lexsort's last key is the primary one)
        idx = cp.arange(n, dtype=cp.float64)
        rank[cp.lexsort(cp.stack([idx, depths.astype(cp.float64)]))] = cp.arange(n, dtype=cp.int64)
        k64 = cp.empty(total, cp.int64)
        ids = cp.empty(total, cp.int32)
        keys(grid, block, (box, ends - counts, rank, np.int32(n), np.int32(w), np.int32(tile), k64, ids))
        order = cp.argsort(k64)
        ids = ids[order]
        ranges = cp.searchsorted(k64[order] // n, tiles, side="left").astype(cp.int64)
        return ranges, ids
    return bins


def k_rasterize(b: Bound) -> Run:
    dt = b.in_types[0].dtype
    w, h, tile = (_int(b, k) for k in ("width", "height", "tile_size"))
    nc = int(b.in_types[2].shape[1])
    ntiles = -(-w // tile) * -(-h // tile)
    k = _kernel("raster_fwd", dt)
    bins = _binning(b)
    means2d, conics, colors, opac = b.ins[:4]
    image, alpha = b.outs

    def run() -> None:
        ranges, ids = bins()
        k((ntiles,), (tile, tile), (means2d, conics, colors, opac, ranges, ids, np.int32(w), np.int32(h),
                                    np.int32(tile), np.int32(nc), image, alpha))
    return run


def k_rasterize_grad(b: Bound) -> Run:
    dt = b.in_types[0].dtype
    w, h, tile = (_int(b, k) for k in ("width", "height", "tile_size"))
    nc = int(b.in_types[2].shape[1])
    ntiles = -(-w // tile) * -(-h // tile)
    k = _kernel("raster_bwd", dt)
    bins = _binning(b)
    means2d, conics, colors, opac = b.ins[:4]
    g_img, g_alpha = b.ins[5], b.ins[6]

    def run() -> None:
        ranges, ids = bins()
        for o in b.outs:
            o.fill(0)
        k((ntiles,), (tile, tile), (means2d, conics, colors, opac, ranges, ids, np.int32(w), np.int32(h),
                                    np.int32(tile), np.int32(nc), g_img, g_alpha, *b.outs))
    return run


#: Kernel factory per claim name.
FACTORIES: dict[str, Callable[[Bound], Run]] = {
    "cuda.splat_project": k_project, "cuda.splat_project_grad": lambda b: k_project(b, True),
    "cuda.splat_sh_color": k_sh, "cuda.splat_sh_color_grad": lambda b: k_sh(b, True),
    "cuda.splat_rasterize": k_rasterize, "cuda.splat_rasterize_grad": k_rasterize_grad,
}
