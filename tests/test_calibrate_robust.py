"""Calibration that refuses contended figures, and placement that avoids unreliable estimates.

Every timing here is fake (a scripted clock, a scripted timer): nothing depends on how busy the
test machine is. The cost model against real run times is checked by rlx_conformance.costcheck.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from rlx_core.calibrate import REFUSE_FACTOR, calibrate, judge
from rlx_core.calibration import apply_calibration, calibration_path
from rlx_core.cost import DeviceEstimate, choose_device
from rlx_core.errors import BackendNotFoundError, CalibrationError
from rlx_core.ir.graph import Graph
from rlx_core.records import DeviceCaps, DeviceInfo
from rlx_core.timing import LoadMeter, Timing, time_best

CAPS = DeviceCaps(peak_flops={"f32": 1e10}, mem_bandwidth=1e10, launch_overhead=1e-6)
LABELS = ("launch overhead", "memory bandwidth", "memory bandwidth (chain of 4)", "gemm f32", "gemm f64",
          "gemm f16")


# -- timing ------------------------------------------------------------------------------------

class FakeMeter(LoadMeter):
    def __init__(self, load: float | None) -> None:
        self.load = load

    def start(self) -> None:
        pass

    def stop(self) -> float | None:
        return self.load


def scripted_clock(durations: list[float]) -> Callable[[], float]:
    """A perf_counter under which the n-th timed call takes ``durations[n]`` seconds."""
    state = {"now": 0.0, "in_call": False}
    pending = iter(durations)

    def clock() -> float:
        if state["in_call"]:  # the end of a call: time moves on by its duration
            state["now"] += next(pending)
        state["in_call"] = not state["in_call"]
        return state["now"]

    return clock


def test_time_best_keeps_each_rounds_best_and_the_best_round() -> None:
    # 2 rounds x 3 calls (min_time 0); round 1 has an outlier, round 2 is uniformly slower
    clock = scripted_clock([5.0, 1.0, 1.25, 2.0, 2.5, 2.25])  # exact in binary
    t = time_best(lambda: None, rounds=2, min_time=0.0, min_reps=3, clock=clock, meter=lambda: FakeMeter(0.1))
    assert t.rounds == (1.0, 2.0) and t.best == 1.0
    assert t.spread == pytest.approx(0.5) and t.other_load == 0.1


@pytest.mark.parametrize(("rounds", "load", "busy"), [
    ((1.0, 1.1, 1.2), 0.0, False),
    ((1.0, 1.1, 1.2), None, False),   # no /proc: only the spread can tell
    ((1.0, 2.0, 2.0), 0.0, True),     # rounds disagree
    ((1.0, 1.0, 1.0), 0.5, True),     # another process held one of two cores
])
def test_contention_is_told_by_spread_or_load(rounds: tuple[float, ...], load: float | None,
                                              busy: bool) -> None:
    t = Timing(min(rounds), rounds, load)
    assert t.contended is busy
    assert "best of 3 rounds" in t.describe()


def test_load_meter_reads_proc_or_says_it_cannot() -> None:
    m = LoadMeter()
    m.start()
    sum(range(200_000))
    v = m.stop()
    assert v is None or 0.0 <= v <= 1.0


def test_cpu_quota_throttling_counts_as_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlx_core.timing as timing

    throttled, clock = iter([0, 400_000]), iter([10.0, 11.0])  # 0.4 s throttled in 1 s
    monkeypatch.setattr(timing, "_proc_stat", lambda: None)
    monkeypatch.setattr(timing, "_throttled_usec", lambda: next(throttled))
    monkeypatch.setattr(timing, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    m = timing.LoadMeter()
    m.start()
    assert m.stop() == pytest.approx(0.4)


# -- judging against the plugin's estimate --------------------------------------------------------

def bench(best: float, estimate: float | None, contended: bool = False) -> dict[str, Any]:
    return {"best": best, "estimate": estimate, "slowdown": None if estimate is None else best / estimate,
            "contended": contended, "how": "best of 3 rounds"}


def test_judge_refuses_only_beyond_the_factor() -> None:
    ok = judge({"gemm f32": bench(REFUSE_FACTOR * 0.99, 1.0), "gemm f64": bench(0.01, 1.0)})
    assert not ok.refused and not ok.warnings
    bad = judge({"gemm f32": bench(12.0, 1.0, contended=True), "memory bandwidth": bench(1.0, None)})
    assert len(bad.refused) == 1
    assert "gemm f32 ran 12.0x slower than the plugin estimates" in bad.refused[0]
    assert "the machine looked busy" in bad.refused[0]


def test_judge_warns_on_a_busy_machine_and_when_the_plugin_distrusts_itself() -> None:
    v = judge({"gemm f32": bench(1.0, 1.0, contended=True)})
    assert not v.refused and "looked busy" in v.warnings[0]
    v = judge({"gemm f32": bench(20.0, 1.0)}, trusted=False)
    assert not v.refused and "flags its own figures as rough" in v.warnings[0]


# -- calibrate() end to end with a fake device ----------------------------------------------------

class FakeSession:
    def __init__(self) -> None:
        self.device = SimpleNamespace(name="fake:0", caps=CAPS)

    def compile(self, graph: Graph) -> Any:
        return SimpleNamespace(run=lambda feed: None)


def fake_calibrate(slow: dict[str, float], **kw: Any) -> dict[str, Any]:
    """Every benchmark takes 1 ms a kernel against a 1 ms estimate, except ``slow[label]`` times that."""
    def timer(label: str, fn: Callable[[], Any]) -> Timing:
        best = 1e-3 * slow.get(label, 1.0) * (4 if "chain of 4" in label else 1)
        return Timing(best, (best, best, best), 0.6 if label in slow else 0.0)

    return calibrate("fake", quick=True, session_factory=lambda b: FakeSession(), timer=timer,
                     estimator=lambda g: 1e-3, **kw)


@pytest.fixture
def no_file() -> Iterator[None]:
    p = calibration_path("fake", "fake:0")
    p.unlink(missing_ok=True)
    yield
    p.unlink(missing_ok=True)


def test_a_contended_figure_far_below_the_estimate_is_refused(no_file: None) -> None:
    with pytest.raises(CalibrationError) as e:
        fake_calibrate({"gemm f32": 9.0})
    msg = str(e.value)
    assert "not stored" in msg and "gemm f32 ran 9.0x slower" in msg and "busy" in msg
    assert "--force" in (e.value.fix or "") and "idle machine" in (e.value.fix or "")
    assert not calibration_path("fake", "fake:0").exists()


def test_force_stores_it_flagged_and_placement_then_avoids_the_device(no_file: None) -> None:
    r = fake_calibrate({"gemm f32": 9.0}, force=True)
    assert r["path"] and "gemm f32 ran 9.0x slower" in r["unreliable"]
    data = json.loads(calibration_path("fake", "fake:0").read_text())
    method = data["method"]
    assert method["forced"] and method["rounds"] == 3 and set(method["benchmarks"]) == set(LABELS)
    gemm = method["benchmarks"]["gemm f32"]
    assert gemm["contended"] and gemm["slowdown"] == pytest.approx(9.0) and gemm["tries"] == 3
    assert method["benchmarks"]["gemm f64"]["tries"] == 1
    dev = DeviceInfo(backend="fake", name="fake:0", available=True, caps=CAPS)
    caps = apply_calibration(dev).caps
    assert caps.source.startswith("calibrated") and "--force" in caps.unreliable


def test_a_busy_calibration_of_a_self_distrusting_plugin_stays_flagged(no_file: None) -> None:
    def timer(label: str, fn: Callable[[], Any]) -> Timing:
        return Timing(1e-3, (1e-3,) * 3, 0.9)

    rough = DeviceCaps(peak_flops={"f32": 1e9}, mem_bandwidth=1e9, launch_overhead=1e-5, unreliable="guess")

    def session(b: str) -> FakeSession:
        sess = FakeSession()
        sess.device.caps = rough
        return sess

    r = calibrate("fake", quick=True, session_factory=session, timer=timer)
    assert "machine was busy" in r["unreliable"] and not r["method"]["plugin_estimate_trusted"]


def test_a_clean_calibration_is_stored_and_clears_the_plugins_caveat(no_file: None) -> None:
    r = fake_calibrate({})
    assert r["path"] and not r.get("unreliable") and r["warnings"] == []
    rough = DeviceCaps(peak_flops={"f32": 1e9}, mem_bandwidth=1e9, launch_overhead=1e-5,
                       unreliable="a software device")
    dev = DeviceInfo(backend="fake", name="fake:0", available=True, caps=rough)
    caps = apply_calibration(dev).caps
    assert caps.unreliable == "" and caps.peak_flops["f32"] == pytest.approx(2 * 256**3 / 1e-3)
    assert caps.mem_bandwidth == pytest.approx(12 * (1 << 22) / 1e-3)  # (4 ms - 1 ms) / 3 adds


def test_a_device_with_its_own_memory_is_calibrated_from_kernel_chains(no_file: None) -> None:
    # one kernel: 1 ms, nearly all of it the host link; a chain of 4: 1.3 ms -> 0.1 ms a kernel
    class Discrete(FakeSession):
        def __init__(self) -> None:
            self.device = SimpleNamespace(name="fake:0", caps=CAPS, host_memory=False)

    def timer(label: str, fn: Callable[[], Any]) -> Timing:
        best = 1.3e-3 if "chain of 4" in label else 1e-3
        return Timing(best, (best,) * 3, 0.0)

    r = calibrate("fake", quick=True, session_factory=lambda b: Discrete(), timer=timer,
                  estimator=lambda g: 1e-3)
    assert r["mem_bandwidth"] == pytest.approx(12 * (1 << 22) / 1e-4)
    assert r["peak_flops"]["f32"] == pytest.approx(2 * 256**3 / 1e-4)
    assert "gemm f32 (chain of 4)" in r["method"]["benchmarks"]


def test_kernels_hidden_by_the_host_link_keep_the_plugins_figures(no_file: None) -> None:
    class Discrete(FakeSession):
        def __init__(self) -> None:
            self.device = SimpleNamespace(name="fake:0", caps=CAPS, host_memory=False)

    def timer(label: str, fn: Callable[[], Any]) -> Timing:  # 4 kernels add 5%: the link's noise
        best = 1.05e-3 if "chain of 4" in label else 1e-3
        return Timing(best, (best,) * 3, 0.0)

    r = calibrate("fake", quick=True, session_factory=lambda b: Discrete(), timer=timer,
                  estimator=lambda g: 1e-3)
    assert r["mem_bandwidth"] == CAPS.mem_bandwidth and r["peak_flops"]["f32"] == CAPS.peak_flops["f32"]
    assert any("host link takes nearly all of the time" in w for w in r["warnings"])


# -- choosing a device ------------------------------------------------------------------------------

def test_auto_placement_skips_a_device_whose_estimate_is_known_to_be_off() -> None:
    ranked = [DeviceEstimate("vulkan", 1e-4, unreliable="software Vulkan device"),
              DeviceEstimate("cpu", 2e-4), DeviceEstimate("cuda", None, error="no device")]
    assert choose_device(ranked) == "cpu"
    # the only device that can run it is chosen anyway: no choice is misled
    assert choose_device(ranked[:1] + ranked[2:]) == "vulkan"
    with pytest.raises(BackendNotFoundError, match="cuda: no device"):
        choose_device(ranked[2:], "g")


def test_vulkan_on_a_cpu_device_declares_software_figures_flagged() -> None:
    from rlx_vulkan.plugin import _CAPS, _cpu_caps

    caps = _cpu_caps("llvmpipe (LLVM 15)")
    assert "software Vulkan device" in caps.unreliable and "rlx calibrate vulkan" in caps.unreliable
    assert caps.peak_flops["f32"] < _CAPS.peak_flops["f32"] / 4 and not _CAPS.unreliable


# -- the cost-model check (rlx_core.costmodel_check): its verdicts on scripted timings --------------

def scripted_timer(*tries: tuple[float, float | None]) -> tuple[Callable[..., Timing], list[int]]:
    """A timer whose successive tries return (best seconds, other processes' load)."""
    calls = [0]

    def timer(fn: Callable[[], Any]) -> Timing:
        best, load = tries[min(calls[0], len(tries) - 1)]
        calls[0] += 1
        return Timing(best, (best, best, best), load)

    return timer, calls


@pytest.mark.parametrize(("tries", "expected", "n_tries"), [
    ([(1.0, 0.0)], "pass", 1),
    ([(0.2, 0.9)], "fail", 1),               # 5x faster than estimated: load cannot explain that
    ([(9.0, 0.0), (1.5, 0.0)], "pass", 2),   # a burst of noise, gone on the retry
    ([(9.0, 0.0)], "fail", 3),               # slow on an idle machine, every try
    ([(9.0, 0.6)], "busy", 3),               # slow while another process held the CPUs: inconclusive
])
def test_the_3x_check_fails_only_on_what_noise_cannot_explain(tries: list[tuple[float, float | None]],
                                                               expected: str, n_tries: int) -> None:
    from rlx_core.costmodel_check import check

    timer, calls = scripted_timer(*tries)
    r = check("dev:0", "g", estimate=1.0, run=lambda: None, timer=timer, retries=2)
    assert (r.verdict, calls[0]) == (expected, n_tries)
    if expected == "fail":
        assert "the estimate" in r.note and "3x allows" in r.note


def test_the_3x_check_skips_what_cannot_run() -> None:
    from rlx_core.costmodel_check import check, main

    assert check("x:0", "g", estimate=None, run=None, timer=lambda fn: Timing(1.0, (1.0,))).verdict == "skip"
    assert main(["cortexm", "--batch", "4"]) == 0  # cannot run the demo: skipped, not failed
