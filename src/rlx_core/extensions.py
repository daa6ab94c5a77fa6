"""What plugins add to the command line: exporters (``rlx_exporters``) and commands (``rlx_cli_commands``).

Nothing here runs for ``rlx --help``: a plugin is imported only when one of its commands is invoked,
when ``rlx export`` needs its targets, or when ``rlx plugins`` / ``rlx doctor`` list them. Every
failure (a hook that raises, a wrong record, an un-importable command, two distributions claiming one
name, a name outside the plugin's namespace) is kept with its cause and shown where the name is used;
it never breaks ``rlx`` or another plugin.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from . import install_hint
from .errors import BackendNotFoundError, PluginConflictError, PluginError, RLXError

if TYPE_CHECKING:
    from ._hub import Backend, Hub
    from .records import ExporterInfo

#: Who owns the core's own command names in conflict messages.
CORE = "rlx-core"


@dataclass(frozen=True)
class PluginCommand:
    """A click command a plugin adds, with who provides it."""

    name: str
    command: click.Command
    backend: str
    distribution: str


@dataclass
class Extensions:
    """Exporters and commands of the plugins looked at, and every failure met on the way."""

    exporters: dict[str, ExporterInfo] = field(default_factory=dict)
    commands: dict[str, PluginCommand] = field(default_factory=dict)
    #: backend name -> the errors of its hooks (load failures included)
    failures: dict[str, list[RLXError]] = field(default_factory=dict)
    #: exporter target or command name -> the conflict (neither side is usable)
    conflicts: dict[str, PluginConflictError] = field(default_factory=dict)

    def fail(self, backend: str, err: RLXError) -> None:
        self.failures.setdefault(backend, []).append(err)


def _label(b: Backend) -> str:
    return f"{b.entry.distribution} ({b.name})"


def backend_exporters(b: Backend) -> list[ExporterInfo]:
    """``rlx_exporters`` of one loaded backend, validated, with distribution and backend filled in."""
    from .records import ExporterInfo

    out = b.call("rlx_exporters") or []
    if not isinstance(out, (list, tuple)) or not all(isinstance(e, ExporterInfo) for e in out):
        raise PluginError(f"plugin {_label(b)}: rlx_exporters returned {out!r:.200}",
                          where=f"backend {b.name!r}, hook rlx_exporters",
                          fix="return a list of rlx_core.records.ExporterInfo", kind="invalid")
    return [dataclasses.replace(e, distribution=b.entry.distribution, backend=b.name) for e in out]


def backend_commands(b: Backend) -> list[PluginCommand]:
    """``rlx_cli_commands`` of one loaded backend: click commands named ``NAME`` or ``NAME-...``."""
    out = b.call("rlx_cli_commands") or []
    if not isinstance(out, (list, tuple)) or not all(isinstance(c, click.Command) for c in out):
        raise PluginError(f"plugin {_label(b)}: rlx_cli_commands returned {out!r:.200}",
                          where=f"backend {b.name!r}, hook rlx_cli_commands",
                          fix="return a list of click commands", kind="invalid")
    cmds = []
    for c in out:
        name = c.name or ""
        if name != b.name and not name.startswith(f"{b.name}-"):
            raise PluginError(f"plugin {_label(b)} adds the command {name!r} outside its namespace",
                              where=f"backend {b.name!r}, hook rlx_cli_commands",
                              fix=f"name it {b.name!r} (a group) or {b.name}-SOMETHING", kind="invalid")
        cmds.append(PluginCommand(name, c, b.name, b.entry.distribution))
    return cmds


def _conflict(kind: str, name: str, first: str, second: str, fix: str) -> PluginConflictError:
    return PluginConflictError(f"{kind} {name!r} is provided by both {first} and {second}",
                               where=f"{kind} {name!r}", fix=fix, kind="conflict")


def collect(h: Hub, *, backends: list[str] | None = None, core_commands: frozenset[str] = frozenset(),
            exporters: bool = True, commands: bool = True) -> Extensions:
    """Load ``backends`` (default: every selected one) and gather what they add, isolating failures."""
    ext = Extensions()
    for name in h.names() if backends is None else backends:
        try:
            b = h.load(name)
        except RLXError as e:
            ext.fail(name, e)
            continue
        if exporters:
            try:
                for exp in backend_exporters(b):
                    other = ext.exporters.get(exp.target)
                    if exp.target in ext.conflicts:
                        continue
                    if other is not None:
                        ext.conflicts[exp.target] = _conflict(
                            "export target", exp.target, other.distribution, exp.distribution,
                            "uninstall one of them, or disable one with RLX_DISABLE_PLUGINS")
                        del ext.exporters[exp.target]
                    else:
                        ext.exporters[exp.target] = exp
            except RLXError as err:
                ext.fail(name, err)
        if commands:
            try:
                for c in backend_commands(b):
                    if c.name in core_commands:
                        ext.fail(name, _conflict("command", c.name, CORE, c.distribution,
                                                 f"rename the plugin's command (`rlx {c.name}` is the "
                                                 "core's), or uninstall the plugin"))
                        continue
                    other_c = ext.commands.get(c.name)
                    if c.name in ext.conflicts:
                        continue
                    if other_c is not None:
                        ext.conflicts[c.name] = _conflict("command", c.name, other_c.distribution,
                                                          c.distribution, "uninstall one of them")
                        del ext.commands[c.name]
                    else:
                        ext.commands[c.name] = c
            except RLXError as err:
                ext.fail(name, err)
    return ext


# ---------------------------------------------------------------------------------------------
# rlx export --target T


def _failure_lines(ext: Extensions) -> list[str]:
    return [f"{name}: {errs[0].what}" for name, errs in sorted(ext.failures.items())]


def find_exporter(h: Hub, target: str) -> ExporterInfo:
    """The exporter of ``target``, or an error naming the installed targets and the fix."""
    ext = collect(h, commands=False)
    if target in ext.conflicts:
        raise ext.conflicts[target]
    if target in ext.exporters:
        return ext.exporters[target]
    have = ", ".join(f"{t} ({e.distribution})" for t, e in sorted(ext.exporters.items())) or "none"
    broken = _failure_lines(ext)
    extra = f"; plugins that failed to load or list exporters: {'; '.join(broken)}" if broken else ""
    raise BackendNotFoundError(
        f"no installed plugin exports target {target!r} (installed targets: {have}){extra}",
        where=f"rlx export --target {target}",
        fix=(f"pick an installed target, or install the plugin that exports {target!r} "
             f"({install_hint.backend_hint(target)}); `rlx export --help` lists the targets, `rlx doctor` "
             "the broken plugins"))


def resolve_command(info: ExporterInfo) -> click.Command:
    """The click command behind an exporter: imported from its ``module:attr`` name, or built from
    ``function`` and ``options``."""
    if info.function is not None:
        return _function_command(info)
    if isinstance(info.command, click.Command):
        return info.command
    ref = str(info.command)
    module, _, attr = ref.partition(":")
    where = f"exporter {info.target!r} of {info.distribution}"
    try:
        cmd = getattr(importlib.import_module(module), attr)
    except Exception as e:  # an exporter's own import may fail in any way; report, never crash
        raise PluginError(f"{where}: cannot import its command {ref!r} ({type(e).__name__}: {e})",
                          where=where, kind="import",
                          fix=f"reinstall {info.distribution} with its dependencies") from e
    if not isinstance(cmd, click.Command):
        raise PluginError(f"{where}: {ref} is {type(cmd).__name__}, not a click command", where=where,
                          fix="point ExporterInfo.command at a click command", kind="invalid")
    return cmd


def _function_command(info: ExporterInfo) -> click.Command:
    from .cliutil import export_options

    fn = info.function
    assert fn is not None

    def callback(model: str, target_name: str, out_dir: str, binds: tuple[str, ...], as_json: bool,
                 **options: Any) -> None:
        from .cliutil import check_bindings, echo_json, load_command_model, parse_bindings

        graph, bindings = load_command_model(model, parse_bindings(binds))
        check_bindings(graph, bindings)
        summary = fn(graph, Path(out_dir), dict(bindings), **options) or {}
        if as_json:
            echo_json(summary)
            return
        # repr: a model's name is untrusted and must not drive the terminal (newlines, bidi controls)
        click.echo(f"exported {graph.name!r} for {info.target} to {out_dir}")
        for k, v in summary.items():
            click.echo(f"  {k}: {v}")

    cmd = click.command("export", help=f"Export MODEL: {info.help}.",
                        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})(
        export_options(info.target, info.help)(callback))
    cmd.params.extend(info.options)
    return cmd


def split_target(args: list[str]) -> tuple[str | None, list[str]]:
    """Find ``--target T`` / ``--target=T`` / ``-t T`` / ``-tT`` in ``args``; return it and the rest."""
    rest: list[str] = []
    target: str | None = None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest.extend(args[i:])
            break
        if a in ("--target", "-t") and i + 1 < len(args) and target is None:
            target = args[i + 1]
            i += 2
            continue
        if a.startswith("--target=") and target is None:
            target = a.partition("=")[2]
        elif a.startswith("-t") and not a.startswith("--") and len(a) > 2 and target is None:
            target = a[2:]
        else:
            rest.append(a)
        i += 1
    return target, rest


def exporter_table(h: Hub) -> tuple[list[tuple[str, str]], list[str]]:
    """``(target, "help (distribution)")`` rows and failure lines, for ``rlx export --help``."""
    ext = collect(h, commands=False)
    rows = [(t, f"{e.help} ({e.distribution})") for t, e in sorted(ext.exporters.items())]
    rows += [(t, f"unusable: {err.what}") for t, err in sorted(ext.conflicts.items())]
    return rows, _failure_lines(ext)


# ---------------------------------------------------------------------------------------------
# plugin commands, looked up by name


def candidates(h: Hub, name: str) -> list[str]:
    """Installed backends whose namespace holds command ``name`` (no plugin is imported)."""
    return [b for b in h.names() if name == b or name.startswith(f"{b}-")]


def find_command(h: Hub, name: str, core_commands: frozenset[str]) -> click.Command | None:
    """The plugin command ``name``, importing only the plugins whose namespace holds it."""
    names = candidates(h, name)
    if not names:
        return None
    ext = collect(h, backends=names, core_commands=core_commands, exporters=False)
    if name in ext.conflicts:
        raise ext.conflicts[name]
    if name in ext.commands:
        return ext.commands[name].command
    for b, errs in ext.failures.items():
        for err in errs:
            if isinstance(err, PluginError) or name == b:
                raise PluginError(f"`rlx {name}` may come from the plugin {b!r}, which is broken: {err.what}",
                                  where=err.where, fix=err.fix or "run `rlx doctor`")
    return None


def summarize(ext: Extensions) -> dict[str, Any]:
    """As data, for ``rlx plugins --json``."""
    return {
        "exporters": [{"target": t, "help": e.help, "backend": e.backend, "distribution": e.distribution}
                      for t, e in sorted(ext.exporters.items())],
        "commands": [{"name": n, "help": c.command.get_short_help_str(80), "backend": c.backend,
                      "distribution": c.distribution} for n, c in sorted(ext.commands.items())],
        "conflicts": {k: {"what": v.what, "fix": v.fix} for k, v in sorted(ext.conflicts.items())},
        "failures": {k: [{"type": type(e).__name__, "what": e.what, "where": e.where, "fix": e.fix}
                         for e in v] for k, v in sorted(ext.failures.items())},
    }


def doctor_check(b: Backend, core_commands: frozenset[str]) -> tuple[dict[str, Any], RLXError | None]:
    """For ``rlx doctor``: one backend's exporters and commands, each command actually importable,
    and the first problem found (``None`` when all is well)."""
    rec: dict[str, Any] = {"exporters": [], "commands": []}
    problem: RLXError | None = None
    try:
        for e in backend_exporters(b):
            rec["exporters"].append(e.target)
            resolve_command(e)
    except RLXError as err:
        problem = err
    try:
        for c in backend_commands(b):
            rec["commands"].append(c.name)
            if c.name in core_commands and problem is None:
                problem = _conflict("command", c.name, CORE, c.distribution,
                                    f"rename the plugin's command (`rlx {c.name}` is the core's)")
    except RLXError as err:
        problem = problem or err
    return rec, problem
