"""The LIR's read/write sets: every step says which planned buffers and arena bytes it reads and
writes (aliases resolved by the planner), so a backend orders steps without comparing pointers."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.ir.graph import Graph
from rlx_core.plugin import Access, Program, Step, Transfer, conflicts, lower


def _lower(graph: Graph, reuse: int = 0, host: bool = True) -> Program:
    s = Session("cpu", use_cache=False)
    legal, _ = s.legalize(graph)
    device = dataclasses.replace(s.device, reuse_distance=reuse, host_memory=host)
    return lower(legal, device)


def _small() -> Graph:
    """x -> exp (in place over a dying value) -> reshape (alias) -> ... with enough short-lived
    values that the planner reuses bytes."""
    rng = np.random.default_rng(3)
    g = GraphBuilder("rw")
    x = g.input("x", "f32", (4, 8))
    w = g.param("w", rng.standard_normal((8, 8)).astype(np.float32))
    a = x @ w
    b = g.exp(a)                      # a dies here: in place
    c = b.reshape(8, 4)               # a reshape alias of b's bytes
    d = (g.tanh(c) * c).reshape(4, 8)  # two operands: the core does not cancel this reshape pair
    e = d @ w
    f = g.neg(e) @ w
    g.output(f + e, "out")
    return g.build()


def test_sets_name_buffers_and_bytes() -> None:
    prog = _lower(_small())
    plan, types = prog.plan, prog.graph.types
    steps = prog.kernels
    assert all(isinstance(a, Access) for s in steps for a in (*s.reads, *s.writes))
    for s in steps:
        assert [a.value for a in s.reads] == list(dict.fromkeys(s.inputs))
        assert [a.value for a in s.writes] == list(s.outputs)
        for a in (*s.reads, *s.writes):
            assert a.size == types[a.value].nbytes()
            if a.value == "w":
                assert a.space == "const"  # weights are constants, never in the arena
            else:
                assert a.space == "arena" and a.offset == plan.offsets[a.value]
                assert plan.offsets[a.buffer] == a.offset and a.buffer not in plan.aliases
    # In place and reshape: the output's bytes are its input's, under the input's buffer name.
    aliased = [s for s in steps if s.in_place]
    assert any(s.op == "reshape" for s in aliased), [s.op for s in steps]
    assert any(s.op != "reshape" for s in aliased), [s.op for s in steps]
    for s in aliased:
        (w,) = s.writes
        r = next(r for r in s.reads if r.offset == w.offset)
        assert w.buffer == r.buffer and plan.aliases[w.value] == r.buffer
    # Dataflow is always a RAW.
    made = {o: i for i, s in enumerate(steps) for o in s.outputs}
    for s in steps:
        for x in s.inputs:
            if x in made:
                assert "RAW" in conflicts(steps[made[x]], s)


def test_buffer_reuse_shows_as_war_and_waw_and_distance_removes_it() -> None:
    graph = _small()
    tight = _lower(graph, reuse=0)
    found = 0
    for p in (tight, _lower(graph, reuse=3)):
        ks = p.kernels
        idx = {id(s): i for i, s in enumerate(p.steps)}
        for j, s in enumerate(ks):
            for i in range(j):
                old_reads = {r.value for r in ks[i].reads}
                # bytes of a value another step reads, taken over by an unrelated later value
                reused = [w for w in s.writes for r in ks[i].reads
                          if w.meets(r) and w.buffer != r.buffer]
                if reused:
                    assert "WAR" in conflicts(ks[i], s) and "WAR" in p.conflicts(idx[id(s)], idx[id(ks[i])])
                    assert not old_reads & {w.value for w in s.writes}
                    if p is tight:
                        found += 1
                    else:  # reserved for 3 steps: reuse only further away
                        assert j - i > 3
    assert found, "the tight plan should reuse a buffer"


def test_transfers_have_sets() -> None:
    prog = _lower(_small(), host=False)
    ts = prog.transfers
    assert ts[0].src == "host" and ts[0].reads[0].space == "host" and ts[0].writes[0].space == "arena"
    assert ts[-1].dst == "host" and ts[-1].reads[0].space == "arena" and ts[-1].writes[0].space == "host"
    first_kernel = next(i for i, s in enumerate(prog.steps) if isinstance(s, Step))
    assert "RAW" in prog.conflicts(0, first_kernel)  # the kernel reads what the upload wrote
    last = len(prog.steps) - 1
    maker = next(i for i, s in enumerate(prog.steps)
                 if isinstance(s, Step) and ts[-1].value in s.outputs)
    assert "RAW" in prog.conflicts(maker, last)
    assert prog.conflicts(last, last) == ()


# -- property: the sets agree with a brute-force byte computation from the buffer plan ----------

def _random_graph(rng: np.random.Generator, k: int) -> Graph:
    g = GraphBuilder(f"rand{k}")
    m, n = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    vals: list[Any] = [g.input("x", "f32", (m, n))]
    w = g.param("w", rng.standard_normal((n, n)).astype(np.float32))
    for _ in range(int(rng.integers(3, 14))):
        x = vals[int(rng.integers(max(0, len(vals) - 4), len(vals)))]
        x = x.reshape(m, n) if tuple(x.shape) != (m, n) else x
        kind = int(rng.integers(0, 7))
        if kind == 0:
            y = g.exp(x)
        elif kind == 1:
            y = g.tanh(x)
        elif kind == 2:
            y = x + vals[int(rng.integers(0, len(vals)))].reshape(m, n)
        elif kind == 3:
            y = x @ w
        elif kind == 4:
            y = x.reshape(n, m) if rng.integers(0, 2) else x.reshape(m * n)
        elif kind == 5:
            y = g.softmax(x)
        else:
            y = g.neg(x) * x
        vals.append(y)
    g.output(vals[-1].reshape(m, n), "out")
    if len(vals) > 3 and rng.integers(0, 2):
        g.output(vals[len(vals) // 2], "mid")
    return g.build()


def _bytes(prog: Program, values: tuple[str, ...]) -> tuple[set[int], set[str]]:
    """Arena bytes and constants of ``values``, from the plan's offsets and the value types alone."""
    arena: set[int] = set()
    const: set[str] = set()
    for v in values:
        if v in prog.plan.offsets:
            off = prog.plan.offsets[v]
            arena |= set(range(off, off + prog.graph.types[v].nbytes()))
        else:
            const.add(v)
    return arena, const


@pytest.mark.parametrize("reuse", [0, 2])
def test_sets_agree_with_brute_force(reuse: int) -> None:
    rng = np.random.default_rng(1234 + reuse)
    checked = 0
    for k in range(40):
        prog = _lower(_random_graph(rng, k), reuse=reuse)
        ks = prog.kernels
        sets = [(_bytes(prog, s.inputs)[0], _bytes(prog, s.outputs)[0]) for s in ks]
        for s in ks:
            for a in (*s.reads, *s.writes):
                if a.space == "arena":
                    assert set(range(a.offset, a.end)) == _bytes(prog, (a.value,))[0]
                    root = a.buffer
                    while root in prog.plan.aliases:
                        root = prog.plan.aliases[root]
                    assert root == a.buffer
                else:
                    assert a.value in (p.name for p in prog.graph.params)
            assert not any(a.space == "const" for a in s.writes)
        for j in range(len(ks)):
            for i in range(j):
                (ri, wi), (rj, wj) = sets[i], sets[j]
                want = tuple(h for h, hit in (("RAW", wi & rj), ("WAR", ri & wj), ("WAW", wi & wj)) if hit)
                assert conflicts(ks[i], ks[j]) == want, (k, i, j)
                checked += 1
        # and the plan is sound: no step between the one that makes a value and one that reads it
        # writes its bytes
        made = {o: i for i, s in enumerate(ks) for o in s.outputs}
        for j, s in enumerate(ks):
            for x in s.inputs:
                if x in made:
                    xb = _bytes(prog, (x,))[0]
                    assert not any(xb & sets[h][1] for h in range(made[x] + 1, j)), (k, x)
    assert checked > 500


def test_unlowered_steps_have_empty_sets() -> None:
    s = Step("n", "exp", "k", ("a",), ("b",), {}, "native", "native")
    t = Transfer("a", "host", "dev", 4)
    assert s.reads == s.writes == t.reads == t.writes == () and conflicts(s, t) == ()
