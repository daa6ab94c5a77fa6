"""The Python API on a mesh, and the glue the CLI options use.

``DistributedSession(device, mesh)`` compiles a graph into this rank's program: the tensor-parallel
part over the rank's ``tp`` group (:func:`~rlx_core.distributed.sharding.tensor_parallel`), or a
pipeline stage when ``cuts`` are given. ``Session(device, mesh=...)`` forwards its ``compile`` here.

``relaunch(n)`` is what ``rlx embed --tensor-parallel N`` / ``rlx bench train-mlp --data-parallel N``
call first: outside a launch of N ranks it re-runs the same command line under ``rlx launch -n N``
and exits with its status; inside one it returns this rank's index.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import IRError
from ..ir.graph import Graph
from .mesh import Mesh
from .runtime import launched_rank, launched_size

if TYPE_CHECKING:
    from ..placement import MultiDeviceExecutable
    from ..runtime import Executable, Session


class DistributedSession:
    """Compiles graphs into this rank's program of ``mesh`` (default: every rank tensor-parallel).

    ``session``: the single-process :class:`~rlx_core.runtime.Session` that compiles the per-rank
    programs (default: ``Session(device, **session_kw)``)."""

    def __init__(self, device: str | Sequence[str] | None = "cpu", mesh: Mesh | None = None, *,
                 session: Session | None = None, **session_kw: Any) -> None:
        from ..runtime import Session
        from .runtime import world

        w = world()
        self.mesh = mesh if mesh is not None else Mesh(tp=w.size)
        if self.mesh.size != w.size:
            raise IRError(f"mesh {self.mesh} has {self.mesh.size} ranks but the launch has {w.size}",
                          fix=f"start it with `rlx launch -n {self.mesh.size}`, or pass a mesh of {w.size}")
        self.rank = w.rank
        self.coords = self.mesh.coords(w.rank)
        self.session = session if session is not None else Session(device, **session_kw)

    def program(self, graph: Graph, *, plan: Mapping[str, Any] | None = None,
                cuts: Sequence[str] | None = None) -> Graph:
        from .sharding import pipeline_stages, tensor_parallel

        g = graph
        if self.mesh.pp > 1 and not cuts:
            raise IRError(f"the mesh {self.mesh} has {self.mesh.pp} pipeline stages but no cuts were given",
                          where=f"graph {graph.name!r}",
                          fix=f"pass cuts=[...] ({self.mesh.pp - 1} values ending the stages) to "
                              "DistributedSession.compile, or use a mesh with pp=1")
        if cuts:
            pp_group = self.mesh.group("pp", self.rank)
            if len(cuts) + 1 != self.mesh.pp:
                raise IRError(f"{len(cuts)} cuts make {len(cuts) + 1} stages, the mesh has pp={self.mesh.pp}",
                              fix="give pp - 1 cut values")
            g = pipeline_stages(g, cuts, ranks=pp_group)[self.coords["pp"]]
        if self.mesh.tp > 1:
            g = tensor_parallel(g, self.mesh.tp, self.coords["tp"], plan,
                                group=self.mesh.group("tp", self.rank))
        return g

    def compile(self, graph: Graph, *, plan: Mapping[str, Any] | None = None,
                cuts: Sequence[str] | None = None, carry: Mapping[str, str] | None = None
                ) -> Executable | MultiDeviceExecutable:
        return self.session.compile(self.program(graph, plan=plan, cuts=cuts), carry=carry)


def relaunch(n: int, argv: Sequence[str] | None = None, *, command: str | None = None) -> int:
    """This rank's index inside a launch of ``n`` ranks; outside one, re-run ``argv`` (default: this
    command line) under ``rlx launch -n n`` and exit with its status.

    ``command``: the rlx subcommand asking (``"embed"``); the default command line must name it,
    so a command called from Python (not from a shell) is refused instead of re-running whatever
    program the process is."""
    if n < 1:
        raise IRError(f"{n} ranks: the count must be >= 1", fix="pass 1 or more")
    from .mpirun import LaunchError, child_env, mpirun_argv

    size = launched_size()
    if size == n:
        from .runtime import world

        return world().rank
    if size > 1:  # already one of a launch's ranks: starting mpirun again from every rank would nest
        raise LaunchError(f"the command asks for {n} ranks but runs inside a launch of {size}",
                      where=f"rank {launched_rank()} of {size}",
                      fix=f"start it with `rlx launch -n {n}`, or without rlx launch (it starts the "
                          f"{n} ranks itself)")
    if n == 1:
        return 0
    args = list(sys.argv[1:] if argv is None else argv)
    rlx_argv0 = sys.argv[0].endswith(("rlx", "rlx.exe", os.path.join("rlx_core", "__main__.py")))
    if argv is None and command is not None and (command not in args or not rlx_argv0):
        raise LaunchError(f"`rlx {command}` cannot start its {n} ranks: this process was not started by "
                      f"the command line `rlx {command} ...` ({' '.join(sys.argv[:3])} ...)",
                      fix=f"run `rlx {command} ...` from a shell, or run it under `rlx launch -n {n} -- "
                          f"{command} ...`")
    proc = subprocess.run(mpirun_argv(n, args), env=child_env(), check=False)
    raise SystemExit(proc.returncode)


def install_tensor_parallel(model: Any, device: str = "cpu") -> Any:
    """Make ``model`` (a :class:`~rlx_core.models.minilm.MiniLM`) run this rank's tensor-parallel
    program on ``device`` (every rank of the launch in one tensor-parallel group); its
    ``embed(..., device=device)`` then returns the whole embeddings on every rank."""
    exe = DistributedSession(device, use_cache=getattr(model, "use_cache", None)).compile(model.graph)
    with model._lock:
        model._executables[device] = exe
    return exe


__all__ = ["DistributedSession", "install_tensor_parallel", "relaunch"]
