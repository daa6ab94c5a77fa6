"""RTL generation: one LIR program of INT8 steps as one synthesizable Verilog module.

The module ``rlx_top`` has one ready/valid input stream and one ready/valid output stream of 32-bit
beats (one tensor element per beat, int8 values sign-extended). Graph inputs arrive in
``program.inputs`` order, row-major; outputs leave in ``program.outputs`` order. A finite-state
machine then runs the steps in program order:

* ``matmul_i8`` -- ``P`` parallel 8x9-bit MACs (``P`` output features at once); each MAC lane reads
  its own weight bank (``w`` rows ``n`` with ``n % P == lane``), a synchronous-read ROM initialised
  from a ``.mem`` file with ``$readmemh`` (block RAM) when the weights are constants. One cycle per
  ``k`` plus 2 cycles per block of ``P`` outputs; the 32-bit accumulators wrap like the reference.
* ``requantize`` -- TFLite's MultiplyByQuantizedMultiplier (SaturatingRoundingDoublingHighMul then
  RoundingDivideByPOT), + zero point (wrapping), clamp to ``[act_min, act_max]``: one element per
  cycle, multiplier/shift broadcast as scalar, trailing (per-channel) or full blocks.
* ``maximum`` on int8 (the ReLU of an INT8 graph is ``maximum(x, zero_point)``): one element/cycle.
* ``add`` on float32 -- an IEEE 754 binary32 adder (round to nearest even, subnormals, Inf, NaN).
* ``reshape`` -- no hardware: the output is the input's memory.
* ``conv2d_i8`` / ``max_pool2d_i8`` / ``avg_pool2d_i8`` -- a window address generator over the NHWC
  input: per output element, one tap (kernel row, column, input channel) per cycle; a tap in the
  padding is not read (conv: contributes 0, max: -128, avg: not counted), strides, dilations and
  groups (depthwise) in the address arithmetic; conv accumulates ``(x - zp) * w`` on the bias in a
  wrapping 32-bit register, avg divides (rounding half away from zero) by the count of real taps.

Every value lives in its own memory (no arena sharing): activations in register arrays, constant
weights in ROMs. The generated code is plain Verilog-2005 (it also compiles with ``iverilog -g2012``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rlx_core.plugin import identifier, safe_comment

#: the ops (and their claimed dtypes) the generator implements
SUPPORTED = ("matmul_i8", "requantize", "maximum", "reshape", "add", "conv2d_i8", "max_pool2d_i8",
             "avg_pool2d_i8")

#: window ops: one address-generated tap per cycle over the NHWC input (padding never read)
WINDOW_OPS = ("conv2d_i8", "max_pool2d_i8", "avg_pool2d_i8")


class RTLError(Exception):
    pass


@dataclasses.dataclass
class Mem:
    """A value's storage: ``name`` (Verilog identifier), width (8 or 32), element count, and for a
    constant its data (and banks for a matmul weight)."""

    name: str
    width: int
    numel: int
    const: np.ndarray | None = None
    banks: int = 0           # >0: a banked weight ROM (rows n % banks), see :func:`_bank_rows`
    bank_depth: int = 0


@dataclasses.dataclass
class Design:
    verilog: str
    mem_files: dict[str, str]          # file name -> $readmemh text
    inputs: list[tuple[str, str, tuple[int, ...]]]    # value, dtype, shape
    outputs: list[tuple[str, str, tuple[int, ...]]]
    kernels: list[str]
    parallel: int
    cycle_model: int                   # modelled compute cycles (without streaming)
    macs: int


def _ident(name: str, used: set[str]) -> str:
    """A Verilog identifier (and ``.mem`` file name) for value ``name`` from the model file.

    ``identifier`` never yields ``__``, so the per-bank names this module derives with ``__b<k>`` /
    ``__q<k>`` cannot collide with another value's identifier."""
    base = identifier(name, prefix="v_")
    out, i = base, 1
    while out in used:
        out = f"{base}_{i}"
        i += 1
    used.add(out)
    return out


def _hex(v: int | np.integer, width: int) -> str:
    return format(int(v) & ((1 << width) - 1), f"0{width // 4}x")


def mem_text(values: np.ndarray, width: int) -> str:
    flat = np.asarray(values, np.int64).reshape(-1)
    if flat.size == 0:
        flat = np.zeros(1, np.int64)
    return "\n".join(_hex(v, width) for v in flat) + "\n"


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _suffix_ok(small: tuple[int, ...], full: tuple[int, ...]) -> bool:
    s = (1,) * (len(full) - len(small)) + tuple(small)
    if len(s) > len(full):
        return False
    return any(all(d == 1 for d in s[:k]) and s[k:] == tuple(full[k:]) for k in range(len(full) + 1))


MAX_RANK = 8


def _odometer(out_shape: tuple[int, ...], in_shapes: list[tuple[int, ...]], idx: list[str]) -> list[str]:
    """Verilog that advances the output coordinates ``c0..c{r-1}`` by one element (row-major) and
    each operand's linear index by the matching (NumPy broadcasting) delta."""
    r = len(out_shape)
    strides = []
    for sh in in_shapes:
        full = (1,) * (r - len(sh)) + tuple(sh)
        st = [0] * r
        acc = 1
        for d in range(r - 1, -1, -1):
            st[d] = 0 if full[d] == 1 else acc
            acc *= full[d]
        strides.append(st)
    lines = []
    first = True
    for d in range(r - 1, -1, -1):
        cond = f"c{d} != {out_shape[d] - 1}"
        head = "if" if first else "else if"
        first = False
        body = [f"c{d} <= c{d} + 1;"] + [f"c{e} <= 0;" for e in range(d + 1, r)]
        for j, st in enumerate(strides):
            delta = st[d] - sum((out_shape[e] - 1) * st[e] for e in range(d + 1, r))
            if delta:
                body.append(f"{idx[j]} <= {idx[j]} + ({delta});")
        lines.append(f"            {head} ({cond}) begin {' '.join(body)} end")
    return lines


def matmul_cycles(m: int, n: int, k: int, p: int) -> int:
    """Cycles of one ``matmul_i8`` step: per row and block of P outputs, a bias cycle, K+1 MAC
    cycles (one of pipeline latency) and a write-back cycle."""
    return m * math.ceil(n / p) * (k + 3) if m and n else 1


def step_cycles(op: str, in_shapes: list[tuple[int, ...]], out_shapes: list[tuple[int, ...]], p: int) -> int:
    if op == "matmul_i8":
        x, w = in_shapes[0], in_shapes[1]
        return matmul_cycles(int(np.prod(x[:-1], dtype=np.int64)), w[0], w[1], p)
    if op == "reshape":
        return 0
    if op in WINDOW_OPS:
        taps = int(np.prod(in_shapes[1][1:], dtype=np.int64)) if op == "conv2d_i8" \
            else _pool_taps(in_shapes, out_shapes)
        return int(np.prod(out_shapes[0], dtype=np.int64)) * max(1, taps) + 1
    return int(np.prod(out_shapes[0], dtype=np.int64)) + 1


def _pool_taps(in_shapes: list[tuple[int, ...]], out_shapes: list[tuple[int, ...]]) -> int:
    """Pool taps per output for the cost model (the kernel is not in the shapes: bounded by the
    input/output ratio, the generator uses the exact kernel)."""
    (_, h, w, _), (_, ho, wo, _) = in_shapes[0], out_shapes[0]
    return max(1, -(-h // ho)) * max(1, -(-w // wo))


def _window(s: Any, xm: Mem, om: Mem, wm: Mem | None, bm: Mem | None, xs: tuple[int, ...],
            os_: tuple[int, ...], ws: tuple[int, ...] | None, nxt: int) -> tuple[list[str], int]:
    """One state of a window op (conv2d_i8 / max_pool2d_i8 / avg_pool2d_i8): per output element
    (n, ho, wo, o), one tap (i, j, c) per cycle; taps in the padding contribute nothing (conv: 0,
    max: -128, avg: not counted). Returns the state's lines and its cycles."""
    a = s.attrs
    _, h, w, c = xs
    total = int(np.prod(os_, dtype=np.int64))
    if s.op == "conv2d_i8":
        assert ws is not None
        o, kh, kw, cg = ws
        sh, sw = a["strides"]
        pt, pl = a["pads"][0], a["pads"][1]
        dh, dw = a["dilations"]
        og = o // int(a["groups"])
        zp = int(a["x_zero_point"])
    else:
        kh, kw = a["kernel"]
        sh, sw = a["strides"] if a["strides"] is not None else (kh, kw)
        pt, pl = a["pads"][0], a["pads"][1]
        dh = dw = 1
        cg, og, zp = 1, 1, 0
    taps = kh * kw * cg
    if s.op != "conv2d_i8":
        ch = "c3"
    else:
        ch = "wc" if int(a["groups"]) == 1 else f"(c3 / {og}) * {cg} + wc"
    lines = [
        f"        // {safe_comment(s.node, 'verilog')}: {s.op} {list(xs)} -> {list(os_)}, "
        f"kernel {kh}x{kw}x{cg}, 1 tap per cycle",
        f"          hy = c1 * {sh} - {pt} + wi * {dh};",
        f"          wx = c2 * {sw} - {pl} + wj * {dw};",
        f"          wv = (hy >= 0) && (hy < {h}) && (wx >= 0) && (wx < {w});",
        f"          xa = ((c0 * {h} + hy) * {w} + wx) * {c} + {ch};",
    ]
    if s.op == "conv2d_i8":
        assert wm is not None and bm is not None
        lines += [
            f"          wa = ((c3 * {kh} + wi) * {kw} + wj) * {cg} + wc;",
            f"          if (wv) tv = ($signed({xm.name}[xa]) - ({zp})) * $signed({wm.name}[wa]);",
            "          else tv = 0;",
            f"          if (kk == 0) wsum = {bm.name}[c3] + tv; else wsum = cacc + tv;",
        ]
        res = "wsum"
    elif s.op == "max_pool2d_i8":
        lines += [
            f"          if (wv) tv = $signed({xm.name}[xa]); else tv = -128;",
            "          if (kk == 0 || tv > $signed(cacc)) wsum = tv; else wsum = cacc;",
        ]
        res = "wsum[7:0]"
    else:
        lines += [
            f"          if (wv) tv = $signed({xm.name}[xa]); else tv = 0;",
            "          if (kk == 0) begin wsum = tv; wcnt = wv; end",
            "          else begin wsum = cacc + tv; wcnt = ccnt + wv; end",
            "          // round half away from zero, then C division (truncation toward zero)",
            "          if (wsum > 0) num = wsum + wcnt / 2; else num = wsum - wcnt / 2;",
            "          num = num / wcnt;",
        ]
        res = "num[7:0]"
    adv_tap = []
    first = True
    for reg, lim in (("wc", cg), ("wj", kw), ("wi", kh)):
        if lim == 1:
            continue
        head = "if" if first else "else if"
        first = False
        resets = {"wc": [], "wj": ["wc <= 0;"], "wi": ["wc <= 0;", "wj <= 0;"]}[reg]
        adv_tap.append(f"              {head} ({reg} != {lim - 1}) begin {reg} <= {reg} + 1; "
                       f"{' '.join(resets)} end")
    adv_out = _odometer(os_, [], [])
    lines += [
        f"          if (kk == {taps - 1}) begin",
        f"            {om.name}[ii] <= {res};",
        "            kk <= 0; wi <= 0; wj <= 0; wc <= 0;",
        f"            if (ii == {total - 1}) begin ii <= 0; "
        + " ".join(f"c{d} <= 0;" for d in range(MAX_RANK)) + f" state <= {nxt}; end",
        "            else begin",
        "              ii <= ii + 1;",
        *["  " + ln for ln in adv_out],
        "            end",
        "          end else begin",
        "            cacc <= wsum; kk <= kk + 1;" + (" ccnt <= wcnt;" if s.op == "avg_pool2d_i8" else ""),
        *adv_tap,
        "          end",
    ]
    return lines, total * taps + 1


REQUANT_FN = """\
  // TFLite MultiplyByQuantizedMultiplier + zero point + clamp (rlx_core.quant.fixedpoint, bit-exact).
  function [7:0] rq;
    input signed [31:0] x;
    input signed [31:0] mult;
    input signed [31:0] shift;
    input signed [31:0] zp;
    input signed [31:0] lo;
    input signed [31:0] hi;
    reg [5:0] left;
    reg [5:0] right;
    reg signed [31:0] shifted;
    reg signed [63:0] ab;
    reg signed [63:0] t;
    reg signed [31:0] high;
    reg signed [63:0] h64;
    reg [63:0] mask;
    reg [63:0] rem;
    reg [63:0] thr;
    reg signed [31:0] r;
    reg signed [31:0] y;
    begin
      left = (shift > 0) ? shift[5:0] : 6'd0;
      right = (shift < 0) ? (-shift) : 6'd0;
      shifted = x << left;
      ab = $signed(shifted) * $signed(mult);
      t = ab + ((ab >= 0) ? 64'sd1073741824 : -64'sd1073741823);
      // C division by 2**31 (truncation toward zero) as an arithmetic shift with a bias
      t = (t < 0) ? (t + 64'sd2147483647) : t;
      high = t >>> 31;
      if (shifted == 32'sh80000000 && mult == 32'sh80000000) high = 32'sh7fffffff;
      h64 = high;
      mask = (64'd1 << right) - 64'd1;
      rem = h64 & mask;
      thr = (mask >> 1) + ((high < 0) ? 64'd1 : 64'd0);
      r = (high >>> right) + ((rem > thr) ? 32'sd1 : 32'sd0);
      y = r + zp;
      if (y < lo) y = lo;
      if (y > hi) y = hi;
      rq = y[7:0];
    end
  endfunction
"""

FADD_FN = """\
  // IEEE 754 binary32 addition, round to nearest even, subnormals, +-Inf, NaN (canonical quiet NaN).
  function [31:0] fadd;
    input [31:0] a;
    input [31:0] b;
    reg [31:0] x;
    reg [31:0] y;
    reg [9:0] ex;
    reg [9:0] ey;
    reg [9:0] d;
    reg [27:0] mx;
    reg [27:0] my;
    reg [27:0] m;
    reg [24:0] r;
    reg sticky;
    reg s;
    integer i;
    begin
      if ((a[30:23] == 8'hff && a[22:0] != 0) || (b[30:23] == 8'hff && b[22:0] != 0))
        fadd = 32'h7fc00000;
      else if (a[30:23] == 8'hff && b[30:23] == 8'hff)
        fadd = (a[31] == b[31]) ? a : 32'h7fc00000;
      else if (a[30:23] == 8'hff)
        fadd = a;
      else if (b[30:23] == 8'hff)
        fadd = b;
      else begin
        if (a[30:0] >= b[30:0]) begin x = a; y = b; end else begin x = b; y = a; end
        ex = (x[30:23] == 0) ? 10'd1 : {2'b00, x[30:23]};
        ey = (y[30:23] == 0) ? 10'd1 : {2'b00, y[30:23]};
        mx = {1'b0, (x[30:23] != 0), x[22:0], 3'b000};
        my = {1'b0, (y[30:23] != 0), y[22:0], 3'b000};
        d = ex - ey;
        if (d > 10'd27) begin sticky = (my != 0); my = 0; end
        else begin sticky = ((my & ((28'd1 << d) - 28'd1)) != 0); my = my >> d; end
        my[0] = my[0] | sticky;
        s = x[31];
        if (x[31] == y[31]) m = mx + my; else m = mx - my;
        if (m == 0) fadd = (x[31] == y[31]) ? {x[31], 31'd0} : 32'd0;
        else begin
          if (m[27]) begin m = {1'b0, m[27:2], m[1] | m[0]}; ex = ex + 1; end
          for (i = 0; i < 27; i = i + 1)
            if (!m[26] && ex > 1) begin m = m << 1; ex = ex - 1; end
          r = {1'b0, m[26:3]};
          if (m[2] && (m[1] || m[0] || m[3])) r = r + 1;
          if (r[24]) begin r = r >> 1; ex = ex + 1; end
          if (ex >= 10'd255) fadd = {s, 8'hff, 23'd0};
          else fadd = {s, (r[23] ? ex[7:0] : 8'd0), r[22:0]};
        end
      end
    end
  endfunction
"""


def generate(program: Any, parallel: int = 4, name: str = "rlx_top") -> Design:
    """The Verilog of ``program`` (an LIR program whose steps are all claimed by rlx-fpga)."""
    g = program.graph
    p = max(1, int(parallel))
    used: set[str] = set()
    mems: dict[str, Mem] = {}
    consts = dict(g.weights)

    def dt_width(value: str) -> int:
        dt = g.types[value].dtype
        return 8 if dt.np == np.int8 else 32

    def numel(value: str) -> int:
        return int(np.prod(_shape(g.types[value]), dtype=np.int64))

    steps = [s for s in program.steps if hasattr(s, "kernel")]
    # weights used by a matmul as `w`: banked ROMs
    banked = {s.inputs[1] for s in steps if s.op == "matmul_i8" and s.inputs[1] in consts}

    def mem(value: str) -> Mem:
        if value in mems:
            return mems[value]
        m = Mem(_ident(value, used), dt_width(value), numel(value))
        if value in consts:
            c = np.asarray(consts[value])
            # float32 constants are stored as their IEEE bit patterns
            m.const = c.astype(np.float32).view(np.uint32).astype(np.int64) if c.dtype.kind == "f" \
                else c.astype(np.int64)
            if value in banked:
                n, k = _shape(g.types[value])
                m.banks = p
                m.bank_depth = math.ceil(n / p) * k
        mems[value] = m
        return m

    for v in program.inputs:
        mem(v.name)
    # reshape aliases
    for s in steps:
        if s.op == "reshape":
            mems[s.outputs[0]] = mem(s.inputs[0])
        else:
            for v in (*s.inputs, *s.outputs):
                mem(v)
    for _, v in program.outputs:
        mem(v)

    decl: list[str] = []
    mem_files: dict[str, str] = {}
    seen: set[str] = set()
    for m in mems.values():
        if m.name in seen:
            continue
        seen.add(m.name)
        depth = max(1, m.numel)
        if m.const is not None and m.banks:
            n, k = m.const.shape
            for b in range(m.banks):
                rows = np.zeros((math.ceil(n / m.banks), k), np.int64)
                sel = m.const[b::m.banks]
                rows[:len(sel)] = sel
                fname = f"{m.name}__b{b}.mem"
                mem_files[fname] = mem_text(rows, m.width)
                decl.append(f"  reg [{m.width - 1}:0] {m.name}__b{b} [0:{max(1, m.bank_depth) - 1}];\n"
                            f"  initial $readmemh(\"{fname}\", {m.name}__b{b});\n"
                            f"  reg [{m.width - 1}:0] {m.name}__q{b};\n"
                            f"  // synchronous-read ROM port (block RAM): address = row block * K + k\n"
                            f"  always @(posedge clk) {m.name}__q{b} <= {m.name}__b{b}[nb * {k} + kk];")
        elif m.const is not None:
            fname = f"{m.name}.mem"
            mem_files[fname] = mem_text(m.const, m.width)
            decl.append(f"  reg [{m.width - 1}:0] {m.name} [0:{depth - 1}];\n"
                        f"  initial $readmemh(\"{fname}\", {m.name});")
        else:
            decl.append(f"  reg [{m.width - 1}:0] {m.name} [0:{depth - 1}];")

    ins = [(v.name, str(g.types[v.name].dtype), _shape(g.types[v.name])) for v in program.inputs]
    outs = [(v, str(g.types[v].dtype), _shape(g.types[v])) for _, v in program.outputs]

    state = [0]

    def new_state() -> int:
        state[0] += 1
        return state[0]

    s_load = 0
    # -- load: one input element per accepted beat
    total_in = sum(numel(v) for v, _, _ in ins)
    load_lines = []
    base = 0
    for v, _, _ in ins:
        m = mems[v]
        if m.numel == 0:
            continue
        lo, hi = base, base + m.numel
        load_lines.append(f"          if (ld >= {lo} && ld < {hi}) "
                          f"{m.name}[ld - {lo}] <= in_data[{m.width - 1}:0];")
        base = hi
    kernels: list[str] = []
    macs = 0
    model = 0
    step_states: list[tuple[int, list[str]]] = []
    first_step = state[0] + 1
    for s in steps:
        kernels.append(s.kernel)
        in_shapes = [_shape(g.types[v]) for v in s.inputs]
        out_shapes = [_shape(g.types[v]) for v in s.outputs]
        model += step_cycles(s.op, in_shapes, out_shapes, p)
        if s.op == "reshape":
            continue
        if s.op == "matmul_i8":
            xm, wm, bm, om = (mems[v] for v in (*s.inputs, s.outputs[0]))
            xs, ws = in_shapes[0], in_shapes[1]
            n, k = ws
            mrows = int(np.prod(xs[:-1], dtype=np.int64))
            zp = int(s.attrs["x_zero_point"])
            macs = max(macs, p)
            if mrows == 0:
                continue
            s0, s1, s2 = new_state(), new_state(), new_state()
            nblk = math.ceil(n / p)
            rd_w = []
            for lane in range(p):
                if not wm.banks:
                    rd_w.append(f"            wq[{lane}] <= (n0 + {lane} < {n}) ? "
                                f"{wm.name}[(n0 + {lane}) * {k} + kk] : 8'd0;")
            bias_rd = "\n".join(
                f"          acc[{lane}] <= (n0 + {lane} < {n}) ? {bm.name}[n0 + {lane}] : 32'd0;"
                for lane in range(p))
            mac = "\n".join(
                f"            acc[{lane}] <= $signed(acc[{lane}]) + xq * "
                f"$signed({f'{wm.name}__q{lane}' if wm.banks else f'wq[{lane}]'});" for lane in range(p))
            wb = "\n".join(
                f"          if (n0 + {lane} < {n}) {om.name}[row * {n} + n0 + {lane}] <= acc[{lane}];"
                for lane in range(p))
            nxt = state[0] + 1
            step_states.append((s0, [
                f"        // {safe_comment(s.node, 'verilog')}: matmul_i8 x{xs} w{ws} zp={zp}, {p} MACs, "
                "bias",
                bias_rd,
                "          kk <= 0; pv <= 1'b0;",
                f"          state <= {s1};"]))
            step_states.append((s1, [
                "          if (kk < " + str(k) + ") begin",
                f"            xq <= $signed({{{{1{{{xm.name}[row * {k} + kk][7]}}}}, "
                f"{xm.name}[row * {k} + kk]}})"
                f" - {zp};",
                *rd_w,
                "            kk <= kk + 1;",
                "          end",
                "          pv <= (kk < " + str(k) + ");",
                "          if (pv) begin",
                mac,
                "          end",
                f"          if (kk == {k}) state <= {s2};"]))
            step_states.append((s2, [
                wb,
                f"          if (nb == {nblk - 1}) begin",
                "            nb <= 0; n0 <= 0;",
                f"            if (row == {mrows - 1}) begin row <= 0; state <= {nxt}; end",
                f"            else begin row <= row + 1; state <= {s0}; end",
                "          end else begin",
                f"            nb <= nb + 1; n0 <= n0 + {p}; state <= {s0};",
                "          end"]))
            continue
        if s.op in WINDOW_OPS:
            if int(np.prod(out_shapes[0], dtype=np.int64)) == 0:
                continue
            s0 = new_state()
            conv = s.op == "conv2d_i8"
            wlines, cyc = _window(s, mems[s.inputs[0]], mems[s.outputs[0]],
                                  mems[s.inputs[1]] if conv else None, mems[s.inputs[2]] if conv else None,
                                  in_shapes[0], out_shapes[0], in_shapes[1] if conv else None, state[0] + 1)
            model += cyc - step_cycles(s.op, in_shapes, out_shapes, p)
            step_states.append((s0, wlines))
            continue
        total = int(np.prod(out_shapes[0], dtype=np.int64))
        if total == 0:
            continue
        om = mems[s.outputs[0]]
        srcs = [mems[v] for v in s.inputs]
        srcs_shapes = in_shapes
        out_shape = out_shapes[0]
        rank = len(out_shape)
        if rank > MAX_RANK:
            raise RTLError(f"rank {rank} > {MAX_RANK}")
        idx = [f"ix{j}" for j in range(len(srcs))]
        adv = _odometer(out_shape, srcs_shapes, idx)
        s0 = new_state()
        nxt = state[0] + 1
        if s.op == "requantize":
            xm, mm, sm = srcs
            expr = (f"rq({xm.name}[ix0], {mm.name}[ix1], {sm.name}[ix2], {int(s.attrs['zero_point'])}, "
                    f"{int(s.attrs['act_min'])}, {int(s.attrs['act_max'])})")
            note = f"requantize zp={s.attrs['zero_point']} clamp [{s.attrs['act_min']}, {s.attrs['act_max']}]"
        elif s.op == "add":
            am, bm = srcs
            expr = f"fadd({am.name}[ix0], {bm.name}[ix1])"
            note = "add f32 (IEEE binary32, round to nearest even)"
        elif s.op == "maximum":
            am, bm = srcs
            expr = f"(($signed({am.name}[ix0]) > $signed({bm.name}[ix1])) ? {am.name}[ix0] : {bm.name}[ix1])"
            note = "maximum (int8 ReLU)"
        else:
            raise RTLError(f"rlx-fpga cannot generate {s.op}")
        reset = " ".join(f"c{d} <= 0;" for d in range(MAX_RANK)) + " ix0 <= 0; ix1 <= 0; ix2 <= 0;"
        step_states.append((s0, [
            f"        // {safe_comment(s.node, 'verilog')}: {note}, {total} elements {list(out_shape)}, "
            "1 per cycle (broadcasting)",
            f"          {om.name}[ii] <= {expr};",
            f"          if (ii == {total - 1}) begin ii <= 0; {reset} state <= {nxt}; end",
            "          else begin",
            "            ii <= ii + 1;",
            *adv,
            "          end"]))
    s_out = new_state()
    # output stream
    total_out = sum(int(np.prod(sh, dtype=np.int64)) for _, _, sh in outs)
    out_lines = []
    base = 0
    for v, _, sh in outs:
        m = mems[v]
        cnt = int(np.prod(sh, dtype=np.int64))
        if cnt == 0:
            continue
        ext = (f"{{{{24{{{m.name}[oi - {base}][7]}}}}, {m.name}[oi - {base}]}}" if m.width == 8
               else f"{m.name}[oi - {base}]")
        if m.banks:
            raise RTLError("a banked weight cannot be a graph output")
        out_lines.append(f"      if (oi >= {base} && oi < {base + cnt}) out_word = {ext};")
        base += cnt
    first_after_load = first_step if step_states else s_out

    lines = [
        f"// Generated by rlx-fpga for graph {safe_comment(g.name, 'verilog')}: {len(steps)} steps, "
        f"{p} parallel MACs.",
        "// Streams: 32-bit ready/valid beats, one tensor element per beat (int8 sign-extended).",
        "`timescale 1ns/1ps",
        f"module {name} (",
        "  input  wire        clk,",
        "  input  wire        rst,",
        "  input  wire        in_valid,",
        "  output wire        in_ready,",
        "  input  wire [31:0] in_data,",
        "  output wire        out_valid,",
        "  input  wire        out_ready,",
        "  output wire [31:0] out_data,",
        "  output wire        busy",
        ");",
        f"  localparam P = {p};",
        f"  localparam N_IN = {total_in};",
        f"  localparam N_OUT = {total_out};",
        "  reg [15:0] state;",
        "  reg [31:0] ld, oi, row, nb, n0, kk, ii, ix0, ix1, ix2;",
        "  reg [31:0] " + ", ".join(f"c{d}" for d in range(MAX_RANK)) + ";",
        "  reg [31:0] wi, wj, wc, ccnt, wa, xa;",
        "  reg signed [31:0] cacc, wsum;",
        "  integer hy, wx, tv, wcnt, num;",
        "  reg wv;",
        *decl,
        "  reg pv;",
        "  reg signed [8:0] xq;",
        "  reg [7:0] wq [0:P-1];",
        "  reg [31:0] acc [0:P-1];",
        "  reg [31:0] out_word;",
        "  integer q;",
        REQUANT_FN,
        FADD_FN,
        f"  assign in_ready = (state == {s_load}) && (ld < N_IN);",
        f"  assign out_valid = (state == {s_out}) && (oi < N_OUT);",
        "  assign out_data = out_word;",
        f"  assign busy = (state != {s_load}) && (state != {s_out});",
        "  always @* begin",
        "    out_word = 32'd0;",
        *out_lines,
        "  end",
        "  always @(posedge clk) begin",
        "    if (rst) begin",
        f"      state <= {s_load}; ld <= 0; oi <= 0; row <= 0; nb <= 0; n0 <= 0; kk <= 0;",
        "      ii <= 0; ix0 <= 0; ix1 <= 0; ix2 <= 0; pv <= 1'b0; xq <= 0;",
        "      wi <= 0; wj <= 0; wc <= 0; cacc <= 0; ccnt <= 0;",
        "      " + " ".join(f"c{d} <= 0;" for d in range(MAX_RANK)),
        "      for (q = 0; q < P; q = q + 1) acc[q] <= 0;",
        "    end else begin",
        "      case (state)",
        f"        {s_load}: begin",
        "          if (in_valid && in_ready) begin",
        *load_lines,
        "            ld <= ld + 1;",
        "          end",
        f"          if (ld == N_IN) state <= {first_after_load};",
        "        end",
    ]
    for sid, blines in step_states:
        lines.append(f"        {sid}: begin")
        lines.extend(blines)
        lines.append("        end")
    lines += [
        f"        {s_out}: begin",
        "          if (out_valid && out_ready) oi <= oi + 1;",
        f"          if (oi == N_OUT) begin ld <= 0; oi <= 0; state <= {s_load}; end",
        "        end",
        "        default: state <= 0;",
        "      endcase",
        "    end",
        "  end",
        "endmodule",
        "",
    ]
    return Design("\n".join(lines), mem_files, ins, outs, kernels, p, model, macs)


TESTBENCH = """\
// Generated by rlx-fpga: streams input.mem through {top}, writes output.hex and cycles.txt.
`timescale 1ns/1ps
module tb;
  reg clk = 0, rst = 1;
  reg in_valid = 0, out_ready = 0;
  reg [31:0] in_data = 0;
  wire in_ready, out_valid, busy;
  wire [31:0] out_data;
  reg [31:0] inmem [0:{in_depth}];
  integer n_in = {n_in}, n_out = {n_out};
  integer i = 0, o = 0, fd, cyc = 0, c_first_in = -1, c_last_in = -1, c_first_out = -1, c_busy = 0;
  reg [1023:0] in_file, out_file;
  {top} dut (.clk(clk), .rst(rst), .in_valid(in_valid), .in_ready(in_ready), .in_data(in_data),
             .out_valid(out_valid), .out_ready(out_ready), .out_data(out_data), .busy(busy));
  always #5 clk = ~clk;
  initial begin
    if (!$value$plusargs("in=%s", in_file)) in_file = "input.mem";
    if (!$value$plusargs("out=%s", out_file)) out_file = "output.hex";
    if (n_in > 0) $readmemh(in_file, inmem);
    fd = $fopen(out_file, "w");
    repeat (2) @(posedge clk);
    rst <= 0;
  end
  // drive: a bubble every 5th cycle on the input, back-pressure every 3rd on the output
  always @(posedge clk) if (!rst) begin
    cyc <= cyc + 1;
    if (busy) c_busy <= c_busy + 1;
    if (in_valid && in_ready) begin
      if (c_first_in < 0) c_first_in <= cyc;
      c_last_in <= cyc;
      i = i + 1;
    end
    in_valid <= (i < n_in) && (cyc % 5 != 4) && !(in_valid && in_ready && i >= n_in);
    in_data <= inmem[(i < n_in) ? i : 0];
    out_ready <= (cyc % 3 != 2);
    if (out_valid && out_ready) begin
      if (c_first_out < 0) c_first_out = cyc;
      $fwrite(fd, "%08x\\n", out_data);
      o = o + 1;
      if (o == n_out) begin
        $fwrite(fd, "# cycles total %0d busy %0d first_in %0d last_in %0d first_out %0d\\n",
                cyc, c_busy, c_first_in, c_last_in, c_first_out);
        $fclose(fd);
        $finish;
      end
    end
    if (cyc > {limit}) begin
      $fwrite(fd, "# timeout\\n");
      $fclose(fd);
      $finish;
    end
  end
endmodule
"""


def testbench(design: Design, top: str = "rlx_top") -> str:
    n_in = sum(int(np.prod(s, dtype=np.int64)) for _, _, s in design.inputs)
    n_out = sum(int(np.prod(s, dtype=np.int64)) for _, _, s in design.outputs)
    limit = 4 * (n_in + n_out) + 4 * design.cycle_model + 1000
    return TESTBENCH.format(top=top, in_depth=max(1, n_in) - 1 if n_in else 0, n_in=n_in, n_out=n_out,
                            limit=limit)
