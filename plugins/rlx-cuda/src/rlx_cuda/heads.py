"""Head split/merge transposes the fused attention makes free (pure Python: no CuPy).

BERT-style models split heads with ``reshape -> transpose(0, 2, 1, 3)`` before attention and merge
them after it. The fused kernel (:mod:`rlx_cuda.flash`) takes strides, so it can read (B, S, H, D)
and write (B, S, H, Dv) itself; :func:`absorb_head_transposes` decides, on the device pointers of
the program's views, where that is safe, and rewires the views so the transposes run nothing.
Views only need ``data.ptr``, ``nbytes``, ``shape`` and ``reshape`` (the CPU test runs it on NumPy
views of a simulated arena).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rlx_core.plugin import Program, Step

from . import flash

Layout = dict[str, tuple[Any, int, int, int]]


def overlap(a: Any, b: Any) -> bool:
    """The two device views share at least one byte (an empty view counts as one byte)."""
    pa, pb = int(a.data.ptr), int(b.data.ptr)
    return pa < pb + max(int(b.nbytes), 1) and pb < pa + max(int(a.nbytes), 1)


def absorb_head_transposes(program: Program, steps: Sequence[Step], ins: list[list[Any]],
                           outs: list[list[Any]], elided: set[int], downloads: Iterable[str], cc: int,
                           overlap: Callable[[Any, Any], bool] = overlap
                           ) -> tuple[set[int], dict[int, Layout]]:
    """Let the fused attention read q/k/v as (B, S, H, D) and write o as (B, S, H, Dv), so the
    head split/merge transposes around it (``perm (0, 2, 1, 3)``, one reader each) run nothing.

    For an attention step the fused kernel takes (:func:`rlx_cuda.flash.flash_reason`), each
    input made by such a transpose, in this order of preference:

    b. the step that wrote the transpose's input (through a reshape that moves nothing)
       writes into the transpose's output buffer instead (the plan keeps it for the attention
       from the transpose on), if no step from that writer to the attention touches it;
    a. the kernel reads the transpose's input where it is, if no step from its writer to the
       attention writes over it (the planner may reuse those bytes once the transpose ran).

    Its output, when such a transpose is its only reader:

    a. the kernel writes the transpose's output, if nothing the attention reads overlaps it and
       no step in between touches it; else
    b. the kernel writes its own output buffer in (B, S, H, Dv) order and the step reading the
       transpose's output (through a reshape that moves nothing) reads that buffer, if no step
       before that reader writes over it and the reader's outputs do not overlap it.

    ``ins``/``outs`` are updated to the bytes each step really reads and writes, and once every
    step is decided each decision is checked again against them (a later one may move a write
    onto bytes an earlier one relied on); if any fails, nothing is absorbed. Checked on the
    device pointers of the views as bound (after reshape elision). Returns the transpose steps
    that became no-ops and, per attention step, its layout for :func:`flash.bind`. ``overlap``
    is the byte-overlap test (a parameter so the CPU test can show what skipping it breaks).
    """
    g = program.graph
    heads = (0, 2, 1, 3)
    uses = Counter(v for st in steps for v in st.inputs)
    uses.update(v for _, v in program.outputs)
    uses.update(downloads)
    producer = {v: k for k, st in enumerate(steps) for v in st.outputs}
    readers: dict[str, list[int]] = {}
    for k, st in enumerate(steps):
        for v in st.inputs:
            readers.setdefault(v, []).append(k)
    dropped: set[int] = set()
    layouts: dict[int, Layout] = {}
    saved = ([list(x) for x in ins], [list(x) for x in outs])
    #: (kind, attention step, view, first step, last step, the step whose other operands must
    #: not overlap the view, or -1): re-checked at the end
    checks: list[tuple[str, int, Any, int, int, int]] = []

    def noop(s: int) -> bool:
        return s in elided or s in dropped or (
            steps[s].kernel == "cuda.reshape" and int(ins[s][0].data.ptr) == int(outs[s][0].data.ptr))

    def head_transpose(k: int) -> bool:
        st = steps[k]
        perm = st.attrs.get("perm")
        return (st.kernel == "cuda.transpose" and not noop(k) and isinstance(perm, (tuple, list))
                and tuple(perm) == heads and len(g.types[st.inputs[0]].shape) == 4)

    def touched(view: Any, lo: int, hi: int, reads: bool) -> bool:
        """A step strictly between lo and hi writes (or, with ``reads``, reads) ``view``'s bytes."""
        return any(overlap(view, x) for s in range(max(lo + 1, 0), hi) if not noop(s)
                   for x in [*outs[s], *(ins[s] if reads else [])])

    def bshd(view: Any) -> tuple[Any, int, int, int]:
        b_, s_, h_, d_ = (int(x) for x in view.shape)
        return view, s_ * h_ * d_, d_, h_ * d_

    def through_reshape(v: str, back: bool) -> str | None:
        """The value on the other side of a reshape that moves nothing (``back``: v's producer
        is that reshape; else v's only reader is), when v has one reader; or v itself."""
        if uses[v] != 1:
            return None
        s = producer.get(v) if back else readers[v][0] if readers.get(v) else None
        if s is None or steps[s].kernel != "cuda.reshape":
            return v
        if not noop(s):
            return None
        other = steps[s].inputs[0] if back else steps[s].outputs[0]
        return other if uses[other] == 1 else None

    def ok(kind: str, k: int, view: Any, lo: int, hi: int, own: int) -> bool:
        """One decision's condition on the current ``ins``/``outs``."""
        if kind == "in_b":  # ``own`` wrote ``view``; it is read at k
            others = [x for x in [*ins[own], *outs[own]] if x is not view]
            return not touched(view, own, k, reads=True) and not any(overlap(view, x) for x in others)
        if kind == "in_a":  # written at lo (or before the program), read at k
            return not touched(view, lo, k, reads=False) and not any(overlap(view, x) for x in outs[k])
        if kind == "out_a":  # written at k, read from hi on
            return not touched(view, k, hi, reads=True) and not any(overlap(view, x) for x in ins[k])
        # out_b: written at k, read at hi (own == hi), which must not write over it
        return not touched(view, k, hi, reads=False) and not any(overlap(view, x) for x in outs[hi])

    for k, st in enumerate(steps):
        if st.kernel != "cuda.attention" or len(g.types[st.inputs[0]].shape) != 4:
            continue
        if flash.flash_reason([g.types[i] for i in st.inputs], st.attrs, cc) is not None:
            continue
        lay: dict[str, tuple[Any, int, int, int]] = {}
        for j, name in enumerate(("q", "k", "v")):
            v = st.inputs[j]
            p = producer.get(v)
            if p is None or p > k or uses[v] != 1 or not head_transpose(p):
                continue
            src, yt = ins[p][0], outs[p][0]
            made = through_reshape(steps[p].inputs[0], back=True)
            a = producer.get(made) if made is not None else None
            if a is not None and made is not None and not noop(a) and not steps[a].in_place \
                    and steps[a].kernel != "cuda.reshape":
                jj = steps[a].outputs.index(made)
                if int(outs[a][jj].data.ptr) == int(src.data.ptr) and outs[a][jj].nbytes == yt.nbytes:
                    old = outs[a][jj]
                    outs[a][jj] = yt.reshape(old.shape)
                    dropped.add(p)  # (checked as it will run: without the transpose)
                    if ok("in_b", k, outs[a][jj], a, k, a):  # (b)
                        lay[name] = bshd(yt.reshape(src.shape))
                        checks.append(("in_b", k, outs[a][jj], a, k, a))
                        continue
                    outs[a][jj] = old
                    dropped.discard(p)
            # (a): src's bytes were last written by w (-1: uploaded before the program runs)
            w4 = producer.get(steps[p].inputs[0])
            w: int | None = None
            if made is not None:
                w = -1 if a is None else a if not noop(a) else None
            elif w4 is None or not noop(w4):
                w = -1 if w4 is None else w4
            dropped.add(p)
            if w is not None and ok("in_a", k, src, w, k, -1):
                lay[name] = bshd(src)
                ins[k][j] = src
                checks.append(("in_a", k, src, w, k, -1))
            else:
                dropped.discard(p)
        o = st.outputs[0]
        rd = readers.get(o, [])
        if uses[o] == 1 and len(rd) == 1 and rd[0] > k and head_transpose(rd[0]):
            t = rd[0]
            y, ov = outs[t][0], outs[k][0]
            dropped.add(t)  # (checked as it will run: without the transpose; undone below if not)
            if ok("out_a", k, y, k, t, -1):  # (a)
                lay["o"] = bshd(y)
                outs[k][0] = y
                checks.append(("out_a", k, y, k, t, -1))
            else:  # (b)
                after = through_reshape(steps[t].outputs[0], back=False)
                c = readers[after][0] if after is not None and readers.get(after) else None
                if c is not None and c > t and not noop(c) and steps[c].kernel != "cuda.reshape" \
                        and not steps[c].in_place:
                    jj = steps[c].inputs.index(after)
                    if int(ins[c][jj].data.ptr) == int(y.data.ptr) and ins[c][jj].nbytes == ov.nbytes \
                            and ok("out_b", k, ov, k, c, c):
                        ins[c][jj] = ov.reshape(ins[c][jj].shape)
                        lay["o"] = bshd(ov.reshape(y.shape))
                        checks.append(("out_b", k, ov, k, c, c))
            if "o" not in lay:
                dropped.discard(t)
        if lay:
            layouts[k] = lay
    if not all(ok(*c) for c in checks):  # a later decision broke an earlier one: keep it simple
        ins[:], outs[:] = saved
        return set(), {}
    return dropped, layouts
