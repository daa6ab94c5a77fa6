"""``rlx export MODEL --target T -o DIR``: routes to the exporting plugin (``rlx_<T>.export``).

Each code-generating plugin owns its exporter (a click command named ``export_command`` in its
``export`` module, taking ``--target``); this command only finds it, so the core names no backend.
"""

from __future__ import annotations

import importlib

import click


@click.command("export", context_settings={"help_option_names": ["-h", "--help"],
                                           "ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("model")
@click.option("--target", "-t", required=True, help="Backend generating the artifact (wasm, cortexm, fpga).")
@click.pass_context
def export_command(ctx: click.Context, model: str, target: str) -> None:
    """Export MODEL as a standalone artifact built by the TARGET backend's code generator.

    Remaining options go to that backend's exporter; see `rlx export MODEL --target T --help`.

    \b
    Examples:
      rlx export model.onnx --target wasm -o out/ --bind batch=1
      rlx export digits_int8.rlx --target cortexm -o fw/
      rlx export digits_int8.rlx --target fpga -o rtl/
    """
    module = f"rlx_{target.replace('-', '_')}.export"
    try:
        cmd = importlib.import_module(module).export_command
    except ImportError as e:
        raise click.UsageError(f"no exporter for target {target!r} ({e}); install rlx-{target}, "
                               "or pick a target whose plugin exports (wasm, cortexm, fpga)") from None
    cmd.main([model, "--target", target, *ctx.args], prog_name=f"rlx export --target {target}",
             standalone_mode=False)
