"""Fusion as regions that backends claim (rlx_core.regions, hook ``rlx_fusion_rules``).

A small in-process backend adds the op ``acme.fma`` (``a * b + c``) and a rule proposing it for
``add(mul(a, b), c)``: the region is taken only where the backend claims ``acme.fma`` natively, the
result matches the unfused reference, the dispatch report lists it, and broken rules name themselves.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from rlx_core import GraphBuilder
from rlx_core.plugin import (
    PLUGIN_API_VERSION,
    REGISTRY,
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    FusionRule,
    Graph,
    Hub,
    KernelClaim,
    Node,
    OpSchema,
    PluginError,
    Region,
    Session,
    hookimpl,
)
from rlx_core.regions import apply

FMA = "acme.fma"


def _fma_schema() -> OpSchema:
    def infer(ts: Any, attrs: Any) -> list[Any]:
        return [ts[0]]

    def reference(xs: Sequence[np.ndarray], attrs: Any) -> list[np.ndarray]:
        return [xs[0] * xs[1] + xs[2]]

    return OpSchema(FMA, ("a", "b", "c"), infer, reference, provider="rlx-acme")


SCHEMA = _fma_schema()  # one object: registering it again (a fresh hub per test) is a no-op


@pytest.fixture(autouse=True, scope="module")
def _forget_the_op() -> Iterator[None]:
    """The op registry is global: later tests that walk every op must not meet acme.fma."""
    yield
    if FMA in REGISTRY:
        REGISTRY.unregister(FMA)


def find_fma(g: Graph) -> list[Region]:
    out = []
    for n in g.nodes:
        if n.op != "add":
            continue
        m = g.producers.get(n.inputs[0])
        if m is None or m.op != "mul" or len(g.consumers[m.outputs[0]]) != 1 or m.outputs[0] in g.outputs:
            continue
        out.append(Region((m.name, n.name), (Node(f"{n.name}/fma", FMA, (*m.inputs, n.inputs[1]),
                                                 n.outputs),)))
    return out


def _binary(fn: Any) -> Any:
    return lambda ins, outs, attrs: (lambda: fn(*ins, out=outs[0]))


class Acme:
    """A whole backend in a class: claims mul, add and (when ``fma``) acme.fma."""

    def __init__(self, *, fma: bool, rules: Sequence[FusionRule]) -> None:
        self.fma, self.rules = fma, list(rules)
        self.ran: list[str] = []

    @hookimpl
    def rlx_backend_info(self) -> BackendInfo:
        return BackendInfo(name="acme", version="1.0", api_version=PLUGIN_API_VERSION)

    @hookimpl
    def rlx_probe_devices(self) -> list[DeviceInfo]:
        caps = DeviceCaps(peak_flops={"default": 1e9}, mem_bandwidth=1e9, launch_overhead=1e-6)
        return [DeviceInfo(backend="acme", name="acme:0", available=True, caps=caps)]

    @hookimpl
    def rlx_ops(self) -> list[OpSchema]:
        return [SCHEMA]

    @hookimpl
    def rlx_fusion_rules(self) -> list[FusionRule]:
        return self.rules

    @hookimpl
    def rlx_kernels(self, device: DeviceInfo) -> list[KernelClaim]:
        def fma(ins: Any, outs: Any, attrs: Any) -> Any:
            return lambda: np.add(ins[0] * ins[1], ins[2], out=outs[0])

        claims = [KernelClaim("mul", "acme.mul", impl=_binary(np.multiply), dtypes={"f32"}),
                  KernelClaim("add", "acme.add", impl=_binary(np.add), dtypes={"f32"})]
        if self.fma:
            claims.append(KernelClaim(FMA, "acme.fma", impl=fma, dtypes={"f32"}))
        return claims

    @hookimpl
    def rlx_compile(self, program: Any, device: DeviceInfo) -> Any:
        impls = {c.name: c.impl for c in self.rlx_kernels(device)}
        backend = self

        class Prog:
            def run(self, inputs: Any) -> dict[str, Any]:
                g = program.graph
                env = dict(inputs)
                env.update({p.name: g.weights[p.name] for p in g.params})
                for s in program.kernels:
                    out = np.empty(g.types[s.outputs[0]].shape, np.float32)
                    impls[s.kernel]([env[i] for i in s.inputs], [out], s.attrs)()
                    backend.ran.append(s.kernel)
                    env[s.outputs[0]] = out
                return env

        return Prog()


def _graph() -> Graph:
    b = GraphBuilder("fma")
    x, y, z = (b.input(n, "f32", (4, 3)) for n in "xyz")
    b.output(b.add(b.mul(x, y), z))
    return b.build()


def _session(fma: bool, rules: Sequence[FusionRule]) -> tuple[Session, Acme]:
    plugin = Acme(fma=fma, rules=rules)
    hub = Hub(autoload=False)
    hub.register(plugin, "acme", distribution="rlx-acme")
    return Session("acme", hub=hub, use_cache=False), plugin


RULE = FusionRule("acme.fma", find_fma, stage="graph", doc="a * b + c in one kernel")
INPUTS = {k: np.random.default_rng(i).standard_normal((4, 3)).astype(np.float32) for i, k in enumerate("xyz")}


@pytest.mark.parametrize("stage", ["graph", "legal"])
def test_claimed_region_runs_fused_and_is_reported(stage: str) -> None:
    rule = FusionRule("acme.fma", find_fma, stage=stage)
    sess, plugin = _session(True, [rule])
    exe = sess.compile(_graph())
    (out,) = exe.run(INPUTS).values()
    np.testing.assert_allclose(out, INPUTS["x"] * INPUTS["y"] + INPUTS["z"], rtol=1e-6)
    assert plugin.ran == ["acme.fma"]
    assert exe.report is not None and len(exe.report.fused) == 1 and len(exe.report.fused[0]) == 2


def test_unclaimed_region_is_not_taken() -> None:
    sess, plugin = _session(False, [RULE])
    exe = sess.compile(_graph())
    exe.run(INPUTS)
    assert plugin.ran == ["acme.mul", "acme.add"]
    assert exe.report is not None and exe.report.fused == []


def test_region_a_backend_declines_in_apply_leaves_the_graph() -> None:
    g = _graph()
    new, taken = apply(g, [RULE], "graph", lambda n, ins, outs: False)
    assert new is g and taken == []
    new, taken = apply(g, [RULE], "graph", lambda n, ins, outs: True)
    assert [n.op for n in new.nodes] == [FMA] and taken[0].rule == "acme.fma"


def test_broken_rule_names_itself_and_its_plugin() -> None:
    def boom(g: Graph) -> list[Region]:
        raise RuntimeError("bad pattern")

    sess, _ = _session(True, [FusionRule("acme.boom", boom, stage="graph")])
    with pytest.raises(PluginError) as e:
        sess.compile(_graph())
    msg = str(e.value)
    assert "acme.boom" in msg and "acme" in msg and "bad pattern" in msg and "fix" in msg


def test_region_that_drops_a_value_read_outside_is_refused() -> None:
    b = GraphBuilder("leak")
    x, y, z = (b.input(n, "f32", (4, 3)) for n in "xyz")
    m = b.mul(x, y)
    b.output(b.add(m, z))
    b.output(m)  # the product is also a graph output: the region may not swallow it
    g = b.build()
    mul, add = g.nodes

    def bad(graph: Graph) -> list[Region]:
        return [Region((mul.name, add.name), (Node("f", FMA, (x.name, y.name, z.name), add.outputs),))]

    with pytest.raises(PluginError) as e:
        apply(g, [FusionRule("acme.bad", bad, stage="graph", provider="rlx-acme")], "graph",
              lambda n, ins, outs: True)
    assert "acme.bad" in str(e.value) and "read outside" in str(e.value)


def test_region_records_are_validated() -> None:
    with pytest.raises(PluginError):
        Region((), (Node("f", FMA, ("a", "b", "c"), ("o",)),))
    with pytest.raises(PluginError):
        Region(("a", "a"), (Node("f", FMA, ("a", "b", "c"), ("o",)),))
    with pytest.raises(PluginError):
        Region(("a",), (Node("f", FMA, ("a", "b", "c"), ("o",)),), claim=("g",))
    with pytest.raises(PluginError):
        FusionRule("x", find_fma, stage="late")


def test_core_rules_come_after_the_backends_own() -> None:
    sess, _ = _session(True, [RULE])
    backend = sess.devices[0][0]
    names = [r.name for r in sess.fusion_rules(backend)]
    assert names == ["acme.fma", "attention", "norms", "elementwise"]
    assert sess.fusion_rules(backend)[0].provider == "acme"


def test_sole_reader_is_the_one_reader_of_a_value_not_an_output() -> None:
    g = GraphBuilder("sole")
    x = g.input("x", "f32", (3,))
    a = g.op("exp", x)
    b = g.op("neg", a)        # a: read by neg alone
    c = g.op("add", b, b)     # b: read twice (by one node): not a sole read
    d = g.op("relu", c)
    e = g.op("sin", d)        # d: read by sin and a graph output
    g.output(e, "y")
    g.output(d, "d")
    f = g.op("cos", x)        # x: read by exp and cos
    g.output(f, "z")
    graph = g.build()
    names = {n.op: n for n in graph.nodes}
    assert graph.sole_reader(a.name) is names["neg"]
    assert graph.sole_reader(b.name) is None
    assert graph.sole_reader(c.name) is names["relu"]
    assert graph.sole_reader(x.name) is None
    assert graph.sole_reader("d") is None
    assert graph.sole_reader("y") is None  # no reader at all
