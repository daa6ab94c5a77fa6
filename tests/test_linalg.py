"""Linear algebra ops on the CPU backend against SciPy and NumPy: CSR products and loaders, CG and
BiCGSTAB with the same iterations and tolerance as SciPy's, the sparse direct solve, the dense
factorizations, and the gradients of solve, cholesky and eigh by central finite differences."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.autodiff import grad, jvp
from rlx_core.errors import DispatchError, InputError, SerializationError
from rlx_core.plugin import evaluate
from rlx_core.sparse import CSR, cg, load, spmm, spmv, to_dense
from rlx_core.sparse import add as sparse_add
from rlx_core.sparse import bicgstab as sparse_bicgstab
from rlx_core.sparse import solve as sparse_solve

sp = pytest.importorskip("scipy.sparse")
spla = pytest.importorskip("scipy.sparse.linalg")
sla = pytest.importorskip("scipy.linalg")


@pytest.fixture(scope="module")
def cpu() -> Session:
    return Session("cpu")


def poisson2d(k: int) -> Any:
    """The 5-point Laplacian on a k x k grid (k^2 rows), as a SciPy CSR array."""
    t = sp.diags_array([-1.0, 2.0, -1.0], offsets=[-1, 0, 1], shape=(k, k))
    eye = sp.eye_array(k)
    return (sp.kron(eye, t) + sp.kron(t, eye)).tocsr()


def _run(cpu: Session, build: Callable[[GraphBuilder], Any],
         feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    g = GraphBuilder("t")
    outs = build(g)
    for i, o in enumerate(outs if isinstance(outs, (tuple, list)) else (outs,)):
        g.output(o, f"out{i}")
    return dict(cpu.compile(g.build()).run(feed))


# -- CSR and its loaders -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
@pytest.mark.parametrize("k", [7, 300])  # NumPy path and Numba path (>= 16384 entries)
def test_spmv_spmm_match_scipy(cpu: Session, dtype: Any, k: int) -> None:
    rng = np.random.default_rng(k)
    m = sp.random_array((k, k + 3), density=0.3, rng=rng, format="csr").astype(dtype)
    if np.dtype(dtype).kind == "c":
        m = (m + 1j * m).astype(dtype)
    a = CSR.from_scipy(m)
    x = rng.standard_normal(k + 3).astype(dtype)
    xm = rng.standard_normal((k + 3, 4)).astype(dtype)

    def build(g: GraphBuilder) -> Any:
        op = a.inputs(g, "A")
        return (spmv(g, op, g.input("x", a.dtype, x.shape)), spmm(g, op, g.input("xm", a.dtype, xm.shape)),
                to_dense(g, op))
    out = _run(cpu, build, {**a.feed("A"), "x": x, "xm": xm})
    tol = 1e-5 if np.dtype(dtype).itemsize <= 8 else 1e-12
    np.testing.assert_allclose(out["out0"], m @ x, rtol=tol, atol=tol)
    np.testing.assert_allclose(out["out1"], m @ xm, rtol=tol, atol=tol)
    np.testing.assert_array_equal(out["out2"], m.toarray())


def test_csr_add_and_scale(cpu: Session) -> None:
    rng = np.random.default_rng(1)
    ma = sp.random_array((30, 20), density=0.2, rng=rng, format="csr")
    mb = sp.random_array((30, 20), density=0.2, rng=rng, format="csr")
    a, b = CSR.from_scipy(ma), CSR.from_scipy(mb)

    def build(g: GraphBuilder) -> Any:
        s = sparse_add(g, a.inputs(g, "A"), b.inputs(g, "B"))
        return (*s[:3], to_dense(g, s))
    out = _run(cpu, build, {**a.feed("A"), **b.feed("B")})
    assert out["out1"].size == a.nnz + b.nnz
    np.testing.assert_allclose(out["out3"], (ma + mb).toarray(), rtol=1e-15)
    np.testing.assert_allclose(a.scale(2.5).to_dense(), 2.5 * ma.toarray())


def test_from_dense_and_matrix_market(tmp_path: Path) -> None:
    import scipy.io

    rng = np.random.default_rng(2)
    d = np.where(rng.random((6, 5)) < 0.4, rng.standard_normal((6, 5)), 0.0)
    a = CSR.from_dense(d)
    assert a.nnz == np.count_nonzero(d) and a.indptr.dtype == np.int32
    np.testing.assert_array_equal(a.to_dense(), d)
    np.testing.assert_array_equal(a.to_scipy().toarray(), d)
    # Files SciPy writes: general real, symmetric, and a dense array.
    s = sp.random_array((8, 8), density=0.3, rng=rng, format="coo")
    sym = (s + s.T).tocoo()
    for name, m in [("gen.mtx", s), ("sym.mtx", sym)]:
        scipy.io.mmwrite(tmp_path / name, m, symmetry="symmetric" if name == "sym.mtx" else "general")
        np.testing.assert_allclose(load(tmp_path / name).to_dense(), m.toarray(), rtol=1e-15)
    scipy.io.mmwrite(tmp_path / "dense.mtx", d)
    np.testing.assert_allclose(CSR.read_matrix_market(tmp_path / "dense.mtx").to_dense(), d, rtol=1e-15)
    text = ("%%MatrixMarket matrix coordinate pattern skew-symmetric\n% a comment\n3 3 2\n2 1\n3 2\n")
    np.testing.assert_array_equal(load(io.StringIO(text)).to_dense(),
                                  [[0, -1, 0], [1, 0, -1], [0, 1, 0]])
    herm = "%%MatrixMarket matrix coordinate complex hermitian\n2 2 2\n1 1 2 0\n2 1 1 1\n"
    np.testing.assert_array_equal(load(io.StringIO(herm)).to_dense(), [[2, 1 - 1j], [1 + 1j, 0]])
    for bad in ("%%MatrixMarket matrix coordinate real general\n2 2 1\n3 1 1.0\n",
                "%%MatrixMarket tensor coordinate real general\n2 2 0\n",
                "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1.0\n"):
        with pytest.raises(SerializationError):
            load(io.StringIO(bad))


def test_broken_csr_is_an_input_error(cpu: Session) -> None:
    for n in (6, 200):  # NumPy and Numba paths
        a = CSR.from_dense(np.eye(n))
        g = GraphBuilder("bad")
        g.output(spmv(g, a.inputs(g, "A"), g.input("x", "f64", (n,))), "y")
        exe = cpu.compile(g.build())
        bad_cols = a.indices.copy()
        bad_cols[-1] = n + 5
        with pytest.raises(InputError):
            exe.run({**a.feed("A"), "A_indices": bad_cols, "x": np.ones(n)})
        bad_ptr = a.indptr.copy()
        bad_ptr[1] = n + 100
        with pytest.raises(InputError):
            exe.run({**a.feed("A"), "A_indptr": bad_ptr, "x": np.ones(n)})


# -- iterative and direct sparse solvers -------------------------------------------------------

def _solver(cpu: Session, op: Callable[..., Any], a: CSR, b: np.ndarray, **attrs: Any) -> np.ndarray:
    return _run(cpu, lambda g: op(g, a.inputs(g, "A"), g.input("b", a.dtype, b.shape), **attrs),
                {**a.feed("A"), "b": b})["out0"]


@pytest.mark.parametrize("precond", ["none", "jacobi"])
def test_cg_matches_scipy_iterations_and_tolerance(cpu: Session, precond: str) -> None:
    m = poisson2d(40)  # 1600 rows
    if precond == "jacobi":
        m = (m + sp.diags_array(np.linspace(0.0, 3.0, m.shape[0]))).tocsr()  # a diagonal worth scaling
    rng = np.random.default_rng(3)
    b = rng.standard_normal(m.shape[0])
    tol = 1e-8
    its = [0]

    def count(xk: Any) -> None:
        its[0] += 1
    kw: dict[str, Any] = {}
    if precond == "jacobi":
        kw["M"] = sp.diags_array(1.0 / m.diagonal())
    want, info = spla.cg(m, b, rtol=tol, atol=0.0, maxiter=1000, callback=count, **kw)
    assert info == 0
    a = CSR.from_scipy(m)
    got = _solver(cpu, cg, a, b, tol=tol, max_iter=1000, precond=precond)
    assert np.linalg.norm(b - m @ got) <= tol * np.linalg.norm(b)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9 * np.abs(want).max())
    # Same iteration count: one iteration fewer must not yet meet the tolerance.
    short = _solver(cpu, cg, a, b, tol=0.0, max_iter=its[0] - 1, precond=precond)
    assert np.linalg.norm(b - m @ short) > tol * np.linalg.norm(b)
    ref = evaluate(_graph_of(a, b, "cg", tol=tol, max_iter=1000, precond=precond), {**a.feed("A"), "b": b})
    np.testing.assert_allclose(got, ref["x"], rtol=1e-9, atol=1e-12)


def _graph_of(a: CSR, b: np.ndarray, op: str, **attrs: Any) -> Any:
    g = GraphBuilder("solver")
    m = a.inputs(g, "A")
    g.output(g.op(op, m.indptr, m.indices, m.values, g.input("b", a.dtype, b.shape), shape=a.shape, **attrs),
             "x")
    return g.build()


def test_cg_f32_and_threads_deterministic(cpu: Session) -> None:
    m = poisson2d(120)  # 14400 rows: several blocks, split over the threads
    a = CSR.from_scipy(m).astype("f32")
    b = np.random.default_rng(4).standard_normal(m.shape[0]).astype(np.float32)
    x1 = _solver(cpu, cg, a, b, tol=1e-5, max_iter=2000)
    x2 = _solver(cpu, cg, a, b, tol=1e-5, max_iter=2000)
    np.testing.assert_array_equal(x1, x2)
    assert x1.dtype == np.float32
    assert np.linalg.norm(b - m @ x1.astype(np.float64)) <= 2e-5 * np.linalg.norm(b)


def test_bicgstab_and_sparse_solve_match_scipy(cpu: Session) -> None:
    rng = np.random.default_rng(5)
    n = 500
    m = (poisson2d(int(np.sqrt(n)) + 1)[:n, :n] + sp.random_array((n, n), density=0.002, rng=rng)).tocsr()
    b = rng.standard_normal(n)
    exact = spla.spsolve(m.tocsc(), b)
    for precond in ("none", "jacobi"):
        got = _solver(cpu, sparse_bicgstab, CSR.from_scipy(m), b, tol=1e-10, max_iter=2000, precond=precond)
        np.testing.assert_allclose(got, exact, rtol=1e-7, atol=1e-7 * np.abs(exact).max())
        want, info = spla.bicgstab(m, b, rtol=1e-10, atol=0.0, maxiter=2000)
        assert info == 0
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(exact).max())
    got = _solver(cpu, lambda g, op, bb: sparse_solve(g, op, bb), CSR.from_scipy(m), b)
    np.testing.assert_allclose(got, exact, rtol=1e-10, atol=1e-12)


# -- dense -------------------------------------------------------------------------------------

def _dense(cpu: Session, op: str, *arrays: np.ndarray, n_out: int = 1) -> list[np.ndarray]:
    def build(g: GraphBuilder) -> Any:
        ins = [g.input(f"i{k}", str(a.dtype).replace("float", "f"), a.shape) for k, a in enumerate(arrays)]
        return g.op(op, *ins)
    out = _run(cpu, build, {f"i{k}": a for k, a in enumerate(arrays)})
    return [out[f"out{i}"] for i in range(n_out)]


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 2e-4)])
def test_dense_factorizations_match_numpy_scipy(cpu: Session, dtype: Any, tol: float) -> None:
    rng = np.random.default_rng(6)
    n = 64
    a = (rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)).astype(dtype)
    spd = (a @ a.T / n + np.eye(n)).astype(dtype)
    b = rng.standard_normal((n, 3)).astype(dtype)
    (x,) = _dense(cpu, "solve", a, b)
    np.testing.assert_allclose(x, np.linalg.solve(a.astype(np.float64), b), rtol=tol, atol=tol)
    (lo,) = _dense(cpu, "cholesky", spd)
    np.testing.assert_allclose(lo, np.linalg.cholesky(spd.astype(np.float64)), rtol=tol, atol=tol)
    p, l2, u = _dense(cpu, "lu", a, n_out=3)
    sp_p, sp_l, sp_u = sla.lu(a.astype(np.float64))
    np.testing.assert_array_equal(p, sp_p)
    np.testing.assert_allclose(l2, sp_l, rtol=tol, atol=tol)
    np.testing.assert_allclose(u, sp_u, rtol=tol, atol=tol * n)
    tall = rng.standard_normal((n + 10, n)).astype(dtype)
    q, r = _dense(cpu, "qr", tall, n_out=2)
    np.testing.assert_allclose(q @ r, tall, rtol=tol, atol=tol * 10)
    assert (np.diag(r) >= 0).all()
    nq, nr = np.linalg.qr(tall.astype(np.float64))
    np.testing.assert_allclose(np.abs(r), np.abs(nr), rtol=tol, atol=tol * 10)
    w, v = _dense(cpu, "eigh", spd, n_out=2)
    nw, nv = np.linalg.eigh(spd.astype(np.float64))
    np.testing.assert_allclose(w, nw, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.abs(v.T @ nv), np.eye(n), atol=100 * tol)  # same vectors up to sign
    uu, s, vh = _dense(cpu, "svd", tall, n_out=3)
    s_ref = np.linalg.svd(tall.astype(np.float64), compute_uv=False)
    np.testing.assert_allclose(s, s_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose((uu * s) @ vh, tall, rtol=tol, atol=tol * 10)
    (ls,) = _dense(cpu, "lstsq", tall, b[:1].repeat(n + 10, 0)[:, 0].copy())
    np.testing.assert_allclose(ls, np.linalg.lstsq(tall.astype(np.float64), b[:1].repeat(n + 10, 0)[:, 0],
                                                   rcond=None)[0], rtol=10 * tol, atol=10 * tol)


def test_cholesky_of_an_indefinite_matrix_is_an_input_error(cpu: Session) -> None:
    with pytest.raises(InputError):
        _dense(cpu, "cholesky", np.array([[1.0, 2.0], [2.0, 1.0]]))


def test_other_backends_refuse_clearly() -> None:
    g = GraphBuilder("sparse")
    a = CSR.from_dense(np.eye(3))
    g.output(spmv(g, a.inputs(g, "A"), g.input("x", "f64", (3,))), "y")
    try:
        s = Session("whole")
    except Exception:
        pytest.skip("the test-only whole-program backend is not installed")
    with pytest.raises(DispatchError, match="spmv"):
        s.compile(g.build())


# -- gradients ---------------------------------------------------------------------------------

def _fd_check(build: Callable[[GraphBuilder, Any], Any], x0: np.ndarray, sym: bool = False,
              seed: int = 0) -> None:
    """d loss / d x from ``grad`` (reverse) and ``jvp`` (forward) on the CPU against central
    differences of the float64 reference; ``sym`` perturbs symmetrically (inputs read as symmetric)."""
    rng = np.random.default_rng(seed)
    g = GraphBuilder("fd")
    x = g.input("x", "f64", x0.shape)
    g.output(build(g, x), "loss")
    graph = g.build()
    cpu = Session("cpu")
    dg = grad(graph, "loss", "x")
    gx = cpu.compile(dg).run({"x": x0})["grad_x"]

    def loss(v: np.ndarray) -> float:
        return float(evaluate(graph, {"x": v})["loss"])
    d = rng.standard_normal(x0.shape)
    if sym:
        d = d + np.swapaxes(d, -1, -2)
    eps = 1e-6
    fd = (loss(x0 + eps * d) - loss(x0 - eps * d)) / (2 * eps)
    assert np.sum(gx * d) == pytest.approx(fd, rel=1e-6, abs=1e-8)
    fwd = jvp(graph, "x")
    t = cpu.compile(fwd).run({"x": x0, "tangent_x": d})
    assert float(t["tangent_loss"]) == pytest.approx(fd, rel=1e-6, abs=1e-8)


def _weights(g: GraphBuilder, shape: tuple[int, ...], seed: int) -> Any:
    return g.const(np.random.default_rng(seed).standard_normal(shape), "f64")


def test_solve_gradients() -> None:
    rng = np.random.default_rng(7)
    a0 = rng.standard_normal((4, 4)) + 4 * np.eye(4)
    b = rng.standard_normal((4, 2))
    _fd_check(lambda g, x: g.op("reduce_sum", g.op("solve", x, g.const(b, "f64")) * _weights(g, (4, 2), 1),
                                axes=None), a0)
    _fd_check(lambda g, x: g.op("reduce_sum", g.op("solve", g.const(a0, "f64"), x) * _weights(g, (4, 2), 2),
                                axes=None), b)
    v = rng.standard_normal(4)
    _fd_check(lambda g, x: g.op("reduce_sum", g.op("solve", x, g.const(v, "f64")) * _weights(g, (4,), 3),
                                axes=None), a0)


def test_cholesky_gradients() -> None:
    rng = np.random.default_rng(8)
    m = rng.standard_normal((5, 5))
    spd = m @ m.T + 5 * np.eye(5)
    _fd_check(lambda g, x: g.op("reduce_sum", g.op("cholesky", x) * _weights(g, (5, 5), 4), axes=None),
              spd, sym=True)
    batched = np.stack([spd, spd + np.eye(5)])
    _fd_check(lambda g, x: g.op("reduce_sum", g.op("cholesky", x) * _weights(g, (2, 5, 5), 5), axes=None),
              batched, sym=True)


def test_eigh_gradients() -> None:
    rng = np.random.default_rng(9)
    q, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    a0 = q @ np.diag([-2.0, -0.5, 1.0, 2.5, 4.0]) @ q.T
    a0 = (a0 + a0.T) / 2

    def loss(g: GraphBuilder, x: Any) -> Any:
        w, v = g.op("eigh", x)
        return g.op("reduce_sum", w * _weights(g, (5,), 6), axes=None) + \
            g.op("reduce_sum", v * _weights(g, (5, 5), 7), axes=None)
    _fd_check(loss, a0, sym=True)


def test_non_differentiable_ops_say_so() -> None:
    g = GraphBuilder("nd")
    x = g.input("x", "f64", (3, 3))
    q, r = g.op("qr", x)
    g.output(g.op("reduce_sum", r, axes=None), "loss")
    with pytest.raises(Exception, match="qr"):
        grad(g.build(), "loss", "x")
