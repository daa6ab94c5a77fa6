"""Timing that notices a busy machine: best of several rounds, their spread, other processes' load.

A run can only be slowed by noise (another process on the cores, a frequency dip), never sped up,
so the best of many runs is the estimate of what the device does; the spread between rounds and
the share of the machine other processes used while timing say whether even the best is suspect.
Used by ``rlx calibrate`` and by the cost-model check of rlx-conformance. Standard library only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: A round's best this much above the best round (relative) means the rounds disagree.
SPREAD_LIMIT = 0.5
#: Other processes using this share of all CPUs (0..1) while timing means the machine was busy.
LOAD_LIMIT = 0.25


def _proc_stat() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine, or None where /proc/stat is missing."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    # guest time is already counted in user/nice: only the first 8 fields add up to the total
    total = sum(fields[:8])
    return total - idle, total


def _self_jiffies() -> int | None:
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # comm (field 2) may hold spaces: fields are counted after its closing parenthesis
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[11]) + int(rest[12])  # utime + stime, this process's threads included


def _throttled_usec() -> int | None:
    """Microseconds this cgroup was throttled by its CPU quota (cgroup v2), None where unknown."""
    try:
        with open("/sys/fs/cgroup/cpu.stat", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "throttled_usec":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


class LoadMeter:
    """Share of the machine's CPU time other processes used between start() and stop() (Linux),
    steal time of a VM included; a container's CPU-quota throttling counts as such a share too."""

    def __init__(self) -> None:
        self._start: tuple[tuple[int, int], int] | None = None
        self._throttle: tuple[int, float] | None = None

    def start(self) -> None:
        m, s = _proc_stat(), _self_jiffies()
        self._start = (m, s) if m is not None and s is not None else None
        t = _throttled_usec()
        self._throttle = None if t is None else (t, time.monotonic())

    def stop(self) -> float | None:
        """None where it cannot be told (no /proc, too short a window to count)."""
        throttled = None
        t = _throttled_usec()
        if self._throttle is not None and t is not None:
            wall = time.monotonic() - self._throttle[1]
            throttled = min(1.0, (t - self._throttle[0]) / 1e6 / wall) if wall > 0 else None
        if self._start is None:
            return throttled
        m, s = _proc_stat(), _self_jiffies()
        if m is None or s is None:
            return throttled
        (busy0, total0), self0 = self._start
        total = m[1] - total0
        if total <= 0:
            return throttled
        other = max(0.0, min(1.0, ((m[0] - busy0) - (s - self0)) / total))
        return other if throttled is None else max(other, throttled)


@dataclass(frozen=True)
class Timing:
    """Seconds per call: ``rounds`` holds each round's best; ``best`` the best of all."""

    best: float
    rounds: tuple[float, ...]
    #: share of all CPUs other processes used while timing (0..1), None where not measurable
    other_load: float | None = None

    @property
    def spread(self) -> float:
        """How far the median round's best is above the best round, relative to the best."""
        return statistics.median(self.rounds) / self.best - 1.0 if self.best > 0 else 0.0

    @property
    def contended(self) -> bool:
        return self.spread > SPREAD_LIMIT or (self.other_load is not None and self.other_load > LOAD_LIMIT)

    def describe(self) -> str:
        load = "" if self.other_load is None else f", other processes used {self.other_load:.0%} of the CPUs"
        return f"best of {len(self.rounds)} rounds, rounds spread {self.spread:.0%}{load}"

    def to_json(self) -> dict[str, Any]:
        return {"best": self.best, "rounds": list(self.rounds), "spread": self.spread,
                "other_load": self.other_load, "contended": self.contended}


def time_best(fn: Callable[[], Any], *, rounds: int = 3, min_time: float = 0.1, min_reps: int = 3,
              clock: Callable[[], float] = time.perf_counter,
              meter: Callable[[], LoadMeter] | None = None) -> Timing:
    """Warm up once, then ``rounds`` rounds of at least ``min_reps`` calls and ``min_time`` seconds
    each; every round keeps its fastest call. ``clock`` and ``meter`` are for tests."""
    fn()  # warm up: first-run specialisation, caches, JIT
    load = (meter or LoadMeter)()
    load.start()
    bests: list[float] = []
    for _ in range(max(1, rounds)):
        best, total, reps = float("inf"), 0.0, 0
        while total < min_time or reps < min_reps:
            t0 = clock()
            fn()
            dt = clock() - t0
            best, total, reps = min(best, dt), total + dt, reps + 1
        bests.append(best)
    return Timing(min(bests), tuple(bests), load.stop())
