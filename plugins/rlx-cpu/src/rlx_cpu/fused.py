"""Fused elementwise kernels: Numba-compiled from the shared renderer, cached on disk.

Small tensors run the fused program as a sequence of NumPy ufunc calls into one scratch buffer
(no compile latency); tensors of at least ``NUMBA_MIN`` elements run one generated nogil Numba
loop over rows — a single pass over memory with the intermediates in registers — split over the
cores by :mod:`rlx_cpu.parallel`. The generated
module is written to the RLX cache directory (``cpu-numba``) and given Numba's disk cache there,
so a second process pays no compile time; Numba's index and data files are authenticated (MAC
sidecars, :mod:`rlx_core.cache`) before Numba may load them. Without a usable cache directory the
kernels are compiled in memory.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx_core.plugin import NUMBA_PRELUDE, REGISTRY, Attrs, DType, render_program
from rlx_core.plugin import decode_fused as decode

from . import settings
from .parallel import split_rows

NUMBA_MIN: int = settings.NUMBA_MIN.get()
CODEGEN_DTYPES = frozenset({DType.F32, DType.F64, DType.BOOL, DType.I32, DType.I64})
_LOCK = threading.Lock()


def supported(in_dtypes: Sequence[DType], out_dtype: DType, program: str) -> str | None:
    """``None`` if the CPU can run this fused variant, else why not."""
    if any(d not in CODEGEN_DTYPES for d in [*in_dtypes, out_dtype]):
        return "fused kernels are generated for f32/f64/i32/i64/bool only"
    ops, _ = decode(program)
    for name, _, _ in ops:
        if name == "div" and not all(d.is_float for d in in_dtypes if d is not DType.BOOL):
            return "integer division is not fused (C and Python round differently)"
    try:  # every intermediate must be renderable too (a cast to f16 inside the chain is not)
        render_program(program, [f"x{k}" for k in range(len(in_dtypes))], in_dtypes, "numba")
    except Exception as e:
        return f"not renderable: {e}"
    return None


def _layout(x: np.ndarray, out_shape: tuple[int, ...], split: int) -> str | None:
    """How input ``x`` maps onto the (outer, inner) view of the output split at ``split``."""
    shape = (1,) * (len(out_shape) - x.ndim) + x.shape
    outer, inner = shape[:split], shape[split:]
    o_full = outer == out_shape[:split]
    i_full = inner == out_shape[split:]
    o_one = all(d == 1 for d in outer)
    i_one = all(d == 1 for d in inner)
    if o_full and i_full:
        return "full"
    if o_one and i_one:
        return "scalar"
    if o_one and i_full:
        return "row"
    if o_full and i_one:
        return "col"
    return None


def plan_layouts(ins: Sequence[np.ndarray], out_shape: tuple[int, ...]) -> tuple[int, list[str]] | None:
    r = len(out_shape)
    best = None
    for split in range(r + 1):
        lays = [_layout(x, out_shape, split) for x in ins]
        if all(lays):
            outer = int(np.prod(out_shape[:split], dtype=np.int64))
            if best is None or outer > best[0]:
                best = (outer, split, lays)
    return None if best is None else (best[1], best[2])  # type: ignore[return-value]


def _source(program: str, dtypes: Sequence[DType], lays: Sequence[str], name: str,
            exact: bool = False) -> str:
    exprs = []
    for k, lay in enumerate(lays):
        exprs.append({"full": f"x{k}[r, c]", "scalar": f"x{k}[0, 0]", "row": f"x{k}[0, c]",
                      "col": f"x{k}[r, 0]"}[lay])
    lines, res, _ = render_program(program, exprs, dtypes, "numba")
    args = ", ".join(f"x{k}" for k in range(len(lays)))
    body = "\n".join("            " + ln for ln in lines)
    src = [
        "import math", "import numpy as np", "from numba import njit", "",
        NUMBA_PRELUDE,
        "",
        # exact: no contraction (a*b+c rounds twice, as NumPy's steps do); see _attach_cache for cache
        "@njit(cache=False, nogil=True, error_model='numpy')" if exact else
        "@njit(cache=False, nogil=True, fastmath={'contract'}, error_model='numpy')",
        f"def {name}_rows(o, {args}, lo, hi):",
        "    for r in range(lo, hi):",
        "        for c in range(o.shape[1]):",
        body,
        f"            o[r, c] = {res}",
        "",
    ]
    return "\n".join(src)


CHUNK = 512
#: Transcendental ops evaluated by the vectorisable chunk helpers of :mod:`rlx_cpu.vecmath` (they
#: build 2**n from integer bits, which needs an array view). erf is plain arithmetic in the
#: renderer's prelude, so erf-only programs stay one vectorised loop.
VEC32 = {"exp": "vexp32", "tanh": "vtanh32", "sigmoid": "vsigmoid32"}


def _temp_dtypes(program: str, dtypes: Sequence[DType]) -> list[DType]:
    from rlx_core.plugin import TensorType

    ops, _ = decode(program)
    env = {f"i{k}": d for k, d in enumerate(dtypes)}
    out = []
    for j, (name, args, attrs) in enumerate(ops):
        schema = REGISTRY.get(name)
        dt = schema.infer([TensorType(env[a], ()) for a in args], schema.check_attrs(attrs, "fused"))[0].dtype
        env[f"t{j}"] = dt
        out.append(dt)
    return out


def chunkable(program: str, dtypes: Sequence[DType]) -> bool:
    """Worth the chunked form: some transcendental op on float32 (the scalar form calls libm)."""
    ops, _ = decode(program)
    temps = _temp_dtypes(program, dtypes)
    env = {f"i{k}": d for k, d in enumerate(dtypes)}
    env.update({f"t{j}": d for j, d in enumerate(temps)})
    return any(name in VEC32 and env[args[0]] is DType.F32 for name, args, _ in ops)


def _source_chunked(program: str, dtypes: Sequence[DType], lays: Sequence[str], name: str) -> str:
    """Each op of the program as one loop over an L1-sized chunk; exp/erf/tanh/sigmoid on f32 go
    through the vectorisable helpers, everything else through the shared renderer."""
    from rlx_core.plugin import DIALECTS, render_op

    d = DIALECTS["numba"]
    ops, out = decode(program)
    temps = _temp_dtypes(program, dtypes)
    env_dt = {f"i{k}": dt for k, dt in enumerate(dtypes)}
    env_dt.update({f"t{j}": dt for j, dt in enumerate(temps)})
    load = {"full": "x{k}[r, c0 + i]", "scalar": "x{k}[0, 0]", "row": "x{k}[0, c0 + i]", "col": "x{k}[r, 0]"}

    def ref(a: str) -> str:
        if a.startswith("i"):
            k = int(a[1:])
            return load[lays[k]].format(k=k)
        return f"b{a[1:]}[i]"

    args = ", ".join(f"x{k}" for k in range(len(lays)))
    head = [f"        b{j} = np.empty({CHUNK}, {d.ctype(dt)})" for j, dt in enumerate(temps)]
    head += [f"        ib = np.empty({CHUNK}, np.int32)", f"        s1 = np.empty({CHUNK}, np.float32)",
             f"        s2 = np.empty({CHUNK}, np.float32)", f"        sa = np.empty({CHUNK}, np.float32)"]
    body: list[str] = []
    for j, (op, a_args, attrs) in enumerate(ops):
        if op in VEC32 and env_dt[a_args[0]] is DType.F32:
            a = a_args[0]
            if a.startswith("i"):
                body += ["            for i in range(m):", f"                sa[i] = {ref(a)}"]
                src = "sa"
            else:
                src = f"b{a[1:]}"
            body.append(f"            {VEC32[op]}({src}[:m], b{j}[:m], ib[:m], s1[:m], s2[:m])")
            continue
        expr = render_op(d, op, [ref(a) for a in a_args], [env_dt[a] for a in a_args], temps[j], attrs)
        body += ["            for i in range(m):", f"                b{j}[i] = {expr}"]
    res = ref(out) if out.startswith("i") else f"b{out[1:]}[i]"
    body += ["            for i in range(m):", f"                o[r, c0 + i] = {res}"]

    deco = "@njit(cache=False, nogil=True, fastmath={'contract'}, error_model='numpy')"  # see _attach_cache
    # Scratch is allocated once per call (one call = one thread's rows), not once per row.
    kernel = [deco, f"def {name}_rows(o, {args}, lo, hi):", *[h[4:] for h in head],
              "    for r in range(lo, hi):",
              f"        for c0 in range(0, o.shape[1], {CHUNK}):",
              f"            m = min({CHUNK}, o.shape[1] - c0)", *body, "", ""]
    return "\n".join(["import math", "import numpy as np", "from numba import njit",
                      "from rlx_cpu.vecmath import vexp32, vtanh32, vsigmoid32", NUMBA_PRELUDE, "",
                      *kernel])


def _module_dir() -> Path | None:
    """The authenticated ``cpu-numba`` cache directory, or None: kernels are then compiled in memory."""
    from rlx_core.plugin import cache_subdir

    return cache_subdir("cpu-numba", about="rlx-cpu generated Numba kernels (source, Numba index/data files)")


_MODULES: dict[str, Any] = {}
_SEALED: dict[Path, tuple[int, int]] = {}  # Numba file -> (mtime_ns, size) when we last tagged it


def _attach_cache(mod: Any, d: Path) -> bool:
    """Give the generated kernel Numba's disk cache, pinned to ``d/__pycache__`` (what
    ``njit(cache=True)`` does, minus NUMBA_CACHE_DIR / user-wide fallbacks that would put the
    files outside the RLX cache), after pruning any file there that fails authentication: Numba
    unpickles its index and data files, so they are verified before the dispatcher can read them.
    Verify-then-load is race-free only because ``d`` is a directory only the user can write."""
    from rlx_core.plugin import verify_file

    disp = mod.k_rows
    try:
        from numba.core.caching import CompileResultCacheImpl, FunctionCache, InTreeCacheLocator

        class _Impl(CompileResultCacheImpl):
            _locator_classes = [InTreeCacheLocator]

        class _Cache(FunctionCache):
            _impl_class = _Impl

        cache = _Cache(disp.py_func)
        path = Path(cache.cache_path)
    except Exception:  # a Numba without these internals, or no writable __pycache__: in memory
        return False
    if path.parent != d:
        return False
    files = sorted(path.glob(f"{mod.__name__}.*.nb[ic]"))
    if not all([verify_file(f) for f in files]):  # every file checked (and bad ones deleted)
        for f in path.glob(f"{mod.__name__}.*"):  # an index without its data, or the reverse: all go
            f.unlink(missing_ok=True)
    disp._cache = cache
    return True


def seal_kernel(mod: Any) -> None:
    """Tag the Numba files a compile just wrote (cheap when nothing changed)."""
    from rlx_core.plugin import seal_file

    cache = getattr(mod.k_rows, "_cache", None)
    path = getattr(cache, "cache_path", None)
    if not getattr(mod, "_rlx_cached", False) or path is None:
        return
    for f in Path(path).glob(f"{mod.__name__}.*.nb[ic]"):
        try:
            st = f.stat()
        except OSError:
            continue
        stamp = (st.st_mtime_ns, st.st_size)
        if _SEALED.get(f) != stamp and seal_file(f):
            _SEALED[f] = stamp


def _load_module(name: str, src: str, d: Path | None) -> Any:
    mod = types.ModuleType(name)
    path = None
    if d is not None:
        path = d / f"{name}.py"
        try:
            if not path.is_file() or path.read_text() != src:
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(src)
                os.replace(tmp, path)
        except OSError:
            path = None
    # The code run is always the source generated here, never re-read from disk; the file only
    # anchors Numba's cache (its stamp and its __pycache__ directory).
    code = compile(src, str(path) if path is not None else f"<{name}>", "exec")
    mod.__file__ = str(path) if path is not None else f"<{name}>"
    # what ran: the file may be gone (`rlx cache clear`) or never written
    mod.__dict__["__rlx_source__"] = src
    sys.modules[name] = mod
    exec(code, mod.__dict__)
    mod.__dict__["_rlx_cached"] = path is not None and _attach_cache(mod, path.parent)
    return mod


def compiled_kernel(program: str, dtypes: Sequence[DType], lays: Sequence[str], exact: bool = False) -> Any:
    """The generated module of ``program`` (``exact``: every step rounded as NumPy's is, no FMA
    contraction, for programs that must give the NumPy form's bits)."""
    tag = "|exact" if exact else ""
    key = hashlib.sha256(f"{program}|{[d.value for d in dtypes]}|{list(lays)}{tag}".encode()).hexdigest()[:24]
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is None:
            if exact:
                src = _source(program, dtypes, lays, "k", exact=True)
            else:
                src = (_source_chunked if chunkable(program, dtypes) else _source)(program, dtypes, lays, "k")
            mod = _load_module(f"rlx_fused_{key}", src, _module_dir())
            _MODULES[key] = mod
        return mod


def _numpy_program(ins: Sequence[np.ndarray], o: np.ndarray, program: str) -> Any:
    """The fused program as NumPy calls (small tensors): reference semantics, no compile."""
    lean = _lean_program(ins, o, program)
    if lean is not None:
        return lean
    ops, out = decode(program)
    steps = [(_NP[n], args, Attrs(REGISTRY.get(n).check_attrs(a, "fused"))) for n, args, a in ops]

    def run() -> None:
        env: dict[str, Any] = {f"i{k}": x for k, x in enumerate(ins)}
        with np.errstate(all="ignore"):
            for j, (fn, args, attrs) in enumerate(steps):
                env[f"t{j}"] = fn(*[env[a] for a in args], attrs)
            np.copyto(o, env[out], casting="unsafe")
    return run


#: Ops that are one NumPy ufunc with the same meaning as their ``_NP`` form: run with ``out=``.
_UFUNC: dict[str, Any] = {
    "neg": np.negative, "abs": np.absolute, "sign": np.sign, "exp": np.exp, "log": np.log,
    "sqrt": np.sqrt, "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "floor": np.floor, "ceil": np.ceil,
    "round": np.rint, "logical_not": np.logical_not, "add": np.add, "sub": np.subtract,
    "mul": np.multiply, "div": np.true_divide, "pow": np.power, "maximum": np.maximum,
    "minimum": np.minimum, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_xor": np.logical_xor, "equal": np.equal, "not_equal": np.not_equal, "less": np.less,
    "less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal,
}


def _lean_program(ins: Sequence[np.ndarray], o: np.ndarray, program: str) -> Any:
    """The NumPy form with every intermediate in a buffer made once and every step a bound call
    (``ufunc(a, b, out=t)``): no dictionary, allocation or errstate per run, ~1 us a step instead
    of ~3 (the LayerNorm tail div-mul-add on 256 floats: 11 -> 3 us). The caller runs it with
    floating-point warnings off (CpuProgram._run_all, profile). None where a result's NumPy dtype
    would differ from the planned one or NumPy has no loop for it (the generic form then casts as
    it goes). Binding runs nothing: the output may share its buffer with an input."""
    from functools import partial

    ops, out = decode(program)
    dtypes = [DType.parse(x.dtype) for x in ins]
    try:
        temps = _temp_dtypes(program, dtypes)
    except Exception:
        return None
    env: dict[str, np.ndarray] = {f"i{k}": x for k, x in enumerate(ins)}
    calls: list[Any] = []
    for j, (name, args, attrs) in enumerate(ops):
        xs = [env[a] for a in args]
        shape = np.broadcast_shapes(*[x.shape for x in xs])
        last = f"t{j}" == out and j == len(ops) - 1
        # The last step writes the output itself where it has the output's shape and dtype; an
        # input sharing the output's buffer (an in-place claim) is only read by this step then,
        # and a ufunc handles that overlap.
        buf = o if last and shape == o.shape and temps[j].np == o.dtype else np.empty(shape, temps[j].np)
        uf = _UFUNC.get(name)
        power = _small_power(name, xs, buf)
        if power is not None:
            calls += power
        elif uf is not None:
            if np.result_type(*xs) != buf.dtype and name not in _COMPARE:
                return None
            try:  # a loop for these dtypes (checked now, without running anything)
                uf.resolve_dtypes((*[x.dtype for x in xs], buf.dtype), casting="same_kind")
            except Exception:
                return None
            calls.append(partial(uf, *xs, out=buf))
        else:
            fn, at = _NP[name], Attrs(REGISTRY.get(name).check_attrs(attrs, "fused"))
            calls.append(partial(_into, buf, fn, xs, at))
        env[f"t{j}"] = buf
    res = env[out]
    if res is not o:
        calls.append(partial(np.copyto, o, res, casting="unsafe"))
    if len(calls) == 1:
        return calls[0]

    def run() -> None:
        for c in calls:
            c()
    return run


def _small_power(name: str, xs: Sequence[np.ndarray], buf: np.ndarray) -> list[Any] | None:
    """``x ** 2`` and ``x ** 3`` with a constant exponent (a read-only operand: the program's
    weights) as multiplies: NumPy's float power is a libm call an element (GPT-2's tanh GELU,
    ``pow(x, 3)`` on 1024 floats: ~60 us of its 66). ``x * x`` is the correctly rounded square;
    the cube rounds twice (within an ulp or two of powf, NaN/Inf/-0 alike)."""
    from functools import partial

    if name != "pow" or xs[1].flags.writeable or xs[1].size != 1 or xs[0].dtype != buf.dtype:
        return None
    e = float(xs[1].reshape(-1)[0])
    x = xs[0]
    if e == 2.0 and xs[1].dtype == x.dtype:
        return [partial(np.multiply, x, x, out=buf)]
    if e == 3.0 and xs[1].dtype == x.dtype:
        sq = np.empty(buf.shape, buf.dtype) if np.may_share_memory(buf, x) else buf
        return [partial(np.multiply, x, x, out=sq), partial(np.multiply, sq, x, out=buf)]
    return None


_COMPARE = frozenset({"equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
                      "logical_and", "logical_or", "logical_xor", "logical_not"})


def _into(buf: np.ndarray, fn: Any, xs: Sequence[np.ndarray], at: Attrs) -> None:
    np.copyto(buf, fn(*xs, at), casting="unsafe")


def _np_cast(x: Any, a: Attrs) -> Any:
    to: DType = a["to"]  # type: ignore[assignment]
    if to is DType.BOOL:
        return x != 0
    if to.is_int and np.asarray(x).dtype.kind == "f":
        return np.trunc(x).astype(to.np)
    return np.asarray(x).astype(to.np)


def _np_max(a: Any, b: Any, at: Attrs) -> Any:
    return np.maximum(a, b)


_NP: dict[str, Any] = {
    "neg": lambda x, a: np.negative(x), "abs": lambda x, a: np.abs(x), "sign": lambda x, a: np.sign(x),
    "exp": lambda x, a: np.exp(x), "log": lambda x, a: np.log(x), "sqrt": lambda x, a: np.sqrt(x),
    "rsqrt": lambda x, a: 1 / np.sqrt(x), "reciprocal": lambda x, a: 1 / x,
    "sin": lambda x, a: np.sin(x), "cos": lambda x, a: np.cos(x), "tanh": lambda x, a: np.tanh(x),
    "floor": lambda x, a: np.floor(x), "ceil": lambda x, a: np.ceil(x), "round": lambda x, a: np.rint(x),
    "logical_not": lambda x, a: np.logical_not(x), "add": lambda x, y, a: x + y,
    "sub": lambda x, y, a: x - y, "mul": lambda x, y, a: x * y, "div": lambda x, y, a: x / y,
    "pow": lambda x, y, a: np.power(x, y), "maximum": _np_max, "minimum": lambda x, y, a: np.minimum(x, y),
    "logical_and": lambda x, y, a: np.logical_and(x, y), "logical_or": lambda x, y, a: np.logical_or(x, y),
    "logical_xor": lambda x, y, a: np.logical_xor(x, y), "equal": lambda x, y, a: x == y,
    "not_equal": lambda x, y, a: x != y, "less": lambda x, y, a: x < y, "less_equal": lambda x, y, a: x <= y,
    "greater": lambda x, y, a: x > y, "greater_equal": lambda x, y, a: x >= y,
    "where": lambda c, x, y, a: np.where(c, x, y), "cast": _np_cast,
}


def _np_erf(x: Any, a: Attrs) -> Any:
    from .special import erf

    return erf(x)


def _np_sigmoid(x: Any, a: Attrs) -> Any:
    from .special import expit

    return expit(x)


_NP["erf"] = _np_erf
_NP["sigmoid"] = _np_sigmoid


#: Ops whose NumPy form is many passes (erf: ~60 ufunc calls in float64, 80 us on 512 floats
#: against 3 us generated; sigmoid: three passes and a copy, SiLU 11 against 3 us): a program
#: holding one is generated at any size.
SLOW_NUMPY = frozenset({"erf", "sigmoid"})


#: Ops NumPy runs with SIMD loops (exp, log, tanh, sin, cos: AVX2/AVX-512) where the generated
#: Numba code calls scalar libm once an element: a float program holding one (and nothing of
#: SLOW_NUMPY) runs as NumPy at any size. One thread of NumPy beat the generated code on both
#: threads: GPT-2's tanh GELU (8 steps) on 8x8x128 floats 84 -> 13 us, on 1M floats 2.6 -> 0.9
#: ms; mul-exp-add on 1M floats 1.5 -> 0.8 ms. Pure arithmetic stays generated (5x faster: one
#: pass, no temporaries).
VECTOR_NUMPY = frozenset({"exp", "log", "tanh", "sin", "cos"})


#: Steps from which a program of plain arithmetic is generated at any size: NumPy pays ~1 us a
#: step on small tensors, one compiled call ~0.6 us in all. RoBERTa's position ids at batch 1
#: (``ne -> not -> cast``, then seven steps wrapping negative indices: 4 and 8 us), LLaMA's RoPE
#: on 8x4x8x8 floats (``x*cos + rot*sin``, times a scale: 9.4 us). Programs holding a
#: transcendental NumPy runs with SIMD (:data:`VECTOR_NUMPY`) or a power stay NumPy. Below
#: NUMBA_MIN these are generated ``exact`` (no FMA): the bits of the NumPy form they replace (a
#: trainer's f32 loss scaling by powers of two stays bit-exact, tests/test_amp_qat.py).
SMALL_CODEGEN_MIN_STEPS = 3


def _codegen_small(program: str) -> bool:
    ops, _ = decode(program)
    names = {name for name, _, _ in ops}
    if names & SLOW_NUMPY:
        return True
    return len(ops) >= SMALL_CODEGEN_MIN_STEPS and not names & (VECTOR_NUMPY | {"pow"})


def _numpy_vectorised(program: str, o: np.ndarray) -> bool:
    names = {name for name, _, _ in decode(program)[0]}
    return (o.dtype in (np.float32, np.float64) and bool(names & VECTOR_NUMPY)
            and not names & SLOW_NUMPY)


def _row_length(size: int) -> int:
    """Row length for a program whose operands are all full or scalar (any factorisation of the
    size works): one row below NUMBA_MIN (one thread does it all), else the largest divisor up to
    1024 so the row pool sees many rows; one row again when that divisor is under 64. Rows of
    one element cost the chunked form a slice each: CLIP's QuickGELU on 8x17x64 floats took 720
    instead of ~25 us when 1024 did not divide the size."""
    if size < NUMBA_MIN:
        return max(size, 1)
    best = max(d for d in range(1, 1025) if size % d == 0)
    return best if best >= 64 else size


def k_fused(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs, *,
            force_codegen: bool = False) -> Any:
    """Bind a fused program; ``force_codegen`` returns None instead of a NumPy fallback."""
    o = outs[0]
    program: str = attrs["program"]  # type: ignore[assignment]
    if not force_codegen and ((o.size < NUMBA_MIN and (o.size == 0 or not _codegen_small(program)))
                              or _numpy_vectorised(program, o)):
        return _numpy_program(ins, o, program)
    planned = plan_layouts(ins, o.shape)
    if planned is None:
        return None if force_codegen else _numpy_program(ins, o, program)
    split, lays = planned
    outer = int(np.prod(o.shape[:split], dtype=np.int64))
    inner = int(np.prod(o.shape[split:], dtype=np.int64))
    if split == len(o.shape) or split == 0:  # all full/scalar: let the parallel loop see many rows
        lays = ["scalar" if lay == "scalar" else "full" for lay in lays]
        inner = _row_length(o.size)
        outer = o.size // inner
    o2 = o.reshape(outer, inner)
    views = []
    for x, lay in zip(ins, lays):
        if lay == "full":
            views.append(x.reshape(outer, inner))
        elif lay == "scalar":
            views.append(x.reshape(1, 1))
        elif lay == "row":
            views.append(x.reshape(1, inner))
        else:
            views.append(x.reshape(outer, 1))
    dtypes = [DType.parse(x.dtype) for x in ins]
    exact = o.size < NUMBA_MIN and not {name for name, _, _ in decode(program)[0]} & SLOW_NUMPY
    mod = compiled_kernel(program, dtypes, lays, exact)
    mod.k_rows(o2, *views, 0, 0)  # compile now (bind time), not on the first run
    seal_kernel(mod)
    rows_in = [v for v, lay in zip(views, lays) if lay in ("full", "col")]
    whole_in = [v for v, lay in zip(views, lays) if lay not in ("full", "col")]
    return split_rows(mod.k_rows, outer, (o2, *views), o.size,
                      rows_in=rows_in, whole_in=whole_in, rows_out=[o2])
