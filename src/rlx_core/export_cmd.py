"""``rlx export MODEL --target T -o DIR``: routes to the exporter a plugin declares (hook ``rlx_exporters``).

The core names no backend: ``rlx export --help`` lists the targets of the installed plugins, and
everything after ``--target T`` (``--help`` included) belongs to that target's own command. Only this
command imports plugins; ``rlx --help`` does not.
"""

from __future__ import annotations

from typing import Any

import click

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class ExportCommand(click.Command):
    """Hands the whole command line to the target's exporter once ``--target`` is given."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from .extensions import split_target

        target, rest = split_target(list(args))
        if target is None:
            return super().parse_args(ctx, args)
        ctx.meta["rlx.export"] = (target, rest)
        return []

    def invoke(self, ctx: click.Context) -> Any:
        if "rlx.export" not in ctx.meta:
            return super().invoke(ctx)
        from .cliutil import hub_instance
        from .extensions import find_exporter, resolve_command

        target, rest = ctx.meta["rlx.export"]
        cmd = resolve_command(find_exporter(hub_instance(), target))
        sub = cmd.make_context("export", ["--target", target, *rest], parent=ctx.parent)
        with sub:
            return cmd.invoke(sub)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from .cliutil import hub_instance
        from .extensions import exporter_table

        rows, broken = exporter_table(hub_instance())
        with formatter.section("Targets (from the installed plugins)"):
            if rows:
                formatter.write_dl(rows)
            else:
                formatter.write_text('none: install a plugin that exports, e.g. pip install "rlx-core[wasm]"')
        if broken:
            with formatter.section("Plugins that could not list their targets (see `rlx doctor`)"):
                formatter.write_text("\n".join(broken))


@click.command("export", cls=ExportCommand, context_settings=CONTEXT)
@click.argument("model", required=False)
@click.option("--target", "-t", metavar="TARGET",
              help="Which plugin's generator builds the artifact (listed below).")
@click.pass_context
def export_command(ctx: click.Context, model: str | None, target: str | None) -> None:
    """Export MODEL as a standalone artifact built by the TARGET plugin's code generator.

    Each target has its own options: `rlx export --target T --help`.

    \b
    Examples:
      rlx export model.onnx --target wasm -o out/ --bind batch=1
      rlx export digits_int8.rlx --target cortexm -o fw/
      rlx export digits_int8.rlx --target fpga -o rtl/
    """
    # Reached only without --target: with it, ExportCommand hands everything to the exporter.
    from .cliutil import hub_instance
    from .extensions import exporter_table

    rows, _ = exporter_table(hub_instance())
    have = ", ".join(t for t, _ in rows) or "none installed"
    raise click.UsageError(f"missing --target (installed targets: {have}); "
                           "see `rlx export --target T --help`", ctx=ctx)
