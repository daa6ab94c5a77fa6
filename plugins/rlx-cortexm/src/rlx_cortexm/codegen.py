"""LIR program -> one C program: constants in flash, one static arena laid out by the LIR memory planner,
and one function that calls a kernel per step, in order.

``rlx_model.c`` holds the weights as ``static const`` arrays, kernel parameter blocks, the softmax
tables, ``uint8_t rlx_arena[RLX_ARENA_BYTES]`` (``program.plan.arena_bytes``; every tensor lives at
its planned offset, values with disjoint lifetimes share bytes) and ``rlx_model_run()``.
``rlx_model.h`` declares the input/output table the harness (``rlx_main.c``) reads and writes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rlx_core.plugin import DType, Program, Step, TensorType, normalize_axis, safe_comment

from . import __version__

CTYPE = {DType.I8: "int8_t", DType.U8: "uint8_t", DType.BOOL: "uint8_t", DType.I16: "int16_t",
         DType.I32: "int32_t", DType.I64: "int64_t", DType.F32: "float", DType.F64: "double",
         DType.F16: "uint16_t", DType.BF16: "uint16_t"}
MAX_RANK = 8


class CodegenError(Exception):
    pass


def f32_literal(x: float) -> str:
    v = float(np.float32(x))
    if math.isnan(v):
        return '__builtin_nanf("")'
    if math.isinf(v):
        return "__builtin_inff()" if v > 0 else "(-__builtin_inff())"
    return v.hex() + "f"


def _f64_literal(x: float) -> str:
    if math.isnan(x):
        return '__builtin_nan("")'
    if math.isinf(x):
        return "__builtin_inf()" if x > 0 else "(-__builtin_inf())"
    return float(x).hex()


def int_literal(v: int, bits: int = 32) -> str:
    if v == -(2 ** (bits - 1)):
        return f"(-{2 ** (bits - 1) - 1}{'LL' if bits == 64 else ''} - 1)"
    return f"{v}LL" if bits == 64 else str(v)


def _values(arr: np.ndarray, dt: DType) -> list[str]:
    flat = np.asarray(arr).reshape(-1)
    if dt is DType.F32:
        return [f32_literal(v) for v in flat.tolist()]
    if dt is DType.F64:
        return [_f64_literal(v) for v in flat.tolist()]
    if dt in (DType.F16, DType.BF16):
        return [str(int(v)) for v in flat.view(np.uint16).tolist()]
    if dt is DType.BOOL:
        return ["1" if v else "0" for v in flat.tolist()]
    if dt is DType.I64:
        return [int_literal(int(v), 64) for v in flat.tolist()]
    if dt is DType.I32:
        return [int_literal(int(v)) for v in flat.tolist()]
    return [str(int(v)) for v in flat.tolist()]


def c_array(name: str, arr: np.ndarray, dt: DType, comment: str = "") -> str:
    vals = _values(arr, dt) or ["0"]
    per = 16 if dt in (DType.I8, DType.U8, DType.BOOL) else 8
    rows = [", ".join(vals[i:i + per]) for i in range(0, len(vals), per)]
    body = ",\n    ".join(rows)
    head = f"/* {safe_comment(comment)} */\n" if comment else ""
    return (f"{head}static const {CTYPE[dt]} {name}[{len(vals)}] __attribute__((aligned(8))) = {{\n"
            f"    {body}\n}};\n")


def _strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def _shape(t: TensorType) -> tuple[int, ...]:
    if not t.is_static:
        raise CodegenError(f"shape {t} is symbolic; the program must be specialised")
    return tuple(int(d) for d in t.shape)


def _ints(s: Step, name: str) -> tuple[int, ...]:
    """An ``ints`` attribute of ``s`` (the op's schema has checked its elements)."""
    v = s.attrs[name]
    if not isinstance(v, tuple):
        raise CodegenError(f"{s.op}: attribute {name!r} = {v!r} is not a tuple of ints")
    return v


@dataclass
class Generated:
    """The model-specific sources and what they contain."""

    files: dict[str, str]
    arena_bytes: int
    weight_bytes: int
    kernels: list[str]
    #: (value, dtype, shape, nbytes) in rlx_in.bin / rlx_out.bin order
    inputs: list[tuple[str, str, tuple[int, ...], int]] = field(default_factory=list)
    outputs: list[tuple[str, str, tuple[int, ...], int]] = field(default_factory=list)


class _Ctx:
    def __init__(self, program: Program) -> None:
        self.p = program
        self.g = program.graph
        self.params = {p.name for p in self.g.params}
        self.names: dict[str, str] = {}
        self.decls: list[str] = []
        self.counter = 0

    def type(self, v: str) -> TensorType:
        return self.g.types[v]

    def shape(self, v: str) -> tuple[int, ...]:
        return _shape(self.type(v))

    def numel(self, v: str) -> int:
        return int(math.prod(self.shape(v)))

    def const_name(self, v: str) -> str:
        if v not in self.names:
            self.names[v] = f"rlx_w{len(self.names)}"
        return self.names[v]

    def ptr(self, v: str) -> str:
        """A C expression pointing at value ``v``: a const array, or its planned arena slot."""
        ct = CTYPE[self.type(v).dtype]
        if v in self.params:
            return self.const_name(v)
        return f"(({ct} *)(rlx_arena + {self.p.plan.offsets[v]}))"

    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"rlx_{base}{self.counter}"

    def decl(self, text: str) -> None:
        self.decls.append(text)


def _bcast(ctx: _Ctx, a: str, b: str, out: str) -> str:
    shape = ctx.shape(out)
    r = len(shape)
    if r > MAX_RANK:
        raise CodegenError(f"rank {r} > {MAX_RANK}")

    def strides(v: str) -> list[int]:
        s = (1,) * (r - len(ctx.shape(v))) + ctx.shape(v)
        st = _strides(s)
        return [0 if s[d] == 1 else st[d] for d in range(r)]

    name = ctx.fresh("bcast")
    arr = lambda xs: "{" + ", ".join(str(x) for x in xs) + "}" if xs else "{0}"  # noqa: E731
    ctx.decl(f"static const rlx_bcast_t {name} = {{{r}, {int(math.prod(shape))}, {arr(shape)}, "
             f"{arr(strides(a))}, {arr(strides(b))}}};\n")
    return name


def _split_axis(shape: Sequence[int], axis: int) -> tuple[int, int, int]:
    return int(math.prod(shape[:axis])), int(shape[axis]), int(math.prod(shape[axis + 1:]))


# -- emitters, keyed by claim name -------------------------------------------------------------

def _e_quantize(ctx: _Ctx, s: Step) -> str:
    (x,), (y,) = s.inputs, s.outputs
    return (f"rlx_quantize_f32_s8({ctx.ptr(x)}, {ctx.ptr(y)}, {ctx.numel(x)}, "
            f"{f32_literal(float(s.attrs['scale']))}, {int(s.attrs['zero_point'])});")  # type: ignore[arg-type]


def _e_dequantize(ctx: _Ctx, s: Step) -> str:
    (x,), (y,) = s.inputs, s.outputs
    return (f"rlx_dequantize_s8_f32({ctx.ptr(x)}, {ctx.ptr(y)}, {ctx.numel(x)}, "
            f"{f32_literal(float(s.attrs['scale']))}, {int(s.attrs['zero_point'])});")  # type: ignore[arg-type]


def _e_fully_connected(ctx: _Ctx, s: Step) -> str:
    x, w, b = s.inputs
    (y,) = s.outputs
    n, k = ctx.shape(w)
    m = int(math.prod(ctx.shape(x)[:-1]))
    return (f"rlx_fully_connected_s8({ctx.ptr(x)}, {ctx.ptr(w)}, {ctx.ptr(b)}, {ctx.ptr(y)}, {m}, {n}, {k}, "
            f"{-int(s.attrs['x_zero_point'])});")  # type: ignore[arg-type]


def _conv_params(ctx: _Ctx, s: Step) -> str:
    x, w, _ = s.inputs
    (y,) = s.outputs
    n, h, wd, c = ctx.shape(x)
    o, kh, kw, _ = ctx.shape(w)
    _, ho, wo, _ = ctx.shape(y)
    sh, sw = _ints(s, "strides")
    pt, pl, _, _ = _ints(s, "pads")
    dh, dw = _ints(s, "dilations")
    name = ctx.fresh("conv")
    vals = [n, h, wd, c, o, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, int(s.attrs["groups"]),  # type: ignore[arg-type]
            -int(s.attrs["x_zero_point"])]  # type: ignore[arg-type]
    ctx.decl(f"static const rlx_conv_params_t {name} = {{{', '.join(map(str, vals))}}};\n")
    return name


def _e_convolve(ctx: _Ctx, s: Step) -> str:
    x, w, b = s.inputs
    p = _conv_params(ctx, s)
    return f"rlx_convolve_s8({ctx.ptr(x)}, {ctx.ptr(w)}, {ctx.ptr(b)}, {ctx.ptr(s.outputs[0])}, &{p});"


def _e_depthwise(ctx: _Ctx, s: Step) -> str:
    x, w, b = s.inputs
    p = _conv_params(ctx, s)
    return f"rlx_depthwise_conv_s8({ctx.ptr(x)}, {ctx.ptr(w)}, {ctx.ptr(b)}, {ctx.ptr(s.outputs[0])}, &{p});"


def _e_requantize(ctx: _Ctx, s: Step) -> str:
    x, m, sh = s.inputs
    (y,) = s.outputs
    a = s.attrs
    return (f"rlx_requantize_s32_s8({ctx.ptr(x)}, {ctx.ptr(m)}, {ctx.ptr(sh)}, {ctx.ptr(y)}, {ctx.numel(x)}, "
            f"{ctx.numel(m)}, {ctx.numel(sh)}, {int(a['zero_point'])}, {int(a['act_min'])}, "  # type: ignore[arg-type]
            f"{int(a['act_max'])});")  # type: ignore[arg-type]


def _pool(ctx: _Ctx, s: Step, fn: str) -> str:
    (x,), (y,) = s.inputs, s.outputs
    from rlx_core.plugin import pool_geometry

    (kh, kw), (sh, sw), (pt, pl, _, _) = pool_geometry(s.op, s.attrs)
    n, h, w, c = ctx.shape(x)
    _, ho, wo, _ = ctx.shape(y)
    name = ctx.fresh("pool")
    vals = [n, h, w, c, kh, kw, sh, sw, pt, pl, ho, wo]
    ctx.decl(f"static const rlx_pool_params_t {name} = {{{', '.join(map(str, vals))}}};\n")
    return f"{fn}({ctx.ptr(x)}, {ctx.ptr(y)}, &{name});"


def _e_softmax(ctx: _Ctx, s: Step) -> str:
    from rlx_core.plugin import softmax_lut

    (x,), (y,) = s.inputs, s.outputs
    shape = ctx.shape(x)
    ax = normalize_axis(int(s.attrs["axis"]), len(shape))  # type: ignore[arg-type]
    outer, n, inner = _split_axis(shape, ax)
    lut = ctx.fresh("softmax_lut")
    ctx.decl(c_array(lut, softmax_lut(float(s.attrs["scale"]), float(s.attrs["beta"])), DType.I32,  # type: ignore[arg-type]
                     f"exp table of {s.node}: round(2**16 exp(-beta * scale * d))"))
    return f"rlx_softmax_s8({ctx.ptr(x)}, {ctx.ptr(y)}, {outer}, {n}, {inner}, {lut});"


def _e_argmax(ctx: _Ctx, s: Step) -> str:
    (x,), (y,) = s.inputs, s.outputs
    shape = ctx.shape(x)
    ax = normalize_axis(int(s.attrs["axis"]), len(shape))  # type: ignore[arg-type]
    outer, n, inner = _split_axis(shape, ax)
    return f"rlx_argmax_s8({ctx.ptr(x)}, {ctx.ptr(y)}, {outer}, {n}, {inner});"


def _e_binary(fn: str) -> Callable[[_Ctx, Step], str]:
    def emit(ctx: _Ctx, s: Step) -> str:
        a, b = s.inputs
        (y,) = s.outputs
        bc = _bcast(ctx, a, b, y)
        return f"{fn}({ctx.ptr(a)}, {ctx.ptr(b)}, {ctx.ptr(y)}, &{bc});"
    return emit


def _e_reshape(ctx: _Ctx, s: Step) -> str:
    (x,), (y,) = s.inputs, s.outputs
    if x not in ctx.params and ctx.p.plan.offsets.get(x) == ctx.p.plan.offsets.get(y):
        return "/* in place: the planner gave input and output the same bytes */"
    return f"rlx_copy({ctx.ptr(x)}, {ctx.ptr(y)}, {ctx.type(y).nbytes()}u);"


def _e_transpose(ctx: _Ctx, s: Step) -> str:
    (x,), (y,) = s.inputs, s.outputs
    xs = ctx.shape(x)
    r = len(xs)
    perm = (tuple(reversed(range(r))) if s.attrs["perm"] is None
            else tuple(normalize_axis(p, r) for p in _ints(s, "perm")))
    st = _strides(xs)
    shape = [xs[p] for p in perm]
    strides = [st[p] for p in perm]
    name = ctx.fresh("transpose")
    arr = lambda xs_: "{" + ", ".join(str(v) for v in xs_) + "}" if xs_ else "{0}"  # noqa: E731
    ctx.decl(f"static const rlx_transpose_t {name} = {{{r}, {int(math.prod(shape))}, {arr(shape)}, "
             f"{arr(strides)}}};\n")
    return f"rlx_transpose({ctx.ptr(x)}, {ctx.ptr(y)}, {ctx.type(x).dtype.itemsize}, &{name});"


EMITTERS: dict[str, Callable[[_Ctx, Step], str]] = {
    "cortexm.quantize_f32_s8": _e_quantize,
    "cortexm.dequantize_s8_f32": _e_dequantize,
    "cortexm.fully_connected_s8": _e_fully_connected,
    "cortexm.convolve_s8": _e_convolve,
    "cortexm.depthwise_conv_s8": _e_depthwise,
    "cortexm.requantize_s32_s8": _e_requantize,
    "cortexm.max_pool_s8": lambda c, s: _pool(c, s, "rlx_max_pool_s8"),
    "cortexm.avg_pool_s8": lambda c, s: _pool(c, s, "rlx_avg_pool_s8"),
    "cortexm.softmax_s8": _e_softmax,
    "cortexm.argmax_s8": _e_argmax,
    "cortexm.maximum_s8": _e_binary("rlx_maximum_s8"),
    "cortexm.add_f32": _e_binary("rlx_add_f32"),
    "cortexm.reshape": _e_reshape,
    "cortexm.transpose": _e_transpose,
}


def _describe(ctx: _Ctx, s: Step) -> str:
    ins = ", ".join(f"{i}: {ctx.type(i)}" for i in s.inputs)
    outs = ", ".join(f"{o}: {ctx.type(o)}" for o in s.outputs)
    # Value and node names come from the model file: only ever inside a sanitised comment.
    return safe_comment(f"{outs} = {s.op}({ins}) [{s.kernel}; {s.path} from {s.origin}]", limit=160)


def generate(program: Program) -> Generated:
    """The model-specific C sources of ``program`` (the kernels and the harness are static files)."""
    ctx = _Ctx(program)
    g = program.graph
    body: list[str] = []
    kernels: list[str] = []
    for s in program.kernels:
        emit = EMITTERS.get(s.kernel)
        if emit is None:
            raise CodegenError(f"no C emitter for kernel {s.kernel} (node {s.node})")
        body.append(f"    /* {_describe(ctx, s)} */\n    {emit(ctx, s)}\n")
        kernels.append(s.kernel)
    arena = max(int(program.plan.arena_bytes), 1)

    def io_entry(v: str) -> str:
        nbytes = g.types[v].nbytes()
        if v in ctx.params:
            return f"    {{(void *){ctx.const_name(v)}, {nbytes}u}}, /* {safe_comment(v)} */"
        return (f"    {{rlx_arena + {program.plan.offsets[v]}, {nbytes}u}}, "
                f"/* {safe_comment(f'{v}: {g.types[v]}')} */")

    ins = [io_entry(v.name) for v in program.inputs]
    outs = [io_entry(v) for _, v in program.outputs]
    weights: list[str] = []
    weight_bytes = 0
    for p in g.params:
        if p.name in ctx.names:
            arr = np.asarray(g.weights[p.name])
            weight_bytes += arr.nbytes
            weights.append(c_array(ctx.names[p.name], arr, p.type.dtype, f"{p.name}: {p.type}"))
    header = (f"/* Generated by rlx-cortexm {__version__} from graph {safe_comment(g.name)} "
              f"(fingerprint {program.fingerprint[:16]}).\n"
              f" * {len(program.kernels)} kernel steps; arena {arena} bytes (planned by the LIR memory "
              f"planner; {program.plan.naive_bytes} without reuse); {weight_bytes} bytes of constants in "
              f"flash. */\n")
    model_h = (header + "#ifndef RLX_MODEL_H\n#define RLX_MODEL_H\n#include \"rlx_io.h\"\n\n"
               f"#define RLX_ARENA_BYTES {arena}u\n\n"
               "/* Every tensor (inputs, outputs, intermediates) at its offset from the memory planner. */\n"
               "extern uint8_t rlx_arena[RLX_ARENA_BYTES];\n#endif\n")
    model_c = (header + "#include \"rlx_kernels.h\"\n#include \"rlx_model.h\"\n\n"
               "uint8_t rlx_arena[RLX_ARENA_BYTES]\n"
               "    __attribute__((aligned(64), section(\".bss.rlx_arena\")));\n\n"
               + "".join(w + "\n" for w in weights)
               + "".join(ctx.decls) + "\n"
               + "const rlx_io_t rlx_model_inputs[] = {\n"
               + ("\n".join(ins) if ins else "    {0, 0u},") + "\n};\n"
               + f"const uint32_t rlx_model_num_inputs = {len(ins)}u;\n"
               + "const rlx_io_t rlx_model_outputs[] = {\n" + ("\n".join(outs) if outs else "    {0, 0u},")
               + "\n};\n" + f"const uint32_t rlx_model_num_outputs = {len(outs)}u;\n\n"
               + "void rlx_model_run(void)\n{\n" + "".join(body) + "}\n")
    gen = Generated({"rlx_model.c": model_c, "rlx_model.h": model_h}, arena, weight_bytes, kernels)
    for v in program.inputs:
        gen.inputs.append((v.name, v.type.dtype.value, _shape(v.type), v.type.nbytes()))
    for _, out in program.outputs:
        t = g.types[out]
        gen.outputs.append((out, t.dtype.value, _shape(t), t.nbytes()))
    return gen

