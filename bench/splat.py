"""Gaussian splatting benchmark: RLX's splat ops vs a PyTorch reference written here (and ``gsplat``
when importable), one timed run each after a warm-up, printed as a table with ratios.

    .venv/bin/python bench/splat.py --device cpu                     # small scene (default 2k, 256x256)
    python bench/splat.py --device cuda --n 1000000 --width 1920 --height 1080   # the H200 row

Forward = project + SH (degree 3) + rasterize; forward+backward adds the gradient of
``sum(image * g)`` with respect to means, scales, quats, SH and opacities. The PyTorch reference is
the same algorithm in tensor ops: projection and SH vectorised, binning by sorting (tile, depth)
keys, and per tile a padded list composited with ``cumprod`` in chunks of tiles (autograd does the
backward); it checks RLX's image on the way (max abs difference printed).
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from typing import Any

import numpy as np

C0 = 0.28209479177387814


def scene(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"means": rng.uniform(-1.5, 1.5, (n, 3)).astype(np.float32),
            "scales": rng.uniform(0.002, 0.02, (n, 3)).astype(np.float32) * (2000 / max(n, 1)) ** (1 / 3),
            "quats": rng.normal(size=(n, 4)).astype(np.float32),
            "sh": (0.3 * rng.normal(size=(n, 16, 3))).astype(np.float32),
            "opac": rng.uniform(0.1, 0.9, n).astype(np.float32)}


def camera(w: int, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    view = np.eye(4, dtype=np.float32)
    view[2, 3] = 4.0
    f = 0.8 * w
    return view, np.array([f, f, w / 2, h / 2], np.float32), np.array([0, 0, -4.0], np.float32)


# -- RLX ---------------------------------------------------------------------------------------

def rlx_graphs(n: int, w: int, h: int) -> tuple[Any, Any]:
    from rlx_core.autodiff import grad
    from rlx_core.plugin import GraphBuilder

    b = GraphBuilder("splat_bench")
    ins = {"means": b.input("means", "f32", (n, 3)), "scales": b.input("scales", "f32", (n, 3)),
           "quats": b.input("quats", "f32", (n, 4)), "sh": b.input("sh", "f32", (n, 16, 3)),
           "opac": b.input("opac", "f32", (n,))}
    view, intr = b.input("viewmat", "f32", (4, 4)), b.input("intrinsics", "f32", (4,))
    cam = b.input("campos", "f32", (3,))
    g = b.input("g", "f32", (h, w, 3))
    mu, con, depth = b.op("splat_project", ins["means"], ins["scales"], ins["quats"], view, intr, width=w,
                          height=h)
    col = b.op("splat_sh_color", ins["sh"], ins["means"], cam, degree=3)
    img, _ = b.op("splat_rasterize", mu, con, col, ins["opac"], depth, width=w, height=h, tile_size=16)
    b.output(img, "image")
    b.output(b.op("reduce_sum", img * g, axes=(0, 1, 2), keepdims=False), "loss")
    fwd = b.build()
    bwd = grad(fwd, "loss", ["means", "scales", "quats", "sh", "opac"])
    return fwd, bwd


# -- PyTorch reference -------------------------------------------------------------------------

def torch_render(t: Any, p: dict[str, Any], view: Any, intr: Any, cam: Any, w: int, h: int, tile: int = 16,
                 chunk_pixels: int = 1 << 24) -> Any:
    """The same renderer as the RLX ops (``rlx_core.ir.ops.splat``), in PyTorch tensor ops."""
    means, scales, quats, sh, opac = p["means"], p["scales"], p["quats"], p["sh"], p["opac"]
    n = means.shape[0]
    r, tr = view[:3, :3], view[:3, 3]
    pc = means @ r.T + tr
    x, y, z = pc.unbind(-1)
    fx, fy, cx, cy = intr.unbind(0)
    valid = z > 0.01
    zs = t.where(valid, z, t.ones_like(z))
    lxp, lxn = (w - cx) / fx + 0.15 * w / fx, cx / fx + 0.15 * w / fx
    lyp, lyn = (h - cy) / fy + 0.15 * h / fy, cy / fy + 0.15 * h / fy
    u = t.minimum(t.maximum(x / zs, -lxn), lxp)
    v = t.minimum(t.maximum(y / zs, -lyn), lyp)
    zero = t.zeros_like(z)
    jac = t.stack([t.stack([fx / zs, zero, -fx * u / zs], -1), t.stack([zero, fy / zs, -fy * v / zs], -1)], 1)
    q = quats / quats.norm(dim=-1, keepdim=True)
    qw, qx, qy, qz = q.unbind(-1)
    rot = t.stack([1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy - qw * qz), 2 * (qx * qz + qw * qy),
                   2 * (qx * qy + qw * qz), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz - qw * qx),
                   2 * (qx * qz - qw * qy), 2 * (qy * qz + qw * qx), 1 - 2 * (qx * qx + qy * qy)],
                  -1).view(n, 3, 3)
    m = rot * scales[:, None, :]
    tm = jac @ r
    cov = tm @ (m @ m.transpose(1, 2)) @ tm.transpose(1, 2) + 0.3 * t.eye(2, device=means.device)
    a, b, c = cov[:, 0, 0], cov[:, 0, 1], cov[:, 1, 1]
    det = a * c - b * b
    valid = valid & (det > 0)
    inv = t.where(valid, 1 / t.where(valid, det, t.ones_like(det)), zero)
    conic = t.stack([c * inv, -b * inv, a * inv], -1)
    mu = t.stack([fx * x / zs + cx, fy * y / zs + cy], -1) * valid[:, None]
    # SH degree 3
    d = means - cam
    d = d / d.norm(dim=-1, keepdim=True)
    dx, dy, dz = d.unbind(-1)
    xx, yy, zz = dx * dx, dy * dy, dz * dz
    basis = t.stack([C0 * t.ones_like(dx), -0.4886025119029199 * dy, 0.4886025119029199 * dz,
                     -0.4886025119029199 * dx, 1.0925484305920792 * dx * dy, -1.0925484305920792 * dy * dz,
                     0.31539156525252005 * (2 * zz - xx - yy), -1.0925484305920792 * dx * dz,
                     0.5462742152960396 * (xx - yy), -0.5900435899266435 * dy * (3 * xx - yy),
                     2.890611442640554 * dx * dy * dz, -0.4570457994644658 * dy * (4 * zz - xx - yy),
                     0.3731763325901154 * dz * (2 * zz - 3 * xx - 3 * yy),
                     -0.4570457994644658 * dx * (4 * zz - xx - yy), 1.445305721320277 * dz * (xx - yy),
                     -0.5900435899266435 * dx * (xx - 3 * yy)], -1)
    colors = t.clamp_min((basis[:, :, None] * sh).sum(1) + 0.5, 0.0)
    # binning (no gradient through the boxes)
    with t.no_grad():
        dd = conic[:, 0] * conic[:, 2] - conic[:, 1] ** 2
        ok = dd > 0
        dsafe = t.where(ok, dd, t.ones_like(dd))
        s11, s12, s22 = conic[:, 2] / dsafe, -conic[:, 1] / dsafe, conic[:, 0] / dsafe
        mid = 0.5 * (s11 + s22)
        lam = mid + t.sqrt(t.clamp_min(mid * mid - (s11 * s22 - s12 * s12), 0.1))
        rad = t.ceil(3 * t.sqrt(lam))
        ntx, nty = -(-w // tile), -(-h // tile)
        tx0, tx1 = t.floor((mu[:, 0] - rad) / tile), t.floor((mu[:, 0] + rad) / tile)
        ty0, ty1 = t.floor((mu[:, 1] - rad) / tile), t.floor((mu[:, 1] + rad) / tile)
        ok &= (tx1 >= 0) & (ty1 >= 0) & (tx0 <= ntx - 1) & (ty0 <= nty - 1)
        tx0, ty0 = tx0.clamp(0, ntx - 1).long(), ty0.clamp(0, nty - 1).long()
        tx1, ty1 = tx1.clamp(0, ntx - 1).long(), ty1.clamp(0, nty - 1).long()
        cw, ch = (tx1 - tx0 + 1) * ok, (ty1 - ty0 + 1) * ok
        cnt = cw * ch
        gid = t.repeat_interleave(t.arange(n, device=means.device), cnt)
        start = t.cumsum(cnt, 0) - cnt
        k = t.arange(gid.numel(), device=means.device) - start[gid]
        tile_id = (ty0[gid] + k // cw[gid]) * ntx + tx0[gid] + k % cw[gid]
        rank = t.empty(n, dtype=t.long, device=means.device)
        rank[t.argsort(z, stable=True)] = t.arange(n, device=means.device)
        order = t.argsort(tile_id * n + rank[gid])
        gid, tile_id = gid[order], tile_id[order]
        per = t.bincount(tile_id, minlength=ntx * nty)
        kmax = int(per.max()) if per.numel() else 0
        first = t.cumsum(per, 0) - per
        slot = t.arange(gid.numel(), device=means.device) - first[tile_id]
    img = t.zeros(nty * tile, ntx * tile, 3, device=means.device, dtype=means.dtype)
    if kmax == 0:
        return img[:h, :w]
    lists = t.full((ntx * nty, kmax), -1, dtype=t.long, device=means.device)
    lists[tile_id, slot] = gid
    span = t.arange(tile, device=means.device)
    py, px = t.meshgrid(span, span, indexing="ij")
    per_chunk = max(1, chunk_pixels // (tile * tile * kmax))
    rows = []
    for t0 in range(0, ntx * nty, per_chunk):
        tl = t.arange(t0, min(t0 + per_chunk, ntx * nty), device=means.device)
        lid = lists[tl]                                                   # [T, K]
        use = lid >= 0
        g = lid.clamp_min(0)
        pxs = ((tl % ntx) * tile)[:, None] + px.reshape(1, -1) + 0.5      # [T, P]
        pys = ((tl // ntx) * tile)[:, None] + py.reshape(1, -1) + 0.5
        ddx = mu[g, 0][:, None, :] - pxs[:, :, None]                      # [T, P, K]
        ddy = mu[g, 1][:, None, :] - pys[:, :, None]
        cq = conic[g]
        power = (-0.5 * (cq[:, None, :, 0] * ddx * ddx + cq[:, None, :, 2] * ddy * ddy)
                 - cq[:, None, :, 1] * ddx * ddy)
        alpha = t.minimum(opac[g][:, None, :] * t.exp(power), t.tensor(0.99, device=means.device))
        keep = use[:, None, :] & (power <= 0) & (alpha >= 1 / 255)
        alpha = t.where(keep, alpha, t.zeros_like(alpha))
        with t.no_grad():
            incl = t.cumprod(1 - alpha, -1) >= 1e-4
        alpha = t.where(incl, alpha, t.zeros_like(alpha))
        trans = t.cumprod(t.cat([t.ones_like(alpha[..., :1]), 1 - alpha[..., :-1]], -1), -1)
        rows.append(((alpha * trans)[..., None] * colors[g][:, None, :, :]).sum(2))   # [T, P, 3]
    out = t.cat(rows, 0).view(nty, ntx, tile, tile, 3).permute(0, 2, 1, 3, 4)
    out = out.reshape(nty * tile, ntx * tile, 3)
    return out[:h, :w]


def timed(fn: Any, sync: Any = None) -> float:
    fn()
    if sync:
        sync()
    t0 = time.perf_counter()
    fn()
    if sync:
        sync()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--height", type=int, default=256)
    a = ap.parse_args()
    from rlx_core.runtime import Session

    n, w, h = a.n, a.width, a.height
    sc = scene(n)
    view, intr, cam = camera(w, h)
    g = np.random.default_rng(1).normal(size=(h, w, 3)).astype(np.float32)
    feed = {**sc, "viewmat": view, "intrinsics": intr, "campos": cam, "g": g}
    fwd, bwd = rlx_graphs(n, w, h)
    s = Session(a.device)
    ef, eb = s.compile(fwd), s.compile(bwd)
    res: dict[str, Any] = {"device": a.device, "n": n, "width": w, "height": h}
    image = ef.run(feed)["image"]
    res["rlx_forward_s"] = timed(lambda: ef.run(feed))
    res["rlx_fwd_bwd_s"] = timed(lambda: eb.run(feed))
    torch: Any  # the module, or None when it is not installed
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        torch = None
    if torch is not None:
        dev = "cuda" if a.device.startswith("cuda") else "cpu"
        tp = {k: torch.tensor(v, device=dev, requires_grad=True) for k, v in sc.items()}
        tv, ti, tc = (torch.tensor(x, device=dev) for x in (view, intr, cam))
        tg = torch.tensor(g, device=dev)
        sync = torch.cuda.synchronize if dev == "cuda" else None

        def t_fwd() -> Any:
            with torch.no_grad():
                return torch_render(torch, tp, tv, ti, tc, w, h)

        def t_bwd() -> None:
            for v in tp.values():
                v.grad = None
            (torch_render(torch, tp, tv, ti, tc, w, h) * tg).sum().backward()
        res["torch_image_max_abs_diff"] = float(np.abs(t_fwd().cpu().numpy() - image).max())
        res["torch_forward_s"] = timed(t_fwd, sync)
        res["torch_fwd_bwd_s"] = timed(t_bwd, sync)
        res["ratio_forward_rlx_over_torch"] = res["rlx_forward_s"] / res["torch_forward_s"]
        res["ratio_fwd_bwd_rlx_over_torch"] = res["rlx_fwd_bwd_s"] / res["torch_fwd_bwd_s"]
    try:
        import gsplat  # noqa: F401

        res["gsplat"] = "importable (not wired into this run yet)"
    except ImportError:
        res["gsplat"] = "not installed"
    print(json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in res.items()}, indent=2))



if __name__ == "__main__":
    main()
