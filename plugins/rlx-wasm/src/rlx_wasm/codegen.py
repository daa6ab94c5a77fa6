"""LIR program -> one WebAssembly module.

Linear memory, laid out once per compiled program (every region 64-byte aligned)::

    [0, 64)               reserved (address 0 is never a tensor)
    counters              one i32 per distinct kernel name (incremented by ``run_profile`` only)
    weights               the graph's constants, written once at instantiation (and, for an export,
                          shipped as ``weights.bin``: an exact image of this region)
    scratch               temporary space of kernels that need it (e.g. a runtime W^T)
    arena                 every LIR value at ``arena + plan.offsets[value]`` (the core's liveness
                          plan: reuse and in-place aliasing included)

The module exports ``memory``, ``run`` (every kernel of ``program.steps`` in order: one call per
step, shapes and addresses baked in) and ``run_profile`` (the same calls, each followed by an
increment of its kernel's counter). Kernels are shared between steps of equal shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_core.plugin import DType, Program, RLXError, Step, TensorType, normalize_axis

from . import elementwise as ew
from . import kernels as k
from .wat import TUNINGS, Func, ModuleBuilder, i32

ALIGN = 64
PAGE = 65536
MAX_PAGES = 65536


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Slot:
    """Where a tensor lives in linear memory (absolute byte address)."""

    name: str
    address: int
    dtype: DType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass
class Artifact:
    """Everything needed to instantiate and run one compiled program (in Python or JavaScript)."""

    wat: str
    wasm: bytes
    simd: bool
    pages: int
    counters_offset: int
    kernel_names: list[str]
    weights_offset: int
    weights_size: int
    #: (byte offset inside the weights region, array) for every stored constant
    weights: list[tuple[int, np.ndarray]]
    scratch_offset: int
    scratch_size: int
    arena_offset: int
    arena_size: int
    inputs: list[Slot]
    #: (value name, slot): what run() returns, keyed by LIR value name
    outputs: list[Slot]
    steps: int
    functions: int
    extra: dict[str, Any] = field(default_factory=dict)
    #: the engine the code was tuned for (wat.TUNINGS)
    tune: str = "wasmtime"

    def weights_blob(self) -> bytes:
        """The weights region as bytes (what an export writes to ``weights.bin``)."""
        buf = bytearray(self.weights_size)
        for off, arr in self.weights:
            raw = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
            buf[off:off + raw.size] = raw.tobytes()
        return bytes(buf)


class CodegenError(RLXError):
    """The program cannot be turned into a wasm module (e.g. it needs more than 4 GiB)."""


def _shape(t: TensorType) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


# Checked reads of a step's attributes (the op's schema has given them these types).
def _int(attrs: Mapping[str, object], name: str) -> int:
    v = attrs[name]
    if not isinstance(v, int):
        raise CodegenError(f"attribute {name!r} = {v!r} is not an int")
    return v


def _ints(attrs: Mapping[str, object], name: str) -> tuple[int, ...]:
    v = attrs[name]
    if not isinstance(v, tuple):
        raise CodegenError(f"attribute {name!r} = {v!r} is not a tuple of ints")
    return v


def _float(attrs: Mapping[str, object], name: str) -> float:
    v = attrs[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CodegenError(f"attribute {name!r} = {v!r} is not a float")
    return v


def _str(attrs: Mapping[str, object], name: str) -> str:
    v = attrs[name]
    if not isinstance(v, str):
        raise CodegenError(f"attribute {name!r} = {v!r} is not a string")
    return v


def _linear_weight_transposed(program: Program, s: Step) -> bool:
    return s.op == "linear" and s.inputs[1] in program.graph.weights


def generate(program: Program, simd: bool, tune: str = "wasmtime") -> Artifact:
    """Lay out memory and generate the module's WAT text and binary, tuned for ``tune`` (one of
    ``wat.TUNINGS``: "wasmtime" for the in-process runtime, "js" for V8 under exported loaders)."""
    import wasmtime

    if tune not in TUNINGS:
        raise CodegenError(f"unknown wasm tuning {tune!r} for program {program.graph.name!r}",
                           fix=f"use one of {', '.join(TUNINGS)}")

    g = program.graph
    params = {p.name for p in g.params}
    steps = list(program.kernels)

    # -- weights: every constant a step reads (W^T for linear layers), plus constant outputs ----
    wanted: dict[tuple[str, str], np.ndarray] = {}
    for s in steps:
        for j, name in enumerate(s.inputs):
            if name not in params:
                continue
            arr = np.asarray(g.weights[name])
            want = g.types[name].dtype.np
            if arr.dtype != want:
                arr = arr.astype(want)
            if j == 1 and _linear_weight_transposed(program, s):
                key = ("T", name)
                if key not in wanted:  # W^T packed in the GEMM's column panels
                    wanted[key] = k.pack_b(np.ascontiguousarray(arr.T), simd)
            else:
                wanted.setdefault(("", name), arr)
    for _pub, v in program.outputs:
        if v in params:
            wanted.setdefault(("", v), np.asarray(g.weights[v], dtype=g.types[v].dtype.np))

    names = list(dict.fromkeys(s.kernel for s in steps))
    counters = ALIGN
    woff = _align(counters + 4 * max(len(names), 1))
    weight_at: dict[tuple[str, str], int] = {}
    weights: list[tuple[int, np.ndarray]] = []
    cur = 0
    for key, arr in wanted.items():
        weight_at[key] = woff + cur
        weights.append((cur, arr))
        cur = _align(cur + max(arr.nbytes, 1))
    wsize = cur

    def addr(v: str, transposed: bool = False) -> int:
        if v in params:
            return weight_at[("T" if transposed else "", v)]
        return arena + program.plan.offsets[v]

    # -- kernels (the scratch size is known only after generating them) ------------------------
    mb = ModuleBuilder(simd, tune)
    scratch_base = _align(woff + wsize)
    calls: list[tuple[str, list[str]]] = []
    arena = 0  # placeholder; addresses are patched below once scratch is known
    pending: list[tuple[Step, Any]] = []
    for s in steps:
        pending.append((s, _kernel(mb, program, s)))
    scratch = _align(mb.scratch_bytes) if mb.scratch_bytes else 0
    arena = _align(scratch_base + scratch)
    for s, make_args in pending:
        calls.append((s.kernel, make_args(addr, scratch_base)))
    total = arena + program.plan.arena_bytes
    pages = max(1, -(-total // PAGE))
    if pages > MAX_PAGES:
        raise CodegenError(f"program {g.name!r} needs {total} bytes of linear memory, more than 4 GiB",
                           fix="use smaller shapes (batch, sequence length) for the wasm backend")

    index = {n: i for i, n in enumerate(names)}
    run = Func("$run")
    prof = Func("$run_profile")
    for kname, lines in calls:
        run.emit(*lines)
        prof.emit(*lines)
        a = i32(counters + 4 * index[kname])
        prof.emit(f"(i32.store {a} (i32.add (i32.load {a}) {i32(1)}))")
    wat = mb.render(pages, [run.render(export="run"), prof.render(export="run_profile")])
    wasm = bytes(wasmtime.wat2wasm(wat))

    def slot(v: str) -> Slot:
        t = g.types[v]
        return Slot(v, addr(v), t.dtype, _shape(t))

    return Artifact(
        wat=wat, wasm=wasm, simd=simd, pages=pages, counters_offset=counters, kernel_names=names,
        weights_offset=woff, weights_size=wsize, weights=weights, scratch_offset=scratch_base,
        scratch_size=scratch, arena_offset=arena, arena_size=program.plan.arena_bytes,
        inputs=[slot(v.name) for v in program.inputs],
        outputs=[slot(v) for v in dict.fromkeys(v for _, v in program.outputs)],
        steps=len(steps), functions=len(mb.funcs), tune=tune)


# ---------------------------------------------------------------------------------------------
# One step -> a kernel function and the arguments of its call


def _call(fname: str, args: list[str]) -> str:
    return f"(call {fname} {' '.join(args)})"


def _kernel(mb: ModuleBuilder, program: Program, s: Step) -> Any:
    """Generate the step's kernel now; return ``make(addr, scratch) -> call lines``."""
    g = program.graph
    ins = [g.types[i] for i in s.inputs]
    out = g.types[s.outputs[0]]
    attrs = dict(s.attrs)
    op = s.op
    ins_v = s.inputs
    out_v = s.outputs[0]

    def simple(fname: str, transposed: dict[int, bool] | None = None) -> Any:
        def make(addr: Any, scratch: int) -> list[str]:
            args = [i32(addr(x, bool((transposed or {}).get(j)))) for j, x in enumerate(ins_v)]
            return [_call(fname, args + [i32(addr(out_v))])]
        return make

    if op == "fused_elementwise":
        return simple(ew.elementwise_kernel(mb, ew.decode_program(_str(attrs, "program")), ins, out))
    if op in ew.SUPPORTED:
        return simple(ew.elementwise_kernel(mb, ew.single_op_program(op, len(ins_v), attrs), ins, out))
    isz = out.dtype.itemsize
    if op == "reshape":
        fname = k.copy_kernel(mb, [math.prod(_shape(out))], [1], 0, [1], 0, isz)

        def make_reshape(addr: Any, scratch: int) -> list[str]:
            src, dst = addr(ins_v[0]), addr(out_v)
            return [] if src == dst else [_call(fname, [i32(src), i32(dst)])]
        return make_reshape
    if op == "transpose":
        oshape, st = k.transpose_args(_shape(ins[0]), None if attrs["perm"] is None else _ints(attrs, "perm"))
        return simple(k.copy_kernel(mb, oshape, st, 0, ew.contiguous_strides(oshape), 0, isz))
    if op == "expand":
        eshape = _shape(out)
        st = ew.broadcast_strides(_shape(ins[0]), eshape)
        return simple(k.copy_kernel(mb, eshape, st, 0, ew.contiguous_strides(eshape), 0, isz))
    if op == "slice":
        from rlx_core.plugin import slice_params

        shape = list(_shape(ins[0]))
        own = ew.contiguous_strides(shape)
        st = list(own)
        offset = 0
        oshape = list(_shape(out))
        for ax, sl in slice_params(s.attrs, shape):
            start, _stop, step = sl.indices(shape[ax])
            st[ax] = own[ax] * step
            if oshape[ax]:
                offset += start * own[ax]
        return simple(k.copy_kernel(mb, oshape, st, offset, ew.contiguous_strides(oshape), 0, isz))
    if op == "concat":
        oshape = list(_shape(out))
        ax = normalize_axis(_int(attrs, "axis"), len(oshape))
        ost = ew.contiguous_strides(oshape)
        fnames, at = [], 0
        for t in ins:
            sh = list(_shape(t))
            fnames.append(k.copy_kernel(mb, sh, ew.contiguous_strides(sh), 0, ost, at * ost[ax], isz))
            at += sh[ax]

        def make_concat(addr: Any, scratch: int) -> list[str]:
            return [_call(f, [i32(addr(x)), i32(addr(out_v))]) for f, x in zip(fnames, ins_v)]
        return make_concat
    if op == "pad":
        oshape = list(_shape(out))
        r = len(oshape)
        pads = _ints(attrs, "pads")
        ost = ew.contiguous_strides(oshape)
        fill = k.fill_kernel(mb, math.prod(oshape) * isz, out.dtype, _float(attrs, "value"))
        sh = list(_shape(ins[0]))
        offset = sum(pads[i] * ost[i] for i in range(r))
        cp = k.copy_kernel(mb, sh, ew.contiguous_strides(sh), 0, ost, offset, isz)

        def make_pad(addr: Any, scratch: int) -> list[str]:
            return [_call(fill, [i32(addr(out_v))]), _call(cp, [i32(addr(ins_v[0])), i32(addr(out_v))])]
        return make_pad
    if op == "gather":
        return simple(k.gather_kernel(mb, ins[0], ins[1], _int(attrs, "axis")))
    if op == "iota":
        return simple(k.iota_kernel(mb, out, _int(attrs, "axis")))
    if op.startswith("reduce_"):
        axes = None if attrs["axes"] is None else _ints(attrs, "axes")
        return simple(k.reduce_kernel(mb, op, ins[0], axes))
    if op in ("argmax", "argmin"):
        return simple(k.arg_kernel(mb, op, ins[0], _int(attrs, "axis")))
    if op == "cumsum":
        return simple(k.cumsum_kernel(mb, ins[0], _int(attrs, "axis"), bool(attrs["exclusive"]),
                                      bool(attrs["reverse"])))
    if op == "matmul":
        return simple(k.matmul_kernel(mb, ins[0], ins[1], out))
    if op == "linear":
        tw = _linear_weight_transposed(program, s)
        fname = k.linear_kernel(mb, ins[0], ins[1], tw)

        def make_linear(addr: Any, scratch: int) -> list[str]:
            args = [i32(addr(ins_v[0])), i32(addr(ins_v[1], tw)), i32(addr(ins_v[2])), i32(addr(out_v))]
            if not tw:
                args.append(i32(scratch))
            return [_call(fname, args)]
        return make_linear
    if op == "conv2d":
        fname = k.conv2d_kernel(mb, ins[0], ins[1], out, s.attrs)

        def make_conv(addr: Any, scratch: int) -> list[str]:
            return [_call(fname, [i32(addr(ins_v[0])), i32(addr(ins_v[1])), i32(addr(out_v)), i32(scratch)])]
        return make_conv
    if op == "scatter_add":
        return simple(k.scatter_add_kernel(mb, ins[0], ins[1], _int(attrs, "axis")))
    if op in ("softmax", "log_softmax"):
        return simple(k.softmax_kernel(mb, ins[0], _int(attrs, "axis"), op == "log_softmax"))
    if op == "layer_norm":
        return simple(k.layer_norm_kernel(mb, ins[0], _int(attrs, "axis"), _float(attrs, "eps")))
    raise CodegenError(f"rlx-wasm has no code generator for {s.kernel} ({op})",
                       fix="this is a bug in rlx-wasm: a claimed op has no kernel")
