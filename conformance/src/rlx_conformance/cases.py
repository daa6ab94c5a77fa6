"""Op test generation and comparison with the float64 reference: the engine of conformance testing.

The pieces are backend-agnostic and meant to be reused by every backend's test suite:

* :func:`cases_for` / :func:`all_cases` turn op schemas into :class:`OpCase` objects: one node,
  concrete inputs and attributes, tagged with a *kind* (see :data:`KINDS`). Generation is driven by
  the schema (category, inputs, attributes, dtypes); the core ops get hand-written edge cases
  (broadcasting, empty and size-1 dims, negative axes and indices, NaN/Inf, integer wraparound),
  plugin ops get a generic smoke case. :func:`all_cases` defaults to the MIR ops;
  :func:`hir_cases` gives the HIR ops' (every attention mask kind, norms over several axes, pools
  with padding both ways, ...), whose tolerances allow for their decompositions (see
  :func:`tolerance`). Whole-model graph tests live in :mod:`rlx_conformance.graphs`.
* :func:`build_case_graph` makes the one-node :class:`~rlx_core.plugin.Graph` of a case.
* :func:`tolerance` and :func:`compare` define what "correct" means (documented on each).
* :func:`run_case` compiles a case on a :class:`~rlx_core.plugin.Session`, runs it, evaluates the
  reference and reports ``passed``/``failed``/``error`` plus the dispatch path taken.

Example::

    from rlx_core.plugin import Session
    from rlx_conformance.cases import all_cases, run_case

    session = Session("cpu", use_cache=False)
    bad = [r for r in (run_case(c, session) for c in all_cases()) if r.status != "passed"]

Inputs are generated deterministically: each case seeds ``np.random.default_rng`` with
``rng_seed + crc32(case.id)``, so a case id names the same arrays on every machine and run.
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_core.plugin import REGISTRY, REQUIRED, DType, Graph, OpSchema, RLXError, TensorType, normalize_axis

from .bitwise_cases import GENERATORS as BITWISE_GENERATORS
from .bounded_cases import GENERATORS as BOUNDED_GENERATORS
from .conv_cases import GENERATORS as CONV_GENERATORS
from .linalg_cases import GENERATORS as LINALG_GENERATORS
from .ops2_cases import GENERATORS as OPS2_GENERATORS
from .quant_cases import GENERATORS as QUANT_GENERATORS
from .recurrent_cases import GENERATORS as RECURRENT_GENERATORS
from .splat_cases import GENERATORS as SPLAT_GENERATORS

Shape = tuple[int, ...]
#: ``maker(rng, shape, dtype) -> array`` generates one operand in storage dtype.
ValueFn = Callable[[np.random.Generator, Shape, DType], np.ndarray]
#: A bound operand generator: everything but the case's random generator is fixed.
InputFn = Callable[[np.random.Generator], np.ndarray]

#: Case kinds. ``basic`` plain inputs; ``scalar`` rank-0 operands; ``size0`` a dim of size 0;
#: ``size1`` size-1 dims without broadcasting; ``broadcast`` operands of different shapes;
#: ``negative_axis`` axes/perm counted from the end; ``negative_index`` gather/scatter indices < 0;
#: ``noncontiguous`` a transposed or strided NumPy view is fed as input; ``large`` magnitudes near
#: the top of the dtype's range (results may overflow to Inf, as IEEE says); ``nan_inf`` NaN and
#: +-Inf operands; ``overflow`` integer operands at the ends of their range (results wrap);
#: ``out_of_range`` an index operand outside ONNX's ``[-n, n-1]``: the reference and the backend
#: must both raise InputError (``rlx_core.plugin.device_error``), not crash, give zeros or garbage.
KINDS: tuple[str, ...] = ("basic", "scalar", "size0", "size1", "broadcast", "negative_axis",
                          "negative_index", "noncontiguous", "large", "nan_inf", "overflow",
                          "out_of_range")


@dataclass(frozen=True, eq=False)
class OpCase:
    """One generated test: op ``op`` applied to ``inputs`` (graph input name, array) with ``attrs``.

    ``dtype`` is the dtype the case is generated for: the data operand's dtype, except for
    ``iota`` (its output dtype) and ``cast`` (its *source* dtype; the target is ``attrs["to"]``).
    Identity semantics (``eq=False``) because the fields hold NumPy arrays.
    """

    id: str
    op: str
    dtype: DType
    inputs: tuple[tuple[str, np.ndarray], ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "basic"

    def feed(self) -> dict[str, np.ndarray]:
        """The inputs as the ``{name: array}`` mapping ``Executable.run`` takes."""
        return dict(self.inputs)


@dataclass(frozen=True)
class CaseResult:
    """The outcome of :func:`run_case`. ``path`` is the dispatch path (``native``, ``common_ir``,
    ``rewritten``; comma-joined if a backend split the node), empty if compilation failed."""

    case_id: str
    op: str
    dtype: DType
    kind: str
    status: str  # "passed" | "failed" | "error"
    message: str = ""
    path: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "passed"


# ---------------------------------------------------------------------------------------------
# Value generators. Each returns an array already in storage dtype, so the reference and the
# backend see bit-identical operands.

#: Magnitudes for ``large`` cases: big but finite in the dtype (f16 tops out at 65504).
LARGE: Mapping[DType, float] = {DType.F16: 1e4, DType.BF16: 1e30, DType.F32: 1e30, DType.F64: 1e300,
                                DType.C64: 1e30}
#: IEEE special values (and the ordinary values they interact with) for ``nan_inf`` cases.
SPECIALS: tuple[float, ...] = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0)


def _to(x: Any, dt: DType) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dt.np)


def _ints(rng: np.random.Generator, shape: Shape, dt: DType, lo: int, hi: int) -> np.ndarray:
    info = np.iinfo(dt.np)
    return rng.integers(max(lo, int(info.min)), min(hi, int(info.max)), size=shape, endpoint=True,
                        dtype=dt.np)


def _uniform(rng: np.random.Generator, shape: Shape, dt: DType, lo: float, hi: float,
             ilo: int = -20, ihi: int = 20) -> np.ndarray:
    """Floats uniform in [lo, hi] (both parts for complex), ints in [ilo, ihi] clipped to range."""
    if dt.is_bool:
        return rng.random(shape) < 0.5
    if dt.is_int:
        return _ints(rng, shape, dt, ilo, ihi)
    if dt.is_complex:
        return _to(rng.uniform(lo, hi, shape) + 1j * rng.uniform(lo, hi, shape), dt)
    return _to(rng.uniform(lo, hi, shape), dt)


def _signs(rng: np.random.Generator, shape: Shape) -> np.ndarray:
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def v_default(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """O(1) values: floats in [-2, 2], ints in [-20, 20] (u8 [0, 20]), random bools."""
    return _uniform(rng, shape, dt, -2.0, 2.0)


def v_positive(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Strictly positive (log, sqrt, rsqrt, pow base); complex values get a positive real part."""
    if dt.is_complex:
        return _to(rng.uniform(0.25, 2.0, shape) + 1j * rng.uniform(-1.0, 1.0, shape), dt)
    return _uniform(rng, shape, dt, 0.25, 4.0, 1, 20)


def v_nonzero(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Magnitude in [0.5, 2] (ints [1, 9]) with a random sign: safe divisors."""
    if dt.is_int:
        mag = _ints(rng, shape, dt, 1, 9)
        return mag if not dt.is_signed else _to(mag * _signs(rng, shape), dt)
    x = rng.uniform(0.5, 2.0, shape) * _signs(rng, shape)
    if dt.is_complex:
        x = x + 1j * rng.uniform(-1.0, 1.0, shape)
    return _to(x, dt)


def v_unit(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Factors near magnitude 1 so products of a few dozen stay finite (ints: +-1, +-2)."""
    if dt.is_int:
        choices = [-2, -1, 1, 2] if dt.is_signed else [1, 2, 3]
        return _to(rng.choice(choices, size=shape), dt)
    x = rng.uniform(0.5, 1.5, shape) * _signs(rng, shape)
    if dt.is_complex:
        x = x + 1j * rng.uniform(-0.5, 0.5, shape)
    return _to(x, dt)


def v_ties(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Small integers (exact in every dtype) so comparisons and argmax see equal elements."""
    if dt.is_bool:
        return rng.random(shape) < 0.5
    x = rng.integers(0 if not dt.is_signed else -2, 3, size=shape).astype(np.float64)
    if dt.is_complex:
        x = x + 1j * rng.integers(-1, 2, size=shape)
    return _to(x, dt)


def v_halves(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Multiples of 0.5 (exact in every float dtype): rounding ties for floor/ceil/round."""
    return _to(rng.integers(-10, 11, size=shape) / 2.0, dt)


def v_special(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """:data:`SPECIALS` cycled to ``shape`` in a seeded random order (all present when size >= 10)."""
    flat = np.resize(np.asarray(SPECIALS), max(math.prod(shape), 0))
    if flat.size >= len(SPECIALS):
        head, tail = flat[:len(SPECIALS)], rng.permutation(flat[len(SPECIALS):])
        flat = rng.permutation(np.concatenate([head, tail]))
    return _to(flat.reshape(shape), dt)


def v_large(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Values of magnitude in [LARGE/2, LARGE] with random signs."""
    return _to(LARGE[dt] * rng.uniform(0.5, 1.0, shape) * _signs(rng, shape), dt)


def v_large_pos(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Positive large values (positive-domain ops; sums without cancellation)."""
    return _to(LARGE[dt] * rng.uniform(0.5, 1.0, shape), dt)


def v_extreme(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Integers from the whole range, half of them the range ends (min, min+1, -1, 0, 1, max-1, max)."""
    info = np.iinfo(dt.np)
    lo, hi = int(info.min), int(info.max)
    ends = np.array(sorted(v for v in {lo, lo + 1, -1, 0, 1, hi - 1, hi} if lo <= v <= hi), dt.np)
    full = rng.integers(lo, hi, size=shape, endpoint=True, dtype=dt.np)
    pick = rng.choice(ends, size=shape)
    return np.where(rng.random(shape) < 0.5, pick, full).astype(dt.np)


def v_extreme_nonzero(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """:func:`v_extreme` with zeros replaced by -1 (1 for unsigned): divisors at the range ends."""
    x = v_extreme(rng, shape, dt)
    return np.where(x == 0, dt.np.type(-1 if dt.is_signed else 1), x).astype(dt.np)


def v_bool(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    return rng.random(shape) < 0.5


def fixed(values: Any) -> ValueFn:
    """A generator that ignores the rng and returns ``values`` in the requested dtype."""
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return _to(np.asarray(values).reshape(shape), dt)
    return make


# ---------------------------------------------------------------------------------------------
# Case assembly

class _Cases:
    """Collects cases for one (op, dtype); ``add`` derives the id, seeds the rng and makes arrays."""

    def __init__(self, op: str, dtype: DType, seed: int) -> None:
        self.op, self.dtype, self.seed = op, dtype, seed
        self.out: list[OpCase] = []
        self._ids: set[str] = set()

    def arr(self, fn: ValueFn, shape: Shape, dtype: DType | None = None, *, nc: bool = False) -> InputFn:
        """Bind a value generator; ``nc`` makes a non-contiguous view of the same shape and domain."""
        dt = dtype or self.dtype

        def make(rng: np.random.Generator) -> np.ndarray:
            if not nc:
                return fn(rng, shape, dt)
            if len(shape) >= 2:  # a transposed view: reversed strides
                return fn(rng, shape[::-1], dt).T
            return fn(rng, (2 * shape[0],), dt)[::2]  # every other element: stride 2
        return make

    def add(self, label: str, kind: str, inputs: Sequence[tuple[str, InputFn]],
            attrs: Mapping[str, Any] | None = None) -> None:
        assert kind in KINDS, kind
        cid = f"{self.op}[{self.dtype}]-{label}"
        assert cid not in self._ids, f"duplicate case id {cid}"
        self._ids.add(cid)
        rng = np.random.default_rng(self.seed + zlib.crc32(cid.encode()))
        arrays = tuple((name, make(rng)) for name, make in inputs)
        self.out.append(OpCase(cid, self.op, self.dtype, arrays, dict(attrs or {}), kind))


# -- elementwise -------------------------------------------------------------------------------

#: Value generators of the domains an op's schema names (``OpSchema.cases.domains``; values
#: outside an op's domain give NaN, which would test little).
DOMAINS: Mapping[str, ValueFn] = {"default": v_default, "positive": v_positive, "nonzero": v_nonzero,
                                  "halves": v_halves, "ties": v_ties, "bool": v_bool, "unit": v_unit}


def _domain(op: str, i: int) -> str:
    """The value domain of operand ``i`` of ``op`` from its schema's case spec ("default" if none)."""
    spec = REGISTRY.get(op).cases if op in REGISTRY else None
    return spec.domain(i) if spec is not None else "default"


def _gen_unary(c: _Cases) -> None:
    dt, op = c.dtype, c.op
    dom = _domain(op, 0)
    vf = DOMAINS[dom]
    c.add("basic", "basic", [("x", c.arr(vf, (3, 4)))])
    c.add("scalar", "scalar", [("x", c.arr(vf, ()))])
    c.add("size0", "size0", [("x", c.arr(vf, (0, 3)))])
    c.add("size1", "size1", [("x", c.arr(vf, (1, 4, 1)))])
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(vf, (3, 4), nc=True))])
    if vf is not v_default and not dt.is_bool:
        # The domain generator may be narrow (halves, ties); also cover generic values.
        c.add("values", "basic", [("x", c.arr(v_positive if dom == "positive" else v_default,
                                              (2, 5)))])
    if dt.is_float:
        c.add("nan_inf", "nan_inf", [("x", c.arr(v_special, (2, 5)))])
        c.add("large", "large", [("x", c.arr(v_large_pos if dom == "positive" else v_large,
                                             (3, 4)))])
    spec = REGISTRY.get(op).cases if op in REGISTRY else None
    if dt.is_int and spec is not None and spec.overflow:
        c.add("overflow", "overflow", [("x", c.arr(v_extreme, (3, 4)))])


#: u16/u32/u64 (opt-in dtypes, see rlx_core.dtypes.INT_DTYPES) get one case per layout kind, not
#: every layout: backends index them with the same code as the other dtypes, and the suite runs on
#: every plugin in CI. Their values (the overflow cases, the range ends) are covered in full.
_LEAN_BINARY = frozenset({"basic", "broadcast_rank", "scalar_rhs", "size0", "size1"})
_LEAN_REDUCTION = frozenset({"all", "axes02_keepdims", "axis_neg", "scalar", "size0_kept"})


def _lean(dt: DType) -> bool:
    return dt in (DType.U16, DType.U32, DType.U64)


def _gen_binary(c: _Cases) -> None:
    dt, op = c.dtype, c.op
    da, db = _domain(op, 0), _domain(op, 1)
    va, vb = DOMAINS[da], DOMAINS[db]
    if dt.is_bool:
        va = vb = v_bool
    shapes: list[tuple[str, str, Shape, Shape]] = [
        ("basic", "basic", (3, 4), (3, 4)),
        ("broadcast_row", "broadcast", (3, 4), (4,)),
        ("broadcast_outer", "broadcast", (3, 1), (1, 4)),
        ("broadcast_rank", "broadcast", (2, 1, 4), (3, 1)),
        ("broadcast_lhs", "broadcast", (4,), (2, 4)),
        ("scalar", "scalar", (), ()),
        ("scalar_rhs", "scalar", (3, 4), ()),
        ("scalar_lhs", "scalar", (), (2, 3)),
        ("size0", "size0", (0, 4), (4,)),
        ("size0_broadcast", "size0", (0, 1), (1, 3)),
        ("size1", "size1", (1, 4), (1, 1)),
    ]
    if _lean(dt):
        shapes = [s for s in shapes if s[0] in _LEAN_BINARY]
    for label, kind, sa, sb in shapes:
        c.add(label, kind, [("a", c.arr(va, sa)), ("b", c.arr(vb, sb))])
    c.add("noncontiguous", "noncontiguous", [("a", c.arr(va, (3, 4), nc=True)),
                                             ("b", c.arr(vb, (3, 4), nc=True))])
    if not _lean(dt):
        c.add("noncontiguous_1d", "noncontiguous", [("a", c.arr(va, (5,), nc=True)),
                                                    ("b", c.arr(vb, (5,), nc=True))])
    if da == db == "ties" and not dt.is_bool:
        # Ties and generic values both matter for comparisons; v_ties alone never sees fractions.
        c.add("values", "basic", [("a", c.arr(v_default, (3, 4))), ("b", c.arr(v_default, (3, 4)))])
    if dt.is_float:
        # Every ordered pair of special values: column vector against row vector.
        col = fixed(np.asarray(SPECIALS).reshape(-1, 1))
        row = fixed(np.asarray(SPECIALS).reshape(1, -1))
        n = len(SPECIALS)
        c.add("nan_inf", "nan_inf", [("a", c.arr(col, (n, 1))), ("b", c.arr(row, (1, n)))])
        # A positive-only base (pow) grows large alone: a large exponent would only overflow.
        la = v_large_pos if da == "positive" else v_large
        lb = v_default if da == "positive" else v_large
        c.add("large", "large", [("a", c.arr(la, (3, 4))), ("b", c.arr(lb, (3, 4)))])
    if dt.is_int:
        c.add("overflow", "overflow", [("a", c.arr(v_extreme, (4, 5))),
                                       ("b", c.arr(v_extreme_nonzero if db == "nonzero" else v_extreme,
                                                   (4, 5)))])


def _gen_where(c: _Cases) -> None:
    if c.dtype.is_lowp:
        c.add("broadcast", "broadcast", [("cond", c.arr(v_bool, (3, 1), DType.BOOL)),
                                         ("a", c.arr(v_lowp, (1, 40))), ("b", c.arr(v_lowp, (3, 40)))])
        return
    vf = v_bool if c.dtype.is_bool else v_default
    b = DType.BOOL
    layouts: list[tuple[str, str, Shape, Shape, Shape]] = [
        ("basic", "basic", (3, 4), (3, 4), (3, 4)),
        ("broadcast", "broadcast", (3, 1), (1, 4), ()),
        ("broadcast_rank", "broadcast", (4,), (2, 3, 4), (3, 1)),
        ("scalar", "scalar", (), (), ()),
        ("size0", "size0", (0, 4), (0, 4), (4,)),
        ("size1", "size1", (1, 1), (1, 3), (1, 3)),
    ]
    for label, kind, sc, sa, sb in layouts:
        c.add(label, kind, [("cond", c.arr(v_bool, sc, b)), ("a", c.arr(vf, sa)), ("b", c.arr(vf, sb))])
    c.add("noncontiguous", "noncontiguous", [("cond", c.arr(v_bool, (3, 4), b, nc=True)),
                                             ("a", c.arr(vf, (3, 4), nc=True)),
                                             ("b", c.arr(vf, (3, 4), nc=True))])
    if c.dtype.is_float:
        c.add("nan_inf", "nan_inf", [("cond", c.arr(v_bool, (2, 5), b)), ("a", c.arr(v_special, (2, 5))),
                                     ("b", c.arr(v_special, (2, 5)))])


def _cast_values(src: DType, to: DType) -> ValueFn:
    """Source values whose conversion to ``to`` is defined (no float->int out of range)."""
    if src.is_bool:
        return v_bool
    if to.is_bool:
        return fixed_choice([-1.0, 0.0, -0.0, 0.5, 1.0] if src.is_signed else [0.0, 1.0, 2.0])
    if to.is_int and not src.is_int:
        info = np.iinfo(to.np)
        lo, hi = max(-100.0, float(info.min)), min(100.0, float(info.max))
        return lambda rng, shape, dt: _uniform(rng, shape, dt, lo, hi)
    if src.is_int:
        return lambda rng, shape, dt: _uniform(rng, shape, dt, 0, 0, -100, 100)
    return v_default


def fixed_choice(values: Sequence[float]) -> ValueFn:
    """Elements drawn from ``values`` (complex sources get a zero imaginary part)."""
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return _to(rng.choice(np.asarray(values), size=shape), dt)
    return make


# -- low-precision storage types (float8, float4, int4, int2) ------------------------------------

#: The ops that take the low-precision types (rlx_core.dtypes.LOWP_DTYPES): ``cast`` both ways and
#: the movement ops, one case per op and type (72 in all). A backend moves their bytes like any
#: 1-byte type; what is specific to them, the rounding of a cast into them, gets every value.
_LOWP_OPS = frozenset({"cast", "transpose", "concat", "reshape", "slice", "gather", "where"})


def _lowp_values(dt: DType) -> np.ndarray:
    """Every value of a low-precision type, NaN included (each bit pattern once for the floats)."""
    if dt.is_float:
        return np.arange(1 << (8 * dt.itemsize if dt is not DType.F4E2M1 else 4), dtype=np.uint8).view(dt.np)
    lo, hi = {DType.I4: (-8, 7), DType.U4: (0, 15), DType.I2: (-2, 1), DType.U2: (0, 3)}[dt]
    return np.arange(lo, hi + 1).astype(dt.np)


def v_lowp(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Values drawn from every value of the low-precision type ``dt``."""
    return rng.choice(_lowp_values(dt), size=shape)


def _lowp_targets(to: DType) -> np.ndarray:
    """float32 values whose cast to ``to`` tests its rounding: each value of the type, the midpoints
    between neighbours (ties to even) and one float32 ulp either side of them, beyond the largest
    finite value, +-Inf, NaN, -0 and below the smallest subnormal; for int4/int2, fractions in the
    range (truncation toward zero)."""
    if to.is_int:
        v = _lowp_values(to).astype(np.float64)
        return np.concatenate([v, v + 0.25, v + 0.75, v - 0.5]).clip(v.min() - 0.75, v.max() + 0.75
                                                                      ).astype(np.float32)
    v = _lowp_values(to).astype(np.float64)
    v = np.unique(v[np.isfinite(v)])
    mid = ((v[1:] + v[:-1]) / 2).astype(np.float32)
    top = float(v.max())
    extra = np.array([top * 1.0625, top * 1.125, top * 2, -top * 1.5, 1e30, np.inf, -np.inf, np.nan,
                      -0.0, float(v[v > 0].min()) / 3], np.float32)
    return np.concatenate([v.astype(np.float32), mid, np.nextafter(mid, np.float32(np.inf)),
                           np.nextafter(mid, np.float32(-np.inf)), extra])


def _gen_cast_lowp(c: _Cases) -> None:
    if c.dtype.is_lowp:  # every value of the type, to float32 (exact)
        n = _lowp_values(c.dtype).size
        c.add("to_f32", "basic", [("x", c.arr(v_lowp, (2, n)))], {"to": DType.F32})
    elif c.dtype is DType.F32:  # rounding into each type: ties, overflow, NaN/Inf, subnormals
        for to in (d for d in DType if d.is_lowp):
            vals = _lowp_targets(to)
            c.add(f"to_{to}", "basic" if to.is_int else "nan_inf",
                  [("x", c.arr(lambda rng, shape, dt, v=vals: v.copy(), vals.shape))],
                  {"to": to})


def _gen_cast(c: _Cases) -> None:
    src = c.dtype
    _gen_cast_lowp(c)
    if src.is_lowp:
        return
    for to in DType:
        if to.is_lowp:
            continue
        vf = _cast_values(src, to)
        attrs = {"to": to}
        c.add(f"to_{to}", "basic", [("x", c.arr(vf, (3, 4)))], attrs)
        if to in (DType.F32, DType.I32, DType.BOOL):
            c.add(f"to_{to}-scalar", "scalar", [("x", c.arr(vf, ()))], attrs)
            c.add(f"to_{to}-size0", "size0", [("x", c.arr(vf, (0, 3)))], attrs)
            c.add(f"to_{to}-noncontiguous", "noncontiguous", [("x", c.arr(vf, (3, 4), nc=True))], attrs)
        if src.is_float and not to.is_int:
            # NaN/Inf convert (IEEE) between floats and to bool (NaN != 0); to ints they are undefined.
            c.add(f"to_{to}-nan_inf", "nan_inf", [("x", c.arr(v_special, (2, 5)))], attrs)
            c.add(f"to_{to}-large", "large", [("x", c.arr(v_large, (3, 4)))], attrs)
        if src.is_int:
            # Narrowing integer casts wrap (two's complement); int -> float rounds or overflows to Inf.
            c.add(f"to_{to}-overflow", "overflow", [("x", c.arr(v_extreme, (3, 4)))], attrs)


# -- reductions, arg reductions, scans ---------------------------------------------------------

#: NaN/Inf rows for reductions: NaN propagation, Inf, Inf - Inf, Inf * 0, a finite control row.
_RED_SPECIAL = np.array([[math.nan, 1.0, 2.0, -3.0], [math.inf, 1.0, 2.0, 3.0],
                         [-math.inf, math.inf, 1.0, 0.0], [math.inf, math.inf, 0.5, 1.0],
                         [-math.inf, -0.0, 0.0, 1.0], [0.5, -1.0, 2.0, 1.5]])


def _reduces_empty(op: str, dt: DType) -> bool:
    """Whether ``op``'s inference accepts reducing an empty axis (max/min have no identity)."""
    schema = REGISTRY.get(op)
    try:
        schema.infer([TensorType(dt, (0, 3))], schema.check_attrs({"axes": (0,)}, op))
    except RLXError:
        return False
    return True


def _gen_reduction(c: _Cases) -> None:
    """``axes``/``keepdims`` reductions (case family ``"reduction"``; values from the operand's
    domain, empty reduced axes when the op's inference accepts them)."""
    op, dt = c.op, c.dtype
    vf = DOMAINS[_domain(op, 0)]
    nonempty = not _reduces_empty(op, dt)
    x3 = (2, 3, 4)
    for label, kind, shape, axes, keep in [
        ("all", "basic", x3, None, False),
        ("all_keepdims", "basic", x3, None, True),
        ("axis1", "basic", x3, (1,), False),
        ("axes02_keepdims", "basic", x3, (0, 2), True),
        ("axes_empty", "basic", x3, (), False),
        ("axis_neg", "negative_axis", x3, (-1,), False),
        ("axes_neg_keepdims", "negative_axis", x3, (-3, -1), True),
        ("scalar", "scalar", (), None, False),
        ("size1", "size1", (1, 4, 1), (0, 2), False),
        ("size0_kept", "size0", (0, 3), (1,), False),
    ]:
        if not _lean(dt) or label in _LEAN_REDUCTION:
            c.add(label, kind, [("x", c.arr(vf, shape))], {"axes": axes, "keepdims": keep})
    if not nonempty:  # max/min of an empty axis has no identity (inference rejects it)
        c.add("size0_reduced", "size0", [("x", c.arr(vf, (0, 3)))], {"axes": (0,), "keepdims": False})
        if not _lean(dt):
            c.add("size0_all", "size0", [("x", c.arr(vf, (2, 0)))], {"axes": None, "keepdims": True})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(vf, (3, 4), nc=True))], {"axes": (0,)})
    if not _lean(dt):
        c.add("noncontiguous_all", "noncontiguous", [("x", c.arr(vf, (3, 4), nc=True))], {"axes": None})
    if dt.is_float:
        sp = fixed(_RED_SPECIAL)
        c.add("nan_inf", "nan_inf", [("x", c.arr(sp, _RED_SPECIAL.shape))], {"axes": (1,)})
        c.add("nan_inf_all", "nan_inf", [("x", c.arr(sp, _RED_SPECIAL.shape))], {"axes": None})
        c.add("large", "large", [("x", c.arr(v_large_pos, (3, 4)))], {"axes": (1,)})
    if dt.is_int:
        c.add("overflow", "overflow", [("x", c.arr(v_extreme, (3, 4)))], {"axes": (1,)})
        c.add("overflow_all", "overflow", [("x", c.arr(v_extreme, (3, 4)))], {"axes": None})


def _gen_arg(c: _Cases) -> None:
    """Index reductions along ``axis`` (case family ``"arg"``; the operand's domain should give
    ties, so the first extreme index is tested)."""
    dt = c.dtype
    vt = DOMAINS[_domain(c.op, 0)]
    for label, kind, shape, attrs in [
        ("default_axis", "basic", (3, 4), {}),
        ("axis0", "basic", (3, 4), {"axis": 0}),
        ("axis1_3d", "basic", (2, 3, 4), {"axis": 1}),
        ("axis_neg_keepdims", "negative_axis", (2, 3, 4), {"axis": -2, "keepdims": True}),
        ("keepdims", "basic", (3, 4), {"axis": 1, "keepdims": True}),
        ("size1", "size1", (1, 4), {"axis": 0}),
        ("size0", "size0", (0, 3), {"axis": 1}),
        ("vector", "basic", (7,), {"axis": 0}),
    ]:
        c.add(label, kind, [("x", c.arr(vt, shape))], attrs)
    c.add("values", "basic", [("x", c.arr(v_default, (3, 5)))], {"axis": 1})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(vt, (3, 4), nc=True))], {"axis": 0})
    if dt.is_float:
        sp = fixed(_RED_SPECIAL)
        c.add("nan_inf", "nan_inf", [("x", c.arr(sp, _RED_SPECIAL.shape))], {"axis": 1})
        c.add("nan_inf_axis0", "nan_inf", [("x", c.arr(sp, _RED_SPECIAL.shape))], {"axis": 0})
        c.add("large", "large", [("x", c.arr(v_large, (3, 4)))], {"axis": 1})
    if dt.is_int:
        c.add("overflow", "overflow", [("x", c.arr(v_extreme, (3, 4)))], {"axis": 1})


def _gen_cumsum(c: _Cases) -> None:
    dt = c.dtype
    for label, kind, shape, attrs in [
        ("default_axis", "basic", (3, 4), {}),
        ("axis0", "basic", (3, 4), {"axis": 0}),
        ("axis_neg", "negative_axis", (2, 3, 4), {"axis": -2}),
        ("exclusive", "basic", (3, 4), {"exclusive": True}),
        ("reverse", "basic", (3, 4), {"axis": 0, "reverse": True}),
        ("exclusive_reverse", "basic", (3, 4), {"exclusive": True, "reverse": True}),
        ("scalar", "scalar", (), {}),
        ("scalar_exclusive", "scalar", (), {"exclusive": True}),
        ("size0", "size0", (0, 4), {"axis": 0}),
        ("size0_other", "size0", (0, 4), {"axis": 1, "exclusive": True}),
        ("size1", "size1", (1, 4), {"axis": 0}),
    ]:
        c.add(label, kind, [("x", c.arr(v_default, shape))], attrs)
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(v_default, (3, 4), nc=True))], {"axis": 1})
    c.add("noncontiguous_reverse", "noncontiguous", [("x", c.arr(v_default, (3, 4), nc=True))],
          {"axis": 0, "reverse": True, "exclusive": True})
    if dt.is_float:
        # Inclusive only: exclusive is defined as inclusive - x, where Inf - Inf is NaN by definition.
        sp = fixed(_RED_SPECIAL)
        c.add("nan_inf", "nan_inf", [("x", c.arr(sp, _RED_SPECIAL.shape))], {"axis": 1})
        c.add("large", "large", [("x", c.arr(v_large_pos, (3, 4)))], {"axis": 1})
    if dt.is_int:
        c.add("overflow", "overflow", [("x", c.arr(v_extreme, (3, 4)))], {"axis": 1})
        c.add("overflow_exclusive", "overflow", [("x", c.arr(v_extreme, (3, 4)))],
              {"axis": 0, "exclusive": True, "reverse": True})


# -- matmul and conv2d -------------------------------------------------------------------------

def _large_products(k: int) -> ValueFn:
    """``large`` for dot products: big operands whose k-term sums of products stay finite."""
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        mag = math.sqrt(LARGE[dt] / (4 * k))
        return _to(mag * rng.uniform(0.5, 1.0, shape) * _signs(rng, shape), dt)
    return make


def _nan_inf_rows(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Positive values with a NaN in row 0 and +Inf in row 1: against a positive operand the
    result rows are NaN and +Inf whatever the summation order (no Inf - Inf, no Inf * 0)."""
    x = rng.uniform(0.5, 1.0, shape)
    x[..., 0, 1 % shape[-1]] = math.nan
    x[..., 1, 0] = math.inf
    return _to(x, dt)


def _v_pos_unit(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    return _to(rng.uniform(0.5, 1.0, shape), dt)


def _gen_matmul(c: _Cases) -> None:
    dt = c.dtype
    vf = v_default
    for label, kind, sa, sb in [
        ("mm", "basic", (3, 4), (4, 5)),
        ("vec_mat", "basic", (4,), (4, 5)),
        ("mat_vec", "basic", (3, 4), (4,)),
        ("dot", "basic", (4,), (4,)),
        ("batched", "basic", (2, 3, 4), (2, 4, 5)),
        ("batch_broadcast", "broadcast", (2, 1, 3, 4), (3, 4, 2)),
        ("batch_vs_mat", "broadcast", (2, 3, 4), (4, 5)),
        ("vec_vs_batch", "broadcast", (4,), (2, 4, 3)),
        ("size0_m", "size0", (0, 4), (4, 3)),
        ("size0_k", "size0", (3, 0), (0, 2)),
        ("size0_batch", "size0", (0, 3, 4), (4, 2)),
        ("size1", "size1", (1, 4), (4, 1)),
        ("long_k", "basic", (2, 64), (64, 3)),
    ]:
        c.add(label, kind, [("a", c.arr(vf, sa)), ("b", c.arr(vf, sb))])
    c.add("noncontiguous", "noncontiguous", [("a", c.arr(vf, (3, 4), nc=True)),
                                             ("b", c.arr(vf, (4, 5), nc=True))])
    if dt.is_float:
        c.add("nan_inf", "nan_inf", [("a", c.arr(_nan_inf_rows, (3, 4))), ("b", c.arr(_v_pos_unit, (4, 2)))])
        big = _large_products(4)
        c.add("large", "large", [("a", c.arr(big, (3, 4))), ("b", c.arr(big, (4, 5)))])
    if dt.is_int:
        c.add("overflow", "overflow", [("a", c.arr(v_extreme, (3, 4))), ("b", c.arr(v_extreme, (4, 5)))])


def _gen_conv2d(c: _Cases) -> None:
    dt = c.dtype
    vf = v_default
    for label, kind, sx, sw, attrs in [
        ("basic", "basic", (1, 2, 5, 5), (3, 2, 3, 3), {}),
        ("batch2", "basic", (2, 2, 4, 6), (3, 2, 2, 3), {}),
        ("strided", "basic", (1, 2, 6, 5), (2, 2, 3, 3), {"strides": (2, 2)}),
        ("padded", "basic", (1, 2, 4, 4), (3, 2, 3, 3), {"pads": (1, 1, 1, 1)}),
        ("asym_pads_strides", "basic", (1, 1, 5, 6), (2, 1, 3, 2),
         {"pads": (0, 1, 2, 0), "strides": (2, 1)}),
        ("dilated", "basic", (1, 2, 7, 7), (2, 2, 3, 3), {"dilations": (2, 2), "pads": (2, 2, 2, 2)}),
        ("dilated_strided", "basic", (1, 1, 9, 8), (1, 1, 2, 3),
         {"dilations": (3, 1), "strides": (1, 2)}),
        ("groups", "basic", (2, 4, 5, 5), (4, 2, 3, 3), {"groups": 2}),
        ("depthwise", "basic", (1, 3, 4, 4), (6, 1, 3, 3), {"groups": 3, "pads": (1, 1, 1, 1)}),
        ("size1_kernel", "size1", (1, 2, 3, 3), (3, 2, 1, 1), {}),
        ("size1_spatial", "size1", (1, 2, 1, 1), (3, 2, 1, 1), {}),
        ("size0_batch", "size0", (0, 2, 5, 5), (3, 2, 3, 3), {}),
    ]:
        c.add(label, kind, [("x", c.arr(vf, sx)), ("w", c.arr(vf, sw))], attrs)
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(vf, (1, 2, 5, 5), nc=True)),
                                             ("w", c.arr(vf, (3, 2, 3, 3), nc=True))])
    if dt.is_float:
        big = _large_products(2 * 3 * 3)
        c.add("large", "large", [("x", c.arr(big, (1, 2, 5, 5))), ("w", c.arr(big, (3, 2, 3, 3)))])
    if dt.is_int:
        c.add("overflow", "overflow", [("x", c.arr(v_extreme, (1, 2, 4, 4))),
                                       ("w", c.arr(v_extreme, (2, 2, 3, 3)))], {"pads": (1, 1, 1, 1)})


# -- data movement -----------------------------------------------------------------------------

def _data(dt: DType) -> ValueFn:
    # u16/u32/u64 data spans the whole range: a backend that moves them through a narrower or
    # signed or float type loses the top bits, which small values would never show.
    if dt in (DType.U16, DType.U32, DType.U64):
        return v_extreme
    return v_bool if dt.is_bool else v_default


def _gen_reshape(c: _Cases) -> None:
    if c.dtype.is_lowp:
        c.add("infer", "basic", [("x", c.arr(v_lowp, (2, 3, 40)))], {"shape": (4, -1)})
        return
    vf = _data(c.dtype)
    for label, kind, shape, to in [
        ("basic", "basic", (2, 3, 4), (6, 4)),
        ("infer", "basic", (2, 3, 4), (4, -1)),
        ("flatten", "basic", (2, 3, 4), (-1,)),
        ("scalar_to_1x1", "scalar", (), (1, 1)),
        ("1x1_to_scalar", "scalar", (1, 1), ()),
        ("size0", "size0", (0, 3), (3, 0, 1)),
        ("size0_infer", "size0", (0, 3), (-1,)),
        ("size1", "size1", (1, 4, 1), (4,)),
    ]:
        c.add(label, kind, [("x", c.arr(vf, shape))], {"shape": to})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(vf, (3, 4), nc=True))], {"shape": (12,)})


def _gen_transpose(c: _Cases) -> None:
    if c.dtype.is_lowp:
        c.add("rotate", "basic", [("x", c.arr(v_lowp, (2, 3, 40)))], {"perm": (2, 0, 1)})
        return
    vf = _data(c.dtype)
    for label, kind, shape, perm in [
        ("reverse", "basic", (2, 3, 4), None),
        ("swap01", "basic", (2, 3, 4), (1, 0, 2)),
        ("rotate", "basic", (2, 3, 4), (2, 0, 1)),
        ("matrix", "basic", (3, 5), (1, 0)),
        ("negative_perm", "negative_axis", (2, 3, 4), (-1, 0, -2)),
        ("scalar", "scalar", (), None),
        ("size0", "size0", (0, 3), (1, 0)),
        ("size1", "size1", (1, 3, 1), (2, 1, 0)),
    ]:
        c.add(label, kind, [("x", c.arr(vf, shape))], {"perm": perm})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(vf, (3, 4), nc=True))], {"perm": (1, 0)})


def _gen_expand(c: _Cases) -> None:
    vf = _data(c.dtype)
    for label, kind, shape, to in [
        ("basic", "basic", (3, 1), (2, 3, 4)),
        ("prepend", "broadcast", (4,), (3, 4)),
        ("scalar", "scalar", (), (2, 3)),
        ("size0", "size0", (1, 3), (0, 3)),
        ("size1_noop", "size1", (1, 1), (1, 1)),
        ("same", "basic", (2, 3), (2, 3)),
    ]:
        c.add(label, kind, [("x", c.arr(vf, shape))], {"shape": to})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(vf, (2, 1, 3), nc=True))], {"shape": (2, 4, 3)})


_NEG_BIG = -(2**31)  # a stop before the start of any axis, for full reversals


def _gen_slice(c: _Cases) -> None:
    if c.dtype.is_lowp:
        c.add("negative_step2", "basic", [("x", c.arr(v_lowp, (4, 50)))],
              {"starts": (3, 1), "stops": (_NEG_BIG, 49), "axes": (0, 1), "steps": (-1, 2)})
        return
    vf = _data(c.dtype)
    for label, kind, shape, attrs in [
        ("basic", "basic", (4, 5), {"starts": (1, 0), "stops": (3, 5)}),
        ("step2", "basic", (4, 5), {"starts": (0,), "stops": (5,), "axes": (1,), "steps": (2,)}),
        ("clamped", "basic", (4, 5), {"starts": (2,), "stops": (100,), "axes": (0,)}),
        ("reverse", "basic", (4, 5), {"starts": (-1,), "stops": (_NEG_BIG,), "axes": (0,),
                                      "steps": (-1,)}),
        ("negative_step2", "basic", (4, 5), {"starts": (4,), "stops": (0,), "axes": (1,), "steps": (-2,)}),
        ("negative_axis", "negative_axis", (4, 5), {"starts": (-3,), "stops": (-1,), "axes": (-1,)}),
        ("negative_both", "negative_axis", (2, 4, 5), {"starts": (-1, 3), "stops": (_NEG_BIG, 0),
                                                       "axes": (-1, 1), "steps": (-2, -1)}),
        ("empty_result", "size0", (4, 5), {"starts": (3,), "stops": (1,), "axes": (0,)}),
        ("size0_input", "size0", (0, 5), {"starts": (1,), "stops": (4,), "axes": (1,)}),
        ("size1", "size1", (1, 5), {"starts": (0, 2), "stops": (1, 3)}),
    ]:
        c.add(label, kind, [("x", c.arr(vf, shape))], attrs)
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(vf, (4, 5), nc=True))],
          {"starts": (1,), "stops": (4,), "axes": (0,), "steps": (2,)})


def _gen_concat(c: _Cases) -> None:
    if c.dtype.is_lowp:
        c.add("axis1", "basic", [("x0", c.arr(v_lowp, (3, 17))), ("x1", c.arr(v_lowp, (3, 40)))], {"axis": 1})
        return
    vf = _data(c.dtype)
    for label, kind, shapes, axis in [
        ("axis0", "basic", [(2, 3), (1, 3), (3, 3)], 0),
        ("axis1", "basic", [(2, 1), (2, 3)], 1),
        ("axis_neg", "negative_axis", [(2, 2, 1), (2, 2, 3)], -1),
        ("middle_axis", "basic", [(2, 1, 3), (2, 2, 3)], 1),
        ("single", "basic", [(2, 3)], 0),
        ("vectors", "basic", [(3,), (2,)], 0),
        ("size0_part", "size0", [(0, 3), (2, 3)], 0),
        ("size0_all", "size0", [(2, 0), (2, 0)], 1),
        ("size1", "size1", [(1, 1), (1, 1)], 0),
    ]:
        c.add(label, kind, [(f"x{i}", c.arr(vf, s)) for i, s in enumerate(shapes)], {"axis": axis})
    c.add("noncontiguous", "noncontiguous", [("x0", c.arr(vf, (3, 4), nc=True)),
                                             ("x1", c.arr(vf, (2, 4)))], {"axis": 0})


def _gen_pad(c: _Cases) -> None:
    vf = _data(c.dtype)
    for label, kind, shape, attrs in [
        ("basic", "basic", (2, 3), {"pads": (1, 0, 2, 1)}),
        ("value", "basic", (2, 3), {"pads": (0, 2, 1, 0), "value": 1.5}),
        ("zero_pads", "basic", (2, 3, 2), {"pads": (0, 0, 0, 0, 0, 0)}),
        ("vector", "basic", (4,), {"pads": (3, 2), "value": 2.0}),
        ("scalar", "scalar", (), {"pads": ()}),
        ("size0", "size0", (0, 3), {"pads": (1, 1, 0, 0), "value": 1.0}),
        ("size1", "size1", (1, 1), {"pads": (1, 1, 1, 1)}),
    ]:
        c.add(label, kind, [("x", c.arr(vf, shape))], attrs)
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(vf, (3, 4), nc=True))], {"pads": (1, 1, 1, 1)})
    if c.dtype.is_float:
        c.add("nan_inf", "nan_inf", [("x", c.arr(v_special, (2, 5)))], {"pads": (1, 0, 0, 1),
                                                                         "value": math.nan})
        c.add("inf_value", "nan_inf", [("x", c.arr(vf, (2, 2)))], {"pads": (1, 1, 1, 1), "value": -math.inf})


def _idx(values: Any, dt: DType = DType.I64) -> ValueFn:
    return lambda rng, shape, _: np.asarray(values, dt.np).reshape(shape)


def _rand_idx(lo: int, hi: int, dt: DType = DType.I64) -> ValueFn:
    """Random indices in [lo, hi) (duplicates likely): the index dtype is fixed, not the case's."""
    return lambda rng, shape, _: rng.integers(lo, hi, size=shape).astype(dt.np)


def _gen_gather(c: _Cases) -> None:
    vf = _data(c.dtype)
    i64, i32 = DType.I64, DType.I32
    if c.dtype.is_lowp:
        c.add("negative_index", "negative_index", [("x", c.arr(v_lowp, (5, 40))),
                                                   ("indices", c.arr(_idx([-1, 0, 4, 2, -5]), (5,), i64))],
              {"axis": 0})
        return
    for label, kind, sx, ind, si, axis in [
        ("axis0_dups", "basic", (5, 3), _idx([0, 4, 2, 2]), (4,), 0),
        ("axis1_2d_index", "basic", (5, 3), _rand_idx(0, 3), (2, 2), 1),
        ("negative_index", "negative_index", (5, 3), _idx([-1, -5, 3]), (3,), 0),
        ("negative_axis", "negative_axis", (2, 5, 3), _rand_idx(-3, 3), (4,), -1),
        ("i32_index", "basic", (5, 3), _idx([3, 0, -2], i32), (3,), 0),
        ("scalar_index", "scalar", (5, 3), _idx(2), (), 0),
        ("vector_scalar_index", "scalar", (5,), _idx(-1), (), 0),
        ("size0_index", "size0", (5, 3), _idx([], i64), (0,), 0),
        ("size0_data", "size0", (0, 3), _idx([1, 2]), (2,), 1),
        ("size1", "size1", (1, 3), _idx([0, 0, 0]), (3,), 0),
    ]:
        idt = i32 if "i32" in label else i64
        c.add(label, kind, [("x", c.arr(vf, sx)), ("indices", c.arr(ind, si, idt))], {"axis": axis})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(vf, (5, 3), nc=True)),
                                             ("indices", c.arr(_idx([4, 1]), (2,), i64))], {"axis": 0})
    # Just past either end, and 2**32 + 1 (a kernel narrowing i64 to 32 bits would read row 1).
    for label, ind, idt, axis in [("past_end", [0, 5, 1], i64, 0), ("before_start", [-6, 2], i32, 0),
                                  ("axis1_past_end", [[0, 3]], i64, 1), ("huge_i64", [2**32 + 1], i64, 0)]:
        si = np.shape(ind)
        c.add(label, "out_of_range", [("x", c.arr(vf, (5, 3))), ("indices", c.arr(_idx(ind, idt), si, idt))],
              {"axis": axis})


def _gen_scatter_add(c: _Cases) -> None:
    dt = c.dtype
    vf = v_default
    i64, i32 = DType.I64, DType.I32
    for label, kind, sx, si, ind, axis, idt in [
        ("axis0_dups", "basic", (5, 3), (4, 3), _rand_idx(0, 5), 0, i64),
        ("all_same", "basic", (4, 2), (3, 2), _idx([[1, 1]] * 3), 0, i64),
        ("axis1", "basic", (3, 5), (3, 4), _rand_idx(0, 5), 1, i64),
        ("negative_axis", "negative_axis", (3, 5), (3, 4), _rand_idx(0, 5), -1, i64),
        ("negative_index", "negative_index", (5, 3), (4, 3), _rand_idx(-5, 5), 0, i64),
        ("i32_index", "basic", (5, 3), (4, 3), _rand_idx(0, 5, i32), 0, i32),
        ("vector", "basic", (6,), (9,), _rand_idx(0, 6), 0, i64),
        ("size0_updates", "size0", (5, 3), (0, 3), _idx(np.zeros((0, 3))), 0, i64),
        ("size1", "size1", (1, 1), (1, 1), _idx([[0]]), 0, i64),
    ]:
        c.add(label, kind, [("x", c.arr(vf, sx)), ("indices", c.arr(ind, si, idt)),
                            ("updates", c.arr(vf, si))], {"axis": axis})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(vf, (5, 3), nc=True)),
                                             ("indices", c.arr(_rand_idx(0, 5), (4, 3), i64, nc=True)),
                                             ("updates", c.arr(vf, (4, 3), nc=True))], {"axis": 0})
    if dt.is_int:
        c.add("overflow", "overflow", [("x", c.arr(v_extreme, (4, 3))),
                                       ("indices", c.arr(_rand_idx(0, 4), (6, 3), i64)),
                                       ("updates", c.arr(v_extreme, (6, 3)))], {"axis": 0})
    # ONNX ScatterElements: out of range is an error (scatter_add used to wrap modulo n).
    for label, ind, idt, axis in [("past_end", [[0, 5, 1]], i64, 0), ("before_start", [[-6, 0, 0]], i32, 0),
                                  ("axis1_past_end", [[0], [5], [1]], i64, 1)]:
        si = np.shape(ind)
        c.add(label, "out_of_range", [("x", c.arr(vf, (5, 3))), ("indices", c.arr(_idx(ind, idt), si, idt)),
                                      ("updates", c.arr(vf, si))], {"axis": axis})


def _gen_scatter_reduce(c: _Cases) -> None:
    """ONNX ScatterElements with reduction none (last duplicate wins) / mul / max / min."""
    i64, i32 = DType.I64, DType.I32
    values = {"none": v_default, "mul": v_unit, "max": v_ties, "min": v_ties}
    for red, vf in values.items():
        for label, kind, sx, si, ind, axis, idt in [
            ("axis0_dups", "basic", (5, 3), (4, 3), _rand_idx(0, 5), 0, i64),
            ("axis1_narrow", "basic", (3, 5), (2, 4), _rand_idx(0, 5, i32), 1, i32),
            ("negative_index", "negative_index", (5, 3), (4, 3), _rand_idx(-5, 5), -2, i64),
            ("size0_updates", "size0", (5, 3), (0, 3), _idx(np.zeros((0, 3))), 0, i64),
            ("past_end", "out_of_range", (5, 3), (1, 3), _idx([[0, 5, 1]]), 0, i64),
        ]:
            c.add(f"{red}_{label}", kind, [("x", c.arr(vf, sx)), ("indices", c.arr(ind, si, idt)),
                                           ("updates", c.arr(vf, si))], {"axis": axis, "reduction": red})


def _gen_topk_indices(c: _Cases) -> None:
    """Sorted positions of the k largest/smallest; small integer values, so ties are frequent."""
    for label, kind, shape, k, axis, largest in [
        ("largest_last_axis", "basic", (4, 7), 3, -1, True),
        ("smallest_axis0", "negative_axis", (5, 3), 2, -2, False),
        ("all", "basic", (2, 6), 6, 1, True),
        ("k0", "size0", (3, 4), 0, 1, True),
        ("size1", "size1", (1, 1), 1, 0, False),
    ]:
        c.add(label, kind, [("x", c.arr(v_ties, shape))], {"k": k, "axis": axis, "largest": largest})
    if c.dtype.is_float:
        c.add("nan_largest", "nan_inf", [("x", c.arr(fixed([[1.0, np.nan, -np.inf, 1.0, np.inf]]), (1, 5)))],
              {"k": 4, "axis": 1, "largest": True})


def _gen_iota(c: _Cases) -> None:
    for label, kind, shape, axis in [
        ("axis0", "basic", (3, 4), 0),
        ("axis1", "basic", (3, 4), 1),
        ("axis_neg", "negative_axis", (2, 3, 4), -2),
        ("vector", "basic", (7,), 0),
        ("scalar", "scalar", (), 0),
        ("size0", "size0", (0, 3), 1),
        ("size1", "size1", (1, 5), 0),
    ]:
        c.add(label, kind, [], {"shape": shape, "axis": axis, "dtype": c.dtype})
    if c.dtype in (DType.I8, DType.U8):  # indices past the range wrap
        c.add("overflow", "overflow", [], {"shape": (300,), "axis": 0, "dtype": c.dtype})


# -- HIR ops -----------------------------------------------------------------------------------
# Inputs are O(1) unless the kind says otherwise; every generator runs for f16, bf16, f32 and f64.

def _v_weights(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Signed values in [-1, 1]: weights and affine parameters."""
    return _to(rng.uniform(-1.0, 1.0, shape), dt)


def _v_zeros(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    return np.zeros(shape, dt.np)


def _v_offset(offset: float, spread: float = 1.0) -> ValueFn:
    """``offset + uniform(-spread, spread)``: a large mean over a small spread (stability cases)."""
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return _to(offset + rng.uniform(-spread, spread, shape), dt)
    return make


def _v_mag(lo: float, hi: float) -> ValueFn:
    """Magnitudes in [lo, hi] with random signs."""
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return _to(rng.uniform(lo, hi, shape) * _signs(rng, shape), dt)
    return make


def _v_mag_pos(lo: float, hi: float) -> ValueFn:
    """Uniform in [lo, hi] (no sign flips)."""
    return lambda rng, shape, dt: _to(rng.uniform(lo, hi, shape), dt)


#: NaN/Inf values whose effect through gelu and silu is defined: -inf is left out because
#: ``x * sigmoid(x)`` and ``x * Phi(x)`` are ``-inf * 0`` (NaN) there, while the limit is 0.
_SPECIALS_NO_NEG_INF = tuple(v for v in SPECIALS if v != -math.inf)


def _v_special_no_neg_inf(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    flat = np.resize(np.asarray(_SPECIALS_NO_NEG_INF), math.prod(shape))
    return _to(rng.permutation(flat).reshape(shape), dt)


def _gen_activation(c: _Cases) -> None:
    """relu, gelu, silu: elementwise, any rank."""
    op = c.op
    modes: list[tuple[str, dict[str, Any]]] = [("", {})]
    if op == "gelu":
        modes = [("", {"approximate": "none"}), ("tanh-", {"approximate": "tanh"})]
    specials = v_special if op == "relu" else _v_special_no_neg_inf
    for pre, attrs in modes:
        for label, kind, vf, shape in [
            ("basic", "basic", v_default, (3, 5)),
            ("wide", "basic", _v_mag(0.0, 8.0), (4, 6)),  # the tails, where 1 + erf cancels
            ("rank3", "basic", v_default, (2, 3, 4)),
            ("scalar", "scalar", v_default, ()),
            ("size0", "size0", v_default, (0, 3)),
            ("size1", "size1", v_default, (1, 4, 1)),
            ("large", "large", v_large, (3, 4)),
            ("nan_inf", "nan_inf", specials, (2, 5)),
        ]:
            c.add(pre + label, kind, [("x", c.arr(vf, shape))], attrs)
        c.add(pre + "noncontiguous", "noncontiguous", [("x", c.arr(v_default, (3, 4), nc=True))], attrs)


#: Softmax NaN/Inf rows: -inf entries (probability 0 / log-probability -inf) in rows that keep
#: finite entries, and a NaN row (NaN propagates to the whole row); a finite control row.
_SOFTMAX_SPECIAL = np.array([[-math.inf, 1.0, 2.0, -math.inf, 0.5],
                             [-math.inf, -math.inf, -math.inf, -math.inf, 3.0],
                             [0.25, math.nan, 1.0, -1.0, 2.0],
                             [-1.0, 0.0, 1.5, -math.inf, -2.0]])


def _gen_softmax(c: _Cases) -> None:
    for label, kind, vf, shape, axis in [
        ("basic", "basic", v_default, (3, 5), -1),
        ("axis0", "basic", v_default, (4, 3), 0),
        ("rank3_axis1", "basic", v_default, (2, 4, 3), 1),
        ("axis_neg2", "negative_axis", v_default, (2, 4, 3), -2),
        ("axis_neg3", "negative_axis", v_default, (3, 2, 4), -3),
        ("vector", "basic", v_default, (7,), 0),
        ("wide_logits", "basic", _v_mag(0.0, 12.0), (3, 16), -1),
        ("long_axis", "basic", v_default, (2, 200), -1),
        ("size1_axis", "size1", v_default, (3, 1), -1),  # softmax 1, log_softmax 0
        ("size1_rows", "size1", v_default, (1, 1, 5), -1),
        ("size0_rows", "size0", v_default, (0, 4), -1),
        ("large", "large", _v_offset(1000.0, 5.0), (3, 6), -1),  # logits ~1e3: max subtraction
        ("large_mixed", "large", _v_mag(500.0, 1000.0), (3, 6), -1),  # exp underflows to 0
        ("nan_inf", "nan_inf", fixed(_SOFTMAX_SPECIAL), _SOFTMAX_SPECIAL.shape, -1),
        ("nan_inf_axis0", "nan_inf", fixed(_SOFTMAX_SPECIAL.T), _SOFTMAX_SPECIAL.T.shape, 0),
    ]:
        c.add(label, kind, [("x", c.arr(vf, shape))], {"axis": axis})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(v_default, (3, 4), nc=True))], {"axis": -1})


#: Norm NaN/Inf rows: a row holding NaN or +-Inf normalises to all NaN (its mean or variance is
#: NaN/Inf); the other rows must be unaffected.
_NORM_SPECIAL = np.array([[math.nan, 1.0, -1.0, 0.5],
                          [math.inf, 1.0, 2.0, -3.0],
                          [-math.inf, 0.0, 1.0, 2.0],
                          [0.5, -1.5, 2.0, 1.0]])


def _gen_layer_norm(c: _Cases) -> None:
    """layer_norm and rms_norm: over the last axis, the last two (axis=-2 / 1), all of them."""
    rms = c.op == "rms_norm"

    def add(label: str, kind: str, vf: ValueFn, shape: Shape, axis: int, eps: float | None = None) -> None:
        trailing = shape[normalize_axis(axis, len(shape)):]
        ins = [("x", c.arr(vf, shape)), ("gamma", c.arr(_v_weights, trailing))]
        if not rms:
            ins.append(("beta", c.arr(_v_weights, trailing)))
        attrs: dict[str, Any] = {"axis": axis}
        if eps is not None:
            attrs["eps"] = eps
        c.add(label, kind, ins, attrs)

    add("basic", "basic", v_default, (2, 3, 8), -1)
    add("axis_neg2", "negative_axis", v_default, (2, 3, 4), -2)  # gamma/beta are (3, 4)
    add("axis1", "basic", v_default, (2, 3, 4), 1)
    add("axis0_all", "basic", v_default, (3, 4), 0)
    add("vector", "basic", v_default, (16,), -1)
    add("long_row", "basic", v_default, (2, 256), -1)
    add("eps", "basic", _v_mag(0.0, 0.05), (3, 6), -1, eps=0.01)  # eps comparable to the variance
    add("size1_rows", "size1", v_default, (1, 1, 6), -1)
    add("size1_axis", "size1", v_default, (4, 1), -1)  # one element: x - mean is exactly 0
    add("large", "large", _large_products(8), (3, 8), -1)  # sums of squares stay finite
    if c.dtype in (DType.F32, DType.F64):
        # A mean far from zero: E[x^2] - E[x]^2 would lose every digit; centring first keeps them.
        # (Not for half types: a mean of 1000 stored in f16/bf16 is off by up to 0.25/2, so the
        # centred values themselves are wrong; such a case tests nothing but its tolerance.)
        add("large_offset", "large", _v_offset(1000.0), (3, 64), -1)
    add("nan_inf", "nan_inf", fixed(_NORM_SPECIAL), _NORM_SPECIAL.shape, -1)
    c.add("noncontiguous", "noncontiguous",
          [("x", c.arr(v_default, (3, 4), nc=True)), ("gamma", c.arr(_v_weights, (4,), nc=True))]
          + ([] if rms else [("beta", c.arr(_v_weights, (4,), nc=True))]), {"axis": -1})


def _v_quarter_large(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """A quarter of :func:`v_large`: ``(x - mean) * inv`` (``|inv| < 2.2``) stays finite."""
    return _to(0.25 * LARGE[dt] * rng.uniform(0.5, 1.0, shape) * _signs(rng, shape), dt)


def _gen_batch_norm(c: _Cases) -> None:
    def add(label: str, kind: str, vf: ValueFn, shape: Shape, eps: float | None = None) -> None:
        ch = (shape[1],)
        ins = [("x", c.arr(vf, shape)), ("scale", c.arr(_v_weights, ch)), ("bias", c.arr(_v_weights, ch)),
               ("mean", c.arr(v_default, ch)), ("var", c.arr(_v_mag_pos(0.5, 2.0), ch))]
        c.add(label, kind, ins, {} if eps is None else {"eps": eps})

    add("rank2", "basic", v_default, (4, 3))
    add("rank4", "basic", v_default, (2, 3, 4, 5))
    add("rank3", "basic", v_default, (2, 4, 5))
    add("eps", "basic", v_default, (2, 3, 2, 2), eps=0.5)
    add("size1", "size1", v_default, (1, 1, 1, 1))
    add("size1_channels", "size1", v_default, (2, 1, 3, 3))
    add("size0_batch", "size0", v_default, (0, 3, 2, 2))
    add("large", "large", _v_quarter_large, (2, 3, 2, 2))
    add("nan_inf", "nan_inf", v_special, (2, 5, 2))
    c.add("noncontiguous", "noncontiguous",
          [("x", c.arr(v_default, (3, 4), nc=True)), ("scale", c.arr(_v_weights, (4,), nc=True)),
           ("bias", c.arr(_v_weights, (4,))), ("mean", c.arr(v_default, (4,))),
           ("var", c.arr(_v_mag_pos(0.5, 2.0), (4,)))], {})


def _gen_linear(c: _Cases) -> None:
    for label, kind, sx, out, bias in [
        ("basic", "basic", (3, 4), 5, _v_weights),
        ("zero_bias", "basic", (3, 4), 5, _v_zeros),  # a layer without bias
        ("rank3", "basic", (2, 3, 4), 6, _v_weights),
        ("rank4", "basic", (2, 2, 3, 5), 3, _v_weights),
        ("vector", "basic", (4,), 3, _v_weights),
        ("long_k", "basic", (2, 128), 4, _v_weights),
        ("size1", "size1", (1, 1), 1, _v_weights),
        ("size1_out", "size1", (3, 4), 1, _v_weights),
        ("size0_batch", "size0", (0, 4), 3, _v_weights),
    ]:
        c.add(label, kind, [("x", c.arr(v_default, sx)), ("w", c.arr(v_default, (out, sx[-1]))),
                            ("b", c.arr(bias, (out,)))])
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(v_default, (3, 4), nc=True)),
                                             ("w", c.arr(v_default, (5, 4), nc=True)),
                                             ("b", c.arr(_v_weights, (5,)))])
    big = _large_products(4)
    c.add("large", "large", [("x", c.arr(big, (3, 4))), ("w", c.arr(big, (5, 4))),
                             ("b", c.arr(_v_weights, (5,)))])
    # NaN in row 0 and +Inf in row 1 against positive weights and bias: NaN and +Inf rows.
    c.add("nan_inf", "nan_inf", [("x", c.arr(_nan_inf_rows, (3, 4))), ("w", c.arr(_v_pos_unit, (2, 4))),
                                 ("b", c.arr(_v_pos_unit, (2,)))])


def _gen_conv2d_bias(c: _Cases) -> None:
    for label, kind, sx, sw, attrs in [
        ("basic", "basic", (1, 2, 5, 5), (3, 2, 3, 3), {}),
        ("batch2", "basic", (2, 3, 6, 6), (4, 3, 3, 3), {"pads": (1, 1, 1, 1)}),
        ("strided", "basic", (1, 2, 7, 6), (2, 2, 3, 3), {"strides": (2, 2)}),
        ("strided_padded", "basic", (2, 2, 6, 6), (3, 2, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
        ("asym_pads_strides", "basic", (1, 1, 5, 6), (2, 1, 3, 2), {"pads": (0, 1, 2, 0), "strides": (2, 1)}),
        ("dilated", "basic", (1, 2, 7, 7), (2, 2, 3, 3), {"dilations": (2, 2), "pads": (2, 2, 2, 2)}),
        ("groups", "basic", (2, 4, 5, 5), (4, 2, 3, 3), {"groups": 2}),
        ("depthwise", "basic", (1, 3, 4, 4), (6, 1, 3, 3), {"groups": 3, "pads": (1, 1, 1, 1)}),
        ("size1_kernel", "size1", (1, 2, 3, 3), (3, 2, 1, 1), {}),
        ("size1_spatial", "size1", (1, 2, 1, 1), (3, 2, 1, 1), {}),
    ]:
        c.add(label, kind, [("x", c.arr(v_default, sx)), ("w", c.arr(v_default, sw)),
                            ("b", c.arr(_v_weights, (sw[0],)))], attrs)
    c.add("zero_bias", "basic", [("x", c.arr(v_default, (1, 2, 4, 4))), ("w", c.arr(v_default, (2, 2, 3, 3))),
                                 ("b", c.arr(_v_zeros, (2,)))], {"pads": (1, 1, 1, 1)})
    big = _large_products(2 * 3 * 3)
    c.add("large", "large", [("x", c.arr(big, (1, 2, 5, 5))), ("w", c.arr(big, (3, 2, 3, 3))),
                             ("b", c.arr(_v_weights, (3,)))])
    # One NaN and one +Inf pixel against positive weights: NaN/+Inf exactly where windows see them.
    c.add("nan_inf", "nan_inf", [("x", c.arr(_nan_inf_rows, (1, 1, 5, 5))),
                                 ("w", c.arr(_v_pos_unit, (2, 1, 2, 2))), ("b", c.arr(_v_pos_unit, (2,)))])


#: Pool NaN/Inf input: NaN, +Inf, -Inf (and +Inf beside -Inf) in different windows.
_POOL_SPECIAL = np.array([[math.nan, 1.0, 2.0, -1.0, 0.5, 1.5],
                          [0.0, -2.0, math.inf, 1.0, -math.inf, 2.0],
                          [1.0, 3.0, -1.0, -2.0, 0.25, -0.5],
                          [2.0, -math.inf, 0.5, math.inf, -1.0, 1.0]]).reshape(1, 1, 4, 6)


def _gen_pool(c: _Cases) -> None:
    avg = c.op == "avg_pool2d"
    cases: list[tuple[str, str, ValueFn, Shape, dict[str, Any]]] = [
        ("k2", "basic", v_default, (2, 3, 4, 6), {"kernel": (2, 2)}),
        ("k3_s1", "basic", v_default, (1, 2, 5, 5), {"kernel": (3, 3), "strides": (1, 1)}),
        ("k3_s2", "basic", v_default, (1, 2, 7, 6), {"kernel": (3, 3), "strides": (2, 2)}),
        ("k2x3_s1x2", "basic", v_default, (2, 1, 5, 7), {"kernel": (2, 3), "strides": (1, 2)}),
        ("pad1_k3_s2", "basic", v_default, (1, 2, 6, 6), {"kernel": (3, 3), "strides": (2, 2),
                                                          "pads": (1, 1, 1, 1)}),
        ("asym_pads", "basic", v_default, (1, 2, 5, 4), {"kernel": (2, 3), "strides": (1, 1),
                                                         "pads": (0, 1, 1, 2)}),
        # Every value negative: padding must never win (max) / count (exclusive average).
        ("negative_padded", "basic", _v_mag_pos(-3.0, -0.5), (1, 1, 4, 4),
         {"kernel": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}),
        ("size1_kernel", "size1", v_default, (1, 2, 3, 3), {"kernel": (1, 1)}),
        ("size1_output", "size1", v_default, (1, 1, 3, 3), {"kernel": (3, 3)}),
        ("large", "large", v_large, (1, 2, 4, 4), {"kernel": (2, 2)}),
        ("nan_inf", "nan_inf", fixed(_POOL_SPECIAL), _POOL_SPECIAL.shape, {"kernel": (2, 2)}),
    ]
    for label, kind, vf, shape, attrs in cases:
        padded = any(attrs.get("pads", (0,)))
        variants = [("", {})]
        if avg and padded:
            variants = [("-include_pad", {"count_include_pad": True}),
                        ("-exclude_pad", {"count_include_pad": False})]
        for suffix, extra in variants:
            c.add(label + suffix, kind, [("x", c.arr(vf, shape))], {**attrs, **extra})
    if avg:  # the flag must not matter without padding
        c.add("k2-exclude_pad", "basic", [("x", c.arr(v_default, (2, 3, 4, 6)))],
              {"kernel": (2, 2), "count_include_pad": False})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(v_default, (1, 2, 4, 4), nc=True))],
          {"kernel": (2, 2)})


def _gen_embedding(c: _Cases) -> None:
    """Cases per float *table* dtype; the ids are i32 or i64 (the schema's int dtypes name the ids)."""
    if not c.dtype.is_float:
        return
    i64, i32 = DType.I64, DType.I32
    for label, kind, st, ids, si, idt in [
        ("basic", "basic", (10, 4), _rand_idx(0, 10), (5,), i64),
        ("ids_2d", "basic", (10, 4), _rand_idx(0, 10), (2, 3), i64),
        ("i32_ids", "basic", (10, 4), _rand_idx(0, 10, i32), (2, 3), i32),
        ("dups", "basic", (6, 3), _idx([2, 2, 0, 2, 5]), (5,), i64),
        ("negative_ids", "negative_index", (10, 4), _idx([-1, -10, 3, -4]), (4,), i64),
        ("negative_i32_ids", "negative_index", (7, 2), _idx([[-7, 6], [0, -1]], i32), (2, 2), i32),
        ("scalar_id", "scalar", (10, 4), _idx(3), (), i64),
        ("size0_ids", "size0", (10, 4), _idx([], i64), (0,), i64),
        ("size1_table", "size1", (1, 5), _idx([0, 0, -1]), (3,), i64),
    ]:
        c.add(label, kind, [("table", c.arr(v_default, st)), ("ids", c.arr(ids, si, idt))])
    c.add("noncontiguous", "noncontiguous", [("table", c.arr(v_default, (6, 4), nc=True)),
                                             ("ids", c.arr(_rand_idx(0, 6), (4,), i64, nc=True))])
    c.add("nan_inf", "nan_inf", [("table", c.arr(v_special, (5, 2))),
                                 ("ids", c.arr(_idx([0, 4, 2, 1]), (4,)))])
    c.add("large", "large", [("table", c.arr(v_large, (5, 3))), ("ids", c.arr(_idx([4, 0, 3]), (3,)))])
    for label, ids, idt in [("id_past_end", [[1, 2], [10, 0]], i64), ("id_before_start", [-11, 0], i32)]:
        c.add(label, "out_of_range", [("table", c.arr(v_default, (10, 4))),
                                      ("ids", c.arr(_idx(ids, idt), np.shape(ids), idt))])


def _mask(values: Any, dt: DType) -> ValueFn:
    return lambda rng, shape, _: np.asarray(values).astype(dt.np).reshape(shape)


def _v_neg_inf_bias(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """An O(1) bias with -inf on about a third of the entries but never a whole row: masked keys."""
    x = rng.uniform(-1.0, 1.0, shape)
    hide = rng.random(shape) < 0.35
    hide[..., 0] = False  # key 0 stays visible in every row
    return _to(np.where(hide, -math.inf, x), dt)


def _gen_attention(c: _Cases) -> None:
    """Every mask kind, rank 3 (B, S, D) and rank 4 (B, H, S, D), Sq != Sk, explicit scales."""
    dt = c.dtype
    vf = v_default

    def add(label: str, kind: str, sq: Shape, sk: Shape, attrs: dict[str, Any],
            mask: tuple[ValueFn, Shape, DType] | None = None, qk: ValueFn = vf,
            dv: int | None = None) -> None:
        sv = (*sk[:-1], dv) if dv is not None else sk
        ins = [("q", c.arr(qk, sq)), ("k", c.arr(qk, sk)), ("v", c.arr(vf, sv))]
        if mask is not None:
            ins.append(("mask", c.arr(mask[0], mask[1], mask[2])))
        c.add(label, kind, ins, attrs)

    r4q, r4k = (2, 2, 3, 4), (2, 2, 5, 4)  # Sq=3 != Sk=5
    r3q, r3k = (2, 3, 4), (2, 5, 4)
    sq4 = (2, 2, 4, 4)
    none = {"mask": "none"}
    add("none_rank4", "basic", r4q, r4k, none)
    add("none_rank3", "basic", r3q, r3k, none)
    add("none_self", "basic", sq4, sq4, none)
    add("none_dv6", "basic", r3q, r3k, none, dv=6)  # v's head dim differs from q/k's
    add("none_scale", "basic", r4q, r4k, {"mask": "none", "scale": 0.3})
    add("none_long_k", "basic", (1, 2, 2, 8), (1, 2, 64, 8), none)
    add("causal_rank4", "basic", sq4, sq4, {"mask": "causal"})
    add("causal_rank3", "basic", (2, 5, 4), (2, 5, 4), {"mask": "causal"})
    add("causal_sq_lt_sk", "basic", r4q, r4k, {"mask": "causal"})  # top-left aligned
    add("causal_sq_gt_sk", "basic", (2, 5, 4), (2, 3, 4), {"mask": "causal"})
    add("causal_scale", "basic", (1, 2, 4, 8), (1, 2, 4, 8), {"mask": "causal", "scale": 1.0})
    add("sliding_window2_rank4", "basic", (2, 2, 5, 4), (2, 2, 5, 4), {"mask": "sliding_window", "window": 2})
    add("sliding_window2_rank3", "basic", (2, 6, 4), (2, 6, 4), {"mask": "sliding_window", "window": 2})
    add("sliding_window1", "basic", (1, 4, 4), (1, 4, 4), {"mask": "sliding_window", "window": 1})
    add("sliding_window_wide", "basic", r4q, r4k, {"mask": "sliding_window", "window": 8})
    bias = {"mask": "bias"}
    add("bias_b1qk", "broadcast", r4q, r4k, bias, (vf, (2, 1, 3, 5), dt))  # (B, 1, Sq, Sk)
    add("bias_qk_rank4", "broadcast", r4q, r4k, bias, (vf, (3, 5), dt))  # (Sq, Sk)
    add("bias_qk_rank3", "broadcast", r3q, r3k, bias, (vf, (3, 5), dt))
    add("bias_full_rank4", "basic", r4q, r4k, bias, (vf, (2, 2, 3, 5), dt))
    add("bias_full_rank3", "basic", r3q, r3k, bias, (vf, (2, 3, 5), dt))
    add("bias_scale", "broadcast", r4q, r4k, {"mask": "bias", "scale": 0.125}, (vf, (1, 1, 1, 5), dt))
    pad = {"mask": "padding"}
    keep = [[True, True, False, True, False], [False, False, False, False, False]]  # batch 1 fully masked
    add("padding_bool_rank4", "basic", r4q, r4k, pad, (_mask(keep, DType.BOOL), (2, 5), DType.BOOL))
    add("padding_bool_rank3", "basic", r3q, r3k, pad, (_mask(keep, DType.BOOL), (2, 5), DType.BOOL))
    keep_int = [[1, 0, 1, 1, 1], [0, 0, 0, 0, 0]]
    add("padding_i64_rank4", "basic", r4q, r4k, pad, (_mask(keep_int, DType.I64), (2, 5), DType.I64))
    add("padding_i32_rank3", "basic", r3q, r3k, pad, (_mask(keep_int, DType.I32), (2, 5), DType.I32))
    add("padding_float", "basic", r4q, r4k, pad, (_mask([[1, 1, 1, 0, 0], [0, 2, 0, 1, 0]], dt), (2, 5), dt))
    add("padding_scale", "basic", sq4, (2, 2, 5, 4), {"mask": "padding", "scale": 0.5},
        (_mask([[0, 1, 1, 1, 1], [1, 0, 0, 0, 0]], DType.I64), (2, 5), DType.I64))
    add("size1", "size1", (1, 1, 1, 4), (1, 1, 1, 4), none)
    add("size1_causal", "size1", (1, 1, 4), (1, 1, 4), {"mask": "causal"})
    add("size1_head_dim", "size1", (2, 3, 1), (2, 5, 1), none)
    add("size0_batch", "size0", (0, 2, 3, 4), (0, 2, 5, 4), none)
    c.add("noncontiguous", "noncontiguous", [("q", c.arr(vf, (2, 3, 4), nc=True)),
                                             ("k", c.arr(vf, (2, 5, 4), nc=True)),
                                             ("v", c.arr(vf, (2, 5, 4), nc=True))], none)
    # Scores of a few hundred: softmax must subtract the row max (exp(300) overflows f32).
    add("large", "large", (1, 2, 3, 8), (1, 2, 5, 8), none, qk=_v_mag(5.0, 10.0))
    add("large_causal", "large", (1, 2, 4, 8), (1, 2, 4, 8), {"mask": "causal"}, qk=_v_mag(5.0, 10.0))
    add("nan_inf", "nan_inf", r4q, r4k, bias, (_v_neg_inf_bias, (2, 1, 3, 5), dt))
    add("nan_inf_rank3", "nan_inf", r3q, r3k, bias, (_v_neg_inf_bias, (3, 5), dt))


# -- fallback for ops without a dedicated generator (plugin ops) -----------------------------

def _operand_names(schema: OpSchema) -> list[str]:
    names = [n for n in schema.inputs if not n.endswith("*")]
    if schema.variadic:
        base = schema.inputs[-1][:-1]
        names += [f"{base}0", f"{base}1"]
    return names


def _gen_generic(c: _Cases, schema: OpSchema) -> None:
    """Schema-driven cases for unknown ops: the elementwise/reduction suites when the schema looks
    like one, else one smoke case of positive (2, 3) operands with default attributes."""
    needs_attr = any(a.default is REQUIRED for a in schema.attrs)
    names = {a.name for a in schema.attrs}
    elementwise = not needs_attr and schema.category == "elementwise" and not schema.variadic
    if elementwise and len(schema.inputs) == 1:
        _gen_unary(c)
    elif elementwise and len(schema.inputs) == 2:
        _gen_binary(c)
    elif schema.category == "reduction" and {"axes", "keepdims"} <= names and len(schema.inputs) == 1:
        _gen_reduction(c)
    if not needs_attr:
        vf = v_bool if c.dtype.is_bool else v_positive
        c.add("generic", "basic", [(n, c.arr(vf, (2, 3))) for n in _operand_names(schema)])


#: Generators by case family (``OpSchema.cases.family``: ``unary``, ``binary``, ...) and the
#: dedicated generators of core ops that declare no case spec, by op name.
GENERATORS: dict[str, Callable[[_Cases], None]] = {
    "unary": _gen_unary, "binary": _gen_binary, "where": _gen_where, "cast": _gen_cast,
    "reduction": _gen_reduction, "arg": _gen_arg,
    "matmul": _gen_matmul, "conv2d": _gen_conv2d, "cumsum": _gen_cumsum, "reshape": _gen_reshape,
    "transpose": _gen_transpose, "expand": _gen_expand, "slice": _gen_slice, "concat": _gen_concat,
    "pad": _gen_pad, "gather": _gen_gather, "scatter_add": _gen_scatter_add, "iota": _gen_iota,
    "scatter_reduce": _gen_scatter_reduce, "topk_indices": _gen_topk_indices,
    # HIR ops
    "attention": _gen_attention, "linear": _gen_linear, "conv2d_bias": _gen_conv2d_bias,
    "batch_norm": _gen_batch_norm, "embedding": _gen_embedding,
    **{op: _gen_activation for op in ("relu", "gelu", "silu")},
    **{op: _gen_softmax for op in ("softmax", "log_softmax")},
    **{op: _gen_layer_norm for op in ("layer_norm", "rms_norm")},
    **{op: _gen_pool for op in ("max_pool2d", "avg_pool2d")},
    # the quantized ops (rlx_core.quant registers them; their generators are in quant_cases)
    **QUANT_GENERATORS,
    # the bitwise ops (rlx_core.ir.ops.bitwise; generator in bitwise_cases)
    **BITWISE_GENERATORS,
    # mod on floats and bitcast (rlx_core.ir.ops.exact; generator in ops2_cases)
    **OPS2_GENERATORS,
    # nonzero and non_max_suppression (rlx_core.ir.ops.bounded; generator in bounded_cases)
    **BOUNDED_GENERATORS,
    # conv2d_bias with a residual operand (rlx_cpu.conv2d_bias_add_relu; generator in conv_cases)
    **CONV_GENERATORS,
    # the linear algebra ops (rlx_core.ir.ops.linalg; generators in linalg_cases)
    **LINALG_GENERATORS,
    # the Gaussian splatting ops (rlx_core.ir.ops.splat; generators in splat_cases)
    **SPLAT_GENERATORS,
    # lstm_scan and gru_scan (rlx_core.ir.ops.recurrent; generator in recurrent_cases)
    **RECURRENT_GENERATORS,
}


def _schema(s: OpSchema | str) -> OpSchema:
    return s if isinstance(s, OpSchema) else REGISTRY.get(s)


def cases_for(schema: OpSchema | str, dtype: DType | str, rng_seed: int = 0) -> list[OpCase]:
    """All cases of one op for one dtype; empty if ``dtype`` is not in ``schema.dtypes``.

    Ops with a case spec (``OpSchema.cases``) use the generator of its family in
    :data:`GENERATORS`; other core ops their dedicated generator there. Other ops (plugin ops) get the
    generic suite; each generic case is kept only if the schema's inference accepts it, so an op
    with unusual operands yields fewer cases rather than broken ones.
    """
    schema = _schema(schema)
    dt = DType.parse(dtype)
    if dt not in schema.dtypes or (dt.is_lowp and schema.name not in _LOWP_OPS):
        return []
    c = _Cases(schema.name, dt, rng_seed)
    if schema.cases is not None:
        gen = GENERATORS.get(schema.cases.family)
    else:
        gen = GENERATORS.get(schema.name) if schema.provider == "rlx-core" else None
    if gen is not None:
        gen(c)
        return c.out
    _gen_generic(c, schema)
    kept = []
    for case in c.out:
        try:
            build_case_graph(case)
        except RLXError:
            continue
        kept.append(case)
    return kept


def all_cases(schemas: Iterable[OpSchema | str] | None = None, dtypes: Iterable[DType | str] | None = None,
              rng_seed: int = 0) -> list[OpCase]:
    """Cases for every schema (default: all MIR ops) and every dtype it accepts (or of ``dtypes``)."""
    chosen = [_schema(s) for s in schemas] if schemas is not None else REGISTRY.schemas("mir")
    wanted = None if dtypes is None else [DType.parse(d) for d in dtypes]
    out: list[OpCase] = []
    for s in chosen:
        for dt in (s.dtypes if wanted is None else [d for d in wanted if d in s.dtypes]):
            out.extend(cases_for(s, dt, rng_seed))
    return out


def hir_cases(dtypes: Iterable[DType | str] | None = None, rng_seed: int = 0) -> list[OpCase]:
    """Cases for every core HIR op (:data:`rlx_core.plugin.HIR_OPS`), like :func:`all_cases`."""
    from rlx_core.plugin import HIR_OPS

    return all_cases(HIR_OPS, dtypes, rng_seed)


def build_case_graph(case: OpCase) -> Graph:
    """A graph with the case's arrays as inputs (same names, dtypes, shapes) and one node."""
    from rlx_core.plugin import GraphBuilder

    g = GraphBuilder(case.id.replace("[", "_").replace("]", "_"))
    ins = [g.input(name, DType.parse(arr.dtype), arr.shape) for name, arr in case.inputs]
    out = g.op(case.op, *ins, name="node", **dict(case.attrs))
    for o in out if isinstance(out, tuple) else (out,):
        g.output(o)
    return g.build()


# ---------------------------------------------------------------------------------------------
# Tolerances and comparison

#: Unit roundoff doubled (the distance from 1 to the next float) per floating dtype.
EPS: Mapping[DType, float] = {DType.F16: 2.0**-10, DType.BF16: 2.0**-7, DType.F32: 2.0**-23,
                              DType.F64: 2.0**-52, DType.C64: 2.0**-23}
#: Ops whose result is one of the inputs' values or an exactly representable function of them:
#: those whose schema says ``accuracy="exact"`` (the elementwise ops, max/min reductions, argmax,
#: argmin and the movement ops) and these.
EXACT_OPS: frozenset[str] = frozenset({
    "gather", "iota",
    "relu", "max_pool2d", "embedding"}) | frozenset(  # HIR: max(x, 0), a window's max, a table row
    s.name for s in REGISTRY.schemas() if s.accuracy == "exact")
#: Ops computed by library functions that are accurate to a few ulps, not correctly rounded (the
#: schema says ``accuracy="library"``).
LIBRARY_OPS: frozenset[str] = frozenset(s.name for s in REGISTRY.schemas() if s.accuracy == "library")
#: Ops that sum (or multiply) ``k`` terms per output element (the schema says ``accumulates=True``).
ACCUMULATING_OPS: frozenset[str] = frozenset(s.name for s in REGISTRY.schemas() if s.accumulates)
#: Allowance, in compute-precision ulps, for a library function's error (NumPy's SIMD f32 and
#: libm functions are within 4 ulps; twice that leaves margin without hiding real bugs).
LIBRARY_ULPS = 8
#: Ops whose complex form is still exact or correctly rounded per component.
_COMPLEX_EXACT_ARITH = frozenset({"add", "sub", "cast", "reduce_sum", "cumsum", "scatter_add"})

#: Inexact HIR ops: the storage roundings ``D`` on the longest chain of the core decomposition
#: (each MIR step of it rounds its result to the op's dtype; see :func:`tolerance`). ``linear``:
#: matmul, add. ``conv2d_bias``: conv2d, add. ``attention``: q*scale, q@k^T, +bias, -max, exp, sum,
#: divide, @v. ``layer_norm``: mean, x-mean, square, mean, +eps, rsqrt, two products, +beta.
#: ``rms_norm``: square, mean, +eps, rsqrt, two products. ``batch_norm``: +eps, rsqrt, *scale,
#: x-mean, *inv, +bias. ``gelu`` (tanh form, the longer): x*x, *x, *0.044715, +x, *sqrt(2/pi), tanh,
#: +1, 0.5*x, product. ``silu``: sigmoid, product. ``softmax``: -max, exp, sum, divide.
#: ``log_softmax``: -max, exp, sum, log, subtract. ``avg_pool2d``: the divide (its tap sum is below).
HIR_ROUNDINGS: Mapping[str, int] = {
    "linear": 2, "conv2d_bias": 2, "attention": 8, "layer_norm": 9, "rms_norm": 6, "batch_norm": 6,
    "gelu": 9, "silu": 2, "softmax": 4, "log_softmax": 5, "avg_pool2d": 1}
#: HIR ops that sum ``k`` terms per output in compute precision (f32 for half types).
HIR_ACCUMULATING: frozenset[str] = frozenset({"linear", "conv2d_bias", "attention", "layer_norm",
                                              "rms_norm", "softmax", "log_softmax"})
#: HIR ops whose core decomposition sums ``k`` terms with one storage rounding per addition
#: (``avg_pool2d`` adds its kernel taps pairwise as separate MIR ``add`` nodes).
HIR_STORAGE_ACCUMULATING: frozenset[str] = frozenset({"avg_pool2d"})
#: HIR ops that call library functions (exp, log, erf, tanh, sigmoid, rsqrt).
HIR_LIBRARY: frozenset[str] = frozenset({"attention", "layer_norm", "rms_norm", "batch_norm", "gelu",
                                         "silu", "softmax", "log_softmax"})


def tolerance(dtype: DType | str, op: str, *, k: int = 1, scale: float = 1.0,
              src: DType | str | None = None) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing ``op``'s output of ``dtype`` with the rounded reference.

    A result passes when ``|got - want| <= atol + rtol * |want|``. The rules:

    * **Exact**, ``(0, 0)``: integer and bool outputs (integer arithmetic wraps and is exactly
      specified), and the ops in :data:`EXACT_OPS` (movement, comparisons, ``where``, logical ops,
      ``neg``/``abs``/``sign``, ``floor``/``ceil``/``round``, max/min and their reductions,
      ``argmax``/``argmin``, ``iota``) whose results are input values or exactly representable.
      ``abs`` of a complex ``src`` is a hypot and is not exact.
    * Otherwise let ``e`` be the storage epsilon (f16 ``2**-10``, bf16 ``2**-7``, f32/c64
      ``2**-23``, f64 ``2**-52``) and ``c`` the epsilon of the precision the op must be computed
      in: half types compute in f32 (the contract for every backend: arithmetic and accumulation
      of f16/bf16 happen in at least f32), other types in themselves.

      - ``rtol = 2e + L*c``: the reference is rounded once to storage; a backend may be off by one
        more storage ulp (double rounding through f32), plus ``L`` compute ulps: ``L = 1`` for
        correctly rounded IEEE operations, ``L = LIBRARY_ULPS`` (8) for library functions
        (:data:`LIBRARY_OPS`) and for complex arithmetic other than add/sub.
      - ``atol = e * scale`` for elementwise ops, with ``scale = 1`` since generated operands are
        O(1): a result near zero through cancellation (``sin`` near pi) is only as accurate as its
        operands.
      - Accumulating ops (:data:`ACCUMULATING_OPS`) with ``k`` terms per output add the standard
        summation bound (Higham, *Accuracy and Stability*, ch. 4): ``rtol += k*c`` and
        ``atol = k * c * scale`` where ``scale`` is the magnitude of the summed terms,
        ``max(sum |terms|)`` (what the op computes on ``|inputs|``; :func:`run_case` measures it).
        Half types accumulate in f32, so ``c``, not ``e``, multiplies ``k``.

    This gives f16 ``(1.95e-3, 9.8e-4)``, bf16 ``(1.56e-2, 7.8e-3)``, f32 ``(3.6e-7, 1.2e-7)``
    (``1.2e-6`` relative for library functions), f64 ``(6.7e-16, 2.2e-16)`` for elementwise ops.

    **HIR ops** (:data:`HIR_ROUNDINGS`) may run natively (one rounding) or through their core
    decomposition, whose MIR steps each compute in f32 for half types but store their result in the
    op's dtype. So a chain of ``D`` storage roundings is allowed, and because some steps amplify
    earlier errors (``exp`` turns an absolute score error into a relative one, ``x - mean`` cancels),
    ``scale`` is the op's *condition*: the magnitude the absolute error is proportional to, which
    :func:`accumulation` computes from the inputs (for ``attention`` ``(1 + 2*max|scores|) * max|v|``,
    for norms ``max(|x_hat| + |mean|/sigma) * |gamma| + |beta|``, ``1`` for softmax, ``max |x|`` for
    gelu/silu; see there). With ``a = k*c`` for :data:`HIR_ACCUMULATING` ops (a reduction of ``k``
    terms: dot products, norm statistics, softmax sums), ``a = k*e`` for
    :data:`HIR_STORAGE_ACCUMULATING` ones and ``a = 0`` otherwise:

      - ``rtol = 2e + L*c + D*e + a`` (``L`` as above; :data:`HIR_LIBRARY` ops use library functions)
      - ``atol = (D*e + a) * scale``

    For f32/f64 ``e == c``, so this is the same bound in compute precision. ``relu``,
    ``max_pool2d`` and ``embedding`` are exact (:data:`EXACT_OPS`).
    """
    dt = DType.parse(dtype)
    sdt = DType.parse(src) if src is not None else dt
    if not (dt.is_float or dt.is_complex) or dt.is_lowp:  # a cast into float8/float4 rounds exactly once
        return 0.0, 0.0
    complex_op = dt.is_complex or sdt.is_complex
    schema = REGISTRY.get(op) if op in REGISTRY else None  # ops registered after import too
    accuracy = schema.accuracy if schema is not None else None
    if (op in EXACT_OPS or accuracy == "exact") and not (op == "abs" and complex_op):
        return 0.0, 0.0
    e = EPS[dt]
    c = min(e, EPS[DType.F32])
    if op in HIR_ROUNDINGS:
        chain = HIR_ROUNDINGS[op] * e / 2  # D roundings of at most half an ulp each
        lib = LIBRARY_ULPS if op in HIR_LIBRARY else 1
        acc = k * e if op in HIR_STORAGE_ACCUMULATING else k * c if op in HIR_ACCUMULATING else 0.0
        return 2 * e + lib * c + chain + acc, (chain + acc) * scale
    library = op in LIBRARY_OPS or accuracy == "library" or (complex_op and op not in _COMPLEX_EXACT_ARITH)
    rtol = 2 * e + (LIBRARY_ULPS if library else 1) * c
    if op in ACCUMULATING_OPS or (schema is not None and schema.accumulates):
        return rtol + k * c, k * c * scale
    return rtol, e * scale


def _fmt_index(idx: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in idx) + "]"


def compare(got: Any, want_ref: np.ndarray, dtype: DType | str, op: str, *, k: int = 1,
            scale: float = 1.0, src: DType | str | None = None) -> str | None:
    """Check a backend result against the reference; ``None`` if it matches, else why not.

    ``want_ref`` is the float64 (complex128, exact integer/bool) reference already rounded to the
    storage precision of ``dtype`` (as :func:`rlx_core.plugin.evaluate` returns it).
    Rules: ``got`` must be an ndarray of exactly ``dtype`` and the reference's shape; NaN must be
    at exactly the reference's NaN positions and +-Inf must match exactly (per component for
    complex); finite elements must satisfy :func:`tolerance`. ``k``, ``scale`` and ``src`` are
    passed to :func:`tolerance`.
    """
    rtol, atol = tolerance(dtype, op, k=k, scale=scale, src=src)
    return compare_values(got, want_ref, dtype, op, rtol=rtol, atol=atol)


def compare_values(got: Any, want_ref: np.ndarray, dtype: DType | str, label: str, *, rtol: float,
                   atol: float) -> str | None:
    """:func:`compare` with explicit tolerances (graph tests compute their own); ``label`` starts
    the message. Integer and bool results are compared exactly whatever the tolerances."""
    dt = DType.parse(dtype)
    op = label
    if not isinstance(got, np.ndarray):
        return f"{op}: result is a {type(got).__name__}, expected a numpy ndarray"
    want = np.asarray(want_ref)
    if got.dtype != dt.np:
        return f"{op}: dtype {got.dtype} (expected {dt.np} for {dt})"
    if got.shape != want.shape:
        return f"{op}: shape {got.shape} (expected {want.shape})"
    if got.size == 0:
        return None
    if not (dt.is_float or dt.is_complex):
        w = want.astype(dt.np)
        bad = got != w
        if not bad.any():
            return None
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"{op}[{dt}]: {int(bad.sum())} of {got.size} elements differ (exact dtype); first at "
                f"{_fmt_index(first)}: got {got[first]!r}, expected {w[first]!r}")
    wide = np.complex128 if dt.is_complex else np.float64
    g = got.astype(wide)
    w = want.astype(wide)
    parts = [(g.real, w.real, "")] + ([(g.imag, w.imag, " (imaginary part)")] if dt.is_complex else [])
    for gp, wp, what in parts:
        nan_bad = np.isnan(gp) != np.isnan(wp)
        if nan_bad.any():
            i = tuple(int(v) for v in np.argwhere(nan_bad)[0])
            return (f"{op}[{dt}]: NaN mismatch{what} at {int(nan_bad.sum())} element(s), first "
                    f"{_fmt_index(i)}: got {g[i]}, expected {w[i]}")
        inf_bad = (np.isinf(gp) | np.isinf(wp)) & (gp != wp) & ~np.isnan(gp)
        if inf_bad.any():
            i = tuple(int(v) for v in np.argwhere(inf_bad)[0])
            return (f"{op}[{dt}]: Inf mismatch{what} at {int(inf_bad.sum())} element(s), first "
                    f"{_fmt_index(i)}: got {g[i]}, expected {w[i]}")
    finite = np.isfinite(g) & np.isfinite(w)
    with np.errstate(all="ignore"):
        err = np.where(finite, np.abs(g - w), 0.0)
        bound = atol + rtol * np.abs(w)
        over = err > bound
    if not over.any():
        return None
    with np.errstate(all="ignore"):
        ratio = np.where(over, err / np.where(bound > 0, bound, np.finfo(np.float64).tiny), 0.0)
        rel = np.where(finite & (np.abs(w) > 0), err / np.abs(w), np.where(err > 0, np.inf, 0.0))
    worst = np.unravel_index(int(np.argmax(ratio)), got.shape)
    worst = tuple(int(i) for i in worst)
    return (f"{op}[{dt}]: {int(over.sum())} of {got.size} elements exceed tolerance (rtol={rtol:.3g}, "
            f"atol={atol:.3g}); max abs err {float(err.max()):.6g}, max rel err {float(rel.max()):.6g}; "
            f"worst at {_fmt_index(worst)}: got {g[worst]}, expected {w[worst]}")


# ---------------------------------------------------------------------------------------------
# Running

def accumulation(case: OpCase, graph: Graph | None = None) -> tuple[int, float]:
    """``(k, scale)`` for :func:`tolerance`: terms per output and the magnitude ``max sum |terms|``.

    ``scale`` is the op's own reference evaluated on ``|inputs|`` (data operands only: index
    operands keep their sign), which is exactly ``sum |terms|`` per output for sums, means, dot
    products, convolutions, cumulative and scatter sums (and ``prod |x|`` for products).
    Non-finite values are ignored: those outputs are compared exactly anyway.

    HIR ops have their own rules (:data:`HIR_CONDITION`): ``k`` is the reduction length and
    ``scale`` the magnitude their absolute error is proportional to (see :func:`tolerance`).
    """
    accumulates = case.op in ACCUMULATING_OPS or (case.op in REGISTRY and REGISTRY.get(case.op).accumulates)
    if not accumulates and case.op not in HIR_CONDITION:
        return 1, 1.0
    from rlx_core.plugin import to_reference

    graph = graph or build_case_graph(case)
    if case.op in HIR_CONDITION:
        ins = dict(case.inputs)
        refs = [to_reference(ins[v.name], v.type.dtype) for v in graph.inputs]
        return hir_condition(case.op, refs, graph.nodes[0].attrs)
    node = graph.nodes[0]
    ins = dict(case.inputs)
    condition = REGISTRY.get(case.op).extra.get("condition") if case.op in REGISTRY else None
    if condition is not None:
        # The op states its own error bound (solvers, factorizations: ``n * kappa`` ulps).
        return condition([to_reference(ins[v.name], v.type.dtype) for v in graph.inputs], node.attrs)
    shapes = {n: a.shape for n, a in case.inputs}
    attrs = node.attrs
    op = case.op
    if op == "matmul":
        k = shapes["a"][-1] if shapes["a"] else 1
    elif op == "conv2d":
        _, ci, kh, kw = shapes["w"]
        k = ci * kh * kw
    elif op == "cumsum":
        x = shapes["x"]
        k = x[int(attrs["axis"]) % len(x)] if x else 1  # type: ignore[call-overload]
        attrs = attrs.replace(exclusive=False)  # the inclusive sum bounds the exclusive one too
    elif op == "scatter_add":
        idx = shapes["indices"]
        k = (idx[int(attrs["axis"]) % len(idx)] if idx else 0) + 1  # type: ignore[call-overload]
    else:
        out = graph.types[graph.outputs[0]]
        n_in, n_out = math.prod(shapes[graph.inputs[0].name]), out.numel()
        k = n_in // n_out if n_out else 1
    refs = []
    for v in graph.inputs:
        r = to_reference(ins[v.name], v.type.dtype)
        refs.append(r if v.name == "indices" else np.abs(r).astype(r.dtype))
    try:
        with np.errstate(all="ignore"):
            mag = np.abs(np.asarray(REGISTRY.get(op).reference(refs, attrs)[0]))
    except Exception:
        return max(k, 1), 1.0
    mag = mag[np.isfinite(mag)]
    return max(k, 1), float(mag.max()) if mag.size else 0.0


def _finite_max(x: Any, default: float = 0.0) -> float:
    a = np.abs(np.asarray(x, np.float64))
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else default


def _abs_finite(x: np.ndarray) -> np.ndarray:
    """``|x|`` with non-finite entries zeroed (their outputs are compared exactly)."""
    a = np.abs(np.asarray(x, np.float64))
    return np.where(np.isfinite(a), a, 0.0)


def _cond_linear(xs: Sequence[np.ndarray], attrs: Any) -> tuple[int, float]:
    x, w, b = (_abs_finite(a) for a in xs)
    return w.shape[1] + 1, _finite_max(np.matmul(x, w.T) + b)


def _cond_conv2d_bias(xs: Sequence[np.ndarray], attrs: Any) -> tuple[int, float]:
    x, w, b = (_abs_finite(a) for a in xs)
    _, cg, kh, kw = w.shape
    return cg * kh * kw + 1, _finite_max(REGISTRY.get("conv2d_bias").reference([x, w, b], attrs)[0])


def _cond_attention(xs: Sequence[np.ndarray], attrs: Any) -> tuple[int, float]:
    """``(1 + 0.75 * max S) * max|v|`` with ``S = |q| @ |k|^T * |scale| + |bias|``.

    Every rounding perturbs the output by at most half an ulp of ``max|v|`` (the weights sum to 1),
    but three of attention's eight (``q*scale``, the scores, ``+bias``) perturb the *scores*, by up
    to half an ulp of ``S`` each, and softmax turns an absolute score error into a relative weight
    error, doubled by the max subtraction: ``2 * 3/8 = 0.75`` of the chain per unit of ``S``."""
    q, k, v = (_abs_finite(a) for a in xs[:3])
    # attention's scale attribute, or ONNX's default 1/sqrt(head dim) when it is None.
    scale = float(attrs["scale"]) if attrs["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * abs(scale)
    if attrs["mask"] == "bias":
        s = s + _abs_finite(xs[3])
    return q.shape[-1] + k.shape[-2], (1.0 + 0.75 * _finite_max(s)) * _finite_max(v)


def _norm_stats(x: np.ndarray, attrs: Any) -> tuple[tuple[int, ...], int]:
    axes = tuple(range(normalize_axis(int(attrs["axis"]), x.ndim), x.ndim))
    return axes, math.prod(x.shape[a] for a in axes)


def _cond_layer_norm(xs: Sequence[np.ndarray], attrs: Any) -> tuple[int, float]:
    """``|x_hat| * |gamma| + |beta|``, plus ``|mean| / sigma * |gamma|`` when the mean is a rounded sum
    of several terms: its error shifts every centred value (the cancellation in ``x - mean``)."""
    x, gamma, beta = (np.asarray(a, np.float64) for a in xs)
    axes, n = _norm_stats(x, attrs)
    if x.size == 0:
        return max(n, 1), 1.0
    with np.errstate(all="ignore"):
        mean = x.mean(axis=axes, keepdims=True)
        sigma = np.sqrt(x.var(axis=axes, keepdims=True) + float(attrs["eps"]))
        xhat = np.abs(x - mean) / sigma + (np.abs(mean) / sigma if n > 1 else 0.0)
        mag = xhat * _abs_finite(gamma) + _abs_finite(beta)
    return max(n, 1), _finite_max(mag, 1.0)


def _cond_rms_norm(xs: Sequence[np.ndarray], attrs: Any) -> tuple[int, float]:
    x, gamma = (np.asarray(a, np.float64) for a in xs)
    axes, n = _norm_stats(x, attrs)
    if x.size == 0:
        return max(n, 1), 1.0
    with np.errstate(all="ignore"):
        rms = np.sqrt((x * x).mean(axis=axes, keepdims=True) + float(attrs["eps"]))
        mag = np.abs(x) / rms * _abs_finite(gamma)
    return max(n, 1), _finite_max(mag, 1.0)


def _cond_batch_norm(xs: Sequence[np.ndarray], attrs: Any) -> tuple[int, float]:
    """``(|x| + |mean|) * |inv| + |bias|``: the cancellation in ``x - mean`` and ``... + bias``."""
    x, scale, bias, mean, var = (np.asarray(a, np.float64) for a in xs)
    view = (1, -1) + (1,) * (x.ndim - 2)
    with np.errstate(all="ignore"):
        inv = np.abs(scale) / np.sqrt(var + float(attrs["eps"]))
        mag = ((_abs_finite(x) + np.abs(mean).reshape(view)) * inv.reshape(view)
               + np.abs(bias).reshape(view))
    return 1, _finite_max(mag, 1.0)


def _cond_softmax(xs: Sequence[np.ndarray], attrs: Any) -> tuple[int, float]:
    """Probabilities are at most 1, and an absolute error ``d`` in ``x - max`` changes a probability
    ``p`` by ``p * d``, where ``p * |x - max| <= 1/e``: the scale is 1."""
    x = xs[0]
    return max(int(x.shape[normalize_axis(int(attrs["axis"]), x.ndim)]), 1), 1.0


def _cond_log_softmax(xs: Sequence[np.ndarray], attrs: Any) -> tuple[int, float]:
    """``log(sum exp(x - max))`` lies in ``[0, log k]``; its error is absolute (the sum's relative
    error); ``x - max`` is covered by rtol as ``|output| >= |x - max|``."""
    k, _ = _cond_softmax(xs, attrs)
    return k, 1.0 + math.log(k)


def _cond_elementwise(xs: Sequence[np.ndarray], attrs: Any) -> tuple[int, float]:
    """gelu, silu: ``x * f(x)`` with ``f`` near 0 through cancellation (``1 + erf`` for x << 0):
    the absolute error is proportional to ``|x|``."""
    return 1, max(1.0, _finite_max(xs[0]))


def _cond_avg_pool(xs: Sequence[np.ndarray], attrs: Any) -> tuple[int, float]:
    kh, kw = attrs["kernel"]
    return kh * kw, _finite_max(REGISTRY.get("avg_pool2d").reference([_abs_finite(xs[0])], attrs)[0])


#: ``(k, scale)`` per inexact HIR op from its float64 inputs and attributes (see :func:`tolerance`).
HIR_CONDITION: Mapping[str, Callable[[Sequence[np.ndarray], Any], tuple[int, float]]] = {
    "linear": _cond_linear, "conv2d_bias": _cond_conv2d_bias, "attention": _cond_attention,
    "layer_norm": _cond_layer_norm, "rms_norm": _cond_rms_norm, "batch_norm": _cond_batch_norm,
    "softmax": _cond_softmax, "log_softmax": _cond_log_softmax, "gelu": _cond_elementwise,
    "silu": _cond_elementwise, "avg_pool2d": _cond_avg_pool}


def hir_condition(op: str, inputs: Sequence[np.ndarray], attrs: Any) -> tuple[int, float]:
    """``(k, scale)`` of an inexact HIR op for :func:`tolerance`, from its (float64) inputs."""
    fn = HIR_CONDITION.get(op)
    if fn is None:
        return 1, 1.0
    with np.errstate(all="ignore"):
        return fn(inputs, REGISTRY.get(op).check_attrs(attrs, f"hir_condition({op})"))


def _run_out_of_range(case: OpCase, graph: Graph, session: Any,
                      result: Callable[..., CaseResult]) -> CaseResult:
    """An ``out_of_range`` case passes when the reference and the backend both raise InputError
    (ONNX: an index outside ``[-n, n-1]`` is an error), naming the node and the bad value."""
    from rlx_core.plugin import InputError, evaluate

    try:
        evaluate(graph, {k: np.array(v, copy=True) for k, v in case.feed().items()})
        return result("error", "reference accepted an out-of-range index (the case is wrong)")
    except InputError:
        pass
    path = ""
    try:
        exe = session.compile(graph)
        if exe.report is not None:
            path = ",".join(dict.fromkeys(e.path for e in exe.report.entries))
    except Exception as e:  # as run_case: not compiling is an error (conformance: a skip)
        return result("error", f"{type(e).__name__}: {e}", path)
    try:
        got = exe.run(case.feed())
    except InputError as e:
        if "node" not in str(e) or "out of range" not in str(e):
            return result("failed", f"InputError does not name the node and the range: {e}", path)
        return result("passed", "", path)
    except Exception as e:
        return result("failed", f"an out-of-range index raised {type(e).__name__}, not InputError: {e}",
                      path)
    shown = {k: np.asarray(v).ravel()[:6].tolist() for k, v in got.items()}
    return result("failed", f"an out-of-range index ran without an InputError and returned {shown}", path)


def run_case(case: OpCase, session: Any) -> CaseResult:
    """Compile ``case`` on ``session``, run it, and compare every output with the reference.

    ``error``: building, compiling, running or the reference raised (message has the exception);
    ``failed``: a result differs (message from :func:`compare`); ``passed`` otherwise.
    """
    from rlx_core.plugin import evaluate

    def result(status: str, message: str = "", path: str = "") -> CaseResult:
        return CaseResult(case.id, case.op, case.dtype, case.kind, status, message, path)

    path = ""
    with warnings.catch_warnings():
        # Empty means and 0/0 warn in NumPy; those results (NaN) are checked, not the warning.
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            graph = build_case_graph(case)
        except Exception as e:
            return result("error", f"building the case graph failed: {type(e).__name__}: {e}")
        if case.kind == "out_of_range":
            return _run_out_of_range(case, graph, session, result)
        # The oracle runs first, on private copies: a backend that mutates its inputs can neither
        # corrupt the reference nor go unnoticed (the feed is checked afterwards).
        try:
            want = evaluate(graph, {k: np.array(v, copy=True) for k, v in case.feed().items()})
            k, scale = accumulation(case, graph)
        except Exception as e:
            return result("error", f"reference failed: {type(e).__name__}: {e}", path)
        feed = case.feed()
        before = {n: np.array(v, copy=True) for n, v in feed.items()}
        try:
            exe = session.compile(graph)
            if exe.report is not None:
                path = ",".join(dict.fromkeys(e.path for e in exe.report.entries))
            got = exe.run(feed)
        except Exception as e:
            return result("error", f"{type(e).__name__}: {e}", path)
        for n, v in feed.items():
            if not np.array_equal(np.asarray(v), before[n], equal_nan=True):
                return result("failed", f"the backend modified the caller's input {n!r}", path)
    src = DType.parse(case.inputs[0][1].dtype) if case.inputs else None
    problems = []
    for name in graph.outputs:
        if name not in got:
            problems.append(f"output {name!r} missing")
            continue
        msg = compare(got[name], want[name], graph.types[name].dtype, case.op, k=k, scale=scale, src=src)
        if msg:
            problems.append(msg)
    if problems:
        return result("failed", "; ".join(problems), path)
    return result("passed", "", path)


__all__ = ["ACCUMULATING_OPS", "EPS", "EXACT_OPS", "GENERATORS", "HIR_ACCUMULATING", "HIR_CONDITION",
           "HIR_LIBRARY", "HIR_ROUNDINGS", "HIR_STORAGE_ACCUMULATING", "KINDS", "LARGE", "LIBRARY_OPS",
           "SPECIALS", "CaseResult", "OpCase", "accumulation", "all_cases", "build_case_graph",
           "cases_for", "compare", "compare_values", "hir_cases", "hir_condition", "run_case",
           "tolerance"]
