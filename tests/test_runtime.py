"""Runtime: input validation, specialisation, memory planning, compile cache, threads."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from rlx_core import GraphBuilder, Session
from rlx_core.errors import InputError
from rlx_core.ir.reference import evaluate
from rlx_core.lir import plan_memory

RNG = np.random.default_rng(11)


def _branchy() -> object:
    """Many short-lived values with overlapping lifetimes: a good stress for buffer reuse."""
    g = GraphBuilder("branchy")
    x = g.input("x", "f32", ("batch", 16))
    w = g.param("w", RNG.standard_normal((16, 16)).astype(np.float32) * 0.3)
    h = x
    skips = []
    for i in range(6):
        a = g.tanh(h @ w)
        b = g.exp(-a) * a
        h = a + b + (skips[-1] if skips else h)
        skips.append(h)
        if i % 2:
            h = g.softmax(h) + skips[0]
    g.output(h, "out")
    g.output(skips[2], "mid")
    return g.build()


def test_memory_plan_reuses_without_corruption() -> None:
    graph = _branchy()
    exe = Session("cpu", use_cache=False).compile(graph)
    for batch in (1, 3, 7):
        x = RNG.standard_normal((batch, 16)).astype(np.float32)
        out = exe.run(x=x)
        want = evaluate(graph, {"x": x})
        for k in ("out", "mid"):
            np.testing.assert_allclose(out[k], want[k], rtol=2e-5, atol=2e-6)
    prog = exe.program({"batch": 7})
    assert prog.plan.arena_bytes < prog.plan.naive_bytes  # rlx-cpu keeps freed buffers a while
    tight, _ = plan_memory(prog.graph, list(prog.kernels), {v for _, v in prog.outputs})
    assert tight.arena_bytes < prog.plan.naive_bytes / 2
    assert any(s.in_place for s in prog.kernels)


def test_memory_plan_never_overlaps_live_values() -> None:
    graph = _branchy().specialize({"batch": 4})
    exe = Session("cpu", use_cache=False).compile(graph)
    prog = exe.program()
    steps = list(prog.kernels)
    first = {v.name: -1 for v in prog.inputs}
    last = dict(first)
    for i, s in enumerate(steps):
        for o in s.outputs:
            first[o] = last[o] = i
        for x in s.inputs:
            if x in last:
                last[x] = i
    for _, v in prog.outputs:
        last[v] = len(steps)
    names = list(first)
    aliases = {s.outputs[0]: s for s in steps if s.in_place}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            live_together = not (last[a] < first[b] or last[b] < first[a])
            if live_together and prog.plan.overlaps(a, b):
                # Only an in-place step may share: its output takes its dying input's buffer.
                s = aliases.get(b) or aliases.get(a)
                assert s is not None and (a in s.inputs or b in s.inputs), (a, b)


def test_plan_memory_keeps_outputs_alive() -> None:
    graph = _branchy().specialize({"batch": 2})
    exe = Session("cpu", use_cache=False).compile(graph)
    prog = exe.program()
    plan, _ = plan_memory(prog.graph, list(prog.kernels), {v for _, v in prog.outputs})
    out_vals = [v for _, v in prog.outputs]
    assert not plan.overlaps(out_vals[0], out_vals[1])


@pytest.mark.parametrize(
    ("feed", "match"),
    [
        ({}, "missing input"),
        ({"x": np.zeros((2, 16), np.float32), "y": 1}, "unknown input"),
        ({"x": np.zeros((2, 16), np.float64)}, "dtype float64, the graph expects f32"),
        ({"x": np.zeros((2, 15), np.float32)}, "axis 1: 15 != 16"),
        ({"x": np.zeros((16,), np.float32)}, "rank 1"),
    ],
)
def test_input_validation_messages(feed: dict, match: str) -> None:
    exe = Session("cpu", use_cache=False).compile(_branchy())
    with pytest.raises(InputError, match=match) as e:
        exe.run(feed)
    assert e.value.fix


def test_inconsistent_symbol_binding() -> None:
    g = GraphBuilder("two")
    a = g.input("a", "f32", ("n",))
    b = g.input("b", "f32", ("n",))
    g.output(a + b)
    exe = Session("cpu", use_cache=False).compile(g.build())
    with pytest.raises(InputError, match="symbol 'n' is 3 in one input but 4"):
        exe.run(a=np.zeros(3, np.float32), b=np.zeros(4, np.float32))


def test_noncontiguous_inputs_and_positional_call() -> None:
    g = GraphBuilder("t")
    x = g.input("x", "f32", (3, 4))
    g.output(x * 2.0)
    exe = Session("cpu", use_cache=False).compile(g.build())
    base = RNG.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(exe(base.T), base.T * 2)


def test_outputs_are_not_views_of_the_arena() -> None:
    g = GraphBuilder("t")
    x = g.input("x", "f32", (4,))
    g.output(x + 1.0)
    exe = Session("cpu", use_cache=False).compile(g.build())
    first = exe(np.zeros(4, np.float32))
    exe(np.ones(4, np.float32))
    assert first.tolist() == [1, 1, 1, 1]


def test_compile_cache_hit_and_corruption(tmp_path: Path) -> None:
    graph = _branchy().specialize({"batch": 2})
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    s1 = Session("cpu", cache_dir=tmp_path)
    r1 = s1.compile(graph).run(x=x)
    assert s1.cache is not None and s1.cache.misses == 1
    files = list(tmp_path.rglob("*.rlxc"))
    assert len(files) == 1
    s2 = Session("cpu", cache_dir=tmp_path)
    exe2 = s2.compile(graph)
    r2 = exe2.run(x=x)
    assert s2.cache is not None and s2.cache.hits == 1 and exe2.report.from_cache
    for k in r1:
        np.testing.assert_array_equal(r1[k], r2[k])
    files[0].write_bytes(b"garbage")
    s3 = Session("cpu", cache_dir=tmp_path)
    r3 = s3.compile(graph).run(x=x)  # a corrupt entry is rebuilt, never trusted
    assert s3.cache is not None and s3.cache.misses == 1
    np.testing.assert_array_equal(r1["out"], r3["out"])
    assert not list(tmp_path.rglob(".tmp-*"))


def test_cache_key_changes_with_weights(tmp_path: Path) -> None:
    def graph(scale: float) -> object:
        g = GraphBuilder("w")
        x = g.input("x", "f32", (2,))
        g.output(x * g.param("s", np.full(2, scale, np.float32)))
        return g.build()

    s = Session("cpu", cache_dir=tmp_path)
    a = s.compile(graph(2.0)).run(x=np.ones(2, np.float32))
    b = s.compile(graph(3.0)).run(x=np.ones(2, np.float32))
    assert a["mul_0"][0] == 2 and b["mul_0"][0] == 3


def test_two_sessions_in_two_threads_are_deterministic() -> None:
    graph = _branchy()
    x = RNG.standard_normal((5, 16)).astype(np.float32)
    want = Session("cpu", use_cache=False).compile(graph).run(x=x)["out"]
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            exe = Session("cpu", use_cache=False).compile(graph)
            for _ in range(20):
                results.append(exe.run(x=x)["out"])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 40 and all(np.array_equal(r, want) for r in results)


def test_one_executable_shared_by_threads() -> None:
    graph = _branchy()
    exe = Session("cpu", use_cache=False).compile(graph)
    xs = [RNG.standard_normal((3, 16)).astype(np.float32) for _ in range(2)]
    wants = [exe.run(x=x)["out"] for x in xs]
    bad: list[int] = []

    def work(i: int) -> None:
        for _ in range(30):
            if not np.array_equal(exe.run(x=xs[i])["out"], wants[i]):
                bad.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_reuse_distance_keeps_freed_buffers_reserved() -> None:
    graph = _branchy().specialize({"batch": 2})
    prog = Session("cpu", use_cache=False).compile(graph).program()
    steps = list(prog.kernels)
    keep = {v for _, v in prog.outputs}
    made = {o: i for i, s in enumerate(steps) for o in s.outputs}
    last_read = {x: i for i, s in enumerate(steps) for x in s.inputs if x in made}
    for dist in (0, 1, 3):
        plan, new_steps = plan_memory(prog.graph, steps, keep, reuse_distance=dist)
        aliased = {o for s in new_steps if s.in_place for o in s.outputs}
        for a, end in last_read.items():
            for b, start in made.items():
                if a == b or b in aliased or a in aliased:
                    continue
                if end < start <= end + dist:  # b is made within `dist` steps after a's last read
                    assert not plan.overlaps(a, b), (dist, a, b)
    assert plan_memory(prog.graph, steps, keep, reuse_distance=3)[0].arena_bytes >= \
        plan_memory(prog.graph, steps, keep)[0].arena_bytes


def test_cache_key_changes_when_the_backend_source_changes(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # A backend author edits the plugin (a development install: same version): graphs legalized
    # by the old code must not be reused.
    from rlx_core import cache as cache_mod

    graph = _branchy().specialize({"batch": 2})
    s = Session("cpu", cache_dir=tmp_path)
    backend, device = s.devices[0]
    assert s.cache is not None
    before = s.cache.key(graph, backend, device)
    assert s.cache.key(graph, backend, device) == before  # stable while nothing changes
    real = cache_mod.source_stamp

    def edited(package_dir: str) -> str:
        return real(package_dir) + ("+edit" if package_dir.endswith("rlx_cpu") else "")
    monkeypatch.setattr(cache_mod, "source_stamp", edited)
    assert s.cache.key(graph, backend, device) != before
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    stamp = real.__wrapped__(str(pkg))  # type: ignore[attr-defined]
    os.utime(pkg / "a.py", ns=(1, 10**18))
    assert real.__wrapped__(str(pkg)) != stamp  # type: ignore[attr-defined]
