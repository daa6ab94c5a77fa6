"""The buffer-binding capability (rlx_core.plugin.BufferBinding): what rlx-cpu's programs declare,
what Executable.buffers() hands out or refuses, and ResidentTrainer driving nothing but it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from rlx_core.errors import CapabilityError, InputError
from rlx_core.optim import SGD, Adam, ResidentTrainer, Trainer
from rlx_core.plugin import BufferBinding, CompiledProgram, GraphBuilder, Session
from rlx_core.train_bench import init_params, mlp_graph, thread_limits


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    with thread_limits(1):
        yield


class OnlyRun:
    """A compiled program with nothing but ``run``: a backend without the capability."""

    __slots__ = ("_p",)

    def __init__(self, p: Any) -> None:
        self._p = p

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self._p.run(inputs)
        return out


class OnlyProtocol(OnlyRun):
    """Exposes exactly BufferBinding's methods: any other attribute a caller reaches for fails."""

    __slots__ = ()

    def buffer(self, name: str) -> np.ndarray:
        view: np.ndarray = self._p.buffer(name)
        return view

    def bind_input(self, name: str, array: np.ndarray) -> bool:
        return bool(self._p.bind_input(name, array))

    def run_bound(self) -> None:
        self._p.run_bound()


def _wrapping(monkeypatch: pytest.MonkeyPatch, session: Session, wrapper: type) -> None:
    orig = session.backend.compile
    monkeypatch.setattr(session.backend, "compile", lambda p, d: wrapper(orig(p, d)))


def _data(arch: tuple[int, ...], b: int, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((b, arch[0])).astype(np.float32), rng.integers(0, arch[-1], b))
            for _ in range(n)]


def test_cpu_program_declares_the_capability() -> None:
    g = GraphBuilder("axpy")
    x = g.input("x", "f32", (4, 3))
    s = g.input("s", "f32", (4, 3))
    g.output(x * 2.0 + s, "s_next")
    exe = Session("cpu").compile(g.build(), carry={"s": "s_next"})
    b = exe.buffers()
    assert isinstance(b, BufferBinding) and isinstance(b, CompiledProgram)
    x0 = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.copyto(b.buffer("s"), np.ones((4, 3), np.float32))
    for _ in range(3):  # state carried through the program's own buffers
        b.bind_input("x", x0)
        b.run_bound()
        np.copyto(b.buffer("s"), b.buffer("s_next"))
    np.testing.assert_array_equal(b.buffer("s"), 1 + 3 * 2 * x0)
    with pytest.raises(InputError, match="no value 'nope'"):
        b.buffer("nope")


def test_carry_is_checked() -> None:
    g = GraphBuilder("c")
    x = g.input("x", "f32", (2,))
    g.output(g.op("neg", x), "y")
    with pytest.raises(InputError, match="cannot carry"):
        Session("cpu").compile(g.build(), carry={"y": "x"})


def test_missing_capability_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    arch = (6, 5, 3)
    model = mlp_graph(arch, init_params(arch, 2), 4)
    s = Session("cpu")
    _wrapping(monkeypatch, s, OnlyRun)
    exe = s.compile(model)
    with pytest.raises(CapabilityError, match=r"rlx-cpu.*BufferBinding.*missing: buffer, bind_input, "
                                              r"run_bound") as e:
        exe.buffers()
    assert e.value.fix and "Executable.run" in e.value.fix
    with pytest.raises(CapabilityError, match="buffer-binding"):
        ResidentTrainer(model, "loss", SGD(lr=0.1), session=s, resident=True)
    # Unasked, the trainer runs through Executable.run and learns the same.
    generic = ResidentTrainer(model, "loss", SGD(lr=0.1, momentum=0.9), session=s)
    ref = Trainer(model, "loss", SGD(lr=0.1, momentum=0.9))
    assert not generic.resident
    for xb, yb in _data(arch, 4, 5):
        assert generic.step(x=xb, y=yb) == pytest.approx(ref.step(x=xb, y=yb), rel=1e-6, abs=1e-7)


def test_resident_trainer_needs_one_device() -> None:
    # A multi-device session compiles to a MultiDeviceExecutable: without carried state (resident=False)
    # the trainer failed later with an AttributeError on .program() (found by mypy).
    arch = (6, 5, 3)
    model = mlp_graph(arch, init_params(arch, 2), 4)
    for resident in (False, None):
        with pytest.raises(InputError, match="one device"):
            ResidentTrainer(model, "loss", SGD(lr=0.1), device="cpu,cpu", resident=resident)


@pytest.mark.parametrize("fusion", [False, True], ids=["nofusion", "fusion"])
@pytest.mark.parametrize("opt", [SGD(lr=0.05, momentum=0.9), Adam(lr=1e-2)], ids=["sgd", "adam"])
def test_resident_trainer_needs_only_the_protocol(monkeypatch: pytest.MonkeyPatch, fusion: bool,
                                                   opt: Any) -> None:
    """Behind a program exposing only BufferBinding's methods (no arena, views or runs to reach
    into) ResidentTrainer keeps its state resident and matches the plain Trainer, whether the
    updates ran in place or are copied back after each run."""
    arch = (20, 16, 12, 5)
    model = mlp_graph(arch, init_params(arch, 1), 16)
    s = Session("cpu", fusion=fusion)
    _wrapping(monkeypatch, s, OnlyProtocol)
    tr = ResidentTrainer(model, "loss", opt, session=s, resident=True)
    ref = Trainer(model, "loss", opt)
    assert tr.resident and isinstance(tr.binding, OnlyProtocol)
    for xb, yb in _data(arch, 16, 10):
        assert tr.step(x=xb, y=yb) == pytest.approx(ref.step(x=xb, y=yb), rel=1e-6, abs=1e-7)
    for p, v in ref.values.items():
        np.testing.assert_allclose(tr.values()[p], v, rtol=1e-5, atol=1e-6)
    for k, v in ref.state.items():
        np.testing.assert_allclose(tr.state()[k], v, rtol=1e-5, atol=1e-6)


def test_resident_plan_is_the_normal_lowering() -> None:
    """The trainer's program comes from the session's lowering, so the device's reuse distance
    applies; carried inputs are in place or kept live to the end of the run."""
    arch = (20, 16, 5)
    tr = ResidentTrainer(mlp_graph(arch, init_params(arch, 1), 8), "loss", Adam(lr=1e-2), fusion=True)
    prog = tr.program
    assert prog is tr.executable.program()
    plan = prog.plan
    steps = prog.kernels
    last = {v: max((k for k, st in enumerate(steps) if v in st.inputs), default=-1) for v in tr.carry}
    for i, o in tr.carry.items():
        if plan.offsets[i] != plan.offsets[o]:
            # live to the end: no value written at or after its last read shares its bytes
            for st in steps[last[i] + 1:]:
                for out in st.outputs:
                    assert not plan.overlaps(i, out), (i, out)
