"""How ``rlx launch`` starts ranks: the ``mpirun`` command line and the ranks' environment.

Separate from :mod:`rlx_core.distributed.launch` (whose per-rank wrapper runs ``rlx`` commands and so
imports the CLI): a :class:`~rlx_core.runtime.Session` with a mesh relaunches through this module and
must not import the CLI back.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import RLXError


class LaunchError(RLXError):
    """``rlx launch`` cannot start the ranks."""


def mpirun_argv(n: int, command: Sequence[str], *, hostfile: str | None = None,
                mpirun: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The ``mpirun`` command line starting ``command`` (a list) on ``n`` ranks through :func:`rank_main`."""
    if n < 1:
        raise LaunchError(f"-n {n}: the number of ranks must be >= 1", fix="pass -n 2 (or more)")
    exe = mpirun or shutil.which("mpirun") or shutil.which("mpiexec")
    if exe is None:
        raise LaunchError("mpirun was not found on PATH",
                          fix="install Open MPI (apt-get install openmpi-bin libopenmpi-dev) and mpi4py")
    argv = [exe, "-n", str(n)]
    if hostfile is None:
        # one host: more ranks than cores is allowed (a 2-core CI machine runs 4 ranks), and ranks
        # are not pinned, so two launches on one host do not fight over the same cores
        argv += ["--oversubscribe", "--bind-to", "none",
                 # a waiting rank yields its core: ranks share the host's cores (with each other and
                 # whatever else runs), and a busy-polling rank would starve the peer it waits for
                 "--mca", "mpi_yield_when_idle", "1",
                 # shared memory and TCP only: no probing of absent fabrics (and its warnings)
                 "--mca", "btl", "self,vader,tcp", "--mca", "pml", "ob1"]
    else:  # several machines: Open MPI picks the fabric (UCX / RDMA where the hosts have it)
        argv += ["--hostfile", hostfile]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += list(extra)
    return [*argv, sys.executable, "-m", "rlx_core.distributed.launch", *command]


def child_env(threads: int | None = None) -> dict[str, str]:
    """The ranks' environment: one compute thread per rank unless told otherwise (N ranks on a host
    share its cores; each rank spawning a thread per core would oversubscribe it N times)."""
    env = dict(os.environ)
    env.setdefault("RLX_CPU_THREADS", "1" if threads is None else str(threads))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env.setdefault(var, env["RLX_CPU_THREADS"])
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    if not _isatty(sys.stdout):
        # mpirun gives each local rank a pseudo-terminal for stdout: without this, rich would print
        # colours and wrap at 80 columns into a pipe or file the launch's own stdout goes to
        env.setdefault("TTY_COMPATIBLE", "0")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def _isatty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return callable(isatty) and bool(isatty())
    except ValueError:  # closed
        return False


