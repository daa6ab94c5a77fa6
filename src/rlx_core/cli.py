"""The ``rlx`` command line: ``rlx doctor``, ``rlx run``, ``rlx explain``, ``rlx demo`` ...

Layout of this module (to add a command, copy one section):

* the group (:class:`RLXGroup`): turns any :class:`~rlx_core.errors.RLXError` into a red
  what/where/fix block and exit code 1, keeps commands in definition order, and can list commands
  that live in other modules without importing them (:data:`LAZY_COMMANDS`);
* shared helpers: consoles, JSON output, ``NAME=VALUE`` parsing, model loading, array summaries;
* one section per command.

``rlx --help`` must stay fast: NumPy, rich, the IR and the hub are imported inside commands only.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from . import API_VERSION, __version__, settings
from .cliutil import (
    bind_option,
    check_bindings,
    device_option,
    echo_json,
    hub_instance,
    json_option,
    load_command_model,
    parse_bindings,
    parse_pairs,
    signature_option,
)
from .errors import BackendNotFoundError, InputError, PluginConflictError, PluginError, RLXError

if TYPE_CHECKING:
    import numpy as np
    from rich.console import Console

    from ._hub import Hub
    from .ir.graph import Graph
    from .report import DispatchReport

#: Exit codes shared by every command.
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
#: Exit code when the reader of stdout went away: 128 + SIGPIPE, what a shell reports for `cat`.
EXIT_BROKEN_PIPE = 141

#: Subcommands that live in other modules, imported only when invoked:
#: ``name -> ("package.module:command_object", "one-line help shown by rlx --help")``.
#: ``rlx conformance``, ``rlx embed``, ``rlx bench`` and ``rlx new-backend`` are meant to go here.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "conformance": ("rlx_conformance.cli:conformance", "Certify a backend with the conformance suite."),
    "new-backend": ("rlx_core.scaffold:new_backend", "Create a new backend plugin package."),
    "embed": ("rlx_core.models.minilm:embed_command", "Embed sentences with all-MiniLM-L6-v2."),
    "bench": ("rlx_core.train_bench:bench_group",
              "Benchmark RLX against ONNX Runtime, PyTorch and NumPy (infer, train-mlp, plot)."),
    "launch": ("rlx_core.distributed.launch:launch_command", "Run a command on N ranks (Open MPI)."),
    "export": ("rlx_core.export_cmd:export_command",
               "Export a model as a standalone artifact (targets come from plugins: rlx export -h)."),
    "plugins": ("rlx_core.plugins_cmd:plugins_command",
                "List the export targets and commands installed plugins add (rlx NAME-...)."),
    "quantize": ("rlx_core.quant.cli:quantize_command",
                 "Quantize a model: INT8 post-training (calibrated) or INT4 weight-only."),
    "keygen": ("rlx_core.sign_cmd:keygen_command", "Make an ed25519 key pair for signing models."),
    "sign": ("rlx_core.sign_cmd:sign_command",
             "Sign a model file (a detached ed25519 signature, MODEL.sig)."),
    "verify": ("rlx_core.sign_cmd:verify_command", "Check a model file's signature against a public key."),
}

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


# ---------------------------------------------------------------------------------------------
# The group: error rendering, command order, lazy commands


def _debug_enabled(ctx: click.Context | None) -> bool:
    try:
        if settings.DEBUG.get():
            return True
    except RLXError:  # reported as the command's error by the `cli` group callback
        pass
    while ctx is not None:
        if ctx.params.get("debug"):
            return True
        ctx = ctx.parent
    return False


class RLXGroup(click.Group):
    """A click group whose commands report :class:`RLXError` as what/where/fix, not a traceback.

    ``lazy_commands`` (``name -> ("module:attr", "short help")``) are listed in ``--help`` without
    being imported; the module is imported when the command is invoked.
    """

    def __init__(self, *args: Any, lazy_commands: dict[str, tuple[str, str]] | None = None,
                 plugin_commands: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands if lazy_commands is not None else {}
        self.plugin_commands = plugin_commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands) + [n for n in self.lazy_commands if n not in self.commands]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name not in self.lazy_commands and self.plugin_commands:
            # Not a core name: a plugin's command (hook rlx_cli_commands), found by its namespace,
            # so only the plugin(s) named by the command's prefix are imported.
            from .extensions import find_command

            try:
                return find_command(hub_instance(), cmd_name, frozenset(self.list_commands(ctx)))
            except RLXError as e:
                print_error(e)
                raise click.exceptions.Exit(EXIT_FAIL) from None
        if cmd is not None or cmd_name not in self.lazy_commands:
            return cmd
        target = self.lazy_commands[cmd_name][0]
        module, _, attr = target.partition(":")
        try:
            loaded = getattr(importlib.import_module(module), attr)
        except ImportError as e:
            from .install_hint import module_hint

            # The hint comes from rlx-core's extras (e.g. rlx-core[conformance]), not the module name.
            missing = e.name or module
            raise click.ClickException(f"`rlx {cmd_name}` needs the {missing.split('.')[0]!r} module ({e}); "
                                       f"{module_hint(missing)}") from None
        if not isinstance(loaded, click.Command):
            raise click.ClickException(f"{target} is not a click command")
        return loaded

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Like click's, but lazy commands show their registered help instead of being imported.
        rows: list[tuple[str, str]] = []
        width = formatter.width - 6 - max((len(n) for n in self.list_commands(ctx)), default=0)
        for name in self.list_commands(ctx):
            if name in self.commands:
                cmd = self.commands[name]
                if cmd.hidden:
                    continue
                rows.append((name, cmd.get_short_help_str(width)))
            else:
                rows.append((name, self.lazy_commands[name][1]))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except RLXError as e:
            if _debug_enabled(ctx):
                raise
            print_error(e)
            raise click.exceptions.Exit(EXIT_FAIL) from None
        except KeyboardInterrupt:
            if _debug_enabled(ctx):
                raise
            click.echo("interrupted", err=True)
            raise click.exceptions.Exit(130) from None
        except BrokenPipeError:
            # The reader left (`rlx ops | head`): stop quietly, like other Unix tools.
            _silence_stdout()
            raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None
        except Exception as e:
            if _debug_enabled(ctx):
                raise
            tb = traceback.extract_tb(e.__traceback__)
            where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else None
            print_error(RLXError(f"unexpected {type(e).__name__}: {e}", where=where,
                                 fix="this is a bug in RLX or in a plugin; run again with --debug (or "
                                     "RLX_DEBUG=1) for the full traceback and report it"),
                        title="internal error")
            raise click.exceptions.Exit(EXIT_FAIL) from None


def _silence_stdout() -> None:
    # Output still buffered would raise BrokenPipeError again when Python flushes it at exit.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout already closed or not a real file: nothing to flush
        pass


def print_error(e: RLXError, *, title: str | None = None) -> None:
    """The red what/where/fix block, on stderr."""
    from rich.markup import escape
    from rich.panel import Panel
    from rich.text import Text

    body = Text()
    body.append(e.what, style="bold")
    if e.where:
        body.append("\nwhere: ", style="red")
        body.append(e.where)
    if e.fix:
        body.append("\nfix:   ", style="green")
        body.append(e.fix)
    name = title or f"error: {type(e).__name__}"
    console(stderr=True).print(Panel(body, title=f"[bold red]{escape(name)}[/]", title_align="left",
                                     border_style="red", expand=False))


@click.group(cls=RLXGroup, lazy_commands=LAZY_COMMANDS, plugin_commands=True,
             context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="rlx",
                      message=f"%(prog)s %(version)s (plugin API {API_VERSION})")
@click.option("--debug", is_flag=True, help="Show Python tracebacks (same as RLX_DEBUG=1).")
def cli(debug: bool) -> None:
    """RLX: one tensor IR, many backends.

    Check your installation with `rlx doctor`, see it work with `rlx demo`, then run or explain
    your own .rlx models.

    \b
    Examples:
      rlx doctor
      rlx demo --device cpu
      rlx run model.rlx --input x=x.npy
      rlx explain model.rlx --device cuda,cpu
    """
    # A bad RLX_DEBUG is an error, not a silent "off"; `rlx doctor` still runs to report it.
    if click.get_current_context().invoked_subcommand != "doctor":
        settings.DEBUG.get()


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (``rlx = "rlx_core.cli:main"``)."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="rlx")


# ---------------------------------------------------------------------------------------------
# Shared helpers


def console(*, stderr: bool = False) -> Console:
    from rich.console import Console

    c = Console(stderr=stderr, highlight=False)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c.width = 120  # piped or captured: do not wrap at rich's default of 80 columns
    # rich would exit 1 itself; raising lets RLXGroup.invoke stop every command the same way.
    setattr(c, "on_broken_pipe", _raise_broken_pipe)  # noqa: B010 - mypy refuses assigning a method
    return c


def _raise_broken_pipe() -> None:
    raise BrokenPipeError


def fmt_rate(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"


def array_stats(a: np.ndarray) -> dict[str, Any]:
    """Summary numbers for one array (finite values only for min/max/mean/std)."""
    import numpy as np

    stats: dict[str, Any] = {}
    if a.size == 0:
        return stats
    kind = a.dtype.kind
    if kind == "b":
        stats["true"] = int(np.count_nonzero(a))
        stats["false"] = int(a.size - stats["true"])
        return stats
    if kind == "c":
        mag = np.abs(a.astype(np.complex128))
        stats["abs_max"] = float(mag.max())
        stats["abs_mean"] = float(mag.mean())
        return stats
    f = a.astype(np.float64)
    finite = np.isfinite(f)
    if not finite.all():
        stats["nan"] = int(np.isnan(f).sum())
        stats["inf"] = int(np.isinf(f).sum())
    if finite.any():
        v = f[finite]
        stats.update(min=float(v.min()), max=float(v.max()), mean=float(v.mean()), std=float(v.std()))
    return stats


def array_preview(a: np.ndarray, n: int = 8) -> list[Any]:
    import numpy as np

    flat = a.reshape(-1)[:n]
    if a.dtype.kind == "c":
        return [[float(z.real), float(z.imag)] for z in flat.astype(np.complex128)]
    if a.dtype.kind == "b":
        return [bool(v) for v in flat]
    if a.dtype.kind in "iu":
        return [int(v) for v in flat]
    return [float(v) for v in flat.astype(np.float64)]


def array_text(a: np.ndarray) -> str:
    import numpy as np

    if a.dtype.kind == "f" or a.dtype.kind == "V" or str(a.dtype) == "bfloat16":
        a = a.astype(np.float64) if a.dtype != np.float64 else a
    return np.array2string(a, threshold=12, edgeitems=3, precision=4, max_line_width=96)


def fmt_stats(stats: Mapping[str, Any]) -> str:
    return "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items())


def safe_filename(name: str) -> str:
    """``name`` as one plain file name: ASCII letters, digits, ``._-`` (nothing else, so no path
    separator), no leading dot (no hidden or ``..`` entries), at most 100 characters."""
    s = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in name)
    s = "_" * (len(s) - len(s.lstrip("."))) + s.lstrip(".")
    return s[:_MAX_STEM] or "output"


_MAX_STEM = 100


def output_filenames(names: Sequence[str]) -> dict[str, str]:
    """A distinct ``STEM.npy`` file name for each output name (``rlx run -o``), never a path.

    Names that clean to the same file name (``a/b`` and ``a_b``; ``Y`` and ``y`` on a case-insensitive
    file system), or were cut short, would overwrite each other: a name that needed no cleaning keeps
    the plain file name (of ``Y`` and ``y``, the first in sorted order) and the others get ``-`` and 10
    hex digits of the SHA-256 of their full name, so the same outputs always get the same files."""
    import hashlib
    from collections import Counter

    stems = {n: safe_filename(n) for n in names}
    shared = Counter(stem.casefold() for stem in stems.values())
    used: set[str] = set()
    out: dict[str, str] = {}
    # Names that need no cleaning claim their plain file names first; sorted, so the files do not
    # depend on the outputs' order.
    for n in sorted(n for n in names if stems[n] == n) + sorted(n for n in names if stems[n] != n):
        stem = stems[n]
        if (stem != n and (shared[stem.casefold()] > 1 or len(n) > _MAX_STEM)) or stem.casefold() in used:
            digest = hashlib.sha256(n.encode("utf-8", "surrogatepass")).hexdigest()[:10]
            stem = f"{stem[:_MAX_STEM - 11]}-{digest}"
        k, base = 2, stem
        while stem.casefold() in used:  # a name crafted to equal another's suffixed stem
            stem, k = f"{base}-{k}", k + 1
        used.add(stem.casefold())
        out[n] = f"{stem}.npy"
    return {n: out[n] for n in names}


def _save_output(folder: Path, filename: str, name: str, arr: Any) -> Path:
    """Write one output inside ``folder``; a symbolic link planted at the file name is not followed."""
    import numpy as np

    path = folder / filename
    separators = [c for c in (os.sep, os.altsep) if c]
    if path.parent != folder or filename in (".", "..") or any(c in filename for c in separators):
        raise RLXError(f"output {name!r} maps to {filename!r}, which is not a plain file name",
                       where="--output-dir", fix="this is a bug in RLX; report it with the output names")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        raise RLXError(f"cannot write output {name!r} to {path}: {e.strerror or e}", where="--output-dir",
                       fix="choose a writable folder (a symbolic link at an output's file name is never "
                           "followed; remove it)") from None
    with os.fdopen(fd, "wb") as f:
        np.save(f, arr)
    return path


# ---------------------------------------------------------------------------------------------
# rlx doctor

SMOKE_DESC = "x + 1 on f32[4]"


def _smoke_graph() -> Graph:
    import numpy as np

    from .ir.builder import GraphBuilder

    # One same-shape add and nothing else (no broadcast, no rename), so a minimal backend can pass.
    g = GraphBuilder("rlx_doctor_smoke")
    x = g.input("x", "f32", (4,))
    g.output(g.op("add", x, g.param("one", np.ones(4, np.float32)), name="y"))
    return g.build()


def _failure_kind(e: BaseException) -> str:
    if isinstance(e, PluginConflictError):
        return "conflicting distributions"
    if isinstance(e, BackendNotFoundError):
        return "not available"
    if isinstance(e, RLXError):
        what = e.what
        for needle, kind in (("did not finish in", "import timeout"), ("failed to import", "import error"),
                             ("targets RLX plugin API", "API mismatch"), ("raised in hook", "hook raised")):
            if needle in what:
                return kind
        return "invalid plugin" if isinstance(e, PluginError) else type(e).__name__
    return f"raised {type(e).__name__}"


def _error_json(e: BaseException) -> dict[str, Any]:
    if isinstance(e, RLXError):
        return {"type": type(e).__name__, "kind": _failure_kind(e), "what": e.what, "where": e.where,
                "fix": e.fix}
    return {"type": type(e).__name__, "kind": _failure_kind(e), "what": f"{type(e).__name__}: {e}",
            "where": None, "fix": "this is a bug in the plugin; report it to its authors"}


def _smoke_test(h: Hub, backend: str, index: int) -> dict[str, Any]:
    """Compile and run x + 1 on one device, without the compile cache."""
    import numpy as np

    from .runtime import Session

    x = np.array([0.0, 1.5, -2.0, 1e3], np.float32)
    try:
        sess = Session(f"{backend}:{index}", hub=h, use_cache=False)
        t0 = time.perf_counter()
        out = sess.compile(_smoke_graph()).run({"x": x})
        seconds = time.perf_counter() - t0
    except (Exception, SystemExit) as e:  # a plugin's code may raise anything, even exit
        return {"status": "FAIL", "reason": str(e.what if isinstance(e, RLXError) else e),
                "error": _error_json(e)}
    y = out.get("y")
    if y is None or np.shape(y) != (4,) or not np.allclose(np.asarray(y, np.float64), x + 1.0, rtol=0,
                                                             atol=1e-6):
        got = None if y is None else np.asarray(y).tolist()
        return {"status": "FAIL", "reason": f"wrong result for {SMOKE_DESC}: got {got}, expected "
                                            f"{(x + 1.0).tolist()}",
                "error": {"type": "WrongResult", "kind": "wrong result", "what": "wrong result",
                          "where": f"backend {backend!r}", "fix": "this is a bug in the plugin"}}
    return {"status": "PASS", "reason": f"{SMOKE_DESC} compiled and ran correctly", "seconds": seconds}


def _check_backend(h: Hub, name: str) -> dict[str, Any]:
    entries = h.entries().get(name, [])
    rec: dict[str, Any] = {
        "name": name, "status": "FAIL", "kind": None, "reason": "", "error": None,
        "distributions": [{"name": e.distribution, "version": e.dist_version, "entry_point": e.value}
                          for e in entries],
        "backend_version": None, "api_version": None, "description": None, "devices": [],
        "exporters": [], "commands": [],
    }
    try:
        backend = h.load(name)
        rec.update(backend_version=backend.info.version, api_version=backend.info.api_version,
                   description=backend.info.description)
        devices = backend.devices()
    except RLXError as e:
        rec.update(kind=_failure_kind(e), reason=e.what, error=_error_json(e))
        return rec
    from .extensions import doctor_check

    # What the plugin adds to the command line: a hook that fails here would break `rlx export`
    # or `rlx NAME-...` later, so it fails the plugin now, with its cause.
    extensions, problem = doctor_check(backend, frozenset(cli.list_commands(click.Context(cli))))
    rec.update(extensions)
    for i, d in enumerate(devices):
        drec: dict[str, Any] = {"name": d.name, "index": i, "available": d.available, "reason": d.reason,
                                "caps_source": d.caps.source, "host_memory": d.host_memory,
                                "details": dict(d.details), "check": None}
        if d.available:
            drec["check"] = _smoke_test(h, name, i)
        rec["devices"].append(drec)
    checked = [d for d in rec["devices"] if d["check"] is not None]
    failed = [d for d in checked if d["check"]["status"] != "PASS"]
    if not checked:
        why = "; ".join(f"{d['name']}: {d['reason']}" for d in rec["devices"]) or "it reports no devices"
        # Installed for hardware this machine lacks is not a broken plugin: SKIP, with the reason.
        rec.update(status="SKIP", kind="no available device", reason=f"no available device ({why})")
    elif failed:
        first = failed[0]["check"]
        rec.update(kind=first["error"]["kind"], reason=f"{failed[0]['name']}: {first['reason']}",
                   error=first["error"])
    else:
        rec.update(status="PASS", reason=f"{SMOKE_DESC} ran correctly on "
                                         f"{', '.join(d['name'] for d in checked)}")
    if problem is not None and rec["status"] != "FAIL":
        rec.update(status="FAIL", kind=_failure_kind(problem), reason=problem.what,
                   error=_error_json(problem))
    return rec


def doctor_report(h: Hub) -> dict[str, Any]:
    """Everything `rlx doctor` prints, as data."""
    import platform

    env_keys = [s.name for s in settings.all_settings() if s.owner == settings.CORE]
    try:
        import numpy as np

        np_version: str | None = np.__version__
    except ImportError:  # pragma: no cover - numpy is a dependency
        np_version = None
    from .cache import default_cache_dir

    core = {"version": __version__, "api_version": API_VERSION, "python": platform.python_version(),
            "numpy": np_version, "platform": f"{platform.system()} {platform.machine()}",
            "cache_dir": str(default_cache_dir()),
            "env": {k: os.environ[k] for k in env_keys if k in os.environ}}
    entries = h.entries()
    names = h.names()
    order = list(names) + sorted(n for n in h.failures() if n not in names)
    backends = [_check_backend(h, n) for n in order]
    # What `rlx run` without --device would use, or why nothing: a broken default is never replaced.
    default: dict[str, Any] = {"backend": None, "error": None}
    if entries:
        try:
            default["backend"] = h.default_backend()
        except RLXError as e:
            default["error"] = _error_json(e)
    core["default_device"] = default
    disabled = set(settings.DISABLE_PLUGINS.get(h.env) or [])
    for n in sorted(set(entries) - set(order)):
        eps = entries[n]
        why = ("disabled by RLX_DISABLE_PLUGINS" if n in disabled
               else "not listed in RLX_BACKENDS")
        backends.append({"name": n, "status": "SKIP", "kind": "skipped", "reason": why, "error": None,
                         "distributions": [{"name": x.distribution, "version": x.dist_version,
                                            "entry_point": x.value} for x in eps],
                         "backend_version": None, "api_version": None, "description": None, "devices": []})
    counts = {s: sum(1 for b in backends if b["status"] == s) for s in ("PASS", "FAIL", "SKIP")}
    # Installed but nothing usable (every backend skipped: no device, or none selected) is not a
    # healthy installation: a script checking `rlx doctor` must not go on to fail at its first run.
    code = (EXIT_FAIL if counts["FAIL"] else EXIT_USAGE if not counts["PASS"] else EXIT_OK)
    return {"core": core, "backends": backends,
            "summary": {"passed": counts["PASS"], "failed": counts["FAIL"], "skipped": counts["SKIP"],
                        "installed": len(entries)},
            "exit_code": code}


def _print_doctor(rep: Mapping[str, Any]) -> None:
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    out = console()
    core = rep["core"]
    out.print(Text("RLX doctor", style="bold"))
    out.print(Text(f"  rlx-core {core['version']} (plugin API {core['api_version']}) · Python "
                   f"{core['python']} · NumPy {core['numpy']} · {core['platform']}"))
    out.print(Text(f"  cache: {core['cache_dir']}"))
    for k, v in core["env"].items():
        out.print(Text(f"  {k}={v}"))
    default = core.get("default_device") or {}
    if default.get("backend"):
        out.print(Text(f"  default device: {default['backend']}"))
    elif default.get("error"):
        line = Text("  default device: none: ", style="bold red")
        line.append(default["error"]["what"], style="default")
        out.print(line)
    out.print()
    style = {"PASS": "bold green", "FAIL": "bold red", "SKIP": "yellow"}
    for b in rep["backends"]:
        line = Text("  ")
        line.append(f"{b['status']:<4}", style=style[b["status"]])
        line.append(f"  {b['name']}", style="bold")
        dists = ", ".join(f"{d['name']} {d['version']}" for d in b["distributions"]) or "not installed"
        line.append(f"  ({dists}")
        if b["backend_version"]:
            line.append(f"; backend {b['backend_version']}, API {b['api_version']}")
        line.append(")")
        if b["description"]:
            line.append(f"  {b['description']}", style="dim")
        out.print(line)
        adds = [f"{what}: {', '.join(b.get(key) or [])}" for what, key in
                (("export targets", "exporters"), ("commands", "commands")) if b.get(key)]
        if adds:
            out.print(Text(f"        {'; '.join(adds)}", style="dim"))
        if b["devices"]:
            t = Table(box=None, padding=(0, 2), show_edge=False, pad_edge=False)
            for col in ("device", "available", "caps", "check"):
                t.add_column(col, style="dim" if col == "caps" else None)
            for d in b["devices"]:
                avail = Text("yes", style="green") if d["available"] else Text(f"no: {d['reason']}",
                                                                                 style="yellow")
                chk = d["check"]
                check = (Text("-") if chk is None else
                         Text(chk["status"] if chk["status"] == "PASS" else f"FAIL: {chk['reason']}",
                              style=style[chk["status"]].replace("bold ", "")))
                t.add_row(Text(d["name"]), avail, Text(d["caps_source"]), check)
            out.print(Padding(t, (0, 0, 0, 8), expand=False))
        if b["status"] == "FAIL":
            msg = Text("        ")
            msg.append(f"{b['kind']}: ", style="red")
            msg.append(b["reason"])
            out.print(msg)
            err = b.get("error") or {}
            if err.get("where"):
                out.print(Text(f"        where: {err['where']}"))
            if err.get("fix"):
                fix = Text("        fix: ", style="green")
                fix.append(err["fix"], style="default")
                out.print(fix)
        elif b["status"] == "SKIP":
            out.print(Text(f"        {b['reason']}", style="yellow"))
    s = rep["summary"]
    out.print()
    if s["installed"] == 0:
        if rep["core"]["env"].get("RLX_DISABLE_PLUGINS", "").strip() == "all":
            none = "All backend plugins are disabled by RLX_DISABLE_PLUGINS=all."
        else:
            from .install_hint import default_backend_hint

            none = f"No backend plugins are installed. Install one: {default_backend_hint()}"
        out.print(Text(none, style="bold red"))
    elif not s["passed"] and not s["failed"]:
        from .install_hint import default_backend_hint

        out.print(Text("No usable backend: every installed backend was skipped (reasons above). Select "
                       "one that has a device here (RLX_BACKENDS), or install one: "
                       f"{default_backend_hint()}", style="bold red"))
    else:
        tail = f", {s['skipped']} skipped" if s["skipped"] else ""
        out.print(Text(f"{s['passed']} passed, {s['failed']} failed{tail}",
                       style="bold red" if s["failed"] else "bold green"))


def settings_report(h: Hub) -> dict[str, Any]:
    """Every declared ``RLX_*`` setting with its current value and source (what ``rlx doctor
    --settings`` prints). Plugins' settings come from their ``rlx_settings`` hook, for every installed
    plugin, selected by RLX_BACKENDS or not: one may set a plugin's variables before selecting it."""
    from ._hub import DOCTOR_IMPORT_TIMEOUT
    from ._hub import Hub as HubClass

    # A plugin named in RLX_DISABLE_PLUGINS is never imported, even here: that is what disabling is for.
    side = HubClass(env={k: v for k, v in h.env.items() if k != settings.BACKENDS.name},
                    import_timeout=h.import_timeout or DOCTOR_IMPORT_TIMEOUT)
    unlisted: list[dict[str, Any]] = []
    selected = set(h.names())
    for name in sorted(side.entries()):
        if name not in side.names():
            unlisted.append({"plugin": name, "reason": "disabled by RLX_DISABLE_PLUGINS", "error": None})
            continue
        try:
            backend = h.load(name) if name in selected else side.load(name)
            for s in backend.list_of("rlx_settings", settings.Setting):
                settings.register(s)
        except RLXError as e:
            unlisted.append({"plugin": name, "reason": e.what, "error": _error_json(e)})
    rows = [s.describe(h.env) for s in settings.all_settings()]
    bad = sum(1 for r in rows if r["error"])
    return {"settings": rows, "unlisted_plugins": unlisted, "invalid": bad,
            "exit_code": EXIT_FAIL if bad else EXIT_OK}


def _print_settings(rep: Mapping[str, Any]) -> None:
    from rich.text import Text

    out = console()
    rows = rep["settings"]
    out.print(Text(f"RLX settings ({len(rows)}; set = from the environment)", style="bold"))
    owner = None
    for r in rows:
        if r["owner"] != owner:
            owner = r["owner"]
            out.print(Text(f"\n  {owner}", style="bold"))
        line = Text(f"    {r['name']}", style="bold")
        if r["error"]:
            line.append(f" = {r['raw']!r}  invalid: {r['error']['what']}", style="red")
        elif r["source"] == "env":
            line.append(f" = {r['raw'].strip()}", style="green")
            line.append(f"  (set; default {r['default_text']})", style="dim")
        else:
            line.append(f"  default: {r['default_text']}", style="dim")
        line.append(f"  [{r['allowed']}]", style="dim")
        out.print(line)
        out.print(Text(f"        {r['doc']}"))
        if r["error"] and r["error"]["fix"]:
            out.print(Text(f"        fix: {r['error']['fix']}", style="green"))
    for u in rep["unlisted_plugins"]:
        out.print(Text(f"\n  {u['plugin']}: settings not listed ({u['reason']})", style="yellow"))
    if rep["invalid"]:
        out.print(Text(f"\n{rep['invalid']} invalid setting(s)", style="bold red"))


@cli.command(context_settings=CONTEXT_SETTINGS)
@json_option()
@click.option("--settings", "show_settings", is_flag=True,
              help="List every RLX_* setting (core and installed plugins): value, source, default, doc. "
                   "Exit 1 when one has an invalid value.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, show_settings: bool) -> None:
    """Check installed backends: loading, devices, and a tiny graph run.

    Every backend must load, list its devices, and compile and run x + 1 correctly.

    For each backend: distribution and version, backend and plugin-API version, its devices (with
    availability and where their performance numbers come from) and PASS/FAIL with the real reason
    (import error, API mismatch, conflicting distributions, a hook that raised, a wrong result), and
    the default device (a broken default backend is shown, never replaced by another one). A plugin
    whose import takes longer than RLX_PLUGIN_IMPORT_TIMEOUT seconds (default 30) fails.

    Exit code: 0 when every backend passes (skipped ones aside), 1 when any fails, 2 when none is
    usable (none installed, or every one skipped).

    \b
    Examples:
      rlx doctor
      rlx doctor --json > doctor.json
      RLX_BACKENDS=cuda,cpu rlx doctor
      rlx doctor --settings
    """
    h = hub_instance()
    if h.import_timeout is None:  # a plugin whose import hangs must not hang the diagnosis
        from ._hub import DOCTOR_IMPORT_TIMEOUT

        h.import_timeout = DOCTOR_IMPORT_TIMEOUT
    if show_settings:
        srep = settings_report(h)
        if as_json:
            echo_json(srep)
        else:
            _print_settings(srep)
        ctx.exit(srep["exit_code"])
    rep = doctor_report(h)
    if as_json:
        echo_json(rep)
    else:
        _print_doctor(rep)
    ctx.exit(rep["exit_code"])


# ---------------------------------------------------------------------------------------------
# rlx run


def _read_npy(name: str, path: str, expect: Any) -> np.ndarray:
    import numpy as np

    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"input file {path!r} does not exist", where=f"--input {name}={path}",
                         fix="give the path of a .npy file written with numpy.save") from None
    except (OSError, ValueError, EOFError) as e:
        raise InputError(f"cannot read {path!r} as a .npy array: {e}", where=f"--input {name}={path}",
                         fix="write the input with numpy.save(path, array) (not .npz, not pickled)"
                         ) from None
    if not isinstance(arr, np.ndarray):  # pragma: no cover - np.load of .npy always gives an array
        raise InputError(f"{path!r} is not a single array", where=f"--input {name}={path}",
                         fix="save one array per file with numpy.save")
    # NumPy writes bfloat16 as 2-byte void; read it back as the graph's bf16.
    if expect is not None and str(expect.dtype) == "bf16" and arr.dtype.kind == "V" and arr.itemsize == 2:
        arr = arr.view(expect.dtype.np)
    if expect is not None and arr.dtype != expect.dtype.np:
        raise InputError(f"input {name!r} from {path} has dtype {_dtype_name(arr)} ({arr.dtype}), the model "
                         f"expects {expect.dtype}", where=f"--input {name}={path}",
                         fix=f"save it with the model's dtype: numpy.save({path!r}, "
                             f"x.astype(numpy.{expect.dtype.np.name}))")
    return arr


def _random_input(name: str, t: Any, bindings: Mapping[str, int], rng: Any) -> np.ndarray:
    from .ir import symexpr

    shape: list[int] = []
    for d in t.shape:
        missing = sorted(symexpr.symbols(d) - set(bindings)) if isinstance(d, str) else []
        if missing:
            raise InputError(f"input {name!r} has the symbolic shape {t}; --random cannot choose a size "
                             f"for {d!r}", where=f"input {name!r}",
                             fix=f"pass --input {name}=FILE.npy, or fix the size with "
                                 f"{' '.join(f'--bind {s}=N' for s in missing)}")
        shape.append(symexpr.evaluate(d, bindings))
    dt = t.dtype
    if dt.is_bool:
        return rng.integers(0, 2, shape).astype(bool)
    if dt.is_complex:
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt.np)
    if dt.is_float:
        return rng.standard_normal(shape).astype(dt.np)
    return rng.integers(0, 10, shape).astype(dt.np)


def _symbols_from_arrays(graph: Graph, arrays: Mapping[str, np.ndarray]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in graph.inputs:
        a = arrays.get(v.name)
        if a is None or a.ndim != v.type.rank:
            continue
        for d, n in zip(v.type.shape, a.shape):
            if isinstance(d, str):
                out.setdefault(d, int(n))
    return out


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@device_option("Device to run on: BACKEND or BACKEND:INDEX (default: the first usable backend).")
@click.option("--input", "-i", "inputs", multiple=True, metavar="NAME=FILE.npy",
              help="An input array from a .npy file (repeatable).")
@click.option("--random", "use_random", is_flag=True,
              help="Fill inputs not given with --input with seeded random data (normal floats, ints in "
                   "[0, 10)). Symbolic dims must come from --bind or from another input.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --random.")
@bind_option()
@json_option()
@click.option("--output-dir", "-o", type=click.Path(file_okay=False), default=None,
              help="Save every output as DIR/NAME.npy.")
@signature_option()
def run(model: str, device: str | None, inputs: tuple[str, ...], use_random: bool, seed: int,
        binds: tuple[str, ...], as_json: bool, output_dir: str | None, require_signature: str | None,
        signature: str | None) -> None:
    """Run an .rlx or .onnx model and print its outputs.

    Prints each output's shape, dtype, a preview and statistics (or JSON), and can save them.
    An .onnx file is translated on load (dynamic dims become symbols such as batch). The model runs
    twice: the first run's time (warm-up: JIT compilation, uploads) is reported apart from the
    second, steady one.

    \b
    Examples:
      rlx run model.rlx --input x=x.npy
      rlx run model.onnx --input input_ids=ids.npy --input attention_mask=mask.npy
      rlx run model.rlx --random --seed 1 --device cpu
      rlx run model.rlx --random --bind batch=8 --json
      rlx run model.rlx -i x=x.npy --output-dir out/
      rlx run model.rlx --random --require-signature signer.pub
    """
    import numpy as np

    from ._hub import split_devices
    from .runtime import Session

    files = parse_pairs(inputs, "--input", example="x=x.npy")
    loaded, staged = _load_or_stage(model, binds, lambda: load_command_model(
        model, parse_bindings(binds), files, require_signature=require_signature, signature=signature))
    # A staged model's shapes depend on run-time values: it runs in stages (frontends.onnx_staged).
    graph: Any
    graph, bindings = loaded if staged is None else (staged, parse_bindings(binds))
    want = {v.name: v.type for v in graph.inputs}
    unknown = sorted(set(files) - set(want))
    if unknown:
        raise click.BadParameter(f"model {graph.name!r} has no input {', '.join(map(repr, unknown))}; its "
                                 f"inputs: {', '.join(f'{n}: {t}' for n, t in want.items()) or 'none'}",
                                 param_hint="--input")
    check_bindings(graph, bindings)
    feed = {n: _read_npy(n, p, want[n]) for n, p in files.items()}
    sources = {n: files[n] for n in feed}
    missing = [n for n in want if n not in feed]
    if missing and not use_random:
        sig = ", ".join(f"{n}: {want[n]}" for n in missing)
        raise InputError(f"missing input(s) {sig}", where=f"model {model}",
                         fix="pass each with --input NAME=FILE.npy, or use --random for random data")
    if missing:
        rng = np.random.default_rng(seed)
        syms = {**_symbols_from_arrays(graph, feed), **bindings}
        for n in missing:
            feed[n] = _random_input(n, want[n], syms, rng)
            sources[n] = f"random (seed {seed})"

    _check_multi_device(split_devices(device))
    t0 = time.perf_counter()
    sess = Session(device)
    exe: Any = sess.compile(graph) if staged is None else staged.compile(sess)
    t1 = time.perf_counter()
    exe.run(feed)  # the first run also pays for lazy compilation (JIT kernels, device uploads)
    t2 = time.perf_counter()
    outs = exe.run(feed)  # steady state: what each further call costs
    t3 = time.perf_counter()
    if staged is not None:
        click.echo(exe.describe(), err=True)  # the stages, host ops and value-keyed inputs

    saved: dict[str, str] = {}
    if output_dir is not None:
        d = Path(output_dir)
        d.mkdir(parents=True, exist_ok=True)
        for name, filename in output_filenames(list(outs)).items():
            saved[name] = str(_save_output(d, filename, name, outs[name]))

    if as_json:
        echo_json({
            "model": str(model), "graph": graph.name, "device": sess.device.name,
            "seconds": {"compile": t1 - t0, "first_run": t2 - t1, "run": t3 - t2},
            "inputs": {n: {"shape": list(a.shape), "dtype": str(want[n].dtype), "source": sources[n]}
                       for n, a in feed.items()},
            "outputs": {n: {"shape": list(a.shape), "dtype": _dtype_name(a), "preview": array_preview(a),
                            "stats": array_stats(a), "saved": saved.get(n)} for n, a in outs.items()},
        })
        return
    from rich.text import Text

    from .report import fmt_seconds

    out = console()
    out.print(Text(f"{graph.name} on {sess.device.name}: compiled in {fmt_seconds(t1 - t0)}, first run "
                   f"(warm-up, JIT) {fmt_seconds(t2 - t1)}, then ran in {fmt_seconds(t3 - t2)}",
                   style="bold"))
    for n, a in feed.items():
        out.print(Text(f"  input  {n}: {_shape_text(a)} from {sources[n]}", style="dim"))
    for n, a in outs.items():
        out.print(Text(f"  output {n}: ", style="bold").append(f"{_shape_text(a)}",
                                                               style="cyan"))
        for line in array_text(a).splitlines():
            out.print(Text(f"    {line}"))
        stats = array_stats(a)
        if stats:
            out.print(Text(f"    {fmt_stats(stats)}", style="dim"))
        if n in saved:
            out.print(Text(f"    saved to {saved[n]}", style="green"))


def _shape_text(a: np.ndarray) -> str:
    return f"{_dtype_name(a)}[{','.join(str(n) for n in a.shape)}]"


def _dtype_name(a: np.ndarray) -> str:
    from .dtypes import DType

    try:
        return str(DType.parse(a.dtype))
    except RLXError:
        return str(a.dtype)


# ---------------------------------------------------------------------------------------------
# rlx explain


def _check_multi_device(devices: Sequence[str]) -> None:
    if len(devices) > 1 and importlib.util.find_spec("rlx_core.placement") is None:
        raise BackendNotFoundError(f"multi-device placement ({','.join(devices)}) is not available in this "
                                   f"rlx-core {__version__}", where="--device",
                                   fix="name one device, e.g. --device " + devices[0])


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@device_option("Device(s): BACKEND[:INDEX], or several comma-separated (\"cuda,cpu\") to place each "
               "node on the first device that can run it.")
@bind_option()
@json_option()
@click.option("--dot", "dot_path", metavar="FILE.dot", type=click.Path(dir_okay=False, allow_dash=True),
              default=None, help="Also write the graph as Graphviz DOT (nodes coloured by dispatch path, "
                                 "edges labelled with tensor types); '-' prints only the DOT.")
@signature_option()
@click.option("--coverage", "coverage_only", is_flag=True,
              help="ONNX only: list every operator, version, attribute, dtype and domain the importer "
                   "cannot translate (counts and node names), all at once, without importing; exit 1 "
                   "if anything is unsupported.")
def explain(model: str, device: str | None, binds: tuple[str, ...], as_json: bool,
            dot_path: str | None, require_signature: str | None, signature: str | None,
            coverage_only: bool = False) -> None:
    """Show how a model would be dispatched (nothing runs).

    Per node: the path (native, common_ir, rewritten), kernels, device and estimated cost.
    MODEL is an .rlx file or an .onnx file (translated on load); with --coverage, an .onnx file is
    checked node by node for everything the importer cannot translate instead.

    Nothing runs. Symbolic dimensions not given with --bind are planned with size 1.

    \b
    Examples:
      rlx explain model.rlx
      rlx explain model.onnx --device cuda,cpu
      rlx explain model.rlx --bind batch=32 --json
      rlx explain model.onnx --dot model.dot && dot -Tsvg model.dot -o model.svg
      rlx explain model.onnx --coverage
    """
    if coverage_only:
        _explain_coverage(model, as_json)
        return
    from ._hub import split_devices
    from .frontends.onnx import UnsupportedOnnxError
    from .runtime import Session

    try:
        loaded, staged = _load_or_stage(model, binds, lambda: load_command_model(
            model, parse_bindings(binds), require_signature=require_signature, signature=signature))
        if staged is not None:
            _explain_staged(staged, device, as_json)
            return
        graph, bindings = loaded
    except UnsupportedOnnxError:
        click.echo(f"note: the import stops at the first problem; rlx explain {model} --coverage lists "
                   f"every unsupported node at once", err=True)
        raise
    check_bindings(graph, bindings)
    defaulted = sorted(s for s in graph.symbols if s not in bindings)
    full = {s: bindings.get(s, 1) for s in sorted(graph.symbols)}
    _check_multi_device(split_devices(device))
    report: DispatchReport = Session(device).plan(graph, full or None)
    if dot_path is not None:
        from .frontends.dot import to_dot

        text = to_dot(graph, report)
        if dot_path == "-":
            click.echo(text, nl=False)
            return
        try:
            Path(dot_path).write_text(text, encoding="utf-8")
        except OSError as e:
            raise RLXError(f"cannot write the DOT file: {e.strerror or e}", where=f"--dot {dot_path}",
                           fix="choose a writable path") from None
        click.echo(f"wrote the graph as Graphviz DOT to {dot_path} (render: dot -Tsvg {dot_path} -o "
                   f"graph.svg)", err=True)
    if as_json:
        data = report.to_json()
        data["defaulted_symbols"] = defaulted
        echo_json(data)
        return
    click.echo(report.to_text())
    if defaulted:
        click.echo(f"note: {', '.join(defaulted)} planned with size 1; set sizes with --bind SYM=N", err=True)


class _StagedCommand:
    """`rlx run`/`rlx explain` of an ONNX model that needs staged execution (its inputs, compile)."""

    def __init__(self, model: str, binds: tuple[str, ...]) -> None:
        from types import SimpleNamespace

        from .frontends.onnx import input_types

        self.model, self.binds = model, parse_bindings(binds)
        self.name = Path(model).stem
        self.inputs = [SimpleNamespace(name=n, type=t)
                       for n, t in input_types(model, symbols=self.binds).items()]
        self.symbols = set(self.binds) | {d for v in self.inputs for d in v.type.shape if isinstance(d, str)}

    def compile(self, session: Any) -> Any:
        from .frontends.onnx_staged import StagedModel

        return StagedModel(self.model, session=session, symbols=self.binds)


def _load_or_stage(model: str, binds: tuple[str, ...], load: Any) -> tuple[Any, _StagedCommand | None]:
    """``(load(), None)``, or ``(None, staged command)`` for an ONNX model whose shapes depend on
    run-time values or data (RuntimeValueError, DataDependentShapeError)."""
    from .frontends.onnx import DataDependentShapeError, RuntimeValueError

    try:
        return load(), None
    except (RuntimeValueError, DataDependentShapeError):
        if not model.lower().endswith(".onnx"):
            raise
        return None, _StagedCommand(model, binds)


def _explain_staged(staged: _StagedCommand, device: str | None, as_json: bool) -> None:
    """The stages of a staged ONNX model, and the dispatch report of each stage known before running."""
    from .runtime import Session

    sess = Session(device)
    sm = staged.compile(sess)
    plans = []

    def visit(st: Any) -> None:
        if st.kind == "graph":
            g = st.graph
            plans.append((st.label, sess.plan(g, {s: 1 for s in sorted(g.symbols)} or None)))
        if st.stage1 is not None:
            visit(st.stage1)

    visit(sm.root)
    if as_json:
        echo_json({"staged": sm.describe().splitlines(),
                   "stages": {label: r.to_json() for label, r in plans}})
        return
    click.echo(sm.describe())
    for label, r in plans:
        click.echo(f"\n{label}:")
        click.echo(r.to_text())
    click.echo("note: the next stage is compiled at run time, per value of the value-keyed inputs or per "
               "shape of the host ops' outputs", err=True)


def _explain_coverage(model: str, as_json: bool) -> None:
    """rlx explain --coverage: the ONNX importer's up-front report; exit 1 when anything is unsupported."""
    if not model.lower().endswith(".onnx"):
        raise click.BadParameter(f"{model!r}: --coverage checks an .onnx file (an .rlx file is already "
                                 "translated: run rlx explain without --coverage)", param_hint="MODEL")
    from .frontends.onnx import coverage

    report = coverage(model)
    if as_json:
        echo_json(report.to_json())
    else:
        click.echo(report.to_text())
    if not report.ok:
        raise SystemExit(1)


# ---------------------------------------------------------------------------------------------
# rlx calibrate


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("backend")
@click.option("--quick", is_flag=True, help="Shorter, smaller benchmarks (a few seconds; less precise).")
@click.option("--force", is_flag=True,
              help="Store the figures even when a benchmark ran more than 4x slower than the plugin "
                   "estimates (the device then stays out of automatic placement).")
@json_option()
def calibrate(backend: str, quick: bool, force: bool, as_json: bool) -> None:
    """Measure a backend's performance numbers and cache them.

    Launch overhead, memory bandwidth and GEMM throughput per float dtype. Each benchmark runs in
    several rounds and keeps the best; one far slower than the plugin's own estimate (a busy
    machine) is not stored without --force. The file records how each figure was measured.

    The cost model (device ranking, multi-device placement) then uses these numbers instead of the
    plugin's defaults. Results are stored per machine under the RLX cache directory.

    \b
    Examples:
      rlx calibrate cpu
      rlx calibrate cuda --quick
    """
    from .calibrate import calibrate as run_calibration

    if ":" in backend or "," in backend:
        raise click.BadParameter(f"{backend!r}: give a backend name (calibration measures its first "
                                 "available device)", param_hint="BACKEND")
    if as_json:
        echo_json(run_calibration(backend, quick=quick, force=force))
        return
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    err = console(stderr=True)
    with Progress(TextColumn("[bold]calibrating {task.fields[backend]}[/]"), BarColumn(),
                  TaskProgressColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err, transient=err.is_terminal) as progress:
        task = progress.add_task("starting", total=1.0, backend=backend)

        def on_progress(label: str, fraction: float) -> None:
            progress.update(task, description=label, completed=max(0.0, min(1.0, fraction)))

        results = run_calibration(backend, quick=quick, force=force, progress=on_progress)
        progress.update(task, description="done", completed=1.0)
    _print_calibration(results)


def _print_calibration(r: Mapping[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    from .report import fmt_seconds

    t = Table(title=f"{r.get('backend')} / {r.get('device')}", title_justify="left", show_edge=False)
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("launch overhead", fmt_seconds(float(r["launch_overhead"])))
    t.add_row("memory bandwidth", fmt_rate(float(r["mem_bandwidth"]), "B/s"))
    for dt, v in r.get("peak_flops", {}).items():
        t.add_row(f"peak {dt}" if dt != "default" else "peak (default)", fmt_rate(float(v), "FLOP/s"))
    hl = r.get("host_link_bandwidth")
    t.add_row("host link", "host memory" if hl is None else fmt_rate(float(hl), "B/s"))
    for dt, why in r.get("skipped", {}).items():
        t.add_row(f"peak {dt}", Text(f"skipped: {why}", style="yellow"))
    out = console()
    out.print(t)
    for w in r.get("warnings", []):
        out.print(Text(f"warning: {w}", style="yellow"))
    if r.get("unreliable"):
        out.print(Text(f"flagged unreliable: {r['unreliable']}", style="yellow"))
    out.print(Text(f"cached in {r.get('path')}", style="green"))


# ---------------------------------------------------------------------------------------------
# rlx demo


def _demo_graph(batch: int) -> Graph:
    # One definition: rlx_core.costmodel_check checks the cost model on these same graphs.
    from .costmodel_check import demo_graph

    graph: Graph = demo_graph(batch)
    return graph


DEMO_TOLERANCE = 1e-4


@cli.command(context_settings=CONTEXT_SETTINGS)
@device_option("Run on this device instead of the one the cost model picks.")
@click.option("--batch", type=click.IntRange(1, 65536), default=4, show_default=True, help="Rows of input.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the random input.")
@click.pass_context
def demo(ctx: click.Context, device: str | None, batch: int, seed: int) -> None:
    """Build, place, run and check a small MLP.

    The model is 784 -> 128 -> 10 with relu and softmax and seeded random weights.

    The device is the one the cost model estimates fastest among the installed backends (unless
    --device); the result is checked against the float64 reference evaluator. Exit code 1 if the
    check fails.

    \b
    Examples:
      rlx demo
      rlx demo --device cpu --batch 16
    """
    import numpy as np
    from rich.table import Table
    from rich.text import Text

    from .cost import choose_device, rank_devices
    from .ir.reference import evaluate
    from .report import fmt_seconds
    from .runtime import Session

    out = console()
    graph = _demo_graph(batch)
    out.print(Text(f"Model: {graph.name}, x: f32[{batch},784] -> linear 128 -> relu -> linear 10 -> softmax "
                   f"({len(graph.nodes)} nodes)", style="bold"))
    if device is None:
        h = hub_instance()
        ranked = rank_devices(graph, hub=h)
        device = choose_device(ranked, graph.name)
        t = Table(title="Device ranking (estimated time per run)", title_justify="left", show_edge=False)
        for col in ("device", "total", "kernels", "transfers", "note"):
            t.add_column(col, justify="right" if col in ("total", "kernels", "transfers") else "left")
        for e in ranked:
            if e.seconds is None:
                t.add_row(e.device, "-", "-", "-", Text(f"cannot run: {e.error}", style="yellow"))
            else:
                note = Text("<- chosen", style="bold green") if e.device == device else Text("")
                if e.unreliable and e.device != device:
                    note = Text(f"not chosen: estimate unreliable ({e.unreliable})", style="yellow")
                t.add_row(e.device, fmt_seconds(e.seconds), fmt_seconds(e.kernels), fmt_seconds(e.transfers),
                          note)
        out.print(t)
        first = next((e.device for e in ranked if e.seconds is not None), device)
        why = "lowest estimated time" if first == device else \
            "lowest estimated time among devices with reliable estimates"
    else:
        why = "--device"
    sess = Session(device)
    out.print(Text(f"Chosen device: {sess.device.name} ({why}; performance numbers: "
                   f"{sess.device.caps.source})", style="bold"))

    exe = sess.compile(graph)
    x = np.random.default_rng(seed).standard_normal((batch, 784)).astype(np.float32)
    t0 = time.perf_counter()
    probs = exe.run({"x": x})["probs"]
    dt = time.perf_counter() - t0
    out.print(Text(f"Ran in {fmt_seconds(dt)}", style="dim"))

    t = Table(title="Outputs", title_justify="left", show_edge=False)
    t.add_column("row", justify="right")
    t.add_column("class", justify="right")
    t.add_column("p", justify="right")
    t.add_column("probabilities (classes 0-9)")
    shown = min(batch, 8)
    for i in range(shown):
        k = int(np.argmax(probs[i]))
        t.add_row(str(i), str(k), f"{float(probs[i, k]):.3f}",
                  " ".join(f"{float(p):.2f}" for p in probs[i]))
    out.print(t)
    if batch > shown:
        out.print(Text(f"  ... {batch - shown} more rows", style="dim"))

    if exe.report is not None:
        out.print()
        out.print(Text(exe.report.to_text()), soft_wrap=True)
    out.print()

    ref = evaluate(graph, {"x": x})["probs"]
    err = float(np.max(np.abs(probs.astype(np.float64) - ref))) if probs.shape == ref.shape else math.inf
    ok = bool(err <= DEMO_TOLERANCE)
    line = Text("Check against the reference evaluator: ", style="bold")
    line.append("PASS" if ok else "FAIL", style="bold green" if ok else "bold red")
    line.append(f" (max abs error {err:.2e}, tolerance {DEMO_TOLERANCE:.0e})")
    out.print(line)
    if not ok:
        ctx.exit(EXIT_FAIL)


# ---------------------------------------------------------------------------------------------
# rlx ops


def _dtypes_text(dtypes: Sequence[Any]) -> str:
    """Compact dtype list: whole families by name (float, int), the rest spelled out."""
    from .dtypes import ALL_DTYPES, FLOAT_DTYPES, STORAGE_DTYPES, DType

    s = set(dtypes)
    if s == set(ALL_DTYPES):
        return "all"
    if s == set(STORAGE_DTYPES):
        return "all,lowp"  # the low-precision storage types too (float8/float4/int4/int2)
    ints = {d for d in DType if d.is_int and not d.is_lowp}
    parts: list[str] = []
    for family, members in (("float", set(FLOAT_DTYPES)), ("int", ints)):
        if members <= s:
            parts.append(family)
            s -= members
    parts += [str(d) for d in dtypes if d in s]
    return ",".join(parts)


def _first_sentence(doc: str) -> str:
    text = " ".join(doc.split())
    cut = text.find(". ")
    return text if cut < 0 else text[: cut + 1]


def _op_json(s: Any) -> dict[str, Any]:
    from .ir.schema import REQUIRED

    return {"name": s.name, "level": s.level, "category": s.category, "dtypes": [str(d) for d in s.dtypes],
            "inputs": list(s.inputs), "num_outputs": s.num_outputs,
            "attrs": [{"name": a.name, "kind": a.kind, "required": a.default is REQUIRED,
                       "default": None if a.default is REQUIRED else a.default, "doc": a.doc}
                      for a in s.attrs],
            "elementwise": s.elementwise, "provider": s.provider, "doc": s.doc}


def _print_op_detail(s: Any) -> None:
    from rich.text import Text

    from .ir.schema import REQUIRED

    out = console()
    out.print(Text(s.name, style="bold").append(f"  ({s.level}, {s.category}, from {s.provider})",
                                               style="dim"))
    out.print(Text(f"  {' '.join(s.doc.split())}"))
    outs = "" if s.num_outputs == 1 else f" -> {s.num_outputs} outputs"
    out.print(Text(f"  inputs: {', '.join(s.inputs) or 'none'}{outs}   (a trailing * is variadic)"))
    out.print(Text(f"  dtypes: {', '.join(str(d) for d in s.dtypes)}"))
    for a in s.attrs:
        default = "required" if a.default is REQUIRED else f"default {a.default!r}"
        out.print(Text(f"  attr {a.name}: {a.kind}, {default}" + (f" - {a.doc}" if a.doc else "")))
    if s.level == "hir":
        out.print(Text("  decomposes into MIR ops when a backend has no native kernel", style="dim"))


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("names", nargs=-1, metavar="[OP]...")
@click.option("--level", type=click.Choice(["mir", "hir"]), default=None,
              help="Only MIR primitives or only HIR model ops (default: both).")
@json_option()
def ops(names: tuple[str, ...], level: str | None, as_json: bool) -> None:
    """List the registered ops with level, category, dtypes and doc.

    Ops added by installed backend plugins are included (each plugin is loaded first). Name ops to
    see their inputs, attributes and full description.

    \b
    Examples:
      rlx ops
      rlx ops --level hir
      rlx ops softmax attention
      rlx ops --json | jq '.[] | select(.category == "activation")'
    """
    from .ir.schema import REGISTRY

    h = hub_instance()
    for name in h.names():
        h.try_load(name)  # plugins register their ops on load; failures are `rlx doctor`'s business
    if names:
        schemas = [REGISTRY.get(n, where="rlx ops") for n in names]
    else:
        schemas = sorted(REGISTRY.schemas(level), key=lambda s: (s.level != "hir", s.category, s.name))
    if as_json:
        echo_json([_op_json(s) for s in schemas])
        return
    if names:
        for s in schemas:
            _print_op_detail(s)
        return
    from rich import box
    from rich.table import Table

    cols = ("op", "level", "category", "dtypes", "doc")
    rows = [(s.name if s.provider == "rlx-core" else f"{s.name} ({s.provider})", s.level, s.category,
             _dtypes_text(s.dtypes), _first_sentence(s.doc)) for s in schemas]
    out = console()
    widths = [max([len(col)] + [len(r[i]) for r in rows]) for i, col in enumerate(cols[:-1])]
    doc_width = max(24, out.width - sum(widths) - 3 * len(widths) - 1)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
              title=f"{len(schemas)} ops (`rlx ops OP` for inputs, attributes and full docs)",
              title_justify="left")
    for col in cols:
        t.add_column(col, no_wrap=col != "doc", overflow="fold")
    for r in rows:
        doc = r[-1] if len(r[-1]) <= doc_width else r[-1][: doc_width - 1] + "…"
        t.add_row(*r[:-1], doc)
    out.print(t)


# ---------------------------------------------------------------------------------------------
# rlx cache


@cli.group(cls=RLXGroup, context_settings=CONTEXT_SETTINGS)
def cache() -> None:
    """Inspect or clear the on-disk caches.

    They hold compiled (legalized) graphs, plugin builds (Numba kernels, the private OpenBLAS copy,
    SPIR-V, host libraries, simulations, firmware), benchmark models and calibration results.
    Every entry is authenticated with a per-user key before it is used.

    The directory is $RLX_CACHE_DIR, else $XDG_CACHE_HOME/rlx, else ~/.cache/rlx (created 0700;
    refused if other users can write it).

    \b
    Examples:
      rlx cache info
      rlx cache clear
    """


@cache.command("info", context_settings=CONTEXT_SETTINGS)
@json_option()
def cache_info(as_json: bool) -> None:
    """Show where the caches are, whether they are safe, and what they hold.

    \b
    Example:
      rlx cache info --json
    """
    from .cache import CompileCache, describe
    from .report import fmt_bytes

    info = describe()
    cc = info["caches"]["compile"]
    cal_root = Path(info["caches"]["calibration"]["dir"])
    cals = []
    for f in sorted(cal_root.glob("*.json")) if cal_root.is_dir() else []:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        cals.append({"file": str(f), "backend": data.get("backend"), "device": data.get("device"),
                     "date": data.get("date")})
    info["compile"] = {"dir": str(CompileCache().root), "entries": cc["entries"], "bytes": cc["bytes"]}
    info["calibration"] = cals
    if as_json:
        echo_json(info)
        return
    from rich.text import Text

    out = console()
    state = ("private, entries authenticated (HMAC-SHA256)" if info["safe"]
             else f"NOT USED: {info['why']}")
    if info["no_cache"]:
        state += "; RLX_NO_CACHE=1: only calibration is read"
    out.print(Text(f"cache directory: {info['dir']}", style="bold"))
    out.print(Text(f"  {state}"))
    for name, c in info["caches"].items():
        n = c["entries"]
        out.print(Text(f"  {name:<13} {n:>5} entr{'y' if n == 1 else 'ies'} {fmt_bytes(c['bytes']):>10}  "
                       f"{c['what']}"))
    if cals:
        out.print(Text(f"  calibrations: {len(cals)}"))
        for c in cals:
            out.print(Text(f"    {c['backend']} / {c['device']}  {c['date']}  {c['file']}"))
    else:
        out.print(Text("  calibrations: none (run `rlx calibrate BACKEND`)"))


@cache.command("clear", context_settings=CONTEXT_SETTINGS)
@click.option("--calibration", is_flag=True, help="Also delete calibration results.")
def cache_clear(calibration: bool) -> None:
    """Delete every cache (and, with --calibration, calibration results); the key stays.

    \b
    Examples:
      rlx cache clear
      rlx cache clear --calibration
    """
    from .cache import CompileCache
    from .cache import clear as clear_caches

    removed = clear_caches(calibration=calibration)
    n = removed.pop("compile", 0)
    msg = f"removed {n} compiled-graph entr{'y' if n == 1 else 'ies'} from {CompileCache().root}"
    cal = removed.pop("calibration", None)
    others = [f"{k}: {v}" for k, v in removed.items() if v]
    if others:
        msg += f"; plugin caches: {', '.join(others)}"
    if cal is not None:
        msg += f" and {cal} calibration file{'' if cal == 1 else 's'}"
    click.echo(msg)


if __name__ == "__main__":
    main()
