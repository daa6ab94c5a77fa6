"""``rlx launch -n N -- COMMAND``: N ranks through Open MPI's ``mpirun``, and the per-rank wrapper.

Every rank runs :func:`rank_main`, which runs an ``rlx`` command (``rlx launch -n 2 -- embed ...``),
a Python script (``-- script.py args`` / ``-- python script.py``) or a module (``-- -m pkg``), and
makes failures clear on every rank:

* an exception on a rank is printed with ``[rank r/N]`` and the whole launch is aborted
  (``MPI_Abort``), so the other ranks do not wait for it forever;
* a rank stopped by mpirun because another rank died prints why before it exits;
* a collective that waits longer than ``RLX_COLLECTIVE_TIMEOUT`` raises on the waiting rank
  (naming it and the collective), which then aborts the launch the same way.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from ..errors import RLXError
from .mpirun import LaunchError, child_env, mpirun_argv  # noqa: F401  (re-exported)


def _prefix() -> str:
    from .runtime import launched_rank, launched_size

    return f"[rank {launched_rank()}/{launched_size()}]"


def _on_term(signum: int, frame: Any) -> None:
    sys.stderr.write(f"{_prefix()} stopped (signal {signum}): another rank failed or the launch was "
                     f"interrupted; see that rank's error above\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def _abort(code: int) -> None:
    """End every rank: this one failed, so a peer waiting in a collective would wait for nothing."""
    if "mpi4py" in sys.modules:
        try:
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(code)
        except Exception:  # already finalized or broken: exit anyway, mpirun notices
            pass
    os._exit(code)


def rank_main(argv: Sequence[str]) -> int:
    """Run one rank's command (see the module docstring); never returns on failure."""
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        sys.stderr.write(f"{_prefix()} nothing to run\n")
        return 2
    if os.path.basename(args[0]).startswith("python") and len(args) > 1:
        args = args[1:]
    try:
        if args[0] == "-m" and len(args) > 1:
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0].endswith(".py"):
            sys.argv = list(args)
            sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
            runpy.run_path(args[0], run_name="__main__")
        else:
            from ..cli import main

            if args[0] == "rlx":
                args = args[1:]
            sys.argv = ["rlx", *args]
            main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            sys.stderr.write(f"{_prefix()} exited with status {code}; aborting the other ranks\n")
            sys.stderr.flush()
            _abort(code)
        return 0
    except BaseException as e:
        detail = str(e) if isinstance(e, RLXError) else "".join(traceback.format_exception(e))
        sys.stderr.write(f"{_prefix()} error: {type(e).__name__}: {detail}\n"
                         f"{_prefix()} aborting the other ranks\n")
        sys.stderr.flush()
        _abort(1)
    return 0


@click.command("launch", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                           "help_option_names": ["-h", "--help"]})
@click.option("-n", "--ranks", "n", type=int, required=True, help="number of ranks (processes)")
@click.option("--hostfile", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Open MPI hostfile, to spread ranks over several machines")
@click.option("--threads", type=int, default=None, help="compute threads per rank (default 1)")
@click.option("--mpirun-arg", "mpirun_args", multiple=True, help="extra argument for mpirun (repeatable)")
@click.option("--dry-run", is_flag=True, help="print the mpirun command line and exit")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def launch_command(n: int, hostfile: str | None, threads: int | None, mpirun_args: tuple[str, ...],
                   dry_run: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND on N ranks through Open MPI: an rlx command (`rlx launch -n 2 -- embed "hi"
    --tensor-parallel 2`), a Python script (`-- train.py`) or a module (`-- -m pkg.mod`)."""
    import subprocess

    argv = mpirun_argv(n, command, hostfile=hostfile, extra=mpirun_args)
    if dry_run:
        click.echo(" ".join(argv))
        return
    proc = subprocess.run(argv, env=child_env(threads), check=False)
    if proc.returncode:
        raise click.exceptions.Exit(proc.returncode)


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1:]))
