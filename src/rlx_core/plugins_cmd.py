"""``rlx plugins``: the export targets and commands the installed plugins add (hooks ``rlx_exporters``
and ``rlx_cli_commands``). Imports every selected plugin; ``rlx --help`` never does."""

from __future__ import annotations

import click

from .cli import CONTEXT_SETTINGS, cli, console
from .cliutil import echo_json, hub_instance, json_option


@click.command("plugins", context_settings=CONTEXT_SETTINGS)
@json_option()
@click.pass_context
def plugins_command(ctx: click.Context, as_json: bool) -> None:
    """List what installed plugins add to `rlx`: export targets and commands.

    A conflict (two distributions, or a plugin and the core, claiming one name) or a plugin whose
    hooks fail is shown with both names and the fix; exit code 1 then.

    \b
    Examples:
      rlx plugins
      rlx plugins --json
    """
    from rich.text import Text

    from .extensions import collect, summarize

    ext = collect(hub_instance(), core_commands=frozenset(cli.list_commands(click.Context(cli))))
    rep = summarize(ext)
    bad = bool(rep["conflicts"] or rep["failures"])
    if as_json:
        echo_json(rep)
        ctx.exit(1 if bad else 0)
    out = console()
    out.print(Text("Export targets (rlx export --target T)", style="bold"))
    for e in rep["exporters"] or [{"target": "none", "help": "", "distribution": ""}]:
        out.print(Text(f"  {e['target']:<12} {e['help']}" + (f"  ({e['distribution']})" if e["distribution"]
                                                              else "")))
    out.print(Text("Commands (rlx NAME ...)", style="bold"))
    for c in rep["commands"] or [{"name": "none", "help": "", "distribution": ""}]:
        out.print(Text(f"  {c['name']:<12} {c['help']}" + (f"  ({c['distribution']})" if c["distribution"]
                                                            else "")))
    for c in rep["conflicts"].values():
        out.print(Text(f"conflict: {c['what']}; fix: {c['fix']}", style="red"))
    for backend, errs in rep["failures"].items():
        for e in errs:
            out.print(Text(f"{backend}: {e['what']}" + (f"; fix: {e['fix']}" if e["fix"] else ""),
                           style="red"))
    ctx.exit(1 if bad else 0)
