"""The process group a rank's kernels talk through: Open MPI via mpi4py (imported on first use).

Backends do not open communicators themselves: a collective kernel asks :func:`world` for the
process group and :meth:`World.comm` for the communicator of its ``group`` attribute, and waits on
a blocking MPI call through :meth:`World.call` (a watchdog thread aborts the launch, naming the rank and
the collective, past ``RLX_COLLECTIVE_TIMEOUT``) or waits on a request with :meth:`World.wait`
(which raises :class:`CollectiveError` instead), so that no rank waits forever.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..errors import CollectiveError
from ..settings import COLLECTIVE_TIMEOUT as TIMEOUT


class World:
    """One process's view of the launch: ``rank``, ``size`` and communicators per group."""

    def __init__(self) -> None:
        try:
            from mpi4py import MPI
        except ImportError as e:  # reported where a collective needs it
            raise CollectiveError(f"collectives on the host need mpi4py ({e})",
                                  fix="pip install mpi4py (with Open MPI: apt-get install openmpi-bin "
                                      "libopenmpi-dev) and start the ranks with `rlx launch -n N`") from None
        self.MPI = MPI
        self.base = MPI.COMM_WORLD
        self.rank: int = self.base.Get_rank()
        self.size: int = self.base.Get_size()
        self._comms: dict[tuple[int, ...], Any] = {}
        self._lock = threading.Lock()
        self._watched: tuple[str, str, float] | None = None
        self._watchdog: threading.Thread | None = None
        self._limit = float(TIMEOUT.get())  # read once: a collective's fast path does no parsing

    def describe(self) -> str:
        return f"rank {self.rank} of {self.size} (pid {os.getpid()})"

    def comm(self, group: Sequence[int], world: int, op: str) -> tuple[Any, int]:
        """The communicator of ``group`` (global ranks; empty: all of them) and this rank's index in it."""
        key = tuple(int(r) for r in group) or tuple(range(self.size))
        if len(key) != world or any(not 0 <= r < self.size for r in key):
            raise CollectiveError(f"{op} expects a group of {world} ranks {key}, but the launch has "
                                  f"{self.size} ranks", where=self.describe(),
                                  fix=f"start it with `rlx launch -n {max(world, max(key) + 1)}`, or build "
                                      f"the program for {self.size} ranks")
        if self.rank not in key:
            raise CollectiveError(f"{op} over group {key} runs on a rank outside the group",
                                  where=self.describe(), fix="give each rank the program of its own group")
        with self._lock:
            c = self._comms.get(key)
            if c is None:
                if key == tuple(range(self.size)):
                    c = self.base.Dup()
                else:  # collective over the group's members only (MPI-3)
                    c = self.base.Create_group(self.base.group.Incl(list(key)), tag=hash(key) & 0x7FFF)
                self._comms[key] = c
        return c, key.index(self.rank)

    def call(self, fn: Any, op: str, detail: str = "") -> Any:
        """Run the blocking MPI call ``fn()`` (MPI's own tuned algorithms, raw MPI speed) under the
        watchdog: past ``RLX_COLLECTIVE_TIMEOUT`` it prints which rank waited in which collective and
        aborts the launch, since a blocking MPI call cannot be interrupted by an exception."""
        self._watched = (op, detail, time.monotonic() + self._limit)
        if self._watchdog is None:
            self._start_watchdog()
        try:
            return fn()
        finally:
            self._watched = None

    def _start_watchdog(self) -> None:
        def watch() -> None:
            while True:
                w = self._watched
                if w is None:
                    time.sleep(0.2)
                    continue
                op, detail, deadline = w
                left = deadline - time.monotonic()
                if left > 0:
                    time.sleep(min(left, 0.2))
                    continue
                if self._watched is not w:
                    continue
                limit = self.timeout()
                err = CollectiveError(
                    f"{op} did not complete within {limit:g} s on rank {self.rank} of {self.size}"
                    + (f" ({detail})" if detail else "") + ": a peer rank is late, stuck or dead",
                    where=self.describe(),
                    fix="check the other ranks' errors above; every rank must run the same collectives "
                        "in the same order (raise RLX_COLLECTIVE_TIMEOUT for long steps)")
                sys.stderr.write(f"[rank {self.rank}/{self.size}] error: CollectiveError: {err}\n"
                                 f"[rank {self.rank}/{self.size}] aborting the other ranks\n")
                sys.stderr.flush()
                self.base.Abort(1)
                return
        self._watchdog = threading.Thread(target=watch, name="rlx-collective-watchdog", daemon=True)
        self._watchdog.start()

    def timeout(self) -> float:
        """``RLX_COLLECTIVE_TIMEOUT`` (read when the process group starts): seconds a collective
        may wait for its peers."""
        return self._limit

    def wait(self, req: Any, op: str, detail: str = "", timeout: float | None = None) -> None:
        """Wait for ``req`` to complete, polling so that a missing peer becomes an error, not a hang."""
        if req.Test():
            return
        limit = self.timeout() if timeout is None else timeout
        deadline = time.monotonic() + limit
        spins = 0
        # Spin on Test: Open MPI progresses non-blocking collectives only inside MPI calls, so a
        # sleeping rank would stall the transfer; yielding the core keeps an oversubscribed host
        # (more ranks than cores) moving, as mpi_yield_when_idle does for blocking calls.
        while not req.Test():
            spins += 1
            os.sched_yield()
            if spins & 255:
                continue
            if time.monotonic() > deadline:
                try:
                    req.Cancel()
                except Exception:  # a collective request cannot be cancelled; the rank aborts anyway
                    pass
                raise CollectiveError(
                    f"{op} did not complete within {limit:g} s on rank {self.rank} of {self.size}"
                    + (f" ({detail})" if detail else "")
                    + ": a peer rank is late, stuck or dead", where=self.describe(),
                    fix="check the other ranks' errors above; every rank must run the same collectives "
                        "in the same order (raise RLX_COLLECTIVE_TIMEOUT for long steps)")


_WORLD: World | None = None
_WLOCK = threading.Lock()


def world() -> World:
    """The process group of this launch (MPI is initialised on first call)."""
    global _WORLD
    with _WLOCK:
        if _WORLD is None:
            _WORLD = World()
        return _WORLD


def launched_size() -> int:
    """The number of ranks this process was started with (1 outside ``rlx launch``), without MPI."""
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
        v = os.environ.get(var)
        if v and v.isdigit():
            return int(v)
    return 1


def launched_rank() -> int:
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        v = os.environ.get(var)
        if v and v.isdigit():
            return int(v)
    return 0


__all__ = ["TIMEOUT", "CollectiveError", "World", "launched_rank", "launched_size", "world"]
