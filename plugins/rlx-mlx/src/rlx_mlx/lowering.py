"""The lowering: a compiled RLX program becomes ONE Python function over ``mlx.core`` ops.

Each LIR step maps to a few MLX calls, bound to its attributes and static types at compile time.
The function is traced once by ``mx.compile`` (MLX fuses elementwise chains and replays the
graph), runs lazily, and is evaluated with one ``mx.eval`` over the outputs. Inputs and outputs
cross as NumPy arrays; weights are uploaded once.

Imported only by ``rlx_compile``: it imports MLX at module level.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from rlx_core.plugin import Attrs, DType, TensorType, normalize_axis, slice_params

Fn = Callable[..., Any]
#: builder(attrs, input types, output type) -> the step's function over mx.arrays
Builder = Callable[[Attrs, Sequence[TensorType], TensorType], Fn]

MX: dict[DType, Any] = {
    DType.F16: mx.float16, DType.BF16: mx.bfloat16, DType.F32: mx.float32, DType.F64: mx.float64,
    DType.C64: mx.complex64, DType.I8: mx.int8, DType.I16: mx.int16, DType.I32: mx.int32,
    DType.I64: mx.int64, DType.U8: mx.uint8, DType.U16: mx.uint16, DType.U32: mx.uint32,
    DType.U64: mx.uint64, DType.BOOL: mx.bool_,
}

# MLX evaluates on a per-process scheduler; two sessions' programs run from two threads would
# share its streams, so runs are serialised (the runtime already never runs one program twice
# at once).
_LOCK = threading.Lock()


def to_mx(a: np.ndarray, dtype: DType) -> Any:
    # np.ascontiguousarray would turn a 0-d array into shape (1,); require() keeps the rank.
    a = np.require(a, dtype=dtype.np, requirements="C")
    if dtype == DType.BF16:
        # ml_dtypes' bfloat16 has no buffer-protocol format MLX understands: move the bits.
        return mx.array(a.view(np.uint16)).view(mx.bfloat16)
    # The dtype is explicit: MLX would otherwise store a float64 NumPy array as float32.
    return mx.array(a, dtype=MX[dtype])


def to_np(a: Any, dtype: DType) -> np.ndarray:
    if dtype == DType.BF16:
        return np.array(a.view(mx.uint16)).view(dtype.np)
    return np.array(a, dtype=dtype.np)


def _ints(v: Any) -> list[int]:
    """A static shape or an ints attribute as plain ints (programs reaching rlx_compile are
    specialised: no symbolic dims are left)."""
    return [int(d) for d in v]


def _axes(attrs: Attrs, rank: int) -> list[int]:
    axes = attrs["axes"]
    if axes is None:
        return list(range(rank))
    return sorted({normalize_axis(a, rank) for a in _ints(axes)})


def _fixed(f: Fn) -> Builder:
    return lambda attrs, ins, out: f


def _sign(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    if ins[0].dtype.is_float:
        # mx.sign(NaN) is 0; the reference (and IEEE) keeps NaN.
        return lambda x: mx.where(mx.isnan(x), x, mx.sign(x))
    return mx.sign


def _div(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    if not ins[0].dtype.is_int:
        return mx.divide

    if not ins[0].dtype.is_signed:
        # Unsigned: floor and truncation agree; a zero divisor gives 0 as in the reference.
        def uint_div(a: Any, b: Any) -> Any:
            zero = mx.equal(b, 0)
            q = mx.floor_divide(a, mx.where(zero, mx.ones_like(b), b))
            return mx.where(zero, mx.zeros_like(q), q)
        return uint_div

    def int_div(a: Any, b: Any) -> Any:
        # C semantics (truncate toward zero) from MLX's floor division: they differ by one where
        # the division is inexact and the signs differ. A zero divisor gives 0 as in the reference,
        # and -1 is a negation, so MIN / -1 wraps instead of trapping (SIGFPE).
        special = mx.logical_or(mx.equal(b, 0), mx.equal(b, -1))
        bs = mx.where(special, mx.ones_like(b), b)
        q = mx.floor_divide(a, bs)
        inexact = mx.not_equal(mx.subtract(a, mx.multiply(q, bs)), 0)
        fix = mx.logical_and(inexact, mx.not_equal(mx.less(a, 0), mx.less(bs, 0)))
        q = mx.where(fix, q + 1, q)
        q = mx.where(mx.equal(b, -1), mx.negative(a), q)
        return mx.where(mx.equal(b, 0), mx.zeros_like(q), q)
    return int_div


def _cast(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    src, dst = ins[0].dtype, out.dtype
    if dst == DType.BOOL:
        return lambda x: mx.not_equal(x, 0)
    if src == DType.C64 and dst != DType.C64:
        return lambda x: mx.real(x).astype(MX[dst])
    return lambda x: x.astype(MX[dst])


def _reduce(f: Fn, empty: float | None = None) -> Builder:
    def make(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
        axes = _axes(attrs, ins[0].rank)
        keep = bool(attrs["keepdims"])
        if not axes:
            return lambda x: x
        if empty is not None and any(int(ins[0].shape[a]) == 0 for a in axes):
            # Over nothing: the identity (MLX's product gives 0) or NaN for a mean (MLX 0.32's
            # f16 mean of an empty axis never returns on the CPU).
            shape, dt = [int(d) for d in out.shape], MX[out.dtype]
            fill: Any = empty
            if out.dtype == DType.C64 and empty != empty:
                fill = complex(empty, empty)  # NumPy's complex mean of nothing is nan+nanj
            return lambda x: mx.full(shape, fill, dtype=dt)
        return lambda x: f(x, axis=axes, keepdims=keep)
    return make


def _arg(f: Fn) -> Builder:
    def make(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
        ax = normalize_axis(attrs["axis"], ins[0].rank)  # type: ignore[arg-type]
        keep = bool(attrs["keepdims"])
        if out.numel() == 0:
            # MLX refuses an arg-reduction of an empty array even when the result is empty too.
            shape = [int(d) for d in out.shape]
            return lambda x: mx.zeros(shape, dtype=mx.int64)
        return lambda x: f(x, axis=ax, keepdims=keep)
    return make


def _matmul(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    if not ins[0].dtype.is_int:
        return mx.matmul

    def int_matmul(a: Any, b: Any) -> Any:
        # MLX's GEMM is floating-point only. Products and sums wrap modulo 2**bits in integer
        # arithmetic, so a broadcast multiply and a sum over K give the reference's wrapped result.
        a2 = mx.expand_dims(a, 0) if a.ndim == 1 else a
        b2 = mx.expand_dims(b, 1) if b.ndim == 1 else b
        r = mx.sum(mx.expand_dims(a2, -1) * mx.expand_dims(b2, -3), axis=-2)
        if a.ndim == 1:
            r = mx.squeeze(r, -2)
        if b.ndim == 1:
            r = mx.squeeze(r, -1)
        return r
    return int_matmul


def _reshape(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    shape = _ints(out.shape)
    return lambda x: mx.reshape(x, shape)


def _transpose(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    perm = attrs["perm"]
    p = list(range(ins[0].rank))[::-1] if perm is None else _ints(perm)
    return lambda x: mx.transpose(x, p)


def _expand(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    shape = _ints(out.shape)
    return lambda x: mx.broadcast_to(x, shape)


def _slice(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    shape = ins[0].shape
    idx: list[slice] = [slice(None)] * len(shape)
    for ax, sl in slice_params(attrs, shape):
        start, stop, step = sl.indices(int(shape[ax]))
        # `indices` gives concrete bounds; a reverse slice down to element 0 ends at -1, which MLX
        # (like Python) would read as "the last element": say "to the start" instead.
        idx[ax] = slice(start, None if stop < 0 else stop, step)
    key = tuple(idx)
    return lambda x: x[key] if key else x


def _concat(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    ax = normalize_axis(attrs["axis"], out.rank)  # type: ignore[arg-type]
    return lambda *xs: mx.concatenate(list(xs), axis=ax)


def _scalar(value: Any, dtype: DType) -> Any:
    """``value`` converted to ``dtype`` the way the reference's NumPy cast converts it."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.asarray(value).astype(dtype.np)
    if dtype == DType.BF16:
        return mx.array(float(v.astype(np.float32))).astype(mx.bfloat16)
    return mx.array(v.item(), dtype=MX[dtype])


def _pad(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    r = ins[0].rank
    pads: Any = attrs["pads"]
    widths = [(int(pads[i]), int(pads[i + r])) for i in range(r)]
    value = _scalar(attrs["value"], out.dtype)
    if r == 0 or not any(a or b for a, b in widths):
        return lambda x: x
    return lambda x: mx.pad(x, widths, constant_values=value)


def _index_guard(n: int) -> Callable[[Any], tuple[Any, Any]]:
    def guard(idx: Any) -> tuple[Any, Any]:
        # ONNX: [-n, n-1], a negative index counts from the end once; anything else never reaches
        # memory (MLX does not bounds-check take or scatter).
        i = mx.where(mx.less(idx, 0), idx + n, idx)
        ok = mx.logical_and(mx.greater_equal(i, 0), mx.less(i, n))
        return mx.where(ok, i, mx.zeros_like(i)), ok
    return guard


def _gather(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    rank = ins[0].rank
    ax = normalize_axis(attrs["axis"], rank)  # type: ignore[arg-type]
    n = int(ins[0].shape[ax])
    mask_shape = [1] * ax + _ints(ins[1].shape) + [1] * (rank - ax - 1)
    shape = _ints(out.shape)
    guard = _index_guard(n)
    if n == 0:
        return lambda x, idx: mx.zeros(shape, dtype=MX[out.dtype])

    def gather(x: Any, idx: Any) -> Any:
        safe, ok = guard(idx)
        got = mx.take(x, safe, axis=ax)
        return mx.where(mx.reshape(ok, mask_shape), got, mx.zeros_like(got))  # out of range: 0
    return gather


def _scatter_add(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    rank = ins[0].rank
    ax = normalize_axis(attrs["axis"], rank)  # type: ignore[arg-type]
    ishape = _ints(ins[1].shape)
    guard = _index_guard(int(ins[0].shape[ax]))
    if 0 in ishape:
        return lambda x, idx, upd: x

    def scatter_add(x: Any, idx: Any, upd: Any) -> Any:
        safe, ok = guard(idx)
        # ONNX ScatterElements: position p of `updates` lands at p with axis `ax` replaced by
        # indices[p]; duplicates add up (`.at[].add` accumulates). Out of range: update skipped.
        grids = [mx.reshape(mx.arange(d), [d if j == i else 1 for j in range(rank)])
                 for i, d in enumerate(ishape)]
        grids[ax] = safe
        return x.at[tuple(grids)].add(mx.where(ok, upd, mx.zeros_like(upd)))
    return scatter_add


def _iota(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    shape = [int(d) for d in out.shape]
    dt = MX[out.dtype]
    if not shape:
        return lambda: mx.zeros((), dtype=dt)
    ax = normalize_axis(attrs["axis"], len(shape))  # type: ignore[arg-type]
    view = [shape[ax] if i == ax else 1 for i in range(len(shape))]
    return lambda: mx.broadcast_to(mx.reshape(mx.arange(shape[ax]), view).astype(dt), shape)


def _conv2d(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    sh, sw = _ints(attrs["strides"])
    pt, pl, pb, pr = _ints(attrs["pads"])
    dh, dw = _ints(attrs["dilations"])
    g = int(attrs["groups"])  # type: ignore[arg-type]

    def conv(x: Any, w: Any) -> Any:
        # MLX convolves channels-last (x NHWC, w OHWI); asymmetric padding is (low, high) pairs.
        y = mx.conv_general(mx.transpose(x, (0, 2, 3, 1)), mx.transpose(w, (0, 2, 3, 1)),
                            stride=(sh, sw), padding=([pt, pl], [pb, pr]),
                            kernel_dilation=(dh, dw), groups=g)
        return mx.transpose(y, (0, 3, 1, 2))
    return conv


def _cumsum(attrs: Attrs, ins: Sequence[TensorType], out: TensorType) -> Fn:
    excl, rev = bool(attrs["exclusive"]), bool(attrs["reverse"])
    if ins[0].rank == 0:
        return (lambda x: mx.zeros_like(x)) if excl else (lambda x: x)
    ax = normalize_axis(attrs["axis"], ins[0].rank)  # type: ignore[arg-type]
    return lambda x: mx.cumsum(x, axis=ax, reverse=rev, inclusive=not excl)


BUILDERS: dict[str, Builder] = {
    # elementwise
    "neg": _fixed(mx.negative), "abs": _fixed(mx.abs), "sign": _sign, "exp": _fixed(mx.exp),
    "log": _fixed(mx.log), "sqrt": _fixed(mx.sqrt), "rsqrt": _fixed(mx.rsqrt),
    "reciprocal": _fixed(mx.reciprocal), "sin": _fixed(mx.sin), "cos": _fixed(mx.cos),
    "tanh": _fixed(mx.tanh), "sigmoid": _fixed(mx.sigmoid), "erf": _fixed(mx.erf),
    "floor": _fixed(mx.floor), "ceil": _fixed(mx.ceil), "round": _fixed(mx.round),
    "logical_not": _fixed(mx.logical_not),
    "add": _fixed(mx.add), "sub": _fixed(mx.subtract), "mul": _fixed(mx.multiply), "div": _div,
    "pow": _fixed(mx.power), "maximum": _fixed(mx.maximum), "minimum": _fixed(mx.minimum),
    "logical_and": _fixed(mx.logical_and), "logical_or": _fixed(mx.logical_or),
    "logical_xor": _fixed(mx.not_equal),
    "equal": _fixed(mx.equal), "not_equal": _fixed(mx.not_equal), "less": _fixed(mx.less),
    "less_equal": _fixed(mx.less_equal), "greater": _fixed(mx.greater),
    "greater_equal": _fixed(mx.greater_equal), "where": _fixed(mx.where), "cast": _cast,
    # reductions
    "reduce_sum": _reduce(mx.sum, 0), "reduce_prod": _reduce(mx.prod, 1),
    "reduce_mean": _reduce(mx.mean, float("nan")),
    "reduce_max": _reduce(mx.max), "reduce_min": _reduce(mx.min),
    "argmax": _arg(mx.argmax), "argmin": _arg(mx.argmin),
    # linear algebra, movement, indexing
    "matmul": _matmul, "reshape": _reshape, "transpose": _transpose, "expand": _expand,
    "slice": _slice, "concat": _concat, "pad": _pad, "gather": _gather,
    "scatter_add": _scatter_add, "iota": _iota, "conv2d": _conv2d, "cumsum": _cumsum,
}


def _typed(r: Any, dts: Sequence[Any]) -> list[Any]:
    """A step's results in the RLX output types: MLX promotes (int8 sums to int32, argmax to
    uint32), and casting back wraps exactly as the reference does."""
    rs = r if isinstance(r, (list, tuple)) else [r]
    return [v if v.dtype == dt else v.astype(dt) for v, dt in zip(rs, dts)]


class MlxProgram:
    """One compiled RLX program: a function of MLX ops over (inputs, weights), traced once."""

    def __init__(self, program: Any, device: Any, use_compile: bool,
                 builders: Mapping[str, Builder] = BUILDERS) -> None:
        g = program.graph
        self._device = device
        self._inputs = [(v.name, g.types[v.name].dtype) for v in program.inputs]
        params = [p.name for p in g.params]
        self._weights = [to_mx(np.asarray(g.weights[p]), g.types[p].dtype) for p in params]
        const = dict(zip(params, self._weights))
        steps: list[tuple[Fn, tuple[str, ...], tuple[str, ...], list[Any]]] = []
        for s in program.kernels:
            ins = [g.types[i] for i in s.inputs]
            outs = [g.types[o] for o in s.outputs]
            fn = builders[s.op](s.attrs, ins, outs[0])
            dts = [MX[t.dtype] for t in outs]
            if s.inputs and all(i in const for i in s.inputs):
                # A step of weights only (linear's transpose(w), casts of constants) runs once,
                # here, and its contiguous result becomes a weight: MLX would redo it every run.
                with mx.stream(device):
                    r = _typed(fn(*[const[i] for i in s.inputs]), dts)
                    for name, val in zip(s.outputs, r):
                        const[name] = mx.contiguous(val)
                    mx.eval([const[o] for o in s.outputs])
                continue
            steps.append((fn, s.inputs, s.outputs, dts))
        consts = list(const)
        self._weights = [const[n] for n in consts]
        names = [n for n, _ in self._inputs] + consts
        self.kernels: list[str] = [s.kernel for s in program.kernels]
        self._outputs = list(dict.fromkeys(v for _, v in program.outputs))
        self._out_types = [g.types[v].dtype for v in self._outputs]
        out_names = self._outputs

        def forward(*arrays: Any) -> list[Any]:
            env = dict(zip(names, arrays))
            for fn, i, o, dts in steps:
                env.update(zip(o, _typed(fn(*[env[k] for k in i]), dts)))
            return [env[k] for k in out_names]

        self._fn: Fn = mx.compile(forward) if use_compile else forward

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with _LOCK, mx.stream(self._device):
            arrays = [to_mx(np.asarray(inputs[n]), dt) for n, dt in self._inputs]
            outs = self._fn(*arrays, *self._weights)
            mx.eval(outs)
            return {n: to_np(a, dt) for n, a, dt in zip(self._outputs, outs, self._out_types)}

    def profile(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        # One traced function runs every step exactly once per call.
        return self.run(inputs), Counter(self.kernels)
